"""The Spark Connect engine behind the message store.

:class:`Engine` owns the one PySpark Spark Connect session the storage
layer uses, on one of three targets:

- ``"sail"`` (the default; ``"embedded"`` is the same): a Sail server on
  loopback that the engine starts as a child process
  (:mod:`wakustore.storage.sail_server`) and supervises. Sail's memory
  grows with every MERGE and is never returned
  (``reference/engine-notes.md``), so the child is restarted when its
  resident memory passes a ceiling, when it dies, or on demand.
- ``"spark"``: Apache Spark's own Spark Connect server with Delta Lake
  (:mod:`wakustore.storage.spark_server`), a JVM on loopback, started and
  supervised the same way; its heap is bounded by the JVM
  (``spark_driver_memory``), so no memory ceiling applies.
- ``"sc://host:port"``: a remote Spark Connect server (Spark 4 with Delta
  Lake, or a Sail cluster; :attr:`Engine.kind` says which once connected).
  The engine only connects, and reconnects after a failure; it never
  restarts a server it does not own.

Everything blocks; the node calls it from ``trio.to_thread.run_sync``
worker threads, and every method is safe to call from several threads at
once. A restart pauses callers instead of failing them: :meth:`Engine.run`
and :meth:`Engine.session` wait (up to ``wait_timeout_s``) until the engine
answers again, and :meth:`Engine.run` retries its function once when the
engine failed under it. Nothing here runs in the background: the node calls
:meth:`Engine.supervise` on its own schedule (a health check that also
keeps the server-side session from expiring when the node is idle).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import subprocess
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from wakustore.storage import dialect, engine_process, sail_server, spark_jars, spark_server

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

T = TypeVar("T")

SAIL = dialect.SAIL
SPARK = dialect.SPARK
# The name the Sail target had before there were two embedded engines.
EMBEDDED = "embedded"
OWNED_TARGETS = (SAIL, SPARK, EMBEDDED)
REMOTE_SCHEME = "sc://"
LOOPBACK = "127.0.0.1"

# Sail's MERGE adds ~11-14 MB of resident memory per 11k-row batch and never
# returns it (engine-notes: 2.3 GB after 200 MERGEs); appends plateau near
# 0.3 GB and query-only servers at 0.35-0.6 GB. 2 GiB leaves room for ~130
# MERGE batches between restarts on a fresh server (~0.15-0.3 GB).
DEFAULT_MEMORY_CEILING_BYTES = 2 * 1024**3

# Spawning the child, importing pysail and listening took ~0.05 s and the
# first SELECT 1 ~0.6 s more on a 2-core machine; 30 s covers a loaded host.
START_TIMEOUT_S = 30.0
# Spark's JVM listened after 8 s on an idle 2-core machine and 19 s on a
# loaded one; its first session takes a few more.
SPARK_START_TIMEOUT_S = 120.0

# A SELECT 1 round trip costs 5-8 ms on Sail (engine-notes); an engine that
# has not answered within 5 s is treated as failed.
PROBE_TIMEOUT_S = 5.0
# Spark plans a SELECT 1 in a few ms too, but a JVM in a full garbage
# collection or compiling a MERGE's code on a busy 2-core host stalls for
# seconds, and a new session's first query took 10 s on a loaded one. A
# remote endpoint may be either engine: it gets Spark's bound.
SPARK_PROBE_TIMEOUT_S = 20.0

# How long run()/session() wait for a restart before raising
# EngineUnavailable: one full start plus one failed probe (of the engine's
# own bounds: 35 s for Sail, 140 s for Spark).

# A planned restart (memory ceiling, recycle()) lets operations already
# running finish first, up to this bound. A MERGE of one batch takes
# 0.2-1.1 s (engine-notes); 30 s covers a large one on a busy host.
DRAIN_TIMEOUT_S = 30.0

# Grace between SIGTERM and SIGKILL when stopping the child, and the bound
# on closing a client whose server may not answer.
STOP_TIMEOUT_S = 5.0
# The Spark child gives its JVM this long to run its shutdown hooks.
SPARK_STOP_TIMEOUT_S = spark_server.JVM_STOP_TIMEOUT_S + STOP_TIMEOUT_S

# Client-side retries of an RPC that failed as UNAVAILABLE, with PySpark's
# exponential backoff (50 ms, x4 per retry). PySpark's own default (15
# retries, up to 60 s apart) waits at least 10 minutes on a dead server,
# even at interpreter exit. Locally a dead server is the child dying, which
# supervision handles: 2 retries give up after 0.25 s. A remote server may
# blip: 3 retries ride out ~1 s. One spark.sql(...).collect() makes two
# ExecutePlan calls, each retried, so a dead remote fails in ~2-3 s.
CLIENT_RETRIES_EMBEDDED = 2
# pyspark warns when its client gives up retrying; the engine handles that
# itself (reconnects, restarts a dead child, reports EngineUnavailable on
# one line), and the warning would land on a command's stderr after its
# own last line.
warnings.filterwarnings("ignore", message=r"\[RETRIES_EXCEEDED\]", category=UserWarning)
CLIENT_RETRIES_REMOTE = 3
CLIENT_INITIAL_BACKOFF_MS = 50
CLIENT_BACKOFF_MULTIPLIER = 4.0
CLIENT_MAX_BACKOFF_MS = 1000

# Error text from gRPC spans many lines; messages keep this much of it.
DESCRIBE_MAX_CHARS = 300
_GRPC_FAILURE = re.compile(r'status = StatusCode\.(?P<code>\w+) details = "(?P<details>[^"]*)"')

# Sail configuration for the embedded server (key ``a.b_c`` is variable
# ``SAIL_A__B_C``; pysail 0.7.2 defaults both to false). Filter pushdown
# into the Parquet decoder is the largest query-latency lever measured
# (engine-notes: 30-day page 455 -> 39 ms). The process environment
# overrides these, and the ``sail_env`` argument overrides both.
SAIL_DEFAULT_ENV = {
    "SAIL_PARQUET__PUSHDOWN_FILTERS": "true",
    "SAIL_PARQUET__REORDER_FILTERS": "true",
    # The engine's allocator (mimalloc) returns freed memory at once instead
    # of keeping it for reuse. bench store at 10M: engine peak 793 -> 679 MB
    # and node + engine 2,079 -> 1,893 MB during the ingest, for 61 -> 102
    # engine CPU seconds and 43.9k -> 40.1k msg/s; a window replace peaked
    # ~210 MB lower. The environment overrides it (MIMALLOC_PURGE_DELAY=10
    # is mimalloc's own default).
    "MIMALLOC_PURGE_DELAY": "0",
    # Sail logs every session at INFO, and a warning about aborted actor
    # tasks on every orderly stop; keep the other warnings and errors.
    "RUST_LOG": "warn,sail_common::actor=error",
}

# Spark settings applied to every new session (a restart loses them).
# Day partitions are UTC days.
DEFAULT_SESSION_CONF = {"spark.sql.session.timeZone": "UTC"}


class CommitConflict(Exception):
    """Another writer committed to the table first: re-read and retry.
    The engine's own error is the ``__cause__``."""


