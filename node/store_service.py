"""The storage side of a running node: engine, message store and the loops
that flush, retain and compact, all owned by one trio nursery."""

from __future__ import annotations

import functools
import logging
import shutil
import time
from collections.abc import Callable
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

import trio

from wakustore.durable import make_dirs
from wakustore.node.config import NodeConfig, new_engine
from wakustore.node.disk import DiskGuard
from wakustore.node.flush_loop import FlushLoop
from wakustore.node.metrics import NodeMetrics
from wakustore.protocols.message import WakuMessage
from wakustore.protocols.store_query import HistoryQuery, Page
from wakustore.storage import maintenance
from wakustore.storage.engine import Engine
from wakustore.storage.message_store import MessageStore, PutResult, StoreConfig
from wakustore.storage.table import DeltaTableRef
from wakustore.storage.wal import DamagedRegion, kept_damage

log = logging.getLogger(__name__)

# Blocking engine work runs in worker threads; two concurrent Spark calls
# per core is plenty on the 2-core machines this targets.
ENGINE_THREADS = 4

# Pages read from the table's files run in worker threads of their own,
# never queued behind engine work (commits, maintenance, supervision): the
# in-process reader needs no engine. The reader's scans release the GIL,
# its Python steps do not: one thread per core of the 2-core machines this
# targets. Four threads cost more CPU per page, not less (`bench wire`,
# 16 clients, 100k messages, interleaved runs: node CPU 2.4-3.4 ms/query
# with two threads, 3.0-4.0 ms with four; the extra threads only take turns
# at the GIL with the event loop).
READ_THREADS = 2


# Puts waiting for the log writer (senders wait beyond this: backpressure),
# and the most one log write takes at once.
PUT_QUEUE = 1024
GROUP_COMMIT_MAX = 256

# Engine health check and gauges. Sail drops a session idle for 900 s
# (SAIL_SPARK__SESSION_TIMEOUT_SECS); checking every 30 s keeps it alive
# and catches a dead or bloated child between requests.
SUPERVISE_INTERVAL_S = 30.0
# A maintenance run is tried this many times, this far apart, before
# /health reports it failed (see StoreService.maintain_once).
MAINTENANCE_ATTEMPTS = 3
MAINTENANCE_RETRY_S = 10.0
# A commit of the buffer still running after this long makes /health
# report the node not well, before the commit itself gives up (an engine
# retrying an unreachable object store takes minutes to). A commit takes
# ~0.3-1.6 s at 10M messages (BENCHMARKS.md).
COMMIT_STUCK_S = 15.0


@dataclass(slots=True, eq=False)
class PendingPut:
    """One caller's put waiting for the log writer; ``done`` is set once
    ``result`` or ``error`` is."""

    messages: list[tuple[str, WakuMessage, int]]
    done: trio.Event = field(default_factory=trio.Event)
    result: PutResult | None = None
    error: Exception | None = None


@dataclass(frozen=True, slots=True)
class MaintenanceRun:
    """How a maintenance run (retention, compaction) or the last commit
    ended; ``at`` in Unix seconds."""

    ok: bool
    at: float
    error: str | None = None


