"""Where this project replaces py-libp2p code, and why: the only module
that does.

py-libp2p 0.8.1 spends most of a Store query's CPU on the plumbing under
it rather than on the query (a query is one stream: multistream-select,
a request, an answer, each frame a Noise message and a ``send`` and a
``recv``). The classes here trim that plumbing. They are subclasses
installed through py-libp2p's own options (:func:`wakustore.transport.host.new_host`
passes them as ``muxer_opt`` and ``sec_opt``) or given to the one host
that uses them (its :class:`Multiselect`, and the :class:`MuxerMultistream`
that builds the yamux class ``muxer_opt`` names, which py-libp2p's does
not); no py-libp2p class or module is changed, so an application that embeds our clients keeps py-libp2p as it
was. What goes on the wire is unchanged except where said below.

Each override depends on py-libp2p internals (private attributes and the
exact behaviour of the method it replaces). py-libp2p is therefore pinned
to :data:`PINNED_VERSION` (pyproject.toml), and :data:`REPLACED` holds a
fingerprint of the upstream source of every method overridden here:
``tests/transport/test_libp2p.py`` fails when one changes, until someone
reviews the override against the new code and updates the fingerprint.
The plain fixes among them are prepared as an upstream patch
(``upstream/py-libp2p-yamux.diff``, README "Development").

**Yamux receive window** (:meth:`Stream._auto_tune_and_send_window_update`).
py-libp2p's yamux answers every read with a WINDOW_UPDATE frame: a Store
request/response stream read its peer's multistream-select header and
protocol id a line at a time, then the request, so each query cost five or
six frames for windows that never come close to running out. Here yamux
follows go-yamux's policy (``sendWindowUpdate`` in go-yamux's stream.go):
credit goes back once at least half the window is owed, and the window
still grows by py-libp2p's auto-tuning when it does.

**Yamux frame handling** (:meth:`Yamux.handle_incoming`, :meth:`Yamux.read_stream`,
:meth:`Stream.write`, :meth:`Stream.read`, :meth:`Stream.close`).
py-libp2p formats a debug line for every frame (an f-string, built
whether or not debug logging is on), reads ``PY_YAMUX_*`` environment
variables on every window decision, and takes two or three trio locks
around bookkeeping that never awaits. These handle the same frames with
the same effects (flow control, SYN/ACK, FIN and RST on any frame, window
overrun clamping, the bounded frame size, the body read deadline, the
stale-stream bookkeeping) without that overhead. A write that fits in one
frame and the send window goes out as one frame without the stream's
write lock, unless a multi-frame write of the same stream holds it.

**Fewer writes per stream** (:func:`corked`, the deferred ACK). A new
inbound stream's ACK goes out in the same write as the stream's first
frame, just ahead of it. :func:`corked` lets a task write several frames
as one Noise message and one ``send``: the Store handler's answer and the
FIN closing its stream, the client's SYN, request and FIN.

**Secure-session reads** (:class:`NoiseTransport`, :class:`Session`).
py-libp2p's session keeps the rest of a Noise message in a ``BytesIO`` it
rebuilds per message, and reads each message as exactly its 2-byte length,
then its body: two ``recv`` calls per frame at least. Here the session
keeps the rest as the message and an offset, and the Noise reader asks the
connection for up to :data:`READ_AHEAD` bytes at a time and keeps what it
did not need: one ``recv`` serves the messages that arrived together.

**Multistream-select on inbound streams** (:class:`Multiselect`). Most
dialers (js-waku, go-libp2p, nwaku, our own client) send their header and
protocol id together without waiting for ours. When both are already
received and the protocol is served, the node reads exactly those bytes
and answers header and protocol id in one write; for the request/response
protocols named in :attr:`Multiselect.answer_with_first_write`, when the
whole request came too, that answer waits for the handler's first write
and leaves with it. Anything else (nothing received yet, ``ls``, a
protocol not served) is negotiated by py-libp2p as before.

**Stream notifications** (:func:`skip_idle_notifications`). The swarm tells
every notifee about every stream opened and closed, each call in a task
of its own under a nursery of its own. py-libp2p's own notifees do
nothing with streams; those whose method does nothing are skipped, and
with none left no nursery is opened.
"""

from __future__ import annotations

import dis
import hashlib
import inspect
import logging
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from types import MethodType
from typing import Any, cast

