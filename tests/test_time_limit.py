"""--time-limit bounds the whole command (planner.core.budget): a plan cut short says what
was left out, reports its gap to the floor, and still verifies."""

from __future__ import annotations

import json
import resource
import subprocess
import time
from pathlib import Path

from fuseplan.planner.core.budget import Budget

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
    """zoo:resnet50 with every candidate group searched (no floors to spare any) takes some
    25 CPU seconds to plan; with --time-limit 5 the command stops searching at the limit
    and returns a plan that says what it cut, its gap to the floor, and that runs in the
    emulator with the predicted bytes. The command's CPU time, not its wall time, shows
    the search was cut: a loaded machine gives the command less CPU before the limit, never
    more, so the bound holds whatever else runs."""
    rules = tmp_path / "rules.yaml"
    rules.write_text((ROOT / "rules" / "default.yaml").read_text()
                     .replace("prune_by_floor: true", "prune_by_floor: false"))
    plan = tmp_path / "plan.json"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run([str(FUSEPLAN), "solve", "zoo:resnet50", "--rules", str(rules),
                           "--time-limit", "5", "-o", str(plan), "--json"],
                          capture_output=True, text=True, check=False, timeout=300)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    info = doc["solver"]
    assert info["status"] == "FEASIBLE"
    assert "not searched" in info["stopped"]
    floor, moved = doc["totals"]["compulsory_dram_bytes"], doc["totals"]["dram_bytes"]
    assert info["bound"] == floor
    assert info["gap"] == round((moved - floor) / moved, 6) > 0
    assert cpu < 16, cpu  # loading, the limit and the quick single-layer tiles: ~8 s here
    check = subprocess.run([str(FUSEPLAN), "verify", "zoo:resnet50", str(plan)],
                           capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "predicted bytes == emulated bytes: True" in check.stdout.replace("\n", " ")


def test_time_limit_bounds_the_import_too(tmp_path: Path) -> None:
    """A model whose import alone outlasts --time-limit (the limit runs from the process's
    start: 0.1 s has passed before the model is read) has no partial answer: inspect and
    solve stop at the next step of the import, exit 1 and name the step and the fix (with
    --json, one JSON document); solve writes no plan file. With room to import, inspect
    answers as without a limit."""
    plan = tmp_path / "plan.json"
    for cmd in (["inspect", "zoo:squeezenet"], ["solve", "zoo:squeezenet", "-o", str(plan)]):
        proc = subprocess.run([str(FUSEPLAN), *cmd, "--time-limit", "0.1", "--json"],
                              capture_output=True, text=True, check=False, timeout=120)
        assert proc.returncode == 1, proc.stderr
        doc = json.loads(proc.stdout)
        assert doc["exit"] == 1 and doc["error"]["kind"] == "no"
        message = doc["error"]["message"]
        assert message.startswith("the time limit of 0.1 s had run out by the end of reading "
                                  "the file of zoo:squeezenet"), message
        assert "(--time-limit)" in doc["error"]["fix"]
        assert "Traceback" not in proc.stderr and "time limit: " in proc.stderr
    assert not plan.exists()
    timed = subprocess.run([str(FUSEPLAN), "inspect", "zoo:squeezenet", "--time-limit", "60",
                            "--json"], capture_output=True, text=True, check=True, timeout=120)
    free = subprocess.run([str(FUSEPLAN), "inspect", "zoo:squeezenet", "--json"],
                          capture_output=True, text=True, check=True, timeout=120)
    assert json.loads(timed.stdout) == json.loads(free.stdout)
