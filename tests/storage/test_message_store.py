import dataclasses
import subprocess
import sys
import threading
import time

import pytest

from wakustore.protocols.errors import StoreError
from wakustore.protocols.message import WakuMessage, message_hash
from wakustore.protocols.store_query import HistoryQuery, Ordering, StatusCode, validate_v3
from wakustore.storage import schema
from wakustore.storage.message_store import MessageStore, StoreConfig
from wakustore.storage.rows import Row
from wakustore.storage.table import DeltaTableRef

PUBSUB = "/waku/2/rs/16/32"
T0 = 1_700_000_000 * 10**9
SECOND = 10**9


def msg(i, topic="/app/1/chat/proto", ts=None, meta=b""):
    return WakuMessage(
        payload=b"payload-%d" % i, content_topic=topic, timestamp=T0 + i * SECOND if ts is None else ts, meta=meta
    )


def triples(messages):
    return [(PUBSUB, m, T0) for m in messages]


def query(**kw):
    base = dict(
        pubsub_topic=PUBSUB,
        content_topics=["/app/1/chat/proto"],
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


def page_all(store, q):
    pages, cursor = [], None
    while True:
        page = store.query(dataclasses.replace(q, cursor=cursor))
        pages.append(page.messages)
        if page.next_cursor is None:
            return pages
        cursor = page.next_cursor.message_hash


def payloads(messages):
    return [m.message.payload for m in messages]


def test_put_is_visible_before_and_after_the_commit(store):
    store.put(triples([msg(i) for i in range(5)]))
    assert payloads(store.query(query()).messages) == [b"payload-%d" % i for i in range(5)]
    assert store.flush() == 5
    assert store.pending == 0
    assert payloads(store.query(query()).messages) == [b"payload-%d" % i for i in range(5)]


def test_duplicates_by_muid_never_add_rows(store):
    first = store.put(triples([msg(i) for i in range(10)]))
    again = store.put(triples([msg(i) for i in range(10)]))
    assert (first.accepted, again.duplicates) == (10, 10)
    store.flush()
    # Same MUID (topics, meta, payload) with another timestamp is the same message.
    store.put(triples([msg(3, ts=T0 + 999 * SECOND)]))
    store.flush()
    assert store.table.count() == 10


def test_duplicates_older_than_the_recent_set_are_caught_by_the_merge(engine, tmp_path):
    uri = str(tmp_path / "messages")
    a = MessageStore(DeltaTableRef(engine, uri), tmp_path / "wal-a", StoreConfig(recent_muids=1))
    a.open()
    a.put(triples([msg(i) for i in range(20)]))
    a.flush()
    a.put(triples([msg(i) for i in range(20)]))  # the recent set remembers only one
    a.flush()
    assert a.table.count() == 20
    a.close()


def test_paging_forward_and_backward_covers_everything_once_in_ascending_pages(store):
    store.put(triples([msg(i) for i in range(45)]))
    store.flush()
    store.put(triples([msg(i) for i in range(45, 53)]))  # some still buffered
    expected = [b"payload-%d" % i for i in range(53)]
    forward = page_all(store, query(limit=20))
    assert [len(p) for p in forward] == [20, 20, 13]
    assert [p for page in forward for p in payloads(page)] == expected
    backward = page_all(store, query(limit=20, forward=False))
    assert [len(p) for p in backward] == [20, 20, 13]
    for page in backward:
        stamps = [m.timestamp for m in page]
        assert stamps == sorted(stamps)
    assert sorted(p for page in backward for p in payloads(page)) == sorted(expected)
    assert payloads(backward[0]) == expected[-20:]


def test_cursor_is_exclusive(store):
    store.put(triples([msg(i) for i in range(10)]))
    store.flush()
    everything = store.query(query()).messages
    after = store.query(query(cursor=everything[4].message_hash)).messages
    assert payloads(after) == payloads(everything[5:])
    before = store.query(query(cursor=everything[4].message_hash, forward=False)).messages
    assert payloads(before) == payloads(everything[:4])


def test_time_range_start_inclusive_end_exclusive(store):
    store.put(triples([msg(i) for i in range(10)]))
    store.flush()
    got = store.query(query(time_start=T0 + 2 * SECOND, time_end=T0 + 5 * SECOND)).messages
    assert payloads(got) == [b"payload-2", b"payload-3", b"payload-4"]


def test_content_topic_and_pubsub_filters(store):
    store.put(
        triples([msg(i, topic="/a/1/x/proto") for i in range(3)] + [msg(i, topic="/b/1/y/proto") for i in range(3, 6)])
    )
    store.put([("/waku/2/rs/16/33", msg(9, topic="/a/1/x/proto"), T0)])
    store.flush()
    got = store.query(query(content_topics=["/b/1/y/proto"])).messages
    assert payloads(got) == [b"payload-3", b"payload-4", b"payload-5"]
    both = store.query(query(content_topics=["/a/1/x/proto", "/b/1/y/proto"])).messages
    assert len(both) == 6


def test_hash_lookup_hashes_only(store):
    messages = [msg(i) for i in range(30)]
    store.put(triples(messages))
    store.flush()
    wanted = [message_hash(PUBSUB, m) for m in messages[::3]]
    got = store.query(query(pubsub_topic=None, content_topics=[], message_hashes=wanted, include_data=False))
    assert sorted(m.message_hash for m in got.messages) == sorted(wanted)
    assert all(m.message is None for m in got.messages)


def test_unknown_cursor_is_an_error_not_everything(store):
    store.put(triples([msg(1)]))
    store.flush()
    with pytest.raises(StoreError) as info:
        store.query(query(cursor=b"\x01" * 32))
    assert info.value.status_code == StatusCode.BAD_RESPONSE


def test_message_without_timestamp_is_ordered_by_arrival_and_returned_unchanged(store):
    bare = WakuMessage(payload=b"bare", content_topic="/app/1/chat/proto")
    store.put([(PUBSUB, bare, T0 + 7 * SECOND)])
    store.flush()
    (found,) = store.query(query()).messages
    assert found.timestamp == T0 + 7 * SECOND
    assert found.message == bare
    assert found.message_hash == message_hash(PUBSUB, bare)


def test_legacy_digest_ordering_and_cursor(store):
    store.put(triples([msg(i) for i in range(6)]))
    store.flush()
    q = HistoryQuery(
        pubsub_topic=PUBSUB, content_topics=("/app/1/chat/proto",), forward=True, limit=3, ordering=Ordering.DIGEST
    )
    first = store.query(q)
    assert payloads(first.messages) == [b"payload-0", b"payload-1", b"payload-2"]
    cur = first.next_cursor
    second = store.query(dataclasses.replace(q, cursor=cur.digest, cursor_timestamp=cur.timestamp))
    assert payloads(second.messages) == [b"payload-3", b"payload-4", b"payload-5"]


def test_unflushed_messages_are_replayed_after_a_crash(engine, tmp_path):
    uri, wal = str(tmp_path / "messages"), tmp_path / "wal"
    code = (
        "import os\n"
        "from wakustore.storage.message_store import MessageStore\n"
        "from wakustore.storage.table import DeltaTableRef\n"
        "from wakustore.protocols.message import WakuMessage\n"
        "class NoEngine:\n"
        "    is_embedded = True\n"
        "    def run(self, fn, retry=True): raise RuntimeError('engine down')\n"
        f"s = MessageStore(DeltaTableRef(NoEngine(), {uri!r}), {str(wal)!r})\n"
        f"s.put([({PUBSUB!r}, WakuMessage(b'kept-%d' % i, '/app/1/chat/proto', timestamp={T0} + i), {T0}) for i in range(50)])\n"
        "os.kill(os.getpid(), 9)\n"
    )
    assert subprocess.run([sys.executable, "-c", code]).returncode == -9
    s = MessageStore(DeltaTableRef(engine, uri), wal)
    assert s.open() == 50  # the dead writer committed nothing, so no key filter hits
    assert len(s.query(query(limit=100)).messages) == 50
    s.flush()
    assert s.wal_depth == 0
    assert s.table.count() == 50
    s.close()


def test_a_log_of_one_record_per_message_from_an_earlier_version_is_replayed(engine, tmp_path):
    from wakustore.storage.rows import encode_record
    from wakustore.storage.wal import WriteAheadLog

    uri, wal = str(tmp_path / "messages"), tmp_path / "wal"
    old = WriteAheadLog(wal)
    old.append([encode_record(PUBSUB, msg(i), T0) for i in range(30)] + [encode_record(PUBSUB, msg(0), T0)])
    old.close()
    s = MessageStore(DeltaTableRef(engine, uri), wal)
    assert s.open() == 31
    assert s.wal_depth == 31
    s.put(triples([msg(i) for i in range(25, 40)]))  # new records after the old ones
    assert s.pending == 40
    assert payloads(s.query(query(limit=100)).messages) == [b"payload-%d" % i for i in range(40)]
    s.writes.close()  # as a crash leaves it: nothing committed
    s = MessageStore(DeltaTableRef(engine, uri), wal)
    assert s.open() == 41  # both kinds, replayed again
    s.flush()
    assert s.wal_depth == 0 and s.table.count() == 40
    assert payloads(s.query(query(limit=100)).messages) == [b"payload-%d" % i for i in range(40)]
    s.close()


def test_arrow_log_records_of_another_schema_are_replayed_into_todays(engine, tmp_path):
    import pyarrow as pa

    from wakustore.storage.rows import messages_to_arrow
    from wakustore.storage.wal import WriteAheadLog
    from wakustore.storage.write_path import batch_records

    uri, wal = str(tmp_path / "messages"), tmp_path / "wal"
    rows = messages_to_arrow(triples([msg(i) for i in range(5)]))
    # As a version whose schema had an extra column and another field order logged them.
    older = rows.append_column("relayed_by", pa.array([b"peer"] * 5)).select(
        ["relayed_by", *reversed(rows.column_names)]
    )
    log = WriteAheadLog(wal)
    log.append(batch_records(older))
    log.close()
    s = MessageStore(DeltaTableRef(engine, uri), wal)
    assert s.open() == 5
    s.flush()
    assert payloads(s.query(query(limit=100)).messages) == [b"payload-%d" % i for i in range(5)]
    s.close()


def test_failed_commit_keeps_the_batch(engine, tmp_path):
    class Flaky:
        is_embedded = True
        fail = True

        def run(self, fn, retry=True):
            if self.fail:
                raise RuntimeError("engine restarting")
            return engine.run(fn, retry=retry)

    flaky = Flaky()
    flaky.fail = False
    s = MessageStore(DeltaTableRef(flaky, str(tmp_path / "m")), tmp_path / "wal")
    s.open()
    s.put(triples([msg(i) for i in range(5)]))
    flaky.fail = True
    with pytest.raises(RuntimeError):
        s.flush()
    s.put(triples([msg(i) for i in range(5, 8)]))
    assert s.pending == 8
    flaky.fail = False
    assert s.flush() == 8
    assert s.table.count() == 8
    s.close()


def two_nodes(engine, tmp_path, uri):
    """Two opened stores on the shared table at ``uri``, each with its log."""
    shared = StoreConfig(shared_table=True)
    nodes = [MessageStore(DeltaTableRef(engine, uri), tmp_path / f"wal-{name}", shared) for name in "ab"]
    for node in nodes:
        node.open()
    return nodes


def test_two_stores_sharing_a_table_commit_concurrently_without_duplicates(engine, tmp_path):
    uri = str(tmp_path / "shared")
    a, b = two_nodes(engine, tmp_path, uri)
    errors = []

    def load(s, lo, hi):
        try:
            for start in range(lo, hi, 50):
                s.put(triples([msg(i) for i in range(start, start + 50)]))
                s.flush()
        except Exception as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=load, args=(a, 0, 300)), threading.Thread(target=load, args=(b, 150, 450))]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert errors == []
    assert a.table.count() == 450
    a.close(), b.close()


