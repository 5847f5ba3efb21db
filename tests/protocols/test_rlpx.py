"""RLPx: ECIES, the handshake, frames and the devp2p base protocol, in memory."""

from __future__ import annotations

import os

import coincurve
import cramjam
import pytest
import rlp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from wakustore.protocols import ecies, rlpx
from wakustore.protocols.crypto import keccak256
from wakustore.protocols.errors import ProtocolError, RLPxError


def unhex(text: str) -> bytes:
    return bytes.fromhex("".join(text.split()))


# --- known-answer vectors ----------------------------------------------------
# EIP-8 "Test Vectors / RLPx Handshake" (EIPS/eip-8.md in ethereum/EIPs); the
# EIP-8 ones are also go-ethereum's eip8HandshakeAuthTests and
# eip8HandshakeRespTests with the secrets of TestHandshakeForwardCompatibility
# (p2p/rlpx/rlpx_test.go). Node A initiates, node B receives.

KEY_A = unhex("49a7b37aa6f6645917e7b807e9d1c00d4fa71f18343b0d4122a4d2df64dd6fee")
KEY_B = unhex("b71c71a67e1177ad4e901695e1b4b9ee17ae16c6668d313eac2f96dbcda3f291")
EPHEMERAL_A = unhex("869d6ecf5211f1cc60418a13b9d870b22959d0c16f02bec714c960dd2298a32d")
EPHEMERAL_B = unhex("e238eb8e04fee6511ab04c6dd3c89ce097b11f25d584863ac2b6d5b35b1847e4")
NONCE_A = unhex("7e968bba13b6c50e2c4cd7f241cc0d64d1ac25c7f5952df231ac6a2bda8ee5d6")
NONCE_B = unhex("559aead08264d5795d3909718cdd05abd49572e84fe55590eef31a88a08fdffd")
# The signature inside Auth2 (go-ethereum's authSignature).
AUTH_SIGNATURE = unhex("""
299ca6acfd35e3d72d8ba3d1e2b60b5561d5af5218eb5bc182045769eb422691
0a301acae3b369fffc4a4899d6b02531e89fd4fe36a2cf0d93607ba470b50f7800
""")
WANT_AES = unhex("80e8632c05fed6fc2a13b0f8d31a3cf645366239170ea067065aba8e28bac487")
WANT_MAC = unhex("2ea74ec5dae199227dff1af715362700e989d889d7a493cb0639691efb8e5f98")
WANT_FOO_INGRESS = unhex("0c7ec6340062cc46f5e9f1e3cf86f8c8c403c5a0964f5df0ebd34a75ddc86db5")

