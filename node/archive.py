"""Community history archives on a node: export and seeding on the control
node, fetch and hydration on a member, and the scheduler ``serve`` runs.

Control node, under the archive directory (status-go's layout of files):

    <community id>/data      archives, append only
    <community id>/index     the index, rewritten
    <community id>.torrent   v1 torrent of data + index, name = community id
    <community id>.json      export state: layout, end of the last exported
                             window (s), last magnet clock (ms) and link,
                             end of the last seeded export (s)

The ``wakustore archive`` commands are in :mod:`wakustore.cli.archive`;
asking a store node for magnet links and checking an archive set, in
:mod:`wakustore.clients.archive`.

Member, under its data directory: ``archives/<community id>/{data,index}``
(only the pieces fetched) and ``archives/<community id>.json``: imported
archive ids (the index keys), last accepted magnet clock and link.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import queue
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TypeVar

import trio

from wakustore.durable import make_dirs, replace_durably
from wakustore.node import archive_work
from wakustore.protocols import archive, topics
from wakustore.protocols.archive import ArchiveWriter, IndexEntry, Layout, MagnetLink, Window
from wakustore.protocols.crypto import private_key_from_bytes
from wakustore.protocols.errors import ArchiveError
from wakustore.protocols.message import WakuMessage
from wakustore.protocols.store_query import MAX_PAGE_SIZE, HistoryQuery
from wakustore.storage import schema
from wakustore.storage.archive_window import SignerCache, export_batches, oldest_timestamp_ns
from wakustore.transport import torrent

log = logging.getLogger(__name__)

# The community shard when none is configured: the node's default shard
# (NodeConfig: cluster 16, shard 32), which is status-go's default
# community pubsub topic.
DEFAULT_PUBSUB_TOPIC = topics.shard_pubsub_topic(topics.STATUS_CLUSTER_ID, 32)

# Scheduler: drain the seeding session's alerts this often; look again
# this long after finding nothing to archive; retry a failed export after.
SEED_POLL_S = 5.0
EMPTY_RECHECK_S = 3600.0
EXPORT_RETRY_S = 300.0
# Between exports, a control node works out the signers of the messages
# that came in (prepare_signers) this often, up to this long before now
# (messages come in up to a few seconds after their timestamp; a later
# one is recovered at the export instead).
SIGNERS_EVERY_S = 600.0
SIGNERS_LAG_S = 60

# Worker processes start (a second or so) once an export has read this
# many messages, or for an import of this many bytes of archives; below,
# the work runs in the calling thread. Export batches: rows per worker task.
POOL_MIN_ROWS = 10_000
POOL_MIN_BYTES = 32 * 1024 * 1024
EXPORT_BATCH_ROWS = 4096

Report = Callable[[str], None]
# Work done so far: (what is counted, done, total), e.g. ("pieces", 40, 120);
# a command draws it as a bar, a node does not ask for it.
Progress = Callable[[str, int, int], None]


def _quiet(text: str) -> None:
    pass


class Stopped(Exception):
    """Blocking archive work was asked to stop (the node is stopping)."""


def _check(stop: threading.Event | None) -> None:
    if stop is not None and stop.is_set():
        raise Stopped("stopped")


async def run_using_store(fn: Callable, store, *args, limiter: trio.CapacityLimiter | None = None, **kwargs):
    """``fn(store, *args, **kwargs)`` in a worker thread that the store owns
    (:meth:`~wakustore.storage.message_store.MessageStore.in_use`: closing
    the store waits for it). Cancelling the caller returns at once and
    leaves the thread to the store."""

    def call():
        with store.in_use():
            return fn(store, *args, **kwargs)

    return await trio.to_thread.run_sync(call, limiter=limiter, abandon_on_cancel=True)  # type: ignore[call-arg]  # trio's annotation drops it


async def run_stoppable(fn: Callable, store, *args, limiter: trio.CapacityLimiter | None = None, **kwargs):
    """``fn(store, *args, stop=event, **kwargs)`` as :func:`run_using_store`
    runs it. Cancelling the caller returns at once: the thread is told to
    stop (``fn`` checks ``stop`` between steps and raises :class:`Stopped`)
    and ends its current step, and the store waits for that before it
    closes, so a stopping node never waits for a long export or window
    import to finish, only for its step. Steps are whole (a Delta
    transaction, an append the next export cuts off if its index was not
    written), so stopping between them loses nothing."""
    stop = threading.Event()
    try:
        return await run_using_store(fn, store, *args, limiter=limiter, stop=stop, **kwargs)
    finally:
        stop.set()


# --- control node ------------------------------------------------------------------


@dataclass(frozen=True)
class ArchiveSettings:
    """What a control node archives. ``community_key``: the 32-byte private
    key; ``chat_ids``: the channels' ids inside the community (the empty
    id is the community's own topic, which status-go's scheduler adds)."""

    community_key: bytes
    chat_ids: tuple[str, ...]
    archive_dir: Path
    pubsub_topic: str | None = None  # the community's shard; None: the node's first shard
    layout: Layout = archive.DEFAULT_LAYOUT
    interval_s: int = archive.ARCHIVE_INTERVAL_S
    trackers: tuple[str, ...] = torrent.DEFAULT_TRACKERS
    listen: str = "0.0.0.0:0"
    isolated: bool = False

    @property
    def public_key(self) -> bytes:
        return private_key_from_bytes(self.community_key).public_key.format(compressed=True)

    @property
    def community_id(self) -> str:
        return topics.community_id(self.public_key)

    @property
    def content_topics(self) -> list[str]:
        return list(dict.fromkeys(topics.channel_content_topic(self.public_key, c) for c in self.chat_ids))

    @property
    def channel_keys(self) -> dict[str, bytes]:
        """Content topic -> the channel's symmetric key."""
        return archive.community_channel_keys(self.public_key, self.chat_ids)

    @property
    def torrent_path(self) -> Path:
        return self.archive_dir / f"{self.community_id}.torrent"

    @property
    def state_path(self) -> Path:
        return self.archive_dir / f"{self.community_id}.json"

    @property
    def signer_cache(self) -> SignerCache:
        """The signers of the channels' messages worked out ahead of their
        export (:func:`prepare_signers`); beside the archives, not in the
        torrent."""
        return SignerCache(self.archive_dir / f"{self.community_id}.signers")


