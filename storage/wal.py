"""Write-ahead log: the point where an accepted message counts as stored.

Records are opaque, non-empty byte strings (the write path logs one Arrow
IPC stream per batch of rows) appended in batches; each batch is written
and fsynced before :meth:`WriteAheadLog.append` returns, so a ``kill -9``
after that loses nothing. The log is a directory of segment files named by
the sequence number of their first record. After the Delta commit that
holds records up to sequence ``n``, :meth:`~WriteAheadLog.trim` deletes
whole segments that end at or before ``n``. Replay after a crash may hand
back records that were already committed but not trimmed: the table's
MUID deduplication makes that harmless.

Frame of one record: 4-byte big-endian length, 4-byte CRC-32 of the body,
the body. Every reader goes through :func:`scan_segment`, which splits a
segment into whole frames and damaged regions:

- a frame is whole when its length is 1 to ``MAX_RECORD_SIZE`` and no more
  than the segment holds after the header, and its body matches its CRC.
  The length is checked against the segment before any body is read, and
  a segment is read whole: a damaged length field never makes a reader
  hold more than the segment's own size (the size segments rotate at,
  ``DEFAULT_SEGMENT_SIZE``, plus at most one append);
- where no whole frame starts, the reader resynchronises: the framing has
  no sync marker, so it tries every following byte offset for a whole
  frame that also ends where another frame could begin (the segment's
  end, a torn header, or a length of 1 to ``MAX_RECORD_SIZE``). That
  second test keeps the search from checksumming the rest of the segment
  at every offset whose first bytes happen to read as a length; its cost:
  a whole record right before a second record whose length field is
  damaged is counted into the damaged region (reported, and kept, with
  it). The bytes up to the next whole frame are one damaged region.

What the log does with a damaged region is RocksDB's
``kSkipAnyCorruptedRecords`` for damage with whole records after it, and
its ``kTolerateCorruptedTailRecords`` (PostgreSQL's end of WAL: the first
record that does not verify) for the tail:

- at the very end of the newest segment, with no whole record after it,
  it is a torn tail: what a crash in the middle of an append leaves (an
  append not yet acknowledged). It is cut off on open, logged at INFO. A
  damaged last record of the newest segment cannot be told from a torn
  one: it goes the same way, as it does in both of those databases;
- anywhere else it is damage: the whole records after it are replayed,
  and only the region is skipped (the records in it are lost).
  ``kPointInTimeRecovery`` (stop at the damage) would drop every
  acknowledged record after it, and refusing to open (RocksDB's
  ``kAbsoluteConsistency``) would keep a node down over one record. Each
  region is logged once per open as a WARNING naming the segment, the
  byte offsets and the time range the whole records on either side hold;
  it is listed in :attr:`WriteAheadLog.damage`; and its bytes are copied,
  with a JSON description, to ``damaged/`` in the log's directory before
  anything can trim the segment. The copies are the operator's to inspect
  and remove: :func:`kept_damage` lists them (``/health``, the metrics and
  ``db check`` report them until they are gone).

A damaged region takes no sequence numbers: they count whole records, a
segment's first record having the number in its name.

A resynchronisation trusts a checksum, not a key: a message payload that
itself held whole frames could be read as records after damage right
before it.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import struct
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import BinaryIO

import numpy as np

from wakustore.durable import fsync_dir, fsync_file, make_dirs, replace_durably

log = logging.getLogger(__name__)

_FRAME = struct.Struct(">II")

# A record holds a slice of a batch of rows, which the write path keeps
# under half of this (one 150 KiB message with its topics fits easily).
# Anything larger in a frame header is corruption, not data.
MAX_RECORD_SIZE = 16 * 1024 * 1024

# Rotate segments at 64 MiB so trimming frees space in reasonable steps
# without creating thousands of files at 1 s batches.
DEFAULT_SEGMENT_SIZE = 64 * 1024 * 1024

_SUFFIX = ".wal"

# Where copies of damaged regions are kept, in the log's directory.
DAMAGED_DIR = "damaged"

# Byte offsets a resynchronisation tests at a time (a few int64 arrays of
# this length: ~10 MB while it runs).
_RESYNC_WINDOW = 1 << 18

# What a record holds in time: (lowest, highest), in nanoseconds.
Times = Callable[[bytes], tuple[int, int] | None]


@dataclass(frozen=True, slots=True)
class Piece:
    """Bytes ``[start, end)`` of a segment: one whole frame or, when not
    ``whole``, a damaged region (see the module)."""

    start: int
    end: int
    whole: bool

    def body(self, data: bytes) -> bytes:
        """The record of a whole frame, from the segment's bytes."""
        return data[self.start + _FRAME.size : self.end]


