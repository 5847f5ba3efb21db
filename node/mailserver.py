"""The legacy Waku v1 mailserver: devp2p RLPx over TCP with the ``waku/1`` capability.

Each connection runs in its own nursery: the RLPx handshake and the Hellos,
the waku/1 status exchange, then a reader that archives Messages (1)
packets and queues P2P Requests (0x7e) for a worker that answers them with
P2P Message (0x7f) bundles and a P2P Request Complete (0x7d), plus a task
that pings the peer. Behaviour follows status-go (``waku/v1/peer.go``,
``waku/waku.go``, ``mailserver/mailserver.go``) where the spec is silent.

:func:`~wakustore.transport.devp2p.open_session` is the trio glue over
the sans-IO :mod:`~wakustore.protocols.rlpx`, shared with the client in
:mod:`wakustore.clients.mailserver`.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import coincurve
import trio

from wakustore.durable import make_dirs
from wakustore.node.flush_loop import FlushLoop
from wakustore.protocols import ecies, rlpx
from wakustore.protocols import mailserver as wms
from wakustore.protocols.errors import RLPxError, WakuV1Error
from wakustore.protocols.waku_v1 import (
    DEFAULT_MAX_MESSAGE_SIZE,
    decode_envelope_list,
    encode_status,
    envelope_hash,
    envelope_problem,
    key_from_password,
)
from wakustore.storage.envelope_store import EnvelopeStore, StoredEnvelope
from wakustore.transport.devp2p import (
    _CONNECTION_ENDED,
    FRAME_READ_TIMEOUT_S,
    HANDSHAKE_TIMEOUT_S,
    WakuSession,
    open_session,
)

log = logging.getLogger(__name__)

# --- limits and defaults ---------------------------------------------------------

# go-ethereum p2p/peer.go pingInterval; seconds.
PING_INTERVAL_S = float(rlpx.PING_INTERVAL_S)
# Connections served at once. status-go's node defaults to MaxPeers 25
# (params/config.go), but mailserver clients are short-lived requesters;
# each may hold one frame (up to ~1.2 MiB) in its buffer.
MAX_CONNECTIONS = 100
# P2P Requests waiting behind the one being answered; a full queue stops the
# reader, which stops reading the socket (TCP backpressure).
MAX_QUEUED_REQUESTS = 4
# The largest request packet worth opening: the request payload bound plus
# what an envelope adds (flags, size, 65-byte signature, padding to 256
# bytes, GCM tag and nonce, RLP headers). Larger ones are dropped unread.
MAX_REQUEST_PACKET_SIZE = wms.MAX_REQUEST_PAYLOAD_SIZE + 1024
# status-go config/README.md: "The default password used by Status App and
# our mailservers is status-offline-inbox".
DEFAULT_PASSWORD = "status-offline-inbox"
# status-go params/defaults.go WakuMinimumPoW, which NodeConfig.UpdateWithDefaults
# forces on every Waku node; the mailserver checks requests against the
# same value (mailserver.go minRequestPoW = cfg.MinimumPoW).
DEFAULT_MINIMUM_POW = 0.000002
# status-go params WakuConfig.MailServerRateLimit (seconds between requests
# per peer) is 0, no limiter, unless configured.
DEFAULT_RATE_LIMIT_S = 0.0
# Rate-limiter entries kept before expired ones are dropped.
MAX_RATE_LIMITED_PEERS = 100_000
# Blocking store work (Spark, write-ahead log fsync) in worker threads.
STORE_THREADS = 4
KEY_FILE = "mailserver.key"
_ZERO_HASH = bytes(32)


@dataclass(frozen=True)
class MailserverSettings:
    """What a mailserver accepts and answers.

    ``minimum_pow`` applies to archived envelopes and to request envelopes
    (0 turns both checks off). ``rate_limit_s``: one request per peer per
    that many seconds, 0 for none. Unsigned request envelopes are always
    refused, as status-go refuses them.
    ``max_message_size`` (bytes) bounds received packets and sent bundles.
    """

    password: str = DEFAULT_PASSWORD
    minimum_pow: float = DEFAULT_MINIMUM_POW
    rate_limit_s: float = DEFAULT_RATE_LIMIT_S
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE
    max_connections: int = MAX_CONNECTIONS
    handshake_timeout_s: float = HANDSHAKE_TIMEOUT_S
    read_timeout_s: float = FRAME_READ_TIMEOUT_S
    ping_interval_s: float = PING_INTERVAL_S
    clock: Callable[[], float] = field(default=time.time, compare=False)
    """Unix seconds, for envelope expiry checks and request defaults."""

    @classmethod
    def from_config(cls, config) -> MailserverSettings:
        """Defaults, overridden by ``mailserver_password``,
        ``mailserver_minimum_pow`` and ``mailserver_rate_limit_s`` when the
        configuration has them."""
        values = {}
        for name in ("password", "minimum_pow", "rate_limit_s"):
            value = getattr(config, f"mailserver_{name}", None)
            if value is not None:
                values[name] = value
        return cls(**values)


@dataclass(frozen=True)
class MailserverInfo:
    """A running mailserver: ``enode`` is ``enode://<64-byte key hex>@host:port``."""

    enode: str
    public_key: bytes
    host: str
    port: int


