"""An archive in status-go's layout decoded into table rows a column at a
time: what :func:`archive.iter_archive_records` and
:func:`rows.records_to_arrow` make of it, record by record (the reference;
the tests hold the two equal), in a fraction of its time.

This is the check on an untrusted download, so it takes a narrow road and
hands everything else back: :func:`decode_rows` returns None, or its rows
raise :class:`Unchecked`, for any archive that is not exactly what this
project's export writes (metadata first and canonical, records with known
fields of the right wire types only, varints of at most 9 bytes) or whose
records do not all pass every check the reference makes (topics, times,
keys, nonces, the rebuilt message hashes). The caller then runs the
reference, which decodes the archive or raises its exact error. So an
archive the fast road accepts decodes to the same rows, and one it refuses
is refused as before.

The records' fields are read in lockstep: the n-th field of every record
at once, with numpy (a record holds ~12 fields). Per row, only AES-GCM
(sealing a payload again) and SHA-256 (three digests) run in Python, each
one call mapped over a column.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterable, Iterator
from operator import methodcaller

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from google.protobuf.unknown_fields import UnknownFieldSet

from wakustore.protocols import message_codec, waku_v1
from wakustore.protocols.archive import IndexEntry, Layout, RecordDecoder, window_of
from wakustore.protocols.archive_records import (
    EXT_ARRIVAL, EXT_META, EXT_NONCE, EXT_PROOF, EXT_PUBSUB_TOPIC, EXT_SIGNATURE, EXT_TIMESTAMP, EXT_VERSION,
    NS_PER_S,
)
from wakustore.protocols.errors import ProtocolError
from wakustore.protocols.message import _MUID_META_PART
from wakustore.protos import archive_status_go_pb2
from wakustore.storage import schema
from wakustore.storage.archive_columns import _offsets, _views
from wakustore.storage.rows import _days

# Rows built at once (memory: a few copies of this many messages).
BATCH_ROWS = 4096

_VARINT, _LEN = 0, 2
_SIGNER, _SECONDS, _TOPIC, _PAYLOAD, _PADDING, _HASH = 1, 2, 3, 4, 5, 6
# The record's fields read here (ArchivedMessage but thirdPartyId, a string
# protobuf would check as UTF-8 and the reference ignores): field number,
# wire type. A field's slot is its place in this tuple.
_FIELDS = ((_SIGNER, _LEN), (_SECONDS, _VARINT), (_TOPIC, _LEN), (_PAYLOAD, _LEN), (_PADDING, _LEN),
           (_HASH, _LEN), (EXT_TIMESTAMP, _VARINT), (EXT_PUBSUB_TOPIC, _LEN), (EXT_META, _LEN),
           (EXT_VERSION, _VARINT), (EXT_ARRIVAL, _VARINT), (EXT_PROOF, _LEN), (EXT_NONCE, _LEN),
           (EXT_SIGNATURE, _LEN))
_SLOT = {number: slot for slot, (number, _wire) in enumerate(_FIELDS)}
# Slot of each key a record may hold (keys below 2**14: one or two bytes), -1 for any other.
_SLOT_OF_KEY = np.full(1 << 14, -1, np.int64)
for _slot, (_number, _wire) in enumerate(_FIELDS):
    _SLOT_OF_KEY[_number << 3 | _wire] = _slot
_IS_LEN = np.array([wire == _LEN for _number, wire in _FIELDS])
# Longest varint read (63 bits: a value that fits an int64 either way).
_VARINT_BYTES = 9
_SHIFTS = np.arange(_VARINT_BYTES, dtype=np.uint64) * np.uint64(7)
_METADATA_KEY, _RECORD_KEY = 0x12, 0x1A
_INT32_MAX = 2**31 - 1  # the version column's type
_DIGEST = methodcaller("digest")
_NONCE, _TAG = waku_v1.AES_NONCE_SIZE, waku_v1.GCM_TAG_SIZE
# Largest archive read here (Arrow's binary views hold 32-bit offsets).
_LARGEST = 2**31 - 1


class Unchecked(Exception):
    """A record failed a check on the fast road: the reference decides."""


def decode_rows(decoder: RecordDecoder, entry: IndexEntry, data: bytes,
                allowed_topics: Iterable[str] | None = None) -> Iterator[pa.Table] | None:
    """The rows of the archive ``data`` (:func:`archive.read_archive`'s
    input), :data:`BATCH_ROWS` at a time, in record order; None when the
    archive is not one this road reads (see the module docstring). The
    iterator raises :class:`Unchecked` at the first batch holding a record
    that fails a check."""
    if decoder.layout is not Layout.STATUS_GO or not isinstance(data, bytes) or len(data) != entry.size \
            or entry.size > _LARGEST:
        return None
    if data.count(b"\0", entry.encoded_size) != entry.size - entry.encoded_size:
        return None
    size = entry.encoded_size
    framing = _records(data, size)
    if framing is None:
        return None
    metadata_end, starts, ends = framing
    try:
        start, end, names = window_of(Layout.STATUS_GO, _metadata(data, metadata_end))
    except (ProtocolError, _NotCanonical):
        return None
    if (start, end, names) != (entry.start_ns, entry.end_ns, entry.content_topics):
        return None
    listed = set(names) if allowed_topics is None else set(names) & set(allowed_topics)
    fields = _Fields.read(np.frombuffer(data, np.uint8, size), starts, ends)
    if fields is None:
        return None
    columns = _Columns.check(decoder, fields, data, listed, start, end)
    if columns is None:
        return None
    return columns.batches()


class _NotCanonical(Exception):
    pass


def _metadata(data: bytes, end: int):
    """The archive's metadata, the first field of the body, ending at ``end``."""
    at = 1 + _varint_size(data, 1)
    raw = data[at:end]
    parsed = message_codec.parse_protobuf(archive_status_go_pb2.WakuMessageArchiveMetadata, raw)
    if parsed is None or UnknownFieldSet(parsed) or parsed.SerializeToString() != raw:
        raise _NotCanonical
    return parsed


