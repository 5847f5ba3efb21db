"""An exact key index of each committed data file, for pages without a query engine.

A Delta data file never changes once written (a new version adds new files
and removes old ones), so what a page needs to find its rows can be read
once per file and kept: the timestamps of each (pubsub topic, content
topic) in order, and the hashes. A page then finds its candidate rows with
binary searches, and reads only the row groups holding them with pyarrow;
a lookup by hash touches the row group of each hash found. DataFusion
costs 2-4 ms a query before any work here (BENCHMARKS.md), more than the
whole indexed page.

Exactness: the index narrows by timestamp only. The rows read are tested
with :func:`store_query.matcher` (topics, time bounds, hashes, the cursor
with its tie on the order key) and sorted by (timestamp, order key), so
that a page is exactly what the SQL path answers; the candidates always
hold the answer (see :func:`_take`).

Memory, per message: the timestamp (8 bytes), a 4-byte hash prefix with
its row number (8 bytes), and a 4-byte MUID prefix with its row number
(8 bytes); a file whose rows of each topic pair are contiguous and in
time order (a compacted day, sorted by pubsub topic, content topic and
time) needs no row numbers for its time index, other files 4 bytes more.
Beside them, each file's footer, kept serialized (~4.5 bytes a message
at the 256-row row groups of a compacted day; parsed, pyarrow's took ~40:
see :mod:`parquet_footer`).

The MUID prefixes let a node that owns its table tell whether a key is in
a day's files without the engine (see :class:`MuidDays`): a put
whose day filter flags a key (a duplicate older than the recent set)
costs a binary search in its day's merged prefixes (there they take 8
bytes a message: prefix, file and row) and the read of the matching
rows' MUIDs from the node's flat copies (:class:`MuidCopies`), instead
of an engine query whose cost grows with the day.
"""

from __future__ import annotations

import hashlib
import os
import struct
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from wakustore.protocols import store_query
from wakustore.protocols.store_query import HistoryQuery
from wakustore.storage.parquet_footer import GroupFooters
from wakustore.storage.rows import binary_prefixes

# Columns the exact test of a row needs (store_query.matcher).
MATCH_COLUMNS = ("pubsub_topic", "content_topic", "message_hash", "timestamp", "digest")
_INDEX_COLUMNS = ("pubsub_topic", "content_topic", "timestamp", "message_hash", "muid")

_MIN_TS = np.iinfo(np.int64).min
_MAX_TS = np.iinfo(np.int64).max

# Bytes of a hash kept for lookups: at 10M messages and 100 hashes, 0.2
# rows read in vain a lookup on average (100 * 1e7 / 2**32).
HASH_PREFIX_BYTES = 4
# Bytes of a MUID kept (its checksum's first 4): a key flagged by a day
# filter matches a row of that day in vain with odds of ~rows / 2**32
# (3e-5 at 10M messages over 30 days); every match is confirmed by
# reading the row's MUID, so the answer is exact.
MUID_PREFIX_BYTES = 4
# Files of a day searched one by one before they join the day's merged
# MUID array (DayMuids): today's, one more with each commit.
DAY_TAIL_FILES = 16


class TopicPairs:
    """Ids of (pubsub topic, content topic) pairs, shared by every file. Thread-safe."""

    def __init__(self) -> None:
        self._ids: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()

    def get(self, pubsub_topic: str, content_topic: str) -> int | None:
        return self._ids.get((pubsub_topic, content_topic))

    def items(self) -> list[tuple[tuple[str, str], int]]:
        with self._lock:
            return list(self._ids.items())

    def intern(self, pairs: Sequence[tuple[str, str]]) -> np.ndarray:
        with self._lock:
            ids = self._ids
            return np.array([ids.setdefault(p, len(ids)) for p in pairs], dtype=np.int64)


