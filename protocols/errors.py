"""The error types of the protocol families.

Each family has one exception type carrying what a peer (or a caller) did
wrong; the caller decides whether to answer with a status code or close.
All of them derive from :class:`ProtocolError`.
"""


class ProtocolError(Exception):
    """Input that violates a protocol or one of its limits."""


class MessageError(ProtocolError):
    """A Waku message (14/WAKU2-MESSAGE) that cannot be decoded or is invalid."""


class TopicError(ProtocolError):
    """A content topic, pubsub topic, shard or community key that is malformed."""


class DosProtectionError(ProtocolError):
    """A message rejected by the 57/STATUS-Simple-Scaling relay validator."""


class WakuV1Error(ProtocolError):
    """A Waku v1 envelope, payload or mailserver packet that is malformed."""


class FramingError(ProtocolError):
    """A length-prefixed libp2p stream frame that is malformed or too large."""


class FrameTooLarge(FramingError):
    """A frame whose length prefix exceeds the reader's limit (lightpush
    answers it 413 PAYLOAD_TOO_LARGE, any other framing error 400)."""


class MetadataError(ProtocolError):
    """A 66/WAKU2-METADATA request or response that cannot be decoded."""


class PeerExchangeError(ProtocolError):
    """A 34/WAKU2-PEER-EXCHANGE request or response that cannot be decoded or
    is over a limit (nwaku answers an undecodable request 400 BAD_REQUEST
    with the reason as status_desc)."""


class StoreError(ProtocolError):
    """A Store request that is invalid; carries the status code to answer with.

    ``request_id`` is the id to echo in the answer: the request's own id when
    it could be read, ``""`` otherwise (what nwaku answers an undecodable
    request with).
    """

    def __init__(self, status_code: int, description: str, request_id: str = ""):
        super().__init__(description)
        self.status_code = status_code
        self.description = description
        self.request_id = request_id


class LightpushError(ProtocolError):
    """A Lightpush request that is invalid; carries the v3 status code and the
    request id to answer with (the v2beta1 answer is ``is_success = false``
    with the description as ``info``)."""

    def __init__(self, status_code: int, description: str, request_id: str = ""):
        super().__init__(description)
        self.status_code = status_code
        self.description = description
        self.request_id = request_id


class ArchiveError(ProtocolError):
    """Community history archive input that is malformed or fails a check:
    archive data, an index, a torrent set or a magnet-link message."""


class RLPxError(ProtocolError):
    """devp2p RLPx input that is malformed, unauthenticated or too large:
    a handshake packet, an ECIES ciphertext, a frame or a base-protocol
    message. The connection cannot continue after one."""


class SyncError(ProtocolError):
    """WAKU-SYNC input that is malformed or over a limit: a reconciliation
    payload, a transfer message, or a session that does not converge within
    its bounds. The stream it came on is reset."""
