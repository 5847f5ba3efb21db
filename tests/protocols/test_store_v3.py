import pytest
from hypothesis import given
from hypothesis import strategies as st

from wakustore.protocols.errors import StoreError
from wakustore.protocols.message import WakuMessage, message_hash
from wakustore.protocols.store_query import HistoryQuery, Page, StatusCode, StoredMessage
from wakustore.protocols.store_v3 import (
    PROTOCOL_ID,
    ResponseEntry,
    StoreResponse,
    decode_request,
    decode_response,
    encode_error,
    encode_request,
    encode_response,
)
from wakustore.protos import store_v3_pb2

PUBSUB = "/waku/2/rs/0/0"
CONTENT = "/app/1/chat/proto"
HASH = bytes(range(32))

# Hand-assembled StoreQueryRequest:
#   0a 01 'q'            request_id = "q"
#   10 01                include_data = true
#   52 02 '/p'           pubsub_topic (10) = "/p"
#   5a 02 '/c'           content_topics (11) = ["/c"]
#   60 14                time_start (12) = zigzag(10)
#   68 28                time_end (13) = zigzag(20)
#   9a 03 20 11*32       pagination_cursor (51)
#   a0 03 01             pagination_forward (52) = true
#   a8 03 05             pagination_limit (53) = 5
HAND_ASSEMBLED = bytes.fromhex("0a0171100152022f705a022f63601468289a0320" + "11" * 32 + "a00301a80305")
HAND_ASSEMBLED_QUERY = HistoryQuery(
    pubsub_topic="/p",
    content_topics=("/c",),
    time_start=10,
    time_end=20,
    cursor=b"\x11" * 32,
    forward=True,
    limit=5,
    include_data=True,
)


def _request(**fields) -> bytes:
    fields.setdefault("request_id", "req-1")
    return store_v3_pb2.StoreQueryRequest(**fields).SerializeToString()


def _bad_request(raw: bytes) -> StoreError:
    with pytest.raises(StoreError) as info:
        decode_request(raw)
    assert info.value.status_code == StatusCode.BAD_REQUEST == 400
    assert info.value.description.startswith("BAD_REQUEST: ")
    return info.value


def _stored(n: int, *, with_message: bool = True) -> StoredMessage:
    message = WakuMessage(payload=bytes([n]), content_topic=CONTENT, timestamp=1000 + n)
    return StoredMessage(
        message_hash=message_hash(PUBSUB, message),
        pubsub_topic=PUBSUB,
        message=message if with_message else None,
        timestamp=1000 + n,
    )


def test_protocol_id():
    assert PROTOCOL_ID == "/vac/waku/store-query/3.0.0"


def test_hand_assembled_request_decodes():
    assert decode_request(HAND_ASSEMBLED) == ("q", HAND_ASSEMBLED_QUERY)


def test_encode_request_writes_the_hand_assembled_bytes():
    assert encode_request("q", HAND_ASSEMBLED_QUERY) == HAND_ASSEMBLED


def test_content_topics_without_pubsub_topic_is_400_and_keeps_request_id():
    error = _bad_request(_request(request_id="abc", content_topics=[CONTENT]))
    assert error.request_id == "abc"


def test_pubsub_topic_without_content_topics_is_400():
    _bad_request(_request(pubsub_topic=PUBSUB))


def test_more_than_10_content_topics_is_400():
    _bad_request(_request(pubsub_topic=PUBSUB, content_topics=[f"/a/1/{i}/p" for i in range(11)]))


def test_more_than_100_hashes_is_400():
    hashes = [i.to_bytes(32, "big") for i in range(1, 102)]
    _bad_request(_request(message_hashes=hashes))


def test_100_hashes_are_accepted():
    hashes = [i.to_bytes(32, "big") for i in range(1, 101)]
    _, query = decode_request(_request(message_hashes=hashes))
    assert len(query.message_hashes) == 100


@pytest.mark.parametrize("bound", [{"time_start": 1}, {"time_end": 1}])
def test_hashes_with_time_bounds_is_400(bound):
    _bad_request(_request(message_hashes=[HASH], **bound))


