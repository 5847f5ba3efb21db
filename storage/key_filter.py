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

import math
import threading
from collections.abc import Iterable

import numpy as np

DEFAULT_CAPACITY = 20_000_000
DEFAULT_FPP = 0.01


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
