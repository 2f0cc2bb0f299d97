"""Plans: ordered fusion groups with their tiles and predicted counters; JSON in and out."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from math import ceil
from pathlib import Path
from typing import Any, Literal

from hardware.chip import Chip
from planner.bands import bands_problem
from planner.cost import (
    Counters,
    compulsory_bytes,
    group_cost,
    prefetch_cycles,
    weight_bytes,
    with_time,
)
from planner.errors import InputError, PlanningError
from planner.ir import Graph
from planner.regions import Box, Tile, anchor_extent, group_io

PLAN_VERSION = 1
Mode = Literal["big", "small"]


@dataclass(frozen=True)
class Group:
    """Layers executed as one unit: inputs from DRAM, intermediates on chip, outputs back."""

    id: int
    layers: tuple[str, ...]
    tile: Tile
    mode: Mode
    weights_resident: bool
    predicted: Counters
    double_buffered: bool = False  # a second input buffer prefetches the next tile
    # explicit anchor boxes (n0, n1, r0, r1, c0, c1) of a parameter table, run in this order
    # instead of the regular grid of `tile` (dynamic plans, seed 002)
    boxes: tuple[Box, ...] | None = None
    # halos: "recompute" (overlapping tiles reload and recompute their borders) or "reuse"
    # (row tiles run in order and keep the border rows of every tensor on chip)
    halo_reuse: bool = False
    # its weights loaded while the previous group computed (planner.cost.prefetch_cycles)
    prefetch: bool = False

    @property
    def fused(self) -> bool:
        return len(self.layers) > 1


@dataclass(frozen=True)
class Plan:
    """A complete plan: every layer of the model in exactly one group, groups in execution order."""

    groups: tuple[Group, ...]
    model: Mapping[str, Any]  # path, sha256, inputs
    hardware: Mapping[str, Any]  # name, file
    rules: Mapping[str, Any]  # file, sha256
    objective: str
    solver: Mapping[str, Any]  # name, status, gap, wall_s
    totals: Counters = field(default_factory=Counters)
    compulsory_dram_bytes: int = 0
    layer_by_layer_dram_bytes: int = 0


def group_mode(graph: Graph, layers: Sequence[str], tile: Tile) -> Mode:
    """Small-map mode when the tile holds whole feature maps (only the batch is split)."""
    _, h, w = anchor_extent(graph, group_io(graph, layers))
    return "small" if tile.h >= h and tile.w >= w else "big"


def make_group(graph: Graph, gid: int, layers: Sequence[str], tile: Tile, chip: Chip,
               weights_resident: bool = True, double_buffered: bool = False,
               halo_reuse: bool = False) -> Group:
    """A group with its predicted counters from the cost model."""
    ordered = tuple(sorted(layers, key=graph.index))
    if halo_reuse:
        check_reuse_tile(graph, ordered, tile, "plan")
    check_bands(graph, ordered, tile, chip, halo_reuse, "plan")
    return Group(gid, ordered, tile, group_mode(graph, ordered, tile), weights_resident,
                 group_cost(graph, ordered, tile, chip, weights_resident, double_buffered,
                            halo_reuse),
                 double_buffered, halo_reuse=halo_reuse)


def prefetch_eligible(graph: Graph, groups: Sequence[Sequence[str]]) -> list[bool]:
    """Per group (in execution order), whether the planners may prefetch its weights behind
    the group before it: both are intervals of the topological order, adjacent, and no
    group spans the first one (then the second surely runs right after it, which is what
    CP-SAT can state without knowing the execution order)."""
    spans = [(min(map(graph.index, g)), max(map(graph.index, g)), len(g)) for g in groups]
    out = [False]
    for (a0, a1, na), (b0, b1, nb) in zip(spans, spans[1:], strict=False):
        intervals = a1 - a0 + 1 == na and b1 - b0 + 1 == nb
        spanned = any(c0 < a0 and c1 > a1 for c0, c1, _ in spans)
        out.append(intervals and b0 == a1 + 1 and not spanned)
    return out


def prefetch_fits(graph: Graph, chip: Chip, prev: Group, nxt: Group) -> bool:
    """The next group's weights fit on chip beside the previous group (capacity bounds, as
    CP-SAT: solver.tiles.prefetch_room)."""
    from planner.regions import group_chains
    from rules.base import GroupFacts
    from solver.tiles import prefetch_room

    io = group_io(graph, prev.layers)
    facts = GroupFacts(graph, io, group_chains(graph, io), prev.tile, chip,
                       prev.weights_resident, prev.double_buffered, prev.halo_reuse)
    return weight_bytes(graph, group_io(graph, nxt.layers).weights, chip) <= prefetch_room(facts)


def with_prefetch(graph: Graph, chip: Chip, groups: Sequence[Group]) -> tuple[Group, ...]:
    """The groups with each one's weights prefetched behind the group before it wherever
    that is allowed, fits and hides at least a cycle (it never costs anything)."""
    out = list(groups)
    for k, ok in enumerate(prefetch_eligible(graph, [g.layers for g in groups])):
        if not ok or out[k].boxes is not None or out[k - 1].boxes is not None:
            continue
        prev, g = out[k - 1], out[k]
        w = weight_bytes(graph, group_io(graph, g.layers).weights, chip)
        hidden = prefetch_cycles(chip, prev.predicted, prev.double_buffered, w)
        if hidden and prefetch_fits(graph, chip, prev, g):
            out[k] = replace(g, predicted=with_time(chip, g.predicted, g.double_buffered, hidden),
                             prefetch=True)
    return tuple(out)


def check_reuse_tile(graph: Graph, layers: Sequence[str], tile: Tile, source: str) -> None:
    """Halo reuse runs the tiles of one batch in order: a tile must span the whole batch."""
    n, _, _ = anchor_extent(graph, group_io(graph, layers))
    if tile.n < n:
        raise InputError(f"{source}: group starting at '{layers[0]}' reuses halos with tile "
                         f"{tile.n}x{tile.h}x{tile.w}; halo reuse needs tiles over the whole "
                         f"batch ({n} images). Use \"halo\": \"recompute\".")


def check_bands(graph: Graph, layers: Sequence[str], tile: Tile, chip: Chip, halo_reuse: bool,
                source: str) -> None:
    """Bands split halo-reusing tiles among the chip's cores (planner.bands)."""
    if tile.bands == 1:
        return
    columns = ceil(anchor_extent(graph, group_io(graph, layers))[2] / tile.w)
    problem = ("bands need halo reuse" if not halo_reuse
               else bands_problem(chip, tile.bands, columns))
    if problem:
        raise InputError(f"{source}: group starting at '{layers[0]}' runs in {tile.bands} "
                         f"bands on chip {chip.name}, but {problem}. Use \"bands\": 1 or "
                         "solve again for this chip.")


