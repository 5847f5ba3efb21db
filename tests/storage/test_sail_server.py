"""The embedded engine's process (storage/sail_server.py) on its own: it
listens on a port the kernel picks and says so in one line, answers Spark
Connect, and stops as its docstring promises (SIGTERM, stdin EOF, parent
gone); the parent side notices a server that dies before listening and
kills one that ignores SIGTERM."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from wakustore.storage import sail_server

START_TIMEOUT_S = 60.0
EXIT_TIMEOUT_S = 15.0


def _env() -> dict[str, str]:
    return dict(os.environ)


def _gone(pid: int) -> bool:
    """No such process, or a zombie nobody reaped yet (it has exited)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


def _wait_gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if _gone(pid):
            return True
        time.sleep(0.05)
    return _gone(pid)


def test_spawned_server_listens_on_a_kernel_port_answers_and_stops_on_sigterm():
    child, port = sail_server.spawn(_env(), START_TIMEOUT_S)
    try:
        assert 0 < port < 65536
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass
        from pyspark.sql import SparkSession

        spark = SparkSession.builder.remote(f"sc://127.0.0.1:{port}").getOrCreate()
        try:
            assert spark.sql("SELECT 40 + 2 AS answer").collect()[0]["answer"] == 42
        finally:
            spark.stop()
        assert child.poll() is None
        child.send_signal(signal.SIGTERM)
        assert child.wait(EXIT_TIMEOUT_S) == 0  # SIGTERM: a clean stop, status 0
    finally:
        sail_server.stop(child, grace_s=0)
    # Nothing listens there any more.
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()


def test_two_servers_get_two_ports():
    first, first_port = sail_server.spawn(_env(), START_TIMEOUT_S)
    try:
        second, second_port = sail_server.spawn(_env(), START_TIMEOUT_S)
        try:
            assert first_port != second_port
        finally:
            assert sail_server.stop(second, grace_s=EXIT_TIMEOUT_S)
    finally:
        assert sail_server.stop(first, grace_s=EXIT_TIMEOUT_S)
    assert first.returncode == 0


def test_the_server_stops_when_its_stdin_reaches_eof():
    command = [sys.executable, "-m", "wakustore.storage.sail_server", "--port", "0", "--exit-on-stdin-eof"]
    child = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=_env())
    try:
        ready = child.stdout.readline().decode().split()
        assert ready[0] == sail_server.READY_PREFIX and ready[1] == "127.0.0.1" and int(ready[2]) > 0
        child.stdin.close()  # what the parent's death does to the pipe
        assert child.wait(EXIT_TIMEOUT_S) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def test_the_server_stops_once_its_parent_is_gone():
    # A parent that starts the server and dies at once (the pipe's write
    # end is held by this test, so only --parent-pid can notice).
    launcher = (
        "import subprocess, sys\n"
        "import os\n"
        "child = subprocess.Popen([sys.executable, '-m', 'wakustore.storage.sail_server', '--port', '0',"
        " '--parent-pid', str(os.getpid())], stdout=sys.stdout)\n"
        "print('PID', child.pid, flush=True)\n"
        "line = sys.stdin.readline()\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", launcher], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=_env(), text=True
    )
    server_pid = None
    try:
        server_pid = int(parent.stdout.readline().split()[1])
        assert parent.stdout.readline().startswith(sail_server.READY_PREFIX)
        assert not _gone(server_pid)
        parent.stdin.write("go\n")
        parent.stdin.flush()
        parent.wait(EXIT_TIMEOUT_S)
        assert _wait_gone(server_pid, sail_server.PARENT_POLL_INTERVAL_S + EXIT_TIMEOUT_S)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        if server_pid is not None and not _gone(server_pid):
            os.kill(server_pid, signal.SIGKILL)


def test_a_server_whose_parent_died_before_it_started_exits_at_once():
    # No process runs as pid 0's child: the parent is already not "0".
    done = subprocess.run(
        [sys.executable, "-m", "wakustore.storage.sail_server", "--port", "0", "--parent-pid", "0"],
        capture_output=True,
        timeout=EXIT_TIMEOUT_S + 30,
        env=_env(),
    )
    assert done.returncode == 0 and done.stdout == b""


def test_spawn_reports_a_server_that_exits_before_listening():
    # Sail refuses a malformed setting at start, before it listens.
    env = {**_env(), "SAIL_SPARK__SESSION_TIMEOUT_SECS": "not a number"}
    before = _children()
    with pytest.raises(sail_server.ServerStartError, match="exited .* before listening"):
        sail_server.spawn(env, START_TIMEOUT_S)
    assert _children() == before


def test_spawn_gives_up_after_its_timeout_and_leaves_no_process():
    before = _children()
    with pytest.raises(sail_server.ServerStartError, match="did not listen within"):
        sail_server.spawn(_env(), 0.01)
    assert _children() == before


def test_stop_kills_a_child_that_ignores_sigterm():
    ignoring = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import signal, sys, time\n"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('ready', flush=True)\ntime.sleep(60)\n",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert ignoring.stdout.readline() == b"ready\n"
    started = time.monotonic()
    assert sail_server.stop(ignoring, grace_s=0.5) is False
    assert ignoring.returncode == -signal.SIGKILL
    assert time.monotonic() - started < 10
    assert sail_server.stop(ignoring, grace_s=0.5) is True  # already stopped


def _children() -> set[int]:
    me = str(os.getpid())
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if stat[1] == me and stat[0] not in ("Z", "X"):
                found.add(int(entry.name))
    return found
