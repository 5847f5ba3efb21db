"""The soak with power cuts: the node's data dir on a file system that
forgets what was not fsynced (crashfs.py).

Every SIGKILL of the soak (a kill after acknowledgements, a kill in the
middle of a push stream, a kill before offline maintenance) becomes a
power cut: the node and its engine are killed, then the file system keeps
only what was synced, plus a seeded random prefix of the rest, its last
write torn. The node restarts on what survived and the soak's model
checks every page. After each cut the whole history is audited by hash:
an acknowledged message missing is *lost*, one answered twice is *served
twice*, one the model dropped (retention, a window replace) is *revived*.

``make powercut`` runs it for as long as asked (``POWERCUT_MINUTES``);
the test suite runs a bounded number of steps.
"""

from __future__ import annotations

import argparse
import ctypes.util
import datetime as dt
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from wakustore.bench.soak import (
    CLUSTER_ID,
    CONTENT_TOPICS,
    PUBSUB_TOPICS,
    SHARDS,
    STEP_WEIGHTS,
    STEPS,
    Entry,
    Mismatch,
    NodeProcess,
    Soak,
)
from wakustore.protocols.message_codec import decode_message, encode_message

CRASHFS = Path(__file__).with_name("crashfs.py")
MOUNT_TIMEOUT_S = 30.0


def ensure_fuse() -> None:
    """libfuse 3 (Debian's fuse3), installed when missing; /dev/fuse must exist."""
    if not os.path.exists("/dev/fuse"):
        raise RuntimeError("/dev/fuse is missing: the power-cut test needs FUSE")
    if ctypes.util.find_library("fuse3"):
        return
    install = ["apt-get", "install", "-y", "fuse3"]
    if subprocess.run(install, capture_output=True).returncode != 0:
        subprocess.run(["apt-get", "update"], capture_output=True)
        subprocess.run(install, capture_output=True)
    if not ctypes.util.find_library("fuse3"):
        raise RuntimeError("libfuse3 is not installed and `apt-get install -y fuse3` did not install it")


class CrashMount:
    """crashfs in a child process, mounted at ``work_dir/mnt``."""

    def __init__(self, work_dir: Path):
        self.path = work_dir / "mnt"
        self.control = work_dir / "crashfs.sock"
        self.log_path = work_dir / "crashfs.log"
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        ensure_fuse()
        self.path.mkdir(parents=True, exist_ok=True)
        self.control.unlink(missing_ok=True)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, str(CRASHFS), str(self.path), str(self.control)], stdout=log, stderr=log
            )
        deadline = time.monotonic() + MOUNT_TIMEOUT_S
        while not (os.path.ismount(self.path) and self.control.exists()):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"crashfs did not mount at {self.path}; see {self.log_path}")
            time.sleep(0.05)

    def ask(self, command: str) -> dict:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
            connection.settimeout(120)
            connection.connect(str(self.control))
            connection.sendall(command.encode() + b"\n")
            return json.loads(connection.makefile("r").readline())

    def cut(self, seed: int, strict: bool = False) -> dict:
        return self.ask(f"cut {seed}{' strict' if strict else ''}")

    def close(self) -> None:
        if self.process is None:
            return
        subprocess.run(["umount", "-l", str(self.path)], capture_output=True)
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = None


class _CutNode(NodeProcess):
    """A node whose SIGKILL is a power cut."""

    def __init__(self, *args, on_kill: Callable[[], None], **kwargs):
        super().__init__(*args, **kwargs)
        self.on_kill = on_kill

    def kill(self) -> None:
        if self.process is None:
            return
        # Its engine runs in a session of its own (a node's kill -9 leaves
        # it to notice and exit): at a power cut it dies with the node.
        descendants = _descendants(self.process.pid)
        super().kill()
        _kill_all(descendants)
        self.on_kill()


def _descendants(pid: int) -> list:
    import psutil

    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def _kill_all(processes: list) -> None:
    """SIGKILL ``processes`` (psutil) and wait until every one is gone:
    nothing may write to the disk after the power is off."""
    import psutil

    for process in processes:
        try:
            process.kill()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(processes, timeout=30)
    if alive:
        raise RuntimeError(f"processes outlived the power cut: {[p.pid for p in alive]}")


