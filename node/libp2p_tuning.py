"""Changes to py-libp2p's hot paths that cost the node CPU on every stream.

A Store query is one stream: the client opens it, negotiates the protocol
with multistream-select, writes its request and half-closes; the node
answers and closes. Each of these steps is one or more yamux frames, each
frame one Noise message, each Noise message a ``send`` and a ``recv``.
py-libp2p 0.8.1 spends most of the node's CPU per query on that plumbing
rather than on the query, and :func:`tune_libp2p` trims it without
changing what goes on the wire except where said below.

**Yamux receive window.** py-libp2p's yamux answers every read with a
WINDOW_UPDATE frame: its receive-window policy credits the bytes just
read back to the sender whenever any credit is outstanding. A Store
request/response stream reads the peer's multistream-select header and
protocol id one varint byte and one line at a time, then the request, so
each query cost the node five or six extra frames, all for windows that
never come close to running out (a Store request is at most 64 KiB, the
window starts at 256 KiB; a lightpush request of up to 1.06 MB still gets
its credit back at every half window). Here yamux follows go-yamux's
policy (``sendWindowUpdate`` in go-yamux's stream.go, the muxer nwaku's
peers and go-libp2p use): credit goes back only once at least half the
window is owed, and the window still grows by py-libp2p's own
auto-tuning when it does. The sender always has at least half a window
of credit, as with go-yamux.

**Yamux frame handling.** py-libp2p formats a debug line (an f-string,
built whether or not debug logging is on) for every frame it reads or
writes and several per stream read, reads ``PY_YAMUX_*`` environment
variables on every window decision, and takes two or three trio locks
around bookkeeping that never awaits. The replacements below handle the
same frames with the same effects (flow control, SYN/ACK, FIN and RST on
any frame, window overrun clamping, the bounded frame size, the body
read deadline, the stale-stream bookkeeping) without that overhead. A
stream write that fits in one frame and the send window goes out as one
frame without the per-stream write lock, unless a multi-frame write of
the same stream holds it (its frames must not be interleaved).

**Stream notifications.** The swarm tells every notifee about every
stream opened and closed, each call in a task of its own under a nursery
of its own. py-libp2p's own notifees (identify's and the tag store's)
do nothing with streams; a notifee whose method does nothing is skipped,
and with none left no nursery is opened.

**Secure-session reads.** A Noise message holds several yamux frames;
py-libp2p's session keeps the rest of a message in a ``BytesIO`` it
rebuilds per message and slices through memoryviews. Here the rest is
kept as the message itself and an offset. A Noise transport message is
read as its 2-byte length and body straight from the connection, without
the per-message debug lines.

**TCP read-ahead.** py-libp2p reads a TCP connection as exactly as its
callers ask: a Noise message is a 2-byte length, then its body, so every
frame costs at least two ``recv`` calls. Each TCP read here asks the
socket for up to :data:`READ_AHEAD` bytes and keeps what the caller did
not ask for for its next read: one ``recv`` serves the messages that
arrived together.

**Multistream-select on inbound streams.** py-libp2p's listener writes
its multistream header, then reads the dialer's header and protocol id
one varint byte at a time, then writes the protocol id back: two frames
out, a dozen reads. Most dialers (js-waku, go-libp2p, nwaku, this
node's own client) send their header and protocol id together without
waiting for ours. When both are already received when the stream is
handled and the protocol is served, the node reads exactly those bytes
(anything the dialer sent behind them, such as its request, stays
unread for the handler) and answers the header and the protocol id in
one write: the same bytes on the wire, one frame. Otherwise (nothing
received yet, ``ls``, a protocol not served) py-libp2p negotiates as
before, from the start. For the node's request/response protocols
(:func:`answer_with_first_write`), when the whole request came with the
protocol id, that answer waits for the handler's first write and leaves
with it: the handler answers without waiting for the dialer, and the
dialer has nothing to do before the answer anyway. A dialer that waits
for the echo before sending its request gets it at once.

**Fewer writes per stream.** Each frame was one Noise message and one
``send``. A new inbound stream's ACK now goes out in the same write as
the stream's first frame, just ahead of it (the node's first write on an
inbound stream is its multistream-select answer, as soon as the stream
is handled; the frames on the wire are the ones py-libp2p sent, in the
same order). :func:`corked` lets a task write several frames as one
message: the Store handler's answer and the FIN closing its stream, the
client's SYN, request and FIN. A Store query now costs the client one
write and the node one, instead of five each.
"""

