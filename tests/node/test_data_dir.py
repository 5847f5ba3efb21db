"""One writer per data dir: the lock (node/data_dir.py) in real processes,
and the commands that take it or read beside it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import coincurve
import pytest

from wakustore.node import data_dir
from wakustore.protocols.message import WakuMessage, message_hash

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cli"))
from test_serve import CLUSTER_ID, PUBSUB_TOPIC, STOP_TIMEOUT_S, ServeProcess, wakustore  # noqa: E402

CONTENT_TOPIC = "/data-dir/1/test/proto"
COMMUNITY_KEY = bytes(range(1, 33))
COMMUNITY_PUBKEY = coincurve.PrivateKey(COMMUNITY_KEY).public_key.format().hex()
PROCESS_TIMEOUT_S = 30


# --- the lock, across processes --------------------------------------------

HOLDER = textwrap.dedent("""
    import subprocess, sys
    from pathlib import Path
    from wakustore.node import data_dir
    held = data_dir.lock(Path(sys.argv[1]))
    if len(sys.argv) > 2:  # a child that outlives us, as the engine could
        child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                                 stdin=subprocess.PIPE, close_fds=False)
        print(child.pid, flush=True)
    print("locked", flush=True)
    sys.stdin.read()
""")

TRY_LOCK = textwrap.dedent("""
    import sys
    from pathlib import Path
    from wakustore.node import data_dir
    try:
        data_dir.lock(Path(sys.argv[1]))
    except data_dir.DataDirInUse as exc:
        print(exc.holder_pid, exc, sep="|")
        sys.exit(3)
    print("locked")
