from wakustore.protos import chat_identity_pb2 as _chat_identity_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CommunityMember(_message.Message):
    __slots__ = ("roles", "last_update_clock", "channel_role")
    class Roles(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        UNKNOWN_ROLE: _ClassVar[CommunityMember.Roles]
        ROLE_NONE: _ClassVar[CommunityMember.Roles]
        ROLE_ALL: _ClassVar[CommunityMember.Roles]
        ROLE_OWNER: _ClassVar[CommunityMember.Roles]
        ROLE_MANAGE_USERS: _ClassVar[CommunityMember.Roles]
        ROLE_MODERATE_CONTENT: _ClassVar[CommunityMember.Roles]
        ROLE_ADMIN: _ClassVar[CommunityMember.Roles]
        ROLE_TOKEN_MASTER: _ClassVar[CommunityMember.Roles]
    UNKNOWN_ROLE: CommunityMember.Roles
    ROLE_NONE: CommunityMember.Roles
    ROLE_ALL: CommunityMember.Roles
    ROLE_OWNER: CommunityMember.Roles
    ROLE_MANAGE_USERS: CommunityMember.Roles
    ROLE_MODERATE_CONTENT: CommunityMember.Roles
    ROLE_ADMIN: CommunityMember.Roles
    ROLE_TOKEN_MASTER: CommunityMember.Roles
    class ChannelRole(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        CHANNEL_ROLE_POSTER: _ClassVar[CommunityMember.ChannelRole]
        CHANNEL_ROLE_VIEWER: _ClassVar[CommunityMember.ChannelRole]
    CHANNEL_ROLE_POSTER: CommunityMember.ChannelRole
    CHANNEL_ROLE_VIEWER: CommunityMember.ChannelRole
    ROLES_FIELD_NUMBER: _ClassVar[int]
    LAST_UPDATE_CLOCK_FIELD_NUMBER: _ClassVar[int]
    CHANNEL_ROLE_FIELD_NUMBER: _ClassVar[int]
    roles: _containers.RepeatedScalarFieldContainer[CommunityMember.Roles]
    last_update_clock: int
    channel_role: CommunityMember.ChannelRole
    def __init__(self, roles: _Optional[_Iterable[_Union[CommunityMember.Roles, str]]] = ..., last_update_clock: _Optional[int] = ..., channel_role: _Optional[_Union[CommunityMember.ChannelRole, str]] = ...) -> None: ...

class CommunityPermissions(_message.Message):
    __slots__ = ("ens_only", "private", "access")
    class Access(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        UNKNOWN_ACCESS: _ClassVar[CommunityPermissions.Access]
        NO_MEMBERSHIP: _ClassVar[CommunityPermissions.Access]
        AUTO_ACCEPT: _ClassVar[CommunityPermissions.Access]
        INVITATION_ONLY: _ClassVar[CommunityPermissions.Access]
        ON_REQUEST: _ClassVar[CommunityPermissions.Access]
        MANUAL_ACCEPT: _ClassVar[CommunityPermissions.Access]
    UNKNOWN_ACCESS: CommunityPermissions.Access
    NO_MEMBERSHIP: CommunityPermissions.Access
    AUTO_ACCEPT: CommunityPermissions.Access
    INVITATION_ONLY: CommunityPermissions.Access
    ON_REQUEST: CommunityPermissions.Access
    MANUAL_ACCEPT: CommunityPermissions.Access
    ENS_ONLY_FIELD_NUMBER: _ClassVar[int]
    PRIVATE_FIELD_NUMBER: _ClassVar[int]
    ACCESS_FIELD_NUMBER: _ClassVar[int]
    ens_only: bool
    private: bool
    access: CommunityPermissions.Access
    def __init__(self, ens_only: _Optional[bool] = ..., private: _Optional[bool] = ..., access: _Optional[_Union[CommunityPermissions.Access, str]] = ...) -> None: ...

class CommunityAdminSettings(_message.Message):
    __slots__ = ("pin_message_all_members_enabled",)
    PIN_MESSAGE_ALL_MEMBERS_ENABLED_FIELD_NUMBER: _ClassVar[int]
    pin_message_all_members_enabled: bool
    def __init__(self, pin_message_all_members_enabled: _Optional[bool] = ...) -> None: ...

class CommunityBloomFilter(_message.Message):
    __slots__ = ("data", "m", "k")
    DATA_FIELD_NUMBER: _ClassVar[int]
    M_FIELD_NUMBER: _ClassVar[int]
    K_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    m: int
    k: int
    def __init__(self, data: _Optional[bytes] = ..., m: _Optional[int] = ..., k: _Optional[int] = ...) -> None: ...

class CommunityChat(_message.Message):
    __slots__ = ("members", "permissions", "identity", "category_id", "position", "viewers_can_post_reactions", "hide_if_permissions_not_met", "members_list")
    class MembersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: CommunityMember
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[CommunityMember, _Mapping]] = ...) -> None: ...
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    PERMISSIONS_FIELD_NUMBER: _ClassVar[int]
    IDENTITY_FIELD_NUMBER: _ClassVar[int]
    CATEGORY_ID_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    VIEWERS_CAN_POST_REACTIONS_FIELD_NUMBER: _ClassVar[int]
    HIDE_IF_PERMISSIONS_NOT_MET_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_LIST_FIELD_NUMBER: _ClassVar[int]
    members: _containers.MessageMap[str, CommunityMember]
    permissions: CommunityPermissions
    identity: _chat_identity_pb2.ChatIdentity
    category_id: str
    position: int
    viewers_can_post_reactions: bool
    hide_if_permissions_not_met: bool
    members_list: CommunityBloomFilter
    def __init__(self, members: _Optional[_Mapping[str, CommunityMember]] = ..., permissions: _Optional[_Union[CommunityPermissions, _Mapping]] = ..., identity: _Optional[_Union[_chat_identity_pb2.ChatIdentity, _Mapping]] = ..., category_id: _Optional[str] = ..., position: _Optional[int] = ..., viewers_can_post_reactions: _Optional[bool] = ..., hide_if_permissions_not_met: _Optional[bool] = ..., members_list: _Optional[_Union[CommunityBloomFilter, _Mapping]] = ...) -> None: ...

class CommunityCategory(_message.Message):
    __slots__ = ("category_id", "name", "position")
    CATEGORY_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    category_id: str
    name: str
    position: int
    def __init__(self, category_id: _Optional[str] = ..., name: _Optional[str] = ..., position: _Optional[int] = ...) -> None: ...

class CommunityBanInfo(_message.Message):
    __slots__ = ("delete_all_messages",)
    DELETE_ALL_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    delete_all_messages: bool
    def __init__(self, delete_all_messages: _Optional[bool] = ...) -> None: ...

class CommunityDescription(_message.Message):
    __slots__ = ("clock", "members", "permissions", "identity", "chats", "ban_list", "categories", "archive_magnetlink_clock", "admin_settings", "intro_message", "outro_message", "encrypted", "tags", "relay_shard_index", "active_members_count", "id", "banned_members", "resend_accounts_clock", "private_data")
    class MembersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: CommunityMember
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[CommunityMember, _Mapping]] = ...) -> None: ...
    class ChatsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: CommunityChat
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[CommunityChat, _Mapping]] = ...) -> None: ...
    class CategoriesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: CommunityCategory
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[CommunityCategory, _Mapping]] = ...) -> None: ...
    class BannedMembersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: CommunityBanInfo
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[CommunityBanInfo, _Mapping]] = ...) -> None: ...
    class PrivateDataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: bytes
        def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...
    CLOCK_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    PERMISSIONS_FIELD_NUMBER: _ClassVar[int]
    IDENTITY_FIELD_NUMBER: _ClassVar[int]
    CHATS_FIELD_NUMBER: _ClassVar[int]
    BAN_LIST_FIELD_NUMBER: _ClassVar[int]
    CATEGORIES_FIELD_NUMBER: _ClassVar[int]
    ARCHIVE_MAGNETLINK_CLOCK_FIELD_NUMBER: _ClassVar[int]
    ADMIN_SETTINGS_FIELD_NUMBER: _ClassVar[int]
    INTRO_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    OUTRO_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ENCRYPTED_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    RELAY_SHARD_INDEX_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_MEMBERS_COUNT_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    BANNED_MEMBERS_FIELD_NUMBER: _ClassVar[int]
    RESEND_ACCOUNTS_CLOCK_FIELD_NUMBER: _ClassVar[int]
    PRIVATE_DATA_FIELD_NUMBER: _ClassVar[int]
    clock: int
    members: _containers.MessageMap[str, CommunityMember]
    permissions: CommunityPermissions
    identity: _chat_identity_pb2.ChatIdentity
    chats: _containers.MessageMap[str, CommunityChat]
    ban_list: _containers.RepeatedScalarFieldContainer[str]
    categories: _containers.MessageMap[str, CommunityCategory]
    archive_magnetlink_clock: int
    admin_settings: CommunityAdminSettings
    intro_message: str
    outro_message: str
    encrypted: bool
    tags: _containers.RepeatedScalarFieldContainer[str]
    relay_shard_index: int
    active_members_count: int
    id: str
    banned_members: _containers.MessageMap[str, CommunityBanInfo]
    resend_accounts_clock: int
    private_data: _containers.ScalarMap[str, bytes]
    def __init__(self, clock: _Optional[int] = ..., members: _Optional[_Mapping[str, CommunityMember]] = ..., permissions: _Optional[_Union[CommunityPermissions, _Mapping]] = ..., identity: _Optional[_Union[_chat_identity_pb2.ChatIdentity, _Mapping]] = ..., chats: _Optional[_Mapping[str, CommunityChat]] = ..., ban_list: _Optional[_Iterable[str]] = ..., categories: _Optional[_Mapping[str, CommunityCategory]] = ..., archive_magnetlink_clock: _Optional[int] = ..., admin_settings: _Optional[_Union[CommunityAdminSettings, _Mapping]] = ..., intro_message: _Optional[str] = ..., outro_message: _Optional[str] = ..., encrypted: _Optional[bool] = ..., tags: _Optional[_Iterable[str]] = ..., relay_shard_index: _Optional[int] = ..., active_members_count: _Optional[int] = ..., id: _Optional[str] = ..., banned_members: _Optional[_Mapping[str, CommunityBanInfo]] = ..., resend_accounts_clock: _Optional[int] = ..., private_data: _Optional[_Mapping[str, bytes]] = ...) -> None: ...
