"""11/WAKU2-RELAY: gossipsub on ``/vac/waku/relay/2.0.0``, on the node's host.

:func:`running_relay` attaches a gossipsub router to the libp2p host that
serves the store protocols, subscribes to the configured shards' pubsub
topics (``/waku/2/rs/<cluster>/<shard>``), dials the configured relay
peers and keeps them connected. Every message arriving on a topic goes
through a gossipsub validator (:meth:`Relay.validate`) before it is
forwarded: it must decode as a WakuMessage and pass the checks lightpush
applies (:class:`~wakustore.node.ingest.Ingest`, 57/STATUS-Simple-Scaling
signatures on protected topics included). A rejected message is neither
forwarded nor stored and is counted in ``wakustore_messages_rejected``
with source ``relay``; an accepted one is queued for the store
(:meth:`StoreService.put` with ``source="relay"``), unless it is ephemeral
or outside the timestamp drift window, which nwaku also relays without
archiving.

Waku relay as nwaku runs it (waku/waku_relay/protocol.nim,
message_id.nim), and what py-libp2p 0.8.1 needs to match it:

- StrictNoSign (``sign = false, verifySignature = false, anonymize =
  true``): messages carry no ``from``, ``seqno``, ``signature`` or ``key``.
  py-libp2p's ``Pubsub.publish`` always sets ``from`` and ``seqno``, so
  :class:`WakuPubsub` builds the message itself, and runs with
  ``strict_signing=False`` so unsigned messages are accepted.
- Message id = sha256(data), the raw 32 bytes. py-libp2p keys its
  message cache (IHAVE/IWANT) and its equivocation check by
  ``from + seqno``, which is empty for every StrictNoSign message:
  :class:`WakuGossipSub` replaces the cache with one keyed by the message
  id and drops the equivocation check (content-addressed ids cannot
  equivocate).
- py-libp2p's router refuses protocol ids it does not know (``add_peer``
  raises, logged at DEBUG, and nothing is ever delivered):
  ``/vac/waku/relay/2.0.0`` is handled as ``/meshsub/1.1.0``, which is
  what nim-libp2p speaks under that id (no IDONTWANT, a 1.2 feature it
  only enables under ``/meshsub/1.2.0``).
- Parameters: D 6, D_low 4, D_high 8, heartbeat 1 s, history 6, gossip
  window 3, fanout TTL 60 s, seen TTL 2 min, prune backoff 60 s,
  unsubscribe backoff 5 s, flood publish for our own messages. The
  py-libp2p extensions nwaku does not have (per-peer rate cap of 10
  messages/s per topic, adaptive gossip, IP-diversity grafting) are off.
- Size: nwaku caps a whole gossipsub RPC frame at the node's
  ``--max-msg-size`` (150 KiB). Ours reads frames up to the node's
  ``max_message_size`` plus :data:`RPC_OVERHEAD` and resets the stream of
  a peer that sends more.

- Metadata (66/WAKU2-METADATA): every relay peer, whichever side dialed,
  is asked for its cluster and shards as it joins, and one that reports
  no cluster id, another cluster, or no shard in common is disconnected
  (nwaku's ``onPeerMetadata``, waku/node/peer_manager/peer_manager.nim;
  :func:`~wakustore.protocols.metadata.refusal`). A peer we dial is asked
  before its relay stream opens, so the dial fails instead. A peer that
  does not serve metadata is kept (nwaku drops it).
- Peer scoring: nwaku's parameters (P2, P4 for invalid messages, the
  gossip/publish/graylist thresholds), with pruning, graylisting and
  disconnection done by :mod:`wakustore.node.relay_scoring`, which
  py-libp2p's router lacks.

Not matched: peer exchange is off.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Iterable
from contextlib import asynccontextmanager
from typing import Any, cast

import trio
from libp2p.abc import IHost
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo
from libp2p.pubsub.gossipsub import PROTOCOL_ID_V11, GossipSub
from libp2p.pubsub.mcache import CacheEntry, MessageCache
from libp2p.pubsub.pb import rpc_pb2
from libp2p.pubsub.pubsub import Pubsub
from libp2p.tools.anyio_service import background_trio_service

from wakustore.node.config import NodeConfig
from wakustore.node.host import HostError
from wakustore.node.ingest import DISK_FULL, Ingest, Refused
from wakustore.node.peer_manager import PeerManager
from wakustore.node.relay_scoring import ScoreKeeper, WakuPeerScorer
from wakustore.protocols import metadata
from wakustore.protocols.errors import MessageError, ProtocolError
from wakustore.protocols.message import WakuMessage
from wakustore.protocols.message_codec import decode_message, encode_message
from wakustore.protocols.topics import parse_shard_topic
from wakustore.transport.peers import PeerAddressError, connect, parse_peer

log = logging.getLogger(__name__)

# nwaku's WakuRelayCodec (waku/waku_core/codecs.nim).
PROTOCOL_ID = "/vac/waku/relay/2.0.0"

# nwaku's GossipsubParameters (waku/waku_relay/protocol.nim).
MESH_DEGREE = 6
MESH_DEGREE_LOW = 4
MESH_DEGREE_HIGH = 8
HEARTBEAT_INTERVAL_S = 1
HISTORY_LENGTH = 6
HISTORY_GOSSIP = 3
FANOUT_TTL_S = 60
SEEN_TTL_S = 120
PRUNE_BACKOFF_S = 60
UNSUBSCRIBE_BACKOFF_S = 5

# Room for what shares an RPC frame with one message of the maximum size
# (the topic, control messages, a signed peer record): nwaku's
# DefaultSafetyBufferProtocolOverhead, the margin it gives lightpush and
# store frames over the message size limit.
RPC_OVERHEAD = 64 * 1024

# Accepted messages wait here for the store; the store takes them in
# batches (a WAL append and fsync each). 4096 messages is a few seconds of
# a busy shard (Status' busiest see tens of messages a second); when the
# store falls that far behind, messages are still relayed but not stored,
# and counted as rejected with reason "overloaded".
STORE_QUEUE = 4096
STORE_BATCH = 500

# Relay peers from the configuration: dialed at start, checked every
# KEEP_CONNECTED_S and redialed with exponential backoff.
DIAL_TIMEOUT_S = 20.0
KEEP_CONNECTED_S = 5.0
REDIAL_FIRST_S = 1.0
REDIAL_MAX_S = 60.0

# Relay nodes found by discovery are dialed by the peer manager
# (node/peer_manager.py): a target per shard, within max_connections
# (nwaku's default of 50 when that cap is off).
DEFAULT_MAX_CONNECTIONS = 50

# Relay peers waiting to be asked for their metadata, and how long one may
# take to answer (a loopback answer takes milliseconds).
JOINED_QUEUE = 256
METADATA_TIMEOUT_S = 10.0

# Rejection reasons the relay adds to the ingest ones.
UNDECODABLE = "undecodable"
NOT_ONE_TOPIC = "not_one_topic"
OVERLOADED = "overloaded"


def message_id(msg: rpc_pb2.Message) -> bytes:
    """nwaku's defaultMessageIdProvider: sha256 of the message data, 32 bytes."""
    return hashlib.sha256(msg.data).digest()


