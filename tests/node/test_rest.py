"""nwaku's REST API (``--rest``) through a real HTTP client against real nodes.

Two relay nodes on the session's engine: A with the admin endpoints and
CORS origins, B relaying with A and without admin. The JSON is checked
against the shapes of nwaku's handlers (``SCHEMAS`` below); where those
differ from the ``waku-rest-api`` OpenAPI files, the schema follows the
handlers and says so.
"""

from __future__ import annotations

import base64
import sys
import time
from pathlib import Path
from urllib.parse import quote

import httpx
import jsonschema
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from wakustore.clients.store import StoreClient
from wakustore.node.store_protocols import RateLimits
from wakustore.protocols.message import WakuMessage, message_hash
from wakustore.protocols.rest import autoshard
from wakustore.protocols.store_query import HistoryQuery

sys.path.insert(0, str(Path(__file__).parent))
from store_node_harness import OTHER_PUBSUB_TOPIC, PUBSUB_TOPIC, NodeThread, node_config  # noqa: E402

CONTENT_TOPIC = "/rest/1/walk/proto"
OTHER_CONTENT_TOPIC = "/rest/1/other/proto"
WALKED = 1000
ARRIVAL_TIMEOUT_S = 15.0

_HEX_HASH = {"type": "string", "pattern": "^0x[0-9a-f]{64}$"}
_BASE64 = {"type": "string", "pattern": "^[A-Za-z0-9+/]*={0,2}$"}
# nwaku's handlers (waku/rest_api/endpoint/*/types.nim). The OpenAPI files
# (waku-rest-api) differ: they write hashes and cursors as base64 and the
# entry's hash as message_hash, require the entry's message, leave out
# pubsubTopic, proof and the health "desc", and spell health statuses
# "Ready" / "Not Ready".
_MESSAGE = {
    "type": "object",
    "required": ["payload", "contentTopic", "version", "timestamp", "ephemeral"],
    "properties": {
        "payload": _BASE64,
        "contentTopic": {"type": "string"},
        "version": {"type": "integer", "minimum": 0},
        "timestamp": {"type": "integer"},
        "ephemeral": {"type": "boolean"},
        "meta": _BASE64,
        "proof": _BASE64,
    },
    "additionalProperties": False,
}
SCHEMAS = {
    "store": {
        "type": "object",
        "required": ["requestId", "statusCode", "statusDesc", "messages"],
        "properties": {
            "requestId": {"type": "string"},
            "statusCode": {"type": "integer"},
            "statusDesc": {"type": "string"},
            "messages": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["messageHash"],
                    "properties": {"messageHash": _HEX_HASH, "message": _MESSAGE, "pubsubTopic": {"type": "string"}},
                    "additionalProperties": False,
                },
            },
            "paginationCursor": _HEX_HASH,
        },
        "additionalProperties": False,
    },
    "health": {
        "type": "object",
        "required": ["nodeHealth", "protocolsHealth"],
        "properties": {
            "nodeHealth": {"enum": ["INITIALIZING", "SYNCHRONIZING", "READY", "NOT_READY", "SHUTTING_DOWN"]},
            # logos-delivery's addition, which nwaku does not write.
            "connectionStatus": {"enum": ["Disconnected", "PartiallyConnected", "Connected"]},
            "protocolsHealth": {
                "type": "array",
                "items": {"type": "object", "minProperties": 1, "maxProperties": 2},
            },
        },
    },
    "info": {
        "type": "object",
        "required": ["listenAddresses"],
        "properties": {
            "listenAddresses": {"type": "array", "items": {"type": "string"}},
            "enrUri": {"type": "string", "pattern": "^enr:"},
            # This node's addition: its ports by what they serve.
            "ports": {"type": "object", "additionalProperties": {"type": "integer"}},
        },
    },
    "peer": {
        "type": "object",
        "required": ["multiaddr", "protocols", "shards", "connected", "agent", "origin"],
        "properties": {
            "multiaddr": {"type": "string"},
            "protocols": {"type": "array", "items": {"type": "string"}},
            "shards": {"type": "array", "items": {"type": "integer"}},
            "connected": {"enum": ["NotConnected", "CannotConnect", "CanConnect", "Connected"]},
            "agent": {"type": "string"},
            "origin": {"enum": ["UnknownOrigin", "Discv5", "Static", "PeerExchange", "Dns"]},
            "score": {"type": "number"},
        },
        "additionalProperties": False,
    },
    "relay_message": {**_MESSAGE, "required": [*_MESSAGE["required"], "proof"]},
}