@dataclass
class CutTotals:
    cuts: int = 0
    writes_lost: int = 0
    writes_torn: int = 0
    names_lost: int = 0
    lost: int = 0
    twice: int = 0
    revived: int = 0
    in_offline: int = 0  # cuts while a retention or a window replace ran


class PowerCut(Soak):
    # Kills are power cuts here, and retention, compaction and window
    # replaces run where a cut can stop them: more of each than in the soak.
    weights = tuple(
        w * 3 if s in ("kill", "kill_mid_push", "maintain", "replace") else w
        for s, w in zip(STEPS, STEP_WEIGHTS, strict=True)
    )

    def __init__(self, work_dir: Path, seed: int, report: Callable[[str], None] = print, verbose: bool = False):
        super().__init__(work_dir, seed, report=report, verbose=verbose)
        self.mount = CrashMount(work_dir)
        self.data_dir = self.mount.path / "node"
        self.node = _CutNode(self.data_dir, work_dir / "node.log", work_dir / "node.toml", on_kill=self._cut)
        self.cuts = CutTotals()
        self._audit_due = False
        self.tables_verified = -1  # rows the final check read (-1: not run)

    def run(self, *args, **kwargs):
        """The soak's steps (its last a cut, as the node is killed), then
        the table on what survived, read by delta-rs and by the engine."""
        self.mount.start()
        try:
            totals = super().run(*args, **kwargs)
            self.verify_table()
            return totals
        finally:
            self.mount.close()

    def verify_table(self) -> None:
        """Restart on what the last cut left and let the node commit what
        its log holds and stop; then the table holds each acknowledged
        message once, for delta-rs and for the engine."""
        from deltalake import DeltaTable

        from wakustore.storage.engine import Engine

        self.node.start()
        self._wait(lambda h: h.get("ok") and h.get("pending_messages") == 0, "the log to be committed")
        self.node.stop()
        table = self.data_dir / "tables" / "messages"
        expected = sorted(e.hash for e in self.model.rows.values())
        by_delta_rs = sorted(DeltaTable(str(table)).to_pyarrow_table(columns=["message_hash"]).column(0).to_pylist())
        engine = Engine("embedded")
        engine.start()
        try:
            rows = engine.run(
                lambda spark: spark.read.format("delta").load(str(table)).select("message_hash").collect()
            )
        finally:
            engine.close()
        by_engine = sorted(bytes(row[0]) for row in rows)
        for reader, got in (("delta-rs", by_delta_rs), ("the engine", by_engine)):
            if got != expected:
                missing, extra = len(set(expected) - set(got)), len(got) - len(set(got) & set(expected))
                raise Mismatch(
                    f"{reader} reads {len(got)} rows, the model {len(expected)}: {missing} missing, {extra} extra"
                )
        self.tables_verified = len(expected)

    def repairs(self) -> int:
        """Torn log versions the node (or the offline work) put aside."""
        count = 0
        for name in ("node.log", "offline.log"):
            try:
                with open(self.work_dir / name, "rb") as log:
                    count += sum(line.count(b"what a power cut tore") for line in log)
            except FileNotFoundError:
                continue
        return count

    def line(self) -> str:
        t, c = self.totals, self.cuts
        return (
            f"powercut: {t.steps} steps, {c.cuts} cuts ({c.in_offline} during a retention or a window replace, "
            f"{self.repairs()} torn logs repaired), {len(self.model.rows)} acknowledged messages kept "
            f"({t.pushed} pushed), {c.lost} lost, {c.twice} served twice, {c.revived} revived; "
            f"{c.writes_lost} unsynced writes dropped, {c.writes_torn} torn, {c.names_lost} unsynced names dropped; "
            f"{t.maintenance} maintenance runs, {t.pages} pages compared, {t.mismatches} mismatches"
            + (
                f"; the table read whole by delta-rs and the engine ({self.tables_verified} rows)"
                if self.tables_verified >= 0
                else ""
            )
        )

    # -- offline work in a child process, cut at a random moment ----------

    def _step_maintain(self) -> None:
        """Retention at a cutoff between messages, as the soak's, run by a
        child process that a power cut may stop at any point."""
        stamps = sorted({e.timestamp for e in self.model.rows.values()})
        if len(stamps) < 4:
            return
        cutoff = stamps[self.rng.randint(1, max(1, len(stamps) // 3))]
        removed = [e for e in self.model.rows.values() if e.timestamp < cutoff]
        # Half the time today counts as finished: its files are rewritten
        # sorted (day_rewrite), as the node's maintenance does after midnight.
        spec = {"kind": "retain", "cutoff": cutoff, "finish_today": self.rng.random() < 0.5}
        if self._offline_child(spec, added=[], removed=removed):
            self.model.retain(cutoff)
        self.totals.maintenance += 1

    def _step_replace(self) -> None:
        """A window replace (an archive import's commit), in a child process
        a power cut may stop."""
        if not self.model.rows:
            return
        pivot = self.rng.choice(list(self.model.rows.values()))
        start, end = pivot.timestamp - 2 * 10**9, pivot.timestamp + 2 * 10**9
        topic = pivot.message.content_topic
        inside = [
            e for e in self.model.rows.values() if start <= e.timestamp < end and e.message.content_topic == topic
        ]
        kept = [e for e in inside if self.rng.random() < 0.6]
        added = [
            entry_of(*self._new_message(start + self.rng.randrange(end - start), topic))
            for _ in range(self.rng.randint(1, 4))
        ]
        rows = kept + added
        spec = {
            "kind": "replace",
            "start": start,
            "end": end,
            "topic": topic,
            "rows": [[e.pubsub_topic, encode_message(e.message).hex(), e.timestamp] for e in rows],
        }
        removed = [e for e in inside if e not in kept]
        if self._offline_child(spec, added=added, removed=removed):
            self.model.replace_window(start, end, {topic}, rows)
        self.totals.maintenance += 1

    def _offline_child(self, spec: dict, added: list[Entry], removed: list[Entry]) -> bool:
        """Stop the node, run ``spec`` on its data dir in a child process
        (as `wakustore db` would), cut the power at a random moment of it
        (or after it), restart the node; whether the work's commit survived,
        as the node answers: all of it or none."""
        if self.rng.random() < 0.5:
            self.node.kill()
            self.totals.node_kills += 1
        else:
            self.node.stop()
        spec_path = self.work_dir / "offline.json"
        spec_path.write_text(json.dumps(dict(spec, data_dir=str(self.data_dir))))
        with open(self.work_dir / "offline.log", "ab") as log:
            child = subprocess.Popen(
                [sys.executable, str(Path(__file__)), "--offline", str(spec_path)],
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        try:
            # Its engine starts in ~3 s, the work takes a few more.
            child.wait(timeout=self.rng.uniform(1.0, 10.0))
        except subprocess.TimeoutExpired:
            descendants = _descendants(child.pid)
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
            _kill_all(descendants)
            self._cut()
            self.cuts.in_offline += 1
        else:
            if child.returncode != 0:
                raise RuntimeError(f"the offline work exited with {child.returncode}; see offline.log")
            if self.rng.random() < 0.5:
                self._cut()  # after it returned: what it did must survive
        self.node.start()
        return self._trio_result(self._happened, added, removed)

    def _trio_result(self, function, *args):
        out: list = []

        async def main():
            out.append(await function(*args))

        self._trio(main)
        return out[0]

    async def _happened(self, added: list[Entry], removed: list[Entry]) -> bool:
        from wakustore.clients.store import StoreClient
        from wakustore.protocols.store_query import HistoryQuery

        wanted = [e.hash for e in added + removed]
        found: set[bytes] = set()
        async with StoreClient.connect(self.node.peer, timeout_s=60) as client:
            for i in range(0, len(wanted), 100):
                query = HistoryQuery(message_hashes=tuple(wanted[i : i + 100]), limit=100, include_data=False)
                response = await self._answered(lambda q=query: client.query(q))
                found.update(m.message_hash for m in response.messages)
        done = all(e.hash in found for e in added) and not any(e.hash in found for e in removed)
        undone = not any(e.hash in found for e in added) and all(e.hash in found for e in removed)
        if not (done or undone):
            raise Mismatch(
                f"offline {len(added)} added / {len(removed)} removed: half done after the cut "
                f"({sum(e.hash in found for e in added)} added found, {sum(e.hash in found for e in removed)} removed found)"
            )
        return done

    def _cut(self) -> None:
        """Power off: the soak's own engine goes too (it read the old disk)."""
        if self._engine is not None:
            self._engine.close()
            self._engine = None
        result = self.mount.cut(self.rng.randrange(2**32))
        self.cuts.cuts += 1
        self.cuts.writes_lost += result["writes_lost"]
        self.cuts.writes_torn += result["writes_torn"]
        self.cuts.names_lost += result["names_lost"]
        self._audit_due = True
        if self.verbose:
            self.report(f"powercut: cut {self.cuts.cuts}: {result}")

    def check(self) -> None:
        if self._audit_due and self.node.process is not None:
            self._audit_due = False
            self._trio(self._audit)
        super().check()

    async def _audit(self) -> None:
        """Every stored hash, once each, against the model."""
        from wakustore.clients.store import StoreClient
        from wakustore.protocols.store_query import HistoryQuery

        seen: dict[bytes, int] = {}
        async with StoreClient.connect(self.node.peer, timeout_s=60) as client:
            for pubsub in PUBSUB_TOPICS:
                cursor = None
                while True:
                    query = HistoryQuery(
                        pubsub_topic=pubsub,
                        content_topics=CONTENT_TOPICS,
                        include_data=False,
                        limit=100,
                        cursor=cursor,
                    )
                    response = await self._answered(lambda q=query: client.query(q))
                    for found in response.messages:
                        seen[found.message_hash] = seen.get(found.message_hash, 0) + 1
                    cursor = response.cursor
                    if cursor is None:
                        break
        expected = {e.hash for e in self.model.rows.values()}
        lost = len(expected - seen.keys())
        twice = sum(1 for count in seen.values() if count > 1)
        revived = len(seen.keys() - expected)
        self.cuts.lost += lost
        self.cuts.twice += twice
        self.cuts.revived += revived
        if lost or twice or revived:
            raise Mismatch(f"after cut {self.cuts.cuts}: {lost} lost, {twice} served twice, {revived} revived")


def entry_of(pubsub_topic: str, message) -> Entry:
    from wakustore.bench.soak import entry

    return entry(pubsub_topic, message)


def offline(spec_path: Path) -> int:
    """The child's side of :meth:`PowerCut._offline_child`: the soak's own
    offline work (open_store on the data dir, then retention or a window
    replace), with an engine of its own."""
    from wakustore.node.config import NodeConfig
    from wakustore.node.store_service import open_store
    from wakustore.storage.engine import Engine
    from wakustore.storage.rows import Row

    spec = json.loads(spec_path.read_text())
    engine = Engine("embedded")
    engine.start()
    try:
        config = NodeConfig(data_dir=Path(spec["data_dir"]), cluster_id=CLUSTER_ID, shards=list(SHARDS)).validate()
        _, store = open_store(config, engine=engine)
        try:
            if spec["kind"] == "retain":
                today = dt.datetime.now(dt.UTC).date() + dt.timedelta(days=1 if spec["finish_today"] else 0)
                done = Soak._retain(store, spec["cutoff"], today)
                print(f"offline: retention, then {done.get('days_rewritten', 0)} days rewritten sorted", flush=True)
            else:
                rows = [Row.build(p, decode_message(bytes.fromhex(m)), t) for p, m, t in spec["rows"]]
                store.replace_window(spec["start"], spec["end"], [spec["topic"]], rows)
                print(f"offline: window replaced with {len(rows)} rows", flush=True)
        finally:
            store.close()
    finally:
        engine.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--offline"]:
        return offline(Path(argv[1]))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--seed", type=int)
    parser.add_argument("--work-dir", type=Path)
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else int(time.time())
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="wakustore-powercut-"))
    work.mkdir(parents=True, exist_ok=True)
    from wakustore.clients.store import quiet_libp2p

    quiet_libp2p()
    # A SIGTERM unwinds as Ctrl-C does: the node, its engine and the mount go too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    run = PowerCut(work, seed, report=lambda line: print(line, flush=True), verbose=args.verbose)
    try:
        run.run(deadline=time.monotonic() + args.minutes * 60)
    except Mismatch:
        print(run.line(), flush=True)
        return 1
    print(run.line(), flush=True)
    if args.work_dir is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
