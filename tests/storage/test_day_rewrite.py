"""A finished day rewritten by an external merge sort: the same rows, in
the reader's order, in small row groups, committed as one transaction
that leaves other writers' files alone."""

import datetime as dt
import os
import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake

from wakustore.protocols.message import WakuMessage
from wakustore.storage import day_rewrite, schema
from wakustore.storage.rows import Row, to_arrow

DAY = dt.date(2026, 3, 1)
T0 = schema.day_start_ns(DAY)
TOPICS = [f"/app/1/t{i}/proto" for i in range(7)]
PUBSUBS = ["/waku/2/rs/16/1", "/waku/2/rs/16/0"]


def rows(n: int, seed: int) -> pa.Table:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        # Many rows share a timestamp (ties keep their order, any order is right).
        ts = T0 + rng.randrange(200) * 10**9
        message = WakuMessage(
            payload=os.urandom(rng.randrange(10, 400)),
            content_topic=rng.choice(TOPICS),
            timestamp=ts,
            meta=b"m%d" % seed,
        )
        out.append(Row.build(rng.choice(PUBSUBS), message, ts))
    return to_arrow(out)


def files_of(uri: str) -> list[str]:
    return sorted(pa.table(DeltaTable(uri).get_add_actions(flatten=True)).column("path").to_pylist())


@pytest.fixture()
def day_table(tmp_path):
    uri = str(tmp_path / "messages")
    for seed in range(12):  # ingest files: unsorted, one row group each
        write_deltalake(
            uri, rows(150, seed).cast(schema.MESSAGES), mode="append", partition_by=[schema.MESSAGES_PARTITION]
        )
    return uri


def test_a_day_is_rewritten_sorted_in_small_row_groups_with_the_same_rows(day_table, monkeypatch):
    # Runs and chunks far smaller than the day: many runs, chunks spanning run row groups.
    monkeypatch.setattr(day_rewrite, "RUN_BYTES", 20_000)
    monkeypatch.setattr(day_rewrite, "RUN_GROUP_ROWS", 37)
    monkeypatch.setattr(day_rewrite, "CHUNK_ROWS", 101)
    before = DeltaTable(day_table).to_pyarrow_table().sort_by("message_hash")
    old = files_of(day_table)

    assert day_rewrite.rewrite_day(day_table, DAY, row_group_rows=64)

    table = DeltaTable(day_table)
    after = table.to_pyarrow_table()
    assert after.sort_by("message_hash").equals(before)
    new = files_of(day_table)
    assert not set(new) & set(old)
    for path in new:
        file = pq.ParquetFile(os.path.join(day_table, path))
        assert {file.metadata.row_group(g).num_rows for g in range(file.metadata.num_row_groups - 1)} <= {64}
        group = file.metadata.row_group(0)
        blooms = {
            group.column(c).path_in_schema
            for c in range(group.num_columns)
            if group.column(c).bloom_filter_offset is not None
        }
        assert blooms == {"muid", "message_hash"}  # what engines skip row groups by in a lookup
        keys = file.read(columns=["pubsub_topic", "content_topic", "timestamp"])
        ordered = list(zip(*(keys.column(c).to_pylist() for c in keys.column_names)))
        assert ordered == sorted(ordered)
    # The staging directory beside the table is gone.
    staging = day_table + "_staging"
    assert not os.path.exists(staging) or not os.listdir(staging)


def test_a_day_of_one_file_is_left_alone(tmp_path):
    uri = str(tmp_path / "one")
    write_deltalake(uri, rows(50, 1).cast(schema.MESSAGES), mode="append", partition_by=[schema.MESSAGES_PARTITION])
    version = DeltaTable(uri).version()
    assert not day_rewrite.rewrite_day(uri, DAY, row_group_rows=64)
    assert DeltaTable(uri).version() == version


def test_a_file_another_writer_adds_during_the_rewrite_stays(day_table, monkeypatch):
    """The transaction removes the files it read and adds its own: a file
    appended to the day meanwhile is neither lost nor doubled."""
    late = rows(20, 99)
    write_runs = day_rewrite._write_runs

    def runs_then_append(*args):
        out = write_runs(*args)
        write_deltalake(day_table, late.cast(schema.MESSAGES), mode="append", partition_by=[schema.MESSAGES_PARTITION])
        return out

    monkeypatch.setattr(day_rewrite, "_write_runs", runs_then_append)
    before = DeltaTable(day_table).to_pyarrow_table().num_rows
    assert day_rewrite.rewrite_day(day_table, DAY, row_group_rows=64)
    hashes = DeltaTable(day_table).to_pyarrow_table().column("message_hash").to_pylist()
    assert len(hashes) == before + late.num_rows == len(set(hashes))
