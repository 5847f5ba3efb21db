"""Schemas of the tables of record and their versioning.

messages: one row per Waku message, keyed by MUID, partitioned by the UTC
day of its ordering timestamp. envelopes: one row per Waku v1 envelope,
kept byte for byte for the mailserver, partitioned by the UTC day of its
send time (expiry - ttl).

The schema version lives in the table property ``wakustore.schema.version``;
:data:`MIGRATIONS` lists the statements that move a table from one version
to the next (none yet: version 1 is the first).
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Sequence

import pyarrow as pa

SCHEMA_VERSION = 1
SCHEMA_VERSION_PROPERTY = "wakustore.schema.version"

MESSAGES_PARTITION = "day"
ENVELOPES_PARTITION = "day"

MESSAGES = pa.schema(
    [
        # waku-message-uid-adr MUID: the deduplication key.
        pa.field("muid", pa.binary(), nullable=False),
        # 14/WAKU2-MESSAGE deterministic hash: the Store v3 key and cursor.
        pa.field("message_hash", pa.binary(), nullable=False),
        # Legacy Store v2 index digest: sha256(content_topic || payload).
        pa.field("digest", pa.binary(), nullable=False),
        pa.field("pubsub_topic", pa.string(), nullable=False),
        pa.field("content_topic", pa.string(), nullable=False),
        pa.field("payload", pa.binary(), nullable=False),
        pa.field("meta", pa.binary(), nullable=False),
        pa.field("version", pa.int32(), nullable=False),
        # Ordering and filtering time (ns): the sender's timestamp, or the
        # arrival time when the sender set none (as nwaku stores it).
        pa.field("timestamp", pa.int64(), nullable=False),
        # The message's own timestamp field (0 when unset), so the message
        # comes back exactly as it hashed.
        pa.field("sender_timestamp", pa.int64(), nullable=False),
        pa.field("rate_limit_proof", pa.binary(), nullable=False),
        pa.field("arrival_time", pa.int64(), nullable=False),
        pa.field(MESSAGES_PARTITION, pa.date32(), nullable=False),
    ]
)

ENVELOPES = pa.schema(
    [
        pa.field("envelope_hash", pa.binary(), nullable=False),
        # The envelope's RLP as received: the mailserver returns these bytes.
        pa.field("raw", pa.binary(), nullable=False),
        pa.field("topic", pa.binary(), nullable=False),
        pa.field("expiry", pa.int64(), nullable=False),
        pa.field("ttl", pa.int64(), nullable=False),
        # expiry - ttl, seconds: the mailserver's time filter and cursor key.
        pa.field("sent", pa.int64(), nullable=False),
        pa.field("arrival_time", pa.int64(), nullable=False),
        pa.field(ENVELOPES_PARTITION, pa.date32(), nullable=False),
    ]
)

# version -> statements (with {table} for the table reference) upgrading
# a table at that version to version + 1.
MIGRATIONS: dict[int, list[str]] = {}

# Columns a page returns: with data, everything but muid, day and arrival
# time; without, the keys; a lookup by hash without data (presence checks,
# answered from the key index alone) no digest: it orders by hash, and
# only the legacy Store's cursors, which have no lookups by hash, use one.
DATA_COLUMNS = (
    "message_hash",
    "digest",
    "pubsub_topic",
    "content_topic",
    "payload",
    "meta",
    "version",
    "timestamp",
    "sender_timestamp",
    "rate_limit_proof",
)
KEY_COLUMNS = ("message_hash", "digest", "pubsub_topic", "timestamp")
LOOKUP_COLUMNS = ("message_hash", "pubsub_topic", "timestamp")


def page_columns(include_data: bool, by_hash: bool) -> tuple[str, ...]:
    """The columns of a page (see :data:`DATA_COLUMNS`)."""
    if include_data:
        return DATA_COLUMNS
    return LOOKUP_COLUMNS if by_hash else KEY_COLUMNS


def page_schema(columns: Sequence[str]) -> pa.Schema:
    """The schema of a result of ``columns`` of the messages table (its types)."""
    return _schema_of(tuple(columns))


def empty_page(columns: Sequence[str]) -> pa.Table:
    """An empty result of ``columns`` (shared: tables are immutable)."""
    return _empty_of(tuple(columns))


@functools.lru_cache(maxsize=64)
def _empty_of(columns: tuple[str, ...]) -> pa.Table:
    return _schema_of(columns).empty_table()


@functools.lru_cache(maxsize=64)
def _schema_of(columns: tuple[str, ...]) -> pa.Schema:
    fields = {f.name: f for f in MESSAGES}
    return pa.schema([fields[c] for c in columns])


_EPOCH = dt.date(1970, 1, 1)
NS_PER_DAY = _NS_PER_DAY = 86_400 * 1_000_000_000


def day_of_ns(timestamp_ns: int) -> dt.date:
    """The UTC day of a nanosecond timestamp (negative times clamp to 1970-01-01)."""
    return _EPOCH + dt.timedelta(days=max(timestamp_ns, 0) // _NS_PER_DAY)


def day_of_seconds(timestamp_s: int) -> dt.date:
    return _EPOCH + dt.timedelta(days=max(timestamp_s, 0) // 86_400)


def day_start_ns(day: dt.date) -> int:
    return (day - _EPOCH).days * _NS_PER_DAY
