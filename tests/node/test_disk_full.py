"""A node on a small file system (a tmpfs the test mounts) that fills up:
under min_free_bytes it refuses pushes naming the disk, keeps answering
queries, says why in /health, starts its size retention, and takes
messages again once space returns."""

from __future__ import annotations

import errno
import os
import sys
import time
from pathlib import Path

import pytest
import trio

from wakustore.clients.store import StoreClient
from wakustore.node.disk import CHECK_S
from wakustore.node.store_protocols import RateLimits
from wakustore.protocols.message import WakuMessage, message_hash
from wakustore.protocols.store_query import HistoryQuery

sys.path.insert(0, str(Path(__file__).parent))
from store_node_harness import PUBSUB_TOPIC, NodeThread, node_config  # noqa: E402

MIB = 1024 * 1024
FLOOR = 48 * MIB


@pytest.fixture
def small_fs(tmpfs):
    return tmpfs("160m")


def _free(path: Path) -> int:
    stat = os.statvfs(path)
    return stat.f_bavail * stat.f_frsize


def _push(node, text: str):
    message = WakuMessage(text.encode(), "/disk/1/full/proto", timestamp=time.time_ns())

    async def main():
        async with StoreClient.connect(node.tcp_addr) as client:
            return await client.push(PUBSUB_TOPIC, message)

    return message, trio.run(main)


def _stored(node, message) -> bool:
    async def main():
        async with StoreClient.connect(node.tcp_addr) as client:
            page = await client.query(
                HistoryQuery(message_hashes=(message_hash(PUBSUB_TOPIC, message),), include_data=False)
            )
            return len(page.messages) == 1

    return trio.run(main)


def test_a_full_disk_refuses_pushes_keeps_serving_and_recovers(engine, small_fs):
    config = node_config(
        small_fs / "data", min_free_bytes=FLOOR, retention="time:2592000;size:1GB", flush_interval_s=0.2
    )
    node = NodeThread(config, engine, RateLimits.parse(["0/1s"])).start()
    try:
        before, answer = _push(node, "before")
        assert answer.status_code == 200
        # Fill the file system to under the floor (a ballast file, as any other writer would).
        ballast = small_fs / "ballast"
        with open(ballast, "wb") as out:
            out.write(b"\0" * (_free(small_fs) - FLOOR + 8 * MIB))
        assert _free(small_fs) < FLOOR
        time.sleep(CHECK_S + 0.2)
        refused, answer = _push(node, "refused")
        assert answer.status_code == 503 and "the disk is full" in answer.status_desc, answer
        assert "min_free_bytes" in answer.status_desc
        # Reads go on; nothing refused was stored; /health says why.
        assert _stored(node, before) and not _stored(node, refused)
        health = node.service.health()
        assert health["ok"] is False and health["disk"]["full"] is True
        assert health["disk"]["min_free_bytes"] == FLOOR
        rejected = node.service.metrics.registry.get_sample_value(
            "wakustore_messages_rejected_total", {"source": "lightpush", "reason": "disk_full"}
        )
        assert rejected == 1
        # The size retention ran at once, not at the next hourly maintenance.
        deadline = time.monotonic() + 60
        while node.service.last_maintenance is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert node.service.last_maintenance is not None
        # Space returns: the node takes messages again by itself.
        ballast.unlink()
        time.sleep(CHECK_S + 0.2)
        after, answer = _push(node, "after")
        assert answer.status_code == 200
        assert _stored(node, after)
        assert node.service.health()["disk"]["full"] is False
    finally:
        node.stop()


def test_writes_that_meet_enospc_lose_nothing_acknowledged(engine, small_fs):
    """No floor (min_free_bytes = 0): the disk fills to the last byte under
    the node. A push whose log write fails is refused (503) and never
    acknowledged; a commit that fails leaves its rows in the write-ahead
    log; once space returns the node commits them by itself, and a restart
    replays a log with no damage: every acknowledged message there once."""
    config = node_config(small_fs / "data", min_free_bytes=0, flush_interval_s=0.2)
    node = NodeThread(config, engine, RateLimits.parse(["0/1s"])).start()
    acknowledged, refused = [], 0
    try:
        ballast = small_fs / "ballast"
        with open(ballast, "wb") as out:
            try:
                while True:
                    out.write(b"\0" * MIB)
                    out.flush()
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
        for i in range(20):
            message, answer = _push(node, f"on a full disk {i} " + "x" * 4000)
            if answer.status_code == 200:
                acknowledged.append(message)
            else:
                assert answer.status_code == 503, answer
                refused += 1
        assert refused > 0
        ballast.unlink()
        time.sleep(CHECK_S + 0.5)
        message, answer = _push(node, "after")
        assert answer.status_code == 200
        acknowledged.append(message)
        deadline = time.monotonic() + 60
        while node.service.health().get("pending_messages") and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        node.stop()
    restarted = NodeThread(config, engine, RateLimits.parse(["0/1s"])).start()
    try:
        assert all(_stored(restarted, m) for m in acknowledged)
    finally:
        restarted.stop()
