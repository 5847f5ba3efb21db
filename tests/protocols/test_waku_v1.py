import functools
import hashlib
import math

import coincurve
import pytest
import rlp
from Crypto.Cipher import AES
from hypothesis import given, settings
from hypothesis import strategies as st

from wakustore.protocols.crypto import keccak256
from wakustore.protocols.errors import WakuV1Error
from wakustore.protocols.waku_v1 import (
    BLOOM_SIZE,
    MAX_MESSAGE_SIZE,
    MAX_UINT32,
    MAX_UINT64,
    PADDING_BLOCK,
    PASSWORD_KDF_ITERATIONS,
    TOPIC_SIZE,
    DecryptedPayload,
    Envelope,
    PeerStatus,
    bloom_for_topics,
    bloom_matches,
    decode_envelope_list,
    decode_rlp,
    decode_status,
    decrypt_symmetric,
    encode_envelope_list,
    encode_status,
    encrypt_symmetric,
    envelope_hash,
    envelope_problem,
    full_bloom,
    key_from_password,
    pow_value,
    rlp_encode,
    seal,
    split_rlp_list,
    topic_to_bloom,
)

KEY = bytes(range(1, 33))
SIGNER = bytes([0x42]) * 32
NONCE = bytes(range(12))

envelopes = st.builds(
    Envelope,
    expiry=st.integers(0, MAX_UINT32),
    ttl=st.integers(0, MAX_UINT32),
    topic=st.binary(min_size=TOPIC_SIZE, max_size=TOPIC_SIZE),
    data=st.binary(max_size=300),
    nonce=st.integers(0, MAX_UINT64),
)
rlp_structures = st.recursive(st.binary(max_size=70), lambda children: st.lists(children, max_size=8), max_leaves=30)
topics = st.binary(min_size=TOPIC_SIZE, max_size=TOPIC_SIZE)


# --- envelopes -----------------------------------------------------------------


def test_envelope_encodes_as_hand_built_rlp():
    envelope = Envelope(expiry=0, ttl=1, topic=bytes(4), data=bytes.fromhex("deadbeef"), nonce=100000)
    # list header 0xd0 (16 bytes); expiry 0 -> 0x80; ttl 1 -> 0x01;
    # topic -> 0x84 + 4 bytes; data -> 0x84 + 4 bytes; nonce 0x0186a0 -> 0x83 + 3 bytes.
    expected = bytes.fromhex("d08001840000000084deadbeef830186a0")
    assert envelope.encode() == expected
    assert Envelope.decode(expected) == envelope


def test_envelope_with_long_data_uses_long_headers():
    data = bytes(range(60))
    envelope = Envelope(expiry=0x5F5E1000, ttl=50, topic=b"\x01\x02\x03\x04", data=data, nonce=7)
    body = bytes.fromhex("845f5e1000328401020304") + b"\xb8\x3c" + data + b"\x07"
    assert envelope.encode() == b"\xf8" + bytes([len(body)]) + body


def test_envelope_hash_is_keccak256_of_the_rlp_bytes():
    # Keccak-256 (pre-standard, Ethereum's) of the empty string.
    assert keccak256(b"").hex() == "c5d2460186f7233c927e7db2dcc703c0e500b653ca82273b7bfad8045d85a470"
    raw = Envelope(expiry=10, ttl=5, topic=b"abcd", data=b"x").encode()
    assert envelope_hash(raw) == keccak256(raw)
    assert len(envelope_hash(raw)) == 32


def test_envelope_timestamp_is_expiry_minus_ttl_in_uint32():
    assert Envelope(expiry=1000, ttl=50, topic=b"abcd", data=b"").timestamp == 950
    assert Envelope(expiry=1, ttl=2, topic=b"abcd", data=b"").timestamp == MAX_UINT32


@given(envelopes)
def test_envelope_round_trips(envelope):
    raw = envelope.encode()
    assert Envelope.decode(raw) == envelope
    fields = rlp.decode(raw)
    assert [int.from_bytes(fields[i], "big") for i in (0, 1, 4)] == [envelope.expiry, envelope.ttl, envelope.nonce]
    assert fields[2:4] == [envelope.topic, envelope.data]


