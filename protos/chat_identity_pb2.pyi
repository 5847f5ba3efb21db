from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ImageFormat(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    UNKNOWN_IMAGE_FORMAT: _ClassVar[ImageFormat]
    PNG: _ClassVar[ImageFormat]
    JPEG: _ClassVar[ImageFormat]
    WEBP: _ClassVar[ImageFormat]
    GIF: _ClassVar[ImageFormat]
UNKNOWN_IMAGE_FORMAT: ImageFormat
PNG: ImageFormat
JPEG: ImageFormat
WEBP: ImageFormat
GIF: ImageFormat

class IdentityImage(_message.Message):
    __slots__ = ("payload", "source_type", "image_format", "encryption_keys", "encrypted")
    class SourceType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        UNKNOWN_SOURCE_TYPE: _ClassVar[IdentityImage.SourceType]
        RAW_PAYLOAD: _ClassVar[IdentityImage.SourceType]
        ENS_AVATAR: _ClassVar[IdentityImage.SourceType]
    UNKNOWN_SOURCE_TYPE: IdentityImage.SourceType
    RAW_PAYLOAD: IdentityImage.SourceType
    ENS_AVATAR: IdentityImage.SourceType
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    SOURCE_TYPE_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FORMAT_FIELD_NUMBER: _ClassVar[int]
    ENCRYPTION_KEYS_FIELD_NUMBER: _ClassVar[int]
    ENCRYPTED_FIELD_NUMBER: _ClassVar[int]
    payload: bytes
    source_type: IdentityImage.SourceType
    image_format: ImageFormat
    encryption_keys: _containers.RepeatedScalarFieldContainer[bytes]
    encrypted: bool
    def __init__(self, payload: _Optional[bytes] = ..., source_type: _Optional[_Union[IdentityImage.SourceType, str]] = ..., image_format: _Optional[_Union[ImageFormat, str]] = ..., encryption_keys: _Optional[_Iterable[bytes]] = ..., encrypted: _Optional[bool] = ...) -> None: ...

class SocialLink(_message.Message):
    __slots__ = ("text", "url")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    URL_FIELD_NUMBER: _ClassVar[int]
    text: str
    url: str
    def __init__(self, text: _Optional[str] = ..., url: _Optional[str] = ...) -> None: ...

class ChatIdentity(_message.Message):
    __slots__ = ("clock", "ens_name", "images", "display_name", "description", "color", "emoji", "social_links", "first_message_timestamp", "customization_color")
    class ImagesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: IdentityImage
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[IdentityImage, _Mapping]] = ...) -> None: ...
    CLOCK_FIELD_NUMBER: _ClassVar[int]
    ENS_NAME_FIELD_NUMBER: _ClassVar[int]
    IMAGES_FIELD_NUMBER: _ClassVar[int]
    DISPLAY_NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    COLOR_FIELD_NUMBER: _ClassVar[int]
    EMOJI_FIELD_NUMBER: _ClassVar[int]
    SOCIAL_LINKS_FIELD_NUMBER: _ClassVar[int]
    FIRST_MESSAGE_TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    CUSTOMIZATION_COLOR_FIELD_NUMBER: _ClassVar[int]
    clock: int
    ens_name: str
    images: _containers.MessageMap[str, IdentityImage]
    display_name: str
    description: str
    color: str
    emoji: str
    social_links: _containers.RepeatedCompositeFieldContainer[SocialLink]
    first_message_timestamp: int
    customization_color: int
    def __init__(self, clock: _Optional[int] = ..., ens_name: _Optional[str] = ..., images: _Optional[_Mapping[str, IdentityImage]] = ..., display_name: _Optional[str] = ..., description: _Optional[str] = ..., color: _Optional[str] = ..., emoji: _Optional[str] = ..., social_links: _Optional[_Iterable[_Union[SocialLink, _Mapping]]] = ..., first_message_timestamp: _Optional[int] = ..., customization_color: _Optional[int] = ...) -> None: ...
