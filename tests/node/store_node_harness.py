"""A store node running in a background thread, for tests that talk to it
over real TCP from their own trio loop (or from a subprocess).

The node thread runs ``running_store`` (on the session's shared engine) and
``running_host`` with the Store/lightpush/metadata handlers, exactly as
``wakustore serve`` does, on a system-chosen loopback port.
"""

from __future__ import annotations

import threading
from pathlib import Path

import trio

from wakustore.node.config import NodeConfig
from wakustore.node.host import running_host
from wakustore.node.store_protocols import RateLimits, StoreProtocols
from wakustore.node.store_service import running_store

CLUSTER_ID = 42
SHARDS = [0, 5]
PUBSUB_TOPIC = f"/waku/2/rs/{CLUSTER_ID}/0"
OTHER_PUBSUB_TOPIC = f"/waku/2/rs/{CLUSTER_ID}/5"
START_TIMEOUT_S = 60.0


def node_config(data_dir: Path, **overrides) -> NodeConfig:
    values = dict(
        data_dir=data_dir, tcp_port=0, ws_port=0, listen_host="127.0.0.1",
        cluster_id=CLUSTER_ID, shards=list(SHARDS),
        # Commits happen when a test calls NodeThread.flush (and at stop), so
        # a test knows whether a page comes from the table or the buffer.
        flush_interval_s=3600.0,
    )
    values.update(overrides)
    return NodeConfig(**values).validate()


class NodeThread:
    """Start with :meth:`start`, stop with :meth:`stop` (commits the buffer)."""

    def __init__(self, config: NodeConfig, engine, rate_limits: RateLimits = RateLimits(),
                 **protocol_options):
        """``protocol_options`` go to :class:`StoreProtocols` (its timeouts)."""
        self.config = config
        self.engine = engine
        self.rate_limits = rate_limits
        self.protocol_options = protocol_options
        self.multiaddrs: list[str] = []
        self.peer_id = ""
        self.service = None
        self._ready = threading.Event()
        self._token = None
        self._stop = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="store-node", daemon=True)

    @property
    def tcp_addr(self) -> str:
        return next(a for a in self.multiaddrs if "/ws/" not in a)

    @property
    def ws_addr(self) -> str:
        return next(a for a in self.multiaddrs if "/ws/" in a)

    def start(self) -> NodeThread:
        self._thread.start()
        if not self._ready.wait(START_TIMEOUT_S):
            raise RuntimeError("node did not start")
        if self._error is not None:
            raise RuntimeError("node failed to start") from self._error
        return self

    def stop(self) -> None:
        if self._token is not None and self._thread.is_alive():
            trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
        self._thread.join(60)
        if self._error is not None:
            raise RuntimeError("node failed") from self._error

    def flush(self) -> int:
        """Commit the buffered messages to the table; returns how many."""
        return trio.from_thread.run(self.service.flush, trio_token=self._token)

    def _run(self) -> None:
        try:
            trio.run(self._main)
        except BaseException as exc:  # reported by start()/stop()
            self._error = exc
        finally:
            self._ready.set()

    async def _main(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self._stop = trio.Event()
        async with running_store(self.config, engine=self.engine) as service:
            self.service = service
            protocols = StoreProtocols(service, self.config, self.rate_limits, **self.protocol_options)
            async with running_host(self.config, protocols.handlers()) as (_host, info):
                self.multiaddrs = info.multiaddrs
                self.peer_id = info.peer_id
                self._ready.set()
                await self._stop.wait()
