"""Peer addresses: DNS names resolved before a dial (libp2p and BitTorrent)."""

import pytest


def test_dns_names_resolve_to_dialable_addresses():
    """py-libp2p dials IP addresses only, libtorrent too: names are resolved first."""
    import trio

    from wakustore.transport.peers import PeerAddressError, parse_peer, resolved
    from wakustore.transport.torrent import _endpoints

    peer_id = "16Uiu2HAmPLe7Mzm8TsYUubgCAW1aJoeFScxrLj8ppHFivPo97bUZ"
    info = parse_peer(f"/dns4/localhost/tcp/60000/p2p/{peer_id}")
    addrs = [str(a) for a in trio.run(resolved, info).addrs]
    assert addrs == ["/ip4/127.0.0.1/tcp/60000"]
    plain = parse_peer(f"/ip4/10.1.2.3/tcp/1/ws/p2p/{peer_id}")
    assert [str(a) for a in trio.run(resolved, plain).addrs] == ["/ip4/10.1.2.3/tcp/1/ws"]
    with pytest.raises(PeerAddressError, match="cannot resolve no-such-host.invalid"):
        trio.run(resolved, parse_peer(f"/dns4/no-such-host.invalid/tcp/1/p2p/{peer_id}"))
    assert _endpoints(("localhost", 5)) == [("127.0.0.1", 5)] and _endpoints(("::1", 5)) == [("::1", 5)]
    assert _endpoints(("no-such-host.invalid", 5)) == []
