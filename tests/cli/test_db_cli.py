"""`wakustore db`: bulk import and export, stats, compaction, vacuum, retention."""

import json
import subprocess
import sys
import time

import pytest

DAY = 86_400 * 10**9


def wakustore(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "wakustore", *args], capture_output=True, text=True, timeout=timeout)


def _messages(now):
    out = []
    for i in range(300):
        out.append(
            {
                "pubsub_topic": f"/waku/2/rs/16/{32 + i % 2}",
                "content_topic": f"/db/1/t{i % 3}/proto",
                "payload": (b"payload-%d" % i).hex(),
                "meta": "" if i % 4 else "ab" * (i % 7),
                "timestamp": now - (i % 40) * DAY // 4 - i,
                "version": i % 2,
            }
        )
    return out


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    base = tmp_path_factory.mktemp("db")
    now = time.time_ns()
    messages = _messages(now)
    source = base / "in.jsonl"
    # every message twice: the second copy is a duplicate by MUID
    source.write_text("".join(json.dumps(m) + "\n" for m in messages + messages))
    result = wakustore("db", "import", "--data-dir", str(base / "data"), "--from-jsonl", str(source))
    assert result.returncode == 0, result.stderr
    # the second copy of each line repeats the first: counted as already stored
    assert result.stderr.strip().splitlines()[-1] == "imported 600 messages: 300 new, 300 already stored"
    return base, messages, now


def test_export_gives_back_exactly_what_was_imported(loaded):
    base, messages, _ = loaded
    out = base / "out.jsonl"
    result = wakustore("db", "export", "--data-dir", str(base / "data"), "--to-jsonl", str(out))
    assert result.returncode == 0, result.stderr
    exported = [json.loads(line) for line in out.read_text().splitlines()]
    key = lambda m: (m["timestamp"], m["payload"])  # noqa: E731
    assert sorted(exported, key=key) == sorted(messages, key=key)
    stamps = [m["timestamp"] for m in exported]
    assert stamps == sorted(stamps)


def test_export_filters(loaded):
    base, messages, now = loaded
    out = base / "filtered.jsonl"
    start, end = now - 3 * DAY, now - DAY
    result = wakustore(
        "db",
        "export",
        "--data-dir",
        str(base / "data"),
        "--to-jsonl",
        str(out),
        "--pubsub-topic",
        "/waku/2/rs/16/32",
        "--content-topic",
        "/db/1/t0/proto",
        "--content-topic",
        "/db/1/t1/proto",
        "--start",
        str(start),
        "--end",
        str(end),
    )
    assert result.returncode == 0, result.stderr
    got = sorted(json.loads(line)["payload"] for line in out.read_text().splitlines())
    want = sorted(
        m["payload"]
        for m in messages
        if m["pubsub_topic"] == "/waku/2/rs/16/32"
        and m["content_topic"] in ("/db/1/t0/proto", "/db/1/t1/proto")
        and start <= m["timestamp"] < end
    )
    assert got == want and got


