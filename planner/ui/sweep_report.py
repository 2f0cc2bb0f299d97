"""A sweep's HTML page: capacity curves, knees, and the smallest chip serving every model.

One self-contained file (inline CSS and SVG, no script, nothing fetched): per curve (a model on
a chip family, everything fixed but the capacity), DRAM traffic against on-chip capacity on a
log axis with the compulsory floor and the layer-by-layer plan as lines and the knee marked
(the smallest capacity within 1.1x the floor, else within 5 % of the curve's minimum), then
cycles and energy against capacity; across models, per chip family, the smallest capacity at
which every model meets the target; and the whole table.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from fuseplan.planner.app.sweep import (
    PointResult,
    Probe,
    SweepResult,
    Target,
    capacity_axes,
    knee,
    parse_target,
)
from fuseplan.planner.core.files import write_atomic

__all__ = ["curve_groups", "smallest_serving", "smallest_serving_bisected", "sweep_html",
           "write_sweep_report"]

_W, _H = 560, 280
_PAD_L, _PAD_R, _PAD_T, _PAD_B = 78, 16, 14, 44
_COLORS = {"plan": "#1f6feb", "floor": "#2da44e", "layer": "#cf222e", "knee": "#8250df"}

_CSS = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 24px; color: #1f2328; }
h1 { font-size: 22px; } h2 { font-size: 17px; margin-top: 28px; }
.charts { display: flex; flex-wrap: wrap; gap: 12px; }
figure { margin: 0; max-width: 560px; } figcaption { font-size: 12px; color: #59636e; }
table { border-collapse: collapse; font-size: 12px; margin-top: 8px; }
th, td { border: 1px solid #d1d9e0; padding: 2px 6px; text-align: right; }
th { background: #f6f8fa; } td.l, th.l { text-align: left; }
.axis { stroke: #59636e; stroke-width: 1; } .grid { stroke: #eaeef2; stroke-width: 1; }
.tick { font-size: 11px; fill: #59636e; } .lbl { font-size: 12px; fill: #1f2328; }
"""