@dataclass
class ControlState:
    layout: str
    chat_ids: list[str] = field(default_factory=list)
    last_end_s: int | None = None
    clock_ms: int = 0
    magnet: str = ""
    seeded_end_s: int | None = None
    # Messages up to here (sender timestamps, ns) had their signers worked
    # out (prepare_signers); a message that comes later with an older
    # timestamp has its signer recovered at the export.
    signers_until_ns: int | None = None

    @classmethod
    def load(cls, path: Path, layout: Layout) -> ControlState:
        if not path.exists():
            return cls(layout=layout.value)
        return cls(**json.loads(path.read_text()))

    def save(self, path: Path) -> None:
        replace_durably(path, json.dumps(asdict(self), indent=1).encode())


@dataclass
class ExportResult:
    windows: list[Window]
    archives: list[IndexEntry]
    messages: int = 0
    dropped: int = 0
    magnet: str | None = None
    message: WakuMessage | None = None  # the magnet-link message, when the torrent changed


def export_community(
    store,
    settings: ArchiveSettings,
    now_s: int,
    report: Report = _quiet,
    *,
    stop: threading.Event | None = None,
    progress: Progress | None = None,
) -> ExportResult:
    """Archive every window from the end of the last one (or the oldest
    message) up to ``now_s``; append to ``data``, rewrite ``index`` and the
    torrent, and put the signed magnet-link message into ``store`` on the
    community's magnet topic. Blocking (Spark, file I/O). The engine reads
    a day at a time, a day ahead of the encoding; records are encoded in
    batches, by worker processes once the export is large
    (:mod:`archive_work`), in order, so the bytes are the same either way. ``stop``, once set, ends the export
    with :class:`Stopped` before its next day of messages (what was
    appended is cut off by the next export)."""
    layout, content_topics = Layout(settings.layout), settings.content_topics
    community_dir = settings.archive_dir / settings.community_id
    make_dirs(community_dir)
    state = ControlState.load(settings.state_path, layout)
    if state.layout != layout.value:
        raise ArchiveError(f"{settings.archive_dir} holds {state.layout} archives, not {layout.value}")
    writer = _open_writer(community_dir, layout)
    keys = settings.channel_keys if layout is Layout.STATUS_GO else {}
    signers = settings.signer_cache if keys else None
    state.chat_ids = list(dict.fromkeys(state.chat_ids + list(settings.chat_ids)))
    # Never before the last archive's end: the state may lag the index by
    # an export that stopped between writing the index and the state.
    ends = [state.last_end_s] + [e.end_ns // archive.NS_PER_S for e in writer.entries]
    start = max((end for end in ends if end is not None), default=None)
    if start is None:
        start = _oldest_second(store, content_topics)
    windows = archive.plan_windows(start, now_s, settings.interval_s) if start is not None else []
    result = ExportResult(windows, [])
    with open(community_dir / "data", "ab") as data, _Writeback(data) as writeback:
        _export_windows(
            store,
            windows,
            content_topics,
            layout,
            keys,
            signers,
            writer,
            data,
            result,
            report,
            stop,
            progress,
            writeback,
        )
        writeback.close()
        data.flush()
        os.fsync(data.fileno())
    result.archives = list(writer.new_entries)
    _forget_empty_data(community_dir)
    if windows:
        state.last_end_s = windows[-1].end_s
    if result.archives:
        replace_durably(community_dir / "index", writer.index_bytes())
        torrent_bytes = torrent.create_torrent(
            settings.archive_dir, settings.community_id, archive.PIECE_LENGTH, settings.trackers
        )
        replace_durably(settings.torrent_path, torrent_bytes)
        state.magnet = torrent.magnet_uri(torrent_bytes)
        state.clock_ms = max(now_s * 1000, state.clock_ms + 1)
        result.message = magnet_waku_message(
            settings.community_key, state.magnet, state.clock_ms, now_s * archive.NS_PER_S
        )
        store.put([(settings.pubsub_topic or DEFAULT_PUBSUB_TOPIC, result.message, now_s * archive.NS_PER_S)])
    state.save(settings.state_path)
    if signers is not None and windows:
        signers.forget_before(schema.day_of_seconds(windows[-1].end_s))
    result.magnet = state.magnet or None
    return result


def _forget_empty_data(community_dir: Path) -> None:
    """A first export that found no message leaves nothing behind: an
    empty ``data`` without an ``index`` would read as a broken archive set."""
    data = community_dir / "data"
    if data.stat().st_size == 0 and not (community_dir / "index").exists():
        data.unlink()
        try:
            community_dir.rmdir()
        except OSError:  # something else is in it
            pass


def _export_windows(
    store,
    windows: list[Window],
    content_topics: list[str],
    layout: Layout,
    keys: dict[str, bytes],
    signers: SignerCache | None,
    writer: ArchiveWriter,
    data,
    result: ExportResult,
    report: Report,
    stop: threading.Event | None,
    progress: Progress | None,
    writeback: _Writeback,
) -> None:
    """Append the archives of ``windows`` to ``data``. A thread reads the
    next day from the engine while this one hands batches to the workers
    and writes what they return; batches carry their window's number, so
    the workers go on into the next window while this one's last archive
    is written. Batches carry the signers ``signers`` knows."""
    # Records are encoded here until a day holds enough messages to pay for
    # starting worker processes; either way they come back in order.
    workers = archive_work.Workers(0)
    keys_items = archive_work.key_items(keys)
    seen_rows = 0
    chunker, open_window, before = archive.Chunker(), 0, 0

    def close_windows(through: int) -> None:
        """Write the last archive of every window before ``through``."""
        nonlocal chunker, open_window, before
        while open_window < through:
            window = windows[open_window]
            last = chunker.finish_framed()
            if last:
                data.writelines(writer.add_framed(window, content_topics, last[0]))
                writeback.kick()
                result.messages += last[1]
            result.dropped += chunker.dropped
            report(f"window {window.start_s}..{window.end_s}: {len(writer.new_entries) - before} archive(s)")
            chunker, open_window, before = archive.Chunker(), open_window + 1, len(writer.new_entries)
            if progress is not None:
                progress("windows", open_window, len(windows))

    def take() -> None:
        number, batch = workers.take()
        close_windows(number)
        for entries, count in chunker.add_framed(*batch):
            data.writelines(writer.add_framed(windows[number], content_topics, entries))
            writeback.kick()
            result.messages += count

    if progress is not None and windows:
        progress("windows", 0, len(windows))
    _check(stop)
    days = (
        (number, table)
        for number, window in enumerate(windows)
        for table in store.stream_window_tables(window.start_ns, window.end_ns, content_topics)
    )
    try:
        for number, table in read_ahead(days):
            _check(stop)
            seen_rows += table.num_rows
            if workers.processes == 0 and seen_rows >= POOL_MIN_ROWS:
                while len(workers):
                    take()
                workers = archive_work.Workers()
            known = _known_signers(signers, table)
            for batch in export_batches(table, EXPORT_BATCH_ROWS, known):
                while workers.full:
                    take()
                workers.submit(number, archive_work.encode_batch, layout, keys_items, batch)
        while len(workers):
            take()
        close_windows(len(windows))
    finally:
        workers.close()


def _known_signers(signers: SignerCache | None, table):
    """The signers ``signers`` knows for the rows of ``table`` (one day),
    null where unknown; None when it knows none."""
    if signers is None or table.num_rows == 0:
        return None
    return signers.lookup(table.column(schema.MESSAGES_PARTITION)[0].as_py(), table.column("message_hash"))


def prepare_signers(
    store, settings: ArchiveSettings, now_s: int, *, stop: threading.Event | None = None, lag_s: int | None = None
) -> int:
    """Work out the signers of the channels' messages committed since the
    last preparation (or the last export), up to ``lag_s`` before
    ``now_s``, into the signer cache: what the next export would spend
    most of its time on (a secp256k1 key recovery a signed message).
    Returns the messages read. Only for status-go archives (the spec
    layout carries no signer). Blocking (Spark, worker processes)."""
    layout = Layout(settings.layout)
    if layout is not Layout.STATUS_GO:
        return 0
    state = ControlState.load(settings.state_path, layout)
    starts = [
        x
        for x in (state.signers_until_ns, None if state.last_end_s is None else state.last_end_s * archive.NS_PER_S)
        if x is not None
    ]
    if starts:
        start_ns = max(starts)
    else:
        oldest = _oldest_second(store, settings.content_topics)
        if oldest is None:
            return 0
        start_ns = oldest * archive.NS_PER_S
    end_ns = (now_s - (SIGNERS_LAG_S if lag_s is None else lag_s)) * archive.NS_PER_S
    if end_ns <= start_ns:
        return 0
    cache, keys = settings.signer_cache, archive_work.key_items(settings.channel_keys)
    workers, read = archive_work.Workers(0), 0
    gathered: dict = {}  # day -> (hashes, signers) taken from the workers

    def take() -> None:
        day, (hashes, found) = workers.take()
        for done in [d for d in gathered if d != day]:  # results come in day order
            cache.add(done, *gathered.pop(done))
        got = gathered.setdefault(day, ([], []))
        got[0].extend(hashes)
        got[1].extend(found)

    try:
        for table in read_ahead(store.stream_window_tables(start_ns, end_ns, settings.content_topics)):
            _check(stop)
            if table.num_rows == 0:
                continue
            read += table.num_rows
            if workers.processes == 0 and read >= POOL_MIN_ROWS:
                while len(workers):
                    take()
                workers = archive_work.Workers()
            day = table.column(schema.MESSAGES_PARTITION)[0].as_py()
            for batch in SignerCache.batches(table, settings.content_topics, EXPORT_BATCH_ROWS):
                while workers.full:
                    take()
                workers.submit(day, archive_work.signer_batch, layout, keys, batch)
        while len(workers):
            take()
        for day, got in gathered.items():
            cache.add(day, *got)
    finally:
        workers.close()
    state = ControlState.load(settings.state_path, layout)  # as an export in between may have left it
    state.signers_until_ns = max(end_ns, state.signers_until_ns or 0)
    state.save(settings.state_path)
    return read


class _Writeback:
    """The data written so far put on disk by a thread (fdatasync) while
    the export goes on, started after each archive unless one is under
    way: the export's last fsync then waits for its last archives only
    (1.4 GB of archives left it 2.7 s of writes to wait for)."""

    def __init__(self, file) -> None:
        self._file = file
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="archive-writeback")
        self._pending: Future[None] | None = None

    def __enter__(self) -> _Writeback:
        return self

    def __exit__(self, *exc) -> None:
        self._thread.shutdown(wait=True)

    def kick(self) -> None:
        if self._pending is None or self._pending.done():
            if self._pending is not None:
                self._pending.result()  # a failed write is the export's failure
            self._file.flush()
            self._pending = self._thread.submit(os.fdatasync, self._file.fileno())

    def close(self) -> None:
        if self._pending is not None:
            self._pending.result()
            self._pending = None


