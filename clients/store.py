"""A Store v3/v2, lightpush and metadata client (``wakustore query`` and
``wakustore push`` run it: :mod:`wakustore.cli.query`).

:class:`StoreClient` runs its own short-lived libp2p host (a fresh key each
time), dials one node and speaks the request/response protocols: one
stream per request, the multistream-select header, protocol id and
request frame written at once and the write side closed (one write),
the node's multistream-select answer checked and the response frame
read, the stream closed.

:meth:`StoreClient.pages` waits out the node's rate limit (429) through
:mod:`~wakustore.clients.backoff`. A failure to reach or use the node is a
:class:`ClientError` (one line); a malformed peer address a UsageError.
The client's libp2p host runs its connection in a nursery, so a failure
arrives wrapped in exception groups; :meth:`StoreClient.connect` takes the
meaningful exception out of them. An exception of a kind no failure mode
raises still propagates with its traceback.

py-libp2p is imported when a client connects, not when this module is
imported: every ``wakustore`` command builds the whole parser. Each
protocol's codec is imported by the method that speaks it: ``push`` loads
no Store codec, ``query`` no lightpush.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import trio

from wakustore.clients.backoff import Backoff, BackoffPolicy
from wakustore.clients.failures import describe_failure, leaves
from wakustore.protocols.errors import FramingError, ProtocolError
from wakustore.protocols.framing import (
    LIGHTPUSH_MAX_RESPONSE_SIZE,
    METADATA_MAX_SIZE,
    STORE_MAX_RESPONSE_SIZE,
    encode_frame,
)
from wakustore.protocols.message import WakuMessage
from wakustore.protocols.store_query import HistoryQuery, StatusCode
from wakustore.usage import UsageError

if TYPE_CHECKING:
    from wakustore.protocols import lightpush, metadata, store_v2, store_v3

# Dialing, the Noise handshake and identify take ~0.1 s on loopback; 20 s
# covers a slow peer across the world.
DEFAULT_TIMEOUT_S = 20.0

# A 429 is retried after a pause doubling from about one token's refill
# time up to the limit's period (a token bucket is full again one period
# after it emptied), for at most a minute of pauses in a row. The periods are
# the defaults of nwaku and wakustore (node/rate_limits.py
# DEFAULT_STORE_RATE 60/2s, DEFAULT_LIGHTPUSH_RATE 5/1s); a node limiting
# over a longer period is still retried every few seconds within the minute.
STORE_BACKOFF = BackoffPolicy(first_s=0.05, max_s=5.0, max_retries=60, max_wait_s=60.0, period_s=2.0)
LIGHTPUSH_BACKOFF = BackoffPolicy(first_s=0.2, max_s=5.0, max_retries=60, max_wait_s=60.0, period_s=1.0)


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
        from libp2p.network.config import ConnectionConfig

        from wakustore.transport.host import new_host, stop_auto_dialing
        from wakustore.transport.peers import PeerAddressError, connect

        info = parse_peer(peer)
        # At most one connection to the node: py-libp2p's dial waits out its
        # 250 ms happy-eyeballs head start after the last address's dial too,
        # unless the connections reach this cap; at one, the first connection
        # ends the dial at once (a loopback dial takes ~10 ms, not 250).
        host = new_host(websocket=True, connection_config=ConnectionConfig(max_connections_per_peer=1))
        try:
            async with host.run(listen_addrs=[]):
                await stop_auto_dialing(host)
                try:
                    with trio.fail_after(timeout_s):
                        await connect(host, info)
                except trio.TooSlowError:
                    raise ClientError(f"no connection to {peer} within {timeout_s:g} s") from None
                except PeerAddressError as exc:  # a name that does not resolve
                    raise ClientError(f"cannot connect to {peer}: {exc}") from None
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
        from wakustore.transport.libp2p import corked
        from wakustore.transport.multistream import NegotiationError, read_selected, select_message

        try:
            with trio.fail_after(self.timeout_s):
                network = self.host.get_network()
                connections = network.get_connections(self.peer_id)
                # The stream's SYN, the request and the FIN leave in one write.
                async with corked(connections[0] if connections else None):
                    stream = await network.new_stream(self.peer_id)
                    try:
                        # multistream-select's header and the protocol id go
                        # out with the request (js-waku and go-libp2p select
                        # lazily the same way): no round trip before the
                        # request; the node's echo is checked when reading.
                        await stream.write(select_message(protocol) + data)
                        await stream.close_write()
                    except BaseException:
                        await stream.close()
                        raise
                try:
                    return await read_selected(stream, protocol, max_response)
                finally:
                    await stream.close()
        except NegotiationError as exc:
            raise ClientError(f"{protocol}: {exc}") from None
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
        from wakustore.protocols import store_v3

        raw = await self.request(
            store_v3.PROTOCOL_ID,
            store_v3.encode_request(request_id or _request_id(), query),
            STORE_MAX_RESPONSE_SIZE,
        )
        return store_v3.decode_response(raw)

    async def query_patiently(self, query: HistoryQuery, backoff: Backoff) -> store_v3.StoreResponse:
        """One Store v3 page, sent again while the node answers 429."""
        return await backoff.call(lambda: self.query(query), lambda r: r.status_code == StatusCode.TOO_MANY_REQUESTS)

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
        from wakustore.protocols import store_v2

        raw = await self.request(
            store_v2.PROTOCOL_ID, store_v2.encode_request(_request_id(), **request), STORE_MAX_RESPONSE_SIZE
        )
        return store_v2.decode_response(raw)

    async def push(self, pubsub_topic: str | None, message: WakuMessage) -> lightpush.PushResponseV3:
        """Lightpush v3; raises LightpushError (500) for an unusable response."""
        from wakustore.protocols import lightpush

        raw = await self.request(
            lightpush.PROTOCOL_ID_V3,
            lightpush.encode_request_v3(_request_id(), pubsub_topic, message),
            LIGHTPUSH_MAX_RESPONSE_SIZE,
        )
        return lightpush.decode_response_v3(raw)

    async def push_legacy(self, pubsub_topic: str, message: WakuMessage) -> lightpush.PushResponseV2:
        """Lightpush v2beta1."""
        from wakustore.protocols import lightpush

        raw = await self.request(
            lightpush.PROTOCOL_ID_V2,
            lightpush.encode_request_v2(_request_id(), pubsub_topic, message),
            LIGHTPUSH_MAX_RESPONSE_SIZE,
        )
        return lightpush.decode_response_v2(raw)

    async def metadata(self, ours: metadata.Metadata) -> metadata.Metadata:
        from wakustore.protocols import metadata

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
    from wakustore.transport.peers import PeerAddressError
    from wakustore.transport.peers import parse_peer as parse

    try:
        return parse(peer)
    except PeerAddressError as exc:
        raise UsageError(f"--peer: {exc}") from None


def _request_id() -> str:
    return str(uuid.uuid4())


def quiet_libp2p() -> None:
    """Keep stderr to the command's own lines. libp2p logs every failed dial
    attempt as an error; its logger has no handler unless LIBP2P_DEBUG is
    set, so Python's last-resort handler would print them."""
    import libp2p  # noqa: F401  (importing it configures its logger)

    if not os.environ.get("LIBP2P_DEBUG"):
        logging.getLogger("libp2p").addHandler(logging.NullHandler())