# (Auth1) pre-EIP-8 format.
AUTH_1 = unhex("""
048ca79ad18e4b0659fab4853fe5bc58eb83992980f4c9cc147d2aa31532efd29a3d3dc6a3d89eaf
913150cfc777ce0ce4af2758bf4810235f6e6ceccfee1acc6b22c005e9e3a49d6448610a58e98744
ba3ac0399e82692d67c1f58849050b3024e21a52c9d3b01d871ff5f210817912773e610443a9ef14
2e91cdba0bd77b5fdf0769b05671fc35f83d83e4d3b0b000c6b2a1b1bba89e0fc51bf4e460df3105
c444f14be226458940d6061c296350937ffd5e3acaceeaaefd3c6f74be8e23e0f45163cc7ebd7622
0f0128410fd05250273156d548a414444ae2f7dea4dfca2d43c057adb701a715bf59f6fb66b2d1d2
0f2c703f851cbf5ac47396d9ca65b6260bd141ac4d53e2de585a73d1750780db4c9ee4cd4d225173
a4592ee77e2bd94d0be3691f3b406f9bba9b591fc63facc016bfa8
""")
# (Auth2) EIP-8, version 4, no additional list elements.
AUTH_2 = unhex("""
01b304ab7578555167be8154d5cc456f567d5ba302662433674222360f08d5f1534499d3678b513b
0fca474f3a514b18e75683032eb63fccb16c156dc6eb2c0b1593f0d84ac74f6e475f1b8d56116b84
9634a8c458705bf83a626ea0384d4d7341aae591fae42ce6bd5c850bfe0b999a694a49bbbaf3ef6c
da61110601d3b4c02ab6c30437257a6e0117792631a4b47c1d52fc0f8f89caadeb7d02770bf999cc
147d2df3b62e1ffb2c9d8c125a3984865356266bca11ce7d3a688663a51d82defaa8aad69da39ab6
d5470e81ec5f2a7a47fb865ff7cca21516f9299a07b1bc63ba56c7a1a892112841ca44b6e0034dee
70c9adabc15d76a54f443593fafdc3b27af8059703f88928e199cb122362a4b35f62386da7caad09
c001edaeb5f8a06d2b26fb6cb93c52a9fca51853b68193916982358fe1e5369e249875bb8d0d0ec3
6f917bc5e1eafd5896d46bd61ff23f1a863a8a8dcd54c7b109b771c8e61ec9c8908c733c0263440e
2aa067241aaa433f0bb053c7b31a838504b148f570c0ad62837129e547678c5190341e4f1693956c
3bf7678318e2d5b5340c9e488eefea198576344afbdf66db5f51204a6961a63ce072c8926c
""")
# (Auth3) EIP-8, version 56, three additional list elements.
AUTH_3 = unhex("""
01b8044c6c312173685d1edd268aa95e1d495474c6959bcdd10067ba4c9013df9e40ff45f5bfd6f7
2471f93a91b493f8e00abc4b80f682973de715d77ba3a005a242eb859f9a211d93a347fa64b597bf
280a6b88e26299cf263b01b8dfdb712278464fd1c25840b995e84d367d743f66c0e54a586725b7bb
f12acca27170ae3283c1073adda4b6d79f27656993aefccf16e0d0409fe07db2dc398a1b7e8ee93b
cd181485fd332f381d6a050fba4c7641a5112ac1b0b61168d20f01b479e19adf7fdbfa0905f63352
bfc7e23cf3357657455119d879c78d3cf8c8c06375f3f7d4861aa02a122467e069acaf513025ff19
6641f6d2810ce493f51bee9c966b15c5043505350392b57645385a18c78f14669cc4d960446c1757
1b7c5d725021babbcd786957f3d17089c084907bda22c2b2675b4378b114c601d858802a55345a15
116bc61da4193996187ed70d16730e9ae6b3bb8787ebcaea1871d850997ddc08b4f4ea668fbf3740
7ac044b55be0908ecb94d4ed172ece66fd31bfdadf2b97a8bc690163ee11f5b575a4b44e36e2bfb2
f0fce91676fd64c7773bac6a003f481fddd0bae0a1f31aa27504e2a533af4cef3b623f4791b2cca6
d490
""")
# (Ack1) pre-EIP-8 format.
ACK_1 = unhex("""
049f8abcfa9c0dc65b982e98af921bc0ba6e4243169348a236abe9df5f93aa69d99cadddaa387662
b0ff2c08e9006d5a11a278b1b3331e5aaabf0a32f01281b6f4ede0e09a2d5f585b26513cb794d963
5a57563921c04a9090b4f14ee42be1a5461049af4ea7a7f49bf4c97a352d39c8d02ee4acc416388c
1c66cec761d2bc1c72da6ba143477f049c9d2dde846c252c111b904f630ac98e51609b3b1f58168d
dca6505b7196532e5f85b259a20c45e1979491683fee108e9660edbf38f3add489ae73e3dda2c71b
d1497113d5c755e942d1
""")
# (Ack2) EIP-8, version 4, no additional list elements.
ACK_2 = unhex("""
01ea0451958701280a56482929d3b0757da8f7fbe5286784beead59d95089c217c9b917788989470
b0e330cc6e4fb383c0340ed85fab836ec9fb8a49672712aeabbdfd1e837c1ff4cace34311cd7f4de
05d59279e3524ab26ef753a0095637ac88f2b499b9914b5f64e143eae548a1066e14cd2f4bd7f814
c4652f11b254f8a2d0191e2f5546fae6055694aed14d906df79ad3b407d94692694e259191cde171
ad542fc588fa2b7333313d82a9f887332f1dfc36cea03f831cb9a23fea05b33deb999e85489e645f
6aab1872475d488d7bd6c7c120caf28dbfc5d6833888155ed69d34dbdc39c1f299be1057810f34fb
e754d021bfca14dc989753d61c413d261934e1a9c67ee060a25eefb54e81a4d14baff922180c395d
3f998d70f46f6b58306f969627ae364497e73fc27f6d17ae45a413d322cb8814276be6ddd13b885b
201b943213656cde498fa0e9ddc8e0b8f8a53824fbd82254f3e2c17e8eaea009c38b4aa0a3f306e8
797db43c25d68e86f262e564086f59a2fc60511c42abfb3057c247a8a8fe4fb3ccbadde17514b7ac
8000cdb6a912778426260c47f38919a91f25f4b5ffb455d6aaaf150f7e5529c100ce62d6d92826a7
1778d809bdf60232ae21ce8a437eca8223f45ac37f6487452ce626f549b3b5fdee26afd2072e4bc7
5833c2464c805246155289f4
""")
# (Ack3) EIP-8, version 57, three additional list elements.
ACK_3 = unhex("""
01f004076e58aae772bb101ab1a8e64e01ee96e64857ce82b1113817c6cdd52c09d26f7b90981cd7
ae835aeac72e1573b8a0225dd56d157a010846d888dac7464baf53f2ad4e3d584531fa203658fab0
3a06c9fd5e35737e417bc28c1cbf5e5dfc666de7090f69c3b29754725f84f75382891c561040ea1d
dc0d8f381ed1b9d0d4ad2a0ec021421d847820d6fa0ba66eaf58175f1b235e851c7e2124069fbc20
2888ddb3ac4d56bcbd1b9b7eab59e78f2e2d400905050f4a92dec1c4bdf797b3fc9b2f8e84a482f3
d800386186712dae00d5c386ec9387a5e9c9a1aca5a573ca91082c7d68421f388e79127a5177d4f8
590237364fd348c9611fa39f78dcdceee3f390f07991b7b47e1daa3ebcb6ccc9607811cb17ce51f1
c8c2c5098dbdd28fca547b3f58c01a424ac05f869f49c6a34672ea2cbbc558428aa1fe48bbfd6115
8b1b735a65d99f21e70dbc020bfdface9f724a0d1fb5895db971cc81aa7608baa0920abb0a565c9c
436e2fd13323428296c86385f2384e408a31e104670df0791d93e743a3a5194ee6b076fb6323ca59
3011b7348c16cf58f66b9633906ba54a2ee803187344b394f75dd2e663a57b956cb830dd7a908d4f
39a2336a61ef9fda549180d4ccde21514d117b6c6fd07a9102b5efe710a32af4eeacae2cb3b1dec0
35b9593b48b9d3ca4c13d245d5f04169b0b1
""")