import trio
from libp2p.custom_types import TProtocol
from libp2p.io.exceptions import IncompleteReadError
from libp2p.network.swarm import Swarm
from libp2p.protocol_muxer import multiselect
from libp2p.security.noise import io as noise_io
from libp2p.security.noise import transport as noise_transport
from libp2p.security.secure_session import SecureSession
from libp2p.stream_muxer import muxer_multistream
from libp2p.stream_muxer.exceptions import MuxedStreamEOF, MuxedStreamError, MuxedStreamReset
from libp2p.stream_muxer.yamux import yamux
from libp2p.utils import encode_delim

from wakustore.transport.multistream import MULTISTREAM, complete_frame, parse_lines

log = logging.getLogger(__name__)

# The py-libp2p release the overrides below were written against
# (pyproject.toml pins it).
PINNED_VERSION = "0.8.1"

# Bytes one read of the connection asks for: a yamux frame's largest
# payload (64 KiB) and its headers; what the Noise reader did not need waits
# for its next read in a buffer of at most this size.
READ_AHEAD = 64 * 1024 + 64

_HEADER = struct.Struct(yamux.YAMUX_HEADER_FORMAT)
_HEADER_SIZE = yamux.HEADER_SIZE
# The largest DATA payload one write puts in a frame (py-libp2p's own split).
_MAX_PAYLOAD = yamux.MAX_MESSAGE_SIZE - yamux.HEADER_SIZE
_DATA, _WINDOW_UPDATE, _PING, _GO_AWAY = (
    yamux.TYPE_DATA,
    yamux.TYPE_WINDOW_UPDATE,
    yamux.TYPE_PING,
    yamux.TYPE_GO_AWAY,
)
_SYN, _ACK, _FIN, _RST = yamux.FLAG_SYN, yamux.FLAG_ACK, yamux.FLAG_FIN, yamux.FLAG_RST

# The longest a cork's frames may take to leave once its block ends
# (cancelled or not): a frame for the peer's socket buffer, as a close is
# given (transport/streams.py CLOSE_TIMEOUT_S).
CORK_FLUSH_TIMEOUT_S = 5.0


# --- yamux ----------------------------------------------------------------------


class Stream(yamux.YamuxStream):
    """A yamux stream of :class:`Yamux`."""

    async def _auto_tune_and_send_window_update(self, *, bytes_read: int = 0) -> None:
        """Send a WINDOW_UPDATE once the credit owed reaches half the target
        window. (No await between reading and updating the window: no lock.)"""
        buffered = len(self.conn.stream_buffers.get(self.stream_id, b""))
        owed = self.target_recv_window - (self.recv_window + buffered)
        if owed <= 0 or owed < self.target_recv_window // 2:
            return
        self.recv_window += owed
        owed += self._apply_autotune_epoch(buffered)
        await self.send_window_update(owed)

    async def write(self, data: bytes) -> None:
        """One frame without the stream's write lock when ``data`` fits in
        one frame and the send window and no other write of this stream is
        under way; py-libp2p's own loop otherwise."""
        if self.send_closed:
            raise MuxedStreamError("Stream is closed for sending")
        conn: Yamux = self.conn  # type: ignore[assignment]
        size = len(data)
        if (
            0 < size <= _MAX_PAYLOAD
            and size <= self.send_window
            and not self.closed
            and self.rw_lock._writer_lock.value
        ):
            self.send_window -= size
            await conn._write_frame(_HEADER.pack(0, _DATA, 0, self.stream_id, size) + data)
            return
        # A write that may wait for the peer's window updates cannot wait in
        # a cork: the peer would never see the data it has to credit.
        cork = conn.cork
        if cork is None or cork[0] is not trio.lowlevel.current_task():
            await super().write(data)
            return
        conn.cork = None
        try:
            await conn.flush_cork(cork[1])
            await super().write(data)
        finally:
            conn.cork = cork

    async def read(self, n: int | None = -1) -> bytes:
        """Bounded reads through :meth:`Yamux.read_stream`."""
        if n is None or n == -1:
            return await super().read(n)
        if self.recv_closed and not self.conn.stream_buffers.get(self.stream_id):
            if self.reset_received:
                raise MuxedStreamReset("Stream was reset")
            raise MuxedStreamEOF("Stream is closed for receiving")
        data = await self.conn.read_stream(self.stream_id, n)
        await self._auto_tune_and_send_window_update(bytes_read=len(data))
        return data

    async def close(self) -> None:
        """Half-close (FIN) without the perf summary's environment lookups."""
        async with self.close_lock:
            if not self.send_closed:
                try:
                    await self.conn._write_frame(_HEADER.pack(0, _WINDOW_UPDATE, _FIN, self.stream_id, 0))
                except (yamux.RawConnError, yamux.ConnectionClosedError):
                    pass
                finally:
                    self.send_closed = True
            self.closed = self.send_closed and self.recv_closed
            self.conn._finalize_stream_locked(self, fully_closed=self.closed)


