"""Waku v1 mailserver payloads: requests, cursors, Request Complete, bundles.

Three request forms reach a mailserver in a P2P Request (0x7e) packet:

- ``spec``: an encrypted envelope whose payload is RLP
  ``[lower, upper, bloom, limit, cursor, [topics]]`` (cursor and topics
  optional), as the Waku Mailserver spec and nim-waku's client send it;
- ``status-go``: an encrypted envelope whose payload is RLP
  ``[lower, upper, bloom, [topics], limit, cursor, batch]``
  (status-go mailserver/request.go MessagesRequestPayload; go-ethereum's
  decoder requires all seven elements);
- ``direct``: no envelope, the packet itself is RLP
  ``[id, from, to, limit, cursor, bloom, [topics]]`` (status-go
  waku/common/message.go MessagesRequest), which Status's Waku v1 client
  sent (protocol/transport/transport.go createMessagesRequestV1).

The envelope-carried layouts differ at index 3: a list there is status-go's.
A request envelope must be signed, as status-go's mailserver requires (see
:func:`open_request`); a direct request carries no signature.
Every malformed input raises :class:`~wakustore.protocols.errors.WakuV1Error`
whose message is the text status-go answers with, where it has one.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from wakustore.protocols.errors import WakuV1Error
from wakustore.protocols.waku_v1 import (
    BLOOM_SIZE,
    DEFAULT_MAX_MESSAGE_SIZE,
    MAX_MESSAGE_SIZE,
    MAX_UINT32,
    TOPIC_SIZE,
    Envelope,
    RlpItem,
    bloom_matches,
    decode_rlp,
    decrypt_symmetric,
    encode_envelope_list,
    envelope_hash,
    pow_value,
    rlp_bytes,
    rlp_encode,
    rlp_list_header,
    rlp_uint,
    topic_to_bloom,
)

# Packet codes (status-go waku/v1/const.go).
STATUS = 0
MESSAGES = 1
P2P_REQUEST_COMPLETE = 0x7D
P2P_REQUEST = 0x7E
P2P_MESSAGE = 0x7F

# status-go waku/common/const.go DefaultMaxMessageSize: the devp2p packet
# cap a Waku v1 peer enforces by default (waku/v1/peer.go drops the peer on
# a larger packet), so every 0x7f bundle stays within it.
MAX_PACKET_SIZE = DEFAULT_MAX_MESSAGE_SIZE

# status-go mailserver/request.go maxMessagesRequestPayloadLimit and
# mailserver/mailserver.go maxQueryLimit (the default for limit 0).
MAX_REQUEST_LIMIT = 1000
DEFAULT_REQUEST_LIMIT = 1000
# status-go mailserver/mailserver.go whisperTTLSafeThreshold: upper 0 means
# now plus this many seconds, for envelopes stamped slightly ahead.
UPPER_DEFAULT_MARGIN_S = 60

# status-go mailserver/db_key.go CursorLength: 4-byte timestamp + hash.
CURSOR_SIZE = 36
HASH_SIZE = 32
# The spec allows `topics = "[" *1000topic "]"`; Status's client sends at
# most 10 (protocol/messenger_mailserver.go maxTopicsPerRequest).
MAX_TOPICS = 1000
# Request payload bound: the largest valid one (1000 topics, a 36-byte
# cursor) is about 5.2 KiB; this leaves ample room and keeps decoding cheap.
MAX_REQUEST_PAYLOAD_SIZE = 64 * 1024
# The request list, its seven fields and MAX_TOPICS topics.
MAX_REQUEST_RLP_ITEMS = 1 + 7 + MAX_TOPICS
REQUEST_RLP_DEPTH = 2  # the request list and its topic list

# status-go mailserver/mailserver.go decodeRequest wrapping checkMsgSignature's
# error: what an unsigned request envelope is answered with.
WRONG_SIGNATURE = "check message signature failed: wrong signature of p2p request"

# status-go waku/mailserver.go mailServerFailedPayloadPrefix.
ERROR_PREFIX = b"ERROR="

LAYOUT_SPEC = "spec"
LAYOUT_STATUS_GO = "status-go"
LAYOUT_DIRECT = "direct"
_LAYOUTS = (LAYOUT_SPEC, LAYOUT_STATUS_GO, LAYOUT_DIRECT)

_ZERO_HASH = bytes(HASH_SIZE)


# --- requests ------------------------------------------------------------------


@dataclass(frozen=True)
class MessagesRequest:
    """A request for archived envelopes.

    ``lower`` and ``upper`` are Unix seconds, both inclusive, compared with
    an envelope's ``expiry - ttl``; ``upper`` 0 means "now + 60 s" and
    ``limit`` 0 means 1000 until :func:`validate_request` applies them.
    ``bloom`` is empty or 64 bytes; a non-empty ``topics`` wins over it.
    ``cursor`` is empty or 36 bytes (see :func:`encode_cursor`), exclusive.
    ``batch`` says the client takes many envelopes per 0x7f packet.
    ``layout`` records the form the request came in; ``request_id`` is the
    in-band id of a ``direct`` request (empty otherwise).
    """

    lower: int
    upper: int
    bloom: bytes = b""
    topics: Sequence[bytes] = ()
    limit: int = 0
    cursor: bytes = b""
    batch: bool = True
    layout: str = LAYOUT_STATUS_GO
    request_id: bytes = b""

    def __post_init__(self) -> None:
        for name in ("lower", "upper", "limit"):
            value = getattr(self, name)
            if not _is_uint32(value):
                raise WakuV1Error(f"{name} must be an integer in [0, {MAX_UINT32}]")
        for name in ("bloom", "cursor", "request_id"):
            if not isinstance(getattr(self, name), bytes):
                raise WakuV1Error(f"{name} must be bytes")
        topics = tuple(self.topics)
        if not all(isinstance(topic, bytes) for topic in topics):
            raise WakuV1Error("topics must be bytes")
        object.__setattr__(self, "topics", topics)
        if self.layout not in _LAYOUTS:
            raise WakuV1Error(f"unknown request layout {self.layout!r}")

    def matches_topic(self, topic: bytes) -> bool:
        """Whether envelopes on ``topic`` belong to the answer.

        Topics, when given, win over the bloom filter. Call on a validated
        request.
        """
        if self.topics:
            return topic in self.topics
        return bloom_matches(self.bloom, topic_to_bloom(topic))


def decode_request_payload(raw: bytes) -> MessagesRequest:
    """Decode the decrypted payload of a request envelope, in either layout.

    Errors read "failed to decode data: ...", as status-go answers.
    """
    items = _decode_request_rlp(raw)
    if len(items) < 4:
        raise _decode_error("too few elements for the request payload")
    lower = _uint(items[0], "lower")
    upper = _uint(items[1], "upper")
    bloom = _bytes(items[2], "bloom")
    if isinstance(items[3], list):
        if len(items) != 7:
            raise _decode_error(f"the status-go request payload has 7 elements, got {len(items)}")
        return MessagesRequest(
            lower=lower,
            upper=upper,
            bloom=bloom,
            topics=_topics(items[3]),
            limit=_uint(items[4], "limit"),
            cursor=_bytes(items[5], "cursor"),
            batch=_bool(items[6], "batch"),
            layout=LAYOUT_STATUS_GO,
        )
    if len(items) > 6:
        raise _decode_error("input list has too many elements for the request payload")
    topics: tuple[bytes, ...] = ()
    if len(items) == 6:
        if not isinstance(items[5], list):
            raise _decode_error("expected input list for topics")
        topics = _topics(items[5])
    return MessagesRequest(
        lower=lower,
        upper=upper,
        bloom=bloom,
        topics=topics,
        limit=_uint(items[3], "limit"),
        cursor=_bytes(items[4], "cursor") if len(items) > 4 else b"",
        batch=True,
        layout=LAYOUT_SPEC,
    )


def encode_request_payload(request: MessagesRequest, layout: str | None = None) -> bytes:
    """The RLP request payload in ``layout`` ("spec" or "status-go").

    Defaults to the request's own layout ("status-go" for a direct one).
    The spec form always carries the cursor (empty when unset) and carries
    the topic list only when there are topics.
    """
    layout = layout or request.layout
    if layout == LAYOUT_DIRECT:
        layout = LAYOUT_STATUS_GO
    topics = list(request.topics)
    if layout == LAYOUT_STATUS_GO:
        return rlp_encode(
            [
                request.lower,
                request.upper,
                request.bloom,
                topics,
                request.limit,
                request.cursor,
                bool(request.batch),
            ]
        )
    if layout == LAYOUT_SPEC:
        fields = [request.lower, request.upper, request.bloom, request.limit, request.cursor]
        if topics:
            fields.append(topics)
        return rlp_encode(fields)
    raise WakuV1Error(f"unknown request layout {layout!r}")


def decode_direct_request(raw: bytes) -> MessagesRequest:
    """Decode status-go's unencrypted ``[id, from, to, limit, cursor, bloom, [topics]]``.

    The id must be 32 bytes; status-go's client validates that before
    sending. The result has layout "direct" and ``batch`` True, as
    status-go's Deliver sets.
    """
    items = _decode_request_rlp(raw)
    if len(items) != 7:
        raise _decode_error(f"the direct request has 7 elements, got {len(items)}")
    request_id = _bytes(items[0], "id")
    if len(request_id) != HASH_SIZE:
        raise WakuV1Error("invalid 'ID', expected a 32-byte slice")
    if not isinstance(items[6], list):
        raise _decode_error("expected input list for topics")
    return MessagesRequest(
        lower=_uint(items[1], "from"),
        upper=_uint(items[2], "to"),
        limit=_uint(items[3], "limit"),
        cursor=_bytes(items[4], "cursor"),
        bloom=_bytes(items[5], "bloom"),
        topics=_topics(items[6]),
        batch=True,
        layout=LAYOUT_DIRECT,
        request_id=request_id,
    )


def encode_direct_request(request: MessagesRequest) -> bytes:
    """status-go's direct request; ``request.request_id`` must be 32 bytes."""
    if len(request.request_id) != HASH_SIZE:
        raise WakuV1Error("invalid 'ID', expected a 32-byte slice")
    return rlp_encode(
        [
            request.request_id,
            request.lower,
            request.upper,
            request.limit,
            request.cursor,
            request.bloom,
            list(request.topics),
        ]
    )


