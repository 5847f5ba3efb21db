"""Fuzz targets: every decoder that bytes from a peer reach.

A target is one decoder family. Its first input byte picks one of the
family's entry points (modulo their number); the rest is that entry
point's input. An entry point may raise only the family's own error type
(:mod:`wakustore.protocols.errors`); anything else escaping is a finding,
and so is a hang or a memory blow-up (the driver bounds both).

Where a decoder sits behind authentication (RLPx frames behind their MACs,
handshake bodies behind ECIES, Waku v1 payloads behind AES-GCM), one entry
point feeds the raw bytes and another encrypts the fuzzed plaintext with
the keys the decoder expects, so the fuzzer reaches the parsing behind the
cryptography.

Used by ``run_fuzz.py`` (coverage-guided, atheris, ``make fuzz``) and by
``test_fuzz_targets.py`` (a small budget inside ``make test``).
"""

from __future__ import annotations

import base64
import hashlib
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import coincurve
from Crypto.Cipher import AES
from Crypto.Hash import keccak

from wakustore.protocols import (
    archive,
    discv5,
    ecies,
    enr,
    lightpush,
    metadata,
    peer_exchange,
    rlpx,
    store_v2,
    store_v3,
)
from wakustore.protocols import mailserver as wms
from wakustore.protocols.dos_protection import ProtectedTopic
from wakustore.protocols.dos_protection import validate as dos_validate
from wakustore.protocols.errors import (
    ArchiveError,
    FramingError,
    LightpushError,
    MessageError,
    MetadataError,
    PeerExchangeError,
    RLPxError,
    StoreError,
    TopicError,
    WakuV1Error,
)
from wakustore.protocols.framing import FrameReader
from wakustore.protocols.message import WakuMessage, check_storable, message_hash
from wakustore.protocols.message_codec import decode_message, encode_message
from wakustore.protocols.store_query import HistoryQuery, Page, StoredMessage
from wakustore.protocols.topics import parse_shard_topic
from wakustore.protocols.waku_v1 import (
    AES_NONCE_SIZE,
    GCM_TAG_SIZE,
    Envelope,
    decode_envelope_list,
    decrypt_symmetric,
    encrypt_symmetric,
    key_from_password,
)


@dataclass(frozen=True)
class EntryPoint:
    name: str
    run: Callable[[bytes], object]
    allowed: tuple[type[BaseException], ...]


@dataclass(frozen=True)
class Target:
    name: str
    entries: Sequence[EntryPoint]
    seeds: Callable[[], list[bytes]]
    """Valid (or nearly valid) inputs, selector byte included."""

    def __call__(self, data: bytes) -> None:
        """Run one input; returns when the input is accepted or refused with
        the entry point's own error, raises anything else."""
        if not data:
            return
        entry = self.entries[data[0] % len(self.entries)]
        try:
            entry.run(data[1:])
        except entry.allowed:
            pass


def _seeded(entries: Sequence[EntryPoint], name: str, inputs: Sequence[bytes]) -> list[bytes]:
    index = [e.name for e in entries].index(name)
    return [bytes([index]) + raw for raw in inputs]


# --- fixed keys (deterministic runs) ------------------------------------------------

NODE_KEY = hashlib.sha256(b"fuzz node key").digest()
PEER_KEY = hashlib.sha256(b"fuzz peer key").digest()
SIGNING_KEY = hashlib.sha256(b"fuzz signing key").digest()
NODE_ID = ecies.public_key_of(NODE_KEY)
PEER_ID = ecies.public_key_of(PEER_KEY)
SYMMETRIC_KEY = key_from_password("status-offline-inbox")
NOW_S = 1_700_000_000
NOW_NS = NOW_S * 1_000_000_000
PUBSUB_TOPIC = "/waku/2/rs/16/32"
CONTENT_TOPIC = "/waku/1/0x01020304/rfc26"


def _message(i: int = 0) -> WakuMessage:
    return WakuMessage(
        payload=b"payload-%d" % i, content_topic=CONTENT_TOPIC, version=1, timestamp=NOW_NS + i, meta=b"m" * (i % 3)
    )


# --- libp2p protocols ------------------------------------------------------------------


def _store_v3_entries():
    return [
        EntryPoint("request", store_v3.decode_request, (StoreError,)),
        EntryPoint("response", store_v3.decode_response, (StoreError,)),
    ]


