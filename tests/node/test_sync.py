"""Waku Sync and Store Resume between two real nodes (node/sync.py) over
libp2p on loopback, on the session's engine."""

from __future__ import annotations

import logging
import time
from contextlib import asynccontextmanager

import pytest
import trio

from tests.node.store_node_harness import CLUSTER_ID, OTHER_PUBSUB_TOPIC, PUBSUB_TOPIC, NodeThread, node_config
from wakustore.node import sync as sync_service
from wakustore.node.sync import LAST_ONLINE_FILE, read_last_online
from wakustore.protocols import sync
from wakustore.protocols.framing import encode_frame, encode_uvarint
from wakustore.protocols.message import WakuMessage, message_hash, muid
from wakustore.protocols.store_query import HistoryQuery

DEADLINE_S = 30.0


class SyncNode(NodeThread):
    """A NodeThread that keeps the running node (for its SyncService)."""

    async def _main(self) -> None:
        from wakustore.node.running import running_node

        self._token = trio.lowlevel.current_trio_token()
        self._stop = trio.Event()
        async with running_node(self.config, engine=self.engine, mailserver=False, metrics=False, relay=False) as node:
            self.node = node
            self.service = node.service
            self.multiaddrs = node.info.multiaddrs
            self.peer_id = node.info.peer_id
            self._ready.set()
            await self._stop.wait()

    def run(self, fn, *args):
        return trio.from_thread.run(fn, *args, trio_token=self._token)

    def put(self, messages) -> None:
        self.run(self.service.put, [(t, m, time.time_ns()) for t, m in messages])

    def muids(self, since_ns: int) -> set[bytes]:
        return {muid(t, m) for t, m in self.messages(since_ns)}

    def messages(self, since_ns: int) -> list[tuple[str, WakuMessage]]:
        async def all_pages():
            out, cursor = [], None
            while True:
                page = await self.service.query(
                    HistoryQuery(time_start=since_ns, forward=True, limit=100, cursor=cursor)
                )
                out.extend((m.pubsub_topic, m.message) for m in page.messages)
                if page.next_cursor is None:
                    return out
                cursor = page.next_cursor.message_hash

        return self.run(all_pages)


def make_messages(n: int, start_ns: int, step_ns: int, tag: str, topic: str = PUBSUB_TOPIC):
    return [
        (
            topic,
            WakuMessage(
                payload=f"{tag}-{i}".encode(), content_topic="/test/1/sync/proto", timestamp=start_ns + i * step_ns
            ),
        )
        for i in range(n)
    ]


def metric(node: SyncNode, name: str, **labels) -> float:
    """A sample of the node's Prometheus registry (0 when never set)."""
    return node.service.metrics.registry.get_sample_value(name, labels) or 0.0


