"""The reader's key index: pages and lookups read through it are exactly
the DataFusion answers, on ingest files and compacted days alike, and it
follows the table's files as versions advance."""

import datetime as dt
import os

import numpy as np
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from wakustore.node import config as node_config
from wakustore.node.store_service import open_store
from wakustore.protocols.message import WakuMessage, message_hash
from wakustore.protocols.store_query import HistoryQuery, Ordering
from wakustore.storage import maintenance
from wakustore.storage import reader as reader_module
from wakustore.storage.message_store import MessageStore, StoreConfig
from wakustore.storage.reader import TableReader
from wakustore.storage.schema import day_start_ns
from wakustore.storage.table import DeltaTableRef

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
        content_topics=tuple(
            draw(st.lists(st.sampled_from(TOPICS + ["/app/1/none/proto"]), min_size=1, max_size=5, unique=True))
        ),
        time_start=draw(bound),
        time_end=draw(bound),
        forward=draw(st.booleans()),
        limit=draw(st.integers(1, 6)),
        include_data=draw(st.booleans()),
        ordering=ordering,
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
    query = HistoryQuery(
        pubsub_topic=draw(st.sampled_from([None, PUBSUB, OTHER_PUBSUB])),
        message_hashes=tuple(chosen),
        forward=draw(st.booleans()),
        limit=draw(st.integers(1, 30)),
        include_data=draw(st.booleans()),
    )
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


def readers(uri: str, directory=None) -> tuple[TableReader, TableReader]:
    indexed = TableReader(uri, check_interval_s=None, index_in_background=False, index_directory=directory)
    return indexed, TableReader(uri, check_interval_s=None, key_index=False)


@pytest.mark.parametrize("kept", [False, True], ids=["held", "mapped-from-disk"])
def test_indexed_answers_equal_datafusion_on_ingest_files_and_on_compacted_days(store, tmp_path, kept):
    """Held in memory or written to an index directory and mapped from it
    (and mapped again by a new reader: a restart), the index answers as
    DataFusion does."""
    data = corpus()
    for start in range(0, len(data), 50):  # several files a day, topics interleaved in each
        store.put(data[start : start + 50])
        store.flush()
    directory = tmp_path / "index" if kept else None
    indexed, plain = readers(store.table.uri, directory)
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
    if not kept:
        return
    # Mapped, an index holds its topic pairs' ids alone (12 bytes a pair).
    assert indexed.index_bytes() == sum(12 * len(i.pair_ids) for i in indexed._indexes.values())
    assert sorted(os.listdir(directory)) == sorted(
        os.path.basename(indexed._files.path_of(p)) for p, _ in indexed._snapshot.files
    )
    restarted, _ = readers(store.table.uri, directory)
    restarted.refresh()
    assert restarted.index_complete() and restarted.index_builds == 0
    assert restarted.index_loads == len(restarted._snapshot.files)
    assert_same_answers(restarted, plain, data)


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
        "payload": [b"p"] * n,
        "meta": [b""] * n,
        "version": [0] * n,
        "timestamp": [DAY0 + i for i in range(n)],
        "sender_timestamp": [DAY0 + i for i in range(n)],
        "rate_limit_proof": [b""] * n,
        "arrival_time": [DAY0] * n,
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
        store.put(data[start : start + 30])
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
        store.put(data[start : start + 30])
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
    assert len(reader._open) == len(new) == 2 and new <= _open_paths()  # one file a day, read by page