def test_a_shared_tables_merge_is_not_widened_by_re_sends_of_old_messages(engine, tmp_path, monkeypatch):
    """A fleet node's batch of today's messages with re-sends of messages
    days old (one another node stored) MERGEs into the newest days only:
    the old rows found in the table are left out first. A message of an
    old day the table lacks still goes in, nothing is stored twice."""
    uri = str(tmp_path / "shared")
    a, b = two_nodes(engine, tmp_path, uri)
    old = [msg(i, ts=T0 - 10 * 86_400 * SECOND + i * SECOND) for i in range(5)]
    b.put(triples(old))
    b.flush()
    a.reader.committed()  # a has seen b's commit (a reader looks again every CHECK_INTERVAL_S)
    scopes = []
    merge_new = a.table.merge_new

    def recorded(batch, **kwargs):
        scopes.append(sorted(kwargs["partition_values"]))
        return merge_new(batch, **kwargs)

    monkeypatch.setattr(a.table, "merge_new", recorded)
    today = [msg(i) for i in range(100, 120)]
    a.put(triples(today + old[:3]))
    a.flush()
    assert scopes == [[schema.day_of_ns(T0)]] and a.writes.known_old_rows == 3
    lost = msg(7, ts=T0 - 10 * 86_400 * SECOND + 7 * SECOND)  # an old day's message nobody stored
    a.put(triples([msg(200), lost, old[4]]))
    a.flush()
    assert scopes[1] == sorted({schema.day_of_ns(T0), schema.day_of_ns(lost.timestamp)})
    assert a.table.count() == 5 + 20 + 2
    a.close(), b.close()


