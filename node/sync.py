"""Waku Sync and Store Resume between store nodes (waku-org/specs
standards/core/store-sync.md).

:class:`SyncService` serves ``/vac/waku/reconciliation/1.0.0`` and
``/vac/waku/transfer/1.0.0`` on the node's libp2p host (the codecs and the
reconciliation state machine are :mod:`wakustore.protocols.sync`) and, when
``sync_peers`` are configured:

- **Store Resume** once at start: a Store v3 query to the sync peers, one
  after the other until one answers, for [last online, now], at most
  ``resume_max_s`` (default 6 h, the spec's recommendation). "Last online"
  is ``<data_dir>/last_online`` (Unix ns), written every
  :data:`LAST_ONLINE_INTERVAL_S` and when the node stops; without it, the
  newest stored message's timestamp; with neither (a fresh node) there is
  no gap to fill.
- **Waku Sync** every ``sync_interval_s`` (default 300 s, nwaku's): one
  session with each sync peer over [now - ``sync_range_s``, now - 20 s]
  (nwaku's range of 1 h and its 20 s gossipsub jitter, so messages still
  in flight are not counted missing), after which each side sends the
  other what it lacks over transfer. The first round runs one interval
  after start (resume covers the start).

Both sides of a session read their ids from the store (pages of
``(timestamp, hash)``, no message data) over the session's window; the
peer's window is honoured up to ``sync_range_s`` + :data:`RESPONDER_SLACK_S`
into the past, older ranges are answered as agreed (skipped), as nwaku
does beyond its cache. Messages received over transfer take the path of
relay and lightpush (:class:`~wakustore.node.ingest.Ingest` checks, then
``StoreService.put``, deduplicated by MUID), except that their age is not
held against them: the drift check is made against the message's own
timestamp (a future one is still refused). Transfers are accepted only
from a peer with a session running or ended within
:data:`TRANSFER_GRACE_S` (the spec's SHOULD; nwaku sends what a session
found right after it), at most :data:`~wakustore.protocols.sync.MAX_DIFFERENCES`
messages per stream.

**MUID deduplication.** The table keeps one row per MUID; Waku Sync (and
nwaku) key messages by hash. Two messages with the same MUID and different
timestamps have different hashes: a peer keyed by hash holds both, this
node one. Left alone, every round would find the other hash missing, the
peer would send it, and the store would drop it again. So every id this
node received over transfer or resume and *handled* (stored, dropped as a
MUID duplicate, or refused by the checks) is remembered in a bounded set
(:class:`SeenIds`, :data:`MAX_SEEN_IDS`, pruned past the sync window) that
is added to the store's ids whenever a session reads them. The fingerprint
then agrees with the peer's: such a hash is fetched once, not every round,
and a peer keyed by hash (nwaku) finds no difference either, so it does
not loop. If such a peer lacks the hash, this node cannot send it (the
table has no row under that hash) and the range is simply reconciled again
next round. The set lives in memory: after a restart each such hash is
fetched once more.

A bad payload on either protocol (undecodable, over a limit, a session
that does not converge within :data:`~wakustore.protocols.sync.MAX_ROUNDS`)
resets the stream: the protocol has no status code, and nwaku treats a
reset or closed stream as a failed session. On transfer, nwaku
(waku_store_sync/transfer.nim) ends the stream at a frame over its size
limit and skips one it cannot decode; this node resets at either (the
bytes after an oversized prefix cannot be framed, and a peer whose frames
do not decode is not a store node), keeping the messages that came
before. A message that fails the storable checks is skipped and the
stream goes on, as in nwaku.

A session in progress when the node stops is cancelled with the node's
peer tasks (the initiator side) or the host (the responder side): its
stream is reset and nothing is logged above debug level.
"""

from __future__ import annotations

import logging
import random
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

import trio
from libp2p.io.exceptions import IOException

from wakustore.durable import make_dirs, replace_durably
from wakustore.node.config import NodeConfig
from wakustore.node.ingest import Ingest, Refused
from wakustore.protocols import sync
from wakustore.protocols.errors import FramingError, ProtocolError, SyncError
from wakustore.protocols.message import WakuMessage, message_hash
from wakustore.protocols.message_codec import encode_message
from wakustore.protocols.store_query import HistoryQuery, StatusCode
from wakustore.protocols.topics import shard_pubsub_topic
from wakustore.storage.reader import TableUnreadable
from wakustore.transport.peers import connect, parse_peer
from wakustore.transport.streams import Frames, close_stream, peer_of, reset_stream, write_frame

