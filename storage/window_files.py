"""A window of the messages table replaced by Parquet files written in this
process and committed as one Delta transaction (delta-rs), for a table
this node owns on its own file system with the embedded engine.

Why not the engine: Sail's Delta writer took ~14 CPU seconds to write a
million staged rows (1.5 GB) into a window, dictionary-encoding and
computing page statistics of hashes and payloads whatever the write
options say; pyarrow writes the same rows in ~1.7 s. Why not delta-rs's
``write_deltalake``: it held the whole window in memory (a 1M-row window
peaked at 4.5 GB) and spent 10 CPU seconds.

The transaction, read at one table version:

- removes every file of the window's days that holds a row of the window
  (timestamp in [start, end), one of the window's content topics), and
  adds back, as a new file, that file's rows outside the window;
- adds the window's new rows, a file per day rolled at
  :data:`TARGET_FILE_BYTES`, with the statistics the engine writes
  (row count, min/max of the numeric and topic columns, null counts).

Files of those days without a row of the window are left alone (their
statistics, else their timestamp and topic columns, tell). Written files
are removed again when the commit fails. Callers serialise window
replacements with the table's other rewrites (compaction, retention) and
with their own appends; a conflict with another writer raises
:class:`CommitConflict` and the caller retries from a fresh read.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from wakustore.durable import fsync_dir, make_dirs
from wakustore.storage import parquet_pages, schema
from wakustore.storage.engine import CommitConflict, commit_conflict

# A new file is closed once it holds this many bytes of rows (Arrow size,
# close to the file's: payloads and hashes do not compress). Compaction
# later rewrites a finished day of several files into one sorted file.
TARGET_FILE_BYTES = 64 * 1024 * 1024
# Rows read at once from a staged window or a file being filtered: memory
# is bounded by this many rows, not by the window or the file.
READ_BATCH_ROWS = 8192
# Row groups of the files written (the table's readers prune by them).
ROW_GROUP_ROWS = 8192
# Columns whose min/max go into a file's Delta statistics (the engine's
# choice: numbers and topics; hashes and payloads prune nothing). A
# string longer than this is left out of the statistics rather than
# truncated (a truncated maximum would be below the true one).
_STATS_COLUMNS = ("pubsub_topic", "content_topic", "version", "timestamp", "sender_timestamp", "arrival_time")
_STATS_STRING_MAX = 32
_PHYSICAL = pa.schema([f for f in schema.MESSAGES if f.name != schema.MESSAGES_PARTITION])
_DICTIONARY_COLUMNS = ["pubsub_topic", "content_topic"]
# Hashes are random bytes: snappy only spends time on them (a 250k-row
# window file: ~0.1 s of ~0.7); the other columns stay compressed.
_COMPRESSION = {f.name: "none" if f.name in ("muid", "message_hash", "digest") else "snappy" for f in _PHYSICAL}


@dataclass(frozen=True, slots=True)
class FileLayout:
    """How the files are written: row groups of ``row_group_rows``, a file
    closed past ``target_bytes`` (None: :data:`TARGET_FILE_BYTES`), and
    fsynced (with its directory) when ``durable``, before a commit names it."""

    row_group_rows: int = ROW_GROUP_ROWS
    target_bytes: int | None = None
    durable: bool = False
    # Columns with a Parquet Bloom filter in each row group (at this rate):
    # what an engine or DataFusion reads to skip row groups in a lookup by
    # key (the node's own lookups use the key index).
    bloom_columns: tuple[str, ...] = ()
    bloom_fpp: float = 0.01
    # Data pages of parquet_pages.PAGE_ROWS rows in every column and the
    # page index: a lookup reads the pages of its rows, not their row groups.
    paged: bool = False
    # The rows come in the reader's order (a finished day's compaction,
    # storage/day_rewrite.py): the files are named so (SORTED_PREFIX), and
    # a later compaction leaves them as they are.
    sorted_rows: bool = False


# The name of a file written in the reader's order: see is_sorted_file.
SORTED_PREFIX = "part-sorted-"


def is_sorted_file(path: str) -> bool:
    """Was the data file at ``path`` (as the Delta log names it) written by
    a compaction, its rows in the reader's order? Engine and import files
    are named ``part-<n>-<uuid>`` or ``part-<uuid>``."""
    return os.path.basename(path).startswith(SORTED_PREFIX)


# fsynced: a window's files (an import's) are named by the commit that follows.
WINDOW_LAYOUT = FileLayout(durable=True)


class StagedFiles:
    """A window's new rows written straight into their day partitions
    before the transaction (files that no table version names until it
    commits): staging and writing at once, instead of a staged copy the
    commit reads and writes again. What :class:`staging.StagedRows` is for
    the engine's writes: :meth:`add_table`, :meth:`source` once all are
    added, :meth:`close` (removes the files unless they were committed)."""

    def __init__(self, table_uri: str):
        self._written: list[Path] = []
        self._files = _DayFiles(Path(table_uri.removeprefix("file://")), self._written)
        self.actions: list[tuple] | None = None
        self.committed = False
        self.rows = 0

    @property
    def paths(self) -> list[Path]:
        """The files written so far."""
        return list(self._written)

    def add_table(self, table: pa.Table) -> None:
        """Rows in the table's Arrow schema (with their day column)."""
        for batch in table.to_batches(max_chunksize=READ_BATCH_ROWS):
            _write_batch(self._files, batch)
        self.rows += table.num_rows

    def source(self) -> StagedFiles:
        """The files closed: what :func:`replace_window` commits."""
        if self.actions is None:
            self._files.__exit__(None)
            self.actions = self._files.actions
        return self

    def close(self) -> None:
        self._files.__exit__(None)
        if not self.committed:
            _remove(self._written)


