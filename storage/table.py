"""A Delta table reached through the engine: the only place queries are built.

Everything here goes through the Spark Connect DataFrame API or SQL that
both Sail and Spark with Delta accept; where they differ,
:mod:`dialect` decides. Creating the table and setting its properties use
delta-rs with an embedded engine (either), and on a remote one Delta SQL
where the engine has it, an empty append where not (a Sail cluster).
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from wakustore.storage import dialect, schema, window_files
from wakustore.storage.commit_sync import CommitSync
from wakustore.storage.rows import binary_prefixes
from wakustore.storage.staging import is_local, staging_dir

if TYPE_CHECKING:
    from wakustore.storage.engine import Engine

# The order of a window's rows (an export reads them in this order).
_WINDOW_ORDER = ("timestamp", "message_hash")

# Target size of the files a window replacement writes (Sail's Delta write
# option). Sail keeps an open file per day partition and core, each
# buffered in memory up to this size: with its default (100 MiB) a week's
# window of 250k messages was held whole, and the engine peaked at ~0.9 GB
# for 200k messages; at 8 MiB it peaked ~0.25 GB lower (bench archive,
# one window). Days stay a few files each, which compaction rewrites.
REPLACE_TARGET_FILE_BYTES = 8 * 1024 * 1024


def fetch_arrow(frame) -> pa.Table:
    """The result of ``frame`` as Arrow in one round trip.

    ``DataFrame.toArrow()`` first asks the server for the schema
    (AnalyzePlan), then runs the plan: two round trips of the ~5-10 ms a
    Spark Connect call costs here. The client's ``_to_table()`` (what
    toArrow itself calls, pyspark 4.x) runs the plan alone.
    """
    to_table = getattr(frame, "_to_table", None)
    if to_table is None:
        return frame.toArrow()
    table, _schema = to_table()
    return table


def sql_string(text: str) -> str:
    """A Spark SQL string literal (backslash escapes are on by default)."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


# How long commit files stay in the log once a checkpoint covers them
# (see DeltaTableRef.trim_log): long enough for any reader of this node's
# table, which advances on every commit.
LOG_RETENTION = "interval 1 minute"
# The same for a table a fleet shares: every node trims (each commits up to
# once a second, and all their commits lengthen the one log every commit
# lists). Each engine loads the log again for every operation and each
# reader advances within CHECK_INTERVAL_S or reloads from the checkpoint, so
# minutes are more than any of them holds a version; ten leave room for a
# slow commit's conflict check.
SHARED_LOG_RETENTION = "interval 10 minutes"


def _log_files(log_dir: Path) -> list[str]:
    try:
        return os.listdir(log_dir)
    except FileNotFoundError:
        return []


