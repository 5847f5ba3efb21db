"""DeltaTableRef on the real engine: creation, writes, the Store page, typed
commit conflicts. One engine for the session (tests/conftest.py)."""

import threading
import time

import pyarrow as pa
import pytest

from wakustore.protocols.message import WakuMessage
from wakustore.protocols.store_query import (
    HistoryQuery,
    Ordering,
    sort_key,
)
from wakustore.storage import schema
from wakustore.storage.engine import CommitConflict, commit_conflict
from wakustore.storage.rows import Row, from_arrow, to_arrow
from wakustore.storage.spark_oracle import SparkPages
from wakustore.storage.table import DeltaTableRef

PUBSUB = "/waku/2/rs/16/32"
TOPIC = "/app/1/chat/proto"
OTHER = "/app/1/other/proto"
DAY_NS = 86_400 * 10**9
T0 = 1_700_000_000 * 10**9  # 2023-11-14 22:13:20 UTC
SECOND = 10**9


def row(i, ts=None, topic=TOPIC, pubsub=PUBSUB) -> Row:
    message = WakuMessage(
        payload=b"payload-%d" % i, content_topic=topic, timestamp=T0 + i * SECOND if ts is None else ts
    )
    return Row.build(pubsub, message, T0)


def keys(arrow: pa.Table) -> list[tuple[int, bytes]]:
    return [sort_key(Ordering.MESSAGE_HASH)(m) for m in from_arrow(arrow, include_data=False)]


def test_ensure_creates_an_empty_table_once_and_records_the_schema_version(engine, tmp_path):
    from deltalake import DeltaTable

    t = DeltaTableRef(engine, str(tmp_path / "messages"))
    t.ensure(schema.MESSAGES, schema.MESSAGES_PARTITION, "test messages")
    assert t.count() == 0
    t.append(to_arrow([row(1)]))
    t.ensure(schema.MESSAGES, schema.MESSAGES_PARTITION, "test messages")  # idempotent: keeps the rows
    assert t.count() == 1
    configuration = DeltaTable(t.uri).metadata().configuration
    assert configuration[schema.SCHEMA_VERSION_PROPERTY] == str(schema.SCHEMA_VERSION)
    assert DeltaTable(t.uri).metadata().partition_columns == [schema.MESSAGES_PARTITION]


def test_merge_new_inserts_only_keys_the_touched_days_lack(table):
    table.append(to_arrow([row(i) for i in range(5)]))
    batch = to_arrow([row(i) for i in range(3, 8)])
    days = sorted(set(batch.column(schema.MESSAGES_PARTITION).to_pylist()))
    table.merge_new(batch, key="muid", partition=schema.MESSAGES_PARTITION, partition_values=days)
    assert table.count() == 8
    table.merge_new(batch, key="muid", partition=schema.MESSAGES_PARTITION, partition_values=days)
    assert table.count() == 8


def test_existing_keys_looks_only_in_the_given_days(table):
    rows = [row(1), row(2, ts=T0 + 3 * DAY_NS)]
    table.append(to_arrow(rows))
    hashes = [r.message_hash for r in rows] + [row(99).message_hash]
    all_days = sorted({schema.day_of_ns(r.timestamp) for r in rows})
    assert table.existing_keys("message_hash", hashes, "day", all_days) == {r.message_hash for r in rows}
    first_day = [schema.day_of_ns(rows[0].timestamp)]
    assert table.existing_keys("message_hash", hashes, "day", first_day) == {rows[0].message_hash}
    assert table.existing_keys("message_hash", [], "day", all_days) == set()
    assert table.existing_keys("message_hash", hashes, "day", []) == set()


