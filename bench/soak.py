"""Model-based crash test: a real node driven side by side with a reference model.

The node is ``wakustore serve`` in a child process (real engine, real
write-ahead log, real libp2p). The model is a dictionary MUID -> the first
copy the node acknowledged, which is what the table keeps. A seeded random
generator runs steps against both:

- push: lightpush v3 or v2beta1 batches of new messages, exact duplicates
  and same-MUID copies with another timestamp, some sharing a timestamp so
  that ties are broken by hash;
- query: Store v3 (topics, time ranges, hash lookups, both directions,
  hashes only) and legacy v2, paged with the node's cursors to the end;
- flush: wait until the node has committed everything it acknowledged;
- SIGKILL of the node (at a random moment after the last acknowledgement,
  so often in the middle of a commit) and restart; a clean restart;
- SIGKILL of the engine the node supervises;
- SIGKILL, then 16 bytes flipped inside a write-ahead log record that has
  whole records after it (a bad sector): its messages are lost unless a
  commit had landed them (asked), nothing else is, and /health names it;
- maintenance with the node stopped, through the same routine ``serve``
  runs: retention at a cutoff between messages, compaction; and a window
  replace (what an archive import does).

After every step the whole history is paged and compared with the model
(each acknowledged message exactly once, every page identical), plus a few
random query shapes. The model computes its own pages from the Store rules
as the specification states them: it must not share code with the node,
or it would agree with the node's mistakes.

``wakustore soak --minutes N`` runs it as long as asked; the test suite runs
a bounded number of steps. Seeds are printed so a failure can be replayed.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from wakustore.bench.common import wait_for_node_info
from wakustore.protocols.message import WakuMessage, message_hash, muid
from wakustore.protocols.store_query import HistoryQuery, Ordering, StatusCode

if TYPE_CHECKING:
    from wakustore.storage.engine import Engine

CLUSTER_ID = 77
SHARDS = (0, 3)
PUBSUB_TOPICS = tuple(f"/waku/2/rs/{CLUSTER_ID}/{s}" for s in SHARDS)
CONTENT_TOPICS = ("/soak/1/alpha/proto", "/soak/1/beta/proto", "/soak/1/gamma/proto")

# How long the node may take to start (engine start, log replay, hot tier)
# and to answer once the engine was killed (the supervisor restarts it).
START_TIMEOUT_S = 120.0
RECOVERY_TIMEOUT_S = 90.0
# Commits about three times a second, so kills often land mid-commit.
FLUSH_INTERVAL_S = 0.3
MAINTENANCE_INTERVAL_S = 10.0
# Keep the history small enough that a full comparison after every step
# stays cheap; retention brings it back below this.
MAX_MODEL_MESSAGES = 1500
# Exact duplicates are re-sent only while the node's drift check (20 s)
# still accepts their timestamp, as a client retrying would.
DUPLICATE_AGE_NS = 12 * 10**9

STEPS = (
    "push",
    "relay",
    "flush",
    "kill",
    "kill_mid_push",
    "restart",
    "kill_engine",
    "maintain",
    "replace",
    "damage_log",
)
STEP_WEIGHTS = (14, 5, 2, 2, 2, 1, 1, 1, 1, 1)


class Mismatch(Exception):
    """The node and the model disagree."""


# --- the model --------------------------------------------------------------


@dataclass(frozen=True)
class Entry:
    pubsub_topic: str
    message: WakuMessage
    hash: bytes
    digest: bytes

    @property
    def timestamp(self) -> int:
        return self.message.timestamp


def entry(pubsub_topic: str, message: WakuMessage) -> Entry:
    return Entry(
        pubsub_topic,
        message,
        message_hash(pubsub_topic, message),
        hashlib.sha256(message.content_topic.encode() + message.payload).digest(),
    )


@dataclass
class Model:
    rows: dict[bytes, Entry] = field(default_factory=dict)  # MUID -> first copy

    def add(self, pubsub_topic: str, message: WakuMessage) -> None:
        self.rows.setdefault(muid(pubsub_topic, message), entry(pubsub_topic, message))

    def retain(self, cutoff_ns: int) -> None:
        self.rows = {k: e for k, e in self.rows.items() if e.timestamp >= cutoff_ns}

    def replace_window(self, start: int, end: int, topics: set[str], entries: list[Entry]) -> None:
        self.rows = {
            k: e for k, e in self.rows.items() if not (start <= e.timestamp < end and e.message.content_topic in topics)
        }
        for e in entries:
            self.rows.setdefault(muid(e.pubsub_topic, e.message), e)

    def v3_pages(self, query: HistoryQuery) -> list[list[Entry]]:
        """Store v3 as the specification states it: matches ordered by
        (timestamp, hash), pages of ``limit`` in query direction, each page
        in ascending order."""
        matches = [e for e in self.rows.values() if _matches(query, e)]
        return _chunk(matches, query, lambda e: (e.timestamp, e.hash))

    def v2_pages(self, query: HistoryQuery) -> list[list[Entry]]:
        matches = [e for e in self.rows.values() if _matches(query, e)]
        return _chunk(matches, query, lambda e: (e.timestamp, e.digest))


def _matches(query: HistoryQuery, e: Entry) -> bool:
    if query.message_hashes:
        if e.hash not in query.message_hashes:
            return False
    elif query.content_topics and e.message.content_topic not in query.content_topics:
        return False
    if query.pubsub_topic is not None and e.pubsub_topic != query.pubsub_topic:
        return False
    if query.time_start is not None and e.timestamp < query.time_start:
        return False
    if query.time_end is not None and e.timestamp >= query.time_end:
        return False
    return True


def _chunk(matches: list[Entry], query: HistoryQuery, key) -> list[list[Entry]]:
    """Pages of ``limit`` in query direction, each in ascending order."""
    matches.sort(key=key, reverse=not query.forward)
    limit = query.limit
    pages = [sorted(matches[i : i + limit], key=key) for i in range(0, len(matches), limit)]
    return pages or [[]]


# --- the node ---------------------------------------------------------------


class NodeProcess:
    """``wakustore serve`` in a child process on kernel-chosen ports."""

    def __init__(
        self,
        data_dir: Path,
        log_path: Path,
        config_path: Path | None = None,
        flush_interval_s: float = FLUSH_INTERVAL_S,
    ):
        self.data_dir = data_dir
        self.log_path = log_path
        self.process: subprocess.Popen | None = None
        self.peer = ""
        self.metrics_port = 0
        self.config_path = config_path or data_dir.parent / f"{data_dir.name}.toml"
        self.config_path.write_text(
            f'data_dir = "{data_dir}"\n'
            'listen_host = "127.0.0.1"\n'
            "tcp_port = 0\nws_port = 0\nmetrics_port = 0\nmailserver_port = 0\n"
            f"cluster_id = {CLUSTER_ID}\nshards = {list(SHARDS)}\n"
            f"flush_interval_s = {flush_interval_s}\n"
            # The node's own maintenance (retention of 30 days: nothing here
            # is that old; compaction racing the commits) runs all along.
            f"maintenance_interval_s = {MAINTENANCE_INTERVAL_S}\n"
            # Every client of the soak dials from 127.0.0.1, as many
            # remote hosts would: the per-address cap is for those.
            "ip_colocation_limit = 0\n"
        )

    def start(self) -> None:
        info = self.data_dir / "node-info.json"
        info.unlink(missing_ok=True)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "wakustore",
                    "serve",
                    "--config",
                    str(self.config_path),
                    "--rate-limit",
                    "store:0/1s",
                    "--rate-limit",
                    "lightpush:0/1s",
                ],
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        data = wait_for_node_info(self.process, self.data_dir, START_TIMEOUT_S, "the node", self.log_path)
        self.peer = next(a for a in data["multiaddrs"] if "/ws" not in a)
        self.metrics_port = data["metrics_port"]

    def health(self) -> dict:
        url = f"http://127.0.0.1:{self.metrics_port}/health"
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            return json.loads(exc.read() or b"{}")

    def kill(self) -> None:
        """SIGKILL the node and everything it started (its engine too)."""
        if self.process is None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait()
        self.process = None

    def stop(self) -> None:
        if self.process is None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.kill()
            raise RuntimeError("the node did not stop within 120 s of SIGTERM") from None
        code = self.process.returncode
        self.process = None
        if code != 0:
            raise RuntimeError(f"the node exited with {code} on SIGTERM; see {self.log_path}")

    def kill_engine(self) -> bool:
        import psutil

        if self.process is None:
            return False
        for child in psutil.Process(self.process.pid).children(recursive=True):
            try:
                if "sail" in " ".join(child.cmdline()):
                    child.kill()
                    return True
            except psutil.Error:
                continue
        return False


# --- the run ----------------------------------------------------------------


@dataclass
class Totals:
    steps: int = 0
    node_kills: int = 0
    engine_kills: int = 0
    restarts: int = 0
    maintenance: int = 0
    pushed: int = 0
    pages: int = 0
    mismatches: int = 0

    def line(self) -> str:
        return (
            f"soak: {self.steps} steps, {self.pushed} messages pushed, {self.node_kills} node kills, "
            f"{self.engine_kills} engine kills, {self.restarts} restarts, {self.maintenance} maintenance runs, "
            f"{self.pages} pages compared, {self.mismatches} mismatches"
        )


class Soak:
    steps: tuple[str, ...] = STEPS
    weights: tuple[int, ...] = STEP_WEIGHTS

    def __init__(self, work_dir: Path, seed: int, report: Callable[[str], None] = print, verbose: bool = False):
        self.verbose = verbose
        self.rng = random.Random(seed)
        self.seed = seed
        self.work_dir = work_dir
        self.data_dir = work_dir / "node"
        self.node = NodeProcess(self.data_dir, work_dir / "node.log")
        self.model = Model()
        self.totals = Totals()
        self.report = report
        self.counter = 0
        self.sent: list[tuple[str, WakuMessage]] = []  # everything acknowledged, for duplicates
        self._engine: Engine | None = None

    # -- driving ----------------------------------------------------------

    def run(self, max_steps: int | None = None, deadline: float | None = None, schedule: Sequence[str] = ()) -> Totals:
        """Steps until ``max_steps`` or the monotonic ``deadline``; the
        first ones as ``schedule`` names them (e.g. every kind once)."""
        self.report(f"soak: seed {self.seed}, data in {self.work_dir}")
        self.node.start()
        planned = list(schedule)
        try:
            while (max_steps is None or self.totals.steps < max_steps) and (
                deadline is None or time.monotonic() < deadline
            ):
                self.step(planned.pop(0) if planned else None)
        finally:
            self.node.kill()
            if self._engine is not None:
                self._engine.close()
        return self.totals

    def step(self, choice: str | None = None) -> None:
        if choice is None:
            choice = self.rng.choices(self.steps, weights=self.weights)[0]
        self.totals.steps += 1
        started = time.monotonic()
        stepped = started
        try:
            getattr(self, f"_step_{choice}")()
            stepped = time.monotonic()
            self.check()
        except Mismatch as exc:
            self.totals.mismatches += 1
            self.report(f"soak: MISMATCH after step {self.totals.steps} ({choice}), seed {self.seed}: {exc}")
            raise
        if self.verbose:
            self.report(
                f"soak: step {self.totals.steps} {choice} {stepped - started:.1f} s, "
                f"check {time.monotonic() - stepped:.1f} s, {len(self.model.rows)} messages"
            )

    def _step_push(self) -> None:
        batch = self._messages(self.rng.randint(1, 25))
        legacy = self.rng.random() < 0.3
        self._trio(self._push, batch, legacy)

    def _step_relay(self) -> None:
        self._trio(self._relay, self._messages(self.rng.randint(1, 15)))

    def _step_flush(self) -> None:
        # A bad data file leaves /health ok (the node serves around it): here it is a failure.
        self._wait(
            lambda h: h.get("ok") and not h.get("bad_files") and h.get("pending_messages") == 0,
            "the buffer to be committed",
        )

    def _step_kill(self) -> None:
        # Often right after acknowledgements, while the node commits them.
        time.sleep(self.rng.random() * 3 * FLUSH_INTERVAL_S)
        self.node.kill()
        self.totals.node_kills += 1
        self.node.start()

    def _step_kill_mid_push(self) -> None:
        """SIGKILL while a push stream runs, as an operator's kill -9 lands:
        what was acknowledged is there once; the message in flight may be."""
        in_flight: list = []
        self._trio(
            self._push_until_killed, self._messages(self.rng.randint(20, 60)), self.rng.random() * 1.5, in_flight
        )
        self.node.kill()  # when the pushes ended before the kill
        self.totals.node_kills += 1
        self.node.start()
        if in_flight:
            self._trio(self._resolve, list(in_flight))

    def _step_damage_log(self) -> None:
        self._trio(self._push, self._messages(self.rng.randint(5, 25)), False)
        self.node.kill()
        self.totals.node_kills += 1
        damaged = self._damage_log_record()
        self.node.start()
        if damaged is not None:
            segment, at, keys = damaged
            self._wait(
                lambda h: any(d["segment"] == segment and d["start"] <= at < d["end"] for d in h.get("wal_damage", ())),
                "/health to name the damaged log record",
            )
            # Lost, unless a commit had landed them before the kill: ask.
            doubt = [self.model.rows.pop(key) for key in keys if key in self.model.rows]
            self._trio(self._resolve, [(e.pubsub_topic, e.message) for e in doubt])

    def _damage_log_record(self) -> tuple[str, int, list[bytes]] | None:
        """Flip 16 bytes in the body of a random record (not the newest
        segment's last: that would be a torn tail) of the messages' log;
        returns (segment, offset, the MUIDs the record held), None when the
        log holds no such record."""
        from wakustore.storage.write_path import read_batch_record

        segments = sorted((self.data_dir / "wal" / "messages").glob("*.wal"), key=lambda p: int(p.stem))
        records = []  # (segment, start of body, end) of each record, up to any damage an earlier step left
        for index, path in enumerate(segments):
            data, at, found = path.read_bytes(), 0, []
            while at + 8 <= len(data) and (length := int.from_bytes(data[at : at + 4], "big")) > 0:
                if zlib.crc32(data[at + 8 : at + 8 + length]) != int.from_bytes(data[at + 4 : at + 8], "big"):
                    break
                found.append((path, at + 8, at + 8 + length))
                at += 8 + length
            records += found if index < len(segments) - 1 else found[:-1]
        if not records:
            return None
        path, start, end = self.rng.choice(records)
        data = path.read_bytes()
        keys = read_batch_record(data[start:end]).column("muid").to_pylist()
        at = self.rng.randrange(start, end - 16)
        with open(path, "r+b") as handle:
            handle.seek(at)
            handle.write(bytes(b ^ 0xFF for b in data[at : at + 16]))
            os.fsync(handle.fileno())
        return str(path), at, keys

    def _step_restart(self) -> None:
        self.node.stop()
        self.totals.restarts += 1
        self.node.start()

    def _step_kill_engine(self) -> None:
        if self.node.kill_engine():
            self.totals.engine_kills += 1

    def _step_maintain(self) -> None:
        """Retention at a cutoff between messages, then compaction, with
        the node stopped (one writer per data dir), as ``db retention`` runs."""
        stamps = sorted({e.timestamp for e in self.model.rows.values()})
        if len(stamps) < 4:
            return
        drop = len(stamps) // 3 if len(self.model.rows) < MAX_MODEL_MESSAGES else len(stamps) // 2
        cutoff = stamps[self.rng.randint(1, max(1, drop))]
        self._offline(lambda store: self._retain(store, cutoff))
        self.model.retain(cutoff)
        self.totals.maintenance += 1

    def _step_replace(self) -> None:
        """Replace a window of one topic, as an archive import does: keep
        part of what is there, add messages never seen."""
        if not self.model.rows:
            return
        pivot = self.rng.choice(list(self.model.rows.values()))
        start, end = pivot.timestamp - 2 * 10**9, pivot.timestamp + 2 * 10**9
        topic = pivot.message.content_topic
        inside = [
            e for e in self.model.rows.values() if start <= e.timestamp < end and e.message.content_topic == topic
        ]
        kept = [e for e in inside if self.rng.random() < 0.6]
        added = []
        for _ in range(self.rng.randint(0, 4)):
            pubsub, message = self._new_message(start + self.rng.randrange(end - start), topic)
            added.append(entry(pubsub, message))
        rows = kept + added

        def replace(store):
            from wakustore.storage.rows import Row

            store.replace_window(start, end, [topic], [Row.build(e.pubsub_topic, e.message, e.timestamp) for e in rows])

        self._offline(replace)
        self.model.replace_window(start, end, {topic}, rows)
        self.totals.maintenance += 1

    # -- checking ---------------------------------------------------------

    def check(self) -> None:
        """The node's own maintenance succeeds; the whole history, topic by
        topic, then a few random shapes."""
        maintenance = self.node.health().get("maintenance") or {}
        if maintenance.get("ok") is False:
            raise Mismatch(f"the node's maintenance failed: {maintenance.get('error')}")
        for pubsub in PUBSUB_TOPICS:
            query = HistoryQuery(pubsub_topic=pubsub, content_topics=CONTENT_TOPICS, forward=True, limit=100)
            self._trio(self._compare_v3, query)
        for _ in range(self.rng.randint(1, 3)):
            if self.rng.random() < 0.3:
                self._trio(self._compare_v2, self._random_query(v2=True))
            else:
                self._trio(self._compare_v3, self._random_query())

    def _random_query(self, v2: bool = False) -> HistoryQuery:
        rng = self.rng
        entries = list(self.model.rows.values())
        forward = rng.random() < 0.5
        limit = rng.choice([1, 2, 3, 5, 20, 100])
        start = end = None
        if entries and rng.random() < 0.6:
            a, b = sorted(rng.choice(entries).timestamp + rng.choice([-1, 0, 1]) for _ in range(2))
            start = a if rng.random() < 0.8 else None
            end = b if rng.random() < 0.8 else None
        pubsub = rng.choice(PUBSUB_TOPICS)
        if not v2 and entries and rng.random() < 0.25:
            hashes = tuple(dict.fromkeys(rng.choice(entries).hash for _ in range(rng.randint(1, 8))))
            if rng.random() < 0.3:
                hashes += (os.urandom(32),)
            return HistoryQuery(
                pubsub_topic=pubsub if rng.random() < 0.5 else None,
                message_hashes=hashes,
                forward=forward,
                limit=limit,
                include_data=rng.random() < 0.7,
            )
        topics = tuple(rng.sample(CONTENT_TOPICS, rng.randint(1, len(CONTENT_TOPICS))))
        return HistoryQuery(
            pubsub_topic=pubsub,
            content_topics=topics,
            time_start=start,
            time_end=end,
            forward=forward,
            limit=limit,
            include_data=v2 or rng.random() < 0.8,
            ordering=Ordering.DIGEST if v2 else Ordering.MESSAGE_HASH,
        )

    async def _compare_v3(self, query: HistoryQuery) -> None:
        from wakustore.clients.store import StoreClient

        expected = self.model.v3_pages(query)
        async with StoreClient.connect(self.node.peer, timeout_s=60) as client:
            cursor = None
            for number, want in enumerate(expected):
                response = await self._answered(lambda c=cursor: client.query(dataclasses.replace(query, cursor=c)))
                self.totals.pages += 1
                got = [(m.message_hash, m.pubsub_topic, m.message) for m in response.messages]
                wanted = [
                    (e.hash, e.pubsub_topic if query.include_data else None, e.message if query.include_data else None)
                    for e in want
                ]
                if got != wanted:
                    raise Mismatch(f"v3 {query} page {number}: got {_describe(got)}, expected {_describe(wanted)}")
                last = number == len(expected) - 1
                if last and response.cursor is not None:
                    raise Mismatch(f"v3 {query} page {number}: a cursor after the last page")
                if not last:
                    if response.cursor is None:
                        raise Mismatch(
                            f"v3 {query} page {number}: no cursor, {len(expected) - number - 1} pages missing"
                        )
                    cursor = response.cursor

    async def _compare_v2(self, query: HistoryQuery) -> None:
        from wakustore.clients.store import StoreClient
        from wakustore.protocols.store_v2 import HistoryError

        expected = self.model.v2_pages(query)
        request = dict(
            pubsub_topic=query.pubsub_topic,
            content_topics=list(query.content_topics),
            start_time=query.time_start,
            end_time=query.time_end - 1 if query.time_end is not None else None,
            page_size=query.limit,
            forward=query.forward,
        )
        async with StoreClient.connect(self.node.peer, timeout_s=60) as client:
            for number, want in enumerate(expected):
                result = await self._answered(lambda: client.query_legacy(**request), legacy=True)
                if result.error != HistoryError.NONE:
                    raise Mismatch(f"v2 {query} page {number}: error {result.error!r}")
                self.totals.pages += 1
                got = [m for m in result.messages]
                wanted = [e.message for e in want]
                if got != wanted:
                    raise Mismatch(
                        f"v2 {query} page {number}: got {len(got)} messages "
                        f"{[m.payload[:12] for m in got]}, expected {[m.payload[:12] for m in wanted]}"
                    )
                last = number == len(expected) - 1
                if not last and result.cursor is None:
                    raise Mismatch(f"v2 {query} page {number}: no cursor, {len(expected) - number - 1} pages missing")
                if last and result.cursor is not None:
                    raise Mismatch(f"v2 {query} page {number}: a cursor after the last page")
                request["cursor"] = result.cursor

    async def _answered(self, ask, legacy: bool = False):
        """Ask until the node answers (it answers 503 while its engine restarts)."""
        from wakustore.protocols.store_v2 import HistoryError

        deadline = trio.current_time() + RECOVERY_TIMEOUT_S
        while True:
            response = await ask()
            busy = (
                (response.error == HistoryError.SERVICE_UNAVAILABLE)
                if legacy
                else (response.status_code == StatusCode.SERVICE_UNAVAILABLE)
            )
            if not busy:
                if not legacy and response.status_code != StatusCode.OK:
                    raise Mismatch(f"status {response.status_code} {response.status_desc}")
                return response
            if trio.current_time() > deadline:
                raise Mismatch(f"still 503 after {RECOVERY_TIMEOUT_S:g} s")
            await trio.sleep(0.5)

    # -- helpers ----------------------------------------------------------

    async def _push(self, batch: list[tuple[str, WakuMessage]], legacy: bool, in_flight: list | None = None) -> None:
        from wakustore.clients.store import StoreClient
        from wakustore.protocols.lightpush import LightpushStatus

        async with StoreClient.connect(self.node.peer, timeout_s=60) as client:
            for pubsub, message in batch:
                if in_flight is not None:
                    in_flight[:] = [(pubsub, message)]
                deadline = trio.current_time() + RECOVERY_TIMEOUT_S
                while True:
                    if legacy:
                        response = await client.push_legacy(pubsub, message)
                        ok, busy = response.is_success, "busy" in (response.info or "").lower()
                    else:
                        response = await client.push(pubsub, message)
                        ok = response.status_code == LightpushStatus.SUCCESS
                        busy = response.status_code == LightpushStatus.SERVICE_NOT_AVAILABLE
                    if ok:
                        break
                    if not busy or trio.current_time() > deadline:
                        raise Mismatch(f"push refused: {response}")
                    await trio.sleep(0.5)
                self.model.add(pubsub, message)
                self.sent.append((pubsub, message))
                self.totals.pushed += 1
                if in_flight is not None:
                    in_flight.clear()

    async def _push_until_killed(self, batch: list[tuple[str, WakuMessage]], delay_s: float, in_flight: list) -> None:
        """Push ``batch`` while the node is SIGKILLed after ``delay_s``."""
        kill_sent = False

        async def killer() -> None:
            nonlocal kill_sent
            await trio.sleep(delay_s)
            kill_sent = True
            await trio.to_thread.run_sync(self.node.kill)

        async def pusher() -> None:
            try:
                await self._push(batch, legacy=self.rng.random() < 0.3, in_flight=in_flight)
            except BaseException as exc:
                mismatch, _ = (
                    exc.split(Mismatch)
                    if isinstance(exc, BaseExceptionGroup)
                    else ((exc, None) if isinstance(exc, Mismatch) else (None, exc))
                )
                if mismatch is not None or not kill_sent or isinstance(exc, trio.Cancelled):
                    raise

        async with trio.open_nursery() as nursery:
            nursery.start_soon(killer)
            nursery.start_soon(pusher)

    async def _resolve(self, in_flight: list[tuple[str, WakuMessage]]) -> None:
        """A message in flight at the kill may or may not be stored: ask."""
        from wakustore.clients.store import StoreClient

        hashes = {message_hash(p, m): (p, m) for p, m in in_flight}
        async with StoreClient.connect(self.node.peer, timeout_s=60) as client:
            response = await self._answered(
                lambda: client.query(HistoryQuery(message_hashes=tuple(hashes), limit=100, include_data=False))
            )
        for found in response.messages:
            self.model.add(*hashes[found.message_hash])

    async def _relay(self, batch: list[tuple[str, WakuMessage]]) -> None:
        """Publish on relay; relay has no acknowledgement, so a message
        counts as acknowledged once a hash lookup finds it."""
        from wakustore.bench.relay_peer import relay_publisher
        from wakustore.clients.store import StoreClient
        from wakustore.protocols.message_codec import encode_message

        awaited = {}
        async with (
            relay_publisher(self.node.peer, list(PUBSUB_TOPICS)) as (pubsub, _host, _peer),
            StoreClient.connect(self.node.peer, timeout_s=60) as client,
        ):
            for pubsub_topic, message in batch:
                await pubsub.publish(pubsub_topic, encode_message(message))
                key: bytes | None = muid(pubsub_topic, message)
                if key not in self.model.rows and key not in awaited:
                    awaited[key] = (pubsub_topic, message)
            # Looked up while the publisher is still connected: closing it
            # could drop what it has not yet written.
            deadline = trio.current_time() + RECOVERY_TIMEOUT_S
            while awaited:
                hashes = {message_hash(p, m): key for key, (p, m) in awaited.items()}
                query = HistoryQuery(message_hashes=tuple(hashes)[:100], limit=100, include_data=False)
                response = await self._answered(lambda q=query: client.query(q))
                for found in response.messages:
                    key = hashes.get(found.message_hash)
                    if key is not None:
                        self.model.add(*awaited.pop(key))
                        self.totals.pushed += 1
                if awaited and trio.current_time() > deadline:
                    raise Mismatch(f"{len(awaited)} relayed messages never stored")
                if awaited:
                    await trio.sleep(0.2)
        # Duplicates were published too; they must not show (checked next).
        self.sent.extend(batch)

    def _messages(self, count: int) -> list[tuple[str, WakuMessage]]:
        out = []
        now = time.time_ns()
        tick = now - self.rng.randrange(5 * 10**9)
        for _ in range(count):
            r = self.rng.random()
            recent = [(p, m) for p, m in self.sent[-200:] if now - m.timestamp < DUPLICATE_AGE_NS]
            if recent and r < 0.15:
                out.append(self.rng.choice(recent))  # an exact duplicate, within the drift window
            elif self.sent and r < 0.25:
                pubsub, old = self.rng.choice(self.sent)  # same MUID, another timestamp
                out.append((pubsub, dataclasses.replace(old, timestamp=now - self.rng.randrange(10**9))))
            else:
                # Every fourth shares a timestamp: ties are broken by hash.
                stamp = tick if self.rng.random() < 0.25 else now - self.rng.randrange(5 * 10**9)
                out.append(self._new_message(stamp))
        return out

    def _new_message(self, timestamp: int, topic: str | None = None) -> tuple[str, WakuMessage]:
        self.counter += 1
        payload = f"soak {self.seed} #{self.counter} ".encode() + self.rng.randbytes(self.rng.randint(0, 64))
        meta = self.rng.randbytes(8) if self.rng.random() < 0.2 else b""
        return self.rng.choice(PUBSUB_TOPICS), WakuMessage(
            payload=payload,
            content_topic=topic or self.rng.choice(CONTENT_TOPICS),
            meta=meta,
            timestamp=timestamp,
        )

    @staticmethod
    def _trio(function, *args) -> None:
        """Run ``function`` in trio; a Mismatch leaves the libp2p host's
        nursery wrapped in exception groups: hand it back unwrapped."""
        try:
            trio.run(function, *args)
        except BaseExceptionGroup as group:
            mismatch: BaseException | None
            mismatch, _ = group.split(Mismatch)
            while isinstance(mismatch, BaseExceptionGroup):
                mismatch = mismatch.exceptions[0]
            if mismatch is not None:
                raise mismatch from None
            raise

    def _wait(self, ready: Callable[[dict], object], what: str) -> None:
        deadline = time.monotonic() + RECOVERY_TIMEOUT_S
        last: dict | str = "no answer"
        while time.monotonic() < deadline:
            try:
                last = self.node.health()
                if ready(last):
                    return
            except OSError as exc:
                last = f"no answer: {exc}"
            time.sleep(0.1)
        raise Mismatch(f"timed out waiting for {what}; the node's last /health: {_why_not_ok(last)}")

    def _offline(self, work: Callable) -> None:
        """Stop the node, run ``work(store)`` on its data dir, start it again."""
        from wakustore.storage.engine import Engine

        if self.rng.random() < 0.5:
            self.node.kill()
            self.totals.node_kills += 1
        else:
            self.node.stop()
        if self._engine is None:
            self._engine = Engine("embedded")
            self._engine.start()
        from wakustore.node.config import NodeConfig
        from wakustore.node.store_service import open_store

        config = NodeConfig(data_dir=self.data_dir, cluster_id=CLUSTER_ID, shards=list(SHARDS)).validate()
        _, store = open_store(config, engine=self._engine)
        try:
            work(store)
        finally:
            store.close()
        self.node.start()

    @staticmethod
    def _retain(store, cutoff_ns: int, today: dt.date | None = None) -> dict[str, int]:
        """Retention at ``cutoff_ns``, then compaction as of ``today`` (a
        later day: today's files are rewritten as a finished day's)."""
        from wakustore.storage import maintenance

        maintenance.delete_before(store.table, cutoff_ns)
        store.forget_before(cutoff_ns)
        return maintenance.compact(store.table, today=today or dt.datetime.now(dt.UTC).date())


def _why_not_ok(health: dict | str) -> str:
    """The parts of a /health answer that say why it is not ok."""
    if isinstance(health, str):
        return health
    parts = {key: health.get(key) for key in ("ok", "pending_messages", "wal_depth", "commit", "maintenance")}
    parts.update(
        engine=health.get("engine"),
        bad_files=health.get("bad_files"),
        disk_full=(health.get("disk") or {}).get("full"),
    )
    return json.dumps(parts, default=str)[:2000]


def _describe(entries: list) -> str:
    return f"{len(entries)} [" + ", ".join(h.hex()[:8] for h, *_ in entries[:12]) + "]"


# --- command line -------------------------------------------------------------


def run_soak(args: argparse.Namespace) -> int:
    seed = args.seed if args.seed is not None else int(time.time())
    from wakustore.usage import UsageError

    work = args.work_dir or Path(tempfile.mkdtemp(prefix="wakustore-soak-"))
    if (work / "node").exists():
        raise UsageError(f"--work-dir: {work / 'node'} exists; the soak starts from an empty node")
    work.mkdir(parents=True, exist_ok=True)
    from wakustore.clients.store import quiet_libp2p

    quiet_libp2p()  # the node is killed mid-request on purpose: no dial errors on stderr
    soak = Soak(work, seed, report=lambda line: print(line, flush=True), verbose=args.verbose)
    deadline = time.monotonic() + args.minutes * 60
    try:
        soak.run(deadline=deadline)
    except Mismatch:
        print(soak.totals.line(), flush=True)
        return 1
    print(soak.totals.line(), flush=True)
    if args.work_dir is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0
