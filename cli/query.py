"""``wakustore query`` and ``wakustore push``, over :class:`~wakustore.clients.store.StoreClient`.

``query`` prints one line per message (``--json``: one JSON object with
``hash``, ``pubsub_topic``, ``content_topic``, ``payload`` and ``meta`` in
hex, ``timestamp`` in ns and ``version``, the shape ``db import`` reads);
progress goes to stderr. ``push`` sends by lightpush v3 (``--legacy``:
v2beta1) and prints one JSON status line per message; ``--rate`` paces it.
Both wait out the node's rate limit (429) through :mod:`~wakustore.clients.backoff`.

Every failure is one line on stderr: a refused request, an unreachable or
wrong peer, a node that goes away mid-command exit 1; bad input exits 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from wakustore.protocols.errors import ProtocolError
from wakustore.protocols.message import DEFAULT_MAX_TIME_DRIFT_NS, HASH_SIZE, WakuMessage, message_hash
from wakustore.protocols.store_query import HistoryQuery, StatusCode
from wakustore.usage import UsageError, parse_hex

if TYPE_CHECKING:
    from wakustore.clients.backoff import Backoff
    from wakustore.clients.store import StoreClient
    from wakustore.protocols import lightpush, store_v3

EXIT_REFUSED = 1
# clients.store.DEFAULT_TIMEOUT_S, a literal so that building the parser
# loads no libp2p (a test keeps them equal).
DEFAULT_TIMEOUT_S = 20.0
# Pushes a second by default: the node's default lightpush limit per peer
# (node/rate_limits.py), so that a file of live messages is not refused.
DEFAULT_PUSH_RATE = 5.0


def register(commands: argparse._SubParsersAction) -> None:
    query = commands.add_parser("query", help="query a store node (Store v3)")
    query.add_argument("--peer", required=True, help="multiaddr ending in /p2p/<peer id>")
    query.add_argument("--pubsub-topic", help="/waku/2/rs/<cluster>/<shard>; with --content-topic (default: any)")
    query.add_argument(
        "--content-topic", action="append", dest="content_topics", default=[], help="repeatable, at most 10"
    )
    query.add_argument("--start", type=int, help="Unix ns, inclusive")
    query.add_argument("--end", type=int, help="Unix ns, exclusive")
    query.add_argument("--forward", action="store_true", help="oldest first (default: newest page first)")
    query.add_argument("--limit", type=int, default=20, help="page size (the node caps it at 100)")
    query.add_argument("--hashes", nargs="+", default=[], help="message hashes, hex")
    query.add_argument("--cursor", help="continue after this message hash (hex)")
    query.add_argument("--all", action="store_true", help="follow the cursor to the last page")
    query.add_argument("--json", action="store_true", help="one JSON object per message")
    query.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds per request")
    query.set_defaults(handler=run_query)

    push = commands.add_parser("push", help="push messages to a node by lightpush")
    push.add_argument("--peer", required=True, help="multiaddr ending in /p2p/<peer id>")
    push.add_argument("--pubsub-topic", help="/waku/2/rs/<cluster>/<shard> to push on (required without --from-jsonl)")
    push.add_argument("--content-topic", help="the message's content topic (required without --from-jsonl)")
    payload = push.add_mutually_exclusive_group()
    payload.add_argument("--payload", help="hex")
    payload.add_argument("--payload-file", type=Path, help="the payload's bytes, read from this file as they are")
    push.add_argument("--meta", help="hex")
    push.add_argument("--timestamp", type=int, help="Unix ns (default: now)")
    push.add_argument("--ephemeral", action="store_true", help="relayed, never stored")
    push.add_argument("--from-jsonl", type=Path, help="one message per line, the shape `db export` writes")
    push.add_argument("--legacy", action="store_true", help="lightpush v2beta1 instead of v3")
    push.add_argument(
        "--rate",
        type=float,
        default=DEFAULT_PUSH_RATE,
        help="at most N messages a second, 0: no pacing (default: 5, the node's default lightpush limit)",
    )
    push.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds per request")
    push.set_defaults(handler=run_push)


def run_query(args: argparse.Namespace) -> int:
    import trio

    from wakustore.clients.store import quiet_libp2p

    query = _query_from_args(args)
    quiet_libp2p()
    return trio.run(_query_main, args, query)


def run_push(args: argparse.Namespace) -> int:
    import trio

    from wakustore.clients.store import parse_peer, quiet_libp2p

    if args.from_jsonl is not None:
        if args.payload is not None or args.payload_file is not None or args.content_topic or args.pubsub_topic:
            raise UsageError("--from-jsonl excludes --pubsub-topic, --content-topic and --payload")
        if not args.from_jsonl.is_file():
            raise UsageError(f"--from-jsonl: no such file {args.from_jsonl}")
        messages = _read_jsonl(args.from_jsonl)
        _refuse_history(messages, args.from_jsonl)
    else:
        if args.payload_file is not None:
            try:
                args.payload = args.payload_file.read_bytes().hex()
            except OSError as exc:
                raise UsageError(f"--payload-file: {exc.strerror or exc}: {args.payload_file}") from None
        if not (args.pubsub_topic and args.content_topic and args.payload is not None):
            raise UsageError(
                "push needs --pubsub-topic, --content-topic and --payload or --payload-file (or --from-jsonl)"
            )
        if args.timestamp is not None and args.timestamp < 0:
            raise UsageError("--timestamp must not be negative")
        messages = [
            (
                args.pubsub_topic,
                WakuMessage(
                    payload=parse_hex(args.payload, "--payload"),
                    content_topic=args.content_topic,
                    meta=parse_hex(args.meta, "--meta") if args.meta else b"",
                    timestamp=args.timestamp if args.timestamp is not None else 0,
                    ephemeral=args.ephemeral,
                ),
            )
        ]
    if not (math.isfinite(args.rate) and args.rate >= 0):
        raise UsageError("--rate must be a number of messages a second, 0 for no pacing")
    parse_peer(args.peer)
    quiet_libp2p()
    return trio.run(_push_main, args, messages)


def _refuse_history(messages: list[tuple[str, WakuMessage]], path: Path) -> None:
    """Lightpush takes live messages only: a node refuses (420) any whose
    timestamp is outside its drift window. History (what `db export`
    wrote) is loaded with `db import`."""
    window = DEFAULT_MAX_TIME_DRIFT_NS
    now = time.time_ns()
    old = sum(1 for _, m in messages if m.timestamp and abs(now - m.timestamp) > window)
    if old:
        raise UsageError(
            f"{old} of {len(messages)} messages in {path} are more than {window // 1_000_000_000} s from now: "
            f"lightpush refuses them (420 timestamp_drift); load history into a node's table with "
            f"`wakustore db import --data-dir DIR --from-jsonl {path}` (the node stopped)"
        )


def _query_from_args(args: argparse.Namespace) -> HistoryQuery:
    from wakustore.clients.store import parse_peer

    hashes = tuple(parse_hex(h, "--hashes") for h in args.hashes)
    if any(len(h) != HASH_SIZE for h in hashes):
        raise UsageError(f"--hashes: each hash must be {HASH_SIZE} bytes")
    cursor = parse_hex(args.cursor, "--cursor") if args.cursor else None
    if cursor is not None and len(cursor) != HASH_SIZE:
        raise UsageError(f"--cursor must be {HASH_SIZE} bytes")
    if args.limit <= 0:
        raise UsageError("--limit must be positive")
    parse_peer(args.peer)
    return HistoryQuery(
        pubsub_topic=args.pubsub_topic,
        content_topics=tuple(args.content_topics),
        time_start=args.start,
        time_end=args.end,
        message_hashes=hashes,
        cursor=cursor,
        forward=args.forward,
        limit=args.limit,
    )


async def _query_main(args: argparse.Namespace, query: HistoryQuery) -> int:
    from wakustore.clients.backoff import Backoff
    from wakustore.clients.store import STORE_BACKOFF, ClientError, StoreClient

    total = pages = 0
    backoff = Backoff(STORE_BACKOFF)
    try:
        async with StoreClient.connect(args.peer, args.timeout) as client:
            responses = client.pages(query, backoff) if args.all else _one(client.query_patiently(query, backoff))
            async for response in responses:
                if response.status_code != StatusCode.OK:
                    _fail(
                        f"query refused: {response.status_code} {response.status_desc}"
                        + _gave_up(response.status_code == StatusCode.TOO_MANY_REQUESTS, backoff)
                    )
                    return EXIT_REFUSED
                pages += 1
                for entry in response.messages:
                    print(_format_entry(entry, args.json), flush=False)
                total += len(response.messages)
                sys.stdout.flush()
                if args.all:
                    print(
                        f"page {pages}: {len(response.messages)} messages, {total} in all", file=sys.stderr, flush=True
                    )
                elif response.cursor is not None:
                    print(f"more results: --cursor {response.cursor.hex()}", file=sys.stderr, flush=True)
    except (ClientError, ProtocolError) as exc:
        _fail(str(exc))
        return EXIT_REFUSED
    print(f"{_count(total, 'message')} in {_count(pages, 'page')}{_retried(backoff)}", file=sys.stderr, flush=True)
    return 0


async def _push_main(args: argparse.Namespace, messages: list[tuple[str, WakuMessage]]) -> int:
    import trio

    from wakustore.clients.backoff import Backoff
    from wakustore.clients.store import LIGHTPUSH_BACKOFF, ClientError, StoreClient

    refused = pushed = 0
    backoff = Backoff(LIGHTPUSH_BACKOFF)
    interval = 1.0 / args.rate if args.rate else 0.0
    try:
        async with StoreClient.connect(args.peer, args.timeout) as client:
            next_at = trio.current_time()
            for pubsub_topic, message in messages:
                if interval:
                    await trio.sleep_until(next_at)
                    next_at = max(next_at + interval, trio.current_time())
                if not message.timestamp:
                    # js-waku stamps every push; nwaku would stamp on arrival.
                    message = dataclasses.replace(message, timestamp=time.time_ns())
                ok, limited, line = await _push_one(client, pubsub_topic, message, args.legacy, backoff)
                print(json.dumps(line), flush=True)
                pushed += 1
                if ok:
                    continue
                refused += 1
                reason = f"{line.get('status_code', '')} {line.get('status_desc') or line.get('info') or ''}".strip()
                if limited:
                    # Still limited after a minute of waiting: the rest would be too.
                    _fail(
                        f"push refused: {reason}{_gave_up(True, backoff)}; "
                        f"{pushed - refused} of {len(messages)} messages pushed"
                    )
                    return EXIT_REFUSED
                _fail(f"push refused: {reason}")
    except (ClientError, ProtocolError) as exc:
        _fail(f"{exc} ({pushed - refused} of {len(messages)} messages pushed)" if pushed else str(exc))
        return EXIT_REFUSED
    if len(messages) > 1:
        print(f"pushed {len(messages)} messages, {refused} refused{_retried(backoff)}", file=sys.stderr, flush=True)
    elif not refused:
        print(
            "accepted; a store node keeps one message per MUID (payload, content topic, meta and pubsub topic): "
            "if it held one already, it kept that one and this hash is not stored",
            file=sys.stderr,
            flush=True,
        )
    return EXIT_REFUSED if refused else 0


async def _push_one(
    client: StoreClient, pubsub_topic: str, message: WakuMessage, legacy: bool, backoff: Backoff
) -> tuple[bool, bool, dict]:
    """Push, waiting out 429s; returns (accepted, still rate limited, JSON status line)."""
    from wakustore.protocols.lightpush import LightpushStatus

    digest = message_hash(pubsub_topic, message).hex()
    if legacy:
        answer = await backoff.call(lambda: client.push_legacy(pubsub_topic, message), _legacy_limited)
        line = {"hash": digest, "is_success": answer.is_success, "info": answer.info}
        return answer.is_success, _legacy_limited(answer), line
    response = await backoff.call(
        lambda: client.push(pubsub_topic, message),
        lambda a: a.status_code == LightpushStatus.TOO_MANY_REQUESTS,
    )
    line = {
        "hash": digest,
        "status_code": response.status_code,
        "status_desc": response.status_desc,
        "relay_peer_count": response.relay_peer_count,
    }
    ok = response.status_code == LightpushStatus.SUCCESS
    return ok, response.status_code == LightpushStatus.TOO_MANY_REQUESTS, line


def _count(n: int, what: str) -> str:
    return f"{n} {what}" if n == 1 else f"{n} {what}s"


def _legacy_limited(answer: lightpush.PushResponseV2) -> bool:
    # v2beta1 has no status code; nwaku's refusal text says it.
    return not answer.is_success and "too many requests" in (answer.info or "").lower()


def _retried(backoff: Backoff) -> str:
    return f", {backoff.retries} retries after a rate limit" if backoff.retries else ""


def _gave_up(limited: bool, backoff: Backoff) -> str:
    policy = backoff.policy
    return f" (still rate limited after backing off up to {policy.max_wait_s:g} s)" if limited else ""


def _read_jsonl(path: Path) -> list[tuple[str, WakuMessage]]:
    from wakustore.cli.db import iter_jsonl

    messages = list(iter_jsonl(path))
    if not messages:
        raise UsageError(f"--from-jsonl: {path} holds no messages")
    return messages


def _format_entry(entry: store_v3.ResponseEntry, as_json: bool) -> str:
    from wakustore.cli.db import message_to_json

    if entry.message is None:
        if as_json:
            return json.dumps({"hash": entry.message_hash.hex(), "pubsub_topic": entry.pubsub_topic})
        return entry.message_hash.hex()
    assert entry.pubsub_topic is not None  # store_v3.decode_response keeps a message only with its topic
    if as_json:
        return json.dumps(message_to_json(entry.pubsub_topic, entry.message, hash=entry.message_hash.hex()))
    m = entry.message
    return "\t".join(
        (entry.message_hash.hex(), str(m.timestamp), entry.pubsub_topic or "", m.content_topic, m.payload.hex())
    )


async def _one(awaitable):
    yield await awaitable


def _fail(text: str) -> None:
    one_line = " ".join(text.split())
    print(f"wakustore: error: {one_line}", file=sys.stderr, flush=True)
