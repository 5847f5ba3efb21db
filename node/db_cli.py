"""``wakustore db``: stats, compaction, vacuum, retention, bulk import/export.

JSON Lines: one object per message with ``pubsub_topic``, ``content_topic``,
``payload`` (hex), ``meta`` (hex), ``timestamp`` (ns) and ``version``; the
same shape ``wakustore query --json`` prints.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from wakustore.node import config as node_config
from wakustore.node.cli import UsageError, parse_hex
from wakustore.protocols.message import WakuMessage
from wakustore.storage import maintenance

IMPORT_BATCH = 5000
MAX_JSONL_LINE = 1024 * 1024  # a 150 KiB payload in hex plus topics fits


def register(commands: argparse._SubParsersAction) -> None:
    db = commands.add_parser("db", help="table maintenance and bulk load")
    verbs = db.add_subparsers(dest="verb", required=True, parser_class=commands._parser_class)
    for verb, handler in (
        ("stats", _stats), ("compact", _compact), ("vacuum", _vacuum), ("retention", _retention),
        ("import", _import), ("export", _export),
    ):
        sub = verbs.add_parser(verb)
        sub.add_argument("--data-dir", type=Path, required=True)
        sub.add_argument("--config", type=Path)
        sub.add_argument("--engine")
        if verb == "vacuum":
            sub.add_argument("--retention-hours", type=int, default=maintenance.DEFAULT_VACUUM_HOURS)
        if verb == "retention":
            sub.add_argument("--policy", help="default: the node's configured policy")
        if verb == "import":
            sub.add_argument("--from-jsonl", type=Path, required=True)
        if verb == "export":
            sub.add_argument("--to-jsonl", type=Path, required=True)
            sub.add_argument("--pubsub-topic")
            sub.add_argument("--content-topic", action="append", dest="content_topics")
            sub.add_argument("--start", type=int, help="Unix ns, inclusive")
            sub.add_argument("--end", type=int, help="Unix ns, exclusive")
        sub.set_defaults(handler=handler)


def _open(args):
    from wakustore.node.store_service import open_store

    config = node_config.load(args.config, {"data_dir": args.data_dir, "engine": args.engine})
    return config, *open_store(config)


def _stats(args) -> int:
    config, engine, store = _open(args)
    try:
        s = maintenance.stats(store.table)
        print(json.dumps({
            "table": config.messages_uri, "version": s.version, "files": s.files, "bytes": s.bytes,
            "rows": s.rows, "days": s.days, "oldest_ns": s.oldest_ns, "newest_ns": s.newest_ns,
            "pending_in_log": store.pending,
        }))
    finally:
        store.close()
        engine.close()
    return 0


def _compact(args) -> int:
    config, engine, store = _open(args)
    try:
        store.flush()
        result = maintenance.compact(store.table, today=dt.datetime.now(dt.timezone.utc).date())
        maintenance.checkpoint(store.table)
        print(json.dumps(result))
    finally:
        store.close()
        engine.close()
    return 0


def _vacuum(args) -> int:
    config, engine, store = _open(args)
    try:
        print(json.dumps({"files_removed": maintenance.vacuum(store.table, args.retention_hours)}))
    finally:
        store.close()
        engine.close()
    return 0


def _retention(args) -> int:
    if args.policy is not None:
        try:
            maintenance.RetentionPolicy.parse(args.policy)  # before the engine starts
        except maintenance.RetentionError as exc:
            raise UsageError(f"--policy: {exc}") from None
    config, engine, store = _open(args)
    try:
        policy = maintenance.RetentionPolicy.parse(args.policy or config.retention)
        store.flush()
        result = maintenance.apply_retention(store.table, policy, time.time_ns())
        print(json.dumps({"cutoff_ns": result.cutoff_ns, "rows_before": result.rows_before,
                          "rows_after": result.rows_after}))
    except maintenance.RetentionError as exc:
        raise UsageError(str(exc)) from None
    finally:
        store.close()
        engine.close()
    return 0


def message_to_json(pubsub_topic: str, message: WakuMessage, **extra) -> dict:
    return {
        **extra,
        "pubsub_topic": pubsub_topic,
        "content_topic": message.content_topic,
        "payload": message.payload.hex(),
        "meta": message.meta.hex(),
        "timestamp": message.timestamp,
        "version": message.version,
    }


def message_from_json(obj: dict, where: str) -> tuple[str, WakuMessage]:
    try:
        pubsub = obj["pubsub_topic"]
        message = WakuMessage(
            payload=parse_hex(obj.get("payload", ""), f"{where}: payload"),
            content_topic=obj["content_topic"],
            meta=parse_hex(obj.get("meta") or "", f"{where}: meta"),
            timestamp=int(obj.get("timestamp") or 0),
            version=int(obj.get("version") or 0),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise UsageError(f"{where}: not a message object ({exc})") from None
    if not isinstance(pubsub, str) or not message.content_topic:
        raise UsageError(f"{where}: pubsub_topic and content_topic must be strings")
    return pubsub, message


def iter_jsonl(path: Path) -> Iterator[tuple[str, WakuMessage]]:
    """(pubsub topic, message) per line of a JSON Lines file, streamed;
    UsageError naming the line for anything malformed or over the bounds."""
    with open(path, encoding="utf-8") as handle:
        number = 0
        while line := handle.readline(MAX_JSONL_LINE + 1):  # never reads an unbounded line
            number += 1
            if len(line) > MAX_JSONL_LINE:
                raise UsageError(f"line {number}: longer than {MAX_JSONL_LINE} characters")
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise UsageError(f"line {number}: invalid JSON ({exc.msg})") from None
            if not isinstance(obj, dict):
                raise UsageError(f"line {number}: not a message object")
            yield message_from_json(obj, f"line {number}")


def _import(args) -> int:
    from wakustore.protocols.message import DEFAULT_MAX_MESSAGE_SIZE

    if not args.from_jsonl.is_file():
        raise UsageError(f"--from-jsonl: no such file {args.from_jsonl}")
    config, engine, store = _open(args)
    total = accepted = 0
    try:
        batch = []
        for pubsub, message in iter_jsonl(args.from_jsonl):
            if len(message.payload) > DEFAULT_MAX_MESSAGE_SIZE:
                raise UsageError(f"payload of {len(message.payload)} bytes exceeds {DEFAULT_MAX_MESSAGE_SIZE}")
            batch.append((pubsub, message, message.timestamp or time.time_ns()))
            if len(batch) >= IMPORT_BATCH:
                accepted += store.put(batch).accepted
                total += len(batch)
                batch = []
                store.flush()
                print(f"imported {total} messages ({accepted} new)", file=sys.stderr, flush=True)
        if batch:
            accepted += store.put(batch).accepted
            total += len(batch)
        store.flush()
        print(f"imported {total} messages ({accepted} new)", file=sys.stderr, flush=True)
    finally:
        store.close()
        engine.close()
    return 0


def _export(args) -> int:
    config, engine, store = _open(args)
    written = 0
    try:
        store.flush()
        s = maintenance.stats(store.table)
        start = args.start if args.start is not None else (s.oldest_ns or 0)
        end = args.end if args.end is not None else ((s.newest_ns or 0) + 1)
        with open(args.to_jsonl, "w", encoding="utf-8") as out:
            for table in store.table.window_days(start, end, args.content_topics, args.pubsub_topic):
                from wakustore.storage.rows import rows_from_arrow

                for row in rows_from_arrow(table):
                    out.write(json.dumps(message_to_json(row.pubsub_topic, row.message)) + "\n")
                    written += 1
                print(f"exported {written} messages", file=sys.stderr, flush=True)
        print(f"exported {written} messages", file=sys.stderr, flush=True)
    finally:
        store.close()
        engine.close()
    return 0
