"""A window replaced by files this process writes (storage.window_files):
the table the engine and delta-rs read afterwards, the files left alone,
the statistics the engine prunes by, failed commits, and the store's puts
meanwhile. The session's engine (tests/conftest.py)."""

import json
import os
import threading
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from wakustore.protocols.message import WakuMessage
from wakustore.protocols.store_query import validate_v3
from wakustore.storage import schema, window_files
from wakustore.storage.engine import CommitConflict
from wakustore.storage.rows import Row, from_arrow, to_arrow
from wakustore.storage.spark_oracle import SparkPages

PUBSUB = "/waku/2/rs/16/32"
TOPIC = "/app/1/chat/proto"
OTHER = "/app/1/other/proto"
T0 = 1_700_000_000 * 10**9  # 2023-11-14 22:13:20 UTC
SECOND = 10**9
DAY_NS = 86_400 * SECOND


def row(i, topic=TOPIC, ts=None, payload=None) -> Row:
    message = WakuMessage(
        payload=payload if payload is not None else b"payload-%d" % i,
        content_topic=topic,
        timestamp=T0 + i * SECOND if ts is None else ts,
    )
    return Row.build(PUBSUB, message, T0)


@pytest.fixture
def table(table):
    """The storage tests' fresh table, its windows replaced in process."""
    table.bulk_in_process = True
    return table


def log_actions(table) -> list[dict]:
    """Every action of the table's newest commit."""
    newest = sorted(Path(table.uri, "_delta_log").glob("*.json"))[-1]
    return [json.loads(line) for line in newest.read_text().splitlines()]


def live_paths(table) -> set[str]:
    return set(pa.table(DeltaTable(table.uri).get_add_actions(flatten=True)).column("path").to_pylist())


def _holds_times(table, path: str, start_ns: int, end_ns: int) -> bool:
    times = pq.read_table(Path(table.uri) / path, columns=["timestamp"]).column(0).to_pylist()
    return any(start_ns <= t < end_ns for t in times)


def payloads(table) -> list[bytes]:
    """Every row's payload, read by the engine."""
    return sorted(
        m.message.payload
        for m in from_arrow(table.engine.run(lambda spark: spark.read.format("delta").load(table.uri).toArrow()))
    )


def test_files_without_a_row_of_the_window_are_left_alone(table):
    """A file of the window's day on another topic, and one of the window's
    topic outside its times, stay as they are (same paths); a file with
    rows both in and out of the window is replaced by its rows outside."""
    table.append(to_arrow([row(i, topic=OTHER) for i in range(3)]))
    other_file = live_paths(table)
    table.append(to_arrow([row(i) for i in range(100, 103)]))  # the topic, later that day
    untouched = live_paths(table)
    table.append(to_arrow([row(i) for i in range(10, 20)]))  # 10..19 s: half in [10, 15)
    # The files of that append that hold a row of the window (Sail writes
    # one; Spark writes one a task, and one of them may hold 15..19 only).
    mixed = {p for p in live_paths(table) - untouched if _holds_times(table, p, T0 + 10 * SECOND, T0 + 15 * SECOND)}
    assert mixed
    table.replace_where(to_arrow([row(12, payload=b"new-12")]), T0 + 10 * SECOND, T0 + 15 * SECOND, [TOPIC])
    after = live_paths(table)
    assert other_file <= after and untouched <= after and not mixed & after
    assert payloads(table) == sorted(
        [b"payload-%d" % i for i in (0, 1, 2, 100, 101, 102, 15, 16, 17, 18, 19)] + [b"new-12"]
    )
    kinds = [next(iter(action)) for action in log_actions(table)]
    assert kinds.count("remove") == len(mixed) and kinds.count("add") >= 2  # the kept rest, the window


