"""A fleet on S3-compatible object storage: two nodes, each with its own
embedded engine, share one table in a bucket (``table_root =
"s3://bucket/..."``, ``shared_table = true``, the ``AWS_*`` variables an
operator sets). The store is moto's S3 server on loopback behind a gate
that can cut it off. Commits stay atomic through conditional writes
(``If-None-Match: *`` on the next log entry), so concurrent writers,
kills in the middle of a commit and a storage outage lose nothing
acknowledged and store nothing twice."""

from __future__ import annotations

import threading
import time

import pytest
import trio

from tests.fleet.conftest import BUCKET
from tests.fleet.fleet import (
    Unavailable,
    check_served,
    messages,
    node_killed_mid_commit,
    push,
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
from wakustore.node.store_service import COMMIT_STUCK_S

pytestmark = pytest.mark.slow

# How long the storage stays unreachable: several commit attempts fail
# (one every flush interval plus the 1 s pause after a failure).
OUTAGE_S = 4.0


@pytest.fixture(scope="module")
def s3_nodes(object_store, fleet_dir):
    with running_pair(
        fleet_dir,
        "s3",
        engine="embedded",
        table_root=f"s3://{BUCKET}/fleet",
        env=s3_environment(object_store[1].endpoint),
    ) as nodes:
        yield nodes


@pytest.fixture
def fleet(s3_nodes, object_store):
    """The two nodes, running, the storage reachable; whatever a failed
    test left cut or dead is restored."""
    yield s3_nodes
    object_store[1].restore()
    start_the_dead(s3_nodes)


def test_two_writers_with_overlapping_messages_answer_the_same_set(fleet, object_store):
    two_writers(*fleet, "/fleet/1/s3-writers/proto", gate=object_store[1])


def test_node_killed_mid_commit_loses_nothing_acknowledged(fleet):
    node_killed_mid_commit(*fleet, "/fleet/1/s3-node-kill/proto")


def test_embedded_engine_killed_mid_commit_is_restarted_and_loses_nothing(fleet):
    a, b = fleet
    topic = "/fleet/1/s3-engine-kill/proto"
    sent = messages(topic, 300)
    acked: list = []
    killed = threading.Event()
    engine = a.engine_process()
    generation = a.health()[1]["engine"]["generation"]

    async def scenario() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(push_while, a.peer, sent[:200], acked, killed)
            nursery.start_soon(push_while, b.peer, sent[100:], acked, killed)
            while len(acked) < 100:
                await trio.sleep(0.005)
            killed.set()
            engine.kill()

    run(scenario)
    assert len(acked) == 400  # puts went on while the engine restarted
    # The node restarts its engine on the next use: queries answer again.
    answers = []
    settled(a, b)
    for node in (a, b):
        answers.append(run(stored_when_available, node.peer, topic))
        check_served(answers[-1], sent, exactly=sent)
    assert set(answers[0]) == set(answers[1])
    assert a.engine_process().pid != engine.pid
    assert a.health()[1]["engine"]["generation"] > generation


def _all_not_well(*nodes):
    """Each node's /health (code, body) when every one answers 503; None otherwise."""
    healths = [node.health() for node in nodes]
    return healths if all(code == 503 for code, _ in healths) else None


def test_storage_unavailable_pauses_commits_and_loses_nothing_acknowledged(fleet, object_store):
    a, b = fleet
    _, gate = object_store
    topic = "/fleet/1/s3-outage/proto"
    before, during = messages(topic, 100), messages(topic, 100, first=100)
    run(push, a.peer, before)
    settled(a)

    gate.cut()
    cut_at = time.monotonic()
    refused = gate.refused
    # Puts are acknowledged: they are durable in each node's log.
    run(push, a.peer, during[:60])
    run(push, b.peer, during[40:])
    # A page answers 503, or from the table version the node holds and its
    # own uncommitted messages (the reader may have the files it needs):
    # never without what that node acknowledged. Node b may hold a version
    # from before a's last commit: fleets see each other's commits when
    # they can next read the log.
    for node, must in ((a, before + during[:60]), (b, during[40:])):
        try:
            check_served(run(stored, node.peer, topic), before + during, at_least=must)
        except Unavailable:
            pass
    wait_for(lambda: gate.refused > refused, "a node to reach for the storage")
    # The outage lasts: commits fail and are retried, and the messages
    # stay in the logs meanwhile (the nodes still report them pending).
    time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - cut_at)))
    # The engine answers, but nothing commits: the node says it is not well,
    # once a commit failed or has been running for COMMIT_STUCK_S (the
    # engine's own retries against the storage may last minutes).
    healths = wait_for(
        lambda: _all_not_well(a, b), "both nodes to report their commits failing", timeout_s=COMMIT_STUCK_S + 30
    )
    assert healths[0][1]["pending_messages"] >= 60 and healths[1][1]["pending_messages"] >= 60
    for code, health in healths:
        assert code == 503 and health["ok"] is False and health["commit"]["ok"] is False
        assert health["commit"]["error"]

    gate.restore()
    settled(a, b)
    assert all(node.health()[0] == 200 for node in (a, b))
    answers = [run(stored_when_available, node.peer, topic) for node in (a, b)]
    for answer in answers:
        check_served(answer, before + during, exactly=before + during)
    assert set(answers[0]) == set(answers[1])
