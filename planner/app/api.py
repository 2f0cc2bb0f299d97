"""The Python API the CLI is a thin shell over: prepare, solve, verify, compare, explain.

The facade: its commands delegate to the modules beside it, and it re-exports their public
names, so callers import everything from here. The Problem record and the chip a plan was
made for: planner.app.problem; the planners behind plan_problem: planner.app.planning;
Pareto fronts: planner.app.pareto; dynamic plans and their parameter tables:
planner.app.dynamic_api."""

from __future__ import annotations

import functools
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fuseplan.planner.app.dynamic_api import is_dynamic as is_dynamic
from fuseplan.planner.app.dynamic_api import solve_dynamic as solve_dynamic
from fuseplan.planner.app.dynamic_api import table as table
from fuseplan.planner.app.dynamic_api import table_first as table_first
from fuseplan.planner.app.dynamic_api import verify_dynamic as verify_dynamic
from fuseplan.planner.app.pareto import blend as blend
from fuseplan.planner.app.pareto import non_dominated as non_dominated
from fuseplan.planner.app.pareto import pareto as pareto
from fuseplan.planner.app.planning import ASSEMBLY_S as ASSEMBLY_S
from fuseplan.planner.app.planning import ASSEMBLY_S_PER_LAYER as ASSEMBLY_S_PER_LAYER
from fuseplan.planner.app.planning import MIN_SOLVE_S as MIN_SOLVE_S
from fuseplan.planner.app.planning import SOLVERS as SOLVERS
from fuseplan.planner.app.planning import plan_problem as plan_problem
from fuseplan.planner.app.planning import whole_network as whole_network
from fuseplan.planner.app.problem import Problem as Problem
from fuseplan.planner.app.problem import chip_for_plan as chip_for_plan
from fuseplan.planner.app.problem import objective_of as objective_of
from fuseplan.planner.app.problem import prepare as prepare
from fuseplan.planner.core.budget import Budget
from fuseplan.planner.core.errors import InputError, Interrupted, PlanningError
from fuseplan.planner.core.files import make_dir, write_with
from fuseplan.planner.core.progress import Progress as Progress
from fuseplan.planner.core.progress import ProgressSink as ProgressSink
from fuseplan.planner.core.progress import within
from fuseplan.planner.cost.objective import Objective
from fuseplan.planner.front.graph_build import build_graph
from fuseplan.planner.front.onnx_load import (
    LoadedModel,
    load_model,
    random_inputs,
    resolve_model,
)
from fuseplan.planner.ir.graph import Graph
from fuseplan.planner.ir.layout import Layout
from fuseplan.planner.plan.data import Plan
from fuseplan.planner.plan.json_io import load_plan, save_plan
from fuseplan.rules.ruleset import RuleSet, load_rules

if TYPE_CHECKING:  # the emulator loads only when a command verifies (a solve starts faster)
    from fuseplan.emulator.run import Corruption
    from fuseplan.planner.app.verify import VerifyReport


def resolve_objective(ruleset: RuleSet, objective: str | None, prefer: str | None,
                      battery: float | None) -> Objective | None:
    """Seed 004's choice between time and energy: an explicit objective wins; `auto` picks
    energy when the battery is below the rules' threshold, else latency."""
    if objective is not None or prefer is None:
        return None if objective is None else Objective.parse(objective)
    if prefer not in ("auto", "latency", "energy"):
        raise InputError(f"unknown --prefer '{prefer}'. Use auto, latency or energy.")
    if prefer != "auto":
        return Objective(prefer)
    if battery is None:
        raise InputError("--prefer auto needs --battery PERCENT (the device's battery level).")
    return Objective.ENERGY if battery < ruleset.objective.battery_threshold_pct \
        else Objective.LATENCY


def solve(model: str, rules: str | Path | None = None, hardware: str | None = None,
          shapes: Mapping[str, tuple[int, ...]] | None = None,
          objective: Objective | str | None = None,
          solver: str = "cpsat", time_limit: float | None = None,
          overrides: Sequence[str] = (), jobs: int = 1,
          progress: ProgressSink | None = None) -> Plan:
    """Plan a model: ``fuseplan.solve("model.onnx", rules=..., hardware=...)``; ``jobs``:
    processes the tile searches run on; ``progress``: told of every phase as it goes
    (planner.core.progress; the plan is the same with it or without). ``time_limit`` runs
    from the call: the model's import stops at it too (OutOfTime), the planning returns
    its best plan by then."""
    started = time.perf_counter()
    problem = prepare(model, rules, hardware, shapes, overrides, progress,
                      Budget.of(time_limit, started))
    return plan_problem(problem, solver, objective, time_limit, started=started, jobs=jobs,
                        progress=progress)


