"""The embedded Apache Spark engine's life (storage/spark_server.py under
storage/engine.py): its JVM is measured, restarted when it dies, and gone
when the node that started it dies in any way; without Delta's jars it
fails at once with the command that installs them."""

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from wakustore.storage.engine import Engine, EngineUnavailable

# The wrapper stops its JVM (SIGTERM, then SIGKILL after 20 s) when its
# parent goes; the kernel kills the JVM at once if the wrapper itself dies.
GONE_WITHIN_S = 40.0


def _jvm(engine: Engine) -> psutil.Process:
    (jvm,) = psutil.Process(engine.pid).children()
    assert "java" in jvm.name()
    return jvm


def _wait_gone(pid: int, timeout_s: float = GONE_WITHIN_S) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.1)
    return False


def _select_one(spark):
    return spark.sql("SELECT 1 AS one").collect()[0].one


def test_health_counts_the_jvm_in_the_engine_memory(spark_engine):
    health = spark_engine.health()
    assert health.healthy, health.problem
    jvm = _jvm(spark_engine)
    assert health.rss_bytes >= jvm.memory_info().rss > 100 * 1024 * 1024
    # The JVM bounds its heap itself: no restart ceiling applies.
    assert spark_engine.memory_ceiling_bytes is None


def test_a_killed_jvm_is_replaced_and_the_next_query_works(spark_engine):
    generation, jvm = spark_engine.generation, _jvm(spark_engine)
    jvm.kill()
    assert _wait_gone(jvm.pid)
    assert spark_engine.run(_select_one) == 1
    assert spark_engine.generation == generation + 1
    assert _jvm(spark_engine).pid != jvm.pid


def test_the_jvm_goes_when_the_node_is_killed():
    script = (
        "import time\n"
        "from wakustore.storage.engine import Engine\n"
        "engine = Engine('spark')\n"
        "engine.start()\n"
        "import psutil\n"
        "print(engine.pid, psutil.Process(engine.pid).children()[0].pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        wrapper_pid, jvm_pid = map(int, parent.stdout.readline().split())
        assert psutil.pid_exists(jvm_pid)
    finally:
        parent.kill()
        parent.wait()
    assert _wait_gone(wrapper_pid)
    assert _wait_gone(jvm_pid)


def test_the_jvm_goes_when_its_wrapper_is_killed():
    engine = Engine("spark")
    engine.start()
    try:
        jvm = _jvm(engine)
        os.kill(engine.pid, signal.SIGKILL)
        assert _wait_gone(jvm.pid, 10)  # PR_SET_PDEATHSIG: at once
    finally:
        engine.close()


def test_without_delta_jars_the_engine_says_how_to_install_them(monkeypatch, tmp_path):
    monkeypatch.setenv("WAKUSTORE_CACHE_DIR", str(tmp_path))
    before = set(psutil.Process().children(recursive=True))
    started = time.monotonic()
    engine = Engine("spark")
    with pytest.raises(EngineUnavailable, match=r"python -m wakustore.storage.spark_jars"):
        engine.start()
    assert time.monotonic() - started < 5
    assert set(psutil.Process().children(recursive=True)) == before
    engine.close()
