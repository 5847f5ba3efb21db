"""Each difference storage/dialect.py records, held against the real
engines: every test runs on Sail and on Spark with Delta (the storage
tests' ``engine``), and checks that what the dialect says of the engine
is what the engine does."""

from __future__ import annotations

import threading

import pyarrow as pa
import pytest

from wakustore.storage import dialect
from wakustore.storage.engine import CommitConflict
from wakustore.storage.table import DeltaTableRef


def _sql(engine, statement: str):
    return engine.run(lambda spark: spark.sql(statement).collect(), retry=False)


def test_the_engine_kind_is_read_from_select_version(engine):
    version = _sql(engine, "SELECT version()")[0][0]
    assert dialect.kind_of_version(version) == engine.kind
    # A remote endpoint's kind is found the same way on connect.
    from wakustore.storage.engine import Engine

    with Engine(engine.url) as remote:
        assert remote.kind == engine.kind


def test_optimize_vacuum_and_history_are_delta_sql_on_spark_and_refused_by_sail(engine, table):
    table.append(_rows([b"a", b"b"]))
    statements = [
        f"OPTIMIZE delta.`{table.uri}`",
        f"VACUUM delta.`{table.uri}` RETAIN 168 HOURS",
    ]
    for statement in statements:
        if dialect.has_optimize(engine.kind):
            assert _sql(engine, statement)
        else:
            with pytest.raises(Exception) as refused:
                _sql(engine, statement)
            assert dialect.lacks_optimize(refused.value)
    history = f"DESCRIBE HISTORY delta.`{table.uri}`"
    if engine.kind == dialect.SPARK:
        operations = [row["operation"] for row in _sql(engine, history)]
        assert "OPTIMIZE" not in operations[-1:] and "WRITE" in operations
    else:
        with pytest.raises(Exception, match="found HISTORY"):
            _sql(engine, history)


def test_create_table_on_a_path_with_properties_only_where_the_dialect_says(engine, tmp_path):
    uri = str(tmp_path / "created")
    statement = (
        f"CREATE TABLE IF NOT EXISTS delta.`{uri}` (k BINARY, day DATE) USING delta "
        "PARTITIONED BY (day) TBLPROPERTIES ('wakustore.test' = '7')"
    )
    if dialect.creates_path_tables(engine.kind):
        _sql(engine, statement)
        from deltalake import DeltaTable

        assert DeltaTable(uri).metadata().configuration["wakustore.test"] == "7"
    else:
        with pytest.raises(Exception, match="Database not found: delta"):
            _sql(engine, statement)


def test_a_merge_reports_the_rows_it_inserted_in_either_form(engine, table):
    # Two new keys and one already there: the dialect reads 2 from either answer.
    table.append(_rows([b"a", b"b"]))

    def merge(spark):
        spark.createDataFrame(_rows([b"a", b"c", b"d"])).createOrReplaceTempView("incoming")
        return spark.sql(
            f"MERGE INTO delta.`{table.uri}` AS t USING incoming AS s ON t.muid = s.muid WHEN NOT MATCHED THEN INSERT *"
        ).collect()

    result = engine.run(merge, retry=False)
    assert dialect.inserted_rows(result) == 2
    assert ("num_inserted_rows" in result[0].asDict()) == (engine.kind == dialect.SPARK)


def test_a_lost_commit_race_is_a_commit_conflict_on_either_engine(engine, table):
    """Two writers MERGE into one day at once until one loses a race: the
    engine's own error (Sail's text, Spark's DELTA_CONCURRENT_* condition)
    is classified as a conflict, and nothing else failed."""
    table.append(_rows([b"seed"]))
    failures: list[BaseException] = []
    conflicts: list[CommitConflict] = []

    def writer(name: bytes) -> None:
        for i in range(12):
            rows = _rows([name + str(i).encode()])

            def merge(spark, rows=rows, view=f"w_{name.decode()}_{i}"):
                spark.createDataFrame(rows).createOrReplaceTempView(view)
                return spark.sql(
                    f"MERGE INTO delta.`{table.uri}` AS t USING {view} AS s "
                    "ON t.day = s.day AND t.muid = s.muid WHEN NOT MATCHED THEN INSERT *"
                ).collect()

            try:
                engine.run(merge, retry=False)
            except CommitConflict as exc:
                conflicts.append(exc)
            except BaseException as exc:
                failures.append(exc)
            if conflicts:
                return

    threads = [threading.Thread(target=writer, args=(n,)) for n in (b"x", b"y", b"z")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    assert conflicts, "three writers never lost a race: the test did not test"
    assert dialect.is_commit_conflict(conflicts[0].__cause__)


def _rows(keys: list[bytes]) -> pa.Table:
    import datetime as dt

    return pa.table(
        {
            "muid": pa.array(keys, pa.binary()),
            "day": pa.array([dt.date(2026, 1, 2)] * len(keys), pa.date32()),
            "v": pa.array(range(len(keys)), pa.int64()),
        }
    )


@pytest.fixture
def table(engine, tmp_path):
    """A small table of (muid, day, v), not the message schema: the
    differences are the engines', whatever the columns."""
    from deltalake import DeltaTable

    uri = str(tmp_path / "t")
    DeltaTable.create(uri, _rows([]).schema, partition_by=["day"])
    return DeltaTableRef(engine, uri)
