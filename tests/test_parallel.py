"""Tile searches on several cores (solver.parallel): the same plan for any number of jobs,
the time limit binding the workers, and the CLI's --jobs."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fuseplan.planner.app import api
from fuseplan.planner.core.budget import Budget
from fuseplan.planner.cost.objective import Objective
from fuseplan.planner.plan.mode import Mode
from fuseplan.planner.ui.cli import app
from fuseplan.solver import parallel
from fuseplan.solver.long_groups import whole_map_groups
from fuseplan.solver.parallel import MIN_PARALLEL, Context, Task, search, search_all

import models


def _problem(tmp_path: Path, hardware: str | None = None) -> api.Problem:
    """Squeeze-excite blocks on a small chip: hundreds of candidate groups, some in passes
    and hidden chunks."""
    path = models.save(models.se_net(h=32, w=32, blocks=3, expand=4), tmp_path, "se")
    return api.prepare(str(path), rules=models.fusing_rules(tmp_path), hardware=hardware,
                       overrides=("sram.bytes=96KiB",) if hardware is None else ())


@pytest.mark.parametrize("solver", ["cpsat", "shortest-path"])
def test_jobs_change_the_time_not_the_plan(tmp_path: Path, solver: str,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(parallel, "MIN_PARALLEL", 1)  # a pool for these few searches too
    problem = _problem(tmp_path)
    one = api.plan_problem(problem, solver, jobs=1)
    two = api.plan_problem(problem, solver, jobs=2)
    assert [g.placement for g in one.groups] == [g.placement for g in two.groups]
    assert one.totals == two.totals


def test_workers_return_what_the_planner_finds_in_order(tmp_path: Path) -> None:
    """Every interval of up to four layers searched in two worker processes and in this
    one: the same results, in the order asked (a latency objective: with options)."""
    problem = _problem(tmp_path, "soma_buffer")
    g = problem.graph
    order = [lay.name for lay in g.layers]
    tasks = [Task(tuple(order[i:i + n]), n == 1) for n in range(1, 5)
             for i in range(len(order) - n + 1)]
    assert len(tasks) >= MIN_PARALLEL
    for objective, timed in ((Objective.TRAFFIC, False), (Objective.LATENCY, True)):
        ctx = Context(g, problem.chip, problem.ruleset, objective, timed, None)
        assert search_all(ctx, tasks, jobs=2) == [search(ctx, t) for t in tasks]


def test_whole_map_groups_found_on_two_cores_are_those_found_in_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each start's whole-map ends searched in worker processes (solver.parallel.map_all):
    the same groups and tiles, in the same order, as in this process; some in passes and
    hidden chunks (the expanded maps fit no other way)."""
    monkeypatch.setattr(parallel, "MIN_PARALLEL", 1)
    path = models.save(models.se_net(h=16, w=16, channels=16, expand=8, blocks=3), tmp_path,
                       "se")
    rules = models.fusing_rules(tmp_path, {
        "long_whole_map_groups: false": "long_whole_map_groups: true",
        "max_group_layers: 12": "max_group_layers: 6"})
    problem = api.prepare(str(path), rules=rules, overrides=("sram.bytes=64KiB",
                                                              "nram.bytes=16KiB"))
    args = (problem.graph, problem.chip, problem.ruleset, Objective.TRAFFIC)
    one = whole_map_groups(*args, jobs=1)
    assert len(one) >= 2 and any(c.passes > 1 and c.hidden_chunks > 1 for _, c in one)
    assert whole_map_groups(*args, jobs=2) == one
    # past the time limit no start is searched, in either process count, and the plan's
    # notes say so
    for jobs in (1, 2):
        spent = Budget.of(0.0)
        assert whole_map_groups(*args, jobs=jobs, budget=spent) == []
        assert any("whole-map groups" in note for note in spent.cuts), spent.cuts


def test_past_the_time_limit_only_single_layers_are_searched_quickly(tmp_path: Path) -> None:
    problem = _problem(tmp_path)
    g = problem.graph
    order = [lay.name for lay in g.layers]
    tasks = [Task((order[i],), True) for i in range(len(order))] \
        + [Task(tuple(order[i:i + 3])) for i in range(len(order) - 2)]
    past = Context(g, problem.chip, problem.ruleset, Objective.TRAFFIC, False,
                   time.perf_counter() - 1)
    found = search_all(past, tasks, jobs=2)
    singles, groups = found[:len(order)], found[len(order):]
    assert all(f is None for f in groups)
    assert all(f is not None and f.best is not None for f in singles)
    assert any(f is not None and f.quick for f in singles)


