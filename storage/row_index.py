"""An exact key index of each committed data file, for pages without a query engine.

A Delta data file never changes once written (a new version adds new files
and removes old ones), so what a page needs to find its rows is read once
per file and written beside the node's other files (:mod:`index_files`):
the timestamps of each (pubsub topic, content topic) in order, the message
hashes and the MUIDs, sorted. A page finds its candidate rows with binary
searches and reads only the row groups holding them with pyarrow; a lookup
by hash finds whole hashes (compiled, one call over every file), so a
lookup without data reads no data file and one with data reads only the
row groups of the hashes found. DataFusion costs 2-4 ms a query before
any work here (BENCHMARKS.md), more than the whole indexed page.

Exactness: a page narrows by timestamp only. The rows read are tested
with :func:`store_query.matcher` (topics, time bounds, hashes, the cursor
with its tie on the order key) and sorted by (timestamp, order key), so
that a page is exactly what the SQL path answers; the candidates always
hold the answer (see :func:`_take`).

On disk, per message: the timestamp (8 bytes) and, for a file whose
rows of a topic pair are not contiguous and in time order (an ingest
file; a compacted day is sorted by pubsub topic, content topic and time),
its row (4); the hash with its position (36); the MUID (32); the footer
(~4.5 at the 256-row row groups of a compacted day; see
:mod:`parquet_footer`). In memory: per file its topic pairs' ids (a few
bytes a pair) and the map.

The MUIDs let a node that owns its table tell whether a key is in a day's
files without the engine: a put whose day filter flags a key (a duplicate
older than the recent set) costs one compiled search over the day's
files (:func:`existing_keys`), exact, no data read.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

import wakustore._native as _native
from wakustore.protocols import store_query
from wakustore.protocols.store_query import HistoryQuery
from wakustore.storage import index_files, parquet_pages
from wakustore.storage.parquet_footer import FooterError, GroupFooters

# Columns the exact test of a row needs (store_query.matcher).
MATCH_COLUMNS = ("pubsub_topic", "content_topic", "message_hash", "timestamp", "digest")
_INDEX_COLUMNS = ("pubsub_topic", "content_topic", "timestamp", "message_hash", "muid")
KEY_BYTES = index_files.KEY_BYTES

_MIN_TS = np.iinfo(np.int64).min
_MAX_TS = np.iinfo(np.int64).max


class TopicPairs:
    """Ids of (pubsub topic, content topic) pairs, shared by every file. Thread-safe."""

    def __init__(self) -> None:
        self._ids: dict[tuple[str, str], int] = {}
        self._names: list[tuple[str, str]] = []  # by id
        self._lock = threading.Lock()

    def names(self, ids: Iterable[int]) -> list[tuple[str, str]]:
        """The (pubsub topic, content topic) of each id."""
        names = self._names
        return [names[i] for i in ids]

    def get(self, pubsub_topic: str, content_topic: str) -> int | None:
        return self._ids.get((pubsub_topic, content_topic))

    def items(self) -> list[tuple[tuple[str, str], int]]:
        with self._lock:
            return list(self._ids.items())

    def intern(self, pairs: Sequence[tuple[str, str]]) -> np.ndarray:
        with self._lock:
            ids, names = self._ids, self._names
            out = np.empty(len(pairs), dtype=np.int64)
            for i, pair in enumerate(pairs):
                id_ = ids.get(pair)
                if id_ is None:
                    pair = (str(pair[0]), str(pair[1]))
                    id_ = ids[pair] = len(names)
                    names.append(pair)
                out[i] = id_
            return out


class FileIndex:
    """The keys of one data file: per topic pair its timestamps ascending
    (with their rows), its message hashes sorted (with each one's position
    among the timestamps) and its MUIDs sorted. The arrays are views of the
    file's index on disk (:mod:`index_files`) or, for a reader without an
    index directory, held; the topic pairs are arrays, not an object each
    (an ingest file holds hundreds of pairs, and 2,000 such files held
    1.4M objects)."""

    __slots__ = (
        "path",
        "rows",
        "_pairs",
        "pair_ids",
        "_by_id",
        "_id_order",
        "pair_bounds",
        "ts",
        "row",
        "hashes",
        "hash_pos",
        "muids",
        "footers",
        "group_starts",
        "pages",
        "_template",
        "mapped",
    )

    def __init__(
        self,
        path: str,
        rows: int,
        pair_names: Sequence[tuple[str, str]],
        footer_head: int,
        sections: Mapping[str, np.ndarray],
        pairs: TopicPairs,
        mapped: index_files.Mapped | None = None,
    ):
        self.path = path
        self.rows = rows
        self.mapped = mapped  # the map the arrays view (None: held)
        # Per local pair (the order of pair_bounds) its shared id (32 bits:
        # 12 bytes a pair with the two arrays below; names live once, in
        # ``pairs``).
        self._pairs = pairs
        self.pair_ids = pairs.intern(list(pair_names)).astype(np.int32)
        self._id_order = np.argsort(self.pair_ids, kind="stable").astype(np.int32)
        self._by_id = self.pair_ids[self._id_order]
        # Per pair (start, end) of its positions in ``ts``, then its first
        # file row: with ``row`` None (every pair's rows contiguous and in
        # time order), position p of a pair is file row first + p - start.
        self.pair_bounds = sections["pair_bounds"].reshape(-1, 3)
        self.ts = sections["ts"]
        self.row = sections.get("row")
        self.hashes = sections["hashes"]  # n * 32 bytes, sorted
        self.hash_pos = sections["hash_pos"]
        self.muids = sections.get("muids")  # n * 32 bytes, sorted; None: no MUID column
        # The footer, serialized: parsed, it cost ~10 KB a row group (see
        # parquet_footer); a read parses its row group's alone.
        self.footers = GroupFooters.presplit(sections["footer"], footer_head, sections["footer_bounds"])
        self.group_starts = sections["group_starts"]
        # Per row group and column its pages (parquet_pages); None: the
        # file's row groups are read whole.
        pages = sections.get("pages")
        groups = len(self.group_starts) - 1
        self.pages = None if pages is None or not groups else pages.reshape(groups, -1, parquet_pages.SLOTS)
        self._template: parquet_pages.Template | None = None

    def template(self) -> parquet_pages.Template:
        """What a read by page takes from the file's footer (made once)."""
        if self._template is None:
            self._template = parquet_pages.Template(self.footers)
        return self._template

    def pairs(self, ids: np.ndarray) -> list[tuple[int, int, int]]:
        """(start, end, first row) of each of ``ids`` present in the file."""
        found = np.searchsorted(self._by_id, ids)
        out = []
        for id_, at in zip(ids.tolist(), found.tolist()):
            if at < len(self._by_id) and self._by_id[at] == id_:
                start, end, first = self.pair_bounds[self._id_order[at]].tolist()
                out.append((start, end, first))
        return out

    @property
    def nbytes(self) -> int:
        """Bytes held in memory (not counting what is mapped)."""
        held = self.pair_ids.nbytes + self._id_order.nbytes + self._by_id.nbytes
        if self.mapped is None:
            held += self.footers.nbytes + sum(
                a.nbytes for a in (self.pair_bounds, self.ts, self.hashes, self.hash_pos, self.group_starts)
            )
            held += sum(a.nbytes for a in (self.row, self.muids) if a is not None)
        return held

    def rows_of(self, start: int, first: int, lo: int, hi: int) -> np.ndarray:
        """File rows of positions [lo, hi) of the pair starting at ``start``."""
        if self.row is None:
            return np.arange(first + lo - start, first + hi - start, dtype=np.int64)
        return self.row[lo:hi].astype(np.int64)

    def rows_at(self, positions: np.ndarray) -> np.ndarray:
        """File rows of positions in ``ts``."""
        positions = np.asarray(positions, dtype=np.int64)
        if self.row is not None:
            return self.row[positions].astype(np.int64)
        local = np.searchsorted(self.pair_bounds[:, 0], positions, "right") - 1
        bounds = self.pair_bounds[local].astype(np.int64)
        return bounds[:, 2] + positions - bounds[:, 0]


