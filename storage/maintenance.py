"""Retention and table maintenance: what keeps the table small and fast.

Retention follows nwaku's ``--store-message-retention-policy`` syntax:
``time:<seconds>``, ``capacity:<messages>``, ``size:<n><unit>``, several
joined by ``;``. Whole day partitions are dropped where a policy allows.

Layout (engine-notes, measured on this machine kind): small files kill
latency (2,000 files in a day: 518 ms per page; compacted: 40 ms), and the
best layout found is one file per finished day sorted by (pubsub_topic,
content_topic, timestamp) with small row groups, page statistics and
Parquet bloom filters on ``muid`` and ``message_hash``. Finished days are
rewritten that way once; the current day is bin-packed whenever it passes
:data:`COMPACT_DAY_FILES` files. In embedded mode this goes through
delta-rs (Sail rejects OPTIMIZE/VACUUM); on a cluster through Delta SQL.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import logging
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Protocol

import pyarrow as pa

from wakustore import allocator
from wakustore.storage import day_rewrite, dialect, schema, window_files
from wakustore.storage.staging import is_local
from wakustore.storage.table import DeltaTableRef

log = logging.getLogger(__name__)

DEFAULT_RETENTION = "time:2592000"  # 30 days, nwaku's default

# Compact the current day once it holds this many files (engine-notes:
# ~50-100 files per day is where latency starts to climb).
COMPACT_DAY_FILES = 50

# Rows per row group in rewritten days. The table reader's key index reads
# whole row groups with pyarrow for the rows of a page, payloads included
# (~1 KB a message in bench store): 256 rows is ~0.5 ms a row group, and
# pages p50 2.6 ms instead of 7 with 8,192 rows (bench store, 200k
# messages; BENCHMARKS.md). DataFusion pages did not change between 1,024
# and 8,192 rows.
ROW_GROUP_ROWS = 256
BLOOM_FPP = 0.01
# Compacted files in Snappy, not Zstandard: payloads are mostly ciphertext,
# which neither shrinks, and a page or hash lookup decompresses every
# column chunk of the row groups it reads. A 256-row row group of the
# benchmark's messages (random payloads, 310 kB) reads in 0.24 ms instead
# of 0.38 for a file 2% larger (pyarrow 22, this machine); Snappy is what
# every Parquet reader, a Spark cluster's included, reads.
COMPACTED_CODEC: Final = "SNAPPY"

# Keep removed files a week for time travel and readers mid-query.
DEFAULT_VACUUM_HOURS = 168

_UNITS = {
    "b": 1,
    "kb": 1024,
    "kib": 1024,
    "mb": 1024**2,
    "mib": 1024**2,
    "gb": 1024**3,
    "gib": 1024**3,
    "tb": 1024**4,
    "tib": 1024**4,
}
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([a-z]*)")


class RetentionError(ValueError):
    """A retention policy string that does not parse."""


class FileHealth(Protocol):
    """What retention and compaction ask about the table's data files
    (:class:`~wakustore.storage.reader.TableReader` answers): a bad file
    (damaged, missing, unreadable) is never rewritten, and never keeps the
    rest of the table from its maintenance."""

    def check_files(self, paths: Sequence[str], whole: bool = True) -> dict[str, str]: ...

    def report_bad(self, path: str, exc: BaseException) -> object: ...


@dataclass(frozen=True, slots=True)
class RetentionPolicy:
    max_age_s: int | None = None
    max_messages: int | None = None
    max_bytes: int | None = None

    @classmethod
    def parse(cls, text: str) -> RetentionPolicy:
        """Parse ``time:S;capacity:N;size:50GB`` (any subset, any order).

        Size units are binary multiples (KB = 1024 bytes), case-insensitive;
        a bare number is bytes.
        """
        age = count = size = None
        for part in filter(None, (p.strip() for p in text.split(";"))):
            kind, _, value = part.partition(":")
            kind, value = kind.strip().lower(), value.strip().lower()
            try:
                if kind == "time":
                    age = _positive(int(value))
                elif kind == "capacity":
                    count = _positive(int(value))
                elif kind == "size":
                    match = _SIZE.fullmatch(value)
                    if match is None or match.group(2) not in _UNITS:
                        raise ValueError(value)
                    size = _positive(int(float(match.group(1)) * _UNITS[match.group(2)]))
                else:
                    raise RetentionError(f"unknown retention policy {kind!r} (time, capacity or size)")
            except ValueError as exc:
                if isinstance(exc, RetentionError):
                    raise
                raise RetentionError(f"bad value in retention policy {part!r}") from None
        if age is None and count is None and size is None:
            raise RetentionError(f"empty retention policy {text!r}")
        return cls(age, count, size)


def _positive(value: int) -> int:
    if value <= 0:
        raise ValueError(value)
    return value


@dataclass(frozen=True, slots=True)
class RetentionResult:
    cutoff_ns: int | None
    rows_before: int
    rows_after: int


def apply_retention(
    table: DeltaTableRef,
    policy: RetentionPolicy,
    now_ns: int,
    keep_from_ns: int | None = None,
    health: FileHealth | None = None,
) -> RetentionResult:
    """Delete what the policy no longer allows, oldest first.

    ``keep_from_ns``: never delete messages at or after this time (the
    archive scheduler passes the end of the last seeded archive, so that
    history leaves the store only once it is in an archive). ``health``:
    see :func:`delete_before`.
    """
    before = count_rows(table)
    cutoff = None
    if policy.max_age_s is not None:
        cutoff = now_ns - policy.max_age_s * 1_000_000_000
    if policy.max_messages is not None and before > policy.max_messages:
        try:
            newest = table.scalar(
                "SELECT min(timestamp) FROM (SELECT timestamp FROM {table} "
                f"ORDER BY timestamp DESC LIMIT {int(policy.max_messages)})"
            )
        except Exception:
            # It reads every file's timestamps: a bad file fails it.
            bad = {} if health is None else health.check_files((_actions(table) or {"path": []})["path"])
            if not bad:
                raise
            log.warning(
                "retention: the capacity limit is not applied this time: %d data files cannot be read (%s)",
                len(bad),
                ", ".join(sorted(bad)),
            )
            newest = None
        if newest is not None:
            cutoff = newest if cutoff is None else max(cutoff, newest)
    if policy.max_bytes is not None:
        size_cutoff = _size_cutoff(table, policy.max_bytes)
        if size_cutoff is not None:
            cutoff = size_cutoff if cutoff is None else max(cutoff, size_cutoff)
    if cutoff is not None and keep_from_ns is not None:
        cutoff = min(cutoff, keep_from_ns)
    if cutoff is not None:
        delete_before(table, cutoff, health)
    return RetentionResult(cutoff, before, count_rows(table) if cutoff is not None else before)


def delete_before(table: DeltaTableRef, cutoff_ns: int, health: FileHealth | None = None) -> None:
    """Delete rows with timestamp < cutoff: whole days, then the boundary day.

    Whole days leave the log without a data file read, bad files (damaged,
    missing) included. The boundary day is rewritten from its files: with
    a bad file among them (``health`` says which) it is left whole this
    time (logged), and goes whole once the cutoff passes its end."""
    day = schema.day_of_ns(cutoff_ns)
    table.delete_where(f"day < DATE'{day.isoformat()}'")
    if cutoff_ns <= schema.day_start_ns(day):
        return
    # Checked first: the engine would read a damaged file that still
    # decodes and write its rows out again, clean-looking.
    bad = {} if health is None else health.check_files(_day_files(table, day))
    if not bad:
        try:
            table.delete_where(f"day = DATE'{day.isoformat()}' AND timestamp < {int(cutoff_ns)}")
            return
        except Exception:
            bad = {} if health is None else health.check_files(_day_files(table, day))
            if not bad:
                raise
    log.warning(
        "retention: %s keeps its rows before the cutoff until the whole day expires: %d of its data files "
        "cannot be read (%s)",
        day,
        len(bad),
        ", ".join(sorted(bad)),
    )


def _day_files(table: DeltaTableRef, day: dt.date) -> list[str]:
    """The data files of ``day`` in the table's latest version, as the log names them."""
    actions = _actions(table) or {"partition.day": [], "path": []}
    return [path for d, path in zip(actions["partition.day"], actions["path"]) if _as_date(d) == day]