from __future__ import annotations

import dis
import inspect
import logging
import struct
from contextlib import asynccontextmanager

import trio
from libp2p.io.exceptions import IncompleteReadError
from libp2p.io.trio import TrioTCPStream
from libp2p.network.swarm import Swarm
from libp2p.protocol_muxer import multiselect
from libp2p.security.noise import io as noise_io
from libp2p.security.secure_session import SecureSession
from libp2p.stream_muxer.exceptions import MuxedStreamEOF, MuxedStreamError, MuxedStreamReset
from libp2p.stream_muxer.yamux import yamux
from libp2p.utils import encode_delim

log = logging.getLogger(__name__)

# Bytes one TCP read asks for: a yamux frame's largest payload (64 KiB) and
# its headers; what the caller did not ask for waits in a buffer of at most
# this size for the next read.
READ_AHEAD = 64 * 1024 + 64

_HEADER = struct.Struct(yamux.YAMUX_HEADER_FORMAT)
_HEADER_SIZE = yamux.HEADER_SIZE
# The largest DATA payload one write puts in a frame (py-libp2p's own
# split: MAX_MESSAGE_SIZE including the header).
_MAX_PAYLOAD = yamux.MAX_MESSAGE_SIZE - yamux.HEADER_SIZE
_DATA, _WINDOW_UPDATE, _PING, _GO_AWAY = (
    yamux.TYPE_DATA,
    yamux.TYPE_WINDOW_UPDATE,
    yamux.TYPE_PING,
    yamux.TYPE_GO_AWAY,
)
_SYN, _ACK, _FIN, _RST = yamux.FLAG_SYN, yamux.FLAG_ACK, yamux.FLAG_FIN, yamux.FLAG_RST

# multistream-select: the header line, and the longest protocol id the fast
# path parses (go-libp2p refuses longer ones: its protocol-id limit is 1024).
_MULTISTREAM = multiselect.MULTISELECT_PROTOCOL_ID.encode()
_MAX_PROTOCOL_ID = 1024

_applied = False
_plain_read = TrioTCPStream.read
_plain_negotiate = multiselect.Multiselect.negotiate
_plain_notify = Swarm._notify
_plain_noise_read_msg = noise_io.BaseNoiseMsgReadWriter.read_msg


# --- yamux ----------------------------------------------------------------------


async def _window_update_at_half(self: yamux.YamuxStream, *, bytes_read: int = 0) -> None:
    """Send a WINDOW_UPDATE once the credit owed reaches half the target window.
    (No await between reading and updating the window: no lock needed.)"""
    buffered = len(self.conn.stream_buffers.get(self.stream_id, b""))
    owed = self.target_recv_window - (self.recv_window + buffered)
    if owed <= 0 or owed < self.target_recv_window // 2:
        return
    self.recv_window += owed
    owed += self._apply_autotune_epoch(buffered)
    await self.send_window_update(owed)


async def _write_frame(self: yamux.Yamux, data: bytes) -> None:
    """One frame to the connection; writes are serialized. A stream's
    deferred ACK goes out in the same write, just ahead of the stream's
    first frame; frames written under :func:`corked` by the corking task
    wait for the end of the cork."""
    acks = getattr(self, "_wk_acks", None)
    if acks:
        stream_id = int.from_bytes(data[4:8], "big")
        if stream_id in acks:
            acks.discard(stream_id)
            ahead = self._wk_ahead.pop(stream_id, b"")
            data = _HEADER.pack(0, _WINDOW_UPDATE, _ACK, stream_id, 0) + ahead + data
    cork = getattr(self, "_wk_cork", None)
    if cork is not None and cork[0] is trio.lowlevel.current_task():
        cork[1].append(data)
        return
    async with self._write_lock:
        await self.secured_conn.write(data)


# The longest a cork's frames may take to leave once its block ends
# (cancelled or not): a frame for the peer's socket buffer, as a close is
# given (node/streams.py CLOSE_TIMEOUT_S).
CORK_FLUSH_TIMEOUT_S = 5.0


