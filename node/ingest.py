"""What the node takes in, whichever way a message arrives: the checks that
lightpush and relay share, and the write into the store.

:meth:`Ingest.check` decides, for one message on one pubsub topic:

1. the topic must be one of the node's shards;
2. the message must fit the network's limits
   (:func:`~wakustore.protocols.message.check_storable`: encoded size,
   meta length, a content topic);
3. on a 57/STATUS-Simple-Scaling protected topic, it must carry a valid
   signature (:func:`~wakustore.protocols.dos_protection.validate`);
4. it may be stored: not ephemeral, timestamp within the drift window.

A message failing 1-3 is invalid: lightpush refuses it, relay rejects it
(not forwarded). A message failing only 4 is valid on the network and is
forwarded, it is just not stored, as nwaku does: its relay validators are
the decoder (meta at most 64 bytes), gossipsub's size limit and the
protected-shard validator (waku/waku_relay/protocol.nim,
waku/factory/validator_signed.nim), while the timestamp drift is the
archive's check (MaxMessageTimestampVariance) and ephemeral messages never
reach the archive.

Every refusal is counted once in ``wakustore_messages_rejected`` with the
source (``lightpush``, ``relay``) and the reason: a
:class:`~wakustore.protocols.message.Rejection` value, a
:class:`~wakustore.protocols.dos_protection.Verdict` value, or
``unsupported_pubsub_topic``. The protected-topic validator's outcomes,
accepts included (57: "keep metrics on the messages validation output"),
go to ``wakustore_protected_topic_validations``.
"""

from __future__ import annotations

import logging
from typing import Any

from prometheus_client import Counter

from wakustore.node.config import NodeConfig
from wakustore.protocols import dos_protection
from wakustore.protocols.dos_protection import ProtectedTopic, Verdict
from wakustore.protocols.message import InvalidMessage, Limits, Rejection, WakuMessage, check_storable
from wakustore.protocols.topics import shard_pubsub_topic

log = logging.getLogger(__name__)

UNSUPPORTED_TOPIC = "unsupported_pubsub_topic"

# Reasons that keep a valid message out of the store but not off the network.
_NOT_STORED = frozenset({Rejection.EPHEMERAL.value, Rejection.TIMESTAMP_DRIFT.value})
# A valid message not stored because the data dir is under its free-space
# floor (node/disk.py): relayed, refused to lightpush with 503.
DISK_FULL = "disk_full"


class Refused(Exception):
    """Why a message is not stored.

    ``reason`` is the metric label (see the module docstring); ``relayable``
    is true when the message is valid on the network and only stays out of
    the store (ephemeral, timestamp drift); ``too_large`` marks the
    encoded-size limit (lightpush answers 413 for it, 420 for the rest).
    """

    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason = reason
        self.detail = detail

    @property
    def relayable(self) -> bool:
        return self.reason in _NOT_STORED

    @property
    def too_large(self) -> bool:
        return self.reason == Rejection.TOO_LARGE.value

    @property
    def unsupported_topic(self) -> bool:
        return self.reason == UNSUPPORTED_TOPIC


class Ingest:
    """Validation and storage over one :class:`StoreService` (or anything
    with its ``put`` and optional ``metrics``).

    ``window_ns`` is the protected topics' MessageWindowInSec in
    nanoseconds (default nwaku's 5 minutes).
    """

    def __init__(
        self,
        service: Any,
        config: NodeConfig,
        *,
        window_ns: int = dos_protection.DEFAULT_MESSAGE_WINDOW_NS,
    ):
        self.service = service
        self.pubsub_topics = frozenset(shard_pubsub_topic(config.cluster_id, s) for s in config.shards)
        self.limits = Limits(max_message_size=config.max_message_size)
        self.protected: dict[str, ProtectedTopic] = {t.pubsub_topic: t for t in config.protected_topics}
        self.window_ns = window_ns
        metrics = getattr(service, "metrics", None)
        self._metrics = metrics
        self._outcomes = _protected_outcomes(metrics) if metrics is not None else None

    def check(self, pubsub_topic: str, message: WakuMessage, encoded_size: int, now_ns: int) -> None:
        """Raise :class:`Refused` unless ``message`` may be stored.

        ``encoded_size`` is the WakuMessage's size on the wire in bytes;
        ``now_ns`` the node's clock in Unix nanoseconds. Counts nothing:
        callers count through :meth:`count`.
        """
        if pubsub_topic not in self.pubsub_topics:
            raise Refused(UNSUPPORTED_TOPIC, f"pubsub topic {pubsub_topic} is not served by this node")
        not_stored: InvalidMessage | None = None
        try:
            check_storable(message, encoded_size, now_ns, self.limits)
        except InvalidMessage as exc:
            if exc.reason.value not in _NOT_STORED:
                raise Refused(exc.reason.value, str(exc)) from None
            not_stored = exc
        protected = self.protected.get(pubsub_topic)
        if protected is not None:
            verdict = dos_protection.validate(protected, message, now_ns, self.window_ns)
            if self._outcomes is not None:
                self._outcomes.labels(pubsub_topic, verdict.value).inc()
            if verdict is not Verdict.ACCEPT:
                raise Refused(verdict.value, f"{verdict.value}: not signed for protected topic {pubsub_topic}")
        if not_stored is not None:
            raise Refused(not_stored.reason.value, str(not_stored))

    def count(self, source: str, refusal: Refused) -> None:
        """Count ``refusal`` under ``source``: an ephemeral message is valid
        (relayed, answered with success) and counted apart; anything else
        in the rejection metric."""
        if self._metrics is None:
            return
        if refusal.reason == Rejection.EPHEMERAL.value:
            self._metrics.ephemeral.labels(source).inc()
        else:
            self._metrics.rejected.labels(source, refusal.reason).inc()

    async def store(self, messages: list[tuple[str, WakuMessage, int]], source: str):
        """Put checked ``(pubsub topic, message, arrival ns)`` triples into the
        store's write path; returns its PutResult. Raises what the store raises."""
        return await self.service.put(messages, source=source)


def _protected_outcomes(metrics) -> Counter:
    """The validator-outcome counter on ``metrics``' registry, created once
    per registry (lightpush and relay share it)."""
    counter = getattr(metrics, "protected_topic_validations", None)
    if counter is None:
        counter = Counter(
            "wakustore_protected_topic_validations",
            "57/STATUS-Simple-Scaling validator outcomes on protected topics",
            ["pubsub_topic", "verdict"],
            registry=metrics.registry,
        )
        metrics.protected_topic_validations = counter
    return counter
