"""The HTML report: one self-contained page showing a plan, how it was bound and what it costs.

``render_report`` draws the layer graph as inline SVG (layers laid out by depth, coloured by
group, fused groups outlined), one bar chart per group of predicted (and emulated) DRAM bytes
against that group's layer-by-layer baseline, each group's tile, halo and mode, the rule that
bound each group boundary (from ``explain``) and the totals against the compulsory floor.
The page needs nothing but itself: CSS, SVG and JavaScript are inline and nothing is fetched.

``write_report`` is what ``fuseplan report`` and ``fuseplan solve --report`` call;
``load_problem_plan`` loads a plan file together with the model, chip and rules it was made for.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import networkx as nx

from fuseplan.planner.app.api import Problem, chip_for_plan, load_for_plan, verify_in_memory
from fuseplan.planner.app.io_bounds import io_bounds_of
from fuseplan.planner.app.verify import VerifyReport
from fuseplan.planner.core.files import write_atomic
from fuseplan.planner.core.units import fmt_bytes
from fuseplan.planner.cost.model import Counters, group_cost
from fuseplan.planner.front.graph_build import build_graph
from fuseplan.planner.ir.graph import Graph
from fuseplan.planner.plan.checks import whole_tile
from fuseplan.planner.plan.data import Group, Plan
from fuseplan.planner.plan.io_bounds import IOBounds
from fuseplan.planner.plan.json_io import load_plan
from fuseplan.planner.ui.ending import printable
from fuseplan.rules.ruleset import load_rules

# SVG layout of the layer graph (pixels)
NODE_W = 124
NODE_H = 34
COL_GAP = 46
ROW_GAP = 28
PAD = 7  # outline of a fused group around its layers
PAD_TOP = 17  # room for the group's label
MARGIN = 24
NAME_CHARS = 18  # labels longer than this are cut (the full name is in the tooltip)
OP_CHARS = 20


# --------------------------------------------------------------------------- loading


def _read_plan_doc(plan_path: Path) -> dict[str, Any]:
    from fuseplan.planner.plan.schema import read_plan_doc

    return read_plan_doc(plan_path)


def load_problem_plan(model: str, plan_path: str | Path, rules: str | Path | None = None,
                      hardware: str | None = None, overrides: Sequence[str] = ()
                      ) -> tuple[Problem, Plan]:
    """A plan file with the problem it was made for: its input shapes, chip and rule file.

    ``rules``, ``hardware`` and ``overrides`` replace (or, for overrides, add to) what the
    plan file records.
    """
    plan_path = Path(plan_path)
    doc = _read_plan_doc(plan_path)
    loaded = load_for_plan(model, plan_path, doc)
    chip, chip_file = chip_for_plan(doc.get("hardware", {}), hardware, overrides)
    rules_file = rules if rules is not None else doc.get("rules", {}).get("file") or None
    graph = build_graph(loaded)
    saved = tuple(doc.get("hardware", {}).get("overrides", [])) if hardware is None else ()
    problem = Problem(loaded, graph, chip, chip_file, saved + tuple(overrides),
                      load_rules(rules_file))
    return problem, load_plan(plan_path, graph, chip, loaded.sha256)


def verify_problem(problem: Problem, plan: Plan, seed: int = 0) -> VerifyReport:
    """Emulate ``plan`` on seeded inputs and check it against onnxruntime, every tensor
    through DRAM, with the weights `verify` picks by default (api.verify_in_memory)."""
    return verify_in_memory(problem, plan, seed)


def explain_plan(problem: Problem, plan: Plan) -> dict[str, Any]:
    """The ``explain`` document (boundaries with reasons, violations) of an in-memory plan."""
    from fuseplan.planner.app.explain import boundaries, recheck

    g, chip, rs = problem.graph, problem.chip, problem.ruleset
    return {
        "boundaries": [{"group": b.group, "next_layer": b.next_layer, "reasons": b.reasons}
                       for b in boundaries(g, plan, chip, rs)],
        "violations": [{"group": gid, "rule": v.rule, "name": v.name, "message": v.message,
                        "needed": v.needed, "allowed": v.allowed}
                       for gid, v in recheck(g, plan, chip, rs)],
    }


def write_report(problem: Problem, plan: Plan, path: str | Path, verify: bool = True,
                 seed: int = 0) -> VerifyReport | None:
    """Write the HTML report of ``plan`` to ``path``; emulate it first when ``verify``.

    Returns the verification report (None when not verified) so callers can act on it.
    """
    report = verify_problem(problem, plan, seed) if verify else None
    page = render_report(problem, plan, report, explain_plan(problem, plan))
    write_atomic(path, page, "HTML report")
    return report


# --------------------------------------------------------------------------- numbers


def layer_by_layer_group_bytes(problem: Problem, group: Group) -> int:
    """DRAM bytes of the group's layers each run alone with a whole-map tile."""
    g, chip = problem.graph, problem.chip
    return sum(group_cost(g, (name,), whole_tile(g, (name,)), chip).dram_bytes
               for name in group.layers)


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}×" if b else "–"


