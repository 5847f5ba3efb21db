"""Hostile peers against a real node over loopback TCP.

Every 127.0.0.0/8 address reaches this machine, so clients bound to
127.0.0.2, 127.0.0.3, ... play distinct remote hosts. Each test drives one
cap with real connections and streams (fresh keys each time, which is
what costs an attacker nothing), checks that it holds, that a
well-behaved client still gets its answers, and that what the node holds
(connections, streams, tracked addresses) and its memory are back to
where they started.
"""

from __future__ import annotations

import json
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
from store_node_harness import CLUSTER_ID, PUBSUB_TOPIC, NodeThread, node_config  # noqa: E402
from test_js_waku_interop import INTEROP_DIR, SCRIPT, node_binary  # noqa: E402, F401 (a fixture)

QUERY = HistoryQuery(pubsub_topic=PUBSUB_TOPIC, content_topics=("/hostile/1/x/proto",))
WAIT_S = 20.0
# What a few hundred connections may leave behind in this process (node
# and clients share it): caches warm up, nothing per connection stays.
RSS_SLACK = 80 * 1024 * 1024
# How soon an honest client must be through while handshakes are stalled:
# refused, it would wait out py-libp2p's 10 s upgrade timeout.
PROMPT_S = 5.0


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
    return (
        snap["connections"],
        snap["handshakes"],
        snap["streams"],
        snap["idle_streams"],
        snap["in_flight"],
        snap["addresses"],
    ) == (0, 0, 0, 0, 0, 0)


async def one_query(client):
    return (await client.query(QUERY)).status_code


def warmed_rss(node: NodeThread) -> int:
    """The process's RSS once one connection and query have warmed the
    node's and the clients' caches (the node runs in this process)."""
    assert trio.run(try_client, "127.0.0.1", node.tcp_addr, one_query) == ("ok", 200)
    wait_for(lambda: settled(node), f"the node still holds {node.gatekeeper.snapshot()}")
    return rss()


def assert_recovered(node: NodeThread, before: int) -> None:
    """Nothing held, memory near where it was, and the node answers."""
    wait_for(lambda: settled(node), f"the node still holds {node.gatekeeper.snapshot()}")
    grown = rss() - before
    assert grown < RSS_SLACK, f"RSS grew {grown / 2**20:.0f} MB"
    assert trio.run(try_client, "127.0.0.1", node.tcp_addr, one_query) == ("ok", 200)


@pytest.fixture
def start_node(engine, tmp_path):
    started = []

    def start(rate_limits: RateLimits = RateLimits.parse(["0/1s"]), protocol_options=None, **config):
        node = NodeThread(
            node_config(tmp_path / f"node{len(started)}", **config), engine, rate_limits, **(protocol_options or {})
        ).start()
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

        for _round in range(50):
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


def test_stalled_handshakes_cannot_lock_out_an_honest_client(start_node):
    # The default caps: 16 handshakes in progress, 2 connections per address.
    node = start_node(ip_colocation_limit=2)
    port = tcp_port(node.tcp_addr)
    before = warmed_rss(node)
    # Ten addresses try three stalled handshakes each: the third of each is
    # refused before any Noise work, twenty start, sixteen at most stay in
    # progress.
    stalled, refused_at_once = [], 0
    for i in range(10):
        for _ in range(3):
            sock = stalling_socket(f"127.0.2.{i + 1}", port)
            seen = len(stalled) + refused_at_once + 1
            wait_for(
                lambda seen=seen: (
                    node.gatekeeper.handshakes
                    + node.gatekeeper.refused["max_handshakes"]
                    + node.gatekeeper.refused["ip_colocation"]
                    == seen
                ),
                "the node did not take the connection in",
            )
            if node.gatekeeper.refused["ip_colocation"] > refused_at_once:
                refused_at_once += 1
                assert is_closed_by_peer(sock, wait_s=1.0)
                sock.close()
            else:
                stalled.append(sock)
    try:
        # An honest client from another address gets through at once: its
        # handshake replaces the oldest stalled one.
        started = time.monotonic()
        assert trio.run(try_client, "127.0.0.1", node.tcp_addr, one_query) == ("ok", 200)
        assert time.monotonic() - started < PROMPT_S
        assert refused_at_once == 10 and len(stalled) == 20
        # The five oldest were replaced by newer ones (four stalled, one
        # honest) and closed; the other fifteen are still in progress.
        wait_for(
            lambda: node.gatekeeper.handshakes == 15 and node.gatekeeper.refused["max_handshakes"] == 5,
            f"handshakes not capped: {node.gatekeeper.snapshot()}",
        )
        assert [is_closed_by_peer(s, wait_s=1.0) for s in stalled[:5]] == [True] * 5
        assert not any(is_closed_by_peer(s) for s in stalled[5:])
    finally:
        for sock in stalled:
            sock.close()
    assert_recovered(node, before)