@dataclass(frozen=True, slots=True)
class DamagedRegion:
    """Bytes ``[start, end)`` (offsets in ``segment``) that hold no whole
    record, outside the newest segment's tail: skipped on replay."""

    segment: Path
    start: int
    end: int
    # Lowest and highest time (ns) in the whole records either side of the
    # region (the last before it, the first after it); None when neither
    # could say.
    times: tuple[int, int] | None = None
    # The copy of its bytes under damaged/ (None: not kept), and when the
    # region was first found (Unix seconds).
    kept: Path | None = None
    found_at: float | None = None

    @property
    def size(self) -> int:
        return self.end - self.start

    def time_range(self) -> str | None:
        """``times`` as ISO 8601 UTC: "<lowest> to <highest>"."""
        return None if self.times is None else f"{_utc(self.times[0])} to {_utc(self.times[1])}"

    def where(self) -> str:
        """The region and what its neighbours hold, for a log line."""
        text = f"bytes {self.start} to {self.end} ({self.size} bytes) of {self.segment}"
        if self.times is not None:
            text += f", between whole records holding times {self.time_range()}"
        return text

    def describe(self) -> dict:
        """As ``/health`` lists it."""
        return {
            "segment": str(self.segment),
            "start": self.start,
            "end": self.end,
            "bytes": self.size,
            "timestamps_ns": None if self.times is None else list(self.times),
            "timestamps": None if self.times is None else [_utc(t) for t in self.times],
            "found_at": None if self.found_at is None else _utc(int(self.found_at * 1e9)),
            "copy": None if self.kept is None else str(self.kept),
        }


class WriteAheadLog:
    """An append-only, fsynced log of byte records with sequence numbers.

    Sequence numbers increase by one per record across segments; after a
    restart they continue from the records still in the log (from 1 when
    it is empty). Opening the log cuts a torn tail and keeps damaged
    regions aside (see the module); ``times`` says what time range a
    record holds, for the reports. Safe to call from several threads.
    """

    def __init__(self, directory: Path | str, segment_size: int = DEFAULT_SEGMENT_SIZE, times: Times | None = None):
        self.directory = Path(directory)
        make_dirs(self.directory)
        self._segment_size = segment_size
        self._lock = threading.Lock()
        self._segments = [_Segment(int(path.stem), path) for path in segment_paths(self.directory)]
        # The damaged regions found on open, oldest first, each logged and
        # kept under damaged/ (unless the copy failed: ``kept`` is None).
        self.damage: list[DamagedRegion] = []
        self._next_seq = self._recover(times)
        self._file: BinaryIO | None = None
        self._file_size = 0
        # A failed append whose partial frame could not be cut off yet:
        # (segment, its size before the append). No record is written after
        # it until it is (an inner segment's garbage would be damage).
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

    def reported_damage(self) -> list[DamagedRegion]:
        """The damaged regions to report: every copy kept under damaged/
        (found at this open or an earlier one, until an operator removes
        it), and those found at this open that could not be kept."""
        return kept_damage(self.directory) + [region for region in self.damage if region.kept is None]

    def append(self, records: Sequence[bytes]) -> int:
        """Write ``records`` durably; returns the sequence number of the last one."""
        if not records:
            return self.last_seq
        frames = []
        for body in records:
            if not 0 < len(body) <= MAX_RECORD_SIZE:
                raise ValueError(f"a record of {len(body)} bytes: 1 to {MAX_RECORD_SIZE} are logged")
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

    def replay(self) -> Iterator[tuple[int, bytes]]:
        """Every whole record still in the log, oldest first, with its
        sequence number; damaged regions are skipped (:attr:`damage`)."""
        with self._lock:
            segments = list(self._segments)
        for segment in segments:
            data = segment.path.read_bytes()
            seq = segment.first_seq
            for piece in scan_segment(data):
                if piece.whole:
                    yield seq, piece.body(data)
                    seq += 1

    def trim(self, upto_seq: int) -> None:
        """Forget records up to and including ``upto_seq`` (whole segments
        only; their damaged regions were kept aside on open)."""
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

    def _recover(self, times: Times | None) -> int:
        """Keep every damaged region aside and cut the newest segment's torn
        tail; returns the next sequence number."""
        if not self._segments:
            return 1
        found = survey([segment.path for segment in self._segments], times)
        self.damage = [self._keep(region) for region in found.damage]
        if found.torn is not None:
            torn = found.torn
            with open(torn.segment, "r+b") as handle:
                handle.truncate(torn.start)
                os.fsync(handle.fileno())
            log.info(
                "write-ahead log %s: cut a torn tail of %d bytes at byte %d (an append a crash interrupted)",
                torn.segment,
                torn.size,
                torn.start,
            )
        return self._segments[-1].first_seq + found.records[-1]

    def _keep(self, region: DamagedRegion) -> DamagedRegion:
        """Copy the region's bytes under damaged/ (once: a region an earlier
        open found is kept already) and log it."""
        copy = self.directory / DAMAGED_DIR / f"{region.segment.stem}.{region.start}-{region.end}.bin"
        found_at = time.time()
        try:
            if copy.exists():
                earlier = _read_kept(copy, self.directory)
                found_at = earlier.found_at if earlier is not None and earlier.found_at else found_at
            else:
                make_dirs(copy.parent)
                with open(region.segment, "rb") as handle:
                    handle.seek(region.start)
                    data = handle.read(region.size)
                description = {
                    "segment": region.segment.name,
                    "start": region.start,
                    "end": region.end,
                    "timestamps_ns": None if region.times is None else list(region.times),
                    "found_at": found_at,
                }
                # The description first: a copy (what kept_damage lists) is
                # never without it.
                replace_durably(copy.with_suffix(".json"), json.dumps(description).encode())
                replace_durably(copy, data)
            region = replace(region, kept=copy, found_at=found_at)
        except OSError as exc:
            log.error("write-ahead log: could not keep a copy of the damaged %s: %s", region.where(), exc)
            region = replace(region, found_at=found_at)
        log.warning(
            "write-ahead log: damaged %s: skipped, the whole records after it are replayed; the records in it "
            "are lost%s",
            region.where(),
            "" if region.kept is None else f"; its bytes are kept in {region.kept}",
        )
        return region


