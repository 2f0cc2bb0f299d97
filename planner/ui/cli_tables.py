"""The tables and summary lines of the command's answers (``solve``, ``compare``,
``inspect``, ``pareto``, ``partition``, ``table``, ``rules check``), built to fit the
console: 80 columns in the narrow layout, every column in the wide one
(planner.ui.tables). Their ``--json`` documents keep the exact counts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rich.console import Console, RenderableType

from fuseplan.planner.core.units import fmt_bytes, rel_path
from fuseplan.planner.ui.tables import Col, byte_unit, elided, in_unit, table

if TYPE_CHECKING:
    from fuseplan.planner.app.api import Problem
    from fuseplan.planner.plan.data import Group, Plan
    from fuseplan.planner.plan.io_bounds import IOBounds

__all__ = ["attention_lines", "bound_lines", "compare_table", "dynamic_table", "inspect_table",
           "layers_label", "pareto_table", "partition_table", "plan_table", "rules_table",
           "totals_lines"]


def layers_label(layers: Sequence[str]) -> str:
    """One layer's name, or the first and last of several and their count."""
    if len(layers) == 1:
        return layers[0]
    return f"{layers[0]} → {layers[-1]} ({len(layers)})"


def _mode(g: Group, merged: bool) -> str:
    """The group's mode, with its passes, chunks and (merged into it in the narrow layout)
    its halo and weights when they are not the usual."""
    p = g.placement
    parts = [g.mode if p.passes == 1 else f"{g.mode}, {p.passes} passes"]
    if p.maps_held:
        parts.append("maps held")
    if p.hidden_chunks > 1:
        parts.append(f"{p.hidden_chunks} hidden chunks")
    if p.inputs_reloaded:
        parts.append("inputs loaded again")
    if p.end_chunks > 1:
        parts.append(f"{p.end_chunks} end chunks")
    if p.cluster_split:
        parts.append("split over clusters")
    if p.keys_spilled:
        parts.append("keys spilled")
    if p.keys_in_wram:
        parts.append("keys in WRAM")
    if merged and g.halo_reuse:
        parts.append("halo reused")
    if merged and not g.weights_resident:
        parts.append("weights streamed")
    return ", ".join(parts)


def plan_table(plan: Plan, console: Console) -> RenderableType:
    """The groups of a plan: layers, mode, tile and bytes."""
    from fuseplan.planner.ui.tables import wide_layout

    wide = wide_layout(console)
    groups = plan.groups
    dram = byte_unit(g.predicted.dram_bytes for g in groups)
    again = byte_unit(g.predicted.redundant_read_bytes for g in groups)
    sram = byte_unit(g.predicted.sram_peak_bytes for g in groups)
    cols = [Col("#", num=True), Col("layers"), Col("mode"), Col("tile\nn×h×w", num=True),
            Col("halo", wide=True), Col("weights", wide=True),
            Col(f"DRAM\n{dram[0]}", num=True), Col(f"halo\nre-read\n{again[0]}", num=True),
            Col(f"SRAM\npeak\n{sram[0]}", num=True)]
    rows: list[tuple[str, ...]] = [
        (str(g.id), layers_label(g.layers), _mode(g, not wide), g.tile.label(),
         "reuse" if g.halo_reuse else "recompute",
         "resident" if g.weights_resident else "streamed",
         in_unit(g.predicted.dram_bytes, dram),
         in_unit(g.predicted.redundant_read_bytes, again),
         in_unit(g.predicted.sram_peak_bytes, sram)) for g in groups]
    if plan.totals.array_macs:  # an array chip: how much of the array each group keeps busy
        cols.append(Col("array\nutil", num=True))
        rows = [(*row, f"{g.predicted.macs / g.predicted.array_macs:.0%}"
                 if g.predicted.array_macs else "-") for row, g in zip(rows, groups, strict=True)]
    rows, left = elided(rows, len(cols))
    title = (f"{len(groups)} group{'s' * (len(groups) != 1)} ({plan.solver.get('name')}, "
             f"{plan.solver.get('status')})"
             + (f"; {left:,} not shown (the plan file and --json hold every group)"
                if left else ""))
    return table(console, title, cols, rows)


