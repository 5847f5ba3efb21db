"""``wakustore bench store``: the storage benchmark.

What it measures, on a seeded dataset (:mod:`wakustore.bench.dataset`):

1. Ingest into Delta end to end, durable, as the node does it:
   :meth:`MessageStore.put` (hashes, write-ahead log fsync) in batches of
   ``flush_max_messages`` with a :meth:`MessageStore.flush` (the MERGE
   commit) after each; the rate counts every offered message (duplicates
   included) over the put and flush time of the whole load, the final
   flush included. As the ingest crosses each day of the dataset, the
   node's maintenance runs (compaction of the finished days, a checkpoint,
   their key index): the puts pause for it and its time is reported apart
   (``daily_maintenance``), so the table grows as a node's does, one
   sorted run per finished day, not thousands of ingest files. At the end
   :func:`maintenance.compact` and a checkpoint, for the days left.
2. Store v3 pages (20 messages, 1-3 content topics of one shard, ranges of
   1 h / 1 d / 7 d, forward and backward): a first page, then the page at
   its ``next_cursor`` when there is one, until about ``--queries``
   queries; then lookups by 1 and by 20 message hashes, all as the node
   answers them (committed history read in process by the table reader).
   The same queries are then run through the engine (one Spark Connect
   query a page, the earlier read path), and every answer must equal the
   reader's, message for message. The Spark Connect round-trip floor
   (``SELECT 1``) is measured beside them.
3. The same data and the same queries on nwaku's PostgreSQL and SQLite
   archives (:mod:`wakustore.bench.sql`), and a cross-check that
   every query returns the same set of message hashes on every backend.

After the ingest the table is checked against the dataset: it must hold
exactly the dataset's distinct messages (``unique_messages``, counted from
the dataset's original slots), with the same order-independent fingerprint
of their hashes (``integrity``); ``accepted`` (what the puts accepted) may
be higher, since a re-send older than the recent-MUID set is dropped by
the commit, not the put. The ingest rate includes the benchmark's own
generation of the messages (``ingest_breakdown_s.generate``).

The JSON report (``--json``) holds ``messages``, ``ingest_msgs_per_s``,
``compact_s``, ``query_p50_ms``, ``query_p99_ms``, ``per_shape``,
``hash_lookup_p50_ms``, ``peak_rss_mb`` ``{node, engine}`` (the whole
run), ``ingest_cpu_s`` ``{put_thread, committer_thread, node, workers, engine}``
(CPU seconds of the ingest), ``ingest_peak_rss_mb`` ``{node, engine, sum}`` (sampled during the
ingest; ``sum`` is both at one sample),
``spark_path`` (the same figures through the engine, and its
``crosscheck`` against the reader), and per
compared backend ``{ingest_msgs_per_s, query_p50_ms, query_p99_ms,
hash_lookup_p50_ms, ratios}`` where a ratio is Delta's figure over the
backend's (above 1: Delta is slower). Exit status 1 when a cross-check
finds different answers, a compared backend fails or the integrity check fails.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import os
import random
import resource
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wakustore.bench import dataset as bench_dataset
from wakustore.bench.common import add_common_arguments, positive_int
from wakustore.bench.dataset import NS_PER_DAY, NS_PER_HOUR, DatasetSpec
from wakustore.cli.progress import Progress
from wakustore.node import config as node_config
from wakustore.node.process import configure_node_process
from wakustore.protocols.store_query import HistoryQuery, Page, validate_v3
from wakustore.usage import UsageError

BACKENDS = ("postgres", "sqlite")
DEFAULT_MESSAGES = 1_000_000
DEFAULT_QUERIES = 200
# Lookups by hash: this many of each shape. Without data: status-go's
# presence checks (message_sent_check.go: up to 50 sent hashes every 3 s
# per client, include_data=false); with data: its hash-first backfill
# fetching bodies by hash in batches of 50 (hash_first_backfill.go), and
# the 20 of the earlier figures.
DEFAULT_LOOKUPS = 20
LOOKUP_SHAPES = ((1, False), (20, False), (50, False), (1, True), (20, True), (50, True))
WARMUP_QUERIES = 5
ROUND_TRIPS = 20
PAGE_SIZE = 20
RANGES = {"1h": NS_PER_HOUR, "1d": NS_PER_DAY, "7d": 7 * NS_PER_DAY, "now-1h": NS_PER_HOUR}
# "now-1h" is the last hour of the data set: what a client catching up asks
# for most, and what the node's hot tier answers from memory.
RSS_SAMPLE_S = 0.25
MIB = 1024 * 1024


def register_verb(verbs: argparse._SubParsersAction) -> None:
    store = verbs.add_parser(
        "store", help="ingest and Store v3 query benchmark, optionally against nwaku's SQL archives"
    )
    store.add_argument(
        "--messages",
        type=positive_int,
        default=DEFAULT_MESSAGES,
        help=f"messages offered, duplicates included (default {DEFAULT_MESSAGES})",
    )
    store.add_argument("--compare", type=_backends, default=(), help="comma-separated: " + ",".join(BACKENDS))
    store.add_argument(
        "--queries",
        type=positive_int,
        default=DEFAULT_QUERIES,
        help=f"Store v3 pages to time (default {DEFAULT_QUERIES})",
    )
    store.add_argument(
        "--lookups",
        type=positive_int,
        default=DEFAULT_LOOKUPS,
        help=f"lookups of each shape (1, 20, 50 hashes, with and without data; default {DEFAULT_LOOKUPS})",
    )
    store.add_argument(
        "--days",
        type=positive_int,
        default=DatasetSpec.days,
        help=f"days the messages' timestamps spread over, ending now (default {DatasetSpec.days}; "
        "10M over 30 days has the rows per day of 3M over 9)",
    )
    add_common_arguments(store, "where the Delta table goes (must be empty; default: a temporary directory, removed)")
    store.set_defaults(handler=run_store_bench)


def _backends(text: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(n.strip().lower() for n in text.split(",") if n.strip()))
    unknown = [n for n in names if n not in BACKENDS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown backend {unknown[0]!r} (choose from {', '.join(BACKENDS)})")
    return names


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# --- the query set -------------------------------------------------------------


@dataclass(frozen=True)
class PageSpec:
    """A first page; its cursor page follows when it has a next cursor."""

    range_name: str
    pubsub_topic: str
    content_topics: tuple[str, ...]
    time_start: int
    time_end: int
    forward: bool

    def query(self, cursor: bytes | None = None) -> HistoryQuery:
        return validate_v3(
            pubsub_topic=self.pubsub_topic,
            content_topics=list(self.content_topics),
            time_start=self.time_start,
            time_end=self.time_end,
            message_hashes=[],
            cursor=cursor,
            forward=self.forward,
            limit=PAGE_SIZE,
            include_data=True,
        )


def page_specs(spec: DatasetSpec, seed: int) -> Iterator[PageSpec]:
    """An endless deterministic stream of page queries: ranges in turn,
    1-3 topics of one shard drawn by popularity, windows anywhere in the data."""
    rng = random.Random(seed)
    names = list(RANGES)
    i = 0
    while True:
        name = names[i % len(names)]
        i += 1
        first = spec.pick_topic(rng)
        shard = spec.shard_of(first)
        topics = [first]
        wanted = rng.randint(1, 3)
        for _ in range(50):
            if len(topics) >= wanted:
                break
            other = spec.pick_topic(rng)
            if spec.shard_of(other) == shard and other not in topics:
                topics.append(other)
        length = RANGES[name]
        # A range longer than the data (7 days of a --days 1 set) ends anywhere in it.
        earliest = min(spec.start_ns + length, spec.end_ns)
        end = spec.end_ns if name.startswith("now-") else rng.randint(earliest, spec.end_ns)
        yield PageSpec(
            name,
            spec.pubsub_topic(shard),
            tuple(spec.content_topic(t) for t in topics),
            end - length,
            end,
            rng.random() < 0.5,
        )


def hash_lookups(spec: DatasetSpec, seed: int, per_size: int) -> list[tuple[str, HistoryQuery]]:
    from wakustore.protocols.message import message_hash

    rng = random.Random(seed ^ 0x5EED)
    out = []
    for size, data in LOOKUP_SHAPES:
        for _ in range(per_size):
            hashes = [message_hash(p, m) for p, m in bench_dataset.sample_originals(spec, rng, size)]
            query = validate_v3(
                pubsub_topic=None,
                content_topics=[],
                time_start=None,
                time_end=None,
                message_hashes=hashes,
                cursor=None,
                forward=False,
                limit=max(PAGE_SIZE, size),
                include_data=data,
            )
            out.append((_lookup_shape(size, data), query))
    return out


# --- timing ------------------------------------------------------------------


def _lookup_shape(size: int, data: bool) -> str:
    return f"hash/{size}" if data else f"hash/{size}/keys"


def percentile(values: list[float], q: float) -> float | None:
    """Linear interpolation between closest ranks; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


