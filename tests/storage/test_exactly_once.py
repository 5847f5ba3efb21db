"""Every message the table holds is served exactly once, by every tier, after
crashes and restarts, and a MUID is one message whatever its timestamp."""

import dataclasses
import shutil

from wakustore.protocols.message import WakuMessage
from wakustore.protocols.store_query import validate_v3
from wakustore.storage import maintenance
from wakustore.storage.hot_tier import HotTier
from wakustore.storage.message_store import MessageStore, StoreConfig
from wakustore.storage.rows import Row
from wakustore.storage.table import DeltaTableRef

PUBSUB = "/waku/2/rs/16/32"
TOPIC = "/app/1/chat/proto"
SECOND = 10**9
DAY = 86_400 * SECOND


def msg(i, ts):
    return WakuMessage(payload=b"payload-%d" % i, content_topic=TOPIC, timestamp=ts)


def page_all(store, **kw):
    base = dict(
        pubsub_topic=PUBSUB,
        content_topics=[TOPIC],
        time_start=None,
        time_end=None,
        message_hashes=[],
        cursor=None,
        forward=True,
        limit=7,
        include_data=True,
    )
    base.update(kw)
    query = validate_v3(**base)
    out = []
    while True:
        page = store.query(query)
        out.extend(page.messages)
        if page.next_cursor is None:
            return out
        query = dataclasses.replace(query, cursor=page.next_cursor.message_hash)


def open_store(engine, tmp_path, wal="wal", **config):
    store = MessageStore(DeltaTableRef(engine, str(tmp_path / "messages")), tmp_path / wal, StoreConfig(**config))
    store.open()
    return store


def now_ns():
    import time

    return time.time_ns()


def test_rows_committed_before_a_crash_and_replayed_are_served_once(engine, tmp_path):
    # A kill -9 between the commit and the trim of the log: the restart
    # replays rows the table already holds.
    base = now_ns() - 60 * SECOND
    store = open_store(engine, tmp_path)
    store.put([(PUBSUB, msg(i, base + i * SECOND), base) for i in range(30)])
    shutil.copytree(tmp_path / "wal", tmp_path / "wal-before-trim")
    assert store.flush() == 30
    store.writes.close()  # no clean close: the process "dies" here
    shutil.rmtree(tmp_path / "wal")
    shutil.copytree(tmp_path / "wal-before-trim", tmp_path / "wal")

    again = open_store(engine, tmp_path)
    assert again.pending == 0, "rows the table holds are not pending again"
    assert again.wal_depth == 0, "the replayed log is trimmed once its rows are found in the table"
    for forward in (True, False):
        hashes = [m.message_hash for m in page_all(again, forward=forward)]
        assert len(hashes) == len(set(hashes)) == 30
    assert len(again.hot) == 30
    # Maintenance over the rebuilt tier works and leaves nothing behind.
    cutoff = base + 10 * SECOND
    maintenance.delete_before(again.table, cutoff)
    again.forget_before(cutoff)
    assert [m.message.payload for m in page_all(again)] == [b"payload-%d" % i for i in range(10, 30)]
    backward = [m.message.payload for m in page_all(again, forward=False)]
    assert sorted(backward) == sorted(b"payload-%d" % i for i in range(10, 30))
    again.close()
    assert again.table.count() == 20


def test_the_same_message_with_a_new_timestamp_on_another_day_is_a_duplicate(engine, tmp_path):
    # The MUID leaves the timestamp out: a message sent again days later is
    # the message the table already holds, even after a restart emptied the
    # node's set of recent MUIDs.
    first = now_ns() - 3 * DAY
    store = open_store(engine, tmp_path)
    store.put([(PUBSUB, msg(1, first), first)])
    store.flush()
    store.close()

    store = open_store(engine, tmp_path)
    result = store.put([(PUBSUB, msg(1, first + 2 * DAY), first + 2 * DAY)])
    assert (result.accepted, result.duplicates) == (0, 1)
    assert [m.timestamp for m in page_all(store)] == [first], "only the first copy is ever served"
    store.flush()
    assert store.table.count() == 1
    store.close()


