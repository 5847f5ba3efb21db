"""The storage benchmark's dataset: seeded, deterministic, streamed.

Every slot ``i`` of the stream is a pure function of ``(seed, i)``, so the
same messages can be produced again for each backend (and any one of them
looked up by index) without keeping the dataset in memory.

Shape (what a busy node on one cluster sees over its retention window):
``topics`` content topics with Zipf-like popularity (the busiest ~13 %,
most of them rare), each on one of ``shards`` shards of cluster 16
(``/waku/2/rs/16/<shard>``); timestamps spread evenly over ``days`` days
ending at ``end_ns`` in slot order (small jitter, as relay delivers them);
payloads of 100 B to 2 KiB of random bytes; meta on about a third of the
messages; ``duplicate_ratio`` of the slots are exact re-sends of an
earlier message (same bytes, same MUID and hash), most within a few
hundred slots of the original (relay), some from anywhere earlier
(a peer re-publishing, store sync).

Generation is columnar (numpy over a batch of slots): a slot's random
draws are a counter-based hash of ``(seed, slot, draw)``, and its payload
is the slot number followed by a slice of a seeded random pool, so the
benchmark spends ~2 us a message making its input (a per-slot
``random.Random`` took ~40 us, more than the node's whole budget at
50k msg/s) and every original has its own MUID. :func:`originals_fingerprint`
gives the count and an order-independent fingerprint of the originals'
message hashes, which the table must match.
"""

from __future__ import annotations

import hashlib
import json
import random
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from wakustore.protocols.message import WakuMessage

CLUSTER_ID = 16
PAYLOAD_MIN = 100
PAYLOAD_MAX = 2048
META_RATIO = 0.3
META_MIN = 8
META_MAX = 64
# Near re-sends fall within this many slots of the original.
NEAR_DUPLICATE_WINDOW = 300
FAR_DUPLICATE_SHARE = 0.2
# Sender clocks and relay delays: a message's timestamp is its slot time
# plus up to this much either way.
JITTER_NS = 2_000_000_000
VERSION_1_RATIO = 0.1
# Payload and meta bytes are slices of this seeded pool, after the
# 8-byte slot number that makes each original's payload (and MUID) unique.
POOL_BYTES = 4 * 1024 * 1024
_SLOT_PREFIX = 8

NS_PER_HOUR = 3_600 * 1_000_000_000
NS_PER_DAY = 24 * NS_PER_HOUR

# The draws of one slot, by index.
_DUP, _FAR, _FAR_AT, _NEAR_BY, _TOPIC, _JITTER, _PAYLOAD_LEN, _PAYLOAD_AT, _HAS_META, _META_LEN, _META_AT, _VERSION = (
    range(12)
)
_DRAWS = 16

_U64 = np.uint64
_GOLDEN = _U64(0x9E3779B97F4A7C15)
_MIX1 = _U64(0xBF58476D1CE4E5B9)
_MIX2 = _U64(0x94D049BB133111EB)


@dataclass(frozen=True)
class DatasetSpec:
    """What to generate; ``end_ns`` fixes "now" so every pass is identical."""

    messages: int
    end_ns: int
    seed: int = 1
    topics: int = 1000
    shards: int = 8
    days: int = 30
    duplicate_ratio: float = 0.1
    _cum_weights: list[float] = field(default_factory=list, init=False, repr=False, compare=False)
    _cache: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.messages <= 0 or self.topics <= 0 or self.shards <= 0 or self.days <= 0:
            raise ValueError("messages, topics, shards and days must be positive")
        total = 0.0
        for rank in range(self.topics):
            total += 1.0 / (rank + 1)
            self._cum_weights.append(total)

    @property
    def start_ns(self) -> int:
        return self.end_ns - self.days * NS_PER_DAY

    def content_topic(self, topic: int) -> str:
        return f"/bench/1/topic-{topic:04d}/proto"

    def shard_of(self, topic: int) -> int:
        return topic % self.shards

    def pubsub_topic(self, shard: int) -> str:
        return f"/waku/2/rs/{CLUSTER_ID}/{shard}"

    def pubsub_of(self, topic: int) -> str:
        return self.pubsub_topic(self.shard_of(topic))

    def popularity(self, topic: int) -> float:
        """The share of messages on ``topic`` (0..1)."""
        return (1.0 / (topic + 1)) / self._cum_weights[-1]

    def pick_topic(self, rng: random.Random) -> int:
        """A topic drawn by popularity (queries go where the data is)."""
        return min(int(np.searchsorted(self._weights(), rng.random() * self._cum_weights[-1])), self.topics - 1)

    def slot_time_ns(self, slot: int) -> int:
        """The nominal time of ``slot`` (jitter aside), in [start_ns, end_ns)."""
        span = self.end_ns - self.start_ns
        return self.start_ns + (2 * slot + 1) * span // (2 * self.messages)

    # --- columnar helpers (cached per spec) ---------------------------------

    def _weights(self) -> np.ndarray:
        weights = self._cache.get("weights")
        if weights is None:
            weights = self._cache["weights"] = np.array(self._cum_weights)
        return weights

    def _pool(self) -> bytes:
        pool = self._cache.get("pool")
        if pool is None:
            pool = self._cache["pool"] = np.random.default_rng(self.seed).bytes(POOL_BYTES)
        return pool

    def _topic_names(self) -> tuple[list[str], list[str]]:
        names = self._cache.get("names")
        if names is None:
            names = self._cache["names"] = (
                [self.pubsub_of(t) for t in range(self.topics)],
                [self.content_topic(t) for t in range(self.topics)],
            )
        return names

    def _slot_times(self, slots: np.ndarray) -> np.ndarray:
        """:meth:`slot_time_ns` of each slot, exact in 64-bit integers."""
        span = self.end_ns - self.start_ns
        quotient, remainder = divmod(span, 2 * self.messages)
        odd = 2 * slots.astype(np.int64) + 1
        return self.start_ns + odd * quotient + (odd * remainder) // (2 * self.messages)


