"""The Apache Spark engine's process: Spark's own Spark Connect server, with
Delta Lake, on loopback.

Run as ``python -m wakustore.storage.spark_server --port N [--host H]
[--driver-memory 1g] [--master URL] [--s3] [--conf KEY=VALUE ...]``. It
is a small Python process that starts the JVM (``spark-submit`` of the
pinned pyspark's jars, class ``SparkConnectServer``, Delta's jars from
the cache, :mod:`spark_jars`), forwards its log to stderr, and keeps
:mod:`engine_process`'s contract for it: the ready line
``SPARK_LISTENING <host> <port>`` once Spark Connect listens, a stop on
SIGTERM, stdin EOF or the parent's death. The JVM cannot watch its
parent itself; this process does, and takes the JVM down with it.

The JVM runs in a directory of its own (removed at the end): Spark puts
its warehouse, scratch files and Derby's log in the working directory.
Its heap is bounded by ``--driver-memory`` (``spark_driver_memory`` in the
node's configuration), and it exits on an OutOfMemoryError, so that the
node's supervision starts a new one instead of talking to a broken JVM.

The same command is a fleet's shared engine: ``--host 0.0.0.0 --port
15002 --master spark://master:7077`` runs the Spark Connect server (the
fleet's one Spark driver) on a standalone cluster, ``--conf`` passing
any other Spark setting. With ``--s3``, tables in S3-compatible buckets
(``s3://``) go through Hadoop's S3A with the endpoint, region and keys of
the standard ``AWS_*`` variables, and Delta's single-driver log store:
safe while every commit to the table goes through this one server.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path

from wakustore.storage import engine_process, spark_jars
from wakustore.storage.engine_process import ServerStartError, stop

__all__ = ["READY_PREFIX", "ServerStartError", "main", "spawn", "stop"]

READY_PREFIX = "SPARK_LISTENING"
NAME = "Spark"

DEFAULT_DRIVER_MEMORY = "1g"

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"

# Spark Connect logs this once its gRPC server is bound (Spark 4.x,
# SparkConnectServer), with the port the system chose for port 0.
_STARTED = re.compile(rb"Spark Connect server started at: (?P<host>\S+?):(?P<port>\d+)")

# The JVM's own shutdown (its hooks stop the SparkContext) gets this long
# after SIGTERM before it is killed.
JVM_STOP_TIMEOUT_S = 20.0

# Settings of the embedded server (spark-defaults.conf of its own conf dir).
# Delta's SQL extension and catalog make `delta.`path`` tables, MERGE,
# OPTIMIZE and VACUUM work. One machine: shuffles of a few partitions
# (Spark's default of 200 made a 2-row MERGE take seconds of task
# scheduling), the Delta snapshot's state in two. The node decides
# retention (VACUUM ... RETAIN), so Delta's 7-day floor check is off. No
# web UI.
SERVER_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "4",
    # A commit's rows (an Arrow batch in the request) in one task, so one
    # file a day a commit, as Sail writes them: two tasks wrote two files a
    # day, which compaction then had to rewrite.
    "spark.default.parallelism": "1",
    "spark.databricks.delta.snapshotPartitions": "2",
    # Delta's VACUUM lists the table in this many tasks (Spark's default:
    # 10,000): a VACUUM of a one-file table took 43-64 s on 2 cores, 3-6 s
    # with 4.
    "spark.sql.sources.parallelPartitionDiscovery.parallelism": "4",
    "spark.databricks.delta.retentionDurationCheck.enabled": "false",
    "spark.sql.session.timeZone": "UTC",
    # A MERGE's plan over the message table's columns is longer than
    # Spark's default and it warns of it once a session.
    "spark.sql.debug.maxToStringFields": "100",
    "spark.driver.extraJavaOptions": "-XX:+ExitOnOutOfMemoryError",
}

# Local files through Hadoop's raw file systems: its default ones write a
# hidden checksum file beside every data file and log entry (two more files
# a commit, which the node's own trimming, compaction and vacuum do not
# know of). Not with S3A: it takes its buffers from the local file system
# as Hadoop's checksummed class and fails on the raw one (a ClassCastException
# at the first s3:// table); a server for buckets keeps Hadoop's default.
RAW_LOCAL_FILES = {
    "spark.hadoop.fs.file.impl": "org.apache.hadoop.fs.RawLocalFileSystem",
    "spark.hadoop.fs.AbstractFileSystem.file.impl": "org.apache.hadoop.fs.local.RawLocalFs",
}

# Spark's log at WARN, but for the line that says it listens.
LOG4J2_PROPERTIES = """\
rootLogger.level = warn
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n%ex
logger.connect.name = org.apache.spark.sql.connect.service.SparkConnectServer
logger.connect.level = info
logger.native.name = org.apache.hadoop.util.NativeCodeLoader
logger.native.level = error
"""

# What the JVM says at every start that tells an operator nothing: its own
# notes, and the INFO lines above (read here, not forwarded).
_START_NOISE = (b"WARNING: Using incubator modules", b" INFO ")


def spawn(
    env: Mapping[str, str],
    timeout_s: float,
    host: str = "127.0.0.1",
    driver_memory: str = DEFAULT_DRIVER_MEMORY,
    s3: bool = False,
) -> tuple[subprocess.Popen, int]:
    """Start the server as a child of this process on a port the system
    chooses (:func:`engine_process.spawn`); return it and its port. With
    ``s3``, it reaches tables in buckets. Raises
    :class:`spark_jars.JarsMissing` before starting anything when the jars
    are not installed."""
    spark_jars.installed(s3=s3)
    args = ["--driver-memory", driver_memory, *(["--s3"] if s3 else [])]
    return engine_process.spawn(__name__, NAME, READY_PREFIX, env, timeout_s, host, args)


def spark_home() -> Path:
    """The pinned pyspark's directory: its jars and bin/ are a Spark
    distribution (found without importing pyspark)."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        raise ServerStartError("pyspark is not installed")
    return Path(next(iter(spec.submodule_search_locations)))