@dataclass(frozen=True)
class P2PRequest:
    """What a P2P Request (0x7e) packet holds.

    Exactly one of ``envelope`` (encrypted: open it with
    :func:`open_request`) and ``request`` (direct) is set. ``request_id``
    (32 bytes) is what Request Complete echoes: the keccak256 of the
    envelope's RLP, or the direct request's id.
    """

    request_id: bytes
    envelope: Envelope | None = None
    request: MessagesRequest | None = None


def decode_p2p_request(payload: bytes) -> P2PRequest:
    """Decode a P2P Request packet: an envelope first, else a direct request.

    This is status-go's order (waku/v1/peer.go handleP2PRequestCode).
    """
    try:
        return P2PRequest(request_id=envelope_hash(payload), envelope=Envelope.decode(payload))
    except WakuV1Error as envelope_error:
        try:
            request = decode_direct_request(payload)
        except WakuV1Error as direct_error:
            raise WakuV1Error(
                f"invalid p2p request message: not an envelope ({envelope_error}) nor a direct request ({direct_error})"
            ) from None
    return P2PRequest(request_id=request.request_id, request=request)


def open_request(
    envelope: Envelope,
    key: bytes,
    *,
    minimum_pow: float = 0.0,
) -> MessagesRequest:
    """Check, decrypt and decode a request envelope as status-go's mailserver does.

    Errors, in status-go's order and words (mailserver.go decodeRequest):
    "PoW too low" (only when ``minimum_pow`` > 0), "failed to decrypt p2p
    request", "check message signature failed: wrong signature of p2p
    request" for an unsigned payload, and "failed to decode data: ...".

    status-go's checkMsgSignature only asks that a signer key be recovered:
    its comparison with the requesting peer's node key is commented out, so
    a request signed by any key is served (its clients sign with their node
    key). A signature that recovers no key fails inside decryption already.
    """
    if minimum_pow > 0.0 and pow_value(envelope) < minimum_pow:
        raise WakuV1Error("PoW too low")
    try:
        opened = decrypt_symmetric(envelope.data, key)
    except WakuV1Error:
        raise WakuV1Error("failed to decrypt p2p request") from None
    if opened.signature_public_key is None:
        raise WakuV1Error(WRONG_SIGNATURE)
    return decode_request_payload(opened.payload)


