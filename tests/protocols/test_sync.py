"""WAKU-SYNC codecs and the reconciliation state machine (protocols/sync.py)."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from wakustore.protocols import sync
from wakustore.protocols.errors import SyncError
from wakustore.protocols.message import WakuMessage
from wakustore.protocols.sync import Range, RangesData, RangeType, Session, SessionLimits

TOPIC = "/waku/2/rs/16/32"
Z = sync.ZERO_HASH


def h(byte: int) -> bytes:
    return bytes([byte]) * 32


# --- vectors ------------------------------------------------------------------


def test_empty_payload_is_one_zero_byte_and_reads_back_empty():
    assert sync.encode_payload(RangesData()) == b"\x00"
    assert sync.decode_payload(b"\x00") == RangesData()
    # nwaku answers a topic mismatch with zero bytes: also the end.
    assert sync.decode_payload(b"").finished


def test_spec_delta_encoding_table():
    # waku-org/specs sync.md, "Delta encoding for sequential SyncIDs": times
    # 1000, 1002, 1002 (hash 0x3560...), 1003 encode as 1000, 2, 0 + 023560, 1.
    hash_3560 = bytes([0x35, 0x60]) + bytes(30)
    payload = RangesData(
        lower=(1000, Z),
        ranges=(
            Range((1002, Z), RangeType.SKIP),
            Range((1002, hash_3560), RangeType.SKIP),
            Range((1003, Z), RangeType.FINGERPRINT, fingerprint=h(7)),
        ),
    )
    raw = sync.encode_payload(payload)
    assert raw == (
        b"\x00\x00"  # no pubsub topics, no content topics
        + b"\xe8\x07"  # 1000, LEB128
        + b"\x02"
        + b"\x00"  # +2, skip
        + b"\x00"
        + b"\x02\x35\x60"
        + b"\x00"  # +0, 2 hash bytes, skip
        + b"\x01"
        + b"\x01"
        + h(7)  # +1, fingerprint
    )
    assert sync.decode_payload(raw) == payload


def test_nwaku_layout_of_a_first_payload():
    # nwaku codec.nim deltaEncode: pubsub topics (count, len, bytes), content
    # topics, the first lower bound's time, then per range the time delta,
    # the type byte and its content.
    lower, upper = 1_700_000_000_000_000_000, 1_700_003_600_000_000_000
    payload = RangesData((TOPIC,), (), (lower, Z), (Range((upper, Z), RangeType.FINGERPRINT, fingerprint=h(0xAB)),))
    raw = sync.encode_payload(payload)
    expected = (
        bytes([1, len(TOPIC)]) + TOPIC.encode() + b"\x00" + _leb128(lower) + _leb128(upper - lower) + b"\x01" + h(0xAB)
    )
    assert raw == expected
    assert sync.decode_payload(raw) == payload


def test_item_set_layout():
    # Item set: count, first time in full then deltas, full hashes, reconciled byte.
    items = ((5000, h(1)), (5000, h(2)), (5300, h(3)))
    payload = RangesData(lower=(4000, Z), ranges=(Range((6000, Z), RangeType.ITEM_SET, items=items, reconciled=True),))
    raw = sync.encode_payload(payload)
    assert (
        raw
        == b"\x00\x00"
        + _leb128(4000)
        + _leb128(2000)
        + b"\x02"
        + b"\x03"
        + _leb128(5000)
        + h(1)
        + b"\x00"
        + h(2)
        + _leb128(300)
        + h(3)
        + b"\x01"
    )
    assert sync.decode_payload(raw) == payload


def _leb128(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


# --- round trips --------------------------------------------------------------

hashes = st.binary(min_size=32, max_size=32)


@st.composite
def payloads(draw) -> RangesData:
    t = draw(st.integers(0, 2**62))
    lower = (t, Z)
    previous = lower
    ranges = []
    for _ in range(draw(st.integers(1, 6))):
        step = draw(st.integers(0, 10**9))
        if step == 0:
            length = draw(st.integers(1, 32))
            upper = (previous[0], draw(st.binary(min_size=length, max_size=length)) + bytes(32 - length))
            if upper <= previous:
                continue
        else:
            upper = (previous[0] + step, Z)
        kind = draw(st.sampled_from(list(RangeType)))
        if kind is RangeType.FINGERPRINT:
            ranges.append(Range(upper, kind, fingerprint=draw(hashes)))
        elif kind is RangeType.ITEM_SET:
            if upper[0] > previous[0] + 1:
                times = draw(st.lists(st.integers(previous[0] + 1, upper[0] - 1), max_size=5))
            else:
                times = []
            items = tuple(sorted({(tt, draw(hashes)) for tt in times}))
            ranges.append(Range(upper, kind, items=items, reconciled=draw(st.booleans())))
        else:
            ranges.append(Range(upper, kind))
        previous = upper
    topics = tuple(draw(st.lists(st.text(max_size=20), max_size=3)))
    return RangesData(topics, tuple(draw(st.lists(st.text(max_size=20), max_size=2))), lower, tuple(ranges))


@given(payloads())
def test_payload_round_trip(payload):
    if not payload.ranges:
        return
    assert sync.decode_payload(sync.encode_payload(payload)) == payload


@given(st.binary(max_size=400))
@settings(suppress_health_check=[HealthCheck.too_slow])
def test_arbitrary_bytes_decode_or_raise_sync_error(raw):
    try:
        sync.decode_payload(raw)
    except SyncError:
        pass


@given(payloads(), st.data())
def test_mutated_payloads_raise_only_sync_error(payload, data):
    if not payload.ranges:
        return
    raw = bytearray(sync.encode_payload(payload))
    where = data.draw(st.integers(0, len(raw) - 1))
    if data.draw(st.booleans()):
        raw[where] ^= data.draw(st.integers(1, 255))
    else:
        del raw[where:]
    try:
        sync.decode_payload(bytes(raw))
    except SyncError:
        pass


@pytest.mark.parametrize(
    "raw, reason",
    [
        (b"\x01", "ends early"),  # not the empty payload, one topic promised
        (b"\x00\x00\x05", "header but no range"),
        (b"\x00\x00\x05\x01\x07", "unknown range type"),
        (b"\x00\x00\x05\x00\x00", "prefix length"),  # +0 with an empty prefix
        (b"\x00\x00\x05\x80\x00\x00", "minimally"),  # overlong varint
        (b"\x00\x00" + b"\xff" * 11, "longer than"),
        (b"\x00\x00\x05\x01\x02\x01\x09" + h(1) + b"\x00", "outside its range"),  # item at 9 in [5, 6)
        (b"\x00\x00\x05\x05\x02\x00\x02", "reconciled flag"),
        (b"\x00\x00\x05\x05\x02\x05", "longer than the payload"),  # 5 items promised
        (b"\x00\x00\x05\x05\x01" + b"\x00" * 10, "ends early"),  # short fingerprint
        (b"\x01\x02\xff\xfe\x00\x05\x05\x00", "UTF-8"),
    ],
)
def test_bad_payloads_raise_sync_error(raw, reason):
    with pytest.raises(SyncError, match=reason):
        sync.decode_payload(raw)


def test_payload_limits():
    many = RangesData(lower=(0, Z), ranges=tuple(Range((i + 1, Z), RangeType.SKIP) for i in range(50)))
    raw = sync.encode_payload(many)
    with pytest.raises(SyncError, match="more than 10 ranges"):
        sync.decode_payload(raw, max_ranges=10)
    with pytest.raises(SyncError, match="limit 20"):
        sync.decode_payload(raw, max_size=20)
    items = tuple((10 + i, h(i)) for i in range(20))
    big = RangesData(lower=(0, Z), ranges=(Range((100, Z), RangeType.ITEM_SET, items=items),))
    with pytest.raises(SyncError, match="more than 5 items"):
        sync.decode_payload(sync.encode_payload(big), max_items=5)


def test_unwritable_bounds_are_refused():
    with pytest.raises(SyncError):
        sync.encode_payload(RangesData(lower=(5, Z), ranges=(Range((5, Z), RangeType.SKIP),)))
    with pytest.raises(SyncError):  # a hash after a time step is not on the wire
        sync.encode_payload(RangesData(lower=(5, Z), ranges=(Range((6, h(1)), RangeType.SKIP),)))


def test_transfer_round_trip_and_spec_layout():
    message = WakuMessage(payload=b"hello", content_topic="/app/1/chat/proto", timestamp=123, meta=b"m")
    raw = sync.encode_transfer(TOPIC, message)
    # nwaku's numbering: field 1 the topic (0x0a), field 2 the message (0x12).
    assert raw[0] == 0x0A and raw[1] == len(TOPIC) and raw[2 + len(TOPIC)] == 0x12
    topic, decoded, size = sync.decode_transfer(raw)
    assert (topic, decoded) == (TOPIC, message) and size > 0
    from wakustore.protocols.message_codec import write_message_pb
    from wakustore.protos import sync_transfer_pb2

    spec = sync_transfer_pb2.SpecWakuMessageAndTopic(pubsub_topic=TOPIC)
    write_message_pb(spec.message, message)
    assert sync.decode_transfer(spec.SerializeToString())[:2] == (TOPIC, message)


@given(st.binary(max_size=300))
def test_bad_transfer_raises_sync_error(raw):
    try:
        sync.decode_transfer(raw)
    except SyncError:
        pass


def test_transfer_without_message_is_refused():
    with pytest.raises(SyncError):
        sync.decode_transfer(b"\x0a\x03abc")


# --- reconciliation -----------------------------------------------------------


def reconcile(a: sync.IdSet, b: sync.IdSet, lower: int, upper: int, limits=SessionLimits()):
    """Run a whole session in memory; return (initiator, responder)."""
    ini, res = Session(pubsub_topics=(TOPIC,), limits=limits), Session(pubsub_topics=(TOPIC,), limits=limits)
    message = ini.initiate(a, lower, upper)
    first = res.receive(message)
    assert res.scope_of(first) is not None
    res.ids = b
    reply = res.answer(first)
    receiver, other = ini, res
    while reply is not None:
        reply = receiver.answer(receiver.receive(reply))
        receiver, other = other, receiver
    assert ini.done and res.done
    return ini, res


@given(st.data())
@settings(max_examples=40, deadline=None)
def test_two_random_sets_converge_to_the_union(data):
    rng = random.Random(data.draw(st.integers(0, 2**32)))
    size = data.draw(st.integers(0, 3000))
    base = 1_700_000_000_000_000_000
    span = 3_600_000_000_000

    def ids(n):
        return [(base + rng.randrange(span), rng.randbytes(32)) for _ in range(n)]

    common = ids(size)
    # Some ids share a timestamp: hashes then order them.
    same_time = [(base + 42, rng.randbytes(32)) for _ in range(data.draw(st.integers(0, 150)))]
    only_a, only_b = ids(data.draw(st.integers(0, 400))), ids(data.draw(st.integers(0, 400)))
    split = data.draw(st.integers(0, len(same_time)))
    a = sync.IdSet(common + only_a + same_time[:split])
    b = sync.IdSet(common + only_b + same_time[split:])
    ini, res = reconcile(a, b, base, base + span)
    a_set, b_set = {x for x in (a[i] for i in range(len(a)))}, {x for x in (b[i] for i in range(len(b)))}
    # Each side sends what the other lacks: together, both end with the union.
    assert {(t, x) for x, t in ini.to_send.items()} == a_set - b_set
    assert {(t, x) for x, t in res.to_send.items()} == b_set - a_set
    # What a side expects is what the other sends (a side that listed nothing
    # for a range learns nothing about it: the holder just sends).
    assert ini.to_receive.items() <= res.to_send.items() and res.to_receive.items() <= ini.to_send.items()
    assert ini.rounds + res.rounds <= 2 * sync.MAX_ROUNDS


def test_equal_sets_agree_in_one_round_trip():
    ids = sync.IdSet((1000 + i, h(i % 256)) for i in range(500))
    ini, res = reconcile(ids, ids, 0, 10_000)
    assert res.done and ini.rounds == 1 and not ini.to_send and not ini.to_receive


def test_an_empty_side_receives_everything():
    ids = sync.IdSet((1000 + i, random.Random(i).randbytes(32)) for i in range(1000))
    ini, res = reconcile(sync.IdSet([]), ids, 0, 10_000)
    assert len(res.to_send) == 1000 and not ini.to_send


def test_topic_mismatch_has_no_scope():
    ini = Session(pubsub_topics=("/waku/2/rs/1/1",))
    res = Session(pubsub_topics=("/waku/2/rs/1/2",))
    raw = ini.initiate(sync.IdSet([]), 0, 100)
    assert res.scope_of(res.receive(raw)) is None


def test_floor_skips_older_ranges():
    ids = sync.IdSet([(50, h(1))])
    res = Session(ids=ids, floor_ns=100)
    payload = RangesData(lower=(0, Z), ranges=(Range((100, Z), RangeType.FINGERPRINT, fingerprint=h(9)),))
    assert res.answer(payload) == sync.EMPTY_PAYLOAD and res.done


def test_lying_fingerprints_end_within_the_round_limit():
    ids = sync.IdSet((1000 + 7 * i, random.Random(i).randbytes(32)) for i in range(5000))
    limits = SessionLimits(max_rounds=12)
    ours = Session(ids=ids, limits=limits)
    rng = random.Random(1)
    payload = RangesData(lower=(0, Z), ranges=(Range((10**6, Z), RangeType.FINGERPRINT, fingerprint=h(1)),))
    raw = sync.encode_payload(payload)
    with pytest.raises(SyncError, match="12 rounds"):
        for _ in range(100):
            payload = ours.receive(raw)
            reply = sync.decode_payload(ours.answer(payload))
            assert len(reply.ranges) <= limits.partition_count * len(payload.ranges)
            # The liar answers every range with a fingerprint that matches nothing.
            raw = sync.encode_payload(
                RangesData(
                    lower=reply.lower,
                    ranges=tuple(
                        Range(r.upper, RangeType.FINGERPRINT, fingerprint=rng.randbytes(32)) for r in reply.ranges
                    ),
                )
            )
    assert ours.rounds == 13


def test_endless_ranges_are_refused():
    session = Session(ids=sync.IdSet([]))
    ranges = tuple(Range((i + 1, Z), RangeType.FINGERPRINT, fingerprint=h(1)) for i in range(sync.MAX_RANGES + 1))
    raw = sync.encode_payload(RangesData(lower=(0, Z), ranges=ranges))
    with pytest.raises(SyncError, match="ranges"):
        session.receive(raw)


def test_too_many_differences_end_the_session():
    theirs = tuple((10 + i, h(i % 256)[:31] + bytes([i // 256])) for i in range(300))
    session = Session(ids=sync.IdSet([]), limits=SessionLimits(max_differences=100))
    payload = RangesData(lower=(0, Z), ranges=(Range((1000, Z), RangeType.ITEM_SET, items=tuple(sorted(theirs))),))
    with pytest.raises(SyncError, match="differences"):
        session.answer(session.receive(sync.encode_payload(payload)))


def test_a_payload_after_the_end_is_refused():
    session = Session(ids=sync.IdSet([]))
    session.receive(b"\x00")
    with pytest.raises(SyncError):
        session.receive(b"\x00")


def test_fingerprint_is_xor_of_hashes():
    ids = sync.IdSet([(1, h(1)), (2, h(2)), (3, h(4))])
    assert ids.fingerprint(0, 3) == h(7) == sync.fingerprint_of([h(1), h(2), h(4)])
    assert ids.fingerprint(1, 2) == h(2)
    assert ids.span((2, Z), (3, Z)) == (1, 2)
    assert ids.span((2, h(3)), (3, h(5))) == (2, 3)
