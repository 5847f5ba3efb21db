"""Node Discovery v5.1 (devp2p discv5-wire), sans-IO: packets, messages, sessions.

33/WAKU2-DISCV5: Waku nodes run discv5 with the protocol id ``d5waku`` in
the packet header instead of ``discv5`` (nwaku is built so), which keeps
them apart from Ethereum's discovery network; everything else is the
devp2p specification.

A packet is ``masking-iv || masked-header || message``: the header
(``protocol-id || version || flag || nonce || authdata-size || authdata``)
is AES-128-CTR encrypted with the first 16 bytes of the recipient's node
id and the iv; the message is AES-128-GCM encrypted with the session key,
the 12-byte nonce of the header and ``masking-iv || header`` as associated
data. Three kinds (the flag):

- message (0): authdata is the sender's node id;
- WHOAREYOU (1): the answer to a message that could not be decrypted:
  authdata ``id-nonce (16) || enr-seq (8)``, the header's nonce that of
  the message answered; no message;
- handshake (2): authdata ``src-id || sig-size || eph-key-size ||
  id-signature || eph-pubkey || record?``, then a message under the
  session keys it establishes: ECDH of the ephemeral key and the
  recipient's static key, HKDF(salt = challenge-data, info = "discovery
  v5 key agreement" || id-A || id-B), the challenge data being the
  WHOAREYOU packet's ``masking-iv || header``.

:class:`Sessions` is the state machine of one node: it turns a message to
send into the packet to send, and a received packet into what to do (a
message to handle, a WHOAREYOU to answer, a handshake to complete). It
holds bounded tables: sessions, challenges sent, requests waiting for a
WHOAREYOU.
"""

from __future__ import annotations

import collections
import hashlib
import hmac
import ipaddress
import secrets
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import rlp
from coincurve import PrivateKey, PublicKey
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from wakustore.protocols import enr as enr_codec
from wakustore.protocols.crypto import keccak256
from wakustore.protocols.errors import ProtocolError

PROTOCOL_ID = b"discv5"
WAKU_PROTOCOL_ID = b"d5waku"  # 33/WAKU2-DISCV5
VERSION = 1
MAX_PACKET_SIZE = 1280
MIN_PACKET_SIZE = 63
IV_SIZE = 16
NONCE_SIZE = 12
ID_NONCE_SIZE = 16
NODE_ID_SIZE = 32
_STATIC_HEADER = struct.Struct(">6sHB12sH")  # protocol id, version, flag, nonce, authdata size
STATIC_HEADER_SIZE = _STATIC_HEADER.size  # 23
_TAG_SIZE = 16

FLAG_MESSAGE = 0
FLAG_WHOAREYOU = 1
FLAG_HANDSHAKE = 2

# Message types.
PING, PONG, FINDNODE, NODES, TALKREQ, TALKRESP = 1, 2, 3, 4, 5, 6

# Bounds: a FINDNODE names at most this many distances; a NODES answer
# carries at most this many records in all (discv5's bucket size), in
# messages of at most NODES_PER_MESSAGE records (3 records of 300 bytes
# and the headers fit 1280 bytes); request ids are at most 8 bytes.
MAX_DISTANCES = 16
MAX_NODES = 16
NODES_PER_MESSAGE = 3
MAX_NODES_MESSAGES = 6
MAX_REQUEST_ID_SIZE = 8
# Tables of Sessions.
MAX_SESSIONS = 1024
MAX_CHALLENGES = 1024
MAX_PENDING = 1024

_KDF_INFO = b"discovery v5 key agreement"
_ID_PROOF = b"discovery v5 identity proof"


class Discv5Error(ProtocolError):
    """A packet or message that is not discv5, or that cannot be answered."""


# --- identities and crypto ---------------------------------------------------------


def node_id(public_key: bytes) -> bytes:
    """The node id of a secp256k1 public key (v4 identity scheme):
    keccak256 of the uncompressed key without its prefix byte."""
    return keccak256(PublicKey(public_key).format(compressed=False)[1:])


