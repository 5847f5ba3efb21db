import pytest
import rlp
from hypothesis import given, settings
from hypothesis import strategies as st

from wakustore.protocols.crypto import keccak256
from wakustore.protocols.errors import WakuV1Error
from wakustore.protocols.mailserver import (
    CURSOR_SIZE,
    MAX_PACKET_SIZE,
    MAX_REQUEST_LIMIT,
    MAX_TOPICS,
    MESSAGES,
    P2P_MESSAGE,
    P2P_REQUEST,
    P2P_REQUEST_COMPLETE,
    STATUS,
    WRONG_SIGNATURE,
    Cursor,
    MessagesRequest,
    RequestComplete,
    bundle_envelopes,
    decode_cursor,
    decode_direct_request,
    decode_p2p_request,
    decode_request_complete,
    decode_request_payload,
    encode_cursor,
    encode_direct_request,
    encode_request_complete,
    encode_request_complete_error,
    encode_request_payload,
    envelope_cursor,
    open_request,
    validate_request,
)
from wakustore.protocols.waku_v1 import (
    MAX_UINT32,
    Envelope,
    bloom_for_topics,
    decode_envelope_list,
    encrypt_symmetric,
    full_bloom,
)

KEY = bytes(range(1, 33))
SIGNER = bytes([0x42]) * 32
NOW = 1_700_000_000
REQUEST_ID = bytes(range(32))
LAST_HASH = bytes(range(100, 132))
CURSOR = (1_699_999_000).to_bytes(4, "big") + bytes(range(200, 232))

uint32 = st.integers(0, MAX_UINT32)
topic = st.binary(min_size=4, max_size=4)
cursors = st.one_of(st.just(b""), st.binary(min_size=CURSOR_SIZE, max_size=CURSOR_SIZE))
requests = st.builds(
    MessagesRequest,
    lower=uint32,
    upper=uint32,
    bloom=st.one_of(st.just(b""), st.binary(min_size=64, max_size=64)),
    topics=st.lists(topic, max_size=12).map(tuple),
    limit=uint32,
    cursor=cursors,
    batch=st.booleans(),
)
rlp_structures = st.recursive(st.binary(max_size=70), lambda children: st.lists(children, max_size=9), max_leaves=40)


def test_packet_codes_are_status_go_values():
    assert (STATUS, MESSAGES, P2P_REQUEST_COMPLETE, P2P_REQUEST, P2P_MESSAGE) == (0, 1, 125, 126, 127)
    assert MAX_PACKET_SIZE == 1024 * 1024


# --- request payloads --------------------------------------------------------------


def test_status_go_payload_encodes_field_by_field():
    request = MessagesRequest(lower=1, upper=300, bloom=b"", topics=[b"abcd"], limit=1000, cursor=b"", batch=True)
    # [1, 300, "", ["abcd"], 1000, "", true]
    body = bytes.fromhex("0182012c80c584616263648203e88001")
    assert encode_request_payload(request, "status-go") == bytes([0xC0 + len(body)]) + body


def test_spec_payload_encodes_field_by_field():
    request = MessagesRequest(lower=1, upper=300, bloom=b"", topics=[b"abcd"], limit=1000, cursor=b"")
    # [1, 300, "", 1000, "", ["abcd"]]
    body = bytes.fromhex("0182012c808203e880c58461626364")
    assert encode_request_payload(request, "spec") == bytes([0xC0 + len(body)]) + body
    # Without topics the list is left out; the cursor stays.
    no_topics = MessagesRequest(lower=1, upper=300, bloom=b"", limit=1000)
    assert rlp.decode(encode_request_payload(no_topics, "spec")) == [b"\x01", b"\x01\x2c", b"", b"\x03\xe8", b""]


@given(requests)
def test_status_go_layout_round_trips(request):
    decoded = decode_request_payload(encode_request_payload(request, "status-go"))
    assert decoded == MessagesRequest(**{**vars(request), "layout": "status-go"})


@given(requests)
def test_spec_layout_round_trips(request):
    decoded = decode_request_payload(encode_request_payload(request, "spec"))
    assert decoded == MessagesRequest(**{**vars(request), "batch": True, "layout": "spec"})


