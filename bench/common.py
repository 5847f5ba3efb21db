"""What the benchmarks share: the options every ``wakustore bench`` verb
takes (seed, JSON output, data directory, node configuration, engine),
argument types, and running clients in a process of their own.

The ``bench`` command itself is :mod:`wakustore.cli.bench`; each benchmark
module adds its verb with ``register_verb(verbs)``.
"""

from __future__ import annotations

import argparse
import json
import pickle
import subprocess
import sys
import time
from pathlib import Path


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text}")
    return value


def run_client_process(module: str, job: object, timeout_s: float) -> object:
    """Run ``<module>.client_main()`` in a fresh interpreter: ``job`` goes
    in pickled on stdin, its result comes back pickled on stdout. Clients
    live in their own process so they do not share the node's GIL."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", f"from {module} import client_main; client_main()"],
            input=pickle.dumps(job),
            capture_output=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"the client process did not finish within {timeout_s} s") from None
    if done.returncode != 0:
        raise RuntimeError(f"the client process failed: {done.stderr.decode(errors='replace').strip()[-2000:]}")
    return pickle.loads(done.stdout)


def add_common_arguments(verb: argparse.ArgumentParser, data_dir_help: str) -> None:
    verb.add_argument("--seed", type=int, default=1)
    verb.add_argument("--json", type=Path, help="write the figures here")
    verb.add_argument("--data-dir", type=Path, help=data_dir_help)
    verb.add_argument("--config", type=Path, help="node TOML configuration (engine, flush size)")
    verb.add_argument(
        "--engine", help="'sail' (embedded, the default), 'spark' (embedded Apache Spark with Delta) or sc://host:port"
    )


def wait_for_node_info(process: subprocess.Popen, data_dir: Path, timeout_s: float, name: str, log_path: Path) -> dict:
    """The ``node-info.json`` a ``wakustore serve`` child writes once it is
    ready (the file names its pid: an older one is not taken for it);
    RuntimeError when the child exits first or takes over ``timeout_s``."""
    info = data_dir / "node-info.json"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited with {process.returncode}; see {log_path}")
        try:
            data = json.loads(info.read_text())
        except (OSError, ValueError):
            data = {}
        if data.get("pid") == process.pid:
            return data
        time.sleep(0.05)
    raise RuntimeError(f"{name} did not start within {timeout_s:g} s; see {log_path}")
