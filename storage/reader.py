"""Committed history read in process: delta-rs and DataFusion on the Delta table.

The engine (Sail or Spark through Spark Connect) stays the writer of the
table: ingest appends and MERGEs, retention deletes and, on a fleet's
shared table or a remote engine, window replaces and archive export go
through it (a table the node owns with the embedded engine has its
windows written by storage.window_files and its export's days read by
:meth:`TableReader.day_rows`). Store pages and lookups by hash do not: a
Spark Connect round trip costs 7-14 ms here before any work, and the
engine loads the table's log again for every query. :class:`TableReader`
keeps one ``DeltaTable`` open and answers from the version it holds.

Two ways to read it, the same answers:

- the key index (:mod:`wakustore.storage.row_index`): for every data file
  of the version, its timestamps per topic pair and its hash prefixes,
  built once per file by a background thread when the file first appears.
  A page finds its rows by binary search and reads only the row groups
  holding them with pyarrow (the most recent ones kept decoded); a lookup
  reads the row group of each hash. DataFusion costs 2-4 ms a query before
  any work, more than such a page (bench store, 1M messages, load 1.3-5:
  pages p50 9.2 -> 1.4-1.8 ms, 20 hashes 69 -> 20-37 ms). With its MUID
  prefixes, the same index tells a put of an owned table which of its
  keys a day's files already hold (:meth:`TableReader.existing_muids`),
  without the engine;
- DataFusion SQL over the version, for what the index does not answer: a
  page over every topic, files not indexed yet (pages right after a
  commit or a compaction), versions with deletion vectors. A page over
  more than two days first reads the first day in its order alone (it
  often fills the page).

Versions. Every registered query plan holds the snapshot it was made
from, so a page reads exactly one table version, and a refresh swaps in a
new plan source without disturbing pages running on the old one. The
reader advances:

- when the node itself commits (:meth:`TableReader.committed`, called by
  the write path after a commit lands and before its rows leave the
  pending set, so a message never falls between the two);
- after a window replace, an import and retention, by the store;
- before a page, when the version was last checked more than
  ``check_interval_s`` ago: the only way a fleet node (a shared table,
  or a table written through ``sc://``) sees the others' commits. One
  check lists the log after the version held (a directory listing on a
  file system, one LIST request on an object store): at the default
  :data:`CHECK_INTERVAL_S` another node's commit shows within 0.5 s, half
  the default flush interval those commits already wait.

Storage: the table URI is what the engine writes (a path, ``s3://``,
``gs://``, ``az://``...); delta-rs reads the object store's credentials
from the same environment variables the engine does (``AWS_*`` and so on),
or from ``storage_options``.

Bad files. A data file the version names that cannot be read (damaged,
cut short, not a file, missing) is a bad file: named once in the log and
in :meth:`TableReader.bad_files` (the node's /health), and an answer that
needs it raises :class:`DataFileUnreadable` (the wire's 503) instead of
being short; the others are answered. It is found by the read that fails,
by the background pass (each file looked at once a start: there, a file,
its size; an ingest file's CRC-32, see index_files), and by
:meth:`TableReader.check_files`, which maintenance asks before it
rewrites a file. A key index file is used only once its body has passed
its CRC (:meth:`TableReader._verified`); one that fails is built again.
"""

from __future__ import annotations

import collections
import contextlib
import datetime as dt
import functools
import logging
import os
import stat
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, SupportsInt, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from wakustore.protocols import store_query
from wakustore.protocols.store_query import HistoryQuery
from wakustore.storage import index_files, parquet_pages, row_index, schema
from wakustore.storage.staging import is_local

if TYPE_CHECKING:
    from deltalake import DeltaTable, QueryBuilder

log = logging.getLogger(__name__)

# Name of the table in the DataFusion catalog.
_TABLE = "messages"

DATA_COLUMNS = schema.DATA_COLUMNS
# What a cached row group holds: every column a page returns or tests.
_FULL_COLUMNS = tuple(dict.fromkeys([*DATA_COLUMNS, *row_index.MATCH_COLUMNS]))
_FULL_SET = frozenset(_FULL_COLUMNS)
# Columns a lookup by hash can answer from the key index alone (see
# row_index.hash_keys): a page without data, a cursor's timestamp.
_INDEX_ANSWERS = frozenset(schema.LOOKUP_COLUMNS) | {"content_topic"}

# Decoded row groups kept for the next pages (see TableReader._read_group):
# ~0.3 MB each in bench store (256 rows of ~1 KB payloads), so ~200 row
# groups.
ROW_GROUP_CACHE_BYTES = 64 * 1024 * 1024
# Readers of row groups kept open (a file descriptor each), least recently
# used closed first: opening one (its row group's footer parsed, the file
# opened) costs ~0.1 ms beside the 0.5-0.8 ms a 256-row row group takes to
# read; a page read again mostly comes from the row group cache instead.
OPEN_FILES = 256
# The key of a file read by page in the open readers (not a row group).
WHOLE_FILE = -1

# Bad data files remembered (each reported once): more is a broken disk.
MAX_BAD_FILES = 1000
# A bad data file whose index could not be built is tried again by the
# background pass at most this often (a restored file is indexed again;
# a broken one is not read at every commit).
BAD_FILE_RETRY_S = 60.0
# A page checks the CRC of the mapped indexes it needs that the background
# pass has not checked yet when they hold at most this much (~20 ms to
# read); beyond, DataFusion answers it until the pass has (a start of a
# node with hundreds of GB of history).
VERIFY_INLINE_BYTES = 32 << 20

# Row groups a lookup by hash with data reads side by side (2 cores).
LOOKUP_THREADS = 2

# How long close() waits for the background index pass to finish the file
# it is on (a 512 MiB file's index builds in about ten seconds).
INDEXER_JOIN_S = 30.0

# A page over more days than this reads the first day in its order alone
# first, and the other days only if that day does not fill it (see
# TableReader.page); over one or two days, one query.
SPLIT_PAGES_OVER_DAYS = 2

# How stale a version may be before a page checks the log (see above).
CHECK_INTERVAL_S = 0.5

# DataFusion settings for pages (deltalake 1.6.6 defaults otherwise):
# filters evaluated inside the Parquet decoder, so that the payload column
# of a row group is decoded only for the rows the topic and time filters
# keep (late materialization), and cheapest filters first; the page index
# and Bloom filters are on by default. Plain (non-view) Arrow types: the
# rows go straight to Python, where views only add a cast.
SESSION_CONFIG = {
    "datafusion.execution.parquet.pushdown_filters": "true",
    "datafusion.execution.parquet.reorder_filters": "true",
    "datafusion.execution.parquet.schema_force_view_types": "false",
}


# How long a read of an object store may try before the page gives up
# (delta-rs object_store client options; an operator's own
# ``storage_options`` win). With its defaults (10 retries, up to 3
# minutes) the pages of the S3 outage test (tests/fleet) took 20.8 s to
# answer 503 and 10.9 s to be served from the version held; with these,
# 2.0 and 0.7 s.
OBJECT_STORE_OPTIONS = {
    "max_retries": "2",
    "retry_timeout": "5s",
    "connect_timeout": "5s",
    "timeout": "30s",
}


class TableUnreadable(Exception):
    """The table cannot be read (missing, unreachable, a file gone)."""


class DataFileUnreadable(TableUnreadable):
    """A data file of the table that an answer needs cannot be read
    (damaged, truncated, missing, not a file): a bad file, named in
    :meth:`TableReader.bad_files`. ``path`` is where it is (a local path,
    or its key in the object store)."""

    def __init__(self, path: str, problem: str):
        super().__init__(f"data file {path} cannot be read: {problem}")
        self.path = path
        self.problem = problem


class DataFileDamaged(DataFileUnreadable):
    """A data file whose bytes changed since it was indexed (its CRC-32)."""


class _SkipFile(Exception):
    """A data file found bad while the newest rows were read (see TableReader.newest_rows)."""

    def __init__(self, path: str):
        super().__init__(path)
        self.path = path


