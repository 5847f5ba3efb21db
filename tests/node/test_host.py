"""Node identity, listen addresses and the port check (no engine, no network)."""

import json
import socket
import stat

import pytest

from wakustore.node.config import NodeConfig
from wakustore.node.host import (
    NODE_KEY_FILE,
    HostError,
    HostInfo,
    check_ports_free,
    dialable_addrs,
    interface_addresses,
    listen_addrs,
    load_or_create_key,
    write_node_info,
)


def peer_id_of(key_pair):
    from libp2p.peer.id import ID

    return ID.from_pubkey(key_pair.public_key).to_base58()


def test_node_key_is_created_once_with_mode_600_and_reused(tmp_path):
    first = load_or_create_key(tmp_path)
    path = tmp_path / NODE_KEY_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    text = path.read_text().strip()
    assert len(text) == 64 and bytes.fromhex(text) == first.private_key.to_bytes()
    again = load_or_create_key(tmp_path)
    assert peer_id_of(again) == peer_id_of(first)


@pytest.mark.parametrize("content", ["not hex", "00" * 31, "00" * 32, "ff" * 32])
def test_unusable_node_key_is_refused(tmp_path, content):
    (tmp_path / NODE_KEY_FILE).write_text(content)
    with pytest.raises(HostError):
        load_or_create_key(tmp_path)


# The other listeners on any port: their defaults (metrics 8008, mailserver
# 30303) may be taken on this machine by a running node.
OTHER_PORTS_ANY = {"metrics_port": 0, "mailserver_port": 0}


def test_taken_port_is_reported_before_anything_starts():
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        config = NodeConfig(listen_host="127.0.0.1", tcp_port=0, ws_port=port, **OTHER_PORTS_ANY)
        with pytest.raises(HostError, match=f"ws_port {port} .* already in use"):
            check_ports_free(config)
    check_ports_free(config)  # free again once the holder is closed
    check_ports_free(NodeConfig(listen_host="127.0.0.1", tcp_port=0, ws_port=0, **OTHER_PORTS_ANY))


def test_listen_addresses_are_tcp_and_websocket():
    config = NodeConfig(listen_host="127.0.0.1", tcp_port=60001, ws_port=8001)
    assert [str(a) for a in listen_addrs(config)] == ["/ip4/127.0.0.1/tcp/60001", "/ip4/127.0.0.1/tcp/8001/ws"]
    with pytest.raises(HostError):
        listen_addrs(NodeConfig(tcp_port=9000, ws_port=9000))


def test_node_info_lists_peer_id_and_multiaddrs(tmp_path):
    info = HostInfo("16Uiu2HAm", ["/ip4/127.0.0.1/tcp/1/p2p/16Uiu2HAm"])
    path = write_node_info(tmp_path, info, pid=5)
    assert json.loads(path.read_text()) == {
        "peer_id": "16Uiu2HAm",
        "multiaddrs": ["/ip4/127.0.0.1/tcp/1/p2p/16Uiu2HAm"],
        "pid": 5,
    }


PEER = "16Uiu2HAmPeer"


def fake_interfaces(family):
    return {"ip4": ["127.0.0.1", "192.0.2.7"], "ip6": ["::1", "2001:db8::7"]}[family]


def test_unspecified_listen_address_becomes_one_address_per_interface():
    addrs = dialable_addrs(["/ip4/0.0.0.0/tcp/60000", "/ip4/0.0.0.0/tcp/8000/ws"], PEER, interfaces=fake_interfaces)
    assert addrs == [
        f"/ip4/127.0.0.1/tcp/60000/p2p/{PEER}",
        f"/ip4/192.0.2.7/tcp/60000/p2p/{PEER}",
        f"/ip4/127.0.0.1/tcp/8000/ws/p2p/{PEER}",
        f"/ip4/192.0.2.7/tcp/8000/ws/p2p/{PEER}",
    ]
    assert dialable_addrs(["/ip6/::/tcp/1"], PEER, interfaces=fake_interfaces) == [
        f"/ip6/::1/tcp/1/p2p/{PEER}",
        f"/ip6/2001:db8::7/tcp/1/p2p/{PEER}",
    ]


def test_a_specific_listen_address_is_kept_and_announced_ones_follow():
    addrs = dialable_addrs(
        ["/ip4/127.0.0.1/tcp/1"],
        PEER,
        ext_multiaddrs=[
            "/dns4/node.example.org/tcp/443/wss",
            f"/ip4/203.0.113.5/tcp/60000/p2p/{PEER}",
            "/ip4/127.0.0.1/tcp/1",
        ],
        interfaces=fake_interfaces,
    )
    assert addrs == [
        f"/ip4/127.0.0.1/tcp/1/p2p/{PEER}",
        f"/dns4/node.example.org/tcp/443/wss/p2p/{PEER}",
        f"/ip4/203.0.113.5/tcp/60000/p2p/{PEER}",
    ]


def test_interface_addresses_start_with_loopback():
    ip4 = interface_addresses("ip4")
    assert ip4[0] == "127.0.0.1" and "0.0.0.0" not in ip4
