"""Prometheus metrics and the /health endpoint.

One registry per node (not the process-global default) so that several
nodes in one process, as in the tests, do not collide.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

log = logging.getLogger(__name__)

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
        self.ephemeral = Counter(
            "wakustore_messages_ephemeral",
            "Valid ephemeral messages: relayed, answered, never stored",
            ["source"],
            registry=r,
        )
        # The node's own process (CPU, resident memory, open files), as
        # wakustore_process_*; the engine's is wakustore_engine_rss_bytes.
        ProcessCollector(namespace="wakustore", registry=r)
        self.connections = Gauge(
            "wakustore_libp2p_connections", "libp2p connections open (inbound and outbound), at scrape time", registry=r
        )
        self.relay_peers = Gauge(
            "wakustore_relay_peers",
            "Relay peers subscribed to each served pubsub topic, at scrape time",
            ["topic"],
            registry=r,
        )
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
        self.table_bad_files = Gauge(
            "wakustore_table_bad_files", "Data files of the table a read failed on (see /health)", ["table"], registry=r
        )
        self.key_index_damaged = Gauge(
            "wakustore_key_index_damaged_files",
            "Key index files found damaged or stale since the start, each built again (see /health key_index)",
            ["table"],
            registry=r,
        )
        self.table_log_repaired = Gauge(
            "wakustore_table_log_versions_repaired",
            "Log versions a power cut tore, put aside at start (see /health log_repair)",
            ["table"],
            registry=r,
        )
        self.wal_damaged_regions = Gauge(
            "wakustore_wal_damaged_regions",
            "Damaged regions of the write-ahead log skipped at a start, their copies kept until removed "
            "(see /health wal_damage)",
            ["table"],
            registry=r,
        )
        self.wal_damaged_bytes = Gauge(
            "wakustore_wal_damaged_bytes",
            "Bytes of the damaged write-ahead log regions /health wal_damage lists",
            ["table"],
            registry=r,
        )
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

        # The peer manager (node/peer_manager.py).
        self.relay_dials = Counter(
            "wakustore_relay_dials",
            "Dials of discovered relay nodes, by origin and outcome",
            ["origin", "outcome"],
            registry=r,
        )
        self.relay_candidates = Gauge(
            "wakustore_relay_candidates",
            "Discovered relay nodes the peer manager holds, by origin and state (connected, candidate, backoff)",
            ["origin", "state"],
            registry=r,
        )
        self.relay_forgotten = Counter(
            "wakustore_relay_forgotten", "Discovered relay nodes forgotten, by why", ["why"], registry=r
        )
        self.discv5_nodes = Gauge("wakustore_discv5_nodes", "Records in the discv5 routing table", registry=r)
        self.discv5_dropped = Counter(
            "wakustore_discv5_packets_dropped",
            "discv5 datagrams dropped, by reason (too_large, rate_limited, invalid, unexpected)",
            ["reason"],
            registry=r,
        )

        # The mailserver's counters (node/mailserver.py MailserverStats),
        # read at scrape time once it runs.
        self.mailserver_stats: object | None = None
        r.register(_MailserverCollector(self))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


def metrics_app(metrics: NodeMetrics, health: Callable[[], dict]):
    """The ASGI app of the metrics listener: ``GET /metrics`` and ``GET
    /health`` (200 with a JSON body when ``health()`` reports ``"ok":
    true``, else 503)."""
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    async def exposition(request) -> Response:
        return Response(metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    async def health_report(request) -> Response:
        try:
            # The engine probe blocks (up to its timeout): not on the event loop.
            report = await trio.to_thread.run_sync(health)
        except Exception as exc:  # a failing probe is itself a health answer
            report = {"ok": False, "error": str(exc)}
        return JSONResponse(report, status_code=200 if report.get("ok") else 503)

    return Starlette(
        routes=[Route("/metrics", exposition, methods=["GET"]), Route("/health", health_report, methods=["GET"])]
    )


async def serve_http(
    port: int,
    host: str,
    metrics: NodeMetrics,
    health: Callable[[], dict],
    *,
    task_status=trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve :func:`metrics_app` on ``host:port`` until cancelled
    (node/http.py); ``task_status`` gets the port."""
    from wakustore.node.http import serve_app

    await serve_app(metrics_app(metrics, health), host, port, task_status=task_status)


class _MailserverCollector:
    """wakustore_mailserver_* from the running mailserver's counters."""

    def __init__(self, metrics: NodeMetrics):
        self.metrics = metrics

    def describe(self):
        return list(self.collect())

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        stats = self.metrics.mailserver_stats
        get = (lambda name: getattr(stats, name)) if stats is not None else (lambda name: 0)
        envelopes = CounterMetricFamily(
            "wakustore_mailserver_envelopes", "Envelopes received by the mailserver, by outcome", labels=["outcome"]
        )
        for outcome in ("accepted", "duplicates", "rejected"):
            envelopes.add_metric([outcome], get(outcome))
        yield envelopes
        requests = CounterMetricFamily(
            "wakustore_mailserver_requests",
            "History requests answered by the mailserver, by outcome",
            labels=["outcome"],
        )
        requests.add_metric(["answered"], get("requests") - get("request_errors"))
        requests.add_metric(["refused"], get("request_errors"))
        yield requests
        yield CounterMetricFamily(
            "wakustore_mailserver_invalid_packets",
            "devp2p packets the mailserver could not use",
            value=get("invalid_packets"),
        )
        yield GaugeMetricFamily(
            "wakustore_mailserver_sessions", "devp2p sessions open with the mailserver", value=get("connections")
        )
