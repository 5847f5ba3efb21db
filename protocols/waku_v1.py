"""Waku v1 envelopes, proof of work, topic blooms and symmetric payloads.

The wire formats follow status-go's ``waku/common`` package, the deployed
implementation of 6/WAKU1, wherever it is more specific than the spec.

RLP strictness: go-ethereum's decoder (which status-go uses) rejects every
non-canonical form: long size headers for short items, sizes with leading
zero bytes, a single byte below 0x80 wrapped in a string header, integers
with leading zero bytes (including the lone byte 0x00). :func:`decode_rlp`
rejects the same inputs, so for every envelope :meth:`Envelope.decode`
accepts, ``Envelope.decode(raw).encode() == raw`` holds and
``envelope_hash(raw)`` equals the hash status-go computes. Callers that
relay or archive envelopes should still keep and serve the received bytes.

Every malformed input raises :class:`~wakustore.protocols.errors.WakuV1Error`.
"""

from __future__ import annotations

import hashlib
import math
import secrets
import struct
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Literal, TypedDict, Union, cast, overload

import rlp
from Crypto.Cipher import AES
from rlp.codec import consume_length_prefix, length_prefix
from rlp.exceptions import RLPException

from wakustore.protocols.crypto import keccak256, recover_public_key, sign_recoverable
from wakustore.protocols.errors import ProtocolError, WakuV1Error

# --- limits and sizes --------------------------------------------------------

# status-go waku/common/const.go TopicLength and BloomFilterSize.
TOPIC_SIZE = 4
BLOOM_SIZE = 64

# Envelope integer widths: status-go's Envelope struct has Expiry and TTL as
# uint32 and Nonce as uint64; go-ethereum's rlp refuses wider values.
MAX_UINT32 = 2**32 - 1
MAX_UINT64 = 2**64 - 1
# status-go waku/common/const.go DefaultSyncAllowance (seconds): how far an
# envelope may be stamped in the future; twice this past expiry is "very old".
SYNC_ALLOWANCE_S = 10

# status-go waku/common/const.go MaxMessageSize (10 MiB): the largest devp2p
# packet a Waku v1 node can be configured to accept, so no packet payload,
# envelope or envelope data is ever longer. Every decoder here refuses more.
MAX_MESSAGE_SIZE = 10 * 1024 * 1024
# status-go waku/common/const.go DefaultMaxMessageSize (1 MiB): the packet
# cap a node runs with unless configured otherwise.
DEFAULT_MAX_MESSAGE_SIZE = 1024 * 1024

# status-go waku/common/const.go EnvelopeHeaderLength: Envelope.Size() is
# this plus len(data); status-go uses it for its size check and to size the
# PoW target in Seal (not in the PoW value itself).
ENVELOPE_HEADER_SIZE = 20

# Symmetric payloads (status-go waku/common/const.go and message.go).
AES_KEY_SIZE = 32  # AESKeyLength
AES_NONCE_SIZE = 12  # aesNonceLength, Go's standard GCM nonce
GCM_TAG_SIZE = 16  # cipher.NewGCM's tag, appended by gcm.Seal
SIGNATURE_SIZE = 65  # crypto.SignatureLength: R || S || V
PADDING_BLOCK = 256  # padSizeLimit: plaintext is padded to a multiple
FLAG_SIGNED = 0x04  # signatureFlag
SIZE_FIELD_MASK = 0x03  # SizeMask: byte count of the payload size field
# The size field is at most 3 bytes (flags & 3); status-go would overflow
# into the signature flag for a 4-byte field, so payloads stay below 2^24.
MAX_PAYLOAD_SIZE = 2**24 - 1

# status-go waku/waku.go AddSymKeyFromPassword: PBKDF2-HMAC-SHA256, no salt,
# 65356 iterations (sic; not 65536), 32-byte key.
PASSWORD_KDF_ITERATIONS = 65356

# Nesting of the RLP values Waku v1 defines: an envelope is a flat list; a
# packet of envelopes or a request payload with a topic list nests two deep.
ENVELOPE_RLP_DEPTH = 1
ENVELOPE_RLP_ITEMS = 6  # the list and its five fields
ENVELOPE_LIST_RLP_DEPTH = 2