def _store_v3_seeds():
    entries = _store_v3_entries()
    requests = [
        store_v3.encode_request(
            "r1",
            HistoryQuery(
                pubsub_topic=PUBSUB_TOPIC,
                content_topics=(CONTENT_TOPIC,),
                time_start=1,
                time_end=NOW_NS,
                limit=50,
                forward=True,
            ),
        ),
        store_v3.encode_request("r2", HistoryQuery(message_hashes=(bytes(32), bytes(range(32))))),
        store_v3.encode_request(
            "r3", HistoryQuery(pubsub_topic=PUBSUB_TOPIC, content_topics=(CONTENT_TOPIC,), cursor=bytes(range(32)))
        ),
    ]
    page = Page([StoredMessage(bytes(range(32)), PUBSUB_TOPIC, _message(1), NOW_NS)], None)
    responses = [store_v3.encode_response("r1", page), store_v3.encode_response("r2", None, 400, "BAD_REQUEST")]
    return _seeded(entries, "request", requests) + _seeded(entries, "response", responses)


def _store_v2_entries():
    return [
        EntryPoint("request", store_v2.decode_request, (StoreError,)),
        EntryPoint("response", store_v2.decode_response, (StoreError,)),
    ]


def _store_v2_seeds():
    entries = _store_v2_entries()
    requests = [
        store_v2.encode_request(
            "q1",
            pubsub_topic=PUBSUB_TOPIC,
            content_topics=[CONTENT_TOPIC],
            start_time=1,
            end_time=NOW_NS,
            page_size=20,
            forward=True,
        ),
        store_v2.encode_request(
            "q2",
            content_topics=[CONTENT_TOPIC] * 3,
            cursor=store_v2.Cursor(
                pubsub_topic=PUBSUB_TOPIC, sender_time=NOW_NS, receiver_time=NOW_NS, digest=bytes(range(32))
            ),
        ),
    ]
    page = Page([StoredMessage(bytes(range(32)), PUBSUB_TOPIC, _message(2), NOW_NS)], None)
    responses = [store_v2.encode_response("q1", page, forward=True)]
    return _seeded(entries, "request", requests) + _seeded(entries, "response", responses)


def _lightpush_entries(version: int):
    if version == 2:
        return [
            EntryPoint("request", lightpush.decode_request_v2, (LightpushError,)),
            EntryPoint("response", lightpush.decode_response_v2, (LightpushError,)),
        ]
    return [
        EntryPoint("request", lightpush.decode_request_v3, (LightpushError,)),
        EntryPoint("response", lightpush.decode_response_v3, (LightpushError,)),
    ]


def _lightpush_seeds(version: int):
    entries = _lightpush_entries(version)
    if version == 2:
        requests = [lightpush.encode_request_v2("p1", PUBSUB_TOPIC, _message(3))]
        responses = [lightpush.encode_response_v2("p1", False, "no peers")]
    else:
        requests = [
            lightpush.encode_request_v3("p1", PUBSUB_TOPIC, _message(3)),
            lightpush.encode_request_v3("p2", None, _message(4)),
        ]
        responses = [lightpush.encode_response_v3("p1", 200, None, 3)]
    return _seeded(entries, "request", requests) + _seeded(entries, "response", responses)


def _metadata_entries():
    return [
        EntryPoint("request", metadata.decode_request, (MetadataError,)),
        EntryPoint("response", metadata.decode_response, (MetadataError,)),
    ]


def _metadata_seeds():
    entries = _metadata_entries()
    m = metadata.Metadata(cluster_id=16, shards=(32, 64, 128))
    return _seeded(entries, "request", [metadata.encode_request(m)]) + _seeded(
        entries, "response", [metadata.encode_response(m)]
    )


def _peer_exchange_entries():
    return [
        EntryPoint("request", peer_exchange.decode_request, (PeerExchangeError,)),
        EntryPoint("response", peer_exchange.decode_response, (PeerExchangeError,)),
    ]


def _peer_exchange_seeds():
    entries = _peer_exchange_entries()
    # The example record of EIP-778.
    enr = base64.urlsafe_b64decode(
        "-IS4QHCYrYZbAKWCBRlAy5zzaDZXJBGkcnh4MHcBFZntXNFrdvJjX04jRzjzCBOonrkTfj499SZuOh8R33Ls8RRcy5wBgmlkgnY0"
        "gmlwhH8AAAGJc2VjcDI1NmsxoQPKY0yuDUmstAHYpMa2_oxVtw0RW_QAdpzBQA8yWM0xOIN1ZHCCdl8="
    )
    requests = [
        peer_exchange.encode_request(60),  # as js-waku writes it
        bytes.fromhex("0a02080512025000"),  # as nwaku writes it, with an empty response
    ]
    responses = [
        peer_exchange.encode_response([enr, enr[:40], bytes(peer_exchange.MAX_ENR_SIZE)]),
        peer_exchange.encode_response([], peer_exchange.PeerExchangeStatus.TOO_MANY_REQUESTS, "busy"),
        bytes.fromhex("1206") + bytes.fromhex("0a040a020102"),  # go-waku: no query, no status
    ]
    return _seeded(entries, "request", requests) + _seeded(entries, "response", responses)