def test_a_window_over_days_writes_a_file_a_day_with_the_engines_statistics(table, tmp_path, monkeypatch):
    """Staged rows over three days become files in their day partitions,
    rolled at the target size, each with its row count and the min/max the
    engine prunes by; the engine answers a time-bounded page from them."""
    monkeypatch.setattr(window_files, "TARGET_FILE_BYTES", 1024 * 1024)
    # Incompressible payloads; staged as an import stages a window.
    rows = [row(i, ts=T0 + i * (3 * DAY_NS // 12_000), payload=os.urandom(300)) for i in range(12_000)]
    staged = tmp_path / "staged"
    staged.mkdir()
    pq.write_table(to_arrow(rows), staged / "rows.parquet", row_group_size=1000)
    start, end = T0, T0 + 3 * DAY_NS
    table.replace_where(str(staged), start, end, [TOPIC])
    adds = [action["add"] for action in log_actions(table) if "add" in action]
    days = {schema.day_of_ns(r.timestamp).isoformat() for r in rows}
    assert {a["partitionValues"]["day"] for a in adds} == days and len(adds) > len(days)
    stats = [json.loads(a["stats"]) for a in adds]
    assert sum(s["numRecords"] for s in stats) == 12_000
    for add, stat in zip(adds, stats):
        assert add["size"] <= 3 * 1024 * 1024
        path = Path(table.uri) / add["path"]
        stamps = pq.read_table(path, columns=["timestamp"]).column(0).to_pylist()
        assert stat["numRecords"] == len(stamps)
        assert (stat["minValues"]["timestamp"], stat["maxValues"]["timestamp"]) == (min(stamps), max(stamps))
        assert stat["minValues"]["content_topic"] == stat["maxValues"]["content_topic"] == TOPIC
        assert schema.day_of_ns(stat["minValues"]["timestamp"]).isoformat() == add["partitionValues"]["day"]
    assert table.count() == 12_000
    middle = (T0 + DAY_NS, T0 + DAY_NS + DAY_NS // 3)
    expected = sum(middle[0] <= r.timestamp < middle[1] for r in rows)
    query = validate_v3(
        pubsub_topic=PUBSUB,
        content_topics=[TOPIC],
        time_start=middle[0],
        time_end=middle[1] - 1,
        message_hashes=[],
        cursor=None,
        forward=True,
        limit=100,
        include_data=False,
    )
    page = SparkPages(table).page(query, None, 10_000)
    assert page.num_rows == expected > 0


def test_a_failed_commit_leaves_the_table_and_no_file_behind(table, monkeypatch):
    """The commit fails (a conflict, then anything else): the files written
    for it are removed, the table is as it was; a conflict is CommitConflict,
    which the store retries."""
    from deltalake.exceptions import CommitFailedError

    table.append(to_arrow([row(i) for i in range(10)]))
    before_files = {p for p in Path(table.uri).rglob("*.parquet")}
    version = DeltaTable(table.uri).version()

    for error, raised in (
        (CommitFailedError("version 3 already exists"), CommitConflict),
        (OSError("disk full"), OSError),
    ):

        def fail(self, *args, error=error, **kwargs):
            raise error

        monkeypatch.setattr(DeltaTable, "create_write_transaction", fail)
        with pytest.raises(raised):
            table.replace_where(to_arrow([row(3, payload=b"new")]), T0, T0 + 5 * SECOND, [TOPIC])
        assert {p for p in Path(table.uri).rglob("*.parquet")} == before_files
        assert DeltaTable(table.uri).version() == version
    monkeypatch.undo()
    assert payloads(table) == sorted(b"payload-%d" % i for i in range(10))


def test_a_put_during_a_window_commit_is_stored_once(store):
    """A message of the window put just after the window's commit, before
    the store has learnt the window's keys: its flush waits for them, so it
    is dropped as the duplicate it is instead of stored twice."""
    from wakustore.protocols.message import message_hash
    from wakustore.storage.rows import records_to_arrow

    assert store.table.bulk_in_process
    messages = [row(i).message for i in range(5)]
    records = [
        (
            PUBSUB,
            m.content_topic,
            m.payload,
            m.meta,
            m.version,
            m.timestamp,
            m.rate_limit_proof,
            T0,
            message_hash(PUBSUB, m),
        )
        for m in messages
    ]
    window = store.stage_window_tables(T0, T0 + 10 * SECOND, [TOPIC], [records_to_arrow(records)])
    entered, release = threading.Event(), threading.Event()
    replace = window_files.replace_window

    def slow_replace(*args):  # committed, its keys not yet learnt
        replace(*args)
        entered.set()
        assert release.wait(30)

    store.table.replace_where = lambda *args: slow_replace(store.table.uri, *args)
    committing = threading.Thread(target=store.commit_window, args=(window,))
    committing.start()
    assert entered.wait(30)
    assert store.put([(PUBSUB, messages[2], T0)]).duplicates == 0  # not known yet: buffered
    flushing = threading.Thread(target=store.flush)
    flushing.start()
    flushing.join(0.5)
    assert flushing.is_alive()  # held until the commit and its keys
    release.set()
    committing.join(30)
    flushing.join(30)
    window.close()
    assert store.table.count() == 5


def test_a_file_removed_by_another_writer_meanwhile_is_a_conflict_not_a_second_copy(table, monkeypatch):
    """Between the replacement's read of the table and its commit, another
    writer rewrites a file the replacement removes (a DELETE through the
    engine): the commit fails as a conflict, leaving no file of its own,
    and a retry from a fresh read gives each row once."""
    table.append(to_arrow([row(i) for i in range(10)]))
    original = DeltaTable.create_write_transaction
    interfered = []

    def after_another_writer(self, *args, **kwargs):
        if not interfered:
            interfered.append(True)
            table.delete_where(f"timestamp = {T0 + 9 * SECOND}")  # rewrites the file the window's rows are in
        return original(self, *args, **kwargs)

    monkeypatch.setattr(DeltaTable, "create_write_transaction", after_another_writer)
    before = {p for p in Path(table.uri).rglob("*.parquet")}
    window = (T0, T0 + 5 * SECOND)
    with pytest.raises(CommitConflict):
        table.replace_where(to_arrow([row(2, payload=b"new-2")]), *window, [TOPIC])
    created = {p for p in Path(table.uri).rglob("*.parquet")} - before
    assert len(live_paths(table) & {str(p.relative_to(table.uri)) for p in created}) == len(created)  # the DELETE's own
    table.replace_where(to_arrow([row(2, payload=b"new-2")]), *window, [TOPIC])
    assert payloads(table) == sorted([b"new-2"] + [b"payload-%d" % i for i in range(5, 9)])
