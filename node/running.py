"""One running node: :func:`running_node` assembles the services.

The order is what a clean start and stop need: listen ports are checked
and the node key read before the engine starts (a taken port or a bad key
fails fast); then the store (engine, table, write-ahead log), the metrics
and health listener, the mailserver on the same engine, the libp2p host
serving the Store, lightpush and metadata protocols, the relay on that
host, and the archive scheduler and member tasks. On exit the relay, the
host and the mailserver stop first (no new requests), then the archive
tasks and the metrics listener, and last the store commits its buffer and
stops.

``wakustore serve``, the benchmarks and the tests all run a node through
it; what they leave out (mailserver, metrics, relay, archives) or set
differently (a shared engine, rate limits, stream timeouts, a key) are
its parameters.
"""

from __future__ import annotations

import time
from contextlib import asynccontextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import trio
from libp2p.abc import IHost
from libp2p.crypto.keys import KeyPair

from wakustore.node.config import NodeConfig
from wakustore.node.discovery import run_dns_discovery, run_peer_exchange_client
from wakustore.node.enr import node_record
from wakustore.node.host import (
    LIBP2P_PORTS,
    HostError,
    HostInfo,
    check_ports_free,
    load_or_create_key,
    running_host,
)
from wakustore.node.limits import ConnectionLimits, Gatekeeper
from wakustore.node.mailserver import MailserverInfo, running_mailserver
from wakustore.node.metrics import serve_http
from wakustore.node.peer_exchange import PeerExchangeService, PeerRecords
from wakustore.node.relay import Relay, running_relay
from wakustore.node.store_protocols import RateLimits, StoreProtocols
from wakustore.node.store_service import StoreService, running_store
from wakustore.node.sync import SyncService
from wakustore.protocols.enr import Enr
from wakustore.storage.engine import Engine


@dataclass
class RunningNode:
    """What :func:`running_node` started; the parts left out are None."""

    config: NodeConfig
    service: StoreService
    protocols: StoreProtocols
    host: IHost
    info: HostInfo
    relay: Relay | None
    mailserver: MailserverInfo | None
    metrics_port: int | None
    seeder: Any = None  # the archive torrent.Seeder of a control node
    gatekeeper: Gatekeeper | None = None  # the connection and stream caps
    sync: SyncService | None = None  # Waku Sync and Store Resume (node/sync.py)
    enr: Enr | None = None  # the node's record (node/enr.py)
    peer_exchange: Any = None  # the PeerExchangeService with --peer-exchange
    discv5: Any = None  # the Discv5Node with --discv5-discovery (node/discv5.py)
    rest_port: int | None = None  # nwaku's REST API with --rest (node/rest.py)


@asynccontextmanager
async def running_node(
    config: NodeConfig,
    *,
    engine: Engine | None = None,
    rate_limits: RateLimits = RateLimits(),
    key_pair: KeyPair | None = None,
    mailserver: bool = True,
    metrics: bool = True,
    relay: bool = True,
    archives: bool = True,
    **protocol_options: Any,
):
    """Run a node on ``config`` until the block exits; yield a :class:`RunningNode`.

    ``engine``: a started engine to share (it stays running afterwards),
    else the store starts its own. ``key_pair``: the libp2p identity, else
    ``<data_dir>/node.key``. ``mailserver``, ``metrics``, ``relay`` and
    ``archives`` leave those parts out when false (``relay`` and the
    archives also follow ``config``). ``protocol_options`` go to
    :class:`StoreProtocols` (its clock and stream timeouts). Raises
    :class:`~wakustore.node.host.HostError` for a taken port or a bad key
    before the engine starts.
    """
    ports = (
        LIBP2P_PORTS
        + (("metrics_port",) if metrics else ())
        + (("mailserver_port",) if mailserver else ())
        + (("rest_port",) if config.rest else ())
    )
    check_ports_free(config, ports)
    if key_pair is None:
        key_pair = load_or_create_key(config.data_dir)
    async with running_store(config, engine=engine) as service, trio.open_nursery() as nursery:
        metrics_port = None
        if metrics:
            metrics_port = await nursery.start(
                serve_http, config.metrics_port, config.metrics_host, service.metrics, service.health
            )
        protocols = StoreProtocols(service, config, rate_limits, **protocol_options)
        gatekeeper = Gatekeeper(
            ConnectionLimits.from_config(config), on_refused=lambda reason: service.metrics.refused.labels(reason).inc()
        )
        syncing = SyncService(service, config, protocols.ingest)
        # What discovery found, handed out by peer exchange when it is on.
        peer_records = PeerRecords()
        exchange = PeerExchangeService(peer_records) if config.peer_exchange else None
        async with (
            running_mailserver(config, service.engine, metrics=service.metrics)
            if mailserver
            else nullcontext() as mailserver_info,
            running_host(
                config,
                {**protocols.handlers(), **syncing.handlers(), **(exchange.handlers() if exchange else {})},
                key_pair,
                gatekeeper,
                answer_first={**protocols.handlers(), **(exchange.handlers() if exchange else {})},
            ) as (host, info),
            running_relay(host, config, protocols.ingest) if relay else nullcontext() as the_relay,
            trio.open_nursery() as peer_tasks,
        ):
            # Tasks that use the host or the relay stop before those close.
            protocols.relay = the_relay
            protocols.disconnect = host.disconnect
            service.relay = the_relay
            _gauges_at_scrape(service.metrics, host, the_relay)
            private_key = key_pair.private_key.to_bytes()
            discv5_node, record = await _discv5(config, private_key, info, the_relay, peer_records, service.metrics)
            peer_tasks.start_soon(syncing.run, host)
            if config.dns_discovery_urls and (the_relay is not None or exchange is not None):
                peer_tasks.start_soon(
                    run_dns_discovery, config, the_relay, info.peer_id, peer_records, service.metrics, discv5_node
                )
            if config.peer_exchange_nodes and the_relay is not None:
                peer_tasks.start_soon(
                    run_peer_exchange_client, config, the_relay, host, info.peer_id, peer_records, service.metrics
                )
            seeder = None
            if archives and config.archive_key_file:
                seeder = await peer_tasks.start(_run_archives, config, service, the_relay)
            if archives:
                for pubkey in config.archive_follow:
                    peer_tasks.start_soon(_follow_community, config, service, pubkey)
            node = RunningNode(
                config=config,
                service=service,
                protocols=protocols,
                host=host,
                info=info,
                relay=the_relay,
                mailserver=mailserver_info,
                metrics_port=metrics_port,
                seeder=seeder,
                gatekeeper=gatekeeper,
                enr=record,
                peer_exchange=exchange,
                sync=syncing,
                discv5=discv5_node,
            )
            if discv5_node is not None:

                def external(ip: str, port: int) -> None:
                    node.enr = node_record(
                        config, private_key, info.multiaddrs, relay=the_relay is not None, udp=port, external_ip=ip
                    )

                if config.discv5_enr_auto_update:
                    discv5_node.on_external = external
                discv5_node.sessions.record = lambda: node.enr
                await peer_tasks.start(discv5_node.run)
            if config.rest:
                from wakustore.node.rest import serve_rest

                node.rest_port = await peer_tasks.start(serve_rest, node)
            try:
                yield node
            finally:
                peer_tasks.cancel_scope.cancel()
        nursery.cancel_scope.cancel()


