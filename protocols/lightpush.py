"""Lightpush: 19/WAKU2-LIGHTPUSH v2beta1 and WAKU-LIGHTPUSH v3 codecs.

A lightpush request hands a service node one WakuMessage to relay; a store
node also takes it as an incoming message. Server side: ``decode_request_v2``
/ ``decode_request_v3`` return a :class:`PushRequest`; ``encode_response_v2``
/ ``encode_response_v3`` answer. Client side: ``encode_request_v*`` and
``decode_response_v*``.

Behaviour follows nwaku (waku/waku_lightpush/, waku/waku_lightpush_legacy/):
an undecodable v3 request is answered 400 with request id "N/A"; a v2
refusal is ``is_success = false`` with the reason in ``info`` ("OK" on
success). Whether the message itself is acceptable (size limit, content
topic, timestamp, shard) is the caller's decision, from the returned size.
"""

from __future__ import annotations

from enum import IntEnum
from typing import NamedTuple

from wakustore.protocols.errors import LightpushError
from wakustore.protocols.message import WakuMessage
from wakustore.protocols.message_codec import (
    MAX_ENCODED_MESSAGE_SIZE,
    message_from_pb,
    nested_message_size,
    parse_protobuf,
    with_request_id,
    write_message_pb,
)
from wakustore.protocols.store_query import MAX_TOPIC_LENGTH
from wakustore.protos import lightpush_legacy_pb2, lightpush_v3_pb2

PROTOCOL_ID_V2 = "/vac/waku/lightpush/2.0.0-beta1"
PROTOCOL_ID_V3 = "/vac/waku/lightpush/3.0.0"

# nwaku answers with this id when it could not read the request's own.
UNKNOWN_REQUEST_ID = "N/A"

# nwaku's v2beta1 `info` on success.
OK_INFO = "OK"


class LightpushStatus(IntEnum):
    """v3 status codes (nwaku waku_lightpush/common.nim, js-waku LightPushStatusCodeV3)."""

    SUCCESS = 200
    BAD_REQUEST = 400
    PAYLOAD_TOO_LARGE = 413
    INVALID_MESSAGE = 420
    UNSUPPORTED_PUBSUB_TOPIC = 421
    TOO_MANY_REQUESTS = 429
    INTERNAL_SERVER_ERROR = 500
    SERVICE_NOT_AVAILABLE = 503
    OUT_OF_RLN_PROOF = 504
    NO_PEERS_TO_RELAY = 505


class PushRequest(NamedTuple):
    """A decoded push. ``encoded_size`` is the WakuMessage's size in bytes
    (its canonical encoding, never more than what was received)."""

    request_id: str
    pubsub_topic: str | None
    message: WakuMessage
    encoded_size: int


class PushResponseV2(NamedTuple):
    request_id: str
    is_success: bool
    info: str | None


class PushResponseV3(NamedTuple):
    request_id: str
    status_code: int
    status_desc: str | None
    relay_peer_count: int | None


def decode_request_v2(raw: bytes) -> PushRequest:
    """Decode a v2beta1 PushRPC request; the pubsub topic is required.

    Raises :class:`LightpushError` with 400 for undecodable bytes, no request,
    an empty or over-long pubsub topic or no message, and 413 for a message
    over the 1 MiB hard cap. ``request_id`` is ``""`` when unreadable.
    """
    rpc = parse_protobuf(lightpush_legacy_pb2.PushRPC, raw)
    if rpc is None:
        raise _bad_request("decode_rpc_failure: undecodable PushRPC", "")
    if not rpc.HasField("request"):
        raise _bad_request("empty_request_body_failure", rpc.request_id)
    request = rpc.request
    topic = request.pubsub_topic
    if not topic.strip():
        raise _bad_request("pubsub topic must not be empty", rpc.request_id)
    return _push_request(rpc.request_id, topic, request, has_message=request.HasField("message"))


def decode_request_v3(raw: bytes) -> PushRequest:
    """Decode a v3 LightpushRequest; an absent pubsub topic is returned as None
    (the service derives it by autosharding, or answers 420 without it).

    Raises :class:`LightpushError` with 400 for undecodable bytes, a pubsub
    topic that is present but blank or over-long, or no message, and 413 for
    a message over the 1 MiB hard cap. ``request_id`` is "N/A" when
    unreadable.
    """
    pb = parse_protobuf(lightpush_v3_pb2.LightpushRequest, raw)
    if pb is None:
        raise _bad_request("decode_rpc_failure: undecodable LightpushRequest", UNKNOWN_REQUEST_ID)
    topic = None
    if pb.HasField("pubsub_topic"):
        topic = pb.pubsub_topic
        if not topic.strip():
            raise _bad_request("topic must not be empty", pb.request_id)
    return _push_request(pb.request_id, topic, pb, has_message=pb.HasField("message"))


