"""The per-message work of a community archive export or import, run in
worker processes: opening and re-encoding messages for an export
(AES-GCM, keccak and secp256k1 key recovery for every signed channel
message), checking and decoding archives into table rows for an import.
Both are CPU-bound Python, which threads would run one at a time.

The functions here are what the workers run; :class:`Workers` is the pool
with a bounded queue of results kept in submission order, so that the
archives written and the rows imported are the same, byte for byte, as
when the work runs in the calling process.
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path
from typing import Any

from wakustore import allocator
from wakustore.protocols import archive
from wakustore.protocols.archive import IndexEntry, Layout, RecordDecoder, RecordEncoder
from wakustore.storage import window_files
from wakustore.storage.archive_window import RowsFile, encode_export_batch, load_rows, signer_columns, use_c_heap
from wakustore.storage.rows import archive_columns_to_arrow, records_to_arrow

# Tasks queued or done but not taken, per worker (each result a batch of
# encoded records or one decoded archive, ~35 MB at most): a worker finds
# its next task while the caller takes a result, and memory stays bounded.
QUEUE_PER_WORKER = 2
# An import's worker processes, by default (a member's setting
# archive_import_workers): two, one a core on this project's 2-core
# machine (import_workers never starts more than the cores). Since the
# member writes its windows itself (storage.window_files) instead of the
# engine, decoding is most of an import's CPU (~20 of ~28 CPU s a million
# messages): one worker took a private 1M hydrate 19-21 s, two 15-16 s;
# bench archive 1M: 15.6 s, fetch peak 1.72 GB with the engine's (the
# engine no longer writes, and stays at ~0.3 GB).
IMPORT_PROCESSES = 2
# It hands back files (rows_of), not memory, and decodes this many archives
# ahead, more than a window's worth (a million messages are ~10 archives a
# window), so that it goes on while the engine commits the window before.
IMPORT_QUEUE_PER_WORKER = 12
# Records a worker turns into table rows at once while decoding an archive:
# 1,024 rather than 4,096 took a worker from 20.6-21.0 to 19.5-20.2 us a
# message (fewer page faults: ~330k instead of ~390k for 250k messages)
# and its peak a few MB lower.
DECODE_BATCH = 1024

# Encoders and decoders of this worker process, by their settings: made once
# (ciphers, topic tables), used for every batch of an export or import.
_encoders: dict[tuple, RecordEncoder] = {}
_decoders: dict[tuple, RecordDecoder] = {}


def encode_batch(
    layout: Layout, keys: tuple[tuple[str, bytes], ...], batch: bytes
) -> tuple[bytes, list[int], list[int]]:
    """The records of one export batch (:func:`archive_window.export_batches`)
    framed as archive entries, their ends and payload sizes
    (:meth:`RecordEncoder.encode_framed`)."""
    try:
        return encode_export_batch(_encoder(layout, keys), batch)
    finally:
        _after_task()


def _encoder(layout: Layout, keys: tuple[tuple[str, bytes], ...]) -> RecordEncoder:
    encoder = _encoders.get((layout, keys))
    if encoder is None:
        encoder = _encoders[(layout, keys)] = RecordEncoder(layout, dict(keys))
    return encoder


def signer_batch(layout: Layout, keys: tuple[tuple[str, bytes], ...], batch: bytes) -> tuple[list[bytes], list[bytes]]:
    """(message hashes, signers) of the rows of one signer batch
    (:meth:`SignerCache.batches`) whose record has a signer field to fill
    (:meth:`RecordEncoder.signers`): b"" for a sealed unsigned payload."""
    try:
        content_topics, versions, payloads, hashes = signer_columns(batch)
        found = _encoder(layout, keys).signers(content_topics, versions, payloads)
        return [h for h, s in zip(hashes, found) if s is not None], [s for s in found if s is not None]
    finally:
        _after_task()


def decode_archive(
    data_path: Path,
    entry: IndexEntry,
    layout: Layout,
    default_pubsub_topic: str,
    allowed_topics: tuple[str, ...] | None,
    keys: tuple[tuple[str, bytes], ...],
    out: Path | None = None,
):
    """One archive of ``data_path``, checked (:func:`archive.read_archive`)
    and decoded into the rows of the messages table: an Arrow table, or,
    with ``out``, written there (:func:`archive_window.save_rows`) and the
    path returned (what a worker process hands back)."""
    decoder = _decoders.get((layout, default_pubsub_topic, keys))
    if decoder is None:
        decoder = _decoders[(layout, default_pubsub_topic, keys)] = RecordDecoder(
            layout, default_pubsub_topic, dict(keys)
        )
    try:
        data = _read(data_path, entry)
        columns = archive.archive_columns(entry, data, decoder, allowed_topics)
        if columns is not None:  # the compiled decoder read it all
            del data
            table = archive_columns_to_arrow(columns)
            del columns
            if out is None:
                return table
            with RowsFile(str(out)) as rows:
                rows.write(table, window_files.ROW_GROUP_ROWS)  # a batch a row group of the staged files
            return out
        # Not held here: the decoder drops the archive once it has parsed it.
        records = archive.iter_archive_records(entry, data, decoder, allowed_topics)
        del data
        if out is None:
            return records_to_arrow(list(records))
        # A batch at a time: an archive's messages never all exist as objects.
        with RowsFile(str(out)) as rows:
            while batch := list(itertools.islice(records, DECODE_BATCH)):
                rows.write(records_to_arrow(batch))
        return out
    finally:
        _after_task()


# A worker process's heap (glibc): blocks up to this size come from the
# heap rather than their own mappings (an archive read whole is ~36 MB),
# and freed memory stays in the process up to KEEP_HEAP_BYTES, so the
# next task reuses it instead of faulting in new pages. Returning the heap
# after each task (malloc_trim) cost a worker ~1.25M page faults and ~4 us
# of system time a message over a 1M import, 19.3 us a message against
# 17.7; its peak is the same either way (275-278 MB), which is what the
# tasks, run back to back, reach anyway.
HEAP_MMAP_THRESHOLD_BYTES = 64 * 1024 * 1024
KEEP_HEAP_BYTES = 512 * 1024 * 1024
# Whether this process keeps its freed heap between tasks (a worker that
# set the parameters above) or gives it back after each (the caller's
# process, when a small task runs there: a node lives on after it).
_keep_heap = False


# How much lower a worker's scheduling priority is than its node's: the
# node serves peers while an export or import runs, and it writes what the
# workers decode. At equal priority a 1M import's node fell ~2 s behind
# two workers on two cores and finished the last windows alone.
WORKER_NICENESS = 5


def _start_worker() -> None:
    """Arrow's buffers from the C heap in a worker (with its default pool
    a worker kept ~30 MB more at the peak of an archive), the heap kept
    for the next task (see :data:`HEAP_MMAP_THRESHOLD_BYTES`), and a lower
    priority than the node's (:data:`WORKER_NICENESS`)."""
    global _keep_heap
    os.nice(WORKER_NICENESS)
    use_c_heap()
    _keep_heap = allocator.keep_freed_heap(HEAP_MMAP_THRESHOLD_BYTES, KEEP_HEAP_BYTES)