# EIP-8 "Test Vectors / devp2p Base Protocol": a Hello with additional list
# elements (a list and two integers after the node id).
EIP8_HELLO = unhex("""
f87137916b6e6574682f76302e39312f706c616e39cdc5836574683dc6846d6f726b1682270fb840
fda1cff674c90c9a197539fe3dfb53086ace64f83ed7c6eabec741f7f381cc803e52ab2cd55d5569
bce4347107a310dfd5f88a010cd2ffd1005ca406f1842877c883666f6f836261720304
""")

# go-ethereum p2p/rlpx/rlpx_test.go TestFrameReadWrite: AES and MAC secrets
# keccak256(""), both MAC states a fake hash whose digest is always 32 x 0x01;
# message code 8 with payload rlp([1, 2, 3, 4]).
FRAME_GOLDEN = unhex("""
00828ddae471818bb0bfa6b551d1cb42
01010101010101010101010101010101
ba628a4ba590cb43f7848f41c4382885
01010101010101010101010101010101
""")


class ConstantHash:
    """go-ethereum's fakeHash: writes are ignored, the sum never changes."""

    def __init__(self, value: bytes):
        self.value = value

    def update(self, data: bytes) -> None:
        pass

    def digest(self) -> bytes:
        return self.value


def recipient_b() -> rlpx.Handshake:
    return rlpx.Handshake(KEY_B, ephemeral_key=EPHEMERAL_B, nonce=NONCE_B)


def initiator_a() -> rlpx.Handshake:
    return rlpx.Handshake(
        KEY_A,
        remote_public_key=ecies.public_key_of(KEY_B),
        ephemeral_key=EPHEMERAL_A,
        nonce=NONCE_A,
    )