def test_nodes_sharing_a_table_trim_its_log_and_go_on_committing(engine, tmp_path, monkeypatch):
    """Every node of a fleet trims the shared log behind its checkpoints
    (the commits of the last ten minutes kept; one second here), while the
    others commit and read: nothing is lost or doubled, every reader
    follows, and the log stays short."""
    import os

    from wakustore.storage import message_store

    monkeypatch.setattr(message_store, "SHARED_LOG_RETENTION", "interval 1 second")
    monkeypatch.setattr(message_store, "TRIM_LOG_EVERY", 5)
    uri = str(tmp_path / "fleet")
    a, b = two_nodes(engine, tmp_path, uri)
    log_dir = tmp_path / "fleet" / "_delta_log"
    try:
        for round_ in range(30):
            for node, offset in ((a, 0), (b, 5)):  # each re-sends half of the other's
                node.put(triples([msg(i) for i in range(10 * round_ + offset, 10 * round_ + offset + 10)]))
                node.flush()
            if round_ == 15:
                time.sleep(1.2)  # the first commits are now older than the retention
        commits = [n for n in os.listdir(log_dir) if n.endswith(".json")]
        assert min(int(n[:20]) for n in commits) > 0 and len(commits) < a.writes.commits + b.writes.commits
        assert a.table.count() == 305
        for node in (a, b):
            node.reader.refresh()
            page = node.query(query(limit=100))
            assert len(page.messages) == 100
    finally:
        a.close(), b.close()


