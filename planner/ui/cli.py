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
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from fuseplan.planner.core.budget import Budget
from fuseplan.planner.core.errors import InputError, Interrupted
from fuseplan.planner.core.files import make_dir, write_atomic
from fuseplan.planner.core.units import fmt_bytes, rel_path
from fuseplan.planner.ui import STARTED
from fuseplan.planner.ui.cli_check import register as register_check
from fuseplan.planner.ui.cli_common import (
    AnswerGroup,
    JsonOpt,
    Output,
    SetOpt,
    WideOpt,
    check_files,
    emit,
    golden_in,
    guarded,
    hw_in,
    model_in,
    out,
    plan_in,
    rules_in,
    say,
    settings,
    show,
    working,
    yaml_in,
)
from fuseplan.planner.ui.cli_sweep import register as register_sweep
from fuseplan.planner.ui.cli_views import register as register_views

if TYPE_CHECKING:
    from fuseplan.planner.plan.data import Plan

# The command line starts light: the planner (onnx, numpy, networkx, OR-Tools) is imported
# inside the commands that use it, so that --help and --version answer at once
# (tests/test_terminal.py checks it).

app = typer.Typer(cls=AnswerGroup, add_completion=False, no_args_is_help=True,
                  help="Layer-fusion planner for neural-network accelerators.")
rules_app = typer.Typer(add_completion=False, no_args_is_help=True, help="Rule files.")
app.add_typer(rules_app, name="rules")

# help texts are rich markup: a literal bracket is written \[
OBJECTIVES = ("traffic", "latency", "energy", "weighted")  # planner.cost.objective.Objective
RulesOpt = Annotated[str | None, typer.Option("--rules",
    help="Rule YAML (default rules/default.yaml).")]
HwOpt = Annotated[str | None, typer.Option("--hw", help="Chip YAML file or preset name.")]
ShapeOpt = Annotated[list[str] | None, typer.Option("--shape",
    help="Bind input dims: NAME=D0,D1,...")]
ObjOpt = Annotated[str | None, typer.Option("--objective",
    help="What the plan minimises: " + " | ".join(OBJECTIVES) + " (default: the rule file's).")]


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
    help="Time limit in seconds of each planning run; the best plan found by then is "
         "returned.")]
SolveTimeOpt = Annotated[float | None, typer.Option("--time-limit", callback=_seconds,
    help="Time limit in seconds from the command's start: the model's import stops at it "
         "(exit 1), the planning returns its best plan by then.")]
ImportTimeOpt = Annotated[float | None, typer.Option("--time-limit", callback=_seconds,
    help="Stop after this many seconds (exit 1) if the model is not imported by then.")]
SearchJobsOpt = Annotated[int, typer.Option("--jobs", "-j", min=0,
    help="Processes for the tile searches (0: every core). The plan does not depend on it.")]


SolverOpt = Annotated[str, typer.Option("--solver",
    help="cpsat | shortest-path | greedy | layer")]
PreferOpt = Annotated[str | None, typer.Option("--prefer",
    help="auto | latency | energy: plan for speed or for energy; auto picks from --battery.")]
BatteryOpt = Annotated[float | None, typer.Option("--battery", callback=_percent,
    help="Battery level in percent, for --prefer auto.")]
OutputOpt = Annotated[Path | None, typer.Option("-o", "--output",
    help="Write the plan JSON here.")]
ReportOpt = Annotated[Path | None, typer.Option("--report",
    help="Write a self-contained HTML report (verifies the plan).")]
DynamicOpt = Annotated[list[str] | None, typer.Option("--dynamic",
    help="A dynamic input axis NAME:AXIS=LO..HI, e.g. data:2=224..640: one plan for every "
         "size in the range (a dynamic plan; `fuseplan table` gives its parameters at a size).")]
TailModeOpt = Annotated[str, typer.Option("--tail-mode",
    help="How the last, partial tile of a dynamic axis runs: pad | overlap | variable | "
         "tail-range")]