def log_distance(a: bytes, b: bytes) -> int:
    """log2 of ``a XOR b`` plus one (0 for equal ids), as FINDNODE's distances."""
    return (int.from_bytes(a, "big") ^ int.from_bytes(b, "big")).bit_length()


def ecdh(public_key: bytes, private_key: bytes) -> bytes:
    """The shared point in compressed form (33 bytes), as discv5 uses it."""
    point = PublicKey(public_key).multiply(private_key)
    return point.format(compressed=True)


def derive_keys(secret: bytes, id_a: bytes, id_b: bytes, challenge_data: bytes) -> tuple[bytes, bytes]:
    """(initiator key, recipient key): HKDF-SHA256 of the ECDH secret."""
    prk = hmac.new(challenge_data, secret, hashlib.sha256).digest()
    info = _KDF_INFO + id_a + id_b
    okm = hmac.new(prk, info + b"\x01", hashlib.sha256).digest()
    return okm[:16], okm[16:32]


def id_sign(private_key: bytes, challenge_data: bytes, ephemeral_public_key: bytes, dest_id: bytes) -> bytes:
    """The handshake's id-signature: 64 bytes r || s over sha256 of the
    identity proof input."""
    digest = hashlib.sha256(_ID_PROOF + challenge_data + ephemeral_public_key + dest_id).digest()
    recoverable = PrivateKey(private_key).sign_recoverable(digest, hasher=None)
    return recoverable[:64]


def id_verify(
    public_key: bytes, signature: bytes, challenge_data: bytes, ephemeral_public_key: bytes, dest_id: bytes
) -> bool:
    if len(signature) != 64:
        return False
    digest = hashlib.sha256(_ID_PROOF + challenge_data + ephemeral_public_key + dest_id).digest()
    from coincurve.ecdsa import cdata_to_der, deserialize_compact

    try:
        der = cdata_to_der(deserialize_compact(signature))
        return PublicKey(public_key).verify(der, digest, hasher=None)
    except Exception:
        return False


def _ctr(key: bytes, iv: bytes, data: bytes) -> bytes:
    cipher = Cipher(algorithms.AES(key), modes.CTR(iv)).encryptor()
    return cipher.update(data) + cipher.finalize()


def encrypt(key: bytes, nonce: bytes, plaintext: bytes, associated: bytes) -> bytes:
    return AESGCM(key).encrypt(nonce, plaintext, associated)


def decrypt(key: bytes, nonce: bytes, ciphertext: bytes, associated: bytes) -> bytes:
    try:
        return AESGCM(key).decrypt(nonce, ciphertext, associated)
    except InvalidTag:
        raise Discv5Error("message does not decrypt") from None


# --- packets -------------------------------------------------------------------------


@dataclass(frozen=True)
class Packet:
    """A decoded packet header and its still encrypted message."""

    iv: bytes
    flag: int
    nonce: bytes
    authdata: bytes
    header: bytes  # static header and authdata, unmasked: with iv, the message's associated data
    message: bytes

    @property
    def associated_data(self) -> bytes:
        return self.iv + self.header


def encode_packet(
    dest_id: bytes,
    flag: int,
    nonce: bytes,
    authdata: bytes,
    message: bytes = b"",
    *,
    iv: bytes | None = None,
    protocol_id: bytes = PROTOCOL_ID,
) -> tuple[bytes, bytes]:
    """(packet, associated data) for a header; ``message`` is already encrypted."""
    iv = secrets.token_bytes(IV_SIZE) if iv is None else iv
    header = _STATIC_HEADER.pack(protocol_id, VERSION, flag, nonce, len(authdata)) + authdata
    packet = iv + _ctr(dest_id[:16], iv, header) + message
    if len(packet) > MAX_PACKET_SIZE:
        raise Discv5Error(f"packet of {len(packet)} bytes over {MAX_PACKET_SIZE}")
    return packet, iv + header


