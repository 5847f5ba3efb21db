"""Per-peer request limits in nwaku's ``--rate-limit`` format, parsed
apart from the protocol handlers so that the configuration can check them
without loading libp2p."""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RateLimit:
    """``volume`` requests per ``period_s`` seconds per peer, as a token bucket
    of capacity ``volume`` refilled at ``volume / period_s`` per second
    (nwaku's TokenBucket semantics for ``--rate-limit``). Volume 0 means
    unlimited."""

    volume: int
    period_s: float

    @property
    def unlimited(self) -> bool:
        return self.volume <= 0 or self.period_s <= 0

    def __str__(self) -> str:
        return "no-limit" if self.unlimited else f"{self.volume}/{self.period_s:g}s"


# nwaku's `--rate-limit` defaults: none at all in 2024 releases
# (DefaultGlobalNonRelayRateLimit = 0, waku/common/rate_limit/setting.nim);
# current ones (logos-delivery external_config.nim) keep store unlimited and
# set lightpush 5/1s, filter 100/1s, px 5/1s. nwaku applies store and
# lightpush limits to the whole service with a per-peer share; ours are per
# peer only. Lightpush follows nwaku. An unlimited store lets one peer keep
# the engine busy, so ours is 30 queries/s sustained with bursts of 60 per
# peer: js-waku pages one request at a time (a round trip plus a 20-30 ms
# engine page), so one honest client stays near 20-30 pages/s and is never
# refused, while one peer cannot hold the engine's worker threads for long.
DEFAULT_STORE_RATE = RateLimit(volume=60, period_s=2.0)
DEFAULT_LIGHTPUSH_RATE = RateLimit(volume=5, period_s=1.0)

_RATE_PATTERN = re.compile(r"(?:(store|lightpush):)?(\d+)/(\d+)(h|m|s|ms)")
_UNIT_SECONDS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}


@dataclass(frozen=True, slots=True)
class RateLimits:
    """Per-peer limits: Store v3 and legacy share ``store``; lightpush v3
    and v2beta1 share ``lightpush``."""

    store: RateLimit = DEFAULT_STORE_RATE
    lightpush: RateLimit = DEFAULT_LIGHTPUSH_RATE

    @classmethod
    def parse(cls, settings: list[str] | tuple[str, ...]) -> RateLimits:
        """Settings in nwaku's ``--rate-limit`` format, ``[protocol:]volume/period<unit>``,
        protocol ``store`` or ``lightpush`` (none: both), unit h, m, s or ms.
        Later settings win. Raises ValueError on anything else."""
        values = {"store": DEFAULT_STORE_RATE, "lightpush": DEFAULT_LIGHTPUSH_RATE}
        for text in settings:
            match = _RATE_PATTERN.fullmatch(text.strip())
            if match is None:
                raise ValueError(
                    f"rate limit {text!r}: expected [store|lightpush:]volume/period<h|m|s|ms>"
                )
            protocol, volume, period, unit = match.groups()
            limit = RateLimit(int(volume), int(period) * _UNIT_SECONDS[unit])
            for name in (protocol,) if protocol else ("store", "lightpush"):
                values[name] = limit
        return cls(**values)