@dataclass(frozen=True, slots=True)
class _Snapshot:
    version: int
    builder: QueryBuilder  # with the table registered at ``version``
    # The data files of exactly this version and the day of each (None:
    # the table is not partitioned by day).
    files: tuple[tuple[str, dt.date | None], ...] = ()
    # The day partitions holding rows in this version, ascending; None when
    # the table is not partitioned by day.
    days: tuple[dt.date, ...] | None = field(default=None)
    # The size in bytes of each file of ``files``, in the same order, and by path.
    sizes: tuple[int, ...] = ()
    size_of: Mapping[str, int] = field(default_factory=dict)
    # Rows and bytes of the version's files (their add actions' numRecords
    # and sizes): the table gauges, kept current at each commit.
    rows: int = 0
    bytes: int = 0


class TableReader:
    """Pages and hash lookups of one message table, read in process. Thread-safe."""

    def __init__(
        self,
        uri: str,
        storage_options: Mapping[str, str] | None = None,
        check_interval_s: float | None = CHECK_INTERVAL_S,
        session_config: Mapping[str, str] | None = None,
        key_index: bool = True,
        index_in_background: bool = True,
        row_group_cache_bytes: int = ROW_GROUP_CACHE_BYTES,
        index_directory: str | os.PathLike | None = None,
    ):
        self.uri = uri
        options = {**({} if is_local(uri) else OBJECT_STORE_OPTIONS), **(storage_options or {})}
        self.storage_options = options or None
        # None: never check before a page (every commit comes through committed()).
        self.check_interval_s = check_interval_s
        self._session_config = dict(SESSION_CONFIG if session_config is None else session_config)
        self._lock = threading.Lock()  # the DeltaTable; one refresh at a time
        self._table: DeltaTable | None = None
        self._snapshot: _Snapshot | None = None
        self._checked = 0.0  # time.monotonic() of the last look at the log
        # A commit landed that the snapshot may not show: pages refresh first.
        self._stale = True
        self.refreshes = 0
        # The key index of each data file (row_index), by its path in the
        # log; a path names one immutable file. With ``index_directory``
        # (a directory of the node's own) each file's index is written
        # there once and mapped (index_files): a start maps them and reads
        # no data file. A file without one (new, or its index missing or
        # damaged) is indexed by a background thread (or by index_now());
        # until then pages over it read through DataFusion. Files that
        # leave the table leave the index when the version advances.
        self.key_index = key_index
        self.index_in_background = index_in_background
        self._pairs = row_index.TopicPairs()
        self._indexes: dict[str, row_index.FileIndex] = {}
        self._index_lock = threading.Lock()  # who is in _indexes and _building
        self._building: dict[str, threading.Event] = {}  # path -> set when its build ends
        self._indexer: threading.Thread | None = None  # the background builder, while it runs
        self._index_wanted = False  # a version with files not indexed arrived
        self._filesystem = None
        self._indexable = False  # key_index, and no file of the version has deletion vectors
        self._files = None if index_directory is None else index_files.IndexDirectory(index_directory)
        self._swept = False
        self.index_builds = 0  # indexes built from their data file
        self.index_loads = 0  # indexes mapped from the index directory
        self.index_damaged = 0  # index files found damaged or stale, rebuilt
        self.indexed_answers = 0  # pages and lookups the key index answered
        self.row_group_cache_bytes = row_group_cache_bytes
        self._row_groups: collections.OrderedDict[tuple[str, int], pa.Table] = collections.OrderedDict()
        self._cache_size = 0
        self._cache_lock = threading.Lock()
        self._open = _OpenFiles(OPEN_FILES)
        self._pool: ThreadPoolExecutor | None = None  # lookups' row group reads (_lookup_pool)
        self._closed = False
        # Data files a read failed on (path -> the error), until they leave
        # the table or read again: reported once in the log, in /health and
        # the metrics.
        self._bad: dict[str, str] = {}
        # Data files whose bytes no longer match the CRC-32 their index took
        # (index_files.WHOLE_FILE_CRC_BYTES): never read again, until they
        # leave the table; and the files checked since the reader started.
        self._damaged: dict[str, str] = {}
        self._crc_checked: set[str] = set()
        # When each bad file last failed (time.monotonic()): see BAD_FILE_RETRY_S.
        self._bad_at: dict[str, float] = {}
        # Files the background pass found there whole (see _index_one).
        self._looked_at: set[str] = set()
        # Files whose index was mapped and has not passed its CRC yet (a
        # page looks for them only while there are some: after a start).
        self._unchecked: set[str] = set()
        # Index files found damaged since the reader started (where -> the
        # problem), each removed and built again from its data file.
        self._index_problems: dict[str, str] = {}

    # --- versions -----------------------------------------------------------

    @property
    def version(self) -> int | None:
        snapshot = self._snapshot
        return None if snapshot is None else snapshot.version

    def refresh(self) -> int:
        """Advance to the table's latest version now; returns it."""
        with self._lock:
            return self._refresh_locked()

    def committed(self) -> None:
        """A commit of this process landed: advance now. Never raises (the
        commit stands); when the log cannot be read now, the next page
        advances before it reads."""
        self._stale = True
        try:
            self.refresh()
        except Exception as exc:
            log.warning("table reader could not advance after a commit (the next page retries): %s", exc)

    def _refresh_locked(self) -> int:
        from deltalake import DeltaTable, QueryBuilder

        try:
            if self._table is None:
                self._table = DeltaTable(self.uri, storage_options=self.storage_options)
            else:
                try:
                    self._table.update_incremental()
                except Exception as exc:
                    # The commit files after the version held may be gone
                    # (a trimmed log): load the latest from its checkpoint.
                    log.info("table reader reloads the log after %s", _one_line(exc))
                    self._table = DeltaTable(self.uri, storage_options=self.storage_options)
            version = self._table.version()
            if self._snapshot is None or self._snapshot.version != version:
                builder = QueryBuilder(self._session_config).register(_TABLE, self._table)
                # Not flattened: flattening parses every file's statistics
                # (a commit at 16k files: 49 ms against 1 ms), and a commit
                # of this node lands here every time.
                actions = pa.table(self._table.get_add_actions(flatten=False))
                days = None
                partition = actions.column("partition") if "partition" in actions.column_names else None
                if partition is not None and partition.type.get_field_index(schema.MESSAGES_PARTITION) >= 0:
                    days = [
                        d if isinstance(d, dt.date) else dt.date.fromisoformat(str(d))
                        for d in pc.struct_field(partition, schema.MESSAGES_PARTITION).to_pylist()
                    ]
                paths = actions.column("path").to_pylist()
                files = tuple(zip(paths, days if days is not None else [None] * len(paths)))
                sizes = tuple(actions.column("size_bytes").to_pylist())
                rows = pc.sum(actions.column("num_records")).as_py() if "num_records" in actions.column_names else 0
                self._snapshot = _Snapshot(
                    version,
                    builder,
                    files,
                    None if days is None else tuple(sorted(set(days))),
                    sizes,
                    dict(zip(paths, sizes)),
                    rows or 0,
                    sum(sizes),
                )
                self.refreshes += 1
                deletion_vectors = self._table.metadata().configuration.get("delta.enableDeletionVectors", "false")
                # Deletion vectors only where the protocol allows them; the
                # unflattened actions may not name them, the flattened do.
                features = self._table.protocol().reader_features or []
                self._indexable = (
                    self.key_index
                    and deletion_vectors.lower() != "true"
                    and not (
                        "deletionVectors" in features
                        and _has_deletion_vectors(pa.table(self._table.get_add_actions(flatten=True)))
                    )
                )
                self._prune_index(paths)
        except Exception as exc:
            raise TableUnreadable(f"the message table at {self.uri} cannot be read: {_one_line(exc)}") from exc
        self._checked = time.monotonic()
        self._stale = False
        return version

    def file_sizes_by_day(self) -> dict[dt.date | None, list[int]]:
        """The sizes of the data files of the version held, by day."""
        snapshot = self._current()
        by_day: dict[dt.date | None, list[int]] = {}
        for (_, day), size in zip(snapshot.files, snapshot.sizes):
            by_day.setdefault(day, []).append(size)
        return by_day

    # --- the key index ------------------------------------------------------

    def _prune_index(self, live: Sequence[str]) -> None:
        """Drop the files no longer in the table (and their index files);
        map the indexes kept on disk of the new ones now (no data file is
        read: a restart serves from them at once); index the others, and
        check the mapped ones, in the background."""
        live_set = set(live)
        gone = []
        if self._bad:
            self._bad = {path: error for path, error in self._bad.items() if path in live_set}
        if self._damaged:
            self._damaged = {path: error for path, error in self._damaged.items() if path in live_set}
        if self._bad_at:
            self._bad_at = {path: at for path, at in self._bad_at.items() if path in live_set}
        self._crc_checked &= live_set
        self._looked_at &= live_set
        self._unchecked &= live_set
        with self._index_lock:
            if any(path not in live_set for path in self._indexes):
                gone = [p for p in self._indexes if p not in live_set]
                self._indexes = {p: i for p, i in self._indexes.items() if p in live_set}
            # A removed file's space is freed only when no one holds it open.
            self._open.keep_only(live_set)
        if self._files is not None:
            first = not self._swept
            if first:
                removed = self._files.keep_only(live_set)  # those of files gone while the node was down
                if removed:
                    log.info("key index: removed %d index files of data files no longer in the table", removed)
                self._swept = True
            self._files.remove(gone)
            if self._indexable:
                self._map_kept(live)
                if first:
                    built = sum(1 for path in live if path not in self._indexes)
                    log.info(
                        "key index: %d of %d data files mapped from %s%s",
                        len(live) - built,
                        len(live),
                        self._files.directory,
                        f", {built} to build in the background" if built else "",
                    )
        missing = any(path not in self._indexes for path in live)
        unverified = any(
            index.mapped is not None and not index.mapped.verified for index in list(self._indexes.values())
        )
        if missing or unverified:
            self._want_index()

    def _want_index(self) -> None:
        """Have the background thread look at every file of the version
        (start it unless it runs)."""
        if not (self._indexable and self.index_in_background):
            return
        with self._index_lock:
            if self._closed:
                return
            self._index_wanted = True
            if self._indexer is None:
                self._indexer = threading.Thread(target=self._index_all, name="table-reader-index", daemon=True)
                self._indexer.start()

    def _map_kept(self, paths: Sequence[str]) -> None:
        """Map the index on disk of each of ``paths`` not indexed yet; one
        that is damaged or stale is removed (the background thread builds
        it again). Each is mapped as :meth:`_index_of` builds: one thread
        at a time."""
        sizes = self._snapshot_sizes()
        for path in paths:
            if path in self._indexes or path in self._building:
                continue
            with self._index_lock:
                if path in self._indexes or path in self._building:
                    continue
                mine = self._building[path] = threading.Event()
            try:
                index = self._load(path, sizes.get(path))
                if index is not None:
                    with self._index_lock:
                        self._unchecked.add(path)
                        self._indexes.setdefault(path, index)
            finally:
                with self._index_lock:
                    del self._building[path]
                mine.set()

    def _snapshot_sizes(self) -> Mapping[str, int]:
        snapshot = self._snapshot
        return {} if snapshot is None else snapshot.size_of

    def _load(self, path: str, size: int | None) -> row_index.FileIndex | None:
        """The index of ``path`` from the index directory; None when there
        is none (or it was damaged: removed). Its body is not checked here
        (see :meth:`_verified`)."""
        assert self._files is not None  # callers: with an index directory only
        try:
            mapped = self._files.open(path, size)
            if mapped is None:
                return None
            index = row_index.FileIndex(
                path,
                mapped.header.rows,
                mapped.header.pairs,
                mapped.header.footer_head,
                mapped.arrays,
                self._pairs,
                mapped,
            )
        except (index_files.IndexDamaged, OSError, KeyError, ValueError) as exc:
            self._index_damaged(path, _one_line(exc))
            return None
        self.index_loads += 1
        return index

    def _verified(self, index: row_index.FileIndex) -> bool:
        """Is ``index`` fit to use: held, or mapped with its body's CRC
        checked (now, when it was not yet)? Nothing of a mapped index is
        used before: a damaged body's offsets would reach the Parquet
        reader. One that fails is dropped, its file removed, and its data
        file indexed again (by the caller that needs it now, else in the
        background)."""
        mapped = index.mapped
        if mapped is None or mapped.verified:
            return True
        if mapped.verify():
            self._unchecked.discard(index.path)
            return True
        with self._index_lock:
            if self._indexes.get(index.path) is index:
                del self._indexes[index.path]
                self._unchecked.discard(index.path)
            first, mapped.rejected = not mapped.rejected, True
            if first:  # removed before another thread that found it so can map it again
                self._index_damaged(index.path, "its body does not match its CRC")
        if first:
            self._want_index()
        return False

    def _index_damaged(self, path: str, problem: str) -> None:
        """The index file of the data file ``path`` is damaged (or stale):
        counted, named once in the log and in :meth:`index_state`, removed."""
        assert self._files is not None  # only mapped indexes are damaged
        where = self._files.path_of(path)
        self.index_damaged += 1
        if len(self._index_problems) < MAX_BAD_FILES:
            self._index_problems[where] = problem
        log.warning(
            "key index file %s of data file %s is damaged or stale (%s): not used, built again from its data file",
            where,
            path,
            problem,
        )
        self._files.remove([path])

    def _index_all(self) -> None:
        """Index every file of the latest version and check the body of
        every mapped index once; again whenever a version with new files
        arrived meanwhile (``_index_wanted``). A file that fails is
        skipped (a bad data file is named by :meth:`_failed`), the others
        are done."""
        while True:
            with self._index_lock:
                if not self._index_wanted:
                    self._indexer = None
                    return
                self._index_wanted = False
            snapshot = self._snapshot
            if snapshot is None or not self._indexable:
                continue
            for path, _ in snapshot.files:
                if self._closed:
                    return
                if snapshot is not self._snapshot:
                    self._index_wanted = True
                    break  # a newer version wants its own pass
                try:
                    self._index_one(path)
                except DataFileUnreadable:
                    pass  # a bad file, named once; tried again after BAD_FILE_RETRY_S
                except Exception as exc:
                    # A file gone (compacted and vacuumed meanwhile) or not
                    # readable now: pages over it read through DataFusion;
                    # the next version tries again.
                    log.info("key index of %s not built in the background: %s", path, _one_line(exc))

    def _index_one(self, path: str) -> None:
        """The background pass on one data file: once a process, is it
        there whole (a file of the size the log gives); its index checked
        (built when missing or damaged); then the data file's own CRC."""
        if path not in self._looked_at:
            self._check_file(path, self._snapshot_sizes().get(path), whole=False)
            self._looked_at.add(path)
        index = self._indexes.get(path)
        if index is None or not self._verified(index):
            index = self._index_of(path)
        if index is not None and index.mapped is not None:
            self._check_file_crc(path, index.mapped.header.file_crc)

    def _failed_lately(self, path: str) -> bool:
        at = self._bad_at.get(path)
        return at is not None and time.monotonic() - at < BAD_FILE_RETRY_S

    def _check_file_crc(self, path: str, expected: int | None) -> str | None:
        """Once a process: is the data file as it was when indexed? A file
        that is not is never read again (its pages answer an error).
        Returns what is wrong (None: nothing found)."""
        if expected is None or path in self._crc_checked:
            return self._damaged.get(path)
        location, filesystem = self._location(path)
        if filesystem is not None:
            return None
        try:
            actual = index_files.file_crc32(location)
        except OSError as exc:
            return _problem(self._failed(path, exc))
        self._crc_checked.add(path)
        if actual == expected:
            return None
        problem = f"its bytes do not match the CRC-32 taken when it was indexed ({actual:08x}, not {expected:08x})"
        self._damaged[path] = problem
        return self._record_bad(path, problem).problem

    def _before_read(self, path: str, index: row_index.FileIndex | None) -> None:
        """Raise :class:`DataFileDamaged` for a data file whose bytes changed
        since it was indexed; a file the index holds a CRC-32 of is checked
        before this process first reads it."""
        if index is not None and index.mapped is not None and path not in self._crc_checked:
            self._check_file_crc(path, index.mapped.header.file_crc)
        if self._damaged and path in self._damaged:
            raise DataFileDamaged(self._location(path)[0], self._damaged[path])

    def _index_of(self, path: str) -> row_index.FileIndex | None:
        """The index of the file at ``path``, fit to use (:meth:`_verified`):
        mapped from the index directory, else built now from the data file
        (and written there), unless another thread is building it (then:
        wait for that one, then build it when that one did not). Built
        outside the lock: a refresh (and the pages waiting on it) never
        waits for a build. Raises :class:`DataFileUnreadable` when the data
        file cannot be read."""
        while True:
            index = self._indexes.get(path)
            if index is not None:
                if self._verified(index):
                    return index
                continue  # dropped: built below (or by another thread)
            with self._index_lock:
                if path in self._indexes:
                    continue
                other = self._building.get(path)
                # A file that just failed is not read again at every put
                # and page (see BAD_FILE_RETRY_S).
                lately = other is None and self._failed_lately(path)
                if other is None and not lately:
                    mine = self._building[path] = threading.Event()
            if lately:
                raise DataFileUnreadable(self._location(path)[0], self._bad.get(path, "unreadable"))
            if other is not None:
                other.wait()
                if path not in self._indexes and path in self._bad:
                    raise DataFileUnreadable(self._location(path)[0], self._bad[path])
                continue
            try:
                index = self._built(path)
                with self._index_lock:
                    # Only files still in the table stay (a version may
                    # have advanced during the build).
                    snapshot = self._snapshot
                    if snapshot is None or any(p == path for p, _ in snapshot.files):
                        self._indexes[path] = index
                return index
            finally:
                with self._index_lock:
                    del self._building[path]
                mine.set()

    def _built(self, path: str) -> row_index.FileIndex:
        """The index of ``path``: mapped from disk when kept there (and
        whole), else read from the data file (and kept)."""
        index: row_index.FileIndex | None
        location, filesystem = self._location(path)
        if self._files is None:
            with self._reading(path):
                index = row_index.build(location, self._pairs, filesystem)
            self.index_builds += 1
            return index
        size = self._snapshot_sizes().get(path)
        index = self._load(path, size)
        if index is not None and self._verified(index):
            return index
        file_crc = None
        with self._reading(path):
            rows, pairs, head, sections = row_index.build_sections(location, filesystem)
            if size is None:
                size = (filesystem or _local_files()).get_file_info(location).size
            if filesystem is None and size <= index_files.WHOLE_FILE_CRC_BYTES and not _has_page_crcs(location):
                file_crc = index_files.file_crc32(location)
        if file_crc is not None:
            self._crc_checked.add(path)
        self._read_again(path)
        self._files.write(path, size, rows, pairs, head, sections, file_crc)
        self.index_builds += 1
        index = self._load(path, size)
        if index is None:
            raise TableUnreadable(f"the key index of {path} was written but cannot be mapped")
        assert index.mapped is not None  # _load() maps it
        index.mapped.verified = True  # written just now from these arrays
        return index

    def _indexed(self, snapshot: _Snapshot, days: Sequence[dt.date] | None, build: bool) -> list | None:
        """The indexes of the snapshot's files on ``days`` (None: all), fit
        to use; built now when missing or damaged and ``build``; None when
        the key index cannot answer (off, a file not indexed, or more index
        files to check than a page does: see VERIFY_INLINE_BYTES)."""
        if not self._indexable:
            return None
        wanted = None if days is None else set(days)
        out = []
        for path, day in snapshot.files:
            if wanted is not None and day not in wanted:
                continue
            index = self._indexes.get(path)
            if index is None:
                index = self._index_of(path) if build else None
                if index is None:
                    return None
            out.append(index)
        if not self._unchecked:
            return out
        unchecked = [i.mapped.nbytes for i in out if i.mapped is not None and not i.mapped.verified]
        if not unchecked:
            return out
        if not build and sum(unchecked) > VERIFY_INLINE_BYTES:
            return None
        checked = []
        for index in out:
            if not self._verified(index):
                rebuilt = self._index_of(index.path) if build else None
                if rebuilt is None:
                    return None
                index = rebuilt
            checked.append(index)
        return checked

    def index_now(self) -> None:
        """Index every file of the current version now (the background
        thread does it otherwise)."""
        snapshot = self._current()
        if self._indexable:
            self._indexed(snapshot, None, build=True)

    def index_bytes(self) -> int:
        """Memory held by the key index: the arrays it holds (a mapped
        index holds its topic pairs' ids alone; see :meth:`mapped_bytes`)."""
        return sum(index.nbytes for index in list(self._indexes.values()))

    def cached_bytes(self) -> int:
        """Memory held by the decoded row groups kept for the next page."""
        return self._cache_size

    @staticmethod
    def mapped_bytes() -> int:
        """Bytes of index files mapped (on disk; in memory only as read)."""
        return index_files.mapped_bytes()

    def index_complete(self) -> bool:
        snapshot = self._snapshot
        return snapshot is not None and all(path in self._indexes for path, _ in snapshot.files)

    def can_list_keys(self) -> bool:
        """Can :meth:`muid_words` give every file's MUIDs (the index is on,
        kept on disk, and the table partitioned by day)?"""
        snapshot = self._snapshot
        return self._indexable and self._files is not None and snapshot is not None and snapshot.days is not None

    def files(self) -> list[tuple[str, dt.date | None]]:
        """(path, day) of each data file of the latest version known."""
        return list(self._current().files)

    def days(self) -> list[dt.date]:
        """The days holding rows in the latest version known."""
        return list(self._current().days or ())

    def muid_words(self, path: str) -> np.ndarray | None:
        """The first 16 bytes of each MUID of a data file as two 64-bit
        words (what the key filter takes), from its key index (mapped, or
        built now); None when the index has no MUIDs. Raises
        :class:`DataFileUnreadable` when the index must be built and the
        data file cannot be read."""
        index = self._index_of(path)
        if index is None or index.muids is None:
            return None
        words = np.ascontiguousarray(index.muids.reshape(-1, row_index.KEY_BYTES)[:, :16]).view("<u8").reshape(-1, 2)
        if index.mapped is not None:
            index.mapped.drop_resident()  # read once, in full
        return words

    def index_state(self) -> dict:
        """What /health reports of the key index: files of the version held
        not indexed yet (being built in the background), and counts."""
        snapshot = self._snapshot
        files = () if snapshot is None else snapshot.files
        bad = self._bad
        return {
            "files": len(files),
            "building": (
                sum(1 for path, _ in files if path not in self._indexes and path not in bad) if self._indexable else 0
            ),
            "built": self.index_builds,
            "mapped": self.index_loads,
            "damaged": self.index_damaged,
            # Each index file found damaged since the start (removed, and
            # built again from its data file), with what was wrong.
            "damaged_files": dict(self._index_problems),
        }

    def _location(self, path: str):
        """(path or key, pyarrow file system or None) of a data file of the log."""
        if is_local(self.uri):
            root = self.uri.removeprefix("file://")
            return os.path.join(root, urllib.parse.unquote(path)), None
        if self._filesystem is None:
            from deltalake.fs import DeltaStorageHandler
            from pyarrow import fs

            assert self._table is not None  # a snapshot names the file: the table was loaded
            self._filesystem = fs.PyFileSystem(DeltaStorageHandler.from_table(self._table._table, self.storage_options))
        return path, self._filesystem

    def _read_group(
        self, index: row_index.FileIndex, group: int, columns: Sequence[str], cache: bool = True
    ) -> pa.Table:
        """Row group ``group`` of a data file; those read with every column
        a page returns are kept (least recently used dropped first, within
        ``row_group_cache_bytes``): the next page of a query, or another
        query on a busy topic, mostly reads the same row groups."""
        import pyarrow.parquet as pq

        self._before_read(index.path, index)
        cacheable = cache and self.row_group_cache_bytes > 0 and set(columns) <= _FULL_SET
        if cacheable:
            key = (index.path, group)
            with self._cache_lock:
                found = self._row_groups.get(key)
                if found is not None:
                    self._row_groups.move_to_end(key)
                    return found
            columns = _FULL_COLUMNS
        opened = (index.path, group)
        file = self._open.take(opened)
        with self._reading(index.path):
            if file is None:
                # The footer was read once, when the file was indexed, and
                # is kept serialized: the reader gets this row group's
                # alone (its row group 0). Opened from the file system's
                # input file, not its path: 50 instead of 105 us (pyarrow
                # 26). Without pre-buffering, a row group of 256 rows reads
                # in 0.5 ms instead of 1.5. Page CRCs, where the file has
                # them (the node's own files), are checked.
                source = self._input_file(index.path)
                try:
                    file = pq.ParquetFile(
                        source,
                        metadata=index.footers.metadata(group),
                        pre_buffer=False,
                        page_checksum_verification=True,
                    )
                except BaseException:
                    source.close()
                    raise
            try:
                table = file.read_row_group(0, columns=list(columns), use_threads=False)
            except BaseException:
                file.close(force=True)
                raise
        self._open.give(opened, file)
        self._read_again(index.path)
        if cacheable:
            with self._cache_lock:
                if key not in self._row_groups:
                    self._row_groups[key] = table
                    self._cache_size += table.nbytes
                    while self._cache_size > self.row_group_cache_bytes and self._row_groups:
                        _, dropped = self._row_groups.popitem(last=False)
                        self._cache_size -= dropped.nbytes
        return table

    def _indexed_rows(
        self,
        candidates: row_index.Candidates,
        columns: Sequence[str],
        query: HistoryQuery,
        key: tuple[int, bytes] | None,
        fetch: int,
    ) -> pa.Table:
        wanted = list(dict.fromkeys([*columns, *row_index.MATCH_COLUMNS]))
        pieces = []
        by_page = [(f, r) for f, r in zip(candidates.files, candidates.rows) if f.pages is not None]
        if by_page:
            # Files written by page (compacted days): the pages of the rows
            # alone, one decoding call a file (parquet_pages). On a 3M table,
            # status-go's 24-hour pages of 50 over up to 10 topics: 3.6 ms
            # by row group (6.5 through the row group cache), 1.2 by page.
            map_ = self._lookup_pool().map if query.message_hashes and len(by_page) > 1 else map
            pieces += [p for p in map_(lambda task: self._read_pages(task[0], task[1], wanted), by_page) if p.num_rows]
        kept = [i for i, f in enumerate(candidates.files) if f.pages is None]
        rest = row_index.Candidates([candidates.files[i] for i in kept], [candidates.rows[i] for i in kept])
        if query.message_hashes and rest.files:
            # Bodies by hash: a row group each, anywhere in the history, no
            # locality for a cache (which cost a quarter of the time), read
            # side by side (pyarrow decodes without the GIL): bench store,
            # 50 hashes with data, 45 -> 30 ms.
            read = row_index.read_rows(
                rest, wanted, functools.partial(self._read_group, cache=False), self._lookup_pool().map
            )
        else:
            read = row_index.read_rows(rest, wanted, self._read_group)
        if read is not None:
            pieces.append(read)
        table = pa.concat_tables(pieces, promote_options="permissive") if len(pieces) > 1 else next(iter(pieces), None)
        found = row_index.finish(table, query, key, fetch)
        return schema.page_schema(columns).empty_table() if found is None else found

    def _read_pages(self, index: row_index.FileIndex, rows: np.ndarray, columns: Sequence[str]) -> pa.Table:
        """``columns`` of ``rows`` (sorted file rows) of a file written by page."""
        assert index.pages is not None  # the caller's choice
        starts = index.group_starts
        groups = np.searchsorted(starts, rows, "right") - 1
        wanted = []
        for group in np.unique(groups).tolist():
            first = int(starts[group])
            wanted.append((group, int(starts[group + 1]) - first, rows[groups == group] - first))
        self._before_read(index.path, index)
        opened = (index.path, WHOLE_FILE)
        source = self._open.take(opened)
        with self._reading(index.path):
            if source is None:
                source = self._input_file(index.path)
            try:
                found = parquet_pages.read_rows(
                    index.template(), index.pages, lambda offset, size: source.read_at(size, offset), wanted, columns
                )
            except BaseException:
                source.close()
                raise
        self._open.give(opened, source)
        self._read_again(index.path)
        return found

    def _input_file(self, path: str):
        """The data file ``path`` opened for reading (pyarrow's input file)."""
        location, filesystem = self._location(path)
        return (filesystem or _local_files()).open_input_file(location)

    def _read_again(self, path: str) -> None:
        """A read of ``path`` succeeded: not (or no longer: a transient
        error of object storage, a file restored) a bad file."""
        if self._bad and path in self._bad and path not in self._damaged:
            self._bad.pop(path, None)
            self._bad_at.pop(path, None)
            log.warning("data file %s of the message table reads again", self._location(path)[0])

    @contextlib.contextmanager
    def _reading(self, path: str) -> Iterator[None]:
        """Around a read of the data file ``path``: a failure is raised as
        the bad file's :class:`DataFileUnreadable` (see :meth:`_failed`)."""
        try:
            yield
        except Exception as exc:
            bad = self._failed(path, exc)
            if bad is None:
                raise
            raise bad from exc

    def _failed(self, path: str, exc: BaseException) -> DataFileUnreadable | None:
        """A read of the data file ``path`` failed: a bad file, named once
        in the log and in :meth:`bad_files`, returned as the error an
        answer that needs it raises. None when it is not one: the read was
        interrupted, or the file left the table (another node's vacuum:
        the latest version no longer names it)."""
        if isinstance(exc, DataFileUnreadable):
            return exc
        if not isinstance(exc, Exception):
            return None
        if isinstance(exc, FileNotFoundError):
            if not self._still_in_table(path):
                return None
            return self._record_bad(path, "missing: the table's log names it, the storage does not hold it")
        return self._record_bad(path, _one_line(exc))

    def _record_bad(self, path: str, problem: str) -> DataFileUnreadable:
        location = self._location(path)[0]
        self._bad_at[path] = time.monotonic()
        if path not in self._bad and len(self._bad) < MAX_BAD_FILES:
            self._bad[path] = problem
            log.error("data file %s of the message table cannot be read: %s", location, problem)
        return DataFileUnreadable(location, self._bad.get(path, problem))

    def _still_in_table(self, path: str) -> bool:
        """Does the latest version name ``path`` (a file found missing)?
        True when the log cannot be read now."""
        try:
            self.refresh()
        except TableUnreadable:
            return True
        snapshot = self._snapshot
        return snapshot is not None and path in snapshot.size_of

    def check_files(self, paths: Sequence[str], whole: bool = True) -> dict[str, str]:
        """Which of ``paths`` (data files of the version held, as the log
        names them) are bad files, each newly found one named as
        :meth:`bad_files` names it: known bad, missing, not a file, not the
        size the log gives, and (``whole``) not the bytes their index took
        a CRC-32 of. Path -> the problem. Files on object storage are
        judged by the reads that fail only."""
        sizes = self._snapshot_sizes()
        found = {}
        for path in paths:
            problem = self._bad.get(path) or self._check_file(path, sizes.get(path), whole)
            if problem is not None:
                found[path] = problem
        return found

    def _check_file(self, path: str, size: int | None, whole: bool) -> str | None:
        """What is wrong with the data file ``path`` now (None: nothing
        found), as :meth:`check_files` looks; a problem found is a bad file."""
        location, filesystem = self._location(path)
        if filesystem is not None:
            return None
        try:
            found = os.stat(location)
        except OSError as exc:
            return _problem(self._failed(path, exc))
        if not stat.S_ISREG(found.st_mode):
            return self._record_bad(path, "not a file").problem
        if size is not None and found.st_size != size:
            return self._record_bad(path, f"{found.st_size} bytes where the log says {size}").problem
        index = self._indexes.get(path)
        if whole and index is not None and index.mapped is not None:
            return self._check_file_crc(path, index.mapped.header.file_crc)
        return None

    def require_readable(self, paths: Sequence[str]) -> None:
        """Raise :class:`DataFileUnreadable` for the first of ``paths`` that
        :meth:`check_files` finds bad."""
        for path, problem in self.check_files(paths).items():
            raise DataFileUnreadable(self._location(path)[0], problem)

    def report_bad(self, path: str, exc: BaseException) -> DataFileUnreadable | None:
        """A read of the data file ``path`` (as the log names it) made
        elsewhere (a compaction) failed: see :meth:`_failed`."""
        return self._failed(path, exc)

    def bad_files(self) -> dict[str, str]:
        """Data files of the table a read failed on: where each is (a local
        path, or its key in the object store) -> the error."""
        return {self._location(path)[0]: error for path, error in self._bad.items()}

    def _lookup_pool(self) -> ThreadPoolExecutor:
        with self._index_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(LOOKUP_THREADS, thread_name_prefix="table-reader-lookup")
            return self._pool

    def close(self) -> None:
        """Stop the reader's threads and join them: its lookup pool (each
        lookup is one file's row groups), the background index pass (it
        ends after the file it is on; waited for up to INDEXER_JOIN_S, the
        build of one large file's index)."""
        with self._index_lock:
            pool, self._pool = self._pool, None
            indexer = self._indexer
            self._index_wanted = False
            self._closed = True
        if pool is not None:
            pool.shutdown(wait=True)
        if indexer is not None:
            indexer.join(INDEXER_JOIN_S)
            if indexer.is_alive():
                log.warning("the key index pass did not stop within %g s", INDEXER_JOIN_S)

    def totals(self) -> tuple[int, int, int]:
        """(version, rows, bytes) of the table as of its newest commit (the
        log is read when a commit may be missing: ~1 ms)."""
        snapshot = self._current()
        return snapshot.version, snapshot.rows, snapshot.bytes

    def _current(self) -> _Snapshot:
        """The snapshot a page reads: refreshed first when a commit may be
        missing from it, or when the log was not looked at for a while."""
        snapshot = self._snapshot
        if snapshot is None or self._stale:
            with self._lock:
                if self._snapshot is None or self._stale:
                    self._refresh_locked()
                assert self._snapshot is not None  # a refresh that returns sets it
                return self._snapshot
        interval = self.check_interval_s
        if interval is not None and time.monotonic() - self._checked >= interval:
            # One thread looks; the others read the version they have.
            if self._lock.acquire(blocking=False):
                try:
                    self._refresh_locked()
                except TableUnreadable as exc:
                    # Nothing this node committed is missing from the
                    # version held: serve it, look again next interval.
                    self._checked = time.monotonic()
                    log.warning("table log not readable, pages stay at version %d: %s", snapshot.version, exc)
                finally:
                    self._lock.release()
                assert self._snapshot is not None  # it was set (snapshot) and is never unset
                return self._snapshot
        return snapshot

    # --- reads --------------------------------------------------------------

    def page(self, query: HistoryQuery, key: tuple[int, bytes] | None, fetch: int) -> pa.Table:
        """Up to ``fetch`` rows after/before ``key`` in query order (not
        reversed), as the Spark oracle (:class:`~wakustore.storage.spark_oracle.SparkPages`) answers them."""
        columns = schema.page_columns(query.include_data, bool(query.message_hashes))
        order_column = store_query.order_column(query.ordering)
        direction = "ASC" if query.forward else "DESC"

        def select(where: str, limit: int) -> str:
            return (
                f"SELECT {', '.join(columns)} FROM {_TABLE}"
                + (f" WHERE {where}" if where else "")
                + f" ORDER BY timestamp {direction}, {order_column} {direction} LIMIT {int(limit)}"
            )

        def read(snapshot: _Snapshot) -> pa.Table:
            found = self._try_index(snapshot, query, key, fetch, columns)
            if found is not None:
                return found
            where = _where(query, key)
            if query.message_hashes:
                return _run(snapshot, select(where, fetch))
            days = _page_days(snapshot, query, key)
            if days is None or len(days) <= SPLIT_PAGES_OVER_DAYS:
                return _run(snapshot, select(where, fetch))
            # Day partitions follow the order of the page (a row's day is
            # that of its timestamp): the first day in query order alone
            # often fills the page, and the other days are not read.
            first = _run(snapshot, select(_and(where, f"day = {_date(days[0])}"), fetch))
            if first.num_rows >= fetch:
                return first
            rest = _run(snapshot, select(_and(where, _days(days[1:])), fetch - first.num_rows))
            return pa.concat_tables([first, rest])

        return self._execute(read, columns)

    def _try_index(
        self,
        snapshot: _Snapshot,
        query: HistoryQuery,
        key: tuple[int, bytes] | None,
        fetch: int,
        columns: Sequence[str],
    ) -> pa.Table | None:
        """The answer through the key index, or None: DataFusion answers
        (and reports a table that cannot be read)."""
        if not self._indexable:
            return None
        try:
            return self._indexed_page(snapshot, query, key, fetch, columns)
        except DataFileUnreadable:
            raise  # DataFusion would read the same bytes (without a check)
        except Exception as exc:
            log.info(
                "key index could not answer at version %d (read through DataFusion): %s",
                snapshot.version,
                _one_line(exc),
            )
            return None

    def _indexed_page(
        self,
        snapshot: _Snapshot,
        query: HistoryQuery,
        key: tuple[int, bytes] | None,
        fetch: int,
        columns: Sequence[str],
    ) -> pa.Table | None:
        """The page through the key index; None when it cannot answer
        (a lookup while files are still being indexed; a page over every
        topic)."""
        index_files.trim_resident()
        if query.message_hashes:
            indexes = self._indexed(snapshot, None, build=False)
            if indexes is None:
                return None
            if set(columns) <= _INDEX_ANSWERS:
                # Presence checks (status-go: 50 hashes every 3 s per
                # client) and cursors: the index alone, no data file read.
                found = row_index.finish(
                    row_index.hash_keys(indexes, query.message_hashes, self._pairs), query, key, fetch
                )
                self.indexed_answers += 1
                return schema.page_schema(columns).empty_table() if found is None else found
            candidates = row_index.hash_candidates(indexes, query.message_hashes)
        elif query.pubsub_topic is not None and query.content_topics:
            # Files not indexed yet (a new version; the background thread
            # indexes them): DataFusion answers meanwhile, in 10-20 ms,
            # where building a day's index here would take 50 ms or more.
            indexes = self._indexed(snapshot, _page_days(snapshot, query, key), build=False)
            if indexes is None:
                return None
            candidates = row_index.page_candidates(indexes, self._pairs, query, key, fetch)
        else:
            return None
        found = self._indexed_rows(candidates, columns, query, key, fetch)
        self.indexed_answers += 1
        return found

    def timestamp_of_hash(self, message_hash: bytes, pubsub_topic: str | None) -> int | None:
        lookup = HistoryQuery(pubsub_topic=pubsub_topic, message_hashes=(bytes(message_hash),), limit=1)
        where = f"message_hash = {_binary(message_hash)}"
        if pubsub_topic is not None:
            where += f" AND pubsub_topic = {_string(pubsub_topic)}"

        def read(snapshot: _Snapshot) -> pa.Table:
            found = self._try_index(snapshot, lookup, None, 1, ("timestamp",))
            if found is not None:
                return found
            return _run(snapshot, f"SELECT timestamp FROM {_TABLE} WHERE {where} LIMIT 1")

        found = self._execute(read, ("timestamp",))
        return found.column(0)[0].as_py() if found.num_rows else None

    def existing_muids(self, keys: Sequence[bytes], days: Sequence[dt.date]) -> set[bytes] | None:
        """Which of ``keys`` (MUIDs) the table's files of ``days`` hold, in
        the latest version this process knows of; None when the key index
        cannot say (off, deletion vectors, a file unreadable now): then ask
        the engine. Exact: whole MUIDs, read from the key index alone.
        Raises :class:`TableUnreadable` when the log cannot be read."""
        if not keys or not days:
            return set()
        snapshot = self._current()
        try:
            if not self._indexable:
                return None
            wanted = set(days)
            indexes = []
            for path, day in snapshot.files:
                if day in wanted:
                    try:
                        index = self._index_of(path)
                    except DataFileUnreadable:
                        # Neither its index nor its data: what it held is
                        # unreadable, a copy of a key there counts as none.
                        continue
                    if index is None:
                        return None
                    indexes.append(index)
            index_files.trim_resident()
            return row_index.existing_keys(indexes, keys)
        except Exception as exc:
            log.info(
                "key index could not look up MUIDs at version %d (asking the engine): %s",
                snapshot.version,
                _one_line(exc),
            )
            return None

    def newest_rows(self, since_ns: int, max_bytes: int) -> tuple[pa.Table, int] | None:
        """(rows, cut): every full row with timestamp >= cut, in no order,
        where cut is ``since_ns``, or later when the rows newer than
        ``since_ns`` hold more than ``max_bytes``: the oldest timestamp
        whose rows, with all newer ones, fit (the rows tied at it
        included: the rows are complete from cut on). A row's size is its
        file's bytes per row (payloads are ciphertext: Arrow holds about
        what the file does). Read in process: the key index holds the
        timestamps, and only the row groups of those rows are read. None
        when the index cannot say (off, or a file of those days not
        indexed yet).

        A bad data file of those days (damaged, missing, unreadable) is
        skipped: the cut is then after the newest row it may hold (its
        index's newest timestamp, else the log's statistics of it, else
        the end of its day), so the rows are still complete from cut on,
        and pages before it read the table (and answer an error where
        they need that file)."""
        snapshot = self._current()
        if not self._indexable or snapshot.days is None:
            return None
        first_day = schema.day_of_ns(since_ns)
        indexes = []
        floor = since_ns
        for path, day in snapshot.files:
            if day is None or day < first_day:
                continue
            try:
                index = self._index_of(path)
            except DataFileUnreadable:
                floor = max(floor, self._newest_in(path, day) + 1)
                continue
            if index is None:
                return None
            indexes.append(index)
        skipped: set[str] = set()
        while True:
            bad = [i for i in indexes if i.path in skipped or i.path in self._bad]
            cut_floor = max([floor] + [int(i.ts.max()) + 1 for i in bad if len(i.ts)])
            good = [i for i in indexes if i not in bad]
            try:
                return self._rows_from(good, cut_floor, max_bytes)
            except _SkipFile as exc:
                skipped.add(exc.path)

    def _newest_in(self, path: str, day: dt.date) -> int:
        """The newest timestamp the data file ``path`` of ``day`` may hold,
        without reading it: its add action's statistics, else the end of its day."""
        newest = None
        try:
            table = self._table
            if table is not None:
                actions = pa.table(table.get_add_actions(flatten=True))
                if "max.timestamp" in actions.column_names:
                    at = actions.column("path").to_pylist().index(path)
                    newest = actions.column("max.timestamp")[at].as_py()
        except Exception as exc:  # not named, no statistics: the day says
            log.debug("no statistics of %s: %s", path, exc)
        return schema.day_start_ns(day) + schema.NS_PER_DAY - 1 if newest is None else int(newest)

    def _rows_from(self, indexes: Sequence[row_index.FileIndex], since_ns: int, max_bytes: int) -> tuple[pa.Table, int]:
        """:meth:`newest_rows` of the files of ``indexes`` (none of them
        known bad); raises :class:`_SkipFile` for a file found bad."""
        sizes = self._snapshot_sizes()
        stamps = [index.ts[index.ts >= since_ns] for index in indexes]
        weights = [
            np.full(len(ts), sizes.get(index.path, 0) / max(index.rows, 1)) for ts, index in zip(stamps, indexes)
        ]
        cut = since_ns
        if sum(float(w.sum()) for w in weights) > max_bytes:
            ts = np.concatenate(stamps)
            newest_first = np.argsort(ts)[::-1]
            held = np.cumsum(np.concatenate(weights)[newest_first])
            fits = int(np.searchsorted(held, max_bytes, "right"))  # rows that fit, newest first
            cut = int(ts[newest_first[fits]]) + 1 if fits < len(ts) else since_ns
        del stamps, weights
        columns = [f.name for f in schema.MESSAGES if f.name != schema.MESSAGES_PARTITION]
        pieces = []
        for index in indexes:
            positions = np.flatnonzero(index.ts >= cut)
            if not len(positions):
                continue
            rows = np.sort(index.rows_at(positions))
            try:
                read = row_index.read_rows(
                    row_index.Candidates([index], [rows]), columns, functools.partial(self._read_group, cache=False)
                )
            except DataFileUnreadable:
                raise _SkipFile(index.path) from None
            if read is not None:
                pieces.append(read)
        if pieces:
            table = pa.concat_tables(pieces, promote_options="permissive") if len(pieces) > 1 else pieces[0]
        else:
            table = schema.page_schema(columns).empty_table()
        days = pc.cast(pc.divide(table.column("timestamp"), schema.NS_PER_DAY), pa.int32())
        return table.append_column(schema.MESSAGES.field(schema.MESSAGES_PARTITION), days.cast(pa.date32())), cut

    def day_rows(
        self, day: dt.date, start_ns: int, end_ns: int, content_topics: Sequence[str] | None
    ) -> pa.Table | None:
        """The rows of the day partition ``day`` with start <= timestamp <
        end on ``content_topics`` (None: all), with the ``day`` column, in
        (timestamp, message_hash) order, as :meth:`DeltaTableRef.window_days`
        gives them: read from the day's files of the latest version (the
        caller committed first). None when the files alone do not hold the
        answer (deletion vectors, a table without day partitions).

        A bad file of the day (damaged, missing, unreadable; page CRCs are
        checked, and an ingest file's CRC-32) is left out, with a warning
        naming it: an archive never holds its damaged bytes, and a file
        that cannot be read does not stop every later archive."""
        import pyarrow.dataset as ds

        with self._lock:
            self._refresh_locked()
            snapshot, exact = self._snapshot, self._indexable
        assert snapshot is not None  # a refresh that returns sets it
        if not exact or snapshot.days is None:
            return None
        paths = [path for path, file_day in snapshot.files if file_day == day]
        columns = [f.name for f in schema.MESSAGES if f.name != schema.MESSAGES_PARTITION]
        if not paths:
            return schema.MESSAGES.empty_table()
        stored = pa.schema([schema.MESSAGES.field(name) for name in columns])
        condition = (ds.field("timestamp") >= start_ns) & (ds.field("timestamp") < end_ns)
        if content_topics is not None:
            condition &= ds.field("content_topic").isin(list(content_topics))
        parquet = ds.ParquetFileFormat(
            default_fragment_scan_options=ds.ParquetFragmentScanOptions(page_checksum_verification=True)
        )
        pieces = [stored.empty_table()]
        for path in paths:
            # A file at a time, looked at first (a directory in its place
            # would read as an empty dataset): a failure names its file.
            location, filesystem = self._location(path)
            problem = self._check_file(path, snapshot.size_of.get(path), whole=True)
            if problem is None:
                try:
                    with self._reading(path):
                        dataset = ds.dataset(location, schema=stored, format=parquet, filesystem=filesystem)
                        pieces.append(dataset.to_table(columns=columns, filter=condition))
                except DataFileUnreadable as exc:
                    problem = exc.problem
            if problem is not None:
                log.warning("the rows of %s on %s are left out of the export: %s", location, day, problem)
                continue
            self._read_again(path)
        table = pa.concat_tables(pieces) if len(pieces) > 1 else pieces[0]
        table = table.append_column(
            schema.MESSAGES.field(schema.MESSAGES_PARTITION), pa.array([day] * table.num_rows, pa.date32())
        )
        if table.num_rows > 1:
            order = pc.sort_indices(table, sort_keys=[("timestamp", "ascending"), ("message_hash", "ascending")])
            if not np.array_equal(order.to_numpy(), np.arange(table.num_rows)):  # a copy of the day otherwise
                table = table.take(order)
        return table

    def _execute(self, read: Callable[[_Snapshot], pa.Table], columns: Sequence[str]) -> pa.Table:
        """``read`` on the current snapshot: every query of one answer reads the same version."""
        snapshot = self._current()
        try:
            result = read(snapshot)
        except DataFileUnreadable:
            raise  # named in bad_files(); a later version would not mend it
        except Exception as first:
            # A file of the version held may be gone (vacuumed by another
            # node): the latest version lists only live files.
            log.info("table read failed at version %d, advancing and retrying: %s", snapshot.version, first)
            try:
                with self._lock:
                    self._refresh_locked()
                    assert self._snapshot is not None  # a refresh that returns sets it
                    snapshot = self._snapshot
                result = read(snapshot)
            except TableUnreadable:
                raise
            except Exception as exc:
                # DataFusion names no file: one of the version's that is
                # missing, not a file or cut short is the likely cause.
                bad = self.check_files([path for path, _ in snapshot.files], whole=False)
                if bad:
                    path, problem = next(iter(bad.items()))
                    raise DataFileUnreadable(self._location(path)[0], problem) from exc
                raise TableUnreadable(f"the message table at {self.uri} cannot be read: {_one_line(exc)}") from exc
        return result.select(list(columns)).cast(schema.page_schema(columns))