@given(requests, st.binary(min_size=32, max_size=32))
def test_direct_request_round_trips(request, request_id):
    direct = MessagesRequest(**{**vars(request), "batch": True, "layout": "direct", "request_id": request_id})
    raw = encode_direct_request(direct)
    assert decode_direct_request(raw) == direct
    assert decode_p2p_request(raw).request == direct
    assert decode_p2p_request(raw).request_id == request_id


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ([1, 2, b"b" * 64, 10], {"limit": 10, "cursor": b"", "topics": ()}),
        ([1, 2, b"b" * 64, 10, CURSOR], {"limit": 10, "cursor": CURSOR, "topics": ()}),
        ([1, 2, b"", 10, b"", [b"abcd", b"efgh"]], {"limit": 10, "cursor": b"", "topics": (b"abcd", b"efgh")}),
    ],
)
def test_spec_payload_forms_are_all_accepted(fields, expected):
    request = decode_request_payload(rlp.encode(fields))
    assert request.layout == "spec"
    assert {key: getattr(request, key) for key in expected} == expected


@pytest.mark.parametrize(
    "fields",
    [
        [1, 2, b"", [b"abcd"], 10, b""],  # status-go without batch: go-ethereum refuses
        [1, 2, b"", [b"abcd"], 10, b"", True, b""],  # status-go with an extra element
        [1, 2, b"x" * 64, 10, b"", True],  # pre-2020 status-go (batch, no topics)
        [1, 2, b"", 10, b"", [b"abcd"], b""],  # spec with an extra element
        [1, 2, b""],  # too short
        [1, 2, [b""], 10],  # bloom as a list
        [1, 2, b"", [b"abcd"], 10, b"", 2],  # batch not a boolean
        [1, 2, b"", [[b"abcd"]], 10, b"", True],  # topic nested in a list
        [2**32, 2, b"x", 10],  # lower wider than uint32
        [1, 2, b"x", 10, [b""]],  # cursor as a list
        b"not a list",
    ],
)
def test_malformed_request_payloads_are_rejected(fields):
    with pytest.raises(WakuV1Error, match="^failed to decode data: "):
        decode_request_payload(rlp.encode(fields))


def test_request_payload_with_non_canonical_integer_is_rejected():
    raw = bytes.fromhex("c682000102800a")  # lower = 0x0001 with a leading zero
    with pytest.raises(WakuV1Error, match="leading zero"):
        decode_request_payload(raw)


def test_request_payload_topic_count_is_bounded():
    fields = [1, 2, b"", 10, b"", [b"abcd"] * (MAX_TOPICS + 1)]
    with pytest.raises(WakuV1Error, match="^failed to decode data: "):
        decode_request_payload(rlp.encode(fields))
    assert len(decode_request_payload(rlp.encode(fields[:5] + [fields[5][:MAX_TOPICS]])).topics) == MAX_TOPICS


# --- validation ----------------------------------------------------------------------


def test_validation_applies_status_go_defaults():
    request = validate_request(MessagesRequest(lower=5, upper=0, topics=[b"abcd"], limit=0), NOW)
    assert request.upper == NOW + 60
    assert request.limit == 1000


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        (MessagesRequest(lower=10, upper=9, topics=[b"abcd"]), "^query range is invalid: lower > upper$"),
        (
            MessagesRequest(lower=10, upper=9, topics=[b"abcd"], layout="direct", request_id=REQUEST_ID),
            "^request is invalid: query range is invalid: lower > upper$",
        ),
        (MessagesRequest(lower=NOW + 61, upper=0, topics=[b"abcd"]), "lower > upper"),
        (MessagesRequest(lower=1, upper=2), "^request is invalid: bloom filter and topics is empty$"),
        (
            MessagesRequest(lower=1, upper=2, topics=[b"abcd"], limit=MAX_REQUEST_LIMIT + 1),
            "^request is invalid: limit exceeds the maximum allowed value$",
        ),
        (MessagesRequest(lower=1, upper=2, topics=[b"abc"]), "^request is invalid: topics must be 4 bytes$"),
        (MessagesRequest(lower=1, upper=2, topics=[b"abcd"] * (MAX_TOPICS + 1)), "more than 1000 topics"),
        (MessagesRequest(lower=1, upper=2, bloom=b"\xff" * 63), "bloom filter must be 64 bytes"),
        (
            MessagesRequest(lower=1, upper=2, topics=[b"abcd"], cursor=b"\x01" * 35),
            "^request is invalid: invalid cursor size: expected 36 but got 35$",
        ),
    ],
)
def test_validation_rejects_with_status_go_messages(request_, message):
    with pytest.raises(WakuV1Error, match=message):
        validate_request(request_, NOW)


