"""`wakustore bench wire` runs end to end on a tiny dataset and reports every figure."""

import json
import os

import pytest

from wakustore.bench import wire as bench_wire
from wakustore.usage import UsageError


def bench_args(argv):
    """``wakustore bench ...``'s arguments (the bench parser is built when bench runs)."""
    from wakustore.cli.bench import bench_parser
    from wakustore.cli.main import _Parser

    return bench_parser(_Parser).parse_args(argv)


def parse(*argv):
    return bench_args(["wire", *argv])


def test_wire_is_a_verb_of_the_cli_bench_command():
    args = bench_args(["wire", "--clients", "1,4,4", "--messages", "10"])
    assert args.handler is bench_wire.run_wire_bench
    assert args.clients == (1, 4)
    assert args.messages == 10


@pytest.mark.parametrize("clients", ["0", "two", ","])
def test_bad_client_levels_are_usage_errors(clients):
    with pytest.raises(UsageError):
        parse("--clients", clients)


def test_shapes_keep_the_named_time_ranges_only():
    assert parse("--shapes", "now-1h, 1d").shapes == {"now-1h", "1d"}
    assert parse().shapes is None
    for bad in ("2h", ",", "1h,2h"):
        with pytest.raises(UsageError):
            parse("--shapes", bad)


def test_non_empty_data_dir_is_refused(tmp_path):
    (tmp_path / "something").write_text("x")
    with pytest.raises(UsageError):
        bench_wire.run_wire_bench(parse("--messages", "10", "--data-dir", str(tmp_path)))


def test_small_run_reports_queries_per_second_and_latency_per_level(engine, tmp_path, capsys):
    out = tmp_path / "wire.json"
    # Enough queries for the node's CPU to span several of the kernel's
    # 10 ms accounting ticks.
    args = parse("--messages", "1500", "--clients", "1,2", "--queries", "60", "--json", str(out))
    assert bench_wire.run_wire_bench(args, engine=engine) == 0
    report = json.loads(out.read_text())

    assert report["messages"] == 1500
    assert 0 < report["unique_messages"] <= 1500
    assert report["ingest_msgs_per_s"] > 0
    assert "one libp2p host per client" in report["client_mode"]
    assert 0 < report["direct_p50_ms"] <= report["direct_p99_ms"]
    assert [level["clients"] for level in report["levels"]] == [1, 2]
    for level in report["levels"]:
        assert level["queries"] == 60
        assert level["errors"] == 0
        assert level["qps"] > 0
        assert level["node_cpu_ms_per_query"] > 0 and level["client_cpu_ms_per_query"] > 0
        assert 0 < level["p50_ms"] <= level["p99_ms"]
        assert sum(shape["n"] for shape in level["per_shape"].values()) == 60
        assert all(name.split("/")[1] in ("first", "cursor") for name in level["per_shape"])
    printed = capsys.readouterr().out
    assert "queries/s" in printed and "ms/query" in printed


def test_status_go_mix_replays_every_shape_of_its_traffic_without_errors(engine, tmp_path, capsys):
    """``--mix status-go``: presence checks (some hashes not stored),
    backfill by keys then bodies, history pages, community descriptions,
    each answered 200 over the wire, in about the stated proportions."""
    from wakustore.bench.status_go_mix import SHARES

    out = tmp_path / "wire.json"
    args = parse("--messages", "1500", "--clients", "2", "--queries", "80", "--mix", "status-go", "--json", str(out))
    assert bench_wire.run_wire_bench(args, engine=engine) == 0
    report = json.loads(out.read_text())
    assert report["mix"] == "status-go"
    (level,) = report["levels"]
    assert level["queries"] == 80 and level["errors"] == 0
    firsts = {
        name.rsplit("/", 1)[0]: shape["n"] for name, shape in level["per_shape"].items() if name.endswith("/first")
    }
    assert set(firsts) == {name for name, _ in SHARES}
    assert firsts["presence/50"] > firsts["community/31d"]
    assert all(shape["qps"] > 0 for shape in level["per_shape"].values())
    # Before the wire: each shape of the mix alone on the store service, its time and CPU.
    direct = report["direct_per_shape"]
    assert set(direct) == {name for name, _ in SHARES}
    assert all(shape["n"] > 0 and shape["p50_ms"] > 0 and shape["cpu_ms"] >= 0 for shape in direct.values())