def s3_conf(environ: Mapping[str, str]) -> dict[str, str]:
    """Spark settings for ``s3://`` and ``s3a://`` tables from the ``AWS_*``
    variables the nodes and delta-rs read (README, A fleet): S3A for both
    schemes; an endpoint (MinIO, Ceph RGW, R2) with path-style requests,
    over http when it says so; the region; the keys, when set, in Hadoop's
    configuration, which reaches a cluster's executors too (else S3A's own
    chain: instance and pod roles)."""
    conf = {
        "spark.hadoop.fs.s3.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem",
        "spark.hadoop.fs.AbstractFileSystem.s3.impl": "org.apache.hadoop.fs.s3a.S3A",
    }
    endpoint = environ.get("AWS_ENDPOINT_URL")
    if endpoint:
        conf["spark.hadoop.fs.s3a.endpoint"] = endpoint
        conf["spark.hadoop.fs.s3a.path.style.access"] = "true"
        conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] = str(endpoint.startswith("https://")).lower()
    region = environ.get("AWS_REGION") or environ.get("AWS_DEFAULT_REGION")
    if region:
        conf["spark.hadoop.fs.s3a.endpoint.region"] = region
    if environ.get("AWS_ACCESS_KEY_ID") and environ.get("AWS_SECRET_ACCESS_KEY"):
        conf["spark.hadoop.fs.s3a.access.key"] = environ["AWS_ACCESS_KEY_ID"]
        conf["spark.hadoop.fs.s3a.secret.key"] = environ["AWS_SECRET_ACCESS_KEY"]
    return conf


