import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from wakustore.protocols.message import (
    MUID_MAX_SIZE,
    InvalidMessage,
    Limits,
    Rejection,
    WakuMessage,
    check_storable,
    message_hash,
    muid,
)

# Published vectors (14/WAKU2-MESSAGE, nwaku behaviour).
PUBSUB = "/waku/2/default-waku/proto"
CONTENT = "/waku/2/default-content/proto"
PAYLOAD = bytes.fromhex("010203045445535405060708")
TIMESTAMP = 0x175789BFA23F8400


@pytest.mark.parametrize(
    ("payload", "meta", "expected"),
    [
        (
            PAYLOAD,
            bytes.fromhex("73757065722d736563726574"),
            "64cce733fed134e83da02b02c6f689814872b1a0ac97ea56b76095c3c72bfe05",
        ),
        (PAYLOAD, b"", "a2554498b31f5bcdfcbf7fa58ad1c2d45f0254f3f8110a85588ec3cf10720fd8"),
        (PAYLOAD, bytes(range(64)), "7158b6498753313368b9af8f6e0a0a05104f68f972981da42a43bc53fb0c1b27"),
        (
            b"",
            bytes.fromhex("73757065722d736563726574"),
            "483ea950cb63f9b9d6926b262bb36194d3f40a0463ce8446228350bd44e96de4",
        ),
    ],
)
def test_message_hash_matches_published_vectors(payload, meta, expected):
    message = WakuMessage(payload=payload, content_topic=CONTENT, timestamp=TIMESTAMP, meta=meta)
    assert message_hash(PUBSUB, message).hex() == expected


def test_message_hash_appends_zero_timestamp_bytes_like_nwaku():
    message = WakuMessage(payload=b"x", content_topic="/a/1/b/proto")
    expected = hashlib.sha256(b"/p" + b"x" + b"/a/1/b/proto" + bytes(8)).digest()
    assert message_hash("/p", message) == expected


def test_message_hash_ignores_version_ephemeral_and_proof():
    base = WakuMessage(payload=b"x", content_topic="/a/1/b/proto", timestamp=5)
    other = WakuMessage(
        payload=b"x",
        content_topic="/a/1/b/proto",
        timestamp=5,
        version=1,
        ephemeral=True,
        rate_limit_proof=b"proof",
    )
    assert message_hash("/p", base) == message_hash("/p", other)


def test_muid_is_checksum_then_meta():
    message = WakuMessage(payload=b"pl", content_topic="/c", meta=b"m" * 10)
    checksum = hashlib.sha256(b"/n" + b"/c" + b"m" * 10 + b"pl").digest()
    assert muid("/n", message) == checksum + b"m" * 10


def test_muid_ignores_timestamp():
    a = WakuMessage(payload=b"pl", content_topic="/c", timestamp=1)
    b = WakuMessage(payload=b"pl", content_topic="/c", timestamp=2)
    assert muid("/n", a) == muid("/n", b)
    assert message_hash("/n", a) != message_hash("/n", b)


@given(meta=st.binary(max_size=64), payload=st.binary(max_size=64))
def test_muid_never_exceeds_64_bytes_and_covers_all_of_meta(meta, payload):
    message = WakuMessage(payload=payload, content_topic="/c", meta=meta)
    value = muid("/n", message)
    assert 32 <= len(value) <= MUID_MAX_SIZE
    if len(meta) > 32:
        changed = WakuMessage(payload=payload, content_topic="/c", meta=meta[:-1] + bytes([meta[-1] ^ 1]))
        assert muid("/n", changed) != value


NOW = 1_700_000_000 * 10**9


def _rejection(message, size=100, now=NOW, limits=Limits()):
    with pytest.raises(InvalidMessage) as info:
        check_storable(message, size, now, limits)
    return info.value.reason


def test_valid_message_passes():
    check_storable(WakuMessage(b"x", "/c", timestamp=NOW), 100, NOW)


def test_message_without_timestamp_is_storable():
    check_storable(WakuMessage(b"x", "/c"), 100, NOW)


def test_oversized_message_is_rejected():
    assert _rejection(WakuMessage(b"x", "/c"), size=150 * 1024 + 1) is Rejection.TOO_LARGE


def test_meta_over_64_bytes_is_rejected():
    assert _rejection(WakuMessage(b"x", "/c", meta=bytes(65))) is Rejection.META_TOO_LARGE


@pytest.mark.parametrize("offset", [-21 * 10**9, 21 * 10**9])
def test_timestamp_outside_drift_window_is_rejected(offset):
    assert _rejection(WakuMessage(b"x", "/c", timestamp=NOW + offset)) is Rejection.TIMESTAMP_DRIFT


def test_ephemeral_message_is_not_storable():
    assert _rejection(WakuMessage(b"x", "/c", ephemeral=True)) is Rejection.EPHEMERAL


def test_empty_content_topic_is_rejected():
    assert _rejection(WakuMessage(b"x", "")) is Rejection.NO_CONTENT_TOPIC


def test_limits_are_configurable():
    limits = Limits(max_message_size=10)
    assert _rejection(WakuMessage(b"x", "/c"), size=11, limits=limits) is Rejection.TOO_LARGE


def test_a_version_the_table_cannot_keep_is_refused():
    # uint32 on the wire, a signed 32-bit column in the table
    assert _rejection(WakuMessage(b"x", "/c", version=2**31)) is Rejection.VERSION_TOO_LARGE
    check_storable(WakuMessage(b"x", "/c", version=2**31 - 1), 100, NOW)