def test_hashes_with_content_topics_is_400():
    _bad_request(_request(message_hashes=[HASH], pubsub_topic=PUBSUB, content_topics=[CONTENT]))


def test_hash_of_wrong_length_is_400():
    _bad_request(_request(message_hashes=[HASH[:31]]))


def test_all_zero_cursor_is_400():
    _bad_request(_request(pagination_cursor=bytes(32)))


def test_31_byte_cursor_is_400():
    _bad_request(_request(pagination_cursor=HASH[:31]))


def test_time_start_after_time_end_is_400():
    _bad_request(_request(time_start=5, time_end=4))


def test_undecodable_request_is_400_with_empty_request_id():
    error = _bad_request(b"\xff\xff\xff")
    assert error.request_id == ""


@pytest.mark.parametrize(("limit", "expected"), [(None, 20), (0, 20), (1, 1), (100, 100), (1000, 100)])
def test_limit_defaults_to_20_and_clamps_to_100(limit, expected):
    fields = {} if limit is None else {"pagination_limit": limit}
    _, query = decode_request(_request(**fields))
    assert query.limit == expected


def test_unset_direction_is_backward():
    _, query = decode_request(_request())
    assert query.forward is False


def test_direction_written_as_zero_is_backward_and_one_is_forward():
    base = _request()
    assert decode_request(base + bytes.fromhex("a00300"))[1].forward is False
    assert decode_request(base + bytes.fromhex("a00301"))[1].forward is True


def test_js_waku_pubsub_topic_with_hashes_is_accepted():
    _, query = decode_request(_request(pubsub_topic=PUBSUB, message_hashes=[HASH]))
    assert query.pubsub_topic == PUBSUB
    assert query.message_hashes == (HASH,)


def test_empty_query_means_all_messages():
    request_id, query = decode_request(_request(include_data=True))
    assert request_id == "req-1"
    assert query.pubsub_topic is None and query.content_topics == () and query.include_data


def test_response_always_carries_request_id_status_code_and_status_desc():
    raw = encode_response("", None, StatusCode.BAD_REQUEST, "")
    # 0a 00 request_id "" | 50 90 03 status_code 400 | 5a 00 status_desc ""
    assert sorted([raw[:2], raw[2:5], raw[5:]]) == sorted(
        [bytes.fromhex("0a00"), bytes.fromhex("509003"), bytes.fromhex("5a00")]
    )
    assert decode_response(raw) == StoreResponse("", 400, "")


def test_ok_response_says_ok():
    response = decode_response(encode_response("r", Page()))
    assert (response.status_code, response.status_desc) == (200, "OK")


def test_response_entries_carry_data_and_the_next_cursor():
    page = Page(messages=[_stored(1), _stored(2)], next_cursor=_stored(2))
    response = decode_response(encode_response("r", page))
    assert response.messages == [ResponseEntry(s.message_hash, PUBSUB, s.message) for s in (_stored(1), _stored(2))]
    assert response.cursor == _stored(2).message_hash


def test_hashes_only_response_has_no_message_and_no_topic():
    page = Page(messages=[_stored(1)])
    for response in (
        decode_response(encode_response("r", page, include_data=False)),
        decode_response(encode_response("r", Page(messages=[_stored(1, with_message=False)]))),
    ):
        assert response.messages == [ResponseEntry(_stored(1).message_hash, None, None)]
        assert response.cursor is None


def test_encode_error_answers_with_the_error():
    error = _bad_request(_request(request_id="x", content_topics=[CONTENT]))
    response = decode_response(encode_error(error))
    assert (response.request_id, response.status_code) == ("x", 400)
    assert response.status_desc.startswith("BAD_REQUEST: ")


def test_response_without_status_code_is_bad_response():
    raw = store_v3_pb2.StoreQueryResponse(request_id="r", status_desc="OK").SerializeToString()
    with pytest.raises(StoreError) as info:
        decode_response(raw)
    assert info.value.status_code == StatusCode.BAD_RESPONSE


