"""go-waku's Store v3 client (``/vac/waku/store-query/3.0.0``, driven by its
REST API's ``GET /store/v3/messages?peerAddr=...``) against our node, cluster
16 shard 32.

130 messages on three content topics are pushed into our node (half of them
committed to the table, half still in the write buffer) and paged back by
go-waku in both directions, by content topic, time range and hash, every
page checked against the order and contents we expect and every walk
followed by its cursors to the end.

What go-waku's client does that shapes what reaches us (and what the tests
check on its side):
- it clamps a page size over 100 to 100 itself (REST and client), so a
  request for 150 reaches us as 100; 0 becomes its default of 20;
- it sends any number of hashes: over 100 reach us, and our 400 comes back
  as HTTP 500 ``{"error_message": "400 - ..."}`` (nwaku also refuses them);
- it refuses a whole response if any message in it has an empty payload,
  or a message without its pubsub topic (``WakuMessageKeyValue.Validate``):
  a store answering for a range that holds an empty-payload message fails
  go-waku's query. We store such messages (nwaku does too) and answer them;
  the last test records go-waku's refusal.
- it has no time_end semantics of its own: ours is exclusive (the spec;
  nwaku's is inclusive, see wire-facts).
"""

from __future__ import annotations

import base64
import os
import time

import pytest
import trio

from wakustore.clients.store import StoreClient
from wakustore.protocols.lightpush import LightpushStatus
from wakustore.protocols.message import WakuMessage, message_hash

pytestmark = pytest.mark.slow

CLUSTER_ID = 16
SHARD = 32
SHARDS = [SHARD]
PUBSUB_TOPIC = f"/waku/2/rs/{CLUSTER_ID}/{SHARD}"
TOPICS = ["/gowaku-store/1/alpha/proto", "/gowaku-store/1/beta/proto", "/gowaku-store/1/gamma/proto"]
PUSHED = 130
COMMITTED = 70


@pytest.fixture(scope="module")
def pushed(ours):
    """(message, hash) in store order: timestamp, then hash. Messages 40 and
    41 share a timestamp (the hash breaks the tie); every 10th has meta."""
    base = time.time_ns() - 5 * 10**9
    messages = []
    for i in range(PUSHED):
        stamp = base + (i - (i == 41)) * 1_000_000
        meta = {"meta": bytes([i]) * 8} if i % 10 == 0 else {}
        messages.append(
            WakuMessage(payload=os.urandom(1 + i % 40), content_topic=TOPICS[i % 3], timestamp=stamp, **meta)
        )

    async def push(batch):
        async with StoreClient.connect(ours.tcp_addr) as client:
            for message in batch:
                answer = await client.push(PUBSUB_TOPIC, message)
                assert answer.status_code == LightpushStatus.SUCCESS, answer

    trio.run(push, messages[:COMMITTED])
    assert ours.flush() == COMMITTED
    trio.run(push, messages[COMMITTED:])
    rows = [(m, message_hash(PUBSUB_TOPIC, m)) for m in messages]
    return sorted(rows, key=lambda row: (row[0].timestamp, row[1]))


def query(gowaku, ours, **params) -> dict:
    answer = gowaku.store_query(ours.tcp_addr, **params)
    assert answer.status == 200, answer
    body = answer.json()
    assert body["status_code"] == 200, body
    return body


def walk(gowaku, ours, **params) -> list[dict]:
    """Every page of a query, following its cursors until none is given."""
    pages, cursor = [], None
    while True:
        body = query(gowaku, ours, cursor=cursor, **params)
        pages.append(body.get("messages", []))
        if "pagination_cursor" not in body:
            return pages
        cursor = base64.b64decode(body["pagination_cursor"])
        assert cursor == base64.b64decode(pages[-1][-1 if params.get("ascending", True) else 0]["message_hash"])
        assert len(pages) <= PUSHED, "the walk does not end"


def hashes_of(entries) -> list[bytes]:
    return [base64.b64decode(e["message_hash"]) for e in entries]


def assert_same_messages(entries, rows) -> None:
    assert hashes_of(entries) == [h for _, h in rows]
    for entry, (message, _) in zip(entries, rows):
        got = entry["message"]
        assert entry["pubsub_topic"] == PUBSUB_TOPIC
        assert base64.b64decode(got["payload"]) == message.payload
        # The message is protojson: camelCase, int64 as a string, bytes base64.
        assert got["contentTopic"] == message.content_topic
        assert got["timestamp"] == str(message.timestamp)
        assert base64.b64decode(got.get("meta", "")) == (message.meta or b"")
        assert got.get("version", 0) == 0


def backward_order(rows, page):
    """What a backward walk yields: the newest page first, each page ascending."""
    return [rows[max(0, end - page) : end] for end in range(len(rows), 0, -page)]


def test_gowaku_pages_forward_by_content_topics_to_the_end(ours, gowaku, pushed):
    topics = TOPICS[:2]
    rows = [r for r in pushed if r[0].content_topic in topics]
    pages = walk(
        gowaku, ours, pubsubTopic=PUBSUB_TOPIC, contentTopics=topics, includeData=True, pageSize=20, ascending=True
    )
    assert [len(p) for p in pages] == [20, 20, 20, 20, len(rows) - 80]
    assert_same_messages([e for p in pages for e in p], rows)


