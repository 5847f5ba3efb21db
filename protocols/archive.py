"""Community history archives: windows, archive and index encodings, the
magnet-link message. No I/O: the node reads and writes the files.

Two layouts (see protos/archive_status_go.proto and protos/archive_spec.proto):

``status-go`` (default, what deployed Status clients read): window bounds in
Unix seconds, 4-byte topics, status-go's own archive message record, zero
padding written after each archive in ``data`` up to a piece boundary and
recorded in the index (``size``, ``padding``).

``spec`` (the written specification): bounds in nanoseconds, content topics
as strings, 14/WAKU2 messages, padding inside the archive (field 4) so that
the encoding itself is a multiple of the piece length; the index records
``num_pieces``.

How a single message is written into an archive (both layouts, the extra
fields that let a member rebuild the exact table row, Status-readable
records) is in :mod:`wakustore.protocols.archive_records`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, NamedTuple, cast

import numpy as np

from wakustore.protocols import message_codec, topics, waku_v1
from wakustore.protocols.archive_records import (  # noqa: F401  (re-exported: the archive API)
    NS_PER_S,
    ArchivedMessage,
    DecodedRecord,
    Layout,
    Record,
    RecordDecoder,
    RecordEncoder,
    channel_key,
    community_channel_keys,
    decode_archived_message,
    encode_archived_message,
    field_bytes,
    field_varint,
    proto_fields,
    varint,
)
from wakustore.protocols.crypto import keccak256, public_key_from_bytes, recover_public_key, sign_recoverable
from wakustore.protocols.errors import ArchiveError, ProtocolError, WakuV1Error
from wakustore.protocols.message import WakuMessage
from wakustore.protos import (
    application_metadata_pb2,
    archive_magnetlink_pb2,
    archive_spec_pb2,
    archive_status_go_pb2,
    protocol_message_pb2,
)

# status-go protocol/communities/manager.go: `pieceLength = 100 * 1024`.
# The spec leaves this value unspecified; both layouts use status-go's.
PIECE_LENGTH = 100 * 1024

# status-go protocol/communities/manager.go `maxArchiveSizeInBytes`: a
# window's messages are cut into archives of at most this many bytes of
# payload + signature; a single message above it is dropped.
MAX_ARCHIVE_PAYLOAD = 30_000_000

# status-go protocol/messenger_communities.go `messageArchiveInterval`.
ARCHIVE_INTERVAL_S = 7 * 24 * 3600

# Sanity bounds on what a peer can make us allocate. An index entry is
# ~100-150 bytes and a control node adds one a week (more when a week
# exceeds 30 MB), so 16 MiB is centuries of history. One archive holds at
# most 30 MB of payload plus per-message framing (~60 bytes each); 256 MiB
# leaves room for millions of tiny messages.
MAX_INDEX_SIZE = 16 * 1024 * 1024
MAX_ARCHIVE_SIZE = 256 * 1024 * 1024

# The spec gives no value for its version fields; this one is written and
# any is read. status-go leaves them 0.
SPEC_VERSION = 1

DEFAULT_LAYOUT = Layout.STATUS_GO

_MAGNET_TYPE = application_metadata_pb2.ApplicationMetadataMessage.Type.COMMUNITY_MESSAGE_ARCHIVE_MAGNETLINK
_WIRE_LEN = 2

# The protobuf messages of the two layouts (see _index_class, _metadata_class).
_IndexPb = archive_spec_pb2.WakuMessageArchiveIndex | archive_status_go_pb2.WakuMessageArchiveIndex
_IndexMetadataPb = (
    archive_spec_pb2.WakuMessageArchiveIndexMetadata | archive_status_go_pb2.WakuMessageArchiveIndexMetadata
)
_MetadataPb = archive_spec_pb2.WakuMessageArchiveMetadata | archive_status_go_pb2.WakuMessageArchiveMetadata


# --- windows ------------------------------------------------------------------


@dataclass(frozen=True, slots=True, order=True)
class Window:
    """A time range, start inclusive, end exclusive, in Unix seconds."""

    start_s: int
    end_s: int

    @property
    def start_ns(self) -> int:
        return self.start_s * NS_PER_S

    @property
    def end_ns(self) -> int:
        return self.end_s * NS_PER_S


def plan_windows(start_s: int, now_s: int, interval_s: int = ARCHIVE_INTERVAL_S) -> list[Window]:
    """Windows of ``interval_s`` from ``start_s`` up to ``now_s``, the last
    one cut at ``now_s`` (status-go createHistoryArchiveTorrent). ``start_s``
    is the end of the last archive, or the oldest message's second when
    there is none; after downtime this yields one window per missed week."""
    if interval_s <= 0:
        raise ValueError("interval must be positive")
    windows = []
    start = start_s
    while start < now_s:
        end = min(start + interval_s, now_s)
        windows.append(Window(start, end))
        start = end
    return windows


class Chunker:
    """Cuts one window's encoded messages into archives of at most
    ``limit`` bytes of payload, as status-go does: a message that would
    overflow the current chunk starts the next; one larger than the limit
    is dropped (counted in ``dropped``).

    Records come one at a time (:meth:`add`, :meth:`finish`: chunks are
    lists of records) or a batch of framed entries at a time
    (:meth:`add_framed`, :meth:`finish_framed`), not both on one chunker.
    """

    def __init__(self, limit: int = MAX_ARCHIVE_PAYLOAD):
        self.limit = limit
        self.dropped = 0
        self._chunk: list[bytes | memoryview] = []
        self._size = 0
        self._count = 0

    def add(self, record: Record) -> list[bytes | memoryview] | None:
        """Add one message; returns a full chunk when this one did not fit."""
        return self.add_encoded(record.data, record.payload_size)

    def add_encoded(self, data: bytes, payload_size: int) -> list[bytes | memoryview] | None:
        """:meth:`add` for a record given as its two parts."""
        if payload_size > self.limit:
            self.dropped += 1
            return None
        full = None
        if self._chunk and self._size + payload_size > self.limit:
            full, self._chunk, self._size = self._chunk, [], 0
        self._chunk.append(data)
        self._size += payload_size
        return full

    def finish(self) -> list[bytes | memoryview] | None:
        """The last chunk, or None when nothing is left."""
        chunk, self._chunk, self._size = self._chunk, [], 0
        return chunk or None

    def add_framed(
        self, framed: bytes, ends: Sequence[int] | np.ndarray, sizes: Sequence[int] | np.ndarray
    ) -> list[tuple[list[bytes | memoryview], int]]:
        """Add a batch of messages framed as archive entries
        (:meth:`RecordEncoder.encode_framed`: the entries back to back,
        the end of each, its payload size); returns the chunks it filled,
        each as (views of ``framed`` to join, number of messages), for
        :meth:`ArchiveWriter.add_framed`. The same cuts as :meth:`add`
        a message at a time."""
        view = memoryview(framed)
        full = []
        limit = self.limit
        ends = np.asarray(ends, np.int64)
        sizes = np.asarray(sizes, np.int64)
        starts = np.concatenate(([0], ends[:-1]))
        # Runs of messages between those over the limit (dropped), each
        # cut where the running payload size passes the limit.
        dropped = np.flatnonzero(sizes > limit).tolist()
        for first, stop in zip([0] + [d + 1 for d in dropped], dropped + [len(sizes)]):
            at = first
            while at < stop:
                running = np.cumsum(sizes[at:stop])
                fit = int(np.searchsorted(running, limit - self._size, side="right"))
                if fit:
                    self._chunk.append(view[int(starts[at]) : int(ends[at + fit - 1])])
                    self._size += int(running[fit - 1])
                    self._count += fit
                    at += fit
                if at < stop:  # the next message does not fit: the chunk is full
                    full.append((self._chunk, self._count))
                    self._chunk, self._size, self._count = [], 0, 0
        self.dropped += len(dropped)
        return full

    def finish_framed(self) -> tuple[list[bytes | memoryview], int] | None:
        """The last chunk of :meth:`add_framed`, or None when nothing is left."""
        chunk, count = self._chunk, self._count
        self._chunk, self._size, self._count = [], 0, 0
        return (chunk, count) if count else None


# --- archives and the index ----------------------------------------------------


@dataclass(frozen=True, slots=True)
class IndexEntry:
    """One archive in ``data``. ``size`` is what it occupies there (padding
    included); ``padding`` the zero bytes after the encoding (status-go; 0
    in the spec layout, whose padding is inside). Times in ns."""

    archive_id: str
    start_ns: int
    end_ns: int
    content_topics: tuple[str, ...]
    offset: int
    size: int
    padding: int

    @property
    def encoded_size(self) -> int:
        return self.size - self.padding

    def pieces(self, piece_length: int = PIECE_LENGTH) -> range:
        """Piece indices it covers: [offset/L, (offset+size)/L)."""
        return range(self.offset // piece_length, (self.offset + self.size) // piece_length)


@dataclass(frozen=True, slots=True)
class Archive:
    """A checked archive: its window (ns), topics and messages."""

    start_ns: int
    end_ns: int
    content_topics: tuple[str, ...]
    messages: list[ArchivedMessage]


class ArchiveWriter:
    """Appends archives to a torrent's ``data`` and keeps its ``index``.

    ``index`` and ``data_size`` describe what exists (None and 0 for a new
    community); :meth:`add` returns the bytes to append to ``data``, so the
    new data is the old data plus new archives, byte for byte.
    """

    def __init__(
        self, layout: Layout, index: bytes | None = None, data_size: int = 0, piece_length: int = PIECE_LENGTH
    ):
        self.layout = Layout(layout)
        self.piece_length = piece_length
        self._metadata: dict[str, bytes] = {}
        self.entries: list[IndexEntry] = []
        if index:
            self.entries = parse_index(self.layout, index, data_size, piece_length)
            pb = _index_pb(self.layout, index)
            self._metadata = {key: value.SerializeToString() for key, value in pb.archives.items()}
        elif data_size:
            raise ArchiveError(f"data holds {data_size} bytes but there is no index")
        self.data_size = data_size
        self.new_entries: list[IndexEntry] = []

    def add(self, window: Window, content_topics: Sequence[str], messages: Sequence[bytes]) -> bytes:
        """Encode one archive of already encoded messages; returns archive
        plus padding, to be appended to ``data``."""
        return b"".join(self.add_framed(window, content_topics, [field_bytes(3, m) for m in messages]))

    def add_framed(
        self, window: Window, content_topics: Sequence[str], entries: Sequence[bytes | memoryview]
    ) -> list[bytes | memoryview]:
        """:meth:`add` for messages already framed as entries of the
        archive's ``messages`` (bytes-like pieces: :meth:`Chunker.add_framed`),
        returned as the pieces to append to ``data`` in order (an archive is
        ~30 MB: each copy of it costs its page faults)."""
        metadata = _metadata_pb(self.layout, window, content_topics)
        parts: list[bytes | memoryview] = [_archive_head(self.layout, metadata), *entries]
        raw = sum(map(len, parts))
        index_md: _IndexMetadataPb
        if self.layout is Layout.SPEC:
            parts.append(_spec_padding_field(raw, self.piece_length))
            padding, size = 0, raw + len(parts[-1])
            index_md = archive_spec_pb2.WakuMessageArchiveIndexMetadata(
                version=SPEC_VERSION,
                metadata=cast(archive_spec_pb2.WakuMessageArchiveMetadata, metadata),
                offset=self.data_size,
                num_pieces=size // self.piece_length,
            )
        else:
            padding = status_go_padding(raw, self.piece_length)
            size = raw + padding
            index_md = archive_status_go_pb2.WakuMessageArchiveIndexMetadata(
                metadata=cast(archive_status_go_pb2.WakuMessageArchiveMetadata, metadata),
                offset=self.data_size,
                size=size,
                padding=padding,
            )
        if size - padding > MAX_ARCHIVE_SIZE:
            raise ArchiveError(f"archive of {size - padding} bytes exceeds {MAX_ARCHIVE_SIZE}")
        encoded_md = index_md.SerializeToString()
        archive_id = archive_key(encoded_md)
        entry = IndexEntry(
            archive_id, window.start_ns, window.end_ns, tuple(content_topics), self.data_size, size, padding
        )
        self._metadata[archive_id] = encoded_md
        self.entries.append(entry)
        self.new_entries.append(entry)
        self.data_size += size
        parts.append(bytes(padding))
        return parts

    def index_bytes(self) -> bytes:
        """The encoded index, map keys in sorted order (deterministic)."""
        pb = _index_class(self.layout)()
        for key, encoded in self._metadata.items():
            pb.archives[key].ParseFromString(encoded)
        return pb.SerializeToString(deterministic=True)


def archive_key(encoded_index_metadata: bytes) -> str:
    """Index key: "0x" + lowercase hex keccak256 of the encoded metadata
    (status-go: crypto.Keccak256Hash(...).String())."""
    return "0x" + keccak256(encoded_index_metadata).hex()


def status_go_padding(raw_size: int, piece_length: int = PIECE_LENGTH) -> int:
    """Zero bytes status-go writes after an archive of ``raw_size`` bytes:
    up to one piece when it fits in one, else to the next piece boundary,
    a whole extra piece when it already ends on one."""
    if raw_size > piece_length:
        return piece_length - raw_size % piece_length
    return piece_length - raw_size


def parse_index(
    layout: Layout, raw: bytes, data_size: int | None = None, piece_length: int = PIECE_LENGTH
) -> list[IndexEntry]:
    """The archives of an index, by offset. Checks each key against its
    metadata, that archives tile ``data`` from 0 without gaps on piece
    boundaries, the padding rule and, if given, the size of ``data``."""
    layout = Layout(layout)
    pb = _index_pb(layout, raw)
    entries = []
    for key, value in pb.archives.items():
        if archive_key(value.SerializeToString()) != key:
            raise ArchiveError(f"index key {key} is not the hash of its metadata")
        if layout is Layout.SPEC:
            size, padding = cast(archive_spec_pb2.WakuMessageArchiveIndexMetadata, value).num_pieces * piece_length, 0
        else:
            status_go = cast(archive_status_go_pb2.WakuMessageArchiveIndexMetadata, value)
            size, padding = status_go.size, status_go.padding
            if padding > size or padding != status_go_padding(size - padding, piece_length):
                raise ArchiveError(f"archive {key}: size {size} and padding {padding} do not fit")
        start, end, content_topics = _window_of(layout, value.metadata)
        entries.append(IndexEntry(key, start, end, content_topics, value.offset, size, padding))
    entries.sort(key=lambda e: e.offset)
    position = 0
    for entry in entries:
        if entry.offset != position or entry.size <= 0 or entry.size % piece_length:
            raise ArchiveError(
                f"archive {entry.archive_id} at offset {entry.offset} size {entry.size} "
                f"does not follow the previous one (expected offset {position})"
            )
        if entry.encoded_size > MAX_ARCHIVE_SIZE:
            raise ArchiveError(f"archive {entry.archive_id} is larger than {MAX_ARCHIVE_SIZE} bytes")
        position += entry.size
    if data_size is not None and position != data_size:
        raise ArchiveError(f"index covers {position} bytes of data, data holds {data_size}")
    return entries


def read_archive(
    layout: Layout,
    entry: IndexEntry,
    data: bytes,
    default_pubsub_topic: str,
    allowed_topics: Iterable[str] | None = None,
    channel_keys: Mapping[str, bytes] | None = None,
) -> Archive:
    """Decode and check one archive: ``data`` is the ``entry.size`` bytes
    at ``entry.offset`` of the torrent's ``data``.

    Every message must carry a content topic listed in the archive (and in
    ``allowed_topics`` when given), an ordering time inside the window, and,
    where the archive says which message it is (status-go ``hash`` with the
    extra fields), the hash of the rebuilt message. Padding must be zeros
    and the archive's metadata must match the index. ``channel_keys``
    (content topic -> :func:`channel_key`) seal decrypted status-go
    records again. Raises ArchiveError.
    """
    decoder = RecordDecoder(layout, default_pubsub_topic, channel_keys)
    records = read_archive_records(entry, data, decoder, allowed_topics)
    messages = [ArchivedMessage(p, WakuMessage(pl, c, v, t, m, False, r), a) for p, c, pl, m, v, t, r, a, _ in records]
    return Archive(entry.start_ns, entry.end_ns, entry.content_topics, messages)


def read_archive_records(
    entry: IndexEntry, data: bytes, decoder: RecordDecoder, allowed_topics: Iterable[str] | None = None
) -> list[DecodedRecord]:
    """:func:`read_archive`'s checks, the messages as
    :data:`DecodedRecord` tuples (what a member's table takes, without a
    message object per row). Raises ArchiveError."""
    return list(iter_archive_records(entry, data, decoder, allowed_topics))


def iter_archive_records(
    entry: IndexEntry, data: bytes, decoder: RecordDecoder, allowed_topics: Iterable[str] | None = None
) -> Iterator[DecodedRecord]:
    """:func:`read_archive_records` a record at a time (the archive's
    framing and metadata are checked before the first); raises ArchiveError
    at the first bad record."""
    layout = decoder.layout
    if len(data) != entry.size:
        raise ArchiveError(f"archive {entry.archive_id}: got {len(data)} bytes, expected {entry.size}")
    # Views, not copies: an archive is up to ~35 MB, and a copy of its body
    # and of every record besides would triple what a decoder holds.
    if not isinstance(data, (bytes, bytearray)):
        data = bytes(data)
    view = memoryview(data)
    body = view[: entry.encoded_size]
    if data.count(b"\0", entry.encoded_size) != entry.size - entry.encoded_size:
        raise ArchiveError(f"archive {entry.archive_id}: padding is not zero bytes")
    parsed = decoder.parse_archive(body)
    metadata: _MetadataPb | None
    records: Iterable[archive_status_go_pb2.ArchivedMessage] | Iterable[bytes]
    decode: Callable[[archive_status_go_pb2.ArchivedMessage], DecodedRecord] | Callable[[bytes], DecodedRecord]
    if parsed is not None:  # status-go's layout, canonical: read whole
        metadata = parsed.metadata if parsed.HasField("metadata") else None
        records, decode = parsed.messages, decoder.decode_parsed
        del data, view, body  # the parse holds its own copy: the archive can go (a caller that passed it keeps it)
    else:
        metadata, raw_messages = _split_archive(layout, entry, body)
        records, decode = (bytes(raw) for raw in raw_messages), decoder.decode
    start, end, listed = _window_checked(layout, entry, metadata, allowed_topics)
    raw: Any  # a parsed record or a record's bytes: what ``decode`` takes
    for i, raw in enumerate(records):
        try:
            record = decode(raw)
        except (ProtocolError, ValueError, UnicodeDecodeError) as exc:
            raise ArchiveError(f"archive {entry.archive_id} message {i}: {exc}") from None
        topic = record[1]
        if topic not in listed:
            raise ArchiveError(f"archive {entry.archive_id} message {i}: topic {topic} is not the community's")
        ordering = record[5] or record[7]
        if not start <= ordering < end:
            raise ArchiveError(f"archive {entry.archive_id} message {i}: time {ordering} outside [{start}, {end})")
        yield record


class ArchiveColumns(NamedTuple):
    """An archive's records as the columns of the messages table, decoded
    by the compiled decoder (:func:`archive_columns`): numbers and values
    in buffers, topics as indexes into their distinct values."""

    count: int  # type: ignore[assignment]  # shadows tuple.count
    content_topics: list[str]  # distinct, indexed by ``topic_index``
    pubsub_topics: list[str]  # distinct, indexed by ``pubsub_index``
    topic_index: np.ndarray  # int32
    pubsub_index: np.ndarray  # int32
    payload: tuple[bytes, bytes]  # (int32 offsets, values) of a binary column
    meta: tuple[bytes, bytes]
    proof: tuple[bytes, bytes]
    version: np.ndarray  # int32
    sender_ns: np.ndarray  # int64, 0 when unset
    arrival_ns: np.ndarray  # int64
    hashes: bytes  # 32 bytes a record
    muids: tuple[bytes, bytes]
    digests: bytes  # 32 bytes a record


def archive_columns(
    entry: IndexEntry, data: bytes, decoder: RecordDecoder, allowed_topics: Iterable[str] | None = None
) -> ArchiveColumns | None:
    """:func:`iter_archive_records` of a status-go archive, all of it at
    once by the compiled decoder, as table columns: every record the same
    row the reference decoder makes. None whenever the archive is not in
    the plain form the compiled decoder reads or fails a check: the caller
    then reads it with :func:`iter_archive_records`, which gives the same
    rows or raises the reference's error. Nothing here raises."""
    if (
        decoder.layout is not Layout.STATUS_GO
        or len(data) != entry.size
        or data.count(b"\0", entry.encoded_size) != entry.size - entry.encoded_size
    ):
        return None
    decoded = decoder.decode_columns(memoryview(data)[: entry.encoded_size])
    if decoded is None:
        return None
    count, metadata_raw, raw_topics, raw_pubsub, *buffers = decoded
    metadata = message_codec.parse_protobuf(_metadata_class(Layout.STATUS_GO), metadata_raw)
    try:
        start, end, listed = _window_checked(Layout.STATUS_GO, entry, metadata, allowed_topics)
        content_topics = [topics.content_topic_from_bytes(t) for t in raw_topics]
        pubsub_topics = [t.decode("utf-8") for t in raw_pubsub] + [decoder.default_pubsub_topic]
    except (ProtocolError, UnicodeDecodeError):
        return None
    if not listed.issuperset(content_topics):
        return None
    (
        pubsub_index,
        topic_index,
        payload_offsets,
        payload,
        meta_offsets,
        meta,
        proof_offsets,
        proof,
        version,
        sender,
        arrival,
        hashes,
        muid_offsets,
        muids,
        digests,
    ) = buffers
    sender_ns, arrival_ns = np.frombuffer(sender, np.int64), np.frombuffer(arrival, np.int64)
    ordering = np.where(sender_ns != 0, sender_ns, arrival_ns)
    if count and not (int(ordering.min()) >= start and int(ordering.max()) < end):
        return None
    pubsub_index = np.frombuffer(pubsub_index, np.int32)
    # -1: a record of an archive status-go made, on the default pubsub topic (the last).
    pubsub_index = np.where(pubsub_index < 0, np.int32(len(raw_pubsub)), pubsub_index).astype(np.int32)
    return ArchiveColumns(
        count,
        content_topics,
        pubsub_topics,
        np.frombuffer(topic_index, np.int32),
        pubsub_index,
        (payload_offsets, payload),
        (meta_offsets, meta),
        (proof_offsets, proof),
        np.frombuffer(version, np.int32),
        sender_ns,
        arrival_ns,
        hashes,
        (muid_offsets, muids),
        digests,
    )


