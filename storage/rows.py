"""Conversion between Waku messages, write-ahead-log records and Arrow rows."""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from wakustore.protocols.message import _MUID_META_PART, _TIMESTAMP, WakuMessage, message_hash, muid
from wakustore.protocols.store_query import StoredMessage
from wakustore.storage import schema
from wakustore.storage.hash_worker import MIN_BATCH, BatchHasher


@dataclass(frozen=True, slots=True)
class Row:
    """One message as the table holds it; times in nanoseconds."""

    muid: bytes
    message_hash: bytes
    digest: bytes
    pubsub_topic: str
    message: WakuMessage
    timestamp: int  # ordering time: sender timestamp, or arrival when unset
    arrival_time: int

    @classmethod
    def build(cls, pubsub_topic: str, message: WakuMessage, arrival_ns: int) -> Row:
        # Positional: once per message on the ingest path, and keywords
        # cost a third more here.
        return cls(
            muid(pubsub_topic, message),
            message_hash(pubsub_topic, message),
            legacy_digest(message),
            pubsub_topic,
            message,
            message.timestamp or arrival_ns,
            arrival_ns,
        )

    def stored(self, include_data: bool = True) -> StoredMessage:
        return StoredMessage(
            message_hash=self.message_hash,
            pubsub_topic=self.pubsub_topic,
            message=self.message if include_data else None,
            timestamp=self.timestamp,
            digest=self.digest,
        )


def legacy_digest(message: WakuMessage) -> bytes:
    """Legacy Store v2 index digest: sha256(utf8(content_topic) || payload)."""
    return hashlib.sha256(message.content_topic.encode() + message.payload).digest()


# --- write-ahead-log records ----------------------------------------------
# Layout: arrival_ns, timestamp, version (q q I), then length-prefixed
# pubsub topic, content topic, payload, meta, rate-limit proof.

_HEAD = struct.Struct(">qqI")
_NS_PER_DAY = 86_400 * 1_000_000_000
_LEN = struct.Struct(">I")


def encode_record(pubsub_topic: str, message: WakuMessage, arrival_ns: int) -> bytes:
    # One join of a fixed tuple: once per message on the put path.
    pubsub = pubsub_topic.encode()
    content = message.content_topic.encode()
    payload, meta, proof = message.payload, message.meta, message.rate_limit_proof
    pack = _LEN.pack
    return b"".join(
        (
            _HEAD.pack(arrival_ns, message.timestamp, message.version),
            pack(len(pubsub)),
            pubsub,
            pack(len(content)),
            content,
            pack(len(payload)),
            payload,
            pack(len(meta)),
            meta,
            pack(len(proof)),
            proof,
        )
    )


def decode_record(record: bytes) -> Row:
    arrival_ns, timestamp, version = _HEAD.unpack_from(record, 0)
    offset = _HEAD.size
    fields = []
    for _ in range(5):
        (length,) = _LEN.unpack_from(record, offset)
        offset += _LEN.size
        fields.append(record[offset : offset + length])
        offset += length
    pubsub, content, payload, meta, proof = fields
    message = WakuMessage(
        payload=bytes(payload),
        content_topic=content.decode(),
        version=version,
        timestamp=timestamp,
        meta=bytes(meta),
        rate_limit_proof=bytes(proof),
    )
    return Row.build(pubsub.decode(), message, arrival_ns)


# --- Arrow ----------------------------------------------------------------