def test_limit_of_exactly_1000_and_empty_cursor_are_valid():
    request = MessagesRequest(lower=1, upper=2, bloom=full_bloom(), limit=1000, cursor=CURSOR)
    assert validate_request(request, NOW) == request


def test_topics_win_over_the_bloom_filter():
    bloom_only_for_other = bloom_for_topics([b"zzzz"])
    request = validate_request(MessagesRequest(lower=1, upper=2, bloom=bloom_only_for_other, topics=[b"abcd"]), NOW)
    assert request.matches_topic(b"abcd")
    assert not request.matches_topic(b"zzzz")
    by_bloom = validate_request(MessagesRequest(lower=1, upper=2, bloom=bloom_only_for_other), NOW)
    assert by_bloom.matches_topic(b"zzzz")
    assert not by_bloom.matches_topic(b"abcd")


def test_request_fields_are_range_checked():
    with pytest.raises(WakuV1Error):
        MessagesRequest(lower=-1, upper=2)
    with pytest.raises(WakuV1Error):
        MessagesRequest(lower=1, upper=2, limit=2**32)
    with pytest.raises(WakuV1Error):
        MessagesRequest(lower=1, upper=2, layout="other")
    with pytest.raises(WakuV1Error):
        encode_direct_request(MessagesRequest(lower=1, upper=2, topics=[b"abcd"]))


# --- request envelopes -----------------------------------------------------------------


def _request_envelope(payload: bytes, signed: bool = True, ttl: int = 50) -> Envelope:
    data = encrypt_symmetric(payload, KEY, signing_key=SIGNER if signed else None)
    return Envelope(expiry=NOW + ttl, ttl=ttl, topic=b"\x00\x00\x00\x00", data=data)


def test_p2p_request_envelope_is_opened_and_decoded():
    request = MessagesRequest(lower=1, upper=2, topics=[b"abcd"], limit=20)
    envelope = _request_envelope(encode_request_payload(request, "status-go"))
    raw = envelope.encode()
    packet = decode_p2p_request(raw)
    assert packet.envelope == envelope and packet.request is None
    assert packet.request_id == keccak256(raw)
    assert open_request(packet.envelope, KEY) == request


def test_open_request_reports_status_go_errors():
    request = MessagesRequest(lower=1, upper=2, topics=[b"abcd"])
    envelope = _request_envelope(encode_request_payload(request, "spec"))
    assert open_request(envelope, KEY).layout == "spec"
    with pytest.raises(WakuV1Error, match="^PoW too low$"):
        open_request(envelope, KEY, minimum_pow=1e9)
    with pytest.raises(WakuV1Error, match="^failed to decrypt p2p request$"):
        open_request(envelope, bytes(reversed(KEY)))
    with pytest.raises(WakuV1Error, match="^failed to decode data: "):
        open_request(_request_envelope(b"\xff\xff"), KEY)


@pytest.mark.parametrize("layout", ["status-go", "spec"])
def test_unsigned_request_envelope_is_refused(layout):
    request = MessagesRequest(lower=1, upper=2, topics=[b"abcd"])
    unsigned = _request_envelope(encode_request_payload(request, layout), signed=False)
    with pytest.raises(WakuV1Error) as refused:
        open_request(unsigned, KEY)
    assert str(refused.value) == WRONG_SIGNATURE
    assert WRONG_SIGNATURE == "check message signature failed: wrong signature of p2p request"
    # Decryption comes first: an unsigned request under the wrong key fails there.
    with pytest.raises(WakuV1Error, match="^failed to decrypt p2p request$"):
        open_request(unsigned, bytes(reversed(KEY)))


def test_request_signed_by_any_key_is_opened():
    request = MessagesRequest(lower=1, upper=2, topics=[b"abcd"], limit=5)
    for signer in (SIGNER, bytes([0x17]) * 32):
        data = encrypt_symmetric(encode_request_payload(request), KEY, signing_key=signer)
        envelope = Envelope(expiry=NOW + 50, ttl=50, topic=b"\x00\x00\x00\x00", data=data)
        assert open_request(envelope, KEY) == request


