"""discv5 between real nodes on loopback: five store nodes that know only
the first one's record find each other and relay together; a node of
another cluster is found but never relayed with."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import trio

from wakustore.node.discv5 import RoutingTable, udp_address
from wakustore.node.store_protocols import RateLimits
from wakustore.protocols import discv5, enr

sys.path.insert(0, str(Path(__file__).parent))
from store_node_harness import NodeThread, node_config  # noqa: E402
from test_js_waku_interop import INTEROP_DIR, node_binary  # noqa: E402, F401 (a fixture)

FOUND_TIMEOUT_S = 60.0


class RelayNode(NodeThread):
    with_relay = True


def _start(tmp_path_factory, engine, name: str, bootstrap: list[str], **overrides) -> RelayNode:
    config = node_config(
        tmp_path_factory.mktemp(name),
        discv5_discovery=True,
        discv5_udp_port=0,
        discv5_bootstrap_nodes=bootstrap,
        **overrides,
    )
    return RelayNode(config, engine, RateLimits.parse(["0/1s"])).start()


# Overlapping shards of cluster 42: the third and fourth nodes share none.
SHARDS = [[0, 5], [0, 5], [0], [5], [0, 5]]


@pytest.fixture(scope="module")
def network(engine, tmp_path_factory):
    first = _start(tmp_path_factory, engine, "d5-0", [], shards=SHARDS[0])
    nodes = [first]
    try:
        for i in range(1, 5):
            nodes.append(_start(tmp_path_factory, engine, f"d5-{i}", [first.enr.text], shards=SHARDS[i]))
        stranger = _start(tmp_path_factory, engine, "d5-other", [first.enr.text], cluster_id=43)
        nodes.append(stranger)
        for node in nodes:
            # Quicker rounds and give-ups than a real node's, for the kill below.
            node.relay.manager.round_s = 0.5
            node.relay.manager.backoff_first_s = 0.2
            node.relay.manager.max_failures = 2
        yield nodes[:5], stranger
    finally:
        for node in reversed(nodes):
            if node._thread.is_alive():
                node.stop()


def _relay_peers(node) -> set[str]:
    return {str(p) for p in node.relay.pubsub.peers}


def _linked(a, b) -> bool:
    return bool(set(SHARDS[a]) & set(SHARDS[b]))


def _wait(condition, what: str, timeout_s: float = FOUND_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.3)
    raise AssertionError(what)


def _expected_peers(nodes, i) -> set[str]:
    return {nodes[j].peer_id for j in range(len(nodes)) if j != i and _linked(i, j)}


def test_nodes_from_one_bootstrap_record_relay_with_the_nodes_of_their_shards(network):
    nodes, stranger = network
    _wait(
        lambda: all(_relay_peers(n) >= _expected_peers(nodes, i) for i, n in enumerate(nodes)),
        "the nodes never linked with every node of their shards",
    )
    for i, node in enumerate(nodes):
        # Only nodes sharing a shard: the third and fourth never link.
        assert _relay_peers(node) & {n.peer_id for n in nodes} == _expected_peers(nodes, i)
        assert stranger.peer_id not in _relay_peers(node)
        # Their records name the discv5 port they answer on.
        assert node.enr.udp == node.discv5._socket.getsockname()[1]
    assert nodes[2].peer_id not in _relay_peers(nodes[3])
    # The node of cluster 43 is in the first node's discv5 table, never a relay peer.
    assert nodes[0].discv5.table.get(discv5.node_id(stranger.enr.public_key)) is not None
    found = nodes[0].service.metrics.registry.get_sample_value(
        "wakustore_discovered_relay_peers_total", {"origin": "discv5", "outcome": "added"}
    )
    assert found is not None and found >= 4
    assert {origin for origin, _ in nodes[0].relay.manager.states()} == {"Discv5"}


def test_a_message_reaches_and_is_stored_by_every_node_of_its_shard_only(network):
    from wakustore.clients.store import StoreClient
    from wakustore.protocols.message import WakuMessage
    from wakustore.protocols.store_query import HistoryQuery

    nodes, stranger = network
    _wait(
        lambda: all(_relay_peers(n) >= _expected_peers(nodes, i) for i, n in enumerate(nodes)),
        "the nodes never linked",
    )
    topic = "/waku/2/rs/42/0"
    message = WakuMessage(b"to shard 0", "/d5/1/chat/proto", timestamp=time.time_ns())

    async def push():
        async with StoreClient.connect(nodes[2].tcp_addr) as client:
            answer = await client.push(topic, message)
            assert answer.status_code == 200

    trio.run(push)

    def stored(node) -> bool:
        async def ask():
            async with StoreClient.connect(node.tcp_addr) as client:
                page = await client.query(
                    HistoryQuery(pubsub_topic=topic, content_topics=("/d5/1/chat/proto",), include_data=False)
                )
                return len(page.messages) == 1

        return trio.run(ask)

    on_shard = [n for i, n in enumerate(nodes) if 0 in SHARDS[i]]
    _wait(lambda: all(stored(n) for n in on_shard), "a node of shard 0 did not store the message", 20)
    assert not stored(nodes[3]) and not stored(stranger)


def test_a_killed_node_is_forgotten_and_a_new_one_takes_its_place(network, engine, tmp_path_factory):
    nodes, _ = network
    _wait(
        lambda: all(_relay_peers(n) >= _expected_peers(nodes, i) for i, n in enumerate(nodes)),
        "the nodes never linked",
    )
    killed = nodes[1]
    killed.stop()
    survivors = [n for n in nodes if n is not killed]
    _wait(
        lambda: all(killed.peer_id not in {str(p) for p in n.relay.manager.candidates} for n in survivors),
        "the killed node was never forgotten",
    )
    newcomer = _start(tmp_path_factory, engine, "d5-new", [nodes[0].enr.text], shards=[0, 5])
    try:
        _wait(
            lambda: all(newcomer.peer_id in _relay_peers(n) for n in survivors),
            "the new node did not take the killed one's place",
        )
        forgotten = sum(n.relay.manager.forgotten["unreachable"] for n in survivors)
        assert forgotten >= 1
    finally:
        newcomer.stop()


def test_a_stray_packet_does_not_disturb_a_node(network):
    nodes, _ = network
    node = nodes[0]
    before = node.discv5.dropped["invalid"]

    async def send():
        sock = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_DGRAM)
        address = udp_address(node.enr)
        for payload in (b"\x00" * 70, b"x" * 2000, bytes(16) + b"\x01" * 100):
            await sock.sendto(payload, address)
        sock.close()

    trio.run(send)
    deadline = time.monotonic() + 10
    while (
        node.discv5.dropped["invalid"] + node.discv5.dropped["too_large"] < before + 3 and time.monotonic() < deadline
    ):
        time.sleep(0.1)
    assert node.discv5.dropped["invalid"] >= before + 2 and node.discv5.dropped["too_large"] >= 1
    assert len(node.discv5.table) >= 4  # still serving


def test_routing_table_buckets_are_bounded_and_keep_the_newest_record():
    from coincurve import PrivateKey

    local = discv5.node_id(PrivateKey().public_key.format())
    table = RoutingTable(local, bucket_size=2)
    keys = [PrivateKey().secret for _ in range(200)]
    records = [enr.encode(key, 1, {"ip": bytes(4), "udp": 1}) for key in keys]
    for record in records:
        table.add(record)
    by_distance: dict[int, int] = {}
    for record in records:
        distance = discv5.log_distance(local, discv5.node_id(record.public_key))
        by_distance[distance] = by_distance.get(distance, 0) + 1
    assert len(table) == sum(min(2, n) for n in by_distance.values())
    index = next(i for i, r in enumerate(records) if table.get(discv5.node_id(r.public_key)) is not None)
    kept = records[index]
    assert table.closest(discv5.node_id(kept.public_key), 1) == [kept]
    # A newer record of the same node replaces it; an older one does not.
    newer = enr.encode(keys[index], 2, {"ip": bytes([10, 0, 0, 1]), "udp": 2})
    assert table.add(newer) and table.get(discv5.node_id(kept.public_key)) == newer
    assert not table.add(kept) and table.get(discv5.node_id(kept.public_key)) == newer


@pytest.mark.slow
def test_chainsafe_discv5_on_d5waku_finds_our_nodes_and_ours_handshake_with_it(network, node_binary):  # noqa: F811
    """@chainsafe/discv5 11 (tests/interop/discv5_node.mjs, protocol id
    d5waku) bootstrapped from our first node: its lookups find our other
    nodes through ours; our nodes handshake with it as initiator and as
    recipient."""
    nodes, _ = network
    process = subprocess.Popen(
        [
            str(node_binary),
            str(INTEROP_DIR / "discv5_node.mjs"),
            "--bootnode",
            nodes[0].enr.text,
            "--lookup",
            "--want",
            str(len(nodes)),
            "--seconds",
            "40",
        ],
        cwd=INTEROP_DIR,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        lines = _json_lines(process)
        started = next(lines)
        theirs = enr.decode(started["enr"])
        found = next(line for line in lines if "found" in line)["found"]
        ours = {node.enr.text for node in nodes}
        # Our first node answered its FINDNODEs with the records of the others.
        assert len(ours & set(found)) >= 3, found
        # It learned their record from the handshake they began.
        assert nodes[0].discv5.table.get(discv5.node_id(theirs.public_key)) is not None
        # One of ours begins a handshake with it and gets its PONG.
        pong = trio.from_thread.run(nodes[4].discv5.ping, theirs, trio_token=nodes[4]._token)
        assert pong.kind == discv5.PONG and pong.fields[0] == theirs.seq
    finally:
        process.kill()
        process.wait()


def _json_lines(process):
    for line in process.stdout:
        if line.startswith("{"):
            yield json.loads(line)
    raise AssertionError(f"discv5_node.mjs ended: {process.stderr.read()[-2000:]}")


def test_enr_auto_update_follows_the_address_three_peers_agree_on():
    from coincurve import PrivateKey

    from wakustore.node.discv5 import Discv5Node

    key = PrivateKey().secret
    record = enr.encode(key, 1, {"ip": bytes([127, 0, 0, 1]), "udp": 9000})
    seen: list[tuple[str, int]] = []
    node = Discv5Node(key, lambda: record, on_external=lambda ip, port: seen.append((ip, port)))

    def pong_from(peer: int, ip: str, port: int) -> None:
        node._vote(bytes([peer]) * 32, discv5.pong(b"\x01", 1, ip, port))

    pong_from(1, "203.0.113.7", 9000)
    pong_from(2, "203.0.113.7", 9000)
    pong_from(2, "198.51.100.1", 9000)  # a peer changes its mind: one vote each
    assert seen == []
    pong_from(3, "203.0.113.7", 9000)
    pong_from(4, "203.0.113.7", 9000)
    assert seen[-1] == ("203.0.113.7", 9000)
    # Peers seeing the address the record already names change nothing.
    seen.clear()
    record = enr.encode(key, 2, {"ip": bytes([203, 0, 113, 7]), "udp": 9000})
    pong_from(5, "203.0.113.7", 9000)
    assert seen == []
