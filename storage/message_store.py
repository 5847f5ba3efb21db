"""The message store: one object whose verbs map to Delta transactions.

Write path (see :mod:`wakustore.storage.write_path`): :meth:`MessageStore.put`
makes a batch durable in the write-ahead log and visible to queries at
once; :meth:`flush` commits it with a MERGE on MUID scoped to the days the
batch touches. A bounded set of recent MUIDs drops relay duplicates before
they reach the log.

Read path: Store v3 / legacy v2 pages come from the table, read in
process by :class:`~wakustore.storage.reader.TableReader` (one table
version per page, advanced after every commit), merged with the rows not
yet committed, so a message is visible as soon as :meth:`put` returns.
"""

from __future__ import annotations

import contextlib
import logging
import operator
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from wakustore.protocols.message import WakuMessage
from wakustore.protocols.store_query import (
    HistoryQuery,
    Page,
)
from wakustore.storage import log_repair, maintenance, schema
from wakustore.storage.hash_worker import BatchHasher
from wakustore.storage.hot_tier import ALL_TIME, HotTier
from wakustore.storage.key_filter import DEFAULT_DAY_CAPACITY, DayKeyFilter
from wakustore.storage.read_path import ReadPath
from wakustore.storage.reader import DataFileUnreadable, TableReader
from wakustore.storage.rows import (
    Row,
    binary_prefixes,
    decode_record,
    messages_to_arrow,
    rows_from_arrow,
    to_arrow,
)
from wakustore.storage.staging import StagedRows, is_local
from wakustore.storage.table import LOG_RETENTION, SHARED_LOG_RETENTION, DeltaTableRef
from wakustore.storage.wal import DamagedRegion
from wakustore.storage.window_files import StagedFiles
from wakustore.storage.write_path import RowCodec, WritePath, retry_on_conflict

log = logging.getLogger(__name__)

# Defaults of the flush policy: about one commit a second, or sooner when
# 5,000 messages wait (Delta wants batches; engine-notes: a 100-row MERGE
# costs 0.6-1.1 s, an 11k-row one 0.23 s).
DEFAULT_FLUSH_INTERVAL_S = 1.0
DEFAULT_FLUSH_MAX_MESSAGES = 5000

# Relay delivers duplicates within seconds to minutes; a million recent
# MUIDs (~104 MB: a key object and a set slot each) covers hours of a busy
# shard set. Older duplicates are still caught: by an exact lookup in the
# key index (a table this node owns) or by the MERGE (a shared table).
# Half as many cost bench store at 1M ~5% of its rate in lookups.
DEFAULT_RECENT_MUIDS = 1_000_000

# Hot tier (see hot_tier.py): a day of recent history, at most 256 MiB.
# 0 turns it off, as a fleet sharing one table must.
DEFAULT_HOT_TIER_BYTES = 256 * 1024 * 1024
DEFAULT_HOT_WINDOW_S = 86_400
# A row as the warm start counts it when it asks the table for the last
# window (the tier's bookkeeping plus a kilobyte-sized payload): a budget's
# worth of rows, not more, crosses from the engine at a start.
WARM_ROW_BYTES = 1024
# Of the hot tier's budget, what a warm-up from the key index fills (rows
# measured by their files' bytes a row, which the tier's own count of a
# row passed by 12% in bench store): the puts after it fill the rest
# before the oldest are evicted (an eviction at the warm-up rebuilt the
# tier: 0.7 s and a copy of it).
WARM_SHARE = 0.75

# Hashes per lookup when an import checks which recent rows it stored: an
# IN list of this size stays a small request (32 bytes a hash).
IMPORT_LOOKUP_KEYS = 10_000

# Commits between two trims of the Delta log (DeltaTableRef.trim_log):
# about 0.1 s each, every ~2 minutes at one commit a second. A fleet's
# nodes trim too, keeping the commits of the last ten minutes.
TRIM_LOG_EVERY = 100

# Cursors the node handed out recently, hash -> ordering timestamp, so that
# the next page needs no lookup by hash (js-waku re-sends the last hash).
DEFAULT_CURSOR_CACHE = 100_000

# How long close() waits for the threads still using the store (an export
# or an import finishing its current step, a read a cancelled task left)
# and for the key filter's filling thread, before it closes anyway.
USERS_WAIT_S = 60.0
THREAD_JOIN_S = 10.0


class StoreClosed(RuntimeError):
    """The store is closing or closed: no new work may start on it."""


