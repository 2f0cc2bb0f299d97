"""Floors and the bounded shortest path (planner.cost.bounds, solver.bounded_path): no
searched cost is below its group's floor, the bounded path finds the plan cost the full
search finds while searching fewer groups, and a wrong floor cannot make it worse."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fuseplan.planner.app.api import Problem, plan_problem, prepare
from fuseplan.planner.cost.bounds import IntervalFloors, axis_union, group_floor_bytes
from fuseplan.planner.cost.objective import Objective
from fuseplan.planner.geometry.regions import AxisChain, group_chains
from fuseplan.solver import shortest_path
from fuseplan.solver.groups import breaks_structure, connected_intervals, is_connected
from fuseplan.solver.long_groups import start_groups, whole_map_starts
from fuseplan.solver.parallel import Context
from fuseplan.solver.tiles import GroupSearch
from tests import models
from tests.test_rules import with_rules

CHIPS: tuple[list[str], ...] = ([], ["sram.bytes=48KiB", "nram.bytes=16KiB"],
                                 ["sram.bytes=16KiB", "nram.bytes=4KiB"])


def _problem(tmp: Path, model: Any, name: str, overrides: list[str]) -> Problem:
    return prepare(str(models.save(model, tmp, name)), overrides=overrides)


def _pruned(problem: Problem, on: bool) -> Problem:
    # whole-network-first off: these small models fit the default chip whole
    return with_rules(problem, search={"prune_by_floor": on, "whole_network_first": False})


@settings(max_examples=60, deadline=None)
@given(s=st.integers(0, 4), p=st.integers(-2, 4), e=st.integers(1, 9), u=st.integers(1, 40),
       extent=st.integers(1, 24))
def test_axis_union_is_the_union_of_one_index_boxes(s: int, p: int, e: int, u: int,
                                                    extent: int) -> None:
    """axis_union counts exactly the indices some one-index anchor range's box holds."""
    chain = AxisChain(s, p, e, u)
    held: set[int] = set()
    for y in range(extent):
        lo, hi = (0, u) if s == 0 else (max(0, s * y - p), min(u, s * y + e))
        held.update(range(lo, hi))
    assert axis_union(chain, extent) == len(held)
    assert axis_union(None, extent) == 0


@pytest.mark.parametrize("builder", ["residual_net", "inception_net", "se_net", "convnext_net"])
def test_connected_intervals_are_the_connected_ones(tmp_path: Path, builder: str) -> None:
    """The union-find over each start finds exactly the intervals networkx calls connected,
    among those within the limit (views ride along free: Graph.within_limit)."""
    g = _problem(tmp_path, BUILT[builder](), builder, []).graph
    order = [lay.name for lay in g.layers]
    expected = {(i, j) for i in range(len(order)) for j in range(i + 1, len(order) + 1)
                if g.within_limit(order[i:j], 9) and is_connected(g, order[i:j])}
    assert connected_intervals(g, 9) == expected


def candidate_searches(problem: Problem, most: int) -> Iterator[tuple[int, int, GroupSearch]]:
    """(start, end, tile search) of every connected interval of up to `most` layers that no
    structural rule rules out."""
    g, chip, rs = problem.graph, problem.chip, problem.ruleset
    order = [lay.name for lay in g.layers]
    for i in range(len(order)):
        for j in range(i + 1, min(len(order), i + most) + 1):
            if is_connected(g, order[i:j]):
                search = GroupSearch.of(g, order[i:j], chip, rs)
                if not breaks_structure(search, rs):
                    yield i, j, search


