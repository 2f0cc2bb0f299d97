"""Why a plan looks the way it does: boundaries and what binds them (the planner's own checks,
with the numbers and what would lift them), layers, and a re-check of every group."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import Any

from fuseplan.hardware.chip import Chip
from fuseplan.planner.core.errors import InputError, PlanningError
from fuseplan.planner.core.units import size_setting, vs_bytes
from fuseplan.planner.cost.objective import Objective, objective_value
from fuseplan.planner.geometry.regions import Tile, group_chains, group_io
from fuseplan.planner.ir.graph import Graph
from fuseplan.planner.plan.data import Group, Plan
from fuseplan.planner.plan.mode import ModeKind, mode_kind
from fuseplan.rules.base import GroupFacts, Violation
from fuseplan.rules.ruleset import RuleSet
from fuseplan.solver.ends import EndSearch
from fuseplan.solver.groups import is_connected, is_convex
from fuseplan.solver.hidden import HiddenSearch
from fuseplan.solver.passes import PassSearch
from fuseplan.solver.spilled_keys import spilled_violations
from fuseplan.solver.tiles import GroupSearch


@dataclass
class Boundary:
    """What stops group `group` from taking in the layer `next_layer`: the reasons in words
    and, where a rule or a capacity binds, its violation (with the numbers)."""

    group: int
    next_layer: str
    reasons: list[str] = field(default_factory=list)
    binds: list[Violation] = field(default_factory=list)
    # the objective with the layer moved into the group and as planned, where it could move
    costs: tuple[float, float] | None = None


_LEVELS = ("sram", "nram", "wram")
_BYTES_SAID = re.compile(r"\d B\b|\d(?:\.\d+)? [KMG]iB\b")


def in_bytes(v: Violation, chip: Chip) -> bool:
    """Whether the violation's numbers (needed, allowed) are bytes: a capacity of the chip,
    or a rule that speaks of bytes."""
    return v.rule == "HW" or _level_of(v, chip) is not None or bool(_BYTES_SAID.search(v.message))


def _level_of(v: Violation, chip: Chip) -> str | None:
    """The chip memory whose capacity the violation's `allowed` is (``sram``, ``nram``,
    ``wram``), or None."""
    if v.rule == "HW" and v.name in _LEVELS:
        return v.name
    for level in _LEVELS:
        mem = getattr(chip, level, None)
        if mem is not None and v.allowed is not None and mem.bytes - 1 <= v.allowed <= mem.bytes \
                and level.upper() in v.message.upper():
            return level
    return None


def remedy(v: Violation, chip: Chip, ruleset: RuleSet) -> str:
    """What would lift the violation, short: a chip capacity large enough for what is needed
    (``--set sram.bytes=36KiB``), a rule's setting in the rules file (``redundancy:
    threshold_pct: 188 (now 100)``), or the rule turned off (``small_map off``)."""
    level = _level_of(v, chip)
    if level is not None and v.needed is not None:
        chip_fix = f"--set {level}.bytes={size_setting(v.needed)}"
        return chip_fix if v.rule == "HW" else f"{chip_fix}, or {v.name} off"
    rule = next((r for r in ruleset.rules if r.code == v.rule), None)
    if rule is not None and v.needed is not None and v.allowed is not None:
        for f in fields(rule):  # type: ignore[arg-type]
            value = getattr(rule, f.name)
            if f.name != "enabled" and isinstance(value, int | float) \
                    and not isinstance(value, bool) and value == v.allowed:
                need = v.needed if isinstance(value, float) else int(-(-v.needed // 1))
                return f"{v.name}: {f.name}: {need:g} (now {value:g}), or {v.name} off"
    if rule is not None:
        return f"{v.name} off"
    return "a larger chip (--set), or a tile the group's layers allow"


def lift(binds: list[Violation], chip: Chip, ruleset: RuleSet) -> list[str]:
    """The changes that lift every violation of a boundary at once: each chip memory raised
    to the most any of them needs, and the rules that do not speak of a capacity relaxed."""
    most: dict[str, float] = {}
    rest = []
    for v in binds:
        level = _level_of(v, chip)
        if level is not None and v.needed is not None:
            most[level] = max(most.get(level, 0), v.needed)
        else:
            rest.append(remedy(v, chip, ruleset).split(", or ")[0])
    return [f"--set {level}.bytes={size_setting(need)}" for level, need in most.items()] + rest


def describe(v: Violation, chip: Chip) -> tuple[str, str]:
    """(needed, available) of a violation as people read them: bytes with their unit."""
    if v.needed is not None and v.allowed is not None and in_bytes(v, chip):
        return vs_bytes(v.needed, v.allowed)
    return tuple("-" if x is None else f"{x:,.4g}"  # type: ignore[return-value]
                 for x in (v.needed, v.allowed))


def _grow_reasons(graph: Graph, chip: Chip, ruleset: RuleSet, layers: tuple[str, ...],
                  rest: tuple[str, ...], objective: Objective, current_cost: float
                  ) -> tuple[list[str], list[Violation], tuple[float, float] | None]:
    """Why `layers` (a group plus the next layer) is not a group of the plan, in words and
    as the violations that bind, and when the layer could move, the objective with it moved
    and as planned; `rest` is what would remain of the next layer's group."""
    if not is_connected(graph, layers):
        return ["not connected: the layer does not consume anything of the group"], [], None
    if not is_convex(graph, layers):
        return ["not convex: a path would leave the group and come back"], [], None
    search = GroupSearch.of(graph, layers, chip, ruleset)
    best = search.best(objective)
    if best is not None:
        grown = objective_value(best.cost, objective, ruleset.objective)
        left = GroupSearch.of(graph, rest, chip, ruleset).best(objective) \
            if rest and is_connected(graph, rest) else None
        if rest and left is None:
            return [f"allowed, but what would remain of the next group ({len(rest)} layers) "
                    "is not a valid group on its own"], [], None
        after = grown + (objective_value(left.cost, objective, ruleset.objective) if left else 0)
        verdict = "not better" if after >= current_cost else "better: the planner missed it"
        moved, planned = vs_bytes(after, current_cost) if objective == Objective.TRAFFIC \
            else (f"{after:,.0f}", f"{current_cost:,.0f}")
        return [f"allowed, {verdict}: {objective} {moved} with the layer moved vs {planned} "
                "as planned"], [], (after, current_cost)
    heights = search.heights()
    found: dict[str, Violation] = {}
    for th in (heights[-1], heights[0]):  # capacities bind at the top, halos at the bottom
        for v in search.violations(search.tile_of(th), True):
            found.setdefault(v.name, v)
    binds = list(found.values())
    return [str(v) for v in binds] or ["no tile fits the chip"], binds, None


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
        reasons, binds, costs = _grow_reasons(graph, chip, ruleset, layers, rest,
                                              plan.objective, current)
        out.append(Boundary(g.id, nxt, reasons, binds, costs))
    return out