def test_compacted_days_are_written_in_row_groups_of_snappy_pages(store):
    data = corpus(600, days=1)
    for start in range(0, len(data), 300):
        store.put(data[start : start + 300])
        store.flush()
    maintenance.compact(store.table, today=dt.date(2030, 1, 1))
    reader = TableReader(store.table.uri, check_interval_s=None)
    reader.refresh()
    ((path, _),) = reader._snapshot.files
    metadata = pq.ParquetFile(os.path.join(store.table.uri, path)).metadata
    assert metadata.num_row_groups == -(-600 // maintenance.ROW_GROUP_ROWS)
    codecs = {
        metadata.row_group(g).column(c).path_in_schema: metadata.row_group(g).column(c).compression
        for g in range(metadata.num_row_groups)
        for c in range(metadata.num_columns)
    }
    # Hashes are random bytes: stored as they are; the rest in Snappy.
    assert {name for name, codec in codecs.items() if codec != "SNAPPY"} == {"muid", "message_hash", "digest"}
    assert {codecs[name] for name in ("muid", "message_hash", "digest")} == {"UNCOMPRESSED"}
    # In the reader's order: by topic pair, then time.
    keys = pq.read_table(os.path.join(store.table.uri, path), columns=["pubsub_topic", "content_topic", "timestamp"])
    rows = list(zip(*(keys.column(c).to_pylist() for c in keys.column_names)))
    assert rows == sorted(rows)


@pytest.mark.parametrize("kept", [False, True], ids=["held", "mapped-from-disk"])
def test_muid_lookups_are_exact_on_ingest_files_and_on_compacted_days(store, tmp_path, kept):
    """The reader says which MUIDs a day's files hold exactly as the engine
    does: keys sharing a stored key's first bytes, keys of another day and
    unknown keys are not held; on ingest files, and after compactions that
    replace the files (their index files replaced too)."""
    from wakustore.protocols.message import muid
    from wakustore.storage.schema import day_of_ns

    data = corpus(240, days=3)
    for start in range(0, len(data), 40):
        store.put(data[start : start + 40])
        store.flush()
    stored = [muid(p, m) for p, m, _ in data]
    day_of = {k: day_of_ns(m.timestamp) for k, (p, m, _) in zip(stored, data)}
    days = sorted(set(day_of.values()))
    # Same first 31 bytes as a stored key, another last byte: a near miss to refute.
    twins = [k[:31] + bytes([k[31] ^ 0xFF]) for k in stored[:30]]
    unknown = [bytes(32 * [i]) for i in range(10)]
    asked = stored[::3] + twins + unknown
    directory = tmp_path / "index"
    reader = TableReader(
        store.table.uri, check_interval_s=None, index_in_background=False, index_directory=directory if kept else None
    )
    for _compacted in (False, True):
        reader.committed()
        for wanted in (days, days[:1], days[1:]):
            engine = store.table.existing_keys("muid", asked, "day", wanted)
            assert reader.existing_muids(asked, wanted) == engine
            assert engine == {k for k in stored[::3] if day_of[k] in wanted}
        live = [path for path, _ in reader._snapshot.files]
        if kept:
            reader.committed()  # the files a compaction removed leave the directory with their index
            assert sorted(os.listdir(directory)) == sorted(os.path.basename(reader._files.path_of(p)) for p in live)
        maintenance.compact(store.table, today=dt.date(2030, 1, 1))


def test_a_nodes_puts_find_old_duplicates_from_the_index_files_without_reading_the_table(engine, tmp_path, monkeypatch):
    """A node (open_store) keeps the key index in its data dir: a re-send
    older than the recent set is found from it, no row group of the table
    read."""
    config = node_config.NodeConfig(data_dir=tmp_path / "node", flush_interval_s=60.0)
    _, node_store = open_store(config, engine)
    try:
        data = corpus(120, days=2)
        node_store.put(data)
        node_store.flush()
        node_store.writes.forget_recent()
        node_store.reader.index_now()

        def no_row_groups(*args):
            raise AssertionError("a row group read to find a MUID")

        monkeypatch.setattr(node_store.reader, "_read_group", no_row_groups)
        again = node_store.put(data[::10] + corpus(130, days=2)[120:])
        assert (again.accepted, again.duplicates) == (10, 12)
        assert node_store.writes.looked_up >= 12
        assert os.listdir(tmp_path / "node" / "index" / "messages")
    finally:
        node_store.close()


def indexed_on_disk(store, tmp_path, data):
    """``data`` committed 50 messages a file, indexed by a reader keeping
    its indexes in ``tmp_path/index``: (that reader, a reader without the
    index, the directory)."""
    for start in range(0, len(data), 50):
        store.put(data[start : start + 50])
        store.flush()
    directory = tmp_path / "index"
    first, plain = readers(store.table.uri, directory)
    first.index_now()
    return first, plain, directory


def _hide_data_files(uri: str, paths) -> list[tuple[str, str]]:
    """Move the data files away (their log entries stay): any read of one fails."""
    moved = []
    for path in paths:
        where = os.path.join(uri, path)
        os.rename(where, where + ".away")
        moved.append((where + ".away", where))
    return moved


def test_a_restarted_reader_maps_its_indexes_and_answers_presence_checks_without_any_data_file(store, tmp_path):
    """A new reader (a restart) on a table whose indexes are on disk is
    indexed at once, reading no data file: with every data file moved
    away, lookups by hash without data are answered exactly, and
    cursors resolved, from the index alone."""
    data = corpus(200, days=3)
    first, plain, directory = indexed_on_disk(store, tmp_path, data)
    hashes = [message_hash(p, m) for p, m, _ in data]
    asked = hashes[::7] + [bytes(32 * [9])]
    query = HistoryQuery(message_hashes=tuple(asked), include_data=False, limit=100)
    expected = plain.page(query, None, 101).to_pylist()
    assert len(expected) == len(hashes[::7])

    restarted = TableReader(store.table.uri, check_interval_s=None, index_directory=directory)
    moved = _hide_data_files(store.table.uri, [p for p, _ in first._snapshot.files])
    try:
        restarted.refresh()
        assert restarted.index_complete()
        assert restarted.index_builds == 0 and restarted.index_state()["building"] == 0
        assert restarted.page(query, None, 101).to_pylist() == expected
        p, m, _ = data[11]
        assert restarted.timestamp_of_hash(hashes[11], p) == m.timestamp
        with pytest.raises(Exception):  # noqa: B017  (the bodies are in the data files, gone)
            restarted.page(HistoryQuery(message_hashes=(hashes[11],)), None, 2)
    finally:
        for away, back in moved:
            os.rename(away, back)
    with_data = HistoryQuery(message_hashes=tuple(asked), limit=100)
    assert restarted.page(with_data, None, 101).to_pylist() == plain.page(with_data, None, 101).to_pylist()


@pytest.mark.parametrize("damage", ["deleted", "truncated", "header", "body", "stale", "foreign"])
def test_a_missing_damaged_or_stale_index_file_is_built_again_for_that_file_alone(store, tmp_path, damage, caplog):
    """An index file that is gone, cut short, flipped in its header or
    its body, of an older file of the same path, or of another data file is
    never used: that file alone is indexed again from its data (the others
    are mapped), the damage is logged and counted, and the answers stay
    those of DataFusion."""
    import logging

    data = corpus(200, days=2)
    first, plain, directory = indexed_on_disk(store, tmp_path, data)
    paths = [p for p, _ in first._snapshot.files]
    victim = first._files.path_of(paths[0])
    if damage == "deleted":
        os.unlink(victim)
    elif damage == "truncated":
        with open(victim, "r+b") as f:
            f.truncate(os.path.getsize(victim) // 2)
    elif damage in ("header", "body"):
        at = 20 if damage == "header" else os.path.getsize(victim) - 100
        with open(victim, "r+b") as f:
            f.seek(at)
            byte = f.read(1)
            f.seek(at)
            f.write(bytes([byte[0] ^ 0x55]))
    elif damage == "stale":  # the index of an earlier file of this path (another size)
        from wakustore.storage import index_files

        mapped = first._files.open(paths[0], None)
        header = mapped.header
        sections = {name: mapped.arrays[name].copy() for name in header.sections}
        first._files.write(paths[0], header.size + 1, header.rows, header.pairs, header.footer_head, sections)
        del mapped
        assert isinstance(index_files.IndexDirectory(directory).open(paths[0], None), index_files.Mapped)
    else:  # another data file's index under this one's name
        with open(first._files.path_of(paths[1]), "rb") as other, open(victim, "wb") as f:
            f.write(other.read())
    caplog.set_level(logging.WARNING, logger="wakustore.storage.reader")
    restarted = TableReader(
        store.table.uri, check_interval_s=None, index_directory=directory, index_in_background=False
    )
    restarted.refresh()
    restarted.index_now()
    # The body's CRC is checked by the background pass; run it here.
    restarted._index_wanted = True
    restarted._index_all()
    assert restarted.index_complete()
    assert restarted.index_builds == 1 and restarted.index_loads >= len(paths) - 1
    if damage != "deleted":
        assert restarted.index_damaged == 1
        assert any(paths[0] in r.getMessage() for r in caplog.records)
    assert all(i.mapped is not None and i.mapped.verify() for i in restarted._indexes.values())
    assert_same_answers(restarted, plain, data)


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


@pytest.mark.parametrize("filled", [False, True], ids=["filter-filling", "filter-full"])
def test_a_restarted_node_fills_its_key_filter_from_the_index_files_and_finds_old_duplicates(
    engine, tmp_path, monkeypatch, filled
):
    """A node started again on its data dir reads no MUID through the
    table: its key filter is filled from the key index files in the
    background, and until it is full every new key is looked up on every
    day, so old duplicates are found either way."""
    from wakustore.storage import message_store as message_store_module
    from wakustore.storage.table import DeltaTableRef as Ref

    config = node_config.NodeConfig(data_dir=tmp_path / "node", flush_interval_s=60.0)
    _, first = open_store(config, engine)
    data = corpus(120, days=2)
    try:
        first.put(data)
        first.flush()
        first.reader.index_now()
    finally:
        first.close()

    def no_table_keys(*args, **kwargs):
        raise AssertionError("the table's MUIDs read at start")

    monkeypatch.setattr(Ref, "key_day_batches", no_table_keys)
    if not filled:
        monkeypatch.setattr(message_store_module.MessageStore, "_fill_filter", lambda self: None)
    _, again = open_store(config, engine)
    try:
        if filled:
            assert again.writes.filter_ready.wait(30)
            assert again.reader.index_builds == 0
        else:
            assert not again.writes.filter_ready.is_set()
        result = again.put(data[::10] + corpus(130, days=2)[120:])
        assert (result.accepted, result.duplicates) == (10, 12)
        assert again.writes.engine_lookups == 0
    finally:
        again.close()


def test_the_newest_rows_read_in_process_are_every_row_from_the_cut_as_the_engine_has_them(store, tmp_path):
    """The hot tier's warm-up reads the newest rows through the key index
    (their timestamps are in it): every row from the cut on, the cut the
    oldest timestamp whose rows and all newer fit the budget (rows tied
    with it included), the rows as the engine gives them."""
    data = corpus(300, days=3)
    for start in range(0, len(data), 60):
        store.put(data[start : start + 60])
        store.flush()
    reader = TableReader(
        store.table.uri, check_interval_s=None, index_in_background=False, index_directory=tmp_path / "index"
    )
    reader.index_now()
    size = sum(s for sizes in reader.file_sizes_by_day().values() for s in sizes)
    per_row = size / len(data)  # about: each file's own bytes a row weigh its rows
    times = sorted(m.timestamp for _, m, _ in data)
    for since, budget in (
        (times[0], 10 * size),
        (times[len(times) // 2], 10 * size),
        (times[0], 37 * per_row),
        (times[-1], 5 * per_row),
        (times[-1] + 1, 10 * per_row),
        (times[0], 0),
    ):
        rows, cut = reader.newest_rows(since, int(budget))
        assert cut >= since
        if budget >= size:
            assert cut == since
        else:
            # Complete from the cut; what is older would not have fitted.
            assert rows.num_rows * per_row <= budget * 1.5 + per_row * 12
        engine = store.table.recent(cut, 10_000)
        key = lambda r: r["message_hash"]
        assert sorted(rows.select(engine.column_names).to_pylist(), key=key) == sorted(engine.to_pylist(), key=key)


def test_the_compiled_key_finder_finds_every_copy_of_every_key_in_every_run():
    """row_index.find_keys (compiled: interpolation, then a gallop and a
    binary search) against a scan: runs empty, tiny, of repeated keys, of
    keys sharing their first 8 bytes, keys before and after every run."""
    import random

    from wakustore.storage import row_index

    rng = random.Random(7)
    for _ in range(150):
        n = rng.choice([0, 1, 2, 63, 64, 65, 300, 3000])
        keys = [
            os.urandom(32)
            if rng.random() < 0.8
            else bytes(8) + os.urandom(24)
            if rng.random() < 0.5
            else bytes(31) + bytes([rng.randrange(3)])
            for _ in range(n)
        ]
        if n and rng.random() < 0.3:
            keys += keys[: n // 3] * rng.randrange(1, 40)  # copies: more hits than the finder's first buffer
        runs_keys = [sorted(keys), [], sorted(os.urandom(32) for _ in range(70))]
        runs = [np.frombuffer(b"".join(run), dtype=np.uint8) for run in runs_keys]
        asked = rng.sample(keys, min(len(keys), 25)) + [os.urandom(32) for _ in range(5)] + [bytes(32), b"\xff" * 32]
        wanted, found = row_index.find_keys(runs, asked)
        assert wanted == sorted(set(asked))
        expected = sorted(
            (r, i, wanted.index(k)) for r, run in enumerate(runs_keys) for i, k in enumerate(run) if k in set(wanted)
        )
        assert sorted(found) == expected


def test_a_data_file_changed_since_it_was_indexed_is_never_read_again(store, tmp_path):
    """An ingest file (the engine's: no Parquet page CRCs) gets a CRC-32 of
    its own in its index; a restarted reader checks it once, in the
    background, and a file whose bytes changed is a bad file, named with
    its path, whose pages answer an error instead of its rows."""
    data = corpus(200, days=2)
    first, _plain, directory = indexed_on_disk(store, tmp_path, data)
    paths = [p for p, _ in first._snapshot.files]
    mapped = first._files.open(paths[0], None)
    assert mapped.header.file_crc is not None
    location = first._location(paths[0])[0]
    hashes = tuple(pq.read_table(location, columns=["message_hash"]).column(0).to_pylist()[:5])
    first.close()
    size = os.path.getsize(location)
    with open(location, "r+b") as f:
        f.seek(size // 2)
        byte = f.read(1)
        f.seek(size // 2)
        f.write(bytes([byte[0] ^ 0x01]))
    restarted = TableReader(
        store.table.uri, check_interval_s=None, index_directory=directory, index_in_background=False
    )
    restarted.refresh()
    restarted.index_now()
    assert restarted.bad_files() == {}  # mapped, not yet checked
    restarted._index_wanted = True
    restarted._index_all()  # the background pass, run here
    assert list(restarted.bad_files()) == [location]
    assert "CRC-32 taken when it was indexed" in restarted.bad_files()[location]
    with pytest.raises(reader_module.TableUnreadable, match="CRC-32 taken when it was indexed"):
        restarted.page(HistoryQuery(message_hashes=hashes, limit=100), None, 101)
    restarted.close()
