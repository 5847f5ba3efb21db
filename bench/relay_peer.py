"""A bare relay peer for tests and the soak: it publishes whatever it is
given, with none of the node's validators, so a node's own relay checks
can be driven from outside. It uses the node's gossipsub classes
(:mod:`wakustore.node.relay`) so that it speaks Waku relay as the node does.
"""

from __future__ import annotations

from contextlib import asynccontextmanager

from libp2p.tools.anyio_service import background_trio_service

from wakustore.node.relay import WakuGossipSub, WakuPubsub, peer_info
from wakustore.transport.host import new_host, stop_auto_dialing


@asynccontextmanager
async def relay_publisher(peer: str, topics: list[str], max_rpc_size: int = 4 * 1024 * 1024):
    """A bare relay peer of ``peer`` (a multiaddr with ``/p2p/``): our
    gossipsub classes without validators, so it sends whatever it is given.
    Yields (pubsub, host, peer id) once ``peer`` is subscribed to ``topics``."""
    info = peer_info(peer)
    host = new_host()
    router = WakuGossipSub()
    pubsub = WakuPubsub(host, router, topics, max_rpc_size=max_rpc_size)
    async with host.run(listen_addrs=[]):
        await stop_auto_dialing(host)
        async with background_trio_service(pubsub), background_trio_service(router):
            await pubsub.wait_until_ready()
            for topic in topics:
                await pubsub.subscribe(topic)
            await host.connect(info)
            await pubsub.wait_for_peer(info.peer_id, timeout=10)
            for topic in topics:
                await pubsub.wait_for_subscription(info.peer_id, topic, timeout=10)
            yield pubsub, host, info.peer_id
