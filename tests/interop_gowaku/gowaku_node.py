"""A go-waku node (``cmd/waku``) as a child process on loopback, driven
through its REST API.

Ports come from the kernel: the libp2p and REST ports are taken by binding
port 0 and handed to the node (it prints no port it chose itself); a start
that loses the race to another process is retried with fresh ports. The
node announces its loopback address (``--ext-multiaddr``), which also keeps
go-libp2p from looking for a NAT gateway, and runs no circuit relay
service. :meth:`GoWaku.stop` sends SIGTERM, then SIGKILL, and reaps it.

Its REST API as go-waku serves it (cmd/waku/server/rest/), which differs
from nwaku's in places: Store v3 takes ``hashes`` and ``cursor`` as
URL-safe base64 (nwaku: 0x hex) and answers a protobuf-shaped JSON
(``status_code``, ``messages[].message_hash`` base64); a Store error comes
back as HTTP 500 ``{"error_message": "<code> - <desc>"}``; lightpush is
``POST /lightpush/v1/message`` (go-waku's client speaks lightpush
2.0.0-beta1) and answers 200 ``true`` or 503 with the text of the error.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
HTTP_TIMEOUT_S = 30.0
START_ATTEMPTS = 3


class GoWakuError(RuntimeError):
    """The node did not start, or died; carries the tail of its log."""


@dataclass
class Response:
    status: int
    body: bytes

    def json(self):
        return json.loads(self.body)

    @property
    def text(self) -> str:
        return self.body.decode(errors="replace")


@dataclass
class GoWaku:
    """One go-waku node. ``flags`` go to the command line after ours."""

    binary: Path
    workdir: Path
    cluster_id: int
    pubsub_topics: list[str] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)
    # Runs discv5 (``--discv5-discovery``) on a UDP port from the kernel.
    discv5: bool = False
    tcp_port: int = 0
    rest_port: int = 0
    udp_port: int = 0
    peer_id: str = ""
    enr: str = ""
    _process: subprocess.Popen | None = None
    _log_path: Path | None = None

    @property
    def multiaddr(self) -> str:
        return f"/ip4/127.0.0.1/tcp/{self.tcp_port}/p2p/{self.peer_id}"

    def start(self) -> GoWaku:
        self.workdir.mkdir(parents=True, exist_ok=True)
        for attempt in range(START_ATTEMPTS):
            self.tcp_port, self.rest_port = free_port(socket.SOCK_STREAM), free_port(socket.SOCK_STREAM)
            self.udp_port = free_port(socket.SOCK_DGRAM) if self.discv5 else 0
            self._log_path = self.workdir / f"gowaku-{attempt}.log"
            try:
                self._launch()
                return self
            except GoWakuError:
                self.stop()
                if attempt == START_ATTEMPTS - 1 or "address already in use" not in self.log_tail():
                    raise
        raise AssertionError("unreachable")

    def _launch(self) -> None:
        command = [
            str(self.binary),
            "--address=127.0.0.1",
            f"--tcp-port={self.tcp_port}",
            f"--ext-multiaddr=/ip4/127.0.0.1/tcp/{self.tcp_port}",
            f"--nodekey={secrets.token_hex(32)}",
            f"--cluster-id={self.cluster_id}",
            "--circuit-relay=false",
            "--rest",
            "--rest-admin",
            "--rest-address=127.0.0.1",
            f"--rest-port={self.rest_port}",
            "--log-encoding=nocolor",
            "--log-level=DEBUG",
            *(f"--pubsub-topic={t}" for t in self.pubsub_topics),
            *(["--discv5-discovery", f"--discv5-udp-port={self.udp_port}"] if self.discv5 else []),
            *self.flags,
        ]
        log = open(self._log_path, "wb")
        try:
            self._process = subprocess.Popen(
                command,
                cwd=self.workdir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        finally:
            log.close()
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if self._process.poll() is not None:
                raise GoWakuError(f"go-waku exited with {self._process.returncode}:\n{self.log_tail()}")
            try:
                info = self.get("/debug/v1/info", timeout=2.0)
                if info.status == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise GoWakuError(f"go-waku's REST API did not answer in {START_TIMEOUT_S} s:\n{self.log_tail()}")
            time.sleep(0.1)
        body = info.json()
        self.enr = body.get("enrUri", "")
        self.peer_id = next(a.rsplit("/p2p/", 1)[1] for a in body["listenAddresses"] if "/p2p/" in a)

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()

    def log_tail(self, size: int = 6000) -> str:
        if self._log_path is None or not self._log_path.exists():
            return ""
        return self._log_path.read_bytes()[-size:].decode(errors="replace")

    def log_text(self) -> str:
        return self._log_path.read_text(errors="replace") if self._log_path else ""

    # --- REST ---------------------------------------------------------------------

    def get(self, path: str, params: dict | None = None, timeout: float = HTTP_TIMEOUT_S) -> Response:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        return self._request("GET", path + query, None, timeout)

    def post(self, path: str, body, timeout: float = HTTP_TIMEOUT_S) -> Response:
        return self._request("POST", path, json.dumps(body).encode(), timeout)

    def _request(self, method: str, path: str, data: bytes | None, timeout: float) -> Response:
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.rest_port}{path}",
            data=data,
            method=method,
            headers={"Content-Type": "application/json"} if data is not None else {},
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as answer:
                return Response(answer.status, answer.read())
        except urllib.error.HTTPError as error:
            return Response(error.code, error.read())

    def peers(self) -> list[dict]:
        """``GET /admin/v1/peers``: every peer its peer store knows."""
        answer = self.get("/admin/v1/peers")
        assert answer.status == 200, answer
        return answer.json() or []

    def connected_to(self, peer_id: str) -> bool:
        return any(p["id"] == peer_id and p["connected"] for p in self.peers())

    def relay_publish(self, pubsub_topic: str, message: dict) -> Response:
        return self.post(f"/relay/v1/messages/{urllib.parse.quote(pubsub_topic, safe='')}", message)

    def relay_messages(self, pubsub_topic: str) -> list[dict]:
        """What its relay received on the topic since the last call."""
        answer = self.get(f"/relay/v1/messages/{urllib.parse.quote(pubsub_topic, safe='')}")
        assert answer.status == 200, answer
        return answer.json() or []

    def lightpush(self, pubsub_topic: str, message: dict) -> Response:
        return self.post("/lightpush/v1/message", {"pubsubTopic": pubsub_topic, "message": message})

    def store_query(self, peer: str, **params) -> Response:
        """``GET /store/v3/messages`` against ``peer``; ``hashes`` (bytes) and
        ``cursor`` (bytes) are encoded as go-waku reads them."""
        query: dict[str, str] = {"peerAddr": peer}
        for key, value in params.items():
            if value is None:
                continue
            if key == "hashes":
                value = ",".join(b64url(h) for h in value)
            elif key == "cursor":
                value = b64url(value)
            elif key == "contentTopics":
                value = ",".join(value)
            elif isinstance(value, bool):
                value = "true" if value else "false"
            query[key] = str(value)
        return self.get("/store/v3/messages", query)


def wait_for(condition, what: str, gowaku: GoWaku | None = None, timeout_s: float = 20.0):
    """The fleet tests' :func:`~tests.fleet.fleet.wait_for`, failing with
    go-waku's log tail too."""
    from tests.fleet.fleet import wait_for as poll

    try:
        return poll(condition, what, timeout_s)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{gowaku.log_tail() if gowaku else ''}") from None


def rest_message(payload: bytes, content_topic: str, timestamp: int | None, **extra) -> dict:
    """A WakuMessage as go-waku's REST API takes it (payload base64)."""
    message = {"payload": base64.b64encode(payload).decode(), "contentTopic": content_topic, **extra}
    if timestamp is not None:
        message["timestamp"] = timestamp
    return message


def b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode()


def free_port(kind: int) -> int:
    with socket.socket(socket.AF_INET, kind) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
