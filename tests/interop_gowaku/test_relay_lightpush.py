"""go-waku (a full node, cmd/waku) beside our node on cluster 16, shard 32:
relay both ways and go-waku's lightpush client pushing into us.

go-waku dials our node (``--staticnode``), meshes with it on
``/waku/2/rs/16/32`` and takes it as its lightpush service node
(``--lightpushnode``); its REST API drives it. What go-waku reports for
each lightpush outcome (its client speaks lightpush 2.0.0-beta1, and its
REST API answers 200 ``true`` or 503 with ``"lightpush error"`` followed by
our ``info``, no separator):

| push | we answer (v2beta1) | go-waku's REST |
|---|---|---|
| a new message | is_success, "OK" | 200 ``true`` |
| the same message again | is_success (stored once: MUID) | 200 ``true`` |
| timestamp 60 s old | not is_success, timestamp drift | 503 |
| payload over 150 KiB | not is_success, too large | 503 |
| shard 33, not ours | not is_success, unsupported topic | 503 (first its own "no suitable remote peers") |

go-waku's own limit differs: ``--max-msg-size`` 150KB is parsed as SI
bytes (150,000: go-humanize), nwaku's 150KiB is 153,600, as is ours.
"""

from __future__ import annotations

import base64
import os
import sys
import time
from pathlib import Path

import pytest
import trio

from wakustore.clients.store import StoreClient
from wakustore.protocols.lightpush import LightpushStatus
from wakustore.protocols.message import WakuMessage

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "node"))
from gowaku_node import rest_message, wait_for  # noqa: E402
from our_node import stored  # noqa: E402

pytestmark = pytest.mark.slow

CLUSTER_ID = 16
SHARD = 32
SHARDS = [SHARD]
OUR_RELAY = True
PUBSUB_TOPIC = f"/waku/2/rs/{CLUSTER_ID}/{SHARD}"
CONTENT_TOPIC = "/gowaku-interop/1/relay/proto"


def gowaku_flags(ours) -> list[str]:
    return [f"--staticnode={ours.tcp_addr}", f"--lightpushnode={ours.tcp_addr}"]


@pytest.fixture(scope="module")
def meshed(ours, gowaku):
    """go-waku on our relay topic, its REST API keeping what its relay receives."""
    wait_for(lambda: ours.relay.peer_count(PUBSUB_TOPIC) >= 1, "go-waku never joined our relay topic", gowaku)
    answer = gowaku.post("/relay/v1/subscriptions", [PUBSUB_TOPIC])
    assert answer.status == 200, answer
    return gowaku


def new_message(text: str, **fields) -> WakuMessage:
    values = dict(payload=text.encode() + os.urandom(4), content_topic=CONTENT_TOPIC, timestamp=time.time_ns())
    values.update(fields)
    return WakuMessage(**values)


def as_rest(message: WakuMessage) -> dict:
    extra = {"meta": base64.b64encode(message.meta).decode()} if message.meta else {}
    return rest_message(message.payload, message.content_topic, message.timestamp, **extra)


def test_message_gowaku_publishes_on_relay_is_stored_by_our_node(ours, meshed):
    message = new_message("relayed by go-waku", meta=b"\x01\x02")
    # go-waku refuses to publish until its relay counts a peer on the topic.
    wait_for(lambda: meshed.relay_publish(PUBSUB_TOPIC, as_rest(message)).status == 200, "go-waku never published")
    assert wait_for(lambda: stored(ours, message, topic=PUBSUB_TOPIC), "our node never stored go-waku's message") == [
        message
    ]


def test_message_lightpushed_to_our_node_reaches_gowaku_by_relay(ours, meshed):
    message = new_message("lightpushed to us", meta=b"\x07" * 64)

    async def push():
        async with StoreClient.connect(ours.tcp_addr) as client:
            return await client.push(PUBSUB_TOPIC, message)

    answer = trio.run(push)
    assert (answer.status_code, answer.relay_peer_count) == (LightpushStatus.SUCCESS, 1), answer
    received: list[dict] = []

    def arrived():
        received.extend(meshed.relay_messages(PUBSUB_TOPIC))
        return [r for r in received if base64.b64decode(r["payload"]) == message.payload]

    [got] = wait_for(arrived, "go-waku's relay never received the message we relayed", meshed)
    assert got["contentTopic"] == CONTENT_TOPIC
    assert got["timestamp"] == message.timestamp
    assert base64.b64decode(got["meta"]) == message.meta


