"""Archived message records (protocols/archive_records.py): round trips in
both layouts, status-go's field numbers (wire-facts.md, "Community
archives"), the extension fields, and ArchiveError for any bad input."""

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wakustore.protocols import waku_v1
from wakustore.protocols.archive_records import (
    EXT_ARRIVAL,
    EXT_META,
    EXT_NONCE,
    EXT_PROOF,
    EXT_PUBSUB_TOPIC,
    EXT_SIGNATURE,
    EXT_TIMESTAMP,
    EXT_VERSION,
    NS_PER_S,
    ArchivedMessage,
    Layout,
    RecordDecoder,
    RecordEncoder,
    _ext_fields,
    channel_key,
    decode_archived_message,
    encode_archived_message,
    field_bytes,
    field_varint,
    proto_fields,
    varint,
    varints,
)
from wakustore.protocols.errors import ArchiveError
from wakustore.protocols.framing import encode_uvarint
from wakustore.protocols.message import WakuMessage, message_hash

PUBSUB = "/waku/2/rs/16/32"
DEFAULT_PUBSUB = "/waku/2/rs/16/0"
TOPIC = "/waku/1/0x0a0b0c0d/rfc26"
KEY = channel_key("0x02" + "ab" * 32, "general")
SENDER = bytes(range(5, 37))
T = 1_700_000_000 * NS_PER_S + 123_456_789
ARRIVAL = T + 5_000

# status-go's archive WakuMessage (wire-facts.md): sig 1, timestamp 2
# (seconds), topic 3 (4 bytes), payload 4, padding 5, hash 6.
SIG, TIMESTAMP, TOPIC_FIELD, PAYLOAD, PADDING, HASH = 1, 2, 3, 4, 5, 6


def fields(raw: bytes) -> dict[int, object]:
    found = {}
    for number, _wire, value in proto_fields(raw):
        assert number not in found, f"field {number} twice"
        found[number] = value
    return found


messages = st.builds(
    WakuMessage,
    payload=st.binary(max_size=200),
    content_topic=st.just(TOPIC),
    version=st.integers(0, 2**31 - 1),  # what the table keeps (uint32 on the wire)
    timestamp=st.integers(-(2**62), 2**62),
    meta=st.binary(max_size=64),
    rate_limit_proof=st.binary(max_size=40),
)


@pytest.mark.parametrize("layout", list(Layout))
@given(message=messages, arrival=st.integers(0, 2**63 - 1))
@settings(max_examples=150, deadline=None)
def test_every_message_round_trips_exactly(layout, message, arrival):
    if layout is Layout.STATUS_GO and (message.timestamp or arrival) < 0:
        return  # status-go's uint64 seconds cannot hold a time before 1970
    record = encode_archived_message(layout, PUBSUB, message, arrival)
    back = decode_archived_message(layout, record.data, DEFAULT_PUBSUB)
    assert back == ArchivedMessage(PUBSUB, message, arrival)
    assert message_hash(back.pubsub_topic, back.message) == message_hash(PUBSUB, message)


@pytest.mark.parametrize("layout", list(Layout))
def test_a_version_the_table_cannot_keep_is_refused(layout):
    record = encode_archived_message(layout, PUBSUB, WakuMessage(b"x", TOPIC, version=2**31, timestamp=10**18), 10**18)
    with pytest.raises(ArchiveError, match="version"):
        decode_archived_message(layout, record.data, DEFAULT_PUBSUB)


def test_status_go_record_uses_status_go_s_field_numbers():
    message = WakuMessage(b"opaque", TOPIC, version=0, timestamp=T, meta=b"m", rate_limit_proof=b"rlp")
    record = encode_archived_message(Layout.STATUS_GO, PUBSUB, message, ARRIVAL)
    found = fields(record.data)
    assert found[TIMESTAMP] == T // NS_PER_S
    assert found[TOPIC_FIELD] == bytes.fromhex("0a0b0c0d")
    assert found[PAYLOAD] == b"opaque"
    assert found[HASH] == message_hash(PUBSUB, message)
    assert SIG not in found and PADDING not in found  # not opened: no signer, no padding
    assert found[EXT_PUBSUB_TOPIC] == PUBSUB.encode() and found[EXT_ARRIVAL] == ARRIVAL
    assert found[EXT_TIMESTAMP] == 2 * T  # sint64, zigzag
    assert found[EXT_META] == b"m" and found[EXT_PROOF] == b"rlp"
    assert EXT_VERSION not in found  # version 0 is left out
    assert record.payload_size == len(b"opaque")