# Each stored column of row objects (the day is derived), from the rows
# and their messages: a comprehension a column (a map over attrgetter
# takes twice as long, a getattr a value longer still).
_ROW_VALUES: dict[str, Callable[[list[Row], list[WakuMessage]], list]] = {
    "muid": lambda rows, _: [r.muid for r in rows],
    "message_hash": lambda rows, _: [r.message_hash for r in rows],
    "digest": lambda rows, _: [r.digest for r in rows],
    "pubsub_topic": lambda rows, _: [r.pubsub_topic for r in rows],
    "content_topic": lambda _, messages: [m.content_topic for m in messages],
    "payload": lambda _, messages: [m.payload for m in messages],
    "meta": lambda _, messages: [m.meta for m in messages],
    "version": lambda _, messages: [m.version for m in messages],
    "timestamp": lambda rows, _: [r.timestamp for r in rows],
    "sender_timestamp": lambda _, messages: [m.timestamp for m in messages],
    "rate_limit_proof": lambda _, messages: [m.rate_limit_proof for m in messages],
    "arrival_time": lambda rows, _: [r.arrival_time for r in rows],
}
_STORED = tuple(f.name for f in schema.MESSAGES if f.name != schema.MESSAGES_PARTITION)


def to_arrow(rows: Iterable[Row]) -> pa.Table:
    rows = list(rows)
    if not rows:
        return schema.MESSAGES.empty_table()
    table = rows_table(rows, _STORED)
    partition = schema.MESSAGES.field(schema.MESSAGES_PARTITION)
    return table.append_column(partition, _days(table.column("timestamp")))


def rows_table(rows: Sequence[Row], columns: Sequence[str]) -> pa.Table:
    """Row objects as a table of ``columns`` (the table's types; not the day)."""
    if not rows:
        return schema.empty_page(columns)
    listed = list(rows)
    messages = [r.message for r in listed]
    target = schema.page_schema(columns)
    return pa.Table.from_arrays(
        [pa.array(_ROW_VALUES[f.name](listed, messages), f.type) for f in target], schema=target
    )


def _days(timestamps: pa.Array) -> pa.Array:
    """schema.day_of_ns, vectorised: negative times clamp to the epoch."""
    return pc.divide(pc.max_element_wise(timestamps, 0), _NS_PER_DAY).cast(pa.int32()).cast(pa.date32())


def _message_at(columns: dict, i: int) -> WakuMessage:
    """The WakuMessage of row ``i`` of a result with the data columns."""
    return WakuMessage(
        payload=columns["payload"][i],
        content_topic=columns["content_topic"][i],
        version=columns["version"][i],
        timestamp=columns["sender_timestamp"][i],
        meta=columns["meta"][i],
        rate_limit_proof=columns["rate_limit_proof"][i],
    )


def from_arrow(table: pa.Table, include_data: bool = True) -> list[StoredMessage]:
    """StoredMessages from a result with at least message_hash, pubsub_topic, timestamp."""
    columns = table.to_pydict()
    n = table.num_rows
    digests = columns.get("digest") or [b""] * n
    return [
        StoredMessage(
            columns["message_hash"][i],
            columns["pubsub_topic"][i],
            _message_at(columns, i) if include_data else None,
            columns["timestamp"][i],
            digests[i],
        )
        for i in range(n)
    ]


def rows_from_arrow(table: pa.Table) -> list[Row]:
    """Full rows (for window export and re-import)."""
    columns = table.to_pydict()
    return [
        Row(
            muid=columns["muid"][i],
            message_hash=columns["message_hash"][i],
            digest=columns["digest"][i],
            pubsub_topic=columns["pubsub_topic"][i],
            message=_message_at(columns, i),
            timestamp=columns["timestamp"][i],
            arrival_time=columns["arrival_time"][i],
        )
        for i in range(table.num_rows)
    ]


# --- columnar building ----------------------------------------------------


def messages_to_arrow(messages: Sequence[tuple[str, WakuMessage, int]], hasher: BatchHasher | None = None) -> pa.Table:
    """The table rows of ``(pubsub_topic, message, arrival_ns)`` triples,
    built a column at a time: what :meth:`Row.build` and :func:`to_arrow`
    make, with no object per message (the put path's conversion).
    ``hasher``: a worker process for the hashes of batches large enough."""
    if not messages:
        return schema.MESSAGES.empty_table()
    pubsub, wire, arrival = zip(*messages)
    return _columns_to_arrow(
        pubsub,
        [m.content_topic for m in wire],
        [m.payload for m in wire],
        [m.meta for m in wire],
        [m.version for m in wire],
        [m.timestamp for m in wire],
        [m.rate_limit_proof for m in wire],
        arrival,
        hasher=hasher,
    )