def _yamux_of(thing) -> yamux.Yamux | None:
    """The yamux connection under a NetStream, a muxed stream or a swarm
    connection; None for other muxers."""
    for conn in (
        thing,
        getattr(thing, "muxed_conn", None),
        getattr(getattr(thing, "muxed_stream", thing), "conn", None),
    ):
        if isinstance(conn, yamux.Yamux):
            return conn
    return None


async def _flush_cork(conn: yamux.Yamux, frames: list[bytes]) -> None:
    if frames:
        data = b"".join(frames)
        frames.clear()
        with trio.CancelScope(shield=True), trio.fail_after(CORK_FLUSH_TIMEOUT_S):
            async with conn._write_lock:
                await conn.secured_conn.write(data)


@asynccontextmanager
async def corked(stream):
    """Frames this task writes on ``stream``'s yamux connection inside the
    block go out together at its end: one Noise message and one ``send``
    instead of one per frame (a response and the FIN closing its stream,
    a new stream's SYN, request and FIN). Only this task's frames wait;
    other streams of the connection write as usual. A no-op on other
    muxers, inside another cork of the connection, and on a connection
    another task corks."""
    conn = _yamux_of(stream)
    if conn is None or getattr(conn, "_wk_cork", None) is not None:
        yield
        return
    frames: list[bytes] = []
    conn._wk_cork = (trio.lowlevel.current_task(), frames)
    try:
        yield
    finally:
        conn._wk_cork = None
        await _flush_cork(conn, frames)


async def _stream_write(self: yamux.YamuxStream, data: bytes) -> None:
    """``YamuxStream.write``: one frame without the stream's write lock when
    the data fits in one frame and the send window and no other write of
    this stream is under way; py-libp2p's own loop otherwise."""
    if self.send_closed:
        raise MuxedStreamError("Stream is closed for sending")
    size = len(data)
    if 0 < size <= _MAX_PAYLOAD and size <= self.send_window and not self.closed and self.rw_lock._writer_lock.value:
        self.send_window -= size
        await self.conn._write_frame(_HEADER.pack(0, _DATA, 0, self.stream_id, size) + data)
        return
    # A write that may wait for the peer's window updates cannot wait in a
    # cork: the peer would never see the data it has to credit.
    cork = getattr(self.conn, "_wk_cork", None)
    if cork is None or cork[0] is not trio.lowlevel.current_task():
        await _plain_stream_write(self, data)
        return
    self.conn._wk_cork = None
    try:
        await _flush_cork(self.conn, cork[1])
        await _plain_stream_write(self, data)
    finally:
        self.conn._wk_cork = cork


async def _stream_read(self: yamux.YamuxStream, n: int | None = -1) -> bytes:
    """``YamuxStream.read``: bounded reads through :func:`_read_stream`."""
    if n is None or n == -1:
        return await _plain_stream_read(self, n)
    if self.recv_closed and not self.conn.stream_buffers.get(self.stream_id):
        if self.reset_received:
            raise MuxedStreamReset("Stream was reset")
        raise MuxedStreamEOF("Stream is closed for receiving")
    data = await self.conn.read_stream(self.stream_id, n)
    await self._auto_tune_and_send_window_update(bytes_read=len(data))
    return data


async def _stream_close(self: yamux.YamuxStream) -> None:
    """``YamuxStream.close`` (half-close: FIN) without the perf summary's
    environment lookups."""
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


async def _read_stream(self: yamux.Yamux, stream_id: int, n: int = -1) -> bytes:
    """``Yamux.read_stream``: up to ``n`` buffered bytes of a stream, waiting
    for some; EOF once the peer's FIN is in and the buffer drained, reset
    when the peer reset it. (Nothing here awaits between looking at the
    buffer and taking from it, so py-libp2p's connection lock is not needed.)"""
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


async def _read_exact(conn, n: int) -> bytes:
    """Exactly ``n`` bytes of ``conn``; IncompleteReadError when it ends first
    (``received_bytes`` 0: it ended cleanly between frames)."""
    data = await conn.read(n)
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


