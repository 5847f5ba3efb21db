"""11/WAKU2-RELAY between two of our nodes over real libp2p TCP.

Node A and node B run in threads on the session's engine, each with its own
tables; B dials A as its relay peer. A third, minimal publisher (our
gossipsub classes without validators) dials B to send what an honest node
never would: unsigned messages on a protected topic, garbage, oversized
payloads and an unparsable RPC frame.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
import trio

from wakustore.bench.relay_peer import relay_publisher
from wakustore.clients.store import StoreClient
from wakustore.node.config import ConfigError, load
from wakustore.node.relay import PROTOCOL_ID
from wakustore.node.store_protocols import RateLimits
from wakustore.protocols.dos_protection import ProtectedTopic, sign_message
from wakustore.protocols.lightpush import LightpushStatus
from wakustore.protocols.message import WakuMessage, message_hash
from wakustore.protocols.message_codec import encode_message
from wakustore.protocols.store_query import validate_v3

sys.path.insert(0, str(Path(__file__).resolve().parent))
from store_node_harness import OTHER_PUBSUB_TOPIC, PUBSUB_TOPIC, NodeThread, node_config  # noqa: E402

# The key pair of 57/STATUS-Simple-Scaling's test vector.
PRIVATE_KEY = bytes.fromhex("5526a8990317c9b7b58d07843d270f9cd1d9aaee129294c1c478abf7261dd9e6")
PUBLIC_KEY_HEX = (
    "049c5fac802da41e07e6cdf51c3b9a6351ad5e65921527f2df5b7d59fd9b56ab02"
    "bab736cdcfc37f25095e78127500da371947217a8cd5186ab890ea866211c3f6"
)
PROTECTED_TOPIC = OTHER_PUBSUB_TOPIC
CONTENT_TOPIC = "/relay/1/test/proto"
ARRIVAL_TIMEOUT_S = 15.0
POLL_S = 0.1


class RelayNode(NodeThread):
    """A store node with relay, wired as ``wakustore serve`` wires it."""

    with_relay = True

    def rejected(self, reason: str) -> float:
        value = self.service.metrics.registry.get_sample_value(
            "wakustore_messages_rejected_total", {"source": "relay", "reason": reason}
        )
        return value or 0.0

    def ephemeral(self) -> float:
        value = self.service.metrics.registry.get_sample_value(
            "wakustore_messages_ephemeral_total", {"source": "relay"}
        )
        return value or 0.0

    def ingested(self) -> float:
        value = self.service.metrics.registry.get_sample_value("wakustore_messages_ingested_total", {"source": "relay"})
        return value or 0.0


@pytest.fixture(scope="module")
def nodes(engine, tmp_path_factory):
    unlimited = RateLimits.parse(["0/1s"])
    protected = [f"{PROTECTED_TOPIC}:{PUBLIC_KEY_HEX}"]
    a = RelayNode(
        node_config(tmp_path_factory.mktemp("relay-a"), protected_topics=protected), engine, unlimited
    ).start()
    b = RelayNode(
        node_config(tmp_path_factory.mktemp("relay-b"), protected_topics=protected, relay_peers=[a.tcp_addr]),
        engine,
        unlimited,
    ).start()
    try:
        _wait_for(
            lambda: a.relay.peer_count(PUBSUB_TOPIC) >= 1 and a.relay.peer_count(PROTECTED_TOPIC) >= 1,
            "B never became A's relay peer",
        )
        yield a, b
    finally:
        b.stop()
        a.stop()


def _wait_for(condition, what: str, timeout_s: float = ARRIVAL_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(POLL_S)
    raise AssertionError(what)


def _message(text: str, **fields) -> WakuMessage:
    values = dict(payload=text.encode(), content_topic=CONTENT_TOPIC, timestamp=time.time_ns())
    values.update(fields)
    return WakuMessage(**values)


def _signed(topic: str, message: WakuMessage) -> WakuMessage:
    return WakuMessage(
        payload=message.payload,
        content_topic=message.content_topic,
        timestamp=message.timestamp,
        ephemeral=message.ephemeral,
        meta=sign_message(PRIVATE_KEY, topic, message),
    )


async def _stored(node: RelayNode, topic: str, message: WakuMessage) -> bool:
    digest = message_hash(topic, message)
    query = validate_v3(
        pubsub_topic=None,
        content_topics=[],
        time_start=None,
        time_end=None,
        message_hashes=[digest],
        cursor=None,
        forward=False,
        limit=20,
        include_data=True,
    )
    async with StoreClient.connect(node.tcp_addr) as client:
        response = await client.query(query)
    return any(m.message_hash == digest for m in response.messages)


async def _arrives(node: RelayNode, topic: str, message: WakuMessage) -> bool:
    with trio.move_on_after(ARRIVAL_TIMEOUT_S):
        while not await _stored(node, topic, message):
            await trio.sleep(POLL_S * 3)
        return True
    return False


def test_message_pushed_to_one_node_is_stored_by_its_relay_peer(nodes):
    a, b = nodes
    message = _message("pushed to A")

    async def scenario():
        async with StoreClient.connect(a.tcp_addr) as client:
            answer = await client.push(PUBSUB_TOPIC, message)
        assert (answer.status_code, answer.relay_peer_count) == (LightpushStatus.SUCCESS, 1), answer
        assert await _arrives(b, PUBSUB_TOPIC, message), "B never stored the message A relayed"
        assert await _stored(a, PUBSUB_TOPIC, message)

    trio.run(scenario)
    assert b.ingested() >= 1


def test_protected_topic_takes_only_messages_signed_per_57(nodes):
    a, b = nodes
    unsigned = _message("unsigned")
    signed = _signed(PROTECTED_TOPIC, _message("signed"))
    wrongly_signed = WakuMessage(
        payload=b"tampered", content_topic=CONTENT_TOPIC, timestamp=signed.timestamp, meta=signed.meta
    )
    no_signature, bad_signature = b.rejected("no_signature"), b.rejected("bad_signature")

    async def scenario():
        async with relay_publisher(b.tcp_addr, [PROTECTED_TOPIC]) as (pubsub, _host, _peer):
            assert await pubsub.publish(PROTECTED_TOPIC, encode_message(unsigned)) == 1
            assert await pubsub.publish(PROTECTED_TOPIC, encode_message(wrongly_signed)) == 1
            assert await pubsub.publish(PROTECTED_TOPIC, encode_message(signed)) == 1
            assert await _arrives(b, PROTECTED_TOPIC, signed), "B did not store the signed message"
            # B forwarded the signed one to A, not the two it rejected before it.
            assert await _arrives(a, PROTECTED_TOPIC, signed), "B did not relay the signed message"
        for node in (a, b):
            assert not await _stored(node, PROTECTED_TOPIC, unsigned)
            assert not await _stored(node, PROTECTED_TOPIC, wrongly_signed)
        # Lightpush applies the same validator.
        async with StoreClient.connect(a.tcp_addr) as client:
            refused = await client.push(PROTECTED_TOPIC, _message("unsigned, pushed"))
            pushed = _signed(PROTECTED_TOPIC, _message("signed, pushed"))
            accepted = await client.push(PROTECTED_TOPIC, pushed)
        assert refused.status_code == LightpushStatus.INVALID_MESSAGE, refused
        assert accepted.status_code == LightpushStatus.SUCCESS, accepted
        assert await _arrives(b, PROTECTED_TOPIC, pushed)

    trio.run(scenario)
    assert b.rejected("no_signature") == no_signature + 1
    assert b.rejected("bad_signature") == bad_signature + 1


def test_garbage_and_oversized_relay_payloads_are_rejected_and_nodes_keep_working(nodes):
    a, b = nodes
    before = {r: b.rejected(r) for r in ("undecodable", "too_large", "meta_too_large")}
    over_limit = _message("x" * (b.config.max_message_size + 1024))
    over_frame = _message("y" * (b.config.max_message_size + 100 * 1024))
    big_meta = _message("meta", meta=bytes(65))

    async def scenario():
        from libp2p.custom_types import TProtocol
        from libp2p.utils import encode_varint_prefixed

        async with relay_publisher(b.tcp_addr, [PUBSUB_TOPIC]) as (pubsub, host, peer_id):
            for data in (b"\xff" * 40, encode_message(over_limit), encode_message(big_meta)):
                assert await pubsub.publish(PUBSUB_TOPIC, data) == 1
            # Larger than B reads in one RPC frame: B resets the stream.
            await pubsub.publish(PUBSUB_TOPIC, encode_message(over_frame))
            # Not a protobuf at all.
            stream = await host.new_stream(peer_id, [TProtocol(PROTOCOL_ID)])
            await stream.write(encode_varint_prefixed(b"\xff" * 64))
            await trio.sleep(0.5)
        fresh = _message("after the garbage")
        async with StoreClient.connect(a.tcp_addr) as client:
            answer = await client.push(PUBSUB_TOPIC, fresh)
        assert answer.relay_peer_count == 1, answer
        assert await _arrives(b, PUBSUB_TOPIC, fresh), "relay from A to B stopped working"
        for message in (over_limit, over_frame, big_meta):
            assert not await _stored(b, PUBSUB_TOPIC, message)

    trio.run(scenario)
    _wait_for(
        lambda: all(b.rejected(r) == before[r] + 1 for r in before),
        f"rejections not counted: {[(r, b.rejected(r) - before[r]) for r in before]}",
    )


def test_ephemeral_and_drifting_messages_are_relayed_but_not_stored(nodes):
    a, b = nodes
    ephemeral = _message("ephemeral", ephemeral=True)
    drifting = _message("from the future", timestamp=time.time_ns() + 60 * 1_000_000_000)
    after = _message("sentinel")
    before = {"ephemeral": b.ephemeral(), "timestamp_drift": b.rejected("timestamp_drift")}

    async def scenario():
        async with relay_publisher(b.tcp_addr, [PUBSUB_TOPIC]) as (pubsub, _host, _peer):
            for message in (ephemeral, drifting, after):
                assert await pubsub.publish(PUBSUB_TOPIC, encode_message(message)) == 1
            assert await _arrives(a, PUBSUB_TOPIC, after)
        assert not await _stored(b, PUBSUB_TOPIC, ephemeral)
        assert not await _stored(b, PUBSUB_TOPIC, drifting)

    trio.run(scenario)
    # The ephemeral message is valid: counted apart, never as a rejection.
    assert b.ephemeral() - before["ephemeral"] == 1 and b.rejected("ephemeral") == 0
    assert b.rejected("timestamp_drift") - before["timestamp_drift"] == 1
    # B forwarded both to A, which counted them the same way.
    assert a.ephemeral() >= 1 and a.rejected("timestamp_drift") >= 1


@pytest.mark.parametrize(
    "form",
    [
        {"protected_topics": [f"{PROTECTED_TOPIC}:0x{PUBLIC_KEY_HEX}"]},
        {"protected_topics": {PROTECTED_TOPIC: PUBLIC_KEY_HEX}},
    ],
)
def test_protected_topics_config_forms(tmp_path, form):
    config = load(None, {"data_dir": tmp_path, **form}, environ={})
    assert config.protected_topics == [ProtectedTopic(PROTECTED_TOPIC, bytes.fromhex(PUBLIC_KEY_HEX))]


def test_protected_topics_and_relay_peers_from_the_environment(tmp_path):
    environ = {
        "WAKUSTORE_PROTECTED_TOPICS": f"{PROTECTED_TOPIC}:{PUBLIC_KEY_HEX}",
        "WAKUSTORE_RELAY_PEERS": "/ip4/127.0.0.1/tcp/1/p2p/a,/ip4/127.0.0.1/tcp/2/p2p/b",
        "WAKUSTORE_RELAY": "false",
    }
    config = load(None, {"data_dir": tmp_path}, environ=environ)
    assert config.protected_topics[0].pubsub_topic == PROTECTED_TOPIC
    assert config.relay_peers == ["/ip4/127.0.0.1/tcp/1/p2p/a", "/ip4/127.0.0.1/tcp/2/p2p/b"]
    assert config.relay is False


@pytest.mark.parametrize("entry", ["no-key-here", f"{PROTECTED_TOPIC}:zz", f"{PROTECTED_TOPIC}:0102"])
def test_bad_protected_topics_are_config_errors(tmp_path, entry):
    with pytest.raises(ConfigError):
        load(None, {"data_dir": tmp_path, "protected_topics": [entry]}, environ={})