@given(rlp_structures)
def test_every_accepted_envelope_re_encodes_byte_for_byte(structure):
    raw = rlp.encode(structure)
    try:
        envelope = Envelope.decode(raw)
    except WakuV1Error:
        return
    assert envelope.encode() == raw


def _rlp_list(*items_hex: str) -> bytes:
    body = b"".join(bytes.fromhex(item) for item in items_hex)
    return rlp.codec.length_prefix(len(body), 0xC0) + body


# expiry 0, ttl 1, topic 00000000, data deadbeef, nonce 100000
GOOD_FIELDS = ("80", "01", "8400000000", "84deadbeef", "830186a0")
GOOD = _rlp_list(*GOOD_FIELDS)


def _with_field(index: int, value_hex: str) -> bytes:
    fields = list(GOOD_FIELDS)
    fields[index] = value_hex
    return _rlp_list(*fields)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        pytest.param(GOOD[:-1], "exceeds available input", id="truncated"),
        pytest.param(GOOD + b"\x00", "more than one value", id="trailing byte"),
        pytest.param(b"\xf8\x10" + GOOD[1:], "Long list prefix", id="long header for a short list"),
        pytest.param(_rlp_list(*GOOD_FIELDS[:4]), "too few elements", id="four elements"),
        pytest.param(_rlp_list(*GOOD_FIELDS, "80"), "more than 6 items", id="six elements"),
        pytest.param(_with_field(2, "83000000"), "topic must be 4 bytes", id="topic of 3 bytes"),
        pytest.param(_with_field(2, "850000000000"), "topic must be 4 bytes", id="topic of 5 bytes"),
        pytest.param(_with_field(0, "820001"), "leading zero", id="expiry with a leading zero"),
        pytest.param(_with_field(0, "00"), "leading zero", id="integer zero as the byte 0x00"),
        pytest.param(_with_field(1, "8101"), "single byte was possible", id="single byte in a header"),
        pytest.param(_with_field(0, "850100000000"), "too long", id="expiry wider than uint32"),
        pytest.param(_with_field(1, "8501ffffffff"), "too long", id="ttl wider than uint32"),
        pytest.param(_with_field(4, "89010000000000000000"), "too long", id="nonce wider than uint64"),
        pytest.param(_with_field(3, "b804deadbeef"), "Long string prefix", id="long header, short data"),
        pytest.param(_with_field(0, "c0"), "nested", id="list where an integer belongs"),
        pytest.param(
            _rlp_list("80", "01", "84000000", "84deadbeef"),
            "larger than containing list",
            id="element overruns its list",
        ),
        pytest.param(bytes.fromhex("8401020304"), "expected input list", id="a string"),
        pytest.param(b"", "empty", id="empty"),
        pytest.param(b"\xc0", "too few elements", id="empty list"),
        pytest.param(b"\xb9", "prefix", id="size header cut short"),
        pytest.param(b"\xb9\x01\x00", "exceeds available input", id="size beyond the input"),
    ],
)
def test_malformed_envelopes_are_rejected(raw, message):
    with pytest.raises(WakuV1Error, match=message):
        Envelope.decode(raw)


def test_absurd_nesting_is_rejected_without_recursion():
    deep = b"\x80"
    for _ in range(5000):
        deep = rlp.codec.length_prefix(len(deep), 0xC0) + deep
    with pytest.raises(WakuV1Error, match="nested"):
        Envelope.decode(deep)
    with pytest.raises(WakuV1Error, match="nested"):
        decode_envelope_list(deep)


def test_oversized_input_is_rejected_before_decoding():
    huge = rlp.encode(b"\x00" * (MAX_MESSAGE_SIZE + 1))
    with pytest.raises(WakuV1Error, match="exceeds"):
        Envelope.decode(huge)
    with pytest.raises(WakuV1Error, match="exceeds"):
        decode_rlp(b"\x00" * 11, max_size=10, max_depth=1, max_items=1)