class SparkProcess:
    """The JVM of one Spark Connect server; :func:`engine_process.serve`'s
    :class:`~engine_process.Server`. ``master`` None: Spark in this JVM
    (``local[<cores>]``); ``s3``: tables in buckets too; ``conf`` adds or
    overrides settings."""

    def __init__(
        self,
        host: str,
        port: int,
        driver_memory: str,
        master: str | None = None,
        conf: Mapping[str, str] | None = None,
        s3: bool = False,
    ):
        jars = spark_jars.installed(s3=s3)
        home = spark_home()
        self._workdir = Path(tempfile.mkdtemp(prefix="wakustore-spark-"))
        conf_dir = self._workdir / "conf"
        conf_dir.mkdir()
        (conf_dir / "log4j2.properties").write_text(LOG4J2_PROPERTIES)
        settings = {
            **SERVER_CONF,
            **(s3_conf(os.environ) if s3 else RAW_LOCAL_FILES),
            "spark.connect.grpc.binding.address": host,
            "spark.connect.grpc.binding.port": str(port),
            "spark.sql.warehouse.dir": str(self._workdir / "warehouse"),
            **(conf or {}),
        }
        (conf_dir / "spark-defaults.conf").write_text("".join(f"{k} {v}\n" for k, v in settings.items()))
        env = {
            **os.environ,
            "SPARK_HOME": str(home),
            "SPARK_CONF_DIR": str(conf_dir),
            "SPARK_LOCAL_DIRS": str(self._workdir / "local"),
        }
        if host in ("127.0.0.1", "localhost", "::1"):
            # The driver too: nothing of it listens beyond this machine.
            # Listening on every interface, it keeps Spark's own choice (the
            # host's address), which a cluster's executors can reach.
            env["SPARK_LOCAL_IP"] = host
        command = [
            str(home / "bin" / "spark-submit"),
            "--class",
            SERVER_CLASS,
            "--master",
            master or f"local[{os.cpu_count() or 2}]",
            "--driver-memory",
            driver_memory,
            "--jars",
            ",".join(str(j) for j in jars),
            "spark-internal",
        ]
        # spark-submit execs the JVM: this pid is the JVM's. It is killed
        # when this process dies, even by SIGKILL (this thread, the main
        # one, lives as long as the process: PR_SET_PDEATHSIG is safe here).
        self._jvm = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            cwd=self._workdir,
            env=env,
            preexec_fn=_die_with_parent,
        )
        self._address: tuple[str, int] | None = None
        self._ready = threading.Event()
        threading.Thread(target=self._forward_log, name="spark-log", daemon=True).start()

    def wait_ready(self) -> None:
        """Block until Spark Connect listens; ServerStartError if the JVM exits first."""
        while not self._ready.wait(0.2):
            if self._jvm.poll() is not None:
                self._ready.wait(1.0)  # the log thread may hold the last lines
                if self._address is None:
                    raise ServerStartError(f"the Spark JVM exited (status {self._jvm.returncode}) before listening")

    @property
    def listening_address(self) -> tuple[str, int]:
        assert self._address is not None  # after wait_ready()
        return self._address

    @property
    def running(self) -> bool:
        return self._jvm.poll() is None

    def stop(self) -> None:
        if self._jvm.poll() is None:
            self._jvm.send_signal(signal.SIGTERM)
            try:
                self._jvm.wait(JVM_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self._jvm.kill()
                self._jvm.wait()
        shutil.rmtree(self._workdir, ignore_errors=True)

    def _forward_log(self) -> None:
        stdout = self._jvm.stdout
        assert stdout is not None
        for line in stdout:
            if self._address is None:
                started = _STARTED.search(line)
                if started:
                    self._address = (started["host"].decode(), int(started["port"]))
                    self._ready.set()
            if any(noise in line for noise in _START_NOISE):
                continue
            with contextlib.suppress(OSError, ValueError):  # the parent went away
                sys.stderr.buffer.write(line)
                sys.stderr.buffer.flush()
        self._ready.set()


def _die_with_parent() -> None:
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


def main(argv: list[str] | None = None) -> int:
    command = engine_process.parser(
        "python -m wakustore.storage.spark_server",
        "Run Apache Spark's Spark Connect server with Delta Lake (the node's embedded spark engine).",
    )
    command.add_argument("--driver-memory", default=DEFAULT_DRIVER_MEMORY, help="the JVM's heap (spark.driver.memory)")
    command.add_argument("--master", help="a cluster's master URL (spark://host:7077, k8s://...); default: local")
    command.add_argument("--s3", action="store_true", help="reach tables in S3-compatible buckets (AWS_* variables)")
    command.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="another Spark setting")
    args = command.parse_args(argv)
    extra = {}
    for item in args.conf:
        key, sep, value = item.partition("=")
        if not sep or not key:
            command.error(f"--conf {item!r}: expected KEY=VALUE")
        extra[key] = value

    def start() -> SparkProcess:
        server = SparkProcess(args.host, args.port, args.driver_memory, args.master, extra, args.s3)
        try:
            server.wait_ready()
        except BaseException:
            server.stop()
            raise
        return server

    started = time.monotonic()
    try:
        return engine_process.serve(args, READY_PREFIX, start)
    except (ServerStartError, spark_jars.JarsMissing) as exc:
        print(f"error after {time.monotonic() - started:.1f} s: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
