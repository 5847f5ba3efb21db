"""14/WAKU2-MESSAGE: the deterministic message hash, the MUID and validation.

Values only: decoding from and encoding to protobuf lives in
:mod:`wakustore.protocols.message_codec`.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass
from enum import Enum

from wakustore.protocols.errors import MessageError

# nwaku's default `--max-msg-size` (DefaultMaxWakuMessageSize = 150 KiB);
# the whole encoded WakuMessage counts, not the payload alone.
DEFAULT_MAX_MESSAGE_SIZE = 150 * 1024

# 14/WAKU2-MESSAGE: "meta ... MUST NOT exceed 64 bytes".
MAX_META_SIZE = 64

# nwaku's MaxMessageTimestampVariance: a sender timestamp more than 20 s
# from the node's clock is refused by the archive.
DEFAULT_MAX_TIME_DRIFT_NS = 20 * 1_000_000_000

HASH_SIZE = 32

# waku-message-uid-adr: "The maximum length for the MUID is 64 bytes", i.e.
# the 32-byte checksum plus at most 32 bytes of meta.
MUID_MAX_SIZE = 64
_MUID_META_PART = MUID_MAX_SIZE - HASH_SIZE
_sha256 = hashlib.sha256
_TIMESTAMP = struct.Struct(">q")


@dataclass(frozen=True, slots=True)
class WakuMessage:
    """A decoded WakuMessage. ``timestamp`` is Unix nanoseconds, 0 when unset.

    ``meta`` is ``b""`` both when absent and when empty: neither adds bytes
    to the hash, so the difference never matters for identity.
    """

    payload: bytes
    content_topic: str
    version: int = 0
    timestamp: int = 0
    meta: bytes = b""
    ephemeral: bool = False
    rate_limit_proof: bytes = b""


def message_hash(pubsub_topic: str, message: WakuMessage) -> bytes:
    """The deterministic message hash (Store v3 key and cursor), as nwaku computes it.

    sha256(pubsub_topic || payload || content_topic || meta || timestamp as
    8-byte big-endian). The timestamp bytes are always present (zeros when
    unset), as in nwaku and go-waku; js-waku omits them for timestamp 0.
    """
    # One buffer, one call: this runs once per message on the ingest path
    # (an update() per field cost more than the hashing).
    return _sha256(
        b"".join(
            (
                pubsub_topic.encode(),
                message.payload,
                message.content_topic.encode(),
                message.meta,
                _TIMESTAMP.pack(message.timestamp),
            )
        )
    ).digest()


def muid(pubsub_topic: str, message: WakuMessage) -> bytes:
    """The Waku Message UID (waku-message-uid-adr), at most 64 bytes.

    checksum = sha256(utf8(pubsub_topic) || utf8(content_topic) || meta || payload);
    muid = checksum || meta[:32]. The ADR leaves the encoding open: topics
    are UTF-8, the rest raw bytes, no separators. Meta beyond 32 bytes is
    still covered by the checksum; only the readable suffix is cut so the
    MUID keeps the ADR's 64-byte bound. This encoding is stable: it keys
    the table of record.
    """
    meta = message.meta
    return (
        _sha256(b"".join((pubsub_topic.encode(), message.content_topic.encode(), meta, message.payload))).digest()
        + meta[:_MUID_META_PART]
    )


# The table keeps a message's version (uint32 on the wire) as a signed
# 32-bit integer; deployed versions are 0 and 1.
MAX_STORED_VERSION = 2**31 - 1


class Rejection(str, Enum):
    """Why a message is not stored; the values label the rejection metrics."""

    TOO_LARGE = "too_large"
    META_TOO_LARGE = "meta_too_large"
    TIMESTAMP_DRIFT = "timestamp_drift"
    NO_CONTENT_TOPIC = "no_content_topic"
    VERSION_TOO_LARGE = "version_too_large"
    EPHEMERAL = "ephemeral"


class InvalidMessage(MessageError):
    """A message refused by :func:`check_storable`; ``reason`` says why."""

    def __init__(self, reason: Rejection, detail: str):
        super().__init__(f"{reason.value}: {detail}")
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Limits:
    """Named validation limits; sizes in bytes, drift in nanoseconds."""

    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE
    max_meta_size: int = MAX_META_SIZE
    max_time_drift_ns: int = DEFAULT_MAX_TIME_DRIFT_NS


DEFAULT_LIMITS = Limits()


def check_storable(
    message: WakuMessage,
    encoded_size: int,
    now_ns: int,
    limits: Limits = DEFAULT_LIMITS,
) -> None:
    """Raise :class:`InvalidMessage` unless ``message`` may enter the store.

    ``encoded_size`` is the size of the WakuMessage as received on the wire.
    A message without a timestamp is accepted (the node stamps it with the
    arrival time, as nwaku does); one whose timestamp is further than the
    drift window from ``now_ns`` in either direction is not. Ephemeral
    messages are valid on the network but never stored.
    """
    if encoded_size > limits.max_message_size:
        raise InvalidMessage(
            Rejection.TOO_LARGE,
            f"message is {encoded_size} bytes, limit {limits.max_message_size}",
        )
    if len(message.meta) > limits.max_meta_size:
        raise InvalidMessage(
            Rejection.META_TOO_LARGE,
            f"meta is {len(message.meta)} bytes, limit {limits.max_meta_size}",
        )
    if not message.content_topic:
        raise InvalidMessage(Rejection.NO_CONTENT_TOPIC, "content topic is empty")
    if message.version > MAX_STORED_VERSION:
        raise InvalidMessage(
            Rejection.VERSION_TOO_LARGE,
            f"version {message.version} is above {MAX_STORED_VERSION}, the largest the store keeps",
        )
    if message.timestamp and abs(message.timestamp - now_ns) > limits.max_time_drift_ns:
        raise InvalidMessage(
            Rejection.TIMESTAMP_DRIFT,
            f"timestamp {message.timestamp} is more than {limits.max_time_drift_ns} ns from {now_ns}",
        )
    if message.ephemeral:
        raise InvalidMessage(Rejection.EPHEMERAL, "ephemeral messages are not stored")
