"""``wakustore soak``: the model-based crash test (:mod:`wakustore.bench.soak`)."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(commands: argparse._SubParsersAction) -> None:
    soak = commands.add_parser("soak", help="model-based crash test against a real node")
    soak.add_argument("--minutes", type=float, default=30.0, help="how long to run (default 30)")
    soak.add_argument("--seed", type=int, help="random seed (default: from the clock, printed)")
    soak.add_argument("--work-dir", type=Path, help="where the node's data goes (default: a temporary dir)")
    soak.add_argument("--verbose", action="store_true", help="one line per step")
    soak.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from wakustore.bench.soak import run_soak

    return run_soak(args)