# --- reading segments ---------------------------------------------------------


def scan_segment(data: bytes) -> Iterator[Piece]:
    """The whole frames and damaged regions of one segment's bytes, in
    order, covering every byte (see the module for the rules)."""
    view = memoryview(data)
    offset = 0
    while offset < len(view):
        end = _frame_end(view, offset)
        if end is not None:
            yield Piece(offset, end, True)
            offset = end
        else:
            resume = _resync(view, offset + 1)
            yield Piece(offset, resume, False)
            offset = resume


def segment_paths(directory: Path | str) -> list[Path]:
    """The segment files of the log at ``directory``, oldest first."""
    paths = [p for p in Path(directory).iterdir() if p.suffix == _SUFFIX and p.stem.isdigit()]
    return sorted(paths, key=lambda p: int(p.stem))


@dataclass(slots=True)
class Survey:
    """What a read through a log's segments found."""

    records: list[int]  # whole records, per segment
    damage: list[DamagedRegion]
    torn: DamagedRegion | None  # the newest segment's torn tail


def survey(segments: Sequence[Path], times: Times | None = None) -> Survey:
    """Read ``segments`` (a log's, oldest first) through, changing nothing:
    the whole records of each, the damaged regions (with the time range of
    their neighbours when ``times`` is given) and the torn tail. A segment
    that vanished meanwhile (trimmed by the writer) counts as empty."""
    records: list[int] = []
    damage: list[DamagedRegion] = []
    torn = None
    carried: bytes | None = None  # the last whole record of the segments read before
    waiting: list[tuple[Path, Piece, tuple[int, int] | None]] = []  # regions before the next whole record
    for index, path in enumerate(segments):
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            records.append(0)
            continue
        pieces = list(scan_segment(data))
        if index == len(segments) - 1 and pieces and not pieces[-1].whole:
            tail = pieces.pop()
            torn = DamagedRegion(path, tail.start, tail.end)
        last: Piece | None = None
        for piece in pieces:
            if not piece.whole:
                record = carried if last is None else last.body(data)
                waiting.append((path, piece, None if record is None else _times(times, record)))
                continue
            last = piece
            if waiting:
                after = _times(times, piece.body(data))
                damage += [DamagedRegion(p, r.start, r.end, _spanning(before, after)) for p, r, before in waiting]
                waiting = []
        records.append(sum(piece.whole for piece in pieces))
        if last is not None:
            carried = last.body(data)
    damage += [DamagedRegion(p, r.start, r.end, before) for p, r, before in waiting]
    return Survey(records, damage, torn)


def kept_damage(directory: Path | str) -> list[DamagedRegion]:
    """The damaged regions whose copies are kept under ``damaged/`` in the
    log at ``directory``, read without changing anything."""
    folder = Path(directory) / DAMAGED_DIR
    if not folder.is_dir():
        return []
    kept = [_read_kept(copy, Path(directory)) for copy in folder.glob("*.bin")]
    return sorted((r for r in kept if r is not None), key=lambda r: (r.segment.name, r.start))


