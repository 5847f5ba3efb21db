"""``wakustore db``: stats, compaction, vacuum, retention, bulk import/export.

JSON Lines: one object per message with ``pubsub_topic``, ``content_topic``,
``payload`` (hex), ``meta`` (hex), ``timestamp`` (ns) and ``version``; the
same shape ``wakustore query --json`` prints.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from wakustore.cli.progress import Progress
from wakustore.node import config as node_config
from wakustore.protocols.message import WakuMessage
from wakustore.usage import UsageError, parse_hex

# Commands that only read the committed table: no lock, they run beside a node.
READ_ONLY_VERBS = frozenset({"stats", "export", "check", "sql"})
MAX_JSONL_LINE = 1024 * 1024  # a 150 KiB payload in hex plus topics fits


# storage.maintenance.DEFAULT_VACUUM_HOURS, a literal so that building the
# parser loads no storage code (a test keeps them equal).
DEFAULT_VACUUM_HOURS = 168
# db sql: rows printed by default and at most.
SQL_ROW_LIMIT = 1000
SQL_MAX_ROWS = 1_000_000
_QUERY_WORDS = ("select", "with", "show", "describe", "desc", "explain", "values", "table")


def register(commands: argparse._SubParsersAction) -> None:
    db = commands.add_parser("db", help="table maintenance and bulk load")
    verbs = db.add_subparsers(dest="verb", required=True, parser_class=commands._parser_class)
    for verb, handler, summary in (
        ("stats", _stats, "row count, files, bytes and time range of the table"),
        ("compact", _compact, "merge the table's small files"),
        ("vacuum", _vacuum, "delete files no longer referenced by the table"),
        ("retention", _retention, "delete messages outside the retention policy"),
        ("import", _import, "load messages from a JSONL file (duplicates are skipped)"),
        ("export", _export, "write messages to a JSONL file"),
        ("sql", _sql, "run a read-only SQL query over the messages table (Spark SQL), beside a running node"),
        (
            "check",
            _check,
            "read back and verify the table's data files, the key index and the write-ahead log; "
            "exit 1 when something is wrong",
        ),
    ):
        sub = verbs.add_parser(verb, help=summary)
        sub.add_argument("--data-dir", type=Path, required=True, help="the node's data directory (required)")
        sub.add_argument("--config", type=Path, help="node TOML configuration")
        sub.add_argument("--engine", help="'sail', 'spark' or sc://host:port (default: from the configuration)")
        if verb == "vacuum":
            sub.add_argument(
                "--retention-hours",
                type=int,
                default=DEFAULT_VACUUM_HOURS,
                help="keep unreferenced files this recent",
            )
        if verb == "sql":
            sub.add_argument("query", help="SELECT ... FROM messages ... (or WITH ...); one JSON object a row")
            sub.add_argument(
                "--limit", type=int, default=SQL_ROW_LIMIT, help=f"rows printed at most, 1 to {SQL_MAX_ROWS}"
            )
        if verb == "retention":
            sub.add_argument("--policy", help="default: the node's configured policy")
        if verb == "import":
            sub.add_argument(
                "--from-jsonl", type=Path, required=True, help="one message per line, as db export writes (required)"
            )
        if verb == "export":
            sub.add_argument(
                "--to-jsonl", type=Path, required=True, help="file to write, one message per line (required)"
            )
            sub.add_argument("--pubsub-topic", help="only this pubsub topic (default: all)")
            sub.add_argument(
                "--content-topic", action="append", dest="content_topics", help="only this content topic; repeatable"
            )
            sub.add_argument("--start", type=int, help="Unix ns, inclusive")
            sub.add_argument("--end", type=int, help="Unix ns, exclusive")
        sub.set_defaults(handler=handler if verb in READ_ONLY_VERBS else _writing(handler))


def _config(args) -> node_config.NodeConfig:
    return node_config.load(args.config, {"data_dir": args.data_dir, "engine": args.engine})


def _writing(handler):
    """``handler`` run under the data dir's writer lock: it opens the store,
    which replays and trims the write-ahead log and commits to the table."""

    def run(args) -> int:
        from wakustore.node import data_dir

        with data_dir.lock(_config(args).data_dir):
            return handler(args)

    return run


def _open(args):
    """Engine and store for a command that writes (under :func:`_writing`)."""
    from wakustore.node.store_service import open_store

    config = _config(args)
    return config, *open_store(config)


def _open_read_only(args):
    """Engine and the committed table, for a command that only reads: no
    lock, and nothing written to the data dir (the table is not created,
    the write-ahead log is neither replayed nor trimmed), so it runs beside
    a node that writes the same data dir."""
    from wakustore.node import data_dir
    from wakustore.storage.table import DeltaTableRef

    config = _config(args)
    data_dir.check_readable(config.data_dir)
    uri = config.messages_uri
    if "://" not in uri and not (Path(uri) / "_delta_log").is_dir():
        raise UsageError(f"no message table at {uri} (nothing was stored with data dir {config.data_dir})")
    engine = node_config.new_engine(config)
    engine.start()
    return config, engine, DeltaTableRef(engine, uri)


def _in_log(config: node_config.NodeConfig) -> int:
    """Messages in the write-ahead log (where open_store keeps it), counted
    without touching it; some may already be committed."""
    from wakustore.storage.wal import count_records
    from wakustore.storage.write_path import record_rows

    return count_records(config.data_dir / "wal" / "messages", weigh=record_rows)


def _stats(args) -> int:
    from wakustore.storage import maintenance

    config, engine, table = _open_read_only(args)
    try:
        s = maintenance.stats(table)
        print(
            json.dumps(
                {
                    "table": config.messages_uri,
                    "version": s.version,
                    "files": s.files,
                    "bytes": s.bytes,
                    "rows": s.rows,
                    "days": s.days,
                    "oldest_ns": s.oldest_ns,
                    "newest_ns": s.newest_ns,
                    "pending_in_log": _in_log(config),
                }
            )
        )
    finally:
        engine.close()
    return 0


def _check(args) -> int:
    """Read every file of the data dir back (storage/check.py); one line a
    problem on stdout, the totals last; exit 1 when one is found."""
    from wakustore.node import data_dir
    from wakustore.storage import check

    config = _config(args)
    data_dir.check_readable(config.data_dir)
    uri = config.messages_uri
    if "://" in uri:
        raise UsageError("db check reads a table on this machine's disk (the table is at " + uri + ")")
    if not (Path(uri) / "_delta_log").is_dir():
        raise UsageError(f"no message table at {uri} (nothing was stored with data dir {config.data_dir})")
    totals = check.Totals()
    findings = []
    with Progress("checking the data files", unit="B") as progress:
        for finding in check.check_table(uri, totals, progress.advance):
            findings.append(finding)
            print(finding.line(), flush=True)
    for finding in check.check_indexes(config.data_dir / "index" / "messages", uri, totals):
        findings.append(finding)
        print(finding.line(), flush=True)
    wal_root = config.data_dir / "wal"
    for log in sorted(p for p in wal_root.iterdir() if p.is_dir()) if wal_root.is_dir() else []:
        for finding in check.check_wal(log, totals, check.log_times(log.name)):
            findings.append(finding)
            print(finding.line(), flush=True)
    damage = [f for f in findings if f.damage]
    print(
        f"checked {totals.data_files:,} data files ({totals.rows:,} rows, {totals.bytes:,} bytes), "
        f"{totals.index_files:,} key index files, {totals.wal_segments:,} write-ahead log segments "
        f"({totals.wal_records:,} records): "
        + (f"{len(damage)} problem{'s' if len(damage) != 1 else ''}" if damage else "no problem found")
    )
    return 1 if damage else 0


def _compact(args) -> int:
    from wakustore.storage import maintenance

    config, engine, store = _open(args)
    try:
        # The node's maintenance routine without a retention policy.
        result = maintenance.run_maintenance(store, None, time.time_ns())
        print(json.dumps(result.compaction))
    finally:
        store.close()
        engine.close()
    return 0


def _vacuum(args) -> int:
    from wakustore.storage import maintenance

    config, engine, store = _open(args)
    try:
        print(json.dumps({"files_removed": maintenance.vacuum(store.table, args.retention_hours)}))
    finally:
        store.close()
        engine.close()
    return 0


def _retention(args) -> int:
    from wakustore.storage import maintenance

    if args.policy is not None:
        try:
            maintenance.RetentionPolicy.parse(args.policy)  # before the engine starts
        except maintenance.RetentionError as exc:
            raise UsageError(f"--policy: {exc}") from None
    keep_from = _archive_guard(_config(args))  # a bad archive key fails before the engine starts
    config, engine, store = _open(args)
    try:
        policy = maintenance.RetentionPolicy.parse(args.policy or config.retention)
        # The node's hourly maintenance routine, with the guard serve passes:
        # history not yet in a seeded community archive stays.
        guard = keep_from()
        result = maintenance.run_maintenance(store, policy, time.time_ns(), keep_from_ns=guard)
        retention = result.retention
        assert retention is not None  # a policy was passed, so it was applied
        print(
            json.dumps(
                {
                    "cutoff_ns": retention.cutoff_ns,
                    "rows_before": retention.rows_before,
                    "rows_after": retention.rows_after,
                    "keep_from_ns": guard,
                    **result.compaction,
                }
            )
        )
    except maintenance.RetentionError as exc:
        raise UsageError(str(exc)) from None
    finally:
        store.close()
        engine.close()
    return 0


def _archive_guard(config: node_config.NodeConfig) -> Callable[[], int | None]:
    """Retention's ``keep_from_ns`` as ``serve`` computes it for this
    configuration (a control node keeps what its archives do not hold yet)."""
    from wakustore.node.archive import archive_settings, keep_from_ns

    if not config.archive_key_file:
        return lambda: None
    settings = archive_settings(config)
    return lambda: keep_from_ns(settings)


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
    except KeyError as exc:
        raise UsageError(f"{where}: no {exc.args[0]} field") from None
    except (TypeError, ValueError):
        raise UsageError(f"{where}: timestamp and version must be integers") from None
    if not isinstance(pubsub, str) or not message.content_topic:
        raise UsageError(f"{where}: pubsub_topic and content_topic must be strings")
    return pubsub, message


def iter_jsonl(path: Path, check: Callable[[WakuMessage], None] | None = None) -> Iterator[tuple[str, WakuMessage]]:
    """(pubsub topic, message) per line of a JSON Lines file, streamed.

    Raises UsageError ``FILE:LINE: reason`` for a line that is malformed,
    over the bounds, or refused by ``check`` (which raises ValueError
    saying why), so a caller can stage every line before committing any.
    """
    with open(path, "rb") as handle:
        number = 0
        while raw := handle.readline(MAX_JSONL_LINE + 1):  # never reads an unbounded line
            number += 1
            where = f"{path}:{number}"
            if len(raw) > MAX_JSONL_LINE:
                raise UsageError(f"{where}: longer than {MAX_JSONL_LINE} bytes")
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise UsageError(f"{where}: not UTF-8 text") from None
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except ValueError as exc:  # also an integer past Python's digit limit
                raise UsageError(f"{where}: invalid JSON ({getattr(exc, 'msg', exc)})") from None
            except RecursionError:
                raise UsageError(f"{where}: invalid JSON (nested too deeply)") from None
            if not isinstance(obj, dict):
                raise UsageError(f"{where}: not a message object")
            pubsub, message = message_from_json(obj, where)
            try:
                _check_fields(obj, pubsub, message)
                if check is not None:
                    check(message)
            except ValueError as exc:
                raise UsageError(f"{where}: {exc}") from None
            yield pubsub, message


# The table's column types: timestamps are int64 nanoseconds, the version
# an int32 (the protobuf field is a uint32; larger values are not stored).
MAX_TIMESTAMP_NS = 2**63 - 1
MAX_VERSION = 2**31 - 1


def _check_fields(obj: dict, pubsub: str, message: WakuMessage) -> None:
    """What message_from_json lets through but the table cannot hold."""
    for name, top in (("timestamp", MAX_TIMESTAMP_NS), ("version", MAX_VERSION)):
        value = obj.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= top:
            raise ValueError(f"{name} must be an integer from 0 to {top}, got {value!r}")
    if not pubsub or not isinstance(message.content_topic, str):
        raise ValueError("pubsub_topic and content_topic must be non-empty strings")
    try:
        pubsub.encode()
        message.content_topic.encode()
    except UnicodeEncodeError:
        raise ValueError("a topic is not valid Unicode (lone surrogate escape)") from None


def _import(args) -> int:
    """One file, one transaction: every line is validated and staged before
    anything is committed, then a MERGE on MUID adds what the table lacks."""
    if not args.from_jsonl.is_file():
        raise UsageError(f"--from-jsonl: no such file {args.from_jsonl}")
    config, engine, store = _open(args)
    try:
        with Progress("staging", unit="messages") as progress:
            new, already = store.import_rows(_staged_lines(args.from_jsonl, progress))
    finally:
        store.close()
        engine.close()
    print(f"imported {new + already} messages: {new} new, {already} already stored", file=sys.stderr, flush=True)
    return 0


def _storable(message: WakuMessage) -> None:
    """The checks a relayed message passes (encoded size, meta size, content
    topic), except the clock drift: history is old, so "now" is the
    message's own time."""
    from wakustore.protocols.message import InvalidMessage, check_storable
    from wakustore.protocols.message_codec import encode_message

    try:
        check_storable(message, len(encode_message(message)), message.timestamp)
    except InvalidMessage as exc:
        raise ValueError(str(exc)) from None


