"""MessageStore.import_rows: one transaction per import, exact counts by MUID."""

import time
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from wakustore.protocols.message import WakuMessage
from wakustore.protocols.store_query import validate_v3
from wakustore.storage import staging

PUBSUB = "/waku/2/rs/16/32"
TOPIC = "/app/1/import/proto"
DAY = 86_400 * 10**9
T0 = 1_700_000_000 * 10**9


def msg(i, ts=None, payload=None):
    return WakuMessage(payload=payload or b"import-%d" % i, content_topic=TOPIC, timestamp=T0 + i if ts is None else ts)


def triples(messages):
    return [(PUBSUB, m, m.timestamp) for m in messages]


def commits(store) -> list[str]:
    """Operations in the table's log after its creation, oldest first."""
    history = DeltaTable(store.table.uri).history()
    return [h["operation"] for h in reversed(history)][1:]


def rows(store) -> int:
    return int(sum(pa.table(DeltaTable(store.table.uri).get_add_actions(flatten=True))["num_records"].to_pylist()))


def test_counts_are_exact_across_days_and_repeats(store):
    # Stored once on day 0; the same message (same MUID) comes back with a
    # timestamp days later, which a merge scoped to the batch's days misses.
    store.put(triples([msg(0)]))
    store.flush()
    later = msg(0, ts=T0 + 3 * DAY)
    batch = [later, *(msg(i, ts=T0 + i * DAY // 2) for i in range(1, 9)), msg(1, ts=T0 + DAY // 2)]
    before = len(commits(store))
    assert store.import_rows(triples(batch)) == (8, 2)  # the day-0 copy and the repeat of line 2
    assert len(commits(store)) == before + 1
    assert rows(store) == 9
    assert store.import_rows(triples(batch)) == (0, 10)
    assert rows(store) == 9
    # The store knows the imported MUIDs: a put of one is a duplicate.
    assert store.put(triples([msg(5, ts=T0 + 5 * DAY // 2)])).accepted == 0
    store.flush()
    assert rows(store) == 9


def test_a_failing_input_commits_nothing(store, monkeypatch):
    monkeypatch.setattr(staging, "STAGING_THRESHOLD_BYTES", 16 * 1024)  # rows already spilled to disk

    def lines():
        for i in range(1000):
            if i == 700:
                raise ValueError("bad line 701")
            yield PUBSUB, msg(i), T0 + i

    before = commits(store)
    with pytest.raises(ValueError, match="bad line 701"):
        store.import_rows(lines())
    assert commits(store) == before and rows(store) == 0
    # The staging directory is cleaned up and the store keeps working.
    staged = Path(store.table.uri.rstrip("/") + "_staging")
    assert not staged.exists() or not any(staged.iterdir())
    assert store.import_rows(triples([msg(1)])) == (1, 0)


def test_a_large_import_is_staged_on_disk_and_committed_once(store, monkeypatch):
    # A small threshold forces the Parquet spill a large file takes.
    monkeypatch.setattr(staging, "STAGING_THRESHOLD_BYTES", 64 * 1024)
    messages = [msg(i, ts=T0 + (i % 7) * DAY + i, payload=b"%d-" % i + b"x" * 300) for i in range(12_000)]
    before = len(commits(store))
    assert store.import_rows(triples(messages + messages[:500])) == (12_000, 500)
    assert len(commits(store)) == before + 1
    assert rows(store) == 12_000


def test_recent_imports_are_answered_once_by_the_hot_tier(store):
    now = time.time_ns()
    old = WakuMessage(b"again", TOPIC, timestamp=now - 5 * DAY)
    store.put([(PUBSUB, old, old.timestamp)])
    store.flush()
    assert store.hot.enabled and store.hot.start_ns is not None
    fresh = [WakuMessage(b"fresh-%d" % i, TOPIC, timestamp=now - i * 10**9) for i in range(5)]
    again = WakuMessage(b"again", TOPIC, timestamp=now - 10**9 // 2)  # same MUID as old, recent time
    assert store.import_rows(triples([*fresh, again])) == (5, 1)
    query = validate_v3(
        pubsub_topic=PUBSUB,
        content_topics=[TOPIC],
        time_start=now - DAY,
        time_end=None,
        message_hashes=[],
        cursor=None,
        forward=True,
        limit=None,
        include_data=True,
    )
    page = store.query(query)
    assert sorted(m.message.payload for m in page.messages) == sorted(m.payload for m in fresh)


def test_history_older_than_the_hot_window_is_found_after_import(store):
    # A young store's hot tier covers all time; imported history older than
    # its window must not be hidden behind it.
    now = time.time_ns()
    store.put([(PUBSUB, WakuMessage(b"live", TOPIC, timestamp=now), now)])
    store.flush()
    old = [WakuMessage(b"old-%d" % i, TOPIC, timestamp=now - (3 + i) * DAY) for i in range(3)]
    assert store.import_rows(triples([*old, WakuMessage(b"recent", TOPIC, timestamp=now - 10**9)])) == (4, 0)
    query = validate_v3(
        pubsub_topic=PUBSUB,
        content_topics=[TOPIC],
        time_start=None,
        time_end=None,
        message_hashes=[],
        cursor=None,
        forward=True,
        limit=None,
        include_data=True,
    )
    got = [m.message.payload for m in store.query(query).messages]
    assert got == [b"old-2", b"old-1", b"old-0", b"recent", b"live"]