def whole_tile(graph: Graph, layers: Sequence[str]) -> Tile:
    """The tile covering the whole anchor (one tile)."""
    n, h, w = anchor_extent(graph, group_io(graph, layers))
    return Tile(n, h, w)


def execution_order(graph: Graph, groups: Sequence[Sequence[str]]) -> list[tuple[str, ...]]:
    """Groups sorted so every group runs after the groups producing its inputs."""
    import networkx as nx

    owner = {name: i for i, g in enumerate(groups) for name in g}
    dag = nx.DiGraph()
    dag.add_nodes_from(range(len(groups)))
    for a, b in graph.dag.edges:
        if owner[a] != owner[b]:
            dag.add_edge(owner[a], owner[b])
    if not nx.is_directed_acyclic_graph(dag):
        raise InputError("the plan's groups depend on each other in a cycle: a group must be "
                         "convex (no path leaves it and comes back).")
    first = {i: min(graph.index(n) for n in g) for i, g in enumerate(groups)}
    order = nx.lexicographical_topological_sort(dag, key=first.__getitem__)
    return [tuple(groups[i]) for i in order]


Placement = tuple[Any, ...]  # (layers, tile, weights_resident[, double_buffered[, reuse]])


def assemble(graph: Graph, chip: Chip, groups: Sequence[Placement], *,
             model: Mapping[str, Any], hardware: Mapping[str, Any], rules: Mapping[str, Any],
             objective: str, solver: Mapping[str, Any]) -> Plan:
    """Build a Plan from (layers, tile, weights_resident[, double_buffered]), in execution order."""
    info = {tuple(sorted(g[0], key=graph.index)):
            (g[1], g[2], bool(g[3]) if len(g) > 3 else False, bool(g[4]) if len(g) > 4 else False)
            for g in groups}
    ordered = execution_order(graph, list(info))
    made = with_prefetch(graph, chip, [make_group(graph, i, g, *info[g][:1], chip, *info[g][1:])
                                       for i, g in enumerate(ordered)])
    check_cover(graph, [g.layers for g in made], source="plan")
    totals = Counters()
    for g in made:
        totals = totals + g.predicted
    return Plan(made, model, hardware, rules, objective, solver, totals,
                compulsory_bytes(graph, chip), layer_by_layer_bytes(graph, chip))


