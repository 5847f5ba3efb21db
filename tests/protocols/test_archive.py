"""Community history archives without I/O: windows, both layouts, padding,
the index, appending, checks on the way back, the magnet-link message."""

import coincurve
import pytest
from hypothesis import given
from hypothesis import strategies as st

from wakustore.protocols import archive, topics, waku_v1
from wakustore.protocols.archive import ArchiveWriter, Chunker, Layout, Window
from wakustore.protocols.crypto import keccak256, recover_public_key
from wakustore.protocols.errors import ArchiveError, ProtocolError
from wakustore.protocols.message import WakuMessage, message_hash
from wakustore.protos import (
    application_metadata_pb2,
    archive_magnetlink_pb2,
    archive_spec_pb2,
    archive_status_go_pb2,
    protocol_message_pb2,
)

L = archive.PIECE_LENGTH
WEEK = archive.ARCHIVE_INTERVAL_S
T0 = 1_700_000_000
PUBSUB = "/waku/2/rs/16/32"
KEY = bytes(range(1, 33))
PUB = coincurve.PrivateKey(KEY).public_key.format()
TOPICS = [topics.channel_content_topic(PUB, c) for c in ("general", "random")]
LAYOUTS = list(Layout)


def encoded(layout, window, count, size=200, topic=TOPICS[0], pubsub=PUBSUB, **fields):
    out = []
    for i in range(count):
        ts = window.start_ns + 1 + i * 1_000_003
        message = WakuMessage(payload=bytes([i % 256]) * size, content_topic=topic, timestamp=ts, **fields)
        out.append(archive.encode_archived_message(layout, pubsub, message, ts + 7).data)
    return out


def build(layout, windows_and_counts, writer=None):
    writer = writer or ArchiveWriter(layout)
    data = b""
    for window, count in windows_and_counts:
        data += writer.add(window, TOPICS, encoded(layout, window, count))
    return writer, data


# --- windows --------------------------------------------------------------------


def test_windows_are_seven_days_from_the_start_and_the_last_is_cut_at_now():
    windows = archive.plan_windows(T0, T0 + 2 * WEEK + 3600)
    assert windows == [
        Window(T0, T0 + WEEK),
        Window(T0 + WEEK, T0 + 2 * WEEK),
        Window(T0 + 2 * WEEK, T0 + 2 * WEEK + 3600),
    ]


def test_thirty_days_offline_gives_one_window_per_missed_week():
    windows = archive.plan_windows(T0, T0 + 30 * 86400)
    assert [w.end_s - w.start_s for w in windows] == [WEEK] * 4 + [2 * 86400]


def test_no_window_when_the_start_is_now():
    assert archive.plan_windows(T0, T0) == []


def test_chunker_cuts_at_the_payload_limit_and_drops_oversized_messages():
    chunker = Chunker(limit=100)
    full = [chunker.add(archive.Record(bytes([i]), 40)) for i in range(5)]
    assert full[:2] == [None, None] and full[2] == [b"\x00", b"\x01"]
    assert chunker.add(archive.Record(b"big", 101)) is None and chunker.dropped == 1
    assert full[4] == [b"\x02", b"\x03"]
    assert chunker.finish() == [b"\x04"] and chunker.finish() is None


@given(sizes=st.lists(st.integers(0, 130), max_size=40), limit=st.integers(1, 120), batch=st.integers(1, 7))
def test_framed_chunks_are_the_chunks_of_one_message_at_a_time(sizes, limit, batch):
    """add_framed over batches cuts where add does, a message at a time,
    and drops the same messages."""
    records = [bytes([i % 256]) * (i % 5 + 1) for i in range(len(sizes))]
    one = Chunker(limit=limit)
    expected = [chunk for r, size in zip(records, sizes) if (chunk := one.add(archive.Record(r, size)))]
    expected += [chunk] if (chunk := one.finish()) else []
    framed = Chunker(limit=limit)
    got = []
    for start in range(0, len(records), batch):
        entries = [archive.field_bytes(3, r) for r in records[start : start + batch]]
        ends = [sum(map(len, entries[: i + 1])) for i in range(len(entries))]
        got += framed.add_framed(b"".join(entries), ends, sizes[start : start + batch])
    got += [last] if (last := framed.finish_framed()) else []
    assert [(b"".join(pieces), count) for pieces, count in got] == [
        (b"".join(archive.field_bytes(3, r) for r in chunk), len(chunk)) for chunk in expected
    ]
    assert framed.dropped == one.dropped


