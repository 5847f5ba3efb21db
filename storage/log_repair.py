"""The Delta log's tail after a power cut: versions never made durable, put aside.

Why: the engine writes a commit's log entry before the node can fsync the
data files it names (storage/commit_sync.py). A power cut in between can
leave a version whose entry survived, whole or torn, while its data files
did not, or did only in part; the engine then fails every read of the
table. Such a version was never synced, so nothing relied on it: its rows
are still in the write-ahead log (trimmed only after the sync), and a
compaction or retention it held was not yet counted as done.

:func:`repair` runs before anything reads a table this node owns on its
disk. Every version after the newest one synced (the marker CommitSync
writes) is checked: its entry parses, and each data file it adds that no
later version removes exists with the size the entry gives and Parquet's
magic at both ends. From the first version that fails (or a gap in the
versions), that version and every later one are moved to
``<table>/_repaired/<UTC time>/`` with their checkpoints and checksum
files; a ``_last_checkpoint`` that names a checkpoint no longer there, or
that is itself torn, is moved too (readers then list the log). Versions
up to the synced one are never touched.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote

from wakustore.durable import fsync_dir, make_dirs
from wakustore.storage.commit_sync import read_synced_marker

log = logging.getLogger(__name__)

_LOG = "_delta_log"
_LAST_CHECKPOINT = "_last_checkpoint"
REPAIRED_DIR = "_repaired"
_MAGIC = b"PAR1"


@dataclass
class Repair:
    """What :func:`repair` put aside (empty when the log was whole)."""

    versions: list[int] = field(default_factory=list)
    reason: str = ""
    moved: list[str] = field(default_factory=list)
    directory: Path | None = None

    def __bool__(self) -> bool:
        return bool(self.moved)


def _version(name: str) -> int | None:
    head = name[:20]
    return int(head) if len(name) > 20 and head.isdigit() and name[20] == "." else None


def _parquet_whole(path: Path, size: int | None) -> str:
    """Why the data file at ``path`` is not whole ("" when it is)."""
    try:
        actual = path.stat().st_size
        if size is not None and actual != size:
            return f"{path.name} holds {actual} bytes, its entry says {size}"
        if actual < 12:
            return f"{path.name} is {actual} bytes long"
        with open(path, "rb") as handle:
            head = handle.read(4)
            handle.seek(actual - 4)
            tail = handle.read(4)
    except FileNotFoundError:
        return f"{path.name} is missing"
    except OSError as exc:
        return f"{path.name} cannot be read: {exc}"
    if head != _MAGIC or tail != _MAGIC:
        return f"{path.name} is not a whole Parquet file"
    return ""


def _actions(entry: Path, newline_ends: bool) -> list[dict] | str:
    """The actions of one log entry, or why it is torn. ``newline_ends``:
    whether this table's writer ends an entry with a newline (Sail and
    delta-rs do not: an entry cut just after one of its lines then shows)."""
    try:
        text = entry.read_bytes()
    except OSError as exc:
        return f"{entry.name} cannot be read: {exc}"
    if text.endswith(b"\n") and not newline_ends:
        return f"{entry.name} is torn (cut after a line)"
    actions = []
    for line in text.split(b"\n"):
        if not line.strip():
            continue
        try:
            action = json.loads(line)
        except ValueError:
            return f"{entry.name} is torn"
        if not isinstance(action, dict):
            return f"{entry.name} is torn"
        actions.append(action)
    if not actions:
        return f"{entry.name} is empty"
    return actions


def _first_torn(root: Path, log_dir: Path, names: list[str], versions: list[int], after: int) -> tuple[int, str] | None:
    """The first version after ``after`` that is torn, with why."""
    checked = [v for v in versions if v > after]
    if not checked:
        return None
    # The first version after the synced one must be there, unless a
    # checkpoint covers what is gone (the log is trimmed behind one).
    first = after + 1 if after >= 0 and not _checkpoint_from(names, checked[0] - 1) else checked[0]
    # How a durable entry of this table ends (none durable yet: either way).
    newline_ends = True
    durable = [v for v in versions if v <= after]
    if durable:
        try:
            newline_ends = (log_dir / f"{durable[-1]:020d}.json").read_bytes().endswith(b"\n")
        except OSError:
            pass
    parsed: dict[int, list[dict]] = {}
    for expected, version in enumerate(checked, start=first):
        if version != expected:
            return expected, f"version {expected} is missing"
        actions = _actions(log_dir / f"{version:020d}.json", newline_ends)
        if isinstance(actions, str):
            return version, actions
        parsed[version] = actions
    removed_at: dict[str, int] = {}
    for version in checked:
        for action in parsed[version]:
            removed = action.get("remove")
            if isinstance(removed, dict) and isinstance(removed.get("path"), str):
                removed_at[removed["path"]] = version
    for version in checked:
        for action in parsed[version]:
            added = action.get("add")
            if not (isinstance(added, dict) and isinstance(added.get("path"), str)) or "://" in added["path"]:
                continue
            if removed_at.get(added["path"], -1) > version:
                continue  # a later version removed it (and a vacuum may have deleted it)
            size = added.get("size") if isinstance(added.get("size"), int) else None
            why = _parquet_whole(root / unquote(added["path"]), size)
            if why:
                return version, f"version {version}: {why}"
    return None


def _checkpoint_from(names: list[str], version: int) -> bool:
    """Whether the log (``names``) holds a checkpoint of ``version`` or later."""
    return any(".checkpoint." in n and (v := _version(n)) is not None and v >= version for n in names)


def _checkpoint_torn(log_dir: Path, names: list[str], after: int) -> list[str]:
    """Checkpoint files after ``after`` that are not whole Parquet files."""
    out = []
    for name in names:
        version = _version(name)
        if version is not None and version > after and ".checkpoint." in name and name.endswith(".parquet"):
            if _parquet_whole(log_dir / name, None):
                out.append(name)
    return out


def _last_checkpoint_stale(log_dir: Path, names: set[str]) -> bool:
    try:
        record = json.loads((log_dir / _LAST_CHECKPOINT).read_bytes())
        version = int(record["version"])
        parts = record.get("parts")
    except FileNotFoundError:
        return False
    except (OSError, ValueError, KeyError, TypeError):
        return True
    if parts:
        wanted = [f"{version:020d}.checkpoint.{i:010d}.{int(parts):010d}.parquet" for i in range(1, int(parts) + 1)]
    else:
        wanted = [f"{version:020d}.checkpoint.parquet"]
    return not all(name in names for name in wanted)


def repair(root: str | os.PathLike) -> Repair:
    """Put aside the versions of the table at ``root`` that a power cut
    tore (see the module); a whole log is left as it is."""
    root = Path(root)
    log_dir = root / _LOG
    try:
        names = sorted(os.listdir(log_dir))
    except FileNotFoundError:
        return Repair()
    synced = read_synced_marker(root)
    versions = sorted(v for name in names if name.endswith(".json") and (v := _version(name)) is not None)
    result = Repair()
    moving: list[str] = []
    torn = _first_torn(root, log_dir, names, versions, synced)
    if torn is not None:
        first, result.reason = torn
        result.versions = [v for v in versions if v >= first]
        moving = [name for name in names if (v := _version(name)) is not None and v >= first]
    for name in _checkpoint_torn(log_dir, names, synced):
        if name not in moving:
            moving.append(name)
            result.reason = result.reason or f"checkpoint {name} is torn"
    left = set(names) - set(moving)
    if _LAST_CHECKPOINT in left and _last_checkpoint_stale(log_dir, left):
        moving.append(_LAST_CHECKPOINT)
        result.reason = result.reason or "_last_checkpoint is torn or names a missing checkpoint"
    if not moving:
        return result
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S.%fZ")
    result.directory = make_dirs(root / REPAIRED_DIR / stamp)
    for name in moving:
        shutil.move(log_dir / name, result.directory / name)
        result.moved.append(name)
    fsync_dir(result.directory)
    fsync_dir(log_dir)
    log.warning(
        "the table's log held what a power cut tore (%s): put aside %s in %s (versions after %d were never "
        "made durable; their rows are still in the write-ahead log)",
        result.reason,
        ", ".join(result.moved),
        result.directory,
        synced,
    )
    return result
