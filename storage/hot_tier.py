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

Completeness needs every write to pass through this node, so the tier is
for a node that owns its table; a fleet sharing one table turns it off
(another node's writes would be missing).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence

from sortedcontainers import SortedList

from wakustore.protocols import store_query
from wakustore.protocols.store_query import HistoryQuery, Ordering, StoredMessage
from wakustore.storage.rows import Row

# Per-row bookkeeping beyond payload, meta and topics (Row, WakuMessage,
# hashes, dict, set and sorted-list entries), measured with tracemalloc:
# 810-860 bytes a row (600 had made a 256 MiB tier hold ~290 MB).
ROW_OVERHEAD_BYTES = 900

Key = tuple[int, bytes]

# start_ns for a tier that holds the whole table: complete for all time.
ALL_TIME = -(2**63)


class HotTier:
    """Thread-safe; complete for timestamps >= ``start_ns`` once started."""

    def __init__(self, max_bytes: int, window_ns: int):
        self.max_bytes = max_bytes
        self.window_ns = window_ns
        self.start_ns: int | None = None  # None: covers nothing yet
        self.bytes = 0
        self._lock = threading.Lock()
        self._rows: dict[bytes, Row] = {}
        self._muids: set[bytes] = set()  # one row per MUID, as the table holds them
        self._order: SortedList = SortedList()  # (timestamp, hash) of every row
        self._topics: dict[tuple[str, str], SortedList] = {}

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    def __len__(self) -> int:
        return len(self._rows)

    # --- filling ----------------------------------------------------------

    def start(self, start_ns: int, rows: Iterable[Row], now_ns: int) -> None:
        """Declare completeness from ``start_ns`` with the table's rows since
        then (and the rows not yet committed); the first row of a MUID wins."""
        with self._lock:
            self.start_ns = start_ns
            for row in rows:
                if row.timestamp >= start_ns:
                    self._insert(row)
            self._evict(now_ns)

    def add(self, rows: Sequence[Row], now_ns: int) -> None:
        if self.start_ns is None:
            return
        horizon = now_ns - self.window_ns
        with self._lock:
            for row in rows:
                if row.timestamp < horizon:
                    # It would be evicted at once: skip it, and the tier is
                    # complete only above it from now on.
                    if row.timestamp >= self.start_ns:
                        self._forget_through(row.timestamp)
                elif row.timestamp >= self.start_ns:
                    self._insert(row)
            self._evict(now_ns)

    def clear(self) -> None:
        """Cover nothing from now on: every query goes to the table."""
        with self._lock:
            self.start_ns = None
            self._rows.clear()
            self._muids.clear()
            self._order.clear()
            self._topics.clear()
            self.bytes = 0

    def forget_before(self, cutoff_ns: int) -> None:
        """Rows older than ``cutoff_ns`` left the table (retention)."""
        with self._lock:
            while self._order and self._order[0][0] < cutoff_ns:
                self._remove(self._order[0][1])

    def replace(self, start_ns: int, end_ns: int, content_topics: Sequence[str], rows: Sequence[Row]) -> None:
        """Mirror a window replacement in the table."""
        if self.start_ns is None:
            return
        with self._lock:
            topics = set(content_topics)
            doomed = [h for (ts, h) in self._order.irange((start_ns, b""), (end_ns, b""), inclusive=(True, False))
                      if self._rows[h].message.content_topic in topics]
            for message_hash in doomed:
                self._remove(message_hash)
            for row in rows:
                if row.timestamp >= self.start_ns:
                    self._insert(row)

    # --- reading ----------------------------------------------------------

    def timestamp_of(self, message_hash: bytes) -> int | None:
        row = self._rows.get(message_hash)
        return row.timestamp if row is not None else None

    def page(self, query: HistoryQuery, key: Key | None) -> list[StoredMessage] | None:
        """Up to limit + 1 matches in query order, or None when the answer
        may reach outside the complete region (ask the table)."""
        if self.start_ns is None or query.ordering is not Ordering.MESSAGE_HASH:
            return None
        with self._lock:
            if query.message_hashes:
                return self._by_hashes(query, key)
            if not query.content_topics or query.pubsub_topic is None:
                return None
            fetch = query.limit + 1
            low, high = store_query.key_range(query, key)
            found: list[Row] = []
            for topic in query.content_topics:
                keys = self._topics.get((query.pubsub_topic, topic))
                if keys:
                    found.extend(self._scan(keys, low, high, query.forward, fetch))
            found.sort(key=store_query.sort_key(query.ordering), reverse=not query.forward)
            found = found[:fetch]
            if not self._complete(query, key, len(found) >= fetch):
                return None
            return [r.stored(query.include_data) for r in found]

    # --- private ----------------------------------------------------------

    def _complete(self, query: HistoryQuery, key: Key | None, filled: bool) -> bool:
        """Is every row the answer could hold at or after start_ns?"""
        if self.start_ns == ALL_TIME:
            return True
        lower = query.time_start
        if query.forward and key is not None:
            lower = key[0] if lower is None else max(lower, key[0])
        if lower is not None and lower >= self.start_ns:
            return True
        # Backward pages walk down from the newest: a full page from memory
        # is the right page, since everything newer than start_ns is here.
        return not query.forward and filled

    def _scan(self, keys: SortedList, low: Key | None, high: Key | None, forward: bool, fetch: int) -> list[Row]:
        """The first ``fetch`` rows of one topic's index strictly between
        ``low`` and ``high`` (store_query.key_range), in query order; the
        index holds one topic, so every row in the range matches."""
        iterator = keys.irange(low, high, inclusive=(False, False), reverse=not forward)
        out = []
        for _, message_hash in iterator:
            out.append(self._rows[message_hash])
            if len(out) >= fetch:
                break
        return out

    def _by_hashes(self, query: HistoryQuery, key: Key | None) -> list[StoredMessage] | None:
        rows = [self._rows.get(h) for h in query.message_hashes]
        if any(r is None for r in rows):
            return None
        match = store_query.matcher(query, key)
        matched = [
            row for row in rows
            if match(row.pubsub_topic, row.message.content_topic, row.message_hash, row.timestamp, row.digest)
        ]
        matched.sort(key=store_query.sort_key(query.ordering), reverse=not query.forward)
        return [r.stored(query.include_data) for r in matched[: query.limit + 1]]

    def _insert(self, row: Row) -> None:
        """Add a row unless its MUID is here already (the table keeps the first)."""
        if row.muid in self._muids:
            return
        self._muids.add(row.muid)
        self._rows[row.message_hash] = row
        entry = (row.timestamp, row.message_hash)
        self._order.add(entry)
        topic = (row.pubsub_topic, row.message.content_topic)
        keys = self._topics.get(topic)
        if keys is None:
            keys = self._topics[topic] = SortedList()
        keys.add(entry)
        self.bytes += _size(row)

    def _remove(self, message_hash: bytes) -> None:
        row = self._rows.pop(message_hash)
        self._muids.discard(row.muid)
        entry = (row.timestamp, message_hash)
        self._order.remove(entry)
        topic = (row.pubsub_topic, row.message.content_topic)
        keys = self._topics[topic]
        keys.remove(entry)
        if not keys:
            del self._topics[topic]
        self.bytes -= _size(row)

    def _forget_through(self, timestamp: int) -> None:
        """Give up completeness at and below ``timestamp``."""
        while self._order and self._order[0][0] <= timestamp:
            self._remove(self._order[0][1])
        self.start_ns = max(self.start_ns, timestamp + 1)

    def _evict(self, now_ns: int) -> None:
        """Drop the oldest timestamps (all rows of each) past the budget or window."""
        horizon = now_ns - self.window_ns
        while self._order and (self.bytes > self.max_bytes or self._order[0][0] < horizon):
            oldest = self._order[0][0]
            while self._order and self._order[0][0] == oldest:
                self._remove(self._order[0][1])
            self.start_ns = max(self.start_ns, oldest + 1)


def _size(row: Row) -> int:
    m = row.message
    return len(m.payload) + len(m.meta) + len(m.content_topic) + len(row.pubsub_topic) + ROW_OVERHEAD_BYTES