def _floors_hold(problem: Problem, most: int = 8) -> int:
    """Checks floor <= searched cost for every interval of up to `most` layers and every
    whole-map group a start keeps; returns how many costs were compared."""
    g, chip, rs = problem.graph, problem.chip, problem.ruleset
    cheap = IntervalFloors.of(g, chip)
    compared = 0
    for i, j, search in candidate_searches(problem, most):
        layers = search.layers
        best = search.best(Objective.TRAFFIC)
        if best is None:
            continue
        floor = group_floor_bytes(g, search.io, search.chains, chip)
        assert floor <= best.cost.dram_bytes, (
            f"{layers}: floor {floor} B above the searched {best.cost.dram_bytes} B "
            f"({best.tile}, resident {best.resident}, reuse {best.halo_reuse})")
        # the cheap floor counts no inputs: never above the walked one
        assert cheap.floors(i, [j - 1])[0] <= floor, layers
        compared += 1
    ctx = Context(g, chip, rs, Objective.TRAFFIC, False, None)
    for start in whole_map_starts(g, chip, rs):
        at = g.index(start.layers[0])
        floors = dict(zip(start.ends, IntervalFloors.of(g, chip).floors(
            at, [at + e for e in start.ends]), strict=True))
        for grouped, choice in start_groups(ctx, start) or []:
            end = len(grouped) - 1
            assert floors[end] <= choice.cost.dram_bytes, (grouped[0], grouped[-1])
            # the long groups' floor counts no inputs: never above the walked one
            io = GroupSearch.of(g, grouped, chip, rs).io
            assert floors[end] <= group_floor_bytes(g, io, group_chains(g, io), chip)
            compared += 1
    return compared


BUILT = {
    "residual_net": models.residual_net, "inception_net": models.inception_net,
    "repeated_net": models.repeated_net, "se_net": models.se_net,
    "mbconv_net": models.mbconv_net, "convnext_net": models.convnext_net,
    # token tensors: attention with online softmax or head chunks, an MLP in hidden chunks
    "causal_encoder": lambda: models.causal_encoder(tokens=128, width=32, heads=2),
    "batch_first_mha": lambda: models.batch_first_mha(batch=2),
}


@pytest.mark.parametrize("overrides", CHIPS, ids=["default", "48KiB", "16KiB"])
@pytest.mark.parametrize("builder", list(BUILT))
def test_no_searched_cost_is_below_its_floor(tmp_path: Path, builder: str,
                                             overrides: list[str]) -> None:
    """Strided 1x1 convs (rows never read), concatenations, squeeze-excite passes, hidden
    chunks, attention: the floor stays at or below every candidate's best
    searched cost."""
    problem = _problem(tmp_path, BUILT[builder](), builder, overrides)
    assert _floors_hold(problem) > 0


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), batch=st.sampled_from([1, 2]),
       chip=st.sampled_from(CHIPS))
def test_bounded_path_costs_what_the_full_search_costs(tmp_path_factory: pytest.TempPathFactory,
                                                       seed: int, batch: int,
                                                       chip: list[str]) -> None:
    """On random CNNs and chips, the shortest path and CP-SAT with floors prune move exactly
    the bytes they move when every candidate is searched (on one process and on two), and
    every floor holds."""
    rng = np.random.default_rng(seed)
    tmp = tmp_path_factory.mktemp("bounds")
    problem = _problem(tmp, models.random_cnn(rng, batch), f"r{seed}", chip)
    assert _floors_hold(problem) >= 0
    for solver in ("shortest-path", "cpsat"):
        try:
            full = plan_problem(_pruned(problem, False), solver)
        except Exception as exc:  # a layer that fits nowhere: the bounded path says so too
            with pytest.raises(type(exc)):
                plan_problem(_pruned(problem, True), solver)
            return
        pruned = plan_problem(_pruned(problem, True), solver)
        assert pruned.totals.dram_bytes == full.totals.dram_bytes, (seed, solver)
        assert pruned.solver["status"] == full.solver["status"]
        # on two processes idle cores also search the groups of the next cheapest paths
        both = plan_problem(_pruned(problem, True), solver, jobs=2)
        assert both.totals.dram_bytes == full.totals.dram_bytes, (seed, solver, "jobs 2")


