"""The storage side of a running node: engine, message store and the loops
that flush, retain and compact, all owned by one trio nursery."""

from __future__ import annotations

import datetime as dt
import logging
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass

import trio

from wakustore.node.config import NodeConfig
from wakustore.protocols.message import WakuMessage
from wakustore.protocols.store_query import HistoryQuery, Page
from wakustore.storage import maintenance
from wakustore.storage.engine import Engine
from wakustore.storage.message_store import MessageStore, PutResult, StoreConfig
from wakustore.storage.table import DeltaTableRef

log = logging.getLogger(__name__)

# How often the flush loop looks at the buffer; the flush policy itself
# (interval and size) lives in StoreConfig.
FLUSH_POLL_S = 0.05

# Blocking engine work runs in worker threads; two concurrent Spark calls
# per core is plenty on the 2-core machines this targets.
ENGINE_THREADS = 4


@dataclass
class StoreService:
    config: NodeConfig
    engine: Engine
    store: MessageStore
    limiter: trio.CapacityLimiter

    async def put(self, messages: list[tuple[str, WakuMessage, int]]) -> PutResult:
        return await trio.to_thread.run_sync(self.store.put, messages, limiter=self.limiter)

    async def query(self, query: HistoryQuery) -> Page:
        return await trio.to_thread.run_sync(self.store.query, query, limiter=self.limiter)

    async def flush(self) -> int:
        return await trio.to_thread.run_sync(self.store.flush, limiter=self.limiter)

    async def _flush_loop(self) -> None:
        while True:
            await trio.sleep(FLUSH_POLL_S)
            if self.store.flush_due():
                try:
                    await self.flush()
                except Exception as exc:  # engine down: the batch stays durable
                    log.warning("flush failed, will retry: %s", exc)
                    await trio.sleep(1.0)

    async def _maintenance_loop(self) -> None:
        policy = maintenance.RetentionPolicy.parse(self.config.retention)
        while True:
            await trio.sleep(self.config.maintenance_interval_s)
            try:
                await trio.to_thread.run_sync(self.maintain, policy, limiter=self.limiter)
            except Exception as exc:
                log.warning("maintenance failed: %s", exc)

    def maintain(self, policy: maintenance.RetentionPolicy) -> None:
        now = time.time_ns()
        maintenance.apply_retention(self.store.table, policy, now)
        maintenance.compact(self.store.table, today=dt.datetime.now(dt.timezone.utc).date())
        maintenance.checkpoint(self.store.table)


def open_store(config: NodeConfig) -> tuple[Engine, MessageStore]:
    """Start the engine and open the message store (blocking)."""
    config.data_dir.mkdir(parents=True, exist_ok=True)
    engine = Engine(config.engine, memory_ceiling_bytes=config.engine_memory_ceiling_mb * 1024 * 1024)
    try:
        engine.start()
        store = MessageStore(
            DeltaTableRef(engine, config.messages_uri),
            config.data_dir / "wal" / "messages",
            StoreConfig(flush_interval_s=config.flush_interval_s, flush_max_messages=config.flush_max_messages),
        )
        store.open()
    except BaseException:
        engine.close()
        raise
    return engine, store


@asynccontextmanager
async def running_store(config: NodeConfig):
    """Yield a StoreService whose loops run until the block exits; on exit
    the buffer is committed and the engine stopped."""
    engine, store = await trio.to_thread.run_sync(open_store, config)
    service = StoreService(config, engine, store, trio.CapacityLimiter(ENGINE_THREADS))
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(service._flush_loop)
            nursery.start_soon(service._maintenance_loop)
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
            await trio.to_thread.run_sync(engine.close)
