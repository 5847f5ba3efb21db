"""The README's shell examples, run as written through the real CLI and real HTTP.

Every block is read from README.md when the tests run, never copied here,
so a README change that breaks an example fails a test:

- the "Command line" synopsis: every command it names answers ``--help``
  (exit 0) listing every flag the README gives it, and ``--version`` works;
- the ``db sql`` example of "The history as an open dataset", run by a
  shell on a data dir holding a few imported messages (``./data`` replaced);
- the REST API's curl block, run by a shell with the real ``curl`` against
  one ``wakustore serve --rest`` (the host:port and the ``<...>``
  placeholders replaced by the node's port and values from its answers).
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import io
import itertools
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from wakustore.cli.main import main
from wakustore.node.config import NodeConfig
from wakustore.protocols.message import WakuMessage, message_hash

sys.path.insert(0, str(Path(__file__).parent))
from test_serve import ServeProcess  # noqa: E402

README = Path(__file__).resolve().parents[2] / "README.md"
# The virtualenv's bin/, where `wakustore` is: put first on the shell's PATH.
BIN = Path(sys.executable).parent
SHELL_TIMEOUT_S = 300
HTTP_TIMEOUT_S = 30
DAY_NS = 86_400 * 10**9
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
# The README's REST examples, as written, dial the node's default address.
README_REST = f"{NodeConfig().rest_address}:{NodeConfig().rest_port}"


# --- reading the README ------------------------------------------------------


def section(readme: str, heading: str) -> str:
    """The text under ``heading`` (a whole line) up to the next ``## `` heading."""
    parts = re.split(rf"^{re.escape(heading)}\n", readme, maxsplit=1, flags=re.M)
    assert len(parts) == 2, f"README has no {heading!r} section"
    return re.split(r"^## ", parts[1], maxsplit=1, flags=re.M)[0]


def shell_blocks(text: str) -> list[str]:
    """The bodies of the fenced shell blocks (sh, bash, shell) of ``text``."""
    return re.findall(r"^```(?:sh|bash|shell)\n(.*?)^```", text, flags=re.M | re.S)


def shell_block(readme: str, heading: str, containing: str) -> str:
    blocks = [b for b in shell_blocks(section(readme, heading)) if containing in b]
    assert len(blocks) == 1, f"README's {heading!r}: {len(blocks)} shell blocks with {containing!r}, expected 1"
    return blocks[0]


def _strip_comment(line: str) -> str:
    """``line`` without a shell comment (a ``#`` at a word's start, outside quotes)."""
    quote = None
    for i, char in enumerate(line):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


def commands(block: str) -> list[str]:
    """The commands of a shell block: continuation lines joined, comments
    and blank lines dropped."""
    joined = re.sub(r"\\\n", " ", block)
    return [c for c in (_strip_comment(line).strip() for line in joined.splitlines()) if c]


def synopsis(readme: str) -> dict[tuple[str, ...], set[str]]:
    """{command path: flags} of the "Command line" block. The command's
    words are the lowercase ones after ``wakustore`` (``a|b`` stands for
    both); the flags are every ``--flag`` of the line."""
    block = shell_block(readme, "## Command line", "wakustore serve")
    flags: dict[tuple[str, ...], set[str]] = {}
    for line in commands(block):
        words = line.split()
        assert words[0] == "wakustore", f"not a wakustore command in the synopsis: {line}"
        names = list(itertools.takewhile(lambda w: re.fullmatch(r"[a-z][a-z0-9-]*(\|[a-z][a-z0-9-]*)*", w), words[1:]))
        for path in itertools.product(*(name.split("|") for name in names)):
            flags.setdefault(path, set()).update(FLAG.findall(line))
    return flags


# --- the command line, in process --------------------------------------------