def _window_checked(
    layout: Layout, entry: IndexEntry, metadata: _MetadataPb | None, allowed_topics: Iterable[str] | None
) -> tuple[int, int, set[str]]:
    """(start ns, end ns, the content topics its messages may have) of an
    archive's metadata, which must name the window its index entry names."""
    if metadata is None:
        raise ArchiveError(f"archive {entry.archive_id} has no metadata")
    start, end, content_topics = _window_of(layout, metadata)
    if (start, end, content_topics) != (entry.start_ns, entry.end_ns, entry.content_topics):
        raise ArchiveError(f"archive {entry.archive_id}: metadata differs from the index")
    listed = set(content_topics)
    if allowed_topics is not None:
        listed &= set(allowed_topics)
    return start, end, listed


def _split_archive(layout: Layout, entry: IndexEntry, body: memoryview) -> tuple[_MetadataPb | None, list[memoryview]]:
    """The metadata (None when absent) and the records of an archive body,
    read a field at a time (any layout, any encoding)."""
    metadata_raw: memoryview | None
    raw_messages: list[memoryview]
    metadata_raw, raw_messages = None, []
    for number, wire, value in proto_fields(body):  # a length-delimited value is a view
        if number == 2 and wire == _WIRE_LEN:
            metadata_raw = cast(memoryview, value)
        elif number == 3 and wire == _WIRE_LEN:
            raw_messages.append(cast(memoryview, value))
        elif number == 4 and wire == _WIRE_LEN and layout is Layout.SPEC:
            if any(cast(memoryview, value)):
                raise ArchiveError(f"archive {entry.archive_id}: padding is not zero bytes")
    if metadata_raw is None:
        return None, raw_messages
    metadata = message_codec.parse_protobuf(_metadata_class(layout), bytes(metadata_raw))
    if metadata is None:
        raise ArchiveError(f"archive {entry.archive_id}: undecodable metadata")
    return metadata, raw_messages


