"""The soak with power cuts (powercut.py) in a bounded budget: the node's
data dir on crashfs, every kill a power cut, each acknowledged message
present exactly once after every restart, none that retention or a
window replace removed coming back, and the table whole for delta-rs and
for the engine at the end."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from powercut import PowerCut  # noqa: E402

from wakustore.bench.soak import STEPS  # noqa: E402

pytestmark = pytest.mark.slow

# Every kind of step early (kills are cuts), around pushes.
SCHEDULE = [
    "push",
    "kill",
    "push",
    "relay",
    "kill_mid_push",
    "push",
    "maintain",
    "push",
    "kill",
    "replace",
    "push",
    "damage_log",
    "push",
    "kill_engine",
    "flush",
    "kill",
    "restart",
    "push",
    "kill_mid_push",
]


def test_schedule_covers_every_kind_of_step():
    assert set(SCHEDULE) == set(STEPS)


def test_acknowledged_messages_survive_power_cuts_exactly_once(tmp_path):
    lines: list[str] = []
    run = PowerCut(tmp_path, seed=20261128, report=lines.append)
    totals = run.run(max_steps=30, schedule=SCHEDULE)
    assert totals.mismatches == 0, lines
    cuts = run.cuts
    assert cuts.cuts >= 5 and cuts.lost == cuts.twice == cuts.revived == 0
    # The cuts threw work away: unsynced writes or names were dropped.
    assert cuts.writes_lost + cuts.names_lost > 0
    assert totals.pushed > 100 and totals.maintenance >= 2
    assert run.tables_verified == len(run.model.rows) > 0


def test_make_powercut_prints_its_totals_last(tmp_path):
    done = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("powercut.py")), "--minutes", "0.4", "--seed", "11"]
        + ["--work-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    last = done.stdout.strip().splitlines()[-1]
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert re.fullmatch(
        r"powercut: \d+ steps, \d+ cuts \(\d+ during a retention or a window replace, \d+ torn logs repaired\), \d+ acknowledged messages kept \(\d+ pushed\), 0 lost, "
        r"0 served twice, 0 revived; .* 0 mismatches; the table read whole by delta-rs and the engine \(\d+ rows\)",
        last,
    ), last
