"""Pages in Arrow hold store_query's semantics: the same rows, order and
cursor as its Python evaluation, from any split of the rows into sources."""

import dataclasses
import random

import pyarrow as pa
import pytest

from wakustore.protocols import store_query
from wakustore.protocols.message import WakuMessage
from wakustore.protocols.store_query import HistoryQuery, Ordering
from wakustore.storage import page_table, schema
from wakustore.storage.rows import Row, rows_table

PUBSUBS = ["/waku/2/rs/16/32", "/waku/2/rs/16/64"]
TOPICS = ["/app/1/a/proto", "/app/1/b/proto", "/app/1/c/proto"]


def _rows(rng: random.Random, count: int) -> list[Row]:
    rows = []
    for i in range(count):
        message = WakuMessage(
            payload=b"p%d" % i + rng.randbytes(rng.choice([0, 5, 200])),
            content_topic=rng.choice(TOPICS),
            # Few distinct times: ties are broken by the order key.
            timestamp=rng.choice([0, 1000 + rng.randrange(0, 12)]),
            meta=rng.randbytes(rng.choice([0, 3])),
        )
        rows.append(Row.build(rng.choice(PUBSUBS), message, 1000 + rng.randrange(0, 12)))
    return rows


def _query(rng: random.Random, rows: list[Row]):
    """A query as v3 or the legacy store may send it (any mix of filters)."""
    by_hash = rng.random() < 0.25
    ordering = Ordering.DIGEST if not by_hash and rng.random() < 0.3 else Ordering.MESSAGE_HASH
    start = rng.choice([None, 1000 + rng.randrange(0, 12)])
    end = rng.choice([None, 1000 + rng.randrange(0, 14)])
    query = HistoryQuery(
        pubsub_topic=rng.choice([None, *PUBSUBS]),
        content_topics=() if by_hash else tuple(rng.sample(TOPICS, rng.randint(0, 2))),
        time_start=None if by_hash else start,
        time_end=None if by_hash else end,
        message_hashes=tuple(r.message_hash for r in rng.sample(rows, min(len(rows), 6))) + (bytes(32),)
        if by_hash
        else (),
        forward=rng.random() < 0.5,
        limit=rng.choice([1, 2, 5, 100]),
        include_data=rng.random() < 0.7,
        ordering=ordering,
    )
    key = None
    if rows and rng.random() < 0.5:
        at = rng.choice(rows)
        key = (at.timestamp, at.digest if ordering is Ordering.DIGEST else at.message_hash)
    return query, key


def _expected(query, key, rows: list[Row]):
    match = store_query.matcher(query, key)
    found = [
        r.stored(query.include_data)
        for r in rows
        if match(r.pubsub_topic, r.message.content_topic, r.message_hash, r.timestamp, r.digest)
    ]
    found.sort(key=store_query.sort_key(query.ordering), reverse=not query.forward)
    return store_query.finish_page(query, found[: query.limit + 1])


def _stripped(page, query):
    """A page's rows as the wire sees them (digests only where the page has them)."""
    columns = schema.page_columns(query.include_data, bool(query.message_hashes))
    keep_digest = "digest" in columns
    return [
        (m.message_hash, m.pubsub_topic, m.message, m.timestamp, m.digest if keep_digest else b"")
        for m in page.messages
    ], (None if page.next_cursor is None else page.next_cursor.message_hash)