# --- the magnet-link message -----------------------------------------------------


@dataclass(frozen=True, slots=True)
class MagnetLink:
    """A CommunityMessageArchiveMagnetlink; ``clock`` in ms (status-go's
    time source), ``signer`` the 33-byte compressed key that signed it."""

    clock: int
    magnet_uri: str
    signer: bytes


def encode_magnet_message(private_key: bytes, magnet_uri: str, clock: int) -> bytes:
    """ApplicationMetadataMessage(type 43) around the magnet link, signed as
    status-go's WrapMessageV1 does (protocol/v1/status_message.go):
    secp256k1 over keccak256(payload), 65 bytes R||S||V with V in {0, 1}."""
    payload = archive_magnetlink_pb2.CommunityMessageArchiveMagnetlink(
        clock=clock, magnet_uri=magnet_uri
    ).SerializeToString()
    return application_metadata_pb2.ApplicationMetadataMessage(
        signature=sign_recoverable(private_key, keccak256(payload)),
        payload=payload,
        type=_MAGNET_TYPE,
    ).SerializeToString()


def decode_magnet_message(raw: bytes) -> MagnetLink:
    """The magnet link and its signer; ArchiveError for anything else."""
    wrapper = message_codec.parse_protobuf(application_metadata_pb2.ApplicationMetadataMessage, raw)
    if wrapper is None:
        raise ArchiveError("not an ApplicationMetadataMessage")
    if wrapper.type != _MAGNET_TYPE:
        raise ArchiveError(f"application message type {wrapper.type}, expected {_MAGNET_TYPE}")
    try:
        signer = recover_public_key(wrapper.signature, keccak256(wrapper.payload))
    except ProtocolError as exc:
        raise ArchiveError(f"magnet link signature: {exc}") from None
    link = message_codec.parse_protobuf(archive_magnetlink_pb2.CommunityMessageArchiveMagnetlink, wrapper.payload)
    if link is None or not link.magnet_uri.startswith("magnet:?"):
        raise ArchiveError("payload is not a CommunityMessageArchiveMagnetlink")
    return MagnetLink(link.clock, link.magnet_uri, signer)


