"""Shared fixtures: one embedded engine of each kind for the whole session
(Sail, and Apache Spark with Delta Lake, started on first use); small file
systems to fill up; files damaged as a disk or an operator damages them.

``engine`` is Sail for the tests whose subject is not the engine (wire
protocols, interop, the node's services). The storage tests take
``engine`` from :func:`any_engine` instead (tests/storage/conftest.py):
each of them runs on both engines, the Sail ones first, then the Spark
ones (pytest groups a session fixture's parameters, so each engine starts
once).
"""

import contextlib
import os
import subprocess
from pathlib import Path

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


# How a file of the data dir is damaged (tests of bad files): bytes flipped
# in its middle (its ends, Parquet's magic and footer, intact), cut to half,
# replaced by a directory (a file no read gets bytes from: the tests run as
# root, whom no file mode stops), deleted.
DAMAGES = ("flipped", "truncated", "directory", "deleted")


def _damage(path: Path, how: str, flipped_bytes: int = 64) -> None:
    if how == "flipped":
        raw = bytearray(path.read_bytes())
        middle = len(raw) // 2
        raw[middle : middle + flipped_bytes] = bytes(b ^ 0xFF for b in raw[middle : middle + flipped_bytes])
        path.write_bytes(bytes(raw))
    elif how == "truncated":
        os.truncate(path, path.stat().st_size // 2)
    elif how == "directory":
        path.unlink()
        path.mkdir()
    elif how == "deleted":
        path.unlink()
    else:
        raise ValueError(f"no damage {how!r}")


@pytest.fixture
def damage():
    """``damage(path, how, flipped_bytes=64)``, ``how`` one of :data:`DAMAGES`."""
    return _damage