# Key, order and group are read once per message on the put path:
# attrgetter does it in C.
MESSAGE_CODEC = RowCodec(
    key=operator.attrgetter("muid"),
    decode=decode_record,
    to_arrow=to_arrow,
    from_arrow=rows_from_arrow,
    key_column="muid",
    partition_column=schema.MESSAGES_PARTITION,
    order=operator.attrgetter("timestamp", "message_hash"),
    group=operator.attrgetter("pubsub_topic", "message.content_topic"),
)


@dataclass(frozen=True, slots=True)
class StoreConfig:
    flush_interval_s: float = DEFAULT_FLUSH_INTERVAL_S
    flush_max_messages: int = DEFAULT_FLUSH_MAX_MESSAGES
    recent_muids: int = DEFAULT_RECENT_MUIDS
    cursor_cache: int = DEFAULT_CURSOR_CACHE
    hot_tier_bytes: int = DEFAULT_HOT_TIER_BYTES
    hot_window_s: int = DEFAULT_HOT_WINDOW_S
    # A table other nodes write too (a fleet): every commit is a MERGE and
    # there is no hot tier, since this node does not see every write.
    shared_table: bool = False
    # Expected rows a day for the owned-table key filter (sizing only).
    messages_per_day: int = DEFAULT_DAY_CAPACITY


@dataclass(frozen=True, slots=True)
class PutResult:
    accepted: int
    duplicates: int


@dataclass(eq=False, slots=True)
class StagedWindow:
    """A window's rows staged for :meth:`MessageStore.commit_window`, with
    what the store's indexes learn once they are committed. Removes its
    staged files on :meth:`close` (or leaving its ``with``)."""

    start_ns: int
    end_ns: int
    content_topics: list[str]
    rows: StagedRows | StagedFiles
    now_ns: int  # when it was staged: the hot tier's horizon for its rows
    source: pa.Table | str | StagedFiles | None = None
    # The staged rows' MUIDs and days (copies: a staged table may map a
    # file that must be unmapped once staged), and the MUIDs' first 8
    # bytes, by which repeats are found without an object per row.
    muids: list[pa.Array] = field(default_factory=list)
    days: list[pa.Array] = field(default_factory=list)
    prefixes: list[np.ndarray] = field(default_factory=list)
    sorted_prefixes: np.ndarray = field(default_factory=lambda: np.empty(0, np.uint64))
    count: int = 0
    recent: list[Row] = field(default_factory=list)
    older: Row | None = None

    def first_copies(self, table: pa.Table) -> pa.Table:
        """``table`` without the rows whose MUID an earlier row of the
        window (staged before, or above in ``table``) holds: the first copy
        wins, as :meth:`MessageStore.replace_window` keeps it. Rows are
        compared by their first 8 bytes, and exactly only where those
        repeat."""
        keys = table.column("muid")
        prefixes = binary_prefixes(keys, 8)
        # Searches in sorted arrays (np.isin and np.unique hashed: ~3 s a
        # million rows).
        ordered = np.sort(prefixes)
        repeated = ordered[1:][ordered[1:] == ordered[:-1]]
        earlier = self.sorted_prefixes
        found = np.searchsorted(earlier, prefixes)
        hit = (
            earlier[np.minimum(found, len(earlier) - 1)] == prefixes if len(earlier) else np.zeros(len(prefixes), bool)
        )
        suspects = np.unique(np.concatenate([repeated, prefixes[hit]]))
        if len(suspects):
            known = set()
            for chunk, chunk_prefixes in zip(self.muids, self.prefixes):
                known.update(chunk.filter(pa.array(np.isin(chunk_prefixes, suspects))).to_pylist())
            keep = np.ones(len(prefixes), bool)
            for index in np.flatnonzero(np.isin(prefixes, suspects)).tolist():
                key = keys[index].as_py()
                keep[index] = key not in known
                known.add(key)
            if not keep.all():
                table, prefixes = table.filter(pa.array(keep)), prefixes[keep]
        self.prefixes.append(prefixes)
        # Two sorted runs, merged by the stable sort in linear time.
        self.sorted_prefixes = np.sort(np.concatenate([earlier, np.sort(prefixes)]), kind="stable")
        self.muids.append(_copy(table.column("muid")))
        self.days.append(_copy(table.column(schema.MESSAGES_PARTITION)))
        self.count += table.num_rows
        return table

    def __enter__(self) -> StagedWindow:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def close(self) -> None:
        self.source = None
        self.rows.close()


def _copy(column: pa.ChunkedArray) -> pa.Array:
    """A column's values in buffers of their own."""
    return pa.concat_arrays([*column.chunks, pa.array([], column.type)])


