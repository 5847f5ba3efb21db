import pytest
from hypothesis import given
from hypothesis import strategies as st

from wakustore.protocols.errors import FrameTooLarge, FramingError
from wakustore.protocols.framing import (
    LIGHTPUSH_MAX_REQUEST_SIZE,
    METADATA_MAX_SIZE,
    STORE_MAX_REQUEST_SIZE,
    STORE_MAX_RESPONSE_SIZE,
    FrameReader,
    encode_frame,
    encode_uvarint,
)


@pytest.mark.parametrize(
    ("value", "encoded"),
    [(0, "00"), (1, "01"), (127, "7f"), (128, "8001"), (300, "ac02"), (16384, "808001")],
)
def test_uvarint_matches_multiformats_vectors(value, encoded):
    assert encode_uvarint(value).hex() == encoded


def test_named_limits_follow_their_sources():
    assert STORE_MAX_RESPONSE_SIZE == 100 * 150 * 1024 + 64 * 1024 == 15_425_536
    assert STORE_MAX_REQUEST_SIZE == 64 * 1024
    assert LIGHTPUSH_MAX_REQUEST_SIZE == 1024 * 1024 + 64 * 1024
    assert METADATA_MAX_SIZE == 1024


@given(st.lists(st.binary(max_size=300), max_size=5), st.data())
def test_frames_survive_any_chunking(bodies, data):
    stream = b"".join(encode_frame(b) for b in bodies)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=8)))
    reader = FrameReader(max_size=300)
    frames = []
    start = 0
    for cut in [*cuts, len(stream)]:
        frames += reader.feed(stream[start:cut])
        start = cut
    reader.eof()
    assert frames == bodies


def test_frame_at_the_limit_is_accepted():
    reader = FrameReader(max_size=5)
    assert reader.feed(encode_frame(b"12345")) == [b"12345"]


def test_oversized_prefix_is_refused_before_any_body_byte():
    reader = FrameReader(max_size=100)
    with pytest.raises(FrameTooLarge, match="exceeds"):
        reader.feed(encode_uvarint(101))


def test_incomplete_prefix_already_over_the_limit_is_refused():
    # 0xff: the low 7 bits alone are 127 > 100, whatever follows.
    with pytest.raises(FrameTooLarge, match="exceeds"):
        FrameReader(max_size=100).feed(b"\xff")


def test_huge_prefix_is_refused_without_buffering():
    reader = FrameReader(max_size=STORE_MAX_RESPONSE_SIZE)
    with pytest.raises(FramingError):
        reader.feed(encode_uvarint(2**62) + b"\0" * 1000)


def test_prefix_longer_than_ten_bytes_is_refused():
    reader = FrameReader(max_size=2**80)
    with pytest.raises(FramingError, match="longer than 10"):
        reader.feed(b"\x80" * 10)


@pytest.mark.parametrize("prefix", [b"\x80\x00", b"\x85\x00", b"\x81\x80\x00"])
def test_non_minimal_prefix_is_refused(prefix):
    with pytest.raises(FramingError, match="minimal") as raised:
        FrameReader(max_size=1000).feed(prefix)
    assert not isinstance(raised.value, FrameTooLarge)


def test_frames_split_across_and_packed_into_chunks_come_out_whole():
    bodies = [b"a" * 300, b"", b"bc", b"d" * 70_000]
    stream = b"".join(encode_frame(b) for b in bodies)
    for chunk_size in (1, 7, 4096, len(stream)):
        reader = FrameReader(max_size=100_000)
        frames = []
        for start in range(0, len(stream), chunk_size):
            frames += reader.feed(stream[start : start + chunk_size])
        reader.eof()
        assert frames == bodies
        assert all(type(f) is bytes for f in frames)


def test_reader_is_unusable_after_an_error():
    reader = FrameReader(max_size=1)
    with pytest.raises(FramingError):
        reader.feed(b"\x05")
    with pytest.raises(FramingError):
        reader.feed(b"\x00")


def test_eof_inside_a_body_raises():
    reader = FrameReader(max_size=10)
    assert reader.feed(b"\x05abc") == []
    assert reader.pending
    with pytest.raises(FramingError, match="3 of 5"):
        reader.eof()


def test_eof_inside_a_prefix_raises():
    reader = FrameReader(max_size=1000)
    reader.feed(b"\x81")
    with pytest.raises(FramingError, match="prefix"):
        reader.eof()


def test_eof_after_complete_frames_is_clean():
    reader = FrameReader(max_size=10)
    assert reader.feed(b"\x00\x01a") == [b"", b"a"]
    assert not reader.pending
    reader.eof()


@given(st.binary(max_size=200), st.integers(0, 64))
def test_garbage_raises_only_framing_error(raw, max_size):
    reader = FrameReader(max_size=max_size)
    try:
        for frame in reader.feed(raw):
            assert len(frame) <= max_size
        reader.eof()
    except FramingError:
        pass