@dataclass
class MailserverStats:
    """Counters since start (envelopes, requests)."""

    accepted: int = 0
    duplicates: int = 0
    rejected: int = 0
    invalid_packets: int = 0
    requests: int = 0
    request_errors: int = 0
    connections: int = 0


# --- entry points ----------------------------------------------------------------


async def run_mailserver(
    config,
    envelope_store: EnvelopeStore,
    *,
    settings: MailserverSettings | None = None,
    flush: bool = True,
    metrics=None,
    task_status=trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``envelope_store`` (opened) on ``config.listen_host``:``config.mailserver_port``
    until cancelled; ``task_status.started`` gets the :class:`MailserverInfo`.

    The node key lives in ``<config.data_dir>/mailserver.key``. With
    ``flush`` the store's buffer is committed as its policy says (the
    caller still closes the store after this returns).
    """
    settings = settings or MailserverSettings.from_config(config)
    key = await trio.to_thread.run_sync(load_or_create_node_key, Path(config.data_dir))
    server = Mailserver(envelope_store, key, settings)
    if metrics is not None:
        metrics.mailserver_stats = server.stats
    await server.serve(config.listen_host, config.mailserver_port, flush=flush, task_status=task_status)


@asynccontextmanager
async def running_mailserver(config, engine, *, settings: MailserverSettings | None = None, metrics=None):
    """Open the envelope table on ``engine`` (started), serve it as
    :func:`run_mailserver` does and yield the :class:`MailserverInfo`; on
    exit stop serving, then commit the buffer and close the table."""
    store = await trio.to_thread.run_sync(open_envelope_store, config, engine)
    try:
        async with trio.open_nursery() as nursery:
            info = await nursery.start(
                functools.partial(run_mailserver, config, store, settings=settings, metrics=metrics)
            )
            try:
                yield info
            finally:
                nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):
            try:
                await trio.to_thread.run_sync(store.close)
            except Exception as exc:
                log.error("final envelope commit failed; the write-ahead log keeps them: %s", exc)


def open_envelope_store(config, engine) -> EnvelopeStore:
    """The node's envelope table and its log under ``<data_dir>/wal/envelopes``, opened (blocking)."""
    from wakustore.storage.table import DeltaTableRef

    store = EnvelopeStore(
        DeltaTableRef(engine, config.envelopes_uri),
        Path(config.data_dir) / "wal" / "envelopes",
        flush_interval_s=config.flush_interval_s,
        flush_max_envelopes=config.flush_max_messages,
    )
    store.open(owned=not config.shared_table)
    return store


def load_or_create_node_key(data_dir: Path) -> bytes:
    """The 32-byte secp256k1 node key in ``<data_dir>/mailserver.key`` (hex,
    mode 0600), created on first use. ValueError for an unusable file."""
    path = Path(data_dir) / KEY_FILE
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        make_dirs(data_dir)
        key = coincurve.PrivateKey().secret
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:  # another process won the race
            return load_or_create_node_key(data_dir)
        with os.fdopen(fd, "w") as out:
            out.write(key.hex() + "\n")
            out.flush()
            os.fsync(out.fileno())
        return key
    try:
        key = bytes.fromhex(text)
        coincurve.PrivateKey(key)
    except ValueError:
        raise ValueError(f"{path}: not a hex secp256k1 private key") from None
    if len(key) != 32:
        raise ValueError(f"{path}: the key must be 32 bytes, got {len(key)}")
    return key


def dialable_enodes(info: MailserverInfo, interfaces: Callable[[str], list[str]] | None = None) -> list[str]:
    """What a peer can dial: ``info.enode``, or, when the mailserver is
    bound to the unspecified address (which nobody can dial), one enode
    per interface address of its family, loopback first (as the node's
    libp2p addresses are printed)."""
    if info.host not in ("", "0.0.0.0", "::"):
        return [info.enode]
    if interfaces is None:
        # Here: the request clients import this module without libp2p.
        from wakustore.node.host import interface_addresses

        interfaces = interface_addresses
    family = "ip6" if info.host == "::" else "ip4"
    return [enode_url(info.public_key, ip, info.port) for ip in interfaces(family)] or [info.enode]


def enode_url(public_key: bytes, host: str, port: int) -> str:
    """``enode://<128 hex digits>@host:port``; an unspecified host reads 127.0.0.1 as geth's does."""
    if host in ("", "0.0.0.0", "::"):
        host = "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    return f"enode://{public_key.hex()}@{host}:{port}"