def count_records(directory: Path | str, weigh: Callable[[bytes], int] | None = None) -> int:
    """Whole records in the log at ``directory``, read without changing it,
    so it is safe beside the process that writes the log (a frame that
    process is still writing counts as absent; a torn tail is not cut).
    Records committed but not yet trimmed are counted too. ``weigh``:
    what one record counts for (the rows a batch record holds), else 1."""
    if not Path(directory).is_dir():
        return 0
    total = 0
    for path in segment_paths(directory):
        try:
            data = path.read_bytes()
        except FileNotFoundError:  # trimmed by the writer meanwhile
            continue
        for piece in scan_segment(data):
            if piece.whole:
                total += 1 if weigh is None else weigh(piece.body(data))
    return total


@dataclass(frozen=True, slots=True)
class _Segment:
    first_seq: int
    path: Path


def _frame_end(view: memoryview, offset: int) -> int | None:
    """Where the whole frame at ``offset`` ends; None when none starts there."""
    if len(view) - offset < _FRAME.size:
        return None
    length, crc = _FRAME.unpack_from(view, offset)
    end = offset + _FRAME.size + length
    if not 0 < length <= MAX_RECORD_SIZE or end > len(view):
        return None
    return end if zlib.crc32(view[offset + _FRAME.size : end]) == crc else None


def _resync(view: memoryview, start: int) -> int:
    """The first offset from ``start`` where a whole frame starts that ends
    where another frame could begin; the end of ``view`` when none does."""
    size = len(view)
    data = np.frombuffer(view, dtype=np.uint8)
    last = size - _FRAME.size  # the last offset a header fits at
    for low in range(start, last + 1, _RESYNC_WINDOW):
        offsets = np.arange(low, min(low + _RESYNC_WINDOW, last + 1), dtype=np.int64)
        lengths = _lengths_at(data, offsets)
        ends = offsets + _FRAME.size + lengths
        plausible = (lengths > 0) & (lengths <= MAX_RECORD_SIZE) & (ends <= size)
        offsets, ends = offsets[plausible], ends[plausible]
        # After the frame: the end, a torn header, or a plausible length.
        room = size - ends
        following = np.zeros(len(ends), dtype=np.int64)
        readable = room >= 4
        following[readable] = _lengths_at(data, ends[readable])
        plausible = (room < _FRAME.size) | ((following > 0) & (following <= MAX_RECORD_SIZE))
        for offset in offsets[plausible].tolist():
            if _frame_end(view, offset) is not None:
                return offset
    return size


def _lengths_at(data: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """The big-endian 32-bit numbers at ``offsets`` of ``data`` (bytes)."""
    value = data[offsets].astype(np.int64) << 24
    value |= data[offsets + 1].astype(np.int64) << 16
    value |= data[offsets + 2].astype(np.int64) << 8
    value |= data[offsets + 3].astype(np.int64)
    return value


def _times(times: Times | None, record: bytes) -> tuple[int, int] | None:
    if times is None:
        return None
    try:
        return times(record)
    except Exception:  # noqa: BLE001  (a report without a time range beats none)
        return None


def _spanning(*ranges: tuple[int, int] | None) -> tuple[int, int] | None:
    known = [r for r in ranges if r is not None]
    return (min(r[0] for r in known), max(r[1] for r in known)) if known else None


def _read_kept(copy: Path, directory: Path) -> DamagedRegion | None:
    """The region a copy under damaged/ holds, from the description beside
    it (or its name: ``<segment>.<start>-<end>.bin``); None for a file not
    named so."""
    segment, _, offsets = copy.stem.partition(".")
    start, _, end = offsets.partition("-")
    if not (segment.isdigit() and start.isdigit() and end.isdigit()):
        return None
    region = DamagedRegion(directory / f"{segment}{_SUFFIX}", int(start), int(end), kept=copy)
    try:
        description = json.loads(copy.with_suffix(".json").read_text())
        times = description.get("timestamps_ns")
        return replace(
            region, times=None if times is None else (int(times[0]), int(times[1])), found_at=description["found_at"]
        )
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return region


def _utc(ns: int) -> str:
    """``ns`` (since the Unix epoch) as an ISO 8601 UTC time; a time out of
    the calendar's range as the number."""
    try:
        return dt.datetime.fromtimestamp(ns / 1e9, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    except (OverflowError, OSError, ValueError):
        return f"{ns} ns"