def read_ahead(items: Iterable[T]) -> Iterator[T]:
    """``items``, produced by a thread one item ahead of the caller (the
    engine reads the next day while the caller works on this one).
    Whatever the thread raises is raised here; when the caller stops early,
    the thread ends after its current item."""
    handoff: queue.Queue = queue.Queue(maxsize=1)
    stopping = threading.Event()

    def produce() -> None:
        try:
            for item in items:
                handoff.put((item, None))
                if stopping.is_set():
                    break
        except BaseException as exc:  # handed to the caller, raised there
            handoff.put((_END, exc))
            return
        handoff.put((_END, None))

    thread = threading.Thread(target=produce, name="archive-read-ahead", daemon=True)
    thread.start()
    ended = False
    try:
        while True:
            item, error = handoff.get()
            if item is _END:
                ended = True
                if error is not None:
                    raise error
                return
            yield item
    finally:
        stopping.set()
        while not ended:  # let the thread finish its item and see the flag
            ended = handoff.get()[0] is _END
        thread.join()


_END = object()
T = TypeVar("T")


def magnet_waku_message(private_key: bytes, magnet_uri: str, clock_ms: int, timestamp_ns: int) -> WakuMessage:
    """The WakuMessage to publish on the community's magnet topic, in the
    form status-go sends and reads.

    The signed ApplicationMetadataMessage (:func:`archive.encode_magnet_message`)
    is wrapped in status-go's encryption layer (a ProtocolMessage carrying it
    as ``public_message``) and then Waku v1 symmetrically encrypted with the
    key status-go derives from the chat id ``<community id>-magnetlinks``,
    the transport payload signed by the community key
    (:func:`archive.wrap_magnet_for_status`); ``version`` is 1, as status-go
    sets for such payloads. The content topic is the magnet chat's. Readers
    here (:func:`newest_magnet`) also accept the plain
    ApplicationMetadataMessage published before.
    """
    public_key = private_key_from_bytes(private_key).public_key.format(compressed=True)
    app_metadata = archive.encode_magnet_message(private_key, magnet_uri, clock_ms)
    return WakuMessage(
        payload=archive.wrap_magnet_for_status(app_metadata, topics.magnet_chat_id(public_key), private_key),
        content_topic=topics.magnet_content_topic(public_key),
        version=1,
        timestamp=timestamp_ns,
    )


