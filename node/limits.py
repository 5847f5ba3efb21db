"""Limits on what peers may hold open: connections, streams and requests.

libp2p identities cost nothing, so a limit keyed by peer id alone is dodged
by dialing with a fresh key. These limits are keyed by what a peer cannot
mint for free (its IP address) or by the node's own resources, and are
enforced as early as py-libp2p lets us:

- before the security handshake (a TCP or websocket connection has
  arrived, nothing is decrypted yet): total inbound connections
  (``max_connections``, nwaku's ``--max-connections``, 50), inbound
  connections per IP address (``ip_colocation_limit``, nwaku's
  ``--ip-colocation-limit``, 2; 0 turns it off). A refused connection is
  closed at once, before any Noise work is done for it. Connections count
  until they close, handshakes included (so one address has at most
  ``ip_colocation_limit`` handshakes in progress); IP addresses of the
  configured relay peers are exempt;
- handshakes in progress (``max_handshakes``): past the cap a new
  handshake replaces the oldest one in progress, which is closed. An
  honest handshake takes milliseconds, so the oldest is a stalled one:
  addresses stalling handshakes cannot lock honest clients out (refusing
  the newest would, for the 10 s of py-libp2p's upgrade timeout); they
  only lose their own stalled connections;
- after the handshake: a connection with no stream open for
  ``idle_connection_timeout_s`` is closed, so a peer that connects and
  goes silent does not hold its slot for good (py-libp2p clients do not
  even close their socket when their host stops);
- before protocol negotiation: streams a peer has open on one connection
  (``max_streams_per_connection``); past it a new stream is reset;
- on the request/response protocols (Store, lightpush, metadata): streams
  opened but not yet written on one connection
  (``max_idle_streams_per_connection``; js-waku keeps one per protocol open
  for minutes, so this cap, not a short deadline, is what bounds them),
  requests being served at once per protocol
  (``max_requests_in_flight``), and a deadline for the whole request and
  response once the request's first byte has arrived
  (``request_timeout_s``). Past a cap a stream is reset (for idle streams:
  the connection's oldest idle one), which js-waku answers by opening a
  fresh one; the connection's other streams carry on.

The address of the connection a request came on is published to the
handler through :data:`wakustore.node.rate_limits.REMOTE_ADDRESS`, which is
how the store and lightpush rate limits also apply per address.

py-libp2p 0.8.1 accepts connections through ``Swarm._handle_inbound_connection``,
which holds a slot of its own inbound limiter until the whole swarm stops,
not until the connection closes: after ``max_connections`` connections in
the node's life it refuses every new one. :class:`Gatekeeper` replaces that
method with one that admits, upgrades (the swarm's own security and muxer
upgrade) and holds its slot exactly as long as the connection lives.
"""

from __future__ import annotations

import collections
import ipaddress
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, fields
from typing import Any

import trio
from libp2p.io.exceptions import IOException

from wakustore.node.config import (
    DEFAULT_IDLE_CONNECTION_TIMEOUT_S,
    DEFAULT_IP_COLOCATION_LIMIT,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_HANDSHAKES,
    DEFAULT_MAX_IDLE_STREAMS_PER_CONNECTION,
    DEFAULT_MAX_REQUESTS_IN_FLIGHT,
    DEFAULT_MAX_STREAMS_PER_CONNECTION,
    DEFAULT_REQUEST_TIMEOUT_S,
)
from wakustore.node.rate_limits import REMOTE_ADDRESS

log = logging.getLogger(__name__)


# A connection whose close went unnoticed (no event from the swarm) is
# looked at again this often, so its slot is never held for good; an idle
# one is looked at a few times per idle_connection_timeout_s.
CONNECTION_RECHECK_S = 30.0
IDLE_CHECKS_PER_TIMEOUT = 4

