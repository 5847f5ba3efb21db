import pytest
from hypothesis import given
from hypothesis import strategies as st

from wakustore.protocols.errors import MetadataError
from wakustore.protocols.metadata import (
    PROTOCOL_ID,
    Metadata,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
    refusal,
)

uint32 = st.integers(0, 2**32 - 1)
metadata = st.builds(
    Metadata,
    cluster_id=st.none() | uint32,
    shards=st.lists(uint32, max_size=20).map(tuple),
)


def test_protocol_id():
    assert PROTOCOL_ID == "/vac/waku/metadata/1.0.0"


def test_shards_are_written_unpacked_at_2_and_packed_at_3():
    # 08 10 cluster 16 | 10 00, 10 05 unpacked shards | 1a 02 00 05 packed shards
    expected = bytes.fromhex("0810100010051a020005")
    assert encode_request(Metadata(16, (0, 5))) == expected
    assert encode_response(Metadata(16, (0, 5))) == expected


def test_absent_cluster_id_and_no_shards_encode_to_nothing():
    assert encode_request(Metadata(None)) == b""
    assert decode_request(b"") == Metadata(None, ())


def test_cluster_id_zero_is_written():
    assert encode_response(Metadata(0)) == bytes.fromhex("0800")
    assert decode_response(bytes.fromhex("0800")) == Metadata(0, ())


def test_packed_field_3_is_preferred_over_field_2():
    raw = bytes.fromhex("080110071a020102")
    assert decode_response(raw) == Metadata(1, (1, 2))


def test_js_waku_unpacked_field_2_alone_is_read():
    raw = bytes.fromhex("080110031004")
    assert decode_request(raw) == Metadata(1, (3, 4))


def test_packed_field_2_alone_is_read():
    raw = bytes.fromhex("080112020304")
    assert decode_response(raw) == Metadata(1, (3, 4))


@pytest.mark.parametrize("value", [-1, 2**32])
def test_values_outside_uint32_are_refused(value):
    with pytest.raises(MetadataError):
        encode_request(Metadata(value))
    with pytest.raises(MetadataError):
        encode_response(Metadata(1, (value,)))


@given(metadata)
def test_request_round_trip(value):
    assert decode_request(encode_request(value)) == value


@given(metadata)
def test_response_round_trip(value):
    assert decode_response(encode_response(value)) == value


@given(st.binary(max_size=100))
def test_garbage_raises_only_metadata_error(raw):
    for decode in (decode_request, decode_response):
        try:
            assert isinstance(decode(raw), Metadata)
        except MetadataError:
            pass


@given(metadata, st.data())
def test_truncated_messages_raise_only_metadata_error(value, data):
    raw = encode_response(value)
    cut = data.draw(st.integers(0, len(raw)))
    try:
        decode_response(raw[:cut])
    except MetadataError:
        pass


def test_refusal_names_why_a_peer_is_dropped_as_nwaku_drops_it():
    ours = Metadata(cluster_id=16, shards=(32, 64))
    assert refusal(ours, Metadata(16, (64, 128)), relay_peer=True) is None
    assert refusal(ours, Metadata(None, (32,)), relay_peer=True) == "no cluster id reported"
    assert refusal(ours, Metadata(1, (32,)), relay_peer=False) == ("different cluster id reported: 16 vs 1")
    assert refusal(ours, Metadata(16, (1,)), relay_peer=True) == ("no shards in common: ours [32, 64], theirs [1]")
    # Shards matter for relay peers only (a light client subscribes to none).
    assert refusal(ours, Metadata(16, ()), relay_peer=False) is None
