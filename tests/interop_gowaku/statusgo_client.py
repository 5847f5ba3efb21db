"""The status-go store client harness (``build/statusgo``) as a child
process: one run of one mode against the storenodes given, its JSON summary
parsed, its log (go-waku's, on stderr) and the summary kept in files of the
run's directory.

A run is bounded twice: the harness's own ``-timeout`` (it then reports what
it has, with an error) and, past that, :data:`KILL_GRACE_S` after which its
process group is killed and reaped.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

KILL_GRACE_S = 30.0


@dataclass
class Run:
    returncode: int
    summary: dict
    log_path: Path

    def log_tail(self, size: int = 6000) -> str:
        return self.log_path.read_bytes()[-size:].decode(errors="replace")

    def explain(self) -> str:
        """The summary without its long lists, and the log's tail: what an
        assertion message shows."""
        short = {k: v for k, v in self.summary.items() if k not in ("sent", "requests", "missing")}
        short["missing"] = (self.summary.get("missing") or [])[:5]
        return f"exit {self.returncode}: {json.dumps(short, indent=1)}\n{self.log_tail()}"


def run_statusgo(
    binary: Path,
    workdir: Path,
    mode: str,
    stores: list[str],
    content_topics: list[str],
    timeout_s: float,
    expect: list[bytes] = (),
    known: list[bytes] = (),
    **flags,
) -> Run:
    """Run the harness; ``flags`` become ``-name value`` (``_`` to ``-``;
    True alone). Hashes go through files (``-expect``, ``-known``)."""
    workdir.mkdir(parents=True, exist_ok=True)
    command = [
        str(binary),
        f"-mode={mode}",
        f"-store={','.join(stores)}",
        f"-content-topics={','.join(content_topics)}",
        f"-timeout={timeout_s}s",
    ]
    for name, hashes in (("expect", expect), ("known", known)):
        if hashes:
            path = workdir / f"{mode}-{name}.txt"
            path.write_text("".join(h.hex() + "\n" for h in hashes))
            command.append(f"-{name}={path}")
    for name, value in flags.items():
        option = "-" + name.replace("_", "-")
        command.append(option if value is True else f"{option}={value}")
    log_path = workdir / f"{mode}.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log, start_new_session=True
        )
    try:
        stdout, _ = process.communicate(timeout=timeout_s + KILL_GRACE_S)
    except BaseException:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        raise
    (workdir / f"{mode}.json").write_bytes(stdout)
    try:
        summary = json.loads(stdout)
    except ValueError:
        tail = log_path.read_bytes()[-6000:].decode(errors="replace")
        raise AssertionError(f"the harness printed no summary (exit {process.returncode}):\n{tail}") from None
    return Run(process.returncode, summary, log_path)