def run_cli(*argv: str) -> tuple[object, str, str]:
    """(exit status, stdout, stderr) of ``wakustore ARGV`` run by the console
    entry point's own function, in this process."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status: object = main(list(argv))
        except SystemExit as exc:  # --help and --version exit through argparse
            status = exc.code
    return status, out.getvalue(), err.getvalue()


def synopsis_problems(readme: str) -> list[str]:
    """One line per README command whose ``--help`` fails or lacks a flag the README gives it."""
    problems = []
    for path, flags in sorted(synopsis(readme).items()):
        command = " ".join(("wakustore", *path))
        status, out, err = run_cli(*path, "--help")
        if status != 0:
            problems.append(f"`{command} --help` exits {status}: {err.strip()[-300:]}")
            continue
        listed = set(FLAG.findall(out))
        problems += [
            f"`{command}` does not accept {flag}, which the README gives it" for flag in sorted(flags - listed)
        ]
    return problems


def test_every_command_of_the_synopsis_lists_every_flag_the_readme_gives_it():
    commands_found = synopsis(README.read_text())
    # serve, query, push, mailserver, message, topic, enr, db, archive, bench, soak and their verbs
    assert len(commands_found) >= 25, sorted(commands_found)
    assert {("db", "sql"), ("archive", "fetch"), ("bench", "wire"), ("soak",)} <= commands_found.keys()
    problems = synopsis_problems(README.read_text())
    assert not problems, "\n".join(problems)


def test_the_synopsis_check_names_the_command_and_the_flag_that_is_wrong():
    readme = README.read_text()
    block = shell_block(readme, "## Command line", "wakustore serve")
    assert "wakustore db import --data-dir DIR --from-jsonl FILE\n" in block
    wrong = readme.replace(
        "wakustore db import --data-dir DIR --from-jsonl FILE\n",
        "wakustore db import --data-dir DIR --from-json FILE\n",
    ).replace("wakustore topic magnet --pubkey HEX\n", "wakustore topic magnets --pubkey HEX\n")
    problems = synopsis_problems(wrong)
    assert len(problems) == 2, problems
    assert problems[0] == "`wakustore db import` does not accept --from-json, which the README gives it"
    assert problems[1].startswith("`wakustore topic magnets --help` exits 2: ") and "magnets" in problems[1]


def test_version_exits_0():
    result = subprocess.run([BIN / "wakustore", "--version"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("wakustore ")


# --- a data dir holding a few messages -----------------------------------------


def shell(command: str, **kwargs) -> subprocess.CompletedProcess:
    """``command`` run by bash, the virtualenv's ``wakustore`` first on the PATH."""
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "NO_PROXY": "127.0.0.1,localhost"}
    env.pop("no_proxy", None)
    return subprocess.run(
        ["bash", "-c", command], capture_output=True, text=True, env=env, timeout=SHELL_TIMEOUT_S, **kwargs
    )


def _post_example(readme: str) -> dict:
    """The JSON body of the README's lightpush POST example."""
    (post,) = [c for c in rest_commands(readme) if " POST " in f" {c} "]
    words = shlex.split(post)
    return json.loads(words[words.index("-d") + 1])


def rest_commands(readme: str) -> list[str]:
    return commands(shell_block(readme, "## REST API", "curl "))


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """A data dir filled by ``wakustore db import``: 60 messages on the
    README's pubsub and content topics (more than its page of 50, so that a
    page has a cursor), and others on other topics, over three days.
    (data dir, [(pubsub topic, message)])."""
    body = _post_example(README.read_text())
    pubsub, content = body["pubsubTopic"], body["message"]["contentTopic"]
    base = tmp_path_factory.mktemp("readme")
    now = time.time_ns()
    stored = []
    for i in range(72):
        topics = (pubsub, content) if i < 60 else (pubsub, "/readme/1/other/proto") if i < 68 else ("/x/1", content)
        message = WakuMessage(
            payload=b"readme-%d" % i,
            content_topic=topics[1],
            timestamp=now - (i % 3) * DAY_NS - (i + 1) * 10**9,
            meta=b"",
        )
        stored.append((topics[0], message))
    source = base / "messages.jsonl"
    source.write_text(
        "".join(
            json.dumps(
                {
                    "pubsub_topic": topic,
                    "content_topic": m.content_topic,
                    "payload": m.payload.hex(),
                    "timestamp": m.timestamp,
                }
            )
            + "\n"
            for topic, m in stored
        )
    )
    data_dir = base / "data"
    result = subprocess.run(
        [BIN / "wakustore", "db", "import", "--data-dir", data_dir, "--from-jsonl", source],
        capture_output=True,
        text=True,
        timeout=SHELL_TIMEOUT_S,
    )
    assert result.returncode == 0, result.stderr
    assert (
        result.stderr.strip().splitlines()[-1]
        == f"imported {len(stored)} messages: {len(stored)} new, 0 already stored"
    )
    return data_dir, stored