@asynccontextmanager
async def peer_host(listen: bool = False, handlers=None):
    """A bare libp2p host in the test's trio loop, as a peer of the node."""
    import multiaddr
    from libp2p import new_host
    from libp2p.crypto.secp256k1 import create_new_key_pair
    from libp2p.custom_types import TProtocol

    host = new_host(key_pair=create_new_key_pair(), muxer_preference="YAMUX")
    for protocol, handler in (handlers or {}).items():
        host.set_stream_handler(TProtocol(protocol), handler)
    addrs = [multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")] if listen else []
    async with host.run(listen_addrs=addrs):
        yield host


async def open_stream(host, node: SyncNode, protocol: str):
    from libp2p.custom_types import TProtocol

    from wakustore.clients.store import parse_peer

    info = parse_peer(node.tcp_addr)
    await host.connect(info)
    return await host.new_stream(info.peer_id, [TProtocol(protocol)])


async def reconcile(host, node: SyncNode, ids: list[sync.SyncId], lower_ns: int, upper_ns: int) -> sync.Session:
    """A whole reconciliation session with the node, initiated by ``host``
    holding ``ids``; the node then accepts transfers from this peer."""
    from wakustore.transport.streams import read_frame

    session = sync.Session(pubsub_topics=(PUBSUB_TOPIC, OTHER_PUBSUB_TOPIC))
    stream = await open_stream(host, node, sync.RECONCILIATION_PROTOCOL_ID)
    await stream.write(encode_frame(session.initiate(sync.IdSet(ids), lower_ns, upper_ns)))
    with trio.fail_after(10):
        while not session.done:
            raw = await read_frame(stream, sync.MAX_PAYLOAD_SIZE)
            if raw is None:
                break
            reply = session.answer(session.receive(raw))
            if reply is not None:
                await stream.write(encode_frame(reply))
    await stream.close()
    return session


async def agree_on_an_empty_window(host, node: SyncNode) -> None:
    """A session over a window neither side holds anything in."""
    now = time.time_ns()
    session = await reconcile(host, node, [], now - 50 * 60 * 10**9, now - 40 * 60 * 10**9)
    assert session.done and not session.to_send and not session.to_receive


async def transfer(host, node: SyncNode, frames: list[bytes]) -> str:
    """Write ``frames`` (raw bytes) on a new transfer stream to ``node``,
    close our side and tell how the node ended the stream: "reset" or
    "closed"."""
    from libp2p.host.exceptions import StreamFailure
    from libp2p.network.stream.exceptions import StreamEOF, StreamReset

    with trio.fail_after(10):
        try:
            stream = await open_stream(host, node, sync.TRANSFER_PROTOCOL_ID)
        except StreamFailure as exc:
            # A reset right after the protocol is agreed can reach us before
            # py-libp2p has read the agreement: the opening fails with it.
            cause = exc.__cause__
            while cause is not None and not isinstance(cause, StreamReset):
                cause = cause.__cause__
            if cause is None:
                raise
            return "reset"
        try:
            for frame in frames:
                await stream.write(frame)
            await stream.close_write()
            # Read to the end (no size): py-libp2p's sized read of a stream
            # the peer reset ends like one it closed.
            data = await stream.read()
        except StreamReset:
            return "reset"
        except StreamEOF:
            return "closed"
    return f"data {data!r}"


def transfer_frame(topic: str, message: WakuMessage) -> bytes:
    return encode_frame(sync.encode_transfer(topic, message))


def wait_until(condition, what: str, deadline_s: float = DEADLINE_S) -> None:
    end = time.monotonic() + deadline_s
    while not condition():
        if time.monotonic() > end:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.2)


def test_two_nodes_with_different_gaps_converge_through_sync(engine, tmp_path):
    now = time.time_ns()
    since = now - 30 * 60 * 10**9
    common = make_messages(40, since, 10**9, "common")
    only_b = make_messages(25, now - 20 * 60 * 10**9, 3 * 10**9, "b", OTHER_PUBSUB_TOPIC)
    only_a = make_messages(30, now - 10 * 60 * 10**9, 7 * 10**9, "a")
    # A duplicate by MUID under another timestamp (another hash): the table
    # keeps one, and sync must not fetch the other at every round.
    dup_topic, dup_msg = only_b[0]
    dup_b = (
        dup_topic,
        WakuMessage(
            payload=dup_msg.payload, content_topic=dup_msg.content_topic, timestamp=dup_msg.timestamp + 5 * 10**9
        ),
    )
    b = SyncNode(node_config(tmp_path / "b"), engine).start()
    try:
        b.put(common + only_b)
        a = SyncNode(node_config(tmp_path / "a", sync_peers=[b.tcp_addr], sync_interval_s=1.0), engine).start()
        try:
            a.put(common + only_a + [dup_b])
            assert a.muids(since) != b.muids(since)
            union = a.muids(since) | b.muids(since)
            wait_until(lambda: a.muids(since) == union and b.muids(since) == union, "the two nodes to converge")
            assert len(union) == 95
            # Later rounds find nothing left to move: the MUID duplicate's hash
            # is remembered, not fetched again (the counters stay put).
            sessions = a.node.sync.sessions
            wait_until(lambda: a.node.sync.sessions >= sessions + 2, "two more sync rounds")
            received = (a.node.sync.received, b.node.sync.received)
            wait_until(lambda: a.node.sync.sessions >= sessions + 4, "two more sync rounds")
            assert (a.node.sync.received, b.node.sync.received) == received
            assert a.node.sync.failures == 0 and b.node.sync.failures == 0
            # The metrics tell the same story: every round ok in both roles,
            # what one side sent is what the other received (only_a and the
            # MUID duplicate one way, only_b the other).
            sessions_total, transferred = "wakustore_sync_sessions_total", "wakustore_sync_transfer_messages_total"
            assert metric(a, sessions_total, role="initiator", outcome="ok") >= sessions + 4
            assert metric(b, sessions_total, role="responder", outcome="ok") >= sessions + 4
            for node in (a, b):
                for role in ("initiator", "responder"):
                    assert metric(node, sessions_total, role=role, outcome="failed") == 0
            # (At least: a round that starts while the other side's transfer
            # is still on its way finds those messages missing once more.)
            assert metric(a, transferred, direction="sent") == metric(b, transferred, direction="received") >= 31
            assert metric(b, transferred, direction="sent") == metric(a, transferred, direction="received") >= 25
        finally:
            a.stop()
    finally:
        b.stop()


