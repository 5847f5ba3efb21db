"""An RLPx session speaking ``waku/1`` over a trio stream: the devp2p
transport of the legacy mailserver and of its client.

:func:`open_session` runs the RLPx handshake, the Hellos and the waku/1
status exchange over the sans-IO :mod:`~wakustore.protocols.rlpx`;
:class:`WakuSession` then sends and receives waku/1 messages, answering
Pings. Timeouts are go-ethereum's.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable

import trio

from wakustore.protocols import ecies, rlpx
from wakustore.protocols import mailserver as wms
from wakustore.protocols.errors import RLPxError
from wakustore.protocols.waku_v1 import DEFAULT_MAX_MESSAGE_SIZE, PeerStatus, decode_status

# go-ethereum p2p/transport.go handshakeTimeout (RLPx handshake, then again
# for the protocol handshake), p2p/server.go frameReadTimeout and
# frameWriteTimeout; seconds.
HANDSHAKE_TIMEOUT_S = 5.0
FRAME_READ_TIMEOUT_S = 30.0
FRAME_WRITE_TIMEOUT_S = 20.0
# go-ethereum p2p/peer_error.go discWriteTimeout: a parting Disconnect gets 1 s.
DISCONNECT_WRITE_TIMEOUT_S = 1.0
RECEIVE_SIZE = 64 * 1024
CLIENT_ID = "wakustore/mailserver"
WAKU = rlpx.Capability(rlpx.WAKU_CAPABILITY_NAME, rlpx.WAKU_V1_VERSION)


class SessionClosed(Exception):
    """The peer disconnected, closed the connection or does not speak waku/1."""


_CONNECTION_ENDED = (SessionClosed, trio.BrokenResourceError, trio.ClosedResourceError, OSError)


class WakuSession:
    """One RLPx connection after the Hellos and the status exchange.

    :meth:`receive` returns waku/1 messages as ``(code, payload)`` with the
    capability's own codes and answers Pings; :meth:`send` may be called
    from several tasks (frames are encrypted and written under one lock).
    """

    def __init__(
        self, stream: trio.abc.Stream, connection: rlpx.Connection, pending: Iterable[rlpx.Event], read_timeout_s: float
    ):
        self._stream = stream
        self._connection = connection
        self._pending: collections.deque[rlpx.Event] = collections.deque(pending)
        self._messages: collections.deque[tuple[int, bytes]] = collections.deque()
        self._pongs = 0
        self._read_timeout_s = read_timeout_s
        self._send_lock = trio.Lock()
        self.offset = rlpx.BASE_PROTOCOL_LENGTH
        self.remote_status = PeerStatus()

    @property
    def remote_id(self) -> bytes:
        """The peer's 64-byte public key (its node id)."""
        hello = self._connection.remote_hello
        assert hello is not None  # open_session returns once the Hellos are exchanged
        return hello.node_id

    async def send(self, code: int, payload: bytes) -> None:
        """Send waku/1 message ``code``; raises SessionClosed after a Disconnect."""
        await self._send(lambda c: c.send_message(rlpx.to_wire_code(code, offset=self.offset), payload))

    async def receive(self) -> tuple[int, bytes]:
        """The next waku/1 message. Raises SessionClosed at the end of the
        connection, RLPxError on a protocol breach, trio.TooSlowError when
        nothing arrives for the read timeout."""
        while not self._messages:
            await self._next_event()
        return self._messages.popleft()

    async def round_trip(self) -> None:
        """Ping and wait for the Pong: the peer has handled everything sent
        before (waku/1 messages arriving meanwhile stay queued for receive)."""
        awaited = self._pongs + 1
        await self._send(lambda c: c.send_ping())
        while self._pongs < awaited:
            await self._next_event()

    async def _next_event(self) -> None:
        while not self._pending:
            await self._read()
        event = self._pending.popleft()
        if isinstance(event, rlpx.Message):
            self._messages.append((rlpx.from_wire_code(event.code, offset=self.offset), event.payload))
        elif isinstance(event, rlpx.Ping):
            await self._send(lambda c: c.send_pong())
        elif isinstance(event, rlpx.Pong):
            self._pongs += 1
        elif isinstance(event, rlpx.Disconnect):
            raise SessionClosed(f"peer disconnected: {event.description}")

    async def keep_alive(self, interval_s: float) -> None:
        """Ping every ``interval_s`` seconds until the session ends."""
        while True:
            await trio.sleep(interval_s)
            try:
                await self._send(lambda c: c.send_ping())
            except (*_CONNECTION_ENDED, trio.TooSlowError):
                return

    async def disconnect(self, reason: int = rlpx.DISCONNECT_REQUESTED) -> None:
        """Send Disconnect (best effort, 1 s at most) and close the stream."""
        async with self._send_lock:
            if not self._connection.closed:
                try:
                    data = self._connection.send_disconnect(reason)
                    with trio.move_on_after(DISCONNECT_WRITE_TIMEOUT_S):
                        await self._stream.send_all(data)
                except (RLPxError, trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    pass
        await trio.aclose_forcefully(self._stream)

    async def _send(self, encode: Callable[[rlpx.Connection], bytes]) -> None:
        async with self._send_lock:
            if self._connection.closed:
                raise SessionClosed("the connection is closed")
            data = encode(self._connection)
            with trio.fail_after(FRAME_WRITE_TIMEOUT_S):
                await self._stream.send_all(data)

    async def _read(self) -> None:
        with trio.fail_after(self._read_timeout_s):
            data = await self._stream.receive_some(RECEIVE_SIZE)
        if not data:
            self._connection.receive_eof()
            raise SessionClosed("the peer closed the connection")
        self._pending.extend(self._connection.receive_data(data))


async def open_session(
    stream: trio.abc.Stream,
    private_key: bytes,
    *,
    remote_public_key: bytes | None = None,
    local_status: bytes,
    listen_port: int = 0,
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
    timeout_s: float = HANDSHAKE_TIMEOUT_S,
    read_timeout_s: float = FRAME_READ_TIMEOUT_S,
) -> WakuSession:
    """RLPx handshake (initiator when ``remote_public_key`` is given), Hellos
    and waku/1 status exchange within ``timeout_s`` seconds each.

    Raises SessionClosed (peer left, no waku/1, no status first), RLPxError
    or trio.TooSlowError; the caller closes ``stream`` then.
    """
    handshake = rlpx.Handshake(private_key, remote_public_key)
    with trio.fail_after(timeout_s):
        if handshake.initiator:
            await stream.send_all(handshake.initiate())
        while not handshake.complete:
            data = await stream.receive_some(RECEIVE_SIZE)
            if not data:
                handshake.receive_eof()
            reply = handshake.receive_data(data)
            if reply:
                await stream.send_all(reply)
    hello = rlpx.Hello(rlpx.BASE_PROTOCOL_VERSION, CLIENT_ID, (WAKU,), listen_port, ecies.public_key_of(private_key))
    # A snappy frame may be 1/6 larger than what it carries (snappy's MaxEncodedLen).
    frame_limit = min(rlpx.MAX_FRAME_SIZE, max_message_size + max_message_size // 6 + 64)
    connection, events = rlpx.Connection.from_handshake(
        handshake,
        hello,
        max_frame_size=frame_limit,
        max_message_size=max_message_size,
    )
    session = WakuSession(stream, connection, events, read_timeout_s)
    with trio.fail_after(timeout_s):
        await session._send(lambda c: c.send_hello())
        while connection.remote_hello is None:  # nothing but a Disconnect may come first
            await session._next_event()
        remote_hello = connection.remote_hello
        shared = rlpx.match_capabilities({WAKU: rlpx.WAKU_V1_CODE_COUNT}, remote_hello.capabilities)
        if WAKU.name not in shared:
            await session.disconnect(rlpx.DISCONNECT_USELESS_PEER)
            raise SessionClosed("the peer does not run waku/1")
        session.offset = shared[WAKU.name].offset
        await session.send(wms.STATUS, local_status)
        code, payload = await session.receive()
        if code != wms.STATUS:  # status-go: "sent packet before status packet"
            await session.disconnect(rlpx.DISCONNECT_SUBPROTOCOL_ERROR)
            raise SessionClosed(f"the peer sent packet {code} before its status")
    session.remote_status = decode_status(payload)
    return session
