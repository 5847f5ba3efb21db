"""The power-cut file system itself (crashfs.py): what survives a cut is
what was fsynced, file bytes and directory entries apart, as POSIX
promises and no more; and the project's own durable writes survive it."""

from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from powercut import CrashMount  # noqa: E402

from wakustore.durable import fsync_dir, make_dirs, replace_durably  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture
def mount(tmp_path):
    crash = CrashMount(tmp_path)
    crash.start()
    try:
        yield crash
    finally:
        crash.close()


def _write(path: Path, data: bytes, sync: bool) -> None:
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, data)
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


def test_only_fsynced_bytes_and_names_survive_a_strict_cut(mount):
    root = mount.path
    _write(root / "kept", b"synced", sync=True)
    _write(root / "kept", b" lost", sync=False)
    fsync_dir(root)
    _write(root / "nameless", b"synced bytes, unsynced name", sync=True)
    (root / "never").write_bytes(b"neither")
    mount.cut(1, strict=True)
    assert sorted(os.listdir(root)) == ["kept"]
    assert (root / "kept").read_bytes() == b"synced"


def test_a_synced_name_without_synced_bytes_survives_empty(mount):
    (mount.path / "empty").write_bytes(b"never fsynced")
    fsync_dir(mount.path)
    mount.cut(2, strict=True)
    assert (mount.path / "empty").read_bytes() == b""


def test_a_rename_needs_its_directory_synced(mount):
    root = mount.path
    replace_durably(root / "state", b"old")
    (root / "state.tmp").write_bytes(b"new")
    os.fsync(os.open(root / "state.tmp", os.O_RDONLY))
    os.replace(root / "state.tmp", root / "state")
    assert (root / "state").read_bytes() == b"new"
    mount.cut(3, strict=True)
    assert (root / "state").read_bytes() == b"old"
    assert not (root / "state.tmp").exists()
    replace_durably(root / "state", b"new")
    mount.cut(4, strict=True)
    assert (root / "state").read_bytes() == b"new"


def test_new_directories_survive_only_when_made_durably(mount):
    os.makedirs(mount.path / "plain" / "deep")
    replace_durably(mount.path / "plain" / "deep" / "file", b"x")
    make_dirs(mount.path / "durable" / "deep")
    replace_durably(mount.path / "durable" / "deep" / "file", b"y")
    mount.cut(5, strict=True)
    # make_dirs synced the root (so "plain" is there too), never "plain" itself.
    assert os.listdir(mount.path / "plain") == []
    assert (mount.path / "durable" / "deep" / "file").read_bytes() == b"y"


def test_a_random_cut_keeps_a_prefix_of_what_was_written(mount):
    """Unsynced writes survive in order, the last one perhaps torn: a file
    is always a prefix of its writes, never other bytes."""
    written = b"".join(b"record %03d;" % i for i in range(40))
    kept_some = False
    for seed in range(12):
        path = mount.path / f"log{seed}"
        _write(path, written[:11], sync=True)
        fsync_dir(mount.path)
        for i in range(1, 40):
            _write(path, written[11 * i : 11 * (i + 1)], sync=False)
        mount.cut(100 + seed)
        data = path.read_bytes()
        assert written.startswith(data) and len(data) >= 11
        kept_some |= 11 < len(data) < len(written)
    assert kept_some


def test_rename_noreplace_refuses_an_existing_name(mount):
    """How a Delta commit claims its version on a local disk."""
    libc = ctypes.CDLL(None, use_errno=True)
    at_fdcwd, noreplace = -100, 1
    (mount.path / "a").write_bytes(b"a")
    (mount.path / "b").write_bytes(b"b")
    result = libc.renameat2(at_fdcwd, bytes(mount.path / "a"), at_fdcwd, bytes(mount.path / "b"), noreplace)
    assert result == -1 and ctypes.get_errno() == 17  # EEXIST
    assert (mount.path / "b").read_bytes() == b"b"
    assert libc.renameat2(at_fdcwd, bytes(mount.path / "a"), at_fdcwd, bytes(mount.path / "c"), noreplace) == 0
    assert (mount.path / "c").read_bytes() == b"a"


def test_hard_links_and_truncation(mount):
    root = mount.path
    _write(root / "f", b"0123456789", sync=True)
    os.link(root / "f", root / "g")
    fsync_dir(root)
    os.truncate(root / "g", 4)
    assert (root / "f").read_bytes() == b"0123"
    os.fsync(os.open(root / "f", os.O_RDONLY))
    mount.cut(6, strict=True)
    assert (root / "f").read_bytes() == (root / "g").read_bytes() == b"0123"
    assert os.stat(root / "f").st_nlink == 2


def test_a_tree_another_process_made_is_durable_once_its_ancestors_are_synced(mount):
    """What CommitSync does for the table's directories, which the engine
    makes (``tables/messages/_delta_log`` at once)."""
    from wakustore.durable import fsync_ancestors

    deep = mount.path / "data" / "tables" / "messages"
    os.makedirs(deep)
    replace_durably(deep / "entry", b"e")
    fsync_ancestors(deep / "entry")
    mount.cut(7, strict=True)
    assert (deep / "entry").read_bytes() == b"e"
