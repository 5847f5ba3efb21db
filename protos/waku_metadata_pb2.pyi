from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class WakuMetadataRequest(_message.Message):
    __slots__ = ("cluster_id", "shards", "packed_shards")
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    PACKED_SHARDS_FIELD_NUMBER: _ClassVar[int]
    cluster_id: int
    shards: _containers.RepeatedScalarFieldContainer[int]
    packed_shards: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, cluster_id: _Optional[int] = ..., shards: _Optional[_Iterable[int]] = ..., packed_shards: _Optional[_Iterable[int]] = ...) -> None: ...

class WakuMetadataResponse(_message.Message):
    __slots__ = ("cluster_id", "shards", "packed_shards")
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    PACKED_SHARDS_FIELD_NUMBER: _ClassVar[int]
    cluster_id: int
    shards: _containers.RepeatedScalarFieldContainer[int]
    packed_shards: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, cluster_id: _Optional[int] = ..., shards: _Optional[_Iterable[int]] = ..., packed_shards: _Optional[_Iterable[int]] = ...) -> None: ...
