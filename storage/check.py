"""Everything a data dir holds read back and verified (``wakustore db check``).

What is checked, reading without writing (beside a running node):

- **the table's log** (delta-rs): it loads, at its newest version;
- **every data file the version names**: present, of the size the log
  says, its footer readable, every page of every row group decoded (with
  its CRC checked where the file has one: the files the node writes
  itself), and as many rows as the log says. A bad file is reported with
  the rows and the time range the log says it held: what is gone unless
  an archive or another node still has it;
- **the key index files**: whole (header, body CRC) and of a live data
  file; a damaged or missing one is rebuilt by the node from its data file;
- **the write-ahead log**: every record's CRC; a torn tail of the newest
  segment is what a crash mid-write leaves (cut on the next start), a
  damaged region anywhere else is damage (the node skips it, replays the
  records after it and keeps a copy under ``damaged/``), and so is every
  copy kept there, until an operator removes it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

from wakustore.storage import index_files, wal

# Rows decoded at a time while a data file is read through.
_BATCH_ROWS = 8192


@dataclass(frozen=True, slots=True)
class Finding:
    """One thing wrong (or to be repaired) in the data dir."""

    part: str  # "table log", "data file", "key index", "write-ahead log"
    path: str
    problem: str
    lost: str | None = None  # what the damage takes: rows and time range
    repaired_by_node: bool = False
    damage: bool = True  # False: expected after a crash or a removal, handled at the next start

    def line(self) -> str:
        text = f"{self.part} {self.path}: {self.problem}"
        if self.lost:
            text += f"; {self.lost}"
        if self.repaired_by_node:
            text += " (the node rebuilds it)"
        return text


@dataclass(slots=True)
class Totals:
    data_files: int = 0
    rows: int = 0
    bytes: int = 0
    index_files: int = 0
    wal_segments: int = 0
    wal_records: int = 0


def check_table(uri: str, totals: Totals, progress: Callable[[int], None] | None = None) -> Iterator[Finding]:
    """The table's log and every data file of its newest version."""
    import pyarrow as pa
    from deltalake import DeltaTable

    try:
        table = DeltaTable(uri)
        actions = pa.table(table.get_add_actions(flatten=True)).to_pydict()
    except Exception as exc:  # noqa: BLE001  (any failure to load is the finding)
        yield Finding("table log", os.path.join(uri, "_delta_log"), f"cannot be read: {_one_line(exc)}")
        return
    count = len(actions.get("path", []))
    mins = actions.get("min.timestamp", [None] * count)
    maxs = actions.get("max.timestamp", [None] * count)
    for path, size, rows, low, high in zip(actions["path"], actions["size_bytes"], actions["num_records"], mins, maxs):
        totals.data_files += 1
        totals.rows += int(rows or 0)
        totals.bytes += int(size or 0)
        local = os.path.join(uri.removeprefix("file://"), unquote(path))
        problem = _check_data_file(local, int(size), None if rows is None else int(rows))
        if problem is not None:
            lost = f"{rows} rows" + (f", timestamps {low} to {high}" if low is not None else "")
            yield Finding("data file", local, problem, lost)
        if progress is not None:
            progress(int(size or 0))


def _check_data_file(path: str, size: int, rows: int | None) -> str | None:
    """What is wrong with one data file, or None."""
    import pyarrow.parquet as pq

    try:
        actual = os.stat(path).st_size
    except FileNotFoundError:
        return "missing"
    except OSError as exc:
        return f"cannot be read: {_one_line(exc)}"
    if actual != size:
        return f"{actual} bytes where the log says {size}"
    try:
        file = pq.ParquetFile(path, page_checksum_verification=True)
        read = 0
        for batch in file.iter_batches(batch_size=_BATCH_ROWS, use_threads=False):
            read += batch.num_rows
        file.close()
    except Exception as exc:  # noqa: BLE001  (pyarrow raises several kinds for damage)
        return f"unreadable: {_one_line(exc)}"
    if rows is not None and read != rows:
        return f"{read} rows where the log says {rows}"
    return None


