"""Plan files: the JSON document of CONTRACT.md, written and read back."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from fuseplan.hardware.chip import Chip
from fuseplan.planner.core.errors import InputError, PlanningError
from fuseplan.planner.core.files import write_atomic
from fuseplan.planner.cost.model import Counters
from fuseplan.planner.cost.objective import Objective
from fuseplan.planner.geometry.attention import attention_heads
from fuseplan.planner.geometry.hidden import makes_chunks, stretches
from fuseplan.planner.geometry.passes import pass_split, pass_stretches
from fuseplan.planner.geometry.regions import Tile, group_io
from fuseplan.planner.geometry.reload import reloaded_inputs
from fuseplan.planner.ir.chunks import chunk_axes
from fuseplan.planner.ir.graph import Graph
from fuseplan.planner.plan import schema
from fuseplan.planner.plan.checks import check_cover, check_order, check_reuse_tile, whole_tile
from fuseplan.planner.plan.data import PLAN_VERSION, Group, Plan
from fuseplan.planner.plan.placement import HaloMode, LoopOrder, Placement, WeightResidency


def _counters_json(c: Counters) -> dict[str, Any]:
    doc: dict[str, Any] = {name: getattr(c, name) for name in schema.PREDICTED.names}
    doc["energy_pj"] = round(c.energy_pj, 3)
    return doc


def _totals_json(plan: Plan) -> dict[str, Any]:
    t = plan.totals
    stated = {**_counters_json(t), "dram_bytes": t.dram_bytes,
              "compulsory_dram_bytes": plan.compulsory_dram_bytes,
              "layer_by_layer_dram_bytes": plan.layer_by_layer_dram_bytes}
    return {k: stated[k] for k in schema.TOTALS.names}


def plan_to_json(plan: Plan) -> dict[str, Any]:
    """The plan as the JSON document of CONTRACT.md, checked against planner.plan.schema
    (what this writes, load_plan reads back)."""
    return schema.validate(_plan_doc(plan), "the plan being written")


def _plan_doc(plan: Plan) -> dict[str, Any]:
    return {
        "fuseplan_plan": PLAN_VERSION,
        "model": dict(plan.model),
        "hardware": dict(plan.hardware),
        "rules": dict(plan.rules),
        "objective": plan.objective.value,
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
                **({"weight_chunks": dict(g.placement.chunks)} if g.placement.chunks else {}),
                **({"loop_order": g.placement.loop.value} if g.placement.weights_outer else {}),
                **({"passes": g.placement.passes} if g.placement.passes > 1 else {}),
                **({"inputs_held": True} if g.placement.inputs_held else {}),
                **({"maps_held": True} if g.placement.maps_held else {}),
                **({"hidden_chunks": g.placement.hidden_chunks}
                   if g.placement.hidden_chunks > 1 else {}),
                **({"inputs_reloaded": True} if g.placement.inputs_reloaded else {}),
                "predicted": _counters_json(g.predicted),
            }
            for g in plan.groups
        ],
        "totals": _totals_json(plan),
    }


def _chunks(graph: Graph, g: dict[str, Any], layers: tuple[str, ...], where: str
            ) -> tuple[tuple[str, int], ...]:
    """A group's "weight_chunks" ({layer: output-channel chunks}) as a placement's."""
    stated = g.get("weight_chunks", {})
    if not isinstance(stated, dict):
        raise InputError(f"{where}.weight_chunks must be an object {{layer: chunks}}; write "
                         "the plan again with `fuseplan solve`.")
    for name, count in stated.items():
        if name not in layers:
            raise InputError(f"{where}.weight_chunks names {name!r}, not a layer of the group; "
                             "remove it.")
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise InputError(f"{where}.weight_chunks.{name} must be a whole number of chunks "
                             f"(1 or more), got {count!r}.")
        split = chunk_axes(graph, graph.layer(name))
        most = split[0] if split is not None else 1
        if count > most:
            raise InputError(f"{where}.weight_chunks.{name} is {count}, but layer {name!r} "
                             f"({graph.layer(name).op}) splits into at most {most} "
                             "output-channel chunks; use at most that.")
    if stated and g.get("weights_resident", True):
        raise InputError(f"{where}.weight_chunks: resident weights are not chunked; remove "
                         "the key or set \"weights_resident\": false.")
    return tuple((name, int(stated[name])) for name in layers if name in stated)


def _loop(graph: Graph, g: dict[str, Any], layers: tuple[str, ...], where: str) -> LoopOrder:
    """A group's "loop_order", checked against what the group can run."""
    stated = g.get("loop_order", LoopOrder.TILES_OUTER.value)
    if stated not in {o.value for o in LoopOrder}:
        raise InputError(f"{where}.loop_order is {stated!r}; use one of "
                         f"{', '.join(o.value for o in LoopOrder)}.")
    loop = LoopOrder(stated)
    if loop is LoopOrder.WEIGHTS_OUTER and (
            len(layers) != 1 or g.get("weights_resident", True)
            or g.get("halo", HaloMode.RECOMPUTE.value) != HaloMode.RECOMPUTE.value
            or chunk_axes(graph, graph.layer(layers[0])) is None):
        raise InputError(f"{where}.loop_order \"weights_outer\" needs one layer whose "
                         "weights can be split into output-channel chunks, streamed "
                         "(\"weights_resident\": false), with halos recomputed; remove the "
                         "key.")
    return loop