def validate_request(request: MessagesRequest, now_s: int) -> MessagesRequest:
    """Apply the defaults and checks; return the request the server answers.

    ``now_s`` is the server's Unix time in seconds. Upper 0 becomes
    ``now_s + 60`` and limit 0 becomes 1000. Beyond status-go's checks
    (range, bloom/topics, limit), this rejects topics that are not 4 bytes,
    more than 1000 topics, a bloom used for filtering that is not 64 bytes,
    and a cursor that is neither empty nor 36 bytes (status-go silently
    ignores such a cursor and would restart from the beginning).
    """
    upper = request.upper or min(now_s + UPPER_DEFAULT_MARGIN_S, MAX_UINT32)
    if request.lower > upper:
        # The envelope path checks the range before the generic validation
        # and answers without the "request is invalid: " prefix.
        message = "query range is invalid: lower > upper"
        if request.layout == LAYOUT_DIRECT:
            message = "request is invalid: " + message
        raise WakuV1Error(message)
    limit = request.limit or DEFAULT_REQUEST_LIMIT
    if not request.bloom and not request.topics:
        raise WakuV1Error("request is invalid: bloom filter and topics is empty")
    if limit > MAX_REQUEST_LIMIT:
        raise WakuV1Error("request is invalid: limit exceeds the maximum allowed value")
    if len(request.topics) > MAX_TOPICS:
        raise WakuV1Error(f"request is invalid: more than {MAX_TOPICS} topics")
    if any(len(topic) != TOPIC_SIZE for topic in request.topics):
        raise WakuV1Error(f"request is invalid: topics must be {TOPIC_SIZE} bytes")
    if not request.topics and len(request.bloom) != BLOOM_SIZE:
        raise WakuV1Error(f"request is invalid: bloom filter must be {BLOOM_SIZE} bytes")
    if request.cursor and len(request.cursor) != CURSOR_SIZE:
        raise WakuV1Error(
            f"request is invalid: invalid cursor size: expected {CURSOR_SIZE} but got {len(request.cursor)}"
        )
    return replace(request, upper=upper, limit=limit)


