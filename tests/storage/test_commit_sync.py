"""A commit's files are fsynced before the write-ahead log forgets its rows (storage/commit_sync.py)."""

import json
import os
from pathlib import Path
from urllib.parse import unquote

from wakustore.protocols.message import WakuMessage
from wakustore.storage import commit_sync, maintenance

DAY0 = 1_900_000_000_000_000_000
DAY = 86_400 * 10**9


def _messages(n: int, days: int = 2):
    return [
        ("/waku/2/rs/16/32", WakuMessage(payload=b"p%d" % i, content_topic="/a/1/b/proto", timestamp=t), t)
        for i, t in ((i, DAY0 + (i % days) * DAY + i) for i in range(n))
    ]


class _Recorder:
    """Every fsync and every trim of the write-ahead log, in order."""

    def __init__(self, monkeypatch, store):
        self.events: list[tuple[str, str]] = []
        original_file, original_dir = commit_sync.fsync_file, commit_sync.fsync_dir
        monkeypatch.setattr(commit_sync, "fsync_file", lambda p: self._note("file", p, original_file))
        monkeypatch.setattr(commit_sync, "fsync_dir", lambda p: self._note("dir", p, original_dir))
        trim = store.writes._wal.trim
        monkeypatch.setattr(
            store.writes._wal, "trim", lambda upto: self.events.append(("trim", str(upto))) or trim(upto)
        )

    def _note(self, kind, path, original):
        self.events.append((kind, os.path.realpath(path)))
        original(path)

    def position(self, kind: str, path) -> int:
        return self.events.index((kind, os.path.realpath(path)))


def _log_entry(root: Path, version: int) -> Path:
    return root / "_delta_log" / f"{version:020d}.json"


def _adds(entry: Path) -> list[str]:
    return [unquote(json.loads(line)["add"]["path"]) for line in entry.read_text().splitlines() if '"add"' in line]


def test_a_flush_fsyncs_its_files_then_its_log_entry_then_trims_the_log(store, monkeypatch):
    root = Path(store.table.uri)
    store.put(_messages(20))
    store.flush()  # the first commit: a sync covers every version before it
    recorder = _Recorder(monkeypatch, store)
    store.put(_messages(40, days=3)[20:])
    store.flush()
    version = store.table.sync_commits()
    entry = _log_entry(root, version)
    added = [root / path for path in _adds(entry)]
    assert added, "the commit adds data files"
    trim = recorder.events.index(next(e for e in recorder.events if e[0] == "trim"))
    logged = recorder.position("file", entry)
    for path in added:
        assert recorder.position("file", path) < recorder.position("dir", path.parent) < logged
    assert logged < recorder.position("dir", root / "_delta_log") < trim


def test_a_compaction_and_a_window_replacement_are_synced_too(store, monkeypatch):
    root = Path(store.table.uri)
    store.put(_messages(60, days=2))
    store.flush()
    store.put(_messages(60, days=2)[:1] + [(p, m, t) for p, m, t in _messages(61, days=2)[60:]])
    store.flush()
    recorder = _Recorder(monkeypatch, store)
    before = store.table.sync_commits()
    maintenance.run_maintenance(store, None, DAY0 + 10 * DAY)
    version = store.table.sync_commits()
    assert version > before
    compacted = [root / path for v in range(before + 1, version + 1) for path in _adds(_log_entry(root, v))]
    assert compacted and all(("file", os.path.realpath(p)) in recorder.events for p in compacted)

    start = DAY0
    rows = [row for batch in store.stream_window(start, start + DAY, ["/a/1/b/proto"]) for row in batch]
    store.replace_window(start, start + DAY, ["/a/1/b/proto"], rows[:5])
    after = store.table.sync_commits()
    assert after > version
    assert ("file", os.path.realpath(_log_entry(root, after))) in recorder.events


def test_a_torn_log_entry_names_nothing(tmp_path):
    log = tmp_path / "_delta_log"
    log.mkdir()
    (tmp_path / "day=2030-01-01").mkdir()
    (tmp_path / "day=2030-01-01" / "a.parquet").write_bytes(b"x")
    whole = json.dumps({"add": {"path": "day%3D2030-01-01/a.parquet"}})
    (log / f"{0:020d}.json").write_text(whole + "\n" + whole[:20])
    sync = commit_sync.CommitSync(tmp_path)
    assert sync.sync() == 0 and sync.files_synced == 1
    assert sync.sync() == 0  # nothing new