# py-libp2p's own connection cap sits above ours: it also counts outbound
# connections (relay peers), which ours do not.
LIBP2P_CONNECTION_HEADROOM = 64


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """The caps :class:`Gatekeeper` enforces; 0 turns a cap off."""

    max_connections: int = DEFAULT_MAX_CONNECTIONS
    ip_colocation_limit: int = DEFAULT_IP_COLOCATION_LIMIT
    max_handshakes: int = DEFAULT_MAX_HANDSHAKES
    idle_connection_timeout_s: float = DEFAULT_IDLE_CONNECTION_TIMEOUT_S
    max_streams_per_connection: int = DEFAULT_MAX_STREAMS_PER_CONNECTION
    max_idle_streams_per_connection: int = DEFAULT_MAX_IDLE_STREAMS_PER_CONNECTION
    max_requests_in_flight: int = DEFAULT_MAX_REQUESTS_IN_FLIGHT
    request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S
    # Addresses of configured peers: no connection cap applies to them.
    exempt_addresses: frozenset[str] = field(default_factory=frozenset)

    @classmethod
    def from_config(cls, config: Any) -> ConnectionLimits:
        # Every cap is the configuration key of the same name.
        caps = {f.name: getattr(config, f.name) for f in fields(cls) if f.name != "exempt_addresses"}
        return cls(**caps, exempt_addresses=frozenset(peer_addresses(config.relay_peers)))

    @property
    def libp2p_max_connections(self) -> int:
        """What py-libp2p's own cap must allow so that ours is the one that bites."""
        return max(300, self.max_connections + LIBP2P_CONNECTION_HEADROOM)


def peer_addresses(multiaddrs: list[str] | tuple[str, ...]) -> list[str]:
    """The literal IP addresses in ``multiaddrs`` (``/ip4/...`` or ``/ip6/...``)."""
    out = []
    for addr in multiaddrs:
        parts = addr.split("/")
        if len(parts) > 2 and parts[1] in ("ip4", "ip6"):
            try:
                out.append(str(ipaddress.ip_address(parts[2])))
            except ValueError:
                pass
    return out


class StreamRefused(IOException):
    """Raised from a guarded stream's read when its request may not be
    served; the handler answers an IOException with a reset."""


