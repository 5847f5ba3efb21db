"""The node's store service: group commit of concurrent puts."""

import json
import logging
import os
import pathlib
import subprocess
import sys
import threading
import time
import urllib.parse

import trio
import trio.testing

from wakustore.node import store_service
from wakustore.node.config import NodeConfig
from wakustore.node.store_service import MAINTENANCE_ATTEMPTS, running_store
from wakustore.protocols.message import WakuMessage
from wakustore.storage.write_path import record_rows

PUBSUB = "/waku/2/rs/16/32"


def test_concurrent_puts_share_log_writes_and_count_duplicates_once(engine, tmp_path):
    config = NodeConfig(data_dir=tmp_path / "node", flush_interval_s=60)
    results = {}

    async def main():
        async with running_store(config, engine) as service:
            appends = []
            wal = service.store.writes._wal
            original = wal.append
            wal.append = lambda records: appends.append(sum(map(record_rows, records))) or original(records)

            async def push(i):
                # pushes 0 and 1 carry the same message: one of them is a duplicate
                message = WakuMessage(b"m-%d" % max(i, 1), "/g/1/c/proto", timestamp=10**18 + i)
                results[i] = await service.put([(PUBSUB, message, 10**18)])

            async with trio.open_nursery() as nursery:
                for i in range(60):
                    nursery.start_soon(push, i)
            assert sum(appends) == 59  # messages logged
            assert len(appends) < 60  # several pushes per fsync
            assert service.store.pending == 59

    trio.run(main)
    assert sum(r.accepted for r in results.values()) == 59
    assert sum(r.duplicates for r in results.values()) == 1
    assert {results[0].accepted + results[1].accepted} == {1}


def test_health_reports_a_failed_maintenance_run_until_one_succeeds(engine, tmp_path):
    config = NodeConfig(data_dir=tmp_path / "node", flush_interval_s=60, maintenance_interval_s=0.05)
    seen = []

    async def main():
        async with running_store(config, engine) as service:
            assert service.health()["ok"] and service.health()["maintenance"] == {}
            real = service.maintain

            def failing(policy):
                raise RuntimeError("compaction failed")

            service.maintain = failing
            while service.last_maintenance is None or service.last_maintenance.ok:
                await trio.sleep(0.01)
            seen.append(service.health())
            service.maintain = real
            while not service.last_maintenance.ok:
                await trio.sleep(0.05)
            seen.append(service.health())

    trio.run(main)
    failed, recovered = seen
    assert failed["ok"] is False and "compaction failed" in failed["maintenance"]["error"]
    assert recovered["ok"] is True and recovered["maintenance"]["error"] is None


def test_health_reports_a_commit_stuck_in_the_engine_before_it_gives_up(engine, tmp_path, monkeypatch):
    """A commit the engine (or its storage) holds is reported past
    COMMIT_STUCK_S, not only once it fails: an engine retrying an
    unreachable object store gives up after minutes."""
    monkeypatch.setattr(store_service, "COMMIT_STUCK_S", 0.3)
    config = NodeConfig(data_dir=tmp_path / "node", flush_interval_s=60)
    release = threading.Event()
    seen = []

    async def main():
        async with running_store(config, engine) as service:
            real = service.store.flush
            service.store.flush = lambda: release.wait(30) and real()
            await service.put([(PUBSUB, WakuMessage(b"held", "/g/1/c/proto", timestamp=10**18), 10**18)])
            async with trio.open_nursery() as nursery:
                nursery.start_soon(service.flush)
                await trio.sleep(0.05)
                seen.append(service.health())  # running, not for long yet
                await trio.sleep(0.4)
                seen.append(service.health())
                release.set()
            seen.append(service.health())

    trio.run(main)
    assert seen[0]["ok"] and seen[0]["commit"] == {}
    assert not seen[1]["ok"] and not seen[1]["commit"]["ok"]
    assert "a commit has been running for" in seen[1]["commit"]["error"]
    assert seen[2]["ok"] and seen[2]["commit"]["ok"] and seen[2]["pending_messages"] == 0


