"""Non-dominated (cycles, energy) plans: the Pareto front between time and energy by
epsilon constraints, the capped solves warm-started from a blend of the front's two ends or,
where it is cheaper, from the intervals the searches priced, chained under the cap."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
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
        path = capped_path(problem, cache, cap, (fastest, solved))
        if path is not None:  # intervals the searches priced, mixed under the cap
            mixed = _energy_plan(problem, path)
            if mixed.totals.cycles <= cap and mixed.totals.energy_pj < start.totals.energy_pj:
                start = mixed
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
    mixed = _energy_plan(problem, placements)
    return mixed if mixed.totals.cycles <= cap else fast


def _energy_plan(problem: Problem, placements: Sequence[Placement]) -> Plan:
    """Placements priced as a plan for the energy objective: a capped solve's warm start."""
    return assemble(problem.graph, problem.chip, placements, objective=Objective.ENERGY,
                    solver={}, layer_by_layer=problem.layer_by_layer_bytes,
                    **problem.plan_header())


def capped_path(problem: Problem, cache: Mapping[Objective, Any], cap: int,
                plans: Sequence[Plan] = ()) -> list[Placement] | None:
    """The least-energy chain of interval groups whose cycles add up to at most `cap`, from
    the intervals the latency and energy searches priced (each with its best tile for that
    objective) and the groups of `plans` (as those plans run them, a prefetch of their
    weights included): a shortest path under a resource bound, by the non-dominated
    (cycles, energy) labels of each position of the layer order. A capped solve's warm
    start where it is cheaper than the front's two ends mixed under the cap. A group's cycles
    depend on the group before it (its weights may load during that group), so the
    caller prices the chain and checks it. None where no chain fits."""
    order = [lay.name for lay in problem.graph.layers]
    at = {name: i for i, name in enumerate(order)}
    priced: list[tuple[int, float, Placement]] = []
    for objective in (Objective.LATENCY, Objective.ENERGY):
        memo = cache[objective][0] if objective in cache else {}
        priced += [(choice.cost.cycles, choice.cost.energy_pj, choice.placement(layers))
                   for layers, choice in memo.items() if choice is not None]
    priced += [(group.predicted.cycles, group.predicted.energy_pj, group.placement)
               for plan in plans for group in plan.groups]
    edges: dict[int, list[tuple[int, int, float, Placement]]] = {}
    for c, e, placement in priced:
        layers = tuple(placement.layers)
        a = at.get(layers[0], -1)
        if tuple(order[a:a + len(layers)]) == layers:  # an interval of the order
            edges.setdefault(a, []).append((a + len(layers), c, e, placement))
    Label = tuple[int, float, tuple[Placement, ...]]
    labels: list[list[Label]] = [[] for _ in range(len(order) + 1)]
    labels[0] = [(0, 0.0, ())]
    for a in range(len(order)):
        for cycles, energy, chain in _front(labels[a]):
            for b, c, e, placement in edges.get(a, ()):
                if cycles + c <= cap:
                    labels[b].append((cycles + c, energy + e, (*chain, placement)))
        labels[a] = []
    end = _front(labels[len(order)])
    return list(min(end, key=lambda label: label[1])[2]) if end else None


def _front(labels: Sequence[tuple[int, float, Any]], most: int | None = 256
           ) -> list[tuple[int, float, Any]]:
    """The (cycles, energy, ...) labels no other beats on both, by increasing cycles; at most
    `most` of them (None: all), evenly spread along the front (the cheapest always kept)."""
    keep: list[tuple[int, float, Any]] = []
    for label in sorted(labels, key=lambda x: (x[0], x[1])):
        if not keep or label[1] < keep[-1][1]:  # cheaper than every faster one kept
            keep.append(label)
    if most is not None and len(keep) > most:
        step = len(keep) / most
        keep = [keep[int(i * step)] for i in range(most - 1)] + [keep[-1]]
    return keep


def non_dominated(plans: Sequence[Plan]) -> list[Plan]:
    """Plans no other plan beats on both cycles and energy, by increasing cycles."""
    return [p for _, _, p in _front([(p.totals.cycles, p.totals.energy_pj, p) for p in plans],
                                    most=None)]
