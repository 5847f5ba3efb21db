"""One Store page, composed from the sources that hold the messages.

Every Store page the node answers (v3, legacy v2, the mailserver's
message store excepted) is composed here, from three sources probed in
this order, each at most once:

1. **the hot tier** (:mod:`~wakustore.storage.hot_tier`): the newest
   committed messages, in memory. It answers a page alone when the page
   cannot reach outside the time it covers completely, else it says so
   (None) and the other two answer.
2. **the rows waiting for a commit** (the write path's buffer and the
   batch being committed, :class:`~wakustore.storage.write_path.WritePath`),
   read through its pending indexes: by hash for a lookup, else over the
   query's time range in its topics only. They are read before the table:
   a commit in between then shows a row twice (dropped by hash), never
   zero times.
3. **the table's files**, through :class:`~wakustore.storage.reader.TableReader`:
   each data file's key index where it is built (index-only answers for
   lookups without data), DataFusion over the files not yet indexed.

Every source answers in Arrow (a table of the page's columns,
:func:`schema.page_columns`, and the positions of its rows in query
order: :class:`~wakustore.storage.page_table.Rows`), and so does the
page until the Store encoder: :mod:`~wakustore.storage.page_table`
merges, orders and finishes it, and hands the encoders Arrow's buffers
and the positions of the page's rows
(:class:`~wakustore.protocols.message_columns.MessageColumns`), which
they write as protobuf with one compiled call. No row object is made on
the way, except for the rows waiting for a commit, which are row objects
in the write path's buffer.

A cursor (a message hash) is placed by the cursors this node handed out
(a bounded cache), then the hot tier, then the rows waiting for a commit,
then the table.

:meth:`ReadPath.from_memory` is the part the event loop may run: the hot
tier and the cursor cache only, nothing that takes the write path's lock
(finding a cursor among the pending rows may index the whole buffer), no
file, and no waiting for a lock a thread holds: the hot tier's readers
take no lock (they read the view its last write published), and the
cursor cache is skipped while a thread holds it. When it cannot answer,
:meth:`ReadPath.page` answers in a reader
thread, told that memory was tried so that the hot tier is not probed a
second time for the same page.

The engine never reads pages (``storage.spark_oracle`` does, as the
tests' oracle).
"""

from __future__ import annotations

import collections
import dataclasses
import threading
from collections.abc import Callable

import pyarrow as pa

from wakustore.protocols import store_query
from wakustore.protocols.store_query import HistoryQuery, Ordering, Page, unknown_cursor
from wakustore.storage import page_table, schema
from wakustore.storage.hot_tier import HotTier
from wakustore.storage.reader import TableReader
from wakustore.storage.rows import Row, rows_table
from wakustore.storage.write_path import WritePath

Key = tuple[int, bytes]


class CursorCache:
    """Message hash -> timestamp of the cursors handed out, the newest
    ``capacity``; thread-safe."""

    def __init__(self, capacity: int):
        self._items: collections.OrderedDict[bytes, int] = collections.OrderedDict()
        self._capacity = capacity
        self._lock = threading.Lock()

    def get(self, key: bytes, wait: bool = True) -> int | None:
        """The cursor's timestamp; None when unknown (or, without ``wait``,
        when a thread holds the cache this instant)."""
        if not self._lock.acquire(blocking=wait):
            return None
        try:
            value = self._items.get(key)
            if value is not None:
                self._items.move_to_end(key)
            return value
        finally:
            self._lock.release()

    def put(self, key: bytes, value: int, wait: bool = True) -> None:
        """Remember a cursor handed out (without ``wait``: unless a thread
        holds the cache this instant; the cursor is then found elsewhere)."""
        if not self._lock.acquire(blocking=wait):
            return
        try:
            self._items[key] = value
            self._items.move_to_end(key)
            if len(self._items) > self._capacity:
                self._items.popitem(last=False)
        finally:
            self._lock.release()

    def clear(self) -> None:
        with self._lock:
            self._items.clear()


@dataclasses.dataclass(frozen=True, slots=True)
class MemoryPart:
    """What the hot tier answers of a lookup by hash: the page's rows among
    the hashes it holds (query order, at most limit + 1, the page's
    columns), and the hashes it does not hold."""

    found: page_table.Rows
    missing: tuple[bytes, ...]


