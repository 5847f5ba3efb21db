"""The process's C heap (glibc malloc): what the node and its archive
workers tune. Everything here does nothing where the C library is not
glibc."""

from __future__ import annotations

import ctypes
import os

# glibc mallopt parameters.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -3, -8


def _load_libc():
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.malloc_trim  # noqa: B018  (glibc only)
        return libc
    except (OSError, AttributeError):
        return None


_libc = _load_libc()


def trim_heap() -> None:
    """Give the freed heap back to the system: an archive's messages are
    tens of thousands of kilobyte-sized objects, which glibc otherwise
    keeps mapped."""
    if _libc is not None:
        _libc.malloc_trim(0)


def keep_freed_heap(mmap_threshold: int, keep: int) -> bool:
    """Blocks up to ``mmap_threshold`` bytes from the heap rather than
    their own mappings, and up to ``keep`` bytes of freed heap kept in the
    process; True when both are set."""
    return _libc is not None and bool(
        _libc.mallopt(_M_MMAP_THRESHOLD, mmap_threshold) and _libc.mallopt(_M_TRIM_THRESHOLD, keep)
    )


def cap_malloc_arenas(arenas: int) -> bool:
    """Let the threads that allocate from now on share at most ``arenas``
    glibc malloc arenas (the environment's MALLOC_ARENA_MAX wins); True
    when set. glibc gives a thread's first allocation an arena of its own,
    up to 8 a core, and memory freed in one arena serves only its own
    threads. A node on a shared table: bench store at 10M messages took
    its peak from 1,601 to 1,333 MB with 2 (BENCHMARKS.md)."""
    if _libc is None or "MALLOC_ARENA_MAX" in os.environ:
        return False
    return bool(_libc.mallopt(_M_ARENA_MAX, arenas))
