import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from wakustore.protocols.errors import StoreError
from wakustore.protocols.message import WakuMessage
from wakustore.protocols.store_query import HistoryQuery, Ordering, Page, StatusCode, StoredMessage
from wakustore.protocols.store_v2 import (
    PROTOCOL_ID,
    Cursor,
    HistoryError,
    HistoryResult,
    decode_request,
    decode_response,
    digest,
    encode_error,
    encode_request,
    encode_response,
    error_for_status,
)
from wakustore.protos import store_legacy_pb2

PUBSUB = "/waku/2/default-waku/proto"
CONTENT = "/app/1/chat/proto"
GOOD_CURSOR = Cursor(digest=b"\x11" * 32, receiver_time=100, sender_time=99, pubsub_topic="/p")

# Hand-assembled HistoryRPC:
#   0a 01 'q'                           request_id = "q"
#   12 42                               query (66 bytes)
#     12 02 '/p'                          pubsub_topic = "/p"
#     1a 04 0a 02 '/c'                    content_filters = [{content_topic: "/c"}]
#     22 32                               paging_info (50 bytes)
#       08 05                               page_size = 5
#       12 2c                               cursor (44 bytes)
#         0a 20 11*32                         digest
#         10 c8 01                            receiver_time = zigzag(100)
#         18 c6 01                            sender_time = zigzag(99)
#         22 02 '/p'                          pubsub_topic
#       18 01                               direction = FORWARD
#     28 14                               start_time = zigzag(10)
#     30 28                               end_time = zigzag(20)
HAND_ASSEMBLED = bytes.fromhex(
    "0a0171124212022f701a040a022f6322320805122c0a20" + "11" * 32 + "10c80118c60122022f70180128143028"
)


def _rpc(request_id="req", **query) -> bytes:
    return store_legacy_pb2.HistoryRPC(
        request_id=request_id, query=store_legacy_pb2.HistoryQuery(**query)
    ).SerializeToString()


def _paging(**fields):
    return store_legacy_pb2.PagingInfo(**fields)


def _index(cursor: Cursor):
    return store_legacy_pb2.Index(
        digest=cursor.digest,
        receiver_time=cursor.receiver_time,
        sender_time=cursor.sender_time,
        pubsub_topic=cursor.pubsub_topic,
    )


def _refused(raw: bytes) -> StoreError:
    with pytest.raises(StoreError) as info:
        decode_request(raw)
    assert info.value.status_code == StatusCode.BAD_REQUEST
    return info.value


def test_protocol_id():
    assert PROTOCOL_ID == "/vac/waku/store/2.0.0-beta4"


def test_digest_is_sha256_of_content_topic_then_payload():
    message = WakuMessage(payload=b"\x01\x02", content_topic="/c")
    assert digest(message) == hashlib.sha256(b"/c\x01\x02").digest()


def test_hand_assembled_request_decodes():
    request_id, query = decode_request(HAND_ASSEMBLED)
    assert request_id == "q"
    assert query == HistoryQuery(
        pubsub_topic="/p",
        content_topics=("/c",),
        time_start=10,
        time_end=21,  # inclusive end 20 on the wire
        cursor=b"\x11" * 32,
        cursor_timestamp=100,  # receiver_time, what nwaku compares
        forward=True,
        limit=5,
        include_data=True,
        ordering=Ordering.DIGEST,
    )


def test_encode_request_writes_the_hand_assembled_bytes():
    raw = encode_request(
        "q",
        pubsub_topic="/p",
        content_topics=["/c"],
        start_time=10,
        end_time=20,
        cursor=GOOD_CURSOR,
        page_size=5,
        forward=True,
    )
    assert raw == HAND_ASSEMBLED


def test_largest_end_time_means_no_end_bound():
    _, query = decode_request(_rpc(end_time=2**63 - 1))
    assert query.time_end is None


def test_start_after_end_is_not_an_error():
    _, query = decode_request(_rpc(start_time=10, end_time=5))
    assert (query.time_start, query.time_end) == (10, 6)


def test_absent_paging_info_is_backward_with_20_messages():
    _, query = decode_request(_rpc())
    assert (query.forward, query.limit, query.cursor) == (False, 20, None)


@pytest.mark.parametrize(("size", "expected"), [(0, 20), (7, 7), (100, 100), (1000, 100)])
def test_page_size_defaults_to_20_and_clamps_to_100(size, expected):
    _, query = decode_request(_rpc(paging_info=_paging(page_size=size)))
    assert query.limit == expected


