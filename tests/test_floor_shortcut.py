"""The floor shortcut (planner.app.planning.floor_whole_network): under the traffic
objective, a network whose one group moves the compulsory floor (tiled, weights streamed,
or in hidden chunks: where the whole-network shortcut of seed 004 does not apply) is
planned as that group without weighing any other, and the plan is the one the full search
finds, verified in the emulator."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fuseplan.planner.app.api import Problem, plan_problem, prepare, verify
from fuseplan.planner.app.planning import FLOOR_PROOF, floor_whole_network, whole_network
from fuseplan.planner.cost.model import compulsory_bytes
from fuseplan.planner.plan.json_io import save_plan
from fuseplan.solver.tiles import GroupSearch
from tests import models
from tests.test_rules import with_rules

# (builder, its arguments, chip overrides): one group at the floor, each in a mode seed
# 004's shortcut (whole maps, weights resident) does not take
AT_FLOOR = {
    "tiled": ("llama_attention", {"tokens": 256}, ["nram.bytes=64KiB"]),
    "streamed": ("llama_attention", {"tokens": 256}, ["wram.bytes=8KiB"]),
    "two_blocks_streamed": ("causal_encoder", {"tokens": 128, "width": 128, "heads": 2,
                                               "blocks": 2}, ["wram.bytes=16KiB"]),
}


def _problem(tmp: Path, builder: str, kwargs: dict[str, int], overrides: list[str]
             ) -> tuple[Path, Problem]:
    path = models.save(getattr(models, builder)(**kwargs), tmp, builder)
    return path, prepare(str(path), overrides=overrides)


def _searched(problem: Problem) -> Problem:
    """The problem with both shortcuts off: every candidate group weighed."""
    return with_rules(problem, search={"whole_network_first": False})


@pytest.mark.parametrize("case", list(AT_FLOOR))
def test_a_network_at_its_floor_is_one_group_the_search_agrees_and_it_verifies(
        tmp_path: Path, case: str) -> None:
    builder, kwargs, overrides = AT_FLOOR[case]
    path, problem = _problem(tmp_path, builder, kwargs, overrides)
    assert whole_network(problem, deep=True) is None  # not seed 004's case
    plan = plan_problem(problem, "cpsat")
    assert plan.solver["solved_by"] == FLOOR_PROOF and plan.solver["status"] == "OPTIMAL"
    assert plan.solver["bound"] == plan.solver["objective"] == plan.compulsory_dram_bytes
    assert len(plan.groups) == 1 and plan.totals.dram_bytes == plan.compulsory_dram_bytes
    searched = plan_problem(_searched(problem), "cpsat")
    assert searched.totals.dram_bytes == plan.totals.dram_bytes
    assert [g.layers for g in searched.groups] == [g.layers for g in plan.groups]
    assert searched.groups[0].tile == plan.groups[0].tile
    saved = tmp_path / "plan.json"
    save_plan(plan, saved)
    report = verify(str(path), saved)
    assert report.outputs_match, report.first_output_mismatch
    assert report.predicted_matches_emulated, report.first_counter_mismatch
    assert report.emulated.dram_bytes == plan.compulsory_dram_bytes


def test_a_network_above_its_floor_is_searched(tmp_path: Path) -> None:
    """Where the whole network fits one group only above the floor (64 KiB of NRAM: 68-token
    tiles, and 4 KiB of WRAM: weights streamed again for each, not even a cluster's share
    of them beside the rotary tables fitting), the shortcut gives nothing and the planners
    search as before."""
    _, problem = _problem(tmp_path, "llama_attention", {"tokens": 256},
                          ["nram.bytes=64KiB", "wram.bytes=4KiB"])
    layers = tuple(lay.name for lay in problem.graph.layers)
    one = GroupSearch.of(problem.graph, layers, problem.chip, problem.ruleset).best()
    assert one is not None and one.cost.dram_bytes > compulsory_bytes(problem.graph, problem.chip)
    assert floor_whole_network(problem) is None
    plan = plan_problem(problem, "cpsat")
    assert plan.solver.get("solved_by") != FLOOR_PROOF
    assert plan.totals.dram_bytes > plan.compulsory_dram_bytes
    assert plan.totals.dram_bytes == plan_problem(_searched(problem), "cpsat").totals.dram_bytes


# capacities at which these small CNNs mostly fit one group only tiled or with streamed
# weights (seed 004's shortcut gives nothing), some not at the floor at all
CHIPS = [["wram.bytes=512"], ["wram.bytes=1KiB"], ["nram.bytes=2KiB"], ["sram.bytes=8KiB"],
         ["sram.bytes=16KiB", "wram.bytes=1KiB"]]


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 10_000), chip=st.sampled_from(CHIPS))
def test_the_shortcut_fires_exactly_where_the_search_finds_one_group_at_the_floor(
        tmp_path_factory: pytest.TempPathFactory, seed: int, chip: list[str]) -> None:
    """Random CNNs on random capacities: where the shortcut gives a group, the exhaustive
    shortest path (both shortcuts off) moves the same floor bytes; where that path's plan is
    the whole network as one group at the floor, the shortcut finds it (it weighs the same
    modes)."""
    tmp = tmp_path_factory.mktemp("floor")
    path = models.save(models.random_cnn(np.random.default_rng(seed)), tmp, "net")
    problem = prepare(str(path), overrides=chip)
    found = floor_whole_network(problem)
    searched = plan_problem(_searched(problem), "shortest-path")
    floor = searched.compulsory_dram_bytes
    one_at_floor = len(searched.groups) == 1 and searched.totals.dram_bytes == floor
    if found is not None:
        assert searched.totals.dram_bytes == floor
        plan = plan_problem(problem, "shortest-path")
        assert plan.totals.dram_bytes == floor and len(plan.groups) == 1
    assert found is not None or not one_at_floor, (seed, chip)
