"""Planning a prepared problem: the four planners behind plan_problem, the whole network as
one group when it fits or moves the compulsory floor, and CP-SAT warm-started from the
shortest-path plan (which the Pareto fronts of planner.app.pareto run with cycle caps)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace as dc_replace
from functools import partial
from typing import Any

from fuseplan.planner.app.assemble import assemble, layer_placements
from fuseplan.planner.app.io_bounds import io_bounds_of
from fuseplan.planner.app.problem import Problem, objective_of
from fuseplan.planner.core.budget import Budget
from fuseplan.planner.core.errors import InputError, PlanningError
from fuseplan.planner.core.progress import Progress, ProgressSink
from fuseplan.planner.cost.counters import Counters
from fuseplan.planner.cost.model import compulsory_bytes
from fuseplan.planner.cost.objective import Objective, cycle_units, objective_units
from fuseplan.planner.plan.checks import whole_tile
from fuseplan.planner.plan.data import Plan
from fuseplan.planner.plan.placement import Placement

SOLVERS = ("cpsat", "shortest-path", "greedy", "layer")
MIN_SOLVE_S = 0.5  # CP-SAT is not started with less time than this left
FLOOR_PROOF = ("floor: the whole network as one group moves the compulsory floor (every "
               "weight, model input and output once), which no plan beats")
ASSEMBLY_S, ASSEMBLY_S_PER_LAYER = 0.8, 0.008  # what a time-limited plan keeps to assemble
# and print (measured on ResNet-152, 2 cores: 5 ms a layer to assemble, 0.5 s to print)


def plan_problem(problem: Problem, solver: str = "cpsat",
                 objective: Objective | str | None = None, time_limit: float | None = None,
                 memo: dict[tuple[str, ...], Any] | None = None,
                 started: float | None = None, jobs: int = 1,
                 progress: ProgressSink | None = None) -> Plan:
    """Plan a prepared problem with one of the four planners; the plan carries its I/O bounds
    (planner.app.io_bounds: its attentions' I/O, a prefill's I/O bound, a decode step's caches).

    ``time_limit`` bounds the whole planning, from ``started`` (a ``time.perf_counter()``
    reading: when the command began; now when None): tile searches and CP-SAT share it, and
    a plan cut short by it says so (status FEASIBLE, ``stopped``, and its gap to the floor
    under the traffic objective). ``memo`` (shortest-path and CP-SAT) holds each candidate
    group's best tile under this objective; pass the same dict to plans of overlapping
    subgraphs of one model so no group's tile search runs twice. ``jobs``: processes the tile
    searches run on, 0 for every core (solver.parallel; the plan is the same for any
    count). ``progress``: told of every phase (planner.core.progress; the plan is the same
    with it or without)."""
    plan = _plan(problem, solver, objective, time_limit, memo, started, jobs, progress)
    return dc_replace(plan, io_bounds=io_bounds_of(problem.graph, problem.chip, plan))


def _plan(problem: Problem, solver: str, objective: Objective | str | None,
          time_limit: float | None, memo: dict[tuple[str, ...], Any] | None,
          started: float | None, jobs: int, progress: ProgressSink | None) -> Plan:
    """plan_problem's plan, before its I/O bounds."""
    from fuseplan.solver.parallel import available_jobs

    if solver not in SOLVERS:
        raise InputError(f"unknown solver '{solver}'. Use one of: {', '.join(SOLVERS)}.")
    goal = objective_of(problem, objective)
    g, chip, rs = problem.graph, problem.chip, problem.ruleset
    header = problem.plan_header()
    jobs = jobs or available_jobs()
    budget = Budget.of(time_limit, started)
    started = time.perf_counter()
    # the searches leave time to assemble the plan (its groups' costs, the layer-by-layer
    # reference) and to write it
    searches = budget.less(ASSEMBLY_S + ASSEMBLY_S_PER_LAYER * len(g.layers))
    first = rs.search.whole_network_first and solver != "layer"
    if first and progress is not None:
        progress(Progress("whole network"))
    whole = whole_network(problem, deep=goal is Objective.TRAFFIC) if first else None
    if whole is not None:
        at_once: dict[str, Any] = {"name": solver, "status": "WHOLE_NETWORK_ON_CHIP",
                                   "gap": 0.0, "wall_s": round(time.perf_counter() - started, 3)}
        return assemble(g, chip, [whole], objective=goal, solver=at_once, **header,
                        layer_by_layer=_layer_by_layer(problem, jobs, progress))
    info: dict[str, Any]
    if solver == "layer":  # no fusion: whole layers, tiled only where they do not fit
        info = {"name": "layer", "status": "OPTIMAL", "gap": 0.0,
                "wall_s": round(time.perf_counter() - started, 3)}
        if progress is not None:
            progress(Progress("layer by layer"))
        return assemble(g, chip, layer_placements(g, chip, settings=rs.search), objective=goal,
                        solver=info, **header,
                        layer_by_layer=_layer_by_layer(problem, jobs, progress))
    groups, info = _planned_groups(problem, solver, goal, memo, searches, jobs, progress)
    if goal is not Objective.TRAFFIC and solver != "greedy":  # the greedy stays greedy
        groups, info = _never_worse_than_traffic(problem, goal, groups, info, searches, jobs,
                                                 progress)
    if budget.cuts:  # optimal only over what was searched: no proof of anything
        info.update(status="FEASIBLE", gap=None, stopped="; ".join(budget.cuts))
        info.pop("bound", None)
        info.pop("solved_by", None)
    info["wall_s"] = round(time.perf_counter() - started, 3)
    plan = assemble(g, chip, groups, objective=goal, solver=info, **header,
                    layer_by_layer=_layer_by_layer(problem, jobs, progress))
    if goal is Objective.TRAFFIC and plan.totals.dram_bytes > plan.layer_by_layer_dram_bytes:
        # cut short by its time limit, the plan's single layers were tiled by the quick
        # search: no fusion at all, each layer at its best tile in the modes the rules allow
        # (the reference may use others), may move less
        kept = {**{k: v for k, v in info.items() if k not in ("bound", "solved_by")},
                "status": "FEASIBLE", "gap": None, "kept_layer_by_layer": True}
        alone = assemble(g, chip, layer_placements(g, chip, jobs, rs.search), objective=goal,
                         solver=kept, **header, layer_by_layer=plan.layer_by_layer_dram_bytes)
        if alone.totals.dram_bytes < plan.totals.dram_bytes:
            info, plan = kept, alone
    if "solved_by" in info:  # proven by the path: its objective is the plan's, and the bound
        units = objective_units(plan.totals, goal, rs.objective, chip)
        plan = dc_replace(plan, solver={**plan.solver, "objective": float(units),
                                        "bound": float(units)})
    return _gap_to_floor(plan) if budget.cuts else plan


def _planned_groups(problem: Problem, solver: str, goal: Objective,
                    memo: dict[tuple[str, ...], Any] | None, searches: Budget, jobs: int,
                    progress: ProgressSink | None) -> tuple[list[Placement], dict[str, Any]]:
    """The groups of the greedy, the shortest path or CP-SAT, and the solver info; under the
    traffic objective the exact planners first take the whole network where it moves the
    compulsory floor (floor_whole_network: no plan moves less, nothing is left to search)."""
    from fuseplan.solver.greedy import greedy_groups
    from fuseplan.solver.shortest_path import shortest_path_groups

    g, chip, rs = problem.graph, problem.chip, problem.ruleset
    if goal is Objective.TRAFFIC and solver in ("cpsat", "shortest-path") \
            and (at_floor := floor_whole_network(problem)) is not None:
        if progress is not None:
            progress(Progress("whole network at the floor"))
        return [at_floor], {"name": solver, "status": "OPTIMAL", "gap": 0.0,
                            "solved_by": FLOOR_PROOF}
    if solver == "greedy":
        return greedy_groups(g, chip, rs, progress), {"name": "greedy", "status": "FEASIBLE",
                                                      "gap": None}
    if solver == "shortest-path":
        groups = shortest_path_groups(g, chip, rs, goal, memo, budget=searches, jobs=jobs,
                                      progress=progress)
        # exact over intervals of the topological order, which are all groups only on a chain
        chain = all(g.dag.out_degree(n) <= 1 and g.dag.in_degree(n) <= 1 for n in g.dag)
        return groups, {"name": "shortest-path", "status": "OPTIMAL" if chain else "FEASIBLE",
                        "gap": 0.0 if chain else None}
    return cpsat_groups(problem, goal, None, memo=memo, budget=searches, jobs=jobs,
                        progress=progress)


def _never_worse_than_traffic(problem: Problem, goal: Objective, groups: list[Placement],
                              info: dict[str, Any], budget: Budget, jobs: int,
                              progress: ProgressSink | None
                              ) -> tuple[list[Placement], dict[str, Any]]:
    """A latency or energy plan, or the traffic plan where that one does better under the
    same objective: the traffic plan is always a candidate, so a latency plan is never
    slower than it (a search cut short, or candidates a timed objective prices one group at
    a time, can miss it). Where it wins, the plan is no longer proven optimal."""
    if budget.passed:
        return groups, info
    rs, chip = problem.ruleset, problem.chip
    if progress is not None:
        progress(Progress("traffic plan, a candidate"))
    traffic = traffic_placements(problem, budget, jobs, progress)

    def units(placements: Sequence[Placement]) -> int:
        return objective_units(_totals(problem, placements, goal), goal, rs.objective, chip)

    if units(traffic) >= units(groups):
        return groups, info
    kept = {k: v for k, v in info.items() if k not in ("bound", "solved_by", "objective")}
    return traffic, {**kept, "status": "FEASIBLE", "gap": None, "kept_traffic_plan": True}


def traffic_placements(problem: Problem, budget: Budget | None = None, jobs: int = 1,
                       progress: ProgressSink | None = None) -> list[Placement]:
    """The traffic plan's groups (the whole network as one group where it fits at any
    depth, as plan_problem finds it, else the shortest path's), each buffered as CP-SAT
    picks it (the bytes do not depend on it): a candidate every other objective weighs."""
    from fuseplan.solver.cpsat import faster_buffering
    from fuseplan.solver.shortest_path import shortest_path_groups

    g, chip, rs = problem.graph, problem.chip, problem.ruleset
    whole = deep_whole_network(problem) or floor_whole_network(problem)
    placements = [whole] if whole is not None else shortest_path_groups(
        g, chip, rs, Objective.TRAFFIC, {}, budget=budget, jobs=jobs, progress=progress)
    return [faster_buffering(g, chip, rs, p) for p in placements]


def _totals(problem: Problem, placements: Sequence[Placement], objective: Objective
            ) -> Counters:
    """The counters of a candidate plan of these placements (assembled bare: no headers,
    no layer-by-layer reference), to weigh it against another."""
    return assemble(problem.graph, problem.chip, placements, objective=objective, solver={},
                    model={}, hardware={}, rules={}, layer_by_layer=0).totals


def _layer_by_layer(problem: Problem, jobs: int, progress: ProgressSink | None) -> int:
    """The problem's layer-by-layer bytes (every plan's reference), the phase told first:
    its searches, and the plan's assembly after it, take a while on a deep network."""
    if progress is not None:
        progress(Progress("assembling plan"))
    return problem.layer_by_layer_on(jobs)


def _gap_to_floor(plan: Plan) -> Plan:
    """A plan cut short by its time limit, with its gap to the compulsory floor (a bound on
    every plan's traffic) under the traffic objective; other objectives have no such bound."""
    if plan.objective is not Objective.TRAFFIC:
        return plan
    moved, floor = plan.totals.dram_bytes, plan.compulsory_dram_bytes
    info = {**plan.solver, "bound": floor, "gap": round((moved - floor) / max(moved, 1), 6)}
    return dc_replace(plan, solver=info)


def whole_network(problem: Problem, deep: bool = False) -> Placement | None:
    """The one-group placement when every weight and the largest live set fit on chip and the
    enabled rules allow the network as one fused group. ``deep``: also past
    search.max_group_layers where whole-map groups of any length are allowed (the traffic
    objective: the group moves the compulsory floor, which no plan beats; the path would
    find it after weighing every whole-map group of a deep network)."""
    from fuseplan.solver.tiles import GroupSearch

    g = problem.graph
    layers = tuple(lay.name for lay in g.layers)
    settings = problem.ruleset.search
    if not g.within_limit(layers, settings.max_group_layers) \
            and not (deep and settings.long_whole_map_groups):  # seed 004: "not too deep"
        return None
    search = GroupSearch.of(g, layers, problem.chip, problem.ruleset)
    tile = search.tile_of(search.heights()[0])
    if tile != whole_tile(g, layers) or search.violations(tile, True):
        return None
    return Placement.of(layers, tile, True)


def deep_whole_network(problem: Problem) -> Placement | None:
    """The whole network as one group at any depth, as the traffic plan finds it (None where
    the rules turn the shortcut off or it does not fit): every objective weighs it."""
    if not problem.ruleset.search.whole_network_first:
        return None
    return whole_network(problem, deep=True)


def floor_whole_network(problem: Problem) -> Placement | None:
    """The whole network as one group where, in the best mode a group of its length may run
    in, it moves the compulsory floor (every weight, model input and output once, which no
    plan beats): the traffic objective's optimum, found without weighing any other group.

    The modes are those the planners weigh for a group that long: any tile within
    search.max_group_layers (views free) or search.max_block_group_layers (a block group
    from the model's input to its output), the whole-map tile at any length where
    search.long_whole_map_groups allows (weights resident or streamed, in hidden chunks or
    passes where its maps do not fit whole; solver.long_groups). None where
    search.whole_network_first is off or no such group moves the floor alone."""
    from fuseplan.solver.cpsat import faster_buffering
    from fuseplan.solver.groups import breaks_structure, is_connected
    from fuseplan.solver.long_groups import whole_map_choice
    from fuseplan.solver.tiles import GroupSearch

    g, chip, rs = problem.graph, problem.chip, problem.ruleset
    layers = tuple(lay.name for lay in g.layers)
    settings = rs.search
    within = g.within_limit(layers, settings.max_group_layers)
    tiled = within or len(layers) <= settings.max_block_group_layers
    if not settings.whole_network_first or not (tiled or settings.long_whole_map_groups) \
            or not is_connected(g, layers):  # no planner fuses unconnected layers
        return None
    search = GroupSearch.of(g, layers, chip, rs)
    if breaks_structure(search, rs):
        return None
    floor = compulsory_bytes(g, chip)
    tries = [partial(search.best, Objective.TRAFFIC)] if tiled else []
    if not within and settings.long_whole_map_groups:
        tries.append(partial(whole_map_choice, search, Objective.TRAFFIC))
    for found in tries:
        choice = found()
        if choice is not None and choice.cost.dram_bytes <= floor:
            # buffered as the planners pick it (the bytes do not depend on it)
            return faster_buffering(g, chip, rs, choice.placement(tuple(search.layers)))
    return None


def cpsat_groups(problem: Problem, objective: Objective, time_limit: float | None,
                 cycles_cap: int | None = None, cache: dict[Objective, Any] | None = None,
                 warm: Sequence[Placement] | None = None,
                 memo: dict[tuple[str, ...], Any] | None = None, budget: Budget | None = None,
                 jobs: int = 1, progress: ProgressSink | None = None
                 ) -> tuple[list[Placement], dict[str, Any]]:
    """CP-SAT groups warm-started from the shortest-path plan (or `warm`), and the solver
    info. ``cache`` keeps each objective's interval tiles across calls (a Pareto sweep);
    ``memo`` seeds this objective's interval tiles (shared by a partition's pieces);
    ``budget`` bounds the searches and the solve together (``time_limit`` bounds the solve
    alone); ``progress``: told of the searches and the solve (planner.core.progress)."""
    from fuseplan.solver.cpsat import faster_buffering, intervals_only, reserve_s, solve_cpsat
    from fuseplan.solver.shortest_path import shortest_path_groups

    g, chip, rs = problem.graph, problem.chip, problem.ruleset
    budget = Budget() if budget is None else budget
    cache = {} if cache is None else cache
    if objective not in cache:
        memo = {} if memo is None else memo  # each interval's best tile, computed once
        options: dict[tuple[str, ...], Any] = {}  # and its prefetch options
        whole_maps: dict[str, Any] = {}  # whole-map groups, found once for both planners
        bounded: set[tuple[str, ...]] = set()  # weighed by their floors, never searched
        # floors spare searches only where the path can prove its plan: where some
        # candidate is no interval of the order CP-SAT weighs (searches) every one anyway
        path = shortest_path_groups(g, chip, rs, objective, memo, options, budget, jobs,
                                    whole_maps, bounded,
                                    prune=rs.search.exact_path_first and intervals_only(g, rs),
                                    progress=progress)
        # + trade-off fronts (capped solves)
        cache[objective] = (memo, options, path, {}, whole_maps, bounded)
    memo, options, path, trade_offs, whole_maps, bounded = cache[objective]
    hint = path if warm is None else warm
    timed = bool(cycle_units(objective, rs.objective, chip))
    # a timed path is proven where it ran over floors (solver.prefetch_path): its searches
    # were pruned as shortest_path_groups prunes them
    if rs.search.exact_path_first and warm is None and cycles_cap is None and path \
            and (not timed or rs.search.prune_by_floor) \
            and intervals_only(g, rs, [p.layers for p in path], searched=memo.keys() | bounded):
        if timed:
            proof = ("shortest-path: every candidate group is an interval of the layer order, "
                     "and each pair of consecutive groups is priced with its prefetch")
            return list(path), {"name": "cpsat", "status": "OPTIMAL", "gap": 0.0,
                                "solved_by": proof}
        proof = ("shortest-path: costs add up and every candidate group is an interval of "
                 "the layer order")
        # buffering as CP-SAT picks it (the bytes do not depend on it)
        return [faster_buffering(g, chip, rs, p) for p in path], {
            "name": "cpsat", "status": "OPTIMAL", "gap": 0.0, "solved_by": proof}
    left = budget.left()
    if hint and left is not None and left < reserve_s(budget) + MIN_SOLVE_S:
        budget.cut("CP-SAT not run: the time limit passed in the tile search")
        return list(hint), {"name": "cpsat", "status": "FEASIBLE", "gap": None}
    try:
        result = solve_cpsat(g, chip, rs, objective, hint, time_limit, cycles_cap, memo,
                             options, trade_offs, budget, jobs, whole_maps, progress)
    except PlanningError as exc:
        if hint and "status UNKNOWN" in str(exc) and (kept := _warm_start_kept(
                problem, objective, hint, cycles_cap, budget)) is not None:
            return list(hint), kept
        if "MODEL_INVALID" not in str(exc):
            raise
        # the costs outgrow CP-SAT's 64-bit integers: the chip's numbers, not the time limit
        raise InputError(
            f"{_chip_place(problem)}: this model's {objective.value} costs on "
            f"this chip are too large for the solver (static_power_mw "
            f"{chip.static_power_mw:g}, clock_ghz {chip.clock_ghz:g}, dram.bandwidth_gbps "
            f"{chip.dram.bandwidth_gbps:g}, core.macs_per_cycle {chip.core.macs_per_cycle}). "
            "Give the chip realistic values (a faster clock or DRAM, less static power), or "
            "plan with --objective traffic or --solver shortest-path.") from None
    info = {"name": "cpsat", "status": result.status, "gap": round(result.gap, 6),
            "objective": result.objective, "bound": result.bound}
    if cycles_cap is not None:
        info["cycles_cap"] = cycles_cap
    groups = list(result.groups)
    if result.status != "OPTIMAL" and hint:
        # stopped by the time limit: never return worse than the plan it started from
        def units(placements: Sequence[Placement]) -> tuple[bool, int]:
            t = _totals(problem, placements, objective)
            over = cycles_cap is not None and t.cycles > cycles_cap
            return over, objective_units(t, objective, rs.objective, chip)

        start = list(hint)
        if units(start) < units(groups):
            groups = start
            info["kept_warm_start"] = True
    return groups, info


def _warm_start_kept(problem: Problem, objective: Objective, hint: Sequence[Placement],
                     cycles_cap: int | None, budget: Budget) -> dict[str, Any] | None:
    """The solver info of a warm start kept when CP-SAT found no plan within its time limit,
    None where the warm start is over the cycles cap (a capped solve of a Pareto front has
    no command budget, only its solve's limit: the point gets the plan it started from
    rather than none)."""
    if cycles_cap is not None and _totals(problem, hint, objective).cycles > cycles_cap:
        return None
    why = "CP-SAT found no plan within its time limit; the plan it started from is returned"
    budget.cut(why)
    kept: dict[str, Any] = {"name": "cpsat", "status": "FEASIBLE", "gap": None,
                            "kept_warm_start": True, "stopped": why}
    if cycles_cap is not None:
        kept["cycles_cap"] = cycles_cap
    return kept


def _chip_place(problem: Problem) -> str:
    """The chip file and its --set overrides, as a message names them."""
    where = problem.chip_file or problem.chip.name
    if problem.chip_overrides:
        where += " (" + ", ".join(f"--set {o}" for o in problem.chip_overrides) + ")"
    return where
