"""A Store page as an Arrow table, from its sources to the encoder.

The read path (:mod:`~wakustore.storage.read_path`) answers in Arrow: the
hot tier, the rows waiting for a commit and the table's files each hand
it a table of the page's columns (:func:`schema.page_columns`); here they
are filtered, merged and ordered, and the finished page is handed to the
Store encoders as :class:`~wakustore.protocols.message_columns.MessageColumns`:
Arrow's buffers, no object a row (a page of 100 messages with 1 KiB
payloads: ~0.1 ms to encode, ~0.9 ms through row objects and the
protobuf runtime).

Filters and orders are positions (:class:`Rows`): a source's rows are
not copied to be filtered, sorted or reversed; the encoder writes the
rows at the page's positions. Only a merge of two sources copies their
page's rows (at most limit + 1 each) into one table.

Semantics are :mod:`~wakustore.protocols.store_query`'s (``predicates``,
``key_range``, ``finish_page``), evaluated a column at a time; the tests
hold the two equal.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from wakustore.protocols import store_query
from wakustore.protocols.message_columns import Binary, MessageColumns, MessageData
from wakustore.protocols.store_query import HistoryQuery, Page
from wakustore.storage import schema

Key = tuple[int, bytes]


# --- the rows of a source ------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Rows:
    """A source's part of a page: a table of the page's columns (one
    chunk) and the positions of its rows on the page, in query order.
    Filters and orders are positions: the rows are copied at most once,
    when two sources are merged."""

    table: pa.Table
    order: np.ndarray  # int64

    @property
    def count(self) -> int:
        return len(self.order)


def in_order(table: pa.Table) -> Rows:
    """The rows of a table already in query order (the reader's pages)."""
    return Rows(_one_chunk(table), np.arange(table.num_rows, dtype=np.int64))


def select(
    table: pa.Table,
    query: HistoryQuery,
    key: Key | None = None,
    fetch: int | None = None,
    low: Key | None = None,
    high: Key | None = None,
) -> Rows:
    """The first ``fetch`` (default limit + 1) rows of ``table`` in query
    order that are on the page of ``query`` from ``key``
    (:func:`store_query.predicates`) and strictly between ``low`` and
    ``high`` (:func:`store_query.key_range`). The table holds the columns
    the predicates name."""
    table = _one_chunk(table)
    mask = page_mask(table, query, key, low, high)
    positions = np.arange(table.num_rows, dtype=np.int64) if mask is None else np.flatnonzero(mask)
    positions = _sorted(table, positions, query)
    return Rows(table, positions[: query.limit + 1 if fetch is None else fetch])


def page_mask(
    table: pa.Table, query: HistoryQuery, key: Key | None, low: Key | None = None, high: Key | None = None
) -> np.ndarray | None:
    """Mask of the rows on the page of ``query`` from ``key``, strictly
    between ``low`` and ``high``; None when every row is. Times are
    compared in numpy, keys only for the rows at a bound's time."""
    preds, after = store_query.predicates(query, key)
    timestamps = table.column("timestamp").to_numpy()
    masks: list[np.ndarray] = []
    for p in preds:
        if p.op == store_query.GE:
            masks.append(timestamps >= p.value)
        elif p.op == store_query.LT:
            masks.append(timestamps < p.value)
        elif p.op == store_query.EQ:
            column = table.column(p.column)
            masks.append(_numpy(pc.equal(column, pa.scalar(p.value, column.type))))
        elif p.op == store_query.IN:
            column = table.column(p.column)
            values = pa.array(list(cast("tuple[object, ...]", p.value)), column.type)
            masks.append(_numpy(pc.is_in(column, value_set=values)))
        else:
            raise ValueError(f"unknown predicate operator {p.op!r}")
    if after is not None:
        bound = (after.timestamp, after.key)
        masks.append(_beyond(table, timestamps, bound, after.column, after.forward))
    if low is not None:
        masks.append(_beyond(table, timestamps, low, "message_hash", True))
    if high is not None:
        masks.append(_beyond(table, timestamps, high, "message_hash", False))
    if not masks:
        return None
    mask = masks[0]
    for more in masks[1:]:
        mask = mask & more
    return mask


def _beyond(table: pa.Table, timestamps: np.ndarray, bound: Key, column: str, above: bool) -> np.ndarray:
    """Rows whose (timestamp, ``column``) is above (or below) ``bound``."""
    mask = timestamps > bound[0] if above else timestamps < bound[0]
    ties = np.flatnonzero(timestamps == bound[0])
    if len(ties):
        keys = table.column(column).take(ties).to_pylist()
        mask[ties] = [(k > bound[1]) if above else (k < bound[1]) for k in keys]
    return mask


def _numpy(mask) -> np.ndarray:
    return mask.to_numpy(zero_copy_only=False).astype(bool, copy=False)


def _sorted(table: pa.Table, positions: np.ndarray, query: HistoryQuery) -> np.ndarray:
    """``positions`` in query order: (timestamp, order column) ascending
    forward, descending backward (:func:`store_query.sort_key`). A page's
    candidates are a few hundred rows at most: Python's sort over their
    (time, key) pairs takes ~10 us for 40 of them, less than one Arrow
    kernel call."""
    if len(positions) < 2:
        return positions
    timestamps = table.column("timestamp").to_numpy()[positions].tolist()
    keys = table.column(store_query.order_column(query.ordering)).take(positions).to_pylist()
    by = sorted(range(len(positions)), key=lambda i: (timestamps[i], keys[i]), reverse=not query.forward)
    return positions[np.array(by, dtype=np.int64)]


def merge(query: HistoryQuery, sources: Sequence[Rows], pending: pa.Table | None = None) -> Rows:
    """The first limit + 1 rows in query order of sources (each in query
    order) and of rows in any order that are on the page (``pending``); a
    row in two of them (a commit ran between two reads) once."""
    fetch = query.limit + 1
    parts = [r for r in sources if r.count]
    if pending is None or not pending.num_rows:
        if len(parts) == 1:
            return Rows(parts[0].table, parts[0].order[:fetch])
        if not parts:
            return (
                sources[0]
                if sources
                else in_order(schema.empty_page(schema.page_columns(query.include_data, bool(query.message_hashes))))
            )
    tables = [r.table.take(r.order) for r in parts]
    if pending is not None and pending.num_rows:
        tables.append(pending)
    target = tables[0].schema
    merged = pa.concat_tables([t if t.schema.equals(target) else t.cast(target) for t in tables]).combine_chunks()
    seen: set[bytes] = set()
    first = [h not in seen and not seen.add(h) for h in merged.column("message_hash").to_pylist()]  # type: ignore[func-returns-value]  # adds h, then True
    positions = np.flatnonzero(np.array(first, dtype=bool))
    return Rows(merged, _sorted(merged, positions, query)[:fetch])


# --- the page ---------------------------------------------------------------


def finish(query: HistoryQuery, found: Rows) -> Page:
    """:func:`store_query.finish_page` of up to limit + 1 rows in query
    order: at most ``limit`` messages, ascending, held in columns, and the
    cursor to continue from when there were more."""
    more = found.count > query.limit
    order = found.order[: query.limit]
    if not query.forward:
        order = order[::-1]
    messages = message_columns(found.table, order)
    cursor = None
    if more and len(messages):
        cursor = messages[-1] if query.forward else messages[0]
    return Page(messages=messages, next_cursor=cursor)


def message_columns(table: pa.Table, order: np.ndarray | None = None) -> MessageColumns:
    """A page's rows (the columns of :data:`schema.DATA_COLUMNS`, or of the
    keys alone) as the Store encoders take them: Arrow's buffers, and the
    positions of the page's rows among them (``order``; None: all, as they
    stand). Raises ValueError on a null."""
    table = _one_chunk(table)
    names = set(table.column_names)

    def binary(name: str) -> Binary:
        column = table.column(name)
        values = column.chunk(0) if column.num_chunks else pa.array([], column.type)
        if values.null_count:
            raise ValueError(f"null values in column {name}")
        if values.type not in _PLAIN:
            values = values.cast(pa.binary())
        _, offsets, data = values.buffers()
        if offsets is None:
            return _NO_OFFSETS, b""
        at = np.frombuffer(offsets, dtype=np.int32, count=len(values) + 1, offset=values.offset * 4)
        return at, (data if data is not None else b"")

    def numbers(name: str, dtype: type) -> np.ndarray:
        return table.column(name).to_numpy().astype(dtype, copy=False)

    data = None
    if "payload" in names:
        data = MessageData(
            binary("content_topic"),
            binary("payload"),
            binary("meta"),
            binary("rate_limit_proof"),
            numbers("version", np.int32),
            numbers("sender_timestamp", np.int64),
        )
    return MessageColumns(
        binary("message_hash"),
        binary("pubsub_topic"),
        numbers("timestamp", np.int64),
        binary("digest") if "digest" in names else None,
        data,
        order,
    )


def _one_chunk(table: pa.Table) -> pa.Table:
    return table.combine_chunks() if any(c.num_chunks > 1 for c in table.columns) else table


_PLAIN = (pa.binary(), pa.string())
_NO_OFFSETS = np.zeros(1, dtype=np.int32)
