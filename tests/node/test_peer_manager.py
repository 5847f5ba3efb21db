"""The peer manager's decisions, on a relay whose dials the test decides:
per-shard targets, nwaku's relay and outbound shares, backoff, forgetting."""

from __future__ import annotations

import trio

from wakustore.node.peer_manager import PeerManager


class Info:
    def __init__(self, peer_id: str):
        self.peer_id = peer_id


class Relay:
    """What the manager asks of the relay; ``reachable`` decides dials."""

    def __init__(self, reachable: set[str]):
        self.reachable = reachable
        self.connected_on: dict[str, set[int]] = {}
        self.shards_of: dict[str, set[int]] = {}
        self.gray: set[str] = set()
        self.dials: list[str] = []

    def connected(self, peer_id: str) -> bool:
        return peer_id in self.connected_on

    def shard_peer_count(self, shard: int) -> int:
        return sum(1 for shards in self.connected_on.values() if shard in shards)

    def relay_peer_count(self) -> int:
        return len(self.connected_on)

    def graylisted(self, peer_id: str) -> bool:
        return peer_id in self.gray

    async def dial(self, info) -> None:
        self.dials.append(info.peer_id)
        if info.peer_id not in self.reachable:
            raise OSError("connection refused")
        self.connected_on[info.peer_id] = self.shards_of[info.peer_id]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _manager(relay: Relay, clock: Clock, max_connections: int = 50) -> PeerManager:
    return PeerManager(relay, [1, 2], max_connections=max_connections, target_per_shard=2, clock=clock)


def _add(manager: PeerManager, relay: Relay, name: str, shards: set[int]) -> None:
    relay.shards_of[name] = shards
    manager.add(Info(name), "Discv5", shards)


def test_dials_each_shard_up_to_its_target_and_no_further():
    relay, clock = Relay({"a", "b", "c", "d", "e"}), Clock()
    manager = _manager(relay, clock)
    for name, shards in (("a", {1}), ("b", {1}), ("c", {1}), ("d", {2}), ("e", {2})):
        _add(manager, relay, name, shards)
    trio.run(manager.round)
    assert sorted(relay.connected_on) == ["a", "b", "d", "e"]  # two a shard; c not needed
    trio.run(manager.round)
    assert "c" not in relay.dials


def test_outbound_dials_stay_within_nwakus_shares_of_max_connections():
    names = [f"p{i}" for i in range(20)]
    relay, clock = Relay(set(names)), Clock()
    # 10 connections: 6 relay peers, 2 of them dialed by us.
    manager = PeerManager(relay, [1], max_connections=10, target_per_shard=6, clock=clock)
    for name in names:
        _add(manager, relay, name, {1})
    for _ in range(3):
        trio.run(manager.round)
    assert len(relay.connected_on) == 2 and manager.outbound() == 2


def test_dead_peers_back_off_are_forgotten_and_replaced():
    relay, clock = Relay({"alive"}), Clock()
    manager = _manager(relay, clock)
    manager.max_failures = 3
    _add(manager, relay, "dead", {1})
    trio.run(manager.round)
    assert relay.dials == ["dead"] and manager.state(manager.candidates["dead"]) == "backoff"
    trio.run(manager.round)
    assert relay.dials == ["dead"]  # backing off: not dialed again yet
    for _ in range(2):
        clock.now += 3600
        trio.run(manager.round)
    assert "dead" not in manager.candidates and manager.forgotten["unreachable"] == 1
    # Discovery hands it back (other nodes still list it): not taken for a while.
    assert not manager.add(Info("dead"), "Discv5", {1})
    clock.now += 601
    assert manager.add(Info("dead"), "Discv5", {1})
    _add(manager, relay, "alive", {1})
    trio.run(manager.round)
    assert relay.connected("alive")


def test_graylisted_peers_are_forgotten_at_once():
    relay, clock = Relay({"a"}), Clock()
    manager = _manager(relay, clock)
    _add(manager, relay, "a", {1})
    relay.gray.add("a")
    trio.run(manager.round)
    assert relay.dials == [] and manager.forgotten["graylisted"] == 1