def records_to_arrow(records: Sequence[tuple]) -> pa.Table:
    """The table rows of decoded archive records (protocols.archive_records
    ``DecodedRecord``: pubsub topic, content topic, payload, meta, version,
    sender timestamp, proof, arrival, message hash), built a column at a
    time. The hash is the record's, checked by the decoder against the
    rebuilt message."""
    if not records:
        return schema.MESSAGES.empty_table()
    pubsub, content, payload, meta, version, sender, proof, arrival, hashes = zip(*records)
    return _columns_to_arrow(pubsub, content, payload, meta, version, sender, proof, arrival, hashes)


def archive_columns_to_arrow(columns) -> pa.Table:
    """The table rows of an archive decoded by the compiled decoder
    (protocols.archive.ArchiveColumns): :func:`records_to_arrow` of the
    same records, built from its buffers without an object per row."""
    count = columns.count

    def binary(pair) -> pa.Array:
        offsets, values = pair
        return pa.Array.from_buffers(pa.binary(), count, [None, pa.py_buffer(offsets), pa.py_buffer(values)])

    def strings(values: list[str], index) -> pa.Array:
        return pa.array(values, pa.string()).take(pa.array(index, pa.int32()))

    return _table(
        binary(columns.muids),
        _fixed32(count, columns.hashes),
        _fixed32(count, columns.digests),
        strings(columns.pubsub_topics, columns.pubsub_index),
        strings(columns.content_topics, columns.topic_index),
        binary(columns.payload),
        binary(columns.meta),
        columns.version,
        columns.sender_ns,
        binary(columns.proof),
        columns.arrival_ns,
    )


def _columns_to_arrow(
    pubsub, content, payload, meta, version, sender, proof, arrival, hashes=None, hasher: BatchHasher | None = None
) -> pa.Table:
    """The message table's rows from its stored columns (equal-length
    sequences); the message hashes are computed unless given. Each hash
    is one call over one joined buffer, in one comprehension per column:
    the per-message cost is the hashing itself (three SHA-256 over the
    payload, ~0.7 us a KiB each here) plus a few hundred nanoseconds;
    with a ``hasher``, a batch large enough is hashed in its process."""
    encoded_pubsub = {t: t.encode() for t in set(pubsub)}
    encoded_content = {t: t.encode() for t in set(content)}
    pubsub_bytes = [encoded_pubsub[p] for p in pubsub]
    content_bytes = [encoded_content[c] for c in content]
    hashed = None
    if hasher is not None and hashes is None and len(payload) >= MIN_BATCH:
        hashed = hasher.hash(pubsub_bytes, payload, content_bytes, meta, sender)
    if hashed is not None:
        hashes, digests, muids = _hashed_arrays(len(payload), *hashed)
    else:
        sha = hashlib.sha256
        if hashes is None:
            stamp = _TIMESTAMP.pack
            hashes = [
                sha(b"".join((p, pl, c, m, stamp(s)))).digest()
                for p, pl, c, m, s in zip(pubsub_bytes, payload, content_bytes, meta, sender)
            ]
        muids = [
            sha(b"".join((p, c, m, pl))).digest() + m[:_MUID_META_PART]
            for p, c, m, pl in zip(pubsub_bytes, content_bytes, meta, payload)
        ]
        digests = [sha(c + pl).digest() for c, pl in zip(content_bytes, payload)]
    return _table(muids, hashes, digests, pubsub, content, payload, meta, version, sender, proof, arrival)