def _enr_record(raw: bytes) -> None:
    """A record from its bytes, then every field a reader asks of it."""
    enr.decode(raw).describe()


def _enr_text(raw: bytes) -> None:
    enr.decode("enr:" + raw.decode("latin-1")).describe()


def _enr_entries():
    # The Waku fields are read from records whose signature holds only, so
    # their decoders are driven directly too.
    return [
        EntryPoint("record", _enr_record, (enr.EnrError,)),
        EntryPoint("text", _enr_text, (enr.EnrError,)),
        EntryPoint("rs", enr.decode_shard_list, (enr.EnrError,)),
        EntryPoint("rsv", enr.decode_shard_vector, (enr.EnrError,)),
        EntryPoint("multiaddrs", enr.decode_multiaddrs, (enr.EnrError,)),
    ]


def _enr_seeds():
    entries = _enr_entries()
    record = enr.waku_record(
        SIGNING_KEY,
        3,
        capabilities=enr.Capability.RELAY | enr.Capability.STORE,
        cluster=16,
        shards=[1, 32],
        ip="192.0.2.1",
        tcp=30303,
        multiaddrs=["/dns4/node.example.org/tcp/443/wss", "/ip4/192.0.2.1/tcp/8000/ws"],
    )
    return (
        _seeded(entries, "record", [record.raw])
        + _seeded(entries, "text", [record.text[4:].encode()])
        + _seeded(entries, "rs", [enr.encode_shard_list(16, [1, 32, 64])])
        + _seeded(entries, "rsv", [enr.encode_shard_vector(16, range(0, 1024, 7))])
        + _seeded(entries, "multiaddrs", [record.pairs["multiaddrs"]])
    )


_PROTECTED = ProtectedTopic(PUBSUB_TOPIC, coincurve.PrivateKey(SIGNING_KEY).public_key.format())


def _relay_message(data: bytes) -> None:
    """What a relayed message's data meets: node/relay.py decodes it, then
    node/ingest.py checks it (storable, 57/STATUS signature) and hashes it."""
    message = decode_message(data)
    message_hash(PUBSUB_TOPIC, message)
    dos_validate(_PROTECTED, message, NOW_NS)
    check_storable(message, len(data), NOW_NS)


def _relay_rpc(data: bytes) -> None:
    """A whole gossipsub RPC frame as py-libp2p parses it, then every
    published message's data and topic as the relay validator sees them."""
    from libp2p.pubsub.pb import rpc_pb2

    from wakustore.protocols.message_codec import parse_protobuf

    rpc = parse_protobuf(rpc_pb2.RPC, data)
    if rpc is None:
        return
    for published in rpc.publish:
        for topic in published.topicIDs:
            # upb hands a proto2 string that is not UTF-8 over as bytes;
            # py-libp2p then finds no validator for it, so none runs.
            if not isinstance(topic, str):
                continue
            try:
                parse_shard_topic(topic)
            except TopicError:
                pass
        try:
            _relay_message(published.data)
        except MessageError:
            pass


def _relay_entries():
    return [
        EntryPoint("message", _relay_message, (MessageError,)),
        EntryPoint("rpc", _relay_rpc, ()),
    ]


def _relay_seeds():
    from libp2p.pubsub.pb import rpc_pb2

    entries = _relay_entries()
    raws = [encode_message(_message(i)) for i in range(3)]
    rpc = rpc_pb2.RPC(publish=[rpc_pb2.Message(data=raws[0], topicIDs=[PUBSUB_TOPIC], seqno=b"\x01")])
    return _seeded(entries, "message", raws) + _seeded(entries, "rpc", [rpc.SerializeToString()])


def _framing(data: bytes) -> None:
    # The first byte splits the stream into two feeds, as TCP may.
    if not data:
        return
    reader = FrameReader(max_size=64 * 1024)
    cut = data[0] % (len(data) + 1)
    reader.feed(data[1:cut])
    reader.feed(data[cut:])
    reader.eof()


def _framing_entries():
    return [EntryPoint("stream", _framing, (FramingError,))]


def _framing_seeds():
    return [b"\x00\x03\x05hello\x00", b"\x00\x02\x80\x01" + bytes(128)]


# --- RLPx -------------------------------------------------------------------------------

_EPHEMERAL = hashlib.sha256(b"fuzz ephemeral").digest()
_NONCE = hashlib.sha256(b"fuzz nonce").digest()


def _auth_raw(data: bytes) -> None:
    hs = rlpx.Handshake(NODE_KEY, ephemeral_key=_EPHEMERAL, nonce=_NONCE)
    cut = data[0] % (len(data) + 1) if data else 0
    hs.receive_data(data[:cut])
    if not hs.complete:
        hs.receive_data(data[cut:])
    if not hs.complete:
        hs.receive_eof()


