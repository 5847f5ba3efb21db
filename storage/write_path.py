"""The write path shared by every table of record.

A batch is made durable in the write-ahead log (the point where a record
counts as stored) and kept in memory, visible to readers, until a flush
commits it to Delta with a MERGE on the table's key scoped to the day
partitions the batch touches, retried on conflict. A bounded set of
recent keys drops duplicates before they reach the log. A batch travels
as Arrow from the put to the commit: the caller builds the rows a column
at a time, the log records them as Arrow IPC, the commit sends the
puts' chunks, and row objects are built only when a query first reads
the rows waiting for a commit.

Two commit strategies, chosen by whether the node owns its table
(:meth:`WritePath._commit_shared`, :meth:`WritePath._commit_owned`):

- shared (a fleet): every batch is a MERGE scoped to the touched days. Two
  nodes sharing one table may both hold the same record; a MERGE reads the
  partitions it checks, so Delta's optimistic concurrency turns a
  concurrent insert of the same key into a commit conflict, and the retry
  re-reads and skips what the other node already landed. Scoping to the
  touched days keeps the cost proportional to a day, not to the table.
- owned (the default): one process writes the table (the data dir lock
  sees to it), so the node can know exactly what it holds. It keeps a
  Bloom filter per day partition of every key in the table
  (:class:`~wakustore.storage.key_filter.DayKeyFilter`). A key no filter
  has seen is new for certain; a key some day's filter might hold (a
  duplicate older than the recent set, a copy re-sent days later with a
  new timestamp, or a false positive: ~0.3% of new keys) is looked up in
  those days before the put returns: in process, in the table reader's
  key index (MUID prefixes of every data file, a match confirmed by
  reading the row's MUID), and through the engine only when that index
  cannot answer. An engine query here cost more as the days grew (bench
  store, 3M messages over 9 days: the put rate fell from 28k to 11k msg/s
  once duplicates outran the recent set; with the index, 36k to 27k
  msg/s, the rest of the fall being the confirming reads of uncompacted
  files). So every row in the buffer is known
  to be new when the put is acknowledged: queries may show it at once and
  exactly once, and the commit is a plain append. Measured on this machine
  kind with 5,000-row batches: append 0.04 s, MERGE 0.09 s; and Sail's
  memory grows with every MERGE and is never returned (engine-notes),
  while appends stay flat. Only rows of an append whose outcome is unknown
  (the engine failed under it) are MERGEd, scoped to their own days, on
  the retry.
"""

from __future__ import annotations

import bisect
import collections
import contextlib
import datetime as dt
import heapq
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

import pyarrow as pa
import pyarrow.compute as pc

from wakustore.storage.engine import CommitConflict
from wakustore.storage.key_filter import DayKeyFilter
from wakustore.storage.table import LOG_RETENTION, DeltaTableRef
from wakustore.storage.wal import MAX_RECORD_SIZE, DamagedRegion, Times, WriteAheadLog

log = logging.getLogger(__name__)

R = TypeVar("R")

# Commit retries on conflict: exponential backoff from 50 ms, 8 tries
# (engine-notes: two writers on one table conflicted in 23 of 40 commits;
# retries with backoff made every one land).
COMMIT_ATTEMPTS = 8
COMMIT_BACKOFF_S = 0.05


@dataclass(frozen=True, slots=True)
class RowCodec(Generic[R]):
    """How one table's rows are keyed and turned into Arrow and back. The
    log holds Arrow rows; ``decode`` reads the row-per-record logs of
    earlier versions."""

    key: Callable[[R], bytes]
    decode: Callable[[bytes], R]
    to_arrow: Callable[[Sequence[R]], pa.Table]
    from_arrow: Callable[[pa.Table], list[R]]
    key_column: str
    partition_column: str
    # The (timestamp, hash) queries order rows by and cursors name: when
    # set, the rows waiting for a commit are kept sorted by it and by hash
    # (see WritePath.pending_scan and WritePath.pending_by_hash).
    order: Callable[[R], tuple[int, bytes]] | None = None
    # With ``order``: the group (topics) a query may name, indexed apart
    # so that a scan reads only the groups asked for.
    group: Callable[[R], object] | None = None
    # The column of a row's time, and its unit in nanoseconds: what the
    # log's damage reports give as the time range a record holds.
    time_column: str = "timestamp"
    time_unit_ns: int = 1


class BufferFull(Exception):
    """The write path holds its maximum of uncommitted rows (the engine is
    down or slower than ingest); the caller should answer "busy"."""


# Keys per existence lookup (64-byte MUIDs: a 320 KB IN list).
LOOKUP_CHUNK = 5_000

# Rows allowed to wait for a commit: at ~1 KB each, ~200 MB; with one
# commit a second that is minutes of a busy node's traffic.
DEFAULT_MAX_PENDING = 200_000


