"""34/WAKU2-PEER-EXCHANGE codecs.

Expected bytes are written out by hand from the protobuf encoding rules
(tag = field_number << 3 | wire_type) and from what nwaku
(waku/waku_peer_exchange/rpc_codec.nim) and js-waku
(packages/proto/src/lib/peer_exchange.proto) put on the wire.
"""

from __future__ import annotations

import base64

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from hypothesis import given
from hypothesis import strategies as st

from wakustore.protocols.errors import PeerExchangeError, ProtocolError
from wakustore.protocols.framing import (
    PEER_EXCHANGE_MAX_REQUEST_SIZE,
    PEER_EXCHANGE_MAX_RESPONSE_SIZE,
    FrameReader,
    encode_frame,
    encode_uvarint,
)
from wakustore.protocols.peer_exchange import (
    MAX_ENR_SIZE,
    MAX_PEER_INFO_SIZE,
    MAX_PEERS,
    PROTOCOL_ID,
    PeerExchangeResponse,
    PeerExchangeStatus,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
)

# The example record of EIP-778 (134 bytes).
EIP778_ENR = base64.urlsafe_b64decode(
    "-IS4QHCYrYZbAKWCBRlAy5zzaDZXJBGkcnh4MHcBFZntXNFrdvJjX04jRzjzCBOonrkTfj499SZuOh8R33Ls8RRcy5wBgmlkgnY0gmlwhH8AAAGJc2VjcDI1"
    "NmsxoQPKY0yuDUmstAHYpMa2_oxVtw0RW_QAdpzBQA8yWM0xOIN1ZHCCdl8="
)

enr_bytes = st.binary(min_size=1, max_size=MAX_ENR_SIZE)


def varint(value: int) -> bytes:
    return encode_uvarint(value)


def field(number: int, payload: bytes) -> bytes:
    """A length-delimited field."""
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def varint_field(number: int, value: int) -> bytes:
    return varint(number << 3) + varint(value)


def peer_infos(*enrs: bytes) -> bytes:
    return b"".join(field(1, field(1, enr)) for enr in enrs)


def test_protocol_id_and_limits():
    assert PROTOCOL_ID == "/vac/waku/peer-exchange/2.0.0-alpha1"
    assert MAX_PEERS == 60
    assert MAX_ENR_SIZE == 300
    # 0a ac02 (PeerInfo, 303 bytes) | 0a ac02 <300 bytes>
    assert MAX_PEER_INFO_SIZE == 306
    assert PEER_EXCHANGE_MAX_REQUEST_SIZE == 1024
    assert PEER_EXCHANGE_MAX_RESPONSE_SIZE == 60 * 306 + 64 * 1024 == 83_896
    assert len(EIP778_ENR) == 134
    assert issubclass(PeerExchangeError, ProtocolError)


# --------------------------------------------------------------------------
# Requests


def test_request_bytes_are_what_js_waku_writes():
    # js-waku: PeerExchangeRPC { query: { numPeers: 60n } }, no response.
    assert encode_request(60) == bytes.fromhex("0a02083c")
    # A zero is still written, as js-waku and nwaku do.
    assert encode_request(0) == bytes.fromhex("0a020800")


def test_js_waku_request_decodes():
    raw = field(1, varint_field(1, 60))
    assert raw == bytes.fromhex("0a02083c")
    assert decode_request(raw) == 60


def test_nwaku_request_with_its_empty_response_decodes():
    # nwaku writes the query (numPeers 5) and an empty response whose
    # status_code 0 is written anyway: 0a 02 08 05 | 12 02 50 00.
    raw = field(1, varint_field(1, 5)) + field(2, varint_field(10, 0))
    assert raw == bytes.fromhex("0a02080512025000")
    assert decode_request(raw) == 5


@pytest.mark.parametrize("num_peers", range(0, MAX_PEERS + 1, 7))
def test_request_round_trip(num_peers):
    assert decode_request(encode_request(num_peers)) == num_peers


@pytest.mark.parametrize("asked", [61, 1000, 2**64 - 1])
def test_request_for_more_than_the_cap_is_answered_with_the_cap(asked):
    # nwaku answers min(MaxPeersCacheSize, numPeers).
    raw = field(1, varint_field(1, asked))
    assert len(raw) <= 13
    assert decode_request(raw) == MAX_PEERS


def test_query_without_num_peers_asks_for_none():
    assert decode_request(bytes.fromhex("0a00")) == 0


def test_unknown_fields_in_a_request_are_ignored():
    raw = field(1, varint_field(1, 3) + field(7, b"x")) + varint_field(9, 1)
    assert decode_request(raw) == 3


