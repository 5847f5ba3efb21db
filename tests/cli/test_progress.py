"""Progress on stderr: a bar redrawn in place on a terminal, plain lines otherwise."""

import io
import json
import os
import pty
import subprocess
import sys
import time

from wakustore.cli.progress import PLAIN_EVERY_S, REDRAW_S, Progress, Stages


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_a_terminal_gets_one_redrawn_bar_throttled_and_a_final_line():
    out, clock = io.StringIO(), Clock()
    progress = Progress("importing", total=1000, unit="messages", stream=out, terminal=True, clock=clock)
    progress.set(100)
    for done in range(101, 200):  # within one redraw period: nothing more drawn
        progress.set(done)
    clock.now += REDRAW_S
    progress.set(500)
    progress.close()
    text = out.getvalue()
    frames = text.split("\r\x1b[K")[1:]
    assert len(frames) == 3  # first draw, one redraw, the final line
    assert "[" + "#" * 2 in frames[0] and " 10%" in frames[0] and "100/1,000 messages" in frames[0]
    assert "500/1,000 messages" in frames[1] and " 50%" in frames[1]
    assert frames[2].endswith("\n") and "\n" not in frames[0] + frames[1]
    assert "left" in frames[1]


def test_without_a_terminal_lines_are_plain_and_rare():
    out, clock = io.StringIO(), Clock()
    progress = Progress("staging", unit="messages", stream=out, terminal=False, clock=clock)
    for done in range(1, 10_001):
        progress.set(done)
        if done % 1000 == 0:
            clock.now += PLAIN_EVERY_S / 4
    progress.close()
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue() and "\x1b" not in out.getvalue()
    # one line per PLAIN_EVERY_S of the 25 s that passed, then the final one
    assert len(lines) == 2 + 1
    assert lines[0].startswith("staging 4,001 messages")
    assert lines[-1].startswith("staging 10,000 messages") and "elapsed" in lines[-1]


def test_a_note_goes_above_the_bar_and_the_bar_comes_back():
    out, clock = io.StringIO(), Clock()
    progress = Progress("fetching", total=10, stream=out, terminal=True, clock=clock)
    progress.set(3)
    progress.note("window 1..2: 40 messages")
    text = out.getvalue()
    redrawn = text.rsplit("\n", 1)[1]
    assert redrawn.startswith("fetching [") and "3/10" in redrawn
    assert "\r\x1b[Kwindow 1..2: 40 messages\n" in text
    progress.close("done")
    assert out.getvalue().endswith("\r\x1b[Kdone\n")


def test_a_failure_erases_the_bar_and_prints_no_final_line():
    out = io.StringIO()
    try:
        with Progress("x", total=3, stream=out, terminal=True) as progress:
            progress.set(1)
            raise ValueError("bad line")
    except ValueError:
        pass
    assert out.getvalue().endswith("\r\x1b[K") and "\n" not in out.getvalue()
    quiet = io.StringIO()
    try:
        with Progress("x", stream=quiet, terminal=False) as progress:
            progress.set(1)
            raise ValueError("bad line")
    except ValueError:
        pass
    assert quiet.getvalue() == ""


def test_close_is_idempotent_and_a_closed_progress_writes_nothing_more():
    out = io.StringIO()
    with Progress("x", stream=out, terminal=False) as progress:
        progress.advance(5)
    size = len(out.getvalue())
    progress.close()
    assert len(out.getvalue()) == size
    assert out.getvalue().splitlines()[-1].startswith("x 5,")


def test_db_import_draws_a_bar_on_a_terminal_and_plain_lines_in_a_pipe(tmp_path):
    now = time.time_ns()
    source = tmp_path / "in.jsonl"
    source.write_text(
        "".join(
            json.dumps(
                {
                    "pubsub_topic": "/waku/2/rs/16/32",
                    "content_topic": "/p/1/t/proto",
                    "payload": (b"%d" % i).hex(),
                    "timestamp": now - i,
                }
            )
            + "\n"
            for i in range(50)
        )
    )
    command = [sys.executable, "-m", "wakustore", "db", "import", "--from-jsonl", str(source)]
    leader, follower = pty.openpty()
    try:
        done = subprocess.run(
            [*command, "--data-dir", str(tmp_path / "a")],
            stdout=subprocess.PIPE,
            stderr=follower,
            timeout=300,
            check=False,
        )
        os.close(follower)
        follower = -1
        seen = b""
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the pty's far end is closed: all read
                break
            if not chunk:
                break
            seen += chunk
    finally:
        if follower != -1:
            os.close(follower)
        os.close(leader)
    assert done.returncode == 0, seen
    assert b"\r\x1b[Kstaging" in seen and b"staging 50 messages" in seen
    assert b"imported 50 messages: 50 new, 0 already stored" in seen

    piped = subprocess.run(
        [*command, "--data-dir", str(tmp_path / "b")], capture_output=True, text=True, timeout=300, check=False
    )
    assert piped.returncode == 0, piped.stderr
    assert "\r" not in piped.stderr and "\x1b" not in piped.stderr
    assert any(line.startswith("staging 50 messages") for line in piped.stderr.splitlines())


def test_stages_draw_one_bar_per_stage_and_keep_lines_above_it():
    out, clock = io.StringIO(), Clock()
    with Stages(stream=out, terminal=True, clock=clock) as stages:
        stages.line("index: 4 archive(s); fetching 4 in 2 window(s)")
        stages.count("pieces", 0, 8)
        clock.now += REDRAW_S
        stages.count("pieces", 8, 8)
        stages.count("windows imported", 0, 2)
        stages.line("window 1..2: 40 messages")
        clock.now += REDRAW_S
        stages.count("windows imported", 2, 2)
    finals = [line.rsplit("\r\x1b[K", 1)[-1] for line in out.getvalue().split("\n")]
    assert finals[0] == "index: 4 archive(s); fetching 4 in 2 window(s)"
    assert finals[1].startswith("pieces [") and "8/8 100%" in finals[1]  # the stage's bar, left complete
    assert finals[2] == "window 1..2: 40 messages"
    assert finals[3].startswith("windows imported [") and "2/2 100%" in finals[3]
    assert finals[4:] == [""]


def test_stages_without_a_terminal_give_one_line_per_stage_when_quick():
    out = io.StringIO()
    with Stages(stream=out, terminal=False) as stages:
        stages.count("pieces", 3, 8)
        stages.count("pieces", 8, 8)
        stages.line("window 1..2: 40 messages")
        stages.count("windows imported", 1, 1)
    lines = out.getvalue().splitlines()
    assert [line.split(",")[0] for line in lines] == [
        "window 1..2: 40 messages",
        "pieces 8/8 100%",
        "windows imported 1/1 100%",
    ]
