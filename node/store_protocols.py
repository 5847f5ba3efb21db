"""Stream handlers: Store v3, legacy Store v2, lightpush v2beta1 and v3, metadata.

Each protocol is one request and one response per stream, both
length-prefixed (:mod:`wakustore.protocols.framing`). A handler reads one
frame (bounded by the protocol's framing limit), answers it through the
sans-IO codecs and closes the stream; the peer reads the answer until end
of stream (js-waku does). Nothing a peer sends can make a handler raise
into py-libp2p: every failure is answered with the protocol's status or
ends in a reset.

Reading a request has two deadlines. The wait for its first byte lasts
:data:`IDLE_STREAM_TIMEOUT_S` (5 minutes, as nim-libp2p keeps an idle
stream): js-waku opens a stream per protocol when it connects and sends
its first request on it whenever the application asks, maybe minutes
later. Once the first byte is in, the rest of the frame must follow
within :data:`READ_TIMEOUT_S`, so a peer stalling inside a frame holds
the handler briefly. Either deadline ends in a reset, never a close: a
half-closed stream still looks writable to js-waku, which would send its
request into it and wait for an answer that never comes, while a reset
stream is dropped and a fresh one opened.

What each failure is answered with:

- undecodable or invalid request: Store v3 400, legacy INVALID_CURSOR,
  lightpush v3 400 (request id "N/A" when unreadable), v2beta1
  ``is_success = false``; an unknown cursor: 300 (nwaku's BAD_RESPONSE);
- a frame over the limit: Store 400, lightpush 413;
- over the peer's rate: 429 (legacy TOO_MANY_REQUESTS);
- the store failing under a request: 503 (lightpush v3 SERVICE_NOT_AVAILABLE),
  a page that needs a bad data file (damaged, missing) included, with
  :data:`BAD_FILE_TEXT`;
- a stream that ends before any byte (js-waku opens streams ahead and
  drops them): closed without answer;
- a stream idle past :data:`IDLE_STREAM_TIMEOUT_S`, or stalled inside a
  frame past :data:`READ_TIMEOUT_S`: reset without answer.

Ingest through lightpush: the message must be on one of the configured
shards' pubsub topics (421 otherwise) and pass the checks shared with relay
(:class:`~wakustore.node.ingest.Ingest`: size limit 413, anything else
420, a protected topic's signature included). Ephemeral messages are valid
but never stored; they are still answered with success, as nwaku answers
them. With relay running (:attr:`StoreProtocols.relay`), an accepted
message is also published to relay, as a lightpush service node does, and
a v3 success carries the number of relay peers it went to (0 without
relay; nwaku would answer 505 NO_PEERS_TO_RELAY there, but this node has
stored the message, which is what the client asked a store node for).
js-waku 0.0.36 counts any 200 as success and only logs the count.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple

import trio
from libp2p.io.exceptions import IOException

from wakustore.node.config import NodeConfig
from wakustore.node.disk import DiskFull
from wakustore.node.ingest import DISK_FULL, Ingest, Refused

# RateLimits is still imported from here by its users (running, tests)
from wakustore.node.rate_limits import PeerAndAddressBuckets, RateLimit, RateLimits  # noqa: F401
from wakustore.protocols import lightpush, metadata, store_v2, store_v3
from wakustore.protocols.errors import FrameTooLarge, FramingError, LightpushError, MetadataError, StoreError
from wakustore.protocols.framing import (
    LIGHTPUSH_MAX_REQUEST_SIZE,
    METADATA_MAX_SIZE,
    STORE_MAX_REQUEST_SIZE,
    encode_frame,
)
from wakustore.protocols.lightpush import LightpushStatus, PushRequest
from wakustore.protocols.message import Rejection
from wakustore.protocols.store_query import StatusCode
from wakustore.storage.reader import DataFileUnreadable
from wakustore.transport.libp2p import corked
from wakustore.transport.streams import ReadTimeout, close_stream, peer_of, read_frame, reset_stream

log = logging.getLogger(__name__)

# The 503 of a page that needs a data file the node cannot read (damaged,
# missing): the pages that do not are answered.
BAD_FILE_TEXT = "part of the history this page needs is in a data file the node cannot read"

# How long an inbound stream may wait for the first byte of its request:
# nim-libp2p's idle stream timeout, so nwaku's (libp2p/builders.nim,
# withMplex and withYamux: inTimeout = outTimeout = 5.minutes; mplex's
# DefaultChanTimeout in libp2p/muxers/muxer.nim). js-waku opens its store
# and lightpush streams on connect and writes its first request on them
# whenever the application asks, so a shorter wait breaks that request.
IDLE_STREAM_TIMEOUT_S = 5 * 60.0

# How long the rest of a request may take once its first byte is in.
# js-waku and nwaku write the whole request at once; 10 s covers a request
# of the largest allowed size (1.06 MB) over a slow mobile link and bounds
# a peer that stalls inside a frame.
READ_TIMEOUT_S = 10.0

# How long writing an answer may take before the stream is reset: a full
# page (up to 15.4 MB, framing.STORE_MAX_RESPONSE_SIZE) at ~4 Mbit/s.
WRITE_TIMEOUT_S = 30.0

# Rate buckets are kept for this many peers; the least recently seen one is
# forgotten first (and comes back with a full bucket). About 200 bytes a
# peer; 10,000 is far above the 300 connections py-libp2p accepts at once
# (and nwaku's default --max-connections of 50).
MAX_TRACKED_PEERS = 10_000

# nwaku's answer text for a rate-limited request (waku/common/rate_limit).
TOO_MANY_REQUESTS_TEXT = "Request rejected due to too many requests"

Handler = Callable[[Any], Awaitable[None]]


class PeerBuckets:
    """One token bucket per peer id for one :class:`RateLimit`.

    Not thread-safe: trio handlers call it from one thread. ``clock`` is in
    seconds (monotonic).
    """

    def __init__(
        self, limit: RateLimit, clock: Callable[[], float] = time.monotonic, max_peers: int = MAX_TRACKED_PEERS
    ):
        self.limit = limit
        self._clock = clock
        self._max_peers = max_peers
        self._buckets: collections.OrderedDict[str, tuple[float, float]] = collections.OrderedDict()

    def allow(self, peer: str) -> bool:
        """Take one token from ``peer``'s bucket; False when it is empty."""
        if self.limit.unlimited:
            return True
        now = self._clock()
        capacity = float(self.limit.volume)
        tokens, last = self._buckets.pop(peer, (capacity, now))
        tokens = min(capacity, tokens + (now - last) * capacity / self.limit.period_s)
        allowed = tokens >= 1.0
        if allowed:
            tokens -= 1.0
        self._buckets[peer] = (tokens, now)
        if len(self._buckets) > self._max_peers:
            self._buckets.popitem(last=False)
        return allowed