def test_item_count_is_bounded():
    with pytest.raises(WakuV1Error, match="items"):
        decode_rlp(rlp.encode([b"a"] * 10), max_size=100, max_depth=1, max_items=5)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"expiry": -1},
        {"expiry": MAX_UINT32 + 1},
        {"ttl": MAX_UINT32 + 1},
        {"nonce": MAX_UINT64 + 1},
        {"topic": b"abc"},
        {"topic": "abcd"},
        {"data": "text"},
        {"expiry": True},
    ],
)
def test_envelope_fields_are_range_checked(kwargs):
    fields = {"expiry": 1, "ttl": 1, "topic": b"abcd", "data": b"", "nonce": 0, **kwargs}
    with pytest.raises(WakuV1Error):
        Envelope(**fields)


@given(st.lists(envelopes, max_size=5))
def test_envelope_lists_round_trip_keeping_raw_bytes(items):
    raws = [envelope.encode() for envelope in items]
    decoded = decode_envelope_list(encode_envelope_list(raws))
    assert decoded == list(zip(items, raws))
    assert split_rlp_list(encode_envelope_list(raws), max_size=10**6, max_depth=2) == raws


def test_envelope_list_rejects_a_bad_member():
    good = Envelope(expiry=1, ttl=1, topic=b"abcd", data=b"").encode()
    with pytest.raises(WakuV1Error):
        decode_envelope_list(encode_envelope_list([good, rlp.encode([b"x"])]))
    with pytest.raises(WakuV1Error):
        decode_envelope_list(good)  # an envelope, not a list of them


# --- proof of work ---------------------------------------------------------------


# Vectors from status-go waku/common/envelope_test.go
# (TestPoWCalculationsWithNoLeadingZeros / With8LeadingZeros).
@pytest.mark.parametrize(("nonce", "expected"), [(100000, 0.07692307692307693), (276, 19.692307692307693)])
def test_pow_matches_status_go_vectors(nonce, expected):
    envelope = Envelope(expiry=0, ttl=1, topic=bytes(4), data=bytes.fromhex("deadbeef"), nonce=nonce)
    assert pow_value(envelope) == expected


def test_pow_divides_by_rlp_without_nonce_length_and_ttl():
    envelope = Envelope(expiry=12345, ttl=7, topic=b"wxyz", data=b"payload", nonce=99)
    prefix = rlp.encode([12345, 7, b"wxyz", b"payload"])
    digest = int.from_bytes(keccak256(prefix + (99).to_bytes(8, "big")), "big")
    assert pow_value(envelope) == 2.0 ** (256 - digest.bit_length()) / len(prefix) / 7


def test_pow_with_zero_ttl_is_infinite_like_go():
    assert pow_value(Envelope(expiry=0, ttl=0, topic=bytes(4), data=b"")) == math.inf


def test_seal_finds_the_first_nonce_reaching_the_target():
    envelope = Envelope(expiry=1_700_000_000, ttl=10, topic=b"abcd", data=b"x" * 40)
    sealed = seal(envelope, 1.0, 1 << 16)
    assert pow_value(sealed) >= 1.0
    assert all(pow_value(Envelope(**{**vars(envelope), "nonce": n})) < 1.0 for n in range(sealed.nonce))


def test_seal_gives_up_after_max_iterations():
    envelope = Envelope(expiry=1, ttl=10, topic=b"abcd", data=b"x")
    with pytest.raises(WakuV1Error):
        seal(envelope, 1e30, 50)
    with pytest.raises(WakuV1Error):
        seal(envelope, math.inf, 50)
    assert seal(envelope, 0.0, 0) is envelope


# --- bloom filters -----------------------------------------------------------------


