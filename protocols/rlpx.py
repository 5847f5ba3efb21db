"""devp2p RLPx without I/O: the EIP-8 handshake, frames and the base protocol.

Three objects, each taking bytes and returning bytes or events:

- :class:`Handshake`: the ECIES key exchange, as initiator (the dialer) or
  recipient. It sends EIP-8 packets and accepts EIP-8 and pre-EIP-8 ones,
  answering a pre-EIP-8 auth with a pre-EIP-8 ack as go-ethereum did. Once
  :attr:`Handshake.secrets` is set the session keys are known.
- :class:`FrameCodec`: RLPx frames over those keys (AES-256-CTR and the
  keccak/AES "MAC contraption" of go-ethereum ``p2p/rlpx``).
- :class:`Connection`: the devp2p base protocol on top of the frames:
  Hello, Disconnect, Ping, Pong and capability messages, snappy-compressed
  once both Hellos announce version 5 or more.

Wire behaviour follows go-ethereum (``p2p/rlpx/rlpx.go``, ``p2p/peer.go``,
``p2p/transport.go``) where the specs leave room. Every malformed,
unauthenticated or oversized input raises
:class:`~wakustore.protocols.errors.RLPxError`; after one, the object refuses
further input.
"""

from __future__ import annotations

import hmac
import secrets as _random
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import ParamSpec, Protocol, TypeVar, Union, cast

import coincurve
import cramjam
import rlp
from Crypto.Cipher import AES
from Crypto.Hash import keccak as _keccak
from rlp.codec import consume_length_prefix
from rlp.exceptions import RLPException

from wakustore.protocols import ecies
from wakustore.protocols.crypto import keccak256
from wakustore.protocols.errors import RLPxError, WakuV1Error
from wakustore.protocols.waku_v1 import RlpItem, decode_rlp, rlp_uint, split_rlp_list

# --- limits and constants ------------------------------------------------------

# Handshake (go-ethereum p2p/rlpx/rlpx.go: sigLen, pubLen, shaLen, authMsgV4).
AUTH_VERSION = 4
SIGNATURE_SIZE = 65  # R || S || V, V in {0, 1}
NONCE_SIZE = 32
# Pre-EIP-8 packets have fixed sizes: go-ethereum's encAuthMsgLen
# (sig 65 + keccak(ephemeral key) 32 + pubkey 64 + nonce 32 + flag 1 + ECIES
# overhead 113) and encAuthRespLen (pubkey 64 + nonce 32 + flag 1 + 113).
LEGACY_AUTH_SIZE = 307
LEGACY_ACK_SIZE = 210
# The EIP-8 size prefix is a big-endian uint16, and go-ethereum's readMsg
# accepts any value it holds: no handshake packet is longer than this.
MAX_HANDSHAKE_PACKET_SIZE = 2 + 0xFFFF
# EIP-8: pad auth-body with at least 100 bytes so it cannot be mistaken for
# a pre-EIP-8 packet; a random amount in [100, 300] is recommended.
MIN_PADDING = 100
MAX_PADDING = 300
# Nesting allowed in the forward-compatible tail of auth/ack bodies and Hello
# (go-ethereum sets no depth limit; the size limits bound the work anyway).
MAX_RLP_DEPTH = 16

# Frames (go-ethereum p2p/rlpx/rlpx.go).
FRAME_HEADER_SIZE = 16
MAC_SIZE = 16
# frame-size is a 3-byte field and go-ethereum refuses to write more
# (maxUint24, errPlainMessageTooLarge); the default read limit is the same.
MAX_FRAME_SIZE = 2**24 - 1
# go-ethereum rejects a snappy payload that decodes to more than maxUint24
# bytes ("message length >= 16MB") before decompressing it.
MAX_MESSAGE_SIZE = 2**24 - 1
# header-data: rlp.list(capability-id, context-id), both zero; go-ethereum's
# zeroHeader, and ignored on receipt as go-ethereum does.
_ZERO_HEADER_DATA = b"\xc2\x80\x80"

# Base protocol (go-ethereum p2p/peer.go).
BASE_PROTOCOL_VERSION = 5
SNAPPY_PROTOCOL_VERSION = 5  # snappyProtocolVersion
BASE_PROTOCOL_LENGTH = 16  # codes 0x00-0x0f; capabilities follow
MAX_HELLO_SIZE = 2 * 1024  # baseProtocolMaxMsgSize
PING_INTERVAL_S = 15  # pingInterval, seconds
NODE_ID_SIZE = 64
HELLO, DISCONNECT, PING, PONG = 0x00, 0x01, 0x02, 0x03
_EMPTY_LIST = b"\xc0"  # the payload of Ping and Pong

