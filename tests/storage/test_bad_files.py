"""What every background reader of the table does with a bad data file
(damaged, cut short, not a file, missing): it skips it and carries on.

A table of two finished days (three ingest files each, one content topic
a file, their key index built) is written once; each case copies it and
damages one file one way. Compaction rewrites the rest of the file's day
and never the file itself (its damage would come out looking like data);
retention drops an expired day whole, bad file included, and leaves a
boundary day holding one as it is; an archive export leaves its rows
out; a start whose newest rows include a file with neither its data nor
its index readable fills its hot tier and its key filter around it.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from wakustore.protocols.message import WakuMessage
from wakustore.storage import maintenance, schema
from wakustore.storage.index_files import IndexDirectory
from wakustore.storage.message_store import MessageStore, StoreConfig
from wakustore.storage.table import DeltaTableRef

DAY = schema.NS_PER_DAY
PUBSUB = "/waku/2/rs/16/32"
PER_FILE = 10
DAMAGES = ("flipped", "truncated", "directory", "deleted")  # see tests/conftest.py
OLDER = [f"/bad/1/older-{n}/proto" for n in range(3)]
NEWER = [f"/bad/1/newer-{n}/proto" for n in range(3)]


@pytest.fixture(scope="module")
def written(engine, tmp_path_factory):
    """(data dir, the first timestamp of each topic) of the table above: the
    older day three days back, the newer two."""
    data = tmp_path_factory.mktemp("bad-table") / "data"
    now = time.time_ns()
    store = _store(engine, data)
    first: dict[str, int] = {}
    for days_back, topics in ((3, OLDER), (2, NEWER)):
        for n, topic in enumerate(topics):
            first[topic] = start = now - days_back * DAY + n * 10**9
            store.put(
                [
                    (PUBSUB, WakuMessage(os.urandom(400), topic, timestamp=start + i * 10**6), start)
                    for i in range(PER_FILE)
                ]
            )
            store.flush()
    store.reader.index_now()
    store.close()
    return data, first


def _store(engine, data: Path) -> MessageStore:
    store = MessageStore(
        DeltaTableRef(engine, str(data / "tables" / "messages")),
        data / "wal" / "messages",
        index_directory=data / "index" / "messages",
    )
    store.open()
    return store


def _copy(written, tmp_path: Path) -> Path:
    data = tmp_path / "data"
    shutil.copytree(written[0], data)
    return data


def _files(data: Path) -> dict[str, str]:
    """Each file of the table (as the log names it) -> its day."""
    actions = pa.table(DeltaTable(str(data / "tables" / "messages")).get_add_actions(flatten=True)).to_pydict()
    return {path: str(day) for path, day in zip(actions["path"], actions["partition.day"])}


def _file_of(data: Path, topic: str) -> str:
    uri = data / "tables" / "messages"
    return next(
        p for p in _files(data) if pq.read_table(uri / p, columns=["content_topic"]).column(0)[0].as_py() == topic
    )


def _named(caplog, name: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and name in r.getMessage()]


@pytest.mark.parametrize("how", DAMAGES)
def test_compaction_rewrites_the_rest_of_the_day_and_never_the_bad_file(written, engine, tmp_path, caplog, damage, how):
    data = _copy(written, tmp_path)
    victim = _file_of(data, OLDER[1])
    damage(data / "tables" / "messages" / victim, how)
    caplog.set_level(logging.INFO)
    store = _store(engine, data)
    try:
        before = _files(data)
        result = maintenance.run_maintenance(store, None, time.time_ns())
        after = _files(data)
        bad = store.reader.bad_files()
    finally:
        store.close()
    day = before[victim]
    assert result.compaction == {"days_rewritten": 2}
    # The bad file stays as it was; the day's two others are one sorted file.
    assert victim in after
    rest = [p for p, d in after.items() if d == day and p != victim]
    assert len(rest) == 1 and "part-sorted-" in rest[0]
    topics = set(pq.read_table(data / "tables" / "messages" / rest[0], columns=["content_topic"]).column(0).to_pylist())
    assert topics == {OLDER[0], OLDER[2]}
    location = str(data / "tables" / "messages" / victim)
    assert list(bad) == [location]
    assert any("leaves 1 data files that cannot be read" in line for line in _named(caplog, victim))


@pytest.mark.parametrize("how", DAMAGES)
def test_retention_drops_an_expired_day_with_a_bad_file_and_leaves_a_boundary_day_holding_one(
    written, engine, tmp_path, caplog, damage, how
):
    data = _copy(written, tmp_path)
    _, first = written
    older, newer = _file_of(data, OLDER[0]), _file_of(data, NEWER[1])
    damage(data / "tables" / "messages" / older, how)
    damage(data / "tables" / "messages" / newer, how)
    caplog.set_level(logging.INFO)
    now = time.time_ns()
    store = _store(engine, data)
    try:
        # The cutoff inside the bad file's rows on the newer day: the older
        # day goes whole; the newer one's cut would rewrite the bad file.
        policy = maintenance.RetentionPolicy(max_age_s=(now - first[NEWER[1]] - 5 * 10**6) // 10**9)
        result = maintenance.run_maintenance(store, policy, now)
        after = _files(data)
    finally:
        store.close()
    assert result.retention is not None and result.retention.cutoff_ns is not None
    assert older not in after and not any(d == str(schema.day_of_ns(first[OLDER[0]])) for d in after.values())
    assert newer in after and len([d for d in after.values() if d == str(schema.day_of_ns(first[NEWER[0]]))]) >= 2
    assert any("until the whole day expires" in line for line in _named(caplog, newer))


@pytest.mark.parametrize("how", DAMAGES)
def test_an_export_leaves_the_rows_of_a_bad_file_out_and_names_it(written, engine, tmp_path, caplog, damage, how):
    data = _copy(written, tmp_path)
    _, first = written
    victim = _file_of(data, NEWER[2])
    damage(data / "tables" / "messages" / victim, how)
    caplog.set_level(logging.INFO)
    store = _store(engine, data)
    try:
        start = first[NEWER[0]]
        tables = list(store.stream_window_tables(start, start + DAY // 2, NEWER))
    finally:
        store.close()
    exported = {t for table in tables for t in table.column("content_topic").to_pylist()}
    assert exported == {NEWER[0], NEWER[1]} and sum(t.num_rows for t in tables) == 2 * PER_FILE
    assert any("left out of the export" in line for line in _named(caplog, victim))


# Bytes flipped in a file whose index is gone too cannot be told from data
# (the CRC-32 the index held is gone with it): not a case here.
@pytest.mark.parametrize("how", [d for d in DAMAGES if d != "flipped"])
def test_a_start_fills_its_hot_tier_and_key_filter_around_a_file_without_data_or_index(
    written, engine, tmp_path, caplog, damage, how
):
    """The newest file unreadable and its index gone: the store opens, its
    hot tier is complete from after that file's rows, its key filter is
    filled from the other files, and it takes puts (a duplicate of a
    readable file's message is still found)."""
    data = _copy(written, tmp_path)
    victim, older, oldest = (_file_of(data, topic) for topic in reversed(NEWER))
    keep = pq.read_table(data / "tables" / "messages" / oldest).to_pylist()[0]
    damage(data / "tables" / "messages" / victim, how)
    os.unlink(IndexDirectory(data / "index" / "messages").path_of(victim))
    duplicate = WakuMessage(keep["payload"], keep["content_topic"], timestamp=keep["timestamp"], meta=keep["meta"])
    caplog.set_level(logging.INFO)
    store = MessageStore(
        DeltaTableRef(engine, str(data / "tables" / "messages")),
        data / "wal" / "messages",
        # A hot tier whose window holds both days: the victim is among its newest rows.
        StoreConfig(hot_window_s=4 * 86_400),
        index_directory=data / "index" / "messages",
    )
    try:
        store.open()
        assert store.writes.filter_ready.wait(30)
        hot_from = store.hot.start_ns
        newest = max(pq.read_table(data / "tables" / "messages" / older).column("timestamp").to_pylist())
        fresh = WakuMessage(b"new", NEWER[0], timestamp=time.time_ns())
        taken = store.put([(PUBSUB, fresh, time.time_ns()), (PUBSUB, duplicate, time.time_ns())])
        bad = store.reader.bad_files()
    finally:
        store.close()
    assert hot_from is not None and hot_from > newest
    assert taken.accepted == 1 and taken.duplicates == 1
    assert list(bad) == [str(data / "tables" / "messages" / victim)]


@pytest.mark.parametrize("how", DAMAGES)
def test_a_window_replace_over_a_day_holding_a_bad_file_is_refused_and_commits_nothing(
    written, engine, tmp_path, damage, how
):
    """It would rewrite the day's files without the window's rows: a bad
    one's other rows would be lost, or come out of its damage looking like data."""
    from wakustore.storage.reader import DataFileUnreadable
    from wakustore.storage.rows import Row

    data = _copy(written, tmp_path)
    _, first = written
    victim = _file_of(data, NEWER[1])
    damage(data / "tables" / "messages" / victim, how)
    before = _files(data)
    start = first[NEWER[0]]
    store = _store(engine, data)
    try:
        replacement = Row.build(PUBSUB, WakuMessage(b"archived", NEWER[0], timestamp=start), start)
        with pytest.raises(DataFileUnreadable, match="cannot be read"):
            store.replace_window(start, start + 10**9, [NEWER[0]], [replacement])
    finally:
        store.close()
    assert _files(data) == before
