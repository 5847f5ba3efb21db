"""Store v3, legacy Store, lightpush and metadata over real libp2p TCP.

One node per module (in a thread, on the session's engine) is filled with
120 messages by lightpush v3 from our client and paged back every way a
client can ask; a second node with tight rate limits checks 429s. Every
returned message is compared field by field with what was pushed.
"""

from __future__ import annotations

import math
import random
import sys
import time
from pathlib import Path

import pytest
import trio
from libp2p.network.stream.exceptions import StreamEOF, StreamReset

from wakustore.clients.store import StoreClient
from wakustore.node.store_protocols import PeerBuckets, RateLimit, RateLimits
from wakustore.protocols import lightpush, metadata, store_v2, store_v3
from wakustore.protocols.framing import (
    LIGHTPUSH_MAX_RESPONSE_SIZE,
    METADATA_MAX_SIZE,
    STORE_MAX_RESPONSE_SIZE,
    encode_frame,
    encode_uvarint,
)
from wakustore.protocols.lightpush import LightpushStatus
from wakustore.protocols.message import WakuMessage, message_hash
from wakustore.protocols.store_query import HistoryQuery
from wakustore.protos import waku_message_pb2
from wakustore.transport.streams import read_frame

# The harness lives beside the tests; the path makes it importable in any
# pytest import mode.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from store_node_harness import (  # noqa: E402
    CLUSTER_ID,
    OTHER_PUBSUB_TOPIC,
    PUBSUB_TOPIC,
    SHARDS,
    NodeThread,
    node_config,
)

CONTENT_TOPICS = ["/test/1/alpha/proto", "/test/1/beta/proto", "/test/1/gamma/proto"]
MESSAGE_COUNT = 120
# The node's stream deadlines, shortened: the wait for a request's first
# byte (5 minutes in a real node) and for the rest of its frame (10 s).
IDLE_TIMEOUT_S = 4.0
READ_TIMEOUT_S = 1.0


@pytest.fixture(scope="module")
def node(engine, tmp_path_factory):
    config = node_config(tmp_path_factory.mktemp("store-node"))
    unlimited = RateLimits.parse(["0/1s"])
    thread = NodeThread(config, engine, unlimited, idle_timeout_s=IDLE_TIMEOUT_S, read_timeout_s=READ_TIMEOUT_S).start()
    yield thread
    thread.stop()


@pytest.fixture(scope="module")
def pushed(node):
    """120 messages on two pubsub topics and three content topics, pushed by
    lightpush v3; (pubsub topic, message, hash) in push order."""
    rng = random.Random(7)
    base = time.time_ns() - 5_000_000_000
    messages = []
    for i in range(MESSAGE_COUNT):
        # Every tenth pair shares a timestamp: the hash breaks the tie.
        timestamp = base + (i - (i % 10 == 1)) * 1_000_000
        # The MUID leaves the timestamp out: payloads differ, or the store
        # would keep one of two messages that differ only in time.
        payload = rng.randbytes(rng.choice([4, 17, 300, 4096]))
        if i == 7:
            payload = b""
        if i == 60:
            payload = rng.randbytes(100 * 1024)
        meta = rng.randbytes(rng.randint(1, 64)) if i % 3 == 0 else b""
        topic = OTHER_PUBSUB_TOPIC if i % 6 == 5 else PUBSUB_TOPIC
        message = WakuMessage(
            payload=payload, content_topic=CONTENT_TOPICS[i % 3], version=i % 2, timestamp=timestamp, meta=meta
        )
        messages.append((topic, message, message_hash(topic, message)))
    order = list(range(MESSAGE_COUNT))
    rng.shuffle(order)  # arrival order differs from time order

    async def push_all():
        async with StoreClient.connect(node.tcp_addr) as client:
            for index in order:
                topic, message, _ = messages[index]
                answer = await client.push(topic, message)
                assert (answer.status_code, answer.relay_peer_count) == (200, 0), answer

    trio.run(push_all)
    # Paging below reads the Delta table; later pushes stay in the buffer.
    assert node.flush() == MESSAGE_COUNT
    return messages