def test_nodes_sharing_a_table_compact_the_days_they_commit_to(engine, tmp_path, monkeypatch):
    """A fleet's MERGEs read every file of the days they touch, so each node
    compacts those days as it commits (here after 4 small files): both
    nodes commit overlapping messages and compact the same day at once,
    and the table keeps one row per message, served in full by both, in
    few files."""
    from deltalake import DeltaTable

    from wakustore.storage import maintenance

    monkeypatch.setattr(maintenance, "SMALL_FILES_PER_TIER", 4)
    monkeypatch.setattr(maintenance, "COMPACTION_TIERS", (20_000, 1 << 30))
    uri = str(tmp_path / "fleet")
    a, b = two_nodes(engine, tmp_path, uri)
    errors = []

    def load(node, offset):
        try:
            for round_ in range(24):  # each re-sends half of the other's
                first = 10 * round_ + offset
                node.put(triples([msg(i) for i in range(first, first + 10)]))
                node.flush()
        except Exception as exc:  # surfaced below
            errors.append(exc)

    try:
        threads = [threading.Thread(target=load, args=(node, offset)) for node, offset in ((a, 0), (b, 5))]
        [t.start() for t in threads]
        [t.join() for t in threads]
        assert errors == []
        assert a.compactions + b.compactions > 0
        rows = DeltaTable(uri).to_pyarrow_table(columns=["muid"]).column("muid").to_pylist()
        assert len(rows) == len(set(rows)) == 245
        files = DeltaTable(uri).file_uris()
        assert len(files) < a.writes.commits + b.writes.commits
        assert len(files) <= 2 * maintenance.SMALL_FILES_PER_TIER
        expected = {message_hash(PUBSUB, msg(i)) for i in range(245)}
        for node in (a, b):
            node.reader.refresh()
            assert {m.message_hash for page in page_all(node, query(limit=50)) for m in page} == expected
    finally:
        a.close(), b.close()


def test_crowded_days_names_the_smallest_tier_with_many_files(monkeypatch):
    import datetime as dt

    from wakustore.storage import maintenance

    monkeypatch.setattr(maintenance, "SMALL_FILES_PER_TIER", 3)
    monkeypatch.setattr(maintenance, "COMPACTION_TIERS", (100, 1000))
    d1, d2, d3, d4 = (dt.date(2026, 1, d) for d in (1, 2, 3, 4))
    sizes = {
        d1: [10, 20, 30],
        d2: [10, 500, 5000, 6000],
        d3: [150, 200, 300, 99],
        d4: [5000, 6000, 7000],
        None: [1] * 9,
    }
    assert maintenance.crowded_days(sizes) == [(d1, 100), (d3, 1000)]
    assert maintenance.crowded_days(sizes, [d3, d4, d2]) == [(d3, 1000)]
    assert maintenance.crowded_days(sizes, [dt.date(2026, 2, 1)]) == []