def _auth_body(data: bytes) -> None:
    """The fuzzed bytes as an EIP-8 auth body, sealed to our node key."""
    if not data:
        return
    prefix = (len(data) + ecies.ECIES_OVERHEAD).to_bytes(2, "big")
    packet = prefix + ecies.encrypt(NODE_ID, data, prefix, ephemeral_key=_EPHEMERAL, iv=bytes(16))
    rlpx.Handshake(NODE_KEY, ephemeral_key=_EPHEMERAL, nonce=_NONCE).receive_data(packet)


_LEGACY_AUTH_PLAIN = rlpx.LEGACY_AUTH_SIZE - ecies.ECIES_OVERHEAD


def _legacy_auth_body(data: bytes) -> None:
    """The fuzzed bytes as a pre-EIP-8 auth body (fixed size), sealed to our key."""
    plain = (bytes(data) + bytes(_LEGACY_AUTH_PLAIN))[:_LEGACY_AUTH_PLAIN]
    packet = ecies.encrypt(NODE_ID, plain, ephemeral_key=_EPHEMERAL, iv=bytes(16))
    rlpx.Handshake(NODE_KEY, ephemeral_key=_EPHEMERAL, nonce=_NONCE).receive_data(packet)


def _ack_body(data: bytes) -> None:
    """The fuzzed bytes as an EIP-8 ack body, sent back to our initiator."""
    if not data:
        return
    hs = rlpx.Handshake(PEER_KEY, remote_public_key=NODE_ID, ephemeral_key=_EPHEMERAL, nonce=_NONCE)
    hs.initiate()
    prefix = (len(data) + ecies.ECIES_OVERHEAD).to_bytes(2, "big")
    hs.receive_data(prefix + ecies.encrypt(PEER_ID, data, prefix, ephemeral_key=_EPHEMERAL, iv=bytes(16)))


def _rlpx_handshake_entries():
    return [
        EntryPoint("auth_raw", _auth_raw, (RLPxError,)),
        EntryPoint("auth_body", _auth_body, (RLPxError,)),
        EntryPoint("legacy_auth_body", _legacy_auth_body, (RLPxError,)),
        EntryPoint("ack_body", _ack_body, (RLPxError,)),
    ]


def _rlpx_handshake_seeds():
    import rlp

    entries = _rlpx_handshake_entries()
    initiator = rlpx.Handshake(PEER_KEY, remote_public_key=NODE_ID, ephemeral_key=_EPHEMERAL, nonce=_NONCE)
    auth = initiator.initiate()
    plain_auth = ecies.decrypt(NODE_KEY, auth[2:], auth[:2])
    signature = coincurve.PrivateKey(_EPHEMERAL).sign_recoverable(bytes(32), hasher=None)
    ack_body = rlp.encode([ecies.public_key_of(_EPHEMERAL), _NONCE, 4]) + bytes(100)
    legacy = signature + bytes(32) + PEER_ID + _NONCE + b"\x00"
    return (
        _seeded(entries, "auth_raw", [auth, auth[:100]])
        + _seeded(entries, "auth_body", [plain_auth])
        + _seeded(entries, "legacy_auth_body", [legacy])
        + _seeded(entries, "ack_body", [ack_body])
    )


_AES_SECRET = hashlib.sha256(b"fuzz aes").digest()
_MAC_SECRET = hashlib.sha256(b"fuzz mac").digest()
_LOCAL_HELLO = rlpx.Hello(rlpx.BASE_PROTOCOL_VERSION, "fuzz", (rlpx.Capability("waku", 1),), 0, NODE_ID)


def _codec_pair() -> tuple[rlpx.FrameCodec, rlpx.Connection]:
    def state(seed: bytes):
        return keccak.new(digest_bits=256, data=seed, update_after_digest=True)

    sender = rlpx.Secrets(NODE_ID, _AES_SECRET, _MAC_SECRET, state(b"a"), state(b"b"))
    receiver = rlpx.Secrets(PEER_ID, _AES_SECRET, _MAC_SECRET, state(b"b"), state(b"a"))
    return (
        rlpx.FrameCodec(sender),
        rlpx.Connection(receiver, _LOCAL_HELLO, max_frame_size=64 * 1024, max_message_size=64 * 1024),
    )


def _split_frames(data: bytes) -> list[bytes]:
    """Frame contents: each a 2-byte big-endian length then that many bytes."""
    frames, pos = [], 0
    while pos + 2 <= len(data):
        size = int.from_bytes(data[pos : pos + 2], "big")
        frames.append(data[pos + 2 : pos + 2 + size])
        pos += 2 + size
    return frames


