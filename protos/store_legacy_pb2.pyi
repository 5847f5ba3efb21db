from wakustore.protos import waku_message_pb2 as _waku_message_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Index(_message.Message):
    __slots__ = ("digest", "receiver_time", "sender_time", "pubsub_topic")
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    RECEIVER_TIME_FIELD_NUMBER: _ClassVar[int]
    SENDER_TIME_FIELD_NUMBER: _ClassVar[int]
    PUBSUB_TOPIC_FIELD_NUMBER: _ClassVar[int]
    digest: bytes
    receiver_time: int
    sender_time: int
    pubsub_topic: str
    def __init__(self, digest: _Optional[bytes] = ..., receiver_time: _Optional[int] = ..., sender_time: _Optional[int] = ..., pubsub_topic: _Optional[str] = ...) -> None: ...

class PagingInfo(_message.Message):
    __slots__ = ("page_size", "cursor", "direction")
    class Direction(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        BACKWARD: _ClassVar[PagingInfo.Direction]
        FORWARD: _ClassVar[PagingInfo.Direction]
    BACKWARD: PagingInfo.Direction
    FORWARD: PagingInfo.Direction
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    CURSOR_FIELD_NUMBER: _ClassVar[int]
    DIRECTION_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    cursor: Index
    direction: PagingInfo.Direction
    def __init__(self, page_size: _Optional[int] = ..., cursor: _Optional[_Union[Index, _Mapping]] = ..., direction: _Optional[_Union[PagingInfo.Direction, str]] = ...) -> None: ...

class ContentFilter(_message.Message):
    __slots__ = ("content_topic",)
    CONTENT_TOPIC_FIELD_NUMBER: _ClassVar[int]
    content_topic: str
    def __init__(self, content_topic: _Optional[str] = ...) -> None: ...

class HistoryQuery(_message.Message):
    __slots__ = ("pubsub_topic", "content_filters", "paging_info", "start_time", "end_time")
    PUBSUB_TOPIC_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FILTERS_FIELD_NUMBER: _ClassVar[int]
    PAGING_INFO_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    END_TIME_FIELD_NUMBER: _ClassVar[int]
    pubsub_topic: str
    content_filters: _containers.RepeatedCompositeFieldContainer[ContentFilter]
    paging_info: PagingInfo
    start_time: int
    end_time: int
    def __init__(self, pubsub_topic: _Optional[str] = ..., content_filters: _Optional[_Iterable[_Union[ContentFilter, _Mapping]]] = ..., paging_info: _Optional[_Union[PagingInfo, _Mapping]] = ..., start_time: _Optional[int] = ..., end_time: _Optional[int] = ...) -> None: ...

class HistoryResponse(_message.Message):
    __slots__ = ("messages", "paging_info", "error")
    class Error(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        NONE: _ClassVar[HistoryResponse.Error]
        INVALID_CURSOR: _ClassVar[HistoryResponse.Error]
        TOO_MANY_RESULTS: _ClassVar[HistoryResponse.Error]
        TOO_MANY_REQUESTS: _ClassVar[HistoryResponse.Error]
        SERVICE_UNAVAILABLE: _ClassVar[HistoryResponse.Error]
    NONE: HistoryResponse.Error
    INVALID_CURSOR: HistoryResponse.Error
    TOO_MANY_RESULTS: HistoryResponse.Error
    TOO_MANY_REQUESTS: HistoryResponse.Error
    SERVICE_UNAVAILABLE: HistoryResponse.Error
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    PAGING_INFO_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[_waku_message_pb2.WakuMessage]
    paging_info: PagingInfo
    error: HistoryResponse.Error
    def __init__(self, messages: _Optional[_Iterable[_Union[_waku_message_pb2.WakuMessage, _Mapping]]] = ..., paging_info: _Optional[_Union[PagingInfo, _Mapping]] = ..., error: _Optional[_Union[HistoryResponse.Error, str]] = ...) -> None: ...

class HistoryRPC(_message.Message):
    __slots__ = ("request_id", "query", "response")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    QUERY_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    query: HistoryQuery
    response: HistoryResponse
    def __init__(self, request_id: _Optional[str] = ..., query: _Optional[_Union[HistoryQuery, _Mapping]] = ..., response: _Optional[_Union[HistoryResponse, _Mapping]] = ...) -> None: ...