class Yamux(yamux.Yamux):
    """py-libp2p's yamux connection with the frame handling described in
    the module's notes; its streams are :class:`Stream`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Inbound streams whose ACK waits for their first frame, and the
        # multistream-select answer to send just ahead of that frame.
        self.acks: set[int] = set()
        self.ahead: dict[int, bytes] = {}
        # (task, frames) while a task corks the connection (:func:`corked`).
        self.cork: tuple[Any, list[bytes]] | None = None

    async def _write_frame(self, data: bytes) -> None:
        """One frame to the connection; writes are serialized. A stream's
        deferred ACK goes out just ahead of its first frame; frames written
        by the corking task wait for the end of the cork."""
        if self.acks:
            stream_id = int.from_bytes(data[4:8], "big")
            if stream_id in self.acks:
                self.acks.discard(stream_id)
                ahead = self.ahead.pop(stream_id, b"")
                data = _HEADER.pack(0, _WINDOW_UPDATE, _ACK, stream_id, 0) + ahead + data
        cork = self.cork
        if cork is not None and cork[0] is trio.lowlevel.current_task():
            cork[1].append(data)
            return
        async with self._write_lock:
            await self.secured_conn.write(data)

    async def flush_cork(self, frames: list[bytes]) -> None:
        """Write a cork's frames as one message (shielded, bounded)."""
        if frames:
            data = b"".join(frames)
            frames.clear()
            with trio.CancelScope(shield=True), trio.fail_after(CORK_FLUSH_TIMEOUT_S):
                async with self._write_lock:
                    await self.secured_conn.write(data)

    async def open_stream(self) -> Stream:
        """A new outbound stream (SYN sent), as py-libp2p's but a :class:`Stream`."""
        await self.stream_backlog_semaphore.acquire()
        async with self.streams_lock:
            if self.event_shutting_down.is_set():
                self.stream_backlog_semaphore.release()
                raise MuxedStreamError("Connection is shutting down")
            stream_id = self.next_stream_id
            self.next_stream_id += 2
            stream = Stream(stream_id, self, True)
            stream._owns_backlog_slot = True
            self.streams[stream_id] = stream
            self.stream_buffers[stream_id] = bytearray()
            self.stream_events[stream_id] = trio.Event()
        try:
            await self._write_frame(_HEADER.pack(0, _WINDOW_UPDATE, _SYN, stream_id, 0))
            return stream
        except Exception as exc:
            self.stream_backlog_semaphore.release()
            stream._backlog_slot_released = True
            async with self.streams_lock:
                self.streams.pop(stream_id, None)
                self.stream_buffers.pop(stream_id, None)
                self.stream_events.pop(stream_id, None)
            raise MuxedStreamError(f"Failed to send SYN: {exc}") from exc

    async def read_stream(self, stream_id: int, n: int = -1) -> bytes:
        """Up to ``n`` buffered bytes of a stream, waiting for some; EOF once
        the peer's FIN is in and the buffer drained, reset when the peer
        reset it. (Nothing awaits between looking at the buffer and taking
        from it, so py-libp2p's connection lock is not needed.)"""
        if n is None:
            n = -1
        while True:
            stream = self.streams.get(stream_id)
            if stream is None:
                raise MuxedStreamEOF("Stream closed")
            if self.event_shutting_down.is_set():
                raise MuxedStreamEOF("Connection shut down")
            buffer = self.stream_buffers.get(stream_id)
            if buffer is None:
                if stream.reset_received:
                    raise MuxedStreamReset("Stream was reset")
                raise MuxedStreamEOF("Stream buffer closed")
            if buffer:
                if stream.reset_received and not stream.recv_closed:
                    raise MuxedStreamReset("Stream was reset")
                if n == -1 or n >= len(buffer):
                    data = bytes(buffer)
                    buffer.clear()
                else:
                    data = bytes(buffer[:n])
                    del buffer[:n]
                if stream.closed:
                    self._finalize_stream_locked(stream, fully_closed=True)
                return data
            if stream.reset_received:
                raise MuxedStreamReset("Stream was reset")
            if stream.recv_closed:
                raise MuxedStreamEOF("Stream is closed for receiving")
            if stream.closed:
                raise MuxedStreamReset("Stream is reset or closed")
            event = self.stream_events.get(stream_id)
            if event is None:
                raise MuxedStreamEOF("Stream was removed")
            await event.wait()
            if self.stream_events.get(stream_id) is event:
                self.stream_events[stream_id] = trio.Event()

    async def _read_body(self, length: int) -> bytes:
        """A DATA frame's body: from bytes already decrypted when they hold
        it, else under py-libp2p's deadline for a body to arrive."""
        conn = self.secured_conn
        if isinstance(conn, Session) and conn.buffered() >= length:
            return await conn.read(length)
        with trio.fail_after(yamux._yamux_data_read_timeout()):
            return await read_exact(conn, length)

    async def _shut(self) -> None:
        self.event_shutting_down.set()
        await self._cleanup_on_error()

    def _deliver(self, stream: yamux.YamuxStream, data: bytes) -> None:
        """Buffer ``data`` for ``stream``; a peer overrunning the window is clamped."""
        self.stream_buffers[stream.stream_id].extend(data)
        stream.recv_window -= len(data)
        if stream.recv_window < 0:
            log.warning(
                "yamux stream %d: peer exceeded the receive window by %d bytes", stream.stream_id, -stream.recv_window
            )
            stream.recv_window = 0

    def _fin_rst(self, stream: yamux.YamuxStream, flags: int) -> None:
        """FIN and RST on any frame: mark the stream, wake its reader, drop
        it once closed both ways."""
        if flags & _FIN:
            stream.recv_closed = True
            if stream.send_closed:
                stream.closed = True
        if flags & _RST:
            stream.closed = True
            stream.reset_received = True
        if flags & (_FIN | _RST):
            event = self.stream_events.get(stream.stream_id)
            if event is not None:
                event.set()
        if stream.closed:
            self._finalize_stream_locked(stream, fully_closed=True)

    async def handle_incoming(self) -> None:
        """Read frames until the connection ends."""
        while not self.event_shutting_down.is_set():
            try:
                if not await self._handle_frame():
                    break
            except trio.TooSlowError:
                log.warning("yamux: timed out reading a DATA frame body from %s; closing the connection", self.peer_id)
                await self._shut()
                break
            except (
                yamux.RawConnError,
                OSError,
                IncompleteReadError,
                trio.ClosedResourceError,
                trio.BrokenResourceError,
            ) as exc:
                log.debug("yamux connection to %s failed: %r", self.peer_id, exc)
                await self._shut()
                break
            except Exception as exc:
                log.error("yamux: error handling a frame from %s: %r", self.peer_id, exc)
                if self.event_shutting_down.is_set():
                    await self._cleanup_on_error()
                    break
                await trio.sleep(0.01)

    async def _handle_frame(self) -> bool:
        """Read and handle one frame; False when the connection ended."""
        try:
            header = await read_exact(self.secured_conn, _HEADER_SIZE)
        except IncompleteReadError as exc:
            if not exc.is_clean_close:
                log.warning("yamux connection to %s ended inside a frame header: %s", self.peer_id, exc)
            await self._shut()
            return False
        except Exception as exc:
            log.debug("yamux connection to %s: reading a header failed: %r", self.peer_id, exc)
            await self._shut()
            return False
        _, typ, flags, stream_id, length = _HEADER.unpack(header)
        if typ == _DATA:
            if length > yamux.MAX_WINDOW_SIZE:
                log.warning(
                    "yamux: peer %s announced a DATA frame of %d bytes; closing the connection", self.peer_id, length
                )
                await self._shut()
                return False
            await self._on_data(flags, stream_id, length)
        elif typ == _WINDOW_UPDATE:
            if flags & _SYN:
                await self._on_syn(typ, flags, stream_id, length, b"", False)
            else:
                self._on_window_update(flags, stream_id, length)
        elif typ == _PING:
            if flags & _SYN:
                await self._write_frame(_HEADER.pack(0, _PING, _ACK, 0, length))
            elif flags & _ACK:
                rtt = trio.current_time() - self._ping_sent_time
                self._rtt = rtt if self._rtt == 0.0 else (self._rtt + rtt) / 2
                self._ping_event.set()
        elif typ == _GO_AWAY:
            if length not in (yamux.GO_AWAY_NORMAL, yamux.GO_AWAY_INTERNAL_ERROR, yamux.GO_AWAY_CONN_GARBAGE_COLLECTED):
                log.warning("yamux: GO_AWAY from %s with code %d", self.peer_id, length)
            await self._shut()
            return False
        return True

    async def _on_data(self, flags: int, stream_id: int, length: int) -> None:
        body, failed = b"", False
        if length:
            try:
                body = await self._read_body(length)
            except IncompleteReadError:
                failed = True
        if flags & _SYN:
            await self._on_syn(_DATA, flags, stream_id, length, body, failed)
            return
        stream = self.streams.get(stream_id)
        if stream is None:
            return
        event = self.stream_events.get(stream_id)
        if failed:
            stream.recv_closed = True
            stream.closed = True
            if event is not None:
                event.set()
            return
        if body:
            self._deliver(stream, body)
        if flags & _ACK and not body:
            return
        if event is not None:
            event.set()
        if not flags & _ACK:
            self._fin_rst(stream, flags)

    def _on_window_update(self, flags: int, stream_id: int, length: int) -> None:
        stream = self.streams.get(stream_id)
        if stream is None:
            return
        if flags & _ACK:
            if length > 0:
                stream.send_window += length
            return
        stream.send_window += length
        self._fin_rst(stream, flags)

    async def _on_syn(self, typ: int, flags: int, stream_id: int, length: int, body: bytes, failed: bool) -> None:
        """A frame opening a stream: a new stream is acknowledged (unless it
        carries RST) and handed to ``accept_stream``; a SYN for a stream id
        in use is answered with RST."""
        if stream_id in self.streams:
            await self._write_frame(_HEADER.pack(0, _WINDOW_UPDATE, _RST, stream_id, 0))
            return
        stream = Stream(stream_id, self, False)
        self.streams[stream_id] = stream
        self.stream_buffers[stream_id] = bytearray()
        event = self.stream_events[stream_id] = trio.Event()
        if failed:
            stream.recv_closed = True
            stream.closed = True
            event.set()
        elif typ == _WINDOW_UPDATE and length > 0:
            stream.send_window += length
        elif typ == _DATA and body:
            self._deliver(stream, body)
            event.set()
        if flags & _FIN:
            stream.recv_closed = True
            if stream.send_closed:
                stream.closed = True
            event.set()
            if stream.closed:
                self._finalize_stream_locked(stream, fully_closed=True)
        if flags & _RST:
            stream.closed = True
            stream.reset_received = True
            event.set()
            self._finalize_stream_locked(stream, fully_closed=True)
            await self.new_stream_send_channel.send(stream)
            return
        # The ACK waits for the stream's first frame (the node's first write
        # on an inbound stream is its multistream-select answer, right after
        # the stream is handled) and goes out in the same write.
        self.acks.add(stream_id)
        await self.new_stream_send_channel.send(stream)

    def _finalize_stream_locked(self, stream: yamux.YamuxStream, *, fully_closed: bool) -> None:
        """py-libp2p's, and a dropped stream's deferred ACK forgotten."""
        super()._finalize_stream_locked(stream, fully_closed=fully_closed)
        if self.acks and stream.stream_id not in self.streams:
            self.acks.discard(stream.stream_id)
            self.ahead.pop(stream.stream_id, None)

    def _sweep_stale_streams(self, now: float | None = None) -> int:
        """py-libp2p's, and the swept streams' deferred ACKs forgotten."""
        reclaimed = super()._sweep_stale_streams(now)
        if self.acks:
            self.acks.intersection_update(self.streams)
            for stream_id in [sid for sid in self.ahead if sid not in self.acks]:
                del self.ahead[stream_id]
        return reclaimed