def test_content_topics_need_no_pubsub_topic():
    _, query = decode_request(_rpc(content_filters=[store_legacy_pb2.ContentFilter(content_topic=CONTENT)]))
    assert query.pubsub_topic is None and query.content_topics == (CONTENT,)


def test_more_than_10_content_topics_is_refused_as_invalid_cursor():
    filters = [store_legacy_pb2.ContentFilter(content_topic=f"/a/1/{i}/p") for i in range(11)]
    error = _refused(_rpc(request_id="many", content_filters=filters))
    assert error.request_id == "many"
    assert decode_response(encode_error(error)).error == HistoryError.INVALID_CURSOR


@pytest.mark.parametrize(
    "cursor",
    [
        Cursor(bytes(32), 100, 99, "/p"),
        Cursor(b"\x11" * 31, 100, 99, "/p"),
        Cursor(b"\x11" * 32, 100, 99, ""),
        Cursor(b"\x11" * 32, 100, 0, "/p"),
        Cursor(b"\x11" * 32, 0, 99, "/p"),
    ],
)
def test_bad_cursor_is_answered_invalid_cursor(cursor):
    error = _refused(_rpc(request_id="c", paging_info=_paging(cursor=_index(cursor))))
    result = decode_response(encode_error(error))
    assert (result.request_id, result.error) == ("c", HistoryError.INVALID_CURSOR)
    assert result.messages == [] and result.cursor is None


def test_unknown_direction_is_refused():
    _refused(_rpc(paging_info=_paging(direction=2)))


def test_rpc_without_query_is_refused_with_its_request_id():
    raw = store_legacy_pb2.HistoryRPC(request_id="empty").SerializeToString()
    assert _refused(raw).request_id == "empty"


def test_undecodable_request_is_refused_with_empty_request_id():
    assert _refused(b"\x0a\xff").request_id == ""


@pytest.mark.parametrize(
    ("status", "error"),
    [
        (200, HistoryError.NONE),
        (300, HistoryError.INVALID_CURSOR),
        (400, HistoryError.INVALID_CURSOR),
        (429, HistoryError.TOO_MANY_REQUESTS),
        (503, HistoryError.SERVICE_UNAVAILABLE),
        (500, HistoryError.INVALID_CURSOR),
    ],
)
def test_status_codes_map_to_legacy_errors_like_nwaku(status, error):
    assert error_for_status(status) == error


def _stored(n: int, *, timestamp: int | None = None) -> StoredMessage:
    message = WakuMessage(
        payload=bytes([n]), content_topic=CONTENT, timestamp=1000 + n if timestamp is None else timestamp
    )
    return StoredMessage(
        message_hash=bytes([n]) * 32,
        pubsub_topic=PUBSUB,
        message=message,
        timestamp=message.timestamp or 5000 + n,
        digest=digest(message),
    )


def test_response_carries_paging_info_and_next_cursor_index():
    page = Page(messages=[_stored(1), _stored(2)], next_cursor=_stored(2))
    result = decode_response(encode_response("r", page, forward=True))
    assert result == HistoryResult(
        request_id="r",
        error=HistoryError.NONE,
        messages=[_stored(1).message, _stored(2).message],
        cursor=Cursor(digest(_stored(2).message), 1002, 1002, PUBSUB),
        page_size=2,
        forward=True,
    )


def test_cursor_of_a_message_without_timestamp_uses_the_ordering_time():
    stored = _stored(3, timestamp=0)
    result = decode_response(encode_response("r", Page([stored], next_cursor=stored)))
    assert result.cursor == Cursor(stored.digest, 5003, 5003, PUBSUB)
    # and the echoed cursor is one the server accepts
    _, query = decode_request(encode_request("r2", cursor=result.cursor))
    assert (query.cursor, query.cursor_timestamp) == (stored.digest, 5003)


def test_cursor_digest_is_computed_when_the_row_has_none():
    stored = StoredMessage(b"\x01" * 32, PUBSUB, _stored(4).message, timestamp=1004)
    result = decode_response(encode_response("r", Page([stored], next_cursor=stored)))
    assert result.cursor.digest == digest(stored.message)


def test_success_writes_error_none_and_last_page_has_no_cursor():
    raw = encode_response("r", Page(messages=[_stored(1)]))
    response = store_legacy_pb2.HistoryRPC.FromString(raw).response
    assert response.HasField("error") and response.error == 0
    assert not response.paging_info.HasField("cursor")


def test_error_answer_has_no_paging_info_and_writes_empty_request_id():
    raw = encode_response("", None, HistoryError.TOO_MANY_REQUESTS)
    assert raw.startswith(bytes.fromhex("0a00"))
    rpc = store_legacy_pb2.HistoryRPC.FromString(raw)
    assert not rpc.response.HasField("paging_info")
    assert decode_response(raw).error == HistoryError.TOO_MANY_REQUESTS


