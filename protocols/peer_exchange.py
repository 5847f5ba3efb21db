"""34/WAKU2-PEER-EXCHANGE (`/vac/waku/peer-exchange/2.0.0-alpha1`): codecs.

A requester (typically a light client) asks a service node for up to
``num_peers`` node records; the service node answers with ENRs of peers it
found by ambient discovery (discv5). Server side: :func:`decode_request`
gives the number of records to answer with, :func:`encode_response`
answers. Client side: :func:`encode_request` and :func:`decode_response`.

Wire format (protos/peer_exchange.proto): one varint-length-prefixed
``PeerExchangeRPC`` per direction::

    PeerExchangeRPC      { PeerExchangeQuery query = 1; PeerExchangeResponse response = 2; }
    PeerExchangeQuery    { uint64 num_peers = 1; }
    PeerExchangeResponse { repeated PeerInfo peer_infos = 1;
                           uint32 status_code = 10; string status_desc = 11; }
    PeerInfo             { bytes enr = 1; }

Fields 10 and 11 are nwaku's (waku/waku_peer_exchange/rpc_codec.nim); the
spec, js-waku and go-waku lack them and skip them as unknown fields. A
response always carries field 1 (an empty query): nwaku's decoder refuses
an RPC without it, answers included. A request is read from field 1 alone:
js-waku writes only that, nwaku adds an empty response, which is ignored.
A response is read from field 2 alone (go-waku's carry nothing else).

Bounds:

* :data:`MAX_PEERS` = 60, nwaku's ``MaxPeersCacheSize``
  (waku_peer_exchange/common.nim): the most nwaku answers with
  (``min(MaxPeersCacheSize, numPeers)``, protocol.nim), the number js-waku
  asks for (``DEFAULT_PEER_EXCHANGE_REQUEST_NODES``), and the spec's
  recommended cache size. A request for more is answered with
  :data:`MAX_PEERS`; :func:`encode_request` asks for at most that many,
  so a response carrying more entries ignored the request and is refused.
* :data:`MAX_ENR_SIZE` = 300 bytes, EIP-778's maximum encoded record size
  (nim-eth's ``maxEnrSize`` refuses larger records; js-waku's encoder
  refuses 300 bytes and more). A response with a larger record is refused.
* The frame sizes, ``PEER_EXCHANGE_MAX_REQUEST_SIZE`` and
  ``PEER_EXCHANGE_MAX_RESPONSE_SIZE``, are in
  :mod:`wakustore.protocols.framing`, derived from the two above.

Status codes are nwaku's (:class:`PeerExchangeStatus`). A response without
one comes from a responder older than them, or from go-waku: it reads as
200 when it holds a record and 503 otherwise, as nwaku reads it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum

from wakustore.protocols.errors import PeerExchangeError
from wakustore.protocols.message_codec import parse_protobuf
from wakustore.protos import peer_exchange_pb2

# EIP-778's bound on a record (protocols.enr.MAX_RECORD_SIZE), a literal so
# that the framing limits, which the store client needs, load no ENR code
# (a test keeps the two equal).
MAX_RECORD_SIZE = 300

PROTOCOL_ID = "/vac/waku/peer-exchange/2.0.0-alpha1"

# nwaku MaxPeersCacheSize (waku/waku_peer_exchange/common.nim).
MAX_PEERS = 60

# EIP-778's maximum encoded record size (300 bytes).
MAX_ENR_SIZE = MAX_RECORD_SIZE

# One PeerInfo holding a record of MAX_ENR_SIZE bytes, as it sits in a
# response with its tag and length: 306 bytes.
MAX_PEER_INFO_SIZE = peer_exchange_pb2.PeerExchangeResponse(
    peer_infos=[peer_exchange_pb2.PeerInfo(enr=bytes(MAX_ENR_SIZE))]
).ByteSize()

_UINT32_MAX = 2**32 - 1


class PeerExchangeStatus(IntEnum):
    """The status codes nwaku writes and reads (waku_peer_exchange/rpc.nim).

    nwaku's enum also holds 401 BAD_RESPONSE and 599 DIAL_FAILURE, which its
    client reports locally and no node sends; its decoder maps every code
    but these four to UNKNOWN (0).
    """

    SUCCESS = 200
    BAD_REQUEST = 400
    TOO_MANY_REQUESTS = 429
    SERVICE_UNAVAILABLE = 503


@dataclass(frozen=True, slots=True)
class PeerExchangeResponse:
    """A decoded answer: the records as received (not parsed), the status
    code as sent (or inferred when absent) and the description, None when
    the responder sent none."""

    enrs: tuple[bytes, ...]
    status_code: int
    status_desc: str | None = None


def encode_request(num_peers: int) -> bytes:
    """Encode a query for ``num_peers`` records.

    Raises :class:`PeerExchangeError` for a number outside 0..MAX_PEERS:
    :func:`decode_response` refuses more records than that.
    """
    if not 0 <= num_peers <= MAX_PEERS:
        raise PeerExchangeError(f"num_peers must be within 0..{MAX_PEERS}, not {num_peers}")
    rpc = peer_exchange_pb2.PeerExchangeRPC(query=peer_exchange_pb2.PeerExchangeQuery(num_peers=num_peers))
    return rpc.SerializeToString()


def decode_request(raw: bytes) -> int:
    """Decode a query; return how many records to answer with.

    That is the requested number, capped at :data:`MAX_PEERS` as nwaku
    caps it; an absent number is 0. Raises :class:`PeerExchangeError` for
    undecodable bytes or an RPC without a query (nwaku answers both 400).
    """
    rpc = parse_protobuf(peer_exchange_pb2.PeerExchangeRPC, raw)
    if rpc is None:
        raise PeerExchangeError("undecodable PeerExchangeRPC")
    if not rpc.HasField("query"):
        raise PeerExchangeError("PeerExchangeRPC without a query")
    return min(rpc.query.num_peers, MAX_PEERS)


def encode_response(
    enrs: Sequence[bytes],
    status_code: int = PeerExchangeStatus.SUCCESS,
    status_desc: str | None = None,
) -> bytes:
    """Encode an answer carrying ``enrs`` (RLP-encoded node records).

    Raises :class:`PeerExchangeError` for more than :data:`MAX_PEERS`
    records, an empty record or one over :data:`MAX_ENR_SIZE` bytes (js-waku
    fails the whole answer on a record it cannot parse), or a status code
    that is not a uint32.
    """
    if len(enrs) > MAX_PEERS:
        raise PeerExchangeError(f"{len(enrs)} records in a response (at most {MAX_PEERS})")
    for enr in enrs:
        _check_enr(enr)
    if not 0 <= status_code <= _UINT32_MAX:
        raise PeerExchangeError(f"status code {status_code} is not a uint32")
    response = peer_exchange_pb2.PeerExchangeResponse(
        peer_infos=[peer_exchange_pb2.PeerInfo(enr=bytes(enr)) for enr in enrs],
        status_code=int(status_code),
    )
    if status_desc is not None:
        response.status_desc = status_desc
    rpc = peer_exchange_pb2.PeerExchangeRPC(response=response)
    # nwaku's decoder requires field 1 in every RPC: written as "0a 00".
    rpc.query.SetInParent()
    return rpc.SerializeToString()


def decode_response(raw: bytes) -> PeerExchangeResponse:
    """Decode an answer.

    Entries without a record are skipped (js-waku skips them; nwaku fails
    to parse them and skips them). Raises :class:`PeerExchangeError` for
    undecodable bytes (a ``status_desc`` that is not UTF-8 included), an
    RPC without a response, more than :data:`MAX_PEERS` entries, or a
    record over :data:`MAX_ENR_SIZE` bytes.
    """
    rpc = parse_protobuf(peer_exchange_pb2.PeerExchangeRPC, raw)
    if rpc is None:
        raise PeerExchangeError("undecodable PeerExchangeRPC")
    if not rpc.HasField("response"):
        raise PeerExchangeError("PeerExchangeRPC without a response")
    response = rpc.response
    if len(response.peer_infos) > MAX_PEERS:
        raise PeerExchangeError(f"{len(response.peer_infos)} records in a response (at most {MAX_PEERS})")
    enrs = tuple(info.enr for info in response.peer_infos if info.enr)
    for enr in enrs:
        _check_enr(enr)
    if response.HasField("status_code"):
        status_code = response.status_code
    else:
        status_code = PeerExchangeStatus.SUCCESS if enrs else PeerExchangeStatus.SERVICE_UNAVAILABLE
    status_desc = response.status_desc if response.HasField("status_desc") else None
    return PeerExchangeResponse(enrs=enrs, status_code=int(status_code), status_desc=status_desc)


def _check_enr(enr: bytes) -> None:
    if not enr:
        raise PeerExchangeError("empty record")
    if len(enr) > MAX_ENR_SIZE:
        raise PeerExchangeError(f"record of {len(enr)} bytes (at most {MAX_ENR_SIZE})")