def _plan_header_of(plan_path: Path) -> dict[str, Any]:
    """A plan file's JSON, validated against the plan schema (InputError naming the JSON
    path of a bad value)."""
    from fuseplan.planner.plan.schema import read_plan_doc

    return read_plan_doc(plan_path)


def load_for_plan(model: str, plan_path: Path, doc: Mapping[str, Any],
                  shapes: Mapping[str, tuple[int, ...]] | None = None) -> LoadedModel:
    """The model a plan file is checked against, at the plan's input shapes unless `shapes`
    are given. When those shapes do not fit because the plan was made for another model,
    say so, rather than blame a --shape the user never gave."""
    import hashlib

    try:
        return load_model(model, dict(shapes or _plan_shapes(doc)))
    except InputError:
        if shapes or not _plan_shapes(doc):
            raise
        sha = hashlib.sha256(resolve_model(model).read_bytes()).hexdigest()
        stated = doc["model"]["sha256"]
        if sha == stated:
            raise
        raise InputError(f"{plan_path}: this plan was made for a different model, "
                         f"{doc['model'].get('path') or 'sha256 ' + stated[:12]}, not {model}. "
                         "Pass that model, or solve this model again to get its plan.") from None


def _plan_shapes(doc: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """The input shapes a plan was made for."""
    model = doc.get("model")
    inputs = model.get("inputs") if isinstance(model, dict) else None
    if not isinstance(inputs, dict):
        return {}
    return {k: tuple(v) for k, v in inputs.items() if isinstance(v, list)}


def verify(model: str, plan_path: str | Path, seed: int = 0, golden: str | Path | None = None,
           hardware: str | None = None, overrides: Sequence[str] = (),
           shapes: Mapping[str, tuple[int, ...]] | None = None, weights: str = "auto",
           corrupt: Corruption | None = None,
           progress: ProgressSink | None = None) -> VerifyReport:
    """Emulate a plan file and check every tensor it moves through DRAM, its counters, its
    stated numbers and its cycles against onnxruntime (or golden outputs); ``weights``:
    auto | model | random (planner.app.verify_file); ``corrupt``: the emulator's test hook;
    ``progress``: told of the loading, the reference run and the groups emulated."""
    from fuseplan.planner.app.verify_file import verify_file

    plan_path = Path(plan_path)
    if progress is not None:
        progress(Progress("loading model"))
    doc = _plan_header_of(plan_path)
    loaded = load_for_plan(model, plan_path, doc, shapes)
    return verify_file(loaded, plan_path, doc, seed, None if golden is None else Path(golden),
                       hardware, overrides, weights, corrupt, progress)


def compare(problem: Problem, objective: Objective | str | None = None,
            time_limit: float | None = None, jobs: int = 1,
            progress: ProgressSink | None = None) -> list[tuple[str, Plan | None, str]]:
    """All four planners on the same problem: (solver, plan or None, status or error);
    ``jobs``: processes the tile searches run on (0: every core); ``progress``: told of each
    planner's phases, each tagged with the planner ("greedy, 2 of 4")."""
    rows: list[tuple[str, Plan | None, str]] = []
    names = ("layer", "greedy", "shortest-path", "cpsat")
    for k, name in enumerate(names, 1):
        try:
            plan = plan_problem(problem, name, objective, time_limit, jobs=jobs,
                                progress=within(progress, f"{name}, {k} of {len(names)}"))
            rows.append((name, plan, str(plan.solver.get("status"))))
        except PlanningError as exc:
            rows.append((name, None, str(exc)))
    return rows


DEMO_MODEL = Path(__file__).resolve().parent.parent / "data" / "demo.onnx"


def write_golden(model: str, plan_path: str | Path, seed: int, path: str | Path,
                 shapes: Mapping[str, tuple[int, ...]] | None = None, weights: str = "auto",
                 hardware: str | None = None, overrides: Sequence[str] = ()) -> None:
    """Store seeded inputs and onnxruntime's values of the model's outputs and of every
    tensor the plan moves through DRAM (under the weights `weights` picks) for
    `verify --golden`."""
    from fuseplan.planner.app.verify_file import write_golden_file

    plan_path = Path(plan_path)
    doc = _plan_header_of(plan_path)
    loaded = load_for_plan(model, plan_path, doc, shapes)
    write_golden_file(loaded, plan_path, doc, seed, Path(path), weights, hardware, overrides)


def explain(model: str, plan_path: str | Path, layer: str | None = None,
            rules: str | Path | None = None, hardware: str | None = None,
            overrides: Sequence[str] = ()) -> dict[str, Any]:
    """Boundaries, a layer's placement and a re-check of every group, as a JSON document."""
    from fuseplan.planner.app.explain import explain_doc

    plan_path = Path(plan_path)
    doc = _plan_header_of(plan_path)
    loaded = load_for_plan(model, plan_path, doc)
    graph = build_graph(loaded)
    chip, _ = chip_for_plan(doc.get("hardware", {}), hardware, overrides)
    ruleset = load_rules(rules if rules is not None else doc.get("rules", {}).get("file") or None)
    plan = load_plan(plan_path, graph, chip, loaded.sha256)
    return explain_doc(graph, plan, chip, ruleset, layer, str(plan_path))


def _layout_doc(layout: Layout) -> dict[str, Any]:
    return {"kind": layout.kind.value, "batch_axis": layout.batch_axis,
            "row_axis": layout.row_axis, "col_axis": layout.col_axis}


def inspect(model: str, shapes: Mapping[str, tuple[int, ...]] | None = None,
            budget: Budget | None = None) -> dict[str, Any]:
    """The layer graph as a JSON document (OutOfTime where ``budget``'s limit passes before
    the graph is built)."""
    loaded = load_model(model, dict(shapes or {}), budget)
    g = build_graph(loaded, budget)
    block_of = {}
    for b in sorted(g.blocks, key=lambda b: -len(b.layers)):  # innermost block wins
        for n in b.layers:
            block_of[n] = b.id
    layers = [{"name": lay.name, "op": lay.op, "class": lay.op_class.value,
               "out_shape": list(lay.out_shape), "weight_elems": lay.weight_elems,
               "macs": lay.macs, "block": block_of.get(lay.name),
               "inputs": list(lay.fmap_inputs), "outputs": list(lay.outputs),
               # how tiles cut the output, and each feature-map input's rows and columns
               # for a range of the output's (planner.ir.layout, planner.ir.graph.AxisMap)
               "layout": _layout_doc(g.layout(lay.outputs[0])),
               "row_maps": [m.label() for m in lay.row_maps],
               "col_maps": [m.label() for m in lay.col_maps]}
              for lay in g.layers]
    return {
        "model": {"path": loaded.path, "sha256": loaded.sha256, "opset": loaded.opset},
        "inputs": {k: list(v) for k, v in loaded.inputs.items()},
        "outputs": {t: list(g.shapes[t]) for t in loaded.outputs},
        # KV caches appended in place (planner.front.kv_cache): the plan writes `new`
        "appends": [{"output": a.output, "cache": a.cache, "new": a.new, "axis": a.axis}
                    for a in g.appends],
        "layers": layers,
        "blocks": [{"id": b.id, "entry": b.entry, "exit": b.exit, "layers": list(b.layers)}
                   for b in g.blocks],
        "totals": {"layers": len(layers), "weight_elems": sum(x["weight_elems"] for x in layers),
                   "macs": sum(x["macs"] for x in layers)},
    }


def partition(problem: Problem, policy: str | None = None, out_dir: str | Path | None = None,
              objective: Objective | str | None = None, jobs: int = 1,
              progress: ProgressSink | None = None) -> tuple[list[Any], Plan]:
    """Seed 003's serial subgraphs, each compiled (`jobs` at a time, in worker processes), and
    one plan of the whole model built from their plans (so the chain verifies in one
    emulation). With `out_dir`, each subgraph is written as an ONNX model with its plan
    file. ``progress``: told of the pieces compiled and the merges tried (and, with one
    job, of each piece's planning)."""
    from dataclasses import replace as dc_replace

    from fuseplan.planner.app.partition import combined_plan, restrict
    from fuseplan.planner.app.partition import partition as run_partition

    settings = problem.ruleset.partition
    if policy is not None:
        if policy not in ("threshold", "forward", "bidirectional"):
            raise InputError(f"unknown --policy '{policy}'. Use threshold, forward or "
                             "bidirectional.")
        settings = dc_replace(settings, policy=policy)  # type: ignore[arg-type]
    goal = objective_of(problem, objective)
    header = problem.plan_header()

    memo: dict[tuple[str, ...], Any] = {}  # shared by every piece and merge trial

    def plan_part(graph: Graph, layers: Sequence[str]) -> Plan:
        sub = dc_replace(problem, graph=restrict(graph, layers))
        # a piece planned in this process tells its phases (one in a worker tells nobody)
        inner = within(progress, f"a piece of {len(layers)} layers") if jobs <= 1 else None
        return plan_problem(sub, settings.planner, goal, memo=memo, progress=inner)

    subs = run_partition(problem.graph, problem.chip, problem.ruleset, settings, plan_part,
                         jobs, memo, progress)
    if progress is not None:
        progress(Progress("assembling plan"))
    whole = combined_plan(problem.graph, problem.chip, subs, header, goal) \
        if all(s.status == "ok" for s in subs) else None
    if out_dir is not None:
        subs = _write_parts(problem, subs, Path(out_dir))
    if whole is None:
        failed = next(s for s in subs if s.status != "ok")
        raise PlanningError(f"subgraph starting at '{failed.layers[0]}' does not compile: "
                            f"{failed.reason}")
    return subs, whole


def _save_onnx(proto: Any, path: Path) -> None:
    import onnx

    onnx.save(proto, str(path))


def _write_parts(problem: Problem, subs: Sequence[Any], out_dir: Path) -> list[Any]:
    """Each subgraph as an ONNX model (onnx.utils.Extractor) and its plan file."""
    import hashlib
    from dataclasses import replace as dc_replace

    from onnx.utils import Extractor

    from fuseplan.planner.front.fills import materialized

    make_dir(out_dir)
    extractor = Extractor(materialized(problem.model.proto))  # the parts' files hold bytes
    written: list[Any] = []
    files: list[str] = []
    try:
        for i, sub in enumerate(subs):
            model_path = out_dir / f"subgraph_{i}.onnx"
            part = extractor.extract_model(list(sub.inputs), list(sub.outputs))
            write_with(model_path, functools.partial(_save_onnx, part), "subgraph ONNX file")
            files.append(str(model_path))
            if sub.plan is not None:
                # the model's own shapes: the graph may read a tensor in a finer shape
                # (planner.front.batch_unmerge), the subgraph file has the model's
                declared = {vi.name: [d.dim_value for d in vi.type.tensor_type.shape.dim]
                            for vi in part.graph.input}
                header = {"path": str(model_path),
                          "sha256": hashlib.sha256(model_path.read_bytes()).hexdigest(),
                          "inputs": {t: declared[t] if all(d > 0 for d in declared.get(t, [0]))
                                     else list(problem.graph.shapes[t]) for t in sub.inputs}}
                plan = dc_replace(sub.plan, model=header)
                save_plan(plan, out_dir / f"subgraph_{i}.plan.json")
                files.append(str(out_dir / f"subgraph_{i}.plan.json"))
                sub = dc_replace(sub, plan=plan)
            written.append(sub)
    except KeyboardInterrupt:
        raise Interrupted(f"wrote {len(written)} of {len(subs)} subgraphs before the stop; "
                          f"kept {len(files)} complete files ({', '.join(files) or 'none'}) "
                          "and no partial one.") from None
    return written


def verify_in_memory(problem: Problem, plan: Plan, seed: int = 0,
                     progress: ProgressSink | None = None) -> VerifyReport:
    """Verify a plan of a prepared problem without a plan file, as `verify` does one with
    `--weights auto`: the model's own weights unless they are placeholders or leave an
    output uninformative, then seeded random ones (planner.app.verify_reference);
    ``progress``: told of the reference run and the groups emulated."""
    from fuseplan.planner.app.verify import REFERENCE_PHASE, dram_tensors, verify_plan
    from fuseplan.planner.app.verify_reference import choose_weights

    loaded = problem.model
    inputs = random_inputs(loaded, seed)
    if progress is not None:
        progress(Progress(REFERENCE_PHASE))
    weighted, choice, reference = choose_weights(
        loaded, dram_tensors(problem.graph, plan), inputs, seed, "auto")
    graph = build_graph(weighted)
    return verify_plan(weighted, graph, plan, problem.chip, inputs, reference=reference,
                       weights=choice, progress=progress)