CombinationOpt = Annotated[str, typer.Option("--combination",
    help="simple | optimized")]
TailRangeOpt = Annotated[int, typer.Option("--tail-range", min=0,
    help="tail-range mode: units accept \\[size-r, size].")]
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
LayerOpt = Annotated[str | None, typer.Option("--layer",
    help="A layer's name (`fuseplan inspect MODEL` lists them): what binds its group, with "
         "the numbers and what to change.")]
TableTailOpt = Annotated[str | None, typer.Option("--tail-mode",
    help="pad | overlap | variable | tail-range")]
TableCombinationOpt = Annotated[str | None, typer.Option("--combination",
    help="simple | optimized")]
CacheOpt = Annotated[Path | None, typer.Option("--cache",
    help="Table cache directory (default: $XDG_CACHE_HOME/fuseplan/tables, else "
         "~/.cache/fuseplan/tables).")]


def _version(value: bool) -> None:
    """--version: the installed package's version, then exit."""
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            number = version("fuseplan")
        except PackageNotFoundError:  # run from a checkout that is not installed
            number = "unknown (not installed)"
        sys.stdout.write(f"fuseplan {number}\n")
        raise typer.Exit()


@app.callback()
def _options(quiet: Annotated[bool, typer.Option(
        "--quiet", "-q", help="No progress display on stderr.")] = False,
        version: Annotated[bool, typer.Option(
            "--version", callback=_version, is_eager=True,
            help="Print fuseplan's version and exit.")] = False) -> None:
    """Layer-fusion planner for neural-network accelerators."""
    settings.quiet = quiet


def _shapes(values: Sequence[str] | None) -> dict[str, tuple[int, ...]]:
    from fuseplan.planner.front.onnx_load import parse_shape_option

    return dict(parse_shape_option(v) for v in values or ())


def _print_plan(plan: Plan, lines: Sequence[str] = ()) -> None:
    """The plan's table and its totals in sentences."""
    from fuseplan.planner.ui.cli_tables import plan_table, totals_lines

    out.print(plan_table(plan, out))
    for line in [*totals_lines(plan), *lines]:
        show(line)


@app.command()
@guarded
def solve(ctx: typer.Context, model: str, rules: RulesOpt = None, hw: HwOpt = None,
          set_: SetOpt = None,
          shape: ShapeOpt = None, objective: ObjOpt = None,
          solver: SolverOpt = "cpsat",
          time_limit: SolveTimeOpt = None,
          jobs: SearchJobsOpt = 0,
          prefer: PreferOpt = None,
          battery: BatteryOpt = None,
          output: OutputOpt = None,
          report: ReportOpt = None,
          dynamic: DynamicOpt = None,
          tail_mode: TailModeOpt = "overlap",
          combination: CombinationOpt = "optimized",
          tail_range: TailRangeOpt = 0,
          wide: WideOpt = False,
          as_json: JsonOpt = False) -> None:
    """Plan MODEL: fusion groups and tiles under the rules, on the chip."""
    from fuseplan.planner.app import api
    from fuseplan.planner.plan.json_io import plan_to_json, save_plan

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
            show(f"group {g['id']} ({len(g['layers'])} layers): units {units}")
        show(f"dynamic plan over {doc['dynamic']['ranges']}"
             + (f" written to {rel_path(output)}" if output is not None else ""))
        return
    with working(f"planning {model} with {solver}", as_json) as sink:
        started = ctx.obj if isinstance(ctx.obj, float) else None
        problem = api.prepare(model, rules, hw, _shapes(shape), set_ or (), progress=sink,
                              budget=Budget.of(time_limit, started))
        objective = api.resolve_objective(problem.ruleset, objective, prefer, battery)
        plan = api.plan_problem(problem, solver, objective, time_limit, started=started,
                                jobs=jobs, progress=sink)
    if output is not None:
        save_plan(plan, output)
    if report is not None:
        from fuseplan.planner.ui.report import write_report

        write_report(problem, plan, report, verify=True)
    if as_json:
        emit(plan_to_json(plan))
        return
    from fuseplan.planner.ui.cli_tables import attention_lines

    _print_plan(plan, attention_lines(problem, plan))
    if output is not None:
        show(f"plan written to {rel_path(output)}")
    if report is not None:
        show(f"report written to {rel_path(report)}")