def test_stats_compact_vacuum_retention(loaded):
    base, messages, now = loaded
    data = str(base / "data")
    stats = json.loads(wakustore("db", "stats", "--data-dir", data).stdout)
    assert stats["rows"] == 300 and stats["days"] >= 10
    compact = wakustore("db", "compact", "--data-dir", data)
    assert compact.returncode == 0, compact.stderr
    after = json.loads(wakustore("db", "stats", "--data-dir", data).stdout)
    assert after["rows"] == 300 and after["files"] <= after["days"]
    assert wakustore("db", "vacuum", "--data-dir", data, "--retention-hours", "0").returncode == 0
    retention = wakustore("db", "retention", "--data-dir", data, "--policy", "time:432000")  # 5 days
    assert retention.returncode == 0, retention.stderr
    result = json.loads(retention.stdout)
    assert result["rows_before"] == 300
    assert result["rows_after"] == sum(1 for m in messages if m["timestamp"] >= result["cutoff_ns"])
    assert 0 < result["rows_after"] < 300


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"pubsub_topic": "/p", "content_topic": "/c", "payload": "zz"}\n', ":1: payload"),
        ("not json\n", ":1: invalid JSON"),
        ('{"content_topic": "/c"}\n', ":1: no pubsub_topic field"),
        ('{"pubsub_topic": "/p", "content_topic": "/c", "timestamp": "soon"}\n', ":1: timestamp and version must be"),
        ('\n{"pubsub_topic": "/p", "content_topic": "/c", "meta": "' + "ab" * 65 + '"}\n', ":2: meta_too_large"),
    ],
)
def test_bad_import_lines_are_one_line_errors(tmp_path, content, message):
    source = tmp_path / "bad.jsonl"
    source.write_text(content)
    result = wakustore("db", "import", "--data-dir", str(tmp_path / "d"), "--from-jsonl", str(source))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [result.stderr.strip()]  # one line
    assert result.stderr.startswith(f"wakustore: error: {source}{message}")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('\n{"pubsub_topic": "/p", "content_topic": "/c", "timestamp": 1.5}\n', ":2: timestamp must be an integer"),
        ('{"pubsub_topic": "/p", "content_topic": "/c", "timestamp": "12"}\n', ":1: timestamp must be an integer"),
        ('{"pubsub_topic": "/p", "content_topic": "/c", "timestamp": -1}\n', ":1: timestamp must be an integer"),
        ('{"pubsub_topic": "/p", "content_topic": "/c", "version": 4294967295}\n', ":1: version must be"),
        ('{"pubsub_topic": "/p", "content_topic": "/c", "timestamp": 1' + "0" * 5000 + "}\n", ":1: invalid JSON"),
        ("[" * 100_000 + "\n", ":1: invalid JSON"),
        ('{"pubsub_topic": "/p\\ud800", "content_topic": "/c"}\n', ":1: a topic is not valid Unicode"),
        ('{"pubsub_topic": "/p", "content_topic": 7}\n', ":1: pubsub_topic and content_topic"),
        ('{"pubsub_topic": "", "content_topic": "/c"}\n', ":1: pubsub_topic and content_topic"),
        ('{"pubsub_topic": "/p", "content_topic": "/c"}\n\udcff\n', ":2: not UTF-8"),  # a raw 0xff byte
        ('{"pubsub_topic": "/p", "content_topic": "/c", "payload": "' + "00" * 600_000 + '"}\n', ":1: longer than"),
    ],
)
def test_the_jsonl_reader_names_file_and_line(tmp_path, content, message):
    from wakustore.cli.db import iter_jsonl
    from wakustore.usage import UsageError

    source = tmp_path / "bad.jsonl"
    source.write_bytes(content.encode("utf-8", "surrogateescape"))
    with pytest.raises(UsageError) as raised:
        list(iter_jsonl(source))
    assert str(raised.value).startswith(f"{source}{message}")


def test_bad_policy_and_missing_file_are_usage_errors(tmp_path):
    result = wakustore("db", "import", "--data-dir", str(tmp_path), "--from-jsonl", str(tmp_path / "nope"))
    assert result.returncode == 2 and "no such file" in result.stderr
    result = wakustore("db", "retention", "--data-dir", str(tmp_path), "--policy", "forever")
    assert result.returncode == 2 and result.stderr.startswith("wakustore: error: ")


def _lines(count, now, bad_at=None, bad=""):
    """``count`` JSON Lines of distinct messages over a week; line ``bad_at`` (1-based) is ``bad``."""
    out = []
    for i in range(1, count + 1):
        if i == bad_at:
            out.append(bad)
            continue
        out.append(
            json.dumps(
                {
                    "pubsub_topic": "/waku/2/rs/16/32",
                    "content_topic": f"/db/1/big{i % 5}/proto",
                    "payload": (b"line-%d" % i).hex(),
                    "timestamp": now - (i % 7) * DAY - i,
                }
            )
        )
    return "".join(line + "\n" for line in out)


def _table_writes(data_dir):
    """Operations in the message table's log that wrote rows."""
    from deltalake import DeltaTable

    history = DeltaTable(str(data_dir / "tables" / "messages")).history()
    return [h["operation"] for h in history if h["operation"] not in ("CREATE TABLE", "SET TBLPROPERTIES")]


