"""DNS discovery (EIP-1459) end to end on loopback: a name server of the
test's serves a tree it signed, holding node A's record; node B, given
only the tree's URL and that name server, finds A, relays with it and
stores what A relays. And which records make relay peers."""

from __future__ import annotations

import socket
import sys
import time
from pathlib import Path

import pytest
import trio

from wakustore.clients.store import StoreClient
from wakustore.node.discovery import relay_records
from wakustore.node.store_protocols import RateLimits
from wakustore.protocols import enr
from wakustore.protocols.dns_discovery import build_tree
from wakustore.protocols.message import WakuMessage, message_hash
from wakustore.protocols.store_query import HistoryQuery
from wakustore.transport.dns import parse_name_server, resolve_txt, walk_tree

sys.path.insert(0, str(Path(__file__).resolve().parent))
from name_server import DOMAIN, TREE_KEY, NameServer  # noqa: E402
from store_node_harness import CLUSTER_ID, PUBSUB_TOPIC, SHARDS, NodeThread, node_config  # noqa: E402

TIMEOUT_S = 20.0


def _record(key: bytes, *, relay: bool = True, cluster: int = CLUSTER_ID, shards=SHARDS, port: int = 60000) -> str:
    caps = enr.Capability.STORE | (enr.Capability.RELAY if relay else enr.Capability(0))
    return enr.waku_record(
        key, 1, capabilities=caps, cluster=cluster, shards=list(shards), ip="127.0.0.1", tcp=port
    ).text


def test_relay_nodes_of_our_cluster_and_shards_only_become_relay_peers(tmp_path):
    config = node_config(tmp_path)
    ours = enr.decode(_record(bytes([9] * 32)))
    records = [
        _record(bytes([1] * 32)),  # kept
        _record(bytes([2] * 32), relay=False),  # a store without relay
        _record(bytes([3] * 32), cluster=CLUSTER_ID + 1),  # another cluster
        _record(bytes([4] * 32), shards=[max(SHARDS) + 7]),  # no shared shard
        ours.text,  # ourselves
        "enr:garbage",
    ]
    found = relay_records(records, config, ours.peer_id)
    assert [r.raw for r in found] == [enr.decode(records[0]).raw]


def test_a_tree_is_read_through_the_name_server_and_a_bad_one_stops(tmp_path):
    texts = [_record(bytes([i] * 32), port=60000 + i) for i in range(1, 31)]
    url, records = build_tree(TREE_KEY, DOMAIN, texts, [], seq=3)
    with NameServer(records) as server:
        servers = [f"127.0.0.1:{server.port}"]
        walk = trio.run(walk_tree, url, servers)
        assert walk.complete and sorted(walk.enrs) == sorted(texts)
        assert trio.run(resolve_txt, "missing." + DOMAIN, servers) == []
        # A tree signed by another key than the URL names is refused.
        other_url, _ = build_tree(bytes(range(80, 112)), DOMAIN, texts, [], seq=3)
        bad = trio.run(walk_tree, other_url, servers)
        assert bad.error is not None and bad.enrs == []
    assert parse_name_server("127.0.0.1:5353") == ("127.0.0.1", 5353)
    assert parse_name_server("[::1]:53") == ("::1", 53) and parse_name_server("ns.example.org") is None


class RelayNode(NodeThread):
    with_relay = True


@pytest.fixture
def tree_and_nodes(engine, tmp_path):
    unlimited = RateLimits.parse(["0/1s"])
    a = RelayNode(node_config(tmp_path / "a"), engine, unlimited).start()
    try:
        url, records = build_tree(TREE_KEY, DOMAIN, [a.enr.text], [], seq=1)
        with NameServer(records) as server:
            b = RelayNode(
                node_config(
                    tmp_path / "b", dns_discovery_urls=[url], dns_discovery_name_servers=[f"127.0.0.1:{server.port}"]
                ),
                engine,
                unlimited,
            ).start()
            try:
                yield a, b, server
            finally:
                b.stop()
    finally:
        a.stop()


def test_a_node_given_only_a_tree_finds_its_relay_peer_and_stores_what_it_relays(tree_and_nodes):
    a, b, server = tree_and_nodes
    deadline = time.monotonic() + TIMEOUT_S
    while a.relay.peer_count(PUBSUB_TOPIC) < 1:
        assert time.monotonic() < deadline, f"B never joined A's relay mesh (questions: {server.questions})"
        time.sleep(0.1)
    assert DOMAIN in server.questions
    # Counted by origin, and /health names no served topic without a relay peer.
    sample = b.service.metrics.registry.get_sample_value
    assert sample("wakustore_discovered_relay_peers_total", {"origin": "dns", "outcome": "added"}) == 1
    assert sample("wakustore_discovery_rounds_total", {"origin": "dns", "outcome": "ok"}) >= 1
    health = b.service.health()
    assert health["relay"]["peers"][PUBSUB_TOPIC] >= 1 and PUBSUB_TOPIC not in health["relay"]["topics_without_peers"]
    message = WakuMessage(payload=b"found by DNS", content_topic="/discovery/1/test/proto", timestamp=time.time_ns())

    async def push_and_find() -> bool:
        async with StoreClient.connect(a.tcp_addr) as client:
            pushed = await client.push(PUBSUB_TOPIC, message)
            assert pushed.status_code == 200, pushed
        digest = message_hash(PUBSUB_TOPIC, message)
        query = HistoryQuery(message_hashes=(digest,))
        with trio.move_on_after(TIMEOUT_S):
            while True:
                async with StoreClient.connect(b.tcp_addr) as client:
                    if any(m.message_hash == digest for m in (await client.query(query)).messages):
                        return True
                await trio.sleep(0.3)
        return False

    assert trio.run(push_and_find)


def test_a_silent_name_server_is_one_lookup_error_not_a_hang():
    from wakustore.transport.dns import DnsLookupError

    silent = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    silent.bind(("127.0.0.1", 0))  # bound, never answers
    try:
        url, _ = build_tree(TREE_KEY, DOMAIN, [_record(bytes([5] * 32))], [], seq=1)
        with pytest.raises(DnsLookupError):
            trio.run(lambda: walk_tree(url, [f"127.0.0.1:{silent.getsockname()[1]}"], 0.5))
    finally:
        silent.close()
