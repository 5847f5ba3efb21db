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

import hashlib
import itertools
import struct
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, NamedTuple, TypeVar, cast

import numpy as np
from coincurve._libsecp256k1 import ffi as _ffi
from coincurve._libsecp256k1 import lib as _lib
from coincurve.context import GLOBAL_CONTEXT
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from google.protobuf.unknown_fields import UnknownFieldSet

import wakustore._native as _native
from wakustore.protocols import message_codec, topics, waku_v1
from wakustore.protocols.crypto import keccak256
from wakustore.protocols.errors import ArchiveError, MessageError, ProtocolError, TopicError
from wakustore.protocols.framing import encode_uvarint
from wakustore.protocols.message import MAX_STORED_VERSION, WakuMessage, message_hash
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
_CTX = GLOBAL_CONTEXT.ctx
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


def community_channel_keys(community_public_key: bytes, chat_ids: Iterable[str]) -> dict[str, bytes]:
    """Content topic -> symmetric key of each channel of a community
    (status-go derives both from the chat id), for Status-readable
    status-go archives."""
    cid = topics.community_id(community_public_key)
    return {topics.channel_content_topic(community_public_key, c): channel_key(cid, c) for c in chat_ids}


def encode_archived_message(
    layout: Layout, pubsub_topic: str, message: WakuMessage, arrival_ns: int, channel_key: bytes | None = None
) -> Record:
    """One entry of an archive's ``messages``. In the status-go layout,
    ``channel_key`` (the message's channel key) makes the record readable by
    Status clients (see the module docstring). Raises ArchiveError for a
    content topic that is not ``/waku/1/0x<8 hex>/rfc26`` (status-go)."""
    if layout is Layout.SPEC:
        ext = field_bytes(EXT_PUBSUB_TOPIC, pubsub_topic.encode()) + field_varint(EXT_ARRIVAL, arrival_ns)
        return Record(message_codec.encode_message(message) + ext, len(message.payload))
    encoder = RecordEncoder(layout, {message.content_topic: channel_key} if channel_key else {})
    m = message
    data, payload_size = encoder.status_go(
        pubsub_topic,
        m.content_topic,
        m.payload,
        m.meta,
        m.version,
        m.timestamp,
        m.rate_limit_proof,
        arrival_ns,
        message_hash(pubsub_topic, m),
    )
    return Record(data, payload_size)


