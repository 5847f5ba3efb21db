import datetime as dt
import os
import time
from pathlib import Path

import pytest

from wakustore.protocols.message import WakuMessage
from wakustore.storage import maintenance
from wakustore.storage.maintenance import RetentionError, RetentionPolicy
from wakustore.storage.message_store import MessageStore
from wakustore.storage.schema import day_start_ns
from wakustore.storage.table import DeltaTableRef

PUBSUB = "/waku/2/rs/16/32"
DAY = 86_400 * 10**9
DAY0 = day_start_ns(dt.date(2026, 10, 1))


@pytest.mark.parametrize(
    ("text", "policy"),
    [
        ("time:2592000", RetentionPolicy(max_age_s=2592000)),
        ("capacity:1000", RetentionPolicy(max_messages=1000)),
        ("size:50GB", RetentionPolicy(max_bytes=50 * 1024**3)),
        ("size:512kb", RetentionPolicy(max_bytes=512 * 1024)),
        ("time:60;capacity:5;size:1MB", RetentionPolicy(60, 5, 1024**2)),
    ],
)
def test_retention_policies_parse_like_nwaku(text, policy):
    assert RetentionPolicy.parse(text) == policy


@pytest.mark.parametrize("text", ["", "time:", "time:-1", "capacity:x", "size:10parsecs", "age:10", "time:0"])
def test_bad_retention_policies_are_refused(text):
    with pytest.raises(RetentionError):
        RetentionPolicy.parse(text)


@pytest.fixture
def filled(engine, tmp_path):
    store = MessageStore(DeltaTableRef(engine, str(tmp_path / "m")), tmp_path / "wal")
    store.open()
    # 10 days, 6 messages a day at 0h, 4h, ... 20h; flushed per day (several files).
    for day in range(10):
        store.put(
            [
                (
                    PUBSUB,
                    WakuMessage(
                        b"d%d-%d" % (day, h), "/app/1/c/proto", timestamp=DAY0 + day * DAY + h * 4 * 3600 * 10**9
                    ),
                    0,
                )
                for h in range(6)
            ]
        )
        store.flush()
    yield store
    store.close()


def test_time_retention_drops_old_days_and_cuts_the_boundary_day(filled):
    now = DAY0 + 10 * DAY
    result = maintenance.apply_retention(filled.table, RetentionPolicy(max_age_s=int(3.5 * 86400)), now)
    assert result.rows_before == 60
    cutoff = now - int(3.5 * DAY)
    remaining = filled.table.scalar("SELECT min(timestamp) FROM {table}")
    assert remaining >= cutoff
    assert result.rows_after == 21  # 3 whole days + the 3 messages at/after 12h of the boundary day


def test_capacity_retention_keeps_the_newest(filled):
    result = maintenance.apply_retention(filled.table, RetentionPolicy(max_messages=15), DAY0 + 10 * DAY)
    assert result.rows_after == 15
    assert filled.table.scalar("SELECT min(timestamp) FROM {table}") == DAY0 + 7 * DAY + 3 * 4 * 3600 * 10**9


def test_retention_never_passes_the_keep_from_guard(filled):
    now = DAY0 + 10 * DAY
    result = maintenance.apply_retention(
        filled.table, RetentionPolicy(max_age_s=86400), now, keep_from_ns=DAY0 + 5 * DAY
    )
    assert result.rows_after == 30


def test_size_retention_drops_oldest_days(filled):
    sizes = maintenance.day_sizes(filled.table)
    budget = sum(sizes.values()) // 2
    maintenance.apply_retention(filled.table, RetentionPolicy(max_bytes=budget), DAY0 + 10 * DAY)
    assert sum(maintenance.day_sizes(filled.table).values()) <= budget
    assert maintenance.count_rows(filled.table) > 0


def test_compaction_rewrites_finished_days_into_one_file_and_keeps_rows(filled):
    filled.put([(PUBSUB, WakuMessage(b"extra", "/app/1/c/proto", timestamp=DAY0 + 5), 0)])
    filled.flush()
    before = maintenance.stats(filled.table)
    maintenance.compact(filled.table, today=dt.date(2026, 10, 11))
    after = maintenance.stats(filled.table)
    assert after.rows == before.rows == 61
    assert after.files <= after.days
    assert filled.table.count() == 61
    # still queryable and mergeable after delta-rs rewrote it
    filled.put([(PUBSUB, WakuMessage(b"later", "/app/1/c/proto", timestamp=DAY0 + 6), 0)])
    filled.flush()
    assert filled.table.count() == 62
    maintenance.checkpoint(filled.table)
    assert maintenance.vacuum(filled.table, retention_hours=0) > 0
    assert filled.table.count() == 62


def test_vacuum_removes_files_no_commit_named_once_older_than_the_retention(filled):
    """A file in a day partition that no commit names (what an import that
    crashed between staging and commit leaves) goes once it is older than
    the retention; a newer one may be a write in flight and stays."""
    root = Path(filled.table.uri.removeprefix("file://"))
    day_dir = next(root.glob("day=*"))
    orphan, fresh = day_dir / "orphan-import.parquet", day_dir / "in-flight.parquet"
    orphan.write_bytes(b"PAR1 staged by an import that crashed")
    fresh.write_bytes(b"PAR1 being written")
    old = time.time() - 3 * 86400
    os.utime(orphan, (old, old))
    rows = filled.table.count()
    assert maintenance.vacuum(filled.table, retention_hours=24) >= 1
    assert not orphan.exists() and fresh.exists()
    assert filled.table.count() == rows