def seed_latest(seeder: torrent.Seeder, settings: ArchiveSettings) -> bool:
    """Seed the community's current torrent (dropping the one seeded
    before) and record that its exports are now seeded; False when there
    is no torrent yet."""
    if not settings.torrent_path.exists():
        return False
    seeder.seed(settings.torrent_path.read_bytes(), settings.archive_dir)
    _mark_seeded(settings)
    return True


async def seed_latest_async(seeder: torrent.Seeder, settings: ArchiveSettings) -> bool:
    """:func:`seed_latest` in a trio task, cancellable while libtorrent
    checks the files."""
    if not settings.torrent_path.exists():
        return False
    await seeder.seed_async(settings.torrent_path.read_bytes(), settings.archive_dir)
    _mark_seeded(settings)
    return True


def _mark_seeded(settings: ArchiveSettings) -> None:
    state = ControlState.load(settings.state_path, Layout(settings.layout))
    state.seeded_end_s = state.last_end_s
    state.save(settings.state_path)


def archive_settings(config) -> ArchiveSettings:
    """The control-node archive settings of ``config`` (a NodeConfig with
    archive_key_file set); UsageError for an unreadable or malformed key."""
    from wakustore.usage import UsageError, parse_hex

    try:
        key = parse_hex(Path(config.archive_key_file).read_text().strip(), "archive_key_file")
    except OSError as exc:
        raise UsageError(f"archive_key_file: {exc}") from None
    if len(key) != 32:
        raise UsageError("archive_key_file must hold a 32-byte private key in hex")
    return ArchiveSettings(
        community_key=key,
        chat_ids=tuple(config.archive_chat_ids) or ("",),
        archive_dir=config.archives,
        layout=config.archive_layout,
        listen=config.archive_listen,
    )


def keep_from_ns(settings: ArchiveSettings | None) -> int | None:
    """The archive guard retention takes (``keep_from_ns``) on a node with
    these control-node settings, now: history from the end of the last
    seeded archive on stays. None when the node archives nothing. One
    function for ``serve``'s hourly maintenance and ``wakustore db
    retention``, so a manual run never deletes what is not yet archived."""
    if settings is None:
        return None
    return seeded_until_ns(settings.archive_dir, [settings.community_id])


def seeded_until_ns(archive_dir: Path, community_ids: Iterable[str]) -> int | None:
    """For retention (``apply_retention(keep_from_ns=...)``): every message
    before this time is in a seeded archive of each community, so only
    older messages may leave the store. 0 while a community has nothing
    seeded yet (keep everything); None when no community is archived."""
    ends = []
    for cid in community_ids:
        path = archive_dir / f"{cid}.json"
        seeded = json.loads(path.read_text()).get("seeded_end_s") if path.exists() else None
        ends.append(0 if seeded is None else seeded * archive.NS_PER_S)
    return min(ends) if ends else None