async def _read_body(self: yamux.Yamux, length: int) -> bytes:
    """A DATA frame's body: from the bytes already decrypted when they hold
    it, else under py-libp2p's deadline for a body to arrive."""
    conn = self.secured_conn
    if len(getattr(conn, "_wk_msg", b"")) - getattr(conn, "_wk_pos", 0) >= length:
        return await conn.read(length)
    with trio.fail_after(yamux._yamux_data_read_timeout()):
        return await _read_exact(conn, length)


async def _shut(self: yamux.Yamux) -> None:
    self.event_shutting_down.set()
    await self._cleanup_on_error()


def _deliver(self: yamux.Yamux, stream: yamux.YamuxStream, data: bytes) -> None:
    """Buffer ``data`` for ``stream``; a peer overrunning the window is clamped."""
    self.stream_buffers[stream.stream_id].extend(data)
    stream.recv_window -= len(data)
    if stream.recv_window < 0:
        log.warning(
            "yamux stream %d: peer exceeded the receive window by %d bytes", stream.stream_id, -stream.recv_window
        )
        stream.recv_window = 0


def _fin_rst(self: yamux.Yamux, stream: yamux.YamuxStream, flags: int) -> None:
    """FIN and RST on any frame: mark the stream, wake its reader, drop it
    once closed both ways."""
    sid = stream.stream_id
    if flags & _FIN:
        stream.recv_closed = True
        if stream.send_closed:
            stream.closed = True
    if flags & _RST:
        stream.closed = True
        stream.reset_received = True
    if flags & (_FIN | _RST):
        event = self.stream_events.get(sid)
        if event is not None:
            event.set()
    if stream.closed:
        self._finalize_stream_locked(stream, fully_closed=True)


async def _handle_incoming(self: yamux.Yamux) -> None:
    """``Yamux.handle_incoming``: read frames until the connection ends."""
    conn = self.secured_conn
    streams = self.streams
    while not self.event_shutting_down.is_set():
        try:
            try:
                header = await _read_exact(conn, _HEADER_SIZE)
            except IncompleteReadError as exc:
                if not exc.is_clean_close:
                    log.warning("yamux connection to %s ended inside a frame header: %s", self.peer_id, exc)
                await _shut(self)
                break
            except Exception as exc:
                log.debug("yamux connection to %s: reading a header failed: %r", self.peer_id, exc)
                await _shut(self)
                break
            _, typ, flags, stream_id, length = _HEADER.unpack(header)
            if typ == _DATA and length > yamux.MAX_WINDOW_SIZE:
                log.warning(
                    "yamux: peer %s announced a DATA frame of %d bytes; closing the connection", self.peer_id, length
                )
                await _shut(self)
                break
            if typ == _DATA:
                body, failed = b"", False
                if length:
                    try:
                        body = await _read_body(self, length)
                    except IncompleteReadError:
                        failed = True
                if flags & _SYN:
                    await _on_syn(self, typ, flags, stream_id, length, body, failed)
                    continue
                stream = streams.get(stream_id)
                if stream is None:
                    continue
                if failed:
                    stream.recv_closed = True
                    stream.closed = True
                    event = self.stream_events.get(stream_id)
                    if event is not None:
                        event.set()
                    continue
                if body:
                    _deliver(self, stream, body)
                if flags & _ACK and not body:
                    continue
                event = self.stream_events.get(stream_id)
                if event is not None:
                    event.set()
                if not flags & _ACK:
                    _fin_rst(self, stream, flags)
            elif typ == _WINDOW_UPDATE:
                if flags & _SYN:
                    await _on_syn(self, typ, flags, stream_id, length, b"", False)
                    continue
                stream = streams.get(stream_id)
                if stream is None:
                    continue
                if flags & _ACK:
                    if length > 0:
                        stream.send_window += length
                    continue
                stream.send_window += length
                _fin_rst(self, stream, flags)
            elif typ == _PING:
                if flags & _SYN:
                    await self._write_frame(_HEADER.pack(0, _PING, _ACK, 0, length))
                elif flags & _ACK:
                    rtt = trio.current_time() - self._ping_sent_time
                    self._rtt = rtt if self._rtt == 0.0 else (self._rtt + rtt) / 2
                    self._ping_event.set()
            elif typ == _GO_AWAY:
                if length not in (
                    yamux.GO_AWAY_NORMAL,
                    yamux.GO_AWAY_INTERNAL_ERROR,
                    yamux.GO_AWAY_CONN_GARBAGE_COLLECTED,
                ):
                    log.warning("yamux: GO_AWAY from %s with code %d", self.peer_id, length)
                await _shut(self)
                break
        except trio.TooSlowError:
            log.warning("yamux: timed out reading a DATA frame body from %s; closing the connection", self.peer_id)
            await _shut(self)
            break
        except (
            yamux.RawConnError,
            OSError,
            IncompleteReadError,
            trio.ClosedResourceError,
            trio.BrokenResourceError,
        ) as exc:
            log.debug("yamux connection to %s failed: %r", self.peer_id, exc)
            await _shut(self)
            break
        except Exception as exc:
            log.error("yamux: error handling a frame from %s: %r", self.peer_id, exc)
            if self.event_shutting_down.is_set():
                await self._cleanup_on_error()
                break
            await trio.sleep(0.01)


