from wakustore.protos import waku_message_pb2 as _waku_message_pb2
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class LightpushRequest(_message.Message):
    __slots__ = ("request_id", "pubsub_topic", "message")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PUBSUB_TOPIC_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    pubsub_topic: str
    message: _waku_message_pb2.WakuMessage
    def __init__(self, request_id: _Optional[str] = ..., pubsub_topic: _Optional[str] = ..., message: _Optional[_Union[_waku_message_pb2.WakuMessage, _Mapping]] = ...) -> None: ...

class LightpushResponse(_message.Message):
    __slots__ = ("request_id", "status_code", "status_desc", "relay_peer_count")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_CODE_FIELD_NUMBER: _ClassVar[int]
    STATUS_DESC_FIELD_NUMBER: _ClassVar[int]
    RELAY_PEER_COUNT_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    status_code: int
    status_desc: str
    relay_peer_count: int
    def __init__(self, request_id: _Optional[str] = ..., status_code: _Optional[int] = ..., status_desc: _Optional[str] = ..., relay_peer_count: _Optional[int] = ...) -> None: ...
