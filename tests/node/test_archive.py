"""Community history archives between a control node and members: export,
seeding, fetching over loopback BitTorrent, hydration of the table.

Every libtorrent session here is isolated (no DHT, LSD, UPnP or NAT-PMP),
listens on 127.0.0.1 and meets its peers by address.
"""

import dataclasses
import datetime as dt
import json
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import coincurve
import pyarrow as pa
import pytest
import trio

from wakustore.cli import archive as archive_cli
from wakustore.cli.main import _Parser
from wakustore.clients import archive as archive_client
from wakustore.node import archive as node_archive
from wakustore.node.archive import ArchiveSettings, Selection
from wakustore.node.config import NodeConfig
from wakustore.node.store_service import open_store
from wakustore.protocols import archive, archive_records, topics, waku_v1
from wakustore.protocols.archive import Layout
from wakustore.protocols.message import WakuMessage
from wakustore.protocols.store_query import HistoryQuery
from wakustore.storage import maintenance, staging
from wakustore.transport import torrent

DAY = 86400
NS = 10**9
T0 = 1_700_000_000  # the oldest message's second
PUBSUB = "/waku/2/rs/16/32"
KEY = bytes(range(1, 33))
PUB = coincurve.PrivateKey(KEY).public_key.format()
CID = topics.community_id(PUB)
CHATS = ("general", "random")
TOPICS = [topics.channel_content_topic(PUB, c) for c in CHATS]
LOOPBACK = "127.0.0.1:0"


def bench_args(argv):
    """``wakustore bench ...``'s arguments (the bench parser is built when bench runs)."""
    from wakustore.cli.bench import bench_parser
    from wakustore.cli.main import _Parser

    return bench_parser(_Parser).parse_args(argv)


@pytest.fixture
def make_store(engine, tmp_path):
    opened = []

    def make(name):
        config = NodeConfig(data_dir=tmp_path / name, flush_interval_s=60, flush_max_messages=100_000)
        _, store = open_store(config, engine)
        opened.append(store)
        return config.data_dir, store

    yield make
    for store in opened:
        store.close()


def settings(tmp_path, layout=Layout.STATUS_GO, **extra):
    return ArchiveSettings(
        community_key=KEY,
        chat_ids=CHATS,
        archive_dir=tmp_path / "out",
        pubsub_topic=PUBSUB,
        layout=layout,
        trackers=(),
        listen=LOOPBACK,
        isolated=True,
        **extra,
    )


KEYS = archive.community_channel_keys(PUB, CHATS)
SENDER = bytes(range(5, 37))


