"""discv5 and peer exchange between go-waku and our nodes, cluster 16
shard 32.

Our node B runs discv5 (protocol id ``d5waku``) and serves peer exchange;
go-waku G runs discv5 bootstrapped from B's record and serves peer
exchange too (go-waku hands out what its discv5 found). Then:
- each finds the other by discv5 and they become relay peers;
- our node C, given only G as its peer-exchange node, learns B from G and
  relays with B.

go-waku's own peer-exchange requester (``--peer-exchange-node``, asked
once at its start) is not covered: given our node, it logs "retrieving
peer info via peer exchange protocol" and then neither reaches our
peer-exchange handler nor reports an error.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "node"))
from gowaku_node import GoWaku, wait_for  # noqa: E402
from our_node import RelayNode  # noqa: E402
from store_node_harness import node_config  # noqa: E402

from wakustore.node import discovery  # noqa: E402
from wakustore.node.store_protocols import RateLimits  # noqa: E402

pytestmark = pytest.mark.slow

CLUSTER_ID = 16
SHARDS = [32]
PUBSUB_TOPIC = f"/waku/2/rs/{CLUSTER_ID}/32"
OUR_RELAY = True
OUR_CONFIG = {"discv5_discovery": True, "discv5_udp_port": 0, "peer_exchange": True}
DISCOVERY_S = 60.0


def gowaku_start(binary, path, *flags, discv5=False) -> GoWaku:
    return GoWaku(
        binary, path, cluster_id=CLUSTER_ID, pubsub_topics=[PUBSUB_TOPIC], flags=list(flags), discv5=discv5
    ).start()


@pytest.fixture(scope="module")
def gowaku(gowaku_binary, ours, tmp_path_factory):
    """go-waku with discv5 from our node's record, serving peer exchange."""
    node = gowaku_start(
        gowaku_binary,
        tmp_path_factory.mktemp("gowaku"),
        f"--discv5-bootstrap-node={ours.enr.text}",
        "--peer-exchange",
        discv5=True,
    )
    yield node
    node.stop()


def relay_peer_ids(node) -> set[str]:
    return {str(p) for p in node.relay.peers}


def test_gowaku_and_our_node_find_each_other_by_discv5_and_relay(ours, gowaku):
    wait_for(lambda: gowaku.peer_id in relay_peer_ids(ours), "never relay peers", gowaku, DISCOVERY_S)
    # Our discv5 finds go-waku's record (kept for our peer exchange).
    wait_for(
        lambda: any(r.peer_id == gowaku.peer_id for r in ours.peer_exchange.records.sample(100)),
        "our discv5 never found go-waku's record",
        gowaku,
        DISCOVERY_S,
    )


def test_our_node_learns_a_relay_node_from_gowaku_by_peer_exchange(engine, ours, gowaku, tmp_path, monkeypatch):
    # go-waku hands out what its discv5 found (our node B), once its
    # discv5 iterator has filled its cache: C asks every 2 s, not 60.
    monkeypatch.setattr(discovery, "PEER_EXCHANGE_INTERVAL_S", 2.0)
    wait_for(lambda: gowaku.connected_to(ours.peer_id), "go-waku never found our node", gowaku, DISCOVERY_S)
    config = node_config(tmp_path / "c", cluster_id=CLUSTER_ID, shards=SHARDS, peer_exchange_nodes=[gowaku.multiaddr])
    c = RelayNode(config, engine, RateLimits.parse(["0/1s"])).start()
    try:
        wait_for(lambda: c.peer_id in relay_peer_ids(ours), "C never relayed with B", gowaku, DISCOVERY_S)
    finally:
        c.stop()
