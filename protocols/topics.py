"""Content and pubsub topics: 56/STATUS-COMMUNITIES and 57/STATUS-Simple-Scaling.

Community topics are computed the way status-go does: the community id is
"0x" + lowercase hex of the 33-byte compressed public key, and a chat's
4-byte Waku topic is keccak256(utf8(community id + chat id))[:4], rendered
as the content topic ``/waku/1/0x<8 hex>/rfc26``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum

from wakustore.protocols.crypto import keccak256, public_key_from_bytes
from wakustore.protocols.errors import ProtocolError, TopicError

# status-go: a Waku v1 topic is 4 bytes (TopicLength).
TOPIC_SIZE = 4

# 56/STATUS-COMMUNITIES: the magnet-link channel is "<community id>-magnetlinks".
MAGNET_CHAT_SUFFIX = "-magnetlinks"

# 51/WAKU2-RELAY-SHARDING: a cluster has 1024 shards; cluster ids are 16-bit.
SHARDS_PER_CLUSTER = 1024
MAX_CLUSTER_ID = 0xFFFF

# 52/WAKU2-RELAY-STATIC-SHARD-ALLOC: the Status shard cluster.
STATUS_CLUSTER_ID = 16

# 57/STATUS-Simple-Scaling, 1:1 chat partitions.
CONTENT_PARTITIONS = 8192
ONE_TO_ONE_SHARD_BASE = 768
ONE_TO_ONE_SHARDS = 128

_SHARD_TOPIC = re.compile(r"/waku/2/rs/(0|[1-9][0-9]{0,4})/(0|[1-9][0-9]{0,3})")
_V1_CONTENT_TOPIC = re.compile(r"/waku/1/0x([0-9a-f]{8})/rfc26")


def community_id(public_key: bytes) -> str:
    """'0x' + hex of the compressed key; accepts a 33- or 65-byte key."""
    try:
        key = public_key_from_bytes(public_key)
    except ProtocolError as exc:
        raise TopicError(f"community key: {exc}") from None
    return "0x" + key.format(compressed=True).hex()


def topic_bytes(name: str) -> bytes:
    """status-go's ToTopic: the first 4 bytes of keccak256(utf8(name))."""
    return keccak256(name.encode())[:TOPIC_SIZE]


def content_topic_from_bytes(topic: bytes) -> str:
    """The Waku v2 content topic status-go uses for a 4-byte Waku v1 topic."""
    if len(topic) != TOPIC_SIZE:
        raise TopicError(f"topic must be {TOPIC_SIZE} bytes, got {len(topic)}")
    return f"/waku/1/0x{topic.hex()}/rfc26"


def topic_bytes_from_content_topic(content_topic: str) -> bytes:
    """Inverse of :func:`content_topic_from_bytes`."""
    match = _V1_CONTENT_TOPIC.fullmatch(content_topic)
    if match is None:
        raise TopicError(f"not a /waku/1/0x<8 hex>/rfc26 content topic: {content_topic!r}")
    return bytes.fromhex(match.group(1))


def content_topic_for_name(name: str) -> str:
    return content_topic_from_bytes(topic_bytes(name))


def community_content_topic(public_key: bytes) -> str:
    """The community's own topic (descriptions, requests): chat id empty."""
    return content_topic_for_name(community_id(public_key))


def channel_content_topic(public_key: bytes, chat_id: str) -> str:
    """A community channel's topic; ``chat_id`` is the channel's id inside the community."""
    return content_topic_for_name(community_id(public_key) + chat_id)


def magnet_chat_id(public_key: bytes) -> str:
    return community_id(public_key) + MAGNET_CHAT_SUFFIX


def magnet_content_topic(public_key: bytes) -> str:
    """The topic on which the control node publishes archive magnet links."""
    return content_topic_for_name(magnet_chat_id(public_key))


# --- shards ---------------------------------------------------------------


@dataclass(frozen=True, slots=True, order=True)
class Shard:
    cluster_id: int
    index: int

    def __post_init__(self) -> None:
        if not 0 <= self.cluster_id <= MAX_CLUSTER_ID:
            raise TopicError(f"cluster id {self.cluster_id} outside 0..{MAX_CLUSTER_ID}")
        if not 0 <= self.index < SHARDS_PER_CLUSTER:
            raise TopicError(f"shard index {self.index} outside 0..{SHARDS_PER_CLUSTER - 1}")

    @property
    def pubsub_topic(self) -> str:
        return f"/waku/2/rs/{self.cluster_id}/{self.index}"


def shard_pubsub_topic(cluster_id: int, index: int) -> str:
    return Shard(cluster_id, index).pubsub_topic


def parse_shard_topic(pubsub_topic: str) -> Shard:
    """Parse ``/waku/2/rs/<cluster>/<shard>`` (no leading zeros, in range)."""
    match = _SHARD_TOPIC.fullmatch(pubsub_topic)
    if match is None:
        raise TopicError(f"not a static shard pubsub topic: {pubsub_topic!r}")
    return Shard(int(match.group(1)), int(match.group(2)))


class ShardUsage(str, Enum):
    """57's allocation of the shards of the Status cluster."""

    RESERVED = "reserved"
    LARGE_COMMUNITIES = "specific (large) communities"
    COMMUNITIES = "communities"
    ONE_TO_ONE = "1:1 chat"
    MEDIA_AND_CONTROL = "media and control msgs"


_ALLOCATION = (
    (0, 15, ShardUsage.RESERVED),
    (16, 127, ShardUsage.LARGE_COMMUNITIES),
    (128, 767, ShardUsage.COMMUNITIES),
    (768, 895, ShardUsage.ONE_TO_ONE),
    (896, 1023, ShardUsage.MEDIA_AND_CONTROL),
)


def shard_usage(index: int) -> ShardUsage:
    for low, high, usage in _ALLOCATION:
        if low <= index <= high:
            return usage
    raise TopicError(f"shard index {index} outside 0..{SHARDS_PER_CLUSTER - 1}")


@dataclass(frozen=True, slots=True)
class OneToOnePartition:
    """Where 57 puts a 1:1 chat with the holder of a public key."""

    partition: int
    content_topic: str
    shard_index: int


def one_to_one_partition(public_key: bytes) -> OneToOnePartition:
    """57: partition = X mod 8192, topic "contact-discovery-<n>", shard 768 + X mod 128.

    "publicKey" is the X coordinate of the point, as status-go (and the
    status-web client) computes the partitioned topic.
    """
    try:
        key = public_key_from_bytes(public_key)
    except ProtocolError as exc:
        raise TopicError(f"public key: {exc}") from None
    x = int.from_bytes(key.format(compressed=False)[1:33], "big")
    partition = x % CONTENT_PARTITIONS
    return OneToOnePartition(
        partition=partition,
        content_topic=content_topic_for_name(f"contact-discovery-{partition}"),
        shard_index=ONE_TO_ONE_SHARD_BASE + x % ONE_TO_ONE_SHARDS,
    )


__all__ = [name for name in globals() if not name.startswith("_")]
