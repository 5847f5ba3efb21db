"""Which discovered relay nodes the relay dials, and when: the peer manager.

Discovery (DNS trees, peer exchange, discv5: node/discovery.py) hands the
relay candidates, each with the shards its record names. Every
:data:`ROUND_S` the manager looks at each served shard: while it has fewer
relay peers than :data:`TARGET_PER_SHARD` (gossipsub's mesh degree, as
nwaku aims its relay connections), it dials candidates of that shard, a
few at a time (:data:`DIALS_AT_ONCE`), within nwaku's shares of the
node's ``max_connections``: relay peers at most :data:`RELAY_SHARE` of it
(nwaku's ``--relay-service-ratio`` 60:40), and of those a third dialed by
this node (nwaku's outRelayPeersTarget; the rest are left to peers that
dial in), so that dialing stays within the connection caps. A failed dial backs the candidate off (doubling from
:data:`BACKOFF_FIRST_S` to :data:`BACKOFF_MAX_S`); after
:data:`MAX_FAILURES` failures in a row it is forgotten, which makes room
for others: a dead peer is replaced by the next candidate. A peer that
gossipsub's scoring graylisted is forgotten at once. A forgotten peer is
not taken back from discovery for :data:`FORGET_FOR_S`. The configured relay
peers (``--relay-peer``) are not the manager's: the relay keeps them
connected whatever happens (pinned).

States reported (metrics, the REST API's admin endpoints): ``connected``,
``candidate`` (may be dialed now), ``backoff``; forgotten peers are
counted by why.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import trio

log = logging.getLogger(__name__)

TARGET_PER_SHARD = 6
ROUND_S = 5.0
DIALS_AT_ONCE = 4
DIAL_TIMEOUT_S = 20.0
BACKOFF_FIRST_S = 5.0
BACKOFF_MAX_S = 600.0
MAX_FAILURES = 5
MAX_CANDIDATES = 200
# A forgotten peer is not taken back from discovery for this long (its
# record keeps coming back in other nodes' answers while they still hold it).
FORGET_FOR_S = 600.0
RELAY_SHARE = 0.6
OUT_SHARE = 1 / 3

CONNECTED = "connected"
CANDIDATE = "candidate"
BACKOFF = "backoff"


@dataclass
class Candidate:
    info: Any  # PeerInfo
    origin: str
    shards: frozenset[int]  # empty: not known (counts for every shard)
    failures: int = 0
    next_dial: float = 0.0
    dialed: bool = False  # connected by a dial of ours (an outbound relay peer)


class PeerManager:
    """Dials the relay's discovered candidates; see the module docstring.

    ``relay`` gives: ``connected(peer_id)``, ``shard_peer_count(shard)``,
    ``relay_peer_count()``, ``dial(info)`` (raises on failure),
    ``graylisted(peer_id)``; ``shards`` are the served shards.
    """

    def __init__(
        self,
        relay: Any,
        shards: Iterable[int],
        *,
        max_connections: int,
        target_per_shard: int = TARGET_PER_SHARD,
        clock: Callable[[], float] = time.monotonic,
        metrics: Any = None,
    ):
        self.relay = relay
        self.shards = sorted(set(shards))
        self.max_relay_peers = max(1, int(max_connections * RELAY_SHARE))
        self.max_outbound = max(1, int(self.max_relay_peers * OUT_SHARE))
        self.target_per_shard = target_per_shard
        self.clock = clock
        self.metrics = metrics
        self.round_s = ROUND_S
        self.backoff_first_s = BACKOFF_FIRST_S
        self.max_failures = MAX_FAILURES
        self.candidates: collections.OrderedDict[Any, Candidate] = collections.OrderedDict()
        self.forgotten: collections.Counter[str] = collections.Counter()
        self._forgotten_at: collections.OrderedDict[Any, float] = collections.OrderedDict()
        self._dialing: set[Any] = set()

    def add(self, info: Any, origin: str, shards: Iterable[int] = ()) -> bool:
        """Take a discovered relay node; False when it is known already, or
        was forgotten less than :data:`FORGET_FOR_S` ago."""
        forgotten = self._forgotten_at.get(info.peer_id)
        if forgotten is not None and self.clock() - forgotten < FORGET_FOR_S:
            return False
        known = self.candidates.get(info.peer_id)
        if known is not None:
            known.info, known.shards = info, frozenset(shards) or known.shards
            return False
        if len(self.candidates) >= MAX_CANDIDATES:
            # Room for the new one: the candidate that failed most, else the oldest.
            worst = max(self.candidates.values(), key=lambda c: (c.failures, -c.next_dial))
            self._forget(worst, "evicted")
        self.candidates[info.peer_id] = Candidate(info, origin, frozenset(shards))
        return True

    def state(self, candidate: Candidate) -> str:
        if self.relay.connected(candidate.info.peer_id):
            return CONNECTED
        return BACKOFF if candidate.next_dial > self.clock() else CANDIDATE

    def states(self) -> collections.Counter[tuple[str, str]]:
        return collections.Counter((c.origin, self.state(c)) for c in self.candidates.values())

    async def run(self) -> None:
        while True:
            await self.round()
            await trio.sleep(self.round_s)

    async def round(self) -> None:
        """One look at every served shard; dials what is missing."""
        for candidate in list(self.candidates.values()):
            if self.relay.graylisted(candidate.info.peer_id):
                self._forget(candidate, "graylisted")
        wanted = self._to_dial()
        if wanted:
            async with trio.open_nursery() as nursery:
                for candidate in wanted:
                    nursery.start_soon(self._dial, candidate)
        self._report()

    def outbound(self) -> int:
        """Relay peers connected by a dial of ours."""
        return sum(1 for c in self.candidates.values() if c.dialed and self.relay.connected(c.info.peer_id))

    def _to_dial(self) -> list[Candidate]:
        room = min(
            self.max_relay_peers - self.relay.relay_peer_count(),
            self.max_outbound - self.outbound(),
        ) - len(self._dialing)
        now = self.clock()
        chosen: list[Candidate] = []
        for shard in self.shards:
            missing = self.target_per_shard - self.relay.shard_peer_count(shard)
            for candidate in self.candidates.values():
                if missing <= 0 or room <= 0 or len(chosen) >= DIALS_AT_ONCE:
                    break
                if candidate in chosen or candidate.info.peer_id in self._dialing:
                    continue
                if candidate.shards and shard not in candidate.shards:
                    continue
                if candidate.next_dial > now or self.relay.connected(candidate.info.peer_id):
                    continue
                chosen.append(candidate)
                missing -= 1
                room -= 1
        return chosen

    async def _dial(self, candidate: Candidate) -> None:
        peer = candidate.info.peer_id
        self._dialing.add(peer)
        try:
            with trio.fail_after(DIAL_TIMEOUT_S):
                await self.relay.dial(candidate.info)
        except Exception as exc:  # any libp2p failure is a failed dial
            candidate.failures += 1
            self._count(candidate.origin, "failed")
            if candidate.failures >= self.max_failures:
                log.info("relay candidate %s: %d dials failed, forgotten", peer, candidate.failures)
                self._forget(candidate, "unreachable")
                return
            delay = min(self.backoff_first_s * 2 ** (candidate.failures - 1), BACKOFF_MAX_S)
            candidate.next_dial = self.clock() + delay
            log.debug("relay candidate %s: dial failed (%r), next in %.0f s", peer, exc, delay)
        else:
            candidate.failures = 0
            candidate.dialed = True
            self._count(candidate.origin, "connected")
        finally:
            self._dialing.discard(peer)

    def _forget(self, candidate: Candidate, why: str) -> None:
        self.candidates.pop(candidate.info.peer_id, None)
        self.forgotten[why] += 1
        self._forgotten_at[candidate.info.peer_id] = self.clock()
        self._forgotten_at.move_to_end(candidate.info.peer_id)
        while len(self._forgotten_at) > MAX_CANDIDATES:
            self._forgotten_at.popitem(last=False)
        if self.metrics is not None:
            self.metrics.relay_forgotten.labels(why).inc()

    def _count(self, origin: str, outcome: str) -> None:
        if self.metrics is not None:
            self.metrics.relay_dials.labels(origin, outcome).inc()

    def _report(self) -> None:
        if self.metrics is None:
            return
        states = self.states()
        for origin in ("Dns", "PeerExchange", "Discv5", "UnknownOrigin"):
            for state in (CONNECTED, CANDIDATE, BACKOFF):
                self.metrics.relay_candidates.labels(origin, state).set(states.get((origin, state), 0))