def recheck(graph: Graph, plan: Plan, chip: Chip, ruleset: RuleSet) -> list[tuple[int, Violation]]:
    """Every group of the plan against the chip's capacities and, if fused, every enabled
    rule (a layer alone is always allowed, in any mode), each checked the way its mode runs
    (one check per kind of mode, as the cost model prices it and the emulator runs it)."""
    found = []
    alone = replace(ruleset, rules=())  # rules bind fused groups only, in every mode
    for g in plan.groups:
        check = _RECHECK[mode_kind(graph, g.layers, g.placement.mode)]
        found += [(g.id, v) for v in check(graph, g, chip, ruleset if g.fused else alone)]
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


def _end_violations(graph: Graph, g: Group, chip: Chip, ruleset: RuleSet) -> list[Violation]:
    """Capacities from the exact peak, rules with the input and output a chunk wide."""
    io = group_io(graph, g.layers)
    ends = EndSearch.of(graph, io, group_chains(graph, io), chip)
    if ends is None:  # the plan reader and the assembler refuse such a mode
        raise PlanningError(f"group {g.id} has no ends to stream in chunks")
    k = g.placement.end_chunks
    return ends.physical(g.tile, g.weights_resident, k) \
        + ends.rule_violations(g.tile, g.weights_resident, k, ruleset.enabled)


def _tile_violations(graph: Graph, g: Group, chip: Chip, ruleset: RuleSet) -> list[Violation]:
    """Tiles outer, weights outer or split over the clusters: the group's facts in its mode
    (a weights-outer layer holds two of its weight chunks, not its whole weights; a split
    cluster its share of them, and a split group spilling its kept keys one chunk of them)."""
    search = GroupSearch.of(graph, g.layers, chip, ruleset)
    if g.placement.keys_spilled:  # split over the clusters, its kept keys spilled
        return spilled_violations(search, g.tile, double_buffered=g.double_buffered,
                                  split=True)
    return search.violations(g.tile, g.weights_resident, None, g.halo_reuse,
                             g.double_buffered, weights_outer=g.placement.weights_outer,
                             cluster_split=g.placement.cluster_split,
                             keys_in_wram=g.placement.keys_in_wram)