def verify_magnet_message(raw: bytes, community_public_key: bytes) -> MagnetLink:
    """:func:`decode_magnet_message`, refusing a link the control node
    (holder of the community key) did not sign."""
    link = decode_magnet_message(raw)
    try:
        expected = public_key_from_bytes(community_public_key).format(compressed=True)
    except ProtocolError as exc:
        raise ArchiveError(f"community key: {exc}") from None
    if link.signer != expected:
        raise ArchiveError(f"magnet link signed by 0x{link.signer.hex()}, not by the control node")
    return link


# --- the magnet link on the wire -------------------------------------------------------
#
# status-go sends the magnet link with MessageSender.SendPublic on the public
# chat "<community id>-magnetlinks" (messenger_communities.go
# dispatchMagnetlinkMessage: application layer signed by the community key,
# encryption layer not skipped):
#
#   ApplicationMetadataMessage            (WrapMessageV1, the signed link)
#   -> ProtocolMessage{installation_id, public_message}   (BuildPublicMessage)
#   -> Waku v1 payload: flags, size, padding, transport signature, AES-GCM
#      with the key status-go derives from the chat id as a password
#      (transport.SendPublic -> FiltersManager.LoadPublic ->
#      AddSymKeyFromPassword(chatID); WakuMessage version 1)
#
# A receiver that cannot decrypt the payload drops it (no filter matches), so
# the plain ApplicationMetadataMessage this node used to publish is invisible
# to Status clients; it is still accepted here so that old links verify.


