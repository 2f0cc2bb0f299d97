"""fuseplan: a layer-fusion planner for neural-network accelerators, as a Python library.

The ``fuseplan`` command line is a thin shell over these functions. A model is an ``.onnx``
path or ``"zoo:NAME"``; rules and hardware are YAML paths or preset names (``None`` for
``rules/default.yaml`` and the default chip)::

    from pathlib import Path

    import fuseplan

    plan = fuseplan.solve("model.onnx", rules="rules/default.yaml", hardware="cluster4x4")
    print(len(plan.groups), plan.totals.dram_bytes, plan.compulsory_dram_bytes)
    fuseplan.save_plan(plan, Path("plan.json"))

    report = fuseplan.verify("model.onnx", "plan.json")       # emulator vs onnxruntime
    assert report.ok, report.first_counter_mismatch
    why = fuseplan.explain("model.onnx", "plan.json")         # what bound each boundary

    # one problem, several planners or objectives
    problem = fuseplan.prepare("zoo:squeezenet", hardware="frustum_npu",
                               overrides=["sram.bytes=512KiB"])
    greedy = fuseplan.plan_problem(problem, solver="greedy")
    fastest = fuseplan.plan_problem(problem, objective=fuseplan.Objective.LATENCY)
    rows = fuseplan.compare(problem)                          # [(solver, plan, status), ...]

    # what users see
    fuseplan.write_report(problem, greedy, "report.html", verify=True)
    fuseplan.export_onnx(problem, greedy, "annotated.onnx")  # open in Netron
    changes = fuseplan.diff_plans(greedy, fuseplan.plan_problem(problem))

Errors: :class:`InputError` for bad input (the CLI's exit code 2) and :class:`PlanningError`
when the answer is "no" (exit code 1).
"""

from __future__ import annotations

from hardware.chip import Chip, load_chip
from planner.app.api import (
    Problem,
    compare,
    explain,
    inspect,
    plan_problem,
    prepare,
    solve,
    verify,
)
from planner.core.errors import InputError, PlanningError
from planner.cost.model import Counters
from planner.cost.objective import Objective
from planner.plan.data import Group, Plan
from planner.plan.json_io import load_plan, plan_to_json, save_plan
from planner.plan.placement import HaloMode, Placement, WeightResidency
from planner.ui.diff import diff_plans
from planner.ui.export import export_dot, export_onnx
from planner.ui.report import load_problem_plan, render_report, write_report
from rules.ruleset import RuleSet, load_rules

__all__ = [
    "Chip",
    "Counters",
    "Group",
    "HaloMode",
    "InputError",
    "Objective",
    "Placement",
    "Plan",
    "PlanningError",
    "Problem",
    "RuleSet",
    "WeightResidency",
    "compare",
    "diff_plans",
    "explain",
    "export_dot",
    "export_onnx",
    "inspect",
    "load_chip",
    "load_plan",
    "load_problem_plan",
    "load_rules",
    "plan_problem",
    "plan_to_json",
    "prepare",
    "render_report",
    "save_plan",
    "solve",
    "verify",
    "write_report",
]