class Timings:
    """Query latencies (ms) by shape (``1h/first``, ``7d/cursor``, ``hash/20``)."""

    def __init__(self) -> None:
        self.by_shape: dict[str, list[float]] = {}

    def add(self, shape: str, ms: float) -> None:
        self.by_shape.setdefault(shape, []).append(ms)

    def pages(self) -> list[float]:
        return [v for k, vs in self.by_shape.items() if not k.startswith("hash/") for v in vs]

    def lookups(self) -> list[float]:
        return [v for k, vs in self.by_shape.items() if k.startswith("hash/") for v in vs]

    def summary(self) -> dict:
        pages, lookups = self.pages(), self.lookups()
        return {
            "queries": len(pages),
            "query_p50_ms": _round(percentile(pages, 50)),
            "query_p99_ms": _round(percentile(pages, 99)),
            "hash_lookup_p50_ms": _round(percentile(lookups, 50)),
            "per_shape": {
                shape: {"n": len(vs), "p50_ms": _round(percentile(vs, 50)), "p99_ms": _round(percentile(vs, 99))}
                for shape, vs in sorted(self.by_shape.items(), key=lambda kv: _shape_order(kv[0]))
            },
        }


def _shape_order(shape: str) -> tuple[int, str]:
    order = [
        *(f"{r}/{k}" for r in RANGES for k in ("first", "cursor")),
        *(_lookup_shape(n, d) for n, d in LOOKUP_SHAPES),
    ]
    return (order.index(shape) if shape in order else len(order), shape)


def _round(value: float | None, digits: int = 2) -> float | None:
    return None if value is None else round(value, digits)


def _timed(fn: Callable, *args):
    started = time.perf_counter()
    result = fn(*args)
    return result, (time.perf_counter() - started) * 1000


# --- memory ------------------------------------------------------------------