@pytest.mark.parametrize("seed", range(40))
def test_a_page_from_split_sources_is_the_reference_page(seed):
    rng = random.Random(seed)
    rows = _rows(rng, rng.choice([0, 1, 7, 60]))
    for _ in range(10):
        query, key = _query(rng, rows)
        columns = schema.page_columns(query.include_data, bool(query.message_hashes))
        # The rows a source would hold, in a random order, filtered and
        # ordered here as each source does.
        shuffled = rng.sample(rows, len(rows))
        table = rows_table(shuffled, list(dict.fromkeys((*columns, "content_topic"))))
        matching = page_table.select(table, query, key, fetch=len(rows))
        ordered = matching.table.select(list(columns)).take(matching.order)
        # Split: two ordered sources that share rows, and the rest pending.
        picks = [rng.random() for _ in range(ordered.num_rows)]
        first = ordered.filter(pa.array([p < 0.5 for p in picks], pa.bool_()))
        second = ordered.filter(pa.array([0.3 < p < 0.8 for p in picks], pa.bool_()))
        pending = ordered.filter(pa.array([p > 0.7 for p in picks], pa.bool_()))
        pending = pending.take(pa.array(rng.sample(range(pending.num_rows), pending.num_rows), pa.int64()))
        fetch = query.limit + 1
        sources = [page_table.in_order(first.slice(0, fetch)), page_table.in_order(second.slice(0, fetch))]
        got = page_table.finish(query, page_table.merge(query, sources, pending))
        assert _stripped(got, query) == _stripped(_expected(query, key, rows), query), (seed, query, key)
        # One source alone: its rows as they stand, no copy.
        alone = page_table.finish(query, page_table.merge(query, [page_table.select(table, query, key)]))
        assert _stripped(alone, query) == _stripped(_expected(query, key, rows), query), (seed, query, key)


def test_the_key_range_and_ties_on_a_keys_first_bytes():
    """Bounds on (timestamp, key), and an order that cannot stop at the
    keys' first 8 bytes (digests made to share them)."""
    rng = random.Random(5)
    rows = _rows(rng, 80)
    table = rows_table(rows, schema.KEY_COLUMNS)
    forward = HistoryQuery(forward=True, limit=1000)
    for _ in range(50):
        low, high = (rng.choice([None, (r.timestamp, r.message_hash), (r.timestamp, b"")]) for r in rng.sample(rows, 2))
        got = page_table.select(table, forward, None, None, low, high).order
        assert sorted(got.tolist()) == [
            i
            for i, r in enumerate(rows)
            if (low is None or (r.timestamp, r.message_hash) > low)
            and (high is None or (r.timestamp, r.message_hash) < high)
        ]
    shared = [
        dataclasses.replace(r, digest=b"\x01" * 8 + rng.randbytes(24), timestamp=1000 + i % 3)
        for i, r in enumerate(rows)
    ]
    table = rows_table(shared, schema.KEY_COLUMNS)
    for direction in (True, False):
        query = HistoryQuery(forward=direction, limit=1000, ordering=Ordering.DIGEST)
        got = page_table.select(table, query).order.tolist()
        assert got == sorted(
            range(len(shared)), key=lambda i: (shared[i].timestamp, shared[i].digest), reverse=not direction
        )


def _recast(table: pa.Table, types: dict) -> pa.Table:
    return table.cast(pa.schema([pa.field(f.name, types.get(f.type, f.type)) for f in table.schema]))


def test_columns_of_any_arrow_layout_read_the_same():
    """Slices (an offset into the buffers), several chunks, large and view types."""
    rows = _rows(random.Random(9), 30)
    table = rows_table(rows, schema.DATA_COLUMNS)
    expected = [r.stored() for r in rows[5:25]]
    sliced = table.slice(5, 20)
    chunked = pa.concat_tables([table.slice(5, 7), table.slice(12, 13)])
    large = _recast(sliced, {pa.binary(): pa.large_binary(), pa.string(): pa.large_string()})
    views = _recast(sliced, {pa.binary(): pa.binary_view(), pa.string(): pa.string_view()})
    for layout in (sliced, chunked, large, views):
        columns = page_table.message_columns(layout)
        assert list(columns) == expected
        assert columns.encode(1) == page_table.message_columns(sliced.combine_chunks()).encode(1)
    with pytest.raises(ValueError, match="null"):
        page_table.message_columns(
            pa.table(
                {
                    "message_hash": pa.array([None], pa.binary()),
                    "pubsub_topic": pa.array(["t"]),
                    "timestamp": pa.array([1], pa.int64()),
                }
            )
        )
