"""Why a plan looks the way it does: boundaries, layers, and a re-check of every group."""

from __future__ import annotations

from dataclasses import dataclass, field

from fuseplan.hardware.chip import Chip
from fuseplan.planner.cost.objective import Objective, objective_value
from fuseplan.planner.geometry.attention import attention_heads
from fuseplan.planner.geometry.regions import Tile
from fuseplan.planner.ir.graph import Graph
from fuseplan.planner.plan.data import Plan
from fuseplan.rules.base import GroupFacts, Violation
from fuseplan.rules.ruleset import RuleSet
from fuseplan.solver.groups import is_connected, is_convex
from fuseplan.solver.hidden import HiddenSearch
from fuseplan.solver.passes import PassSearch
from fuseplan.solver.tiles import GroupSearch


@dataclass
class Boundary:
    """What stops group `group` from taking in the layer `next_layer`."""

    group: int
    next_layer: str
    reasons: list[str] = field(default_factory=list)


def _grow_reasons(graph: Graph, chip: Chip, ruleset: RuleSet, layers: tuple[str, ...],
                  rest: tuple[str, ...], objective: Objective, current_cost: float) -> list[str]:
    """Why `layers` (a group plus the next layer) is not a group of the plan; `rest` is what
    would remain of the next layer's group."""
    if not is_connected(graph, layers):
        return ["not connected: the layer does not consume anything of the group"]
    if not is_convex(graph, layers):
        return ["not convex: a path would leave the group and come back"]
    search = GroupSearch.of(graph, layers, chip, ruleset)
    best = search.best(objective)
    if best is not None:
        grown = objective_value(best.cost, objective, ruleset.objective)
        left = GroupSearch.of(graph, rest, chip, ruleset).best(objective) \
            if rest and is_connected(graph, rest) else None
        if rest and left is None:
            return [f"allowed, but what would remain of the next group ({len(rest)} layers) "
                    "is not a valid group on its own"]
        after = grown + (objective_value(left.cost, objective, ruleset.objective) if left else 0)
        verdict = "not better" if after >= current_cost else "better: the planner missed it"
        return [f"allowed, {verdict}: {objective} {after:.0f} with the layer moved vs "
                f"{current_cost:.0f} as planned"]
    heights = search.heights()
    found: dict[str, Violation] = {}
    for th in (heights[-1], heights[0]):  # capacities bind at the top, halos at the bottom
        for v in search.violations(search.tile_of(th), True):
            found.setdefault(v.name, v)
    return [str(v) for v in found.values()] or ["no tile fits the chip"]


def boundaries(graph: Graph, plan: Plan, chip: Chip, ruleset: RuleSet) -> list[Boundary]:
    """For each group, why it did not take in the next layer after it."""
    owner = {n: g for g in plan.groups for n in g.layers}
    out = []
    for g in plan.groups:
        last = max(graph.index(n) for n in g.layers)
        if last + 1 >= len(graph.layers):
            continue
        nxt = graph.layers[last + 1].name
        other = owner[nxt]
        layers = tuple(g.layers) + (nxt,)
        rest = tuple(n for n in other.layers if n != nxt)
        current = (objective_value(g.predicted, plan.objective, ruleset.objective)
                   + objective_value(other.predicted, plan.objective, ruleset.objective))
        out.append(Boundary(g.id, nxt, _grow_reasons(graph, chip, ruleset, layers, rest,
                                                     plan.objective, current)))
    return out


def recheck(graph: Graph, plan: Plan, chip: Chip, ruleset: RuleSet) -> list[tuple[int, Violation]]:
    """Every group of the plan against every enabled rule and the chip's capacities."""
    found = []
    for g in plan.groups:
        search = GroupSearch.of(graph, g.layers, chip, ruleset)
        passes = PassSearch.of(graph, g.layers, chip, g.placement.inputs_held,
                               g.placement.maps_held) \
            if g.placement.passes > 1 else None
        if passes is not None:  # each pass against the tile rules, the whole group structurally
            whole = search.facts(Tile(1, 1, 1), True)
            k = g.placement.hidden_chunks  # each pass's stretches in that many chunks
            found += [(g.id, v) for v in passes.physical(g.tile.h, g.double_buffered, k)
                      + passes.rule_violations(g.tile.h, g.double_buffered, ruleset.enabled,
                                               whole, k)]
            continue
        if g.placement.hidden_chunks > 1 and attention_heads(graph, search.io) is not None:
            # a lone fused attention in head chunks: capacities from its exact peak
            found += [(g.id, v) for v in search.head_violations(
                g.tile, g.double_buffered, g.placement.hidden_chunks)]
            continue
        hidden = HiddenSearch.of(graph, g.layers, chip, reload=g.placement.inputs_reloaded) \
            if g.placement.hidden_chunks > 1 else None
        if hidden is not None:  # capacities from the exact peak, rules with chunk-wide maps
            k = g.placement.hidden_chunks
            found += [(g.id, v) for v in hidden.physical(g.tile, g.weights_resident,
                                                         g.double_buffered, k)
                      + hidden.rule_violations(g.tile, g.weights_resident, g.double_buffered,
                                               k, ruleset.enabled)]
            continue
        for v in search.violations(g.tile, g.weights_resident, None, g.halo_reuse,
                                   g.double_buffered):
            found.append((g.id, v))
    return found


def group_facts(graph: Graph, plan: Plan, chip: Chip, gid: int) -> GroupFacts:
    """Facts of one planned group, for reports."""
    g = plan.groups[gid]
    search = GroupSearch.of(graph, g.layers, chip, RuleSet(()))
    return search.facts(g.tile, g.weights_resident)