def _size(n: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            v = n / scale
            return f"{v:.0f} {unit}" if v == int(v) else f"{v:.3g} {unit}"
    return f"{n:.0f} B"


def _num(n: float) -> str:
    if n == 0:
        return "0"
    exp = int(math.floor(math.log10(abs(n)) / 3)) if abs(n) >= 1000 else 0
    suffix = {0: "", 1: "k", 2: "M", 3: "G", 4: "T", 5: "P"}.get(exp, f"e{3 * exp}")
    return f"{n / 1000 ** exp:.3g}{suffix}"


def curve_groups(rows: Sequence[PointResult], axis: str
                 ) -> list[tuple[str, list[PointResult]]]:
    """Rows that differ only in ``axis``, as (title, rows by increasing value)."""
    groups: dict[tuple[Any, ...], list[PointResult]] = {}
    for r in rows:
        if r.value(axis) is None:
            continue
        rest = tuple((k, v) for k, v in r.axes if k != axis)
        groups.setdefault((r.model, r.batch, r.shapes, r.chip, rest, r.rules, r.solver,
                           r.objective), []).append(r)
    out = []
    for (model, batch, _, chip, rest, rules, solver, objective), rs in groups.items():
        parts = [model + (f" (batch {batch})" if batch is not None else ""), f"on {chip}",
                 *(f"{k}={v}" for k, v in rest), solver, objective, f"rules {rules}"]
        out.append((" · ".join(parts), sorted(rs, key=lambda r: r.value(axis))))
    return out


def smallest_serving(rows: Sequence[PointResult], axis: str, target: Target
                     ) -> list[tuple[str, Any, list[str]]]:
    """Per chip family (chip, other axes, rules, solver, objective): the smallest ``axis``
    value at which every model meets ``target`` (None if none), and the models."""
    families: dict[tuple[Any, ...], dict[Any, list[PointResult]]] = {}
    for r in rows:
        v = r.value(axis)
        if v is None:
            continue
        rest = tuple((k, x) for k, x in r.axes if k != axis)
        fam = families.setdefault((r.chip, rest, r.rules, r.solver, r.objective), {})
        fam.setdefault(v, []).append(r)
    out = []
    for (chip, rest, rules, solver, objective), by_value in families.items():
        models = sorted({(r.model, r.batch) for rs in by_value.values() for r in rs},
                        key=str)
        best = None
        for v in sorted(by_value):
            served = {(r.model, r.batch) for r in by_value[v] if target.met(r)}
            if served >= set(models):
                best = v
                break
        title = " · ".join([chip, *(f"{k}={x}" for k, x in rest), solver, objective,
                            f"rules {rules}"])
        out.append((title, best, [m + (f" (batch {b})" if b is not None else "")
                                  for m, b in models]))
    return out


def smallest_serving_bisected(probes: Sequence[Probe]) -> list[tuple[str, Any, list[str]]]:
    """Per chip family, from ``--target``'s bisection: the largest of the models' smallest
    capacities meeting the target (the target holds from there on for each model), None if
    some model meets it at no capacity. A bisection plans only its probes, so the rows alone
    cannot say this."""
    families: dict[tuple[Any, ...], list[Probe]] = {}
    for p in probes:
        families.setdefault((p.chip, p.rest, p.rules, p.solver, p.objective), []).append(p)
    out = []
    for (chip, rest, rules, solver, objective), ps in families.items():
        smallest = [p.smallest for p in ps]
        best = None if any(v is None for v in smallest) else max(smallest)  # type: ignore[type-var]
        title = " · ".join([chip, *(f"{k}={x}" for k, x in rest), solver, objective,
                            f"rules {rules}"])
        out.append((title, best, sorted({p.model + (f" (batch {p.batch})"
                                                     if p.batch is not None else "")
                                         for p in ps})))
    return out


def _chart(series: Sequence[tuple[str, str, Sequence[tuple[float, float]], bool]],
           xlabel: str, ylabel: str, logx: bool, xfmt: Any, yfmt: Any,
           mark: tuple[float, float] | None, name: str, logy: bool = False) -> str:
    """An SVG line chart: series of (label, color, points, dashed); ``logy`` draws the y axis
    on a log scale with 1-2-5 ticks (curves far below the layer-by-layer line stay legible)."""
    pts = [p for _, _, ps, _ in series for p in ps]
    if not pts:
        return ""
    xs = sorted({x for x, _ in pts})
    fx = (lambda x: math.log2(x)) if logx and xs[0] > 0 else (lambda x: x)
    x0, x1 = fx(xs[0]), fx(xs[-1])
    if x1 == x0:
        x0, x1 = x0 - 1, x1 + 1
    positive = [y for _, y in pts if y > 0]
    logy = logy and bool(positive)
    if logy:
        y0, y1 = math.log10(min(positive) / 1.25), math.log10(max(positive) * 1.25)
        ticks = [m * 10.0**e for e in range(math.floor(y0), math.ceil(y1) + 1)
                 for m in (1, 2, 5) if y0 <= math.log10(m * 10.0**e) <= y1]
    else:
        y0, y1 = 0.0, max(y for _, y in pts) * 1.08 or 1.0
        ticks = [y0 + (y1 - y0) * i / 5 for i in range(6)]
    fy = (lambda y: math.log10(max(y, 10**y0))) if logy else (lambda y: y)
    pw, ph = _W - _PAD_L - _PAD_R, _H - _PAD_T - _PAD_B

    def sx(x: float) -> float:
        return _PAD_L + (fx(x) - x0) / (x1 - x0) * pw

    def sy(y: float) -> float:
        return _PAD_T + ph - (fy(y) - y0) / (y1 - y0) * ph

    parts = [f'<svg class="curve" data-name="{html.escape(name)}" width="{_W}" height="{_H}" '
             f'viewBox="0 0 {_W} {_H}" xmlns="http://www.w3.org/2000/svg" role="img">']
    for y in ticks:
        parts.append(f'<line class="grid" x1="{_PAD_L}" x2="{_W - _PAD_R}" y1="{sy(y):.1f}" '
                     f'y2="{sy(y):.1f}"/><text class="tick" x="{_PAD_L - 6}" y="{sy(y) + 4:.1f}" '
                     f'text-anchor="end">{html.escape(yfmt(y))}</text>')
    for x in xs:
        parts.append(f'<line class="grid" x1="{sx(x):.1f}" x2="{sx(x):.1f}" y1="{_PAD_T}" '
                     f'y2="{_PAD_T + ph}"/><text class="tick" x="{sx(x):.1f}" '
                     f'y="{_PAD_T + ph + 15}" text-anchor="middle">{html.escape(xfmt(x))}</text>')
    parts.append(f'<line class="axis" x1="{_PAD_L}" x2="{_PAD_L}" y1="{_PAD_T}" '
                 f'y2="{_PAD_T + ph}"/><line class="axis" x1="{_PAD_L}" x2="{_W - _PAD_R}" '
                 f'y1="{_PAD_T + ph}" y2="{_PAD_T + ph}"/>')
    parts.append(f'<text class="lbl" x="{_PAD_L + pw / 2:.0f}" y="{_H - 6}" '
                 f'text-anchor="middle">{html.escape(xlabel)}</text>')
    parts.append(f'<text class="lbl" transform="translate(14 {_PAD_T + ph / 2:.0f}) '
                 f'rotate(-90)" text-anchor="middle">{html.escape(ylabel)}</text>')
    legend_x = _PAD_L + 8
    for label, color, ps, dashed in series:
        if not ps:
            continue
        dash = ' stroke-dasharray="5 4"' if dashed else ""
        path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in ps)
        parts.append(f'<polyline data-series="{html.escape(label)}" fill="none" '
                     f'stroke="{color}" stroke-width="2"{dash} points="{path}"/>')
        parts.extend(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2.5" fill="{color}"/>'
                     for x, y in ps)
        parts.append(f'<text class="tick" x="{legend_x}" y="{_PAD_T + 12}" '
                     f'fill="{color}" style="fill:{color}">{html.escape(label)}</text>')
        legend_x += 7 * len(label) + 18
    if mark is not None:
        parts.append(f'<circle class="knee" cx="{sx(mark[0]):.1f}" cy="{sy(mark[1]):.1f}" '
                     f'r="6" fill="none" stroke="{_COLORS["knee"]}" stroke-width="2"/>')
    parts.append("</svg>")
    return "".join(parts)