def _as_date(value) -> dt.date:
    return value if isinstance(value, dt.date) else dt.date.fromisoformat(str(value))


def _size_cutoff(table: DeltaTableRef, max_bytes: int) -> int | None:
    """The start of the newest day whose removal (with all older) fits the size."""
    days = day_sizes(table)
    total = sum(days.values())
    if total <= max_bytes:
        return None
    for day in sorted(days):
        total -= days[day]
        if total <= max_bytes:
            return schema.day_start_ns(day + dt.timedelta(days=1))
    return None


def count_rows(table: DeltaTableRef) -> int:
    if table.engine.is_embedded:
        actions = _actions(table)
        return int(sum(actions["num_records"])) if actions is not None else 0
    return table.count()


def day_sizes(table: DeltaTableRef) -> dict[dt.date, int]:
    """Bytes of live files per day partition."""
    if not table.engine.is_embedded:
        rows = table.engine.run(
            lambda spark: spark.sql(f"SELECT day, count(*) FROM delta.`{table.uri}` GROUP BY day").collect()
        )
        # Without file listings on a cluster, estimate from rows (1 KiB each).
        return {r[0]: int(r[1]) * 1024 for r in rows}
    actions = _actions(table)
    sizes: dict[dt.date, int] = {}
    if actions is None:
        return sizes
    for day, size in zip(actions["partition.day"], actions["size_bytes"]):
        day = day if isinstance(day, dt.date) else dt.date.fromisoformat(str(day))
        sizes[day] = sizes.get(day, 0) + int(size)
    return sizes


