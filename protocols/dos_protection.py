"""57/STATUS-Simple-Scaling: opt-in signed messages on protected pubsub topics.

The app-message-hash is sha256(pubsub_topic || payload || content_topic ||
timestamp as 8-byte LITTLE-endian || ephemeral as one byte); the signature
is a 64-byte R||S ECDSA signature over it (secp256k1, RFC 6979), carried in
the message's ``meta``. The spec's vector reproduces only with the
little-endian timestamp.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass
from enum import Enum

from wakustore.protocols.crypto import public_key_from_bytes, sign_compact, verify_compact
from wakustore.protocols.errors import DosProtectionError, ProtocolError
from wakustore.protocols.message import WakuMessage

SIGNATURE_SIZE = 64

# 57 names a MessageWindowInSec without a value; nwaku's
# `--protected-shard` validator uses 5 minutes (messageWindowInSec = 300).
DEFAULT_MESSAGE_WINDOW_NS = 300 * 1_000_000_000


def app_message_hash(pubsub_topic: str, message: WakuMessage) -> bytes:
    h = hashlib.sha256()
    h.update(pubsub_topic.encode())
    h.update(message.payload)
    h.update(message.content_topic.encode())
    h.update(struct.pack("<q", message.timestamp))
    h.update(b"\x01" if message.ephemeral else b"\x00")
    return h.digest()


def sign_message(private_key: bytes, pubsub_topic: str, message: WakuMessage) -> bytes:
    """The 64-byte signature a publisher puts in ``meta``."""
    try:
        return sign_compact(private_key, app_message_hash(pubsub_topic, message))
    except ProtocolError as exc:
        raise DosProtectionError(str(exc)) from None


class Verdict(str, Enum):
    """The validator's outcome; values label the accept/reject metrics."""

    ACCEPT = "accept"
    NO_TIMESTAMP = "no_timestamp"
    OUTSIDE_WINDOW = "outside_window"
    NO_SIGNATURE = "no_signature"
    BAD_SIGNATURE_SIZE = "bad_signature_size"
    BAD_SIGNATURE = "bad_signature"


@dataclass(frozen=True, slots=True)
class ProtectedTopic:
    """A protected pubsub topic and the public key (33 or 65 bytes) it trusts."""

    pubsub_topic: str
    public_key: bytes

    def __post_init__(self) -> None:
        try:
            public_key_from_bytes(self.public_key)
        except ProtocolError as exc:
            raise DosProtectionError(f"protected topic {self.pubsub_topic}: {exc}") from None


def validate(
    topic: ProtectedTopic,
    message: WakuMessage,
    now_ns: int,
    window_ns: int = DEFAULT_MESSAGE_WINDOW_NS,
) -> Verdict:
    """The relay validator of 57, in the order the spec lists its rules."""
    if message.timestamp == 0:
        return Verdict.NO_TIMESTAMP
    if abs(now_ns - message.timestamp) > window_ns:
        return Verdict.OUTSIDE_WINDOW
    if not message.meta:
        return Verdict.NO_SIGNATURE
    if len(message.meta) != SIGNATURE_SIZE:
        return Verdict.BAD_SIGNATURE_SIZE
    digest = app_message_hash(topic.pubsub_topic, message)
    if not verify_compact(topic.public_key, message.meta, digest):
        return Verdict.BAD_SIGNATURE
    return Verdict.ACCEPT
