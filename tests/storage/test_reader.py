"""The in-process reader: the same answers as the engine, one version per
page, advanced after every commit, read-your-writes with pending rows."""

import dataclasses
import datetime as dt
import socket
import threading
import time

import pytest

from wakustore.protocols.message import WakuMessage, message_hash
from wakustore.protocols.store_query import HistoryQuery, Ordering, validate_v3
from wakustore.storage import maintenance
from wakustore.storage.message_store import MessageStore, StoreConfig
from wakustore.storage.reader import TableReader, TableUnreadable
from wakustore.storage.rows import Row
from wakustore.storage.schema import day_start_ns
from wakustore.storage.spark_oracle import SparkPages
from wakustore.storage.table import DeltaTableRef

PUBSUB = "/waku/2/rs/16/32"
OTHER_PUBSUB = "/waku/2/rs/16/33"
DAY = 86_400 * 10**9
HOUR = 3_600 * 10**9
DAY0 = day_start_ns(dt.date(2026, 3, 1))
TOPICS = ["/app/1/a/proto", "/app/1/b/proto", "/app/1/it's \\ odd/proto", "/app/1/ünï/proto"]
COLD = StoreConfig(hot_tier_bytes=0)  # every page from the table


def message(i: int, topic: str, ts: int) -> WakuMessage:
    return WakuMessage(
        payload=b"p-%d-" % i + bytes([i % 256]) * (i % 7),
        content_topic=topic,
        timestamp=ts,
        meta=b"m%d" % (i % 3),
        version=i % 2,
    )


