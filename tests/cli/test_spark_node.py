"""A node on the embedded Apache Spark engine, as an operator runs it:
``wakustore serve --engine spark``. Pushed messages survive a SIGKILL of
the node (its Spark JVM goes with it) and come back once each after the
restart; ``db sql`` answers beside the running node; ``db stats``,
``compact``, ``vacuum`` and ``retention`` work on the table Spark wrote;
the engine is named by ``WAKUSTORE_ENGINE`` as well as by the flag."""

from __future__ import annotations

import contextlib
import json
import os
import time

import psutil
import pytest

from tests.cli.test_serve import CONTENT_TOPIC, PUBSUB_TOPIC, ServeProcess, wakustore
from wakustore.cli.db import message_to_json
from wakustore.protocols.message import WakuMessage, message_hash

pytestmark = pytest.mark.slow

SPARK = {**os.environ, "WAKUSTORE_ENGINE": "spark"}
DAY = 86_400 * 10**9
# The JVM's wrapper gives it 20 s to stop after its parent dies.
JVM_GONE_WITHIN_S = 40


def _jsonl(path, batch):
    """``batch`` as ``db export`` writes it (what push and import read)."""
    path.write_text("".join(json.dumps(message_to_json(PUBSUB_TOPIC, m)) + "\n" for m in batch))
    return path


def _spark_jvms(process: psutil.Process) -> list[psutil.Process]:
    found = []
    for child in process.children(recursive=True):
        with contextlib.suppress(psutil.Error):  # a zombie has no command line
            if "SparkConnectServer" in " ".join(child.cmdline()):
                found.append(child)
    return found


def test_a_spark_node_keeps_what_it_acknowledged_across_sigkill_and_answers_db_commands(tmp_path):
    data_dir = tmp_path / "data"

    # The node's stderr (and its JVM's warnings) to a file nobody has to drain.
    log = open(tmp_path / "node.log", "w")  # noqa: SIM115 (closed at the end)
    node = ServeProcess(data_dir, "--engine", "spark", stderr=log)
    try:
        peer = node.wait_ready()[0]
        jvms = _spark_jvms(psutil.Process(node.proc.pid))
        assert len(jvms) == 1
        # Within lightpush's drift window (20 s) of now, not of the test's start.
        now = time.time_ns()
        sent = [WakuMessage(b"spark-%d" % i, CONTENT_TOPIC, timestamp=now - i * 1_000_000) for i in range(60)]
        pushed = wakustore(
            "push", "--peer", peer, "--from-jsonl", str(_jsonl(tmp_path / "a.jsonl", sent)), "--rate", "0"
        )
        assert pushed.returncode == 0, pushed.stderr
        assert [json.loads(line)["status_code"] for line in pushed.stdout.splitlines()] == [200] * 60
    finally:
        node.proc.kill()  # SIGKILL: some of it is in the log only
        node.proc.wait()
    assert psutil.wait_procs(jvms, timeout=JVM_GONE_WITHIN_S)[1] == [], "the Spark JVM outlived its node"

    node = ServeProcess(data_dir, env={"WAKUSTORE_ENGINE": "spark"}, stderr=log)
    try:
        peer = node.wait_ready()[0]
        assert _spark_jvms(psutil.Process(node.proc.pid))
        query = wakustore(
            "query",
            "--peer",
            peer,
            "--pubsub-topic",
            PUBSUB_TOPIC,
            "--content-topic",
            CONTENT_TOPIC,
            "--limit",
            "25",
            "--all",
            "--json",
        )
        assert query.returncode == 0, query.stderr
        served = [json.loads(line)["hash"] for line in query.stdout.splitlines()]
        assert sorted(served) == sorted(message_hash(PUBSUB_TOPIC, m).hex() for m in sent)

        # Beside the running node, through a Spark engine of its own.
        deadline = time.monotonic() + 60
        while True:
            sql = wakustore(
                "db",
                "sql",
                "--data-dir",
                str(data_dir),
                "SELECT content_topic, count(*) AS n, sum(length(payload)) AS bytes FROM messages GROUP BY content_topic",
                env=SPARK,
                timeout=300,
            )
            assert sql.returncode == 0, sql.stderr
            rows = [json.loads(line) for line in sql.stdout.splitlines()]
            if sum(r["n"] for r in rows) == 60 or time.monotonic() > deadline:
                break
            time.sleep(1)  # the node commits its log within a second
        assert rows == [{"content_topic": CONTENT_TOPIC, "n": 60, "bytes": sum(len(m.payload) for m in sent)}]
    finally:
        node.proc.terminate()
        assert node.proc.wait(60) == 0
        log.close()

    # History older than lightpush's drift window: imported, over 4 days.
    history = [WakuMessage(b"old-%d" % i, CONTENT_TOPIC, timestamp=now - (1 + i % 4) * DAY - i) for i in range(40)]
    imported = wakustore(
        "db",
        "import",
        "--data-dir",
        str(data_dir),
        "--from-jsonl",
        str(_jsonl(tmp_path / "old.jsonl", history)),
        env=SPARK,
        timeout=300,
    )
    assert imported.returncode == 0, imported.stderr
    stats = wakustore("db", "stats", "--data-dir", str(data_dir), env=SPARK, timeout=300)
    assert stats.returncode == 0, stats.stderr
    assert json.loads(stats.stdout)["rows"] == 100 and json.loads(stats.stdout)["days"] >= 4
    compact = wakustore("db", "compact", "--data-dir", str(data_dir), "--engine", "spark", timeout=300)
    assert compact.returncode == 0, compact.stderr
    vacuum = wakustore("db", "vacuum", "--data-dir", str(data_dir), "--retention-hours", "0", env=SPARK, timeout=300)
    assert vacuum.returncode == 0, vacuum.stderr
    retention = wakustore(
        "db", "retention", "--data-dir", str(data_dir), "--policy", "time:172800", env=SPARK, timeout=300
    )
    assert retention.returncode == 0, retention.stderr
    result = json.loads(retention.stdout)
    assert result["rows_before"] == 100
    assert result["rows_after"] == sum(1 for m in sent + history if m.timestamp >= result["cutoff_ns"])
    assert 60 <= result["rows_after"] < 100
    checked = wakustore("db", "check", "--data-dir", str(data_dir), timeout=300)
    assert checked.returncode == 0, checked.stdout + checked.stderr
