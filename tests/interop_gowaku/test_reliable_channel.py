"""js-waku's ReliableChannel (Scalable Data Sync) recovering from our store.

Two js-waku light nodes (@waku/sdk 0.0.36 with @waku/sds 0.0.8, driven by
tests/interop/reliable_channel.mjs), "alice" and "bob", share one channel.
Our node is their lightpush service node and the only store node they
know; it relays what they push to go-waku, which serves them filter:
ReliableChannel receives live messages by filter only (it refuses a node
without one), and our node does not serve filter. Bob goes offline (his
connection gater refuses every connection) while alice sends 30 messages;
when he is back, js-waku recovers them by itself: on reconnecting to the
store node its query-on-connect asks for the time range since its last
successful query (forward, and it stops after the first page holding a
message with a causal history), then its missing-message retriever asks
by hash for what the causal histories of later messages name. Every
recovered message must come from our node, and every request js-waku
sent must be one our node counted (``wakustore_queries_total``).

What "exactly once" means here: each participant's SDS log (the messages
SDS delivered, causal dependencies met) holds every message of the
channel once and nothing else, and every copy of a message that reached
anyone (by filter or from our store) is the one Waku message its sender
pushed, which our node stored once. ReliableChannel 0.0.36 itself hands
a message to the application more than once (``message-received`` fires
per arriving copy, before SDS looks at it): a participant's own messages
come back by filter, the look-back query returns what already came live,
and the retriever asks again for hashes whose answer SDS has not yet
processed. Those repeats are js-waku's and are not counted as doubles.

Differences met on the way, none of them in our node:

- js-waku 0.0.36 (@waku/proto 0.0.15) reads a metadata answer's shards at
  field 2 only; go-waku writes them at field 3 only (nwaku and our node
  write both, waku/waku_metadata/rpc.nim). js-waku then takes go-waku for
  a node of no shard and never subscribes through it. The script reads
  field 3 as nwaku does.
- go-waku's filter service (``SubscribersMap.cleanUp``) drops, once a
  minute, every subscriber seen within ``--filter-timeout``: the
  comparison is inverted. ``--filter-timeout=1ns`` keeps them all.
- ReliableChannel 0.0.36 computes a sent message's retrieval hint from one
  encoding and pushes another, each stamped with ``Date.now()``; the
  lightpush path awaits between the two, so the hint names a message
  nobody sent (every time, here) and a hash query for it can find nothing
  on any store node. The script stamps each message once
  (``pinTimestamps``).
- Its first query on connect covers 30 days in 24 h chunks and leaves out
  the last chunk (the newest 24 h); only the look-back after a gap, shorter
  than a day, reaches recent messages.
- Alice's resends are turned off (``retryIntervalMs`` longer than the run)
  so that bob can only recover from the store. A resend is the same SDS
  payload with a new timestamp: the same MUID, so our node keeps the first
  copy and drops the resend (stored once, by design), while nwaku keys its
  archive by message hash and keeps both. Alice's retrieval hint then names
  the resend, which our node does not have: a peer recovering by that hash
  from our node gets the message only through the time-range look-back or
  a later resend.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest
import trio

from wakustore.clients.store import StoreClient
from wakustore.protocols.store_query import HistoryQuery

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "node"))
from gowaku_node import wait_for  # noqa: E402
from test_js_waku_interop import INTEROP_DIR, node_binary  # noqa: E402, F401 (a fixture)

pytestmark = pytest.mark.slow

CLUSTER_ID = 16
SHARD = 32
SHARDS = [SHARD]
OUR_RELAY = True
# Commits every 2 s, as a running node does: the recovery reads the table.
OUR_CONFIG = {"flush_interval_s": 2.0}
PUBSUB_TOPIC = f"/waku/2/rs/{CLUSTER_ID}/{SHARD}"
CONTENT_TOPIC = "/reliable-channel/1/interop/proto"
SCRIPT = INTEROP_DIR / "reliable_channel.mjs"
RUN_TIMEOUT_MS = 120_000
BEFORE, WHILE_OFFLINE, AFTER = 3, 30, 2
OFFLINE_MS = 8_000


def gowaku_flags(ours) -> list[str]:
    return [f"--staticnode={ours.tcp_addr}", "--filter", "--filter-timeout=1ns"]


@pytest.fixture(scope="module")
def meshed(ours, gowaku):
    wait_for(lambda: ours.relay.peer_count(PUBSUB_TOPIC) >= 1, "go-waku never joined our relay topic", gowaku)
    return gowaku


def store_v3_answers(ours) -> dict[str, float]:
    """Our node's Store v3 answers so far, by status (its /metrics)."""
    counts: dict[str, float] = defaultdict(float)
    for metric in ours.service.metrics.registry.collect():
        for sample in metric.samples:
            if sample.name == "wakustore_queries_total" and sample.labels.get("protocol") == "store-v3":
                counts[sample.labels["status"]] += sample.value
    return counts


