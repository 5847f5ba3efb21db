"""A store node running in a background thread, for tests that talk to it
over real TCP from their own trio loop (or from a subprocess).

The node thread runs :func:`~wakustore.node.running.running_node`, as
``wakustore serve`` does, on the session's shared engine and a
system-chosen loopback port, without the mailserver and (unless a
subclass asks for them) the metrics listener and the relay.
"""

from __future__ import annotations

import threading
from pathlib import Path

import trio

from wakustore.node.config import NodeConfig
from wakustore.node.running import running_node
from wakustore.node.store_protocols import RateLimits

CLUSTER_ID = 42
SHARDS = [0, 5]
PUBSUB_TOPIC = f"/waku/2/rs/{CLUSTER_ID}/0"
OTHER_PUBSUB_TOPIC = f"/waku/2/rs/{CLUSTER_ID}/5"
START_TIMEOUT_S = 60.0


def node_config(data_dir: Path, **overrides) -> NodeConfig:
    values = dict(
        data_dir=data_dir,
        tcp_port=0,
        ws_port=0,
        listen_host="127.0.0.1",
        cluster_id=CLUSTER_ID,
        shards=list(SHARDS),
        # Commits happen when a test calls NodeThread.flush (and at stop), so
        # a test knows whether a page comes from the table or the buffer.
        flush_interval_s=3600.0,
        # Every client of these tests dials from 127.0.0.1: the per-address
        # cap (2 by default) is off; tests of the caps set their own.
        ip_colocation_limit=0,
    )
    values.update(overrides)
    return NodeConfig(**values).validate()


class NodeThread:
    """Start with :meth:`start`, stop with :meth:`stop` (commits the buffer)."""

    with_relay = False
    with_metrics = False  # /metrics and /health on config.metrics_port (0: the kernel's)

    def __init__(self, config: NodeConfig, engine, rate_limits: RateLimits = RateLimits(), **protocol_options):
        """``protocol_options`` go to :func:`running_node` (the protocols' timeouts)."""
        self.config = config
        self.engine = engine
        self.rate_limits = rate_limits
        self.protocol_options = protocol_options
        self.multiaddrs: list[str] = []
        self.peer_id = ""
        self.service = None
        self.metrics_port: int | None = None
        self.relay = None
        self.gatekeeper = None
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

    def put(self, messages: list):
        """Store ``(pubsub topic, message, receive time ns)`` past lightpush's
        and relay's checks (no timestamp drift window), as history that
        reaches a node by sync or import; returns the store's PutResult."""
        return trio.from_thread.run(self.service.put, messages, trio_token=self._token)

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
        async with running_node(
            self.config,
            engine=self.engine,
            rate_limits=self.rate_limits,
            mailserver=False,
            metrics=self.with_metrics,
            relay=self.with_relay,
            **self.protocol_options,
        ) as node:
            self.service = node.service
            self.metrics_port = node.metrics_port
            self.relay = node.relay
            self.gatekeeper = node.gatekeeper
            self.host = node.host
            self.multiaddrs = node.info.multiaddrs
            self.peer_id = node.info.peer_id
            self.enr = node.enr
            self.peer_exchange = node.peer_exchange
            self.rest_port = node.rest_port
            self.discv5 = node.discv5
            self._ready.set()
            await self._stop.wait()
