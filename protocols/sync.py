"""WAKU-SYNC (waku-org/specs standards/core/sync.md), sans-IO.

Two libp2p protocols:

- ``/vac/waku/reconciliation/1.0.0``: range-based set reconciliation over
  *sync ids* ``(timestamp ns, message hash)``, ordered by timestamp then
  hash. Each side answers a :class:`RangesData` payload with another;
  a range is skipped (both sides agree), summarised by a fingerprint
  (the XOR of its hashes) or listed in full (an item set). What each side
  learns is which ids the other lacks; nobody asks for anything, each
  side *sends* what the other lacks over transfer.
- ``/vac/waku/transfer/1.0.0``: one ``WakuMessageAndTopic`` protobuf per
  length-prefixed frame.

Wire encoding, as nwaku writes and reads it (waku/waku_store_sync/codec.nim,
nwaku master of 2025-12; the spec's prose differs where noted):

- An empty payload is the single byte ``00`` (nwaku also sends zero bytes
  after a topic mismatch): both mean "nothing left", the end of a session.
- Otherwise: the sender's pubsub topics and content topics, each a varint
  count then varint-length-prefixed UTF-8 strings (the spec says a cluster
  id and shards; nwaku replaced them with topics in #3275, 2025-09); the
  timestamp of the first range's lower bound (its hash is implicitly zero);
  then per range its upper bound, delta-encoded against the previous bound
  (varint timestamp difference; when 0, one length byte and the hash bytes
  up to and including the first byte differing from the previous bound's
  hash, the rest read as zeros), one range-type byte (0 skip,
  1 fingerprint, 2 item set) and the content: 32 fingerprint bytes, or a
  varint count, the items (varint timestamp delta, the first against 0,
  then the 32-byte hash) and one ``reconciled`` byte.
- Varints are LEB128, minimally encoded (the spec's MUST); timestamps
  must fit a signed 64-bit integer.
- Bounds: lower inclusive, upper exclusive, strictly increasing. A bound
  whose hash has bytes past what the encoding keeps cannot be written:
  every bound this module creates has a zero hash (time partitions), and
  bounds read from a peer are re-encoded exactly (the prefix written is
  long enough to hold every non-zero byte; nwaku reads any length up to 32).

Transfer: nwaku numbers ``pubsub_topic = 1, message = 2``; the spec prints
``message = 1, pubsub_topic = 2``. This node writes nwaku's layout and
reads either (a spec-layout frame never parses as nwaku's: its field 2 is
a topic string starting with ``/``, an invalid wire type for a message).

Bounds against a peer that lies (the spec trusts sync peers; this node
does not have to): a payload is at most :data:`MAX_PAYLOAD_SIZE` bytes,
:data:`MAX_RANGES` ranges and :data:`MAX_ITEMS` items; a session at most
:data:`MAX_ROUNDS` payloads received and :data:`MAX_DIFFERENCES` ids found
missing on either side; a reply that would exceed the payload limits ends
the session. Fingerprints that never match only make ranges narrower each
round (time partitions) until they are listed as item sets, and the round
limit ends a peer that keeps answering item sets with fingerprints.
Anything outside these bounds raises :class:`SyncError`; nothing else
escapes a decoder.
"""

from __future__ import annotations

import bisect
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import IntEnum

from wakustore.protocols.errors import SyncError
from wakustore.protocols.framing import encode_uvarint
from wakustore.protocols.message import HASH_SIZE, WakuMessage
from wakustore.protocols.message_codec import (
    message_from_pb,
    nested_message_size,
    parse_protobuf,
    write_message_pb,
)
from wakustore.protos import sync_transfer_pb2

RECONCILIATION_PROTOCOL_ID = "/vac/waku/reconciliation/1.0.0"
TRANSFER_PROTOCOL_ID = "/vac/waku/transfer/1.0.0"

ZERO_HASH = bytes(HASH_SIZE)

# A sync id: (timestamp in Unix ns, 32-byte message hash).
SyncId = tuple[int, bytes]

