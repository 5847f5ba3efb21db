"""Waku v1 envelopes for the mailserver, kept byte for byte.

Keyed by envelope hash (keccak256 of the RLP as received), partitioned by
the UTC day of the send time (expiry - ttl), ordered like status-go's
mailserver database: by send time, then envelope hash. The same write path
as the messages table (write-ahead log, MERGE scoped to days).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from wakustore.protocols.waku_v1 import Envelope, bloom_matches, envelope_hash, topic_to_bloom
from wakustore.storage import schema
from wakustore.storage.table import DeltaTableRef
from wakustore.storage.write_path import RowCodec, WritePath

# status-go mailserver: at most 1000 envelopes per request.
MAX_QUERY_LIMIT = 1000

# Envelopes arrive far less often than v2 messages; 100k recent hashes
# cover the seconds-to-minutes window in which peers re-send.
RECENT_HASHES = 100_000


@dataclass(frozen=True, slots=True)
class StoredEnvelope:
    envelope_hash: bytes
    raw: bytes
    topic: bytes
    expiry: int
    ttl: int
    sent: int  # expiry - ttl, seconds
    arrival_time: int  # ns

    @classmethod
    def from_raw(cls, raw: bytes, arrival_ns: int) -> StoredEnvelope:
        envelope = Envelope.decode(raw)
        return cls(
            envelope_hash(raw), raw, envelope.topic, envelope.expiry, envelope.ttl, envelope.timestamp, arrival_ns
        )


@dataclass(frozen=True, slots=True)
class EnvelopePage:
    """Raw envelopes in ascending (sent, hash) order; ``last`` is the key
    of the last one when the limit was reached (status-go returns a cursor
    then even if nothing is left)."""

    envelopes: list[StoredEnvelope]
    limit_reached: bool


_RECORD = struct.Struct(">q")


def _decode(record: bytes) -> StoredEnvelope:
    """A record of a log written one envelope per record (earlier versions)."""
    (arrival,) = _RECORD.unpack_from(record)
    return StoredEnvelope.from_raw(record[_RECORD.size :], arrival)


def _from_arrow(table: pa.Table) -> list[StoredEnvelope]:
    columns = [
        table.column(name).to_pylist()
        for name in ("envelope_hash", "raw", "topic", "expiry", "ttl", "sent", "arrival_time")
    ]
    return [StoredEnvelope(*values) for values in zip(*columns)]


def _to_arrow(rows: Sequence[StoredEnvelope]) -> pa.Table:
    return pa.Table.from_pydict(
        {
            "envelope_hash": [r.envelope_hash for r in rows],
            "raw": [r.raw for r in rows],
            "topic": [r.topic for r in rows],
            "expiry": [r.expiry for r in rows],
            "ttl": [r.ttl for r in rows],
            "sent": [r.sent for r in rows],
            "arrival_time": [r.arrival_time for r in rows],
            schema.ENVELOPES_PARTITION: [schema.day_of_seconds(r.sent) for r in rows],
        },
        schema=schema.ENVELOPES,
    )


ENVELOPE_CODEC = RowCodec(
    key=lambda row: row.envelope_hash,
    decode=_decode,
    to_arrow=_to_arrow,
    from_arrow=_from_arrow,
    key_column="envelope_hash",
    partition_column=schema.ENVELOPES_PARTITION,
    time_column="sent",
    time_unit_ns=1_000_000_000,
)


class EnvelopeStore:
    """The envelope table and its write path. Thread-safe."""

    def __init__(
        self, table: DeltaTableRef, wal_dir: Path | str, flush_interval_s: float = 1.0, flush_max_envelopes: int = 5000
    ):
        self.table = table
        self.writes = WritePath(table, wal_dir, ENVELOPE_CODEC, RECENT_HASHES, flush_interval_s, flush_max_envelopes)

    def open(self, owned: bool = True) -> int:
        """Create the table if needed and replay the log; ``owned``: this
        node alone writes the table (its torn log versions are put aside)."""
        if owned:
            self.table.repair_torn_log()
        self.table.ensure(schema.ENVELOPES, schema.ENVELOPES_PARTITION, "wakustore waku v1 envelopes")
        return self.writes.replay()

    def close(self) -> None:
        try:
            self.writes.flush()
        finally:
            self.writes.close()

    def put(self, envelopes: Sequence[StoredEnvelope]) -> tuple[int, int]:
        """Durably store envelopes not seen before; returns (accepted, duplicates)."""
        return self.writes.put(envelopes)

    def flush(self) -> int:
        return self.writes.flush()

    def query(
        self,
        lower_s: int,
        upper_s: int,
        topics: Sequence[bytes] = (),
        bloom: bytes | None = None,
        limit: int = MAX_QUERY_LIMIT,
        cursor: tuple[int, bytes] | None = None,
    ) -> EnvelopePage:
        """Envelopes with lower <= sent <= upper (both inclusive, as status-go),
        after ``cursor`` (exclusive), matching ``topics`` (which win) or else
        ``bloom``; at most ``limit`` (<= 1000)."""
        limit = max(1, min(limit, MAX_QUERY_LIMIT))
        if not topics and bloom is not None:
            topics = [t for t in self._topics_between(lower_s, upper_s) if bloom_matches(bloom, topic_to_bloom(t))]
            if not topics:
                return EnvelopePage(self._pending(lower_s, upper_s, (), bloom, cursor, limit), False)
        found = self.table.envelope_page(lower_s, upper_s, list(topics), cursor, limit + 1)
        rows = [
            StoredEnvelope(
                r["envelope_hash"], r["raw"], r["topic"], r["expiry"], r["ttl"], r["sent"], r["arrival_time"]
            )
            for r in found.to_pylist()
        ]
        seen = {r.envelope_hash for r in rows}
        rows += [
            r for r in self._pending(lower_s, upper_s, topics, bloom, cursor, limit + 1) if r.envelope_hash not in seen
        ]
        rows.sort(key=lambda r: (r.sent, r.envelope_hash))
        return EnvelopePage(rows[:limit], len(rows) >= limit)

    def _topics_between(self, lower_s: int, upper_s: int) -> list[bytes]:
        table = self.table.envelope_topics(lower_s, upper_s)
        pending = {r.topic for r in self.writes.pending_rows() if lower_s <= r.sent <= upper_s}
        return sorted(set(table) | pending)

    def _pending(self, lower_s, upper_s, topics, bloom, cursor, limit) -> list[StoredEnvelope]:
        out = []
        for row in self.writes.pending_rows():
            if not lower_s <= row.sent <= upper_s:
                continue
            if topics and row.topic not in topics:
                continue
            if not topics and bloom is not None and not bloom_matches(bloom, topic_to_bloom(row.topic)):
                continue
            if cursor is not None and (row.sent, row.envelope_hash) <= cursor:
                continue
            out.append(row)
        out.sort(key=lambda r: (r.sent, r.envelope_hash))
        return out[:limit]