# Disconnect reasons (go-ethereum p2p/peer_error.go DiscReason).
DISCONNECT_REQUESTED = 0x00
DISCONNECT_NETWORK_ERROR = 0x01
DISCONNECT_PROTOCOL_ERROR = 0x02
DISCONNECT_USELESS_PEER = 0x03
DISCONNECT_TOO_MANY_PEERS = 0x04
DISCONNECT_ALREADY_CONNECTED = 0x05
DISCONNECT_INCOMPATIBLE_VERSION = 0x06
DISCONNECT_INVALID_IDENTITY = 0x07
DISCONNECT_QUITTING = 0x08
DISCONNECT_UNEXPECTED_IDENTITY = 0x09
DISCONNECT_SELF = 0x0A
DISCONNECT_READ_TIMEOUT = 0x0B
DISCONNECT_SUBPROTOCOL_ERROR = 0x10
DISCONNECT_REASONS = {
    DISCONNECT_REQUESTED: "disconnect requested",
    DISCONNECT_NETWORK_ERROR: "network error",
    DISCONNECT_PROTOCOL_ERROR: "breach of protocol",
    DISCONNECT_USELESS_PEER: "useless peer",
    DISCONNECT_TOO_MANY_PEERS: "too many peers",
    DISCONNECT_ALREADY_CONNECTED: "already connected",
    DISCONNECT_INCOMPATIBLE_VERSION: "incompatible p2p protocol version",
    DISCONNECT_INVALID_IDENTITY: "invalid node identity",
    DISCONNECT_QUITTING: "client quitting",
    DISCONNECT_UNEXPECTED_IDENTITY: "unexpected identity",
    DISCONNECT_SELF: "connected to self",
    DISCONNECT_READ_TIMEOUT: "read timeout",
    DISCONNECT_SUBPROTOCOL_ERROR: "subprotocol error",
}

# Waku v1 capability (status-go waku/v1/const.go: Name, NumberOfMessageCodes).
WAKU_CAPABILITY_NAME = "waku"
WAKU_V1_VERSION = 1
WAKU_V1_CODE_COUNT = 128

_MAX_UINT64 = 2**64 - 1

_P = ParamSpec("_P")
_T = TypeVar("_T")


# --- handshake -----------------------------------------------------------------


class MacState(Protocol):
    """A running keccak-256 state, as :class:`Secrets` holds one per direction."""

    def update(self, data: bytes, /) -> object: ...

    def digest(self) -> bytes: ...


@dataclass
class Secrets:
    """Session keys of one side of an RLPx connection.

    ``egress_mac`` and ``ingress_mac`` are running keccak-256 states
    (``update(bytes)`` / ``digest()``), seeded as go-ethereum does; the
    :class:`FrameCodec` built from these secrets advances them.
    """

    remote_public_key: bytes  # 64 bytes, the peer's node id
    aes_secret: bytes  # 32 bytes, AES-256-CTR key of both directions
    mac_secret: bytes  # 32 bytes, AES-256 key of the frame MACs
    egress_mac: MacState
    ingress_mac: MacState


