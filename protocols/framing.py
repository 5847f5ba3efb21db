"""Length-prefixed framing on libp2p streams, sans-IO.

Each Waku request/response protocol writes one message per direction on a
stream: an unsigned varint (multiformats unsigned-varint) holding the body
length, then the protobuf body. :func:`encode_frame` builds one;
:class:`FrameReader` takes bytes as they arrive and returns complete frames,
rejecting an oversized length before any of the body is kept.

Limits are per protocol and per direction. nwaku reads store and lightpush
streams without a bound since #2601 (2024, `DefaultMaxRpcSize = -1`); the
bounds below are the ones nwaku used before that change, or our own where
it had none, each large enough for every valid message of the protocol.
"""

from __future__ import annotations

from wakustore.protocols.errors import FrameTooLarge, FramingError
from wakustore.protocols.message import DEFAULT_MAX_MESSAGE_SIZE
from wakustore.protocols.message_codec import MAX_ENCODED_MESSAGE_SIZE
from wakustore.protocols.peer_exchange import MAX_PEER_INFO_SIZE, MAX_PEERS
from wakustore.protocols.store_query import MAX_PAGE_SIZE

# nwaku DefaultSafetyBufferProtocolOverhead (waku_core/message/default_values.nim):
# the allowance for everything in an RPC that is not a WakuMessage.
PROTOCOL_OVERHEAD = 64 * 1024

# A store query holds no message: at most 100 hashes of 34 bytes, 10 content
# topics and a pubsub topic of at most 1 KiB each (store_query limits), far
# under the overhead allowance. Applies to v3 and legacy v2 requests.
STORE_MAX_REQUEST_SIZE = PROTOCOL_OVERHEAD

# nwaku's store MaxRpcSize before #2601:
# MaxPageSize * MaxWakuMessageSize + 64 KiB (waku_store/rpc_codec.nim), with
# the 150 KiB default message size: 15,425,536 bytes. What our client reads.
STORE_MAX_RESPONSE_SIZE = MAX_PAGE_SIZE * DEFAULT_MAX_MESSAGE_SIZE + PROTOCOL_OVERHEAD

# nwaku's lightpush MaxRpcSize before #2601 was MaxWakuMessageSize + 64 KiB
# (waku_lightpush/rpc_codec.nim). We size it for the 1 MiB hard message cap
# instead of the 150 KiB default, so a message over the node's configured
# limit still decodes and is answered 413 PAYLOAD_TOO_LARGE, not dropped.
LIGHTPUSH_MAX_REQUEST_SIZE = MAX_ENCODED_MESSAGE_SIZE + PROTOCOL_OVERHEAD

# A lightpush response is a request id, a status and a description.
LIGHTPUSH_MAX_RESPONSE_SIZE = PROTOCOL_OVERHEAD

# nwaku RpcResponseMaxBytes = 1024 (waku_metadata/protocol.nim), used for
# reading both the request and the response.
METADATA_MAX_SIZE = 1024

# nwaku reads peer-exchange requests and responses with its DefaultMaxRpcSize,
# 10 * 150 KiB + 64 KiB (waku_peer_exchange/common.nim), sized for no
# particular message. A request is one varint: at most 13 bytes as js-waku
# writes it, 17 as nwaku does (it adds an empty response). Our own bound.
PEER_EXCHANGE_MAX_REQUEST_SIZE = 1024

# A response holds at most MAX_PEERS records of at most 300 bytes (EIP-778),
# 306 bytes each as PeerInfo entries, plus the overhead allowance for the
# query, status code and description: 83,896 bytes.
PEER_EXCHANGE_MAX_RESPONSE_SIZE = MAX_PEERS * MAX_PEER_INFO_SIZE + PROTOCOL_OVERHEAD

# The protobuf varint that nim-libp2p's readVarint buffers is at most
# 10 bytes (64 bits); the multiformats unsigned-varint spec further
# requires the minimal encoding.
MAX_VARINT_BYTES = 10


def encode_frame(body: bytes) -> bytes:
    """``body`` preceded by its length as an unsigned varint."""
    return encode_uvarint(len(body)) + body


def encode_uvarint(value: int) -> bytes:
    """The minimal unsigned-varint encoding of a non-negative integer."""
    if value < 0:
        raise ValueError("varint value must be non-negative")
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


class FrameReader:
    """Splits a byte stream into length-prefixed frames.

    ``max_size`` bounds the body length in bytes (inclusive). A length prefix
    above it raises :class:`FramingError` as soon as the prefix bytes read so
    far prove it, before any body byte is buffered; so does a prefix longer
    than 10 bytes or not minimally encoded. After an error the reader is
    unusable.
    """

    def __init__(self, max_size: int):
        if max_size < 0:
            raise ValueError("max_size must be non-negative")
        self.max_size = max_size
        self._prefix = bytearray()
        self._body = bytearray()
        self._body_length: int | None = None  # None while reading a prefix
        self._failed = False

    def feed(self, data: bytes) -> list[bytes]:
        """Take the next bytes of the stream; return the frames they complete."""
        if self._failed:
            raise FramingError("frame reader already failed")
        frames: list[bytes] = []
        view = memoryview(data)
        while True:
            if self._body_length is None:
                view = self._read_prefix(view)
                if self._body_length is None:
                    break
            if not self._body and len(view) >= self._body_length:
                # The whole body is in this chunk (the usual case): one copy.
                frames.append(bytes(view[: self._body_length]))
                view = view[self._body_length :]
                self._body_length = None
                if not view:
                    break
                continue
            taken = view[: self._body_length - len(self._body)]
            self._body += taken
            view = view[len(taken) :]
            if len(self._body) < self._body_length:
                break
            frames.append(bytes(self._body))
            self._body.clear()
            self._body_length = None
            if not view:
                break
        return frames

    def eof(self) -> None:
        """The stream ended; raise :class:`FramingError` if a frame is incomplete."""
        if self._failed:
            raise FramingError("frame reader already failed")
        if self._body_length is not None:
            raise FramingError(f"stream ended inside a frame: {len(self._body)} of {self._body_length} bytes")
        if self._prefix:
            raise FramingError("stream ended inside a length prefix")

    @property
    def pending(self) -> bool:
        """True when part of a frame has been read."""
        return self._body_length is not None or bool(self._prefix)

    def _read_prefix(self, view: memoryview) -> memoryview:
        """Consume prefix bytes from ``view``; set ``_body_length`` once complete."""
        for index, byte in enumerate(view):
            self._prefix.append(byte)
            if _partial_value(self._prefix) > self.max_size:
                self._fail(f"frame length exceeds the limit of {self.max_size} bytes", FrameTooLarge)
            if byte & 0x80:
                if len(self._prefix) >= MAX_VARINT_BYTES:
                    self._fail(f"length prefix longer than {MAX_VARINT_BYTES} bytes")
                continue
            if byte == 0 and len(self._prefix) > 1:
                self._fail("length prefix is not minimally encoded")
            self._body_length = _partial_value(self._prefix)
            self._prefix.clear()
            return view[index + 1 :]
        return view[len(view) :]

    def _fail(self, reason: str, error: type[FramingError] = FramingError) -> None:
        self._failed = True
        self._prefix.clear()
        self._body.clear()
        raise error(reason)


def _partial_value(prefix: bytearray) -> int:
    """The value of the varint bytes read so far: a lower bound of the final length."""
    value = 0
    for shift, byte in enumerate(prefix):
        value |= (byte & 0x7F) << (7 * shift)
    return value