def _varint_size(data: bytes, at: int) -> int:
    size = 1
    while data[at + size - 1] & 0x80:
        size += 1
    return size


def _records(data: bytes, size: int) -> tuple[int, np.ndarray, np.ndarray] | None:
    """(end of the metadata field, starts, ends of the records) of a body
    that is the metadata then records only; None otherwise."""
    starts, ends = [], []
    pos, first = 0, True
    while pos < size:
        key = data[pos]
        if key != (_METADATA_KEY if first else _RECORD_KEY):
            return None
        length, shift, at = 0, 0, pos + 1
        while True:
            if at >= size or shift > 28:
                return None
            byte = data[at]
            length |= (byte & 0x7F) << shift
            at += 1
            if byte < 0x80:
                break
            shift += 7
        pos = at + length
        if pos > size:
            return None
        if first:
            metadata_end, first = pos, False
        else:
            starts.append(at)
            ends.append(pos)
    if first:
        return None
    return metadata_end, np.array(starts, np.int64), np.array(ends, np.int64)


class _Fields:
    """Where each record's fields lie: per slot of :data:`_FIELDS`, a
    presence mask and, for a length-delimited field, the value's offset
    and length, for a varint its value (the last occurrence of a field
    wins, as protobuf reads it)."""

    def __init__(self, n: int):
        self.n = n
        self.present = np.zeros((len(_FIELDS), n), bool)
        self.offset = np.zeros((len(_FIELDS), n), np.int64)
        self.value = np.zeros((len(_FIELDS), n), np.uint64)

    @classmethod
    def read(cls, body: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> _Fields | None:
        fields = cls(len(starts))
        # Read ahead of any field without bounds checks: the body, then zeros.
        padded = np.zeros(len(body) + 2 + _VARINT_BYTES, np.uint8)
        padded[: len(body)] = body
        rows = np.flatnonzero(starts < ends)  # an empty record has no field
        pos = starts.copy()
        while len(rows):
            at = pos[rows]
            end = ends[rows]
            low, high = padded[at].astype(np.int64), padded[at + 1].astype(np.int64)
            two = low >= 0x80
            if (two & ((high >= 0x80) | (high == 0))).any():  # a key past two bytes, or padded
                return None
            key = np.where(two, (low & 0x7F) | (high << 7), low)
            slot = _SLOT_OF_KEY[key]
            if (slot < 0).any():
                return None
            at = at + 1 + two
            value, size = _read_varints(padded, at)
            if value is None:
                return None
            at = at + size
            after = at + np.where(_IS_LEN[slot], value.astype(np.int64), 0)
            if (after > end).any():
                return None
            fields.present[slot, rows] = True
            fields.offset[slot, rows] = at
            fields.value[slot, rows] = value
            pos[rows] = after
            rows = rows[after < end]
        return fields

    def has(self, number: int) -> np.ndarray:
        return self.present[_SLOT[number]]

    def number(self, number: int) -> np.ndarray:
        """A varint field's values, 0 where absent (all below 2**63)."""
        slot = _SLOT[number]
        return np.where(self.present[slot], self.value[slot], 0).astype(np.int64)

    def views(self, buffer: pa.Buffer, number: int, rows: np.ndarray | None = None) -> pa.Array:
        """A length-delimited field's values (empty where absent) of
        ``rows`` (None: all)."""
        slot = _SLOT[number]
        present, offset, length = self.present[slot], self.offset[slot], self.value[slot].astype(np.int64)
        if rows is not None:
            present, offset, length = present[rows], offset[rows], length[rows]
        return _views(buffer, np.where(present, offset, 0), np.where(present, length, 0))


def _read_varints(padded: np.ndarray, at: np.ndarray) -> tuple[np.ndarray | None, np.ndarray]:
    """(values, sizes) of the varints at ``at``; None when one runs past
    :data:`_VARINT_BYTES`."""
    width = 1
    while True:  # as many bytes as the longest needs
        grid = padded[at[:, None] + np.arange(width)]
        ended = (grid < 0x80).any(axis=1)
        if ended.all():
            break
        if width == _VARINT_BYTES:
            return None, at
        width = min(_VARINT_BYTES, width * 3)
    size = (grid < 0x80).argmax(axis=1) + 1
    if width == 1:
        return grid[:, 0].astype(np.uint64), size
    keep = np.arange(width) < size[:, None]
    parts = (grid & 0x7F).astype(np.uint64) << _SHIFTS[:width]
    return np.bitwise_or.reduce(np.where(keep, parts, np.uint64(0)), axis=1), size


class _Columns:
    """The checked record fields of an archive as row columns, all but
    the digests (made a batch at a time)."""

    @classmethod
    def check(cls, decoder: RecordDecoder, fields: _Fields, data: bytes, listed: set[str],
              start: int, end: int) -> _Columns | None:
        """The columns when every record passes the checks the reference
        makes before a record's hash; None otherwise."""
        n = fields.n
        if not (fields.has(EXT_ARRIVAL).all() and fields.has(EXT_PUBSUB_TOPIC).all()):
            return None  # status-go's own records, or a malformed one
        self = cls()
        self.n, self.decoder = n, decoder
        buffer = pa.py_buffer(data)
        self.buffer, self.fields = buffer, fields
        raw_topics = fields.views(buffer, _TOPIC)
        raw_pubsub = fields.views(buffer, EXT_PUBSUB_TOPIC)
        try:
            self.content, self.content_bytes, content_no, content_names = _mapped(raw_topics, decoder.content_topic)
            self.pubsub, self.pubsub_bytes, _no, _names = _mapped(raw_pubsub, decoder.pubsub_topic)
        except (ProtocolError, UnicodeError):
            return None
        if not set(content_names) <= listed:
            return None
        zigzag = fields.number(EXT_TIMESTAMP)
        self.sender = (zigzag >> 1) ^ -(zigzag & 1)
        self.arrival = fields.number(EXT_ARRIVAL)
        self.ordering = np.where(self.sender != 0, self.sender, self.arrival)
        self.version = fields.number(EXT_VERSION)
        if (self.ordering // NS_PER_S != fields.number(_SECONDS)).any() or (self.version > _INT32_MAX).any() \
                or (self.ordering < start).any() or (self.ordering >= end).any():
            return None
        self.sealed = fields.has(EXT_NONCE)
        if self.sealed.any():
            slot = _SLOT[EXT_NONCE]
            if (fields.value[slot][self.sealed] != _NONCE).any():
                return None
            try:
                self.ciphers = {k: decoder.cipher(content_names[k]) for k in np.unique(content_no[self.sealed]).tolist()}
            except ProtocolError:
                return None
        self.content_no = content_no
        return self

    def batches(self) -> Iterator[pa.Table]:
        for first in range(0, self.n, BATCH_ROWS):
            yield self._table(np.arange(first, min(first + BATCH_ROWS, self.n)))

    def _table(self, rows: np.ndarray) -> pa.Table:
        fields, buffer = self.fields, self.buffer
        payload = fields.views(buffer, _PAYLOAD, rows)
        sealed = self.sealed[rows]
        if sealed.any():
            payload = self._seal(rows, sealed, payload)
        pubsub_bytes, content_bytes = self.pubsub_bytes.take(rows), self.content_bytes.take(rows)
        meta = fields.views(buffer, EXT_META, rows)
        sender = self.sender[rows]
        stamp = _fixed(sender.astype(">i8").view(np.uint8), 8)
        hashes = _sha256(pubsub_bytes, payload, content_bytes, meta, stamp)
        stored = fields.views(buffer, _HASH, rows)
        if not pc.all(pc.equal(stored, hashes)).as_py():
            raise Unchecked
        muids = pc.binary_join_element_wise(_sha256(pubsub_bytes, content_bytes, meta, payload),
                                            pc.binary_slice(meta, 0, _MUID_META_PART), b"")
        ordering = pa.array(self.ordering[rows])
        return pa.Table.from_arrays(
            [
                muids,
                hashes,
                _sha256(content_bytes, payload),
                self.pubsub.take(rows),
                self.content.take(rows),
                payload,
                meta,
                pa.array(self.version[rows].astype(np.int32)),
                ordering,
                pa.array(sender),
                fields.views(buffer, EXT_PROOF, rows),
                pa.array(self.arrival[rows]),
                _days(ordering),
            ],
            schema=schema.MESSAGES,
        )

    def _seal(self, rows: np.ndarray, sealed: np.ndarray, payload: pa.Array) -> pa.Array:
        """``payload`` with the sealed rows' payloads sealed again (see
        archive_records._seal): flags, minimal little-endian size,
        payload, padding, signature; AES-GCM into one buffer, each
        ciphertext and tag followed by its nonce."""
        picked = rows[sealed]
        opened = payload.filter(pa.array(sealed))
        size = np.diff(_offsets(opened))
        size_bytes = 1 + (size >= 1 << 8) + (size >= 1 << 16) + (size >= 1 << 24)
        signature = self.fields.views(self.buffer, EXT_SIGNATURE, picked)
        signed = np.diff(_offsets(signature)) > 0
        flags = (size_bytes | np.where(signed, waku_v1.FLAG_SIGNED, 0)).astype(np.uint8)
        size_field = _ragged(size.astype("<u8").view(np.uint8).reshape(-1, 8), size_bytes)
        plain = pc.binary_join_element_wise(_fixed(flags, 1), size_field, opened,
                                            self.fields.views(self.buffer, _PADDING, picked), signature, b"")
        plain_at = _offsets(plain)
        lengths = np.diff(plain_at) + _TAG
        out_at = np.zeros(len(picked) + 1, np.int64)
        np.cumsum(lengths + _NONCE, out=out_at[1:])
        out = np.empty(int(out_at[-1]), np.uint8)
        nonce_at = self.fields.offset[_SLOT[EXT_NONCE]][picked]
        grid = np.arange(_NONCE)
        out[(out_at[:-1] + lengths)[:, None] + grid] = np.frombuffer(self.buffer, np.uint8)[nonce_at[:, None] + grid]
        source, into, body = memoryview(plain.buffers()[2]).cast("B"), memoryview(out), memoryview(self.buffer).cast("B")
        # One call a row, mapped: no Python frame per message.
        ciphers = [self.ciphers[k] for k in self.content_no[picked].tolist()]
        done = sum(map(AESGCM.encrypt_into, ciphers,
                       map(body.__getitem__, map(slice, nonce_at.tolist(), (nonce_at + _NONCE).tolist())),
                       map(source.__getitem__, map(slice, plain_at[:-1].tolist(), plain_at[1:].tolist())),
                       itertools.repeat(None, len(picked)),
                       map(into.__getitem__, map(slice, out_at[:-1].tolist(), (out_at[:-1] + lengths).tolist()))))
        assert done == int(lengths.sum())
        resealed = pa.Array.from_buffers(pa.binary(), len(picked),
                                         [None, pa.py_buffer(out_at.astype(np.int32)), pa.py_buffer(out)])
        if sealed.all():
            return resealed
        where = np.full(len(rows), -1, np.int64)
        where[sealed] = np.arange(len(picked))
        return pa.concat_arrays([resealed, payload]).take(
            pa.array(np.where(sealed, where, len(picked) + np.arange(len(rows)))))


def _mapped(raw: pa.Array, name_of) -> tuple[pa.Array, pa.Array, np.ndarray, list[str]]:
    """(names, their UTF-8 bytes, each row's index into the unique names,
    the unique names) of a column of raw topics; ``name_of`` raises on a
    bad one."""
    unique = pc.unique(raw)
    names = [name_of(value) for value in unique.to_pylist()]
    number = pc.index_in(raw, value_set=unique)
    no = number.to_numpy(zero_copy_only=False).astype(np.int64)
    return pa.array(names, pa.string()).take(number), pa.array([name.encode() for name in names], pa.binary()).take(number), no, names


def _fixed(values: np.ndarray, width: int) -> pa.Array:
    """A binary column of ``width`` bytes a row from a flat byte array."""
    n = len(values) // width
    offsets = np.arange(n + 1, dtype=np.int32) * width
    return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(np.ascontiguousarray(values))])


def _ragged(grid: np.ndarray, lengths: np.ndarray) -> pa.Array:
    """A binary column of the first ``lengths[i]`` bytes of each grid row."""
    keep = np.arange(grid.shape[1]) < lengths[:, None]
    offsets = np.zeros(len(lengths) + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return pa.Array.from_buffers(pa.binary(), len(lengths), [None, pa.py_buffer(offsets), pa.py_buffer(grid[keep])])


def _sha256(*parts: pa.Array) -> pa.Array:
    """SHA-256 of each row's parts joined, a binary column."""
    joined = pc.binary_join_element_wise(*parts, b"")
    digests = b"".join(map(_DIGEST, map(hashlib.sha256, joined.to_pylist())))
    return _fixed(np.frombuffer(digests, np.uint8), 32)
