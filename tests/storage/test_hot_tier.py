"""The hot tier answers exactly what the table answers, or defers to it."""

import dataclasses
import random
import time

import pytest

from wakustore.protocols.message import WakuMessage, message_hash
from wakustore.protocols.store_query import validate_v3
from wakustore.storage.hot_tier import HotTier
from wakustore.storage.message_store import MessageStore, StoreConfig
from wakustore.storage.rows import Row
from wakustore.storage.table import DeltaTableRef

PUBSUB = "/waku/2/rs/16/32"
TOPICS = ["/app/1/a/proto", "/app/1/b/proto", "/app/1/c/proto"]
SECOND = 10**9


def _messages(now_ns, count, seed):
    rng = random.Random(seed)
    out = []
    for i in range(count):
        # Many equal timestamps, so ordering by hash within a timestamp matters.
        ts = now_ns - rng.randrange(0, 600) * SECOND
        out.append(WakuMessage(payload=b"m%d-%d" % (seed, i), content_topic=rng.choice(TOPICS), timestamp=ts))
    return out


def _query(**kw):
    base = dict(pubsub_topic=PUBSUB, content_topics=TOPICS[:2], time_start=None, time_end=None,
                message_hashes=[], cursor=None, forward=True, limit=None, include_data=True)
    base.update(kw)
    return validate_v3(**base)


def _walk(store, query, max_pages=50):
    pages, cursor = [], None
    for _ in range(max_pages):
        page = store.query(dataclasses.replace(query, cursor=cursor))
        pages.append([m.message_hash for m in page.messages])
        if page.next_cursor is None:
            break
        cursor = page.next_cursor.message_hash
    return pages


@pytest.fixture(scope="module")
def pair(engine, tmp_path_factory):
    """The same 400 recent messages in a store with the hot tier and one without."""
    base = tmp_path_factory.mktemp("hot")
    now = time.time_ns()
    messages = _messages(now, 400, seed=1)
    hot = MessageStore(DeltaTableRef(engine, str(base / "hot")), base / "wal-hot")
    cold = MessageStore(DeltaTableRef(engine, str(base / "cold")), base / "wal-cold", StoreConfig(hot_tier_bytes=0))
    for store in (hot, cold):
        store.open()
        store.put([(PUBSUB, m, now) for m in messages[:300]])
        store.flush()
        store.put([(PUBSUB, m, now) for m in messages[300:]])  # partly uncommitted
    yield hot, cold, now, messages
    hot.close()
    cold.close()


def test_hot_tier_holds_the_recent_messages(pair):
    hot, cold, _, messages = pair
    assert len(hot.hot) == len(messages)
    assert len(cold.hot) == 0


def test_hot_and_table_answers_are_identical_for_random_queries(pair, monkeypatch):
    hot, cold, now, messages = pair
    calls = []
    original = hot.table.page
    monkeypatch.setattr(hot.table, "page", lambda *a, **k: calls.append(1) or original(*a, **k))
    rng = random.Random(7)
    for _ in range(40):
        kw = dict(forward=rng.random() < 0.5, limit=rng.choice([1, 5, 20, 100]),
                  content_topics=rng.sample(TOPICS, rng.randint(1, 3)), include_data=rng.random() < 0.8)
        if rng.random() < 0.5:
            kw["time_start"] = now - rng.randrange(0, 700) * SECOND
        if rng.random() < 0.5:
            kw["time_end"] = now - rng.randrange(0, 300) * SECOND
        if kw.get("time_start") and kw.get("time_end") and kw["time_start"] > kw["time_end"]:
            kw["time_start"], kw["time_end"] = kw["time_end"], kw["time_start"]
        query = _query(**kw)
        assert _walk(hot, query) == _walk(cold, query), kw
    assert calls == []  # every page came from memory


def test_hash_lookups_match(pair):
    hot, cold, _, messages = pair
    wanted = [message_hash(PUBSUB, m) for m in messages[::7]][:100]
    query = _query(pubsub_topic=PUBSUB, content_topics=[], message_hashes=wanted, limit=100)
    assert _walk(hot, query) == _walk(cold, query)


def test_queries_reaching_before_the_tier_go_to_the_table(pair):
    hot, cold, now, _ = pair
    old = WakuMessage(payload=b"old", content_topic=TOPICS[0], timestamp=now - 3 * 86_400 * SECOND)
    for store in (hot, cold):
        store.put([(PUBSUB, old, now)])
        store.flush()
    query = _query(content_topics=[TOPICS[0]], limit=100)
    assert _walk(hot, query) == _walk(cold, query)
    assert _walk(hot, query)[0][0] == message_hash(PUBSUB, old)


def _row(ts, i, topic=TOPICS[0]):
    return Row.build(PUBSUB, WakuMessage(payload=b"%d" % i, content_topic=topic, timestamp=ts), ts)


def test_eviction_advances_the_complete_region():
    tier = HotTier(max_bytes=10 * 940, window_ns=10**12)  # rows here cost ~932 bytes
    now = 10**15
    tier.start(now - 100, [], now)
    tier.add([_row(now - 50 + i, i) for i in range(20)], now)
    assert len(tier) <= 10
    assert tier.start_ns > now - 50
    assert all(ts >= tier.start_ns for ts, _ in tier._order)
    # A forward query from before the complete region is not answered from memory.
    assert tier.page(_query(content_topics=[TOPICS[0]], time_start=now - 60), None) is None


def test_window_replacement_is_mirrored():
    tier = HotTier(max_bytes=10**9, window_ns=10**12)
    now = 10**15
    tier.start(now - 1000, [_row(now - 100 + i, i) for i in range(10)], now)
    tier.replace(now - 100, now - 95, [TOPICS[0]], [_row(now - 97, 99)])
    page = tier.page(_query(content_topics=[TOPICS[0]], time_start=now - 1000, limit=100), None)
    assert [m.timestamp - now for m in page] == [-97, -95, -94, -93, -92, -91]


def test_the_tier_holds_no_more_memory_than_it_counts():
    import gc
    import tracemalloc

    from wakustore.storage.rows import messages_to_arrow, rows_from_arrow

    now = 10**15
    table = messages_to_arrow([(PUBSUB, WakuMessage(payload=bytes(200 + i % 800) + b"%d" % i,
                                                    content_topic=TOPICS[i % 2], timestamp=now - i,
                                                    meta=b"m" * (i % 40)), now) for i in range(5000)])
    tier = HotTier(max_bytes=10**9, window_ns=10**12)
    tier.start(now - 10**6, [], now)
    gc.collect()
    tracemalloc.start()
    try:
        tier.add(rows_from_arrow(table), now)  # rows built for the tier, as the put path builds them
        gc.collect()
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(tier) == 5000 and held <= tier.bytes
