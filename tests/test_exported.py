"""Real-export style models (opsets 9-17, dynamic dims) plan and verify end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fuseplan.planner.app import api
from fuseplan.planner.geometry.regions import group_io, tile_count
from fuseplan.planner.plan.json_io import save_plan

import models


@pytest.mark.parametrize("opset", [9, 11, 13, 14, 17])
@pytest.mark.parametrize("solver", ["cpsat", "greedy"])
def test_exported_net_plans_and_verifies(tmp_path: Path, opset: int, solver: str) -> None:
    path = models.save(models.exported_net(opset), tmp_path, f"net{opset}")
    shapes = {"images": (2, 3, 48, 64)}
    # a small SRAM forces several tiles per group, so halos and tile pads are exercised
    plan = api.solve(str(path), shapes=shapes, solver=solver, overrides=["sram.bytes=160KiB"])
    assert sum(1 for g in plan.groups if g.fused) >= 1, "nothing fused on an SRAM-bound chip"
    plan_file = tmp_path / "plan.json"
    save_plan(plan, plan_file)
    assert json.loads(plan_file.read_text())["model"]["inputs"] == {"images": [2, 3, 48, 64]}
    report = api.verify(str(path), plan_file, seed=3)
    assert report.outputs_match, report.first_output_mismatch
    assert report.predicted_matches_emulated, report.first_counter_mismatch
    assert not report.capacity_violations, [v.describe() for v in report.capacity_violations]
    # the halos and pads ran: a fused group in several tiles (with block groups the whole
    # net may be one group, so only its output crosses DRAM to be checked)
    graph = api.prepare(str(path), shapes=shapes).graph
    assert any(g.fused and tile_count(graph, group_io(graph, g.layers), g.tile) > 1
               for g in plan.groups), [(len(g.layers), g.tile) for g in plan.groups]
    assert report.checked_tensors >= min(2, len(plan.groups))