def test_stream_and_replace_a_window(store):
    store.put(
        triples(
            [msg(i, topic="/c/1/a/proto") for i in range(20)] + [msg(i, topic="/c/1/b/proto") for i in range(20, 30)]
        )
    )
    window = (T0, T0 + 10 * SECOND)
    rows = [r for chunk in store.stream_window(*window, ["/c/1/a/proto"]) for r in chunk]
    assert [r.message.payload for r in rows] == [b"payload-%d" % i for i in range(10)]
    replacement = [Row.build(PUBSUB, msg(i, topic="/c/1/a/proto"), T0) for i in range(0, 10, 2)]
    assert store.replace_window(*window, ["/c/1/a/proto"], replacement) == 5
    rows = [r for chunk in store.stream_window(*window, ["/c/1/a/proto"]) for r in chunk]
    assert [r.message.payload for r in rows] == [b"payload-%d" % i for i in range(0, 10, 2)]
    assert store.table.count() == 25  # other topic and later messages untouched
    with pytest.raises(ValueError):
        store.replace_window(*window, ["/c/1/a/proto"], [Row.build(PUBSUB, msg(15, topic="/c/1/a/proto"), T0)])


def test_empty_range_and_last_page_have_no_cursor(store):
    store.put(triples([msg(i) for i in range(25)]))
    store.flush()
    empty = store.query(query(time_start=T0 + 100 * SECOND, time_end=T0 + 200 * SECOND))
    assert empty.messages == [] and empty.next_cursor is None
    first = store.query(query(limit=20))
    assert len(first.messages) == 20 and first.next_cursor is not None
    last = store.query(query(limit=20, cursor=first.next_cursor.message_hash))
    assert len(last.messages) == 5 and last.next_cursor is None
    # the last message as cursor: nothing after it, forward; everything before it, backward
    final = last.messages[-1].message_hash
    assert store.query(query(cursor=final)).messages == []
    assert len(store.query(query(cursor=final, forward=False, limit=100)).messages) == 24
    exact = store.query(query(limit=25))
    assert len(exact.messages) == 25 and exact.next_cursor is None


def test_a_cursor_from_another_topic_still_orders_by_its_timestamp(store):
    store.put(triples([msg(i) for i in range(5)] + [msg(10, topic="/other/1/x/proto")]))
    store.flush()
    other = message_hash(PUBSUB, msg(10, topic="/other/1/x/proto"))
    backward = store.query(query(cursor=other, forward=False))
    assert payloads(backward.messages) == [b"payload-%d" % i for i in range(5)]


def test_a_large_window_is_staged_on_disk_and_replaced_in_one_transaction(store, monkeypatch):
    from deltalake import DeltaTable

    from wakustore.storage import staging

    monkeypatch.setattr(staging, "STAGING_THRESHOLD_BYTES", 4096)  # spill every few rows
    store.put(triples([msg(i, topic="/big/1/a/proto") for i in range(50)]))
    store.flush()
    before = DeltaTable(store.table.uri).version()
    window = (T0, T0 + 1000 * SECOND)

    def replacement():
        for i in range(300):
            yield Row.build(PUBSUB, msg(i, topic="/big/1/a/proto", meta=b"new"), T0)

    assert store.replace_window(*window, ["/big/1/a/proto"], replacement()) == 300
    assert DeltaTable(store.table.uri).version() == before + 1
    rows = [r for chunk in store.stream_window(*window, ["/big/1/a/proto"]) for r in chunk]
    assert len(rows) == 300 and all(r.message.meta == b"new" for r in rows)
    assert not any(
        (p.name.endswith("_staging") and any(p.iterdir()))
        for p in __import__("pathlib").Path(store.table.uri).parent.iterdir()
    )


def test_a_failing_source_commits_nothing(store):
    store.put(triples([msg(i, topic="/big/1/a/proto") for i in range(5)]))
    store.flush()

    def broken():
        yield Row.build(PUBSUB, msg(1, topic="/big/1/a/proto"), T0)
        raise RuntimeError("archive check failed")

    with pytest.raises(RuntimeError):
        store.replace_window(T0, T0 + 100 * SECOND, ["/big/1/a/proto"], broken())
    assert store.table.count() == 5


def _all_pages(store, q, cursor_of):
    """Every page of ``q`` from the first, following next_cursor."""
    out, cursor = [], None
    while True:
        page = store.query(cursor_of(q, cursor))
        out.append([(m.timestamp, m.message_hash) for m in page.messages])
        if page.next_cursor is None:
            return out
        cursor = page.next_cursor


def _v3_cursor(q, cursor):
    return dataclasses.replace(q, cursor=None if cursor is None else cursor.message_hash)


def _v2_cursor(q, cursor):
    if cursor is None:
        return q
    return dataclasses.replace(q, cursor=cursor.digest, cursor_timestamp=cursor.timestamp)


