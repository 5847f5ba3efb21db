"""A damaged write-ahead log: whole records after damage are replayed, the
damage is skipped, reported and kept aside; only the newest segment's torn
tail is cut (storage/wal.py)."""

import json
import logging
import struct
import tracemalloc
import zlib

import pytest

from wakustore.storage.wal import (
    DAMAGED_DIR,
    DEFAULT_SEGMENT_SIZE,
    MAX_RECORD_SIZE,
    WriteAheadLog,
    count_records,
    kept_damage,
    scan_segment,
    segment_paths,
)

HEADER = 8


def records(count, size=300, tag=b"r"):
    return [tag + b"%04d-" % i + bytes([i % 251]) * size for i in range(count)]


def offsets(bodies):
    """Start of each frame in a segment holding ``bodies`` back to back."""
    out, at = [], 0
    for body in bodies:
        out.append(at)
        at += HEADER + len(body)
    return out


def flip(path, at, count=16):
    data = bytearray(path.read_bytes())
    for i in range(at, min(at + count, len(data))):
        data[i] ^= 0xA5
    path.write_bytes(bytes(data))


def write_log(directory, *batches, segment_size=DEFAULT_SEGMENT_SIZE):
    """A log with ``batches`` appended, closed; its segments, oldest first."""
    log = WriteAheadLog(directory, segment_size=segment_size)
    for batch in batches:
        log.append(batch)
    log.close()
    return segment_paths(directory)


def stamped(i):
    """A record whose "time" is ``i`` seconds, for the time range reports."""
    return b"t" + struct.pack(">Q", i * 10**9) + bytes([i % 256]) * 200


def stamp_times(record):
    (ns,) = struct.unpack(">Q", record[1:9])
    return ns, ns