def _table(muids, hashes, digests, pubsub, content, payload, meta, version, sender, proof, arrival) -> pa.Table:
    """The messages table from its stored columns: Arrow arrays, or values
    Arrow converts to the column's type; the ordering time and the day
    are derived here."""
    sender_ns = pa.array(sender, pa.int64())
    arrival_ns = pa.array(arrival, pa.int64())
    # The ordering time: the sender's timestamp, or the arrival when unset.
    ts = pc.if_else(pc.equal(sender_ns, 0), arrival_ns, sender_ns)
    return pa.Table.from_arrays(
        [
            _typed(muids, pa.binary()),
            _typed(hashes, pa.binary()),
            _typed(digests, pa.binary()),
            _typed(pubsub, pa.string()),
            _typed(content, pa.string()),
            _typed(payload, pa.binary()),
            _typed(meta, pa.binary()),
            pa.array(version, pa.int32()),
            ts,
            sender_ns,
            _typed(proof, pa.binary()),
            arrival_ns,
            _days(ts),
        ],
        schema=schema.MESSAGES,
    )


def _typed(values, type_: pa.DataType) -> pa.Array:
    return values if isinstance(values, pa.Array) else pa.array(values, type_)


def _fixed32(count: int, values: bytes) -> pa.Array:
    """A binary column of 32-byte values laid end to end (hashes)."""
    return pa.Array.from_buffers(pa.binary(32), count, [None, pa.py_buffer(values)]).cast(pa.binary())


def _hashed_arrays(count: int, hashes: bytes, digests: bytes, muid_lengths, muids: bytes) -> tuple[pa.Array, ...]:
    """Binary columns from a hash worker's buffers (no object per value)."""
    offsets = np.zeros(count + 1, dtype=np.int32)
    np.cumsum(np.frombuffer(muid_lengths, dtype=np.uint32), out=offsets[1:])
    muid = pa.Array.from_buffers(pa.binary(), count, [None, pa.py_buffer(offsets), pa.py_buffer(muids)])
    return _fixed32(count, hashes), _fixed32(count, digests), muid


def binary_prefixes(values: pa.Array | pa.ChunkedArray, width: int) -> np.ndarray:
    """The first ``width`` (4 or 8) bytes of each value of a binary column
    (hashes) as big-endian unsigned integers, without a Python object per
    value. Raises ValueError on a null or a value shorter than ``width``."""
    return byte_prefixes(leading_bytes(values, width), width)


def byte_prefixes(matrix: np.ndarray, width: int) -> np.ndarray:
    """The first ``width`` (4 or 8) columns of an (n, >= width) array of
    bytes (:func:`leading_bytes`) as big-endian unsigned integers."""
    dtype = {4: np.uint32, 8: np.uint64}[width]
    return np.ascontiguousarray(matrix[:, :width]).view(f">u{width}").ravel().astype(dtype)


def leading_bytes(values: pa.Array | pa.ChunkedArray, width: int) -> np.ndarray:
    """The first ``width`` bytes of each value of a binary column, as an
    (n, width) array of bytes, without a Python object per value. Raises
    ValueError on a null or a value shorter than ``width``."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if values.null_count:
        raise ValueError("null values in a key column")
    values = values.cast(pa.binary())
    count = len(values)
    if count == 0:
        return np.zeros((0, width), dtype=np.uint8)
    if pc.min(pc.binary_length(values)).as_py() < width:
        raise ValueError(f"values shorter than {width} bytes in a key column")
    # Arrow's own kernel cuts every value to its first bytes, one after the
    # other: the data buffer is the array (4x a numpy gather of the bytes).
    cut = pc.binary_slice(values, 0, width)
    start = int(np.frombuffer(cut.buffers()[1], dtype=np.int32)[cut.offset])
    return np.frombuffer(cut.buffers()[2], dtype=np.uint8)[start : start + count * width].reshape(count, width)