class RestNode(NodeThread):
    with_relay = True


def rest_config(tmp_path_factory, name: str, **overrides):
    return node_config(tmp_path_factory.mktemp(name), rest=True, rest_port=0, **overrides)


@pytest.fixture(scope="module")
def nodes(engine, tmp_path_factory):
    unlimited = RateLimits.parse(["0/1s"])
    a = RestNode(
        rest_config(
            tmp_path_factory,
            "rest-a",
            rest_admin=True,
            rest_allow_origin=["http://allowed.example", "*.wakustore.test"],
            num_shards_in_network=8,
        ),
        engine,
        unlimited,
    ).start()
    b = RestNode(rest_config(tmp_path_factory, "rest-b", relay_peers=[a.tcp_addr]), engine, unlimited).start()
    try:
        _wait_for(lambda: a.relay.peer_count(PUBSUB_TOPIC) >= 1, "B never became A's relay peer")
        yield a, b
    finally:
        b.stop()
        a.stop()


@pytest.fixture(scope="module")
def walked(nodes):
    """1,000 messages on CONTENT_TOPIC and 10 on another, stored in A and
    committed; (hash, message) in time order."""
    a, _ = nodes
    now = time.time_ns()
    items = []
    for i in range(WALKED):
        message = WakuMessage(
            b"walk %d" % i, CONTENT_TOPIC, timestamp=now - (WALKED - i) * 1_000_000, meta=b"m" * (i % 3)
        )
        items.append((PUBSUB_TOPIC, message, now))
    for i in range(10):
        items.append((PUBSUB_TOPIC, WakuMessage(b"other %d" % i, OTHER_CONTENT_TOPIC, timestamp=now - i), now))
    trio.from_thread.run(a.service.put, items, trio_token=a._token)
    a.flush()
    rows = [(message_hash(t, m), m) for t, m, _ in items[:WALKED]]
    return sorted(rows, key=lambda row: (row[1].timestamp, row[0]))


def url(node, path: str) -> str:
    return f"http://127.0.0.1:{node.rest_port}{path}"


def get(node, path: str, **kwargs) -> httpx.Response:
    return httpx.get(url(node, path), timeout=30, **kwargs)


def post(node, path: str, body, **kwargs) -> httpx.Response:
    return httpx.post(url(node, path), json=body, timeout=30, **kwargs)