def _draws(spec: DatasetSpec, slots: np.ndarray) -> np.ndarray:
    """Uniform draws in [0, 1), ``_DRAWS`` per slot: splitmix64 of
    (seed, slot, draw), counter-based so any slot is reached directly."""
    base = ((_U64(spec.seed) << _U64(40)) ^ slots.astype(_U64)) * _U64(_DRAWS)
    with np.errstate(over="ignore"):
        x = base[:, None] + np.arange(_DRAWS, dtype=_U64)[None, :] + _GOLDEN
        x = (x ^ (x >> _U64(30))) * _MIX1
        x = (x ^ (x >> _U64(27))) * _MIX2
        x = x ^ (x >> _U64(31))
    return (x >> _U64(11)).astype(np.float64) * (1.0 / (1 << 53))


def original_slots(spec: DatasetSpec, slots: np.ndarray) -> np.ndarray:
    """The slot whose message each slot carries (itself unless it is a re-send)."""
    out = np.asarray(slots, dtype=np.int64).copy()
    todo = np.flatnonzero(out > 0)
    while len(todo):
        current = out[todo]
        draws = _draws(spec, current)
        resent = draws[:, _DUP] < spec.duplicate_ratio
        todo, current, draws = todo[resent], current[resent], draws[resent]
        far = draws[:, _FAR] < FAR_DUPLICATE_SHARE
        near = current - 1 - np.floor(draws[:, _NEAR_BY] * np.minimum(current, NEAR_DUPLICATE_WINDOW)).astype(np.int64)
        earlier = np.floor(draws[:, _FAR_AT] * current).astype(np.int64)
        out[todo] = np.where(far, earlier, near)
        todo = todo[out[todo] > 0]
    return out


def original_slot(spec: DatasetSpec, slot: int) -> int:
    return int(original_slots(spec, np.array([slot]))[0])


def is_duplicate(spec: DatasetSpec, slot: int) -> bool:
    return original_slot(spec, slot) != slot


def _messages(spec: DatasetSpec, originals: np.ndarray) -> tuple[list[str], list[WakuMessage]]:
    """``(pubsub topics, messages)`` of original slots, built a column at a time."""
    draws = _draws(spec, originals)
    topics = np.minimum(np.searchsorted(spec._weights(), draws[:, _TOPIC] * spec._cum_weights[-1]), spec.topics - 1)
    jitter = np.floor(draws[:, _JITTER] * (2 * JITTER_NS + 1)).astype(np.int64) - JITTER_NS
    timestamps = np.clip(spec._slot_times(originals) + jitter, spec.start_ns, spec.end_ns - 1)
    payload_len = PAYLOAD_MIN + np.floor(draws[:, _PAYLOAD_LEN] * (PAYLOAD_MAX - PAYLOAD_MIN + 1)).astype(np.int64)
    payload_at = np.floor(draws[:, _PAYLOAD_AT] * (POOL_BYTES - PAYLOAD_MAX)).astype(np.int64)
    meta_len = np.where(
        draws[:, _HAS_META] < META_RATIO,
        META_MIN + np.floor(draws[:, _META_LEN] * (META_MAX - META_MIN + 1)).astype(np.int64),
        0,
    )
    meta_at = np.floor(draws[:, _META_AT] * (POOL_BYTES - META_MAX)).astype(np.int64)
    versions = (draws[:, _VERSION] < VERSION_1_RATIO).astype(np.int64)
    prefixes = originals.astype(">u8").tobytes()
    pool = spec._pool()
    pubsubs, contents = spec._topic_names()
    topic_list = topics.tolist()
    body_len = (payload_len - _SLOT_PREFIX).tolist()
    messages = [
        WakuMessage(
            prefixes[8 * i : 8 * i + 8] + pool[p : p + length], contents[t], v, ts, pool[m : m + ml] if ml else b""
        )
        for i, (t, ts, p, length, m, ml, v) in enumerate(
            zip(
                topic_list,
                timestamps.tolist(),
                payload_at.tolist(),
                body_len,
                meta_at.tolist(),
                meta_len.tolist(),
                versions.tolist(),
            )
        )
    ]
    return [pubsubs[t] for t in topic_list], messages


