"""Ethereum Node Records with Waku's fields (protocols/enr.py): the
EIP-778 example record byte for byte, a status.prod store node's record,
the Waku fields both ways, and every malformed or unsigned record refused."""

from __future__ import annotations

import base64

import pytest

from wakustore.protocols import enr
from wakustore.protocols.crypto import keccak256, sign_compact
from wakustore.protocols.enr import Capability, EnrError
from wakustore.protocols.waku_v1 import rlp_encode

# EIP-778's example: its private key, and the record it signs with seq 1,
# ip 127.0.0.1 and udp 30303.
EIP778_KEY = bytes.fromhex("b71c71a67e1177ad4e901695e1b4b9ee17ae16c6668d313eac2f96dbcda3f291")
EIP778_RECORD = (
    "enr:-IS4QHCYrYZbAKWCBRlAy5zzaDZXJBGkcnh4MHcBFZntXNFrdvJjX04jRzjzCBOonrkTfj499SZuOh8R33Ls8RRcy5wBgmlkgnY0gmlwhH8AAAGJc2VjcDI1"
    "NmsxoQPKY0yuDUmstAHYpMa2_oxVtw0RW_QAdpzBQA8yWM0xOIN1ZHCCdl8"
)
# status.prod's store-01.do-ams3 (status-go's fleet file; wire-facts).
STATUS_STORE = (
    "enr:-QEMuEAs8JmmyUI3b9v_ADqYtELHUYAsAMS21lA2BMtrzF86tVmyy9cCrhmzfHGHx_g3nybn7jIRybzXTGNj3C2KzrriAYJpZIJ2NIJpcISf3_Jeim11bH"
    "RpYWRkcnO4XAArNiZzdG9yZS0wMS5kby1hbXMzLnN0YXR1cy5wcm9kLnN0YXR1cy5pbQZ2XwAtNiZzdG9yZS0wMS5kby1hbXMzLnN0YXR1cy5wcm9kLnN0YXR1cy"
    "5pbQYBu94DgnJzjQAQBQABACAAQACAAQCJc2VjcDI1NmsxoQLfoaQH3oSYW59yxEBfeAZbltmUnC4BzYkHqer2VQMTyoN0Y3CCdl-DdWRwgiMohXdha3UyAw"
)
KEY = bytes(range(1, 33))


def test_the_eip778_example_is_decoded_and_signed_again_byte_for_byte():
    record = enr.decode(EIP778_RECORD)
    assert (record.seq, record.ip, record.udp, record.tcp) == (1, "127.0.0.1", 30303, None)
    assert record.public_key.hex() == "03ca634cae0d49acb401d8a4c6b6fe8c55b70d115bf400769cc1400f3258cd3138"
    again = enr.encode(EIP778_KEY, 1, {"ip": bytes([127, 0, 0, 1]), "udp": 30303})
    assert again.text == EIP778_RECORD and again.raw == record.raw


def test_a_status_prod_store_record_reads_as_js_waku_reads_it():
    record = enr.decode(STATUS_STORE)
    assert record.peer_id == "16Uiu2HAmAUdrQ3uwzuE4Gy4D56hX6uLKEeerJAnhKEHZ3DxF1EfT"
    assert record.capabilities == Capability.RELAY | Capability.STORE
    assert record.relay_shards == enr.RelayShards(16, (1, 32, 64, 128, 256))
    assert (record.ip, record.tcp, record.udp) == ("159.223.242.94", 30303, 9000)
    assert record.multiaddrs == [
        "/dns4/store-01.do-ams3.status.prod.status.im/tcp/30303",
        "/dns4/store-01.do-ams3.status.prod.status.im/tcp/443/wss",
    ]
    assert record.dialable()[0] == "/ip4/159.223.242.94/tcp/30303/p2p/" + record.peer_id
    described = record.describe()
    assert described["waku2"] == ["relay", "store"] and described["shards"] == [1, 32, 64, 128, 256]


def test_the_peer_id_is_libp2p_s():
    from libp2p.crypto.secp256k1 import create_new_key_pair
    from libp2p.peer.id import ID

    pair = create_new_key_pair(KEY)
    record = enr.waku_record(KEY, 1, capabilities=Capability.STORE)
    assert record.peer_id == ID.from_pubkey(pair.public_key).to_base58()


