"""EIP-1459 DNS discovery between go-waku and our node, cluster 16 shard 32.

One tree, signed by the test and served by its name server, lists a
go-waku node's record (its own, from its REST API) and our node's. Our
node reads the tree (``--dns-discovery-url``, ``--dns-discovery-name-server``)
and relays with go-waku; a second go-waku started with
``--dns-discovery --dns-discovery-url`` reads the same tree at its start
(go-ethereum's dnsdisc client: our tree's signature and entries, our
record's keys) and connects to our node. Neither node knows the other any
other way: no static peers, no discv5, no peer exchange.

go-waku asks its name server on port 53 only (waku/v2/dnsdisc/resolver.go
joins ``--dns-discovery-name-server`` with "53"), so the test's name server
listens on port 53 of a loopback address of its own; our node is given the
same ``host:port``. go-waku reads its trees once, at its start; nwaku and
our node read them again every 30 minutes (here every second, so that our
node finds the tree the test publishes once both records are known).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "node"))
from gowaku_node import GoWaku, wait_for  # noqa: E402
from name_server import DOMAIN, TREE_KEY, NameServer  # noqa: E402
from our_node import RelayNode  # noqa: E402
from store_node_harness import node_config  # noqa: E402

from wakustore.node import discovery  # noqa: E402
from wakustore.node.store_protocols import RateLimits  # noqa: E402
from wakustore.protocols.dns_discovery import build_tree  # noqa: E402

pytestmark = pytest.mark.slow

CLUSTER_ID = 16
SHARDS = [32]
PUBSUB_TOPIC = f"/waku/2/rs/{CLUSTER_ID}/32"
DISCOVERY_S = 60.0
# The tree's URL names its key and domain only: known before its records.
URL, _ = build_tree(TREE_KEY, DOMAIN, [], [], seq=0)


@pytest.fixture(scope="module")
def name_server():
    with NameServer.on_port_53({}) as server:
        yield server


@pytest.fixture(scope="module")
def ours(engine, name_server, tmp_path_factory):
    """Our relay node, reading the tree every second from the start (no
    tree is published yet)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(discovery, "DNS_DISCOVERY_INTERVAL_S", 1.0)
        config = node_config(
            tmp_path_factory.mktemp("ours"),
            cluster_id=CLUSTER_ID,
            shards=SHARDS,
            dns_discovery_urls=[URL],
            dns_discovery_name_servers=[name_server.address],
        )
        node = RelayNode(config, engine, RateLimits.parse(["0/1s"])).start()
        try:
            yield node
        finally:
            node.stop()


def gowaku_start(binary, path, *flags) -> GoWaku:
    return GoWaku(binary, path, cluster_id=CLUSTER_ID, pubsub_topics=[PUBSUB_TOPIC], flags=list(flags)).start()


@pytest.fixture(scope="module")
def listed(gowaku_binary, ours, name_server, tmp_path_factory):
    """go-waku, told of nobody; then the tree of its record and ours."""
    node = gowaku_start(gowaku_binary, tmp_path_factory.mktemp("gowaku"))
    try:
        _, records = build_tree(TREE_KEY, DOMAIN, [node.enr, ours.enr.text], [], seq=1)
        name_server.records = records
        yield node
    finally:
        node.stop()


def relay_peer_ids(node) -> set[str]:
    return {str(p) for p in node.relay.peers}


def test_our_node_finds_gowaku_in_the_tree_and_relays_with_it(ours, listed, name_server):
    sample = ours.service.metrics.registry.get_sample_value
    # Our node dialed go-waku (nobody told go-waku of us), its record the
    # only one new to the relay (ours is left out).
    wait_for(
        lambda: sample("wakustore_relay_dials_total", {"origin": "Dns", "outcome": "connected"}) == 1,
        "our node never dialed go-waku from the tree",
        listed,
        DISCOVERY_S,
    )
    assert sample("wakustore_discovered_relay_peers_total", {"origin": "dns", "outcome": "added"}) == 1
    wait_for(lambda: listed.peer_id in relay_peer_ids(ours), "our node never relayed with go-waku", listed, DISCOVERY_S)
    assert listed.connected_to(ours.peer_id)
    assert DOMAIN in name_server.questions


def test_gowaku_started_with_the_tree_finds_and_connects_to_our_node(
    gowaku_binary, ours, listed, name_server, tmp_path
):
    asked = len(name_server.questions)
    reader = gowaku_start(
        gowaku_binary,
        tmp_path / "reader",
        "--dns-discovery",
        f"--dns-discovery-url={URL}",
        f"--dns-discovery-name-server={name_server.host}",
    )
    try:
        wait_for(lambda: reader.connected_to(ours.peer_id), "go-waku never connected to our node", reader, DISCOVERY_S)
        wait_for(lambda: reader.peer_id in relay_peer_ids(ours), "go-waku never relayed with us", reader, DISCOVERY_S)
        # What go-waku logged it found: both nodes of the tree.
        found = [line for line in reader.log_text().splitlines() if "found dns entries" in line]
        assert found and ours.peer_id in found[0] and listed.peer_id in found[0], found
        assert len(name_server.questions) > asked
    finally:
        reader.stop()
