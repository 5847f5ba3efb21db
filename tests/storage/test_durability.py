"""Crash safety and fleets: real processes, real kills, one shared table."""

import subprocess
import sys
import textwrap
import threading
import time

import pytest

from wakustore.protocols.message import WakuMessage
from wakustore.storage.message_store import MessageStore, StoreConfig
from wakustore.storage.table import DeltaTableRef

PUBSUB = "/waku/2/rs/16/32"
T0 = 1_700_000_000 * 10**9

WRITER = textwrap.dedent(
    """
    import sys
    from wakustore.protocols.message import WakuMessage
    from wakustore.storage.engine import Engine
    from wakustore.storage.message_store import MessageStore, StoreConfig
    from wakustore.storage.table import DeltaTableRef

    uri, wal, first, last, flush_every, shared = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:7])
    engine = Engine("embedded")
    store = MessageStore(DeltaTableRef(engine, uri), wal, StoreConfig(shared_table=bool(shared)))
    store.open()
    batch = 50
    for start in range(first, last, batch):
        messages = [
            ("{pubsub}", WakuMessage(b"msg-%d" % i, "/fleet/1/t/proto", timestamp={t0} + i * 1000), {t0})
            for i in range(start, min(start + batch, last))
        ]
        store.put(messages)
        print(min(start + batch, last), flush=True)  # acknowledged up to here
        if flush_every and (start // batch) % flush_every == 0:
            store.flush()
    store.close()
    engine.close()
    """
).format(pubsub=PUBSUB, t0=T0)


def _writer(tmp_path, uri, wal, first, last, flush_every, shared):
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    return subprocess.Popen(
        [sys.executable, str(script), uri, str(wal), str(first), str(last), str(flush_every), str(int(shared))],
        stdout=subprocess.PIPE,
        stderr=open(tmp_path / f"writer-{first}.log", "w"),
        text=True,
    )


def _payloads(engine, uri):
    store = MessageStore(DeltaTableRef(engine, uri), "/nonexistent-wal-unused", StoreConfig(hot_tier_bytes=0))
    table = store.table
    rows = table.engine.run(lambda spark: spark.read.format("delta").load(uri).select("payload").collect())
    return [bytes(r[0]) for r in rows]


@pytest.mark.slow
def test_two_processes_merging_into_one_table_lose_nothing_and_duplicate_nothing(engine, tmp_path):
    uri = str(tmp_path / "shared")
    # Overlapping ranges, flushing every batch: commits race on the same days.
    a = _writer(tmp_path, uri, tmp_path / "wal-a", 0, 600, 1, shared=True)
    b = _writer(tmp_path, uri, tmp_path / "wal-b", 300, 900, 1, shared=True)
    assert a.wait(timeout=300) == 0
    assert b.wait(timeout=300) == 0
    payloads = _payloads(engine, uri)
    assert len(payloads) == 900
    assert set(payloads) == {b"msg-%d" % i for i in range(900)}


@pytest.mark.slow
@pytest.mark.parametrize("shared", [False, True], ids=["owned-table", "shared-table"])
def test_kill_9_mid_ingest_loses_nothing_acknowledged(engine, tmp_path, shared):
    uri, wal = str(tmp_path / "m"), tmp_path / "wal"
    writer = _writer(tmp_path, uri, wal, 0, 100_000, 7, shared)
    acknowledged = 0
    deadline = time.monotonic() + 120
    for line in writer.stdout:
        acknowledged = int(line)
        if acknowledged >= 3000 or time.monotonic() > deadline:
            break
    writer.kill()  # SIGKILL, somewhere inside a put or a flush
    writer.wait()
    assert acknowledged >= 3000
    store = MessageStore(DeltaTableRef(engine, uri), wal, StoreConfig(shared_table=shared))
    store.open()
    store.flush()
    payloads = set(_payloads(engine, uri))
    store.close()
    missing = [i for i in range(acknowledged) if b"msg-%d" % i not in payloads]
    assert missing == []
    assert len(payloads) == len(_payloads(engine, uri))  # no duplicate rows


def test_window_replace_is_one_transaction_seen_whole_or_not_at_all(engine, tmp_path):
    from deltalake import DeltaTable

    from wakustore.storage.rows import Row

    store = MessageStore(DeltaTableRef(engine, str(tmp_path / "w")), tmp_path / "wal", StoreConfig(hot_tier_bytes=0))
    store.open()
    old = [Row.build(PUBSUB, WakuMessage(b"old-%d" % i, "/w/1/t/proto", timestamp=T0 + i), T0) for i in range(200)]
    new = [Row.build(PUBSUB, WakuMessage(b"new-%d" % i, "/w/1/t/proto", timestamp=T0 + i), T0) for i in range(150)]
    store.put([(r.pubsub_topic, r.message, T0) for r in old])
    store.flush()
    before = DeltaTable(store.table.uri).version()
    seen = []
    stop = threading.Event()

    def reader():
        while not stop.is_set():
            rows = store.table.engine.run(
                lambda spark: spark.read.format("delta").load(store.table.uri).select("payload").collect()
            )
            seen.append({bytes(r[0])[:3] for r in rows} | {len(rows)})

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        store.replace_window(T0, T0 + 1000, ["/w/1/t/proto"], new)
        # Reads went on through the commit: wait for one that began after it.
        after = len(seen) + 1
        deadline = time.monotonic() + 60
        while len(seen) <= after and time.monotonic() < deadline:
            stop.wait(0.01)
    finally:
        stop.set()
        thread.join()
    assert DeltaTable(store.table.uri).version() == before + 1
    assert seen[-1] == {b"new", 150}  # the last read saw the committed window
    for snapshot in seen:
        assert snapshot in ({b"old", 200}, {b"new", 150}), snapshot
    store.close()