async def run_archive_scheduler(
    config,
    store,
    settings: ArchiveSettings,
    *,
    limiter: trio.CapacityLimiter | None = None,
    torrent_limiter: trio.CapacityLimiter | None = None,
    publish: Callable[[str, WakuMessage], Awaitable[object]] | None = None,
    now: Callable[[], float] = time.time,
    task_status=trio.TASK_STATUS_IGNORED,
) -> None:
    """Every ``settings.interval_s``: export the windows since the last
    export and seed only the latest torrent; ``publish(pubsub_topic,
    message)`` (awaited) sends the new magnet-link message to the network.
    Seeds the existing torrent at start. ``task_status.started`` gets the
    :class:`torrent.Seeder` once its session listens, before libtorrent
    has checked the files. Runs until cancelled, and a cancel ends it at
    once whatever it is doing (see :func:`run_stoppable`). ``config``: the
    node's NodeConfig, whose first shard is the community's pubsub topic
    unless ``settings`` name one; ``limiter``: the store's thread limiter;
    ``torrent_limiter``: threads for torrent work (its own by default)."""
    if settings.pubsub_topic is None and config is not None and config.shards:
        settings = dataclasses.replace(
            settings, pubsub_topic=topics.shard_pubsub_topic(config.cluster_id, config.shards[0])
        )
    torrent_limiter = torrent_limiter or trio.CapacityLimiter(torrent.TORRENT_THREADS)
    # Not abandoned when cancelled: the session it makes must be closed.
    session = await trio.to_thread.run_sync(
        torrent.open_session, settings.listen, settings.isolated, limiter=torrent_limiter
    )
    seeder = torrent.Seeder(session)
    try:
        task_status.started(seeder)
        log.info(
            "archive scheduler for %s (%s layout), seeding on port %d",
            settings.community_id,
            Layout(settings.layout).value,
            seeder.port,
        )
        try:
            await seed_latest_async(seeder, settings)
        except torrent.TorrentError as exc:  # the next export seeds a new torrent
            log.error("cannot seed the existing archives of %s: %s", settings.community_id, exc)
        signers_due = now() + SIGNERS_EVERY_S
        while True:
            state = ControlState.load(settings.state_path, Layout(settings.layout))
            due = now() if state.last_end_s is None else state.last_end_s + settings.interval_s
            while now() < due:
                await trio.sleep(min(SEED_POLL_S, max(due - now(), 0.0)))
                seeder.poll()
                if now() >= signers_due:
                    signers_due = now() + SIGNERS_EVERY_S
                    try:
                        await run_stoppable(prepare_signers, store, settings, int(now()), limiter=limiter)
                    except Exception as exc:  # a cache: the export recovers what is missing
                        log.warning("working out signers ahead of the export failed: %s", exc)
            try:
                result = await run_stoppable(export_community, store, settings, int(now()), limiter=limiter)
                if result.archives:
                    await seed_latest_async(seeder, settings)
                    log.info(
                        "archived %d messages in %d archive(s); magnet %s",
                        result.messages,
                        len(result.archives),
                        result.magnet,
                    )
                    if publish is not None and result.message is not None:
                        await publish(settings.pubsub_topic or DEFAULT_PUBSUB_TOPIC, result.message)
                elif result.windows and seeder.handle is not None:
                    # Only empty windows: the seeded torrent still holds all history.
                    _mark_seeded(settings)
                elif state.last_end_s is None and not result.windows:
                    await trio.sleep(EMPTY_RECHECK_S)
            except Exception as exc:  # engine down, disk full: the next attempt may do better
                log.warning("archive export failed, retrying in %g s: %s", EXPORT_RETRY_S, exc)
                await trio.sleep(EXPORT_RETRY_S)
    finally:
        with trio.CancelScope(shield=True):
            seeder.stop()
            await trio.to_thread.run_sync(torrent.close_session, session)


def _open_writer(community_dir: Path, layout: Layout) -> ArchiveWriter:
    """Writer over the existing files. Data beyond what the index covers
    is an export that stopped before its index was written: cut it off."""
    index_path, data_path = community_dir / "index", community_dir / "data"
    index = index_path.read_bytes() if index_path.exists() else None
    size = data_path.stat().st_size if data_path.exists() else 0
    covered = sum(e.size for e in archive.parse_index(layout, index)) if index else 0
    if size > covered:
        log.warning("%s: dropping %d bytes of an unfinished export", data_path, size - covered)
        os.truncate(data_path, covered)
        size = covered
    return ArchiveWriter(layout, index, size)


def _oldest_second(store, content_topics: Sequence[str]) -> int | None:
    store.flush()
    oldest = oldest_timestamp_ns(store.table, content_topics)
    return None if oldest is None else oldest // archive.NS_PER_S


# --- member ----------------------------------------------------------------------------


@dataclass
class MemberRecord:
    imported: list[str] = field(default_factory=list)
    last_clock: int = 0
    last_magnet: str = ""

    @classmethod
    def load(cls, path: Path) -> MemberRecord:
        return cls(**json.loads(path.read_text())) if path.exists() else cls()

    def save(self, path: Path) -> None:
        make_dirs(path.parent)
        replace_durably(path, json.dumps(asdict(self), indent=1).encode())


@dataclass(frozen=True)
class Selection:
    """Which archives to fetch: ``all`` missing ones, the ``latest`` window,
    or windows overlapping ``[from_s, to_s)`` (``range``)."""

    mode: str = "all"
    from_s: int | None = None
    to_s: int | None = None


