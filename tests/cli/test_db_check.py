"""`wakustore db check`: every file of a data dir read back, what is wrong named with what it held."""

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from wakustore.protocols.message import WakuMessage
from wakustore.storage import maintenance, wal
from wakustore.storage.check import log_times
from wakustore.storage.message_store import MESSAGE_CODEC, MessageStore
from wakustore.storage.reader import TableReader
from wakustore.storage.rows import Row
from wakustore.storage.table import DeltaTableRef
from wakustore.storage.write_path import batch_records

DAY = 86_400 * 10**9


def wakustore(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "wakustore", *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def checked(engine, tmp_path_factory):
    """A data dir with four days of messages, committed in several flushes
    (several files a day), finished days compacted by the node (its own
    files, a CRC a page), and the key index built."""
    data = tmp_path_factory.mktemp("check") / "data"
    now = time.time_ns()
    messages = [
        (
            "/waku/2/rs/16/32",
            WakuMessage(payload=os.urandom(200 + i % 50), content_topic=f"/check/1/t{i % 3}/proto", timestamp=t),
            t,
        )
        for i, t in ((i, now - (i % 4) * DAY - i) for i in range(2000))
    ]
    store = MessageStore(DeltaTableRef(engine, str(data / "tables" / "messages")), data / "wal" / "messages")
    store.open()
    for start in range(0, len(messages), 500):
        store.put(messages[start : start + 500])
        store.flush()
    maintenance.run_maintenance(store, None, now)
    store.close()
    uri = str(data / "tables" / "messages")
    reader = TableReader(
        uri, check_interval_s=None, index_in_background=False, index_directory=data / "index" / "messages"
    )
    reader.index_now()
    reader.close()
    return data


def _copy(data: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "data"
    shutil.copytree(data, copy)
    return copy


def _files(data: Path) -> list[tuple[Path, int, int]]:
    """(path, size, rows) of the table's data files, largest first."""
    uri = data / "tables" / "messages"
    actions = pa.table(DeltaTable(str(uri)).get_add_actions(flatten=True)).to_pydict()
    files = [(uri / p, s, r) for p, s, r in zip(actions["path"], actions["size_bytes"], actions["num_records"])]
    return sorted(files, key=lambda f: -f[1])


def _check(data: Path):
    return wakustore("db", "check", "--data-dir", str(data))


def test_a_whole_data_dir_has_no_problem(checked):
    result = _check(checked)
    assert result.returncode == 0, result.stdout + result.stderr
    files = _files(checked)
    summary = result.stdout.strip().splitlines()[-1]
    assert summary.startswith(f"checked {len(files):,} data files (2,000 rows, ")
    assert summary.endswith("no problem found") and "key index files" in summary


def test_a_truncated_data_file_is_named_with_the_rows_and_times_it_held(checked, tmp_path):
    data = _copy(checked, tmp_path)
    path, size, rows = _files(data)[0]
    with open(path, "r+b") as handle:
        handle.truncate(size - 100)
    result = _check(data)
    assert result.returncode == 1
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("data file")]
    assert str(path) in line and f"{size - 100} bytes where the log says {size}" in line
    assert f"{rows} rows, timestamps " in line
    assert result.stdout.strip().endswith("1 problem")


def test_a_flipped_bit_in_a_compacted_page_fails_its_checksum(checked, tmp_path):
    data = _copy(checked, tmp_path)
    # A compacted day: written by the node, with page CRCs.
    path, size, _ = next(f for f in _files(data) if "parquet-rs" not in pq.ParquetFile(f[0]).metadata.created_by)
    raw = bytearray(path.read_bytes())
    raw[size // 3] ^= 0x10  # inside the pages (the footer is at the end)
    path.write_bytes(bytes(raw))
    result = _check(data)
    assert result.returncode == 1
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("data file")]
    assert str(path) in line and "unreadable" in line


def test_a_flipped_bit_in_an_ingest_file_fails_the_crc_its_index_took(checked, tmp_path):
    data = _copy(checked, tmp_path)
    # Today's files: written by the engine, no page CRCs; their index holds the file's.
    path, size, rows = next(f for f in _files(data) if "parquet-rs" in pq.ParquetFile(f[0]).metadata.created_by)
    raw = bytearray(path.read_bytes())
    raw[size // 2] ^= 0x01
    path.write_bytes(bytes(raw))
    result = _check(data)
    assert result.returncode == 1
    lines = [line for line in result.stdout.splitlines() if line.startswith(f"data file {path}")]
    assert any("do not match the CRC-32 taken when it was indexed" in line for line in lines), result.stdout
    assert all(f"{rows} rows, timestamps " in line for line in lines)


def test_a_damaged_index_file_is_reported_as_rebuilt_by_the_node(checked, tmp_path):
    data = _copy(checked, tmp_path)
    index = sorted((data / "index" / "messages").glob("*.kix"))[0]
    raw = bytearray(index.read_bytes())
    raw[-10] ^= 0xFF
    index.write_bytes(bytes(raw))
    result = _check(data)
    assert result.returncode == 1
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("key index")]
    assert str(index) in line and "damaged" in line and line.endswith("(the node rebuilds it)")


def test_the_write_ahead_log_torn_tail_is_not_damage_a_bad_record_before_it_is(checked, tmp_path):
    data = _copy(checked, tmp_path)
    directory = data / "wal" / "messages"
    shutil.rmtree(directory, ignore_errors=True)
    log = wal.WriteAheadLog(directory, segment_size=4096)
    for _ in range(20):
        log.append([os.urandom(1000)])
    log.close()
    segments = sorted(directory.glob("*.wal"), key=lambda p: int(p.stem))
    assert len(segments) > 2
    with open(segments[-1], "ab") as handle:
        handle.write(b"\x00\x00\x10")  # a frame header cut short
    result = _check(data)
    assert result.returncode == 0, result.stdout
    assert "torn tail" in result.stdout and "no problem found" in result.stdout

    raw = bytearray(segments[0].read_bytes())
    raw[20] ^= 0xFF
    segments[0].write_bytes(bytes(raw))
    result = _check(data)
    assert result.returncode == 1
    (line,) = [line for line in result.stdout.splitlines() if "damaged" in line]
    assert line.startswith(f"write-ahead log {segments[0]}: damaged: bytes 0 to 1008 (1008 bytes) hold no whole record")
    assert "a copy is kept at its next start" in line and line.endswith("the records in them")
    assert "1 problem" in result.stdout.splitlines()[-1]


def test_a_damaged_write_ahead_log_record_is_named_with_its_times_until_its_copy_is_removed(checked, tmp_path):
    """The node skipped a damaged record and kept a copy; once the segment
    is trimmed, the copy is what db check reports, with the time range of
    the records either side, until an operator removes it."""
    data = _copy(checked, tmp_path)
    directory = data / "wal" / "messages"
    shutil.rmtree(directory, ignore_errors=True)
    log = wal.WriteAheadLog(directory)
    stamps = [1_750_000_000 * 10**9 + i * 10**9 for i in range(3)]
    for stamp in stamps:
        message = WakuMessage(payload=os.urandom(300), content_topic="/check/1/wal/proto", timestamp=stamp)
        log.append(batch_records(MESSAGE_CODEC.to_arrow([_row(message)])))
    log.close()
    (segment,) = directory.glob("*.wal")
    raw = bytearray(segment.read_bytes())
    middle = len(raw) // 2
    raw[middle : middle + 16] = bytes(b ^ 0x5A for b in raw[middle : middle + 16])
    segment.write_bytes(bytes(raw))
    times = "2025-06-15T15:06:40.000000Z to 2025-06-15T15:06:42.000000Z"

    result = _check(data)
    assert result.returncode == 1
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("write-ahead log")]
    assert f"{segment}: damaged: bytes " in line and line.endswith(f"holding times {times}")

    reopened = wal.WriteAheadLog(directory, times=log_times("messages"))  # as the node opens it
    (region,) = reopened.damage
    result = _check(data)
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("write-ahead log")]
    assert f"(a copy is kept at {region.kept})" in line

    reopened.trim(reopened.last_seq)
    reopened.close()
    assert not segment.exists()
    result = _check(data)
    assert result.returncode == 1
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("write-ahead log")]
    assert line.startswith(f"write-ahead log {region.kept}: bytes {region.start} to {region.end} of {segment.name}")
    assert "remove the copy once seen" in line and line.endswith(f"holding times {times}")

    region.kept.unlink()
    assert _check(data).returncode == 0


def _row(message):
    return Row.build("/waku/2/rs/16/32", message, message.timestamp)


def test_no_table_is_one_line(tmp_path):
    for data, said in ((tmp_path / "absent", "does not exist"), (tmp_path, "no message table")):
        result = _check(data)
        assert result.returncode == 2
        assert result.stderr.strip().count("\n") == 0 and said in result.stderr
