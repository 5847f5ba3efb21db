"""Hostile peers against a real node over loopback TCP.

Every 127.0.0.0/8 address reaches this machine, so clients bound to
127.0.0.2, 127.0.0.3, ... play distinct remote hosts. Each test drives one
cap with real connections and streams (fresh keys each time, which is
what costs an attacker nothing), checks that it holds, that a
well-behaved client still gets its answers, and that what the node holds
(connections, streams, tracked addresses) is back to where it started.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import psutil
import pytest
import trio

from wakustore.node.rate_limits import (
    PeerAndAddressBuckets,
    RateLimit,
    RateLimits,
    address_key,
)
from wakustore.protocols import store_v3
from wakustore.protocols.store_query import HistoryQuery

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hostile_peers import client_from, is_closed_by_peer, stalling_socket, tcp_port, try_client  # noqa: E402
from store_node_harness import PUBSUB_TOPIC, NodeThread, node_config  # noqa: E402

QUERY = HistoryQuery(pubsub_topic=PUBSUB_TOPIC, content_topics=("/hostile/1/x/proto",))
WAIT_S = 20.0
# What a few hundred connections may leave behind in this process (node
# and clients share it): caches warm up, nothing per connection stays.
RSS_SLACK = 80 * 1024 * 1024


def wait_for(condition, what: str, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(what)


def rss() -> int:
    return psutil.Process().memory_info().rss


def settled(node: NodeThread) -> bool:
    snap = node.gatekeeper.snapshot()
    return (snap["connections"], snap["handshakes"], snap["streams"], snap["idle_streams"],
            snap["in_flight"], snap["addresses"]) == (0, 0, 0, 0, 0, 0)


async def one_query(client):
    return (await client.query(QUERY)).status_code


@pytest.fixture
def start_node(engine, tmp_path):
    started = []

    def start(rate_limits: RateLimits = RateLimits.parse(["0/1s"]), protocol_options=None, **config):
        node = NodeThread(node_config(tmp_path / f"node{len(started)}", **config), engine, rate_limits,
                          **(protocol_options or {})).start()
        started.append(node)
        return node

    yield start
    for node in started:
        node.stop()


# --- connections -----------------------------------------------------------------


@pytest.mark.slow
def test_hundreds_of_fresh_keys_meet_the_per_address_and_total_caps(start_node):
    node = start_node(max_connections=12, ip_colocation_limit=3)
    peer = node.tcp_addr
    before = rss()

    async def scenario():
        results: dict[str, list] = {}
        held = trio.Event()

        async def hold(source: str):
            # Connect, answer one query, stay connected until told.
            try:
                async with client_from(source, peer) as client:
                    results.setdefault(source, []).append(await one_query(client))
                    await held.wait()
            except BaseException as exc:
                if isinstance(exc, trio.Cancelled):
                    raise
                results.setdefault(source, []).append("refused")

        async with trio.open_nursery() as nursery:
            # Eight fresh keys from one address: three get in.
            for _ in range(8):
                nursery.start_soon(hold, "127.0.0.2")
            with trio.fail_after(WAIT_S):
                while sum(len(v) for v in results.values()) < 8:
                    await trio.sleep(0.05)
            # Three from each of four more addresses: nine more fit under the
            # total of twelve, the other three are refused.
            for i in range(3, 7):
                for _ in range(3):
                    nursery.start_soon(hold, f"127.0.0.{i}")
            with trio.fail_after(WAIT_S):
                while sum(len(v) for v in results.values()) < 20:
                    await trio.sleep(0.05)
            held.set()
        return results

    results = trio.run(scenario)
    one_address = results["127.0.0.2"]
    assert sorted(one_address, key=str) == [200] * 3 + ["refused"] * 5, one_address
    others = [r for i in range(3, 7) for r in results[f"127.0.0.{i}"]]
    assert others.count(200) == 9 and others.count("refused") == 3, results
    refused = node.gatekeeper.refused
    assert refused["ip_colocation"] >= 5 and refused["max_connections"] >= 3, refused

    # Hundreds of connections in turn, fresh keys, four addresses at a time:
    # every slot comes back when its connection closes (py-libp2p's own
    # limiter kept them until the node stopped).
    async def churn():
        statuses = []

        async def one(source: str):
            statuses.append((await try_client(source, peer, one_query))[1])

        for round_ in range(50):
            async with trio.open_nursery() as nursery:
                for i in range(4):
                    nursery.start_soon(one, f"127.0.1.{i + 1}")
            # The node notices each close on its own time; let it.
            with trio.fail_after(WAIT_S):
                while node.gatekeeper.connections > 8:
                    await trio.sleep(0.02)
        return statuses

    statuses = trio.run(churn)
    assert statuses.count(200) == len(statuses) == 200, [s for s in statuses if s != 200][:3]
    wait_for(lambda: settled(node), f"the node still holds {node.gatekeeper.snapshot()}")
    assert rss() - before < RSS_SLACK
    assert trio.run(try_client, "127.0.0.1", peer, one_query) == ("ok", 200)


def test_handshakes_in_progress_are_capped_before_any_noise_work(start_node):
    node = start_node(max_handshakes=3, ip_colocation_limit=0)
    port = tcp_port(node.tcp_addr)
    stalled = [stalling_socket(f"127.0.2.{i + 1}", port) for i in range(5)]
    try:
        wait_for(lambda: node.gatekeeper.handshakes == 3 and node.gatekeeper.refused["max_handshakes"] == 2,
                 f"handshakes not capped: {node.gatekeeper.snapshot()}")
        # The two past the cap were closed at once, without a handshake.
        assert sum(is_closed_by_peer(s, wait_s=1.0) for s in stalled[3:]) == 2
        assert trio.run(try_client, "127.0.0.9", node.tcp_addr, one_query)[0] == "refused"
    finally:
        for sock in stalled:
            sock.close()
    wait_for(lambda: node.gatekeeper.handshakes == 0, "stalled handshakes were never released")
    assert trio.run(try_client, "127.0.0.9", node.tcp_addr, one_query) == ("ok", 200)
    wait_for(lambda: settled(node), f"the node still holds {node.gatekeeper.snapshot()}")


# --- streams ---------------------------------------------------------------------


async def open_streams(client, protocol: str, count: int) -> list:
    from libp2p.custom_types import TProtocol

    streams = []
    for _ in range(count):
        try:
            stream = await client.host.new_stream(client.peer_id, [TProtocol(protocol)])
        except Exception:  # reset by the node during negotiation
            continue
        streams.append(stream)
    return streams


def test_streams_opened_and_never_written_are_capped_and_good_streams_still_work(start_node):
    node = start_node(max_idle_streams_per_connection=3)

    async def scenario():
        async with client_from("127.0.0.2", node.tcp_addr) as client:
            hoarded = await open_streams(client, store_v3.PROTOCOL_ID, 10)
            with trio.fail_after(WAIT_S):
                while node.gatekeeper.refused["idle_streams"] < 7:
                    await trio.sleep(0.05)
            idle = node.gatekeeper.snapshot()["idle_streams"]
            # A request on the same connection is answered; it resets one
            # more of the hoarded streams to get in.
            status = await one_query(client)
            for stream in hoarded:
                await stream.reset()
            return idle, status

    idle, status = trio.run(scenario)
    assert idle == 3 and status == 200
    wait_for(lambda: settled(node), f"the node still holds {node.gatekeeper.snapshot()}")


def test_streams_per_connection_are_capped(start_node):
    node = start_node(max_streams_per_connection=4, max_idle_streams_per_connection=100)

    async def scenario():
        async with client_from("127.0.0.2", node.tcp_addr) as client:
            hoarded = await open_streams(client, store_v3.PROTOCOL_ID, 9)
            assert len(hoarded) == 4
            with trio.fail_after(WAIT_S):
                while node.gatekeeper.refused["max_streams"] < 9 - 4:
                    await trio.sleep(0.05)
            held = node.gatekeeper.snapshot()["streams"]
            for stream in hoarded:
                await stream.reset()
            with trio.fail_after(WAIT_S):
                while node.gatekeeper.snapshot()["streams"]:
                    await trio.sleep(0.05)
            return held, await one_query(client)

    held, status = trio.run(scenario)
    # The gossipsub, identify and ping streams count too; a node without
    # relay has none open here.
    assert held == 4 and status == 200
    wait_for(lambda: settled(node), f"the node still holds {node.gatekeeper.snapshot()}")


def test_requests_in_flight_per_protocol_are_capped(start_node):
    node = start_node(max_requests_in_flight=2)

    async def scenario():
        from libp2p.custom_types import TProtocol

        async with client_from("127.0.0.2", node.tcp_addr) as client:
            stalled = []
            for _ in range(4):
                stream = await client.host.new_stream(client.peer_id, [TProtocol(store_v3.PROTOCOL_ID)])
                await stream.write(b"\x80")  # the first byte of a length prefix, and no more
                stalled.append(stream)
            with trio.fail_after(WAIT_S):
                while node.gatekeeper.refused["in_flight"] < 2:
                    await trio.sleep(0.05)
            in_flight = node.gatekeeper.snapshot()["in_flight"]
            for stream in stalled:
                await stream.reset()
            with trio.fail_after(WAIT_S):
                while node.gatekeeper.snapshot()["in_flight"]:
                    await trio.sleep(0.05)
            return in_flight, await one_query(client)

    in_flight, status = trio.run(scenario)
    assert in_flight == 2 and status == 200
    wait_for(lambda: settled(node), f"the node still holds {node.gatekeeper.snapshot()}")


def test_a_request_has_a_deadline_once_its_first_byte_is_in(start_node):
    # The frame deadline is pushed far out: only the whole-request deadline can end this.
    node = start_node(request_timeout_s=1.0, protocol_options={"read_timeout_s": 120.0})

    async def scenario():
        from libp2p.custom_types import TProtocol

        async with client_from("127.0.0.2", node.tcp_addr) as client:
            stream = await client.host.new_stream(client.peer_id, [TProtocol(store_v3.PROTOCOL_ID)])
            started = time.monotonic()
            await stream.write(b"\x80")
            with trio.fail_after(WAIT_S):
                while True:
                    try:
                        if await stream.read(1) in (b"", None):
                            break
                    except Exception:
                        break
            return time.monotonic() - started, await one_query(client)

    waited, status = trio.run(scenario)
    assert waited < 10.0 and status == 200
    assert node.gatekeeper.refused["request_timeout"] == 1


# --- rate limits -----------------------------------------------------------------


def test_key_rotating_queries_from_one_address_get_429(start_node):
    node = start_node(rate_limits=RateLimits.parse(["store:5/1h"]))

    async def scenario():
        rotating = [(await try_client("127.0.0.2", node.tcp_addr, one_query))[1] for _ in range(8)]
        elsewhere = (await try_client("127.0.0.3", node.tcp_addr, one_query))[1]
        return rotating, elsewhere

    rotating, elsewhere = trio.run(scenario)
    assert rotating == [200] * 5 + [429] * 3
    assert elsewhere == 200


def test_rate_limiter_memory_stays_bounded_under_churn():
    buckets = PeerAndAddressBuckets(RateLimit(volume=2, period_s=60.0), clock=lambda: 0.0, max_keys=100)
    for i in range(5000):
        buckets.allow(f"peer-{i}", f"10.{i // 65536}.{i // 256 % 256}.{i % 256}")
    assert len(buckets) == 200
    # A fresh key on a drained address is refused; IPv6 addresses share their /64.
    assert buckets.allow("a", "2001:db8::1") and buckets.allow("b", "2001:db8::2")
    assert not buckets.allow("c", "2001:db8::ffff")
    assert buckets.allow("d", "2001:db8:0:1::1")
    assert address_key("::ffff:10.0.0.1") == "10.0.0.1"


# --- relay -----------------------------------------------------------------------


class RelayNodeThread(NodeThread):
    with_relay = True


def test_relay_peer_flooding_invalid_messages_is_pruned_graylisted_and_disconnected(engine, tmp_path):
    from libp2p.peer.id import ID

    from wakustore.clients.relay import relay_publisher

    node = RelayNodeThread(node_config(tmp_path), engine, RateLimits.parse(["0/1s"])).start()
    try:
        async def scenario():
            async with relay_publisher(node.tcp_addr, [PUBSUB_TOPIC]) as (pubsub, host, _peer):
                me: ID = host.get_id()
                with trio.fail_after(WAIT_S):  # grafted at a heartbeat
                    while me not in node.relay.router.mesh.get(PUBSUB_TOPIC, ()):
                        await trio.sleep(0.05)
                for i in range(30):
                    await pubsub.publish(PUBSUB_TOPIC, b"\xff" * 8 + i.to_bytes(2, "big"))
                with trio.fail_after(WAIT_S):
                    while not node.relay.scores.is_graylisted(me):
                        await trio.sleep(0.05)
                with trio.fail_after(WAIT_S):
                    while node.host.get_network().connections.get(me):
                        await trio.sleep(0.05)
                return me

        me = trio.run(scenario)
        assert me not in node.relay.router.mesh.get(PUBSUB_TOPIC, ())
        assert me in node.relay.pubsub.blacklisted_peers
        assert trio.run(try_client, "127.0.0.3", node.tcp_addr, one_query) == ("ok", 200)
    finally:
        node.stop()
