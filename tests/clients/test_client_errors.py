"""The client commands against a node's own defaults and against failures.

``wakustore query``, ``push`` and ``mailserver request|post`` run as real
processes against nodes on loopback (threads on the session's engine, or a
``wakustore serve`` process for a node killed mid-push): they wait out the
node's rate limits, and every failure (nothing listening, a wrong peer id, a
refused handshake, a node that goes away) is one line on stderr, exit 1.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import trio

from wakustore.clients.backoff import Backoff, BackoffPolicy
from wakustore.clients.store import StoreClient
from wakustore.node.store_protocols import RateLimits
from wakustore.protocols.message import WakuMessage, message_hash
from wakustore.protocols.store_query import HistoryQuery

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "node"))
from store_node_harness import PUBSUB_TOPIC, NodeThread, node_config  # noqa: E402

CLI_TIMEOUT_S = 120
CONTENT_TOPIC = "/client-errors/1/test/proto"
# A store limit well below one --all run: 5 pages a second, bursts of 5.
TIGHT_STORE = "store:5/1s"
SEEDED = 30
PAGE = 2  # 15 pages: three times the burst


def wakustore(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "wakustore", *args],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        env=_env(),
        check=False,
    )


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("LIBP2P_DEBUG", None)
    return env


def assert_one_line_failure(result: subprocess.CompletedProcess, *expected: str) -> str:
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert "Traceback" not in output and "ExceptionGroup" not in output, output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("wakustore: error: "), lines
    for text in expected:
        assert text in lines[0], lines
    return lines[0]


def free_port() -> int:
    """A loopback port the kernel just handed out and nothing listens on."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def other_peer_id() -> str:
    from libp2p.crypto.secp256k1 import create_new_key_pair
    from libp2p.peer.id import ID

    return ID.from_pubkey(create_new_key_pair().public_key).to_string()


def with_wrong_peer_id(addr: str) -> str:
    return addr.rsplit("/p2p/", 1)[0] + "/p2p/" + other_peer_id()


def write_jsonl(path: Path, messages: list[WakuMessage]) -> Path:
    path.write_text(
        "".join(
            json.dumps(
                {
                    "pubsub_topic": PUBSUB_TOPIC,
                    "content_topic": m.content_topic,
                    "payload": m.payload.hex(),
                    "timestamp": m.timestamp,
                }
            )
            + "\n"
            for m in messages
        )
    )
    return path


def fresh_messages(count: int, topic: str = CONTENT_TOPIC) -> list[WakuMessage]:
    now = time.time_ns()
    return [WakuMessage(b"message-%d" % i, topic, timestamp=now - i * 1000) for i in range(count)]


def stored_hashes(node: NodeThread, topic: str) -> list[str]:
    async def main():
        query = HistoryQuery(pubsub_topic=PUBSUB_TOPIC, content_topics=(topic,), limit=100)
        async with StoreClient.connect(node.tcp_addr) as client:
            response = await client.query(query)
        assert response.status_code == 200 and response.cursor is None
        return sorted(e.message_hash.hex() for e in response.messages)

    return trio.run(main)


# --- the shared backoff routine ---------------------------------------------------


def run_backoff(policy: BackoffPolicy, answers: list[bool], backoff: Backoff | None = None):
    """Feed ``answers`` (True: rate limited) through a Backoff whose pauses
    are recorded instead of slept; returns (last answer, pauses, sends)."""
    pauses: list[float] = []
    feed = iter(answers)
    sent = []

    async def sleep(seconds: float) -> None:
        pauses.append(seconds)

    async def send() -> bool:
        sent.append(1)
        return next(feed)

    backoff = backoff or Backoff(policy, sleep=sleep)
    last = trio.run(backoff.call, send, lambda limited: limited)
    return last, pauses, len(sent)


