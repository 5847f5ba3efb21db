"""The model-based crash test (bench/soak.py) in a bounded budget: a real
node in a child process, killed and restarted, compared page by page with
the reference model after every step."""

import re
import subprocess
import sys

import pytest

from wakustore.bench.soak import STEPS, Soak

pytestmark = pytest.mark.slow

# Every kind of step early, around pushes, then random steps.
SCHEDULE = [
    "push",
    "relay",
    "kill",
    "push",
    "kill_engine",
    "relay",
    "flush",
    "maintain",
    "push",
    "replace",
    "relay",
    "restart",
    "kill_mid_push",
    "push",
    "damage_log",
    "push",
    "kill",
]


def test_schedule_covers_every_kind_of_step():
    assert set(SCHEDULE) == set(STEPS)


@pytest.mark.parametrize("seed", [20261123])
def test_node_matches_the_model_through_kills_restarts_and_maintenance(tmp_path, seed):
    lines = []
    soak = Soak(tmp_path, seed, report=lines.append)
    totals = soak.run(max_steps=36, schedule=SCHEDULE)
    assert totals.mismatches == 0, lines
    assert totals.node_kills >= 2 and totals.engine_kills >= 1 and totals.maintenance >= 2
    assert totals.pushed > 100 and totals.pages > 100


def test_soak_command_prints_its_totals_last(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "wakustore",
            "soak",
            "--minutes",
            "0.5",
            "--seed",
            "7",
            "--work-dir",
            str(tmp_path / "soak"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.strip().splitlines()
    assert lines[0].startswith("soak: seed 7")
    assert re.fullmatch(r"soak: (\d+) steps, \d+ messages pushed, .* (\d+) pages compared, 0 mismatches", lines[-1])
    assert int(re.match(r"soak: (\d+) steps", lines[-1]).group(1)) >= 1


def test_soak_refuses_a_work_dir_with_a_node_in_it(tmp_path):
    (tmp_path / "node").mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "wakustore", "soak", "--minutes", "1", "--work-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1 and "exists" in done.stderr
