"""Member mode: a magnet link arriving in the store leads, after the quiet
period, to the community's history being imported; forged links do not."""

import dataclasses
import time

import coincurve
import trio

from wakustore.node import archive as node_archive
from wakustore.node import torrent
from wakustore.node.archive import ArchiveSettings
from wakustore.node.archive_member import MemberSettings, parse_peers, run_archive_member
from wakustore.node.config import NodeConfig
from wakustore.node.store_service import open_store
from wakustore.protocols import archive, topics
from wakustore.protocols.message import WakuMessage
from wakustore.protocols.store_query import HistoryQuery

KEY = bytes(range(40, 72))
PUB = coincurve.PrivateKey(KEY).public_key.format()
CHATS = ("general",)
PUBSUB = "/waku/2/rs/16/32"
LOOPBACK = "127.0.0.1:0"
NS = 10**9


def _channel_history(store, now_s):
    topic = topics.channel_content_topic(PUB, "general")
    store.put([(PUBSUB, WakuMessage(b"history-%d" % i, topic, timestamp=(now_s - 20 * 86400 + i * 3600) * NS), 0)
               for i in range(200)])
    store.flush()
    return topic


def _count(store, topic, now_s):
    query = HistoryQuery(pubsub_topic=PUBSUB, content_topics=(topic,), time_start=(now_s - 30 * 86400) * NS,
                         forward=True, limit=100)
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
        settings = ArchiveSettings(community_key=KEY, chat_ids=CHATS, archive_dir=tmp_path / "out", pubsub_topic=PUBSUB,
                                   trackers=(), listen=LOOPBACK, isolated=True)
        exported = node_archive.export_community(control, settings, now_s)
        assert exported.message is not None
        seeder = torrent.Seeder(torrent.open_session(LOOPBACK, isolated=True))
        assert node_archive.seed_latest(seeder, settings)

        # A forged link (signed by someone else) first: never acted on.
        forger = bytes(range(1, 33))
        forged_link = archive.encode_magnet_message(forger, exported.magnet, 10**15)
        forged = WakuMessage(archive.wrap_magnet_for_status(forged_link, topics.magnet_chat_id(PUB), forger),
                             topics.magnet_content_topic(PUB), version=1, timestamp=now_s * NS)
        member.put([(PUBSUB, forged, now_s * NS)])
        member_settings = MemberSettings(
            community_public_key=PUB, data_dir=member_dir, pubsub_topic=PUBSUB, chat_ids=CHATS,
            peers=(("127.0.0.1", seeder.port),), quiet_period_s=0.5, poll_interval_s=0.1,
            session_factory=lambda: torrent.open_session(LOOPBACK, isolated=True),
        )
        fetched = []

        async def main():
            async with trio.open_nursery() as nursery:
                nursery.start_soon(lambda: run_archive_member(member, member_settings, on_fetched=fetched.append))
                await trio.sleep(1.0)
                assert fetched == []  # only the forged link so far
                member.put([(PUBSUB, exported.message, now_s * NS)])  # the real one, as relay delivers it
                with trio.fail_after(60):
                    while not fetched:
                        await trio.sleep(0.1)
                await trio.sleep(0.5)  # a second look must not fetch again
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