def test_a_channel_message_is_archived_readable_and_sealed_back_byte_for_byte():
    payload = waku_v1.encrypt_symmetric(b"hello community", KEY, SENDER)
    message = WakuMessage(payload, TOPIC, version=1, timestamp=T)
    record = encode_archived_message(Layout.STATUS_GO, PUBSUB, message, ARRIVAL, KEY)
    found = fields(record.data)
    opened = waku_v1.decrypt_symmetric(payload, KEY)
    assert found[PAYLOAD] == b"hello community"  # what Status clients read
    assert len(found[SIG]) == 65 and found[SIG][0] == 4  # uncompressed signer key
    assert found[PADDING] == opened.padding
    assert len(found[EXT_NONCE]) == waku_v1.AES_NONCE_SIZE and len(found[EXT_SIGNATURE]) == 65
    assert found[EXT_VERSION] == 1
    assert record.payload_size == len(b"hello community") + 65
    back = decode_archived_message(Layout.STATUS_GO, record.data, DEFAULT_PUBSUB, {TOPIC: KEY})
    assert back.message == message
    with pytest.raises(ArchiveError, match="channel key"):
        decode_archived_message(Layout.STATUS_GO, record.data, DEFAULT_PUBSUB)


def test_a_record_status_go_wrote_maps_to_seconds_and_the_default_shard():
    raw = (
        field_bytes(SIG, b"\x04" + bytes(64))
        + field_varint(TIMESTAMP, 1_700_000_000)
        + field_bytes(TOPIC_FIELD, bytes.fromhex("0a0b0c0d"))
        + field_bytes(PAYLOAD, b"plain")
        + field_bytes(HASH, bytes(32))
    )
    back = decode_archived_message(Layout.STATUS_GO, raw, DEFAULT_PUBSUB)
    ts = 1_700_000_000 * NS_PER_S
    assert back == ArchivedMessage(DEFAULT_PUBSUB, WakuMessage(b"plain", TOPIC, timestamp=ts), ts)


def test_a_spec_record_is_the_14_waku2_message_plus_the_extension_fields():
    message = WakuMessage(b"p", "/app/1/chat/proto", version=2, timestamp=T, meta=b"x")
    record = encode_archived_message(Layout.SPEC, PUBSUB, message, ARRIVAL)
    found = fields(record.data)
    assert found[1] == b"p" and found[2] == b"/app/1/chat/proto"  # WakuMessage payload, content_topic
    assert found[EXT_PUBSUB_TOPIC] == PUBSUB.encode() and found[EXT_ARRIVAL] == ARRIVAL
    # An extension field may be missing: the caller's shard, the sender time as arrival.
    bare = b"".join(
        field_bytes(n, v) if isinstance(v, bytes) else field_varint(n, v) for n, v in found.items() if n < 1000
    )
    assert decode_archived_message(Layout.SPEC, bare, DEFAULT_PUBSUB) == ArchivedMessage(DEFAULT_PUBSUB, message, T)


def test_status_go_layout_refuses_a_content_topic_it_cannot_hold():
    with pytest.raises(ArchiveError):
        encode_archived_message(Layout.STATUS_GO, PUBSUB, WakuMessage(b"p", "/app/1/chat/proto", timestamp=T), 0)


def _good(layout: Layout) -> bytes:
    payload = waku_v1.encrypt_symmetric(b"body", KEY, SENDER)
    message = WakuMessage(payload, TOPIC, version=1, timestamp=T, meta=b"m")
    return encode_archived_message(layout, PUBSUB, message, ARRIVAL, KEY).data


@pytest.mark.parametrize("layout", list(Layout))
@pytest.mark.parametrize(
    "raw",
    [
        b"\x00",  # field number 0
        b"\x0b",  # wire type 3 (groups)
        b"\xff" * 11,  # varint longer than 10 bytes
        b"\x22\x05ab",  # truncated bytes field
        b"\x09\x00\x00",  # truncated fixed64
        field_bytes(EXT_PUBSUB_TOPIC, b"\xff\xfe") + field_varint(EXT_ARRIVAL, 1),  # not UTF-8
        field_varint(EXT_PUBSUB_TOPIC, 7) + field_varint(EXT_ARRIVAL, 1),  # wrong wire type
        field_bytes(EXT_ARRIVAL, b"x"),
    ],
)
def test_malformed_records_raise_archive_error(layout, raw):
    with pytest.raises(ArchiveError):
        decode_archived_message(layout, raw, DEFAULT_PUBSUB, {TOPIC: KEY})