def _inputs_held(g: dict[str, Any], passes: int, where: str) -> bool:
    """A group's "inputs_held": only with passes, and single-buffered."""
    held = bool(g.get("inputs_held", False))
    if held and (passes == 1 or g.get("double_buffered", False)):
        raise InputError(f"{where}.inputs_held holds a group's inputs across its pooling "
                         "passes, single-buffered: it needs \"passes\" above 1 and "
                         "\"double_buffered\": false; remove the key or set those.")
    return held


def _maps_held(graph: Graph, g: dict[str, Any], layers: tuple[str, ...], passes: int,
               where: str) -> bool:
    """A group's "maps_held": only with passes, and only where every map the group pools
    is made inside it and stays there."""
    held = bool(g.get("maps_held", False))
    if not held:
        return False
    if passes == 1:
        raise InputError(f"{where}.maps_held keeps each pooled map on chip for the later "
                         "pooling passes: it needs \"passes\" above 1; remove the key or set "
                         "it.")
    if pass_split(graph, layers, bool(g.get("inputs_held", False)), True) is None:
        raise InputError(f"{where}.maps_held: a map this group pools is one of its inputs or "
                         "also leaves the group, so it cannot be held as it is made; remove "
                         "the key (\"inputs_held\": true holds inputs).")
    return True


def _inputs_reloaded(graph: Graph, g: dict[str, Any], layers: tuple[str, ...], chunks: int,
                     passes: int, where: str) -> bool:
    """A group's "inputs_reloaded": only with hidden chunks, one pass and one input buffer,
    and only where an input is read before a stretch and after it
    (planner.geometry.reload)."""
    if not bool(g.get("inputs_reloaded", False)):
        return False
    if chunks == 1 or passes > 1 or bool(g.get("double_buffered", False)):
        raise InputError(f"{where}.inputs_reloaded loads inputs again after a stretch run in "
                         "hidden chunks: it needs \"hidden_chunks\" above 1, no \"passes\" "
                         "and \"double_buffered\": false; remove the key or change those.")
    if not reloaded_inputs(graph, group_io(graph, layers)):
        raise InputError(f"{where}.inputs_reloaded: no input of this group is read both "
                         "before and after one of its stretches (and by none of their "
                         "layers), so none can be loaded again; remove the key.")
    return True


def _passes(graph: Graph, g: dict[str, Any], layers: tuple[str, ...], tile: Tile,
            where: str) -> int:
    """A group's "passes" (1, or one per global reduction and one more), checked against
    what it can run."""
    passes = int(g.get("passes", 1))
    if passes == 1:
        return 1
    split = pass_split(graph, layers)
    if split is None:
        raise InputError(f"{where}.passes is {passes}, but the group holds no global reduction "
                         "whose result feeds back into it on per-image vectors (a "
                         "squeeze-excite pool and scale); remove the key.")
    whole = whole_tile(graph, layers)
    if split.count != passes:
        raise InputError(f"{where}.passes is {passes}, but the group's {split.count - 1} "
                         f"reductions make {split.count} passes; write {split.count}.")
    if not g.get("weights_resident", True) or g.get("halo", "recompute") != "recompute" \
            or g.get("loop_order", LoopOrder.TILES_OUTER.value) != LoopOrder.TILES_OUTER.value \
            or tile.bands > 1 or (tile.n, tile.w) != (whole.n, whole.w):
        raise InputError(f"{where}.passes {passes} runs with resident weights, halos recomputed, "
                         "tiles outer, no bands, and tiles of every image at full width; set "
                         "those or remove the key.")
    return passes