# --- cursors -------------------------------------------------------------------


@dataclass(frozen=True)
class Cursor:
    """A decoded mailserver cursor: send time (Unix seconds) and envelope hash."""

    timestamp: int
    envelope_hash: bytes


def encode_cursor(timestamp_s: int, envelope_hash: bytes) -> bytes:
    """36 bytes: the uint32 big-endian send time (expiry - ttl), then the hash.

    Names the last envelope a page sent; the next page starts after it.
    """
    if not _is_uint32(timestamp_s):
        raise WakuV1Error(f"cursor timestamp must be in [0, {MAX_UINT32}]")
    if len(envelope_hash) != HASH_SIZE:
        raise WakuV1Error(f"cursor hash must be {HASH_SIZE} bytes")
    return timestamp_s.to_bytes(4, "big") + bytes(envelope_hash)


def decode_cursor(raw: bytes) -> Cursor:
    """Split a 36-byte cursor into its send time and envelope hash."""
    if len(raw) != CURSOR_SIZE:
        raise WakuV1Error(f"invalid cursor size: expected {CURSOR_SIZE} but got {len(raw)}")
    return Cursor(timestamp=int.from_bytes(raw[:4], "big"), envelope_hash=bytes(raw[4:]))


def envelope_cursor(raw_envelope: bytes) -> bytes:
    """The cursor naming one envelope, from its RLP bytes."""
    envelope = Envelope.decode(raw_envelope)
    return encode_cursor(envelope.timestamp, envelope_hash(raw_envelope))


