"""A damaged write-ahead log record under a real node: `wakustore serve`
acknowledges N pushes, is SIGKILLed before any commit, 16 bytes are flipped
in the middle of its log segment, and it starts again. Every message but
those of the damaged record is served exactly once, and the loss is said:
in the log, in /health, in the metrics and by `db check`, also after the
log was trimmed and the node started once more."""

import os
import struct
import subprocess
import sys
import time
import urllib.request
import zlib

import pyarrow as pa
import pytest
import trio

from wakustore.bench.soak import CLUSTER_ID, NodeProcess
from wakustore.clients.store import StoreClient
from wakustore.protocols.lightpush import LightpushStatus
from wakustore.protocols.message import WakuMessage, message_hash
from wakustore.protocols.store_query import HistoryQuery, StatusCode

pytestmark = pytest.mark.slow

PUBSUB = f"/waku/2/rs/{CLUSTER_ID}/0"
CONTENT = "/wal/1/damage/proto"
PUSHED = 200


def test_a_damaged_log_record_loses_only_its_messages_and_is_reported(tmp_path):
    data = tmp_path / "node"
    # No commit before the kill: every acknowledged message is in the log only.
    node = NodeProcess(data, tmp_path / "node.log", flush_interval_s=3600)
    now = time.time_ns()
    messages = [
        WakuMessage(b"wal damage #%d " % i + os.urandom(2000), CONTENT, timestamp=now + i) for i in range(PUSHED)
    ]
    node.start()
    try:
        trio.run(_push, node.peer, messages)
    finally:
        node.kill()

    (segment,) = (data / "wal" / "messages").glob("*.wal")
    frames = _frames(segment.read_bytes())
    middle = segment.stat().st_size // 2
    hit = [i for i, (start, end, _) in enumerate(frames) if start < middle + 16 and middle < end]
    assert hit and hit[-1] < len(frames) - 1  # damage with whole records after it
    lost = {h for i in hit for h in _rows(frames[i][2]).column("message_hash").to_pylist()}
    start, end = frames[hit[0]][0], frames[hit[-1]][1]
    before, after = _rows(frames[hit[0] - 1][2]), _rows(frames[hit[-1] + 1][2])
    times = [min(before.column("timestamp").to_pylist()), max(after.column("timestamp").to_pylist())]
    raw = bytearray(segment.read_bytes())
    raw[middle : middle + 16] = bytes(b ^ 0xFF for b in raw[middle : middle + 16])
    segment.write_bytes(bytes(raw))
    kept = data / "wal" / "messages" / "damaged" / f"{segment.stem}.{start}-{end}.bin"
    expected = {message_hash(PUBSUB, m) for m in messages} - lost
    assert 0 < len(lost) < 5 and len(expected) == PUSHED - len(lost)

    node.start()
    try:
        assert trio.run(_served, node.peer) == sorted(expected)
        health = node.health()
        assert health["ok"] is True
        (damage,) = health["wal_damage"]
        assert damage["table"] == "messages" and damage["segment"] == str(segment)
        assert (damage["start"], damage["end"], damage["bytes"]) == (start, end, end - start)
        assert damage["timestamps_ns"] == times and damage["copy"] == str(kept)
        assert kept.read_bytes() == bytes(raw[start:end])
        assert _metric(node, "wakustore_wal_damaged_regions") == 1
        assert _metric(node, "wakustore_wal_damaged_bytes") == end - start
        log = (tmp_path / "node.log").read_text()
        warnings = [line for line in log.splitlines() if f"damaged bytes {start} to {end}" in line]
        assert len(warnings) == 1 and str(segment) in warnings[0] and str(kept) in warnings[0]
        assert f"replayed {PUSHED - len(lost)} messages from the write-ahead log, 1 damaged region" in log
    finally:
        node.stop()  # commits what was replayed: the log's segment is trimmed

    assert not segment.exists() and kept.exists()
    checked = subprocess.run(
        [sys.executable, "-m", "wakustore", "db", "check", "--data-dir", str(data)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert checked.returncode == 1, checked.stdout + checked.stderr
    (line,) = [line for line in checked.stdout.splitlines() if line.startswith("write-ahead log")]
    assert line.startswith(f"write-ahead log {kept}: bytes {start} to {end} of {segment.name}, damaged")
    assert line.endswith(f"holding times {damage['timestamps'][0]} to {damage['timestamps'][1]}")

    node.start()  # the table serves the rest once; the loss is still reported
    try:
        assert trio.run(_served, node.peer) == sorted(expected)
        assert [d["copy"] for d in node.health()["wal_damage"]] == [str(kept)]
    finally:
        node.kill()


async def _push(peer: str, messages: list[WakuMessage]) -> None:
    async with StoreClient.connect(peer, timeout_s=60) as client:
        for message in messages:
            response = await client.push(PUBSUB, message)
            assert response.status_code == LightpushStatus.SUCCESS, response


async def _served(peer: str) -> list[bytes]:
    """Every hash the node serves on the test's topic, as often as served."""
    query = HistoryQuery(pubsub_topic=PUBSUB, content_topics=(CONTENT,), limit=100, include_data=False)
    hashes = []
    async with StoreClient.connect(peer, timeout_s=60) as client:
        async for page in client.pages(query):
            assert page.status_code == StatusCode.OK, page
            hashes += [m.message_hash for m in page.messages]
    assert len(hashes) == len(set(hashes)), "a message served twice"
    return sorted(hashes)


def _frames(data: bytes) -> list[tuple[int, int, bytes]]:
    """(start, end, record) of each frame of a whole segment: length, CRC-32, body."""
    frames, at = [], 0
    while at < len(data):
        length, crc = struct.unpack_from(">II", data, at)
        body = data[at + 8 : at + 8 + length]
        assert zlib.crc32(body) == crc
        frames.append((at, at + 8 + length, body))
        at += 8 + length
    return frames


def _rows(record: bytes) -> pa.Table:
    return pa.ipc.open_stream(record).read_all()


def _metric(node: NodeProcess, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{node.metrics_port}/metrics", timeout=10) as response:
        text = response.read().decode()
    (value,) = [line.split()[-1] for line in text.splitlines() if line.startswith(f'{name}{{table="messages"}}')]
    return float(value)
