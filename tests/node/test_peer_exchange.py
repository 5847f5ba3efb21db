"""Peer exchange, the service side (node/peer_exchange.py): what an answer
holds, the status codes of nwaku, and js-waku's own peer-exchange discovery
learning from our node a relay node that DNS discovery found."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from wakustore.node.peer_exchange import PeerExchangeService, PeerRecords
from wakustore.node.rate_limits import RateLimit
from wakustore.node.store_protocols import RateLimits
from wakustore.protocols import enr, peer_exchange
from wakustore.protocols.dns_discovery import build_tree

sys.path.insert(0, str(Path(__file__).resolve().parent))
from name_server import DOMAIN, TREE_KEY, NameServer  # noqa: E402
from store_node_harness import CLUSTER_ID, SHARDS, NodeThread, node_config  # noqa: E402

INTEROP_DIR = Path(__file__).resolve().parents[1] / "interop"
NODE_BIN = INTEROP_DIR / "node_modules" / ".bin" / "node"


def _records(count: int) -> list[enr.Enr]:
    return [
        enr.waku_record(
            bytes([i] * 32),
            1,
            capabilities=enr.Capability.RELAY,
            cluster=CLUSTER_ID,
            shards=list(SHARDS),
            ip="127.0.0.1",
            tcp=61000 + i,
        )
        for i in range(1, count + 1)
    ]


def test_an_answer_holds_what_was_asked_for_never_the_asker_and_says_why_when_empty():
    records = PeerRecords(capacity=5)
    known = _records(7)
    for record in known:
        records.add(record)
    assert len(records) == 5  # the oldest two left
    service = PeerExchangeService(records, RateLimit(3, 60.0))
    asker = known[3].peer_id
    answer = peer_exchange.decode_response(service.answer(asker, peer_exchange.encode_request(60)))
    names = {enr.decode(raw).peer_id for raw in answer.enrs}
    assert answer.status_code == 200 and names == {r.peer_id for r in known[2:]} - {asker}
    two = peer_exchange.decode_response(service.answer("other", peer_exchange.encode_request(2)))
    assert len(two.enrs) == 2
    bad = peer_exchange.decode_response(service.answer("third", b"\xff\xff"))
    assert bad.status_code == 400
    # The first asker's fourth request within the minute is refused.
    for _ in range(2):
        service.answer(asker, peer_exchange.encode_request(1))
    limited = peer_exchange.decode_response(service.answer(asker, peer_exchange.encode_request(1)))
    assert limited.status_code == 429 and limited.enrs == ()
    empty = PeerExchangeService(PeerRecords())
    nothing = peer_exchange.decode_response(empty.answer("x", peer_exchange.encode_request(5)))
    assert nothing.status_code == 503 and nothing.enrs == ()


class RelayNode(NodeThread):
    with_relay = True


UNLIMITED = RateLimits.parse(["0/1s"])


@contextmanager
def _exchange_node_knowing_b(engine, tmp_path):
    """(A, B): B a relay node; A serves peer exchange and found B in a tree
    a name server of the test serves."""
    b = RelayNode(node_config(tmp_path / "b"), engine, UNLIMITED).start()
    try:
        url, tree = build_tree(TREE_KEY, DOMAIN, [b.enr.text], [], seq=1)
        with NameServer(tree) as server:
            config = node_config(
                tmp_path / "a",
                peer_exchange=True,
                dns_discovery_urls=[url],
                dns_discovery_name_servers=[f"127.0.0.1:{server.port}"],
            )
            a = RelayNode(config, engine, UNLIMITED).start()
            try:
                _wait(lambda: len(a.peer_exchange.records) >= 1, "A never read B's record from the tree")
                yield a, b
            finally:
                a.stop()
    finally:
        b.stop()


@pytest.mark.slow
def test_js_waku_learns_from_our_node_a_relay_node_that_dns_discovery_found(engine, tmp_path):
    if not NODE_BIN.exists():
        pytest.fail(f"{NODE_BIN} is missing: the js-waku interop tests install it (npm ci in tests/interop)")
    with _exchange_node_knowing_b(engine, tmp_path) as (a, b):
        config = {"peer": a.tcp_addr, "clusterId": CLUSTER_ID, "timeoutMs": 30000}
        result = subprocess.run(
            [str(NODE_BIN), str(INTEROP_DIR / "px_discover.mjs"), json.dumps(config)],
            cwd=INTEROP_DIR,
            capture_output=True,
            text=True,
            timeout=60,
        )
    events = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert result.returncode == 0, (events, result.stderr[-2000:])
    found = [e for e in events if e["event"] == "discovered"]
    assert found and found[0]["peerId"] == b.peer_id
    assert any(addr.startswith("/ip4/127.0.0.1/tcp/") for addr in found[0]["multiaddrs"])


def test_a_node_given_only_a_peer_exchange_node_finds_relay_peers_through_it(engine, tmp_path):
    """A knows B from its tree; C, given only A as its peer-exchange node,
    asks A and relays with B."""
    with _exchange_node_knowing_b(engine, tmp_path) as (a, b):
        c = RelayNode(node_config(tmp_path / "c", peer_exchange_nodes=[a.tcp_addr]), engine, UNLIMITED).start()
        try:
            _wait(lambda: c.peer_id in {str(p) for p in b.relay.peers}, "C never relayed with B")
            assert a.peer_exchange.answered >= 1
        finally:
            c.stop()


def _wait(condition, what: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)