@dataclass
class StoreService:
    config: NodeConfig
    engine: Engine
    store: MessageStore
    limiter: trio.CapacityLimiter
    metrics: NodeMetrics = field(default_factory=NodeMetrics)
    # Set by the archive scheduler: returns the time (ns) from which history
    # is not yet in a seeded archive and must not be retained away.
    keep_from: Callable[[], int | None] = lambda: None
    # The node's relay once it runs (node/running.py): /health reports its
    # peers per served shard.
    relay: Any = None
    # The last maintenance run; None before the first.
    last_maintenance: MaintenanceRun | None = None
    # The last commit of the buffer; a failed one (engine or storage down)
    # leaves the messages in the log, acknowledged, and the node not well.
    last_commit: MaintenanceRun | None = None
    # time.monotonic() when the commit running now started; None between commits.
    commit_since: float | None = None

    def __post_init__(self) -> None:
        # Engine work takes ``limiter``; pages read from the table take this one.
        self.read_limiter = trio.CapacityLimiter(READ_THREADS)
        self._puts_send, self._puts_receive = trio.open_memory_channel[PendingPut](PUT_QUEUE)
        # The flush policy (interval and size) lives in StoreConfig; this
        # loop only sleeps until it says a commit is due.
        self.flusher = FlushLoop(lambda: self.store.flush_deadline(), self.flush, "message")
        self.disk = DiskGuard(self.config.data_dir, self.config.min_free_bytes)
        # Set when the disk runs full with a size: retention configured: the
        # maintenance loop runs at once instead of at its next interval.
        self._maintain_now = trio.Event()
        self._full_since: float | None = None
        self.metrics.table_bad_files.labels("messages").set_function(lambda: len(self.store.reader.bad_files()))
        self.metrics.key_index_damaged.labels("messages").set_function(lambda: self.store.reader.index_damaged)
        self.metrics.table_log_repaired.labels("messages").set(len(self.store.repaired.versions))
        for table in self.wal_damage():
            self.metrics.wal_damaged_regions.labels(table).set_function(functools.partial(self._damaged_regions, table))
            self.metrics.wal_damaged_bytes.labels(table).set_function(functools.partial(self._damaged_bytes, table))

    async def put(self, messages: list[tuple[str, WakuMessage, int]], source: str = "lightpush") -> PutResult:
        """Durably store ``messages``; concurrent callers share one log write
        (group commit: one fsync for all the pushes that arrived meanwhile).
        Raises :class:`~wakustore.node.disk.DiskFull` under the data dir's
        free-space floor."""
        self._check_disk()
        pending = PendingPut(messages)
        await self._puts_send.send(pending)
        await pending.done.wait()
        if pending.error is not None:
            raise pending.error
        result = pending.result
        assert result is not None  # done is set once result or error is
        self.metrics.ingested.labels(source).inc(result.accepted)
        self.metrics.deduplicated.labels(source).inc(result.duplicates)
        self.metrics.wal_depth.labels("messages").set(self.store.wal_depth)
        return result

    def _check_disk(self) -> None:
        if not self.disk.full():
            if self._full_since is not None:
                log.warning("disk space is back over min_free_bytes: taking messages again")
                self._full_since = None
            return
        if self._full_since is None:
            self._full_since = time.monotonic()
            log.error("%s: refusing messages until space returns", self.disk.reason())
            if maintenance.RetentionPolicy.parse(self.config.retention).max_bytes is not None:
                self._maintain_now.set()
        self.disk.check()

    async def query(self, query: HistoryQuery) -> Page:
        """One page. A page memory answers (the hot tier: ~0.1 ms) is answered
        here on the event loop, with no thread hop and no queue; the others
        read the table in a reader thread, never waiting for engine work."""
        reads = self.store.reads
        answer = reads.from_memory(query)
        if isinstance(answer, Page):
            return answer
        return await trio.to_thread.run_sync(
            functools.partial(reads.page, query, memory_tried=True, part=answer), limiter=self.read_limiter
        )

    async def _writer_loop(self) -> None:
        """The one task that writes the log: takes every waiting put, writes
        them in one batch, wakes their callers."""
        async with self._puts_receive:
            async for first in self._puts_receive:
                puts = [first]
                while len(puts) < GROUP_COMMIT_MAX:
                    try:
                        puts.append(self._puts_receive.receive_nowait())
                    except trio.WouldBlock:
                        break
                groups = [put.messages for put in puts]
                try:
                    results = await trio.to_thread.run_sync(self.store.put_groups, groups, limiter=self.limiter)
                except Exception as exc:
                    for put in puts:
                        put.error = exc
                else:
                    for put, result in zip(puts, results):
                        put.result = result
                    self.flusher.notify()
                for put in puts:
                    put.done.set()

    async def flush(self) -> int:
        started = time.perf_counter()
        self.commit_since = time.monotonic()
        try:
            committed = await trio.to_thread.run_sync(self.store.flush, limiter=self.limiter)
        except Exception as exc:
            self.last_commit = MaintenanceRun(ok=False, at=time.time(), error=repr(exc)[:500])
            raise
        finally:
            self.commit_since = None
        if committed or self.last_commit is not None:
            self.last_commit = MaintenanceRun(ok=True, at=time.time())
        if committed:
            self.metrics.commit_latency.labels("messages").observe(time.perf_counter() - started)
            try:
                _, rows, size = await trio.to_thread.run_sync(self.store.reader.totals, limiter=self.limiter)
            except Exception as exc:  # the gauges wait for the next commit
                log.debug("table totals unavailable after a commit: %s", exc)
            else:
                self.metrics.table_rows.labels("messages").set(rows)
                self.metrics.table_bytes.labels("messages").set(size)
        self.metrics.wal_depth.labels("messages").set(self.store.wal_depth)
        return committed

    def health(self) -> dict:
        """For /health: the engine answers and the write path is not stuck."""
        engine = self.engine.health()
        bad_files = self.store.reader.bad_files()
        commit = self.last_commit
        since = self.commit_since
        if since is not None and (running := time.monotonic() - since) >= COMMIT_STUCK_S:
            # Still waiting on the engine or the storage: as good as failed.
            commit = MaintenanceRun(
                ok=False, at=time.time() - running, error=f"a commit has been running for {running:.0f} s"
            )
        return {
            # A failed maintenance run (retention, compaction) is the
            # operator's to see: the node answers, but is not well. A bad
            # data file is reported below but leaves ``ok`` alone: the node
            # serves every page that does not need it, and a restart (what
            # a failing probe leads to) would not mend it.
            "ok": bool(engine.healthy)
            and all(run is None or run.ok for run in (self.last_maintenance, commit))
            and not self.disk.full(),
            "maintenance": {} if self.last_maintenance is None else asdict(self.last_maintenance),
            "commit": {} if commit is None else asdict(commit),
            "engine": {"generation": engine.generation, "rss_bytes": engine.rss_bytes, "problem": engine.problem},
            "pending_messages": self.store.pending,
            "wal_depth": self.store.wal_depth,
            "hot_tier_messages": len(self.store.hot),
            # Data files whose key index is being built (new files, or an
            # index file missing or damaged: pages over them read through
            # DataFusion meanwhile), and whether the key filter is full
            # (a start fills it from the index files in the background).
            "key_index": {
                **self.store.reader.index_state(),
                "key_filter_ready": self.store.writes.filter_ready.is_set(),
            },
            **self._relay_health(),
            "disk": self.disk.report(),
            # Data files a read failed on (damaged, truncated, missing,
            # unreadable), each with its problem: pages that need one answer
            # 503 until it reads again or leaves the table (retention of its
            # day); the others are served.
            "bad_files": bad_files,
            # Log versions a power cut tore, put aside when the node started
            # (their rows came back from the write-ahead log).
            "log_repair": self._log_repair(),
            # Damaged regions of the write-ahead logs a start skipped (the
            # messages in them are lost, the records after them were
            # replayed), listed until an operator removes their copies. Not
            # a reason for ok: false: the node stores and serves everything
            # else, and the restart a failing probe leads to brings nothing
            # back.
            "wal_damage": [
                {"table": table, **region.describe()}
                for table, regions in self.wal_damage().items()
                for region in regions
            ],
            "config": self.effective_config(),
        }

    def wal_damage(self) -> dict[str, list[DamagedRegion]]:
        """The damaged regions of each table's write-ahead log (by table)
        that a start skipped, kept under the log's ``damaged/`` until an
        operator removes them (storage/wal.py). The mailserver's log is
        read from its directory: a region whose copy failed is in the log
        lines only."""
        return {
            "messages": self.store.wal_damage(),
            "envelopes": kept_damage(self.config.data_dir / "wal" / "envelopes"),
        }

    def _damaged_regions(self, table: str) -> int:
        return len(self.wal_damage()[table])

    def _damaged_bytes(self, table: str) -> int:
        return sum(region.size for region in self.wal_damage()[table])

    def _log_repair(self) -> dict:
        repaired = self.store.repaired
        if not repaired:
            return {}
        return {"versions": repaired.versions, "reason": repaired.reason, "moved_to": str(repaired.directory)}

    def effective_config(self) -> dict:
        """What the node runs with that an operator most often gets wrong:
        logged at start and in /health."""
        config = self.config
        return {
            "cluster_id": config.cluster_id,
            "shards": sorted(config.shards),
            "retention": config.retention,
            "relay": config.relay,
            "engine": config.engine,
            "table": config.messages_uri,
            "shared_table": config.shared_table,
        }

    def _relay_health(self) -> dict:
        """Relay peers per served pubsub topic, and the topics with none (a
        served shard nobody relays to this node: it stores nothing of it)."""
        relay = self.relay
        if relay is None or not relay.running:
            return {}
        peers = {topic: relay.peer_count(topic) for topic in relay.topics}
        return {"relay": {"peers": peers, "topics_without_peers": [t for t, n in peers.items() if n == 0]}}

    async def _supervise_loop(self) -> None:
        while True:
            await trio.sleep(SUPERVISE_INTERVAL_S)
            await self._supervise_once()

    async def _supervise_once(self) -> None:
        try:
            health = await trio.to_thread.run_sync(self.engine.supervise, limiter=self.limiter)
        except Exception as exc:
            log.warning("engine supervision failed: %s", exc)
            return
        self._set_engine_gauges(health.generation, health.rss_bytes)

    def _set_engine_gauges(self, generation: int, rss_bytes: int | None) -> None:
        # The generation /health reports: sessions started, 1 after the first start.
        self.metrics.engine_generation.set(generation)
        if rss_bytes is not None:
            self.metrics.engine_rss.set(rss_bytes)

    def _set_table_gauges(self, stats: maintenance.TableStats | None) -> None:
        if stats is not None:
            self.metrics.table_bytes.labels("messages").set(stats.bytes)
            self.metrics.table_rows.labels("messages").set(stats.rows)

    def refresh_gauges(self) -> None:
        """Set the engine and table gauges now (blocking: reads the table's
        log), so that they hold values from the start, not from the first
        supervision or maintenance."""
        self._set_engine_gauges(self.engine.generation, self.engine.rss_bytes())
        try:
            self._set_table_gauges(maintenance.table_stats(self.store.table))
        except Exception as exc:  # gauges are not worth refusing to start over
            log.warning("table statistics unavailable: %s", exc)

    async def _flush_loop(self) -> None:
        await self.flusher.run()

    async def _maintenance_loop(self) -> None:
        policy = maintenance.RetentionPolicy.parse(self.config.retention)
        while True:
            with trio.move_on_after(self.config.maintenance_interval_s):
                await self._maintain_now.wait()
            if self._maintain_now.is_set():
                log.warning("the disk is full and a size retention is set: running maintenance now")
                self._maintain_now = trio.Event()
            await self.maintain_once(policy)

    async def maintain_once(self, policy: maintenance.RetentionPolicy) -> None:
        """One maintenance run. An attempt that fails is made again, after
        the engine is checked (and restarted if it died), up to
        MAINTENANCE_ATTEMPTS times MAINTENANCE_RETRY_S apart: an engine that
        died just before the run (its supervision had not noticed yet) is
        not a failed run. Every step is a transaction of its own, so an
        attempt cut short is safe to repeat. /health reports a failure
        only when every attempt failed."""
        for attempt in range(1, MAINTENANCE_ATTEMPTS + 1):
            try:
                await trio.to_thread.run_sync(self.maintain, policy, limiter=self.limiter)
            except Exception as exc:
                if attempt == MAINTENANCE_ATTEMPTS:
                    log.warning("maintenance failed: %r", exc)
                    self.last_maintenance = MaintenanceRun(ok=False, at=time.time(), error=repr(exc)[:500])
                    return
                delay = min(MAINTENANCE_RETRY_S, self.config.maintenance_interval_s)
                log.info("maintenance attempt %d failed (%r); again in %.1f s", attempt, exc, delay)
                await trio.sleep(delay)
                await self._supervise_once()
            else:
                self.last_maintenance = MaintenanceRun(ok=True, at=time.time())
                return

    def maintain(self, policy: maintenance.RetentionPolicy) -> maintenance.MaintenanceResult:
        """The routine ``wakustore db retention`` runs too, with the archive guard."""
        vacuum_hours = self.config.vacuum_retention_hours or None
        result = maintenance.run_maintenance(
            self.store, policy, time.time_ns(), keep_from_ns=self.keep_from(), vacuum_hours=vacuum_hours
        )
        if result.vacuumed:
            log.info("maintenance: %d data files removed from the table were deleted", result.vacuumed)
        self._set_table_gauges(result.stats)
        return result


