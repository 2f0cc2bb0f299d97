"""What changed between two plans of the same model: groups split, merged, re-tiled; totals.

Groups of plan A and plan B are matched through the layers they share: the connected
components of the "shares a layer" graph between A's and B's groups. A component with one
group on each side is the same group (possibly with another tile); one A group and several B
groups is a split; several A groups and one B group is a merge; several on both sides is a
regrouping (boundaries moved: each A group spread over several B groups is also listed as
split, each B group drawing on several A groups as merged). ``diff_plans`` returns all of
it as one JSON-ready document.
"""

from __future__ import annotations

from typing import Any

import networkx as nx

from fuseplan.planner.core.errors import InputError
from fuseplan.planner.plan.data import Group, Plan

TOTALS = ("dram_bytes", "dram_read_bytes", "dram_write_bytes", "weight_read_bytes",
          "redundant_read_bytes", "cycles", "energy_pj")


def _node(side: str, gid: int) -> tuple[str, int]:
    return (side, gid)


def _overlap_components(plan_a: Plan, plan_b: Plan) -> list[tuple[list[int], list[int]]]:
    """(A group ids, B group ids) per connected component of the shared-layer graph."""
    owner_b = {n: g.id for g in plan_b.groups for n in g.layers}
    links = nx.Graph()
    links.add_nodes_from(_node("a", g.id) for g in plan_a.groups)
    links.add_nodes_from(_node("b", g.id) for g in plan_b.groups)
    for g in plan_a.groups:
        links.add_edges_from((_node("a", g.id), _node("b", owner_b[n])) for n in g.layers)
    order_a = {g.id: i for i, g in enumerate(plan_a.groups)}
    order_b = {g.id: i for i, g in enumerate(plan_b.groups)}
    comps = []
    for comp in nx.connected_components(links):
        a_ids = sorted((gid for side, gid in comp if side == "a"), key=order_a.__getitem__)
        b_ids = sorted((gid for side, gid in comp if side == "b"), key=order_b.__getitem__)
        comps.append((a_ids, b_ids))
    comps.sort(key=lambda c: order_a[c[0][0]] if c[0] else -1)
    return comps


def _check_same_layers(plan_a: Plan, plan_b: Plan) -> None:
    layers_a = {n for g in plan_a.groups for n in g.layers}
    layers_b = {n for g in plan_b.groups for n in g.layers}
    if layers_a != layers_b:
        extra = sorted(layers_a ^ layers_b)
        raise InputError(f"the two plans cover different layers (e.g. '{extra[0]}', "
                         f"{len(extra)} in all): diff plans of the same model.")


def _tile(group: Group) -> dict[str, int]:
    return {"n": group.tile.n, "h": group.tile.h, "w": group.tile.w}


def _same(a: Group, b: Group) -> dict[str, Any]:
    return {"a": a.id, "b": b.id, "layers": len(a.layers), "tile_a": _tile(a),
            "tile_b": _tile(b), "retiled": a.tile != b.tile or a.mode != b.mode,
            "dram_bytes_delta": b.predicted.dram_bytes - a.predicted.dram_bytes}


def _totals(plan_a: Plan, plan_b: Plan) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for key in TOTALS:
        va, vb = getattr(plan_a.totals, key), getattr(plan_b.totals, key)
        if key == "energy_pj":
            va, vb = round(va, 3), round(vb, 3)
        delta = vb - va
        out[key] = {"a": va, "b": vb, "delta": round(delta, 3) if key == "energy_pj" else delta,
                    "ratio": round(vb / va, 6) if va else None}
    out["groups"] = {"a": len(plan_a.groups), "b": len(plan_b.groups),
                     "delta": len(plan_b.groups) - len(plan_a.groups), "ratio": None}
    out["fused_groups"] = {"a": sum(g.fused for g in plan_a.groups),
                           "b": sum(g.fused for g in plan_b.groups), "ratio": None}
    out["fused_groups"]["delta"] = out["fused_groups"]["b"] - out["fused_groups"]["a"]
    return out


def _plan_info(plan: Plan) -> dict[str, Any]:
    return {"solver": dict(plan.solver), "rules": dict(plan.rules),
            "hardware": dict(plan.hardware), "objective": plan.objective.value,
            "groups": len(plan.groups)}


def _spread(src: Plan, dst: Plan) -> dict[int, list[int]]:
    """For each group of ``src``, the ids of the ``dst`` groups holding its layers, in order."""
    owner = {n: g.id for g in dst.groups for n in g.layers}
    order = {g.id: i for i, g in enumerate(dst.groups)}
    return {g.id: sorted({owner[n] for n in g.layers}, key=order.__getitem__)
            for g in src.groups}


def diff_plans(plan_a: Plan, plan_b: Plan) -> dict[str, Any]:
    """What changed from plan A to plan B (same model), as a JSON-ready document.

    Keys: ``a``/``b`` (solver, rules, hardware, objective, group count); ``only_in_a`` and
    ``only_in_b`` (ids of groups whose exact layer set the other plan does not have);
    ``same`` (groups in both, with both tiles and whether they were re-tiled); ``split``
    (``{"a": id, "into": [B ids]}`` for each A group whose layers B spreads over several
    groups); ``merged`` (``{"from": [A ids], "b": id}`` for each B group taking layers of
    several A groups); ``regrouped`` (``{"a": [...], "b": [...]}``: sets of groups reshuffled
    many to many, where boundaries moved; their groups also appear in split/merged);
    ``changed``; and ``totals`` (each counter in A and B, delta B - A and ratio B / A).
    """
    _check_same_layers(plan_a, plan_b)
    by_a = {g.id: g for g in plan_a.groups}
    by_b = {g.id: g for g in plan_b.groups}
    doc: dict[str, Any] = {"a": _plan_info(plan_a), "b": _plan_info(plan_b), "same": [],
                           "regrouped": []}
    for a_ids, b_ids in _overlap_components(plan_a, plan_b):
        if len(a_ids) == 1 and len(b_ids) == 1:
            doc["same"].append(_same(by_a[a_ids[0]], by_b[b_ids[0]]))
        elif len(a_ids) > 1 and len(b_ids) > 1:
            doc["regrouped"].append({"a": a_ids, "b": b_ids})
    doc["split"] = [{"a": gid, "into": into}
                    for gid, into in _spread(plan_a, plan_b).items() if len(into) > 1]
    doc["merged"] = [{"from": parts, "b": gid}
                     for gid, parts in _spread(plan_b, plan_a).items() if len(parts) > 1]
    matched_a = {s["a"] for s in doc["same"]}
    matched_b = {s["b"] for s in doc["same"]}
    doc["only_in_a"] = [g.id for g in plan_a.groups if g.id not in matched_a]
    doc["only_in_b"] = [g.id for g in plan_b.groups if g.id not in matched_b]
    doc["changed"] = bool(doc["only_in_a"] or doc["only_in_b"]
                          or any(s["retiled"] for s in doc["same"]))
    doc["totals"] = _totals(plan_a, plan_b)
    return doc


def group_label(plan: Plan, gid: int) -> str:
    """``G3 conv1 → pool1 (4)`` for a group of a plan, for tables."""
    g = next(x for x in plan.groups if x.id == gid)
    if len(g.layers) == 1:
        return f"G{gid} {g.layers[0]}"
    return f"G{gid} {g.layers[0]} → {g.layers[-1]} ({len(g.layers)})"