def _frames_plain(data: bytes) -> None:
    """Fuzzed frame contents, encrypted and MACed as the peer would, fed to
    a Connection: message codes, Hello, Disconnect, snappy payloads."""
    codec, connection = _codec_pair()
    connection.send_hello()
    for content in _split_frames(data):
        connection.receive_data(codec.encode_frame(content))
        if connection.closed:
            break
    connection.receive_eof()


def _frames_raw(data: bytes) -> None:
    _, connection = _codec_pair()
    connection.receive_data(data)
    connection.receive_eof()


def _hello(data: bytes) -> None:
    rlpx.Hello.decode(data)


def _rlpx_frames_entries():
    return [
        EntryPoint("frames_plain", _frames_plain, (RLPxError,)),
        EntryPoint("frames_raw", _frames_raw, (RLPxError,)),
        EntryPoint("hello", _hello, (RLPxError,)),
    ]


def _rlpx_frames_seeds():
    import cramjam
    import rlp

    entries = _rlpx_frames_entries()
    hello = rlpx.Hello(5, "peer", (rlpx.Capability("waku", 1),), 30303, PEER_ID).encode()

    def frame(code: int, payload: bytes) -> bytes:
        content = rlp.encode(code) + payload
        return len(content).to_bytes(2, "big") + content

    def snappy(payload: bytes) -> bytes:
        return bytes(cramjam.snappy.compress_raw(payload))

    plain = [
        frame(0, hello)
        + frame(2, snappy(b"\xc0"))
        + frame(0x10, snappy(rlp.encode([b"status"])))
        + frame(1, snappy(rlp.encode([8]))),
        frame(0, hello) + frame(0x11, snappy(bytes(200))),
        frame(1, rlp.encode([3])),
    ]
    codec, _ = _codec_pair()
    raw = codec.encode_frame(rlp.encode(0) + hello)
    return (
        _seeded(entries, "frames_plain", plain)
        + _seeded(entries, "frames_raw", [raw])
        + _seeded(entries, "hello", [hello])
    )


# --- Waku v1 and the mailserver ------------------------------------------------------------


def _seal_plaintext(plain: bytes) -> bytes:
    """AES-GCM under the mailserver key, without status-go's formatting: the
    decoder behind the cipher sees exactly the fuzzed plaintext."""
    nonce = bytes(AES_NONCE_SIZE)
    cipher = AES.new(SYMMETRIC_KEY, AES.MODE_GCM, nonce=nonce, mac_len=GCM_TAG_SIZE)
    body, tag = cipher.encrypt_and_digest(plain)
    return body + tag + nonce


def _status(data: bytes) -> None:
    from wakustore.protocols.waku_v1 import decode_status

    decode_status(data)


def _waku_v1_entries():
    return [
        EntryPoint("envelope", Envelope.decode, (WakuV1Error,)),
        EntryPoint("envelope_list", decode_envelope_list, (WakuV1Error,)),
        EntryPoint("symmetric_raw", lambda d: decrypt_symmetric(d, SYMMETRIC_KEY), (WakuV1Error,)),
        EntryPoint("symmetric_plain", lambda d: decrypt_symmetric(_seal_plaintext(d), SYMMETRIC_KEY), (WakuV1Error,)),
        EntryPoint("status", _status, ()),
    ]


def _waku_v1_seeds():
    from wakustore.protocols.waku_v1 import encode_status

    entries = _waku_v1_entries()
    envelope = Envelope(NOW_S + 50, 50, b"\x01\x02\x03\x04", b"data" * 10, 7).encode()
    signed = encrypt_symmetric(b"payload", SYMMETRIC_KEY, signing_key=SIGNING_KEY, nonce=bytes(12))
    cipher = AES.new(SYMMETRIC_KEY, AES.MODE_GCM, nonce=bytes(12), mac_len=GCM_TAG_SIZE)
    plain_signed = cipher.decrypt(signed[:-28])
    return (
        _seeded(entries, "envelope", [envelope])
        + _seeded(
            entries, "envelope_list", [b"\xf8" + bytes([len(envelope)]) + envelope if len(envelope) < 256 else envelope]
        )
        + _seeded(entries, "symmetric_raw", [signed])
        + _seeded(entries, "symmetric_plain", [plain_signed, b"\x01\x03abc" + bytes(20)])
        + _seeded(entries, "status", [encode_status(0.002)])
    )


def _p2p_request(data: bytes) -> None:
    packet = wms.decode_p2p_request(data)
    request = packet.request
    if packet.envelope is not None:
        request = wms.open_request(packet.envelope, SYMMETRIC_KEY, minimum_pow=0.0)
    wms.validate_request(request, NOW_S)


