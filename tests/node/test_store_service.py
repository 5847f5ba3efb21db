"""The node's store service: group commit of concurrent puts."""

import trio

from wakustore.node.config import NodeConfig
from wakustore.node.store_service import running_store
from wakustore.protocols.message import WakuMessage

PUBSUB = "/waku/2/rs/16/32"


def test_concurrent_puts_share_log_writes_and_count_duplicates_once(engine, tmp_path):
    config = NodeConfig(data_dir=tmp_path / "node", flush_interval_s=60)
    results = {}

    async def main():
        async with running_store(config, engine) as service:
            appends = []
            wal = service.store.writes._wal
            original = wal.append
            wal.append = lambda records: appends.append(len(records)) or original(records)

            async def push(i):
                # pushes 0 and 1 carry the same message: one of them is a duplicate
                message = WakuMessage(b"m-%d" % max(i, 1), "/g/1/c/proto", timestamp=10**18 + i)
                results[i] = await service.put([(PUBSUB, message, 10**18)])

            async with trio.open_nursery() as nursery:
                for i in range(60):
                    nursery.start_soon(push, i)
            assert sum(appends) == 59
            assert len(appends) < 60  # several pushes per fsync
            assert service.store.pending == 59

    trio.run(main)
    assert sum(r.accepted for r in results.values()) == 59
    assert sum(r.duplicates for r in results.values()) == 1
    assert {results[0].accepted + results[1].accepted} == {1}


def test_health_reports_a_failed_maintenance_run_until_one_succeeds(engine, tmp_path):
    config = NodeConfig(data_dir=tmp_path / "node", flush_interval_s=60, maintenance_interval_s=0.05)
    seen = []

    async def main():
        async with running_store(config, engine) as service:
            assert service.health()["ok"] and service.health()["maintenance"] == {}
            real = service.maintain

            def failing(policy):
                raise RuntimeError("compaction failed")

            service.maintain = failing
            while service.last_maintenance.get("ok") is not False:
                await trio.sleep(0.01)
            seen.append(service.health())
            service.maintain = real
            while service.last_maintenance.get("ok") is not True:
                await trio.sleep(0.05)
            seen.append(service.health())

    trio.run(main)
    failed, recovered = seen
    assert failed["ok"] is False and "compaction failed" in failed["maintenance"]["error"]
    assert recovered["ok"] is True and recovered["maintenance"]["error"] is None
