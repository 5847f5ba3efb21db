"""What community archive export reads from the messages table besides its
windows (:meth:`MessageStore.stream_window_tables`): where the history
starts, and the window's rows cut into batches for worker processes."""

from __future__ import annotations

import datetime as dt
import logging
import os
import shutil
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from wakustore.durable import make_dirs
from wakustore.protocols.archive_records import Layout, RecordEncoder
from wakustore.storage import archive_columns, schema
from wakustore.storage.table import DeltaTableRef, sql_string

log = logging.getLogger(__name__)


def oldest_timestamp_ns(table: DeltaTableRef, content_topics: Sequence[str]) -> int | None:
    """The sender timestamp (ns) of the oldest committed message on
    ``content_topics``; None when there is none (or no table yet). The
    caller commits the buffer first if pending messages should count."""
    if not content_topics:
        return None
    # {table} is the only placeholder: braces in a topic are doubled.
    listed = ", ".join(sql_string(t).replace("{", "{{").replace("}", "}}") for t in content_topics)
    try:
        oldest = table.scalar(f"SELECT min(timestamp) FROM {{table}} WHERE content_topic IN ({listed})")
    except Exception as exc:  # no table yet: nothing to archive
        log.debug("no oldest message: %s", exc)
        return None
    return None if oldest is None else int(oldest)


# What an archive record is made of, in the order
# protocols.archive_records.RecordEncoder.encode_columns takes it.
EXPORT_COLUMNS = (
    "pubsub_topic",
    "content_topic",
    "payload",
    "meta",
    "version",
    "sender_timestamp",
    "rate_limit_proof",
    "arrival_time",
    "message_hash",
)


# The column of a batch with the rows' signers when known (SignerCache).
SIGNER_COLUMN = "signer"


def export_batches(table: pa.Table, rows: int, signers: pa.Array | None = None) -> Iterator[bytes]:
    """A window's rows (one day of :meth:`MessageStore.stream_window_tables`)
    cut into batches of at most ``rows`` for worker processes, each as an
    Arrow IPC stream of :data:`EXPORT_COLUMNS`, and the rows' signers
    where known (:meth:`SignerCache.lookup`, null where not) when given:
    that holds only the batch's bytes, where a pickled slice would carry
    the whole day's buffers."""
    table = table.select(list(EXPORT_COLUMNS))
    if signers is not None:
        table = table.append_column(SIGNER_COLUMN, signers)
    return _ipc_batches(table, rows)


def _ipc_batches(table: pa.Table, rows: int) -> Iterator[bytes]:
    """``table`` cut into Arrow IPC streams of at most ``rows`` rows."""
    for offset in range(0, table.num_rows, rows):
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table.slice(offset, rows))
        yield sink.getvalue().to_pybytes()


def _batch_columns(batch: bytes, names: Sequence[str]) -> tuple[pa.Table, list[list]]:
    """An IPC batch, and its columns ``names`` as Python lists."""
    table = pa.ipc.open_stream(batch).read_all()
    return table, [table.column(name).to_pylist() for name in names]


def export_columns(batch: bytes) -> tuple[list[list], list | None]:
    """The columns of an :func:`export_batches` batch as Python lists, and
    its signers (None when the batch carries none)."""
    table, columns = _batch_columns(batch, EXPORT_COLUMNS)
    return columns, table.column(SIGNER_COLUMN).to_pylist() if SIGNER_COLUMN in table.column_names else None


def encode_export_batch(encoder: RecordEncoder, batch: bytes) -> tuple[bytes, list[int], list[int]]:
    """The framed records of an :func:`export_batches` batch
    (:meth:`RecordEncoder.encode_framed`): status-go's a batch at a time
    (:mod:`archive_columns`), the others, and a batch with a time before
    1970, a record at a time."""
    if encoder.layout is Layout.STATUS_GO:
        table = pa.ipc.open_stream(batch).read_all()
        signers = table.column(SIGNER_COLUMN) if SIGNER_COLUMN in table.column_names else None
        encoded = archive_columns.encode_framed(encoder, table, signers)
        if encoded is not None:
            return encoded
    columns, signers = export_columns(batch)
    # columns: the nine EXPORT_COLUMNS, the positional parameters before signers.
    return encoder.encode_framed(*columns, signers=signers)  # type: ignore[misc]


# What a signer batch holds (SignerCache.batches): what opening a payload takes.
SIGNER_INPUT_COLUMNS = ("content_topic", "version", "payload", "message_hash")
_SIGNERS = pa.schema(
    [pa.field("message_hash", pa.binary(), nullable=False), pa.field(SIGNER_COLUMN, pa.binary(), nullable=False)]
)
# Files a day may have before they are merged into one (a control node adds
# one a day at each preparation, every few minutes).
SIGNER_FILES_PER_DAY = 16


