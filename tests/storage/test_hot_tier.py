"""The hot tier answers exactly what the table answers, or defers to it."""

import dataclasses
import random
import time

import pytest

from wakustore.protocols.message import WakuMessage, message_hash
from wakustore.protocols.store_query import validate_v3
from wakustore.storage.hot_tier import MAX_SMALL_CHUNKS, ROW_OVERHEAD_BYTES, HotTier
from wakustore.storage.message_store import MessageStore, StoreConfig
from wakustore.storage.page_table import message_columns
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
    base = dict(
        pubsub_topic=PUBSUB,
        content_topics=TOPICS[:2],
        time_start=None,
        time_end=None,
        message_hashes=[],
        cursor=None,
        forward=True,
        limit=None,
        include_data=True,
    )
    base.update(kw)
    return validate_v3(**base)


def _held(tier, query, key):
    """The tier's page as messages (it answers in Arrow), or None."""
    rows = tier.page(query, key)
    return None if rows is None else message_columns(rows.table, rows.order)


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
    original = hot.reader.page
    monkeypatch.setattr(hot.reader, "page", lambda *a, **k: calls.append(1) or original(*a, **k))
    rng = random.Random(7)
    for _ in range(40):
        kw = dict(
            forward=rng.random() < 0.5,
            limit=rng.choice([1, 5, 20, 100]),
            content_topics=rng.sample(TOPICS, rng.randint(1, 3)),
            include_data=rng.random() < 0.8,
        )
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
    for include_data in (True, False):  # bodies, and status-go's presence checks
        query = _query(
            pubsub_topic=PUBSUB, content_topics=[], message_hashes=wanted, limit=100, include_data=include_data
        )
        assert _walk(hot, query) == _walk(cold, query)
        answered = hot.query(query).messages
        assert len(answered) == len(wanted) and all((m.message is None) != include_data for m in answered)


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
    row_bytes = ROW_OVERHEAD_BYTES + len(PUBSUB) + len(TOPICS[0]) + 2
    tier = HotTier(max_bytes=10 * row_bytes, window_ns=10**12)
    now = 10**15
    tier.start(now - 100, [], now)
    tier.add([_row(now - 50 + i, i) for i in range(20)], now)
    assert len(tier) <= 10 and tier.bytes <= tier.max_bytes
    assert tier.start_ns > now - 50
    # What a page from the complete region sees lies inside it.
    page = _held(tier, _query(content_topics=[TOPICS[0]], time_start=tier.start_ns, limit=100), None)
    assert len(page) == len(tier) and all(m.timestamp >= tier.start_ns for m in page)
    # A forward query from before the complete region is not answered from memory.
    assert _held(tier, _query(content_topics=[TOPICS[0]], time_start=now - 60), None) is None


