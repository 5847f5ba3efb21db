from wakustore.protos import waku_message_pb2 as _waku_message_pb2
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class WakuMessageAndTopic(_message.Message):
    __slots__ = ("pubsub_topic", "message")
    PUBSUB_TOPIC_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    pubsub_topic: str
    message: _waku_message_pb2.WakuMessage
    def __init__(self, pubsub_topic: _Optional[str] = ..., message: _Optional[_Union[_waku_message_pb2.WakuMessage, _Mapping]] = ...) -> None: ...

class SpecWakuMessageAndTopic(_message.Message):
    __slots__ = ("message", "pubsub_topic")
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    PUBSUB_TOPIC_FIELD_NUMBER: _ClassVar[int]
    message: _waku_message_pb2.WakuMessage
    pubsub_topic: str
    def __init__(self, message: _Optional[_Union[_waku_message_pb2.WakuMessage, _Mapping]] = ..., pubsub_topic: _Optional[str] = ...) -> None: ...