def test_uncommitted_rows_page_exactly_as_committed_rows(engine, tmp_path):
    """Pages from the pending rows alone, from a mix, and from the table
    alone are the same (the hot tier is off: every page reads both)."""
    s = MessageStore(DeltaTableRef(engine, str(tmp_path / "m")), tmp_path / "wal", StoreConfig(hot_tier_bytes=0))
    s.open()
    # Three rows per timestamp (ties broken by hash or digest), two topics.
    topics = ["/app/1/chat/proto", "/app/1/other/proto"]
    messages = [msg(i, topic=topics[i % 2], ts=T0 + (i // 3) * SECOND) for i in range(40)]
    cases = []
    for forward in (True, False):
        for start, end in ((None, None), (T0 + 2 * SECOND, T0 + 9 * SECOND)):
            v3 = query(
                content_topics=topics[:1] if start else topics, time_start=start, time_end=end, forward=forward, limit=4
            )
            v2 = dataclasses.replace(v3, ordering=Ordering.DIGEST)
            cases += [(v3, _v3_cursor), (v2, _v2_cursor)]
    s.put(triples(messages[:25]))
    pending_only = [_all_pages(s, q, c) for q, c in cases]
    s.flush()
    s.put(triples(messages[25:]))
    assert s.pending == 15
    mixed = [_all_pages(s, q, c) for q, c in cases]
    s.flush()
    committed = [_all_pages(s, q, c) for q, c in cases]
    s.put(triples(messages[:25]))  # duplicates: nothing new
    s.close()
    assert mixed == committed
    # The first 25 rows are the first 8 1/3 seconds: compare what they cover.
    s2 = MessageStore(DeltaTableRef(engine, str(tmp_path / "m2")), tmp_path / "wal2", StoreConfig(hot_tier_bytes=0))
    s2.open()
    s2.put(triples(messages[:25]))
    s2.flush()
    assert pending_only == [_all_pages(s2, q, c) for q, c in cases]
    s2.close()


def test_queries_read_only_the_pending_rows_of_their_time_range(engine, tmp_path):
    s = MessageStore(DeltaTableRef(engine, str(tmp_path / "m")), tmp_path / "wal", StoreConfig(hot_tier_bytes=0))
    s.open()
    s.put(triples([msg(i) for i in range(1000)]))
    looked_at = []

    def accept(row):
        looked_at.append(row.timestamp)
        return True

    found = s.writes.pending_scan(T0 + 100 * SECOND, T0 + 109 * SECOND, True, accept, 1000)
    assert [r.timestamp for r in found] == [T0 + i * SECOND for i in range(100, 110)]
    assert len(looked_at) == 10
    # Backward, the first 3 from the top of the range (and no further).
    looked_at.clear()
    found = s.writes.pending_scan(None, T0 + 500 * SECOND, False, accept, 3)
    assert [r.timestamp for r in found] == [T0 + i * SECOND for i in (500, 499, 498)]
    assert len(looked_at) == 3
    s.close()


def test_pages_and_cursors_of_pending_rows_copy_no_pending_rows(engine, tmp_path, monkeypatch):
    s = MessageStore(DeltaTableRef(engine, str(tmp_path / "m")), tmp_path / "wal", StoreConfig(hot_tier_bytes=0))
    s.open()
    s.put(triples([msg(i) for i in range(10)]))

    def copy_all():
        raise AssertionError("a query copied every pending row")

    monkeypatch.setattr(s.writes, "pending_rows", copy_all)
    first = s.query(query(limit=4))
    second = s.query(query(limit=4, cursor=first.next_cursor.message_hash))
    assert payloads([*first.messages, *second.messages]) == [b"payload-%d" % i for i in range(8)]
    # A cursor the node did not hand out: looked up among the pending rows.
    third = s.query(query(limit=4, cursor=message_hash(PUBSUB, msg(6))))
    assert payloads(third.messages) == [b"payload-7", b"payload-8", b"payload-9"]
    monkeypatch.undo()
    s.close()


# --- windows replaced from Arrow batches (archive import) -------------------------------


def _record(pubsub, m, arrival):
    """A decoded archive record (protocols.archive_records.DecodedRecord) of a message."""
    return (
        pubsub,
        m.content_topic,
        m.payload,
        m.meta,
        m.version,
        m.timestamp,
        m.rate_limit_proof,
        arrival,
        message_hash(pubsub, m),
    )


def test_rows_built_a_column_at_a_time_are_the_rows_built_one_by_one():
    from wakustore.storage.rows import records_to_arrow, to_arrow

    messages = [
        (PUBSUB, msg(1, meta=b"m" * 40), T0 + 5),
        ("/waku/2/rs/16/33", WakuMessage(b"", "/c/1/b/proto", version=1, timestamp=0, rate_limit_proof=b"p"), T0 + 7),
        (PUBSUB, WakuMessage(b"x" * 3000, "/c/1/a/proto", version=2, timestamp=-5), 3),
        (PUBSUB, WakuMessage(b"y", "/c/1/a/proto", timestamp=86_400 * 10**9 * 20_000 - 1), 0),
    ]
    columnar = records_to_arrow([_record(*t) for t in messages])
    assert columnar.equals(to_arrow([Row.build(*t) for t in messages]))
    assert records_to_arrow([]).num_rows == 0


def test_replace_a_window_from_arrow_batches(store, monkeypatch):
    """The batches become the window whole (one transaction, staged on
    disk past the threshold), the first copy of a MUID wins, the window's
    other topics and times are untouched; a row outside the window or a
    failing source commits nothing."""
    from deltalake import DeltaTable

    from wakustore.storage import staging
    from wakustore.storage.rows import records_to_arrow

    monkeypatch.setattr(staging, "STAGING_THRESHOLD_BYTES", 2048)
    store.put(
        triples(
            [msg(i, topic="/c/1/a/proto") for i in range(20)] + [msg(i, topic="/c/1/b/proto") for i in range(20, 30)]
        )
    )
    store.flush()
    window, topics = (T0, T0 + 10 * SECOND), ["/c/1/a/proto"]
    before = DeltaTable(store.table.uri).version()
    new = [msg(i, topic="/c/1/a/proto", meta=b"new") for i in range(0, 10, 2)]
    batches = [
        records_to_arrow([_record(PUBSUB, m, T0) for m in new[:3]]),
        records_to_arrow([_record(PUBSUB, m, T0) for m in new[2:]]),
    ]  # new[2] twice
    assert store.replace_window_tables(*window, topics, iter(batches)) == 5
    assert DeltaTable(store.table.uri).version() == before + 1
    rows = [r for chunk in store.stream_window(*window, topics) for r in chunk]
    assert [r.message.payload for r in rows] == [b"payload-%d" % i for i in range(0, 10, 2)]
    assert all(r.message.meta == b"new" for r in rows) and store.table.count() == 25
    # The replaced rows are known to the write path: putting one again is a duplicate.
    assert store.put([(PUBSUB, new[0], T0)]).duplicates == 1

    outside = records_to_arrow([_record(PUBSUB, msg(15, topic="/c/1/a/proto"), T0)])
    foreign = records_to_arrow([_record(PUBSUB, msg(3, topic="/c/1/b/proto"), T0)])
    for bad in (outside, foreign):
        with pytest.raises(ValueError):
            store.replace_window_tables(*window, topics, [batches[0], bad])

    def broken():
        yield batches[0]
        raise RuntimeError("archive check failed")

    with pytest.raises(RuntimeError):
        store.replace_window_tables(*window, topics, broken())
    assert DeltaTable(store.table.uri).version() == before + 1 and store.table.count() == 25


def test_a_window_replaced_from_arrow_batches_keeps_the_hot_tier_to_its_own_window(store):
    """A young node's hot tier covers all time; replacing a window of old
    history puts none of its rows in the tier (it gives up completeness
    below them instead), rows inside the tier's day do join it, and every
    row is found either way."""
    import time as time_module

    from wakustore.storage.rows import records_to_arrow

    now = time_module.time_ns()
    topic = "/c/1/a/proto"
    old = [msg(i, topic=topic) for i in range(50)]  # 2023
    fresh = [msg(i, topic=topic, ts=now - (i + 1) * SECOND) for i in range(3)]
    assert store.hot.enabled and store.hot.start_ns is not None
    store.replace_window_tables(
        T0, T0 + 100 * SECOND, [topic], [records_to_arrow([_record(PUBSUB, m, T0) for m in old])]
    )
    assert len(store.hot) == 0 and store.hot.start_ns > T0 + 49 * SECOND
    store.replace_window_tables(
        now - 60 * SECOND, now, [topic], [records_to_arrow([_record(PUBSUB, m, now) for m in fresh])]
    )
    assert len(store.hot) == 3
    found = [m for page in page_all(store, query(content_topics=[topic], limit=20)) for m in page]
    assert len(found) == 53


def test_a_staged_window_keeps_the_first_copy_of_each_muid_exactly():
    """Repeats are found by the MUIDs' first 8 bytes and settled on the
    whole key: a MUID that shares its prefix with another (here made so)
    is kept, a true repeat (in the same batch or an earlier one) is not."""
    import pyarrow as pa

    from wakustore.storage.message_store import StagedWindow
    from wakustore.storage.rows import records_to_arrow

    def batch(keys):
        table = records_to_arrow([_record(PUBSUB, msg(i), T0) for i in range(len(keys))])
        return table.set_column(0, "muid", pa.array(keys, pa.binary()))

    prefix = b"\x01" * 8
    twin_a, twin_b = prefix + b"a" * 24, prefix + b"b" * 24
    window = StagedWindow(T0, T0 + 100 * SECOND, ["/app/1/chat/proto"], rows=None, now_ns=T0)
    first = window.first_copies(batch([twin_a, b"\x02" * 32, b"\x02" * 32, b"\x03" * 32]))
    assert first.column("muid").to_pylist() == [twin_a, b"\x02" * 32, b"\x03" * 32]
    second = window.first_copies(batch([twin_b, b"\x03" * 32, twin_a, b"\x04" * 32, twin_b]))
    assert second.column("muid").to_pylist() == [twin_b, b"\x04" * 32]
    assert window.count == 5
    assert pa.chunked_array(window.muids).to_pylist() == [twin_a, b"\x02" * 32, b"\x03" * 32, twin_b, b"\x04" * 32]


def test_close_waits_for_the_threads_working_on_the_store_and_refuses_new_ones(engine, tmp_path):
    """A thread inside in_use() (an export or import step a cancelled task
    left running) ends before the store commits and closes; new work is
    refused once closing began."""
    from wakustore.storage.message_store import StoreClosed

    store = MessageStore(DeltaTableRef(engine, str(tmp_path / "messages")), tmp_path / "wal")
    store.open()
    inside, release, events = threading.Event(), threading.Event(), []

    def step():
        with store.in_use():
            inside.set()
            release.wait(30)
            store.put(triples([msg(1)]))
            events.append("step done")

    worker = threading.Thread(target=step)
    worker.start()
    assert inside.wait(30)
    closer = threading.Thread(target=lambda: (store.close(), events.append("closed")))
    closer.start()
    time.sleep(0.3)
    assert events == [] and closer.is_alive()
    with pytest.raises(StoreClosed):
        with store.in_use():
            pass
    release.set()
    worker.join(30)
    closer.join(60)
    assert events == ["step done", "closed"]
    # The step's message was committed by the close.
    reopened = MessageStore(DeltaTableRef(engine, str(tmp_path / "messages")), tmp_path / "wal")
    reopened.open()
    try:
        found = [m for page in page_all(reopened, query()) for m in page]
        assert payloads(found) == [b"payload-1"]
    finally:
        reopened.close()


def test_pages_from_memory_never_look_into_the_rows_waiting_for_a_commit(store, monkeypatch):
    """from_memory (the event loop's part) leaves a cursor only the pending
    rows know to a thread: finding it there may index the whole buffer
    under the write path's lock. The thread's page then finds it."""
    messages = [msg(i) for i in range(30)]
    store.put(triples(messages))
    first = store.query(query(limit=10))
    cursor = first.next_cursor.message_hash

    def forbidden(hashes):
        raise AssertionError("the event loop's part looked into the pending rows")

    with monkeypatch.context() as patched:
        patched.setattr(store.writes, "pending_by_hash", forbidden)
        store.reads.forget_cursors()
        assert store.reads.from_memory(query(limit=10, cursor=cursor)) is None
    page = store.reads.page(query(limit=10, cursor=cursor), memory_tried=True)
    assert payloads(page.messages) == [b"payload-%d" % i for i in range(10, 20)]


def test_pages_from_memory_never_wait_for_a_thread_writing_the_hot_tier(store):
    """The event loop's part takes no lock a thread holds: while a commit
    writes the hot tier (its writers' lock held), from_memory answers at
    once from the view the last write published."""
    import threading
    import time

    from wakustore.protocols.store_query import Page

    now = time.time_ns()
    store.put(triples([msg(i, ts=now - (30 - i) * SECOND) for i in range(30)]))
    store.flush()
    newest = query(limit=10, forward=False)
    held, release = threading.Event(), threading.Event()

    def writer():
        with store.hot._lock:
            held.set()
            release.wait(30)

    thread = threading.Thread(target=writer)
    thread.start()
    assert held.wait(10)
    try:
        page = store.reads.from_memory(newest)
        assert isinstance(page, Page)
        assert payloads(page.messages) == [b"payload-%d" % i for i in range(20, 30)]
        lookup = query(pubsub_topic=None, content_topics=[], message_hashes=[m.message_hash for m in page.messages[:3]])
        assert isinstance(store.reads.from_memory(lookup), Page)
    finally:
        release.set()
        thread.join()