def wrap_magnet_for_status(
    app_metadata_bytes: bytes, magnet_chat_id: str, signing_key: bytes, installation_id: str = ""
) -> bytes:
    """The WakuMessage payload status-go sends for an encoded magnet-link
    ApplicationMetadataMessage (:func:`encode_magnet_message`) on
    ``magnet_chat_id`` (:func:`topics.magnet_chat_id`): wrapped in a
    ProtocolMessage as its ``public_message``, then Waku v1 symmetrically
    encrypted with the key derived from the chat id and signed with
    ``signing_key`` (status-go requires a transport signature; it signs with
    the sending node's identity key). ``installation_id`` is the sender's
    device id, unused by receivers for public messages."""
    inner = protocol_message_pb2.ProtocolMessage(
        installation_id=installation_id,
        public_message=bytes(app_metadata_bytes),
    ).SerializeToString()
    try:
        return waku_v1.encrypt_symmetric(inner, _chat_key(magnet_chat_id), signing_key=signing_key)
    except WakuV1Error as exc:
        raise ArchiveError(f"cannot wrap the magnet link: {exc}") from None


def unwrap_magnet_payload(payload: bytes, magnet_chat_id: str) -> bytes:
    """The ApplicationMetadataMessage in a magnet-link WakuMessage payload,
    either status-go's wire form (:func:`wrap_magnet_for_status`) or the
    plain form (the ApplicationMetadataMessage itself).

    As status-go reads a wrapped payload: the transport layer must decrypt
    with the chat's key and carry a valid signature; then the ProtocolMessage's
    ``public_message``, or, when the decrypted bytes are no such
    ProtocolMessage, the decrypted bytes themselves (status-go falls back to
    them when the encryption layer fails). The result must be an
    ApplicationMetadataMessage of the magnet-link type; whose signature it
    carries is :func:`verify_magnet_message`'s business. Raises ArchiveError.
    """
    payload = bytes(payload)
    try:
        opened = waku_v1.decrypt_symmetric(payload, _chat_key(magnet_chat_id))
    except WakuV1Error as exc:
        if _is_magnet_metadata(payload):
            return payload  # the plain form
        raise ArchiveError(f"neither a plain nor a {magnet_chat_id} magnet-link payload ({exc})") from None
    if opened.signature_public_key is None:
        raise ArchiveError("wrapped magnet-link payload carries no transport signature")
    protocol_message = message_codec.parse_protobuf(protocol_message_pb2.ProtocolMessage, opened.payload)
    if protocol_message is not None and protocol_message.public_message:
        inner = protocol_message.public_message
    else:
        inner = opened.payload
    if not _is_magnet_metadata(inner):
        raise ArchiveError("wrapped payload holds no magnet-link ApplicationMetadataMessage")
    return inner