def test_garbage_p2p_request_is_rejected():
    with pytest.raises(WakuV1Error, match="^invalid p2p request message"):
        decode_p2p_request(rlp.encode([b"a", b"b"]))


# --- cursors ---------------------------------------------------------------------------


def test_cursor_is_big_endian_timestamp_then_hash():
    raw = encode_cursor(0x01020304, bytes([0xAB]) * 32)
    assert raw == b"\x01\x02\x03\x04" + b"\xab" * 32
    assert decode_cursor(raw) == Cursor(timestamp=0x01020304, envelope_hash=b"\xab" * 32)


@given(uint32, st.binary(min_size=32, max_size=32))
def test_cursor_round_trips(timestamp, digest):
    assert decode_cursor(encode_cursor(timestamp, digest)) == Cursor(timestamp, digest)


def test_envelope_cursor_uses_send_time_and_envelope_hash():
    raw = Envelope(expiry=1000, ttl=50, topic=b"abcd", data=b"x").encode()
    assert envelope_cursor(raw) == (950).to_bytes(4, "big") + keccak256(raw)


def test_bad_cursors_are_rejected():
    for raw in (b"", bytes(35), bytes(37)):
        with pytest.raises(WakuV1Error):
            decode_cursor(raw)
    with pytest.raises(WakuV1Error):
        encode_cursor(2**32, bytes(32))
    with pytest.raises(WakuV1Error):
        encode_cursor(1, bytes(31))


# --- Request Complete ---------------------------------------------------------------------


def test_status_go_request_complete_is_one_rlp_string():
    raw = encode_request_complete(REQUEST_ID, LAST_HASH, CURSOR)
    assert raw == b"\xb8\x64" + REQUEST_ID + LAST_HASH + CURSOR
    assert encode_request_complete(REQUEST_ID, LAST_HASH) == b"\xb8\x40" + REQUEST_ID + LAST_HASH


def test_error_request_complete_is_one_rlp_string_with_prefix():
    raw = encode_request_complete_error(REQUEST_ID, "rate limit exceeded")
    body = b"ERROR=" + REQUEST_ID + b"rate limit exceeded"
    assert raw == b"\xb8" + bytes([len(body)]) + body
    assert decode_request_complete(raw) == RequestComplete(
        request_id=REQUEST_ID,
        last_envelope_hash=bytes(32),
        cursor=b"",
        error="rate limit exceeded",
        layout="status-go",
    )


def test_spec_request_complete_is_an_rlp_list():
    raw = encode_request_complete(REQUEST_ID, LAST_HASH, CURSOR, layout="spec")
    assert rlp.decode(raw) == [REQUEST_ID, LAST_HASH, CURSOR]
    assert rlp.decode(encode_request_complete(REQUEST_ID, LAST_HASH, layout="spec")) == [REQUEST_ID, LAST_HASH, b""]
    two = decode_request_complete(rlp.encode([REQUEST_ID, LAST_HASH]))
    assert (two.cursor, two.layout) == (b"", "spec")


@given(
    st.binary(min_size=32, max_size=32),
    st.binary(min_size=32, max_size=32),
    cursors,
    st.sampled_from(["status-go", "spec"]),
)
def test_request_complete_round_trips(request_id, last_hash, cursor, layout):
    decoded = decode_request_complete(encode_request_complete(request_id, last_hash, cursor, layout))
    assert decoded == RequestComplete(request_id, last_hash, cursor, None, layout)


@given(st.binary(min_size=32, max_size=32), st.text(max_size=80))
def test_request_complete_error_round_trips(request_id, message):
    decoded = decode_request_complete(encode_request_complete_error(request_id, message))
    assert (decoded.request_id, decoded.error) == (request_id, message)


def test_request_id_only_form_is_accepted():
    decoded = decode_request_complete(rlp.encode(REQUEST_ID))
    assert decoded == RequestComplete(REQUEST_ID, bytes(32), b"", None, "status-go")


