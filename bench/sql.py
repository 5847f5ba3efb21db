"""The storage benchmark's comparison backends: nwaku's PostgreSQL and SQLite
archives, with nwaku's schemas and the SQL its drivers send.

Sources (waku-org/nwaku):

- PostgreSQL, schema version 7 (``migrations/message_store_postgres/
  content_script_version_{1..7}.nim``): ``messages`` partitioned by range
  of ``timestamp`` (ns) into one-hour partitions (``partitions_manager.nim``),
  primary key ``(messageHash, timestamp)``, hex ``VARCHAR`` for hash,
  payload and meta, ``id`` a fake ``'0'``; indexes on messageHash,
  timestamp, pubsubTopic and contentTopic (version 7 dropped the
  composite ``i_query``); plus ``messages_lookup (timestamp, messageHash)``
  that resolves cursors and hash lookups without touching every partition.
  Queries from ``postgres_driver.nim``: ``getMessagesArbitraryQuery``
  (what a Store v3 query with topics and a time range and no hashes runs),
  ``getTimeCursor`` for the cursor, ``getMessagesByMessageHashes`` for
  lookups by hash.
- SQLite, schema version 10 (``migrations/message_store/0000{1..10}*.sql``
  then ``sqlite_driver.nim``'s ``init``): ``Message`` ``WITHOUT ROWID``
  keyed by ``messageHash``, BLOB columns, index ``i_ts (timestamp)``
  (migration 7 rebuilt the table and with it dropped ``i_query``), WAL
  journal. Queries from ``sqlite_driver/queries.nim``:
  ``selectMessagesByStoreQueryWithLimit``.

nwaku's end time is inclusive (``timestamp <= end``); ours is exclusive,
so the end bound is sent as ``time_end - 1``. Pages follow the archive's
rule (fetch one more than the page, the last row of the page is the next
cursor, backward pages come back ascending), as MessageStore.query does.
Loading dedups by message hash in the client (the role of nwaku's
``ON CONFLICT DO NOTHING`` and of the node's recent-MUID set) and commits
one transaction per batch.
"""

from __future__ import annotations

import glob
import io
import os
import shlex
import shutil
import socket
import sqlite3
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from wakustore.protocols import store_query
from wakustore.protocols.message import WakuMessage, message_hash
from wakustore.protocols.store_query import HistoryQuery, Page, StoredMessage, unknown_cursor

if TYPE_CHECKING:
    import psycopg

NS_PER_HOUR = 3_600 * 1_000_000_000
# nwaku's MaxHashesPerQuery.
MAX_HASHES_PER_QUERY = 100


class BackendError(RuntimeError):
    """A comparison backend that cannot be set up or fails."""


# --- shared page logic -------------------------------------------------------


# nwaku's column names for the columns of a query's description.
_COLUMNS = {
    store_query.PUBSUB_TOPIC: "pubsubTopic",
    store_query.CONTENT_TOPIC: "contentTopic",
    store_query.MESSAGE_HASH: "messageHash",
    store_query.TIMESTAMP: "timestamp",
}


def _filter_and_order(
    query: HistoryQuery, key: tuple[int, bytes] | None, mark: str, value: Callable[[str, object], object]
) -> tuple[str, list]:
    """The WHERE (if any) and ORDER BY clauses of ``query`` from ``key``,
    in nwaku's form, and their parameters: ``mark`` is the driver's
    placeholder, ``value(column, v)`` a value as the schema stores it."""
    preds, after = store_query.predicates(query, key)
    clauses: list[str] = []
    params: list = []
    if after is not None:
        if after.column != store_query.MESSAGE_HASH:
            raise BackendError("nwaku's archives order by message hash only")
        clauses.append(f"(timestamp, messageHash) {'>' if after.forward else '<'} ({mark}, {mark})")
        params += [after.timestamp, value(store_query.MESSAGE_HASH, after.key)]
    for p in preds:
        column = _COLUMNS[p.column]
        if p.op == store_query.EQ:
            clauses.append(f"{column} = {mark}")
            params.append(value(p.column, p.value))
        elif p.op == store_query.IN:
            values = cast(tuple[object, ...], p.value)
            clauses.append(f"{column} IN ({', '.join([mark] * len(values))})")
            params += [value(p.column, v) for v in values]
        elif p.op == store_query.GE:
            clauses.append(f"{column} >= {mark}")
            params.append(value(p.column, p.value))
        elif p.op == store_query.LT:
            # nwaku's end bound is inclusive: the last admitted timestamp.
            clauses.append(f"{column} <= {mark}")
            params.append(value(p.column, cast(int, p.value) - 1))
        else:
            raise BackendError(f"unknown predicate operator {p.op!r}")
    direction = "ASC" if query.forward else "DESC"
    order_by = _COLUMNS.get(store_query.order_column(query.ordering))
    if order_by is None:
        raise BackendError("nwaku's archives order by message hash only")
    sql = " WHERE " + " AND ".join(clauses) if clauses else ""
    return sql + f" ORDER BY timestamp {direction}, {order_by} {direction}", params