def build_sections(path: str, filesystem=None) -> tuple[int, list[tuple[str, str]], int, dict[str, np.ndarray]]:
    """Read the key columns of the data file at ``path``: (rows, topic
    pairs, footer head, sections as :mod:`index_files` keeps them)."""
    file = pq.ParquetFile(path, filesystem=filesystem, read_dictionary=["pubsub_topic", "content_topic"])
    columns = [c for c in _INDEX_COLUMNS if c in file.schema_arrow.names]
    table = file.read(columns=columns).unify_dictionaries().combine_chunks()
    n = table.num_rows
    ts = table.column("timestamp").to_numpy().astype(np.int64, copy=False)
    local_pairs = TopicPairs()
    pair = topic_pair_ids(table.column("pubsub_topic"), table.column("content_topic"), local_pairs)
    order = np.lexsort((ts, pair))  # stable: file order within a tie
    sorted_pair = pair[order]
    bounds = np.flatnonzero(np.diff(sorted_pair)) + 1
    starts = np.concatenate([[0], bounds]) if n else np.empty(0, dtype=np.int64)
    ends = np.concatenate([bounds, [n]]) if n else np.empty(0, dtype=np.int64)
    # Contiguous: within each pair, each position's row follows the one before.
    follows = np.diff(order) == 1
    if len(bounds):
        follows[bounds - 1] = True  # a pair's first position follows nothing
    contiguous = bool(follows.all())
    pair_names = local_pairs.names(sorted_pair[starts].tolist())
    pair_bounds = (
        np.stack([starts, ends, order[starts] if contiguous else np.full(len(starts), -1)], axis=1)
        if n
        else np.empty((0, 3), dtype=np.int64)
    )
    hashes = _fixed_keys(table.column("message_hash"))
    by_hash = _sorted_order(hashes)
    position_of_row = np.empty(n, dtype=np.int64)
    position_of_row[order] = np.arange(n)
    footers = GroupFooters.of(file.metadata)
    source = (filesystem or pafs.LocalFileSystem()).open_input_file(path)
    try:
        pages = parquet_pages.page_section(footers, lambda offset, size: source.read_at(size, offset), file.metadata)
    except (FooterError, IndexError):  # an offset index not as written here: read by row group
        pages = None
    finally:
        source.close()
    sections = {
        "pair_bounds": pair_bounds.astype(np.int32),
        "ts": np.ascontiguousarray(ts[order]),
        "row": None if contiguous else order.astype(np.int32),
        "hashes": hashes[by_hash].reshape(-1),
        "hash_pos": position_of_row[by_hash].astype(np.int32),
        "muids": None,
        "footer": footers.buffer,
        "footer_bounds": np.asarray(footers.bounds, dtype=np.int64),
        "group_starts": np.cumsum(
            [0] + [file.metadata.row_group(i).num_rows for i in range(file.metadata.num_row_groups)]
        ).astype(np.int64),
        "pages": None if pages is None else pages.reshape(-1),
    }
    if "muid" in table.column_names:
        muids = _fixed_keys(table.column("muid"))
        sections["muids"] = muids[_sorted_order(muids)].reshape(-1)
    return n, pair_names, footers.head, sections


