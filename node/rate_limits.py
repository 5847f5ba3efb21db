"""Per-peer request limits in nwaku's ``--rate-limit`` format, parsed
apart from the protocol handlers so that the configuration can check them
without loading libp2p."""

from __future__ import annotations

import collections
import contextvars
import ipaddress
import re
import time
from collections.abc import Callable
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
# lightpush limits to the whole service with a per-peer share; ours apply
# per peer id and per IP address (PeerAndAddressBuckets). Lightpush
# follows nwaku. An unlimited store lets one peer keep the engine busy, so ours is 30 queries/s sustained with bursts of 60 per
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
                raise ValueError(f"rate limit {text!r}: expected [store|lightpush:]volume/period<h|m|s|ms>")
            protocol, volume, period, unit = match.groups()
            limit = RateLimit(int(volume), int(period) * _UNIT_SECONDS[unit])
            for name in (protocol,) if protocol else ("store", "lightpush"):
                values[name] = limit
        return cls(**values)


# The IP address of the connection the request being handled came on, set
# by the stream guard (wakustore.node.limits) for its handler; None when
# unknown (a test calling a handler directly, an outbound connection).
REMOTE_ADDRESS: contextvars.ContextVar[str | None] = contextvars.ContextVar("REMOTE_ADDRESS", default=None)

# Buckets kept per kind of key (peer ids, addresses); the least recently
# seen one is forgotten first and comes back full. About 200 bytes each:
# a client rotating keys or addresses costs at most ~2 MB per limit.
MAX_TRACKED_KEYS = 10_000

# IPv6 addresses are handed out by /64 (RFC 6177: one end site gets at
# least a /64), so a host can pick a fresh address from its /64 for every
# request: the per-address bucket is kept per /64.
IPV6_PREFIX = 64


def address_key(address: str) -> str:
    """The rate-limit key of an IP address: itself for IPv4 (and IPv4 in
    IPv6), its /64 for IPv6."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, IPV6_PREFIX), strict=False))
    return str(ip)


class _Buckets:
    """Token buckets by key for one :class:`RateLimit`, bounded LRU."""

    def __init__(self, limit: RateLimit, max_keys: int):
        self.limit = limit
        self.max_keys = max_keys
        self.buckets: collections.OrderedDict[str, tuple[float, float]] = collections.OrderedDict()

    def tokens(self, key: str, now: float) -> float:
        capacity = float(self.limit.volume)
        tokens, last = self.buckets.get(key, (capacity, now))
        return min(capacity, tokens + (now - last) * capacity / self.limit.period_s)

    def store(self, key: str, tokens: float, now: float) -> None:
        self.buckets.pop(key, None)
        self.buckets[key] = (tokens, now)
        if len(self.buckets) > self.max_keys:
            self.buckets.popitem(last=False)


class PeerAndAddressBuckets:
    """One :class:`RateLimit` applied per peer id and per IP address.

    A request needs a token in its peer's bucket and, when the address it
    came from is known (:data:`REMOTE_ADDRESS`), in its address's bucket;
    it takes one from each, or none when either is empty. A client rotating
    keys on one address drains its address's bucket as a client keeping its
    key drains its peer's. Not thread-safe: trio handlers call it from one
    thread. ``clock`` is in seconds (monotonic).
    """

    def __init__(self, limit: RateLimit, clock: Callable[[], float] = time.monotonic, max_keys: int = MAX_TRACKED_KEYS):
        self.limit = limit
        self._clock = clock
        self.peers = _Buckets(limit, max_keys)
        self.addresses = _Buckets(limit, max_keys)

    def allow(self, peer: str, address: str | None = None) -> bool:
        """Take one token for ``peer`` (and ``address``, by default the
        current request's); False when a bucket is empty."""
        if self.limit.unlimited:
            return True
        if address is None:
            address = REMOTE_ADDRESS.get()
        now = self._clock()
        peer_tokens = self.peers.tokens(peer, now)
        key = address_key(address) if address is not None else None
        address_tokens = self.addresses.tokens(key, now) if key is not None else float("inf")
        allowed = peer_tokens >= 1.0 and address_tokens >= 1.0
        if allowed:
            peer_tokens -= 1.0
            address_tokens -= 1.0
        self.peers.store(peer, peer_tokens, now)
        if key is not None:
            self.addresses.store(key, address_tokens, now)
        return allowed

    def __len__(self) -> int:
        return len(self.peers.buckets) + len(self.addresses.buckets)