""")


def _start_holder(path: Path, *extra: str) -> tuple[subprocess.Popen, list[str]]:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(path), *extra], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    lines = []
    while not lines or lines[-1] != "locked":
        line = holder.stdout.readline()
        assert line, "lock holder exited"
        lines.append(line.strip())
    return holder, lines


def test_second_lock_in_another_process_is_refused_naming_the_holder(tmp_path):
    held = data_dir.lock(tmp_path / "d")
    try:
        assert (tmp_path / "d" / data_dir.LOCK_FILE).read_text().strip() == str(os.getpid())
        other = subprocess.run(
            [sys.executable, "-c", TRY_LOCK, str(tmp_path / "d")],
            capture_output=True,
            text=True,
            timeout=PROCESS_TIMEOUT_S,
        )
        assert other.returncode == 3, other.stderr
        pid, message = other.stdout.strip().split("|")
        assert pid == str(os.getpid())
        assert message == (
            f"data dir {tmp_path / 'd'} is in use by process {os.getpid()} (another node or command writes it)"
        )
    finally:
        held.release()
    again = subprocess.run(
        [sys.executable, "-c", TRY_LOCK, str(tmp_path / "d")], capture_output=True, text=True, timeout=PROCESS_TIMEOUT_S
    )
    assert again.returncode == 0 and again.stdout.strip() == "locked", again.stderr


def test_a_second_open_in_the_same_process_is_refused_too(tmp_path):
    with data_dir.lock(tmp_path):
        with pytest.raises(data_dir.DataDirInUse) as refused:
            data_dir.lock(tmp_path)
        assert refused.value.holder_pid == os.getpid()
    with data_dir.lock(tmp_path) as held:
        assert held.held
    assert not held.held


def test_the_kernel_releases_the_lock_when_the_holder_is_killed(tmp_path):
    holder, _ = _start_holder(tmp_path)
    try:
        with pytest.raises(data_dir.DataDirInUse) as refused:
            data_dir.lock(tmp_path)
        assert refused.value.holder_pid == holder.pid
    finally:
        holder.kill()
        holder.wait(PROCESS_TIMEOUT_S)
    # No stale lock to clean up: the file is still there, unlocked.
    assert (tmp_path / data_dir.LOCK_FILE).exists()
    with data_dir.lock(tmp_path) as held:
        assert (tmp_path / data_dir.LOCK_FILE).read_text().strip() == str(os.getpid())
    assert not held.held


def test_a_child_started_by_the_holder_does_not_keep_the_lock(tmp_path):
    """The engine is a child of the node; it must not keep the data dir
    locked after the node is killed, even when it inherits descriptors."""
    holder, lines = _start_holder(tmp_path, "with-child")
    child_pid = int(lines[0])
    try:
        holder.kill()
        holder.wait(PROCESS_TIMEOUT_S)
        os.kill(child_pid, 0)  # still alive
        with data_dir.lock(tmp_path):
            pass
    finally:
        os.kill(child_pid, signal.SIGKILL)


def test_path_errors_are_data_dir_errors(tmp_path):
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    with pytest.raises(data_dir.DataDirError, match=f"^data dir {a_file} is not a directory$"):
        data_dir.lock(a_file)
    with pytest.raises(data_dir.DataDirError, match="lies under a file"):
        data_dir.lock(a_file / "sub")
    with pytest.raises(data_dir.DataDirError, match="is not a directory$"):
        data_dir.check_readable(a_file)
    with pytest.raises(data_dir.DataDirError, match="does not exist$"):
        data_dir.check_readable(tmp_path / "missing")
    assert not (tmp_path / "missing").exists()  # a reader creates nothing


def test_an_unwritable_data_dir_is_a_data_dir_error(tmp_path):
    if os.geteuid() == 0:
        unwritable = Path("/sys/wakustore-data")  # root ignores modes; sysfs refuses new entries
    else:
        unwritable = tmp_path / "ro"
        unwritable.mkdir(mode=0o500)
    with pytest.raises(data_dir.DataDirError, match=f"^data dir {unwritable} is not writable"):
        data_dir.lock(unwritable)


# --- commands: path errors (no engine starts) ------------------------------


@pytest.mark.parametrize(
    "command",
    [
        ["serve", "--tcp-port", "0", "--ws-port", "0", "--mailserver-port", "0", "--metrics-port", "0"],
        ["db", "stats"],
        ["db", "export", "--to-jsonl", "{tmp}/out.jsonl"],
        ["db", "import", "--from-jsonl", "{file}"],
        ["db", "compact"],
        ["db", "vacuum"],
        ["db", "retention"],
        ["archive", "fetch", "--community-pubkey", COMMUNITY_PUBKEY, "--magnet", "magnet:?xt=urn:btih:" + "0" * 40],
    ],
)
def test_a_data_dir_that_is_a_file_is_one_line_exit_2(tmp_path, command):
    a_file = tmp_path / "a-file"
    a_file.write_text("{}\n")
    args = [a.replace("{tmp}", str(tmp_path)).replace("{file}", str(a_file)) for a in command]
    result = wakustore(*args, "--data-dir", str(a_file))
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [f"wakustore: error: data dir {a_file} is not a directory"]


# --- commands beside a running node ----------------------------------------


def _jsonl(path: Path, messages: list[WakuMessage]) -> Path:
    path.write_text(
        "".join(
            json.dumps(
                {
                    "pubsub_topic": PUBSUB_TOPIC,
                    "content_topic": m.content_topic,
                    "payload": m.payload.hex(),
                    "meta": "",
                    "timestamp": m.timestamp,
                    "version": 0,
                }
            )
            + "\n"
            for m in messages
        )
    )
    return path


def _refusal(pid: int, path: Path) -> list[str]:
    return [f"wakustore: error: data dir {path} is in use by process {pid} (another node or command writes it)"]


@pytest.fixture(scope="module")
def running(tmp_path_factory):
    """A node on a data dir that already holds ten committed messages; it
    commits what it receives only when it stops, so what is pushed to it
    stays in its write-ahead log while the tests run."""
    base = tmp_path_factory.mktemp("locked")
    path = base / "data"
    now = time.time_ns()
    stored = [WakuMessage(b"stored-%d" % i, CONTENT_TOPIC, timestamp=now - 1000 + i) for i in range(10)]
    result = wakustore("db", "import", "--data-dir", str(path), "--from-jsonl", str(_jsonl(base / "in.jsonl", stored)))
    assert result.returncode == 0, result.stderr
    config = base / "node.toml"
    config.write_text("flush_interval_s = 3600.0\nflush_max_messages = 100000\n")
    server = ServeProcess(path, "--config", str(config))
    printed = server.wait_ready()
    yield server, path, printed, stored, base
    if server.proc.poll() is None:
        server.proc.kill()
        server.proc.wait()


@pytest.mark.slow
def test_a_second_serve_exits_2_naming_the_first_which_keeps_serving(running):
    server, path, printed, _, _ = running
    second = wakustore(
        "serve",
        "--data-dir",
        str(path),
        "--tcp-port",
        "0",
        "--ws-port",
        "0",
        "--mailserver-port",
        "0",
        "--metrics-port",
        "0",
        "--listen-host",
        "127.0.0.1",
        "--cluster-id",
        str(CLUSTER_ID),
        "--shard",
        "3",
    )
    assert second.returncode == 2
    assert second.stderr.splitlines() == _refusal(server.proc.pid, path)
    info = json.loads((path / "node-info.json").read_text())
    assert info["pid"] == server.proc.pid  # not overwritten by the refused one
    with urllib.request.urlopen(f"http://127.0.0.1:{info['metrics_port']}/health", timeout=10) as response:
        assert json.loads(response.read())["ok"] is True
    message = WakuMessage(b"after the refusal", CONTENT_TOPIC, timestamp=time.time_ns())
    pushed = wakustore(
        "push",
        "--peer",
        printed[0],
        "--pubsub-topic",
        PUBSUB_TOPIC,
        "--content-topic",
        CONTENT_TOPIC,
        "--payload",
        message.payload.hex(),
        "--timestamp",
        str(message.timestamp),
    )
    assert pushed.returncode == 0, pushed.stderr
    found = wakustore("query", "--peer", printed[0], "--hashes", message_hash(PUBSUB_TOPIC, message).hex())
    assert found.returncode == 0, found.stderr
    assert [line.split("\t")[0] for line in found.stdout.splitlines()] == [message_hash(PUBSUB_TOPIC, message).hex()]


@pytest.mark.slow
@pytest.mark.parametrize(
    "command",
    [
        ["db", "import", "--from-jsonl", "{jsonl}"],
        ["db", "compact"],
        ["db", "vacuum"],
        ["db", "retention"],
        ["archive", "export", "--community-key", "{key}", "--chat-id", "general", "--archive-dir", "{base}/archives"],
        ["archive", "fetch", "--community-pubkey", COMMUNITY_PUBKEY, "--magnet", "magnet:?xt=urn:btih:" + "0" * 40],
    ],
)
def test_writer_commands_are_refused_beside_a_running_node(running, command):
    server, path, _, _, base = running
    key = base / "community.key"
    key.write_text(COMMUNITY_KEY.hex())
    jsonl = _jsonl(base / "more.jsonl", [WakuMessage(b"late", CONTENT_TOPIC, timestamp=time.time_ns())])
    args = [a.replace("{jsonl}", str(jsonl)).replace("{key}", str(key)).replace("{base}", str(base)) for a in command]
    result = wakustore(*args, "--data-dir", str(path))
    assert result.returncode == 2
    assert result.stderr.splitlines() == _refusal(server.proc.pid, path)
    assert server.proc.poll() is None


@pytest.mark.slow
def test_stats_and_export_read_beside_a_running_node_and_write_nothing(running):
    """They read the committed table only: the node's log is neither
    replayed, committed nor trimmed under it."""
    server, path, printed, stored, base = running
    waiting = WakuMessage(b"in the node's log", CONTENT_TOPIC, timestamp=time.time_ns())
    pushed = wakustore(
        "push",
        "--peer",
        printed[0],
        "--pubsub-topic",
        PUBSUB_TOPIC,
        "--content-topic",
        CONTENT_TOPIC,
        "--payload",
        waiting.payload.hex(),
        "--timestamp",
        str(waiting.timestamp),
    )
    assert pushed.returncode == 0, pushed.stderr
    log_dir = path / "tables" / "messages" / "_delta_log"
    before = sorted(p.name for p in log_dir.iterdir())
    wal = path / "wal" / "messages"
    wal_before = sorted((p.name, p.stat().st_size) for p in wal.iterdir())
    assert wal_before

    stats = wakustore("db", "stats", "--data-dir", str(path))
    assert stats.returncode == 0, stats.stderr
    stats = json.loads(stats.stdout)
    assert stats["rows"] == len(stored) and stats["pending_in_log"] >= 1
    out = base / "export.jsonl"
    exported = wakustore("db", "export", "--data-dir", str(path), "--to-jsonl", str(out))
    assert exported.returncode == 0, exported.stderr
    payloads = [bytes.fromhex(json.loads(line)["payload"]) for line in out.read_text().splitlines()]
    assert sorted(payloads) == sorted(m.payload for m in stored)
    assert "write-ahead log" in exported.stderr.splitlines()[-1]

    assert sorted(p.name for p in log_dir.iterdir()) == before
    assert sorted((p.name, p.stat().st_size) for p in wal.iterdir()) == wal_before
    assert server.proc.poll() is None
    # The node still answers for the message only its log holds.
    found = wakustore("query", "--peer", printed[0], "--hashes", message_hash(PUBSUB_TOPIC, waiting).hex())
    assert found.returncode == 0 and found.stdout.startswith(message_hash(PUBSUB_TOPIC, waiting).hex()), found


@pytest.mark.slow
def test_after_sigkill_a_new_serve_starts_on_the_same_data_dir(tmp_path):
    first = ServeProcess(tmp_path)
    first.wait_ready()
    first.proc.kill()
    first.proc.wait(STOP_TIMEOUT_S)
    second = ServeProcess(tmp_path)
    try:
        second.wait_ready()
        assert json.loads((tmp_path / "node-info.json").read_text())["pid"] == second.proc.pid
    finally:
        second.proc.send_signal(signal.SIGTERM)
        assert second.proc.wait(STOP_TIMEOUT_S) == 0