class StoreProtocols:
    """The node's request/response protocols over one :class:`StoreService`.

    :meth:`handlers` maps protocol ids to stream handlers for
    :func:`wakustore.node.host.running_host`. The ``answer_*`` methods take
    the peer id and one request body and return the response body; they are
    the whole protocol logic and never raise for anything a peer sends.
    """

    def __init__(
        self,
        service: Any,
        config: NodeConfig,
        rate_limits: RateLimits = RateLimits(),
        *,
        clock: Callable[[], float] = time.monotonic,
        idle_timeout_s: float = IDLE_STREAM_TIMEOUT_S,
        read_timeout_s: float = READ_TIMEOUT_S,
        write_timeout_s: float = WRITE_TIMEOUT_S,
    ):
        self.service = service
        self.ingest = Ingest(service, config)
        self.pubsub_topics = self.ingest.pubsub_topics
        self.limits = self.ingest.limits
        # The node's relay (wakustore.node.relay.Relay) once it runs: pushed
        # messages are published to it.
        self.relay = None
        self.metadata = metadata.Metadata(cluster_id=config.cluster_id, shards=tuple(config.shards))
        # Closes every connection to a peer (the host's disconnect, once it
        # runs): a peer whose metadata request names another cluster is
        # answered, then dropped.
        self.disconnect: Callable[[Any], Awaitable[None]] | None = None
        # Per peer id and per IP address: fresh keys are free, addresses are not.
        self.store_buckets = PeerAndAddressBuckets(rate_limits.store, clock)
        self.lightpush_buckets = PeerAndAddressBuckets(rate_limits.lightpush, clock)
        self.idle_timeout_s = idle_timeout_s
        self.read_timeout_s = read_timeout_s
        self.write_timeout_s = write_timeout_s

    def handlers(self) -> dict[str, Handler]:
        """Protocol id -> stream handler. Each handler reads one request
        frame and always writes (an answer, a close or a reset) once it has
        it, so its protocols may be answered with the first write
        (:func:`wakustore.transport.host.answer_with_first_write`)."""
        return {
            store_v3.PROTOCOL_ID: self.handle_store_v3,
            store_v2.PROTOCOL_ID: self.handle_store_v2,
            lightpush.PROTOCOL_ID_V3: self.handle_lightpush_v3,
            lightpush.PROTOCOL_ID_V2: self.handle_lightpush_v2,
            metadata.PROTOCOL_ID: self.handle_metadata,
        }

    # --- stream handlers ----------------------------------------------------

    async def handle_store_v3(self, stream) -> None:
        await self._serve(
            stream, STORE_MAX_REQUEST_SIZE, self._timed("store-v3", self.answer_store_v3), _store_v3_framing_error
        )

    async def handle_store_v2(self, stream) -> None:
        await self._serve(
            stream, STORE_MAX_REQUEST_SIZE, self._timed("store-v2", self.answer_store_v2), _store_v2_framing_error
        )

    def _timed(self, protocol: str, answer: Callable[[str, bytes], Awaitable[StoreReply]]):
        """``answer`` as a handler's answer (the body), counting each query
        with the status its reply was encoded with."""
        metrics = getattr(self.service, "metrics", None)

        async def timed(peer: str, raw: bytes) -> bytes:
            started = time.perf_counter()
            reply = await answer(peer, raw)
            if metrics is not None:
                metrics.query_latency.labels(protocol).observe(time.perf_counter() - started)
                metrics.queries.labels(protocol, str(int(reply.status))).inc()
            return reply.body

        return timed

    async def handle_lightpush_v3(self, stream) -> None:
        await self._serve(stream, LIGHTPUSH_MAX_REQUEST_SIZE, self.answer_lightpush_v3, _lightpush_v3_framing_error)

    async def handle_lightpush_v2(self, stream) -> None:
        await self._serve(stream, LIGHTPUSH_MAX_REQUEST_SIZE, self.answer_lightpush_v2, _lightpush_v2_framing_error)

    async def handle_metadata(self, stream) -> None:
        """Answer; then drop a peer whose request names another cluster
        (nwaku drops it once its own request to the peer says so)."""
        theirs: list[metadata.Metadata] = []

        async def answer(peer: str, raw: bytes) -> bytes | None:
            """Our cluster and shards; an undecodable request gets no answer."""
            try:
                theirs.append(metadata.decode_request(raw))
            except MetadataError as exc:
                log.debug("metadata from %s: %s", peer, exc)
                return None
            return metadata.encode_response(self.metadata)

        await self._serve(stream, METADATA_MAX_SIZE, answer, lambda exc: None)
        if not theirs or theirs[0].cluster_id in (None, self.metadata.cluster_id) or self.disconnect is None:
            return
        log.info(
            "peer %s is on cluster %s, we are on %s: dropped",
            peer_of(stream),
            theirs[0].cluster_id,
            self.metadata.cluster_id,
        )
        try:
            await self.disconnect(stream.muxed_conn.peer_id)
        except Exception as exc:  # a connection already gone
            log.debug("dropping %s: %r", peer_of(stream), exc)

    # --- protocol logic -----------------------------------------------------

    async def answer_store_v3(self, peer: str, raw: bytes) -> StoreReply:
        try:
            request_id, query = store_v3.decode_request(raw)
        except StoreError as exc:
            if not self.store_buckets.allow(peer):
                return _v3_error(_too_many(exc.request_id))
            return _v3_error(exc)
        if not self.store_buckets.allow(peer):
            return _v3_error(_too_many(request_id))
        try:
            page = await self.service.query(query)
        except StoreError as exc:
            exc.request_id = request_id
            return _v3_error(exc)
        except Exception as exc:
            return _v3_error(_unavailable(request_id, exc))
        body = store_v3.encode_response(request_id, page, include_data=query.include_data)
        return StoreReply(body, StatusCode.OK)

    async def answer_store_v2(self, peer: str, raw: bytes) -> StoreReply:
        try:
            request_id, query = store_v2.decode_request(raw)
        except StoreError as exc:
            if not self.store_buckets.allow(peer):
                return _v2_error(_too_many(exc.request_id))
            return _v2_error(exc)
        if not self.store_buckets.allow(peer):
            return _v2_error(_too_many(request_id))
        try:
            page = await self.service.query(query)
        except StoreError as exc:
            exc.request_id = request_id
            return _v2_error(exc)
        except Exception as exc:
            return _v2_error(_unavailable(request_id, exc))
        return StoreReply(store_v2.encode_response(request_id, page, forward=query.forward), StatusCode.OK)

    async def answer_lightpush_v3(self, peer: str, raw: bytes) -> bytes:
        try:
            request = lightpush.decode_request_v3(raw)
        except LightpushError as exc:
            if not self.lightpush_buckets.allow(peer):
                return lightpush.encode_error_v3(_push_too_many(exc.request_id))
            return lightpush.encode_error_v3(exc)
        if not self.lightpush_buckets.allow(peer):
            return lightpush.encode_error_v3(_push_too_many(request.request_id))
        try:
            relayed = await self._ingest(request)
        except LightpushError as exc:
            return lightpush.encode_error_v3(exc)
        return lightpush.encode_response_v3(request.request_id, LightpushStatus.SUCCESS, relay_peer_count=relayed)

    async def answer_lightpush_v2(self, peer: str, raw: bytes) -> bytes:
        try:
            request = lightpush.decode_request_v2(raw)
        except LightpushError as exc:
            if not self.lightpush_buckets.allow(peer):
                return lightpush.encode_error_v2(_push_too_many(exc.request_id))
            return lightpush.encode_error_v2(exc)
        if not self.lightpush_buckets.allow(peer):
            return lightpush.encode_error_v2(_push_too_many(request.request_id))
        try:
            await self._ingest(request)
        except LightpushError as exc:
            return lightpush.encode_error_v2(exc)
        return lightpush.encode_response_v2(request.request_id, True, lightpush.OK_INFO)

    async def _ingest(self, request: PushRequest) -> int:
        """Validate, store and relay one pushed message; return the number of
        relay peers it went to; raise LightpushError to refuse."""
        topic = request.pubsub_topic
        rid = request.request_id
        if topic is None:
            raise LightpushError(
                LightpushStatus.INVALID_MESSAGE,
                "pubsub topic required: this node uses static sharding, not autosharding",
                rid,
            )
        now = time.time_ns()
        store = True
        try:
            self.ingest.check(topic, request.message, request.encoded_size, now)
        except Refused as refusal:
            self.ingest.count("lightpush", refusal)
            if refusal.reason != Rejection.EPHEMERAL.value:
                raise LightpushError(_push_status(refusal), str(refusal), rid) from None
            store = False
        if store:
            try:
                await self.ingest.store([(topic, request.message, now)], source="lightpush")
            except DiskFull as exc:
                self.ingest.count("lightpush", Refused(DISK_FULL, str(exc)))
                raise LightpushError(LightpushStatus.SERVICE_NOT_AVAILABLE, str(exc), rid) from None
            except Exception as exc:
                log.warning("storing a pushed message failed: %s", exc)
                raise LightpushError(LightpushStatus.SERVICE_NOT_AVAILABLE, "the store is unavailable", rid) from None
        if self.relay is None:
            return 0
        try:
            return await self.relay.publish(topic, request.message)
        except Exception as exc:  # the message is stored; relay is best effort
            log.warning("relaying a pushed message failed: %s", exc)
            return 0

    # --- stream plumbing ----------------------------------------------------

    async def _serve(
        self,
        stream,
        max_size: int,
        answer: Callable[[str, bytes], Awaitable[bytes | None]],
        framing_answer: Callable[[FramingError], bytes | None],
    ) -> None:
        """Read one frame, answer it, close; never raise (except cancellation)."""
        peer = peer_of(stream)
        try:
            try:
                raw = await read_frame(
                    stream, max_size, idle_timeout_s=self.idle_timeout_s, frame_timeout_s=self.read_timeout_s
                )
            except ReadTimeout as exc:
                log.debug("stream from %s: %s: resetting", peer, exc)
                await reset_stream(stream)
                return
            except FramingError as exc:
                log.debug("bad frame from %s: %s", peer, exc)
                reply = framing_answer(exc)
            else:
                if raw is None:
                    await close_stream(stream)
                    return
                reply = await answer(peer, raw)
            if reply is None:
                await close_stream(stream)
                return
            # The answer and the FIN closing the stream leave in one write.
            async with corked(stream):
                with trio.fail_after(self.write_timeout_s):
                    await stream.write(encode_frame(reply))
                await close_stream(stream)
        except (IOException, trio.TooSlowError) as exc:
            log.debug("stream from %s failed: %r", peer, exc)
            await reset_stream(stream)
        except Exception:
            log.exception("handler failed on a stream from %s", peer)
            await reset_stream(stream)


