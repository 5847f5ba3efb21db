"""The data dir's free space against a floor (``min_free_bytes``).

Below the floor the node stops taking messages in, before the file system
is full: the write-ahead log, commits, compaction and the key index files
would otherwise fight over the last megabytes. Puts are refused with a
reason that names the disk (lightpush: 503), relayed messages are still
relayed but not stored (counted as ``disk_full``), reads, sync and
archives keep serving, ``/health`` says why, and a ``size:`` retention run
starts at once when one is configured. Space coming back is seen at the
next look: the node takes messages again by itself.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

# How often the free space is looked at (a statvfs: microseconds).
CHECK_S = 1.0
_MB = 1024 * 1024


class DiskFull(Exception):
    """A put refused because the data dir is under its free-space floor."""


class DiskGuard:
    def __init__(
        self,
        path: Path,
        min_free_bytes: int,
        clock: Callable[[], float] = time.monotonic,
        statvfs: Callable[[Path], os.statvfs_result] = os.statvfs,
    ):
        self.path = path
        self.min_free_bytes = min_free_bytes
        self.clock = clock
        self.statvfs = statvfs
        self._checked = float("-inf")
        self._free: int | None = None

    def free_bytes(self) -> int | None:
        """Bytes an unprivileged writer may still use (None: not known)."""
        now = self.clock()
        if now - self._checked >= CHECK_S:
            self._checked = now
            try:
                stat = self.statvfs(self.path)
                self._free = stat.f_bavail * stat.f_frsize
            except OSError:
                self._free = None
        return self._free

    def full(self) -> bool:
        free = self.free_bytes()
        return free is not None and self.min_free_bytes > 0 and free < self.min_free_bytes

    def reason(self) -> str:
        free = self._free or 0
        return (
            f"the disk is full: {free / _MB:.0f} MiB free in {self.path}, "
            f"under min_free_bytes ({self.min_free_bytes / _MB:.0f} MiB)"
        )

    def check(self) -> None:
        """Raise :class:`DiskFull` when under the floor."""
        if self.full():
            raise DiskFull(self.reason())

    def report(self) -> dict:
        return {"free_bytes": self.free_bytes(), "min_free_bytes": self.min_free_bytes, "full": self.full()}