class BoundedSet:
    """A set of recent keys that holds at most ``capacity`` of them and
    always the last ``capacity // 2`` added: two generations of plain sets,
    the older dropped whole when the newer fills. Plain sets take a put's
    thousands of keys in one C call (an insertion-ordered map evicting one
    key at a time cost about a microsecond a key)."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._generation = max(1, capacity // 2)
        self._current: set[bytes] = set()
        self._previous: set[bytes] = set()

    def __contains__(self, key: bytes) -> bool:
        return key in self._current or key in self._previous

    def __len__(self) -> int:
        return len(self._current) + len(self._previous)

    def common(self, keys) -> set[bytes]:
        """The members among ``keys`` (a set or a dict's keys), found in C."""
        return (keys & self._current) | (keys & self._previous)

    def add(self, key: bytes) -> None:
        self.add_many((key,))

    def add_many(self, keys) -> None:
        keys = list(keys)
        while keys:
            room = self._generation - len(self._current)
            if room <= 0:
                self._previous, self._current = self._current, set()
                continue
            self._current.update(keys[:room])
            keys = keys[room:]


class _SortedRun:
    """Entries kept in a list that is sorted when read: a put appends its
    thousands of entries in one call, and the sort before the next read
    merges the appended run in linear time (Timsort finds the two runs).
    A sorted container paid a bisect and an insert per entry at put time,
    on every put, read or not."""

    __slots__ = ("_items", "_sorted")

    def __init__(self, items: list | None = None):
        self._items: list = items if items is not None else []
        self._sorted = len(self._items) <= 1

    def __len__(self) -> int:
        return len(self._items)

    def add(self, entry: tuple) -> None:
        self._items.append(entry)
        self._sorted = len(self._items) <= 1

    def extend(self, entries: list) -> None:
        self._items.extend(entries)
        self._sorted = len(self._items) <= 1

    def irange(self, low: tuple | None, high: tuple | None, reverse: bool) -> Iterator[tuple]:
        """Entries with low <= entry < high (None: unbounded), in order
        (descending when ``reverse``), read in place."""
        items = self._items
        if not self._sorted:
            items.sort()
            self._sorted = True
        start = 0 if low is None else bisect.bisect_left(items, low)
        stop = len(items) if high is None else bisect.bisect_left(items, high)
        indexes = range(stop - 1, start - 1, -1) if reverse else range(start, stop)
        return (items[i] for i in indexes)


class _Pending(Generic[R]):
    """One generation of rows waiting for a commit (the buffer, or the batch
    in flight), kept as the Arrow chunks the puts built and the set of
    their keys: a put adds no object per row. Queries read them through
    row objects and indexes (by key; when the codec orders rows, sorted by
    (timestamp, hash, key) and by hash) built from the chunks on the first
    read that needs them, a chunk once. Guarded by the write path's lock."""

    __slots__ = ("_by_hash", "_chunks", "_codec", "_groups", "_indexed", "_keys", "_order", "rows")

    def __init__(self, codec: RowCodec[R]):
        self._codec = codec
        self._keys: set[bytes] = set()
        # (keys, Arrow rows, row objects if the put had them) per put, in order.
        self._chunks: list[tuple[list[bytes], pa.Table, Sequence[R] | None]] = []
        self._indexed = 0  # chunks whose rows are in the read indexes
        self.rows: dict[bytes, R] = {}
        # The key ends each entry: two rows may share (timestamp, hash).
        self._order: _SortedRun | None = _SortedRun() if codec.order is not None else None
        self._groups: dict[object, _SortedRun] = {}
        self._by_hash: dict[bytes, R] = {}

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, key: bytes) -> bool:
        return key in self._keys

    def keys(self) -> set[bytes]:
        return self._keys

    def add(self, keys: list[bytes], table: pa.Table, rows: Sequence[R] | None = None) -> None:
        """Add a put's rows: ``keys`` distinct and none of them here already
        (the write path sees to it), ``table`` the same rows as Arrow, and
        ``rows`` as objects when the caller had them."""
        if not keys:
            return
        self._keys.update(keys)
        self._chunks.append((keys, table, rows))

    def absorb(self, other: _Pending[R]) -> None:
        for chunk in other._chunks:
            self.add(*chunk)

    def table(self) -> pa.Table:
        """Every row as Arrow, in put order."""
        tables = [table for _, table, _ in self._chunks]
        if len(tables) == 1:
            return tables[0]
        return pa.concat_tables(tables) if tables else self._codec.to_arrow([])

    def key_list(self) -> list[bytes]:
        """Every key, in the order of :meth:`table`."""
        return [key for keys, _, _ in self._chunks for key in keys]

    def values(self):
        self._index()
        return self.rows.values()

    def by_hash(self, hash_: bytes) -> R | None:
        self._index()
        return self._by_hash.get(hash_)

    def entries(self, low_ts: int | None, high_ts: int | None, reverse: bool, group: object = None) -> Iterator[tuple]:
        """(timestamp, hash, key) with low <= timestamp <= high (None:
        unbounded), of one group or (None) of all, ascending unless ``reverse``."""
        if self._order is None:
            raise TypeError("the rows of this table are not ordered")
        self._index()
        entries = self._order if group is None else self._groups.get(group)
        if not entries:
            return iter(())
        # (ts,) sorts before every (ts, hash, key): inclusive low, exclusive high + 1.
        low = (low_ts,) if low_ts is not None else None
        high = (high_ts + 1,) if high_ts is not None else None
        return entries.irange(low, high, reverse)

    def _index(self) -> None:
        """Bring the chunks added since the last read into the read indexes."""
        while self._indexed < len(self._chunks):
            keys, table, rows = self._chunks[self._indexed]
            self._indexed += 1
            if rows is None:
                rows = self._codec.from_arrow(table)
            self._index_rows(keys, rows)

    def _index_rows(self, keys: list[bytes], rows: Sequence[R]) -> None:
        self.rows.update(zip(keys, rows))
        if self._order is None:
            return
        order, group = self._codec.order, self._codec.group
        assert order is not None  # self._order is set when the codec has an order
        by_hash = self._by_hash
        entries = []
        by_group: dict[object, list] = {}
        for key, row in zip(keys, rows):
            timestamp, hash_ = order(row)
            entry = (timestamp, hash_, key)
            entries.append(entry)
            if hash_ not in by_hash:
                by_hash[hash_] = row
            if group is not None:
                name = group(row)
                members = by_group.get(name)
                if members is None:
                    by_group[name] = [entry]
                else:
                    members.append(entry)
        self._order.extend(entries)
        for name, members in by_group.items():
            existing = self._groups.get(name)
            if existing is None:
                self._groups[name] = _SortedRun(members)
            else:
                existing.extend(members)


