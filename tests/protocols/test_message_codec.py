import pytest
from hypothesis import given
from hypothesis import strategies as st

from wakustore.protocols.errors import MessageError
from wakustore.protocols.message import WakuMessage
from wakustore.protocols.message_codec import (
    MAX_ENCODED_MESSAGE_SIZE,
    decode_message,
    encode_message,
    message_from_pb,
    message_to_pb,
    with_request_id,
)

messages = st.builds(
    WakuMessage,
    payload=st.binary(max_size=64),
    content_topic=st.text(max_size=20),
    version=st.integers(0, 2**32 - 1),
    timestamp=st.integers(-(2**63), 2**63 - 1),
    meta=st.binary(max_size=80),
    ephemeral=st.booleans(),
    rate_limit_proof=st.binary(max_size=16),
)


@given(messages)
def test_encode_then_decode_returns_the_same_message(message):
    assert decode_message(encode_message(message)) == message


@given(messages)
def test_pb_conversion_round_trips(message):
    assert message_from_pb(message_to_pb(message)) == message


def test_encoding_writes_every_field_like_nwaku():
    # Hand-assembled: 0a 01 'x' | 12 02 '/c' | 18 00 | 50 00 | 5a 00 | aa 01 00 | f8 01 00
    expected = bytes.fromhex("0a017812022f63180050005a00aa0100f80100")
    assert encode_message(WakuMessage(payload=b"x", content_topic="/c")) == expected


def test_timestamp_is_zigzag_sint64():
    # timestamp -1 zigzags to 1: 50 01
    encoded = encode_message(WakuMessage(payload=b"", content_topic="", timestamp=-1))
    assert bytes.fromhex("5001") in encoded
    assert decode_message(encoded).timestamp == -1


def test_absent_payload_and_content_topic_decode_as_empty():
    # js-waku omits an empty payload; only field 2 is present.
    message = decode_message(bytes.fromhex("12022f63"))
    assert message == WakuMessage(payload=b"", content_topic="/c")


def test_decoding_accepts_meta_over_64_bytes():
    encoded = encode_message(WakuMessage(payload=b"", content_topic="/c", meta=b"m" * 100))
    assert decode_message(encoded).meta == b"m" * 100


def test_unknown_fields_are_ignored():
    # field 99, varint 7
    raw = bytes.fromhex("12022f63") + bytes.fromhex("981807")
    assert decode_message(raw).content_topic == "/c"


def test_rate_limit_proof_sub_message_reads_as_bytes():
    proof = bytes.fromhex("0a0201021202ffee")  # a js-waku RateLimitProof with two fields
    raw = bytes.fromhex("12022f63") + bytes.fromhex("aa01") + bytes([len(proof)]) + proof
    assert decode_message(raw).rate_limit_proof == proof


def test_message_over_hard_cap_is_refused():
    raw = encode_message(WakuMessage(payload=b"\0" * MAX_ENCODED_MESSAGE_SIZE, content_topic="/c"))
    with pytest.raises(MessageError, match="hard limit"):
        decode_message(raw)


def test_invalid_utf8_content_topic_is_refused():
    with pytest.raises(MessageError):
        decode_message(bytes.fromhex("1202fffe"))


@pytest.mark.parametrize(
    "message",
    [
        WakuMessage(payload=b"", content_topic="/c", timestamp=2**63),
        WakuMessage(payload=b"", content_topic="/c", version=2**32),
        WakuMessage(payload=b"", content_topic="/c", version=-1),
    ],
)
def test_values_that_do_not_fit_the_wire_raise_message_error(message):
    with pytest.raises(MessageError):
        encode_message(message)


def test_empty_request_id_is_written_explicitly():
    assert with_request_id(b"\x10\x01", "") == b"\x0a\x00\x10\x01"
    assert with_request_id(b"\x0a\x01a", "a") == b"\x0a\x01a"


@given(st.binary(max_size=200))
def test_garbage_raises_only_message_error(raw):
    try:
        assert isinstance(decode_message(raw), WakuMessage)
    except MessageError:
        pass


@given(messages, st.data())
def test_truncated_encoding_raises_only_message_error(message, data):
    raw = encode_message(message)
    cut = data.draw(st.integers(0, len(raw)))
    try:
        decode_message(raw[:cut])
    except MessageError:
        pass