@lru_cache(maxsize=64)
def _chat_key(chat_id: str) -> bytes:
    # PBKDF2 with 65356 rounds: worth remembering for the few chats in use.
    return waku_v1.key_from_password(chat_id)


def _is_magnet_metadata(raw: bytes) -> bool:
    wrapper = message_codec.parse_protobuf(application_metadata_pb2.ApplicationMetadataMessage, raw)
    return wrapper is not None and wrapper.type == _MAGNET_TYPE


# --- private helpers ------------------------------------------------------------------


def _index_class(
    layout: Layout,
) -> type[archive_spec_pb2.WakuMessageArchiveIndex] | type[archive_status_go_pb2.WakuMessageArchiveIndex]:
    return (
        archive_spec_pb2.WakuMessageArchiveIndex
        if layout is Layout.SPEC
        else archive_status_go_pb2.WakuMessageArchiveIndex
    )


def _metadata_class(
    layout: Layout,
) -> type[archive_spec_pb2.WakuMessageArchiveMetadata] | type[archive_status_go_pb2.WakuMessageArchiveMetadata]:
    return (
        archive_spec_pb2.WakuMessageArchiveMetadata
        if layout is Layout.SPEC
        else archive_status_go_pb2.WakuMessageArchiveMetadata
    )


def _index_pb(layout: Layout, raw: bytes) -> _IndexPb:
    if len(raw) > MAX_INDEX_SIZE:
        raise ArchiveError(f"index of {len(raw)} bytes exceeds {MAX_INDEX_SIZE}")
    pb = message_codec.parse_protobuf(_index_class(layout), raw)
    if pb is None:
        raise ArchiveError(f"index does not decode as the {layout.value} layout")
    return pb


