"""discv5 v5.1 wire: the specification's test vectors (devp2p
discv5-wire-test-vectors, the packets go-ethereum's v5wire tests carry),
byte for byte, through :class:`Sessions` on both sides; then two sessions
talking to each other, and what a hostile packet gets."""

from __future__ import annotations

import pytest
from coincurve import PrivateKey

from wakustore.protocols import discv5, enr

NODE_A_KEY = bytes.fromhex("eef77acb6c6a6eebc5b363a475ac583ec7eccdb42b6481424c60f59aa326547f")
NODE_B_KEY = bytes.fromhex("66fb62bfbd66b9177a138c1e5cddbe4f7c30c343e94e68df8769459cb1cde628")
NODE_A_ID = bytes.fromhex("aaaa8419e9f49d0083561b48287df592939a8d19947d8c0ef88f2a4856a69fbb")
NODE_B_ID = bytes.fromhex("bbbb9d047f0488c0b5a93c1c3f2d8bafc7c8ff337024a55434a0d0555de64db9")
ADDRESS = ("127.0.0.1", 30303)


def _hex(text: str) -> bytes:
    return bytes.fromhex("".join(text.split()))


PING_MESSAGE = _hex(
    """00000000000000000000000000000000088b3d4342774649325f313964a39e55
    ea96c005ad52be8c7560413a7008f16c9e6d2f43bbea8814a546b7409ce783d3
    4c4f53245d08dab84102ed931f66d1492acb308fa1c6715b9d139b81acbdcc"""
)
WHOAREYOU = _hex(
    """00000000000000000000000000000000088b3d434277464933a1ccc59f5967ad
    1d6035f15e528627dde75cd68292f9e6c27d6b66c8100a873fcbaed4e16b8d"""
)
PING_HANDSHAKE = _hex(
    """00000000000000000000000000000000088b3d4342774649305f313964a39e55
    ea96c005ad521d8c7560413a7008f16c9e6d2f43bbea8814a546b7409ce783d3
    4c4f53245d08da4bb252012b2cba3f4f374a90a75cff91f142fa9be3e0a5f3ef
    268ccb9065aeecfd67a999e7fdc137e062b2ec4a0eb92947f0d9a74bfbf44dfb
    a776b21301f8b65efd5796706adff216ab862a9186875f9494150c4ae06fa4d1
    f0396c93f215fa4ef524f1eadf5f0f4126b79336671cbcf7a885b1f8bd2a5d83
    9cf8"""
)
PING_HANDSHAKE_ENR = _hex(
    """00000000000000000000000000000000088b3d4342774649305f313964a39e55
    ea96c005ad539c8c7560413a7008f16c9e6d2f43bbea8814a546b7409ce783d3
    4c4f53245d08da4bb23698868350aaad22e3ab8dd034f548a1c43cd246be9856
    2fafa0a1fa86d8e7a3b95ae78cc2b988ded6a5b59eb83ad58097252188b902b2
    1481e30e5e285f19735796706adff216ab862a9186875f9494150c4ae06fa4d1
    f0396c93f215fa4ef524e0ed04c3c21e39b1868e1ca8105e585ec17315e755e6
    cfc4dd6cb7fd8e1a1f55e49b4b5eb024221482105346f3c82b15fdaae36a3bb1
    2a494683b4a3c7f2ae41306252fed84785e2bbff3b022812d0882f06978df84a
    80d443972213342d04b9048fc3b1d5fcb1df0f822152eced6da4d3f6df27e70e
    4539717307a0208cd208d65093ccab5aa596a34d7511401987662d8cf62b1394
    71"""
)
REQUEST_NONCE = bytes.fromhex("0102030405060708090a0b0c")
ID_NONCE = bytes.fromhex("0102030405060708090a0b0c0d0e0f10")
# The WHOAREYOU's masking iv and header, for its enr-seq 0 and 1.
CHALLENGE_DATA = {
    seq: bytes.fromhex(
        "000000000000000000000000000000006469736376350001010102030405060708090a0b0c0018"
        "0102030405060708090a0b0c0d0e0f10" + f"{seq:016x}"
    )
    for seq in (0, 1)
}
EPHEMERAL_KEY = bytes.fromhex("0288ef00023598499cb6c940146d050d2b1fb914198c327f76aad590bead68b6")


class Scripted:
    """A source of "random" bytes that gives what the vectors used, by size."""

    def __init__(self, *values: bytes):
        self.values = list(values)

    def __call__(self, size: int) -> bytes:
        value = self.values.pop(0)
        assert len(value) == size, (size, value.hex())
        return value


def _record_of_a_in_the_vector() -> enr.Enr:
    """A's record, as the ENR-carrying handshake vector holds it."""
    packet = discv5.decode_packet(NODE_B_ID, PING_HANDSHAKE_ENR)
    handshake = discv5.decode_handshake_authdata(packet.authdata)
    assert handshake.record is not None
    return enr.decode(handshake.record)