def with_client(addr, fn, *args):
    async def main():
        async with StoreClient.connect(addr) as client:
            return await fn(client, *args)

    return trio.run(main)


async def walk(client, query):
    pages = []
    async for response in client.pages(query):
        assert response.status_code == 200, response
        pages.append(response)
    return pages


def expected(pushed, *, topic=None, content_topics=None, start=None, end=None):
    rows = [
        p
        for p in pushed
        if (topic is None or p[0] == topic)
        and (content_topics is None or p[1].content_topic in content_topics)
        and (start is None or p[1].timestamp >= start)
        and (end is None or p[1].timestamp < end)
    ]
    return sorted(rows, key=lambda p: (p[1].timestamp, p[2]))


def assert_entries(entries, rows):
    assert [e.message_hash for e in entries] == [r[2] for r in rows]
    for entry, (topic, message, _) in zip(entries, rows):
        assert entry.pubsub_topic == topic
        assert entry.message == message


def check_paged(pages, rows, limit, forward):
    assert len(pages) == max(1, math.ceil(len(rows) / limit))
    for page in pages:
        assert len(page.messages) <= limit
        stamps = [(e.message.timestamp, e.message_hash) for e in page.messages]
        assert stamps == sorted(stamps)
    assert pages[-1].cursor is None
    ordered = pages if forward else pages[::-1]
    assert_entries([e for page in ordered for e in page.messages], rows)


@pytest.mark.parametrize("forward", [True, False])
def test_pages_every_message_in_order_both_directions(node, pushed, forward):
    query = HistoryQuery(pubsub_topic=PUBSUB_TOPIC, content_topics=tuple(CONTENT_TOPICS), forward=forward, limit=25)
    pages = with_client(node.tcp_addr, walk, query)
    check_paged(pages, expected(pushed, topic=PUBSUB_TOPIC), 25, forward)


def test_query_without_filters_returns_both_pubsub_topics(node, pushed):
    pages = with_client(node.tcp_addr, walk, HistoryQuery(forward=True, limit=100))
    check_paged(pages, expected(pushed), 100, True)


@pytest.mark.parametrize("forward", [True, False])
def test_time_range_is_start_inclusive_end_exclusive(node, pushed, forward):
    stamps = sorted(p[1].timestamp for p in pushed)
    start, end = stamps[30], stamps[90]
    rows = expected(pushed, topic=PUBSUB_TOPIC, content_topics=CONTENT_TOPICS[:2], start=start, end=end)
    query = HistoryQuery(
        pubsub_topic=PUBSUB_TOPIC,
        content_topics=tuple(CONTENT_TOPICS[:2]),
        time_start=start,
        time_end=end,
        forward=forward,
        limit=7,
    )
    pages = with_client(node.tcp_addr, walk, query)
    check_paged(pages, rows, 7, forward)
    assert rows[0][1].timestamp == start


def test_one_content_topic_on_the_other_shard(node, pushed):
    query = HistoryQuery(pubsub_topic=OTHER_PUBSUB_TOPIC, content_topics=(CONTENT_TOPICS[2],), forward=True)
    pages = with_client(node.tcp_addr, walk, query)
    check_paged(pages, expected(pushed, topic=OTHER_PUBSUB_TOPIC, content_topics=[CONTENT_TOPICS[2]]), 20, True)


def test_hash_lookups_with_and_without_pubsub_topic(node, pushed):
    chosen = random.Random(3).sample(pushed, 12)
    unknown = bytes(range(32))

    async def lookups(client):
        alone = await client.query(HistoryQuery(message_hashes=tuple(p[2] for p in chosen) + (unknown,)))
        # js-waku 0.0.36 sends its pubsub topic along with the hashes.
        scoped = await client.query(HistoryQuery(pubsub_topic=PUBSUB_TOPIC, message_hashes=tuple(p[2] for p in chosen)))
        hashes_only = await client.query(HistoryQuery(message_hashes=(chosen[0][2],), include_data=False))
        return alone, scoped, hashes_only

    alone, scoped, hashes_only = with_client(node.tcp_addr, lookups)
    assert alone.status_code == scoped.status_code == 200
    assert_entries(alone.messages, sorted(chosen, key=lambda p: (p[1].timestamp, p[2])))
    assert_entries(scoped.messages, expected([p for p in chosen if p[0] == PUBSUB_TOPIC]))
    assert [(e.message_hash, e.message) for e in hashes_only.messages] == [(chosen[0][2], None)]


