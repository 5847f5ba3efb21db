"""``wakustore serve``: run a node until SIGINT or SIGTERM."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import time
from pathlib import Path

import trio

from wakustore.node import config as node_config
from wakustore.node import data_dir

log = logging.getLogger("wakustore")


def register(commands: argparse._SubParsersAction) -> None:
    serve = commands.add_parser("serve", help="run a store node")
    serve.add_argument("--config", type=Path, help="TOML configuration file")
    serve.add_argument("--data-dir", type=Path)
    serve.add_argument("--engine", help="'embedded' or sc://host:port")
    serve.add_argument("--tcp-port", type=int)
    serve.add_argument("--ws-port", type=int)
    serve.add_argument("--metrics-port", type=int)
    serve.add_argument("--mailserver-port", type=int)
    serve.add_argument("--cluster-id", type=int)
    serve.add_argument("--shard", type=int, action="append", dest="shards")
    serve.add_argument("--retention", help="e.g. time:2592000;capacity:1000000;size:50GB")
    serve.add_argument("--listen-host", help="address the libp2p listeners bind (default 0.0.0.0)")
    serve.add_argument("--relay-peer", action="append", dest="relay_peers",
                       help="multiaddr ending in /p2p/<peer id> to relay with, dialed and kept connected; repeatable")
    serve.add_argument("--no-relay", action="store_false", dest="relay", default=None,
                       help="do not run relay (lightpush and the store protocols only)")
    serve.add_argument(
        "--rate-limit", action="append", dest="rate_limits", default=[],
        help="per-peer limit, nwaku's format [store|lightpush:]volume/period<h|m|s|ms>, "
             "e.g. store:60/2s (the default) or lightpush:0/1s (no limit); repeatable",
    )
    serve.set_defaults(handler=run_serve)


def run_serve(args: argparse.Namespace) -> int:
    from wakustore.node.cli import UsageError
    from wakustore.node.host import HostError
    from wakustore.node.store_protocols import RateLimits

    overrides = {k: getattr(args, k, None) for k in (
        "data_dir", "engine", "tcp_port", "ws_port", "metrics_port", "mailserver_port",
        "cluster_id", "shards", "retention", "listen_host", "relay", "relay_peers",
    )}
    config = node_config.load(args.config, overrides)
    try:
        rate_limits = RateLimits.parse(args.rate_limits)
    except ValueError as exc:
        raise UsageError(f"--rate-limit: {exc}") from None
    logging.basicConfig(
        level=os.environ.get("WAKUSTORE_LOG_LEVEL", "INFO"),
        format='{"time":"%(asctime)s","level":"%(levelname)s","logger":"%(name)s","msg":"%(message)s"}',
    )
    # Held until the node has committed and stopped (or the process dies).
    with data_dir.lock(config.data_dir):
        try:
            trio.run(_serve, config, rate_limits)
        except HostError as exc:
            print(f"wakustore: error: {exc}", file=sys.stderr, flush=True)
            return 1
    return 0


def archive_settings(config: node_config.NodeConfig):
    """The control-node archive settings of ``config`` (archive_key_file set)."""
    from wakustore.node.archive import ArchiveSettings
    from wakustore.node.cli import UsageError, parse_hex

    try:
        key = parse_hex(Path(config.archive_key_file).read_text().strip(), "archive_key_file")
    except OSError as exc:
        raise UsageError(f"archive_key_file: {exc}") from None
    if len(key) != 32:
        raise UsageError("archive_key_file must hold a 32-byte private key in hex")
    return ArchiveSettings(
        community_key=key,
        chat_ids=tuple(config.archive_chat_ids) or ("",),
        archive_dir=config.archives,
        layout=config.archive_layout,
        listen=config.archive_listen,
    )


async def _run_archives(config, service, relay, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """The archive scheduler; it also tells retention what may leave the store."""
    from wakustore.node.archive import keep_from_ns, run_archive_scheduler

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
    )
    await run_archive_member(service.store, settings, limiter=service.limiter)


async def _serve(config: node_config.NodeConfig, rate_limits) -> None:
    """Store, then libp2p host on top of it; on SIGINT/SIGTERM the host
    stops first (no new requests), then the store commits and stops."""
    from wakustore.node.host import check_ports_free, load_or_create_key, running_host, write_node_info
    from wakustore.node.mailserver import running_mailserver
    from wakustore.node.metrics import serve_http
    from wakustore.node.relay import running_relay
    from wakustore.node.store_protocols import StoreProtocols
    from wakustore.node.store_service import running_store

    # Fail on a taken port or a bad key before the engine starts.
    check_ports_free(config)
    key_pair = load_or_create_key(config.data_dir)
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with running_store(config) as service, trio.open_nursery() as nursery:
            metrics_port = await nursery.start(
                serve_http, config.metrics_port, config.listen_host, service.metrics, service.health
            )
            protocols = StoreProtocols(service, config, rate_limits)
            async with running_mailserver(config, service.engine) as mailserver, \
                    running_host(config, protocols.handlers(), key_pair) as (host, info), \
                    running_relay(host, config, protocols.ingest) as relay:
                protocols.relay = relay
                write_node_info(
                    config.data_dir, info,
                    engine=config.engine, table=config.messages_uri, pid=os.getpid(),
                    cluster_id=config.cluster_id, shards=config.shards,
                    enode=mailserver.enode, metrics_port=metrics_port,
                )
                log.info("node ready: peer %s, table %s, engine %s, %d messages pending from the log",
                         info.peer_id, config.messages_uri, config.engine, service.store.pending)
                log.info("rate limits per peer: store %s, lightpush %s",
                         rate_limits.store, rate_limits.lightpush)
                for addr in info.multiaddrs:
                    print(addr, flush=True)
                print(mailserver.enode, flush=True)
                print(f"metrics and health on http://{config.listen_host}:{metrics_port}/", flush=True)
                if config.archive_key_file:
                    seeder = await nursery.start(_run_archives, config, service, relay)
                    print(f"seeding community archives on port {seeder.port}", flush=True)
                for pubkey in config.archive_follow:
                    nursery.start_soon(_follow_community, config, service, pubkey)
                print("wakustore node ready; table " + config.messages_uri, flush=True)
                async for signum in signals:
                    log.info("signal %s: committing and stopping", signal.Signals(signum).name)
                    break
            nursery.cancel_scope.cancel()
