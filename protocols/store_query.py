"""13/WAKU2-STORE query semantics shared by Store v3 and legacy Store v2.

:class:`HistoryQuery` is what the storage layer answers; the two wire
protocols build it through :func:`validate_v3` and :func:`validate_v2`
(see :mod:`wakustore.protocols.store_v3`, :mod:`wakustore.protocols.store_v2`).

Semantics (wire-facts): order by (timestamp, message hash); the cursor is
exclusive; forward returns entries after it, backward before it; a page is
always in ascending order; ``time_start`` inclusive, ``time_end`` exclusive.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum, IntEnum
from typing import Protocol, cast

from wakustore.protocols.errors import StoreError
from wakustore.protocols.message import HASH_SIZE, WakuMessage


class StatusCode(IntEnum):
    """Store v3 status codes, as nwaku answers them."""

    OK = 200
    # nwaku answers archive-side failures (a cursor it cannot find, a
    # backend error) with 300 "BAD_RESPONSE".
    BAD_RESPONSE = 300
    BAD_REQUEST = 400
    TOO_MANY_REQUESTS = 429
    SERVICE_UNAVAILABLE = 503


# 13/WAKU2-STORE: "page size ... default 20, maximum 100" (nwaku's
# DefaultPageSize and MaxPageSize); larger requests are clamped.
DEFAULT_PAGE_SIZE = 20
MAX_PAGE_SIZE = 100

# nwaku refuses more than 10 content topics in one query (MaxContentTopicsPerQuery).
MAX_CONTENT_TOPICS = 10

# Store v3: at most 100 hashes in a lookup (one page).
MAX_MESSAGE_HASHES = 100

# Bound on topic strings we accept in a query; nwaku has none, 1 KiB is far
# above any topic in use and keeps a hostile request small.
MAX_TOPIC_LENGTH = 1024


class Ordering(Enum):
    """Which key orders results: Store v3 uses (timestamp, message hash);
    legacy v2 uses (sender timestamp, digest = sha256(content topic || payload))."""

    MESSAGE_HASH = "message_hash"
    DIGEST = "digest"


@dataclass(frozen=True, slots=True)
class HistoryQuery:
    """A validated query. Times are Unix nanoseconds; ``time_end`` is exclusive.

    ``cursor`` is the key of the entry the page starts after (forward) or
    before (backward): a message hash for v3, a (timestamp, digest) pair
    flattened into ``cursor_timestamp`` + ``cursor`` for v2.
    """

    pubsub_topic: str | None = None
    content_topics: tuple[str, ...] = ()
    time_start: int | None = None
    time_end: int | None = None
    message_hashes: tuple[bytes, ...] = ()
    cursor: bytes | None = None
    cursor_timestamp: int | None = None
    forward: bool = False
    limit: int = DEFAULT_PAGE_SIZE
    include_data: bool = True
    ordering: Ordering = Ordering.MESSAGE_HASH


@dataclass(frozen=True, slots=True)
class StoredMessage:
    """One row as the storage layer returns it."""

    message_hash: bytes
    pubsub_topic: str
    message: WakuMessage | None  # None for hashes-only pages
    timestamp: int  # the ordering timestamp (ns)
    digest: bytes = b""


@dataclass(frozen=True, slots=True)
class Page:
    """Results in ascending order and the key to continue from, if any."""

    messages: Sequence[StoredMessage] = field(default_factory=list)
    next_cursor: StoredMessage | None = None


def clamp_limit(requested: int | None) -> int:
    if not requested:
        return DEFAULT_PAGE_SIZE
    return min(requested, MAX_PAGE_SIZE)


def validate_v3(
    *,
    pubsub_topic: str | None,
    content_topics: list[str],
    time_start: int | None,
    time_end: int | None,
    message_hashes: list[bytes],
    cursor: bytes | None,
    forward: bool,
    limit: int | None,
    include_data: bool,
) -> HistoryQuery:
    """Build a Store v3 query or raise :class:`StoreError` with 400."""

    def bad(text: str) -> StoreError:
        return StoreError(StatusCode.BAD_REQUEST, f"BAD_REQUEST: {text}")

    if pubsub_topic is not None and len(pubsub_topic) > MAX_TOPIC_LENGTH:
        raise bad("pubsub topic too long")
    if any(len(t) > MAX_TOPIC_LENGTH for t in content_topics):
        raise bad("content topic too long")
    if message_hashes:
        # js-waku 0.0.36 sends its pubsub topic along with hashes; nwaku
        # ANDs the two, so that form is accepted.
        if content_topics or time_start is not None or time_end is not None:
            raise bad("message hashes cannot be combined with content topics or time bounds")
        if len(message_hashes) > MAX_MESSAGE_HASHES:
            raise bad(f"too many message hashes: {len(message_hashes)} > {MAX_MESSAGE_HASHES}")
        if any(len(h) != HASH_SIZE for h in message_hashes):
            raise bad("message hashes must be 32 bytes")
    elif content_topics and pubsub_topic is None:
        raise bad("content topics require a pubsub topic")
    elif pubsub_topic is not None and not content_topics:
        raise bad("a pubsub topic requires content topics")
    if len(content_topics) > MAX_CONTENT_TOPICS:
        raise bad(f"too many content topics: {len(content_topics)} > {MAX_CONTENT_TOPICS}")
    if time_start is not None and time_end is not None and time_start > time_end:
        raise bad("time_start is after time_end")
    if cursor is not None:
        if len(cursor) != HASH_SIZE:
            raise bad("cursor must be a 32-byte message hash")
        if cursor == bytes(HASH_SIZE):
            raise bad("cursor must not be all zeros")
    return HistoryQuery(
        pubsub_topic=pubsub_topic,
        content_topics=tuple(dict.fromkeys(content_topics)),
        time_start=time_start,
        time_end=time_end,
        message_hashes=tuple(dict.fromkeys(message_hashes)),
        cursor=cursor,
        forward=forward,
        limit=clamp_limit(limit),
        include_data=include_data,
        ordering=Ordering.MESSAGE_HASH,
    )


def unknown_cursor() -> StoreError:
    """The error for a well-formed cursor the archive does not hold."""
    return StoreError(StatusCode.BAD_RESPONSE, "BAD_RESPONSE: cursor not found")


# --- the query as a description every backend translates ---------------------
# One meaning, several evaluators: the Delta table (Spark expressions), the
# hot tier and the rows not yet committed (Python), the SQL archives of the
# benchmark, a DataFusion reader. Each translates predicates() and compares
# rows with matches(); finish_page() turns candidates into a page.

# Key columns of the description (the table's column names).
PUBSUB_TOPIC = "pubsub_topic"
CONTENT_TOPIC = "content_topic"
MESSAGE_HASH = "message_hash"
DIGEST = "digest"
TIMESTAMP = "timestamp"

EQ = "eq"  # column = value
IN = "in"  # column in value (a tuple)
GE = "ge"  # column >= value
LT = "lt"  # column < value

Key = tuple[int, bytes]


def order_column(ordering: Ordering) -> str:
    """The column that breaks timestamp ties (and a cursor names)."""
    return DIGEST if ordering is Ordering.DIGEST else MESSAGE_HASH


@dataclass(frozen=True, slots=True)
class Predicate:
    """``column op value``; all predicates of a query hold together (AND)."""

    column: str  # pubsub_topic, content_topic, message_hash or timestamp
    op: str  # eq, in, ge or lt
    value: object  # a tuple for "in"


@dataclass(frozen=True, slots=True)
class After:
    """The cursor bound: rows strictly after (forward) or before (backward)
    ``(timestamp, key)`` in (timestamp, ``column``) order."""

    timestamp: int
    column: str  # order_column() of the query
    key: bytes
    forward: bool

    def admits(self, timestamp: int, key: bytes) -> bool:
        mine = (timestamp, key)
        return mine > (self.timestamp, self.key) if self.forward else mine < (self.timestamp, self.key)


def predicates(query: HistoryQuery, key: Key | None) -> tuple[list[Predicate], After | None]:
    """What a row must satisfy to be on the page of ``query`` continuing
    from ``key`` (the cursor's (timestamp, order key), None for a first page)."""
    out: list[Predicate] = []
    if query.pubsub_topic is not None:
        out.append(Predicate(PUBSUB_TOPIC, EQ, query.pubsub_topic))
    if query.content_topics:
        out.append(Predicate(CONTENT_TOPIC, IN, tuple(query.content_topics)))
    if query.message_hashes:
        out.append(Predicate(MESSAGE_HASH, IN, tuple(query.message_hashes)))
    if query.time_start is not None:
        out.append(Predicate(TIMESTAMP, GE, query.time_start))
    if query.time_end is not None:
        out.append(Predicate(TIMESTAMP, LT, query.time_end))
    after = None if key is None else After(key[0], order_column(query.ordering), key[1], query.forward)
    return out, after


def _test(predicate: Predicate) -> Callable[[object], bool]:
    """``predicate`` as a test of the row's value of its column."""
    op, value = predicate.op, predicate.value
    if op == EQ:
        return functools.partial(operator.eq, value)
    if op == IN:
        return frozenset(cast("tuple[object, ...]", value)).__contains__
    if op == GE:
        return functools.partial(operator.le, cast(int, value))  # value <= x
    if op == LT:
        return functools.partial(operator.gt, cast(int, value))  # value > x
    raise ValueError(f"unknown predicate operator {op!r}")


def holds(predicate: Predicate, value: object) -> bool:
    """Does ``value`` (the row's ``predicate.column``) satisfy ``predicate``?"""
    return _test(predicate)(value)


# Position of each predicate column among a row's values in matcher().
_ROW_FIELDS = {PUBSUB_TOPIC: 0, CONTENT_TOPIC: 1, MESSAGE_HASH: 2, TIMESTAMP: 3}


class RowMatcher(Protocol):
    """What :func:`matcher` returns: a test of one row, its values given
    positionally or by name."""

    def __call__(
        self, pubsub_topic: str, content_topic: str, message_hash: bytes, timestamp: int, digest: bytes
    ) -> bool: ...


def matcher(query: HistoryQuery, key: Key | None) -> RowMatcher:
    """:func:`matches` for one query, with the description compiled once:
    call it with (pubsub_topic, content_topic, message_hash, timestamp,
    digest) of each row, positionally or by name."""
    preds, after = predicates(query, key)
    tests = [(_ROW_FIELDS[p.column], _test(p)) for p in preds]
    bound = None if after is None else (after.timestamp, after.key)
    by_digest = after is not None and after.column == DIGEST
    forward = after is None or after.forward

    def check(pubsub_topic: str, content_topic: str, message_hash: bytes, timestamp: int, digest: bytes) -> bool:
        if tests:
            row = (pubsub_topic, content_topic, message_hash, timestamp)
            for index, test in tests:
                if not test(row[index]):
                    return False
        if bound is None:
            return True
        mine = (timestamp, digest if by_digest else message_hash)
        return mine > bound if forward else mine < bound

    return check


def matches(
    query: HistoryQuery,
    key: Key | None,
    *,
    pubsub_topic: str,
    content_topic: str,
    message_hash: bytes,
    timestamp: int,
    digest: bytes,
) -> bool:
    """Is this row on the page of ``query`` from ``key``? (The Python
    evaluation of :func:`predicates`.)"""
    return matcher(query, key)(
        pubsub_topic=pubsub_topic,
        content_topic=content_topic,
        message_hash=message_hash,
        timestamp=timestamp,
        digest=digest,
    )


def key_range(query: HistoryQuery, key: Key | None) -> tuple[Key | None, Key | None]:
    """Exclusive (low, high) bounds in (timestamp, order key) order that
    every match lies strictly between (None: unbounded), for indexes sorted
    by that key; the other predicates still apply inside the range.

    (ts, b"") sorts before every (ts, 32-byte key): as the low bound it
    admits all of ts (time_start is inclusive), as the high bound it
    excludes all of ts (time_end is exclusive).
    """
    low = (query.time_start, b"") if query.time_start is not None else None
    high = (query.time_end, b"") if query.time_end is not None else None
    if key is not None:
        if query.forward:
            low = key if low is None else max(low, key)
        else:
            high = key if high is None else min(high, key)
    return low, high


def sort_key(ordering: Ordering) -> Callable[[StoredMessage], Key]:
    """The (timestamp, order key) of a message; works on any object with
    ``timestamp``, ``message_hash`` and ``digest`` attributes."""
    if ordering is Ordering.DIGEST:
        return lambda m: (m.timestamp, m.digest)
    return lambda m: (m.timestamp, m.message_hash)


def finish_page(query: HistoryQuery, found: list[StoredMessage]) -> Page:
    """The page from up to limit + 1 candidates in query order (ascending
    forward, descending backward): at most ``limit`` messages, ascending,
    and the cursor to continue from when there were more (the last
    message of a forward page, the first of a backward one)."""
    more = len(found) > query.limit
    page = found[: query.limit]
    if not query.forward:
        page.reverse()
    next_cursor = None
    if more and page:
        next_cursor = page[-1] if query.forward else page[0]
    return Page(messages=page, next_cursor=next_cursor)
