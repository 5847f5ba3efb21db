"""What every libp2p request/response protocol does with a stream: read
a chunk or a length-prefixed frame, write a frame, name its peer, close it
or reset it, each bounded in time. The node's services, its sync and the
clients all use these."""

from __future__ import annotations

import math

import trio
from libp2p.abc import INetStream

from wakustore.protocols.framing import FrameReader, encode_frame

# Bytes asked of the muxer per read: small enough to keep each copy cheap,
# large enough that the biggest request served (a lightpush of 1.06 MB) takes 17 reads.
READ_CHUNK = 64 * 1024

# Closing waits for the muxer to send its FIN; a peer that stopped reading
# must not hold the handler.
CLOSE_TIMEOUT_S = 5.0


async def read_chunk(stream: INetStream) -> bytes:
    """The next bytes of ``stream``; b"" at its end."""
    try:
        data: bytes = await stream.read(READ_CHUNK)
        return data
    except EOFError:
        return b""


def peer_of(stream: INetStream) -> str:
    """The peer id of ``stream``'s connection, as text."""
    try:
        return str(stream.muxed_conn.peer_id)
    except AttributeError:
        return "unknown"


async def close_stream(stream: INetStream) -> None:
    """Close our side; a peer that does not let the close finish gets a reset."""
    try:
        with trio.move_on_after(CLOSE_TIMEOUT_S) as scope:
            await stream.close()
        if scope.cancelled_caught:
            await reset_stream(stream)
    except Exception:
        await reset_stream(stream)


async def reset_stream(stream: INetStream) -> None:
    """Reset ``stream``, also from a cancelled task (shielded, bounded)."""
    with trio.CancelScope(shield=True):
        try:
            with trio.move_on_after(CLOSE_TIMEOUT_S):
                await stream.reset()
        except Exception:
            pass


class ReadTimeout(Exception):
    """:func:`read_frame` gave up waiting; ``idle`` is True when no byte of
    the frame had arrived, False when the frame stalled part way."""

    def __init__(self, idle: bool, waited_s: float):
        what = "no request" if idle else "frame incomplete"
        super().__init__(f"{what} after {waited_s:g} s")
        self.idle = idle


async def read_frame(
    stream: INetStream,
    max_size: int,
    *,
    idle_timeout_s: float = math.inf,
    frame_timeout_s: float = math.inf,
    first: bytes = b"",
) -> bytes | None:
    """One length-prefixed frame of at most ``max_size`` bytes from
    ``stream``, or beginning with ``first`` (bytes of the stream already read).

    None when the stream ends before its first byte; raises
    :class:`FramingError` for an oversized or malformed prefix or a stream
    that ends inside a frame. Bytes after the frame are left unread.
    Raises :class:`ReadTimeout` when no byte arrives within
    ``idle_timeout_s`` seconds, or when the frame is not complete within
    ``frame_timeout_s`` seconds of its first byte.
    """
    reader = FrameReader(max_size)
    data = first
    if not data:
        with trio.move_on_after(idle_timeout_s) as idle:
            data = await read_chunk(stream)
        if idle.cancelled_caught:
            raise ReadTimeout(idle=True, waited_s=idle_timeout_s)
    with trio.move_on_after(frame_timeout_s):
        while data:
            frames = reader.feed(data)
            if frames:
                return frames[0]
            data = await read_chunk(stream)
        reader.eof()
        return None
    raise ReadTimeout(idle=False, waited_s=frame_timeout_s)


class Frames:
    """Length-prefixed frames read one at a time from a stream (a stream
    carrying several, as sync's reconciliation does)."""

    def __init__(self, stream: INetStream, max_size: int):
        self.stream = stream
        self.reader = FrameReader(max_size)
        self.ready: list[bytes] = []

    async def next(self, timeout_s: float) -> bytes | None:
        """The next frame; None at the end of the stream. Raises
        FramingError or trio.TooSlowError."""
        with trio.fail_after(timeout_s):
            while not self.ready:
                data = await read_chunk(self.stream)
                if not data:
                    self.reader.eof()
                    return None
                self.ready.extend(self.reader.feed(data))
        return self.ready.pop(0)


async def write_frame(stream: INetStream, body: bytes, timeout_s: float) -> None:
    """``body`` with its length prefix, within ``timeout_s`` seconds
    (trio.TooSlowError otherwise)."""
    with trio.fail_after(timeout_s):
        await stream.write(encode_frame(body))
