"""libtorrent glue for community history archives: v1 torrent files of a
community's ``data`` and ``index``, a seeder that keeps exactly one torrent,
and a fetch that takes the index first and then only chosen pieces.

libtorrent runs its own threads and its calls return at once; waiting
for it means polling its alerts and status. Each wait here is written
once, as a generator that yields the seconds to sleep before the next
poll: :func:`drive` runs one in a plain thread (the ``archive`` commands),
:func:`drive_async` in a trio task, where every poll is a cancellation
point (a stopping node never waits for a swarm).
"""

from __future__ import annotations

import hashlib
import ipaddress
import logging
import socket
import time
from collections.abc import Callable, Generator, Iterable, Sequence
from pathlib import Path
from typing import TypeVar, cast

import libtorrent as lt
import trio

log = logging.getLogger(__name__)

# libtorrent 2.1.1 refuses a piece size that is not a power of two ("invalid
# piece size") unless create_torrent also gets this flag, which the Python
# binding does not name (create_torrent.hpp: allow_odd_piece_size = 1 << 31).
ALLOW_ODD_PIECE_SIZE = 1 << 31

# The torrent's files, in this order (status-go: info.BuildFromFilePath on
# the community directory, which lists them alphabetically).
FILE_NAMES = ("data", "index")
DATA_FILE, INDEX_FILE = 0, 1

# status-go protocol/communities/manager.go `defaultAnnounceList`.
DEFAULT_TRACKERS = (
    "udp://tracker.opentrackr.org:1337/announce",
    "udp://tracker.openbittorrent.com:6969/announce",
)

# status-go DownloadHistoryArchivesByMagnetlink waits 20 s for the torrent's
# metadata and its caller tries once more on timeout.
METADATA_TIMEOUT_S = 40.0
# Give up on a download after this long without a byte of progress.
DEFAULT_STALL_TIMEOUT_S = 120.0
# Re-dial the given peers this often while none is connected.
REDIAL_S = 2.0
POLL_S = 0.05
# Blocking torrent work in a node (opening a session, hashing files): its
# own threads, so that it neither waits behind the engine's nor holds them.
TORRENT_THREADS = 2
# libtorrent waits this long (s) for trackers to acknowledge "stopped" when
# a session goes away (its default is 5 s), which a stopping node spends.
STOP_TRACKER_TIMEOUT_S = 1
# The longest close_session waits for a session's torrents to be let go.
CLOSE_TIMEOUT_S = 5.0
HASH_CHUNK = 1024 * 1024
# libtorrent 2's default disk I/O maps the files into the process: every
# page fetched or seeded stays resident in this process (file-backed RSS)
# until the kernel needs it, a whole gigabyte of ``data`` for a full fetch.
# The pread backend (libtorrent 2.1) reads and writes with pread/pwrite
# through the page cache, holding only its bounded store buffer. The name
# is the Python binding's (session.cpp set_disk_io); an unknown one falls
# back to the default silently.
DISK_IO = "pread_disk_io_constructor"
# Blocks received and waiting for the disk: libtorrent 2.1.1 allows 100 MiB
# (settings_pack max_queued_disk_bytes); a quarter keeps a loopback fetch
# at full speed (the disk drains faster than peers fill it).
MAX_QUEUED_DISK_BYTES = 32 * 1024 * 1024

PRIORITY_SKIP, PRIORITY_NORMAL, PRIORITY_TOP = 0, 1, 7

_ALERTS = (
    lt.alert_category.error | lt.alert_category.status | lt.alert_category.storage | lt.alert_category.piece_progress
)
# Alerts held between two polls before libtorrent drops some: a piece
# alert per 100 KiB, so a gigabyte fetched within one poll stays below it.
ALERT_QUEUE_SIZE = 50_000


class TorrentError(Exception):
    """A torrent that cannot be created, seeded or fetched."""


T = TypeVar("T")
# A wait on libtorrent: yields the seconds to sleep before polling again,
# returns its result.
Steps = Generator[float, None, T]


def drive(steps: Steps[T]) -> T:
    """Run a wait in this thread (blocking)."""
    try:
        while True:
            time.sleep(next(steps))
    except StopIteration as done:
        return cast(T, done.value)
    finally:
        steps.close()