def test_tampered_status_go_records_are_refused():
    good = _good(Layout.STATUS_GO)
    found = fields(good)

    def rebuilt(changes=None):
        values = {**found, **(changes or {})}
        return b"".join(field_bytes(n, v) if isinstance(v, bytes) else field_varint(n, v) for n, v in values.items())

    assert decode_archived_message(Layout.STATUS_GO, rebuilt(), DEFAULT_PUBSUB, {TOPIC: KEY}).message.meta == b"m"
    for changes, match in [
        ({PAYLOAD: b"other"}, "hash"),
        ({TIMESTAMP: found[TIMESTAMP] + 1}, "timestamp"),
        ({EXT_NONCE: b"short"}, "nonce"),
        ({TOPIC_FIELD: b"\x01\x02"}, "topic"),  # not 4 bytes: a topic error, as an ArchiveError
        ({EXT_PUBSUB_TOPIC: b"/waku/2/rs/16/33"}, "hash"),
    ]:
        with pytest.raises(ArchiveError, match=match):
            decode_archived_message(Layout.STATUS_GO, rebuilt(changes), DEFAULT_PUBSUB, {TOPIC: KEY})


@pytest.mark.parametrize("layout", list(Layout))
@given(data=st.data())
@settings(max_examples=400, deadline=None)
def test_any_bytes_decode_or_raise_archive_error(layout, data):
    good = _good(layout)
    raw = data.draw(
        st.one_of(
            st.binary(max_size=300),
            st.builds(lambda cut: good[:cut], st.integers(0, len(good))),
            st.builds(
                lambda i, b: good[:i] + bytes([b]) + good[i + 1 :], st.integers(0, len(good) - 1), st.integers(0, 255)
            ),
        )
    )
    try:
        decode_archived_message(layout, raw, DEFAULT_PUBSUB, {TOPIC: KEY})
    except ArchiveError:
        pass


# --- many records at once -------------------------------------------------------------


def _split(record: bytes) -> tuple[bytes, list[tuple[int, object]]]:
    """status-go's part of a record (fields below 1000) and the extra fields in order."""
    ext = []
    for number, _wire, value in proto_fields(record):
        if number > 1000:
            ext.append((number, value))
        else:
            assert not ext, "status-go's fields come first"
    return record[: record.index(field_bytes(EXT_PUBSUB_TOPIC, PUBSUB.encode()))], ext


sealed_messages = st.builds(
    lambda body, signed, padding, ts, meta, version, proof: WakuMessage(
        waku_v1.encrypt_symmetric(body, KEY, SENDER if signed else None) if version == 1 else body,
        TOPIC,
        version=version,
        timestamp=ts,
        meta=meta,
        rate_limit_proof=proof,
    ),
    body=st.binary(max_size=300),
    signed=st.booleans(),
    padding=st.none(),
    ts=st.integers(0, 2**62),
    meta=st.binary(max_size=40),
    version=st.sampled_from([0, 1, 1, 1, 2]),
    proof=st.binary(max_size=20),
)


@given(batch=st.lists(st.tuples(sealed_messages, st.integers(1, 2**62)), min_size=1, max_size=8))
@settings(max_examples=60, deadline=None)
def test_the_record_encoder_writes_what_the_protobuf_class_writes(batch):
    """Columns in, records out: status-go's part is what its protobuf class
    serialises for the same values, the extra fields follow in their fixed
    order, a signed channel message carries its signer's uncompressed key,
    and the decoder gives each message back as the table holds it."""
    from coincurve import PrivateKey

    from wakustore.protos import archive_status_go_pb2

    signer = PrivateKey(SENDER).public_key.format(compressed=False)
    columns = [
        [
            PUBSUB,
            m.content_topic,
            m.payload,
            m.meta,
            m.version,
            m.timestamp,
            m.rate_limit_proof,
            a,
            message_hash(PUBSUB, m),
        ]
        for m, a in batch
    ]
    records, sizes = RecordEncoder(Layout.STATUS_GO, {TOPIC: KEY}).encode_columns(*zip(*columns))
    for (message, arrival), record, size, row in zip(batch, records, sizes, columns):
        single = encode_archived_message(Layout.STATUS_GO, PUBSUB, message, arrival, KEY)
        assert record == single.data and size == single.payload_size
        head, ext = _split(record)
        values = fields(head)
        assert (
            archive_status_go_pb2.WakuMessage(
                **{
                    name: values[number]
                    for name, number in (
                        ("sig", SIG),
                        ("timestamp", TIMESTAMP),
                        ("topic", TOPIC_FIELD),
                        ("payload", PAYLOAD),
                        ("padding", PADDING),
                        ("hash", HASH),
                    )
                    if number in values
                }
            ).SerializeToString()
            == head
        )
        assert values[HASH] == message_hash(PUBSUB, message)
        assert values.get(TIMESTAMP, 0) == (message.timestamp or arrival) // NS_PER_S
        numbers = [n for n, _ in ext]
        opened = EXT_NONCE in numbers
        assert opened == (message.version == 1)  # every sealed payload here opens and seals back
        if opened:
            assert values.get(SIG) == (signer if EXT_SIGNATURE in numbers else None)
        expected = (
            [EXT_PUBSUB_TOPIC, EXT_ARRIVAL]
            + ([EXT_NONCE] if opened else [])
            + ([EXT_SIGNATURE] if SIG in values else [])
            + ([EXT_TIMESTAMP] if message.timestamp else [])
            + ([EXT_META] if message.meta else [])
            + ([EXT_VERSION] if message.version else [])
            + ([EXT_PROOF] if message.rate_limit_proof else [])
        )
        assert numbers == expected
        assert RecordDecoder(Layout.STATUS_GO, DEFAULT_PUBSUB, {TOPIC: KEY}).decode(record) == tuple(row)


