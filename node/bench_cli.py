"""The ``wakustore bench`` command: one parser, one verb per benchmark.

Each benchmark module adds its verb with ``register_verb(verbs)``; the
options every benchmark shares (seed, JSON output, data directory, node
configuration, engine) are added here once.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text}")
    return value


def add_common_arguments(verb: argparse.ArgumentParser, data_dir_help: str) -> None:
    verb.add_argument("--seed", type=int, default=1)
    verb.add_argument("--json", type=Path, help="write the figures here")
    verb.add_argument("--data-dir", type=Path, help=data_dir_help)
    verb.add_argument("--config", type=Path, help="node TOML configuration (engine, flush size)")
    verb.add_argument("--engine", help="'embedded' or sc://host:port")


def register(commands: argparse._SubParsersAction) -> None:
    from wakustore.node import bench_archive, bench_mailserver, bench_store, bench_wire

    bench = commands.add_parser("bench", help="benchmarks")
    verbs = bench.add_subparsers(dest="verb", required=True, parser_class=commands._parser_class)
    for module in (bench_store, bench_wire, bench_mailserver, bench_archive):
        module.register_verb(verbs)