@dataclass
class FetchResult:
    imported: list[str] = field(default_factory=list)
    windows: list[tuple[int, int]] = field(default_factory=list)
    messages: int = 0
    rejected: dict[str, str] = field(default_factory=dict)
    downloaded_pieces: set[int] = field(default_factory=set)  # pieces that came from peers
    download_s: float = 0.0  # metadata, index and pieces
    hydrate_s: float = 0.0  # reading, checking and replacing windows
    ignored: str | None = None  # why the link was not acted on


def newest_magnet(payloads: Iterable[bytes], community_public_key: bytes, report: Report = _quiet) -> MagnetLink | None:
    """The newest magnet link among ``payloads`` (WakuMessage payloads from
    the magnet topic, status-go's wrapped form or the plain one: see
    :func:`archive.unwrap_magnet_payload`) signed by the control node;
    forged or malformed ones are reported and skipped."""
    newest = None
    chat_id = topics.magnet_chat_id(community_public_key)
    for payload in payloads:
        try:
            link = archive.verify_magnet_message(archive.unwrap_magnet_payload(payload, chat_id), community_public_key)
        except ArchiveError as exc:
            report(f"ignoring a magnet-link message: {exc}")
            continue
        if newest is None or link.clock > newest.clock:
            newest = link
    return newest


def magnets_in_store(store, community_public_key: bytes, pubsub_topic: str) -> list[bytes]:
    """Payloads of the messages on the community's magnet topic in ``store``,
    as published (wrapped or plain): :func:`newest_magnet` unwraps them."""
    query = HistoryQuery(
        pubsub_topic=pubsub_topic,
        content_topics=(topics.magnet_content_topic(community_public_key),),
        forward=True,
        limit=MAX_PAGE_SIZE,
    )
    payloads = []
    while True:
        page = store.query(query)
        payloads += [m.message.payload for m in page.messages if m.message is not None]
        if page.next_cursor is None:
            return payloads
        query = dataclasses.replace(query, cursor=page.next_cursor.message_hash)


def fetch_archives(
    store,
    data_dir: Path,
    community_public_key: bytes,
    magnet: str,
    *,
    clock: int | None = None,
    selection: Selection = Selection(),
    layout: Layout = archive.DEFAULT_LAYOUT,
    peers: Sequence[tuple[str, int]] = (),
    session=None,
    default_pubsub_topic: str = DEFAULT_PUBSUB_TOPIC,
    allowed_topics: Iterable[str] | None = None,
    chat_ids: Sequence[str] = (),
    metadata_timeout_s: float = torrent.METADATA_TIMEOUT_S,
    stall_timeout_s: float = torrent.DEFAULT_STALL_TIMEOUT_S,
    report: Report = _quiet,
    progress: Progress | None = None,
    import_processes: int = archive_work.IMPORT_PROCESSES,
) -> FetchResult:
    """Fetch the index of ``magnet``, then the pieces of the selected
    archives not imported yet; check each archive and replace its window
    (its content topics) in ``store`` in one Delta transaction per window.

    ``clock``: the magnet message's clock; a link no newer than the last
    accepted one is ignored. ``chat_ids``: the channels' ids, whose keys
    rebuild messages a status-go archive holds decrypted. Archives that fail a check are reported in
    ``rejected`` and never reach the table. Raises TorrentError when the
    torrent cannot be fetched. ``import_processes``: worker processes
    that check and decode the archives (at most one a core). Blocking;
    :func:`fetch_archives_async` is the same in a trio task.
    """
    job = _ArchiveFetch(
        data_dir,
        community_public_key,
        magnet,
        clock,
        selection,
        Layout(layout),
        peers,
        default_pubsub_topic,
        allowed_topics,
        chat_ids,
        metadata_timeout_s,
        stall_timeout_s,
        report,
        progress,
        import_processes,
    )
    if job.result.ignored:
        return job.result
    job.start(session or torrent.open_session())
    try:
        torrent.drive(job.download())
    except BaseException:
        job.drop_workers()
        raise
    finally:
        job.close()
    job.hydrate(store)
    return job.result


async def fetch_archives_async(
    store,
    data_dir: Path,
    community_public_key: bytes,
    magnet: str,
    *,
    session,
    limiter: trio.CapacityLimiter | None = None,
    clock: int | None = None,
    selection: Selection = Selection(),
    layout: Layout = archive.DEFAULT_LAYOUT,
    peers: Sequence[tuple[str, int]] = (),
    default_pubsub_topic: str = DEFAULT_PUBSUB_TOPIC,
    allowed_topics: Iterable[str] | None = None,
    chat_ids: Sequence[str] = (),
    metadata_timeout_s: float = torrent.METADATA_TIMEOUT_S,
    stall_timeout_s: float = torrent.DEFAULT_STALL_TIMEOUT_S,
    report: Report = _quiet,
    progress: Progress | None = None,
    import_processes: int = archive_work.IMPORT_PROCESSES,
) -> FetchResult:
    """:func:`fetch_archives` in a trio task on ``session`` (the caller's,
    kept open). The download waits poll libtorrent from this task, so a
    cancel ends them at once and removes the torrent from the session;
    the import runs in a worker thread under ``limiter`` (the engine's)
    and stops between windows (:func:`run_stoppable`): a window is in the
    table whole or not at all, and the record lists only the whole ones.
    """
    job = _ArchiveFetch(
        data_dir,
        community_public_key,
        magnet,
        clock,
        selection,
        Layout(layout),
        peers,
        default_pubsub_topic,
        allowed_topics,
        chat_ids,
        metadata_timeout_s,
        stall_timeout_s,
        report,
        progress,
        import_processes,
    )
    if job.result.ignored:
        return job.result
    job.start(session)
    try:
        await torrent.drive_async(job.download())
    except BaseException:
        job.drop_workers()
        raise
    finally:
        job.close()
    await run_stoppable(job.hydrate, store, limiter=limiter)
    return job.result