# --- idle connections ------------------------------------------------------------


class RelayNodeThread(NodeThread):
    with_relay = True


def test_a_silent_connection_is_closed_and_its_slot_freed_while_connections_with_streams_stay(engine, tmp_path):
    from libp2p.custom_types import TProtocol

    from wakustore.bench.relay_peer import relay_publisher

    node = RelayNodeThread(
        node_config(tmp_path, idle_connection_timeout_s=1.0, max_connections=3), engine, RateLimits.parse(["0/1s"])
    ).start()
    try:
        before = warmed_rss(node)

        async def scenario():
            async with (
                relay_publisher(node.tcp_addr, [PUBSUB_TOPIC]) as (_pubsub, relay_host, node_id),
                client_from("127.0.0.2", node.tcp_addr) as holder,
            ):
                # A client keeping a request stream open, as js-waku does.
                await holder.host.new_stream(holder.peer_id, [TProtocol(store_v3.PROTOCOL_ID)])
                # Connected last: a peer that says nothing more.
                async with client_from("127.0.0.3", node.tcp_addr) as silent:
                    silent_conns = silent.host.get_network().connections
                    with trio.fail_after(WAIT_S):
                        while node.gatekeeper.refused["idle_connection"] < 1:
                            await trio.sleep(0.05)
                    with trio.fail_after(WAIT_S):
                        while silent_conns.get(silent.peer_id):
                            await trio.sleep(0.05)
                    # Both others were connected longer than the timeout.
                    with trio.fail_after(WAIT_S):
                        while node.gatekeeper.connections > 2:
                            await trio.sleep(0.05)
                    assert node.gatekeeper.refused["idle_connection"] == 1
                    assert node.gatekeeper.connections == 2
                    assert relay_host.get_network().connections.get(node_id)
                    # The freed slot (three in all) takes a new client.
                    assert (await try_client("127.0.0.4", node.tcp_addr, one_query)) == ("ok", 200)
                    status = await one_query(holder)
                # py-libp2p leaves the socket open when its host stops; a
                # relay peer that leaves closes its connection.
                await relay_host.get_network().close_peer(node_id)
                return status

        assert trio.run(scenario) == 200
        assert_recovered(node, before)
    finally:
        node.stop()


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
    before = warmed_rss(node)

    async def scenario():
        async with client_from("127.0.0.2", node.tcp_addr) as client:
            hoarded = await open_streams(client, store_v3.PROTOCOL_ID, 10)
            # The newest stream is held once the oldest is reset (an await
            # between the two): wait for all ten to be settled.
            with trio.fail_after(WAIT_S):
                while node.gatekeeper.refused["idle_streams"] < 7 or node.gatekeeper.snapshot()["idle_streams"] < 3:
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
    assert_recovered(node, before)


def test_streams_per_connection_are_capped(start_node):
    node = start_node(max_streams_per_connection=4, max_idle_streams_per_connection=100)
    before = warmed_rss(node)

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
    assert_recovered(node, before)


def test_requests_in_flight_per_protocol_are_capped(start_node):
    node = start_node(max_requests_in_flight=2)
    before = warmed_rss(node)

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
    assert_recovered(node, before)


def test_a_request_has_a_deadline_once_its_first_byte_is_in(start_node):
    # The frame deadline is pushed far out: only the whole-request deadline can end this.
    node = start_node(request_timeout_s=1.0, protocol_options={"read_timeout_s": 120.0})
    before = warmed_rss(node)

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
    assert_recovered(node, before)


# --- rate limits -----------------------------------------------------------------