@pytest.mark.parametrize("forward", [True, False])
def test_legacy_store_pages_by_index_cursor(node, pushed, forward):
    rows = sorted(expected(pushed, topic=PUBSUB_TOPIC), key=lambda p: (p[1].timestamp, store_v2.digest(p[1])))

    async def walk_legacy(client):
        pages, cursor = [], None
        while True:
            result = await client.query_legacy(
                pubsub_topic=PUBSUB_TOPIC, content_topics=CONTENT_TOPICS, page_size=30, forward=forward, cursor=cursor
            )
            assert result.error == store_v2.HistoryError.NONE
            pages.append(result.messages)
            cursor = result.cursor
            if cursor is None:
                return pages

    pages = with_client(node.tcp_addr, walk_legacy)
    assert len(pages) == math.ceil(len(rows) / 30)
    ordered = pages if forward else pages[::-1]
    assert [m for page in ordered for m in page] == [r[1] for r in rows]


def test_legacy_store_end_time_is_inclusive(node, pushed):
    stamps = sorted(p[1].timestamp for p in pushed if p[0] == PUBSUB_TOPIC)
    result = with_client(
        node.tcp_addr,
        lambda c: c.query_legacy(
            pubsub_topic=PUBSUB_TOPIC,
            content_topics=CONTENT_TOPICS,
            start_time=stamps[10],
            end_time=stamps[14],
            page_size=100,
            forward=True,
        ),
    )
    assert [m.timestamp for m in result.messages] == [s for s in stamps if stamps[10] <= s <= stamps[14]]


def test_websocket_listener_serves_the_same_history(node, pushed):
    response = with_client(node.ws_addr, lambda c: c.query(HistoryQuery(forward=True, limit=5)))
    assert_entries(response.messages, expected(pushed)[:5])


def test_lightpush_outcomes_and_what_gets_stored(node, pushed):
    now = time.time_ns()

    def msg(payload, **kw):
        return WakuMessage(payload=payload, content_topic="/test/1/push/proto", timestamp=now, **kw)

    stored = msg(b"legacy-push")
    ephemeral = msg(b"ephemeral", ephemeral=True)
    cases = [
        ("v3", PUBSUB_TOPIC, msg(b"ok"), 200),
        ("v3", PUBSUB_TOPIC, msg(b"ok"), 200),  # duplicate: success, one row
        ("v3", PUBSUB_TOPIC, ephemeral, 200),
        ("v3", f"/waku/2/rs/{CLUSTER_ID}/1", msg(b"wrong shard"), 421),
        ("v3", None, msg(b"no topic"), 420),
        ("v3", PUBSUB_TOPIC, msg(bytes(200 * 1024)), 413),
        ("v3", PUBSUB_TOPIC, msg(b"x", meta=bytes(65)), 420),
        ("v3", PUBSUB_TOPIC, msg(b"version", version=2**31), 420),  # the table's column is int32
        ("v3", PUBSUB_TOPIC, msg(b"version ok", version=2**31 - 1), 200),
        ("v3", PUBSUB_TOPIC, WakuMessage(b"old", "/test/1/push/proto", timestamp=now - 60 * 10**9), 420),
    ]

    async def run(client):
        statuses = []
        for _, topic, message, _ in cases:
            statuses.append((await client.push(topic, message)).status_code)
        legacy_ok = await client.push_legacy(PUBSUB_TOPIC, stored)
        legacy_bad = await client.push_legacy(f"/waku/2/rs/{CLUSTER_ID}/1", stored)
        found = await client.query(
            HistoryQuery(
                message_hashes=(
                    message_hash(PUBSUB_TOPIC, msg(b"ok")),
                    message_hash(PUBSUB_TOPIC, stored),
                    message_hash(PUBSUB_TOPIC, ephemeral),
                    message_hash(PUBSUB_TOPIC, msg(b"version ok", version=2**31 - 1)),
                )
            )
        )
        return statuses, legacy_ok, legacy_bad, found

    statuses, legacy_ok, legacy_bad, found = with_client(node.tcp_addr, run)
    assert statuses == [c[3] for c in cases]
    assert (legacy_ok.is_success, legacy_ok.info) == (True, "OK")
    assert legacy_bad.is_success is False and "not served" in legacy_bad.info
    assert sorted(e.message.payload for e in found.messages) == [b"legacy-push", b"ok", b"version ok"]
    assert [e.message.version for e in found.messages if e.message.payload == b"version ok"] == [2**31 - 1]


