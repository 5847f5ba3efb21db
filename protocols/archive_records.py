"""Archived message records: how one message of the table is written into
an archive's ``messages`` and rebuilt from it, in either layout.

A store node holds
14/WAKU2 messages as relayed, each with a pubsub topic and an arrival time.
Neither layout has room for the pubsub topic, and status-go's record keeps
whole seconds, the 4-byte topic and no meta or version. So every archived
message carries extra protobuf fields, numbered far above anything either
layout uses (protobuf readers, status-go's included, skip unknown fields):

    1001 sint64 timestamp_ns     the 14/WAKU2 timestamp, 0 if unset  (status-go)
    1002 string pubsub_topic
    1003 bytes  meta                                                 (status-go)
    1004 uint32 version                                              (status-go)
    1005 uint64 arrival_ns       when the control node stored it
    1006 bytes  rate_limit_proof                                     (status-go)
    1007 bytes  nonce            AES-GCM nonce of the Waku v1 payload (status-go)
    1008 bytes  signature        its 65-byte signature, if signed    (status-go)

status-go's record is what its importer reads (protocol/v1/status_message.go
HandleTransportLayer): ``payload`` the *decrypted* Waku v1 payload, ``sig``
the signer's 65-byte uncompressed key (a record without one is dropped),
``padding`` the v1 padding, ``hash`` the 14/WAKU2 deterministic message
hash (wakuv2/common/message.go ReceivedMessage.Hash), ``timestamp`` seconds
(Sent = timestamp ns / 1e9). Community channels encrypt with a key derived
from the chat id (transport filters: AddSymKeyFromPassword(chatID)), so a
control node that knows its chat ids writes that record, plus the nonce
and signature, from which a member holding the same key seals the payload
again byte for byte; a payload that does not open with the key, or would
not seal back identically, is archived as relayed with an empty ``sig``.

With the extra fields a member rebuilds the exact table row (same MUID and
message hash) and, in the status-go layout, checks the rebuilt hash against
``hash``. Archives without them (made by status-go itself) map back as:
content topic ``/waku/1/0x<topic hex>/rfc26``, timestamp = seconds * 1e9,
version 0 and the decrypted payload, no meta, pubsub topic = the caller's
default (the community's shard); the hash cannot be checked then.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import NamedTuple

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from wakustore.protocols import message_codec, topics, waku_v1
from wakustore.protocols.crypto import keccak256, public_key_from_bytes, recover_public_key
from wakustore.protocols.framing import encode_uvarint
from wakustore.protocols.errors import ArchiveError, MessageError, ProtocolError, TopicError
from wakustore.protocols.message import WakuMessage, message_hash
from wakustore.protos import archive_status_go_pb2

NS_PER_S = 1_000_000_000

# Extra fields on every archived message (see the module docstring).
EXT_TIMESTAMP = 1001
EXT_PUBSUB_TOPIC = 1002
EXT_META = 1003
EXT_VERSION = 1004
EXT_ARRIVAL = 1005
EXT_PROOF = 1006
EXT_NONCE = 1007
EXT_SIGNATURE = 1008
_EXT_FIRST = 1000
_WIRE_VARINT, _WIRE_I64, _WIRE_LEN, _WIRE_I32 = 0, 1, 2, 5


class Layout(str, Enum):
    """Which archive layout: status-go's (deployed) or the written spec's."""

    STATUS_GO = "status-go"
    SPEC = "spec"


class Record(NamedTuple):
    """One encoded entry of an archive's ``messages`` and the bytes it
    counts against the archive payload limit: payload + signature (status-go)."""

    data: bytes
    payload_size: int


@dataclass(frozen=True, slots=True)
class ArchivedMessage:
    """A message as the table holds it: what an archive entry maps back to."""

    pubsub_topic: str
    message: WakuMessage
    arrival_ns: int

    @property
    def timestamp(self) -> int:
        """Ordering time in ns: the sender timestamp, or arrival when unset."""
        return self.message.timestamp or self.arrival_ns


def channel_key(community_id: str, chat_id: str) -> bytes:
    """The symmetric key of a community channel: status-go derives it from
    the chat id (community id + channel id) as a password."""
    return waku_v1.key_from_password(community_id + chat_id)


def encode_archived_message(layout: Layout, pubsub_topic: str, message: WakuMessage, arrival_ns: int,
                            channel_key: bytes | None = None) -> Record:
    """One entry of an archive's ``messages``. In the status-go layout,
    ``channel_key`` (the message's channel key) makes the record readable by
    Status clients (see the module docstring). Raises ArchiveError for a
    content topic that is not ``/waku/1/0x<8 hex>/rfc26`` (status-go)."""
    ordering = message.timestamp or arrival_ns
    ext = [field_bytes(EXT_PUBSUB_TOPIC, pubsub_topic.encode()), field_varint(EXT_ARRIVAL, arrival_ns)]
    if layout is Layout.SPEC:
        return Record(message_codec.encode_message(message) + b"".join(ext), len(message.payload))
    try:
        topic = topics.topic_bytes_from_content_topic(message.content_topic)
    except ProtocolError as exc:
        raise ArchiveError(str(exc)) from None
    record = archive_status_go_pb2.WakuMessage(
        timestamp=ordering // NS_PER_S, topic=topic, payload=message.payload,
        hash=message_hash(pubsub_topic, message),
    )
    opened = _open_reproducibly(message.payload, channel_key) if channel_key and message.version == 1 else None
    if opened is not None:
        payload, padding, signer, signature, nonce = opened
        record.payload, record.padding = payload, padding
        ext.append(field_bytes(EXT_NONCE, nonce))
        if signature:
            record.sig = public_key_from_bytes(signer).format(compressed=False)
            ext.append(field_bytes(EXT_SIGNATURE, signature))
    if message.timestamp:
        ext.append(field_varint(EXT_TIMESTAMP, _zigzag(message.timestamp)))
    if message.meta:
        ext.append(field_bytes(EXT_META, message.meta))
    if message.version:
        ext.append(field_varint(EXT_VERSION, message.version))
    if message.rate_limit_proof:
        ext.append(field_bytes(EXT_PROOF, message.rate_limit_proof))
    return Record(record.SerializeToString() + b"".join(ext), len(record.payload) + len(record.sig))


def decode_archived_message(layout: Layout, raw: bytes, default_pubsub_topic: str,
                            channel_keys: Mapping[str, bytes] | None = None) -> ArchivedMessage:
    """The message an archive entry stands for. A status-go record with the
    extra fields is rebuilt exactly (sealed again with ``channel_keys[topic]``
    when it holds a decrypted payload) and must match its ``hash``; without
    them it maps as the module docstring says. Raises ArchiveError for
    every malformed input (a bad message or topic field included)."""
    try:
        return _decode_archived_message(layout, raw, default_pubsub_topic, channel_keys)
    except (MessageError, TopicError) as exc:
        raise ArchiveError(str(exc)) from None


def _decode_archived_message(layout: Layout, raw: bytes, default_pubsub_topic: str,
                             channel_keys: Mapping[str, bytes] | None) -> ArchivedMessage:
    ext = {number: (wire, value) for number, wire, value in proto_fields(raw) if number > _EXT_FIRST}
    pubsub = _ext_bytes(ext, EXT_PUBSUB_TOPIC)
    arrival = _ext_int(ext, EXT_ARRIVAL)
    if layout is Layout.SPEC:
        message = message_codec.decode_message(raw)
        pubsub_topic = _utf8(pubsub, "pubsub topic") if pubsub is not None else default_pubsub_topic
        return ArchivedMessage(pubsub_topic, message, arrival if arrival is not None else message.timestamp)
    record = message_codec.parse_protobuf(archive_status_go_pb2.WakuMessage, raw)
    if record is None:
        raise ArchiveError("undecodable archive message")
    content_topic = topics.content_topic_from_bytes(record.topic)
    if arrival is None:  # an archive status-go made: see the module docstring
        ts = record.timestamp * NS_PER_S
        return ArchivedMessage(default_pubsub_topic, WakuMessage(record.payload, content_topic, timestamp=ts), ts)
    if pubsub is None:
        raise ArchiveError("archive message has an arrival time but no pubsub topic")
    payload, nonce = record.payload, _ext_bytes(ext, EXT_NONCE)
    if nonce is not None:
        key = channel_keys.get(content_topic) if channel_keys else None
        if key is None:
            raise ArchiveError(f"a message on {content_topic} is archived decrypted: rebuilding it needs its channel key")
        if len(nonce) != waku_v1.AES_NONCE_SIZE:
            raise ArchiveError(f"nonce of {len(nonce)} bytes")
        payload = _seal(key, nonce, record.payload, record.padding, _ext_bytes(ext, EXT_SIGNATURE) or b"")
    message = WakuMessage(
        payload=payload,
        content_topic=content_topic,
        version=_ext_int(ext, EXT_VERSION) or 0,
        timestamp=_unzigzag(_ext_int(ext, EXT_TIMESTAMP) or 0),
        meta=_ext_bytes(ext, EXT_META) or b"",
        rate_limit_proof=_ext_bytes(ext, EXT_PROOF) or b"",
    )
    item = ArchivedMessage(_utf8(pubsub, "pubsub topic"), message, arrival)
    if item.timestamp // NS_PER_S != record.timestamp:
        raise ArchiveError(f"timestamp {record.timestamp} s does not match {item.timestamp} ns")
    if message_hash(item.pubsub_topic, message) != record.hash:
        raise ArchiveError("message hash does not match the rebuilt message")
    try:
        message_codec.encode_message(message)
    except MessageError as exc:
        raise ArchiveError(str(exc)) from None
    return item


def _open_reproducibly(data: bytes, key: bytes) -> tuple[bytes, bytes, bytes | None, bytes, bytes] | None:
    """(payload, padding, signer, signature, nonce) of a Waku v1 symmetric
    payload (waku_v1.decrypt_symmetric's format) whose plaintext is in the
    canonical form :func:`_seal` writes, so that sealing it again with the
    same key and nonce gives ``data`` back (AES-GCM is deterministic);
    None for anything else."""
    nonce_size = waku_v1.AES_NONCE_SIZE
    if len(data) <= nonce_size + waku_v1.GCM_TAG_SIZE:
        return None
    nonce, sealed = data[-nonce_size:], data[:-nonce_size]
    try:
        plain = AESGCM(key).decrypt(nonce, sealed, None)
    except (InvalidTag, ValueError):
        return None
    flags, count = plain[0], plain[0] & waku_v1.SIZE_FIELD_MASK
    signed = flags & waku_v1.FLAG_SIGNED
    end = len(plain) - (waku_v1.SIGNATURE_SIZE if signed else 0)
    if flags & ~(waku_v1.SIZE_FIELD_MASK | waku_v1.FLAG_SIGNED) or count == 0 or end < 1 + count:
        return None
    size = int.from_bytes(plain[1 : 1 + count], "little")
    if count != _size_field_length(size) or 1 + count + size > end:
        return None
    payload, padding, signature = plain[1 + count : 1 + count + size], plain[1 + count + size : end], plain[end:]
    signer = None
    if signed:
        try:
            signer = recover_public_key(signature, keccak256(plain[:end]))
        except ProtocolError:
            return None
    return payload, padding, signer, signature, nonce


def _seal(key: bytes, nonce: bytes, payload: bytes, padding: bytes, signature: bytes) -> bytes:
    """status-go's symmetric Waku v1 payload with a given nonce: flags, the
    payload size (minimal little-endian), payload, padding, signature;
    AES-256-GCM ciphertext || tag || nonce."""
    size = len(payload).to_bytes(_size_field_length(len(payload)), "little")
    flags = len(size) | (waku_v1.FLAG_SIGNED if signature else 0)
    return AESGCM(key).encrypt(nonce, bytes([flags]) + size + payload + padding + signature, None) + nonce


def _size_field_length(size: int) -> int:
    return max(1, (size.bit_length() + 7) // 8)


def _utf8(value: bytes, what: str) -> str:
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        raise ArchiveError(f"{what} is not UTF-8") from None


def _ext_int(ext: dict, number: int) -> int | None:
    if number not in ext:
        return None
    wire, value = ext[number]
    if wire != _WIRE_VARINT:
        raise ArchiveError(f"field {number} has wire type {wire}, expected varint")
    return value


def _ext_bytes(ext: dict, number: int) -> bytes | None:
    if number not in ext:
        return None
    wire, value = ext[number]
    if wire != _WIRE_LEN:
        raise ArchiveError(f"field {number} has wire type {wire}, expected bytes")
    return value


def proto_fields(raw: bytes) -> Iterator[tuple[int, int, int | bytes | None]]:
    """(field number, wire type, value) of a protobuf encoding; values are
    ints (varint), bytes (length-delimited) or None (fixed-size)."""
    pos, end = 0, len(raw)
    while pos < end:
        key, pos = _read_varint(raw, pos)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise ArchiveError("protobuf field number 0")
        if wire == _WIRE_VARINT:
            value, pos = _read_varint(raw, pos)
        elif wire == _WIRE_LEN:
            length, pos = _read_varint(raw, pos)
            if pos + length > end:
                raise ArchiveError("truncated protobuf field")
            value, pos = raw[pos : pos + length], pos + length
        elif wire in (_WIRE_I64, _WIRE_I32):
            pos += 8 if wire == _WIRE_I64 else 4
            if pos > end:
                raise ArchiveError("truncated protobuf field")
            value = None
        else:
            raise ArchiveError(f"unsupported protobuf wire type {wire}")
        yield number, wire, value


def _read_varint(raw: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    for i in range(10):
        if pos + i >= len(raw):
            raise ArchiveError("truncated varint")
        byte = raw[pos + i]
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos + i + 1
        shift += 7
    raise ArchiveError("varint longer than 10 bytes")


varint = encode_uvarint


def field_varint(number: int, value: int) -> bytes:
    return varint(number << 3 | _WIRE_VARINT) + varint(value)


def field_bytes(number: int, data: bytes) -> bytes:
    return varint(number << 3 | _WIRE_LEN) + varint(len(data)) + data


def _zigzag(value: int) -> int:
    return value << 1 if value >= 0 else ((-value) << 1) - 1


def _unzigzag(value: int) -> int:
    return (value >> 1) ^ -(value & 1)
