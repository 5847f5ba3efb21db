"""`wakustore bench store` runs end to end and reports every figure."""

import json

import numpy as np
import pytest

from wakustore.bench import dataset as bench_dataset
from wakustore.bench import sql as bench_sql
from wakustore.bench import store as bench_store
from wakustore.protocols.message import message_hash, muid
from wakustore.usage import UsageError


def bench_args(argv):
    """``wakustore bench ...``'s arguments (the bench parser is built when bench runs)."""
    from wakustore.cli.bench import bench_parser
    from wakustore.cli.main import _Parser

    return bench_parser(_Parser).parse_args(argv)


def parse(*argv):
    return bench_args(["store", *argv])


def test_dataset_is_deterministic_with_a_tenth_resent():
    spec = bench_dataset.DatasetSpec(messages=4000, end_ns=1_700_000_000 * 10**9, seed=7)
    first = [m for batch in bench_dataset.stream(spec, 1000) for m in batch]
    again = [m for batch in bench_dataset.stream(spec, 3000) for m in batch]
    assert first == again
    keys = [muid(p, m) for p, m, _ in first]
    duplicates = len(keys) - len(set(keys))
    assert 0.07 * len(keys) < duplicates < 0.13 * len(keys)
    assert {p for p, _, _ in first} == {f"/waku/2/rs/16/{s}" for s in range(8)}
    assert all(100 <= len(m.payload) <= 2048 for _, m, _ in first)
    assert all(spec.start_ns <= m.timestamp < spec.end_ns for _, m, _ in first)
    assert any(m.meta for _, m, _ in first) and not all(m.meta for _, m, _ in first)


def test_pages_of_a_set_shorter_than_their_range_lie_in_the_set():
    """--days 1 (live traffic): a 7-day page ends anywhere in the day."""
    spec = bench_dataset.DatasetSpec(messages=1000, end_ns=1_700_000_000 * 10**9, days=1)
    pages = [p for _, p in zip(range(40), bench_store.page_specs(spec, 3))]
    assert {p.range_name for p in pages} == set(bench_store.RANGES)
    assert all(spec.start_ns <= p.time_end <= spec.end_ns for p in pages)


def test_the_originals_fingerprint_is_that_of_the_distinct_messages_of_the_stream():
    spec = bench_dataset.DatasetSpec(messages=5000, end_ns=1_700_000_000 * 10**9, seed=3)
    hashes = {message_hash(p, m) for batch in bench_dataset.stream(spec, 700) for p, m, _ in batch}
    muids = {muid(p, m) for batch in bench_dataset.stream(spec, 700) for p, m, _ in batch}
    assert len(hashes) == len(muids)  # every original has its own MUID
    wanted = bench_dataset.originals_fingerprint(spec, batch_size=1234)
    assert wanted == bench_dataset.Fingerprint.of_prefixes(_prefixes(hashes))
    assert (
        wanted.count
        == len(hashes)
        == sum(1 for slot in range(spec.messages) if not bench_dataset.is_duplicate(spec, slot))
    )
    assert bench_dataset.message_at(spec, 4321) == next(
        (p, m) for batch in bench_dataset.stream(spec, 5000) for i, (p, m, _) in enumerate(batch) if i == 4321
    )


class _Hashes:
    """A table as the integrity check reads it: its hash prefixes in chunks."""

    def __init__(self, hashes):
        self.hashes = sorted(hashes)

    def prefix_batches(self, column):
        assert column == "message_hash"
        for start in range(0, len(self.hashes), 1000):
            yield _prefixes(self.hashes[start : start + 1000])


def test_the_integrity_check_compares_the_table_with_the_originals_not_with_the_puts():
    spec = bench_dataset.DatasetSpec(messages=3000, end_ns=1_700_000_000 * 10**9, seed=9)
    hashes = {message_hash(p, m) for batch in bench_dataset.stream(spec, 1000) for p, m, _ in batch}
    good = bench_store.check_integrity(_Hashes(hashes), spec)
    assert good["ok"] and good["table"] == good["dataset"] and good["dataset"]["count"] == len(hashes)
    one = next(iter(hashes))
    missing = bench_store.check_integrity(_Hashes(hashes - {one}), spec)
    assert not missing["ok"] and missing["table"]["count"] == len(hashes) - 1
    other = bench_store.check_integrity(_Hashes((hashes - {one}) | {bytes(32)}), spec)
    assert not other["ok"] and other["table"]["count"] == len(hashes)
    doubled = bench_store.check_integrity(_Hashes([*hashes, one]), spec)
    assert not doubled["ok"]


