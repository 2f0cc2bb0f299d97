"""Views ride along free: search.max_group_layers counts the layers of a group that compute,
not the Reshapes, Transposes, Squeezes and Expands between them (planner.ir.ops.VIEW_OPS),
so a transformer's head splits do not crowd its norms and scales out of a group."""

from __future__ import annotations

from pathlib import Path

from hand import assert_verifies

from fuseplan.planner.app import api
from fuseplan.planner.ir.ops import VIEW_OPS

import models


def test_interval_ends_are_the_longest_intervals_within_the_limit(tmp_path: Path) -> None:
    """For every start and limit, the end Graph.interval_ends gives holds at most `limit`
    layers that are not views and at most a third more in all, and one layer more would
    break one of the two (or there is none)."""
    g = api.prepare(str(models.save(models.batch_first_mha(batch=2), tmp_path, "mha"))).graph
    order = [lay.name for lay in g.layers]
    views = sum(lay.op in VIEW_OPS for lay in g.layers)
    assert 0 < views < len(order)
    for limit in range(1, 16):
        ends = g.interval_ends(limit)
        for i, j in enumerate(ends):
            most = limit + limit // 3
            assert j > i and g.group_size(order[i:j]) <= limit and j - i <= most
            assert j == len(order) or g.group_size(order[i:j + 1]) > limit or j - i == most
        assert g.interval_ends(limit) is ends  # worked out once per limit


def test_views_do_not_count_toward_the_group_limit(tmp_path: Path) -> None:
    """An attention of 34 layers, 15 of them views, under a limit of 8 layers: the plans of
    both planners have groups longer than 8 layers, none with more than 8 that compute;
    they agree on the bytes and verify."""
    path = models.save(models.batch_first_mha(batch=2), tmp_path, "mha")
    rules = models.fusing_rules(tmp_path, {"max_group_layers: 12": "max_group_layers: 8"})
    problem = api.prepare(str(path), rules=rules)
    g = problem.graph
    plans = [api.plan_problem(problem, solver) for solver in ("shortest-path", "cpsat")]
    for plan in plans:
        sizes = [(len(grp.layers), g.group_size(grp.layers)) for grp in plan.groups]
        assert all(size <= 8 for _, size in sizes)
        assert any(length > 8 for length, _ in sizes), sizes
    assert plans[0].totals.dram_bytes == plans[1].totals.dram_bytes
    assert_verifies(problem, plans[1])


def test_every_planner_keeps_its_groups_within_the_limit(tmp_path: Path) -> None:
    """Under a limit of 4 with block groups and whole-map groups off, every planner's groups
    of an attention with views hold at most 4 layers that compute and 5 in all, and some
    group holds a view beside 4 that compute (which the limit counted before)."""
    path = models.save(models.batch_first_mha(batch=2), tmp_path, "mha")
    rules = models.fusing_rules(tmp_path, {"max_group_layers: 12": "max_group_layers: 4"})
    problem = api.prepare(str(path), rules=rules)
    g = problem.graph
    for solver in ("greedy", "shortest-path", "cpsat"):
        plan = api.plan_problem(problem, solver)
        assert all(g.within_limit(grp.layers, 4) for grp in plan.groups), solver
        if solver != "greedy":
            assert any(len(grp.layers) > g.group_size(grp.layers) == 4
                       for grp in plan.groups), solver
