"""A Bloom filter over table keys (MUIDs, envelope hashes) kept by the node.

It lets a node that owns its table append a batch instead of MERGE-ing it:
a key the filter has never seen is certainly not in the table, so only
the few keys it might have seen go through the MERGE. Keys are hashes
(sha256 or keccak), uniformly distributed, so their first 16 bytes give
the two 64-bit values of double hashing directly: no further hashing.

Sizing: m = -n ln p / (ln 2)^2 bits and k = (m / n) ln 2 probes; 20M keys
at 1% cost 24 MB. Past its capacity the false-positive rate rises, which
costs MERGE work, never correctness.
"""

from __future__ import annotations

import datetime as dt
import math
import threading
from collections.abc import Iterable, Sequence

import numpy as np
import pyarrow as pa

import wakustore._native as _native
from wakustore.storage.rows import leading_bytes

_EPOCH = dt.date(1970, 1, 1)

DEFAULT_CAPACITY = 20_000_000
DEFAULT_FPP = 0.01

# Per-day filters (DayKeyFilter): they only sort out the ~1% of new keys
# that the filter over all days cannot clear, so a day may run past its
# capacity (its rate rises from 1e-4, which costs a lookup now and then).
# 250k keys at 1e-4 is 1 MB a day (rounded up to a power of two), 30 days
# 30 MB, beside the 32 MB of the filter over all days.
DEFAULT_DAY_CAPACITY = 250_000
DEFAULT_DAY_FPP = 1e-4