def test_backoff_doubles_up_to_the_period_then_gives_up_within_its_budget():
    policy = BackoffPolicy(first_s=0.25, max_s=5.0, max_retries=100, max_wait_s=4.0, period_s=1.0)
    last, pauses, sends = run_backoff(policy, [True] * 50)
    assert last is True  # still limited: handed back for the caller to report
    assert pauses == [0.25, 0.5, 1.0, 1.0, 1.0]  # capped at the period, 3.75 s <= 4 s
    assert sends == 6
    unknown_period = BackoffPolicy(first_s=0.25, max_s=2.0, max_retries=3, max_wait_s=60.0)
    assert run_backoff(unknown_period, [True] * 10)[1:] == ([0.25, 0.5, 1.0], 4)


def test_backoff_starts_the_next_refusal_from_the_pause_that_worked():
    policy = BackoffPolicy(first_s=0.1, max_s=5.0, max_retries=10, max_wait_s=60.0)
    pauses: list[float] = []

    async def sleep(seconds: float) -> None:
        pauses.append(seconds)

    backoff = Backoff(policy, sleep=sleep)
    assert run_backoff(policy, [True, True, True, False], backoff)[0] is False
    assert pauses == [0.1, 0.2, 0.4]
    assert run_backoff(policy, [False], backoff)[0] is False  # accepted at once: no pause
    assert run_backoff(policy, [True, False], backoff)[0] is False
    assert pauses == [0.1, 0.2, 0.4, 0.4]
    assert backoff.retries == 4


# --- rate limits at the node's defaults ---------------------------------------------


@pytest.fixture(scope="module")
def tight_store_node(engine, tmp_path_factory):
    """A node allowing 5 Store queries a second (lightpush unlimited, to
    seed it quickly), holding SEEDED messages."""
    limits = RateLimits.parse([TIGHT_STORE, "lightpush:0/1s"])
    node = NodeThread(node_config(tmp_path_factory.mktemp("tight-store")), engine, limits).start()
    messages = fresh_messages(SEEDED)

    async def seed():
        async with StoreClient.connect(node.tcp_addr) as client:
            for message in messages:
                assert (await client.push(PUBSUB_TOPIC, message)).status_code == 200

    trio.run(seed)
    node.flush()
    yield node, sorted(message_hash(PUBSUB_TOPIC, m).hex() for m in messages)
    node.stop()


@pytest.fixture(scope="module")
def default_node(engine, tmp_path_factory):
    """A node with the default limits (lightpush 5/1s, store 60/2s)."""
    node = NodeThread(node_config(tmp_path_factory.mktemp("default-limits")), engine).start()
    yield node
    node.stop()


def test_query_all_pages_through_a_tight_store_limit(tight_store_node):
    node, expected = tight_store_node
    result = wakustore(
        "query",
        "--peer",
        node.tcp_addr,
        "--pubsub-topic",
        PUBSUB_TOPIC,
        "--content-topic",
        CONTENT_TOPIC,
        "--limit",
        str(PAGE),
        "--all",
        "--json",
    )
    assert result.returncode == 0, result.stderr
    hashes = [json.loads(line)["hash"] for line in result.stdout.splitlines()]
    assert len(hashes) == SEEDED and sorted(hashes) == expected  # each exactly once
    pages = SEEDED // PAGE
    assert f"page {pages}: {PAGE} messages, {SEEDED} in all" in result.stderr
    summary = result.stderr.splitlines()[-1]
    assert summary.startswith(f"{SEEDED} messages in {pages} pages, ") and "retries after a rate limit" in summary


def test_push_from_jsonl_waits_out_the_default_lightpush_limit(default_node, tmp_path):
    messages = fresh_messages(20, "/client-errors/1/backoff/proto")
    result = wakustore(
        "push",
        "--peer",
        default_node.tcp_addr,
        "--rate",
        "0",  # not paced: the node's limit refuses some, the client waits them out
        "--from-jsonl",
        str(write_jsonl(tmp_path / "m.jsonl", messages)),
    )
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert [line["status_code"] for line in lines] == [200] * 20
    # Faster than 5 a second after the first 5: some were refused and retried.
    assert "pushed 20 messages, 0 refused, " in result.stderr and "retries after a rate limit" in result.stderr
    expected = sorted(message_hash(PUBSUB_TOPIC, m).hex() for m in messages)
    assert [line["hash"] for line in lines] == [message_hash(PUBSUB_TOPIC, m).hex() for m in messages]
    assert stored_hashes(default_node, "/client-errors/1/backoff/proto") == expected


