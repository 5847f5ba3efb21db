"""go-waku's node (``cmd/waku``) built once from the pinned module in
``build/go.mod`` and kept under ``.cache/gowaku/`` at the repository root.

go-waku's go.mod has ``replace`` directives, so ``go install ...@version``
refuses it: ``build/`` is a module of our own that requires go-waku (as a
``tool``), repeats those replaces and pins every dependency in ``go.sum``.
The build uses go-waku's own tag ``gowaku_no_rln`` (no zerokit, no cgo RLN
libraries) and adds one file to go-waku's timesource package
(``build/testdata/no_ntp_servers.go``): the stock node asks public NTP
servers for the time, the tests' nodes send nothing beyond loopback. The go
command lets no build change a file of its module cache (not even through
``-overlay``), so the module, downloaded and checked against ``go.sum``, is
copied beside the binary, the file added to the copy, and the build reads a
copy of go.mod that replaces go-waku with that directory (``-modfile``).

The binary's path is keyed by a digest of go.mod, go.sum, the overlay file
and the build flags: a change to any of them builds a new one, a rerun
reuses it. A build is bounded (``BUILD_TIMEOUT_S``) and a failure raises
:class:`GoWakuBuildError` with go's output: callers fail, never skip.

``python tests/interop_gowaku/gowaku_build.py`` (``make interop-deps``)
builds it and prints the path.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

BUILD_DIR = Path(__file__).resolve().parent / "build"
REPO_ROOT = Path(__file__).resolve().parents[2]
CACHE_DIR = REPO_ROOT / ".cache" / "gowaku"
OVERLAY_SOURCE = BUILD_DIR / "testdata" / "no_ntp_servers.go"
MODULE = "github.com/waku-org/go-waku"
PACKAGE = f"{MODULE}/cmd/waku"
# go-waku's Makefile builds cmd/waku with this tag when NO_RLN=true.
TAGS = "gowaku_no_rln"
# The first build downloads ~200 modules and compiles ~60 MB of Go and cgo
# (go-ethereum's secp256k1, sqlite): about 5 minutes on 2 cores; a cached
# one reuses the binary and takes no time.
BUILD_TIMEOUT_S = 1200.0


class GoWakuBuildError(RuntimeError):
    """The go-waku build failed or took longer than BUILD_TIMEOUT_S."""


def pinned_version() -> str:
    """The go-waku version that build/go.mod requires."""
    match = re.search(rf"^\s*{re.escape(MODULE)} (\S+)", (BUILD_DIR / "go.mod").read_text(), re.MULTILINE)
    if match is None:
        raise GoWakuBuildError(f"build/go.mod requires no {MODULE}")
    return match.group(1)


def binary_path() -> Path:
    """Where the binary of the current build inputs lives (built or not)."""
    digest = hashlib.sha256()
    for part in (BUILD_DIR / "go.mod", BUILD_DIR / "go.sum", OVERLAY_SOURCE):
        digest.update(part.read_bytes())
    digest.update(TAGS.encode())
    return CACHE_DIR / f"{pinned_version()}-{digest.hexdigest()[:12]}" / "waku"


def ensure_gowaku(timeout_s: float = BUILD_TIMEOUT_S, log=print) -> Path:
    """The go-waku binary, built first if missing. Concurrent callers (two
    pytest processes, make and a test) wait for one build under a lock."""
    target = binary_path()
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not target.exists():
            _build(target, timeout_s, log)
    return target


def _build(target: Path, timeout_s: float, log) -> None:
    go = shutil.which("go")
    if go is None:
        raise GoWakuBuildError("the go command is needed to build go-waku (Go 1.24 or newer)")
    deadline = time.monotonic() + timeout_s
    env = {**os.environ, "GOFLAGS": "-mod=readonly", "CGO_ENABLED": "1"}
    version = pinned_version()
    log(f"building go-waku {version} into {target} (first time: several minutes)")
    started = time.monotonic()
    # go mod download checks the module against go.sum.
    download = _run([go, "mod", "download", "-json", f"{MODULE}@{version}"], env, deadline, "download go-waku")
    source = target.parent / "go-waku"
    shutil.rmtree(source, ignore_errors=True)
    shutil.copytree(json.loads(download)["Dir"], source)
    for path in (source, *source.rglob("*")):
        path.chmod(path.stat().st_mode | 0o200)  # the module cache's files are read-only
    shutil.copy(OVERLAY_SOURCE, source / "waku" / "v2" / "timesource" / OVERLAY_SOURCE.name)
    modfile = target.parent / "go.mod"
    modfile.write_text((BUILD_DIR / "go.mod").read_text() + f"\nreplace {MODULE} => {source}\n")
    shutil.copy(BUILD_DIR / "go.sum", target.parent / "go.sum")
    partial = target.with_name("waku.partial")
    _run(
        [
            go,
            "build",
            f"-modfile={modfile}",
            "-trimpath",
            f"-tags={TAGS}",
            f"-ldflags=-X {MODULE}/waku/v2/node.Version={version}",
            "-o",
            str(partial),
            PACKAGE,
        ],
        env,
        deadline,
        "build go-waku",
    )
    partial.replace(target)
    log(f"built go-waku in {time.monotonic() - started:.0f} s")


def _run(command: list[str], env: dict, deadline: float, what: str) -> str:
    """Run one go command in build/ until the deadline; its process group is
    killed and reaped on timeout (go runs compilers and cgo as children)."""
    process = subprocess.Popen(
        command,
        cwd=BUILD_DIR,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        raise GoWakuBuildError(f"could not {what} within the build's time limit: {' '.join(command)}") from None
    except BaseException:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        raise
    if process.returncode != 0:
        raise GoWakuBuildError(f"could not {what} ({' '.join(command)}):\n{stderr[-4000:]}")
    return stdout


if __name__ == "__main__":
    try:
        print(ensure_gowaku(log=lambda line: print(line, file=sys.stderr)))
    except GoWakuBuildError as exc:
        sys.exit(f"go-waku: {exc}")
