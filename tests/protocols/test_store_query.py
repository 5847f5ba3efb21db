"""The shared description of a Store query: predicates(), matches(),
key_range(), sort_key() and finish_page() agree with each other and with a
SQL evaluation of the same description, on generated rows."""

import dataclasses
import sqlite3

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from wakustore.bench.sql import _filter_and_order, _sqlite_value
from wakustore.protocols import store_query as sq
from wakustore.protocols.store_query import HistoryQuery, Ordering, StoredMessage

PUBSUBS = ["/waku/2/rs/0/0", "/waku/2/rs/0/1"]
CONTENTS = ["/a/1/x/proto", "/a/1/y/proto", "/a/1/z/proto"]


def row_fields(m: StoredMessage, content_topic: str) -> dict:
    return dict(
        pubsub_topic=m.pubsub_topic,
        content_topic=content_topic,
        message_hash=m.message_hash,
        timestamp=m.timestamp,
        digest=m.digest,
    )


@dataclasses.dataclass(frozen=True)
class Gen:
    """A generated row: the stored message and its content topic."""

    message: StoredMessage
    content_topic: str


# Few distinct timestamps and hash prefixes: many ties, the cursor's edge cases.
hashes = st.binary(min_size=1, max_size=1).map(lambda b: b * 32)
rows_strategy = st.lists(
    st.builds(
        lambda ps, ct, h, ts, d: Gen(StoredMessage(h, ps, None, ts, d), ct),
        st.sampled_from(PUBSUBS),
        st.sampled_from(CONTENTS),
        hashes,
        st.integers(0, 6),
        hashes,
    ),
    max_size=40,
    # Digests unique too: two rows with one (timestamp, digest) are one
    # position for a legacy cursor.
    unique_by=(lambda g: g.message.message_hash, lambda g: g.message.digest),
)


@st.composite
def queries(draw, rows):
    ordering = draw(st.sampled_from(list(Ordering)))
    start = draw(st.none() | st.integers(-1, 7))
    end = draw(st.none() | st.integers(-1, 8))
    some_hashes = [g.message.message_hash for g in rows]
    q = HistoryQuery(
        pubsub_topic=draw(st.none() | st.sampled_from(PUBSUBS)),
        content_topics=tuple(draw(st.lists(st.sampled_from(CONTENTS), max_size=2, unique=True))),
        time_start=start,
        time_end=end,
        message_hashes=tuple(draw(st.lists(st.sampled_from(some_hashes), max_size=4, unique=True)))
        if some_hashes and draw(st.booleans())
        else (),
        forward=draw(st.booleans()),
        limit=draw(st.integers(1, 5)),
        ordering=ordering,
    )
    # A cursor on a stored row (its own key), or a key between rows.
    key = draw(
        st.none()
        | (st.sampled_from(rows).map(lambda g: sq.sort_key(ordering)(g.message)) if rows else st.none())
        | st.tuples(st.integers(-1, 7), hashes)
    )
    return q, key


def reference(q: HistoryQuery, key, g: Gen) -> bool:
    """The meaning of a query written out directly (13/WAKU2-STORE)."""
    m = g.message
    if q.pubsub_topic is not None and m.pubsub_topic != q.pubsub_topic:
        return False
    if q.content_topics and g.content_topic not in q.content_topics:
        return False
    if q.message_hashes and m.message_hash not in q.message_hashes:
        return False
    if q.time_start is not None and m.timestamp < q.time_start:
        return False
    if q.time_end is not None and m.timestamp >= q.time_end:
        return False
    if key is not None:
        mine = (m.timestamp, m.digest if q.ordering is Ordering.DIGEST else m.message_hash)
        return mine > key if q.forward else mine < key
    return True


def evaluate(preds, after, g: Gen) -> bool:
    """predicates() evaluated one predicate at a time."""
    values = row_fields(g.message, g.content_topic)
    if not all(sq.holds(p, values[p.column]) for p in preds):
        return False
    if after is None:
        return True
    return after.admits(g.message.timestamp, values[after.column])


@st.composite
def cases(draw):
    rows = draw(rows_strategy)
    q, key = draw(queries(rows))
    return rows, q, key


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_predicates_matches_and_key_range_agree(case):
    rows, q, key = case
    preds, after = sq.predicates(q, key)
    assert all(p.column in {"pubsub_topic", "content_topic", "message_hash", "timestamp"} for p in preds)
    assert all(p.op in {"eq", "in", "ge", "lt"} for p in preds)
    assert all(isinstance(p.value, tuple) for p in preds if p.op == "in")
    low, high = sq.key_range(q, key)
    # The time bounds and the cursor alone: what an index sorted by
    # (timestamp, order key) answers with key_range.
    timely_query = dataclasses.replace(q, pubsub_topic=None, content_topics=(), message_hashes=())
    for g in rows:
        expected = reference(q, key, g)
        assert sq.matches(q, key, **row_fields(g.message, g.content_topic)) is expected
        assert evaluate(preds, after, g) is expected
        k = sq.sort_key(q.ordering)(g.message)
        in_range = (low is None or k > low) and (high is None or k < high)
        assert in_range is reference(timely_query, key, g)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_an_sql_translation_of_the_description_selects_the_same_rows(case):
    rows, q, key = case
    q = dataclasses.replace(q, ordering=Ordering.MESSAGE_HASH)
    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE Message (pubsubTopic BLOB, contentTopic BLOB, messageHash BLOB, timestamp INTEGER)")
    db.executemany(
        "INSERT INTO Message VALUES (?, ?, ?, ?)",
        [
            (g.message.pubsub_topic.encode(), g.content_topic.encode(), g.message.message_hash, g.message.timestamp)
            for g in rows
        ],
    )
    where, params = _filter_and_order(q, key, "?", _sqlite_value)
    got = [h for (h,) in db.execute("SELECT messageHash FROM Message" + where, params)]
    expected = sorted(
        (g.message for g in rows if reference(q, key, g)), key=sq.sort_key(q.ordering), reverse=not q.forward
    )
    assert got == [m.message_hash for m in expected]


