"""StoreClient's own costs: `wakustore push` and `query` are one connection
and one request, so the connection is made as soon as the network allows."""

from __future__ import annotations

import multiaddr
import trio
from libp2p.network import swarm

from wakustore.clients.store import StoreClient
from wakustore.transport.host import new_host

# The dial delay the test stretches: a client that waited it out would
# miss the bound below by far, on any machine.
STRETCHED_DELAY_S = 120.0
BOUND_S = 60.0


def test_connect_ends_with_the_connection_not_a_dial_delay(monkeypatch):
    """py-libp2p's dial waits out its happy-eyeballs head start (250 ms)
    after the last address's dial too, unless the peer's connection cap is
    reached; the client's cap is one connection, so its connect ends as
    soon as the connection is made. The head start is stretched to two
    minutes here: a connect that waited for it would not end in one."""
    monkeypatch.setattr(swarm, "_HAPPY_EYEBALLS_DELAY", STRETCHED_DELAY_S)

    async def main() -> None:
        addr = multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")
        host = new_host(listen_addrs=[addr])
        async with host.run(listen_addrs=[addr]):
            target = f"{host.get_addrs()[0]}"
            if "/p2p/" not in target:
                target += f"/p2p/{host.get_id()}"
            with trio.fail_after(BOUND_S):
                async with StoreClient.connect(target, timeout_s=BOUND_S) as client:
                    assert len(client.host.get_network().get_connections(client.peer_id)) == 1

    trio.run(main)
