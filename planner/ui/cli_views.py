"""CLI commands that show a plan: ``report`` (HTML), ``export`` (annotated ONNX, dot), ``diff``.

``planner.ui.cli`` adds them to its app with ``register(app)``. They follow its conventions:
errors become exit codes through ``planner.ui.cli_common.guarded`` (InputError -> 2,
PlanningError -> 1), ``--json`` prints exactly one JSON document on stdout, and the answer
"no" (a failed verification in ``report``) exits with 1.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import RenderableType

from fuseplan.planner.core.errors import InputError
from fuseplan.planner.ui.cli_common import (
    JsonOpt,
    Output,
    SetOpt,
    check_files,
    emit,
    err,
    guarded,
    hw_in,
    model_in,
    out,
    plan_in,
    rules_in,
    show,
)
from fuseplan.planner.ui.tables import Col, table

if TYPE_CHECKING:
    from fuseplan.planner.plan.data import Plan

# --rules and --hw of a command that reads a plan default to what the plan records
RulesOpt = Annotated[str | None, typer.Option(
    "--rules", help="Rule YAML (default: the file the plan records).")]
HwOpt = Annotated[str | None, typer.Option(
    "--hw", help="Chip YAML file or preset name (default: the plan's chip).")]


# --------------------------------------------------------------------------- report


@guarded
def report(model: str, plan: Path,
           output: Annotated[Path, typer.Option("-o", "--output",
                                                help="Write the HTML report here.")],
           verify: Annotated[bool, typer.Option(
               "--verify/--no-verify",
               help="Emulate the plan first and show emulated bytes next to predicted.")] = True,
           seed: Annotated[int, typer.Option("--seed", help="Seed of the inputs and weights.")] = 0,
           rules: RulesOpt = None, hw: HwOpt = None, set_: SetOpt = None,
           as_json: JsonOpt = False) -> None:
    """Write a self-contained HTML report of PLAN: layer graph, groups, bytes, boundaries."""
    from fuseplan.planner.ui.report import load_problem_plan, write_report

    check_files([model_in(model), plan_in(plan), rules_in(rules), hw_in(hw)],
                [Output("-o/--output", output, "HTML report")])  # before the work
    problem, loaded = load_problem_plan(model, plan, rules, hw, set_ or ())
    if verify and not as_json:
        err.print(f"emulating {len(loaded.groups)} groups ...", highlight=False)
    result = write_report(problem, loaded, output, verify, seed)
    if as_json:
        emit({"report": str(output), "groups": len(loaded.groups),
               "fused_groups": sum(g.fused for g in loaded.groups),
               "verified": result is not None, "ok": None if result is None else result.ok,
               "verify": None if result is None else result.to_json()})
    else:
        show(f"report written to {output} ({len(loaded.groups)} groups"
             + ("" if result is None else
                f"; verification {'passed' if result.ok else 'FAILED'}") + ")")
    if result is not None and not result.ok:
        raise typer.Exit(1)


# --------------------------------------------------------------------------- export


@guarded
def export(model: str, plan: Path,
           output: Annotated[Path, typer.Option(
               "-o", "--output", help="Write the annotated ONNX model here.")],
           dot: Annotated[Path | None, typer.Option(
               "--dot", help="Also write a Graphviz dot file, one cluster per fused group.")
           ] = None,
           hw: HwOpt = None, set_: SetOpt = None, as_json: JsonOpt = False) -> None:
    """Write MODEL annotated with PLAN (node metadata_props and doc strings, for Netron)."""
    from fuseplan.planner.ui.export import export_dot, export_onnx
    from fuseplan.planner.ui.report import load_problem_plan

    check_files([model_in(model), plan_in(plan), hw_in(hw)],  # before the work
                [Output("-o/--output", output, "ONNX file"), Output("--dot", dot, "dot file")])
    problem, loaded = load_problem_plan(model, plan, None, hw, set_ or ())
    export_onnx(problem, loaded, output)
    if dot is not None:
        export_dot(problem, loaded, dot)
    if as_json:
        emit({"onnx": str(output), "dot": None if dot is None else str(dot),
               "nodes": len(problem.model.proto.graph.node), "groups": len(loaded.groups),
               "fused_groups": sum(g.fused for g in loaded.groups)})
        return
    show(f"annotated model written to {output} (metadata keys fuseplan.group, "
         "fuseplan.tile, fuseplan.predicted_dram_bytes on every node)")
    if dot is not None:
        show(f"Graphviz file written to {dot} (render: dot -Tsvg {dot} -o plan.svg)")


# --------------------------------------------------------------------------- diff


def _changes_table(doc: dict[str, Any], plan_a: Plan, plan_b: Plan) -> RenderableType:
    from fuseplan.planner.ui.diff import group_label

    def tile(t: dict[str, int]) -> str:
        return f"{t['n']}×{t['h']}×{t['w']}"

    rows = []
    for s in doc["split"]:
        rows.append(("split", group_label(plan_a, s["a"]),
                     "\n".join(group_label(plan_b, b) for b in s["into"])))
    for m in doc["merged"]:
        rows.append(("merged", "\n".join(group_label(plan_a, a) for a in m["from"]),
                     group_label(plan_b, m["b"])))
    for s in doc["same"]:
        if s["retiled"]:
            rows.append(("re-tiled", f"{group_label(plan_a, s['a'])}: {tile(s['tile_a'])}",
                         f"{group_label(plan_b, s['b'])}: {tile(s['tile_b'])}"))
    return table(out, "groups that changed (A → B)",
                 [Col("change"), Col("in A"), Col("in B")], rows)


def _totals_table(doc: dict[str, Any]) -> RenderableType:
    from fuseplan.planner.core.units import fmt_bytes

    def cell(v: Any, key: str) -> str:
        if v is None:
            return "-"
        if key.endswith("bytes"):
            return fmt_bytes(v)
        if key == "energy_pj":
            return f"{v / 1e6:,.2f}"
        return f"{v:,.0f}"

    rows = []
    for key, row in doc["totals"].items():
        ratio = row.get("ratio")
        label = "energy µJ" if key == "energy_pj" else key.removesuffix("_bytes").replace("_", " ")
        rows.append((label, cell(row["a"], key),
                     cell(row["b"], key), cell(row["delta"], key),
                     "-" if ratio is None else f"{ratio:.3f}"))
    return table(out, "totals", [Col(""), Col("A", num=True), Col("B", num=True),
                                 Col("B − A", num=True), Col("B / A", num=True)], rows)


@guarded
def diff(paths: Annotated[list[str], typer.Argument(
        metavar="[MODEL] PLAN_A PLAN_B",
        help="Two plan files, optionally after the model (else the model named in PLAN_A).")],
         as_json: JsonOpt = False) -> None:
    """What changed between two plans of a model: groups split, merged or re-tiled; totals."""
    from fuseplan.planner.ui.diff import diff_plans
    from fuseplan.planner.ui.report import load_problem_plan

    if len(paths) not in (2, 3):
        raise InputError("diff takes two plan files, optionally after the model: "
                         "`fuseplan diff [MODEL] PLAN_A PLAN_B`.")
    plan_a, plan_b = Path(paths[-2]), Path(paths[-1])
    check_files([plan_in(plan_a, "PLAN_A"), plan_in(plan_b, "PLAN_B")]
                + ([model_in(paths[0])] if len(paths) == 3 else []))
    model = paths[0] if len(paths) == 3 else _model_of(plan_a)

    _, a = load_problem_plan(model, plan_a)
    _, b = load_problem_plan(model, plan_b)
    doc = diff_plans(a, b)
    if as_json:
        emit(doc)
        return
    for name, path, p in (("A", plan_a, a), ("B", plan_b, b)):
        show(f"{name}: {path} ({len(p.groups)} group{'s' * (len(p.groups) != 1)}, rules "
             f"{p.rules.get('file')})")
    if doc["changed"]:
        out.print(_changes_table(doc, a, b))
    else:
        show("same groups and tiles")
    show(f"groups only in A: {len(doc['only_in_a'])}, only in B: {len(doc['only_in_b'])}, "
         f"unchanged: {sum(not s['retiled'] for s in doc['same'])}")
    out.print(_totals_table(doc))


def _model_of(plan: Path) -> str:
    """The model a plan file was made for (its "model.path")."""
    from fuseplan.planner.plan.schema import read_plan_doc

    path = read_plan_doc(plan)["model"].get("path")
    if not path:
        raise InputError(f"{plan}: not a plan file naming its model; pass the model first: "
                         "`fuseplan diff MODEL PLAN_A PLAN_B`.")
    return str(path)


# --------------------------------------------------------------------------- registration


def register(app: typer.Typer) -> None:
    """Add the ``report``, ``export`` and ``diff`` commands to ``app``."""
    app.command("report")(report)
    app.command("export")(export)
    app.command("diff")(diff)
