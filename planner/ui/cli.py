"""`fuseplan`: the command line, a thin shell over planner.app.api.

Exit codes: 0 success; 1 the answer is "no" (mismatch, infeasible, rule violated);
2 bad input, with one paragraph on stderr and no traceback. With --json, stdout
holds exactly one JSON document; progress and logs go to stderr.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from fuseplan.planner.app import api
from fuseplan.planner.core.errors import InputError, Interrupted
from fuseplan.planner.core.files import make_dir, write_atomic
from fuseplan.planner.cost.objective import Objective
from fuseplan.planner.front.onnx_load import parse_shape_option
from fuseplan.planner.geometry.attention import attention_traffic
from fuseplan.planner.geometry.regions import group_io
from fuseplan.planner.plan.data import Plan
from fuseplan.planner.plan.json_io import plan_to_json, save_plan
from fuseplan.planner.ui import STARTED
from fuseplan.planner.ui.cli_check import register as register_check
from fuseplan.planner.ui.cli_common import (
    AnswerGroup,
    JsonOpt,
    Output,
    SetOpt,
    check_files,
    emit,
    err,
    golden_in,
    guarded,
    hw_in,
    model_in,
    out,
    plan_in,
    rules_in,
    settings,
    working,
    yaml_in,
)
from fuseplan.planner.ui.cli_sweep import register as register_sweep
from fuseplan.planner.ui.cli_views import register as register_views
from fuseplan.planner.ui.plots import front_png, front_svg

app = typer.Typer(cls=AnswerGroup, add_completion=False, no_args_is_help=True,
                  help="Layer-fusion planner for neural-network accelerators.")
rules_app = typer.Typer(add_completion=False, no_args_is_help=True, help="Rule files.")
app.add_typer(rules_app, name="rules")

RulesOpt = Annotated[str | None, typer.Option("--rules",
    help="Rule YAML (default rules/default.yaml).")]
HwOpt = Annotated[str | None, typer.Option("--hw", help="Chip YAML file or preset name.")]
ShapeOpt = Annotated[list[str] | None, typer.Option("--shape",
    help="Bind input dims: NAME=D0,D1,...")]
ObjOpt = Annotated[str | None, typer.Option("--objective",
    help=" | ".join(o.value for o in Objective))]
def _seconds(value: float | None) -> float | None:
    """--time-limit: a positive, finite number of seconds."""
    if value is not None and not (math.isfinite(value) and value > 0):
        raise typer.BadParameter(f"must be a positive number of seconds, got {value}; "
                                 "e.g. --time-limit 30.")
    return value


def _percent(value: float | None) -> float | None:
    """--battery: a level from 0 to 100 percent."""
    if value is not None and not (math.isfinite(value) and 0 <= value <= 100):
        raise typer.BadParameter(f"must be a battery level from 0 to 100 (percent), got "
                                 f"{value}; e.g. --battery 40.")
    return value


TimeOpt = Annotated[float | None, typer.Option("--time-limit", callback=_seconds,
    help="CP-SAT time limit in seconds.")]
SearchJobsOpt = Annotated[int, typer.Option("--jobs", "-j", min=0,
    help="Processes for the tile searches (0: every core). The plan does not depend on it.")]


SolverOpt = Annotated[str, typer.Option("--solver",
    help="cpsat | shortest-path | greedy | layer")]
PreferOpt = Annotated[str | None, typer.Option("--prefer",
    help="auto | latency | energy (seed 004)")]
BatteryOpt = Annotated[float | None, typer.Option("--battery", callback=_percent,
    help="Battery level in percent, for --prefer auto.")]
OutputOpt = Annotated[Path | None, typer.Option("-o", "--output",
    help="Write the plan JSON here.")]
ReportOpt = Annotated[Path | None, typer.Option("--report",
    help="Write a self-contained HTML report (verifies the plan).")]
DynamicOpt = Annotated[list[str] | None, typer.Option("--dynamic",
    help="Dynamic axis NAME:AXIS=LO..HI (a dynamic plan, seed 002).")]
TailModeOpt = Annotated[str, typer.Option("--tail-mode",
    help="pad | overlap | variable | tail-range")]
CombinationOpt = Annotated[str, typer.Option("--combination",
    help="simple | optimized")]
TailRangeOpt = Annotated[int, typer.Option("--tail-range", min=0,
    help="tail-range mode: units accept [size-r, size].")]
PointsOpt = Annotated[int, typer.Option("--points",
    help="Points on the front (>= 2).")]
OutDirOpt = Annotated[Path, typer.Option("--out-dir",
    help="Where the plan files go.")]
PlotOpt = Annotated[Path | None, typer.Option("--plot",
    help="Draw the front as a chart: FILE.svg or FILE.png.")]
PolicyOpt = Annotated[str | None, typer.Option("--policy",
    help="threshold | forward | bidirectional")]
PartsDirOpt = Annotated[Path | None, typer.Option("--out-dir",
    help="Write each subgraph's .onnx and plan here.")]
JobsOpt = Annotated[int, typer.Option("--jobs", min=1,
    help="Plan this many subgraphs at a time, in worker processes.")]
VerifyChainOpt = Annotated[bool, typer.Option("--verify/--no-verify",
    help="Emulate the chain of subgraph plans against onnxruntime.")]
SeedOpt = Annotated[int, typer.Option("--seed", min=0, max=2**32 - 1,
    help="Seed of the random inputs and weights.")]
GoldenOpt = Annotated[Path | None, typer.Option("--golden",
    help="Compare with stored outputs.")]
SaveGoldenOpt = Annotated[Path | None, typer.Option("--save-golden",
    help="Store inputs and onnxruntime outputs.")]
LayerOpt = Annotated[str | None, typer.Option("--layer")]
TableTailOpt = Annotated[str | None, typer.Option("--tail-mode",
    help="pad | overlap | variable | tail-range")]
TableCombinationOpt = Annotated[str | None, typer.Option("--combination",
    help="simple | optimized")]
CacheOpt = Annotated[Path | None, typer.Option("--cache",
    help="Table cache directory (default: $XDG_CACHE_HOME/fuseplan/tables, else "
         "~/.cache/fuseplan/tables).")]


@app.callback()
def _options(quiet: Annotated[bool, typer.Option(
        "--quiet", "-q", help="No progress display on stderr.")] = False) -> None:
    """Layer-fusion planner for neural-network accelerators."""
    settings.quiet = quiet


def _shapes(values: Sequence[str] | None) -> dict[str, tuple[int, ...]]:
    return dict(parse_shape_option(v) for v in values or ())


def _mib(n: float) -> str:
    return f"{n / 2**20:,.2f} MiB"


def _plan_table(plan: Plan) -> Table:
    t = Table(title=f"fuseplan: {len(plan.groups)} groups ({plan.solver.get('name')}, "
                    f"{plan.solver.get('status')})")
    for col in ("id", "layers", "mode", "tile n×h×w", "halo", "weights", "DRAM", "redundant",
                "SRAM peak"):
        t.add_column(col, justify="left" if col in ("layers", "mode", "halo") else "right")
    for g in plan.groups:
        names = g.layers[0] if len(g.layers) == 1 \
            else f"{g.layers[0]} … {g.layers[-1]} ({len(g.layers)})"
        p = g.predicted
        mode = g.mode if g.placement.passes == 1 else f"{g.mode}, {g.placement.passes} passes"
        if g.placement.maps_held:
            mode += ", maps held"
        if g.placement.hidden_chunks > 1:
            mode += f", {g.placement.hidden_chunks} hidden chunks"
        if g.placement.inputs_reloaded:
            mode += ", inputs loaded again"
        t.add_row(str(g.id), names, mode, g.tile.label(),
                  "reuse" if g.halo_reuse else "recompute",
                  "resident" if g.weights_resident else "streamed", _mib(p.dram_bytes),
                  _mib(p.redundant_read_bytes), f"{p.sram_peak_bytes / 1024:,.0f} KiB")
    return t


def _totals_lines(plan: Plan) -> list[str]:
    t = plan.totals
    floor = plan.compulsory_dram_bytes
    lbl = plan.layer_by_layer_dram_bytes
    versus = (f"{t.dram_bytes / lbl:.2f}× layer-by-layer ({_mib(lbl)})" if lbl
              else "layer by layer does not fit this chip")
    return [
        f"DRAM traffic {_mib(t.dram_bytes)} = {t.dram_bytes / max(floor, 1):.2f}× the compulsory "
        f"floor ({_mib(floor)}), {versus}",
        f"weights read {_mib(t.weight_read_bytes)}; cycles {t.cycles:,}; energy "
        f"{t.energy_pj / 1e6:,.2f} µJ; solve {plan.solver.get('wall_s')} s",
    ]


def _attention_lines(problem: api.Problem, plan: Plan) -> list[str]:
    """Each fused attention's share of its group's traffic, the analytic count of its
    tiling (planner.geometry.attention)."""
    lines = []
    dt = problem.chip.dtype_bytes
    for g in plan.groups:
        for a in attention_traffic(problem.graph, group_io(problem.graph, g.layers), g.tile, dt):
            lines.append(
                f"attention {a.layer} (group {g.id}): q once {_mib(a.q_bytes)} + k and v "
                f"{a.passes}× {_mib(a.kv_bytes)} + o once {_mib(a.o_bytes)} = "
                f"{_mib(a.total)} analytic; the group moves {_mib(g.predicted.dram_bytes)}")
    return lines


@app.command()
@guarded
def solve(ctx: typer.Context, model: str, rules: RulesOpt = None, hw: HwOpt = None,
          set_: SetOpt = None,
          shape: ShapeOpt = None, objective: ObjOpt = None,
          solver: SolverOpt = "cpsat",
          time_limit: TimeOpt = None,
          jobs: SearchJobsOpt = 0,
          prefer: PreferOpt = None,
          battery: BatteryOpt = None,
          output: OutputOpt = None,
          report: ReportOpt = None,
          dynamic: DynamicOpt = None,
          tail_mode: TailModeOpt = "overlap",
          combination: CombinationOpt = "optimized",
          tail_range: TailRangeOpt = 0,
          as_json: JsonOpt = False) -> None:
    """Plan MODEL: fusion groups and tiles under the rules, on the chip."""
    check_files([model_in(model), rules_in(rules), hw_in(hw)],  # before the solve, not after
                [Output("-o/--output", output, "plan file"),
                 Output("--report", report, "HTML report")])
    if dynamic:
        doc = api.solve_dynamic(model, dynamic, rules, hw, _shapes(shape), set_ or (), solver,
                                objective, tail_mode, combination, tail_range)
        if output is not None:
            write_atomic(output, json.dumps(doc, indent=2) + "\n", "plan file")
        if as_json:
            emit(doc)
            return
        for g in doc["groups"]:
            units = ", ".join(f"{u['h']}×{u['w']}" for u in g["units"])
            out.print(f"group {g['id']} ({len(g['layers'])} layers): units {units}")
        out.print(f"dynamic plan over {doc['dynamic']['ranges']}"
                  + (f" written to {output}" if output is not None else ""))
        return
    problem = api.prepare(model, rules, hw, _shapes(shape), set_ or ())
    objective = api.resolve_objective(problem.ruleset, objective, prefer, battery)
    with working(f"planning {model} with {solver}"):
        started = ctx.obj if isinstance(ctx.obj, float) else None
        plan = api.plan_problem(problem, solver, objective, time_limit, started=started,
                                jobs=jobs)
    if output is not None:
        save_plan(plan, output)
    if report is not None:
        from fuseplan.planner.ui.report import write_report

        write_report(problem, plan, report, verify=True)
    if as_json:
        emit(plan_to_json(plan))
        return
    out.print(_plan_table(plan))
    for line in _totals_lines(plan) + _attention_lines(problem, plan):
        out.print(line)
    if output is not None:
        out.print(f"plan written to {output}")
    if report is not None:
        out.print(f"report written to {report}")


@app.command()
@guarded
def pareto(model: str, rules: RulesOpt = None, hw: HwOpt = None, set_: SetOpt = None,
           shape: ShapeOpt = None, time_limit: TimeOpt = None,
           jobs: SearchJobsOpt = 0,
           points: PointsOpt = 5,
           out_dir: OutDirOpt = Path("pareto"),
           plot: PlotOpt = None,
           as_json: JsonOpt = False) -> None:
    """Non-dominated (cycles, energy) plans, each written as a plan file that verifies."""
    if plot is not None and plot.suffix.lower() not in (".svg", ".png"):
        raise InputError(f"{plot}: --plot writes SVG or PNG; name the file *.svg or *.png.")
    check_files([model_in(model), rules_in(rules), hw_in(hw)],  # before the solves
                [Output("--out-dir", out_dir, "folder of plan files", folder=True,
                        writes=("pareto_*.json",)),
                 Output("--plot", plot, "chart")])
    problem = api.prepare(model, rules, hw, _shapes(shape), set_ or ())
    with working(f"sweeping {points} points of the cycles/energy front"):
        plans = api.pareto(problem, points, time_limit, jobs)
    make_dir(out_dir)
    rows: list[dict[str, Any]] = []
    try:
        for i, plan in enumerate(plans):
            path = out_dir / f"pareto_{i}.json"
            save_plan(plan, path)
            t = plan.totals
            rows.append({"cycles": t.cycles, "energy_pj": round(t.energy_pj, 3),
                         "dram_bytes": t.dram_bytes, "groups": len(plan.groups),
                         "plan": str(path)})
        if plot is not None and plot.suffix.lower() == ".png":
            write_atomic(plot, front_png(rows, model), "chart")
        elif plot is not None:
            write_atomic(plot, front_svg(rows), "chart")
    except KeyboardInterrupt:
        kept = ", ".join(r["plan"] for r in rows) or "none"
        raise Interrupted(f"kept {len(rows)} of {len(plans)} complete plan files ({kept}); no "
                          "partial file was left.") from None
    if as_json:
        emit({"points": rows})
        return
    table = Table(title=f"{len(rows)} non-dominated plans of {model}")
    for col in ("cycles", "energy µJ", "DRAM", "groups", "plan"):
        table.add_column(col, justify="left" if col == "plan" else "right")
    for r in rows:
        table.add_row(f"{r['cycles']:,}", f"{r['energy_pj'] / 1e6:,.2f}", _mib(r["dram_bytes"]),
                  str(r["groups"]), r["plan"])
    out.print(table)


@app.command()
@guarded
def partition(model: str, rules: RulesOpt = None, hw: HwOpt = None, set_: SetOpt = None,
              shape: ShapeOpt = None, objective: ObjOpt = None,
              policy: PolicyOpt = None,
              out_dir: PartsDirOpt = None,
              jobs: JobsOpt = 1,
              verify_chain: VerifyChainOpt = False,
              as_json: JsonOpt = False) -> None:
    """Seed 003: serial subgraphs, split until each compiles, then merged to balance."""
    check_files([model_in(model), rules_in(rules), hw_in(hw)],  # before the planning
                [Output("--out-dir", out_dir, "folder of subgraphs", folder=True,
                        writes=("subgraph_*.onnx", "subgraph_*.plan.json"))])
    problem = api.prepare(model, rules, hw, _shapes(shape), set_ or ())
    with working("cutting, compiling and merging serial subgraphs"):
        subs, whole = api.partition(problem, policy, out_dir, objective, jobs)
    report = None
    if verify_chain:
        report = api.verify_in_memory(problem, whole)
    rows = [{"id": i, "layers": list(s.layers), "inputs": list(s.inputs),
             "outputs": list(s.outputs), "macs": s.macs, "weight_bytes": s.weight_bytes,
             "nodes": s.nodes, "status": s.status, "reason": s.reason,
             "dram_bytes": s.plan.totals.dram_bytes if s.plan else None}
            for i, s in enumerate(subs)]
    doc: dict[str, Any] = {"subgraphs": rows, "dram_bytes": whole.totals.dram_bytes,
                           "compulsory_dram_bytes": whole.compulsory_dram_bytes}
    if report is not None:
        doc["verify"] = report.to_json()
    if as_json:
        emit(doc)
    else:
        t = Table(title=f"{len(rows)} serial subgraphs of {model}")
        for col in ("id", "layers", "nodes", "MACs", "weights", "DRAM", "status", "why"):
            t.add_column(col, justify="right" if col in ("nodes", "MACs") else "left")
        for r in rows:
            t.add_row(str(r["id"]), f"{r['layers'][0]} … {r['layers'][-1]}", str(r["nodes"]),
                      f"{r['macs']:,}", _mib(r["weight_bytes"]),
                      _mib(r["dram_bytes"] or 0), r["status"], r["reason"])
        out.print(t)
        out.print(f"whole chain: DRAM {_mib(whole.totals.dram_bytes)}")
        if report is not None:
            out.print(f"chain verifies against onnxruntime: {report.ok}")
    if report is not None and not report.ok:
        raise typer.Exit(1)


WeightsOpt = Annotated[str | None, typer.Option("--weights",
    help="model | random | auto (default): the model's own weights unless they are placeholders "
         "or leave a model output uninformative (constant, near zero, input-independent), "
         "then seeded random ones.")]


@app.command()
@guarded
def verify(model: str, plan: Path, seed: SeedOpt = 0,
           golden: GoldenOpt = None,
           save_golden: SaveGoldenOpt = None,
           hw: HwOpt = None, set_: SetOpt = None, shape: ShapeOpt = None,
           weights: WeightsOpt = None, as_json: JsonOpt = False) -> None:
    """Execute PLAN in the emulator and check every tensor it moves through DRAM, its bytes,
    its stated numbers and its cycles against onnxruntime (or a golden file)."""
    check_files([model_in(model), plan_in(plan), golden_in(golden), hw_in(hw)],
                [Output("--save-golden", save_golden, "golden file")])
    if api.is_dynamic(plan):
        if weights is not None:
            raise InputError("--weights applies to plans of one shape; a dynamic plan is "
                             "verified with seeded random weights where the model's are "
                             "placeholders. Leave --weights out.")
        report = api.verify_dynamic(model, plan, _shapes(shape), seed, hardware=hw,
                                    overrides=set_ or ())
    else:
        with working(f"emulating {plan} and running onnxruntime"):
            report = api.verify(model, plan, seed, golden, hw, set_ or (),
                                _shapes(shape) or None, weights or "auto")
    if save_golden is not None:
        api.write_golden(model, plan, seed, save_golden, _shapes(shape) or None,
                         weights or "auto", hw, set_ or ())
    if as_json:
        emit(report.to_json())
    else:
        from fuseplan.planner.ui.verify_view import print_verify

        print_verify(report)
    if not report.ok:
        raise typer.Exit(1)


@app.command()
@guarded
def compare(model: str, rules: RulesOpt = None, hw: HwOpt = None, set_: SetOpt = None,
            shape: ShapeOpt = None, objective: ObjOpt = None, time_limit: TimeOpt = None,
            jobs: SearchJobsOpt = 0, as_json: JsonOpt = False) -> None:
    """All four planners under the same rules and chip."""
    check_files([model_in(model), rules_in(rules), hw_in(hw)])
    problem = api.prepare(model, rules, hw, _shapes(shape), set_ or ())
    with working("planning with layer, greedy, shortest-path and cpsat"):
        rows = api.compare(problem, objective, time_limit, jobs)
    floor = next((p.compulsory_dram_bytes for _, p, _ in rows if p is not None), 0)
    if all(p is None for _, p, _ in rows):  # the answer is "no" from every planner
        err.print(f"no plan: no planner found a plan for {model} on this chip "
                  f"({rows[-1][0]}: {rows[-1][2]})", markup=False, highlight=False)
    if as_json:
        emit({"rows": [
            {"solver": name, "dram_bytes": p.totals.dram_bytes if p else None,
             "cycles": p.totals.cycles if p else None,
             "energy_pj": round(p.totals.energy_pj, 3) if p else None,
             "groups": len(p.groups) if p else None,
             "wall_s": p.solver.get("wall_s") if p else None, "status": status}
            for name, p, status in rows], "compulsory_dram_bytes": floor})
    else:
        _compare_table(model, floor, rows)
    if all(p is None for _, p, _ in rows):
        raise typer.Exit(1)


def _compare_table(model: str, floor: int, rows: Sequence[tuple[str, Plan | None, str]]
                   ) -> None:
    t = Table(title=f"planners on {model} (floor {_mib(floor)})")
    for col in ("solver", "DRAM", "× floor", "cycles", "energy µJ", "groups", "solve s", "status"):
        t.add_column(col, justify="left" if col in ("solver", "status") else "right")
    for name, p, status in rows:
        if p is None:
            t.add_row(name, "-", "-", "-", "-", "-", "-", status)
            continue
        tt = p.totals
        t.add_row(name, _mib(tt.dram_bytes), f"{tt.dram_bytes / max(floor, 1):.2f}",
                  f"{tt.cycles:,}", f"{tt.energy_pj / 1e6:,.2f}", str(len(p.groups)),
                  str(p.solver.get("wall_s")), status)
    out.print(t)


@app.command()
@guarded
def explain(model: str, plan: Path, layer: LayerOpt = None,
            rules: RulesOpt = None, hw: HwOpt = None, set_: SetOpt = None,
            as_json: JsonOpt = False) -> None:
    """Why each group ends where it does; re-check every group against the rules."""
    check_files([model_in(model), plan_in(plan), rules_in(rules), hw_in(hw)])
    doc = api.explain(model, plan, layer, rules, hw, set_ or ())
    if as_json:
        emit(doc)
    else:
        if layer is not None:
            out.print(f"layer {layer} is in group {doc['layer']['group']} "
                      f"({len(doc['layer']['group_layers'])} layers)")
        for b in doc["boundaries"]:
            out.print(f"group {b['group']} stops before {b['next_layer']}: "
                      + "; ".join(b["reasons"]))
        if doc["violations"]:
            for v in doc["violations"]:
                out.print(f"VIOLATION group {v['group']}: {v['rule']} {v['name']}: {v['message']}")
        else:
            out.print("every group passes every enabled rule and fits the chip")
    if doc["violations"]:
        raise typer.Exit(1)


def _tiled_label(layout: dict[str, Any]) -> str:
    """'NHWC r1 c2': the layout and the axes tiles cut as rows and columns ('-': none)."""
    axes = [f"{k}{layout[a]}" for k, a in (("n", "batch_axis"), ("r", "row_axis"),
                                           ("c", "col_axis")) if layout[a] is not None]
    return f"{layout['kind']} {' '.join(axes) or '-'}"


@app.command()
@guarded
def inspect(model: str, shape: ShapeOpt = None, as_json: JsonOpt = False) -> None:
    """The layer graph: op, class, output shape, weights, MACs, block of every layer."""
    check_files([model_in(model)])
    doc = api.inspect(model, _shapes(shape))
    if as_json:
        emit(doc)
        return
    t = Table(title=f"{model}: {len(doc['layers'])} layers, {len(doc['blocks'])} blocks")
    for col in ("name", "op", "class", "out shape", "tiled", "row map", "weight elems", "MACs",
                "block"):
        t.add_column(col, justify="right" if col in ("weight elems", "MACs") else "left")
    for lay in doc["layers"]:
        t.add_row(lay["name"], lay["op"], lay["class"], "×".join(map(str, lay["out_shape"])),
                  _tiled_label(lay["layout"]), ", ".join(lay["row_maps"]),
                  f"{lay['weight_elems']:,}", f"{lay['macs']:,}",
                  "" if lay["block"] is None else str(lay["block"]))
    out.print(t)
    tot = doc["totals"]
    out.print(f"inputs {doc['inputs']}; outputs {doc['outputs']}; weights "
              f"{tot['weight_elems']:,} elements; {tot['macs']:,} MACs")


@app.command()
@guarded
def demo(as_json: JsonOpt = False) -> None:
    """Solve and verify the bundled example with rules/default.yaml on the default chip."""
    import tempfile

    model = str(api.DEMO_MODEL)
    if not as_json:
        out.print(f"[bold]fuseplan demo[/]: {model}, rules/default.yaml, default chip")
    plan = api.solve(model)
    # the plan file goes to a private temporary folder: the working directory may be
    # read-only, and nothing of the demo is left behind
    with tempfile.TemporaryDirectory(prefix="fuseplan-demo-") as folder:
        path = Path(folder) / "plan.json"
        save_plan(plan, path)
        report = api.verify(model, path)
    if as_json:
        emit({"plan": plan_to_json(plan), "verify": report.to_json()})
        if not report.ok:
            raise typer.Exit(1)
        return
    out.print(_plan_table(plan))
    for line in _totals_lines(plan):
        out.print(line)
    out.print(f"verify: outputs match onnxruntime {report.outputs_match} (max rel err "
              f"{report.max_rel_err:.2g}); predicted == emulated bytes "
              f"{report.predicted_matches_emulated}; capacity violations "
              f"{len(report.capacity_violations)}; emulator {report.emulator_s:.3f} s vs "
              f"onnxruntime {report.reference_s:.3f} s")
    if not report.ok:
        raise typer.Exit(1)


@app.command("table")
@guarded
def table_cmd(plan: Path, shape: ShapeOpt = None,
              tail_mode: TableTailOpt = None,
              combination: TableCombinationOpt = None,
              cache: CacheOpt = None,
              as_json: JsonOpt = False) -> None:
    """The parameter table of a dynamic PLAN at a concrete --shape (seed 002).

    Tables are cached in --cache, by default the per-user cache folder
    $XDG_CACHE_HOME/fuseplan/tables (else ~/.cache/fuseplan/tables)."""
    check_files([plan_in(plan)], [Output("--cache", cache, "table cache folder", folder=True)])
    pending = None
    if combination is None:  # simple at once, optimized into the cache behind it
        doc, pending = api.table_first(plan, _shapes(shape), tail_mode, cache)
    else:
        doc = api.table(plan, _shapes(shape), tail_mode, combination, cache)
    if as_json:
        emit(doc)
        if pending is not None:
            pending.join()
        return
    t = Table(title=f"{doc['invocations']} unit invocations ({doc['combination']}, tail "
                    f"{doc['tail_mode']}, waste {doc['waste']:.1%}"
                    f"{', cached' if doc['cached'] else ''})")
    for col in ("group", "unit", "rows (offset, len)", "cols (offset, len)", "waste"):
        t.add_column(col)
    for e in doc["entries"][:60]:
        t.add_row(str(e["group"]), str(e["unit"]), str(tuple(e["h"])), str(tuple(e["w"])),
                  str(e["waste"]))
    out.print(t)
    if len(doc["entries"]) > 60:
        out.print(f"... {len(doc['entries']) - 60} more entries (--json for all)")
    c = doc["cost"]
    out.print(f"cost: DRAM {_mib(c['dram_bytes'])}, {c['macs']:,} MACs, halo re-reads "
              f"{_mib(c['redundant_read_bytes'])}; {doc['buckets']} tables cover the range")
    if pending is not None:
        out.print("the optimized table is being computed into the cache")
        pending.join()


@rules_app.command("check")
@guarded
def rules_check(path: Path, as_json: JsonOpt = False) -> None:
    """Validate a rule file and print the effective rule set."""
    check_files([yaml_in(path, "PATH", "rule file")])
    from fuseplan.rules.ruleset import load_rules

    rs = load_rules(path)
    doc = rs.summary()
    if as_json:
        emit(doc)
        return
    t = Table(title=f"{path}: {len(rs.enabled)} of {len(rs.rules)} rules enabled")
    for col in ("code", "rule", "on", "settings"):
        t.add_column(col)
    for r in doc["rules"]:
        settings = ", ".join(f"{k}={v}" for k, v in r.items()
                             if k not in ("code", "key", "title", "enabled"))
        t.add_row(r["code"], r["key"], "yes" if r["enabled"] else "no", settings)
    out.print(t)
    out.print(f"search: {doc['search']}")
    out.print(f"objective: {doc['objective']}")


@rules_app.command("doc")
@guarded
def rules_doc() -> None:
    """Print the rule catalogue (markdown) from the rule classes' docstrings."""
    from fuseplan.rules.ruleset import default_ruleset

    for r in default_ruleset().rules:
        doc = " ".join((type(r).__doc__ or "").split())
        params = ", ".join(f"`{f.name}`" for f in fields(r)  # type: ignore[arg-type]
                           if f.name != "enabled")
        sys.stdout.write(f"- **{r.code} `{r.key}`** — {doc}"
                         + (f" Parameters: {params}." if params else "")
                         + f" Default: {'on' if r.enabled else 'off'}.\n")


def main() -> None:
    """Console-script entry point: commands learn when the process started (``ctx.obj``),
    so --time-limit covers the imports too; called in process (tests), they count from
    their own start."""
    app(obj=STARTED)


register_views(app)  # report, export, diff
register_sweep(app)  # sweep
register_check(app)  # check
