"""Rows as the put path builds them: the same keys as the protocol's definitions."""

import hashlib

import numpy as np
import pyarrow as pa
import pytest

from wakustore.protocols.message import WakuMessage, message_hash, muid
from wakustore.storage.message_store import MESSAGE_CODEC
from wakustore.storage.rows import Row, binary_prefixes, legacy_digest, messages_to_arrow, rows_from_arrow, to_arrow
from wakustore.storage.schema import day_of_ns
from wakustore.storage.write_path import BoundedSet, _Pending

T0 = 1_700_000_000 * 10**9

MESSAGES = [
    ("/waku/2/rs/16/1", WakuMessage(b"p" * 3000, "/a/1/b/proto", version=1, timestamp=T0, meta=b"m" * 40), T0 + 1),
    ("/waku/2/rs/16/2", WakuMessage(b"", "/a/1/c/proto", timestamp=0, meta=b"short"), T0 + 2),
    ("/waku/2/rs/16/2", WakuMessage(b"q", "/a/1/c/proto", timestamp=-7), 5),
    ("/waku/2/rs/16/3", WakuMessage("ü".encode(), "/a/1/ü/proto", timestamp=T0 * 3, rate_limit_proof=b"r"), 9),
]


def test_rows_carry_the_protocols_muid_hash_and_digest():
    for pubsub, message, arrival in MESSAGES:
        row = Row.build(pubsub, message, arrival)
        assert row.muid == muid(pubsub, message)
        assert row.message_hash == message_hash(pubsub, message)
        assert row.digest == legacy_digest(message)
        assert row.timestamp == (message.timestamp or arrival)


def test_arrow_rows_hold_each_field_and_the_utc_day_of_the_ordering_time():
    rows = [Row.build(*t) for t in MESSAGES]
    table = to_arrow(rows)
    assert table.column("muid").to_pylist() == [r.muid for r in rows]
    assert table.column("payload").to_pylist() == [r.message.payload for r in rows]
    assert table.column("sender_timestamp").to_pylist() == [r.message.timestamp for r in rows]
    assert table.column("day").to_pylist() == [day_of_ns(r.timestamp) for r in rows]
    assert to_arrow([]).num_rows == 0


def test_hash_prefixes_read_from_arrow_are_the_first_eight_bytes_big_endian():
    hashes = [hashlib.sha256(bytes([i])).digest() for i in range(10)]
    values = pa.array(hashes, pa.binary()).slice(3, 5)  # a slice: offsets do not start at 0
    expected = [int.from_bytes(h[:8], "big") for h in hashes[3:8]]
    assert binary_prefixes(values, 8).tolist() == expected
    assert binary_prefixes(pa.array([], pa.binary()), 8).dtype == np.uint64
    with pytest.raises(ValueError):
        binary_prefixes(pa.array([b"short"], pa.binary()), 8)


def test_pending_rows_are_read_in_order_by_time_range_and_group_whatever_order_they_came_in():
    import random

    rng = random.Random(5)
    messages = [
        (
            f"/waku/2/rs/16/{rng.randrange(3)}",
            WakuMessage(b"%d" % i, f"/a/1/t{rng.randrange(4)}/proto", timestamp=T0 + rng.randrange(50)),
            T0,
        )
        for i in range(400)
    ]
    rows = [Row.build(*t) for t in messages]
    pending = _Pending(MESSAGE_CODEC)
    for start in range(0, 400, 37):  # puts of unsorted batches, reads in between
        chunk = messages_to_arrow(messages[start : start + 37])
        pending.add(chunk.column("muid").to_pylist(), chunk)
        list(pending.entries(T0 + 10, T0 + 20, False))
    assert len(pending) == 400
    everything = sorted((r.timestamp, r.message_hash, r.muid) for r in rows)
    for group in [None, *{MESSAGE_CODEC.group(r) for r in rows}]:
        members = [e for e in everything if group is None or MESSAGE_CODEC.group(pending.rows[e[2]]) == group]
        for low, high in ((None, None), (T0 + 5, T0 + 30), (T0 + 49, None), (None, T0)):
            wanted = [e for e in members if (low is None or e[0] >= low) and (high is None or e[0] <= high)]
            assert list(pending.entries(low, high, False, group)) == wanted
            assert list(pending.entries(low, high, True, group)) == wanted[::-1]
    for row in rows:
        assert pending.by_hash(row.message_hash) == row