class MessageStore:
    """Waku messages in a Delta table, deduplicated by MUID.

    Thread-safe: the node calls every verb from worker threads.
    """

    def __init__(
        self,
        table: DeltaTableRef,
        wal_dir: Path | str,
        config: StoreConfig = StoreConfig(),
        reader: TableReader | None = None,
        index_directory: Path | str | None = None,
    ):
        self.table = table
        self.config = config
        # Pages and lookups by hash; the engine behind ``table`` writes.
        # ``index_directory``: a directory of this node's where the reader
        # keeps the key index of every data file (storage.index_files).
        if reader is None:
            reader = TableReader(table.uri, index_directory=index_directory)
        self.reader = reader
        self._closing = threading.Event()
        self._filler: threading.Thread | None = None
        self.repaired = log_repair.Repair()  # what open() put aside of the table's log
        # Threads inside in_use(), which close() waits for.
        self._users = 0
        self._users_changed = threading.Condition()
        # A window of a table this node owns on this machine is written
        # (storage.window_files) and read for an export here rather than by
        # the engine.
        table.bulk_in_process = not config.shared_table and table.engine.is_embedded and is_local(table.uri)
        self.writes = WritePath(
            table,
            wal_dir,
            MESSAGE_CODEC,
            config.recent_muids,
            config.flush_interval_s,
            config.flush_max_messages,
            key_filter=None if config.shared_table else DayKeyFilter(config.messages_per_day),
            on_commit=self.reader.committed,
            # The reader advances on every commit (on_commit) before its
            # rows leave the pending set, so its files and the pending rows
            # together hold every committed key.
            # A shared table's batches ask it only about their rows of
            # older days (WritePath._commit_shared).
            key_lookup=self.reader.existing_muids,
            # A fleet on an object store leaves its log alone: a metadata
            # change there needs the store's own commit coordination.
            trim_log_every=TRIM_LOG_EVERY if not config.shared_table or is_local(table.uri) else 0,
            trim_log_retention=SHARED_LOG_RETENTION if config.shared_table else LOG_RETENTION,
            # A fleet's MERGEs read every file of the days they touch: each
            # node compacts those days as it commits to them (delta-rs, so
            # the embedded engine on this machine's or a shared file system).
            after_commit=(
                self._compact_crowded
                if config.shared_table and table.engine.is_embedded and is_local(table.uri)
                else None
            ),
        )
        self.compactions = 0
        # The put path's hashes, in a child process started on the first
        # large put (see hash_worker).
        self._hasher = BatchHasher()
        hot_bytes = 0 if config.shared_table else config.hot_tier_bytes
        self.hot = HotTier(hot_bytes, config.hot_window_s * 1_000_000_000)
        # Every Store page is composed there, from the hot tier, the rows
        # waiting for a commit and the table's files.
        self.reads = ReadPath(self.hot, self.writes, self.reader, config.cursor_cache)

    def _compact_crowded(self, days: list) -> None:
        """Compact those of ``days`` (a commit's) that hold many small files
        (maintenance.crowded_days). Never raises: a compaction that failed
        or lost a race with another node's is tried after a later commit."""
        try:
            crowded = maintenance.crowded_days(self.reader.file_sizes_by_day(), days)
        except Exception as exc:
            log.warning("could not list the table's files to compact them: %s", exc)
            return
        if not crowded:
            return
        # Another node (or this node's maintenance) rewriting: not now.
        with maintenance.rewrite_lock(self.table, wait=False) as held:
            if not held:
                return
            files = self.reader.files()
            for day, target in crowded:
                # Never bin-packed with a bad file (its damage would come out
                # looking like data); the reader named it, and this runs at
                # every commit: not logged again.
                if self.reader.check_files([path for path, d in files if d == day]):
                    log.debug("compaction of %s waits: a data file of it cannot be read", day)
                    continue
                started = time.monotonic()
                try:
                    removed = maintenance.compact_day(self.table, day, target)
                except Exception as exc:
                    log.info("compaction of %s not done (tried again after a later commit): %s", day, exc)
                    continue
                self.compactions += 1
                self.reader.committed()
                log.debug("compacted %d files of %s in %.2f s", removed, day, time.monotonic() - started)

    # --- lifecycle --------------------------------------------------------

    def open(self) -> int:
        """Create the table if needed and replay the log; returns replayed count."""
        if not self.config.shared_table and is_local(self.table.uri):
            # Before anything reads it: versions a power cut tore are put
            # aside (their rows are still in the write-ahead log).
            self.repaired = self.table.repair_torn_log()
        self.table.ensure(schema.MESSAGES, schema.MESSAGES_PARTITION, "wakustore messages")
        # Open the reader and build its hash index now rather than on the
        # first page (it reads every file's hash column once: 1.3 s for
        # 900k messages); never fails the open, the first page retries.
        self.reader.committed()
        if self.writes.key_filter is not None and self.reader.can_list_keys():
            # From the key index files, in the background: a start reads no
            # data file; until the filter is full, puts look every new key
            # up on every day (exact, slower).
            self.writes.filter_ready.clear()
            self.writes.table_days = self.reader.days
            self._filler = threading.Thread(target=self._fill_filter, name="key-filter-fill", daemon=True)
            self._filler.start()
        else:
            keys = self.writes.load_filter()
            if keys:
                log.info("key filter: %d MUIDs from the table", keys)
        replayed = self.writes.replay()
        damage = self.writes.log_damage
        if damage:
            # Each region was logged as it was found (storage/wal.py).
            log.warning(
                "replayed %d messages from the write-ahead log, %d damaged region(s) of it (%d bytes) skipped: "
                "the messages in them are lost",
                replayed,
                len(damage),
                sum(region.size for region in damage),
            )
        elif replayed:
            log.info("replayed %d messages from the write-ahead log", replayed)
        if self.hot.enabled:
            self._warm_hot_tier()
        return replayed

    def _warm_hot_tier(self) -> None:
        """Load the last hot window from the table, newest first, up to the budget.

        When the whole table lies inside the window (a young node), the tier
        is complete for all time and even unbounded forward queries stay in
        memory. A bad data file never stops it: the tier is then complete
        from after the rows that file may hold (see
        :meth:`TableReader.newest_rows`), or, when the engine cannot read
        the window either, from now on (the table answers the rest).
        """
        now = time.time_ns()
        since = now - self.hot.window_ns
        budget_rows = max(1, self.hot.max_bytes // WARM_ROW_BYTES)
        # In process from the key index's timestamps (the row groups of the
        # newest rows alone, in no order); through the engine when the
        # index cannot say.
        found = self.reader.newest_rows(since, int(self.hot.max_bytes * WARM_SHARE))
        if found is not None:
            recent, cut = found
            start = cut
        else:
            try:
                recent = self.table.recent(since, budget_rows)
            except Exception as exc:
                log.warning(
                    "hot tier: the table's newest rows cannot be read (%s); it holds the messages from now on", exc
                )
                recent, start = schema.MESSAGES.empty_table(), now
            else:
                start = since
                if recent.num_rows >= budget_rows:
                    # Cut at a timestamp boundary so the tier is complete from start.
                    start = pc.min(recent.column("timestamp")).as_py() + 1
        if start == since:
            try:
                oldest = self.table.oldest_timestamp()
            except Exception as exc:  # unknown: the tier claims its window alone
                log.info("hot tier: the table's oldest timestamp cannot be read: %s", exc)
            else:
                if oldest is None or oldest >= since:
                    start = ALL_TIME
        pending = to_arrow(self.writes.pending_rows())
        self.hot.start(
            start, pa.concat_tables([recent.select(pending.schema.names).cast(pending.schema), pending]), now
        )
        if self.hot.start_ns == ALL_TIME:
            log.info("hot tier: %d messages, the whole table", len(self.hot))
        else:
            assert self.hot.start_ns is not None  # start() above set it; only clear() unsets it
            log.info(
                "hot tier: %d messages, complete from %s",
                len(self.hot),
                datetime.fromtimestamp(self.hot.start_ns / 1e9, UTC).isoformat(timespec="seconds"),
            )

    def _fill_filter(self) -> None:
        """Fill the key filter with the MUIDs of every data file, read from
        the key index; passes until a pass finds no file left (a commit
        meanwhile adds its own keys)."""
        started = time.monotonic()
        keys = 0
        try:
            done: set[str] = set()
            while not self._closing.is_set():
                todo = [(path, day) for path, day in self.reader.files() if path not in done]
                if not todo:
                    break
                for path, day in todo:
                    if self._closing.is_set():
                        return
                    try:
                        words = self.reader.muid_words(path)
                    except DataFileUnreadable:
                        # Neither its index nor its data can be read (the
                        # reader names it): a copy of its keys is unreadable
                        # anyway, and a new message with one is stored again.
                        done.add(path)
                        continue
                    if words is None or day is None:
                        raise ValueError(f"no MUIDs in the key index of {path}")
                    assert self.writes.key_filter is not None  # open() starts this thread only with one
                    self.writes.key_filter.add_words_of_day(words, day)
                    keys += len(words)
                    done.add(path)
            else:
                return
        except Exception as exc:
            log.warning("key filter not filled from the key index (%s); reading the table's MUIDs", exc)
            try:
                keys = self.writes.load_filter()
            except Exception as again:
                log.error("key filter not filled (puts look every key up meanwhile): %s", again)
                return
        self.writes.filter_ready.set()
        log.info("key filter: %d MUIDs in %.1f s", keys, time.monotonic() - started)

    def close(self) -> None:
        """Wait for the threads working on the store (:meth:`in_use`), then
        commit what is buffered (best effort) and close the log; the
        filling of the key filter and the reader's threads stop and are
        joined, each wait bounded."""
        self._closing.set()
        with self._users_changed:
            if not self._users_changed.wait_for(lambda: self._users == 0, timeout=USERS_WAIT_S):
                log.warning("closing the store while %d thread(s) still use it after %g s", self._users, USERS_WAIT_S)
        try:
            self.flush()
        finally:
            self.writes.close()
            self._hasher.close()
            if self._filler is not None:
                self._filler.join(THREAD_JOIN_S)
                if self._filler.is_alive():
                    log.warning("the key filter's filling thread did not stop within %g s", THREAD_JOIN_S)
            self.reader.close()

    @contextlib.contextmanager
    def in_use(self) -> Iterator[MessageStore]:
        """Mark the calling thread as working on the store (an export, an
        import, a read a cancelled task left running): :meth:`close` waits
        for it, up to :data:`USERS_WAIT_S`, before it commits and closes.
        Raises :class:`StoreClosed` once the store is closing."""
        with self._users_changed:
            if self._closing.is_set():
                raise StoreClosed("the store is closing")
            self._users += 1
        try:
            yield self
        finally:
            with self._users_changed:
                self._users -= 1
                self._users_changed.notify_all()

    # --- write path -------------------------------------------------------

    def put(self, messages: Sequence[tuple[str, WakuMessage, int]]) -> PutResult:
        """Store ``(pubsub_topic, message, arrival_ns)`` triples durably.

        Returns once the new ones are fsynced in the write-ahead log and
        visible to queries. Duplicates (by MUID) of recent messages are
        dropped here; older duplicates are dropped by the commit.
        """
        return self.put_groups([messages])[0]

    def put_groups(self, groups: Sequence[Sequence[tuple[str, WakuMessage, int]]]) -> list[PutResult]:
        """Several callers' batches in one log write (one fsync: group
        commit); one result per group. A message in two groups counts as
        accepted in the first only. The messages become Arrow rows a column
        at a time (:func:`rows.messages_to_arrow`): no object per message."""
        flat = [triple for group in groups for triple in group]
        table = messages_to_arrow(flat, self._hasher)
        keys = table.column("muid").to_pylist()
        fresh, accepted = self.writes.put_table(table, keys)
        if accepted is not None and self.hot.enabled and self.hot.start_ns is not None:
            if self.writes.has_unresolved:
                accepted = accepted.filter(
                    pa.array([not self.writes.is_unresolved(k) for k in accepted.column("muid").to_pylist()])
                )
            self.hot.add_table(accepted, time.time_ns())
        if len(groups) == 1:
            return [PutResult(accepted=len(fresh), duplicates=len(flat) - len(fresh))]
        results = []
        start = 0
        for group in groups:
            # A key counts where its first copy is.
            taken = sum(1 for index in range(start, start + len(group)) if fresh.get(keys[index]) == index)
            results.append(PutResult(accepted=taken, duplicates=len(group) - taken))
            start += len(group)
        return results

    def _hot_rows(self, table, now_ns: int) -> tuple[Row | None, list[Row]]:
        """What the hot tier needs of new Arrow rows: of the rows it claims
        but that lie before its window only the newest (it gives up
        completeness below that time; None when there is none), and those
        inside its window, as rows. No object for the others."""
        tier_from = self.hot.start_ns
        stamps = table.column("timestamp")
        if not table.num_rows or tier_from is None or pc.max(stamps).as_py() < tier_from:
            return None, []
        horizon = max(tier_from, now_ns - self.hot.window_ns)
        times = stamps.to_numpy()
        inside = times >= horizon
        recent = rows_from_arrow(table.filter(pa.array(inside))) if inside.any() else []
        below = np.flatnonzero((times >= tier_from) & ~inside)
        if not len(below):
            return None, recent
        return rows_from_arrow(table.slice(int(below[np.argmax(times[below])]), 1))[0], recent

    @property
    def pending(self) -> int:
        """Messages durable in the log but not yet committed to Delta."""
        return self.writes.pending

    @property
    def wal_depth(self) -> int:
        return self.writes.wal_depth

    def wal_damage(self) -> list[DamagedRegion]:
        """The write-ahead log's damaged regions that a start skipped, until
        an operator removes their copies (storage/wal.py)."""
        return self.writes.reported_log_damage()

    def memory_held(self) -> dict[str, int]:
        """What the store holds in memory now, in bytes (``recent_keys``
        and ``pending_rows`` in keys and rows): the hot tier, the key
        index's held part, the decoded row groups, and every buffer Arrow's
        allocator has handed out and not had back (the hot tier's among
        them)."""
        return {
            "hot_tier": self.hot.bytes,
            "key_index": self.reader.index_bytes(),
            "row_group_cache": self.reader.cached_bytes(),
            "arrow_allocated": pa.total_allocated_bytes(),
            "recent_keys": self.writes.recent_keys,
            "pending_rows": self.writes.pending,
        }

    def flush_due(self) -> bool:
        return self.writes.flush_due()

    def flush_deadline(self) -> float | None:
        return self.writes.flush_deadline()

    def flush(self) -> int:
        """Commit the buffer to Delta; returns the number of messages committed."""
        committed = self.writes.flush()
        decided = self.writes.take_decided()
        if decided and self.hot.enabled:
            # Accepted while the engine was down and MERGEd without knowing
            # whether they were new: the tier takes those that landed.
            try:
                stored = self.table.existing_keys(
                    "message_hash",
                    [r.message_hash for r in decided],
                    schema.MESSAGES_PARTITION,
                    sorted({schema.day_of_ns(r.timestamp) for r in decided}),
                )
            except Exception:
                # Unknown: the tier can no longer claim completeness.
                self.hot.clear()
                raise
            self.hot.add([r for r in decided if r.message_hash in stored], time.time_ns())
        return committed

    # --- read path --------------------------------------------------------

    def query(self, query: HistoryQuery) -> Page:
        """One page with Store semantics (:meth:`ReadPath.page`); raises
        StoreError for an unknown cursor."""
        return self.reads.page(query)

    def forget_before(self, cutoff_ns: int) -> None:
        """Retention removed rows older than ``cutoff_ns`` from the table:
        every index that could still name them forgets them."""
        self.reader.committed()
        self._forget_removed()
        self.hot.forget_before(cutoff_ns)
        if self.writes.key_filter is not None:
            self.writes.key_filter.drop_days_before(schema.day_of_ns(cutoff_ns))

    def _forget_removed(self) -> None:
        """Rows left the table: a removed MUID sent again is new again, and
        a removed hash is no longer a cursor."""
        self.writes.forget_recent()
        self.reads.forget_cursors()

    # --- windows for archives --------------------------------------------

    def stream_window(self, start_ns: int, end_ns: int, content_topics: Sequence[str]) -> Iterator[list[Row]]:
        """Messages with start <= timestamp < end on these topics, in
        timestamp order, one day at a time (memory bounded by a day)."""
        for table in self.stream_window_tables(start_ns, end_ns, content_topics):
            yield rows_from_arrow(table)

    def stream_window_tables(self, start_ns: int, end_ns: int, content_topics: Sequence[str]) -> Iterator:
        """:meth:`stream_window` as Arrow tables of the table's schema, one
        a day (an export encodes them without an object per message).
        With :attr:`DeltaTableRef.bulk_in_process`, each day is read here
        from its files (:meth:`TableReader.day_rows`): the engine's read
        is mostly its Parquet writer handing the rows over, ~13 CPU s a
        million messages, where pyarrow reads them in ~2."""
        self.flush()
        if not self.table.bulk_in_process:
            yield from self.table.window_days(start_ns, end_ns, content_topics)
            return
        day, last = schema.day_of_ns(start_ns), schema.day_of_ns(max(end_ns - 1, start_ns))
        while day <= last:
            rows = self.reader.day_rows(day, start_ns, end_ns, content_topics)
            if rows is None:  # the files alone do not say (deletion vectors): the engine does
                rows = next(
                    iter(
                        self.table.window_days(
                            max(start_ns, schema.day_start_ns(day)),
                            min(end_ns, schema.day_start_ns(day) + schema.NS_PER_DAY),
                            content_topics,
                        )
                    ),
                    None,
                )
            if rows is not None and rows.num_rows:
                yield rows
            day += timedelta(days=1)

    def replace_window(self, start_ns: int, end_ns: int, content_topics: Sequence[str], messages: Iterable[Row]) -> int:
        """Make ``messages`` the whole content of the window for these topics,
        in one Delta transaction; returns the number of rows written.

        ``messages`` may be a generator: it is consumed in chunks and
        spilled to a staging Parquet file beside the table once it passes
        :data:`STAGING_THRESHOLD_BYTES`, so memory stays bounded by a chunk
        and the size of the window by the disk. If the generator raises,
        nothing is committed.
        """
        self.flush()
        seen: dict[bytes, date] = {}
        recent: list[Row] = []
        hot_from = self.hot.start_ns if self.hot.enabled and self.hot.start_ns is not None else None
        with StagedRows(self.table.uri) as staged:
            for row in messages:
                if not start_ns <= row.timestamp < end_ns or row.message.content_topic not in content_topics:
                    raise ValueError("a message lies outside the window it replaces")
                if row.muid in seen:
                    continue
                seen[row.muid] = schema.day_of_ns(row.timestamp)
                staged.add(row)
                if hot_from is not None and row.timestamp >= hot_from:
                    recent.append(row)
            source = staged.source()
            # No flush between the commit and the keys learnt (see commits_held).
            with self.writes.commits_held():
                with maintenance.rewrite_lock(self.table):  # it removes files a compaction may rewrite
                    self._require_readable_days(start_ns, end_ns)
                    retry_on_conflict(lambda: self.table.replace_where(source, start_ns, end_ns, content_topics))
                self.reader.committed()
                self._forget_removed()
                self.writes.remember(list(seen), list(seen.values()))
        self.hot.replace(start_ns, end_ns, content_topics, recent)
        return len(seen)

    def _require_readable_days(self, start_ns: int, end_ns: int) -> None:
        """A window replace rewrites the files of its days that hold rows of
        the window, keeping their other rows: raise
        :class:`DataFileUnreadable` (nothing committed) when one of those
        days holds a bad file, whose damaged rows would come out of it
        looking like data, or be lost."""
        first, last = schema.day_of_ns(start_ns), schema.day_of_ns(max(end_ns - 1, start_ns))
        self.reader.require_readable([path for path, day in self.reader.files() if day and first <= day <= last])

    def replace_window_tables(self, start_ns: int, end_ns: int, content_topics: Sequence[str], tables: Iterable) -> int:
        """:meth:`replace_window` for rows given a batch at a time in the
        table's Arrow schema (:func:`rows.records_to_arrow`), so that a
        window of a million messages builds no object per message. The same
        guarantees: one transaction, staged beyond a chunk, nothing
        committed if ``tables`` raises or a row lies outside the window.
        :meth:`stage_window_tables` then :meth:`commit_window`."""
        with self.stage_window_tables(start_ns, end_ns, content_topics, tables) as staged:
            return self.commit_window(staged)

    def stage_window_tables(
        self, start_ns: int, end_ns: int, content_topics: Sequence[str], tables: Iterable
    ) -> StagedWindow:
        """The first half of :meth:`replace_window_tables`: ``tables``
        read, checked and staged, nothing committed (raises what ``tables``
        raises, or ValueError for a row outside the window). The staged
        window is a context manager that removes its files; an import
        stages the next window while :meth:`commit_window` commits this
        one in another thread (the engine's commit and the staging are
        then at the same time instead of one after the other)."""
        listed = pa.array(list(content_topics), pa.string())
        now = time.time_ns()
        rows = StagedFiles(self.table.uri) if self.table.bulk_in_process else StagedRows(self.table.uri)
        window = StagedWindow(start_ns, end_ns, list(content_topics), rows, now)
        # The hot tier takes the rows of its window (a day at most); for the
        # older rows it claims, the newest one makes it give up below that
        # time, as import_rows does: a window of a million rows makes no
        # object per row and no tier of a million rows.
        tier_from = self.hot.start_ns if self.hot.enabled and self.hot.start_ns is not None else None
        try:
            for table in tables:
                if not table.num_rows:
                    continue
                low, high = (v.as_py() for v in pc.min_max(table.column("timestamp")).values())
                if (
                    low < start_ns
                    or high >= end_ns
                    or not pc.all(pc.is_in(table.column("content_topic"), value_set=listed)).as_py()
                ):
                    raise ValueError("a message lies outside the window it replaces")
                table = window.first_copies(table)
                window.rows.add_table(table)
                if tier_from is not None:
                    candidate, joining = self._hot_rows(table, now)
                    if candidate is not None and (window.older is None or candidate.timestamp > window.older.timestamp):
                        window.older = candidate
                    window.recent += joining
            window.source = window.rows.source()
        except BaseException:
            window.close()
            raise
        return window

    def commit_window(self, window: StagedWindow) -> int:
        """The second half of :meth:`replace_window_tables`: the staged
        window's rows become the window's whole content in one Delta
        transaction, and every index learns it; returns the rows written."""
        # The puts before it land first (not at staging: a commit in flight
        # holds flushes, and the next window is staged meanwhile).
        self.flush()
        with self.writes.commits_held():  # see replace_window
            with maintenance.rewrite_lock(self.table):  # it removes files a compaction may rewrite
                self._require_readable_days(window.start_ns, window.end_ns)
                retry_on_conflict(
                    lambda: self.table.replace_where(
                        window.source, window.start_ns, window.end_ns, window.content_topics
                    )
                )
            self.reader.committed()
            self._forget_removed()
            self.writes.remember_columns(
                pa.chunked_array(window.muids, pa.binary()), pa.chunked_array(window.days, pa.date32())
            )
        self.hot.replace(window.start_ns, window.end_ns, window.content_topics, window.recent)
        if window.older is not None:
            self.hot.add([window.older], window.now_ns)
        return window.count

    # --- bulk import ------------------------------------------------------

    def import_rows(self, messages: Iterable[tuple[str, WakuMessage, int]]) -> tuple[int, int]:
        """Add ``(pubsub_topic, message, arrival_ns)`` triples in one Delta
        transaction; returns ``(new, already)``: messages inserted, and
        messages whose MUID the table held (on any day: the MUID leaves the
        timestamp out) or that repeat an earlier triple of ``messages``.

        All or nothing: ``messages`` may be a generator, staged as
        :meth:`replace_window` stages (memory bounded by a chunk, plus the
        MUIDs seen); if it raises, nothing is committed. The commit is a
        MERGE on MUID over the whole table, so the counts are exact. Meant
        for a store nobody else writes meanwhile (``wakustore db`` holds
        the data directory): a put of the same message during the import
        could store it twice.
        """
        self.flush()
        seen: dict[bytes, date] = {}  # MUID -> day, for the key filter
        days: dict[date, date] = {}  # one date object per day
        # The hot tier claims completeness from its start: rows inside its
        # window join it (bounded by the window); for older rows it claims,
        # the newest one is enough to make it give up below that time.
        recent: list[Row] = []
        older: Row | None = None
        tier_from = self.hot.start_ns if self.hot.enabled else None
        horizon = None if tier_from is None else max(tier_from, time.time_ns() - self.hot.window_ns)
        total = 0
        with StagedRows(self.table.uri) as staged:
            for pubsub_topic, message, arrival_ns in messages:
                row = Row.build(pubsub_topic, message, arrival_ns)
                total += 1
                if row.muid in seen:
                    continue  # the first copy in the input wins, as put keeps the first
                day = schema.day_of_ns(row.timestamp)
                seen[row.muid] = days.setdefault(day, day)
                staged.add(row)
                if tier_from is not None and row.timestamp >= tier_from:
                    assert horizon is not None  # set whenever tier_from is
                    if row.timestamp >= horizon:
                        recent.append(row)
                    elif older is None or row.timestamp > older.timestamp:
                        older = row
            if not seen:
                return 0, total
            source = staged.source()
            inserted: list[int] = []
            retry_on_conflict(lambda: inserted.append(self.table.insert_missing(source, MESSAGE_CODEC.key_column)))
        self.reader.committed()
        self.writes.remember(list(seen), list(seen.values()))
        if inserted[-1] and (recent or older is not None):
            # A recent row whose MUID the table held under another timestamp
            # was not inserted: only rows whose hash is now stored join the tier.
            stored: set[bytes] = set()
            for i in range(0, len(recent), IMPORT_LOOKUP_KEYS):
                chunk = recent[i : i + IMPORT_LOOKUP_KEYS]
                stored |= self.table.existing_keys(
                    "message_hash",
                    [r.message_hash for r in chunk],
                    schema.MESSAGES_PARTITION,
                    sorted({seen[r.muid] for r in chunk}),
                )
            joining = [r for r in recent if r.message_hash in stored]
            self.hot.add(joining if older is None else [older, *joining], time.time_ns())
        return inserted[-1], total - inserted[-1]