class MuxerMultistream(muxer_multistream.MuxerMultistream):
    """The muxer negotiation, building the muxer class the options name.
    (py-libp2p 0.8.1's ``new_conn`` builds its own yamux class whatever
    class ``muxer_opt`` gives for yamux's protocol id.)"""

    async def new_conn(self, conn: Any, peer_id: Any) -> Any:
        protocol, muxer = await self._selector.select(conn, conn.is_initiator, self.negotiate_timeout)
        muxed: Any
        if isinstance(muxer, type) and issubclass(muxer, yamux.Yamux):
            muxed = muxer(conn, peer_id, is_initiator=conn.is_initiator)
        else:
            muxed = muxer(conn, peer_id)
        return self._annotate_connection(muxed, conn, protocol)


def _yamux_of(thing: Any) -> Yamux | None:
    """The :class:`Yamux` connection under a NetStream, a muxed stream or a
    swarm connection; None for other muxers."""
    for conn in (
        thing,
        getattr(thing, "muxed_conn", None),
        getattr(getattr(thing, "muxed_stream", thing), "conn", None),
    ):
        if isinstance(conn, Yamux):
            return conn
    return None


@asynccontextmanager
async def corked(stream: Any) -> AsyncIterator[None]:
    """Frames this task writes on ``stream``'s yamux connection inside the
    block go out together at its end: one Noise message and one ``send``
    instead of one per frame. Only this task's frames wait; other streams
    of the connection write as usual. A no-op on other muxers, inside
    another cork of the connection, and on a connection another task corks."""
    conn = _yamux_of(stream)
    if conn is None or conn.cork is not None:
        yield
        return
    frames: list[bytes] = []
    conn.cork = (trio.lowlevel.current_task(), frames)
    try:
        yield
    finally:
        conn.cork = None
        await conn.flush_cork(frames)


