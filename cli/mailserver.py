"""``wakustore mailserver request|post``, over :class:`~wakustore.clients.mailserver.MailserverClient`.

- ``request``: P2P Request envelopes as the client builds them; with
  ``--all`` it follows cursors to the end. One line per envelope on stdout
  (``--json``: ``hash``, ``topic``, ``expiry``, ``ttl``, ``sent``,
  ``nonce``, ``data`` and ``raw``, hex or integers), a summary on stderr.
- ``post``: seals an envelope (payload encrypted with the password's key
  when one is given) to the PoW the mailserver asks for and sends it;
  prints the envelope hash.

A refused request, an unreachable mailserver, a refused handshake or a
connection lost midway prints one line on stderr and exits 1; bad input
exits 2. "rate limit exceeded" is waited out through
:mod:`~wakustore.clients.backoff`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import TYPE_CHECKING

from wakustore.usage import UsageError, parse_hex

# Default request window: the last day (status-go's limit on the range of
# its oldest request form, mailserver.go maxQueryRange).
DEFAULT_WINDOW_S = 24 * 3600

EXIT_REFUSED = 1


# node.mailserver.DEFAULT_PASSWORD, clients.mailserver.POST_TTL_S and
# the request layouts as literals: building the parser loads no devp2p code (a test keeps them equal).
DEFAULT_PASSWORD = "status-offline-inbox"
POST_TTL_S = 120
DEFAULT_TIMEOUT_S = 20.0  # clients.mailserver's
# protocols.mailserver's LAYOUT_STATUS_GO, LAYOUT_SPEC, LAYOUT_DIRECT.
LAYOUTS = ("status-go", "spec", "direct")

if TYPE_CHECKING:
    from wakustore.clients.mailserver import RequestAnswer
    from wakustore.protocols import mailserver as wms


def register(commands: argparse._SubParsersAction) -> None:
    mailserver = commands.add_parser("mailserver", help="legacy Waku v1 mailserver client (devp2p RLPx)")
    verbs = mailserver.add_subparsers(dest="verb", required=True, parser_class=commands._parser_class)

    request = verbs.add_parser("request", help="request archived envelopes")
    _connection_arguments(request)
    request.add_argument(
        "--password", default=DEFAULT_PASSWORD, help=f"the mailserver's request password (default {DEFAULT_PASSWORD!r})"
    )
    request.add_argument("--topic", action="append", dest="topics", default=[], help="4-byte topic, hex; repeatable")
    request.add_argument("--bloom", help="64-byte bloom filter, hex (default: all topics; --topic wins)")
    request.add_argument("--from", dest="lower", type=_uint32, help="Unix s, inclusive (default: a day ago)")
    request.add_argument(
        "--to", dest="upper", type=_uint32, default=0, help="Unix s, inclusive (default 0: the mailserver's now + 60 s)"
    )
    request.add_argument("--limit", type=_uint32, default=0, help="envelopes per request (0: the maximum, 1000)")
    request.add_argument("--cursor", help="continue after this cursor (hex, from a previous answer)")
    request.add_argument("--all", action="store_true", help="follow cursors to the end")
    request.add_argument(
        "--layout",
        choices=LAYOUTS,
        default=LAYOUTS[0],
        help="request payload layout (default status-go)",
    )
    request.add_argument("--no-sign", action="store_true", help="do not sign the request envelope")
    request.add_argument("--json", action="store_true", help="one JSON object per envelope")
    request.set_defaults(handler=run_request)

    post = verbs.add_parser("post", help="send one envelope to be archived")
    _connection_arguments(post)
    post.add_argument("--topic", required=True, help="4-byte topic, hex")
    post.add_argument("--payload", required=True, help="hex")
    post.add_argument("--password", help="encrypt the payload with this password's key (default: send it as it is)")
    post.add_argument("--ttl", type=_uint32, default=POST_TTL_S, help=f"seconds (default {POST_TTL_S})")
    post.set_defaults(handler=run_post)


def _connection_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--enode", required=True, help="enode://<node id>@host:port")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds per answer")


def _uint32(text: str) -> int:
    from wakustore.protocols.waku_v1 import MAX_UINT32

    try:
        value = int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if not 0 <= value <= MAX_UINT32:
        raise argparse.ArgumentTypeError(f"must be in [0, {MAX_UINT32}]: {text}")
    return value


def _topic(text: str) -> bytes:
    from wakustore.protocols.waku_v1 import TOPIC_SIZE

    topic = parse_hex(text, "--topic")
    if len(topic) != TOPIC_SIZE:
        raise UsageError(f"--topic: must be {TOPIC_SIZE} bytes, got {len(topic)}")
    return topic


def run_request(args: argparse.Namespace) -> int:
    import trio

    from wakustore.protocols import mailserver as wms
    from wakustore.protocols.waku_v1 import BLOOM_SIZE, bloom_for_topics, full_bloom

    topics = [_topic(t) for t in args.topics]
    bloom = full_bloom()
    if args.bloom:
        bloom = parse_hex(args.bloom, "--bloom")
        if len(bloom) != BLOOM_SIZE:
            raise UsageError(f"--bloom: must be {BLOOM_SIZE} bytes, got {len(bloom)}")
    elif topics:
        bloom = bloom_for_topics(topics)
    cursor = parse_hex(args.cursor, "--cursor") if args.cursor else b""
    if cursor and len(cursor) != wms.CURSOR_SIZE:
        raise UsageError(f"--cursor: must be {wms.CURSOR_SIZE} bytes, got {len(cursor)}")
    lower = args.lower if args.lower is not None else max(0, int(time.time()) - DEFAULT_WINDOW_S)
    if args.upper and lower > args.upper:
        raise UsageError("--from is after --to")
    request = wms.MessagesRequest(
        lower=lower,
        upper=args.upper,
        bloom=bloom,
        topics=topics,
        limit=args.limit,
        cursor=cursor,
        layout=args.layout,
    )
    return trio.run(_request_main, args, request)


async def _request_main(args: argparse.Namespace, request: wms.MessagesRequest) -> int:
    from wakustore.clients.backoff import Backoff
    from wakustore.clients.mailserver import (
        RATE_LIMIT_BACKOFF,
        RATE_LIMIT_ERROR,
        MailserverClient,
        MailserverError,
    )
    from wakustore.protocols.waku_v1 import key_from_password

    key = key_from_password(args.password)
    sign = not args.no_sign
    answers: list[RequestAnswer] = []
    backoff = Backoff(RATE_LIMIT_BACKOFF)
    try:
        async with MailserverClient.connect(args.enode, timeout_s=args.timeout) as client:
            if args.all:
                async for answer in client.pages(request, key, sign=sign, backoff=backoff):
                    answers.append(answer)
                    _print_envelopes(answer, args.json)
            else:
                answers.append(
                    await backoff.call(
                        lambda: client.request(request, key, sign=sign),
                        lambda a: a.complete.error == RATE_LIMIT_ERROR,
                    )
                )
                _print_envelopes(answers[-1], args.json)
    except MailserverError as exc:
        print(f"wakustore: error: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    last = answers[-1].complete
    if last.error is not None:
        waited = (
            f" (still after backing off up to {RATE_LIMIT_BACKOFF.max_wait_s:g} s)"
            if last.error == RATE_LIMIT_ERROR
            else ""
        )
        print(f"wakustore: error: the mailserver refused the request: {last.error}{waited}", file=sys.stderr)
        return EXIT_REFUSED
    total = sum(len(a.envelopes) for a in answers)
    cursor = last.cursor.hex() if last.cursor else "none"
    print(f"mailserver: {total} envelopes in {len(answers)} requests; next cursor {cursor}", file=sys.stderr)
    return 0


def _print_envelopes(answer: RequestAnswer, as_json: bool) -> None:
    for raw in answer.envelopes:
        line = envelope_to_json(raw)
        if as_json:
            print(json.dumps(line))
        else:
            print(f"{line['hash']} topic={line['topic']} sent={line['sent']} ttl={line['ttl']} bytes={len(raw)}")
    sys.stdout.flush()


def run_post(args: argparse.Namespace) -> int:
    import trio

    from wakustore.protocols.waku_v1 import key_from_password

    topic = _topic(args.topic)
    payload = parse_hex(args.payload, "--payload")
    if args.ttl == 0:
        raise UsageError("--ttl: must be positive")
    key = key_from_password(args.password) if args.password is not None else None
    return trio.run(_post_main, args, topic, payload, key)


async def _post_main(args: argparse.Namespace, topic: bytes, payload: bytes, key: bytes | None) -> int:
    from wakustore.clients.mailserver import MailserverClient, MailserverError, seal_envelope
    from wakustore.protocols.errors import WakuV1Error
    from wakustore.protocols.waku_v1 import envelope_hash

    try:
        async with MailserverClient.connect(args.enode, timeout_s=args.timeout) as client:
            try:
                envelope = seal_envelope(payload, topic, symmetric_key=key, ttl=args.ttl, pow_target=client.pow_target)
            except WakuV1Error as exc:
                raise UsageError(f"cannot seal the envelope: {exc}") from None
            raw = envelope.encode()
            await client.post([raw])
    except MailserverError as exc:
        print(f"wakustore: error: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    print(envelope_hash(raw).hex())
    return 0


def envelope_to_json(raw: bytes) -> dict:
    """The JSON line ``request --json`` prints for one raw envelope."""
    from wakustore.protocols.waku_v1 import Envelope, envelope_hash

    envelope = Envelope.decode(raw)
    return {
        "hash": envelope_hash(raw).hex(),
        "topic": envelope.topic.hex(),
        "expiry": envelope.expiry,
        "ttl": envelope.ttl,
        "sent": envelope.timestamp,
        "nonce": envelope.nonce,
        "data": envelope.data.hex(),
        "raw": raw.hex(),
    }