@pytest.mark.parametrize("builder", ["residual_net", "repeated_net", "inception_net"])
def test_floors_spare_searches_and_the_proof_holds(tmp_path: Path, builder: str) -> None:
    """The bounded path searches fewer groups than there are candidates; CP-SAT counts the
    groups its floors ruled out as weighed, so the path still proves the plan optimal, and
    the plan is the full search's cost."""
    problem = _problem(tmp_path, getattr(models, builder)(), builder,
                       ["sram.bytes=48KiB", "nram.bytes=16KiB"])
    memo_on: dict[tuple[str, ...], Any] = {}
    memo_off: dict[tuple[str, ...], Any] = {}
    on = plan_problem(_pruned(problem, True), "cpsat", memo=memo_on)
    off = plan_problem(_pruned(problem, False), "cpsat", memo=memo_off)
    assert on.totals.dram_bytes == off.totals.dram_bytes
    both = plan_problem(_pruned(problem, True), "cpsat", jobs=2)
    assert both.totals.dram_bytes == off.totals.dram_bytes
    assert on.solver["status"] == "OPTIMAL" and "solved_by" in on.solver, on.solver
    assert len(memo_on) < len(memo_off), (len(memo_on), len(memo_off))


def test_a_floor_above_a_searched_cost_makes_the_path_search_everything(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Floors that lie (here: every group's floor far above any cost) cannot cost a byte: the
    first searched cost under its floor makes every floor 0, so the path searches whatever
    it uses, and the plan is the full search's (without that check the path would keep the
    first groups it searched: 18,776 B here, 27 % over the optimum)."""
    problem = _problem(tmp_path, models.chain_cnn(), "chain",
                       ["sram.bytes=16KiB", "nram.bytes=4KiB"])
    off = plan_problem(_pruned(problem, False), "shortest-path")
    lie = 10**15
    monkeypatch.setattr(shortest_path, "group_floor_bytes", lambda *a: lie)
    monkeypatch.setattr(IntervalFloors, "floors", lambda self, start, ends: [lie] * len(ends))
    lying = plan_problem(_pruned(problem, True), "shortest-path")
    assert lying.totals.dram_bytes == off.totals.dram_bytes


@pytest.mark.parametrize("name", ["residual_net", "inception_net"])
def test_examples_plan_alike_bounded_or_not_on_two_processes(name: str) -> None:
    """The examples' rules and chips (blocks that candidates cut: structural rules drop
    many groups only once a path reaches them, also among those idle cores take on)."""
    root = Path(__file__).resolve().parents[1] / "examples" / name
    problem = prepare(str(root / "model.onnx"), str(root / "rules.yaml"),
                      str(root / "hardware.yaml"))
    full = plan_problem(_pruned(problem, False), "cpsat")
    both = plan_problem(_pruned(problem, True), "cpsat", jobs=2)
    assert both.totals.dram_bytes == full.totals.dram_bytes
    assert both.solver["status"] == "OPTIMAL"


@pytest.mark.slow
def test_a_whole_map_group_the_path_keeps_gets_its_full_tile_search() -> None:
    """SSDLite's stem (57 layers, past every interval and block group) is a whole-map group;
    its whole-map search tries whole maps only, while CP-SAT searches a warm start's
    groups in full: 14-row tiles in passes and hidden chunks move 108,054 B less. The path
    takes the cheaper for the groups it keeps, so the bounded plan (CP-SAT not run) moves
    what the full search with CP-SAT does."""
    root = Path(__file__).resolve().parents[1] / "examples" / "exports"
    problem = prepare(str(root / "ssdlite_backbone.onnx"), shapes={"input": (1, 3, 320, 320)})
    full = plan_problem(_pruned(problem, False), "cpsat", jobs=2)
    bounded = plan_problem(_pruned(problem, True), "cpsat", jobs=2)
    assert "solved_by" in bounded.solver and bounded.solver["status"] == "OPTIMAL"
    assert bounded.totals.dram_bytes == full.totals.dram_bytes == 6_227_984
    stem = bounded.groups[0]
    assert len(stem.layers) == 57 and stem.tile.h < 20 and stem.placement.passes > 1