def test_key_rotating_queries_from_one_address_get_429(start_node):
    node = start_node(rate_limits=RateLimits.parse(["store:5/1h"]))
    before = warmed_rss(node)

    async def scenario():
        rotating = [(await try_client("127.0.0.2", node.tcp_addr, one_query))[1] for _ in range(8)]
        elsewhere = (await try_client("127.0.0.3", node.tcp_addr, one_query))[1]
        return rotating, elsewhere

    rotating, elsewhere = trio.run(scenario)
    assert rotating == [200] * 5 + [429] * 3
    assert elsewhere == 200
    assert_recovered(node, before)


JS_MESSAGES = 20
JS_PAGE = 4
# Per peer and per address: js-waku's six pages fit; every flooding address
# runs dry after twenty.
FLOOD_LIMIT = 20
FLOOD_ADDRESSES = [f"127.0.3.{i + 1}" for i in range(4)]
# Queries per flooding address at most (the flood stops with js-waku).
FLOOD_MAX = 10 * FLOOD_LIMIT


@pytest.mark.slow
def test_js_waku_pages_through_a_key_rotating_query_flood(start_node, node_binary):  # noqa: F811 (the fixture)
    from wakustore.protocols.message import WakuMessage

    # The connection caps are other tests': here each query of the flood
    # comes on a connection of its own, which the node may see close late.
    node = start_node(
        rate_limits=RateLimits.parse([f"store:{FLOOD_LIMIT}/1h"]), ip_colocation_limit=0, max_connections=0
    )
    now = time.time_ns()
    messages = [
        (
            PUBSUB_TOPIC,
            WakuMessage(b"js-%02d" % i, QUERY.content_topics[0], timestamp=now - (JS_MESSAGES - i) * 10**6),
            now,
        )
        for i in range(JS_MESSAGES)
    ]
    trio.from_thread.run(node.service.put, messages, trio_token=node._token)
    assert node.flush() == JS_MESSAGES
    before = warmed_rss(node)
    job = {
        "peer": node.ws_addr,
        "transport": "ws",
        "clusterId": CLUSTER_ID,
        "shard": 0,
        "contentTopics": list(QUERY.content_topics),
        "timeoutMs": 60_000,
        "query": {"pageSize": JS_PAGE, "forward": True},
    }

    async def scenario():
        flood: dict[str, list] = {address: [] for address in FLOOD_ADDRESSES}
        js_done = trio.Event()

        async def rotate_keys(address: str):
            while not js_done.is_set() and len(flood[address]) < FLOOD_MAX:
                flood[address].append((await try_client(address, node.tcp_addr, one_query))[1])

        async with trio.open_nursery() as nursery:
            for address in FLOOD_ADDRESSES:
                nursery.start_soon(rotate_keys, address)
            # js-waku starts once every flooding address is refused.
            with trio.fail_after(60):
                while not all(429 in statuses for statuses in flood.values()):
                    await trio.sleep(0.05)
            try:
                result = await trio.run_process(
                    [str(node_binary), str(SCRIPT)],
                    stdin=json.dumps(job).encode(),
                    cwd=INTEROP_DIR,
                    capture_stdout=True,
                    capture_stderr=True,
                    check=False,
                )
            finally:
                js_done.set()
                running = {address: len(statuses) < FLOOD_MAX for address, statuses in flood.items()}
        return flood, result, running

    flood, result, running = trio.run(scenario)
    # The flood went on for the whole of js-waku's session.
    assert all(running.values()), {address: len(statuses) for address, statuses in flood.items()}
    events = [json.loads(line) for line in result.stdout.decode().splitlines() if line.startswith("{")]
    assert result.returncode == 0, (events[-3:], result.stderr.decode()[-3000:])
    seen = [bytes.fromhex(e["payload"]) for e in events if e["event"] == "message"]
    assert seen == [m.payload for _, m, _ in messages]
    for address, statuses in flood.items():
        # Fresh keys do not help: twenty answers per address, then 429s.
        assert statuses.count(200) == FLOOD_LIMIT, (address, statuses)
        assert statuses.count(429) == len(statuses) - FLOOD_LIMIT > 0, (address, statuses)
    assert_recovered(node, before)


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


def test_relay_peer_flooding_invalid_messages_is_pruned_graylisted_and_disconnected(engine, tmp_path):
    from libp2p.peer.id import ID

    from wakustore.bench.relay_peer import relay_publisher

    node = RelayNodeThread(node_config(tmp_path), engine, RateLimits.parse(["0/1s"])).start()
    try:
        before = warmed_rss(node)

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
        assert_recovered(node, before)
    finally:
        node.stop()