def test_recipient_derives_the_eip8_secrets_and_ingress_mac():
    handshake = recipient_b()
    ack = handshake.receive_data(AUTH_2)
    assert handshake.complete and not handshake.legacy
    secrets = handshake.secrets
    assert secrets.remote_public_key == ecies.public_key_of(KEY_A)
    assert secrets.aes_secret == WANT_AES
    assert secrets.mac_secret == WANT_MAC
    secrets.ingress_mac.update(b"foo")
    assert secrets.ingress_mac.digest() == WANT_FOO_INGRESS
    # The answer to an EIP-8 auth is an EIP-8 ack A can open.
    size = int.from_bytes(ack[:2], "big")
    assert len(ack) == 2 + size
    body = rlp.decode(ecies.decrypt(KEY_A, ack[2:], ack[:2]), strict=False)
    assert body[:2] == [ecies.public_key_of(EPHEMERAL_B), NONCE_B]


@pytest.mark.parametrize("auth", [AUTH_1, AUTH_2, AUTH_3], ids=["auth1-legacy", "auth2", "auth3-v56"])
def test_recipient_accepts_every_auth_format(auth):
    handshake = recipient_b()
    ack = handshake.receive_data(auth)
    assert handshake.secrets.aes_secret == WANT_AES
    assert handshake.secrets.mac_secret == WANT_MAC
    assert handshake.legacy == (auth is AUTH_1)
    if auth is AUTH_1:
        # A pre-EIP-8 auth gets a pre-EIP-8 ack: ephemeral key || nonce || 0x00.
        assert len(ack) == rlpx.LEGACY_ACK_SIZE
        assert ecies.decrypt(KEY_A, ack) == ecies.public_key_of(EPHEMERAL_B) + NONCE_B + b"\x00"


@pytest.mark.parametrize("ack", [ACK_1, ACK_2, ACK_3], ids=["ack1-legacy", "ack2", "ack3-v57"])
def test_initiator_accepts_every_ack_format(ack):
    handshake = initiator_a()
    handshake.initiate()
    assert handshake.receive_data(ack) == b""
    assert handshake.complete
    assert handshake.secrets.aes_secret == WANT_AES
    assert handshake.secrets.mac_secret == WANT_MAC
    assert handshake.secrets.remote_public_key == ecies.public_key_of(KEY_B)


def test_initiator_auth_signs_what_the_vector_signs():
    # The vector's signature used a random ECDSA nonce, ours is RFC 6979:
    # both must recover ephemeral key A over static-shared-secret ^ nonce.
    auth = initiator_a().initiate()
    body = rlp.decode(ecies.decrypt(KEY_B, auth[2:], auth[:2]), strict=False)
    assert body[1:] == [ecies.public_key_of(KEY_A), NONCE_A, b"\x04"]
    static_shared = ecies.ecdh_x(KEY_A, ecies.public_key_of(KEY_B))
    signed = bytes(x ^ y for x, y in zip(static_shared, NONCE_A))
    for signature in (body[0], AUTH_SIGNATURE):
        recovered = coincurve.PublicKey.from_signature_and_message(signature, signed, hasher=None)
        assert recovered.format(compressed=False)[1:] == ecies.public_key_of(EPHEMERAL_A)
    padding = len(auth) - 2 - ecies.ECIES_OVERHEAD - len(rlp.encode(body))
    assert rlpx.MIN_PADDING <= padding <= rlpx.MAX_PADDING


def test_vector_packets_arrive_byte_by_byte():
    handshake = recipient_b()
    for i in range(len(AUTH_2) - 1):
        assert handshake.receive_data(AUTH_2[i : i + 1]) == b""
    assert handshake.receive_data(AUTH_2[-1:]) != b""
    assert handshake.secrets.aes_secret == WANT_AES


def test_frame_matches_go_ethereum_golden_vector():
    secrets = rlpx.Secrets(
        remote_public_key=bytes(64),
        aes_secret=keccak256(b""),
        mac_secret=keccak256(b""),
        egress_mac=ConstantHash(b"\x01" * 32),
        ingress_mac=ConstantHash(b"\x01" * 32),
    )
    codec = rlpx.FrameCodec(secrets)
    assert codec.encode_frame(rlp.encode(8) + rlp.encode([1, 2, 3, 4])) == FRAME_GOLDEN
    assert codec.receive_data(FRAME_GOLDEN) == [unhex("08C401020304")]


def test_eip8_hello_with_additional_elements_decodes():
    hello = rlpx.Hello.decode(EIP8_HELLO)
    assert hello.protocol_version == 0x37
    assert hello.client_id == "kneth/v0.91/plan9"
    assert hello.capabilities == (rlpx.Capability("eth", 61), rlpx.Capability("mork", 22))
    assert hello.listen_port == 9999
    assert hello.node_id[:4] == unhex("fda1cff6") and len(hello.node_id) == 64