def test_flipped_bytes_in_the_middle_of_a_record_lose_only_that_record(tmp_path, caplog):
    bodies = records(20)
    (segment,) = write_log(tmp_path, bodies[:10], bodies[10:])
    starts = offsets(bodies)
    flip(segment, starts[7] + HEADER + 100)
    with caplog.at_level(logging.WARNING, logger="wakustore.storage.wal"):
        reopened = WriteAheadLog(tmp_path)
    replayed = list(reopened.replay())
    assert [body for _, body in replayed] == bodies[:7] + bodies[8:]
    assert [seq for seq, _ in replayed] == list(range(1, 20))
    (region,) = reopened.damage
    assert (region.segment, region.start, region.end) == (segment, starts[7], starts[8])
    assert region.kept == tmp_path / DAMAGED_DIR / f"{segment.stem}.{starts[7]}-{starts[8]}.bin"
    assert region.kept.read_bytes() == segment.read_bytes()[starts[7] : starts[8]]
    (line,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert f"bytes {starts[7]} to {starts[8]}" in line and str(segment) in line and str(region.kept) in line
    # Nothing was cut: the damage stays in the segment until a trim, and the
    # log goes on after it, numbered on.
    assert segment.stat().st_size == starts[-1] + HEADER + len(bodies[-1])
    assert reopened.append([b"after"]) == 20
    reopened.close()
    again = WriteAheadLog(tmp_path)
    assert [body for _, body in again.replay()] == bodies[:7] + bodies[8:] + [b"after"]
    assert [(r.start, r.end) for r in again.damage] == [(starts[7], starts[8])]


def test_a_damaged_length_field_loses_only_its_record(tmp_path):
    bodies = records(12)
    (segment,) = write_log(tmp_path, bodies)
    starts = offsets(bodies)
    for at, value in ((starts[3], 0xFFFFFFFF), (starts[6], 5_000), (starts[9], 0)):
        data = bytearray(segment.read_bytes())
        data[at : at + 4] = struct.pack(">I", value)
        segment.write_bytes(bytes(data))
    reopened = WriteAheadLog(tmp_path)
    assert [body for _, body in reopened.replay()] == [b for i, b in enumerate(bodies) if i not in (3, 6, 9)]
    assert [(r.start, r.end) for r in reopened.damage] == [(starts[i], starts[i + 1]) for i in (3, 6, 9)]


def test_a_damaged_checksum_field_loses_only_its_record(tmp_path):
    bodies = records(5)
    (segment,) = write_log(tmp_path, bodies)
    flip(segment, offsets(bodies)[2] + 4, count=4)
    assert [body for _, body in WriteAheadLog(tmp_path).replay()] == bodies[:2] + bodies[3:]


def test_a_damaged_last_record_is_a_torn_tail_cut_without_a_report(tmp_path):
    bodies = records(6)
    (segment,) = write_log(tmp_path, bodies)
    last = offsets(bodies)[-1]
    flip(segment, last + HEADER + 50)
    reopened = WriteAheadLog(tmp_path)
    assert [body for _, body in reopened.replay()] == bodies[:-1]
    assert reopened.damage == [] and not (tmp_path / DAMAGED_DIR).exists()
    assert segment.stat().st_size == last
    assert reopened.append([b"next"]) == 6


@pytest.mark.parametrize("keep", [3, HEADER + 10, HEADER + 299])
def test_a_newest_segment_cut_short_is_a_torn_tail(tmp_path, keep):
    bodies = records(4)
    (segment,) = write_log(tmp_path, bodies)
    last = offsets(bodies)[-1]
    with open(segment, "r+b") as handle:
        handle.truncate(last + keep)
    reopened = WriteAheadLog(tmp_path)
    assert [body for _, body in reopened.replay()] == bodies[:-1]
    assert reopened.damage == [] and segment.stat().st_size == last


def test_zeros_after_the_last_record_are_a_torn_tail_not_empty_records(tmp_path):
    (segment,) = write_log(tmp_path, [b"one", b"two"])
    with open(segment, "ab") as handle:
        handle.write(bytes(4096))  # what a file system may show past unsynced writes
    reopened = WriteAheadLog(tmp_path)
    assert [body for _, body in reopened.replay()] == [b"one", b"two"]
    assert reopened.damage == []
    with pytest.raises(ValueError):
        reopened.append([b""])  # an empty record would read as zeros


def test_damage_in_an_older_segment_keeps_its_later_records_and_the_later_segments(tmp_path):
    appended = [records(5, tag=b"s%d-" % i) for i in range(4)]
    segments = write_log(tmp_path, *appended, segment_size=1000)  # a segment an append
    assert len(segments) == 4
    starts = offsets(appended[1])
    flip(segments[1], starts[2] + HEADER + 30)
    reopened = WriteAheadLog(tmp_path, segment_size=1000)
    replayed = list(reopened.replay())
    expected = [b for i, batch in enumerate(appended) for j, b in enumerate(batch) if (i, j) != (1, 2)]
    assert [body for _, body in replayed] == expected
    # Sequence numbers count whole records from each segment's name.
    assert [seq for seq, _ in replayed] == [1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20]
    (region,) = reopened.damage
    assert (region.segment, region.start, region.end) == (segments[1], starts[2], starts[3])


def test_a_truncated_older_segment_is_damage_and_the_newer_ones_replay(tmp_path):
    first, second = records(5, tag=b"a"), records(5, tag=b"b")
    older, newer = write_log(tmp_path, first, second, segment_size=1000)
    cut = offsets(first)[-1] + 100
    with open(older, "r+b") as handle:
        handle.truncate(cut)
    reopened = WriteAheadLog(tmp_path, segment_size=1000)
    assert [body for _, body in reopened.replay()] == first[:-1] + second
    (region,) = reopened.damage
    assert (region.segment, region.start, region.end) == (older, offsets(first)[-1], cut)
    assert older.stat().st_size == cut  # only the newest segment's tail is ever cut


def test_several_damaged_regions_are_each_skipped_and_reported(tmp_path):
    first, second = records(12, tag=b"a"), records(12, tag=b"b")
    older, newer = write_log(tmp_path, first, second, segment_size=3000)
    a, b = offsets(first), offsets(second)
    flip(older, a[1] + 20)
    flip(older, a[4] + 2, count=40)  # a length field and into the body
    flip(older, a[5] + 100)  # the record right after: one region with it
    flip(older, a[11] + 200)  # the older segment's last record: damage, not a tail
    flip(newer, b[0] + 1)
    flip(newer, b[7] + 150)
    reopened = WriteAheadLog(tmp_path, segment_size=3000)
    lost = {(0, 1), (0, 4), (0, 5), (0, 11), (1, 0), (1, 7)}
    expected = [body for s, batch in enumerate((first, second)) for i, body in enumerate(batch) if (s, i) not in lost]
    assert [body for _, body in reopened.replay()] == expected
    assert [(r.segment, r.start, r.end) for r in reopened.damage] == [
        (older, a[1], a[2]),
        (older, a[4], a[6]),
        (older, a[11], older.stat().st_size),
        (newer, b[0], b[1]),
        (newer, b[7], b[8]),
    ]
    assert len(list((tmp_path / DAMAGED_DIR).glob("*.bin"))) == 5
    assert count_records(tmp_path) == len(expected)


def test_the_report_names_the_time_range_of_the_whole_records_either_side(tmp_path, caplog):
    bodies = [stamped(1_700_000_000 + i) for i in range(10)]
    (segment,) = write_log(tmp_path, bodies)
    flip(segment, offsets(bodies)[4] + HEADER + 20)
    with caplog.at_level(logging.WARNING, logger="wakustore.storage.wal"):
        (region,) = WriteAheadLog(tmp_path, times=stamp_times).damage
    assert region.times == (1_700_000_003 * 10**9, 1_700_000_005 * 10**9)
    assert "2023-11-14T22:13:23.000000Z to 2023-11-14T22:13:25.000000Z" in caplog.text
    described = region.describe()
    assert described["timestamps_ns"] == [1_700_000_003 * 10**9, 1_700_000_005 * 10**9]
    assert described["segment"] == str(segment) and described["copy"] == str(region.kept)
    description = json.loads(region.kept.with_suffix(".json").read_text())
    assert description["segment"] == segment.name and description["timestamps_ns"] == described["timestamps_ns"]


def test_the_copy_outlives_the_trim_and_is_made_once(tmp_path):
    bodies = records(8)
    (segment,) = write_log(tmp_path, bodies)
    flip(segment, offsets(bodies)[3] + HEADER + 7)
    reopened = WriteAheadLog(tmp_path)
    (region,) = reopened.damage
    copy, found_at = region.kept, region.found_at
    reopened.close()
    again = WriteAheadLog(tmp_path)  # a second start finds it again, keeps it once
    assert [(r.kept, r.found_at) for r in again.damage] == [(copy, found_at)]
    assert [p.name for p in (tmp_path / DAMAGED_DIR).iterdir()] == sorted([copy.name, copy.with_suffix(".json").name])
    again.trim(again.last_seq)  # the commit that holds every record
    assert not segment.exists() and list(again.replay()) == []
    (kept,) = kept_damage(tmp_path)
    assert (kept.segment, kept.start, kept.end, kept.kept, kept.found_at) == (
        segment,
        region.start,
        region.end,
        copy,
        found_at,
    )
    assert again.reported_damage() == [kept]
    assert WriteAheadLog(tmp_path).damage == []  # gone from the log, still reported from the copy
    copy.unlink()  # an operator who has seen it
    assert kept_damage(tmp_path) == []


def test_a_damaged_length_never_makes_the_reader_hold_more_than_the_segment(tmp_path):
    (segment,) = write_log(tmp_path, records(3, size=100))
    data = bytearray(segment.read_bytes())
    data[0:4] = struct.pack(">I", MAX_RECORD_SIZE)  # 16 MiB claimed by a 350-byte segment
    segment.write_bytes(bytes(data))
    tracemalloc.start()
    try:
        reopened = WriteAheadLog(tmp_path)
        assert len(list(reopened.replay())) == 2
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1024 * 1024


def test_pieces_cover_every_byte_in_order():
    bodies = records(30, size=50)
    data = bytearray(b"".join(struct.pack(">II", len(b), zlib.crc32(b)) + b for b in bodies))
    for at in (0, 400, 401, 1200, len(data) - 5):
        data[at] ^= 0xFF
    pieces = list(scan_segment(bytes(data)))
    assert pieces[0].start == 0 and pieces[-1].end == len(data)
    assert all(a.end == b.start for a, b in zip(pieces, pieces[1:]))
    whole = [p.body(bytes(data)) for p in pieces if p.whole]
    assert set(whole) <= set(bodies) and len(whole) == len(bodies) - 4
