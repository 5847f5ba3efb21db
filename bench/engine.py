"""``wakustore bench engine``: the engine itself, for putting Sail and
Apache Spark side by side: its first start (spawn, the first session, the
first ``SELECT 1``), its memory once idle, a round trip, and with
``--table-of DIR`` (a node's data dir, e.g. left by ``bench store
--data-dir DIR``) the operator's aggregates through the engine (``db
sql``'s path: messages per content topic per day, bytes per shard) and a
day's maintenance (commit, a retention that drops the oldest day,
compaction, checkpoint, vacuum), with the engine's peak memory.

Prints one JSON object (also written to ``--json``). The engine is the
node's own embedded one by default (``--engine sail|spark``).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

from wakustore.bench.common import add_common_arguments, positive_int
from wakustore.bench.store import percentile

MIB = 1024 * 1024

# What an operator asks of a store's history (README, "The history as an open dataset").
AGGREGATES = {
    "messages_per_topic_per_day": (
        "SELECT content_topic, day, count(*) AS messages FROM messages GROUP BY content_topic, day"
    ),
    "bytes_per_shard": (
        "SELECT pubsub_topic, sum(length(payload) + length(meta)) AS bytes, count(*) AS messages "
        "FROM messages GROUP BY pubsub_topic"
    ),
}


def register_verb(verbs: argparse._SubParsersAction) -> None:
    verb = verbs.add_parser("engine", help="the engine: first start, idle memory, aggregates, a day's maintenance")
    verb.add_argument("--table-of", type=Path, help="a node's data dir whose table the aggregates and maintenance use")
    verb.add_argument("--idle-s", type=positive_int, default=10, help="seconds idle before the memory is read")
    verb.add_argument("--probes", type=positive_int, default=20, help="SELECT 1 round trips timed")
    verb.add_argument("--no-maintenance", action="store_true", help="with --table-of: aggregates only")
    add_common_arguments(verb, "unused (see --table-of)")
    verb.set_defaults(handler=run_engine_bench)


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


class _PeakRss:
    """The engine's resident memory, sampled every 0.1 s while inside."""

    def __init__(self, engine):
        self.engine = engine
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *_):
        self._stop.set()
        self._thread.join()

    def _run(self):
        while not self._stop.wait(0.1):
            self.peak = max(self.peak, self.engine.rss_bytes() or 0)


def run_engine_bench(args: argparse.Namespace) -> int:
    from wakustore.node import config as node_config

    config = node_config.load(args.config, {"engine": args.engine, "data_dir": args.table_of})
    config.validate()
    figures: dict = {"engine": config.engine}
    engine = node_config.new_engine(config)
    started = time.monotonic()
    engine.start()
    figures["first_start_s"] = round(time.monotonic() - started, 2)
    figures["start_rss_mb"] = round((engine.rss_bytes() or 0) / MIB)
    _say(f"{config.engine}: started in {figures['first_start_s']} s, {figures['start_rss_mb']} MB")
    try:
        probes = []
        for _ in range(args.probes):
            began = time.monotonic()
            engine.run(lambda spark: spark.sql("SELECT 1").collect())
            probes.append((time.monotonic() - began) * 1000)
        figures["select_1_p50_ms"] = round(percentile(probes, 50) or 0.0, 1)
        time.sleep(args.idle_s)
        figures["idle_rss_mb"] = round((engine.rss_bytes() or 0) / MIB)
        _say(f"SELECT 1 p50 {figures['select_1_p50_ms']} ms; idle {figures['idle_rss_mb']} MB")
        if args.table_of is not None:
            figures.update(_on_table(config, engine, not args.no_maintenance))
    finally:
        engine.close()
    text = json.dumps(figures)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


def _on_table(config, engine, maintain: bool) -> dict:
    from wakustore.storage import maintenance, schema
    from wakustore.storage.table import DeltaTableRef

    table = DeltaTableRef(engine, config.messages_uri)
    figures: dict = {}
    with _PeakRss(engine) as rss:
        for name, statement in AGGREGATES.items():
            runs = []
            for _ in range(2):  # cold, then warm
                began = time.monotonic()
                rows = table.query_sql(statement, 1_000_000).num_rows
                runs.append(round(time.monotonic() - began, 2))
            figures[name] = {"seconds": runs, "rows": rows}
            _say(f"{name}: {runs} s, {rows} rows")
        figures["aggregates_engine_peak_mb"] = round(rss.peak / MIB)
    if not maintain:
        return figures
    from wakustore.node import data_dir
    from wakustore.node.store_service import open_store

    stats = maintenance.stats(table)
    if stats.oldest_ns is None:
        return figures
    # A day's maintenance: the oldest day leaves under a time retention.
    now_ns = time.time_ns()
    keep_s = (now_ns - schema.day_start_ns(schema.day_of_ns(stats.oldest_ns)) - 86_400 * 10**9) // 10**9
    policy = maintenance.RetentionPolicy(max_age_s=max(1, keep_s))
    with data_dir.lock(config.data_dir):
        _, store = open_store(config, engine)
        try:
            with _PeakRss(engine) as rss:
                began = time.monotonic()
                result = maintenance.run_maintenance(store, policy, now_ns, vacuum_hours=0)
                figures["maintenance_s"] = round(time.monotonic() - began, 2)
            figures["maintenance_engine_peak_mb"] = round(rss.peak / MIB)
            retention = result.retention
            figures["maintenance_rows"] = {
                "before": retention.rows_before if retention else None,
                "after": retention.rows_after if retention else None,
            }
            figures["maintenance_compaction"] = result.compaction
        finally:
            store.close()
    _say(f"maintenance: {figures['maintenance_s']} s, engine peak {figures['maintenance_engine_peak_mb']} MB")
    return figures
