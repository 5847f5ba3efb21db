"""``wakustore mailserver request|post``: a Waku v1 mailserver client over devp2p RLPx.

:class:`MailserverClient` dials an ``enode://`` URL with a fresh node key,
exchanges Hellos and waku/1 status (announcing a light node with an empty
bloom, so a relaying mailserver pushes it nothing) and then:

- ``request``: sends P2P Request (0x7e) envelopes encrypted with the key of
  a password, in status-go's payload layout unless told otherwise, signed
  by the client key as status-go's client does, and collects the P2P
  Message (0x7f) bundles up to the P2P Request Complete (0x7d); with
  ``--all`` it follows cursors to the end. One line per envelope on stdout
  (``--json``: ``hash``, ``topic``, ``expiry``, ``ttl``, ``sent``,
  ``nonce``, ``data`` and ``raw``, hex or integers), a summary on stderr.
- ``post``: seals an envelope (payload encrypted with the password's key
  when one is given) to the PoW the mailserver asks for and sends it in a
  Messages (1) packet, then waits for a Ping round trip so that the
  mailserver has handled it; prints the envelope hash.

A refused request, an unreachable mailserver, a refused handshake or a
connection lost midway prints one line on stderr and exits 1; bad input
exits 2. "rate limit exceeded" is waited out through
:mod:`~wakustore.node.backoff`, as the Store and lightpush clients do.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import coincurve
import trio

from wakustore.node.backoff import Backoff, BackoffPolicy
from wakustore.node.cli import UsageError, parse_hex
from wakustore.node.failures import describe_failure
from wakustore.node.mailserver import DEFAULT_PASSWORD, SessionClosed, encode_status, open_session
from wakustore.protocols import ecies
from wakustore.protocols import mailserver as wms
from wakustore.protocols.errors import RLPxError, WakuV1Error
from wakustore.protocols.waku_v1 import (
    BLOOM_SIZE, DEFAULT_MAX_MESSAGE_SIZE, MAX_UINT32, TOPIC_SIZE, Envelope, bloom_for_topics,
    decode_envelope_list, encode_envelope_list, encrypt_symmetric, envelope_hash, full_bloom,
    key_from_password, seal,
)

# Dialing and both handshakes take milliseconds on loopback; a 1000-envelope
# page through Spark well under a second. 20 s covers a slow peer.
DEFAULT_TIMEOUT_S = 20.0
# status-go waku/common/const.go DefaultTTL: what message.Wrap gives a
# request envelope (seconds).
REQUEST_TTL_S = 50
# status-go params/defaults.go WakuTTL: the TTL of messages a node sends.
POST_TTL_S = 120
# status-go waku/v1/status_options.go defaultMinPoW: the requirement of a
# peer whose status does not state one.
UNSTATED_POW = 0.001
# Nonces tried when sealing; 2^24 reaches 24 leading zero bits on average.
SEAL_MAX_ITERATIONS = 2**24
# "rate limit exceeded" is retried after 1 s, doubling up to 30 s, 6 times
# (61 s of pauses). status-go's limiter (mailserver/limiter.go) allows one
# request per peer per MailServerRateLimit seconds, a setting with no
# default value to take the period from.
RATE_LIMIT_BACKOFF = BackoffPolicy(first_s=1.0, max_s=30.0, max_retries=6, max_wait_s=61.0)
RATE_LIMIT_ERROR = "rate limit exceeded"
# Default request window: the last day (status-go's limit on the range of
# its oldest request form, mailserver.go maxQueryRange).
DEFAULT_WINDOW_S = 24 * 3600

EXIT_REFUSED = 1


class MailserverError(Exception):
    """The mailserver could not be reached or answered something unusable."""


@dataclass(frozen=True)
class RequestAnswer:
    """What a mailserver sent for one request: the raw envelopes of its
    0x7f packets in order, how many packets, and its Request Complete."""

    request_id: bytes
    envelopes: list[bytes]
    packets: int
    complete: wms.RequestComplete


class MailserverClient:
    """Requests and posts to one mailserver over one RLPx connection; see :meth:`connect`."""

    def __init__(self, session, private_key: bytes, timeout_s: float, max_message_size: int):
        self.session = session
        self.private_key = private_key
        self.timeout_s = timeout_s
        self.max_message_size = max_message_size

    @classmethod
    @asynccontextmanager
    async def connect(
        cls,
        enode: str,
        *,
        private_key: bytes | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
    ):
        """Dial ``enode`` (UsageError when malformed); MailserverError when
        the TCP connection or a handshake fails within ``timeout_s`` seconds."""
        try:
            public_key, host, port = parse_enode(enode)
        except ValueError as exc:
            raise UsageError(f"--enode: {exc}") from None
        key = private_key or coincurve.PrivateKey().secret
        try:
            with trio.fail_after(timeout_s):
                stream = await trio.open_tcp_stream(host, port)
        except (OSError, trio.TooSlowError) as exc:
            raise MailserverError(f"cannot connect to {host}:{port}: {describe_failure(exc)}") from None
        async with stream:
            try:
                session = await open_session(
                    stream, key, remote_public_key=public_key,
                    local_status=encode_status(0.0, bytes(BLOOM_SIZE), light_node=True),
                    max_message_size=max_message_size, timeout_s=timeout_s, read_timeout_s=timeout_s,
                )
            except (SessionClosed, RLPxError, trio.TooSlowError, trio.BrokenResourceError, OSError) as exc:
                raise MailserverError(f"handshake with {host}:{port} failed: {describe_failure(exc)}") from None
            try:
                yield cls(session, key, timeout_s, max_message_size)
            finally:
                with trio.CancelScope(shield=True):
                    await session.disconnect()

    @property
    def pow_target(self) -> float:
        """The PoW the mailserver's status asks of envelopes."""
        stated = self.session.remote_status.pow_requirement
        return UNSTATED_POW if stated is None else stated

    async def request(
        self, request: wms.MessagesRequest, symmetric_key: bytes, *, layout: str | None = None, sign: bool = True,
    ) -> RequestAnswer:
        """One request, answered. ``layout``: "status-go", "spec" or "direct"
        (no envelope, no encryption); default the request's own. A refusal
        comes back as ``answer.complete.error``."""
        layout = layout or request.layout
        if layout == wms.LAYOUT_DIRECT:
            request_id = request.request_id or os.urandom(wms.HASH_SIZE)
            payload = wms.encode_direct_request(dataclasses.replace(request, request_id=request_id))
        else:
            data = encrypt_symmetric(
                wms.encode_request_payload(request, layout), symmetric_key,
                signing_key=self.private_key if sign else None,
            )
            now = int(time.time())
            envelope = Envelope(expiry=now + REQUEST_TTL_S, ttl=REQUEST_TTL_S, topic=bytes(TOPIC_SIZE), data=data)
            try:
                payload = seal(envelope, self.pow_target, SEAL_MAX_ITERATIONS).encode()
            except WakuV1Error as exc:  # the PoW the mailserver asks is out of reach
                raise MailserverError(f"cannot seal the request: {exc}") from None
            request_id = envelope_hash(payload)
        return await self._guarded(self._exchange(request_id, payload))

    async def pages(
        self, request: wms.MessagesRequest, symmetric_key: bytes, *, layout: str | None = None, sign: bool = True,
        backoff: Backoff | None = None,
    ) -> AsyncIterator[RequestAnswer]:
        """Answers following the Request Complete cursor until there is none.

        Stops after a refusal (yielded); "rate limit exceeded" is waited out
        through ``backoff`` first (default: the :data:`RATE_LIMIT_BACKOFF`
        policy). Raises MailserverError on a repeated cursor.
        """
        backoff = backoff or Backoff(RATE_LIMIT_BACKOFF)
        seen: set[bytes] = set()
        while True:
            answer = await backoff.call(
                lambda request=request: self.request(request, symmetric_key, layout=layout, sign=sign),
                lambda a: a.complete.error == RATE_LIMIT_ERROR,
            )
            yield answer
            cursor = answer.complete.cursor
            if answer.complete.error is not None or not cursor:
                return
            if cursor in seen:
                raise MailserverError(f"the mailserver repeated cursor {cursor.hex()}")
            seen.add(cursor)
            request = dataclasses.replace(request, cursor=cursor)

    async def post(self, raw_envelopes: list[bytes]) -> None:
        """Send envelopes in one Messages packet and wait until the mailserver handled it."""
        payload = encode_envelope_list(raw_envelopes)
        await self._guarded(self._post(payload))

    async def _post(self, payload: bytes) -> None:
        await self.session.send(wms.MESSAGES, payload)
        with trio.fail_after(self.timeout_s):
            await self.session.round_trip()

    async def _exchange(self, request_id: bytes, payload: bytes) -> RequestAnswer:
        await self.session.send(wms.P2P_REQUEST, payload)
        envelopes: list[bytes] = []
        packets = 0
        with trio.fail_after(self.timeout_s):
            while True:
                code, body = await self.session.receive()
                if code == wms.P2P_MESSAGE:
                    try:
                        decoded = decode_envelope_list(body, max_size=self.max_message_size)
                    except WakuV1Error as exc:
                        raise MailserverError(f"malformed P2P Message: {exc}") from None
                    envelopes.extend(raw for _, raw in decoded)
                    packets += 1
                elif code == wms.P2P_REQUEST_COMPLETE:
                    try:
                        complete = wms.decode_request_complete(body)
                    except WakuV1Error as exc:
                        raise MailserverError(f"malformed Request Complete: {exc}") from None
                    if complete.request_id == request_id:
                        return RequestAnswer(request_id, envelopes, packets, complete)
                    envelopes, packets = [], 0  # the end of an older request's answer
                # Messages (1) from a relaying mailserver are not ours to keep.

    async def _guarded(self, work):
        try:
            return await work
        except trio.TooSlowError:
            raise MailserverError(f"no answer within {self.timeout_s:g} s") from None
        except (SessionClosed, RLPxError, trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            raise MailserverError(f"connection lost: {describe_failure(exc)}") from None


def seal_envelope(
    payload: bytes, topic: bytes, *, symmetric_key: bytes | None = None, ttl: int = POST_TTL_S,
    pow_target: float = 0.0, now_s: int | None = None,
) -> Envelope:
    """An envelope sent now carrying ``payload`` (encrypted with
    ``symmetric_key`` when given, else as it is), sealed to ``pow_target``."""
    now_s = int(time.time()) if now_s is None else now_s
    data = encrypt_symmetric(payload, symmetric_key) if symmetric_key is not None else bytes(payload)
    envelope = Envelope(expiry=now_s + ttl, ttl=ttl, topic=topic, data=data)
    return seal(envelope, pow_target, SEAL_MAX_ITERATIONS)


def envelope_to_json(raw: bytes) -> dict:
    """The JSON line ``request --json`` prints for one raw envelope."""
    envelope = Envelope.decode(raw)
    return {
        "hash": envelope_hash(raw).hex(), "topic": envelope.topic.hex(),
        "expiry": envelope.expiry, "ttl": envelope.ttl, "sent": envelope.timestamp,
        "nonce": envelope.nonce, "data": envelope.data.hex(), "raw": raw.hex(),
    }


def parse_enode(url: str) -> tuple[bytes, str, int]:
    """(64-byte public key, host, TCP port) of an enode URL; ValueError otherwise.

    A ``?discport=`` query is ignored.
    """
    if not url.startswith("enode://") or "@" not in url:
        raise ValueError(f"not an enode URL: {url!r}")
    node_id, _, address = url[len("enode://"):].partition("@")
    address = address.split("?", 1)[0].rstrip("/")
    try:
        public_key = bytes.fromhex(node_id)
    except ValueError:
        raise ValueError(f"enode node id is not hex: {node_id!r}") from None
    if len(public_key) != ecies.PUBLIC_KEY_SIZE:
        raise ValueError(f"enode node id must be {ecies.PUBLIC_KEY_SIZE} bytes, got {len(public_key)}")
    ecies.parse_public_key(public_key)
    host, sep, port_text = address.rpartition(":")
    if not sep or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"enode address needs host:port, got {address!r}")
    return public_key, host.strip("[]"), int(port_text)