class SignerCache:
    """The signer of each message of a control node's channels, worked out
    ahead of the export (a secp256k1 key recovery each, most of an
    export's CPU): by message hash, in one directory a day of files of
    (message_hash, signer), Arrow IPC. status-go does the same work when a
    message arrives (it keeps messages opened, with their signer).

    A cache: a row without an entry is recovered at the export, so a lost
    or partial file costs time, never a wrong record. An entry is a
    function of the message (its hash covers payload and content topic,
    the signer is the payload's), so entries never go stale."""

    def __init__(self, directory: Path):
        self.directory = directory

    def add(self, day: dt.date, hashes: Sequence[bytes], signers: Sequence[bytes]) -> None:
        """Keep these signers of messages of ``day``."""
        if not len(hashes):
            return
        day_dir = self.directory / day.isoformat()
        make_dirs(day_dir)
        table = pa.table([pa.array(hashes, pa.binary()), pa.array(signers, pa.binary())], schema=_SIGNERS)
        _write_ipc(day_dir / f"{uuid.uuid4().hex}.arrow", table)
        files = sorted(day_dir.glob("*.arrow"))
        if len(files) >= SIGNER_FILES_PER_DAY:
            merged = pa.concat_tables(load_rows(str(f)) for f in files)
            # The merged file first: a crash in between leaves repeats, which
            # a lookup takes either of (they are equal).
            _write_ipc(day_dir / f"{uuid.uuid4().hex}.arrow", merged)
            for f in files:
                f.unlink(missing_ok=True)

    def lookup(self, day: dt.date, hashes: pa.Array | pa.ChunkedArray) -> pa.Array | None:
        """The signer of each of ``hashes`` (messages of ``day``), null
        where unknown; None when the day has no entry."""
        day_dir = self.directory / day.isoformat()
        files = sorted(day_dir.glob("*.arrow")) if day_dir.is_dir() else []
        tables = []
        for f in files:
            try:
                tables.append(load_rows(str(f)))
            except (OSError, pa.ArrowInvalid) as exc:  # a cache: recovered at the export instead
                log.warning("signer cache file %s unreadable, ignored: %s", f, exc)
        if not tables:
            return None
        known = pa.concat_tables(tables)
        where = pc.index_in(hashes, value_set=known.column("message_hash"))
        signers = pc.take(known.column(SIGNER_COLUMN), where)
        return signers.combine_chunks() if isinstance(signers, pa.ChunkedArray) else signers

    def forget_before(self, day: dt.date) -> None:
        """Drop the entries of days before ``day`` (exported)."""
        if not self.directory.is_dir():
            return
        for day_dir in self.directory.iterdir():
            try:
                stale = dt.date.fromisoformat(day_dir.name) < day
            except ValueError:
                continue
            if stale:
                shutil.rmtree(day_dir, ignore_errors=True)

    @staticmethod
    def batches(table: pa.Table, content_topics: Sequence[str], rows: int) -> Iterator[bytes]:
        """The rows of ``table`` (a day of a window) whose signer may be
        worked out, sealed channel messages (``content_topics``, version
        1), as Arrow IPC batches of :data:`SIGNER_INPUT_COLUMNS` for
        worker processes."""
        mask = pc.and_(
            pc.is_in(table.column("content_topic"), value_set=pa.array(list(content_topics), pa.string())),
            pc.equal(table.column("version"), 1),
        )
        return _ipc_batches(table.select(list(SIGNER_INPUT_COLUMNS)).filter(mask), rows)


def signer_columns(batch: bytes) -> list[list]:
    """The columns of a :meth:`SignerCache.batches` batch as Python lists."""
    return _batch_columns(batch, SIGNER_INPUT_COLUMNS)[1]


def _write_ipc(path: Path, table: pa.Table) -> None:
    """``table`` as an Arrow IPC file at ``path``, whole or not at all."""
    part = path.with_suffix(".part")
    with pa.OSFile(str(part), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    os.replace(part, path)


def use_c_heap() -> None:
    """Arrow allocates from the C heap (malloc) in this process from now
    on, not from its default pool (mimalloc), which keeps freed memory;
    for worker processes that give their heap back after each task."""
    pa.set_memory_pool(pa.system_memory_pool())


class RowsFile:
    """Rows a worker process decoded, batch by batch, for the importing
    process to map (:func:`load_rows`): an Arrow IPC file in the page cache
    costs a write, where a pickled table through a pipe costs a copy on
    each side and its whole size in both processes' heaps."""

    def __init__(self, path: str):
        self._sink = pa.OSFile(path, "wb")
        self._writer = pa.ipc.new_file(self._sink, schema.MESSAGES)

    def __enter__(self) -> RowsFile:
        return self

    def __exit__(self, *exc) -> None:
        try:
            self._writer.close()
        finally:
            self._sink.close()

    def write(self, table: pa.Table, batch_rows: int | None = None) -> None:
        self._writer.write_table(table, max_chunksize=batch_rows)


def load_rows(path: str) -> pa.Table:
    """The table an Arrow IPC file holds (:class:`RowsFile`, the signer
    cache's files), memory-mapped (file-backed pages
    the kernel can drop, not heap). The file may be removed at once."""
    return pa.ipc.open_file(pa.memory_map(path)).read_all()