@pytest.mark.parametrize(
    "raw",
    [
        rlp.encode(bytes(31)),
        rlp.encode(bytes(33)),
        rlp.encode(bytes(65)),
        rlp.encode(bytes(101)),
        rlp.encode([REQUEST_ID]),
        rlp.encode([REQUEST_ID, LAST_HASH, CURSOR, b""]),
        rlp.encode([REQUEST_ID, bytes(31)]),
        rlp.encode([[REQUEST_ID], LAST_HASH]),
        b"\xb8\x64" + REQUEST_ID,
    ],
)
def test_malformed_request_complete_is_rejected(raw):
    with pytest.raises(WakuV1Error):
        decode_request_complete(raw)


def test_request_complete_arguments_are_checked():
    with pytest.raises(WakuV1Error):
        encode_request_complete(bytes(31), LAST_HASH)
    with pytest.raises(WakuV1Error):
        encode_request_complete(REQUEST_ID, LAST_HASH, bytes(35))
    with pytest.raises(WakuV1Error):
        encode_request_complete(REQUEST_ID, LAST_HASH, layout="other")
    with pytest.raises(WakuV1Error):
        encode_request_complete_error(bytes(5), "x")


# --- bundles ---------------------------------------------------------------------------------


def _envelope(index: int, size: int) -> bytes:
    return Envelope(expiry=NOW + index, ttl=10, topic=b"abcd", data=bytes([index % 256]) * size).encode()


def test_bundles_stay_under_the_cap_and_keep_bytes_and_order():
    raws = [_envelope(i, 100 + 37 * i) for i in range(40)]
    bundles = bundle_envelopes(raws, max_packet_size=2000)
    assert len(bundles) > 1
    assert all(len(bundle) <= 2000 for bundle in bundles)
    assert [raw for bundle in bundles for _, raw in decode_envelope_list(bundle)] == raws


def test_bundle_fills_a_packet_exactly_to_the_cap():
    raws = [_envelope(1, 60), _envelope(2, 60)]
    exact = len(bundle_envelopes(raws)[0])
    assert bundle_envelopes(raws, max_packet_size=exact) == bundle_envelopes(raws)
    assert len(bundle_envelopes(raws, max_packet_size=exact - 1)) == 2


@settings(max_examples=50)
@given(st.lists(st.integers(0, 700), max_size=30), st.integers(800, 3000))
def test_bundles_round_trip(sizes, cap):
    raws = [_envelope(i, size) for i, size in enumerate(sizes)]
    bundles = bundle_envelopes(raws, max_packet_size=cap)
    assert all(len(bundle) <= cap for bundle in bundles)
    assert [raw for bundle in bundles for _, raw in decode_envelope_list(bundle)] == raws


def test_bundling_rejects_an_envelope_too_big_for_any_packet():
    assert bundle_envelopes([]) == []
    with pytest.raises(WakuV1Error):
        bundle_envelopes([_envelope(1, 3000)], max_packet_size=1000)
    with pytest.raises(WakuV1Error):
        bundle_envelopes([b""])


def test_default_bundle_cap_is_one_mebibyte():
    raws = [_envelope(i, 100_000) for i in range(25)]
    bundles = bundle_envelopes(raws)
    assert len(bundles) == 3
    assert all(len(bundle) <= 1024 * 1024 for bundle in bundles)


# --- every decoder fails only with WakuV1Error ---------------------------------------------


@settings(max_examples=300)
@given(st.one_of(st.binary(max_size=200), rlp_structures.map(rlp.encode)))
def test_decoders_raise_only_waku_v1_errors(raw):
    decoders = [
        decode_request_payload,
        decode_direct_request,
        decode_p2p_request,
        decode_request_complete,
        decode_cursor,
        envelope_cursor,
        lambda data: validate_request(decode_request_payload(data), NOW),
    ]
    for decode in decoders:
        try:
            decode(raw)
        except WakuV1Error:
            pass


@settings(max_examples=100)
@given(
    st.lists(
        st.one_of(
            st.integers(0, 2**40), st.binary(max_size=70), st.lists(st.binary(max_size=6), max_size=4), st.booleans()
        ),
        min_size=3,
        max_size=8,
    )
)
def test_request_shaped_inputs_raise_only_waku_v1_errors(fields):
    raw = rlp.encode(fields)
    for decode in (decode_request_payload, decode_direct_request, decode_p2p_request):
        try:
            request = decode(raw)
        except WakuV1Error:
            continue
        if isinstance(request, MessagesRequest):
            try:
                validate_request(request, NOW)
            except WakuV1Error:
                pass