def _wait_for(condition, what: str, timeout_s: float = ARRIVAL_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    raise AssertionError(what)


def rest_walk(node, ascending: bool, extra: dict | None = None) -> list[dict]:
    """Every entry of CONTENT_TOPIC through paginationCursor, pages of 100."""
    entries, cursor = [], None
    while True:
        params = {
            "pubsubTopic": PUBSUB_TOPIC,
            "contentTopics": CONTENT_TOPIC,
            "pageSize": "100",
            "ascending": "true" if ascending else "false",
            **(extra or {}),
        }
        if cursor:
            params["cursor"] = cursor
        answer = get(node, "/store/v3/messages", params=params)
        assert answer.status_code == 200, answer.text
        body = answer.json()
        jsonschema.validate(body, SCHEMAS["store"])
        assert body["statusCode"] == 200 and body["statusDesc"] == "OK"
        assert len(body["messages"]) <= 100
        entries.extend(body["messages"])
        cursor = body.get("paginationCursor")
        if cursor is None:
            return entries


def libp2p_walk(node, forward: bool) -> list[bytes]:
    async def main():
        hashes = []
        async with StoreClient.connect(node.tcp_addr) as client:
            query = HistoryQuery(pubsub_topic=PUBSUB_TOPIC, content_topics=(CONTENT_TOPIC,), forward=forward, limit=100)
            async for response in client.pages(query):
                assert response.status_code == 200
                hashes.extend(e.message_hash for e in response.messages)
        return hashes

    return trio.run(main)


@pytest.mark.parametrize("ascending", [True, False])
def test_store_walk_by_cursor_equals_the_libp2p_answers(nodes, walked, ascending):
    a, _ = nodes
    entries = rest_walk(a, ascending)
    hashes = [bytes.fromhex(e["messageHash"][2:]) for e in entries]
    assert len(hashes) == WALKED
    assert hashes == libp2p_walk(a, ascending)
    expected = [h for h, _ in walked]
    # Each page is in time order; pages go back in time when descending.
    assert sorted(hashes) == sorted(expected)
    if ascending:
        assert hashes == expected
    # Without includeData, nwaku writes the hash alone.
    assert all(set(e) == {"messageHash"} for e in entries)


def test_store_with_data_writes_nwakus_message_json(nodes, walked):
    a, _ = nodes
    answer = get(
        a,
        "/store/v3/messages",
        params={"pubsubTopic": PUBSUB_TOPIC, "contentTopics": CONTENT_TOPIC, "includeData": "true", "pageSize": "5"},
    )
    body = answer.json()
    jsonschema.validate(body, SCHEMAS["store"])
    assert answer.headers["content-type"].startswith("application/json")
    by_hash = dict(walked)
    for entry in body["messages"]:
        message = by_hash[bytes.fromhex(entry["messageHash"][2:])]
        assert entry["pubsubTopic"] == PUBSUB_TOPIC
        got = entry["message"]
        assert base64.b64decode(got["payload"]) == message.payload
        assert got["timestamp"] == message.timestamp and got["contentTopic"] == CONTENT_TOPIC
        assert base64.b64decode(got.get("meta", "")) == message.meta  # left out when empty
        assert "proof" not in got  # empty: left out of store answers


def test_store_hash_lookup_and_parameters_as_nwaku_reads_them(nodes, walked):
    a, _ = nodes
    wanted = [h for h, _ in walked[:3]]
    # 0x optional; the page size is capped at 100; unknown parameters ignored.
    answer = get(
        a,
        "/store/v3/messages",
        params={"hashes": ",".join(["0x" + wanted[0].hex(), wanted[1].hex(), "0x" + wanted[2].hex()]), "nope": "1"},
    )
    assert answer.status_code == 200, answer.text
    assert {e["messageHash"] for e in answer.json()["messages"]} == {"0x" + h.hex() for h in wanted}
    big = get(
        a, "/store/v3/messages", params={"pubsubTopic": PUBSUB_TOPIC, "contentTopics": CONTENT_TOPIC, "pageSize": "500"}
    )
    assert len(big.json()["messages"]) == 100
    # Parameter names are case-insensitive; repeated values are joined with commas.
    mixed = get(
        a,
        "/store/v3/messages?PUBSUBTOPIC="
        + quote(PUBSUB_TOPIC, safe="")
        + f"&contentTopics={quote(CONTENT_TOPIC, safe='')}&contentTopics={quote(OTHER_CONTENT_TOPIC, safe='')}"
        + "&pageSize=100&ascending=false&includeData=true",
    )
    # The newest 100: the 10 of the other topic and 90 of the walk.
    seen = [e["message"]["contentTopic"] for e in mixed.json()["messages"]]
    assert (seen.count(OTHER_CONTENT_TOPIC), seen.count(CONTENT_TOPIC)) == (10, 90)
    # Time bounds in nanoseconds; startTime inclusive.
    start = walked[-5][1].timestamp
    recent = get(
        a,
        "/store/v3/messages",
        params={"pubsubTopic": PUBSUB_TOPIC, "contentTopics": CONTENT_TOPIC, "startTime": str(start)},
    )
    assert [e["messageHash"] for e in recent.json()["messages"]] == ["0x" + h.hex() for h, _ in walked[-5:]]


@pytest.mark.parametrize(
    "params, reason",
    [
        ({"hashes": "0x1234"}, "hashes: a hash is 32 bytes, not 2"),
        ({"hashes": "zz"}, "hashes: not hex"),
        (
            {"cursor": "0x" + "ab" * 31, "pubsubTopic": PUBSUB_TOPIC, "contentTopics": "/a/1/b/c"},
            "cursor: a hash is 32",
        ),
        ({"pubsubTopic": "/waku/2/default-waku/proto", "contentTopics": "/a/1/b/c"}, "pubsubTopic: not a static shard"),
        ({"pubsubTopic": PUBSUB_TOPIC, "contentTopics": "/a/1/b/c", "startTime": "20", "endTime": "10"}, "after"),
        ({"pageSize": "ten"}, "pageSize: not a number"),
        ({"startTime": "soon"}, "startTime: not a number"),
        ({"includeData": "maybe"}, "includeData: not a boolean"),
        ({"contentTopics": "/a/1/b/c"}, "content topics require a pubsub topic"),
        (
            {"hashes": ",".join(["0x" + bytes([i]).hex() * 32 for i in range(101)])},
            "too many message hashes: 101 > 100",
        ),
        ({"hashes": "0x" + "11" * 5000}, "longer than 8192 characters"),
        ({"peerAddr": "not-a-multiaddr"}, "Failed parsing remote peer info"),
    ],
)
def test_store_bad_parameters_get_400_with_one_line(nodes, params, reason):
    a, _ = nodes
    answer = get(a, "/store/v3/messages", params=params)
    assert answer.status_code == 400, answer.text
    assert answer.headers["content-type"].startswith("text/plain")
    assert reason in answer.text and "\n" not in answer.text.strip()


def test_store_unknown_cursor_is_a_bad_request_not_a_server_error(nodes, walked):
    a, _ = nodes
    answer = get(
        a,
        "/store/v3/messages",
        params={"pubsubTopic": PUBSUB_TOPIC, "contentTopics": CONTENT_TOPIC, "cursor": "0x" + "42" * 32},
    )
    assert answer.status_code == 400 and "cursor not found" in answer.text


def test_store_through_peer_addr_asks_that_peer(nodes, walked):
    a, b = nodes
    # B holds none of the walk: asked directly it answers nothing; through
    # peerAddr it relays A's answer.
    params = {"pubsubTopic": PUBSUB_TOPIC, "contentTopics": CONTENT_TOPIC, "pageSize": "100", "ascending": "true"}
    assert get(b, "/store/v3/messages", params=params).json()["messages"] == []
    relayed = get(b, "/store/v3/messages", params={**params, "peerAddr": a.tcp_addr})
    assert relayed.status_code == 200, relayed.text
    jsonschema.validate(relayed.json(), SCHEMAS["store"])
    assert [e["messageHash"] for e in relayed.json()["messages"]] == ["0x" + h.hex() for h, _ in walked[:100]]
    # A peer that cannot be dialed: nwaku's 504 in the JSON, HTTP 200.
    gone = "/ip4/127.0.0.1/tcp/1/p2p/" + stranger()
    failed = get(b, "/store/v3/messages", params={**params, "peerAddr": gone})
    assert failed.status_code == 200 and failed.json()["statusCode"] == 504
    assert failed.json()["statusDesc"].startswith("PEER_DIAL_FAILURE")


def stranger() -> str:
    """The peer id of a key nobody runs."""
    from libp2p.crypto.secp256k1 import create_new_key_pair
    from libp2p.peer.id import ID

    return str(ID.from_pubkey(create_new_key_pair().public_key))


def test_store_rate_limit_is_429_keyed_by_the_client_address(engine, tmp_path_factory):
    limited = RateLimits.parse(["store:2/1h"])
    node = NodeThread(rest_config(tmp_path_factory, "rest-limited"), engine, limited).start()
    try:
        params = {"pubsubTopic": PUBSUB_TOPIC, "contentTopics": CONTENT_TOPIC}
        assert [get(node, "/store/v3/messages", params=params).status_code for _ in range(3)] == [200, 200, 429]
        refused = get(node, "/store/v3/messages", params=params)
        assert refused.text == "Request rate limit reached"
    finally:
        node.stop()


def test_health_info_and_version(nodes):
    a, b = nodes
    health = get(a, "/health")
    assert health.status_code == 200
    body = health.json()
    jsonschema.validate(body, SCHEMAS["health"])
    assert body["nodeHealth"] == "READY" and body["connectionStatus"] == "Connected"  # B on both shards
    named = {next(iter(entry)): entry for entry in body["protocolsHealth"]}
    assert named["Store"] == {"Store": "READY"} and named["Relay"] == {"Relay": "READY"}
    assert named["Filter"] == {"Filter": "NOT_MOUNTED"}
    for path in ("/info", "/debug/v1/info"):
        info = get(a, path).json()
        jsonschema.validate(info, SCHEMAS["info"])
        assert info["listenAddresses"] == a.multiaddrs and info["enrUri"] == a.enr.text
        assert info["ports"]["rest"] == a.rest_port
    for path in ("/version", "/debug/v1/version"):
        version = get(a, path)
        assert version.status_code == 200 and version.text.startswith("wakustore ")
    # The metrics listener's own /health stays beside it.


def test_admin_endpoints_only_with_rest_admin(nodes):
    a, b = nodes
    off = get(b, "/admin/v1/peers")
    assert off.status_code == 404 and "--rest-admin=true" in off.text
    peers = get(a, "/admin/v1/peers").json()
    for peer in peers:
        jsonschema.validate(peer, SCHEMAS["peer"])
    relay_peer = next(p for p in peers if p["multiaddr"].endswith(b.peer_id))
    assert relay_peer["connected"] == "Connected" and "/vac/waku/relay/2.0.0" in relay_peer["protocols"]
    assert 0 in relay_peer["shards"]
    assert [p["multiaddr"] for p in get(a, "/admin/v1/peers/connected/on/0").json()] == [relay_peer["multiaddr"]]
    assert get(a, "/admin/v1/peers/connected/on/7").json() == []
    assert get(a, "/admin/v1/peers/connected/on/x").status_code == 400
    single = get(a, f"/admin/v1/peer/{b.peer_id}")
    assert single.status_code == 200 and single.json()["multiaddr"] == relay_peer["multiaddr"]
    assert get(a, "/admin/v1/peer/notapeer").status_code == 400
    assert get(a, f"/admin/v1/peer/{a.peer_id}").status_code == 404
    relay = get(a, "/admin/v1/peers/relay").json()
    assert [g["shard"] for g in relay] == [0, 5]
    assert [p["multiaddr"] for p in relay[0]["peers"]] == [relay_peer["multiaddr"]]
    assert isinstance(relay[0]["peers"][0]["score"], float)
    assert get(a, "/admin/v1/peers/relay/on/7").json() == {"shard": 7, "peers": []}
    assert all(isinstance(g["peers"], list) for g in get(a, "/admin/v1/peers/mesh").json())
    stats = get(a, "/admin/v1/peers/stats").json()
    assert stats["Relay peers"]["Total relay peers"] == 1 and stats["By Connectedness"]["Connected"] >= 1
    service = get(a, "/admin/v1/peers/service").json()
    assert any("/vac/waku/store-query/3.0.0" in p["protocols"] for p in service)


def test_admin_dials_peers_and_sets_the_log_level(nodes, engine, tmp_path_factory):
    import logging

    a, _ = nodes
    other = NodeThread(node_config(tmp_path_factory.mktemp("rest-dialed")), engine).start()
    try:
        assert post(a, "/admin/v1/peers", [other.tcp_addr]).text == "OK"
        assert any(p["multiaddr"].endswith(other.peer_id) for p in get(a, "/admin/v1/peers/connected").json())
        unreachable = post(a, "/admin/v1/peers", [other.tcp_addr, "/ip4/127.0.0.1/tcp/1/p2p/" + stranger()])
        assert unreachable.status_code == 400 and unreachable.text.startswith("Failed to connect to peer at index: 1")
        assert post(a, "/admin/v1/peers", "not a list").status_code == 400
    finally:
        other.stop()
    before = logging.getLogger().level
    try:
        assert httpx.post(url(a, "/admin/v1/log-level/warn")).text == "OK"
        assert logging.getLogger().level == logging.WARNING
        bad = httpx.post(url(a, "/admin/v1/log-level/LOUD"))
        assert bad.status_code == 400 and "Invalid log-level: LOUD" in bad.text
    finally:
        logging.getLogger().setLevel(before)


def test_relay_subscribe_publish_and_drain(nodes):
    a, b = nodes
    encoded = quote(PUBSUB_TOPIC, safe="")
    assert get(a, f"/relay/v1/messages/{encoded}").status_code == 404  # not subscribed
    assert post(a, "/relay/v1/subscriptions", [PUBSUB_TOPIC]).text == "OK"
    bad = post(a, "/relay/v1/subscriptions", ["/waku/2/rs/42/9"])
    assert bad.status_code == 400 and "not relayed by this node" in bad.text
    assert post(a, "/relay/v1/subscriptions", ["nonsense"]).status_code == 400
    sent = {"payload": base64.b64encode(b"over rest").decode(), "contentTopic": "/rest/1/relay/proto"}
    assert post(b, f"/relay/v1/messages/{encoded}", sent).text == "OK"
    received: list = []

    def arrived() -> bool:
        received.extend(get(a, f"/relay/v1/messages/{encoded}").json())
        return bool(received)

    _wait_for(arrived, "the message posted to B never reached A's cache")
    assert len(received) == 1
    jsonschema.validate(received[0], SCHEMAS["relay_message"])
    assert base64.b64decode(received[0]["payload"]) == b"over rest" and received[0]["proof"] == ""
    assert received[0]["timestamp"] > 0  # absent: stamped now
    assert get(a, f"/relay/v1/messages/{encoded}").json() == []  # a GET takes them out
    # B stored what it published, through the write-ahead log.
    stored = get(b, "/store/v3/messages", params={"pubsubTopic": PUBSUB_TOPIC, "contentTopics": "/rest/1/relay/proto"})
    assert len(stored.json()["messages"]) == 1
    refused = post(b, f"/relay/v1/messages/{encoded}", {"payload": "", "contentTopic": "/a/1/b/c"})
    assert refused.status_code == 400 and "payload" in refused.text
    not_served = post(b, "/relay/v1/messages/" + quote("/waku/2/rs/42/9", safe=""), sent)
    assert not_served.status_code == 400 and "not subscribed" in not_served.text
    assert httpx.request("DELETE", url(a, "/relay/v1/subscriptions"), json=[PUBSUB_TOPIC]).text == "OK"
    assert get(a, f"/relay/v1/messages/{encoded}").status_code == 404


def test_relay_auto_endpoints_follow_autosharding(nodes):
    a, b = nodes
    # 51/WAKU2-RELAY-SHARDING's vector (nwaku's tests): 8 shards, cluster 1.
    assert autoshard("/toychat/2/huilong/proto", 1, 8) == "/waku/2/rs/1/3"
    # A serves shards 0 and 5 of 8: a content topic that lands on one of them.
    topic = next(
        f"/app{i}/1/chat/proto" for i in range(1000) if autoshard(f"/app{i}/1/chat/proto", 42, 8).endswith("/0")
    )
    assert post(a, "/relay/v1/auto/subscriptions", [topic]).text == "OK"
    elsewhere = next(
        f"/app{i}/1/chat/proto" for i in range(1000) if autoshard(f"/app{i}/1/chat/proto", 42, 8).endswith("/1")
    )
    assert post(a, "/relay/v1/auto/subscriptions", [elsewhere]).status_code == 400
    assert get(a, "/relay/v1/auto/messages/" + quote(topic, safe="")).json() == []
    # B has no num_shards_in_network: autosharding is off there.
    off = post(b, "/relay/v1/auto/messages", {"payload": "aGk=", "contentTopic": topic})
    assert off.status_code == 400 and "Autosharding is disabled" in off.text
    assert post(a, "/relay/v1/auto/messages", {"payload": "aGk=", "contentTopic": topic}).text == "OK"


def test_lightpush_v3_answers_with_the_push_status(nodes):
    a, b = nodes
    message = {"payload": base64.b64encode(b"pushed").decode(), "contentTopic": "/rest/1/push/proto"}
    answer = post(b, "/lightpush/v3/message", {"pubsubTopic": PUBSUB_TOPIC, "message": message})
    assert answer.status_code == 200 and answer.json() == {"relayPeerCount": 1}
    wrong_topic = post(b, "/lightpush/v3/message", {"pubsubTopic": "/waku/2/rs/42/9", "message": message})
    assert wrong_topic.status_code == 421 and "statusDesc" in wrong_topic.json()
    no_topic = post(b, "/lightpush/v3/message", {"message": message})  # static sharding: a topic is required
    assert no_topic.status_code == 420
    bad = post(b, "/lightpush/v3/message", {"pubsubTopic": PUBSUB_TOPIC, "message": {"payload": "@@"}})
    assert bad.status_code == 400 and bad.json()["statusDesc"].startswith("Invalid push request!")
    old = post(b, "/lightpush/v3/message", {"pubsubTopic": PUBSUB_TOPIC, "message": {**message, "timestamp": 1}})
    assert old.status_code == 420 and "timestamp" in old.json()["statusDesc"]
    # Through A's autosharding, a push without a pubsub topic finds its shard.
    auto = next(
        f"/app{i}/1/chat/proto" for i in range(1000) if autoshard(f"/app{i}/1/chat/proto", 42, 8).endswith("/5")
    )
    routed = post(a, "/lightpush/v3/message", {"message": {**message, "contentTopic": auto}})
    assert routed.status_code == 200, routed.text
    stored = get(a, "/store/v3/messages", params={"pubsubTopic": OTHER_PUBSUB_TOPIC, "contentTopics": auto})
    assert len(stored.json()["messages"]) == 1


def test_cors_as_nwakus_origin_handler(nodes):
    a, b = nodes
    allowed = get(a, "/health", headers={"Origin": "http://allowed.example"})
    assert allowed.headers["access-control-allow-origin"] == "http://allowed.example"
    assert allowed.headers["vary"] == "Origin"
    wildcard = get(a, "/health", headers={"Origin": "https://node.wakustore.test"})
    assert wildcard.status_code == 200
    refused = get(a, "/health", headers={"Origin": "http://evil.example"})
    assert refused.status_code == 403 and refused.text == "Origin not allowed"
    assert "access-control-allow-origin" not in get(a, "/health").headers  # no Origin: no CORS
    # Without --rest-allow-origin, no CORS headers at all.
    assert "access-control-allow-origin" not in get(b, "/health", headers={"Origin": "http://x"}).headers


def test_http_bounds_and_bad_bodies(nodes):
    a, _ = nodes
    huge = httpx.post(
        url(a, "/lightpush/v3/message"), content=b"x" * (2 * 1024 * 1024), headers={"content-type": "application/json"}
    )
    assert huge.status_code == 413
    assert post(a, "/relay/v1/subscriptions", None).status_code == 400
    garbled = httpx.post(url(a, "/relay/v1/subscriptions"), content=b"[", headers={"content-type": "application/json"})
    assert garbled.status_code == 400 and "could not decode" in garbled.text
    wrong_type = httpx.post(url(a, "/relay/v1/subscriptions"), content=b"[]", headers={"content-type": "image/png"})
    assert wrong_type.status_code == 400 and "Content-Type" in wrong_type.text
    header_flood = httpx.get(url(a, "/health"), headers={f"x-{i}": "y" * 200 for i in range(200)})
    assert header_flood.status_code in (400, 431)
    assert get(a, "/health").status_code == 200  # still serving


_STORE_PARAMETERS = [
    "pubsubTopic",
    "contentTopics",
    "startTime",
    "endTime",
    "hashes",
    "cursor",
    "ascending",
    "pageSize",
    "includeData",
    "peerAddr",
    "unknown",
]
_NEAR_VALID = st.sampled_from(
    [
        PUBSUB_TOPIC,
        "/waku/2/rs/42/99999",
        CONTENT_TOPIC,
        "0x" + "ab" * 32,
        "ab" * 32,
        "0x" + "ab" * 33,
        "-1",
        "0",
        "101",
        "9223372036854775808",
        "true",
        "false",
        "",
        ",,,",
        "%00",
        "\u00e9\u4e2d",
    ]
)
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=40),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4),
    max_leaves=12,
)
_MESSAGE_FIELDS = st.fixed_dictionaries(
    {},
    optional={
        "payload": st.sampled_from(["aGk=", "", "@@", "aGk"]) | st.text(max_size=8),
        "contentTopic": st.sampled_from(["/rest/1/fuzz/proto", "", "x"]) | st.integers(),
        "version": st.integers(min_value=-2, max_value=2**33) | st.text(max_size=3),
        "timestamp": st.integers(min_value=-(2**64), max_value=2**64) | st.none(),
        "meta": st.sampled_from(["", "bWV0YQ==", "!"]),
        "ephemeral": st.booleans() | st.integers(),
        "proof": st.sampled_from(["", "cHJvb2Y="]),
    },
)