log = logging.getLogger(__name__)

NS = 1_000_000_000

# nwaku's DefaultGossipSubJitter (waku/waku_store_sync/common.nim) and the
# spec's "Sync Window": the newest 20 s are left out of a session.
RELAY_JITTER_S = 20.0

LAST_ONLINE_FILE = "last_online"
# How often "last online" is written: a crash loses at most this much of
# the gap resume then re-reads (the overlap is deduplicated).
LAST_ONLINE_INTERVAL_S = 30.0

# A whole session (all rounds) and one read within it. nwaku answers each
# payload in milliseconds; a minute covers a session over a million ids.
SESSION_TIMEOUT_S = 60.0
READ_TIMEOUT_S = 20.0
WRITE_TIMEOUT_S = 30.0
# Dialing a sync peer (as clients.store.DEFAULT_TIMEOUT_S).
DIAL_TIMEOUT_S = 20.0
# Transfers from a peer are accepted this long after its session ended.
TRANSFER_GRACE_S = 60.0
# An open transfer stream may idle this long between messages.
TRANSFER_IDLE_S = 30.0

# Ids read from the store for one session (sync.IdSet: ~72 bytes an id, so
# ~36 MB): an hour at ~140 messages a second. A window holding more ends
# the session with a warning; lower sync_range_s for such a network.
MAX_LOCAL_IDS = 500_000
# Page size for reading ids and messages from the store.
ID_PAGE = 1000
HASH_LOOKUP_PAGE = 100
# Messages put into the store at once from a transfer stream.
PUT_BATCH = 256

# The peer's window may reach this much further back than ours (clocks and
# configured ranges differ between nodes).
RESPONDER_SLACK_S = 600.0

# Ids remembered as handled (see the module docstring): ~150 bytes each.
MAX_SEEN_IDS = 200_000

# Store Resume: at most this many messages (6 h at ~90 messages a second),
# so a peer that pages forever is bounded; Store v3 pages of 100.
MAX_RESUME_MESSAGES = 2_000_000
RESUME_PAGE = 100

# Metric labels (node/metrics.py): a session's role and outcome, a
# transfer's direction, how an incoming transfer stream ended, a resume's
# outcome.
INITIATOR = "initiator"
RESPONDER = "responder"
OUTCOME_OK = "ok"
OUTCOME_FAILED = "failed"
RECEIVED = "received"
SENT = "sent"
TRANSFER_OK = "ok"
TRANSFER_REFUSED = "refused"  # no recent session with the peer
TRANSFER_RESET = "reset"  # a bad frame, a broken stream or a failing store
RESUME_OK = "ok"
RESUME_FAILED = "failed"


class SeenIds:
    """Ids (hash -> timestamp ns) handled from sync or resume, at most
    ``capacity`` (the oldest inserted leave first)."""

    def __init__(self, capacity: int = MAX_SEEN_IDS):
        self.capacity = capacity
        self._ids: OrderedDict[bytes, int] = OrderedDict()

    def add(self, hash_: bytes, timestamp: int) -> None:
        self._ids[hash_] = timestamp
        self._ids.move_to_end(hash_)
        while len(self._ids) > self.capacity:
            self._ids.popitem(last=False)

    def prune(self, before_ns: int) -> None:
        for h in [h for h, t in self._ids.items() if t < before_ns]:
            del self._ids[h]

    def within(self, lower_ns: int, upper_ns: int) -> list[sync.SyncId]:
        return [(t, h) for h, t in self._ids.items() if lower_ns <= t < upper_ns]

    def __contains__(self, hash_: bytes) -> bool:
        return hash_ in self._ids

    def __len__(self) -> int:
        return len(self._ids)