class Gatekeeper:
    """Enforces :class:`ConnectionLimits` on one py-libp2p host.

    :meth:`install` hooks the host's inbound connection and stream paths;
    :meth:`guard` wraps a request/response stream handler. ``refused``
    counts refusals by reason; ``on_refused(reason)`` is called for each
    (the node counts them in its metrics).
    """

    def __init__(self, limits: ConnectionLimits = ConnectionLimits(), on_refused: Callable[[str], None] | None = None):
        self.limits = limits
        self.on_refused = on_refused
        self.refused: collections.Counter[str] = collections.Counter()
        self.connections = 0
        self.per_address: collections.Counter[str] = collections.Counter()
        # Handshakes in progress, oldest first: the cancel scope of each.
        self._handshaking: dict[trio.CancelScope, None] = {}
        self._streams: collections.Counter[int] = collections.Counter()
        # Per connection: when a stream last opened or closed on it.
        self._last_stream: dict[int, float] = {}
        # Per connection: its request streams not yet written, oldest first.
        self._idle: dict[int, dict[Any, trio.CancelScope]] = {}
        self.in_flight: collections.Counter[str] = collections.Counter()

    # --- connections ------------------------------------------------------

    def install(self, host: Any) -> None:
        swarm = host.get_network()

        async def inbound(read_write_closer: Any, maddr: Any) -> None:
            await self._inbound(swarm, read_write_closer, maddr)

        # Instance attributes: the listeners look both up per connection or stream.
        swarm._handle_inbound_connection = inbound
        swarm.common_stream_handler = self._stream_gate(swarm.common_stream_handler)

    def _refuse(self, reason: str) -> None:
        self.refused[reason] += 1
        if self.on_refused is not None:
            self.on_refused(reason)

    @property
    def handshakes(self) -> int:
        return len(self._handshaking)

    def admit(self, address: str | None) -> str | None:
        """Take a connection slot for ``address``; the reason it is refused, or None."""
        limits = self.limits
        if address is not None and address in limits.exempt_addresses:
            return None
        if limits.max_connections and self.connections >= limits.max_connections:
            return "max_connections"
        if (
            limits.ip_colocation_limit
            and address is not None
            and self.per_address[address] >= limits.ip_colocation_limit
        ):
            return "ip_colocation"
        self.connections += 1
        if address is not None:
            self.per_address[address] += 1
        return None

    def _start_handshake(self) -> trio.CancelScope:
        """Count a handshake in progress; past ``max_handshakes`` the oldest
        one in progress is cancelled to make room."""
        cap = self.limits.max_handshakes
        while cap and len(self._handshaking) >= cap:
            oldest = next(iter(self._handshaking))
            del self._handshaking[oldest]
            self._refuse("max_handshakes")
            oldest.cancel()
        scope = trio.CancelScope()
        self._handshaking[scope] = None
        return scope

    def release(self, address: str | None) -> None:
        if address is not None and address in self.limits.exempt_addresses:
            return
        self.connections -= 1
        if address is not None:
            self.per_address[address] -= 1
            if self.per_address[address] <= 0:
                del self.per_address[address]

    async def _inbound(self, swarm: Any, read_write_closer: Any, maddr: Any) -> None:
        from libp2p.network.connection.raw_connection import RawConnection

        address = _address_of(read_write_closer)
        reason = self.admit(address)
        if reason is not None:
            self._refuse(reason)
            log.debug("refusing a connection from %s: %s", address, reason)
            await _quietly(read_write_closer.close)
            return
        exempt = address is not None and address in self.limits.exempt_addresses
        muxed = None
        try:
            scope = trio.CancelScope() if exempt else self._start_handshake()
            try:
                with scope:
                    remote = swarm._build_remote_multiaddr(read_write_closer)
                    if remote is not None and not await swarm.connection_gate.is_allowed(remote):
                        await _quietly(read_write_closer.close)
                        return
                    muxed = await swarm.upgrade_inbound_raw_conn(RawConnection(read_write_closer, False), maddr)
            finally:
                self._handshaking.pop(scope, None)
            if muxed is None:  # replaced by a newer handshake
                log.debug("closing a stalled handshake from %s", address)
                await _quietly(read_write_closer.close)
                return
            await self._until_closed(swarm, muxed, exempt)
        except Exception as exc:  # a failed handshake: the peer's problem, not ours
            log.debug("inbound connection from %s failed: %r", address, exc)
            await _quietly(read_write_closer.close)
        finally:
            self.release(address)

    async def _until_closed(self, swarm: Any, muxed: Any, exempt: bool) -> None:
        """Wait until the connection ``muxed`` belongs to has closed; close
        it once it has had no stream open for ``idle_connection_timeout_s``."""
        timeout = 0.0 if exempt else self.limits.idle_connection_timeout_s
        recheck = min(CONNECTION_RECHECK_S, timeout / IDLE_CHECKS_PER_TIMEOUT) if timeout else CONNECTION_RECHECK_S
        conn = id(muxed)
        self._last_stream[conn] = trio.current_time()
        try:
            while True:
                swarm_conn = next(
                    (c for conns in swarm.connections.values() for c in conns if c.muxed_conn is muxed), None
                )
                if swarm_conn is None or swarm_conn.is_closed or getattr(muxed, "is_closed", False):
                    return
                if timeout and not self._streams[conn] and trio.current_time() - self._last_stream[conn] >= timeout:
                    self._refuse("idle_connection")
                    log.debug("closing a connection with no stream for %g s", timeout)
                    await _quietly(swarm_conn.close)
                    return
                with trio.move_on_after(recheck):
                    await swarm_conn.event_closed.wait()
        finally:
            self._last_stream.pop(conn, None)

    # --- streams ----------------------------------------------------------

    def _stream_gate(self, handler: Callable[[Any], Awaitable[None]]):
        limit = self.limits.max_streams_per_connection

        async def gated(stream: Any) -> None:
            conn = id(getattr(stream, "muxed_conn", stream))
            if conn in self._last_stream:
                self._last_stream[conn] = trio.current_time()
            if limit and self._streams[conn] >= limit:
                self._refuse("max_streams")
                await _quietly(stream.reset)
                return
            self._streams[conn] += 1
            try:
                await handler(stream)
            finally:
                self._streams[conn] -= 1
                if self._streams[conn] <= 0:
                    del self._streams[conn]
                if conn in self._last_stream:
                    self._last_stream[conn] = trio.current_time()

        return gated

    def guard(self, protocol: str, handler: Callable[[Any], Awaitable[None]]):
        """``handler`` under the idle, in-flight and whole-request limits.

        A connection keeps at most ``max_idle_streams_per_connection``
        request streams that have not been written: a new one resets the
        oldest, so a peer hoarding streams loses its own old ones while its
        new requests still get through."""
        limits = self.limits

        async def guarded(stream: Any) -> None:
            conn = id(getattr(stream, "muxed_conn", stream))
            idle = self._idle.setdefault(conn, {})
            cap = limits.max_idle_streams_per_connection
            while cap and len(idle) >= cap:
                # The oldest idle stream's handler waits in a read that a
                # local reset does not always wake: cancel it too.
                oldest, oldest_scope = next(iter(idle.items()))
                del idle[oldest]
                self._refuse("idle_streams")
                oldest_scope.cancel()
                await _quietly(oldest.reset)
            in_flight = False

            def first_byte() -> None:
                nonlocal in_flight
                idle.pop(stream, None)
                if limits.max_requests_in_flight and self.in_flight[protocol] >= limits.max_requests_in_flight:
                    self._refuse("in_flight")
                    raise StreamRefused(f"{protocol}: {limits.max_requests_in_flight} requests in flight")
                self.in_flight[protocol] += 1
                in_flight = True
                if limits.request_timeout_s:
                    scope.deadline = trio.current_time() + limits.request_timeout_s

            REMOTE_ADDRESS.set(_address_of(stream))
            try:
                with trio.CancelScope() as scope:
                    idle[stream] = scope
                    await handler(_FirstByteStream(stream, first_byte))
                if scope.cancelled_caught:
                    if in_flight:
                        self._refuse("request_timeout")
                    await _quietly(stream.reset)
            finally:
                idle.pop(stream, None)
                if not idle and self._idle.get(conn) is idle:
                    del self._idle[conn]
                if in_flight:
                    self.in_flight[protocol] -= 1

        return guarded

    def snapshot(self) -> dict[str, Any]:
        """Counts for tests and logs: connections, handshakes, streams held."""
        return {
            "connections": self.connections,
            "handshakes": self.handshakes,
            "addresses": len(self.per_address),
            "streams": sum(self._streams.values()),
            "idle_streams": sum(len(streams) for streams in self._idle.values()),
            "in_flight": sum(self.in_flight.values()),
            "refused": dict(self.refused),
        }


class _FirstByteStream:
    """A stream that calls ``on_first`` when its first bytes are read."""

    def __init__(self, stream: Any, on_first: Callable[[], None]):
        self._stream = stream
        self._on_first: Callable[[], None] | None = on_first

    async def read(self, n: int | None = None) -> bytes:
        data = await self._stream.read(n)
        if data and self._on_first is not None:
            on_first, self._on_first = self._on_first, None
            on_first()
        return data

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _address_of(conn: Any) -> str | None:
    """The remote IP address of a raw connection or stream, normalised."""
    try:
        remote = conn.get_remote_address()
    except Exception:
        return None
    if not remote:
        return None
    try:
        return str(ipaddress.ip_address(str(remote[0]).split("%", 1)[0]))
    except ValueError:
        return str(remote[0])


async def _quietly(close: Callable[[], Awaitable[Any]]) -> None:
    try:
        with trio.move_on_after(5.0):
            await close()
    except Exception:
        pass