def check_order(graph: Graph, groups: Sequence[Sequence[str]], source: str) -> None:
    """Groups run in the order given: each must find its inputs already in DRAM."""
    ready = set(graph.inputs)
    for i, layers in enumerate(groups):
        io = group_io(graph, layers)
        missing = [t for t in io.inputs if t not in ready]
        if missing:
            raise InputError(f"{source}: group {i} (starting at '{layers[0]}') reads "
                             f"'{missing[0]}' before any earlier group writes it; list the "
                             "groups in execution order.")
        ready.update(t for name in io.layers for t in graph.layer(name).outputs)


def layer_placements(graph: Graph, chip: Chip) -> list[Placement]:
    """No fusion: every layer alone, whole where it fits the chip, else at its best tile.
    Raises PlanningError naming a layer that fits at no tile."""
    from rules.ruleset import RuleSet
    from solver.shortest_path import infeasible_layer_error
    from solver.tiles import GroupSearch

    out: list[Placement] = []
    for lay in graph.layers:
        alone = (lay.name,)
        search = GroupSearch.of(graph, alone, chip, RuleSet(()))
        whole = whole_tile(graph, alone)
        fits = [r for r in (True, False) if not search.violations(whole, r)]
        if fits:
            out.append((alone, whole, fits[0]))
            continue
        best = search.best("traffic")
        if best is None:
            raise infeasible_layer_error(graph, chip, RuleSet(()), lay.name)
        out.append((alone, best.tile, best.resident, best.double_buffered, best.halo_reuse))
    return out


def layer_by_layer_bytes(graph: Graph, chip: Chip) -> int:
    """DRAM bytes with no fusion (the `layer` planner's plan); 0 when a layer fits nowhere."""
    try:
        placements = layer_placements(graph, chip)
    except PlanningError:
        return 0
    return sum(group_cost(graph, p[0], p[1], chip, *p[2:]).dram_bytes for p in placements)


def check_cover(graph: Graph, groups: Sequence[Sequence[str]], source: str) -> None:
    """Every layer of the model in exactly one group, and no unknown layer."""
    seen: dict[str, int] = {}
    known = {lay.name for lay in graph.layers}
    for i, g in enumerate(groups):
        for name in g:
            if name not in known:
                raise InputError(f"{source}: group {i} names layer '{name}', which the model does "
                                 "not have. Was the plan made for another model?")
            if name in seen:
                raise InputError(f"{source}: layer '{name}' is in group {seen[name]} and group "
                                 f"{i}; each layer must be in exactly one group.")
            seen[name] = i
    missing = [n for n in known if n not in seen]
    if missing:
        raise InputError(f"{source}: layer '{missing[0]}' (and {len(missing) - 1} more) is in no "
                         "group; a plan must cover every layer exactly once.")


def layer_plan(graph: Graph, chip: Chip, *, model: Mapping[str, Any],
               hardware: Mapping[str, Any], rules: Mapping[str, Any] | None = None,
               objective: str = "traffic") -> Plan:
    """The layer-by-layer plan: no fusion, every layer whole where it fits the chip."""
    return assemble(graph, chip, layer_placements(graph, chip), model=model, hardware=hardware,
                    rules=rules or {}, objective=objective,
                    solver={"name": "layer", "status": "OPTIMAL", "gap": 0.0, "wall_s": 0.0})


# --- JSON --------------------------------------------------------------------------------


def _counters_json(c: Counters) -> dict[str, Any]:
    doc: dict[str, Any] = {f.name: getattr(c, f.name) for f in fields(c)}
    doc["energy_pj"] = round(c.energy_pj, 3)
    return doc


def plan_to_json(plan: Plan) -> dict[str, Any]:
    """The plan as the JSON document of CONTRACT.md."""
    t = plan.totals
    return {
        "fuseplan_plan": PLAN_VERSION,
        "model": dict(plan.model),
        "hardware": dict(plan.hardware),
        "rules": dict(plan.rules),
        "objective": plan.objective,
        "solver": dict(plan.solver),
        "groups": [
            {
                "id": g.id,
                "layers": list(g.layers),
                "fused": g.fused,
                "mode": g.mode,
                "tile": {"n": g.tile.n, "h": g.tile.h, "w": g.tile.w,
                         **({"bands": g.tile.bands} if g.tile.bands > 1 else {})},
                "weights_resident": g.weights_resident,
                "double_buffered": g.double_buffered,
                "halo": "reuse" if g.halo_reuse else "recompute",
                "prefetch": g.prefetch,
                "predicted": _counters_json(g.predicted),
            }
            for g in plan.groups
        ],
        "totals": {
            "dram_read_bytes": t.dram_read_bytes,
            "dram_write_bytes": t.dram_write_bytes,
            "dram_bytes": t.dram_bytes,
            "weight_read_bytes": t.weight_read_bytes,
            "redundant_read_bytes": t.redundant_read_bytes,
            "sram_peak_bytes": t.sram_peak_bytes,
            "compulsory_dram_bytes": plan.compulsory_dram_bytes,
            "layer_by_layer_dram_bytes": plan.layer_by_layer_dram_bytes,
            "macs": t.macs,
            "vector_ops": t.vector_ops,
            "cycles": t.cycles,
            "energy_pj": round(t.energy_pj, 3),
        },
    }


