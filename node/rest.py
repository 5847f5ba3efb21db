"""nwaku's REST API over a running node (``--rest``).

The endpoints, their parameters and their JSON are nwaku's handlers'
(``waku/rest_api/endpoint/*``); parsing and shaping live in
:mod:`wakustore.protocols.rest`, the HTTP layer in :mod:`wakustore.node.http`.
Every request is answered through the same code as the wire:

- ``GET /store/v3/messages`` is a Store v3 request answered by
  :meth:`StoreProtocols.answer_store_v3` (same validation, same per-peer
  and per-address rate limit, keyed by the client's address), or, with
  ``peerAddr``, sent to that peer from the node's host;
- ``POST /lightpush/v3/message`` and the relay ``POST`` endpoints are a
  lightpush v3 request answered by :meth:`StoreProtocols.answer_lightpush_v3`:
  the same checks, the same write-ahead log, then relay.

Where this node answers differently from nwaku (README, "REST API"):
errors of this node's own store are 400 (a bad parameter or a cursor it
does not hold), 429 or 503 as text, where nwaku answers 500 for an
archive error; a push stored but relayed to no peer is a success with
``relayPeerCount: 0`` (nwaku: 505); the relay endpoints take only the
pubsub topics of the shards this node serves; ``/info`` also names the
node's ``ports``.
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

import trio

from wakustore.node.rate_limits import REMOTE_ADDRESS
from wakustore.protocols import lightpush, rest, store_v3, topics
from wakustore.protocols.errors import ProtocolError, StoreError
from wakustore.protocols.lightpush import LightpushStatus
from wakustore.protocols.message import WakuMessage
from wakustore.protocols.rest import RestError
from wakustore.protocols.store_query import StatusCode

log = logging.getLogger(__name__)

# A store query relayed to another peer: its dial, then its answer.
PEER_DIAL_TIMEOUT_S = 10.0
PEER_ANSWER_TIMEOUT_S = 10.0
# Peers listed by /admin/v1/peers at most (the peer store can hold many).
MAX_LISTED_PEERS = 1000

ADMIN_OFF = "/admin endpoints are not available. Please check your configuration: --rest-admin=true"
RELAY_OFF = "/relay endpoints are not available: this node runs without relay (--no-relay)"
AUTOSHARDING_OFF = "Autosharding is disabled: this node uses static sharding (set num_shards_in_network)"

# nwaku's Python log levels for POST /admin/v1/log-level.
_LOG_LEVELS = {
    "TRACE": logging.DEBUG,
    "DEBUG": logging.DEBUG,
    "INFO": logging.INFO,
    "NOTICE": 25,
    "WARN": logging.WARNING,
    "ERROR": logging.ERROR,
    "FATAL": logging.CRITICAL,
}

# nwaku's protocol names in /health, in its order; what this node serves of them.
_HEALTH_PROTOCOLS = (
    "Relay",
    "Rln Relay",
    "Lightpush",
    "Legacy Lightpush",
    "Filter",
    "Store",
    "Legacy Store",
    "Peer Exchange",
    "Rendezvous",
    "Mix",
    "Lightpush Client",
    "Legacy Lightpush Client",
    "Store Client",
    "Legacy Store Client",
    "Filter Client",
)

# Service protocols /admin/v1/peers/service lists peers by (nwaku's codecs).
_SERVICE_PROTOCOLS = (
    "/vac/waku/relay/2.0.0",
    "/vac/waku/filter-subscribe/2.0.0-beta1",
    "/vac/waku/store-query/3.0.0",
    "/vac/waku/store/2.0.0-beta4",
    "/vac/waku/lightpush/2.0.0-beta1",
    "/vac/waku/lightpush/3.0.0",
    "/vac/waku/peer-exchange/2.0.0-alpha1",
    "/vac/waku/reconciliation/1.0.0",
    "/vac/waku/transfer/1.0.0",
)


class RelayCache:
    """Relayed messages kept for ``GET /relay/v1/messages``: those of the
    pubsub topics and content topics subscribed through the API, at most
    ``capacity`` over all topics (the oldest timestamp leaves first, as in
    nwaku); a GET takes its topic's messages out."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.pubsub_topics: set[str] = set()
        self.content_topics: set[str] = set()
        self._kept: list[tuple[str, WakuMessage]] = []

    def add(self, pubsub_topic: str, message: WakuMessage) -> None:
        if pubsub_topic not in self.pubsub_topics and message.content_topic not in self.content_topics:
            return
        self._kept.append((pubsub_topic, message))
        if len(self._kept) > self.capacity:
            oldest = min(range(len(self._kept)), key=lambda i: self._kept[i][1].timestamp)
            del self._kept[oldest]

    def take(self, matches: Callable[[str, WakuMessage], bool]) -> list[WakuMessage]:
        taken = [m for t, m in self._kept if matches(t, m)]
        self._kept = [(t, m) for t, m in self._kept if not matches(t, m)]
        return taken