def test_node_ids_of_the_vector_keys():
    for key, expected in ((NODE_A_KEY, NODE_A_ID), (NODE_B_KEY, NODE_B_ID)):
        assert discv5.node_id(PrivateKey(key).public_key.format()) == expected


def test_whoareyou_vector():
    packet = discv5.decode_packet(NODE_B_ID, WHOAREYOU)
    assert (packet.flag, packet.nonce, packet.authdata) == (discv5.FLAG_WHOAREYOU, REQUEST_NONCE, ID_NONCE + bytes(8))
    assert packet.message == b"" and packet.associated_data == CHALLENGE_DATA[0]
    again, challenge = discv5.encode_packet(
        NODE_B_ID, discv5.FLAG_WHOAREYOU, REQUEST_NONCE, ID_NONCE + bytes(8), iv=bytes(16)
    )
    assert (again, challenge) == (WHOAREYOU, CHALLENGE_DATA[0])


def test_ping_message_vector_decodes_with_its_read_key():
    packet = discv5.decode_packet(NODE_B_ID, PING_MESSAGE)
    assert (packet.flag, packet.nonce, packet.authdata) == (discv5.FLAG_MESSAGE, b"\xff" * 12, NODE_A_ID)
    plaintext = discv5.decrypt(bytes(16), packet.nonce, packet.message, packet.associated_data)
    assert discv5.decode_message(plaintext) == discv5.ping(bytes.fromhex("00000001"), 2)
    # and encodes back to the same bytes
    again, _ = discv5.encode_packet(
        NODE_B_ID,
        discv5.FLAG_MESSAGE,
        b"\xff" * 12,
        NODE_A_ID,
        discv5.encrypt(bytes(16), b"\xff" * 12, plaintext, packet.associated_data),
        iv=bytes(16),
    )
    assert again == PING_MESSAGE


@pytest.mark.parametrize("vector, their_seq", [(PING_HANDSHAKE_ENR, 0), (PING_HANDSHAKE, 1)])
def test_both_sides_of_the_handshake_vectors_byte_for_byte(vector, their_seq):
    record_a = _record_of_a_in_the_vector()
    assert record_a.seq == 1 and record_a.public_key == PrivateKey(NODE_A_KEY).public_key.format()
    record_b = enr.encode(NODE_B_KEY, 1, {"ip": bytes([127, 0, 0, 1]), "udp": 30303})
    # B: A's first packet (unreadable: no session) draws the vector's WHOAREYOU.
    b = discv5.Sessions(NODE_B_KEY, lambda: record_b, discv5.PROTOCOL_ID, Scripted(ID_NONCE, bytes(16)))
    a = discv5.Sessions(
        NODE_A_KEY,
        lambda: record_a,
        discv5.PROTOCOL_ID,
        Scripted(REQUEST_NONCE, bytes(20), bytes(16), EPHEMERAL_KEY, b"\xff" * 12, bytes(16)),
    )
    first = a.send(NODE_B_ID, ADDRESS, discv5.ping(bytes.fromhex("00000001"), 1), record=record_b)
    known_a = record_a if their_seq else None
    answered = b.receive(first, ADDRESS, lambda node: known_a)
    # Its challenge data is the vector's (the packet itself is masked for A).
    challenge = discv5.decode_packet(NODE_A_ID, answered.reply, discv5.PROTOCOL_ID)
    assert challenge.associated_data == CHALLENGE_DATA[their_seq]
    # A answers the WHOAREYOU with the handshake of the vector, exactly.
    handshake = a.receive(answered.reply, ADDRESS, lambda node: None)
    assert handshake.reply == vector
    # B reads it: the record (carried or known), the PING, a session both ways.
    got = b.receive(vector, ADDRESS, lambda node: known_a)
    assert got.node_id == NODE_A_ID and got.record == record_a
    assert got.message == discv5.ping(bytes.fromhex("00000001"), 1)
    assert b.has_session(NODE_A_ID, ADDRESS) and a.has_session(NODE_B_ID, ADDRESS)


def test_two_nodes_talk_after_a_handshake_under_the_waku_protocol_id():
    key_a, key_b = PrivateKey().secret, PrivateKey().secret
    record_a = enr.encode(key_a, 3, {"ip": bytes([127, 0, 0, 1]), "udp": 9000})
    record_b = enr.encode(key_b, 5, {"ip": bytes([127, 0, 0, 1]), "udp": 9001})
    a = discv5.Sessions(key_a, lambda: record_a)
    b = discv5.Sessions(key_b, lambda: record_b)
    id_b = discv5.node_id(record_b.public_key)
    addr_a, addr_b = ("127.0.0.1", 9000), ("127.0.0.1", 9001)
    whoareyou = b.receive(a.send(id_b, addr_b, discv5.findnode(b"\x01", [256]), record_b), addr_a, lambda n: None)
    handshake = a.receive(whoareyou.reply, addr_b, lambda n: None)
    got = b.receive(handshake.reply, addr_a, lambda n: None)
    assert got.message == discv5.findnode(b"\x01", [256]) and got.record == record_a
    # Then plain messages, both ways, under the session.
    answers = discv5.nodes_messages(b"\x01", [record_b.raw])
    reply = a.receive(b.send(got.node_id, addr_a, answers[0]), addr_b, lambda n: None)
    assert reply.message is not None and reply.message.fields == (1, [record_b.raw])
    again = b.receive(a.send(id_b, addr_b, discv5.ping(b"\x02", 3)), addr_a, lambda n: None)
    assert again.message == discv5.ping(b"\x02", 3)
    # A stock discv5 node (protocol id "discv5") does not talk to it.
    stock = discv5.Sessions(key_a, lambda: record_a, discv5.PROTOCOL_ID)
    with pytest.raises(discv5.Discv5Error, match="protocol id"):
        b.receive(stock.send(id_b, addr_b, discv5.ping(b"\x03", 3), record_b), addr_a, lambda n: None)


