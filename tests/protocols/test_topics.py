import coincurve
import pytest
from Crypto.Hash import keccak
from hypothesis import given
from hypothesis import strategies as st

from wakustore.protocols import topics
from wakustore.protocols.errors import TopicError

PRIVATE = bytes.fromhex("5526a8990317c9b7b58d07843d270f9cd1d9aaee129294c1c478abf7261dd9e6")
UNCOMPRESSED = coincurve.PrivateKey(PRIVATE).public_key.format(compressed=False)
COMPRESSED = coincurve.PrivateKey(PRIVATE).public_key.format(compressed=True)
COMMUNITY_ID = "0x" + COMPRESSED.hex()


def _k4(text: str) -> str:
    return keccak.new(digest_bits=256, data=text.encode()).hexdigest()[:8]


def test_community_id_is_0x_and_compressed_key_in_lowercase_hex():
    assert topics.community_id(UNCOMPRESSED) == COMMUNITY_ID
    assert topics.community_id(COMPRESSED) == COMMUNITY_ID
    assert len(COMMUNITY_ID) == 2 + 66


def test_community_topic_hashes_the_community_id_string():
    assert topics.community_content_topic(UNCOMPRESSED) == f"/waku/1/0x{_k4(COMMUNITY_ID)}/rfc26"


def test_channel_topic_hashes_community_id_plus_chat_id():
    chat = "3b7ec2b0-4b4d-4a1a-9a9d-1c1b2e2f6a10"
    assert topics.channel_content_topic(COMPRESSED, chat) == f"/waku/1/0x{_k4(COMMUNITY_ID + chat)}/rfc26"


def test_magnet_topic_uses_magnetlinks_suffix():
    expected = f"/waku/1/0x{_k4(COMMUNITY_ID + '-magnetlinks')}/rfc26"
    assert topics.magnet_content_topic(COMPRESSED) == expected
    # Pinned so that a change of encoding can never pass silently.
    assert expected == "/waku/1/0x96bf580a/rfc26"


@pytest.mark.parametrize("bad", [b"", b"\x02" * 32, b"\x05" + b"\x01" * 32, b"\x04" + b"\x00" * 64])
def test_bad_community_keys_raise_topic_error(bad):
    with pytest.raises(TopicError):
        topics.community_id(bad)


@given(st.binary(min_size=4, max_size=4))
def test_content_topic_round_trips_topic_bytes(raw):
    assert topics.topic_bytes_from_content_topic(topics.content_topic_from_bytes(raw)) == raw


@pytest.mark.parametrize("bad", ["/waku/1/0x1234/rfc26", "/waku/1/0xABCDEF01/rfc26", "/waku/2/x/proto"])
def test_malformed_v1_content_topics_are_rejected(bad):
    with pytest.raises(TopicError):
        topics.topic_bytes_from_content_topic(bad)


def test_shard_pubsub_topic_format():
    assert topics.shard_pubsub_topic(16, 18) == "/waku/2/rs/16/18"


@given(st.integers(0, 0xFFFF), st.integers(0, 1023))
def test_shard_topic_round_trips(cluster, index):
    assert topics.parse_shard_topic(topics.shard_pubsub_topic(cluster, index)) == topics.Shard(cluster, index)


@pytest.mark.parametrize(
    "bad", ["/waku/2/rs/16/1024", "/waku/2/rs/16/018", "/waku/2/rs/65536/1", "/waku/2/rs/16", "/waku/2/rs/a/1"]
)
def test_malformed_shard_topics_are_rejected(bad):
    with pytest.raises(TopicError):
        topics.parse_shard_topic(bad)


@pytest.mark.parametrize(
    ("index", "usage"),
    [
        (0, topics.ShardUsage.RESERVED),
        (15, topics.ShardUsage.RESERVED),
        (16, topics.ShardUsage.LARGE_COMMUNITIES),
        (127, topics.ShardUsage.LARGE_COMMUNITIES),
        (128, topics.ShardUsage.COMMUNITIES),
        (767, topics.ShardUsage.COMMUNITIES),
        (768, topics.ShardUsage.ONE_TO_ONE),
        (895, topics.ShardUsage.ONE_TO_ONE),
        (896, topics.ShardUsage.MEDIA_AND_CONTROL),
        (1023, topics.ShardUsage.MEDIA_AND_CONTROL),
    ],
)
def test_shard_allocation_ranges(index, usage):
    assert topics.shard_usage(index) is usage


def test_one_to_one_partition_uses_x_coordinate():
    x = int.from_bytes(UNCOMPRESSED[1:33], "big")
    part = topics.one_to_one_partition(COMPRESSED)
    assert part.partition == x % 8192
    assert part.shard_index == 768 + x % 128
    assert 768 <= part.shard_index <= 895
    assert part.content_topic == f"/waku/1/0x{_k4(f'contact-discovery-{x % 8192}')}/rfc26"