def _tagged(entries: Iterator[tuple], generation: _Pending) -> Iterator[tuple[tuple, _Pending]]:
    for entry in entries:
        yield entry, generation


class WritePath(Generic[R]):
    """Durable buffer in front of one Delta table. Thread-safe."""

    def __init__(
        self,
        table: DeltaTableRef,
        wal_dir: Path | str,
        codec: RowCodec[R],
        recent_keys: int,
        flush_interval_s: float,
        flush_max_rows: int,
        key_filter: DayKeyFilter | None = None,
        max_pending: int = DEFAULT_MAX_PENDING,
        on_commit: Callable[[], None] | None = None,
        key_lookup: Callable[[list[bytes], list[dt.date]], set[bytes] | None] | None = None,
        trim_log_every: int = 0,
        trim_log_retention: str = LOG_RETENTION,
        after_commit: Callable[[list[object]], None] | None = None,
    ):
        self.table = table
        # Called with the partitions a commit wrote to, after it landed and
        # its rows left the pending set (the table's upkeep between commits).
        # Must not raise.
        self.after_commit = after_commit
        # Commits between two trims of the table's Delta log (0: never; a
        # table other nodes write keeps its log as its engine does).
        self.trim_log_every = trim_log_every
        self.trim_log_retention = trim_log_retention
        # Which keys the table's files of the given days hold, answered in
        # process (None: it cannot say; the engine is asked). Owned mode:
        # it must know every commit on_commit reported. Shared mode: asked
        # only about a batch's rows of older days (see _commit_shared), and
        # may lag other nodes' commits (the MERGE decides what it misses).
        self.key_lookup = key_lookup
        self.engine_lookups = 0
        # Shared mode: rows of older days left out of a MERGE, their key
        # found in the table first (_commit_shared).
        self.known_old_rows = 0
        # Keys the day filters flagged, and the time spent deciding them.
        self.looked_up = 0
        self.lookup_seconds = 0.0
        # Called once a commit has landed, before its rows leave the pending
        # set: a reader of the table advances there, so that a query sees
        # every row either pending or committed (never neither). Must not raise.
        self.on_commit = on_commit
        self.codec = codec
        self.flush_interval_s = flush_interval_s
        self.flush_max_rows = flush_max_rows
        self._wal = WriteAheadLog(wal_dir, times=record_times(codec))
        self._lock = threading.Lock()  # buffer, in-flight rows, recent keys
        self._put_lock = threading.Lock()  # one put at a time
        self._flush_lock = threading.Lock()
        self._buffer: _Pending[R] = _Pending(codec)
        self._buffer_last_seq = 0
        self._inflight: _Pending[R] = _Pending(codec)
        self._recent = BoundedSet(recent_keys)
        self.key_filter = key_filter
        # Owned mode: set once the key filter holds every key of the table.
        # Until then (a start fills it in the background: see
        # MessageStore.open) every new key is looked up on every day of
        # ``table_days()``.
        self.filter_ready = threading.Event()
        self.filter_ready.set()
        self.table_days: Callable[[], list[dt.date]] | None = None
        # Owned mode: keys of an append that failed after it may have landed,
        # keys accepted while the engine could not be asked whether they are
        # new, and such rows once a commit decided them.
        self._uncertain: set[bytes] = set()
        self._unresolved: set[bytes] = set()
        self._decided: list[R] = []
        self.max_pending = max_pending
        self.appended_rows = 0
        self.merged_rows = 0
        self._last_flush = time.monotonic()
        self.commits = 0
        self.committed_rows = 0
        self.duplicates = 0
        self.last_commit_seconds = 0.0
        # (last sequence number, rows) of each log append not yet trimmed.
        self._logged: collections.deque[tuple[int, int]] = collections.deque()
        self._logged_rows = 0

    def replay(self) -> int:
        """Load what the log still holds into the buffer; returns the rows read.

        In owned mode the log may hold rows that a commit landed just before
        a crash (the log is trimmed after the commit): those are found in the
        table and dropped here, so that the buffer holds only new rows."""
        tables: list[pa.Table] = []
        legacy: list[R] = []  # a log written one record per row
        last_seq = 0
        for seq, record in self._wal.replay():
            if is_batch_record(record):
                tables.append(read_batch_record(record))
            else:
                legacy.append(self.codec.decode(record))
            last_seq = seq
        if legacy:
            tables.insert(0, self.codec.to_arrow(legacy))
        if not tables:
            return 0
        # Records logged by a version with another schema: through row
        # objects into today's (what a record per row always did).
        schema = self.codec.to_arrow([]).schema
        tables = [t if t.schema.equals(schema) else self.codec.to_arrow(self.codec.from_arrow(t)) for t in tables]
        table = tables[0] if len(tables) == 1 else pa.concat_tables(tables)
        keys = table.column(self.codec.key_column).to_pylist()
        first = _first_copies(keys)
        committed = self._known_keys(list(first)) if self.key_filter is not None else set()
        keep = [index for key, index in first.items() if key not in committed]
        with self._lock:
            self._recent.add_many(first)
            if keep:
                self._buffer.add([keys[i] for i in keep], table if len(keep) == len(keys) else table.take(keep))
            self._buffer_last_seq = last_seq
            self._logged.append((last_seq, table.num_rows))
            self._logged_rows += table.num_rows
        if not self._buffer:
            self._trim(last_seq)
        return table.num_rows

    def put(self, rows: Sequence[R]) -> tuple[int, int]:
        """Log and buffer the rows not seen recently; returns (accepted, duplicates).

        Raises :class:`BufferFull` (nothing stored) when the rows waiting for
        a commit reach ``max_pending``."""
        fresh = self.put_new(rows)
        return len(fresh), len(rows) - len(fresh)

    def put_new(self, rows: Sequence[R]) -> set[bytes]:
        """As :meth:`put`; returns the keys that were new."""
        rows = list(rows)
        fresh, _ = self.put_table(self.codec.to_arrow(rows), list(map(self.codec.key, rows)), rows)
        return set(fresh)

    def put_table(
        self, table: pa.Table, keys: list[bytes] | None = None, rows: Sequence[R] | None = None
    ) -> tuple[dict[bytes, int], pa.Table | None]:
        """Log and buffer the rows of ``table`` (the codec's Arrow rows) not
        seen recently, in one log write; returns the new keys, each with its
        row's index in ``table``, and those rows as Arrow (None when none).
        ``keys``: the key column as a list, if the caller has it; ``rows``:
        the same rows as objects, if the caller has them (else queries
        build them from Arrow when they first read the rows).

        One put at a time (its own lock). In owned mode, keys that the table
        may already hold are looked up first (in the reader's key index, or
        one engine call for the batch). The log's fsync happens outside the
        lock that readers of the pending rows take: queries never wait for
        the disk. Raises :class:`BufferFull` (nothing stored) when the rows
        waiting for a commit reach ``max_pending``."""
        if keys is None:
            keys = table.column(self.codec.key_column).to_pylist()
        with self._put_lock:
            with self._lock:
                if len(self._buffer) + len(self._inflight) >= self.max_pending:
                    raise BufferFull(f"{self.max_pending} rows are waiting for a commit")
                fresh = self._unseen(_first_copies(keys))
            unresolved: list[bytes] = []
            if self.key_filter is not None and fresh:
                maybe, by_day = self._maybe(list(fresh))
                started = time.perf_counter()
                try:
                    known = self._lookup(maybe, by_day)
                except Exception as exc:
                    # The table cannot be read (the engine is down and the
                    # key index cannot answer): writes pause, they do not
                    # fail. The rows are made durable and decided at
                    # commit; until then no query shows them.
                    log.info(
                        "%d keys to check while the engine is unavailable (%s): deciding at commit", len(maybe), exc
                    )
                    known, unresolved = set(), maybe
                finally:
                    self.lookup_seconds += time.perf_counter() - started
                    self.looked_up += len(maybe)
                for key in known:
                    del fresh[key]
            with self._lock:
                # A commit or a window replace may have run meanwhile.
                fresh = self._unseen(fresh)
                self.duplicates += len(keys) - len(fresh)
            if not fresh:
                return fresh, None
            picked = list(fresh.values())
            chunk = table if len(picked) == table.num_rows else table.take(picked)
            # A flush meanwhile takes the buffer without these rows and
            # trims the log only up to the sequence it took: safe.
            last_seq = self._wal.append(batch_records(chunk))
            with self._lock:
                self._buffer_last_seq = last_seq
                self._logged.append((last_seq, len(picked)))
                self._logged_rows += len(picked)
                self._buffer.add(list(fresh), chunk, None if rows is None else [rows[i] for i in picked])
                self._recent.add_many(fresh)
                if unresolved:
                    self._unresolved.update(k for k in unresolved if k in fresh)
        return fresh, chunk

    def is_unresolved(self, key: bytes) -> bool:
        """Accepted while the engine was down, not yet known to be new."""
        return key in self._unresolved

    @property
    def has_unresolved(self) -> bool:
        return bool(self._unresolved)

    def take_decided(self) -> list[R]:
        """Rows that the last commits MERGEd without knowing whether they were
        new (see :meth:`is_unresolved`); the caller checks which landed."""
        with self._lock:
            decided, self._decided = self._decided, []
        return decided

    def _unseen(self, first: dict[bytes, int]) -> dict[bytes, int]:
        """``first`` without the keys recent or pending; under the lock.
        Set intersections run in C: most keys of a batch are new."""
        keys = first.keys()
        seen = self._recent.common(keys)
        seen |= keys & self._buffer.keys()
        seen |= keys & self._inflight.keys()
        for key in seen:
            del first[key]
        return first

    def _known_keys(self, keys: list[bytes]) -> set[bytes]:
        """Owned mode: the keys the table holds (exact)."""
        return self._lookup(*self._maybe(keys))

    def _maybe(self, keys: list[bytes]) -> tuple[list[bytes], dict[dt.date, list[bytes]]]:
        """The keys some day's filter might hold, and per day those keys."""
        if not self.filter_ready.is_set() and self.table_days is not None:
            return list(keys), {day: list(keys) for day in self.table_days()}
        assert self.key_filter is not None  # owned mode: both callers test it
        candidates = self.key_filter.candidates(keys)
        by_day: dict[dt.date, list[bytes]] = {}
        for index in sorted(candidates):
            for day in candidates[index]:
                by_day.setdefault(day, []).append(keys[index])
        return [keys[i] for i in sorted(candidates)], by_day

    def _lookup(self, keys: list[bytes], by_day: dict[dt.date, list[bytes]]) -> set[bytes]:
        """Which of ``keys`` the table holds, each looked for on its own
        days (``by_day``): in process a day at a time (a key flagged on 2
        of 30 days is not searched in the other 28 days' files), else one
        engine query over the days of all."""
        if not keys or not by_day:
            return set()
        if self.key_lookup is not None:
            found: set[bytes] = set()
            for day, day_keys in by_day.items():
                known = self.key_lookup(day_keys, [day])
                if known is None:
                    break
                found |= known
            else:
                return found
        self.engine_lookups += 1
        days = sorted(by_day)
        found = set()
        # A replay after a crash may ask about a whole buffer at once: keep
        # each IN list a small request.
        for start in range(0, len(keys), LOOKUP_CHUNK):
            chunk = keys[start : start + LOOKUP_CHUNK]
            found |= self.table.existing_keys(self.codec.key_column, chunk, self.codec.partition_column, days)
        return found

    @contextlib.contextmanager
    def commits_held(self) -> Iterator[None]:
        """No commit of the buffer while held (puts go on into it): another
        verb that puts rows in the table commits, then :meth:`remember` gives
        their keys, with no flush in between that would append one of them
        again unseen."""
        with self._flush_lock:
            yield

    def remember(self, keys: Sequence[bytes], days: Sequence[dt.date]) -> None:
        """Keys that another verb (a window replace, an import) put in the
        table, with their days; the recent set takes them in one call.
        A buffered row put as new meanwhile with one of these keys is
        decided at its commit instead (a MERGE: the table holds it now),
        and no query shows it until then."""
        with self._lock:
            self._recent.add_many(keys)
            pending = self._buffer.keys()
            if pending:
                self._unresolved.update(pending.intersection(keys))
        if self.key_filter is not None:
            self.key_filter.add(keys, days)

    def remember_columns(self, keys: pa.ChunkedArray, days: pa.ChunkedArray) -> None:
        """:meth:`remember` for Arrow columns (a window of a million rows):
        no object per key but for the newest the recent set keeps."""
        with self._lock:
            self._recent.add_many(keys[max(0, len(keys) - 2 * self._recent.capacity) :].to_pylist())
            pending = self._buffer.keys()
            if pending:
                listed = pa.array(list(pending), pa.binary())
                self._unresolved.update(listed.filter(pc.is_in(listed, value_set=keys.combine_chunks())).to_pylist())
        if self.key_filter is not None:
            self.key_filter.add_columns(keys, days)

    @property
    def recent_keys(self) -> int:
        """Keys in the recent set (duplicates caught without a lookup)."""
        return len(self._recent)

    def forget_recent(self) -> None:
        """Rows left the table (retention, a window replace): the recent set
        may name keys that are no longer stored, and must not drop them as
        duplicates when they come again."""
        with self._lock:
            self._recent = BoundedSet(self._recent.capacity)

    def pending_rows(self) -> list[R]:
        """Rows durable in the log but not yet committed (buffer and in
        flight): a copy of them all; queries use :meth:`pending_scan`."""
        with self._lock:
            rows = [*self._buffer.values(), *self._inflight.values()]
        if self._unresolved:
            rows = [r for r in rows if self.codec.key(r) not in self._unresolved]
        return rows

    def pending_scan(
        self,
        low_ts: int | None,
        high_ts: int | None,
        forward: bool,
        accept: Callable[[R], bool],
        fetch: int,
        groups: Sequence[object] | None = None,
    ) -> list[R]:
        """Uncommitted rows with low <= timestamp <= high (None: unbounded)
        in ``groups`` (None: all) that ``accept``, in (timestamp, hash)
        order (descending unless ``forward``): the first ``fetch`` of them,
        plus the others of the last one's timestamp (for an order that
        breaks ties by another key). Reads only the rows of the range and
        groups (the codec must order rows)."""
        out: list[R] = []
        reverse = not forward
        with self._lock:
            generations = [g for g in (self._buffer, self._inflight) if g]
            runs = [
                (g, g.entries(low_ts, high_ts, reverse, group))
                for g in generations
                for group in (groups if groups is not None else [None])
            ]
            tagged = [_tagged(entries, g) for g, entries in runs]
            if len(tagged) > 1:
                tagged = [heapq.merge(*tagged, key=lambda t: t[0], reverse=reverse)]
            unresolved = self._unresolved
            last_ts = None
            for (timestamp, _hash, key), generation in tagged[0] if tagged else ():
                if len(out) >= fetch and timestamp != last_ts:
                    break
                row = generation.rows[key]
                if key in unresolved or not accept(row):
                    continue
                out.append(row)
                last_ts = timestamp
        return out

    def pending_by_hash(self, hashes: Sequence[bytes]) -> list[R]:
        """The uncommitted rows with these hashes (the second part of the
        codec's order), one lookup each."""
        out: list[R] = []
        with self._lock:
            for hash_ in hashes:
                for generation in (self._buffer, self._inflight):
                    row = generation.by_hash(hash_)
                    if row is not None and self.codec.key(row) not in self._unresolved:
                        out.append(row)
                        break
        return out

    @property
    def pending(self) -> int:
        return len(self._buffer) + len(self._inflight)

    @property
    def wal_depth(self) -> int:
        """Rows in the log not yet trimmed (a log record holds many)."""
        return self._logged_rows

    @property
    def log_damage(self) -> list[DamagedRegion]:
        """The damaged regions of the log that opening it found and
        :meth:`replay` skips (storage/wal.py)."""
        return self._wal.damage

    def reported_log_damage(self) -> list[DamagedRegion]:
        """The log's damaged regions to report, kept aside until an
        operator removes them (:meth:`WriteAheadLog.reported_damage`)."""
        return self._wal.reported_damage()

    def flush_due(self) -> bool:
        if not self._buffer:
            return False
        if len(self._buffer) >= self.flush_max_rows:
            return True
        return time.monotonic() - self._last_flush >= self.flush_interval_s

    def flush_deadline(self) -> float | None:
        """When (``time.monotonic()``) :meth:`flush_due` turns true: now once
        the size threshold is reached; None while the buffer is empty. Lets
        a flush loop sleep until then instead of polling."""
        if not self._buffer:
            return None
        if len(self._buffer) >= self.flush_max_rows:
            return time.monotonic()
        return self._last_flush + self.flush_interval_s

    def flush(self) -> int:
        """Commit the buffer; returns the rows committed. On failure the
        batch stays buffered and durable for the next flush."""
        with self._flush_lock:
            with self._lock:
                if not self._buffer:
                    self._last_flush = time.monotonic()
                    return 0
                self._inflight, self._buffer = self._buffer, _Pending(self.codec)
                upto = self._buffer_last_seq
            # Puts add to the new buffer only: the batch in flight is read
            # here without the lock.
            batch = self._inflight.table()
            keys = self._inflight.key_list()
            started = time.monotonic()
            try:
                self._commit(batch, keys)
            except BaseException:
                with self._lock:
                    self._inflight.absorb(self._buffer)
                    self._buffer, self._inflight = self._inflight, _Pending(self.codec)
                raise
            if self.on_commit is not None:
                self.on_commit()
            with self._lock:
                self._inflight = _Pending(self.codec)
            # The log forgets the rows only once the commit is on the disk.
            self.table.sync_commits()
            self._trim(upto)
            self.last_commit_seconds = time.monotonic() - started
            self._last_flush = time.monotonic()
            self.commits += 1
            if self.trim_log_every and self.commits % self.trim_log_every == 0:
                try:
                    self.table.trim_log(self.trim_log_retention)
                except Exception as exc:  # the commit stands; the next trim retries
                    log.warning("could not trim the table's Delta log: %s", exc)
            self.committed_rows += len(keys)
            if self.after_commit is not None:
                self.after_commit(pc.unique(batch.column(self.codec.partition_column)).to_pylist())
            return len(keys)

    def close(self) -> None:
        self._wal.close()

    def _trim(self, upto: int) -> None:
        self._wal.trim(upto)
        with self._lock:
            while self._logged and self._logged[0][0] <= upto:
                self._logged_rows -= self._logged.popleft()[1]

    def _commit(self, batch: pa.Table, keys: list[bytes]) -> None:
        """Commit ``batch`` (Arrow rows) whose keys are ``keys``, in order,
        by the table's strategy: :meth:`_commit_owned` on a table this node
        owns (it has a key filter), :meth:`_commit_shared` on a shared one."""
        if self.key_filter is None:
            self._commit_shared(batch)
        else:
            self._commit_owned(batch, keys, self.key_filter)

    def _commit_owned(self, batch: pa.Table, keys: list[bytes], key_filter: DayKeyFilter) -> None:
        """The owned strategy: the rows known new at put time are appended;
        the rows of an append whose outcome is unknown are MERGEd on their
        own days; the rows whose first copy may be older (a filter named
        their key, no lookup settled it) are MERGEd on every day a filter
        names. The key filter learns every key committed."""
        uncertain, unresolved = self._uncertain, self._unresolved
        if uncertain or unresolved:
            fresh = [i for i, k in enumerate(keys) if k not in uncertain and k not in unresolved]
            retried = [i for i, k in enumerate(keys) if k in uncertain]
            undecided = [i for i, k in enumerate(keys) if k in unresolved and k not in uncertain]
        else:
            fresh, retried, undecided = None, [], []
        if fresh is None or fresh:
            arrow = batch if fresh is None else batch.take(fresh)
            fresh_keys = keys if fresh is None else [keys[i] for i in fresh]
            try:
                # Not repeated by the engine after a restart: an append that
                # landed before the failure was seen must not land twice.
                # Its rows are MERGEd instead when the flush is retried.
                self.table.append(arrow, retry=False)
            except BaseException:
                self._uncertain.update(fresh_keys)
                raise
            finally:
                # Either way the keys may be in the table now.
                key_filter.add_columns(arrow.column(self.codec.key_column), arrow.column(self.codec.partition_column))
            self.appended_rows += len(fresh_keys)
        if retried:
            # Known new at put time: only our own failed append can hold them.
            self._merge_scoped(batch.take(retried))
            self._uncertain.difference_update(keys[i] for i in retried)
        if undecided:
            # Their first copy may be on any day a filter names.
            part = batch.take(undecided)
            undecided_keys = [keys[i] for i in undecided]
            own_days = part.column(self.codec.partition_column).to_pylist()
            days = set().union(*key_filter.candidate_days(undecided_keys), own_days)
            self._merge_scoped(part, sorted(days))
            key_filter.add(undecided_keys, own_days)
            rows = self.codec.from_arrow(part)
            with self._lock:
                self._unresolved.difference_update(undecided_keys)
                self._decided.extend(rows)

    def _commit_shared(self, batch: pa.Table) -> None:
        """The shared strategy: one MERGE on the key, scoped to the days of
        the batch's rows, without the rows of older days whose key the
        table is known to hold already.

        Why: a MERGE reads every file of the days it is scoped to, and a
        re-send of an old message (a peer re-publishing, store sync) has
        the old message's timestamp, hence its day. In bench store's 10M
        dataset 2% of messages are such re-sends: an 11,000-row batch
        touched 2 days at 100k messages, 16 at 5M and all 31 at 9.9M, and
        late MERGEs read the whole table (0.19 -> 1.14 s, p50). The rows
        of days before the batch's newest two are looked up in process
        (the reader's key index) and those found leave the batch; what
        the lookup cannot say or misses (another node's newer commit) the
        MERGE still decides."""
        column = self.codec.partition_column
        days = batch.column(column)
        if self.key_lookup is not None and batch.num_rows:
            numbers = pc.cast(days, pa.int32())
            old = pc.less(numbers, pc.subtract(pc.max(numbers), 1))
            if pc.any(old).as_py():
                older = batch.filter(old)
                keys = older.column(self.codec.key_column)
                try:
                    known = self.key_lookup(keys.to_pylist(), sorted(set(older.column(column).to_pylist())))
                except Exception as exc:  # the MERGE decides them all
                    log.info("old rows of a batch not looked up (the MERGE decides them): %s", exc)
                    known = None
                if known:
                    held = pc.and_(
                        old, pc.is_in(batch.column(self.codec.key_column), value_set=pa.array(list(known), pa.binary()))
                    )
                    batch = batch.filter(pc.invert(held))
                    self.known_old_rows += len(known)
        if batch.num_rows:
            self._merge_scoped(batch)

    def _merge_scoped(self, arrow: pa.Table, days: list[object] | None = None) -> None:
        """MERGE on the key, scoped to ``days`` (default: the partitions the rows touch)."""
        column = self.codec.partition_column
        if days is None:
            days = sorted(set(arrow.column(column).to_pylist()))
        retry_on_conflict(
            lambda: self.table.merge_new(arrow, key=self.codec.key_column, partition=column, partition_values=days)
        )
        self.merged_rows += arrow.num_rows

    def load_filter(self) -> int:
        """Fill the key filter from the table (owned mode); returns the count."""
        if self.key_filter is None:
            return 0
        self.key_filter.clear()
        count = 0
        for keys, days in self.table.key_day_batches(self.codec.key_column, self.codec.partition_column):
            self.key_filter.add(keys, days)
            count += len(keys)
        return count


