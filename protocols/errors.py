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


class StoreError(ProtocolError):
    """A Store request that is invalid; carries the status code to answer with."""

    def __init__(self, status_code: int, description: str):
        super().__init__(description)
        self.status_code = status_code
        self.description = description
