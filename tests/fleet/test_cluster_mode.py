"""A fleet on one Sail server in cluster mode (a driver and workers over
RPC), as deploy/ runs it: two nodes share one table in an S3 bucket
through it (``engine = "sc://..."``, ``table_root = "s3://..."``,
``shared_table = true``, the ``AWS_*`` variables set for the engine and
the nodes alike), and live through a node killed and the engine killed
in the middle of their commits."""

from __future__ import annotations

import threading

import pytest
import trio

from tests.fleet.conftest import BUCKET
from tests.fleet.fleet import (
    check_served,
    messages,
    node_killed_mid_commit,
    push_while,
    run,
    running_pair,
    s3_environment,
    settled,
    start_the_dead,
    stored,
    stored_when_available,
    two_writers,
    wait_for,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster_nodes(sail_cluster, object_store, fleet_dir):
    with running_pair(
        fleet_dir,
        "cluster",
        engine=sail_cluster.url,
        table_root=f"s3://{BUCKET}/cluster",
        env=s3_environment(object_store[1].endpoint),
    ) as nodes:
        yield nodes


@pytest.fixture
def fleet(cluster_nodes, sail_cluster):
    """The two nodes, running; whatever a failed test left dead is started again."""
    yield cluster_nodes
    if sail_cluster.process.poll() is not None:
        sail_cluster.start()
    start_the_dead(cluster_nodes)


def test_two_writers_with_overlapping_messages_answer_the_same_set(fleet, object_store):
    two_writers(*fleet, "/fleet/1/cluster-writers/proto", gate=object_store[1])


def test_node_killed_mid_commit_loses_nothing_acknowledged(fleet):
    node_killed_mid_commit(*fleet, "/fleet/1/cluster-node-kill/proto")


def test_engine_killed_mid_commit_pauses_commits_while_pushes_and_pages_go_on(fleet, sail_cluster):
    a, b = fleet
    topic = "/fleet/1/cluster-engine-kill/proto"
    sent = messages(topic, 300)
    acked: list = []
    killed = threading.Event()

    async def scenario() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(push_while, a.peer, sent[:150], acked, killed)
            nursery.start_soon(push_while, b.peer, sent[100:], acked, killed)
            while len(acked) < 100:
                await trio.sleep(0.005)
            killed.set()
            await trio.to_thread.run_sync(sail_cluster.kill)

    run(scenario)
    # Puts do not need the engine: the pushes went on into the logs.
    assert len(acked) == 350
    # Pages do not need the engine either: each node reads the table
    # version it holds in process, plus its own uncommitted messages.
    for node, own in ((a, sent[:100]), (b, sent[150:])):
        check_served(run(stored, node.peer, topic), sent, at_least=[m for m in own if m in acked])
        _, health = wait_for(lambda node=node: _when_down(node.health()), f"{node.name} to report the engine down")
        assert health["ok"] is False and health["engine"]["problem"]
        assert health["pending_messages"] > 0  # writes pause, nothing is dropped

    sail_cluster.start()  # on the port the nodes know
    settled(a, b)
    answers = [run(stored_when_available, node.peer, topic) for node in (a, b)]
    for answer in answers:
        check_served(answer, sent, exactly=sent)
    assert a.health()[0] == 200


def _when_down(health: tuple[int, dict]) -> tuple[int, dict] | None:
    """``health`` when /health answered 503, else None (keep polling)."""
    return health if health[0] == 503 else None


def test_maintenance_on_a_sail_cluster_succeeds_without_optimize(sail_cluster, tmp_path, caplog):
    """Sail parses no OPTIMIZE: a maintenance run on a cluster engine skips
    compaction (said once in the log) instead of failing every run (which
    kept /health at ok: false for the fleet's life)."""
    import logging
    import time

    from wakustore.protocols.message import WakuMessage
    from wakustore.storage import maintenance
    from wakustore.storage.engine import Engine
    from wakustore.storage.message_store import MessageStore, StoreConfig
    from wakustore.storage.table import DeltaTableRef

    engine = Engine(sail_cluster.url)
    engine.start()
    try:
        store = MessageStore(
            DeltaTableRef(engine, str(tmp_path / "table")), tmp_path / "wal", StoreConfig(shared_table=True)
        )
        store.open()
        now = time.time_ns()
        store.put(
            [("/waku/2/rs/1/0", WakuMessage(b"m%d" % i, "/a/1/b/proto", timestamp=now + i), now) for i in range(5)]
        )
        caplog.set_level(logging.WARNING, logger="wakustore.storage.maintenance")
        maintenance._warned_no_optimize.clear()  # said once a process
        result = maintenance.run_maintenance(store, None, now)
        assert result.compaction == {"optimized": 0}
        assert any("has no OPTIMIZE" in r.getMessage() for r in caplog.records)
        assert store.table.count() == 5
        store.close()
    finally:
        engine.close()