def _axis_of(result: SweepResult) -> tuple[str | None, bool]:
    """The axis the curves run along: the first capacity axis, else the first numeric one."""
    caps = capacity_axes(result.axis_keys)
    if caps:
        return caps[0], True
    for key in result.axis_keys:
        if all(isinstance(r.value(key), int | float) for r in result.rows
               if r.value(key) is not None):
            return key, False
    return None, False


def _cell(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.4g}"
    return html.escape(str(v))


def _table(rows: Sequence[PointResult], axis_keys: Sequence[str]) -> str:
    cols = ["model", "chip", *axis_keys, "solver", "objective", "status", "dram_bytes",
            "x_floor", "x_layer", "cycles", "energy_pj", "solve_s", "verified", "monotone"]
    head = "".join(f'<th class="{"l" if c in ("model", "chip", "status") else ""}">'
                   f"{html.escape(c)}</th>" for c in cols)
    body = "".join("<tr>" + "".join(
        f'<td class="{"l" if c in ("model", "chip", "status") else ""}">'
        f"{_cell(r.value(c))}</td>" for c in cols) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def sweep_html(result: SweepResult, target: Target | None = None, title: str = "sweep") -> str:
    """The report page as one HTML string."""
    goal = target or parse_target("x_floor<=1.1")
    axis, is_capacity = _axis_of(result)
    body = [f"<h1>Sweep {html.escape(title)}</h1>",
            f"<p>{result.points} points, {result.done} planned, {result.failed} without a "
            f"plan; {result.repaired} re-costed from a smaller capacity to keep curves "
            f"monotone.</p>"]
    if axis is not None:
        xfmt = _size if is_capacity else _num
        xlabel = f"{axis} (log scale)" if is_capacity else axis
        body.extend(_serving_table(result, axis, goal, target, xfmt))
        for name, rows in curve_groups(result.rows, axis):
            body.append(_curve_section(name, rows, axis, xlabel, is_capacity, xfmt))
    body.append("<h2>All points</h2>" + _table(result.rows, result.axis_keys))
    return ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
            "<link rel='icon' href='data:,'>"
            f"<title>fuseplan sweep {html.escape(title)}</title><style>{_CSS}</style></head>"
            f"<body>{''.join(body)}</body></html>\n")