def _hidden_chunks(graph: Graph, g: dict[str, Any], layers: tuple[str, ...], tile: Tile,
                   passes: int, where: str) -> int:
    """A group's "hidden_chunks" (1, or the chunks every stretch of the group runs in),
    checked against what it can run."""
    chunks = int(g.get("hidden_chunks", 1))
    if chunks == 1:
        return 1
    if passes > 1:  # each pass's stretches (planner.geometry.passes.pass_stretches)
        split = pass_split(graph, layers, bool(g.get("inputs_held", False)),
                           bool(g.get("maps_held", False)))
        found = tuple(s for ss in pass_stretches(graph, split) for s in ss) \
            if split is not None else ()
    else:
        io = group_io(graph, layers)
        heads = attention_heads(graph, io)
        if heads is not None:  # a lone fused attention: chunks of its heads
            if heads % chunks or g.get("halo", "recompute") != "recompute" or tile.bands > 1 \
                    or g.get("loop_order", LoopOrder.TILES_OUTER.value) \
                    != LoopOrder.TILES_OUTER.value:
                raise InputError(f"{where}.hidden_chunks is {chunks}, but the fused attention "
                                 f"{layers[0]!r} runs its {heads} heads in chunks that divide "
                                 "them, halos recomputed, tiles outer; use a divisor of "
                                 f"{heads} or remove the key.")
            return chunks
        found = stretches(graph, io)
    if not found:
        raise InputError(f"{where}.hidden_chunks is {chunks}, but the group holds no stretch "
                         "to chunk (a layer widening the channels, per-element layers, a "
                         "layer summing them back: an MLP, an expand / project pair); remove "
                         "the key.")
    for s in found:
        if not makes_chunks(s, chunks):
            units = "heads" if s.cuts else "hidden channels"  # attention: chunks of heads
            raise InputError(f"{where}.hidden_chunks is {chunks}, but the stretch from "
                             f"{s.widen!r} has {s.channels} {units}, which do not make "
                             f"{chunks} chunks of ceil({s.channels} / {chunks}); use a count "
                             f"that does (e.g. {max(1, s.channels // 2)} or a power of two "
                             f"below {s.channels}).")
    if g.get("halo", "recompute") != "recompute" or tile.bands > 1 \
            or g.get("loop_order", LoopOrder.TILES_OUTER.value) != LoopOrder.TILES_OUTER.value:
        raise InputError(f"{where}.hidden_chunks {chunks} runs with halos recomputed, tiles "
                         "outer and no bands; set those or remove the key.")
    cut = [n for n in g.get("weight_chunks", {}) if any(n in s.layers for s in found)]
    if cut:
        raise InputError(f"{where}.weight_chunks names {cut[0]!r}, whose weights the hidden "
                         "chunks cut; remove it from weight_chunks.")
    return chunks


def save_plan(plan: Plan, path: Path) -> None:
    """Write a plan file."""
    write_atomic(path, json.dumps(plan_to_json(plan), indent=2) + "\n", "plan file")


def load_plan(path: Path, graph: Graph, chip: Chip, model_sha256: str,
              check_stated_totals: bool = True) -> Plan:
    """Read a plan file for `graph`, validated against planner.plan.schema (InputError with
    the JSON path of a bad value). Predicted counters are kept as written (verify re-derives
    them); stated totals that the plan's own groups contradict are a PlanningError naming
    the field, unless `check_stated_totals` is off (verify reports them in its report:
    planner.app.integrity)."""
    doc = schema.read_plan_doc(path)
    return plan_from_doc(doc, graph, model_sha256, str(path), check_stated_totals)