# nwaku's defaults (waku/waku_store_sync/common.nim, storage/seq_storage.nim):
# a range holding at most 100 ids is listed, a larger one split in 8.
ITEM_SET_THRESHOLD = 100
PARTITION_COUNT = 8

# Payload limits. nwaku reads reconciliation frames without a limit
# (readLp(int.high)). A legitimate payload lists at most ITEM_SET_THRESHOLD
# ids per range and splits each range in PARTITION_COUNT: a session over a
# million ids with every range differing stays under 2 MiB a round. 8 MiB
# leaves room and bounds a hostile frame; at 33 bytes an item at least,
# MAX_ITEMS is about what 8 MiB can hold.
MAX_PAYLOAD_SIZE = 8 * 1024 * 1024
MAX_ITEMS = 250_000
MAX_RANGES = 65_536
# Topics in a payload header. nwaku caps a Store query at 10 content
# topics; a sync header lists a node's shards (at most 1024 in a cluster).
MAX_TOPICS = 1024
MAX_TOPIC_LENGTH = 1024

# Session limits. Reconciling n ids takes about 2 * log8(n / 100) + 2
# payloads each way (one fingerprint level per round trip, then the item
# sets): 14 for ten million. Twice that ends a session that never converges.
MAX_ROUNDS = 32
# Ids found missing on either side in one session; a session holds each as
# a (timestamp, hash) pair (~150 bytes), so this bounds it to ~30 MB.
MAX_DIFFERENCES = 200_000

# Transfer: nwaku reads each frame up to DefaultMaxWakuMessageSize
# (150 KiB, waku_core/message/default_values.nim); the topic and field tags
# add at most MAX_TOPIC_LENGTH + 16 bytes to the largest message we accept.
TRANSFER_MAX_FRAME_SIZE = 1024 * 1024 + MAX_TOPIC_LENGTH + 16

_MAX_TIMESTAMP = (1 << 63) - 1
_MAX_VARINT_BYTES = 10


class RangeType(IntEnum):
    SKIP = 0
    FINGERPRINT = 1
    ITEM_SET = 2


@dataclass(frozen=True, slots=True)
class Range:
    """One range of a payload; its lower bound is the previous range's
    upper bound (the payload's ``lower`` for the first).

    ``upper`` is exclusive. ``fingerprint`` is set for FINGERPRINT,
    ``items`` (ascending, inside the range) and ``reconciled`` for ITEM_SET.
    """

    upper: SyncId
    type: RangeType
    fingerprint: bytes = b""
    items: tuple[SyncId, ...] = ()
    reconciled: bool = False


@dataclass(frozen=True, slots=True)
class RangesData:
    """A reconciliation payload; no ranges is the empty payload (end of session)."""

    pubsub_topics: tuple[str, ...] = ()
    content_topics: tuple[str, ...] = ()
    lower: SyncId = (0, ZERO_HASH)
    ranges: tuple[Range, ...] = ()

    @property
    def finished(self) -> bool:
        """True when nothing is left to reconcile (empty or all skipped)."""
        return all(r.type is RangeType.SKIP for r in self.ranges)

    def bounds(self) -> list[tuple[SyncId, SyncId]]:
        """(lower inclusive, upper exclusive) of each range, in order."""
        out = []
        lower = self.lower
        for r in self.ranges:
            out.append((lower, r.upper))
            lower = r.upper
        return out


EMPTY_PAYLOAD = b"\x00"


# --- reconciliation payload codec ---------------------------------------------


