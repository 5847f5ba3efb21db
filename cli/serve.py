"""``wakustore serve``: run a node until SIGINT or SIGTERM."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from pathlib import Path

from wakustore.node import config as node_config

# trio, the node and its libraries load when serve runs, not when the
# parser is built (--help, --version and the clients stay quick).

log = logging.getLogger("wakustore")

# After SIGINT or SIGTERM the node has this long (s) to stop in order; then
# the process exits without waiting for what is left (a final commit stuck
# on the engine, say: the write-ahead log keeps those messages for the next
# start). Below the 10 s a service manager commonly allows before SIGKILL
# (docker stop's default).
STOP_DEADLINE_S = 8.0
STOPPED_LINE = "wakustore node stopped"
# A node that cannot start as configured (a taken port, an address not on
# this machine, a bad key) exits as for any other bad input.
EXIT_BAD_SETUP = 2
_deadline: list[threading.Timer] = []  # armed by a signal, disarmed by a stop in time


def register(commands: argparse._SubParsersAction) -> None:
    # Flags default to None so that an unset flag leaves the file's or the
    # environment's value in place; the help shows NodeConfig's default.
    d = node_config.NodeConfig()
    serve = commands.add_parser("serve", help="run a store node until SIGINT or SIGTERM")
    serve.add_argument("--config", type=Path, help="TOML configuration file (default: none)")
    serve.add_argument(
        "--data-dir", type=Path, help=f"tables, log, key and node-info.json (default: {os.path.join('.', d.data_dir)})"
    )
    serve.add_argument(
        "--engine",
        help=f"'sail' or 'spark' (started and supervised by the node), or sc://host:port (default: {d.engine})",
    )
    serve.add_argument("--tcp-port", type=int, help=f"libp2p TCP port, 0: any (default: {d.tcp_port})")
    serve.add_argument("--ws-port", type=int, help=f"libp2p WebSocket port, 0: any (default: {d.ws_port})")
    serve.add_argument(
        "--metrics-port", type=int, help=f"Prometheus metrics and /health, 0: any (default: {d.metrics_port})"
    )
    serve.add_argument(
        "--mailserver-port", type=int, help=f"Waku v1 mailserver (devp2p RLPx), 0: any (default: {d.mailserver_port})"
    )
    serve.add_argument(
        "--cluster-id", type=int, help=f"Waku cluster, 0-65535, Status's is 16 (default: {d.cluster_id})"
    )
    serve.add_argument(
        "--shard",
        type=int,
        action="append",
        dest="shards",
        help=f"shard to serve; repeatable (default: {' '.join(map(str, d.shards))})",
    )
    serve.add_argument("--retention", help=f"e.g. time:2592000;capacity:1000000;size:50GB (default: {d.retention})")
    serve.add_argument(
        "--listen-host", help=f"address the libp2p and mailserver listeners bind (default: {d.listen_host})"
    )
    serve.add_argument(
        "--metrics-host", help=f"address the metrics and /health listener binds (default: {d.metrics_host})"
    )
    serve.add_argument(
        "--max-connections",
        type=int,
        help=f"inbound libp2p connections at once, 0: no cap (default: {d.max_connections})",
    )
    serve.add_argument(
        "--ip-colocation-limit",
        type=int,
        help=f"inbound libp2p connections per IP address, 0: no cap (default: {d.ip_colocation_limit})",
    )
    serve.add_argument(
        "--relay-peer",
        action="append",
        dest="relay_peers",
        help="multiaddr ending in /p2p/<peer id> to relay with, dialed and kept connected; repeatable (default: none)",
    )
    serve.add_argument(
        "--dns-discovery-url",
        action="append",
        dest="dns_discovery_urls",
        help="enrtree://<key>@<domain> (EIP-1459) whose relay nodes of our cluster and shards are dialed; "
        "repeatable (default: none)",
    )
    serve.add_argument(
        "--peer-exchange",
        action="store_true",
        default=None,
        help="serve 34/WAKU2-PEER-EXCHANGE: hand light clients the records of the relay nodes discovery found "
        "(default: off)",
    )
    serve.add_argument(
        "--peer-exchange-node",
        action="append",
        dest="peer_exchange_nodes",
        help="multiaddr ending in /p2p/<peer id> asked for relay peers by peer exchange while the relay has few; "
        "repeatable (default: none)",
    )
    serve.add_argument(
        "--dns-discovery-name-server",
        action="append",
        dest="dns_discovery_name_servers",
        help="name server for --dns-discovery-url, IP[:port]; repeatable (default: the system's)",
    )
    serve.add_argument(
        "--ext-multiaddr",
        action="append",
        dest="ext_multiaddrs",
        help="multiaddr the node is reached at from outside (NAT, proxy), printed and "
        "written to node-info.json with the listen addresses; repeatable (default: none)",
    )
    serve.add_argument(
        "--sync-peer",
        action="append",
        dest="sync_peers",
        help="multiaddr ending in /p2p/<peer id> of a store node to keep in sync with "
        "(Waku Sync) and to resume from at start; repeatable (default: none)",
    )
    serve.add_argument(
        "--no-relay",
        action="store_false",
        dest="relay",
        default=None,
        help="do not run relay, only lightpush and the store protocols (default: relay on)",
    )
    serve.add_argument(
        "--rate-limit",
        action="append",
        dest="rate_limits",
        help="per-peer and per-address limit, nwaku's format [store|lightpush:]volume/period<h|m|s|ms>, "
        "e.g. store:60/2s or lightpush:0/1s (no limit); repeatable "
        "(default: store:60/2s, lightpush:5/1s)",
    )
    serve.add_argument("--rest", action="store_true", default=None, help="serve nwaku's REST API (default: off)")
    serve.add_argument("--rest-address", help=f"address the REST API binds (default: {d.rest_address})")
    serve.add_argument("--rest-port", type=int, help=f"REST API port, 0: any (default: {d.rest_port})")
    serve.add_argument(
        "--rest-admin",
        action="store_true",
        default=None,
        help="serve the REST API's /admin endpoints: peers, dialing, log level (default: off)",
    )
    serve.add_argument(
        "--rest-allow-origin",
        action="append",
        dest="rest_allow_origin",
        help="CORS origin allowed to call the REST API: '*', or a pattern with * and ?; repeatable (default: none)",
    )
    serve.add_argument(
        "--rest-relay-cache-capacity",
        type=int,
        help=f"relayed messages kept for GET /relay/v1/messages, over all topics "
        f"(default: {d.rest_relay_cache_capacity})",
    )
    serve.add_argument(
        "--num-shards-in-network",
        type=int,
        help="shards content topics map to (autosharding: /relay/v1/auto endpoints, lightpush without a "
        "pubsub topic), 0: static sharding only (default: 0)",
    )
    serve.add_argument(
        "--discv5-discovery",
        action="store_true",
        default=None,
        help="find relay peers by discv5 (33/WAKU2-DISCV5, protocol id d5waku) (default: off)",
    )
    serve.add_argument("--discv5-udp-port", type=int, help=f"discv5 UDP port, 0: any (default: {d.discv5_udp_port})")
    serve.add_argument(
        "--discv5-bootstrap-node",
        action="append",
        dest="discv5_bootstrap_nodes",
        help="record (enr:...) of a discv5 node to start from; repeatable (default: none)",
    )
    serve.add_argument(
        "--discv5-enr-auto-update",
        action="store_true",
        default=None,
        help="put in the record the address discv5 peers see this node at (default: off)",
    )
    serve.add_argument(
        "--log-level", help=f"debug, info, warning, error or critical, any case (default: {d.log_level.lower()})"
    )
    serve.add_argument(
        "--log-format",
        choices=("auto", "json", "text"),
        help="JSON lines, plain text, or auto: text on a terminal, JSON otherwise (default: auto)",
    )
    serve.set_defaults(handler=run_serve)


def run_serve(args: argparse.Namespace) -> int:
    import trio

    from wakustore.cli.logs import configure as configure_logging
    from wakustore.node import data_dir
    from wakustore.node.host import HostError, ListenError
    from wakustore.node.process import configure_node_process
    from wakustore.node.rate_limits import RateLimits

    overrides = {
        k: getattr(args, k, None)
        for k in (
            "data_dir",
            "engine",
            "tcp_port",
            "ws_port",
            "metrics_port",
            "mailserver_port",
            "cluster_id",
            "shards",
            "retention",
            "listen_host",
            "relay",
            "relay_peers",
            "dns_discovery_urls",
            "dns_discovery_name_servers",
            "peer_exchange",
            "peer_exchange_nodes",
            "rate_limits",
            "ext_multiaddrs",
            "metrics_host",
            "max_connections",
            "ip_colocation_limit",
            "sync_peers",
            "rest",
            "rest_address",
            "rest_port",
            "rest_admin",
            "rest_allow_origin",
            "rest_relay_cache_capacity",
            "num_shards_in_network",
            "discv5_discovery",
            "discv5_udp_port",
            "discv5_bootstrap_nodes",
            "discv5_enr_auto_update",
            "log_level",
            "log_format",
        )
    }
    config = node_config.load(args.config, overrides)
    rate_limits = RateLimits.parse(config.rate_limits)  # checked by load
    configure_logging(config.log_level, config.log_format)
    # Every process-wide setting of the node, here and nowhere else (logged
    # once the node is ready).
    settings = configure_node_process(config)
    # Held until the node has committed and stopped (or the process dies).
    with data_dir.lock(config.data_dir):
        try:
            trio.run(_serve, config, rate_limits, settings)
        except HostError as exc:
            print(f"wakustore: error: {exc}", file=sys.stderr, flush=True)
            return EXIT_BAD_SETUP
        except ListenError as exc:
            # A listener that cannot bind: an address not on this machine, a
            # name that does not resolve.
            print(f"wakustore: error: cannot listen: {_os_error(exc)}", file=sys.stderr, flush=True)
            return EXIT_BAD_SETUP
        except OSError as exc:
            # The data dir or the storage failed under the start (a bad
            # data file does not: the node starts beside it).
            print(f"wakustore: error: {_os_error(exc)}", file=sys.stderr, flush=True)
            return EXIT_BAD_SETUP
        finally:
            for timer in _deadline:
                timer.cancel()
    # After the commit and the lock's release: another process may take the
    # data dir from here on.
    log.info("node stopped")
    print(STOPPED_LINE, flush=True)
    return 0


def _exit_if_not_stopped_by(deadline_s: float) -> None:
    """From now on, the process ends within ``deadline_s`` whatever the
    node is waiting for."""

    def give_up() -> None:
        log.error("not stopped after %g s: exiting now; the write-ahead log keeps what was not committed", deadline_s)
        print(STOPPED_LINE, flush=True)
        logging.shutdown()
        os._exit(0)

    timer = threading.Timer(deadline_s, give_up)
    timer.daemon = True
    _deadline.append(timer)
    timer.start()


async def _serve(config: node_config.NodeConfig, rate_limits, process_settings: list[str]) -> None:
    import trio

    """Run the node (:func:`~wakustore.node.running.running_node`) until
    SIGINT or SIGTERM: then the host stops first (no new requests), then
    the store commits and stops."""
    from wakustore.node.host import write_node_info
    from wakustore.node.mailserver import dialable_enodes
    from wakustore.node.running import running_node

    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        try:
            async with trio.open_nursery() as nursery:

                async def stop_on_signal() -> None:
                    # Also while the node starts: a signal then stops the start.
                    async for signum in signals:
                        log.info("signal %s: committing and stopping", signal.Signals(signum).name)
                        _exit_if_not_stopped_by(STOP_DEADLINE_S)
                        nursery.cancel_scope.cancel()
                        return

                nursery.start_soon(stop_on_signal)
                async with running_node(config, rate_limits=rate_limits) as node:
                    info, service, mailserver = node.info, node.service, node.mailserver
                    write_node_info(
                        config.data_dir,
                        info,
                        engine=config.engine,
                        table=config.messages_uri,
                        pid=os.getpid(),
                        cluster_id=config.cluster_id,
                        shards=config.shards,
                        enode=mailserver.enode,
                        metrics_port=node.metrics_port,
                        rest_port=node.rest_port,
                        enr=node.enr.text if node.enr is not None else None,
                    )
                    log.info(
                        "node ready: peer %s, table %s, engine %s, %d messages pending from the log",
                        info.peer_id,
                        config.messages_uri,
                        config.engine,
                        service.store.pending,
                    )
                    log.info(
                        "serving cluster %(cluster_id)s shards %(shards)s; retention %(retention)s; relay "
                        "%(relay)s; engine %(engine)s; shared table %(shared_table)s",
                        service.effective_config(),
                    )
                    log.info(
                        "rate limits per peer and per address: store %s, lightpush %s",
                        rate_limits.store,
                        rate_limits.lightpush,
                    )
                    log.info(
                        "inbound connections: at most %d, %d per address (0: no cap)",
                        config.max_connections,
                        config.ip_colocation_limit,
                    )
                    log.info("process settings: %s", "; ".join(process_settings))
                    for addr in info.multiaddrs:
                        print(addr, flush=True)
                    for enode in dialable_enodes(mailserver):
                        print(enode, flush=True)
                    if node.enr is not None:
                        print(node.enr.text, flush=True)
                    print(
                        f"metrics and health on http://{_url_host(config.metrics_host)}:{node.metrics_port}/",
                        flush=True,
                    )
                    if node.rest_port is not None:
                        print(f"REST API on http://{_url_host(config.rest_address)}:{node.rest_port}/", flush=True)
                    if node.seeder is not None:
                        print(f"seeding community archives on port {node.seeder.port}", flush=True)
                    print("wakustore node ready; table " + config.messages_uri, flush=True)
                    await trio.sleep_forever()
        except BaseExceptionGroup as group:
            # One failure (a taken port, a bad key), however deep the
            # nurseries that carried it: the caller reports it as it is.
            single = _single_failure(group)
            if single is not None:
                raise single from None
            raise


def _single_failure(group: BaseExceptionGroup) -> Exception | None:
    """The one Exception in ``group`` and the groups nested in it, else None."""
    import trio

    leaves: list[BaseException] = []

    def collect(error: BaseException) -> None:
        if isinstance(error, BaseExceptionGroup):
            for inner in error.exceptions:
                collect(inner)
        elif not isinstance(error, trio.Cancelled):
            leaves.append(error)

    collect(group)
    if len(leaves) == 1 and isinstance(leaves[0], Exception):
        return leaves[0]
    return None


def _os_error(exc: OSError) -> str:
    text = exc.strerror or str(exc)
    where = f" ({exc.filename})" if exc.filename else ""
    return f"{text}{where} [errno {exc.errno}]" if exc.errno is not None else f"{text}{where}"


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
