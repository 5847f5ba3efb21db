"""The node's own record (node/enr.py): what it says, and its sequence
number kept in the data dir and raised when the record changes."""

from __future__ import annotations

import json

from wakustore.node.config import NodeConfig
from wakustore.node.enr import ENR_STATE_FILE, node_capabilities, node_record
from wakustore.protocols import enr
from wakustore.protocols.enr import Capability

KEY = bytes(range(1, 33))
PEER = enr.peer_id_of(enr.encode(KEY, 1, {}).public_key)


def _addrs(*plain: str) -> list[str]:
    return [f"{a}/p2p/{PEER}" for a in plain]


def _config(tmp_path, **kw) -> NodeConfig:
    return NodeConfig(data_dir=tmp_path, cluster_id=16, shards=[32, 1], **kw).validate()


def test_the_record_names_the_node_its_shards_and_where_to_dial_it(tmp_path):
    config = _config(tmp_path, ext_multiaddrs=["/dns4/store.example.org/tcp/443/wss"])
    addrs = _addrs("/ip4/127.0.0.1/tcp/60000", "/ip4/192.0.2.7/tcp/60000", "/ip4/192.0.2.7/tcp/8000/ws")
    record = enr.decode(
        node_record(config, KEY, addrs + _addrs("/dns4/store.example.org/tcp/443/wss"), relay=True).text
    )
    assert record.peer_id == PEER
    assert record.capabilities == Capability.RELAY | Capability.STORE | Capability.LIGHTPUSH | Capability.SYNC
    assert record.relay_shards == enr.RelayShards(16, (1, 32))
    # The first address that is not loopback; the rest (websockets, DNS)
    # in multiaddrs, loopback left out.
    assert (record.ip, record.tcp) == ("192.0.2.7", 60000)
    assert record.multiaddrs == ["/dns4/store.example.org/tcp/443/wss", "/ip4/192.0.2.7/tcp/8000/ws"]
    assert node_capabilities(relay=False) == Capability.STORE | Capability.LIGHTPUSH | Capability.SYNC


def test_a_loopback_only_node_still_says_where_it_listens(tmp_path):
    record = node_record(_config(tmp_path), KEY, _addrs("/ip4/127.0.0.1/tcp/60000"), relay=False)
    assert (record.ip, record.tcp) == ("127.0.0.1", 60000)
    assert Capability.RELAY not in record.capabilities


def test_the_sequence_number_is_kept_and_raised_when_the_record_changes(tmp_path):
    addrs = _addrs("/ip4/192.0.2.7/tcp/60000")
    first = node_record(_config(tmp_path), KEY, addrs, relay=True)
    again = node_record(_config(tmp_path), KEY, addrs, relay=True)
    moved = node_record(_config(tmp_path), KEY, _addrs("/ip4/192.0.2.7/tcp/60001"), relay=True)
    fewer = node_record(
        NodeConfig(data_dir=tmp_path, cluster_id=16, shards=[1]).validate(),
        KEY,
        _addrs("/ip4/192.0.2.7/tcp/60001"),
        relay=True,
    )
    assert [r.seq for r in (first, again, moved, fewer)] == [1, 1, 2, 3]
    assert json.loads((tmp_path / ENR_STATE_FILE).read_text())["seq"] == 3
    (tmp_path / ENR_STATE_FILE).write_text("{torn")
    assert node_record(_config(tmp_path), KEY, addrs, relay=True).seq == 1


def test_multiaddrs_that_do_not_fit_are_left_out_not_fatal(tmp_path, caplog):
    names = [f"/dns4/{'n' * 50}{i}.example.org/tcp/443/wss" for i in range(6)]
    config = _config(tmp_path, ext_multiaddrs=names)
    record = node_record(config, KEY, _addrs("/ip4/192.0.2.7/tcp/60000"), relay=True)
    assert len(record.raw) <= enr.MAX_RECORD_SIZE
    assert 0 < len(record.multiaddrs) < len(names)
    assert "left out of the record" in caplog.text
