"""An archive decoded a column at a time (storage/archive_rows.py): the
rows the record-at-a-time reference makes, and never rows where the
reference refuses the archive."""

import hashlib

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wakustore.node import archive_work
from wakustore.protocols import archive, waku_v1
from wakustore.protocols.archive import ArchiveWriter, Layout, RecordDecoder, RecordEncoder, Window
from wakustore.protocols.archive_records import EXT_ARRIVAL, channel_key, field_bytes, field_varint
from wakustore.protocols.errors import ArchiveError
from wakustore.protocols.message import WakuMessage, message_hash
from wakustore.protos import archive_status_go_pb2
from wakustore.storage import archive_rows, schema
from wakustore.storage.rows import records_to_arrow

PUBSUBS = ("/waku/2/rs/16/32", "/waku/2/rs/16/64")
TOPICS = ("/waku/1/0x0a0b0c0d/rfc26", "/waku/1/0x01020304/rfc26", "/waku/1/0xffffffff/rfc26")
KEYS = {TOPICS[0]: channel_key("0x02" + "ab" * 32, "general"), TOPICS[1]: channel_key("0x02" + "ab" * 32, "random")}
SENDER = bytes(range(5, 37))
WINDOW = Window(1_700_000_000, 1_700_000_000 + 7 * 86400)
SPAN = WINDOW.end_ns - WINDOW.start_ns
DEFAULT_PUBSUB = "/waku/2/default-waku/proto"


def _payload(kind: str, body: bytes, topic: str) -> bytes:
    key = KEYS.get(topic, KEYS[TOPICS[0]])
    if kind == "signed":
        return waku_v1.encrypt_symmetric(body, key, SENDER)
    if kind == "unsigned":
        return waku_v1.encrypt_symmetric(body, key, None)
    if kind == "other key":
        return waku_v1.encrypt_symmetric(body, bytes([7]) * 32, SENDER)
    return body


rows = st.tuples(
    st.sampled_from(["signed", "signed", "unsigned", "other key", "opaque"]), st.binary(max_size=700),
    st.sampled_from(TOPICS), st.sampled_from(PUBSUBS), st.sampled_from([0, 1, 1, 1, 2**31 - 1]),
    st.one_of(st.just(0), st.integers(0, SPAN - 1)), st.integers(0, SPAN - 1), st.binary(max_size=40),
    st.binary(max_size=20),
)


def _archive(batch) -> tuple[archive.IndexEntry, bytes]:
    encoder = RecordEncoder(Layout.STATUS_GO, KEYS)
    records = []
    for kind, body, topic, pubsub, version, stamp, arrival, meta, proof in batch:
        payload = _payload(kind, body, topic) if version == 1 else body
        stamp = WINDOW.start_ns + stamp if stamp else 0
        message = WakuMessage(payload, topic, version=version, timestamp=stamp, meta=meta, rate_limit_proof=proof)
        records.append(encoder.status_go(pubsub, topic, payload, meta, version, stamp, proof,
                                         WINDOW.start_ns + arrival, message_hash(pubsub, message))[0])
    writer = ArchiveWriter(Layout.STATUS_GO, piece_length=1024)
    data = writer.add(WINDOW, TOPICS, records)
    return writer.entries[0], data


def _reference(entry, data, allowed=None) -> pa.Table | ArchiveError:
    decoder = RecordDecoder(Layout.STATUS_GO, DEFAULT_PUBSUB, KEYS)
    try:
        return records_to_arrow(list(archive.iter_archive_records(entry, data, decoder, allowed)))
    except ArchiveError as exc:
        return exc


def _fast(entry, data, allowed=None) -> pa.Table | None:
    """The fast road's rows; None when it hands the archive back."""
    batches = archive_rows.decode_rows(RecordDecoder(Layout.STATUS_GO, DEFAULT_PUBSUB, KEYS), entry, data, allowed)
    if batches is None:
        return None
    try:
        tables = list(batches)
    except archive_rows.Unchecked:
        return None
    return pa.concat_tables(tables) if tables else schema.MESSAGES.empty_table()


@given(batch=st.lists(rows, min_size=1, max_size=30), small_batches=st.booleans())
@settings(max_examples=120, deadline=None)
def test_an_archive_of_ours_decodes_to_the_rows_the_reference_makes(batch, small_batches, monkeypatch_module):
    monkeypatch_module.setattr(archive_rows, "BATCH_ROWS", 7 if small_batches else 4096)
    entry, data = _archive(batch)
    expected = _reference(entry, data)
    assert isinstance(expected, pa.Table)
    got = _fast(entry, data)
    assert got is not None and got.equals(expected)


@given(batch=st.lists(rows, min_size=1, max_size=6), cuts=st.lists(
    st.tuples(st.sampled_from(["flip", "insert", "delete"]), st.integers(0, 10**6), st.binary(min_size=1, max_size=3)),
    min_size=1, max_size=3))
@settings(max_examples=300, deadline=None)
def test_a_damaged_archive_is_never_read_differently(batch, cuts):
    """Whatever the damage, the fast road gives the reference's rows or
    hands the archive back: never rows the reference would refuse."""
    entry, data = _archive(batch)
    body = bytearray(data[: entry.encoded_size])
    for kind, at, value in cuts:
        at %= len(body)
        if kind == "flip":
            body[at] ^= value[0] or 1
        elif kind == "insert":
            body[at:at] = value
        else:
            del body[at : at + len(value)]
    damaged = bytes(body)
    entry = archive.IndexEntry(entry.archive_id, entry.start_ns, entry.end_ns, entry.content_topics, 0,
                               len(damaged), 0)
    got = _fast(entry, damaged)
    if got is not None:
        expected = _reference(entry, damaged)
        assert isinstance(expected, pa.Table) and got.equals(expected)