class FileIndex:
    """The keys of one data file: per topic pair its timestamps ascending
    (with their rows), and its hash and MUID prefixes sorted (with their
    rows). The topic pairs are arrays, not an object each: an ingest file
    holds hundreds of pairs, and 2,000 such files held 1.4M objects."""

    __slots__ = ("path", "rows", "pair_ids", "pair_bounds", "ts", "row", "prefix", "prefix_row",
                 "muid", "muid_row", "muid_copy", "footers", "group_starts")

    def __init__(self, path: str, metadata: pq.FileMetaData, pair_ids: np.ndarray, pair_bounds: np.ndarray,
                 ts: np.ndarray, row: np.ndarray | None, prefix: np.ndarray, prefix_row: np.ndarray,
                 muid: np.ndarray | None = None, muid_row: np.ndarray | None = None):
        self.path = path
        # The footer, serialized: parsed, it cost ~10 KB a row group (see
        # parquet_footer); a read parses its row group's alone.
        self.footers = GroupFooters.of(metadata)
        self.rows = metadata.num_rows
        # The pairs present, ascending, and per pair (start, end) of its
        # positions in ``ts``, then its first file row: with ``row`` None
        # (every pair's rows contiguous and in time order), position p of
        # a pair is file row first + p - start.
        self.pair_ids = pair_ids
        self.pair_bounds = pair_bounds
        self.ts = ts
        self.row = row
        self.prefix = prefix
        self.prefix_row = prefix_row
        # Sorted MUID prefixes and their rows (None: the file has no MUID
        # column); empty once moved into their day's merged array (DayMuids).
        self.muid = muid
        self.muid_row = muid_row
        # A flat copy of the file's MUIDs in file row order (see
        # MuidCopies), where a match is confirmed with one read; None: none.
        self.muid_copy: str | None = None
        self.group_starts = np.cumsum([0] + [metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)])

    def pairs(self, ids: np.ndarray) -> list[tuple[int, int, int]]:
        """(start, end, first row) of each of ``ids`` present in the file."""
        found = np.searchsorted(self.pair_ids, ids)
        out = []
        for id_, at in zip(ids.tolist(), found.tolist()):
            if at < len(self.pair_ids) and self.pair_ids[at] == id_:
                start, end, first = self.pair_bounds[at].tolist()
                out.append((start, end, first))
        return out

    @property
    def nbytes(self) -> int:
        return (self.ts.nbytes + (0 if self.row is None else self.row.nbytes) + self.prefix.nbytes
                + self.prefix_row.nbytes + self.pair_ids.nbytes + self.pair_bounds.nbytes
                + (0 if self.muid is None else self.muid.nbytes + self.muid_row.nbytes))

    def rows_of(self, start: int, first: int, lo: int, hi: int) -> np.ndarray:
        """File rows of positions [lo, hi) of the pair starting at ``start``."""
        if self.row is None:
            return np.arange(first + lo - start, first + hi - start, dtype=np.int64)
        return self.row[lo:hi].astype(np.int64)

    def rows_with_prefixes(self, prefixes: np.ndarray) -> np.ndarray:
        """Rows whose hash prefix is one of ``prefixes`` (sorted, unique)."""
        return _rows_with(self.prefix, self.prefix_row, prefixes)


def _rows_with(sorted_prefixes: np.ndarray, rows: np.ndarray, prefixes: np.ndarray) -> np.ndarray:
    """The rows beside the entries of ``sorted_prefixes`` equal to one of
    ``prefixes`` (sorted, unique)."""
    return rows[matching(sorted_prefixes, prefixes)].astype(np.int64)


def matching(sorted_prefixes: np.ndarray, prefixes: np.ndarray) -> np.ndarray:
    """Positions of the entries of ``sorted_prefixes`` equal to one of
    ``prefixes`` (sorted, unique): one binary search per prefix, a second
    only for the few that match. Few numpy calls when nothing matches (a
    lookup visits every file of its days, most without a match)."""
    if not len(sorted_prefixes):
        return _NO_POSITIONS
    lo = np.searchsorted(sorted_prefixes, prefixes, "left")
    matched = sorted_prefixes.take(lo, mode="clip") == prefixes
    if not matched.any():
        return _NO_POSITIONS
    hit = np.flatnonzero(matched)
    starts = lo[hit]
    ends = np.searchsorted(sorted_prefixes, prefixes[hit], "right")
    if (ends - starts == 1).all():
        return starts
    return np.concatenate([np.arange(a, b) for a, b in zip(starts.tolist(), ends.tolist())])


_NO_POSITIONS = np.empty(0, dtype=np.int64)


