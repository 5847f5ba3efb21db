"""Where a community's history starts (storage/archive_window.py)."""

from wakustore.protocols.message import WakuMessage
from wakustore.storage.archive_window import oldest_timestamp_ns
from wakustore.storage.table import DeltaTableRef

PUBSUB = "/waku/2/rs/16/32"
T0 = 1_700_000_000 * 10**9


def test_oldest_timestamp_of_the_listed_topics_only(store):
    odd = "/it's/1/{table}/proto"  # a quote and braces reach the SQL as text
    store.put([
        (PUBSUB, WakuMessage(b"a", "/a/1/x/proto", timestamp=T0 + 50), 0),
        (PUBSUB, WakuMessage(b"b", "/b/1/x/proto", timestamp=T0 + 10), 0),
        (PUBSUB, WakuMessage(b"c", odd, timestamp=T0 + 30), 0),
        (PUBSUB, WakuMessage(b"d", "/a/1/x/proto", timestamp=T0 + 70), 0),
    ])
    assert oldest_timestamp_ns(store.table, ["/a/1/x/proto"]) is None  # not committed yet
    store.flush()
    assert oldest_timestamp_ns(store.table, ["/a/1/x/proto"]) == T0 + 50
    assert oldest_timestamp_ns(store.table, ["/a/1/x/proto", odd]) == T0 + 30
    assert oldest_timestamp_ns(store.table, ["/a/1/x/proto", "/b/1/x/proto"]) == T0 + 10
    assert oldest_timestamp_ns(store.table, ["/none/1/x/proto"]) is None
    assert oldest_timestamp_ns(store.table, []) is None


def test_no_table_means_no_history(engine, tmp_path):
    assert oldest_timestamp_ns(DeltaTableRef(engine, str(tmp_path / "absent")), ["/a/1/x/proto"]) is None