class Handshake:
    """The RLPx ECIES handshake of one side.

    Initiator::

        hs = Handshake(key, remote_public_key=node_id)
        send(hs.initiate())
        while not hs.complete: send(hs.receive_data(recv()))

    Recipient: the same without ``remote_public_key`` and ``initiate()``;
    :meth:`receive_data` returns the ack to send. Once :attr:`complete`,
    :attr:`secrets` holds the session keys and :attr:`trailing_data` the
    bytes received after the handshake packet (the start of the frames).

    ``ephemeral_key`` (32 bytes) and ``nonce`` (32 bytes) are random unless
    given; fixing them is for reproducible tests only.
    """

    def __init__(
        self,
        private_key: bytes,
        remote_public_key: bytes | None = None,
        *,
        ephemeral_key: bytes | None = None,
        nonce: bytes | None = None,
    ):
        self.initiator = remote_public_key is not None
        self._key = bytes(private_key)
        self.public_key = ecies.public_key_of(self._key)
        self._ephemeral = coincurve.PrivateKey(ephemeral_key if ephemeral_key is not None else _random.token_bytes(32))
        self._nonce = nonce if nonce is not None else _random.token_bytes(NONCE_SIZE)
        if len(self._nonce) != NONCE_SIZE:
            raise ValueError(f"nonce must be {NONCE_SIZE} bytes")
        self._remote = (
            ecies.parse_public_key(remote_public_key).format(compressed=False)[1:]
            if remote_public_key is not None
            else None
        )
        self._remote_ephemeral: bytes | None = None
        self._remote_nonce: bytes | None = None
        self._auth: bytes | None = None
        self._buffer = bytearray()
        self._failed = False
        self.legacy = False
        """True when the peer used the pre-EIP-8 format."""
        self.secrets: Secrets | None = None
        self.trailing_data = b""

    @property
    def complete(self) -> bool:
        return self.secrets is not None

    def initiate(self) -> bytes:
        """The EIP-8 auth packet; initiator only, once."""
        if not self.initiator or self._auth is not None:
            raise RuntimeError("initiate() is for a fresh initiator handshake only")
        assert self._remote is not None  # an initiator is given the remote key
        static_shared = ecies.ecdh_x(self._key, self._remote)
        signature = self._ephemeral.sign_recoverable(_xor(static_shared, self._nonce), hasher=None)
        body: list[bytes | int] = [signature, self.public_key, self._nonce, AUTH_VERSION]
        self._auth = _seal_eip8(self._remote, body)
        return self._auth

    def receive_data(self, data: bytes) -> bytes:
        """Feed received bytes; returns the bytes to send (possibly empty)."""
        if self._failed:
            raise RLPxError("handshake has already failed")
        if self.complete:
            raise RuntimeError("the handshake is complete: feed the Connection instead")
        if self.initiator and self._auth is None:
            raise RuntimeError("call initiate() before receive_data()")
        self._buffer += data
        try:
            if self.initiator:
                return self._receive_ack()
            return self._receive_auth()
        except RLPxError:
            self._failed = True
            self._buffer.clear()
            raise

    def receive_eof(self) -> None:
        """The peer closed the connection; an error unless the handshake is done."""
        if not self.complete:
            raise RLPxError("connection closed during the handshake")

    @property
    def buffered(self) -> int:
        """Bytes of an incomplete handshake packet held (at most
        MAX_HANDSHAKE_PACKET_SIZE plus one receive_data call's bytes)."""
        return len(self._buffer)

    def _receive_auth(self) -> bytes:
        taken = self._take_packet(LEGACY_AUTH_SIZE)
        if taken is None:
            return b""
        packet, plain = taken
        if self.legacy:
            signature = plain[:SIGNATURE_SIZE]
            # The 32 bytes after the signature are keccak(ephemeral key), unused.
            pos = SIGNATURE_SIZE + 32
            remote = plain[pos : pos + ecies.PUBLIC_KEY_SIZE]
            pos += ecies.PUBLIC_KEY_SIZE
            remote_nonce = plain[pos : pos + NONCE_SIZE]
        else:
            signature, remote, remote_nonce = _decode_body(
                plain, (SIGNATURE_SIZE, ecies.PUBLIC_KEY_SIZE, NONCE_SIZE), "auth"
            )
        self._remote = ecies.parse_public_key(remote).format(compressed=False)[1:]
        self._remote_nonce = remote_nonce
        static_shared = ecies.ecdh_x(self._key, self._remote)
        self._remote_ephemeral = _recover(signature, _xor(static_shared, remote_nonce))
        own_ephemeral = self._ephemeral.public_key.format(compressed=False)[1:]
        if self.legacy:
            ack = ecies.encrypt(self._remote, own_ephemeral + self._nonce + b"\x00")
        else:
            ack = _seal_eip8(self._remote, [own_ephemeral, self._nonce, AUTH_VERSION])
        self._finish(auth=packet, ack=ack)
        return ack

    def _receive_ack(self) -> bytes:
        taken = self._take_packet(LEGACY_ACK_SIZE)
        if taken is None:
            return b""
        packet, plain = taken
        if self.legacy:
            remote_ephemeral = plain[: ecies.PUBLIC_KEY_SIZE]
            remote_nonce = plain[ecies.PUBLIC_KEY_SIZE : ecies.PUBLIC_KEY_SIZE + NONCE_SIZE]
        else:
            remote_ephemeral, remote_nonce = _decode_body(plain, (ecies.PUBLIC_KEY_SIZE, NONCE_SIZE), "ack")
        ecies.parse_public_key(remote_ephemeral)
        self._remote_ephemeral = remote_ephemeral
        self._remote_nonce = remote_nonce
        assert self._auth is not None  # receive_data() refuses an initiator before initiate()
        self._finish(auth=self._auth, ack=packet)
        return b""

    def _take_packet(self, legacy_size: int) -> tuple[bytes, bytes] | None:
        """The next complete handshake packet and its plaintext, or None."""
        buf = self._buffer
        if not buf:
            return None
        if buf[0] == 0x04:
            # A pre-EIP-8 packet starts with its ECIES key tag. An EIP-8 one
            # starting with 0x04 announces >= 1024 bytes, so reading the
            # legacy size first never stalls it (EIP-8's suggested logic).
            if len(buf) < legacy_size:
                return None
            candidate = bytes(buf[:legacy_size])
            try:
                plain = ecies.decrypt(self._key, candidate)
            except RLPxError:
                pass
            else:
                del buf[:legacy_size]
                self.legacy = True
                return self._done_reading(candidate, plain)
        if len(buf) < 2:
            return None
        size = int.from_bytes(buf[:2], "big")
        if size <= ecies.ECIES_OVERHEAD:
            raise RLPxError(f"handshake packet size {size} is too small")
        if len(buf) < 2 + size:
            return None
        packet = bytes(buf[: 2 + size])
        del buf[: 2 + size]
        return self._done_reading(packet, ecies.decrypt(self._key, packet[2:], packet[:2]))

    def _done_reading(self, packet: bytes, plain: bytes) -> tuple[bytes, bytes]:
        self.trailing_data = bytes(self._buffer)
        self._buffer.clear()
        return packet, plain

    def _finish(self, *, auth: bytes, ack: bytes) -> None:
        # Both packets are read: the remote key, ephemeral key and nonce are known.
        assert self._remote is not None and self._remote_ephemeral is not None and self._remote_nonce is not None
        ecdhe = ecies.ecdh_x(self._ephemeral.secret, self._remote_ephemeral)
        init_nonce, resp_nonce = (
            (self._nonce, self._remote_nonce) if self.initiator else (self._remote_nonce, self._nonce)
        )
        shared = keccak256(ecdhe + keccak256(resp_nonce + init_nonce))
        aes_secret = keccak256(ecdhe + shared)
        mac_secret = keccak256(ecdhe + aes_secret)
        # mac1 covers what the initiator sent, mac2 what the recipient sent.
        mac1 = _keccak_state(_xor(mac_secret, resp_nonce) + auth)
        mac2 = _keccak_state(_xor(mac_secret, init_nonce) + ack)
        egress, ingress = (mac1, mac2) if self.initiator else (mac2, mac1)
        self.secrets = Secrets(self._remote, aes_secret, mac_secret, egress, ingress)


def _seal_eip8(remote: bytes, body: list[bytes | int]) -> bytes:
    padding = MIN_PADDING + _random.randbelow(MAX_PADDING - MIN_PADDING + 1)
    plain = rlp.encode(body) + bytes(padding)
    prefix = (len(plain) + ecies.ECIES_OVERHEAD).to_bytes(2, "big")
    return prefix + ecies.encrypt(remote, plain, prefix)


def _decode_body(plain: bytes, sizes: tuple[int, ...], what: str) -> list[bytes]:
    """The fixed-size leading strings of an EIP-8 auth or ack body.

    Like go-ethereum: the version must be an integer but its value is not
    checked; further list elements and data after the list are ignored.
    """
    try:
        _, kind, length, start = consume_length_prefix(plain, 0)
    except (RLPException, IndexError):
        raise RLPxError(f"{what}: malformed rlp") from None
    if kind is not list:
        raise RLPxError(f"{what}: body is not an rlp list")
    items = _rlp(split_rlp_list, plain[: start + length], max_size=len(plain), max_depth=MAX_RLP_DEPTH)
    if len(items) < len(sizes) + 1:
        raise RLPxError(f"{what}: {len(items)} list elements, need {len(sizes) + 1}")
    fields = []
    for raw, size in zip(items, sizes):
        value = _rlp_string(raw, what)
        if len(value) != size:
            raise RLPxError(f"{what}: field of {len(value)} bytes, expected {size}")
        fields.append(value)
    _rlp_int(items[len(sizes)], _MAX_UINT64, f"{what} version")
    return fields


def _recover(signature: bytes, digest: bytes) -> bytes:
    if signature[64] > 3:
        raise RLPxError("auth: invalid signature recovery id")
    try:
        key = coincurve.PublicKey.from_signature_and_message(signature, digest, hasher=None)
    except ValueError:
        raise RLPxError("auth: signature does not recover a key") from None
    return key.format(compressed=False)[1:]


# --- frames --------------------------------------------------------------------


class FrameCodec:
    """RLPx frames: ``encode_frame(content)`` and ``receive_data(bytes)``.

    A frame on the wire is header (16, encrypted) || header MAC (16) ||
    content padded with zeros to a multiple of 16 (encrypted) || frame MAC
    (16). Frames whose announced size exceeds ``max_frame_size`` bytes are
    refused as soon as their header is authenticated, so at most one
    header, one padded frame and its MAC are ever buffered beyond the
    bytes of the current :meth:`receive_data` call.
    """

    def __init__(self, secrets: Secrets, *, max_frame_size: int = MAX_FRAME_SIZE):
        if not 0 < max_frame_size <= MAX_FRAME_SIZE:
            raise ValueError(f"max_frame_size must be in [1, {MAX_FRAME_SIZE}]")
        # One key, a zero IV and a separate counter per direction: the key
        # is ephemeral (go-ethereum InitWithSecrets).
        self._enc = AES.new(secrets.aes_secret, AES.MODE_CTR, nonce=b"", initial_value=0)
        self._dec = AES.new(secrets.aes_secret, AES.MODE_CTR, nonce=b"", initial_value=0)
        self._mac_cipher = AES.new(secrets.mac_secret, AES.MODE_ECB)
        self._egress = secrets.egress_mac
        self._ingress = secrets.ingress_mac
        self.max_frame_size = max_frame_size
        self._buffer = bytearray()
        self._pending: int | None = None  # size of a frame whose header was read
        self._failed = False

    def encode_frame(self, content: bytes) -> bytes:
        """Encrypt and authenticate one frame of ``content`` (< 16 MiB)."""
        size = len(content)
        if size > MAX_FRAME_SIZE:
            raise RLPxError(f"frame of {size} bytes exceeds {MAX_FRAME_SIZE}")
        header = size.to_bytes(3, "big") + _ZERO_HEADER_DATA
        header = self._enc.encrypt(header + bytes(FRAME_HEADER_SIZE - len(header)))
        body = self._enc.encrypt(bytes(content) + bytes(_padding(size)))
        return header + self._header_mac(self._egress, header) + body + self._frame_mac(self._egress, body)

    def receive_data(self, data: bytes) -> list[bytes]:
        """Feed received bytes; returns the contents of the completed frames."""
        if self._failed:
            raise RLPxError("frame stream has already failed")
        self._buffer += data
        try:
            return self._read_frames()
        except RLPxError:
            self._failed = True
            self._buffer.clear()
            raise

    def receive_eof(self) -> None:
        """The peer closed the connection; an error if it cut a frame short."""
        if self._buffer or self._pending is not None:
            raise RLPxError("connection closed inside a frame")

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as a frame."""
        return len(self._buffer)

    def _read_frames(self) -> list[bytes]:
        frames: list[bytes] = []
        buf = self._buffer
        while True:
            if self._pending is None:
                if len(buf) < FRAME_HEADER_SIZE + MAC_SIZE:
                    return frames
                header = bytes(buf[:FRAME_HEADER_SIZE])
                mac = bytes(buf[FRAME_HEADER_SIZE : FRAME_HEADER_SIZE + MAC_SIZE])
                if not hmac.compare_digest(self._header_mac(self._ingress, header), mac):
                    raise RLPxError("bad header MAC")
                size = int.from_bytes(self._dec.decrypt(header)[:3], "big")
                if size > self.max_frame_size:
                    raise RLPxError(f"frame of {size} bytes exceeds {self.max_frame_size}")
                del buf[: FRAME_HEADER_SIZE + MAC_SIZE]
                self._pending = size
            padded = self._pending + _padding(self._pending)
            if len(buf) < padded + MAC_SIZE:
                return frames
            body = bytes(buf[:padded])
            mac = bytes(buf[padded : padded + MAC_SIZE])
            if not hmac.compare_digest(self._frame_mac(self._ingress, body), mac):
                raise RLPxError("bad frame MAC")
            frames.append(self._dec.decrypt(body)[: self._pending])
            del buf[: padded + MAC_SIZE]
            self._pending = None

    def _header_mac(self, state: MacState, header_ciphertext: bytes) -> bytes:
        return self._mac(state, state.digest(), header_ciphertext)

    def _frame_mac(self, state: MacState, body_ciphertext: bytes) -> bytes:
        state.update(body_ciphertext)
        seed = state.digest()
        return self._mac(state, seed, seed[:MAC_SIZE])

    def _mac(self, state: MacState, digest: bytes, seed: bytes) -> bytes:
        # go-ethereum hashMAC.compute: encrypt the current digest, xor the
        # seed in, hash that in and take 16 bytes of the new digest.
        block = self._mac_cipher.encrypt(digest[:16])
        state.update(_xor(block, seed))
        return state.digest()[:MAC_SIZE]


# --- base protocol -------------------------------------------------------------


@dataclass(frozen=True)
class Capability:
    name: str
    version: int


@dataclass(frozen=True)
class Hello:
    """The Hello message (code 0x00); also the event for the peer's one.

    Encoded as ``[protocol_version, client_id, [[name, version], ...],
    listen_port, node_id]``; further list elements are ignored (EIP-8).
    """

    protocol_version: int
    client_id: str
    capabilities: tuple[Capability, ...]
    listen_port: int
    node_id: bytes  # 64 bytes: the sender's public key without 0x04

    def encode(self) -> bytes:
        caps = [[c.name.encode(), c.version] for c in self.capabilities]
        return cast(
            bytes,
            rlp.encode(
                [
                    self.protocol_version,
                    self.client_id.encode(),
                    caps,
                    self.listen_port,
                    self.node_id,
                ]
            ),
        )

    @classmethod
    def decode(cls, payload: bytes) -> Hello:
        """Decode like go-ethereum's readProtocolHandshake (2 KiB at most)."""
        if len(payload) > MAX_HELLO_SIZE:
            raise RLPxError(f"Hello of {len(payload)} bytes exceeds {MAX_HELLO_SIZE}")
        items = _rlp(split_rlp_list, payload, max_size=MAX_HELLO_SIZE, max_depth=MAX_RLP_DEPTH)
        if len(items) < 5:
            raise RLPxError(f"Hello has {len(items)} elements, need 5")
        version = _rlp_int(items[0], _MAX_UINT64, "Hello version")
        client_id = _rlp_string(items[1], "Hello client id").decode("utf-8", "replace")
        cap_items = _rlp(decode_rlp, items[2], max_size=MAX_HELLO_SIZE, max_depth=2, max_items=MAX_HELLO_SIZE)
        if not isinstance(cap_items, list):
            raise RLPxError("Hello capabilities are not a list")
        caps = []
        for cap in cap_items:
            if not isinstance(cap, list) or len(cap) != 2 or not isinstance(cap[0], bytes):
                raise RLPxError("Hello capability is not [name, version]")
            name = cap[0].decode("utf-8", "replace")
            caps.append(Capability(name, _int(cap[1], _MAX_UINT64, "capability version")))
        port = _rlp_int(items[3], _MAX_UINT64, "Hello listen port")
        node_id = _rlp_string(items[4], "Hello node id")
        if len(node_id) != NODE_ID_SIZE or not any(node_id):
            raise RLPxError("invalid node identity in Hello")
        return cls(version, client_id, tuple(caps), port, node_id)


@dataclass(frozen=True)
class Disconnect:
    """The peer's Disconnect; ``reason`` is None when it could not be read."""

    reason: int | None

    @property
    def description(self) -> str:
        if self.reason is None:
            return "invalid disconnect reason"
        return DISCONNECT_REASONS.get(self.reason, f"unknown disconnect reason {self.reason}")


@dataclass(frozen=True)
class Ping:
    pass


@dataclass(frozen=True)
class Pong:
    pass


@dataclass(frozen=True)
class Message:
    """A capability message: ``code`` as on the wire (>= 0x10), payload
    decompressed."""

    code: int
    payload: bytes


Event = Union[Hello, Disconnect, Ping, Pong, Message]  # noqa: UP007  (a runtime alias, as isinstance reads it)


class Connection:
    """The devp2p base protocol over an established RLPx session.

    Call :meth:`send_hello` first; the peer's Hello arrives as a
    :class:`Hello` event, and only then may capability messages be sent.
    Ping events are not answered automatically: send :meth:`send_pong`.
    After a Disconnect in either direction the connection is closed:
    :meth:`receive_data` returns nothing more and sending is refused.
    Received payloads are bounded by ``max_message_size`` bytes after
    decompression and frames by ``max_frame_size``.
    """

    def __init__(
        self,
        secrets: Secrets,
        local_hello: Hello,
        *,
        max_frame_size: int = MAX_FRAME_SIZE,
        max_message_size: int = MAX_MESSAGE_SIZE,
    ):
        self._codec = FrameCodec(secrets, max_frame_size=max_frame_size)
        self._remote_id = secrets.remote_public_key
        self.local_hello = local_hello
        self.remote_hello: Hello | None = None
        self.max_message_size = max_message_size
        self.snappy = False
        self.closed = False
        self._hello_sent = False
        self._failed = False

    @classmethod
    def from_handshake(cls, handshake: Handshake, local_hello: Hello, **limits: int) -> tuple[Connection, list[Event]]:
        """A connection for a completed handshake and the events of the
        bytes that arrived right behind the handshake packet."""
        if not handshake.complete:
            raise RuntimeError("the handshake is not complete")
        assert handshake.secrets is not None  # what complete means
        connection = cls(handshake.secrets, local_hello, **limits)
        return connection, connection.receive_data(handshake.trailing_data)

    @property
    def buffered(self) -> int:
        """Bytes received but not yet decoded into an event."""
        return self._codec.buffered

    def send_hello(self) -> bytes:
        """Our Hello (never compressed); once."""
        if self._hello_sent:
            raise RLPxError("Hello was already sent")
        self._hello_sent = True
        return self._frame(HELLO, self.local_hello.encode(), compress=False)

    def send_message(self, code: int, payload: bytes) -> bytes:
        """A message with wire ``code`` (see :func:`to_wire_code`)."""
        if not self._hello_sent or self.remote_hello is None:
            raise RLPxError("messages can only be sent after both Hellos")
        return self._frame(code, payload, compress=self.snappy)

    def send_ping(self) -> bytes:
        return self.send_message(PING, _EMPTY_LIST)

    def send_pong(self) -> bytes:
        return self.send_message(PONG, _EMPTY_LIST)

    def send_disconnect(self, reason: int = DISCONNECT_REQUESTED) -> bytes:
        """``[reason]``; allowed at any time, closes the connection."""
        data = self._frame(DISCONNECT, rlp.encode([reason]), compress=self.snappy)
        self.closed = True
        return data

    def receive_data(self, data: bytes) -> list[Event]:
        """Feed received bytes; returns the events they complete."""
        if self._failed:
            raise RLPxError("connection has already failed")
        if self.closed:
            return []
        events: list[Event] = []
        try:
            for content in self._codec.receive_data(data):
                event = self._handle(*_split_code(content))
                if event is not None:
                    events.append(event)
                if self.closed:
                    break
        except RLPxError:
            self._failed = True
            raise
        return events

    def receive_eof(self) -> None:
        """The peer closed the connection; an error if it cut a frame short."""
        if not self.closed:
            self._codec.receive_eof()

    def _handle(self, code: int, payload: bytes) -> Event | None:
        if code == DISCONNECT:
            self.closed = True
            return Disconnect(self._disconnect_reason(payload))
        if self.remote_hello is None:
            if code != HELLO:
                raise RLPxError(f"expected Hello, got message code {code:#x}")
            hello = Hello.decode(payload)
            if hello.node_id != self._remote_id:
                raise RLPxError("Hello node id differs from the handshake identity")
            self.remote_hello = hello
            versions = (hello.protocol_version, self.local_hello.protocol_version)
            self.snappy = min(versions) >= SNAPPY_PROTOCOL_VERSION
            return hello
        if self.snappy:
            payload = _snappy_decompress(payload, self.max_message_size)
        elif len(payload) > self.max_message_size:
            raise RLPxError(f"message of {len(payload)} bytes exceeds {self.max_message_size}")
        if code == PING:
            return Ping()
        if code == PONG:
            return Pong()
        if code < BASE_PROTOCOL_LENGTH:
            return None  # other base-protocol codes are ignored, as go-ethereum does
        return Message(code, payload)

    def _disconnect_reason(self, payload: bytes) -> int | None:
        # Accept it compressed or not: some peers (ethereumjs) never compress it.
        candidates = [payload]
        if self.snappy:
            try:
                candidates.insert(0, _snappy_decompress(payload, MAX_HELLO_SIZE))
            except RLPxError:
                pass
        for candidate in candidates:
            reason = _decode_reason(candidate)
            if reason is not None:
                return reason
        return None

    def _frame(self, code: int, payload: bytes, *, compress: bool) -> bytes:
        if self.closed:
            raise RLPxError("connection is closed")
        if len(payload) > MAX_MESSAGE_SIZE:
            raise RLPxError(f"message of {len(payload)} bytes exceeds {MAX_MESSAGE_SIZE}")
        if compress:
            payload = bytes(cramjam.snappy.compress_raw(bytes(payload)))
        return self._codec.encode_frame(rlp.encode(code) + payload)


# --- capabilities --------------------------------------------------------------


@dataclass(frozen=True)
class SharedCapability:
    """A capability both sides run, with its wire code range
    ``[offset, offset + length)``."""

    name: str
    version: int
    offset: int
    length: int


def match_capabilities(local: Mapping[Capability, int], remote: Iterable[Capability]) -> dict[str, SharedCapability]:
    """Capabilities in common and their code offsets, as go-ethereum's
    matchProtocols assigns them: sorted by name then version, the highest
    shared version of each name kept, offsets from 0x10 in that order.
    ``local`` maps each capability we run to its number of message codes.
    """
    result: dict[str, SharedCapability] = {}
    offset = BASE_PROTOCOL_LENGTH
    for cap in sorted(set(remote), key=lambda c: (c.name, c.version)):
        length = local.get(cap)
        if length is None:
            continue
        old = result.get(cap.name)
        if old is not None:
            offset -= old.length
        result[cap.name] = SharedCapability(cap.name, cap.version, offset, length)
        offset += length
    return result


def to_wire_code(code: int, *, offset: int = BASE_PROTOCOL_LENGTH, length: int = WAKU_V1_CODE_COUNT) -> int:
    """A capability's message code as sent: ``offset + code``. The defaults
    are Waku v1 as the first capability (waku packet ``c`` is ``0x10 + c``)."""
    if not 0 <= code < length:
        raise ValueError(f"message code {code} is outside [0, {length})")
    return offset + code


def from_wire_code(wire_code: int, *, offset: int = BASE_PROTOCOL_LENGTH, length: int = WAKU_V1_CODE_COUNT) -> int:
    """The capability's own code of a received wire code."""
    if not offset <= wire_code < offset + length:
        raise RLPxError(f"message code {wire_code:#x} is out of range")
    return wire_code - offset


# --- helpers -------------------------------------------------------------------


def _split_code(content: bytes) -> tuple[int, bytes]:
    """Frame content = rlp(code) || payload; the code a canonical uint64."""
    try:
        _, kind, length, start = consume_length_prefix(content, 0)
    except (RLPException, IndexError):
        raise RLPxError("invalid message code") from None
    end = start + length
    if kind is not bytes or end > len(content):
        raise RLPxError("invalid message code")
    return _int(content[start:end], _MAX_UINT64, "message code"), content[end:]


def _snappy_decompress(data: bytes, limit: int) -> bytes:
    """Snappy block format, refusing to inflate past ``limit`` bytes."""
    size, shift = 0, 0
    for byte in data[:10]:
        size |= (byte & 0x7F) << shift
        if byte < 0x80:
            break
        shift += 7
    else:
        raise RLPxError("snappy: corrupt length header")
    if size > limit:
        raise RLPxError(f"decompressed message of {size} bytes exceeds {limit}")
    try:
        out = bytes(cramjam.snappy.decompress_raw(bytes(data)))
    except (cramjam.DecompressionError, ValueError, TypeError):
        raise RLPxError("snappy: corrupt input") from None
    if len(out) != size:
        raise RLPxError("snappy: length header does not match the data")
    return out


def _decode_reason(payload: bytes) -> int | None:
    """go-ethereum's decodeDisconnectMessage: ``[reason, ...]`` or a bare reason."""
    try:
        item = decode_rlp(payload, max_size=MAX_HELLO_SIZE, max_depth=MAX_RLP_DEPTH, max_items=MAX_HELLO_SIZE)
        if isinstance(item, list):
            if not item:
                return None
            item = item[0]
        return rlp_uint(item, 0xFF, "disconnect reason")
    except WakuV1Error:
        return None


def _rlp(function: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs) -> _T:
    try:
        return function(*args, **kwargs)
    except WakuV1Error as exc:
        raise RLPxError(str(exc)) from None


def _rlp_string(raw_item: bytes, what: str) -> bytes:
    value = _rlp(decode_rlp, raw_item, max_size=len(raw_item), max_depth=0, max_items=1)
    if not isinstance(value, bytes):
        raise RLPxError(f"{what}: expected a string")
    return value


def _rlp_int(raw_item: bytes, max_value: int, what: str) -> int:
    return _int(_rlp_string(raw_item, what), max_value, what)


def _int(item: RlpItem, max_value: int, what: str) -> int:
    return _rlp(rlp_uint, item, max_value, what)


def _padding(size: int) -> int:
    return -size % 16


def _xor(a: bytes, b: bytes) -> bytes:
    return bytes(x ^ y for x, y in zip(a, b))


def _keccak_state(initial: bytes) -> MacState:
    return _keccak.new(digest_bits=256, data=initial, update_after_digest=True)