def save_plan(plan: Plan, path: Path) -> None:
    """Write a plan file."""
    path.write_text(json.dumps(plan_to_json(plan), indent=2) + "\n")


def _field(doc: Mapping[str, Any], key: str, where: str, kind: type | tuple[type, ...]) -> Any:
    if key not in doc:
        raise InputError(f"{where}: missing required key '{key}'. Regenerate the plan with "
                         "`fuseplan solve ... -o PLAN.json`.")
    value = doc[key]
    if not isinstance(value, kind):
        raise InputError(f"{where}: '{key}' has the wrong type ({type(value).__name__}).")
    return value


def load_plan(path: Path, graph: Graph, chip: Chip, model_sha256: str) -> Plan:
    """Read a plan file for `graph`; predicted counters are kept as written (verify checks them)."""
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise InputError(f"{path}: no such plan file. Create one with "
                         "`fuseplan solve MODEL -o PLAN.json`.") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: not a JSON plan file ({exc}). Create one with "
                         "`fuseplan solve MODEL -o PLAN.json`.") from None
    where = str(path)
    if not isinstance(doc, dict) or doc.get("fuseplan_plan") != PLAN_VERSION:
        raise InputError(f"{where}: not a fuseplan plan (expected \"fuseplan_plan\": "
                         f"{PLAN_VERSION}).")
    model = _field(doc, "model", where, dict)
    if model.get("sha256") != model_sha256:
        raise InputError(
            f"{where}: the plan was made for a different model (sha256 {model.get('sha256')!s:.12} "
            f"vs this model's {model_sha256:.12}). Solve this model again to get its plan."
        )
    groups = []
    for i, g in enumerate(_field(doc, "groups", where, list)):
        gw = f"{where}: groups[{i}]"
        layers = tuple(_field(g, "layers", gw, list))
        td = _field(g, "tile", gw, dict)
        try:
            tile = Tile(int(td["n"]), int(td["h"]), int(td["w"]), int(td.get("bands", 1)))
        except (KeyError, TypeError, ValueError):
            raise InputError(f"{gw}: 'tile' needs integer n, h and w (and bands).") from None
        if min(tile.n, tile.h, tile.w, tile.bands) < 1:
            raise InputError(f"{gw}: tile sizes must be at least 1 (bands too), got {tile}.")
        pd = g.get("predicted", {})
        if not isinstance(pd, dict):
            raise InputError(f"{gw}: 'predicted' must be a mapping of counters.")
        bad = [k for k in Counters.__dataclass_fields__
               if k in pd and (isinstance(pd[k], bool) or not isinstance(pd[k], int | float))]
        if bad:
            raise InputError(f"{gw}: predicted counter '{bad[0]}' must be a number, got "
                             f"{pd[bad[0]]!r}. Regenerate the plan with `fuseplan solve`.")
        predicted = Counters(**{k: pd[k] for k in Counters.__dataclass_fields__ if k in pd})
        halo = g.get("halo", "recompute")
        if halo not in ("recompute", "reuse"):
            raise InputError(f"{gw}: 'halo' must be \"recompute\" or \"reuse\", got {halo!r}.")
        if halo == "reuse":
            check_reuse_tile(graph, layers, tile, gw)
        elif tile.bands > 1:
            raise InputError(f"{gw}: {tile.bands} bands need \"halo\": \"reuse\" (bands are "
                             "strips of halo-reusing tiles); set \"bands\": 1.")
        groups.append(Group(int(g.get("id", i)), layers, tile, g.get("mode", "big"),
                            bool(g.get("weights_resident", True)), predicted,
                            bool(g.get("double_buffered", False)), halo_reuse=halo == "reuse",
                            prefetch=bool(g.get("prefetch", False))))
    check_cover(graph, [g.layers for g in groups], source=where)
    check_order(graph, [g.layers for g in groups], where)
    totals = Counters()
    for grp in groups:
        totals = totals + grp.predicted
    t = doc.get("totals", {})
    return Plan(tuple(groups), model, doc.get("hardware", {}), doc.get("rules", {}),
                doc.get("objective", "traffic"), doc.get("solver", {}), totals,
                int(t.get("compulsory_dram_bytes", 0)), int(t.get("layer_by_layer_dram_bytes", 0)))
