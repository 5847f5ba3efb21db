"""The node's HTTP listeners: Hypercorn on trio serving ASGI apps, bounded.

Both listeners, metrics and health (node/metrics.py) and nwaku's REST API
(node/rest.py), are Starlette apps served by :func:`serve_app`. What a
client can make the node hold is bounded:

- the request line and headers: :data:`MAX_HEAD_BYTES` and
  :data:`MAX_HEADERS` (h11 refuses a head that arrives incomplete past the
  size with 400; one that arrives whole is counted here: 431);
- a request body: :data:`MAX_BODY_BYTES` (413, whether announced by
  Content-Length or sent chunked);
- requests being answered at once: :data:`MAX_REQUESTS_IN_FLIGHT` per
  listener (503 beyond);
- time: the head and body must arrive within :data:`READ_TIMEOUT_S`, an
  idle keep-alive connection is closed after :data:`KEEP_ALIVE_S`, one
  connection serves at most :data:`KEEP_ALIVE_MAX_REQUESTS` requests, and
  a handler that runs past :data:`HANDLER_TIMEOUT_S` is answered 503.

Connections are bounded by those times, not by a count: Hypercorn's trio
worker has no connection cap, and a client that opens connections and
sends nothing is dropped after :data:`READ_TIMEOUT_S`.

Every HTTP/1.1 status line carries its standard reason phrase
(``HTTP/1.1 200 OK``), which Hypercorn leaves empty: see
:func:`_give_responses_reason_phrases`.
"""

from __future__ import annotations

import logging
from http import HTTPStatus
from typing import Any

import trio

log = logging.getLogger(__name__)

MAX_HEAD_BYTES = 16 * 1024
MAX_HEADERS = 64
# A lightpush or relay message is at most max_message_size (150 KiB) of
# protobuf: its JSON (base64) is under 256 KiB.
MAX_BODY_BYTES = 1024 * 1024
MAX_REQUESTS_IN_FLIGHT = 64
READ_TIMEOUT_S = 10.0
KEEP_ALIVE_S = 5.0
KEEP_ALIVE_MAX_REQUESTS = 1000
# The longest a handler may take: a store query relayed to another peer
# (its dial and answer) is the slowest.
HANDLER_TIMEOUT_S = 30.0


class _BodyTooLarge(Exception):
    pass