def check_indexes(directory: Path, uri: str, totals: Totals) -> Iterator[Finding]:
    """The key index files: each whole and of a live data file."""
    import pyarrow as pa
    from deltalake import DeltaTable

    if not directory.is_dir():
        return
    try:
        actions = pa.table(DeltaTable(uri).get_add_actions(flatten=True)).to_pydict()
    except Exception:  # noqa: BLE001  (reported by check_table)
        return
    live = dict(zip(actions["path"], actions["size_bytes"]))
    count = len(actions["path"])
    spans = dict(
        zip(
            actions["path"],
            zip(
                actions["num_records"],
                actions.get("min.timestamp", [None] * count),
                actions.get("max.timestamp", [None] * count),
            ),
        )
    )
    indexes = index_files.IndexDirectory(directory)
    named = {os.path.basename(indexes.path_of(path)): path for path in live}
    for name in sorted(os.listdir(directory)):
        if not name.endswith(index_files.SUFFIX):
            continue
        totals.index_files += 1
        where = str(directory / name)
        if name not in named:
            yield Finding(
                "key index",
                where,
                "of a data file no longer in the table (removed at the node's next start)",
                damage=False,
            )
            continue
        try:
            mapped = indexes.open(named[name], int(live[named[name]]))
        except index_files.IndexDamaged as exc:
            yield Finding("key index", where, f"damaged: {exc}", repaired_by_node=True)
            continue
        if mapped is not None and not mapped.verify():
            yield Finding("key index", where, "damaged: its body does not match its CRC", repaired_by_node=True)
            continue
        if mapped is not None and mapped.header.file_crc is not None:
            data = os.path.join(uri.removeprefix("file://"), unquote(named[name]))
            try:
                actual = index_files.file_crc32(data)
            except OSError:
                continue  # reported by check_table
            if actual != mapped.header.file_crc:
                rows, low, high = spans[named[name]]
                yield Finding(
                    "data file",
                    data,
                    f"its bytes do not match the CRC-32 taken when it was indexed "
                    f"({actual:08x}, not {mapped.header.file_crc:08x})",
                    f"{rows} rows" + (f", timestamps {low} to {high}" if low is not None else ""),
                )


def check_wal(directory: Path, totals: Totals, times: wal.Times | None = None) -> Iterator[Finding]:
    """Every record of the write-ahead log at ``directory`` (storage/wal.py),
    and the copies of damaged regions the node kept aside there. ``times``:
    the time range a record holds (:func:`log_times`)."""
    if not directory.is_dir():
        return
    segments = wal.segment_paths(directory)
    found = wal.survey(segments, times)
    totals.wal_segments += len(segments)
    totals.wal_records += sum(found.records)
    if found.torn is not None:
        yield Finding(
            "write-ahead log",
            str(found.torn.segment),
            f"torn tail: {found.torn.size} bytes from byte {found.torn.start} (a crash mid-write, or a write in "
            "progress; cut at the next start)",
            damage=False,
        )
    kept = {(region.segment.name, region.start, region.end): region for region in wal.kept_damage(directory)}
    for region in found.damage:
        copy = kept.pop((region.segment.name, region.start, region.end), None)
        yield Finding(
            "write-ahead log",
            str(region.segment),
            f"damaged: bytes {region.start} to {region.end} ({region.size} bytes) hold no whole record; the node "
            "skips them and replays the records after them"
            + (" (a copy is kept at its next start)" if copy is None else f" (a copy is kept at {copy.kept})"),
            _wal_lost(region),
        )
    for region in kept.values():
        found_at = region.describe()["found_at"]
        when = "" if found_at is None else f" on {found_at}"
        yield Finding(
            "write-ahead log",
            str(region.kept),
            f"bytes {region.start} to {region.end} of {region.segment.name}, damaged, skipped by the node{when} "
            "and kept here (the segment is gone; remove the copy once seen)",
            _wal_lost(region),
        )


def log_times(name: str) -> wal.Times | None:
    """The time range a record of the node's log ``<data dir>/wal/<name>`` holds."""
    from wakustore.storage.write_path import record_times

    if name == "messages":
        from wakustore.storage.message_store import MESSAGE_CODEC

        return record_times(MESSAGE_CODEC)
    if name == "envelopes":
        from wakustore.storage.envelope_store import ENVELOPE_CODEC

        return record_times(ENVELOPE_CODEC)
    return None


def _wal_lost(region: wal.DamagedRegion) -> str:
    lost = "the records in them"
    if region.times is not None:
        lost += f", logged between whole records holding times {region.time_range()}"
    return lost


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
