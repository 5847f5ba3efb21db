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
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Iterator
from dataclasses import dataclass, field

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

NS_PER_HOUR = 3_600 * 1_000_000_000
NS_PER_DAY = 24 * NS_PER_HOUR


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
        return bisect.bisect_left(self._cum_weights, rng.random() * self._cum_weights[-1])

    def slot_time_ns(self, slot: int) -> int:
        """The nominal time of ``slot`` (jitter aside), in [start_ns, end_ns)."""
        span = self.end_ns - self.start_ns
        return self.start_ns + (2 * slot + 1) * span // (2 * self.messages)


def _rng(spec: DatasetSpec, slot: int) -> random.Random:
    return random.Random((spec.seed << 40) ^ slot)


def original_slot(spec: DatasetSpec, slot: int) -> int:
    """The slot whose message ``slot`` carries (itself unless it is a re-send)."""
    while slot > 0:
        rng = _rng(spec, slot)
        if rng.random() >= spec.duplicate_ratio:
            return slot
        if rng.random() < FAR_DUPLICATE_SHARE:
            slot = rng.randrange(slot)
        else:
            slot -= rng.randint(1, min(slot, NEAR_DUPLICATE_WINDOW))
    return 0


def is_duplicate(spec: DatasetSpec, slot: int) -> bool:
    return original_slot(spec, slot) != slot


def message_at(spec: DatasetSpec, slot: int) -> tuple[str, WakuMessage]:
    """``(pubsub_topic, message)`` of the original message of ``slot``."""
    slot = original_slot(spec, slot)
    rng = _rng(spec, slot)
    rng.random()  # the duplicate draw of original_slot
    topic = spec.pick_topic(rng)
    timestamp = spec.slot_time_ns(slot) + rng.randint(-JITTER_NS, JITTER_NS)
    timestamp = min(max(timestamp, spec.start_ns), spec.end_ns - 1)
    payload = rng.randbytes(rng.randint(PAYLOAD_MIN, PAYLOAD_MAX))
    meta = rng.randbytes(rng.randint(META_MIN, META_MAX)) if rng.random() < META_RATIO else b""
    version = 1 if rng.random() < 0.1 else 0
    message = WakuMessage(
        payload=payload, content_topic=spec.content_topic(topic), version=version,
        timestamp=timestamp, meta=meta,
    )
    return spec.pubsub_of(topic), message


def stream(spec: DatasetSpec, batch_size: int) -> Iterator[list[tuple[str, WakuMessage, int]]]:
    """The whole dataset in slot order as ``(pubsub_topic, message, arrival_ns)``
    batches of ``batch_size``; a re-send arrives at its own slot's time."""
    batch: list[tuple[str, WakuMessage, int]] = []
    for slot in range(spec.messages):
        pubsub, message = message_at(spec, slot)
        batch.append((pubsub, message, max(spec.slot_time_ns(slot), message.timestamp)))
        if len(batch) >= batch_size:
            yield batch
            batch = []
    if batch:
        yield batch


def sample_originals(spec: DatasetSpec, rng: random.Random, count: int) -> list[tuple[str, WakuMessage]]:
    """``count`` distinct stored messages picked at random (for lookups by hash)."""
    slots: set[int] = set()
    out = []
    attempts = 0
    while len(out) < count and attempts < count * 20:
        attempts += 1
        slot = original_slot(spec, rng.randrange(spec.messages))
        if slot in slots:
            continue
        slots.add(slot)
        out.append(message_at(spec, slot))
    return out