class KeyFilter:
    def __init__(self, capacity: int = DEFAULT_CAPACITY, fpp: float = DEFAULT_FPP):
        bits = max(64, int(-capacity * math.log(fpp) / (math.log(2) ** 2)))
        self.bits = 1 << (bits - 1).bit_length()  # a power of two: masks instead of modulo
        # The rounding up leaves more bits per key than the rate needs; more
        # probes would lower the rate further but cost time on every check:
        # stop at the count the target rate asks for (-log2 fpp).
        self.probes = max(1, min(round(self.bits / capacity * math.log(2)), math.ceil(-math.log2(fpp))))
        self._array = np.zeros(self.bits // 8, dtype=np.uint8)
        self._lock = threading.Lock()
        self.count = 0

    def add(self, keys: Iterable[bytes]) -> None:
        keys = list(keys)
        if keys:
            self.add_words(_leading_words(keys))

    def add_words(self, words: np.ndarray) -> None:
        """Add keys given as their first 16 bytes, two little-endian 64-bit
        words a key (see :func:`leading_words`). Probe j of a key (h1, h2)
        is bit (h1 + j * (h2 | 1)) mod 2^64 of the array, masked to its
        size: set a key at a time by compiled code (numpy's fancy indexing
        over the probes took ~3 us a key at 1M keys; this ~0.1)."""
        if not len(words):
            return
        words = np.ascontiguousarray(words, dtype="<u8")
        with self._lock:
            _native.bloom_add(self._array, words, self.probes)
            self.count += len(words)

    def might_contain(self, keys: list[bytes]) -> np.ndarray:
        """One boolean per key: False means certainly never added."""
        if not keys:
            return np.zeros(0, dtype=bool)
        return self.might_contain_words(_leading_words(keys))

    def might_contain_words(self, words: np.ndarray) -> np.ndarray:
        """:meth:`might_contain` for keys given as :meth:`add_words` takes them."""
        words = np.ascontiguousarray(words, dtype="<u8")
        with self._lock:
            found = _native.bloom_test(self._array, words, self.probes)
        return np.frombuffer(found, dtype=bool)


class DayKeyFilter:
    """One :class:`KeyFilter` per UTC day partition.

    It answers the question a node that owns its table needs before it
    accepts a message as new: on which days could a row with this key
    already be? The MUID leaves the timestamp out, so the same message sent
    again later lands on another day than its first copy; a lookup scoped
    to the days named here is exact, and costs one day, not the table.
    Thread-safe.
    """

    def __init__(
        self,
        capacity_per_day: int = DEFAULT_DAY_CAPACITY,
        fpp: float = DEFAULT_DAY_FPP,
        capacity: int = DEFAULT_CAPACITY,
    ):
        self.capacity_per_day = capacity_per_day
        self.capacity = capacity
        self.fpp = fpp
        self._days: dict[dt.date, KeyFilter] = {}
        # One filter over every day answers "certainly new" for ~99% of new
        # keys with one probe set instead of one per day (measured: 5,000
        # keys against 30 day filters 59 ms, against this one ~2 ms).
        self._all = KeyFilter(capacity, DEFAULT_FPP)
        self._lock = threading.Lock()

    def add(self, keys: Sequence[bytes], days: Sequence[dt.date]) -> None:
        """Record that each key has a row on the day beside it."""
        by_day: dict[dt.date, list[bytes]] = {}
        for key, day in zip(keys, days):
            by_day.setdefault(day, []).append(key)
        self._all.add(keys)
        for day, group in by_day.items():
            self._day(day).add(group)

    def add_columns(self, keys: pa.Array | pa.ChunkedArray, days: pa.Array | pa.ChunkedArray) -> None:
        """:meth:`add` for Arrow columns (binary keys of at least 16 bytes,
        date32 days): a commit's keys with no object per key."""
        if not len(keys):
            return
        words = leading_words(keys)
        self._all.add_words(words)
        if isinstance(days, pa.ChunkedArray):
            # (pa.chunked_array([days]) of a ChunkedArray reads it a value at a time)
            days = days.combine_chunks()
        numbers = days.cast(pa.int32()).to_numpy(zero_copy_only=False)
        for number in np.unique(numbers).tolist():
            day_filter = self._day(_EPOCH + dt.timedelta(days=number))
            day_filter.add_words(words[numbers == number])

    def add_words_of_day(self, words: np.ndarray, day: dt.date) -> None:
        """Keys of one day, given as :meth:`KeyFilter.add_words` takes them."""
        self._all.add_words(words)
        self._day(day).add_words(words)

    def _day(self, day: dt.date) -> KeyFilter:
        with self._lock:
            day_filter = self._days.get(day)
            if day_filter is None:
                day_filter = self._days[day] = KeyFilter(self.capacity_per_day, self.fpp)
            return day_filter

    def candidate_days(self, keys: Sequence[bytes]) -> list[set[dt.date]]:
        """For each key, the days whose filter might hold it (empty: new for certain)."""
        out: list[set[dt.date]] = [set() for _ in keys]
        for index, days in self.candidates(keys).items():
            out[index] = days
        return out

    def candidates(self, keys: Sequence[bytes]) -> dict[int, set[dt.date]]:
        """:meth:`candidate_days` of the keys that may be in the table only,
        by their index in ``keys`` (a batch of new keys costs no set each)."""
        out: dict[int, set[dt.date]] = {}
        if not keys:
            return out
        indexes = np.flatnonzero(self._all.might_contain(list(keys)))
        with self._lock:
            days = list(self._days.items())
        if not days or not len(indexes):
            return out
        words = _leading_words([keys[int(i)] for i in indexes])
        for day, day_filter in days:
            for index in np.flatnonzero(day_filter.might_contain_words(words)).tolist():
                out.setdefault(int(indexes[index]), set()).add(day)
        return out

    def drop_days_before(self, day: dt.date) -> None:
        """Forget days that retention removed whole (their bits only cost lookups)."""
        with self._lock:
            for old in [d for d in self._days if d < day]:
                del self._days[old]

    def clear(self) -> None:
        with self._lock:
            self._days.clear()
            self._all = KeyFilter(self.capacity, DEFAULT_FPP)


def _leading_words(keys: list[bytes]) -> np.ndarray:
    """The first 16 bytes of each key (zero-padded) as two 64-bit words."""
    joined = b"".join([k[:16] for k in keys])
    if len(joined) != 16 * len(keys):  # a key shorter than 16 bytes
        joined = b"".join([k[:16].ljust(16, b"\0") for k in keys])
    return np.frombuffer(joined, dtype="<u8").reshape(-1, 2)


def leading_words(keys: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """:func:`_leading_words` of a binary column of keys of at least 16 bytes."""
    return np.ascontiguousarray(leading_bytes(keys, 16)).view("<u8").reshape(-1, 2)