@pytest.mark.parametrize("layout", list(Layout))
@given(
    batch=st.lists(st.tuples(sealed_messages, st.integers(0, 2**62)), max_size=8),
    unset=st.lists(st.booleans(), min_size=8, max_size=8),
)
@settings(max_examples=60, deadline=None)
def test_framed_records_are_the_records_as_archive_entries(layout, batch, unset):
    """encode_framed: each record of encode_columns framed as field 3 of the
    archive, back to back, with its end offset and payload size (sender
    timestamps unset or not, so that seconds come from either time)."""
    columns = [
        [
            PUBSUB,
            m.content_topic,
            m.payload,
            m.meta,
            m.version,
            0 if gone else m.timestamp,
            m.rate_limit_proof,
            a,
            message_hash(PUBSUB, m),
        ]
        for (m, a), gone in zip(batch, unset)
    ]
    encoder = RecordEncoder(layout, {TOPIC: KEY})
    records, sizes = encoder.encode_columns(*zip(*columns)) if columns else ([], [])
    framed, ends, framed_sizes = encoder.encode_framed(*(zip(*columns) if columns else [[]] * 9))
    assert framed == b"".join(field_bytes(3, r) for r in records) and framed_sizes == sizes
    assert ends == [sum(len(field_bytes(3, r)) for r in records[: i + 1]) for i in range(len(records))]


def test_a_batch_with_a_time_before_1970_is_refused_as_one_record_is():
    encoder = RecordEncoder(Layout.STATUS_GO, {})
    row = [PUBSUB, TOPIC, b"x", b"", 0, -5, b"", ARRIVAL, bytes(32)]
    with pytest.raises(ArchiveError, match="before 1970"):
        encoder.encode_framed(*([value, value] for value in row))


@given(st.lists(st.integers(0, 2**64 - 1), max_size=50))
def test_varints_are_varint_of_each_value(values):
    import numpy as np

    assert varints(np.array(values, dtype=np.uint64)) == [varint(v) for v in values]


def _ext_reference(raw: bytes):
    """The extra fields by the general protobuf reader, last one winning."""
    return {
        number: (wire, value) for number, wire, value in proto_fields(raw) if number > 1000
    }  # status-go's fields stop below 1001


_EXT_FIELD = st.one_of(
    st.tuples(st.integers(1, 2100), st.just(0), st.integers(0, 2**64 - 1)),
    st.tuples(st.integers(1, 2100), st.just(2), st.binary(max_size=300)),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_EXT_FIELD, max_size=8), st.integers(0, 40), st.binary(max_size=12))
def test_ext_fields_reads_what_the_general_reader_reads(fields, cut, tail):
    """The inlined reader of a record's extra fields gives what
    proto_fields gives, and refuses what it refuses (truncated and
    overlong varints, bad wire types), on whole, cut and noisy records."""
    whole = b"".join(
        encode_uvarint(n << 3 | w) + (encode_uvarint(v) if w == 0 else encode_uvarint(len(v)) + v) for n, w, v in fields
    )
    for raw in (whole, whole[: max(0, len(whole) - cut)], whole + tail, whole + b"\xff" * 11):
        try:
            expected = _ext_reference(raw)
        except ArchiveError as exc:
            with pytest.raises(ArchiveError, match=re.escape(str(exc))):
                _ext_fields(raw)
        else:
            assert _ext_fields(raw) == expected