class SyncService:
    """Waku Sync and Store Resume for one node; see the module docstring.

    ``clock`` gives Unix ns. :attr:`sessions` counts finished sessions
    (either role, and a finished resume), :attr:`failures` failed ones,
    :attr:`received` the messages that came over transfer and
    :attr:`resumed` those Store Resume stored, so a caller can wait on
    progress.
    """

    def __init__(
        self, service: Any, config: NodeConfig, ingest: Ingest, *, clock=time.time_ns, jitter_s: float = RELAY_JITTER_S
    ):
        self.service = service
        self.config = config
        self.ingest = ingest
        self.clock = clock
        self.jitter_ns = int(jitter_s * NS)
        self.pubsub_topics = tuple(sorted(shard_pubsub_topic(config.cluster_id, s) for s in config.shards))
        self.seen = SeenIds()
        self.host: Any = None  # the libp2p host, once run() starts
        self.sessions = 0
        self.failures = 0
        self.resumed = 0
        self.received = 0
        self.progress = trio.Event()
        self.metrics = getattr(service, "metrics", None)
        self._transfer_until: dict[str, float] = {}
        self._last_online_path = Path(config.data_dir) / LAST_ONLINE_FILE
        self.last_online_ns = read_last_online(self._last_online_path)

    def handlers(self) -> dict[str, Any]:
        return {
            sync.RECONCILIATION_PROTOCOL_ID: self.handle_reconciliation,
            sync.TRANSFER_PROTOCOL_ID: self.handle_transfer,
        }

    async def run(self, host) -> None:
        """Keep "last online" written; with sync peers, resume then sync
        every ``sync_interval_s`` until cancelled. Writes "last online"
        once more on the way out."""
        self.host = host
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._last_online_loop)
                if self.config.sync_peers:
                    nursery.start_soon(self._resume_then_sync)
        finally:
            write_last_online(self._last_online_path, self.clock())

    # --- client side ----------------------------------------------------------

    async def _resume_then_sync(self) -> None:
        try:
            await self.resume()
        except Exception as exc:  # resume is best effort; sync covers the last hour
            log.warning("store resume failed: %s", exc)
        while True:
            await trio.sleep(self.config.sync_interval_s)
            await self.sync_round()

    async def sync_round(self) -> None:
        """One session with each sync peer, in random order."""
        now = self.clock()
        self.seen.prune(now - int((self.config.sync_range_s + RESPONDER_SLACK_S) * NS))
        peers = list(self.config.sync_peers)
        random.shuffle(peers)
        for peer in peers:
            try:
                await self.sync_with(peer)
            except (
                SyncError,
                OSError,
                IOException,
                trio.TooSlowError,
                trio.BrokenResourceError,
                trio.ClosedResourceError,
            ) as exc:
                self._count_failure(INITIATOR)
                log.warning("sync with %s failed: %s", peer, exc)
            except Exception as exc:  # a dial failure is any libp2p error
                self._count_failure(INITIATOR)
                log.warning("sync with %s failed: %r", peer, exc)

    async def sync_with(self, peer: str) -> sync.Session:
        """One reconciliation session with ``peer`` (a multiaddr with
        ``/p2p/``) over the sync window, then the transfer of what it
        lacks. Returns the finished session; raises SyncError (or a
        connection error) when it fails."""
        from libp2p.custom_types import TProtocol

        info = parse_peer(peer)
        now = self.clock()
        upper = now - self.jitter_ns
        lower = upper - int(self.config.sync_range_s * NS)
        with trio.fail_after(DIAL_TIMEOUT_S):
            await connect(self.host, info)
        peer_id = str(info.peer_id)
        self._allow_transfers(peer_id)
        session = sync.Session(pubsub_topics=self.pubsub_topics)
        with trio.fail_after(SESSION_TIMEOUT_S):
            ids = await self.load_ids(lower, upper, self.pubsub_topics, ())
            stream = await self.host.new_stream(info.peer_id, [TProtocol(sync.RECONCILIATION_PROTOCOL_ID)])
            frames = Frames(stream, sync.MAX_PAYLOAD_SIZE)
            try:
                await write_frame(stream, session.initiate(ids, lower, upper), WRITE_TIMEOUT_S)
                while not session.done:
                    raw = await frames.next(READ_TIMEOUT_S)
                    if raw is None:
                        break  # the peer closed after its last payload
                    reply = session.answer(session.receive(raw))
                    if reply is not None:
                        await write_frame(stream, reply, WRITE_TIMEOUT_S)
            except BaseException:
                await reset_stream(stream)
                raise
            await close_stream(stream)
        self._allow_transfers(peer_id)
        log.info(
            "sync with %s: %d rounds, %d to send, %d to receive",
            peer_id,
            session.rounds,
            len(session.to_send),
            len(session.to_receive),
        )
        await self._send_missing(info.peer_id, session)
        self._finished(INITIATOR)
        return session

    # --- server side ----------------------------------------------------------

    async def handle_reconciliation(self, stream) -> None:
        peer = peer_of(stream)
        self._allow_transfers(peer)
        session = sync.Session(pubsub_topics=self.pubsub_topics)
        try:
            with trio.fail_after(SESSION_TIMEOUT_S):
                frames = Frames(stream, sync.MAX_PAYLOAD_SIZE)
                raw = await frames.next(READ_TIMEOUT_S)
                if raw is None:
                    await close_stream(stream)
                    return
                payload = session.receive(raw)
                if not payload.finished:
                    scope = session.scope_of(payload)
                    if scope is None:
                        await write_frame(stream, sync.EMPTY_PAYLOAD, WRITE_TIMEOUT_S)
                        await close_stream(stream)
                        return
                    floor = self.clock() - int((self.config.sync_range_s + RESPONDER_SLACK_S) * NS)
                    lower = max(scope.lower_ns, floor)
                    session.floor_ns = lower
                    session.ids = await self.load_ids(
                        lower, max(lower, scope.upper_ns), scope.pubsub_topics, scope.content_topics
                    )
                while True:
                    reply = session.answer(payload)
                    if reply is not None:
                        await write_frame(stream, reply, WRITE_TIMEOUT_S)
                    if session.done:
                        break
                    raw = await frames.next(READ_TIMEOUT_S)
                    if raw is None:
                        break
                    payload = session.receive(raw)
        except (SyncError, FramingError, trio.TooSlowError) as exc:
            self._count_failure(RESPONDER)
            log.info("reconciliation from %s: %s: resetting", peer, exc)
            await reset_stream(stream)
            return
        except (IOException, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            self._count_failure(RESPONDER)
            log.debug("reconciliation from %s: stream failed: %r", peer, exc)
            await reset_stream(stream)
            return
        except TableUnreadable as exc:  # a bad data file in the window (named once by the reader)
            self._count_failure(RESPONDER)
            log.warning("reconciliation from %s: the store cannot read its window: %s", peer, exc)
            await reset_stream(stream)
            return
        except Exception:
            self._count_failure(RESPONDER)
            log.exception("reconciliation from %s failed", peer)
            await reset_stream(stream)
            return
        await close_stream(stream)
        self._allow_transfers(peer)
        try:
            await self._send_missing(stream.muxed_conn.peer_id, session)
        except Exception as exc:
            self._count_failure(RESPONDER)
            log.warning("transfer to %s failed: %r", peer, exc)
            return
        self._finished(RESPONDER)

    async def handle_transfer(self, stream) -> None:
        peer = peer_of(stream)
        if self._transfer_until.get(peer, 0.0) < trio.current_time():
            log.info("transfer from %s without a sync session: resetting", peer)
            self._count_transfer(TRANSFER_REFUSED)
            await reset_stream(stream)
            return
        frames = Frames(stream, sync.TRANSFER_MAX_FRAME_SIZE)
        batch: list[tuple[str, WakuMessage, int]] = []
        received = 0
        try:
            while True:
                raw = await frames.next(TRANSFER_IDLE_S)
                if raw is None:
                    break
                received += 1
                self.received += 1
                if received > sync.MAX_DIFFERENCES:
                    raise SyncError(f"more than {sync.MAX_DIFFERENCES} messages on one transfer stream")
                topic, message, size = sync.decode_transfer(raw)
                if self.metrics is not None:
                    self.metrics.sync_transfer_messages.labels(RECEIVED).inc()
                item = self._admit(topic, message, size, "sync")
                if item is not None:
                    batch.append(item)
                if len(batch) >= PUT_BATCH:
                    await self._store(batch, "sync")
                    batch = []
            if batch:
                await self._store(batch, "sync")
        except (SyncError, FramingError, trio.TooSlowError) as exc:
            self._count_failure()
            self._count_transfer(TRANSFER_RESET)
            log.info("transfer from %s: %s: resetting", peer, exc)
            if batch:
                await self._store_quietly(batch)
            await reset_stream(stream)
            return
        except (IOException, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            self._count_transfer(TRANSFER_RESET)
            log.debug("transfer from %s: stream failed: %r", peer, exc)
            if batch:
                await self._store_quietly(batch)
            await reset_stream(stream)
            return
        except Exception as exc:  # the store failed: the sender finds the rest missing next round
            self._count_transfer(TRANSFER_RESET)
            log.warning("transfer from %s failed: %r", peer, exc)
            await reset_stream(stream)
            return
        self._count_transfer(TRANSFER_OK)
        await close_stream(stream)

    # --- Store Resume ---------------------------------------------------------

    async def resume(self) -> int:
        """Fill the gap since the node was last online from the first sync
        peer that answers; returns the number of messages stored."""
        from wakustore.clients.store import ClientError, StoreClient

        now = self.clock()
        since = self.last_online_ns
        if since is None:
            since = await self._newest_stored()
        if since is None:
            log.info("store resume: no record of being online before; nothing to resume")
            return 0
        since = max(since, now - int(self.config.resume_max_s * NS))
        if since >= now:
            return 0
        peers = list(self.config.sync_peers)
        random.shuffle(peers)
        for peer in peers:
            info = parse_peer(peer)
            stored = 0
            try:
                with trio.fail_after(DIAL_TIMEOUT_S):
                    await connect(self.host, info)
                client = StoreClient(self.host, info.peer_id, DIAL_TIMEOUT_S)
                query = HistoryQuery(time_start=since, time_end=now, forward=True, limit=RESUME_PAGE)
                seen = 0
                async for response in client.pages(query):
                    if response.status_code != StatusCode.OK:
                        raise ClientError(f"status {response.status_code} {response.status_desc}")
                    batch = []
                    for entry in response.messages:
                        seen += 1
                        if entry.message is None or entry.pubsub_topic is None:
                            continue
                        size = len(encode_message(entry.message))
                        item = self._admit(entry.pubsub_topic, entry.message, size, "resume")
                        if item is not None:
                            batch.append(item)
                    if batch:
                        stored += await self._store(batch, "resume")
                    if seen >= MAX_RESUME_MESSAGES:
                        log.warning("store resume from %s stopped after %d messages", peer, seen)
                        break
            except (ClientError, ProtocolError, trio.TooSlowError, OSError) as exc:
                log.warning("store resume from %s failed: %s", peer, exc)
                self._count_resume(RESUME_FAILED, stored)
                continue
            except Exception as exc:  # a dial failure is any libp2p error
                log.warning("store resume from %s failed: %r", peer, exc)
                self._count_resume(RESUME_FAILED, stored)
                continue
            self._count_resume(RESUME_OK, stored)
            log.info("store resume from %s: %d messages stored since %d", peer, stored, since)
            self._finished()
            return stored
        return 0

    async def _newest_stored(self) -> int | None:
        page = await self.service.query(HistoryQuery(forward=False, limit=1, include_data=False))
        return page.messages[-1].timestamp if page.messages else None

    # --- shared plumbing ------------------------------------------------------

    async def load_ids(
        self, lower_ns: int, upper_ns: int, pubsub_topics: tuple[str, ...], content_topics: tuple[str, ...]
    ) -> sync.IdSet:
        """The ids in [lower_ns, upper_ns) on the topics (empty: all), from
        the store plus the remembered ones; SyncError past MAX_LOCAL_IDS."""
        pubsub = frozenset(pubsub_topics)
        content = frozenset(content_topics)
        ids: list[sync.SyncId] = []
        cursor = None
        while True:
            page = await self.service.query(
                HistoryQuery(
                    time_start=lower_ns,
                    time_end=upper_ns,
                    forward=True,
                    limit=ID_PAGE,
                    include_data=bool(content),
                    cursor=cursor,
                )
            )
            for m in page.messages:
                if pubsub and m.pubsub_topic not in pubsub:
                    continue
                if content and (m.message is None or m.message.content_topic not in content):
                    continue
                ids.append((m.timestamp, m.message_hash))
            if len(ids) > MAX_LOCAL_IDS:
                raise SyncError(f"the sync window holds more than {MAX_LOCAL_IDS} messages")
            if page.next_cursor is None:
                break
            cursor = page.next_cursor.message_hash
        ids.extend(self.seen.within(lower_ns, upper_ns))
        return await trio.to_thread.run_sync(sync.IdSet, ids)

    def _admit(self, topic: str, message: WakuMessage, size: int, source: str):
        """The (topic, message, arrival) triple to store, or None when the
        ingest checks refuse it. A refused id counts as handled at once, a
        stored one when the store has taken it (:meth:`_store`)."""
        now = self.clock()
        try:
            # Judged as of its own time (not older than it is), never ahead of ours.
            self.ingest.check(topic, message, size, min(message.timestamp, now) if message.timestamp else now)
        except Refused as refusal:
            self.ingest.count(source, refusal)
            self.seen.add(message_hash(topic, message), message.timestamp or now)
            return None
        return topic, message, now

    async def _store(self, batch: list[tuple[str, WakuMessage, int]], source: str) -> int:
        result = await self.ingest.store(batch, source=source)
        # Remembered only once the store took them: a batch lost to a
        # failing store stays missing, so the next round fetches it again.
        for topic, message, arrival in batch:
            self.seen.add(message_hash(topic, message), message.timestamp or arrival)
        return result.accepted

    async def _store_quietly(self, batch) -> None:
        try:
            await self._store(batch, "sync")
        except Exception as exc:
            log.warning("storing synced messages failed: %s", exc)

    async def _send_missing(self, peer_id, session: sync.Session) -> int:
        """Send the peer the messages the session found it lacks; returns
        how many were sent."""
        from libp2p.custom_types import TProtocol

        hashes = [h for h in session.to_send]
        if not hashes:
            return 0
        stream = await self.host.new_stream(peer_id, [TProtocol(sync.TRANSFER_PROTOCOL_ID)])
        sent = 0
        try:
            for start in range(0, len(hashes), HASH_LOOKUP_PAGE):
                chunk = tuple(hashes[start : start + HASH_LOOKUP_PAGE])
                page = await self.service.query(HistoryQuery(message_hashes=chunk, limit=len(chunk)))
                for m in page.messages:
                    if m.message is not None:
                        await write_frame(stream, sync.encode_transfer(m.pubsub_topic, m.message), WRITE_TIMEOUT_S)
                        sent += 1
                        if self.metrics is not None:
                            self.metrics.sync_transfer_messages.labels(SENT).inc()
        except BaseException:
            await reset_stream(stream)
            raise
        await close_stream(stream)
        return sent

    def _allow_transfers(self, peer: str) -> None:
        self._transfer_until[peer] = trio.current_time() + SESSION_TIMEOUT_S + TRANSFER_GRACE_S
        now = trio.current_time()
        for p in [p for p, until in self._transfer_until.items() if until < now]:
            del self._transfer_until[p]

    def _finished(self, role: str | None = None) -> None:
        """A session in ``role`` (None: a resume) ended well."""
        self.sessions += 1
        if role is not None and self.metrics is not None:
            self.metrics.sync_sessions.labels(role, OUTCOME_OK).inc()
        self.progress.set()
        self.progress = trio.Event()

    def _count_failure(self, role: str | None = None) -> None:
        """A session in ``role`` failed (None: a transfer stream)."""
        self.failures += 1
        if role is not None and self.metrics is not None:
            self.metrics.sync_sessions.labels(role, OUTCOME_FAILED).inc()
        self.progress.set()
        self.progress = trio.Event()

    def _count_transfer(self, outcome: str) -> None:
        if self.metrics is not None:
            self.metrics.sync_transfer_streams.labels(outcome).inc()

    def _count_resume(self, outcome: str, stored: int) -> None:
        self.resumed += stored
        if self.metrics is not None:
            self.metrics.resumes.labels(outcome).inc()
            self.metrics.resumed.inc(stored)

    async def _last_online_loop(self) -> None:
        while True:
            await trio.to_thread.run_sync(write_last_online, self._last_online_path, self.clock())
            await trio.sleep(LAST_ONLINE_INTERVAL_S)


def read_last_online(path: Path) -> int | None:
    """The Unix ns in ``path``; None when it is missing or unreadable."""
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def write_last_online(path: Path, now_ns: int) -> None:
    """Write ``now_ns`` to ``path`` atomically (a torn file reads as missing)."""
    try:
        make_dirs(path.parent)
        replace_durably(path, f"{now_ns}\n".encode())
    except OSError as exc:
        log.warning("cannot write %s: %s", path, exc)
