"""RLPx against an independent implementation: @ethereumjs/devp2p over TCP.

The sans-IO Handshake and Connection are driven by a small blocking-socket
loop kept in this file. The JS peer (tests/interop_devp2p/rlpx_peer.mjs)
dials us in one test and listens for us in the other; both sides exchange
Hellos, a waku/1 capability message each way and a Ping/Pong, and the JS
side disconnects with reason 0x08. npm dependencies are installed here when
missing; a failed install fails the test.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest
import rlp

from wakustore.protocols import ecies, rlpx

pytestmark = pytest.mark.slow

INTEROP_DIR = Path(__file__).resolve().parents[1] / "interop_devp2p"
SCRIPT = INTEROP_DIR / "rlpx_peer.mjs"
NPM_TIMEOUT_S = 300
SESSION_TIMEOUT_S = 30
RECV_SIZE = 64 * 1024

PY_MESSAGE = rlp.encode([b"py-message"])
JS_STATUS = rlp.encode([b"js-status"])


@pytest.fixture(scope="module")
def node_binary() -> str:
    """Node.js with the npm dependencies installed (npm ci when missing)."""
    if not (INTEROP_DIR / "node_modules" / "@ethereumjs" / "devp2p").is_dir():
        npm = shutil.which("npm")
        if npm is None:
            pytest.fail("npm is needed to install tests/interop_devp2p")
        result = subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund"],
            cwd=INTEROP_DIR,
            capture_output=True,
            text=True,
            timeout=NPM_TIMEOUT_S,
        )
        if result.returncode != 0:
            pytest.fail(f"npm ci failed in {INTEROP_DIR}:\n{result.stdout}\n{result.stderr}")
    node = shutil.which("node")
    if node is None:
        pytest.fail("node is needed for the devp2p interop test")
    return node


def _local_hello(private_key: bytes) -> rlpx.Hello:
    return rlpx.Hello(
        protocol_version=rlpx.BASE_PROTOCOL_VERSION,
        client_id="wakustore/rlpx-interop",
        capabilities=(rlpx.Capability(rlpx.WAKU_CAPABILITY_NAME, rlpx.WAKU_V1_VERSION),),
        listen_port=30303,
        node_id=ecies.public_key_of(private_key),
    )


def _run_session(sock: socket.socket, handshake: rlpx.Handshake, private_key: bytes) -> dict:
    """Drive one connection until the peer disconnects; returns what happened."""
    deadline = time.monotonic() + SESSION_TIMEOUT_S
    sock.settimeout(1.0)

    def recv() -> bytes:
        while time.monotonic() < deadline:
            try:
                data = sock.recv(RECV_SIZE)
            except TimeoutError:
                continue
            if not data:
                raise EOFError("peer closed the connection")
            return data
        raise TimeoutError("session deadline passed")

    if handshake.initiator:
        sock.sendall(handshake.initiate())
    while not handshake.complete:
        reply = handshake.receive_data(recv())
        if reply:
            sock.sendall(reply)

    connection, events = rlpx.Connection.from_handshake(handshake, _local_hello(private_key))
    sock.sendall(connection.send_hello())
    seen = {
        "hello": None,
        "messages": [],
        "pings": 0,
        "pongs": 0,
        "disconnect": None,
        "snappy": None,
        "legacy": handshake.legacy,
    }
    pinged = False
    while seen["disconnect"] is None:
        for event in events:
            if isinstance(event, rlpx.Hello):
                seen["hello"] = event
                seen["snappy"] = connection.snappy
            elif isinstance(event, rlpx.Ping):
                seen["pings"] += 1
                sock.sendall(connection.send_pong())
            elif isinstance(event, rlpx.Pong):
                seen["pongs"] += 1
            elif isinstance(event, rlpx.Message):
                seen["messages"].append(event)
            elif isinstance(event, rlpx.Disconnect):
                seen["disconnect"] = event
        if seen["disconnect"] is not None:
            break
        if seen["hello"] is not None and not pinged:
            pinged = True
            sock.sendall(connection.send_ping())
            sock.sendall(connection.send_message(rlpx.to_wire_code(1), PY_MESSAGE))
        events = connection.receive_data(recv())
    return seen


def _read_json_lines(stdout: str) -> list[dict]:
    return [json.loads(line) for line in stdout.splitlines() if line.strip().startswith("{")]


def _check(seen: dict, js_events: list[dict], our_key: bytes, js_id: bytes) -> None:
    hello = seen["hello"]
    assert hello is not None, "no Hello from the JS peer"
    assert hello.node_id == js_id
    assert hello.protocol_version == 5
    assert hello.client_id == "ethereumjs-devp2p-interop"
    assert rlpx.Capability("waku", 1) in hello.capabilities
    assert seen["snappy"] is True
    assert seen["pings"] == 1 and seen["pongs"] == 1
    assert [(m.code, m.payload) for m in seen["messages"]] == [(0x10, JS_STATUS)]
    assert seen["disconnect"].reason == rlpx.DISCONNECT_QUITTING

    kinds = [e["event"] for e in js_events]
    assert "error" not in kinds, js_events
    js_hello = next(e["hello"] for e in js_events if e["event"] == "hello")
    assert js_hello["protocolVersion"] == 5
    assert js_hello["clientId"] == "wakustore/rlpx-interop"
    assert js_hello["capabilities"] == [{"name": "waku", "version": 1}]
    assert js_hello["port"] == 30303
    assert bytes.fromhex(js_hello["id"]) == ecies.public_key_of(our_key)
    messages = [e for e in js_events if e["event"] == "message"]
    assert [(m["code"], bytes.fromhex(m["payload"])) for m in messages] == [(1, PY_MESSAGE)]
    assert "pong" in kinds and kinds[-1] == "done"


def test_ethereumjs_dials_our_recipient(node_binary):
    key = os.urandom(32)
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        enode = f"enode://{ecies.public_key_of(key).hex()}@127.0.0.1:{port}"
        proc = subprocess.Popen(
            [node_binary, str(SCRIPT), "dial", enode],
            cwd=INTEROP_DIR,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            server.settimeout(SESSION_TIMEOUT_S)
            conn, _ = server.accept()
            with conn:
                seen = _run_session(conn, rlpx.Handshake(key), key)
            stdout, stderr = proc.communicate(timeout=SESSION_TIMEOUT_S)
        finally:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, stdout + stderr
    js_events = _read_json_lines(stdout)
    assert seen["legacy"] is False
    _check(seen, js_events, key, seen["hello"].node_id)


def test_our_initiator_dials_ethereumjs(node_binary):
    key = os.urandom(32)
    proc = subprocess.Popen(
        [node_binary, str(SCRIPT), "listen"],
        cwd=INTEROP_DIR,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        ready, _, _ = select.select([proc.stdout], [], [], SESSION_TIMEOUT_S)
        assert ready, "the JS peer did not start listening"
        listening = json.loads(proc.stdout.readline())
        assert listening["event"] == "listening", listening
        js_id = bytes.fromhex(listening["id"])
        with socket.create_connection(("127.0.0.1", listening["port"]), timeout=5) as sock:
            seen = _run_session(sock, rlpx.Handshake(key, remote_public_key=js_id), key)
        stdout, stderr = proc.communicate(timeout=SESSION_TIMEOUT_S)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 0, stdout + stderr
    _check(seen, [listening] + _read_json_lines(stdout), key, js_id)