# --- ECIES -------------------------------------------------------------------


def test_ecies_round_trip_with_shared_mac_data():
    key = os.urandom(32)
    sealed = ecies.encrypt(ecies.public_key_of(key), b"payload", b"\x01\x23")
    assert len(sealed) == len(b"payload") + ecies.ECIES_OVERHEAD
    assert ecies.decrypt(key, sealed, b"\x01\x23") == b"payload"
    with pytest.raises(RLPxError):
        ecies.decrypt(key, sealed, b"\x01\x24")
    with pytest.raises(RLPxError):
        ecies.decrypt(os.urandom(32), sealed, b"\x01\x23")


def test_ecies_ecdh_is_the_raw_x_coordinate():
    a, b = os.urandom(32), os.urandom(32)
    assert ecies.ecdh_x(a, ecies.public_key_of(b)) == ecies.ecdh_x(b, ecies.public_key_of(a))
    assert len(ecies.ecdh_x(a, ecies.public_key_of(b))) == 32


@pytest.mark.parametrize("position", [0, 1, 70, 90, -1])
def test_ecies_rejects_any_flipped_byte(position):
    key = os.urandom(32)
    sealed = bytearray(ecies.encrypt(ecies.public_key_of(key), b"x" * 40))
    sealed[position] ^= 0x01
    with pytest.raises(RLPxError):
        ecies.decrypt(key, bytes(sealed))


# --- handshake and connection in memory ---------------------------------------


def handshake_pair() -> tuple[rlpx.Handshake, rlpx.Handshake, bytes, bytes]:
    key_i, key_r = os.urandom(32), os.urandom(32)
    initiator = rlpx.Handshake(key_i, remote_public_key=ecies.public_key_of(key_r))
    recipient = rlpx.Handshake(key_r)
    ack = recipient.receive_data(initiator.initiate())
    assert initiator.receive_data(ack) == b""
    return initiator, recipient, key_i, key_r


def hello_for(key: bytes, version: int = rlpx.BASE_PROTOCOL_VERSION) -> rlpx.Hello:
    caps = (rlpx.Capability(rlpx.WAKU_CAPABILITY_NAME, rlpx.WAKU_V1_VERSION),)
    return rlpx.Hello(version, "wakustore-test", caps, 30303, ecies.public_key_of(key))


def connected(version_i: int = 5, version_r: int = 5, **limits):
    initiator, recipient, key_i, key_r = handshake_pair()
    conn_i = rlpx.Connection(initiator.secrets, hello_for(key_i, version_i), **limits)
    conn_r = rlpx.Connection(recipient.secrets, hello_for(key_r, version_r), **limits)
    assert conn_r.receive_data(conn_i.send_hello()) == [conn_i.local_hello]
    assert conn_i.receive_data(conn_r.send_hello()) == [conn_r.local_hello]
    return conn_i, conn_r


def test_handshake_secrets_match_on_both_sides():
    initiator, recipient, key_i, key_r = handshake_pair()
    si, sr = initiator.secrets, recipient.secrets
    assert (si.aes_secret, si.mac_secret) == (sr.aes_secret, sr.mac_secret)
    assert si.remote_public_key == ecies.public_key_of(key_r)
    assert sr.remote_public_key == ecies.public_key_of(key_i)
    assert si.egress_mac.digest() == sr.ingress_mac.digest()
    assert si.ingress_mac.digest() == sr.egress_mac.digest()


@pytest.mark.parametrize("versions, snappy", [((5, 5), True), ((5, 4), False), ((4, 5), False)])
def test_messages_round_trip_both_ways(versions, snappy):
    conn_i, conn_r = connected(*versions)
    assert conn_i.snappy is snappy and conn_r.snappy is snappy
    payload = b"envelope " * 2000
    wire = conn_i.send_message(rlpx.to_wire_code(1), payload)
    assert (len(wire) < len(payload)) is snappy
    assert conn_r.receive_data(wire) == [rlpx.Message(0x11, payload)]
    assert conn_i.receive_data(conn_r.send_message(0x7F + 0x10, b"")) == [rlpx.Message(0x8F, b"")]
    assert conn_r.receive_data(conn_i.send_ping()) == [rlpx.Ping()]
    assert conn_i.receive_data(conn_r.send_pong()) == [rlpx.Pong()]


