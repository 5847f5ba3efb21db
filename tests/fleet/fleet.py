"""The parts of a fleet the tests start on loopback: a Sail server in
cluster mode, a Spark standalone cluster (a master, two workers) with one
Spark Connect server on it, an S3-compatible object store (moto's standalone server)
behind a gate that can cut it off, and ``wakustore serve`` nodes in child
processes. Every port is chosen by the kernel.

Nothing here is a stand-in for the node's own parts: the nodes are the
real command, the engines are Sail and Apache Spark, the storage speaks the S3 protocol over
HTTP. The gate only forwards bytes, or resets connections while it is cut,
as a failed load balancer or a partition would.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

import trio

from wakustore.bench.common import wait_for_node_info
from wakustore.protocols.message import WakuMessage, message_hash, muid
from wakustore.protocols.store_query import HistoryQuery
from wakustore.protocols.store_v3 import StatusCode

CLUSTER_ID = 42
SHARD = 7
PUBSUB_TOPIC = f"/waku/2/rs/{CLUSTER_ID}/{SHARD}"

# A node starts in 2-5 s here (imports, engine, table); a loaded 2-core CI
# runner has been seen to need ten times that.
START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 60.0
# Longest a fault's aftermath may take to settle: the engine restarts
# (up to 35 s for Sail, Engine.wait_timeout_s) and the flush retries.
RECOVERY_TIMEOUT_S = 90.0
CLIENT_TIMEOUT_S = 30.0

# Credentials moto accepts (any); the region only has to be set, so that
# neither Sail nor delta-rs asks the endpoint where the bucket lives.
S3_ACCESS_KEY = "fleet-test"
S3_SECRET_KEY = "fleet-test-secret"
S3_REGION = "us-east-1"

_MOTO_LISTENING = re.compile(r"Running on http://127\.0\.0\.1:(\d+)")


_SAIL_LISTENING = re.compile(r"^SAIL_LISTENING \S+ (\d+)")


def _listening_port(process: subprocess.Popen, log_path: Path, ready: re.Pattern, what: str, stop) -> int:
    """The port a server child names on its output (first group of
    ``ready``); its output goes on to ``log_path``. ``stop()`` and
    RuntimeError when it does not say so within START_TIMEOUT_S."""
    found, matches = threading.Event(), []
    threading.Thread(target=_pump, args=(process.stdout, log_path, found, ready, matches), daemon=True).start()
    if not found.wait(START_TIMEOUT_S) or not matches:
        stop()
        raise RuntimeError(f"{what} did not start; see {log_path}")
    return int(matches[0].group(1))


def _pump(
    stream,
    log_path: Path,
    found: threading.Event | None = None,
    pattern: re.Pattern | None = None,
    into: list | None = None,
) -> None:
    """Copy a child's output to its log file; report the first line that
    matches ``pattern``."""
    with open(log_path, "a", encoding="utf-8", errors="replace") as log:
        for line in iter(stream.readline, ""):
            log.write(line)
            log.flush()
            if found is not None and not found.is_set() and pattern is not None:
                match = pattern.search(line)
                if match and into is not None:
                    into.append(match)
                    found.set()
    if found is not None:
        found.set()


# --- object storage ------------------------------------------------------------


class MotoServer:
    """moto's standalone S3 server on a kernel-chosen loopback port. Its
    state lives in its process: it is never stopped during a test (an
    outage is the gate's job), so the bucket survives every fault."""

    def __init__(self, log_path: Path):
        self.log_path = log_path
        self.process: subprocess.Popen | None = None
        self.port = 0

    def start(self) -> MotoServer:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", "0"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.port = _listening_port(self.process, self.log_path, _MOTO_LISTENING, "moto", self.stop)
        return self

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def create_bucket(self, name: str) -> None:
        import boto3

        client = boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name=S3_REGION,
            aws_access_key_id=S3_ACCESS_KEY,
            aws_secret_access_key=S3_SECRET_KEY,
        )
        client.create_bucket(Bucket=name)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