def test_restarted_node_resumes_the_ten_minutes_it_missed(engine, tmp_path):
    b = SyncNode(node_config(tmp_path / "b"), engine).start()
    try:
        # Long sync interval: only Store Resume can bring the gap in.
        a_config = node_config(tmp_path / "a", sync_peers=[b.tcp_addr], sync_interval_s=3600.0)
        a = SyncNode(a_config, engine).start()
        a.stop()
        last_online = read_last_online(tmp_path / "a" / LAST_ONLINE_FILE)
        assert last_online is not None and abs(last_online - time.time_ns()) < 60 * 10**9
        # The node was down for 11 minutes; the peer got 10 minutes of traffic.
        now = time.time_ns()
        (tmp_path / "a" / LAST_ONLINE_FILE).write_text(f"{now - 11 * 60 * 10**9}\n")
        missed = make_messages(60, now - 10 * 60 * 10**9, 10**10, "missed")
        older = make_messages(5, now - 30 * 60 * 10**9, 10**9, "older")  # before the gap
        b.put(missed + older)
        a = SyncNode(a_config, engine).start()
        try:
            want = {muid(t, m) for t, m in missed}
            wait_until(lambda: a.muids(now - 60 * 60 * 10**9) == want, "the gap to be resumed")
            assert a.node.sync.resumed == 60 and a.node.sync.sessions == 1
            assert metric(a, "wakustore_store_resumes_total", outcome="ok") == 1
            assert metric(a, "wakustore_store_resumed_messages_total") == 60
        finally:
            a.stop()
    finally:
        b.stop()


def test_bad_reconciliation_payload_resets_the_stream_and_the_node_keeps_serving(engine, tmp_path):
    b = SyncNode(node_config(tmp_path / "b"), engine).start()
    now = time.time_ns()
    b.put(make_messages(5, now - 5 * 60 * 10**9, 10**9, "x"))

    async def client():
        from libp2p import new_host
        from libp2p.crypto.secp256k1 import create_new_key_pair
        from libp2p.custom_types import TProtocol

        from wakustore.clients.store import parse_peer
        from wakustore.transport.streams import read_frame

        info = parse_peer(b.tcp_addr)
        host = new_host(key_pair=create_new_key_pair(), muxer_preference="YAMUX")
        async with host.run(listen_addrs=[]):
            await host.connect(info)
            # Garbage: an unknown range type.
            stream = await host.new_stream(info.peer_id, [TProtocol(sync.RECONCILIATION_PROTOCOL_ID)])
            await stream.write(encode_frame(b"\x00\x00\x05\x01\x07"))
            with trio.fail_after(10):
                with pytest.raises(Exception) as failed:
                    await read_frame(stream, 1 << 20)
                    await stream.read(1)
            assert (
                "reset" in type(failed.value).__name__.lower()
                or "reset" in str(failed.value).lower()
                or isinstance(failed.value, EOFError)
            )
            # A proper session still works.
            session = sync.Session(pubsub_topics=(PUBSUB_TOPIC, OTHER_PUBSUB_TOPIC))
            stream = await host.new_stream(info.peer_id, [TProtocol(sync.RECONCILIATION_PROTOCOL_ID)])
            await stream.write(encode_frame(session.initiate(sync.IdSet([]), now - 3600 * 10**9, now)))
            with trio.fail_after(10):
                raw = await read_frame(stream, 1 << 24)
            payload = session.receive(raw)
            assert not payload.finished
            session.answer(payload)
            return session

    try:
        session = trio.run(client)
        # The node's set was not empty, so it answered with ranges to work on.
        assert session.rounds == 1
        assert b.node.sync.failures >= 1
    finally:
        b.stop()