def rest_app(node: Any):
    """The Starlette app of nwaku's REST API over ``node`` (a
    :class:`~wakustore.node.running.RunningNode`)."""
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.requests import Request
    from starlette.responses import JSONResponse, PlainTextResponse, Response
    from starlette.routing import Route

    config = node.config
    cache = RelayCache(config.rest_relay_cache_capacity)
    if node.relay is not None:
        node.relay.on_message = cache.add
    served = set(node.protocols.pubsub_topics)

    def text(status: int, body: str) -> Response:
        return PlainTextResponse(body, status_code=status)

    def ok() -> Response:
        return text(200, "OK")

    def client_of(request: Request) -> str:
        return request.client.host if request.client is not None else "unknown"

    def handled(handler):
        """``handler`` with RestError answered as its status and text."""

        async def endpoint(request: Request) -> Response:
            try:
                return await handler(request)
            except RestError as exc:
                return text(exc.status, exc.text)

        return endpoint

    async def json_body(request: Request) -> Any:
        kind = request.headers.get("content-type", "application/json").split(";")[0].strip().lower()
        if kind not in ("application/json", "text/plain", ""):
            raise RestError(400, "Wrong Content-Type, expected application/json or text/plain")
        raw = await request.body()
        if not raw:
            raise RestError(400, "Missing content body")
        try:
            return json.loads(raw)
        except (ValueError, RecursionError) as exc:
            raise RestError(400, f"Invalid content body, could not decode: {exc}") from None

    # --- store ---------------------------------------------------------------

    async def store_messages(request: Request) -> Response:
        params: dict[str, str] = {}
        for key, value in request.query_params.multi_items():
            key = key.lower()
            params[key] = f"{params[key]},{value}" if key in params else value
        wanted = rest.parse_store_request(params)
        address = client_of(request)
        if wanted.peer_addr is None:
            answer = await _own_store(address, wanted.query)
        else:
            answer = await _peer_store(address, wanted.peer_addr, wanted.query)
        entries = [(e.message_hash, e.pubsub_topic, e.message) for e in answer.messages]
        return JSONResponse(
            rest.store_json(answer.request_id, answer.status_code, answer.status_desc, entries, answer.cursor)
        )

    async def _own_store(address: str, query) -> store_v3.StoreResponse:
        request_id = uuid.uuid4().hex
        started = time.perf_counter()
        token = REMOTE_ADDRESS.set(address)
        try:
            reply = await node.protocols.answer_store_v3(f"rest:{address}", store_v3.encode_request(request_id, query))
        finally:
            REMOTE_ADDRESS.reset(token)
        metrics = node.service.metrics
        metrics.query_latency.labels("rest-store-v3").observe(time.perf_counter() - started)
        metrics.queries.labels("rest-store-v3", str(int(reply.status))).inc()
        answer = store_v3.decode_response(reply.body)
        if answer.status_code == StatusCode.OK:
            return answer
        if answer.status_code == StatusCode.TOO_MANY_REQUESTS:
            raise RestError(429, "Request rate limit reached")
        if answer.status_code == StatusCode.SERVICE_UNAVAILABLE:
            raise RestError(503, answer.status_desc)
        raise RestError(400, answer.status_desc)

    async def _peer_store(address: str, peer_addr: str, query) -> store_v3.StoreResponse:
        from wakustore.clients.store import ClientError, StoreClient
        from wakustore.transport.peers import connect, parse_peer

        try:
            info = parse_peer(peer_addr)
        except ValueError as exc:
            raise RestError(400, f"Failed parsing remote peer info: {exc}") from None
        if not node.protocols.store_buckets.allow(f"rest:{address}", address):
            raise RestError(429, "Request rate limit reached")
        try:
            with trio.fail_after(PEER_DIAL_TIMEOUT_S):
                await connect(node.host, info)
        except Exception as exc:
            log.info("REST store query: cannot dial %s: %r", peer_addr, exc)
            return store_v3.StoreResponse("", 504, f"PEER_DIAL_FAILURE: {peer_addr}")
        try:
            answer = await StoreClient(node.host, info.peer_id, PEER_ANSWER_TIMEOUT_S).query(query)
        except ClientError as exc:
            raise RestError(500, f"No history response received: {exc}") from None
        except StoreError as exc:
            return store_v3.StoreResponse("", exc.status_code, exc.description)
        if answer.status_code == StatusCode.TOO_MANY_REQUESTS:
            raise RestError(429, "Request rate limit reached")
        return answer

    # --- health, info, version ----------------------------------------------

    async def health(request: Request) -> Response:
        try:
            report = await trio.to_thread.run_sync(node.service.health)
        except Exception as exc:
            report = {"ok": False, "error": str(exc)}
        return JSONResponse(_nwaku_health(node, report))

    async def info(request: Request) -> Response:
        body: dict[str, Any] = {"listenAddresses": list(node.info.multiaddrs)}
        if node.enr is not None:
            body["enrUri"] = node.enr.text
        body["ports"] = _ports(node)
        return JSONResponse(body)

    async def version(request: Request) -> Response:
        return text(200, _version())

    # --- admin ----------------------------------------------------------------

    def admin(handler):
        async def endpoint(request: Request) -> Response:
            if not config.rest_admin:
                return text(404, ADMIN_OFF)
            return await handled(handler)(request)

        return endpoint

    def shard_of(request: Request) -> int:
        raw = request.path_params["shard"]
        try:
            shard = int(raw)
            topics.Shard(config.cluster_id, shard)
        except (ValueError, ProtocolError):
            raise RestError(400, f"Invalid shardId: {raw[:20]}") from None
        return shard

    async def peers(request: Request) -> Response:
        return JSONResponse([_peer_json(node, p) for p in _known_peers(node)])

    async def one_peer(request: Request) -> Response:
        from libp2p.peer.id import ID

        raw = request.path_params["peer_id"]
        try:
            peer = ID.from_base58(raw)
            # A peer id is a multihash: identity (0x00) or sha2-256 (0x12), its length, the digest.
            digest = peer.to_bytes()
            if len(digest) < 2 or digest[0] not in (0x00, 0x12) or digest[1] != len(digest) - 2:
                raise ValueError("not a multihash")
        except Exception as exc:
            raise RestError(400, f"Invalid argument:{exc}") from None
        if peer not in _known_peers(node):
            raise RestError(404, f"Peer with ID {raw[:80]} not found")
        return JSONResponse(_peer_json(node, peer))

    async def connected(request: Request) -> Response:
        found = [_peer_json(node, p) for p in _known_peers(node) if _is_connected(node, p)]
        if "shard" in request.path_params:
            shard = shard_of(request)
            found = [p for p in found if shard in p["shards"]]
        return JSONResponse(found)

    async def service_peers(request: Request) -> Response:
        found = []
        for peer in _known_peers(node):
            entry = _peer_json(node, peer)
            entry["protocols"] = [p for p in entry["protocols"] if p in _SERVICE_PROTOCOLS]
            if entry["protocols"]:
                found.append(entry)
        return JSONResponse(found)

    def relay_peers(mesh: bool):
        async def endpoint(request: Request) -> Response:
            if node.relay is None:
                raise RestError(503, "Error: Relay Protocol is not mounted to the node")
            groups = _relay_groups(node, mesh)
            if "shard" in request.path_params:
                shard = shard_of(request)
                return JSONResponse(next((g for g in groups if g["shard"] == shard), {"shard": shard, "peers": []}))
            return JSONResponse(groups)

        return endpoint

    async def stats(request: Request) -> Response:
        return JSONResponse(_peer_stats(node))

    async def dial(request: Request) -> Response:
        from wakustore.transport.peers import connect, parse_peer

        addrs = rest.parse_string_list(await json_body(request), "multiaddrs", rest.MAX_PEERS_PER_REQUEST)
        for index, addr in enumerate(addrs):
            try:
                info = parse_peer(addr)
            except ValueError as exc:
                raise RestError(400, f"Couldn't parse remote peer info: {exc}") from None
            try:
                with trio.fail_after(PEER_DIAL_TIMEOUT_S):
                    await connect(node.host, info)
            except Exception as exc:
                log.info("REST dial of %s failed: %r", addr, exc)
                raise RestError(400, f"Failed to connect to peer at index: {index} - {addr}") from None
        return ok()

    async def log_level(request: Request) -> Response:
        level = rest.parse_log_level(request.path_params["level"])
        logging.getLogger().setLevel(_LOG_LEVELS[level])
        log.warning("log level set to %s through the REST API", level)
        return ok()

    # --- relay ------------------------------------------------------------------

    def relay(handler):
        async def endpoint(request: Request) -> Response:
            if node.relay is None:
                return text(404, RELAY_OFF)
            return await handled(handler)(request)

        return endpoint

    def served_topics(wanted: list[str]) -> list[str]:
        bad = [t for t in wanted if not _is_shard_topic(t)]
        if bad:
            raise RestError(400, f"Invalid pubsub topic(s): {bad[:10]}")
        other = [t for t in wanted if t not in served]
        if other:
            raise RestError(400, f"not relayed by this node: {other[:10]} (it serves {sorted(served)})")
        return wanted

    async def subscribe(request: Request) -> Response:
        cache.pubsub_topics.update(served_topics(rest.parse_string_list(await json_body(request), "pubsub topics")))
        return ok()

    async def unsubscribe(request: Request) -> Response:
        cache.pubsub_topics.difference_update(rest.parse_string_list(await json_body(request), "pubsub topics"))
        return ok()

    def drained(matches: Callable[[str, WakuMessage], bool]) -> Response:
        return JSONResponse([rest.message_json(m, relay=True) for m in cache.take(matches)])

    async def relay_messages(request: Request) -> Response:
        topic = request.path_params["topic"]
        if topic not in cache.pubsub_topics:
            return text(404, "")
        return drained(lambda t, m: t == topic)

    async def relay_publish(request: Request) -> Response:
        topic = request.path_params["topic"]
        if topic not in served:
            raise RestError(400, f"Failed to publish: Node not subscribed to topic: {topic[:200]}")
        message = rest.parse_message(await json_body(request), time.time_ns())
        await publish(request, topic, message)
        return ok()

    def autoshard(content_topic: str) -> str:
        if not config.num_shards_in_network:
            raise RestError(400, f"Failed to publish. {AUTOSHARDING_OFF}")
        return rest.autoshard(content_topic, config.cluster_id, config.num_shards_in_network)

    async def auto_subscribe(request: Request) -> Response:
        wanted = rest.parse_string_list(await json_body(request), "content topics")
        served_topics([autoshard(t) for t in wanted])
        cache.content_topics.update(wanted)
        return ok()

    async def auto_unsubscribe(request: Request) -> Response:
        cache.content_topics.difference_update(rest.parse_string_list(await json_body(request), "content topics"))
        return ok()

    async def auto_messages(request: Request) -> Response:
        content_topic = request.path_params["content_topic"]
        if content_topic not in cache.content_topics:
            return text(404, content_topic[:200])
        return drained(lambda t, m: m.content_topic == content_topic)

    async def auto_publish(request: Request) -> Response:
        message = rest.parse_message(await json_body(request), time.time_ns())
        topic = autoshard(message.content_topic)
        served_topics([topic])
        await publish(request, topic, message)
        return ok()

    async def publish(request: Request, topic: str, message: WakuMessage) -> None:
        answer = await push(client_of(request), topic, message)
        if answer.status_code == LightpushStatus.SUCCESS:
            return
        if answer.status_code in (LightpushStatus.TOO_MANY_REQUESTS, LightpushStatus.SERVICE_NOT_AVAILABLE):
            raise RestError(answer.status_code, answer.status_desc or "")
        raise RestError(400, f"Failed to publish: {answer.status_desc}")

    # --- lightpush ------------------------------------------------------------

    async def lightpush_message(request: Request) -> Response:
        try:
            topic, message = rest.parse_push(await json_body(request), time.time_ns())
        except RestError as exc:
            return JSONResponse({"statusDesc": f"Invalid push request! {exc.text}"}, status_code=400)
        if topic is None and config.num_shards_in_network:
            try:
                topic = rest.autoshard(message.content_topic, config.cluster_id, config.num_shards_in_network)
            except RestError as exc:
                return JSONResponse({"statusDesc": exc.text}, status_code=400)
        answer = await push(client_of(request), topic, message)
        if answer.status_code == LightpushStatus.SUCCESS:
            return JSONResponse({"relayPeerCount": answer.relay_peer_count or 0})
        return JSONResponse({"statusDesc": answer.status_desc or ""}, status_code=answer.status_code)

    async def push(address: str, topic: str | None, message: WakuMessage) -> lightpush.PushResponseV3:
        token = REMOTE_ADDRESS.set(address)
        try:
            raw = lightpush.encode_request_v3(uuid.uuid4().hex, topic, message)
            return lightpush.decode_response_v3(await node.protocols.answer_lightpush_v3(f"rest:{address}", raw))
        finally:
            REMOTE_ADDRESS.reset(token)

    routes = [
        Route("/store/v3/messages", handled(store_messages), methods=["GET"]),
        Route("/health", handled(health), methods=["GET"]),
        Route("/info", handled(info), methods=["GET"]),
        Route("/debug/v1/info", handled(info), methods=["GET"]),
        Route("/version", handled(version), methods=["GET"]),
        Route("/debug/v1/version", handled(version), methods=["GET"]),
        Route("/admin/v1/peers", admin(peers), methods=["GET"]),
        Route("/admin/v1/peers", admin(dial), methods=["POST"]),
        Route("/admin/v1/peer/{peer_id}", admin(one_peer), methods=["GET"]),
        Route("/admin/v1/peers/connected", admin(connected), methods=["GET"]),
        Route("/admin/v1/peers/connected/on/{shard}", admin(connected), methods=["GET"]),
        Route("/admin/v1/peers/service", admin(service_peers), methods=["GET"]),
        Route("/admin/v1/peers/relay", admin(relay_peers(mesh=False)), methods=["GET"]),
        Route("/admin/v1/peers/relay/on/{shard}", admin(relay_peers(mesh=False)), methods=["GET"]),
        Route("/admin/v1/peers/mesh", admin(relay_peers(mesh=True)), methods=["GET"]),
        Route("/admin/v1/peers/mesh/on/{shard}", admin(relay_peers(mesh=True)), methods=["GET"]),
        Route("/admin/v1/peers/stats", admin(stats), methods=["GET"]),
        Route("/admin/v1/log-level/{level}", admin(log_level), methods=["POST"]),
        Route("/relay/v1/subscriptions", relay(subscribe), methods=["POST"]),
        Route("/relay/v1/subscriptions", relay(unsubscribe), methods=["DELETE"]),
        Route("/relay/v1/messages/{topic:path}", relay(relay_messages), methods=["GET"]),
        Route("/relay/v1/messages/{topic:path}", relay(relay_publish), methods=["POST"]),
        Route("/relay/v1/auto/subscriptions", relay(auto_subscribe), methods=["POST"]),
        Route("/relay/v1/auto/subscriptions", relay(auto_unsubscribe), methods=["DELETE"]),
        Route("/relay/v1/auto/messages/{content_topic:path}", relay(auto_messages), methods=["GET"]),
        Route("/relay/v1/auto/messages", relay(auto_publish), methods=["POST"]),
        Route("/lightpush/v3/message", handled(lightpush_message), methods=["POST"]),
    ]
    return Starlette(routes=routes, middleware=[Middleware(_Cors, allowed=config.rest_allow_origin)])