class Gate:
    """A TCP forwarder in front of the object store. :meth:`cut` resets
    every open connection and every new one (the storage is unreachable)
    until :meth:`restore`. The listening port stays the gate's throughout,
    so no other process can take it meanwhile."""

    def __init__(self, upstream_port: int):
        self.upstream_port = upstream_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._cut = False
        self._closed = False
        # Connections reset while cut: the proof that clients tried.
        self.refused = 0
        # (path, lower-cased request head) of every PUT of a Delta log
        # entry that went through: how commits are written.
        self.log_puts: list[tuple[str, str]] = []
        threading.Thread(target=self._accept_loop, name="gate-accept", daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def cut(self) -> None:
        with self._lock:
            self._cut = True
            victims, self._open = list(self._open), set()
        for sock in victims:
            _reset(sock)

    def restore(self) -> None:
        with self._lock:
            self._cut = False

    def close(self) -> None:
        self._closed = True
        self.cut()
        with contextlib.suppress(OSError):
            self._listener.close()

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                cut = self._cut
            if cut:
                self.refused += 1
                _reset(client)
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", self.upstream_port), timeout=10)
            except OSError:
                _reset(client)
                continue
            upstream.settimeout(None)
            with self._lock:
                if self._cut:
                    _reset(client)
                    _reset(upstream)
                    continue
                self._open |= {client, upstream}
            threading.Thread(target=self._forward, args=(client, upstream), name="gate-pipe", daemon=True).start()

    def _forward(self, a: socket.socket, b: socket.socket) -> None:
        peers = {a: b, b: a}
        seen = b""  # the client's recent bytes, where request heads are looked for
        try:
            while True:
                readable, _, _ = select.select([a, b], [], [], 1.0)
                for sock in readable:
                    data = sock.recv(65536)
                    if not data:
                        return
                    if sock is a:
                        seen = self._note_log_puts(seen + data)
                    peers[sock].sendall(data)
        except (OSError, ValueError):
            return
        finally:
            with self._lock:
                self._open -= {a, b}
            for sock in (a, b):
                with contextlib.suppress(OSError):
                    sock.close()

    def _note_log_puts(self, seen: bytes) -> bytes:
        """Record the heads of Delta log entry PUTs in ``seen``; return
        what may still hold the start of one."""
        end = 0
        for match in _LOG_PUT.finditer(seen):
            self.log_puts.append((match.group(1).decode(), match.group(2).decode(errors="replace").lower()))
            end = match.end()
        seen = seen[end:]
        return seen[-_HEAD_MAX:]


# A PUT of the next Delta log entry, `_delta_log/<20 digits>.json`, and its headers.
_LOG_PUT = re.compile(rb"PUT (\S*_delta_log/\d{20}\.json) HTTP/1\.1\r\n(.*?)\r\n\r\n", re.DOTALL)
_HEAD_MAX = 16384


def _reset(sock: socket.socket) -> None:
    """Close with RST (SO_LINGER 0), as an unreachable service looks."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.close()


def s3_environment(endpoint: str) -> dict[str, str]:
    """What an operator sets for an S3-compatible store over plain http."""
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": S3_ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": S3_SECRET_KEY,
        "AWS_REGION": S3_REGION,
        "AWS_ALLOW_HTTP": "true",
    }


# --- the engine in cluster mode ------------------------------------------------


class SailCluster:
    """A Sail Spark Connect server in local-cluster mode (``SAIL_MODE=
    local-cluster``: a driver and workers talking over RPC, in one process),
    as a fleet's nodes reach a shared engine. It first listens on a port the
    kernel chooses and is restarted on that same port, where the nodes
    expect it."""

    def __init__(self, log_path: Path, extra_env: dict[str, str] | None = None):
        self.log_path = log_path
        self.extra_env = dict(extra_env or {})
        self.process: subprocess.Popen | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"sc://127.0.0.1:{self.port}"

    def start(self) -> SailCluster:
        env = {**os.environ, **self.extra_env, "SAIL_MODE": "local-cluster", "RUST_LOG": "warn"}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "wakustore.storage.sail_server", "--host", "127.0.0.1", "--port", str(self.port)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            start_new_session=True,
        )
        self.port = _listening_port(self.process, self.log_path, _SAIL_LISTENING, "the Sail cluster", self.kill)
        return self

    def kill(self) -> None:
        _kill_group(self.process)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.kill()


class SparkCluster:
    """A Spark standalone cluster from the pinned pyspark's own jars and
    scripts (``spark-class``: a master and ``workers`` workers of one core
    each), and the fleet's one Spark Connect server on it (``python -m
    wakustore.storage.spark_server --master ... --s3``), able to reach the
    bucket. The server first listens on a port the kernel chooses and is
    restarted on that same port, where the nodes expect it."""

    _MASTER = re.compile(r"Starting Spark master at spark://127\.0\.0\.1:(\d+)")
    _REGISTERED = re.compile(r"Successfully registered with master spark://127\.0\.0\.1:(\d+)")
    _LISTENING = re.compile(r"^SPARK_LISTENING \S+ (\d+)")

    def __init__(self, work_dir: Path, extra_env: dict[str, str] | None = None, workers: int = 2):
        from wakustore.storage.spark_server import spark_home

        self.work_dir = work_dir
        work_dir.mkdir(parents=True, exist_ok=True)
        self.home = spark_home()
        self.extra_env = dict(extra_env or {})
        self.master: subprocess.Popen | None = None
        self.master_url = ""
        self.workers: list[subprocess.Popen | None] = [None] * workers
        self.process: subprocess.Popen | None = None  # the Spark Connect server
        self.port = 0

    @property
    def url(self) -> str:
        return f"sc://127.0.0.1:{self.port}"

    def _env(self) -> dict[str, str]:
        return {
            **os.environ,
            **self.extra_env,
            "SPARK_HOME": str(self.home),
            "SPARK_LOCAL_IP": "127.0.0.1",
            # No REST submission server (it binds a fixed port, 6066).
            "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
        }

    def _spawn(self, command: list[str], log_name: str, ready: re.Pattern, what: str) -> tuple[subprocess.Popen, int]:
        process = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=self._env(),
            start_new_session=True,
        )
        port = _listening_port(process, self.work_dir / log_name, ready, what, lambda: _kill_group(process))
        return process, port

    def start(self) -> SparkCluster:
        spark_class = str(self.home / "bin" / "spark-class")
        self.master, port = self._spawn(
            [
                spark_class,
                "org.apache.spark.deploy.master.Master",
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--webui-port",
                "0",
            ],
            "master.log",
            self._MASTER,
            "the Spark master",
        )
        self.master_url = f"spark://127.0.0.1:{port}"
        for index in range(len(self.workers)):
            self.start_worker(index)
        return self.start_connect()

    def start_worker(self, index: int) -> None:
        work = self.work_dir / f"worker-{index}"
        work.mkdir(exist_ok=True)
        command = [
            str(self.home / "bin" / "spark-class"),
            "org.apache.spark.deploy.worker.Worker",
            *("--host", "127.0.0.1", "--port", "0", "--webui-port", "0"),
            *("--cores", "1", "--memory", "1g", "--work-dir", str(work)),
            self.master_url,
        ]
        self.workers[index], _ = self._spawn(command, f"worker-{index}.log", self._REGISTERED, f"Spark worker {index}")

    def start_connect(self) -> SparkCluster:
        command = [
            sys.executable,
            "-m",
            "wakustore.storage.spark_server",
            *("--host", "127.0.0.1", "--port", str(self.port), "--master", self.master_url, "--s3"),
            *("--conf", "spark.executor.memory=768m", "--conf", "spark.cores.max=2"),
        ]
        self.process, self.port = self._spawn(command, "connect.log", self._LISTENING, "the Spark Connect server")
        return self

    def kill_worker(self, index: int) -> None:
        """SIGKILL a worker and the executor it runs (one process group)."""
        _kill_group(self.workers[index])

    def kill(self) -> None:
        """SIGKILL the Spark Connect server (the driver) and its JVM."""
        _kill_group(self.process)

    def stop(self) -> None:
        for process in [self.process, *self.workers, self.master]:
            if process is not None and process.poll() is None:
                process.terminate()
                try:
                    process.wait(STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    _kill_group(process)


def _kill_group(process: subprocess.Popen | None) -> None:
    if process is not None and process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


# --- nodes ---------------------------------------------------------------------


class Node:
    """``wakustore serve`` in a child process with a TOML config."""

    def __init__(
        self,
        work_dir: Path,
        name: str,
        *,
        engine: str,
        table_root: str,
        env: dict[str, str] | None = None,
        flush_interval_s: float = 0.2,
    ):
        self.name = name
        self.data_dir = work_dir / name
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = work_dir / f"{name}.log"
        self.env = dict(env or {})
        self.process: subprocess.Popen | None = None
        self.peer = ""
        self.metrics_port = 0
        self.config_path = work_dir / f"{name}.toml"
        self.config_path.write_text(
            f'data_dir = "{self.data_dir}"\n'
            f'engine = "{engine}"\n'
            f'table_root = "{table_root}"\n'
            "shared_table = true\n"
            'listen_host = "127.0.0.1"\n'
            "tcp_port = 0\nws_port = 0\nmetrics_port = 0\nmailserver_port = 0\n"
            "relay = false\n"
            f"cluster_id = {CLUSTER_ID}\nshards = [{SHARD}]\n"
            # Several commits a second: kills land mid-commit.
            f"flush_interval_s = {flush_interval_s}\n"
            'rate_limits = ["store:0/1s", "lightpush:0/1s"]\n'
            "ip_colocation_limit = 0\n"
        )

    def start(self) -> Node:
        info = self.data_dir / "node-info.json"
        info.unlink(missing_ok=True)
        env = {**os.environ, **self.env, "WAKUSTORE_LOG_LEVEL": "INFO"}
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "wakustore", "serve", "--config", str(self.config_path)],
                stdout=log,
                stderr=log,
                env=env,
                start_new_session=True,
            )
        try:
            data = wait_for_node_info(self.process, self.data_dir, START_TIMEOUT_S, self.name, self.log_path)
        except RuntimeError:
            self.kill()
            raise
        self.peer = next(a for a in data["multiaddrs"] if "/ws" not in a)
        self.metrics_port = data["metrics_port"]
        return self

    def kill(self) -> None:
        """SIGKILL the node and what it started (its embedded engine)."""
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()
        self.process = None

    def stop(self) -> int:
        """SIGTERM; the exit status."""
        if self.process is None:
            return 0
        self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.kill()
            raise RuntimeError(f"{self.name} did not stop within {STOP_TIMEOUT_S:g} s of SIGTERM") from None
        self.process = None
        return code

    def engine_process(self):
        """The embedded Sail server, a child of the node (psutil.Process)."""
        import psutil

        for child in psutil.Process(self.process.pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                if "wakustore.storage.sail_server" in " ".join(child.cmdline()):
                    return child
        return None

    def health(self) -> tuple[int, dict]:
        import urllib.error
        import urllib.request

        url = f"http://127.0.0.1:{self.metrics_port}/health"
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"{}")

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")


# --- messages, pushes and queries ----------------------------------------------


def messages(content_topic: str, count: int, first: int = 0) -> list[WakuMessage]:
    """``count`` distinct messages numbered from ``first``; the same
    numbers give the same messages (the overlap two writers share)."""
    # A second ago, a microsecond apart: well inside the node's drift limit.
    base = time.time_ns() - 1_000_000_000
    return [
        WakuMessage(payload=f"{content_topic} #{i}".encode(), content_topic=content_topic, timestamp=base + i * 1_000)
        for i in range(first, first + count)
    ]


def muids(batch: Iterable[WakuMessage]) -> set[bytes]:
    return {muid(PUBSUB_TOPIC, m) for m in batch}


async def push(
    peer: str, batch: Sequence[WakuMessage], acked: list[WakuMessage] | None = None, streams: int = 4
) -> list[WakuMessage]:
    """Lightpush v3 every message (``streams`` at a time over one
    connection); returns those the node acknowledged, also appended to
    ``acked`` as they are, so a caller that is cancelled keeps them."""
    from wakustore.clients.store import StoreClient
    from wakustore.protocols.lightpush import LightpushStatus

    done: list[WakuMessage] = [] if acked is None else acked
    queue = list(batch)
    async with StoreClient.connect(peer, timeout_s=CLIENT_TIMEOUT_S) as client:

        async def worker() -> None:
            while queue:
                message = queue.pop(0)
                response = await client.push(PUBSUB_TOPIC, message)
                if response.status_code != LightpushStatus.SUCCESS:
                    raise AssertionError(f"push refused: {response}")
                done.append(message)

        async with trio.open_nursery() as nursery:
            for _ in range(streams):
                nursery.start_soon(worker)
    return done


async def stored(peer: str, content_topic: str) -> list[bytes]:
    """Every message hash the node answers for ``content_topic``, page
    after page (one entry per row served: a duplicate shows twice).
    Raises :class:`Unavailable` on a 503."""
    from wakustore.clients.store import StoreClient

    found: list[bytes] = []
    query = HistoryQuery(
        pubsub_topic=PUBSUB_TOPIC, content_topics=(content_topic,), limit=100, include_data=False, forward=True
    )
    async with StoreClient.connect(peer, timeout_s=CLIENT_TIMEOUT_S) as client:
        async for page in client.pages(query):
            if page.status_code == StatusCode.SERVICE_UNAVAILABLE:
                raise Unavailable(page.status_desc)
            if page.status_code != StatusCode.OK:
                raise AssertionError(f"query answered {page.status_code} {page.status_desc}")
            found.extend(m.message_hash for m in page.messages)
    return found


async def query_status(peer: str, content_topic: str) -> tuple[int, float]:
    """The status of one Store v3 page and the seconds it took."""
    from wakustore.clients.store import StoreClient

    query = HistoryQuery(pubsub_topic=PUBSUB_TOPIC, content_topics=(content_topic,), limit=20, include_data=False)
    started = time.monotonic()
    async with StoreClient.connect(peer, timeout_s=CLIENT_TIMEOUT_S) as client:
        response = await client.query(query)
    return response.status_code, time.monotonic() - started


class Unavailable(Exception):
    """The node answered 503."""


async def stored_when_available(peer: str, content_topic: str, timeout_s: float = RECOVERY_TIMEOUT_S) -> list[bytes]:
    """:func:`stored`, asked again while the node answers 503."""
    deadline = trio.current_time() + timeout_s
    while True:
        try:
            return await stored(peer, content_topic)
        except Unavailable:
            if trio.current_time() > deadline:
                raise
            await trio.sleep(0.2)


def hashes(batch: Iterable[WakuMessage]) -> set[bytes]:
    return {message_hash(PUBSUB_TOPIC, m) for m in batch}


def run(function, *args):
    """``function(*args)`` in a fresh trio loop, its one error unwrapped
    from the client host's exception groups."""
    try:
        return trio.run(function, *args)
    except BaseExceptionGroup as group:
        while isinstance(group, BaseExceptionGroup) and len(group.exceptions) == 1:
            group = group.exceptions[0]
        raise group from None