RlpItem = Union[bytes, list["RlpItem"]]  # noqa: UP007  (recursive: the forward reference needs Union)


# --- envelopes -----------------------------------------------------------------


@dataclass(frozen=True)
class Envelope:
    """A Waku v1 envelope.

    ``expiry`` is Unix time in seconds and ``ttl`` seconds, both uint32;
    ``topic`` is 4 bytes; ``nonce`` a uint64 found by :func:`seal`.
    """

    expiry: int
    ttl: int
    topic: bytes
    data: bytes
    nonce: int = 0

    def __post_init__(self) -> None:
        _check_uint(self.expiry, MAX_UINT32, "expiry")
        _check_uint(self.ttl, MAX_UINT32, "ttl")
        _check_uint(self.nonce, MAX_UINT64, "nonce")
        if not isinstance(self.topic, bytes) or len(self.topic) != TOPIC_SIZE:
            raise WakuV1Error(f"topic must be {TOPIC_SIZE} bytes")
        if not isinstance(self.data, bytes):
            raise WakuV1Error("envelope data must be bytes")
        if len(self.data) > MAX_MESSAGE_SIZE:
            raise WakuV1Error(f"envelope data exceeds {MAX_MESSAGE_SIZE} bytes")

    @property
    def timestamp(self) -> int:
        """Send time in Unix seconds: ``expiry - ttl`` in uint32 arithmetic.

        status-go's ``msg.Sent`` and mailserver key; a ttl larger than the
        expiry wraps around as Go's uint32 subtraction does.
        """
        return (self.expiry - self.ttl) & MAX_UINT32

    @property
    def size(self) -> int:
        """status-go's ``Envelope.Size()``: 20 + len(data) bytes."""
        return ENVELOPE_HEADER_SIZE + len(self.data)

    def encode(self) -> bytes:
        """RLP ``[expiry, ttl, topic, data, nonce]``, integers minimal big-endian."""
        return rlp_encode([self.expiry, self.ttl, self.topic, self.data, self.nonce])

    def rlp_without_nonce(self) -> bytes:
        """RLP ``[expiry, ttl, topic, data]``: what the proof of work hashes."""
        return rlp_encode([self.expiry, self.ttl, self.topic, self.data])

    @classmethod
    def decode(cls, raw: bytes, *, max_size: int = MAX_MESSAGE_SIZE) -> Envelope:
        """Decode one envelope; exactly five elements and no trailing bytes."""
        items = decode_rlp(raw, max_size=max_size, max_depth=ENVELOPE_RLP_DEPTH, max_items=ENVELOPE_RLP_ITEMS)
        if not isinstance(items, list):
            raise WakuV1Error("rlp: expected input list for Envelope")
        if len(items) != 5:
            raise WakuV1Error(
                "rlp: too few elements for Envelope"
                if len(items) < 5
                else "rlp: input list has too many elements for Envelope"
            )
        topic = rlp_bytes(items[2], "Envelope.Topic")
        if len(topic) != TOPIC_SIZE:
            raise WakuV1Error(f"rlp: topic must be {TOPIC_SIZE} bytes, got {len(topic)}")
        return cls(
            expiry=rlp_uint(items[0], MAX_UINT32, "Envelope.Expiry"),
            ttl=rlp_uint(items[1], MAX_UINT32, "Envelope.TTL"),
            topic=topic,
            data=rlp_bytes(items[3], "Envelope.Data"),
            nonce=rlp_uint(items[4], MAX_UINT64, "Envelope.Nonce"),
        )


def envelope_hash(raw_rlp: bytes) -> bytes:
    """keccak256 of an envelope's RLP bytes: its id on the wire (32 bytes)."""
    return keccak256(bytes(raw_rlp))


def decode_envelope_list(payload: bytes, *, max_size: int = DEFAULT_MAX_MESSAGE_SIZE) -> list[tuple[Envelope, bytes]]:
    """Decode the RLP list of envelopes a Messages (1) or P2P Message (0x7f) packet carries.

    Returns each envelope with its encoding exactly as received. Any
    malformed envelope rejects the whole packet, as status-go does.
    ``max_size`` (inclusive) is the packet cap the node runs with.
    """
    raws = split_rlp_list(payload, max_size=max_size, max_depth=ENVELOPE_LIST_RLP_DEPTH)
    return [(Envelope.decode(item), item) for item in raws]


