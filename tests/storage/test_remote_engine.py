"""The remote path: a Spark Connect endpoint the node does not own.

Here the endpoint is the embedded Sail server of the shared engine,
reached as ``sc://host:port``: the store must create its table, commit and
deduplicate through the engine alone (no delta-rs shortcuts); pages are
read in process from the table the engine wrote."""

import dataclasses

from wakustore.protocols.message import WakuMessage
from wakustore.protocols.store_query import validate_v3
from wakustore.storage.engine import Engine
from wakustore.storage.message_store import MessageStore, StoreConfig
from wakustore.storage.table import DeltaTableRef

PUBSUB = "/waku/2/rs/16/32"
T0 = 1_700_000_000 * 10**9


def test_store_over_a_remote_spark_connect_endpoint(engine, tmp_path):
    remote = Engine(engine.url)
    assert not remote.is_embedded
    try:
        store = MessageStore(
            DeltaTableRef(remote, str(tmp_path / "m")), tmp_path / "wal", StoreConfig(shared_table=True)
        )
        store.open()
        messages = [(PUBSUB, WakuMessage(b"r-%d" % i, "/r/1/t/proto", timestamp=T0 + i), T0) for i in range(30)]
        store.put(messages)
        store.flush()
        store.put(messages[:10])  # duplicates
        store.flush()
        assert store.table.count() == 30
        query = validate_v3(
            pubsub_topic=PUBSUB,
            content_topics=["/r/1/t/proto"],
            time_start=None,
            time_end=None,
            message_hashes=[],
            cursor=None,
            forward=True,
            limit=20,
            include_data=True,
        )
        first = store.query(query)
        second = store.query(dataclasses.replace(query, cursor=first.next_cursor.message_hash))
        got = [m.message.payload for m in [*first.messages, *second.messages]]
        assert got == [b"r-%d" % i for i in range(30)] and second.next_cursor is None
        store.close()
    finally:
        remote.close()