class _ArchiveFetch:
    """One fetch of :func:`fetch_archives`: the download (a wait on
    libtorrent, :data:`torrent.Steps`), then the import (blocking)."""

    def __init__(
        self,
        data_dir: Path,
        community_public_key: bytes,
        magnet: str,
        clock: int | None,
        selection: Selection,
        layout: Layout,
        peers: Sequence[tuple[str, int]],
        default_pubsub_topic: str,
        allowed_topics: Iterable[str] | None,
        chat_ids: Sequence[str],
        metadata_timeout_s: float,
        stall_timeout_s: float,
        report: Report,
        progress: Progress | None = None,
        import_processes: int = archive_work.IMPORT_PROCESSES,
    ):
        self.cid = topics.community_id(community_public_key)
        self.save_path = data_dir / "archives"
        self.record_path = self.save_path / f"{self.cid}.json"
        self.record = MemberRecord.load(self.record_path)
        self.magnet, self.clock, self.selection, self.layout, self.peers = magnet, clock, selection, layout, peers
        self.default_pubsub_topic, self.allowed_topics = default_pubsub_topic, allowed_topics
        self.keys = archive.community_channel_keys(community_public_key, chat_ids)
        self.metadata_timeout_s, self.stall_timeout_s, self.report = metadata_timeout_s, stall_timeout_s, report
        self.progress = progress
        self.import_processes = import_processes
        self.result = FetchResult()
        self.groups: list[list[IndexEntry]] = []
        self.job: torrent.Fetch | None = None
        self.workers: archive_work.Workers | None = None
        if clock is not None and clock <= self.record.last_clock:
            self.result.ignored = f"magnet clock {clock} is not newer than {self.record.last_clock}"

    def start(self, session) -> None:
        self.save_path.mkdir(parents=True, exist_ok=True)
        self.job = torrent.Fetch(session, self.magnet, self.save_path, self.peers, self.report, self.progress)
        self.started = time.monotonic()

    def download(self) -> torrent.Steps[None]:
        job, cid = self.job, self.cid
        assert job is not None  # start() made it
        info = yield from job.wait_metadata(self.metadata_timeout_s)
        layout_files = info.layout()
        names = [layout_files.file_path(i).replace("\\", "/") for i in range(layout_files.num_files())]
        if info.name() != cid or names != [f"{cid}/{f}" for f in torrent.FILE_NAMES]:
            raise ArchiveError(f"torrent {info.name()!r} with files {names} is not community {cid}'s archive")
        yield from job.wait_index(self.stall_timeout_s)
        index = (self.save_path / cid / "index").read_bytes()
        data_size = layout_files.file_size(torrent.DATA_FILE)
        entries = archive.parse_index(self.layout, index, data_size, info.piece_length())
        self.groups = _select(archive_windows(entries), set(self.record.imported), self.selection)
        self.report(
            f"index: {len(entries)} archive(s); fetching {sum(len(g) for g in self.groups)} "
            f"in {len(self.groups)} window(s)"
        )
        self.workers = import_workers(self.groups, self.import_processes)  # they start while the pieces download
        yield from job.download(
            {p for g in self.groups for e in g for p in e.pieces(info.piece_length())}, self.stall_timeout_s
        )
        yield from job.flush()
        self.result.downloaded_pieces = set(job.downloaded)
        self.result.download_s = time.monotonic() - self.started

    def close(self) -> None:
        if self.job is not None:
            self.job.close()

    def drop_workers(self) -> None:
        """Stop the import's workers (the download failed: no import)."""
        if self.workers is not None:
            self.workers.close()
            self.workers = None

    def hydrate(self, store, stop: threading.Event | None = None) -> None:
        workers, self.workers = self.workers, None
        hydrate(
            store,
            self.save_path / self.cid / "data",
            self.layout,
            self.groups,
            self.default_pubsub_topic,
            self.allowed_topics,
            self.keys,
            self.record,
            self.record_path,
            self.result,
            self.report,
            stop=stop,
            progress=self.progress,
            workers=workers,
        )
        if self.clock is not None:
            self.record.last_clock, self.record.last_magnet = self.clock, self.magnet
        self.record.save(self.record_path)