def test_a_full_tier_evicts_the_oldest_whole_timestamps_down_to_a_share_of_its_budget():
    row_bytes = ROW_OVERHEAD_BYTES + len(PUBSUB) + len(TOPICS[0]) + 3
    tier = HotTier(max_bytes=100 * row_bytes, window_ns=10**12)
    now = 10**15
    tier.start(now - 10**6, [], now)
    for batch in range(30):  # many small puts: chunks merged as they come
        tier.add([_row(now - 1000 + batch * 10 + i // 2, batch * 10 + i) for i in range(10)], now)
        assert tier.bytes <= tier.max_bytes
    kept = _held(tier, _query(content_topics=[TOPICS[0]], time_start=tier.start_ns, limit=1000), None)
    # Two rows a timestamp: eviction never splits them; the newest survive.
    stamps = [m.timestamp for m in kept]
    assert stamps == sorted(stamps) and stamps[-1] == now - 1000 + 29 * 10 + 4
    assert len(kept) % 2 == 0 and 80 <= len(kept) <= 100
    # Complete from just above the newest time evicted (times here step 1, then 6).
    assert stamps[0] - 6 < tier.start_ns <= stamps[0] and len(tier._chunks) <= MAX_SMALL_CHUNKS + 1


def test_window_replacement_is_mirrored():
    tier = HotTier(max_bytes=10**9, window_ns=10**12)
    now = 10**15
    tier.start(now - 1000, [_row(now - 100 + i, i) for i in range(10)], now)
    tier.replace(now - 100, now - 95, [TOPICS[0]], [_row(now - 97, 99)])
    page = _held(tier, _query(content_topics=[TOPICS[0]], time_start=now - 1000, limit=100), None)
    assert [m.timestamp - now for m in page] == [-97, -95, -94, -93, -92, -91]


def test_the_tier_holds_no_more_memory_than_it_counts():
    """What the tier counts covers its rows' Arrow buffers and its indexes."""
    import gc
    import tracemalloc

    from wakustore.storage.rows import messages_to_arrow

    now = 10**15
    table = messages_to_arrow(
        [
            (
                PUBSUB,
                WakuMessage(
                    payload=bytes(200 + i % 800) + b"%d" % i,
                    content_topic=TOPICS[i % 2],
                    timestamp=now - i,
                    meta=b"m" * (i % 40),
                ),
                now,
            )
            for i in range(5000)
        ]
    )
    tier = HotTier(max_bytes=10**9, window_ns=10**12)
    tier.start(now - 10**6, [], now)
    gc.collect()
    tracemalloc.start()
    try:
        tier.add_table(table, now)  # the put path hands its Arrow rows over
        gc.collect()
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    (chunk,) = tier._chunks
    assert chunk.table is table  # kept, not copied
    assert len(tier) == 5000 and held + table.get_total_buffer_size() <= tier.bytes


def _reference_page(rows, query, key):
    """The page the table would answer: every row, tested and ordered."""
    from wakustore.protocols import store_query

    match = store_query.matcher(query, key)
    found = [r for r in rows if match(r.pubsub_topic, r.message.content_topic, r.message_hash, r.timestamp, r.digest)]
    found.sort(key=store_query.sort_key(query.ordering), reverse=not query.forward)
    return [r.message_hash for r in found[: query.limit + 1]]


@pytest.mark.parametrize("seed", range(6))
def test_pages_from_many_chunks_are_the_table_pages_whenever_the_tier_answers(seed):
    """Puts of random sizes (chunks merged, re-indexed), equal timestamps
    across chunks, a budget that evicts: whenever the tier answers a page
    (any topics, bounds, cursor, direction, limit), it is the page over
    every row ever added."""
    rng = random.Random(seed)
    now = 10**15
    row_bytes = ROW_OVERHEAD_BYTES + len(PUBSUB) + len(TOPICS[0]) + 8
    tier = HotTier(max_bytes=rng.choice([60, 400, 10**6]) * row_bytes, window_ns=10**12)
    tier.start(now - 10**6, [], now)
    rows = []
    for batch in range(rng.randint(5, 40)):
        added = [
            _row(now - 2000 + batch * 20 + rng.randrange(0, 60), 1000 * batch + i, rng.choice(TOPICS))
            for i in range(rng.choice([1, 3, 17, 60]))
        ]
        tier.add(added, now)
        rows += added
    answered = 0
    for _ in range(150):
        kw = dict(
            forward=rng.random() < 0.5,
            limit=rng.choice([1, 2, 5, 20, 100]),
            content_topics=rng.sample(TOPICS, rng.randint(1, 3)),
        )
        if rng.random() < 0.6:
            kw["time_start"] = now - 2000 + rng.randrange(0, 900)
        if rng.random() < 0.4:
            kw["time_end"] = now - 2000 + rng.randrange(0, 900)
        if kw.get("time_start") is not None and kw.get("time_end") is not None and kw["time_start"] > kw["time_end"]:
            kw["time_start"], kw["time_end"] = kw["time_end"], kw["time_start"]
        query = _query(**kw)
        cursor = rng.choice(rows) if rng.random() < 0.5 else None
        key = None if cursor is None else (cursor.timestamp, cursor.message_hash)
        page = _held(tier, query, key)
        if page is not None:
            answered += 1
            assert [m.message_hash for m in page] == _reference_page(rows, query, key), kw
    assert answered > 10
    hashes = [r.message_hash for r in rng.sample(rows, 5)]
    query = _query(pubsub_topic=None, content_topics=[], message_hashes=hashes, limit=20)
    page = _held(tier, query, None)
    if page is not None:
        assert [m.message_hash for m in page] == _reference_page(rows, query, None)


def test_a_lookup_partly_in_the_tier_asks_the_table_for_the_other_hashes_alone(pair, monkeypatch):
    hot, cold, now, messages = pair
    old = WakuMessage(payload=b"older than the tier", content_topic=TOPICS[1], timestamp=now - 4 * 86_400 * SECOND)
    for store in (hot, cold):
        store.put([(PUBSUB, old, now)])
        store.flush()
    recent = [message_hash(PUBSUB, m) for m in messages[::11]][:30]
    unknown = bytes(32)
    asked = []
    original = hot.reader.page
    monkeypatch.setattr(hot.reader, "page", lambda q, *a, **k: asked.append(q.message_hashes) or original(q, *a, **k))
    for include_data in (True, False):
        query = _query(
            pubsub_topic=None,
            content_topics=[],
            message_hashes=[*recent[:15], message_hash(PUBSUB, old), unknown, *recent[15:]],
            limit=10,
            include_data=include_data,
        )
        walked = _walk(hot, query)
        assert walked == _walk(cold, query) and sum(len(p) for p in walked) == 31
    # Each page asked the table for the two hashes the tier does not hold.
    assert asked and all(set(hashes) == {message_hash(PUBSUB, old), unknown} for hashes in asked)


def test_a_write_publishes_a_new_view_and_leaves_the_one_a_reader_holds():
    """Readers take no lock: what they hold is never changed under them
    (a window replacement kills rows in a copy of the chunk)."""
    tier = HotTier(max_bytes=10**9, window_ns=10**12)
    now = 10**15
    tier.start(now - 1000, [_row(now - 100 + i, i) for i in range(10)], now)
    held = tier._view
    dead_before = [None if c.dead is None else c.dead.copy() for c in held.chunks]
    query = _query(content_topics=[TOPICS[0]], time_start=now - 1000, limit=100)
    before = [m.timestamp - now for m in _held(tier, query, None)]
    tier.replace(now - 100, now - 95, [TOPICS[0]], [])
    tier.forget_before(now - 92)
    assert tier._view is not held
    assert [None if c.dead is None else c.dead.tolist() for c in held.chunks] == [
        None if d is None else d.tolist() for d in dead_before
    ]
    assert [m.timestamp - now for m in _held(tier, query, None)] == [-92, -91]
    assert before == list(range(-100, -90))