def commit_conflict(exc: BaseException) -> CommitConflict | None:
    """``exc`` as a :class:`CommitConflict` when it is one, else None."""
    if isinstance(exc, CommitConflict):
        return exc
    if dialect.is_commit_conflict(exc):
        conflict = CommitConflict(_describe(exc))
        conflict.__cause__ = exc
        return conflict
    return None


class EngineUnavailable(Exception):
    """The engine cannot answer: it failed to start or to come back within
    the wait bound, the remote server is unreachable, or it is closed."""


@dataclass(frozen=True)
class EngineHealth:
    """One health check. ``problem`` says why ``healthy`` is false."""

    healthy: bool
    generation: int
    pid: int | None  # the embedded server's process, None when remote
    rss_bytes: int | None  # its resident memory, None when unknown or remote
    probe_s: float | None  # the SELECT 1 round trip in seconds, None if not run or failed
    problem: str | None = None


class Engine:
    """A supervised Spark Connect session on an embedded server (Sail or
    Spark) or a remote endpoint.

    ``target`` is ``"sail"`` (or ``"embedded"``), ``"spark"`` or
    ``"sc://host:port"``. The server starts on :meth:`start` or on first
    use. ``memory_ceiling_bytes`` (embedded Sail only; ``None`` turns it
    off; the attribute may be changed at any time) is checked after every
    :meth:`run` and in :meth:`supervise`. ``sail_env`` adds ``SAIL_*``
    variables for the embedded Sail server; ``spark_driver_memory`` is the
    embedded Spark server's heap, ``spark_s3`` lets it reach tables in
    S3-compatible buckets (``AWS_*`` variables); ``session_conf`` replaces the Spark
    settings applied to each new session. Timeouts left at None take the
    engine's own default.
    """

    def __init__(
        self,
        target: str = SAIL,
        *,
        memory_ceiling_bytes: int | None = DEFAULT_MEMORY_CEILING_BYTES,
        wait_timeout_s: float | None = None,
        probe_timeout_s: float | None = None,
        start_timeout_s: float | None = None,
        sail_env: Mapping[str, str] | None = None,
        spark_driver_memory: str = spark_server.DEFAULT_DRIVER_MEMORY,
        spark_s3: bool = False,
        session_conf: Mapping[str, str] | None = None,
    ):
        if target not in OWNED_TARGETS and not (target.startswith(REMOTE_SCHEME) and len(target) > len(REMOTE_SCHEME)):
            raise ValueError(f"engine target must be 'sail', 'spark' or 'sc://host:port', got {target!r}")
        self.target = target
        # Which engine answers (dialect.SAIL or SPARK); a remote one's is
        # known once connected (None before).
        self.kind: str | None = SPARK if target == SPARK else SAIL if target in OWNED_TARGETS else None
        spark = self.kind == SPARK
        self.memory_ceiling_bytes = None if spark else memory_ceiling_bytes
        if start_timeout_s is None:
            start_timeout_s = SPARK_START_TIMEOUT_S if spark else START_TIMEOUT_S
        if probe_timeout_s is None:
            probe_timeout_s = PROBE_TIMEOUT_S if self.kind == SAIL else SPARK_PROBE_TIMEOUT_S
        self.wait_timeout_s = start_timeout_s + probe_timeout_s if wait_timeout_s is None else wait_timeout_s
        self.probe_timeout_s = probe_timeout_s
        self._stop_timeout_s = SPARK_STOP_TIMEOUT_S if spark else STOP_TIMEOUT_S
        self._spark_driver_memory = spark_driver_memory
        self._spark_s3 = spark_s3
        # A probe thread still waiting on a session that never answered (see
        # _probe), when it started, and the session: while it waits, that
        # session is not probed again, so a hung engine holds one thread,
        # not one per health check (a new session, a repair's, is probed).
        self._waiting_probe: tuple[threading.Thread, float, SparkSession] | None = None
        self.start_timeout_s = start_timeout_s
        self._sail_env = dict(sail_env or {})
        self._session_conf = dict(DEFAULT_SESSION_CONF if session_conf is None else session_conf)
        # Guards every field below; waiters are woken on any change.
        self._cond = threading.Condition()
        self._session: SparkSession | None = None
        self._child: subprocess.Popen | None = None
        self._url: str | None = None if self.is_embedded else target
        self._generation = 0
        self._replacing = False  # one thread is bringing a new session up
        self._in_flight = 0  # callers inside run()/session()
        self._closed = False

    # --- what callers may read ---------------------------------------------

    @property
    def is_embedded(self) -> bool:
        """True when the engine is a child process this object owns (Sail or
        Spark) on this machine: it sees the same files as the node."""
        return self.target in OWNED_TARGETS

    @property
    def generation(self) -> int:
        """0 before the first start, then +1 for every new session (start,
        restart or reconnect). A caller that saw generation g fail and now
        sees a larger one knows the engine was replaced under it."""
        return self._generation

    @property
    def pid(self) -> int | None:
        """The embedded server's process id; None when remote or stopped."""
        child = self._child
        return child.pid if child is not None else None

    @property
    def url(self) -> str | None:
        """The Spark Connect address in use (``sc://127.0.0.1:port`` when
        embedded); None while the embedded server is stopped."""
        return self._url

    def rss_bytes(self) -> int | None:
        """Resident memory of the embedded server in bytes (its process and
        theirs it started: Spark's JVM), None if unknown."""
        pid = self.pid
        return _rss_bytes(pid, tree=self.kind == SPARK) if pid is not None else None

    # --- lifecycle ---------------------------------------------------------

    def start(self) -> None:
        """Start (embedded) or connect (remote) and check that ``SELECT 1``
        answers. Returns at once when already running. Raises
        :class:`EngineUnavailable` if the engine cannot answer."""
        with self._cond:
            if self._closed:
                raise EngineUnavailable("the engine is closed")
            if self._session is not None:
                return
            generation = self._generation
        self._replace(generation, "start", restart_child=True, drain=False)

    def close(self) -> None:
        """Stop using the engine: new calls raise :class:`EngineUnavailable`,
        calls in flight get up to ``STOP_TIMEOUT_S`` to finish, and the
        embedded server is stopped (SIGTERM, then SIGKILL after
        ``STOP_TIMEOUT_S``) and reaped. Idempotent."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            self._cond.wait_for(lambda: not self._replacing, self.start_timeout_s + STOP_TIMEOUT_S)
            self._cond.wait_for(lambda: self._in_flight == 0, STOP_TIMEOUT_S)
            session, child = self._session, self._child
            self._session = self._child = None
        self._teardown(session, child)

    def __enter__(self) -> Engine:
        self.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    # --- using the session -------------------------------------------------

    @contextlib.contextmanager
    def session(self) -> Iterator[SparkSession]:
        """Yield a healthy session, waiting while the engine restarts.

        The session may be used from several threads, but only inside the
        block: a restart replaces it. No retry happens here; prefer
        :meth:`run`. Raises :class:`EngineUnavailable` when no session is
        healthy within ``wait_timeout_s``. Do not nest engine calls inside
        the block: a planned restart waits for the block to end.
        """
        spark, _ = self._acquire()
        try:
            yield spark
        finally:
            self._release()

    def run(self, fn: Callable[[SparkSession], T], *, retry: bool = True) -> T:
        """Return ``fn(spark)``, run on a healthy session.

        When ``fn`` fails because the engine failed (the child died, the
        session expired, the remote is gone) the engine is restarted or
        reconnected and ``fn`` runs once more on the new session, so ``fn``
        may run twice: it must build its DataFrames from the session it is
        given and be safe to repeat (or pass ``retry=False``). A commit
        conflict (another writer committed first) is raised as
        :class:`CommitConflict`, without a restart. Any other failure of
        ``fn`` is raised unchanged, without a restart. Raises
        :class:`EngineUnavailable` when the engine does not come back.
        After a successful call, an embedded server above the memory
        ceiling is restarted before this returns.
        """
        spark, generation = self._acquire()
        failure: Exception | None = None
        try:
            result = fn(spark)
        except Exception as exc:
            failure = exc
        finally:
            self._release()
        if failure is None:
            self._check_memory(generation)
            return result
        conflict = commit_conflict(failure)
        if conflict is not None:
            raise conflict from failure
        if not retry:
            raise failure
        try:
            recovered = self._recover(generation, failure)
        except EngineUnavailable as exc:
            raise exc from failure
        if not recovered:
            raise failure
        log.warning("engine replaced after %s; running the operation again", _describe(failure))
        with self.session() as spark:
            try:
                return fn(spark)
            except Exception as exc:
                conflict = commit_conflict(exc)
                if conflict is None:
                    raise
                raise conflict from exc

    # --- supervision -------------------------------------------------------

    def health(self) -> EngineHealth:
        """Check without acting: the child is alive and under the memory
        ceiling, and ``SELECT 1`` answers within ``probe_timeout_s``."""
        with self._cond:
            session, child, generation = self._session, self._child, self._generation
            if self._closed:
                return EngineHealth(False, generation, None, None, None, "closed")
            if self._replacing:
                return EngineHealth(False, generation, self.pid, None, None, "restarting")
        return self._check(session, child, generation)[0]

    def supervise(self) -> EngineHealth:
        """Check health and repair: restart a dead or oversized embedded
        server, reconnect a session that stopped answering (restarting the
        embedded server if a new session does not answer either). Returns
        the health after any repair. Raises :class:`EngineUnavailable` if
        the repair fails; a later call tries again."""
        with self._cond:
            busy = self._closed or self._replacing
            session, child, generation = self._session, self._child, self._generation
        if busy:
            return self.health()
        health, restart_child = self._check(session, child, generation)
        if health.healthy:
            return health
        log.warning("engine unhealthy (%s); replacing it", health.problem)
        memory = restart_child and child is not None and child.poll() is None
        self._replace(generation, health.problem or "unhealthy", restart_child=restart_child, drain=memory)
        return self.health()

    def recycle(self) -> int:
        """Replace the session now: restart the embedded server (after calls
        in flight finish, up to ``DRAIN_TIMEOUT_S``) or reconnect to the
        remote one. Returns the new generation."""
        with self._cond:
            generation = self._generation
        self._replace(generation, "recycle requested", restart_child=True, drain=True)
        return self._generation

    # --- internals: sessions -----------------------------------------------

    def _acquire(self) -> tuple[SparkSession, int]:
        """A healthy session and its generation, counted as in flight."""
        deadline = time.monotonic() + self.wait_timeout_s
        while True:
            with self._cond:
                while True:
                    if self._closed:
                        raise EngineUnavailable("the engine is closed")
                    if self._session is not None and not self._replacing:
                        self._in_flight += 1
                        return self._session, self._generation
                    if not self._replacing:
                        break  # nobody is bringing it up: this thread will
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise EngineUnavailable(f"the engine did not come back within {self.wait_timeout_s:g} s")
                    self._cond.wait(remaining)
                generation = self._generation
            self._replace(generation, "start", restart_child=True, drain=False)

    def _release(self) -> None:
        with self._cond:
            self._in_flight -= 1
            self._cond.notify_all()

    def _recover(self, generation: int, failure: Exception) -> bool:
        """After ``failure`` on session ``generation``: True when a new
        session is (being) brought up, False when the engine is healthy and
        the failure was the operation's own."""
        with self._cond:
            if self._closed:
                return False
            if self._generation != generation or self._replacing or self._session is None:
                return True
            session, child = self._session, self._child
        health, restart_child = self._check(session, child, generation)
        if health.healthy:
            return False
        self._replace(generation, health.problem or _describe(failure), restart_child=restart_child, drain=False)
        return True

    def _check_memory(self, generation: int) -> None:
        ceiling = self.memory_ceiling_bytes
        rss = self.rss_bytes() if ceiling is not None else None
        if rss is None:
            return
        assert ceiling is not None  # rss is measured under a ceiling only
        if rss <= ceiling:
            return
        try:
            self._replace(generation, f"RSS {rss} B above the ceiling {ceiling} B", restart_child=True, drain=True)
        except EngineUnavailable as exc:
            log.error("restart on the memory ceiling failed: %s", exc)

    def _check(self, session, child, generation) -> tuple[EngineHealth, bool]:
        """The health of ``session``/``child``, and whether a repair must
        restart the child (True) or may first try a new session (False)."""
        pid = child.pid if child is not None else None
        if session is None:
            return EngineHealth(False, generation, pid, None, None, "not started"), True
        if child is not None and child.poll() is not None:
            problem = f"the {self.kind} server exited with status {child.returncode}"
            return EngineHealth(False, generation, pid, None, None, problem), True
        rss = _rss_bytes(pid, tree=self.kind == SPARK) if pid is not None else None
        ceiling = self.memory_ceiling_bytes
        if rss is not None and ceiling is not None and rss > ceiling:
            problem = f"RSS {rss} B above the ceiling {ceiling} B"
            return EngineHealth(False, generation, pid, rss, None, problem), True
        try:
            probe_s = self._probe(session)
        except EngineUnavailable as exc:
            return EngineHealth(False, generation, pid, rss, None, str(exc)), False
        return EngineHealth(True, generation, pid, rss, probe_s), False

    def _replace(self, generation: int, reason: str, *, restart_child: bool, drain: bool) -> None:
        """Bring up a new session unless one newer than ``generation``
        exists. Callers of _acquire() wait meanwhile; with ``drain``, calls
        in flight get up to DRAIN_TIMEOUT_S to finish first."""
        with self._cond:
            if not self._cond.wait_for(lambda: not self._replacing, self.wait_timeout_s):
                raise EngineUnavailable(f"the engine did not come back within {self.wait_timeout_s:g} s")
            if self._closed:
                raise EngineUnavailable("the engine is closed")
            if self._generation != generation:
                return  # another thread replaced it already
            self._replacing = True
            old_session, self._session = self._session, None
            if drain:
                self._cond.wait_for(lambda: self._in_flight == 0, DRAIN_TIMEOUT_S)
            child = self._child
        if generation:
            log.warning("replacing engine session %d: %s", generation, reason)
        started = time.monotonic()
        try:
            session, child, url = self._bring_up(old_session, child, restart_child)
        except BaseException as exc:
            with self._cond:
                self._replacing = False
                self._cond.notify_all()
            if isinstance(exc, EngineUnavailable) or not isinstance(exc, Exception):
                raise
            raise EngineUnavailable(f"the engine failed to start: {_describe(exc)}") from exc
        with self._cond:
            self._replacing = False
            closed = self._closed
            if not closed:
                self._session, self._child, self._url = session, child, url
                self._generation += 1
            self._cond.notify_all()
        if closed:
            self._teardown(session, child)
            raise EngineUnavailable("the engine is closed")
        log.info(
            "engine session %d ready at %s in %.2f s%s",
            self._generation,
            url,
            time.monotonic() - started,
            f" (pid {child.pid})" if child is not None else "",
        )

    def _bring_up(self, old_session, child, restart_child: bool):
        """A new (session, child, url). Embedded: reuse a live child unless
        told to restart it or a new session on it does not answer."""
        if not self.is_embedded:
            _discard(old_session, release=True)
            return self._connect(self.target), None, self.target
        if child is not None and child.poll() is None and not restart_child:
            # The old session stopped answering: it expired or the server
            # hangs, and releasing it would only wait.
            _discard(old_session, release=False)
            assert self._url is not None  # set with the child it belongs to (_replace), cleared with it
            try:
                return self._connect(self._url), child, self._url
            except EngineUnavailable as exc:
                log.warning("a new session on the running %s server failed (%s); restarting it", self.kind, exc)
        if child is not None:
            self._terminate(child)
        _discard(old_session, release=False)
        with self._cond:
            self._child, self._url = None, None
        child, url = self._spawn()
        try:
            return self._connect(url), child, url
        except BaseException:
            self._terminate(child)
            raise

    def _connect(self, url: str) -> SparkSession:
        """A new session on ``url`` that answered SELECT 1, configured."""
        from pyspark.sql import SparkSession
        from pyspark.sql.connect.client.retries import DefaultPolicy

        # create(), not getOrCreate(): the latter returns the process-wide
        # default session, which still points at the old server's port.
        session = SparkSession.builder.remote(url).create()
        retries = CLIENT_RETRIES_EMBEDDED if self.is_embedded else CLIENT_RETRIES_REMOTE
        session.client.set_retry_policies(
            [
                DefaultPolicy(
                    max_retries=retries,
                    initial_backoff=CLIENT_INITIAL_BACKOFF_MS,
                    backoff_multiplier=CLIENT_BACKOFF_MULTIPLIER,
                    max_backoff=CLIENT_MAX_BACKOFF_MS,
                )
            ]
        )
        try:
            self._probe(session)
            for key, value in self._session_conf.items():
                session.conf.set(key, value)
            if self.kind is None:
                self.kind = dialect.kind_of_version(session.sql("SELECT version()").collect()[0][0])
        except BaseException as exc:
            _discard(session, release=False)
            if isinstance(exc, EngineUnavailable):
                raise EngineUnavailable(f"{url}: {exc}") from exc.__cause__
            raise EngineUnavailable(f"{url}: {_describe(exc)}") from exc
        return session

    def _probe(self, session: SparkSession) -> float:
        """Seconds a SELECT 1 took; EngineUnavailable past probe_timeout_s.

        The query runs on its own thread: the Spark Connect client has no
        deadline on a call, so a server that accepts and never answers
        would otherwise block the caller for good. A stuck probe thread
        ends when its session is discarded (the channel closes)."""
        waiting = self._waiting_probe
        if waiting is not None:
            if waiting[0].is_alive() and waiting[2] is session:
                raise EngineUnavailable(
                    f"a SELECT 1 sent {time.monotonic() - waiting[1]:.0f} s ago has not been answered yet"
                )
            if not waiting[0].is_alive():
                self._waiting_probe = None
        outcome: list[BaseException | None] = []

        def probe() -> None:
            try:
                rows = session.sql("SELECT 1 AS ok").collect()
                ok = len(rows) == 1 and rows[0][0] == 1
                outcome.append(None if ok else EngineUnavailable(f"SELECT 1 returned {rows!r}"))
            except BaseException as exc:  # reported to the waiting thread
                outcome.append(exc)

        started = time.monotonic()
        thread = threading.Thread(target=probe, name="engine-probe", daemon=True)
        thread.start()
        thread.join(self.probe_timeout_s)
        if not outcome:
            self._waiting_probe = (thread, started, session)
            raise EngineUnavailable(f"SELECT 1 got no answer within {self.probe_timeout_s:g} s")
        if outcome[0] is not None:
            raise EngineUnavailable(f"SELECT 1 failed: {_describe(outcome[0])}") from outcome[0]
        return time.monotonic() - started

    # --- internals: the child process --------------------------------------

    def _spawn(self) -> tuple[subprocess.Popen, str]:
        """Start the server process; return it and its sc:// address."""
        try:
            if self.kind == SPARK:
                child, port = spark_server.spawn(
                    os.environ,
                    self.start_timeout_s,
                    LOOPBACK,
                    driver_memory=self._spark_driver_memory,
                    s3=self._spark_s3,
                )
            else:
                env = {**SAIL_DEFAULT_ENV, **os.environ, **self._sail_env}
                child, port = sail_server.spawn(env, self.start_timeout_s, LOOPBACK)
        except (engine_process.ServerStartError, spark_jars.JarsMissing) as exc:
            raise EngineUnavailable(str(exc)) from exc
        return child, f"{REMOTE_SCHEME}{LOOPBACK}:{port}"

    def _terminate(self, child: subprocess.Popen) -> None:
        if not engine_process.stop(child, self._stop_timeout_s):
            log.warning(
                "the %s server (pid %d) ignored SIGTERM for %g s and was killed",
                self.kind,
                child.pid,
                self._stop_timeout_s,
            )

    def _teardown(self, session, child) -> None:
        if child is not None:
            self._terminate(child)
        _discard(session, release=child is None)