def put_days(store, days, per_day=6, payload=200, topic_list=TOPICS):
    """``per_day`` messages on each day in ``days`` (0 = T0's day), plus one
    message on a topic the community does not archive. Two in three are
    Waku v1 payloads sealed with the channel key and signed, as Status
    sends them; the others are opaque."""
    batch = []
    for day in days:
        for i in range(per_day):
            ts = (T0 + day * DAY + i * 3600) * NS + i
            topic = topic_list[i % len(topic_list)]
            body = bytes([day, i]) * (payload // 2)
            if i % 3 != 2:
                body = waku_v1.encrypt_symmetric(body, KEYS[topic], SENDER)
            message = WakuMessage(
                payload=body, content_topic=topic, version=1, timestamp=ts, meta=b"m" if i % 2 else b""
            )
            batch.append((PUBSUB, message, ts + 5))
        batch.append((PUBSUB, WakuMessage(b"other", "/other/1/x/proto", timestamp=(T0 + day * DAY) * NS + 7), 0))
    store.put(batch)
    store.flush()


def hashes(store, start_s, end_s, topic_list=TOPICS):
    found, query = (
        [],
        HistoryQuery(
            pubsub_topic=PUBSUB,
            content_topics=tuple(topic_list),
            time_start=start_s * NS,
            time_end=end_s * NS,
            forward=True,
            limit=100,
        ),
    )
    while True:
        page = store.query(query)
        found += [m.message_hash for m in page.messages]
        if page.next_cursor is None:
            return sorted(found)
        query = dataclasses.replace(query, cursor=page.next_cursor.message_hash)


def seeder_for(control):
    seeder = torrent.Seeder(torrent.open_session(LOOPBACK, isolated=True))
    assert node_archive.seed_latest(seeder, control)
    return seeder


def fetch_edited(control, store, data_dir):
    """Fetch the control node's archive after a test edited its files: the
    torrent made anew over them and seeded, as a control node would."""
    control.torrent_path.write_bytes(torrent.create_torrent(control.archive_dir, CID, archive.PIECE_LENGTH, ()))
    seeder = seeder_for(control)
    try:
        return fetch(store, data_dir, seeder, torrent.magnet_uri(control.torrent_path.read_bytes()))
    finally:
        seeder.stop()


def fetch(store, data_dir, seeder, magnet, layout=Layout.STATUS_GO, **extra):
    extra.setdefault("stall_timeout_s", 20)
    return node_archive.fetch_archives(
        store,
        data_dir,
        PUB,
        magnet,
        layout=layout,
        peers=[("127.0.0.1", seeder.port)],
        chat_ids=CHATS,
        session=torrent.open_session(LOOPBACK, isolated=True),
        default_pubsub_topic=PUBSUB,
        **extra,
    )


def run_cli(*argv):
    parser = _Parser(prog="wakustore")
    archive_cli.register(parser.add_subparsers(dest="command", required=True, parser_class=_Parser))
    args = parser.parse_args(["archive", *argv])
    return args.handler(args)


@pytest.fixture
def cli_store(monkeypatch, make_store):
    """`archive export|fetch` on stores of the shared engine, one per
    ``--data-dir`` name; returns name -> (data dir, store)."""
    stores = {}

    def get(name):
        if name not in stores:
            stores[name] = make_store(name)
        return stores[name]

    def fake_open(args):
        data_dir, store = get(args.data_dir.name)
        return archive_cli._OpenStore(data_dir, store, [32], 16), lambda: None

    monkeypatch.setattr(archive_cli, "_open_store", fake_open)
    return get


# --- control node ------------------------------------------------------------------


def test_export_cli_writes_data_index_torrent_and_prints_the_magnet(tmp_path, cli_store, capsys):
    key_file = tmp_path / "key"
    key_file.write_text("0x" + KEY.hex() + "\n")
    data_dir = tmp_path / "control"
    code = run_cli(
        "export",
        "--data-dir",
        str(data_dir),
        "--community-key",
        str(key_file),
        "--chat-id",
        CHATS[0],
        "--chat-id",
        CHATS[1],
        "--archive-dir",
        str(tmp_path / "out"),
        "--now",
        str(T0 + 10),
        "--no-trackers",
    )
    assert code == 0 and capsys.readouterr().out == ""  # no messages yet: nothing to archive
    put_days(cli_store("control")[1], [0, 1, 8])
    code = run_cli(
        "export",
        "--data-dir",
        str(data_dir),
        "--community-key",
        str(key_file),
        "--chat-id",
        CHATS[0],
        "--chat-id",
        CHATS[1],
        "--archive-dir",
        str(tmp_path / "out"),
        "--now",
        str(T0 + 14 * DAY),
        "--no-trackers",
    )
    out = capsys.readouterr().out.strip().splitlines()
    assert code == 0 and out[-1].startswith("magnet:?xt=urn:btih:") and f"dn={CID}" in out[-1]
    community = tmp_path / "out" / CID
    info = torrent.torrent_info((tmp_path / "out" / f"{CID}.torrent").read_bytes())
    layout = info.layout()
    assert info.name() == CID and info.piece_length() == 102400
    assert [layout.file_path(i) for i in range(2)] == [f"{CID}/data", f"{CID}/index"]
    entries = archive.parse_index(
        Layout.STATUS_GO, (community / "index").read_bytes(), (community / "data").stat().st_size
    )
    assert [(e.start_ns // NS, e.end_ns // NS) for e in entries] == [(T0, T0 + 7 * DAY), (T0 + 7 * DAY, T0 + 14 * DAY)]
    state = json.loads((tmp_path / "out" / f"{CID}.json").read_text())
    assert state["last_end_s"] == T0 + 14 * DAY and state["magnet"] == out[-1]
    assert run_cli("verify", str(tmp_path / "out")) == 0


def test_export_after_downtime_makes_one_archive_per_window_and_skips_empty_ones(tmp_path, make_store):
    _, store = make_store("control")
    put_days(store, [0, 1, 15, 29])
    result = node_archive.export_community(store, settings(tmp_path), T0 + 30 * DAY)
    assert len(result.windows) == 5
    assert [(e.start_ns // NS - T0) // DAY for e in result.archives] == [0, 14, 28]
    assert result.messages == 4 * 6
    # The magnet-link message went into the node's own store, signed by the community.
    magnets = node_archive.magnets_in_store(store, PUB, PUBSUB)
    assert node_archive.newest_magnet(magnets, PUB).magnet_uri == result.magnet
    assert result.message.content_topic == topics.magnet_content_topic(PUB)
    # Published in status-go's wire form: encrypted for the magnet chat, version 1.
    assert result.message.version == 1
    opened = waku_v1.decrypt_symmetric(result.message.payload, waku_v1.key_from_password(topics.magnet_chat_id(PUB)))
    assert opened.signature_public_key == PUB
    plain = archive.unwrap_magnet_payload(result.message.payload, topics.magnet_chat_id(PUB))
    assert archive.verify_magnet_message(plain, PUB).magnet_uri == result.magnet
    # The plain form published before is still read.
    assert node_archive.newest_magnet([plain], PUB).magnet_uri == result.magnet
    # Nothing new: no archive, same torrent, same magnet.
    again = node_archive.export_community(store, settings(tmp_path), T0 + 30 * DAY + 60)
    assert again.archives == [] and again.magnet == result.magnet


def test_windows_over_the_payload_limit_are_split_into_several_archives(tmp_path, make_store, monkeypatch):
    _, store = make_store("control")
    put_days(store, [0, 1], per_day=6, payload=1000)
    monkeypatch.setattr(archive, "MAX_ARCHIVE_PAYLOAD", 2500)
    monkeypatch.setattr(archive.Chunker.__init__, "__defaults__", (2500,))
    result = node_archive.export_community(store, settings(tmp_path), T0 + 7 * DAY)
    assert len(result.archives) == 6 and {(e.start_ns, e.end_ns) for e in result.archives} == {
        (T0 * NS, (T0 + 7 * DAY) * NS)
    }


def test_an_unfinished_export_is_cut_off_and_redone(tmp_path, make_store):
    _, store = make_store("control")
    put_days(store, [0])
    control = settings(tmp_path)
    node_archive.export_community(store, control, T0 + 7 * DAY)
    data = tmp_path / "out" / CID / "data"
    before = data.read_bytes()
    with open(data, "ab") as f:
        f.write(b"half an archive")
    put_days(store, [8])
    node_archive.export_community(store, control, T0 + 14 * DAY)
    assert data.read_bytes()[: len(before)] == before
    problems, _ = archive_client.verify_archive_set(tmp_path / "out" / CID)
    assert problems == []


def test_verify_reports_corruption_and_exits_1(tmp_path, make_store, capsys):
    _, store = make_store("control")
    put_days(store, [0, 2])
    node_archive.export_community(store, settings(tmp_path), T0 + 7 * DAY)
    data = tmp_path / "out" / CID / "data"
    raw = bytearray(data.read_bytes())
    raw[300] ^= 0x01
    raw[-1] = 0x55
    data.write_bytes(bytes(raw))
    assert run_cli("verify", str(tmp_path / "out" / CID)) == 1
    out = capsys.readouterr().out
    assert "fail their hash" in out and "padding" in out


def test_scheduler_exports_seeds_the_latest_and_unlocks_retention(tmp_path, make_store):
    import time

    _, store = make_store("control")
    now = int(time.time())
    batch = [
        (PUBSUB, WakuMessage(b"x%d" % i, TOPICS[i % 2], timestamp=(now - 7200 + i * 600) * NS), 0) for i in range(10)
    ]
    store.put(batch)
    control = settings(tmp_path, interval_s=3600)
    assert node_archive.seeded_until_ns(control.archive_dir, [CID]) == 0

    async def main():
        async with trio.open_nursery() as nursery:
            seeder = await nursery.start(node_archive.run_archive_scheduler, None, store, control)
            with trio.fail_after(60):
                while (
                    seeder.handle is None
                    or not seeder.handle.status().is_seeding
                    or not node_archive.seeded_until_ns(control.archive_dir, [CID])
                ):
                    await trio.sleep(0.1)
            nursery.cancel_scope.cancel()
        return seeder

    seeder = trio.run(main)
    assert seeder.handle is None  # stopped on the way out
    state = json.loads(control.state_path.read_text())
    keep_from = node_archive.seeded_until_ns(control.archive_dir, [CID])
    assert keep_from == state["seeded_end_s"] * NS == state["last_end_s"] * NS >= now * NS
    # Retention may delete what is archived and seeded, never what is newer.
    newer = WakuMessage(b"newer", TOPICS[0], timestamp=keep_from + 100 * NS)
    store.put([(PUBSUB, newer, 0)])
    store.flush()
    policy = maintenance.RetentionPolicy(max_age_s=60)
    result = maintenance.apply_retention(store.table, policy, keep_from + 3600 * NS, keep_from_ns=keep_from)
    # Left: the newer message, and the magnet-link message stamped at the export's end.
    assert result.cutoff_ns == keep_from and result.rows_after == 2


# --- signers worked out ahead of the export ---------------------------------------------


@pytest.fixture
def recoveries(monkeypatch):
    """The key recoveries made in this process."""
    made = []
    recover = archive_records._recover_uncompressed

    def counted(signature, digest):
        made.append(signature)
        return recover(signature, digest)

    monkeypatch.setattr(archive_records, "_recover_uncompressed", counted)
    return made


def _export_bytes(store, control, now_s):
    result = node_archive.export_community(store, control, now_s)
    community = control.archive_dir / CID
    return result, (community / "data").read_bytes(), (community / "index").read_bytes()


def test_signers_worked_out_ahead_give_the_same_archives_without_a_recovery(
    tmp_path, make_store, monkeypatch, recoveries
):
    _, store = make_store("control")
    put_days(store, range(9), per_day=12)
    cold, warm = settings(tmp_path / "cold"), settings(tmp_path / "warm")
    expected = _export_bytes(store, cold, T0 + 14 * DAY)
    signed = len(recoveries)
    assert signed == 9 * 8  # two in three of each day's 12 are sealed and signed
    # Worked out by worker processes, several batches a day.
    monkeypatch.setattr(node_archive, "POOL_MIN_ROWS", 1)
    monkeypatch.setattr(node_archive, "EXPORT_BATCH_ROWS", 5)
    assert node_archive.prepare_signers(store, warm, T0 + 14 * DAY) == 9 * 12
    state = json.loads(warm.state_path.read_text())
    assert state["signers_until_ns"] == (T0 + 14 * DAY - node_archive.SIGNERS_LAG_S) * NS
    assert node_archive.prepare_signers(store, warm, T0 + 14 * DAY) == 0  # nothing new since
    monkeypatch.setattr(node_archive, "POOL_MIN_ROWS", 10**9)  # the export in this process, counted
    got = _export_bytes(store, warm, T0 + 14 * DAY)
    assert got[1:] == expected[1:] and got[0].messages == expected[0].messages == 9 * 12
    assert len(recoveries) == signed  # none more
    # The exported days left the cache; the last window's end day stays.
    assert [p.name for p in warm.signer_cache.directory.iterdir()] == []


def test_a_message_after_its_signers_were_worked_out_is_recovered_at_the_export(tmp_path, make_store, recoveries):
    """A message that comes in after the preparation passed its timestamp
    (late, or from a store sync) has no cached signer: the export recovers
    it, and the archives are what an export without a cache writes."""
    _, store = make_store("control")
    put_days(store, [0, 1, 2])
    warm, cold = settings(tmp_path / "warm"), settings(tmp_path / "cold")
    assert node_archive.prepare_signers(store, warm, T0 + 3 * DAY, lag_s=0) == 3 * 6
    late = WakuMessage(
        waku_v1.encrypt_symmetric(b"late", KEYS[TOPICS[0]], SENDER),
        TOPICS[0],
        version=1,
        timestamp=(T0 + DAY + 1800) * NS,
    )
    store.put([(PUBSUB, late, 0)])
    store.flush()
    assert node_archive.prepare_signers(store, warm, T0 + 3 * DAY + 600, lag_s=0) == 0  # after the late one's time
    before = len(recoveries)
    got = _export_bytes(store, warm, T0 + 7 * DAY)
    assert len(recoveries) - before == 1  # the late message's
    expected = _export_bytes(store, cold, T0 + 7 * DAY)
    assert got[1:] == expected[1:] and got[0].messages == 3 * 6 + 1


def test_the_scheduler_works_out_signers_between_exports(tmp_path, make_store, monkeypatch):
    import time

    monkeypatch.setattr(node_archive, "SIGNERS_EVERY_S", 0.2)
    monkeypatch.setattr(node_archive, "SIGNERS_LAG_S", 0)
    _, store = make_store("control")
    control = settings(tmp_path, interval_s=3600)
    old = int(time.time()) - 7200
    store.put([(PUBSUB, WakuMessage(b"first", TOPICS[0], timestamp=old * NS), 0)])
    store.flush()

    async def main():
        async with trio.open_nursery() as nursery:
            await nursery.start(node_archive.run_archive_scheduler, None, store, control)
            with trio.fail_after(60):  # the first export, at once
                while (
                    not control.state_path.exists() or json.loads(control.state_path.read_text())["last_end_s"] is None
                ):
                    await trio.sleep(0.05)
            last_end_s = json.loads(control.state_path.read_text())["last_end_s"]
            sealed = waku_v1.encrypt_symmetric(b"after", KEYS[TOPICS[1]], SENDER)
            store.put([(PUBSUB, WakuMessage(sealed, TOPICS[1], version=1, timestamp=last_end_s * NS + 1), 0)])
            store.flush()
            with trio.fail_after(60):
                while not list(control.signer_cache.directory.rglob("*.arrow")):
                    await trio.sleep(0.05)
            nursery.cancel_scope.cancel()
        return last_end_s

    last_end_s = trio.run(main)
    day = dt.datetime.fromtimestamp(last_end_s, dt.UTC).date()
    known = control.signer_cache.lookup(
        day, pa.array([m for m in hashes(store, last_end_s, last_end_s + 1)], pa.binary())
    )
    assert known.to_pylist() == [b"\x04" + coincurve.PrivateKey(SENDER).public_key.format(compressed=False)[1:]]


# --- member ------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("layout", list(Layout))
def test_member_fetches_everything_then_only_the_new_archive(tmp_path, make_store, monkeypatch, layout):
    # Stage every few rows on disk: each window still commits as one transaction.
    from wakustore.storage import staging

    monkeypatch.setattr(staging, "STAGING_THRESHOLD_BYTES", 3000)
    _, control_store = make_store("control")
    member_dir, member_store = make_store("member")
    control = settings(tmp_path, layout)
    put_days(control_store, [0, 3, 8, 12])
    put_days(member_store, [2], topic_list=TOPICS[:1])  # held by the member, not by the control node: goes away
    first = node_archive.export_community(control_store, control, T0 + 14 * DAY)
    data_v1 = (tmp_path / "out" / CID / "data").read_bytes()
    seeder = seeder_for(control)
    try:
        got = fetch(member_store, member_dir, seeder, first.magnet, layout, clock=1)
        assert len(got.imported) == 2 and got.rejected == {}
        assert hashes(member_store, T0, T0 + 14 * DAY) == hashes(control_store, T0, T0 + 14 * DAY)
        assert len(hashes(member_store, T0, T0 + 14 * DAY)) == 24

        put_days(control_store, [15, 16])
        second = node_archive.export_community(control_store, control, T0 + 21 * DAY)
        assert (tmp_path / "out" / CID / "data").read_bytes()[: len(data_v1)] == data_v1
        node_archive.seed_latest(seeder, control)
        got = fetch(member_store, member_dir, seeder, second.magnet, layout, clock=2)
        (new,) = second.archives
        index_pieces = set(range(second_data_pieces(tmp_path), torrent_pieces(control)))
        assert got.imported == [new.archive_id]
        assert got.downloaded_pieces == set(new.pieces()) | index_pieces
        assert hashes(member_store, T0, T0 + 21 * DAY) == hashes(control_store, T0, T0 + 21 * DAY)
        stale = fetch(member_store, member_dir, seeder, second.magnet, layout, clock=2)
        assert stale.ignored and stale.imported == []
    finally:
        seeder.stop()


def second_data_pieces(tmp_path):
    return (tmp_path / "out" / CID / "data").stat().st_size // archive.PIECE_LENGTH


def torrent_pieces(control):
    return torrent.torrent_info(control.torrent_path.read_bytes()).num_pieces()


@pytest.mark.slow
def test_range_fetch_imports_only_the_overlapping_windows(tmp_path, make_store):
    _, control_store = make_store("control")
    member_dir, member_store = make_store("member")
    control = settings(tmp_path)
    put_days(control_store, [0, 8, 15])
    result = node_archive.export_community(control_store, control, T0 + 21 * DAY)
    seeder = seeder_for(control)
    try:
        got = fetch(
            member_store, member_dir, seeder, result.magnet, selection=Selection("range", T0 + 8 * DAY, T0 + 9 * DAY)
        )
    finally:
        seeder.stop()
    middle = result.archives[1]
    assert got.imported == [middle.archive_id] and got.downloaded_pieces - set(middle.pieces()) <= {
        torrent_pieces(control) - 1
    }
    assert len(hashes(member_store, T0, T0 + 21 * DAY)) == 6 == len(hashes(member_store, T0 + 7 * DAY, T0 + 14 * DAY))


@pytest.mark.slow
def test_fetch_cli_uses_the_newest_signed_link_in_the_local_store_and_ignores_forged_ones(tmp_path, cli_store, capsys):
    _, control_store = cli_store("control")
    member_dir, member_store = cli_store("member")
    put_days(control_store, [0, 1])
    control = settings(tmp_path)
    result = node_archive.export_community(control_store, control, T0 + 7 * DAY)
    forger = bytes(range(7, 39))
    # Wrapped for the community's magnet chat (its key is public), signed by the forger.
    forged_link = archive.encode_magnet_message(forger, "magnet:?xt=urn:btih:" + "11" * 20, 10**15)
    forged = WakuMessage(
        archive.wrap_magnet_for_status(forged_link, topics.magnet_chat_id(PUB), forger),
        topics.magnet_content_topic(PUB),
        version=1,
        timestamp=(T0 + 8 * DAY) * NS,
    )
    member_store.put([(PUBSUB, result.message, 0), (PUBSUB, forged, 0)])
    port = _free_port()
    seeding = subprocess.Popen(  # `wakustore archive seed`, until SIGTERM
        [
            sys.executable,
            "-c",
            SEED_CLI,
            "seed",
            "--archive-dir",
            str(control.archive_dir),
            "--community-pubkey",
            PUB.hex(),
            "--port",
            str(port),
            "--listen-host",
            "127.0.0.1",
            "--isolated",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert seeding.stdout.readline().strip() == result.magnet
        argv = [
            "fetch",
            "--data-dir",
            str(member_dir),
            "--community-pubkey",
            PUB.hex(),
            "--latest",
            "--chat-id",
            CHATS[0],
            "--chat-id",
            CHATS[1],
            "--seed-peer",
            f"127.0.0.1:{port}",
            "--listen-host",
            "127.0.0.1",
            "--isolated",
            "--timeout",
            "20",
        ]
        assert run_cli(*argv) == 0
        captured = capsys.readouterr()
        assert "not by the control node" in captured.err
        assert json.loads(captured.out.strip().splitlines()[-1])["imported"] == 1
        assert run_cli(*argv) == 0  # the same link again: stale, nothing done
        assert "not newer" in capsys.readouterr().err
    finally:
        seeding.terminate()
        assert seeding.wait(timeout=20) == 0
    assert len(hashes(member_store, T0, T0 + 7 * DAY)) == 12


SEED_CLI = """
import sys
import threading
from wakustore.cli import archive as archive_cli
from wakustore.cli.main import _Parser
parser = _Parser(prog="wakustore")
archive_cli.register(parser.add_subparsers(dest="command", required=True, parser_class=_Parser))
args = parser.parse_args(["archive", *sys.argv[1:]])
sys.exit(args.handler(args))
"""


@pytest.mark.slow
def test_a_corrupted_piece_never_reaches_the_table(tmp_path, make_store):
    _, control_store = make_store("control")
    member_dir, member_store = make_store("member")
    control = settings(tmp_path)
    put_days(control_store, [0, 1])
    result = node_archive.export_community(control_store, control, T0 + 7 * DAY)
    seeder = seeder_for(control)
    try:
        data = tmp_path / "out" / CID / "data"
        with open(data, "r+b") as f:  # after libtorrent checked it: served as it is now
            f.seek(500)
            byte = f.read(1)
            f.seek(500)
            f.write(bytes([byte[0] ^ 0xFF]))
        with pytest.raises(torrent.TorrentError):
            fetch(member_store, member_dir, seeder, result.magnet, clock=1, stall_timeout_s=4)
    finally:
        seeder.stop()
    assert hashes(member_store, T0, T0 + 7 * DAY) == []
    record = (
        json.loads((member_dir / "archives" / f"{CID}.json").read_text())
        if (member_dir / "archives" / f"{CID}.json").exists()
        else {"imported": [], "last_clock": 0}
    )
    assert record["imported"] == [] and record["last_clock"] == 0


@pytest.mark.slow
def test_an_archive_that_fails_its_checks_is_rejected_whole(tmp_path, make_store):
    """A torrent the control node signed whose archive carries a message on
    a foreign topic: the window is not touched."""
    _, control_store = make_store("control")
    member_dir, member_store = make_store("member")
    control = settings(tmp_path)
    put_days(control_store, [0])
    put_days(member_store, [1], topic_list=TOPICS[:1])
    node_archive.export_community(control_store, control, T0 + 7 * DAY)
    # Re-issue the archive listing one topic fewer than it carries.
    community = tmp_path / "out" / CID
    (entry,) = archive.parse_index(Layout.STATUS_GO, (community / "index").read_bytes())
    original = archive.read_archive(Layout.STATUS_GO, entry, (community / "data").read_bytes(), PUBSUB, None, KEYS)
    items = [
        archive.encode_archived_message(
            Layout.STATUS_GO, m.pubsub_topic, m.message, m.arrival_ns, KEYS.get(m.message.content_topic)
        ).data
        for m in original.messages
    ]
    writer = archive.ArchiveWriter(Layout.STATUS_GO)
    (community / "data").write_bytes(writer.add(archive.Window(T0, T0 + 7 * DAY), TOPICS[:1], items))
    (community / "index").write_bytes(writer.index_bytes())
    before = hashes(member_store, T0, T0 + 7 * DAY)
    got = fetch_edited(control, member_store, member_dir)
    assert list(got.rejected) == [writer.entries[0].archive_id] and got.imported == []
    assert "not the community's" in next(iter(got.rejected.values()))
    assert hashes(member_store, T0, T0 + 7 * DAY) == before != []


# --- an external BitTorrent client ----------------------------------------------------


def ensure_aria2c() -> str:
    """aria2c, installed from Debian when missing; the test fails without it."""
    path = shutil.which("aria2c")
    if path:
        return path
    install = ["apt-get", "install", "-y", "aria2"]
    if subprocess.run(install, capture_output=True).returncode != 0:
        subprocess.run(["apt-get", "update"], capture_output=True)
        subprocess.run(install, capture_output=True)
    path = shutil.which("aria2c")
    if path is None:
        pytest.fail("aria2c is not installed and `apt-get install -y aria2` did not install it")
    return path


@pytest.mark.slow
def test_aria2c_downloads_what_we_seed_byte_for_byte(tmp_path, make_store):
    aria2c = ensure_aria2c()
    _, store = make_store("control")
    put_days(store, [0, 3, 8])
    control = settings(tmp_path)
    node_archive.export_community(store, control, T0 + 14 * DAY)
    seeder = seeder_for(control)
    port = _free_port()
    out = tmp_path / "aria2"
    process = subprocess.Popen(
        [
            aria2c,
            "--enable-dht=false",
            "--enable-dht6=false",
            "--bt-enable-lpd=false",
            "--enable-peer-exchange=false",
            "--bt-exclude-tracker=*",
            f"--listen-port={port}",
            "--seed-time=0",
            "--bt-stop-timeout=30",
            "--check-integrity=true",
            "--file-allocation=none",
            "--summary-interval=0",
            "--console-log-level=warn",
            f"--dir={out}",
            str(control.torrent_path),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        # aria2c is given no peer: the seeder dials it by address.
        deadline = 40
        while process.poll() is None and deadline > 0:
            seeder.handle.connect_peer(("127.0.0.1", port))
            seeder.poll()
            try:
                process.wait(timeout=1)
            except subprocess.TimeoutExpired:
                deadline -= 1
        output = process.communicate(timeout=5)[0].decode(errors="replace")
    finally:
        if process.poll() is None:
            process.kill()
        seeder.stop()
    assert process.returncode == 0, output
    for name in ("data", "index"):
        assert (out / CID / name).read_bytes() == (tmp_path / "out" / CID / name).read_bytes()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_fetch_cli_finds_the_magnet_link_on_a_store_node(tmp_path, engine, cli_store, capsys):
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from store_node_harness import NodeThread, node_config

    _, control_store = cli_store("control")
    member_dir, member_store = cli_store("member")
    put_days(control_store, [0])
    control = settings(tmp_path)
    result = node_archive.export_community(control_store, control, T0 + 7 * DAY)
    node = NodeThread(node_config(tmp_path / "store-node"), engine).start()
    seeder = seeder_for(control)
    try:
        node.service.store.put([(PUBSUB, result.message, 0)])
        code = run_cli(
            "fetch",
            "--data-dir",
            str(member_dir),
            "--community-pubkey",
            PUB.hex(),
            "--peer",
            node.tcp_addr,
            "--pubsub-topic",
            PUBSUB,
            "--chat-id",
            CHATS[0],
            "--chat-id",
            CHATS[1],
            "--seed-peer",
            f"127.0.0.1:{seeder.port}",
            "--listen-host",
            "127.0.0.1",
            "--isolated",
        )
    finally:
        seeder.stop()
        node.stop()
    assert code == 0, capsys.readouterr().err
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["imported"] == 1
    assert len(hashes(member_store, T0, T0 + 7 * DAY)) == 6


@pytest.mark.slow
def test_bench_archive_reports_export_memory_and_hydrate_rate(tmp_path, capsys):

    out = tmp_path / "bench.json"
    args = bench_args(["archive", "--messages", "400", "--days", "14", "--json", str(out)])
    assert args.handler(args) == 0
    report = json.loads(out.read_text())
    assert report["member_matches_control"] and report["export"]["messages"] == report["fetch"]["messages"] == 400
    assert report["export"]["archives"] == 2 and report["export"]["msgs_per_s"] > 0
    assert report["fetch"]["hydrate_msgs_per_s"] > 0 and report["export"]["peak_rss_mb"]["node"] > 0
    assert "export :" in capsys.readouterr().out


# --- stopping ------------------------------------------------------------------------


def test_export_stops_before_its_next_day_when_asked(tmp_path, make_store):
    import threading

    _, store = make_store("control")
    put_days(store, [0, 3, 8])
    control = settings(tmp_path)
    stop = threading.Event()
    stop.set()
    with pytest.raises(node_archive.Stopped):
        node_archive.export_community(store, control, T0 + 14 * DAY, stop=stop)
    assert not control.torrent_path.exists() and not control.state_path.exists()
    assert (tmp_path / "out" / CID / "data").stat().st_size == 0
    # The next export starts from scratch and does it all.
    assert len(node_archive.export_community(store, control, T0 + 14 * DAY).archives) == 2


def _control_node_whose_archives_never_check_out(tmp_path, make_store, node_dir):
    """A control node's archive directory whose data file lost its content
    after the export: libtorrent's check finds every piece missing and the
    torrent never seeds; the last export is old, so the scheduler starts a
    long export (a window per week up to now) at once. Returns the key file."""
    _, history = make_store("history")
    put_days(history, [0, 3])
    control = dataclasses.replace(settings(tmp_path), archive_dir=node_dir / "archives")
    assert node_archive.export_community(history, control, T0 + 7 * DAY).archives
    (control.archive_dir / CID / "data").write_bytes(b"")
    key_file = tmp_path / "community.key"
    key_file.write_text(KEY.hex())
    return key_file


def test_a_node_is_ready_while_its_archives_are_checked_and_stops_at_once(tmp_path, make_store, engine):
    import time

    from wakustore.node.running import running_node

    sys.path.insert(0, str(Path(__file__).parent))
    from store_node_harness import node_config

    node_dir = tmp_path / "node"
    key_file = _control_node_whose_archives_never_check_out(tmp_path, make_store, node_dir)
    config = node_config(
        node_dir, archive_key_file=str(key_file), archive_chat_ids=list(CHATS), archive_listen=LOOPBACK
    )

    async def main():
        with trio.fail_after(60):
            async with running_node(config, engine=engine, mailserver=False, metrics=False, relay=False) as node:
                with trio.fail_after(20):
                    while node.seeder.handle is None or node.seeder.handle.status().state in (
                        torrent.lt.torrent_status.checking_files,
                        torrent.lt.torrent_status.checking_resume_data,
                    ):
                        await trio.sleep(0.05)
                assert not node.seeder.handle.status().is_seeding  # the check found nothing to seed
                leaving = time.monotonic()
        return leaving

    leaving = trio.run(main)
    assert time.monotonic() - leaving < 10


@pytest.mark.slow
def test_serve_stops_on_sigterm_within_10_s_while_seeding_waits_and_an_export_runs(tmp_path, make_store):
    import os
    import signal
    import threading
    import time

    node_dir = tmp_path / "node"
    key_file = _control_node_whose_archives_never_check_out(tmp_path, make_store, node_dir)
    config = tmp_path / "node.toml"
    config.write_text(
        f'archive_key_file = "{key_file}"\narchive_chat_ids = {json.dumps(list(CHATS))}\n'
        f'archive_listen = "{LOOPBACK}"\narchive_layout = "status-go"\n'
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "wakustore",
            "serve",
            "--config",
            str(config),
            "--data-dir",
            str(node_dir),
            "--tcp-port",
            "0",
            "--ws-port",
            "0",
            "--mailserver-port",
            "0",
            "--metrics-port",
            "0",
            "--listen-host",
            "127.0.0.1",
            "--cluster-id",
            "16",
            "--shard",
            "32",
        ],
        stdout=subprocess.PIPE,
        stderr=open(tmp_path / "serve.log", "w"),
        text=True,
        env={**os.environ, "WAKUSTORE_LOG_LEVEL": "WARNING"},
    )
    lines, ready, stopped = [], threading.Event(), threading.Event()

    def pump():
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if line.startswith("wakustore node ready"):
                ready.set()
            if line.startswith("wakustore node stopped"):
                stopped.set()

    threading.Thread(target=pump, daemon=True).start()
    try:
        assert ready.wait(120), lines
        assert any(line.startswith("seeding community archives on port ") for line in lines)
        proc.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        assert stopped.wait(10), lines
        assert proc.wait(timeout=10 - (time.monotonic() - signalled) + 1) == 0
        # It stopped in order, not by the last-resort exit.
        assert "not stopped after" not in (tmp_path / "serve.log").read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# --- worker processes ------------------------------------------------------------------


def test_exports_in_worker_processes_write_the_same_bytes_as_in_this_one(tmp_path, make_store, monkeypatch):
    """Large exports encode in worker processes: the data and index are
    byte for byte (and the torrent's info hash the same as) what the
    calling thread writes alone."""
    _, store = make_store("control")
    put_days(store, range(9), per_day=12)
    written = {}
    for name, pool_min_rows in (("inline", 10**9), ("workers", 1)):
        monkeypatch.setattr(node_archive, "POOL_MIN_ROWS", pool_min_rows)
        monkeypatch.setattr(node_archive, "EXPORT_BATCH_ROWS", 5)  # several batches a day, results in order
        control = settings(tmp_path / name)
        result = node_archive.export_community(store, control, T0 + 14 * DAY)
        assert result.messages == 9 * 12 and len(result.archives) == 2
        community = control.archive_dir / CID
        written[name] = [
            (community / "data").read_bytes(),
            (community / "index").read_bytes(),
            torrent.info_hash(control.torrent_path.read_bytes()),
        ]
    assert written["workers"] == written["inline"]


@pytest.mark.slow
def test_an_import_in_worker_processes_rejects_a_bad_window_whole_and_imports_the_others(
    tmp_path, make_store, monkeypatch
):
    """Archives decoded by worker processes: a window whose archive fails a
    check (a flipped byte in a record) leaves the table as it was, the
    next window is imported, and the member holds exactly the control
    node's messages there."""
    monkeypatch.setattr(node_archive, "POOL_MIN_BYTES", 0)
    _, control_store = make_store("control")
    member_dir, member_store = make_store("member")
    control = settings(tmp_path)
    put_days(control_store, [0, 8])
    put_days(member_store, [1], topic_list=TOPICS[:1])
    node_archive.export_community(control_store, control, T0 + 14 * DAY)
    community = tmp_path / "out" / CID
    first, second = archive.parse_index(Layout.STATUS_GO, (community / "index").read_bytes())
    data = bytearray((community / "data").read_bytes())
    body = data.find(bytes([0, 0]) * 50, first.offset)  # the first message's payload
    assert first.offset < body < first.offset + first.encoded_size
    data[body + 10] ^= 0x01  # no longer the message its hash names
    (community / "data").write_bytes(bytes(data))
    before = hashes(member_store, T0, T0 + 7 * DAY)
    got = fetch_edited(control, member_store, member_dir)
    assert list(got.rejected) == [first.archive_id] and got.imported == [second.archive_id]
    assert hashes(member_store, T0, T0 + 7 * DAY) == before != []
    assert hashes(member_store, T0 + 7 * DAY, T0 + 14 * DAY) == hashes(control_store, T0 + 7 * DAY, T0 + 14 * DAY) != []


def test_read_ahead_gives_the_items_in_order_and_raises_what_the_reader_raised():
    def items():
        yield from range(5)
        raise ValueError("engine gone")

    got = []
    with pytest.raises(ValueError, match="engine gone"):
        for item in node_archive.read_ahead(items()):
            got.append(item)
    assert got == [0, 1, 2, 3, 4]


def test_read_ahead_stops_reading_when_the_caller_stops():
    read = []

    def items():
        for i in range(100):
            read.append(i)
            yield i

    ahead = node_archive.read_ahead(items())
    assert next(ahead) == 0
    ahead.close()  # the thread finishes the item it holds and ends
    assert len(read) <= 3


def test_an_import_stopped_while_a_window_commits_records_that_window_and_no_later_one(tmp_path, make_store):
    """Each window's commit runs while the next window is staged: a stop
    asked then ends the import once that commit has returned, with the
    window in the table and in the member's record, and nothing of the
    windows after it."""
    _, control_store = make_store("control")
    member_dir, member_store = make_store("member")
    control = settings(tmp_path)
    put_days(control_store, [0, 8, 15])
    node_archive.export_community(control_store, control, T0 + 21 * DAY)
    community = control.archive_dir / CID
    entries = archive.parse_index(Layout.STATUS_GO, (community / "index").read_bytes())
    groups = node_archive.archive_windows(entries)
    assert len(groups) == 3
    stop = threading.Event()
    shown = []

    def progress(what, done, total):
        shown.append(done)
        if done == 1:  # the first window recorded, the second one committing
            stop.set()

    record, result = node_archive.MemberRecord(), node_archive.FetchResult()
    record_path = member_dir / "record.json"
    with pytest.raises(node_archive.Stopped):
        node_archive.hydrate(
            member_store,
            community / "data",
            Layout.STATUS_GO,
            groups,
            PUBSUB,
            None,
            KEYS,
            record,
            record_path,
            result,
            stop=stop,
            progress=progress,
        )
    assert shown == [0, 1]
    imported = [e.archive_id for g in groups[:2] for e in g]
    assert result.imported == imported and result.rejected == {}
    assert node_archive.MemberRecord.load(record_path).imported == imported
    assert hashes(member_store, T0, T0 + 14 * DAY) == hashes(control_store, T0, T0 + 14 * DAY) != []
    assert hashes(member_store, T0 + 14 * DAY, T0 + 21 * DAY) == []


@pytest.mark.parametrize("in_process", [True, False], ids=["files-in-place", "engine"])
def test_an_import_whose_commit_fails_raises_and_leaves_no_staged_window(tmp_path, make_store, monkeypatch, in_process):
    """The first window's commit fails while the second window is staged:
    the import raises that error, records no window, and neither window's
    staged files stay, whether staged in the table's partitions (a member
    writing its windows itself) or beside the table (for the engine)."""
    _, control_store = make_store("control")
    member_dir, member_store = make_store("member")
    assert member_store.table.bulk_in_process
    member_store.table.bulk_in_process = in_process
    control = settings(tmp_path)
    put_days(control_store, [0, 8])
    node_archive.export_community(control_store, control, T0 + 14 * DAY)
    community = control.archive_dir / CID
    groups = node_archive.archive_windows(archive.parse_index(Layout.STATUS_GO, (community / "index").read_bytes()))

    staged = []

    def failing_commit(window):
        if in_process:
            files = window.source.paths
        else:
            files = list(Path(window.source).iterdir())  # staged on disk (threshold 0), not in memory
        assert files and all(f.exists() for f in files)
        staged.append(files)
        raise RuntimeError("engine gone")

    monkeypatch.setattr(staging, "STAGING_THRESHOLD_BYTES", 0)

    monkeypatch.setattr(member_store, "commit_window", failing_commit)
    record, result = node_archive.MemberRecord(), node_archive.FetchResult()
    with pytest.raises(RuntimeError, match="engine gone"):
        node_archive.hydrate(
            member_store,
            community / "data",
            Layout.STATUS_GO,
            groups,
            PUBSUB,
            None,
            KEYS,
            record,
            member_dir / "record.json",
            result,
        )
    assert len(staged) == 1 and record.imported == [] and result.imported == []
    assert not any(f.exists() for f in staged[0])
    staging_dir = Path(member_store.table.uri.removeprefix("file://").rstrip("/") + "_staging")
    assert not staging_dir.exists() or list(staging_dir.iterdir()) == []
    assert hashes(member_store, T0, T0 + 14 * DAY) == []


def test_import_workers_are_as_many_as_asked_up_to_one_a_core(monkeypatch):
    entry = archive.IndexEntry(
        archive_id="a", start_ns=0, end_ns=1, content_topics=(TOPICS[0],), offset=0, size=1000, padding=0
    )
    monkeypatch.setattr(node_archive, "POOL_MIN_BYTES", 10**9)
    with node_archive.import_workers([[entry]], 2) as small:
        assert small.processes == 0  # decoded in the calling thread
    monkeypatch.setattr(node_archive, "POOL_MIN_BYTES", 0)
    monkeypatch.setattr(node_archive.archive_work, "default_processes", lambda: 2)
    for asked, started in ((1, 1), (2, 2), (4, 2)):
        with node_archive.import_workers([[entry]], asked) as workers:
            assert workers.processes == started


def test_a_worker_process_keeps_its_heap_between_tasks_and_the_calling_process_does_not():
    """Workers reuse their freed heap for the next archive (no page faults
    anew for each); a task run in the node's own process (a small import)
    gives its heap back after it."""
    from wakustore.node import archive_work

    probe = "__import__('wakustore.node.archive_work', fromlist=['_keep_heap'])._keep_heap"
    with archive_work.Workers(1) as workers:
        workers.submit("probe", eval, probe)
        assert workers.take() == ("probe", True)
    assert archive_work._keep_heap is False