def build(path: str, pairs: TopicPairs, filesystem=None) -> FileIndex:
    """The index of the data file at ``path``, held in memory."""
    rows, pair_names, head, sections = build_sections(path, filesystem)
    return FileIndex(path, rows, pair_names, head, {k: v for k, v in sections.items() if v is not None}, pairs)


def _fixed_keys(column) -> np.ndarray:
    """The first 32 bytes of each key of a binary column as an (n, 32)
    uint8 array (a shorter value, never written by this node, padded)."""
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    n = len(array)
    if not array.null_count and pa.types.is_binary(array.type) and n:
        offsets = np.frombuffer(array.buffers()[1], dtype=np.int32)[array.offset : array.offset + n + 1]
        lengths = np.diff(offsets)
        data = np.frombuffer(array.buffers()[2], dtype=np.uint8)
        if (lengths == KEY_BYTES).all():
            first = int(offsets[0])
            return data[first : first + n * KEY_BYTES].reshape(n, KEY_BYTES).copy()
        if (lengths >= KEY_BYTES).all():  # MUIDs: checksum, then meta
            return data[offsets[:-1, None] + np.arange(KEY_BYTES)]
    values = [bytes(v or b"")[:KEY_BYTES].ljust(KEY_BYTES, b"\0") for v in array.cast(pa.binary()).to_pylist()]
    return np.frombuffer(b"".join(values), dtype=np.uint8).reshape(n, KEY_BYTES).copy()


def _sorted_order(keys: np.ndarray) -> np.ndarray:
    """The order that sorts (n, 32) byte keys as bytes (memcmp)."""
    if not len(keys):
        return np.empty(0, dtype=np.int64)
    return np.argsort(keys.view(f"S{KEY_BYTES}").ravel(), kind="stable")


def find_keys(runs: Sequence[np.ndarray], keys: Iterable[bytes]) -> tuple[list[bytes], list[tuple[int, int, int]]]:
    """(the distinct 32-byte ``keys`` sorted, [(run, position, key number)]
    of each found) in ``runs`` (sorted 32-byte keys each): compiled, one
    call over every run."""
    wanted = sorted({bytes(k) for k in keys if len(k) == KEY_BYTES})
    if not wanted or not runs:
        return wanted, []
    return wanted, _native.find_keys(runs, b"".join(wanted), KEY_BYTES)


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
    local = pubsub.indices.to_numpy(zero_copy_only=False).astype(np.int64) * width + content.indices.to_numpy(
        zero_copy_only=False
    ).astype(np.int64)
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


