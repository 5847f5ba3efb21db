import errno
import subprocess

import pytest

from wakustore.storage.wal import WriteAheadLog


def test_appended_records_replay_in_order_after_reopen(tmp_path):
    wal = WriteAheadLog(tmp_path)
    assert wal.append([b"a", b"b"]) == 2
    assert wal.append([b"c"]) == 3
    wal.close()
    reopened = WriteAheadLog(tmp_path)
    assert list(reopened.replay()) == [(1, b"a"), (2, b"b"), (3, b"c")]
    assert reopened.append([b"d"]) == 4


def test_trim_removes_only_whole_committed_segments(tmp_path):
    wal = WriteAheadLog(tmp_path, segment_size=10)
    for i in range(5):
        wal.append([bytes([i]) * 8])  # every append fills a segment
    wal.trim(3)
    assert [seq for seq, _ in wal.replay()] == [4, 5]
    assert wal.depth == 2
    wal.trim(5)
    assert list(wal.replay()) == []
    assert wal.append([b"x"]) == 6
    assert list(wal.replay()) == [(6, b"x")]


def test_trim_keeps_a_segment_with_uncommitted_records(tmp_path):
    wal = WriteAheadLog(tmp_path)
    wal.append([b"a", b"b", b"c"])
    wal.trim(2)
    assert [seq for seq, _ in wal.replay()] == [1, 2, 3]


def test_torn_tail_is_cut_on_open(tmp_path):
    wal = WriteAheadLog(tmp_path)
    wal.append([b"first", b"second"])
    wal.close()
    (segment,) = tmp_path.iterdir()
    with open(segment, "ab") as handle:
        handle.write(b"\x00\x00\x00\x10\x01\x02")  # a crash mid-frame
    reopened = WriteAheadLog(tmp_path)
    assert [body for _, body in reopened.replay()] == [b"first", b"second"]
    assert reopened.append([b"third"]) == 3
    assert [body for _, body in WriteAheadLog(tmp_path).replay()] == [b"first", b"second", b"third"]


def test_oversized_record_is_refused(tmp_path):
    from wakustore.storage.wal import MAX_RECORD_SIZE

    wal = WriteAheadLog(tmp_path)
    with pytest.raises(ValueError):
        wal.append([bytes(MAX_RECORD_SIZE + 1)])
    assert list(wal.replay()) == []


def test_records_survive_a_killed_writer(tmp_path):
    import sys

    code = (
        "import os, sys\n"
        "from wakustore.storage.wal import WriteAheadLog\n"
        f"wal = WriteAheadLog({str(tmp_path)!r})\n"
        "wal.append([b'durable-%d' % i for i in range(100)])\n"
        "os.kill(os.getpid(), 9)\n"
    )
    result = subprocess.run([sys.executable, "-c", code])
    assert result.returncode == -9
    bodies = [body for _, body in WriteAheadLog(tmp_path).replay()]
    assert bodies == [b"durable-%d" % i for i in range(100)]


def test_write_path_refuses_new_rows_past_its_pending_bound(tmp_path):
    from wakustore.protocols.message import WakuMessage
    from wakustore.storage.message_store import MESSAGE_CODEC
    from wakustore.storage.rows import Row
    from wakustore.storage.write_path import BufferFull, WritePath

    class Down:
        is_embedded = True

        def run(self, fn, retry=True):
            raise RuntimeError("engine down")

    from wakustore.storage.table import DeltaTableRef

    path = WritePath(
        DeltaTableRef(Down(), str(tmp_path / "t")),
        tmp_path / "wal",
        MESSAGE_CODEC,
        recent_keys=100,
        flush_interval_s=1,
        flush_max_rows=10,
        max_pending=5,
    )
    rows = [Row.build("/p", WakuMessage(b"%d" % i, "/c"), 0) for i in range(8)]
    assert path.put(rows[:5]) == (5, 0)
    with pytest.raises(BufferFull):
        path.put(rows[5:])
    assert path.pending == 5 and path.wal_depth == 5  # nothing of the refused batch was logged


def test_a_full_disk_fails_the_batch_whole_and_leaves_no_partial_record(tmpfs):
    """ENOSPC in the middle of a batch: append raises (nothing of it is
    acknowledged), the segment is cut back to its last whole record, and
    once space returns the same log goes on; a restart replays every
    record it acknowledged, in order, with no damage between them."""
    tiny_fs = tmpfs("1m")
    ballast = tiny_fs / "ballast"
    ballast.write_bytes(b"\0" * (256 * 1024))
    log = WriteAheadLog(tiny_fs / "wal")
    acknowledged = []
    with pytest.raises(OSError) as failed:
        for i in range(10_000):
            batch = [b"r%05d-%d" % (i, j) + b"x" * 1500 for j in range(3)]
            log.append(batch)
            acknowledged += batch
    assert failed.value.errno == errno.ENOSPC and acknowledged
    (segment,) = (tiny_fs / "wal").iterdir()
    assert segment.stat().st_size == sum(8 + len(r) for r in acknowledged)
    ballast.unlink()  # space returns
    later = [b"after %d" % i for i in range(3)]
    log.append(later)
    log.close()
    assert [body for _, body in WriteAheadLog(tiny_fs / "wal").replay()] == acknowledged + later
