"""``wakustore bench archive``: the community history archive benchmark.

On a seeded community (``--messages`` messages on ``--channels`` channels,
payloads of 100 B to 2 KiB of random bytes, by default all sealed with
the channel key and signed (Waku v1 symmetric, as Status sends channel
messages), timestamps spread evenly over ``--days`` days ending now, one
pubsub topic):

1. ingest into a control node's table (put and flush in batches), as the
   node would have stored them;
2. export: every window into ``data``, ``index`` and the torrent, the
   magnet-link message into the store (:func:`archive.export_community`);
3. fetch: the control node's store closed (its memory is not the
   member's), a member on the same engine fetches the magnet link over
   loopback BitTorrent from a seeder in this process (download) and
   checks and replaces every window in its table (hydrate).

Reported (``--json`` for the whole report): export seconds and messages
per second, data size, archives; download seconds; hydrate seconds and
messages per second; peak resident memory of this process and of the
engine during export and during fetch; and whether the member's table
holds exactly the control node's messages.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from wakustore import allocator
from wakustore.bench.common import add_common_arguments, positive_int
from wakustore.bench.store import RssSampler
from wakustore.node import archive as node_archive
from wakustore.node import config as node_config
from wakustore.protocols import archive, topics, waku_v1
from wakustore.protocols.archive_records import Layout
from wakustore.protocols.crypto import keccak256, sign_recoverable
from wakustore.protocols.message import WakuMessage
from wakustore.transport import torrent

DEFAULT_MESSAGES = 100_000
DEFAULT_DAYS = 28  # four status-go windows
DEFAULT_CHANNELS = 10
DEFAULT_SEALED_SHARE = 1.0
PAYLOAD_MIN, PAYLOAD_MAX = 100, 2048  # as the storage benchmark's dataset
BATCH = 5000
PUBSUB_TOPIC = topics.shard_pubsub_topic(topics.STATUS_CLUSTER_ID, 32)
SAMPLE_S = 0.25
MIB = 1024 * 1024
NS = 1_000_000_000


def register_verb(verbs: argparse._SubParsersAction) -> None:
    bench = verbs.add_parser("archive", help="community history archive export, fetch and hydrate benchmark")
    bench.add_argument(
        "--messages",
        type=positive_int,
        default=DEFAULT_MESSAGES,
        help=f"messages in the community (default {DEFAULT_MESSAGES})",
    )
    bench.add_argument("--days", type=positive_int, default=DEFAULT_DAYS)
    bench.add_argument("--channels", type=positive_int, default=DEFAULT_CHANNELS)
    bench.add_argument("--layout", choices=[layout.value for layout in Layout], default=archive.DEFAULT_LAYOUT.value)
    bench.add_argument(
        "--sealed-share",
        type=float,
        default=DEFAULT_SEALED_SHARE,
        help="share of payloads sealed with the channel key and signed, as Status sends them "
        f"(default {DEFAULT_SEALED_SHARE}); the rest are opaque bytes",
    )
    bench.add_argument(
        "--cold-export",
        action="store_true",
        help="export without the signers a control node works out as messages come in "
        "(every signer recovered during the export)",
    )
    add_common_arguments(bench, "where the tables and archives go (default: a temporary directory)")
    bench.set_defaults(handler=run_archive_bench)


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


class PeakMemory:
    """Peak resident memory (sampled) of this process, apart: anonymous
    memory (heap, Arrow buffers, libtorrent's own buffers) and file pages
    mapped into it (libtorrent's memory-mapped disk I/O, shared libraries),
    which the kernel reclaims under pressure; of the worker processes an
    export or import starts; and of the engine. Current RSS each sample,
    not the high-water mark, so that one stage's peak is its own."""

    def __init__(self, engine) -> None:
        self.engine = RssSampler(engine)
        self.peaks = {"node": 0, "node_anon": 0, "node_file": 0, "workers": 0, "engine": 0}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="bench-rss", daemon=True)

    def __enter__(self) -> PeakMemory:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    def _loop(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            self._sample()

    def _sample(self) -> None:
        import psutil

        status = _status(os.getpid())
        anon, file = status.get("RssAnon", 0), status.get("RssFile", 0) + status.get("RssShmem", 0)
        try:
            engine_pids = set(self.engine._pids())
        except Exception:
            engine_pids = set()
        engine = sum(_status(pid).get("VmRSS", 0) for pid in engine_pids)
        try:
            children = psutil.Process().children(recursive=True)
        except psutil.Error:
            children = []
        workers = sum(_status(c.pid).get("VmRSS", 0) for c in children if c.pid not in engine_pids)
        for name, value in (
            ("node", anon + file + workers),
            ("node_anon", anon),
            ("node_file", file),
            ("workers", workers),
            ("engine", engine),
        ):
            self.peaks[name] = max(self.peaks[name], value)

    def figures(self) -> dict:
        return {name: round(value / MIB, 1) for name, value in self.peaks.items()}


def _status(pid: int) -> dict[str, int]:
    """The memory lines of /proc/<pid>/status in bytes; empty when gone."""
    found = {}
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith(("VmRSS:", "RssAnon:", "RssFile:", "RssShmem:")):
                    name, value = line.split(":", 1)
                    found[name] = int(value.split()[0]) * 1024
    except (OSError, ValueError):
        pass
    return found


def run_archive_bench(args: argparse.Namespace) -> int:
    from wakustore.node.store_service import open_store

    base = Path(tempfile.mkdtemp(prefix="wakustore-bench-archive-")) if args.data_dir is None else args.data_dir
    config = node_config.load(args.config, {"engine": args.engine, "data_dir": base / "control"})
    member_config = node_config.load(args.config, {"engine": args.engine, "data_dir": base / "member"})
    key = random.Random(args.seed).randbytes(32)
    chat_ids = tuple(f"channel-{i}" for i in range(args.channels))
    now_s = int(time.time())
    settings = node_archive.ArchiveSettings(
        community_key=key,
        chat_ids=chat_ids,
        archive_dir=base / "archives",
        pubsub_topic=PUBSUB_TOPIC,
        layout=Layout(args.layout),
        trackers=(),
        listen="127.0.0.1:0",
        isolated=True,
    )
    report: dict = {
        "messages": args.messages,
        "days": args.days,
        "channels": args.channels,
        "layout": args.layout,
        "sealed_share": args.sealed_share,
        "machine": {"cpus": os.cpu_count(), "load_before": _load()},
    }
    engine, control = open_store(config)
    try:
        _, member = open_store(member_config, engine)
        try:
            _say(f"ingesting {args.messages} messages over {args.days} days ...")
            started = time.monotonic()
            _ingest(control, settings, args, now_s)
            report["ingest_s"] = round(time.monotonic() - started, 2)
            if not args.cold_export:
                # A live control node does this every few minutes as its
                # channels' messages come in (run_archive_scheduler).
                _say("working out the signers (done as messages come in on a live node) ...")
                started = time.monotonic()
                node_archive.prepare_signers(control, settings, now_s)
                report["signers_s"] = round(time.monotonic() - started, 2)

            _say("exporting ...")
            with PeakMemory(engine) as memory:
                started = time.monotonic()
                exported = node_archive.export_community(control, settings, now_s)
                export_s = time.monotonic() - started
            data_size = (settings.archive_dir / settings.community_id / "data").stat().st_size
            report["export"] = {
                "seconds": round(export_s, 2),
                "msgs_per_s": round(exported.messages / export_s),
                "messages": exported.messages,
                "archives": len(exported.archives),
                "windows": len(exported.windows),
                "data_mb": round(data_size / MIB, 1),
                "peak_rss_mb": memory.figures(),
            }

            # The member is measured as a member node: the control node's
            # store (its key index, recent keys, hot tier) is closed and its
            # freed heap given back before the fetch. It shares the engine.
            control.close()
            # None from here: the finally below does not close it again.
            control = None  # type: ignore[assignment]
            allocator.trim_heap()
            _say("seeding and fetching over loopback BitTorrent ...")
            seeder = torrent.Seeder(torrent.open_session("127.0.0.1:0", isolated=True))
            try:
                node_archive.seed_latest(seeder, settings)
                with PeakMemory(engine) as memory:
                    fetched = node_archive.fetch_archives(
                        # None when the export made no archive: fetch_archives is then handed None.
                        member,
                        member_config.data_dir,
                        settings.public_key,
                        exported.magnet,  # type: ignore[arg-type]
                        layout=Layout(args.layout),
                        peers=[("127.0.0.1", seeder.port)],
                        session=torrent.open_session("127.0.0.1:0", isolated=True),
                        default_pubsub_topic=PUBSUB_TOPIC,
                        chat_ids=chat_ids,
                        report=_say,
                        import_processes=member_config.archive_import_workers,
                    )
            finally:
                seeder.stop()
            report["fetch"] = {
                "download_s": round(fetched.download_s, 2),
                "download_mb_per_s": round(data_size / MIB / fetched.download_s, 1) if fetched.download_s else None,
                "hydrate_s": round(fetched.hydrate_s, 2),
                "hydrate_msgs_per_s": round(fetched.messages / fetched.hydrate_s) if fetched.hydrate_s else None,
                "messages": fetched.messages,
                "archives": len(fetched.imported),
                "rejected": len(fetched.rejected),
                "peak_rss_mb": memory.figures(),
            }
            report["member_matches_control"] = fetched.messages == exported.messages and not fetched.rejected
        finally:
            member.close()
    finally:
        try:
            if control is not None:
                control.close()
        finally:
            engine.close()
            if args.data_dir is None:
                shutil.rmtree(base, ignore_errors=True)
    report["machine"]["load_after"] = _load()
    _print(report)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0 if report["member_matches_control"] else 1


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _ingest(store, settings: node_archive.ArchiveSettings, args: argparse.Namespace, now_s: int) -> None:
    """Messages spread evenly over the days before ``now_s``, seeded."""
    rng = random.Random(args.seed)
    content_topics = settings.content_topics
    keys = settings.channel_keys
    senders = [rng.randbytes(32) for _ in range(100)]
    span_ns = args.days * 86400 * NS
    start_ns = now_s * NS - span_ns
    batch = []
    for i in range(args.messages):
        ts = start_ns + span_ns * i // args.messages
        topic = content_topics[rng.randrange(len(content_topics))]
        payload = rng.randbytes(rng.randint(PAYLOAD_MIN, PAYLOAD_MAX))
        if rng.random() < args.sealed_share:
            payload = _seal(rng, payload, keys[topic], senders[rng.randrange(len(senders))])
        message = WakuMessage(payload=payload, content_topic=topic, version=1, timestamp=ts)
        batch.append((PUBSUB_TOPIC, message, ts + rng.randrange(NS)))
        if len(batch) == BATCH:
            store.put(batch)
            store.flush()
            batch = []
    if batch:
        store.put(batch)
    store.flush()


def _seal(rng: random.Random, payload: bytes, key: bytes, sender: bytes) -> bytes:
    """waku_v1.encrypt_symmetric's output (signed, random padding to a
    multiple of 256 bytes), with the faster AES-GCM of ``cryptography``:
    a million messages take a minute less to generate."""
    size = len(payload).to_bytes(max(1, (len(payload).bit_length() + 7) // 8), "little")
    plain = bytes([len(size) | waku_v1.FLAG_SIGNED]) + size + payload
    plain += rng.randbytes(waku_v1.PADDING_BLOCK - (len(plain) + waku_v1.SIGNATURE_SIZE) % waku_v1.PADDING_BLOCK)
    plain += sign_recoverable(sender, keccak256(plain))
    nonce = rng.randbytes(waku_v1.AES_NONCE_SIZE)
    return AESGCM(key).encrypt(nonce, plain, None) + nonce


def _print(report: dict) -> None:
    export, fetch = report["export"], report["fetch"]
    print(
        f"{report['messages']} messages, {report['days']} days, {report['channels']} channels, "
        f"{report['layout']} layout, {report['sealed_share']:.0%} sealed (ingest {report['ingest_s']} s)"
    )
    if "signers_s" in report:
        print(f"signers: {report['signers_s']} s, worked out ahead of the export (as messages come in)")
    else:
        print("signers: recovered during the export (--cold-export)")
    print(
        f"export : {export['seconds']} s, {export['msgs_per_s']} msg/s, {export['archives']} archives in "
        f"{export['windows']} windows, {export['data_mb']} MB; {_memory(export['peak_rss_mb'])}"
    )
    print(
        f"fetch  : download {fetch['download_s']} s ({fetch['download_mb_per_s']} MB/s), hydrate "
        f"{fetch['hydrate_s']} s ({fetch['hydrate_msgs_per_s']} msg/s); {_memory(fetch['peak_rss_mb'])}"
    )
    print(f"member table matches the control node: {report['member_matches_control']}")
    load = report["machine"].get("load_before"), report["machine"].get("load_after")
    print(f"load average (1, 5, 15 min) before {load[0]}, after {load[1]} on {report['machine']['cpus']} CPUs")


def _memory(peaks: dict) -> str:
    return (
        f"peak RSS node {peaks['node']} MB (anonymous {peaks['node_anon']}, file-backed {peaks['node_file']}, "
        f"workers {peaks['workers']}), engine {peaks['engine']} MB, "
        f"node + engine {round(peaks['node'] + peaks['engine'], 1)} MB"
    )