def _problem(bad: DataFileUnreadable | None) -> str:
    """What :meth:`TableReader._failed` found (None: the file left the table)."""
    return "not in the table any more" if bad is None else bad.problem


def _has_page_crcs(path: str) -> bool:
    """Whether the data file was written by this node (pyarrow, with
    Parquet's page CRCs: compacted days, imports), not by the engine or
    delta-rs (parquet-rs, without them)."""
    import pyarrow.parquet as pq

    return (pq.read_metadata(path).created_by or "").startswith("parquet-cpp-arrow")


@functools.cache
def _local_files():
    from pyarrow import fs

    return fs.LocalFileSystem()


class _OpenFiles:
    """Open readers of row groups for reuse, by (data file, row group): a
    reader holds the footer of its row group alone (or, for a file read by
    page, by (data file, :data:`WHOLE_FILE`), the file itself). A reader serves one
    thread at a time: a thread takes one (or opens its own) and gives it
    back, so concurrent pages of one row group read through readers of
    their own. At most ``capacity`` are kept (an open file each); those
    least recently read are closed first."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._lock = threading.Lock()
        self._free: collections.OrderedDict[tuple[str, int], list] = collections.OrderedDict()
        self._kept = 0

    def take(self, key: tuple[str, int]):
        with self._lock:
            readers = self._free.get(key)
            if not readers:
                return None
            self._kept -= 1
            return readers.pop()

    def give(self, key: tuple[str, int], file) -> None:
        closed = []
        with self._lock:
            self._free.setdefault(key, []).append(file)
            self._free.move_to_end(key)
            self._kept += 1
            while self._kept > self.capacity:
                oldest, readers = next(iter(self._free.items()))
                if readers:
                    closed.append(readers.pop(0))
                    self._kept -= 1
                if not readers:
                    del self._free[oldest]
        for old in closed:
            _close(old)

    def keep_only(self, live: set[str]) -> None:
        """Close the readers of files not in ``live``."""
        with self._lock:
            gone = [key for key in self._free if key[0] not in live]
            closed = [reader for key in gone for reader in self._free.pop(key)]
            self._kept -= len(closed)
        for old in closed:
            _close(old)

    def __len__(self) -> int:
        return self._kept


def _close(reader) -> None:
    """Close a kept reader: a row group's (with the input file it was
    opened on) or a file's own (:data:`WHOLE_FILE`)."""
    if isinstance(reader, pa.NativeFile):
        reader.close()
    else:
        reader.close(force=True)


