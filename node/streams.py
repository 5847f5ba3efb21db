"""What every libp2p request/response service of the node does with a
stream: read a chunk, name its peer, close it or reset it, bounded in time."""

from __future__ import annotations

import trio

# Bytes asked of the muxer per read: small enough to keep each copy cheap,
# large enough that the biggest request served (a lightpush of 1.06 MB) takes 17 reads.
READ_CHUNK = 64 * 1024

# Closing waits for the muxer to send its FIN; a peer that stopped reading
# must not hold the handler.
CLOSE_TIMEOUT_S = 5.0


async def read_chunk(stream) -> bytes:
    """The next bytes of ``stream``; b"" at its end."""
    try:
        return await stream.read(READ_CHUNK)
    except EOFError:
        return b""


def peer_of(stream) -> str:
    try:
        return str(stream.muxed_conn.peer_id)
    except AttributeError:
        return "unknown"


async def close_stream(stream) -> None:
    """Close our side; a peer that does not let the close finish gets a reset."""
    try:
        with trio.move_on_after(CLOSE_TIMEOUT_S) as scope:
            await stream.close()
        if scope.cancelled_caught:
            await reset_stream(stream)
    except Exception:
        await reset_stream(stream)


async def reset_stream(stream) -> None:
    """Reset ``stream``, also from a cancelled task (shielded, bounded)."""
    with trio.CancelScope(shield=True):
        try:
            with trio.move_on_after(CLOSE_TIMEOUT_S):
                await stream.reset()
        except Exception:
            pass