@pytest.mark.parametrize(
    "raw",
    [
        b"",  # nwaku: MissingRequiredField "request"
        bytes.fromhex("120350c801"),  # a response only
        bytes.fromhex("0a"),  # truncated
        bytes.fromhex("0a05083c"),  # length past the end
        bytes.fromhex("0a0c08ffffffffffffffffffff01"),  # varint of 11 bytes
    ],
)
def test_malformed_requests_are_refused(raw):
    with pytest.raises(PeerExchangeError):
        decode_request(raw)


@pytest.mark.parametrize("num_peers", [-1, MAX_PEERS + 1])
def test_encode_request_refuses_numbers_the_decoder_would_not_accept(num_peers):
    with pytest.raises(PeerExchangeError, match="num_peers"):
        encode_request(num_peers)


# --------------------------------------------------------------------------
# Responses


def test_response_bytes():
    enr = b"\xf8\x01"
    assert encode_response([enr]) == (
        bytes.fromhex("0a00")  # an empty query: nwaku requires field 1
        + field(2, peer_infos(enr) + bytes.fromhex("50c801"))  # 10: status 200
    )
    assert encode_response([], PeerExchangeStatus.TOO_MANY_REQUESTS, "slow down") == (
        bytes.fromhex("0a00") + field(2, bytes.fromhex("50ad03") + field(11, b"slow down"))
    )


@pytest.mark.parametrize("count", [0, 1, 2, MAX_PEERS])
def test_response_round_trip_with_0_1_many_peers(count):
    enrs = tuple(bytes([i]) * (1 + i * 4) for i in range(count))
    decoded = decode_response(encode_response(enrs))
    assert decoded == PeerExchangeResponse(enrs=enrs, status_code=200, status_desc=None)


@given(st.lists(enr_bytes, max_size=MAX_PEERS), st.integers(0, 2**32 - 1), st.none() | st.text(max_size=50))
def test_response_round_trip(enrs, status_code, status_desc):
    decoded = decode_response(encode_response(enrs, status_code, status_desc))
    assert decoded == PeerExchangeResponse(tuple(enrs), status_code, status_desc)


def test_eip778_record_round_trips_unchanged():
    assert decode_response(encode_response([EIP778_ENR, EIP778_ENR])).enrs == (EIP778_ENR, EIP778_ENR)


@pytest.mark.parametrize(
    ("status_code", "status_desc"),
    [
        (PeerExchangeStatus.SUCCESS, None),
        (PeerExchangeStatus.BAD_REQUEST, "MissingRequiredField request"),
        (PeerExchangeStatus.TOO_MANY_REQUESTS, None),
        (PeerExchangeStatus.SERVICE_UNAVAILABLE, ""),
        (599, "dial failure"),  # not one nwaku sends: kept as sent
        (0, None),
    ],
)
def test_status_codes_and_descriptions_are_kept(status_code, status_desc):
    decoded = decode_response(encode_response([], status_code, status_desc))
    assert decoded.status_code == status_code
    assert decoded.status_desc == status_desc
    assert decoded.enrs == ()


def test_status_codes_are_nwakus():
    assert [int(s) for s in PeerExchangeStatus] == [200, 400, 429, 503]


def test_response_as_nwaku_writes_it():
    # nwaku: an empty query with numPeers 0 written, then the response.
    raw = field(1, varint_field(1, 0)) + field(2, peer_infos(EIP778_ENR) + varint_field(10, 200))
    assert decode_response(raw) == PeerExchangeResponse((EIP778_ENR,), 200, None)
    error = field(1, varint_field(1, 0)) + field(2, varint_field(10, 400) + field(11, b"decode failure"))
    assert decode_response(error) == PeerExchangeResponse((), 400, "decode failure")


def test_response_without_status_reads_as_nwaku_reads_it():
    # go-waku, the spec and nwaku before status codes: the response alone.
    assert decode_response(field(2, peer_infos(b"\x01"))) == PeerExchangeResponse((b"\x01",), 200, None)
    assert decode_response(field(2, b"")) == PeerExchangeResponse((), 503, None)


