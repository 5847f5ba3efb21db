"""``wakustore bench``: one parser, one verb per benchmark (each added by
its module in :mod:`wakustore.bench`, with ``register_verb(verbs)``)."""

from __future__ import annotations

import argparse


def register(commands: argparse._SubParsersAction) -> None:
    from wakustore.bench import archive as bench_archive
    from wakustore.bench import mailserver as bench_mailserver
    from wakustore.bench import store as bench_store
    from wakustore.bench import wire as bench_wire

    bench = commands.add_parser("bench", help="benchmarks")
    verbs = bench.add_subparsers(dest="verb", required=True, parser_class=commands._parser_class)
    for module in (bench_store, bench_wire, bench_mailserver, bench_archive):
        module.register_verb(verbs)