def plan_from_doc(doc: Mapping[str, Any], graph: Graph, model_sha256: str, where: str,
                  check_stated_totals: bool = True) -> Plan:
    """A Plan from a document that passed schema.validate."""
    model = doc["model"]
    if model["sha256"] != model_sha256:
        made_for = f"{model['path']}, " if model.get("path") else ""
        raise InputError(
            f"{where}: this plan was made for a different model ({made_for}sha256 "
            f"{model['sha256']:.12} vs this model's {model_sha256:.12}). Pass that model "
            "instead. Solve this model again to get its plan."
        )
    known = {lay.name for lay in graph.layers}
    for i, g in enumerate(doc["groups"]):
        for j, name in enumerate(g["layers"]):
            if name not in known:
                raise InputError(f"{where}: groups[{i}].layers[{j}] names layer {name!r}, which "
                                 "the model does not have. Was the plan made for another "
                                 "model? `fuseplan inspect MODEL` lists its layers.")
    check_cover(graph, [g["layers"] for g in doc["groups"]], source=where)
    groups = []
    for i, g in enumerate(doc["groups"]):
        gw = f"{where}: groups[{i}]"
        layers = tuple(g["layers"])
        td = g["tile"]
        tile = Tile(td["n"], td["h"], td["w"], td.get("bands", 1))
        whole = whole_tile(graph, layers)
        for axis in ("n", "h", "w"):
            if getattr(tile, axis) > getattr(whole, axis):
                raise InputError(f"{gw}.tile.{axis} is {getattr(tile, axis)}, larger than the "
                                 f"group's output ({getattr(whole, axis)}); use at most "
                                 f"{getattr(whole, axis)}.")
        pd = g.get("predicted", {})
        predicted = Counters(**{k: pd[k] for k in schema.PREDICTED.names if k in pd})
        halo = g.get("halo", HaloMode.RECOMPUTE.value)
        if halo == HaloMode.REUSE:
            check_reuse_tile(graph, layers, tile, gw)
        elif tile.bands > 1:
            raise InputError(f"{gw}: {tile.bands} bands need \"halo\": \"reuse\" (bands are "
                             "strips of halo-reusing tiles); set \"bands\": 1.")
        placement = Placement(layers, tile,
                              WeightResidency.of(g.get("weights_resident", True)),
                              g.get("double_buffered", False), HaloMode(halo),
                              g.get("prefetch", False), _chunks(graph, g, layers, gw),
                              _loop(graph, g, layers, gw),
                              (passes := _passes(graph, g, layers, tile, gw)),
                              _inputs_held(g, passes, gw),
                              (chunks := _hidden_chunks(graph, g, layers, tile, passes, gw)),
                              _maps_held(graph, g, layers, passes, gw),
                              _inputs_reloaded(graph, g, layers, chunks, passes, gw))
        groups.append(Group(g["id"], placement, g.get("mode", "big"), predicted))
    check_order(graph, [g.layers for g in groups], where)
    totals = Counters()
    for grp in groups:
        totals = totals + grp.predicted
    stated = doc.get("totals", {})
    if check_stated_totals:
        # a total is the sum of the groups' counters: check it where every group states its
        # part (CONTRACT.md requires only some counters per group)
        everywhere = {k for k in schema.PREDICTED.names
                      if all(k in g.get("predicted", {}) for g in doc["groups"])}
        check_totals({k: v for k, v in stated.items()
                      if k not in schema.PREDICTED.names or k in everywhere}, totals, where)
    if "energy_pj" in stated:  # the groups' energies are rounded; the total is stated once
        totals = replace(totals, energy_pj=stated["energy_pj"])
    return Plan(tuple(groups), model, doc.get("hardware", {}), doc.get("rules", {}),
                Objective(doc.get("objective", Objective.TRAFFIC.value)), doc.get("solver", {}),
                totals, stated.get("compulsory_dram_bytes", 0),
                stated.get("layer_by_layer_dram_bytes", 0))


def check_totals(stated: Mapping[str, Any], summed: Counters, where: str) -> None:
    """The plan's stated integer totals against the sum of its groups (energy is compared
    by verify, which re-derives it): PlanningError naming the first that differs."""
    for key in schema.TOTALS.names:
        if key in stated and hasattr(summed, key) and key != "energy_pj":
            want = getattr(summed, key)
            if stated[key] != want:
                raise PlanningError(f"{where}: totals.{key} says {stated[key]:,}, the plan's "
                                    f"groups give {want:,}. The plan file was edited or "
                                    "damaged; write it again with `fuseplan solve`.")
