"""status-go records of a whole batch (storage/archive_columns.py): byte
for byte what the record-at-a-time encoder writes, for every kind of row
an export meets."""

import pyarrow as pa
import pytest
from coincurve import PrivateKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from hypothesis import given, settings
from hypothesis import strategies as st

from wakustore.protocols import waku_v1
from wakustore.protocols.archive import Layout
from wakustore.protocols.archive_records import RecordEncoder, channel_key
from wakustore.protocols.message import WakuMessage, message_hash
from wakustore.storage import archive_columns
from wakustore.storage.archive_window import EXPORT_COLUMNS

PUBSUBS = ("/waku/2/rs/16/32", "/waku/2/rs/16/64")
TOPICS = ("/waku/1/0x0a0b0c0d/rfc26", "/waku/1/0x01020304/rfc26", "/waku/1/0xffffffff/rfc26")
KEYS = {TOPICS[0]: channel_key("0x02" + "ab" * 32, "general"), TOPICS[1]: channel_key("0x02" + "ab" * 32, "random")}
SENDERS = (bytes(range(5, 37)), bytes(range(40, 72)))
NONCE = bytes(range(12))


def _sealed_raw(key: bytes, plain: bytes) -> bytes:
    return AESGCM(key).encrypt(NONCE, plain, None) + NONCE


def _payload(kind: str, body: bytes, topic: str, sender: bytes) -> bytes:
    key = KEYS.get(topic, KEYS[TOPICS[0]])
    if kind == "signed":
        return waku_v1.encrypt_symmetric(body, key, sender)
    if kind == "unsigned":
        return waku_v1.encrypt_symmetric(body, key, None)
    if kind == "other key":
        return waku_v1.encrypt_symmetric(body, bytes([7]) * 32, sender)
    if kind == "extra flag":  # a flag bit status-go never sets
        return _sealed_raw(key, bytes([0x01 | 0x10, len(body) & 0xFF]) + body)
    if kind == "long size field":  # size in two bytes where one would do
        return _sealed_raw(key, bytes([0x02, len(body) & 0x7F, 0]) + body[: len(body) & 0x7F])
    if kind == "size past the end":
        return _sealed_raw(key, bytes([0x01, 200]) + body[:10])
    if kind == "bad signature":  # signed flag, a signature that recovers no key
        return _sealed_raw(
            key, bytes([0x01 | waku_v1.FLAG_SIGNED, len(body) & 0xFF]) + body[: len(body) & 0xFF] + bytes(65)
        )
    return body  # opaque bytes


rows = st.tuples(
    st.sampled_from(
        [
            "signed",
            "signed",
            "unsigned",
            "other key",
            "extra flag",
            "long size field",
            "size past the end",
            "bad signature",
            "opaque",
        ]
    ),
    st.binary(max_size=400),
    st.sampled_from(TOPICS),
    st.sampled_from(PUBSUBS),
    st.sampled_from(SENDERS),
    st.sampled_from([0, 1, 1, 1, 2]),
    st.one_of(st.just(0), st.integers(1, 2**62)),
    st.integers(0, 2**62),
    st.binary(max_size=40),
    st.binary(max_size=20),
    st.sampled_from(["none", "known", "empty"]),
)


@given(batch=st.lists(rows, max_size=24), with_signers=st.booleans())
@settings(max_examples=120, deadline=None)
def test_a_batch_encodes_as_its_records_one_by_one(batch, with_signers):
    encoder = RecordEncoder(Layout.STATUS_GO, KEYS)
    columns, known = [], []
    for kind, body, topic, pubsub, sender, version, stamp, arrival, meta, proof, signer in batch:
        payload = _payload(kind, body, topic, sender) if version == 1 else body
        message = WakuMessage(payload, topic, version=version, timestamp=stamp, meta=meta, rate_limit_proof=proof)
        columns.append([pubsub, topic, payload, meta, version, stamp, proof, arrival, message_hash(pubsub, message)])
        uncompressed = PrivateKey(sender).public_key.format(compressed=False)
        known.append(
            {"none": None, "known": uncompressed, "empty": b""}[signer] if kind == "signed" and topic in KEYS else None
        )
    signers = known if with_signers else None
    expected = encoder.encode_framed(*(zip(*columns) if columns else [[]] * 9), signers=signers)
    types = [
        pa.string(),
        pa.string(),
        pa.binary(),
        pa.binary(),
        pa.int32(),
        pa.int64(),
        pa.binary(),
        pa.int64(),
        pa.binary(),
    ]
    table = pa.table([pa.array([row[i] for row in columns], t) for i, t in enumerate(types)], names=EXPORT_COLUMNS)
    got = archive_columns.encode_framed(encoder, table, None if signers is None else pa.array(signers, pa.binary()))
    assert got == expected


def test_a_batch_with_a_time_before_1970_is_left_to_the_record_encoder():
    encoder = RecordEncoder(Layout.STATUS_GO, KEYS)
    types = [
        pa.string(),
        pa.string(),
        pa.binary(),
        pa.binary(),
        pa.int32(),
        pa.int64(),
        pa.binary(),
        pa.int64(),
        pa.binary(),
    ]
    row = [PUBSUBS[0], TOPICS[2], b"x", b"", 0, -5, b"", 10, bytes(32)]
    table = pa.table([pa.array([v], t) for v, t in zip(row, types)], names=EXPORT_COLUMNS)
    assert archive_columns.encode_framed(encoder, table) is None


@pytest.mark.parametrize("topic", [TOPICS[0], TOPICS[2]])
def test_an_empty_batch_is_empty(topic):
    encoder = RecordEncoder(Layout.STATUS_GO, KEYS)
    types = [
        pa.string(),
        pa.string(),
        pa.binary(),
        pa.binary(),
        pa.int32(),
        pa.int64(),
        pa.binary(),
        pa.int64(),
        pa.binary(),
    ]
    table = pa.table([pa.array([], t) for t in types], names=EXPORT_COLUMNS)
    assert archive_columns.encode_framed(encoder, table) == (b"", [], [])