def test_push_rate_stays_under_the_default_lightpush_limit(default_node, tmp_path):
    messages = fresh_messages(20, "/client-errors/1/paced/proto")
    started = time.monotonic()
    result = wakustore(
        "push",
        "--peer",
        default_node.tcp_addr,
        "--rate",
        "5",
        "--from-jsonl",
        str(write_jsonl(tmp_path / "m.jsonl", messages)),
    )
    elapsed = time.monotonic() - started
    assert result.returncode == 0, result.stderr
    assert [json.loads(line)["status_code"] for line in result.stdout.splitlines()] == [200] * 20
    assert result.stderr.strip().splitlines()[-1] == "pushed 20 messages, 0 refused"  # never refused
    assert elapsed >= 19 / 5  # paced: 20 messages, 0.2 s apart
    assert stored_hashes(default_node, "/client-errors/1/paced/proto") == sorted(
        message_hash(PUBSUB_TOPIC, m).hex() for m in messages
    )


@pytest.mark.parametrize("rate", ["-1", "nan", "inf", "x"])
def test_push_rate_must_be_a_number_not_negative(rate):
    result = wakustore(
        "push",
        "--peer",
        "/ip4/127.0.0.1/tcp/1/p2p/" + other_peer_id(),
        "--rate",
        rate,
        "--pubsub-topic",
        PUBSUB_TOPIC,
        "--content-topic",
        CONTENT_TOPIC,
        "--payload",
        "00",
    )
    assert result.returncode == 2
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and "--rate" in lines[0], lines


# --- failures are one line -------------------------------------------------------------


PUSH_ARGS = ("--pubsub-topic", PUBSUB_TOPIC, "--content-topic", CONTENT_TOPIC, "--payload", "00")


@pytest.mark.parametrize("command", [("query", "--pubsub-topic", PUBSUB_TOPIC), ("push", *PUSH_ARGS)])
def test_nothing_listening_is_one_line(command):
    addr = f"/ip4/127.0.0.1/tcp/{free_port()}/p2p/{other_peer_id()}"
    result = wakustore(command[0], "--peer", addr, *command[1:])
    assert_one_line_failure(result, "cannot connect to", "Connection refused")


@pytest.mark.parametrize(
    ("command", "transport"),
    [
        (("query", "--pubsub-topic", PUBSUB_TOPIC), "tcp"),
        (("push", *PUSH_ARGS), "tcp"),
        (("query", "--pubsub-topic", PUBSUB_TOPIC), "ws"),
    ],
)
def test_wrong_peer_id_is_one_line(default_node, command, transport):
    addr = default_node.ws_addr if transport == "ws" else default_node.tcp_addr
    result = wakustore(command[0], "--peer", with_wrong_peer_id(addr), *command[1:])
    assert_one_line_failure(result, "cannot connect to", "peer id does not correspond", default_node.peer_id)


def test_push_to_a_node_stopped_mid_push_is_one_line(engine, tmp_path):
    node = NodeThread(node_config(tmp_path / "node"), engine).start()
    try:
        jsonl = write_jsonl(tmp_path / "m.jsonl", fresh_messages(200, "/client-errors/1/stopped/proto"))
        result = push_until(node.tcp_addr, jsonl, after_lines=3, stop=node.stop)
    finally:
        node.stop()
    assert_one_line_failure(result, "of 200 messages pushed")
    assert json.loads(result.stdout.splitlines()[0])["status_code"] == 200


