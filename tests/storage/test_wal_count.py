"""Counting a write-ahead log beside the process that writes it."""

from wakustore.storage.wal import WriteAheadLog, count_records


def test_count_records_spans_segments_and_changes_nothing(tmp_path):
    wal = WriteAheadLog(tmp_path / "wal", segment_size=10)
    for i in range(4):
        wal.append([bytes([i]) * 8])  # a segment each
    wal.append([b"a", b"b"])
    listing = sorted((p.name, p.stat().st_size) for p in (tmp_path / "wal").iterdir())
    assert count_records(tmp_path / "wal") == 6
    assert sorted((p.name, p.stat().st_size) for p in (tmp_path / "wal").iterdir()) == listing
    wal.close()


def test_a_frame_still_being_written_is_not_counted_and_not_cut(tmp_path):
    wal = WriteAheadLog(tmp_path)
    wal.append([b"first", b"second"])
    (segment,) = tmp_path.iterdir()
    with open(segment, "ab") as handle:  # the writer's next frame, half written
        handle.write(b"\x00\x00\x00\x10\x00")
    size = segment.stat().st_size
    assert count_records(tmp_path) == 2
    assert segment.stat().st_size == size  # a reader never truncates
    wal.close()


def test_a_missing_log_counts_zero_and_is_not_created(tmp_path):
    assert count_records(tmp_path / "wal") == 0
    assert not (tmp_path / "wal").exists()
