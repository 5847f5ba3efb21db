"""A Parquet file's footer kept serialized, one row group's metadata made on demand.

Why: pyarrow's parsed ``FileMetaData`` costs ~10 KB a row group in memory
(measured, 12 columns), ~40 bytes a row at the 256-row row groups of a
compacted day: 400 MB at 10M messages, more than the rest of the key
index. Serialized, the same footer is ~4.5 bytes a row. A read of one row
group needs only the schema and that row group's column chunks, so the
footer is split once into its head (fields before the row groups), the
row groups' byte ranges and its tail, and a row group is read through a
footer of that one row group (0.1 ms to parse, beside 0.5-0.8 ms to read
the row group).

The footer is Thrift's compact protocol (parquet-format's ``FileMetaData``;
field 4 is ``list<RowGroup>``). A struct's fields carry deltas of their
ids, so a footer whose list holds one element of the original's, between
the original's head and tail bytes, is a valid footer with every other
field as it was; column chunk offsets are absolute in the file.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

_MAGIC = b"PAR1"
_ROW_GROUPS_FIELD = 4

# Compact protocol types.
_TRUE, _FALSE, _BYTE, _I16, _I32, _I64, _DOUBLE, _BINARY, _LIST, _SET, _MAP, _STRUCT, _UUID = range(1, 14)
_STOP = 0
# A list holding one struct: size 1 in the high nibble, element type struct.
_ONE_STRUCT = bytes(((1 << 4) | _STRUCT,))
# Nesting deeper than parquet-format's (a few levels) is not a footer.
_MAX_DEPTH = 32


class FooterError(ValueError):
    """Bytes that are not a Parquet footer this module can split."""


def _varint(buf: bytes, at: int) -> tuple[int, int]:
    """(value, position after) of the unsigned varint at ``at``."""
    shift = value = 0
    while True:
        byte = buf[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7
        if shift > 63:
            raise FooterError("overlong varint")


def _struct_end(buf: bytes, at: int, depth: int) -> int:
    """The position after the struct whose first field header is at ``at``.
    The common fields (integers, binaries, nested structs) are skipped
    inline: a footer holds ~300 values a row group. Reading past the end
    raises IndexError (the caller's FooterError)."""
    if depth > _MAX_DEPTH:
        raise FooterError("nested too deep")
    while True:
        header = buf[at]
        at += 1
        if header == _STOP:
            return at
        if header < 0x10:  # a field id of its own (no delta): a zigzag varint
            while buf[at] & 0x80:
                at += 1
            at += 1
        kind = header & 0x0F
        if _I16 <= kind <= _I64:
            while buf[at] & 0x80:
                at += 1
            at += 1
        elif kind == _BINARY:
            size = buf[at]
            if size < 0x80:
                at += 1 + size
            else:
                size, at = _varint(buf, at)
                at += size
        elif kind == _STRUCT:
            at = _struct_end(buf, at, depth + 1)
        elif kind in (_LIST, _SET):
            count, element, at = _list_header(buf, at)
            for _ in range(count):
                at = _value_end(buf, at, element, depth + 1, element_of_list=True)
        elif kind != _TRUE and kind != _FALSE:  # a field's boolean is in its header
            at = _value_end(buf, at, kind, depth + 1, element_of_list=False)


def _value_end(buf: bytes, at: int, kind: int, depth: int, element_of_list: bool) -> int:
    """The position after a value of ``kind`` at ``at`` (a list's boolean
    element is a byte; a field's is in its header)."""
    if kind in (_TRUE, _FALSE):
        return at + 1 if element_of_list else at
    if kind == _BYTE:
        return at + 1
    if kind in (_I16, _I32, _I64):
        return _varint(buf, at)[1]
    if kind == _DOUBLE:
        return at + 8
    if kind == _UUID:
        return at + 16
    if kind == _BINARY:
        size, at = _varint(buf, at)
        return at + size
    if kind == _STRUCT:
        return _struct_end(buf, at, depth)
    if kind in (_LIST, _SET):
        count, element, at = _list_header(buf, at)
        for _ in range(count):
            at = _value_end(buf, at, element, depth + 1, True)
        return at
    if kind == _MAP:
        count, at = _varint(buf, at)
        if count:
            if 2 * count > len(buf) - at:
                raise FooterError("map longer than the footer")
            types = buf[at]
            at += 1
            for _ in range(count):
                at = _value_end(buf, at, types >> 4, depth + 1, True)
                at = _value_end(buf, at, types & 0x0F, depth + 1, True)
        return at
    raise FooterError(f"unknown compact protocol type {kind}")


def _list_header(buf: bytes, at: int) -> tuple[int, int, int]:
    header = buf[at]
    at += 1
    count = header >> 4
    if count == 15:
        count, at = _varint(buf, at)
    if count > len(buf) - at:  # every element takes a byte at least
        raise FooterError("list longer than the footer")
    return count, header & 0x0F, at


def _field_header(buf: bytes, at: int, field: int) -> tuple[int, int, int]:
    """(field id, type, position after) of the field header at ``at`` of a
    struct whose previous field was ``field``; type STOP at its end."""
    header = buf[at]
    at += 1
    if header == _STOP:
        return field, _STOP, at
    if header >> 4:  # the id as a delta from the previous field's
        return field + (header >> 4), header & 0x0F, at
    zigzag, at = _varint(buf, at)
    return (zigzag >> 1) ^ -(zigzag & 1), header & 0x0F, at


# FileMetaData's fields after its row groups, by id: key_value_metadata,
# created_by, column_orders, encryption_algorithm, footer_signing_key_metadata.
_TAIL_FIELDS = {5: _LIST, 6: _BINARY, 7: _LIST, 8: _STRUCT, 9: _BINARY}


def _split(buf: bytes) -> tuple[int, np.ndarray]:
    """(where FileMetaData's row group list header starts, the bounds of
    its row groups: n + 1 positions)."""
    at = field = 0
    while True:
        field, kind, at = _field_header(buf, at, field)
        if kind == _STOP:
            raise FooterError("no row groups field")
        if field == _ROW_GROUPS_FIELD and kind == _LIST:
            head = at
            count, element, at = _list_header(buf, at)
            if element != _STRUCT:
                raise FooterError("row groups are not structs")
            bounds = _found_bounds(buf, at, count)
            if bounds is None:
                bounds = np.empty(count + 1, np.int64)
                bounds[0] = at
                for group in range(count):
                    at = _struct_end(buf, at, 0)
                    bounds[group + 1] = at
            return head, bounds
        at = _value_end(buf, at, kind, 0, False)


def _found_bounds(buf: bytes, first: int, count: int) -> np.ndarray | None:
    """The bounds of ``count`` row groups from ``first``, found by their
    first bytes instead of walked (~300 values a row group): each row
    group after the first starts right after its predecessor's STOP with
    its ``columns`` field (id 1, a list of the file's columns), so every
    start is among the matches of those bytes. A match inside a value (a
    statistic's bytes) would shift the starts that follow: then the walk
    of the last row group does not end where FileMetaData's remaining
    fields (checked by their types, to the footer's end) begin, and None
    is returned (the caller walks every row group)."""
    if count < 2:
        return None
    if buf[first] != (1 << 4) | _LIST:
        return None
    _, _, columns_at = _list_header(buf, first + 1)
    pattern = b"\x00" + buf[first:columns_at]
    bounds = np.empty(count + 1, np.int64)
    bounds[0] = at = first
    for group in range(1, count):
        at = buf.find(pattern, at)
        if at < 0:
            return None
        at += 1
        bounds[group] = at
    try:
        bounds[count] = end = _struct_end(buf, int(bounds[count - 1]), 0)
        return bounds if _tail_ends_footer(buf, end) else None
    except (FooterError, IndexError, RecursionError):  # shifted into a value
        return None


def _tail_ends_footer(buf: bytes, at: int) -> bool:
    """Do FileMetaData's fields after the row groups start at ``at``, each
    of its type, and end with the footer?"""
    field = _ROW_GROUPS_FIELD
    while True:
        field, kind, at = _field_header(buf, at, field)
        if kind == _STOP:
            return at == len(buf)
        if _TAIL_FIELDS.get(field) != kind:
            return False
        at = _value_end(buf, at, kind, 0, False)


class GroupFooters:
    """A Parquet footer (the Thrift bytes between the data and the length)
    split at its row groups; :meth:`metadata` makes the ``FileMetaData``
    of one of them. Raises :class:`FooterError` for bytes it cannot split."""

    __slots__ = ("_footer", "_head", "_bounds")

    def __init__(self, footer: bytes):
        footer = bytes(footer)
        try:
            head, bounds = _split(footer)
        except (IndexError, RecursionError):
            raise FooterError("truncated footer") from None
        if bounds[-1] > len(footer):
            raise FooterError("truncated row groups")
        self._footer = footer
        self._head = head
        self._bounds = bounds

    @classmethod
    def of(cls, metadata: pq.FileMetaData) -> GroupFooters:
        """Split a parsed footer (serialized again: the same bytes as the file's)."""
        sink = pa.BufferOutputStream()
        metadata.write_metadata_file(sink)
        framed = sink.getvalue()
        size = int.from_bytes(framed[len(framed) - 8 : len(framed) - 4].to_pybytes(), "little")
        return cls(framed[len(framed) - 8 - size : len(framed) - 8].to_pybytes())

    @classmethod
    def presplit(cls, footer, head: int, bounds: np.ndarray) -> GroupFooters:
        """A footer split before (:attr:`buffer`, :attr:`head`,
        :attr:`bounds` as they were): any buffer, a map's included."""
        self = cls.__new__(cls)
        self._footer = footer
        self._head = int(head)
        self._bounds = bounds
        return self

    @property
    def buffer(self):
        """The footer's bytes."""
        return self._footer

    @property
    def head(self) -> int:
        """Bytes of the footer before its row groups."""
        return self._head

    @property
    def bounds(self) -> np.ndarray:
        """Byte ranges of the row groups in the footer (row group i spans bounds[i]:bounds[i + 1])."""
        return self._bounds

    @property
    def num_row_groups(self) -> int:
        return len(self._bounds) - 1

    @property
    def nbytes(self) -> int:
        return memoryview(self._footer).nbytes + self._bounds.nbytes

    def metadata(self, group: int) -> pq.FileMetaData:
        """The footer of row group ``group`` alone (its row group 0)."""
        if not 0 <= group < self.num_row_groups:
            raise IndexError(f"row group {group} of {self.num_row_groups}")
        footer = self._footer
        start, end = int(self._bounds[group]), int(self._bounds[group + 1])
        one = b"".join((footer[: self._head], _ONE_STRUCT, footer[start:end], footer[int(self._bounds[-1]) :]))
        return _parsed(one)


def _parsed(footer: bytes) -> pq.FileMetaData:
    """pyarrow's FileMetaData of these Thrift bytes: as pyarrow unpickles
    one (no file reader made: 57 instead of 172 us), else as a file's."""
    if _unpickle is not None:
        return _unpickle(pa.py_buffer(footer))
    framed = b"".join((_MAGIC, footer, len(footer).to_bytes(4, "little"), _MAGIC))
    return pq.read_metadata(pa.BufferReader(framed))


try:  # what FileMetaData.__reduce__ names (pyarrow 18 to 26 at least)
    from pyarrow._parquet import _reconstruct_filemetadata as _unpickle
except ImportError:
    _unpickle = None