def _serving_table(result: SweepResult, axis: str, goal: Target, target: Target | None,
                   xfmt: Callable[[float], str]) -> list[str]:
    """The table of the smallest `axis` value serving every model, per chip family: from
    the bisection where the sweep bisected toward an explicit target, else from the rows."""
    serving = smallest_serving_bisected(result.bisection) \
        if result.bisection and target is not None \
        else smallest_serving(result.rows, axis, goal)
    parts = [f"<h2>Smallest {html.escape(axis)} serving every model within "
             f"{html.escape(str(goal))}</h2><table><tr><th class='l'>chip family</th>"
             "<th class='l'>models</th><th>smallest</th></tr>"]
    parts.extend(f"<tr><td class='l'>{html.escape(t)}</td><td class='l'>"
                 f"{html.escape(', '.join(ms))}</td><td>"
                 f"{html.escape(xfmt(best)) if best is not None else 'none'}</td></tr>"
                 for t, best, ms in serving)
    parts.append("</table>")
    return parts


def _curve_section(name: str, rows: Sequence[PointResult], axis: str, xlabel: str,
                   is_capacity: bool, xfmt: Callable[[float], str]) -> str:
    """One curve's section: its knee, the points without a plan, and its traffic, cycles
    and energy charts."""
    ok = [r for r in rows if r.ok]
    at = [(float(r.value(axis)), r) for r in ok]
    k = knee(rows, axis)
    mib = 2.0**20
    traffic = _chart(
        [("plan", _COLORS["plan"], [(x, (r.dram_bytes or 0) / mib) for x, r in at],
          False),
         ("floor", _COLORS["floor"],
          [(x, (r.compulsory_dram_bytes or 0) / mib) for x, r in at], True),
         ("layer-by-layer", _COLORS["layer"],
          [(x, (r.layer_by_layer_dram_bytes or 0) / mib) for x, r in at], True)],
        xlabel, "DRAM MiB (log scale)", is_capacity, xfmt, lambda v: f"{v:.3g}",
        None if k is None else (float(k.value(axis)), (k.dram_bytes or 0) / mib),
        name, logy=True)
    cycles = _chart([("cycles", _COLORS["plan"], [(x, float(r.cycles or 0))
                                                   for x, r in at], False)],
                    xlabel, "cycles", is_capacity, xfmt, _num, None, name + " cycles")
    energy = _chart([("energy", _COLORS["plan"],
                      [(x, (r.energy_pj or 0) / 1e6) for x, r in at], False)],
                    xlabel, "energy µJ", is_capacity, xfmt, lambda v: f"{v:.3g}",
                    None, name + " energy")
    failed = [r for r in rows if not r.ok]
    knee_text = ("no plan at any capacity" if k is None else
                 f"knee: {xfmt(float(k.value(axis)))} ({k.x_floor:.3f}× floor)"
                 if k.x_floor is not None else f"knee: {xfmt(float(k.value(axis)))}")
    return (f'<section class="model" data-name="{html.escape(name)}">'
            f"<h2>{html.escape(name)}</h2><p>{html.escape(knee_text)}"
            + (f"; no plan at {', '.join(xfmt(float(r.value(axis))) for r in failed)}"
               if failed else "") + "</p>"
            f'<div class="charts"><figure>{traffic}<figcaption>DRAM traffic '
            "against capacity; dashed: compulsory floor and layer-by-layer; "
            f"circled: the knee</figcaption></figure><figure>{cycles}</figure>"
            f"<figure>{energy}</figure></div></section>")


def write_sweep_report(result: SweepResult, path: str | Path, target: Target | None = None,
                       title: str = "sweep") -> None:
    """Write the report page (whole or not at all)."""
    write_atomic(Path(path), sweep_html(result, target, title), "HTML report")
