"""js-waku (@waku/sdk 0.0.36) against our node over TCP and websockets.

js-waku pushes messages by lightpush (v3, and v2beta1 when asked) and
pages them back by Store v3 in both directions, over time ranges, several
content topics and hash lookups; every message it reports is compared
byte for byte with what was pushed and with what our own client reads
back, and every js-waku query must end (it stops only on an empty page).
js-waku also sends its first push and query on the streams it opened when
it connected, after they sat idle.
npm dependencies are installed with ``npm ci`` when missing; a failed
install fails the test.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import trio

from wakustore.clients.store import StoreClient
from wakustore.node.store_protocols import RateLimits
from wakustore.protocols import lightpush, store_v3
from wakustore.protocols.message import WakuMessage, message_hash
from wakustore.protocols.store_query import HistoryQuery

# The harness lives beside the tests; the path makes it importable in any
# pytest import mode.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from store_node_harness import CLUSTER_ID, PUBSUB_TOPIC, NodeThread, node_config  # noqa: E402

pytestmark = pytest.mark.slow

INTEROP_DIR = Path(__file__).resolve().parents[1] / "interop"
SCRIPT = INTEROP_DIR / "store_client.mjs"
NODE_BIN = INTEROP_DIR / "node_modules" / ".bin" / "node"
NPM_TIMEOUT_S = 600
JOB_TIMEOUT_MS = 60_000
SHARD = 0
CONTENT_TOPICS = ["/interop/1/alpha/proto", "/interop/1/beta/proto", "/interop/1/gamma/proto"]
PUSHED = 30
PAGE = 7
# Longer than the 10 s the node used to wait for a request on a new stream.
IDLE_S = 15
# A node's wait for a first request, shortened to see it reset streams.
SHORT_IDLE_S = 3.0
IDLE_TOPIC = "/interop/1/idle/proto"


@pytest.fixture(scope="module")
def node_binary() -> Path:
    """Node.js 22 from the npm ``node`` package, installed by ``npm ci`` when missing."""
    packages = ("@waku/sdk", "@chainsafe/discv5")
    if not (NODE_BIN.exists() and all((INTEROP_DIR / "node_modules" / p).is_dir() for p in packages)):
        npm = shutil.which("npm")
        if npm is None:
            pytest.fail("npm is needed to install tests/interop")
        result = subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund"],
            cwd=INTEROP_DIR,
            capture_output=True,
            text=True,
            timeout=NPM_TIMEOUT_S,
        )
        if result.returncode != 0:
            pytest.fail(f"npm ci failed in {INTEROP_DIR}:\n{result.stdout}\n{result.stderr}")
    if not NODE_BIN.exists():
        pytest.fail(f"npm ci did not install {NODE_BIN}")
    return NODE_BIN


@pytest.fixture(scope="module")
def node(engine, tmp_path_factory):
    config = node_config(tmp_path_factory.mktemp("js-node"))
    thread = NodeThread(config, engine, RateLimits.parse(["lightpush:0/1s"])).start()
    yield thread
    thread.stop()


def run_job(node_binary: Path, node: NodeThread, **job) -> list[dict]:
    job = {
        "peer": node.tcp_addr,
        "clusterId": CLUSTER_ID,
        "shard": SHARD,
        "contentTopics": CONTENT_TOPICS,
        "timeoutMs": JOB_TIMEOUT_MS,
        **job,
    }
    if job.get("transport") == "ws":
        job["peer"] = node.ws_addr
    result = subprocess.run(
        [str(node_binary), str(SCRIPT)],
        input=json.dumps(job),
        cwd=INTEROP_DIR,
        capture_output=True,
        text=True,
        timeout=JOB_TIMEOUT_MS / 1000 + 30,
    )
    events = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert result.returncode == 0, f"js-waku job failed:\n{result.stdout}\n{result.stderr[-3000:]}"
    assert events[-1]["event"] == "done", events[-3:]
    return events


@pytest.fixture(scope="module")
def pushed(node_binary, node):
    """30 messages pushed by js-waku: 28 by lightpush v3, 2 by v2beta1.
    Timestamps are whole, even milliseconds (js-waku sends Date values)."""
    base_ms = int(time.time() * 1000) // 2 * 2 - 4_000
    items = [
        {
            "contentTopic": CONTENT_TOPICS[i % 3],
            "payloadHex": (f"{i:02x}" + "a5" * (i * 13 % 97)),
            "timestampMs": base_ms + 2 * i,
        }
        for i in range(PUSHED)
    ]
    for item, events in (
        (items[:28], run_job(node_binary, node, push=items[:28])),
        (items[28:], run_job(node_binary, node, push=items[28:], useLegacyLightpush=True)),
    ):
        pushes = [e for e in events if e["event"] == "pushed"]
        assert len(pushes) == len(item) and all(p["successes"] and not p["failures"] for p in pushes)
    assert node.flush() == PUSHED  # queries below page through the Delta table
    rows = []
    for item in items:
        message = WakuMessage(
            payload=bytes.fromhex(item["payloadHex"]),
            content_topic=item["contentTopic"],
            timestamp=item["timestampMs"] * 1_000_000,
        )
        rows.append((message, message_hash(PUBSUB_TOPIC, message)))
    return rows


def messages_of(events):
    return [e for e in events if e["event"] == "message"]


def assert_js_saw(events, rows):
    seen = messages_of(events)
    assert [e["hash"] for e in seen] == [h.hex() for _, h in rows]
    for event, (message, _) in zip(seen, rows):
        assert event["payload"] == message.payload.hex()
        assert int(event["timestamp"]) == message.timestamp
        assert event["contentTopic"] == message.content_topic
        assert event["pubsubTopic"] == PUBSUB_TOPIC
        assert event["meta"] in (None, "")
        assert event["version"] == 0


def backward_order(rows, page):
    """What a backward walk yields: the newest page first, each page ascending."""
    chunks = [rows[max(0, end - page) : end] for end in range(len(rows), 0, -page)]
    return [row for chunk in chunks for row in chunk]


def test_node_stores_what_js_waku_pushed_byte_for_byte(node, pushed):
    async def read_back():
        async with StoreClient.connect(node.tcp_addr) as client:
            return await client.query(HistoryQuery(message_hashes=tuple(h for _, h in pushed), limit=100))

    response = trio.run(read_back)
    assert response.status_code == 200
    assert [(e.message, e.pubsub_topic, e.message_hash) for e in response.messages] == [
        (m, PUBSUB_TOPIC, h) for m, h in pushed
    ]


@pytest.mark.parametrize("transport", ["tcp", "ws"])
def test_js_waku_pages_forward_to_the_end(node_binary, node, pushed, transport):
    events = run_job(node_binary, node, transport=transport, query={"pageSize": PAGE, "forward": True})
    assert_js_saw(events, pushed)
    # js-waku stops on the first empty page: ours follows the last full one.
    assert events[-1]["pages"] in (-(-PUSHED // PAGE), -(-PUSHED // PAGE) + 1)


def test_js_waku_pages_backward_to_the_end(node_binary, node, pushed):
    events = run_job(node_binary, node, query={"pageSize": PAGE, "forward": False})
    assert_js_saw(events, backward_order(pushed, PAGE))


def test_js_waku_time_range_and_content_topic_subset(node_binary, node, pushed):
    start_ms = pushed[5][0].timestamp // 1_000_000 - 1  # odd ms: between two messages
    end_ms = pushed[24][0].timestamp // 1_000_000 + 1
    topics = CONTENT_TOPICS[:2]
    rows = [r for r in pushed[5:25] if r[0].content_topic in topics]
    forward = run_job(
        node_binary,
        node,
        contentTopics=topics,
        query={"pageSize": 4, "forward": True, "timeStartMs": start_ms, "timeEndMs": end_ms},
    )
    assert_js_saw(forward, rows)
    backward = run_job(
        node_binary,
        node,
        contentTopics=topics,
        query={"pageSize": 4, "forward": False, "timeStartMs": start_ms, "timeEndMs": end_ms},
    )
    assert_js_saw(backward, backward_order(rows, 4))


def test_js_waku_hash_lookup(node_binary, node, pushed):
    chosen = [pushed[i] for i in (0, 3, 11, 17, 29)]
    events = run_job(node_binary, node, query={"messageHashes": [h.hex() for _, h in chosen]})
    assert_js_saw(events, chosen)


def push_and_query_after_idle(node_binary, engine, data_dir, idle_s, **protocol_options):
    """One js-waku job on a node of its own: connect, stay idle ``idle_s``,
    push one message, query it back. The idle event and the message seen."""
    # Its own node: the pushed message must not reach the module node's
    # buffer, whose flush count the pushed fixture checks.
    idle_node = NodeThread(
        node_config(data_dir), engine, RateLimits.parse(["lightpush:0/1s"]), **protocol_options
    ).start()
    try:
        # No timestamp: js-waku stamps the message when it sends it, after the
        # idle time, as the node checks the timestamp against its clock.
        item = {"contentTopic": IDLE_TOPIC, "payloadHex": "1d1e5eed"}
        events = run_job(
            node_binary,
            idle_node,
            push=[item],
            contentTopics=[IDLE_TOPIC],
            query={"pageSize": 10, "forward": True},
            idleMs=int(idle_s * 1000),
        )
    finally:
        idle_node.stop()
    idle = next(e for e in events if e["event"] == "idle")
    assert {s["protocol"] for s in idle["before"]} >= {lightpush.PROTOCOL_ID_V3, store_v3.PROTOCOL_ID}, idle
    pushes = [e for e in events if e["event"] == "pushed"]
    assert len(pushes) == 1 and pushes[0]["successes"] and not pushes[0]["failures"], pushes
    seen = messages_of(events)
    assert [(e["payload"], e["contentTopic"], e["pubsubTopic"]) for e in seen] == [
        (item["payloadHex"], IDLE_TOPIC, PUBSUB_TOPIC)
    ]
    return idle


def test_js_waku_first_push_and_query_on_streams_idle_for_15_s(node_binary, engine, tmp_path):
    idle = push_and_query_after_idle(node_binary, engine, tmp_path, IDLE_S)
    # The streams opened on connect are still open both ways after the idle
    # time (js-libp2p's statuses), so js-waku sent its first requests on them.
    opened = [s["id"] for s in idle["before"] if s["protocol"] in (lightpush.PROTOCOL_ID_V3, store_v3.PROTOCOL_ID)]
    after = {s["id"]: (s["readStatus"], s["writeStatus"]) for s in idle["after"]}
    assert all(
        sid in after
        and after[sid][0] not in ("closing", "closed")
        and after[sid][1] not in ("done", "closing", "closed")
        for sid in opened
    ), idle


def test_js_waku_replaces_streams_the_node_reset_after_its_idle_wait(node_binary, engine, tmp_path):
    # A node reclaiming idle streams resets them: js-waku drops a reset
    # stream and opens a fresh one (a half-closed one it would reuse).
    idle = push_and_query_after_idle(node_binary, engine, tmp_path, SHORT_IDLE_S * 2, idle_timeout_s=SHORT_IDLE_S)
    opened = {s["id"] for s in idle["before"]}
    assert not opened & {s["id"] for s in idle["after"]}, idle


# --- ENR (31/WAKU2-ENR) with @waku/enr ---------------------------------------------


def _enr_tool(node_binary: Path, *args: str) -> dict:
    result = subprocess.run(
        [str(node_binary), str(INTEROP_DIR / "enr_tool.mjs"), *args],
        cwd=INTEROP_DIR,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_js_waku_reads_our_record_and_we_read_its(node_binary, tmp_path):
    from wakustore.node.config import NodeConfig
    from wakustore.node.enr import node_record
    from wakustore.protocols import enr

    key = bytes(range(7, 39))
    peer = enr.peer_id_of(enr.encode(key, 1, {}).public_key)
    config = NodeConfig(
        data_dir=tmp_path, cluster_id=16, shards=[1, 32, 64], ext_multiaddrs=["/dns4/store.example.org/tcp/443/wss"]
    ).validate()
    ours = node_record(
        config, key, [f"/ip4/192.0.2.7/tcp/60000/p2p/{peer}", f"/ip4/192.0.2.7/tcp/8000/ws/p2p/{peer}"], relay=True
    )
    seen = _enr_tool(node_binary, "decode", ours.text)
    assert seen["peerId"] == peer and (seen["ip"], seen["tcp"]) == ("192.0.2.7", 60000)
    assert seen["waku2"] == {"relay": True, "store": True, "filter": False, "lightPush": True}
    assert seen["shardInfo"] == {"clusterId": 16, "shards": [1, 32, 64]}
    assert seen["multiaddrs"] == ["/dns4/store.example.org/tcp/443/wss", "/ip4/192.0.2.7/tcp/8000/ws"]

    theirs = _enr_tool(node_binary, "encode")
    record = enr.decode(theirs["enr"])
    assert record.peer_id == theirs["peerId"]
    assert record.capabilities == enr.Capability.RELAY | enr.Capability.STORE
    assert record.relay_shards == enr.RelayShards(16, (1, 32))
    assert (record.ip, record.tcp) == ("10.1.2.3", 30303)
    assert record.multiaddrs == ["/dns4/node.example.org/tcp/443/wss"]