@settings(max_examples=150, deadline=None)
@given(params=st.dictionaries(st.sampled_from(_STORE_PARAMETERS), _NEAR_VALID | st.text(max_size=60), max_size=6))
def test_fuzzed_store_parameters_get_an_answer_never_a_server_error(nodes, params):
    a, _ = nodes
    answer = get(a, "/store/v3/messages", params=params)
    assert answer.status_code in (200, 400), (params, answer.status_code, answer.text)
    if answer.status_code == 400:
        assert answer.text and "\n" not in answer.text.strip() and "Traceback" not in answer.text
    else:
        jsonschema.validate(answer.json(), SCHEMAS["store"])


@settings(max_examples=150, deadline=None)
@given(
    body=_JSON
    | st.fixed_dictionaries({"pubsubTopic": st.sampled_from([PUBSUB_TOPIC, "", "x"]), "message": _MESSAGE_FIELDS})
)
def test_fuzzed_push_and_relay_bodies_are_refused_cleanly(nodes, body):
    a, _ = nodes
    pushed = post(a, "/lightpush/v3/message", body)
    assert pushed.status_code in (200, 400, 413, 420, 421), (body, pushed.status_code, pushed.text)
    assert set(pushed.json()) <= {"relayPeerCount", "statusDesc"}
    message = body.get("message") if isinstance(body, dict) else body
    relayed = post(a, "/relay/v1/messages/" + quote(PUBSUB_TOPIC, safe=""), message)
    assert relayed.status_code in (200, 400), (message, relayed.status_code, relayed.text)
