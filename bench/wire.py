"""``wakustore bench wire``: Store v3 queries per second over libp2p.

What it measures:

1. Loading: ``--messages`` slots of the storage benchmark's dataset
   (:mod:`wakustore.bench.dataset`: 1,000 content topics on 8 shards
   of cluster 16, 30 days ending now, a tenth re-sends) go straight
   through :meth:`MessageStore.put` and :meth:`MessageStore.flush` in
   batches of the configured flush size, then a compaction and a
   checkpoint, as the node's maintenance leaves finished days. No
   lightpush: loading is not what is measured.
2. Serving: the node as ``wakustore serve`` runs it (store service,
   libp2p host with the Store v3 handler, TCP on loopback), in this
   process, with no per-peer rate limit.
3. Querying, for each level of ``--clients`` (e.g. ``1,4``): N clients,
   each its own libp2p host (own key, own TCP connection, Noise session
   and yamux), all in one client process of their own so that their
   decoding does not share the server's interpreter. Closed loop: a
   client sends its next query as soon as the previous answer is read.
   The query mix is the storage benchmark's (:func:`wakustore.bench.store.page_specs`):
   Store v3 pages of 20 messages, 1-3 content topics of one shard, time
   ranges of one hour, one day and seven days anywhere in the data and the
   last hour (``now-1h``, what a client catching up asks most), forward
   and backward; each first page is followed by the page at its cursor
   when there is one (js-waku's paging); ``--shapes`` keeps some time ranges
   only (``now-1h`` alone: every page from the hot tier, so what is left is
   the cost of the wire). ``--mix status-go`` replays status-go's Store
   traffic instead (:mod:`wakustore.bench.status_go_mix`: presence checks
   of 50 hashes without data, hash-first backfill, 24-hour history pages
   of 50, community descriptions; its proportions and their sources are
   there). A level runs about ``--queries`` timed queries (split between
   its clients) after a warm-up.
4. The same first pages straight on the store service (no wire), to show
   what the protocol stack adds.
5. With ``--hostile``: each level runs a second time while a hostile
   process (:mod:`wakustore.bench.hostile`) plays ``--hostile-hosts``
   remote hosts on other loopback addresses, each dialing with fresh keys
   past the per-address cap, flooding queries, hoarding unwritten streams
   and stalling handshakes. The node runs with its default connection
   caps except the per-address one, raised to the number of well-behaved
   clients (they all dial from 127.0.0.1). A level then also reports
   ``hostile`` (the well-behaved clients' figures under that load, and
   what the hostile process saw).

The JSON report (``--json``) holds ``messages``, ``unique_messages``,
``ingest_msgs_per_s``, ``load_s``, ``client_mode``, ``direct_p50_ms``,
``direct_p99_ms``, ``direct_per_shape`` (``{n, p50_ms, cpu_ms}`` of the
mix's first pages on the store service, one at a time) and ``levels``: per client count ``clients``,
``queries``, ``errors`` (answers other than 200), ``qps`` (timed queries
over the level's wall time), ``node_cpu_ms_per_query`` (user + system CPU
of the node's process, every thread, over the timed interval, divided by
the timed queries; the engine's server process is not counted, pages do
not go through it), ``client_cpu_ms_per_query`` (the same for the client
process: both share the machine's cores), ``p50_ms``, ``p99_ms`` and
``per_shape`` (``{n, qps, p50_ms, p99_ms}`` for ``1h/first``, ``7d/cursor``,
``presence/50/first``, ...). Under ``--hostile`` the node's CPU also pays for the hostile load.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import pickle
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, cast

import trio

from wakustore.bench import dataset as bench_dataset
from wakustore.bench.common import add_common_arguments, positive_int, run_client_process
from wakustore.cli.progress import Progress
from wakustore.node import config as node_config
from wakustore.node.process import configure_node_process
from wakustore.usage import UsageError

if TYPE_CHECKING:
    from wakustore.bench.status_go_mix import MixQuery
    from wakustore.bench.store import PageSpec

DEFAULT_MESSAGES = 1_000_000
DEFAULT_CLIENTS = (1, 4)
DEFAULT_QUERIES = 400
# Untimed first pages per client before a level's clock starts: the first
# queries pay for connection set-up and the engine's cold caches.
WARMUP_PAGES = 3
# Direct (no wire) first pages timed on the store service (~20 of each status-go shape).
DIRECT_PAGES = 300
# One level's client process: interpreter start, dials, every query.
CLIENT_TIMEOUT_S = 1800
MIB = 1024 * 1024
# The hostile load starts first, so the clients meet it at full strength.
HOSTILE_HEAD_START_S = 3.0
MIXES = ("pages", "status-go")
CLIENT_MODE = (
    "one libp2p host per client (own key, TCP connection, Noise, yamux), "
    "all clients in one process apart from the node's, closed loop"
)


def register_verb(verbs: argparse._SubParsersAction) -> None:
    verb = verbs.add_parser("wire", help="Store v3 queries per second and latency over libp2p")
    verb.add_argument(
        "--clients",
        type=_client_levels,
        default=DEFAULT_CLIENTS,
        help="concurrent clients, comma-separated levels run in turn (default 1,4)",
    )
    verb.add_argument(
        "--messages",
        type=positive_int,
        default=DEFAULT_MESSAGES,
        help=f"dataset slots loaded, re-sends included (default {DEFAULT_MESSAGES:,})",
    )
    verb.add_argument(
        "--days",
        type=positive_int,
        default=bench_dataset.DatasetSpec.days,
        help=f"days the dataset spans, ending now (default {bench_dataset.DatasetSpec.days})",
    )
    verb.add_argument(
        "--queries",
        type=positive_int,
        default=DEFAULT_QUERIES,
        help=f"timed queries per level, split between its clients (default {DEFAULT_QUERIES})",
    )
    verb.add_argument(
        "--shapes",
        type=_shapes,
        default=None,
        help="only these time ranges, comma-separated, of "
        + ", ".join(_range_names())
        + " (default all; now-1h alone is answered from the hot tier: the wire's own cost)",
    )
    verb.add_argument(
        "--mix",
        choices=MIXES,
        default="pages",
        help="pages: the storage benchmark's pages of 20 (default); status-go: the Store traffic "
        "of status-go clients (presence checks by hash, backfill, 24-hour history, community "
        "descriptions; see wakustore.bench.status_go_mix)",
    )
    verb.add_argument(
        "--table-of",
        type=Path,
        default=None,
        help="query the table of this data dir, which bench store --data-dir filled, as it is "
        "(its dataset from there; nothing loaded)",
    )
    verb.add_argument(
        "--hostile", action="store_true", help="run each level again alongside a hostile load and report both"
    )
    verb.add_argument(
        "--hostile-hosts", type=positive_int, default=4, help="remote hosts the hostile load plays (default 4)"
    )
    add_common_arguments(verb, "where the table goes (must be empty; default: a temporary directory, removed)")
    verb.set_defaults(handler=run_wire_bench)


def _client_levels(text: str) -> tuple[int, ...]:
    levels = tuple(dict.fromkeys(positive_int(part.strip()) for part in text.split(",") if part.strip()))
    if not levels:
        raise argparse.ArgumentTypeError("expected client counts such as 1,4")
    return levels


def _range_names() -> list[str]:
    from wakustore.bench.store import RANGES

    return list(RANGES)


def _shapes(text: str) -> frozenset[str]:
    names = frozenset(part.strip() for part in text.split(",") if part.strip())
    unknown = sorted(names - set(_range_names()))
    if not names or unknown:
        raise argparse.ArgumentTypeError(
            f"expected time ranges among {', '.join(_range_names())}"
            + (f"; not {', '.join(unknown)}" if unknown else "")
        )
    return names


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def run_wire_bench(args: argparse.Namespace, engine=None) -> int:
    """Run the benchmark; on ``engine`` (started, left running) when given,
    else on a new engine as configured."""

    table_of = getattr(args, "table_of", None)
    if table_of is not None and args.data_dir is not None:
        raise UsageError("--table-of and --data-dir: give one")
    if args.data_dir is not None and args.data_dir.exists() and any(args.data_dir.iterdir()):
        raise UsageError(f"--data-dir {args.data_dir} is not empty (the benchmark creates a fresh table)")
    kept = None
    if table_of is not None:
        kept = bench_dataset.load_spec(table_of)
        if kept is None:
            raise UsageError(
                f"--table-of {table_of}: no {bench_dataset.SPEC_FILE} there "
                "(a data dir that bench store --data-dir filled)"
            )
    if getattr(args, "mix", "pages") != "pages" and getattr(args, "shapes", None) is not None:
        raise UsageError("--shapes chooses among the pages mix's time ranges; it does not apply to --mix status-go")
    config = node_config.load(args.config, {"engine": args.engine, "data_dir": table_of or args.data_dir})
    configure_node_process(config)  # the node's process-wide settings, as `serve` makes them
    spec = kept or bench_dataset.DatasetSpec(
        messages=args.messages,
        end_ns=time.time_ns(),
        seed=args.seed,
        days=getattr(args, "days", bench_dataset.DatasetSpec.days),
    )
    # The node: loopback, system-chosen ports, the dataset's shards, no
    # listeners besides libp2p, commits only when the load asks for them.
    config.tcp_port = config.ws_port = config.metrics_port = config.mailserver_port = 0
    config.listen_host = "127.0.0.1"
    config.cluster_id = bench_dataset.CLUSTER_ID
    config.shards = list(range(spec.shards))
    config.relay = False
    config.flush_interval_s = 3600.0
    # The well-behaved clients all dial from 127.0.0.1.
    config.ip_colocation_limit = max(config.ip_colocation_limit, max(args.clients))
    temporary = None
    if args.data_dir is None and table_of is None:
        temporary = Path(tempfile.mkdtemp(prefix="wakustore-bench-wire-"))
        config.data_dir = temporary
    report: dict = {
        "messages": spec.messages,
        "mix": getattr(args, "mix", "pages"),
        "dataset": {
            "seed": spec.seed,
            "topics": spec.topics,
            "shards": spec.shards,
            "days": spec.days,
            "duplicate_ratio": spec.duplicate_ratio,
            "start_ns": spec.start_ns,
            "end_ns": spec.end_ns,
        },
        "client_mode": CLIENT_MODE,
        "machine": {"cpus": os.cpu_count(), "loadavg_start": [round(x, 2) for x in os.getloadavg()]},
    }
    try:
        owned = engine is None
        if owned:
            _say(f"wire bench: starting the engine ({config.engine}) under {config.data_dir}")
            engine = node_config.new_engine(config)
            engine.start()
        try:
            if kept is None:
                _load(config, engine, spec, report)
            else:
                report.update({"unique_messages": None, "ingest_msgs_per_s": None, "table_of": str(table_of)})
                _say(f"wire bench: the table of {table_of} ({spec.messages:,} messages loaded by bench store)")
            trio.run(_serve_and_query, config, engine, spec, args, report)
        finally:
            if owned:
                engine.close()
    finally:
        if temporary is not None:
            shutil.rmtree(temporary, ignore_errors=True)
    report["machine"]["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    _print_report(report)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return (
        0
        if all(level["errors"] == 0 and level.get("hostile", {}).get("errors", 0) == 0 for level in report["levels"])
        else 1
    )


# --- loading -------------------------------------------------------------------


def _load(config, engine, spec: bench_dataset.DatasetSpec, report: dict) -> None:
    """Put and flush the dataset, compact and checkpoint; close the store."""
    from wakustore.node.store_service import open_store
    from wakustore.storage import maintenance

    _, store = open_store(config, engine)
    try:
        offered = accepted = 0
        started = time.perf_counter()
        with Progress("wire bench: loaded", total=spec.messages, unit="messages") as loading:
            for batch in bench_dataset.stream(spec, config.flush_max_messages):
                accepted += store.put(batch).accepted
                store.flush()
                offered += len(batch)
                loading.set(offered)
        load_s = time.perf_counter() - started
        started = time.perf_counter()
        maintenance.compact(store.table, today=dt.datetime.now(dt.UTC).date())
        maintenance.checkpoint(store.table)
        compact_s = time.perf_counter() - started
    finally:
        store.close()
    report.update(
        {
            "unique_messages": accepted,
            "ingest_msgs_per_s": round(offered / load_s, 1),
            "load_s": round(load_s, 3),
            "compact_s": round(compact_s, 3),
        }
    )
    _say(f"wire bench: {accepted:,} unique messages in the table ({load_s:.1f} s, compacted in {compact_s:.1f} s)")


# --- serving and querying --------------------------------------------------------


async def _serve_and_query(config, engine, spec, args, report: dict) -> None:
    from libp2p.crypto.secp256k1 import create_new_key_pair

    from wakustore.node.running import running_node
    from wakustore.node.store_protocols import RateLimits

    # The Store protocols alone: no relay, mailserver or metrics listener
    # competing for the CPU, no rate limit, a throwaway identity.
    async with running_node(
        config,
        engine=engine,
        rate_limits=RateLimits.parse(["0/1s"]),
        key_pair=create_new_key_pair(),
        mailserver=False,
        metrics=False,
        relay=False,
        archives=False,
    ) as node:
        peer = next(a for a in node.info.multiaddrs if "/ws/" not in a)
        report.update(await _direct(node.service, _specs(args, spec, args.seed)))
        report["levels"] = []
        for index, clients in enumerate(args.clients):
            plans = _plans(_specs(args, spec, args.seed + 100 * (index + 1)), clients, args.queries)
            _say(f"wire bench: {clients} client(s), {args.queries} queries")
            timing, samples = await trio.to_thread.run_sync(_run_client_process, peer, plans)
            level = _level_summary(clients, timing, samples)
            if getattr(args, "hostile", False):
                _say(f"wire bench: {clients} client(s) again, alongside {args.hostile_hosts} hostile hosts")
                timing, samples, seen = await _with_hostile(node, peer, plans, args.hostile_hosts, spec, args.seed)
                level["hostile"] = {
                    **_level_summary(clients, timing, samples),
                    "load": seen,
                    "refused_by_node": dict(node.gatekeeper.refused),
                }
            report["levels"].append(level)


async def _with_hostile(node, peer: str, plans, hosts: int, spec, seed: int):
    """One level's clients while the hostile process runs; returns their
    figures and the hostile process's counts."""
    import subprocess

    from wakustore.bench.store import page_specs

    query = next(page_specs(spec, seed)).query()
    stop = Path(tempfile.mkdtemp(prefix="wakustore-hostile-")) / "stop"
    hostile = subprocess.Popen(
        [sys.executable, "-c", "from wakustore.bench.hostile import client_main; client_main()"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert hostile.stdin is not None and hostile.stdout is not None  # both PIPE
    try:
        hostile.stdin.write(pickle.dumps((peer, hosts, query, str(stop))))
        hostile.stdin.close()
        await trio.sleep(HOSTILE_HEAD_START_S)
        timing, samples = await trio.to_thread.run_sync(_run_client_process, peer, plans)
    finally:
        stop.touch()
    out = await trio.to_thread.run_sync(lambda: hostile.stdout.read())
    await trio.to_thread.run_sync(lambda: hostile.wait(timeout=CLIENT_TIMEOUT_S))
    shutil.rmtree(stop.parent, ignore_errors=True)
    seen = pickle.loads(out) if out else {"error": f"hostile process exited {hostile.returncode}"}
    return timing, samples, seen


def _specs(args, spec, seed: int) -> Iterator[PageSpec | MixQuery]:
    """The queries of the chosen mix (and shapes), endless."""
    from wakustore.bench.store import page_specs

    specs: Iterator[PageSpec | MixQuery] = page_specs(spec, seed)
    if getattr(args, "mix", "pages") == "status-go":
        from wakustore.bench.status_go_mix import mix_specs

        specs = mix_specs(spec, seed)
    shapes = getattr(args, "shapes", None)
    if shapes is not None:
        specs = (page for page in specs if page.range_name in shapes)
    return specs


async def _direct(service, specs: Iterator[PageSpec | MixQuery]) -> dict:
    """First pages of the mix straight on the store service (no libp2p), one
    at a time: per shape their time and the process's CPU (every thread's;
    nothing else runs meanwhile), what a query costs the node before the wire."""
    from wakustore.bench.store import percentile

    times: list[float] = []
    by_shape: dict[str, list[tuple[float, float]]] = {}
    for page_spec in _take(specs, DIRECT_PAGES):
        cpu, started = time.process_time(), time.perf_counter()
        await service.query(page_spec.query())
        ms = (time.perf_counter() - started) * 1000
        times.append(ms)
        by_shape.setdefault(page_spec.range_name, []).append((ms, (time.process_time() - cpu) * 1000))
    return {
        "direct_p50_ms": _round(percentile(times, 50)),
        "direct_p99_ms": _round(percentile(times, 99)),
        "direct_per_shape": {
            shape: {
                "n": len(samples),
                "p50_ms": _round(percentile([ms for ms, _ in samples], 50)),
                "cpu_ms": _round(sum(cpu for _, cpu in samples) / len(samples)),
            }
            for shape, samples in sorted(by_shape.items())
        },
    }


def _plans(specs, clients: int, queries: int) -> list[tuple[list, int]]:
    """Per client: (page specs, number of timed queries to run). Each client
    gets enough specs for its quota even if no first page had a cursor."""
    quota = math.ceil(queries / clients)
    return [([next(specs) for _ in range(WARMUP_PAGES + quota)], quota) for _ in range(clients)]


@dataclass(frozen=True, slots=True)
class Timing:
    """One level's measured interval, as the client process saw it: wall
    seconds, and the CPU seconds (user + system, every thread) the node's
    process and the client process spent in it."""

    wall_s: float
    node_cpu_s: float
    client_cpu_s: float


def _level_summary(clients: int, timing: Timing, samples: list[list[tuple[str, float, int]]]) -> dict:
    from wakustore.bench.store import percentile

    flat = [s for per_client in samples for s in per_client]
    latencies = [ms for _, ms, _ in flat]
    by_shape: dict[str, list[float]] = {}
    for shape, ms, _ in flat:
        by_shape.setdefault(shape, []).append(ms)
    wall_s = timing.wall_s
    return {
        "clients": clients,
        "queries": len(flat),
        "errors": sum(1 for _, _, status in flat if status != 200),
        "wall_s": round(wall_s, 3),
        "qps": round(len(flat) / wall_s, 1) if wall_s > 0 else None,
        "node_cpu_ms_per_query": _per_query_ms(timing.node_cpu_s, len(flat)),
        "client_cpu_ms_per_query": _per_query_ms(timing.client_cpu_s, len(flat)),
        "p50_ms": _round(percentile(latencies, 50)),
        "p99_ms": _round(percentile(latencies, 99)),
        "per_shape": {
            shape: {
                "n": len(v),
                "qps": round(len(v) / wall_s, 1) if wall_s > 0 else None,
                "p50_ms": _round(percentile(v, 50)),
                "p99_ms": _round(percentile(v, 99)),
            }
            for shape, v in sorted(by_shape.items())
        },
    }


def _per_query_ms(cpu_s: float, queries: int) -> float | None:
    return round(cpu_s * 1000 / queries, 3) if queries else None


def _run_client_process(peer: str, plans: list) -> tuple[Timing, list]:
    """Run one level's clients in a fresh interpreter (arguments and result
    pickled over its pipes); the node is this process."""
    result = run_client_process("wakustore.bench.wire", (peer, plans, os.getpid()), CLIENT_TIMEOUT_S)
    return cast(tuple[Timing, list], result)


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` and all its threads so
    far (children not counted: the engine's server is a process of its own)."""
    import psutil

    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def client_main() -> None:
    """The client process: reads (peer, plans, node pid) pickled on stdin,
    writes (Timing, [[(shape, latency ms, status)] per client]) pickled on stdout."""
    peer, plans, node_pid = pickle.loads(sys.stdin.buffer.read())
    result = trio.run(_clients, peer, plans, node_pid)
    sys.stdout.buffer.write(pickle.dumps(result))


async def _clients(peer: str, plans: list, node_pid: int) -> tuple[Timing, list]:
    from contextlib import AsyncExitStack

    from wakustore.clients.store import StoreClient

    samples: list[list] = [[] for _ in plans]
    async with AsyncExitStack() as stack:
        connected = [await stack.enter_async_context(StoreClient.connect(peer)) for _ in plans]
        async with trio.open_nursery() as nursery:
            for client, (specs, _) in zip(connected, plans):
                nursery.start_soon(_warm_up, client, specs[:WARMUP_PAGES])
        # The node's CPU is read from here, at the edges of the interval the
        # queries are timed in, so that it covers exactly the timed queries.
        # Our own CPU from the process clock (nanoseconds; the kernel's
        # per-process figures psutil reads come in 10 ms ticks).
        node_cpu, own_cpu = process_cpu_s(node_pid), time.process_time()
        started = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for client, (specs, quota), out in zip(connected, plans, samples):
                nursery.start_soon(_run_plan, client, specs[WARMUP_PAGES:], quota, out)
        wall_s = time.perf_counter() - started
        timing = Timing(wall_s, process_cpu_s(node_pid) - node_cpu, time.process_time() - own_cpu)
    return timing, samples


async def _warm_up(client, specs) -> None:
    for spec in specs:
        await client.query(spec.query())


async def _run_plan(client, specs, quota: int, out: list) -> None:
    """First pages and their cursor pages until ``quota`` queries are done."""
    for spec in specs:
        if len(out) >= quota:
            return
        response = await _timed_query(client, spec.query(), f"{spec.range_name}/first", out)
        if response.status_code == 200 and response.cursor is not None and len(out) < quota:
            await _timed_query(client, spec.query(response.cursor), f"{spec.range_name}/cursor", out)


async def _timed_query(client, query, shape: str, out: list):
    started = time.perf_counter()
    response = await client.query(query)
    out.append((shape, (time.perf_counter() - started) * 1000, response.status_code))
    return response


# --- output ---------------------------------------------------------------------


def _print_report(report: dict) -> None:
    loaded = (
        f"{report['unique_messages']:,} messages in the table ({report['messages']:,} loaded at "
        f"{report['ingest_msgs_per_s']:,.0f} msg/s)"
        if report.get("unique_messages") is not None
        else f"the table of {report['table_of']} ({report['messages']:,} messages)"
    )
    print(f"\nwire benchmark: {loaded}, {report['machine']['cpus']} CPUs; {report['client_mode']}")
    print(f"  store service, no wire: p50 {report['direct_p50_ms']} ms, p99 {report['direct_p99_ms']} ms")
    for shape, figures in report.get("direct_per_shape", {}).items():
        print(f"        {shape:<14} p50 {figures['p50_ms']:>7} ms   CPU {figures['cpu_ms']:>7} ms   ({figures['n']})")
    for level in report["levels"]:
        print(
            f"  {level['clients']:>3} client(s): {level['qps']:>8,.1f} queries/s   "
            f"node CPU {level['node_cpu_ms_per_query']:>6} ms/query   "
            f"p50 {level['p50_ms']:>7} ms   p99 {level['p99_ms']:>7} ms   "
            f"({level['queries']} queries, {level['errors']} errors; "
            f"clients' CPU {level['client_cpu_ms_per_query']} ms/query)"
        )
        for shape, figures in level["per_shape"].items():
            print(
                f"        {shape:<14} p50 {figures['p50_ms']:>7} ms   p99 {figures['p99_ms']:>7} ms   ({figures['n']})"
            )
        hostile = level.get("hostile")
        if hostile:
            print(
                f"      under hostile load: {hostile['qps']:>8,.1f} queries/s   "
                f"node CPU {hostile['node_cpu_ms_per_query']:>6} ms/query   "
                f"p50 {hostile['p50_ms']:>7} ms   p99 {hostile['p99_ms']:>7} ms   "
                f"({hostile['queries']} queries, {hostile['errors']} errors)"
            )
            print(f"        hostile load: {hostile['load']}")
            print(f"        refused by the node so far: {hostile['refused_by_node']}")


def _round(value: float | None, digits: int = 2) -> float | None:
    return None if value is None else round(value, digits)


def _take(iterator, n: int):
    for _, item in zip(range(n), iterator):
        yield item
