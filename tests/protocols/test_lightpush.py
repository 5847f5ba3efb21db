import pytest
from hypothesis import given
from hypothesis import strategies as st

from wakustore.protocols.errors import LightpushError
from wakustore.protocols.lightpush import (
    PROTOCOL_ID_V2,
    PROTOCOL_ID_V3,
    LightpushStatus,
    PushRequest,
    PushResponseV2,
    PushResponseV3,
    decode_request_v2,
    decode_request_v3,
    decode_response_v2,
    decode_response_v3,
    encode_error_v2,
    encode_error_v3,
    encode_request_v2,
    encode_request_v3,
    encode_response_v2,
    encode_response_v3,
)
from wakustore.protocols.message import WakuMessage
from wakustore.protocols.message_codec import MAX_ENCODED_MESSAGE_SIZE, encode_message
from wakustore.protos import lightpush_legacy_pb2, lightpush_v3_pb2, waku_message_pb2

MESSAGE = WakuMessage(payload=b"x", content_topic="/c")
# nwaku-style encoding of MESSAGE (every field written), 19 bytes.
MESSAGE_BYTES = bytes.fromhex("0a017812022f63180050005a00aa0100f80100")

# Hand-assembled LightpushRequest:
#   0a 01 'q'          request_id = "q"
#   a2 01 02 '/p'      pubsub_topic (20) = "/p"
#   aa 01 13 <19>      message (21)
V3_REQUEST = bytes.fromhex("0a0171a201022f70aa0113") + MESSAGE_BYTES

# Hand-assembled PushRPC:
#   0a 01 'q'          request_id = "q"
#   12 19              request (25 bytes)
#     0a 02 '/p'         pubsub_topic = "/p"
#     12 13 <19>         message
V2_REQUEST = bytes.fromhex("0a017112190a022f701213") + MESSAGE_BYTES


def _refused(decode, raw: bytes, status: int = 400) -> LightpushError:
    with pytest.raises(LightpushError) as info:
        decode(raw)
    assert info.value.status_code == status
    return info.value


def test_protocol_ids():
    assert PROTOCOL_ID_V2 == "/vac/waku/lightpush/2.0.0-beta1"
    assert PROTOCOL_ID_V3 == "/vac/waku/lightpush/3.0.0"


def test_status_codes_match_nwaku():
    assert {s.name: s.value for s in LightpushStatus} == {
        "SUCCESS": 200,
        "BAD_REQUEST": 400,
        "PAYLOAD_TOO_LARGE": 413,
        "INVALID_MESSAGE": 420,
        "UNSUPPORTED_PUBSUB_TOPIC": 421,
        "TOO_MANY_REQUESTS": 429,
        "INTERNAL_SERVER_ERROR": 500,
        "SERVICE_NOT_AVAILABLE": 503,
        "OUT_OF_RLN_PROOF": 504,
        "NO_PEERS_TO_RELAY": 505,
    }


def test_hand_assembled_v3_request_decodes_and_encodes():
    assert decode_request_v3(V3_REQUEST) == PushRequest("q", "/p", MESSAGE, 19)
    assert encode_request_v3("q", "/p", MESSAGE) == V3_REQUEST


def test_hand_assembled_v2_request_decodes_and_encodes():
    assert decode_request_v2(V2_REQUEST) == PushRequest("q", "/p", MESSAGE, 19)
    assert encode_request_v2("q", "/p", MESSAGE) == V2_REQUEST


def test_encoded_size_is_the_size_received_for_a_minimal_message():
    # js-waku writes only the fields it has: payload and content topic, 7 bytes.
    raw = bytes.fromhex("0a0171aa01070a017812022f63")
    assert decode_request_v3(raw) == PushRequest("q", None, MESSAGE, 7)


def test_v3_without_pubsub_topic_returns_none():
    assert decode_request_v3(encode_request_v3("r", None, MESSAGE)).pubsub_topic is None


@pytest.mark.parametrize("topic", ["", "  "])
def test_v3_blank_pubsub_topic_is_400_with_request_id(topic):
    error = _refused(decode_request_v3, encode_request_v3("r", topic, MESSAGE))
    assert error.request_id == "r"


def test_v3_without_message_is_400():
    raw = lightpush_v3_pb2.LightpushRequest(request_id="r", pubsub_topic="/p").SerializeToString()
    assert _refused(decode_request_v3, raw).request_id == "r"


def test_v3_undecodable_is_400_with_unknown_request_id():
    assert _refused(decode_request_v3, b"\xff\x01").request_id == "N/A"


def test_v3_over_long_topic_is_400():
    _refused(decode_request_v3, encode_request_v3("r", "/" * 2000, MESSAGE))


def test_message_over_the_hard_cap_is_413():
    big = waku_message_pb2.WakuMessage(payload=b"\0" * MAX_ENCODED_MESSAGE_SIZE, content_topic="/c")
    v3 = lightpush_v3_pb2.LightpushRequest(request_id="big", message=big).SerializeToString()
    assert _refused(decode_request_v3, v3, 413).request_id == "big"
    v2 = lightpush_legacy_pb2.PushRPC(
        request_id="big", request=lightpush_legacy_pb2.PushRequest(pubsub_topic="/p", message=big)
    ).SerializeToString()
    _refused(decode_request_v2, v2, 413)


