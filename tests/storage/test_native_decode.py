"""The compiled archive decoder (native/native.c) against the reference
decoder: the same table rows for every archive it reads, and None (the
reference then reads it, or says what is wrong) for anything else."""

import coincurve
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wakustore import _native
from wakustore.protocols import archive, topics, waku_v1
from wakustore.protocols.archive import ArchiveWriter, Layout, Window
from wakustore.protocols.errors import ArchiveError
from wakustore.protocols.message import WakuMessage
from wakustore.protos import archive_status_go_pb2
from wakustore.storage.key_filter import KeyFilter
from wakustore.storage.rows import archive_columns_to_arrow, records_to_arrow

WEEK = archive.ARCHIVE_INTERVAL_S
T0 = 1_700_000_000
WINDOW = Window(T0, T0 + WEEK)
PUBSUB = "/waku/2/rs/16/32"
DEFAULT_PUBSUB = "/waku/2/rs/16/64"
PUB = coincurve.PrivateKey(bytes(range(1, 33))).public_key.format()
TOPICS = [topics.channel_content_topic(PUB, c) for c in ("general", "random", "plain")]
KEYS = {
    TOPICS[0]: archive.channel_key(topics.community_id(PUB), "general"),
    TOPICS[1]: archive.channel_key(topics.community_id(PUB), "random"),
}
SENDER = bytes(range(9, 41))


def sealed(topic, i, signed=True, size=40):
    payload = waku_v1.encrypt_symmetric(bytes([i % 251]) * size, KEYS[topic], SENDER if signed else None)
    return WakuMessage(payload=payload, content_topic=topic, version=1, timestamp=WINDOW.start_ns + 5 + i)


def records():
    """Every kind of record an archive of this node holds, and one status-go made."""
    items = []
    for i in range(6):
        message = sealed(TOPICS[i % 2], i, signed=i % 3 != 0, size=10 + 300 * i)
        items.append(
            archive.encode_archived_message(
                Layout.STATUS_GO, PUBSUB, message, WINDOW.start_ns + 50 + i, KEYS[message.content_topic]
            ).data
        )
    plain = [
        WakuMessage(b"plain", TOPICS[2], timestamp=WINDOW.start_ns + 9, meta=b"m" * 40, rate_limit_proof=b"proof"),
        WakuMessage(b"", TOPICS[2], version=7, meta=b"short"),  # no timestamp: ordered by arrival
        WakuMessage(b"\x00" * 70_000, TOPICS[1], timestamp=WINDOW.start_ns + 11),  # opaque bytes on a keyed channel
    ]
    items += [
        archive.encode_archived_message(Layout.STATUS_GO, pubsub, m, WINDOW.start_ns + 77).data
        for m, pubsub in zip(plain, (PUBSUB, "/waku/2/other", PUBSUB))
    ]
    made_by_status_go = archive_status_go_pb2.WakuMessage(
        sig=b"\x04" * 65,
        timestamp=T0 + 60,
        topic=topics.topic_bytes_from_content_topic(TOPICS[1]),
        payload=b"clear",
        padding=b"\x00",
        hash=b"h" * 32,
    )
    items.append(made_by_status_go.SerializeToString())
    return items


def one_archive(items):
    writer = ArchiveWriter(Layout.STATUS_GO)
    data = writer.add(WINDOW, TOPICS, items)
    return writer.entries[0], data


def both(entry, data, keys=KEYS, allowed=None):
    """(the compiled decoder's table or None, the reference's table or its error)."""
    columns = archive.archive_columns(
        entry, data, archive.RecordDecoder(Layout.STATUS_GO, DEFAULT_PUBSUB, keys), allowed
    )
    native = None if columns is None else archive_columns_to_arrow(columns)
    reference = archive.RecordDecoder(Layout.STATUS_GO, DEFAULT_PUBSUB, keys)
    try:
        expected = records_to_arrow(list(archive.iter_archive_records(entry, data, reference, allowed)))
    except ArchiveError as exc:
        expected = exc
    return native, expected


def test_every_kind_of_record_decodes_to_the_reference_rows():
    entry, data = one_archive(records())
    native, expected = both(entry, data)
    assert native is not None and not isinstance(expected, Exception)
    assert native.num_rows == 10 and native.equals(expected)
    assert set(native.column("pubsub_topic").to_pylist()) == {PUBSUB, "/waku/2/other", DEFAULT_PUBSUB}
    # Sealed again byte for byte: the hashes are the control node's.
    assert native.column("payload")[0].as_py().endswith(records_and_nonce_of(data, entry)[0])


def records_and_nonce_of(data, entry):
    parsed = archive_status_go_pb2.ArchivedMessages()
    parsed.ParseFromString(data[: entry.encoded_size])
    return [m.nonce for m in parsed.messages]


def test_an_archive_of_many_windows_worth_decodes_the_same():
    items = []
    for i in range(2_000):
        message = sealed(TOPICS[i % 2], i, signed=i % 2 == 0, size=i % 700)
        items.append(
            archive.encode_archived_message(
                Layout.STATUS_GO, PUBSUB, message, WINDOW.start_ns + i, KEYS[message.content_topic]
            ).data
        )
    entry, data = one_archive(items)
    native, expected = both(entry, data)
    assert native is not None and native.equals(expected) and native.num_rows == 2_000


