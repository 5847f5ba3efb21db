"""The reader's key index: pages and lookups read through it are exactly
the DataFusion answers, on ingest files and compacted days alike, and it
follows the table's files as versions advance."""

import datetime as dt
import os

import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from wakustore.protocols.message import WakuMessage, message_hash
from wakustore.protocols.store_query import HistoryQuery, Ordering
from wakustore.storage import maintenance, reader as reader_module
from wakustore.storage.message_store import MessageStore, StoreConfig
from wakustore.storage.reader import TableReader
from wakustore.storage.schema import day_start_ns
from wakustore.storage.table import DeltaTableRef
from wakustore.node import config as node_config
from wakustore.node.store_service import open_store

PUBSUB = "/waku/2/rs/16/32"
OTHER_PUBSUB = "/waku/2/rs/16/33"
HOUR = 3_600 * 10**9
DAY = 24 * HOUR
DAY0 = day_start_ns(dt.date(2026, 3, 1))
TOPICS = ["/app/1/a/proto", "/app/1/b/proto", "/app/1/c'/proto", "/app/1/ü/proto"]
COLD = StoreConfig(hot_tier_bytes=0)
# Random queries a comparison: at 300, dropping either tie rule of
# row_index._take (rows at the cursor's timestamp) is caught.
EXAMPLES = 300