def build(path: str, pairs: TopicPairs, filesystem=None,
          keep_muids: Callable[[bytes], str | None] | None = None) -> FileIndex:
    """Read the key columns of the data file at ``path`` and index them.
    ``keep_muids``: given the file's MUIDs in row order (:func:`_flat_muids`),
    it returns where it keeps them (the index's ``muid_copy``)."""
    file = pq.ParquetFile(path, filesystem=filesystem, read_dictionary=["pubsub_topic", "content_topic"])
    columns = [c for c in _INDEX_COLUMNS if c in file.schema_arrow.names]
    table = file.read(columns=columns).unify_dictionaries().combine_chunks()
    n = table.num_rows
    ts = table.column("timestamp").to_numpy().astype(np.int64, copy=False)
    pair = topic_pair_ids(table.column("pubsub_topic"), table.column("content_topic"), pairs)
    order = np.lexsort((ts, pair))  # stable: file order within a tie
    sorted_pair = pair[order]
    ts_sorted = np.ascontiguousarray(ts[order])
    bounds = np.flatnonzero(np.diff(sorted_pair)) + 1
    starts = np.concatenate([[0], bounds]) if n else np.empty(0, dtype=np.int64)
    ends = np.concatenate([bounds, [n]]) if n else np.empty(0, dtype=np.int64)
    # Contiguous: within each pair, each position's row follows the one before.
    follows = np.diff(order) == 1
    if len(bounds):
        follows[bounds - 1] = True  # a pair's first position follows nothing
    contiguous = bool(follows.all())
    # 32 bits: a file holds far fewer than 2**31 rows (12 bytes a pair).
    pair_ids = sorted_pair[starts].astype(np.int32)
    pair_bounds = np.stack([starts, ends, order[starts] if contiguous else np.full(len(starts), -1)], axis=1) \
        if n else np.empty((0, 3), dtype=np.int64)
    pair_bounds = pair_bounds.astype(np.int32)
    # Row numbers in 16 bits where they fit (an ingest file holds a few
    # thousand rows: 6 bytes a message less at 10M before compaction).
    row_type = np.uint16 if n <= 1 << 16 else np.int32
    row = None if contiguous else order.astype(row_type)
    prefix = _prefixes(table.column("message_hash"), HASH_PREFIX_BYTES)
    by_prefix = np.argsort(prefix, kind="stable")
    muid = muid_row = None
    if "muid" in table.column_names:
        muids = _prefixes(table.column("muid"), MUID_PREFIX_BYTES)
        muid_row = np.argsort(muids, kind="stable")
        muid = muids[muid_row]
        muid_row = muid_row.astype(row_type)
    index = FileIndex(path, file.metadata, pair_ids, pair_bounds, ts_sorted, row, prefix[by_prefix],
                      by_prefix.astype(row_type), muid, muid_row)
    if keep_muids is not None and muid is not None:
        flat = _flat_muids(table.column("muid"))
        if flat is not None:
            index.muid_copy = keep_muids(flat)
    return index


def _flat_muids(column) -> bytes | None:
    """The MUIDs of a column as :class:`MuidCopies` keeps them: the count
    of rows n, then n + 1 offsets (little-endian uint32), then the values
    back to back. None for a column this node would not write (nulls, or
    not binary)."""
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if array.null_count or not pa.types.is_binary(array.type):
        return None
    count = len(array)
    offsets = np.frombuffer(array.buffers()[1], dtype=np.int32)[array.offset:array.offset + count + 1]
    if count == 0:
        return None
    first, last = int(offsets[0]), int(offsets[-1])
    data = memoryview(array.buffers()[2])[first:last]
    return b"".join((struct.pack("<I", count), (offsets - first).astype("<u4").tobytes(), data))


