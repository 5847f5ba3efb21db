"""Rows of a Parquet file read by data page, not by row group.

Why: a lookup of 50 message bodies by hash touches 50 row groups anywhere in
a day, and pyarrow reads a row group whole: ~0.2 ms of decoding for 256
rows and ~0.1 ms of set-up a call (BENCHMARKS.md), 30-40 ms for the 50, and
from a disk 280 KB each. A compacted day is written with data pages of
:data:`PAGE_ROWS` rows in every column (the same row boundaries in each,
``max_rows_per_page``, checked when the file is indexed) and
Parquet's page index, so the rows a lookup or a page wants are in a few
pages of each column.

How: a file's footer names, per column chunk, where its offset index is
(parquet-format's ``OffsetIndex``: each page's offset, size and first
row). The pages holding the wanted rows, and the dictionary page of a
dictionary-encoded column, are read with ``pread`` into one buffer; a
footer is made whose row groups are those pages (one row group per page
span, each column chunk pointing at its pages in the buffer); and pyarrow
decodes the whole buffer in one call, every page with its own checks
(sizes, CRCs when written, decompression). Nothing of Parquet's encodings
is decoded here: only the Thrift of the footer and offset index
(parquet-format, compact protocol) is read and written.

The page layout of a file is found once, when its key index is built
(:func:`page_section`: its offset indexes parsed in one compiled pass and
each checked against its column chunk) and kept in the index file. A file
whose pages are not aligned across its columns (an ingest file, a file
written before this layout) has none, and its row groups are read whole.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import wakustore._native as _native
from wakustore.storage import parquet_footer
from wakustore.storage.parquet_footer import FooterError, GroupFooters

# Rows of a data page in every column of a compacted day's file: a lookup
# by hash decodes this many rows a column instead of the row group's 256.
PAGE_ROWS = 16
# Bytes a single read may be, at most (a message is at most ~150 KB; a
# page of 16 such is ~2.4 MB): a corrupt offset index cannot ask for more.
MAX_READ_BYTES = 64 << 20

# Compact protocol types (parquet_footer's).
_TRUE, _FALSE, _BYTE, _I16, _I32, _I64, _DOUBLE, _BINARY, _LIST, _SET, _MAP, _STRUCT, _UUID = range(1, 14)
_INTS = (_BYTE, _I16, _I32, _I64)

# ColumnChunk fields.
_CC_META, _CC_OFFSET_INDEX_OFFSET, _CC_OFFSET_INDEX_LENGTH = 3, 4, 5
# ColumnMetaData: the first field a made footer writes itself (num_values).
_CM_NUM_VALUES = 5
# RowGroup fields.
_RG_COLUMNS = 1


# --- Thrift compact protocol: a struct as a list of [field id, type, value] ---


def _zigzag(value: int) -> int:
    return (value >> 1) ^ -(value & 1)


def decode_struct(buf, at: int = 0, depth: int = 0) -> tuple[list, int]:
    """([[field id, type, value], ...], position after) of the struct at ``at``."""
    if depth > 32:
        raise FooterError("nested too deep")
    fields: list[list] = []
    field = 0
    while True:
        field, kind, at = parquet_footer._field_header(buf, at, field)
        if kind == 0:
            return fields, at
        if kind in (_TRUE, _FALSE):
            fields.append([field, kind, kind == _TRUE])
            continue
        value, at = _decode_value(buf, at, kind, depth)
        fields.append([field, kind, value])


def _decode_value(buf, at: int, kind: int, depth: int):
    if kind in _INTS:
        if kind == _BYTE:
            return buf[at], at + 1
        raw, at = parquet_footer._varint(buf, at)
        return _zigzag(raw), at
    if kind == _BINARY:
        size, at = parquet_footer._varint(buf, at)
        if at + size > len(buf):
            raise FooterError("binary past the end")
        return bytes(buf[at : at + size]), at + size
    if kind == _STRUCT:
        return decode_struct(buf, at, depth + 1)
    if kind in (_LIST, _SET):
        count, element, at = parquet_footer._list_header(buf, at)
        items = []
        for _ in range(count):
            if element in (_TRUE, _FALSE):
                items.append(buf[at] == 1)
                at += 1
            else:
                item, at = _decode_value(buf, at, element, depth + 1)
                items.append(item)
        return (element, items), at
    if kind == _DOUBLE:
        return bytes(buf[at : at + 8]), at + 8
    if kind == _UUID:
        return bytes(buf[at : at + 16]), at + 16
    if kind == _MAP:
        end = parquet_footer._value_end(buf, at, _MAP, depth, False)
        return bytes(buf[at:end]), end  # kept as its bytes
    raise FooterError(f"unknown compact protocol type {kind}")


def _zig(value: int) -> int:
    return (value << 1) ^ (value >> 63)


def encode_struct(fields: list, out: bytearray) -> None:
    """Append the struct ``fields`` (as :func:`decode_struct` gives them)."""
    last = 0
    for field, kind, value in fields:
        header_kind = (_TRUE if value else _FALSE) if kind in (_TRUE, _FALSE) else kind
        delta = field - last
        if 0 < delta <= 15:
            out.append((delta << 4) | header_kind)
        else:
            out.append(header_kind)
            out += _uvarint(_zig(field))
        last = field
        if kind not in (_TRUE, _FALSE):
            _encode_value(kind, value, out)
    out.append(0)


def _encode_value(kind: int, value, out: bytearray) -> None:
    if kind == _BYTE:
        out.append(value & 0xFF)
    elif kind in _INTS:
        out += _uvarint(_zig(value))
    elif kind == _BINARY:
        out += _uvarint(len(value))
        out += value
    elif kind == _STRUCT:
        encode_struct(value, out)
    elif kind in (_LIST, _SET):
        element, items = value
        if len(items) < 15:
            out.append((len(items) << 4) | element)
        else:
            out.append(0xF0 | element)
            out += _uvarint(len(items))
        for item in items:
            if element in (_TRUE, _FALSE):
                out.append(1 if item else 0)
            else:
                _encode_value(element, item, out)
    elif kind in (_DOUBLE, _UUID, _MAP):
        out += value
    else:
        raise FooterError(f"unknown compact protocol type {kind}")


def _get(fields: list, field: int, default=None):
    for f, _, value in fields:
        if f == field:
            return value
    return default


# --- a file's page layout ---------------------------------------------------

# Per row group, per column: the dictionary page's offset and size (-1, 0
# without one), then the offsets of its data pages and the end of the
# last (-1 past the group's pages): 2 + MAX_PAGES + 1 int64.
MAX_PAGES = 16
SLOTS = 2 + MAX_PAGES + 1


def page_section(footers: GroupFooters, read_at, metadata: pq.FileMetaData) -> np.ndarray | None:
    """The page layout of a file (``read_at(offset, size)`` reads it; its
    parsed footer ``metadata``), as the key index keeps it: int64 (row
    groups, columns, 2 + MAX_PAGES + 1); None unless every row group has
    an offset index whose pages start every :data:`PAGE_ROWS` rows in each
    column, each column chunk's pages following one another.

    The offset indexes of a file are written back to back, row group by row
    group and column by column (parquet-format's page index layout; Arrow
    and parquet-rs both): they are parsed in one compiled pass from the
    first row group's first to the last one's last, and each is checked
    against the chunk it must describe (its first page is the chunk's
    first data page), so a file laid out otherwise is refused, not misread.
    """
    groups, columns = metadata.num_row_groups, metadata.num_columns
    if not groups or not columns or footers.num_row_groups != groups:
        return None
    first = _offset_index_span(footers, 0, 0)
    last = _offset_index_span(footers, groups - 1, columns - 1)
    if first is None or last is None:
        return None
    start, end = first[0], last[0] + last[1]
    if not 0 <= start < end or end - start > MAX_READ_BYTES:
        return None
    region = read_at(start, end - start)
    parsed = _native.offset_indexes(region, groups * columns, MAX_PAGES)
    if parsed is None or parsed[2] != end - start:
        return None
    spots = np.frombuffer(parsed[0], dtype=np.int64).reshape(groups, columns, MAX_PAGES, 3)
    counts = np.frombuffer(parsed[1], dtype=np.int64).reshape(groups, columns)
    rows = np.array([metadata.row_group(g).num_rows for g in range(groups)], dtype=np.int64)
    chunks = [[metadata.row_group(g).column(c) for c in range(columns)] for g in range(groups)]
    data_pages = np.array([[chunk.data_page_offset for chunk in row] for row in chunks], dtype=np.int64)
    dictionaries = np.array(
        [[chunk.dictionary_page_offset if chunk.has_dictionary_page else -1 for chunk in row] for row in chunks],
        dtype=np.int64,
    )
    pages = -(-rows // PAGE_ROWS)
    if (rows > PAGE_ROWS * MAX_PAGES).any() or (counts != pages[:, None]).any():
        return None
    if (spots[:, :, 0, 0] != data_pages).any():
        return None
    slot = np.arange(MAX_PAGES)
    used = slot[None, None, :] < counts[:, :, None]
    if (np.where(used, spots[:, :, :, 2], slot * PAGE_ROWS) != slot * PAGE_ROWS).any():
        return None
    ends = spots[:, :, :, 0] + spots[:, :, :, 1]
    if not np.where(used[:, :, 1:], spots[:, :, 1:, 0] == ends[:, :, :-1], True).all():
        return None
    out = np.full((groups, columns, SLOTS), -1, dtype=np.int64)
    has_dictionary = (dictionaries >= 0) & (dictionaries < data_pages)
    out[:, :, 0] = np.where(has_dictionary, dictionaries, -1)
    out[:, :, 1] = np.where(has_dictionary, data_pages - dictionaries, 0)
    out[:, :, 2 : 2 + MAX_PAGES] = np.where(used, spots[:, :, :, 0], -1)
    end_of = np.take_along_axis(ends, (counts - 1)[:, :, None], axis=2)[:, :, 0]
    out[np.arange(groups)[:, None], np.arange(columns)[None, :], 2 + counts] = end_of
    return out


def _offset_index_span(footers: GroupFooters, group: int, column: int) -> tuple[int, int] | None:
    """(offset, length) of the offset index of one column chunk, from the footer."""
    start, end = int(footers.bounds[group]), int(footers.bounds[group + 1])
    row_group, _ = decode_struct(memoryview(footers.buffer)[start:end])
    chunks = _get(row_group, _RG_COLUMNS)
    if not isinstance(chunks, tuple) or len(chunks[1]) <= column:
        return None
    chunk = chunks[1][column]
    offset, length = _get(chunk, _CC_OFFSET_INDEX_OFFSET), _get(chunk, _CC_OFFSET_INDEX_LENGTH)
    if not isinstance(offset, int) or not isinstance(length, int):
        return None
    return offset, length


class Template:
    """What the made footers of a file take from its own: per column its
    ``ColumnMetaData`` fields before ``num_values`` (type, encodings, path,
    codec; the same in every row group of a file with a page section, as
    its writer keeps one encoding a column), the footer's head and tail."""

    __slots__ = ("heads", "names", "head", "tail")

    def __init__(self, footers: GroupFooters):
        start, end = int(footers.bounds[0]), int(footers.bounds[1])
        row_group, _ = decode_struct(memoryview(footers.buffer)[start:end])
        heads, names = [], []
        for chunk in _get(row_group, _RG_COLUMNS)[1]:
            fields = [f for f in _get(chunk, _CC_META) if f[0] < _CM_NUM_VALUES]
            names.append(".".join(part.decode() for part in _get(fields, 3, (None, []))[1]))
            if [f[0] for f in fields] != [1, 2, 3, 4]:
                raise FooterError("a column chunk without its type, encodings, path or codec")
            out = bytearray()
            encode_struct(fields, out)
            heads.append(bytes(out[:-1]))  # without its STOP: num_values follows
        self.heads = tuple(heads)
        self.names = tuple(names)  # each column's path, as pyarrow names a flat column
        buffer = footers.buffer
        self.head = bytes(buffer[: footers.head])
        self.tail = bytes(buffer[int(footers.bounds[-1]) :])