def test_gowaku_lightpush_outcomes(ours, meshed):
    accepted = new_message("lightpushed by go-waku")
    first = meshed.lightpush(PUBSUB_TOPIC, as_rest(accepted))
    assert (first.status, first.json()) == (200, True), first
    again = meshed.lightpush(PUBSUB_TOPIC, as_rest(accepted))
    assert (again.status, again.json()) == (200, True), again
    assert stored(ours, accepted, topic=PUBSUB_TOPIC) == [accepted]

    old = new_message("sixty seconds old", timestamp=time.time_ns() - 60 * 10**9)
    drifted = meshed.lightpush(PUBSUB_TOPIC, as_rest(old))
    assert drifted.status == 503 and drifted.text.startswith("lightpush errortimestamp_drift: "), drifted

    large = new_message("x" * (150 * 1024 + 1))
    too_large = meshed.lightpush(PUBSUB_TOPIC, as_rest(large))
    assert too_large.status == 503 and too_large.text.startswith("lightpush errortoo_large: "), too_large
    assert stored(ours, old, large, topic=PUBSUB_TOPIC) == []


def test_gowaku_lightpush_to_a_shard_we_do_not_serve_is_refused_by_us(ours, meshed):
    """go-waku picks lightpush peers by the shards it knows them on: for shard
    33 it finds none ("no suitable remote peers") until it is told we serve
    it (admin API); then our refusal comes back through it."""
    topic = f"/waku/2/rs/{CLUSTER_ID}/33"
    message = new_message("shard 33")
    unknown = meshed.lightpush(topic, as_rest(message))
    assert (unknown.status, unknown.text) == (503, "no suitable remote peers"), unknown
    added = meshed.post(
        "/admin/v1/peers",
        {"multiaddr": ours.tcp_addr, "shards": [SHARD, 33], "protocols": ["/vac/waku/lightpush/2.0.0-beta1"]},
    )
    assert added.status == 200, added
    refused = meshed.lightpush(topic, as_rest(message))
    assert refused.status == 503, refused
    assert refused.text == f"lightpush errorpubsub topic {topic} is not served by this node", refused
    assert stored(ours, message, topic=topic) == []


def test_identify_tells_each_side_what_the_other_serves(ours, meshed):
    """go-waku's admin API lists the Waku protocols our identify announced;
    our peer store holds what go-waku's announced."""
    [us] = [p for p in meshed.peers() if p["id"] == ours.peer_id]
    assert {
        "/vac/waku/store-query/3.0.0",
        "/vac/waku/store/2.0.0-beta4",
        "/vac/waku/lightpush/2.0.0-beta1",
        "/vac/waku/relay/2.0.0",
    } <= set(us["protocols"])
    peer_id = next(p for p in ours.relay.peers if str(p) == meshed.peer_id)
    peerstore = ours.host.get_peerstore()
    theirs = set(peerstore.get_protocols(peer_id))
    assert {"/vac/waku/relay/2.0.0", "/vac/waku/metadata/1.0.0", "/ipfs/ping/1.0.0"} <= theirs, theirs


def test_we_ping_gowaku(ours, meshed):
    """/ipfs/ping/1.0.0 from our host (go-waku pings us too, its keep-alive)."""
    from libp2p.host.ping import PingService

    peer_id = next(p for p in ours.relay.peers if str(p) == meshed.peer_id)

    async def ping():
        with trio.fail_after(10):
            return await PingService(ours.host).ping(peer_id, ping_amt=3)

    rtts = trio.from_thread.run(ping, trio_token=ours._token)
    assert len(rtts) == 3 and all(rtt >= 0 for rtt in rtts)