def hydrate(
    store,
    data_path: Path,
    layout: Layout,
    groups: list[list[IndexEntry]],
    default_pubsub_topic: str,
    allowed_topics: Iterable[str] | None,
    keys: dict[str, bytes],
    record: MemberRecord,
    record_path: Path,
    result: FetchResult,
    report: Report = _quiet,
    *,
    stop: threading.Event | None = None,
    progress: Progress | None = None,
    workers: archive_work.Workers | None = None,
) -> None:
    """Check the archives of each window (as :func:`archive_windows` groups
    them) read from ``data_path`` and replace the window in ``store``;
    records each imported window in ``record`` as it goes. A window that
    fails a check is left alone and listed in ``result.rejected``.
    Archives are decoded into Arrow rows (no object per message), by
    worker processes when there are many, ahead of the window being
    committed.
    ``stop``, once set, ends it with :class:`Stopped` before the next window.
    ``workers``: :func:`import_workers` started earlier (closed here)."""
    started = time.monotonic()
    entries = [(number, entry) for number, group in enumerate(groups) for entry in group]
    allowed = tuple(allowed_topics) if allowed_topics is not None else None
    keys_items = archive_work.key_items(keys)
    # Archives are checked and decoded ahead, in order, by worker processes
    # (a bounded queue), so that the next window is being decoded while
    # the engine commits this one.
    # Workers hand rows back as files beside the data (archive_work.rows_of).
    with (
        tempfile.TemporaryDirectory(prefix="import-", dir=data_path.parent.parent) as spool,
        workers if workers is not None else import_workers(groups) as workers,
    ):
        waiting = iter(entries)

        def fill() -> None:
            while not workers.full:
                item = next(waiting, None)
                if item is None:
                    return
                out = Path(spool) / f"{item[1].offset}.arrow" if workers.processes else None
                workers.submit(
                    item[0],
                    archive_work.decode_archive,
                    data_path,
                    item[1],
                    layout,
                    default_pubsub_topic,
                    allowed,
                    keys_items,
                    out,
                )

        def tables(number: int, group: list[IndexEntry]):
            for _ in group:
                fill()
                due, result = workers.take()
                assert due == number, "archives are taken in the order they were queued"
                yield archive_work.rows_of(result)

        # A window's commit runs in its own thread while the next window is
        # read and staged here: the engine writes one window while this
        # process checks and stages the next (one after the other, a 1M
        # hydrate spent about as long in each). One commit at a time, in
        # window order; a window is recorded once its commit returned, by
        # the same thread: the record's fsync waits behind whatever the
        # disk has to write (a download's worth: up to 0.7 s measured), and
        # the staging here goes on meanwhile.
        with ThreadPoolExecutor(1, thread_name_prefix="window-commit") as committer:
            committing: list = []  # at most one (future, staged window)

            def commit(group: list[IndexEntry], staged) -> None:
                written = store.commit_window(staged)
                _imported(group, written, record, result, report)
                record.save(record_path)

            def finish() -> None:
                if not committing:
                    return
                future, staged = committing.pop()
                try:
                    future.result()
                finally:
                    staged.close()

            try:
                for done, group in enumerate(groups):
                    if stop is not None and stop.is_set():
                        finish()
                        _check(stop)
                    fill()
                    while len(workers) and workers.peek_tag() < done:
                        workers.drop()  # the rest of a rejected window
                        fill()
                    staged = _stage_window(store, group, tables(done, group), result, report)
                    if done == len(groups) - 1:
                        workers.release()  # all decoded: they end while the last window commits
                    try:
                        finish()
                    except BaseException:
                        if staged is not None:
                            staged.close()  # its files: nothing of it was committed
                        raise
                    if progress is not None:
                        progress("windows imported", done, len(groups))
                    if staged is not None:
                        committing.append((committer.submit(commit, group, staged), staged))
                finish()
            except BaseException:
                # The window being committed is in the table or not, whole:
                # wait for it and record it if it landed.
                try:
                    finish()
                except Exception:
                    log.exception("a window's commit failed while the import was ending")
                raise
        if progress is not None and groups:
            progress("windows imported", len(groups), len(groups))
    result.hydrate_s += time.monotonic() - started


def import_workers(
    groups: list[list[IndexEntry]], processes: int = archive_work.IMPORT_PROCESSES
) -> archive_work.Workers:
    """Started workers to decode ``groups``' archives: ``processes`` (at
    most one a core) when they are large, else none (decoded in the
    calling thread)."""
    big = sum(entry.size for group in groups for entry in group) >= POOL_MIN_BYTES
    processes = min(processes, archive_work.default_processes()) if big else 0
    workers = archive_work.Workers(processes, archive_work.IMPORT_QUEUE_PER_WORKER)
    workers.start()
    return workers


def archive_windows(entries: list[IndexEntry]) -> list[list[IndexEntry]]:
    """Archives grouped by window (a window over 30 MB spans several)."""
    groups: dict[tuple, list[IndexEntry]] = {}
    for entry in entries:
        groups.setdefault((entry.start_ns, entry.end_ns, entry.content_topics), []).append(entry)
    return sorted(groups.values(), key=lambda g: (g[0].start_ns, g[0].offset))


def _select(groups: list[list[IndexEntry]], imported: set[str], selection: Selection) -> list[list[IndexEntry]]:
    missing = [g for g in groups if any(e.archive_id not in imported for e in g)]
    if selection.mode == "latest":
        return [groups[-1]] if groups and groups[-1] in missing else []
    if selection.mode == "range":
        low = (selection.from_s or 0) * archive.NS_PER_S
        high = selection.to_s * archive.NS_PER_S if selection.to_s is not None else None
        return [g for g in missing if g[0].end_ns > low and (high is None or g[0].start_ns < high)]
    return missing


def _stage_window(store, group: list[IndexEntry], tables, result: FetchResult, report: Report):
    """One window's rows from its archives (``tables``, which checks each
    archive as it is read), staged for one window replacement
    (``store.stage_window_tables``); None when a check failed (the window
    is then listed in ``result.rejected`` and nothing of it commits)."""
    first = group[0]
    try:
        return store.stage_window_tables(first.start_ns, first.end_ns, list(first.content_topics), tables)
    except ArchiveError as exc:
        for entry in group:
            result.rejected[entry.archive_id] = str(exc)
        report(f"window {first.start_ns // archive.NS_PER_S}..{first.end_ns // archive.NS_PER_S} rejected: {exc}")
        return None


def _imported(group: list[IndexEntry], written: int, record: MemberRecord, result: FetchResult, report: Report) -> None:
    """A window's replacement committed: the member's record and the result say so."""
    first = group[0]
    record.imported += [e.archive_id for e in group if e.archive_id not in record.imported]
    result.imported += [e.archive_id for e in group]
    result.windows.append((first.start_ns // archive.NS_PER_S, first.end_ns // archive.NS_PER_S))
    result.messages += written
    report(f"window {first.start_ns // archive.NS_PER_S}..{first.end_ns // archive.NS_PER_S}: {written} messages")