def _after_task() -> None:
    if not _keep_heap:
        allocator.trim_heap()


def _ready() -> None:
    """A task that only makes its worker start (:meth:`Workers.start`)."""


def _read(data_path: Path, entry: IndexEntry) -> bytes:
    with open(data_path, "rb") as data:
        data.seek(entry.offset)
        return data.read(entry.size)


def rows_of(result):
    """The rows :func:`decode_archive` returned, reading (and removing) the
    file a worker wrote."""
    if isinstance(result, Path):
        try:
            return load_rows(str(result))
        finally:
            result.unlink(missing_ok=True)
    return result


def key_items(keys: Mapping[str, bytes]) -> tuple[tuple[str, bytes], ...]:
    """Channel keys in a form that pickles and hashes (the workers' cache key)."""
    return tuple(sorted(keys.items()))


class Workers:
    """Worker processes and the results due, in the order submitted.

    ``processes`` 0 runs every task in this process at :meth:`submit`
    (small exports and imports, where starting processes costs more than it
    saves). Workers are started with ``spawn``: a node's process has
    threads (the engine client, libtorrent), which a fork would copy
    mid-flight.
    """

    def __init__(self, processes: int | None = None, queue_per_worker: int = QUEUE_PER_WORKER):
        self.processes = default_processes() if processes is None else processes
        self.queue_per_worker = queue_per_worker
        self._pool: ProcessPoolExecutor | None = None
        # Pools let go by release(): their processes end on their own and
        # close() joins them.
        self._released: list[ProcessPoolExecutor] = []
        self._due: deque[tuple[object, Future]] = deque()

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def full(self) -> bool:
        return len(self._due) >= max(1, self.processes) * self.queue_per_worker

    def __len__(self) -> int:
        return len(self._due)

    def submit(self, tag: object, fn: Callable, *args) -> None:
        """Queue ``fn(*args)``; its result comes out of :meth:`take` with ``tag``."""
        future: Future = Future()
        if self.processes <= 0:
            try:
                future.set_result(fn(*args))
            except Exception as exc:  # handed to the caller by take(), as a worker's would be
                future.set_exception(exc)
        else:
            future = self._started().submit(fn, *args)
        self._due.append((tag, future))

    def start(self) -> None:
        """Start the worker processes now rather than at the first task:
        each imports for a second or so (an import starts them before its
        download)."""
        if self.processes > 0:
            pool = self._started()
            for _ in range(self.processes):
                pool.submit(_ready)

    def _started(self) -> ProcessPoolExecutor:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(
                self.processes, mp_context=multiprocessing.get_context("spawn"), initializer=_start_worker
            )
        return self._pool

    def peek_tag(self) -> Any:
        return self._due[0][0]

    def take(self):
        """(tag, result) of the oldest task, waiting for it; its exception
        is raised here."""
        tag, future = self._due.popleft()
        return tag, future.result()

    def drop(self) -> None:
        """Forget the oldest task (its result is no longer wanted)."""
        self._due.popleft()[1].cancel()

    def release(self) -> None:
        """Let the worker processes go without waiting for them to exit
        (each takes ~0.2 s to give back its heap and end): for when their
        last results are in and the caller has other work to do; :meth:`close`
        joins them."""
        if self._pool is not None and not self._due:
            self._pool.shutdown(wait=False)
            self._released.append(self._pool)
            self._pool = None

    def close(self) -> None:
        for _, future in self._due:
            future.cancel()
        self._due.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        while self._released:
            self._released.pop().shutdown(wait=True)


def default_processes() -> int:
    """One worker a core this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)