def _actions(table: DeltaTableRef):
    from deltalake import DeltaTable

    try:
        actions = DeltaTable(table.uri).get_add_actions(flatten=True)
    except Exception:  # no table yet
        return None
    return pa.table(actions).to_pydict()


@dataclass(frozen=True, slots=True)
class TableStats:
    version: int
    files: int
    bytes: int
    rows: int
    days: int
    oldest_ns: int | None
    newest_ns: int | None


def stats(table: DeltaTableRef) -> TableStats:
    from deltalake import DeltaTable

    dt_ = DeltaTable(table.uri)
    actions = pa.table(dt_.get_add_actions(flatten=True)).to_pydict()
    mins = [v for v in actions.get("min.timestamp", []) if v is not None]
    maxs = [v for v in actions.get("max.timestamp", []) if v is not None]
    return TableStats(
        version=dt_.version(),
        files=len(actions["path"]),
        bytes=int(sum(actions["size_bytes"])),
        rows=int(sum(actions["num_records"])),
        days=len(set(actions["partition.day"])),
        oldest_ns=min(mins) if mins else None,
        newest_ns=max(maxs) if maxs else None,
    )


def _writer_properties():
    from deltalake import BloomFilterProperties, ColumnProperties, WriterProperties

    bloom = BloomFilterProperties(True, fpp=BLOOM_FPP)
    # Hashes, payloads and the like: no statistics (min/max of random bytes
    # prune nothing, and with 256-row row groups they were most of each
    # footer, which the table reader keeps in memory for every file) and
    # no dictionary (values repeat seldom).
    opaque: dict[str, Any] = {"statistics_enabled": "NONE", "dictionary_enabled": False}
    return WriterProperties(
        max_row_group_size=ROW_GROUP_ROWS,
        compression=COMPACTED_CODEC,
        default_column_properties=ColumnProperties(statistics_enabled="PAGE"),
        column_properties={
            "muid": ColumnProperties(bloom_filter_properties=bloom, **opaque),
            "message_hash": ColumnProperties(bloom_filter_properties=bloom, **opaque),
            **{name: ColumnProperties(**opaque) for name in ("digest", "payload", "meta", "rate_limit_proof")},
        },
    )


_warned_no_optimize: list[bool] = []  # once a process