class RssSampler:
    """Peak resident memory of this process (with its worker processes)
    and of the engine's processes.

    The engine is found through the pid it exposes (``pid``, ``child_pid``
    or ``server_pid``, or ``process.pid``) or, failing that, as this
    process's children; their peak comes from sampling (the engine may be
    restarted on its memory ceiling) and from ``VmHWM`` while they live.
    """

    def __init__(self, engine) -> None:
        self.engine = engine
        self.engine_peak = 0
        # Sampled (VmRSS): the peak of a phase, where ru_maxrss is the whole run's.
        self.node_sampled_peak = 0
        # Node + engine at the same sample: what the machine had to hold at once.
        self.sum_peak = 0
        self.node_file_peak = 0
        # What made up the node's sampled peak (MB): see :meth:`sample`.
        self.at_node_peak: dict = {}
        # What the store holds, asked at a new peak: set once the store is open.
        self.held: Callable[[], dict] | None = None
        self.engine_pids: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="rss-sampler", daemon=True)

    def __enter__(self) -> RssSampler:
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()

    def _loop(self) -> None:
        while not self._stop.wait(RSS_SAMPLE_S):
            self.sample()

    def _pids(self) -> list[int]:
        import psutil

        for attribute in ("pid", "child_pid", "server_pid"):
            pid = getattr(self.engine, attribute, None)
            if isinstance(pid, int) and pid > 0:
                return [pid, *(c.pid for c in _children(psutil, pid))]
        process = getattr(self.engine, "process", None) or getattr(self.engine, "_process", None)
        pid = getattr(process, "pid", None)
        if isinstance(pid, int) and pid > 0:
            return [pid, *(c.pid for c in _children(psutil, pid))]
        return [c.pid for c in _children(psutil, os.getpid())]

    def engine_processes(self) -> list[int]:
        try:
            return self._pids()
        except Exception:
            return []

    def next_phase(self) -> dict:
        """The peaks of the phase that ends (:meth:`peaks`), then counting
        afresh: the sampled peaks reset, and each process's high-water mark
        (VmHWM) with them where the kernel allows (``clear_refs``)."""
        peaks = self.peaks()
        for pid in [os.getpid(), *self.engine_processes()]:
            try:
                with open(f"/proc/{pid}/clear_refs", "w") as refs:
                    refs.write("5")
            except OSError:
                pass
        self.node_sampled_peak = self.engine_peak = self.sum_peak = self.node_file_peak = 0
        self.at_node_peak = {}
        self.sample()
        return peaks

    def peaks(self) -> dict:
        """Peaks sampled so far, MB: node, engine, and both at one sample."""
        self.sample()
        return {
            "node": round(self.node_sampled_peak / MIB, 1),
            "engine": round(self.engine_peak / MIB, 1),
            "sum": round(self.sum_peak / MIB, 1),
            "node_mapped_files": round(self.node_file_peak / MIB, 1),
            "at_node_peak": self.at_node_peak,
        }

    def sample(self) -> None:
        own = _status_fields(os.getpid(), ("VmRSS", "RssAnon", "RssFile"))
        # Of the node's own: pages of mapped files (the key index; the page
        # cache's, dropped from the process every 2 s) apart from the rest.
        self.node_file_peak = max(self.node_file_peak, own["RssFile"])
        try:
            pids = self._pids()
        except Exception:
            pids = None
        # The node's own child processes (the hash worker) count as the node.
        workers = sum(_proc_memory(pid)[0] for pid in _worker_processes(pids or []))
        node = own["VmRSS"] + workers
        if node > self.node_sampled_peak:
            self.at_node_peak = self._breakdown(own, workers)
        self.node_sampled_peak = max(self.node_sampled_peak, node)
        if pids is None:
            return
        total = 0
        for pid in pids:
            rss, hwm = _proc_memory(pid)
            total += rss
            self.engine_peak = max(self.engine_peak, hwm)
        if pids:
            self.engine_pids.update(pids)
        self.engine_peak = max(self.engine_peak, total)
        self.sum_peak = max(self.sum_peak, node + total)

    def _breakdown(self, own: dict[str, int], workers: int) -> dict:
        """The node's memory at a sample, MB: its process's anonymous
        memory and mapped-file pages, its worker processes, and what the
        store holds (``held``: MessageStore.memory_held; ``arrow_allocated``
        counts buffers alive, not what the allocator keeps after a free)."""
        out: dict[str, Any] = {
            "anonymous": round(own["RssAnon"] / MIB, 1),
            "mapped_files": round(own["RssFile"] / MIB, 1),
            "workers": round(workers / MIB, 1),
        }
        if self.held is not None:
            try:
                out["held"] = self.held()
            except Exception as exc:  # the store changing under a sample
                out["held"] = repr(exc)
        return out

    @staticmethod
    def node_peak() -> int:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _cpu_seconds(pids: list[int]) -> float:
    """User and system CPU seconds of these processes so far (0 for one gone)."""
    import psutil

    total = 0.0
    for pid in pids:
        try:
            times = psutil.Process(pid).cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


def _worker_processes(engine: list[int]) -> list[int]:
    import psutil

    return [c.pid for c in _children(psutil, os.getpid()) if c.pid not in engine]


def _children(psutil, pid: int):
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


_COUNTS = ("recent_keys", "pending_rows")


def _held_mb(store) -> dict:
    """:meth:`MessageStore.memory_held`, bytes as MB (counts as they are)."""
    return {name: value if name in _COUNTS else round(value / MIB, 1) for name, value in store.memory_held().items()}


