"""Shared fixtures: one embedded engine of each kind for the whole session
(Sail, and Apache Spark with Delta Lake, started on first use); small file
systems to fill up.

``engine`` is Sail for the tests whose subject is not the engine (wire
protocols, interop, the node's services). The storage tests, and the node
tests that run the pipeline (``both_engines`` below), take ``engine`` from
:func:`any_engine` instead: each of them runs on both engines, the Sail
ones first, then the Spark ones (pytest groups a session fixture's
parameters, so each engine starts once).
"""

import contextlib
import subprocess

import pytest

ENGINES = ("sail", "spark")


def _session_engine(kind: str):
    from wakustore.storage.engine import Engine

    engine = Engine(kind)
    engine.start()
    try:
        yield engine
    finally:
        engine.close()


@pytest.fixture(scope="session")
def sail_engine():
    yield from _session_engine("sail")


@pytest.fixture(scope="session")
def spark_engine():
    yield from _session_engine("spark")


@pytest.fixture(scope="session")
def engine(sail_engine):
    return sail_engine


@pytest.fixture(scope="session", params=ENGINES)
def any_engine(request):
    """Each engine in turn, the session's."""
    return request.getfixturevalue(f"{request.param}_engine")


@pytest.fixture(scope="session")
def engine_kind(engine) -> str:
    """The kind of the ``engine`` a test gets ("sail" or "spark")."""
    return engine.kind


@pytest.fixture
def tmpfs(tmp_path):
    """``tmpfs(size)``: a tmpfs of ``size`` ("1m", "160m") mounted under
    tmp_path for the test (root: the test mounts it), unmounted after."""
    with contextlib.ExitStack() as mounts:

        def mount(size: str):
            path = tmp_path / f"tmpfs-{size}"
            path.mkdir()
            done = subprocess.run(
                ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True
            )
            if done.returncode != 0:
                pytest.fail(f"the test mounts a tmpfs (root needed): {done.stderr.decode().strip()}")
            mounts.callback(subprocess.run, ["umount", "-l", str(path)], check=False)
            return path

        yield mount
