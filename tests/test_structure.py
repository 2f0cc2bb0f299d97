"""Structural memoization (solver.structure): groups with equal keys are the same tile
search, and repeated blocks get equal keys."""

from __future__ import annotations

from pathlib import Path

import pytest

from fuseplan.planner.app.api import plan_problem, prepare
from fuseplan.planner.cost.objective import Objective
from fuseplan.solver.groups import breaks_structure, is_connected
from fuseplan.solver.structure import structure_key
from fuseplan.solver.tiles import GroupSearch
from tests import models


@pytest.fixture(scope="module")
def problem(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    path = models.save(models.repeated_net(), tmp_path_factory.mktemp("structure"), "rep")
    # a small SRAM, so most groups need row tiles and halo reuse is searched
    return prepare(str(path), overrides=["sram.bytes=48KiB", "nram.bytes=16KiB"])


def _intervals(problem, most: int = 8):  # type: ignore[no-untyped-def]
    order = [lay.name for lay in problem.graph.layers]
    for i in range(len(order)):
        for j in range(i + 1, min(len(order), i + most) + 1):
            if is_connected(problem.graph, order[i:j]):
                yield tuple(order[i:j])


def test_equal_keys_are_equal_searches(problem) -> None:  # type: ignore[no-untyped-def]
    """Every two intervals with one key have the same best tile, cost and structural verdict
    when each is searched on its own."""
    g, chip, rs = problem.graph, problem.chip, problem.ruleset
    seen: dict[object, tuple[object, object]] = {}
    pairs = 0
    for layers in _intervals(problem):
        search = GroupSearch.of(g, layers, chip, rs)
        key = structure_key(g, search.io)
        found = (breaks_structure(search, rs), search.best(Objective.LATENCY))
        if key in seen:
            pairs += 1
            assert found == seen[key], layers
        seen[key] = found
    assert pairs >= 20  # the three identical bottlenecks repeat most intervals


def test_repeated_blocks_share_keys_and_others_do_not(problem) -> None:  # type: ignore[no-untyped-def]
    g = problem.graph
    blocks = [tuple(sorted(b.layers, key=g.index)) for b in g.blocks]
    assert len(blocks) == 4
    keys = [structure_key(g, GroupSearch.of(g, b, problem.chip, problem.ruleset).io)
            for b in blocks]
    assert keys[0] == keys[1] == keys[2]  # the identical bottlenecks
    assert keys[3] != keys[0]  # the strided one with its projection
    # a group ending inside a block is not the same problem as the whole block
    part = blocks[0][:-1]
    assert structure_key(g, GroupSearch.of(g, part, problem.chip, problem.ruleset).io) \
        != keys[0]


def test_plan_with_shared_searches_verifies(problem, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The shortest-path plan (its searches shared by structure) runs in the emulator with
    the predicted bytes."""
    from fuseplan.planner.app.api import verify
    from fuseplan.planner.plan.json_io import save_plan

    plan = plan_problem(problem, "shortest-path")
    path = tmp_path / "plan.json"
    save_plan(plan, path)
    report = verify(problem.model.path, path, overrides=["sram.bytes=48KiB",
                                                         "nram.bytes=16KiB"])
    assert report.ok, report