class Bounded:
    """ASGI middleware: the body, in-flight and handler-time bounds above."""

    def __init__(
        self,
        app: Any,
        *,
        max_body_bytes: int = MAX_BODY_BYTES,
        max_in_flight: int = MAX_REQUESTS_IN_FLIGHT,
        handler_timeout_s: float = HANDLER_TIMEOUT_S,
    ):
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.max_in_flight = max_in_flight
        self.handler_timeout_s = handler_timeout_s
        self.in_flight = 0

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def send_tracked(message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        headers = scope.get("headers", ())
        if len(headers) > MAX_HEADERS or sum(len(k) + len(v) for k, v in headers) > MAX_HEAD_BYTES:
            await _plain(send, 431, f"at most {MAX_HEADERS} headers of {MAX_HEAD_BYTES} bytes in all")
            return
        announced = _content_length(scope)
        if announced is not None and announced > self.max_body_bytes:
            await _plain(send, 413, f"request body over {self.max_body_bytes} bytes")
            return
        if self.in_flight >= self.max_in_flight:
            await _plain(send, 503, "too many requests in flight, retry later")
            return
        received = 0

        async def receive_bounded():
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body_bytes:
                    raise _BodyTooLarge
            return message

        self.in_flight += 1
        try:
            with trio.move_on_after(self.handler_timeout_s) as scope_:
                await self.app(scope, receive_bounded, send_tracked)
            if scope_.cancelled_caught and not started:
                await _plain(send, 503, f"no answer within {self.handler_timeout_s:g} s")
        except _BodyTooLarge:
            if not started:
                await _plain(send, 413, f"request body over {self.max_body_bytes} bytes")
        except Exception:
            log.exception("HTTP handler failed on %s %s", scope.get("method"), scope.get("path"))
            if not started:
                await _plain(send, 500, "internal error (see the node's log)")
        finally:
            self.in_flight -= 1


def _content_length(scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def _plain(send, status: int, text: str) -> None:
    body = (text + "\n").encode()
    headers = [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _hypercorn_config(host: str, port: int):
    from hypercorn.config import Config

    config = Config()
    config.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    config.h11_max_incomplete_size = MAX_HEAD_BYTES
    config.h2_max_header_list_size = MAX_HEAD_BYTES
    config.h2_max_concurrent_streams = 16
    config.read_timeout = int(READ_TIMEOUT_S)
    config.keep_alive_timeout = KEEP_ALIVE_S
    config.keep_alive_max_requests = KEEP_ALIVE_MAX_REQUESTS
    config.max_app_queue_size = 4
    config.include_server_header = False
    config.accesslog = None
    config.errorlog = logging.getLogger("wakustore.http")
    config.graceful_timeout = 1.0
    return config


def _reason_phrase(status: int) -> bytes:
    """The standard reason phrase of ``status`` (http.HTTPStatus), b"" for a
    code it does not name."""
    try:
        return HTTPStatus(status).phrase.encode("ascii")
    except ValueError:
        return b""


# The one Hypercorn method wrapped (below), pinned with Hypercorn itself
# (pyproject.toml): an upgrade that changes it fails
# tests/node/test_metrics.py until the wrap is reviewed against it.
WRAPPED_HYPERCORN = "hypercorn.protocol.h11.H11Protocol._send_h11_event"
WRAPPED_SOURCE_SHA256 = "5e40283daa303ec7f910e95145a9edd2b835fb54675ba1b1a560fbd58f136e19"


def _give_responses_reason_phrases() -> None:
    """Make Hypercorn's HTTP/1.1 status lines carry the standard reason phrase.

    Hypercorn builds h11's ``Response`` and ``InformationalResponse`` with a
    status code and headers only (ASGI has no reason phrase to give it),
    and h11 writes the reason it is given, b"" by default: every answer
    went out as ``HTTP/1.1 200 `` (valid, but not what operators' tools and
    people expect). Each event of Hypercorn's HTTP/1.1 protocol is sent
    through ``H11Protocol._send_h11_event``: the applications' answers, and
    Hypercorn's own (400 for a malformed request, 100 Continue). Wrapped
    here, once per process, a response without a reason gets its phrase
    before h11 writes it; nothing else of the event changes. HTTP/2 has no
    reason phrase. Hypercorn serves only this module's listeners in a
    node's process."""
    import h11
    from hypercorn.protocol.h11 import H11Protocol

    send = H11Protocol._send_h11_event
    if getattr(send, "gives_reason_phrases", False):
        return

    async def _send_h11_event(self, event) -> None:
        if isinstance(event, (h11.Response, h11.InformationalResponse)) and not event.reason:
            reason = _reason_phrase(event.status_code)
            if reason:
                event = type(event)(
                    headers=event.headers,
                    status_code=event.status_code,
                    http_version=event.http_version,
                    reason=reason,
                )
        await send(self, event)

    _send_h11_event.gives_reason_phrases = True  # type: ignore[attr-defined]
    _send_h11_event.wrapped = send  # type: ignore[attr-defined]
    H11Protocol._send_h11_event = _send_h11_event  # type: ignore[method-assign]


async def serve_app(app: Any, host: str, port: int, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Serve ``app`` (ASGI) on ``host:port`` (0: a port from the kernel)
    until cancelled; ``task_status.started`` gets the port. Raises
    :class:`~wakustore.node.host.ListenError` when the address cannot be
    bound."""
    import hypercorn.trio

    from wakustore.node.host import binding

    _give_responses_reason_phrases()
    config = _hypercorn_config(host, port)
    async with trio.open_nursery() as nursery:
        with binding("http", host, port):
            binds = await nursery.start(
                lambda task_status: hypercorn.trio.serve(Bounded(app), config, task_status=task_status)
            )
        task_status.started(int(binds[0].rsplit(":", 1)[1]))