class ReadPath:
    """Store pages over a message store's hot tier, write path and reader."""

    def __init__(self, hot: HotTier, writes: WritePath[Row], reader: TableReader, cursor_capacity: int):
        self.hot = hot
        self.writes = writes
        self.reader = reader
        self.cursors = CursorCache(cursor_capacity)

    def from_memory(self, query: HistoryQuery) -> Page | MemoryPart | None:
        """The page :meth:`page` would return when the hot tier alone answers
        it and its cursor is known without the table or the pending rows;
        for a lookup by hash that the tier answers in part, that part
        (:meth:`page` completes it); None otherwise. For the event loop: no
        file, no engine, and no waiting for a lock a thread holds (the hot
        tier's readers take none; the cursor cache is skipped when held)."""
        key: Key | None
        if query.cursor is not None and query.ordering is Ordering.MESSAGE_HASH:
            timestamp = self.cursors.get(query.cursor, wait=False) or self.hot.timestamp_of(query.cursor)
            if timestamp is None:
                return None
            key = (timestamp, query.cursor)
        else:
            key = self._cursor_key(query)
        if query.message_hashes:
            part = self.hot.lookup(query, key)
            if part is None:
                return None
            found, missing = part
            return MemoryPart(found, missing) if missing else self._finish(query, found, wait=False)
        held = self.hot.page(query, key)
        return None if held is None else self._finish(query, held, wait=False)

    def page(self, query: HistoryQuery, *, memory_tried: bool = False, part: MemoryPart | None = None) -> Page:
        """One page with Store semantics; raises StoreError for an unknown
        cursor. ``memory_tried``: :meth:`from_memory` just returned None for
        this query, so the hot tier is not asked again; ``part``: what it
        returned of a lookup by hash, so that only the hashes the tier does
        not hold are looked up."""
        key = self._cursor_key(query)
        fetch = query.limit + 1
        if query.message_hashes and part is None and not memory_tried:
            looked = self.hot.lookup(query, key)
            part = None if looked is None else MemoryPart(*looked)
        if part is not None:
            found = part.found
            if part.missing:
                # The hot tier's rows, and those of the other hashes (a
                # hash is one row: the two sets share none).
                rest = dataclasses.replace(query, message_hashes=part.missing)
                pending = self._pending(rest, key)
                table = page_table.in_order(self.reader.page(rest, key, fetch))
                found = page_table.merge(query, [found, table], pending)
            return self._finish(query, found)
        held = None if memory_tried or query.message_hashes else self.hot.page(query, key)
        if held is None:
            # Pending rows first: a commit in between shows a row twice
            # (dropped by hash), never zero times.
            pending = self._pending(query, key)
            held = page_table.merge(query, [page_table.in_order(self.reader.page(query, key, fetch))], pending)
        return self._finish(query, held)

    def forget_cursors(self) -> None:
        """Rows left the table (retention): a removed hash is no longer a cursor."""
        self.cursors.clear()

    def _finish(self, query: HistoryQuery, found: page_table.Rows, wait: bool = True) -> Page:
        page = page_table.finish(query, found)
        cursor = page.next_cursor
        if cursor is not None and query.ordering is Ordering.MESSAGE_HASH:
            self.cursors.put(cursor.message_hash, cursor.timestamp, wait=wait)
        return page

    def _pending(self, query: HistoryQuery, key: Key | None) -> pa.Table:
        """The uncommitted rows that may be on the page (the page's
        columns), read from the pending index: by hash for a lookup, else
        over the query's time range in its topics only."""
        match = store_query.matcher(query, key)
        columns = schema.page_columns(query.include_data, bool(query.message_hashes))
        if query.message_hashes:
            rows = [r for r in self.writes.pending_by_hash(query.message_hashes) if _row_matches(match, r)]
            return rows_table(rows, columns)
        low, high = store_query.key_range(query, key)
        groups = None
        if query.pubsub_topic is not None and query.content_topics:
            groups = [(query.pubsub_topic, topic) for topic in query.content_topics]
        rows = self.writes.pending_scan(
            None if low is None else low[0],
            None if high is None else high[0],
            query.forward,
            lambda row: _row_matches(match, row),
            query.limit + 1,
            groups,
        )
        return rows_table(rows, columns)

    def _cursor_key(self, query: HistoryQuery) -> Key | None:
        if query.cursor is None:
            return None
        if query.ordering is Ordering.DIGEST:
            return (query.cursor_timestamp or 0, query.cursor)
        timestamp = self._memory_timestamp_of(query.cursor)
        if timestamp is None:
            timestamp = self.reader.timestamp_of_hash(query.cursor, query.pubsub_topic)
            if timestamp is None:
                raise unknown_cursor()
            self.cursors.put(query.cursor, timestamp)
        return (timestamp, query.cursor)

    def _memory_timestamp_of(self, message_hash: bytes) -> int | None:
        """A cursor's timestamp from the cursors handed out, the hot tier or
        the rows not yet committed; None when only the table may know it."""
        timestamp = self.cursors.get(message_hash) or self.hot.timestamp_of(message_hash)
        if timestamp is None:
            pending = self.writes.pending_by_hash([message_hash])
            if pending:
                timestamp = pending[0].timestamp
        return timestamp


def _row_matches(match: Callable[..., bool], row: Row) -> bool:
    """``match`` (a :func:`store_query.matcher`) applied to a pending row."""
    return match(row.pubsub_topic, row.message.content_topic, row.message_hash, row.timestamp, row.digest)
