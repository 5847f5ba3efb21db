"""A bad file in the data dir never keeps a node down (README, "Health").

One data dir is written once for the module: a compacted day (the node's
own file, with page CRCs, read by page), a finished day of three ingest
files, and today's three ingest files (the engine's, with a CRC-32 in
their key index; the newest rows, which a start reads into the hot tier),
each file of its own content topic, and the key index of every file.
Each case copies it, damages one kind of file one way (bytes flipped in
the middle, cut to half, replaced by a directory, deleted) and starts a
real node on it (the session's engine, libp2p on loopback, /health and
/metrics over HTTP): it starts; a bad data file is named once in the log,
in /health and in the metrics; a page that needs it answers 503 with the
text that says so, pages that do not are answered whole; a damaged key
index never reaches the Parquet reader (a node that used it aborted) and
is built again from its data file, its pages answered; puts are taken;
and a maintenance run (retention, compaction of the finished day)
succeeds beside the bad file.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import shutil
import sys
import time
import urllib.request
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import trio
from deltalake import DeltaTable

from wakustore.clients.store import StoreClient
from wakustore.node.store_protocols import BAD_FILE_TEXT, RateLimits
from wakustore.protocols.message import WakuMessage, message_hash
from wakustore.protocols.store_query import HistoryQuery, StatusCode
from wakustore.storage import maintenance, schema
from wakustore.storage.index_files import IndexDirectory
from wakustore.storage.message_store import MessageStore
from wakustore.storage.table import DeltaTableRef

sys.path.insert(0, str(Path(__file__).resolve().parent))
from store_node_harness import PUBSUB_TOPIC, NodeThread, node_config  # noqa: E402

DAY = schema.NS_PER_DAY
PER_FILE = 20
OLD = "/bad/1/old/proto"  # the compacted day's topic
FINISHED = ["/bad/1/finished-a/proto", "/bad/1/finished-b/proto", "/bad/1/finished-c/proto"]
TODAY = ["/bad/1/new-1/proto", "/bad/1/new-2/proto", "/bad/1/new-3/proto"]
# The file each kind of case damages (an index case damages every index file).
VICTIM_TOPIC = {"ingest": TODAY[1], "compacted": OLD, "index": TODAY[1]}
# A page over another file: older than today's victim (the table answers
# it, not the hot tier), and on another day than the compacted one.
OTHER_TOPIC = TODAY[0]
HEALTH_WAIT_S = 20.0


class MetricsNode(NodeThread):
    with_metrics = True


@pytest.fixture(scope="module")
def written(engine, tmp_path_factory):
    """(data dir, {content topic: [(hash, timestamp)]}) as described above."""
    data = tmp_path_factory.mktemp("bad-files") / "data"
    now = time.time_ns()
    old_day = now - 3 * DAY
    finished_day = now - 2 * DAY
    today = now - 600 * 10**9  # minutes ago: inside the hot tier's day
    store = MessageStore(
        DeltaTableRef(engine, str(data / "tables" / "messages")),
        data / "wal" / "messages",
        index_directory=data / "index" / "messages",
    )
    store.open()
    sent: dict[str, list[tuple[bytes, int]]] = {}

    def commit(topic: str, first_ns: int, count: int = PER_FILE) -> None:
        batch = []
        for i in range(count):
            message = WakuMessage(os.urandom(600), topic, timestamp=first_ns + i * 10**6)
            batch.append((PUBSUB_TOPIC, message, first_ns))
            sent.setdefault(topic, []).append((message_hash(PUBSUB_TOPIC, message), message.timestamp))
        store.put(batch)
        store.flush()

    commit(OLD, old_day)
    commit(OLD, old_day + 10**9)
    # That day alone is finished: one sorted file of the node's.
    maintenance.compact(store.table, today=schema.day_of_ns(old_day) + dt.timedelta(days=1))
    for n, topic in enumerate(FINISHED):
        commit(topic, finished_day + n * 10**9, 10)
    for n, topic in enumerate(TODAY):
        commit(topic, today + n * 60 * 10**9)
    store.reader.index_now()
    store.close()
    return data, sent


def _file_of(data: Path, topic: str) -> str:
    """The data file (as the log names it) holding ``topic``'s messages."""
    uri = data / "tables" / "messages"
    for path in pa.table(DeltaTable(str(uri)).get_add_actions(flatten=True)).column("path").to_pylist():
        if topic in pq.read_table(uri / path, columns=["content_topic"]).column(0).to_pylist():
            return path
    raise AssertionError(f"no file holds {topic}")