def corpus(n: int = 240, days: int = 4) -> list[tuple[str, WakuMessage, int]]:
    """``n`` messages over ``days`` days, four topics, two shards, with
    some timestamps shared (ties broken by hash)."""
    out = []
    for i in range(n):
        ts = DAY0 + ((i // 3) * 3 * days * DAY) // n  # three messages a timestamp
        out.append((PUBSUB if i % 6 else OTHER_PUBSUB, message(i, TOPICS[i % len(TOPICS)], ts), ts))
    return out


def queries(data) -> list[HistoryQuery]:
    """Pages of every shape the store asks: topics, time windows across
    days, both directions, no data, digest order, hashes."""
    out = []
    for forward in (True, False):
        for topics, start, end in [
            (TOPICS[:1], None, None),
            (TOPICS[:2], DAY0 + 10 * HOUR, DAY0 + 2 * DAY + 3 * HOUR),
            (TOPICS[2:], DAY0, DAY0 + DAY),
            (TOPICS, DAY0 + 3 * DAY, None),
            (TOPICS[1:2], None, DAY0 + DAY + 1),
            # Over four days, the first (in either order) too short to fill a page.
            (TOPICS[:1], DAY0 + DAY - 3 * HOUR, DAY0 + 3 * DAY + 2 * HOUR),
        ]:
            out.append(
                HistoryQuery(
                    pubsub_topic=PUBSUB,
                    content_topics=tuple(topics),
                    time_start=start,
                    time_end=end,
                    forward=forward,
                    limit=7,
                )
            )
        out.append(
            HistoryQuery(
                pubsub_topic=PUBSUB, content_topics=tuple(TOPICS), forward=forward, limit=9, include_data=False
            )
        )
        out.append(
            HistoryQuery(
                pubsub_topic=PUBSUB,
                content_topics=tuple(TOPICS[:1]),
                forward=forward,
                limit=5,
                ordering=Ordering.DIGEST,
            )
        )
    hashes = tuple(message_hash(p, m) for p, m, _ in data[::17])
    out.append(HistoryQuery(message_hashes=hashes, forward=False, limit=100))
    out.append(HistoryQuery(pubsub_topic=OTHER_PUBSUB, message_hashes=hashes, forward=True, limit=3))
    return out


def assert_reader_agrees(store: MessageStore, data) -> int:
    """Every query, and the pages after its cursors, answered alike by the
    reader and by the engine; returns the rows compared."""
    compared = 0
    for query in queries(data):
        key = None
        for _ in range(6):
            mine = store.reader.page(query, key, query.limit + 1).to_pylist()
            engine = SparkPages(store.table).page(query, key, query.limit + 1).to_pylist()
            assert mine == engine, (query, key)
            compared += len(mine)
            if len(mine) <= query.limit:
                break
            last = mine[query.limit - 1]
            key = (last["timestamp"], last["digest" if query.ordering is Ordering.DIGEST else "message_hash"])
    for pubsub, msg, _ in data[::29]:
        h = message_hash(pubsub, msg)
        for topic in (None, pubsub, OTHER_PUBSUB if pubsub == PUBSUB else PUBSUB):
            assert store.reader.timestamp_of_hash(h, topic) == SparkPages(store.table).timestamp_of_hash(h, topic)
    assert store.reader.timestamp_of_hash(b"\x00" * 32, None) is None
    return compared


def test_reader_agrees_with_the_engine_across_commits_compaction_retention_and_replace(engine, tmp_path):
    store = MessageStore(DeltaTableRef(engine, str(tmp_path / "m")), tmp_path / "wal", COLD)
    store.open()
    data = corpus()
    try:
        for start in range(0, len(data), 40):  # several commits, several files a day
            store.put(data[start : start + 40])
            store.flush()
        versions = [store.reader.version]
        assert assert_reader_agrees(store, data) > 100

        maintenance.compact(store.table, today=dt.date(2030, 1, 1))  # one sorted file per day
        store.reader.committed()
        versions.append(store.reader.version)
        assert assert_reader_agrees(store, data) > 100

        cutoff = DAY0 + DAY + 5 * HOUR
        maintenance.delete_before(store.table, cutoff)
        store.forget_before(cutoff)
        versions.append(store.reader.version)
        kept = [d for d in data if d[1].timestamp >= cutoff]
        assert assert_reader_agrees(store, kept) > 50
        assert (
            store.reader.page(
                HistoryQuery(pubsub_topic=PUBSUB, content_topics=tuple(TOPICS), time_end=cutoff), None, 10
            ).num_rows
            == 0
        )

        window = (DAY0 + 2 * DAY, DAY0 + 3 * DAY)
        inside = [
            Row.build(p, m, a)
            for p, m, a in kept
            if window[0] <= m.timestamp < window[1] and m.content_topic == TOPICS[0]
        ]
        store.replace_window(*window, [TOPICS[0]], inside[::2])
        versions.append(store.reader.version)
        remaining = [
            d for d in kept if not (window[0] <= d[1].timestamp < window[1] and d[1].content_topic == TOPICS[0])
        ]
        remaining += [(r.pubsub_topic, r.message, r.arrival_time) for r in inside[::2]]
        assert assert_reader_agrees(store, remaining) > 50
        assert versions == sorted(set(versions)), versions  # advanced after every kind of commit
    finally:
        store.close()


def test_odd_topics_and_binary_values_survive_the_sql(engine, tmp_path):
    store = MessageStore(DeltaTableRef(engine, str(tmp_path / "m")), tmp_path / "wal", COLD)
    store.open()
    topics = ["/x/1/a'b''c/proto", "/x/1/back\\slash/proto", "/x/1/ä日本/proto", "/x/1/semi;-- drop/proto"]
    data = [(PUBSUB + "'", message(i, topics[i % 4], DAY0 + i), DAY0) for i in range(20)]
    try:
        store.put(data)
        store.flush()
        for topic in topics:
            query = validate_v3(
                pubsub_topic=PUBSUB + "'",
                content_topics=[topic],
                time_start=None,
                time_end=None,
                message_hashes=[],
                cursor=None,
                forward=True,
                limit=20,
                include_data=True,
            )
            got = store.query(query).messages
            assert [m.message for m in got] == [m for _, m, _ in data if m.content_topic == topic]
    finally:
        store.close()


def test_a_commit_advances_the_reader_before_its_rows_leave_the_pending_set(engine, tmp_path):
    seen = []

    class Watching(TableReader):
        def committed(self):
            # The rows of the commit are still pending here.
            seen.append(store.pending)
            super().committed()

    # No look at the log before pages: only the commit hook advances it.
    reader = Watching(str(tmp_path / "m"), check_interval_s=None)
    store = MessageStore(DeltaTableRef(engine, str(tmp_path / "m")), tmp_path / "wal", COLD, reader=reader)
    store.open()
    assert seen == [0] and reader.version is not None  # opened with the store
    seen.clear()
    data = corpus(30, days=1)
    query = HistoryQuery(pubsub_topic=PUBSUB, content_topics=tuple(TOPICS), limit=100)
    try:
        assert store.query(query).messages == []
        before = reader.version
        store.put(data)
        assert store.flush() == 30
        assert seen == [30] and reader.version > before
        assert store.pending == 0
        expected = sorted((m.timestamp, message_hash(p, m)) for p, m, _ in data if p == PUBSUB)
        assert [(m.timestamp, m.message_hash) for m in store.query(query).messages] == expected
    finally:
        store.close()


def test_pages_merge_pending_rows_with_the_committed_version(engine, tmp_path):
    store = MessageStore(DeltaTableRef(engine, str(tmp_path / "m")), tmp_path / "wal", COLD)
    store.open()
    data = [d for d in corpus(120, days=2) if d[0] == PUBSUB]
    try:
        store.put(data[::2])
        store.flush()
        store.put(data[1::2])  # not committed
        assert store.pending == len(data[1::2])
        for forward in (True, False):
            query = validate_v3(
                pubsub_topic=PUBSUB,
                content_topics=TOPICS,
                time_start=None,
                time_end=None,
                message_hashes=[],
                cursor=None,
                forward=forward,
                limit=7,
                include_data=True,
            )
            got, cursor = [], None
            while True:
                page = store.query(dataclasses.replace(query, cursor=cursor))
                got += page.messages if forward else page.messages[::-1]
                if page.next_cursor is None:
                    break
                cursor = page.next_cursor.message_hash
            expected = sorted(((m.timestamp, message_hash(p, m)) for p, m, _ in data), reverse=not forward)
            assert [(m.timestamp, m.message_hash) for m in got] == expected
    finally:
        store.close()


def test_a_shared_table_shows_another_writers_commits_after_the_check_interval(engine, tmp_path):
    uri = str(tmp_path / "shared")
    shared = dataclasses.replace(COLD, shared_table=True)
    writer = MessageStore(DeltaTableRef(engine, uri), tmp_path / "wal-a", shared)
    writer.open()
    reader = TableReader(uri, check_interval_s=0.0)
    frozen = TableReader(uri, check_interval_s=None)
    other = MessageStore(DeltaTableRef(engine, uri), tmp_path / "wal-b", shared, reader=reader)
    other.open()
    query = HistoryQuery(pubsub_topic=PUBSUB, content_topics=tuple(TOPICS), limit=100)
    try:
        assert frozen.page(query, None, 101).num_rows == 0
        writer.put([d for d in corpus(12, days=1) if d[0] == PUBSUB])
        writer.flush()
        assert len(other.query(query).messages) == 10
        assert frozen.page(query, None, 101).num_rows == 0  # still at the version it read
        frozen.refresh()
        assert frozen.page(query, None, 101).num_rows == 10
    finally:
        other.close()
        writer.close()


def test_a_version_whose_files_were_vacuumed_is_left_for_the_latest(engine, tmp_path):
    uri = str(tmp_path / "m")
    store = MessageStore(DeltaTableRef(engine, uri), tmp_path / "wal", COLD)
    store.open()
    stale = TableReader(uri, check_interval_s=None)
    data = corpus(60, days=2)
    query = HistoryQuery(pubsub_topic=PUBSUB, content_topics=tuple(TOPICS), limit=100)
    try:
        for start in range(0, 60, 20):
            store.put(data[start : start + 20])
            store.flush()
        expected = stale.page(query, None, 101).to_pylist()
        old = stale.version
        maintenance.compact(store.table, today=dt.date(2030, 1, 1))
        assert maintenance.vacuum(store.table, retention_hours=0) > 0  # the files `stale` lists are gone
        assert stale.page(query, None, 101).to_pylist() == expected
        assert stale.version > old
    finally:
        store.close()


def test_an_unreadable_table_is_reported_as_such(tmp_path):
    reader = TableReader(str(tmp_path / "nothing-here"))
    with pytest.raises(TableUnreadable, match="cannot be read"):
        reader.page(HistoryQuery(pubsub_topic=PUBSUB, content_topics=(TOPICS[0],)), None, 21)
    with pytest.raises(TableUnreadable):
        reader.timestamp_of_hash(b"\x01" * 32, None)


def test_every_acknowledged_message_is_in_every_page_while_commits_land(engine, tmp_path):
    store = MessageStore(DeltaTableRef(engine, str(tmp_path / "m")), tmp_path / "wal", COLD)
    store.open()
    data = [d for d in corpus(108, days=2) if d[0] == PUBSUB]  # 90 messages, one page
    query = HistoryQuery(pubsub_topic=PUBSUB, content_topics=tuple(TOPICS), limit=100)
    acknowledged = [0]
    done = threading.Event()
    failures: list[str] = []
    pages = [0]

    def writer():
        try:
            for start in range(0, len(data), 9):
                store.put(data[start : start + 9])
                acknowledged[0] = start + 9
                store.flush()
        finally:
            done.set()

    def reader():
        while not done.is_set() or pages[0] < 5:
            before = acknowledged[0]
            got = {m.message_hash for m in store.query(query).messages}
            pages[0] += 1
            missing = [i for i, (p, m, _) in enumerate(data[:before]) if message_hash(p, m) not in got]
            if missing:
                failures.append(f"{len(missing)} of {before} acknowledged messages missing from a page")

    threads = [threading.Thread(target=writer), *(threading.Thread(target=reader) for _ in range(2))]
    try:
        [t.start() for t in threads]
        [t.join(timeout=120) for t in threads]
        assert not any(t.is_alive() for t in threads)
        assert failures == [] and pages[0] >= 5
        assert store.reader.version >= 10  # ten commits landed meanwhile
    finally:
        store.close()


def test_an_unreachable_object_store_fails_a_read_within_seconds(monkeypatch):
    """A page (or the log check before it) in a storage outage gives up
    after a few quick retries, not the object store client's default
    minutes: the node then serves the version it holds or answers 503."""
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    for name, value in {
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        "AWS_ACCESS_KEY_ID": "key",
        "AWS_SECRET_ACCESS_KEY": "secret",
        "AWS_REGION": "us-east-1",
        "AWS_ALLOW_HTTP": "true",
    }.items():
        monkeypatch.setenv(name, value)
    reader = TableReader("s3://bucket/messages")
    assert reader.storage_options["max_retries"] == "2"
    started = time.monotonic()
    with pytest.raises(TableUnreadable):
        reader.refresh()
    assert time.monotonic() - started < 5
    assert (
        TableReader("s3://bucket/messages", storage_options={"max_retries": "9"}).storage_options["max_retries"] == "9"
    )
    assert TableReader("/data/messages").storage_options is None