def _signed_request(data: bytes) -> None:
    """The fuzzed bytes as a request payload, sealed and signed as a client
    does: decryption, signature recovery and payload decoding."""
    envelope = Envelope(
        NOW_S + 50,
        50,
        bytes(4),
        encrypt_symmetric(data, SYMMETRIC_KEY, signing_key=SIGNING_KEY, nonce=bytes(12), padding=b""),
    )
    request = wms.open_request(envelope, SYMMETRIC_KEY)
    validated = wms.validate_request(request, NOW_S)
    if validated.cursor:
        wms.decode_cursor(validated.cursor)
    for topic in validated.topics[:4]:
        validated.matches_topic(topic)


def _request_envelope(data: bytes) -> None:
    """A request envelope whose data is the fuzzed plaintext under the key."""
    envelope = Envelope(NOW_S + 50, 50, bytes(4), _seal_plaintext(data))
    wms.validate_request(wms.open_request(envelope, SYMMETRIC_KEY), NOW_S)


def _mailserver_entries():
    return [
        EntryPoint("p2p_request", _p2p_request, (WakuV1Error,)),
        EntryPoint("signed_request", _signed_request, (WakuV1Error,)),
        EntryPoint("request_envelope", _request_envelope, (WakuV1Error,)),
        EntryPoint(
            "request_payload", lambda d: wms.validate_request(wms.decode_request_payload(d), NOW_S), (WakuV1Error,)
        ),
        EntryPoint("request_complete", wms.decode_request_complete, (WakuV1Error,)),
        EntryPoint("cursor", wms.decode_cursor, (WakuV1Error,)),
    ]


def _mailserver_seeds():
    entries = _mailserver_entries()
    status_go = wms.MessagesRequest(
        lower=NOW_S - 100,
        upper=NOW_S,
        topics=(b"\x01\x02\x03\x04",),
        limit=10,
        cursor=wms.encode_cursor(NOW_S, bytes(32)),
    )
    spec = wms.MessagesRequest(lower=1, upper=0, bloom=b"\xff" * 64, limit=0, layout="spec")
    payloads = [wms.encode_request_payload(status_go), wms.encode_request_payload(spec)]
    direct = wms.encode_direct_request(
        wms.MessagesRequest(lower=1, upper=2, bloom=b"\xff" * 64, request_id=bytes(range(32)), layout="direct")
    )
    sealed = Envelope(
        NOW_S + 50, 50, bytes(4), encrypt_symmetric(payloads[0], SYMMETRIC_KEY, signing_key=SIGNING_KEY)
    ).encode()
    completes = [
        wms.encode_request_complete(bytes(32), bytes(range(32)), wms.encode_cursor(5, bytes(32))),
        wms.encode_request_complete(bytes(32), layout="spec"),
        wms.encode_request_complete_error(bytes(32), "rate limit exceeded"),
    ]
    return (
        _seeded(entries, "p2p_request", [sealed, direct])
        + _seeded(entries, "signed_request", payloads)
        + _seeded(entries, "request_envelope", [b"\x01" + bytes([len(payloads[0])]) + payloads[0]])
        + _seeded(entries, "request_payload", payloads)
        + _seeded(entries, "request_complete", completes)
        + _seeded(entries, "cursor", [wms.encode_cursor(NOW_S, bytes(32))])
    )


# --- community archives --------------------------------------------------------------------

FUZZ_PIECE_LENGTH = 64
_WINDOW = archive.Window(NOW_S - 3600, NOW_S)
_CHANNEL_KEYS = {CONTENT_TOPIC: archive.channel_key("0x02" + "ab" * 32, "chat")}


def _layout(data: bytes) -> tuple[archive.Layout, bytes]:
    layouts = list(archive.Layout)
    if not data:
        return layouts[0], b""
    return layouts[data[0] % len(layouts)], data[1:]


def _index(data: bytes) -> None:
    layout, raw = _layout(data)
    archive.parse_index(layout, raw, None, FUZZ_PIECE_LENGTH)


def _archive_data(data: bytes) -> None:
    """The bytes as one archive in ``data``, its index entry taken from the
    window every seed archive uses, so that the messages get decoded."""
    layout, raw = _layout(data)
    body_size = len(raw.rstrip(b"\x00")) if raw else 0
    entry = archive.IndexEntry(
        "0x00", _WINDOW.start_ns, _WINDOW.end_ns, (CONTENT_TOPIC,), 0, len(raw), len(raw) - body_size
    )
    archive.read_archive(layout, entry, raw, PUBSUB_TOPIC, None, _CHANNEL_KEYS)