def test_a_maintenance_attempt_that_fails_is_made_again_before_health_reports_it(engine, tmp_path):
    config = NodeConfig(data_dir=tmp_path / "node", flush_interval_s=60, maintenance_interval_s=0.05)
    attempts = []
    seen = []

    async def main():
        async with running_store(config, engine) as service:
            real = service.maintain

            def flaky(policy):
                attempts.append(1)
                if len(attempts) % MAINTENANCE_ATTEMPTS:
                    raise RuntimeError("engine restarting")
                return real(policy)

            service.maintain = flaky
            while len(attempts) < 2 * MAINTENANCE_ATTEMPTS:
                seen.append(service.health()["ok"])
                await trio.sleep(0.01)

    trio.run(main)
    assert all(seen) and len(seen) > 5  # the failed attempts never showed


def test_maintenance_right_after_the_engine_died_waits_for_it_and_succeeds(tmp_path):
    """The engine is killed just before a run, before supervision notices:
    the run's first step (the commit of the buffer) fails, supervision
    starts the engine again, and the next attempt commits the rows."""
    import os
    import signal

    from wakustore.storage.engine import Engine

    config = NodeConfig(data_dir=tmp_path / "node", flush_interval_s=3600, maintenance_interval_s=1.0)
    own = Engine("embedded")
    own.start()
    outcome = {}
    attempts = []

    async def main():
        async with running_store(config, own) as service:
            real = service.maintain
            service.maintain = lambda policy: attempts.append(1) or real(policy)
            now = time.time_ns()  # inside the default retention
            await service.put(
                [(PUBSUB, WakuMessage(b"m-%d" % i, "/g/1/c/proto", timestamp=now - i), now) for i in range(20)]
            )
            generation, pid = own.generation, own.pid
            os.kill(pid, signal.SIGKILL)
            while service.last_maintenance is None:
                await trio.sleep(0.05)
            outcome.update(
                health=service.health(),
                generation=own.generation - generation,
                pending=service.store.pending,
                rows=own.run(lambda spark: spark.read.format("delta").load(config.messages_uri).count()),
            )

    try:
        trio.run(main)
    finally:
        own.close()
    assert outcome["health"]["ok"] and outcome["health"]["maintenance"]["ok"], outcome
    assert outcome["generation"] >= 1 and outcome["pending"] == 0 and outcome["rows"] == 20
    assert len(attempts) >= 2  # the first attempt met the dead engine


def _message(i: int) -> WakuMessage:
    return WakuMessage(b"flush-%d" % i, "/g/1/c/proto", timestamp=10**18 + i)


