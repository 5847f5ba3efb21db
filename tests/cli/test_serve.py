"""``wakustore serve`` as a real process, driven by ``wakustore push`` and
``wakustore query`` processes: start, node-info.json, push and query over
TCP, errors on one line, SIGTERM commits to the table and exits 0."""

from __future__ import annotations

import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import deltalake
import pytest

from wakustore.protocols.message import WakuMessage, message_hash

pytestmark = pytest.mark.slow

START_TIMEOUT_S = 90
STOP_TIMEOUT_S = 30
CLI_TIMEOUT_S = 60
CLUSTER_ID = 42
PUBSUB_TOPIC = f"/waku/2/rs/{CLUSTER_ID}/3"
CONTENT_TOPIC = "/serve/1/test/proto"
READY_LINE = "wakustore node ready"


def wakustore(*args, timeout=CLI_TIMEOUT_S, **kwargs):
    return subprocess.run(
        [sys.executable, "-m", "wakustore", *args], capture_output=True, text=True, timeout=timeout, **kwargs
    )


class ServeProcess:
    def __init__(self, data_dir, *extra, log_level="WARNING", stderr=subprocess.PIPE, env=None):
        env = {**os.environ, **(env or {}), "WAKUSTORE_LOG_LEVEL": log_level}
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "wakustore",
                "serve",
                "--data-dir",
                str(data_dir),
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
                *extra,
            ],
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            env=env,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self):
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def rest(self) -> list[str]:
        """The lines printed after the ready line, once stdout has closed."""
        lines = []
        while (line := self.lines.get(timeout=STOP_TIMEOUT_S)) is not None:
            lines.append(line)
        return lines

    def wait_ready(self) -> list[str]:
        deadline = time.monotonic() + START_TIMEOUT_S
        printed = []
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=1)
            except queue.Empty:
                continue
            if line is None:
                break
            if line.startswith(READY_LINE):
                return printed
            printed.append(line)
        self.proc.kill()
        stderr = self.proc.stderr.read()[-3000:] if self.proc.stderr else ""
        raise AssertionError(f"serve did not start: {printed}\n{stderr}")


def _serving(data_dir):
    """A started ServeProcess: (server, data dir, lines printed before ready); killed after."""
    server = ServeProcess(data_dir)
    printed = server.wait_ready()
    yield server, data_dir, printed
    if server.proc.poll() is None:
        server.proc.kill()
        server.proc.wait()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    yield from _serving(tmp_path_factory.mktemp("serve"))