def totals_lines(plan: Plan) -> list[str]:
    """The plan's totals against the floor and layer by layer, in sentences."""
    t = plan.totals
    floor = plan.compulsory_dram_bytes
    lbl = plan.layer_by_layer_dram_bytes
    versus = (f"{t.dram_bytes / lbl:.2f}× layer-by-layer ({fmt_bytes(lbl)})" if lbl
              else "layer by layer does not fit this chip")
    lines = [
        f"DRAM traffic {fmt_bytes(t.dram_bytes)} = {t.dram_bytes / max(floor, 1):.2f}× the "
        f"compulsory floor ({fmt_bytes(floor)}), {versus}",
        f"weights read {fmt_bytes(t.weight_read_bytes)}; {t.cycles:,} cycles; energy "
        f"{t.energy_pj / 1e6:,.2f} µJ; solved in {plan.solver.get('wall_s')} s",
    ]
    if t.array_macs:  # a chip with a MAC array (planner.ir.array)
        lines.append(f"array utilisation {t.macs / t.array_macs:.1%}: {t.macs:,} MACs on "
                     f"{t.array_macs:,} array MACs (idle rows and columns included)")
    return lines


def attention_lines(problem: Problem, plan: Plan) -> list[str]:
    """Each fused attention's share of its group's traffic, the analytic count of its
    tiling, then the plan against its I/O bound or a decode step's ideal
    (planner.app.io_bounds)."""
    from fuseplan.planner.app.io_bounds import io_bounds_of

    bounds = io_bounds_of(problem.graph, problem.chip, plan)
    lines = [f"attention {a.layer} (group {a.group}): q once {fmt_bytes(a.q_bytes)} + k and v "
             f"{a.kv_label} {fmt_bytes(a.kv_bytes)} + o once {fmt_bytes(a.o_bytes)} = "
             f"{fmt_bytes(a.total)} analytic; the group moves {fmt_bytes(a.group_dram_bytes)}"
             for a in bounds.attentions]
    return lines + bound_lines(bounds, plan) + cache_lines(bounds, plan)


def bound_lines(bounds: IOBounds, plan: Plan) -> list[str]:
    """A prefill's I/O bound (planner.app.io_bounds): the floor plus every fused attention's
    FlashAttention I/O at its tiling, and the plan against it."""
    if bounds.io_bound_bytes is None:
        return []
    return [f"I/O bound: the floor + FlashAttention's I/O of its attentions at their tiling "
            f"(q, k and v read, o written, each as if alone) = "
            f"{fmt_bytes(bounds.io_bound_bytes)}; the plan moves "
            f"{plan.totals.dram_bytes / max(bounds.io_bound_bytes, 1):.2f}× it"]


def cache_lines(bounds: IOBounds, plan: Plan) -> list[str]:
    """What a decode step does with its KV caches (planner.front.kv_cache): the caches read,
    the new positions appended, and the plan against the decode ideal (every weight, cache
    and other input read once, the new positions and other outputs written once: with the
    caches appended in place, that is the floor)."""
    c = bounds.cache
    if c is None:
        return []
    return [f"KV cache: {c.caches} caches appended in place, {fmt_bytes(c.read_bytes)} "
            f"read, {fmt_bytes(c.new_bytes)} of new positions written; "
            f"{plan.totals.dram_bytes / max(c.ideal_bytes, 1):.3f}× the decode ideal (weights, "
            f"caches and inputs read once, new positions and outputs written once: "
            f"{fmt_bytes(c.ideal_bytes)})"]


def compare_table(model: str, floor: int, rows: Sequence[tuple[str, Plan | None, str]],
                  console: Console) -> RenderableType:
    """The four planners side by side."""
    dram = byte_unit([floor] + [p.totals.dram_bytes for _, p, _ in rows if p is not None])
    cols = [Col("planner"), Col(f"DRAM\n{dram[0]}", num=True), Col("×\nfloor", num=True),
            Col("cycles", num=True), Col("energy\nµJ", num=True), Col("groups", num=True),
            Col("solve\ns", num=True), Col("status")]
    cells = []
    for name, p, status in rows:
        if p is None:
            cells.append((name, "-", "-", "-", "-", "-", "-", status))
            continue
        tt = p.totals
        cells.append((name, in_unit(tt.dram_bytes, dram), f"{tt.dram_bytes / max(floor, 1):.2f}",
                      f"{tt.cycles:,}", f"{tt.energy_pj / 1e6:,.2f}", str(len(p.groups)),
                      str(p.solver.get("wall_s")), status))
    return table(console, f"planners on {rel_path(model)} (floor {fmt_bytes(floor)})", cols,
                 cells)


