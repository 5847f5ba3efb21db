"""The relay's message ids: sha256 of the data, hashed once per message."""

import hashlib

from libp2p.pubsub.pb import rpc_pb2

from wakustore.node import relay


def test_message_ids_hash_each_message_once_and_agree_with_nwaku(monkeypatch):
    hashed = []
    real = relay.message_id
    monkeypatch.setattr(relay, "message_id", lambda msg: hashed.append(msg.data) or real(msg))
    ids = relay.MessageIds()
    first = rpc_pb2.Message(data=b"one", topicIDs=["/waku/2/rs/16/32"])
    second = rpc_pb2.Message(data=b"two", topicIDs=["/waku/2/rs/16/32"])
    # py-libp2p asks about one message several times in a row, then the next.
    assert [ids(first) for _ in range(5)] == [hashlib.sha256(b"one").digest()] * 5
    assert ids(second) == hashlib.sha256(b"two").digest()
    assert ids(first) == hashlib.sha256(b"one").digest()
    assert hashed == [b"one", b"two", b"one"]


def test_the_router_and_its_cache_share_the_pubsub_message_ids():
    router = relay.WakuGossipSub()
    msg = rpc_pb2.Message(data=b"cached", topicIDs=["/waku/2/rs/16/32"])
    router.mcache.put(msg)
    assert router.mcache.get(hashlib.sha256(b"cached").digest()) is msg
