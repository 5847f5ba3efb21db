"""discv5 (33/WAKU2-DISCV5, protocol id ``d5waku``) on UDP, as nwaku runs it.

:class:`Discv5Node` owns the UDP socket (nwaku's ``--discv5-udp-port``,
9000), the sessions (:class:`wakustore.protocols.discv5.Sessions`) and a
routing table (:class:`RoutingTable`: 256 buckets of 16 records by log
distance). It answers PING with PONG and FINDNODE with NODES (only under a
session: a handshake proves the address first, so a FINDNODE cannot be
used to reflect traffic at someone else), and walks the network: at start
it pings the bootstrap nodes (``--discv5-bootstrap-node``), then looks up
random targets, often while it knows few nodes, every minute after.
Each record learned (from a handshake or a NODES answer) goes to
``on_found``; the node hands those of relay nodes of its cluster sharing a
shard to the relay (node/discovery.py), as nwaku keeps only such peers.

With ``--discv5-enr-auto-update`` the address peers see us at (the
``recipient-ip``/``recipient-port`` of their PONGs) replaces the record's
``ip``/``udp`` once :data:`VOTES_NEEDED` peers agree on it.

Bounds: datagrams over 1280 bytes are dropped; packets per IP address are
rate limited (:data:`PACKETS_PER_SECOND`); sessions, challenges and
requests waiting for a WHOAREYOU are bounded tables (protocols/discv5.py);
requests in flight are at most :data:`MAX_WAITING`; a NODES answer is at
most 16 records; the table is at most 256 x 16 records.
"""

from __future__ import annotations

import collections
import ipaddress
import logging
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import trio

from wakustore.node.rate_limits import PeerAndAddressBuckets, RateLimit
from wakustore.protocols import discv5, enr
from wakustore.protocols.discv5 import Discv5Error, Message
from wakustore.protocols.errors import ProtocolError

log = logging.getLogger(__name__)

BUCKET_SIZE = 16
REQUEST_TIMEOUT_S = 2.0
LOOKUP_PARALLELISM = 3
LOOKUP_ROUNDS = 8
# Random walks: every WALK_INTERVAL_S, every FAST_WALK_INTERVAL_S while the
# table holds fewer than FEW_NODES records.
WALK_INTERVAL_S = 60.0
FAST_WALK_INTERVAL_S = 5.0
FEW_NODES = 16
# Packets a second (and bursts) per IP address before the rest is dropped.
PACKETS_PER_SECOND = RateLimit(100, 1.0)
MAX_WAITING = 256
MAX_DATAGRAM = discv5.MAX_PACKET_SIZE
VOTES_NEEDED = 3
MAX_VOTES = 16


class RoutingTable:
    """Records by log distance from ``local_id``, :data:`BUCKET_SIZE` a
    bucket; a full bucket keeps the records it has (the oldest are the
    likeliest to stay, as Kademlia prefers), and a newer record of a node
    replaces the one held."""

    def __init__(self, local_id: bytes, bucket_size: int = BUCKET_SIZE):
        self.local_id = local_id
        self.bucket_size = bucket_size
        self._buckets: list[collections.OrderedDict[bytes, enr.Enr]] = [collections.OrderedDict() for _ in range(257)]

    def __len__(self) -> int:
        return sum(len(b) for b in self._buckets)

    def add(self, record: enr.Enr) -> bool:
        """True when the record is new, or newer than the one held."""
        node = discv5.node_id(record.public_key)
        distance = discv5.log_distance(self.local_id, node)
        if distance == 0:
            return False
        bucket = self._buckets[distance]
        held = bucket.get(node)
        if held is not None:
            if record.seq <= held.seq:
                return False
            bucket[node] = record
            return True
        if len(bucket) >= self.bucket_size:
            return False
        bucket[node] = record
        return True

    def get(self, node: bytes) -> enr.Enr | None:
        return self._buckets[discv5.log_distance(self.local_id, node)].get(node)

    def remove(self, node: bytes) -> None:
        self._buckets[discv5.log_distance(self.local_id, node)].pop(node, None)

    def at_distances(self, distances: Sequence[int], limit: int) -> list[enr.Enr]:
        found: list[enr.Enr] = []
        for distance in distances:
            if 1 <= distance <= 256:
                found.extend(self._buckets[distance].values())
        return found[:limit]

    def closest(self, target: bytes, count: int) -> list[enr.Enr]:
        key = int.from_bytes(target, "big")
        everything = [r for bucket in self._buckets for r in bucket.values()]
        everything.sort(key=lambda r: int.from_bytes(discv5.node_id(r.public_key), "big") ^ key)
        return everything[:count]


