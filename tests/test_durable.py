"""Files written whole (wakustore/durable.py)."""

import pytest

from wakustore.durable import replace_durably


def test_a_file_written_whole_replaces_the_old_one(tmp_path):
    path = tmp_path / "record.json"
    replace_durably(path, b"old")
    replace_durably(path, [b"new ", memoryview(b"bytes")])
    assert path.read_bytes() == b"new bytes"
    assert [p.name for p in tmp_path.iterdir()] == ["record.json"]


def test_an_empty_directory_in_a_files_place_is_replaced_and_a_full_one_is_not(tmp_path):
    """A damaged data dir (a directory where the node's file belongs) does
    not stop the write; a directory holding anything is not the writer's to
    remove, and no temporary file is left."""
    empty = tmp_path / "enr.json"
    empty.mkdir()
    replace_durably(empty, b"{}")
    assert empty.read_bytes() == b"{}"
    full = tmp_path / "node-info.json"
    full.mkdir()
    (full / "kept").write_text("an operator's")
    with pytest.raises(OSError):
        replace_durably(full, b"{}")
    assert (full / "kept").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["enr.json", "node-info.json"]