# --- command line ---------------------------------------------------------------

def register(commands: argparse._SubParsersAction) -> None:
    mailserver = commands.add_parser("mailserver", help="legacy Waku v1 mailserver client (devp2p RLPx)")
    verbs = mailserver.add_subparsers(dest="verb", required=True, parser_class=commands._parser_class)

    request = verbs.add_parser("request", help="request archived envelopes")
    _connection_arguments(request)
    request.add_argument("--password", default=DEFAULT_PASSWORD,
                         help=f"the mailserver's request password (default {DEFAULT_PASSWORD!r})")
    request.add_argument("--topic", action="append", dest="topics", default=[], help="4-byte topic, hex; repeatable")
    request.add_argument("--bloom", help="64-byte bloom filter, hex (default: all topics; --topic wins)")
    request.add_argument("--from", dest="lower", type=_uint32, help="Unix s, inclusive (default: a day ago)")
    request.add_argument("--to", dest="upper", type=_uint32, default=0,
                         help="Unix s, inclusive (default 0: the mailserver's now + 60 s)")
    request.add_argument("--limit", type=_uint32, default=0, help="envelopes per request (0: the maximum, 1000)")
    request.add_argument("--cursor", help="continue after this cursor (hex, from a previous answer)")
    request.add_argument("--all", action="store_true", help="follow cursors to the end")
    request.add_argument("--layout", choices=(wms.LAYOUT_STATUS_GO, wms.LAYOUT_SPEC, wms.LAYOUT_DIRECT),
                         default=wms.LAYOUT_STATUS_GO, help="request payload layout (default status-go)")
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
    try:
        value = int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if not 0 <= value <= MAX_UINT32:
        raise argparse.ArgumentTypeError(f"must be in [0, {MAX_UINT32}]: {text}")
    return value