# --- padding ----------------------------------------------------------------------


@pytest.mark.parametrize("raw, padding", [(1, L - 1), (L, 0), (L + 1, L - 1), (2 * L, L), (2 * L + 5, L - 5)])
def test_status_go_padding_rule(raw, padding):
    assert archive.status_go_padding(raw) == padding


def test_status_go_padding_is_zero_bytes_after_the_protobuf():
    writer, data = build(Layout.STATUS_GO, [(Window(T0, T0 + WEEK), 10)])
    entry = writer.entries[0]
    assert len(data) == entry.size == L and data[entry.encoded_size :] == bytes(entry.padding)
    parsed = archive_status_go_pb2.WakuMessageArchive()
    parsed.ParseFromString(data[: entry.encoded_size])
    assert len(parsed.messages) == 10


@pytest.mark.parametrize("size", list(range(L - 420, L - 330, 3)) + [L // 2, 3 * L])
def test_spec_archives_are_whole_pieces_with_zero_padding_inside(size):
    window = Window(T0, T0 + WEEK)
    writer = ArchiveWriter(Layout.SPEC)
    data = writer.add(window, TOPICS, encoded(Layout.SPEC, window, 1, size=size))
    assert len(data) % L == 0 and writer.entries[0].padding == 0
    parsed = archive_spec_pb2.WakuMessageArchive()
    parsed.ParseFromString(data)
    assert not any(parsed.padding) and len(parsed.messages) == 1
    assert parsed.version == archive.SPEC_VERSION and getattr(parsed.metadata, "from") == window.start_ns


# --- layouts as their readers see them -------------------------------------------------


def test_status_go_record_holds_seconds_the_four_byte_topic_and_the_message_hash():
    window = Window(T0, T0 + WEEK)
    writer, data = build(Layout.STATUS_GO, [(window, 3)])
    parsed = archive_status_go_pb2.WakuMessageArchive()
    parsed.ParseFromString(data[: writer.entries[0].encoded_size])
    assert getattr(parsed.metadata, "from") == T0 and parsed.metadata.to == T0 + WEEK
    assert list(parsed.metadata.contentTopic) == [topics.topic_bytes_from_content_topic(t) for t in TOPICS]
    first = parsed.messages[0]
    message = WakuMessage(payload=first.payload, content_topic=TOPICS[0], timestamp=window.start_ns + 1)
    assert first.timestamp == T0 and first.topic == topics.topic_bytes_from_content_topic(TOPICS[0])
    assert first.hash == message_hash(PUBSUB, message) and first.sig == b"" and first.padding == b""


@pytest.mark.parametrize("layout", LAYOUTS)
def test_messages_come_back_exactly_with_pubsub_topic_meta_version_and_arrival(layout):
    window = Window(T0, T0 + WEEK)
    items = encoded(layout, window, 4, meta=b"\x01\x02", version=1, rate_limit_proof=b"p")
    writer = ArchiveWriter(layout)
    data = writer.add(window, TOPICS, items)
    back = archive.read_archive(layout, writer.entries[0], data, "/other/default")
    assert len(back.messages) == 4
    first = back.messages[0]
    assert first.pubsub_topic == PUBSUB and first.arrival_ns == window.start_ns + 8
    assert first.message == WakuMessage(
        payload=b"\x00" * 200,
        content_topic=TOPICS[0],
        version=1,
        timestamp=window.start_ns + 1,
        meta=b"\x01\x02",
        rate_limit_proof=b"p",
    )


def test_an_archive_made_by_status_go_maps_to_seconds_and_the_default_pubsub_topic():
    window = Window(T0, T0 + WEEK)
    topic = topics.topic_bytes_from_content_topic(TOPICS[1])
    record = archive_status_go_pb2.WakuMessage(
        sig=b"\x04" * 65, timestamp=T0 + 60, topic=topic, payload=b"clear", padding=b"\x00", hash=b"h" * 32
    )
    writer = ArchiveWriter(Layout.STATUS_GO)
    data = writer.add(window, TOPICS, [record.SerializeToString()])
    back = archive.read_archive(Layout.STATUS_GO, writer.entries[0], data, "/waku/2/rs/16/64")
    (only,) = back.messages
    assert only.pubsub_topic == "/waku/2/rs/16/64"
    assert only.message == WakuMessage(payload=b"clear", content_topic=TOPICS[1], timestamp=(T0 + 60) * 10**9)


CHANNEL_KEY = archive.channel_key(topics.community_id(PUB), "general")
SENDER = bytes(range(9, 41))


def encrypted_message(window, signed=True, key=CHANNEL_KEY):
    payload = waku_v1.encrypt_symmetric(b"application payload", key, SENDER if signed else None)
    return WakuMessage(payload=payload, content_topic=TOPICS[0], version=1, timestamp=window.start_ns + 5)


def test_channel_key_is_derived_from_the_chat_id_as_status_go_does():
    assert CHANNEL_KEY == waku_v1.key_from_password(topics.community_id(PUB) + "general")
    assert topics.channel_content_topic(PUB, "general") == topics.content_topic_for_name(
        topics.community_id(PUB) + "general"
    )


def test_status_go_record_of_a_channel_message_is_decrypted_and_carries_the_signer():
    # What counts against the 30 MB limit is what status-go counts: payload + sig.
    window = Window(T0, T0 + WEEK)
    message = encrypted_message(window)
    opened = waku_v1.decrypt_symmetric(message.payload, CHANNEL_KEY)
    writer = ArchiveWriter(Layout.STATUS_GO)
    data = writer.add(
        window, TOPICS, [archive.encode_archived_message(Layout.STATUS_GO, PUBSUB, message, 0, CHANNEL_KEY).data]
    )
    parsed = archive_status_go_pb2.WakuMessageArchive()
    parsed.ParseFromString(data[: writer.entries[0].encoded_size])
    (record,) = parsed.messages
    assert record.payload == b"application payload" and record.padding == opened.padding
    assert record.sig == coincurve.PrivateKey(SENDER).public_key.format(compressed=False)
    assert record.hash == message_hash(PUBSUB, message)
    assert archive.encode_archived_message(Layout.STATUS_GO, PUBSUB, message, 0, CHANNEL_KEY).payload_size == 19 + 65
    back = archive.read_archive(
        Layout.STATUS_GO, writer.entries[0], data, PUBSUB, channel_keys={TOPICS[0]: CHANNEL_KEY}
    )
    assert back.messages[0].message == message  # sealed again byte for byte
    with pytest.raises(ArchiveError, match="channel key"):
        archive.read_archive(Layout.STATUS_GO, writer.entries[0], data, PUBSUB)


def _records_both_ways(entry, data, keys):
    """An archive's records read whole (parse_archive) and a record at a time."""
    whole = archive.RecordDecoder(Layout.STATUS_GO, PUBSUB, keys)
    one_by_one = archive.RecordDecoder(Layout.STATUS_GO, PUBSUB, keys)
    one_by_one.parse_archive = lambda body: None
    return (
        whole.parse_archive(memoryview(data)[: entry.encoded_size]),
        archive.read_archive_records(entry, data, whole),
        archive.read_archive_records(entry, data, one_by_one),
    )


def test_a_status_go_archive_is_read_whole_as_it_is_read_a_record_at_a_time():
    window = Window(T0, T0 + WEEK)
    messages = [
        encrypted_message(window),
        encrypted_message(window, signed=False),
        WakuMessage(b"plain", TOPICS[0], timestamp=window.start_ns + 9, meta=b"m", rate_limit_proof=b"p"),
    ]
    writer = ArchiveWriter(Layout.STATUS_GO)
    data = writer.add(
        window,
        TOPICS,
        [
            archive.encode_archived_message(Layout.STATUS_GO, PUBSUB, m, window.start_ns + 5, CHANNEL_KEY).data
            for m in messages
        ],
    )
    parsed, whole, one_by_one = _records_both_ways(writer.entries[0], data, {TOPICS[0]: CHANNEL_KEY})
    assert parsed is not None and len(parsed.messages) == 3
    assert whole == one_by_one and [r[2] for r in whole] == [m.payload for m in messages]


@pytest.mark.parametrize(
    "extra",
    [
        archive.field_bytes(1005, b"not a varint"),  # a known number with another wire type: refused
        archive.field_varint(1004, 0),  # explicit and canonical: read whole
        archive.varint(1005 << 3) + bytes([0x81, 0x80, 0x00]),  # 1005 again, as a longer varint than needed
        archive.field_bytes(1200, b"unknown"),  # ignored
        archive.field_bytes(4, b"payload again"),  # a repeated field, the last one winning
    ],
)
def test_an_archive_read_whole_or_a_record_at_a_time_gives_the_same_rows_or_error(extra):
    window = Window(T0, T0 + WEEK)
    record = archive.encode_archived_message(
        Layout.STATUS_GO, PUBSUB, encrypted_message(window), window.start_ns + 5, CHANNEL_KEY
    ).data
    writer = ArchiveWriter(Layout.STATUS_GO)
    data = writer.add(window, TOPICS, [record + extra])
    keys = {TOPICS[0]: CHANNEL_KEY}
    entry = writer.entries[0]
    outcomes = []
    for whole in (True, False):
        decoder = archive.RecordDecoder(Layout.STATUS_GO, PUBSUB, keys)
        if not whole:
            decoder.parse_archive = lambda body: None
        try:
            outcomes.append(archive.read_archive_records(entry, data, decoder))
        except ArchiveError as exc:
            outcomes.append(str(exc))
    assert outcomes[0] == outcomes[1]


def test_an_archive_with_its_metadata_twice_or_unknown_fields_is_read_a_record_at_a_time():
    window = Window(T0, T0 + WEEK)
    writer = ArchiveWriter(Layout.STATUS_GO)
    data = writer.add(window, TOPICS, encoded(Layout.STATUS_GO, window, 2))
    body = data[: writer.entries[0].encoded_size]
    decoder = archive.RecordDecoder(Layout.STATUS_GO, PUBSUB)
    assert decoder.parse_archive(body) is not None
    (metadata,) = [value for number, _, value in archive.proto_fields(body) if number == 2]
    assert decoder.parse_archive(body + archive.field_bytes(2, metadata)) is None
    assert decoder.parse_archive(body + archive.field_bytes(9, b"?")) is None
    assert archive.RecordDecoder(Layout.SPEC, PUBSUB).parse_archive(body) is None


@pytest.mark.parametrize("signed, key", [(False, CHANNEL_KEY), (True, bytes(range(32)))])
def test_unsigned_or_foreign_payloads_round_trip(signed, key):
    window = Window(T0, T0 + WEEK)
    message = encrypted_message(window, signed=signed, key=key)
    writer = ArchiveWriter(Layout.STATUS_GO)
    data = writer.add(
        window, TOPICS, [archive.encode_archived_message(Layout.STATUS_GO, PUBSUB, message, 0, CHANNEL_KEY).data]
    )
    parsed = archive_status_go_pb2.WakuMessageArchive()
    parsed.ParseFromString(data[: writer.entries[0].encoded_size])
    assert parsed.messages[0].sig == b""
    opened_here = key == CHANNEL_KEY
    assert (parsed.messages[0].payload == b"application payload") is opened_here
    back = archive.read_archive(
        Layout.STATUS_GO, writer.entries[0], data, PUBSUB, channel_keys={TOPICS[0]: CHANNEL_KEY}
    )
    assert back.messages[0].message == message


def test_the_other_layout_does_not_read():
    writer, data = build(Layout.STATUS_GO, [(Window(T0, T0 + WEEK), 2)])
    with pytest.raises(ArchiveError):
        archive.parse_index(Layout.SPEC, writer.index_bytes(), len(data))


# --- index and appending ---------------------------------------------------------------


@pytest.mark.parametrize("layout", LAYOUTS)
def test_index_keys_are_keccak_of_the_encoded_metadata(layout):
    writer, data = build(layout, [(Window(T0, T0 + WEEK), 5), (Window(T0 + WEEK, T0 + 2 * WEEK), 700)])
    index_class = archive_spec_pb2 if layout is Layout.SPEC else archive_status_go_pb2
    index = index_class.WakuMessageArchiveIndex()
    index.ParseFromString(writer.index_bytes())
    assert len(index.archives) == 2
    for key, value in index.archives.items():
        assert key == "0x" + keccak256(value.SerializeToString()).hex()
    entries = archive.parse_index(layout, writer.index_bytes(), len(data))
    assert [e.offset for e in entries] == [0, entries[0].size]
    assert entries[1].pieces() == range(entries[0].size // L, len(data) // L)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_appending_keeps_the_previous_data_byte_for_byte(layout):
    first, data = build(layout, [(Window(T0, T0 + WEEK), 30)])
    second, more = build(
        layout, [(Window(T0 + WEEK, T0 + 2 * WEEK), 30)], ArchiveWriter(layout, first.index_bytes(), len(data))
    )
    assert [e.archive_id for e in second.entries[:1]] == [first.entries[0].archive_id]
    assert second.new_entries[0].offset == len(data)
    entries = archive.parse_index(layout, second.index_bytes(), len(data + more))
    assert [e.archive_id for e in entries] == [first.entries[0].archive_id, second.new_entries[0].archive_id]
    rebuilt, again = build(layout, [(Window(T0, T0 + WEEK), 30), (Window(T0 + WEEK, T0 + 2 * WEEK), 30)])
    assert again == data + more and rebuilt.index_bytes() == second.index_bytes()


def test_writer_refuses_data_the_index_does_not_describe():
    writer, data = build(Layout.STATUS_GO, [(Window(T0, T0 + WEEK), 3)])
    with pytest.raises(ArchiveError):
        ArchiveWriter(Layout.STATUS_GO, writer.index_bytes(), len(data) + L)
    with pytest.raises(ArchiveError):
        ArchiveWriter(Layout.STATUS_GO, None, len(data))


def test_index_with_a_key_that_is_not_its_hash_is_refused():
    writer, data = build(Layout.STATUS_GO, [(Window(T0, T0 + WEEK), 3)])
    index = archive_status_go_pb2.WakuMessageArchiveIndex()
    index.ParseFromString(writer.index_bytes())
    (key,) = list(index.archives)
    index.archives["0x" + "00" * 32].CopyFrom(index.archives[key])
    del index.archives[key]
    with pytest.raises(ArchiveError, match="not the hash"):
        archive.parse_index(Layout.STATUS_GO, index.SerializeToString(), len(data))


def test_index_with_a_gap_between_archives_is_refused():
    index = archive_status_go_pb2.WakuMessageArchiveIndex()
    metadata = archive_status_go_pb2.WakuMessageArchiveIndexMetadata(offset=L, size=L, padding=L - 10)
    index.archives[archive.archive_key(metadata.SerializeToString())].CopyFrom(metadata)
    with pytest.raises(ArchiveError, match="does not follow"):
        archive.parse_index(Layout.STATUS_GO, index.SerializeToString())


def test_index_whose_padding_breaks_the_rule_is_refused():
    index = archive_status_go_pb2.WakuMessageArchiveIndex()
    metadata = archive_status_go_pb2.WakuMessageArchiveIndexMetadata(offset=0, size=2 * L, padding=0)
    index.archives[archive.archive_key(metadata.SerializeToString())].CopyFrom(metadata)
    with pytest.raises(ArchiveError, match="padding"):
        archive.parse_index(Layout.STATUS_GO, index.SerializeToString())


# --- checks on the way back -----------------------------------------------------------------


def one_archive(layout, items, window=Window(T0, T0 + WEEK)):
    writer = ArchiveWriter(layout)
    data = writer.add(window, TOPICS, items)
    return writer.entries[0], data


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_message_on_a_foreign_topic_is_refused(layout):
    window = Window(T0, T0 + WEEK)
    foreign = topics.channel_content_topic(PUB, "not-listed")
    entry, data = one_archive(layout, encoded(layout, window, 2, topic=foreign))
    with pytest.raises(ArchiveError, match="not the community's"):
        archive.read_archive(layout, entry, data, PUBSUB)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_only_allowed_topics_pass_when_the_member_names_them(layout):
    window = Window(T0, T0 + WEEK)
    entry, data = one_archive(layout, encoded(layout, window, 2, topic=TOPICS[1]))
    with pytest.raises(ArchiveError):
        archive.read_archive(layout, entry, data, PUBSUB, allowed_topics=[TOPICS[0]])


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_message_outside_the_window_is_refused(layout):
    window = Window(T0, T0 + WEEK)
    late = encoded(layout, Window(T0 + WEEK, T0 + 2 * WEEK), 1)
    entry, data = one_archive(layout, late, window)
    with pytest.raises(ArchiveError, match="outside"):
        archive.read_archive(layout, entry, data, PUBSUB)


def test_a_status_go_record_whose_hash_does_not_match_is_refused():
    window = Window(T0, T0 + WEEK)
    (item,) = encoded(Layout.STATUS_GO, window, 1)
    record = archive_status_go_pb2.WakuMessage()
    record.ParseFromString(item)
    record.payload = b"forged" + record.payload[6:]
    entry, data = one_archive(Layout.STATUS_GO, [record.SerializeToString()])
    with pytest.raises(ArchiveError, match="hash"):
        archive.read_archive(Layout.STATUS_GO, entry, data, PUBSUB)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_corrupted_bytes_are_an_archive_error(layout):
    # A flipped payload byte shows only where the record names its message
    # (status-go's hash); in the spec layout the torrent's piece hashes
    # are what catches it.
    window = Window(T0, T0 + WEEK)
    entry, data = one_archive(layout, encoded(layout, window, 20))
    payload_byte = [100] if layout is Layout.STATUS_GO else []
    for position in [0, 5, entry.encoded_size - 3, entry.size - 1] + payload_byte:
        broken = bytearray(data)
        broken[position] ^= 0xFF
        with pytest.raises(ArchiveError):
            archive.read_archive(layout, entry, bytes(broken), PUBSUB)
    with pytest.raises(ArchiveError):
        archive.read_archive(layout, entry, data[:-1], PUBSUB)


def test_archive_error_is_a_protocol_error():
    assert issubclass(ArchiveError, ProtocolError)


# --- the magnet-link message -------------------------------------------------------------------


def test_magnet_message_is_type_43_signed_over_keccak_of_the_payload():
    raw = archive.encode_magnet_message(KEY, "magnet:?xt=urn:btih:" + "ab" * 20, 1234)
    wrapper = application_metadata_pb2.ApplicationMetadataMessage()
    wrapper.ParseFromString(raw)
    assert wrapper.type == 43 and len(wrapper.signature) == 65 and wrapper.signature[64] in (0, 1)
    assert recover_public_key(wrapper.signature, keccak256(wrapper.payload)) == PUB
    link = archive_magnetlink_pb2.CommunityMessageArchiveMagnetlink()
    link.ParseFromString(wrapper.payload)
    assert (link.clock, link.magnet_uri) == (1234, "magnet:?xt=urn:btih:" + "ab" * 20)
    assert archive.verify_magnet_message(raw, PUB) == archive.MagnetLink(1234, link.magnet_uri, PUB)


def test_magnet_message_signed_by_another_key_is_refused():
    raw = archive.encode_magnet_message(bytes(range(2, 34)), "magnet:?xt=urn:btih:" + "ab" * 20, 1)
    assert archive.decode_magnet_message(raw).signer != PUB
    with pytest.raises(ArchiveError, match="not by the control node"):
        archive.verify_magnet_message(raw, PUB)


def test_tampered_or_mistyped_magnet_messages_are_refused():
    raw = archive.encode_magnet_message(KEY, "magnet:?xt=urn:btih:" + "ab" * 20, 1)
    wrapper = application_metadata_pb2.ApplicationMetadataMessage()
    wrapper.ParseFromString(raw)
    tampered = application_metadata_pb2.ApplicationMetadataMessage()
    tampered.CopyFrom(wrapper)
    tampered.payload = wrapper.payload.replace(b"ab", b"cd", 1)
    with pytest.raises(ArchiveError):
        archive.verify_magnet_message(tampered.SerializeToString(), PUB)
    retyped = application_metadata_pb2.ApplicationMetadataMessage()
    retyped.CopyFrom(wrapper)
    retyped.type = 1
    with pytest.raises(ArchiveError, match="type"):
        archive.decode_magnet_message(retyped.SerializeToString())
    with pytest.raises(ArchiveError):
        archive.decode_magnet_message(b"\xff\xff")


# --- the magnet link on the wire (status-go's form) ----------------------------------------

MAGNET_CHAT = topics.magnet_chat_id(PUB)
MAGNET_URI = "magnet:?xt=urn:btih:" + "ab" * 20


def test_wrapped_magnet_is_a_signed_symmetric_payload_holding_a_protocol_message():
    raw = archive.encode_magnet_message(KEY, MAGNET_URI, 77)
    wrapped = archive.wrap_magnet_for_status(raw, MAGNET_CHAT, KEY, installation_id="device-1")
    assert MAGNET_CHAT == "0x" + PUB.hex() + "-magnetlinks"
    # status-go: AddSymKeyFromPassword(chatID), then Waku v1 payload decoding.
    opened = waku_v1.decrypt_symmetric(wrapped, waku_v1.key_from_password(MAGNET_CHAT))
    assert opened.signature_public_key == PUB
    message = protocol_message_pb2.ProtocolMessage()
    message.ParseFromString(opened.payload)
    assert (message.installation_id, message.public_message) == ("device-1", raw)
    # Field numbers as in status-go protocol/encryption/protocol_message.proto.
    assert opened.payload.startswith(b"\x12\x08device-1\xb2\x06")


def test_wrapped_magnet_round_trips_and_verifies():
    raw = archive.encode_magnet_message(KEY, MAGNET_URI, 77)
    wrapped = archive.wrap_magnet_for_status(raw, MAGNET_CHAT, KEY)
    assert wrapped != archive.wrap_magnet_for_status(raw, MAGNET_CHAT, KEY)  # random nonce and padding
    assert archive.unwrap_magnet_payload(wrapped, MAGNET_CHAT) == raw
    link = archive.verify_magnet_message(archive.unwrap_magnet_payload(wrapped, MAGNET_CHAT), PUB)
    assert link == archive.MagnetLink(77, MAGNET_URI, PUB)


def test_plain_magnet_payload_is_still_accepted():
    raw = archive.encode_magnet_message(KEY, MAGNET_URI, 5)
    assert archive.unwrap_magnet_payload(raw, MAGNET_CHAT) == raw


def test_transport_payload_without_protocol_message_falls_back_to_its_content():
    # status-go keeps the decrypted bytes when the encryption layer does not apply.
    raw = archive.encode_magnet_message(KEY, MAGNET_URI, 5)
    sealed = waku_v1.encrypt_symmetric(raw, waku_v1.key_from_password(MAGNET_CHAT), signing_key=KEY)
    assert archive.unwrap_magnet_payload(sealed, MAGNET_CHAT) == raw


def test_wrapped_magnet_for_another_chat_or_garbage_is_refused():
    raw = archive.encode_magnet_message(KEY, MAGNET_URI, 5)
    wrapped = archive.wrap_magnet_for_status(raw, MAGNET_CHAT, KEY)
    other_chat = topics.magnet_chat_id(coincurve.PrivateKey(bytes(range(2, 34))).public_key.format())
    with pytest.raises(ArchiveError):
        archive.unwrap_magnet_payload(wrapped, other_chat)
    with pytest.raises(ArchiveError):
        archive.unwrap_magnet_payload(wrapped[:-1], MAGNET_CHAT)
    for garbage in (b"", b"\xff\xff", bytes(300)):
        with pytest.raises(ArchiveError):
            archive.unwrap_magnet_payload(garbage, MAGNET_CHAT)
    key = waku_v1.key_from_password(MAGNET_CHAT)
    unsigned = waku_v1.encrypt_symmetric(
        protocol_message_pb2.ProtocolMessage(public_message=raw).SerializeToString(), key
    )
    with pytest.raises(ArchiveError, match="signature"):
        archive.unwrap_magnet_payload(unsigned, MAGNET_CHAT)
    not_a_magnet = waku_v1.encrypt_symmetric(
        protocol_message_pb2.ProtocolMessage(public_message=b"\x1a\x01x").SerializeToString(), key, signing_key=KEY
    )
    with pytest.raises(ArchiveError):
        archive.unwrap_magnet_payload(not_a_magnet, MAGNET_CHAT)


def test_wrapping_needs_a_valid_signing_key():
    raw = archive.encode_magnet_message(KEY, MAGNET_URI, 5)
    with pytest.raises(ArchiveError):
        archive.wrap_magnet_for_status(raw, MAGNET_CHAT, bytes(32))