class StoreReply(NamedTuple):
    """An encoded Store answer and the status it carries (the query
    metrics' label): the v3 status code; for the legacy protocol 200, or
    the HistoryResponse error it was encoded with."""

    body: bytes
    status: int


def _v3_error(error: StoreError) -> StoreReply:
    return StoreReply(store_v3.encode_error(error), error.status_code)


def _v2_error(error: StoreError) -> StoreReply:
    legacy = store_v2.error_for_status(error.status_code)
    return StoreReply(
        store_v2.encode_response(error.request_id, None, legacy),
        StatusCode.OK if legacy == store_v2.HistoryError.NONE else int(legacy),
    )


def _too_many(request_id: str) -> StoreError:
    return StoreError(StatusCode.TOO_MANY_REQUESTS, f"TOO_MANY_REQUESTS: {TOO_MANY_REQUESTS_TEXT}", request_id)


def _unavailable(request_id: str, exc: Exception) -> StoreError:
    """503 for a query the store failed under. A bad data file was named
    once in the log (and is in /health): its pages are not logged again."""
    if isinstance(exc, DataFileUnreadable):
        log.debug("store query needs a bad data file: %s", exc)
        return StoreError(StatusCode.SERVICE_UNAVAILABLE, f"SERVICE_UNAVAILABLE: {BAD_FILE_TEXT}", request_id)
    log.warning("store query failed: %s", exc)
    return StoreError(StatusCode.SERVICE_UNAVAILABLE, "SERVICE_UNAVAILABLE: the store is unavailable", request_id)