def _sqlite_value(column: str, value: object) -> object:
    """Topics are BLOBs in nwaku's SQLite schema, hashes raw bytes."""
    if column in (store_query.PUBSUB_TOPIC, store_query.CONTENT_TOPIC):
        return cast(str, value).encode()
    return value


def _postgres_value(column: str, value: object) -> object:
    """Hashes are hex VARCHARs in nwaku's PostgreSQL schema."""
    if column == store_query.MESSAGE_HASH:
        return cast(bytes, value).hex()
    return value


def _stored(
    hash_: bytes,
    pubsub: str,
    content: str,
    payload: bytes,
    version: int,
    timestamp: int,
    meta: bytes | None,
    include_data: bool,
) -> StoredMessage:
    message = None
    if include_data:
        message = WakuMessage(
            payload=payload, content_topic=content, version=version, timestamp=timestamp, meta=meta or b""
        )
    return StoredMessage(hash_, pubsub, message, timestamp)


class _Dedup:
    """Message hashes already loaded (client-side ON CONFLICT DO NOTHING)."""

    def __init__(self) -> None:
        self.seen: set[bytes] = set()
        self.duplicates = 0

    def fresh(self, batch: Sequence[tuple[str, WakuMessage, int]]) -> list[tuple[bytes, str, WakuMessage]]:
        out = []
        for pubsub, message, _arrival in batch:
            h = message_hash(pubsub, message)
            if h in self.seen:
                self.duplicates += 1
                continue
            self.seen.add(h)
            out.append((h, pubsub, message))
        return out


# --- SQLite ------------------------------------------------------------------


class SqliteBackend:
    """nwaku's SQLite archive in a file under ``directory``."""

    name = "sqlite"

    def __init__(self, directory: Path):
        self.path = Path(directory) / "store.sqlite3"
        self._db: sqlite3.Connection | None = None
        self._dedup = _Dedup()
        self.loaded = 0

    def start(self) -> None:
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        mode = self._db.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if mode.lower() != "wal":
            raise BackendError(f"sqlite refused WAL mode ({mode})")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS Message ("
            " pubsubTopic BLOB NOT NULL, contentTopic BLOB NOT NULL, payload BLOB,"
            " version INTEGER NOT NULL, id BLOB, messageHash BLOB, timestamp INTEGER NOT NULL,"
            " meta BLOB, CONSTRAINT messageIndex PRIMARY KEY (messageHash)) WITHOUT ROWID"
        )
        self._db.execute("CREATE INDEX IF NOT EXISTS i_ts ON Message (timestamp)")

    def load_batch(self, batch: Sequence[tuple[str, WakuMessage, int]]) -> int:
        rows = [
            (h, pubsub.encode(), m.content_topic.encode(), m.payload, m.version, m.timestamp, m.meta)
            for h, pubsub, m in self._dedup.fresh(batch)
        ]
        db = self._db
        assert db is not None  # start() opened it
        db.execute("BEGIN")
        try:
            db.executemany(
                "INSERT INTO Message (messageHash, pubsubTopic, contentTopic, payload, version,"
                " timestamp, meta) VALUES (?, ?, ?, ?, ?, ?, ?)",
                rows,
            )
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        self.loaded += len(rows)
        return len(rows)

    def after_load(self) -> dict[str, float]:
        """nwaku's SQLite driver runs no ANALYZE: nothing to do."""
        return {}

    def query(self, query: HistoryQuery) -> Page:
        db = self._db
        assert db is not None  # start() opened it
        key = None
        if query.cursor is not None:
            found = db.execute("SELECT timestamp FROM Message WHERE messageHash = (?)", (query.cursor,)).fetchone()
            if found is None:
                raise unknown_cursor()
            key = (found[0], query.cursor)
        where, params = _filter_and_order(query, key, "?", _sqlite_value)
        sql = (
            "SELECT messageHash, pubsubTopic, contentTopic, payload, version, timestamp, meta FROM Message"
            f"{where} LIMIT {query.limit + 1};"
        )
        rows = [
            _stored(h, p.decode(), c.decode(), payload, v, ts, meta, query.include_data)
            for h, p, c, payload, v, ts, meta in db.execute(sql, params)
        ]
        return store_query.finish_page(query, rows)

    def size_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.path.parent.glob(self.path.name + "*"))

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None