def run_channel(node: Path, ours, gowaku, workdir: Path, **job) -> list[dict]:
    """Run the script with ``job`` (its JSON fields) against our node and
    go-waku; its JSON lines, kept in ``workdir``."""
    job = {
        "storePeer": ours.tcp_addr,
        "filterPeer": gowaku.multiaddr,
        "clusterId": CLUSTER_ID,
        "shard": SHARD,
        "contentTopic": CONTENT_TOPIC,
        "channelId": f"interop-{time.time_ns()}",
        "timeoutMs": RUN_TIMEOUT_MS,
        **job,
    }
    result = subprocess.run(
        [str(node), str(SCRIPT)],
        input=json.dumps(job),
        cwd=INTEROP_DIR,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_MS / 1000 + 30,
    )
    (workdir / "events.jsonl").write_text(result.stdout)
    events = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert result.returncode == 0 and events and events[-1]["event"] == "done", (
        f"the channel run failed (events in {workdir}):\n{result.stdout[-4000:]}\n{result.stderr[-3000:]}"
    )
    return events


def stored_hashes(ours, hashes: list[bytes]) -> list[bytes]:
    async def lookup():
        found: list[bytes] = []
        async with StoreClient.connect(ours.tcp_addr) as client:
            for start in range(0, len(hashes), 100):
                query = HistoryQuery(message_hashes=tuple(hashes[start : start + 100]), limit=100)
                response = await client.query(query)
                assert response.status_code == 200, response
                found += [entry.message_hash for entry in response.messages]
        return found

    return trio.run(lookup)


def test_a_participant_back_from_offline_recovers_what_it_missed_from_our_store_once(
    node_binary,  # noqa: F811
    ours,
    meshed,
    tmp_path,
):
    answered_before = store_v3_answers(ours)
    events = run_channel(
        node_binary,
        ours,
        meshed,
        tmp_path,
        before=BEFORE,
        whileOffline=WHILE_OFFLINE,
        after=AFTER,
        offlineMs=OFFLINE_MS,
        pinTimestamps=True,
        channel={"retryIntervalMs": 10 * RUN_TIMEOUT_MS},
    )
    answered = store_v3_answers(ours)
    done = events[-1]
    alice, bob = done["participants"]["alice"], done["participants"]["bob"]
    missed = done["missed"]
    queries = [e for e in events if e["event"] == "query"]
    assert len(missed) == WHILE_OFFLINE and len(alice["sent"]) == BEFORE + WHILE_OFFLINE + AFTER

    # Nothing missing, nothing doubled: each SDS log holds every message of
    # the channel once, and each application saw every message of the other.
    everything = [s["id"] for s in alice["sent"] + bob["sent"]]
    for me, other in ((alice, bob), (bob, alice)):
        assert sorted(me["localHistory"]) == sorted(everything)
        assert {s["id"] for s in other["sent"]} <= {m["id"] for m in me["inbox"]} <= set(everything)
        assert not me["irretrievable"] and not me["errors"]

    # Every copy that reached anyone is the Waku message its sender pushed
    # (its retrieval hint), and our node stored each of them once.
    hints = {s["id"]: s["hint"] for s in alice["sent"] + bob["sent"]}
    for participant in (alice, bob):
        for message_id, arrivals in participant["arrivals"].items():
            if message_id in hints:
                assert {a["hash"] for a in arrivals} == {hints[message_id]}, message_id
    stored = stored_hashes(ours, [bytes.fromhex(h) for h in hints.values()])
    assert sorted(h.hex() for h in stored) == sorted(hints.values())
    for query in queries:
        assert len({g["hash"] for g in query["got"]}) == len(query["got"]), query

    # What bob missed came from our store only: part with the look-back
    # after the gap, the rest by hash, each hash asked for answered.
    firsts = {}
    for message_id in missed:
        arrivals = bob["arrivals"][message_id]
        assert arrivals and all(a["via"].startswith("store-") for a in arrivals), (message_id, arrivals)
        firsts[message_id] = arrivals[0]["via"]
    assert set(firsts.values()) == {"store-time", "store-hashes"}, firsts
    ours_id = ours.peer_id
    after_gap = [q for q in queries if q["participant"] == "bob" and q["started"] >= done["onlineAt"]]
    assert after_gap and all(q["peer"] == ours_id and q["error"] is None for q in after_gap)
    lookback = [q for q in after_gap if q["kind"] == "time"]
    assert lookback
    for query in lookback:
        assert query["forward"] and query["timeStart"] < done["offlineAt"] <= done["onlineAt"] <= query["timeEnd"]
    by_hash = [q for q in after_gap if q["kind"] == "hashes"]
    assert by_hash
    for query in by_hash:
        assert set(query["hashes"]) <= {g["hash"] for g in query["got"]}, query

    # Every request js-waku sent was answered by our node, with 200.
    requests = sum(q["requests"] for q in queries)
    assert answered["200"] - answered_before["200"] == requests
    assert sum(answered.values()) - sum(answered_before.values()) == requests