def check_served(
    answer: list[bytes],
    sent: Iterable[WakuMessage],
    *,
    at_least: Iterable[WakuMessage] = (),
    exactly: Iterable[WakuMessage] | None = None,
) -> set[bytes]:
    """One node's answer (message hashes in page order): no hash twice, no
    two rows for one MUID, nothing that was not sent, every message of
    ``at_least`` (acknowledged) there, and, with ``exactly``, the MUIDs of
    those messages and no other. Returns the MUIDs served."""
    by_hash = {message_hash(PUBSUB_TOPIC, m): m for m in sent}
    assert len(answer) == len(set(answer)), f"{len(answer) - len(set(answer))} hashes served twice"
    unknown = set(answer) - by_hash.keys()
    assert not unknown, f"{len(unknown)} hashes served that nobody sent"
    served = [muid(PUBSUB_TOPIC, by_hash[h]) for h in answer]
    assert len(served) == len(set(served)), f"{len(served) - len(set(served))} MUIDs served twice"
    missing = muids(at_least) - set(served)
    assert not missing, f"{len(missing)} acknowledged messages lost"
    if exactly is not None:
        assert set(served) == muids(exactly)
    return set(served)


def pending_at_start(node: Node) -> int:
    """What the node's last start found in its write-ahead log."""
    found = re.findall(r"(\d+) messages pending from the log", node.log_text())
    assert found, f"{node.name} logged no start line"
    return int(found[-1])