def _staged_lines(path: Path, progress: Progress) -> Iterator[tuple[str, WakuMessage, int]]:
    for pubsub, message in iter_jsonl(path, _storable):
        yield pubsub, message, message.timestamp or time.time_ns()
        progress.advance()


def _sql(args) -> int:
    """Rows as JSON lines (bytes as hex); a statement that is not a query,
    or one the engine refuses, is one line and exit 2."""
    words = args.query.lstrip("( \n\t").split(None, 1)
    if not words or words[0].lower() not in _QUERY_WORDS:
        raise UsageError("db sql runs queries only: SELECT ... FROM messages (or WITH, SHOW, DESCRIBE, EXPLAIN)")
    if not 1 <= args.limit <= SQL_MAX_ROWS:
        raise UsageError(f"--limit must be 1 to {SQL_MAX_ROWS}")
    config, engine, table = _open_read_only(args)
    try:
        try:
            result = table.query_sql(args.query, args.limit)
        except Exception as exc:  # the engine's message, first line: what is wrong with the query
            text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise UsageError(f"query failed: {text[:500]}") from None
    finally:
        engine.close()
    for row in result.to_pylist():
        print(json.dumps({k: v.hex() if isinstance(v, bytes) else v for k, v in row.items()}, default=str))
    print(f"{result.num_rows} row{'' if result.num_rows == 1 else 's'}", file=sys.stderr)
    return 0


