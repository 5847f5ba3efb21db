"""Shared fixtures: one embedded engine for the whole session; small file
systems to fill up."""

import contextlib
import subprocess

import pytest


@pytest.fixture(scope="session")
def engine():
    from wakustore.storage.engine import Engine

    engine = Engine("embedded")
    engine.start()
    try:
        yield engine
    finally:
        engine.close()


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
