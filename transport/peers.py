"""Peer addresses: a multiaddr naming its peer (``.../p2p/<peer id>``),
as every flag and client of the project takes them."""

from __future__ import annotations

import socket
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


# Multiaddr protocols that name a host, and the address family each asks for.
_DNS_FAMILIES = {"dns": socket.AF_UNSPEC, "dns4": socket.AF_INET, "dns6": socket.AF_INET6}


async def resolved(info: Any) -> Any:
    """``info`` with its ``/dns``, ``/dns4`` and ``/dns6`` addresses
    replaced by the IP addresses their names resolve to (py-libp2p's TCP
    and websocket transports dial IP addresses only); PeerAddressError
    when a name resolves to nothing."""
    import multiaddr
    import trio
    from libp2p.peer.peerinfo import PeerInfo

    addrs = []
    for addr in info.addrs:
        parts = str(addr).strip("/").split("/")
        if len(parts) < 2 or parts[0] not in _DNS_FAMILIES:
            addrs.append(addr)
            continue
        name, rest = parts[1], "/".join(parts[2:])
        try:
            found = await trio.socket.getaddrinfo(name, None, family=_DNS_FAMILIES[parts[0]], type=socket.SOCK_STREAM)
        except OSError as exc:
            raise PeerAddressError(f"cannot resolve {name}: {exc.strerror or exc}") from None
        for family, _, _, _, sockaddr in found:
            ip = sockaddr[0]
            addrs.append(multiaddr.Multiaddr(f"/{'ip6' if family == socket.AF_INET6 else 'ip4'}/{ip}/{rest}"))
    return PeerInfo(info.peer_id, list(dict.fromkeys(addrs)))


async def connect(host: Any, info: Any) -> None:
    """``host.connect`` to ``info``, its DNS names resolved first."""
    await host.connect(await resolved(info))