# --- the server ------------------------------------------------------------------


class Mailserver:
    """Archives envelopes into ``store`` and answers requests from it."""

    def __init__(self, store: EnvelopeStore, private_key: bytes, settings: MailserverSettings | None = None):
        self.store = store
        self.settings = settings or MailserverSettings()
        self.private_key = private_key
        self.public_key = ecies.public_key_of(private_key)
        self.symmetric_key = key_from_password(self.settings.password)
        self.limiter = trio.CapacityLimiter(STORE_THREADS)
        self.rate_limiter = RequestRateLimiter(self.settings.rate_limit_s)
        self.stats = MailserverStats()
        self._status = encode_status(self.settings.minimum_pow)
        self._port = 0
        # Commits the envelope buffer as its flush policy says; woken by puts.
        self.flusher = FlushLoop(store.writes.flush_deadline, self._flush, "envelope")

    async def serve(self, host: str, port: int, *, flush: bool = True, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Listen on ``host``:``port`` (0: any free port) until cancelled."""
        from wakustore.node.host import binding

        with binding("mailserver", host, port):
            listeners = await trio.open_tcp_listeners(port, host=host)
        self._port = listeners[0].socket.getsockname()[1]
        info = MailserverInfo(enode_url(self.public_key, host, self._port), self.public_key, host, self._port)
        async with trio.open_nursery() as nursery:
            if flush:
                nursery.start_soon(self.flusher.run)
            await nursery.start(trio.serve_listeners, self.handle_stream, listeners)
            log.info("mailserver listening: %s", info.enode)
            task_status.started(info)

    async def handle_stream(self, stream: trio.abc.Stream) -> None:
        """Serve one TCP connection to its end; never raises (but Cancelled)."""
        if self.stats.connections >= self.settings.max_connections:
            await trio.aclose_forcefully(stream)
            return
        self.stats.connections += 1
        try:
            async with stream:
                session = await open_session(
                    stream,
                    self.private_key,
                    local_status=self._status,
                    listen_port=self._port,
                    max_message_size=self.settings.max_message_size,
                    timeout_s=self.settings.handshake_timeout_s,
                    read_timeout_s=self.settings.read_timeout_s,
                )
                await self._serve_session(session)
        except (*_CONNECTION_ENDED, RLPxError, trio.TooSlowError) as exc:
            log.debug("mailserver connection ended: %s: %s", type(exc).__name__, exc)
        except Exception:
            log.exception("mailserver connection failed")
        finally:
            self.stats.connections -= 1

    async def _serve_session(self, session: WakuSession) -> None:
        requests_in, requests_out = trio.open_memory_channel(MAX_QUEUED_REQUESTS)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(session.keep_alive, self.settings.ping_interval_s)
            nursery.start_soon(self._answer_requests, session, requests_out, nursery.cancel_scope)
            try:
                await self._read_packets(session, requests_in)
            finally:
                nursery.cancel_scope.cancel()

    async def _read_packets(self, session: WakuSession, requests) -> None:
        async with requests:
            try:
                while True:
                    code, payload = await session.receive()
                    if code == wms.MESSAGES:
                        await self._archive(payload)
                    elif code == wms.P2P_REQUEST and len(payload) <= MAX_REQUEST_PACKET_SIZE:
                        await requests.send(payload)
                    elif code == wms.P2P_REQUEST:
                        self.stats.invalid_packets += 1
                    # Status updates and other codes need nothing from a node
                    # that relays nothing (status-go ignores unknown codes).
            except RLPxError as exc:
                log.debug("mailserver peer broke the protocol: %s", exc)
                await session.disconnect(rlpx.DISCONNECT_PROTOCOL_ERROR)
            except trio.TooSlowError:
                await session.disconnect(rlpx.DISCONNECT_READ_TIMEOUT)
            except _CONNECTION_ENDED as exc:
                log.debug("mailserver connection ended: %s", exc)

    # --- Messages: archive ---------------------------------------------------

    async def _archive(self, payload: bytes) -> None:
        """Store the acceptable envelopes of a Messages packet; a malformed
        packet is dropped whole and the peer kept (status-go logs it only)."""
        try:
            envelopes = decode_envelope_list(payload, max_size=self.settings.max_message_size)
        except WakuV1Error as exc:
            self.stats.invalid_packets += 1
            log.debug("malformed Messages packet: %s", exc)
            return
        now_s = int(self.settings.clock())
        arrival_ns = time.time_ns()
        rows = []
        for envelope, raw in envelopes:
            problem = envelope_problem(
                envelope,
                now_s,
                minimum_pow=self.settings.minimum_pow,
                max_size=self.settings.max_message_size,
            )
            if problem is not None:
                self.stats.rejected += 1
                log.debug("envelope %s not archived: %s", envelope_hash(raw).hex(), problem)
                continue
            rows.append(
                StoredEnvelope(
                    envelope_hash(raw),
                    raw,
                    envelope.topic,
                    envelope.expiry,
                    envelope.ttl,
                    envelope.timestamp,
                    arrival_ns,
                )
            )
        if not rows:
            return
        try:
            accepted, duplicates = await trio.to_thread.run_sync(self.store.put, rows, limiter=self.limiter)
        except Exception as exc:
            log.warning("archiving %d envelopes failed: %s", len(rows), exc)
            return
        self.stats.accepted += accepted
        self.stats.duplicates += duplicates
        if accepted:
            self.flusher.notify()

    async def _flush(self) -> None:
        await trio.to_thread.run_sync(self.store.flush, limiter=self.limiter)

    # --- P2P Request: answer -------------------------------------------------

    async def _answer_requests(self, session: WakuSession, requests, scope: trio.CancelScope) -> None:
        try:
            async with requests:
                async for payload in requests:
                    await self.answer(session, payload)
        except (*_CONNECTION_ENDED, trio.TooSlowError) as exc:
            log.debug("mailserver answer not delivered: %s", exc)
            scope.cancel()

    async def answer(self, session: WakuSession, payload: bytes) -> None:
        """Answer one P2P Request packet, in status-go's order of checks:
        decrypt and decode, validate, rate limit; then the envelopes and
        Request Complete, or Request Complete in its error form."""
        try:
            p2p = wms.decode_p2p_request(payload)
        except WakuV1Error as exc:  # no request id to answer to (status-go logs it)
            self.stats.invalid_packets += 1
            log.debug("undecodable P2P Request: %s", exc)
            return
        self.stats.requests += 1
        try:
            request = p2p.request
            if p2p.envelope is not None:
                request = wms.open_request(
                    p2p.envelope,
                    self.symmetric_key,
                    minimum_pow=self.settings.minimum_pow,
                )
            assert request is not None  # decode_p2p_request gives an envelope or a request
            request = wms.validate_request(request, int(self.settings.clock()))
            if not self.rate_limiter.allow(session.remote_id):
                raise WakuV1Error("rate limit exceeded")
            page = await trio.to_thread.run_sync(self._query, request, limiter=self.limiter)
            # status-go sends one envelope per packet to a client without batch support.
            groups = [[row.raw for row in page.envelopes]] if request.batch else [[r.raw] for r in page.envelopes]
            bundles = [b for group in groups for b in wms.bundle_envelopes(group, self.settings.max_message_size)]
        except WakuV1Error as exc:
            await self._refuse(session, p2p.request_id, str(exc))
            return
        except Exception as exc:
            log.warning("mailserver query failed: %s", exc)
            await self._refuse(session, p2p.request_id, "failed to query envelopes")
            return
        for bundle in bundles:
            await session.send(wms.P2P_MESSAGE, bundle)
        last = page.envelopes[-1] if page.envelopes else None
        cursor = wms.encode_cursor(last.sent, last.envelope_hash) if last and page.limit_reached else b""
        await session.send(
            wms.P2P_REQUEST_COMPLETE,
            wms.encode_request_complete(
                p2p.request_id,
                last.envelope_hash if last else _ZERO_HASH,
                cursor,
                layout=request.layout,
            ),
        )

    def _query(self, request: wms.MessagesRequest):
        cursor = None
        if request.cursor:
            decoded = wms.decode_cursor(request.cursor)
            cursor = (decoded.timestamp, decoded.envelope_hash)
        return self.store.query(
            request.lower,
            request.upper,
            topics=list(request.topics),
            bloom=None if request.topics else request.bloom,
            limit=request.limit,
            cursor=cursor,
        )

    async def _refuse(self, session: WakuSession, request_id: bytes, message: str) -> None:
        self.stats.request_errors += 1
        await session.send(wms.P2P_REQUEST_COMPLETE, wms.encode_request_complete_error(request_id, message))


class RequestRateLimiter:
    """status-go mailserver/limiter.go: a peer's request is allowed when more
    than ``period_s`` seconds passed since its last allowed one; refused
    requests do not restart the wait. ``period_s`` <= 0 allows everything."""

    def __init__(self, period_s: float, clock: Callable[[], float] = time.monotonic):
        self.period_s = period_s
        self._clock = clock
        self._last: dict[bytes, float] = {}

    def allow(self, peer_id: bytes) -> bool:
        if self.period_s <= 0:
            return True
        now = self._clock()
        last = self._last.get(peer_id)
        if last is not None and now - last <= self.period_s:
            return False
        self._last[peer_id] = now
        if len(self._last) > MAX_RATE_LIMITED_PEERS:
            self._last = {p: t for p, t in self._last.items() if now - t <= self.period_s}
        return True
