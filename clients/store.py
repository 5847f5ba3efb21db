"""``wakustore query`` and ``wakustore push``: a Store v3 and lightpush client.

:class:`StoreClient` runs its own short-lived libp2p host (a fresh key each
time), dials one node and speaks the request/response protocols: one
stream per request, the request frame written and the write side closed,
the response frame read, the stream closed.

``query`` prints one line per message (``--json``: one JSON object with
``hash``, ``pubsub_topic``, ``content_topic``, ``payload`` and ``meta`` in
hex, ``timestamp`` in ns and ``version``, the shape ``db import`` reads);
progress goes to stderr. ``push`` sends by lightpush v3 (``--legacy``:
v2beta1) and prints one JSON status line per message; ``--rate`` paces it.
Both wait out the node's rate limit (429) through :mod:`~wakustore.node.backoff`.

Every failure is one line on stderr: a refused request, an unreachable or
wrong peer, a node that goes away mid-command exit 1; bad input exits 2.
The client's libp2p host runs its connection in a nursery, so a failure
arrives wrapped in exception groups; :meth:`StoreClient.connect` takes the
meaningful exception out of them. An exception of a kind no failure mode
raises still propagates with its traceback.

py-libp2p is imported when a command runs, not when the parser is built:
every ``wakustore`` command builds the whole parser.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import os
import sys
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import trio

from wakustore.node.backoff import Backoff, BackoffPolicy
from wakustore.node.cli import UsageError, parse_hex
from wakustore.node.db_cli import iter_jsonl, message_to_json
from wakustore.node.failures import describe_failure, leaves
from wakustore.protocols import lightpush, metadata, store_v2, store_v3
from wakustore.protocols.errors import FramingError, ProtocolError
from wakustore.protocols.framing import (
    LIGHTPUSH_MAX_RESPONSE_SIZE,
    METADATA_MAX_SIZE,
    STORE_MAX_RESPONSE_SIZE,
    encode_frame,
)
from wakustore.protocols.lightpush import LightpushStatus
from wakustore.protocols.message import HASH_SIZE, WakuMessage, message_hash
from wakustore.protocols.store_query import HistoryQuery, StatusCode

# Dialing, the Noise handshake and identify take ~0.1 s on loopback; 20 s
# covers a slow peer across the world.
DEFAULT_TIMEOUT_S = 20.0

# A 429 is retried after a pause doubling from about one token's refill
# time up to the limit's period (a token bucket is full again one period
# after it emptied), for at most a minute of pauses in a row. The periods are
# the defaults of nwaku and wakustore (node/store_protocols.py
# DEFAULT_STORE_RATE 60/2s, DEFAULT_LIGHTPUSH_RATE 5/1s); a node limiting
# over a longer period is still retried every few seconds within the minute.
STORE_BACKOFF = BackoffPolicy(first_s=0.05, max_s=5.0, max_retries=60, max_wait_s=60.0, period_s=2.0)
LIGHTPUSH_BACKOFF = BackoffPolicy(first_s=0.2, max_s=5.0, max_retries=60, max_wait_s=60.0, period_s=1.0)

EXIT_REFUSED = 1


class ClientError(Exception):
    """The node could not be reached or answered something unusable."""


def _connection_failures() -> tuple[type[BaseException], ...]:
    """What dialing, a stream or a connection dying raises: sockets, trio's
    closed streams, and every libp2p error (dial, security handshake,
    multiselect, muxer)."""
    from libp2p.exceptions import BaseLibp2pError

    return (OSError, EOFError, trio.BrokenResourceError, trio.ClosedResourceError, BaseLibp2pError)


class StoreClient:
    """Requests to one node over one connection; see :meth:`connect`."""

    def __init__(self, host, peer_id, timeout_s: float):
        self.host = host
        self.peer_id = peer_id
        self.timeout_s = timeout_s

    @classmethod
    @asynccontextmanager
    async def connect(cls, peer: str, timeout_s: float = DEFAULT_TIMEOUT_S):
        """Dial ``peer`` (a multiaddr ending in ``/p2p/<peer id>``, TCP or
        ``/ws``) from a fresh host; yield the client. Raises
        :class:`UsageError` for a malformed address, :class:`ClientError`
        when the node cannot be reached within ``timeout_s`` seconds or the
        connection fails later. Exceptions leave unwrapped from the host's
        exception groups: the body's own first, then a connection failure
        as ClientError; a group holding neither is re-raised as it is."""
        from libp2p import new_host
        from libp2p.crypto.secp256k1 import create_new_key_pair

        from wakustore.node.host import stop_auto_dialing

        info = parse_peer(peer)
        host = new_host(key_pair=create_new_key_pair(), muxer_preference="YAMUX", enable_websocket=True)
        try:
            async with host.run(listen_addrs=[]):
                await stop_auto_dialing(host)
                try:
                    with trio.fail_after(timeout_s):
                        await host.connect(info)
                except trio.TooSlowError:
                    raise ClientError(f"no connection to {peer} within {timeout_s:g} s") from None
                except _connection_failures() as exc:
                    raise ClientError(f"cannot connect to {peer}: {describe_failure(exc)}") from None
                yield cls(host, info.peer_id, timeout_s)
        except BaseExceptionGroup as group:
            # host.run's nurseries wrap whatever ends the run, the caller's
            # own ClientError included.
            meaningful = _meaningful_error(group, peer)
            if meaningful is None:
                raise
            raise meaningful from None

    async def exchange(self, protocol: str, data: bytes, max_response: int) -> bytes | None:
        """Open a stream, write ``data`` as given (no framing added), close
        the write side and read one response frame; None when the node
        closed the stream without answering."""
        from libp2p.custom_types import TProtocol

        from wakustore.node.store_protocols import read_frame

        try:
            with trio.fail_after(self.timeout_s):
                stream = await self.host.new_stream(self.peer_id, [TProtocol(protocol)])
                try:
                    await stream.write(data)
                    await stream.close_write()
                    return await read_frame(stream, max_response)
                finally:
                    await stream.close()
        except trio.TooSlowError:
            raise ClientError(f"{protocol}: no answer within {self.timeout_s:g} s") from None
        except FramingError as exc:
            raise ClientError(f"{protocol}: malformed answer: {exc}") from None
        except _connection_failures() as exc:
            raise ClientError(f"{protocol}: {describe_failure(exc)}") from None

    async def request(self, protocol: str, body: bytes, max_response: int) -> bytes:
        """One framed request and its answer; ClientError when there is none."""
        answer = await self.exchange(protocol, encode_frame(body), max_response)
        if answer is None:
            raise ClientError(f"{protocol}: the node closed the stream without answering")
        return answer

    async def query(self, query: HistoryQuery, request_id: str | None = None) -> store_v3.StoreResponse:
        """One Store v3 page; raises StoreError (300) for an unusable response."""
        raw = await self.request(
            store_v3.PROTOCOL_ID, store_v3.encode_request(request_id or _request_id(), query),
            STORE_MAX_RESPONSE_SIZE,
        )
        return store_v3.decode_response(raw)

    async def query_patiently(self, query: HistoryQuery, backoff: Backoff) -> store_v3.StoreResponse:
        """One Store v3 page, sent again while the node answers 429."""
        return await backoff.call(
            lambda: self.query(query), lambda r: r.status_code == StatusCode.TOO_MANY_REQUESTS
        )

    async def pages(self, query: HistoryQuery, backoff: Backoff | None = None) -> AsyncIterator[store_v3.StoreResponse]:
        """Store v3 pages following the response cursor until there is none,
        each page waiting out a 429 through ``backoff`` (default: the
        :data:`STORE_BACKOFF` policy).

        Stops after a non-200 page (yielded). Raises ClientError when the
        node hands back a cursor it already gave (it would never end).
        """
        backoff = backoff or Backoff(STORE_BACKOFF)
        seen: set[bytes] = set()
        while True:
            response = await self.query_patiently(query, backoff)
            yield response
            if response.status_code != StatusCode.OK or response.cursor is None:
                return
            if response.cursor in seen:
                raise ClientError(f"the node repeated cursor {response.cursor.hex()}")
            seen.add(response.cursor)
            query = dataclasses.replace(query, cursor=response.cursor)

    async def query_legacy(self, **request) -> store_v2.HistoryResult:
        """One legacy Store v2 page; ``request`` as :func:`store_v2.encode_request`."""
        raw = await self.request(
            store_v2.PROTOCOL_ID, store_v2.encode_request(_request_id(), **request), STORE_MAX_RESPONSE_SIZE
        )
        return store_v2.decode_response(raw)

    async def push(self, pubsub_topic: str | None, message: WakuMessage) -> lightpush.PushResponseV3:
        """Lightpush v3; raises LightpushError (500) for an unusable response."""
        raw = await self.request(
            lightpush.PROTOCOL_ID_V3, lightpush.encode_request_v3(_request_id(), pubsub_topic, message),
            LIGHTPUSH_MAX_RESPONSE_SIZE,
        )
        return lightpush.decode_response_v3(raw)

    async def push_legacy(self, pubsub_topic: str, message: WakuMessage) -> lightpush.PushResponseV2:
        """Lightpush v2beta1."""
        raw = await self.request(
            lightpush.PROTOCOL_ID_V2, lightpush.encode_request_v2(_request_id(), pubsub_topic, message),
            LIGHTPUSH_MAX_RESPONSE_SIZE,
        )
        return lightpush.decode_response_v2(raw)

    async def metadata(self, ours: metadata.Metadata) -> metadata.Metadata:
        raw = await self.request(metadata.PROTOCOL_ID, metadata.encode_request(ours), METADATA_MAX_SIZE)
        return metadata.decode_response(raw)


def _meaningful_error(group: BaseExceptionGroup, peer: str) -> BaseException | None:
    """The exception a caller of :meth:`StoreClient.connect` should see for
    what ended the host's run: its own error first (trio.Cancelled leaves
    are only the siblings a failure cancelled), else a connection failure
    as ClientError; None for anything else."""
    found = leaves(group)
    for kind in (KeyboardInterrupt, UsageError, ClientError, ProtocolError):
        for leaf in found:
            if isinstance(leaf, kind):
                return leaf
    for leaf in found:
        if isinstance(leaf, (trio.TooSlowError, *_connection_failures())):
            return ClientError(f"connection to {peer} lost: {describe_failure(leaf)}")
    return None


def parse_peer(peer: str):
    """PeerInfo of a ``.../p2p/<peer id>`` multiaddr; UsageError otherwise."""
    import multiaddr
    from libp2p.peer.peerinfo import info_from_p2p_addr

    try:
        return info_from_p2p_addr(multiaddr.Multiaddr(peer))
    except Exception as exc:
        raise UsageError(f"--peer: not a multiaddr with /p2p/<peer id>: {peer!r} ({exc})") from None


# --- command line ---------------------------------------------------------------


def register(commands: argparse._SubParsersAction) -> None:
    query = commands.add_parser("query", help="query a store node (Store v3)")
    query.add_argument("--peer", required=True, help="multiaddr ending in /p2p/<peer id>")
    query.add_argument("--pubsub-topic")
    query.add_argument("--content-topic", action="append", dest="content_topics", default=[])
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
    push.add_argument("--pubsub-topic")
    push.add_argument("--content-topic")
    push.add_argument("--payload", help="hex")
    push.add_argument("--meta", help="hex")
    push.add_argument("--timestamp", type=int, help="Unix ns (default: now)")
    push.add_argument("--ephemeral", action="store_true")
    push.add_argument("--from-jsonl", type=Path, help="one message per line, the shape `db export` writes")
    push.add_argument("--legacy", action="store_true", help="lightpush v2beta1 instead of v3")
    push.add_argument("--rate", type=float,
                      help="at most N messages a second (the node's default lightpush limit is 5 a second)")
    push.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds per request")
    push.set_defaults(handler=run_push)


def run_query(args: argparse.Namespace) -> int:
    query = _query_from_args(args)
    _quiet_libp2p()
    return trio.run(_query_main, args, query)


def run_push(args: argparse.Namespace) -> int:
    if args.from_jsonl is not None:
        if args.payload is not None or args.content_topic or args.pubsub_topic:
            raise UsageError("--from-jsonl excludes --pubsub-topic, --content-topic and --payload")
        if not args.from_jsonl.is_file():
            raise UsageError(f"--from-jsonl: no such file {args.from_jsonl}")
        messages = _read_jsonl(args.from_jsonl)
    else:
        if not (args.pubsub_topic and args.content_topic and args.payload is not None):
            raise UsageError("push needs --pubsub-topic, --content-topic and --payload (or --from-jsonl)")
        if args.timestamp is not None and args.timestamp < 0:
            raise UsageError("--timestamp must not be negative")
        messages = [(args.pubsub_topic, WakuMessage(
            payload=parse_hex(args.payload, "--payload"),
            content_topic=args.content_topic,
            meta=parse_hex(args.meta, "--meta") if args.meta else b"",
            timestamp=args.timestamp if args.timestamp is not None else 0,
            ephemeral=args.ephemeral,
        ))]
    if args.rate is not None and not (math.isfinite(args.rate) and args.rate > 0):
        raise UsageError("--rate must be a positive number of messages a second")
    parse_peer(args.peer)
    _quiet_libp2p()
    return trio.run(_push_main, args, messages)


def _quiet_libp2p() -> None:
    """Keep stderr to the command's own lines. libp2p logs every failed dial
    attempt as an error; its logger has no handler unless LIBP2P_DEBUG is
    set, so Python's last-resort handler would print them."""
    import libp2p  # noqa: F401  (importing it configures its logger)

    if not os.environ.get("LIBP2P_DEBUG"):
        logging.getLogger("libp2p").addHandler(logging.NullHandler())