def _compiled_archive(data: bytes) -> None:
    """The bytes as one status-go archive, read by the compiled decoder and
    by the reference: the compiled one reads an archive the reference
    refuses, or gives other rows, is a finding."""
    from wakustore.storage.rows import archive_columns_to_arrow, records_to_arrow

    body_size = len(data.rstrip(b"\x00"))
    entry = archive.IndexEntry(
        "0x00", _WINDOW.start_ns, _WINDOW.end_ns, (CONTENT_TOPIC,), 0, len(data), len(data) - body_size
    )
    layout = archive.Layout.STATUS_GO
    columns = archive.archive_columns(entry, data, archive.RecordDecoder(layout, PUBSUB_TOPIC, _CHANNEL_KEYS))
    reference = archive.RecordDecoder(layout, PUBSUB_TOPIC, _CHANNEL_KEYS)
    try:
        rows = records_to_arrow(list(archive.iter_archive_records(entry, data, reference)))
    except ArchiveError:
        if columns is not None:
            raise AssertionError("the compiled decoder read an archive the reference refuses") from None
        raise
    if columns is not None and not archive_columns_to_arrow(columns).equals(rows):
        raise AssertionError("the compiled decoder's rows differ from the reference's")


def _archived_message(data: bytes) -> None:
    layout, raw = _layout(data)
    archive.decode_archived_message(layout, raw, PUBSUB_TOPIC, _CHANNEL_KEYS)


def _archive_entries():
    return [
        EntryPoint("index", _index, (ArchiveError,)),
        EntryPoint("archive", _archive_data, (ArchiveError,)),
        # decode_archived_message documents MessageError and TopicError for
        # malformed fields beside ArchiveError; read_archive wraps them.
        EntryPoint("archived_message", _archived_message, (ArchiveError, MessageError, TopicError)),
        EntryPoint("magnet", archive.decode_magnet_message, (ArchiveError,)),
        EntryPoint("compiled_archive", _compiled_archive, (ArchiveError,)),
    ]


def _archive_seeds():
    entries = _archive_entries()
    seeds = []
    for number, layout in enumerate(archive.Layout):
        records = []
        for i in range(3):
            m = WakuMessage(b"p%d" % i, CONTENT_TOPIC, 1, NOW_NS - 60 * 10**9 + i)
            records.append(archive.encode_archived_message(layout, PUBSUB_TOPIC, m, m.timestamp).data)
        writer = archive.ArchiveWriter(layout, piece_length=FUZZ_PIECE_LENGTH)
        data = writer.add(_WINDOW, [CONTENT_TOPIC], records)
        writer.add(archive.Window(NOW_S, NOW_S + 10), [CONTENT_TOPIC], records[:1])
        prefix = bytes([number])
        seeds += _seeded(entries, "index", [prefix + writer.index_bytes()])
        seeds += _seeded(entries, "archive", [prefix + data])
        seeds += _seeded(entries, "archived_message", [prefix + r for r in records])
        if layout is archive.Layout.STATUS_GO:
            sealed = encrypt_symmetric(b"sealed", _CHANNEL_KEYS[CONTENT_TOPIC], SIGNING_KEY)
            m = WakuMessage(sealed, CONTENT_TOPIC, 1, NOW_NS - 30 * 10**9)
            both = records + [
                archive.encode_archived_message(layout, PUBSUB_TOPIC, m, m.timestamp, _CHANNEL_KEYS[CONTENT_TOPIC]).data
            ]
            seeds += _seeded(
                entries,
                "compiled_archive",
                [archive.ArchiveWriter(layout, piece_length=FUZZ_PIECE_LENGTH).add(_WINDOW, [CONTENT_TOPIC], both)],
            )
    magnet = archive.encode_magnet_message(SIGNING_KEY, "magnet:?xt=urn:btih:" + "ab" * 20, 1234)
    return seeds + _seeded(entries, "magnet", [magnet])


# --- discv5 ----------------------------------------------------------------------------------

_DISCV5_A = bytes.fromhex("eef77acb6c6a6eebc5b363a475ac583ec7eccdb42b6481424c60f59aa326547f")
_DISCV5_B = bytes.fromhex("66fb62bfbd66b9177a138c1e5cddbe4f7c30c343e94e68df8769459cb1cde628")
_DISCV5_ADDRESS = ("127.0.0.1", 9000)


def _discv5_pair(seed: int = 7):
    """Two nodes' sessions (A, B) with reproducible randomness, and B's id."""
    rng = random.Random(seed)
    record_a = enr.encode(_DISCV5_A, 1, {"ip": bytes([127, 0, 0, 1]), "udp": 9000})
    record_b = enr.encode(_DISCV5_B, 1, {"ip": bytes([127, 0, 0, 1]), "udp": 9001})
    a = discv5.Sessions(_DISCV5_A, lambda: record_a, random=rng.randbytes)
    b = discv5.Sessions(_DISCV5_B, lambda: record_b, random=rng.randbytes)
    return a, b, record_b