def test_a_waku_record_round_trips_every_field():
    record = enr.waku_record(
        KEY,
        7,
        capabilities=Capability.RELAY | Capability.STORE | Capability.LIGHTPUSH | Capability.SYNC,
        cluster=16,
        shards=[32, 1, 64],
        ip="10.0.0.5",
        tcp=60000,
        udp=9000,
        ip6="2001:db8::1",
        tcp6=60001,
        multiaddrs=["/ip4/10.0.0.5/tcp/8000/ws", "/dns4/store.example.org/tcp/443/wss/p2p/16Uiu2HAkx"],
    )
    back = enr.decode(record.text)
    assert back == record and back.seq == 7
    assert back.capabilities == Capability.RELAY | Capability.STORE | Capability.LIGHTPUSH | Capability.SYNC
    assert back.relay_shards == enr.RelayShards(16, (1, 32, 64))
    assert (back.ip, back.tcp, back.udp, back.ip6, back.tcp6) == ("10.0.0.5", 60000, 9000, "2001:db8::1", 60001)
    # /p2p is stripped from what the record carries.
    assert back.multiaddrs == ["/ip4/10.0.0.5/tcp/8000/ws", "/dns4/store.example.org/tcp/443/wss"]
    assert back.dialable()[:2] == [
        f"/ip4/10.0.0.5/tcp/60000/p2p/{back.peer_id}",
        f"/ip6/2001:db8::1/tcp/60001/p2p/{back.peer_id}",
    ]


def test_64_shards_and_more_go_in_the_bit_vector():
    few = enr.waku_record(KEY, 1, capabilities=Capability.RELAY, cluster=1, shards=range(63))
    many = enr.waku_record(KEY, 1, capabilities=Capability.RELAY, cluster=1, shards=[*range(64), 1023])
    assert "rs" in few.pairs and "rsv" not in few.pairs
    assert "rsv" in many.pairs and "rs" not in many.pairs
    assert many.relay_shards == enr.RelayShards(1, (*range(64), 1023))
    assert enr.decode_shard_vector(enr.encode_shard_vector(5, [0, 7, 8, 1023])).shards == (0, 7, 8, 1023)
    with pytest.raises(EnrError):
        enr.encode_shard_vector(1, [1024])


def _signed(pairs: list[bytes], seq: bytes = b"\x01", key: bytes = KEY) -> bytes:
    signature = sign_compact(key, keccak256(rlp_encode([seq, *pairs])))
    return rlp_encode([signature, seq, *pairs])


def _text(raw: bytes) -> str:
    return "enr:" + base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _public(key: bytes = KEY) -> bytes:
    return enr.encode(key, 1, {}).public_key


@pytest.mark.parametrize(
    "record, reason",
    [
        ("nope", "starts with enr:"),
        ("enr:!!!!", "base64"),
        ("enr:" + "A" * 500, "too long"),
        (_text(b"\x01\x02"), "RLP"),
        (_text(rlp_encode([b"x"])), "signature, seq"),
        (_text(_signed([b"id", b"v4", b"secp256k1", _public()])[:-1]), "RLP"),
        (_text(_signed([b"secp256k1", _public(), b"id", b"v4"])), "sorted"),
        (_text(_signed([b"id", b"v4", b"id", b"v4", b"secp256k1", _public()])), "sorted"),
        (_text(_signed([b"id", b"v5", b"secp256k1", _public()])), "not v4"),
        (_text(_signed([b"id", b"v4"])), "33-byte"),
        (_text(_signed([b"id", b"v4", b"secp256k1", _public(bytes(range(2, 34)))])), "signature"),
        (_text(_signed([b"id", b"v4", b"secp256k1", _public()], seq=b"\x00\x01")), "minimal"),
        (_signed([b"id", b"v4", b"secp256k1", _public(), b"z", b"x" * 250]), "at most 300"),
    ],
)
def test_malformed_or_unsigned_records_are_refused_with_a_reason(record, reason):
    with pytest.raises(EnrError, match=reason):
        enr.decode(record)


def test_a_changed_byte_breaks_the_signature():
    raw = bytearray(enr.decode(STATUS_STORE).raw)
    raw[-3] ^= 0x01  # inside the udp port's value
    with pytest.raises(EnrError, match="signature"):
        enr.decode(bytes(raw))


def test_bad_waku_fields_are_refused_when_read():
    record = enr.encode(KEY, 1, {"rs": b"\x00\x10\x02\x00\x01", "waku2": b"\x01\x02", "multiaddrs": b"\x00\x09abc"})
    with pytest.raises(EnrError, match="count"):
        _ = record.relay_shards
    with pytest.raises(EnrError, match="waku2"):
        _ = record.capabilities
    with pytest.raises(EnrError, match="overruns"):
        _ = record.multiaddrs


def test_a_record_too_large_to_sign_says_so():
    with pytest.raises(EnrError, match="at most 300"):
        enr.waku_record(
            KEY,
            1,
            capabilities=Capability.STORE,
            multiaddrs=[f"/dns4/{'n' * 60}{i}.example.org/tcp/443/wss" for i in range(5)],
        )
