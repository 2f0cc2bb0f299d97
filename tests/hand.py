"""Hand-built plans for tests: the placements a test states, every other layer alone, and
the check that such a plan runs as predicted."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from fuseplan.planner.app import api
from fuseplan.planner.app.assemble import assemble, layer_placements
from fuseplan.planner.core.errors import InputError
from fuseplan.planner.cost.objective import Objective
from fuseplan.planner.plan.data import Plan
from fuseplan.planner.plan.placement import Placement
from fuseplan.planner.ui.cli import app


def hand_plan(problem: api.Problem, placements: Sequence[Placement]) -> Plan:
    """A plan of `placements`, every layer they do not cover alone (as the layer-by-layer
    planner places it), costed by the cost model."""
    g = problem.graph
    covered = {n for p in placements for n in p.layers}
    rest = [p for p in layer_placements(g, problem.chip) if not covered.intersection(p.layers)]
    return assemble(g, problem.chip, [*placements, *rest], **problem.plan_header(),
                    objective=Objective.TRAFFIC, solver={"name": "hand"})


def assert_verifies(problem: api.Problem, plan: Plan, seed: int = 3) -> None:
    """Outputs match onnxruntime, every counter the prediction, and nothing overflows."""
    report = api.verify_in_memory(problem, plan, seed=seed)
    assert report.outputs_match, report.first_output_mismatch
    assert report.predicted_matches_emulated, report.first_counter_mismatch
    assert not report.capacity_violations, [v.describe() for v in report.capacity_violations]


def assert_refused(model: str, doc: dict[str, Any], folder: Path, needle: str) -> None:
    """A plan file holding `doc` is refused by `verify` (exit 2, a message with `needle`)
    and by the API (InputError)."""
    bad_file = folder / "bad.json"
    bad_file.write_text(json.dumps(doc))
    refused = CliRunner().invoke(app, ["verify", model, str(bad_file)])
    assert refused.exit_code == 2, refused.output
    assert needle in " ".join(refused.output.split()), refused.output
    with pytest.raises(InputError):
        api.verify(model, bad_file)