def _push_too_many(request_id: str) -> LightpushError:
    return LightpushError(LightpushStatus.TOO_MANY_REQUESTS, TOO_MANY_REQUESTS_TEXT, request_id)


def _push_status(refusal: Refused) -> LightpushStatus:
    if refusal.unsupported_topic:
        return LightpushStatus.UNSUPPORTED_PUBSUB_TOPIC
    if refusal.too_large:
        return LightpushStatus.PAYLOAD_TOO_LARGE
    return LightpushStatus.INVALID_MESSAGE


def _store_v3_framing_error(exc: FramingError) -> bytes:
    return store_v3.encode_error(StoreError(StatusCode.BAD_REQUEST, f"BAD_REQUEST: {exc}"))


def _store_v2_framing_error(exc: FramingError) -> bytes:
    return store_v2.encode_error(StoreError(StatusCode.BAD_REQUEST, f"BAD_REQUEST: {exc}"))


def _push_framing_error(exc: FramingError) -> LightpushError:
    status = LightpushStatus.PAYLOAD_TOO_LARGE if isinstance(exc, FrameTooLarge) else LightpushStatus.BAD_REQUEST
    return LightpushError(status, f"decode_rpc_failure: {exc}", lightpush.UNKNOWN_REQUEST_ID)


def _lightpush_v3_framing_error(exc: FramingError) -> bytes:
    return lightpush.encode_error_v3(_push_framing_error(exc))


def _lightpush_v2_framing_error(exc: FramingError) -> bytes:
    error = _push_framing_error(exc)
    error.request_id = ""
    return lightpush.encode_error_v2(error)