def encode_envelope_list(raw_envelopes: Iterable[bytes]) -> bytes:
    """An RLP list of already-encoded envelopes, which are not re-encoded."""
    body = b"".join(bytes(raw) for raw in raw_envelopes)
    return rlp_list_header(len(body)) + body


# --- proof of work ---------------------------------------------------------------


def pow_value(envelope: Envelope, ttl: int | None = None) -> float:
    """status-go's ``Envelope.PoW()``.

    ``2**z / len(rlp([expiry, ttl, topic, data])) / ttl`` where ``z`` counts
    the leading zero bits of ``keccak256(rlp_without_nonce || nonce as 8
    bytes big-endian)``. Same IEEE double arithmetic as Go; ``ttl == 0``
    gives +inf, as Go's float division does. ``ttl`` replaces the
    envelope's in the division only (status-go's ``calculatePoW(diff)``
    for an envelope sent ahead: :func:`envelope_problem`).
    """
    ttl = envelope.ttl if ttl is None else ttl
    prefix = envelope.rlp_without_nonce()
    zeros = _leading_zero_bits(keccak256(prefix + envelope.nonce.to_bytes(8, "big")))
    if ttl == 0:
        return math.inf
    return float(2**zeros) / float(len(prefix)) / float(ttl)


def envelope_problem(envelope: Envelope, now_s: int, *, minimum_pow: float, max_size: int) -> str | None:
    """Why status-go's ``Waku.add`` would not archive ``envelope`` at Unix
    time ``now_s`` (seconds), or None when it would.

    Sent more than 10 s ahead: "envelope from future"; expired: "expired"
    (or "very old envelope" 20 s past expiry); ``envelope.size`` above
    ``max_size``; PoW below ``minimum_pow``, computed for an envelope sent
    ahead with its TTL stretched by the time difference plus one second.
    """
    sent = envelope.timestamp
    pow_ttl = envelope.ttl
    if sent > now_s:
        if sent - SYNC_ALLOWANCE_S > now_s:
            return "envelope from future"
        pow_ttl = (envelope.ttl + sent - now_s + 1) & MAX_UINT32
    if envelope.expiry < now_s:
        if ((envelope.expiry + 2 * SYNC_ALLOWANCE_S) & MAX_UINT32) < now_s:
            return "very old envelope"
        return "expired"
    if envelope.size > max_size:
        return f"huge messages are not allowed: {envelope.size} bytes"
    if minimum_pow > 0 and pow_value(envelope, pow_ttl) < minimum_pow:
        return "envelope with low PoW"
    return None


def seal(envelope: Envelope, target_pow: float, max_iterations: int) -> Envelope:
    """The envelope with the first nonce from 0 whose :func:`pow_value` >= ``target_pow``.

    Tries at most ``max_iterations`` nonces and raises WakuV1Error if none
    reaches the target. A target <= 0 returns the envelope unchanged.
    status-go's Seal sizes its bit target with ``Envelope.Size()``; this
    uses the length that ``pow_value`` divides by, so the result always
    passes a receiver's check.
    """
    if not target_pow > 0 or envelope.ttl == 0:
        return envelope
    prefix = envelope.rlp_without_nonce()
    needed = next(
        (bits for bits in range(257) if float(2**bits) / float(len(prefix)) / float(envelope.ttl) >= target_pow),
        None,
    )
    if needed is None:
        raise WakuV1Error(f"PoW target {target_pow} is unreachable")
    for nonce in range(min(max_iterations, MAX_UINT64 + 1)):
        digest = keccak256(prefix + nonce.to_bytes(8, "big"))
        if _leading_zero_bits(digest) >= needed:
            return replace(envelope, nonce=nonce)
    raise WakuV1Error(f"no nonce reached PoW {target_pow} in {max_iterations} tries")


def _leading_zero_bits(digest: bytes) -> int:
    return 8 * len(digest) - int.from_bytes(digest, "big").bit_length()


