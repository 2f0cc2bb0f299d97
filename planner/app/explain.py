"""Why a plan looks the way it does: boundaries, layers, and a re-check of every group."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from fuseplan.hardware.chip import Chip
from fuseplan.planner.core.errors import PlanningError
from fuseplan.planner.cost.objective import Objective, objective_value
from fuseplan.planner.geometry.regions import Tile
from fuseplan.planner.ir.graph import Graph
from fuseplan.planner.plan.data import Group, Plan
from fuseplan.planner.plan.mode import ModeKind, mode_kind
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
    """Every group of the plan against every enabled rule and the chip's capacities, each
    checked the way its mode runs (one check per kind of mode, as the cost model prices it
    and the emulator runs it)."""
    found = []
    for g in plan.groups:
        check = _RECHECK[mode_kind(graph, g.layers, g.placement.mode)]
        found += [(g.id, v) for v in check(graph, g, chip, ruleset)]
    return found


def _passes_violations(graph: Graph, g: Group, chip: Chip, ruleset: RuleSet) -> list[Violation]:
    """Each pass against the tile rules, the whole group structurally; each pass's
    stretches in the placement's hidden chunks."""
    p = g.placement
    passes = PassSearch.of(graph, g.layers, chip, p.inputs_held, p.maps_held)
    if passes is None:  # the plan reader and the assembler refuse such a mode
        raise PlanningError(f"group {g.id} cannot run in {p.passes} passes")
    whole = GroupSearch.of(graph, g.layers, chip, ruleset).facts(Tile(1, 1, 1), True)
    k = p.hidden_chunks
    return passes.physical(g.tile.h, g.double_buffered, k) \
        + passes.rule_violations(g.tile.h, g.double_buffered, ruleset.enabled, whole, k)


def _head_violations(graph: Graph, g: Group, chip: Chip, ruleset: RuleSet) -> list[Violation]:
    """A lone fused attention in head chunks: capacities from its exact peak."""
    search = GroupSearch.of(graph, g.layers, chip, ruleset)
    return search.head_violations(g.tile, g.double_buffered, g.placement.hidden_chunks)


def _hidden_violations(graph: Graph, g: Group, chip: Chip, ruleset: RuleSet) -> list[Violation]:
    """Capacities from the exact peak, rules with chunk-wide maps."""
    p = g.placement
    hidden = HiddenSearch.of(graph, g.layers, chip, reload=p.inputs_reloaded)
    if hidden is None:  # the plan reader and the assembler refuse such a mode
        raise PlanningError(f"group {g.id} has no stretch to run in hidden chunks")
    k = p.hidden_chunks
    return hidden.physical(g.tile, g.weights_resident, g.double_buffered, k) \
        + hidden.rule_violations(g.tile, g.weights_resident, g.double_buffered, k,
                                 ruleset.enabled)


def _tile_violations(graph: Graph, g: Group, chip: Chip, ruleset: RuleSet) -> list[Violation]:
    """Tiles outer or weights outer: the group's facts in its mode (a weights-outer layer
    holds two of its weight chunks, not its whole weights)."""
    search = GroupSearch.of(graph, g.layers, chip, ruleset)
    return search.violations(g.tile, g.weights_resident, None, g.halo_reuse,
                             g.double_buffered, weights_outer=g.placement.weights_outer)


_RECHECK: dict[ModeKind, Callable[[Graph, Group, Chip, RuleSet], list[Violation]]] = {
    ModeKind.TILES: _tile_violations,
    ModeKind.WEIGHTS_OUTER: _tile_violations,
    ModeKind.PASSES: _passes_violations,
    ModeKind.HEAD_CHUNKS: _head_violations,
    ModeKind.HIDDEN: _hidden_violations,
}


def group_facts(graph: Graph, plan: Plan, chip: Chip, gid: int) -> GroupFacts:
    """Facts of one planned group, for reports."""
    g = plan.groups[gid]
    search = GroupSearch.of(graph, g.layers, chip, RuleSet(()))
    return search.facts(g.tile, g.weights_resident)
