"""Seed 004: the best grouping of consecutive layers as a shortest path.

Nodes are the cut positions 0..N of the topological order; an edge i -> j means
"layers i+1..j form one group", weighted by that group's best cost under the
rules and the objective. On a chain network these intervals are all the convex
groups there are, so the shortest path is the optimum (CP-SAT must agree).
"""

from __future__ import annotations

import networkx as nx

from hardware.chip import Chip
from planner.errors import PlanningError
from planner.ir import Graph
from planner.regions import Tile
from rules.base import StructuralRule
from rules.ruleset import RuleSet
from solver.groups import is_connected
from solver.tiles import GroupSearch, TileChoice, objective_units

_UNSEEN = object()  # not in the memo


def breaks_structure(search: GroupSearch, ruleset: RuleSet) -> bool:
    """A fused group that breaks a structural rule, which no tile can mend.

    Checked before the tile search: most intervals of a blocky network (DenseNet: 84 %)
    cut a block or hold too few main layers, and the tile search would try every tile
    height to find none passes.
    """
    if len(search.layers) < 2:
        return False
    facts = search.facts(Tile(1, 1, 1), True)
    return any(r.check(facts) is not None for r in ruleset.enabled
               if isinstance(r, StructuralRule))


def infeasible_layer_error(graph: Graph, chip: Chip, ruleset: RuleSet, name: str) -> PlanningError:
    """The error for a layer that fits the chip at no tile, with the bytes over."""
    search = GroupSearch.of(graph, (name,), chip, ruleset)
    search = search.at_batch(search.batch_options()[-1])
    smallest = search.tile_of(search.heights()[-1])
    worst = max(search.violations(smallest, False),
                key=lambda v: (v.needed or 0) - (v.allowed or 0))
    over = int((worst.needed or 0) - (worst.allowed or 0))
    return PlanningError(
        f"layer '{name}' ({graph.layer(name).op}) cannot fit the chip '{chip.name}' even alone at "
        f"the smallest tile {smallest.n}x{smallest.h}x{smallest.w}: {worst.name.upper()} needs "
        f"{int(worst.needed or 0)} B but has {int(worst.allowed or 0)} B ({over} B over). Use a "
        "chip with more on-chip memory (e.g. --set sram.bytes=...) or a smaller input shape."
    )


def shortest_path_groups(graph: Graph, chip: Chip, ruleset: RuleSet, objective: str,
                         memo: dict[tuple[str, ...], TileChoice | None] | None = None
                         ) -> list[tuple[tuple[str, ...], TileChoice]]:
    """Best grouping into intervals of the topological order.

    ``memo`` collects each interval's best tile, None where no tile passes (CP-SAT reuses
    them as its cuts). An interval already there (planned in another subgraph of the same
    model) is not searched again; one with a tile has its structure checked again, since this
    graph may see blocks the other did not (one with none stays out: a graph that sees fewer
    blocks keeps the whole model's rules)."""
    order = [lay.name for lay in graph.layers]
    limit = ruleset.search.max_group_layers
    dag = nx.DiGraph()
    choice: dict[tuple[int, int], TileChoice] = {}
    for i in range(len(order)):
        for j in range(i + 1, min(len(order), i + limit) + 1):
            layers = tuple(order[i:j])
            if j - i > 1 and not is_connected(graph, layers):
                continue
            cached = memo.get(layers, _UNSEEN) if memo is not None else _UNSEEN
            if cached is None and j - i > 1:
                continue
            search = GroupSearch.of(graph, layers, chip, ruleset)
            if breaks_structure(search, ruleset):
                best = None
            elif isinstance(cached, TileChoice):
                best = cached
            else:
                best = search.best(objective)
            if memo is not None:
                memo[layers] = best
            if best is None:
                if j - i == 1:
                    raise infeasible_layer_error(graph, chip, ruleset, layers[0])
                continue
            choice[i, j] = best
            dag.add_edge(i, j, weight=objective_units(best.cost, objective, ruleset, chip))
    path = nx.shortest_path(dag, 0, len(order), weight="weight")
    return [(tuple(order[a:b]), choice[a, b]) for a, b in zip(path, path[1:], strict=False)]