def test_the_maintenance_routine_retains_behind_the_guard_compacts_and_measures(filled):
    # A buffered message is committed first; retention stops at the guard;
    # finished days end as one file each; the stats describe the result.
    filled.put([(PUBSUB, WakuMessage(b"buffered", "/app/1/c/proto", timestamp=DAY0 + 9 * DAY + 1), 0)])
    now = DAY0 + 10 * DAY
    result = maintenance.run_maintenance(filled, RetentionPolicy(max_age_s=86400), now, keep_from_ns=DAY0 + 5 * DAY)
    assert result.retention.cutoff_ns == DAY0 + 5 * DAY
    assert result.retention.rows_before == 61 and result.retention.rows_after == 31
    assert result.compaction["days_rewritten"] == 1  # day 9: its flush and the buffered message
    assert result.stats.rows == 31 and result.stats.files == result.stats.days == 5
    assert result.stats.oldest_ns == DAY0 + 5 * DAY
    # Without a policy it only compacts and measures.
    again = maintenance.run_maintenance(filled, None, now)
    assert again.retention is None and again.stats.rows == 31


def test_the_maintenance_routine_deletes_what_compaction_removed_after_the_vacuum_retention(filled):
    """Without a vacuum a node's disk keeps each day twice, as written and
    compacted. The files a run's compaction removed stay while younger than
    the retention (a reader of an older version may still open them) and
    go at a run after it; the table keeps every row."""
    root = Path(filled.table.uri.removeprefix("file://"))

    def data_files() -> set[Path]:
        return {p for p in root.rglob("*.parquet") if "_delta_log" not in p.parts}

    # A second file on three days, which compaction then rewrites.
    filled.put(
        [(PUBSUB, WakuMessage(b"late-%d" % d, "/app/1/c/proto", timestamp=DAY0 + d * DAY + 5), 0) for d in (2, 3, 4)]
    )
    filled.flush()
    written = data_files()
    kept = maintenance.run_maintenance(filled, None, DAY0 + 10 * DAY, vacuum_hours=1)
    assert kept.compaction["days_rewritten"] == 3
    assert kept.vacuumed == 0 and written < data_files()
    live = (data_files() - written) | {p for p in written if not any(f"day=2026-10-0{d}" in str(p) for d in (3, 4, 5))}
    gone = maintenance.run_maintenance(filled, None, DAY0 + 10 * DAY, vacuum_hours=0)
    assert gone.vacuumed == 6  # two files on each of the three days
    assert data_files() == live
    assert filled.table.count() == 63 and gone.stats.rows == 63


def test_rewrite_lock_lets_one_holder_rewrite_at_a_time(tmp_path):
    """Another process holding the fleet's rewrite lock: a node's try
    (wait=False) gives up at once, and its wait ends when the other lets go."""
    import subprocess
    import sys
    import time

    from wakustore.storage.maintenance import rewrite_lock
    from wakustore.storage.table import DeltaTableRef

    table = DeltaTableRef(None, str(tmp_path / "messages"))
    with rewrite_lock(table):
        pass  # makes the lock file
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, sys, time; f = open(sys.argv[1], 'a+b'); fcntl.flock(f, fcntl.LOCK_EX); "
            "print('held', flush=True); time.sleep(1.5)",
            str(tmp_path / "messages_locks" / "rewrite.lock"),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with rewrite_lock(table, wait=False) as held:
            assert held is False
        started = time.monotonic()
        with rewrite_lock(table) as held:
            assert held is True
            assert time.monotonic() - started > 0.5
    finally:
        holder.kill()
        holder.wait()


def test_a_compacted_day_is_not_rewritten_again_and_late_rows_are_merged_apart(engine, tmp_path, monkeypatch):
    """A finished day is rewritten into sorted files once. The next runs
    leave those files as they are (a status.prod day is ~1 GB in two or
    more files; rewriting it at every run rewrote every day every hour);
    rows that arrive after it are merged among themselves once they are
    two files, and the day keeps every row."""
    from wakustore.storage import day_rewrite, window_files

    # Files of one 16-row chunk each, so that a small day makes several.
    monkeypatch.setattr(maintenance, "ROW_GROUP_ROWS", 16)
    monkeypatch.setattr(day_rewrite, "CHUNK_ROWS", 16)
    monkeypatch.setattr(day_rewrite, "TARGET_FILE_BYTES", 1)
    monkeypatch.setattr(maintenance, "SMALL_SORTED_BYTES", 0)
    store = MessageStore(DeltaTableRef(engine, str(tmp_path / "m")), tmp_path / "wal")
    store.open()
    try:

        def put(tag: bytes, count: int) -> None:
            store.put(
                [
                    (PUBSUB, WakuMessage(tag + b"%d" % i, "/app/1/c/proto", timestamp=DAY0 + i * 10**9), 0)
                    for i in range(count)
                ]
            )
            store.flush()

        def day_files() -> set[str]:
            actions = maintenance._actions(store.table)
            return set(actions["path"])

        put(b"a", 50)
        put(b"b", 50)
        assert maintenance.compact(store.table, today=dt.date(2026, 10, 2)) == {"days_rewritten": 1}
        sorted_files = day_files()
        assert len(sorted_files) == 7 and all(window_files.is_sorted_file(p) for p in sorted_files)
        assert maintenance.compact(store.table, today=dt.date(2026, 10, 2)) == {"days_rewritten": 0}
        assert day_files() == sorted_files
        put(b"late-1-", 1)  # one late file: read as it is
        assert maintenance.compact(store.table, today=dt.date(2026, 10, 2)) == {"days_rewritten": 0}
        put(b"late-2-", 1)  # two: merged, and only they
        assert maintenance.compact(store.table, today=dt.date(2026, 10, 2)) == {"days_rewritten": 1}
        after = day_files()
        assert sorted_files < after and len(after - sorted_files) == 1
        assert all(window_files.is_sorted_file(p) for p in after)
        assert store.table.count() == 102
    finally:
        store.close()
