from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class WakuMessage(_message.Message):
    __slots__ = ("sig", "timestamp", "topic", "payload", "padding", "hash", "thirdPartyId")
    SIG_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    PADDING_FIELD_NUMBER: _ClassVar[int]
    HASH_FIELD_NUMBER: _ClassVar[int]
    THIRDPARTYID_FIELD_NUMBER: _ClassVar[int]
    sig: bytes
    timestamp: int
    topic: bytes
    payload: bytes
    padding: bytes
    hash: bytes
    thirdPartyId: str
    def __init__(self, sig: _Optional[bytes] = ..., timestamp: _Optional[int] = ..., topic: _Optional[bytes] = ..., payload: _Optional[bytes] = ..., padding: _Optional[bytes] = ..., hash: _Optional[bytes] = ..., thirdPartyId: _Optional[str] = ...) -> None: ...

class ArchivedMessage(_message.Message):
    __slots__ = ("sig", "timestamp", "topic", "payload", "padding", "hash", "thirdPartyId", "timestamp_ns", "pubsub_topic", "meta", "version", "arrival_ns", "rate_limit_proof", "nonce", "signature")
    SIG_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    PADDING_FIELD_NUMBER: _ClassVar[int]
    HASH_FIELD_NUMBER: _ClassVar[int]
    THIRDPARTYID_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_NS_FIELD_NUMBER: _ClassVar[int]
    PUBSUB_TOPIC_FIELD_NUMBER: _ClassVar[int]
    META_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ARRIVAL_NS_FIELD_NUMBER: _ClassVar[int]
    RATE_LIMIT_PROOF_FIELD_NUMBER: _ClassVar[int]
    NONCE_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    sig: bytes
    timestamp: int
    topic: bytes
    payload: bytes
    padding: bytes
    hash: bytes
    thirdPartyId: str
    timestamp_ns: int
    pubsub_topic: bytes
    meta: bytes
    version: int
    arrival_ns: int
    rate_limit_proof: bytes
    nonce: bytes
    signature: bytes
    def __init__(self, sig: _Optional[bytes] = ..., timestamp: _Optional[int] = ..., topic: _Optional[bytes] = ..., payload: _Optional[bytes] = ..., padding: _Optional[bytes] = ..., hash: _Optional[bytes] = ..., thirdPartyId: _Optional[str] = ..., timestamp_ns: _Optional[int] = ..., pubsub_topic: _Optional[bytes] = ..., meta: _Optional[bytes] = ..., version: _Optional[int] = ..., arrival_ns: _Optional[int] = ..., rate_limit_proof: _Optional[bytes] = ..., nonce: _Optional[bytes] = ..., signature: _Optional[bytes] = ...) -> None: ...

class WakuMessageArchiveMetadata(_message.Message):
    __slots__ = ("version", "to", "contentTopic")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    FROM_FIELD_NUMBER: _ClassVar[int]
    TO_FIELD_NUMBER: _ClassVar[int]
    CONTENTTOPIC_FIELD_NUMBER: _ClassVar[int]
    version: int
    to: int
    contentTopic: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, version: _Optional[int] = ..., to: _Optional[int] = ..., contentTopic: _Optional[_Iterable[bytes]] = ..., **kwargs) -> None: ...

class WakuMessageArchive(_message.Message):
    __slots__ = ("version", "metadata", "messages")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    version: int
    metadata: WakuMessageArchiveMetadata
    messages: _containers.RepeatedCompositeFieldContainer[WakuMessage]
    def __init__(self, version: _Optional[int] = ..., metadata: _Optional[_Union[WakuMessageArchiveMetadata, _Mapping]] = ..., messages: _Optional[_Iterable[_Union[WakuMessage, _Mapping]]] = ...) -> None: ...

class ArchivedMessages(_message.Message):
    __slots__ = ("version", "metadata", "messages")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    version: int
    metadata: WakuMessageArchiveMetadata
    messages: _containers.RepeatedCompositeFieldContainer[ArchivedMessage]
    def __init__(self, version: _Optional[int] = ..., metadata: _Optional[_Union[WakuMessageArchiveMetadata, _Mapping]] = ..., messages: _Optional[_Iterable[_Union[ArchivedMessage, _Mapping]]] = ...) -> None: ...

class WakuMessageArchiveIndexMetadata(_message.Message):
    __slots__ = ("version", "metadata", "offset", "size", "padding")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    PADDING_FIELD_NUMBER: _ClassVar[int]
    version: int
    metadata: WakuMessageArchiveMetadata
    offset: int
    size: int
    padding: int
    def __init__(self, version: _Optional[int] = ..., metadata: _Optional[_Union[WakuMessageArchiveMetadata, _Mapping]] = ..., offset: _Optional[int] = ..., size: _Optional[int] = ..., padding: _Optional[int] = ...) -> None: ...

class WakuMessageArchiveIndex(_message.Message):
    __slots__ = ("archives",)
    class ArchivesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: WakuMessageArchiveIndexMetadata
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[WakuMessageArchiveIndexMetadata, _Mapping]] = ...) -> None: ...
    ARCHIVES_FIELD_NUMBER: _ClassVar[int]
    archives: _containers.MessageMap[str, WakuMessageArchiveIndexMetadata]
    def __init__(self, archives: _Optional[_Mapping[str, WakuMessageArchiveIndexMetadata]] = ...) -> None: ...