async def _on_syn(
    self: yamux.Yamux, typ: int, flags: int, stream_id: int, length: int, body: bytes, failed: bool
) -> None:
    """A frame opening a stream: a new stream is acknowledged (unless it
    carries RST) and handed to ``accept_stream``; a SYN for a stream id in
    use is answered with RST."""
    if stream_id in self.streams:
        await self._write_frame(_HEADER.pack(0, _WINDOW_UPDATE, _RST, stream_id, 0))
        return
    stream = yamux.YamuxStream(stream_id, self, False)
    self.streams[stream_id] = stream
    self.stream_buffers[stream_id] = bytearray()
    self.stream_events[stream_id] = trio.Event()
    if failed:
        stream.recv_closed = True
        stream.closed = True
        self.stream_events[stream_id].set()
    elif typ == _WINDOW_UPDATE and length > 0:
        stream.send_window += length
    elif typ == _DATA and body:
        _deliver(self, stream, body)
        self.stream_events[stream_id].set()
    if flags & _FIN:
        stream.recv_closed = True
        if stream.send_closed:
            stream.closed = True
        self.stream_events[stream_id].set()
        if stream.closed:
            self._finalize_stream_locked(stream, fully_closed=True)
    if flags & _RST:
        stream.closed = True
        stream.reset_received = True
        self.stream_events[stream_id].set()
        self._finalize_stream_locked(stream, fully_closed=True)
        await self.new_stream_send_channel.send(stream)
        return
    # The ACK waits for the stream's first frame (the node's first write on
    # an inbound stream is its multistream-select answer, right after the
    # stream is handled) and goes out in the same write, just ahead of it.
    acks = getattr(self, "_wk_acks", None)
    if acks is None:
        acks = self._wk_acks = set()
        self._wk_ahead = {}
    acks.add(stream_id)
    await self.new_stream_send_channel.send(stream)


def _finalize_stream_locked(self: yamux.Yamux, stream: yamux.YamuxStream, *, fully_closed: bool) -> None:
    """py-libp2p's, and a dropped stream's deferred ACK forgotten."""
    _plain_finalize(self, stream, fully_closed=fully_closed)
    acks = getattr(self, "_wk_acks", None)
    if acks and stream.stream_id not in self.streams:
        acks.discard(stream.stream_id)
        self._wk_ahead.pop(stream.stream_id, None)


def _sweep_stale_streams(self: yamux.Yamux, now: float | None = None) -> int:
    """py-libp2p's, and the swept streams' deferred ACKs forgotten."""
    reclaimed = _plain_sweep(self, now)
    acks = getattr(self, "_wk_acks", None)
    if acks:
        acks.intersection_update(self.streams)
        for stream_id in [sid for sid in self._wk_ahead if sid not in acks]:
            del self._wk_ahead[stream_id]
    return reclaimed


_plain_finalize = yamux.Yamux._finalize_stream_locked
_plain_sweep = yamux.Yamux._sweep_stale_streams
_plain_stream_write = yamux.YamuxStream.write
_plain_stream_read = yamux.YamuxStream.read


# --- swarm notifications --------------------------------------------------------------

_TRIVIAL_OPS = {"RESUME", "RETURN_GENERATOR", "POP_TOP", "NOP", "LOAD_CONST", "RETURN_VALUE", "RETURN_CONST"}
_does_nothing_cache: dict[object, bool] = {}