@app.command()
@guarded
def pareto(model: str, rules: RulesOpt = None, hw: HwOpt = None, set_: SetOpt = None,
           shape: ShapeOpt = None, time_limit: TimeOpt = None,
           jobs: SearchJobsOpt = 0,
           points: PointsOpt = 5,
           out_dir: OutDirOpt = Path("pareto"),
           plot: PlotOpt = None,
           wide: WideOpt = False,
           as_json: JsonOpt = False) -> None:
    """Non-dominated (cycles, energy) plans, each written as a plan file that verifies."""
    from fuseplan.planner.app import api
    from fuseplan.planner.plan.json_io import save_plan
    from fuseplan.planner.ui.plots import front_png, front_svg

    if plot is not None and plot.suffix.lower() not in (".svg", ".png"):
        raise InputError(f"{plot}: --plot writes SVG or PNG; name the file *.svg or *.png.")
    check_files([model_in(model), rules_in(rules), hw_in(hw)],  # before the solves
                [Output("--out-dir", out_dir, "folder of plan files", folder=True,
                        writes=("pareto_*.json",)),
                 Output("--plot", plot, "chart")])
    with working(f"sweeping {points} points of the cycles/energy front", as_json) as sink:
        problem = api.prepare(model, rules, hw, _shapes(shape), set_ or (), progress=sink)
        plans = api.pareto(problem, points, time_limit, jobs, progress=sink)
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
    from fuseplan.planner.ui.cli_tables import pareto_table

    out.print(pareto_table(model, rows, out))


@app.command()
@guarded
def partition(model: str, rules: RulesOpt = None, hw: HwOpt = None, set_: SetOpt = None,
              shape: ShapeOpt = None, objective: ObjOpt = None,
              policy: PolicyOpt = None,
              out_dir: PartsDirOpt = None,
              jobs: JobsOpt = 1,
              verify_chain: VerifyChainOpt = False,
              wide: WideOpt = False,
              as_json: JsonOpt = False) -> None:
    """Cut MODEL into serial subgraphs that each compile on the chip, merged to balance."""
    from fuseplan.planner.app import api

    check_files([model_in(model), rules_in(rules), hw_in(hw)],  # before the planning
                [Output("--out-dir", out_dir, "folder of subgraphs", folder=True,
                        writes=("subgraph_*.onnx", "subgraph_*.plan.json"))])
    report = None
    with working("cutting, compiling and merging serial subgraphs", as_json) as sink:
        problem = api.prepare(model, rules, hw, _shapes(shape), set_ or (), progress=sink)
        subs, whole = api.partition(problem, policy, out_dir, objective, jobs, progress=sink)
        if verify_chain:
            report = api.verify_in_memory(problem, whole, progress=sink)
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
        from fuseplan.planner.ui.cli_tables import partition_table

        out.print(partition_table(model, rows, out))
        show(f"whole chain: DRAM {fmt_bytes(whole.totals.dram_bytes)}")
        if report is not None:
            show(f"chain verifies against onnxruntime: {report.ok}")
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
    from fuseplan.planner.app import api

    check_files([model_in(model), plan_in(plan), golden_in(golden), hw_in(hw)],
                [Output("--save-golden", save_golden, "golden file")])
    with working(f"emulating {plan} and running onnxruntime", as_json) as sink:
        if api.is_dynamic(plan):
            report = api.verify_dynamic(model, plan, _shapes(shape), seed, hardware=hw,
                                        overrides=set_ or (), weights=weights or "auto")
        else:
            report = api.verify(model, plan, seed, golden, hw, set_ or (),
                                _shapes(shape) or None, weights or "auto", progress=sink)
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
            jobs: SearchJobsOpt = 0, wide: WideOpt = False, as_json: JsonOpt = False) -> None:
    """All four planners under the same rules and chip."""
    from fuseplan.planner.app import api

    check_files([model_in(model), rules_in(rules), hw_in(hw)])
    with working("planning with layer, greedy, shortest-path and cpsat", as_json) as sink:
        problem = api.prepare(model, rules, hw, _shapes(shape), set_ or (), progress=sink)
        rows = api.compare(problem, objective, time_limit, jobs, progress=sink)
    floor = next((p.compulsory_dram_bytes for _, p, _ in rows if p is not None), 0)
    if all(p is None for _, p, _ in rows):  # the answer is "no" from every planner
        say(f"no planner found a plan for {model} on this chip ({rows[-1][0]}: "
            f"{rows[-1][2]})", "no plan")
    if as_json:
        emit({"rows": [
            {"solver": name, "dram_bytes": p.totals.dram_bytes if p else None,
             "cycles": p.totals.cycles if p else None,
             "energy_pj": round(p.totals.energy_pj, 3) if p else None,
             "groups": len(p.groups) if p else None,
             "wall_s": p.solver.get("wall_s") if p else None, "status": status}
            for name, p, status in rows], "compulsory_dram_bytes": floor})
    else:
        from fuseplan.planner.ui.cli_tables import compare_table

        out.print(compare_table(model, floor, rows, out))
    if all(p is None for _, p, _ in rows):
        raise typer.Exit(1)


