"""Our node as the go-waku tests run it (tests/node/store_node_harness.py's
NodeThread), and what they ask it through our own Store client."""

from __future__ import annotations

import sys
from pathlib import Path

import trio

from wakustore.clients.store import StoreClient
from wakustore.protocols.message import WakuMessage, message_hash
from wakustore.protocols.store_query import HistoryQuery

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "node"))
from store_node_harness import NodeThread  # noqa: E402


class RelayNode(NodeThread):
    with_relay = True


def stored(node: NodeThread, *messages: WakuMessage, topic: str) -> list[WakuMessage]:
    """The messages among ``messages`` that ``node`` serves by hash on ``topic``."""

    async def lookup():
        async with StoreClient.connect(node.tcp_addr) as client:
            response = await client.query(
                HistoryQuery(message_hashes=tuple(message_hash(topic, m) for m in messages), limit=100)
            )
        assert response.status_code == 200, response
        return [e.message for e in response.messages]

    return trio.run(lookup)