async def _until(condition, timeout_s: float = 60.0) -> None:
    """Wait in real time (a worker-thread sleep, so also under a mock trio
    clock) until ``condition()`` holds; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await trio.to_thread.run_sync(time.sleep, 0.01)


def test_a_put_is_committed_when_the_flush_interval_since_the_last_commit_ends(engine, tmp_path):
    interval = 0.5
    config = NodeConfig(data_dir=tmp_path / "node", flush_interval_s=interval)
    started = []

    async def main():
        async with running_store(config, engine) as service:
            store = service.store
            real_flush = store.flush
            store.flush = lambda: started.append(time.monotonic()) or real_flush()
            await service.put([(PUBSUB, _message(1), 10**18)])
            await _until(lambda: store.writes.commits == 1)
            last_commit = store.writes._last_flush
            await service.put([(PUBSUB, _message(2), 10**18)])
            await _until(lambda: store.writes.commits == 2)
            assert store.writes.committed_rows == 2
            return last_commit

    last_commit = trio.run(main)
    # The second flush starts when the interval since the first commit
    # ends, not at a polling tick (slack for a loaded machine's scheduling).
    assert last_commit + interval - 0.01 <= started[-1] <= last_commit + interval + 2.0


def test_a_put_reaching_flush_max_messages_is_committed_without_waiting_the_interval(engine, tmp_path):
    config = NodeConfig(data_dir=tmp_path / "node", flush_interval_s=3600, flush_max_messages=5)

    async def main():
        async with running_store(config, engine) as service:
            await service.put([(PUBSUB, _message(i), 10**18) for i in range(5)])
            await _until(lambda: service.store.writes.committed_rows == 5)

    trio.run(main)


def test_an_idle_flush_loop_does_not_wake_up(engine, tmp_path):
    # A mock clock moves only when told: the jump below ends any timed
    # wait shorter than it (a polling loop's sleep), and nothing else.
    clock = trio.testing.MockClock()
    config = NodeConfig(data_dir=tmp_path / "node", flush_interval_s=0.05, flush_max_messages=1)
    looks = []

    async def main():
        async with running_store(config, engine) as service:
            store = service.store
            for name in ("flush_due", "flush_deadline"):
                real = getattr(store, name)
                setattr(store, name, lambda real=real, name=name: looks.append(name) or real())
            for round_ in range(2):
                await trio.testing.wait_all_tasks_blocked()
                before = len(looks)
                clock.jump(10.0)  # under the supervision and maintenance intervals
                await trio.testing.wait_all_tasks_blocked()
                assert len(looks) == before, f"the flush loop looked at an empty buffer {looks[before:]}"
                if round_ == 0:  # then once more after a commit
                    await service.put([(PUBSUB, _message(1), 10**18)])
                    await _until(lambda: store.writes.committed_rows == 1)

    trio.run(main, clock=clock)


def test_pages_are_answered_while_every_engine_thread_is_busy(engine, tmp_path):
    """A commit stuck in its MERGE and other engine work hold every engine
    thread: a page from the hot tier and a page read from the table are
    still answered, neither queued behind them."""
    from wakustore.node.store_service import ENGINE_THREADS
    from wakustore.protocols.store_query import HistoryQuery

    config = NodeConfig(data_dir=tmp_path / "node", flush_interval_s=3600)
    now = time.time_ns()
    day_ns = 86_400 * 10**9
    old = WakuMessage(b"from-the-table", "/g/1/c/proto", timestamp=now - 3 * day_ns)
    recent = WakuMessage(b"from-memory", "/g/1/c/proto", timestamp=now - 10**9)
    stuck = WakuMessage(b"being-committed", "/g/1/c/proto", timestamp=now - 2 * 10**9)
    release = threading.Event()
    pages = {}

    def page_of(start, end):
        return HistoryQuery(
            pubsub_topic=PUBSUB, content_topics=("/g/1/c/proto",), time_start=start, time_end=end, forward=True
        )

    async def main():
        async with running_store(config, engine) as service:
            await service.put([(PUBSUB, old, now)])
            await service.flush()
            assert service.store.hot.page(page_of(old.timestamp, old.timestamp + 1), None) is None
            real_merge = service.store.writes._commit

            def merge_stuck(*args):
                release.wait()
                real_merge(*args)

            service.store.writes._commit = merge_stuck
            await service.put([(PUBSUB, stuck, now), (PUBSUB, recent, now)])
            async with trio.open_nursery() as nursery:
                nursery.start_soon(service.flush)
                for _ in range(ENGINE_THREADS - 1):
                    nursery.start_soon(lambda: trio.to_thread.run_sync(release.wait, limiter=service.limiter))
                try:
                    # Wait until the commit has taken the two rows and every engine thread is held.
                    while service.limiter.borrowed_tokens < ENGINE_THREADS or not len(service.store.writes._inflight):
                        await trio.sleep(0.01)
                    with trio.fail_after(20):
                        pages["memory"] = await service.query(page_of(now - 3600 * 10**9, now))
                        pages["table"] = await service.query(page_of(old.timestamp - 10**9, now - day_ns))
                    assert service.limiter.borrowed_tokens == ENGINE_THREADS  # still all busy
                finally:
                    release.set()  # the engine threads end (the nursery waits for them)

    trio.run(main)
    assert [m.message.payload for m in pages["memory"].messages] == [b"being-committed", b"from-memory"]
    assert [m.message.payload for m in pages["table"].messages] == [b"from-the-table"]


def test_the_node_process_settings_are_made_once_in_one_place(monkeypatch, tmp_path):
    """configure_node_process sets the GIL switch interval, caps glibc's
    arenas (MALLOC_ARENAS; an operator's
    MALLOC_ARENA_MAX is left as it is), and filters py-libp2p's refused relay
    streams once. The arena cap itself is tried in a child: it lasts for the
    process's life."""
    from wakustore.node import process

    probe = "from wakustore import allocator; print(allocator.cap_malloc_arenas(2))"
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    capped = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    assert capped.stdout.strip() == "True"
    kept = subprocess.run(
        [sys.executable, "-c", probe], env={**env, "MALLOC_ARENA_MAX": "4"}, capture_output=True, text=True, check=True
    )
    assert kept.stdout.strip() == "False"

    calls, intervals = [], []
    monkeypatch.setattr(process.allocator, "cap_malloc_arenas", lambda n: calls.append(n) or True)
    monkeypatch.setattr(process.sys, "setswitchinterval", intervals.append)
    libp2p_log = logging.getLogger("libp2p.host.basic_host")
    monkeypatch.setattr(libp2p_log, "filters", [])
    owned = process.configure_node_process(NodeConfig(data_dir=tmp_path / "a"))
    shared = process.configure_node_process(NodeConfig(shared_table=True, data_dir=tmp_path / "b"))
    assert calls == [process.MALLOC_ARENAS] * 2
    assert intervals == [process.GIL_SWITCH_INTERVAL_S] * 2
    assert len(libp2p_log.filters) == 1
    assert all(any("malloc arenas" in s for s in done) for done in (owned, shared))
    # A refused relay stream and a failed identify are logged at DEBUG; other errors pass.
    refused = logging.LogRecord(
        "libp2p.host.basic_host",
        logging.ERROR,
        __file__,
        1,
        "failed: /vac/waku/relay/2.0.0 protocol not supported\nmore",
        None,
        None,
    )
    identify = logging.LogRecord(
        "libp2p.host.basic_host",
        logging.ERROR,
        __file__,
        1,
        "Failed to open stream to peer 16Uiu2:\n  Error: connection closed\n  Protocols: ['/ipfs/id/1.0.0']\n",
        None,
        None,
    )
    other = logging.LogRecord("libp2p.host.basic_host", logging.ERROR, __file__, 1, "something else", None, None)
    store = logging.LogRecord(
        "libp2p.host.basic_host",
        logging.ERROR,
        __file__,
        1,
        "Failed to open stream to peer 16Uiu2:\n  Protocols: ['/vac/waku/store-query/3.0.0']\n",
        None,
        None,
    )
    assert [libp2p_log.filters[0].filter(r) for r in (refused, identify, other, store)] == [False, False, True, True]


