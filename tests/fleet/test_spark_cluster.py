"""A fleet on a real Spark cluster: a standalone master and two workers on
loopback (the pinned pyspark's own ``spark-class``) and one Spark Connect
server with Delta Lake on it (``python -m wakustore.storage.spark_server
--master spark://... --s3``), as deploy/ runs it. Two nodes share one
table through it (``engine = "sc://..."``, ``shared_table = true``), in
the S3 bucket and on a shared file system. Every commit goes through that
one Spark driver: on S3, Delta's single-driver log store keeps commits
atomic only so (README, A fleet). A worker killed in the middle of the
commits and the Spark Connect server restarted lose nothing acknowledged
and store nothing twice; ``db check`` finds the table clean; maintenance
on the cluster runs Delta's OPTIMIZE and VACUUM."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest
import trio

from tests.fleet.conftest import BUCKET
from tests.fleet.fleet import (
    check_served,
    messages,
    push_while,
    run,
    running_pair,
    s3_environment,
    settled,
    start_the_dead,
    stored_when_available,
    two_writers,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def s3_nodes(spark_cluster, object_store, fleet_dir):
    with running_pair(
        fleet_dir,
        "spark-s3",
        engine=spark_cluster.url,
        table_root=f"s3://{BUCKET}/spark",
        env=s3_environment(object_store[1].endpoint),
    ) as nodes:
        yield nodes


@pytest.fixture(scope="module")
def shared_fs_nodes(spark_cluster, fleet_dir):
    with running_pair(
        fleet_dir, "spark-fs", engine=spark_cluster.url, table_root=str(fleet_dir / "spark-shared-fs"), env={}
    ) as nodes:
        yield nodes


@pytest.fixture
def restored(spark_cluster):
    """Whatever a failed test left dead in the cluster is started again."""
    yield
    if spark_cluster.process.poll() is not None:
        spark_cluster.start_connect()
    for index, worker in enumerate(spark_cluster.workers):
        if worker is None or worker.poll() is not None:
            spark_cluster.start_worker(index)


def test_two_writers_on_s3_through_one_spark_driver_answer_the_same_set(s3_nodes, restored):
    start_the_dead(s3_nodes)
    two_writers(*s3_nodes, "/fleet/1/spark-s3-writers/proto", gate=None)


def test_two_writers_on_a_shared_file_system_answer_the_same_set(shared_fs_nodes, restored):
    start_the_dead(shared_fs_nodes)
    two_writers(*shared_fs_nodes, "/fleet/1/spark-fs-writers/proto", gate=None)


def test_a_worker_killed_mid_commit_and_the_server_restarted_lose_nothing(
    shared_fs_nodes, spark_cluster, restored, fleet_dir
):
    a, b = shared_fs_nodes
    start_the_dead(shared_fs_nodes)
    topic = "/fleet/1/spark-worker-kill/proto"
    sent = messages(topic, 400)
    acked: list = []
    faults = threading.Event()

    async def scenario() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(push_while, a.peer, sent[:250], acked, faults)
            nursery.start_soon(push_while, b.peer, sent[150:], acked, faults)
            while len(acked) < 150:
                await trio.sleep(0.005)
            # A worker and its executor die while both nodes commit; the
            # driver reruns their tasks on the other worker.
            await trio.to_thread.run_sync(spark_cluster.kill_worker, 0)
            while len(acked) < 300:
                await trio.sleep(0.005)
            faults.set()
            # Then the driver itself: the nodes' commits wait for it.
            await trio.to_thread.run_sync(spark_cluster.kill)

    run(scenario)
    assert len(acked) == 500  # pushes need neither the engine nor its workers
    spark_cluster.start_worker(0)
    spark_cluster.start_connect()  # on the port the nodes know
    settled(a, b)
    for node in (a, b):
        check_served(run(stored_when_available, node.peer, topic), sent, exactly=sent)
    for node in (a, b):
        checked = subprocess.run(
            [
                sys.executable,
                "-m",
                "wakustore",
                "db",
                "check",
                "--data-dir",
                str(node.data_dir),
                "--config",
                str(node.config_path),
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert checked.returncode == 0, checked.stdout + checked.stderr


def test_maintenance_on_the_spark_cluster_runs_optimize_and_vacuum(spark_cluster, tmp_path, restored):
    """What a Sail cluster cannot: OPTIMIZE compacts the shared table and
    VACUUM deletes the files it replaced (Delta's own history says so)."""
    import time

    from wakustore.protocols.message import WakuMessage
    from wakustore.storage import maintenance
    from wakustore.storage.engine import Engine
    from wakustore.storage.message_store import MessageStore, StoreConfig
    from wakustore.storage.table import DeltaTableRef

    engine = Engine(spark_cluster.url)
    engine.start()
    try:
        table = DeltaTableRef(engine, str(tmp_path / "table"))
        store = MessageStore(table, tmp_path / "wal", StoreConfig(shared_table=True))
        store.open()
        now = time.time_ns()
        for batch in range(3):  # three commits: three files to compact
            store.put(
                [
                    ("/waku/2/rs/1/0", WakuMessage(b"m%d-%d" % (batch, i), "/a/1/b/proto", timestamp=now + i), now)
                    for i in range(5)
                ]
            )
            store.flush()
        result = maintenance.run_maintenance(store, None, now, vacuum_hours=0)
        assert result.compaction == {"optimized": 1}
        history = engine.run(lambda spark: spark.sql(f"DESCRIBE HISTORY delta.`{table.uri}`").collect())
        operations = [row["operation"] for row in history]
        assert "OPTIMIZE" in operations and "VACUUM END" in operations, operations
        files = engine.run(lambda spark: spark.sql(f"DESCRIBE DETAIL delta.`{table.uri}`").collect())[0]["numFiles"]
        assert files == 1
        assert store.table.count() == 15
        store.close()
    finally:
        engine.close()