def udp_address(record: enr.Enr) -> tuple[str, int] | None:
    """Where to send a record's node discv5 packets (IPv4 first)."""
    if record.ip is not None and record.udp is not None:
        return record.ip, record.udp
    if record.ip6 is not None and record.udp6 is not None:
        return record.ip6, record.udp6
    return None


@dataclass
class _Waiter:
    node: bytes
    expected: int
    send: Any
    messages: list[Message] = field(default_factory=list)


class Discv5Node:
    """One node's discv5; see the module docstring. ``record()`` gives the
    node's current record; ``on_found(record)`` is told each record learned;
    ``on_external(ip, port)`` the address peers agree we are at."""

    def __init__(
        self,
        private_key: bytes,
        record: Callable[[], enr.Enr],
        *,
        bootstrap: Sequence[enr.Enr] = (),
        on_found: Callable[[enr.Enr], None] = lambda record: None,
        on_external: Callable[[str, int], None] | None = None,
        protocol_id: bytes = discv5.WAKU_PROTOCOL_ID,
        walk_interval_s: float = WALK_INTERVAL_S,
        fast_walk_interval_s: float = FAST_WALK_INTERVAL_S,
        metrics: Any = None,
    ):
        self.sessions = discv5.Sessions(private_key, record, protocol_id)
        self.local_id = self.sessions.local_id
        self.table = RoutingTable(self.local_id)
        self.bootstrap = list(bootstrap)
        self.on_found = on_found
        self.on_external = on_external
        self.walk_interval_s = walk_interval_s
        self.fast_walk_interval_s = fast_walk_interval_s
        self.metrics = metrics
        self.buckets = PeerAndAddressBuckets(PACKETS_PER_SECOND)
        self._socket: Any = None
        self._waiting: dict[bytes, _Waiter] = {}
        self._votes: collections.OrderedDict[bytes, tuple[str, int]] = collections.OrderedDict()
        self.dropped: collections.Counter[str] = collections.Counter()

    def record(self) -> enr.Enr:
        """The node's current record (the one its sessions hand out)."""
        return self.sessions.record()

    # --- the socket -------------------------------------------------------------

    async def bind(self, host: str, port: int) -> int:
        """Open the UDP socket; returns its port (``port`` 0: the kernel's)."""
        family = trio.socket.AF_INET6 if ":" in host else trio.socket.AF_INET
        sock = trio.socket.socket(family, trio.socket.SOCK_DGRAM)
        from wakustore.node.host import binding

        try:
            with binding("discv5", host, port):
                await sock.bind((host, port))
        except OSError:
            sock.close()
            raise
        self._socket = sock
        return sock.getsockname()[1]

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Serve and walk until cancelled (after :meth:`bind`)."""
        assert self._socket is not None, "bind() first"
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._receive_loop)
                task_status.started()
                await self._walk()
        finally:
            self._socket.close()

    async def _receive_loop(self) -> None:
        while True:
            data, address = await self._socket.recvfrom(MAX_DATAGRAM + 1)
            address = (address[0], address[1])
            if len(data) > MAX_DATAGRAM:
                self._drop("too_large")
                continue
            if not self.buckets.allow("udp", address[0]):
                self._drop("rate_limited")
                continue
            try:
                await self._on_datagram(data, address)
            except (Discv5Error, ProtocolError) as exc:
                log.debug("discv5 packet from %s dropped: %s", address, exc)
                self._drop("invalid")

    def _drop(self, reason: str) -> None:
        self.dropped[reason] += 1
        if self.metrics is not None:
            self.metrics.discv5_dropped.labels(reason).inc()

    async def _send(self, packet: bytes, address: tuple[str, int]) -> None:
        try:
            await self._socket.sendto(packet, address)
        except OSError as exc:  # unreachable network, a closed port: the request times out
            log.debug("discv5 send to %s failed: %s", address, exc)

    async def _on_datagram(self, data: bytes, address: tuple[str, int]) -> None:
        received = self.sessions.receive(data, address, self.table.get)
        if received.reply is not None:
            await self._send(received.reply, address)
        if received.record is not None:
            self.learn(received.record)
        if received.message is not None and received.node_id is not None:
            await self._handle(received.message, received.node_id, address)

    def learn(self, record: enr.Enr) -> None:
        """Add ``record`` to the table (it needs an IP address and UDP
        port); a new one goes to ``on_found``."""
        if udp_address(record) is None:
            return
        if self.table.add(record):
            if self.metrics is not None:
                self.metrics.discv5_nodes.set(len(self.table))
            try:
                self.on_found(record)
            except Exception:
                log.exception("discv5: handling a found record failed")

    async def _handle(self, message: Message, node: bytes, address: tuple[str, int]) -> None:
        kind = message.kind
        if kind == discv5.PING:
            own = self.record()
            await self._send(
                self.sessions.send(node, address, discv5.pong(message.request_id, own.seq, address[0], address[1])),
                address,
            )
        elif kind == discv5.FINDNODE:
            distances = message.fields[0]
            records = [r.raw for r in self.table.at_distances(distances, discv5.MAX_NODES)]
            if 0 in distances:
                records.insert(0, self.record().raw)
            for answer in discv5.nodes_messages(message.request_id, records):
                await self._send(self.sessions.send(node, address, answer), address)
        elif kind == discv5.TALKREQ:
            # No talk protocol served: the empty answer the spec asks for.
            await self._send(
                self.sessions.send(node, address, Message(discv5.TALKRESP, message.request_id, (b"",))), address
            )
        else:
            waiter = self._waiting.get(message.request_id)
            if waiter is None or waiter.node != node or kind != waiter.expected:
                self._drop("unexpected")
                return
            waiter.messages.append(message)
            if kind == discv5.PONG:
                self._vote(node, message)
            total = message.fields[0] if kind == discv5.NODES else 1
            if len(waiter.messages) >= min(total, discv5.MAX_NODES_MESSAGES):
                waiter.send.send_nowait(None)

    # --- requests ---------------------------------------------------------------

    async def request(self, record: enr.Enr, build: Callable[[bytes], Message], expected: int) -> list[Message]:
        """Send a request to ``record``'s node and collect its answers;
        raises trio.TooSlowError when none comes in time."""
        address = udp_address(record)
        if address is None:
            raise Discv5Error("record without an IP address and UDP port")
        if len(self._waiting) >= MAX_WAITING:
            raise Discv5Error("too many requests in flight")
        request_id = secrets.token_bytes(8)
        node = discv5.node_id(record.public_key)
        send, receive = trio.open_memory_channel[None](1)
        waiter = _Waiter(node, expected, send)
        self._waiting[request_id] = waiter
        try:
            await self._send(self.sessions.send(node, address, build(request_id), record), address)
            with trio.move_on_after(REQUEST_TIMEOUT_S):
                await receive.receive()
            if not waiter.messages:
                raise trio.TooSlowError
            return waiter.messages
        finally:
            del self._waiting[request_id]

    async def ping(self, record: enr.Enr) -> Message:
        answers = await self.request(record, lambda rid: discv5.ping(rid, self.record().seq), discv5.PONG)
        return answers[0]

    async def find_node(self, record: enr.Enr, distances: Sequence[int]) -> list[enr.Enr]:
        """The records ``record``'s node holds at ``distances`` from it;
        records that are not at a requested distance are dropped (the spec
        asks it: they could be anything the answerer chose)."""
        answers = await self.request(record, lambda rid: discv5.findnode(rid, distances), discv5.NODES)
        asked = discv5.node_id(record.public_key)
        found = []
        for answer in answers:
            for raw in answer.fields[1][: discv5.MAX_NODES]:
                try:
                    other = enr.decode(raw)
                except ProtocolError:
                    continue
                distance = discv5.log_distance(asked, discv5.node_id(other.public_key))
                if distance in distances:
                    found.append(other)
        return found

    def _vote(self, node: bytes, pong: Message) -> None:
        if self.on_external is None:
            return
        _, raw_ip, port = pong.fields
        self._votes[node] = (str(ipaddress.ip_address(raw_ip)), port)
        self._votes.move_to_end(node)
        while len(self._votes) > MAX_VOTES:
            self._votes.popitem(last=False)
        counted = collections.Counter(self._votes.values())
        (ip, port), votes = counted.most_common(1)[0]
        own = self.record()
        if votes >= VOTES_NEEDED and (own.ip, own.udp) != (ip, port):
            log.info("discv5: %d peers see this node at %s:%d; updating the record", votes, ip, port)
            self.on_external(ip, port)

    # --- lookups --------------------------------------------------------------------

    async def lookup(self, target: bytes) -> list[enr.Enr]:
        """Iterative lookup of ``target``: ask the closest nodes known, up
        to :data:`LOOKUP_PARALLELISM` at a time, for nodes around it, until
        the closest answer nothing new."""
        asked: set[bytes] = set()
        found: dict[bytes, enr.Enr] = {}
        for _ in range(LOOKUP_ROUNDS):
            candidates = [r for r in self._closest(target, found) if discv5.node_id(r.public_key) not in asked][
                :LOOKUP_PARALLELISM
            ]
            if not candidates:
                break
            async with trio.open_nursery() as nursery:
                for record in candidates:
                    asked.add(discv5.node_id(record.public_key))
                    nursery.start_soon(self._ask_around, record, target, found)
        return list(found.values())

    def _closest(self, target: bytes, found: dict[bytes, enr.Enr]) -> list[enr.Enr]:
        key = int.from_bytes(target, "big")
        pool = {discv5.node_id(r.public_key): r for r in self.table.closest(target, BUCKET_SIZE)}
        pool.update(found)
        ordered = sorted(pool.items(), key=lambda item: int.from_bytes(item[0], "big") ^ key)
        return [r for _, r in ordered[:BUCKET_SIZE]]

    async def _ask_around(self, record: enr.Enr, target: bytes, found: dict[bytes, enr.Enr]) -> None:
        distance = discv5.log_distance(target, discv5.node_id(record.public_key))
        distances = [d for d in (distance, distance + 1, distance - 1) if 1 <= d <= 256] or [256]
        try:
            records = await self.find_node(record, distances)
        except (trio.TooSlowError, Discv5Error):
            self.table.remove(discv5.node_id(record.public_key))
            return
        for other in records:
            node = discv5.node_id(other.public_key)
            if node != self.local_id:
                found[node] = other
                self.learn(other)

    async def _walk(self) -> None:
        for record in self.bootstrap:
            self.learn(record)
        async with trio.open_nursery() as nursery:
            for record in self.bootstrap:
                nursery.start_soon(self._ping_quietly, record)
        while True:
            started = time.monotonic()
            found = await self.lookup(secrets.token_bytes(32))
            if self.metrics is not None:
                self.metrics.discovery_rounds.labels("discv5", "ok" if found else "none_found").inc()
            log.debug(
                "discv5 walk: %d records in %.1f s, %d in the table",
                len(found),
                time.monotonic() - started,
                len(self.table),
            )
            if not len(self.table):
                for record in self.bootstrap:
                    self.learn(record)
            fast = len(self.table) < FEW_NODES
            await trio.sleep(self.fast_walk_interval_s if fast else self.walk_interval_s)

    async def _ping_quietly(self, record: enr.Enr) -> None:
        try:
            await self.ping(record)
        except (trio.TooSlowError, Discv5Error) as exc:
            log.warning("discv5 bootstrap node %s did not answer: %s", record.text[:60], exc or "no answer")
