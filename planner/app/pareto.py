"""Non-dominated (cycles, energy) plans: the Pareto front between time and energy by
epsilon constraints, the capped solves warm-started from a blend of the front's two ends."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from fuseplan.planner.app.assemble import assemble
from fuseplan.planner.app.planning import (
    cpsat_groups,
    deep_whole_network,
    plan_problem,
    whole_network,
)
from fuseplan.planner.app.problem import Problem
from fuseplan.planner.core.errors import InputError, PlanningError
from fuseplan.planner.core.progress import ProgressSink, within
from fuseplan.planner.cost.objective import Objective, objective_units
from fuseplan.planner.plan.data import Plan
from fuseplan.planner.plan.placement import Placement


def pareto(problem: Problem, points: int = 5, time_limit: float | None = None,
           jobs: int = 1, progress: ProgressSink | None = None) -> list[Plan]:
    """Non-dominated (cycles, energy) plans by epsilon constraints (seed 004 ¶49-54).

    The latency-optimal and energy-optimal plans bound the front; between them CP-SAT
    minimises energy with the plan's cycles capped at evenly spaced values, warm-started
    from the latency plan (which meets every cap). ``jobs``: processes the tile searches
    run on (0: every core). ``progress``: told of each point's phases, each tagged
    "point k of N" (planner.core.progress).
    """
    from fuseplan.solver.parallel import available_jobs

    jobs = jobs or available_jobs()
    if points < 2:
        raise InputError(f"--points must be at least 2 (got {points}): the two ends of the "
                         "front. Pass --points 2 or more.")
    if whole_network(problem) is not None:  # one group: nothing to trade
        return [plan_problem(problem, "cpsat", Objective.LATENCY, time_limit, jobs=jobs,
                             progress=within(progress, "point 1 of 1"))]
    header = problem.plan_header()
    cache: dict[Objective, Any] = {}

    def planned(objective: Objective, cap: int | None = None,
                warm: Sequence[Placement] | None = None, point: int = 1
                ) -> tuple[Plan, list[Placement]]:
        started = time.perf_counter()
        groups, info = cpsat_groups(problem, objective, time_limit, cap, cache, warm, jobs=jobs,
                                    progress=within(progress, f"point {point} of {points}"))
        info["wall_s"] = round(time.perf_counter() - started, 3)
        return assemble(problem.graph, problem.chip, groups, objective=objective, solver=info,
                        layer_by_layer=problem.layer_by_layer_bytes,
                        **header), groups

    fastest, _ = planned(Objective.LATENCY, point=1)
    cheapest, _ = planned(Objective.ENERGY, point=2)
    solved = cheapest  # the warm starts blend its groups: one group would leave no cut
    # the whole network as one group past search.max_group_layers, which the solves do not
    # weigh, can be cheaper still (plan_problem weighs it too)
    whole = deep_whole_network(problem)
    if whole is not None:
        one = assemble(problem.graph, problem.chip, [whole], objective=Objective.ENERGY,
                       solver={"name": "cpsat", "status": "FEASIBLE", "gap": None,
                               "kept_traffic_plan": True},
                       layer_by_layer=problem.layer_by_layer_bytes, **header)
        rs, chip = problem.ruleset, problem.chip
        if objective_units(one.totals, Objective.ENERGY, rs.objective, chip) \
                < objective_units(cheapest.totals, Objective.ENERGY, rs.objective, chip):
            cheapest = one
    low, high = fastest.totals.cycles, cheapest.totals.cycles
    plans = [fastest, cheapest]
    for k in range(1, points - 1):
        cap = low + (high - low) * k // (points - 1)
        if cap <= low or cap >= high:
            continue
        start = blend(problem, fastest, solved, cap)
        try:
            plans.append(planned(Objective.ENERGY, cap, [g.placement for g in start.groups],
                                 k + 2)[0])
        except PlanningError:  # no plan under this cap within the time limit: skip the point
            continue
    return non_dominated(plans)


def blend(problem: Problem, fast: Plan, cheap: Plan, cap: int) -> Plan:
    """A plan within `cap` cycles mixing two plans (the capped solves' warm start): where both
    plans cut the layer order at the same place, each stretch between such cuts comes from
    either plan; the cheap plan's stretches that save the most energy per extra cycle are
    taken while the total stays within the cap (the fast plan itself when none fits)."""
    g = problem.graph

    def cuts(plan: Plan) -> set[int]:
        spans = [(min(map(g.index, grp.layers)), max(map(g.index, grp.layers)))
                 for grp in plan.groups]
        return {p for p in range(len(g.layers)) if not any(a <= p < b for a, b in spans)}

    common = sorted(cuts(fast) & cuts(cheap))
    stretches = list(zip([-1, *common], common, strict=False))

    def part(plan: Plan, lo: int, hi: int) -> list[Any]:
        return [grp for grp in plan.groups if lo < g.index(grp.layers[0]) <= hi]

    def total(groups: Sequence[Any]) -> tuple[int, float]:
        return (sum(grp.predicted.cycles for grp in groups),
                sum(grp.predicted.energy_pj for grp in groups))

    gains = []
    for lo, hi in stretches:
        (fc, fe), (cc, ce) = total(part(fast, lo, hi)), total(part(cheap, lo, hi))
        if ce < fe:
            gains.append(((fe - ce) / max(cc - fc, 1), cc - fc, lo, hi))
    chosen: set[tuple[int, int]] = set()
    spent = fast.totals.cycles
    for _, extra, lo, hi in sorted(gains, reverse=True):
        if spent + extra <= cap:
            chosen.add((lo, hi))
            spent += extra
    placements = [grp.placement for lo, hi in stretches
                  for grp in part(cheap if (lo, hi) in chosen else fast, lo, hi)]
    mixed = assemble(g, problem.chip, placements, objective=Objective.ENERGY, solver={},
                     **problem.plan_header(), layer_by_layer=problem.layer_by_layer_bytes)
    return mixed if mixed.totals.cycles <= cap else fast


def non_dominated(plans: Sequence[Plan]) -> list[Plan]:
    """Plans no other plan beats on both cycles and energy, by increasing cycles."""
    keep: list[Plan] = []
    for p in sorted(plans, key=lambda p: (p.totals.cycles, p.totals.energy_pj)):
        if keep and p.totals.energy_pj >= keep[-1].totals.energy_pj:
            continue  # as slow or slower, and no less energy: dominated
        keep.append(p)
    return keep