def open_store(config: NodeConfig, engine: Engine | None = None) -> tuple[Engine, MessageStore]:
    """Start the engine and open the message store (blocking).

    With ``engine`` given, that started engine is used as it is and stays the
    caller's to close (tests share one engine between nodes).
    """
    make_dirs(config.data_dir)
    # Flat MUID copies of an earlier version, replaced by the key index files.
    shutil.rmtree(config.data_dir / "muids", ignore_errors=True)
    owned = engine is None
    if engine is None:
        engine = new_engine(config)
    try:
        if owned:
            engine.start()
        store = MessageStore(
            DeltaTableRef(engine, config.messages_uri),
            config.data_dir / "wal" / "messages",
            StoreConfig(
                flush_interval_s=config.flush_interval_s,
                flush_max_messages=config.flush_max_messages,
                shared_table=config.shared_table,
            ),
            index_directory=config.data_dir / "index" / "messages",
        )
        store.open()
    except BaseException:
        if owned:
            engine.close()
        raise
    return engine, store


@asynccontextmanager
async def running_store(config: NodeConfig, engine: Engine | None = None):
    """Yield a StoreService whose loops run until the block exits; on exit
    the buffer is committed and the engine stopped (unless ``engine`` was
    given: a shared engine stays running)."""
    owned = engine is None
    started, store = await trio.to_thread.run_sync(open_store, config, engine)
    service = StoreService(config, started, store, trio.CapacityLimiter(ENGINE_THREADS))
    try:
        await trio.to_thread.run_sync(service.refresh_gauges)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(service._writer_loop)
            nursery.start_soon(service._flush_loop)
            nursery.start_soon(service._maintenance_loop)
            nursery.start_soon(service._supervise_loop)
            try:
                yield service
            finally:
                nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):
            try:
                await trio.to_thread.run_sync(store.close)
            except Exception as exc:
                log.error("final commit failed; the write-ahead log keeps the messages: %s", exc)
            if owned:
                await trio.to_thread.run_sync(started.close)
