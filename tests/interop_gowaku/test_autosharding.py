"""Autosharding (51/WAKU2-RELAY-SHARDING, generation 0) with go-waku on
cluster 1, 8 shards: go-waku derives the shard of a content topic itself
for lightpush and relay (its cluster 1 and 8 shards are constants:
``protocol.ClusterIndex``, ``GenerationZeroShardsCount``), and our node
must store the message on the same pubsub topic that our own derivation
gives (the REST API's ``autoshard``).

go-waku's lightpush client always names the pubsub topic in its request;
so does its relay. (Our lightpush v3 without a pubsub topic is refused
with 420 even with ``num_shards_in_network`` set; only our REST API
derives one.)
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gowaku_node import rest_message, wait_for  # noqa: E402
from our_node import stored  # noqa: E402

from wakustore.protocols.message import WakuMessage  # noqa: E402
from wakustore.protocols.rest import autoshard  # noqa: E402

pytestmark = pytest.mark.slow

CLUSTER_ID = 1
SHARDS = list(range(8))
OUR_RELAY = True
OUR_CONFIG = {"num_shards_in_network": 8}
CONTENT_TOPICS = ["/toychat/2/huilong/proto", "/statusim/1/community/cbor", "/waku/2/default-content/proto"]


def gowaku_flags(ours) -> list[str]:
    return [
        f"--staticnode={ours.tcp_addr}",
        f"--lightpushnode={ours.tcp_addr}",
        *(f"--content-topic={t}" for t in CONTENT_TOPICS),
    ]


@pytest.mark.parametrize("content_topic", CONTENT_TOPICS)
def test_gowaku_lightpush_without_a_pubsub_topic_lands_on_our_shard_of_the_content_topic(ours, gowaku, content_topic):
    topic = autoshard(content_topic, CLUSTER_ID, 8)
    message = WakuMessage(payload=os.urandom(16), content_topic=content_topic, timestamp=time.time_ns())
    answer = gowaku.lightpush("", rest_message(message.payload, content_topic, message.timestamp))
    assert (answer.status, answer.text) == (200, "true"), answer
    assert stored(ours, message, topic=topic) == [message]


def test_gowaku_relay_autosharded_publish_is_stored_on_our_derived_topic(ours, gowaku):
    content_topic = CONTENT_TOPICS[0]
    topic = autoshard(content_topic, CLUSTER_ID, 8)
    wait_for(lambda: ours.relay.peer_count(topic) >= 1, "go-waku never joined our relay topic", gowaku)
    message = WakuMessage(payload=os.urandom(16), content_topic=content_topic, timestamp=time.time_ns())
    rest = rest_message(message.payload, content_topic, message.timestamp)
    wait_for(lambda: gowaku.post("/relay/v1/auto/messages", rest).status == 200, "go-waku never published", gowaku)
    assert wait_for(lambda: stored(ours, message, topic=topic), "our node never stored it", gowaku) == [message]