def _js_waku_rpc_class():
    """PeerExchangeRPC as js-waku declares it: no fields 10 and 11."""
    proto = descriptor_pb2.FileDescriptorProto(name="js_waku_peer_exchange.proto", package="jswaku", syntax="proto3")
    fd = descriptor_pb2.FieldDescriptorProto
    optional, repeated = fd.LABEL_OPTIONAL, fd.LABEL_REPEATED

    def message(name, *fields):
        m = proto.message_type.add(name=name)
        for number, field_name, kind, type_name, lab in fields:
            f = m.field.add(name=field_name, number=number, type=kind, label=lab)
            if type_name:
                f.type_name = type_name

    message("PeerInfo", (1, "enr", fd.TYPE_BYTES, None, optional))
    message("PeerExchangeQuery", (1, "numPeers", fd.TYPE_UINT64, None, optional))
    message("PeerExchangeResponse", (1, "peerInfos", fd.TYPE_MESSAGE, ".jswaku.PeerInfo", repeated))
    message(
        "PeerExchangeRPC",
        (1, "query", fd.TYPE_MESSAGE, ".jswaku.PeerExchangeQuery", optional),
        (2, "response", fd.TYPE_MESSAGE, ".jswaku.PeerExchangeResponse", optional),
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("jswaku.PeerExchangeRPC"))


def test_response_is_readable_with_js_wakus_schema():
    rpc_class = _js_waku_rpc_class()
    rpc = rpc_class.FromString(encode_response([EIP778_ENR, b"\x02"], 429, "busy"))
    assert [info.enr for info in rpc.response.peerInfos] == [EIP778_ENR, b"\x02"]
    # And a request js-waku's schema writes is ours.
    request = rpc_class(query={"numPeers": 60}).SerializeToString()
    assert request == bytes.fromhex("0a02083c")
    assert decode_request(request) == 60


def test_oversized_record_is_refused():
    assert decode_response(encode_response([bytes(MAX_ENR_SIZE)])).enrs == (bytes(MAX_ENR_SIZE),)
    raw = bytes.fromhex("0a00") + field(2, peer_infos(b"\x01", bytes(MAX_ENR_SIZE + 1)) + varint_field(10, 200))
    with pytest.raises(PeerExchangeError, match="301 bytes"):
        decode_response(raw)
    with pytest.raises(PeerExchangeError, match="301 bytes"):
        encode_response([bytes(MAX_ENR_SIZE + 1)])


def test_more_records_than_the_cap_are_refused():
    # encode_request never asks for more than MAX_PEERS: a response with
    # more ignored the request, and is refused whole.
    enrs = [bytes([i % 256]) for i in range(MAX_PEERS + 1)]
    raw = field(2, peer_infos(*enrs) + varint_field(10, 200))
    with pytest.raises(PeerExchangeError, match="61 records"):
        decode_response(raw)
    with pytest.raises(PeerExchangeError, match="61 records"):
        encode_response(enrs)


def test_entries_without_a_record_are_skipped():
    raw = field(2, field(1, b"") + field(1, field(1, b"")) + peer_infos(b"\x07") + varint_field(10, 200))
    assert decode_response(raw) == PeerExchangeResponse((b"\x07",), 200, None)


def test_an_empty_record_is_not_encoded():
    # js-waku fails the whole answer on a record it cannot parse.
    with pytest.raises(PeerExchangeError, match="empty"):
        encode_response([b"\x01", b""])


@pytest.mark.parametrize("status_code", [-1, 2**32])
def test_status_code_must_be_uint32(status_code):
    with pytest.raises(PeerExchangeError, match="uint32"):
        encode_response([], status_code)


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        bytes.fromhex("0a02083c"),  # a request
        bytes.fromhex("12"),  # truncated
        field(2, field(1, b"\x0a\x05\x01")),  # record length past its PeerInfo
        field(2, field(11, b"\xff\xfe")),  # status_desc not UTF-8
    ],
)
def test_malformed_responses_are_refused(raw):
    with pytest.raises(PeerExchangeError):
        decode_response(raw)


def test_largest_messages_fit_their_frames():
    largest = encode_response([b"\xff" * MAX_ENR_SIZE] * MAX_PEERS, 2**32 - 1, "d" * 40_000)
    assert len(largest) <= PEER_EXCHANGE_MAX_RESPONSE_SIZE
    (frame,) = FrameReader(PEER_EXCHANGE_MAX_RESPONSE_SIZE).feed(encode_frame(largest))
    assert len(decode_response(frame).enrs) == MAX_PEERS
    nwaku_request = field(1, varint_field(1, 2**64 - 1)) + field(2, varint_field(10, 0))
    assert len(nwaku_request) == 17 <= PEER_EXCHANGE_MAX_REQUEST_SIZE


def test_the_record_bound_is_eip_778s():
    from wakustore.protocols import enr, peer_exchange

    assert peer_exchange.MAX_RECORD_SIZE == enr.MAX_RECORD_SIZE
