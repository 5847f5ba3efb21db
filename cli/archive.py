"""``wakustore archive``: export, seed, fetch and verify community history
archives (the work is in :mod:`wakustore.node.archive` and
:mod:`wakustore.clients.archive`).

``export`` prints progress on stderr and the magnet link on its last
stdout line; ``seed`` prints the magnet link and seeds until SIGINT or
SIGTERM; ``fetch`` prints progress on stderr and one JSON summary line,
exit 1 when the torrent cannot be fetched or an archive was rejected;
``verify`` prints one line per problem (exit 1) or ``ok ...``.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from wakustore.cli.progress import Stages
from wakustore.protocols.errors import ArchiveError, ProtocolError
from wakustore.usage import UsageError, parse_hex

# protocols.archive_records.Layout, protocols.archive.DEFAULT_LAYOUT and
# transport.torrent.DEFAULT_STALL_TIMEOUT_S as literals: building the
# parser loads none of the archive code (a test keeps them equal).
LAYOUTS = ("status-go", "spec")
DEFAULT_LAYOUT = "status-go"
DEFAULT_STALL_TIMEOUT_S = 120.0


def _stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def register(commands: argparse._SubParsersAction) -> None:
    """Add ``wakustore archive export|seed|fetch|verify``."""
    parser = commands.add_parser("archive", help="community history archives over BitTorrent")
    verbs = parser.add_subparsers(dest="verb", required=True, parser_class=commands._parser_class)
    layouts = list(LAYOUTS)

    export = verbs.add_parser("export", help="control node: archive the windows since the last export")
    _store_flags(export)
    export.add_argument("--community-key", type=Path, required=True, help="file holding the 32-byte private key, hex")
    export.add_argument(
        "--chat-id",
        action="append",
        required=True,
        dest="chat_ids",
        help="channel id inside the community (repeatable; '' = the community's own topic)",
    )
    export.add_argument("--archive-dir", type=Path, required=True, help="where the community's archives go (required)")
    export.add_argument("--layout", choices=layouts, default=DEFAULT_LAYOUT)
    export.add_argument("--now", type=int, help="Unix seconds (default: now)")
    export.add_argument(
        "--tracker",
        action="append",
        dest="trackers",
        help="announce URL (repeatable; default: status-go's two UDP trackers)",
    )
    export.add_argument("--no-trackers", action="store_true", help="announce to no tracker (DHT and peers by address)")
    export.set_defaults(handler=_cmd_export)

    seed = verbs.add_parser("seed", help="seed a community's latest torrent until SIGINT/SIGTERM")
    seed.add_argument("--archive-dir", type=Path, required=True, help="where export wrote the archives (required)")
    seed.add_argument("--community-pubkey", required=True, help="33- or 65-byte public key, hex")
    _torrent_flags(seed)
    seed.set_defaults(handler=_cmd_seed)

    fetch = verbs.add_parser("fetch", help="member: fetch missing archives and hydrate the table")
    _store_flags(fetch)
    fetch.add_argument("--community-pubkey", required=True, help="33- or 65-byte public key, hex")
    source = fetch.add_mutually_exclusive_group()
    source.add_argument("--peer", help="store node to ask for magnet-link messages (multiaddr with /p2p/)")
    source.add_argument("--magnet", help="magnet link to fetch (default: newest signed link in the local store)")
    which = fetch.add_mutually_exclusive_group()
    which.add_argument(
        "--all", action="store_const", const="all", dest="mode", help="every archive of the torrent (the default)"
    )
    which.add_argument(
        "--latest", action="store_const", const="latest", dest="mode", help="only the newest archive (a 7-day window)"
    )
    fetch.add_argument("--from", type=int, dest="from_s", help="Unix seconds, with --to: windows overlapping the range")
    fetch.add_argument("--to", type=int, dest="to_s", help="Unix seconds, exclusive")
    fetch.add_argument("--seed-peer", action="append", default=[], dest="seed_peers", help="HOST:PORT (repeatable)")
    fetch.add_argument("--layout", choices=layouts, default=DEFAULT_LAYOUT)
    fetch.add_argument(
        "--chat-id",
        action="append",
        dest="chat_ids",
        help="the community's channels (repeatable): only their messages are accepted, and their "
        "keys rebuild what a status-go archive holds decrypted (default: the topics each "
        "archive lists, decrypted records refused)",
    )
    fetch.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_STALL_TIMEOUT_S,
        help="give up after this many seconds without data",
    )
    _torrent_flags(fetch)
    fetch.set_defaults(handler=_cmd_fetch)

    verify = verbs.add_parser("verify", help="check a data/index/torrent set")
    verify.add_argument("dir", type=Path, help="an archive directory, or one community's directory in it")
    verify.add_argument("--layout", choices=layouts, help="default: from the export state, else status-go")
    verify.set_defaults(handler=_cmd_verify)


def _store_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data-dir", type=Path, required=True, help="the node's data directory (required)")
    parser.add_argument("--config", type=Path, help="node TOML configuration (engine, shards)")
    parser.add_argument(
        "--engine", help="'sail' (embedded, the default), 'spark' (embedded Apache Spark with Delta) or sc://host:port"
    )
    parser.add_argument("--pubsub-topic", help="the community's shard (default: the node's first shard)")


def _torrent_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--port", type=int, default=0, help="BitTorrent listen port (default: any)")
    parser.add_argument("--listen-host", default="0.0.0.0")
    parser.add_argument("--isolated", action="store_true", help="no DHT, LSD, UPnP or NAT-PMP: peers by address only")


def _cmd_export(args: argparse.Namespace) -> int:
    from wakustore.node.archive import ArchiveSettings, export_community
    from wakustore.protocols.archive import MAX_ARCHIVE_PAYLOAD
    from wakustore.protocols.archive_records import Layout
    from wakustore.protocols.crypto import private_key_from_bytes
    from wakustore.transport import torrent

    try:
        key = parse_hex(args.community_key.read_text().strip(), "--community-key")
    except OSError as exc:
        raise UsageError(f"--community-key: {exc}") from None
    private_key_from_bytes(key)
    config, stop = _open_store(args)
    settings = ArchiveSettings(
        community_key=key,
        chat_ids=tuple(args.chat_ids),
        archive_dir=args.archive_dir,
        pubsub_topic=_pubsub_topic(args, config),
        layout=Layout(args.layout),
        trackers=() if args.no_trackers else tuple(args.trackers or torrent.DEFAULT_TRACKERS),
    )
    try:
        with Stages() as stages:
            result = export_community(
                config.store,
                settings,
                args.now if args.now is not None else int(time.time()),
                stages.line,
                progress=stages.count,
            )
    finally:
        stop()
    _stderr(
        f"{len(result.archives)} new archive(s), {result.messages} messages, {result.dropped} dropped "
        f"(over {MAX_ARCHIVE_PAYLOAD} bytes)"
    )
    if result.magnet:
        print(result.magnet, flush=True)
    return 0


def _cmd_seed(args: argparse.Namespace) -> int:
    import trio

    from wakustore.protocols import topics

    cid = topics.community_id(parse_hex(args.community_pubkey, "--community-pubkey"))
    path = args.archive_dir / f"{cid}.torrent"
    if not path.exists():
        _stderr(f"wakustore: error: no torrent at {path}")
        return 1
    trio.run(_seed_main, args, path.read_bytes())
    return 0


async def _seed_main(args: argparse.Namespace, torrent_bytes: bytes) -> None:
    import trio

    from wakustore.node.archive import SEED_POLL_S
    from wakustore.transport import torrent

    seeder = torrent.Seeder(torrent.open_session(f"{args.listen_host}:{args.port}", args.isolated))
    await trio.to_thread.run_sync(seeder.seed, torrent_bytes, args.archive_dir)
    _stderr(f"seeding {torrent.info_hash(torrent_bytes)} on port {seeder.port}")
    print(torrent.magnet_uri(torrent_bytes), flush=True)
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:

            async def poll() -> None:
                while True:
                    await trio.sleep(SEED_POLL_S)
                    seeder.poll()

            nursery.start_soon(poll)
            async for _ in signals:
                nursery.cancel_scope.cancel()
                break
    seeder.stop()


def _cmd_fetch(args: argparse.Namespace) -> int:
    import trio

    from wakustore.clients.archive import magnets_from_peer
    from wakustore.node.archive import Selection, fetch_archives, magnets_in_store, newest_magnet
    from wakustore.protocols import topics
    from wakustore.protocols.archive_records import Layout
    from wakustore.transport import torrent

    public_key = parse_hex(args.community_pubkey, "--community-pubkey")
    cid = topics.community_id(public_key)
    if (args.from_s is None) != (args.to_s is None):
        raise UsageError("--from and --to go together")
    mode = "range" if args.from_s is not None else (args.mode or "all")
    try:
        peers = [torrent.parse_host_port(p) for p in args.seed_peers]
    except ValueError as exc:
        raise UsageError(f"--seed-peer: {exc}") from None
    config, stop = _open_store(args)
    try:
        pubsub_topic = _pubsub_topic(args, config)
        magnet, clock = args.magnet, None
        if magnet is None:
            if args.peer:
                payloads = trio.run(magnets_from_peer, args.peer, public_key, pubsub_topic)
            else:
                payloads = magnets_in_store(config.store, public_key, pubsub_topic)
            link = newest_magnet(payloads, public_key, _stderr)
            if link is None:
                _stderr(f"no magnet link signed by {cid} among {len(payloads)} message(s)")
                return 1
            magnet, clock = link.magnet_uri, link.clock
        chat_ids = args.chat_ids or []
        allowed = [topics.channel_content_topic(public_key, c) for c in chat_ids] if chat_ids else None
        try:
            with Stages() as stages:
                result = fetch_archives(
                    config.store,
                    config.data_dir,
                    public_key,
                    magnet,
                    clock=clock,
                    selection=Selection(mode, args.from_s, args.to_s),
                    layout=Layout(args.layout),
                    peers=peers,
                    session=torrent.open_session(f"{args.listen_host}:{args.port}", args.isolated),
                    default_pubsub_topic=pubsub_topic,
                    allowed_topics=allowed,
                    chat_ids=chat_ids,
                    stall_timeout_s=args.timeout,
                    report=stages.line,
                    progress=stages.count,
                    import_processes=config.import_processes,
                )
        except (torrent.TorrentError, ArchiveError, ProtocolError) as exc:
            _stderr(f"wakustore: error: {exc}")
            return 1
    finally:
        stop()
    if result.ignored:
        _stderr(f"nothing to do: {result.ignored}")
        return 0
    print(
        json.dumps(
            {
                "imported": len(result.imported),
                "windows": result.windows,
                "messages": result.messages,
                "rejected": result.rejected,
                "pieces_downloaded": len(result.downloaded_pieces),
            }
        ),
        flush=True,
    )
    return 1 if result.rejected else 0


def _cmd_verify(args: argparse.Namespace) -> int:
    from wakustore.clients.archive import verify_archive_set
    from wakustore.protocols.archive_records import Layout

    layout = Layout(args.layout) if args.layout else None
    if (args.dir / "index").exists() or (args.dir / "data").exists():
        dirs = [args.dir]
    else:
        dirs = sorted(p.with_suffix("") for p in args.dir.glob("*.torrent"))
    if not dirs:
        print(f"{args.dir}: no archive set found")
        return 1
    failed = False
    for community_dir in dirs:
        problems, summary = verify_archive_set(community_dir, layout)
        for problem in problems:
            print(f"{community_dir.name}: {problem}")
        if not problems:
            print(f"ok {summary}")
        failed = failed or bool(problems)
    return 1 if failed else 0


@dataclass
class _OpenStore:
    data_dir: Path
    store: object
    shards: list[int]
    cluster_id: int
    import_processes: int = 1


def _open_store(args: argparse.Namespace) -> tuple[_OpenStore, Callable[[], None]]:
    """The node's store for a command, and how to close it (tests swap this
    for a store on a shared engine). Both commands that open it write the
    data dir (export stores its magnet link, fetch hydrates the table, and
    opening replays the write-ahead log), so the writer lock is taken first
    and held until ``stop``."""
    from wakustore.node import config as node_config
    from wakustore.node import data_dir
    from wakustore.node.store_service import open_store

    config = node_config.load(args.config, {"data_dir": args.data_dir, "engine": args.engine})
    held = data_dir.lock(config.data_dir)
    try:
        engine, store = open_store(config)
    except BaseException:
        held.release()
        raise

    def stop() -> None:
        try:
            store.close()
        finally:
            try:
                engine.close()
            finally:
                held.release()

    return _OpenStore(config.data_dir, store, config.shards, config.cluster_id, config.archive_import_workers), stop


def _pubsub_topic(args: argparse.Namespace, config: _OpenStore) -> str:
    from wakustore.node.archive import DEFAULT_PUBSUB_TOPIC
    from wakustore.protocols import topics

    if args.pubsub_topic:
        return args.pubsub_topic
    if config.shards:
        return topics.shard_pubsub_topic(config.cluster_id, config.shards[0])
    return DEFAULT_PUBSUB_TOPIC