async def serve_rest(node: Any, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Serve :func:`rest_app` on the configured address until cancelled;
    ``task_status`` gets the port."""
    from wakustore.node.http import serve_app

    await serve_app(rest_app(node), node.config.rest_address, node.config.rest_port, task_status=task_status)


class _Cors:
    """nwaku's origin handler: without ``--rest-allow-origin`` no CORS
    headers; with it, a request whose Origin does not match is refused
    (403), one that matches is answered with the origin allowed."""

    def __init__(self, app, allowed: list[str]):
        self.app = app
        self.enabled = bool(allowed)
        self.patterns = rest.origin_patterns(allowed)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or not self.enabled:
            await self.app(scope, receive, send)
            return
        origins = [v.decode("latin-1") for k, v in scope.get("headers", ()) if k == b"origin"]
        if not origins:
            await self.app(scope, receive, send)
            return
        if len(origins) > 1:
            await _answer(send, 400, "Only a single Origin header must be specified")
            return
        origin = origins[0]
        if not rest.origin_allowed(self.patterns, origin):
            await _answer(send, 403, "Origin not allowed")
            return
        extra = [(b"access-control-allow-headers", b"Content-Type")]
        if self.patterns is None:
            extra.append((b"access-control-allow-origin", b"*"))
        else:
            extra += [(b"vary", b"Origin"), (b"access-control-allow-origin", origin.encode("latin-1"))]
        if scope["method"] == "OPTIONS":
            await _answer(send, 200, "OK", extra)
            return

        async def send_with_cors(message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        await self.app(scope, receive, send_with_cors)


async def _answer(send, status: int, text: str, headers: list | None = None) -> None:
    body = text.encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"text/plain; charset=utf-8"),
                (b"content-length", str(len(body)).encode()),
                *(headers or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


# --- what the answers are made of -------------------------------------------------


def _version() -> str:
    try:
        return "wakustore " + importlib.metadata.version("wakustore")
    except importlib.metadata.PackageNotFoundError:
        return "wakustore n/a"


def _is_shard_topic(topic: str) -> bool:
    try:
        topics.parse_shard_topic(topic)
    except ProtocolError:
        return False
    return True


def _ports(node: Any) -> dict[str, int]:
    """The node's listening ports by what they serve (an addition to nwaku's /info)."""
    ports: dict[str, int] = {}
    for addr in node.info.multiaddrs:
        parts = addr.split("/")
        if "tcp" in parts:
            port = int(parts[parts.index("tcp") + 1])
            ports.setdefault("websocket" if "ws" in parts else "tcp", port)
    for name, value in (
        ("metrics", node.metrics_port),
        ("rest", node.rest_port),
        ("mailserver", node.mailserver.port if node.mailserver is not None else None),
    ):
        if value:
            ports[name] = value
    return ports


def _nwaku_health(node: Any, report: dict) -> dict[str, Any]:
    """``/health`` in nwaku's shape from this node's own health report."""
    store_ok = bool(report.get("ok"))
    relay = node.relay
    entries: dict[str, dict[str, str]] = {name: {name: rest.NOT_MOUNTED} for name in _HEALTH_PROTOCOLS}
    for name in ("Store", "Legacy Store", "Lightpush", "Legacy Lightpush"):
        entries[name] = {name: rest.READY} if store_ok else {name: rest.NOT_READY, "desc": _why(report)}
    if relay is not None:
        peers = relay.peer_count()
        entries["Relay"] = {"Relay": rest.READY} if peers else {"Relay": rest.NOT_READY, "desc": "No connected peers"}
    if node.peer_exchange is not None:
        entries["Peer Exchange"] = {"Peer Exchange": rest.READY}
    return {
        "nodeHealth": rest.READY if store_ok else rest.NOT_READY,
        "connectionStatus": _connection_status(node),
        "protocolsHealth": [entries[name] for name in _HEALTH_PROTOCOLS],
    }


def _why(report: dict) -> str:
    if "error" in report:
        return str(report["error"])[:200]
    return "the store cannot answer (see /health on the metrics port)"


def _connection_status(node: Any) -> str:
    relay = node.relay
    if relay is None:
        return "Connected" if node.host.get_network().get_connections_map() else "Disconnected"
    if not relay.peer_count():
        return "Disconnected"
    if all(relay.peer_count(t) for t in relay.topics):
        return "Connected"
    return "PartiallyConnected"


def _known_peers(node: Any) -> list:
    own = node.host.get_id()
    store = node.host.get_peerstore()
    listed = [p for p in store.peer_ids() if p != own]
    return listed[:MAX_LISTED_PEERS]


def _is_connected(node: Any, peer) -> bool:
    return bool(node.host.get_network().get_connections(peer))


def _peer_json(node: Any, peer, score: float | None = None) -> dict[str, Any]:
    store = node.host.get_peerstore()
    try:
        addrs = store.addrs(peer)
    except Exception:  # py-libp2p raises for a peer with no address record
        addrs = []
    try:
        protocols = sorted(store.get_protocols(peer))
    except Exception:
        protocols = []
    try:
        agent = str(store.get(peer, "AgentVersion"))
    except Exception:
        agent = ""
    entry: dict[str, Any] = {
        "multiaddr": f"{addrs[0]}/p2p/{peer}" if addrs else "",
        "protocols": protocols,
        "shards": _shards_of(node, peer),
        "connected": "Connected" if _is_connected(node, peer) else "CanConnect",
        "agent": agent,
        "origin": _origin_of(node, peer),
    }
    if score is not None:
        entry["score"] = score
    return entry


def _shards_of(node: Any, peer) -> list[int]:
    relay = node.relay
    if relay is None:
        return []
    shards = []
    for topic, members in relay.pubsub.peer_topics.items():
        if peer in members and _is_shard_topic(topic):
            shard = topics.parse_shard_topic(topic)
            if shard.cluster_id == node.config.cluster_id:
                shards.append(shard.index)
    return sorted(shards)


def _origin_of(node: Any, peer) -> str:
    relay = node.relay
    if relay is None:
        return "UnknownOrigin"
    return relay.origins.get(peer, "UnknownOrigin")


def _relay_groups(node: Any, mesh: bool) -> list[dict[str, Any]]:
    relay = node.relay
    groups = []
    for topic in relay.topics:
        if mesh:
            members = set(relay.router.mesh.get(topic, ()))
        else:
            members = {p for p in relay.pubsub.peer_topics.get(topic, ()) if p in relay.pubsub.peers}
        scorer = relay.scores.scorer
        groups.append(
            {
                "shard": topics.parse_shard_topic(topic).index,
                "peers": [_peer_json(node, p, score=scorer.score(p, [topic])) for p in sorted(members, key=str)],
            }
        )
    return groups


def _peer_stats(node: Any) -> dict[str, Any]:
    peers = _known_peers(node)
    connected = sum(1 for p in peers if _is_connected(node, p))
    stats: dict[str, Any] = {
        "Sum": {"Total peers": len(peers)},
        "By Connectedness": {
            "Connected": connected,
            "NotConnected": 0,
            "CannotConnect": 0,
            "CanConnect": len(peers) - connected,
        },
    }
    if node.relay is not None:
        relay = node.relay
        in_mesh = set().union(*(set(relay.router.mesh.get(t, ())) for t in relay.topics))
        for key, total, mesh in (
            ("Relay peers", ("Total relay peers", len(relay.pubsub.peers)), False),
            ("Mesh peers", ("Total mesh peers", len(in_mesh)), True),
        ):
            counts: dict[str, int] = {str(g["shard"]): len(g["peers"]) for g in _relay_groups(node, mesh)}
            counts[total[0]] = total[1]
            stats[key] = counts
    by_protocol: dict[str, int] = {}
    for peer in peers:
        for protocol in _peer_json(node, peer)["protocols"]:
            by_protocol[protocol] = by_protocol.get(protocol, 0) + 1
    stats["By Protocols"] = by_protocol
    return stats
