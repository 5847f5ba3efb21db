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

DEFAULT_CAPACITY = 20_000_000
DEFAULT_FPP = 0.01

# Per-day filters (DayKeyFilter): a busy day of a shard set is a few hundred
# thousand messages; at 500k keys and 1e-4 a day costs 2 MB (rounded up to a
# power of two), 30 days 60 MB. A day past its capacity only raises its
# rate (1M keys: ~0.1%). A fresh key is checked against every day, so the
# per-day rate is a hundred times lower than the single filter's 1%:
# ~30 days x 1e-4 = 0.3% of fresh keys cost a lookup.
DEFAULT_DAY_CAPACITY = 500_000
DEFAULT_DAY_FPP = 1e-4


class KeyFilter:
    def __init__(self, capacity: int = DEFAULT_CAPACITY, fpp: float = DEFAULT_FPP):
        bits = max(64, int(-capacity * math.log(fpp) / (math.log(2) ** 2)))
        self.bits = 1 << (bits - 1).bit_length()  # a power of two: masks instead of modulo
        self.probes = max(1, round(self.bits / capacity * math.log(2)))
        self._array = np.zeros(self.bits // 8, dtype=np.uint8)
        self._lock = threading.Lock()
        self.count = 0

    def _positions(self, keys: list[bytes]) -> np.ndarray:
        raw = np.frombuffer(b"".join(k[:16].ljust(16, b"\0") for k in keys), dtype="<u8").reshape(-1, 2)
        h1, h2 = raw[:, 0], raw[:, 1] | np.uint64(1)
        steps = np.arange(self.probes, dtype=np.uint64)
        with np.errstate(over="ignore"):
            return (h1[:, None] + steps[None, :] * h2[:, None]) & np.uint64(self.bits - 1)

    def add(self, keys: Iterable[bytes]) -> None:
        keys = list(keys)
        if not keys:
            return
        positions = self._positions(keys).ravel()
        with self._lock:
            np.bitwise_or.at(self._array, (positions >> np.uint64(3)).astype(np.int64),
                             (np.uint8(1) << (positions & np.uint64(7)).astype(np.uint8)))
            self.count += len(keys)

    def might_contain(self, keys: list[bytes]) -> np.ndarray:
        """One boolean per key: False means certainly never added."""
        if not keys:
            return np.zeros(0, dtype=bool)
        positions = self._positions(keys)
        with self._lock:
            bytes_ = self._array[(positions >> np.uint64(3)).astype(np.int64)]
        bits = (bytes_ >> (positions & np.uint64(7)).astype(np.uint8)) & 1
        return bits.all(axis=1)


class DayKeyFilter:
    """One :class:`KeyFilter` per UTC day partition.

    It answers the question a node that owns its table needs before it
    accepts a message as new: on which days could a row with this key
    already be? The MUID leaves the timestamp out, so the same message sent
    again later lands on another day than its first copy; a lookup scoped
    to the days named here is exact, and costs one day, not the table.
    Thread-safe.
    """

    def __init__(self, capacity_per_day: int = DEFAULT_DAY_CAPACITY, fpp: float = DEFAULT_DAY_FPP):
        self.capacity_per_day = capacity_per_day
        self.fpp = fpp
        self._days: dict[dt.date, KeyFilter] = {}
        self._lock = threading.Lock()

    @property
    def count(self) -> int:
        return sum(f.count for f in list(self._days.values()))

    @property
    def nbytes(self) -> int:
        return sum(f.bits // 8 for f in list(self._days.values()))

    def add(self, keys: Sequence[bytes], days: Sequence[dt.date]) -> None:
        """Record that each key has a row on the day beside it."""
        by_day: dict[dt.date, list[bytes]] = {}
        for key, day in zip(keys, days):
            by_day.setdefault(day, []).append(key)
        for day, group in by_day.items():
            with self._lock:
                day_filter = self._days.get(day)
                if day_filter is None:
                    day_filter = self._days[day] = KeyFilter(self.capacity_per_day, self.fpp)
            day_filter.add(group)

    def candidate_days(self, keys: Sequence[bytes]) -> list[set[dt.date]]:
        """For each key, the days whose filter might hold it (empty: new for certain)."""
        out: list[set[dt.date]] = [set() for _ in keys]
        if not keys:
            return out
        keys = list(keys)
        with self._lock:
            days = list(self._days.items())
        for day, day_filter in days:
            for index in np.flatnonzero(day_filter.might_contain(keys)):
                out[index].add(day)
        return out

    def drop_days_before(self, day: dt.date) -> None:
        """Forget days that retention removed whole (their bits only cost lookups)."""
        with self._lock:
            for old in [d for d in self._days if d < day]:
                del self._days[old]

    def clear(self) -> None:
        with self._lock:
            self._days.clear()
