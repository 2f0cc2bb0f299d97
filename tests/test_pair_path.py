"""The shortest path over pairs of consecutive groups (solver.bounded_path.cheapest_pairs)
skips predecessors whose bound cannot beat the best found (PairPricing.least): it returns
what trying every predecessor returns, and the timed pricing's bounds hold on real plans."""

from __future__ import annotations

import itertools
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fuseplan.planner.app.api import plan_problem, prepare
from fuseplan.planner.cost.objective import Objective
from fuseplan.solver import bounded_path
from fuseplan.solver.bounded_path import Edge, cheapest_pairs
from fuseplan.solver.prefetch_path import TimedPricing
from tests import models

CLASSES = 3  # the kinds of successor a predecessor's price tells apart


@dataclass
class TablePricing:
    """Prices from a table: what each (edge, kind) adds before each class of successor,
    and a bound `slack` below the least of them."""

    kinds_of: dict[int, tuple[int, ...]]
    table: dict[tuple[int, int, int | None], int]
    slack: dict[tuple[int, int], int]
    index: dict[int, int]  # id(edge) -> its position in the list

    def kinds(self, e: Edge) -> Sequence[Hashable]:
        return self.kinds_of[self.index[id(e)]]

    def follows(self, b: Edge, kind: Hashable) -> Hashable:
        assert isinstance(kind, int)
        return (b.end - b.start + kind) % CLASSES

    def adds(self, a: Edge, kind: Hashable, after: Hashable | None) -> tuple[int, int]:
        assert isinstance(kind, int) and (after is None or isinstance(after, int))
        return self.table[self.index[id(a)], kind, after], kind

    def least(self, a: Edge, kind: Hashable) -> int:
        assert isinstance(kind, int)
        k = self.index[id(a)]
        return min(self.table[k, kind, c] for c in (*range(CLASSES), None)) \
            - self.slack[k, kind]


@st.composite
def pair_problems(draw: st.DrawFn) -> tuple[list[Edge], int, TablePricing]:
    end = draw(st.integers(2, 6))
    spans = [(i, j) for i in range(end) for j in range(i + 1, min(end, i + 3) + 1)]
    chosen = draw(st.lists(st.sampled_from(spans), min_size=1, max_size=len(spans),
                           unique=True))
    edges = [Edge(i, j, tuple(f"l{p}" for p in range(i, j)), None, 0,
                  searched=draw(st.booleans())) for i, j in sorted(chosen)]
    kinds_of, table, slack = {}, {}, {}
    for k in range(len(edges)):
        kinds_of[k] = tuple(sorted(draw(st.sets(st.integers(0, 2), min_size=1, max_size=2))))
        for kind in kinds_of[k]:
            slack[k, kind] = draw(st.integers(0, 3))
            for c in (*range(CLASSES), None):
                table[k, kind, c] = draw(st.integers(0, 12))  # small: ties are common
    return edges, end, TablePricing(kinds_of, table, slack,
                                    {id(e): k for k, e in enumerate(edges)})


def _every_path(edges: list[Edge], end: int, at: int = 0) -> list[list[Edge]]:
    if at == end:
        return [[]]
    return [[e, *rest] for e in edges if e.start == at for rest in _every_path(edges, end, e.end)]


def _priced(path: list[Edge], kinds: Sequence[Hashable], pricing: TablePricing
            ) -> tuple[int, int]:
    """(cost, unsearched edges) of a path run in these kinds."""
    cost = 0
    for k, (e, kind) in enumerate(zip(path, kinds, strict=True)):
        after = None if k + 1 == len(path) else pricing.follows(path[k + 1], kinds[k + 1])
        cost += pricing.adds(e, kind, after)[0]
    return cost, sum(not e.searched for e in path)


@settings(max_examples=300, deadline=None)
@given(problem=pair_problems())
def test_the_pruned_pair_path_is_the_cheapest_of_every_path(
        problem: tuple[list[Edge], int, TablePricing]) -> None:
    """Over every path and every way of running its edges, none costs less than the one
    returned (nor as little with fewer unsearched edges), and the returned way of running
    each edge prices it as the path says; None only where no path reaches the end."""
    edges, end, pricing = problem
    every = [(_priced(p, ks, pricing), p, ks) for p in _every_path(edges, end)
             for ks in itertools.product(*(pricing.kinds(e) for e in p))]
    found = cheapest_pairs(edges, end, pricing)
    if not every:
        assert found is None
        return
    assert found is not None
    path = [e for e, _ in found]
    kinds = [way for _, way in found]  # TablePricing's way of running is its kind
    assert [(e.start, e.end) for e in path] == sorted((e.start, e.end) for e in path)
    assert path[0].start == 0 and path[-1].end == end
    assert _priced(path, kinds, pricing) == min(x[0] for x in every)


@pytest.mark.parametrize("overrides", [[], ["core.macs_per_cycle=32"],
                                       ["core.macs_per_cycle=32", "wram.bytes=2KiB"]])
def test_the_timed_bounds_hold_on_every_pair_of_a_real_search(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, overrides: list[str]) -> None:
    """Each time the latency path runs on a residual network (on the default chip; on one
    whose compute is slow, so groups hide loads behind it; on that one with so little
    weight memory that most groups leave no room for the next one's weights), no edge in
    any state adds less before any successor than TimedPricing.least says, nor before the
    plan's end."""
    checked = [0]

    def checking(edges: Sequence[Edge], end: int, pricing: Any
                 ) -> list[tuple[Edge, int]] | None:
        assert isinstance(pricing, TimedPricing)
        starting: dict[int, list[Edge]] = {}
        for e in edges:
            starting.setdefault(e.start, []).append(e)
        for a in edges:
            for ka in pricing.kinds(a):
                least = pricing.least(a, ka)
                nexts = [pricing.follows(b, kb) for b in starting.get(a.end, ())
                         for kb in pricing.kinds(b)]
                for after in nexts + ([None] if a.end == end else []):
                    assert least <= pricing.adds(a, ka, after)[0], (a.layers, ka, after)
                    checked[0] += 1
        return unchecked(edges, end, pricing)

    unchecked = bounded_path.cheapest_pairs
    monkeypatch.setattr(bounded_path, "cheapest_pairs", checking)
    problem = prepare(str(models.save(models.residual_net(), tmp_path, "residual_net")),
                      overrides=overrides)
    plan = plan_problem(problem, "cpsat", Objective.LATENCY)
    assert plan.solver["status"] == "OPTIMAL"
    assert checked[0] > 100