def message_at(spec: DatasetSpec, slot: int) -> tuple[str, WakuMessage]:
    """``(pubsub_topic, message)`` of the original message of ``slot``."""
    pubsubs, messages = _messages(spec, np.array([original_slot(spec, slot)], dtype=np.int64))
    return pubsubs[0], messages[0]


def _batch(spec: DatasetSpec, start: int, stop: int) -> tuple[np.ndarray, list[str], list[WakuMessage]]:
    slots = np.arange(start, stop, dtype=np.int64)
    originals = original_slots(spec, slots)
    # Each original is built once a batch, re-sends within the batch share it.
    unique, inverse = np.unique(originals, return_inverse=True)
    pubsubs, messages = _messages(spec, unique)
    picks = inverse.tolist()
    return slots, [pubsubs[i] for i in picks], [messages[i] for i in picks]


def stream(spec: DatasetSpec, batch_size: int) -> Iterator[list[tuple[str, WakuMessage, int]]]:
    """The whole dataset in slot order as ``(pubsub_topic, message, arrival_ns)``
    batches of ``batch_size``; a re-send arrives at its own slot's time."""
    for start in range(0, spec.messages, batch_size):
        stop = min(start + batch_size, spec.messages)
        slots, pubsubs, messages = _batch(spec, start, stop)
        nominal = spec._slot_times(slots).tolist()
        yield [(p, m, a if a > m.timestamp else m.timestamp) for p, m, a in zip(pubsubs, messages, nominal)]


@dataclass(frozen=True, slots=True)
class Fingerprint:
    """Count and order-independent fingerprint of a set of message hashes:
    the xor and the sum (mod 2^64) of their first 8 bytes, big-endian."""

    count: int
    xor: int
    total: int

    @classmethod
    def of_prefixes(cls, prefixes: np.ndarray) -> Fingerprint:
        prefixes = prefixes.astype(_U64)
        xor = int(np.bitwise_xor.reduce(prefixes)) if len(prefixes) else 0
        with np.errstate(over="ignore"):
            total = int(prefixes.sum(dtype=_U64)) if len(prefixes) else 0
        return cls(len(prefixes), xor, total)

    def __add__(self, other: Fingerprint) -> Fingerprint:
        return Fingerprint(self.count + other.count, self.xor ^ other.xor, (self.total + other.total) % (1 << 64))


def originals_fingerprint(spec: DatasetSpec, batch_size: int = 50_000) -> Fingerprint:
    """The dataset's distinct messages (its original slots): how many, and
    the :class:`Fingerprint` of their message hashes. What the table must hold."""
    out = Fingerprint(0, 0, 0)
    for start in range(0, spec.messages, batch_size):
        slots = np.arange(start, min(start + batch_size, spec.messages), dtype=np.int64)
        originals = slots[original_slots(spec, slots) == slots]
        pubsubs, messages = _messages(spec, originals)
        prefixes = np.frombuffer(b"".join(_hash_prefix(p, m) for p, m in zip(pubsubs, messages)), dtype=">u8")
        out = out + Fingerprint.of_prefixes(prefixes)
    return out


_TIMESTAMP = struct.Struct(">q")


def _hash_prefix(pubsub_topic: str, message: WakuMessage) -> bytes:
    # protocols.message.message_hash, first 8 bytes.
    return hashlib.sha256(
        b"".join(
            (
                pubsub_topic.encode(),
                message.payload,
                message.content_topic.encode(),
                message.meta,
                _TIMESTAMP.pack(message.timestamp),
            )
        )
    ).digest()[:8]


SPEC_FILE = "bench-dataset.json"


def save_spec(spec: DatasetSpec, data_dir: Path) -> None:
    """Record the dataset a benchmark loads into ``data_dir`` (beside its table)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    fields = {
        "messages": spec.messages,
        "end_ns": spec.end_ns,
        "seed": spec.seed,
        "topics": spec.topics,
        "shards": spec.shards,
        "days": spec.days,
        "duplicate_ratio": spec.duplicate_ratio,
    }
    (data_dir / SPEC_FILE).write_text(json.dumps(fields) + "\n")


def load_spec(data_dir: Path) -> DatasetSpec | None:
    """The dataset :func:`save_spec` recorded in ``data_dir``; None when there is none."""
    try:
        return DatasetSpec(**json.loads((data_dir / SPEC_FILE).read_text()))
    except FileNotFoundError:
        return None


def sample_originals(
    spec: DatasetSpec, rng: random.Random, count: int, among: range | None = None
) -> list[tuple[str, WakuMessage]]:
    """``count`` distinct stored messages picked at random (for lookups by
    hash), of the slots ``among`` (default all)."""
    among = range(spec.messages) if among is None else among
    slots: set[int] = set()
    out: list[tuple[str, WakuMessage]] = []
    attempts = 0
    while len(out) < count and attempts < count * 20:
        attempts += 1
        slot = original_slot(spec, among.start + rng.randrange(len(among)))
        if slot in slots:
            continue
        slots.add(slot)
        out.append(message_at(spec, slot))
    return out
