from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class CommunityMessageArchiveMagnetlink(_message.Message):
    __slots__ = ("clock", "magnet_uri")
    CLOCK_FIELD_NUMBER: _ClassVar[int]
    MAGNET_URI_FIELD_NUMBER: _ClassVar[int]
    clock: int
    magnet_uri: str
    def __init__(self, clock: _Optional[int] = ..., magnet_uri: _Optional[str] = ...) -> None: ...