def _get(port: int, route: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{route}", timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as answer:
        return answer.code, answer.read()


def _health_until(port: int, done, timeout_s: float = HEALTH_WAIT_S) -> dict:
    """/health once ``done(report)`` holds (background checks run after the start)."""
    deadline = time.monotonic() + timeout_s
    while True:
        status, body = _get(port, "/health")
        report = json.loads(body)
        if done(report) or time.monotonic() > deadline:
            return {**report, "status": status}
        time.sleep(0.2)


def _ask(node: NodeThread, queries):
    async def main():
        async with StoreClient.connect(node.tcp_addr) as client:
            answers = [await client.query(q) for q in queries]
            fresh = WakuMessage(b"after the start", TODAY[2], timestamp=time.time_ns())
            pushed = await client.push(PUBSUB_TOPIC, fresh)
            again = await client.query(HistoryQuery(message_hashes=(message_hash(PUBSUB_TOPIC, fresh),)))
            return answers, pushed, again

    return trio.run(main)


def _page(topic: str) -> HistoryQuery:
    return HistoryQuery(pubsub_topic=PUBSUB_TOPIC, content_topics=(topic,), limit=100, forward=True)


def _hashes(answer) -> list[bytes]:
    return [m.message_hash for m in answer.messages]


@pytest.mark.parametrize("how", ["flipped", "truncated", "directory", "deleted"])  # tests/conftest.py DAMAGES
@pytest.mark.parametrize("kind", ["ingest", "compacted", "index"])
def test_a_bad_file_leaves_the_node_serving_every_page_that_does_not_need_it(
    written, engine, tmp_path, caplog, damage, kind, how
):
    base, sent = written
    data = tmp_path / "data"
    shutil.copytree(base, data)
    victim = _file_of(data, VICTIM_TOPIC[kind])
    uri = data / "tables" / "messages"
    location = str(uri / victim)
    indexes = IndexDirectory(data / "index" / "messages")
    if kind == "index":
        # Every index file (defect seen: a damaged one reached the Parquet
        # reader before its CRC was checked and aborted the process).
        for path in pa.table(DeltaTable(str(uri)).get_add_actions(flatten=True)).column("path").to_pylist():
            damage(Path(indexes.path_of(path)), how)
    else:
        damage(Path(location), how)
    caplog.set_level(logging.INFO)
    config = node_config(data, metrics_port=0, maintenance_interval_s=3600.0)
    node = MetricsNode(config, engine, rate_limits=RateLimits.parse(["0/1s"])).start()
    try:
        needing, other, finished = _page(VICTIM_TOPIC[kind]), _page(OTHER_TOPIC), _page(FINISHED[0])
        (answer, other_answer, finished_answer), pushed, found = _ask(node, [needing, other, finished])
        if kind == "index":
            health = _health_until(node.metrics_port, lambda r: r["key_index"]["building"] == 0)
        else:
            health = _health_until(node.metrics_port, lambda r: location in r["bad_files"])
        _, metrics = _get(node.metrics_port, "/metrics")
        policy = maintenance.RetentionPolicy.parse(config.retention)
        trio.from_thread.run(node.service.maintain_once, policy, trio_token=node._token)
        maintained = node.service.last_maintenance
        files_after = pa.table(DeltaTable(str(uri)).get_add_actions(flatten=True)).to_pydict()
    finally:
        node.stop()

    # The pages that do not need the file are answered whole; so is a put.
    assert other_answer.status_code == StatusCode.OK
    assert _hashes(other_answer) == [h for h, _ in sent[OTHER_TOPIC]]
    assert finished_answer.status_code == StatusCode.OK
    assert _hashes(finished_answer) == [h for h, _ in sent[FINISHED[0]]]
    assert pushed.status_code == StatusCode.OK and len(found.messages) == 1
    # Health stays ok (the node serves), and says what it cannot read.
    assert health["status"] == 200 and health["ok"] is True, health
    if kind == "index":
        # Never used: built again from the data file, its pages answered.
        assert answer.status_code == StatusCode.OK
        assert _hashes(answer) == [h for h, _ in sent[VICTIM_TOPIC[kind]]]
        assert health["bad_files"] == {}
        assert health["key_index"]["building"] == 0 and health["key_index"]["built"] >= 1
        if how != "deleted":  # a missing index is not damage: it is built
            damaged = health["key_index"]["damaged_files"]
            assert indexes.path_of(victim) in damaged, damaged
            counted = [line for line in metrics.decode().splitlines() if line.startswith("wakustore_key_index_damaged")]
            assert counted == [f'wakustore_key_index_damaged_files{{table="messages"}} {len(damaged)}.0'], [
                r.getMessage() for r in caplog.records if "damaged" in r.getMessage()
            ]
    else:
        assert answer.status_code == StatusCode.SERVICE_UNAVAILABLE, answer
        assert answer.status_desc == f"SERVICE_UNAVAILABLE: {BAD_FILE_TEXT}"
        assert list(health["bad_files"]) == [location], health["bad_files"]
        assert b'wakustore_table_bad_files{table="messages"} 1.0' in metrics
        named = [r for r in caplog.records if r.levelno >= logging.WARNING and victim in r.getMessage()]
        assert len(named) == 1 and named[0].levelno == logging.ERROR, [r.getMessage() for r in named]
        # The bad file is still the table's (never rewritten into a clean one).
        assert victim in files_after["path"]
    # Maintenance carried on: the finished day is one sorted file now.
    assert maintained is not None and maintained.ok, maintained
    days = [str(d) for d in files_after["partition.day"]]
    finished = str(schema.day_of_ns(sent[FINISHED[0]][0][1]))
    assert days.count(finished) == 1
