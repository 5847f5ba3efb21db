import pytest

from wakustore.protocols.waku_v1 import Envelope, bloom_for_topics, envelope_hash, full_bloom
from wakustore.storage.envelope_store import EnvelopeStore, StoredEnvelope
from wakustore.storage.table import DeltaTableRef

T0 = 1_700_000_000
TOPIC_A, TOPIC_B = b"\xaa\x00\x00\x01", b"\xbb\x00\x00\x02"


def env(i, topic=TOPIC_A, ttl=50):
    raw = Envelope(expiry=T0 + i + ttl, ttl=ttl, topic=topic, data=b"data-%d" % i, nonce=i).encode()
    return StoredEnvelope.from_raw(raw, 0)


@pytest.fixture
def store(engine, tmp_path):
    s = EnvelopeStore(DeltaTableRef(engine, str(tmp_path / "envelopes")), tmp_path / "wal")
    s.open()
    yield s
    s.close()


def test_envelopes_come_back_byte_for_byte_in_send_order(store):
    rows = [env(i) for i in range(10)]
    store.put(rows[5:])
    store.flush()
    store.put(rows[:5])  # still buffered: visible too
    page = store.query(T0, T0 + 100, topics=[TOPIC_A])
    assert [r.raw for r in page.envelopes] == [r.raw for r in rows]
    assert all(r.envelope_hash == envelope_hash(r.raw) for r in page.envelopes)


def test_duplicates_by_envelope_hash_are_dropped(store):
    assert store.put([env(1), env(1), env(2)]) == (2, 1)
    store.flush()
    assert store.put([env(1)]) == (0, 1)
    assert store.table.count() == 2


def test_bounds_are_inclusive_and_cursor_exclusive_with_limit(store):
    store.put([env(i) for i in range(20)])
    store.flush()
    page = store.query(T0 + 2, T0 + 12, topics=[TOPIC_A], limit=5)
    assert [r.sent for r in page.envelopes] == [T0 + i for i in range(2, 7)]
    assert page.limit_reached
    last = page.envelopes[-1]
    rest = store.query(T0 + 2, T0 + 12, topics=[TOPIC_A], limit=100, cursor=(last.sent, last.envelope_hash))
    assert [r.sent for r in rest.envelopes] == [T0 + i for i in range(7, 13)]
    assert not rest.limit_reached


def test_topics_win_over_bloom_and_bloom_filters(store):
    store.put([env(i, TOPIC_A) for i in range(3)] + [env(i, TOPIC_B) for i in range(3, 6)])
    store.flush()
    assert len(store.query(T0, T0 + 10, topics=[TOPIC_B], bloom=full_bloom()).envelopes) == 3
    only_b = store.query(T0, T0 + 10, bloom=bloom_for_topics([TOPIC_B])).envelopes
    assert {r.topic for r in only_b} == {TOPIC_B}
    assert len(store.query(T0, T0 + 10, bloom=full_bloom()).envelopes) == 6


def test_log_replay_after_restart(engine, tmp_path):
    uri, wal = str(tmp_path / "e"), tmp_path / "wal"
    first = EnvelopeStore(DeltaTableRef(engine, uri), wal)
    first.open()
    first.put([env(i) for i in range(4)])
    first.writes.close()  # stop without committing
    again = EnvelopeStore(DeltaTableRef(engine, uri), wal)
    assert again.open() == 4
    again.flush()
    assert again.table.count() == 4
    again.close()