def compact(
    table: DeltaTableRef, today: dt.date, rewrite_finished_days: bool = True, health: FileHealth | None = None
) -> dict[str, int]:
    """Rewrite finished days into sorted files (streamed,
    :mod:`day_rewrite`, on a table of this machine: only the files
    :func:`files_to_rewrite` names; else the whole day read at once, with
    bloom filters on the keys, when it has more than one file); bin-pack
    today once it has many files.

    A bad data file (``health`` checks each file before it is rewritten:
    there, whole, and its bytes those its index took a CRC-32 of) is never
    rewritten, which would make its damage look like data: a streamed day
    is rewritten without it (it stays as it is, and a read of it still
    fails), a day rewritten another way is left as it is (logged)."""
    if not table.engine.is_embedded:

        def optimize(spark) -> bool:
            if not dialect.has_optimize(table.engine.kind):
                return False
            # Quoted: Delta's grammar takes a bare `timestamp` for its
            # keyword and the whole statement falls through to Spark's
            # parser, which knows no OPTIMIZE.
            spark.sql(f"OPTIMIZE delta.`{table.uri}` ZORDER BY (`content_topic`, `timestamp`)").collect()
            return True

        if not table.engine.run(optimize):
            # A Sail cluster parses no OPTIMIZE: not a failed run (it would
            # keep /health at ok: false), a fleet whose engine cannot compact.
            if not _warned_no_optimize:
                _warned_no_optimize.append(True)
                log.warning(
                    "the engine at %s has no OPTIMIZE (Sail): maintenance does not compact the table (README, A fleet)",
                    table.engine.target,
                )
            return {"optimized": 0}
        return {"optimized": 1}
    from deltalake import DeltaTable, write_deltalake

    files_of_day: dict[dt.date, list[tuple[str, int]]] = {}
    actions = _actions(table) or {"partition.day": [], "path": [], "size_bytes": []}
    for day, path, size in zip(actions["partition.day"], actions["path"], actions["size_bytes"]):
        files_of_day.setdefault(_as_date(day), []).append((path, int(size)))
    rewritten = 0
    local = is_local(table.uri)
    for day, day_files in sorted(files_of_day.items()):
        files = len(day_files)
        redo = files_to_rewrite(day_files) if day < today and rewrite_finished_days and local else []
        if redo and _rewrite_day_around_bad_files(table, day, day_files, redo, health):
            rewritten += 1  # streamed: the node never holds the day
        elif (
            (day < today and files > 1 and rewrite_finished_days and not local)
            or (day >= today and files >= COMPACT_DAY_FILES)
        ) and _day_has_bad_files(health, day, [path for path, _ in day_files]):
            continue
        elif day < today and files > 1 and rewrite_finished_days and not local:
            dtable = DeltaTable(table.uri)
            data = dtable.to_pyarrow_table(filters=[("day", "=", day)])
            data = data.sort_by(
                [("pubsub_topic", "ascending"), ("content_topic", "ascending"), ("timestamp", "ascending")]
            )
            # Written over the version read (dtable): rows another writer
            # added to the day meanwhile fail the commit instead of being
            # overwritten.
            write_deltalake(
                dtable,
                data.cast(schema.MESSAGES),
                mode="overwrite",
                predicate=f"day = '{day.isoformat()}'",
                writer_properties=_writer_properties(),
            )
            rewritten += 1
        elif day >= today and files >= COMPACT_DAY_FILES:
            DeltaTable(table.uri).optimize.compact(
                partition_filters=[("day", "=", day.isoformat())], writer_properties=_writer_properties()
            )
            rewritten += 1
    table.sync_commits()
    return {"days_rewritten": rewritten}


def _rewrite_day_around_bad_files(
    table: DeltaTableRef,
    day: dt.date,
    day_files: list[tuple[str, int]],
    redo: list[str],
    health: FileHealth | None,
) -> bool:
    """:func:`day_rewrite.rewrite_day` of the files ``redo`` of ``day``,
    less the bad ones (checked first; one found bad while it is read is
    reported and the day is rewritten without it); False when nothing
    was rewritten."""
    root = table.uri.removeprefix("file://")
    if health is None:
        return day_rewrite.rewrite_day(root, day, ROW_GROUP_ROWS, set(redo))
    bad = set(health.check_files(redo))
    while True:
        if bad:
            log.warning(
                "compaction of %s leaves %d data files that cannot be read as they are: %s",
                day,
                len(bad),
                ", ".join(sorted(bad)),
            )
            redo = files_to_rewrite([(path, size) for path, size in day_files if path not in bad])
            if not redo:
                return False
        try:
            return day_rewrite.rewrite_day(root, day, ROW_GROUP_ROWS, set(redo))
        except day_rewrite.FileUnreadable as exc:
            health.report_bad(exc.path, exc.__cause__ or exc)
            bad.add(exc.path)