# --- Request Complete ------------------------------------------------------------


@dataclass(frozen=True)
class RequestComplete:
    """A decoded P2P Request Complete (0x7d) payload.

    ``last_envelope_hash`` is 32 zero bytes when none was sent (and in the
    error form); ``cursor`` is empty when nothing is left; ``error`` is the
    server's message for a failed request, else None.
    """

    request_id: bytes
    last_envelope_hash: bytes
    cursor: bytes
    error: str | None
    layout: str


def encode_request_complete(
    request_id: bytes,
    last_envelope_hash: bytes = _ZERO_HASH,
    cursor: bytes = b"",
    layout: str = LAYOUT_STATUS_GO,
) -> bytes:
    """The 0x7d packet payload for a request served.

    "status-go" (and "direct"): one RLP string holding request_id (32) ||
    last_envelope_hash (32) || cursor (0 or 36). "spec": the RLP list
    ``[request_id, last_envelope_hash, cursor]``, the cursor always present
    (empty when unset) since nim-waku's reader expects three fields.
    """
    if len(request_id) != HASH_SIZE or len(last_envelope_hash) != HASH_SIZE:
        raise WakuV1Error(f"request id and envelope hash must be {HASH_SIZE} bytes")
    if cursor and len(cursor) != CURSOR_SIZE:
        raise WakuV1Error(f"cursor must be empty or {CURSOR_SIZE} bytes")
    if layout in (LAYOUT_STATUS_GO, LAYOUT_DIRECT):
        return rlp_encode(bytes(request_id) + bytes(last_envelope_hash) + bytes(cursor))
    if layout == LAYOUT_SPEC:
        return rlp_encode([bytes(request_id), bytes(last_envelope_hash), bytes(cursor)])
    raise WakuV1Error(f"unknown request layout {layout!r}")


def encode_request_complete_error(request_id: bytes, message: str) -> bytes:
    """The 0x7d payload for a failed request: RLP string "ERROR=" || id || message."""
    if len(request_id) != HASH_SIZE:
        raise WakuV1Error(f"request id must be {HASH_SIZE} bytes")
    return rlp_encode(ERROR_PREFIX + bytes(request_id) + message.encode("utf-8"))


def decode_request_complete(raw: bytes) -> RequestComplete:
    """Decode any Request Complete form: status-go success or error, or the spec list.

    Like status-go's client (waku/mailserver.go), the error form is tried
    first. Unlike it, a status-go string must be exactly 32, 64 or 100
    bytes; status-go ignores stray bytes.
    """
    item = decode_rlp(raw, max_size=MAX_MESSAGE_SIZE, max_depth=1, max_items=4)
    if isinstance(item, list):
        return _decode_spec_complete(item)
    if len(item) >= len(ERROR_PREFIX) + HASH_SIZE and item.startswith(ERROR_PREFIX):
        rest = item[len(ERROR_PREFIX) :]
        return RequestComplete(
            request_id=rest[:HASH_SIZE],
            last_envelope_hash=_ZERO_HASH,
            cursor=b"",
            error=rest[HASH_SIZE:].decode("utf-8", errors="replace"),
            layout=LAYOUT_STATUS_GO,
        )
    if len(item) not in (HASH_SIZE, 2 * HASH_SIZE, 2 * HASH_SIZE + CURSOR_SIZE):
        raise WakuV1Error(f"unexpected payload size: {len(item)}")
    return RequestComplete(
        request_id=item[:HASH_SIZE],
        last_envelope_hash=item[HASH_SIZE : 2 * HASH_SIZE] or _ZERO_HASH,
        cursor=item[2 * HASH_SIZE :],
        error=None,
        layout=LAYOUT_STATUS_GO,
    )