def _prefixes(hashes):
    return np.frombuffer(b"".join(h[:8] for h in hashes), dtype=">u8").astype(np.uint64)


def test_unknown_compare_backend_is_a_usage_error():
    with pytest.raises(UsageError):
        parse("--compare", "sqlite,mysql")


def test_non_empty_data_dir_is_refused(tmp_path):
    (tmp_path / "something").write_text("x")
    with pytest.raises(UsageError):
        bench_store.run_store_bench(parse("--messages", "10", "--data-dir", str(tmp_path)))


def test_small_run_reports_every_figure_and_backends_agree(tmp_path, capsys):
    out = tmp_path / "bench.json"
    args = parse(
        "--messages", "3000", "--compare", "sqlite,postgres", "--queries", "40", "--lookups", "4", "--json", str(out)
    )
    assert args.handler(args) == 0
    report = json.loads(out.read_text())

    assert report["messages"] == 3000
    assert report["unique_messages"] + report["duplicates"] == 3000
    assert report["rows_in_table"] == report["unique_messages"]
    assert report["integrity"]["ok"] and report["integrity"]["table"] == report["integrity"]["dataset"]
    assert report["accepted"] >= report["unique_messages"]
    assert report["ingest_breakdown_s"]["generate"] > 0
    assert report["ingest_msgs_per_s"] > 0
    assert report["compact_s"] > 0
    assert report["table"]["files_after_compact"] <= report["table"]["files_before_compact"]
    assert 0 < report["query_p50_ms"] <= report["query_p99_ms"]
    assert report["queries"] == 40
    assert report["hash_lookup_p50_ms"] > 0
    for shape in (
        "1h/first",
        "1d/first",
        "7d/first",
        "hash/1",
        "hash/20",
        "hash/50",
        "hash/1/keys",
        "hash/20/keys",
        "hash/50/keys",
    ):
        figures = report["per_shape"][shape]
        assert figures["n"] > 0 and 0 < figures["p50_ms"] <= figures["p99_ms"]
    # The node opened again on its table: its indexes mapped, none built,
    # the first history page read through them.
    restart = report["restart"]
    assert restart["ready_s"] > 0 and restart["first_page_from_index"] and restart["first_page_messages"] > 0
    assert restart["first_page_equal"]
    assert restart["indexes_mapped"] == report["table"]["files_after_compact"] and restart["indexes_built"] == 0
    assert restart["key_filter_filled_s"] is not None
    for phase in ("ingest", "compaction", "serving"):
        assert report["rss_phases_mb"][phase]["node"] > 0
    assert report["peak_rss_mb"]["node"] > 0
    assert report["peak_rss_mb"]["engine"] > 0
    assert report["reader_page_p50_ms"] > 0

    # The same queries through the engine: every answer equal to the reader's.
    spark = report["spark_path"]
    assert spark["queries"] == report["queries"]
    assert 0 < spark["query_p50_ms"] <= spark["query_p99_ms"] and spark["hash_lookup_p50_ms"] > 0
    assert spark["crosscheck"]["checked"] >= report["queries"] + 8
    assert spark["crosscheck"]["mismatches"] == 0

    for name in ("sqlite", "postgres"):
        backend = report[name]
        assert "error" not in backend
        assert backend["rows"] == report["unique_messages"]
        assert backend["ingest_msgs_per_s"] > 0
        assert 0 < backend["query_p50_ms"] <= backend["query_p99_ms"]
        assert backend["hash_lookup_p50_ms"] > 0
        assert backend["queries"] == report["queries"]
        assert set(backend["ratios"]) == {"query_p50", "query_p99", "hash_lookup_p50"}
        assert all(ratio > 0 for ratio in backend["ratios"].values())
        assert backend["crosscheck"]["checked"] >= report["queries"]
        assert backend["crosscheck"]["mismatches"] == 0
    assert report["crosscheck_ok"] is True

    printed = capsys.readouterr().out
    assert "query p50 ms" in printed and "postgres" in printed and "sqlite" in printed
    assert "delta/spark" in printed


def test_postgres_server_directory_is_removed_after_stop():
    directory = bench_sql.ensure_postgres()  # installs Debian's package when missing (CI runs as root)
    server = bench_sql.PostgresServer(directory)
    try:
        server.start()
        root = server.root
        assert (root / "data" / "postmaster.pid").exists()
    finally:
        server.stop()
    assert not root.exists()