class MessageIds:
    """:func:`message_id`, hashed once per message: py-libp2p asks for the
    id of the message it handles up to five times in a row (seen check,
    validation cache, seen mark, gossip cache, our publish count). The last
    message object is kept and its id returned while the same object is
    asked about; messages are not modified once built or parsed."""

    __slots__ = ("_msg", "_mid")

    def __init__(self) -> None:
        self._msg: rpc_pb2.Message | None = None
        self._mid = b""

    def __call__(self, msg: rpc_pb2.Message) -> bytes:
        if msg is not self._msg:
            self._mid = message_id(msg)
            self._msg = msg
        return self._mid


class WakuMessageCache(MessageCache):
    """py-libp2p's gossip message cache keyed by the Waku message id
    instead of ``from + seqno``."""

    def __init__(self, window_size: int, history_size: int, ids: MessageIds):
        super().__init__(window_size, history_size)
        self._ids = ids

    def put(self, msg: rpc_pb2.Message) -> None:
        mid = self._ids(msg)
        if mid in self.msgs:
            return
        self.msgs[mid] = msg
        # A slotted stand-in for py-libp2p's CacheEntry (same two fields).
        self.history[0].append(cast(CacheEntry, _CacheEntry(mid, msg.topicIDs)))


class _CacheEntry:
    __slots__ = ("mid", "topics")

    def __init__(self, mid: bytes, topics: Iterable[str]):
        self.mid = mid
        self.topics = list(topics)