def test_many_frames_in_one_chunk_and_split_anywhere():
    conn_i, conn_r = connected()
    wire = b"".join(conn_i.send_message(0x10 + n % 3, bytes([n]) * n) for n in range(40))
    events = []
    for start in range(0, len(wire), 7):
        events += conn_r.receive_data(wire[start : start + 7])
    assert events == [rlpx.Message(0x10 + n % 3, bytes([n]) * n) for n in range(40)]
    assert conn_r.buffered == 0


def test_handshake_trailing_bytes_feed_the_connection():
    key_i, key_r = os.urandom(32), os.urandom(32)
    initiator = rlpx.Handshake(key_i, remote_public_key=ecies.public_key_of(key_r))
    recipient = rlpx.Handshake(key_r)
    ack = recipient.receive_data(initiator.initiate())
    conn_r = rlpx.Connection(recipient.secrets, hello_for(key_r))
    initiator.receive_data(ack + conn_r.send_hello())  # ack and Hello in one read
    conn_i, events = rlpx.Connection.from_handshake(initiator, hello_for(key_i))
    assert events == [conn_r.local_hello]


def test_tampered_header_mac_raises_and_poisons_the_stream():
    conn_i, conn_r = connected()
    wire = bytearray(conn_i.send_message(0x10, b"data"))
    wire[20] ^= 0x80
    with pytest.raises(RLPxError, match="header MAC"):
        conn_r.receive_data(bytes(wire))
    with pytest.raises(RLPxError):
        conn_r.receive_data(conn_i.send_message(0x10, b"data"))


@pytest.mark.parametrize("position", [0, 33, -17, -1])
def test_any_flipped_bit_raises(position):
    conn_i, conn_r = connected()
    wire = bytearray(conn_i.send_message(0x10, b"x" * 40))
    wire[position] ^= 0x01
    with pytest.raises(RLPxError):
        conn_r.receive_data(bytes(wire))


def test_truncated_frame_is_detected():
    conn_i, conn_r = connected()
    first = conn_i.send_message(0x10, b"x" * 40)
    second = conn_i.send_message(0x10, b"y" * 40)
    # Cut short: nothing is delivered, and the bytes wait for the rest.
    assert conn_r.receive_data(first[:-1]) == []
    assert conn_r.buffered == len(first) - 1 - 32
    # A frame followed by the next one instead of its last byte fails its MAC.
    with pytest.raises(RLPxError, match="frame MAC"):
        conn_r.receive_data(second)


def test_connection_closed_inside_a_frame_raises():
    conn_i, conn_r = connected()
    conn_r.receive_data(conn_i.send_message(0x10, b"x" * 40)[:-5])
    with pytest.raises(RLPxError, match="inside a frame"):
        conn_r.receive_eof()


def test_connection_closed_inside_the_handshake_raises():
    handshake = rlpx.Handshake(os.urandom(32))
    handshake.receive_data(AUTH_2[:100])
    with pytest.raises(RLPxError):
        handshake.receive_eof()


def test_oversized_frame_is_refused_from_its_header():
    conn_i, conn_r = connected(max_frame_size=1024)
    wire = conn_i.send_message(0x10, os.urandom(2000))
    with pytest.raises(RLPxError, match="exceeds 1024"):
        conn_r.receive_data(wire[:32])


def test_decompressed_size_is_bounded_before_inflating():
    conn_i, conn_r = connected(max_message_size=1000)
    with pytest.raises(RLPxError, match="exceeds 1000"):
        conn_r.receive_data(conn_i.send_message(0x10, bytes(5000)))
    # A compressed header announcing 16 MiB is refused without inflating it.
    conn_i, conn_r = connected()
    bomb = conn_i._codec.encode_frame(b"\x10" + b"\x80\x80\x80\x08" + b"\x00")
    with pytest.raises(RLPxError, match="exceeds"):
        conn_r.receive_data(bomb)


def test_corrupt_snappy_payload_raises():
    conn_i, conn_r = connected()
    with pytest.raises(RLPxError, match="snappy"):
        conn_r.receive_data(conn_i._codec.encode_frame(b"\x10" + b"\x05\x00abc"))


