"""Plan files: the JSON document of CONTRACT.md, written and read back."""

from __future__ import annotations

import hashlib
import json
import os
import stat
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from fuseplan.hardware.chip import Chip
from fuseplan.planner.core.errors import InputError, PlanningError
from fuseplan.planner.core.files import Input, check_input, write_atomic
from fuseplan.planner.cost.model import Counters
from fuseplan.planner.cost.objective import Objective
from fuseplan.planner.geometry.regions import Tile
from fuseplan.planner.ir.chunks import chunk_axes
from fuseplan.planner.ir.graph import Graph
from fuseplan.planner.plan import schema
from fuseplan.planner.plan.checks import check_cover, check_order, check_reuse_tile, whole_tile
from fuseplan.planner.plan.data import PLAN_VERSION, Group, Plan
from fuseplan.planner.plan.io_bounds import IOBounds
from fuseplan.planner.plan.mode import HaloMode, LoopOrder, Mode, WeightResidency, mode_problem
from fuseplan.planner.plan.placement import Placement


def _counters_json(c: Counters) -> dict[str, Any]:
    # array MACs only where a chip has an array, link bytes only where clusters split a
    # group: other plans read as they always did
    doc: dict[str, Any] = {name: getattr(c, name) for name in schema.PREDICTED.names
                           if name not in ("array_macs", "cluster_link_bytes")
                           or getattr(c, name)}
    doc["energy_pj"] = round(c.energy_pj, 3)
    return doc


def _totals_json(plan: Plan) -> dict[str, Any]:
    t = plan.totals
    stated = {**_counters_json(t), "dram_bytes": t.dram_bytes,
              "compulsory_dram_bytes": plan.compulsory_dram_bytes,
              "layer_by_layer_dram_bytes": plan.layer_by_layer_dram_bytes}
    return {k: stated[k] for k in schema.TOTALS.names if k in stated}


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
                **({"end_chunks": g.placement.end_chunks}
                   if g.placement.end_chunks > 1 else {}),
                **({"cluster_split": True} if g.placement.cluster_split else {}),
                **({"keys_spilled": True} if g.placement.keys_spilled else {}),
                **({"keys_in_wram": True} if g.placement.keys_in_wram else {}),
                "predicted": _counters_json(g.predicted),
            }
            for g in plan.groups
        ],
        "totals": _totals_json(plan),
        **({"io_bounds": _io_bounds_json(plan.io_bounds, plan.totals.dram_bytes)}
           if plan.io_bounds is not None else {}),
    }


def _io_bounds_json(bounds: IOBounds, dram_bytes: int) -> dict[str, Any]:
    """A plan's "io_bounds" (planner.plan.io_bounds): each fused attention's analytic count, a
    prefill's I/O bound and a decode step's caches, each with the plan's DRAM over it."""
    doc: dict[str, Any] = {"attentions": [
        {"layer": a.layer, "group": a.group, "q_bytes": a.q_bytes, "kv_bytes": a.kv_bytes,
         "passes": a.passes, "kv_read_bytes": a.kv_reads, "o_bytes": a.o_bytes,
         "analytic_bytes": a.total, "group_dram_bytes": a.group_dram_bytes}
        for a in bounds.attentions]}
    if bounds.io_bound_bytes is not None:
        doc["io_bound_bytes"] = bounds.io_bound_bytes
        doc["x_io_bound"] = round(dram_bytes / max(bounds.io_bound_bytes, 1), 4)
    if bounds.cache is not None:
        c = bounds.cache
        doc["kv_cache"] = {"caches": c.caches, "read_bytes": c.read_bytes,
                           "new_bytes": c.new_bytes, "ideal_bytes": c.ideal_bytes,
                           "x_ideal": round(dram_bytes / max(c.ideal_bytes, 1), 4)}
    return doc


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


def _loop(g: dict[str, Any], where: str) -> LoopOrder:
    """A group's "loop_order" as a value (what the group can run: planner.plan.mode)."""
    stated = g.get("loop_order", LoopOrder.TILES_OUTER.value)
    if stated not in {o.value for o in LoopOrder}:
        raise InputError(f"{where}.loop_order is {stated!r}; use one of "
                         f"{', '.join(o.value for o in LoopOrder)}.")
    return LoopOrder(stated)


def _mode(g: dict[str, Any], halo: str, where: str) -> Mode:
    """A group's mode as the plan file states it (checked by mode_problem after)."""
    return Mode(WeightResidency.of(g.get("weights_resident", True)),
                bool(g.get("double_buffered", False)), HaloMode(halo), _loop(g, where),
                int(g.get("passes", 1)), bool(g.get("inputs_held", False)),
                int(g.get("hidden_chunks", 1)), bool(g.get("maps_held", False)),
                bool(g.get("inputs_reloaded", False)), int(g.get("end_chunks", 1)),
                bool(g.get("cluster_split", False)), bool(g.get("keys_spilled", False)),
                bool(g.get("keys_in_wram", False)))


PLAN_FIX = "Pass a plan file written by `fuseplan solve MODEL -o PLAN.json`."


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
    # a device, a FIFO or an oversized file is refused by stat, before it is opened
    check_input(Input("", path, "plan file", schema.MAX_PLAN_BYTES, PLAN_FIX))
    doc = schema.read_plan_doc(path)
    return plan_from_doc(doc, graph, model_sha256, str(path), check_stated_totals)


def changed_in_place(recorded: str | None, where: str, model_sha256: str) -> bool:
    """Whether the model file a plan records (``model.path``, relative to the working
    directory or to the plan's folder) now holds the model of sha256 `model_sha256`: the
    model was edited in place, or replaced, since the plan was made (rather than another
    model passed). Only a regular file is read."""
    if not recorded:
        return False
    path = Path(recorded)
    for candidate in (path,) if path.is_absolute() else (path, Path(where).parent / path):
        try:
            if not stat.S_ISREG(os.stat(candidate).st_mode):
                continue
            digest = hashlib.sha256()
            with open(candidate, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    digest.update(block)
        except OSError:
            continue
        return digest.hexdigest() == model_sha256
    return False


def plan_from_doc(doc: Mapping[str, Any], graph: Graph, model_sha256: str, where: str,
                  check_stated_totals: bool = True) -> Plan:
    """A Plan from a document that passed schema.validate."""
    model = doc["model"]
    if model["sha256"] != model_sha256 and changed_in_place(model.get("path"), where,
                                                             model_sha256):
        raise InputError(
            f"{where}: the model {model['path']} was changed since this plan was made (the "
            f"plan records sha256 {model['sha256']:.12}, the file now holds "
            f"{model_sha256:.12}). Solve it again to plan the model as it is now: "
            f"`fuseplan solve {model['path']} -o PLAN.json`."
        )
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
        chunks = _chunks(graph, g, layers, gw)
        mode = _mode(g, halo, gw)
        problem = mode_problem(graph, layers, tile, mode, whole,
                               tuple(g.get("weight_chunks", {})))
        if problem is not None:
            raise InputError(f"{gw}.{problem}")
        placement = Placement(layers, tile, mode, g.get("prefetch", False), chunks)
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