def test_v2_requires_a_pubsub_topic():
    _refused(decode_request_v2, encode_request_v2("r", "", MESSAGE))


def test_v2_without_request_is_400_with_request_id():
    raw = lightpush_legacy_pb2.PushRPC(request_id="r").SerializeToString()
    assert _refused(decode_request_v2, raw).request_id == "r"


def test_v2_without_message_is_400():
    raw = lightpush_legacy_pb2.PushRPC(
        request_id="r", request=lightpush_legacy_pb2.PushRequest(pubsub_topic="/p")
    ).SerializeToString()
    _refused(decode_request_v2, raw)


def test_v2_undecodable_is_400_with_empty_request_id():
    assert _refused(decode_request_v2, b"\x0a\x05ab").request_id == ""


def test_v2_refusal_writes_is_success_false():
    raw = encode_response_v2("r", False, "bad")
    # 0a 01 'r' | 1a 07 (08 00 | 12 03 'bad')
    assert raw == bytes.fromhex("0a01721a0708001203") + b"bad"
    assert decode_response_v2(raw) == PushResponseV2("r", False, "bad")


def test_v3_success_response():
    raw = encode_response_v3("r", LightpushStatus.SUCCESS, relay_peer_count=3)
    assert decode_response_v3(raw) == PushResponseV3("r", 200, None, 3)


def test_error_answers_carry_request_id_status_and_description():
    error = _refused(decode_request_v3, encode_request_v3("r", "", MESSAGE))
    assert decode_response_v3(encode_error_v3(error)) == PushResponseV3("r", 400, error.description, None)
    error = _refused(decode_request_v2, b"\x0a\x05ab")
    raw = encode_error_v2(error)
    assert raw.startswith(bytes.fromhex("0a00"))  # empty request_id still written
    assert decode_response_v2(raw) == PushResponseV2("", False, error.description)


def test_malformed_responses_raise_lightpush_error():
    with pytest.raises(LightpushError):
        decode_response_v2(lightpush_legacy_pb2.PushRPC(request_id="r").SerializeToString())
    with pytest.raises(LightpushError):
        decode_response_v3(b"\xff")


messages = st.builds(
    WakuMessage,
    payload=st.binary(max_size=40),
    content_topic=st.text(max_size=20),
    version=st.integers(0, 2**32 - 1),
    timestamp=st.integers(-(2**63), 2**63 - 1),
    meta=st.binary(max_size=70),
    ephemeral=st.booleans(),
    rate_limit_proof=st.binary(max_size=10),
)
topics = st.text(min_size=1, max_size=30).filter(str.strip)


@given(st.text(max_size=10), st.none() | topics, messages)
def test_v3_request_round_trip(request_id, topic, message):
    decoded = decode_request_v3(encode_request_v3(request_id, topic, message))
    assert decoded == PushRequest(request_id, topic, message, len(encode_message(message)))


@given(st.text(max_size=10), topics, messages)
def test_v2_request_round_trip(request_id, topic, message):
    decoded = decode_request_v2(encode_request_v2(request_id, topic, message))
    assert decoded == PushRequest(request_id, topic, message, len(encode_message(message)))


@given(st.text(max_size=10), st.booleans(), st.none() | st.text(max_size=20))
def test_v2_response_round_trip(request_id, is_success, info):
    assert decode_response_v2(encode_response_v2(request_id, is_success, info)) == PushResponseV2(
        request_id, is_success, info
    )


@given(
    st.text(max_size=10),
    st.integers(1, 2**32 - 1),
    st.none() | st.text(max_size=20),
    st.none() | st.integers(0, 2**32 - 1),
)
def test_v3_response_round_trip(request_id, status, desc, peers):
    assert decode_response_v3(encode_response_v3(request_id, status, desc, peers)) == PushResponseV3(
        request_id, status, desc, peers
    )


DECODERS = (decode_request_v2, decode_request_v3, decode_response_v2, decode_response_v3)


@given(st.binary(max_size=200))
def test_garbage_raises_only_lightpush_error(raw):
    for decode in DECODERS:
        try:
            decode(raw)
        except LightpushError:
            pass


@given(st.text(max_size=10), topics, messages, st.data())
def test_truncated_messages_raise_only_lightpush_error(request_id, topic, message, data):
    for raw, decode in (
        (encode_request_v2(request_id, topic, message), decode_request_v2),
        (encode_request_v3(request_id, topic, message), decode_request_v3),
        (encode_response_v2(request_id, True, topic), decode_response_v2),
        (encode_response_v3(request_id, 200, topic, 1), decode_response_v3),
    ):
        cut = data.draw(st.integers(0, len(raw)))
        try:
            decode(raw[:cut])
        except LightpushError:
            pass