def pages(rows, q):
    """Follow next_cursor from the first page; each page from up to limit + 1
    candidates in query order, as every backend hands them to finish_page."""
    order = sq.sort_key(q.ordering)
    key, out = None, []
    for _ in range(len(rows) + 2):
        found = sorted(
            (g.message for g in rows if sq.matches(q, key, **row_fields(g.message, g.content_topic))),
            key=order,
            reverse=not q.forward,
        )[: q.limit + 1]
        page = sq.finish_page(q, found)
        out.append(page)
        if page.next_cursor is None:
            return out
        key = order(page.next_cursor)
    raise AssertionError("paging did not end")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_following_next_cursor_visits_every_match_once_in_order(case):
    rows, q, _key = case
    order = sq.sort_key(q.ordering)
    got = pages(rows, q)
    for page in got:
        assert len(page.messages) <= q.limit
        assert [order(m) for m in page.messages] == sorted(order(m) for m in page.messages)
        if page.next_cursor is not None:
            assert len(page.messages) == q.limit
            edge = page.messages[-1] if q.forward else page.messages[0]
            assert page.next_cursor == edge
    seen = [m for page in got for m in (page.messages if q.forward else reversed(page.messages))]
    expected = sorted((g.message for g in rows if reference(q, None, g)), key=order, reverse=not q.forward)
    assert seen == expected


def message(ts, h, digest=b"\x00" * 32, pubsub=PUBSUBS[0]):
    return StoredMessage(h, pubsub, None, ts, digest)


def test_cursor_excludes_its_own_row_and_keeps_its_timestamp_ties():
    a, b, c = (message(5, bytes([i]) * 32) for i in (1, 2, 3))
    q = HistoryQuery(forward=True, limit=10)
    fields = lambda m: row_fields(m, CONTENTS[0])
    key = sq.sort_key(q.ordering)(b)
    assert [sq.matches(q, key, **fields(m)) for m in (a, b, c)] == [False, False, True]
    back = dataclasses.replace(q, forward=False)
    assert [sq.matches(back, key, **fields(m)) for m in (a, b, c)] == [True, False, False]


def test_a_digest_cursor_orders_ties_by_digest_not_hash():
    low_hash_high_digest = message(5, b"\x01" * 32, digest=b"\x09" * 32)
    high_hash_low_digest = message(5, b"\x09" * 32, digest=b"\x01" * 32)
    q = HistoryQuery(forward=True, limit=10, ordering=Ordering.DIGEST)
    key = (5, b"\x05" * 32)
    preds, after = sq.predicates(q, key)
    assert preds == [] and after == sq.After(5, "digest", b"\x05" * 32, True)
    fields = lambda m: row_fields(m, CONTENTS[0])
    assert sq.matches(q, key, **fields(low_hash_high_digest))
    assert not sq.matches(q, key, **fields(high_hash_low_digest))


def test_time_start_is_inclusive_and_time_end_exclusive():
    q = HistoryQuery(time_start=10, time_end=20, forward=True)
    preds, after = sq.predicates(q, None)
    assert preds == [sq.Predicate("timestamp", "ge", 10), sq.Predicate("timestamp", "lt", 20)] and after is None
    fields = lambda ts: row_fields(message(ts, b"\x01" * 32), CONTENTS[0])
    assert [sq.matches(q, None, **fields(ts)) for ts in (9, 10, 19, 20)] == [False, True, True, False]
    low, high = sq.key_range(q, None)
    assert low < (10, b"\x00" * 32) and (19, b"\xff" * 32) < high < (20, b"\x00" * 32)


def test_order_column_and_an_empty_query():
    assert sq.order_column(Ordering.MESSAGE_HASH) == "message_hash"
    assert sq.order_column(Ordering.DIGEST) == "digest"
    assert sq.predicates(HistoryQuery(), None) == ([], None)
    assert sq.key_range(HistoryQuery(), None) == (None, None)


def test_finish_page_without_more_has_no_cursor_and_backward_pages_ascend():
    found = [message(t, bytes([t]) * 32) for t in (9, 8, 7)]  # backward: descending
    page = sq.finish_page(HistoryQuery(forward=False, limit=3), list(found))
    assert [m.timestamp for m in page.messages] == [7, 8, 9] and page.next_cursor is None
    page = sq.finish_page(HistoryQuery(forward=False, limit=2), list(found))
    assert [m.timestamp for m in page.messages] == [8, 9] and page.next_cursor.timestamp == 8
    assert sq.finish_page(HistoryQuery(limit=2), []).messages == []


def test_an_unknown_operator_is_refused():
    with pytest.raises(ValueError):
        sq.holds(sq.Predicate("timestamp", "gt", 1), 2)
