"""The engine bootstrap: the embedded Sail child, its supervision, remotes.

Read-only checks share the session-wide ``engine`` fixture (tests/conftest.py);
tests that kill, recycle or close an engine use their own.
"""

import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from wakustore.storage.engine import Engine, EngineUnavailable

# A killed or closed child must be gone well within the sail_server poll
# interval (0.5 s) plus process teardown.
GONE_WITHIN_S = 10.0


def _alive(pid: int) -> bool:
    """Running and not a zombie (PID 1 in a container may never reap)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            return not any(line.startswith("State:") and "Z" in line.split()[1] for line in status)
    except FileNotFoundError:
        return False


def _wait_gone(pid: int, timeout_s: float = GONE_WITHIN_S) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return False


def _select_one(spark):
    return spark.sql("SELECT 1 AS one").collect()[0].one


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def own_engine():
    """An embedded engine this module may kill and recycle."""
    engine = Engine("embedded")
    engine.start()
    try:
        yield engine
    finally:
        engine.close()


# --- the shared engine -------------------------------------------------------


def test_embedded_engine_answers_a_query(engine):
    assert engine.is_embedded
    assert engine.run(_select_one) == 1
    assert engine.pid is not None and _alive(engine.pid)
    assert engine.url.startswith("sc://127.0.0.1:")


def test_health_reports_the_probe_and_the_child_memory(engine):
    health = engine.health()
    assert health.healthy, health.problem
    assert health.pid == engine.pid
    assert health.rss_bytes > 0
    assert health.probe_s is not None and health.probe_s < engine.probe_timeout_s


def test_sessions_are_utc(engine):
    assert engine.run(lambda spark: spark.conf.get("spark.sql.session.timeZone")) == "UTC"


def test_engine_writes_merges_and_reads_delta_shared_with_delta_rs(engine, tmp_path):
    from deltalake import DeltaTable

    path = str(tmp_path / "t")
    schema = "id BIGINT, v STRING, day STRING"
    rows = [(i, f"v{i}", f"2026-11-0{i % 3 + 1}") for i in range(6)]
    engine.run(
        lambda spark: (
            spark.createDataFrame(rows, schema).write.format("delta").mode("append").partitionBy("day").save(path)
        )
    )

    def merge(spark):
        spark.createDataFrame([(5, "dup", "2026-11-03"), (7, "new", "2026-11-02")], schema).createOrReplaceTempView(
            "incoming"
        )
        spark.sql(
            f"MERGE INTO delta.`{path}` AS t USING incoming AS s "
            "ON t.day IN ('2026-11-02', '2026-11-03') AND t.id = s.id WHEN NOT MATCHED THEN INSERT *"
        ).collect()

    engine.run(merge)
    read = engine.run(lambda spark: spark.read.format("delta").load(path).where("day = '2026-11-03'").collect())
    assert sorted((r.id, r.v) for r in read) == [(2, "v2"), (5, "v5")]
    assert engine.run(lambda spark: spark.read.format("delta").load(path).count()) == 7
    assert DeltaTable(path).version() == 1
    assert DeltaTable(path).to_pyarrow_table().num_rows == 7


def test_threads_share_the_engine(engine):
    results, errors = [], []

    def worker(n):
        try:
            for i in range(5):
                results.append(engine.run(lambda spark, k=n * 10 + i: spark.sql(f"SELECT {k} AS k").collect()[0].k))
        except Exception as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert sorted(results) == [n * 10 + i for n in range(6) for i in range(5)]


def test_a_failing_query_is_raised_without_restarting(engine):
    from pyspark.errors import PySparkException

    generation = engine.generation
    with pytest.raises(PySparkException):
        engine.run(lambda spark: spark.sql("SELECT * FROM no_such_table").collect())
    assert engine.generation == generation


def test_remote_target_connects_to_a_running_server(engine):
    with Engine(engine.url) as remote:
        assert not remote.is_embedded
        assert remote.pid is None
        assert remote.run(_select_one) == 1
        assert remote.health().healthy


# --- supervision ---------------------------------------------------------------


def test_killed_child_is_restarted_and_the_next_query_works(own_engine):
    generation, pid = own_engine.generation, own_engine.pid
    os.kill(pid, signal.SIGKILL)
    assert _wait_gone(pid)
    assert own_engine.run(_select_one) == 1
    assert own_engine.generation == generation + 1
    assert own_engine.pid != pid


def test_supervise_restarts_a_dead_child(own_engine):
    generation, pid = own_engine.generation, own_engine.pid
    os.kill(pid, signal.SIGKILL)
    assert _wait_gone(pid)
    health = own_engine.supervise()
    assert health.healthy, health.problem
    assert health.generation == generation + 1
    assert health.pid != pid


def test_supervise_leaves_a_healthy_engine_alone(own_engine):
    generation, pid = own_engine.generation, own_engine.pid
    assert own_engine.supervise().healthy
    assert (own_engine.generation, own_engine.pid) == (generation, pid)


def test_memory_ceiling_recycles_the_child(own_engine):
    generation, pid = own_engine.generation, own_engine.pid
    own_engine.memory_ceiling_bytes = 1
    try:
        health = own_engine.supervise()
        assert health.generation == generation + 1
        assert own_engine.pid != pid
        assert _wait_gone(pid)
        # run() checks the ceiling after each call as well.
        assert own_engine.run(_select_one) == 1
        assert own_engine.generation == generation + 2
    finally:
        own_engine.memory_ceiling_bytes = None
    assert own_engine.run(_select_one) == 1
    assert own_engine.generation == generation + 2


def test_callers_wait_through_a_recycle_instead_of_failing(own_engine):
    generation = own_engine.generation
    stop = threading.Event()
    answers, errors = [], []

    def query():
        while not stop.is_set():
            try:
                answers.append(own_engine.run(_select_one))
            except Exception as exc:  # reported below
                errors.append(exc)

    threads = [threading.Thread(target=query) for _ in range(3)]
    for thread in threads:
        thread.start()
    try:
        assert own_engine.recycle() == generation + 1
        assert own_engine.recycle() == generation + 2
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert not errors
    assert answers and set(answers) == {1}


def test_an_expired_session_is_replaced_on_the_same_child():
    # Sail drops a session idle for spark.session_timeout_secs (default 900).
    with Engine(sail_env={"SAIL_SPARK__SESSION_TIMEOUT_SECS": "1"}) as engine:
        generation, pid = engine.generation, engine.pid
        time.sleep(1.5)
        assert engine.run(_select_one) == 1
        assert engine.generation == generation + 1
        assert engine.pid == pid


# --- shutdown and failures -----------------------------------------------------


def test_close_leaves_no_child_process():
    engine = Engine()
    engine.start()
    pid = engine.pid
    engine.close()
    assert not _alive(pid)
    assert engine.pid is None
    with pytest.raises(EngineUnavailable):
        engine.run(_select_one)
    engine.close()  # idempotent


def test_child_exits_when_the_parent_is_killed(tmp_path):
    script = (
        "import sys, time\n"
        "from wakustore.storage.engine import Engine\n"
        "engine = Engine()\n"
        "engine.start()\n"
        "print(engine.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        child_pid = int(parent.stdout.readline())
        assert _alive(child_pid)
    finally:
        parent.kill()
        parent.wait()
    assert _wait_gone(child_pid)


def test_unreachable_remote_fails_fast_with_engine_unavailable():
    url = f"sc://127.0.0.1:{_closed_port()}"
    engine = Engine(url, probe_timeout_s=1.5)
    for attempt in (engine.start, lambda: engine.run(_select_one)):
        started = time.monotonic()
        with pytest.raises(EngineUnavailable, match=url):
            attempt()
        assert time.monotonic() - started < engine.probe_timeout_s + 2
    engine.close()


def test_unknown_target_is_rejected():
    with pytest.raises(ValueError):
        Engine("local[2]")


def test_an_engine_that_stops_answering_holds_one_probe_thread_not_one_a_check():
    """The engine's process stopped (SIGSTOP): each health check reports it
    unavailable, and only the first probe's thread waits on it; the others
    answer at once."""
    import signal
    import threading

    engine = Engine(probe_timeout_s=1.0)
    engine.start()
    os.kill(engine.pid, signal.SIGSTOP)
    try:
        first = engine.health()
        assert not first.healthy and "no answer" in first.problem
        started = time.monotonic()
        for _ in range(4):
            health = engine.health()
            assert not health.healthy and "not been answered yet" in health.problem
        assert time.monotonic() - started < 2 * engine.probe_timeout_s
        assert len([t for t in threading.enumerate() if t.name == "engine-probe"]) == 1
    finally:
        os.kill(engine.pid, signal.SIGCONT)
    deadline = time.monotonic() + 30
    while not engine.health().healthy and time.monotonic() < deadline:
        time.sleep(0.2)
    assert engine.health().healthy  # answered again: the waiting probe ended, new ones run
    engine.close()