def _first_copies(keys: list[bytes]) -> dict[bytes, int]:
    """Each distinct key with the index of its first copy, in that order."""
    first = dict(zip(keys, range(len(keys))))
    if len(first) < len(keys):  # a key twice in the batch: the first copy wins
        first = {}
        for index, key in enumerate(keys):
            first.setdefault(key, index)
    return first


# --- log records ------------------------------------------------------------
# A put logs its rows as Arrow IPC streams (the codec's schema), a batch in
# one record or a few: no object and no encoding call per row. Logs of
# earlier versions hold one record per row in the codec's own encoding; a
# stream starts with the IPC continuation marker, which no such record
# does (they start with a non-negative big-endian arrival time).

_IPC_MARKER = b"\xff\xff\xff\xff"

# Bytes of Arrow rows per log record: records stay well under the log's
# MAX_RECORD_SIZE, and a batch is a few records.
RECORD_TARGET_BYTES = 4 * 1024 * 1024


def batch_records(table: pa.Table) -> list:
    """The log records of a batch of Arrow rows (buffers, no extra copy)."""
    pieces = max(1, -(-table.nbytes // RECORD_TARGET_BYTES))
    step = max(1, -(-table.num_rows // pieces))
    out: list = []
    for start in range(0, table.num_rows, step):
        _encode_slice(table.slice(start, step), out)
    return out


def _encode_slice(table: pa.Table, out: list) -> None:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    record = sink.getvalue()
    if record.size > MAX_RECORD_SIZE // 2 and table.num_rows > 1:
        # Rows of very different sizes: halve until each record fits.
        half = table.num_rows // 2
        _encode_slice(table.slice(0, half), out)
        _encode_slice(table.slice(half), out)
        return
    out.append(record)


def is_batch_record(record: bytes) -> bool:
    return record[:4] == _IPC_MARKER


def read_batch_record(record: bytes) -> pa.Table:
    return pa.ipc.open_stream(pa.py_buffer(record)).read_all()


def record_rows(record: bytes) -> int:
    """How many rows a log record holds (a row-per-record log: one)."""
    return read_batch_record(record).num_rows if is_batch_record(record) else 1


def record_times(codec: RowCodec) -> Times:
    """The lowest and highest time (ns) of the rows a log record of
    ``codec``'s table holds (None for a record without rows)."""

    def times(record: bytes) -> tuple[int, int] | None:
        table = read_batch_record(record) if is_batch_record(record) else codec.to_arrow([codec.decode(record)])
        if table.num_rows == 0:
            return None
        bounds = pc.min_max(table.column(codec.time_column))
        return bounds["min"].as_py() * codec.time_unit_ns, bounds["max"].as_py() * codec.time_unit_ns

    return times


def retry_on_conflict(commit: Callable[[], object]) -> None:
    """Run one Delta commit, retrying with backoff while it conflicts."""
    for attempt in range(COMMIT_ATTEMPTS):
        try:
            commit()
            return
        except CommitConflict as exc:
            if attempt == COMMIT_ATTEMPTS - 1:
                raise
            delay = COMMIT_BACKOFF_S * (2**attempt)
            log.info("commit conflict, retry %d in %.2f s: %s", attempt + 1, delay, exc)
            time.sleep(delay)