def _has_deletion_vectors(actions: pa.Table) -> bool:
    """Does any file of the version have rows deleted by a deletion vector?
    (The key index reads files whole: such a version is read through DataFusion.)"""
    for name in actions.column_names:
        if name.startswith("deletion_vector") or name.startswith("deletionVector"):
            column = actions.column(name)
            if column.null_count < len(column):
                return True
    return False


def _run(snapshot: _Snapshot, sql: str) -> pa.Table:
    return pa.table(snapshot.builder.execute(sql).read_all())


def _page_days(snapshot: _Snapshot, query: HistoryQuery, key: tuple[int, bytes] | None) -> list[dt.date] | None:
    """The days holding rows a page may return, in the page's order; None
    when the table's days are unknown."""
    if snapshot.days is None:
        return None
    low = None if query.time_start is None else schema.day_of_ns(query.time_start)
    high = None if query.time_end is None else schema.day_of_ns(max(query.time_end - 1, 0))
    if key is not None:
        cursor_day = schema.day_of_ns(key[0])
        if query.forward:
            low = cursor_day if low is None else max(low, cursor_day)
        else:
            high = cursor_day if high is None else min(high, cursor_day)
    days = [d for d in snapshot.days if (low is None or d >= low) and (high is None or d <= high)]
    return days if query.forward else days[::-1]