# --- reading rows ---------------------------------------------------------


def read_rows(
    template: Template,
    pages: np.ndarray,
    read_at,
    wanted: Sequence[tuple[int, int, np.ndarray]],
    names: Sequence[str],
) -> pa.Table:
    """Columns ``names`` of the rows ``wanted`` (per row group: its number,
    its row count, and the rows wanted in it, sorted), in that order,
    decoded in one pyarrow call. ``pages``: the file's
    :func:`page_section`; ``read_at(offset, size)`` reads the file."""
    # As a file begins: no page at offset 0, which readers take for "none".
    buffer = bytearray(b"PAR1")
    groups: list[bytes] = []
    takes: list[np.ndarray] = []
    decoded = 0
    try:
        want = {template.names.index(name) for name in names}
    except ValueError:
        raise FooterError(f"the file has no column of {list(names)}") from None
    for group, group_rows, rows in wanted:
        layout = pages[group]
        page_of = rows // PAGE_ROWS
        found = np.unique(page_of)
        for run in np.split(found, np.flatnonzero(np.diff(found) != 1) + 1):
            first, last = int(run[0]), int(run[-1])
            if last * PAGE_ROWS >= group_rows or last >= MAX_PAGES:
                raise FooterError(f"row {int(rows[-1])} past row group {group}'s {group_rows}")
            row_end = min((last + 1) * PAGE_ROWS, group_rows)
            mine = rows[(page_of >= first) & (page_of <= last)]
            takes.append(mine - first * PAGE_ROWS + decoded)
            span = row_end - first * PAGE_ROWS
            decoded += span
            groups.append(_pages_group(template, layout, first, last, span, want, read_at, buffer))
    footer = bytearray(template.head)
    footer += _list_header(len(groups), _STRUCT)
    for group_bytes in groups:
        footer += group_bytes
    footer += template.tail
    metadata = parquet_footer._parsed(bytes(footer))
    # The pages keep their headers: their CRCs (the node writes them) are checked.
    file = pq.ParquetFile(
        pa.BufferReader(pa.py_buffer(buffer)), metadata=metadata, pre_buffer=False, page_checksum_verification=True
    )
    table = file.read_row_groups(list(range(len(groups))), columns=list(names), use_threads=False)
    return table.take(pa.array(np.concatenate(takes), pa.int64()))