@pytest.fixture(scope="module")
def sql_answer(dataset):
    """The README's ``db sql`` block run by a shell on the dataset, before
    the node adds a message to it."""
    data_dir, _ = dataset
    block = shell_block(README.read_text(), "## The history as an open dataset", "wakustore db sql")
    assert "--data-dir ./data " in block, block
    return shell(block.replace("./data", shlex.quote(str(data_dir))))


@pytest.mark.slow
def test_the_db_sql_example_counts_what_was_stored(dataset, sql_answer):
    _, stored = dataset
    assert sql_answer.returncode == 0, sql_answer.stderr
    rows = [json.loads(line) for line in sql_answer.stdout.splitlines()]
    assert rows and all(isinstance(row, dict) for row in rows)
    expected: dict[tuple[str, str], int] = {}
    for _, m in stored:
        day = dt.datetime.fromtimestamp(m.timestamp // 10**9, dt.UTC).date().isoformat()
        expected[(m.content_topic, day)] = expected.get((m.content_topic, day), 0) + 1
    assert {(r["content_topic"], r["day"]): r["messages"] for r in rows} == expected
    assert len(rows) == len(expected)
    assert [r["day"] for r in rows] == sorted(r["day"] for r in rows)  # ORDER BY day
    assert sql_answer.stderr.strip().splitlines()[-1] == f"{len(rows)} rows"


# --- the REST API --------------------------------------------------------------


@pytest.fixture(scope="module")
def rest_node(dataset, sql_answer):
    """``wakustore serve --rest`` on the dataset, every port from the kernel,
    on the default cluster and shards (those the README's examples use).
    Started after the db sql example has read the table. The REST API's
    base URL, ``http://host:port``."""
    data_dir, _ = dataset
    defaults = NodeConfig()
    shards = [v for shard in defaults.shards for v in ("--shard", str(shard))]
    server = ServeProcess(data_dir, "--rest", "--rest-port", "0", "--cluster-id", str(defaults.cluster_id), *shards)
    try:
        printed = server.wait_ready()
        (line,) = [line for line in printed if line.startswith("REST API on ")]
        match = re.fullmatch(r"REST API on (http://127\.0\.0\.1:(\d+))/", line)
        assert match, line
        assert json.loads((data_dir / "node-info.json").read_text())["rest_port"] == int(match[2])
        yield match[1]
    finally:
        if server.proc.poll() is None:
            server.proc.send_signal(signal.SIGTERM)
            try:
                server.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                server.proc.kill()
                server.proc.wait()


def _urllib_curl(command: str) -> str:
    """What ``curl -s [-X METHOD] [-H HEADER] [-d BODY] URL`` prints, by
    urllib: the answer's body, whatever its status."""
    words = shlex.split(command)
    assert words[0] == "curl", command
    method, headers, data, url = None, {}, None, None
    options = iter(words[1:])
    for word in options:
        if word == "-s":
            continue
        if word == "-X":
            method = next(options)
        elif word == "-H":
            name, _, value = next(options).partition(":")
            headers[name.strip()] = value.strip()
        elif word == "-d":
            data = next(options).encode()
        elif not word.startswith("-") and url is None:
            url = word
        else:
            raise AssertionError(f"{word!r} of {command!r}: not one this test can run without curl")
    request = urllib.request.Request(url, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S) as response:
            return response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.read().decode()


def run_curl(command: str, base: str) -> dict:
    """``command`` with the README's host:port replaced by ``base``'s, run by
    a shell with the real curl (urllib when there is none); its answer, JSON."""
    assert f"http://{README_REST}/" in command, f"the README's example does not dial {README_REST}: {command}"
    command = command.replace(f"http://{README_REST}", base)
    if shutil.which("curl"):
        result = shell(command)
        assert result.returncode == 0, f"{command}: exit {result.returncode}, {result.stderr}"
        text = result.stdout
    else:
        text = _urllib_curl(command)
    try:
        return json.loads(text)
    except ValueError:
        raise AssertionError(f"{command}: answered {text!r}, not JSON") from None


def _fill(command: str, placeholder: str, values: list[str]) -> str:
    """``command`` with each ``<placeholder>`` replaced by the hex digits of
    the next of ``values`` (answers' ``0x`` hex; the README writes the ``0x``)."""
    assert command.count(f"<{placeholder}>") == len(values), (command, values)
    for value in values:
        assert re.fullmatch(r"0x[0-9a-f]{64}", value), value
    digits = iter(value[2:] for value in values)
    return re.sub(re.escape(f"<{placeholder}>"), lambda _: next(digits), command)


def _page_size(command: str) -> int:
    """The page a store example asks for: its ``pageSize`` (20 without one), at most 100."""
    match = re.search(r"[?&]pageSize=(\d+)", command)
    return min(int(match[1]) if match else 20, 100)


@pytest.mark.slow
def test_the_rest_examples_post_page_and_check_presence(dataset, rest_node):
    _, stored = dataset
    examples = rest_commands(README.read_text())
    post = [c for c in examples if " POST " in f" {c} "]
    cursor = [c for c in examples if "<paginationCursor>" in c]
    presence = [c for c in examples if "<hash>" in c]
    page = [c for c in examples if c not in post + cursor + presence]
    assert [len(post), len(page), len(cursor), len(presence)] == [1, 1, 1, 1], examples
    assert all(c.startswith("curl ") for c in examples), examples
    body = _post_example(README.read_text())
    pubsub, content = body["pubsubTopic"], body["message"]["contentTopic"]
    imported = {
        "0x" + message_hash(topic, m).hex() for topic, m in stored if (topic, m.content_topic) == (pubsub, content)
    }
    size = _page_size(page[0])
    assert size < len(imported), f"the dataset holds no more than a page of {size}: add messages"

    # Post a message: success is {relayPeerCount} (no relay peer here: 0, still stored).
    answer = run_curl(post[0], rest_node)
    assert answer == {"relayPeerCount": 0}, answer

    # Page through the content topic: a full page, with the data, and its cursor.
    first = run_curl(page[0], rest_node)
    assert first["statusCode"] == 200, first
    assert len(first["messages"]) == size and all("message" in e for e in first["messages"]), first
    assert "paginationCursor" in first, first
    # The next pages, each from the cursor of the one before.
    walked = [e["messageHash"] for e in first["messages"]]
    answer = first
    while "paginationCursor" in answer:
        assert len(walked) <= len(imported), f"the cursor example does not move on: {cursor[0]}"
        answer = run_curl(_fill(cursor[0], "paginationCursor", [answer["paginationCursor"]]), rest_node)
        assert answer["statusCode"] == 200 and answer["messages"], answer
        walked += [e["messageHash"] for e in answer["messages"]]
    # The walk holds the imported messages of the topic and one more: the posted one.
    assert len(walked) == len(set(walked)) == len(imported) + 1, walked
    (posted,) = set(walked) - imported
    assert set(walked) - {posted} == imported

    # Which of these messages are stored: the posted one and imported ones.
    others = [e["messageHash"] for e in first["messages"]]
    asked = [posted, *others][: presence[0].count("<hash>")]
    found = run_curl(_fill(presence[0], "hash", asked), rest_node)
    assert found["statusCode"] == 200, found
    assert sorted(e["messageHash"] for e in found["messages"]) == sorted(asked), found

    # The posted message is the README's: its payload and topics (asked by hash, with its data).
    with urllib.request.urlopen(
        f"{rest_node}/store/v3/messages?hashes={posted}&includeData=true", timeout=HTTP_TIMEOUT_S
    ) as response:
        (entry,) = json.loads(response.read())["messages"]
    assert entry["pubsubTopic"] == pubsub
    assert entry["message"]["contentTopic"] == content
    assert base64.b64decode(entry["message"]["payload"]) == base64.b64decode(body["message"]["payload"])