def test_a_damaged_data_file_answers_an_error_and_is_named_in_health_and_metrics(engine, tmp_path):
    """Bytes of a compacted day overwritten under the node: a page over that
    day fails (the wire answers 503), never a short page; the file is named
    in /health and counted in the metrics; the other day still serves."""
    import pyarrow as pa
    from deltalake import DeltaTable

    from wakustore.protocols.store_query import HistoryQuery
    from wakustore.storage import maintenance

    config = NodeConfig(data_dir=tmp_path / "node", flush_interval_s=60, maintenance_interval_s=3600)
    day = 86_400 * 10**9
    base = 10**18 - 10**18 % day  # a day's start, long past: the hot tier does not hold it
    topic = "/bad/1/file/proto"
    messages = [
        (PUBSUB, WakuMessage(os.urandom(300), topic, timestamp=base + (i % 2) * day + i), base) for i in range(600)
    ]
    seen = {}

    def page(first: int):
        query = HistoryQuery(
            pubsub_topic=PUBSUB,
            content_topics=(topic,),
            time_start=first,
            time_end=first + day,
            limit=100,
            forward=True,
        )
        return query

    async def main():
        async with running_store(config, engine) as service:
            for start in range(0, len(messages), 150):
                await service.put(messages[start : start + 150])
                await service.flush()
            await trio.to_thread.run_sync(maintenance.run_maintenance, service.store, None, base + 5 * day)
            await trio.to_thread.run_sync(service.store.reader.index_now)
            uri = service.store.table.uri
            files = pa.table(DeltaTable(uri).get_add_actions(flatten=True)).to_pydict()
            assert len(files["path"]) == 2  # one compacted file a day
            ((path, size),) = [
                (p, s)
                for p, s, d in zip(files["path"], files["size_bytes"], files["partition.day"])
                if str(d) == "2001-09-09"
            ]
            bad = os.path.join(uri, path)
            with open(bad, "rb") as handle:
                original = handle.read()
            with open(bad, "r+b") as handle:  # its pages zeroed, its size kept
                handle.seek(size // 4)
                handle.write(b"\0" * (size // 2))
            try:
                await service.query(page(base))
                seen["bad_day"] = "answered"
            except Exception as exc:  # noqa: BLE001  (the protocol layer answers 503 for it)
                seen["bad_day"] = str(exc)
            seen["good_day"] = len((await service.query(page(base + day))).messages)
            seen["health"] = service.health()
            seen["bad_metric"] = service.metrics.registry.get_sample_value(
                "wakustore_table_bad_files", {"table": "messages"}
            )
            seen["path"] = bad
            with open(bad, "wb") as handle:  # the bytes back (a transient fault, a restored file)
                handle.write(original)
            seen["again"] = len((await service.query(page(base))).messages)
            seen["health_after"] = service.health()

    trio.run(main)
    assert seen["bad_day"] != "answered" and "cannot be read" in seen["bad_day"]
    assert seen["good_day"] == 100
    health = seen["health"]
    # Named, and the node stays well: it serves every page that does not need the file.
    assert health["ok"] is True and list(health["bad_files"]) == [seen["path"]]
    assert seen["bad_metric"] == 1
    # A file that reads again is no longer reported.
    assert seen["again"] == 100
    assert seen["health_after"]["ok"] is True and seen["health_after"]["bad_files"] == {}


def test_a_log_version_a_power_cut_tore_is_put_aside_and_reported(engine, tmp_path):
    """The newest version names a data file that never reached the disk
    (and the synced marker is older): the node starts, says so in /health
    and the metrics, and serves what the write-ahead log still holds."""
    from wakustore.storage import commit_sync

    config = NodeConfig(data_dir=tmp_path / "node", flush_interval_s=60, maintenance_interval_s=3600)
    now = time.time_ns()
    first = [(PUBSUB, WakuMessage(b"first %d" % i, "/torn/1/log/proto", timestamp=now + i), now) for i in range(5)]
    later = [(PUBSUB, WakuMessage(b"later %d" % i, "/torn/1/log/proto", timestamp=now + 10 + i), now) for i in range(5)]
    wal_dir = config.data_dir / "wal" / "messages"
    seen: dict = {}

    async def fill():
        async with running_store(config, engine) as service:
            await service.put(first)
            await service.flush()
            seen["synced"] = service.store.table.sync_commits()
            await service.put(later)
            seen["wal"] = {p.name: p.read_bytes() for p in wal_dir.iterdir()}
            await service.flush()
            seen["uri"] = service.store.table.uri

    trio.run(fill)
    root = seen["uri"]
    torn = seen["synced"] + 1
    entry = os.path.join(root, "_delta_log", f"{torn:020d}.json")
    with open(entry) as handle:
        added = [json.loads(line)["add"]["path"] for line in handle if '"add"' in line]
    for path in added:
        os.unlink(os.path.join(root, urllib.parse.unquote(path)))
    commit_sync.write_synced_marker(pathlib.Path(root), seen["synced"])
    for name, data in seen["wal"].items():
        (wal_dir / name).write_bytes(data)

    async def restart():
        async with running_store(config, engine) as service:
            seen["health"] = service.health()
            seen["metric"] = service.metrics.registry.get_sample_value(
                "wakustore_table_log_versions_repaired", {"table": "messages"}
            )
            await service.flush()
            seen["rows"] = service.store.table.count()

    trio.run(restart)
    repair = seen["health"]["log_repair"]
    assert repair["versions"] == [torn] and "missing" in repair["reason"]
    assert os.path.isfile(os.path.join(repair["moved_to"], f"{torn:020d}.json"))
    assert seen["metric"] == 1
    assert seen["rows"] == 10


def test_a_query_while_a_commit_writes_the_hot_tier_is_answered_on_the_event_loop(engine, tmp_path, monkeypatch):
    """A thread holding the hot tier's writers' lock (a commit putting its
    rows in) neither blocks the event loop nor sends the page to a thread."""
    from wakustore.protocols.store_query import HistoryQuery

    config = NodeConfig(data_dir=tmp_path / "node", flush_interval_s=60, maintenance_interval_s=3600)
    now = time.time_ns()
    messages = [(PUBSUB, WakuMessage(b"m%d" % i, "/busy/1/hot/proto", timestamp=now + i), now) for i in range(5)]
    seen = {"threads": 0}
    held, release = threading.Event(), threading.Event()

    def writer(hot):
        with hot._lock:
            held.set()
            release.wait(30)

    async def main():
        async with running_store(config, engine) as service:
            await service.put(messages)
            await service.flush()
            original = service.store.reads.page
            monkeypatch.setattr(
                service.store.reads,
                "page",
                lambda *a, **k: seen.__setitem__("threads", seen["threads"] + 1) or original(*a, **k),
            )
            thread = threading.Thread(target=writer, args=(service.store.hot,))
            thread.start()
            try:
                assert await trio.to_thread.run_sync(held.wait, 10)
                with trio.fail_after(10):
                    page = await service.query(HistoryQuery(pubsub_topic=PUBSUB, content_topics=("/busy/1/hot/proto",)))
                seen["payloads"] = [m.message.payload for m in page.messages]
            finally:
                release.set()
                thread.join()

    trio.run(main)
    assert seen["threads"] == 0
    assert seen["payloads"] == [b"m%d" % i for i in range(5)]
