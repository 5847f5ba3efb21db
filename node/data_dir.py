"""One writer per data directory.

A process that writes a data directory (``serve``, and the ``db`` and
``archive`` commands that change the table or the write-ahead log) holds an
exclusive ``flock`` on ``<data dir>/LOCK`` for as long as it runs, the way
LevelDB and RocksDB guard theirs. Two writers would each replay and trim
the same write-ahead log and keep their own view of what the table holds:
the same message pushed to both lands twice, and a bulk import stays
invisible to the other's hot tier until it restarts.

The kernel drops the lock when the process dies, however it dies, so a
``kill -9`` leaves nothing to clean up. The holder writes its pid into the
file, as PostgreSQL's ``postmaster.pid`` does, so a refused process can say
who holds it; the pid is only read after the lock was refused, so a pid left
by a process that has since died is never reported.

Read-only commands do not lock: they read the committed table and leave the
write-ahead log alone (see :func:`check_readable`).
"""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path

from wakustore.durable import make_dirs
from wakustore.usage import UsageError

LOCK_FILE = "LOCK"

# Longer than any pid the kernel hands out (pid_max is at most 2**22).
_MAX_PID_TEXT = 32


class DataDirError(UsageError):
    """The data directory cannot be used; one line on stderr, exit status 2."""


class DataDirInUse(DataDirError):
    """Another process holds the data directory's lock."""

    def __init__(self, data_dir: Path, holder_pid: int | None):
        who = f"process {holder_pid}" if holder_pid is not None else "another process"
        super().__init__(f"data dir {data_dir} is in use by {who} (another node or command writes it)")
        self.holder_pid = holder_pid


class DataDirLock:
    """The held lock on one data directory; :meth:`release` (or leaving the
    ``with`` block, or the process ending) gives it up."""

    def __init__(self, data_dir: Path, fd: int):
        self.data_dir = data_dir
        self._fd: int | None = fd

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            os.ftruncate(fd, 0)  # no pid of a process that no longer holds it
        except OSError:
            pass
        os.close(fd)  # closing the only descriptor drops the flock

    def __enter__(self) -> DataDirLock:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def lock(data_dir: Path) -> DataDirLock:
    """Create ``data_dir`` if needed and take its writer lock without waiting.

    Raises :class:`DataDirInUse` when another process (or another open of
    this one) holds it, :class:`DataDirError` when the path is not a usable
    directory.
    """
    data_dir = Path(data_dir)
    _make_dir(data_dir)
    try:
        # O_CLOEXEC: a child the node starts (the engine) must not inherit
        # the lock, or it would outlive a killed node.
        fd = os.open(data_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise _path_error(data_dir, exc) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        holder = _read_pid(fd)
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise DataDirInUse(data_dir, holder) from None
        raise _path_error(data_dir, exc) from None
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except OSError as exc:
        os.close(fd)
        raise _path_error(data_dir, exc) from None
    return DataDirLock(data_dir, fd)


def check_readable(data_dir: Path) -> None:
    """For read-only commands: ``data_dir`` must already be a directory
    (nothing is created, nothing locked). Raises :class:`DataDirError`."""
    data_dir = Path(data_dir)
    if not data_dir.exists():
        raise DataDirError(f"data dir {data_dir} does not exist")
    if not data_dir.is_dir():
        raise DataDirError(f"data dir {data_dir} is not a directory")
    if not os.access(data_dir, os.R_OK | os.X_OK):
        raise DataDirError(f"data dir {data_dir} is not readable")


def _make_dir(data_dir: Path) -> None:
    if data_dir.exists() and not data_dir.is_dir():
        raise DataDirError(f"data dir {data_dir} is not a directory")
    try:
        make_dirs(data_dir)
    except OSError as exc:
        raise _path_error(data_dir, exc) from None
    # The lock file may exist already; the log and the table need new files.
    if not os.access(data_dir, os.W_OK | os.X_OK):
        raise DataDirError(f"data dir {data_dir} is not writable")


def _path_error(data_dir: Path, exc: OSError) -> DataDirError:
    if isinstance(exc, FileExistsError):
        return DataDirError(f"data dir {data_dir} is not a directory")
    if isinstance(exc, NotADirectoryError):
        return DataDirError(f"data dir {data_dir} lies under a file, not a directory")
    if isinstance(exc, PermissionError) or exc.errno == errno.EROFS:
        return DataDirError(f"data dir {data_dir} is not writable ({exc.strerror})")
    return DataDirError(f"data dir {data_dir} is not usable ({exc.strerror or exc})")


def _read_pid(fd: int) -> int | None:
    """The pid the holder wrote, or None while it has not written it yet
    (it truncates, then writes, right after taking the lock)."""
    try:
        text = os.pread(fd, _MAX_PID_TEXT, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None