def _esc(text: object) -> str:
    """Text for the page: HTML-escaped, and its control and format characters written as
    escapes (a layer name holding U+202E would reverse the rest of its line)."""
    return html.escape(printable(str(text)), quote=True)


def _clip(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def group_colours(gid: int) -> tuple[str, str]:
    """(fill, stroke) colours of a group: golden-angle hues, stable per id."""
    hue = (gid * 137.508) % 360
    return f"hsl({hue:.0f},70%,83%)", f"hsl({hue:.0f},55%,32%)"


def region_colour(gid: int) -> str:
    """The pale fill of a fused group's region in the graph."""
    return f"hsl({(gid * 137.508) % 360:.0f},60%,94%)"


# --------------------------------------------------------------------------- layout


@dataclass(frozen=True)
class Placed:
    """A layer's box in the SVG."""

    name: str
    column: int
    x: int
    y: int


def layer_depths(graph: Graph) -> dict[str, int]:
    """Depth of each layer: the length of the longest path reaching it from a source."""
    depth: dict[str, int] = {}
    for name in nx.topological_sort(graph.dag):
        depth[name] = max((depth[p] + 1 for p in graph.dag.predecessors(name)), default=0)
    return depth


def _columns(graph: Graph, plan: Plan, depth: Mapping[str, int]) -> list[list[str]]:
    """Layers per depth, in group order (so a group's members sit together), then in
    topological order."""
    position = {n: i for i, g in enumerate(plan.groups) for n in g.layers}
    columns: list[list[str]] = [[] for _ in range(max(depth.values(), default=-1) + 1)]
    for lay in graph.layers:
        columns[depth[lay.name]].append(lay.name)
    for col in columns:
        col.sort(key=lambda name: (position[name], graph.index(name)))
    return columns


def _rows(graph: Graph, columns: Sequence[Sequence[str]]) -> dict[str, int]:
    """A row per layer: as close to the mean row of its predecessors as the column allows, so
    chains stay straight."""
    row: dict[str, int] = {}
    for col in columns:
        nxt = 0
        for name in col:
            preds = [row[p] for p in graph.dag.predecessors(name) if p in row]
            want = round(sum(preds) / len(preds)) if preds else 0
            row[name] = max(want, nxt)
            nxt = row[name] + 1
    return row


def layout(graph: Graph, plan: Plan) -> tuple[dict[str, Placed], int, int]:
    """Boxes of every layer, left to right by depth, and the SVG's width and height."""
    columns = _columns(graph, plan, layer_depths(graph))
    rows = _rows(graph, columns)
    placed = {name: Placed(name, c, MARGIN + c * (NODE_W + COL_GAP),
                           MARGIN + PAD_TOP + rows[name] * (NODE_H + ROW_GAP))
              for c, col in enumerate(columns) for name in col}
    n_rows = max(rows.values(), default=0) + 1
    width = 2 * MARGIN + max(len(columns), 1) * (NODE_W + COL_GAP) - COL_GAP
    height = 2 * MARGIN + PAD_TOP + n_rows * (NODE_H + ROW_GAP) - ROW_GAP
    return placed, width, height


# --------------------------------------------------------------------------- SVG


def _svg_edges(graph: Graph, placed: Mapping[str, Placed]) -> list[str]:
    parts = []
    for a, b in graph.dag.edges:
        pa, pb = placed[a], placed[b]
        x1, y1 = pa.x + NODE_W, pa.y + NODE_H // 2
        x2, y2 = pb.x, pb.y + NODE_H // 2
        mid = (x1 + x2) / 2
        parts.append(f'<path class="edge" d="M{x1},{y1} C{mid:.0f},{y1} {mid:.0f},{y2} '
                     f'{x2},{y2}"/>')
    return parts


def _outline_shapes(group: Group, placed: Mapping[str, Placed]) -> list[tuple[int, ...]]:
    """Rectangles (x, y, w, h, corner radius) whose union covers the group: one per column
    it occupies and a bridge across the gap between adjacent columns."""
    spans: dict[int, tuple[int, int, int]] = {}
    for p in (placed[n] for n in group.layers):
        x, top, bottom = spans.get(p.column, (p.x, p.y, p.y))
        spans[p.column] = (x, min(top, p.y), max(bottom, p.y))
    shapes: list[tuple[int, ...]] = []
    for col, (x, top, bottom) in sorted(spans.items()):
        shapes.append((x - PAD, top - PAD_TOP, NODE_W + 2 * PAD,
                       bottom - top + NODE_H + PAD_TOP + PAD, 8))
        if col + 1 in spans:  # bridge the rows both columns share
            nx_, ntop, nbottom = spans[col + 1]
            y0, y1 = max(top, ntop) - PAD_TOP, min(bottom, nbottom) + NODE_H + PAD
            if y1 > y0:
                shapes.append((x + NODE_W, y0, nx_ - x - NODE_W, y1 - y0, 0))
    return shapes


def _svg_outline(group: Group, placed: Mapping[str, Placed]) -> str:
    """A fused group's region: its shapes stroked, then filled on top, so only the outline of
    their union shows."""
    shapes = _outline_shapes(group, placed)
    stroke = group_colours(group.id)[1]
    fill = region_colour(group.id)
    rects = ["".join(f'<rect x="{x}" y="{y}" width="{w}" height="{h}" rx="{r}" class="{cls}"/>'
                     for x, y, w, h, r in shapes) for cls in ("edge-of", "body")]
    first = min((placed[n] for n in group.layers), key=lambda p: (p.column, p.y))
    return (f'<g class="outline" data-group="{group.id}" style="fill:{fill};stroke:{stroke}">'
            f"{rects[0]}{rects[1]}"
            f'<text x="{first.x - PAD + 5}" y="{first.y - 5}" class="glabel" style="fill:{stroke}">'
            f"G{group.id} · {_tile(group)}</text></g>")


def _svg_node(graph: Graph, group: Group, p: Placed) -> str:
    lay = graph.layer(p.name)
    fill, stroke = group_colours(group.id)
    cls = "node fused" if group.fused else "node"
    title = (f"{lay.name} ({lay.op}, {lay.op_class.value}) → {'×'.join(map(str, lay.out_shape))}"
             f"\ngroup {group.id}, tile {_tile(group)}, {group.mode} mode")
    return (f'<g class="{cls}" data-group="{group.id}" data-layer="{_esc(lay.name)}">'
            f'<title>{_esc(title)}</title>'
            f'<rect x="{p.x}" y="{p.y}" width="{NODE_W}" height="{NODE_H}" rx="4" '
            f'style="fill:{fill};stroke:{stroke}"/>'
            f'<text x="{p.x + 6}" y="{p.y + 14}" class="lname">'
            f'{_esc(_clip(lay.name, NAME_CHARS))}</text>'
            f'<text x="{p.x + 6}" y="{p.y + 27}" class="lop">'
            f'{_esc(_clip(lay.op, OP_CHARS))}</text></g>')


def render_graph_svg(graph: Graph, plan: Plan) -> str:
    """The layer graph as an SVG element (width and height in pixels, with a viewBox)."""
    placed, width, height = layout(graph, plan)
    owner = {n: g for g in plan.groups for n in g.layers}
    outlines = [_svg_outline(g, placed) for g in plan.groups if g.fused]
    nodes = [_svg_node(graph, owner[lay.name], placed[lay.name]) for lay in graph.layers]
    return (f'<svg id="graph" viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
            f'data-width="{width}" data-height="{height}" role="img" '
            f'aria-label="layer graph coloured by fusion group">'
            f'<g class="outlines">{"".join(outlines)}</g>'
            f'<g class="edges">{"".join(_svg_edges(graph, placed))}</g>'
            f'<g class="nodes">{"".join(nodes)}</g></svg>')


# --------------------------------------------------------------------------- HTML pieces


def _tile(group: Group) -> str:
    return group.tile.label()


def _bar(kind: str, value: int, scale: float, colour: str = "") -> str:
    width = 100.0 * value / scale if scale else 0.0
    style = f"width:{width:.2f}%" + (f";background:{colour}" if colour else "")
    return (f'<div class="barrow"><span class="barlabel">{kind}</span>'
            f'<span class="track"><span class="bar {kind.replace(" ", "-")}" '
            f'style="{style}"></span></span>'
            f'<span class="barval" title="{value:,} B">{fmt_bytes(value)}</span></div>')


def _layers_cell(group: Group) -> str:
    if len(group.layers) == 1:
        return _esc(group.layers[0])
    summary = f"{group.layers[0]} … {group.layers[-1]} ({len(group.layers)})"
    items = "".join(f"<li>{_esc(n)}</li>" for n in group.layers)
    return f"<details><summary>{_esc(summary)}</summary><ol>{items}</ol></details>"


def _bound_cell(group: Group, explain_doc: Mapping[str, Any]) -> str:
    parts = []
    for b in explain_doc.get("boundaries", []):
        if b.get("group") == group.id:
            reasons = "; ".join(b.get("reasons", [])) or "no reason recorded"
            parts.append(f'<div class="bound">before <b>{_esc(b.get("next_layer"))}</b>: '
                         f"{_esc(reasons)}</div>")
    for v in explain_doc.get("violations", []):
        if v.get("group") == group.id:
            parts.append(f'<div class="violation">violates {_esc(v.get("rule"))} '
                         f'{_esc(v.get("name"))}: {_esc(v.get("message"))}</div>')
    return "".join(parts) or '<span class="muted">last group</span>'


def _group_row(group: Group, baseline: int, emulated: Counters | None,
               explain_doc: Mapping[str, Any], scale: float) -> str:
    fill, stroke = group_colours(group.id)
    p = group.predicted
    bars = [_bar("layer-by-layer", baseline, scale),
            _bar("predicted", p.dram_bytes, scale, stroke)]
    if emulated is not None:
        bars.append(_bar("emulated", emulated.dram_bytes, scale))
    weights = "resident" if group.weights_resident else "streamed"
    return (f'<tr id="group-{group.id}" data-group="{group.id}">'
            f'<td><span class="swatch" style="background:{fill};border-color:{stroke}"></span>'
            f"G{group.id}{' fused' if group.fused else ''}</td>"
            f"<td>{_layers_cell(group)}</td><td>{group.mode}</td><td>{_tile(group)}</td>"
            f'<td title="{p.redundant_read_bytes:,} B">{fmt_bytes(p.redundant_read_bytes)}</td>'
            f"<td>{weights}</td><td>{fmt_bytes(p.sram_peak_bytes)}</td>"
            f'<td class="bars">{"".join(bars)}</td>'
            f"<td>{_bound_cell(group, explain_doc)}</td></tr>")


def render_group_table(problem: Problem, plan: Plan, verify_report: VerifyReport | None,
                       explain_doc: Mapping[str, Any]) -> str:
    """One table row per group: tile, halo, mode, DRAM bars, what bound its boundary."""
    emulated: list[Counters | None] = (list(verify_report.per_group)
                                       if verify_report is not None and verify_report.per_group
                                       else [None] * len(plan.groups))
    baselines = [layer_by_layer_group_bytes(problem, g) for g in plan.groups]
    scale = max(baselines + [g.predicted.dram_bytes for g in plan.groups]
                + [e.dram_bytes for e in emulated if e is not None] + [1])
    rows = [_group_row(g, base, e, explain_doc, scale)
            for g, base, e in zip(plan.groups, baselines, emulated, strict=True)]
    head = "".join(f"<th>{h}</th>" for h in ("group", "layers", "mode", "tile n×h×w",
                                             "halo re-reads", "weights", "SRAM peak",
                                             "DRAM bytes vs layer-by-layer", "bound by"))
    return (f'<table class="groups"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table>')


def render_legend(plan: Plan) -> str:
    """A colour chip per group."""
    chips = []
    for g in plan.groups:
        fill, stroke = group_colours(g.id)
        chips.append(f'<a class="chip{" fused" if g.fused else ""}" href="#group-{g.id}" '
                     f'data-group="{g.id}" style="background:{fill};border-color:{stroke}">'
                     f"G{g.id} · {len(g.layers)}</a>")
    return f'<div class="legend">{"".join(chips)}</div>'


def render_totals(plan: Plan, verify_report: VerifyReport | None,
                  io_bounds: IOBounds | None = None) -> str:
    """Total DRAM bytes of the plan against the compulsory floor and layer-by-layer, and
    against a prefill's I/O bound or a decode step's ideal (planner.app.io_bounds)."""
    t = plan.totals
    floor, lbl = plan.compulsory_dram_bytes, plan.layer_by_layer_dram_bytes
    emulated = verify_report.emulated.dram_bytes if verify_report is not None else None
    scale = float(max(floor, lbl, t.dram_bytes, emulated or 0, 1))
    bars = [_bar("compulsory floor", floor, scale), _bar("predicted", t.dram_bytes, scale)]
    if emulated is not None:
        bars.append(_bar("emulated", emulated, scale))
    bars.append(_bar("layer-by-layer", lbl, scale))
    cards = [("DRAM traffic", fmt_bytes(t.dram_bytes)),
             ("× compulsory floor", _ratio(t.dram_bytes, floor)),
             ("× layer-by-layer", _ratio(t.dram_bytes, lbl)),
             ("weights read", fmt_bytes(t.weight_read_bytes)),
             ("halo re-reads", fmt_bytes(t.redundant_read_bytes)),
             ("SRAM peak", fmt_bytes(t.sram_peak_bytes)),
             ("cycles", f"{t.cycles:,}"),
             ("energy", f"{t.energy_pj / 1e6:,.2f} µJ")]
    if io_bounds is not None and io_bounds.io_bound_bytes is not None:
        cards[3:3] = [("I/O bound (floor + FlashAttention I/O)",
                       fmt_bytes(io_bounds.io_bound_bytes)),
                      ("× I/O bound", _ratio(t.dram_bytes, io_bounds.io_bound_bytes))]
    if io_bounds is not None and io_bounds.cache is not None:
        c = io_bounds.cache
        cards[3:3] = [("KV caches read", fmt_bytes(c.read_bytes)),
                      ("new positions written", fmt_bytes(c.new_bytes)),
                      ("× decode ideal", _ratio(t.dram_bytes, c.ideal_bytes))]
    card_html = "".join(f'<div class="card"><div class="k">{_esc(k)}</div>'
                        f'<div class="v">{_esc(v)}</div></div>' for k, v in cards)
    return f'<div class="cards">{card_html}</div><div class="totbars bars">{"".join(bars)}</div>'


def render_verification(verify_report: VerifyReport | None) -> str:
    """What the emulator found, or a note that the plan was not verified."""
    if verify_report is None:
        return ('<p class="muted">Not verified: run <code>fuseplan report MODEL PLAN '
                "--verify</code> to add emulated bytes.</p>")
    r = verify_report
    items = [
        ("outputs match " + r.reference, r.outputs_match),
        ("predicted bytes == emulated bytes", r.predicted_matches_emulated),
        ("fits the chip (no capacity violation)", not r.capacity_violations),
    ]
    lis = "".join(f'<li class="{"pass" if ok else "fail"}">{"✔" if ok else "✘"} {_esc(k)}</li>'
                  for k, ok in items)
    extra = [f"max abs err {r.max_abs_err:.3g}, max rel err {r.max_rel_err:.3g} over "
             f"{r.checked_tensors} tensors; emulator {r.emulator_s:.3f} s, {r.reference} "
             f"{r.reference_s:.3f} s"]
    extra += [f"first mismatch: {m}" for m in (r.first_output_mismatch, r.first_counter_mismatch)
              if m]
    extra += [f"capacity violation: {v.describe()}" for v in r.capacity_violations]
    return f'<ul class="checks">{lis}</ul>' + "".join(f"<p>{_esc(e)}</p>" for e in extra)


def _header(problem: Problem, plan: Plan) -> str:
    s = plan.solver
    gap = s.get("gap")
    fused = sum(1 for g in plan.groups if g.fused)
    facts = [("model", problem.model.path), ("chip", problem.chip.name),
             ("rules", plan.rules.get("file") or problem.ruleset.file),
             ("objective", plan.objective),
             ("solver", f"{s.get('name')} {s.get('status')}"
                        + (f", gap {gap}" if gap is not None else "")
                        + (f", {s.get('wall_s')} s" if s.get("wall_s") is not None else "")),
             ("groups", f"{len(plan.groups)} ({fused} fused) over {len(problem.graph.layers)} "
                        "layers")]
    return "".join(f"<span><b>{_esc(k)}</b> {_esc(v)}</span>" for k, v in facts)


# --------------------------------------------------------------------------- page

CSS = """
:root{--fg:#1d232b;--muted:#6b7480;--line:#d9dee4;--bg:#f7f8fa}
*{box-sizing:border-box}
body{margin:0;font:14px/1.4 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:var(--fg);
 background:var(--bg)}
header{padding:16px 24px;background:#fff;border-bottom:1px solid var(--line)}
header h1{margin:0 0 6px;font-size:20px}
.facts span{display:inline-block;margin:2px 16px 2px 0;color:var(--muted)}
.facts b{color:var(--fg);font-weight:600}
section{margin:16px 24px;padding:14px 16px;background:#fff;border:1px solid var(--line);
 border-radius:8px}
h2{margin:0 0 10px;font-size:16px}
.muted{color:var(--muted)}
.cards{display:flex;flex-wrap:wrap;gap:10px;margin-bottom:12px}
.card{border:1px solid var(--line);border-radius:6px;padding:6px 12px;min-width:120px}
.card .k{color:var(--muted);font-size:12px}.card .v{font-size:17px;font-weight:600}
.graphbox{overflow:auto;max-height:72vh;border:1px solid var(--line);border-radius:6px;
 background:#fcfcfd}
.toolbar{margin-bottom:8px;color:var(--muted)}
.toolbar input{vertical-align:middle}
svg .edge{fill:none;stroke:#8a94a0;stroke-width:1;opacity:.55}
svg .node rect{stroke-width:1}
svg .node.fused rect{stroke-width:2}
svg .node{cursor:pointer}
svg .lname{font:600 11px ui-monospace,Menlo,Consolas,monospace;fill:#1d232b}
svg .lop{font:10px system-ui,sans-serif;fill:#4a525c}
svg .outline .edge-of{stroke-width:2.5}
svg .outline .body{stroke:none}
svg .glabel{font:600 10px system-ui,sans-serif}
svg .hl rect{stroke-width:3.5}
svg .outline.hl .edge-of{stroke-width:6}
.legend{display:flex;flex-wrap:wrap;gap:4px;margin:8px 0 0;max-height:120px;overflow:auto}
.chip{font-size:11px;padding:1px 6px;border:1px solid;border-radius:10px;color:#1d232b;
 text-decoration:none}
.chip.fused{font-weight:700;border-width:2px}
.chip.hl{outline:2px solid #1d232b}
table.groups{border-collapse:collapse;width:100%}
table.groups th,table.groups td{border-bottom:1px solid var(--line);padding:5px 8px;
 text-align:left;vertical-align:top}
table.groups th{position:sticky;top:0;background:#fff;font-size:12px;color:var(--muted)}
table.groups tr.hl td{background:#fff6d6}
.tablebox{max-height:80vh;overflow:auto}
details summary{cursor:pointer}
details ol{margin:4px 0 0;padding-left:20px;font:12px ui-monospace,Menlo,Consolas,monospace}
.swatch{display:inline-block;width:12px;height:12px;border:2px solid;border-radius:3px;
 margin-right:6px;vertical-align:-2px}
td.bars{min-width:300px}
.barrow{display:flex;align-items:center;gap:6px;font-size:11px;height:16px}
.barlabel{width:96px;color:var(--muted);text-align:right;flex:none}
.track{flex:1;background:#eef0f3;height:10px;border-radius:3px;overflow:hidden;min-width:80px}
.bar{display:block;height:100%;background:#9aa3ad}
.bar.emulated{background:repeating-linear-gradient(45deg,#2f7d4f 0 4px,#5fbf86 4px 8px)}
.bar.compulsory-floor{background:#1d232b}
.bar.predicted{background:#3b6fd6}
.barval{width:86px;flex:none;font-variant-numeric:tabular-nums}
.totbars{max-width:760px}
.bound{font-size:12px}.violation{font-size:12px;color:#b3261e;font-weight:600}
.checks{list-style:none;padding:0;margin:0 0 6px}.checks li{margin:2px 0}
.pass{color:#2f7d4f}.fail{color:#b3261e;font-weight:600}
#fp-status{font-size:11px;color:var(--muted)}
"""

ERROR_HOOK_JS = """
(function(){
  var errors = [];
  function mark(){
    var s = document.getElementById('fp-status');
    if (!s) return;
    s.textContent = errors.length ? 'error: ' + errors.join(' | ') : 'ok';
    s.setAttribute('data-status', errors.length ? 'error' : 'ok');
  }
  window.addEventListener('error', function(e){ errors.push(String(e.message)); mark(); });
  var original = console.error;
  console.error = function(){
    errors.push(Array.prototype.join.call(arguments, ' '));
    mark();
    return original.apply(console, arguments);
  };
  window.fuseplanMark = mark;
  window.addEventListener('load', mark);
})();
"""

PAGE_JS = """
(function(){
  var byGroup = {};
  document.querySelectorAll('[data-group]').forEach(function(el){
    var id = el.getAttribute('data-group');
    (byGroup[id] = byGroup[id] || []).push(el);
  });
  function light(id, on){
    (byGroup[id] || []).forEach(function(el){ el.classList.toggle('hl', on); });
  }
  Object.keys(byGroup).forEach(function(id){
    byGroup[id].forEach(function(el){
      el.addEventListener('mouseenter', function(){ light(id, true); });
      el.addEventListener('mouseleave', function(){ light(id, false); });
    });
  });
  document.querySelectorAll('svg .node').forEach(function(el){
    el.addEventListener('click', function(){
      var row = document.getElementById('group-' + el.getAttribute('data-group'));
      if (row) row.scrollIntoView({block: 'center'});
    });
  });
  var svg = document.getElementById('graph');
  var zoom = document.getElementById('zoom');
  var box = document.getElementById('graphbox');
  var w = +svg.getAttribute('data-width'), h = +svg.getAttribute('data-height');
  function setZoom(pct){
    svg.setAttribute('width', Math.max(1, Math.round(w * pct / 100)));
    svg.setAttribute('height', Math.max(1, Math.round(h * pct / 100)));
    document.getElementById('zoomval').textContent = Math.round(pct) + '%';
  }
  zoom.addEventListener('input', function(){ setZoom(+zoom.value); });
  document.getElementById('fit').addEventListener('click', function(){
    var pct = Math.min(100, 100 * (box.clientWidth - 4) / w);
    zoom.value = pct; setZoom(pct);
  });
  setZoom(+zoom.value);
})();
"""


def render_report(problem: Problem, plan: Plan, verify_report: VerifyReport | None,
                  explain_doc: Mapping[str, Any]) -> str:
    """The whole report as one self-contained HTML document."""
    title = f"fuseplan report: {problem.model.path}"
    groups = len(plan.groups)
    bounds = io_bounds_of(problem.graph, problem.chip, plan)
    return "\n".join([
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width,initial-scale=1">',
        f"<title>{_esc(title)}</title>",
        f"<style>{CSS}</style>",
        f"<script>{ERROR_HOOK_JS}</script>",
        "</head><body>",
        f'<header><h1>{_esc(title)}</h1><div class="facts">{_header(problem, plan)}</div>'
        '<div id="fp-status" data-status="pending">pending</div></header>',
        '<section id="totals"><h2>Totals vs the compulsory floor</h2>'
        f"{render_totals(plan, verify_report, bounds)}</section>",
        '<section id="verification"><h2>Verification</h2>'
        f"{render_verification(verify_report)}</section>",
        f'<section id="graph-section"><h2>Layer graph ({len(problem.graph.layers)} layers, '
        f"{groups} groups)</h2>"
        '<div class="toolbar">zoom <input id="zoom" type="range" min="5" max="200" '
        'value="100"> <span id="zoomval">100%</span> <button id="fit" type="button">fit '
        "width</button> · hover a layer or group to highlight it; click a layer to jump to its "
        "group · outlined regions are fused groups</div>"
        f'<div class="graphbox" id="graphbox">{render_graph_svg(problem.graph, plan)}</div>'
        f"{render_legend(plan)}</section>",
        '<section id="groups"><h2>Groups: DRAM bytes against layer-by-layer, tile, halo, '
        "mode, and what bound each boundary</h2>"
        f'<div class="tablebox">{render_group_table(problem, plan, verify_report, explain_doc)}'
        "</div></section>",
        f"<script>{PAGE_JS}</script>",
        "<script>window.fuseplanMark();</script>",
        "</body></html>",
    ])
