"""Changes to py-libp2p's hot paths that cost the node CPU on every stream.

py-libp2p 0.8.1's yamux answers every read with a WINDOW_UPDATE frame:
its receive-window policy credits the bytes just read back to the sender
whenever any credit is outstanding. A Store request/response stream reads
the peer's multistream-select header and protocol id one varint byte and
one line at a time, then the request, so each query cost the node five or
six extra frames: each a Noise encryption, a socket write on our side and a
frame the peer decrypts and handles, all for windows that never come close
to running out (a request is at most 1.06 MB; the window starts at 256 KiB
and is renewed long before it is spent).

:func:`tune_libp2p` gives yamux the receive-window policy of go-yamux
(``sendWindowUpdate`` in go-yamux's stream.go, the muxer nwaku's peers and
go-libp2p use): credit goes back only once at least half the window is
owed, and the window still grows by py-libp2p's own auto-tuning when it
does. The sender is never starved: it always has at least half a window
of credit, as with go-yamux.
"""

from __future__ import annotations

from libp2p.stream_muxer.yamux import yamux

_applied = False


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


def tune_libp2p() -> None:
    """Install the changes above (once per process; every yamux stream of the
    process, inbound and outbound, follows them from then on)."""
    global _applied
    if _applied:
        return
    yamux.YamuxStream._auto_tune_and_send_window_update = _window_update_at_half
    _applied = True
