from wakustore.protos import waku_message_pb2 as _waku_message_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class WakuMessageKeyValue(_message.Message):
    __slots__ = ("message_hash", "message", "pubsub_topic")
    MESSAGE_HASH_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    PUBSUB_TOPIC_FIELD_NUMBER: _ClassVar[int]
    message_hash: bytes
    message: _waku_message_pb2.WakuMessage
    pubsub_topic: str
    def __init__(self, message_hash: _Optional[bytes] = ..., message: _Optional[_Union[_waku_message_pb2.WakuMessage, _Mapping]] = ..., pubsub_topic: _Optional[str] = ...) -> None: ...

class StoreQueryRequest(_message.Message):
    __slots__ = ("request_id", "include_data", "pubsub_topic", "content_topics", "time_start", "time_end", "message_hashes", "pagination_cursor", "pagination_forward", "pagination_limit")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_DATA_FIELD_NUMBER: _ClassVar[int]
    PUBSUB_TOPIC_FIELD_NUMBER: _ClassVar[int]
    CONTENT_TOPICS_FIELD_NUMBER: _ClassVar[int]
    TIME_START_FIELD_NUMBER: _ClassVar[int]
    TIME_END_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_HASHES_FIELD_NUMBER: _ClassVar[int]
    PAGINATION_CURSOR_FIELD_NUMBER: _ClassVar[int]
    PAGINATION_FORWARD_FIELD_NUMBER: _ClassVar[int]
    PAGINATION_LIMIT_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    include_data: bool
    pubsub_topic: str
    content_topics: _containers.RepeatedScalarFieldContainer[str]
    time_start: int
    time_end: int
    message_hashes: _containers.RepeatedScalarFieldContainer[bytes]
    pagination_cursor: bytes
    pagination_forward: bool
    pagination_limit: int
    def __init__(self, request_id: _Optional[str] = ..., include_data: _Optional[bool] = ..., pubsub_topic: _Optional[str] = ..., content_topics: _Optional[_Iterable[str]] = ..., time_start: _Optional[int] = ..., time_end: _Optional[int] = ..., message_hashes: _Optional[_Iterable[bytes]] = ..., pagination_cursor: _Optional[bytes] = ..., pagination_forward: _Optional[bool] = ..., pagination_limit: _Optional[int] = ...) -> None: ...

class StoreQueryResponse(_message.Message):
    __slots__ = ("request_id", "status_code", "status_desc", "messages", "pagination_cursor")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_CODE_FIELD_NUMBER: _ClassVar[int]
    STATUS_DESC_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    PAGINATION_CURSOR_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    status_code: int
    status_desc: str
    messages: _containers.RepeatedCompositeFieldContainer[WakuMessageKeyValue]
    pagination_cursor: bytes
    def __init__(self, request_id: _Optional[str] = ..., status_code: _Optional[int] = ..., status_desc: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[WakuMessageKeyValue, _Mapping]]] = ..., pagination_cursor: _Optional[bytes] = ...) -> None: ...