def test_a_far_duplicate_past_the_recent_set_is_not_served_before_its_commit(engine, tmp_path):
    first = now_ns() - 2 * DAY
    store = open_store(engine, tmp_path, recent_muids=1)
    store.put([(PUBSUB, msg(i, first + i), first) for i in range(5)])
    store.flush()
    later = now_ns()
    result = store.put([(PUBSUB, msg(i, later + i), later) for i in range(5)])
    assert result.accepted == 0
    assert [m.timestamp for m in page_all(store)] == [first + i for i in range(5)]
    store.flush()
    assert store.table.count() == 5
    store.close()


def test_a_message_removed_by_retention_is_stored_again_when_it_comes_back(engine, tmp_path):
    old = now_ns() - 10 * 60 * SECOND
    store = open_store(engine, tmp_path)
    store.put([(PUBSUB, msg(1, old), old)])
    store.flush()
    cutoff = old + SECOND
    maintenance.delete_before(store.table, cutoff)
    store.forget_before(cutoff)
    assert page_all(store) == []
    fresh = now_ns()
    assert store.put([(PUBSUB, msg(1, fresh), fresh)]).accepted == 1
    assert [m.timestamp for m in page_all(store)] == [fresh]
    store.close()


def test_a_cursor_removed_by_retention_is_unknown(engine, tmp_path):
    import pytest

    from wakustore.protocols.errors import StoreError

    base = now_ns() - 10 * 60 * SECOND
    store = open_store(engine, tmp_path)
    store.put([(PUBSUB, msg(i, base + i * SECOND), base) for i in range(10)])
    store.flush()
    first = store.query(
        validate_v3(
            pubsub_topic=PUBSUB,
            content_topics=[TOPIC],
            time_start=None,
            time_end=None,
            message_hashes=[],
            cursor=None,
            forward=True,
            limit=3,
            include_data=True,
        )
    )
    cursor = first.next_cursor.message_hash
    maintenance.delete_before(store.table, base + 5 * SECOND)
    store.forget_before(base + 5 * SECOND)
    with pytest.raises(StoreError):
        page_all(store, cursor=cursor)
    store.close()


def test_hot_tier_keeps_one_row_per_muid_and_forgets_cleanly():
    now = now_ns()
    tier = HotTier(1 << 20, DAY)
    row = Row.build(PUBSUB, msg(1, now - SECOND), now)
    copy = Row.build(PUBSUB, msg(1, now - 2 * SECOND), now)  # same MUID, another hash
    other = Row.build(PUBSUB, msg(2, now - SECOND), now)
    tier.start(now - 10 * SECOND, [row, row, copy, other], now)
    assert len(tier) == 2
    query = validate_v3(
        pubsub_topic=PUBSUB,
        content_topics=[TOPIC],
        time_start=now - 10 * SECOND,
        time_end=None,
        message_hashes=[],
        cursor=None,
        forward=True,
        limit=20,
        include_data=True,
    )
    assert _hashes(tier.page(query, None)) == sorted(
        [row.message_hash, other.message_hash], key=lambda h: (now - SECOND, h)
    )
    tier.add([copy, row], now)
    assert len(tier) == 2
    tier.forget_before(now)
    assert len(tier) == 0
    assert tier.page(query, None).count == 0


class EngineDownForLookups(DeltaTableRef):
    """The table as the node sees it while its engine restarts: lookups fail."""

    down = False

    def existing_keys(self, *args, **kwargs):
        if self.down:
            raise ConnectionError("engine restarting")
        return super().existing_keys(*args, **kwargs)


