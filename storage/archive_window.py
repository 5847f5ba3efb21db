"""What community archive export reads from the messages table besides its
windows (:meth:`MessageStore.stream_window_tables`): where the history
starts, and the window's rows cut into batches for worker processes."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence

import pyarrow as pa

from wakustore.storage import schema
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
EXPORT_COLUMNS = ("pubsub_topic", "content_topic", "payload", "meta", "version", "sender_timestamp",
                  "rate_limit_proof", "arrival_time", "message_hash")


def export_batches(table: pa.Table, rows: int) -> Iterator[bytes]:
    """A window's rows (one day of :meth:`MessageStore.stream_window_tables`)
    cut into batches of at most ``rows`` for worker processes, each as an
    Arrow IPC stream of :data:`EXPORT_COLUMNS`: that holds only the batch's
    bytes, where a pickled slice would carry the whole day's buffers."""
    table = table.select(list(EXPORT_COLUMNS))
    for offset in range(0, table.num_rows, rows):
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table.slice(offset, rows))
        yield sink.getvalue().to_pybytes()


def export_columns(batch: bytes) -> list[list]:
    """The columns of an :func:`export_batches` batch as Python lists."""
    table = pa.ipc.open_stream(batch).read_all()
    return [table.column(name).to_pylist() for name in EXPORT_COLUMNS]


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

    def write(self, table: pa.Table) -> None:
        self._writer.write_table(table)


def load_rows(path: str) -> pa.Table:
    """The table :func:`save_rows` wrote, memory-mapped (file-backed pages
    the kernel can drop, not heap). The file may be removed at once."""
    return pa.ipc.open_file(pa.memory_map(path)).read_all()
