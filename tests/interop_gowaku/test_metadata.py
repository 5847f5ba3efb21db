"""66/WAKU2-METADATA between go-waku and our node: a peer on another
cluster is dropped, by either side.

go-waku asks every peer that connects for its metadata and disconnects one
on another cluster, but only when it has a cluster id itself (cluster 0
checks nothing: waku/v2/protocol/metadata ``Connected``). nwaku asks every
peer that joins (``onPeerMetadata``, waku/node/peer_manager/peer_manager.nim)
and disconnects one that reports another cluster, none, or (a relay peer)
no shard in common. Ours does the same for each relay peer, whichever side
dialed, and for each peer whose own metadata request names another
cluster; a peer that does not serve metadata is kept (nwaku drops it too),
so that our own clients and tools, which do not, keep working.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gowaku_node import GoWaku, wait_for  # noqa: E402

from wakustore.node.relay import MetadataRefused  # noqa: E402
from wakustore.transport.peers import parse_peer  # noqa: E402

pytestmark = pytest.mark.slow

CLUSTER_ID = 16
SHARDS = [32]
OUR_RELAY = True
HOLD_S = 3.0


def connections(ours, peer_id: str) -> int:
    network = ours.host.get_network()
    return sum(len(conns) for pid, conns in network.get_connections_map().items() if str(pid) == peer_id)


def start(binary, path, cluster_id: int, shard: int, *flags: str) -> GoWaku:
    return GoWaku(
        binary, path, cluster_id=cluster_id, pubsub_topics=[f"/waku/2/rs/{cluster_id}/{shard}"], flags=list(flags)
    ).start()


def dial_from_ours(ours, gowaku: GoWaku) -> BaseException | None:
    """Our relay dials go-waku, as it dials a discovered peer; returns
    what the dial raised."""

    async def dial():
        try:
            with trio.fail_after(10):
                await ours.relay.dial(parse_peer(gowaku.multiaddr))
        except BaseException as exc:  # noqa: BLE001 (what it raised is the answer)
            return exc
        return None

    return trio.from_thread.run(dial, trio_token=ours._token)


def stays_apart(ours, gowaku: GoWaku) -> None:
    """Neither side holds a connection to the other for HOLD_S seconds."""
    wait_for(
        lambda: connections(ours, gowaku.peer_id) == 0 and not gowaku.connected_to(ours.peer_id),
        "still connected",
        gowaku,
    )
    until = time.monotonic() + HOLD_S
    while time.monotonic() < until:
        assert connections(ours, gowaku.peer_id) == 0, "reconnected"
        time.sleep(0.2)


@pytest.mark.parametrize("cluster_id", [1, 0])
def test_gowaku_on_another_cluster_dialing_us_is_dropped(ours, gowaku_binary, tmp_path, cluster_id):
    """Cluster 1: go-waku drops us, and we drop it for its metadata request.
    Cluster 0: go-waku checks nothing; we drop it once it joins our relay."""
    other = start(gowaku_binary, tmp_path, cluster_id, 32, f"--staticnode={ours.tcp_addr}")
    try:
        stays_apart(ours, other)
        if cluster_id:
            assert "different clusterID reported" in other.log_text()
    finally:
        other.stop()


@pytest.mark.parametrize("cluster_id", [1, 0])
def test_we_dial_gowaku_on_another_cluster_and_are_dropped_or_drop_it(ours, gowaku_binary, tmp_path, cluster_id):
    """Cluster 1: go-waku drops us as we connect (before or after our
    router's stream: our dial may end either way). Cluster 0: our dial
    fails on its metadata."""
    other = start(gowaku_binary, tmp_path, cluster_id, 32)
    try:
        refused = dial_from_ours(ours, other)
        stays_apart(ours, other)
    finally:
        other.stop()
    if cluster_id:
        assert refused is None or isinstance(refused, Exception), refused
    else:
        assert isinstance(refused, MetadataRefused), refused