# --- topic bloom filters ---------------------------------------------------------


def topic_to_bloom(topic: bytes) -> bytes:
    """The 64-byte bloom of one 4-byte topic, as status-go's ``TopicToBloom``.

    Bit ``i`` is bit ``i % 8`` (least significant first) of byte ``i // 8``,
    for ``i = topic[j] + (256 if topic[3] & (1 << j) else 0)``, j in 0..2.
    status-go *assigns* each byte rather than OR-ing into it, so when two of
    the indices share a byte only the last one's bit survives; matching
    depends on reproducing that.
    """
    if not isinstance(topic, (bytes, bytearray)) or len(topic) != TOPIC_SIZE:
        raise WakuV1Error(f"topic must be {TOPIC_SIZE} bytes")
    bloom = bytearray(BLOOM_SIZE)
    for j in range(3):
        index = topic[j] + (256 if topic[3] & (1 << j) else 0)
        bloom[index // 8] = 1 << (index % 8)
    return bytes(bloom)


def bloom_for_topics(topics: Iterable[bytes]) -> bytes:
    """The OR of the topics' blooms (64 zero bytes for no topics)."""
    combined = 0
    for topic in topics:
        combined |= int.from_bytes(topic_to_bloom(topic), "big")
    return combined.to_bytes(BLOOM_SIZE, "big")


def full_bloom() -> bytes:
    """The all-ones bloom that matches every topic (a full node's)."""
    return b"\xff" * BLOOM_SIZE


def bloom_matches(bloom_filter: bytes, sample: bytes) -> bool:
    """True when every bit set in ``sample`` is set in ``bloom_filter`` (both 64 bytes)."""
    if len(bloom_filter) != BLOOM_SIZE or len(sample) != BLOOM_SIZE:
        raise WakuV1Error(f"bloom filters must be {BLOOM_SIZE} bytes")
    f = int.from_bytes(bloom_filter, "big")
    return f | int.from_bytes(sample, "big") == f


# --- symmetric payloads ----------------------------------------------------------


@dataclass(frozen=True)
class DecryptedPayload:
    """An opened symmetric payload.

    ``signature_public_key`` is the signer's 33-byte compressed secp256k1
    key, or None when the payload is unsigned.
    """

    payload: bytes
    signature_public_key: bytes | None
    padding: bytes


def key_from_password(password: str | bytes) -> bytes:
    """The 32-byte symmetric key status-go derives from a password (UTF-8)."""
    secret = password.encode("utf-8") if isinstance(password, str) else bytes(password)
    return hashlib.pbkdf2_hmac("sha256", secret, b"", PASSWORD_KDF_ITERATIONS, AES_KEY_SIZE)


def encrypt_symmetric(
    payload: bytes,
    key: bytes,
    signing_key: bytes | None = None,
    nonce: bytes | None = None,
    padding: bytes | None = None,
) -> bytes:
    """Build an envelope's ``data`` as status-go does for a symmetric key.

    plaintext = flags || payload size (1-3 bytes little-endian, count in
    flags & 3) || payload || padding || [65-byte signature, flags & 4];
    result = AES-256-GCM ciphertext || 16-byte tag || 12-byte nonce.

    ``padding=None`` draws random padding so that the plaintext, signature
    included, fills whole 256-byte blocks; a full block when it already
    would (status-go's appendPadding). Given bytes are used as they are.
    The signature (``signing_key`` 32 bytes) is R||S||V over keccak256 of
    the plaintext before it, with the signed flag already set.
    """
    payload = bytes(payload)
    _check_key(key)
    if key == bytes(AES_KEY_SIZE):
        # status-go's ValidateDataIntegrity refuses an all-zero key.
        raise WakuV1Error("invalid key provided for symmetric encryption")
    if len(payload) > MAX_PAYLOAD_SIZE:
        raise WakuV1Error(f"payload exceeds {MAX_PAYLOAD_SIZE} bytes")
    if nonce is None:
        nonce = secrets.token_bytes(AES_NONCE_SIZE)
    elif len(nonce) != AES_NONCE_SIZE:
        raise WakuV1Error(f"AES-GCM nonce must be {AES_NONCE_SIZE} bytes")
    size_field = len(payload).to_bytes(_size_field_length(len(payload)), "little")
    plain = bytearray([len(size_field)]) + size_field + payload
    if padding is None:
        raw_size = len(plain) + (SIGNATURE_SIZE if signing_key is not None else 0)
        padding = secrets.token_bytes(PADDING_BLOCK - raw_size % PADDING_BLOCK)
    plain += padding
    if signing_key is not None:
        plain[0] |= FLAG_SIGNED
        try:
            plain += sign_recoverable(bytes(signing_key), keccak256(bytes(plain)))
        except ProtocolError as exc:
            raise WakuV1Error(f"cannot sign payload: {exc}") from None
    cipher = AES.new(bytes(key), AES.MODE_GCM, nonce=bytes(nonce), mac_len=GCM_TAG_SIZE)
    ciphertext, tag = cipher.encrypt_and_digest(bytes(plain))
    return ciphertext + tag + bytes(nonce)


def decrypt_symmetric(data: bytes, key: bytes) -> DecryptedPayload:
    """Open an envelope's ``data`` with a 32-byte key and parse it.

    Follows status-go's decryptSymmetric and ValidateAndParse: a size field
    count of 0 means an empty payload and all the rest padding; a signature
    that recovers no key is an error.
    """
    data = bytes(data)
    _check_key(key)
    if len(data) > MAX_MESSAGE_SIZE:
        raise WakuV1Error(f"symmetric payload exceeds {MAX_MESSAGE_SIZE} bytes")
    if len(data) < AES_NONCE_SIZE + GCM_TAG_SIZE:
        raise WakuV1Error("missing salt or invalid payload in symmetric message")
    nonce = data[-AES_NONCE_SIZE:]
    sealed = data[:-AES_NONCE_SIZE]
    cipher = AES.new(bytes(key), AES.MODE_GCM, nonce=nonce, mac_len=GCM_TAG_SIZE)
    try:
        plain = cipher.decrypt_and_verify(sealed[:-GCM_TAG_SIZE], sealed[-GCM_TAG_SIZE:])
    except ValueError:
        raise WakuV1Error("cipher: message authentication failed") from None
    return _parse_plaintext(plain)


def _parse_plaintext(plain: bytes) -> DecryptedPayload:
    end = len(plain)
    if end < 1:
        raise WakuV1Error("decrypted payload is empty")
    flags = plain[0]
    signer = None
    if flags & FLAG_SIGNED:
        end -= SIGNATURE_SIZE
        if end <= 1:
            raise WakuV1Error("signed payload is too short for its signature")
        signature = plain[end:]
        try:
            signer = recover_public_key(signature, keccak256(plain[:end]))
        except ProtocolError as exc:
            raise WakuV1Error(f"invalid payload signature: {exc}") from None
    begin = 1
    size = 0
    count = flags & SIZE_FIELD_MASK
    if count:
        if end < begin + count:
            raise WakuV1Error("payload size field is truncated")
        size = int.from_bytes(plain[begin : begin + count], "little")
        begin += count
        if begin + size > end:
            raise WakuV1Error("payload size exceeds the decrypted data")
    return DecryptedPayload(
        payload=plain[begin : begin + size],
        signature_public_key=signer,
        padding=plain[begin + size : end],
    )


def _size_field_length(payload_size: int) -> int:
    length = 1
    while payload_size >= 256:
        payload_size //= 256
        length += 1
    return length


def _check_key(key: bytes) -> None:
    if not isinstance(key, (bytes, bytearray)) or len(key) != AES_KEY_SIZE:
        raise WakuV1Error(f"symmetric key must be {AES_KEY_SIZE} bytes")


def _check_uint(value: int, max_value: int, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= max_value:
        raise WakuV1Error(f"{what} must be an integer in [0, {max_value}]")


# --- strict RLP --------------------------------------------------------------------
# Shared by every Waku v1 codec (envelopes here, mailserver payloads).


def decode_rlp(raw: bytes, *, max_size: int, max_depth: int, max_items: int) -> RlpItem:
    """Decode one RLP item (bytes or nested lists of them) with no trailing data.

    Bounds, all inclusive: at most ``max_size`` input bytes, lists nested at
    most ``max_depth`` deep (a flat list has depth 1) and at most
    ``max_items`` items, the outermost one included. Rejects every
    non-canonical form go-ethereum's decoder rejects. Runs in time linear in
    ``len(raw)``, without recursion.
    """
    top, _ = _walk_rlp(raw, max_size, max_depth, max_items, build=True)
    return top


def split_rlp_list(raw: bytes, *, max_size: int, max_depth: int) -> list[bytes]:
    """The encodings of the items of one RLP list, sliced from ``raw`` unchanged.

    Checks the whole input as :func:`decode_rlp` does (no item count bound)
    without building the nested values.
    """
    is_list, spans = _walk_rlp(raw, max_size, max_depth, None, build=False)
    if not is_list:
        raise WakuV1Error("rlp: expected input list")
    return [raw[start:end] for start, end in spans]


@overload
def _walk_rlp(
    raw: bytes, max_size: int, max_depth: int, max_items: int | None, *, build: Literal[True]
) -> tuple[RlpItem, list[tuple[int, int]]]: ...


@overload
def _walk_rlp(
    raw: bytes, max_size: int, max_depth: int, max_items: int | None, *, build: Literal[False]
) -> tuple[bool, list[tuple[int, int]]]: ...


def _walk_rlp(
    raw: bytes, max_size: int, max_depth: int, max_items: int | None, *, build: bool
) -> tuple[RlpItem | bool | None, list[tuple[int, int]]]:
    """One pass over ``raw``; returns (top value or top-is-list, spans of the top list's items)."""
    if not isinstance(raw, (bytes, bytearray)):
        raise WakuV1Error(f"rlp: expected bytes, got {type(raw).__name__}")
    raw = bytes(raw)
    if len(raw) > max_size:
        raise WakuV1Error(f"rlp: input of {len(raw)} bytes exceeds {max_size}")
    if not raw:
        raise WakuV1Error("rlp: empty input")
    spans: list[tuple[int, int]] = []
    stack: list[tuple[RlpItem | None, int]] = []  # open lists and where each ends
    top: RlpItem | None = None
    value: RlpItem | None
    top_is_list = False
    items = 0
    pos = 0
    while True:
        while stack and pos == stack[-1][1]:
            stack.pop()
        if items and not stack:
            break
        items += 1
        if max_items is not None and items > max_items:
            raise WakuV1Error(f"rlp: more than {max_items} items")
        limit = stack[-1][1] if stack else len(raw)
        item_start = pos
        try:
            _, kind, length, payload_start = consume_length_prefix(raw, pos)
        except (RLPException, IndexError) as exc:
            raise WakuV1Error(f"rlp: {_describe(exc)}") from None
        end = payload_start + length
        if end > limit:
            raise WakuV1Error(
                "rlp: element is larger than containing list"
                if stack
                else "rlp: value size exceeds available input length"
            )
        if kind is list:
            if len(stack) >= max_depth:
                raise WakuV1Error(f"rlp: lists nested deeper than {max_depth}")
            value = [] if build else None
            pos = payload_start
        else:
            value = raw[payload_start:end] if build else None
            pos = end
        if stack:
            if build:
                cast("list[RlpItem]", stack[-1][0]).append(cast(RlpItem, value))
            if len(stack) == 1:
                spans.append((item_start, end))
        else:
            top, top_is_list = value, kind is list
        if kind is list:
            stack.append((value, end))
    if pos != len(raw):
        raise WakuV1Error("rlp: input contains more than one value")
    return (top if build else top_is_list), spans


def _describe(exc: Exception) -> str:
    if isinstance(exc, IndexError):
        return "input ends inside a size header"
    return str(exc.args[0]) if exc.args else type(exc).__name__


def rlp_uint(item: RlpItem, max_value: int, what: str) -> int:
    """An RLP string as an unsigned integer, canonical as go-ethereum requires."""
    if not isinstance(item, bytes):
        raise WakuV1Error(f"rlp: expected input string or byte for {what}")
    if item[:1] == b"\x00":
        raise WakuV1Error(f"rlp: non-canonical integer (leading zero bytes) for {what}")
    value = int.from_bytes(item, "big")
    if value > max_value:
        raise WakuV1Error(f"rlp: input string too long for {what}")
    return value


def rlp_bytes(item: RlpItem, what: str) -> bytes:
    if not isinstance(item, bytes):
        raise WakuV1Error(f"rlp: expected input string or byte for {what}")
    return item


def rlp_encode(value: object) -> bytes:
    """RLP-encode ints, bytes, bools and (nested) lists of them."""
    try:
        return cast(bytes, rlp.encode(value))
    except (RLPException, TypeError) as exc:
        raise WakuV1Error(f"rlp: cannot encode: {exc}") from None


def rlp_list_header(payload_size: int) -> bytes:
    """The RLP list header for ``payload_size`` bytes of concatenated items."""
    try:
        return cast(bytes, length_prefix(payload_size, 0xC0))
    except ValueError as exc:
        raise WakuV1Error(f"rlp: {exc}") from None


# --- waku/1 status -----------------------------------------------------------------

# status-go waku/common/const.go MaxTopicInterest (10,000 topics) plus room
# for the other options: the RLP items a status packet may hold.
MAX_STATUS_ITEMS = 10_000 + 64


@dataclass(frozen=True)
class PeerStatus:
    """A peer's waku/1 status options; None for what it did not say (or said badly)."""

    pow_requirement: float | None = None
    bloom: bytes | None = None
    light_node: bool | None = None
    confirmations: bool | None = None
    topic_interest: tuple[bytes, ...] | None = None


class _StatusValues(TypedDict, total=False):
    """The options :func:`decode_status` found, as :class:`PeerStatus` arguments."""

    pow_requirement: float
    bloom: bytes
    light_node: bool
    confirmations: bool
    topic_interest: tuple[bytes, ...]


def encode_status(
    minimum_pow: float,
    bloom: bytes | None = None,
    *,
    light_node: bool = False,
    confirmations: bool = False,
) -> bytes:
    """Our status packet as status-go's StatusOptions encodes it: a list of
    ``[key, value]``; PoW requirement (key 0) as the float64's bits, bloom
    (1, default all ones: a full node), light node (2), confirmations (3)."""
    pow_bits = struct.unpack(">Q", struct.pack(">d", float(minimum_pow)))[0]
    return rlp_encode(
        [
            [0, pow_bits],
            [1, full_bloom() if bloom is None else bloom],
            [2, bool(light_node)],
            [3, bool(confirmations)],
        ]
    )


def decode_status(payload: bytes) -> PeerStatus:
    """A peer's status packet, leniently: unknown keys and unusable values
    are skipped, and the options list may also come wrapped in a
    one-element list (a message with one argument, as nim-eth sends it)."""
    try:
        item = decode_rlp(payload, max_size=len(payload) or 1, max_depth=4, max_items=MAX_STATUS_ITEMS)
    except WakuV1Error:
        return PeerStatus()
    if (
        isinstance(item, list)
        and len(item) == 1
        and isinstance(item[0], list)
        and item[0]
        and all(isinstance(pair, list) for pair in item[0])
    ):
        item = item[0]
    values: _StatusValues = {}
    for pair in item if isinstance(item, list) else ():
        if not isinstance(pair, list) or len(pair) < 2:
            continue
        try:
            key = rlp_uint(pair[0], MAX_UINT64, "status option key")
        except WakuV1Error:
            continue
        value = pair[1]
        if key == 0 and isinstance(value, bytes) and len(value) <= 8:
            requirement = struct.unpack(">d", value.rjust(8, b"\0"))[0]
            if math.isfinite(requirement) and requirement >= 0:
                values["pow_requirement"] = requirement
        elif key == 1 and isinstance(value, bytes) and len(value) in (0, BLOOM_SIZE):
            values["bloom"] = value
        elif key in (2, 3) and value in (b"", b"\x01"):
            values["light_node" if key == 2 else "confirmations"] = value == b"\x01"
        elif key == 5 and isinstance(value, list):
            topics = tuple(t for t in value if isinstance(t, bytes) and len(t) == TOPIC_SIZE)
            values["topic_interest"] = topics
    return PeerStatus(**values)
