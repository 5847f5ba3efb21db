"""The Sail engine's process: a Sail Spark Connect server on loopback.

Run as ``python -m wakustore.storage.sail_server --port N [--host 127.0.0.1]``.
:class:`wakustore.storage.engine.Engine` starts it as a child process so the
node can bound and recycle Sail's memory; it can also be run by hand to
attach a PySpark shell (``sc://127.0.0.1:N``). What a parent may rely on
(the ready line ``SAIL_LISTENING <host> <port>``, how it stops) is
:mod:`engine_process`'s contract.

Sail reads its configuration from ``SAIL_*`` environment variables (key
``a.b_c`` becomes ``SAIL_A__B_C``); the parent sets them.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping

from wakustore.storage import engine_process
from wakustore.storage.engine_process import PARENT_POLL_INTERVAL_S, ServerStartError, stop

__all__ = ["PARENT_POLL_INTERVAL_S", "READY_PREFIX", "ServerStartError", "main", "spawn", "stop"]

READY_PREFIX = "SAIL_LISTENING"
NAME = "Sail"


def spawn(env: Mapping[str, str], timeout_s: float, host: str = "127.0.0.1") -> tuple[subprocess.Popen, int]:
    """Start the server as a child of this process on a port the system
    chooses (:func:`engine_process.spawn`); return it and its port."""
    return engine_process.spawn(__name__, NAME, READY_PREFIX, env, timeout_s, host)


def main(argv: list[str] | None = None) -> int:
    args = engine_process.parser(
        "python -m wakustore.storage.sail_server", "Run a Sail Spark Connect server (the node's embedded engine)."
    ).parse_args(argv)

    def start():
        from pysail.spark import SparkConnectServer

        server = SparkConnectServer(args.host, args.port)
        server.start(background=True)
        return server

    return engine_process.serve(args, READY_PREFIX, start)


if __name__ == "__main__":
    sys.exit(main())
