from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ApplicationMetadataMessage(_message.Message):
    __slots__ = ("signature", "payload", "type")
    class Type(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        UNKNOWN: _ClassVar[ApplicationMetadataMessage.Type]
        CHAT_MESSAGE: _ClassVar[ApplicationMetadataMessage.Type]
        EMOJI_REACTION: _ClassVar[ApplicationMetadataMessage.Type]
        CHAT_IDENTITY: _ClassVar[ApplicationMetadataMessage.Type]
        COMMUNITY_DESCRIPTION: _ClassVar[ApplicationMetadataMessage.Type]
        COMMUNITY_REQUEST_TO_JOIN: _ClassVar[ApplicationMetadataMessage.Type]
        PIN_MESSAGE: _ClassVar[ApplicationMetadataMessage.Type]
        EDIT_MESSAGE: _ClassVar[ApplicationMetadataMessage.Type]
        DELETE_MESSAGE: _ClassVar[ApplicationMetadataMessage.Type]
        COMMUNITY_MESSAGE_ARCHIVE_MAGNETLINK: _ClassVar[ApplicationMetadataMessage.Type]
        COMMUNITY_REQUEST_TO_JOIN_RESPONSE: _ClassVar[ApplicationMetadataMessage.Type]
        COMMUNITY_REQUEST_TO_LEAVE: _ClassVar[ApplicationMetadataMessage.Type]
        COMMUNITY_CANCEL_REQUEST_TO_JOIN: _ClassVar[ApplicationMetadataMessage.Type]
        COMMUNITY_EVENTS_MESSAGE: _ClassVar[ApplicationMetadataMessage.Type]
        COMMUNITY_SHARD_KEY: _ClassVar[ApplicationMetadataMessage.Type]
        COMMUNITY_PUBLIC_SHARD_INFO: _ClassVar[ApplicationMetadataMessage.Type]
        COMMUNITY_USER_KICKED: _ClassVar[ApplicationMetadataMessage.Type]
        COMMUNITY_PUBLIC_STORENODES_INFO: _ClassVar[ApplicationMetadataMessage.Type]
    UNKNOWN: ApplicationMetadataMessage.Type
    CHAT_MESSAGE: ApplicationMetadataMessage.Type
    EMOJI_REACTION: ApplicationMetadataMessage.Type
    CHAT_IDENTITY: ApplicationMetadataMessage.Type
    COMMUNITY_DESCRIPTION: ApplicationMetadataMessage.Type
    COMMUNITY_REQUEST_TO_JOIN: ApplicationMetadataMessage.Type
    PIN_MESSAGE: ApplicationMetadataMessage.Type
    EDIT_MESSAGE: ApplicationMetadataMessage.Type
    DELETE_MESSAGE: ApplicationMetadataMessage.Type
    COMMUNITY_MESSAGE_ARCHIVE_MAGNETLINK: ApplicationMetadataMessage.Type
    COMMUNITY_REQUEST_TO_JOIN_RESPONSE: ApplicationMetadataMessage.Type
    COMMUNITY_REQUEST_TO_LEAVE: ApplicationMetadataMessage.Type
    COMMUNITY_CANCEL_REQUEST_TO_JOIN: ApplicationMetadataMessage.Type
    COMMUNITY_EVENTS_MESSAGE: ApplicationMetadataMessage.Type
    COMMUNITY_SHARD_KEY: ApplicationMetadataMessage.Type
    COMMUNITY_PUBLIC_SHARD_INFO: ApplicationMetadataMessage.Type
    COMMUNITY_USER_KICKED: ApplicationMetadataMessage.Type
    COMMUNITY_PUBLIC_STORENODES_INFO: ApplicationMetadataMessage.Type
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    signature: bytes
    payload: bytes
    type: ApplicationMetadataMessage.Type
    def __init__(self, signature: _Optional[bytes] = ..., payload: _Optional[bytes] = ..., type: _Optional[_Union[ApplicationMetadataMessage.Type, str]] = ...) -> None: ...