# --- SQL ----------------------------------------------------------------------


def _where(query: HistoryQuery, key: tuple[int, bytes] | None) -> str:
    """The WHERE clause of a page: :func:`store_query.predicates` in
    DataFusion SQL, the day partitions its time bounds (and the cursor's
    day) allow, and the rows after the cursor ``key`` in query order."""
    preds, after = store_query.predicates(query, key)
    parts = []
    for p in preds:
        column = p.column
        if p.op == store_query.EQ:
            parts.append(f"{column} = {_literal(p.value)}")
        elif p.op == store_query.IN:
            parts.append(f"{column} IN ({', '.join(_literal(v) for v in cast('tuple[Any, ...]', p.value))})")
        elif p.op == store_query.GE:
            parts.append(f"{column} >= {_literal(p.value)}")
        elif p.op == store_query.LT:
            parts.append(f"{column} < {_literal(p.value)}")
        else:
            raise ValueError(f"unknown predicate operator {p.op!r}")
        if column == store_query.TIMESTAMP and p.op == store_query.GE:
            parts.append(f"day >= {_date(schema.day_of_ns(int(cast(SupportsInt, p.value))))}")
        elif column == store_query.TIMESTAMP and p.op == store_query.LT:
            parts.append(f"day <= {_date(schema.day_of_ns(max(int(cast(SupportsInt, p.value)) - 1, 0)))}")
    if after is not None:
        timestamp, bound = int(after.timestamp), _binary(after.key)
        op = ">" if after.forward else "<"
        parts.append(f"(timestamp {op} {timestamp} OR (timestamp = {timestamp} AND {after.column} {op} {bound}))")
        # Rows after the cursor lie on its day or later (before it: on its
        # day or earlier), as the table path prunes them.
        parts.append(f"day {'>=' if after.forward else '<='} {_date(schema.day_of_ns(timestamp))}")
    return " AND ".join(parts)


def _literal(value: object) -> str:
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return _binary(value)
    return str(int(cast(SupportsInt, value)))  # the rest: integers


def _and(where: str, more: str) -> str:
    return f"{where} AND {more}" if where else more


def _days(days: Sequence[dt.date]) -> str:
    """Day partitions as a filter; no day at all matches no row."""
    return f"day IN ({', '.join(_date(d) for d in days)})" if days else "FALSE"


def _string(text: str) -> str:
    """A DataFusion SQL string literal (standard SQL: quotes doubled, no
    backslash escapes)."""
    return "'" + text.replace("'", "''") + "'"


def _binary(value: bytes | bytearray | memoryview) -> str:
    return f"X'{bytes(value).hex()}'"


def _date(day) -> str:
    return f"DATE '{day.isoformat()}'"


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return (text[:300] + "...") if len(text) > 300 else text