def test_unknown_error_value_reads_as_invalid_cursor():
    raw = bytes.fromhex("0a0172") + bytes.fromhex("1a022007")  # response { error = 7 }
    assert decode_response(raw).error == HistoryError.INVALID_CURSOR


def test_nwaku_style_response_without_paging_echo_decodes():
    response = store_legacy_pb2.HistoryResponse(error=0)
    response.paging_info.cursor.CopyFrom(_index(GOOD_CURSOR))
    raw = store_legacy_pb2.HistoryRPC(request_id="r", response=response).SerializeToString()
    result = decode_response(raw)
    assert (result.cursor, result.page_size, result.forward) == (GOOD_CURSOR, None, None)


def test_response_with_short_cursor_digest_is_bad_response():
    response = store_legacy_pb2.HistoryResponse(error=0)
    response.paging_info.cursor.digest = b"\x01" * 31
    raw = store_legacy_pb2.HistoryRPC(request_id="r", response=response).SerializeToString()
    with pytest.raises(StoreError) as info:
        decode_response(raw)
    assert info.value.status_code == StatusCode.BAD_RESPONSE


def test_rpc_without_response_is_bad_response():
    with pytest.raises(StoreError):
        decode_response(_rpc())


topics = st.text(min_size=1, max_size=20)
sint64 = st.integers(-(2**63), 2**63 - 2)
cursors = st.builds(
    Cursor,
    digest=st.binary(min_size=32, max_size=32).filter(any),
    receiver_time=sint64.filter(bool),
    sender_time=sint64.filter(bool),
    pubsub_topic=topics,
)


@given(
    st.text(max_size=10),
    st.none() | topics,
    st.lists(topics, max_size=10, unique=True),
    st.none() | sint64,
    st.none() | sint64,
    st.none() | cursors,
    st.integers(0, 2**64 - 1),
    st.booleans(),
)
def test_request_round_trip(request_id, pubsub, contents, start, end, cursor, page_size, forward):
    raw = encode_request(
        request_id,
        pubsub_topic=pubsub,
        content_topics=contents,
        start_time=start,
        end_time=end,
        cursor=cursor,
        page_size=page_size,
        forward=forward,
    )
    got_id, query = decode_request(raw)
    assert got_id == request_id
    assert query == HistoryQuery(
        pubsub_topic=pubsub,
        content_topics=tuple(contents),
        time_start=start,
        time_end=None if end is None else end + 1,
        cursor=cursor.digest if cursor else None,
        cursor_timestamp=cursor.receiver_time if cursor else None,
        forward=forward,
        limit=min(page_size, 100) or 20,
        ordering=Ordering.DIGEST,
    )


messages = st.builds(
    WakuMessage,
    payload=st.binary(max_size=20),
    content_topic=st.text(max_size=10),
    timestamp=st.integers(1, 2**63 - 1),
    meta=st.binary(max_size=10),
)


@given(
    st.text(max_size=10),
    st.lists(messages, max_size=4),
    st.booleans(),
    st.booleans(),
    st.sampled_from(list(HistoryError)),
)
def test_response_round_trip(request_id, msgs, more, forward, error):
    stored = [StoredMessage(b"\x01" * 32, PUBSUB, m, m.timestamp, digest(m)) for m in msgs]
    next_cursor = stored[-1] if stored and more else None
    result = decode_response(encode_response(request_id, Page(stored, next_cursor), error, forward=forward))
    assert result == HistoryResult(
        request_id=request_id,
        error=error,
        messages=msgs,
        cursor=Cursor(next_cursor.digest, next_cursor.timestamp, next_cursor.timestamp, PUBSUB)
        if next_cursor
        else None,
        page_size=len(msgs),
        forward=forward,
    )


@given(st.binary(max_size=200))
def test_garbage_raises_only_store_error(raw):
    for decode in (decode_request, decode_response):
        try:
            decode(raw)
        except StoreError:
            pass


@given(st.lists(messages, max_size=3), st.data())
def test_truncated_messages_raise_only_store_error(msgs, data):
    stored = [StoredMessage(b"\x01" * 32, PUBSUB, m, m.timestamp, digest(m)) for m in msgs]
    for raw, decode in (
        (HAND_ASSEMBLED, decode_request),
        (encode_response("r", Page(stored, stored[-1] if stored else None)), decode_response),
    ):
        cut = data.draw(st.integers(0, len(raw)))
        try:
            decode(raw[:cut])
        except StoreError:
            pass
