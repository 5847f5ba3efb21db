"""The Delta log's torn tail put aside before a node opens its table (storage/log_repair.py),
on real tables written by delta-rs, with what a power cut leaves simulated on disk."""

import json
from pathlib import Path
from urllib.parse import unquote

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from wakustore.storage.commit_sync import CommitSync, read_synced_marker, write_synced_marker
from wakustore.storage.log_repair import REPAIRED_DIR, repair


def _table(tmp_path: Path, versions: int = 4, partitioned: bool = True) -> Path:
    """A table with one small append per version: version v holds rows v*10 and v*10+1."""
    root = tmp_path / "table"
    for v in range(versions):
        data = pa.table({"v": [v * 10, v * 10 + 1], "p": ["a", "b"]})
        write_deltalake(str(root), data, mode="append", partition_by=["p"] if partitioned else None)
    return root


def _mark(root: Path, version: int) -> None:
    write_synced_marker(root, version)
    assert read_synced_marker(root) == version


def _entry(root: Path, version: int) -> Path:
    return root / "_delta_log" / f"{version:020d}.json"


def _added(root: Path, version: int) -> list[Path]:
    lines = _entry(root, version).read_text().splitlines()
    actions = [json.loads(line) for line in lines if line.strip()]
    return [root / unquote(a["add"]["path"]) for a in actions if "add" in a]


def _rows(*versions: int) -> list[int]:
    return sorted(x for v in versions for x in (v * 10, v * 10 + 1))


def _assert_reads(root: Path, *versions: int) -> None:
    table = DeltaTable(str(root))
    assert table.version() == versions[-1]
    assert sorted(table.to_pyarrow_table().column("v").to_pylist()) == _rows(*versions)


def _assert_moved(root: Path, result, names: list[str]) -> None:
    assert result
    assert sorted(result.moved) == sorted(names)
    assert result.directory is not None and result.directory.parent == root / REPAIRED_DIR
    for name in names:
        assert (result.directory / name).exists()
        assert not (root / "_delta_log" / name).exists()


def test_whole_log_with_marker_at_last_version_moves_nothing(tmp_path):
    root = _table(tmp_path)
    assert CommitSync(root).sync() == 3 and read_synced_marker(root) == 3
    result = repair(root)
    assert not result and result.moved == [] and result.versions == [] and result.directory is None
    assert not (root / REPAIRED_DIR).exists()
    _assert_reads(root, 0, 1, 2, 3)


def test_whole_log_without_marker_moves_nothing(tmp_path):
    root = _table(tmp_path, partitioned=False)
    assert not repair(root)
    _assert_reads(root, 0, 1, 2, 3)


def test_missing_log_directory_is_not_an_error(tmp_path):
    assert not repair(tmp_path / "absent")
    (tmp_path / "empty").mkdir()
    assert not repair(tmp_path / "empty")


def test_last_entry_truncated_mid_line_is_moved(tmp_path):
    root = _table(tmp_path)
    _mark(root, 2)
    entry = _entry(root, 3)
    text = entry.read_bytes()
    entry.write_bytes(text[: len(text) // 2])
    result = repair(root)
    _assert_moved(root, result, [entry.name])
    assert result.versions == [3] and "torn" in result.reason
    _assert_reads(root, 0, 1, 2)


def test_empty_entry_is_moved(tmp_path):
    root = _table(tmp_path)
    _mark(root, 2)
    _entry(root, 3).write_bytes(b"")
    result = repair(root)
    assert result.versions == [3] and "empty" in result.reason
    _assert_reads(root, 0, 1, 2)


def _missing(data: Path) -> None:
    data.unlink()


def _halved(data: Path) -> None:
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])


def _no_magic(data: Path) -> None:
    body = data.read_bytes()
    data.write_bytes(body[:-4] + b"\0\0\0\0")  # the size the entry gives, kept


@pytest.mark.parametrize(
    ("damage", "why"), [(_missing, "missing"), (_halved, "bytes"), (_no_magic, "not a whole Parquet file")]
)
def test_a_data_file_torn_moves_its_version(tmp_path, damage, why):
    """Missing, shorter than its entry says, or without Parquet's closing magic."""
    root = _table(tmp_path)
    _mark(root, 2)
    damage(_added(root, 3)[-1])
    result = repair(root)
    _assert_moved(root, result, [_entry(root, 3).name])
    assert result.versions == [3] and why in result.reason
    _assert_reads(root, 0, 1, 2)