def _export(args) -> int:
    from wakustore.storage import maintenance
    from wakustore.storage.rows import rows_from_arrow

    if args.start is not None and args.end is not None and args.start >= args.end:
        raise UsageError(
            f"--start {args.start} is not before --end {args.end} (the range is start inclusive, end exclusive)"
        )

    config, engine, table = _open_read_only(args)
    written = 0
    try:
        s = maintenance.stats(table)
        start = args.start if args.start is not None else (s.oldest_ns or 0)
        end = args.end if args.end is not None else ((s.newest_ns or 0) + 1)
        # The whole table's row count is the total when nothing narrows the window.
        whole = args.start is None and args.end is None and not args.content_topics and args.pubsub_topic is None
        with (
            open(args.to_jsonl, "w", encoding="utf-8") as out,
            Progress("exporting", total=s.rows if whole else None, unit="messages") as progress,
        ):
            for day in table.window_days(start, end, args.content_topics, args.pubsub_topic):
                for row in rows_from_arrow(day):
                    out.write(json.dumps(message_to_json(row.pubsub_topic, row.message)) + "\n")
                    written += 1
                progress.set(written)
        print(f"exported {written} messages", file=sys.stderr, flush=True)
        waiting = _in_log(config)
        if waiting:
            print(
                f"{waiting} message(s) wait in the write-ahead log; those not yet in the table were not "
                "exported (a running node commits them within its flush interval, a stopped one when it starts)",
                file=sys.stderr,
                flush=True,
            )
    finally:
        engine.close()
    return 0
