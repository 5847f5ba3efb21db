"""Clients for the hostile-peer tests: libp2p connections from a chosen
loopback address (every 127.0.0.0/8 address is this machine, so one
machine plays many remote hosts) and raw sockets that never handshake."""

from __future__ import annotations

import socket

import trio

from wakustore.bench.hostile import connect_from

# A StoreClient with a fresh key whose TCP connection leaves from a chosen
# address: the benchmark's hostile load dials the same way.
client_from = connect_from


async def try_client(source_ip: str, peer: str, body, timeout_s: float = 10.0):
    """Run ``body(client)`` on a fresh connection from ``source_ip``;
    ``("refused", exc)`` when the connection is refused, else ``("ok", result)``."""
    try:
        async with client_from(source_ip, peer, timeout_s) as client:
            return "ok", await body(client)
    except BaseException as exc:  # refusals arrive as OSError, libp2p errors or groups of them
        if isinstance(exc, (KeyboardInterrupt, trio.Cancelled)):
            raise
        return "refused", exc


def tcp_port(peer: str) -> int:
    return int(peer.split("/tcp/", 1)[1].split("/", 1)[0])


# multistream-select's greeting: what a dialer sends first. It gets a
# connection past py-libp2p's TCP/websocket sniffing (on a shared port)
# into the security negotiation, where this peer then stalls.
MULTISTREAM_GREETING = b"\x13/multistream/1.0.0\n"


def stalling_socket(source_ip: str, port: int) -> socket.socket:
    """A TCP connection to 127.0.0.1:``port`` from ``source_ip`` that
    starts the handshake and then says nothing more."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((source_ip, 0))
    sock.connect(("127.0.0.1", port))
    sock.sendall(MULTISTREAM_GREETING)
    return sock


def is_closed_by_peer(sock: socket.socket, wait_s: float = 0.0) -> bool:
    """True when the node has closed ``sock`` (EOF or reset)."""
    sock.settimeout(wait_s or 0.001)
    try:
        while sock.recv(4096):  # the node's own greeting, if it sent one
            pass
        return True
    except (TimeoutError, BlockingIOError):
        return False
    except OSError:
        return True
