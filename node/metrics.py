"""Prometheus metrics and the /health endpoint.

One registry per node (not the process-global default) so that several
nodes in one process, as in the tests, do not collide.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable

import h11
import trio
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

log = logging.getLogger(__name__)

# A metrics scrape or health probe is one small GET; anything larger is
# not for us (h11's default is 16 KiB; a request line and a few headers fit
# in 8 KiB, the limit Apache and nginx use for request lines too).
MAX_REQUEST_BYTES = 8 * 1024
REQUEST_TIMEOUT_S = 10.0

# Store pages answer in tens of milliseconds; commits in fractions of a second.
QUERY_BUCKETS = (0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
COMMIT_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class NodeMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.ingested = Counter(
            "wakustore_messages_ingested", "Messages accepted into the write path", ["source"], registry=r
        )
        self.deduplicated = Counter(
            "wakustore_messages_deduplicated", "Messages dropped as duplicates by MUID", ["source"], registry=r
        )
        self.rejected = Counter("wakustore_messages_rejected", "Messages refused", ["source", "reason"], registry=r)
        self.queries = Counter("wakustore_queries", "Queries answered", ["protocol", "status"], registry=r)
        self.query_latency = Histogram(
            "wakustore_query_seconds", "Time to answer a query", ["protocol"], buckets=QUERY_BUCKETS, registry=r
        )
        self.commit_latency = Histogram(
            "wakustore_commit_seconds", "Time of one Delta commit", ["table"], buckets=COMMIT_BUCKETS, registry=r
        )
        self.wal_depth = Gauge(
            "wakustore_wal_depth", "Records in the write-ahead log not yet committed", ["table"], registry=r
        )
        self.table_bytes = Gauge("wakustore_table_bytes", "Bytes of live files in the table", ["table"], registry=r)
        self.table_rows = Gauge("wakustore_table_rows", "Rows in the table", ["table"], registry=r)
        self.engine_rss = Gauge("wakustore_engine_rss_bytes", "Resident memory of the embedded engine", registry=r)
        self.refused = Counter(
            "wakustore_peer_limits_refused",
            "Connections and streams refused by a cap (node.limits)",
            ["reason"],
            registry=r,
        )
        self.engine_generation = Gauge(
            "wakustore_engine_generation", "Engine sessions started (restarts + 1), as /health reports it", registry=r
        )
        # Waku Sync and Store Resume (node/sync.py).
        self.sync_sessions = Counter(
            "wakustore_sync_sessions",
            "Waku Sync reconciliation sessions (with the transfer after them)",
            ["role", "outcome"],
            registry=r,
        )
        self.sync_transfer_messages = Counter(
            "wakustore_sync_transfer_messages", "Messages over /vac/waku/transfer/1.0.0", ["direction"], registry=r
        )
        self.sync_transfer_streams = Counter(
            "wakustore_sync_transfer_streams", "Incoming transfer streams by how they ended", ["outcome"], registry=r
        )
        self.resumes = Counter(
            "wakustore_store_resumes", "Store Resume attempts, one per sync peer asked", ["outcome"], registry=r
        )
        self.resumed = Counter("wakustore_store_resumed_messages", "Messages stored by Store Resume", registry=r)
        # Discovery (node/discovery.py) and peer exchange (node/peer_exchange.py).
        self.discovered = Counter(
            "wakustore_discovered_relay_peers",
            "Relay nodes of our cluster and shards found, by origin; 'added' when new to the relay",
            ["origin", "outcome"],
            registry=r,
        )
        self.discovery_rounds = Counter(
            "wakustore_discovery_rounds",
            "Walks of a DNS tree and peer-exchange requests",
            ["origin", "outcome"],
            registry=r,
        )

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


async def serve_http(
    port: int,
    host: str,
    metrics: NodeMetrics,
    health: Callable[[], dict],
    *,
    task_status=trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``GET /metrics`` and ``GET /health`` until cancelled.

    /health answers 200 with a JSON body when ``health()`` reports
    ``"ok": true``, else 503.
    """
    listeners = await trio.open_tcp_listeners(port, host=host)
    task_status.started(listeners[0].socket.getsockname()[1])
    await trio.serve_listeners(lambda stream: _handle(stream, metrics, health), listeners)


async def _handle(stream: trio.SocketStream, metrics: NodeMetrics, health: Callable[[], dict]) -> None:
    connection = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_REQUEST_BYTES)
    try:
        with trio.fail_after(REQUEST_TIMEOUT_S):
            request = None
            while request is None:
                event = connection.next_event()
                if event is h11.NEED_DATA:
                    data = await stream.receive_some(4096)
                    connection.receive_data(data)
                    if not data:
                        return
                elif isinstance(event, h11.Request):
                    request = event
                else:
                    return
            status, body, content_type = await _route(request, metrics, health)
            headers = [("content-type", content_type), ("content-length", str(len(body))), ("connection", "close")]
            await stream.send_all(connection.send(h11.Response(status_code=status, headers=headers)))
            await stream.send_all(connection.send(h11.Data(data=body)))
            await stream.send_all(connection.send(h11.EndOfMessage()))
    except (h11.RemoteProtocolError, trio.TooSlowError, trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    finally:
        await stream.aclose()


async def _route(request: h11.Request, metrics: NodeMetrics, health: Callable[[], dict]) -> tuple[int, bytes, str]:
    if request.method != b"GET":
        return 405, b"method not allowed\n", "text/plain"
    path = request.target.split(b"?", 1)[0]
    if path == b"/metrics":
        return 200, metrics.exposition(), CONTENT_TYPE_LATEST
    if path == b"/health":
        try:
            # The engine probe blocks (up to its timeout): not on the event loop.
            report = await trio.to_thread.run_sync(health)
        except Exception as exc:  # a failing probe is itself a health answer
            report = {"ok": False, "error": str(exc)}
        return (200 if report.get("ok") else 503), json.dumps(report).encode() + b"\n", "application/json"
    return 404, b"not found\n", "text/plain"