@pytest.mark.parametrize("case", ["no key", "foreign topic", "not allowed", "outside the window", "forged"])
def test_what_the_reference_refuses_is_left_to_it(case):
    items, keys, allowed = records(), KEYS, None
    if case == "no key":
        keys = {TOPICS[1]: KEYS[TOPICS[1]]}
    elif case == "foreign topic":
        items.append(
            archive.encode_archived_message(
                Layout.STATUS_GO,
                PUBSUB,
                WakuMessage(b"x", topics.channel_content_topic(PUB, "elsewhere"), timestamp=WINDOW.start_ns + 1),
                WINDOW.start_ns + 2,
            ).data
        )
    elif case == "not allowed":
        allowed = [TOPICS[0], TOPICS[1]]
    elif case == "outside the window":
        items.append(
            archive.encode_archived_message(
                Layout.STATUS_GO, PUBSUB, WakuMessage(b"x", TOPICS[2], timestamp=WINDOW.end_ns + 1), WINDOW.end_ns + 2
            ).data
        )
    else:
        record = archive_status_go_pb2.ArchivedMessage()
        record.ParseFromString(items[6])
        record.payload = b"forged"
        items[6] = record.SerializeToString()
    entry, data = one_archive(items)
    native, expected = both(entry, data, keys, allowed)
    assert native is None and isinstance(expected, ArchiveError)


@pytest.mark.parametrize(
    "extra",
    [
        archive.field_bytes(1005, b"not a varint"),
        archive.field_varint(1004, 0),
        archive.varint(1005 << 3) + bytes([0x81, 0x80, 0x00]),
        archive.field_bytes(1200, b"unknown"),
        archive.field_bytes(4, b"payload again"),
        archive.field_bytes(7, b"third party"),
        archive.field_varint(1004, 1 << 31),
        archive.field_varint(1005, 1 << 63),
    ],
)
def test_records_outside_the_plain_form_read_as_the_reference_reads_them(extra):
    items = records()
    items[1] += extra
    entry, data = one_archive(items)
    native, expected = both(entry, data)
    assert native is None or native.equals(expected)


@settings(max_examples=300, deadline=None)
@given(
    edits=st.lists(st.tuples(st.integers(0, 10**9), st.integers(0, 255)), min_size=1, max_size=4),
    cut=st.integers(0, 40),
)
def test_a_damaged_archive_decodes_to_the_reference_rows_or_not_at_all(edits, cut):
    """Bytes of the body changed (or the end cut): whatever the compiled
    decoder returns is the reference's rows, and it returns nothing where
    the reference refuses the archive."""
    entry, data = one_archive(records())
    broken = bytearray(data)
    for position, value in edits:
        broken[position % entry.encoded_size] = value
    if cut:
        broken[entry.encoded_size - cut : entry.encoded_size] = bytes(cut)
    native, expected = both(entry, bytes(broken))
    if isinstance(expected, Exception):
        assert native is None
    elif native is not None:
        assert native.equals(expected)


@pytest.mark.parametrize("bad", [b"", b"\x00" * 7, b"\x00" * 24])
def test_bloom_refuses_bit_arrays_that_are_not_a_power_of_two(bad):
    with pytest.raises(ValueError):
        _native.bloom_add(bytearray(bad), b"\x00" * 16, 3)


@pytest.mark.parametrize("probes", [1, 7, 14])
def test_bloom_sets_the_bits_of_double_hashing(probes):
    """Probe j of a key (h1, h2) is bit (h1 + j * (h2 | 1)) mod 2^64 of the
    array, masked: the positions storage.key_filter has always used."""
    rng = np.random.default_rng(probes)
    words = rng.integers(0, 2**64 - 1, size=(500, 2), dtype=np.uint64, endpoint=True)
    bits = np.zeros(4096, dtype=np.uint8)
    _native.bloom_add(bits, words, probes)
    expected = np.zeros_like(bits)
    with np.errstate(over="ignore"):
        positions = (
            words[:, :1] + np.arange(probes, dtype=np.uint64)[None, :] * (words[:, 1:] | np.uint64(1))
        ) & np.uint64(bits.size * 8 - 1)
    for position in positions.ravel().tolist():
        expected[position >> 3] |= 1 << (position & 7)
    assert np.array_equal(bits, expected)
    assert np.frombuffer(_native.bloom_test(bits, words, probes), bool).all()
    others = rng.integers(0, 2**64 - 1, size=(2_000, 2), dtype=np.uint64, endpoint=True)
    found = np.frombuffer(_native.bloom_test(bits, others, probes), bool)
    with np.errstate(over="ignore"):
        probe = (
            others[:, :1] + np.arange(probes, dtype=np.uint64)[None, :] * (others[:, 1:] | np.uint64(1))
        ) & np.uint64(bits.size * 8 - 1)
    assert np.array_equal(
        found,
        ((bits[(probe >> np.uint64(3)).astype(np.int64)] >> (probe & np.uint64(7)).astype(np.uint8)) & 1).all(axis=1),
    )


def test_a_key_filter_answers_for_its_keys():
    keys = [bytes([i % 256, i // 256]) * 16 for i in range(3_000)]
    f = KeyFilter(capacity=10_000)
    f.add(keys)
    assert f.might_contain(keys).all() and f.count == 3_000