def does_nothing(method) -> bool:
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


async def _notify(self: Swarm, method: str, *args) -> None:
    """``Swarm._notify`` without the notifees whose method does nothing."""
    if any(not does_nothing(getattr(type(n), method, None)) for n in self.notifees):
        await _plain_notify(self, method, *args)


# --- secure session and Noise ---------------------------------------------------------


async def _session_read(self: SecureSession, n: int | None = None) -> bytes:
    """``SecureSession.read``: ``n`` bytes (fewer only at the end of the
    connection), or with ``n`` None what is buffered or the next message."""
    if n == 0:
        return b""
    msg: bytes = getattr(self, "_wk_msg", b"")
    pos: int = getattr(self, "_wk_pos", 0)
    if self.low_watermark != self.high_watermark:  # left by py-libp2p's own reader
        msg, pos = msg[pos:] + self._drain(None), 0
    if msg and pos < len(msg):
        avail = len(msg) - pos
        if n is None or n == avail:
            self._wk_msg, self._wk_pos = b"", 0
            return msg[pos:] if pos else msg
        if n < avail:
            self._wk_pos = pos + n
            return msg[pos : pos + n]
        result = bytearray(msg[pos:])
    else:
        result = bytearray()
    self._wk_msg, self._wk_pos = b"", 0
    while True:
        fresh = await self.conn.read_msg()
        if fresh == b"":
            if result:
                return bytes(result)
            raise yamux.ConnectionClosedError("Connection closed")
        if n is None and not result:
            return fresh
        needed = n - len(result)
        if len(fresh) == needed and not result:
            return fresh
        if len(fresh) <= needed:
            result += fresh
            if len(result) == n:
                return bytes(result)
            continue
        result += fresh[:needed]
        self._wk_msg, self._wk_pos = fresh, needed
        return bytes(result)


async def _noise_read_msg(self: noise_io.BaseNoiseMsgReadWriter, prefix_encoded: bool = False) -> bytes:
    """One Noise transport message: its 2-byte length, its body, decrypted."""
    if prefix_encoded or not isinstance(self, noise_io.NoiseTransportReadWriter):
        return await _plain_noise_read_msg(self, prefix_encoded)
    raw = self.read_writer.read_write_closer
    length = int.from_bytes(await _read_exact(raw, noise_io.SIZE_NOISE_MESSAGE_LEN), "big")
    return self.decrypt(await _read_exact(raw, length))


# --- TCP --------------------------------------------------------------------------------


async def _read_ahead(self: TrioTCPStream, n: int | None = None) -> bytes:
    """``TrioTCPStream.read`` served from bytes already received when there are some."""
    if n == 0:
        return b""
    kept: bytearray | None = getattr(self, "_wakustore_kept", None)
    if kept:
        if n is None or n >= len(kept):
            data = bytes(kept)
            kept.clear()
        else:
            data = bytes(kept[:n])
            del kept[:n]
        return data
    data = await _plain_read(self, READ_AHEAD if n is None or n < READ_AHEAD else n)
    if n is not None and len(data) > n:
        if kept is None:
            kept = self._wakustore_kept = bytearray()
        kept += data[n:]
        data = data[:n]
    return data


# --- multistream-select --------------------------------------------------------------


def _received(stream) -> bytes | None:
    """What a yamux stream under ``stream`` (a NetStream) has received and
    not yet been read, without waiting; None for other muxers."""
    muxed = getattr(stream, "muxed_stream", None)
    if not isinstance(muxed, yamux.YamuxStream):
        return None
    return muxed.conn.stream_buffers.get(muxed.stream_id)


def parse_lines(data: bytes, count: int) -> tuple[list[bytes], int] | None:
    """The first ``count`` multistream-select messages of ``data`` (each a
    varint length, then text ending in a newline; returned without it) and
    the bytes they take; None when they are not all there yet or one is
    malformed or longer than a protocol id may be."""
    lines, pos = [], 0
    for _ in range(count):
        length = shift = 0
        while True:
            if pos >= len(data) or shift > 14:
                return None
            byte = data[pos]
            pos += 1
            length |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                break
        if length == 0 or length > _MAX_PROTOCOL_ID + 1 or pos + length > len(data):
            return None
        line = data[pos : pos + length]
        if line[-1:] != b"\n":
            return None
        lines.append(bytes(line[:-1]))
        pos += length
    return lines, pos


