"""13/WAKU2-STORE query semantics shared by Store v3 and legacy Store v2.

:class:`HistoryQuery` is what the storage layer answers; the two wire
protocols build it through :func:`validate_v3` and :func:`validate_v2`
(see :mod:`wakustore.protocols.store_v3`, :mod:`wakustore.protocols.store_v2`).

Semantics (wire-facts): order by (timestamp, message hash); the cursor is
exclusive; forward returns entries after it, backward before it; a page is
always in ascending order; ``time_start`` inclusive, ``time_end`` exclusive.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum, IntEnum

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

    messages: list[StoredMessage] = field(default_factory=list)
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