def encode_payload(payload: RangesData) -> bytes:
    """The wire bytes of ``payload``; raises SyncError for a payload that
    cannot be written (bounds not increasing, a bound the delta encoding
    cannot hold, items outside their range, content missing)."""
    if not payload.ranges:
        return EMPTY_PAYLOAD
    out = bytearray()
    for topics in (payload.pubsub_topics, payload.content_topics):
        out += encode_uvarint(len(topics))
        for topic in topics:
            raw = topic.encode()
            out += encode_uvarint(len(raw))
            out += raw
    lower_time, lower_hash = payload.lower
    if lower_hash != ZERO_HASH:
        raise SyncError("the first lower bound must have a zero hash (its hash is not encoded)")
    _check_time(lower_time)
    out += encode_uvarint(lower_time)
    previous = payload.lower
    for r in payload.ranges:
        time, hash_ = r.upper
        _check_time(time)
        if len(hash_) != HASH_SIZE or r.upper <= previous:
            raise SyncError("range bounds must be 32-byte hashes, strictly increasing")
        diff = time - previous[0]
        out += encode_uvarint(diff)
        if diff == 0:
            length = _prefix_length(previous[1], hash_)
            out.append(length)
            out += hash_[:length]
        elif hash_ != ZERO_HASH:
            raise SyncError("an upper bound after a time step must have a zero hash")
        out.append(r.type)
        if r.type is RangeType.FINGERPRINT:
            if len(r.fingerprint) != HASH_SIZE:
                raise SyncError("a fingerprint is 32 bytes")
            out += r.fingerprint
        elif r.type is RangeType.ITEM_SET:
            out += encode_uvarint(len(r.items))
            last_time = 0
            last: SyncId | None = None
            for item in r.items:
                item_time, item_hash = item
                if (
                    len(item_hash) != HASH_SIZE
                    or item < previous
                    or item >= r.upper
                    or (last is not None and item <= last)
                ):
                    raise SyncError("item set ids must be ascending 32-byte ids inside their range")
                out += encode_uvarint(item_time - last_time)
                out += item_hash
                last_time, last = item_time, item
            out.append(1 if r.reconciled else 0)
        previous = r.upper
    return bytes(out)


def decode_payload(
    raw: bytes,
    *,
    max_size: int = MAX_PAYLOAD_SIZE,
    max_ranges: int = MAX_RANGES,
    max_items: int = MAX_ITEMS,
) -> RangesData:
    """Decode one reconciliation payload; raises :class:`SyncError` for
    anything malformed or over a limit, and nothing else."""
    if len(raw) > max_size:
        raise SyncError(f"payload is {len(raw)} bytes, limit {max_size}")
    if len(raw) == 0 or raw == EMPTY_PAYLOAD:
        return RangesData()
    reader = _Reader(bytes(raw))
    pubsub_topics = reader.topics()
    content_topics = reader.topics()
    lower = (reader.timestamp(), ZERO_HASH)
    previous = lower
    ranges: list[Range] = []
    items_total = 0
    while not reader.at_end():
        if len(ranges) >= max_ranges:
            raise SyncError(f"more than {max_ranges} ranges")
        diff = reader.varint()
        time = previous[0] + diff
        if time > _MAX_TIMESTAMP:
            raise SyncError("range bound timestamp overflows 64 bits")
        if diff == 0:
            length = reader.byte()
            if not 0 < length <= HASH_SIZE:
                raise SyncError(f"hash prefix length {length} outside 1..32")
            upper = (time, reader.take(length) + bytes(HASH_SIZE - length))
        else:
            upper = (time, ZERO_HASH)
        if upper <= previous:
            raise SyncError("range bounds are not strictly increasing")
        kind = reader.byte()
        if kind == RangeType.SKIP:
            ranges.append(Range(upper, RangeType.SKIP))
        elif kind == RangeType.FINGERPRINT:
            ranges.append(Range(upper, RangeType.FINGERPRINT, fingerprint=reader.take(HASH_SIZE)))
        elif kind == RangeType.ITEM_SET:
            count = reader.varint()
            items_total += count
            if items_total > max_items:
                raise SyncError(f"more than {max_items} items")
            if count * (1 + HASH_SIZE) + 1 > reader.remaining():
                raise SyncError(f"item set of {count} ids longer than the payload")
            items = reader.items(count, previous, upper)
            reconciled = reader.byte()
            if reconciled > 1:
                raise SyncError(f"reconciled flag {reconciled} is not 0 or 1")
            ranges.append(Range(upper, RangeType.ITEM_SET, items=items, reconciled=bool(reconciled)))
        else:
            raise SyncError(f"unknown range type {kind}")
        previous = upper
    if not ranges:
        raise SyncError("payload has a header but no range")
    return RangesData(tuple(pubsub_topics), tuple(content_topics), lower, tuple(ranges))