@app.command()
@guarded
def explain(model: str, plan: Path, layer: LayerOpt = None,
            rules: RulesOpt = None, hw: HwOpt = None, set_: SetOpt = None,
            wide: WideOpt = False, as_json: JsonOpt = False) -> None:
    """Why each group ends where it does; re-check every group against the rules."""
    from fuseplan.planner.app import api

    check_files([model_in(model), plan_in(plan), rules_in(rules), hw_in(hw)])
    doc = api.explain(model, plan, layer, rules, hw, set_ or ())
    if as_json:
        emit(doc)
    else:
        from fuseplan.planner.ui.explain_view import print_explain

        print_explain(doc)
    if doc["violations"]:
        raise typer.Exit(1)


@app.command()
@guarded
def inspect(ctx: typer.Context, model: str, shape: ShapeOpt = None,
            time_limit: ImportTimeOpt = None, wide: WideOpt = False,
            as_json: JsonOpt = False) -> None:
    """The layer graph: op, class, output shape, weights, MACs, block of every layer."""
    from fuseplan.planner.app import api

    check_files([model_in(model)])
    started = ctx.obj if isinstance(ctx.obj, float) else None
    doc = api.inspect(model, _shapes(shape), Budget.of(time_limit, started))
    if as_json:
        emit(doc)
        return
    from fuseplan.planner.ui.cli_tables import inspect_table

    out.print(inspect_table(model, doc, out))
    tot = doc["totals"]
    show(f"inputs {doc['inputs']}; outputs {doc['outputs']}; weights "
         f"{tot['weight_elems']:,} elements; {tot['macs']:,} MACs")
    if doc["appends"]:
        show("KV caches appended in place (the plan writes only the new positions): " +
             ", ".join(f"{a['output']} = {a['cache']} + {a['new']}" for a in doc["appends"]))