def decode_packet(local_id: bytes, data: bytes, protocol_id: bytes = PROTOCOL_ID) -> Packet:
    """The header of a packet sent to ``local_id``; Discv5Error when it is
    not one (size, protocol id, version, flag, authdata size)."""
    if not MIN_PACKET_SIZE <= len(data) <= MAX_PACKET_SIZE:
        raise Discv5Error(f"packet of {len(data)} bytes outside {MIN_PACKET_SIZE}..{MAX_PACKET_SIZE}")
    iv = data[:IV_SIZE]
    decryptor = Cipher(algorithms.AES(local_id[:16]), modes.CTR(iv)).decryptor()
    static = decryptor.update(data[IV_SIZE : IV_SIZE + STATIC_HEADER_SIZE])
    protocol, version, flag, nonce, size = _STATIC_HEADER.unpack(static)
    if protocol != protocol_id:
        raise Discv5Error("not a packet of this protocol id")
    if version != VERSION:
        raise Discv5Error(f"version {version}")
    if flag not in (FLAG_MESSAGE, FLAG_WHOAREYOU, FLAG_HANDSHAKE):
        raise Discv5Error(f"flag {flag}")
    end = IV_SIZE + STATIC_HEADER_SIZE + size
    if end > len(data):
        raise Discv5Error("authdata past the end of the packet")
    authdata = decryptor.update(data[IV_SIZE + STATIC_HEADER_SIZE : end]) + decryptor.finalize()
    expected = {FLAG_MESSAGE: NODE_ID_SIZE, FLAG_WHOAREYOU: ID_NONCE_SIZE + 8}.get(flag)
    if expected is not None and size != expected:
        raise Discv5Error(f"authdata of {size} bytes for flag {flag}")
    if flag == FLAG_HANDSHAKE and size < NODE_ID_SIZE + 2:
        raise Discv5Error("handshake authdata too short")
    return Packet(iv, flag, nonce, authdata, static + authdata, data[end:])


@dataclass(frozen=True)
class Handshake:
    """A handshake's authdata."""

    src_id: bytes
    signature: bytes
    ephemeral_key: bytes
    record: bytes | None


def encode_handshake_authdata(src_id: bytes, signature: bytes, ephemeral_key: bytes, record: bytes | None) -> bytes:
    return src_id + bytes([len(signature), len(ephemeral_key)]) + signature + ephemeral_key + (record or b"")


def decode_handshake_authdata(authdata: bytes) -> Handshake:
    src_id = authdata[:NODE_ID_SIZE]
    sig_size, key_size = authdata[NODE_ID_SIZE], authdata[NODE_ID_SIZE + 1]
    start = NODE_ID_SIZE + 2
    if sig_size != 64 or key_size != 33 or len(authdata) < start + sig_size + key_size:
        raise Discv5Error("handshake authdata: bad signature or key size")
    signature = authdata[start : start + sig_size]
    key = authdata[start + sig_size : start + sig_size + key_size]
    record = authdata[start + sig_size + key_size :] or None
    return Handshake(src_id, signature, key, record)


# --- messages ------------------------------------------------------------------------


@dataclass(frozen=True)
class Message:
    """A protocol message: its type, request id and fields (RLP items)."""

    kind: int
    request_id: bytes
    fields: tuple[Any, ...] = ()


def ping(request_id: bytes, enr_seq: int) -> Message:
    return Message(PING, request_id, (enr_seq,))


def pong(request_id: bytes, enr_seq: int, ip: str, port: int) -> Message:
    return Message(PONG, request_id, (enr_seq, ipaddress.ip_address(ip).packed, port))


def findnode(request_id: bytes, distances: Sequence[int]) -> Message:
    return Message(FINDNODE, request_id, (list(distances),))


