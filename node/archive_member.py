"""Member mode of ``serve``: follow a community's magnet links and hydrate
its history from the archives they point to.

The node watches its own store for messages on the community's magnet
topic (they arrive by relay or lightpush like any other message). Their
payloads are unwrapped first (status-go's encrypted wire form or the plain
ApplicationMetadataMessage: :func:`wakustore.protocols.archive.unwrap_magnet_payload`,
done by :func:`newest_magnet`). A link
is acted on only when it is signed by the control node, newer than the
last one imported, and no newer link has appeared for a quiet period
(status-go waits 20 s, since a control node may publish several links in
a row after downtime). The fetch itself is ``wakustore archive fetch``'s,
run from the trio task (:func:`~wakustore.node.archive.fetch_archives_async`)
on one libtorrent session the member keeps.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import trio

from wakustore.node.archive import (
    MemberRecord,
    fetch_archives_async,
    magnets_in_store,
    newest_magnet,
    run_using_store,
)
from wakustore.node.config import parse_peers  # noqa: F401  (re-exported for callers)
from wakustore.protocols import archive, topics
from wakustore.protocols.archive import Layout
from wakustore.transport import torrent

log = logging.getLogger(__name__)

# status-go waits this long after the last magnet link before fetching.
QUIET_PERIOD_S = 20.0
# How often the store is checked for new links (a cheap hot-tier page).
POLL_INTERVAL_S = 5.0
# After a failed fetch (no peer, stalled download), try again this much later.
RETRY_AFTER_S = 300.0

# What a look at the store concluded: no signed link; the newest link is
# not newer than the last imported; a new link within its quiet period (or
# before a retry is due); a fetch begins.
LOOK_NO_LINK, LOOK_NOT_NEWER, LOOK_WAITING, LOOK_FETCHING = "no link", "not newer", "waiting", "fetching"
LOOKS = (LOOK_NO_LINK, LOOK_NOT_NEWER, LOOK_WAITING, LOOK_FETCHING)


@dataclass(frozen=True)
class MemberSettings:
    community_public_key: bytes
    data_dir: Path
    pubsub_topic: str
    chat_ids: tuple[str, ...] = ()
    layout: Layout = archive.DEFAULT_LAYOUT
    peers: tuple[tuple[str, int], ...] = ()  # BitTorrent peers to dial besides the swarm's
    quiet_period_s: float = QUIET_PERIOD_S
    poll_interval_s: float = POLL_INTERVAL_S
    retry_after_s: float = RETRY_AFTER_S
    session_factory: Callable[[], object] | None = None
    import_processes: int = 1  # the node's archive_import_workers

    @property
    def record_path(self) -> Path:
        return self.data_dir / "archives" / f"{topics.community_id(self.community_public_key)}.json"


async def run_archive_member(
    store,
    settings: MemberSettings,
    *,
    limiter: trio.CapacityLimiter | None = None,
    torrent_limiter: trio.CapacityLimiter | None = None,
    clock: Callable[[], float] = time.monotonic,
    on_fetched: Callable[[object], None] | None = None,
    on_look: Callable[[str], None] | None = None,
) -> None:
    """Run until cancelled; a cancel ends it at once, a fetch included
    (:func:`~wakustore.node.archive.fetch_archives_async`: its torrent
    leaves the session and no window is half imported). ``limiter``: the
    engine's threads (store reads, imports); ``torrent_limiter``: threads
    for torrent work, its own by default. ``on_look`` gets what each look
    at the store concluded, one of :data:`LOOKS`."""
    looked = on_look or (lambda outcome: None)
    torrent_limiter = torrent_limiter or trio.CapacityLimiter(torrent.TORRENT_THREADS)
    factory = settings.session_factory or torrent.open_session
    # Not abandoned when cancelled: the session it makes must be closed.
    session = await trio.to_thread.run_sync(factory, limiter=torrent_limiter)
    pending_uri, pending_since = None, 0.0
    retry_at = 0.0
    try:
        while True:
            await trio.sleep(settings.poll_interval_s)
            payloads = await run_using_store(
                magnets_in_store, store, settings.community_public_key, settings.pubsub_topic, limiter=limiter
            )
            link = newest_magnet(payloads, settings.community_public_key, report=log.info)
            if link is None:
                looked(LOOK_NO_LINK)
                continue
            if link.clock <= MemberRecord.load(settings.record_path).last_clock:
                looked(LOOK_NOT_NEWER)
                continue
            if link.magnet_uri != pending_uri:
                pending_uri, pending_since = link.magnet_uri, clock()  # start the quiet period
                looked(LOOK_WAITING)
                continue
            if clock() - pending_since < settings.quiet_period_s or clock() < retry_at:
                looked(LOOK_WAITING)
                continue
            log.info("fetching community archives from magnet clock %d", link.clock)
            looked(LOOK_FETCHING)
            try:
                result = await fetch_archives_async(
                    store,
                    settings.data_dir,
                    settings.community_public_key,
                    link.magnet_uri,
                    session=session,
                    limiter=limiter,
                    clock=link.clock,
                    layout=settings.layout,
                    peers=list(settings.peers),
                    default_pubsub_topic=settings.pubsub_topic,
                    chat_ids=list(settings.chat_ids),
                    report=log.info,
                    import_processes=settings.import_processes,
                )
            except Exception as exc:  # no peers yet, stalled swarm: try later
                log.warning("archive fetch failed, retrying in %.0f s: %s", settings.retry_after_s, exc)
                retry_at = clock() + settings.retry_after_s
                continue
            log.info(
                "imported %d archive(s), %d messages; %d rejected",
                len(result.imported),
                result.messages,
                len(result.rejected),
            )
            if on_fetched is not None:
                on_fetched(result)
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(torrent.close_session, session)