def replace_window(
    uri: str, source: pa.Table | str | StagedFiles, start_ns: int, end_ns: int, content_topics: Sequence[str]
) -> None:
    """Make ``source`` (an Arrow table of the messages schema, a directory
    of staged Parquet files of it, or :class:`StagedFiles` already in
    place) the whole content of the window [``start_ns``, ``end_ns``) for
    ``content_topics``, in one Delta transaction. Raises
    :class:`CommitConflict` when another writer committed something this
    transaction cannot be put after (staged files stay for a retry)."""
    from deltalake import DeltaTable
    from deltalake.exceptions import CommitFailedError
    from deltalake.transaction import AddAction, RemoveAction

    root = Path(uri.removeprefix("file://"))
    table = DeltaTable(uri)
    first, last = schema.day_of_ns(start_ns), schema.day_of_ns(max(end_ns - 1, start_ns))
    topics = pa.array(list(content_topics), pa.string())
    written: list[Path] = []
    committed = False
    try:
        removes, adds = [], []
        now_ms = int(time.time() * 1000)
        for path, day, size in _files_of_window(table, first, last, start_ns, end_ns):
            kept = _rewrite_without_window(root, path, day, start_ns, end_ns, topics, written)
            if kept is None:
                continue  # no row of the window in it
            removes.append(RemoveAction(path, True, now_ms, size, {schema.MESSAGES_PARTITION: day}))
            adds += [AddAction(*action) for action in kept]
        if isinstance(source, StagedFiles):
            staged = source.source().actions
            assert staged is not None  # source() sets them
            adds += [AddAction(*action) for action in staged]
        else:
            adds += [AddAction(*action) for action in write_days(root, _batches(source), written)]
        if not removes and not adds:
            return
        table.create_write_transaction(
            removes + adds, "append", table.schema(), partition_by=[schema.MESSAGES_PARTITION]
        )
        committed = True
        if isinstance(source, StagedFiles):
            source.committed = True
    except CommitFailedError as exc:
        raise CommitConflict(f"window replacement: {exc}") from exc
    except BaseException as exc:
        conflict = commit_conflict(exc)  # delta-rs names some conflicts otherwise
        if conflict is not None:
            raise conflict from exc
        raise
    finally:
        if not committed:
            _remove(written)


