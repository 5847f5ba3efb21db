"""go-waku's node (``cmd/waku``) and the status-go store client harness
(``build/statusgo``), built from the pinned module in ``build/go.mod`` and
kept under ``.cache/gowaku/`` at the repository root.

go-waku's go.mod has ``replace`` directives, so ``go install ...@version``
refuses it: ``build/`` is a module of our own that requires go-waku (as a
``tool``), repeats those replaces and pins every dependency in ``go.sum``.
Its package ``statusgo`` is the harness: it imports go-waku's
``waku/v2/api`` packages, status-go's store client (see its main.go).
The build uses go-waku's own tag ``gowaku_no_rln`` (no zerokit, no cgo RLN
libraries) and adds one file to each of two go-waku packages
(``ADDED_FILES``, from ``build/testdata/``): to ``timesource``, so the
stock node asks no public NTP server for the time (the tests' nodes send
nothing beyond loopback); to ``api/history``, a setter for the pinger that
``NewStorenodeCycle`` drops at this version (cmd/waku does not import it).
The go command lets no build change a file of its module cache (not even
through ``-overlay``), so the module, downloaded and checked against
``go.sum``, is copied once into the cache directory, the files added to the
copy, and each build reads a copy of go.mod that replaces go-waku with that
directory (``-modfile``).

The cache directory is keyed by a digest of go.mod, go.sum, the added files
and the build tags; the harness binary in it also by its own sources. A
change to any of them builds anew, a rerun reuses what is there. A build is
bounded (``BUILD_TIMEOUT_S``) and a failure raises :class:`GoWakuBuildError`
with go's output: callers fail, never skip.

``python tests/interop_gowaku/gowaku_build.py`` (``make interop-deps``)
builds both and prints their paths.
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
MODULE = "github.com/waku-org/go-waku"
PACKAGE = f"{MODULE}/cmd/waku"
# The harness: a package of build/'s own module.
STATUSGO_PACKAGE = "./statusgo"
STATUSGO_SOURCES = BUILD_DIR / "statusgo"
# go-waku package directory -> file of build/testdata added to it.
ADDED_FILES = {
    "waku/v2/timesource": BUILD_DIR / "testdata" / "no_ntp_servers.go",
    "waku/v2/api/history": BUILD_DIR / "testdata" / "storenode_pinger.go",
}
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


def build_dir() -> Path:
    """The cache directory of the current build inputs (built or not)."""
    digest = hashlib.sha256()
    for part in (BUILD_DIR / "go.mod", BUILD_DIR / "go.sum", *ADDED_FILES.values()):
        digest.update(part.read_bytes())
    digest.update(repr(sorted(ADDED_FILES)).encode())
    digest.update(TAGS.encode())
    return CACHE_DIR / f"{pinned_version()}-{digest.hexdigest()[:12]}"


def binary_path() -> Path:
    """Where go-waku's node of the current build inputs lives."""
    return build_dir() / "waku"


def statusgo_path() -> Path:
    """Where the harness of the current build inputs and sources lives."""
    digest = hashlib.sha256()
    for source in sorted(STATUSGO_SOURCES.glob("*.go")):
        digest.update(source.name.encode() + b"\0" + source.read_bytes())
    return build_dir() / f"statusgo-{digest.hexdigest()[:12]}"


def ensure_gowaku(timeout_s: float = BUILD_TIMEOUT_S, log=print) -> Path:
    """go-waku's node, built first if missing. Concurrent callers (two
    pytest processes, make and a test) wait for one build under a lock."""
    version = pinned_version()
    return _ensure(binary_path(), PACKAGE, f"-X {MODULE}/waku/v2/node.Version={version}", timeout_s, log)


def ensure_statusgo(timeout_s: float = BUILD_TIMEOUT_S, log=print) -> Path:
    """The status-go store client harness, built first if missing."""
    return _ensure(statusgo_path(), STATUSGO_PACKAGE, "", timeout_s, log)


def _ensure(target: Path, package: str, ldflags: str, timeout_s: float, log) -> Path:
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not target.exists():
            _build(target, package, ldflags, timeout_s, log)
    return target


def _build(target: Path, package: str, ldflags: str, timeout_s: float, log) -> None:
    go = shutil.which("go")
    if go is None:
        raise GoWakuBuildError("the go command is needed to build go-waku (Go 1.24 or newer)")
    deadline = time.monotonic() + timeout_s
    env = {**os.environ, "GOFLAGS": "-mod=readonly", "CGO_ENABLED": "1"}
    log(f"building {package} of go-waku {pinned_version()} into {target} (first time: several minutes)")
    started = time.monotonic()
    modfile = _prepare_source(target.parent, go, env, deadline)
    partial = target.with_name(f"{target.name}.partial")
    _run(
        [
            go,
            "build",
            f"-modfile={modfile}",
            "-trimpath",
            f"-tags={TAGS}",
            f"-ldflags={ldflags}",
            "-o",
            str(partial),
            package,
        ],
        env,
        deadline,
        f"build {package}",
    )
    partial.replace(target)
    log(f"built {package} in {time.monotonic() - started:.0f} s")


def _prepare_source(directory: Path, go: str, env: dict, deadline: float) -> Path:
    """go-waku's module copied into ``directory`` with ADDED_FILES, and the
    go.mod that replaces go-waku with it; done once per directory (the
    caller holds its lock). Returns that go.mod."""
    source = directory / "go-waku"
    modfile = directory / "go.mod"
    prepared = directory / ".prepared"
    if prepared.exists():
        return modfile
    # go mod download checks the module against go.sum.
    version = pinned_version()
    download = _run([go, "mod", "download", "-json", f"{MODULE}@{version}"], env, deadline, "download go-waku")
    shutil.rmtree(source, ignore_errors=True)
    shutil.copytree(json.loads(download)["Dir"], source)
    for path in (source, *source.rglob("*")):
        path.chmod(path.stat().st_mode | 0o200)  # the module cache's files are read-only
    for package_dir, added in ADDED_FILES.items():
        shutil.copy(added, source / package_dir / added.name)
    modfile.write_text((BUILD_DIR / "go.mod").read_text() + f"\nreplace {MODULE} => {source}\n")
    shutil.copy(BUILD_DIR / "go.sum", directory / "go.sum")
    prepared.touch()
    return modfile


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
        for ensure in (ensure_gowaku, ensure_statusgo):
            print(ensure(log=lambda line: print(line, file=sys.stderr)))
    except GoWakuBuildError as exc:
        sys.exit(f"go-waku: {exc}")