def _metadata_pb(layout: Layout, window: Window, content_topics: Sequence[str]) -> _MetadataPb:
    if layout is Layout.SPEC:
        return archive_spec_pb2.WakuMessageArchiveMetadata(
            version=SPEC_VERSION,
            to=window.end_ns,
            contentTopic=list(content_topics),
            **{"from": window.start_ns},
        )
    try:
        raw_topics = [topics.topic_bytes_from_content_topic(t) for t in content_topics]
    except ProtocolError as exc:
        raise ArchiveError(str(exc)) from None
    return archive_status_go_pb2.WakuMessageArchiveMetadata(
        to=window.end_s,
        contentTopic=raw_topics,
        **{"from": window.start_s},
    )


def _window_of(layout: Layout, metadata: _MetadataPb) -> tuple[int, int, tuple[str, ...]]:
    start, end = getattr(metadata, "from"), metadata.to
    if layout is Layout.SPEC:
        return start, end, tuple(cast(archive_spec_pb2.WakuMessageArchiveMetadata, metadata).contentTopic)
    status_go = cast(archive_status_go_pb2.WakuMessageArchiveMetadata, metadata)
    try:
        names = tuple(topics.content_topic_from_bytes(t) for t in status_go.contentTopic)
    except ProtocolError as exc:
        raise ArchiveError(str(exc)) from None
    return start * NS_PER_S, end * NS_PER_S, names


def _archive_head(layout: Layout, metadata: _MetadataPb) -> bytes:
    version = field_varint(1, SPEC_VERSION) if layout is Layout.SPEC else b""
    return version + field_bytes(2, metadata.SerializeToString())


def _spec_padding_field(raw_size: int, piece_length: int) -> bytes:
    """Field 4 of zero bytes making ``raw_size`` + the field a multiple of
    the piece length (the field's own tag and length count too); empty when
    the encoding already is one."""
    if raw_size % piece_length == 0:
        return b""
    target = (raw_size // piece_length + 1) * piece_length
    while True:
        for length_size in range(1, 6):
            n = target - raw_size - 1 - length_size
            if n >= 0 and len(varint(n)) == length_size:
                return b"\x22" + varint(n) + bytes(n)
        target += piece_length