def _day_has_bad_files(health: FileHealth | None, day: dt.date, paths: list[str]) -> bool:
    """Does ``day`` hold a bad file (then the engine's rewrite of the day
    is not run: it would copy the damage into clean files)?"""
    bad = {} if health is None else health.check_files(paths)
    if bad:
        log.warning(
            "compaction of %s skipped: %d of its data files cannot be read (%s)", day, len(bad), ", ".join(sorted(bad))
        )
    return bool(bad)


# A sorted file under this size is merged again with a finished day's
# late rows: a day ends as files of day_rewrite.TARGET_FILE_BYTES and at
# most one smaller one.
SMALL_SORTED_BYTES = day_rewrite.TARGET_FILE_BYTES // 8


def files_to_rewrite(files: list[tuple[str, int]]) -> list[str]:
    """Of a finished day's files (path, bytes), those its compaction
    merges into sorted files: every file not written sorted (ingest
    commits, imports, rows that arrived after the day was compacted) and
    the small sorted ones, once they are two or more; none otherwise. A
    day compacted before is not rewritten whole for a few late rows (a day
    of status.prod is ~1 GB, and every run would rewrite every day), and
    its large sorted files are never read again."""
    redo = [path for path, size in files if not window_files.is_sorted_file(path) or size < SMALL_SORTED_BYTES]
    return redo if len(redo) >= 2 else []


# A table a fleet shares is written by MERGE, and each MERGE reads every
# file of the days its batch touches (measured: 10k rows into 30 days took
# 0.15 s at 30 files and 1.8 s at 6,000). So each node compacts the days it
# commits to as it goes, in tiers: once a day holds SMALL_FILES_PER_TIER
# files under a tier's size, those are bin-packed into files of that size.
# Each row is rewritten once a tier, and a day holds at most about
# SMALL_FILES_PER_TIER files a tier.
SMALL_FILES_PER_TIER = 16
COMPACTION_TIERS = (8 << 20, 64 << 20, 512 << 20)


def crowded_days(
    sizes_by_day: Mapping[dt.date | None, Sequence[int]], days: Iterable[dt.date] | None = None
) -> list[tuple[dt.date, int]]:
    """(day, target file size) of each day (of ``days``, default all) that
    holds :data:`SMALL_FILES_PER_TIER` files or more under one of the
    :data:`COMPACTION_TIERS`: the smallest such tier."""
    out = []
    for day in sizes_by_day if days is None else days:
        sizes = sizes_by_day.get(day, ())
        if day is None or len(sizes) < SMALL_FILES_PER_TIER:
            continue
        for target in COMPACTION_TIERS:
            if sum(1 for size in sizes if size < target) >= SMALL_FILES_PER_TIER:
                out.append((day, target))
                break
    return out


@contextlib.contextmanager
def rewrite_lock(table: DeltaTableRef, *, wait: bool = True) -> Iterator[bool]:
    """Hold the lock every node of a fleet takes around a rewrite of the
    table's files (compaction, retention): yields True once held, or
    False at once when ``wait`` is false and another holds it.

    Why: delta-rs commits a compaction over a concurrent one that removed
    the same files (two compactions of one day, both committed from the
    same read version: every row twice), so rewrites must not overlap.
    MERGEs need no lock (they only add files, and a compaction keeps the
    rows a MERGE read). The lock is an ``flock`` on a file beside the
    table (``<table>_locks/rewrite.lock``), which holds between processes
    on one machine and, through the file system's locks, on a shared one.
    A table elsewhere (an object store) has no such lock: True at once."""
    if not is_local(table.uri):
        yield True
        return
    path = Path(table.uri.removeprefix("file://").rstrip("/") + "_locks") / "rewrite.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def compact_day(table: DeltaTableRef, day: dt.date, target_size: int) -> int:
    """Bin-pack the files of ``day`` under ``target_size`` into files of
    about that size (rows unchanged, so a MERGE that read the files before
    stays right); returns the files removed. Embedded engine only, through
    delta-rs: a rewrite that lost a race with another node's raises
    (CommitFailedError) and changes nothing."""
    from deltalake import DeltaTable

    # Hold rewrite_lock around this in a fleet. One bin at a time: two
    # (delta-rs's default on 2 cores) took +364 MB of the node's memory
    # to bin-pack a 285k-message day into 64 MB files, one +211 MB, for
    # 1.26 s instead of 0.95.
    metrics = DeltaTable(table.uri).optimize.compact(
        partition_filters=[(schema.MESSAGES_PARTITION, "=", day.isoformat())],
        target_size=target_size,
        writer_properties=_writer_properties(),
        max_concurrent_tasks=1,
    )
    return int(metrics.get("numFilesRemoved", 0))