# Protocols whose handler reads one length-prefixed request and always
# writes (an answer, a close or a reset) once it has it: see
# :func:`answer_with_first_write`.
_ANSWER_WITH_FIRST_WRITE: set[str] = set()


def answer_with_first_write(protocols) -> None:
    """Let inbound streams of ``protocols`` carry their multistream-select
    answer in the handler's first write when the dialer's request was
    received with its protocol id (see the module's notes)."""
    _ANSWER_WITH_FIRST_WRITE.update(protocols)


def _complete_frame(data: bytes, start: int) -> bool:
    """True when ``data[start:]`` begins with a whole varint-length-prefixed frame."""
    length = shift = 0
    for pos in range(start, min(start + 10, len(data))):
        byte = data[pos]
        length |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return len(data) - pos - 1 >= length
    return False


def _hold_answer(stream, answer: bytes) -> bool:
    """Keep ``answer`` (the multistream-select reply) to go out just ahead of
    the stream's first frame, with its ACK; False when the stream's ACK has
    already gone (the answer is then written now)."""
    muxed = stream.muxed_stream
    conn = muxed.conn
    if muxed.stream_id not in getattr(conn, "_wk_acks", ()) or muxed.send_window < len(answer):
        return False
    muxed.send_window -= len(answer)
    conn._wk_ahead[muxed.stream_id] = _HEADER.pack(0, _DATA, 0, muxed.stream_id, len(answer)) + answer
    return True


async def _negotiate(
    self: multiselect.Multiselect, communicator, negotiate_timeout: int = multiselect.DEFAULT_NEGOTIATE_TIMEOUT
):
    """``Multiselect.negotiate`` answering in one write when the dialer's
    header and a served protocol id are already received."""
    stream = getattr(communicator, "read_writer", None)
    received = _received(stream)
    parsed = parse_lines(received, 2) if received else None
    if parsed is not None:
        (header, command), used = parsed
        try:
            protocol = command.decode()
        except UnicodeDecodeError:
            protocol = None
        if header == _MULTISTREAM and protocol and protocol != "ls" and protocol in self.handlers:
            # With the request in already the handler answers without waiting
            # for the dialer, so this reply can go out with that answer.
            request_in = protocol in _ANSWER_WITH_FIRST_WRITE and _complete_frame(received, used)
            try:
                with trio.fail_after(negotiate_timeout):
                    taken = await stream.read(used)
                    if len(taken) != used:
                        raise multiselect.MultiselectError("multistream-select bytes vanished while read")
                    answer = encode_delim(_MULTISTREAM) + encode_delim(command)
                    if not (request_in and _hold_answer(stream, answer)):
                        await stream.write(answer)
            except multiselect.MultiselectError:
                raise
            except Exception as exc:
                raise multiselect.MultiselectError(f"multistream-select failed: {exc!r}") from exc
            return protocol, self.handlers[protocol]
    return await _plain_negotiate(self, communicator, negotiate_timeout)


def tune_libp2p() -> None:
    """Install the changes above (once per process; every connection and
    stream of the process, inbound and outbound, follows them from then on)."""
    global _applied
    if _applied:
        return
    yamux.YamuxStream._auto_tune_and_send_window_update = _window_update_at_half
    yamux.YamuxStream.write = _stream_write
    yamux.YamuxStream.read = _stream_read
    yamux.YamuxStream.close = _stream_close
    yamux.Yamux._write_frame = _write_frame
    yamux.Yamux.read_stream = _read_stream
    yamux.Yamux.handle_incoming = _handle_incoming
    yamux.Yamux._finalize_stream_locked = _finalize_stream_locked
    yamux.Yamux._sweep_stale_streams = _sweep_stale_streams
    Swarm._notify = _notify
    SecureSession.read = _session_read
    noise_io.BaseNoiseMsgReadWriter.read_msg = _noise_read_msg
    TrioTCPStream.read = _read_ahead
    multiselect.Multiselect.negotiate = _negotiate
    _applied = True