def test_sync_settings_come_from_file_flag_and_environment(tmp_path):
    from wakustore.node.config import ConfigError, load

    peer = "/ip4/127.0.0.1/tcp/60000/p2p/16Uiu2HAmPLe7Mzm8TsYUubgCAW1aJoeFScxrLj8ppHFivPo97bUZ"
    path = tmp_path / "node.toml"
    path.write_text(f'sync_peers = ["{peer}"]\nsync_interval_s = 60\n')
    config = load(path, {}, {})
    assert (config.sync_peers, config.sync_interval_s, config.sync_range_s, config.resume_max_s) == (
        [peer],
        60.0,
        3600.0,
        21600.0,
    )
    config = load(path, {"sync_peers": [peer, peer]}, {"WAKUSTORE_SYNC_RANGE_S": "600"})
    assert config.sync_peers == [peer, peer] and config.sync_range_s == 600.0
    assert load(None, {}, {"WAKUSTORE_SYNC_PEERS": f"{peer},{peer}"}).sync_peers == [peer, peer]
    with pytest.raises(ConfigError, match="sync_peers"):
        load(None, {"sync_peers": ["/ip4/127.0.0.1/tcp/1"]}, {})


def test_transfer_without_a_recent_session_is_refused(engine, tmp_path):
    b = SyncNode(node_config(tmp_path / "b"), engine).start()
    now = time.time_ns()
    message = make_messages(1, now - 60 * 10**9, 1, "unasked")[0]

    async def client():
        async with peer_host() as host:
            refused = await transfer(host, b, [transfer_frame(*message)])
            refused_count = metric(b, "wakustore_sync_transfer_streams_total", outcome="refused")
            # The same message from the same peer once a session ran is taken.
            await agree_on_an_empty_window(host, b)
            return refused, refused_count, await transfer(host, b, [transfer_frame(*message)])

    try:
        refused, refused_count, accepted = trio.run(client)
        assert (refused, refused_count) == ("reset", 1)
        assert accepted == "closed"
        assert b.muids(0) == {muid(*message)}
    finally:
        b.stop()


def test_bad_transfer_frames_reset_the_stream_and_the_node_keeps_serving(engine, tmp_path):
    b = SyncNode(node_config(tmp_path / "b"), engine).start()
    now = time.time_ns()
    before_garbage, good = make_messages(2, now - 60 * 10**9, 10**9, "good")
    unserved = make_messages(1, now - 60 * 10**9, 1, "unserved", f"/waku/2/rs/{CLUSTER_ID}/7")[0]
    future = make_messages(1, now + 3600 * 10**9, 1, "future")[0]

    async def client():
        async with peer_host() as host:
            await agree_on_an_empty_window(host, b)
            ends = []
            # A message, then a frame that is no WakuMessageAndTopic.
            ends.append(await transfer(host, b, [transfer_frame(*before_garbage), encode_frame(b"\xff\xff\xff")]))
            # A prefix over the frame limit: reset before any body byte is
            # buffered (the body never comes).
            ends.append(await transfer(host, b, [encode_uvarint(sync.TRANSFER_MAX_FRAME_SIZE + 1) + b"x" * 16]))
            # Messages the store refuses (a shard the node does not serve, a
            # timestamp an hour ahead) are skipped; the stream goes on.
            ends.append(
                await transfer(host, b, [transfer_frame(*unserved), transfer_frame(*future), transfer_frame(*good)])
            )
            await agree_on_an_empty_window(host, b)  # reconciliation is still served too
            return ends

    try:
        assert trio.run(client) == ["reset", "reset", "closed"]
        assert b.muids(0) == {muid(*before_garbage), muid(*good)}
        streams = "wakustore_sync_transfer_streams_total"
        assert (metric(b, streams, outcome="reset"), metric(b, streams, outcome="ok")) == (2, 1)
        assert metric(b, "wakustore_sync_transfer_messages_total", direction="received") == 4
        rejected = "wakustore_messages_rejected_total"
        assert metric(b, rejected, source="sync", reason="unsupported_pubsub_topic") == 1
        assert metric(b, rejected, source="sync", reason="timestamp_drift") == 1
    finally:
        b.stop()


