"""66/WAKU2-METADATA (`/vac/waku/metadata/1.0.0`): cluster id and shards.

Both peers send the same shape: the request carries the dialer's cluster id
and shards, the response the listener's. Peers on a different cluster are
dropped by nwaku and js-waku, so every connection runs this exchange;
:func:`refusal` says why a peer's metadata makes it one to drop.

Shards are written twice, as nwaku does (waku/waku_metadata/rpc.nim): field
2 unpacked (what js-waku reads) and field 3 packed (what nwaku and go-waku
read first). A reader takes field 3 when it holds any shard, else field 2;
either field may arrive packed or unpacked.
"""

from __future__ import annotations

from dataclasses import dataclass

from wakustore.protocols.errors import MetadataError
from wakustore.protocols.message_codec import parse_protobuf
from wakustore.protos import waku_metadata_pb2

PROTOCOL_ID = "/vac/waku/metadata/1.0.0"

_UINT32_MAX = 2**32 - 1


@dataclass(frozen=True, slots=True)
class Metadata:
    """A peer's cluster id (None when it sent none) and shard indices, as sent."""

    cluster_id: int | None
    shards: tuple[int, ...] = ()


def refusal(ours: Metadata, theirs: Metadata, *, relay_peer: bool) -> str | None:
    """Why a peer that sent ``theirs`` is to be dropped, or None to keep it.

    nwaku's ``onPeerMetadata`` (waku/node/peer_manager/peer_manager.nim)
    drops a peer that reports no cluster id or another one, and a relay
    peer that shares none of our shards.
    """
    if theirs.cluster_id is None:
        return "no cluster id reported"
    if theirs.cluster_id != ours.cluster_id:
        return f"different cluster id reported: {ours.cluster_id} vs {theirs.cluster_id}"
    if relay_peer and not set(theirs.shards) & set(ours.shards):
        return f"no shards in common: ours {sorted(ours.shards)}, theirs {sorted(theirs.shards)}"
    return None


def encode_request(metadata: Metadata) -> bytes:
    """Encode a WakuMetadataRequest; raise :class:`MetadataError` for a value
    that is not a uint32."""
    return _encode(waku_metadata_pb2.WakuMetadataRequest, metadata)


def encode_response(metadata: Metadata) -> bytes:
    """Encode a WakuMetadataResponse; raise :class:`MetadataError` for a value
    that is not a uint32."""
    return _encode(waku_metadata_pb2.WakuMetadataResponse, metadata)


def decode_request(raw: bytes) -> Metadata:
    """Decode a WakuMetadataRequest; raise :class:`MetadataError` if undecodable."""
    return _decode(waku_metadata_pb2.WakuMetadataRequest, raw)


def decode_response(raw: bytes) -> Metadata:
    """Decode a WakuMetadataResponse; raise :class:`MetadataError` if undecodable."""
    return _decode(waku_metadata_pb2.WakuMetadataResponse, raw)


def _encode(
    message_type: type[waku_metadata_pb2.WakuMetadataRequest] | type[waku_metadata_pb2.WakuMetadataResponse],
    metadata: Metadata,
) -> bytes:
    values = list(metadata.shards)
    if metadata.cluster_id is not None:
        values.append(metadata.cluster_id)
    if any(not 0 <= v <= _UINT32_MAX for v in values):
        raise MetadataError("cluster id and shards must be uint32")
    pb = message_type(shards=metadata.shards, packed_shards=metadata.shards)
    if metadata.cluster_id is not None:
        pb.cluster_id = metadata.cluster_id
    return pb.SerializeToString()


def _decode(
    message_type: type[waku_metadata_pb2.WakuMetadataRequest] | type[waku_metadata_pb2.WakuMetadataResponse],
    raw: bytes,
) -> Metadata:
    pb = parse_protobuf(message_type, raw)
    if pb is None:
        raise MetadataError(f"undecodable {message_type.__name__}")
    shards = tuple(pb.packed_shards) or tuple(pb.shards)
    cluster_id = pb.cluster_id if pb.HasField("cluster_id") else None
    return Metadata(cluster_id=cluster_id, shards=shards)