@app.command()
@guarded
def demo(as_json: JsonOpt = False) -> None:
    """Solve and verify the bundled example with rules/default.yaml on the default chip."""
    import tempfile

    from fuseplan.planner.app import api
    from fuseplan.planner.plan.json_io import plan_to_json, save_plan

    model = str(api.DEMO_MODEL)
    if not as_json:
        out.print(f"[bold]fuseplan demo[/]: {rel_path(model)}, rules/default.yaml, default chip",
                  highlight=False)
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
    _print_plan(plan, [
        f"verify: outputs match onnxruntime {report.outputs_match} (max rel err "
        f"{report.max_rel_err:.2g}); predicted == emulated bytes "
        f"{report.predicted_matches_emulated}; capacity violations "
        f"{len(report.capacity_violations)}; emulator {report.emulator_s:.3f} s vs "
        f"onnxruntime {report.reference_s:.3f} s"])
    if not report.ok:
        raise typer.Exit(1)


SHOWN_ENTRIES = 60  # rows of `table`'s answer (--json holds all)


@app.command("table")
@guarded
def table_cmd(plan: Path, shape: ShapeOpt = None,
              tail_mode: TableTailOpt = None,
              combination: TableCombinationOpt = None,
              cache: CacheOpt = None,
              as_json: JsonOpt = False) -> None:
    """The parameter table of a dynamic PLAN (from `solve --dynamic`) at a concrete --shape.

    Tables are cached in --cache, by default the per-user cache folder
    $XDG_CACHE_HOME/fuseplan/tables (else ~/.cache/fuseplan/tables)."""
    from fuseplan.planner.app import api

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
    from fuseplan.planner.ui.cli_tables import dynamic_table

    out.print(dynamic_table(doc, out, SHOWN_ENTRIES))
    if len(doc["entries"]) > SHOWN_ENTRIES:
        show(f"... {len(doc['entries']) - SHOWN_ENTRIES} more entries (--json for all)")
    c = doc["cost"]
    show(f"cost: DRAM {fmt_bytes(c['dram_bytes'])}, {c['macs']:,} MACs, halo re-reads "
         f"{fmt_bytes(c['redundant_read_bytes'])}; {doc['buckets']} tables cover the range")
    if pending is not None:
        show("the optimized table is being computed into the cache")
        pending.join()


@rules_app.command("check")
@guarded
def rules_check(path: Path, as_json: JsonOpt = False) -> None:
    """Validate a rule file and print the effective rule set."""
    check_files([yaml_in(path, "PATH", "rule file")])
    from fuseplan.planner.ui.cli_tables import rules_table
    from fuseplan.rules.ruleset import load_rules

    rs = load_rules(path)
    doc = rs.summary()
    if as_json:
        emit(doc)
        return
    out.print(rules_table(str(path), doc, len(rs.enabled), out))
    for part in ("search", "objective"):
        show(f"{part}: " + ", ".join(f"{k}={getattr(v, 'value', v)}"
                                     for k, v in doc[part].items()))


@rules_app.command("doc")
@guarded
def rules_doc() -> None:
    """Print the rule catalogue (markdown) from the rule classes' docstrings."""
    import textwrap
    from dataclasses import fields

    from fuseplan.rules.ruleset import default_ruleset

    for r in default_ruleset().rules:
        doc = " ".join((type(r).__doc__ or "").split())
        params = ", ".join(f"`{f.name}`" for f in fields(r)  # type: ignore[arg-type]
                           if f.name != "enabled")
        item = (f"- **{r.code} `{r.key}`** — {doc}" + (f" Parameters: {params}." if params else "")
                + f" Default: {'on' if r.enabled else 'off'}.")
        # a markdown list item, its lines indented under it: 80 columns, the same list
        sys.stdout.write(textwrap.fill(item, width=80, subsequent_indent="  ",
                                       break_long_words=False, break_on_hyphens=False) + "\n")


def main() -> None:
    """Console-script entry point: commands learn when the process started (``ctx.obj``),
    so --time-limit covers the imports too; called in process (tests), they count from
    their own start."""
    app(obj=STARTED)


register_views(app)  # report, export, diff
register_sweep(app)  # sweep
register_check(app)  # check
