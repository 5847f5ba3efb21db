"""The commits of a table on this machine's disk made durable before anything relies on them.

Why: the engine (Sail) and delta-rs write a commit's data files and its
log entry without fsyncing them. After a power cut, a version whose log
entry survived could name data files whose bytes never reached the disk,
and the write-ahead log, trimmed once the commit returned, would no longer
hold the rows. :meth:`CommitSync.sync` runs after each commit and before
the step that relies on it (the write-ahead log's trim): every data file
the new versions add, then the directories they are in, then the log
entries and checkpoints (any not synced yet, whatever their version),
then the log's directory, fsynced in that order; then the marker
(``_wakustore_synced``) names the newest version durable.

A commit whose sync had not finished at a power cut may be torn; its rows
are still in the write-ahead log (its trim waits for the sync), and the
next start puts the torn versions aside (:mod:`log_repair`, which trusts
every version up to the marker). A table on object storage needs none of
this (a put is durable when it returns).
"""

from __future__ import annotations

import json
import logging
import os
import zlib
from pathlib import Path
from urllib.parse import unquote

from wakustore.durable import fsync_ancestors, fsync_dir, fsync_file

log = logging.getLogger(__name__)

_LOG = "_delta_log"
_LAST_CHECKPOINT = "_last_checkpoint"
# The newest version this node made durable, beside the log (Delta's
# readers and VACUUM leave names starting with "_" alone): a version after
# it may be torn by a power cut (storage/log_repair.py), none before it.
SYNCED_MARKER = "_wakustore_synced"


_MARKER_BYTES = 30  # 20 digits, a space, 8 hex digits of the digits' CRC-32, a newline


def _marker(version: int) -> bytes:
    digits = f"{version:020d}".encode()
    return digits + b" %08x\n" % zlib.crc32(digits)


def read_synced_marker(root: str | os.PathLike) -> int:
    """The version the marker names; -1 when there is none or it is torn
    (then every version in the log is checked: slower, never wrong)."""
    try:
        data = (Path(root) / SYNCED_MARKER).read_bytes()
    except FileNotFoundError:
        return -1
    except OSError as exc:  # not a file, unreadable: as torn
        log.warning("the table's synced marker cannot be read (%s): every version of the log is checked", exc)
        return -1
    if len(data) != _MARKER_BYTES or not data[:20].isdigit() or data != _marker(int(data[:20])):
        return -1
    return int(data[:20])


def write_synced_marker(root: Path, version: int) -> None:
    """Overwrite the marker in place and fsync it: one fsync a commit. The
    write may tear at a power cut; the CRC then makes it read as none."""
    path = root / SYNCED_MARKER
    if path.is_dir():  # a damaged data dir: the marker takes its place
        path.rmdir()
    created = not path.exists()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.pwrite(fd, _marker(version), 0)
        os.fsync(fd)
    finally:
        os.close(fd)
    if created:
        fsync_dir(root)


class CommitSync:
    """Tracks the newest version of the table at ``root`` made durable."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        self.synced_version = -1  # the first sync covers every commit in the log
        self.files_synced = 0
        # Checkpoints are written for a version already synced (maintenance
        # checkpoints after the commits): tracked by name, not by version.
        self._checkpoints_synced: set[str] = set()

    def sync(self) -> int:
        """fsync what the versions after the last sync wrote, and any
        checkpoint not synced yet; returns the newest version now durable
        (-1: no table yet)."""
        log_dir = self.root / _LOG
        try:
            names = os.listdir(log_dir)
        except FileNotFoundError:
            return self.synced_version
        commits = sorted(
            int(name[:20]) for name in names if name.endswith(".json") and len(name) == 25 and name[:20].isdigit()
        )
        new = [version for version in commits if version > self.synced_version]
        checkpoints = {name for name in names if ".checkpoint." in name and name[:20].isdigit()}
        new_checkpoints = sorted(checkpoints - self._checkpoints_synced)
        if not new and not new_checkpoints:
            return self.synced_version
        files: set[Path] = set()
        for version in new:
            files.update(self._added(log_dir / f"{version:020d}.json"))
        directories = set()
        for path in sorted(files):
            try:
                fsync_file(path)
            except FileNotFoundError:  # removed since by a later version and a vacuum
                continue
            directories.add(path.parent)
        for directory in sorted(directories):
            fsync_dir(directory)
        if directories - {self.root} or self.synced_version < 0:
            fsync_dir(self.root)  # a new partition's directory; the log's
        if self.synced_version < 0:
            fsync_ancestors(self.root)  # the table's own, made by the engine (with `tables/`)
        log_files = [log_dir / f"{version:020d}.json" for version in new]
        log_files += [log_dir / name for name in new_checkpoints]
        if _LAST_CHECKPOINT in names:
            log_files.append(log_dir / _LAST_CHECKPOINT)
        for path in log_files:
            try:
                fsync_file(path)
            except FileNotFoundError:  # trimmed meanwhile: a checkpoint covers it
                continue
        fsync_dir(log_dir)
        self._checkpoints_synced = checkpoints
        self.files_synced += len(files)
        if new:
            write_synced_marker(self.root, new[-1])
            self.synced_version = new[-1]
        return self.synced_version

    def _added(self, entry: Path) -> list[Path]:
        """The data files a log entry adds."""
        try:
            text = entry.read_text()
        except FileNotFoundError:
            return []
        out = []
        for line in text.splitlines():
            if '"add"' not in line:
                continue
            try:
                action = json.loads(line)
            except ValueError:
                continue  # a torn entry: nothing it names is committed
            added = action.get("add") if isinstance(action, dict) else None
            if isinstance(added, dict) and isinstance(added.get("path"), str) and "://" not in added["path"]:
                out.append(self.root / unquote(added["path"]))
        return out
