"""The hostile load of ``bench wire --hostile``: a process of its own that,
while the well-behaved clients run, plays several remote hosts (loopback
addresses 127.0.0.2 and up, and 127.0.0.130 and up for the stalled
handshakes; all of 127.0.0.0/8 reaches this machine) each:

- dialing with a fresh key again and again, more connections at once than
  the node's per-address cap, each sending a burst of Store queries (a
  key-rotating query flood);
- hoarding request streams it never writes on the connections it holds;
- opening TCP connections that start the handshake and then stall.

It stops when its stop file appears and reports what happened to it.
"""

from __future__ import annotations

import pickle
import socket
import sys
import time
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, cast

import trio

if TYPE_CHECKING:
    from libp2p.network.swarm import Swarm
    from libp2p.transport.tcp.tcp import TCP

# What one hostile host does at once: dialers (past the node's default
# per-address cap of 2), queries per connection, streams hoarded per
# connection, stalled handshakes.
DIALERS_PER_HOST = 6
QUERIES_PER_CONNECTION = 5
HOARDED_STREAMS = 12
STALLED_SOCKETS_PER_HOST = 2
STOP_POLL_S = 0.2
# multistream-select's greeting: gets a connection into the handshake.
MULTISTREAM_GREETING = b"\x13/multistream/1.0.0\n"


@asynccontextmanager
async def connect_from(source_ip: str, peer: str, timeout_s: float = 10.0):
    """A StoreClient with a fresh key whose TCP connection leaves from ``source_ip``."""
    from wakustore.clients.store import StoreClient, parse_peer
    from wakustore.transport.host import new_host, stop_auto_dialing

    info = parse_peer(peer)
    host = new_host()
    async with host.run(listen_addrs=[]):
        await stop_auto_dialing(host)
        swarm = cast("Swarm", host.get_network())  # what new_host builds
        # The node's TCP address: the TCP transport (None for an address no transport dials).
        transport = cast("TCP", swarm.transport_manager.transport_for_dialing(info.addrs[0]))
        with trio.fail_after(timeout_s):
            raw = await transport.dial_with_source(info.addrs[0], (source_ip, 0))
            await swarm.upgrade_outbound_raw_conn(raw, info.peer_id)
        try:
            yield StoreClient(host, info.peer_id, timeout_s)
        finally:
            # py-libp2p 0.8.1 leaves the socket open when its host stops.
            with trio.move_on_after(5):
                await swarm.close_peer(info.peer_id)


def client_main() -> None:
    """Reads (peer, hosts, query, stop path) pickled on stdin; writes the counts pickled on stdout."""
    peer, hosts, query, stop_path = pickle.loads(sys.stdin.buffer.read())
    sys.stdout.buffer.write(pickle.dumps(trio.run(_hostile, peer, hosts, query, Path(stop_path))))


async def _hostile(peer: str, hosts: int, query, stop_path: Path) -> dict:
    from libp2p.custom_types import TProtocol

    from wakustore.protocols import store_v3

    counts: dict[str, float] = {
        "connections": 0,
        "refused": 0,
        "queries": 0,
        "answered_200": 0,
        "answered_429": 0,
        "other": 0,
        "stalled_sockets": 0,
    }
    port = int(peer.split("/tcp/", 1)[1].split("/", 1)[0])
    sockets: list[socket.socket] = []

    async def dialer(source: str) -> None:
        while True:
            try:
                async with connect_from(source, peer) as client:
                    counts["connections"] += 1
                    hoarded = []
                    for _ in range(HOARDED_STREAMS):
                        try:
                            hoarded.append(
                                await client.host.new_stream(client.peer_id, [TProtocol(store_v3.PROTOCOL_ID)])
                            )
                        except Exception:
                            break
                    for _ in range(QUERIES_PER_CONNECTION):
                        counts["queries"] += 1
                        status = (await client.query(query)).status_code
                        key = {200: "answered_200", 429: "answered_429"}.get(status, "other")
                        counts[key] += 1
            except Exception:
                counts["refused"] += 1
                await trio.sleep(0.05)

    async def staller(source: str) -> None:
        while True:
            for sock in sockets[:]:
                try:
                    if sock.recv(4096, socket.MSG_DONTWAIT) == b"":
                        raise OSError
                except BlockingIOError:
                    continue
                except OSError:
                    sock.close()
                    sockets.remove(sock)
            while sum(1 for s in sockets if s.getsockname()[0] == source) < STALLED_SOCKETS_PER_HOST:
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sock.bind((source, 0))
                try:
                    sock.connect(("127.0.0.1", port))
                    sock.sendall(MULTISTREAM_GREETING)
                except OSError:
                    sock.close()
                    break
                sockets.append(sock)
                counts["stalled_sockets"] += 1
            await trio.sleep(0.5)

    started = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for h in range(hosts):
            source = f"127.0.0.{h + 2}"
            for _ in range(DIALERS_PER_HOST):
                nursery.start_soon(dialer, source)
            # Stalled handshakes count against their address's cap: they
            # come from addresses of their own, or they would lock the
            # dialers out.
            nursery.start_soon(staller, f"127.0.0.{h + 130}")
        while not stop_path.exists():
            await trio.sleep(STOP_POLL_S)
        nursery.cancel_scope.cancel()
    for sock in sockets:
        sock.close()
    counts["seconds"] = round(time.perf_counter() - started, 2)
    return counts
