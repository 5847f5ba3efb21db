"""Peer addresses: a multiaddr naming its peer (``.../p2p/<peer id>``),
as every flag and client of the project takes them."""

from __future__ import annotations

from typing import Any


class PeerAddressError(ValueError):
    """Not a multiaddr ending in ``/p2p/<peer id>``."""


def parse_peer(addr: str) -> Any:
    """The py-libp2p PeerInfo of ``addr``, a multiaddr ending in
    ``/p2p/<peer id>`` (TCP or ``/ws``); PeerAddressError otherwise, with
    the reason."""
    import multiaddr
    from libp2p.peer.peerinfo import info_from_p2p_addr

    try:
        return info_from_p2p_addr(multiaddr.Multiaddr(addr))
    except Exception as exc:
        raise PeerAddressError(f"not a multiaddr with /p2p/<peer id>: {addr!r} ({exc})") from None