def test_later_version_never_survives_an_earlier_torn_one(tmp_path):
    root = _table(tmp_path)
    _mark(root, 1)
    _added(root, 2)[0].unlink()
    result = repair(root)
    _assert_moved(root, result, [_entry(root, 2).name, _entry(root, 3).name])
    assert result.versions == [2, 3] and result.reason.startswith("version 2:")
    _assert_reads(root, 0, 1)


def test_torn_versions_at_or_before_marker_are_never_touched(tmp_path):
    root = _table(tmp_path)
    _mark(root, 3)
    _added(root, 3)[0].unlink()
    _added(root, 2)[0].unlink()
    entry = _entry(root, 1)
    entry.write_bytes(entry.read_bytes()[:40])
    before = sorted(p.name for p in (root / "_delta_log").iterdir())
    assert not repair(root)
    assert sorted(p.name for p in (root / "_delta_log").iterdir()) == before
    assert not (root / REPAIRED_DIR).exists()


def test_add_removed_by_later_overwrite_and_vacuumed_is_not_checked(tmp_path):
    root = _table(tmp_path, versions=2)
    _mark(root, 0)
    gone = _added(root, 1)
    write_deltalake(str(root), pa.table({"v": [20, 21], "p": ["a", "b"]}), mode="overwrite", partition_by=["p"])
    for path in gone:
        path.unlink()  # as a vacuum would
    assert not repair(root)
    table = DeltaTable(str(root))
    assert table.version() == 2
    assert sorted(table.to_pyarrow_table().column("v").to_pylist()) == _rows(2)


def test_last_checkpoint_naming_missing_checkpoint_is_moved(tmp_path):
    root = _table(tmp_path)
    DeltaTable(str(root)).create_checkpoint()
    checkpoint = root / "_delta_log" / f"{3:020d}.checkpoint.parquet"
    checkpoint.unlink()
    _mark(root, 2)
    result = repair(root)
    _assert_moved(root, result, ["_last_checkpoint"])
    assert result.versions == [] and "_last_checkpoint" in result.reason
    _assert_reads(root, 0, 1, 2, 3)


def test_torn_last_checkpoint_is_moved(tmp_path):
    root = _table(tmp_path)
    DeltaTable(str(root)).create_checkpoint()
    CommitSync(root).sync()
    (root / "_delta_log" / "_last_checkpoint").write_bytes(b"\x00\xff{garbage")
    result = repair(root)
    _assert_moved(root, result, ["_last_checkpoint"])
    _assert_reads(root, 0, 1, 2, 3)


def test_torn_checkpoint_after_marker_is_moved_with_last_checkpoint(tmp_path):
    root = _table(tmp_path)
    DeltaTable(str(root)).create_checkpoint()
    _mark(root, 2)
    checkpoint = root / "_delta_log" / f"{3:020d}.checkpoint.parquet"
    checkpoint.write_bytes(checkpoint.read_bytes()[:100])
    result = repair(root)
    _assert_moved(root, result, [checkpoint.name, "_last_checkpoint"])
    assert result.versions == [] and "checkpoint" in result.reason
    _assert_reads(root, 0, 1, 2, 3)


def test_gap_after_marker_moves_versions_from_the_gap_on(tmp_path):
    root = _table(tmp_path, versions=5)
    _mark(root, 1)
    _entry(root, 3).unlink()
    result = repair(root)
    _assert_moved(root, result, [_entry(root, 4).name])
    assert result.versions == [4] and "version 3 is missing" in result.reason
    _assert_reads(root, 0, 1, 2)


def test_gap_right_after_marker_moves_versions_from_the_gap_on(tmp_path):
    root = _table(tmp_path)
    _mark(root, 1)
    _entry(root, 2).unlink()
    result = repair(root)
    # The version right after the synced one lost, a later one there: a gap,
    # which delta-rs refuses ("Expected contiguous commit files, but found gap").
    assert result.moved == [_entry(root, 3).name]
    assert result.versions == [3] and "version 2 is missing" in result.reason
    _assert_moved(root, result, [_entry(root, 3).name])
    _assert_reads(root, 0, 1)


def test_an_entry_cut_just_after_one_of_its_lines_is_torn(tmp_path):
    """Whole lines parse; but this table's writer never ends an entry with
    a newline, so one that does was cut (its later actions lost: a
    compaction's removes, say, which would serve its rows twice)."""
    root = _table(tmp_path)
    _mark(root, 2)
    entry = _entry(root, 3)
    lines = entry.read_bytes().split(b"\n")
    entry.write_bytes(b"\n".join(lines[:-1]) + b"\n")
    result = repair(root)
    assert result.versions == [3] and "cut after a line" in result.reason
    _assert_reads(root, 0, 1, 2)