def _table_rows(data_dir):
    from deltalake import DeltaTable

    return len(DeltaTable(str(data_dir / "tables" / "messages")).to_pyarrow_table(columns=["muid"]))


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        ('{"pubsub_topic": "/waku/2/rs/16/32", "content_topic": "/c/1/x/proto", "payload": "0', "invalid JSON"),
        (
            '{"pubsub_topic": "/waku/2/rs/16/32", "content_topic": "/c/1/x/proto", "payload": "'
            + "ab" * (150 * 1024)
            + '"}',
            "too_large: message is",
        ),
    ],
    ids=["invalid-json", "oversize-payload"],
)
def test_a_bad_line_anywhere_imports_nothing_then_the_fixed_file_lands_in_one_commit(tmp_path, bad, reason):
    data = tmp_path / "data"
    source = tmp_path / "big.jsonl"
    now = time.time_ns()
    source.write_text(_lines(12_000, now, bad_at=7000, bad=bad))
    result = wakustore("db", "import", "--data-dir", str(data), "--from-jsonl", str(source))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"wakustore: error: {source}:7000: ") and reason in lines[0]
    assert _table_rows(data) == 0 and _table_writes(data) == []
    source.write_text(_lines(12_000, now))
    result = wakustore("db", "import", "--data-dir", str(data), "--from-jsonl", str(source))
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip().splitlines()[-1] == "imported 12000 messages: 12000 new, 0 already stored"
    assert len(_table_writes(data)) == 1 and _table_rows(data) == 12_000


def test_importing_a_file_twice_reports_true_counts(tmp_path):
    data = tmp_path / "data"
    source = tmp_path / "ten.jsonl"
    source.write_text(_lines(10, time.time_ns()))
    first = wakustore("db", "import", "--data-dir", str(data), "--from-jsonl", str(source))
    assert first.returncode == 0, first.stderr
    assert first.stderr.strip().splitlines()[-1] == "imported 10 messages: 10 new, 0 already stored"
    second = wakustore("db", "import", "--data-dir", str(data), "--from-jsonl", str(source))
    assert second.returncode == 0, second.stderr
    assert second.stderr.strip().splitlines()[-1] == "imported 10 messages: 0 new, 10 already stored"
    assert _table_rows(data) == 10


def _files_per_day(data_dir):
    import pyarrow as pa
    from deltalake import DeltaTable

    actions = pa.table(DeltaTable(str(data_dir / "tables" / "messages")).get_add_actions(flatten=True))
    days = [str(d) for d in actions.column("partition.day").to_pylist()]
    return {d: days.count(d) for d in set(days)}


def test_db_retention_keeps_history_a_control_node_has_not_archived_and_compact_still_compacts(tmp_path):
    from wakustore.node.archive import ArchiveSettings, ControlState
    from wakustore.protocols.archive import Layout

    data, archives = tmp_path / "data", tmp_path / "archives"
    now = time.time_ns()
    # Two messages a day for 20 days, imported in two files: two files per day.
    for half in (0, 1):
        source = tmp_path / f"h{half}.jsonl"
        source.write_text(
            "".join(
                json.dumps(
                    {
                        "pubsub_topic": "/waku/2/rs/16/32",
                        "content_topic": "/db/1/old/proto",
                        "payload": (b"day-%d-%d" % (day, half)).hex(),
                        "timestamp": now - day * DAY - half,
                    }
                )
                + "\n"
                for day in range(20)
            )
        )
        result = wakustore("db", "import", "--data-dir", str(data), "--from-jsonl", str(source))
        assert result.returncode == 0, result.stderr
    assert max(_files_per_day(data).values()) >= 2

    compact = wakustore("db", "compact", "--data-dir", str(data))
    assert compact.returncode == 0, compact.stderr
    assert json.loads(compact.stdout)["days_rewritten"] >= 19
    today = time.strftime("%Y-%m-%d", time.gmtime(now / 1e9))
    assert all(files == 1 for day, files in _files_per_day(data).items() if day < today)

    # A control node whose seeded archives end 12 days and an hour ago.
    key = bytes(range(1, 33))
    (tmp_path / "key").write_text(key.hex())
    settings = ArchiveSettings(community_key=key, chat_ids=("",), archive_dir=archives)
    archives.mkdir()
    seeded_end_s = now // 10**9 - 12 * 86_400 - 3600
    ControlState(layout=Layout.STATUS_GO.value, last_end_s=seeded_end_s, seeded_end_s=seeded_end_s).save(
        settings.state_path
    )
    config = tmp_path / "node.toml"
    config.write_text(f'archive_key_file = "{tmp_path / "key"}"\narchive_dir = "{archives}"\n')

    retention = wakustore(
        "db", "retention", "--data-dir", str(data), "--config", str(config), "--policy", "time:432000"
    )  # 5 days: older history would go, were it archived
    assert retention.returncode == 0, retention.stderr
    result = json.loads(retention.stdout)
    keep_from = seeded_end_s * 10**9
    assert result["keep_from_ns"] == result["cutoff_ns"] == keep_from
    assert result["rows_before"] == 40
    assert result["rows_after"] == sum(2 for day in range(20) if now - day * DAY - 1 >= keep_from) == 26
    assert _table_rows(data) == 26


