"""Recent history in memory: Store v3 pages without a round trip to the engine.

Measured (``wakustore bench store``, 200k messages): a page from the table
costs 25-30 ms, almost all of it the fixed cost of one engine call
(Spark Connect round trip 6-12 ms, Delta snapshot load ~10 ms, file read).
Most Store traffic asks for recent history (clients catch up on what they
missed), which this node has just written. The hot tier keeps every
message with timestamp >= :attr:`HotTier.start_ns` in memory, bounded by a
byte budget and a time window, and answers a query from memory only when
the answer provably lies inside that complete region; otherwise the caller
goes to the table.

Columnar: the tier keeps the puts' Arrow rows as they come (a chunk a
put, small chunks merged), each chunk with numpy indexes (its rows by
topic pair and time, its hash prefixes, its times sorted with their sizes
summed), and answers a page as an Arrow table of the rows it returns
(taken from the chunks, no object a row: see storage.page_table). A
live node's messages all land here: with an object per row and sorted
lists the tier cost ~15 us a message, two thirds of the put thread
(``bench store --days 1``, 1M messages: 33k msg/s; 60k since). Rows
leave by time: eviction and retention raise a floor below which rows
are not visible (a chunk all below it is dropped, one mostly below it
rebuilt); a window replacement marks rows dead.

Completeness needs every write to pass through this node, so the tier is
for a node that owns its table; a fleet sharing one table turns it off
(another node's writes would be missing).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import threading
from collections.abc import Iterable, Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from wakustore.protocols import store_query
from wakustore.protocols.message import HASH_SIZE
from wakustore.protocols.store_query import HistoryQuery, Ordering
from wakustore.storage import schema
from wakustore.storage.page_table import Rows, select
from wakustore.storage.row_index import TopicPairs, key_prefixes, matching, topic_pair_ids
from wakustore.storage.rows import Row, binary_prefixes, byte_prefixes, leading_bytes, to_arrow

# Bytes a row costs beyond its payload, meta and topics: its other columns
# (MUID, hash, digest, times, offsets: ~170 bytes) and the chunk's indexes
# (~110 bytes, the hash whole among them); checked by a test against what
# the tier really holds.
ROW_OVERHEAD_BYTES = 288

Key = tuple[int, bytes]

# start_ns for a tier that holds the whole table: complete for all time.
ALL_TIME = -(2**63)

# Chunks of fewer rows than SMALL_CHUNK_ROWS are merged, up to
# MERGED_CHUNK_ROWS a chunk, once there are more than MAX_SMALL_CHUNKS of
# them: every page visits every chunk, and a relay node puts a few
# messages at a time. A merge re-indexes the rows but does not copy them
# (the merged chunk's table is their Arrow chunks). The bound on a chunk
# bounds what eviction leaves held below the floor until the chunk is
# rebuilt (REBUILD_SHARE of it).
SMALL_CHUNK_ROWS = 8_192
MERGED_CHUNK_ROWS = 16_384
MAX_SMALL_CHUNKS = 8
# A chunk with more than this share of its rows below the floor or dead
# is rebuilt with the others only: what eviction leaves held below the
# floor is at most this share of a chunk (and counted until then).
REBUILD_SHARE = 0.5
# Past its budget the tier evicts down to this share of it, so that a
# full tier evicts every few puts, not at each.
EVICT_TO = 0.9

_NO_ROWS = np.empty(0, dtype=np.int64)
# The columns a lookup reads from a chunk's indexes, with no take from its rows.
_INDEXED_KEYS = {"message_hash", "pubsub_topic", "content_topic", "timestamp"}
# A take whose rows are this few a batch slices each row out instead.
SLICED_ROWS_PER_BATCH = 8


def _columns(batch: pa.RecordBatch, columns: Sequence[str] | None) -> pa.RecordBatch:
    return batch if columns is None else batch.select(list(columns))


class _Chunk:
    """Rows added together (the table's Arrow schema) and their indexes."""

    __slots__ = (
        "table",
        "ts",
        "pair_ids",
        "pair_bounds",
        "order",
        "ts_ordered",
        "hash_prefix",
        "hash_row",
        "hashes",
        "row_pair",
        "muid_prefix",
        "muid_row",
        "ts_sorted",
        "size_sorted",
        "size_cum",
        "dead",
        "rows",
        "batches",
        "batch_starts",
        "held_bytes",
    )

    def __init__(self, table: pa.Table, pairs: TopicPairs):
        self.table = table
        self.rows = n = table.num_rows
        self.ts = ts = table.column("timestamp").to_numpy().astype(np.int64, copy=False)
        pair = topic_pair_ids(_combined(table.column("pubsub_topic")), _combined(table.column("content_topic")), pairs)
        # The rows of each topic pair in time order: a page's binary search.
        order = np.lexsort((ts, pair))
        sorted_pair = pair[order]
        starts = np.flatnonzero(np.concatenate(([True], sorted_pair[1:] != sorted_pair[:-1]))) if n else _NO_ROWS
        self.pair_ids = sorted_pair[starts]
        self.pair_bounds = np.stack([starts, np.append(starts[1:], n)], axis=1) if n else np.empty((0, 2), np.int64)
        self.order = order.astype(np.int32)
        self.ts_ordered = ts[order]
        # A lookup's keys without a take from the rows (presence checks,
        # cursors): the hashes whole and each row's topic pair.
        self.hashes = np.array(leading_bytes(table.column("message_hash"), HASH_SIZE))
        self.row_pair = pair.astype(np.int32)
        prefix = byte_prefixes(self.hashes, 8)
        by_prefix = np.argsort(prefix, kind="stable")
        self.hash_prefix = prefix[by_prefix]
        self.hash_row = by_prefix.astype(np.int32)
        prefix = binary_prefixes(table.column("muid"), 8)
        by_prefix = np.argsort(prefix, kind="stable")
        self.muid_prefix = prefix[by_prefix]
        self.muid_row = by_prefix.astype(np.int32)
        sizes = (
            pc.binary_length(table.column("payload")).to_numpy(zero_copy_only=False).astype(np.int64)
            + pc.binary_length(table.column("meta")).to_numpy(zero_copy_only=False)
            + pc.binary_length(table.column("content_topic")).to_numpy(zero_copy_only=False)
            + pc.binary_length(table.column("pubsub_topic")).to_numpy(zero_copy_only=False)
            + ROW_OVERHEAD_BYTES
        )
        by_time = np.argsort(ts, kind="stable")
        self.ts_sorted = ts[by_time]
        self.size_sorted = sizes[by_time]
        self.size_cum = np.concatenate(([0], np.cumsum(self.size_sorted)))
        # What the chunk holds until it is dropped or rebuilt, visible or not.
        self.held_bytes = int(self.size_cum[-1])
        self.dead: np.ndarray | None = None  # per row, True once a window replacement removed it
        # A merged chunk's table is its parts' Arrow chunks: rows are taken
        # a batch at a time (a take over many chunks concatenates them).
        self.batches = table.to_batches()
        self.batch_starts = np.cumsum([0] + [b.num_rows for b in self.batches])

    def take(self, rows: np.ndarray, columns: Sequence[str] | None = None) -> pa.Table:
        """The rows at ``rows`` (any order; in that order, or grouped by
        batch), of ``columns`` (None: all)."""
        if len(self.batches) == 1:
            return pa.Table.from_batches([_columns(self.batches[0], columns).take(pa.array(rows, pa.int64()))])
        which = np.searchsorted(self.batch_starts, rows, "right") - 1
        batches = np.unique(which)
        if len(rows) <= SLICED_ROWS_PER_BATCH * len(batches):
            # Rows spread over many batches (a lookup by hash; the warm-up's
            # batches are row groups of 256 rows): a slice a row (~1 us)
            # instead of a take a batch (~15 us).
            local = (rows - self.batch_starts[which]).tolist()
            sliced = [self.batches[b].slice(at, 1) for b, at in zip(which.tolist(), local)]
            table = pa.Table.from_batches(sliced, schema=self.batches[0].schema)
            return table if columns is None else table.select(list(columns))
        parts = []
        for batch in batches.tolist():
            at = rows[which == batch] - self.batch_starts[batch]
            parts.append(_columns(self.batches[batch], columns).take(pa.array(at, pa.int64())))
        return pa.Table.from_batches(parts)

    def visible_from(self, floor: int) -> int:
        """Position in ``ts_sorted`` of the first row at or above ``floor``."""
        return int(np.searchsorted(self.ts_sorted, floor, "left"))

    def bytes_from(self, floor: int) -> int:
        return int(self.size_cum[-1] - self.size_cum[self.visible_from(floor)])

    def visible(self, floor: int) -> np.ndarray:
        """Mask of the rows a query may see."""
        mask = self.ts >= floor
        if self.dead is not None:
            mask &= ~self.dead
        return mask

    def killed(self, mask: np.ndarray) -> _Chunk:
        """This chunk with the rows of ``mask`` dead too: they leave the
        counts at once. A new chunk (sharing the rows and indexes): a
        reader may hold this one."""
        twin = copy.copy(self)
        twin.dead = mask if self.dead is None else self.dead | mask
        by_time = np.argsort(self.ts, kind="stable")
        twin.size_sorted = np.where(twin.dead[by_time], 0, self.size_sorted)
        twin.size_cum = np.concatenate(([0], np.cumsum(twin.size_sorted)))
        return twin

    @property
    def nbytes(self) -> int:
        return self.table.get_total_buffer_size() + sum(
            a.nbytes
            for a in (
                self.ts,
                self.pair_ids,
                self.pair_bounds,
                self.order,
                self.ts_ordered,
                self.hash_prefix,
                self.hash_row,
                self.hashes,
                self.row_pair,
                self.muid_prefix,
                self.muid_row,
                self.ts_sorted,
                self.size_sorted,
                self.size_cum,
            )
        )

    def segment(self, pair: int) -> tuple[int, int] | None:
        at = int(np.searchsorted(self.pair_ids, pair))
        if at < len(self.pair_ids) and self.pair_ids[at] == pair:
            start, end = self.pair_bounds[at]
            return int(start), int(end)
        return None


@dataclasses.dataclass(frozen=True, slots=True)
class _View:
    """What readers see of the tier: published whole by each write."""

    start_ns: int | None
    floor: int
    chunks: tuple[_Chunk, ...]


class HotTier:
    """Thread-safe; complete for timestamps >= ``start_ns`` once started.

    Readers take no lock: they read the view the last write published
    (:class:`_View`: the complete region, the floor and the chunks, none
    of which a write changes once published: a write makes new chunks
    and publishes a new view). Writers take the tier's lock, among
    themselves only. A page on the event loop thus never waits for a
    commit putting its rows in, nor for an eviction."""

    def __init__(self, max_bytes: int, window_ns: int):
        self.max_bytes = max_bytes
        self.window_ns = window_ns
        self.start_ns: int | None = None  # None: covers nothing yet
        self.bytes = 0
        self._lock = threading.Lock()
        self._chunks: list[_Chunk] = []
        self._pairs = TopicPairs()
        # Rows below the floor are gone (evicted, or removed by retention):
        # start_ns when it is a time, and never below a retention cutoff.
        self._floor = ALL_TIME
        self._view = _View(None, ALL_TIME, ())

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    def __len__(self) -> int:
        view = self._view
        return sum(int(chunk.visible(view.floor).sum()) for chunk in view.chunks)

    @contextlib.contextmanager
    def _writing(self) -> Iterator[None]:
        """The writers' lock; what the write did is published as it ends."""
        with self._lock:
            try:
                yield
            finally:
                self._view = _View(self.start_ns, self._floor, tuple(self._chunks))

    # --- filling ----------------------------------------------------------

    def start(self, start_ns: int, rows: Iterable[Row] | pa.Table, now_ns: int) -> None:
        """Declare completeness from ``start_ns`` with the table's rows since
        then (and the rows not yet committed), as row objects or the table's
        Arrow rows; the first row of a MUID wins."""
        table = rows if isinstance(rows, pa.Table) else to_arrow(rows)
        if table.num_rows:
            seen: set[bytes] = set()
            keep: np.ndarray = np.array(
                [
                    k not in seen and not seen.add(k)  # type: ignore[func-returns-value]  # adds k, then True
                    for k in table.column("muid").to_pylist()
                ],
                dtype=bool,
            )
            keep &= table.column("timestamp").to_numpy() >= start_ns
            if not keep.all():  # (a copy of up to the whole tier otherwise)
                table = table.filter(pa.array(keep))
        # Indexed before the lock is taken: pages on the event loop wait for
        # the lock, not for the sorting of up to the whole tier.
        chunk = _Chunk(table, self._pairs) if table.num_rows else None
        with self._writing():
            self._chunks = []
            self.start_ns = start_ns
            self._floor = start_ns
            self._append(chunk)
            self._count()
            self._evict(now_ns)

    def add(self, rows: Sequence[Row], now_ns: int) -> None:
        """:meth:`add_table` of row objects, less those whose MUID the tier
        holds (the table keeps the first): rows a commit decided after
        the engine came back, an import's."""
        if self.start_ns is None or not rows:
            return
        held = _held_muids(self._view, [r.muid for r in rows])
        seen: set[bytes] = set()
        fresh = [r for r in rows if r.muid not in held and r.muid not in seen and not seen.add(r.muid)]  # type: ignore[func-returns-value]  # adds the MUID, then True
        if fresh:
            self.add_table(to_arrow(fresh), now_ns)

    def add_table(self, table: pa.Table, now_ns: int) -> None:
        """New rows of the table (its Arrow schema), each new to the table
        (the put path: its write path checked every MUID), kept as given.
        A row older than the window would be evicted at once: it is not
        kept, and the tier is complete only above it from now on."""
        if self.start_ns is None or not table.num_rows:
            return
        # Indexed before the lock is taken (see start); again under it in
        # the rare case the tier was restarted from another time meanwhile.
        start_ns = self.start_ns
        late, chunk = self._kept(table, start_ns, now_ns)
        with self._writing():
            if self.start_ns is None:
                return
            if self.start_ns != start_ns:
                late, chunk = self._kept(table, self.start_ns, now_ns)
            if late is not None:
                self._forget_through(late)
            self._append(chunk)
            self._evict(now_ns)

    def _kept(self, table: pa.Table, start_ns: int, now_ns: int) -> tuple[int | None, _Chunk | None]:
        """(the newest row too old for the window, or None; the chunk of the
        rows the tier keeps) of new rows ``table``."""
        ts = table.column("timestamp").to_numpy().astype(np.int64, copy=False)
        horizon = now_ns - self.window_ns
        claimed = ts >= start_ns
        late = claimed & (ts < horizon)
        keep = claimed & (ts >= horizon)
        if not keep.all():
            table = table.filter(pa.array(keep))
        return (int(ts[late].max()) if late.any() else None), (_Chunk(table, self._pairs) if table.num_rows else None)

    def clear(self) -> None:
        """Cover nothing from now on: every query goes to the table."""
        with self._writing():
            self.start_ns = None
            self._chunks = []
            self._floor = ALL_TIME
            self.bytes = 0

    def forget_before(self, cutoff_ns: int) -> None:
        """Rows older than ``cutoff_ns`` left the table (retention)."""
        with self._writing():
            self._raise_floor(cutoff_ns)

    def replace(self, start_ns: int, end_ns: int, content_topics: Sequence[str], rows: Sequence[Row]) -> None:
        """Mirror a window replacement in the table."""
        if self.start_ns is None:
            return
        with self._writing():
            if self.start_ns is None:
                return
            topics = set(content_topics)
            doomed_pairs = np.array(
                sorted(i for (_, content), i in self._pairs.items() if content in topics), dtype=np.int64
            )
            for at, chunk in enumerate(self._chunks):
                if not len(doomed_pairs):
                    break
                pairs = np.empty(chunk.rows, dtype=np.int64)
                for (start, end), pair in zip(chunk.pair_bounds.tolist(), chunk.pair_ids.tolist()):
                    pairs[chunk.order[start:end]] = pair
                mask = (chunk.ts >= start_ns) & (chunk.ts < end_ns) & np.isin(pairs, doomed_pairs)
                if mask.any():
                    self._chunks[at] = chunk.killed(mask)
            kept = to_arrow([r for r in rows if r.timestamp >= self.start_ns])
            self._append(_Chunk(kept, self._pairs) if kept.num_rows else None)
            self._tidy()

    # --- reading ----------------------------------------------------------

    def timestamp_of(self, message_hash: bytes) -> int | None:
        _, timestamps, _ = _keys_by_hash(self._view, [message_hash])
        return timestamps[0] if timestamps else None

    def page(self, query: HistoryQuery, key: Key | None) -> Rows | None:
        """Up to limit + 1 matches in query order (a table of the page's
        columns, :func:`schema.page_columns`, and their order), or None
        when the answer may reach outside the complete region (ask the
        table)."""
        view = self._view
        if view.start_ns is None or query.ordering is not Ordering.MESSAGE_HASH:
            return None
        if query.message_hashes:
            held, missing = _by_hashes(view, self._pairs, query, key)
            return None if missing else held
        if not query.content_topics or query.pubsub_topic is None:
            return None
        fetch = query.limit + 1
        low, high = store_query.key_range(query, key)
        picks = []
        for topic in query.content_topics:
            pair = self._pairs.get(query.pubsub_topic, topic)
            if pair is not None:
                for chunk in view.chunks:
                    picked = _scan(chunk, view.floor, pair, low, high, query.forward, fetch)
                    if picked is not None:
                        picks.append((chunk, picked))
        columns = schema.page_columns(query.include_data, False)
        # The candidates lie in the query's topics and times: the order
        # and the key range remain.
        candidates = _rows(picks, low, high, query.forward, fetch, columns)
        found = select(candidates, _order_only(query), None, fetch, low, high)
        if not _complete(view.start_ns, query, key, found.count >= fetch):
            return None
        return found

    def lookup(self, query: HistoryQuery, key: Key | None) -> tuple[Rows, tuple[bytes, ...]] | None:
        """A lookup by hash as far as the tier holds it: (the page's rows
        among the hashes it holds, in query order, at most limit + 1; the
        hashes it does not hold, which only the table may), or None when
        the tier cannot say (not filled yet, or another order)."""
        view = self._view
        if view.start_ns is None or query.ordering is not Ordering.MESSAGE_HASH or not query.message_hashes:
            return None
        return _by_hashes(view, self._pairs, query, key)

    # --- private ----------------------------------------------------------

    def _append(self, chunk: _Chunk | None) -> None:
        if chunk is None:
            return
        self._chunks.append(chunk)
        small = [c for c in self._chunks if c.rows < SMALL_CHUNK_ROWS]
        if len(small) > MAX_SMALL_CHUNKS:
            group: list[_Chunk] = []
            for chunk in sorted(small, key=lambda c: c.rows):
                if group and sum(c.rows for c in group) + chunk.rows > MERGED_CHUNK_ROWS:
                    if len(group) > 1:
                        self._rebuild(group)
                    group = []
                group.append(chunk)
            if len(group) > 1:
                self._rebuild(group)
        self._count()

    def _rebuild(self, chunks: list[_Chunk]) -> None:
        """Replace ``chunks`` by one chunk of their visible rows."""
        tables = []
        for chunk in chunks:
            visible = chunk.visible(self._floor)
            tables.append(chunk.table if visible.all() else chunk.table.filter(pa.array(visible)))
        self._chunks = [c for c in self._chunks if not any(c is d for d in chunks)]
        merged = pa.concat_tables(tables)
        if merged.num_rows:
            self._chunks.append(_Chunk(merged, self._pairs))

    def _count(self) -> None:
        self.bytes = sum(chunk.held_bytes for chunk in self._chunks)

    def _raise_floor(self, floor: int) -> None:
        if floor <= self._floor:
            return
        self._floor = floor
        self._tidy()

    def _tidy(self) -> None:
        """Drop the chunks all below the floor, rebuild those mostly
        invisible, and count the bytes again."""
        self._chunks = [c for c in self._chunks if c.rows and c.ts_sorted[-1] >= self._floor]
        sparse = [
            c
            for c in self._chunks
            if c.rows - c.visible_from(self._floor) - (0 if c.dead is None else int(c.dead.sum()))
            < (1 - REBUILD_SHARE) * c.rows
        ]
        for chunk in sparse:
            self._rebuild([chunk])
        self._count()
        if self.bytes > self.max_bytes:  # what partly evicted chunks still hold
            for chunk in [c for c in self._chunks if c.visible_from(self._floor) or c.dead is not None]:
                self._rebuild([chunk])
            self._count()

    def _forget_through(self, timestamp: int) -> None:
        """Give up completeness at and below ``timestamp``."""
        assert self.start_ns is not None  # only a started tier evicts (start, add_table; under the lock)
        self.start_ns = max(self.start_ns, timestamp + 1)
        self._raise_floor(self.start_ns)

    def _evict(self, now_ns: int) -> None:
        """Drop the oldest timestamps (all rows of each) past the window, and
        past the budget down to EVICT_TO of it: the floor rises to the
        lowest time whose rows and those below it hold the excess (a binary
        search over time, each step a search per chunk)."""
        horizon = now_ns - self.window_ns
        if self._oldest() < horizon:
            self._forget_through(horizon - 1)
        if self.bytes <= self.max_bytes:
            return
        floor = self._floor
        excess = sum(c.bytes_from(floor) for c in self._chunks) - int(self.max_bytes * EVICT_TO)
        if excess <= 0:
            self._tidy()
            return
        starts = [(c, int(c.size_cum[c.visible_from(floor)])) for c in self._chunks]

        def through(t: int) -> int:
            return sum(int(c.size_cum[np.searchsorted(c.ts_sorted, t, "right")]) - base for c, base in starts)

        low, high = self._oldest(), max(int(c.ts_sorted[-1]) for c in self._chunks)
        while low < high:
            middle = (low + high) // 2
            if through(middle) >= excess:
                high = middle
            else:
                low = middle + 1
        self._forget_through(low)

    def _oldest(self) -> int:
        """The lowest visible time (dead rows included: a bound)."""
        oldest = [
            c.ts_sorted[c.visible_from(self._floor)] for c in self._chunks if c.visible_from(self._floor) < c.rows
        ]
        return int(min(oldest)) if oldest else 2**63 - 1


def _complete(start_ns: int, query: HistoryQuery, key: Key | None, filled: bool) -> bool:
    """Is every row the answer could hold at or after ``start_ns``?"""
    if start_ns == ALL_TIME:
        return True
    lower = query.time_start
    if query.forward and key is not None:
        lower = key[0] if lower is None else max(lower, key[0])
    if lower is not None and lower >= start_ns:
        return True
    # Backward pages walk down from the newest: a full page from memory
    # is the right page, since everything newer than start_ns is here.
    return not query.forward and filled


def _scan(
    chunk: _Chunk, floor: int, pair: int, low: Key | None, high: Key | None, forward: bool, fetch: int
) -> np.ndarray | None:
    """Rows of one topic pair of a chunk that hold its first ``fetch``
    rows at or above ``floor`` strictly between ``low`` and ``high``
    (store_query.key_range) in query order, and more: whole groups of
    equal times at both ends, since the order within a time is by
    hash, decided once the rows are read. None when there are none."""
    low_ts = floor if low is None else max(low[0], floor)
    if not chunk.rows or chunk.ts_sorted[-1] < low_ts or (high is not None and chunk.ts_sorted[0] > high[0]):
        return None
    segment = chunk.segment(pair)
    if segment is None:
        return None
    start, end = segment
    times = chunk.ts_ordered[start:end]
    a = int(np.searchsorted(times, low_ts, "left"))
    b = int(np.searchsorted(times, high[0], "right")) if high is not None else len(times)
    if a >= b:
        return None
    if forward:
        ties = int(np.searchsorted(times, times[a], "right")) - a
        stop = min(b, a + fetch + ties)
        stop = min(b, int(np.searchsorted(times, times[stop - 1], "right")))
        picked = chunk.order[start + a : start + stop]
    else:
        ties = b - int(np.searchsorted(times, times[b - 1], "left"))
        first = max(a, b - fetch - ties)
        first = max(a, int(np.searchsorted(times, times[first], "left")))
        picked = chunk.order[start + first : start + b]
    if chunk.dead is not None:
        picked = picked[~chunk.dead[picked]]
    return picked if len(picked) else None


def _rows(
    picks: list[tuple[_Chunk, np.ndarray]],
    low: Key | None,
    high: Key | None,
    forward: bool,
    fetch: int,
    columns: Sequence[str],
) -> pa.Table:
    """The rows of the chunks' candidates (``_scan``) that can be among
    the first ``fetch`` over all chunks (by time first, whole groups of
    a time kept), of ``columns``, in no particular order; some may lie
    at ``low``'s or ``high``'s time on the wrong side of its key (the
    caller's :func:`page_table.select` drops them)."""
    if not picks:
        return schema.empty_page(columns)
    times = np.concatenate([chunk.ts[rows] for chunk, rows in picks])
    # Rows at the bound's own time may fall to the cursor's hash.
    bound = low if forward else high
    need = fetch + (int((times == bound[0]).sum()) if bound is not None else 0)
    if need < len(times):
        ordered = np.sort(times)
        cut = ordered[need - 1] if forward else ordered[len(times) - need]
    else:
        cut = None
    # One take a chunk (its topics' rows together): a take costs ~15 us
    # whatever it takes, and a page over five topics visits each chunk five times.
    by_chunk: dict[int, tuple[_Chunk, list[np.ndarray]]] = {}
    for chunk, rows in picks:
        if cut is not None:
            rows = rows[chunk.ts[rows] <= cut] if forward else rows[chunk.ts[rows] >= cut]
        if len(rows):
            by_chunk.setdefault(id(chunk), (chunk, []))[1].append(rows)
    return _joined(
        [chunk.take(np.concatenate(rows).astype(np.int64), columns) for chunk, rows in by_chunk.values()], columns
    )


def _table_by_hash(view: _View, hashes: Sequence[bytes], columns: Sequence[str]) -> pa.Table:
    """The visible rows of the tier with one of ``hashes`` (each at most
    once: a hash is one MUID), of ``columns`` and their hash."""
    columns = list(dict.fromkeys(("message_hash", *columns)))
    return _joined([chunk.take(rows, columns) for chunk, rows in _with_hashes(view, hashes)], columns)


def _joined(parts: list[pa.Table], columns: Sequence[str]) -> pa.Table:
    """The rows taken from several chunks as one Arrow chunk: the page's
    filter, order and encoding then run once, not a chunk at a time."""
    if not parts:
        return schema.empty_page(columns)
    return pa.concat_tables(parts).combine_chunks() if len(parts) > 1 else parts[0]


def _with_hashes(view: _View, hashes: Sequence[bytes]) -> Iterator[tuple[_Chunk, np.ndarray]]:
    """(chunk, visible rows) holding one of ``hashes``: the prefix index,
    then the hashes whole."""
    wanted = set(hashes)
    for chunk, rows in _matches(view, wanted, "hash_prefix", "hash_row"):
        exact = [row for row, value in zip(rows.tolist(), chunk.hashes[rows]) if value.tobytes() in wanted]
        if exact:
            yield chunk, np.array(exact, dtype=np.int64)


def _held_muids(view: _View, muids: Sequence[bytes]) -> set[bytes]:
    """Those of ``muids`` that a visible row of the tier has."""
    wanted = set(muids)
    held: set[bytes] = set()
    for chunk, rows in _matches(view, wanted, "muid_prefix", "muid_row"):
        held.update(k for k in chunk.take(rows).column("muid").to_pylist() if k in wanted)
    return held


def _matches(view: _View, keys: set[bytes], prefixes_of: str, rows_of: str) -> Iterator[tuple[_Chunk, np.ndarray]]:
    """(chunk, visible rows) whose key (hash or MUID) shares an 8-byte
    prefix with one of ``keys``."""
    if not keys:
        return
    prefixes = np.unique(key_prefixes(list(keys), 8))
    for chunk in view.chunks:
        at = matching(getattr(chunk, prefixes_of), prefixes)
        if not len(at):
            continue
        rows = getattr(chunk, rows_of)[at].astype(np.int64)
        keep = chunk.ts[rows] >= view.floor  # visible (see _Chunk.visible), for these rows alone
        if chunk.dead is not None:
            keep &= ~chunk.dead[rows]
        rows = rows[keep]
        if len(rows):
            yield chunk, rows


def _keys_by_hash(view: _View, hashes: Sequence[bytes]) -> tuple[list[bytes], list[int], list[int]]:
    """(hash, timestamp, topic pair) of each visible row with one of
    ``hashes``, from the chunks' indexes alone (no take from the rows)."""
    found: tuple[list[bytes], list[int], list[int]] = ([], [], [])
    for chunk, rows in _with_hashes(view, hashes):
        found[0].extend(value.tobytes() for value in chunk.hashes[rows])
        found[1].extend(chunk.ts[rows].tolist())
        found[2].extend(chunk.row_pair[rows].tolist())
    return found


def _key_table(view: _View, pairs: TopicPairs, hashes: Sequence[bytes], columns: Sequence[str]) -> pa.Table:
    """:func:`_table_by_hash` of key columns only (hash, pubsub and content
    topics, timestamp), built from the indexes."""
    keys, timestamps, pair_ids = _keys_by_hash(view, hashes)
    names = pairs.names(pair_ids)
    values = {
        "message_hash": keys,
        "timestamp": timestamps,
        "pubsub_topic": [n[0] for n in names],
        "content_topic": [n[1] for n in names],
    }
    target = schema.page_schema(columns)
    return pa.Table.from_arrays([pa.array(values[f.name], f.type) for f in target], schema=target)


def _by_hashes(view: _View, pairs: TopicPairs, query: HistoryQuery, key: Key | None) -> tuple[Rows, tuple[bytes, ...]]:
    wanted = tuple(dict.fromkeys(query.message_hashes))
    columns = schema.page_columns(query.include_data, True)
    # The content topic too, for the query's topics (status-go's
    # presence checks have none).
    read = list(dict.fromkeys((*columns, "content_topic") if query.content_topics else columns))
    if set(read) <= _INDEXED_KEYS:
        matched = _key_table(view, pairs, wanted, read)
    else:
        matched = _table_by_hash(view, wanted, read)
    held = set(matched.column("message_hash").to_pylist())
    # Every row read holds one of the hashes: the other predicates remain.
    found = select(matched, dataclasses.replace(query, message_hashes=()), key)
    return Rows(found.table.select(list(columns)), found.order), tuple(h for h in wanted if h not in held)


def _order_only(query: HistoryQuery) -> HistoryQuery:
    """``query`` with its order and size alone: no predicate."""
    return dataclasses.replace(query, pubsub_topic=None, content_topics=(), time_start=None, time_end=None)


def _combined(column):
    return column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
