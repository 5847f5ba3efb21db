"""34/WAKU2-PEER-EXCHANGE, the service side (nwaku's ``--peer-exchange``):
light clients (js-waku's ``wakuPeerExchangeDiscovery``) ask the node for
records of relay nodes and dial them.

The node answers from :class:`PeerRecords`: the records discovery found
(DNS trees today) of relay nodes of its cluster that share one of its
shards, at most :data:`~wakustore.protocols.peer_exchange.MAX_PEERS`, the
newest kept. An answer holds at most what was asked, in random order, never
the asker's own record. Each peer and each address may ask
:data:`PEER_EXCHANGE_RATE` times (429 beyond, as nwaku answers).
"""

from __future__ import annotations

import logging
import random
from collections import OrderedDict
from typing import Any

from wakustore.node.rate_limits import PeerAndAddressBuckets, RateLimit
from wakustore.protocols import peer_exchange
from wakustore.protocols.enr import Enr
from wakustore.protocols.errors import FramingError, PeerExchangeError
from wakustore.protocols.framing import PEER_EXCHANGE_MAX_REQUEST_SIZE
from wakustore.protocols.peer_exchange import PeerExchangeStatus
from wakustore.transport.streams import ReadTimeout, close_stream, peer_of, read_frame, reset_stream, write_frame

log = logging.getLogger(__name__)

PROTOCOL_ID = peer_exchange.PROTOCOL_ID
# js-waku asks on every identify and then every 30 s per connection; ten a
# minute per peer and per address leaves it room and stops a flood.
PEER_EXCHANGE_RATE = RateLimit(10, 60.0)
# A request is one small frame: its first byte within this, the whole within
# READ_TIMEOUT_S; the answer written within WRITE_TIMEOUT_S.
IDLE_TIMEOUT_S = 30.0
READ_TIMEOUT_S = 10.0
WRITE_TIMEOUT_S = 30.0


class PeerRecords:
    """The records the node may hand out, by peer id, newest last, bounded."""

    def __init__(self, capacity: int = peer_exchange.MAX_PEERS):
        self.capacity = capacity
        self._records: OrderedDict[str, Enr] = OrderedDict()

    def __len__(self) -> int:
        return len(self._records)

    def add(self, record: Enr) -> None:
        """Keep ``record``, replacing an older one of its peer; the oldest
        leaves when the cache is full."""
        known = self._records.get(record.peer_id)
        if known is not None and known.seq > record.seq:
            return
        self._records[record.peer_id] = record
        self._records.move_to_end(record.peer_id)
        while len(self._records) > self.capacity:
            self._records.popitem(last=False)

    def sample(self, count: int, excluding: str | None = None) -> list[Enr]:
        """Up to ``count`` records in random order, not ``excluding``'s."""
        records = [r for peer, r in self._records.items() if peer != excluding]
        return random.sample(records, min(count, len(records)))


class PeerExchangeService:
    """The stream handler of :data:`PROTOCOL_ID` over ``records``."""

    def __init__(self, records: PeerRecords, rate: RateLimit = PEER_EXCHANGE_RATE):
        self.records = records
        self.buckets = PeerAndAddressBuckets(rate)
        self.answered = 0
        self.refused = 0

    def handlers(self) -> dict[str, Any]:
        return {PROTOCOL_ID: self.handle}

    async def handle(self, stream: Any) -> None:
        peer = peer_of(stream)
        try:
            raw = await read_frame(
                stream, PEER_EXCHANGE_MAX_REQUEST_SIZE, idle_timeout_s=IDLE_TIMEOUT_S, frame_timeout_s=READ_TIMEOUT_S
            )
        except (ReadTimeout, FramingError) as exc:
            log.debug("peer exchange from %s: %s", peer, exc)
            await reset_stream(stream)
            return
        except Exception as exc:  # the stream broke
            log.debug("peer exchange from %s: %r", peer, exc)
            await reset_stream(stream)
            return
        if raw is None:
            await close_stream(stream)
            return
        answer = self.answer(peer, raw)
        try:
            await write_frame(stream, answer, WRITE_TIMEOUT_S)
        except Exception as exc:  # too slow, or the stream broke
            log.debug("peer exchange to %s: %r", peer, exc)
            await reset_stream(stream)
            return
        await close_stream(stream)

    def answer(self, peer: str, raw: bytes) -> bytes:
        """The response to request ``raw`` from ``peer``."""
        if not self.buckets.allow(peer):
            self.refused += 1
            return peer_exchange.encode_response([], PeerExchangeStatus.TOO_MANY_REQUESTS, "too many requests")
        try:
            wanted = peer_exchange.decode_request(raw)
        except PeerExchangeError as exc:
            self.refused += 1
            return peer_exchange.encode_response([], PeerExchangeStatus.BAD_REQUEST, str(exc)[:200])
        records = self.records.sample(wanted, excluding=peer)
        if not records:
            return peer_exchange.encode_response([], PeerExchangeStatus.SERVICE_UNAVAILABLE, "no peers known yet")
        self.answered += 1
        return peer_exchange.encode_response([r.raw for r in records])
