"""Waku Sync and Store Resume between two real nodes (node/sync.py) over
libp2p on loopback, on the session's engine."""

from __future__ import annotations

import time

import pytest
import trio

from tests.node.store_node_harness import OTHER_PUBSUB_TOPIC, PUBSUB_TOPIC, NodeThread, node_config
from wakustore.node.sync import LAST_ONLINE_FILE, read_last_online
from wakustore.protocols import sync
from wakustore.protocols.framing import encode_frame
from wakustore.protocols.message import WakuMessage, message_hash, muid
from wakustore.protocols.store_query import HistoryQuery

DEADLINE_S = 30.0


class SyncNode(NodeThread):
    """A NodeThread that keeps the running node (for its SyncService)."""

    async def _main(self) -> None:
        from wakustore.node.running import running_node

        self._token = trio.lowlevel.current_trio_token()
        self._stop = trio.Event()
        async with running_node(self.config, engine=self.engine, mailserver=False, metrics=False,
                                relay=False) as node:
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
                page = await self.service.query(HistoryQuery(time_start=since_ns, forward=True, limit=100,
                                                             cursor=cursor))
                out.extend((m.pubsub_topic, m.message) for m in page.messages)
                if page.next_cursor is None:
                    return out
                cursor = page.next_cursor.message_hash
        return self.run(all_pages)


def make_messages(n: int, start_ns: int, step_ns: int, tag: str, topic: str = PUBSUB_TOPIC):
    return [(topic, WakuMessage(payload=f"{tag}-{i}".encode(), content_topic="/test/1/sync/proto",
                                timestamp=start_ns + i * step_ns)) for i in range(n)]


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
    dup_b = (dup_topic, WakuMessage(payload=dup_msg.payload, content_topic=dup_msg.content_topic,
                                    timestamp=dup_msg.timestamp + 5 * 10**9))
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
        from wakustore.node.store_protocols import read_frame

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
            assert "reset" in type(failed.value).__name__.lower() or "reset" in str(failed.value).lower() \
                or isinstance(failed.value, EOFError)
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
    assert (config.sync_peers, config.sync_interval_s, config.sync_range_s, config.resume_max_s) == \
        ([peer], 60.0, 3600.0, 21600.0)
    config = load(path, {"sync_peers": [peer, peer]}, {"WAKUSTORE_SYNC_RANGE_S": "600"})
    assert config.sync_peers == [peer, peer] and config.sync_range_s == 600.0
    assert load(None, {}, {"WAKUSTORE_SYNC_PEERS": f"{peer},{peer}"}).sync_peers == [peer, peer]
    with pytest.raises(ConfigError, match="sync_peers"):
        load(None, {"sync_peers": ["/ip4/127.0.0.1/tcp/1"]}, {})
