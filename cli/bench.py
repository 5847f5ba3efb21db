"""``wakustore bench``: one parser, one verb per benchmark (each added by
its module in :mod:`wakustore.bench`, with ``register_verb(verbs)``).

The benchmark modules load the engine, Arrow and the SQL comparisons, so
their parser is built only when ``bench`` runs: ``wakustore --help`` and
the other commands start without them."""

from __future__ import annotations

import argparse


def register(commands: argparse._SubParsersAction) -> None:
    bench = commands.add_parser(
        "bench",
        help="benchmarks: store, wire, mailserver, archive, engine (wakustore bench --help)",
        add_help=False,
        # Everything after `bench` is the benchmark parser's, --help included.
        prefix_chars="\x01",
    )
    bench.add_argument("rest", nargs=argparse.REMAINDER)
    bench.set_defaults(handler=_run, parser_class=commands._parser_class)


def bench_parser(parser_class: type[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """The parser of ``wakustore bench``'s verbs (loads the benchmarks)."""
    from wakustore.bench import archive as bench_archive
    from wakustore.bench import engine as bench_engine
    from wakustore.bench import mailserver as bench_mailserver
    from wakustore.bench import store as bench_store
    from wakustore.bench import wire as bench_wire

    parser = parser_class(prog="wakustore bench", description="Benchmarks; each prints its figures.")
    verbs = parser.add_subparsers(dest="verb", required=True, parser_class=parser_class)
    for module in (bench_store, bench_wire, bench_mailserver, bench_archive, bench_engine):
        module.register_verb(verbs)
    from wakustore.cli.parser import document

    document(parser)
    return parser


def _run(args: argparse.Namespace) -> int:
    chosen = bench_parser(args.parser_class).parse_args(args.rest)
    return int(chosen.handler(chosen))
