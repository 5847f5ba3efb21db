"""Changes to py-libp2p's hot paths that cost the node CPU on every stream.

py-libp2p 0.8.1's yamux answers every read with a WINDOW_UPDATE frame:
its receive-window policy credits the bytes just read back to the sender
whenever any credit is outstanding. A Store request/response stream reads
the peer's multistream-select header and protocol id one varint byte and
one line at a time, then the request, so each query cost the node five or
six extra frames: each a Noise encryption, a socket write on our side and a
frame the peer decrypts and handles, all for windows that never come close
to running out (a Store request is at most 64 KiB, the window starts at
256 KiB; a lightpush request of up to 1.06 MB still gets its credit back
at every half window).

:func:`tune_libp2p` gives yamux the receive-window policy of go-yamux
(``sendWindowUpdate`` in go-yamux's stream.go, the muxer nwaku's peers and
go-libp2p use): credit goes back only once at least half the window is
owed, and the window still grows by py-libp2p's own auto-tuning when it
does. The sender is never starved: it always has at least half a window
of credit, as with go-yamux.

py-libp2p reads a TCP connection as exactly as its callers ask: a Noise
message is a 2-byte length, then its body, so every frame costs at least
two ``recv`` calls (and a trip through trio's I/O wait when the second
finds nothing yet). :func:`tune_libp2p` also makes each TCP read ask the
socket for up to :data:`READ_AHEAD` bytes and keep what the caller did not
ask for for its next read: one ``recv`` serves the messages that arrived
together.
"""

from __future__ import annotations

from libp2p.io.trio import TrioTCPStream
from libp2p.stream_muxer.yamux import yamux

# Bytes one TCP read asks for: a yamux frame's largest payload (64 KiB) and
# its headers; what the caller did not ask for waits in a buffer of at most
# this size for the next read.
READ_AHEAD = 64 * 1024 + 64

_applied = False
_plain_read = TrioTCPStream.read


async def _window_update_at_half(self: yamux.YamuxStream, *, bytes_read: int = 0) -> None:
    """Send a WINDOW_UPDATE once the credit owed reaches half the target window."""
    async with self.window_lock:
        buffered = len(self.conn.stream_buffers.get(self.stream_id, b""))
        owed = self.target_recv_window - (self.recv_window + buffered)
        if owed <= 0 or owed < self.target_recv_window // 2:
            return
        self.recv_window += owed
        owed += self._apply_autotune_epoch(buffered)
    await self.send_window_update(owed)


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


def tune_libp2p() -> None:
    """Install the changes above (once per process; every yamux stream of the
    process, inbound and outbound, follows them from then on)."""
    global _applied
    if _applied:
        return
    yamux.YamuxStream._auto_tune_and_send_window_update = _window_update_at_half
    TrioTCPStream.read = _read_ahead
    _applied = True
