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
        out.append({
            "pubsub_topic": f"/waku/2/rs/16/{32 + i % 2}",
            "content_topic": f"/db/1/t{i % 3}/proto",
            "payload": (b"payload-%d" % i).hex(),
            "meta": "" if i % 4 else "ab" * (i % 7),
            "timestamp": now - (i % 40) * DAY // 4 - i,
            "version": i % 2,
        })
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
    assert "imported 600 messages (300 new)" in result.stderr
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
    result = wakustore("db", "export", "--data-dir", str(base / "data"), "--to-jsonl", str(out),
                       "--pubsub-topic", "/waku/2/rs/16/32", "--content-topic", "/db/1/t0/proto",
                       "--content-topic", "/db/1/t1/proto", "--start", str(start), "--end", str(end))
    assert result.returncode == 0, result.stderr
    got = sorted(json.loads(line)["payload"] for line in out.read_text().splitlines())
    want = sorted(m["payload"] for m in messages
                  if m["pubsub_topic"] == "/waku/2/rs/16/32" and m["content_topic"] in ("/db/1/t0/proto", "/db/1/t1/proto")
                  and start <= m["timestamp"] < end)
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
        ('{"pubsub_topic": "/p", "content_topic": "/c", "payload": "zz"}\n', "line 1"),
        ("not json\n", "line 1: invalid JSON"),
        ('{"content_topic": "/c"}\n', "line 1"),
    ],
)
def test_bad_import_lines_are_one_line_errors(tmp_path, content, message):
    source = tmp_path / "bad.jsonl"
    source.write_text(content)
    result = wakustore("db", "import", "--data-dir", str(tmp_path / "d"), "--from-jsonl", str(source))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith("wakustore: error: " + message)


def test_bad_policy_and_missing_file_are_usage_errors(tmp_path):
    result = wakustore("db", "import", "--data-dir", str(tmp_path), "--from-jsonl", str(tmp_path / "nope"))
    assert result.returncode == 2 and "no such file" in result.stderr
    result = wakustore("db", "retention", "--data-dir", str(tmp_path), "--policy", "forever")
    assert result.returncode == 2 and result.stderr.startswith("wakustore: error: ")
