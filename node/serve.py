"""``wakustore serve``: run a node until SIGINT or SIGTERM."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
from pathlib import Path

import trio

from wakustore.node import config as node_config

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
    serve.set_defaults(handler=run_serve)


def run_serve(args: argparse.Namespace) -> int:
    overrides = {k: getattr(args, k, None) for k in (
        "data_dir", "engine", "tcp_port", "ws_port", "metrics_port", "mailserver_port",
        "cluster_id", "shards", "retention",
    )}
    config = node_config.load(args.config, overrides)
    logging.basicConfig(
        level=os.environ.get("WAKUSTORE_LOG_LEVEL", "INFO"),
        format='{"time":"%(asctime)s","level":"%(levelname)s","logger":"%(name)s","msg":"%(message)s"}',
    )
    trio.run(_serve, config)
    return 0


async def _serve(config: node_config.NodeConfig) -> None:
    from wakustore.node.store_service import running_store

    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with running_store(config) as service:
            info = {
                "multiaddrs": [],
                "engine": config.engine,
                "table": config.messages_uri,
                "pid": os.getpid(),
            }
            (config.data_dir / "node-info.json").write_text(json.dumps(info, indent=2))
            log.info("node ready: table %s, engine %s, %d messages pending from the log",
                     config.messages_uri, config.engine, service.store.pending)
            print("wakustore node ready; table " + config.messages_uri, flush=True)
            async for signum in signals:
                log.info("signal %s: committing and stopping", signal.Signals(signum).name)
                break
