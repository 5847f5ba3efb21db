"""Write-ahead log: the point where an accepted message counts as stored.

Records are opaque byte strings (the write path logs one Arrow IPC stream
per batch of rows) appended in batches; each batch is written
and fsynced before :meth:`WriteAheadLog.append` returns, so a ``kill -9``
after that loses nothing. The log is a directory of segment files named by
the sequence number of their first record. After the Delta commit that
holds records up to sequence ``n``, :meth:`trim` deletes whole segments
that end at or before ``n``. Replay after a crash may hand back records
that were already committed but not trimmed: the table's MUID
deduplication makes that harmless.

Frame of one record: 4-byte big-endian length, 4-byte CRC-32 of the body,
the body. A torn tail (a partial frame or a bad CRC at the end of the last
segment, left by a crash mid-write) is cut off on open.
"""

from __future__ import annotations

import os
import struct
import threading
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from wakustore.durable import fsync_dir, fsync_file, make_dirs

_FRAME = struct.Struct(">II")

# A record holds a slice of a batch of rows, which the write path keeps
# under half of this (one 150 KiB message with its topics fits easily).
# Anything larger in a frame header is corruption, not data.
MAX_RECORD_SIZE = 16 * 1024 * 1024

# Rotate segments at 64 MiB so trimming frees space in reasonable steps
# without creating thousands of files at 1 s batches.
DEFAULT_SEGMENT_SIZE = 64 * 1024 * 1024

_SUFFIX = ".wal"


class WalCorruption(Exception):
    """A segment that is damaged somewhere other than its tail."""


@dataclass(frozen=True, slots=True)
class _Segment:
    first_seq: int
    path: Path


class WriteAheadLog:
    """An append-only, fsynced log of byte records with sequence numbers.

    Sequence numbers increase by one per record across segments; after a
    restart they continue from the records still in the log (from 1 when
    it is empty). Safe to call from several threads.
    """

    def __init__(self, directory: Path | str, segment_size: int = DEFAULT_SEGMENT_SIZE):
        self.directory = Path(directory)
        make_dirs(self.directory)
        self._segment_size = segment_size
        self._lock = threading.Lock()
        self._segments = self._scan()
        self._next_seq, self._pending_bytes = self._recover()
        self._file: BinaryIO | None = None
        self._file_size = 0
        # A failed append whose partial frame could not be cut off yet:
        # (segment, its size before the append). No record is written after
        # it until it is (an inner segment's garbage would stop a restart).
        self._unclean: tuple[Path, int] | None = None
        self._committed_upto = self._segments[0].first_seq - 1 if self._segments else self._next_seq - 1

    # --- public -----------------------------------------------------------

    @property
    def last_seq(self) -> int:
        """Sequence number of the last record written (0 when none ever was)."""
        return self._next_seq - 1

    @property
    def depth(self) -> int:
        """Records written but not yet trimmed."""
        return self._next_seq - 1 - self._committed_upto

    @property
    def size_bytes(self) -> int:
        return sum(s.path.stat().st_size for s in self._segments if s.path.exists())

    def append(self, records: Sequence[bytes]) -> int:
        """Write ``records`` durably; returns the sequence number of the last one."""
        if not records:
            return self.last_seq
        frames = []
        for body in records:
            if len(body) > MAX_RECORD_SIZE:
                raise ValueError(f"record of {len(body)} bytes exceeds {MAX_RECORD_SIZE}")
            frames.append(_FRAME.pack(len(body), zlib.crc32(body)))
            frames.append(body)
        blob = memoryview(b"".join(frames))
        with self._lock:
            if self._unclean is not None:
                self._cut_back_unclean()
            handle = self._writable()
            good = self._file_size
            try:
                written = 0
                while written < len(blob):  # unbuffered: a short write is possible
                    written += handle.write(blob[written:]) or 0
                os.fsync(handle.fileno())
            except BaseException:
                # ENOSPC, EIO: the batch fails whole (nothing acknowledged),
                # and no partial frame stays before the next record.
                self._cut_back(handle, good)
                raise
            self._file_size += len(blob)
            self._next_seq += len(records)
            return self._next_seq - 1

    def _cut_back(self, handle: BinaryIO, size: int) -> None:
        """Cut the active segment back to ``size`` after a failed append;
        when even that fails, no record is appended until it succeeds."""
        path = Path(handle.name)
        try:
            os.ftruncate(handle.fileno(), size)
            os.fsync(handle.fileno())
        except OSError:
            self._unclean = (path, size)
            handle.close()
            self._file = None

    def _cut_back_unclean(self) -> None:
        assert self._unclean is not None
        path, size = self._unclean
        try:
            os.truncate(path, size)
            fsync_file(path)
        except OSError as exc:
            raise OSError(
                exc.errno, f"the write-ahead log cannot cut a failed write off {path.name} yet: {exc.strerror}"
            ) from exc
        self._unclean = None

    def replay(self) -> Iterator[tuple[int, bytes]]:
        """Every record still in the log, oldest first, with its sequence number."""
        with self._lock:
            segments = list(self._segments)
        for segment in segments:
            seq = segment.first_seq
            for body in _read_frames(segment.path, tolerate_tail=False):
                yield seq, body
                seq += 1

    def trim(self, upto_seq: int) -> None:
        """Forget records up to and including ``upto_seq`` (whole segments only)."""
        with self._lock:
            self._committed_upto = max(self._committed_upto, upto_seq)
            removed = False
            while len(self._segments) >= 1:
                head = self._segments[0]
                following = self._segments[1].first_seq if len(self._segments) > 1 else self._next_seq
                if following - 1 > upto_seq or following == head.first_seq:
                    break
                if len(self._segments) == 1 and self._file is not None:
                    # The active segment is fully committed: start a new one.
                    self._file.close()
                    self._file = None
                head.path.unlink(missing_ok=True)
                self._segments.pop(0)
                removed = True
            if removed:
                fsync_dir(self.directory)

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None

    # --- private ----------------------------------------------------------

    def _writable(self) -> BinaryIO:
        if self._file is not None and self._file_size < self._segment_size:
            return self._file
        if self._file is not None:
            self._file.close()
        path = self.directory / f"{self._next_seq:020d}{_SUFFIX}"
        # Unbuffered: a failed write leaves nothing behind in a buffer that
        # a later write or the close would still flush.
        self._file = open(path, "ab", buffering=0)
        self._file_size = os.fstat(self._file.fileno()).st_size
        if not self._segments or self._segments[-1].path != path:
            self._segments.append(_Segment(self._next_seq, path))
            fsync_dir(self.directory)
        return self._file

    def _scan(self) -> list[_Segment]:
        segments = []
        for path in self.directory.iterdir():
            if path.suffix == _SUFFIX and path.stem.isdigit():
                segments.append(_Segment(int(path.stem), path))
        segments.sort(key=lambda s: s.first_seq)
        return segments

    def _recover(self) -> tuple[int, int]:
        """Cut a torn tail off the last segment; return the next sequence number."""
        if not self._segments:
            return 1, 0
        last = self._segments[-1]
        count, good_bytes = 0, 0
        for count, good_bytes, _ in _scan_frames(last.path):  # noqa: B007  (the last frame's counts)
            pass
        if good_bytes != last.path.stat().st_size:
            with open(last.path, "r+b") as handle:
                handle.truncate(good_bytes)
                os.fsync(handle.fileno())
        return last.first_seq + count, good_bytes


