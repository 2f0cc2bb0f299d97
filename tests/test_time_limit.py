"""--time-limit bounds the whole command (planner.core.budget): a plan cut short says what
was left out, reports its gap to the floor, and still verifies."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

from planner.core.budget import Budget

ROOT = Path(__file__).resolve().parents[1]
FUSEPLAN = ROOT / ".venv" / "bin" / "fuseplan"


def test_budget_phases_share_one_deadline_and_its_cuts() -> None:
    whole = Budget.of(60.0)
    phase = whole.less(59.999)
    assert not whole.passed and (phase.left() or 0) < 0.001
    time.sleep(0.002)
    assert phase.passed and not whole.passed
    phase.cut("groups left out")
    assert whole.cuts == ["groups left out"]  # what a phase cuts, the command reports
    unlimited = Budget.of(None)
    assert unlimited.left() is None and not unlimited.passed
    assert unlimited.less(10) is unlimited


def test_time_limit_bounds_the_command_and_the_plan_verifies(tmp_path: Path) -> None:
    """zoo:resnet50 takes about a minute to plan on 2 cores; with --time-limit 3 the
    command returns within the limit plus loading and writing, with a plan that says what
    it cut, its gap to the floor, and that runs in the emulator with the predicted bytes."""
    plan = tmp_path / "plan.json"
    started = time.perf_counter()
    proc = subprocess.run([str(FUSEPLAN), "solve", "zoo:resnet50", "--time-limit", "3",
                           "-o", str(plan), "--json"], capture_output=True, text=True,
                          check=False)
    wall = time.perf_counter() - started
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    info = doc["solver"]
    assert info["status"] == "FEASIBLE"
    assert "not searched" in info["stopped"]
    floor, moved = doc["totals"]["compulsory_dram_bytes"], doc["totals"]["dram_bytes"]
    assert info["bound"] == floor
    assert info["gap"] == round((moved - floor) / moved, 6) > 0
    assert wall < 20, wall  # a whole search takes ~60 s here; this allows a loaded CI host
    check = subprocess.run([str(FUSEPLAN), "verify", "zoo:resnet50", str(plan)],
                           capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "predicted bytes == emulated bytes: True" in check.stdout.replace("\n", " ")