def _spilled_violations(graph: Graph, g: Group, chip: Chip, ruleset: RuleSet
                        ) -> list[Violation]:
    """Kept keys spilled: the facts of its spilled grid (one chunk of earlier keys held)."""
    search = GroupSearch.of(graph, g.layers, chip, ruleset)
    return spilled_violations(search, g.tile, double_buffered=g.double_buffered)


_RECHECK: dict[ModeKind, Callable[[Graph, Group, Chip, RuleSet], list[Violation]]] = {
    ModeKind.TILES: _tile_violations,
    ModeKind.WEIGHTS_OUTER: _tile_violations,
    ModeKind.CLUSTER_SPLIT: _tile_violations,
    ModeKind.PASSES: _passes_violations,
    ModeKind.HEAD_CHUNKS: _head_violations,
    ModeKind.HIDDEN: _hidden_violations,
    ModeKind.ENDS: _end_violations,
    ModeKind.KEYS_SPILLED: _spilled_violations,
}


def group_facts(graph: Graph, plan: Plan, chip: Chip, gid: int) -> GroupFacts:
    """Facts of one planned group, for reports."""
    g = plan.groups[gid]
    search = GroupSearch.of(graph, g.layers, chip, RuleSet(()))
    return search.facts(g.tile, g.weights_resident)


def _violation_doc(v: Violation, chip: Chip, ruleset: RuleSet) -> dict[str, Any]:
    """A violation in JSON: its rule, numbers (exact), words and what would lift it."""
    needed, available = describe(v, chip)
    return {"rule": v.rule, "name": v.name, "message": v.message, "needed": v.needed,
            "allowed": v.allowed, "bytes": in_bytes(v, chip), "fix": remedy(v, chip, ruleset),
            "shown": {"needed": needed, "allowed": available}}


def _layer_doc(plan: Plan, chip: Chip, layer: str, where: str) -> dict[str, Any]:
    """Where a layer is: its group, the group's mode and tile, and the on-chip memory the
    group's tile needs against what the chip has (the planner's own counts)."""
    owner = next((g for g in plan.groups if layer in g.layers), None)
    if owner is None:
        raise InputError(f"{where}: no layer named '{layer}' in the plan. "
                         "`fuseplan inspect MODEL` lists the layer names.")
    memories = [{"memory": "sram", "needed": owner.predicted.sram_peak_bytes,
                 "available": chip.sram.bytes, "per": "cluster"}]
    return {"name": layer, "group": owner.id, "group_layers": list(owner.layers),
            "fused": owner.fused, "mode": owner.mode, "tile": owner.tile.label(),
            "memories": memories}


def explain_doc(graph: Graph, plan: Plan, chip: Chip, ruleset: RuleSet, layer: str | None,
                where: str) -> dict[str, Any]:
    """``fuseplan explain``'s document: each boundary with its reasons and the violations that
    bind it (numbers and a fix), a re-check of every group, and with `layer` where that
    layer is and the boundaries around its group (`where` names the plan in errors)."""
    result: dict[str, Any] = {
        "boundaries": [{"group": b.group, "next_layer": b.next_layer, "reasons": b.reasons,
                        "binds": [_violation_doc(v, chip, ruleset) for v in b.binds],
                        "lift": lift(b.binds, chip, ruleset),
                        "moved_cost": None if b.costs is None else b.costs[0],
                        "planned_cost": None if b.costs is None else b.costs[1]}
                       for b in boundaries(graph, plan, chip, ruleset)],
        "violations": [{"group": gid, **_violation_doc(v, chip, ruleset)}
                       for gid, v in recheck(graph, plan, chip, ruleset)],
    }
    if layer is not None:
        result["layer"] = _layer_doc(plan, chip, layer, where)
        mine = set(result["layer"]["group_layers"])
        result["boundaries"] = [b for b in result["boundaries"]
                                if b["group"] == result["layer"]["group"]
                                or b["next_layer"] in mine]
    return result