async def read_exact(conn: Any, n: int) -> bytes:
    """Exactly ``n`` bytes of ``conn``; IncompleteReadError when it ends
    first (``received_bytes`` 0: it ended cleanly between frames)."""
    data: bytes = await conn.read(n)
    if len(data) == n:
        return data
    got = bytearray(data)
    while len(got) < n and data:
        data = await conn.read(n - len(got))
        got += data
    if len(got) < n:
        raise IncompleteReadError(
            f"Connection closed during read operation: expected {n} bytes but received {len(got)} bytes",
            expected_bytes=n,
            received_bytes=len(got),
        )
    return bytes(got)


# --- Noise and the secure session ------------------------------------------------


class NoiseReader(noise_io.NoiseTransportReadWriter):
    """Noise transport messages read through a read-ahead buffer."""

    def __init__(self, conn: Any, noise_state: Any) -> None:
        super().__init__(conn, noise_state)
        self.raw = conn
        self.kept = bytearray()

    async def _take(self, n: int) -> bytes:
        """Exactly ``n`` bytes: from what was read ahead, then from reads of
        up to :data:`READ_AHEAD` bytes; IncompleteReadError at the end."""
        while len(self.kept) < n:
            data = await self.raw.read(max(READ_AHEAD, n - len(self.kept)))
            if not data:
                got = len(self.kept)
                self.kept.clear()
                raise IncompleteReadError(
                    f"Connection closed during read operation: expected {n} bytes but received {got} bytes",
                    expected_bytes=n,
                    received_bytes=got,
                )
            self.kept += data
        if len(self.kept) == n:
            out = bytes(self.kept)
            self.kept.clear()
            return out
        out = bytes(self.kept[:n])
        del self.kept[:n]
        return out

    async def read_msg(self, prefix_encoded: bool = False) -> bytes:
        """One Noise transport message: its 2-byte length, its body, decrypted."""
        if prefix_encoded:
            return await super().read_msg(prefix_encoded)
        length = int.from_bytes(await self._take(noise_io.SIZE_NOISE_MESSAGE_LEN), "big")
        return self.decrypt(await self._take(length))


