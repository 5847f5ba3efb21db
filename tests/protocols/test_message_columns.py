"""A page held in columns encodes to the bytes the protobuf runtime writes
for the same rows, and reads as the same StoredMessages."""

import random

import numpy as np
import pytest

from wakustore.protocols import store_v2, store_v3
from wakustore.protocols.errors import MessageError
from wakustore.protocols.message import WakuMessage
from wakustore.protocols.message_columns import V3_KEYS, MessageColumns, MessageData
from wakustore.protocols.store_query import Page, StoredMessage


def _binary(values: list[bytes]):
    offsets = np.zeros(len(values) + 1, dtype=np.int32)
    np.cumsum([len(v) for v in values], out=offsets[1:])
    return offsets, b"".join(values)


def _columns(stored: list[StoredMessage], with_data: bool = True, with_digest: bool = True) -> MessageColumns:
    data = None
    if with_data:
        messages = [s.message for s in stored]
        data = MessageData(
            _binary([m.content_topic.encode() for m in messages]),
            _binary([m.payload for m in messages]),
            _binary([m.meta for m in messages]),
            _binary([m.rate_limit_proof for m in messages]),
            np.array([m.version for m in messages], dtype=np.int32),
            np.array([m.timestamp for m in messages], dtype=np.int64),
        )
    return MessageColumns(
        _binary([s.message_hash for s in stored]),
        _binary([s.pubsub_topic.encode() for s in stored]),
        np.array([s.timestamp for s in stored], dtype=np.int64),
        _binary([s.digest for s in stored]) if with_digest else None,
        data,
    )


def _random_rows(rng: random.Random, count: int) -> list[StoredMessage]:
    rows = []
    for _ in range(count):
        timestamp = rng.choice([0, 1, -1, 2**63 - 1, -(2**63), rng.randrange(-(2**62), 2**62)])
        message = WakuMessage(
            payload=rng.randbytes(rng.choice([0, 1, 127, 128, 300, 20_000])),
            content_topic=rng.choice(["", "/app/1/chat/proto", "/äpp/1/ünïcode/proto"]),
            version=rng.choice([0, 1, 127, 128, 2**31 - 1]),
            timestamp=timestamp,
            meta=rng.randbytes(rng.choice([0, 64])),
            rate_limit_proof=rng.randbytes(rng.choice([0, 1, 200])),
        )
        rows.append(
            StoredMessage(
                rng.randbytes(32),
                rng.choice(["/waku/2/rs/16/32", "/waku/2/default-waku/proto", ""]),
                message,
                rng.randrange(0, 2**63),
                rng.randbytes(32),
            )
        )
    return rows


@pytest.mark.parametrize("seed", range(12))
def test_columns_encode_to_the_protobuf_runtimes_bytes(seed):
    rng = random.Random(seed)
    rows = _random_rows(rng, rng.choice([0, 1, 2, 20, 100]))
    columns = _columns(rows)
    keys = [StoredMessage(r.message_hash, r.pubsub_topic, None, r.timestamp, r.digest) for r in rows]
    for cursor in (None, rows[-1] if rows else None):
        for request_id in ("", "req-1"):
            for include_data in (True, False):
                expected = store_v3.encode_response(
                    request_id, Page(rows if include_data else keys, cursor), include_data=include_data
                )
                got = store_v3.encode_response(request_id, Page(columns, cursor), include_data=include_data)
                assert got == expected
            for forward in (True, False):
                expected = store_v2.encode_response(request_id, Page(rows, cursor), forward=forward)
                assert store_v2.encode_response(request_id, Page(columns, cursor), forward=forward) == expected
    # A page without data (its key columns alone) encodes as hashes.
    bare = _columns(keys, with_data=False, with_digest=False)
    assert store_v3.encode_response("r", Page(bare, None), include_data=True) == store_v3.encode_response(
        "r", Page(keys, None), include_data=True
    )
    assert store_v2.encode_response("r", Page(bare, None)) == store_v2.encode_response("r", Page(keys, None))
    # The encodings read back as the rows.
    decoded = store_v3.decode_response(store_v3.encode_response("r", Page(columns, None)))
    assert [(e.message_hash, e.pubsub_topic, e.message) for e in decoded.messages] == [
        (r.message_hash, r.pubsub_topic, r.message) for r in rows
    ]


def test_columns_read_as_the_same_stored_messages():
    rows = _random_rows(random.Random(7), 9)
    columns = _columns(rows)
    assert len(columns) == 9 and list(columns) == rows and columns == rows
    assert columns[0] == rows[0] and columns[-1] == rows[-1] and columns[2:5] == rows[2:5]
    assert columns[::-1] == rows[::-1]
    with pytest.raises(IndexError):
        columns[9]
    keys = _columns(rows, with_data=False, with_digest=False)
    assert [k.message for k in keys] == [None] * 9 and [k.digest for k in keys] == [b""] * 9
    assert [k.message_hash for k in keys] == [r.message_hash for r in rows]


def test_bad_columns_are_refused_not_read():
    rows = _random_rows(random.Random(3), 4)
    good = _columns(rows)
    offsets, data = good.message_hash
    with pytest.raises(ValueError, match="different lengths"):
        MessageColumns((offsets[:-1], data), good.pubsub_topic, good.timestamp)
    # Offsets past the data or out of order.
    past = offsets.copy()
    past[-1] += 1
    with pytest.raises(MessageError, match="offsets"):
        MessageColumns((past, data), good.pubsub_topic, good.timestamp).encode(V3_KEYS)
    backwards = offsets.copy()
    backwards[1], backwards[2] = backwards[2], backwards[1] - 1
    with pytest.raises(MessageError, match="offsets"):
        MessageColumns((backwards, data), good.pubsub_topic, good.timestamp).encode(V3_KEYS)
    # A version past uint32 (as a negative int32) does not fit the wire.
    assert good.data is not None
    bad = MessageData(
        *(getattr(good.data, f) for f in ("content_topic", "payload", "meta", "rate_limit_proof")),
        np.array([-1, 0, 0, 0], dtype=np.int32),
        good.data.sender_timestamp,
    )
    with pytest.raises(MessageError, match="version"):
        store_v3.encode_response(
            "r", Page(MessageColumns(good.message_hash, good.pubsub_topic, good.timestamp, None, bad), None)
        )


def test_an_order_picks_and_orders_the_rows_without_a_copy():
    rows = _random_rows(random.Random(11), 12)
    full = _columns(rows)
    picked = [7, 2, 11, 0]
    ordered = MessageColumns(
        full.message_hash, full.pubsub_topic, full.timestamp, full.digest, full.data, np.array(picked)
    )
    assert list(ordered) == [rows[i] for i in picked] and len(ordered) == 4
    expected = store_v3.encode_response("r", Page([rows[i] for i in picked], rows[0]))
    assert store_v3.encode_response("r", Page(ordered, rows[0])) == expected
    assert store_v2.encode_response("r", Page(ordered, None)) == store_v2.encode_response(
        "r", Page([rows[i] for i in picked], None)
    )
    with pytest.raises(ValueError, match="past the columns"):
        MessageColumns(full.message_hash, full.pubsub_topic, full.timestamp, order=np.array([12]))