def _tiled_label(layout: dict[str, Any]) -> str:
    """'NHWC r1 c2': the layout and the axes tiles cut as rows and columns ('-': none)."""
    axes = [f"{k}{layout[a]}" for k, a in (("n", "batch_axis"), ("r", "row_axis"),
                                           ("c", "col_axis")) if layout[a] is not None]
    return f"{layout['kind']} {' '.join(axes) or '-'}"


def inspect_table(model: str, doc: dict[str, Any], console: Console) -> RenderableType:
    """The layers of a model: op, class, output shape, weights, MACs and block."""
    cols = [Col("name"), Col("op"), Col("class", wide=True), Col("out shape", num=True),
            Col("tiled", wide=True), Col("row map", wide=True),
            Col("weight\nelements", num=True), Col("MACs", num=True), Col("block", num=True)]
    rows = [(lay["name"], lay["op"], lay["class"], "×".join(map(str, lay["out_shape"])),
             _tiled_label(lay["layout"]), ", ".join(lay["row_maps"]),
             f"{lay['weight_elems']:,}", f"{lay['macs']:,}",
             "" if lay["block"] is None else str(lay["block"])) for lay in doc["layers"]]
    shown, left = elided(rows, len(cols))
    return table(console, f"{rel_path(model)}: {len(doc['layers'])} layers, "
                          f"{len(doc['blocks'])} blocks"
                          + (f"; {left:,} not shown (--json lists every layer)"
                             if left else ""), cols, shown)


def pareto_table(model: str, rows: Sequence[dict[str, Any]], console: Console) -> RenderableType:
    """The non-dominated plans and their files."""
    dram = byte_unit(r["dram_bytes"] for r in rows)
    cols = [Col("cycles", num=True), Col("energy\nµJ", num=True),
            Col(f"DRAM\n{dram[0]}", num=True), Col("groups", num=True), Col("plan file")]
    cells = [(f"{r['cycles']:,}", f"{r['energy_pj'] / 1e6:,.2f}", in_unit(r["dram_bytes"], dram),
              str(r["groups"]), rel_path(r["plan"])) for r in rows]
    return table(console, f"{len(rows)} non-dominated plans of {rel_path(model)}", cols, cells)


def partition_table(model: str, rows: Sequence[dict[str, Any]], console: Console) -> RenderableType:
    """The serial subgraphs: layers, size, traffic and status."""
    weights = byte_unit(r["weight_bytes"] for r in rows)
    dram = byte_unit(r["dram_bytes"] for r in rows)
    cols = [Col("#", num=True), Col("layers"), Col("nodes", num=True), Col("MACs", num=True),
            Col(f"weights\n{weights[0]}", num=True), Col(f"DRAM\n{dram[0]}", num=True),
            Col("status"), Col("why", wide=True, prose=True)]
    cells = [(str(r["id"]), layers_label(r["layers"]), str(r["nodes"]), f"{r['macs']:,}",
              in_unit(r["weight_bytes"], weights), in_unit(r["dram_bytes"], dram),
              r["status"], r["reason"]) for r in rows]
    return table(console, f"{len(rows)} serial subgraphs of {rel_path(model)}", cols, cells)


def dynamic_table(doc: dict[str, Any], console: Console, shown: int) -> RenderableType:
    """The first `shown` unit invocations of a dynamic plan's parameter table."""
    cols = [Col("group", num=True), Col("unit", num=True), Col("rows\noffset, len", num=True),
            Col("cols\noffset, len", num=True), Col("waste", num=True)]
    cells = [(str(e["group"]), str(e["unit"]), ", ".join(map(str, e["h"])),
              ", ".join(map(str, e["w"])), str(e["waste"])) for e in doc["entries"][:shown]]
    title = (f"{doc['invocations']} unit invocations ({doc['combination']}, tail "
             f"{doc['tail_mode']}, waste {doc['waste']:.1%}{', cached' if doc['cached'] else ''})")
    return table(console, title, cols, cells)


def rules_table(path: str, doc: dict[str, Any], enabled: int, console: Console) -> RenderableType:
    """The rules of a rule file: code, key, on or off, settings."""
    cols = [Col("code"), Col("rule"), Col("on"), Col("settings")]
    cells = []
    for r in doc["rules"]:
        settings = ", ".join(f"{k}={v}" for k, v in r.items()
                             if k not in ("code", "key", "title", "enabled"))
        cells.append((r["code"], r["key"], "yes" if r["enabled"] else "no", settings))
    return table(console, f"{rel_path(path)}: {enabled} of {len(doc['rules'])} rules enabled",
                 cols, cells)