def topic_pair_ids(pubsub_topics, content_topics, pairs: TopicPairs) -> np.ndarray:
    """The shared id (``pairs``) of each row's (pubsub topic, content
    topic), from two string columns (plain or dictionary), a Python object
    per distinct pair only."""
    pubsub = _dictionary(pubsub_topics)
    content = _dictionary(content_topics)
    if not len(pubsub):
        return np.empty(0, dtype=np.int64)
    # Local pair = pubsub index * |content dictionary| + content index,
    # mapped to the shared ids through the pairs present.
    width = max(len(content.dictionary), 1)
    local = pubsub.indices.to_numpy(zero_copy_only=False).astype(np.int64) * width \
        + content.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    present, inverse = np.unique(local, return_inverse=True)
    pubsub_names = pubsub.dictionary.to_pylist()
    content_names = content.dictionary.to_pylist()
    ids = pairs.intern([(pubsub_names[int(v) // width], content_names[int(v) % width]) for v in present])
    return ids[inverse.ravel()]


def _dictionary(column: pa.ChunkedArray) -> pa.DictionaryArray:
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if not pa.types.is_dictionary(array.type):
        array = pc.dictionary_encode(array)
    return array


def _prefixes(column, width: int) -> np.ndarray:
    """The first ``width`` (4 or 8) bytes of each key of a column, big-endian
    (a null or short value, never written by this node, reads as padded)."""
    try:
        return binary_prefixes(column, width)
    except ValueError:
        values = column.cast(pa.binary()).to_pylist()
        return key_prefixes([v or b"" for v in values], width)


def key_prefixes(keys: Sequence[bytes], width: int) -> np.ndarray:
    """:func:`_prefixes` of keys given as bytes."""
    padded = b"".join(bytes(k)[:width].ljust(width, b"\0") for k in keys)
    return np.frombuffer(padded, dtype=f">u{width}").astype(f"u{width}")


# --- pages --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Candidates:
    """Rows of data files that hold the answer (and maybe more)."""

    files: list[FileIndex]
    rows: list[np.ndarray]  # per file, file row numbers

    @property
    def count(self) -> int:
        return sum(len(r) for r in self.rows)


def page_candidates(indexes: Sequence[FileIndex], pairs: TopicPairs, query: HistoryQuery,
                    key: tuple[int, bytes] | None, fetch: int) -> Candidates:
    """Rows that hold the first ``fetch`` rows of the page of ``query``
    after ``key`` (a query with a pubsub topic and content topics)."""
    ids = [pairs.get(query.pubsub_topic, t) for t in query.content_topics]
    ids = [i for i in ids if i is not None]
    low, high = store_query.key_range(query, key)
    # Inclusive timestamp range; the bound's own timestamp is tested exactly later.
    lo_ts = _MIN_TS if low is None else int(low[0])
    hi_ts = _MAX_TS if high is None else (int(high[0]) - 1 if high[1] == b"" else int(high[0]))
    # Rows at the cursor's timestamp may fall on either side of it: they do
    # not count towards ``fetch``.
    tie_ts = None if key is None else int(key[0])
    forward = query.forward
    files, rows, stamps = [], [], []
    wanted = np.array(sorted(set(ids)), dtype=np.int32)
    for index in indexes:
        picked_rows, picked_ts = [], []
        for start, end, first in index.pairs(wanted):
            stamp = index.ts[start:end]
            a = int(np.searchsorted(stamp, lo_ts, "left"))
            b = int(np.searchsorted(stamp, hi_ts, "right"))
            if a >= b:
                continue
            a, b = _take(stamp, a, b, tie_ts, fetch, forward)
            picked_rows.append(index.rows_of(start, first, start + a, start + b))
            picked_ts.append(stamp[a:b])
        if picked_rows:
            files.append(index)
            rows.append(np.concatenate(picked_rows))
            stamps.append(np.concatenate(picked_ts))
    if not files:
        return Candidates([], [])
    # Across files and pairs: the same cut on all candidates by timestamp.
    which = np.concatenate([np.full(len(r), i, dtype=np.int64) for i, r in enumerate(rows)])
    all_rows = np.concatenate(rows)
    all_ts = np.concatenate(stamps)
    order = np.argsort(all_ts, kind="stable")
    all_ts, which, all_rows = all_ts[order], which[order], all_rows[order]
    a, b = _take(all_ts, 0, len(all_ts), tie_ts, fetch, forward)
    which, all_rows = which[a:b], all_rows[a:b]
    kept_files, kept_rows = [], []
    for i, index in enumerate(files):
        mine = all_rows[which == i]
        if len(mine):
            kept_files.append(index)
            kept_rows.append(np.sort(mine))
    return Candidates(kept_files, kept_rows)


def _take(stamp: np.ndarray, a: int, b: int, tie_ts: int | None, fetch: int, forward: bool) -> tuple[int, int]:
    """Of the ascending timestamps ``stamp[a:b]`` (all in the page's time
    range), the positions that hold the first ``fetch`` rows in page order:
    every row at ``tie_ts`` (the cursor's timestamp: the exact test decides
    them), then ``fetch`` more, then every row tied with the last one (the
    order key decides among them)."""
    if forward:
        start = a
        if tie_ts is not None and stamp[a] <= tie_ts:
            start = min(b, int(np.searchsorted(stamp, tie_ts, "right")))
        end = min(b, start + fetch)
        if a < end < b:
            end = min(b, int(np.searchsorted(stamp, stamp[end - 1], "right")))
        return a, end
    end = b
    if tie_ts is not None and stamp[b - 1] >= tie_ts:
        end = max(a, int(np.searchsorted(stamp, tie_ts, "left")))
    start = max(a, end - fetch)
    if a < start < b:
        start = max(a, int(np.searchsorted(stamp, stamp[start], "left")))
    return start, b


def hash_candidates(indexes: Sequence[FileIndex], hashes: Sequence[bytes]) -> Candidates:
    """Rows whose hash may be one of ``hashes`` (same prefix)."""
    return _candidates(indexes, key_prefixes(hashes, HASH_PREFIX_BYTES), FileIndex.rows_with_prefixes)


class DayMuids:
    """The MUID prefixes of one day's files in one sorted array, with each
    entry's file and row: a put's flagged keys cost one binary search a
    day instead of one a file (10M messages over 30 days before
    compaction: ~2,200 ingest files, ~15 ms of numpy calls a put)."""

    __slots__ = ("files", "paths", "prefix", "file_no", "row")

    def __init__(self, files: list[FileIndex], prefix: np.ndarray, file_no: np.ndarray, row: np.ndarray):
        self.files = files
        self.paths = frozenset(f.path for f in files)
        self.prefix = prefix
        self.file_no = file_no
        self.row = row

    @property
    def nbytes(self) -> int:
        return self.prefix.nbytes + self.file_no.nbytes + self.row.nbytes

    def merged(self, live: set[str], added: Sequence[FileIndex]) -> DayMuids:
        """This day without its files not in ``live``, with ``added``."""
        keep = [i for i, f in enumerate(self.files) if f.path in live]
        if len(keep) == len(self.files):
            base = DayMuids(self.files, self.prefix, self.file_no, self.row)
        else:
            renumber = np.full(len(self.files) + 1, -1, dtype=np.int64)
            renumber[keep] = np.arange(len(keep))
            numbers = renumber[self.file_no]
            kept = numbers >= 0
            base = DayMuids([self.files[i] for i in keep], self.prefix[kept], numbers[kept], self.row[kept])
        return merge_day(base, added)


_EMPTY_DAY = DayMuids([], np.empty(0, dtype=np.uint32), np.empty(0, dtype=np.uint16), np.empty(0, dtype=np.uint16))


def merge_day(base: DayMuids | None, added: Sequence[FileIndex]) -> DayMuids:
    """``base`` (None: nothing) with the MUID prefixes of ``added``, which
    move out of those files' indexes into the day's arrays (their
    ``muid``/``muid_row`` become empty)."""
    base = _EMPTY_DAY if base is None else base
    if not added:
        return base
    files = [*base.files, *added]
    prefixes, numbers, rows = [base.prefix], [base.file_no], [base.row]
    for number, index in enumerate(added, start=len(base.files)):
        prefixes.append(index.muid)
        rows.append(index.muid_row)
        numbers.append(np.full(len(index.muid), number, dtype=np.int64))
    prefix = np.concatenate(prefixes)
    # Sorted runs back to back: the stable sort (timsort) merges them.
    order = np.argsort(prefix, kind="stable")
    file_type = np.uint16 if len(files) <= 1 << 16 else np.int32
    row_type = np.uint16 if max(f.rows for f in files) <= 1 << 16 else np.uint32
    day = DayMuids(files, prefix[order], np.concatenate(numbers)[order].astype(file_type),
                   np.concatenate(rows)[order].astype(row_type))
    for index in added:
        index.muid = _EMPTY_DAY.prefix
        index.muid_row = _EMPTY_DAY.row
    return day


class MuidDays:
    """The merged MUID prefixes of each day (DayMuids) of one table, kept
    up to date as the lookups find the files a day holds. Thread-safe."""

    def __init__(self) -> None:
        self._days: dict[object, DayMuids] = {}
        self._lock = threading.Lock()

    @property
    def nbytes(self) -> int:
        return sum(day.nbytes for day in list(self._days.values()))

    def candidates(self, by_day: Mapping[object, Sequence[FileIndex]], keys: Sequence[bytes]) -> Candidates | None:
        """Rows of the files of each day (``by_day``: the day's files in the
        version read, all indexed) whose MUID may be one of ``keys``; None
        when a file was indexed without its MUIDs."""
        prefixes = np.unique(key_prefixes(keys, MUID_PREFIX_BYTES))
        found: dict[int, tuple[FileIndex, list[np.ndarray]]] = {}

        def hit(index: FileIndex, rows: np.ndarray) -> None:
            found.setdefault(id(index), (index, []))[1].append(rows)

        with self._lock:
            for day, files in by_day.items():
                if any(index.muid is None for index in files):
                    return None
                merged = self._days.get(day)
                paths = _EMPTY_DAY.paths if merged is None else merged.paths
                tail = [index for index in files if index.path not in paths]
                if len(tail) > DAY_TAIL_FILES or (merged is not None and len(paths) > len(files) - len(tail)):
                    merged = self._days[day] = (merge_day(None, tail) if merged is None
                                                else merged.merged({f.path for f in files}, tail))
                    tail = []
                if merged is not None and len(merged.prefix):
                    at = matching(merged.prefix, prefixes)
                    if len(at):
                        numbers, rows = merged.file_no[at], merged.row[at].astype(np.int64)
                        for number in np.unique(numbers).tolist():
                            hit(merged.files[number], rows[numbers == number])
                for index in tail:
                    rows = _rows_with(index.muid, index.muid_row, prefixes)
                    if len(rows):
                        hit(index, rows)
        files = [index for index, _ in found.values()]
        return Candidates(files, [np.unique(np.concatenate(rows)) for _, rows in found.values()])

    def keep_only(self, live: set[str]) -> None:
        """Drop the files not in ``live`` (they left the table) from their days."""
        with self._lock:
            for day, merged in list(self._days.items()):
                if merged.paths <= live:
                    continue
                remaining = merged.merged(live, ())
                if remaining.files:
                    self._days[day] = remaining
                else:
                    del self._days[day]


def confirmed_muids(candidates: Candidates, keys: Iterable[bytes], read_group, map_=map) -> set[bytes]:
    """Which of ``keys`` the candidate rows hold: each row's MUID read from
    its file's flat copy (two small reads), or, for a file without one,
    from its row group (a whole MUID column to decode: ~250 us for an
    ingest file)."""
    found: set[bytes] = set()
    rest_files, rest_rows = [], []
    for index, rows in zip(candidates.files, candidates.rows):
        if index.muid_copy is None or not _read_copies(index.muid_copy, rows, found):
            rest_files.append(index)
            rest_rows.append(rows)
    if rest_files:
        table = read_rows(Candidates(rest_files, rest_rows), ("muid",), read_group, map_)
        if table is not None:
            found.update(table.column(0).to_pylist())
    return found.intersection(keys)


def _read_copies(path: str, rows: np.ndarray, out: set[bytes]) -> bool:
    """Add the MUIDs of ``rows`` from the flat copy at ``path`` to ``out``
    (two reads a row: its offsets, its value); False (nothing added) when
    the copy is gone or does not hold those rows."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    values = []
    try:
        header = os.pread(fd, 4, 0)
        if len(header) != 4:
            return False
        count, = struct.unpack("<I", header)
        data_at = 4 + 4 * (count + 1)
        for row in rows.tolist():
            if row >= count:
                return False
            bounds = os.pread(fd, 8, 4 + 4 * row)
            if len(bounds) != 8:
                return False
            start, end = _BOUNDS.unpack(bounds)
            value = os.pread(fd, end - start, data_at + start) if end > start else b""
            if len(value) != end - start:
                return False
            values.append(value)
    except (OSError, ValueError):
        return False
    finally:
        os.close(fd)
    out.update(values)
    return True


_BOUNDS = struct.Struct("<II")


class MuidCopies:
    """Flat copies of the data files' MUIDs, one file each in a directory
    of the node's (in file row order, with their offsets: see
    :func:`_flat_muids`), so that confirming a prefix match costs two
    small reads instead of decoding the file's MUID column. A copy is written when its data file is indexed, compared
    with the file's column whenever the file is indexed again (a process
    start: a copy torn by a crash is rewritten before it is read), and
    removed when the data file leaves the table. Data files never change,
    so neither does a copy."""

    def __init__(self, directory: str | os.PathLike):
        self.directory = os.fspath(directory)
        os.makedirs(self.directory, exist_ok=True)

    def path_of(self, data_path: str) -> str:
        name = hashlib.blake2b(data_path.encode(), digest_size=16).hexdigest()
        return os.path.join(self.directory, name + ".muid")

    def keeper(self, data_path: str) -> Callable[[bytes], str | None]:
        """What :func:`build` calls with the MUIDs of the file at ``data_path``."""
        return lambda muids: self.keep(data_path, muids)

    def keep(self, data_path: str, muids: bytes) -> str | None:
        path = self.path_of(data_path)
        try:
            with open(path, "rb") as existing:
                if existing.read(len(muids) + 1) == muids:
                    return path
        except OSError:
            pass
        temporary = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
        try:
            with open(temporary, "wb") as out:
                out.write(muids)
            os.replace(temporary, path)
        except OSError:
            try:
                os.unlink(temporary)
            except OSError:
                pass
            return None
        return path

    def remove(self, data_paths: Iterable[str]) -> None:
        for data_path in data_paths:
            try:
                os.unlink(self.path_of(data_path))
            except OSError:
                pass

    def keep_only(self, live: Iterable[str]) -> None:
        """Remove every copy but those of ``live`` (and temporary files)."""
        wanted = {os.path.basename(self.path_of(p)) for p in live}
        try:
            names = os.listdir(self.directory)
        except OSError:
            return
        for name in names:
            if name not in wanted:
                try:
                    os.unlink(os.path.join(self.directory, name))
                except OSError:
                    pass


def _candidates(indexes: Sequence[FileIndex], prefixes: np.ndarray, rows_with) -> Candidates:
    prefixes = np.unique(prefixes)
    files, rows = [], []
    for index in indexes:
        found = rows_with(index, prefixes)
        if len(found):
            files.append(index)
            rows.append(np.sort(found))
    return Candidates(files, rows)


def read_rows(candidates: Candidates, columns: Sequence[str], read_group, map_=map) -> pa.Table | None:
    """The ``columns`` of the candidate rows, read one row group at a time
    (``read_group(index, group, columns)`` gives a row group's table);
    None when there are none. ``map_``: how the row groups are read (a
    thread pool's map reads them side by side)."""
    tasks = []
    for index, rows in zip(candidates.files, candidates.rows):
        groups = np.searchsorted(index.group_starts, rows, "right") - 1
        for group in np.unique(groups).tolist():
            tasks.append((index, group, rows[groups == group] - index.group_starts[group]))

    def read(task) -> pa.Table:
        index, group, local = task
        return read_group(index, group, columns).take(pa.array(local, type=pa.int64()))

    pieces = list(map_(read, tasks))
    if not pieces:
        return None
    return pa.concat_tables(pieces, promote_options="permissive") if len(pieces) > 1 else pieces[0]


def finish(table: pa.Table | None, query: HistoryQuery, key: tuple[int, bytes] | None, fetch: int) -> pa.Table | None:
    """The rows of ``table`` on the page (exactly tested), in query order,
    at most ``fetch``."""
    if table is None or table.num_rows == 0:
        return table
    match = store_query.matcher(query, key)
    order_column = store_query.order_column(query.ordering)
    columns = table.select(list(MATCH_COLUMNS)).to_pydict()
    keyed = []
    for i, (p, c, h, t, d) in enumerate(zip(*(columns[name] for name in MATCH_COLUMNS))):
        if match(p, c, h, t, d):
            keyed.append(((t, d if order_column == store_query.DIGEST else h), i))
    keyed.sort(reverse=not query.forward)
    return table.take(pa.array([i for _, i in keyed[:fetch]], type=pa.int64()))