def vacuum(table: DeltaTableRef, retention_hours: int = DEFAULT_VACUUM_HOURS) -> int:
    """Remove the data files no version of the last ``retention_hours``
    uses: those a rewrite or a retention removed, and files in the table's
    directories that no commit ever named (a window staged into its day
    partitions by an import that crashed, a write the engine failed): a
    full listing, as Delta's VACUUM does; files newer than the retention
    stay (a write in flight). Returns the files removed (0 on a cluster,
    whose VACUUM reports none)."""
    if not table.engine.is_embedded:
        table.engine.run(
            lambda spark: spark.sql(f"VACUUM delta.`{table.uri}` RETAIN {int(retention_hours)} HOURS").collect()
        )
        return 0
    from deltalake import DeltaTable

    removed = DeltaTable(table.uri).vacuum(
        retention_hours=retention_hours, dry_run=False, enforce_retention_duration=False, full=True
    )
    return len(removed)


def checkpoint(table: DeltaTableRef) -> None:
    if table.engine.is_embedded:
        from deltalake import DeltaTable

        DeltaTable(table.uri).create_checkpoint()
        table.sync_commits()  # before a trim of the log relies on it


@dataclass(frozen=True, slots=True)
class MaintenanceResult:
    retention: RetentionResult | None  # None: no policy applied
    compaction: dict[str, int]
    stats: TableStats | None  # None when the table is not readable here (a cluster's)
    vacuumed: int = 0  # data files deleted (0 on a cluster, whose VACUUM reports none)


class MaintainedStore(Protocol):
    """What :func:`run_maintenance` uses of a message store (a
    :class:`~wakustore.storage.message_store.MessageStore`, which imports
    this module)."""

    table: DeltaTableRef
    reader: Any

    def flush(self) -> int: ...

    def forget_before(self, cutoff_ns: int) -> None: ...


def run_maintenance(
    store: MaintainedStore,
    policy: RetentionPolicy | None,
    now_ns: int,
    keep_from_ns: int | None = None,
    vacuum_hours: int | None = None,
) -> MaintenanceResult:
    """The one maintenance routine, for the node's hourly loop and for
    ``wakustore db retention`` / ``db compact``: commit what is buffered,
    apply ``policy`` (None: none) without deleting anything at or after
    ``keep_from_ns`` (the archive guard, see :func:`apply_retention`), let
    the store forget what left the table, compact, checkpoint, delete the
    data files removed more than ``vacuum_hours`` ago (None: none; the
    embedded engine only; without it a node's disk holds every day twice,
    written and compacted), and measure."""
    store.flush()
    retention = None
    with rewrite_lock(store.table):
        if policy is not None:
            retention = apply_retention(store.table, policy, now_ns, keep_from_ns=keep_from_ns, health=store.reader)
            if retention.cutoff_ns is not None:
                store.forget_before(retention.cutoff_ns)
        compaction = compact(store.table, today=schema.day_of_ns(now_ns), health=store.reader)
        store.table.sync_commits()
    # Pages read the compacted files at once, and their key index starts
    # building now rather than at the next look at the log.
    store.reader.committed()
    checkpoint(store.table)
    # On a Sail cluster, VACUUM is the operator's (`db vacuum` with the
    # embedded engine): Sail parses none. A Spark cluster runs Delta's.
    engine = store.table.engine
    can_vacuum = engine.is_embedded or dialect.has_optimize(engine.kind)
    vacuumed = vacuum(store.table, vacuum_hours) if vacuum_hours is not None and can_vacuum else 0
    # A compaction streams a day through the C heap, and glibc keeps what
    # it freed: ~130 MB of a 330k-message day's, given back here.
    allocator.trim_heap()
    return MaintenanceResult(retention, compaction, table_stats(store.table), vacuumed)


def table_stats(table: DeltaTableRef) -> TableStats | None:
    """:func:`stats` where the files are readable from here (embedded), else None."""
    return stats(table) if table.engine.is_embedded else None