class DeltaTableRef:
    """One Delta table at ``uri``, read and written through ``engine``."""

    def __init__(self, engine: Engine, uri: str):
        self.engine = engine
        self.uri = uri
        # Whether the bulk work on a window is done by this process instead
        # of the engine: a replacement written here (window_files), an
        # export's days read from the files (TableReader.day_rows). Set by
        # the store of a table it owns on this machine with the embedded
        # engine; a fleet's shared table and a remote engine keep the engine.
        self.bulk_in_process = False
        self._commits = CommitSync(uri.removeprefix("file://")) if is_local(uri) else None

    def sync_commits(self) -> int:
        """Make the commits since the last call durable (a table on this
        machine's disk; see :mod:`commit_sync`); the newest version synced
        (-1 on object storage, where a commit is durable when it returns)."""
        return -1 if self._commits is None else self._commits.sync()

    def repair_torn_log(self):
        """Put aside the log versions a power cut tore (storage/log_repair.py):
        for a table this node alone writes on this machine's disk, before
        anything reads it. Returns the :class:`log_repair.Repair`."""
        from wakustore.storage import log_repair

        if self._commits is None:
            return log_repair.Repair()
        return log_repair.repair(self._commits.root)

    # --- creation ----------------------------------------------------------

    def ensure(self, arrow_schema: pa.Schema, partition: str, description: str) -> None:
        """Create the table if it does not exist; record the schema version."""
        if self.engine.is_embedded:
            from deltalake import DeltaTable
            from deltalake.exceptions import CommitFailedError, TableNotFoundError

            try:
                table = DeltaTable(self.uri)
            except TableNotFoundError:
                table = DeltaTable.create(
                    self.uri,
                    arrow_schema,
                    partition_by=[partition],
                    description=description,
                    mode="ignore",
                )
                try:
                    table.alter.set_table_properties(
                        {schema.SCHEMA_VERSION_PROPERTY: str(schema.SCHEMA_VERSION)},
                        raise_if_not_exists=False,
                    )
                except CommitFailedError:
                    # Another process created the table at the same moment
                    # and set the property first.
                    table = DeltaTable(self.uri)
                    if schema.SCHEMA_VERSION_PROPERTY not in table.metadata().configuration:
                        raise
            self._migrate(int(table.metadata().configuration.get(schema.SCHEMA_VERSION_PROPERTY, "1")))
        else:
            columns = ", ".join(f"`{f.name}` {_spark_type(f.type)}" for f in arrow_schema)

            def create(spark):
                if dialect.creates_path_tables(self.engine.kind):
                    spark.sql(
                        f"CREATE TABLE IF NOT EXISTS delta.`{self.uri}` ({columns}) USING delta "
                        f"PARTITIONED BY ({partition}) "
                        f"TBLPROPERTIES ('{schema.SCHEMA_VERSION_PROPERTY}' = '{schema.SCHEMA_VERSION}')"
                    ).collect()
                else:
                    # An empty append creates the table (schema version 1 implied).
                    empty = spark.createDataFrame([], _spark_schema(spark, arrow_schema))
                    empty.write.format("delta").mode("append").partitionBy(partition).save(self.uri)

            self.engine.run(create)

    def _migrate(self, version: int) -> None:
        while version < schema.SCHEMA_VERSION:
            for statement in schema.MIGRATIONS[version]:

                def run(spark, s=statement):
                    return spark.sql(s.format(table=f"delta.`{self.uri}`")).collect()

                self.engine.run(run)
            version += 1

    # --- ad hoc reads ----------------------------------------------------------

    def query_sql(self, statement: str, limit: int) -> pa.Table:
        """At most ``limit`` rows of a SQL query (Spark SQL, through the
        engine) over the committed table, named ``messages``. The caller
        lets through queries only (the view is read-only anyway: a path
        table behind a temporary view)."""

        def run(spark):
            spark.read.format("delta").load(self.uri).createOrReplaceTempView("messages")
            return spark.sql(statement).limit(limit).toArrow()

        return self.engine.run(run)

    # --- writes ------------------------------------------------------------

    def merge_new(self, batch: pa.Table, key: str, partition: str, partition_values: Sequence[Any]) -> None:
        """Insert the rows of ``batch`` whose ``key`` the touched partitions lack.

        The embedded engine gets the batch of a table on this machine's
        file system as a Parquet file staged beside it, not inside the
        request: Sail keeps memory
        for every MERGE whose source came in the request (measured, 11k
        rows a MERGE: the engine grew 17 MB a MERGE, against 2-4 MB with
        the source read from a staged file, and the MERGE took 0.155 s
        against 0.115 s)."""
        days = ", ".join(_sql_literal(v) for v in partition_values)
        view = f"batch_{uuid.uuid4().hex}"
        staged = staging_dir(self.uri) if self.engine.is_embedded and is_local(self.uri) and batch.num_rows else None
        if staged is not None:
            import pyarrow.parquet as pq

            staged.mkdir(parents=True, exist_ok=True)
            pq.write_table(batch, str(staged / "rows.parquet"), compression="none")

        def run(spark):
            if staged is not None:
                spark.sql(
                    f"MERGE INTO delta.`{self.uri}` AS t USING (SELECT * FROM parquet.`{staged / 'rows.parquet'}`) AS s "
                    f"ON t.{partition} IN ({days}) AND t.{key} = s.{key} "
                    "WHEN NOT MATCHED THEN INSERT *"
                ).collect()
                return
            spark.createDataFrame(batch).createOrReplaceTempView(view)
            try:
                spark.sql(
                    f"MERGE INTO delta.`{self.uri}` AS t USING {view} AS s "
                    f"ON t.{partition} IN ({days}) AND t.{key} = s.{key} "
                    "WHEN NOT MATCHED THEN INSERT *"
                ).collect()
            finally:
                spark.catalog.dropTempView(view)

        try:
            self.engine.run(run)
        finally:
            if staged is not None:
                shutil.rmtree(staged, ignore_errors=True)

    def append(self, batch: pa.Table, retry: bool = True) -> None:
        self.engine.run(
            lambda spark: spark.createDataFrame(batch).write.format("delta").mode("append").save(self.uri),
            retry=retry,
        )

    def trim_log(self, retention: str = LOG_RETENTION) -> int:
        """Delete the commit files of the Delta log that a checkpoint made
        unnecessary and that are older than ``retention`` (the table's
        ``delta.logRetentionDuration``, set here once), with the engine's
        checksum files of those versions; returns the files removed.
        Embedded only (a cluster keeps its log its own way): 0 elsewhere.

        Why: the engine checkpoints every 10 commits but the commit files
        stay (30 days by default), and every commit and every refresh of a
        reader lists the log. Measured here, 2,000 commits made each append
        take 33 ms instead of 13; a node commits up to once a second."""
        if not self.engine.is_embedded:
            return 0
        from deltalake import DeltaTable

        table = DeltaTable(self.uri)
        if table.metadata().configuration.get("delta.logRetentionDuration") != retention:
            table.alter.set_table_properties({"delta.logRetentionDuration": retention}, raise_if_not_exists=False)
            table = DeltaTable(self.uri)
        local = is_local(self.uri)
        log_dir = Path(self.uri.removeprefix("file://")) / "_delta_log"
        before = _log_files(log_dir) if local else []
        table.cleanup_metadata()
        if not local:
            return 0  # removed, uncounted
        names = _log_files(log_dir)
        removed = len(before) - len(names)
        commits = [int(name[:20]) for name in names if name.endswith(".json") and name[:20].isdigit()]
        if commits:
            oldest = min(commits)
            for name in names:
                if name.endswith(".crc") and name[:20].isdigit() and int(name[:20]) < oldest:
                    (log_dir / name).unlink(missing_ok=True)
                    removed += 1
        return removed

    def key_day_batches(self, column: str, partition: str) -> Iterator[tuple[list[bytes], list[Any]]]:
        """Every value of one key column with its partition value, in batches
        (embedded: read by delta-rs straight from the files; cluster: through
        the engine)."""
        if self.engine.is_embedded:
            from deltalake import DeltaTable

            dataset = DeltaTable(self.uri).to_pyarrow_dataset()
            for batch in dataset.to_batches(columns=[column, partition], batch_size=1_000_000):
                yield batch.column(0).to_pylist(), batch.column(1).to_pylist()
            return
        table = self.engine.run(
            lambda spark: fetch_arrow(spark.read.format("delta").load(self.uri).select(column, partition))
        )
        for batch in table.to_batches(max_chunksize=1_000_000):
            yield batch.column(0).to_pylist(), batch.column(1).to_pylist()

    def prefix_batches(self, column: str, batch_rows: int = 1_000_000) -> Iterator[np.ndarray]:
        """The first 8 bytes (big-endian, as unsigned 64-bit integers) of
        every value of a binary column of at least 8 bytes (hashes), in
        chunks: an integrity check over the whole table without a Python
        object per row. Embedded: read by delta-rs from the files;
        cluster: through the engine."""
        if self.engine.is_embedded:
            from deltalake import DeltaTable

            dataset = DeltaTable(self.uri).to_pyarrow_dataset()
            batches = (b.column(0) for b in dataset.to_batches(columns=[column], batch_size=batch_rows))
        else:
            table = self.engine.run(lambda spark: fetch_arrow(spark.read.format("delta").load(self.uri).select(column)))
            batches = (b.column(0) for b in table.to_batches(max_chunksize=batch_rows))
        for values in batches:
            yield binary_prefixes(values, 8)

    def existing_keys(self, column: str, keys: Sequence[bytes], partition: str, days: Sequence[Any]) -> set[bytes]:
        """Which of ``keys`` the table holds, looking only in partitions ``days``."""
        if not keys or not days:
            return set()
        from pyspark.sql import functions as F

        def run(spark):
            return (
                spark.read.format("delta")
                .load(self.uri)
                .where(F.col(partition).isin(list(days)) & F.col(column).isin(list(keys)))
                .select(column)
            )

        found = self.engine.run(lambda spark: fetch_arrow(run(spark)))
        return set(found.column(0).to_pylist())

    def replace_where(self, batch: pa.Table | str, start_ns: int, end_ns: int, content_topics: Sequence[str]) -> None:
        """One transaction: the window's rows for these topics become ``batch``
        (an Arrow table, or the path of staged Parquet files the engine reads).
        With :attr:`bulk_in_process`, written and committed here
        (:mod:`window_files`)."""
        if self.bulk_in_process:
            window_files.replace_window(self.uri, batch, start_ns, end_ns, content_topics)
            self.sync_commits()
            return
        topics = ", ".join(sql_string(t) for t in content_topics)
        first, last = schema.day_of_ns(start_ns), schema.day_of_ns(max(end_ns - 1, start_ns))
        predicate = (
            f"day >= DATE'{first.isoformat()}' AND day <= DATE'{last.isoformat()}' "
            f"AND timestamp >= {int(start_ns)} AND timestamp < {int(end_ns)} "
            f"AND content_topic IN ({topics})"
        )

        def run(spark):
            if isinstance(batch, str):
                frame = spark.read.schema(_spark_schema(spark, schema.MESSAGES)).parquet(batch)
            elif batch.num_rows:
                frame = spark.createDataFrame(batch)
            else:
                frame = spark.createDataFrame([], _spark_schema(spark, batch.schema))
            (
                frame.write.format("delta")
                .mode("overwrite")
                .option("replaceWhere", predicate)
                .options(**dialect.window_write_options(self.engine.kind, REPLACE_TARGET_FILE_BYTES))
                .save(self.uri)
            )

        self.engine.run(run)
        self.sync_commits()

    def insert_missing(self, batch: pa.Table | str, key: str) -> int:
        """One transaction: insert the rows of ``batch`` (an Arrow table, or
        the path of staged message Parquet files) whose ``key`` no row of
        the table holds, in any partition; returns the rows inserted.
        ``batch`` must hold each key once (a MERGE inserts every unmatched
        source row)."""
        view = f"batch_{uuid.uuid4().hex}"

        def run(spark):
            if isinstance(batch, str):
                frame = spark.read.schema(_spark_schema(spark, schema.MESSAGES)).parquet(batch)
            else:
                frame = spark.createDataFrame(batch)
            frame.createOrReplaceTempView(view)
            try:
                result = spark.sql(
                    f"MERGE INTO delta.`{self.uri}` AS t USING {view} AS s "
                    f"ON t.{key} = s.{key} WHEN NOT MATCHED THEN INSERT *"
                ).collect()
            finally:
                spark.catalog.dropTempView(view)
            return dialect.inserted_rows(result)

        inserted = self.engine.run(run)
        self.sync_commits()
        return inserted

    def delete_where(self, predicate: str) -> None:
        """One transaction: delete the rows ``predicate`` matches, durably
        (a retention that a power cut undid would serve its rows again)."""
        self.engine.run(lambda spark: spark.sql(f"DELETE FROM delta.`{self.uri}` WHERE {predicate}").collect())
        self.sync_commits()

    # --- reads -------------------------------------------------------------

    def window_days(
        self,
        start_ns: int,
        end_ns: int,
        content_topics: Sequence[str] | None,
        pubsub_topic: str | None = None,
    ) -> Iterator[pa.Table]:
        """Rows with start <= timestamp < end, one day per table, in
        (timestamp, message_hash) order; ``None`` topics mean all."""
        from pyspark.sql import functions as F

        day = schema.day_of_ns(start_ns)
        last = schema.day_of_ns(max(end_ns - 1, start_ns))
        staged = self.engine.is_embedded and is_local(self.uri)
        while day <= last:

            def run(spark, day=day):
                condition = (
                    (F.col("day") == F.lit(day))
                    & (F.col("timestamp") >= F.lit(start_ns))
                    & (F.col("timestamp") < F.lit(end_ns))
                )
                if content_topics is not None:
                    condition = condition & F.col("content_topic").isin(list(content_topics))
                if pubsub_topic is not None:
                    condition = condition & (F.col("pubsub_topic") == F.lit(pubsub_topic))
                return spark.read.format("delta").load(self.uri).where(condition)

            if staged:
                table = self._staged_read(run)
            else:
                table = self.engine.run(lambda spark: fetch_arrow(run(spark).orderBy(*_WINDOW_ORDER)))
            if table.num_rows:
                yield table
            day += dt.timedelta(days=1)

    def _staged_read(self, frame) -> pa.Table:
        """The rows of ``frame(spark)`` in :data:`_WINDOW_ORDER`, written by
        the engine as uncompressed Parquet beside the table and read back
        here (then removed). Through Spark Connect's Arrow results Sail
        spent ~24 µs of CPU a 1.4 KB row (1.2 s for 50k rows, nearly all
        of it on the payload column); a staged file took it 0.16 s. Sorted
        here: the engine may write several files."""
        import pyarrow.parquet as pq

        out = staging_dir(self.uri)
        try:
            self.engine.run(
                lambda spark: frame(spark).write.mode("overwrite").option("compression", "none").parquet(str(out))
            )
            table = pq.read_table(str(out)) if out.exists() else None
        finally:
            shutil.rmtree(out, ignore_errors=True)
        if table is None or not table.num_rows:
            return schema.MESSAGES.empty_table() if table is None else table
        order = pc.sort_indices(table, sort_keys=[(name, "ascending") for name in _WINDOW_ORDER])
        if not np.array_equal(order.to_numpy(), np.arange(table.num_rows)):
            table = table.take(order)
        return table

    def envelope_page(
        self, lower_s: int, upper_s: int, topics: list[bytes], cursor: tuple[int, bytes] | None, fetch: int
    ) -> pa.Table:
        """Envelope rows with lower <= sent <= upper after ``cursor``, ascending."""
        from pyspark.sql import functions as F

        def run(spark):
            sent = F.col("sent")
            condition = (
                (sent >= F.lit(lower_s))
                & (sent <= F.lit(upper_s))
                & (F.col("day") >= F.lit(schema.day_of_seconds(lower_s)))
                & (F.col("day") <= F.lit(schema.day_of_seconds(upper_s)))
            )
            if topics:
                condition = condition & F.col("topic").isin(topics)
            if cursor is not None:
                ts, digest = cursor
                condition = condition & (
                    (sent > F.lit(ts)) | ((sent == F.lit(ts)) & (F.col("envelope_hash") > F.lit(digest)))
                )
            return (
                spark.read.format("delta")
                .load(self.uri)
                .where(condition)
                .select("envelope_hash", "raw", "topic", "expiry", "ttl", "sent", "arrival_time")
                .orderBy("sent", "envelope_hash")
                .limit(fetch)
            )

        return self.engine.run(lambda spark: fetch_arrow(run(spark)))

    def envelope_topics(self, lower_s: int, upper_s: int) -> list[bytes]:
        from pyspark.sql import functions as F

        def run(spark):
            return (
                spark.read.format("delta")
                .load(self.uri)
                .where(
                    (F.col("sent") >= F.lit(lower_s))
                    & (F.col("sent") <= F.lit(upper_s))
                    & (F.col("day") >= F.lit(schema.day_of_seconds(lower_s)))
                    & (F.col("day") <= F.lit(schema.day_of_seconds(upper_s)))
                )
                .select("topic")
                .distinct()
            )

        return [t for t in self.engine.run(lambda spark: fetch_arrow(run(spark))).column(0).to_pylist()]

    def recent(self, since_ns: int, limit: int) -> pa.Table:
        """Full rows with timestamp >= since, newest first, at most ``limit``."""
        from pyspark.sql import functions as F

        def run(spark):
            return (
                spark.read.format("delta")
                .load(self.uri)
                .where((F.col("timestamp") >= F.lit(since_ns)) & (F.col("day") >= F.lit(schema.day_of_ns(since_ns))))
                .orderBy(F.col("timestamp").desc(), F.col("message_hash").desc())
                .limit(limit)
            )

        return self.engine.run(lambda spark: fetch_arrow(run(spark)))

    def oldest_timestamp(self) -> int | None:
        """The smallest ``timestamp`` in the table (file statistics when embedded)."""
        if self.engine.is_embedded:
            from deltalake import DeltaTable

            actions = pa.table(DeltaTable(self.uri).get_add_actions(flatten=True))
            if actions.num_rows == 0:
                return None
            if "min.timestamp" in actions.column_names:
                values = [v for v in actions.column("min.timestamp").to_pylist() if v is not None]
                if len(values) == actions.num_rows:
                    return min(values)
        return self.scalar("SELECT min(timestamp) FROM {table}")

    def count(self) -> int:
        return self.engine.run(lambda spark: spark.read.format("delta").load(self.uri).count())

    def scalar(self, sql: str) -> Any:
        """Run ``sql`` with ``{table}`` replaced by this table; first column of the first row."""
        rows = self.engine.run(lambda spark: spark.sql(sql.format(table=f"delta.`{self.uri}`")).collect())
        return rows[0][0] if rows else None


def _sql_literal(value: Any) -> str:
    if isinstance(value, dt.date):
        return f"DATE'{value.isoformat()}'"
    if isinstance(value, str):
        return sql_string(value)
    return str(int(value))


_SPARK_TYPES = {
    pa.binary(): "BINARY",
    pa.string(): "STRING",
    pa.int32(): "INT",
    pa.int64(): "BIGINT",
    pa.date32(): "DATE",
    pa.bool_(): "BOOLEAN",
}


def _spark_type(arrow_type: pa.DataType) -> str:
    return _SPARK_TYPES[arrow_type]


def _spark_schema(spark, arrow_schema: pa.Schema):
    return ", ".join(f"`{f.name}` {_spark_type(f.type)}" for f in arrow_schema)