def encode_response_v2(request_id: str, is_success: bool, info: str | None = None) -> bytes:
    """Encode a v2beta1 PushRPC response; ``is_success`` and ``request_id``
    are always written (nwaku's decoder requires both)."""
    rpc = lightpush_legacy_pb2.PushRPC(request_id=request_id)
    rpc.response.is_success = is_success
    if info is not None:
        rpc.response.info = info
    return with_request_id(rpc.SerializeToString(), request_id)


def encode_response_v3(
    request_id: str,
    status_code: int,
    status_desc: str | None = None,
    relay_peer_count: int | None = None,
) -> bytes:
    """Encode a v3 LightpushResponse; ``request_id`` and ``status_code`` are
    always written (nwaku's decoder requires both); ``relay_peer_count``
    belongs to a success."""
    pb = lightpush_v3_pb2.LightpushResponse(request_id=request_id, status_code=int(status_code))
    if status_desc is not None:
        pb.status_desc = status_desc
    if relay_peer_count is not None:
        pb.relay_peer_count = relay_peer_count
    return with_request_id(pb.SerializeToString(), request_id)


def encode_error_v2(error: LightpushError) -> bytes:
    """The v2beta1 answer to a refused request."""
    return encode_response_v2(error.request_id, False, error.description)


def encode_error_v3(error: LightpushError) -> bytes:
    """The v3 answer to a refused request."""
    return encode_response_v3(error.request_id, error.status_code, error.description)


def encode_request_v2(request_id: str, pubsub_topic: str, message: WakuMessage) -> bytes:
    """Encode a v2beta1 PushRPC request (client side)."""
    rpc = lightpush_legacy_pb2.PushRPC(request_id=request_id)
    rpc.request.pubsub_topic = pubsub_topic
    write_message_pb(rpc.request.message, message)
    return with_request_id(rpc.SerializeToString(), request_id)


def encode_request_v3(request_id: str, pubsub_topic: str | None, message: WakuMessage) -> bytes:
    """Encode a v3 LightpushRequest (client side); None leaves the topic out."""
    pb = lightpush_v3_pb2.LightpushRequest(request_id=request_id)
    write_message_pb(pb.message, message)
    if pubsub_topic is not None:
        pb.pubsub_topic = pubsub_topic
    return with_request_id(pb.SerializeToString(), request_id)


def decode_response_v2(raw: bytes) -> PushResponseV2:
    """Decode a v2beta1 PushRPC response; raise :class:`LightpushError` with
    500 when the bytes are not one (an absent is_success reads as false)."""
    rpc = parse_protobuf(lightpush_legacy_pb2.PushRPC, raw)
    if rpc is None or not rpc.HasField("response"):
        raise LightpushError(LightpushStatus.INTERNAL_SERVER_ERROR, "malformed PushRPC response")
    response = rpc.response
    info = response.info if response.HasField("info") else None
    return PushResponseV2(rpc.request_id, response.is_success, info)


def decode_response_v3(raw: bytes) -> PushResponseV3:
    """Decode a v3 LightpushResponse; raise :class:`LightpushError` with 500
    when the bytes are not one."""
    pb = parse_protobuf(lightpush_v3_pb2.LightpushResponse, raw)
    if pb is None:
        raise LightpushError(LightpushStatus.INTERNAL_SERVER_ERROR, "malformed LightpushResponse")
    return PushResponseV3(
        request_id=pb.request_id,
        status_code=pb.status_code,
        status_desc=pb.status_desc if pb.HasField("status_desc") else None,
        relay_peer_count=pb.relay_peer_count if pb.HasField("relay_peer_count") else None,
    )


def _push_request(
    request_id: str,
    topic: str | None,
    holder: lightpush_legacy_pb2.PushRequest | lightpush_v3_pb2.LightpushRequest,
    *,
    has_message: bool,
) -> PushRequest:
    if topic is not None and len(topic) > MAX_TOPIC_LENGTH:
        raise _bad_request("pubsub topic too long", request_id)
    if not has_message:
        raise _bad_request("request has no message", request_id)
    size = nested_message_size(holder.message)
    if size > MAX_ENCODED_MESSAGE_SIZE:
        raise LightpushError(
            LightpushStatus.PAYLOAD_TOO_LARGE,
            f"message is {size} bytes, hard limit {MAX_ENCODED_MESSAGE_SIZE}",
            request_id,
        )
    return PushRequest(request_id, topic, message_from_pb(holder.message), size)


def _bad_request(text: str, request_id: str) -> LightpushError:
    return LightpushError(LightpushStatus.BAD_REQUEST, text, request_id)
