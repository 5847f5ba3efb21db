"""14/WAKU2-MESSAGE on the wire: protobuf decoding and encoding.

Decoding is permissive but bounded: any well-formed WakuMessage up to
:data:`MAX_ENCODED_MESSAGE_SIZE` decodes, whatever its meta length, topic
or timestamp; whether it may be stored is :func:`message.check_storable`'s
decision. Absent fields read as their defaults (nwaku's decoder refuses a
message without payload or content topic; js-waku never writes an empty
payload, so accepting the absence is what lets its messages through).

Encoding follows nwaku (waku/waku_core/message/codec.nim): every field is
written, defaults included, so nwaku's decoder, which requires field 1 and
field 2, accepts everything we send.
"""

from __future__ import annotations

from typing import TypeVar

from google.protobuf.message import DecodeError
from google.protobuf.message import Message as _PbMessage

from wakustore.protocols.errors import MessageError
from wakustore.protocols.message import WakuMessage
from wakustore.protos import waku_message_pb2

# Hard cap on one encoded WakuMessage, in bytes. 1 MiB is the libp2p
# gossipsub default maxMessageSize, so no relay message can be larger
# unless a network raises it, and it was nwaku's MaxWakuMessageSize before
# the limit became the configurable 150 KiB default (nwaku #800, 2022;
# waku_core/message/default_values.nim: "Remember that 1 MiB is the PubSub
# default"). Anything between the node's configured limit and this cap
# decodes, so the node can answer "too large" instead of "undecodable".
MAX_ENCODED_MESSAGE_SIZE = 1024 * 1024

_M = TypeVar("_M", bound=_PbMessage)


def decode_message(raw: bytes) -> WakuMessage:
    """Decode one encoded WakuMessage; raise :class:`MessageError` if it is
    not a valid protobuf encoding or is larger than MAX_ENCODED_MESSAGE_SIZE."""
    if len(raw) > MAX_ENCODED_MESSAGE_SIZE:
        raise MessageError(f"message is {len(raw)} bytes, hard limit {MAX_ENCODED_MESSAGE_SIZE}")
    pb = parse_protobuf(waku_message_pb2.WakuMessage, raw)
    if pb is None:
        raise MessageError("undecodable WakuMessage")
    return message_from_pb(pb)


def encode_message(message: WakuMessage) -> bytes:
    """Encode ``message`` as nwaku does (every field written)."""
    return message_to_pb(message).SerializeToString()


def message_from_pb(pb: waku_message_pb2.WakuMessage) -> WakuMessage:
    """The value held by a parsed protobuf WakuMessage; absent fields are defaults."""
    return WakuMessage(
        payload=pb.payload,
        content_topic=pb.content_topic,
        version=pb.version,
        timestamp=pb.timestamp,
        meta=pb.meta,
        ephemeral=pb.ephemeral,
        rate_limit_proof=pb.rate_limit_proof,
    )


def message_to_pb(message: WakuMessage) -> waku_message_pb2.WakuMessage:
    """A protobuf WakuMessage with every field set; raise :class:`MessageError`
    when a value does not fit its wire type (version uint32, timestamp sint64)."""
    pb = waku_message_pb2.WakuMessage()
    write_message_pb(pb, message)
    return pb


def write_message_pb(pb: waku_message_pb2.WakuMessage, message: WakuMessage) -> None:
    """Set every field of ``pb`` (a fresh one, or a sub-message of a reply
    being built: no copy of a finished message into it) from ``message``;
    raise :class:`MessageError` as :func:`message_to_pb` does."""
    try:
        pb.payload = message.payload
        pb.content_topic = message.content_topic
        pb.version = message.version
        pb.timestamp = message.timestamp
        pb.meta = message.meta
        pb.rate_limit_proof = message.rate_limit_proof
        pb.ephemeral = message.ephemeral
    except (ValueError, TypeError) as exc:
        raise MessageError(f"message does not fit the wire format: {exc}") from None


def parse_protobuf(message_type: type[_M], raw: bytes | memoryview) -> _M | None:
    """Parse ``raw`` as ``message_type``; None when it is not a valid encoding.

    The one place the protobuf runtime's exceptions are caught: callers turn
    None into their own protocol's error.
    """
    pb = message_type()
    try:
        # A view is parsed in place: an archive is ~35 MB. (The runtime
        # parses any buffer; the protobuf stubs declare bytes only.)
        pb.ParseFromString(raw if isinstance(raw, (bytes, memoryview)) else bytes(raw))  # type: ignore[arg-type]
    except (DecodeError, ValueError, RecursionError):
        return None
    return pb


def nested_message_size(pb: waku_message_pb2.WakuMessage) -> int:
    """Encoded size in bytes of a WakuMessage parsed inside another message.

    The size of its canonical re-encoding, unknown fields included; it can
    only be smaller than the bytes received (non-minimal varints, repeated
    singular fields), never larger.
    """
    return pb.ByteSize()


def with_request_id(encoded: bytes, request_id: str) -> bytes:
    """``encoded`` with an empty request_id written explicitly when it is empty.

    Waku RPCs keep request_id at field 1 as a plain proto3 string, which the
    protobuf runtime leaves out when empty; nwaku's decoders fail on the
    absence (missingRequiredField "request_id"), so an empty id goes on the
    wire as ``0a 00``. Field order does not matter to a protobuf reader.
    """
    if request_id:
        return encoded
    return b"\x0a\x00" + encoded