def _status_fields(pid: int, names: tuple[str, ...]) -> dict[str, int]:
    """Fields of ``/proc/<pid>/status`` given in kB, in bytes (0 when absent)."""
    out = dict.fromkeys(names, 0)
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                name, _, value = line.partition(":")
                if name in out:
                    out[name] = int(value.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return out


def _proc_memory(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) in bytes; zeros for a process that is gone."""
    rss = hwm = 0
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1]) * 1024
                elif line.startswith("VmHWM:"):
                    hwm = int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return rss, hwm


# --- the run -----------------------------------------------------------------


def run_store_bench(args: argparse.Namespace) -> int:
    if args.data_dir is not None and args.data_dir.exists() and any(args.data_dir.iterdir()):
        raise UsageError(f"--data-dir {args.data_dir} is not empty (the benchmark creates a fresh table)")
    config = node_config.load(args.config, {"engine": args.engine, "data_dir": args.data_dir})
    configure_node_process(config)  # the node's process-wide settings, as `serve` makes them
    spec = DatasetSpec(messages=args.messages, end_ns=time.time_ns(), seed=args.seed, days=args.days)
    report: dict = {
        "messages": spec.messages,
        "dataset": {
            "seed": spec.seed,
            "topics": spec.topics,
            "shards": spec.shards,
            "days": spec.days,
            "duplicate_ratio": spec.duplicate_ratio,
            "payload_bytes": [bench_dataset.PAYLOAD_MIN, bench_dataset.PAYLOAD_MAX],
            "start_ns": spec.start_ns,
            "end_ns": spec.end_ns,
        },
        "machine": {"cpus": os.cpu_count(), "loadavg_start": [round(x, 2) for x in os.getloadavg()]},
        "compare": list(args.compare),
    }
    temporary = None
    if args.data_dir is None:
        temporary = Path(tempfile.mkdtemp(prefix="wakustore-bench-"))
        config.data_dir = temporary
    else:
        # What `bench wire --table-of DIR` needs to query this table again.
        bench_dataset.save_spec(spec, Path(args.data_dir))
    try:
        expected = _run_delta(config, spec, args, report)
        failed = False
        for name in args.compare:
            failed |= not _run_backend(name, spec, args, report, expected, config.flush_max_messages)
    finally:
        if temporary is not None:
            shutil.rmtree(temporary, ignore_errors=True)
    report["machine"]["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    report["crosscheck_ok"] = all(
        report.get(n, {}).get("crosscheck", {}).get("mismatches", 1) == 0 for n in [*args.compare, "spark_path"]
    )
    _print_table(report)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    if not report["crosscheck_ok"]:
        _say("\n!!! CROSS-CHECK FAILED: backends returned different messages for the same query; see 'crosscheck' !!!")
    if not report.get("integrity", {}).get("ok", False):
        _say(
            "\n!!! INTEGRITY CHECK FAILED: the table does not hold the dataset's distinct messages; see 'integrity' !!!"
        )
    return 1 if failed or not report["crosscheck_ok"] or not report.get("integrity", {}).get("ok", False) else 0


class DailyMaintenance:
    """The node's maintenance as the ingest crosses each day of the
    dataset: a node compacts a finished day within the hour after it ends
    (its hourly :func:`~wakustore.storage.maintenance.run_maintenance`),
    so a table never holds more than today's ingest files and one sorted
    run per finished day. Here the puts pause for it, and its time is
    kept apart from the ingest's: ``compact_s`` (the maintenance run:
    flush, compaction, checkpoint, vacuum) and ``index_s`` (the key index
    of the new files, which the node builds in the background). The
    files a compaction removed are deleted at once (a node waits
    ``vacuum_retention_hours``; this run lasts minutes): the disk holds
    the table once, as a node's holds all but its last week."""

    def __init__(self, store) -> None:
        self.store = store
        self.day: dt.date | None = None
        self.runs = 0
        self.vacuumed = 0
        self.compact_s = 0.0
        self.index_s = 0.0

    @property
    def seconds(self) -> float:
        return self.compact_s + self.index_s

    def arrived(self, arrival_ns: int) -> None:
        """A batch arriving at ``arrival_ns``: the days before it are
        finished when its day is a new one."""
        from wakustore.storage import maintenance, schema

        day = schema.day_of_ns(arrival_ns)
        if self.day is not None and day > self.day:
            started = time.perf_counter()
            result = maintenance.run_maintenance(self.store, None, arrival_ns, vacuum_hours=0)
            self.vacuumed += result.vacuumed
            self.compact_s += time.perf_counter() - started
            started = time.perf_counter()
            self.store.reader.index_now()
            self.index_s += time.perf_counter() - started
            self.runs += 1
        self.day = day if self.day is None else max(self.day, day)

    def report(self) -> dict:
        return {
            "runs": self.runs,
            "compact_s": round(self.compact_s, 3),
            "index_s": round(self.index_s, 3),
            "files_vacuumed": self.vacuumed,
        }


@dataclass
class Expected:
    """What Delta answered: per page spec (the spec, hashes of the first
    page, whether it had a next cursor, hashes of the cursor page or None
    when it was not run) and per hash lookup."""

    pages: list[tuple[PageSpec, list[bytes], bool, list[bytes] | None]]
    lookups: list[tuple[str, HistoryQuery, list[bytes]]]
    # The reader's whole answers, for the comparison with the engine path.
    full_pages: list[tuple[PageSpec, Page, Page | None]] = field(default_factory=list)
    lookup_pages: list[Page] = field(default_factory=list)