def matching(sorted_prefixes: np.ndarray, prefixes: np.ndarray) -> np.ndarray:
    """Positions of the entries of ``sorted_prefixes`` equal to one of
    ``prefixes`` (sorted, unique): one binary search per prefix, a second
    only for the few that match."""
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


def key_prefixes(keys: Sequence[bytes], width: int) -> np.ndarray:
    """The first ``width`` (4 or 8) bytes of each key, big-endian, as
    unsigned integers (a short key padded)."""
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


def page_candidates(
    indexes: Sequence[FileIndex], pairs: TopicPairs, query: HistoryQuery, key: tuple[int, bytes] | None, fetch: int
) -> Candidates:
    """Rows that hold the first ``fetch`` rows of the page of ``query``
    after ``key`` (a query with a pubsub topic and content topics)."""
    assert query.pubsub_topic is not None  # the only caller (reader) asks with a pubsub topic
    pair_ids = [pairs.get(query.pubsub_topic, t) for t in query.content_topics]
    ids = [i for i in pair_ids if i is not None]
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


def hash_hits(indexes: Sequence[FileIndex], hashes: Sequence[bytes]) -> list[tuple[FileIndex, np.ndarray, list[bytes]]]:
    """Where ``hashes`` stand in the files: per file holding some, their
    positions in its ``ts`` and the hashes found. Exact (whole hashes)."""
    wanted, found = find_keys([index.hashes for index in indexes], hashes)
    if not found:
        return []
    hits = np.array(found, dtype=np.int64).reshape(-1, 3)
    out = []
    for run in np.unique(hits[:, 0]).tolist():
        mine = hits[hits[:, 0] == run]
        index = indexes[run]
        out.append((index, index.hash_pos[mine[:, 1]].astype(np.int64), [wanted[k] for k in mine[:, 2].tolist()]))
    return out


def hash_candidates(indexes: Sequence[FileIndex], hashes: Sequence[bytes]) -> Candidates:
    """Rows whose hash is one of ``hashes``."""
    files, rows = [], []
    for index, positions, _ in hash_hits(indexes, hashes):
        files.append(index)
        rows.append(np.sort(index.rows_at(positions)))
    return Candidates(files, rows)


def hash_keys(indexes: Sequence[FileIndex], hashes: Sequence[bytes], pairs: TopicPairs) -> pa.Table | None:
    """The rows of ``hashes`` as the index alone describes them: hash,
    pubsub topic, content topic, timestamp and an empty digest (a lookup
    by hash orders by hash). A lookup without data reads no data file.
    None when none is found."""
    ids, stamps, keys = [], [], []
    for index, positions, found in hash_hits(indexes, hashes):
        local = np.searchsorted(index.pair_bounds[:, 0], positions, "right") - 1
        ids.append(index.pair_ids[local])
        stamps.append(index.ts[positions])
        keys.extend(found)
    if not keys:
        return None
    names = pairs.names(np.concatenate(ids).tolist())
    return pa.table(
        {
            "pubsub_topic": pa.array([n[0] for n in names], pa.string()),
            "content_topic": pa.array([n[1] for n in names], pa.string()),
            "timestamp": pa.array(np.concatenate(stamps), pa.int64()),
            "message_hash": pa.array(keys, pa.binary()),
            "digest": pa.array([b""] * len(keys), pa.binary()),
        }
    )


def existing_keys(indexes: Sequence[FileIndex], keys: Sequence[bytes]) -> set[bytes] | None:
    """Which of ``keys`` (MUIDs) the files hold; None when a file was
    indexed without its MUIDs. Exact, no data read: a MUID is its 32-byte
    checksum then up to 32 bytes of meta, which the checksum covers, so
    its first 32 bytes name it (as a message hash names a message)."""
    if any(index.muids is None for index in indexes):
        return None
    named: dict[bytes, list[bytes]] = {}
    for key in keys:
        named.setdefault(bytes(key[:KEY_BYTES]), []).append(key)
    runs = cast("list[np.ndarray]", [index.muids for index in indexes])  # none is None (tested above)
    wanted, found = find_keys(runs, named)
    return {key for _, _, at in found for key in named[wanted[at]]}


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