def _decode_spec_complete(items: list[RlpItem]) -> RequestComplete:
    if len(items) not in (2, 3):
        raise WakuV1Error(f"request complete list has {len(items)} elements, expected 2 or 3")
    request_id = _bytes(items[0], "request id", plain=True)
    last_hash = _bytes(items[1], "last envelope hash", plain=True)
    if len(request_id) != HASH_SIZE or len(last_hash) != HASH_SIZE:
        raise WakuV1Error(f"request id and envelope hash must be {HASH_SIZE} bytes")
    cursor = _bytes(items[2], "cursor", plain=True) if len(items) == 3 else b""
    return RequestComplete(
        request_id=request_id,
        last_envelope_hash=last_hash,
        cursor=cursor,
        error=None,
        layout=LAYOUT_SPEC,
    )


# --- bundles -------------------------------------------------------------------


def bundle_envelopes(raw_envelopes: Iterable[bytes], max_packet_size: int = MAX_PACKET_SIZE) -> list[bytes]:
    """Group RLP-encoded envelopes into 0x7f packet payloads, in order.

    Each payload is an RLP list of the envelopes, byte for byte, at most
    ``max_packet_size`` bytes long (inclusive, list header included).
    An envelope that cannot fit alone raises WakuV1Error. No envelopes
    give no payloads.
    """
    bundles: list[bytes] = []
    current: list[bytes] = []
    body_size = 0
    for raw in raw_envelopes:
        raw = bytes(raw)
        if not raw:
            raise WakuV1Error("an encoded envelope cannot be empty")
        if _list_size(len(raw)) > max_packet_size:
            raise WakuV1Error(f"envelope of {len(raw)} bytes does not fit a {max_packet_size}-byte packet")
        if current and _list_size(body_size + len(raw)) > max_packet_size:
            bundles.append(encode_envelope_list(current))
            current, body_size = [], 0
        current.append(raw)
        body_size += len(raw)
    if current:
        bundles.append(encode_envelope_list(current))
    return bundles


def _list_size(body_size: int) -> int:
    return len(rlp_list_header(body_size)) + body_size


# --- private helpers -----------------------------------------------------------


def _decode_request_rlp(raw: bytes) -> list[RlpItem]:
    try:
        items = decode_rlp(
            raw,
            max_size=MAX_REQUEST_PAYLOAD_SIZE,
            max_depth=REQUEST_RLP_DEPTH,
            max_items=MAX_REQUEST_RLP_ITEMS,
        )
    except WakuV1Error as exc:
        raise _decode_error(str(exc)) from None
    if not isinstance(items, list):
        raise _decode_error("rlp: expected input list for the request payload")
    return items


def _is_uint32(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_UINT32


def _decode_error(reason: str) -> WakuV1Error:
    return WakuV1Error(f"failed to decode data: {reason}")


def _uint(item: RlpItem, what: str) -> int:
    try:
        return rlp_uint(item, MAX_UINT32, what)
    except WakuV1Error as exc:
        raise _decode_error(str(exc)) from None


def _bytes(item: RlpItem, what: str, *, plain: bool = False) -> bytes:
    try:
        return rlp_bytes(item, what)
    except WakuV1Error as exc:
        raise (exc if plain else _decode_error(str(exc))) from None


def _bool(item: RlpItem, what: str) -> bool:
    # go-ethereum's Stream.Bool: 0x80 is false, 0x01 true, anything else an error.
    value = _bytes(item, what)
    if value == b"":
        return False
    if value == b"\x01":
        return True
    raise _decode_error(f"rlp: invalid boolean value for {what}")


def _topics(items: list[RlpItem]) -> tuple[bytes, ...]:
    if len(items) > MAX_TOPICS:
        raise _decode_error(f"more than {MAX_TOPICS} topics")
    return tuple(_bytes(item, "topic") for item in items)
