"""An embedded engine's process, both sides: the parent's :func:`spawn` and
:func:`stop`, and the child's :func:`serve` loop.

:class:`wakustore.storage.engine.Engine` runs its engine (Sail, or Apache
Spark's Spark Connect server) as a child process so that the node can
bound and recycle it. Each engine has a small module whose ``main`` calls
:func:`serve` (:mod:`sail_server`, :mod:`spark_server`); the contract is
the same for both:

- Once the server listens, exactly one line goes to stdout:
  ``<READY_PREFIX> <host> <port>``, with the real port when ``--port 0``
  let the system choose. Anything written after that goes to stderr.
- SIGTERM or SIGINT stop the server and the process exits with status 0.
- With ``--exit-on-stdin-eof`` the process stops when its stdin reaches end
  of file, which is what happens when the parent dies in any way (even
  SIGKILL) and the pipe's write end closes.
- With ``--parent-pid P`` the process stops within
  ``PARENT_POLL_INTERVAL_S`` once its parent is no longer ``P``.
- Exit status 1 means the server stopped on its own.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

# How often the process checks that its parent is alive and the server
# still runs; a parent's death is noticed within this bound even when the
# stdin pipe is held open by someone else.
PARENT_POLL_INTERVAL_S = 0.5


class ServerStartError(Exception):
    """The server process exited, or did not listen in time, after :func:`spawn`."""


class Server(Protocol):
    """What :func:`serve` needs of a started engine server."""

    @property
    def listening_address(self) -> tuple[str, int]: ...

    @property
    def running(self) -> bool: ...

    def stop(self) -> None: ...


def spawn(
    module: str,
    name: str,
    ready_prefix: str,
    env: Mapping[str, str],
    timeout_s: float,
    host: str = "127.0.0.1",
    extra_args: Sequence[str] = (),
) -> tuple[subprocess.Popen, int]:
    """Start ``python -m <module>`` as a child of this process, on a port
    the system chooses; return the process and its port once it listens.

    The child stops when this process dies in any way (its stdin reaches
    EOF; the pipe's write end is close-on-exec, so programs started later
    do not hold it open). PR_SET_PDEATHSIG would be wrong here: it fires
    when the *thread* that forked exits, and the node starts the engine
    from short-lived worker threads. The child gets its own session so a
    terminal's Ctrl-C reaches only the node, which stops it in order.
    Raises :class:`ServerStartError` after ``timeout_s`` or if it exits;
    ``name`` names the server in its messages, ``ready_prefix`` starts
    its ready line.
    """
    command = [
        sys.executable,
        "-m",
        module,
        "--host",
        host,
        "--port",
        "0",
        "--parent-pid",
        str(os.getpid()),
        "--exit-on-stdin-eof",
        *extra_args,
    ]
    child = subprocess.Popen(
        command,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=dict(env),
        start_new_session=True,
    )
    try:
        return child, _read_ready_port(child, timeout_s, name, ready_prefix)
    except BaseException:
        stop(child, grace_s=0)
        raise


def stop(child: subprocess.Popen, grace_s: float) -> bool:
    """Stop and reap ``child``: EOF on stdin and SIGTERM, then SIGKILL after
    ``grace_s``. Returns False if it had to be killed."""
    with contextlib.suppress(OSError):
        if child.stdin is not None:
            child.stdin.close()
    if child.poll() is not None:
        return True
    with contextlib.suppress(ProcessLookupError):
        child.terminate()
    try:
        child.wait(grace_s)
        return True
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()
        return False


def parser(prog: str, description: str) -> argparse.ArgumentParser:
    """The flags every engine process takes; a module adds its own."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, required=True, help="port to bind; 0 lets the system choose")
    parser.add_argument("--parent-pid", type=int, help="exit once the parent process is no longer this pid")
    parser.add_argument("--exit-on-stdin-eof", action="store_true", help="exit when stdin reaches end of file")
    return parser


def serve(args: argparse.Namespace, ready_prefix: str, start: Callable[[], Server]) -> int:
    """The child's life: start the server (``start``), announce it, run
    until told to stop or orphaned, stop it. Returns the exit status."""
    stopping = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stopping.set())
    if args.parent_pid is not None and os.getppid() != args.parent_pid:
        return 0  # the parent died before we got here
    if args.exit_on_stdin_eof:
        threading.Thread(target=_wait_for_eof, args=(stopping,), name="stdin-eof", daemon=True).start()

    server = start()
    host, port = server.listening_address
    print(f"{ready_prefix} {host} {port}", flush=True)
    # The parent stops reading stdout after the ready line.
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())

    status = 0
    while not stopping.wait(PARENT_POLL_INTERVAL_S):
        if args.parent_pid is not None and os.getppid() != args.parent_pid:
            break
        if not server.running:
            status = 1
            break
    if server.running:
        server.stop()
    return status


def _wait_for_eof(stopping: threading.Event) -> None:
    # os.read on the descriptor, not sys.stdin: a daemon thread blocked
    # inside the buffered reader holds its lock, and interpreter shutdown
    # aborts when it cannot take that lock.
    try:
        while os.read(sys.stdin.fileno(), 4096):
            pass
    except OSError:
        pass
    stopping.set()


def _read_ready_port(child: subprocess.Popen, timeout_s: float, name: str, ready_prefix: str) -> int:
    deadline = time.monotonic() + timeout_s
    stdout = child.stdout
    assert stdout is not None  # spawn() starts the child with stdout=PIPE
    fd = stdout.fileno()
    buffer = b""
    while b"\n" not in buffer:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise ServerStartError(f"the {name} server did not listen within {timeout_s:g} s")
        readable, _, _ = select.select([fd], [], [], remaining)
        if not readable:
            continue
        chunk = os.read(fd, 4096)
        if not chunk:
            raise ServerStartError(f"the {name} server exited (status {child.wait()}) before listening")
        buffer += chunk
    stdout.close()
    words = buffer.split(b"\n", 1)[0].decode(errors="replace").split()
    if len(words) != 3 or words[0] != ready_prefix or not words[2].isdigit():
        raise ServerStartError(f"unexpected first line from the {name} server: {' '.join(words)!r}")
    return int(words[2])