# --- transfer codec -----------------------------------------------------------


def encode_transfer(pubsub_topic: str, message: WakuMessage) -> bytes:
    """One transfer frame's body, in nwaku's field numbering."""
    pb = sync_transfer_pb2.WakuMessageAndTopic()
    pb.pubsub_topic = pubsub_topic
    write_message_pb(pb.message, message)
    return pb.SerializeToString()


def decode_transfer(raw: bytes) -> tuple[str, WakuMessage, int]:
    """``(pubsub_topic, message, encoded message size)`` of one transfer
    frame's body, in nwaku's numbering or the spec's; SyncError otherwise."""
    if len(raw) > TRANSFER_MAX_FRAME_SIZE:
        raise SyncError(f"transfer message is {len(raw)} bytes, limit {TRANSFER_MAX_FRAME_SIZE}")
    kind: type[sync_transfer_pb2.WakuMessageAndTopic] | type[sync_transfer_pb2.SpecWakuMessageAndTopic]
    for kind in (sync_transfer_pb2.WakuMessageAndTopic, sync_transfer_pb2.SpecWakuMessageAndTopic):
        pb = parse_protobuf(kind, raw)
        if pb is not None and pb.HasField("message") and pb.HasField("pubsub_topic"):
            if not pb.pubsub_topic or len(pb.pubsub_topic) > MAX_TOPIC_LENGTH:
                raise SyncError("transfer message has an empty or overlong pubsub topic")
            return pb.pubsub_topic, message_from_pb(pb.message), nested_message_size(pb.message)
    raise SyncError("undecodable transfer message (WakuMessageAndTopic)")


# --- the local id set ---------------------------------------------------------


class IdSet:
    """An immutable sorted set of sync ids with O(log n) range fingerprints.

    Kept compact (8 + 32 + 32 bytes an id: timestamps in an array, hashes
    and prefix XORs in two byte strings), so half a million ids take
    ~36 MB.
    """

    def __init__(self, ids: Iterable[SyncId]):
        unique = sorted(set(ids))
        self._times = array("q", (t for t, _ in unique))
        self._hashes = b"".join(h for _, h in unique)
        prefix = bytearray(HASH_SIZE * (len(unique) + 1))
        acc = 0
        for i, (_, h) in enumerate(unique, start=1):
            acc ^= int.from_bytes(h, "big")
            prefix[i * HASH_SIZE : (i + 1) * HASH_SIZE] = acc.to_bytes(HASH_SIZE, "big")
        self._prefix = bytes(prefix)

    def __len__(self) -> int:
        return len(self._times)

    def __getitem__(self, i: int) -> SyncId:
        return self._times[i], self._hashes[i * HASH_SIZE : (i + 1) * HASH_SIZE]

    def __contains__(self, item: SyncId) -> bool:
        i = self.index(item)
        return i < len(self) and self[i] == item

    def index(self, bound: SyncId) -> int:
        """Index of the first id >= ``bound``."""
        time, hash_ = bound
        lo = bisect.bisect_left(self._times, time)
        if hash_ == ZERO_HASH:
            return lo
        hi = bisect.bisect_right(self._times, time, lo)
        while lo < hi:
            mid = (lo + hi) // 2
            if self._hashes[mid * HASH_SIZE : (mid + 1) * HASH_SIZE] < hash_:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def span(self, lower: SyncId, upper: SyncId) -> tuple[int, int]:
        """Index range [i, j) of the ids in [lower, upper)."""
        i = self.index(lower)
        return i, max(i, self.index(upper))

    def fingerprint(self, i: int, j: int) -> bytes:
        """XOR of the hashes of ids i..j-1."""
        a = int.from_bytes(self._prefix[i * HASH_SIZE : (i + 1) * HASH_SIZE], "big")
        b = int.from_bytes(self._prefix[j * HASH_SIZE : (j + 1) * HASH_SIZE], "big")
        return (a ^ b).to_bytes(HASH_SIZE, "big")

    def slice(self, i: int, j: int) -> tuple[SyncId, ...]:
        return tuple(self[k] for k in range(i, j))


