"""Group shape checks shared by the planners: convexity and connectedness."""

from __future__ import annotations

from collections.abc import Collection

import networkx as nx

from fuseplan.planner.geometry.regions import Tile
from fuseplan.planner.ir.graph import Graph
from fuseplan.rules.ruleset import RuleSet
from fuseplan.solver.tiles import GroupSearch


def is_convex(graph: Graph, layers: Collection[str]) -> bool:
    """No path leaves the group and comes back (else it could not run as one unit)."""
    members = set(layers)
    first = min(graph.index(n) for n in members)
    last = max(graph.index(n) for n in members)
    # only layers between the group's first and last position can sit on such a path
    frontier = [s for n in members for s in graph.dag.successors(n) if s not in members]
    seen: set[str] = set()
    while frontier:
        node = frontier.pop()
        if node in seen or graph.index(node) > last:
            continue
        seen.add(node)
        for s in graph.dag.successors(node):
            if s in members:
                return False
            frontier.append(s)
    return first <= last


def connected_intervals(graph: Graph, most: int) -> set[tuple[int, int]]:
    """Every interval [i, j) of the layer order, at most `most` layers long (views ride
    along free: Graph.interval_ends), whose layers form
    one weakly connected piece (is_connected for all of them at once: each start adds its
    layers one by one to a union-find, so a deep network's thousands of intervals take
    milliseconds). Intervals of a topological order are convex, so these are candidates."""
    order = [lay.name for lay in graph.layers]
    near = [[graph.index(m) for m in (*graph.dag.predecessors(n), *graph.dag.successors(n))]
            for n in order]
    out: set[tuple[int, int]] = set()
    ends = graph.interval_ends(most)
    for i in range(len(order)):
        parent: dict[int, int] = {}
        pieces = 0
        for j in range(i, ends[i]):
            parent[j] = j
            pieces += 1
            for k in near[j]:
                if i <= k < j and (a := _root(parent, k)) != (b := _root(parent, j)):
                    parent[a] = b
                    pieces -= 1
            if pieces == 1:
                out.add((i, j + 1))
    return out


def _root(parent: dict[int, int], x: int) -> int:
    """x's representative in a union-find, halving the path on the way."""
    while parent[x] != x:
        parent[x] = parent[parent[x]]
        x = parent[x]
    return x


def is_connected(graph: Graph, layers: Collection[str]) -> bool:
    """The group's layers form one weakly connected piece."""
    return nx.is_weakly_connected(graph.dag.subgraph(layers)) if layers else False


def breaks_structure(search: GroupSearch, ruleset: RuleSet) -> bool:
    """A fused group that breaks a structural rule, which no tile can mend.

    Checked before the tile search: most intervals of a blocky network (DenseNet: 84 %)
    cut a block or hold too few main layers, and the tile search would try every tile
    height to find none passes.
    """
    if len(search.layers) < 2:
        return False
    facts = search.facts(Tile(1, 1, 1), True)
    return any(r.check(facts) is not None for r in ruleset.enabled if r.is_structural)