def test_export_of_an_empty_range_is_refused(tmp_path):
    out = str(tmp_path / "out.jsonl")
    result = wakustore("db", "export", "--data-dir", str(tmp_path), "--to-jsonl", out, "--start", "5", "--end", "1")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.strip() == (
        "wakustore: error: --start 5 is not before --end 1 (the range is start inclusive, end exclusive)"
    )


def test_db_sql_answers_queries_over_the_table_and_refuses_anything_else(loaded):
    base, _, _ = loaded
    data = str(base / "data")
    # What the table holds now (other tests of this module delete rows).
    by_topic = _table_counts(base, "content_topic")
    result = wakustore(
        "db",
        "sql",
        "--data-dir",
        data,
        "SELECT content_topic, count(*) AS n FROM messages GROUP BY content_topic ORDER BY content_topic",
    )
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert {r["content_topic"]: r["n"] for r in rows} == by_topic
    assert result.stderr.strip().splitlines()[-1] == f"{len(by_topic)} rows"
    limited = wakustore("db", "sql", "--data-dir", data, "--limit", "3", "SELECT message_hash FROM messages")
    hashes = [json.loads(line)["message_hash"] for line in limited.stdout.splitlines()]
    assert len(hashes) == 3 and all(len(h) == 64 for h in hashes)  # bytes as hex
    for query, reason in (
        ("DELETE FROM messages", "queries only"),
        ("DROP TABLE messages", "queries only"),
        ("SELECT nope FROM messages", "query failed:"),
    ):
        refused = wakustore("db", "sql", "--data-dir", data, query)
        lines = refused.stderr.strip().splitlines()
        assert refused.returncode == 2 and len(lines) == 1 and reason in lines[0], lines


def test_the_readme_reads_the_table_with_polars_duckdb_and_pyspark(loaded):
    """The README's "open dataset" block, run as written on a node's table."""
    import pathlib

    base, _, _ = loaded
    readme = (pathlib.Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme.split("## The history as an open dataset", 1)[1].split("\n## ", 1)[0]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    table = str(base / "data" / "tables" / "messages")
    assert '"./data/tables/messages"' in code
    scope: dict = {}
    exec(code.replace('"./data/tables/messages"', repr(table)), scope)  # noqa: S102 (the README's own code)
    # What the table holds now, read with delta-rs and pyarrow alone.
    rows = _table_columns(base)
    payload: dict[str, int] = {}
    for topic, body in zip(rows["pubsub_topic"], rows["payload"]):
        payload[topic] = payload.get(topic, 0) + len(body)
    totals = scope["per_day"].group_by("content_topic").sum().select("content_topic", "len").rows()
    assert dict(totals) == _table_counts(base, "content_topic")
    assert dict(scope["payload_bytes"]) == payload
    assert {row["pubsub_topic"]: row["count"] for row in scope["per_shard"]} == _table_counts(base, "pubsub_topic")


def test_an_export_that_finds_no_message_leaves_no_broken_archive_set(loaded, tmp_path):
    base, _, _ = loaded
    key = tmp_path / "community.key"
    key.write_text("11" * 32)
    archives = tmp_path / "archives"
    result = wakustore(
        "archive",
        "export",
        "--data-dir",
        str(base / "data"),
        "--community-key",
        str(key),
        "--chat-id",
        "general",
        "--archive-dir",
        str(archives),
    )
    assert result.returncode == 0, result.stderr
    assert "0 new archive(s), 0 messages" in result.stderr
    assert not list(archives.glob("*/data"))  # no empty data file without an index
    verified = wakustore("archive", "verify", str(archives))
    assert verified.stdout.strip() == f"{archives}: no archive set found"


def _table_columns(base) -> dict:
    from deltalake import DeltaTable

    return DeltaTable(str(base / "data" / "tables" / "messages")).to_pyarrow_table().to_pydict()


def _table_counts(base, column: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for value in _table_columns(base)[column]:
        counts[value] = counts.get(value, 0) + 1
    return counts
