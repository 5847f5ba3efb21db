"""The Store traffic of status-go clients, as ``bench wire --mix status-go`` replays it.

Shapes, from status-go's code (``protocol/messenger_*``, ``wakuv2/``):

- ``presence/50``: ``message_sent_check.go`` asks every 3 s, per client,
  whether up to 50 hashes it sent are stored (``include_data=false``, no
  pubsub topic, page size the number of hashes). Its hashes here are those
  of messages of the dataset's last hour (what was just sent), a tenth of
  them not stored (a send that did not arrive: what the check is for, and
  what sends the lookup past the hot tier to the table's index).
- ``backfill-keys/100``: ``hash_first_backfill.go`` pages a time range's
  metadata by 100, ``include_data=false``, over up to 10 content topics of
  one shard (a day anywhere in the data); its cursor page follows.
- ``backfill-bodies/50``: the same backfill then fetches the bodies by
  hash in batches of 50 (``include_data=true``): 50 stored messages of one
  day.
- ``history/24h``: a chat's history, 24-hour backward pages of 50 over up
  to 10 content topics of one shard (``StoreNodeRequestManager``), the
  cursor page following.
- ``community/31d``: a community's description, the newest single message
  of its content topic over 31 days (``requestCommunityInfoFromMailserver``).

Proportions (:data:`SHARES`): status-go's intervals, not measured traffic.
While a client has unconfirmed sends it checks every 3 s (20 a minute);
history and backfill requests come when a chat is opened or the client
comes back online, community descriptions when one is visited. Half of
the queries are presence checks, a fifth history pages, a quarter the two
backfill steps, one in twenty a community fetch.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass

from wakustore.bench import dataset as bench_dataset
from wakustore.bench.dataset import NS_PER_DAY, DatasetSpec
from wakustore.protocols.store_query import HistoryQuery, validate_v3

# (shape, share of the queries): see the module.
SHARES = (
    ("presence/50", 0.50),
    ("backfill-keys/100", 0.15),
    ("backfill-bodies/50", 0.10),
    ("history/24h", 0.20),
    ("community/31d", 0.05),
)
PRESENCE_HASHES = 50
PRESENCE_UNSTORED = 0.1
BACKFILL_PAGE = 100
BODIES_BATCH = 50
HISTORY_PAGE = 50
MAX_TOPICS = 10
HOUR_NS = NS_PER_DAY // 24


@dataclass(frozen=True, slots=True)
class MixQuery:
    """One status-go query (the interface of bench.store.PageSpec: a
    shape name, and the query at a cursor)."""

    range_name: str
    pubsub_topic: str | None
    content_topics: tuple[str, ...] = ()
    time_start: int | None = None
    time_end: int | None = None
    message_hashes: tuple[bytes, ...] = ()
    limit: int = 20
    include_data: bool = True
    forward: bool = False

    def query(self, cursor: bytes | None = None) -> HistoryQuery:
        return validate_v3(
            pubsub_topic=self.pubsub_topic,
            content_topics=list(self.content_topics),
            time_start=self.time_start,
            time_end=self.time_end,
            message_hashes=list(self.message_hashes),
            cursor=cursor,
            forward=self.forward,
            limit=self.limit,
            include_data=self.include_data,
        )


def mix_specs(spec: DatasetSpec, seed: int) -> Iterator[MixQuery]:
    """An endless deterministic stream of status-go queries in :data:`SHARES`."""
    rng = random.Random(seed)
    names = [name for name, _ in SHARES]
    weights = [share for _, share in SHARES]
    while True:
        yield _make(rng.choices(names, weights)[0], spec, rng)


def _make(name: str, spec: DatasetSpec, rng: random.Random) -> MixQuery:
    if name == "presence/50":
        # The last hour's messages (at least enough to pick from).
        recent = max(4 * PRESENCE_HASHES, spec.messages * HOUR_NS // (spec.end_ns - spec.start_ns))
        hashes = _hashes(spec, rng, PRESENCE_HASHES, max(0, spec.messages - recent), spec.messages)
        unstored = int(PRESENCE_HASHES * PRESENCE_UNSTORED)
        hashes[:unstored] = [rng.randbytes(32) for _ in range(unstored)]
        return MixQuery(name, None, message_hashes=tuple(hashes), limit=PRESENCE_HASHES, include_data=False)
    if name == "backfill-bodies/50":
        day = max(4 * BODIES_BATCH, spec.messages * NS_PER_DAY // (spec.end_ns - spec.start_ns))
        first = rng.randrange(max(1, spec.messages - day))
        hashes = _hashes(spec, rng, BODIES_BATCH, first, first + day)
        return MixQuery(name, None, message_hashes=tuple(hashes), limit=BODIES_BATCH)
    pubsub, topics = _topics(spec, rng, 1 if name == "community/31d" else rng.randint(1, MAX_TOPICS))
    if name == "community/31d":
        return MixQuery(name, pubsub, topics, spec.end_ns - 31 * NS_PER_DAY, spec.end_ns, limit=1)
    end = rng.randint(min(spec.start_ns + NS_PER_DAY, spec.end_ns), spec.end_ns)
    if name == "backfill-keys/100":
        return MixQuery(name, pubsub, topics, end - NS_PER_DAY, end, limit=BACKFILL_PAGE, include_data=False)
    return MixQuery(name, pubsub, topics, end - NS_PER_DAY, end, limit=HISTORY_PAGE)


def _hashes(spec: DatasetSpec, rng: random.Random, count: int, first: int, stop: int) -> list[bytes]:
    from wakustore.protocols.message import message_hash

    picked = bench_dataset.sample_originals(spec, rng, count, range(first, max(first + 1, stop)))
    return [message_hash(p, m) for p, m in picked]


def _topics(spec: DatasetSpec, rng: random.Random, wanted: int) -> tuple[str, tuple[str, ...]]:
    """Up to ``wanted`` content topics of one shard, drawn by popularity."""
    first = spec.pick_topic(rng)
    shard = spec.shard_of(first)
    topics = [first]
    for _ in range(20 * wanted):
        if len(topics) >= wanted:
            break
        other = spec.pick_topic(rng)
        if spec.shard_of(other) == shard and other not in topics:
            topics.append(other)
    return spec.pubsub_topic(shard), tuple(spec.content_topic(t) for t in topics)