def _files_of_window(table, first, last, start_ns: int, end_ns: int) -> Iterator[tuple[str, str, int]]:
    """(path, day, size) of every file of the days ``first``..``last``
    whose timestamp statistics do not put it wholly outside the window."""
    actions = pa.table(table.get_add_actions(flatten=True)).to_pydict()
    count = len(actions.get("path", []))
    days = actions.get(f"partition.{schema.MESSAGES_PARTITION}", [None] * count)
    lows = actions.get("min.timestamp", [None] * count)
    highs = actions.get("max.timestamp", [None] * count)
    for path, day, size, low, high in zip(actions["path"], days, actions["size_bytes"], lows, highs):
        day = day if not isinstance(day, str) else dt.date.fromisoformat(day)
        if day is None or not first <= day <= last:
            continue
        if (high is not None and high < start_ns) or (low is not None and low >= end_ns):
            continue
        yield path, day.isoformat(), int(size)


def _in_window(batch: pa.RecordBatch | pa.Table, start_ns: int, end_ns: int, topics: pa.Array) -> pa.Array:
    stamps = batch.column("timestamp")
    return pc.and_(
        pc.and_(pc.greater_equal(stamps, start_ns), pc.less(stamps, end_ns)),
        pc.is_in(batch.column("content_topic"), value_set=topics),
    )


def _rewrite_without_window(
    root: Path, path: str, day: str, start_ns: int, end_ns: int, topics: pa.Array, written: list[Path]
) -> list[tuple] | None:
    """None when the file holds no row of the window; else the add actions
    of its other rows, written to a new file (none when it held only rows
    of the window)."""
    source = pq.ParquetFile(root / unquote(path), page_checksum_verification=True)
    keys = source.read(columns=["timestamp", "content_topic"])
    if not pc.any(_in_window(keys, start_ns, end_ns, topics)).as_py():
        return None
    del keys
    kept = (
        batch.filter(pc.invert(_in_window(batch, start_ns, end_ns, topics)))
        for batch in _file_batches(source, _PHYSICAL.names)
    )
    with _DayFiles(root, written) as files:
        for batch in kept:
            if batch.num_rows:
                files.write(day, batch)
    return files.actions


def _batches(source: pa.Table | str) -> Iterator[pa.RecordBatch]:
    if isinstance(source, pa.Table):
        yield from source.to_batches(max_chunksize=READ_BATCH_ROWS)
        return
    for path in sorted(Path(source).glob("*.parquet")):
        yield from _file_batches(pq.ParquetFile(path))


def _file_batches(source: pq.ParquetFile, columns: list[str] | None = None) -> Iterator[pa.RecordBatch]:
    """A file's rows, a row group read at a time. (``iter_batches`` reads
    ahead without bound when its consumer is slower than the disk: a 1M-row
    staged window took 1.5 GB, against ~0.3 GB a row group at a time.)"""
    for index in range(source.metadata.num_row_groups):
        group = source.read_row_group(index, columns=columns)
        yield from group.to_batches(max_chunksize=READ_BATCH_ROWS)
        del group


def write_days(
    root: Path, batches: Iterator[pa.RecordBatch], written: list[Path], layout: FileLayout = WINDOW_LAYOUT
) -> list[tuple]:
    """The rows of ``batches`` (with their day column) written into their
    days' partitions under ``root`` (every file's path is added to
    ``written`` as it is opened); the add actions of the files, as
    ``deltalake.transaction.AddAction`` takes them."""
    with _DayFiles(root, written, layout) as files:
        for batch in batches:
            _write_batch(files, batch)
    return files.actions


def _write_batch(files: _DayFiles, batch: pa.RecordBatch) -> None:
    """A batch of rows with their day column, each written to its day's file."""
    if not batch.num_rows:
        return
    days = batch.column(schema.MESSAGES_PARTITION)
    unique = pc.unique(days)
    if len(unique) == 1:
        files.write(unique[0].as_py().isoformat(), batch.select(_PHYSICAL.names))
        return
    for day in unique:
        files.write(day.as_py().isoformat(), batch.filter(pc.equal(days, day)).select(_PHYSICAL.names))