def _bloom_with_bits(*bits):
    bloom = bytearray(BLOOM_SIZE)
    for bit in bits:
        bloom[bit // 8] |= 1 << (bit % 8)
    return bytes(bloom)


def test_topic_bloom_sets_the_three_bits_by_hand():
    # topic[3] = 0xff adds 256 to all three indices: 0+256, 0x7f+256, 0x80+256.
    assert topic_to_bloom(bytes.fromhex("007f80ff")) == _bloom_with_bits(256, 383, 384)
    # topic[3] = 0x02 adds 256 to the second index only.
    assert topic_to_bloom(bytes.fromhex("0a140502")) == _bloom_with_bits(10, 20 + 256, 5)


def test_topic_bloom_keeps_only_the_last_bit_of_a_shared_byte_like_status_go():
    # Indices 1, 2 and 0 share byte 0; status-go's ToBloom assigns the byte
    # for each index in turn (waku/common/topic.go), so only bit 0 survives.
    assert topic_to_bloom(bytes.fromhex("01020000")) == _bloom_with_bits(0)


@given(st.lists(topics, max_size=6), topics)
def test_topics_bloom_matches_each_of_its_topics(listed, other):
    bloom = bloom_for_topics(listed)
    assert all(bloom_matches(bloom, topic_to_bloom(topic)) for topic in listed)
    assert bloom_matches(full_bloom(), topic_to_bloom(other))
    expected = bytes(BLOOM_SIZE)
    for topic in listed:
        expected = bytes(a | b for a, b in zip(expected, topic_to_bloom(topic)))
    assert bloom == expected


def test_bloom_matching_is_subset_inclusion():
    assert bloom_matches(_bloom_with_bits(1, 2, 3), _bloom_with_bits(1, 3))
    assert not bloom_matches(_bloom_with_bits(1, 3), _bloom_with_bits(1, 2))
    assert bloom_for_topics([]) == bytes(BLOOM_SIZE)
    with pytest.raises(WakuV1Error):
        bloom_matches(b"\xff" * 63, bytes(64))
    with pytest.raises(WakuV1Error):
        topic_to_bloom(b"abc")


# --- symmetric payloads ----------------------------------------------------------


@functools.cache
def _password_key():
    return key_from_password("status-offline-inbox")


def test_password_key_is_pbkdf2_sha256_without_salt():
    direct = hashlib.pbkdf2_hmac("sha256", b"status-offline-inbox", b"", 65356, 32)
    assert PASSWORD_KDF_ITERATIONS == 65356
    assert _password_key() == direct
    assert len(_password_key()) == 32


def test_hand_built_plaintext_decrypts_and_parses():
    # flags 0x01 (one size byte), size 5, payload, padding, then GCM with the
    # tag after the ciphertext and the nonce after both, as Go's gcm.Seal.
    plaintext = b"\x01\x05hello" + b"\xaa" * 249
    cipher = AES.new(KEY, AES.MODE_GCM, nonce=NONCE)
    ciphertext, tag = cipher.encrypt_and_digest(plaintext)
    opened = decrypt_symmetric(ciphertext + tag + NONCE, KEY)
    assert opened == DecryptedPayload(payload=b"hello", signature_public_key=None, padding=b"\xaa" * 249)


def test_encryption_layout_matches_the_definition():
    data = encrypt_symmetric(b"hello", KEY, nonce=NONCE, padding=b"\x00\x01")
    assert data[-12:] == NONCE
    cipher = AES.new(KEY, AES.MODE_GCM, nonce=NONCE)
    plaintext = cipher.decrypt_and_verify(data[:-28], data[-28:-12])
    assert plaintext == b"\x01\x05hello\x00\x01"


def test_signed_payload_carries_a_recoverable_signature_over_keccak():
    data = encrypt_symmetric(b"hi", KEY, signing_key=SIGNER, nonce=NONCE)
    plaintext = AES.new(KEY, AES.MODE_GCM, nonce=NONCE).decrypt_and_verify(data[:-28], data[-28:-12])
    assert plaintext[0] == 0x04 | 0x01
    assert len(plaintext) % PADDING_BLOCK == 0
    body, signature = plaintext[:-65], plaintext[-65:]
    assert signature[64] in (0, 1)
    signer = coincurve.PublicKey.from_signature_and_message(signature, keccak256(body), hasher=None)
    expected = coincurve.PrivateKey(SIGNER).public_key.format(compressed=True)
    assert signer.format(compressed=True) == expected
    assert decrypt_symmetric(data, KEY).signature_public_key == expected


def test_random_padding_fills_256_byte_blocks_as_status_go():
    # status-go waku/common/message_test.go TestPaddingAppendedToSymMessagesWithSignature:
    # a 246-byte payload with a signature pads the unsigned part to 512 - 65 bytes.
    data = encrypt_symmetric(bytes(246), KEY, signing_key=SIGNER, nonce=NONCE)
    assert len(data) == 512 + 16 + 12
    opened = decrypt_symmetric(data, KEY)
    assert len(opened.padding) == 512 - 65 - (1 + 1 + 246)
    # A plaintext that already fills a block gets one more whole block.
    exact = encrypt_symmetric(bytes(256 - 2), KEY, nonce=NONCE)
    assert len(exact) == 512 + 16 + 12
    # Larger payloads use a wider little-endian size field.
    wide = encrypt_symmetric(bytes(300), KEY, nonce=NONCE, padding=b"")
    plaintext = AES.new(KEY, AES.MODE_GCM, nonce=NONCE).decrypt_and_verify(wide[:-28], wide[-28:-12])
    assert plaintext[:3] == b"\x02" + (300).to_bytes(2, "little")


@settings(max_examples=40)
@given(st.binary(max_size=600), st.booleans(), st.one_of(st.none(), st.binary(max_size=300)))
def test_encryption_round_trips(payload, signed, padding):
    data = encrypt_symmetric(payload, KEY, signing_key=SIGNER if signed else None, padding=padding)
    opened = decrypt_symmetric(data, KEY)
    assert opened.payload == payload
    assert (opened.signature_public_key is not None) == signed
    if padding is not None:
        assert opened.padding == padding


def test_password_key_encrypts_and_decrypts():
    data = encrypt_symmetric(b"request", _password_key())
    assert decrypt_symmetric(data, _password_key()).payload == b"request"


def test_size_field_count_zero_means_empty_payload():
    plaintext = b"\x00" + b"rest is padding"
    cipher = AES.new(KEY, AES.MODE_GCM, nonce=NONCE)
    ciphertext, tag = cipher.encrypt_and_digest(plaintext)
    opened = decrypt_symmetric(ciphertext + tag + NONCE, KEY)
    assert opened.payload == b"" and opened.padding == b"rest is padding"


@pytest.mark.parametrize(
    "plaintext",
    [b"", b"\x02\x05", b"\x01\xff" + b"short", b"\x04" + bytes(65), b"\x05\x01x" + bytes(65)],
)
def test_malformed_plaintexts_are_rejected(plaintext):
    cipher = AES.new(KEY, AES.MODE_GCM, nonce=NONCE)
    ciphertext, tag = cipher.encrypt_and_digest(plaintext)
    with pytest.raises(WakuV1Error):
        decrypt_symmetric(ciphertext + tag + NONCE, KEY)


def test_wrong_key_garbage_and_tampering_are_rejected():
    data = encrypt_symmetric(b"secret", KEY)
    with pytest.raises(WakuV1Error):
        decrypt_symmetric(data, bytes(reversed(KEY)))
    with pytest.raises(WakuV1Error):
        decrypt_symmetric(data[:20], KEY)
    with pytest.raises(WakuV1Error):
        decrypt_symmetric(bytes([data[0] ^ 1]) + data[1:], KEY)
    with pytest.raises(WakuV1Error):
        decrypt_symmetric(data, KEY[:16])
    with pytest.raises(WakuV1Error):
        encrypt_symmetric(b"x", bytes(32))  # all-zero key, refused by status-go
    with pytest.raises(WakuV1Error):
        encrypt_symmetric(b"x", KEY, nonce=b"short")
    with pytest.raises(WakuV1Error):
        encrypt_symmetric(b"x", KEY, signing_key=bytes(32))  # not a valid private key


# --- every decoder fails only with WakuV1Error -----------------------------------


def _decoders():
    return [
        Envelope.decode,
        decode_envelope_list,
        lambda raw: decrypt_symmetric(raw, KEY),
        lambda raw: decode_rlp(raw, max_size=1000, max_depth=2, max_items=50),
        lambda raw: split_rlp_list(raw, max_size=1000, max_depth=2),
    ]


@settings(max_examples=300)
@given(st.one_of(st.binary(max_size=200), rlp_structures.map(rlp.encode)))
def test_decoders_raise_only_waku_v1_errors(raw):
    for decode in _decoders():
        try:
            decode(raw)
        except WakuV1Error:
            pass


# --- what status-go's Waku.add accepts ----------------------------------------------

T0 = 1_700_000_000
TOPIC = b"\x08\x10\x18\x00"


def test_envelope_checks_follow_status_go():
    now = T0
    fresh = Envelope(expiry=now + 40, ttl=50, topic=TOPIC, data=b"x")
    assert envelope_problem(fresh, now, minimum_pow=0.0, max_size=1024) is None
    ahead = Envelope(expiry=now + 60, ttl=50, topic=TOPIC, data=b"x")  # sent 10 s ahead: allowed
    assert envelope_problem(ahead, now, minimum_pow=0.0, max_size=1024) is None
    too_far = Envelope(expiry=now + 61, ttl=50, topic=TOPIC, data=b"x")
    assert envelope_problem(too_far, now, minimum_pow=0.0, max_size=1024) == "envelope from future"
    assert envelope_problem(Envelope(now - 1, 50, TOPIC, b"x"), now, minimum_pow=0, max_size=1024) == "expired"
    assert (
        envelope_problem(Envelope(now - 21, 50, TOPIC, b"x"), now, minimum_pow=0, max_size=1024) == "very old envelope"
    )
    big = Envelope(expiry=now + 40, ttl=50, topic=TOPIC, data=bytes(1005))
    assert envelope_problem(big, now, minimum_pow=0.0, max_size=1024).startswith("huge messages")
    assert envelope_problem(fresh, now, minimum_pow=1e9, max_size=1024) == "envelope with low PoW"


def test_pow_of_an_envelope_sent_ahead_counts_the_stretched_ttl():
    # status-go: an envelope stamped d s ahead has its PoW computed with
    # ttl + d + 1, so exactly the PoW it claims is no longer enough.
    sent_ahead = seal(Envelope(expiry=T0 + 5 + 50, ttl=50, topic=TOPIC, data=b"ahead"), 0.01, 1_000_000)
    claimed = pow_value(sent_ahead)
    assert pow_value(sent_ahead, 50 + 5 + 1) == claimed * 50 / 56
    assert envelope_problem(sent_ahead, T0 + 5, minimum_pow=claimed, max_size=1024) is None
    assert envelope_problem(sent_ahead, T0, minimum_pow=claimed, max_size=1024) == "envelope with low PoW"
    assert envelope_problem(sent_ahead, T0, minimum_pow=claimed * 50 / 56, max_size=1024) is None


# --- waku/1 status ----------------------------------------------------------------------


def encode_status_pow(value: float) -> int:
    import struct

    return struct.unpack(">Q", struct.pack(">d", value))[0]


def test_status_packets_are_read_leniently():
    ours = decode_status(encode_status(0.002))
    assert ours == PeerStatus(pow_requirement=0.002, bloom=full_bloom(), light_node=False, confirmations=False)
    options = [[0, encode_status_pow(0.5)], [5, [b"abcd", b"toolong"]], [99, b"future option"], [2, b"\x01"]]
    assert decode_status(rlp_encode(options)) == PeerStatus(0.5, light_node=True, topic_interest=(b"abcd",))
    assert decode_status(rlp_encode([options])).pow_requirement == 0.5  # wrapped in a one-element list
    assert decode_status(b"\xff\x00") == PeerStatus() == decode_status(rlp_encode([[0, 2**64 - 1]]))


def test_our_status_is_status_go_s_options_list():
    light = encode_status(0.5, bytes(BLOOM_SIZE), light_node=True, confirmations=True)
    assert light == rlp_encode([[0, encode_status_pow(0.5)], [1, bytes(BLOOM_SIZE)], [2, True], [3, True]])
    assert decode_status(light) == PeerStatus(0.5, bytes(BLOOM_SIZE), True, True)


@given(st.binary(max_size=400))
@settings(max_examples=300, deadline=None)
def test_any_status_bytes_decode_to_a_status(raw):
    assert isinstance(decode_status(raw), PeerStatus)


def test_status_with_more_items_than_the_bound_reads_as_empty():
    too_many = rlp_encode([[5, [TOPIC] * 10_100]])
    assert decode_status(too_many) == PeerStatus()
    assert decode_status(rlp_encode([[5, [TOPIC] * 100]])).topic_interest == (TOPIC,) * 100