# --- PostgreSQL ----------------------------------------------------------------


def find_postgres_bin() -> Path | None:
    """The directory holding ``pg_ctl`` and ``initdb``, or None."""
    found = shutil.which("pg_ctl")
    if found:
        directory = Path(found).resolve().parent
        if (directory / "initdb").exists():
            return directory
    candidates = glob.glob("/usr/lib/postgresql/*/bin/pg_ctl")

    def version(path: str) -> tuple[int, ...]:
        part = Path(path).parts[-3]
        return tuple(int(x) for x in part.split(".") if x.isdigit())

    for candidate in sorted(candidates, key=version, reverse=True):
        directory = Path(candidate).parent
        if (directory / "initdb").exists():
            return directory
    return None


def ensure_postgres(say: Callable[[str], None] = print) -> Path:
    """Find PostgreSQL's server binaries, installing Debian's package when
    missing (needs root and the network)."""
    directory = find_postgres_bin()
    if directory is not None:
        return directory
    if os.geteuid() != 0:
        raise BackendError("PostgreSQL is not installed; run `apt-get install -y postgresql` as root")
    say("PostgreSQL not found: installing Debian's postgresql package (apt-get)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in (["apt-get", "update"], ["apt-get", "install", "-y", "postgresql"]):
        done = subprocess.run(command, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise BackendError(f"{shlex.join(command)} failed: {done.stderr.strip()[-500:]}")
    directory = find_postgres_bin()
    if directory is None:
        raise BackendError("installed postgresql but found no pg_ctl/initdb")
    return directory


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PostgresServer:
    """A throwaway PostgreSQL cluster in a temporary directory, on loopback.

    Runs as the ``postgres`` user when we are root (the server refuses to
    run as root). :meth:`stop` always removes the directory.
    """

    def __init__(self, bin_dir: Path):
        self.bin_dir = bin_dir
        self.root: Path | None = None
        self.port = 0
        self._started = False

    @property
    def data_dir(self) -> Path:
        assert self.root is not None  # set by start(), before any use
        return self.root / "data"

    def _as_owner(self, command: list[str]) -> list[str]:
        if os.geteuid() != 0:
            return command
        if shutil.which("runuser"):
            return ["runuser", "-u", "postgres", "--", *command]
        return ["su", "postgres", "-s", "/bin/sh", "-c", shlex.join(command)]

    def _run(self, command: list[str], timeout: float = 120) -> None:
        done = subprocess.run(self._as_owner(command), capture_output=True, text=True, timeout=timeout, cwd=self.root)
        if done.returncode != 0:
            raise BackendError(f"{Path(command[0]).name} failed: {(done.stderr or done.stdout).strip()[-800:]}")

    def start(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="wakustore-bench-pg-"))
        if os.geteuid() == 0:
            import pwd

            try:
                owner = pwd.getpwnam("postgres")
            except KeyError:
                raise BackendError("running as root but there is no `postgres` user") from None
            os.chown(self.root, owner.pw_uid, owner.pw_gid)
        self._run(
            [
                str(self.bin_dir / "initdb"),
                "-D",
                str(self.data_dir),
                "-U",
                "postgres",
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
            ]
        )
        self.port = _free_port()
        # Hourly partitions: a query over many partitions locks each one and
        # its five indexes; the default lock table (64 per connection) is
        # too small for a 30-day window.
        options = f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.root} -c max_locks_per_transaction=1024"
        self._started = True
        self._run(
            [
                str(self.bin_dir / "pg_ctl"),
                "-D",
                str(self.data_dir),
                "-l",
                str(self.root / "server.log"),
                "-w",
                "-t",
                "60",
                "-o",
                options,
                "start",
            ]
        )

    def conninfo(self) -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres"

    def log_tail(self) -> str:
        try:
            # Before start() or after stop() root is None: a TypeError, not "".
            return (self.root / "server.log").read_text()[-2000:]  # type: ignore[operator]
        except OSError:
            return ""

    def stop(self) -> None:
        try:
            if self._started:
                try:
                    self._run(
                        [str(self.bin_dir / "pg_ctl"), "-D", str(self.data_dir), "-m", "fast", "-w", "-t", "60", "stop"]
                    )
                except (BackendError, subprocess.TimeoutExpired):
                    self._kill_postmaster()
                self._started = False
        finally:
            if self.root is not None:
                shutil.rmtree(self.root, ignore_errors=True)
                self.root = None

    def _kill_postmaster(self) -> None:
        import signal

        try:
            pid = int((self.data_dir / "postmaster.pid").read_text().split()[0])
            os.kill(pid, signal.SIGKILL)
        except (OSError, ValueError, IndexError):
            pass