def _query_from_args(args: argparse.Namespace) -> HistoryQuery:
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
    total = pages = 0
    backoff = Backoff(STORE_BACKOFF)
    try:
        async with StoreClient.connect(args.peer, args.timeout) as client:
            responses = client.pages(query, backoff) if args.all else _one(client.query_patiently(query, backoff))
            async for response in responses:
                if response.status_code != StatusCode.OK:
                    _fail(f"query refused: {response.status_code} {response.status_desc}"
                          + _gave_up(response.status_code == StatusCode.TOO_MANY_REQUESTS, backoff))
                    return EXIT_REFUSED
                pages += 1
                for entry in response.messages:
                    print(_format_entry(entry, args.json), flush=False)
                total += len(response.messages)
                sys.stdout.flush()
                if args.all:
                    print(f"page {pages}: {len(response.messages)} messages, {total} in all",
                          file=sys.stderr, flush=True)
                elif response.cursor is not None:
                    print(f"more results: --cursor {response.cursor.hex()}", file=sys.stderr, flush=True)
    except (ClientError, ProtocolError) as exc:
        _fail(str(exc))
        return EXIT_REFUSED
    print(f"{total} messages in {pages} pages{_retried(backoff)}", file=sys.stderr, flush=True)
    return 0


async def _push_main(args: argparse.Namespace, messages: list[tuple[str, WakuMessage]]) -> int:
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
                    _fail(f"push refused: {reason}{_gave_up(True, backoff)}; "
                          f"{pushed - refused} of {len(messages)} messages pushed")
                    return EXIT_REFUSED
                _fail(f"push refused: {reason}")
    except (ClientError, ProtocolError) as exc:
        _fail(f"{exc} ({pushed - refused} of {len(messages)} messages pushed)" if pushed else str(exc))
        return EXIT_REFUSED
    if len(messages) > 1:
        print(f"pushed {len(messages)} messages, {refused} refused{_retried(backoff)}", file=sys.stderr, flush=True)
    return EXIT_REFUSED if refused else 0


