"""nwaku's REST API as values: parameters parsed, answers shaped, sans-IO.

What the HTTP layer (``node/rest.py``) asks of this module: turn query
parameters and JSON bodies into the node's values, or into a
:class:`RestError` (an HTTP status and one line of text, as nwaku answers
errors: ``text/plain``); and turn the node's answers into the JSON nwaku
writes. The reference is nwaku's handlers (``waku/rest_api/endpoint/*``),
not the ``waku-rest-api`` OpenAPI files, where the two differ:

- hashes and cursors are ``0x`` hex (the OpenAPI files say base64); the
  ``0x`` is optional on input;
- a store entry is ``{messageHash, message?, pubsubTopic?}`` (the OpenAPI
  files say ``message_hash`` and a required ``message``);
- a message's timestamp is a JSON number of nanoseconds; ``payload``,
  ``meta`` and ``proof`` are standard base64; a store answer leaves out an
  empty ``meta`` and ``proof``, a relay answer always writes ``proof``;
- ``ascending``: only ``"true"`` pages forward, any other value backward,
  absent forward.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from wakustore.protocols import store_query, topics
from wakustore.protocols.errors import ProtocolError, StoreError, TopicError
from wakustore.protocols.message import HASH_SIZE, WakuMessage
from wakustore.protocols.store_query import HistoryQuery

# nwaku's --rest-relay-cache-capacity default: messages kept for GET
# /relay/v1/messages, over all topics.
RELAY_CACHE_CAPACITY = 50

# Bounds on what a request may carry: topics in a subscription body, peers
# in POST /admin/v1/peers, characters of a query parameter (100 hashes of
# 66 characters and their commas fit).
MAX_TOPICS_PER_REQUEST = 100
MAX_PEERS_PER_REQUEST = 32
MAX_PARAMETER_LENGTH = 8 * 1024

# nwaku's log levels (chronicles), as POST /admin/v1/log-level takes them.
LOG_LEVELS = ("TRACE", "DEBUG", "INFO", "NOTICE", "WARN", "ERROR", "FATAL")

# Health strings, as nwaku writes them (its enum names).
READY = "READY"
NOT_READY = "NOT_READY"
NOT_MOUNTED = "NOT_MOUNTED"
INITIALIZING = "INITIALIZING"


class RestError(ProtocolError):
    """An answer other than success: the HTTP status and its text."""

    def __init__(self, status: int, text: str):
        super().__init__(text)
        self.status = status
        self.text = text


def bad_request(text: str) -> RestError:
    return RestError(400, text)


# --- GET /store/v3/messages ---------------------------------------------------


@dataclass(frozen=True, slots=True)
class StoreRequest:
    """A store query from the REST API and the peer to ask (None: this node)."""

    query: HistoryQuery
    peer_addr: str | None


def parse_store_request(params: Mapping[str, str]) -> StoreRequest:
    """The query of ``GET /store/v3/messages``; raises :class:`RestError`
    (400, which parameter and why) for a bad one. Unknown parameters are
    ignored, an empty one counts as absent, and names are read without
    regard to case, as in nwaku."""
    lowered = {key.lower(): value for key, value in params.items()}

    def get(name: str) -> str | None:
        value = lowered.get(name.lower())
        if value is not None and len(value) > MAX_PARAMETER_LENGTH:
            raise bad_request(f"{name}: longer than {MAX_PARAMETER_LENGTH} characters")
        return value or None

    include_data = parse_bool("includeData", get("includeData"), default=False)
    start = _time("startTime", get("startTime"))
    end = _time("endTime", get("endTime"))
    size = get("pageSize")
    limit = None
    if size is not None:
        try:
            limit = int(size)
        except ValueError:
            raise bad_request(f"pageSize: not a number: {size!r}") from None
        if limit < 0:
            raise bad_request(f"pageSize: negative: {limit}")
    pubsub_topic = get("pubsubTopic")
    if pubsub_topic is not None:
        check_pubsub_topic(pubsub_topic)
    content_topics = [t for t in (get("contentTopics") or "").split(",") if t]
    hashes = [parse_hash("hashes", h) for h in (get("hashes") or "").split(",") if h]
    cursor = get("cursor")
    ascending = get("ascending")
    try:
        query = store_query.validate_v3(
            pubsub_topic=pubsub_topic,
            content_topics=content_topics,
            time_start=start,
            time_end=end,
            message_hashes=hashes,
            cursor=None if cursor is None else parse_hash("cursor", cursor),
            forward=ascending is None or ascending == "true",
            limit=limit,
            include_data=include_data,
        )
    except StoreError as exc:
        raise bad_request(exc.description.removeprefix("BAD_REQUEST: ")) from None
    return StoreRequest(query, get("peerAddr"))


def _time(name: str, value: str | None) -> int | None:
    if value is None:
        return None
    try:
        ns = int(value)
    except ValueError:
        raise bad_request(f"{name}: not a number of nanoseconds: {value!r}") from None
    if ns >= 1 << 63:
        raise bad_request(f"{name}: past the 64-bit range")
    return ns if ns > 0 else None  # nwaku ignores a time <= 0


def parse_bool(name: str, value: str | None, default: bool) -> bool:
    if value is None:
        return default
    if value.lower() in ("true", "1", "yes"):
        return True
    if value.lower() in ("false", "0", "no"):
        return False
    raise bad_request(f"{name}: not a boolean: {value!r}")


def parse_hash(name: str, text: str) -> bytes:
    """A 32-byte hash written as hex, ``0x`` optional."""
    digits = text.strip().removeprefix("0x").removeprefix("0X")
    try:
        raw = bytes.fromhex(digits)
    except ValueError:
        raise bad_request(f"{name}: not hex: {text[:80]!r}") from None
    if len(raw) != HASH_SIZE:
        raise bad_request(f"{name}: a hash is {HASH_SIZE} bytes, not {len(raw)}")
    return raw


def check_pubsub_topic(topic: str) -> topics.Shard:
    """The shard a pubsub topic names; 400 unless it is ``/waku/2/rs/C/S``."""
    try:
        return topics.parse_shard_topic(topic)
    except TopicError as exc:
        raise bad_request(f"pubsubTopic: {exc}") from None


def store_json(
    request_id: str,
    status_code: int,
    status_desc: str,
    entries: Sequence[tuple[bytes, str | None, WakuMessage | None]],
    cursor: bytes | None,
) -> dict[str, Any]:
    """A store answer as nwaku writes it: each entry ``(hash, pubsub topic
    or None, message or None)``."""
    messages = []
    for message_hash, pubsub_topic, message in entries:
        entry: dict[str, Any] = {"messageHash": hex_hash(message_hash)}
        if message is not None:
            entry["message"] = message_json(message, relay=False)
        if pubsub_topic is not None and message is not None:
            entry["pubsubTopic"] = pubsub_topic
        messages.append(entry)
    answer: dict[str, Any] = {
        "requestId": request_id,
        "statusCode": status_code,
        "statusDesc": status_desc,
        "messages": messages,
    }
    if cursor is not None:
        answer["paginationCursor"] = hex_hash(cursor)
    return answer


def hex_hash(raw: bytes) -> str:
    return "0x" + raw.hex()


# --- messages -------------------------------------------------------------------


def message_json(message: WakuMessage, *, relay: bool) -> dict[str, Any]:
    """A WakuMessage as nwaku writes it; ``relay``: the relay endpoints'
    form, which always writes ``proof``."""
    out: dict[str, Any] = {
        "payload": _b64(message.payload),
        "contentTopic": message.content_topic,
        "version": message.version,
        "timestamp": message.timestamp,
        "ephemeral": message.ephemeral,
    }
    if message.meta:
        out["meta"] = _b64(message.meta)
    if relay or message.rate_limit_proof:
        out["proof"] = _b64(message.rate_limit_proof)
    return out


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def parse_message(body: Any, now_ns: int) -> WakuMessage:
    """A message posted to relay or lightpush (nwaku's RelayWakuMessage):
    ``payload`` (base64) and ``contentTopic`` required; ``version``,
    ``timestamp`` (ns; absent or 0: ``now_ns``), ``meta``, ``ephemeral``
    and ``proof`` optional."""
    if not isinstance(body, dict):
        raise bad_request("message: a JSON object is expected")
    payload = _base64_field(body, "payload", required=True)
    content_topic = body.get("contentTopic")
    if not isinstance(content_topic, str) or not content_topic:
        raise bad_request("message.contentTopic: a non-empty string is required")
    version = _int_field(body, "version", 0, 0, 0xFFFFFFFF)
    timestamp = _int_field(body, "timestamp", 0, -(1 << 63), (1 << 63) - 1)
    ephemeral = body.get("ephemeral", False)
    if not isinstance(ephemeral, bool):
        raise bad_request("message.ephemeral: a boolean is expected")
    return WakuMessage(
        payload=payload,
        content_topic=content_topic,
        version=version,
        timestamp=timestamp or now_ns,
        meta=_base64_field(body, "meta"),
        ephemeral=ephemeral,
        rate_limit_proof=_base64_field(body, "proof"),
    )


def _base64_field(body: dict[str, Any], name: str, required: bool = False) -> bytes:
    value = body.get(name)
    if value is None or value == "":
        if required:
            raise bad_request(f"message.{name}: required (base64)")
        return b""
    if not isinstance(value, str):
        raise bad_request(f"message.{name}: a base64 string is expected")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise bad_request(f"message.{name}: not base64") from None


def _int_field(body: dict[str, Any], name: str, default: int, low: int, high: int) -> int:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_request(f"message.{name}: an integer is expected")
    if not low <= value <= high:
        raise bad_request(f"message.{name}: outside {low}..{high}")
    return value


def parse_push(body: Any, now_ns: int) -> tuple[str | None, WakuMessage]:
    """``POST /lightpush/v3/message``: ``{pubsubTopic?, message}``."""
    if not isinstance(body, dict):
        raise bad_request("a JSON object {pubsubTopic, message} is expected")
    topic = body.get("pubsubTopic")
    if topic is not None and not isinstance(topic, str):
        raise bad_request("pubsubTopic: a string is expected")
    if "message" not in body:
        raise bad_request("message: required")
    return (topic or None), parse_message(body["message"], now_ns)


def parse_string_list(body: Any, what: str, limit: int = MAX_TOPICS_PER_REQUEST) -> list[str]:
    """A JSON array of strings (topics, multiaddrs), bounded and not empty."""
    if not isinstance(body, list) or not all(isinstance(item, str) and item for item in body):
        raise bad_request(f"a JSON array of {what} is expected")
    if not body:
        raise bad_request(f"no {what} given")
    if len(body) > limit:
        raise bad_request(f"at most {limit} {what} in one request, not {len(body)}")
    return list(dict.fromkeys(body))


# --- autosharding (51/WAKU2-RELAY-SHARDING) ---------------------------------------

_CONTENT_TOPIC = re.compile(r"/(?:(0)/)?([^/]+)/([^/]+)/([^/]+)/([^/]+)")


def autoshard(content_topic: str, cluster_id: int, shard_count: int) -> str:
    """The pubsub topic of ``content_topic`` in a cluster of
    ``shard_count`` shards (generation 0): the last 8 bytes of
    sha256(application || version), big-endian, modulo the count."""
    match = _CONTENT_TOPIC.fullmatch(content_topic)
    if match is None:
        raise bad_request(f"not a content topic of the form /app/version/name/encoding: {content_topic!r}")
    digest = hashlib.sha256((match.group(2) + match.group(3)).encode()).digest()
    shard = int.from_bytes(digest[24:], "big") % shard_count
    return topics.shard_pubsub_topic(cluster_id, shard)


# --- CORS (nwaku's --rest-allow-origin) ---------------------------------------------


def origin_patterns(allowed: Sequence[str]) -> list[re.Pattern[str]] | None:
    """The patterns of ``--rest-allow-origin`` values (each possibly
    comma-separated): ``*`` any text, ``?`` an optional character, no
    scheme meaning http or https. None: ``*`` alone (any origin)."""
    entries = [e.strip() for value in allowed for e in value.split(",") if e.strip()]
    if entries == ["*"]:
        return None
    patterns = []
    for entry in entries:
        scheme = ""
        if not re.match(r"https?://", entry, re.IGNORECASE):
            scheme = "https?://"
        body = "".join(".*" if c == "*" else ".?" if c == "?" else re.escape(c) for c in entry)
        patterns.append(re.compile(scheme + body, re.IGNORECASE))
    return patterns


def origin_allowed(patterns: list[re.Pattern[str]] | None, origin: str) -> bool:
    return patterns is None or any(p.fullmatch(origin) for p in patterns)


# --- log levels ------------------------------------------------------------------------


def parse_log_level(text: str) -> str:
    """One of :data:`LOG_LEVELS`, any case."""
    level = text.strip().upper()
    if not level:
        raise bad_request("Invalid log-level, it can't be empty")
    if level not in LOG_LEVELS:
        raise bad_request(f"Invalid log-level: {text[:40]}. Please specify one of {', '.join(LOG_LEVELS)}")
    return level