def _discv5_packet(data: bytes) -> None:
    """The bytes as a datagram to B, which has just challenged A (so a
    handshake can get as far as its signature and record)."""
    a, b, record_b = _discv5_pair()
    id_b = discv5.node_id(record_b.public_key)
    b.receive(a.send(id_b, _DISCV5_ADDRESS, discv5.ping(b"\x01", 1), record_b), _DISCV5_ADDRESS, lambda n: None)
    b.receive(data, _DISCV5_ADDRESS, lambda n: None)


def _discv5_entries():
    return [
        EntryPoint("packet", _discv5_packet, (discv5.Discv5Error,)),
        EntryPoint("message", discv5.decode_message, (discv5.Discv5Error,)),
    ]


def _discv5_seeds():
    a, b, record_b = _discv5_pair()
    id_b = discv5.node_id(record_b.public_key)
    first = a.send(id_b, _DISCV5_ADDRESS, discv5.ping(b"\x01", 1), record_b)
    whoareyou = b.receive(first, _DISCV5_ADDRESS, lambda n: None).reply
    handshake = a.receive(whoareyou, _DISCV5_ADDRESS, lambda n: None).reply
    b.receive(handshake, _DISCV5_ADDRESS, lambda n: None)
    plain = a.send(id_b, _DISCV5_ADDRESS, discv5.findnode(b"\x02", [256, 255]))
    messages = [
        discv5.encode_message(m)
        for m in (
            discv5.ping(b"\x01", 1),
            discv5.pong(b"\x01", 1, "127.0.0.1", 9000),
            discv5.findnode(b"\x01", [0, 256]),
            *discv5.nodes_messages(b"\x01", [record_b.raw] * 4),
        )
    ]
    entries = _discv5_entries()
    return _seeded(entries, "packet", [first, handshake, plain]) + _seeded(entries, "message", messages)


# --- the registry ----------------------------------------------------------------------------


def _target(name, entries_fn, seeds_fn) -> Target:
    return Target(name, entries_fn(), seeds_fn)


TARGETS: dict[str, Target] = {
    t.name: t
    for t in [
        _target("store_v3", _store_v3_entries, _store_v3_seeds),
        _target("store_v2", _store_v2_entries, _store_v2_seeds),
        _target("lightpush_v2", lambda: _lightpush_entries(2), lambda: _lightpush_seeds(2)),
        _target("lightpush_v3", lambda: _lightpush_entries(3), lambda: _lightpush_seeds(3)),
        _target("metadata", _metadata_entries, _metadata_seeds),
        _target("peer_exchange", _peer_exchange_entries, _peer_exchange_seeds),
        _target("enr", _enr_entries, _enr_seeds),
        _target("discv5", _discv5_entries, _discv5_seeds),
        _target("relay", _relay_entries, _relay_seeds),
        _target("framing", _framing_entries, _framing_seeds),
        _target("rlpx_handshake", _rlpx_handshake_entries, _rlpx_handshake_seeds),
        _target("rlpx_frames", _rlpx_frames_entries, _rlpx_frames_seeds),
        _target("waku_v1", _waku_v1_entries, _waku_v1_seeds),
        _target("mailserver", _mailserver_entries, _mailserver_seeds),
        _target("archive", _archive_entries, _archive_seeds),
    ]
}


def mutate(seed: bytes, rng: random.Random, rounds: int = 4) -> bytes:
    """A few random byte-level edits of ``seed`` (flip, insert, delete,
    duplicate a span, interesting values), keeping the selector byte."""
    data = bytearray(seed)
    for _ in range(rng.randint(1, rounds)):
        op = rng.randrange(6)
        pos = rng.randrange(1, len(data) + 1) if len(data) > 1 else len(data)
        if op == 0 and pos < len(data):
            data[pos] ^= 1 << rng.randrange(8)
        elif op == 1:
            data[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        elif op == 2 and pos < len(data):
            del data[pos : pos + rng.randint(1, 16)]
        elif op == 3 and pos < len(data):
            end = min(len(data), pos + rng.randint(1, 64))
            data[pos:pos] = data[pos:end]
        elif op == 4 and pos < len(data):
            data[pos] = rng.choice((0x00, 0x7F, 0x80, 0xB7, 0xB8, 0xBF, 0xC0, 0xF7, 0xF8, 0xFF))
        elif op == 5 and pos < len(data):
            data[pos : pos + 4] = rng.choice((b"\xff\xff\xff\xff", b"\x00\x00\x00\x00", b"\x80\x80\x80\x80"))
    return bytes(data)
