"""Plan files: the JSON document of CONTRACT.md, written and read back."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

from hardware.chip import Chip
from planner.core.errors import InputError
from planner.cost.model import Counters
from planner.cost.objective import Objective
from planner.geometry.regions import Tile
from planner.ir.graph import Graph
from planner.plan.checks import check_cover, check_order, check_reuse_tile
from planner.plan.data import PLAN_VERSION, Group, Plan
from planner.plan.placement import HaloMode, Placement, WeightResidency


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
        placement = Placement(layers, tile,
                              WeightResidency.of(bool(g.get("weights_resident", True))),
                              bool(g.get("double_buffered", False)), HaloMode(halo),
                              bool(g.get("prefetch", False)))
        groups.append(Group(int(g.get("id", i)), placement, g.get("mode", "big"), predicted))
    check_cover(graph, [g.layers for g in groups], source=where)
    check_order(graph, [g.layers for g in groups], where)
    totals = Counters()
    for grp in groups:
        totals = totals + grp.predicted
    t = doc.get("totals", {})
    objective = doc.get("objective", "traffic")
    if objective not in {o.value for o in Objective}:
        raise InputError(f"{where}: 'objective' must be one of "
                         f"{', '.join(o.value for o in Objective)}, got {objective!r}.")
    return Plan(tuple(groups), model, doc.get("hardware", {}), doc.get("rules", {}),
                Objective(objective), doc.get("solver", {}), totals,
                int(t.get("compulsory_dram_bytes", 0)), int(t.get("layer_by_layer_dram_bytes", 0)))