def _topic(text: str) -> bytes:
    topic = parse_hex(text, "--topic")
    if len(topic) != TOPIC_SIZE:
        raise UsageError(f"--topic: must be {TOPIC_SIZE} bytes, got {len(topic)}")
    return topic


def run_request(args: argparse.Namespace) -> int:
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
        lower=lower, upper=args.upper, bloom=bloom, topics=topics, limit=args.limit, cursor=cursor,
        layout=args.layout,
    )
    return trio.run(_request_main, args, request)


async def _request_main(args: argparse.Namespace, request: wms.MessagesRequest) -> int:
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
                answers.append(await backoff.call(
                    lambda: client.request(request, key, sign=sign),
                    lambda a: a.complete.error == RATE_LIMIT_ERROR,
                ))
                _print_envelopes(answers[-1], args.json)
    except MailserverError as exc:
        print(f"wakustore: error: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    last = answers[-1].complete
    if last.error is not None:
        waited = (f" (still after backing off up to {RATE_LIMIT_BACKOFF.max_wait_s:g} s)"
                  if last.error == RATE_LIMIT_ERROR else "")
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
    topic = _topic(args.topic)
    payload = parse_hex(args.payload, "--payload")
    if args.ttl == 0:
        raise UsageError("--ttl: must be positive")
    key = key_from_password(args.password) if args.password is not None else None
    return trio.run(_post_main, args, topic, payload, key)


async def _post_main(args: argparse.Namespace, topic: bytes, payload: bytes, key: bytes | None) -> int:
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