def test_metadata_answers_cluster_and_shards(node):
    theirs = with_client(node.tcp_addr, lambda c: c.metadata(metadata.Metadata(CLUSTER_ID, (0,))))
    assert theirs == metadata.Metadata(CLUSTER_ID, tuple(SHARDS))


# --- bad input ------------------------------------------------------------------

GARBAGE = b"\xff\xff\xff\xff"
BAD_UTF8 = b"\x0a\x05\xff\xfe\xfd\xfc\xfb"  # request_id that is not UTF-8
TOO_LONG = encode_uvarint(20 * 1024 * 1024) + b"\x00" * 16


def test_bad_input_is_answered_with_each_protocols_status(node, pushed):
    over = tuple(bytes([i]) * 32 for i in range(1, 102))
    wrong_message = waku_message_pb2.WakuMessage(payload=b"\xff\xfe", content_topic="x").SerializeToString()

    async def run(client):
        s3 = store_v3.PROTOCOL_ID
        out = {}
        for name, data in (
            ("garbage", encode_frame(GARBAGE)),
            ("bad_utf8", encode_frame(BAD_UTF8)),
            ("wrong_message", encode_frame(wrong_message)),
            ("too_long", TOO_LONG),
            ("truncated", encode_uvarint(100) + b"\x0a\x02ab"),
        ):
            raw = await client.exchange(s3, data, STORE_MAX_RESPONSE_SIZE)
            out["v3 " + name] = store_v3.decode_response(raw).status_code
        for name, query in (
            ("unknown cursor", HistoryQuery(cursor=bytes(range(1, 33)))),
            ("zero cursor", HistoryQuery(cursor=bytes(32))),
            ("short cursor", HistoryQuery(cursor=b"\x01" * 31)),
            ("101 hashes", HistoryQuery(message_hashes=over)),
            ("content topics alone", HistoryQuery(content_topics=("/a/1/b/proto",))),
            ("hashes and time", HistoryQuery(message_hashes=over[:1], time_start=1)),
        ):
            response = await client.query(query, request_id="rid-" + name)
            assert response.request_id == "rid-" + name
            out["v3 " + name] = response.status_code
        for name, data in (("garbage", encode_frame(GARBAGE)), ("too_long", TOO_LONG)):
            raw = await client.exchange(store_v2.PROTOCOL_ID, data, STORE_MAX_RESPONSE_SIZE)
            out["v2 " + name] = store_v2.decode_response(raw).error
        zero_cursor = store_v2.Cursor(bytes(32), 1, 1, PUBSUB_TOPIC)
        raw = await client.request(
            store_v2.PROTOCOL_ID, store_v2.encode_request("r", cursor=zero_cursor), STORE_MAX_RESPONSE_SIZE
        )
        out["v2 zero cursor"] = store_v2.decode_response(raw).error
        for name, data in (
            ("garbage", encode_frame(GARBAGE)),
            ("too_long", TOO_LONG),
            ("no message", encode_frame(b"\x0a\x01r")),
        ):
            raw = await client.exchange(lightpush.PROTOCOL_ID_V3, data, LIGHTPUSH_MAX_RESPONSE_SIZE)
            answer = lightpush.decode_response_v3(raw)
            out["lp3 " + name] = (answer.status_code, answer.request_id)
            raw = await client.exchange(lightpush.PROTOCOL_ID_V2, data, LIGHTPUSH_MAX_RESPONSE_SIZE)
            out["lp2 " + name] = lightpush.decode_response_v2(raw).is_success
        out["metadata garbage"] = await client.exchange(metadata.PROTOCOL_ID, encode_frame(GARBAGE), METADATA_MAX_SIZE)
        out["metadata too_long"] = await client.exchange(metadata.PROTOCOL_ID, TOO_LONG, METADATA_MAX_SIZE)
        out["empty stream"] = await client.exchange(s3, b"", STORE_MAX_RESPONSE_SIZE)
        return out

    out = with_client(node.tcp_addr, run)
    invalid = store_v2.HistoryError.INVALID_CURSOR
    assert out == {
        "v3 garbage": 400,
        "v3 bad_utf8": 400,
        "v3 wrong_message": 400,
        "v3 too_long": 400,
        "v3 truncated": 400,
        "v3 unknown cursor": 300,
        "v3 zero cursor": 400,
        "v3 short cursor": 400,
        "v3 101 hashes": 400,
        "v3 content topics alone": 400,
        "v3 hashes and time": 400,
        "v2 garbage": invalid,
        "v2 too_long": invalid,
        "v2 zero cursor": invalid,
        "lp3 garbage": (400, "N/A"),
        "lp2 garbage": False,
        "lp3 too_long": (413, "N/A"),
        "lp2 too_long": False,
        "lp3 no message": (400, "r"),
        "lp2 no message": False,
        "metadata garbage": None,
        "metadata too_long": None,
        "empty stream": None,
    }
    assert_node_still_serves(node, pushed)


