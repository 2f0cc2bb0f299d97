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

import importlib
from typing import TYPE_CHECKING, Any

# The package's own modules (fuseplan.planner..., fuseplan.rules..., the console script)
# import this package first: the facade's names load on first use, so that importing one
# module does not import the whole planner (the command line starts on a light import).
_WHERE = {
    "Chip": "fuseplan.hardware.chip",
    "load_chip": "fuseplan.hardware.chip",
    "Problem": "fuseplan.planner.app.api",
    "compare": "fuseplan.planner.app.api",
    "explain": "fuseplan.planner.app.api",
    "inspect": "fuseplan.planner.app.api",
    "plan_problem": "fuseplan.planner.app.api",
    "prepare": "fuseplan.planner.app.api",
    "solve": "fuseplan.planner.app.api",
    "verify": "fuseplan.planner.app.api",
    "InputError": "fuseplan.planner.core.errors",
    "PlanningError": "fuseplan.planner.core.errors",
    "Counters": "fuseplan.planner.cost.model",
    "Objective": "fuseplan.planner.cost.objective",
    "Group": "fuseplan.planner.plan.data",
    "Plan": "fuseplan.planner.plan.data",
    "load_plan": "fuseplan.planner.plan.json_io",
    "plan_to_json": "fuseplan.planner.plan.json_io",
    "save_plan": "fuseplan.planner.plan.json_io",
    "HaloMode": "fuseplan.planner.plan.placement",
    "Placement": "fuseplan.planner.plan.placement",
    "WeightResidency": "fuseplan.planner.plan.placement",
    "diff_plans": "fuseplan.planner.ui.diff",
    "export_dot": "fuseplan.planner.ui.export",
    "export_onnx": "fuseplan.planner.ui.export",
    "load_problem_plan": "fuseplan.planner.ui.report",
    "render_report": "fuseplan.planner.ui.report",
    "write_report": "fuseplan.planner.ui.report",
    "RuleSet": "fuseplan.rules.ruleset",
    "load_rules": "fuseplan.rules.ruleset",
}

if TYPE_CHECKING:
    from fuseplan.hardware.chip import Chip, load_chip
    from fuseplan.planner.app.api import (
        Problem,
        compare,
        explain,
        inspect,
        plan_problem,
        prepare,
        solve,
        verify,
    )
    from fuseplan.planner.core.errors import InputError, PlanningError
    from fuseplan.planner.cost.model import Counters
    from fuseplan.planner.cost.objective import Objective
    from fuseplan.planner.plan.data import Group, Plan
    from fuseplan.planner.plan.json_io import load_plan, plan_to_json, save_plan
    from fuseplan.planner.plan.placement import HaloMode, Placement, WeightResidency
    from fuseplan.planner.ui.diff import diff_plans
    from fuseplan.planner.ui.export import export_dot, export_onnx
    from fuseplan.planner.ui.report import load_problem_plan, render_report, write_report
    from fuseplan.rules.ruleset import RuleSet, load_rules


def __getattr__(name: str) -> Any:
    """A facade name, imported from its module on first use (PEP 562); ``__version__``, the
    installed package's version (``fuseplan --version`` prints it)."""
    if name == "__version__":
        from importlib.metadata import version

        return version("fuseplan")
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'fuseplan' has no attribute {name!r}")
    value = getattr(importlib.import_module(where), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


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