def test_message_before_hello_is_a_protocol_breach():
    initiator, recipient, key_i, key_r = handshake_pair()
    conn_i = rlpx.Connection(initiator.secrets, hello_for(key_i))
    conn_r = rlpx.Connection(recipient.secrets, hello_for(key_r))
    with pytest.raises(RLPxError, match="after both Hellos"):
        conn_i.send_message(0x10, b"early")
    with pytest.raises(RLPxError, match="expected Hello"):
        conn_r.receive_data(conn_i._codec.encode_frame(b"\x10early"))


def test_hello_with_another_identity_is_refused():
    initiator, recipient, key_i, key_r = handshake_pair()
    conn_i = rlpx.Connection(initiator.secrets, hello_for(os.urandom(32)))
    conn_r = rlpx.Connection(recipient.secrets, hello_for(key_r))
    with pytest.raises(RLPxError, match="identity"):
        conn_r.receive_data(conn_i.send_hello())


@pytest.mark.parametrize(
    "payload",
    [
        rlp.encode([b"\x00" * 10]),  # not five elements
        rlp.encode([5, b"id", [[b"waku"]], 0, b"\x01" * 64]),  # capability without version
        rlp.encode([5, b"id", [[b"waku", 1, 2]], 0, b"\x01" * 64]),  # capability with three
        rlp.encode([5, b"id", [b"waku"], 0, b"\x01" * 64]),  # capability not a list
        rlp.encode([5, b"id", [], 0, bytes(64)]),  # all-zero node id
        rlp.encode([5, b"id", [], 0, b"\x01" * 63]),  # short node id
        rlp.encode([5, [b"id"], [], 0, b"\x01" * 64]),  # client id a list
        b"\xc5\x05\x00\xc0\x80\x80",  # non-canonical integer
    ],
)
def test_malformed_hellos_raise(payload):
    with pytest.raises(RLPxError):
        rlpx.Hello.decode(payload)


def test_oversized_hello_is_refused():
    hello = rlpx.Hello(5, "x" * 3000, (), 0, b"\x01" * 64)
    with pytest.raises(RLPxError, match="exceeds 2048"):
        rlpx.Hello.decode(hello.encode())


@pytest.mark.parametrize(
    "payload, reason",
    [
        (rlp.encode([8]), 8),  # go-ethereum: [reason]
        (rlp.encode(8), 8),  # ethereumjs: the bare reason
        (rlp.encode([0]), 0),
        (rlp.encode([]), None),
        (b"\xff\xff", None),
    ],
)
def test_disconnect_reason_forms(payload, reason):
    for compress in (True, False):
        conn_i, conn_r = connected()
        body = bytes(cramjam.snappy.compress_raw(payload)) if compress else payload
        events = conn_r.receive_data(conn_i._codec.encode_frame(b"\x01" + body))
        assert events == [rlpx.Disconnect(reason)]
        assert conn_r.closed


def test_disconnect_closes_both_directions():
    conn_i, conn_r = connected()
    wire = conn_i.send_disconnect(rlpx.DISCONNECT_USELESS_PEER)
    assert conn_r.receive_data(wire + conn_i._codec.encode_frame(b"\x10x")) == [
        rlpx.Disconnect(rlpx.DISCONNECT_USELESS_PEER)
    ]
    assert conn_r.receive_data(b"anything") == []
    assert rlpx.Disconnect(rlpx.DISCONNECT_USELESS_PEER).description == "useless peer"
    with pytest.raises(RLPxError, match="closed"):
        conn_i.send_ping()


def test_disconnect_before_hello_is_accepted():
    initiator, recipient, key_i, key_r = handshake_pair()
    conn_i = rlpx.Connection(initiator.secrets, hello_for(key_i))
    conn_r = rlpx.Connection(recipient.secrets, hello_for(key_r))
    assert conn_r.receive_data(conn_i.send_disconnect(rlpx.DISCONNECT_TOO_MANY_PEERS)) == [
        rlpx.Disconnect(rlpx.DISCONNECT_TOO_MANY_PEERS)
    ]


def test_waku_codes_follow_the_base_protocol():
    assert rlpx.to_wire_code(0) == 0x10
    assert rlpx.to_wire_code(0x7F) == 0x8F
    assert rlpx.from_wire_code(0x8F) == 0x7F
    with pytest.raises(ValueError):
        rlpx.to_wire_code(128)
    with pytest.raises(RLPxError):
        rlpx.from_wire_code(0x0F)