class WakuGossipSub(GossipSub):
    """GossipSub as nwaku runs it (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__(
            protocols=[TProtocol(PROTOCOL_ID)],
            degree=MESH_DEGREE,
            degree_low=MESH_DEGREE_LOW,
            degree_high=MESH_DEGREE_HIGH,
            time_to_live=FANOUT_TTL_S,
            gossip_window=HISTORY_GOSSIP,
            gossip_history=HISTORY_LENGTH,
            heartbeat_interval=HEARTBEAT_INTERVAL_S,
            prune_back_off=PRUNE_BACKOFF_S,
            unsubscribe_back_off=UNSUBSCRIBE_BACKOFF_S,
            adaptive_gossip_enabled=False,
            spam_protection_enabled=False,
            eclipse_protection_enabled=False,
        )
        # Shared with WakuPubsub as its message id constructor.
        self.ids = MessageIds()
        self.mcache = WakuMessageCache(HISTORY_GOSSIP, HISTORY_LENGTH, self.ids)
        # Message id -> peers our own publish went to, read by WakuPubsub.publish.
        self.published_to: dict[bytes, int] = {}
        self.scorer: WakuPeerScorer = WakuPeerScorer()
        # Told of every peer that joins (Relay vets its metadata).
        self.on_peer_added: Callable[[ID], None] | None = None

    async def handle_graft(self, graft_msg: rpc_pb2.ControlGraft, sender_peer_id: ID) -> None:
        """gossipsub v1.1: a GRAFT from a peer with a negative score is answered with PRUNE."""
        if self.scorer.score(sender_peer_id, [graft_msg.topicID]) < 0:
            await self.emit_prune(graft_msg.topicID, sender_peer_id, False, False)
            return
        await super().handle_graft(graft_msg, sender_peer_id)

    def add_peer(self, peer_id: ID, protocol_id: TProtocol | None) -> None:
        if protocol_id == PROTOCOL_ID:
            protocol_id = PROTOCOL_ID_V11
        super().add_peer(peer_id, protocol_id)
        if self.on_peer_added is not None:
            self.on_peer_added(peer_id)

    def _check_equivocation(self, msg: rpc_pb2.Message) -> bool:
        return True

    async def publish(self, msg_forwarder: ID, pubsub_msg: rpc_pb2.Message) -> None:
        """Forward a validated message; our own go to every peer subscribed
        to the topic (nwaku's floodPublish), not only the mesh."""
        pubsub = self.pubsub
        if pubsub is None or msg_forwarder != pubsub.my_id:
            await super().publish(msg_forwarder, pubsub_msg)
            return
        self.mcache.put(pubsub_msg)
        peers: set[ID] = set()
        for topic in pubsub_msg.topicIDs:
            peers.update(p for p in pubsub.peer_topics.get(topic, ()) if p in pubsub.peers)
            self.time_since_last_publish[topic] = int(time.time())
        rpc = rpc_pb2.RPC(publish=[pubsub_msg])
        for peer in peers:
            self.send_rpc(peer, rpc)
        self.published_to[self.ids(pubsub_msg)] = len(peers)


class WakuPubsub(Pubsub):
    """Pubsub with StrictNoSign publishing, the Waku message id and a read
    loop that survives anything a peer sends."""

    def __init__(self, host: IHost, router: WakuGossipSub, topics: Iterable[str], max_rpc_size: int):
        super().__init__(
            host,
            router,
            strict_signing=False,
            msg_id_constructor=router.ids,
            seen_ttl=SEEN_TTL_S,
            max_inbound_rpc_size=max_rpc_size,
            allowed_topics=frozenset(topics),
        )
        # Told of every relay stream that fails (ScoreKeeper.strike).
        self.on_failed_stream: Callable[[ID], None] | None = None

    async def publish(self, topic_id: str | list[str], data: bytes) -> int:  # type: ignore[override]
        """Publish ``data`` on ``topic_id`` without from, seqno or signature;
        return the number of peers it was sent to (0 for a message already
        seen, or rejected by the topic's validator)."""
        topics = [topic_id] if isinstance(topic_id, str) else list(topic_id)
        msg = rpc_pb2.Message(data=data, topicIDs=topics)
        router = cast(WakuGossipSub, self.router)
        mid = router.ids(msg)
        try:
            await self.push_msg(self.my_id, msg)
        finally:
            sent = router.published_to.pop(mid, 0)
        return sent

    def notify_subscriptions(self, publish_message: rpc_pb2.Message) -> None:
        """Delivery happens in the validator (:meth:`Relay.validate`); the
        per-topic subscription channels are never read."""

    async def stream_handler(self, stream) -> None:
        """py-libp2p's handler lets an unparsable RPC (a protobuf
        DecodeError) escape into the connection; reset the stream instead."""
        try:
            await super().stream_handler(stream)
        except Exception as exc:
            peer_id = stream.muxed_conn.peer_id
            log.debug("relay stream from %s failed: %r", peer_id, exc)
            try:
                await stream.reset()
            except Exception:
                pass
            self._handle_dead_peer(peer_id)
            if self.on_failed_stream is not None:
                self.on_failed_stream(peer_id)


class MetadataRefused(Exception):
    """A peer dropped for its metadata (another cluster, no shard in common)."""


class Relay:
    """The node's relay: router, pubsub and the validator that feeds the store.

    Created and run by :func:`running_relay`. :meth:`publish` is what
    lightpush calls; :attr:`peers` and :meth:`peer_count` report the relay
    peers (peers with an open relay stream).
    """

    def __init__(self, host: IHost, config: NodeConfig, ingest: Ingest):
        self.host = host
        self.ingest = ingest
        self.topics = sorted(ingest.pubsub_topics)
        self.peer_infos = [peer_info(addr) for addr in config.relay_peers]
        # Where each relay peer came from (nwaku's origins: Static, Dns,
        # PeerExchange, Discv5), for the REST API; the peer manager dials
        # those discovery found.
        self.origins: dict[ID, str] = {info.peer_id: "Static" for info in self.peer_infos}
        # Called with (pubsub topic, message) for each valid relayed message
        # (the REST API's relay cache).
        self.on_message: Callable[[str, WakuMessage], None] | None = None
        self._nursery: trio.Nursery | None = None
        self.router = WakuGossipSub()
        self.pubsub = WakuPubsub(host, self.router, self.topics, max_rpc_size=config.max_message_size + RPC_OVERHEAD)
        self.running = False
        self._store_send, self._store_receive = trio.open_memory_channel[tuple[str, Any, int]](STORE_QUEUE)
        self.scores = ScoreKeeper(self.router, self.pubsub, host.disconnect)
        self.metadata = metadata.Metadata(cluster_id=config.cluster_id, shards=tuple(config.shards))
        self._joined_send, self._joined_receive = trio.open_memory_channel[ID](JOINED_QUEUE)
        self.router.on_peer_added = self._joined
        self.pubsub.on_failed_stream = self.scores.strike
        self.manager = PeerManager(
            self,
            config.shards,
            max_connections=config.max_connections or DEFAULT_MAX_CONNECTIONS,
            metrics=getattr(ingest.service, "metrics", None),
        )

    @property
    def peers(self) -> list[ID]:
        return list(self.pubsub.peers)

    def peer_count(self, topic: str | None = None) -> int:
        """Relay peers, or those subscribed to ``topic``."""
        if topic is None:
            return len(self.pubsub.peers)
        return sum(1 for p in self.pubsub.peer_topics.get(topic, ()) if p in self.pubsub.peers)

    async def publish(self, pubsub_topic: str, message) -> int:
        """Relay one WakuMessage that the caller has checked and stored;
        return the number of peers it went to (0 when relay is not running)."""
        if not self.running:
            return 0
        return await self.pubsub.publish(pubsub_topic, encode_message(message))

    def validate(self, forwarder: ID, msg: rpc_pb2.Message) -> bool:
        """The gossipsub validator of every served topic: True forwards the
        message. Never raises (an exception would stop py-libp2p's pubsub)."""
        try:
            return self._validate(forwarder, msg)
        except Exception:
            log.exception("relay validator failed; rejecting the message")
            return False

    def _validate(self, forwarder: ID, msg: rpc_pb2.Message) -> bool:
        if len(msg.topicIDs) != 1:
            self._count(NOT_ONE_TOPIC)
            return False
        if forwarder == self.pubsub.my_id:
            return True  # pushed to us by lightpush: decoded, checked and stored there
        topic = msg.topicIDs[0]
        try:
            message = decode_message(msg.data)
        except MessageError:
            self._count(UNDECODABLE)
            return False
        now = time.time_ns()
        try:
            self.ingest.check(topic, message, len(msg.data), now)
        except Refused as refusal:
            self.ingest.count("relay", refusal)
            if refusal.relayable and self.on_message is not None:
                self.on_message(topic, message)
            return refusal.relayable
        if self.on_message is not None:
            self.on_message(topic, message)
        disk = getattr(self.ingest.service, "disk", None)
        if disk is not None and disk.full():
            self._count(DISK_FULL)  # relayed, not stored: space comes first
            return True
        try:
            self._store_send.send_nowait((topic, message, now))
        except trio.WouldBlock:
            self._count(OVERLOADED)
        return True

    def _count(self, reason: str) -> None:
        self.ingest.count("relay", Refused(reason, reason))

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Run gossipsub, subscribe, store and keep the relay peers connected
        until cancelled. A failure after start is logged and stops the relay
        only (the node keeps serving the store protocols)."""
        started = False
        try:
            async with background_trio_service(self.pubsub), background_trio_service(self.router):
                await self.pubsub.wait_until_ready()
                for topic in self.topics:
                    self.pubsub.set_topic_validator(topic, self.validate, is_async_validator=False)
                    await self.pubsub.subscribe(topic)
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._store_loop)
                    nursery.start_soon(self._vet_loop)
                    nursery.start_soon(self.scores.run)
                    for info in self.peer_infos:
                        nursery.start_soon(self._keep_connected, info)
                    nursery.start_soon(self.manager.run)
                    self._nursery = nursery
                    self.running = True
                    started = True
                    task_status.started()
                    await trio.sleep_forever()
        except Exception as exc:
            if not started:
                raise
            log.error("relay stopped after an internal error; store protocols keep running: %r", exc)
        finally:
            self.running = False

    async def _store_loop(self) -> None:
        async with self._store_receive:
            async for first in self._store_receive:
                batch = [first]
                while len(batch) < STORE_BATCH:
                    try:
                        batch.append(self._store_receive.receive_nowait())
                    except trio.WouldBlock:
                        break
                try:
                    await self.ingest.store(batch, source="relay")
                except Exception as exc:
                    log.warning("storing %d relayed messages failed: %s", len(batch), exc)

    async def _keep_connected(self, info: PeerInfo) -> None:
        delay = REDIAL_FIRST_S
        while True:
            if not self._connected(info.peer_id):
                try:
                    with trio.fail_after(DIAL_TIMEOUT_S):
                        await self.dial(info)
                except Exception as exc:
                    log.warning(
                        "relay peer %s: cannot connect (%s); retrying in %.0f s",
                        info.peer_id,
                        exc or type(exc).__name__,
                        delay,
                    )
                    await trio.sleep(delay)
                    delay = min(delay * 2, REDIAL_MAX_S)
                    continue
                log.info("relay peer %s connected", info.peer_id)
                delay = REDIAL_FIRST_S
            await trio.sleep(KEEP_CONNECTED_S)

    def add_discovered(self, info: PeerInfo, origin: str = "UnknownOrigin", shards: Iterable[int] = ()) -> bool:
        """Give the peer manager ``info`` (a relay node discovery found,
        by ``origin``, on ``shards``); False when it is a configured relay
        peer, ourselves, or known already."""
        if info.peer_id == self.host.get_id() or any(i.peer_id == info.peer_id for i in self.peer_infos):
            return False
        new = self.manager.add(info, origin, shards)
        if new:
            self.origins[info.peer_id] = origin
        return new

    # --- what the peer manager asks -----------------------------------------------

    def connected(self, peer_id: ID) -> bool:
        return peer_id in self.pubsub.peers and self._connected(peer_id)

    def shard_peer_count(self, shard: int) -> int:
        return sum(self.peer_count(t) for t in self.topics if parse_shard_topic(t).index == shard)

    def relay_peer_count(self) -> int:
        return len(self.pubsub.peers)

    def graylisted(self, peer_id: ID) -> bool:
        return self.scores.is_graylisted(peer_id)

    async def dial(self, info: PeerInfo) -> None:
        """Connect to ``info``, check its metadata and open the relay stream;
        raises on failure (:class:`MetadataRefused` for a peer dropped for
        its metadata)."""
        await connect(self.host, info)
        reason = await self.vet(info.peer_id)
        if reason is not None:
            await self._drop(info.peer_id, reason)
            raise MetadataRefused(reason)
        if not self._connected(info.peer_id):
            # Dropped meanwhile: our router opens its stream on connect, and
            # the peer is vetted as it joins too.
            raise MetadataRefused("disconnected while its metadata was asked")
        await self.pubsub.ensure_peer_stream(info.peer_id, timeout=DIAL_TIMEOUT_S)

    async def vet(self, peer_id: ID) -> str | None:
        """Why the relay peer ``peer_id`` is to be dropped for its metadata
        (:func:`metadata.refusal`), or None to keep it; a peer that does
        not answer metadata is kept."""
        from wakustore.clients.store import ClientError, StoreClient

        try:
            theirs = await StoreClient(self.host, peer_id, METADATA_TIMEOUT_S).metadata(self.metadata)
        except (ClientError, ProtocolError) as exc:
            log.debug("relay peer %s: no metadata (%s); kept", peer_id, exc)
            return None
        return metadata.refusal(self.metadata, theirs, relay_peer=True)

    def _joined(self, peer_id: ID) -> None:
        try:
            self._joined_send.send_nowait(peer_id)
        except trio.WouldBlock:
            log.debug("relay peer %s joined while %d wait to be vetted; not vetted", peer_id, JOINED_QUEUE)

    async def _vet_loop(self) -> None:
        async with self._joined_receive, trio.open_nursery() as nursery:
            async for peer_id in self._joined_receive:
                nursery.start_soon(self._vet_joined, peer_id)

    async def _vet_joined(self, peer_id: ID) -> None:
        reason = await self.vet(peer_id)
        if reason is not None:
            await self._drop(peer_id, reason)

    async def _drop(self, peer_id: ID, reason: str) -> None:
        log.info("relay peer %s dropped: %s", peer_id, reason)
        try:
            await self.host.disconnect(peer_id)
        except Exception as exc:  # a connection already gone
            log.debug("dropping %s: %r", peer_id, exc)

    def _connected(self, peer_id: ID) -> bool:
        for conn in self.host.get_network().get_connections(peer_id):
            muxed = getattr(conn, "muxed_conn", None)
            if muxed is None or not getattr(muxed, "is_closed", False):
                return True
        return False


@asynccontextmanager
async def running_relay(host: IHost, config: NodeConfig, ingest: Ingest):
    """Run the relay on ``host`` until the block exits; yield the
    :class:`Relay`, or None when ``config.relay`` is off. Raises
    :class:`HostError` for a relay peer that is not a multiaddr ending in
    ``/p2p/<peer id>``."""
    if not config.relay:
        yield None
        return
    relay = Relay(host, config, ingest)
    async with trio.open_nursery() as nursery:
        await nursery.start(relay.run)
        try:
            yield relay
        finally:
            nursery.cancel_scope.cancel()


def peer_info(addr: str) -> PeerInfo:
    """PeerInfo of a multiaddr ending in ``/p2p/<peer id>``; HostError otherwise."""
    try:
        return parse_peer(addr)
    except PeerAddressError as exc:
        raise HostError(f"relay peer: {exc}") from None