def push_until(peer: str, jsonl: Path, *, after_lines: int, stop) -> subprocess.CompletedProcess:
    """Run ``push --from-jsonl`` (paced, so it is still pushing) and call
    ``stop`` once it printed ``after_lines`` status lines."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "wakustore", "push", "--peer", peer, "--rate", "10", "--from-jsonl", str(jsonl)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    lines: list[str] = []
    enough = threading.Event()

    def pump() -> None:
        for line in proc.stdout:
            lines.append(line)
            if len(lines) >= after_lines:
                enough.set()
        enough.set()

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        assert enough.wait(CLI_TIMEOUT_S) and len(lines) >= after_lines, lines
        stop()
        stderr = proc.stderr.read()
        proc.wait(CLI_TIMEOUT_S)
        reader.join(CLI_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, "".join(lines), stderr)


# --- the mailserver client ---------------------------------------------------------------


ENODE_KEY = (
    "c3f6605a697c3c9104bedeb8de92514f4639fa023297bf9592e0e4adc3c7f2c4"
    "c3fcef0a10c5e2b453af73adb6eee28ab65d138f9bc6905a3a5ff992df6c8c86"
)


def listener(behaviour: str):
    """A loopback TCP listener that closes each connection at once
    ("close") or holds it without a word ("silent"); returns (port, stop)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    held: list[socket.socket] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            if behaviour == "close":
                conn.close()
            else:
                held.append(conn)

    threading.Thread(target=serve, daemon=True).start()

    def stop() -> None:
        server.close()
        for conn in held:
            conn.close()

    return server.getsockname()[1], stop


@pytest.mark.parametrize("verb", [("request",), ("post", "--topic", "01020304", "--payload", "00")])
def test_mailserver_unreachable_enode_is_one_line(verb):
    port = free_port()
    result = wakustore("mailserver", verb[0], "--enode", f"enode://{ENODE_KEY}@127.0.0.1:{port}", *verb[1:])
    assert_one_line_failure(result, f"cannot connect to 127.0.0.1:{port}", "Connection refused")


@pytest.mark.parametrize(
    ("behaviour", "expected"), [("close", "connection closed during the handshake"), ("silent", "timed out")]
)
def test_mailserver_refused_or_silent_handshake_is_one_line(behaviour, expected):
    port, stop = listener(behaviour)
    try:
        result = wakustore(
            "mailserver", "request", "--enode", f"enode://{ENODE_KEY}@127.0.0.1:{port}", "--timeout", "1"
        )
    finally:
        stop()
    assert_one_line_failure(result, f"handshake with 127.0.0.1:{port} failed", expected)


# --- a real node process, killed ----------------------------------------------------------


@pytest.mark.slow
def test_a_served_node_killed_mid_push_and_a_wrong_enode_are_one_line(tmp_path):
    """``wakustore serve`` as users run it: a mailserver dialled with the
    wrong node id refuses the handshake; SIGKILL during a push."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "wakustore",
            "serve",
            "--data-dir",
            str(tmp_path / "data"),
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
            "42",
            "--shard",
            "0",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**_env(), "WAKUSTORE_LOG_LEVEL": "WARNING"},
    )
    try:
        printed = []
        for line in proc.stdout:
            if line.startswith("wakustore node ready"):
                break
            printed.append(line.strip())
        peer = next(line for line in printed if line.startswith("/ip4/") and "/ws/" not in line)
        enode = next(line for line in printed if line.startswith("enode://"))

        wrong = f"enode://{ENODE_KEY}@{enode.rsplit('@', 1)[1]}"
        result = wakustore("mailserver", "request", "--enode", wrong)
        assert_one_line_failure(result, "handshake with", "failed")

        jsonl = write_jsonl(tmp_path / "m.jsonl", fresh_messages(200, "/client-errors/1/killed/proto"))
        result = push_until(peer, jsonl, after_lines=3, stop=lambda: proc.send_signal(signal.SIGKILL))
        assert_one_line_failure(result, "of 200 messages pushed")
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