class Session(SecureSession):
    """A secure session keeping the rest of a message as the message and an
    offset; reads through :class:`NoiseReader`."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.msg = b""
        self.pos = 0

    @classmethod
    def of(cls, session: SecureSession) -> Session:
        """This class's session over the same connection and keys as
        ``session`` (just handshaken: nothing read past the handshake)."""
        old: Any = session.conn
        reader = NoiseReader(old.read_writer.read_write_closer, old.noise_state)
        return cls(
            local_peer=session.local_peer,
            local_private_key=session.local_private_key,
            remote_peer=session.remote_peer,
            remote_permanent_pubkey=session.remote_permanent_pubkey,
            is_initiator=session.is_initiator,
            conn=reader,
        )

    def buffered(self) -> int:
        """Decrypted bytes waiting to be read."""
        return len(self.msg) - self.pos

    async def read(self, n: int | None = None) -> bytes:
        """``n`` bytes (fewer only at the end of the connection), or with
        ``n`` None what is buffered or the next message."""
        if n == 0:
            return b""
        msg, pos = self.msg, self.pos
        if msg and pos < len(msg):
            avail = len(msg) - pos
            if n is None or n == avail:
                self.msg, self.pos = b"", 0
                return msg[pos:] if pos else msg
            if n < avail:
                self.pos = pos + n
                return msg[pos : pos + n]
            result = bytearray(msg[pos:])
        else:
            result = bytearray()
        self.msg, self.pos = b"", 0
        while True:
            fresh = await self.conn.read_msg()
            if fresh == b"":
                if result:
                    return bytes(result)
                raise yamux.ConnectionClosedError("Connection closed")
            if n is None and not result:
                return fresh
            assert n is not None
            needed = n - len(result)
            if len(fresh) == needed and not result:
                return fresh
            if len(fresh) <= needed:
                result += fresh
                if len(result) == n:
                    return bytes(result)
                continue
            result += fresh[:needed]
            self.msg, self.pos = fresh, needed
            return bytes(result)


class NoiseTransport(noise_transport.Transport):
    """py-libp2p's Noise XX handshake; the sessions it makes are :class:`Session`."""

    async def secure_inbound(self, conn: Any) -> Session:
        return Session.of(await super().secure_inbound(conn))  # type: ignore[arg-type]

    async def secure_outbound(self, conn: Any, peer_id: Any) -> Session:
        return Session.of(await super().secure_outbound(conn, peer_id))  # type: ignore[arg-type]