def test_capabilities_match_as_go_ethereum_assigns_offsets():
    local = {rlpx.Capability("waku", 0): 128, rlpx.Capability("waku", 1): 128, rlpx.Capability("les", 2): 21}
    remote = [
        rlpx.Capability("waku", 1),
        rlpx.Capability("waku", 0),
        rlpx.Capability("eth", 66),
        rlpx.Capability("les", 2),
    ]
    shared = rlpx.match_capabilities(local, remote)
    assert shared == {
        "les": rlpx.SharedCapability("les", 2, 0x10, 21),
        "waku": rlpx.SharedCapability("waku", 1, 0x10 + 21, 128),
    }


def test_errors_are_protocol_errors():
    assert issubclass(RLPxError, ProtocolError)


# --- fuzzing -------------------------------------------------------------------

FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Nested RLP values (strings, integers, lists), so that the decoders behind
# the MACs see well-formed structure too, not only noise.
RLP_VALUES = st.recursive(
    st.binary(max_size=80) | st.integers(0, 2**72),
    lambda children: st.lists(children, max_size=6),
    max_leaves=12,
)


@FUZZ
@given(st.lists(st.binary(max_size=700), max_size=6))
def test_fuzz_recipient_handshake_raises_only_rlpx_errors(chunks):
    handshake = rlpx.Handshake(KEY_B)
    for chunk in chunks:
        try:
            handshake.receive_data(chunk)
        except RLPxError:
            return
        assert handshake.buffered <= rlpx.MAX_HANDSHAKE_PACKET_SIZE


@FUZZ
@given(st.binary(min_size=1, max_size=600), st.integers(0, 2**16 - 1))
def test_fuzz_eip8_framed_garbage_raises_only_rlpx_errors(body, size):
    handshake = rlpx.Handshake(KEY_B)
    try:
        handshake.receive_data(size.to_bytes(2, "big") + body)
    except RLPxError:
        pass


@FUZZ
@given(st.binary(min_size=1, max_size=400) | RLP_VALUES.map(rlp.encode), st.booleans())
def test_fuzz_sealed_handshake_bodies_raise_only_rlpx_errors(plain, as_ack):
    # Authentic ECIES around arbitrary plaintext reaches the body decoders.
    handshake = recipient_b()
    public_key = ecies.public_key_of(KEY_B)
    if as_ack:
        handshake = initiator_a()
        handshake.initiate()
        public_key = ecies.public_key_of(KEY_A)
    prefix = (len(plain) + ecies.ECIES_OVERHEAD).to_bytes(2, "big")
    packet = prefix + ecies.encrypt(public_key, plain, prefix)
    try:
        handshake.receive_data(packet)
    except RLPxError:
        pass


@FUZZ
@given(st.lists(st.binary(max_size=300), max_size=5))
def test_fuzz_random_bytes_to_a_connection_raise_only_rlpx_errors(chunks):
    conn_i, conn_r = connected(max_frame_size=4096)
    for chunk in chunks:
        try:
            conn_r.receive_data(chunk)
        except RLPxError:
            return
        assert conn_r.buffered <= 32 + 4096 + 16


FRAME_CONTENTS = st.one_of(
    st.binary(max_size=300),
    st.tuples(st.integers(0, 0x90), RLP_VALUES, st.booleans()).map(
        lambda t: (
            rlp.encode(t[0]) + (bytes(cramjam.snappy.compress_raw(rlp.encode(t[1]))) if t[2] else rlp.encode(t[1]))
        )
    ),
)


@FUZZ
@given(st.lists(FRAME_CONTENTS, min_size=1, max_size=4), st.booleans())
def test_fuzz_authentic_frames_of_random_content_raise_only_rlpx_errors(contents, after_hello):
    # Valid frames carrying arbitrary content reach code, Hello, Disconnect
    # and snappy parsing.
    initiator, recipient, key_i, key_r = handshake_pair()
    conn_i = rlpx.Connection(initiator.secrets, hello_for(key_i), max_message_size=4096)
    conn_r = rlpx.Connection(recipient.secrets, hello_for(key_r), max_message_size=4096)
    if after_hello:
        conn_r.receive_data(conn_i.send_hello())
        conn_i.receive_data(conn_r.send_hello())
    for content in contents:
        try:
            events = conn_r.receive_data(conn_i._codec.encode_frame(content))
        except RLPxError:
            return
        for event in events:
            if isinstance(event, rlpx.Message):
                assert len(event.payload) <= 4096