def test_cli_jobs_give_the_same_plan_file(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(parallel, "MIN_PARALLEL", 1)
    path = models.save(models.se_net(h=32, w=32, blocks=3, expand=4), tmp_path, "se")
    runner = CliRunner()
    docs = []
    for jobs in ("1", "2"):
        out = tmp_path / f"plan{jobs}.json"
        result = runner.invoke(app, ["solve", str(path), "-j", jobs, "-o", str(out)])
        assert result.exit_code == 0, result.output
        doc = json.loads(out.read_text())
        docs.append((doc["groups"], doc["totals"]))
    assert docs[0] == docs[1]
    refused = runner.invoke(app, ["solve", str(path), "--jobs", "-1"])
    assert refused.exit_code == 2 and "--jobs" in refused.output


@pytest.mark.parametrize("hardware", [None, "soma_buffer"])
def test_a_pinned_reusing_tile_reports_its_map_peak_in_its_cost(tmp_path: Path,
                                                                hardware: str | None) -> None:
    """CP-SAT reads a pinned halo-reusing tile's feature-map peak from its cost (the tile
    search computed it, maybe in a worker) instead of computing it again: the cost's SRAM
    peak less the weights beside the maps is the exact reuse peak, for resident and
    streamed weights, one buffer or two, with and without bands, on a chip with WRAM and
    on a single-memory one."""
    from fuseplan.planner.cost.model import weights_beside_maps
    from fuseplan.planner.geometry.regions import Tile
    from fuseplan.solver.tiles import GroupSearch

    path = models.save(models.residual_net(h=32, w=32), tmp_path, "res")
    problem = api.prepare(str(path), hardware=hardware)
    g, chip = problem.graph, problem.chip
    order = [lay.name for lay in g.layers]
    checked = banded = 0
    for n in (2, 3, 5):
        for i in range(0, len(order) - n, 3):
            search = GroupSearch.of(g, order[i:i + n], chip, problem.ruleset)
            if not search.can_reuse():
                continue
            w = search.tile_of(1).w
            for th, cols, bands, resident, db in ((2, 1, 1, True, False),
                                                  (5, 1, 1, False, True),
                                                  (3, 16, chip.cores, True, True),
                                                  (4, 32, chip.cores, False, False)):
                tile = Tile(search.tile_of(th).n, th, max(1, w // cols), bands)
                if bands > 1 and bands not in search.band_options(tile.w):
                    continue  # the chip's cores do not make that many bands
                at = search.at_width(tile.w).at_bands(bands)
                choice = at.choice(tile, Mode.of(resident=resident, double_buffered=db,
                                                  halo_reuse=True))
                facts = at.facts(tile, resident, db, True)
                maps = choice.cost.sram_peak_bytes - weights_beside_maps(g, search.io, chip,
                                                                         resident)
                assert maps == facts.reuse_peak_bytes, (order[i:i + n], tile, resident, db)
                checked += 1
                banded += bands > 1
    assert checked >= 12 and (banded > 0 or hardware is not None)


@pytest.mark.slow  # four planners and two fronts, twice: over a minute
def test_compare_and_pareto_give_the_same_plans_on_two_cores(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The latency and energy objectives search prefetch options in the workers too."""
    monkeypatch.setattr(parallel, "MIN_PARALLEL", 1)
    problem = _problem(tmp_path)
    for one, two in zip(api.compare(problem, "latency", jobs=1),
                        api.compare(problem, "latency", jobs=2), strict=True):
        assert one[0] == two[0] and one[2] == two[2]
        assert (one[1] and one[1].totals) == (two[1] and two[1].totals)
    front = [(p.totals.cycles, p.totals.energy_pj) for p in api.pareto(problem, 3, jobs=1)]
    assert front == [(p.totals.cycles, p.totals.energy_pj)
                     for p in api.pareto(problem, 3, jobs=2)]