def test_message_vectors_of_the_specification():
    assert discv5.encode_message(discv5.ping(b"\x01", 1)) == bytes.fromhex("01c20101")
    assert discv5.encode_message(discv5.pong(b"\x01", 1, "127.0.0.1", 5000)) == bytes.fromhex(
        "02ca0101847f000001821388"
    )
    # v5.1's FINDNODE carries a list of distances (the v5.0 vector, 03c401820100, one).
    assert discv5.encode_message(discv5.findnode(b"\x01", [256])) == bytes.fromhex("03c501c3820100")
    assert discv5.encode_message(discv5.nodes(b"\x01", 1, [])) == bytes.fromhex("04c30101c0")
    for raw in ("01c20101", "02ca0101847f000001821388", "03c501c3820100", "04c30101c0"):
        assert discv5.encode_message(discv5.decode_message(bytes.fromhex(raw))) == bytes.fromhex(raw)


def test_nodes_answers_stay_under_the_packet_size():
    key = PrivateKey().secret
    big = enr.encode(key, 1, {"ip": bytes(4), "udp": 1, "x": b"y" * 160})
    assert len(big.raw) <= enr.MAX_RECORD_SIZE
    messages = discv5.nodes_messages(b"\x07", [big.raw] * 20)
    assert len(messages) == 6 and all(m.fields[0] == 6 for m in messages)
    assert sum(len(m.fields[1]) for m in messages) == discv5.MAX_NODES
    record = enr.encode(PrivateKey().secret, 1, {"ip": bytes(4), "udp": 1})
    sessions = discv5.Sessions(key, lambda: record)
    id_b = discv5.node_id(record.public_key)
    for message in messages:
        assert len(sessions.send(id_b, ADDRESS, message, record)) <= discv5.MAX_PACKET_SIZE


@pytest.mark.parametrize(
    "data, reason",
    [
        (b"\x00" * 62, "outside"),
        (b"\x00" * 1281, "outside"),
        (bytes(16) + b"\x01" * 60, "protocol id"),
        (PING_MESSAGE[:-20] + bytes(20), None),  # a tampered message: a WHOAREYOU, never a crash
    ],
)
def test_hostile_packets_are_dropped_or_challenged(data, reason):
    record = enr.encode(NODE_B_KEY, 1, {"ip": bytes(4), "udp": 1})
    b = discv5.Sessions(NODE_B_KEY, lambda: record, discv5.PROTOCOL_ID)
    if reason is None:
        assert b.receive(data, ADDRESS, lambda n: None).reply is not None
        return
    with pytest.raises(discv5.Discv5Error, match=reason):
        b.receive(data, ADDRESS, lambda n: None)


@pytest.mark.parametrize(
    "raw",
    [b"", b"\x01", b"\x01\xc0", b"\x03\xc3\x01\xc1\x82", b"\x03" + bytes.fromhex("c5 01 c3 82 0101"), b"\x09\xc20101"],
)
def test_malformed_messages_raise_discv5_error(raw):
    with pytest.raises(discv5.Discv5Error):
        discv5.decode_message(raw)


def test_handshake_without_our_challenge_or_with_a_forged_signature_is_refused():
    record_a = _record_of_a_in_the_vector()
    record_b = enr.encode(NODE_B_KEY, 1, {"ip": bytes(4), "udp": 1})
    b = discv5.Sessions(NODE_B_KEY, lambda: record_b, discv5.PROTOCOL_ID)
    with pytest.raises(discv5.Discv5Error, match="without a WHOAREYOU"):
        b.receive(PING_HANDSHAKE_ENR, ADDRESS, lambda n: None)
    # A challenge with another id-nonce: the signature in the packet does not match it.
    b = discv5.Sessions(NODE_B_KEY, lambda: record_b, discv5.PROTOCOL_ID, Scripted(b"\x09" * 16, bytes(16)))
    b.receive(PING_MESSAGE, ADDRESS, lambda n: record_a)
    with pytest.raises(discv5.Discv5Error, match="signature"):
        b.receive(PING_HANDSHAKE_ENR, ADDRESS, lambda n: None)
