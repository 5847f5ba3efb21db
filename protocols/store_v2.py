"""Legacy 13/WAKU2-STORE (`/vac/waku/store/2.0.0-beta4`): codecs and validation.

Server side: :func:`decode_request` turns a HistoryRPC query into the
request id and a validated :class:`HistoryQuery` ordered by
(timestamp, digest); :func:`encode_response` answers it. Client side:
:func:`encode_request` and :func:`decode_response`.

Semantics follow nwaku's legacy store (waku/waku_store_legacy/,
waku/waku_archive_legacy/, waku/node/kernel_api/store.nim):

* times are Unix nanoseconds (beta3 used float seconds); ``start_time`` and
  ``end_time`` are both inclusive (the archive drivers filter with ``>=``
  and ``<=``);
* unset paging info or direction means BACKWARD; page size 0 means 20,
  above 100 is clamped; at most 10 content topics; content topics need no
  pubsub topic;
* the cursor Index is compared on (receiver_time, digest): nwaku calls
  receiver_time ``storeTime`` and orders rows by it, the message timestamp
  or the arrival time for a message without one. Every answer of ours puts
  that ordering timestamp in receiver_time, and clients echo the Index;
* a cursor with an empty pubsub topic, a zero sender or receiver time or an
  all-zero digest is refused (nwaku checkHistCursor), and every refused
  query is answered INVALID_CURSOR, the only error the wire has for it
  (nwaku rpc.nim maps BAD_REQUEST and unknown errors to INVALID_CURSOR).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from enum import IntEnum
from typing import cast

from wakustore.protocols.errors import StoreError
from wakustore.protocols.framing import encode_uvarint
from wakustore.protocols.message import HASH_SIZE, WakuMessage
from wakustore.protocols.message_codec import (
    MAX_ENCODED_MESSAGE_SIZE,
    message_from_pb,
    nested_message_size,
    parse_protobuf,
    with_request_id,
    write_message_pb,
)
from wakustore.protocols.message_columns import V2_MESSAGES, MessageColumns
from wakustore.protocols.store_query import (
    DEFAULT_PAGE_SIZE,
    MAX_CONTENT_TOPICS,
    MAX_TOPIC_LENGTH,
    HistoryQuery,
    Ordering,
    Page,
    StatusCode,
    StoredMessage,
    clamp_limit,
)
from wakustore.protos import store_legacy_pb2

PROTOCOL_ID = "/vac/waku/store/2.0.0-beta4"

_INT64_MAX = 2**63 - 1
_BACKWARD = store_legacy_pb2.PagingInfo.BACKWARD
_FORWARD = store_legacy_pb2.PagingInfo.FORWARD


class HistoryError(IntEnum):
    """HistoryResponse.error values (nwaku waku_store_legacy/rpc.nim)."""

    NONE = 0
    INVALID_CURSOR = 1
    TOO_MANY_REQUESTS = 429
    SERVICE_UNAVAILABLE = 503


@dataclass(frozen=True, slots=True)
class Cursor:
    """A legacy paging Index. Times are Unix nanoseconds."""

    digest: bytes
    receiver_time: int
    sender_time: int
    pubsub_topic: str


def digest(message: WakuMessage) -> bytes:
    """The legacy message digest: sha256(utf8(content_topic) || payload)."""
    return hashlib.sha256(message.content_topic.encode() + message.payload).digest()


def validate_v2(
    *,
    pubsub_topic: str | None,
    content_topics: list[str],
    start_time: int | None,
    end_time: int | None,
    cursor: Cursor | None,
    page_size: int | None,
    forward: bool,
) -> HistoryQuery:
    """Build a legacy query or raise :class:`StoreError` with 400.

    ``end_time`` is inclusive on the wire and becomes the exclusive
    ``time_end = end_time + 1`` of :class:`HistoryQuery` (no bound when it is
    the largest sint64). A start after the end is not an error: the page is
    empty, as in nwaku. The query's ``cursor`` is the Index digest and
    ``cursor_timestamp`` its receiver_time.
    """

    def bad(text: str) -> StoreError:
        return StoreError(StatusCode.BAD_REQUEST, f"BAD_REQUEST: {text}")

    if pubsub_topic is not None and len(pubsub_topic) > MAX_TOPIC_LENGTH:
        raise bad("pubsub topic too long")
    if any(len(t) > MAX_TOPIC_LENGTH for t in content_topics):
        raise bad("content topic too long")
    if len(content_topics) > MAX_CONTENT_TOPICS:
        raise bad(f"too many content topics: {len(content_topics)} > {MAX_CONTENT_TOPICS}")
    if cursor is not None:
        if len(cursor.digest) != HASH_SIZE:
            raise bad("invalid cursor: digest must be 32 bytes")
        if cursor.digest == bytes(HASH_SIZE):
            raise bad("invalid cursor: empty digest")
        if not cursor.pubsub_topic:
            raise bad("invalid cursor: empty pubsubTopic")
        if cursor.sender_time == 0:
            raise bad("invalid cursor: invalid senderTime")
        if cursor.receiver_time == 0:
            raise bad("invalid cursor: invalid storeTime")
    time_end = None
    if end_time is not None and end_time < _INT64_MAX:
        time_end = end_time + 1
    return HistoryQuery(
        pubsub_topic=pubsub_topic,
        content_topics=tuple(dict.fromkeys(content_topics)),
        time_start=start_time,
        time_end=time_end,
        cursor=cursor.digest if cursor is not None else None,
        cursor_timestamp=cursor.receiver_time if cursor is not None else None,
        forward=forward,
        limit=clamp_limit(page_size),
        include_data=True,
        ordering=Ordering.DIGEST,
    )


def decode_request(raw: bytes) -> tuple[str, HistoryQuery]:
    """Decode and validate a HistoryRPC carrying a query.

    Raises :class:`StoreError` (400, answer with INVALID_CURSOR via
    :func:`encode_error`) for undecodable bytes, a HistoryRPC without a
    query, or an invalid query. Its ``request_id`` is the request's id when
    the bytes decoded, ``""`` otherwise.
    """
    rpc = parse_protobuf(store_legacy_pb2.HistoryRPC, raw)
    if rpc is None:
        raise StoreError(StatusCode.BAD_REQUEST, "BAD_REQUEST: undecodable HistoryRPC")
    if not rpc.HasField("query"):
        raise StoreError(StatusCode.BAD_REQUEST, "BAD_REQUEST: empty query", rpc.request_id)
    query = rpc.query
    paging = query.paging_info
    cursor = None
    if paging.HasField("cursor"):
        index = paging.cursor
        cursor = Cursor(
            digest=index.digest,
            receiver_time=index.receiver_time,
            sender_time=index.sender_time,
            pubsub_topic=index.pubsub_topic,
        )
    try:
        if paging.direction not in (_BACKWARD, _FORWARD):
            raise StoreError(StatusCode.BAD_REQUEST, f"BAD_REQUEST: unknown direction {paging.direction}")
        history_query = validate_v2(
            pubsub_topic=query.pubsub_topic if query.HasField("pubsub_topic") else None,
            content_topics=[f.content_topic for f in query.content_filters],
            start_time=query.start_time if query.HasField("start_time") else None,
            end_time=query.end_time if query.HasField("end_time") else None,
            cursor=cursor,
            page_size=paging.page_size,
            forward=paging.direction == _FORWARD,
        )
    except StoreError as exc:
        exc.request_id = rpc.request_id
        raise
    return rpc.request_id, history_query


def error_for_status(status_code: int) -> HistoryError:
    """The legacy error for a Store status code, as nwaku maps it."""
    if status_code == StatusCode.OK:
        return HistoryError.NONE
    if status_code == StatusCode.TOO_MANY_REQUESTS:
        return HistoryError.TOO_MANY_REQUESTS
    if status_code == StatusCode.SERVICE_UNAVAILABLE:
        return HistoryError.SERVICE_UNAVAILABLE
    return HistoryError.INVALID_CURSOR


def encode_response(
    request_id: str,
    page: Page | None,
    error: HistoryError = HistoryError.NONE,
    *,
    forward: bool = False,
) -> bytes:
    """Encode a HistoryRPC response.

    With a page: its messages (rows without a message are skipped), and
    paging info holding page_size = the number of messages returned, the
    query's direction, and the next cursor Index when there is one. Without
    a page (an error answer) there is no paging info. ``error`` and
    ``request_id`` are always written, NONE and "" included, as nwaku's
    decoder requires them.
    """
    rpc = store_legacy_pb2.HistoryRPC(request_id=request_id)
    response = rpc.response  # built in place: no copy into the RPC
    response.error = cast(store_legacy_pb2.HistoryResponse.Error, int(error))
    if page is None:
        return with_request_id(rpc.SerializeToString(), request_id)
    columns = page.messages if isinstance(page.messages, MessageColumns) else None
    encoded = b""
    if columns is None:
        for stored in page.messages:
            if stored.message is not None:
                write_message_pb(response.messages.add(), stored.message)
        count = len(response.messages)
    elif columns.data is not None:
        encoded = columns.encode(V2_MESSAGES)
        count = len(columns)
    else:
        count = 0
    paging = response.paging_info
    paging.page_size = count
    paging.direction = _FORWARD if forward else _BACKWARD
    if page.next_cursor is not None:
        _write_index(paging.cursor, page.next_cursor)
    if columns is None:
        return with_request_id(rpc.SerializeToString(), request_id)
    # Rows held in columns: the response's fields in number order, as the
    # runtime writes them (messages 2, paging_info 3, error 4), inside the
    # RPC's field 3 after its request_id (1).
    body = encoded + response.SerializeToString()
    head = store_legacy_pb2.HistoryRPC(request_id=request_id).SerializeToString()
    return with_request_id(head + b"\x1a" + encode_uvarint(len(body)) + body, request_id)


def encode_error(error: StoreError) -> bytes:
    """The answer to a request :func:`decode_request` refused or a failed query."""
    return encode_response(error.request_id, None, error_for_status(error.status_code))


def encode_request(
    request_id: str,
    *,
    pubsub_topic: str | None = None,
    content_topics: tuple[str, ...] | list[str] = (),
    start_time: int | None = None,
    end_time: int | None = None,
    cursor: Cursor | None = None,
    page_size: int = DEFAULT_PAGE_SIZE,
    forward: bool = False,
) -> bytes:
    """Encode a HistoryRPC query (client side), without validation.

    Times are Unix nanoseconds, both bounds inclusive.
    """
    rpc = store_legacy_pb2.HistoryRPC(request_id=request_id)
    query = rpc.query
    if pubsub_topic is not None:
        query.pubsub_topic = pubsub_topic
    for topic in content_topics:
        query.content_filters.add(content_topic=topic)
    if start_time is not None:
        query.start_time = start_time
    if end_time is not None:
        query.end_time = end_time
    query.paging_info.page_size = page_size
    query.paging_info.direction = _FORWARD if forward else _BACKWARD
    if cursor is not None:
        index = query.paging_info.cursor
        index.digest = cursor.digest
        index.receiver_time = cursor.receiver_time
        index.sender_time = cursor.sender_time
        index.pubsub_topic = cursor.pubsub_topic
    return with_request_id(rpc.SerializeToString(), request_id)


@dataclass(frozen=True, slots=True)
class HistoryResult:
    """A decoded HistoryRPC response (client side).

    ``page_size`` and ``forward`` are None when the server did not echo them
    (nwaku sends only the cursor).
    """

    request_id: str
    error: HistoryError
    messages: list[WakuMessage] = field(default_factory=list)
    cursor: Cursor | None = None
    page_size: int | None = None
    forward: bool | None = None


def decode_response(raw: bytes) -> HistoryResult:
    """Decode a HistoryRPC response.

    Raises :class:`StoreError` with 300 (BAD_RESPONSE) for undecodable bytes,
    a HistoryRPC without a response, a cursor digest that is not 32 bytes or
    a message over the 1 MiB cap. An absent error reads as NONE; an unknown
    error value reads as INVALID_CURSOR, as in nwaku.
    """
    rpc = parse_protobuf(store_legacy_pb2.HistoryRPC, raw)
    if rpc is None:
        raise _bad_response("undecodable HistoryRPC")
    if not rpc.HasField("response"):
        raise _bad_response("HistoryRPC has no response")
    response = rpc.response
    messages = []
    for pb in response.messages:
        if nested_message_size(pb) > MAX_ENCODED_MESSAGE_SIZE:
            raise _bad_response("embedded message over the size cap")
        messages.append(message_from_pb(pb))
    try:
        error = HistoryError(response.error)
    except ValueError:
        error = HistoryError.INVALID_CURSOR
    cursor = page_size = forward = None
    if response.HasField("paging_info"):
        paging = response.paging_info
        if paging.HasField("cursor"):
            index = paging.cursor
            if len(index.digest) != HASH_SIZE:
                raise _bad_response(f"cursor digest is {len(index.digest)} bytes, not {HASH_SIZE}")
            cursor = Cursor(index.digest, index.receiver_time, index.sender_time, index.pubsub_topic)
        if paging.HasField("page_size"):
            page_size = paging.page_size
        if paging.HasField("direction"):
            forward = paging.direction == _FORWARD
    return HistoryResult(
        request_id=rpc.request_id,
        error=error,
        messages=messages,
        cursor=cursor,
        page_size=page_size,
        forward=forward,
    )


def _write_index(index: store_legacy_pb2.Index, stored: StoredMessage) -> None:
    """The Index a client echoes to continue after ``stored``.

    receiver_time is the ordering timestamp the next query compares;
    sender_time is the message's own timestamp, or the ordering timestamp
    when the message has none (nwaku refuses a cursor with sender_time 0).
    """
    message = stored.message
    index.digest = stored.digest or (digest(message) if message is not None else b"")
    index.receiver_time = stored.timestamp
    index.sender_time = (message.timestamp if message is not None else 0) or stored.timestamp
    index.pubsub_topic = stored.pubsub_topic


def _bad_response(text: str) -> StoreError:
    return StoreError(StatusCode.BAD_RESPONSE, f"BAD_RESPONSE: {text}")