def fingerprint_of(hashes: Iterable[bytes]) -> bytes:
    """The spec's fingerprint: XOR of 32-byte hashes."""
    acc = 0
    for h in hashes:
        acc ^= int.from_bytes(h, "big")
    return acc.to_bytes(HASH_SIZE, "big")


# --- the session state machine ------------------------------------------------


@dataclass(frozen=True, slots=True)
class Scope:
    """What a session reconciles: the topics both sides serve (empty: all)
    and the time window of the peer's first payload, in Unix ns
    (``upper_ns`` exclusive)."""

    pubsub_topics: tuple[str, ...]
    content_topics: tuple[str, ...]
    lower_ns: int
    upper_ns: int


@dataclass(frozen=True, slots=True)
class SessionLimits:
    max_rounds: int = MAX_ROUNDS
    max_differences: int = MAX_DIFFERENCES
    max_payload_size: int = MAX_PAYLOAD_SIZE
    max_ranges: int = MAX_RANGES
    max_items: int = MAX_ITEMS
    item_set_threshold: int = ITEM_SET_THRESHOLD
    partition_count: int = PARTITION_COUNT


@dataclass
class Session:
    """One side of a reconciliation session.

    Initiator: :meth:`initiate` gives the first payload; then for each
    payload received, :meth:`receive` decodes it and :meth:`answer` gives
    the reply to send, or None when there is nothing more to send.
    Responder: :meth:`receive` the first payload, :meth:`scope_of` it to
    know which ids to load (None: no common topic, answer
    :data:`EMPTY_PAYLOAD` and stop), set :attr:`ids`, then as above.
    :attr:`done` turns true when the session is over (either side sent the
    empty payload). :attr:`to_send` holds the ids the peer lacks,
    :attr:`to_receive` the ids it has and we lack (hash -> timestamp).

    ``floor_ns``: ranges ending at or before it are treated as skipped
    (the part of a peer's window older than what we reconcile).
    """

    pubsub_topics: tuple[str, ...] = ()
    content_topics: tuple[str, ...] = ()
    limits: SessionLimits = SessionLimits()
    ids: IdSet | None = None
    floor_ns: int = 0
    rounds: int = 0
    done: bool = False
    to_send: dict[bytes, int] = field(default_factory=dict)
    to_receive: dict[bytes, int] = field(default_factory=dict)

    def initiate(self, ids: IdSet, lower_ns: int, upper_ns: int) -> bytes:
        """The first payload: one fingerprint over [lower_ns, upper_ns)."""
        if not 0 <= lower_ns < upper_ns <= _MAX_TIMESTAMP:
            raise SyncError(f"bad sync window [{lower_ns}, {upper_ns})")
        self.ids = ids
        lower, upper = (lower_ns, ZERO_HASH), (upper_ns, ZERO_HASH)
        i, j = ids.span(lower, upper)
        payload = RangesData(
            self.pubsub_topics,
            self.content_topics,
            lower,
            (Range(upper, RangeType.FINGERPRINT, fingerprint=ids.fingerprint(i, j)),),
        )
        return encode_payload(payload)

    def receive(self, raw: bytes) -> RangesData:
        """Decode a payload from the peer, counting the round."""
        if self.done:
            raise SyncError("payload after the end of the session")
        self.rounds += 1
        if self.rounds > self.limits.max_rounds:
            raise SyncError(f"no agreement after {self.limits.max_rounds} rounds")
        payload = decode_payload(
            raw,
            max_size=self.limits.max_payload_size,
            max_ranges=self.limits.max_ranges,
            max_items=self.limits.max_items,
        )
        if payload.finished:
            self.done = True
        return payload

    def scope_of(self, payload: RangesData) -> Scope | None:
        """The topics and window a first payload asks about; None when the
        peer serves none of our topics (nwaku answers that with an empty
        payload)."""
        pubsub = _intersect(self.pubsub_topics, payload.pubsub_topics)
        content = _intersect(self.content_topics, payload.content_topics)
        if pubsub is None or content is None:
            return None
        self.pubsub_topics, self.content_topics = pubsub, content
        upper = payload.ranges[-1].upper if payload.ranges else payload.lower
        upper_ns = upper[0] + (1 if upper[1] != ZERO_HASH else 0)
        return Scope(pubsub, content, payload.lower[0], upper_ns)

    def answer(self, payload: RangesData) -> bytes | None:
        """The reply to ``payload`` (already received), or None when the
        peer ended the session. A reply of :data:`EMPTY_PAYLOAD` ends it
        from our side (:attr:`done` is then true)."""
        if payload.finished:
            self.done = True
            return None
        if self.ids is None:
            raise RuntimeError("the session's ids are not set")
        reply = self._process(payload)
        if not reply:
            self.done = True
            return EMPTY_PAYLOAD
        encoded = encode_payload(RangesData(self.pubsub_topics, self.content_topics, payload.lower, tuple(reply)))
        if len(encoded) > self.limits.max_payload_size:
            raise SyncError(f"reply would be {len(encoded)} bytes, limit {self.limits.max_payload_size}")
        return encoded

    # -- processing

    def _process(self, payload: RangesData) -> list[Range]:
        ids = self.ids
        assert ids is not None
        out: list[Range] = []
        items_out = 0
        for (lower, upper), theirs in zip(payload.bounds(), payload.ranges):
            if theirs.type is RangeType.SKIP or upper[0] <= self.floor_ns:
                out.append(Range(upper, RangeType.SKIP))
                continue
            i, j = ids.span(lower, upper)
            if theirs.type is RangeType.FINGERPRINT:
                if ids.fingerprint(i, j) == theirs.fingerprint:
                    out.append(Range(upper, RangeType.SKIP))
                else:
                    out.extend(self._split(lower, upper, i, j))
            else:
                ours = ids.slice(i, j)
                self._difference(ours, theirs.items)
                if theirs.reconciled:
                    out.append(Range(upper, RangeType.SKIP))
                else:
                    out.append(Range(upper, RangeType.ITEM_SET, items=ours, reconciled=True))
            if len(out) > self.limits.max_ranges:
                raise SyncError(f"reply would hold more than {self.limits.max_ranges} ranges")
            items_out += len(out[-1].items)
            if items_out > self.limits.max_items:
                raise SyncError(f"reply would hold more than {self.limits.max_items} items")
        merged: list[Range] = []
        for r in out:
            # A skip followed by a skip: the first one's bound is implied.
            if merged and merged[-1].type is RangeType.SKIP and r.type is RangeType.SKIP:
                merged[-1] = r
            else:
                merged.append(r)
        if all(r.type is RangeType.SKIP for r in merged):
            return []
        return merged

    def _split(self, lower: SyncId, upper: SyncId, i: int, j: int) -> list[Range]:
        """Our answer to a fingerprint that differs from ours over [lower, upper)."""
        ids = self.ids
        assert ids is not None
        threshold = self.limits.item_set_threshold
        if j - i == 0:
            # We hold nothing there: the peer sends all it has.
            return [Range(upper, RangeType.ITEM_SET, reconciled=True)]
        width = upper[0] - lower[0]
        parts = min(self.limits.partition_count, width)
        if j - i <= threshold or parts < 2:
            # Small enough, or one timestamp wide (time cannot split it).
            return [Range(upper, RangeType.ITEM_SET, items=ids.slice(i, j))]
        out = []
        step, remainder = divmod(width, parts)
        bound = lower[0]
        part_lower = lower
        for k in range(parts):
            bound += step + (1 if k < remainder else 0)
            part_upper = upper if k == parts - 1 else (bound, ZERO_HASH)
            a, b = ids.span(part_lower, part_upper)
            if b - a == 0:
                out.append(Range(part_upper, RangeType.ITEM_SET, reconciled=True))
            elif b - a <= threshold:
                out.append(Range(part_upper, RangeType.ITEM_SET, items=ids.slice(a, b)))
            else:
                out.append(Range(part_upper, RangeType.FINGERPRINT, fingerprint=ids.fingerprint(a, b)))
            part_lower = part_upper
        return out

    def _difference(self, ours: Sequence[SyncId], theirs: Sequence[SyncId]) -> None:
        mine, their_set = set(ours), set(theirs)
        for t, h in mine - their_set:
            self.to_send[h] = t
        for t, h in their_set - mine:
            self.to_receive[h] = t
        if len(self.to_send) + len(self.to_receive) > self.limits.max_differences:
            raise SyncError(f"more than {self.limits.max_differences} differences in one session")


