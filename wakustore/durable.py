"""Files written whole and made durable before anything relies on them.

A file is written under a temporary name beside its place, fsynced,
renamed over its place, and its directory fsynced: after a crash or a
power cut the path holds either the old file or the whole new one, and
once this returns the new one survives both.
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Iterable
from pathlib import Path


def replace_durably(path: str | os.PathLike, chunks: bytes | Iterable[bytes | memoryview]) -> None:
    """Write ``chunks`` (bytes, or buffers back to back) as the file at
    ``path``, durably (see the module); an empty directory at ``path`` is
    replaced. The temporary file is removed when the write fails."""
    path = Path(path)
    if isinstance(chunks, (bytes, bytearray, memoryview)):
        chunks = (chunks,)
    temporary = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with open(temporary, "wb") as out:
            for chunk in chunks:
                out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
        try:
            os.replace(temporary, path)
        except IsADirectoryError:
            # An empty directory where the file belongs (a data dir someone
            # damaged): the file takes its place. One that holds anything
            # is not this writer's to remove (rmdir refuses it).
            os.rmdir(path)
            os.replace(temporary, path)
    except BaseException:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise
    fsync_dir(path.parent)


def make_dirs(path: str | os.PathLike) -> Path:
    """``mkdir -p``, durably: each directory created, and ``path`` itself,
    is fsynced into its parent (a new directory whose parent was never
    synced vanishes at a power cut with everything written beneath it)."""
    path = Path(path)
    missing = []
    cursor = path
    while not cursor.is_dir():
        missing.append(cursor)
        if cursor.parent == cursor:
            break
        cursor = cursor.parent
    for directory in reversed(missing):
        try:
            directory.mkdir()
        except FileExistsError:
            pass
        _fsync_parent(directory)
    if not missing:
        _fsync_parent(path)
    return path


def fsync_ancestors(path: str | os.PathLike) -> None:
    """fsync every directory above ``path``, up to the root: a tree another
    process made (the engine makes a table's directories) is then durable
    however deep it was created. Those this process may not open are left
    to the file system."""
    for directory in Path(path).absolute().parents:
        _fsync_dir_if_allowed(directory)


def _fsync_parent(path: Path) -> None:
    _fsync_dir_if_allowed(path.parent)


def _fsync_dir_if_allowed(directory: Path) -> None:
    """fsync ``directory``; one this process may not open for reading (an
    operator's /srv, say), or a file system without directory fsync, is
    left as it is: the directory is there, only its durability is the file
    system's."""
    try:
        fsync_dir(directory)
    except OSError as exc:
        if exc.errno not in (errno.EACCES, errno.EPERM, errno.EINVAL):
            raise


def fsync_dir(directory: str | os.PathLike) -> None:
    """Make the entries of ``directory`` (a rename, a new or removed file) durable."""
    fsync_file(directory)


def fsync_file(path: str | os.PathLike) -> None:
    """Make a file's bytes (a directory's entries) durable: a file written
    by another process, or closed before it was synced."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