def _list_header(count: int, element: int) -> bytes:
    if count < 15:
        return bytes(((count << 4) | element,))
    return bytes((0xF0 | element,)) + _uvarint(count)


def _pages_group(
    template: Template,
    layout: np.ndarray,
    first: int,
    last: int,
    rows: int,
    want: set[int],
    read_at,
    buffer: bytearray,
) -> bytes:
    """A row group of pages ``first`` to ``last`` of a row group whose
    layout is ``layout``: the wanted columns' bytes appended to ``buffer``
    (the others point at nothing and are not read), its Thrift returned."""
    parts = [b"\x19", _list_header(len(template.heads), _STRUCT)]  # field 1 (columns), a list
    total = 0
    rows_bytes = _uvarint(rows << 1)
    for column, head in enumerate(template.heads):
        if column not in want:
            # Nothing to read: offsets 0, sizes 0.
            parts += (b"\x26\x00\x1c", head, b"\x16", rows_bytes, b"\x16\x00\x16\x00\x26\x00\x00\x00")
            continue
        start = len(buffer)
        slots = layout[column].tolist()
        if slots[0] >= 0:
            buffer += read_at(slots[0], slots[1])
        page_start, page_end = slots[2 + first], slots[3 + last]
        if not 0 <= page_start < page_end or page_end - page_start > MAX_READ_BYTES:
            raise FooterError(f"pages {first}-{last} of column {column} span {page_start}..{page_end}")
        data = len(buffer)
        buffer += read_at(page_start, page_end - page_start)
        size = len(buffer) - start
        total += size
        size_bytes = _uvarint(size << 1)
        # ColumnChunk: file_offset (2), meta_data (3): its head, num_values
        # (5), sizes (6, 7), data_page_offset (9), dictionary_page_offset (11).
        parts += (b"\x26", _uvarint(start << 1), b"\x1c", head, b"\x16", rows_bytes, b"\x16", size_bytes)
        parts += (b"\x16", size_bytes, b"\x26", _uvarint(data << 1))
        if data != start:
            parts += (b"\x26", _uvarint(start << 1))
        parts.append(b"\x00\x00")  # ends ColumnMetaData, then ColumnChunk
    parts += (b"\x16", _uvarint(total << 1), b"\x16", rows_bytes, b"\x00")  # 2, 3, end of RowGroup
    return b"".join(parts)


_SMALL = tuple(bytes((value,)) for value in range(128))


def _uvarint(value: int) -> bytes:
    """An unsigned varint (of a zigzag value: callers shift non-negative ones)."""
    if value < 128:
        return _SMALL[value]
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def write_options() -> dict:
    """The ``pq.ParquetWriter`` options of a file read by page."""
    return {"max_rows_per_page": PAGE_ROWS, "write_page_index": True}


__all__ = ["PAGE_ROWS", "Template", "page_section", "read_rows", "write_options"]