def count_records(directory: Path | str, weigh: Callable[[bytes], int] | None = None) -> int:
    """Intact records in the log at ``directory``, read without changing it,
    so it is safe beside the process that writes the log (a frame that
    process is still writing counts as absent; a torn tail is not cut).
    Records committed but not yet trimmed are counted too. ``weigh``:
    what one record counts for (the rows a batch record holds), else 1."""
    directory = Path(directory)
    if not directory.is_dir():
        return 0
    total = 0
    for path in directory.iterdir():
        if path.suffix != _SUFFIX or not path.stem.isdigit():
            continue
        try:
            for _, _, body in _scan_frames(path):
                if body is not None:
                    total += 1 if weigh is None else weigh(body)
        except FileNotFoundError:  # trimmed by the writer meanwhile
            continue
    return total


def _scan_frames(path: Path) -> Iterator[tuple[int, int, bytes | None]]:
    """Yield (records so far, offset after them, the last record) for
    every intact frame, first (0, 0, None)."""
    count = 0
    offset = 0
    yield count, offset, None
    with open(path, "rb") as handle:
        while True:
            header = handle.read(_FRAME.size)
            if len(header) < _FRAME.size:
                return
            length, crc = _FRAME.unpack(header)
            if length > MAX_RECORD_SIZE:
                return
            body = handle.read(length)
            if len(body) < length or zlib.crc32(body) != crc:
                return
            count += 1
            offset += _FRAME.size + length
            yield count, offset, body


def _read_frames(path: Path, tolerate_tail: bool) -> Iterator[bytes]:
    with open(path, "rb") as handle:
        while True:
            header = handle.read(_FRAME.size)
            if not header:
                return
            if len(header) < _FRAME.size:
                if tolerate_tail:
                    return
                raise WalCorruption(f"{path}: truncated frame header")
            length, crc = _FRAME.unpack(header)
            if length > MAX_RECORD_SIZE:
                raise WalCorruption(f"{path}: frame length {length} exceeds {MAX_RECORD_SIZE}")
            body = handle.read(length)
            if len(body) < length or zlib.crc32(body) != crc:
                raise WalCorruption(f"{path}: damaged record")
            yield body
