"""13/WAKU2-STORE v3 (`/vac/waku/store-query/3.0.0`): request and response codecs.

Server side: :func:`decode_request` turns a StoreQueryRequest into the
request id and a validated :class:`HistoryQuery`; :func:`encode_response`
answers it. Client side (``wakustore query``): :func:`encode_request` and
:func:`decode_response`.

Wire behaviour follows nwaku (waku/waku_store/rpc_codec.nim, protocol.nim):
a response always carries request_id (even empty), status_code and
status_desc, because nwaku's client refuses one without any of them;
entries carry the message and its pubsub topic only together.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from wakustore.protocols.errors import StoreError
from wakustore.protocols.message import HASH_SIZE, WakuMessage
from wakustore.protocols.message_codec import (
    MAX_ENCODED_MESSAGE_SIZE,
    message_from_pb,
    nested_message_size,
    parse_protobuf,
    with_request_id,
    write_message_pb,
)
from wakustore.protocols.message_columns import V3_DATA, V3_KEYS, MessageColumns
from wakustore.protocols.store_query import (
    HistoryQuery,
    Page,
    StatusCode,
    validate_v3,
)
from wakustore.protos import store_v3_pb2

PROTOCOL_ID = "/vac/waku/store-query/3.0.0"

# status_desc of a successful answer, as nwaku writes it.
OK_DESCRIPTION = "OK"


def decode_request(raw: bytes) -> tuple[str, HistoryQuery]:
    """Decode and validate a StoreQueryRequest.

    Returns the request id and the query. Times in the query are Unix
    nanoseconds, ``time_start`` inclusive and ``time_end`` exclusive (as the
    spec says; nwaku treats the end as inclusive). An unset
    ``pagination_forward`` means backward; an unset or zero limit means 20,
    a limit above 100 is clamped.

    Raises :class:`StoreError` with 400 and a ``BAD_REQUEST: ...``
    description for an undecodable or invalid request. Its ``request_id``
    is the request's id when the bytes decoded, ``""`` otherwise.
    """
    pb = parse_protobuf(store_v3_pb2.StoreQueryRequest, raw)
    if pb is None:
        raise StoreError(StatusCode.BAD_REQUEST, "BAD_REQUEST: undecodable StoreQueryRequest")
    try:
        query = validate_v3(
            pubsub_topic=pb.pubsub_topic if pb.HasField("pubsub_topic") else None,
            content_topics=list(pb.content_topics),
            time_start=pb.time_start if pb.HasField("time_start") else None,
            time_end=pb.time_end if pb.HasField("time_end") else None,
            message_hashes=list(pb.message_hashes),
            cursor=pb.pagination_cursor if pb.HasField("pagination_cursor") else None,
            forward=pb.pagination_forward,
            limit=pb.pagination_limit if pb.HasField("pagination_limit") else None,
            include_data=pb.include_data,
        )
    except StoreError as exc:
        exc.request_id = pb.request_id
        raise
    return pb.request_id, query


def encode_response(
    request_id: str,
    page: Page | None,
    status_code: int = StatusCode.OK,
    status_desc: str = OK_DESCRIPTION,
    *,
    include_data: bool = True,
) -> bytes:
    """Encode a StoreQueryResponse.

    ``page`` is None for an error answer. Each entry carries its message hash;
    the message and its pubsub topic are added only when ``include_data`` is
    true and the stored row holds the message. The next cursor is the
    message hash of ``page.next_cursor``, absent when nothing is left.
    Messages are written in the order given (ascending, per the spec).
    """
    pb = store_v3_pb2.StoreQueryResponse(request_id=request_id, status_code=int(status_code), status_desc=status_desc)
    if page is not None and isinstance(page.messages, MessageColumns):
        # The fields in number order, as the runtime writes them: the
        # head (1, 10, 11), the entries (20), the cursor (51).
        entries = page.messages.encode(V3_DATA if include_data and page.messages.data is not None else V3_KEYS)
        tail = b""
        if page.next_cursor is not None:
            tail = store_v3_pb2.StoreQueryResponse(pagination_cursor=page.next_cursor.message_hash).SerializeToString()
        return with_request_id(pb.SerializeToString(), request_id) + entries + tail
    if page is not None:
        for stored in page.messages:
            entry = pb.messages.add(message_hash=stored.message_hash)
            if include_data and stored.message is not None:
                write_message_pb(entry.message, stored.message)
                entry.pubsub_topic = stored.pubsub_topic
        if page.next_cursor is not None:
            pb.pagination_cursor = page.next_cursor.message_hash
    return with_request_id(pb.SerializeToString(), request_id)


def encode_error(error: StoreError) -> bytes:
    """The answer to a request :func:`decode_request` refused."""
    return encode_response(error.request_id, None, error.status_code, error.description)


def encode_request(request_id: str, query: HistoryQuery) -> bytes:
    """Encode ``query`` as a StoreQueryRequest (client side).

    Written as given, without validation, so a test can send what a server
    must refuse. ``cursor_timestamp`` and ``ordering`` have no v3 field and
    are ignored; the limit is always written.
    """
    pb = store_v3_pb2.StoreQueryRequest(
        request_id=request_id,
        include_data=query.include_data,
        content_topics=query.content_topics,
        message_hashes=query.message_hashes,
        pagination_forward=query.forward,
        pagination_limit=query.limit,
    )
    if query.pubsub_topic is not None:
        pb.pubsub_topic = query.pubsub_topic
    if query.time_start is not None:
        pb.time_start = query.time_start
    if query.time_end is not None:
        pb.time_end = query.time_end
    if query.cursor is not None:
        pb.pagination_cursor = query.cursor
    return with_request_id(pb.SerializeToString(), request_id)


class ResponseEntry(NamedTuple):
    """One entry of a response: the hash, and the topic and message when sent."""

    message_hash: bytes
    pubsub_topic: str | None
    message: WakuMessage | None


@dataclass(frozen=True, slots=True)
class StoreResponse:
    """A decoded StoreQueryResponse (client side)."""

    request_id: str
    status_code: int
    status_desc: str
    messages: list[ResponseEntry] = field(default_factory=list)
    cursor: bytes | None = None


def decode_response(raw: bytes) -> StoreResponse:
    """Decode a StoreQueryResponse.

    Raises :class:`StoreError` with 300 (BAD_RESPONSE) when the bytes are not
    a response: undecodable, no status_code, a hash or cursor that is not
    32 bytes, or an embedded message over the 1 MiB cap. A missing
    status_desc reads as ``""``. As in nwaku, an entry's message is kept
    only when its pubsub topic came with it.
    """
    pb = parse_protobuf(store_v3_pb2.StoreQueryResponse, raw)
    if pb is None:
        raise _bad_response("undecodable StoreQueryResponse")
    if not pb.HasField("status_code"):
        raise _bad_response("response has no status_code")
    entries = [_decode_entry(entry) for entry in pb.messages]
    cursor = None
    if pb.HasField("pagination_cursor"):
        cursor = pb.pagination_cursor
        if len(cursor) != HASH_SIZE:
            raise _bad_response(f"cursor is {len(cursor)} bytes, not {HASH_SIZE}")
    return StoreResponse(
        request_id=pb.request_id,
        status_code=pb.status_code,
        status_desc=pb.status_desc,
        messages=entries,
        cursor=cursor,
    )


def _decode_entry(entry: store_v3_pb2.WakuMessageKeyValue) -> ResponseEntry:
    if len(entry.message_hash) != HASH_SIZE:
        raise _bad_response(f"message hash is {len(entry.message_hash)} bytes, not {HASH_SIZE}")
    topic = entry.pubsub_topic if entry.HasField("pubsub_topic") else None
    message = None
    if entry.HasField("message") and topic is not None:
        if nested_message_size(entry.message) > MAX_ENCODED_MESSAGE_SIZE:
            raise _bad_response("embedded message over the size cap")
        message = message_from_pb(entry.message)
    return ResponseEntry(entry.message_hash, topic, message)


def _bad_response(text: str) -> StoreError:
    return StoreError(StatusCode.BAD_RESPONSE, f"BAD_RESPONSE: {text}")