@pytest.mark.parametrize("field", ["hash", "cursor"])
def test_response_with_short_hash_is_bad_response(field):
    pb = store_v3_pb2.StoreQueryResponse(request_id="r", status_code=200, status_desc="OK")
    if field == "hash":
        pb.messages.add(message_hash=HASH[:31])
    else:
        pb.pagination_cursor = HASH[:31]
    with pytest.raises(StoreError):
        decode_response(pb.SerializeToString())


def test_message_without_pubsub_topic_is_dropped_like_nwaku():
    pb = store_v3_pb2.StoreQueryResponse(request_id="r", status_code=200, status_desc="OK")
    entry = pb.messages.add(message_hash=HASH)
    entry.message.content_topic = CONTENT
    assert decode_response(pb.SerializeToString()).messages == [ResponseEntry(HASH, None, None)]


hashes = st.binary(min_size=32, max_size=32).filter(any)
topics = st.text(min_size=1, max_size=30)


@st.composite
def valid_queries(draw):
    forward = draw(st.booleans())
    limit = draw(st.integers(1, 100))
    include_data = draw(st.booleans())
    cursor = draw(st.none() | hashes)
    if draw(st.booleans()):
        return HistoryQuery(
            pubsub_topic=draw(st.none() | topics),
            message_hashes=tuple(draw(st.lists(hashes, min_size=1, max_size=5, unique=True))),
            cursor=cursor,
            forward=forward,
            limit=limit,
            include_data=include_data,
        )
    has_filter = draw(st.booleans())
    start = draw(st.none() | st.integers(-(2**63), 2**63 - 1))
    end = draw(st.none() | st.integers(start if start is not None else -(2**63), 2**63 - 1))
    return HistoryQuery(
        pubsub_topic=draw(topics) if has_filter else None,
        content_topics=tuple(draw(st.lists(topics, min_size=1, max_size=10, unique=True))) if has_filter else (),
        time_start=start,
        time_end=end,
        cursor=cursor,
        forward=forward,
        limit=limit,
        include_data=include_data,
    )


@given(st.text(max_size=20), valid_queries())
def test_request_round_trip(request_id, query):
    assert decode_request(encode_request(request_id, query)) == (request_id, query)


@st.composite
def pages(draw):
    stored = [
        StoredMessage(
            message_hash=draw(hashes),
            pubsub_topic=draw(topics),
            message=draw(
                st.none()
                | st.builds(
                    WakuMessage,
                    payload=st.binary(max_size=20),
                    content_topic=st.text(max_size=10),
                    timestamp=st.integers(-(2**63), 2**63 - 1),
                    meta=st.binary(max_size=10),
                )
            ),
            timestamp=0,
        )
        for _ in range(draw(st.integers(0, 4)))
    ]
    next_cursor = draw(st.none() | st.sampled_from(stored)) if stored else None
    return Page(messages=stored, next_cursor=next_cursor)


@given(st.text(max_size=20), pages(), st.integers(0, 2**32 - 1), st.text(max_size=20))
def test_response_round_trip(request_id, page, status_code, status_desc):
    response = decode_response(encode_response(request_id, page, status_code, status_desc))
    assert response == StoreResponse(
        request_id=request_id,
        status_code=status_code,
        status_desc=status_desc,
        messages=[
            ResponseEntry(s.message_hash, s.pubsub_topic if s.message else None, s.message) for s in page.messages
        ],
        cursor=page.next_cursor.message_hash if page.next_cursor else None,
    )


@given(st.binary(max_size=200))
def test_garbage_raises_only_store_error(raw):
    for decode in (decode_request, decode_response):
        try:
            decode(raw)
        except StoreError:
            pass


@given(st.text(max_size=10), valid_queries(), pages(), st.data())
def test_truncated_messages_raise_only_store_error(request_id, query, page, data):
    for raw, decode in (
        (encode_request(request_id, query), decode_request),
        (encode_response(request_id, page), decode_response),
    ):
        cut = data.draw(st.integers(0, len(raw)))
        try:
            decode(raw[:cut])
        except StoreError:
            pass
