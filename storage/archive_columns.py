"""status-go archive records of a whole export batch at once, with Arrow's
kernels: the bytes of :meth:`RecordEncoder.encode_framed` (the reference,
one record at a time in Python; the tests hold the two equal), in a
fraction of its time.

Per row, only the channel cipher runs in Python (one AES-GCM decryption),
and a key recovery for a signed payload whose signer is not known yet.
The rest is columns: the plaintexts are parsed with numpy (flags, size
field, where payload, padding and signature lie), their parts cut out as
binary views over the plaintexts' buffer, every field made a column
(key, length varint, value; empty where the record has no such field)
and the fields joined row by row. The framed entries come out as one
Arrow binary array, whose data buffer is the batch's body.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from cryptography.exceptions import InvalidTag

from wakustore.protocols import waku_v1
from wakustore.protocols.archive_records import NS_PER_S, RecordEncoder, recover_signer, varint, varint_blob
from wakustore.protocols.archive_records import STATUS_GO_KEYS as KEYS

if TYPE_CHECKING:
    from typing_extensions import Buffer

_NONCE = waku_v1.AES_NONCE_SIZE
_SIGNATURE = waku_v1.SIGNATURE_SIZE
_EMPTY = pa.scalar(b"", pa.binary())


def encode_framed(
    encoder: RecordEncoder, batch: pa.Table, signers: pa.Array | pa.ChunkedArray | None = None
) -> tuple[bytes, list[int], list[int]] | None:
    """:meth:`RecordEncoder.encode_framed` of an export batch (the
    columns of :data:`archive_window.EXPORT_COLUMNS`), status-go layout;
    ``signers``: known signers, null where unknown. None when the batch
    holds a time before 1970, which the reference encodes (or refuses)
    row by row."""
    n = batch.num_rows
    if n == 0:
        return b"", [], []
    stamps = _numbers(batch, "sender_timestamp")
    arrived = _numbers(batch, "arrival_time")
    ordering = np.where(stamps != 0, stamps, arrived)
    version = _numbers(batch, "version")
    if (arrived < 0).any() or (ordering < 0).any() or (version < 0).any():
        return None
    content = batch.column("content_topic").combine_chunks()
    payload = batch.column("payload").combine_chunks()
    opened = _Opened(encoder, content, payload, version, None if signers is None else _chunk(signers))

    topic_of = {t: encoder.topic_bytes(t) for t in pc.unique(content).to_pylist()}
    topic_field = _mapped(content, {t: KEYS.topic + varint(len(b)) + b for t, b in topic_of.items()})
    pubsub = batch.column("pubsub_topic").combine_chunks()
    pubsub_field = _mapped(pubsub, {t: encoder.pubsub_field(t) for t in pc.unique(pubsub).to_pylist()})
    payload_out = opened.payload
    fields = [
        _field(KEYS.signer, opened.signer, opened.signed),
        _join(pa.scalar(KEYS.seconds), _varints(ordering // NS_PER_S), where=ordering >= NS_PER_S),
        topic_field,
        *_bytes_parts(KEYS.payload, payload_out),
        *_bytes_parts(KEYS.padding, opened.padding),
        _field(KEYS.hash, batch.column("message_hash").combine_chunks(), None),
        pubsub_field,
        _join(pa.scalar(KEYS.arrival), _varints(arrived)),
        _field(KEYS.nonce, opened.nonce, opened.mask),
        _field(KEYS.signature, opened.signature, opened.signed),
        _join(pa.scalar(KEYS.timestamp), _varints((stamps << 1) ^ (stamps >> 63)), where=stamps != 0),
        _bytes_field(KEYS.meta, batch.column("meta").combine_chunks()),
        _join(pa.scalar(KEYS.version), _varints(version), where=version != 0),
        _bytes_field(KEYS.proof, batch.column("rate_limit_proof").combine_chunks()),
    ]
    record_lengths = cast(np.ndarray, sum(_lengths(f) for f in fields))  # fields is not empty: never the 0
    framed = pc.binary_join_element_wise(pa.scalar(KEYS.entry), _varints(record_lengths), *fields, b"")
    ends = _offsets(framed)
    body = framed.buffers()[2]
    start = int(ends[0])
    sizes = _lengths(payload_out) + np.where(opened.signed, _lengths(opened.signer), 0)
    return body[start : int(ends[-1])].to_pybytes(), (ends[1:] - start).tolist(), sizes.tolist()


class _Opened:
    """The rows sealed with their channel's key in the canonical form, as
    ``_open_reproducibly`` finds them, parsed a column at a time. The
    plaintexts are decrypted into one buffer, back to back."""

    def __init__(
        self, encoder: RecordEncoder, content: pa.Array, payload: pa.Array, version: np.ndarray, known: pa.Array | None
    ):
        n = len(payload)
        self.mask = np.zeros(n, bool)
        self.signed = np.zeros(n, bool)
        topics = pc.unique(content)
        ciphers = [encoder.cipher(t) for t in topics.to_pylist()]
        offsets = _offsets(payload)
        lengths = offsets[1:] - offsets[:-1]
        topic_no = pc.index_in(content, value_set=topics).to_numpy(zero_copy_only=False)
        keyed = (
            (version == 1)
            & np.array([c is not None for c in ciphers], bool)[topic_no]
            & (lengths > _NONCE + waku_v1.GCM_TAG_SIZE)
        )
        rows = np.flatnonzero(keyed)
        ends = np.zeros(len(rows) + 1, np.int64)  # of each plaintext in ``plain``
        np.cumsum(lengths[rows] - _NONCE - waku_v1.GCM_TAG_SIZE, out=ends[1:])
        plain = np.empty(max(int(ends[-1]), 1), np.uint8)
        decrypted = np.ones(len(rows), bool)
        if len(rows):
            sealed, into = memoryview(payload.buffers()[2]).cast("B"), memoryview(cast("Buffer", plain))
            for k, (topic, at, stop, begin, finish) in enumerate(
                zip(
                    topic_no[rows].tolist(),
                    offsets[rows].tolist(),
                    offsets[rows + 1].tolist(),
                    ends[:-1].tolist(),
                    ends[1:].tolist(),
                )
            ):
                try:
                    ciphers[topic].decrypt_into(
                        sealed[stop - _NONCE : stop], sealed[at : stop - _NONCE], None, into[begin:finish]
                    )
                except (InvalidTag, ValueError):
                    decrypted[k] = False
        start, length = ends[:-1], ends[1:] - ends[:-1]
        flags = plain[np.minimum(start, len(plain) - 1)].astype(np.int64)
        count = flags & waku_v1.SIZE_FIELD_MASK
        signed = (flags & waku_v1.FLAG_SIGNED) != 0
        end = length - np.where(signed, _SIGNATURE, 0)
        size = np.zeros(len(rows), np.int64)
        for i in range(waku_v1.SIZE_FIELD_MASK):
            byte = plain[np.minimum(start + 1 + i, len(plain) - 1)].astype(np.int64)
            size |= np.where(count > i, byte << (8 * i), 0)
        minimal = 1 + (size >= 1 << 8) + (size >= 1 << 16)
        good = (
            decrypted
            & ((flags & ~(waku_v1.SIZE_FIELD_MASK | waku_v1.FLAG_SIGNED)) == 0)
            & (count != 0)
            & (end >= 1 + count)
            & (count == minimal)
            & (1 + count + size <= end)
        )
        # Signers: the known ones, the others recovered (a signature that
        # recovers no key leaves the payload as it is, as the reference does).
        if known is None:
            known = pa.nulls(n, pa.binary())
        known_ok = _lengths(known.fill_null(b""))[rows] > 0
        recovered_rows, recovered = [], []
        for i in np.flatnonzero(good & signed & ~known_ok).tolist():
            at, stop = int(start[i]), int(start[i] + end[i])
            found = recover_signer(plain[stop : int(start[i] + length[i])].tobytes(), plain[at:stop].tobytes())
            if found is None:
                good[i] = False
            else:
                recovered_rows.append(int(rows[i]))
                recovered.append(found)
        rows_good = rows[good]
        self.mask[rows_good] = True
        self.signed[rows_good[signed[good]]] = True
        self.signer = known.fill_null(b"")
        if recovered:
            place = np.zeros(n, bool)
            place[recovered_rows] = True
            self.signer = pc.if_else(
                pa.array(place), _scatter(n, np.array(recovered_rows), pa.array(recovered, pa.binary())), self.signer
            )
        buffer = pa.py_buffer(plain)
        first = start + 1 + count
        opened_payload = _scatter(n, rows_good, _views(buffer, first[good], size[good]))
        self.payload = opened_payload if self.mask.all() else pc.if_else(pa.array(self.mask), opened_payload, payload)
        self.padding = _scatter(n, rows_good, _views(buffer, (first + size)[good], (end - 1 - count - size)[good]))
        self.signature = _scatter(
            n, rows_good, _views(buffer, (start + end)[good], np.where(signed, _SIGNATURE, 0)[good])
        )
        self.nonce = pc.binary_slice(payload, -_NONCE)


def _views(buffer: pa.Buffer, starts: np.ndarray, lengths: np.ndarray) -> pa.Array:
    """Binary values cut out of ``buffer`` (``starts`` are offsets into
    it): binary views over it, then copied by Arrow."""
    n = len(starts)
    if n == 0:
        return pa.array([], pa.binary())
    data = np.frombuffer(buffer, np.uint8)
    views = np.zeros((n, 16), np.uint8)
    views[:, 0:4] = lengths.astype("<i4").view(np.uint8).reshape(n, 4)
    inline = lengths <= 12
    if inline.any():
        at = starts[inline, None] + np.arange(12)
        keep = np.arange(12) < lengths[inline, None]
        views[inline, 4:16] = np.where(keep, data[np.minimum(at, len(data) - 1)], 0)
    long = ~inline
    if long.any():
        views[long, 4:8] = data[starts[long, None] + np.arange(4)]
        views[long, 12:16] = starts[long].astype("<i4").view(np.uint8).reshape(-1, 4)
    made = pa.Array.from_buffers(pa.binary_view(), n, [None, pa.py_buffer(views), buffer])
    return made.cast(pa.binary())


def _scatter(n: int, rows: np.ndarray, values: pa.Array) -> pa.Array:
    """A column of ``n`` values: ``values`` at ``rows``, empty elsewhere."""
    if len(rows) == n:
        return values
    where = np.full(n, len(values), np.int64)
    where[rows] = np.arange(len(values))
    return pa.concat_arrays([values, pa.array([b""], pa.binary())]).take(pa.array(where))


def _field(key: bytes, values: pa.Array, where: np.ndarray | None) -> pa.Array:
    """key, length, value where ``where`` (None: everywhere); empty elsewhere."""
    lengths = _lengths(values)
    if where is not None:
        lengths = lengths[where] if where.any() else lengths[:0]
    if len(lengths) and (lengths == lengths[0]).all():  # a hash, a nonce, a key: one prefix for all
        return _join(pa.scalar(key + varint(int(lengths[0]))), values, where=where)
    return _join(pa.scalar(key), _varints(_lengths(values)), values, where=where)


def _bytes_field(key: bytes, values: pa.Array) -> pa.Array:
    """A length-delimited field, absent where the value is empty."""
    head, values = _bytes_parts(key, values)
    return pc.binary_join_element_wise(head, values, b"")


def _bytes_parts(key: bytes, values: pa.Array) -> tuple[pa.Array, pa.Array]:
    """:func:`_bytes_field` as its key and length, and its value: a large
    value is copied once, by the join of the whole record."""
    lengths = _lengths(values)
    return _join(pa.scalar(key), _varints(lengths), where=lengths > 0), values


def _join(*parts, where: np.ndarray | None = None) -> pa.Array:
    joined = pc.binary_join_element_wise(*parts, b"")
    return joined if where is None or where.all() else pc.if_else(pa.array(where), joined, _EMPTY)


def _mapped(column: pa.Array, values: dict[str, bytes]) -> pa.Array:
    listed = list(values)
    return pa.array([values[t] for t in listed], pa.binary()).take(
        pc.index_in(column, value_set=pa.array(listed, column.type))
    )


def _varints(values: np.ndarray) -> pa.Array:
    values = np.ascontiguousarray(values, np.int64)
    if len(values) and 0 <= values.min() and values.max() < 0x80:  # lengths, flags: one byte each
        offsets = np.arange(len(values) + 1, dtype=np.int32)
        return pa.Array.from_buffers(
            pa.binary(), len(values), [None, pa.py_buffer(offsets), pa.py_buffer(values.astype(np.uint8))]
        )
    blob, lengths = varint_blob(values.view(np.uint64))
    offsets = np.zeros(len(lengths) + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return pa.Array.from_buffers(pa.binary(), len(lengths), [None, pa.py_buffer(offsets), pa.py_buffer(blob)])


def _offsets(array: pa.Array) -> np.ndarray:
    """The value offsets of a binary array (int64)."""
    buffer = array.buffers()[1]
    return (
        np.frombuffer(buffer, np.int32, len(array) + 1, array.offset * 4).astype(np.int64)
        if buffer
        else np.zeros(len(array) + 1, np.int64)
    )


def _lengths(array: pa.Array) -> np.ndarray:
    return pc.binary_length(array).to_numpy(zero_copy_only=False).astype(np.int64)


def _numbers(batch: pa.Table, name: str) -> np.ndarray:
    return batch.column(name).to_numpy().astype(np.int64)


def _chunk(array: pa.Array | pa.ChunkedArray) -> pa.Array:
    return array.combine_chunks() if isinstance(array, pa.ChunkedArray) else array
