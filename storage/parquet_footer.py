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


def _varint(buf: memoryview, at: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        if at >= len(buf) or shift > 63:
            raise FooterError("truncated or overlong varint")
        byte = buf[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7


def _skip(buf: memoryview, at: int, kind: int, depth: int = 0) -> int:
    """The position after a value of ``kind`` starting at ``at``."""
    if depth > _MAX_DEPTH:
        raise FooterError("nested too deep")
    if kind in (_TRUE, _FALSE):  # a field's boolean is in its header
        return at
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
    if kind in (_LIST, _SET):
        count, element, at = _list_header(buf, at)
        for _ in range(count):
            at = _element(buf, at, element, depth)
        return at
    if kind == _MAP:
        count, at = _varint(buf, at)
        if count:
            if 2 * count > len(buf) - at:
                raise FooterError("map longer than the footer")
            types = buf[at]
            at += 1
            for _ in range(count):
                at = _element(buf, at, types >> 4, depth)
                at = _element(buf, at, types & 0x0F, depth)
        return at
    if kind == _STRUCT:
        field = 0
        while True:
            field, kind, at = _field_header(buf, at, field)
            if kind == _STOP:
                return at
            at = _skip(buf, at, kind, depth + 1)
    raise FooterError(f"unknown compact protocol type {kind}")


def _field_header(buf: memoryview, at: int, field: int) -> tuple[int, int, int]:
    """(field id, type, position after) of the field header at ``at`` of a
    struct whose previous field was ``field``; type STOP at the struct's end."""
    if at >= len(buf):
        raise FooterError("truncated struct")
    header = buf[at]
    at += 1
    if header == _STOP:
        return field, _STOP, at
    if header >> 4:  # the id as a delta from the previous field's
        return field + (header >> 4), header & 0x0F, at
    zigzag, at = _varint(buf, at)
    return (zigzag >> 1) ^ -(zigzag & 1), header & 0x0F, at


def _element(buf: memoryview, at: int, kind: int, depth: int) -> int:
    """The position after a list, set or map element (a boolean element is a byte)."""
    return at + 1 if kind in (_TRUE, _FALSE) else _skip(buf, at, kind, depth + 1)


def _list_header(buf: memoryview, at: int) -> tuple[int, int, int]:
    if at >= len(buf):
        raise FooterError("truncated list")
    header = buf[at]
    at += 1
    count = header >> 4
    if count == 15:
        count, at = _varint(buf, at)
    if count > len(buf) - at:  # every element takes a byte at least
        raise FooterError("list longer than the footer")
    return count, header & 0x0F, at


class GroupFooters:
    """A Parquet footer (the Thrift bytes between the data and the length)
    split at its row groups; :meth:`metadata` makes the ``FileMetaData``
    of one of them. Raises :class:`FooterError` for bytes it cannot split."""

    __slots__ = ("_footer", "_head", "_bounds")

    def __init__(self, footer: bytes):
        buf = memoryview(footer)
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
                bounds = np.empty(count + 1, np.int64)
                bounds[0] = at
                for group in range(count):
                    at = _skip(buf, at, _STRUCT)
                    bounds[group + 1] = at
                if at > len(buf):
                    raise FooterError("truncated row groups")
                self._footer = bytes(footer)
                self._head = head
                self._bounds = bounds
                return
            at = _skip(buf, at, kind)

    @classmethod
    def of(cls, metadata: pq.FileMetaData) -> GroupFooters:
        """Split a parsed footer (serialized again: the same bytes as the file's)."""
        sink = pa.BufferOutputStream()
        metadata.write_metadata_file(sink)
        framed = sink.getvalue()
        size = int.from_bytes(framed[len(framed) - 8 : len(framed) - 4].to_pybytes(), "little")
        return cls(framed[len(framed) - 8 - size : len(framed) - 8].to_pybytes())

    @property
    def num_row_groups(self) -> int:
        return len(self._bounds) - 1

    @property
    def nbytes(self) -> int:
        return len(self._footer) + self._bounds.nbytes

    def metadata(self, group: int) -> pq.FileMetaData:
        """The footer of row group ``group`` alone (its row group 0)."""
        if not 0 <= group < self.num_row_groups:
            raise IndexError(f"row group {group} of {self.num_row_groups}")
        footer = self._footer
        start, end = int(self._bounds[group]), int(self._bounds[group + 1])
        one = b"".join((footer[: self._head], _ONE_STRUCT, footer[start:end], footer[int(self._bounds[-1]) :]))
        framed = b"".join((_MAGIC, one, len(one).to_bytes(4, "little"), _MAGIC))
        return pq.read_metadata(pa.BufferReader(framed))