def _one(**changes) -> tuple[archive.IndexEntry, bytes]:
    """An archive of one sealed record, some of its fields replaced (raw
    bytes appended to the record: protobuf keeps the last)."""
    encoder = RecordEncoder(Layout.STATUS_GO, KEYS)
    payload = waku_v1.encrypt_symmetric(b"hello", KEYS[TOPICS[0]], SENDER)
    stamp = WINDOW.start_ns + 5
    message = WakuMessage(payload, TOPICS[0], version=1, timestamp=stamp)
    record = encoder.status_go(PUBSUBS[0], TOPICS[0], payload, b"", 1, stamp, b"", stamp + 1,
                               message_hash(PUBSUBS[0], message))[0]
    record = changes.get("replace", lambda r: r)(record) + changes.get("append", b"")
    writer = ArchiveWriter(Layout.STATUS_GO, piece_length=1024)
    data = writer.add(WINDOW, TOPICS, [record])
    return writer.entries[0], data


@pytest.mark.parametrize("append, why", [
    (field_bytes(6, b"\x00" * 32), "a hash that is not the message's"),
    (field_varint(2, 1), "seconds that are not the timestamp's"),
    (field_bytes(3, b"\x01\x02\x03"), "a topic of three bytes"),
    (field_bytes(3, bytes.fromhex("deadbeef")), "a topic outside the archive's"),
    (field_bytes(1007, b"\x00" * 11), "a short nonce"),
    (field_bytes(7, b"\xff"), "a thirdPartyId, which protobuf checks as UTF-8"),
    (field_varint(999, 1), "an unknown field"),
    (field_bytes(2, b"\x00"), "a known field of the wrong wire type"),
    (field_varint(1005, WINDOW.end_ns + 1) + field_varint(1001, 0), "a time outside the window"),
])
def test_each_refusal_of_the_reference_is_left_to_it(append, why):
    entry, data = _one(append=append)
    assert _fast(entry, data) is None, why
    assert isinstance(_reference(entry, data), (ArchiveError, pa.Table))


def test_a_record_of_status_go_itself_is_left_to_the_reference():
    record = archive_status_go_pb2.WakuMessage(sig=b"\x04" * 65, timestamp=WINDOW.start_s + 60,
                                               topic=bytes.fromhex("0a0b0c0d"), payload=b"clear", hash=b"h" * 32)
    writer = ArchiveWriter(Layout.STATUS_GO, piece_length=1024)
    data = writer.add(WINDOW, TOPICS, [record.SerializeToString()])
    assert archive_rows.decode_rows(RecordDecoder(Layout.STATUS_GO, DEFAULT_PUBSUB, KEYS), writer.entries[0],
                                    data) is None
    assert _reference(writer.entries[0], data).num_rows == 1


def test_a_missing_arrival_or_a_window_unlike_the_index_s_is_left_to_the_reference():
    entry, data = _one(replace=lambda r: r.replace(field_varint(EXT_ARRIVAL, WINDOW.start_ns + 6), b""))
    assert _fast(entry, data) is None
    writer = ArchiveWriter(Layout.STATUS_GO, piece_length=1024)
    good = writer.add(WINDOW, TOPICS, [])
    assert _fast(writer.entries[0], good).equals(_reference(writer.entries[0], good))  # no record at all
    other = archive.IndexEntry("0x00", WINDOW.start_ns, WINDOW.end_ns + 10**9, TOPICS, 0, len(good),
                               writer.entries[0].padding)
    assert _fast(other, good) is None


def test_only_allowed_topics_are_read():
    entry, data = _one()
    assert _fast(entry, data, allowed=[TOPICS[1]]) is None
    assert isinstance(_reference(entry, data, allowed=[TOPICS[1]]), ArchiveError)
    assert _fast(entry, data, allowed=[TOPICS[0]]).num_rows == 1


def test_a_missing_channel_key_is_left_to_the_reference():
    entry, data = _one()
    decoder = RecordDecoder(Layout.STATUS_GO, DEFAULT_PUBSUB, {})
    assert archive_rows.decode_rows(decoder, entry, data) is None


def test_the_worker_falls_back_and_raises_the_reference_s_error(tmp_path):
    """A record whose hash does not match passes the first checks: the
    fast road stops at its batch and the reference names the record."""
    entry, data = _one(append=field_bytes(6, hashlib.sha256(b"x").digest()))
    path = tmp_path / "data"
    path.write_bytes(data)
    keys = archive_work.key_items(KEYS)
    with pytest.raises(ArchiveError, match="message 0: message hash does not match"):
        archive_work.decode_archive(path, entry, Layout.STATUS_GO, DEFAULT_PUBSUB, None, keys, tmp_path / "rows")
    good_entry, good = _one()
    path.write_bytes(good)
    out = archive_work.decode_archive(path, good_entry, Layout.STATUS_GO, DEFAULT_PUBSUB, None, keys,
                                      tmp_path / "rows")
    assert archive_work.rows_of(out).equals(_reference(good_entry, good))
    table = archive_work.decode_archive(path, good_entry, Layout.STATUS_GO, DEFAULT_PUBSUB, None, keys)
    assert table.equals(_reference(good_entry, good))


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch
