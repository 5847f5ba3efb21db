"""Ethereum Node Records (EIP-778) with Waku's fields (31/WAKU2-ENR).

A record is the RLP list ``[signature, seq, k1, v1, k2, v2, ...]`` with its
keys sorted and unique, at most :data:`MAX_RECORD_SIZE` bytes; its text
form is ``enr:`` and the URL-safe base64 of those bytes, unpadded. Only the
``v4`` identity scheme exists: ``secp256k1`` holds the signer's compressed
public key and ``signature`` is the 64-byte R||S ECDSA signature of
keccak256(RLP([seq, k1, v1, ...])). Integers (``seq``, ports) are minimal
big-endian byte strings.

Waku's keys, as nwaku writes them (``waku/waku_enr/*``):

- ``waku2``: one byte of capability flags (:class:`Capability`).
- ``rs``: the relay shards, u16 BE cluster | u8 count | u16 BE shard each;
  ``rsv`` when there are :data:`SHARD_LIST_MAX` or more: u16 BE cluster |
  a 1024-bit vector (bit ``i`` of byte ``i // 8``, most significant first).
- ``multiaddrs``: (u16 BE length | binary multiaddr) each, without
  ``/p2p/...``: what ``ip``/``tcp`` cannot say (websockets, DNS names).

The record's libp2p peer id is that of its ``secp256k1`` key, so a record
gives a dialable ``/ip4/.../tcp/.../p2p/<peer id>``.
"""

from __future__ import annotations

import base64
import ipaddress
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import IntFlag
from typing import Any

import multiaddr

from wakustore.protocols import crypto
from wakustore.protocols.errors import ProtocolError, WakuV1Error
from wakustore.protocols.waku_v1 import decode_rlp, rlp_encode

# EIP-778: "The maximum encoded size of a node record is 300 bytes."
MAX_RECORD_SIZE = 300
TEXT_PREFIX = "enr:"
# A record has at most (300 - 66) / 2 key/value pairs of one byte each.
MAX_PAIRS = 128
# nwaku's ShardingIndicesListMaxLength: from 64 shards on, the bit vector.
SHARD_LIST_MAX = 64
# Shards a bit vector holds (nwaku's ShardingBitVectorLen * 8).
SHARD_VECTOR_BITS = 1024
SECP256K1_KEY_SIZE = 33
SIGNATURE_SIZE = 64

ID = "id"
SECP256K1 = "secp256k1"
IP, IP6, TCP, TCP6, UDP, UDP6 = "ip", "ip6", "tcp", "tcp6", "udp", "udp6"
WAKU2 = "waku2"
RELAY_SHARDS = "rs"
RELAY_SHARDS_VECTOR = "rsv"
MULTIADDRS = "multiaddrs"


class EnrError(ProtocolError):
    """A record that is malformed, too large, or not signed by its key."""


class Capability(IntFlag):
    """The ``waku2`` flags (31/WAKU2-ENR; nwaku's ``Capabilities``)."""

    RELAY = 1 << 0
    STORE = 1 << 1
    FILTER = 1 << 2
    LIGHTPUSH = 1 << 3
    SYNC = 1 << 4
    MIX = 1 << 5


@dataclass(frozen=True)
class RelayShards:
    cluster: int
    shards: tuple[int, ...]


@dataclass(frozen=True)
class Enr:
    """A verified record: its sequence number, its pairs as raw bytes, and
    its encoding."""

    seq: int
    pairs: Mapping[str, bytes]
    raw: bytes

    @property
    def text(self) -> str:
        return TEXT_PREFIX + base64.urlsafe_b64encode(self.raw).rstrip(b"=").decode()

    @property
    def public_key(self) -> bytes:
        """The signer's compressed secp256k1 key (33 bytes)."""
        return self.pairs[SECP256K1]

    @property
    def peer_id(self) -> str:
        """The libp2p peer id of :attr:`public_key` (base58)."""
        return peer_id_of(self.public_key)

    @property
    def ip(self) -> str | None:
        return _ip(self.pairs.get(IP), 4)

    @property
    def ip6(self) -> str | None:
        return _ip(self.pairs.get(IP6), 16)

    @property
    def tcp(self) -> int | None:
        return _port(self.pairs.get(TCP))

    @property
    def udp(self) -> int | None:
        return _port(self.pairs.get(UDP))

    @property
    def tcp6(self) -> int | None:
        return _port(self.pairs.get(TCP6))

    @property
    def udp6(self) -> int | None:
        return _port(self.pairs.get(UDP6))

    @property
    def capabilities(self) -> Capability | None:
        """The ``waku2`` flags; None for a record without them (not a Waku node)."""
        raw = self.pairs.get(WAKU2)
        if raw is None:
            return None
        if len(raw) != 1:
            raise EnrError(f"waku2 is {len(raw)} bytes, not 1")
        return Capability(raw[0] & 0x3F)

    @property
    def relay_shards(self) -> RelayShards | None:
        """The cluster and shards of ``rs`` or ``rsv``; None without either."""
        if RELAY_SHARDS in self.pairs:
            return decode_shard_list(self.pairs[RELAY_SHARDS])
        if RELAY_SHARDS_VECTOR in self.pairs:
            return decode_shard_vector(self.pairs[RELAY_SHARDS_VECTOR])
        return None

    @property
    def multiaddrs(self) -> list[str]:
        """The ``multiaddrs`` entries as text (without ``/p2p``)."""
        raw = self.pairs.get(MULTIADDRS)
        return [] if raw is None else decode_multiaddrs(raw)

    def dialable(self) -> list[str]:
        """Multiaddrs ending in ``/p2p/<peer id>``: from ``ip``/``tcp``,
        ``ip6``/``tcp6``, then ``multiaddrs``."""
        out = []
        if self.ip is not None and self.tcp is not None:
            out.append(f"/ip4/{self.ip}/tcp/{self.tcp}")
        tcp6 = self.tcp6 if self.tcp6 is not None else self.tcp
        if self.ip6 is not None and tcp6 is not None:
            out.append(f"/ip6/{self.ip6}/tcp/{tcp6}")
        out.extend(self.multiaddrs)
        return [f"{addr}/p2p/{self.peer_id}" for addr in dict.fromkeys(out)]

    def describe(self) -> dict[str, Any]:
        """The record's fields, decoded where known, for people and JSON."""
        out: dict[str, Any] = {"seq": self.seq, "peer_id": self.peer_id, "public_key": self.public_key.hex()}
        for name in ("ip", "tcp", "udp", "ip6", "tcp6", "udp6"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        caps = self.capabilities
        if caps is not None:
            out["waku2"] = [c.name.lower() for c in Capability if c in caps and c.name]
        shards = self.relay_shards
        if shards is not None:
            out["cluster"], out["shards"] = shards.cluster, list(shards.shards)
        if MULTIADDRS in self.pairs:
            out["multiaddrs"] = self.multiaddrs
        out["dialable"] = self.dialable()
        known = {ID, SECP256K1, IP, IP6, TCP, TCP6, UDP, UDP6, WAKU2, RELAY_SHARDS, RELAY_SHARDS_VECTOR, MULTIADDRS}
        other = {k: v.hex() for k, v in self.pairs.items() if k not in known}
        if other:
            out["other"] = other
        return out


# --- records --------------------------------------------------------------------


def decode(record: str | bytes) -> Enr:
    """A record from its text (``enr:...``) or its bytes, checked: size,
    RLP, sorted unique keys, the ``v4`` scheme and its signature."""
    raw = _text_bytes(record) if isinstance(record, str) else bytes(record)
    if len(raw) > MAX_RECORD_SIZE:
        raise EnrError(f"record of {len(raw)} bytes (at most {MAX_RECORD_SIZE})")
    try:
        items = decode_rlp(raw, max_size=MAX_RECORD_SIZE, max_depth=1, max_items=2 * MAX_PAIRS + 3)
    except WakuV1Error as exc:
        raise EnrError(f"not an RLP record: {exc}") from None
    if not isinstance(items, list) or len(items) < 2 or len(items) % 2:
        raise EnrError("a record is [signature, seq, key, value, ...]")
    signature, seq_raw, *rest = (_bytes(item) for item in items)
    seq = _integer(seq_raw, "seq", 8)
    pairs: dict[str, bytes] = {}
    previous = None
    for key_raw, value in zip(rest[::2], rest[1::2]):
        if previous is not None and key_raw <= previous:
            raise EnrError("keys are not sorted and unique")
        previous = key_raw
        try:
            key = key_raw.decode("ascii")
        except UnicodeDecodeError:
            key = key_raw.decode("latin-1")
        pairs[key] = value
    if pairs.get(ID) != b"v4":
        raise EnrError(f"identity scheme {pairs.get(ID)!r} is not v4")
    public_key = pairs.get(SECP256K1)
    if public_key is None or len(public_key) != SECP256K1_KEY_SIZE:
        raise EnrError("v4 record without a 33-byte secp256k1 key")
    content = rlp_encode([seq_raw, *rest])
    if not crypto.verify_compact(public_key, signature, crypto.keccak256(content)):
        raise EnrError("the signature does not match the record's key")
    return Enr(seq=seq, pairs=pairs, raw=raw)


def encode(private_key: bytes, seq: int, pairs: Mapping[str, bytes | int]) -> Enr:
    """Sign a ``v4`` record of ``pairs`` (``id`` and ``secp256k1`` are added;
    integers become minimal big-endian bytes) with ``private_key``."""
    if not 0 <= seq < 1 << 64:
        raise EnrError("seq must fit in 64 bits")
    values: dict[str, bytes] = {k: _value_bytes(v) for k, v in pairs.items()}
    values[ID] = b"v4"
    values[SECP256K1] = crypto.private_key_from_bytes(private_key).public_key.format(compressed=True)
    flat: list[bytes] = []
    for key in sorted(values, key=lambda k: k.encode()):
        flat += [key.encode(), values[key]]
    seq_raw = _int_bytes(seq)
    signature = crypto.sign_compact(private_key, crypto.keccak256(rlp_encode([seq_raw, *flat])))
    raw = rlp_encode([signature, seq_raw, *flat])
    if len(raw) > MAX_RECORD_SIZE:
        raise EnrError(f"record of {len(raw)} bytes (at most {MAX_RECORD_SIZE}): fewer multiaddrs or shards")
    return decode(raw)


def waku_record(
    private_key: bytes,
    seq: int,
    *,
    capabilities: Capability,
    cluster: int | None = None,
    shards: Sequence[int] = (),
    ip: str | None = None,
    tcp: int | None = None,
    udp: int | None = None,
    ip6: str | None = None,
    tcp6: int | None = None,
    multiaddrs: Sequence[str] = (),
) -> Enr:
    """A Waku node's record, as nwaku builds it."""
    pairs: dict[str, bytes | int] = {WAKU2: bytes([int(capabilities)])}
    if ip is not None:
        pairs[IP] = ipaddress.IPv4Address(ip).packed
    if ip6 is not None:
        pairs[IP6] = ipaddress.IPv6Address(ip6).packed
    for name, port in ((TCP, tcp), (UDP, udp), (TCP6, tcp6)):
        if port is not None:
            pairs[name] = port
    if cluster is not None and shards:
        if len(shards) >= SHARD_LIST_MAX:
            pairs[RELAY_SHARDS_VECTOR] = encode_shard_vector(cluster, shards)
        else:
            pairs[RELAY_SHARDS] = encode_shard_list(cluster, shards)
    if multiaddrs:
        pairs[MULTIADDRS] = encode_multiaddrs(multiaddrs)
    return encode(private_key, seq, pairs)


# --- Waku fields -----------------------------------------------------------------


def encode_shard_list(cluster: int, shards: Iterable[int]) -> bytes:
    ordered = sorted(set(shards))
    if not 0 <= cluster <= 0xFFFF or not ordered or len(ordered) > 0xFF:
        raise EnrError("rs holds a u16 cluster and 1 to 255 shards")
    if ordered[0] < 0 or ordered[-1] > 0xFFFF:
        raise EnrError("a shard is a u16")
    return cluster.to_bytes(2, "big") + bytes([len(ordered)]) + b"".join(s.to_bytes(2, "big") for s in ordered)


def decode_shard_list(raw: bytes) -> RelayShards:
    if len(raw) < 3 or len(raw) != 3 + 2 * raw[2]:
        raise EnrError(f"rs of {len(raw)} bytes does not match its count")
    shards = tuple(int.from_bytes(raw[i : i + 2], "big") for i in range(3, len(raw), 2))
    return RelayShards(int.from_bytes(raw[:2], "big"), shards)


def encode_shard_vector(cluster: int, shards: Iterable[int]) -> bytes:
    vector = bytearray(SHARD_VECTOR_BITS // 8)
    for shard in shards:
        if not 0 <= shard < SHARD_VECTOR_BITS:
            raise EnrError(f"shard {shard} does not fit rsv's {SHARD_VECTOR_BITS} bits")
        vector[shard // 8] |= 0x80 >> (shard % 8)
    if not 0 <= cluster <= 0xFFFF:
        raise EnrError("the cluster is a u16")
    return cluster.to_bytes(2, "big") + bytes(vector)


def decode_shard_vector(raw: bytes) -> RelayShards:
    if len(raw) != 2 + SHARD_VECTOR_BITS // 8:
        raise EnrError(f"rsv of {len(raw)} bytes (a u16 and {SHARD_VECTOR_BITS // 8} bytes)")
    vector = raw[2:]
    shards = tuple(i for i in range(SHARD_VECTOR_BITS) if vector[i // 8] & (0x80 >> (i % 8)))
    return RelayShards(int.from_bytes(raw[:2], "big"), shards)


def encode_multiaddrs(addrs: Iterable[str]) -> bytes:
    out = bytearray()
    for text in addrs:
        stripped = text.split("/p2p/", 1)[0]
        try:
            binary = multiaddr.Multiaddr(stripped).to_bytes()
        except Exception as exc:  # the library raises several kinds
            raise EnrError(f"not a multiaddr: {text!r} ({exc})") from None
        out += len(binary).to_bytes(2, "big") + binary
    return bytes(out)


def decode_multiaddrs(raw: bytes) -> list[str]:
    out, pos = [], 0
    while pos < len(raw):
        if pos + 2 > len(raw):
            raise EnrError("multiaddrs: a length cut short")
        size = int.from_bytes(raw[pos : pos + 2], "big")
        pos += 2
        if size == 0 or pos + size > len(raw):
            raise EnrError("multiaddrs: an entry overruns the field")
        try:
            out.append(str(multiaddr.Multiaddr(raw[pos : pos + size])))
        except Exception as exc:  # the library raises several kinds
            raise EnrError(f"multiaddrs: an entry is not a multiaddr ({exc})") from None
        pos += size
    return out


# --- peer ids ---------------------------------------------------------------------

_BASE58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"


def peer_id_of(public_key: bytes) -> str:
    """libp2p's peer id of a compressed secp256k1 key: the identity
    multihash of its protobuf PublicKey (type 2, secp256k1), in base58."""
    if len(public_key) != SECP256K1_KEY_SIZE:
        raise EnrError("a peer id needs a 33-byte secp256k1 key")
    proto = b"\x08\x02\x12" + bytes([len(public_key)]) + public_key
    return _base58(b"\x00" + bytes([len(proto)]) + proto)


def _base58(data: bytes) -> str:
    number = int.from_bytes(data, "big")
    out = ""
    while number:
        number, digit = divmod(number, 58)
        out = _BASE58[digit] + out
    return "1" * (len(data) - len(data.lstrip(b"\x00"))) + out


# --- helpers -----------------------------------------------------------------------


def _text_bytes(text: str) -> bytes:
    text = text.strip()
    if not text.startswith(TEXT_PREFIX):
        raise EnrError("a record's text starts with enr:")
    body = text[len(TEXT_PREFIX) :]
    if len(body) > (MAX_RECORD_SIZE * 4 + 2) // 3 + 2:
        raise EnrError("record text too long")
    try:
        return base64.b64decode(body + "=" * (-len(body) % 4), altchars=b"-_", validate=True)
    except (ValueError, TypeError) as exc:
        raise EnrError(f"not URL-safe base64: {exc}") from None


def _bytes(item: object) -> bytes:
    if not isinstance(item, bytes):
        raise EnrError("a record holds byte strings only")
    return item


def _integer(raw: bytes, what: str, size: int) -> int:
    if len(raw) > size or raw[:1] == b"\x00":
        raise EnrError(f"{what} is not a minimal integer of at most {size} bytes")
    return int.from_bytes(raw, "big")


def _int_bytes(value: int) -> bytes:
    return value.to_bytes((value.bit_length() + 7) // 8, "big")


def _value_bytes(value: bytes | int) -> bytes:
    if isinstance(value, bool):
        raise EnrError("no booleans in a record")
    if isinstance(value, int):
        if value < 0:
            raise EnrError("no negative integers in a record")
        return _int_bytes(value)
    return bytes(value)


def _ip(raw: bytes | None, size: int) -> str | None:
    if raw is None:
        return None
    if len(raw) != size:
        raise EnrError(f"an address of {len(raw)} bytes, not {size}")
    return str(ipaddress.ip_address(raw))


def _port(raw: bytes | None) -> int | None:
    return None if raw is None else _integer(raw, "a port", 2)
