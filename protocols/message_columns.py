"""A Store page's rows held column by column, as Arrow lays them out.

The read path answers in Arrow (storage.read_path); a page reaches the
Store encoders as :class:`MessageColumns`, which holds the columns'
buffers (no Arrow object: this package knows none) and writes them as
protobuf with one compiled call (``wakustore._native.encode_entries``),
byte for byte what the protobuf runtime writes for the same rows.

It is a sequence of :class:`~wakustore.protocols.store_query.StoredMessage`
too, each built when it is read, for the readers that want objects (the
REST API's JSON, sync, an archive export): no object is made for a page
that only goes on the wire.

A binary or string column is ``(offsets, data)``: ``offsets`` the
``count + 1`` int32 offsets of Arrow's layout (each value is
``data[offsets[i]:offsets[i + 1]]``), ``data`` the values' bytes.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import overload

import numpy as np

import wakustore._native as _native
from wakustore.protocols.errors import MessageError
from wakustore.protocols.message import WakuMessage
from wakustore.protocols.store_query import StoredMessage

Binary = tuple[np.ndarray, bytes | memoryview]

# Forms of _native.encode_entries.
V3_KEYS = 0  # StoreQueryResponse.messages (20): the hash alone
V3_DATA = 1  # the hash, the message and its pubsub topic
V2_MESSAGES = 2  # HistoryResponse.messages (2): the messages alone


@dataclass(frozen=True, slots=True)
class MessageData:
    """The columns of the messages themselves (a page with data)."""

    content_topic: Binary
    payload: Binary
    meta: Binary
    rate_limit_proof: Binary
    version: np.ndarray  # int32
    sender_timestamp: np.ndarray  # int64


class MessageColumns(Sequence[StoredMessage]):
    """Rows held in columns: their hashes, pubsub topics and ordering
    times, the legacy digests when known, and the messages when the page
    has data; the page is the rows at ``order`` (positions among the
    columns' rows, in page order; None: every row as it stands), so that
    a page is ordered without a copy of its rows."""

    __slots__ = ("rows", "order", "length", "message_hash", "pubsub_topic", "timestamp", "digest", "data")

    def __init__(
        self,
        message_hash: Binary,
        pubsub_topic: Binary,
        timestamp: np.ndarray,
        digest: Binary | None = None,
        data: MessageData | None = None,
        order: np.ndarray | None = None,
    ):
        self.rows = len(timestamp)
        for column in (message_hash, pubsub_topic, digest) + (
            () if data is None else (data.content_topic, data.payload, data.meta, data.rate_limit_proof)
        ):
            if column is not None and len(column[0]) != self.rows + 1:
                raise ValueError("columns of different lengths")
        if order is None:
            order = np.arange(self.rows, dtype=np.int64)
        self.order = np.ascontiguousarray(order, dtype=np.int64)
        if len(self.order) and (self.order.min() < 0 or self.order.max() >= self.rows):
            raise ValueError("order names a row past the columns")
        self.length = len(self.order)
        self.message_hash = message_hash
        self.pubsub_topic = pubsub_topic
        self.timestamp = timestamp
        self.digest = digest
        self.data = data

    def __len__(self) -> int:
        return self.length

    @overload
    def __getitem__(self, index: int) -> StoredMessage: ...

    @overload
    def __getitem__(self, index: slice) -> list[StoredMessage]: ...

    def __getitem__(self, index: int | slice) -> StoredMessage | list[StoredMessage]:
        if isinstance(index, slice):
            return [self._row(i) for i in range(*index.indices(self.length))]
        if index < 0:
            index += self.length
        if not 0 <= index < self.length:
            raise IndexError("row out of range")
        return self._row(index)

    def __iter__(self) -> Iterator[StoredMessage]:
        return (self._row(i) for i in range(self.length))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence):
            return NotImplemented
        return list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]  # mutable-sequence semantics: compared by value

    def __repr__(self) -> str:
        return f"MessageColumns({list(self)!r})"

    def encode(self, form: int) -> bytes:
        """The rows as repeated protobuf fields (see the module doc); raises
        :class:`MessageError` for a row that does not fit the wire format."""
        data = self.data
        message_columns: tuple[Binary | None, ...] = (
            (None,) * 4 if data is None else (data.payload, data.content_topic, data.meta, data.rate_limit_proof)
        )
        try:
            encoded: bytes = _native.encode_entries(
                form,
                self.rows,
                self.order,
                self.message_hash,
                self.pubsub_topic,
                *message_columns,
                None if data is None else data.version,
                None if data is None else data.sender_timestamp,
            )
        except ValueError as exc:
            raise MessageError(f"message does not fit the wire format: {exc}") from None
        return encoded

    def _row(self, at: int) -> StoredMessage:
        i = int(self.order[at])
        data = self.data
        message = None
        if data is not None:
            message = WakuMessage(
                payload=_value(data.payload, i),
                content_topic=_value(data.content_topic, i).decode(),
                version=int(data.version[i]),
                timestamp=int(data.sender_timestamp[i]),
                meta=_value(data.meta, i),
                rate_limit_proof=_value(data.rate_limit_proof, i),
            )
        return StoredMessage(
            _value(self.message_hash, i),
            _value(self.pubsub_topic, i).decode(),
            message,
            int(self.timestamp[i]),
            b"" if self.digest is None else _value(self.digest, i),
        )


def _value(column: Binary, i: int) -> bytes:
    offsets, data = column
    return bytes(data[int(offsets[i]) : int(offsets[i + 1])])