def test_page_follows_a_cursor_forward_and_backward_with_timestamp_ties(table):
    # Three rows share each timestamp: the cursor's hash breaks the tie.
    rows = [row(i, ts=T0 + (i // 3) * SECOND) for i in range(12)]
    rows.append(row(50, topic=OTHER))
    rows.append(row(51, pubsub="/waku/2/rs/16/33"))
    table.append(to_arrow(rows))
    mine = sorted(
        (r for r in rows if r.message.content_topic == TOPIC and r.pubsub_topic == PUBSUB),
        key=sort_key(Ordering.MESSAGE_HASH),
    )
    ordered = [(r.timestamp, r.message_hash) for r in mine]
    q = HistoryQuery(pubsub_topic=PUBSUB, content_topics=(TOPIC,), forward=True, limit=4)
    assert keys(SparkPages(table).page(q, None, 5)) == ordered[:5]
    cursor = ordered[4]  # the middle row of a timestamp
    assert keys(SparkPages(table).page(q, cursor, 5)) == ordered[5:10]
    back = HistoryQuery(pubsub_topic=PUBSUB, content_topics=(TOPIC,), forward=False, limit=4)
    assert keys(SparkPages(table).page(back, None, 5)) == ordered[::-1][:5]
    assert keys(SparkPages(table).page(back, cursor, 5)) == ordered[:4][::-1]
    # Time bounds: start inclusive, end exclusive.
    window = HistoryQuery(
        pubsub_topic=PUBSUB,
        content_topics=(TOPIC,),
        time_start=T0 + SECOND,
        time_end=T0 + 3 * SECOND,
        forward=True,
        limit=10,
    )
    assert keys(SparkPages(table).page(window, None, 11)) == ordered[3:9]


def test_page_by_hashes_and_without_data(table):
    rows = [row(i) for i in range(6)]
    table.append(to_arrow(rows))
    wanted = (rows[4].message_hash, rows[1].message_hash)
    q = HistoryQuery(message_hashes=wanted, forward=True, include_data=False)
    found = SparkPages(table).page(q, None, 21)
    assert keys(found) == [(rows[1].timestamp, rows[1].message_hash), (rows[4].timestamp, rows[4].message_hash)]
    assert "payload" not in found.column_names
    data = from_arrow(SparkPages(table).page(HistoryQuery(message_hashes=wanted[:1]), None, 21))
    assert data[0].message == rows[4].message


def test_page_in_digest_order_for_the_legacy_protocol(table):
    rows = [row(i, ts=T0) for i in range(6)]  # one timestamp: the digest orders them
    table.append(to_arrow(rows))
    by_digest = sorted(rows, key=lambda r: r.digest)
    q = HistoryQuery(forward=True, limit=10, ordering=Ordering.DIGEST)
    found = from_arrow(SparkPages(table).page(q, (T0, by_digest[1].digest), 11), include_data=False)
    assert [m.digest for m in found] == [r.digest for r in by_digest[2:]]
    back = HistoryQuery(forward=False, limit=10, ordering=Ordering.DIGEST)
    found = from_arrow(SparkPages(table).page(back, (T0, by_digest[3].digest), 11), include_data=False)
    assert [m.digest for m in found] == [r.digest for r in by_digest[:3][::-1]]


def test_a_cursor_on_another_day_prunes_nothing_it_should_not(table):
    rows = [row(i, ts=T0 + i * DAY_NS) for i in range(4)]  # one row a day
    table.append(to_arrow(rows))
    q = HistoryQuery(forward=True, limit=10)
    assert keys(SparkPages(table).page(q, (rows[1].timestamp, rows[1].message_hash), 11)) == [
        (r.timestamp, r.message_hash) for r in rows[2:]
    ]
    back = HistoryQuery(forward=False, limit=10)
    assert keys(SparkPages(table).page(back, (rows[2].timestamp, rows[2].message_hash), 11)) == [
        (r.timestamp, r.message_hash) for r in rows[:2][::-1]
    ]
    # A row at midnight exactly: a cursor at that timestamp keeps its ties
    # on both sides of the day boundary.
    midnight = schema.day_start_ns(schema.day_of_ns(rows[3].timestamp))
    at_midnight = row(60, ts=midnight)
    table.append(to_arrow([at_midnight]))
    edge = (midnight, at_midnight.message_hash)
    assert keys(SparkPages(table).page(back, (midnight, b"\xff" * 32), 11))[:2] == [
        edge,
        (rows[2].timestamp, rows[2].message_hash),
    ]
    assert keys(SparkPages(table).page(back, (midnight, b""), 11))[0] == (rows[2].timestamp, rows[2].message_hash)
    assert keys(SparkPages(table).page(q, (midnight, b""), 11))[0] == edge
    assert keys(SparkPages(table).page(q, (midnight - 1, b"\xff" * 32), 11))[0] == edge


def test_timestamp_of_hash(table):
    r = row(7)
    table.append(to_arrow([r]))
    assert SparkPages(table).timestamp_of_hash(r.message_hash, None) == r.timestamp
    assert SparkPages(table).timestamp_of_hash(r.message_hash, PUBSUB) == r.timestamp
    assert SparkPages(table).timestamp_of_hash(r.message_hash, "/waku/2/rs/16/33") is None
    assert SparkPages(table).timestamp_of_hash(row(8).message_hash, None) is None


@pytest.mark.parametrize("in_process", [False, True], ids=["engine", "in-process"])
def test_delete_where_and_replace_where(table, in_process):
    """Either writer of a window replacement (the engine, or this process
    for a table a node owns) gives the same table."""
    table.bulk_in_process = in_process
    rows = [row(i) for i in range(6)] + [row(i, topic=OTHER) for i in range(6, 9)]
    table.append(to_arrow(rows))
    table.delete_where(f"timestamp < {T0 + 2 * SECOND}")
    assert table.count() == 7
    # The window [2 s, 5 s) of TOPIC becomes one row; OTHER and later rows stay.
    table.replace_where(to_arrow([row(3)]), T0 + 2 * SECOND, T0 + 5 * SECOND, [TOPIC])
    left = SparkPages(table).page(HistoryQuery(forward=True, limit=100), None, 101)
    payloads = [m.message.payload for m in from_arrow(left)]
    assert payloads == [b"payload-3", b"payload-5", b"payload-6", b"payload-7", b"payload-8"]
    table.replace_where(to_arrow([]), T0, T0 + DAY_NS, [OTHER])
    assert table.count() == 2


def test_commit_conflict_is_classified_once_by_the_engine():
    class SparkRuntimeException(Exception):
        pass

    conflict = commit_conflict(SparkRuntimeException("Failed to commit transaction: 0"))
    assert isinstance(conflict, CommitConflict)
    assert isinstance(conflict.__cause__, SparkRuntimeException)

    class DeltaError(Exception):
        def getCondition(self):
            return "DELTA_CONCURRENT_APPEND.WITH_PARTITION_HINT"

    assert isinstance(commit_conflict(DeltaError("files were added")), CommitConflict)
    assert commit_conflict(ValueError("no such column: day")) is None


def test_concurrent_merges_surface_as_commit_conflicts(engine, table):
    """Two writers MERGE into the same day without retrying: the losers see
    CommitConflict (nothing else), the winners' rows land once."""
    errors: list[BaseException] = []
    conflicts = 0
    deadline = time.monotonic() + 120
    base = 0
    while conflicts == 0 and time.monotonic() < deadline:
        batches = [to_arrow([row(i) for i in range(base + k * 20, base + k * 20 + 20)]) for k in range(2)]
        base += 40
        day = [schema.day_of_ns(T0)]

        def merge(batch, day=day):
            try:
                table.merge_new(batch, key="muid", partition=schema.MESSAGES_PARTITION, partition_values=day)
            except Exception as exc:  # examined below
                errors.append(exc)

        threads = [threading.Thread(target=merge, args=(b,)) for b in batches]
        [t.start() for t in threads]
        [t.join() for t in threads]
        assert all(isinstance(e, CommitConflict) for e in errors), errors
        conflicts = len(errors)
    assert conflicts > 0, "no conflict within the deadline"
    # Each round adds 40 rows minus the batches that lost: nothing twice.
    assert table.count() == base - 20 * conflicts


def test_replace_where_writes_files_of_bounded_size(table, monkeypatch, tmp_path):
    """A window replacement writes files of about REPLACE_TARGET_FILE_BYTES
    (checked a batch read at a time), not one file per day and core
    holding the whole window: the engine buffers each open file in memory
    until it is written."""
    import json
    import os
    from pathlib import Path

    import pyarrow.parquet as pq

    from wakustore.storage import table as table_module

    target = 1024 * 1024
    monkeypatch.setattr(table_module, "REPLACE_TARGET_FILE_BYTES", target)
    # Incompressible payloads, so that file sizes follow the rows; staged
    # as the import stages a window, in small row groups (the batches read).
    rows = [
        Row.build(PUBSUB, WakuMessage(payload=os.urandom(300), content_topic=TOPIC, timestamp=T0 + i * SECOND // 8), T0)
        for i in range(40_000)
    ]
    staged = tmp_path / "staged"
    staged.mkdir()
    pq.write_table(to_arrow(rows), staged / "rows.parquet", row_group_size=1000)
    table.replace_where(str(staged), T0, T0 + 7200 * SECOND, [TOPIC])
    log = sorted(Path(table.uri, "_delta_log").glob("*.json"))[-1]
    sizes = [json.loads(line)["add"]["size"] for line in log.read_text().splitlines() if '"add"' in line]
    assert sum(sizes) > 40_000 * 300  # the window's 12 MB of payloads are all there
    assert len(sizes) >= 6, sizes
    assert max(sizes) <= 3 * target, sizes
    assert table.count() == 40_000


def test_the_log_is_trimmed_behind_its_checkpoints_and_every_reader_still_follows(engine, tmp_path):
    import os

    from wakustore.protocols.store_query import validate_v3
    from wakustore.storage.reader import TableReader

    table = DeltaTableRef(engine, str(tmp_path / "trimmed"))
    table.ensure(schema.MESSAGES, schema.MESSAGES_PARTITION, "messages")
    log_dir = tmp_path / "trimmed" / "_delta_log"
    behind = TableReader(table.uri)
    behind.committed()  # holds an early version through the trim
    rows = [
        Row.build("/waku/2/rs/16/1", WakuMessage(b"m%d" % i, "/a/1/t/proto", timestamp=T0 + i), T0) for i in range(30)
    ]
    for row in rows[:25]:  # the engine checkpoints every 10 commits
        table.append(to_arrow([row]))
    assert (log_dir / "_last_checkpoint").exists()
    commits = sorted(n for n in os.listdir(log_dir) if n.endswith(".json"))
    time.sleep(1.2)
    removed = table.trim_log("interval 1 second")
    left = sorted(n for n in os.listdir(log_dir) if n.endswith(".json"))
    assert removed >= 10 and len(left) < len(commits) and left[-1] >= commits[-1]
    oldest = min(int(n[:20]) for n in left)
    assert not [n for n in os.listdir(log_dir) if n.endswith(".crc") and int(n[:20]) < oldest]
    assert table.trim_log("interval 1 second") == 0  # nothing more to trim
    for row in rows[25:]:  # the engine goes on committing
        table.append(to_arrow([row]))
    assert table.count() == 30
    behind.refresh()  # from before the trim: reloads from the checkpoint
    fresh = TableReader(table.uri)
    for reader in (behind, fresh):
        assert (
            len(
                reader.page(
                    validate_v3(
                        pubsub_topic="/waku/2/rs/16/1",
                        content_topics=["/a/1/t/proto"],
                        time_start=None,
                        time_end=None,
                        message_hashes=[],
                        cursor=None,
                        forward=True,
                        limit=100,
                        include_data=False,
                    ),
                    None,
                    101,
                )
            )
            == 30
        )
