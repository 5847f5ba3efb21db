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


def test_the_marker_names_the_newest_version_synced_after_its_fsyncs(store, monkeypatch):
    root = Path(store.table.uri)
    store.put(_messages(10))
    store.flush()
    recorder = _Recorder(monkeypatch, store)
    store.put(_messages(20)[10:])
    store.flush()
    version = store.table.sync_commits()
    assert commit_sync.read_synced_marker(root) == version
    assert recorder.position("file", _log_entry(root, version)) < len(recorder.events)
    (root / commit_sync.SYNCED_MARKER).write_text("12")  # torn: no newline
    assert commit_sync.read_synced_marker(root) == -1


def test_a_checkpoint_of_a_version_already_synced_is_synced_when_written(store, monkeypatch):
    """Maintenance checkpoints after the commits it synced; the log is
    trimmed behind that checkpoint, so it must be durable first."""
    root = Path(store.table.uri)
    store.put(_messages(10))
    store.flush()
    store.table.sync_commits()
    recorder = _Recorder(monkeypatch, store)
    maintenance.checkpoint(store.table)
    checkpoints = [p for p in (root / "_delta_log").iterdir() if ".checkpoint." in p.name]
    assert checkpoints
    for path in checkpoints:
        assert ("file", os.path.realpath(path)) in recorder.events
    assert ("file", os.path.realpath(root / "_delta_log" / "_last_checkpoint")) in recorder.events


def test_a_retention_delete_is_durable_when_it_returns(store, monkeypatch):
    root = Path(store.table.uri)
    store.put(_messages(30, days=3))
    store.flush()
    store.table.sync_commits()
    recorder = _Recorder(monkeypatch, store)
    maintenance.delete_before(store.table, DAY0 + DAY)
    version = commit_sync.read_synced_marker(root)
    assert ("file", os.path.realpath(_log_entry(root, version))) in recorder.events
    assert '"remove"' in _log_entry(root, version).read_text()


def test_a_store_opens_a_table_whose_last_commit_a_power_cut_tore(engine, tmp_path):
    """The newest version's data file never reached the disk: the store
    puts the version aside, and replays its rows from the write-ahead log."""
    from wakustore.storage.message_store import MessageStore
    from wakustore.storage.table import DeltaTableRef

    def open_store():
        opened = MessageStore(DeltaTableRef(engine, str(tmp_path / "messages")), tmp_path / "wal")
        opened.open()
        return opened

    store = open_store()
    store.put(_messages(10))
    store.flush()
    root = Path(store.table.uri)
    synced = store.table.sync_commits()
    store.close()
    # What a power cut between the engine's commit and the node's sync
    # leaves: a log entry naming a file that is not there, the rows still
    # in the write-ahead log.
    later = _messages(20)[10:]
    store = open_store()
    store.put(later)
    wal = {p.name: p.read_bytes() for p in (tmp_path / "wal").iterdir()}
    store.flush()
    store.close()
    torn = synced + 1
    for path in _adds(_log_entry(root, torn)):
        (root / path).unlink()
    (root / commit_sync.SYNCED_MARKER).write_text(f"{synced}\n")
    for name, data in wal.items():
        (tmp_path / "wal" / name).write_bytes(data)
    store = open_store()
    try:
        assert store.repaired and store.repaired.versions == [torn]
        assert (store.repaired.directory / _log_entry(root, torn).name).exists()
        store.flush()
        from deltalake import DeltaTable

        assert DeltaTable(str(root)).to_pyarrow_table().num_rows == 20
    finally:
        store.close()


def test_a_marker_torn_between_two_versions_reads_as_none(tmp_path):
    """Written in place: a power cut may leave the new digits' start over
    the old ones' end (199 -> 200 torn reads 299); the CRC refuses it."""
    commit_sync.write_synced_marker(tmp_path, 199)
    assert commit_sync.read_synced_marker(tmp_path) == 199
    new = commit_sync._marker(200)
    path = tmp_path / commit_sync.SYNCED_MARKER
    old = path.read_bytes()
    path.write_bytes(new[:18] + old[18:])
    assert commit_sync.read_synced_marker(tmp_path) == -1


def test_a_directory_in_the_markers_place_reads_as_none_and_is_replaced_by_the_next_marker(tmp_path):
    """A damaged data dir (a directory where the marker belongs) never
    stops a start: the marker reads as none (the whole log is checked), and
    the next commit's marker takes its place."""
    (tmp_path / commit_sync.SYNCED_MARKER).mkdir()
    assert commit_sync.read_synced_marker(tmp_path) == -1
    commit_sync.write_synced_marker(tmp_path, 7)
    assert commit_sync.read_synced_marker(tmp_path) == 7