async def drive_async(steps: Steps[T]) -> T:
    """Run a wait in this trio task; cancellable at every poll (the
    generator's own ``finally`` clauses run then)."""
    try:
        while True:
            await trio.sleep(next(steps))
    except StopIteration as done:
        return cast(T, done.value)
    finally:
        steps.close()


# --- sessions -------------------------------------------------------------------


def open_session(listen: str = "0.0.0.0:0", isolated: bool = False) -> lt.session:
    """One libtorrent session listening on ``host:port`` (port 0: any).

    ``isolated`` turns DHT, local service discovery, UPnP and NAT-PMP off,
    so peers are only those given by address (loopback tests, private
    deployments).
    """
    settings = {
        "listen_interfaces": listen,
        "alert_mask": _ALERTS,
        "alert_queue_size": ALERT_QUEUE_SIZE,
        "user_agent": "wakustore",
        # Peers on one host (loopback tests, containers) share an address.
        "allow_multiple_connections_per_ip": True,
        # Dial peers over TCP: libtorrent tries uTP first and keeps at it
        # against clients without uTP (aria2), which then never connect.
        # Incoming uTP is still accepted.
        "enable_outgoing_utp": False,
        "stop_tracker_timeout": STOP_TRACKER_TIMEOUT_S,
        "max_queued_disk_bytes": MAX_QUEUED_DISK_BYTES,
    }
    if isolated:
        settings.update(enable_dht=False, enable_lsd=False, enable_upnp=False, enable_natpmp=False)
    params = lt.session_params(settings)  # type: ignore[call-overload]  # the binding takes a dict too
    params.disk_io_constructor = DISK_IO
    return lt.session(params)