def corpus(n: int = 300, days: int = 3):
    """``n`` messages over ``days`` days, in random-looking time order,
    each timestamp shared by 12 messages, several of them of one topic
    (ties broken by the order key)."""
    out = []
    for i in range(n):
        ts = DAY0 + ((i * 7919) % n // 12) * (days * DAY // (n // 12))
        topic = TOPICS[(i * 31) % 5 % 4]
        msg = WakuMessage(payload=b"x%d" % i * (1 + i % 5), content_topic=topic, timestamp=ts, meta=b"m%d" % (i % 2))
        out.append((OTHER_PUBSUB if i % 7 == 0 else PUBSUB, msg, ts))
    return out


def keys_of(data):
    return [(m.timestamp, message_hash(p, m), p) for p, m, _ in data]


@st.composite
def page_query(draw, data):
    keys = keys_of(data)
    times = sorted({k[0] for k in keys})
    ordering = draw(st.sampled_from([Ordering.MESSAGE_HASH, Ordering.DIGEST]))
    bound = st.one_of(st.none(), st.sampled_from(times).flatmap(lambda t: st.sampled_from([t - 1, t, t + 1])))
    query = HistoryQuery(
        pubsub_topic=draw(st.sampled_from([PUBSUB, OTHER_PUBSUB])),
        content_topics=tuple(draw(st.lists(st.sampled_from(TOPICS + ["/app/1/none/proto"]), min_size=1, max_size=5,
                                           unique=True))),
        time_start=draw(bound), time_end=draw(bound), forward=draw(st.booleans()),
        limit=draw(st.integers(1, 6)), include_data=draw(st.booleans()), ordering=ordering,
    )
    # The cursor: often a message on the page's topics, where rows tied
    # with it at its timestamp fall on both sides of it.
    on_topics = [(p, m, a) for p, m, a in data if p == query.pubsub_topic and m.content_topic in query.content_topics]
    if on_topics and draw(st.booleans()):
        return query, draw(cursor(on_topics, ordering).filter(lambda k: k is not None))
    return query, draw(cursor(data, ordering))


@st.composite
def hash_query(draw, data):
    hashes = [k[1] for k in keys_of(data)]
    chosen = draw(st.lists(st.sampled_from(hashes), min_size=1, max_size=25, unique=True))
    if draw(st.booleans()):
        chosen.append(bytes(32 * [7]))  # in no file
    query = HistoryQuery(pubsub_topic=draw(st.sampled_from([None, PUBSUB, OTHER_PUBSUB])), message_hashes=tuple(chosen),
                         forward=draw(st.booleans()), limit=draw(st.integers(1, 30)), include_data=draw(st.booleans()))
    return query, draw(cursor(data, Ordering.MESSAGE_HASH))


def cursor(data, ordering):
    """None, or the key of any stored message (matching the query or not)."""
    if ordering is Ordering.DIGEST:
        from wakustore.storage.rows import Row

        keys = [(r.timestamp, r.digest) for r in (Row.build(p, m, a) for p, m, a in data)]
    else:
        keys = [(k[0], k[1]) for k in keys_of(data)]
    return st.one_of(st.none(), st.sampled_from(keys))


def assert_same_answers(indexed: TableReader, plain: TableReader, data) -> None:
    """Random pages and lookups, each answered alike by both readers, the
    indexed one answering every one through its index."""
    answered = indexed.indexed_answers

    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
    @given(st.one_of(page_query(data), hash_query(data)))
    def check(case):
        query, key = case
        fetch = query.limit + 1
        assert indexed.page(query, key, fetch).to_pylist() == plain.page(query, key, fetch).to_pylist(), (query, key)

    check()
    assert indexed.indexed_answers - answered >= EXAMPLES


@pytest.fixture()
def store(engine, tmp_path):
    store = MessageStore(DeltaTableRef(engine, str(tmp_path / "m")), tmp_path / "wal", COLD)
    store.open()
    try:
        yield store
    finally:
        store.close()


def readers(uri: str) -> tuple[TableReader, TableReader]:
    indexed = TableReader(uri, check_interval_s=None, index_in_background=False)
    return indexed, TableReader(uri, check_interval_s=None, key_index=False)


def test_indexed_answers_equal_datafusion_on_ingest_files_and_on_compacted_days(store):
    data = corpus()
    for start in range(0, len(data), 50):  # several files a day, topics interleaved in each
        store.put(data[start:start + 50])
        store.flush()
    indexed, plain = readers(store.table.uri)
    indexed.index_now()
    assert indexed.index_complete()
    assert any(index.row is not None for index in indexed._indexes.values())  # rows of a topic not contiguous
    assert_same_answers(indexed, plain, data)

    maintenance.compact(store.table, today=dt.date(2030, 1, 1))
    indexed.committed()
    plain.committed()
    indexed.index_now()
    assert all(index.row is None for index in indexed._indexes.values())  # sorted days: no row numbers kept
    assert_same_answers(indexed, plain, data)
    # 8 bytes of timestamp, 8 of hash prefix and row, 8 of MUID prefix and
    # row, and the topic groups (a few hundred bytes a file here).
    assert sum(i.nbytes for i in indexed._indexes.values()) < 32 * len(data)


def test_the_index_of_a_file_of_many_topics_is_the_size_it_reports(tmp_path):
    """An ingest file holds hundreds of topic pairs: the index keeps them
    in arrays (what ``nbytes`` and the benchmark report), not an object
    each."""
    import gc
    import tracemalloc

    import pyarrow as pa

    from wakustore.storage import row_index, schema

    n = 4_000
    columns = {
        "muid": [b"%032d" % i for i in range(n)],
        "message_hash": [b"%032d" % (n - i) for i in range(n)],
        "digest": [b"d" * 32] * n,
        "pubsub_topic": [PUBSUB] * n,
        "content_topic": [f"/app/1/t{i % 2000}/proto" for i in range(n)],  # 2,000 pairs
        "payload": [b"p"] * n, "meta": [b""] * n, "version": [0] * n,
        "timestamp": [DAY0 + i for i in range(n)], "sender_timestamp": [DAY0 + i for i in range(n)],
        "rate_limit_proof": [b""] * n, "arrival_time": [DAY0] * n,
        "day": [dt.date(2026, 3, 1)] * n,
    }
    path = str(tmp_path / "file.parquet")
    pq.write_table(pa.table(columns, schema=schema.MESSAGES), path)
    pairs = row_index.TopicPairs()
    row_index.build(path, pairs)  # the pairs' names are interned once, shared by every file
    gc.collect()
    tracemalloc.start()
    try:
        index = row_index.build(path, pairs)
        gc.collect()
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(index.pair_ids) == 2_000
    assert held < 1.5 * index.nbytes + 64 * 1024, (held, index.nbytes)


def test_files_compacted_away_leave_the_index_and_the_new_ones_are_indexed(store):
    data = corpus(120, days=2)
    for start in range(0, len(data), 30):
        store.put(data[start:start + 30])
        store.flush()
    reader = TableReader(store.table.uri, check_interval_s=None, index_in_background=False)
    reader.index_now()
    before = set(reader._indexes)
    assert len(before) > 2  # several files a day

    maintenance.compact(store.table, today=dt.date(2030, 1, 1))
    reader.committed()
    assert not set(reader._indexes) & before  # every old file left the table
    reader.index_now()
    live = {path for path, _ in reader._snapshot.files}
    assert set(reader._indexes) == live and len(live) == 2  # one file a day
    query = HistoryQuery(pubsub_topic=PUBSUB, content_topics=tuple(TOPICS), limit=200, forward=True)
    expected = sorted((k[0], k[1]) for k in keys_of(data) if k[2] == PUBSUB)
    got = reader.page(query, None, 201).to_pylist()
    assert [(r["timestamp"], r["message_hash"]) for r in got] == expected


def _open_paths() -> set[str]:
    paths = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            paths.add(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            pass
    return paths


def test_data_files_stay_open_for_reading_until_they_leave_the_table(store):
    data = corpus(120, days=2)
    for start in range(0, len(data), 30):
        store.put(data[start:start + 30])
        store.flush()
    reader = TableReader(store.table.uri, check_interval_s=None, index_in_background=False, row_group_cache_bytes=0)
    reader.index_now()
    query = HistoryQuery(pubsub_topic=PUBSUB, content_topics=tuple(TOPICS), limit=200, forward=True)
    first = reader.page(query, None, 201).to_pylist()
    old = {os.path.join(store.table.uri, path) for path, _ in reader._snapshot.files}
    held = len(reader._open)
    opened = {os.path.join(store.table.uri, path) for path, _ in reader._open._free}
    # One reader per row group read (each ingest file here is one), kept open.
    assert held == len(opened) > 2 and opened <= old & _open_paths()
    assert reader.page(query, None, 201).to_pylist() == first
    assert len(reader._open) == held  # reused, not opened again

    maintenance.compact(store.table, today=dt.date(2030, 1, 1))
    reader.committed()
    reader.index_now()
    assert not old & _open_paths()  # the compacted-away files are closed (their space can be freed)
    assert reader.page(query, None, 201).to_pylist() == first
    new = {os.path.join(store.table.uri, path) for path, _ in reader._snapshot.files}
    assert len(reader._open) == len(new) == 2 and new <= _open_paths()  # one file (and row group) a day


def test_compacted_days_are_written_in_row_groups_of_snappy_pages(store):
    data = corpus(600, days=1)
    for start in range(0, len(data), 300):
        store.put(data[start:start + 300])
        store.flush()
    maintenance.compact(store.table, today=dt.date(2030, 1, 1))
    reader = TableReader(store.table.uri, check_interval_s=None)
    reader.refresh()
    (path, _), = reader._snapshot.files
    metadata = pq.ParquetFile(os.path.join(store.table.uri, path)).metadata
    assert metadata.num_row_groups == -(-600 // maintenance.ROW_GROUP_ROWS)
    codecs = {metadata.row_group(g).column(c).compression
              for g in range(metadata.num_row_groups) for c in range(metadata.num_columns)}
    assert codecs == {"SNAPPY"}


@pytest.mark.parametrize("copies", [False, True], ids=["row-groups", "flat-copies"])
def test_muid_lookups_are_exact_on_ingest_files_and_on_compacted_days(store, tmp_path, monkeypatch, copies):
    """The reader says which MUIDs a day's files hold exactly as the engine
    does: keys sharing a stored key's prefix, keys of another day and
    unknown keys are not held. Through each day's merged prefixes (a day
    of more than two files merges them), confirming from the files' row
    groups or from flat copies of their MUIDs, after compactions that
    replace the files."""
    from wakustore.protocols.message import muid
    from wakustore.storage import row_index
    from wakustore.storage.schema import day_of_ns

    monkeypatch.setattr(row_index, "DAY_TAIL_FILES", 2)
    data = corpus(240, days=3)
    for start in range(0, len(data), 40):
        store.put(data[start:start + 40])
        store.flush()
    stored = [muid(p, m) for p, m, _ in data]
    day_of = {k: day_of_ns(m.timestamp) for k, (p, m, _) in zip(stored, data)}
    days = sorted(set(day_of.values()))
    # Same 4-byte prefix as a stored key, another rest: a prefix match to refute.
    twins = [k[:4] + bytes(b ^ 0xFF for b in k[4:]) for k in stored[:30]]
    unknown = [bytes(32 * [i]) for i in range(10)]
    asked = stored[::3] + twins + unknown
    directory = tmp_path / "muids"
    reader = TableReader(store.table.uri, check_interval_s=None, index_in_background=False,
                         muid_copies=directory if copies else None)
    for compacted in (False, True):
        reader.committed()
        for wanted in (days, days[:1], days[1:]):
            engine = store.table.existing_keys("muid", asked, "day", wanted)
            assert reader.existing_muids(asked, wanted) == engine
            assert engine == {k for k in stored[::3] if day_of[k] in wanted}
        live = [path for path, _ in reader._snapshot.files]
        merged = reader._muid_days._days
        assert {p for day in merged.values() for p in day.paths} <= {reader._location(p)[0] for p in live}
        # Ingest files: a day of more than two merged; a compacted day is one file.
        assert bool(merged) is not compacted
        if copies:
            assert sorted(os.listdir(directory)) == sorted(os.path.basename(reader._copies.path_of(p)) for p in live)
        maintenance.compact(store.table, today=dt.date(2030, 1, 1))
    if copies:
        # A copy torn by a crash (or gone) is rewritten when the next
        # process indexes its file, before any lookup reads it.
        reader.committed()
        live = [path for path, _ in reader._snapshot.files]
        first, second = (reader._copies.path_of(p) for p in live[:2])
        with open(first, "r+b") as torn:
            torn.truncate(64)
        with open(second, "r+b") as torn:
            torn.seek(-32, os.SEEK_END)
            torn.write(bytes(32))
        (directory / "stale.muid").write_bytes(b"x")
        again = TableReader(store.table.uri, check_interval_s=None, index_in_background=False,
                            muid_copies=directory)
        again.refresh()
        assert not (directory / "stale.muid").exists()
        assert again.existing_muids(asked, days) == {k for k in stored[::3]}
        for path in live:
            index = again._indexes[path]
            assert index.muid_copy == again._copies.path_of(path)
            column = pq.read_table(os.path.join(store.table.uri, path), columns=["muid"]).column(0)
            with open(index.muid_copy, "rb") as copy:
                assert copy.read() == row_index._flat_muids(column)


def test_a_nodes_puts_confirm_duplicates_from_flat_copies_without_reading_row_groups(engine, tmp_path, monkeypatch):
    """A node (open_store) keeps the flat MUID copies in its data dir: a
    re-send older than the recent set is found from them, no row group of
    the table read to confirm it."""
    config = node_config.NodeConfig(data_dir=tmp_path / "node", flush_interval_s=60.0)
    _, node_store = open_store(config, engine)
    try:
        data = corpus(120, days=2)
        node_store.put(data)
        node_store.flush()
        node_store.writes.forget_recent()
        node_store.reader.index_now()

        def no_row_groups(*args):
            raise AssertionError("a row group read to confirm a MUID")

        monkeypatch.setattr(node_store.reader, "_read_group", no_row_groups)
        again = node_store.put(data[::10] + corpus(130, days=2)[120:])
        assert (again.accepted, again.duplicates) == (10, 12)
        assert node_store.writes.looked_up >= 12
        assert os.listdir(tmp_path / "node" / "muids" / "messages")
    finally:
        node_store.close()


def test_an_indexed_reader_answers_without_datafusion(store, monkeypatch):
    data = corpus(80, days=2)
    store.put(data)
    store.flush()
    reader = TableReader(store.table.uri, check_interval_s=None, index_in_background=False)
    reader.index_now()

    def no_datafusion(*args):
        raise AssertionError("read through DataFusion")

    monkeypatch.setattr(reader_module, "_run", no_datafusion)
    p, m, _ = data[5]
    h = message_hash(p, m)
    assert reader.timestamp_of_hash(h, p) == m.timestamp
    assert reader.timestamp_of_hash(h, OTHER_PUBSUB if p == PUBSUB else PUBSUB) is None
    assert reader.page(HistoryQuery(message_hashes=(h,)), None, 2).column("payload").to_pylist() == [m.payload]
    page = reader.page(HistoryQuery(pubsub_topic=p, content_topics=(m.content_topic,), limit=100), None, 101)
    assert h in page.column("message_hash").to_pylist()


def test_lookups_before_the_files_are_indexed_read_through_datafusion(store):
    data = corpus(40, days=1)
    store.put(data)
    store.flush()
    reader = TableReader(store.table.uri, check_interval_s=None, index_in_background=False)
    p, m, _ = data[3]
    found = reader.page(HistoryQuery(message_hashes=(message_hash(p, m),)), None, 2)
    assert found.column("timestamp").to_pylist() == [m.timestamp]
    assert reader.indexed_answers == 0 and reader.index_builds == 0


def test_the_background_thread_indexes_a_new_version(store):
    import time

    data = corpus(60, days=2)
    store.put(data)
    store.flush()
    reader = TableReader(store.table.uri, check_interval_s=None)
    reader.refresh()
    deadline = time.monotonic() + 30
    while not reader.index_complete():
        assert time.monotonic() < deadline, "files not indexed in the background"
        time.sleep(0.02)
    assert reader.index_builds == len(reader._snapshot.files) > 0


def test_candidates_keep_every_row_tied_at_the_cut_and_at_the_cursor():
    import numpy as np

    from wakustore.storage.row_index import _take

    stamp = np.array([1, 2, 2, 2, 3, 4, 4, 5], dtype=np.int64)
    # Forward, 2 rows from the start: 1, 2 and the 2s tied with the last.
    assert _take(stamp, 0, 8, None, 2, True) == (0, 4)
    # Backward, 2 rows from the end: 5, 4 and the 4 tied with it.
    assert _take(stamp, 0, 8, None, 2, False) == (5, 8)
    assert _take(stamp, 0, 8, None, 3, False) == (5, 8)  # 5, 4, 4: no tie to extend
    assert _take(stamp, 0, 8, None, 5, False) == (1, 8)  # 5, 4, 4, 3, 2 and the other 2s
    # A cursor at 2: the 2s may lie on either side of it and do not count.
    assert _take(stamp, 1, 8, 2, 1, True) == (1, 5)
    assert _take(stamp, 0, 4, 2, 1, False) == (0, 4)
    assert _take(stamp, 0, 4, 2, 2, False) == (0, 4)
    # Nothing beyond the range.
    assert _take(stamp, 2, 6, None, 10, True) == (2, 6)
    assert _take(stamp, 2, 6, None, 10, False) == (2, 6)