class _DayFiles:
    """Open Parquet files, one a day, each closed (and its add action made)
    once it passes :data:`TARGET_FILE_BYTES` or at the end."""

    def __init__(self, root: Path, written: list[Path], layout: FileLayout = WINDOW_LAYOUT):
        self.root = root
        self.layout = layout
        self.written = written
        self.actions: list[tuple] = []
        self._open: dict[str, _File] = {}

    def __enter__(self) -> _DayFiles:
        return self

    def __exit__(self, exc_type, *_exc) -> None:
        for file in self._open.values():
            file.close()
            if exc_type is None:
                self.actions.append(file.action())
        self._open.clear()

    def write(self, day: str, batch: pa.RecordBatch) -> None:
        file = self._open.get(day)
        if file is None:
            file = self._open[day] = _File(self.root, day, self.layout)
            self.written.append(file.path)
        file.write(batch)
        if file.bytes >= (self.layout.target_bytes or TARGET_FILE_BYTES):
            file.close()
            self.actions.append(file.action())
            del self._open[day]


class _File:
    def __init__(self, root: Path, day: str, layout: FileLayout):
        self.day = day
        self.layout = layout
        prefix = SORTED_PREFIX if layout.sorted_rows else "part-"
        self.relative = f"{schema.MESSAGES_PARTITION}={day}/{prefix}{uuid.uuid4()}-c000.snappy.parquet"
        self.path = root / self.relative
        make_dirs(self.path.parent)
        blooms = {name: {"ndv": layout.row_group_rows, "fpp": layout.bloom_fpp} for name in layout.bloom_columns}
        self.writer = pq.ParquetWriter(
            str(self.path),
            _PHYSICAL,
            compression=_COMPRESSION,
            use_dictionary=_DICTIONARY_COLUMNS,
            write_statistics=list(_STATS_COLUMNS),
            bloom_filter_options=blooms or None,
            write_page_checksum=True,  # db check verifies each page (storage/check.py)
            **(parquet_pages.write_options() if layout.paged else {}),
        )
        self.rows = 0
        self.bytes = 0

    def write(self, batch: pa.RecordBatch) -> None:
        if not batch.schema.equals(_PHYSICAL):
            # Rows read back from a file Spark wrote: its Parquet schema
            # marks every column nullable (the table's do not; a null there
            # is refused here rather than written).
            batch = batch.cast(_PHYSICAL)
        self.writer.write_batch(batch, row_group_size=self.layout.row_group_rows)
        self.rows += batch.num_rows
        self.bytes += batch.nbytes

    def close(self) -> None:
        self.writer.close()
        if self.layout.durable:
            fd = os.open(self.path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            fsync_dir(self.path.parent)

    def action(self) -> tuple:
        """(path, size, partition values, modification time, data change,
        statistics) of the closed file. The min/max come from the row
        groups' statistics in its footer (computing them from the batches
        cost ~2 s a million rows)."""
        low: dict[str, Any] = {}  # pyarrow's statistics values
        high: dict[str, Any] = {}
        footer = pq.read_metadata(self.path)
        for group in range(footer.num_row_groups):
            columns = footer.row_group(group)
            for index in range(columns.num_columns):
                column = columns.column(index)
                name, stats = column.path_in_schema, column.statistics
                if name not in _STATS_COLUMNS or stats is None or not stats.has_min_max:
                    continue
                if name not in low or stats.min < low[name]:
                    low[name] = stats.min
                if name not in high or stats.max > high[name]:
                    high[name] = stats.max
        for name in [n for n, value in high.items() if isinstance(value, str)]:
            if max(len(high[name]), len(low[name])) > _STATS_STRING_MAX:
                del low[name], high[name]
        stat = self.path.stat()
        stats = {
            "numRecords": self.rows,
            "minValues": low,
            "maxValues": high,
            "nullCount": {name: 0 for name in _PHYSICAL.names},  # every column is non-nullable
        }
        return (
            self.relative,
            stat.st_size,
            {schema.MESSAGES_PARTITION: self.day},
            int(stat.st_mtime * 1000),
            True,
            json.dumps(stats),
        )


def _remove(paths: list[Path]) -> None:
    for path in paths:
        path.unlink(missing_ok=True)