async def _push_one(client: StoreClient, pubsub_topic: str, message: WakuMessage, legacy: bool,
                    backoff: Backoff) -> tuple[bool, bool, dict]:
    """Push, waiting out 429s; returns (accepted, still rate limited, JSON status line)."""
    digest = message_hash(pubsub_topic, message).hex()
    if legacy:
        answer = await backoff.call(lambda: client.push_legacy(pubsub_topic, message), _legacy_limited)
        line = {"hash": digest, "is_success": answer.is_success, "info": answer.info}
        return answer.is_success, _legacy_limited(answer), line
    answer = await backoff.call(
        lambda: client.push(pubsub_topic, message),
        lambda a: a.status_code == LightpushStatus.TOO_MANY_REQUESTS,
    )
    line = {"hash": digest, "status_code": answer.status_code,
            "status_desc": answer.status_desc, "relay_peer_count": answer.relay_peer_count}
    ok = answer.status_code == LightpushStatus.SUCCESS
    return ok, answer.status_code == LightpushStatus.TOO_MANY_REQUESTS, line


def _legacy_limited(answer: lightpush.PushResponseV2) -> bool:
    # v2beta1 has no status code; nwaku's refusal text says it.
    return not answer.is_success and "too many requests" in (answer.info or "").lower()


def _retried(backoff: Backoff) -> str:
    return f", {backoff.retries} retries after a rate limit" if backoff.retries else ""


def _gave_up(limited: bool, backoff: Backoff) -> str:
    policy = backoff.policy
    return f" (still rate limited after backing off up to {policy.max_wait_s:g} s)" if limited else ""


def _read_jsonl(path: Path) -> list[tuple[str, WakuMessage]]:
    messages = list(iter_jsonl(path))
    if not messages:
        raise UsageError(f"--from-jsonl: {path} holds no messages")
    return messages


def _format_entry(entry: store_v3.ResponseEntry, as_json: bool) -> str:
    if entry.message is None:
        if as_json:
            return json.dumps({"hash": entry.message_hash.hex(), "pubsub_topic": entry.pubsub_topic})
        return entry.message_hash.hex()
    if as_json:
        return json.dumps(message_to_json(entry.pubsub_topic, entry.message, hash=entry.message_hash.hex()))
    m = entry.message
    return "\t".join((entry.message_hash.hex(), str(m.timestamp), entry.pubsub_topic or "",
                      m.content_topic, m.payload.hex()))


async def _one(awaitable):
    yield await awaitable


def _request_id() -> str:
    return str(uuid.uuid4())


def _fail(text: str) -> None:
    one_line = " ".join(text.split())
    print(f"wakustore: error: {one_line}", file=sys.stderr, flush=True)