async def open_store_stream(client):
    return await client.host.new_stream(client.peer_id, [store_v3.PROTOCOL_ID])


async def how_it_ends(stream, limit_s):
    """Read ``stream`` to its end: ("eof" or "reset", seconds waited).

    py-libp2p's yamux drops a stream on RST before waking its reader, which
    then reads end of stream; the RST stays recorded on the muxed stream.
    """
    started = trio.current_time()
    with trio.fail_after(limit_s):
        try:
            while await stream.read(1024):
                pass
            reset = False
        except StreamReset:
            reset = True
        except StreamEOF:
            reset = False
    reset = reset or stream.muxed_stream.reset_received
    return ("reset" if reset else "eof"), trio.current_time() - started


def test_stream_idle_past_the_frame_deadline_is_still_answered(node, pushed):
    # js-waku opens its store stream on connect and sends the first query
    # on it whenever asked: the wait for a first byte is not the frame's.
    query = HistoryQuery(pubsub_topic=PUBSUB_TOPIC, content_topics=tuple(CONTENT_TOPICS), forward=True, limit=10)

    async def run(client):
        stream = await open_store_stream(client)
        await trio.sleep(2 * READ_TIMEOUT_S)
        await stream.write(encode_frame(store_v3.encode_request("idle-first", query)))
        with trio.fail_after(READ_TIMEOUT_S + 10):
            raw = await read_frame(stream, STORE_MAX_RESPONSE_SIZE)
        return raw, await how_it_ends(stream, READ_TIMEOUT_S + 10)

    raw, (ending, _) = with_client(node.tcp_addr, run)
    assert raw is not None, "the node ended the idle stream without an answer"
    response = store_v3.decode_response(raw)
    assert (response.request_id, response.status_code) == ("idle-first", 200)
    assert_entries(response.messages, expected(pushed, topic=PUBSUB_TOPIC)[:10])
    assert ending == "eof"  # closed after the answer, as before


@pytest.mark.parametrize(
    "partial",
    [
        encode_uvarint(50) + b"\x0a\x01",  # inside the body
        b"\x80",  # inside the length prefix
    ],
    ids=["body", "prefix"],
)
def test_stream_stalled_inside_a_frame_is_reset_within_the_frame_deadline(node, pushed, partial):
    async def run(client):
        stream = await open_store_stream(client)
        await stream.write(partial)
        return await how_it_ends(stream, IDLE_TIMEOUT_S + 5)

    ending, waited = with_client(node.tcp_addr, run)
    assert ending == "reset"
    # The frame deadline, not the much longer wait for a first byte.
    assert READ_TIMEOUT_S * 0.5 <= waited < IDLE_TIMEOUT_S - 1
    assert_node_still_serves(node, pushed)