def test_puts_that_need_the_engine_pause_while_it_is_down_and_are_decided_at_commit(engine, tmp_path):
    from wakustore.storage import schema
    from wakustore.storage.reader import TableReader

    base = now_ns() - 2 * DAY
    table = EngineDownForLookups(engine, str(tmp_path / "messages"))
    # Without the key index the reader cannot say which keys the table
    # holds: the engine is the one to ask.
    store = MessageStore(
        table, tmp_path / "wal", StoreConfig(recent_muids=1), reader=TableReader(table.uri, key_index=False)
    )
    store.open()
    store.put([(PUBSUB, msg(i, base + i), base) for i in range(3)])
    store.flush()

    later = now_ns()
    lucky = msg(99, later)  # new, but its key filter says "maybe" (a false positive)
    store.writes.key_filter.add([Row.build(PUBSUB, lucky, later).muid], [schema.day_of_ns(base)])
    table.down = True
    result = store.put([(PUBSUB, msg(0, later), later), (PUBSUB, lucky, later)])
    assert result.accepted == 2, "durable in the log although the engine cannot be asked"
    assert [m.timestamp for m in page_all(store)] == [base, base + 1, base + 2], "not shown before they are decided"
    table.down = False
    store.flush()
    assert [m.message.payload for m in page_all(store)] == [b"payload-0", b"payload-1", b"payload-2", b"payload-99"]
    assert store.hot.timestamp_of(Row.build(PUBSUB, lucky, later).message_hash) == later
    assert store.table.count() == 4
    store.close()


def test_old_duplicates_are_found_in_process_while_the_engine_is_down(engine, tmp_path):
    """The key index answers which MUIDs a day holds: a duplicate older than
    the recent set is dropped at once, and a false positive of the day
    filter is accepted and shown at once, with no engine call."""
    from wakustore.storage import schema

    base = now_ns() - 2 * DAY
    table = EngineDownForLookups(engine, str(tmp_path / "messages"))
    store = MessageStore(table, tmp_path / "wal", StoreConfig(recent_muids=1))
    store.open()
    store.put([(PUBSUB, msg(i, base + i), base) for i in range(3)])
    store.flush()

    later = now_ns()
    lucky = msg(99, later)
    store.writes.key_filter.add([Row.build(PUBSUB, lucky, later).muid], [schema.day_of_ns(base)])
    table.down = True
    result = store.put([(PUBSUB, msg(0, later), later), (PUBSUB, msg(2, later + 1), later), (PUBSUB, lucky, later)])
    assert (result.accepted, result.duplicates) == (1, 2)
    assert store.writes.engine_lookups == 0
    assert [m.message.payload for m in page_all(store)] == [b"payload-0", b"payload-1", b"payload-2", b"payload-99"]
    table.down = False
    store.flush()
    assert store.table.count() == 4
    assert store.writes.merged_rows == 0, "every row was known new: a plain append"
    store.close()


def test_queries_do_not_wait_for_the_log_fsync_of_a_put(engine, tmp_path):
    import threading

    # No hot tier: the query reads the table and the pending rows.
    store = open_store(engine, tmp_path, hot_tier_bytes=0)
    store.put([(PUBSUB, msg(0, now_ns()), now_ns())])
    wal = store.writes._wal
    in_fsync, release = threading.Event(), threading.Event()
    real_append = wal.append

    def slow_append(records):
        in_fsync.set()
        release.wait(30)  # a disk that takes its time
        return real_append(records)

    wal.append = slow_append
    putter = threading.Thread(target=store.put, args=([(PUBSUB, msg(1, now_ns()), now_ns())],))
    putter.start()
    assert in_fsync.wait(30)
    answered = []
    reader = threading.Thread(target=lambda: answered.append(page_all(store)))
    reader.start()
    reader.join(10)
    finished_first = not reader.is_alive()
    release.set()
    putter.join(30)
    reader.join(30)
    assert finished_first, "a query waited for another put's fsync"
    assert [m.message.payload for m in answered[0]] == [b"payload-0"], (
        "the row in flight is not shown before its put returns"
    )
    assert [m.message.payload for m in page_all(store)] == [b"payload-0", b"payload-1"]
    store.close()


def _hashes(rows):
    """The message hashes of a hot-tier page, in its order."""
    return rows.table.column("message_hash").take(rows.order).to_pylist()