# --- multistream-select --------------------------------------------------------------


def _received(stream: Any) -> bytearray | None:
    """What the yamux stream under ``stream`` (a NetStream) has received and
    not yet been read, without waiting; None for other muxers."""
    muxed = getattr(stream, "muxed_stream", None)
    if not isinstance(muxed, Stream):
        return None
    return muxed.conn.stream_buffers.get(muxed.stream_id)


def _hold_answer(stream: Any, answer: bytes) -> bool:
    """Keep ``answer`` (the multistream-select reply) to go out just ahead
    of the stream's first frame, with its ACK; False when the stream's ACK
    has already gone (the answer is then written now)."""
    muxed = stream.muxed_stream
    conn = cast(Yamux, muxed.conn)
    if muxed.stream_id not in conn.acks or muxed.send_window < len(answer):
        return False
    muxed.send_window -= len(answer)
    conn.ahead[muxed.stream_id] = _HEADER.pack(0, _DATA, 0, muxed.stream_id, len(answer)) + answer
    return True


class Multiselect(multiselect.Multiselect):
    """The listener's multistream-select, answering in one write when the
    dialer's header and a served protocol id are already received."""

    def __init__(self, handlers: Any = None) -> None:
        super().__init__(handlers)
        # Protocols whose handler reads one length-prefixed request and then
        # always writes (an answer, a close or a reset): their answer may
        # wait for that write.
        self.answer_with_first_write: set[str] = set()

    async def negotiate(self, communicator: Any, negotiate_timeout: int = multiselect.DEFAULT_NEGOTIATE_TIMEOUT) -> Any:
        stream = getattr(communicator, "read_writer", None)
        received = _received(stream)
        parsed = parse_lines(received, 2) if received else None
        if parsed is None:
            return await super().negotiate(communicator, negotiate_timeout)
        (header, command), used = parsed
        try:
            protocol = command.decode()
        except UnicodeDecodeError:
            protocol = None
        if not (header == MULTISTREAM and protocol and protocol != "ls" and protocol in self.handlers):
            return await super().negotiate(communicator, negotiate_timeout)
        # With the request in already the handler answers without waiting for
        # the dialer, so this reply can go out with that answer.
        assert received is not None and stream is not None
        request_in = protocol in self.answer_with_first_write and complete_frame(received, used)
        try:
            with trio.fail_after(negotiate_timeout):
                taken = await stream.read(used)
                if len(taken) != used:
                    raise multiselect.MultiselectError("multistream-select bytes vanished while read")
                answer = encode_delim(MULTISTREAM) + encode_delim(command)
                if not (request_in and _hold_answer(stream, answer)):
                    await stream.write(answer)
        except multiselect.MultiselectError:
            raise
        except Exception as exc:
            raise multiselect.MultiselectError(f"multistream-select failed: {exc!r}") from exc
        return protocol, self.handlers[TProtocol(protocol)]


# --- swarm notifications --------------------------------------------------------------

_TRIVIAL_OPS = {"RESUME", "RETURN_GENERATOR", "POP_TOP", "NOP", "LOAD_CONST", "RETURN_VALUE", "RETURN_CONST"}
_does_nothing_cache: dict[object, bool] = {}


def does_nothing(method: Any) -> bool:
    """True when ``method`` (a coroutine function) only returns None."""
    function = getattr(method, "__func__", method)
    known = _does_nothing_cache.get(function)
    if known is None:
        known = False
        if inspect.iscoroutinefunction(function):
            known = all(
                i.opname in _TRIVIAL_OPS
                and (i.opname != "LOAD_CONST" or i.argval is None)
                and (i.opname != "RETURN_CONST" or i.argval is None)
                for i in dis.get_instructions(function)
            )
        _does_nothing_cache[function] = known
    return known


def skip_idle_notifications(swarm: Swarm) -> None:
    """Make this swarm (not the class) skip the notifees whose method does
    nothing, and the nursery when none is left."""
    plain = swarm._notify

    async def notify(self: Swarm, method: str, *args: Any) -> None:
        if any(not does_nothing(getattr(type(n), method, None)) for n in self.notifees):
            await plain(method, *args)

    swarm._notify = MethodType(notify, swarm)  # type: ignore[method-assign]


# --- what is replaced ----------------------------------------------------------------