def test_stopping_a_node_mid_session_is_prompt_and_quiet(engine, tmp_path, caplog):
    """One session stalled in each role when the node stops: a peer that
    never answers the node's initiation, and a peer that stops answering
    the node's reply to its own."""
    from wakustore.transport.streams import read_frame

    caplog.set_level(logging.INFO)
    now = time.time_ns()
    initiated = trio.Event()

    async def stall(stream) -> None:
        await stream.read(1)
        initiated.set()
        await trio.sleep_forever()

    async def main():
        async with peer_host(listen=True, handlers={sync.RECONCILIATION_PROTOCOL_ID: stall}) as host:
            addr = next(str(a) for a in host.get_addrs() if "/tcp/" in str(a))
            config = node_config(tmp_path / "a", sync_peers=[addr], sync_interval_s=0.2)
            a = await trio.to_thread.run_sync(lambda: SyncNode(config, engine).start())
            try:
                await trio.to_thread.run_sync(a.put, make_messages(5, now - 5 * 60 * 10**9, 10**9, "held"))
                with trio.fail_after(DEADLINE_S):
                    await initiated.wait()
                # Our own session with the node: its reply asks for more,
                # which never comes.
                session = sync.Session(pubsub_topics=(PUBSUB_TOPIC,))
                stream = await open_stream(host, a, sync.RECONCILIATION_PROTOCOL_ID)
                await stream.write(encode_frame(session.initiate(sync.IdSet([]), now - 3600 * 10**9, now)))
                with trio.fail_after(10):
                    assert not session.receive(await read_frame(stream, 1 << 24)).finished
                started = time.monotonic()
                await trio.to_thread.run_sync(a.stop)
                return a, time.monotonic() - started
            except BaseException:
                await trio.to_thread.run_sync(a.stop)
                raise

    a, stop_s = trio.run(main)
    assert not a._thread.is_alive()
    # Either stalled read left to its timeout would hold the stop this long.
    assert stop_s < sync_service.READ_TIMEOUT_S / 2
    # No error or traceback from anyone, not even a warning from the node.
    loud = [
        r
        for r in caplog.records
        if r.levelno >= logging.ERROR or r.exc_info or (r.levelno >= logging.WARNING and r.name.startswith("wakustore"))
    ]
    assert not loud, [(r.name, r.getMessage()) for r in loud]


def test_messages_a_failing_store_lost_are_fetched_again(engine, tmp_path):
    """A transfer whose batch the store could not take: its ids are not
    remembered as handled, so the next session finds them missing."""
    b = SyncNode(node_config(tmp_path / "b"), engine).start()
    now = time.time_ns()
    message = make_messages(1, now - 60 * 10**9, 1, "lost")[0]
    id_ = (message[1].timestamp, message_hash(*message))
    store = b.node.sync.ingest.store
    failures = []

    async def store_failing_once(batch, source):
        if not failures:
            failures.append(batch)
            raise OSError("no space left on device")
        return await store(batch, source=source)

    b.node.sync.ingest.store = store_failing_once

    async def client():
        async with peer_host() as host:
            await agree_on_an_empty_window(host, b)
            end = await transfer(host, b, [transfer_frame(*message)])
            session = await reconcile(host, b, [id_], now - 3600 * 10**9, now)
            return end, session

    try:
        end, session = trio.run(client)
        assert end == "reset" and len(failures) == 1
        assert session.done and list(session.to_send) == [id_[1]]
        assert b.muids(0) == set()
    finally:
        b.stop()