def test_the_recent_set_keeps_at_least_half_its_capacity_of_the_latest_keys_and_at_most_its_capacity():
    recent = BoundedSet(4)
    recent.add(b"a")
    recent.add_many([b"b", b"c", b"d", b"e", b"f"])
    assert len(recent) <= 4
    assert b"e" in recent and b"f" in recent and b"a" not in recent
    for count in range(1, 30):
        recent.add_many([b"%d" % i for i in range(count)])
        assert len(recent) <= 4
        assert all(b"%d" % i in recent for i in range(max(0, count - 2), count))


def test_the_pending_rows_are_the_puts_arrow_chunks_in_order_and_rows_built_once_read():
    rows = [Row.build(*t) for t in MESSAGES]
    pending = _Pending(MESSAGE_CODEC)
    first, second = messages_to_arrow(MESSAGES[:2]), messages_to_arrow(MESSAGES[2:])
    pending.add([r.muid for r in rows[:2]], first)
    pending.add([r.muid for r in rows[2:]], second, rows[2:])  # the put had the objects
    assert pending.table().equals(to_arrow(rows))
    assert pending.key_list() == [r.muid for r in rows]
    assert not pending.rows  # nothing built before a read
    assert list(pending.values()) == rows
    assert pending.rows[rows[2].muid] is rows[2]  # given objects are used as they are
    moved = _Pending(MESSAGE_CODEC)
    moved.absorb(pending)
    assert moved.table().equals(to_arrow(rows)) and len(moved) == len(rows)


def test_the_columnar_builder_makes_the_rows_row_objects_make():
    assert messages_to_arrow(MESSAGES).equals(to_arrow([Row.build(*t) for t in MESSAGES]))
    assert messages_to_arrow([]).equals(to_arrow([]))
    assert rows_from_arrow(messages_to_arrow(MESSAGES)) == [Row.build(*t) for t in MESSAGES]


def test_batch_log_records_hold_the_rows_in_records_under_the_bound_and_old_records_are_told_apart(monkeypatch):
    from wakustore.storage import write_path
    from wakustore.storage.rows import encode_record

    table = messages_to_arrow(MESSAGES * 50)
    records = write_path.batch_records(table)
    assert len(records) == 1 and write_path.is_batch_record(records[0])
    assert write_path.read_batch_record(records[0]).equals(table)
    assert write_path.record_rows(records[0]) == table.num_rows
    monkeypatch.setattr(write_path, "RECORD_TARGET_BYTES", 20_000)
    records = write_path.batch_records(table)
    assert len(records) > 5 and all(len(r) < 40_000 for r in records)
    assert pa.concat_tables([write_path.read_batch_record(r) for r in records]).equals(table)
    old = encode_record(*MESSAGES[0])
    assert not write_path.is_batch_record(old) and write_path.record_rows(old) == 1


def test_the_hash_worker_makes_the_columns_hashing_in_process_makes_and_a_dead_one_is_replaced(monkeypatch):
    import os
    import signal

    from wakustore.storage import hash_worker
    from wakustore.storage.hash_worker import MIN_BATCH, BatchHasher
    from wakustore.storage.rows import messages_to_arrow

    many = [
        (p, WakuMessage(m.payload + b"%d" % i, m.content_topic, m.version, m.timestamp + i, m.meta[: i % 50]), a)
        for i in range(MIN_BATCH)
        for p, m, a in MESSAGES
    ]
    hasher = BatchHasher()
    try:
        assert messages_to_arrow(many, hasher).equals(messages_to_arrow(many))
        assert hasher.batches == 1 and hasher.failures == 0
        first = hasher._process.pid
        os.kill(first, signal.SIGKILL)
        hasher._process.wait()
        assert messages_to_arrow(many, hasher).equals(messages_to_arrow(many))
        assert hasher.batches == 2 and hasher._process.pid != first  # a new worker
        with monkeypatch.context() as patch:  # the worker's answer cut short
            patch.setattr(
                hash_worker, "_read_exact", lambda fd, size, timeout_s: (_ for _ in ()).throw(EOFError("cut"))
            )
            assert messages_to_arrow(many, hasher).equals(messages_to_arrow(many))  # hashed in process
        assert hasher.failures == 1 and hasher._process is None
        messages_to_arrow(many, hasher)
        os.kill(hasher._process.pid, signal.SIGSTOP)  # a worker that stops answering
        with monkeypatch.context() as patch:
            patch.setattr(hash_worker, "TIMEOUT_S", 0.2)
            assert messages_to_arrow(many, hasher).equals(messages_to_arrow(many))
        assert hasher.failures == 2 and hasher._process is None  # stopped, killed and replaced next time
        assert messages_to_arrow(many[: MIN_BATCH - 1], hasher).equals(messages_to_arrow(many[: MIN_BATCH - 1]))
        assert hasher.batches == 3  # a small batch stays in process
    finally:
        hasher.close()
    assert hasher._process is None