def _run_delta(config, spec: DatasetSpec, args, report: dict) -> Expected:
    from wakustore.node.store_service import open_store
    from wakustore.storage import maintenance

    _say(f"delta: starting the engine ({config.engine}), table under {config.data_dir}")
    engine, store = open_store(config)
    batch_size = config.flush_max_messages
    try:
        with RssSampler(engine) as rss:
            rss.held = lambda: _held_mb(store)
            # --- ingest, pipelined as in the node: this thread puts (WAL
            # fsync per batch), a committer thread flushes whatever is
            # buffered; the rate counts until the last commit has landed.
            put_s = 0.0
            flush_times: list[float] = []
            offered = accepted = 0
            done = threading.Event()
            failure: list[BaseException] = []

            committer_cpu: list[float] = []
            flush_rows: list[int] = []

            def committer() -> None:
                began_cpu = time.thread_time()
                try:
                    while not done.is_set() or store.pending:
                        started = time.perf_counter()
                        committed = store.flush()
                        if committed:
                            flush_times.append(time.perf_counter() - started)
                            flush_rows.append(committed)
                        else:
                            time.sleep(0.005)
                except BaseException as exc:  # surfaced below
                    failure.append(exc)
                finally:
                    committer_cpu.append(time.thread_time() - began_cpu)

            thread = threading.Thread(target=committer, name="bench-committer")
            engine_cpu = _cpu_seconds(rss.engine_processes())
            workers_cpu = _cpu_seconds(_worker_processes(rss.engine_processes()))
            process_cpu = time.process_time()
            put_cpu = time.thread_time()
            began = time.perf_counter()
            thread.start()
            ingesting = Progress("delta: ingested", total=spec.messages, unit="messages")
            generation_s = 0.0
            batches = bench_dataset.stream(spec, batch_size)
            daily = DailyMaintenance(store)
            try:
                while True:
                    started = time.perf_counter()
                    batch = next(batches, None)
                    generation_s += time.perf_counter() - started
                    if batch is None:
                        break
                    daily.arrived(batch[0][2])
                    while store.pending >= 4 * batch_size and not failure:
                        time.sleep(0.002)  # the node answers "busy" here; the bench waits
                    started = time.perf_counter()
                    result = store.put(batch)
                    put_s += time.perf_counter() - started
                    offered += len(batch)
                    accepted += result.accepted
                    ingesting.set(offered)
            finally:
                ingesting.close()
                done.set()
                thread.join()
            if failure:
                raise failure[0]
            # The ingest's own time: the maintenance between days is timed apart.
            ingest_s = time.perf_counter() - began - daily.seconds
            # CPU seconds of the ingest: this thread (generation and puts),
            # the committer thread, the whole node process (those two, the
            # threads of gRPC and the readers, the RSS sampler) and the engine.
            ingest_cpu = {
                "put_thread": round(time.thread_time() - put_cpu, 2),
                "committer_thread": round(committer_cpu[0], 2) if committer_cpu else None,
                "node": round(time.process_time() - process_cpu, 2),
                "engine": round(_cpu_seconds(rss.engine_processes()) - engine_cpu, 2),
                # The node's other child processes (the put path's hash worker).
                "workers": round(_cpu_seconds(_worker_processes(rss.engine_processes())) - workers_cpu, 2),
            }
            ingest_rss = rss.next_phase()
            # What the node holds for the table at the end of the ingest.
            ingest_rss["held_mb"] = _held_mb(store)
            flush_s = sum(flush_times)
            flushes = len(flush_times)
            before = maintenance.stats(store.table)
            # --- maintenance, as the node does for finished days
            today = dt.datetime.now(dt.UTC).date()
            started = time.perf_counter()
            compacted = maintenance.compact(store.table, today=today)
            compact_s = time.perf_counter() - started + daily.compact_s
            started = time.perf_counter()
            maintenance.checkpoint(store.table)
            checkpoint_s = time.perf_counter() - started
            after = maintenance.stats(store.table)
            _say(f"delta: compacted {before.files} -> {after.files} files in {compact_s:.1f} s")
            # The reader's key index of the compacted files (the node builds
            # it in the background after maintenance; pages read through
            # DataFusion until then): timed apart, pages are timed after it.
            started = time.perf_counter()
            store.reader.committed()
            store.reader.index_now()
            index_s = time.perf_counter() - started + daily.index_s
            _say(
                f"delta: key index of {after.files} files built in {index_s:.1f} s, "
                f"{store.reader.index_bytes() / max(after.rows, 1):.2f} bytes a message held, "
                f"{store.reader.mapped_bytes() / max(after.rows, 1):.1f} on disk"
            )
            compaction_rss = rss.next_phase()
            # --- queries
            round_trips = []
            for _ in range(ROUND_TRIPS):
                round_trips.append(_timed(engine.run, lambda spark: spark.sql("SELECT 1").collect())[1])
            engine_ms: list[float] = []
            timings, expected = _delta_queries(store, spec, args, engine_ms)
            serving_rss = rss.next_phase()
            spark_path = _spark_path_queries(store, spec, args, expected)
            rows = maintenance.count_rows(store.table)
            integrity = check_integrity(store.table, spec)
            # The engine's answers to the same queries and the integrity
            # check: the benchmark's own work, kept apart.
            checks_rss = rss.next_phase()
            # The old store's memory goes before the new one is made (a
            # restart is a new process), as far as the allocator returns it.
            # None until _restart returns the new store: the finally below then skips it.
            closing, store = store, None  # type: ignore[assignment]
            closing.close()
            del closing
            gc.collect()
            rss.next_phase()
            store, restart = _restart(config, engine, expected)
            restart["rss_mb"] = rss.next_phase()
        report.update(
            {
                "unique_messages": integrity["dataset"]["count"],
                "accepted": accepted,
                "duplicates": offered - integrity["dataset"]["count"],
                "rows_in_table": rows,
                "integrity": integrity,
                "ingest_msgs_per_s": round(offered / ingest_s, 1),
                "ingest_s": round(ingest_s, 3),
                "ingest_breakdown_s": {
                    "generate": round(generation_s, 3),
                    "put": round(put_s, 3),
                    "flush": round(flush_s, 3),
                    "flushes": flushes,
                    # Keys the day filters flagged (a duplicate older than the
                    # recent set, or a false positive), decided in the puts.
                    "lookup": round(store.writes.lookup_seconds, 3),
                    "looked_up": store.writes.looked_up,
                    # A shared table: rows of older days found in the table
                    # and left out of the MERGEs (re-sends of old messages).
                    "known_old_rows": store.writes.known_old_rows,
                    "flush_p50": _round(percentile(flush_times, 50), 3),
                    "flush_max": _round(max(flush_times, default=0.0), 3),
                    "flush_first_tenth_p50": _round(percentile(flush_times[: max(1, flushes // 10)], 50), 3),
                    "flush_last_tenth_p50": _round(percentile(flush_times[-max(1, flushes // 10) :], 50), 3),
                    # Commit time a row, first and last tenth of the commits:
                    # flat when the per-commit work does not grow with the table.
                    "flush_us_per_row_first_tenth": _per_row_us(
                        flush_times, flush_rows, slice(0, max(1, flushes // 10))
                    ),
                    "flush_us_per_row_last_tenth": _per_row_us(
                        flush_times, flush_rows, slice(-max(1, flushes // 10), None)
                    ),
                },
                "compact_s": round(compact_s, 3),
                "daily_maintenance": daily.report(),
                "checkpoint_s": round(checkpoint_s, 3),
                "key_index_s": round(index_s, 3),
                "key_index_bytes": store.reader.index_bytes(),
                "compact_result": compacted,
                "table": {
                    "files_before_compact": before.files,
                    "files_after_compact": after.files,
                    "days": after.days,
                },
                "bytes": after.bytes,
                **timings.summary(),
                "round_trip_p50_ms": _round(percentile(round_trips, 50)),
                "reader_page_p50_ms": _round(percentile(engine_ms, 50)),
                "spark_path": spark_path,
                "peak_rss_mb": {
                    "node": round(RssSampler.node_peak() / MIB, 1),
                    "engine": round(rss.engine_peak / MIB, 1) if rss.engine_pids else None,
                },
                "ingest_peak_rss_mb": ingest_rss,
                # Peaks of each phase (sampled every 0.25 s, and each process's
                # high-water mark since the phase began).
                "rss_phases_mb": {
                    "ingest": {k: v for k, v in ingest_rss.items() if k != "held_mb"},
                    "compaction": compaction_rss,
                    "serving": serving_rss,
                    "benchmark_checks": checks_rss,
                },
                "key_index_mapped_bytes": store.reader.mapped_bytes(),
                "restart": restart,
                "ingest_cpu_s": ingest_cpu,
                "engine_pids": sorted(rss.engine_pids),
                "engine_restarts": max(engine.generation - 1, 0),
            }
        )
        if not integrity["ok"]:
            problem = (
                f"the table ({integrity['table']['count']} rows) does not match the dataset's "
                f"{integrity['dataset']['count']} distinct messages (count and hash fingerprint)"
            )
            report.setdefault("problems", []).append(problem)
            _say(f"!!! delta: {problem}")
        elif rows != integrity["table"]["count"]:
            report.setdefault("problems", []).append(f"row count {rows} but {integrity['table']['count']} hashes read")
            _say(f"!!! delta: the table counts {rows} rows but {integrity['table']['count']} hashes were read")
        return expected
    finally:
        try:
            if store is not None:
                store.close()
        finally:
            engine.close()


def _restart(config, engine, expected: Expected):
    """Open the store again on the table it closed (the engine stays up:
    the node's own restart): seconds until it is ready, and the first
    history page after it (a day-long page timed before, read through the
    key index mapped from disk, and equal to the answer before). Returns
    the new store."""
    from wakustore.node.store_service import open_store

    started = time.perf_counter()
    _, store = open_store(config, engine)
    ready_s = time.perf_counter() - started
    answered = store.reader.indexed_answers
    # A page of history the hot tier does not hold: the table's, through the index.
    hot_from = store.hot.start_ns if store.hot.start_ns is not None else 2**63
    older = [(p, first) for p, first, _ in expected.full_pages if first.messages and p.time_end <= hot_from]
    page_spec, before = next(
        (c for c in older if c[0].range_name == "1d"),
        older[0] if older else next(((p, first) for p, first, _ in expected.full_pages), (None, None)),
    )
    assert page_spec is not None  # --queries is positive: expected.full_pages is never empty
    page, first_ms = _timed(store.query, page_spec.query())
    started = time.perf_counter()
    filled = store.writes.filter_ready.wait(600)
    restart = {
        "ready_s": round(ready_s, 3),
        "first_page_ms": _round(first_ms),
        "first_page_messages": len(page.messages),
        "first_page_from_index": store.reader.indexed_answers > answered,
        "first_page_equal": page == before,
        "indexes_mapped": store.reader.index_loads,
        "indexes_built": store.reader.index_builds,
        "key_filter_filled_s": round(ready_s + time.perf_counter() - started, 3) if filled else None,
    }
    _say(
        f"delta: restarted, ready in {ready_s:.2f} s, first page {first_ms:.1f} ms "
        f"({restart['indexes_mapped']} indexes mapped, {restart['indexes_built']} built)"
    )
    return store, restart


def check_integrity(table, spec: DatasetSpec) -> dict:
    """Compare the table with the dataset's distinct messages (its original
    slots, not what the puts accepted: a re-send older than the recent-MUID
    set is accepted by the put and dropped by the commit): the same count
    and the same order-independent fingerprint of the message hashes
    (xor and sum of their first 8 bytes), read from the table in chunks."""
    started = time.perf_counter()
    wanted = bench_dataset.originals_fingerprint(spec)
    held = bench_dataset.Fingerprint(0, 0, 0)
    for prefixes in table.prefix_batches("message_hash"):
        held = held + bench_dataset.Fingerprint.of_prefixes(prefixes)
    elapsed = time.perf_counter() - started
    _say(
        f"delta: integrity: table {held.count} rows, dataset {wanted.count} distinct messages, "
        f"fingerprints {'equal' if held == wanted else 'DIFFER'} ({elapsed:.1f} s)"
    )
    return {
        "ok": held == wanted,
        "table": {"count": held.count, "xor": f"{held.xor:016x}", "sum": f"{held.total:016x}"},
        "dataset": {"count": wanted.count, "xor": f"{wanted.xor:016x}", "sum": f"{wanted.total:016x}"},
        "seconds": round(elapsed, 3),
    }


def _delta_queries(store, spec: DatasetSpec, args, engine_ms: list[float]) -> tuple[Timings, Expected]:
    """Time the page and lookup queries; ``engine_ms`` gets the time each
    page spent reading the table (the in-process reader), the rest being
    Python."""
    for warm in _take(page_specs(spec, args.seed + 1), WARMUP_QUERIES):
        store.query(warm.query())
    reader = store.reader
    page = reader.page

    def timed_page(*a, **kw):
        started = time.perf_counter()
        try:
            return page(*a, **kw)
        finally:
            engine_ms.append((time.perf_counter() - started) * 1000)

    reader.page = timed_page
    try:
        return _timed_queries(store, spec, args, engine_ms)
    finally:
        del reader.page


class _SparkPages:
    """The table read through the engine, one Spark Connect query a page:
    how committed history was read before the in-process reader, measured
    beside it on the same table and the same queries."""

    def __init__(self, table) -> None:
        from wakustore.storage.spark_oracle import SparkPages

        oracle = SparkPages(table)
        self.page = oracle.page
        self.timestamp_of_hash = oracle.timestamp_of_hash

    def committed(self) -> None:
        pass


def _spark_path_queries(store, spec: DatasetSpec, args, expected: Expected) -> dict:
    """The same pages and lookups through the engine; every answer must
    equal the reader's, message for message (``crosscheck``)."""
    reader = store.reader
    store.reader = _SparkPages(store.table)
    store.reads.forget_cursors()
    try:
        for warm in _take(page_specs(spec, args.seed + 1), WARMUP_QUERIES):
            store.query(warm.query())
        store.reads.forget_cursors()
        timings = Timings()
        check: dict[str, Any] = {"checked": 0, "mismatches": 0, "examples": []}

        def compare(what: str, mine: Page, theirs: Page) -> None:
            check["checked"] += 1
            if mine != theirs:
                check["mismatches"] += 1
                if len(check["examples"]) < 5:
                    check["examples"].append(
                        {"query": what, "spark": len(mine.messages), "reader": len(theirs.messages)}
                    )
                _say(f"!!! spark path: different answer on {what}")

        for page_spec, first_page, second_page in expected.full_pages:
            first, ms = _timed(store.query, page_spec.query())
            timings.add(f"{page_spec.range_name}/first", ms)
            compare(_describe(page_spec, "first"), first, first_page)
            if second_page is not None and first.next_cursor is not None:
                page, ms = _timed(store.query, page_spec.query(first.next_cursor.message_hash))
                timings.add(f"{page_spec.range_name}/cursor", ms)
                compare(_describe(page_spec, "cursor"), page, second_page)
        for (shape, query, _), reader_page in zip(expected.lookups, expected.lookup_pages):
            page, ms = _timed(store.query, query)
            timings.add(shape, ms)
            compare(f"{shape} lookup", page, reader_page)
        _say(f"spark path: {check['checked']} answers compared with the reader, {check['mismatches']} differ")
        return {**timings.summary(), "crosscheck": check}
    finally:
        store.reader = reader
        store.reads.forget_cursors()


def _timed_queries(store, spec: DatasetSpec, args, engine_ms: list[float]) -> tuple[Timings, Expected]:
    timings = Timings()
    pages = []
    full_pages = []
    executed = 0
    querying = Progress("delta: queries", total=args.queries)
    for page_spec in page_specs(spec, args.seed):
        if executed >= args.queries:
            break
        first, ms = _timed(store.query, page_spec.query())
        timings.add(f"{page_spec.range_name}/first", ms)
        executed += 1
        second = page = None
        if first.next_cursor is not None and executed < args.queries:
            page, ms = _timed(store.query, page_spec.query(first.next_cursor.message_hash))
            timings.add(f"{page_spec.range_name}/cursor", ms)
            executed += 1
            second = _hashes(page)
        pages.append((page_spec, _hashes(first), first.next_cursor is not None, second))
        full_pages.append((page_spec, first, page))
        querying.set(executed)
    querying.close()
    pages_only = len(engine_ms)
    lookups = []
    lookup_pages = []
    for shape, query in hash_lookups(spec, args.seed, args.lookups):
        page, ms = _timed(store.query, query)
        timings.add(shape, ms)
        lookups.append((shape, query, _hashes(page)))
        lookup_pages.append(page)
    del engine_ms[pages_only:]  # lookups are reported on their own
    return timings, Expected(pages, lookups, full_pages, lookup_pages)


def _run_backend(name: str, spec: DatasetSpec, args, report: dict, expected: Expected, batch_size: int) -> bool:
    """Load (same batches as the node), query and cross-check one SQL
    backend; False when it failed."""
    from wakustore.bench import sql as bench_sql

    directory = Path(tempfile.mkdtemp(prefix=f"wakustore-bench-{name}-"))
    backend: bench_sql.PostgresBackend | bench_sql.SqliteBackend
    if name == "postgres":
        backend = bench_sql.PostgresBackend(spec.start_ns, spec.end_ns, say=_say)
    else:
        backend = bench_sql.SqliteBackend(directory)
    out: dict = {}
    report[name] = out
    try:
        _say(f"{name}: starting")
        started = time.perf_counter()
        backend.start()
        out["setup_s"] = round(time.perf_counter() - started, 3)
        load_s = 0.0
        offered = 0
        for batch in bench_dataset.stream(spec, batch_size):
            started = time.perf_counter()
            backend.load_batch(batch)
            load_s += time.perf_counter() - started
            offered += len(batch)
        out["ingest_msgs_per_s"] = round(offered / load_s, 1)
        out["ingest_s"] = round(load_s, 3)
        out["rows"] = backend.loaded
        out.update({k: round(v, 3) for k, v in backend.after_load().items()})
        _say(f"{name}: loaded {backend.loaded} rows in {load_s:.1f} s")
        for warm in _take(page_specs(spec, args.seed + 1), WARMUP_QUERIES):
            backend.query(warm.query())
        timings = Timings()
        check: dict[str, Any] = {"checked": 0, "mismatches": 0, "examples": []}

        def compare(
            what: str,
            mine: list[bytes] | None,
            delta: list[bytes] | None,
            mine_more: bool = False,
            delta_more: bool = False,
        ) -> None:
            """Same set of hashes (None: the page could not be asked) and the
            same answer to "is there a next page"."""
            check["checked"] += 1
            same = (None if mine is None else set(mine)) == (None if delta is None else set(delta))
            if not same or mine_more != delta_more:
                check["mismatches"] += 1
                if len(check["examples"]) < 5:
                    check["examples"].append(
                        {
                            "query": what,
                            "delta": None if delta is None else len(delta),
                            name: None if mine is None else len(mine),
                            "next_cursor": {"delta": delta_more, name: mine_more},
                            "only_delta": sorted(h.hex() for h in set(delta or ()) - set(mine or ()))[:3],
                            f"only_{name}": sorted(h.hex() for h in set(mine or ()) - set(delta or ()))[:3],
                        }
                    )
                _say(f"!!! {name}: MISMATCH with delta on {what}")

        for page_spec, delta_first, delta_more, delta_second in expected.pages:
            first, ms = _timed(backend.query, page_spec.query())
            timings.add(f"{page_spec.range_name}/first", ms)
            more = first.next_cursor is not None
            compare(_describe(page_spec, "first"), _hashes(first), delta_first, more, delta_more)
            if delta_second is not None:
                second = None
                if more:
                    page, ms = _timed(backend.query, page_spec.query(first.next_cursor.message_hash))
                    timings.add(f"{page_spec.range_name}/cursor", ms)
                    second = _hashes(page)
                compare(_describe(page_spec, "cursor"), second, delta_second)
        for shape, query, delta_hashes in expected.lookups:
            page, ms = _timed(backend.query, query)
            timings.add(shape, ms)
            compare(f"{shape} lookup", _hashes(page), delta_hashes)
        out.update(timings.summary())
        out["bytes"] = backend.size_bytes()
        if isinstance(backend, bench_sql.PostgresBackend):  # name == "postgres"
            out["partitions"] = backend.partitions
        out["crosscheck"] = check
        out["ratios"] = {
            key.replace("_ms", ""): _ratio(report.get(key), out.get(key))
            for key in ("query_p50_ms", "query_p99_ms", "hash_lookup_p50_ms")
        }
        _say(f"{name}: {check['checked']} answers cross-checked, {check['mismatches']} mismatches")
        return True
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
        _say(f"!!! {name}: FAILED: {out['error']}")
        return False
    finally:
        try:
            backend.close()
        finally:
            shutil.rmtree(directory, ignore_errors=True)


def _per_row_us(times: list[float], rows: list[int], part: slice) -> float | None:
    committed = sum(rows[part])
    return _round(sum(times[part]) / committed * 1e6) if committed else None


def _ratio(delta: float | None, other: float | None) -> float | None:
    if delta is None or not other:
        return None
    # Three significant figures: Delta's hash lookups run ~200x below
    # PostgreSQL's, which two decimals round to 0.
    return float(f"{delta / other:.3g}")


def _describe(page_spec: PageSpec, kind: str) -> str:
    direction = "forward" if page_spec.forward else "backward"
    return f"{page_spec.range_name}/{kind} {direction} {','.join(page_spec.content_topics)} @{page_spec.time_end}"


def _hashes(page: Page) -> list[bytes]:
    return [m.message_hash for m in page.messages]


def _take(iterator, n):
    for _, item in zip(range(n), iterator):
        yield item


# --- output ------------------------------------------------------------------


def _print_table(report: dict) -> None:
    names = ["delta", "delta/spark", *(n for n in report["compare"] if "error" not in report.get(n, {}))]
    column = {"delta": report, "delta/spark": report.get("spark_path", {}), **{n: report[n] for n in names[2:]}}

    def cell(value) -> str:
        if value is None:
            return "-"
        if isinstance(value, float):
            return f"{value:,.1f}" if abs(value) >= 100 else f"{value:,.2f}"
        return f"{value:,}" if isinstance(value, int) else str(value)

    rows: list[tuple[str, list]] = [
        ("ingest msg/s", [column[n].get("ingest_msgs_per_s") for n in names]),
        ("ingest s", [column[n].get("ingest_s") for n in names]),
        ("query p50 ms", [column[n].get("query_p50_ms") for n in names]),
        ("query p99 ms", [column[n].get("query_p99_ms") for n in names]),
    ]
    shapes = sorted({s for n in names for s in column[n].get("per_shape", {})}, key=_shape_order)
    for shape in shapes:
        rows.append(
            (
                f"  {shape} p50 ms (n)",
                [
                    None
                    if shape not in column[n].get("per_shape", {})
                    else f"{cell(column[n]['per_shape'][shape]['p50_ms'])} ({column[n]['per_shape'][shape]['n']})"
                    for n in names
                ],
            )
        )
    rows += [
        ("hash lookup p50 ms", [column[n].get("hash_lookup_p50_ms") for n in names]),
        ("bytes on disk", [column[n].get("bytes") for n in names]),
    ]
    print(
        f"\nstore benchmark: {report['messages']:,} messages offered "
        f"({report.get('unique_messages', 0):,} unique, {report.get('accepted', 0):,} accepted by the puts), "
        f"{report['machine']['cpus']} CPUs, "
        f"load average {report['machine']['loadavg_start'][0]} at start"
    )
    width = max(len(r[0]) for r in rows) + 2
    print("".ljust(width) + "".join(n.rjust(18) for n in names))
    for label, values in rows:
        print(label.ljust(width) + "".join(cell(v).rjust(18) for v in values))
    print(
        f"\ndelta: compact {report.get('compact_s')} s ({report['table']['files_before_compact']} -> "
        f"{report['table']['files_after_compact']} files), Spark Connect round trip p50 "
        f"{report.get('round_trip_p50_ms')} ms, table read part of a page p50 {report.get('reader_page_p50_ms')} ms"
    )
    spark = report.get("spark_path", {}).get("crosscheck", {})
    print(
        "delta: pages read in process; delta/spark: the same queries through the engine, "
        f"{spark.get('checked')} answers compared, {spark.get('mismatches')} differ"
    )
    rss = report.get("peak_rss_mb", {})
    print(f"peak RSS: node {rss.get('node')} MB, engine {rss.get('engine')} MB")
    during = report.get("ingest_peak_rss_mb")
    if during:
        print(
            f"peak RSS during the ingest (sampled): node {during['node']} MB, engine {during['engine']} MB, "
            f"both at once {during['sum']} MB; held at its end: {during.get('held_mb')}"
        )
    cpu = report.get("ingest_cpu_s")
    if cpu:
        split = report.get("ingest_breakdown_s", {})
        print(
            f"ingest CPU s: put thread {cpu['put_thread']} (generation {split.get('generate')} s of it, wall), "
            f"committer thread {cpu['committer_thread']}, node process {cpu['node']}, "
            f"hash worker {cpu.get('workers')}, engine {cpu['engine']}; "
            f"wall {report.get('ingest_s')} s"
        )
    for name in report["compare"]:
        out = report.get(name, {})
        if "error" in out:
            print(f"{name}: FAILED: {out['error']}")
            continue
        ratios = ", ".join(f"{k} {'-' if v is None else f'{v:.3g}'}x" for k, v in out.get("ratios", {}).items())
        check = out.get("crosscheck", {})
        print(
            f"delta/{name}: {ratios}; cross-check {check.get('checked')} answers, {check.get('mismatches')} mismatches"
        )