# --- helpers -----------------------------------------------------------------


def _discard(session, *, release: bool) -> None:
    """Close a session's client, first releasing it on the server when
    ``release``; bounded by STOP_TIMEOUT_S.

    SparkSession.stop() is avoided: it holds a process-wide lock during the
    release call, which would block every later session creation if the
    server never answered."""
    if session is None:
        return
    client = session.client

    def close() -> None:
        if release:
            with contextlib.suppress(Exception):
                client.release_session()
        with contextlib.suppress(Exception):
            client.close()

    thread = threading.Thread(target=close, name="engine-session-close", daemon=True)
    thread.start()
    thread.join(STOP_TIMEOUT_S)


def _rss_bytes(pid: int, tree: bool = False) -> int | None:
    """VmRSS of ``pid``, with ``tree`` plus the processes it started (the
    Spark child's JVM), in bytes; None if it is gone."""
    import psutil

    try:
        process = psutil.Process(pid)
        total = process.memory_info().rss
        for child in process.children(recursive=True) if tree else ():
            with contextlib.suppress(psutil.Error):
                total += child.memory_info().rss
        return total
    except psutil.Error:
        return None


def _describe(exc: BaseException) -> str:
    """An exception on one bounded line, for logs and error messages."""
    text = " ".join(str(exc).split())
    grpc_failure = _GRPC_FAILURE.search(text)
    if grpc_failure:  # a gRPC status dump: keep its code and details
        text = f"{grpc_failure['code']}: {grpc_failure['details']}"
    if len(text) > DESCRIBE_MAX_CHARS:
        text = text[: DESCRIBE_MAX_CHARS - 3] + "..."
    return f"{type(exc).__name__}: {text}"
