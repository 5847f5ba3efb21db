"""Gossipsub peer scoring for the relay, with nwaku's parameters.

nwaku (waku/waku_relay/protocol.nim, after 29/WAKU2-CONFIG) scores relay
peers per topic with topic weight 1:

- P2, first message deliveries: weight 1, cap 10, decay 0.5;
- P4, invalid messages: weight -100 times the count squared, decay 0.5
  (the penalty 57/STATUS-Simple-Scaling recommends against peers sending
  messages that fail validation);

and acts on the score with thresholds gossip -100, publish -1000 and
graylist -10000, disconnecting peers below the graylist threshold
(``disconnectBadPeers``). Counters decay once a heartbeat (1 s).

py-libp2p 0.8.1 has the counters but not the actions gossipsub v1.1
prescribes: its P4 is linear, it gates incoming messages on the publish
threshold (which stops counting a flooding peer's invalid messages long
before it reaches the graylist), and its heartbeat never prunes a peer
for a negative score. :class:`WakuPeerScorer` computes nwaku's score;
:class:`ScoreKeeper` acts on it every heartbeat:

- a mesh peer with a negative score is pruned (removed from the mesh, sent
  PRUNE), and a GRAFT from such a peer is answered with PRUNE;
- a peer below the graylist threshold is graylisted: its relay stream is
  reset, its messages and control messages are dropped and the connection
  is closed; it stays graylisted for :data:`GRAYLIST_S`;
- a peer whose relay stream fails (a frame larger than the RPC limit, an
  unparsable RPC) gets a strike; :data:`MAX_STRIKES` strikes graylist it.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable
from typing import Any

import trio
from libp2p.peer.id import ID
from libp2p.pubsub.score import PeerScorer, ScoreParams, TopicScoreParams

log = logging.getLogger(__name__)

# nwaku's TopicParameters and GossipsubParameters (see the module docstring).
FIRST_DELIVERY_WEIGHT = 1.0
FIRST_DELIVERY_CAP = 10.0
FIRST_DELIVERY_DECAY = 0.5
INVALID_MESSAGE_WEIGHT = -100.0
INVALID_MESSAGE_DECAY = 0.5
GOSSIP_THRESHOLD = -100.0
PUBLISH_THRESHOLD = -1000.0
GRAYLIST_THRESHOLD = -10000.0

# How long a graylisted peer stays ignored, and how many are remembered
# (the oldest is forgotten first). nim-libp2p keeps a disconnected peer's
# score for its retainScore (nwaku: the default, 10 s x heartbeats); a
# peer that reached the graylist has shown what it sends.
GRAYLIST_S = 600.0
MAX_GRAYLISTED = 10_000

# Failed relay streams (oversized or unparsable frames) before a peer is
# graylisted, and how many peers' strikes are remembered.
MAX_STRIKES = 3
MAX_STRUCK_PEERS = 10_000

# How often scores are acted on: gossipsub's heartbeat.
ENFORCE_INTERVAL_S = 1.0


def waku_score_params() -> ScoreParams:
    return ScoreParams(
        p2_first_message_deliveries=TopicScoreParams(
            weight=FIRST_DELIVERY_WEIGHT, cap=FIRST_DELIVERY_CAP, decay=FIRST_DELIVERY_DECAY
        ),
        p4_invalid_messages=TopicScoreParams(weight=INVALID_MESSAGE_WEIGHT, cap=0.0, decay=INVALID_MESSAGE_DECAY),
        gossip_threshold=GOSSIP_THRESHOLD,
        publish_threshold=PUBLISH_THRESHOLD,
        graylist_threshold=GRAYLIST_THRESHOLD,
        accept_px_threshold=0.0,
    )


class WakuPeerScorer(PeerScorer):
    """py-libp2p's counters, nwaku's score (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__(waku_score_params())

    def topic_score(self, peer: ID, topic: str) -> float:
        p = self.params
        first = min(self.first_message_deliveries[peer][topic], p.p2_first_message_deliveries.cap)
        invalid = self.invalid_messages[peer][topic]
        return p.p2_first_message_deliveries.weight * first + p.p4_invalid_messages.weight * invalid * invalid

    def score(self, peer: ID, topics: list[str]) -> float:
        if not topics:
            topics = list(set(self.first_message_deliveries.get(peer, ())) | set(self.invalid_messages.get(peer, ())))
        return sum(self.topic_score(peer, topic) for topic in topics)

    def allow_publish(self, peer: ID, topics: list[str]) -> bool:
        """Whether to process a message ``peer`` forwarded: py-libp2p asks
        this of every incoming message; gossipsub drops only a graylisted
        peer's (the publish threshold is for what we publish)."""
        return self.score(peer, topics) >= self.params.graylist_threshold

    def allow_gossip(self, peer: ID, topics: list[str]) -> bool:
        return self.score(peer, topics) >= self.params.gossip_threshold


class ScoreKeeper:
    """Acts on the scores of one relay: prunes, graylists, disconnects.

    ``disconnect(peer)`` closes the peer's connections (the host's).
    ``clock`` is in seconds (monotonic).
    """

    def __init__(
        self, router: Any, pubsub: Any, disconnect: Callable[[ID], Any], clock: Callable[[], float] = time.monotonic
    ):
        self.router = router
        self.pubsub = pubsub
        self.disconnect = disconnect
        self.clock = clock
        self.graylisted: collections.OrderedDict[ID, float] = collections.OrderedDict()
        self.strikes: collections.OrderedDict[ID, int] = collections.OrderedDict()
        self.pruned = 0

    @property
    def scorer(self) -> WakuPeerScorer:
        return self.router.scorer

    def is_graylisted(self, peer: ID) -> bool:
        return peer in self.graylisted

    def strike(self, peer: ID) -> None:
        """A relay stream of ``peer`` failed (oversized or unparsable frame)."""
        count = self.strikes.pop(peer, 0) + 1
        self.strikes[peer] = count
        if len(self.strikes) > MAX_STRUCK_PEERS:
            self.strikes.popitem(last=False)
        if count >= MAX_STRIKES:
            self.graylist(peer, f"{count} failed relay streams")

    def graylist(self, peer: ID, why: str) -> None:
        if peer in self.graylisted:
            return
        log.info("graylisting relay peer %s: %s", peer, why)
        self.graylisted[peer] = self.clock() + GRAYLIST_S
        if len(self.graylisted) > MAX_GRAYLISTED:
            oldest, _ = self.graylisted.popitem(last=False)
            self.pubsub.remove_from_blacklist(oldest)
        # py-libp2p's blacklist resets the relay stream and drops the
        # peer's messages from then on.
        self.pubsub.add_to_blacklist(peer)
        self._unmesh(peer)
        self.pubsub.manager.run_task(self._disconnect, peer)

    async def _disconnect(self, peer: ID) -> None:
        try:
            await self.disconnect(peer)
        except Exception as exc:
            log.debug("disconnecting graylisted peer %s: %r", peer, exc)

    def _unmesh(self, peer: ID) -> list[str]:
        topics = [t for t, peers in self.router.mesh.items() if peer in peers]
        for topic in topics:
            self.router.mesh[topic].discard(peer)
            self.scorer.on_leave_mesh(peer, topic)
        self.pruned += bool(topics)
        return topics

    async def enforce(self) -> None:
        """One round: expire graylist entries, prune negative peers,
        graylist those below the threshold."""
        now = self.clock()
        while self.graylisted:
            peer, until = next(iter(self.graylisted.items()))
            if until > now:
                break
            del self.graylisted[peer]
            self.pubsub.remove_from_blacklist(peer)
        scorer = self.scorer
        for topic in list(self.router.mesh):
            for peer in list(self.router.mesh.get(topic, ())):
                score = scorer.score(peer, [topic])
                if score < 0:
                    log.debug("pruning relay peer %s from %s: score %.0f", peer, topic, score)
                    self.router.mesh[topic].discard(peer)
                    scorer.on_leave_mesh(peer, topic)
                    self.pruned += 1
                    try:
                        await self.router.emit_prune(topic, peer, False, False)
                    except Exception as exc:
                        log.debug("PRUNE to %s failed: %r", peer, exc)
        for peer in list(scorer.invalid_messages):
            score = scorer.score(peer, [])
            if score < scorer.params.graylist_threshold:
                self.graylist(peer, f"score {score:.0f}")

    async def run(self) -> None:
        while True:
            await trio.sleep(ENFORCE_INTERVAL_S)
            try:
                await self.enforce()
            except Exception:
                log.exception("relay peer scoring failed; trying again next heartbeat")