def parse_host_port(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` for IPv6); ValueError otherwise."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"expected HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port)


# --- torrent files --------------------------------------------------------------


def create_torrent(root: Path, name: str, piece_length: int, trackers: Sequence[str] = DEFAULT_TRACKERS) -> bytes:
    """A v1 torrent of ``root/name/data`` and ``root/name/index`` (in that
    order, torrent name = ``name``); returns its bencoded bytes."""
    paths = [root / name / f for f in FILE_NAMES]
    entries = [lt.create_file_entry(f"{name}/{f}", p.stat().st_size) for f, p in zip(FILE_NAMES, paths)]
    try:
        creator = lt.create_torrent(entries, piece_length, lt.create_torrent.v1_only | ALLOW_ODD_PIECE_SIZE)
    except RuntimeError as exc:
        raise TorrentError(f"cannot create torrent: {exc}") from None
    for piece, digest in enumerate(piece_hashes(paths, piece_length)):
        creator.set_hash(piece, digest)
    for tier, url in enumerate(trackers):
        creator.add_tracker(url, tier)
    creator.set_creator("wakustore")
    return lt.bencode(creator.generate())


def piece_hashes(paths: Iterable[Path], piece_length: int) -> list[bytes]:
    """SHA-1 of each piece of the files laid end to end (BitTorrent v1)."""
    hashes, piece, filled = [], hashlib.sha1(), 0
    for path in paths:
        with open(path, "rb") as f:
            while chunk := f.read(HASH_CHUNK):
                view = memoryview(chunk)
                while view:
                    take = min(len(view), piece_length - filled)
                    piece.update(view[:take])
                    filled += take
                    view = view[take:]
                    if filled == piece_length:
                        hashes.append(piece.digest())
                        piece, filled = hashlib.sha1(), 0
    if filled:
        hashes.append(piece.digest())
    return hashes


def torrent_info(torrent: bytes) -> lt.torrent_info:
    try:
        return lt.torrent_info(lt.bdecode(torrent))  # type: ignore[arg-type]  # the binding takes the decoded dict
    except (RuntimeError, TypeError) as exc:
        raise TorrentError(f"not a torrent file: {exc}") from None


def magnet_uri(torrent: bytes) -> str:
    """The magnet link of a torrent: info hash, name and trackers."""
    return lt.make_magnet_uri(torrent_info(torrent))


def info_hash(torrent: bytes) -> str:
    return str(torrent_info(torrent).info_hashes().v1)


def check_torrent(root: Path, torrent: bytes, name: str, piece_length: int) -> list[str]:
    """What is wrong with ``torrent`` as the torrent of ``root/name``: its
    name, file list and sizes, piece length and every piece hash."""
    try:
        info = torrent_info(torrent)
    except TorrentError as exc:
        return [str(exc)]
    problems = []
    layout = info.layout()
    if info.name() != name:
        problems.append(f"torrent name {info.name()!r}, expected {name!r}")
    if info.piece_length() != piece_length:
        problems.append(f"piece length {info.piece_length()}, expected {piece_length}")
    expected = [f"{name}/{f}" for f in FILE_NAMES]
    listed = [layout.file_path(i).replace("\\", "/") for i in range(layout.num_files())]
    if listed != expected:
        return problems + [f"files {listed}, expected {expected}"]
    paths = [root / name / f for f in FILE_NAMES]
    for i, path in enumerate(paths):
        if not path.is_file():
            return problems + [f"{path} is missing"]
        if path.stat().st_size != layout.file_size(i):
            problems.append(f"{path} is {path.stat().st_size} bytes, the torrent says {layout.file_size(i)}")
    if problems:
        return problems
    actual = piece_hashes(paths, piece_length)
    bad = [i for i in range(info.num_pieces()) if i >= len(actual) or info.hash_for_piece(i) != actual[i]]
    if bad:
        problems.append(f"{len(bad)} piece(s) fail their hash: {bad[:20]}")
    return problems


# --- seeding ---------------------------------------------------------------------


def close_session(session: lt.session, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
    """End ``session``'s work (blocking): pause it and remove its torrents,
    so that their files are flushed and let go, waiting up to ``timeout_s``
    for libtorrent to drop them. The session's own threads then idle until
    the object is dropped. Its owner calls this when it stops."""
    session.pause()
    for handle in session.get_torrents():
        session.remove_torrent(handle)
    deadline = time.monotonic() + timeout_s
    while session.get_torrents() and time.monotonic() < deadline:
        time.sleep(POLL_S)


class Seeder:
    """Seeds one torrent at a time (spec: only the latest torrent is seeded)."""

    def __init__(self, session: lt.session):
        self.session = session
        self.handle: lt.torrent_handle | None = None
        self.torrent: bytes | None = None

    def seed(self, torrent: bytes, save_path: Path, timeout_s: float = 600.0) -> lt.torrent_handle:
        """Drop the previous torrent, add this one over the files in
        ``save_path`` and wait until libtorrent has checked them all (blocking)."""
        return drive(self.seeding(torrent, save_path, timeout_s))

    async def seed_async(self, torrent: bytes, save_path: Path, timeout_s: float = 600.0) -> lt.torrent_handle:
        """:meth:`seed` in a trio task, cancellable while libtorrent checks
        the files (the torrent stays added: :meth:`stop` drops it)."""
        return await drive_async(self.seeding(torrent, save_path, timeout_s))

    def seeding(self, torrent: bytes, save_path: Path, timeout_s: float) -> Steps[lt.torrent_handle]:
        self.stop()
        params = lt.add_torrent_params()
        params.ti = torrent_info(torrent)
        params.save_path = str(save_path)
        self.handle = self.session.add_torrent(params)
        self.torrent = torrent
        deadline = time.monotonic() + timeout_s
        while not self.handle.status().is_seeding:
            self.poll()
            status = self.handle.status()
            if status.errc.value():
                raise TorrentError(f"cannot seed: {status.errc.message()}")
            if time.monotonic() > deadline:
                raise TorrentError(f"files in {save_path} do not match the torrent (state {status.state})")
            yield POLL_S
        return self.handle

    def poll(self) -> None:
        """Drain libtorrent's alerts, logging errors."""
        for alert in self.session.pop_alerts():
            if alert.category() & lt.alert_category.error:
                log.warning("seeder: %s", alert.message())

    @property
    def port(self) -> int:
        return self.session.listen_port()

    def stop(self) -> None:
        if self.handle is not None:
            self.session.remove_torrent(self.handle)
            self.handle = self.torrent = None


# --- fetching ----------------------------------------------------------------------


class Fetch:
    """One torrent fetched from a magnet link into ``save_path``.

    Nothing is downloaded until asked: :meth:`wait_index` fetches the index
    file alone, :meth:`download` exactly the given pieces. Pieces already
    on disk (an earlier fetch of the same append-only data) pass
    libtorrent's hash check and are not downloaded again; ``downloaded``
    holds the pieces that received data from peers.

    The ``wait_*``, :meth:`download` and :meth:`flush` methods are waits
    (:data:`Steps`): run them with :func:`drive` or :func:`drive_async`.
    :meth:`close` removes the torrent from the session, whatever state it
    is in.
    """

    def __init__(
        self,
        session: lt.session,
        magnet: str,
        save_path: Path,
        peers: Sequence[tuple[str, int]] = (),
        report: Callable[[str], None] | None = None,
        progress: Callable[[str, int, int], None] | None = None,
    ):
        self.session = session
        self.peers = list(peers)
        self.report = report or (lambda text: None)
        # (what, done, total) for a bar; without it, counts go to report as lines.
        self.progress = progress
        self.downloaded: set[int] = set()
        self.hash_failures: set[int] = set()
        try:
            params = lt.parse_magnet_uri(magnet)
        except RuntimeError as exc:
            raise TorrentError(f"bad magnet link: {exc}") from None
        params.save_path = str(save_path)
        params.file_priorities = [PRIORITY_SKIP, PRIORITY_TOP]
        self.handle = session.add_torrent(params)
        self._last_dial = 0.0
        self._last_progress = time.monotonic()
        self._checked = False
        self._file_priorities_set = False
        self._flushed = False
        self._done_bytes = -1

    def wait_metadata(self, timeout_s: float = METADATA_TIMEOUT_S) -> Steps[lt.torrent_info]:
        deadline = time.monotonic() + timeout_s
        while not self.handle.status().has_metadata:
            self._tick()
            if time.monotonic() > deadline:
                raise TorrentError(f"no torrent metadata from any peer within {timeout_s:g} s")
            yield POLL_S
        return self._metadata()

    def _metadata(self) -> lt.torrent_info:
        info = self.handle.torrent_file()
        assert info is not None  # only asked once the metadata is in
        return info

    def wait_index(self, stall_timeout_s: float = DEFAULT_STALL_TIMEOUT_S) -> Steps[int]:
        """Fetch the index file (all other pieces skipped); returns its size
        once the file is on disk."""
        layout = (yield from self.wait_metadata()).layout()
        size = layout.file_size(INDEX_FILE)
        yield from self._wait(lambda: self.handle.file_progress()[INDEX_FILE] >= size, stall_timeout_s, "index")
        # Progress counts a piece once it passed its hash check, which can
        # be before the disk thread wrote it (seen under load: the index
        # file did not exist yet when read).
        yield from self.flush()
        return size

    def download(self, pieces: Iterable[int], stall_timeout_s: float = DEFAULT_STALL_TIMEOUT_S) -> Steps[None]:
        """Fetch exactly ``pieces`` (and keep the index); returns when every
        one has passed its hash check."""
        info = self._metadata()
        wanted = set(pieces)
        index_pieces = _file_pieces(info, INDEX_FILE)
        priorities = [
            PRIORITY_TOP if i in wanted or i in index_pieces else PRIORITY_SKIP for i in range(info.num_pieces())
        ]
        # A piece of a skipped file goes to libtorrent's part file, not to
        # `data`: unskip the file, then narrow down piece by piece. File
        # priorities take effect later, through the disk thread, and reset
        # the pieces' priorities then: stay paused until they have.
        self.handle.pause()
        self._tick()  # an earlier file_prio_alert (from the magnet's own priorities) is not this one
        self._file_priorities_set = False
        self.handle.prioritize_files([PRIORITY_NORMAL, PRIORITY_TOP])
        yield from self._wait_for(lambda: self._file_priorities_set, "file priorities")
        self.handle.prioritize_pieces(priorities)
        self.handle.resume()
        # Pausing, or having had all it wanted (the index), dropped the
        # peers: dial them again now rather than in REDIAL_S.
        self._dial()

        reported = [-1]

        def done() -> bool:
            have = self.handle.status().pieces
            count = sum(1 for i in wanted if have[i])
            if count != reported[0]:
                reported[0] = count
                if self.progress is not None:
                    self.progress("pieces", count, len(wanted))
                else:
                    self.report(f"pieces {count}/{len(wanted)}")
            return count == len(wanted)

        yield from self._wait(done, stall_timeout_s, "archive pieces")

    def flush(self, timeout_s: float = 120.0) -> Steps[None]:
        """Wait until every downloaded block is in the files: libtorrent 2
        passes a piece from its store buffer, before the disk thread has
        written it."""
        self._flushed = False
        self.handle.flush_cache()
        yield from self._wait_for(lambda: self._flushed, "the write of downloaded pieces", timeout_s)

    def close(self) -> None:
        """Remove the torrent from the session (files stay; libtorrent
        stops its peers and disk jobs on its own threads)."""
        if self.handle.is_valid():
            self.session.remove_torrent(self.handle)

    def _wait(self, finished: Callable[[], bool], stall_timeout_s: float, what: str) -> Steps[None]:
        self._last_progress = time.monotonic()
        while True:
            self._tick()
            status = self.handle.status()
            if status.errc.value():
                raise TorrentError(f"{what}: {status.errc.message()}")
            if status.total_done != self._done_bytes:
                self._done_bytes, self._last_progress = status.total_done, time.monotonic()
            if status.state not in (lt.torrent_status.checking_files, lt.torrent_status.checking_resume_data):
                if finished():
                    self._tick()  # piece alerts posted since the last drain
                    return
            if time.monotonic() - self._last_progress > stall_timeout_s:
                failed = f"; {len(self.hash_failures)} piece(s) failed their hash check" if self.hash_failures else ""
                raise TorrentError(f"{what}: no data for {stall_timeout_s:g} s ({status.num_peers} peers){failed}")
            yield POLL_S

    def _wait_for(self, condition: Callable[[], bool], what: str, timeout_s: float = 30.0) -> Steps[None]:
        deadline = time.monotonic() + timeout_s
        while not condition():
            if time.monotonic() > deadline:
                raise TorrentError(f"libtorrent did not apply {what} within {timeout_s:g} s")
            yield POLL_S / 5
            self._tick()

    def _tick(self) -> None:
        for alert in self.session.pop_alerts():
            # A piece that passes its hash after the files were checked came
            # from peers; pieces found on disk pass during the check.
            if isinstance(alert, lt.torrent_checked_alert):
                self._checked = True
            elif isinstance(alert, lt.piece_finished_alert) and self._checked:
                self.downloaded.add(alert.piece_index)
            elif isinstance(alert, lt.cache_flushed_alert):
                self._flushed = True
            elif isinstance(alert, lt.file_prio_alert):
                self._file_priorities_set = True
            elif isinstance(alert, lt.hash_failed_alert):
                self.hash_failures.add(alert.piece_index)
                self.report(f"piece {alert.piece_index} failed its hash check")
            elif alert.category() & lt.alert_category.error:
                log.warning("fetch: %s", alert.message())
        if time.monotonic() - self._last_dial > REDIAL_S and self.handle.status().num_peers == 0:
            self._dial()

    def _dial(self) -> None:
        self._last_dial = time.monotonic()
        for peer in self.peers:
            for address in _endpoints(peer):
                self.handle.connect_peer(address)


def _endpoints(peer: tuple[str, int]) -> list[tuple[str, int]]:
    """``peer`` as the (IP, port) endpoints libtorrent dials (it takes no
    host names): a name resolved (the seed peers of a configuration may be
    DNS names); one that does not resolve is logged and skipped until the
    next dial."""
    host, port = peer
    try:
        ipaddress.ip_address(host)
        return [peer]
    except ValueError:
        pass
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        log.warning("fetch: seed peer %s:%d does not resolve: %s", host, port, exc.strerror or exc)
        return []
    return list(dict.fromkeys((str(info[4][0]), port) for info in found))


def _file_pieces(info: lt.torrent_info, file_index: int) -> set[int]:
    layout = info.layout()
    size = layout.file_size(file_index)
    if size == 0:
        return set()
    first = layout.file_offset(file_index) // info.piece_length()
    last = (layout.file_offset(file_index) + size - 1) // info.piece_length()
    return set(range(first, last + 1))