def _gauges_at_scrape(metrics, host, relay) -> None:
    """Connection and relay peer counts, read when Prometheus scrapes."""
    network = host.get_network()
    metrics.connections.set_function(lambda: sum(len(c) for c in network.get_connections_map().values()))
    if relay is not None:
        for topic in relay.topics:
            metrics.relay_peers.labels(topic).set_function(lambda topic=topic: relay.peer_count(topic))


async def _discv5(config, private_key: bytes, info: HostInfo, relay, peer_records, metrics):
    """(the discv5 node, bound but not yet running, or None; the node's
    record, with ``udp`` when discv5 runs)."""
    if not config.discv5_discovery:
        return None, node_record(config, private_key, info.multiaddrs, relay=relay is not None)
    from wakustore.node.discovery import discv5_finder
    from wakustore.node.discv5 import Discv5Node
    from wakustore.protocols import enr

    holder: list[Enr] = []
    found = discv5_finder(config, relay, info.peer_id, peer_records, metrics)
    discv5_node = Discv5Node(
        private_key,
        lambda: holder[0],
        bootstrap=[enr.decode(text) for text in config.discv5_bootstrap_nodes],
        on_found=found,
        metrics=metrics,
    )
    try:
        port = await discv5_node.bind(config.listen_host, config.discv5_udp_port)
    except OSError as exc:
        raise HostError(f"discv5_udp_port {config.discv5_udp_port} on {config.listen_host}: {exc}") from None
    holder.append(node_record(config, private_key, info.multiaddrs, relay=relay is not None, udp=port))
    return discv5_node, holder[0]


async def _run_archives(config, service, relay, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """The archive scheduler; it also tells retention what may leave the store."""
    from wakustore.node.archive import archive_settings, keep_from_ns, run_archive_scheduler

    settings = archive_settings(config)
    service.keep_from = lambda: keep_from_ns(settings)

    async def publish(pubsub_topic, message) -> None:
        await service.put([(pubsub_topic, message, time.time_ns())], source="archive")
        if relay is not None:
            await relay.publish(pubsub_topic, message)

    await run_archive_scheduler(
        config, service.store, settings, limiter=service.limiter, publish=publish, task_status=task_status
    )


async def _follow_community(config, service, pubkey_hex: str) -> None:
    """Member mode for one community (see node/archive_member.py)."""
    from wakustore.node.archive_member import MemberSettings, parse_peers, run_archive_member
    from wakustore.protocols import topics

    settings = MemberSettings(
        community_public_key=bytes.fromhex(pubkey_hex.removeprefix("0x")),
        data_dir=config.data_dir,
        pubsub_topic=topics.shard_pubsub_topic(config.cluster_id, config.shards[0]),
        chat_ids=tuple(config.archive_chat_ids),
        layout=config.archive_layout,
        peers=parse_peers(config.archive_seed_peers),
        import_processes=config.archive_import_workers,
    )
    await run_archive_member(service.store, settings, limiter=service.limiter)
