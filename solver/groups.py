"""Group shape checks shared by the planners: convexity and connectedness."""

from __future__ import annotations

from collections.abc import Collection

import networkx as nx

from planner.geometry.regions import Tile
from planner.ir.graph import Graph
from rules.ruleset import RuleSet
from solver.tiles import GroupSearch


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