def settled(*nodes: Node, timeout_s: float = RECOVERY_TIMEOUT_S) -> None:
    """Wait until each node has committed what it acknowledged: the other
    nodes of the fleet read it from the table only, and see a commit at
    their first page once it is ``CHECK_INTERVAL_S`` old (a node that
    looked at the log just before another's last commit serves the version
    it holds until then)."""
    from wakustore.storage.reader import CHECK_INTERVAL_S

    for node in nodes:
        wait_for(
            lambda node=node: node.health()[1].get("pending_messages") == 0, f"{node.name} to commit its log", timeout_s
        )
    time.sleep(CHECK_INTERVAL_S + 0.1)


def wait_for(condition, what: str, timeout_s: float = RECOVERY_TIMEOUT_S, interval_s: float = 0.1):
    """Poll ``condition()`` until it returns a true value (returned)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(interval_s)


# --- scenarios both engines go through -----------------------------------------


@contextlib.contextmanager
def running_pair(fleet_dir: Path, prefix: str, *, engine: str, table_root: str, env: dict):
    """Two nodes on one table, started; SIGKILLed at the end."""
    nodes = [Node(fleet_dir, f"{prefix}-{name}", engine=engine, table_root=table_root, env=env) for name in ("a", "b")]
    try:
        for node in nodes:
            node.start()
        yield nodes
    finally:
        for node in nodes:
            node.kill()


def start_the_dead(nodes: Sequence[Node]) -> None:
    """Start again the nodes a failed test left dead."""
    for node in nodes:
        if node.process is None or node.process.poll() is not None:
            node.start()


def two_writers(a: Node, b: Node, topic: str, gate: Gate | None) -> None:
    """Both nodes take overlapping messages at the same time: 100 exact
    copies of the other's, and 50 same-MUID copies with another timestamp
    (another hash). Each node then answers the same messages, one row per
    MUID, and (with a ``gate``) every commit created its log entry on the
    gate's storage only if absent (a racing writer gets 412 and retries,
    never overwrites)."""
    commits_before = len(gate.log_puts) if gate is not None else 0
    first = messages(topic, 200)  # 0..199 to a
    shifted = [dataclasses.replace(m, timestamp=m.timestamp + 1_000_000) for m in first[100:150]]
    second = shifted + messages(topic, 150, first=150)  # 100..149 re-timed, 150..299 to b
    sent = first + second

    async def both() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(push, a.peer, first)
            nursery.start_soon(push, b.peer, second)

    run(both)
    settled(a, b)
    answers = [run(stored_when_available, node.peer, topic) for node in (a, b)]
    for answer in answers:
        check_served(answer, sent, exactly=sent)
    assert set(answers[0]) == set(answers[1]), "the two nodes answer different copies"
    if gate is None:
        return
    commits = gate.log_puts[commits_before:]
    assert commits and all("if-none-match: *" in head for _, head in commits), commits[:3]


async def push_while(
    peer: str, batch: Sequence[WakuMessage], acked: list[WakuMessage], fault_sent: threading.Event
) -> None:
    """:func:`push`; a failure after the fault (the node was killed) ends
    the pushes quietly, any other is raised."""
    try:
        await push(peer, batch, acked)
    except Exception:
        if not fault_sent.is_set():
            raise


KILL_ATTEMPTS = 3


def node_killed_mid_commit(victim: Node, other: Node, topic: str) -> None:
    """SIGKILL a node while pushes stream in and it commits several times
    a second; after its restart every acknowledged message is served once
    by both nodes, and the client's retries of the rest land once too."""
    sent: list[WakuMessage] = []
    acked: list[WakuMessage] = []
    # A kill right after a commit leaves nothing in the log (the commits
    # kept up): the scenario is then run again with new messages, so that
    # what is checked is a kill that left acknowledged messages uncommitted.
    for attempt in range(KILL_ATTEMPTS):
        batch = messages(topic, 400, first=400 * attempt)
        sent += batch
        acked_now: list[WakuMessage] = []
        killed = threading.Event()

        async def scenario() -> None:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(push_while, victim.peer, batch, acked_now, killed)  # noqa: B023  (run at once)
                while len(acked_now) < 150:  # noqa: B023
                    await trio.sleep(0.005)
                killed.set()  # noqa: B023
                await trio.to_thread.run_sync(victim.kill)

        run(scenario)
        assert len(acked_now) < len(batch), "the pushes ended before the kill"
        acked += acked_now
        victim.start()
        if pending_at_start(victim) > 0:
            break
    # The kill left acknowledged messages the table did not hold yet.
    assert pending_at_start(victim) > 0, f"no kill of {KILL_ATTEMPTS} left messages in the log"
    settled(victim)
    for node in (victim, other):
        check_served(run(stored_when_available, node.peer, topic), sent, at_least=acked)
    # The client sends again what was not acknowledged (some of it may
    # have landed before the kill): each message is still stored once.
    run(push, victim.peer, [m for m in sent if m not in acked])
    settled(victim)
    answers = [run(stored_when_available, node.peer, topic) for node in (victim, other)]
    for answer in answers:
        check_served(answer, sent, exactly=sent)
