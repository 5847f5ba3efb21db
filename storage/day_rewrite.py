"""A finished day rewritten in the reader's order, streamed: the node never holds the day.

Why: the table reader wants each finished day as files sorted by (pubsub
topic, content topic, timestamp) in 256-row row groups (see
maintenance.compact). Read whole and sorted in memory, a day cost the
node its size twice over: ~400 MB a day at 10M messages over 30 days, 2.4
GB at status.prod's ~860k messages a day, more than everything else the
node holds. Here the day is sorted as an external merge sort:

1. Runs: the day's files, in groups of at most :data:`RUN_BYTES`, are
   read, sorted and written to a staging directory beside the table (a
   run's rows in small, uncompressed row groups), keeping only each row's
   topic pair (as text) and timestamp in memory.
2. Merge: the merged order of all runs comes from those keys alone; the
   rows are read back from the runs a chunk of :data:`CHUNK_ROWS` at a
   time (within a chunk, each run's rows are one contiguous range: the
   merge keeps each run's order) and written in order into the day's
   partition (:func:`window_files.write_days`: 256-row row groups with
   Bloom filters on the MUID and the hash, files of
   :data:`TARGET_FILE_BYTES`, fsynced). One Delta transaction (delta-rs)
   then removes the files read and adds the files written: a file another
   writer added to the day meanwhile stays, and a writer that removed one
   of ours makes the commit fail (the new files are removed again).
   (delta-rs's ``write_deltalake`` given the stream interleaved its chunks
   across two files, unsorted.)

Memory: one run while it is sorted (~3 x RUN_BYTES of Arrow buffers),
the keys (~60 bytes a row of the day: the pair's text and timestamp,
then the merged order), and a chunk with the row group of
each run it touches. A 270k-message day (300 MB on disk): peak RSS 400 MB
(Arrow 125 MB) in 2.2 s, where reading it whole took 2.2 GB in 4.6 s.
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
from collections.abc import Collection, Iterator, Sequence
from pathlib import Path
from urllib.parse import unquote

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from wakustore.storage import schema, window_files
from wakustore.storage.staging import staging_dir

# Bytes of data files sorted at once into one run (their size on disk:
# payloads are mostly ciphertext, which Snappy does not shrink).
RUN_BYTES = 32 << 20
# Size of the files written (their rows' Arrow size; ~0.9x that on disk).
# A lookup by hash or MUID searches each file's index once: at 30M
# messages over 30 days, files of 128 MiB made 272 files and 50 hashes
# cost 50 searches in each (9.9 ms); a day of status.prod (~860k messages,
# ~1 GB) is two files of this size. Pages read row groups, whatever the
# file's size; building a file's index reads its key columns (~110 bytes
# a row: ~50 MB at this size).
TARGET_FILE_BYTES = 512 << 20
# Rows of a run's row groups, and of a chunk of the merged stream.
RUN_GROUP_ROWS = 1024
CHUNK_ROWS = 8192
_SORT_KEYS = [("pubsub_topic", "ascending"), ("content_topic", "ascending"), ("timestamp", "ascending")]


class FileUnreadable(Exception):
    """A data file of the day that cannot be read (its error is the
    cause); ``path`` as the log names it. Nothing was committed."""

    def __init__(self, path: str):
        super().__init__(f"data file {path} cannot be read")
        self.path = path


def rewrite_day(uri: str, day: dt.date, row_group_rows: int, paths: Collection[str] | None = None) -> bool:
    """Rewrite the files of ``day`` of the Delta table at ``uri`` (a local
    path) as sorted files, or those of them named in ``paths`` (as the log
    names them; the day's other files stay); False (nothing done) when
    that is at most one file or the table has rows deleted by deletion
    vectors (the caller rewrites it another way). Raises ``deltalake``'s
    CommitFailedError when another writer removed one of the files
    meanwhile, :class:`FileUnreadable` for a file that cannot be read
    (page CRCs, where it has them, are checked)."""
    import time

    from deltalake import DeltaTable
    from deltalake.transaction import AddAction, RemoveAction

    table = DeltaTable(uri)
    if "deletionVectors" in (table.protocol().reader_features or []):
        return False
    actions = pa.table(table.get_add_actions(flatten=True)).to_pydict()
    files = [
        (path, size)
        for path, size, file_day in zip(actions["path"], actions["size_bytes"], actions.get("partition.day", []))
        if _as_day(file_day) == day and (paths is None or path in paths)
    ]
    if len(files) <= 1:
        return False
    staging = staging_dir(uri)
    staging.mkdir(parents=True)
    written: list[Path] = []
    committed = False
    layout = window_files.FileLayout(
        row_group_rows=row_group_rows,
        target_bytes=TARGET_FILE_BYTES,
        durable=True,
        bloom_columns=("muid", "message_hash"),
        paged=True,
        sorted_rows=True,
    )
    try:
        runs, pairs, stamps = _write_runs(uri, files, str(staging))
        # Chunks of whole row groups (a batch is written as row groups of its own).
        chunk = max(row_group_rows, CHUNK_ROWS // row_group_rows * row_group_rows)
        adds = window_files.write_days(Path(uri), _merged(runs, pairs, stamps, day, chunk), written, layout)
        now_ms = int(time.time() * 1000)
        removes = [
            RemoveAction(path, True, now_ms, size, {schema.MESSAGES_PARTITION: day.isoformat()}) for path, size in files
        ]
        table.create_write_transaction(
            removes + [AddAction(*action) for action in adds],
            "append",
            table.schema(),
            partition_by=[schema.MESSAGES_PARTITION],
        )
        committed = True
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        if not committed:
            for path in written:
                path.unlink(missing_ok=True)
    return True


def _as_day(value) -> dt.date | None:
    if value is None or isinstance(value, dt.date):
        return value
    return dt.date.fromisoformat(str(value))


def _write_runs(uri: str, files: Sequence[tuple[str, int]], staging: str):
    """Sorted runs of the files (paths relative to ``uri``): their paths,
    and per run each row's topic pair (as text, to be ranked across runs)
    and timestamp."""
    groups: list[list[str]] = [[]]
    held = 0
    for path, size in files:
        if groups[-1] and held + size > RUN_BYTES:
            groups.append([])
            held = 0
        groups[-1].append(path)
        held += size
    stored = pa.schema([f for f in schema.MESSAGES if f.name != schema.MESSAGES_PARTITION])
    runs, pairs, stamps = [], [], []
    for number, group in enumerate(groups):
        rows = pa.concat_tables([_read(uri, path, stored) for path in group]).sort_by(_SORT_KEYS)
        run = os.path.join(staging, f"run-{number}.parquet")
        pq.write_table(
            rows, run, row_group_size=RUN_GROUP_ROWS, compression="NONE", use_dictionary=False, write_statistics=False
        )
        runs.append(run)
        pairs.append(
            pc.binary_join_element_wise(
                rows.column("pubsub_topic").cast(pa.string()), rows.column("content_topic").cast(pa.string()), "\n"
            )
        )
        stamps.append(rows.column("timestamp").to_numpy())
        del rows
    return runs, pairs, stamps


def _read(uri: str, path: str, stored: pa.Schema) -> pa.Table:
    """The data file ``path`` (as the log names it) whole; raises :class:`FileUnreadable`."""
    try:
        return pq.read_table(os.path.join(uri, unquote(path)), schema=stored, page_checksum_verification=True)
    except Exception as exc:
        raise FileUnreadable(path) from exc


def _merged(
    runs: list[str], pairs: list, stamps: list[np.ndarray], day: dt.date, chunk_rows: int
) -> Iterator[pa.RecordBatch]:
    """The rows of the runs in their merged order, a batch of ``chunk_rows`` at a time."""
    # Each topic pair's rank among all the day's pairs: the runs' keys compare as integers.
    distinct = pc.unique(pa.chunked_array([p for run in pairs for p in run.chunks])).sort()
    ranks = [pc.index_in(run, value_set=distinct).to_numpy(zero_copy_only=False) for run in pairs]
    run_of = np.concatenate([np.full(len(r), i, dtype=np.int32) for i, r in enumerate(ranks)])
    row_of = np.concatenate([np.arange(len(r), dtype=np.int64) for r in ranks])
    order = np.lexsort((np.concatenate(stamps), np.concatenate(ranks)))  # stable: run, then row, within a tie
    run_of, row_of = run_of[order], row_of[order]
    del order, ranks, stamps, pairs
    readers = [_RunReader(path) for path in runs]
    out_schema = schema.MESSAGES
    day_number = (day - dt.date(1970, 1, 1)).days

    def chunks() -> Iterator[pa.RecordBatch]:
        for start in range(0, len(run_of), chunk_rows):
            runs_here, rows_here = run_of[start : start + chunk_rows], row_of[start : start + chunk_rows]
            pieces = []
            offsets = np.zeros(len(readers), dtype=np.int64)
            at = 0
            for run in np.unique(runs_here).tolist():
                mine = rows_here[runs_here == run]
                first, last = int(mine[0]), int(mine[-1])  # contiguous: the merge keeps a run's order
                piece = readers[run].rows(first, last + 1)
                offsets[run] = at - first
                at += piece.num_rows
                pieces.append(piece)
            table = pa.concat_tables(pieces).take(pa.array(rows_here + offsets[runs_here], pa.int64()))
            days = pa.array(np.full(table.num_rows, day_number, dtype=np.int32), pa.date32())
            table = table.append_column(out_schema.field(schema.MESSAGES_PARTITION), days)
            yield table.cast(out_schema).combine_chunks().to_batches()[0]

    return chunks()


class _RunReader:
    """Rows of one run by position, a row group at a time (the last kept:
    consecutive chunks read on from where the one before stopped)."""

    def __init__(self, path: str):
        self._file = pq.ParquetFile(path)
        metadata = self._file.metadata
        self._starts = np.cumsum([0] + [metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)])
        self._kept: tuple[int, pa.Table] | None = None

    def rows(self, start: int, stop: int) -> pa.Table:
        first = int(np.searchsorted(self._starts, start, "right")) - 1
        last = int(np.searchsorted(self._starts, stop - 1, "right")) - 1
        groups = []
        for group in range(first, last + 1):
            if self._kept is not None and self._kept[0] == group:
                groups.append(self._kept[1])
            else:
                groups.append(self._file.read_row_group(group))
        self._kept = (last, groups[-1])
        table = pa.concat_tables(groups) if len(groups) > 1 else groups[0]
        offset = start - int(self._starts[first])
        return table.slice(offset, stop - start)