def _intersect(ours: tuple[str, ...], theirs: tuple[str, ...]) -> tuple[str, ...] | None:
    """The smallest topic scope both accept (empty: every topic); None when
    both list topics and share none."""
    if ours and theirs:
        common = tuple(t for t in ours if t in set(theirs))
        return common or None
    return ours or theirs


# --- private helpers ----------------------------------------------------------


def _check_time(time: int) -> None:
    if not 0 <= time <= _MAX_TIMESTAMP:
        raise SyncError(f"timestamp {time} outside 0..2^63-1")


def _prefix_length(previous: bytes, hash_: bytes) -> int:
    """Bytes of ``hash_`` to write after a zero time step: up to and
    including the first byte differing from ``previous`` (the spec), and
    never fewer than hold its last non-zero byte (so it reads back exact)."""
    first_diff = next((k for k in range(HASH_SIZE) if previous[k] != hash_[k]), HASH_SIZE - 1)
    last_nonzero = len(hash_.rstrip(b"\x00"))
    return max(first_diff + 1, last_nonzero)


class _Reader:
    """Bounded cursor over a payload; every read raises SyncError past the end."""

    def __init__(self, data: bytes):
        self.data = data
        self.pos = 0

    def at_end(self) -> bool:
        return self.pos >= len(self.data)

    def remaining(self) -> int:
        return len(self.data) - self.pos

    def byte(self) -> int:
        if self.pos >= len(self.data):
            raise SyncError("payload ends early")
        value = self.data[self.pos]
        self.pos += 1
        return value

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise SyncError("payload ends early")
        value = self.data[self.pos : self.pos + n]
        self.pos += n
        return value

    def varint(self) -> int:
        value = 0
        for shift_index in range(_MAX_VARINT_BYTES):
            byte = self.byte()
            value |= (byte & 0x7F) << (7 * shift_index)
            if not byte & 0x80:
                if byte == 0 and shift_index > 0:
                    raise SyncError("varint not minimally encoded")
                if value >= 1 << 64:
                    raise SyncError("varint overflows 64 bits")
                return value
        raise SyncError(f"varint longer than {_MAX_VARINT_BYTES} bytes")

    def timestamp(self) -> int:
        value = self.varint()
        if value > _MAX_TIMESTAMP:
            raise SyncError("timestamp overflows a signed 64-bit integer")
        return value

    def topics(self) -> list[str]:
        count = self.varint()
        if count > MAX_TOPICS:
            raise SyncError(f"{count} topics, limit {MAX_TOPICS}")
        topics = []
        for _ in range(count):
            length = self.varint()
            if length > MAX_TOPIC_LENGTH:
                raise SyncError(f"topic of {length} bytes, limit {MAX_TOPIC_LENGTH}")
            try:
                topics.append(self.take(length).decode())
            except UnicodeDecodeError:
                raise SyncError("topic is not UTF-8") from None
        return topics

    def items(self, count: int, lower: SyncId, upper: SyncId) -> tuple[SyncId, ...]:
        items = []
        time = 0
        previous: SyncId | None = None
        for _ in range(count):
            time += self.varint()
            if time > _MAX_TIMESTAMP:
                raise SyncError("item timestamp overflows 64 bits")
            item = (time, self.take(HASH_SIZE))
            if previous is not None and item <= previous:
                raise SyncError("item set ids are not strictly ascending")
            if item < lower or item >= upper:
                raise SyncError("item set id outside its range")
            items.append(item)
            previous = item
        return tuple(items)