class RecordEncoder:
    """Encodes many messages of one export: the channel ciphers, topic
    bytes and pubsub-topic fields are made once, not once a message.

    :meth:`encode_columns` takes a batch as columns (what the table
    holds), so that a worker process can encode it without building a
    WakuMessage per row; the bytes are :func:`encode_archived_message`'s.
    """

    def __init__(self, layout: Layout, channel_keys: Mapping[str, bytes] | None = None):
        self.layout = Layout(layout)
        self._ciphers = {topic: AESGCM(key) for topic, key in (channel_keys or {}).items()}
        self._keys = dict(channel_keys or {})
        self._topics: dict[str, bytes] = {}
        self._pubsub: dict[str, bytes] = {}

    def encode_columns(
        self,
        pubsub_topics: Sequence[str],
        content_topics: Sequence[str],
        payloads: Sequence[bytes],
        metas: Sequence[bytes],
        versions: Sequence[int],
        timestamps: Sequence[int],
        proofs: Sequence[bytes],
        arrivals: Sequence[int],
        hashes: Sequence[bytes],
    ) -> tuple[list[bytes], list[int]]:
        """(records, payload sizes) of a batch; ``timestamps`` are the
        sender timestamps (0 when unset), ``hashes`` the rows' message
        hashes (the table's column). Raises ArchiveError as
        :func:`encode_archived_message` does."""
        datas, sizes = [], []
        for parts, size in self._records(
            pubsub_topics, content_topics, payloads, metas, versions, timestamps, proofs, arrivals, hashes
        ):
            datas.append(b"".join(parts))
            sizes.append(size)
        return datas, sizes

    def encode_framed(
        self,
        pubsub_topics: Sequence[str],
        content_topics: Sequence[str],
        payloads: Sequence[bytes],
        metas: Sequence[bytes],
        versions: Sequence[int],
        timestamps: Sequence[int],
        proofs: Sequence[bytes],
        arrivals: Sequence[int],
        hashes: Sequence[bytes],
        signers: Sequence[bytes | None] | None = None,
    ) -> tuple[bytes, list[int], list[int]]:
        """:meth:`encode_columns` as an archive body holds the records:
        each one framed as a ``messages`` entry (field 3 of
        WakuMessageArchive), back to back in one bytes object, with the
        end offset of each entry in it and the payload sizes (what
        :meth:`archive.Chunker.add_framed` takes). One object a batch to
        hand from a worker process, not one a message. ``signers``: each
        row's signer when known already (:meth:`signers`), None where it
        is not; a known signer spares the key recovery, the same bytes."""
        out, ends, sizes = [], [], []
        position = 0
        for parts, size in self._records(
            pubsub_topics, content_topics, payloads, metas, versions, timestamps, proofs, arrivals, hashes, signers
        ):
            length = sum(map(len, parts))
            head = varint(length)
            out.append(_ARCHIVE_MESSAGE_KEY)
            out.append(head)
            out += parts
            position += len(_ARCHIVE_MESSAGE_KEY) + len(head) + length
            ends.append(position)
            sizes.append(size)
        return b"".join(out), ends, sizes

    def _records(
        self,
        pubsub_topics: Sequence[str],
        content_topics: Sequence[str],
        payloads: Sequence[bytes],
        metas: Sequence[bytes],
        versions: Sequence[int],
        timestamps: Sequence[int],
        proofs: Sequence[bytes],
        arrivals: Sequence[int],
        hashes: Sequence[bytes],
        signers: Sequence[bytes | None] | None = None,
    ) -> Iterator[tuple[list[bytes], int]]:
        """(the record's bytes in parts, payload size) of each row."""
        if self.layout is Layout.SPEC:
            for p, c, pl, m, v, t, r, a in zip(
                pubsub_topics, content_topics, payloads, metas, versions, timestamps, proofs, arrivals
            ):
                record = encode_archived_message(self.layout, p, WakuMessage(pl, c, v, t, m, False, r), a)
                yield [record.data], record.payload_size
            return
        parts = self._status_go_parts
        known = itertools.repeat(None) if signers is None else signers
        row: DecodedRecord  # the columns in the order of _status_go_parts' parameters
        for row, numbers, signer in zip(
            zip(pubsub_topics, content_topics, payloads, metas, versions, timestamps, proofs, arrivals, hashes),
            _record_varints(timestamps, arrivals),
            known,
        ):
            yield parts(*row, numbers, signer)

    def cipher(self, content_topic: str) -> AESGCM | None:
        """The channel cipher of a content topic (None: no key, its
        payloads are archived as they are)."""
        return self._ciphers.get(content_topic)

    def topic_bytes(self, content_topic: str) -> bytes:
        """The 4-byte Waku v1 topic status-go's record holds."""
        topic = self._topics.get(content_topic)
        if topic is None:
            try:
                topic = topics.topic_bytes_from_content_topic(content_topic)
            except ProtocolError as exc:
                raise ArchiveError(str(exc)) from None
            self._topics[content_topic] = topic
        return topic

    def pubsub_field(self, pubsub_topic: str) -> bytes:
        """The record's pubsub topic field, whole."""
        pubsub = self._pubsub.get(pubsub_topic)
        if pubsub is None:
            pubsub = self._pubsub[pubsub_topic] = field_bytes(EXT_PUBSUB_TOPIC, pubsub_topic.encode())
        return pubsub

    def signers(
        self, content_topics: Sequence[str], versions: Sequence[int], payloads: Sequence[bytes]
    ) -> list[bytes | None]:
        """The signer a status-go record of each row holds: the 65-byte
        key (secp256k1 recovery) of a payload sealed with its channel's key
        and signed, b"" for one sealed unsigned, None for a row whose
        record carries the payload as it is (no key, not sealed with it).
        What a control node works out for its channels' messages ahead of
        their export (one recovery each, the export's main cost)."""
        found: list[bytes | None] = []
        for content_topic, version, payload in zip(content_topics, versions, payloads):
            cipher = self._ciphers.get(content_topic) if version == 1 else None
            opened = _open_reproducibly(payload, cipher) if cipher is not None else None
            found.append(None if opened is None else opened[2])
        return found

    def status_go(
        self,
        pubsub_topic: str,
        content_topic: str,
        payload: bytes,
        meta: bytes,
        version: int,
        timestamp: int,
        proof: bytes,
        arrival_ns: int,
        hash_: bytes,
    ) -> tuple[bytes, int]:
        """status-go's record plus the extra fields, written field by field
        in the order protobuf serialises them (by number), then the extra
        fields in their fixed order."""
        parts, size = self._status_go_parts(
            pubsub_topic, content_topic, payload, meta, version, timestamp, proof, arrival_ns, hash_, None, None
        )
        return b"".join(parts), size

    def _status_go_parts(
        self,
        pubsub_topic: str,
        content_topic: str,
        payload: bytes,
        meta: bytes,
        version: int,
        timestamp: int,
        proof: bytes,
        arrival_ns: int,
        hash_: bytes,
        numbers: tuple[bytes, bytes, bytes] | None,
        known_signer: bytes | None,
    ) -> tuple[list[bytes], int]:
        """:meth:`status_go` in parts; ``numbers``, when given, are the
        varints of the seconds, the arrival and the zigzagged timestamp
        (:func:`_record_varints`); ``known_signer``, the signer when known
        (:meth:`signers`)."""
        topic = self.topic_bytes(content_topic)
        ordering = timestamp or arrival_ns
        if ordering < 0:
            raise ArchiveError(f"time {ordering} ns is before 1970: status-go's record holds unsigned seconds")
        if numbers is None:
            numbers = varint(ordering // NS_PER_S), varint(arrival_ns), varint(_zigzag(timestamp))
        cipher = self.cipher(content_topic) if version == 1 else None
        opened = _open_reproducibly(payload, cipher, known_signer) if cipher is not None else None
        parts: list[bytes] = []
        signer = padding = b""
        if opened is not None:
            payload, padding, signer, signature, nonce = opened
            if signer:
                parts += (b"\x0a", varint(len(signer)), signer)
        if ordering >= NS_PER_S:  # whole seconds, 0 not written
            parts += (b"\x10", numbers[0])
        parts += (b"\x1a", varint(len(topic)), topic)
        if payload:
            parts += (b"\x22", varint(len(payload)), payload)
        if padding:
            parts += (b"\x2a", varint(len(padding)), padding)
        parts += (b"\x32", varint(len(hash_)), hash_)
        parts += (self.pubsub_field(pubsub_topic), _ARRIVAL_KEY, numbers[1])
        if opened is not None:
            parts += (_NONCE_KEY, varint(len(nonce)), nonce)
            if signature:
                parts += (_SIGNATURE_KEY, varint(len(signature)), signature)
        if timestamp:
            parts += (_TIMESTAMP_KEY, numbers[2])
        if meta:
            parts += (_META_KEY, varint(len(meta)), meta)
        if version:
            parts += (_VERSION_KEY, varint(version))
        if proof:
            parts += (_PROOF_KEY, varint(len(proof)), proof)
        return parts, len(payload) + len(signer)


def _record_varints(timestamps: Sequence[int], arrivals: Sequence[int]) -> Iterator[tuple[bytes, bytes, bytes] | None]:
    """For each row, the varints of its whole seconds (of the sender
    timestamp, else the arrival), its arrival and its zigzagged sender
    timestamp, made for the whole batch at once (three multi-byte varints
    a record cost ~4 us one by one); None for every row of a batch with
    a time before 1970, which the record encoder refuses or encodes alone."""
    count = len(timestamps)
    stamps = np.fromiter(timestamps, np.int64, count)
    arrived = np.fromiter(arrivals, np.int64, count)
    ordering = np.where(stamps != 0, stamps, arrived)
    if count == 0 or (arrived < 0).any() or (ordering < 0).any():
        yield from itertools.repeat(None, count)
        return
    zigzag = (stamps << 1) ^ (stamps >> 63)
    yield from zip(
        varints((ordering // NS_PER_S).view(np.uint64)),
        varints(arrived.view(np.uint64)),
        varints(zigzag.view(np.uint64)),
    )


def varints(values: np.ndarray) -> list[bytes]:
    """:func:`varint` of each of a uint64 array, computed a column of
    7-bit groups at a time."""
    blob, lengths = varint_blob(values)
    ends = np.cumsum(lengths).tolist()
    return [blob[start:end] for start, end in zip([0, *ends[:-1]], ends)]


def varint_blob(values: np.ndarray) -> tuple[bytes, np.ndarray]:
    """The varints of a uint64 array back to back, and the length of each."""
    count = len(values)
    lengths = np.ones(count, np.int64)
    for shift in range(7, 64, 7):
        lengths += values >= np.uint64(1 << shift)
    groups = np.empty((count, _VARINT_MAX), np.uint8)
    rest = values.copy()
    for i in range(_VARINT_MAX):
        groups[:, i] = (rest & np.uint64(0x7F)).astype(np.uint8) | 0x80
        rest >>= np.uint64(7)
    groups[np.arange(count), lengths - 1] &= 0x7F
    return groups[np.arange(_VARINT_MAX) < lengths[:, None]].tobytes(), lengths


def decode_archived_message(
    layout: Layout, raw: bytes, default_pubsub_topic: str, channel_keys: Mapping[str, bytes] | None = None
) -> ArchivedMessage:
    """The message an archive entry stands for. A status-go record with the
    extra fields is rebuilt exactly (sealed again with ``channel_keys[topic]``
    when it holds a decrypted payload) and must match its ``hash``; without
    them it maps as the module docstring says. Raises ArchiveError for
    every malformed input (a bad message or topic field included)."""
    pubsub, topic, payload, meta, version, timestamp, proof, arrival, _ = RecordDecoder(
        layout, default_pubsub_topic, channel_keys
    ).decode(raw)
    return ArchivedMessage(pubsub, WakuMessage(payload, topic, version, timestamp, meta, False, proof), arrival)


# What a record decodes to, as the table's columns hold it: pubsub topic,
# content topic, payload, meta, version, sender timestamp (0: unset),
# rate-limit proof, arrival (ns) and the message hash.
DecodedRecord = tuple[str, str, bytes, bytes, int, int, bytes, int, bytes]

_UINT32_MAX = 2**32 - 1
_INT64_BE = struct.Struct(">q")
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


class RecordDecoder:
    """Decodes the records of many archives: channel ciphers and topic
    names are made once, and a record becomes a :data:`DecodedRecord`
    tuple (no message object), which a hydrating member turns into table
    columns. Checks and errors are :func:`decode_archived_message`'s."""

    def __init__(self, layout: Layout, default_pubsub_topic: str, channel_keys: Mapping[str, bytes] | None = None):
        self.layout = Layout(layout)
        self.default_pubsub_topic = default_pubsub_topic
        self._keys = dict(channel_keys or {})
        self._ciphers: dict[str, AESGCM] = {}
        self._topics: dict[bytes, str] = {}
        self._pubsub: dict[bytes, str] = {}
        self._topic_keys: dict[bytes, bytes] | None = None

    def decode(self, raw: bytes) -> DecodedRecord:
        try:
            return self._decode(raw)
        except (MessageError, TopicError) as exc:
            raise ArchiveError(str(exc)) from None

    def _decode(self, raw: bytes) -> DecodedRecord:
        ext = _ext_fields(raw)
        pubsub = _ext_bytes(ext, EXT_PUBSUB_TOPIC)
        arrival = _ext_int(ext, EXT_ARRIVAL)
        if self.layout is Layout.SPEC:
            m = message_codec.decode_message(raw)
            _check_table_fit(m.version, arrival)
            pubsub_topic = _utf8(pubsub, "pubsub topic") if pubsub is not None else self.default_pubsub_topic
            return (
                pubsub_topic,
                m.content_topic,
                m.payload,
                m.meta,
                m.version,
                m.timestamp,
                m.rate_limit_proof,
                arrival if arrival is not None else m.timestamp,
                message_hash(pubsub_topic, m),
            )
        record = message_codec.parse_protobuf(archive_status_go_pb2.WakuMessage, raw)
        if record is None:
            raise ArchiveError("undecodable archive message")
        return self._rebuild(
            record.topic,
            record.timestamp,
            record.payload,
            record.padding,
            record.hash,
            pubsub,
            arrival,
            _ext_bytes(ext, EXT_NONCE),
            _ext_bytes(ext, EXT_SIGNATURE) or b"",
            _ext_int(ext, EXT_VERSION) or 0,
            _unzigzag(_ext_int(ext, EXT_TIMESTAMP) or 0),
            _ext_bytes(ext, EXT_META) or b"",
            _ext_bytes(ext, EXT_PROOF) or b"",
        )

    def decode_columns(self, body: bytes | memoryview) -> tuple[Any, ...] | None:
        """A status-go archive body decoded by the compiled decoder
        (``wakustore._native.decode_status_go``): (record count, metadata
        bytes, distinct raw topics, distinct pubsub topics, then the
        columns' buffers), or None when the body is not in the plain form
        it reads (then :meth:`decode` reads it, record by record)."""
        if self.layout is not Layout.STATUS_GO:
            return None
        if self._topic_keys is None:
            # The channel keys by 4-byte topic: a record names its topic so.
            self._topic_keys = {}
            for content_topic, key in self._keys.items():
                try:
                    raw = topics.topic_bytes_from_content_topic(content_topic)
                except TopicError:
                    continue
                if topics.content_topic_from_bytes(raw) == content_topic:
                    self._topic_keys[raw] = bytes(key)
        return cast(
            "tuple[Any, ...] | None",
            _native.decode_status_go(body, self._topic_keys, self.default_pubsub_topic.encode()),
        )

    def parse_archive(self, body: bytes | memoryview) -> archive_status_go_pb2.ArchivedMessages | None:
        """A status-go archive body parsed whole, one call into protobuf's
        parser instead of one a record (:meth:`decode_parsed` then reads
        each record), when it holds known fields only and its metadata
        comes first, once, as its canonical encoding: then it reads as
        :meth:`decode` reads it a record at a time (both keep the last of a
        repeated field), except that a varint past 64 bits keeps its low 64
        bits here (status-go's Go reader refuses it) where :meth:`decode`
        keeps it whole. None otherwise, and for the spec layout."""
        if self.layout is not Layout.STATUS_GO:
            return None
        parsed = message_codec.parse_protobuf(archive_status_go_pb2.ArchivedMessages, body)
        if (
            parsed is None
            or not parsed.HasField("metadata")
            or UnknownFieldSet(parsed)
            or UnknownFieldSet(parsed.metadata)
        ):
            return None
        metadata = parsed.metadata.SerializeToString()
        head = _METADATA_KEY + varint(len(metadata))
        if bytes(body[: len(head) + len(metadata)]) != head + metadata:
            return None  # not first, or twice (merged), or not canonical
        if any(UnknownFieldSet(record) for record in parsed.messages):
            return None
        return parsed

    def decode_parsed(self, record: archive_status_go_pb2.ArchivedMessage) -> DecodedRecord:
        """:meth:`decode` of a record of :meth:`parse_archive`."""
        try:
            return self._rebuild(
                record.topic,
                record.timestamp,
                record.payload,
                record.padding,
                record.hash,
                record.pubsub_topic if record.HasField("pubsub_topic") else None,
                record.arrival_ns if record.HasField("arrival_ns") else None,
                record.nonce if record.HasField("nonce") else None,
                record.signature,
                record.version,
                record.timestamp_ns,
                record.meta,
                record.rate_limit_proof,
            )
        except (MessageError, TopicError) as exc:
            raise ArchiveError(str(exc)) from None

    def _rebuild(
        self,
        raw_topic: bytes,
        seconds: int,
        payload: bytes,
        padding: bytes,
        hash_: bytes,
        pubsub: bytes | None,
        arrival: int | None,
        nonce: bytes | None,
        signature: bytes,
        version: int,
        timestamp: int,
        meta: bytes,
        proof: bytes,
    ) -> DecodedRecord:
        """The table row a status-go record's fields stand for (the extra
        fields None or empty when absent), checked: see :meth:`decode`."""
        content_topic = self._topics.get(raw_topic)
        if content_topic is None:
            content_topic = self._topics[raw_topic] = topics.content_topic_from_bytes(raw_topic)
        pubsub_topic: str | None
        if arrival is None:  # an archive status-go made: see the module docstring
            ts = seconds * NS_PER_S
            if ts > _INT64_MAX:
                raise ArchiveError(f"timestamp {seconds} s does not fit the wire format's nanoseconds")
            pubsub_topic = self.default_pubsub_topic
            return (
                pubsub_topic,
                content_topic,
                payload,
                b"",
                0,
                ts,
                b"",
                ts,
                _hash(pubsub_topic, payload, content_topic, b"", ts),
            )
        if pubsub is None:
            raise ArchiveError("archive message has an arrival time but no pubsub topic")
        if nonce is not None:
            cipher = self._cipher(content_topic)
            if len(nonce) != waku_v1.AES_NONCE_SIZE:
                raise ArchiveError(f"nonce of {len(nonce)} bytes")
            payload = _seal(cipher, nonce, payload, padding, signature)
        pubsub_topic = self._pubsub.get(pubsub)
        if pubsub_topic is None:
            pubsub_topic = self._pubsub[pubsub] = _utf8(pubsub, "pubsub topic")
        ordering = timestamp or arrival
        if ordering // NS_PER_S != seconds:
            raise ArchiveError(f"timestamp {seconds} s does not match {ordering} ns")
        # What message_codec.encode_message would refuse: the wire types of
        # version (uint32) and timestamp (sint64, also the hash's 8 bytes).
        if not 0 <= version <= _UINT32_MAX or not _INT64_MIN <= timestamp <= _INT64_MAX:
            raise ArchiveError(f"message does not fit the wire format: version {version}, timestamp {timestamp}")
        _check_table_fit(version, arrival)
        if _hash(pubsub_topic, payload, content_topic, meta, timestamp) != hash_:
            raise ArchiveError("message hash does not match the rebuilt message")
        return pubsub_topic, content_topic, payload, meta, version, timestamp, proof, arrival, hash_

    def _cipher(self, content_topic: str) -> AESGCM:
        cipher = self._ciphers.get(content_topic)
        if cipher is None:
            key = self._keys.get(content_topic)
            if key is None:
                raise ArchiveError(
                    f"a message on {content_topic} is archived decrypted: rebuilding it needs its channel key"
                )
            cipher = self._ciphers[content_topic] = AESGCM(key)
        return cipher


def _check_table_fit(version: int, arrival: int | None) -> None:
    """What the messages table cannot hold: a version past its signed
    32-bit column (ingest refuses those too), an arrival past int64."""
    if version > MAX_STORED_VERSION:
        raise ArchiveError(f"message version {version} is above {MAX_STORED_VERSION}, the largest the store keeps")
    if arrival is not None and arrival > _INT64_MAX:
        raise ArchiveError(f"arrival time {arrival} ns does not fit the table")


def _hash(pubsub_topic: str, payload: bytes, content_topic: str, meta: bytes, timestamp: int) -> bytes:
    """:func:`message_hash` of the message these fields make, without
    making the message (the round-trip tests hold the two equal)."""
    return hashlib.sha256(
        b"".join((pubsub_topic.encode(), payload, content_topic.encode(), meta, _INT64_BE.pack(timestamp)))
    ).digest()


def _open_reproducibly(
    data: bytes, cipher: AESGCM, known_signer: bytes | None = None
) -> tuple[bytes, bytes, bytes, bytes, bytes] | None:
    """(payload, padding, signer, signature, nonce) of a Waku v1 symmetric
    payload (waku_v1.decrypt_symmetric's format) whose plaintext is in the
    canonical form :func:`_seal` writes, so that sealing it again with the
    same key and nonce gives ``data`` back (AES-GCM is deterministic);
    ``signer`` is the 65-byte uncompressed key status-go's record holds
    (empty when unsigned): ``known_signer`` when given (what this function
    recovered from the same payload before), else recovered. None for
    anything else."""
    nonce_size = waku_v1.AES_NONCE_SIZE
    if len(data) <= nonce_size + waku_v1.GCM_TAG_SIZE:
        return None
    nonce, sealed = data[-nonce_size:], data[:-nonce_size]
    try:
        plain = cipher.decrypt(nonce, sealed, None)
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
    signer: bytes | None
    signer = b""
    if signed and known_signer:
        signer = known_signer
    elif signed:
        signer = _recover_uncompressed(signature, keccak256(plain[:end]))
        if signer is None:
            return None
    return payload, padding, signer, signature, nonce


def _recover_uncompressed(signature: bytes, digest: bytes) -> bytes | None:
    """The 65-byte uncompressed key that made a 65-byte R||S||V signature
    of ``digest``; None when it recovers none. libsecp256k1 through
    coincurve's own bindings: the key object and the compressed round trip
    of :func:`recover_public_key` cost a fifth more, once per archived
    message."""
    if len(signature) != 65 or signature[64] > 3:
        return None
    parsed = _ffi.new("secp256k1_ecdsa_recoverable_signature *")
    if not _lib.secp256k1_ecdsa_recoverable_signature_parse_compact(_CTX, parsed, signature[:64], signature[64]):
        return None
    key = _ffi.new("secp256k1_pubkey *")
    if not _lib.secp256k1_ecdsa_recover(_CTX, key, parsed, digest):
        return None
    out = _ffi.new("unsigned char[65]")
    size = _ffi.new("size_t *", 65)
    _lib.secp256k1_ec_pubkey_serialize(_CTX, out, size, key, _lib.SECP256K1_EC_UNCOMPRESSED)
    return bytes(_ffi.buffer(out, size[0]))


def _seal(cipher: AESGCM, nonce: bytes, payload: bytes, padding: bytes, signature: bytes) -> bytes:
    """status-go's symmetric Waku v1 payload with a given nonce: flags, the
    payload size (minimal little-endian), payload, padding, signature;
    AES-256-GCM ciphertext || tag || nonce."""
    size = len(payload).to_bytes(_size_field_length(len(payload)), "little")
    flags = len(size) | (waku_v1.FLAG_SIGNED if signature else 0)
    return cipher.encrypt(nonce, b"".join((bytes((flags,)), size, payload, padding, signature)), None) + nonce


def _size_field_length(size: int) -> int:
    return max(1, (size.bit_length() + 7) // 8)


def _utf8(value: bytes, what: str) -> str:
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        raise ArchiveError(f"{what} is not UTF-8") from None


def _ext_int(ext: dict[int, tuple[int, int | bytes | None]], number: int) -> int | None:
    if number not in ext:
        return None
    wire, value = ext[number]
    if wire != _WIRE_VARINT:
        raise ArchiveError(f"field {number} has wire type {wire}, expected varint")
    return cast(int, value)


def _ext_bytes(ext: dict[int, tuple[int, int | bytes | None]], number: int) -> bytes | None:
    if number not in ext:
        return None
    wire, value = ext[number]
    if wire != _WIRE_LEN:
        raise ArchiveError(f"field {number} has wire type {wire}, expected bytes")
    return cast(bytes, value)


def _ext_fields(raw: bytes) -> dict[int, tuple[int, int | bytes | None]]:
    """The extra fields (numbers above 1000) of a record, the last of each
    number winning: :func:`proto_fields` with its checks, inlined for the
    one-byte varints that most keys and lengths are (once per archived
    message on a hydrating member)."""
    ext: dict[int, tuple[int, int | bytes | None]] = {}
    pos, end = 0, len(raw)
    while pos < end:
        # Keys of the extra fields take two bytes, lengths of payloads and
        # padding one or two: decoded here rather than by a call each.
        key = raw[pos]
        if key < 0x80:
            pos += 1
        elif pos + 1 < end and raw[pos + 1] < 0x80:
            key = (key & 0x7F) | raw[pos + 1] << 7
            pos += 2
        else:
            key, pos = _read_varint(raw, pos)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise ArchiveError("protobuf field number 0")
        if wire == _WIRE_LEN:
            if pos + 1 < end and raw[pos] < 0x80:
                length = raw[pos]
                pos += 1
            elif pos + 1 < end and raw[pos + 1] < 0x80:
                length = (raw[pos] & 0x7F) | raw[pos + 1] << 7
                pos += 2
            else:
                length, pos = _read_varint(raw, pos)
            if pos + length > end:
                raise ArchiveError("truncated protobuf field")
            if number > _EXT_FIRST:
                ext[number] = (wire, raw[pos : pos + length])
            pos += length
        elif wire == _WIRE_VARINT:
            start, value, shift = pos, 0, 0
            while pos < end and shift < 70:  # _read_varint's limit: 10 bytes
                byte = raw[pos]
                pos += 1
                value |= (byte & 0x7F) << shift
                if byte < 0x80:
                    break
                shift += 7
            else:  # truncated or too long: _read_varint raises its error
                value, pos = _read_varint(raw, start)
            if number > _EXT_FIRST:
                ext[number] = (wire, value)
        elif wire in (_WIRE_I64, _WIRE_I32):
            pos += 8 if wire == _WIRE_I64 else 4
            if pos > end:
                raise ArchiveError("truncated protobuf field")
            if number > _EXT_FIRST:
                ext[number] = (wire, None)
        else:
            raise ArchiveError(f"unsupported protobuf wire type {wire}")
    return ext


# What proto_fields() reads: its length-delimited values are slices of the same type.
_Buffer = TypeVar("_Buffer", bytes, memoryview)


def proto_fields(raw: _Buffer) -> Iterator[tuple[int, int, int | _Buffer | None]]:
    """(field number, wire type, value) of a protobuf encoding; values are
    ints (varint), bytes (length-delimited) or None (fixed-size)."""
    pos, end = 0, len(raw)
    value: int | _Buffer | None
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


def _read_varint(raw: bytes | memoryview, pos: int) -> tuple[int, int]:
    # One and two bytes first: field keys up to 2047 (the extra fields),
    # lengths up to 16 KiB.
    if pos + 1 < len(raw):
        first = raw[pos]
        if first < 0x80:
            return first, pos + 1
        second = raw[pos + 1]
        if second < 0x80:
            return (first & 0x7F) | second << 7, pos + 2
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


_SMALL_VARINTS = [bytes((n,)) for n in range(0x80)]


def varint(value: int) -> bytes:
    """:func:`encode_uvarint`, values below 128 from a table (most lengths
    and flags of a record)."""
    return _SMALL_VARINTS[value] if 0 <= value < 0x80 else encode_uvarint(value)


def field_varint(number: int, value: int) -> bytes:
    return varint(number << 3 | _WIRE_VARINT) + varint(value)


def field_bytes(number: int, data: bytes) -> bytes:
    return varint(number << 3 | _WIRE_LEN) + varint(len(data)) + data


def _zigzag(value: int) -> int:
    return value << 1 if value >= 0 else ((-value) << 1) - 1


def _unzigzag(value: int) -> int:
    return (value >> 1) ^ -(value & 1)


def _key(number: int, wire: int) -> bytes:
    return varint(number << 3 | wire)


_TIMESTAMP_KEY = _key(EXT_TIMESTAMP, _WIRE_VARINT)
_META_KEY = _key(EXT_META, _WIRE_LEN)
_VERSION_KEY = _key(EXT_VERSION, _WIRE_VARINT)
_ARRIVAL_KEY = _key(EXT_ARRIVAL, _WIRE_VARINT)
_PROOF_KEY = _key(EXT_PROOF, _WIRE_LEN)
_NONCE_KEY = _key(EXT_NONCE, _WIRE_LEN)
_SIGNATURE_KEY = _key(EXT_SIGNATURE, _WIRE_LEN)
# An entry of an archive's ``messages`` (field 3 of WakuMessageArchive, both layouts).
_ARCHIVE_MESSAGE_KEY = _key(3, _WIRE_LEN)


class StatusGoKeys(NamedTuple):
    """The field keys (tag bytes) of a status-go record, in the order
    :meth:`RecordEncoder.status_go` writes them, and of an archive entry:
    for an encoder of whole batches (storage.archive_columns)."""

    signer: bytes
    seconds: bytes
    topic: bytes
    payload: bytes
    padding: bytes
    hash: bytes
    arrival: bytes
    nonce: bytes
    signature: bytes
    timestamp: bytes
    meta: bytes
    version: bytes
    proof: bytes
    entry: bytes


STATUS_GO_KEYS = StatusGoKeys(
    b"\x0a",
    b"\x10",
    b"\x1a",
    b"\x22",
    b"\x2a",
    b"\x32",
    _ARRIVAL_KEY,
    _NONCE_KEY,
    _SIGNATURE_KEY,
    _TIMESTAMP_KEY,
    _META_KEY,
    _VERSION_KEY,
    _PROOF_KEY,
    _ARCHIVE_MESSAGE_KEY,
)


def recover_signer(signature: bytes, signed: bytes) -> bytes | None:
    """The 65-byte uncompressed key status-go's record holds for a Waku v1
    plaintext whose first bytes ``signed`` carry ``signature``; None when
    it recovers none."""
    return _recover_uncompressed(signature, keccak256(signed))


_METADATA_KEY = _key(2, _WIRE_LEN)
_VARINT_MAX = 10