def test_gowaku_pages_backward_by_content_topics_to_the_end(ours, gowaku, pushed):
    pages = walk(
        gowaku, ours, pubsubTopic=PUBSUB_TOPIC, contentTopics=TOPICS, includeData=True, pageSize=20, ascending=False
    )
    expected = backward_order(pushed, 20)
    assert [len(p) for p in pages] == [len(p) for p in expected]
    for page, rows in zip(pages, expected):
        assert_same_messages(page, rows)


@pytest.mark.parametrize("ascending", [True, False])
def test_gowaku_time_range_with_cursors_both_directions(ours, gowaku, pushed, ascending):
    """time_start inclusive, time_end exclusive: [ts(10), ts(100))."""
    start, end = pushed[10][0].timestamp, pushed[100][0].timestamp
    rows = [r for r in pushed if start <= r[0].timestamp < end and r[0].content_topic != TOPICS[2]]
    pages = walk(
        gowaku,
        ours,
        pubsubTopic=PUBSUB_TOPIC,
        contentTopics=TOPICS[:2],
        startTime=start,
        endTime=end,
        includeData=True,
        pageSize=7,
        ascending=ascending,
    )
    expected = [rows[i : i + 7] for i in range(0, len(rows), 7)] if ascending else backward_order(rows, 7)
    assert [hashes_of(p) for p in pages] == [[h for _, h in chunk] for chunk in expected]


@pytest.mark.parametrize(("asked", "served"), [(1, 1), (20, 20), (100, 100), (150, 100), (0, 20)])
def test_gowaku_page_sizes(ours, gowaku, pushed, asked, served):
    """Over 100 and 0 are go-waku's own clamps (its REST and client): we are
    asked for 100 and 20. The first page of a backward query is the newest."""
    body = query(
        gowaku, ours, pubsubTopic=PUBSUB_TOPIC, contentTopics=TOPICS, includeData=False, pageSize=asked, ascending=False
    )
    assert hashes_of(body["messages"]) == [h for _, h in pushed[-served:]]
    assert all("message" not in e for e in body["messages"])
    assert base64.b64decode(body["pagination_cursor"]) == pushed[-served][1]


def test_gowaku_page_size_one_walks_a_range_to_the_end(ours, gowaku, pushed):
    start, end = pushed[50][0].timestamp, pushed[56][0].timestamp
    pages = walk(
        gowaku,
        ours,
        pubsubTopic=PUBSUB_TOPIC,
        contentTopics=TOPICS,
        startTime=start,
        endTime=end,
        includeData=True,
        pageSize=1,
        ascending=True,
    )
    assert [hashes_of(p) for p in pages] == [[h] for _, h in pushed[50:56]]


@pytest.mark.parametrize("include_data", [True, False])
def test_gowaku_looks_up_hashes_with_and_without_data(ours, gowaku, pushed, include_data):
    """100 hashes (the most one lookup takes), given newest first and with
    one never stored: the answer holds the 99 stored, in store order."""
    wanted = pushed[::-1][:99]
    hashes = [h for _, h in wanted] + [os.urandom(32)]
    body = query(gowaku, ours, hashes=hashes, includeData=include_data, pageSize=100)
    rows = sorted(wanted, key=lambda r: (r[0].timestamp, r[1]))
    if include_data:
        assert_same_messages(body["messages"], rows)
    else:
        assert hashes_of(body["messages"]) == [h for _, h in rows]
        assert all(set(e) == {"message_hash"} for e in body["messages"])
    assert "pagination_cursor" not in body


def test_more_than_100_hashes_are_refused_and_go_waku_reports_it(ours, gowaku, pushed):
    answer = gowaku.store_query(ours.tcp_addr, hashes=[h for _, h in pushed[:101]], includeData=False)
    assert answer.status == 500, answer
    assert answer.json()["error_message"] == "400 - BAD_REQUEST: too many message hashes: 101 > 100"


def test_a_query_that_matches_nothing_is_one_empty_page(ours, gowaku, pushed):
    body = query(gowaku, ours, pubsubTopic=PUBSUB_TOPIC, contentTopics=["/gowaku-store/1/nothing/proto"], pageSize=20)
    assert "messages" not in body and "pagination_cursor" not in body


def test_a_cursor_we_never_issued_is_refused(ours, gowaku, pushed):
    answer = gowaku.store_query(
        ours.tcp_addr, pubsubTopic=PUBSUB_TOPIC, contentTopics=TOPICS, cursor=os.urandom(32), pageSize=20
    )
    assert answer.status == 500, answer
    assert answer.json()["error_message"] == "300 - BAD_RESPONSE: cursor not found"


def test_gowaku_refuses_a_page_holding_an_empty_payload_that_we_serve(ours, gowaku, pushed):
    """An empty payload is a valid message (nwaku stores and serves it; so
    do we), but go-waku's client validates every message of a response
    (WakuMessage.Validate: payload required) and drops the whole page;
    without data, the hash comes through."""
    empty = WakuMessage(payload=b"", content_topic=TOPICS[0], timestamp=time.time_ns())

    async def push():
        async with StoreClient.connect(ours.tcp_addr) as client:
            return await client.push(PUBSUB_TOPIC, empty)

    assert trio.run(push).status_code == LightpushStatus.SUCCESS
    digest = message_hash(PUBSUB_TOPIC, empty)
    hashes_only = query(gowaku, ours, hashes=[digest], includeData=False)
    assert hashes_of(hashes_only["messages"]) == [digest]
    with_data = gowaku.store_query(ours.tcp_addr, hashes=[digest], includeData=True)
    assert (with_data.status, with_data.json()["error_message"]) == (500, "missing Payload field"), with_data