class PostgresBackend:
    """nwaku's PostgreSQL archive on a throwaway server."""

    name = "postgres"

    def __init__(self, start_ns: int, end_ns: int, say: Callable[[str], None] = print):
        self.start_ns = start_ns
        self.end_ns = end_ns
        self.say = say
        self.server: PostgresServer | None = None
        self._conn: psycopg.Connection[tuple[Any, ...]] | None = None
        self._dedup = _Dedup()
        self.loaded = 0
        self.partitions = 0

    def start(self) -> None:
        import psycopg

        self.server = PostgresServer(ensure_postgres(self.say))
        try:
            self.server.start()
            # nwaku's arbitrary queries are not prepared statements.
            self._conn = psycopg.connect(self.server.conninfo(), autocommit=True, prepare_threshold=None)
            self._create_schema()
        except BaseException:
            self.close()
            raise

    def _create_schema(self) -> None:
        assert self._conn is not None  # start() connected
        cur = self._conn.cursor()
        cur.execute(
            "CREATE TABLE messages ("
            " pubsubTopic VARCHAR NOT NULL, contentTopic VARCHAR NOT NULL, payload VARCHAR,"
            " version INTEGER NOT NULL, id VARCHAR NOT NULL, messageHash VARCHAR NOT NULL,"
            " timestamp BIGINT NOT NULL, meta VARCHAR DEFAULT NULL,"
            " CONSTRAINT messageIndex PRIMARY KEY (messageHash, timestamp)"
            ") PARTITION BY RANGE (timestamp)"
        )
        cur.execute("CREATE TABLE messages_lookup (timestamp BIGINT NOT NULL, messageHash VARCHAR NOT NULL)")
        cur.execute(
            "ALTER TABLE messages_lookup ADD CONSTRAINT messageIndexLookupTable PRIMARY KEY (messageHash, timestamp)"
        )
        for statement in (
            "CREATE INDEX idx_messages_messagehash ON messages (messagehash)",
            "CREATE INDEX idx_messages_timestamp ON messages (timestamp)",
            "CREATE INDEX idx_messages_lookup_messagehash ON messages_lookup (messagehash)",
            "CREATE INDEX idx_messages_lookup_timestamp ON messages_lookup (timestamp)",
            "CREATE INDEX idx_query_pubsubtopic ON messages (pubsubTopic)",
            "CREATE INDEX idx_query_contenttopic ON messages (contentTopic)",
        ):
            cur.execute(statement)
        # One partition per o'clock hour covering the dataset, as nwaku's
        # partition factory creates them.
        hour = self.start_ns // NS_PER_HOUR * NS_PER_HOUR
        with self._conn.transaction():
            while hour < self.end_ns:
                start_s, end_s = hour // 1_000_000_000, (hour + NS_PER_HOUR) // 1_000_000_000
                cur.execute(
                    f"CREATE TABLE messages_{start_s}_{end_s} PARTITION OF messages "
                    f"FOR VALUES FROM ({hour}) TO ({hour + NS_PER_HOUR})"
                )
                hour += NS_PER_HOUR
                self.partitions += 1

    def load_batch(self, batch: Sequence[tuple[str, WakuMessage, int]]) -> int:
        rows = self._dedup.fresh(batch)
        messages = io.StringIO()
        lookup = io.StringIO()
        for h, pubsub, m in rows:
            hx = h.hex()
            meta = m.meta.hex() if m.meta else "\\N"
            messages.write(
                f"0\t{hx}\t{_copy_text(pubsub)}\t{_copy_text(m.content_topic)}\t"
                f"{m.payload.hex()}\t{m.version}\t{m.timestamp}\t{meta}\n"
            )
            lookup.write(f"{hx}\t{m.timestamp}\n")
        assert self._conn is not None  # start() connected
        cur = self._conn.cursor()
        with self._conn.transaction():
            with cur.copy(
                "COPY messages (id, messageHash, pubsubTopic, contentTopic, payload, version,"
                " timestamp, meta) FROM STDIN"
            ) as copy:
                copy.write(messages.getvalue())
            with cur.copy("COPY messages_lookup (messageHash, timestamp) FROM STDIN") as copy:
                copy.write(lookup.getvalue())
        self.loaded += len(rows)
        return len(rows)

    def after_load(self) -> dict[str, float]:
        """ANALYZE, as nwaku's daily analyzeTableLoop does (and the lookup table)."""
        assert self._conn is not None  # start() connected
        started = time.perf_counter()
        self._conn.execute("ANALYZE messages")
        self._conn.execute("ANALYZE messages_lookup")
        return {"analyze_s": time.perf_counter() - started}

    def query(self, query: HistoryQuery) -> Page:
        preds, _after = store_query.predicates(query, None)
        if query.cursor is None and [p.column for p in preds] == [store_query.MESSAGE_HASH]:
            # Hashes alone: nwaku's getMessagesByMessageHashes.
            return self._by_hashes(query, cast(tuple[bytes, ...], preds[0].value))
        return self._arbitrary(query)

    def _arbitrary(self, query: HistoryQuery) -> Page:
        assert self._conn is not None  # start() connected
        cur = self._conn.cursor()
        key = None
        if query.cursor is not None:
            found = cur.execute(
                "SELECT timestamp FROM messages_lookup WHERE messageHash = %s", (query.cursor.hex(),)
            ).fetchone()
            if found is None:
                raise unknown_cursor()
            key = (found[0], query.cursor)
        where, args = _filter_and_order(query, key, "%s", _postgres_value)
        sql = (
            "SELECT messageHash, pubsubTopic, contentTopic, payload, version, timestamp, meta FROM messages"
            f"{where} LIMIT %s"
        )
        args.append(query.limit + 1)
        return store_query.finish_page(query, self._decode(cur.execute(sql, args).fetchall(), query))

    def _by_hashes(self, query: HistoryQuery, message_hashes: tuple[bytes, ...]) -> Page:
        hashes = ",".join(f"'{h.hex()}'" for h in message_hashes[:MAX_HASHES_PER_QUERY])
        sql = (
            "WITH min_timestamp AS (SELECT MIN(timestamp) AS min_ts FROM messages_lookup"
            f" WHERE messagehash IN ({hashes}))"
            " SELECT m.messageHash, pubsubTopic, contentTopic, payload, version, m.timestamp, meta"
            " FROM messages m INNER JOIN messages_lookup l"
            " ON m.timestamp = l.timestamp AND m.messagehash = l.messagehash"
            " WHERE l.timestamp >= (SELECT min_ts FROM min_timestamp)"
            f" AND l.messagehash IN ({hashes})"
            f" ORDER BY m.timestamp DESC, m.messagehash DESC LIMIT {query.limit + 1}"
        )
        assert self._conn is not None  # start() connected
        rows = self._decode(self._conn.execute(sql).fetchall(), query)
        if query.forward:
            rows.reverse()
        return store_query.finish_page(query, rows)

    @staticmethod
    def _decode(rows, query: HistoryQuery) -> list[StoredMessage]:
        return [
            _stored(
                bytes.fromhex(h),
                pubsub,
                content,
                bytes.fromhex(payload or ""),
                version,
                ts,
                bytes.fromhex(meta) if meta else None,
                query.include_data,
            )
            for h, pubsub, content, payload, version, ts, meta in rows
        ]

    def size_bytes(self) -> int:
        assert self._conn is not None  # start() connected
        row = self._conn.execute(
            "SELECT sum(pg_total_relation_size(c.oid)) FROM pg_class c "
            "WHERE c.relkind IN ('r', 'p') AND c.relname LIKE 'messages%%'"
        ).fetchone()
        assert row is not None  # an aggregate without GROUP BY always returns one row
        return int(row[0] or 0)

    def server_pids(self) -> list[int]:
        """The postmaster and its backends (for memory figures)."""
        if self.server is None:  # closed or never started
            return []
        try:
            return [int((self.server.data_dir / "postmaster.pid").read_text().split()[0])]
        except (OSError, ValueError, IndexError, AttributeError):
            return []

    def close(self) -> None:
        try:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
        finally:
            if self.server is not None:
                self.server.stop()
                self.server = None


def _copy_text(text: str) -> str:
    """Escape a value for COPY's text format."""
    return text.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")
