"""A Waku v1 mailserver client over devp2p RLPx (``wakustore mailserver
request|post`` run it: :mod:`wakustore.cli.mailserver`).

:class:`MailserverClient` dials an ``enode://`` URL with a fresh node key,
exchanges Hellos and waku/1 status (announcing a light node with an empty
bloom, so a relaying mailserver pushes it nothing) and then:

- :meth:`~MailserverClient.request` sends a P2P Request (0x7e) envelope
  encrypted with the key of a password, in status-go's payload layout
  unless told otherwise, signed by the client key as status-go's client
  does, and collects the P2P Message (0x7f) bundles up to the P2P Request
  Complete (0x7d); :meth:`~MailserverClient.pages` follows cursors to the
  end, waiting out "rate limit exceeded" through
  :mod:`~wakustore.clients.backoff`, as the Store and lightpush clients do.
- :meth:`~MailserverClient.post` sends sealed envelopes in a Messages (1)
  packet, then waits for a Ping round trip so that the mailserver has
  handled them.

An unreachable mailserver, a refused handshake or a connection lost midway
is a :class:`MailserverError` (one line); a malformed enode URL a UsageError.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import coincurve
import trio

from wakustore.clients.backoff import Backoff, BackoffPolicy
from wakustore.clients.failures import describe_failure
from wakustore.protocols import ecies
from wakustore.protocols import mailserver as wms
from wakustore.protocols.errors import RLPxError, WakuV1Error
from wakustore.protocols.waku_v1 import (
    BLOOM_SIZE,
    DEFAULT_MAX_MESSAGE_SIZE,
    TOPIC_SIZE,
    Envelope,
    decode_envelope_list,
    encode_envelope_list,
    encode_status,
    encrypt_symmetric,
    envelope_hash,
    seal,
)
from wakustore.transport.devp2p import SessionClosed, open_session
from wakustore.usage import UsageError

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
                    stream,
                    key,
                    remote_public_key=public_key,
                    local_status=encode_status(0.0, bytes(BLOOM_SIZE), light_node=True),
                    max_message_size=max_message_size,
                    timeout_s=timeout_s,
                    read_timeout_s=timeout_s,
                )
            except (SessionClosed, RLPxError, trio.TooSlowError, trio.BrokenResourceError, OSError) as exc:
                reason = describe_failure(exc)
                if isinstance(exc, (ConnectionResetError, trio.BrokenResourceError)):
                    # A close with our auth message unread reaches us as a
                    # reset rather than an end of stream: the same refusal.
                    reason = "connection closed during the handshake (reset by the peer)"
                if "closed during the handshake" in reason:
                    # A node that cannot decrypt our auth message (sealed to
                    # the enode's key) just closes: say what that usually means.
                    reason += " (is the enode's node id this node's key? is it a Waku v1 node?)"
                raise MailserverError(f"handshake with {host}:{port} failed: {reason}") from None
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
        self,
        request: wms.MessagesRequest,
        symmetric_key: bytes,
        *,
        layout: str | None = None,
        sign: bool = True,
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
                wms.encode_request_payload(request, layout),
                symmetric_key,
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
        self,
        request: wms.MessagesRequest,
        symmetric_key: bytes,
        *,
        layout: str | None = None,
        sign: bool = True,
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
                functools.partial(self.request, request, symmetric_key, layout=layout, sign=sign),
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
    payload: bytes,
    topic: bytes,
    *,
    symmetric_key: bytes | None = None,
    ttl: int = POST_TTL_S,
    pow_target: float = 0.0,
    now_s: int | None = None,
) -> Envelope:
    """An envelope sent now carrying ``payload`` (encrypted with
    ``symmetric_key`` when given, else as it is), sealed to ``pow_target``."""
    now_s = int(time.time()) if now_s is None else now_s
    data = encrypt_symmetric(payload, symmetric_key) if symmetric_key is not None else bytes(payload)
    envelope = Envelope(expiry=now_s + ttl, ttl=ttl, topic=topic, data=data)
    return seal(envelope, pow_target, SEAL_MAX_ITERATIONS)


def parse_enode(url: str) -> tuple[bytes, str, int]:
    """(64-byte public key, host, TCP port) of an enode URL; ValueError otherwise.

    A ``?discport=`` query is ignored.
    """
    if not url.startswith("enode://") or "@" not in url:
        raise ValueError(f"not an enode URL: {url!r}")
    node_id, _, address = url[len("enode://") :].partition("@")
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