def nodes(request_id: bytes, total: int, records: Sequence[bytes]) -> Message:
    return Message(NODES, request_id, (total, [rlp.decode(r) for r in records]))


def encode_message(message: Message) -> bytes:
    encoded: bytes = rlp.encode([message.request_id, *message.fields])
    return bytes([message.kind]) + encoded


def decode_message(data: bytes) -> Message:
    """A message's plaintext; Discv5Error for anything malformed."""
    if not data:
        raise Discv5Error("empty message")
    kind = data[0]
    try:
        items = rlp.decode(data[1:])
    except Exception as exc:
        raise Discv5Error(f"message RLP: {exc}") from None
    if not isinstance(items, list) or not items or not isinstance(items[0], bytes):
        raise Discv5Error("message is not a list starting with a request id")
    request_id, rest = items[0], items[1:]
    if len(request_id) > MAX_REQUEST_ID_SIZE:
        raise Discv5Error("request id over 8 bytes")
    try:
        if kind == PING:
            return Message(PING, request_id, (_uint(rest[0]),))
        if kind == PONG:
            ip = rest[1]
            if len(ip) not in (4, 16):
                raise Discv5Error("PONG address is not IPv4 or IPv6")
            return Message(PONG, request_id, (_uint(rest[0]), ip, _uint(rest[2])))
        if kind == FINDNODE:
            distances = rest[0]
            if not isinstance(distances, list) or len(distances) > MAX_DISTANCES:
                raise Discv5Error("FINDNODE distances: not a list of at most 16")
            values = [_uint(d) for d in distances]
            if any(d > 256 for d in values):
                raise Discv5Error("FINDNODE distance over 256")
            return Message(FINDNODE, request_id, (values,))
        if kind == NODES:
            records = rest[1]
            if not isinstance(records, list):
                raise Discv5Error("NODES records: not a list")
            return Message(NODES, request_id, (_uint(rest[0]), [rlp.encode(r) for r in records]))
        if kind in (TALKREQ, TALKRESP):
            return Message(kind, request_id, tuple(rest))
    except (IndexError, TypeError) as exc:
        raise Discv5Error(f"message type {kind}: missing fields ({exc})") from None
    raise Discv5Error(f"unknown message type {kind}")


def _uint(item: Any) -> int:
    if not isinstance(item, bytes) or len(item) > 8:
        raise Discv5Error("not an unsigned integer of at most 8 bytes")
    return int.from_bytes(item, "big")


# --- sessions ------------------------------------------------------------------------

Address = tuple[str, int]


@dataclass
class _Session:
    write_key: bytes
    read_key: bytes
    record: enr_codec.Enr | None


@dataclass
class _Challenge:
    """A WHOAREYOU we sent: what the handshake answering it must sign."""

    challenge_data: bytes
    known: enr_codec.Enr | None  # the record we had of the sender (enr-seq we named)


@dataclass
class _Pending:
    """A message we sent without a session, kept for the WHOAREYOU it draws."""

    dest_id: bytes
    record: enr_codec.Enr | None
    plaintext: bytes


@dataclass
class Received:
    """What :meth:`Sessions.receive` found in a packet."""

    reply: bytes | None = None  # a packet to send back (a WHOAREYOU)
    message: Message | None = None  # a message to handle
    node_id: bytes | None = None  # whose (the sender's)
    record: enr_codec.Enr | None = None  # the sender's record, when a handshake carried or confirmed it
    resend: list[bytes] = field(default_factory=list)  # packets to send after a handshake


