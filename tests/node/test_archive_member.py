"""Member mode: a magnet link arriving in the store leads, after the quiet
period, to the community's history being imported; forged links do not.
On both engines: the control node's export and the member's hydration
commit through the one the node runs."""

import dataclasses
import time

import coincurve
import pytest
import trio

from wakustore.node import archive as node_archive
from wakustore.node.archive import ArchiveSettings
from wakustore.node.archive_member import (
    LOOK_FETCHING,
    LOOK_NO_LINK,
    LOOK_NOT_NEWER,
    MemberSettings,
    parse_peers,
    run_archive_member,
)
from wakustore.node.config import NodeConfig
from wakustore.node.store_service import open_store
from wakustore.protocols import archive, topics
from wakustore.protocols.message import WakuMessage
from wakustore.protocols.store_query import HistoryQuery
from wakustore.transport import torrent

KEY = bytes(range(40, 72))
PUB = coincurve.PrivateKey(KEY).public_key.format()
CHATS = ("general",)
PUBSUB = "/waku/2/rs/16/32"
LOOPBACK = "127.0.0.1:0"
NS = 10**9


@pytest.fixture(scope="session")
def engine(any_engine):
    return any_engine


def _channel_history(store, now_s):
    topic = topics.channel_content_topic(PUB, "general")
    store.put(
        [
            (PUBSUB, WakuMessage(b"history-%d" % i, topic, timestamp=(now_s - 20 * 86400 + i * 3600) * NS), 0)
            for i in range(200)
        ]
    )
    store.flush()
    return topic


def _count(store, topic, now_s):
    query = HistoryQuery(
        pubsub_topic=PUBSUB, content_topics=(topic,), time_start=(now_s - 30 * 86400) * NS, forward=True, limit=100
    )
    total = 0
    while True:
        page = store.query(query)
        total += len(page.messages)
        if page.next_cursor is None:
            return total
        query = dataclasses.replace(query, cursor=page.next_cursor.message_hash)


def test_member_imports_after_the_quiet_period_and_ignores_forged_links(engine, tmp_path):
    now_s = int(time.time())
    _, control = open_store(NodeConfig(data_dir=tmp_path / "control", flush_interval_s=60), engine)
    member_dir = tmp_path / "member"
    _, member = open_store(NodeConfig(data_dir=member_dir, flush_interval_s=60), engine)
    try:
        topic = _channel_history(control, now_s)
        settings = ArchiveSettings(
            community_key=KEY,
            chat_ids=CHATS,
            archive_dir=tmp_path / "out",
            pubsub_topic=PUBSUB,
            trackers=(),
            listen=LOOPBACK,
            isolated=True,
        )
        exported = node_archive.export_community(control, settings, now_s)
        assert exported.message is not None
        seeder = torrent.Seeder(torrent.open_session(LOOPBACK, isolated=True))
        assert node_archive.seed_latest(seeder, settings)

        # A forged link (signed by someone else) first: never acted on.
        forger = bytes(range(1, 33))
        forged_link = archive.encode_magnet_message(forger, exported.magnet, 10**15)
        forged = WakuMessage(
            archive.wrap_magnet_for_status(forged_link, topics.magnet_chat_id(PUB), forger),
            topics.magnet_content_topic(PUB),
            version=1,
            timestamp=now_s * NS,
        )
        member.put([(PUBSUB, forged, now_s * NS)])
        member_settings = MemberSettings(
            community_public_key=PUB,
            data_dir=member_dir,
            pubsub_topic=PUBSUB,
            chat_ids=CHATS,
            peers=(("127.0.0.1", seeder.port),),
            quiet_period_s=0.5,
            poll_interval_s=0.1,
            session_factory=lambda: torrent.open_session(LOOPBACK, isolated=True),
        )
        fetched, looks = [], []

        async def looked_at_least(count, outcome):
            with trio.fail_after(60):
                while looks.count(outcome) < count:
                    await trio.sleep(0.05)

        async def main():
            async with trio.open_nursery() as nursery:
                nursery.start_soon(
                    lambda: run_archive_member(member, member_settings, on_fetched=fetched.append, on_look=looks.append)
                )
                # The member has read the forged link and found no signed one.
                await looked_at_least(1, LOOK_NO_LINK)
                assert fetched == [] and LOOK_FETCHING not in looks
                member.put([(PUBSUB, exported.message, now_s * NS)])  # the real one, as relay delivers it
                with trio.fail_after(60):
                    while not fetched:
                        await trio.sleep(0.1)
                # Two more looks after the import both see the link as done.
                await looked_at_least(2, LOOK_NOT_NEWER)
                assert looks.count(LOOK_FETCHING) == 1
                nursery.cancel_scope.cancel()

        trio.run(main)
        assert len(fetched) == 1 and fetched[0].messages == 200 and not fetched[0].rejected
        assert _count(member, topic, now_s) == 200
    finally:
        control.close()
        member.close()


def test_seed_peers_parse():
    assert parse_peers(["127.0.0.1:6881", "[::1]:7000"]) == (("127.0.0.1", 6881), ("::1", 7000))
    for bad in ("nohost", "h:0", "h:x", ":1"):
        try:
            parse_peers([bad])
        except ValueError:
            continue
        raise AssertionError(bad)


def test_a_fetch_from_a_silent_peer_ends_at_once_on_cancel_and_leaves_nothing(engine, tmp_path):
    """The only peer accepts connections and never says a word: the fetch
    waits for metadata. Cancelling the member ends it within a poll,
    removes the torrent from the session and imports nothing."""
    import socket

    now_s = int(time.time())
    member_dir = tmp_path / "member"
    _, member = open_store(NodeConfig(data_dir=member_dir, flush_interval_s=60), engine)
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    try:
        info_hash = bytes(range(20)).hex()
        magnet = f"magnet:?xt=urn:btih:{info_hash}&dn={topics.community_id(PUB)}"
        link = node_archive.magnet_waku_message(KEY, magnet, now_s * 1000, now_s * NS)
        member.put([(PUBSUB, link, now_s * NS)])
        sessions = []

        def session_factory():
            sessions.append(torrent.open_session(LOOPBACK, isolated=True))
            return sessions[-1]

        member_settings = MemberSettings(
            community_public_key=PUB,
            data_dir=member_dir,
            pubsub_topic=PUBSUB,
            chat_ids=CHATS,
            peers=(("127.0.0.1", silent.getsockname()[1]),),
            quiet_period_s=0.0,
            poll_interval_s=0.05,
            session_factory=session_factory,
        )
        looks, fetched = [], []

        async def main():
            async with trio.open_nursery() as nursery:
                nursery.start_soon(
                    lambda: run_archive_member(member, member_settings, on_fetched=fetched.append, on_look=looks.append)
                )
                with trio.fail_after(30):
                    while LOOK_FETCHING not in looks or not sessions[0].get_torrents():
                        await trio.sleep(0.05)
                # Connected to the silent peer, waiting for metadata.
                with trio.fail_after(10):
                    while not silent_has_a_connection(silent):
                        await trio.sleep(0.05)
                nursery.cancel_scope.cancel()
                return time.monotonic()

        cancelled_at = trio.run(main)
        assert time.monotonic() - cancelled_at < 1.0
        assert fetched == []
        assert sessions[0].get_torrents() == []
        assert not (member_dir / "archives" / f"{topics.community_id(PUB)}.json").exists()
    finally:
        silent.close()
        member.close()


def silent_has_a_connection(listener) -> bool:
    import select

    return bool(select.select([listener], [], [], 0)[0])
