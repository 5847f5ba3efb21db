"""Where a community's history starts, and the signers a control node
works out ahead of an export (storage/archive_window.py)."""

import datetime as dt

import pyarrow as pa
import pytest

from wakustore.protocols.message import WakuMessage
from wakustore.storage import archive_window
from wakustore.storage.archive_window import SignerCache, oldest_timestamp_ns
from wakustore.storage.table import DeltaTableRef

PUBSUB = "/waku/2/rs/16/32"
T0 = 1_700_000_000 * 10**9


def test_oldest_timestamp_of_the_listed_topics_only(store):
    odd = "/it's/1/{table}/proto"  # a quote and braces reach the SQL as text
    store.put(
        [
            (PUBSUB, WakuMessage(b"a", "/a/1/x/proto", timestamp=T0 + 50), 0),
            (PUBSUB, WakuMessage(b"b", "/b/1/x/proto", timestamp=T0 + 10), 0),
            (PUBSUB, WakuMessage(b"c", odd, timestamp=T0 + 30), 0),
            (PUBSUB, WakuMessage(b"d", "/a/1/x/proto", timestamp=T0 + 70), 0),
        ]
    )
    assert oldest_timestamp_ns(store.table, ["/a/1/x/proto"]) is None  # not committed yet
    store.flush()
    assert oldest_timestamp_ns(store.table, ["/a/1/x/proto"]) == T0 + 50
    assert oldest_timestamp_ns(store.table, ["/a/1/x/proto", odd]) == T0 + 30
    assert oldest_timestamp_ns(store.table, ["/a/1/x/proto", "/b/1/x/proto"]) == T0 + 10
    assert oldest_timestamp_ns(store.table, ["/none/1/x/proto"]) is None
    assert oldest_timestamp_ns(store.table, []) is None


def test_no_table_means_no_history(engine, tmp_path):
    assert oldest_timestamp_ns(DeltaTableRef(engine, str(tmp_path / "absent")), ["/a/1/x/proto"]) is None


DAY = dt.date(2026, 11, 20)


@pytest.fixture
def cache(tmp_path):
    return SignerCache(tmp_path / "signers")


def test_signers_are_found_by_hash_and_null_where_unknown(cache):
    assert cache.lookup(DAY, pa.array([b"h1"], pa.binary())) is None  # nothing kept for the day
    cache.add(DAY, [b"h1", b"h2"], [b"k1", b""])
    cache.add(DAY, [b"h3"], [b"k3"])
    cache.add(DAY + dt.timedelta(days=1), [b"h4"], [b"k4"])
    looked_up = cache.lookup(DAY, pa.chunked_array([[b"h3", b"h9"], [b"h1", b"h2", b"h4"]], pa.binary()))
    assert looked_up.to_pylist() == [b"k3", None, b"k1", b"", None]  # h4 is another day's


def test_a_days_files_are_merged_into_one_once_they_are_many(cache, monkeypatch):
    monkeypatch.setattr(archive_window, "SIGNER_FILES_PER_DAY", 4)
    for i in range(9):
        cache.add(DAY, [b"h%d" % i], [b"k%d" % i])
    assert len(list((cache.directory / DAY.isoformat()).glob("*.arrow"))) < 4
    assert not list(cache.directory.rglob("*.part"))
    hashes = pa.array([b"h%d" % i for i in range(9)], pa.binary())
    assert cache.lookup(DAY, hashes).to_pylist() == [b"k%d" % i for i in range(9)]


def test_an_unreadable_cache_file_is_ignored_and_exported_days_are_dropped(cache):
    cache.add(DAY, [b"h1"], [b"k1"])
    (cache.directory / DAY.isoformat() / "broken.arrow").write_bytes(b"not arrow")
    assert cache.lookup(DAY, pa.array([b"h1"], pa.binary())).to_pylist() == [b"k1"]
    later = DAY + dt.timedelta(days=7)
    cache.add(later, [b"h2"], [b"k2"])
    (cache.directory / "notes").mkdir()  # not a day: left alone
    cache.forget_before(later)
    assert sorted(p.name for p in cache.directory.iterdir()) == [later.isoformat(), "notes"]
    assert cache.lookup(DAY, pa.array([b"h1"], pa.binary())) is None


# --- an export's days, read by the engine or from the files ---------------------------

DAY_NS = 86_400 * 10**9


def _window(store, start_ns, end_ns, topics):
    return [t.to_pylist() for t in store.stream_window_tables(start_ns, end_ns, topics)]


def test_an_exports_days_read_from_the_files_are_the_engines(store, monkeypatch):
    """The rows of each day of a window, in (timestamp, hash) order, with
    the day column: the same read from the day's files (a table the node
    owns) as through the engine, window bounds inside days, topics
    filtered, ties on the timestamp broken by hash, over several files a
    day and an empty day."""
    assert store.table.bulk_in_process
    topics = ["/a/1/x/proto", "/b/1/x/proto", "/c/1/x/proto"]
    for part in range(3):  # three commits: several files a day
        store.put(
            [
                (
                    PUBSUB,
                    WakuMessage(
                        b"%d-%d" % (part, i),
                        topics[i % 3],
                        version=i % 2,
                        timestamp=T0 + (i % 4) * DAY_NS + (i // 3) * 10**9,
                        meta=b"m" * (i % 2),
                    ),
                    i + 1,
                )
                for i in range(40)
                if i % 4 != 2
            ]
        )
        store.flush()
    start, end = T0 + 3 * 10**9, T0 + 3 * DAY_NS + 5 * 10**9
    from_files = _window(store, start, end, topics[:2])
    assert len(from_files) == 3  # day 2 has no row
    store.table.bulk_in_process = False
    through_engine = _window(store, start, end, topics[:2])
    assert from_files == through_engine
    rows = [row for day in from_files for row in day]
    assert all(start <= r["timestamp"] < end and r["content_topic"] in topics[:2] for r in rows)
    assert [(r["timestamp"], r["message_hash"]) for r in rows] == sorted(
        (r["timestamp"], r["message_hash"]) for r in rows
    )
    # A day the files alone cannot answer is read by the engine.
    store.table.bulk_in_process = True
    monkeypatch.setattr(store.reader, "day_rows", lambda *args: None)
    assert _window(store, start, end, topics[:2]) == through_engine