def test_stream_idle_past_the_idle_wait_is_reset_not_closed(node, pushed):
    # A half-closed stream still looks writable to js-waku, which would send
    # its request into it; a reset one it drops and replaces.
    async def run(client):
        stream = await open_store_stream(client)
        ending, waited = await how_it_ends(stream, IDLE_TIMEOUT_S + 5)
        try:
            await stream.write(encode_frame(store_v3.encode_request("late", HistoryQuery())))
            writable = True
        except StreamReset:
            writable = False
        return ending, waited, writable

    ending, waited, writable = with_client(node.tcp_addr, run)
    assert (ending, writable) == ("reset", False)
    assert waited >= IDLE_TIMEOUT_S * 0.75
    assert_node_still_serves(node, pushed)


def assert_node_still_serves(node, pushed):
    response = with_client(
        node.tcp_addr,
        lambda c: c.query(
            HistoryQuery(pubsub_topic=PUBSUB_TOPIC, content_topics=tuple(CONTENT_TOPICS), forward=True, limit=10)
        ),
    )
    assert response.status_code == 200
    assert_entries(response.messages, expected(pushed, topic=PUBSUB_TOPIC)[:10])


# --- rate limits -----------------------------------------------------------------


def test_peer_over_its_rate_gets_429_and_other_peers_do_not(engine, tmp_path):
    limits = RateLimits.parse(["store:3/1h", "lightpush:2/1h"])
    limited = NodeThread(node_config(tmp_path), engine, limits).start()
    try:
        query = HistoryQuery(pubsub_topic=PUBSUB_TOPIC, content_topics=("/a/1/b/proto",))
        message = WakuMessage(b"x", "/a/1/b/proto", timestamp=time.time_ns())

        async def greedy(client):
            codes = [(await client.query(query)).status_code for _ in range(4)]
            legacy = await client.query_legacy(pubsub_topic=PUBSUB_TOPIC)
            pushes = [(await client.push(PUBSUB_TOPIC, message)).status_code for _ in range(3)]
            legacy_push = await client.push_legacy(PUBSUB_TOPIC, message)
            return codes, legacy.error, pushes, legacy_push

        codes, legacy_error, pushes, legacy_push = with_client(limited.tcp_addr, greedy)
        assert codes == [200, 200, 200, 429]
        assert legacy_error == store_v2.HistoryError.TOO_MANY_REQUESTS
        assert pushes == [200, 200, LightpushStatus.TOO_MANY_REQUESTS]
        assert not legacy_push.is_success and "too many requests" in legacy_push.info
        # Each query is counted under the status its answer carries.
        queries = limited.service.metrics.queries
        assert {status: queries.labels("store-v3", status)._value.get() for status in ("200", "429")} == {
            "200": 3,
            "429": 1,
        }
        assert queries.labels("store-v2", "429")._value.get() == 1
        # A fresh key on the same address shares the address's bucket; a
        # client on another address has its own.
        fresh = with_client(limited.tcp_addr, lambda c: c.query(query))
        assert fresh.status_code == 429
        from hostile_peers import try_client

        async def query_from(client):
            return (await client.query(query)).status_code

        assert trio.run(try_client, "127.0.0.2", limited.tcp_addr, query_from) == ("ok", 200)
    finally:
        limited.stop()


def test_token_bucket_refills_at_volume_per_period():
    now = [0.0]
    buckets = PeerBuckets(RateLimit(volume=4, period_s=2.0), clock=lambda: now[0], max_peers=2)
    assert [buckets.allow("a") for _ in range(5)] == [True] * 4 + [False]
    now[0] = 0.5  # one token back (2 per second)
    assert [buckets.allow("a") for _ in range(2)] == [True, False]
    assert buckets.allow("b") and buckets.allow("c")  # "a" forgotten: full again
    assert all(buckets.allow("a") for _ in range(4))
    assert all(PeerBuckets(RateLimit(0, 1.0)).allow("x") for _ in range(1000))


@pytest.mark.parametrize("text", ["store", "store:1/1d", "relay:1/1s", "1/s", "-1/1s"])
def test_bad_rate_limit_settings_are_refused(text):
    with pytest.raises(ValueError):
        RateLimits.parse([text])