# Upstream method -> sha256 of its source in py-libp2p PINNED_VERSION. Each
# is overridden (or, for Swarm._notify, wrapped) above; a change upstream
# means reviewing the override.
REPLACED = {
    "libp2p.stream_muxer.yamux.yamux.YamuxStream._auto_tune_and_send_window_update": "6ebcbd822fe7f996efbc9efd5dceea1e8d0d729380a807eb7e4aa81cf79ca036",
    "libp2p.stream_muxer.yamux.yamux.YamuxStream.write": "d87f74dfb53ab194e7907a44c7400ce2f7e64f8cde63b5840af83772b17547af",
    "libp2p.stream_muxer.yamux.yamux.YamuxStream.read": "ca585f2199fd4e83cc1ceffe0b28c0d2c176c0af426ce6fe0c155d79038bd9e9",
    "libp2p.stream_muxer.yamux.yamux.YamuxStream.close": "158b994f8f0d7224fa91dec3c811417e225ed0b7daaa5ac4528184fe40efd8e9",
    "libp2p.stream_muxer.yamux.yamux.Yamux._write_frame": "16ff969cdd0d2b1b296bf1b1765471239ce96e18c8b00784ef77a2fb808c4d5b",
    "libp2p.stream_muxer.yamux.yamux.Yamux.open_stream": "f3e0ef79ec21d0cb287994314e8ab226c6d58145b0a24c43806072438e39583f",
    "libp2p.stream_muxer.yamux.yamux.Yamux.read_stream": "d07c99299384666ddcec8f96a18caf56c71aa957197dd68a99a84c806844310d",
    "libp2p.stream_muxer.yamux.yamux.Yamux._read_data_body": "54cc06c91ba6ee159e0eefaf4802b3111fdce60fe1de566e267127c5fb2e0c41",
    "libp2p.stream_muxer.yamux.yamux.Yamux.handle_incoming": "ad15ff6943feac206c7abfbf77f2142a64bb5edbe9085e3ccdda371736abdc7b",
    "libp2p.stream_muxer.yamux.yamux.Yamux._finalize_stream_locked": "95b60e92421133b491d8008f297f1a9e10f73875a3e0c6c07ffd846743422099",
    "libp2p.stream_muxer.yamux.yamux.Yamux._sweep_stale_streams": "0b1a5033e707e1387dd70663d929add5895025d134ed95700df8a892dda1d8ea",
    "libp2p.stream_muxer.yamux.yamux.Yamux.__init__": "3b11a2a71ca444ca7b621d7deac2caa2254260af54e2cac958ce275cafbeb691",
    "libp2p.security.secure_session.SecureSession.read": "eeba14a89cf12325917fe19497a1bfc3c7c04b377947255a62bacbe854d65338",
    "libp2p.security.secure_session.SecureSession.__init__": "b076c07a6dc2251b01afb1dc64f9d04efb6239642ad7e984eeccc5a8a2a996b3",
    "libp2p.security.noise.io.BaseNoiseMsgReadWriter.read_msg": "b2fa218c135c82c09e8741282b92839f70c7275c05a78f23bfa30c7bd67ddf85",
    "libp2p.security.noise.io.BaseNoiseMsgReadWriter.__init__": "e6b51bace4fa3dda4a04e7367a9d40f2658344a4320ae477ff4a34afb6246d98",
    "libp2p.security.noise.transport.Transport.secure_inbound": "4c447c4ea56267b1a09b8401e17d4f1c884d9801ff27d49872cf55badc970835",
    "libp2p.security.noise.transport.Transport.secure_outbound": "f5be8851b898cbf1134b10f479a946baed06a5a1a2840f5da3a3e625b85b5f84",
    "libp2p.protocol_muxer.multiselect.Multiselect.negotiate": "e870e3fe41c87e3cc0c68f1d9050d7c5c7d6d1ff2c4e50b3f2527b21df1cb7a0",
    "libp2p.stream_muxer.muxer_multistream.MuxerMultistream.new_conn": "91d21f40f524ad99ff6bcf6217c9350f297de9ae7042dfdf2e36e899913064fd",
    "libp2p.network.swarm.Swarm._notify": "36afe611751a4cb8e15cd8d60089291055b55095517aac9c24c16eeef7ebe2ee",
}


def source_fingerprint(qualified_name: str) -> str:
    """sha256 of the source of a module attribute path such as
    ``libp2p.network.swarm.Swarm._notify``."""
    import importlib

    parts = qualified_name.split(".")
    for split in range(len(parts) - 1, 0, -1):
        try:
            thing: Any = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for attr in parts[split:]:
            thing = getattr(thing, attr)
        return hashlib.sha256(inspect.getsource(thing).encode()).hexdigest()
    raise ImportError(qualified_name)