def test_status_go_mix_queries_are_the_shapes_status_go_sends():
    import itertools
    import time

    from wakustore.bench.dataset import DatasetSpec
    from wakustore.bench.status_go_mix import mix_specs

    spec = DatasetSpec(messages=20_000, end_ns=time.time_ns())
    for mix in itertools.islice(mix_specs(spec, 3), 200):
        query = mix.query()
        if mix.range_name == "presence/50":
            assert len(query.message_hashes) == 50 and not query.include_data and query.limit == 50
        elif mix.range_name == "backfill-bodies/50":
            assert len(query.message_hashes) == 50 and query.include_data
        elif mix.range_name == "community/31d":
            assert query.limit == 1 and len(query.content_topics) == 1
            assert query.time_end - query.time_start == 31 * 86_400 * 10**9
        else:
            assert 1 <= len(query.content_topics) <= 10 and not query.forward
            assert query.time_end - query.time_start == 86_400 * 10**9
            assert query.limit == (100 if mix.range_name == "backfill-keys/100" else 50)


def test_the_table_bench_store_filled_is_queried_as_it_is(engine, tmp_path):
    """``--table-of DIR``: the table and the dataset bench store left in
    DIR, queried without loading anything (the presence checks find the
    dataset's own hashes there)."""
    from wakustore.bench import store as bench_store

    kept = tmp_path / "kept"
    store_args = bench_args(
        ["store", "--messages", "1500", "--queries", "10", "--lookups", "1", "--data-dir", str(kept)]
    )
    assert bench_store.run_store_bench(store_args) == 0
    rows = sorted(os.listdir(kept / "tables" / "messages"))
    out = tmp_path / "wire.json"
    args = parse("--table-of", str(kept), "--clients", "1", "--queries", "30", "--mix", "status-go", "--json", str(out))
    assert bench_wire.run_wire_bench(args, engine=engine) == 0
    report = json.loads(out.read_text())
    assert report["table_of"] == str(kept) and report["messages"] == 1500
    (level,) = report["levels"]
    assert level["queries"] == 30 and level["errors"] == 0
    assert sorted(os.listdir(kept / "tables" / "messages")) == rows  # nothing loaded


def test_table_of_a_dir_without_a_dataset_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError):
        bench_wire.run_wire_bench(parse("--table-of", str(tmp_path)))


def test_shapes_do_not_apply_to_the_status_go_mix(tmp_path):
    with pytest.raises(UsageError):
        bench_wire.run_wire_bench(parse("--messages", "10", "--mix", "status-go", "--shapes", "1d"))


@pytest.mark.slow
def test_hostile_run_reports_the_clients_figures_under_the_hostile_load(engine, tmp_path, capsys):
    out = tmp_path / "wire.json"
    args = parse(
        "--messages",
        "1500",
        "--clients",
        "2",
        "--queries",
        "40",
        "--hostile",
        "--hostile-hosts",
        "2",
        "--json",
        str(out),
    )
    assert bench_wire.run_wire_bench(args, engine=engine) == 0
    (level,) = json.loads(out.read_text())["levels"]
    hostile = level["hostile"]
    assert hostile["queries"] == 40 and hostile["errors"] == 0
    assert 0 < hostile["p50_ms"] <= hostile["p99_ms"]
    # The hostile hosts dialed more connections at once than their addresses may hold.
    assert hostile["load"]["connections"] > 0 and hostile["load"]["queries"] > 0
    assert hostile["refused_by_node"].get("ip_colocation", 0) > 0
    assert "under hostile load" in capsys.readouterr().out


def test_process_cpu_counts_the_work_of_every_thread():
    import os
    import threading
    import time

    spent = []

    def spin():
        started = time.thread_time()
        while time.thread_time() - started < 0.2:
            pass
        spent.append(time.thread_time() - started)

    before = bench_wire.process_cpu_s(os.getpid())
    worker = threading.Thread(target=spin)
    worker.start()
    worker.join()
    # Clock ticks are 10 ms: the process total may round below the thread's own figure by one.
    assert bench_wire.process_cpu_s(os.getpid()) - before >= spent[0] - 0.02
