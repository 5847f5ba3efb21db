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

The MUID prefixes let a node that owns its table tell whether a key is in
a day's files without the engine (see :func:`muid_candidates`): a put
whose day filter flags a key (a duplicate older than the recent set)
costs binary searches and the read of the matching rows' MUIDs, instead
of an engine query whose cost grows with the day.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from wakustore.protocols import store_query
from wakustore.protocols.store_query import HistoryQuery
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


class TopicPairs:
    """Ids of (pubsub topic, content topic) pairs, shared by every file. Thread-safe."""

    def __init__(self) -> None:
        self._ids: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()

    def get(self, pubsub_topic: str, content_topic: str) -> int | None:
        return self._ids.get((pubsub_topic, content_topic))

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
                 "muid", "muid_row", "metadata", "group_starts")

    def __init__(self, path: str, metadata: pq.FileMetaData, pair_ids: np.ndarray, pair_bounds: np.ndarray,
                 ts: np.ndarray, row: np.ndarray | None, prefix: np.ndarray, prefix_row: np.ndarray,
                 muid: np.ndarray | None = None, muid_row: np.ndarray | None = None):
        self.path = path
        self.metadata = metadata
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
        # Sorted MUID prefixes and their rows (None: the file has no MUID column).
        self.muid = muid
        self.muid_row = muid_row
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

    def rows_with_muid_prefixes(self, prefixes: np.ndarray) -> np.ndarray:
        """Rows whose MUID prefix is one of ``prefixes`` (sorted, unique)."""
        return _rows_with(self.muid, self.muid_row, prefixes)


def _rows_with(sorted_prefixes: np.ndarray, rows: np.ndarray, prefixes: np.ndarray) -> np.ndarray:
    """The rows beside the entries of ``sorted_prefixes`` equal to one of
    ``prefixes`` (sorted, unique): one binary search per prefix, a second
    only for the few that match. Few numpy calls when nothing matches (a
    lookup visits every file of its days, most without a match)."""
    if not len(sorted_prefixes):
        return np.empty(0, dtype=np.int64)
    lo = np.searchsorted(sorted_prefixes, prefixes, "left")
    matched = sorted_prefixes.take(lo, mode="clip") == prefixes
    if not matched.any():
        return np.empty(0, dtype=np.int64)
    hit = np.flatnonzero(matched)
    starts = lo[hit]
    ends = np.searchsorted(sorted_prefixes, prefixes[hit], "right")
    if (ends - starts == 1).all():
        return rows[starts].astype(np.int64)
    return np.concatenate([rows[a:b] for a, b in zip(starts.tolist(), ends.tolist())]).astype(np.int64)


def build(path: str, pairs: TopicPairs, filesystem=None) -> FileIndex:
    """Read the key columns of the data file at ``path`` and index them."""
    file = pq.ParquetFile(path, filesystem=filesystem, read_dictionary=["pubsub_topic", "content_topic"])
    columns = [c for c in _INDEX_COLUMNS if c in file.schema_arrow.names]
    table = file.read(columns=columns).unify_dictionaries().combine_chunks()
    n = table.num_rows
    pubsub = _dictionary(table.column("pubsub_topic"))
    content = _dictionary(table.column("content_topic"))
    ts = table.column("timestamp").to_numpy().astype(np.int64, copy=False)
    # Local pair = pubsub index * |content dictionary| + content index,
    # mapped to the shared ids through the pairs present.
    width = max(len(content.dictionary), 1)
    local = pubsub.indices.to_numpy(zero_copy_only=False).astype(np.int64) * width \
        + content.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    present, inverse = np.unique(local, return_inverse=True)
    pubsub_names = pubsub.dictionary.to_pylist()
    content_names = content.dictionary.to_pylist()
    ids = pairs.intern([(pubsub_names[int(v) // width], content_names[int(v) % width]) for v in present])
    pair = ids[inverse] if n else np.empty(0, dtype=np.int64)
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
    return FileIndex(path, file.metadata, pair_ids, pair_bounds, ts_sorted, row, prefix[by_prefix],
                     by_prefix.astype(row_type), muid, muid_row)


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


def muid_candidates(indexes: Sequence[FileIndex], keys: Sequence[bytes]) -> Candidates | None:
    """Rows whose MUID may be one of ``keys`` (same prefix); None when a
    file was indexed without its MUIDs."""
    if any(index.muid is None for index in indexes):
        return None
    return _candidates(indexes, key_prefixes(keys, MUID_PREFIX_BYTES), FileIndex.rows_with_muid_prefixes)


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