class Sessions:
    """One node's sessions (sans-IO): packets in and out for the UDP socket.

    ``private_key`` is the node's secp256k1 key, ``record`` its signed ENR
    (``record()`` is called each time, so a new sequence number is seen).
    ``random`` gives bytes (secrets.token_bytes; a test passes its own).
    """

    def __init__(
        self,
        private_key: bytes,
        record: Callable[[], enr_codec.Enr],
        protocol_id: bytes = WAKU_PROTOCOL_ID,
        random: Callable[[int], bytes] = secrets.token_bytes,
    ):
        self.private_key = private_key
        self.public_key = PrivateKey(private_key).public_key.format(compressed=True)
        self.local_id = node_id(self.public_key)
        self.record = record
        self.protocol_id = protocol_id
        self.random = random
        self._sessions: collections.OrderedDict[tuple[bytes, Address], _Session] = collections.OrderedDict()
        self._challenges: collections.OrderedDict[tuple[bytes, Address], _Challenge] = collections.OrderedDict()
        self._pending: collections.OrderedDict[bytes, _Pending] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._sessions)

    def has_session(self, dest_id: bytes, address: Address) -> bool:
        return (dest_id, address) in self._sessions

    def send(self, dest_id: bytes, address: Address, message: Message, record: enr_codec.Enr | None = None) -> bytes:
        """The packet carrying ``message`` to ``dest_id`` at ``address``:
        under the session when there is one, else a message no one can
        read, which draws the WHOAREYOU that starts a handshake (``record``,
        the recipient's ENR, is needed then)."""
        plaintext = encode_message(message)
        nonce = self.random(NONCE_SIZE)
        session = self._sessions.get((dest_id, address))
        if session is None:
            _put(self._pending, nonce, _Pending(dest_id, record, plaintext), MAX_PENDING)
            packet, _ = encode_packet(
                dest_id,
                FLAG_MESSAGE,
                nonce,
                self.local_id,
                self.random(20),
                iv=self.random(IV_SIZE),
                protocol_id=self.protocol_id,
            )
            return packet
        self._sessions.move_to_end((dest_id, address))
        return self._sealed(dest_id, FLAG_MESSAGE, nonce, self.local_id, plaintext, session.write_key)

    def _sealed(self, dest_id: bytes, flag: int, nonce: bytes, authdata: bytes, plaintext: bytes, key: bytes) -> bytes:
        iv = self.random(IV_SIZE)
        header = _STATIC_HEADER.pack(self.protocol_id, VERSION, flag, nonce, len(authdata)) + authdata
        ciphertext = encrypt(key, nonce, plaintext, iv + header)
        packet, _ = encode_packet(dest_id, flag, nonce, authdata, ciphertext, iv=iv, protocol_id=self.protocol_id)
        return packet

    def receive(self, data: bytes, address: Address, known: Callable[[bytes], enr_codec.Enr | None]) -> Received:
        """Handle one datagram from ``address``; ``known(node_id)`` gives
        the record we hold of a node (or None). Raises Discv5Error for a
        packet to drop."""
        packet = decode_packet(self.local_id, data, self.protocol_id)
        if packet.flag == FLAG_WHOAREYOU:
            return self._on_whoareyou(packet, address)
        if packet.flag == FLAG_HANDSHAKE:
            return self._on_handshake(packet, address, known)
        src_id = packet.authdata
        session = self._sessions.get((src_id, address))
        if session is not None:
            try:
                plaintext = decrypt(session.read_key, packet.nonce, packet.message, packet.associated_data)
            except Discv5Error:
                plaintext = None
            if plaintext is not None:
                self._sessions.move_to_end((src_id, address))
                return Received(message=decode_message(plaintext), node_id=src_id, record=session.record)
        return Received(reply=self._whoareyou(src_id, address, packet.nonce, known(src_id)))

    def _whoareyou(self, src_id: bytes, address: Address, request_nonce: bytes, record: enr_codec.Enr | None) -> bytes:
        id_nonce = self.random(ID_NONCE_SIZE)
        enr_seq = record.seq if record is not None else 0
        authdata = id_nonce + enr_seq.to_bytes(8, "big")
        packet, challenge_data = encode_packet(
            src_id, FLAG_WHOAREYOU, request_nonce, authdata, iv=self.random(IV_SIZE), protocol_id=self.protocol_id
        )
        _put(self._challenges, (src_id, address), _Challenge(challenge_data, record), MAX_CHALLENGES)
        return packet

    def _on_whoareyou(self, packet: Packet, address: Address) -> Received:
        pending = self._pending.pop(packet.nonce, None)
        if pending is None:
            raise Discv5Error("WHOAREYOU for no request of ours")
        if pending.record is None:
            raise Discv5Error("WHOAREYOU from a node whose record we do not have")
        challenge_data = packet.iv + packet.header
        their_seq = int.from_bytes(packet.authdata[ID_NONCE_SIZE:], "big")
        ephemeral = PrivateKey(self.random(32))
        ephemeral_public = ephemeral.public_key.format(compressed=True)
        secret = ecdh(pending.record.public_key, ephemeral.secret)
        initiator_key, recipient_key = derive_keys(secret, self.local_id, pending.dest_id, challenge_data)
        signature = id_sign(self.private_key, challenge_data, ephemeral_public, pending.dest_id)
        own = self.record()
        authdata = encode_handshake_authdata(
            self.local_id, signature, ephemeral_public, own.raw if their_seq < own.seq else None
        )
        _put(
            self._sessions,
            (pending.dest_id, address),
            _Session(initiator_key, recipient_key, pending.record),
            MAX_SESSIONS,
        )
        packet_out = self._sealed(
            pending.dest_id, FLAG_HANDSHAKE, self.random(NONCE_SIZE), authdata, pending.plaintext, initiator_key
        )
        return Received(reply=packet_out, node_id=pending.dest_id)

    def _on_handshake(
        self, packet: Packet, address: Address, known: Callable[[bytes], enr_codec.Enr | None]
    ) -> Received:
        handshake = decode_handshake_authdata(packet.authdata)
        challenge = self._challenges.pop((handshake.src_id, address), None)
        if challenge is None:
            raise Discv5Error("handshake without a WHOAREYOU of ours")
        record = challenge.known
        if handshake.record is not None:
            try:
                carried = enr_codec.decode(handshake.record)
            except ProtocolError as exc:
                raise Discv5Error(f"handshake record: {exc}") from None
            if node_id(carried.public_key) != handshake.src_id:
                raise Discv5Error("handshake record is not the sender's")
            if record is None or carried.seq >= record.seq:
                record = carried
        if record is None:
            record = known(handshake.src_id)
        if record is None:
            raise Discv5Error("handshake without a record from a node we do not know")
        if not id_verify(
            record.public_key,
            handshake.signature,
            challenge.challenge_data,
            handshake.ephemeral_key,
            self.local_id,
        ):
            raise Discv5Error("handshake signature does not verify")
        secret = ecdh(handshake.ephemeral_key, self.private_key)
        initiator_key, recipient_key = derive_keys(secret, handshake.src_id, self.local_id, challenge.challenge_data)
        plaintext = decrypt(initiator_key, packet.nonce, packet.message, packet.associated_data)
        _put(
            self._sessions,
            (handshake.src_id, address),
            _Session(recipient_key, initiator_key, record),
            MAX_SESSIONS,
        )
        return Received(message=decode_message(plaintext), node_id=handshake.src_id, record=record)


def _put(table: collections.OrderedDict[Any, Any], key: Any, value: Any, limit: int) -> None:
    table[key] = value
    table.move_to_end(key)
    while len(table) > limit:
        table.popitem(last=False)


def nodes_messages(request_id: bytes, records: Sequence[bytes]) -> list[Message]:
    """NODES answers carrying ``records`` (at most :data:`MAX_NODES`), a few
    a message so that each packet stays under 1280 bytes."""
    records = list(records)[:MAX_NODES]
    chunks = [records[i : i + NODES_PER_MESSAGE] for i in range(0, len(records), NODES_PER_MESSAGE)] or [[]]
    return [nodes(request_id, len(chunks), chunk) for chunk in chunks]