def test_serve_prints_multiaddrs_and_writes_node_info(served):
    _, data_dir, printed = served
    info = json.loads((data_dir / "node-info.json").read_text())
    multiaddrs = [line for line in printed if line.startswith("/")]
    assert multiaddrs == info["multiaddrs"]
    assert len(multiaddrs) == 2 and any("/ws/" in a for a in multiaddrs)
    assert info["enode"] in printed and info["enode"].startswith("enode://")
    # The node's record (31/WAKU2-ENR): printed, in node-info.json, decodable.
    from wakustore.protocols import enr

    assert info["enr"] in printed
    record = enr.decode(info["enr"])
    assert record.peer_id == info["peer_id"] and enr.Capability.STORE in record.capabilities
    decoded = subprocess.run(
        [sys.executable, "-m", "wakustore", "enr", "decode", info["enr"]],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert json.loads(decoded.stdout)["peer_id"] == info["peer_id"]
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{info['metrics_port']}/health", timeout=10) as response:
        assert json.loads(response.read())["ok"] is True
    with urllib.request.urlopen(f"http://127.0.0.1:{info['metrics_port']}/metrics", timeout=10) as response:
        assert b"wakustore_messages_ingested" in response.read()
    printed = multiaddrs
    for addr in printed:
        assert addr.startswith("/ip4/127.0.0.1/tcp/") and addr.endswith("/p2p/" + info["peer_id"])
    assert (data_dir / "node.key").stat().st_mode & 0o777 == 0o600


def _other_address() -> str:
    """An address of this machine that is not 127.0.0.1: a non-loopback
    interface's, else 127.0.0.2 (loopback too, but a listener bound to
    127.0.0.1 refuses it on Linux)."""
    from wakustore.node.host import interface_addresses

    return next((a for a in interface_addresses("ip4") if not a.startswith("127.")), "127.0.0.2")


def _health(host: str, port: int):
    """The /health status from ``host``:``port``, or the OSError of the connection."""
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://{host}:{port}/health", timeout=10) as response:
            return response.status
    except OSError as exc:
        return exc


def test_metrics_and_health_answer_on_loopback_only_by_default(served):
    _, data_dir, _ = served
    port = json.loads((data_dir / "node-info.json").read_text())["metrics_port"]
    assert _health("127.0.0.1", port) == 200
    refused = _health(_other_address(), port)
    assert isinstance(refused, OSError) and "refused" in str(refused).lower(), refused


@pytest.mark.parametrize(
    ("args", "status", "message"),
    [
        (("query", "--peer", "/ip4/127.0.0.1/tcp/1"), 2, "--peer"),
        (("query", "--peer", "{peer}", "--hashes", "abcd"), 2, "--hashes"),
        (
            (
                "push",
                "--peer",
                "{peer}",
                "--pubsub-topic",
                PUBSUB_TOPIC,
                "--content-topic",
                "/a/1/b/proto",
                "--payload",
                "xyz",
            ),
            2,
            "--payload",
        ),
        (("push", "--peer", "{peer}", "--payload", "00"), 2, "--pubsub-topic"),
        (("query", "--peer", "{peer}", "--content-topic", "/a/1/b/proto"), 1, "400 BAD_REQUEST"),
        (
            (
                "push",
                "--peer",
                "{peer}",
                "--pubsub-topic",
                "/waku/2/rs/42/4",
                "--content-topic",
                "/a/1/b/proto",
                "--payload",
                "00",
            ),
            1,
            "421",
        ),
    ],
)
def test_cli_errors_are_one_line(served, args, status, message):
    _, _, printed = served
    args = [a.replace("{peer}", printed[0]) for a in args]
    result = wakustore(*args)
    assert result.returncode == status, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("wakustore: error:") and message in lines[0], lines


@pytest.mark.parametrize(
    "args, env, message",
    [
        (("--listen-host", "192.0.2.1"), {}, "cannot listen: Cannot assign requested address"),
        (("--metrics-host", "999.1.1.1"), {}, "cannot listen:"),
        (("--rest", "--rest-address", "192.0.2.1", "--rest-port", "0"), {}, "cannot listen:"),
        ((), {"WAKUSTORE_LOG_LEVEL": "loud"}, "log_level 'loud': one of debug"),
        ((), {"WAKUSTORE_TCP_PORT": "abc"}, "tcp_port: 'abc' is not an integer"),
        (("--log-level", "chatty"), {}, "log_level 'chatty'"),
        (("--log-format", "xml"), {}, "invalid choice: 'xml'"),
    ],
)
def test_serve_setup_errors_are_one_line_and_exit_2(tmp_path, args, env, message):
    """An address not on the machine, a name that does not resolve, a bad
    log level: one line, exit 2, no traceback."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "wakustore",
            "serve",
            "--data-dir",
            str(tmp_path),
            "--tcp-port",
            "0",
            "--ws-port",
            "0",
            "--metrics-port",
            "0",
            "--mailserver-port",
            "0",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        # The environment overrides flags: none of the node's own here.
        env={**{k: v for k, v in os.environ.items() if not k.startswith("WAKUSTORE_")}, **env},
    )
    assert result.returncode == 2, (result.stdout, result.stderr[-2000:])
    # Besides the node's log (JSON lines), one line and no traceback.
    lines = [line for line in result.stderr.strip().splitlines() if not line.startswith('{"')]
    assert len(lines) == 1 and lines[0].startswith("wakustore: error:") and message in lines[0], lines
    assert "Traceback" not in result.stderr


def test_lowercase_log_level_and_plain_format_are_taken(tmp_path):
    server = ServeProcess(tmp_path / "plain", "--log-format", "text", log_level="debug")
    try:
        server.wait_ready()
    finally:
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(timeout=60) == 0
    logged = server.proc.stderr.read()
    assert " DEBUG " in logged and " INFO    wakustore: node stopped" in logged and '{"' not in logged


@pytest.fixture(scope="module")
def other_node(tmp_path_factory):
    """A second node for the client tests that store messages (the first
    one's table is counted by the SIGTERM test)."""
    yield from _serving(tmp_path_factory.mktemp("serve-clients"))


def test_push_from_jsonl_points_history_to_db_import_and_paces_live_messages(other_node, tmp_path):
    from wakustore.cli.db import message_to_json

    _, _, printed = other_node
    topic = f"/waku/2/rs/{CLUSTER_ID}/3"
    now = time.time_ns()
    history = tmp_path / "history.jsonl"
    history.write_text(
        "".join(
            json.dumps(
                message_to_json(
                    topic, WakuMessage(b"old %d" % i, "/serve/1/jsonl/proto", timestamp=now - 3600 * 10**9 - i)
                )
            )
            + "\n"
            for i in range(20)
        )
    )
    refused = wakustore("push", "--peer", printed[0], "--from-jsonl", str(history))
    assert refused.returncode == 2 and refused.stdout == ""
    assert "20 of 20 messages" in refused.stderr and "wakustore db import" in refused.stderr
    # Live messages: paced at the node's default lightpush limit, none refused, no 429 to wait out.
    live = tmp_path / "live.jsonl"
    live.write_text(
        "".join(
            json.dumps(message_to_json(topic, WakuMessage(b"live %d" % i, "/serve/1/jsonl/proto", timestamp=now + i)))
            + "\n"
            for i in range(8)
        )
    )
    pushed = wakustore("push", "--peer", printed[0], "--from-jsonl", str(live))
    assert pushed.returncode == 0, pushed.stderr
    assert pushed.stderr.strip().splitlines()[-1] == "pushed 8 messages, 0 refused"


def test_clients_dial_dns_names(other_node):
    """/dns4 and /dns names (what --ext-multiaddr advertises) are resolved
    before dialing; a name that does not resolve is one line."""
    _, _, printed = other_node
    tcp = next(line for line in printed if line.startswith("/ip4/127.0.0.1/tcp/") and "/ws/" not in line)
    for name in ("/dns4/localhost", "/dns/localhost"):
        result = wakustore(
            "query",
            "--peer",
            tcp.replace("/ip4/127.0.0.1", name),
            "--pubsub-topic",
            PUBSUB_TOPIC,
            "--content-topic",
            "/dns/1/none/proto",
            "--json",
        )
        assert result.returncode == 0, result.stderr
        assert result.stderr.strip().splitlines()[-1] == "0 messages in 1 page"
    unknown = wakustore(
        "query",
        "--peer",
        tcp.replace("/ip4/127.0.0.1", "/dns4/no-such-host.invalid"),
        "--pubsub-topic",
        PUBSUB_TOPIC,
        "--content-topic",
        "/dns/1/none/proto",
    )
    lines = unknown.stderr.strip().splitlines()
    assert unknown.returncode == 1 and len(lines) == 1 and "cannot resolve no-such-host.invalid" in lines[0], lines


def test_push_takes_its_payload_from_a_file(other_node, tmp_path):
    _, _, printed = other_node
    blob = tmp_path / "payload.bin"
    blob.write_bytes(bytes(range(256)) * 4)
    topic = f"/waku/2/rs/{CLUSTER_ID}/3"
    where = ("--peer", printed[0], "--pubsub-topic", topic, "--content-topic", "/file/1/p/proto")
    pushed = wakustore("push", *where, "--payload-file", str(blob))
    assert pushed.returncode == 0, pushed.stderr
    queried = wakustore("query", *where, "--json")
    assert [json.loads(line)["payload"] for line in queried.stdout.splitlines()] == [blob.read_bytes().hex()]
    missing = wakustore("push", *where, "--payload-file", str(tmp_path / "nope"))
    assert missing.returncode == 2 and missing.stderr.startswith("wakustore: error: --payload-file: No such file")


def test_push_and_query_commands_round_trip_then_sigterm_commits(served, tmp_path):
    server, data_dir, printed = served
    peer = printed[0]
    now = time.time_ns()
    single = WakuMessage(b"\x01\x02", CONTENT_TOPIC, timestamp=now, meta=b"\xaa")
    result = wakustore(
        "push",
        "--peer",
        peer,
        "--pubsub-topic",
        PUBSUB_TOPIC,
        "--content-topic",
        CONTENT_TOPIC,
        "--payload",
        "0102",
        "--meta",
        "aa",
        "--timestamp",
        str(now),
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {
        "hash": message_hash(PUBSUB_TOPIC, single).hex(),
        "status_code": 200,
        "status_desc": None,
        "relay_peer_count": 0,
    }

    batch = [WakuMessage(bytes([i]) * (i + 1), CONTENT_TOPIC, timestamp=now + i + 1, version=i % 2) for i in range(5)]
    jsonl = tmp_path / "batch.jsonl"
    jsonl.write_text(
        "".join(
            json.dumps(
                {
                    "pubsub_topic": PUBSUB_TOPIC,
                    "content_topic": m.content_topic,
                    "payload": m.payload.hex(),
                    "meta": "",
                    "timestamp": m.timestamp,
                    "version": m.version,
                }
            )
            + "\n"
            for m in batch
        )
    )
    result = wakustore("push", "--peer", printed[1], "--from-jsonl", str(jsonl))  # over websockets
    assert result.returncode == 0, result.stderr
    assert [json.loads(line)["status_code"] for line in result.stdout.splitlines()] == [200] * 5

    result = wakustore(
        "query",
        "--peer",
        peer,
        "--pubsub-topic",
        PUBSUB_TOPIC,
        "--content-topic",
        CONTENT_TOPIC,
        "--forward",
        "--limit",
        "2",
        "--all",
        "--json",
    )
    assert result.returncode == 0, result.stderr
    expected = [
        {
            "hash": message_hash(PUBSUB_TOPIC, m).hex(),
            "pubsub_topic": PUBSUB_TOPIC,
            "content_topic": m.content_topic,
            "payload": m.payload.hex(),
            "meta": m.meta.hex(),
            "timestamp": m.timestamp,
            "version": m.version,
        }
        for m in [single, *batch]
    ]
    assert [json.loads(line) for line in result.stdout.splitlines()] == expected
    assert "page 3: 2 messages, 6 in all" in result.stderr

    lookup = wakustore("query", "--peer", peer, "--hashes", expected[2]["hash"], expected[4]["hash"])
    assert lookup.returncode == 0, lookup.stderr
    assert [line.split("\t")[0] for line in lookup.stdout.splitlines()] == [expected[2]["hash"], expected[4]["hash"]]

    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(STOP_TIMEOUT_S) == 0
    assert server.rest()[-1:] == ["wakustore node stopped"]
    table = deltalake.DeltaTable(str(data_dir / "tables" / "messages")).to_pyarrow_table()
    assert table.num_rows == 6


def test_serve_refuses_a_taken_port_on_one_line(tmp_path):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        result = wakustore(
            "serve",
            "--data-dir",
            str(tmp_path),
            "--tcp-port",
            str(port),
            "--ws-port",
            "0",
            "--listen-host",
            "127.0.0.1",
        )
    assert result.returncode == 2
    assert result.stderr.strip() == f"wakustore: error: tcp_port {port} on 127.0.0.1 is already in use"


def test_a_start_that_fails_on_the_data_dir_is_not_called_cannot_listen(tmp_path):
    """Only a listener that cannot bind is "cannot listen"; the data dir
    failing under the start is named as what it is."""
    (tmp_path / "wal").mkdir()
    (tmp_path / "wal" / "messages").write_text("a file where the write-ahead log's directory belongs")
    ports = ("--tcp-port", "0", "--ws-port", "0", "--metrics-port", "0", "--mailserver-port", "0")
    result = wakustore("serve", "--data-dir", str(tmp_path), *ports, "--listen-host", "127.0.0.1")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        f"wakustore: error: Not a directory ({tmp_path / 'wal' / 'messages'}) [errno 20]"
    )


@pytest.fixture(scope="module")
def committed(engine, tmp_path_factory):
    """A data dir of 300 messages committed in three files (one content
    topic each, today), their key index built, the store stopped cleanly:
    (data dir, {topic: [hash]}, {topic: data file as the log names it})."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from wakustore.storage.message_store import MessageStore
    from wakustore.storage.table import DeltaTableRef

    data = tmp_path_factory.mktemp("committed") / "data"
    store = MessageStore(
        DeltaTableRef(engine, str(data / "tables" / "messages")),
        data / "wal" / "messages",
        index_directory=data / "index" / "messages",
    )
    store.open()
    sent: dict[str, list[bytes]] = {}
    start = time.time_ns() - 600 * 10**9
    for n in range(3):
        topic = f"/serve/1/file-{n}/proto"
        batch = [
            (PUBSUB_TOPIC, WakuMessage(os.urandom(200), topic, timestamp=start + (100 * n + i) * 10**6), start)
            for i in range(100)
        ]
        sent[topic] = [message_hash(PUBSUB_TOPIC, m) for _, m, _ in batch]
        store.put(batch)
        store.flush()
    store.reader.index_now()
    store.close()
    uri = data / "tables" / "messages"
    paths = pa.table(deltalake.DeltaTable(str(uri)).get_add_actions(flatten=True)).column("path").to_pylist()
    files = {pq.read_table(uri / p, columns=["content_topic"]).column(0)[0].as_py(): p for p in paths}
    return data, sent, files


@pytest.mark.parametrize("fault", ["ingest file flipped", "index files flipped", "data file deleted"])
def test_serve_starts_beside_a_bad_file_names_it_and_serves_the_pages_that_do_not_need_it(
    committed, tmp_path, damage, fault
):
    """The node starts (a flipped ingest file stopped its hot tier's
    warm-up; a damaged key index reached the Parquet reader and aborted the
    process; a deleted data file was reported as "cannot listen"), /health
    names the bad file, a page that needs it answers 503, the others are
    served, and SIGTERM stops it cleanly."""
    import shutil

    import trio

    from wakustore.clients.store import StoreClient
    from wakustore.protocols.store_query import HistoryQuery
    from wakustore.storage.index_files import IndexDirectory

    base, sent, files = committed
    data = tmp_path / "data"
    shutil.copytree(base, data)
    needed, other = "/serve/1/file-1/proto", "/serve/1/file-0/proto"
    victim = data / "tables" / "messages" / files[needed]
    if fault == "ingest file flipped":
        damage(victim, "flipped")
    elif fault == "index files flipped":
        for path in files.values():
            damage(Path(IndexDirectory(data / "index" / "messages").path_of(path)), "flipped", flipped_bytes=32)
    else:
        damage(victim, "deleted")
    server = ServeProcess(data, log_level="INFO")
    try:
        peer = server.wait_ready()[0]
        port = json.loads((data / "node-info.json").read_text())["metrics_port"]

        async def ask():
            async with StoreClient.connect(peer) as client:
                return [
                    await client.query(
                        HistoryQuery(pubsub_topic=PUBSUB_TOPIC, content_topics=(topic,), limit=100, forward=True)
                    )
                    for topic in (needed, other)
                ]

        needing, not_needing = trio.run(ask)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as response:
            health = json.loads(response.read())
    finally:
        server.proc.send_signal(signal.SIGTERM)
        code = server.proc.wait(STOP_TIMEOUT_S)
    stderr = server.proc.stderr.read()
    assert code == 0 and "cannot listen" not in stderr and "Traceback" not in stderr
    assert not_needing.status_code == 200 and [m.message_hash for m in not_needing.messages] == sent[other]
    assert health["ok"] is True
    if fault == "index files flipped":
        assert needing.status_code == 200 and [m.message_hash for m in needing.messages] == sent[needed]
        assert len(health["key_index"]["damaged_files"]) == 3 and health["bad_files"] == {}
    else:
        assert needing.status_code == 503 and "cannot read" in needing.status_desc
        assert list(health["bad_files"]) == [str(victim)]
        named = [line for line in stderr.splitlines() if files[needed] in line]
        assert len(named) == 1 and '"level":"ERROR"' in named[0], named


def test_a_control_node_exports_and_seeds_its_community_archives(tmp_path):
    """With an archive key configured, serve runs the archive scheduler:
    the past windows are exported, seeded, and their magnet link stored."""
    import coincurve

    from wakustore.protocols import topics

    key = bytes(range(1, 33))
    key_file = tmp_path / "community.key"
    key_file.write_text(key.hex())
    config = tmp_path / "node.toml"
    config.write_text(
        f'archive_key_file = "{key_file}"\narchive_chat_ids = ["general"]\narchive_listen = "127.0.0.1:0"\n'
    )
    data_dir = tmp_path / "control"
    pubkey = coincurve.PrivateKey(key).public_key.format()
    channel = topics.channel_content_topic(pubkey, "general")
    # Three weeks of history, imported before the node starts.
    jsonl = tmp_path / "history.jsonl"
    now = time.time_ns()
    jsonl.write_text(
        "".join(
            json.dumps(
                {
                    "pubsub_topic": f"/waku/2/rs/{CLUSTER_ID}/3",
                    "content_topic": channel,
                    "payload": (b"history-%d" % i).hex(),
                    "timestamp": now - (i + 1) * 3600 * 10**9 * 5,
                }
            )
            + "\n"
            for i in range(100)
        )
    )
    result = subprocess.run(
        [sys.executable, "-m", "wakustore", "db", "import", "--data-dir", str(data_dir), "--from-jsonl", str(jsonl)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    server = ServeProcess(data_dir, "--config", str(config))
    try:
        printed = server.wait_ready()
        assert any(line.startswith("seeding community archives on port ") for line in printed)
        community = topics.community_id(pubkey)
        archives = data_dir / "archives"
        torrent = archives / f"{community}.torrent"
        deadline = time.monotonic() + 120
        while not torrent.is_file() and time.monotonic() < deadline:
            time.sleep(0.5)  # the first export runs right after start
        assert (archives / community / "data").stat().st_size > 0
        assert (archives / community / "index").stat().st_size > 0
        assert (archives / f"{community}.torrent").is_file()
        # The signed magnet link went into the node's own store.
        magnet_topic = topics.magnet_content_topic(pubkey)
        query = subprocess.run(
            [
                sys.executable,
                "-m",
                "wakustore",
                "query",
                "--peer",
                printed[0],
                "--pubsub-topic",
                f"/waku/2/rs/{CLUSTER_ID}/3",
                "--content-topic",
                magnet_topic,
                "--json",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert query.returncode == 0, query.stderr
        assert len(query.stdout.splitlines()) >= 1
    finally:
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(timeout=60) == 0


def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_serve_on_fixed_ports_binds_every_listener_once(tmp_path):
    """As `make run` does: every port given, none of them 0."""
    names = ("--tcp-port", "--ws-port", "--metrics-port", "--mailserver-port", "--rest-port")
    ports = {name: _free_port() for name in names}
    ports["--discv5-udp-port"] = _free_udp_port()
    server = ServeProcess(
        tmp_path / "fixed", "--rest", "--discv5-discovery", *[v for kv in ports.items() for v in (kv[0], str(kv[1]))]
    )
    try:
        printed = server.wait_ready()
        from wakustore.protocols import enr

        record = enr.decode(next(line for line in printed if line.startswith("enr:")))
        assert record.udp == ports["--discv5-udp-port"]
        assert f"REST API on http://127.0.0.1:{ports['--rest-port']}/" in printed
        rest = f"http://127.0.0.1:{ports['--rest-port']}"
        with urllib.request.urlopen(f"{rest}/health", timeout=10) as response:
            assert json.loads(response.read())["nodeHealth"] == "READY"
        topic = urllib.parse.quote(f"/waku/2/rs/{CLUSTER_ID}/3", safe="")
        with urllib.request.urlopen(
            f"{rest}/store/v3/messages?pubsubTopic={topic}&contentTopics=/a/1/b/proto", timeout=10
        ) as response:
            assert json.loads(response.read())["messages"] == []
        assert any(f"/tcp/{ports['--tcp-port']}/p2p/" in line for line in printed)
        assert any(line.endswith(f":{ports['--mailserver-port']}") and line.startswith("enode://") for line in printed)
        with urllib.request.urlopen(f"http://127.0.0.1:{ports['--metrics-port']}/health", timeout=10) as response:
            assert response.status == 200
    finally:
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(timeout=60) == 0


def test_serve_on_every_interface_prints_dialable_addresses_and_a_stopped_line(tmp_path):
    """Listening on 0.0.0.0, the node prints (and writes to node-info.json)
    one multiaddr per interface address, then the announced ones; the rate
    limits come from the configuration file; SIGINT ends with a last line."""
    from wakustore.node.host import interface_addresses

    config = tmp_path / "node.toml"
    config.write_text(
        'rate_limits = ["store:7/1s", "lightpush:3/1m"]\next_multiaddrs = ["/dns4/node.example.org/tcp/443/wss"]\n'
    )
    log_path = tmp_path / "serve.log"
    with open(log_path, "w") as log:
        server = ServeProcess(
            tmp_path / "data", "--config", str(config), "--listen-host", "0.0.0.0", log_level="INFO", stderr=log
        )
        try:
            printed = server.wait_ready()
            info = json.loads((tmp_path / "data" / "node-info.json").read_text())
            multiaddrs = [line for line in printed if line.startswith("/")]
            assert multiaddrs == info["multiaddrs"]
            assert not any("/0.0.0.0/" in addr for addr in multiaddrs)
            suffix = "/p2p/" + info["peer_id"]
            tcp = [a for a in multiaddrs if a.startswith("/ip4/") and "/ws/" not in a]
            ws = [a for a in multiaddrs if a.startswith("/ip4/") and "/ws/" in a]
            hosts = interface_addresses("ip4")
            assert [a.split("/")[2] for a in tcp] == hosts == [a.split("/")[2] for a in ws]
            assert multiaddrs == [*tcp, *ws, "/dns4/node.example.org/tcp/443/wss" + suffix]
            # every printed interface address is dialable
            for peer in tcp:
                result = wakustore(
                    "query", "--peer", peer, "--pubsub-topic", PUBSUB_TOPIC, "--content-topic", CONTENT_TOPIC
                )
                assert result.returncode == 0, (peer, result.stderr)
        finally:
            server.proc.send_signal(signal.SIGINT)
            status = server.proc.wait(STOP_TIMEOUT_S)
    assert status == 0
    assert server.rest()[-1:] == ["wakustore node stopped"]
    logged = log_path.read_text()
    assert '"msg":"rate limits per peer and per address: store 7/1s, lightpush 3/60s"' in logged
    assert '"msg":"node stopped"' in logged


def test_metrics_host_opens_metrics_and_health_to_other_addresses(tmp_path):
    server = ServeProcess(tmp_path / "open", "--metrics-host", "0.0.0.0")
    try:
        printed = server.wait_ready()
        port = json.loads((tmp_path / "open" / "node-info.json").read_text())["metrics_port"]
        assert f"metrics and health on http://0.0.0.0:{port}/" in printed
        assert _health(_other_address(), port) == 200
        assert _health("127.0.0.1", port) == 200
    finally:
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(timeout=60) == 0


def test_make_run_passes_a_retention_with_a_semicolon_to_the_node(tmp_path):
    """The README's retention syntax through `make run ARGS=...`: the ';'
    is the policy's, and /health names the policy the node runs with."""
    repo = Path(__file__).resolve().parents[2]
    metrics_port = _free_port()
    args = (
        f"--retention time:86400;capacity:1000 --tcp-port 0 --ws-port 0 --mailserver-port 0 "
        f"--metrics-port {metrics_port} --listen-host 127.0.0.1"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MAKE", "MFLAGS"))}
    process = subprocess.Popen(
        ["make", "-s", "run", f"DATA_DIR={tmp_path / 'data'}", f"ARGS={args}"],
        cwd=repo,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**env, "WAKUSTORE_LOG_LEVEL": "WARNING"},
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        for line in process.stdout:
            if line.startswith(READY_LINE) or time.monotonic() > deadline:
                break
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/health", timeout=10) as response:
            config = json.loads(response.read())["config"]
        assert config["retention"] == "time:86400;capacity:1000"
        os.killpg(process.pid, signal.SIGTERM)
        out, err = process.communicate(timeout=60)
        assert "not found" not in err and "Error 127" not in err, err[-2000:]
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
