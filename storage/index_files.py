"""The key index of each data file, kept on disk and mapped, not held.

Why: held in memory, the key index cost ~30 bytes a message (timestamps,
hash and MUID prefixes, rows, footers): 250 MB at 10M messages, several GB
at a fleet's 250 GB of history, and every start read the key columns of
every data file again (9.2 s for 121 files at 10M; on object storage, a
download of the whole history's keys). A Delta data file never changes,
so its index is written once, beside the node's other files, and a start
maps it instead of building it.

Where: ``<directory>/<blake2b(data path)>.kix``, one file per data file,
in the node's data dir (``<data_dir>/index/messages``): per node, never in
the table's directories (delta-rs and Spark VACUUM delete files there they
do not know), so a fleet's nodes share the table but not their indexes,
and a node's restart downloads nothing. An index whose data file left the
table is removed when the reader sees it go (and at start, those of files
gone while the node was down).

Format (little-endian), version :data:`FORMAT`:

- 16 bytes: magic ``WKIX``, format version (u32), header length (u32),
  CRC-32 of the header (u32);
- the header, JSON: the data file's path in the log and its size (an
  index of another file of the same path is stale), its rows, its topic
  pairs, the CRC-32 of the body, and each section's (offset, bytes);
  for a data file the engine wrote (no Parquet page CRCs) of at most
  :data:`WHOLE_FILE_CRC_BYTES`, the CRC-32 of the whole data file as it
  was when indexed (``file_crc32``; checked once a start, in the
  background, and by ``db check``);
- the body, each section 8-byte aligned: ``pair_bounds`` (int32 per pair:
  start, end, first row; see row_index.FileIndex), ``ts`` (int64,
  per pair ascending), ``row`` (int32 file row of each ``ts``; absent when
  every pair's rows are contiguous), ``hashes`` (the message hashes, 32
  bytes each, sorted), ``hash_pos`` (int32: each hash's position in
  ``ts``), ``muids`` (the MUIDs, 32 bytes each, sorted; absent without a
  MUID column), ``footer``, ``footer_bounds`` (int64: the row groups' byte
  ranges in it; see parquet_footer), ``group_starts`` (int64: each row
  group's first row) and ``pages`` (int64 per row group and column: its
  dictionary page and data page offsets, see parquet_pages; absent when
  the file's pages are not aligned across its columns).

~88 bytes a message on disk (20 GB at 225M messages, 8% of the data), of
which ~7 the page layout of a compacted day.

Checks: a map is used only when its header is whole (magic, version, CRC),
names the data file and its size, and its sections lie inside the file;
the body's CRC is checked before anything of the body is used
(:meth:`Mapped.verify`: the reader checks those a start or a page needs
first, and its background thread every one), and an index that fails it
is removed and built again from its data file. Indexes are written
durably (:mod:`durable`), so a crash leaves the old file or the whole new
one; damage comes from the disk.

Memory: the sections are read through ``mmap``: the pages a lookup touches
are the kernel's page cache, shared and reclaimable, but count in the
process's resident set while mapped. :func:`trim_resident` drops them
from the process every :data:`TRIM_INTERVAL_S` (the page cache keeps
them; touching one again is a minor fault), so the node's resident memory
does not grow with the history it reads.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import shutil
import stat
import struct
import threading
import time
import weakref
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import numpy as np

from wakustore.durable import make_dirs, replace_durably

if TYPE_CHECKING:
    from typing_extensions import Buffer

MAGIC = b"WKIX"
FORMAT = 1
_PREAMBLE = struct.Struct("<4sIII")  # magic, format, header length, header CRC
# A header names a path and the file's topic pairs; anything larger is damage.
MAX_HEADER_BYTES = 64 << 20
SUFFIX = ".kix"

# Resident pages of the maps are dropped at most this often (see the
# module): a lookup over every file touches ~2 pages a file a hash.
TRIM_INTERVAL_S = 2.0

# dtype and item width of each section (None: raw bytes).
SECTIONS: dict[str, str | None] = {
    "pair_bounds": "<i4",
    "ts": "<i8",
    "row": "<i4",
    "hashes": None,
    "hash_pos": "<i4",
    "muids": None,
    "footer": None,
    "footer_bounds": "<i8",
    "group_starts": "<i8",
    "pages": "<i8",
}
KEY_BYTES = 32


# Data files the engine or delta-rs wrote (no Parquet page CRCs) up to
# this size get a CRC-32 of their own in their index: the ingest commits
# (a few MB). The node's own files (compacted days, imports) carry
# Parquet's page CRCs instead.
WHOLE_FILE_CRC_BYTES = 64 << 20


def file_crc32(path: str) -> int:
    """CRC-32 of the whole file at ``path`` (read in 1 MiB chunks)."""
    crc = 0
    with open(path, "rb", buffering=0) as handle:
        while chunk := handle.read(1 << 20):
            crc = zlib.crc32(chunk, crc)
    return crc


class IndexDamaged(ValueError):
    """An index file that is not whole, not of this format, or of another data file."""


@dataclass(frozen=True, slots=True)
class Header:
    path: str  # the data file's path in the Delta log
    size: int  # the data file's size in bytes
    rows: int
    pairs: tuple[tuple[str, str], ...]  # (pubsub topic, content topic) of each pair, as in pair_bounds
    footer_head: int  # bytes of the footer before its row groups (parquet_footer)
    body_crc: int
    sections: Mapping[str, tuple[int, int]]  # name -> (offset in the file, bytes)
    # CRC-32 of the whole data file, taken when it was indexed (files of at
    # most WHOLE_FILE_CRC_BYTES: the engine's ingest files, whose Parquet
    # pages carry no CRC of their own); None for the others.
    file_crc: int | None = None


class Mapped:
    """One index file mapped read-only: its header and its sections as
    numpy arrays (views of the map, valid while this object lives)."""

    __slots__ = ("header", "arrays", "_map", "verified", "rejected", "__weakref__")

    def __init__(self, header: Header, mapped: mmap.mmap):
        self.header = header
        self._map = mapped
        # The body's CRC was checked (or the body was written by this process).
        self.verified = False
        # Found damaged and set aside by its user (reported once).
        self.rejected = False
        self.arrays: dict[str, np.ndarray] = {}
        for name, (offset, length) in header.sections.items():
            dtype = SECTIONS[name]
            view = np.frombuffer(mapped, dtype=np.uint8, count=length, offset=offset)
            self.arrays[name] = view if dtype is None else view.view(dtype)
        _maps.add(self)

    @property
    def nbytes(self) -> int:
        return len(self._map)

    def verify(self) -> bool:
        """Is the body as written (its CRC)? Reads the whole file once; later calls are free."""
        if not self.verified:
            start = min((offset for offset, _ in self.header.sections.values()), default=len(self._map))
            crc = zlib.crc32(memoryview(self._map)[start:])
            self.drop_resident()  # read once: the page cache may keep it, this process need not
            self.verified = crc == self.header.body_crc
        return self.verified

    def drop_resident(self) -> None:
        try:
            self._map.madvise(mmap.MADV_DONTNEED)
        except (OSError, ValueError):
            pass


class IndexDirectory:
    """The index files of one table's data files (see the module)."""

    def __init__(self, directory: str | os.PathLike):
        self.directory = os.fspath(directory)
        make_dirs(self.directory)

    def path_of(self, data_path: str) -> str:
        name = hashlib.blake2b(data_path.encode(), digest_size=16).hexdigest()
        return os.path.join(self.directory, name + SUFFIX)

    def open(self, data_path: str, size: int | None) -> Mapped | None:
        """The index of the data file at ``data_path`` (of ``size`` bytes;
        None: not checked), mapped; None when there is none. Raises
        :class:`IndexDamaged` for a file that is not that index whole."""
        try:
            fd = os.open(self.path_of(data_path), os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            found = os.fstat(fd)
            if not stat.S_ISREG(found.st_mode):
                raise IndexDamaged("not a file")
            length = found.st_size
            if length < _PREAMBLE.size:
                raise IndexDamaged("shorter than its preamble")
            mapped = mmap.mmap(fd, length, prot=mmap.PROT_READ)
        finally:
            os.close(fd)
        header = _header(mapped)
        if header.path != data_path or (size is not None and header.size != size):
            raise IndexDamaged(f"an index of another file ({header.path}, {header.size} bytes)")
        return Mapped(header, mapped)

    def write(
        self,
        data_path: str,
        size: int,
        rows: int,
        pairs: Iterable[tuple[str, str]],
        footer_head: int,
        sections: Mapping[str, np.ndarray | bytes],
        file_crc: int | None = None,
    ) -> None:
        """Write the index of the data file at ``data_path`` durably
        (``file_crc``: the data file's own CRC-32, see :class:`Header`)."""
        body: list[bytes | memoryview] = []
        placed: dict[str, tuple[int, int]] = {}
        at = 0
        for name, value in sections.items():
            if name not in SECTIONS:
                raise ValueError(f"unknown index section {name!r}")
            if value is None:
                continue
            # numpy's stubs give ndarray its __buffer__ from Python 3.12 only.
            raw = cast("Buffer", np.ascontiguousarray(value)) if isinstance(value, np.ndarray) else value
            data = memoryview(raw).cast("B")
            placed[name] = (at, len(data))
            body.append(data)
            pad = -len(data) % 8
            if pad:
                body.append(b"\0" * pad)
            at += len(data) + pad
        crc = 0
        for chunk in body:
            crc = zlib.crc32(chunk, crc)
        # Offsets are from the start of the body until the header's length is known.
        draft = {
            "path": data_path,
            "size": int(size),
            "rows": int(rows),
            "pairs": [list(p) for p in pairs],
            "footer_head": int(footer_head),
            "body_crc": crc,
        }
        if file_crc is not None:
            draft["file_crc32"] = int(file_crc)
        header = _encode_header(draft, placed)
        replace_durably(self.path_of(data_path), [header, *body])

    def remove(self, data_paths: Iterable[str]) -> None:
        """Remove the index files of ``data_paths`` (anything in their place)."""
        for data_path in data_paths:
            _remove(self.path_of(data_path))

    def keep_only(self, live: Iterable[str]) -> int:
        """Remove every index but those of ``live`` (and any temporary
        file); returns how many were removed."""
        wanted = {os.path.basename(self.path_of(p)) for p in live}
        removed = 0
        try:
            names = os.listdir(self.directory)
        except OSError:
            return 0
        for name in names:
            if name not in wanted and _remove(os.path.join(self.directory, name)):
                removed += 1
        return removed


def _remove(path: str) -> bool:
    """Remove the file (or a directory found in its place) at ``path``; True when it was there."""
    try:
        os.unlink(path)
    except IsADirectoryError:
        shutil.rmtree(path, ignore_errors=True)
    except OSError:
        return False
    return True


def _encode_header(draft: dict, placed: Mapping[str, tuple[int, int]]) -> bytes:
    """The preamble and header, the sections' offsets made absolute (the
    header's length depends on them: settle it in two passes)."""
    length = 0
    while True:
        base = _PREAMBLE.size + length
        base += -base % 8
        text = json.dumps(
            {**draft, "sections": {k: [base + o, n] for k, (o, n) in placed.items()}}, separators=(",", ":")
        ).encode()
        if len(text) <= length:
            break
        length = len(text) + 16  # room for the offsets' digits to grow
    text = text.ljust(length)
    head = _PREAMBLE.pack(MAGIC, FORMAT, length, zlib.crc32(text)) + text
    return head + b"\0" * (-len(head) % 8)


def _header(mapped: mmap.mmap) -> Header:
    magic, version, length, crc = _PREAMBLE.unpack_from(mapped, 0)
    if magic != MAGIC:
        raise IndexDamaged("not an index file")
    if version != FORMAT:
        raise IndexDamaged(f"index format {version}, not {FORMAT}")
    if length > min(MAX_HEADER_BYTES, len(mapped) - _PREAMBLE.size):
        raise IndexDamaged("header longer than the file")
    text = mapped[_PREAMBLE.size : _PREAMBLE.size + length]
    if zlib.crc32(text) != crc:
        raise IndexDamaged("header CRC mismatch")
    try:
        fields = json.loads(text)
        sections = {str(k): (int(v[0]), int(v[1])) for k, v in fields["sections"].items()}
        header = Header(
            str(fields["path"]),
            int(fields["size"]),
            int(fields["rows"]),
            tuple((str(p), str(c)) for p, c in fields["pairs"]),
            int(fields["footer_head"]),
            int(fields["body_crc"]),
            sections,
            None if fields.get("file_crc32") is None else int(fields["file_crc32"]),
        )
    except (ValueError, KeyError, TypeError, IndexError) as exc:
        raise IndexDamaged(f"header unreadable: {exc}") from None
    for name, (offset, size) in sections.items():
        dtype = SECTIONS.get(name, "missing")
        if dtype == "missing":
            raise IndexDamaged(f"unknown section {name!r}")
        width = 1 if dtype is None else np.dtype(dtype).itemsize
        if offset < 0 or size < 0 or offset + size > len(mapped) or offset % 8 or size % width:
            raise IndexDamaged(f"section {name} outside the file")
    return header


# Every live map, for trim_resident.
_maps: weakref.WeakSet[Mapped] = weakref.WeakSet()
_trim_lock = threading.Lock()
_trimmed = 0.0


def trim_resident(force: bool = False) -> bool:
    """Drop the mapped pages from this process's resident set when the last
    trim is :data:`TRIM_INTERVAL_S` old (``force``: now); True when it ran."""
    global _trimmed
    now = time.monotonic()
    if not force and now - _trimmed < TRIM_INTERVAL_S:
        return False
    if not _trim_lock.acquire(blocking=False):
        return False
    try:
        _trimmed = now
        for mapped in list(_maps):
            mapped.drop_resident()
    finally:
        _trim_lock.release()
    return True


def mapped_bytes() -> int:
    """Bytes of index files mapped now (on disk; resident only as touched)."""
    return sum(m.nbytes for m in list(_maps))
