"""The Python API the CLI is a thin shell over: prepare, solve, verify, compare, explain."""

from __future__ import annotations

import functools
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from dataclasses import replace as dc_replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fuseplan.hardware.chip import Chip, chip_from_dict, chip_to_dict, load_chip
from fuseplan.planner.app.assemble import (
    assemble,
    layer_by_layer_bytes,
    layer_placements,
    layer_plan,
)
from fuseplan.planner.app.integrity import first_misstatement
from fuseplan.planner.core.budget import Budget
from fuseplan.planner.core.errors import InputError, Interrupted, PlanningError
from fuseplan.planner.core.files import make_dir, write_with
from fuseplan.planner.cost.objective import Objective, cycle_units, objective_units
from fuseplan.planner.front.graph_build import build_graph
from fuseplan.planner.front.onnx_load import (
    LoadedModel,
    load_model,
    random_inputs,
    randomize_weights,
    resolve_model,
    weights_are_placeholders,
)
from fuseplan.planner.ir.graph import Graph
from fuseplan.planner.ir.layout import Layout
from fuseplan.planner.plan.checks import whole_tile
from fuseplan.planner.plan.data import Plan
from fuseplan.planner.plan.json_io import load_plan, save_plan
from fuseplan.planner.plan.placement import Placement
from fuseplan.rules.ruleset import RuleSet, load_rules

if TYPE_CHECKING:  # the emulator loads only when a command verifies (a solve starts faster)
    from fuseplan.planner.app.verify import VerifyReport

SOLVERS = ("cpsat", "shortest-path", "greedy", "layer")
MIN_SOLVE_S = 0.5  # CP-SAT is not started with less time than this left
ASSEMBLY_S, ASSEMBLY_S_PER_LAYER = 0.8, 0.008  # what a time-limited plan keeps to assemble
# and print (measured on ResNet-152, 2 cores: 5 ms a layer to assemble, 0.5 s to print)


@dataclass(frozen=True)
class Problem:
    """A model, a chip and a rule set, loaded and checked."""

    model: LoadedModel
    graph: Graph
    chip: Chip
    chip_file: str
    chip_overrides: tuple[str, ...]
    ruleset: RuleSet

    def plan_header(self) -> dict[str, Any]:
        """The model/hardware/rules fields every plan file carries."""
        return {
            "model": {"path": self.model.path, "sha256": self.model.sha256,
                      "inputs": {k: list(v) for k, v in self.model.inputs.items()}},
            "hardware": {"name": self.chip.name, "file": self.chip_file,
                         "overrides": list(self.chip_overrides),
                         "spec": chip_to_dict(self.chip)},
            "rules": {"file": self.ruleset.file, "sha256": self.ruleset.sha256},
        }

    @functools.cached_property
    def layer_by_layer_bytes(self) -> int:
        """DRAM bytes of the layer-by-layer plan (every plan's reference), searched once."""
        return layer_by_layer_bytes(self.graph, self.chip)

    def layer_by_layer_on(self, jobs: int) -> int:
        """layer_by_layer_bytes, its searches (when not done yet) on up to `jobs` processes."""
        if "layer_by_layer_bytes" not in self.__dict__:  # cached_property's own slot
            self.__dict__["layer_by_layer_bytes"] = layer_by_layer_bytes(self.graph, self.chip,
                                                                         jobs)
        return self.layer_by_layer_bytes


def prepare(model: str, rules: str | Path | None = None, hardware: str | None = None,
            shapes: Mapping[str, tuple[int, ...]] | None = None,
            overrides: Sequence[str] = ()) -> Problem:
    """Load and check a model (path or zoo:NAME), a rule file and a chip (file or preset)."""
    loaded = load_model(model, dict(shapes or {}))
    chip, chip_file = load_chip(hardware, overrides)
    return Problem(loaded, build_graph(loaded), chip, chip_file, tuple(overrides),
                   load_rules(rules))


def objective_of(problem: Problem, objective: Objective | str | None) -> Objective:
    """The objective named by the user (parsed here, once), else the rules' default."""
    return problem.ruleset.objective.default if objective is None \
        else Objective.parse(objective)


def plan_problem(problem: Problem, solver: str = "cpsat",
                 objective: Objective | str | None = None, time_limit: float | None = None,
                 memo: dict[tuple[str, ...], Any] | None = None,
                 started: float | None = None, jobs: int = 1) -> Plan:
    """Plan a prepared problem with one of the four planners.

    ``time_limit`` bounds the whole planning, from ``started`` (a ``time.perf_counter()``
    reading: when the command began; now when None): tile searches and CP-SAT share it, and
    a plan cut short by it says so (status FEASIBLE, ``stopped``, and its gap to the floor
    under the traffic objective). ``memo`` (shortest-path and CP-SAT) holds each candidate
    group's best tile under this objective; pass the same dict to plans of overlapping
    subgraphs of one model so no group's tile search runs twice. ``jobs``: processes the tile
    searches run on, 0 for every core (solver.parallel; the plan is the same for any
    count)."""
    from fuseplan.solver.greedy import greedy_groups
    from fuseplan.solver.parallel import available_jobs
    from fuseplan.solver.shortest_path import shortest_path_groups

    if solver not in SOLVERS:
        raise InputError(f"unknown solver '{solver}'. Use one of: {', '.join(SOLVERS)}.")
    goal = objective_of(problem, objective)
    g, chip, rs = problem.graph, problem.chip, problem.ruleset
    header = problem.plan_header()
    jobs = jobs or available_jobs()
    budget = Budget.of(time_limit, started)
    started = time.perf_counter()
    # the searches leave time to assemble the plan (its groups' costs, the layer-by-layer
    # reference) and to write it
    searches = budget.less(ASSEMBLY_S + ASSEMBLY_S_PER_LAYER * len(g.layers))
    whole = whole_network(problem) if rs.search.whole_network_first and solver != "layer" \
        else None
    if whole is not None:
        at_once: dict[str, Any] = {"name": solver, "status": "WHOLE_NETWORK_ON_CHIP",
                                   "gap": 0.0, "wall_s": round(time.perf_counter() - started, 3)}
        return assemble(g, chip, [whole], objective=goal, solver=at_once, **header,
                        layer_by_layer=problem.layer_by_layer_on(jobs))
    info: dict[str, Any]
    if solver == "layer":  # no fusion: whole layers, tiled only where they do not fit
        info = {"name": "layer", "status": "OPTIMAL", "gap": 0.0,
                "wall_s": round(time.perf_counter() - started, 3)}
        return assemble(g, chip, layer_placements(g, chip), objective=goal, solver=info,
                        **header, layer_by_layer=problem.layer_by_layer_on(jobs))
    groups: list[Placement]
    if solver == "greedy":
        groups = greedy_groups(g, chip, rs)
        info = {"name": "greedy", "status": "FEASIBLE", "gap": None}
    elif solver == "shortest-path":
        groups = shortest_path_groups(g, chip, rs, goal, memo, budget=searches, jobs=jobs)
        # exact over intervals of the topological order, which are all groups only on a chain
        chain = all(g.dag.out_degree(n) <= 1 and g.dag.in_degree(n) <= 1 for n in g.dag)
        info = {"name": "shortest-path", "status": "OPTIMAL" if chain else "FEASIBLE",
                "gap": 0.0 if chain else None}
    else:
        groups, info = _cpsat(problem, goal, None, memo=memo, budget=searches, jobs=jobs)
    if budget.cuts:  # optimal only over what was searched: no proof of anything
        info.update(status="FEASIBLE", gap=None, stopped="; ".join(budget.cuts))
        info.pop("bound", None)
        info.pop("solved_by", None)
    info["wall_s"] = round(time.perf_counter() - started, 3)
    plan = assemble(g, chip, groups, objective=goal, solver=info, **header,
                    layer_by_layer=problem.layer_by_layer_on(jobs))
    if "solved_by" in info:  # proven by the path: its objective is the plan's, and the bound
        units = objective_units(plan.totals, goal, rs.objective, chip)
        plan = dc_replace(plan, solver={**plan.solver, "objective": float(units),
                                        "bound": float(units)})
    return _gap_to_floor(plan) if budget.cuts else plan


def _gap_to_floor(plan: Plan) -> Plan:
    """A plan cut short by its time limit, with its gap to the compulsory floor (a bound on
    every plan's traffic) under the traffic objective; other objectives have no such bound."""
    if plan.objective is not Objective.TRAFFIC:
        return plan
    moved, floor = plan.totals.dram_bytes, plan.compulsory_dram_bytes
    info = {**plan.solver, "bound": floor, "gap": round((moved - floor) / max(moved, 1), 6)}
    return dc_replace(plan, solver=info)


def whole_network(problem: Problem) -> Placement | None:
    """The one-group placement when every weight and the largest live set fit on chip and the
    enabled rules allow the network as one fused group."""
    from fuseplan.solver.tiles import GroupSearch

    g = problem.graph
    layers = tuple(lay.name for lay in g.layers)
    if len(layers) > problem.ruleset.search.max_group_layers:  # seed 004: "not too deep"
        return None
    search = GroupSearch.of(g, layers, problem.chip, problem.ruleset)
    tile = search.tile_of(search.heights()[0])
    if tile != whole_tile(g, layers) or search.violations(tile, True):
        return None
    return Placement.of(layers, tile, True)


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


def _cpsat(problem: Problem, objective: Objective, time_limit: float | None,
           cycles_cap: int | None = None, cache: dict[Objective, Any] | None = None,
           warm: Sequence[Placement] | None = None,
           memo: dict[tuple[str, ...], Any] | None = None, budget: Budget | None = None,
           jobs: int = 1) -> tuple[list[Placement], dict[str, Any]]:
    """CP-SAT groups warm-started from the shortest-path plan (or `warm`), and the solver
    info. ``cache`` keeps each objective's interval tiles across calls (a Pareto sweep);
    ``memo`` seeds this objective's interval tiles (shared by a partition's pieces);
    ``budget`` bounds the searches and the solve together (``time_limit`` bounds the solve
    alone)."""
    from fuseplan.solver.cpsat import faster_buffering, intervals_only, reserve_s, solve_cpsat
    from fuseplan.solver.shortest_path import shortest_path_groups

    g, chip, rs = problem.graph, problem.chip, problem.ruleset
    budget = Budget() if budget is None else budget
    cache = {} if cache is None else cache
    if objective not in cache:
        memo = {} if memo is None else memo  # each interval's best tile, computed once
        options: dict[tuple[str, ...], Any] = {}  # and its prefetch options
        whole_maps: dict[str, Any] = {}  # whole-map groups, found once for both planners
        bounded: set[tuple[str, ...]] = set()  # weighed by their floors, never searched
        # floors spare searches only where the path can prove its plan: where some
        # candidate is no interval of the order CP-SAT weighs (searches) every one anyway
        path = shortest_path_groups(g, chip, rs, objective, memo, options, budget, jobs,
                                    whole_maps, bounded,
                                    prune=rs.search.exact_path_first and intervals_only(g, rs))
        # + trade-off fronts (capped solves)
        cache[objective] = (memo, options, path, {}, whole_maps, bounded)
    memo, options, path, trade_offs, whole_maps, bounded = cache[objective]
    hint = path if warm is None else warm
    if rs.search.exact_path_first and warm is None and cycles_cap is None and path \
            and not cycle_units(objective, rs.objective, chip) \
            and intervals_only(g, rs, [p.layers for p in path], searched=memo.keys() | bounded):
        proof = ("shortest-path: costs add up and every candidate group is an interval of "
                 "the layer order")
        # buffering as CP-SAT picks it (the bytes do not depend on it)
        return [faster_buffering(g, chip, rs, p) for p in path], {
            "name": "cpsat", "status": "OPTIMAL", "gap": 0.0, "solved_by": proof}
    left = budget.left()
    if hint and left is not None and left < reserve_s(budget) + MIN_SOLVE_S:
        budget.cut("CP-SAT not run: the time limit passed in the tile search")
        return list(hint), {"name": "cpsat", "status": "FEASIBLE", "gap": None}
    try:
        result = solve_cpsat(g, chip, rs, objective, hint, time_limit, cycles_cap, memo,
                             options, trade_offs, budget, jobs, whole_maps)
    except PlanningError as exc:
        if hint and budget.left() is not None and "status UNKNOWN" in str(exc):
            budget.cut("CP-SAT found no plan in the time left; the shortest-path plan is "
                       "returned")
            return list(hint), {"name": "cpsat", "status": "FEASIBLE", "gap": None}
        if "MODEL_INVALID" not in str(exc):
            raise
        # the costs outgrow CP-SAT's 64-bit integers: the chip's numbers, not the time limit
        raise InputError(
            f"{_chip_place(problem)}: this model's {objective.value} costs on "
            f"this chip are too large for the solver (static_power_mw "
            f"{chip.static_power_mw:g}, clock_ghz {chip.clock_ghz:g}, dram.bandwidth_gbps "
            f"{chip.dram.bandwidth_gbps:g}, core.macs_per_cycle {chip.core.macs_per_cycle}). "
            "Give the chip realistic values (a faster clock or DRAM, less static power), or "
            "plan with --objective traffic or --solver shortest-path.") from None
    info = {"name": "cpsat", "status": result.status, "gap": round(result.gap, 6),
            "objective": result.objective, "bound": result.bound}
    if cycles_cap is not None:
        info["cycles_cap"] = cycles_cap
    groups = list(result.groups)
    if result.status != "OPTIMAL" and hint:
        # stopped by the time limit: never return worse than the plan it started from
        def units(placements: Sequence[Placement]) -> tuple[bool, int]:
            t = assemble(g, chip, placements, objective=objective, solver={}, model={},
                         hardware={}, rules={}, layer_by_layer=0).totals
            over = cycles_cap is not None and t.cycles > cycles_cap
            return over, objective_units(t, objective, rs.objective, chip)

        start = list(hint)
        if units(start) < units(groups):
            groups = start
            info["kept_warm_start"] = True
    return groups, info


def _chip_place(problem: Problem) -> str:
    """The chip file and its --set overrides, as a message names them."""
    where = problem.chip_file or problem.chip.name
    if problem.chip_overrides:
        where += " (" + ", ".join(f"--set {o}" for o in problem.chip_overrides) + ")"
    return where


def pareto(problem: Problem, points: int = 5, time_limit: float | None = None,
           jobs: int = 1) -> list[Plan]:
    """Non-dominated (cycles, energy) plans by epsilon constraints (seed 004 ¶49-54).

    The latency-optimal and energy-optimal plans bound the front; between them CP-SAT
    minimises energy with the plan's cycles capped at evenly spaced values, warm-started
    from the latency plan (which meets every cap). ``jobs``: processes the tile searches
    run on (0: every core).
    """
    from fuseplan.solver.parallel import available_jobs

    jobs = jobs or available_jobs()
    if points < 2:
        raise InputError(f"--points must be at least 2 (got {points}): the two ends of the "
                         "front. Pass --points 2 or more.")
    if whole_network(problem) is not None:  # one group: nothing to trade
        return [plan_problem(problem, "cpsat", Objective.LATENCY, time_limit, jobs=jobs)]
    header = problem.plan_header()
    cache: dict[Objective, Any] = {}

    def planned(objective: Objective, cap: int | None = None,
                warm: Sequence[Placement] | None = None) -> tuple[Plan, list[Placement]]:
        started = time.perf_counter()
        groups, info = _cpsat(problem, objective, time_limit, cap, cache, warm, jobs=jobs)
        info["wall_s"] = round(time.perf_counter() - started, 3)
        return assemble(problem.graph, problem.chip, groups, objective=objective, solver=info,
                        layer_by_layer=problem.layer_by_layer_bytes,
                        **header), groups

    fastest, _ = planned(Objective.LATENCY)
    cheapest, _ = planned(Objective.ENERGY)
    low, high = fastest.totals.cycles, cheapest.totals.cycles
    plans = [fastest, cheapest]
    for k in range(1, points - 1):
        cap = low + (high - low) * k // (points - 1)
        if cap <= low or cap >= high:
            continue
        start = blend(problem, fastest, cheapest, cap)
        try:
            plans.append(planned(Objective.ENERGY, cap, [g.placement for g in start.groups])[0])
        except PlanningError:  # no plan under this cap within the time limit: skip the point
            continue
    return non_dominated(plans)


def blend(problem: Problem, fast: Plan, cheap: Plan, cap: int) -> Plan:
    """A plan within `cap` cycles mixing two plans (the capped solves' warm start): where both
    plans cut the layer order at the same place, each stretch between such cuts comes from
    either plan; the cheap plan's stretches that save the most energy per extra cycle are
    taken while the total stays within the cap (the fast plan itself when none fits)."""
    g = problem.graph

    def cuts(plan: Plan) -> set[int]:
        spans = [(min(map(g.index, grp.layers)), max(map(g.index, grp.layers)))
                 for grp in plan.groups]
        return {p for p in range(len(g.layers)) if not any(a <= p < b for a, b in spans)}

    common = sorted(cuts(fast) & cuts(cheap))
    stretches = list(zip([-1, *common], common, strict=False))

    def part(plan: Plan, lo: int, hi: int) -> list[Any]:
        return [grp for grp in plan.groups if lo < g.index(grp.layers[0]) <= hi]

    def total(groups: Sequence[Any]) -> tuple[int, float]:
        return (sum(grp.predicted.cycles for grp in groups),
                sum(grp.predicted.energy_pj for grp in groups))

    gains = []
    for lo, hi in stretches:
        (fc, fe), (cc, ce) = total(part(fast, lo, hi)), total(part(cheap, lo, hi))
        if ce < fe:
            gains.append(((fe - ce) / max(cc - fc, 1), cc - fc, lo, hi))
    chosen: set[tuple[int, int]] = set()
    spent = fast.totals.cycles
    for _, extra, lo, hi in sorted(gains, reverse=True):
        if spent + extra <= cap:
            chosen.add((lo, hi))
            spent += extra
    placements = [grp.placement for lo, hi in stretches
                  for grp in part(cheap if (lo, hi) in chosen else fast, lo, hi)]
    mixed = assemble(g, problem.chip, placements, objective=Objective.ENERGY, solver={},
                     **problem.plan_header(), layer_by_layer=problem.layer_by_layer_bytes)
    return mixed if mixed.totals.cycles <= cap else fast


def non_dominated(plans: Sequence[Plan]) -> list[Plan]:
    """Plans no other plan beats on both cycles and energy, by increasing cycles."""
    keep: list[Plan] = []
    for p in sorted(plans, key=lambda p: (p.totals.cycles, p.totals.energy_pj)):
        if keep and p.totals.energy_pj >= keep[-1].totals.energy_pj:
            continue  # as slow or slower, and no less energy: dominated
        keep.append(p)
    return keep


def solve(model: str, rules: str | Path | None = None, hardware: str | None = None,
          shapes: Mapping[str, tuple[int, ...]] | None = None,
          objective: Objective | str | None = None,
          solver: str = "cpsat", time_limit: float | None = None,
          overrides: Sequence[str] = (), jobs: int = 1) -> Plan:
    """Plan a model: ``fuseplan.solve("model.onnx", rules=..., hardware=...)``; ``jobs``:
    processes the tile searches run on."""
    return plan_problem(prepare(model, rules, hardware, shapes, overrides), solver, objective,
                        time_limit, jobs=jobs)


def chip_for_plan(plan_doc_hardware: Mapping[str, Any], hardware: str | None,
                  overrides: Sequence[str]) -> tuple[Chip, str]:
    """The chip a plan was made for (embedded in the plan, so a moved plan still verifies),
    unless the user names another; --set overrides apply either way."""
    if hardware is not None:
        return load_chip(hardware, overrides)
    spec = plan_doc_hardware.get("spec")
    if isinstance(spec, Mapping) and not overrides:
        try:
            return chip_from_dict(spec), str(plan_doc_hardware.get("file", ""))
        except (TypeError, ValueError) as exc:
            raise InputError(f"the plan's embedded chip is invalid ({exc}); pass --hw.") from None
    file = plan_doc_hardware.get("file") or None
    saved = list(plan_doc_hardware.get("overrides", []))
    if file is not None and not Path(file).exists():
        file = plan_doc_hardware.get("name") or None
    return load_chip(file, saved + list(overrides))


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
           shapes: Mapping[str, tuple[int, ...]] | None = None) -> VerifyReport:
    """Emulate a plan file and check it against onnxruntime (or golden outputs)."""
    from fuseplan.planner.app.verify import load_golden, verify_plan

    plan_path = Path(plan_path)
    doc = _plan_header_of(plan_path)
    loaded = load_for_plan(model, plan_path, doc, shapes)
    chip, _ = chip_for_plan(doc.get("hardware", {}), hardware, overrides)
    golden_path = Path(golden) if golden is not None else None
    if golden_path is not None:
        inputs, _, seed = load_golden(golden_path)
    else:
        inputs = random_inputs(loaded, seed)
    weighted = randomize_weights(loaded, seed) if weights_are_placeholders(loaded) else loaded
    graph = build_graph(weighted)
    plan = load_plan(plan_path, graph, chip, loaded.sha256, check_stated_totals=False)
    report = verify_plan(weighted, graph, plan, chip, inputs, golden_path,
                         [set(g.get("predicted", {})) for g in doc["groups"]])
    # the stated numbers are re-derived on the chip the plan was made for, not on an
    # override the emulator runs it on (--hw/--set)
    # (a plan that does not say its chip is not checked under an override: nothing to
    # re-derive its numbers on)
    try:
        own_chip = chip if hardware is None and not overrides else \
            chip_for_plan(doc.get("hardware", {}), None, ())[0]
    except InputError:
        own_chip = None
    misstated = None if own_chip is None else \
        first_misstatement(graph, plan, own_chip, doc["groups"], doc.get("totals", {}))
    return dc_replace(report, first_misstatement=misstated)


def compare(problem: Problem, objective: Objective | str | None = None,
            time_limit: float | None = None, jobs: int = 1
            ) -> list[tuple[str, Plan | None, str]]:
    """All four planners on the same problem: (solver, plan or None, status or error);
    ``jobs``: processes the tile searches run on (0: every core)."""
    rows: list[tuple[str, Plan | None, str]] = []
    for name in ("layer", "greedy", "shortest-path", "cpsat"):
        try:
            plan = plan_problem(problem, name, objective, time_limit, jobs=jobs)
            rows.append((name, plan, str(plan.solver.get("status"))))
        except PlanningError as exc:
            rows.append((name, None, str(exc)))
    return rows


DEMO_MODEL = Path(__file__).resolve().parent.parent / "data" / "demo.onnx"


def write_golden(model: str, plan_path: str | Path, seed: int, path: str | Path,
                 shapes: Mapping[str, tuple[int, ...]] | None = None) -> None:
    """Store seeded inputs and onnxruntime outputs (with seeded weights) for `verify --golden`."""
    from fuseplan.planner.app.verify import save_golden
    from fuseplan.planner.front.onnx_load import run_onnxruntime

    loaded = load_model(model, dict(shapes or {}))
    if weights_are_placeholders(loaded):
        loaded = randomize_weights(loaded, seed)
    inputs = random_inputs(loaded, seed)
    outputs, _ = run_onnxruntime(loaded.proto, inputs)
    save_golden(Path(path), inputs, outputs, seed)


def explain(model: str, plan_path: str | Path, layer: str | None = None,
            rules: str | Path | None = None, hardware: str | None = None,
            overrides: Sequence[str] = ()) -> dict[str, Any]:
    """Boundaries, a layer's placement and a re-check of every group, as a JSON document."""
    from fuseplan.planner.app.explain import boundaries, recheck

    plan_path = Path(plan_path)
    doc = _plan_header_of(plan_path)
    loaded = load_for_plan(model, plan_path, doc)
    graph = build_graph(loaded)
    chip, _ = chip_for_plan(doc.get("hardware", {}), hardware, overrides)
    ruleset = load_rules(rules if rules is not None else doc.get("rules", {}).get("file") or None)
    plan = load_plan(plan_path, graph, chip, loaded.sha256)
    result: dict[str, Any] = {
        "boundaries": [{"group": b.group, "next_layer": b.next_layer, "reasons": b.reasons}
                       for b in boundaries(graph, plan, chip, ruleset)],
        "violations": [{"group": gid, "rule": v.rule, "name": v.name, "message": v.message,
                        "needed": v.needed, "allowed": v.allowed}
                       for gid, v in recheck(graph, plan, chip, ruleset)],
    }
    if layer is not None:
        owner = next((g for g in plan.groups if layer in g.layers), None)
        if owner is None:
            raise InputError(f"{plan_path}: no layer named '{layer}' in the plan. "
                             "`fuseplan inspect MODEL` lists the layer names.")
        result["layer"] = {"name": layer, "group": owner.id, "group_layers": list(owner.layers)}
        result["boundaries"] = [b for b in result["boundaries"]
                                if b["group"] == owner.id or b["next_layer"] == layer]
    return result


def _layout_doc(layout: Layout) -> dict[str, Any]:
    return {"kind": layout.kind.value, "batch_axis": layout.batch_axis,
            "row_axis": layout.row_axis, "col_axis": layout.col_axis}


def inspect(model: str, shapes: Mapping[str, tuple[int, ...]] | None = None) -> dict[str, Any]:
    """The layer graph as a JSON document."""
    loaded = load_model(model, dict(shapes or {}))
    g = build_graph(loaded)
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
        "outputs": {t: list(g.shapes[t]) for t in g.outputs},
        "layers": layers,
        "blocks": [{"id": b.id, "entry": b.entry, "exit": b.exit, "layers": list(b.layers)}
                   for b in g.blocks],
        "totals": {"layers": len(layers), "weight_elems": sum(x["weight_elems"] for x in layers),
                   "macs": sum(x["macs"] for x in layers)},
    }


def partition(problem: Problem, policy: str | None = None, out_dir: str | Path | None = None,
              objective: Objective | str | None = None, jobs: int = 1
              ) -> tuple[list[Any], Plan]:
    """Seed 003's serial subgraphs, each compiled (`jobs` at a time, in worker processes), and
    one plan of the whole model built from their plans (so the chain verifies in one
    emulation). With `out_dir`, each subgraph is written as an ONNX model with its plan
    file."""
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
        return plan_problem(sub, settings.planner, goal, memo=memo)

    subs = run_partition(problem.graph, problem.chip, problem.ruleset, settings, plan_part,
                         jobs, memo)
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

    make_dir(out_dir)
    extractor = Extractor(problem.model.proto)
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


def verify_in_memory(problem: Problem, plan: Plan, seed: int = 0) -> VerifyReport:
    """Verify a plan of a prepared problem without a plan file."""
    from fuseplan.planner.app.verify import verify_plan

    loaded = problem.model
    weighted = randomize_weights(loaded, seed) if weights_are_placeholders(loaded) else loaded
    graph = build_graph(weighted)
    return verify_plan(weighted, graph, plan, problem.chip, random_inputs(loaded, seed))


def _range_map(ranges: Sequence[str]) -> dict[str, dict[int, tuple[int, int]]]:
    from fuseplan.planner.app.dynamic import parse_dynamic_option

    out: dict[str, dict[int, tuple[int, int]]] = {}
    for text in ranges:
        name, axis, lo, hi = parse_dynamic_option(text)
        out.setdefault(name, {})[axis] = (lo, hi)
    return out


def solve_dynamic(model: str, ranges: Sequence[str], rules: str | Path | None = None,
                  hardware: str | None = None, shapes: Mapping[str, tuple[int, ...]] | None = None,
                  overrides: Sequence[str] = (), solver: str = "cpsat",
                  objective: Objective | str | None = None, tail: str = "overlap",
                  combination: str = "optimized", tail_range: int = 0) -> dict[str, Any]:
    """A dynamic plan (seed 002): the grouping planned once, at the largest shape of the
    ranges, and per group a library of static units sized so that each fits the chip at the
    largest shape (units are fixed tiles, so a unit that fits there fits everywhere)."""
    from fuseplan.planner.app.dynamic import TAIL_MODES, DynamicGroup, choose_units, dynamic_doc
    from fuseplan.planner.front.onnx_load import declared_input_dims
    from fuseplan.planner.plan.json_io import plan_to_json

    if tail not in TAIL_MODES:
        raise InputError(f"unknown tail mode '{tail}'. Use one of: {', '.join(TAIL_MODES)}.")
    if combination not in ("simple", "optimized"):
        raise InputError(f"unknown combination '{combination}'. Use simple or optimized.")
    by_input = _range_map(ranges)
    declared = declared_input_dims(model)
    largest: dict[str, tuple[int, ...]] = dict(shapes or {})
    for name, axes in by_input.items():
        if name not in declared:
            raise InputError(f"{model}: --dynamic names input '{name}', which the model does "
                             f"not have. Inputs: {', '.join(declared)}.")
        dims = list(largest.get(name, declared[name]))
        for axis, (_, hi) in axes.items():
            if not 0 <= axis < len(dims):
                raise InputError(f"{model}: --dynamic {name}:{axis}: input '{name}' has "
                                 f"{len(dims)} axes. Name an axis from 0 to {len(dims) - 1}.")
            dims[axis] = hi
        if any(not isinstance(d, int) or d < 1 for d in dims):
            raise InputError(f"{model}: input '{name}' still has an unbound dim {dims}; bind it "
                             "with --shape or give it a --dynamic range.")
        largest[name] = tuple(int(d) for d in dims)  # type: ignore[arg-type]
    # the grouping is planned at the largest shape: each group then has a tile that fits
    # there, so its units fit at every shape of the ranges (planned at the smallest, a group
    # holding a squeeze-excite pool and its scale fits only as one whole map, and no unit of
    # it fits a bigger map)
    problem = prepare(model, rules, hardware, largest, overrides)
    # a parameter table covers a group's output in one pass of whole layers: no pooling
    # passes, no hidden chunks here
    search = dc_replace(problem.ruleset.search, pooling_passes=False, hidden_chunks=False)
    problem = dc_replace(problem, ruleset=dc_replace(problem.ruleset, search=search))
    plan = plan_problem(problem, solver, objective)
    big = problem.graph
    groups = [DynamicGroup(g.layers, choose_units(big, g.layers, problem.chip,
                                                   g.weights_resident), g.weights_resident)
              for g in plan.groups]
    return dynamic_doc(problem.plan_header(), by_input, groups, tail, combination,  # type: ignore[arg-type]
                       tail_range, plan_to_json(plan))


def table(plan_path: str | Path, shapes: Mapping[str, tuple[int, ...]], tail: str | None = None,
          combination: str | None = None, cache_dir: str | Path | None = None,
          hardware: str | None = None, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """The parameter table of a dynamic plan at a concrete shape, from the cache if there."""
    import hashlib

    from fuseplan.planner.app.dynamic import (
        TableCache,
        buckets,
        group_table,
        in_range,
        read_dynamic,
        table_summary,
    )
    from fuseplan.planner.plan.checks import check_cover

    plan_path = Path(plan_path)
    doc = _read_json(plan_path)
    groups, settings = read_dynamic(doc, str(plan_path))
    tail = tail or settings["tail_mode"]
    combination = combination or settings["combination"]
    in_range(settings, shapes, str(plan_path))
    model_path = str(doc["model"]["path"])
    try:
        model_bytes = resolve_model(model_path).read_bytes()
    except InputError as exc:
        raise InputError(f"{plan_path}: model.path: {exc}") from None
    if doc["model"].get("sha256") != hashlib.sha256(model_bytes).hexdigest():
        raise InputError(_made_for(plan_path, doc, model_path))  # even with a cached table
    sha = hashlib.sha256(plan_path.read_bytes()).hexdigest()
    cache = TableCache(Path(cache_dir) if cache_dir is not None else Path(".fuseplan-cache"))
    hit = cache.get(sha, shapes, tail, combination)
    if hit is not None:
        return {**hit, "cached": True}
    loaded = load_model(model_path, dict(shapes))
    graph = build_graph(loaded)
    check_cover(graph, [g.layers for g in groups], str(plan_path))
    chip, _ = chip_for_plan(doc.get("hardware", {}), hardware, overrides)
    tables = [group_table(graph, i, g, chip, tail, combination, int(settings["tail_range"]))  # type: ignore[arg-type]
              for i, g in enumerate(groups)]
    result = table_summary(tables, tail, combination)  # type: ignore[arg-type]
    spans = [range(lo, hi + 1) for axes in settings["ranges"].values() for lo, hi in axes.values()]
    top = groups[0].units[0].h if groups else 0
    result["buckets"] = max((buckets(list(s), top) for s in spans), default=1)
    cache.put(sha, shapes, tail, combination, result)
    return {**result, "cached": False}


def table_first(plan_path: str | Path, shapes: Mapping[str, tuple[int, ...]],
                tail: str | None = None, cache_dir: str | Path | None = None
                ) -> tuple[dict[str, Any], Any]:
    """Seed 002 ¶193: the optimized table from the cache if it is there; else the simple
    table at once, with a thread (to join) computing the optimized one into the cache."""
    import threading

    cached = table(plan_path, shapes, tail, "optimized", cache_dir) \
        if _cache_has(plan_path, shapes, tail, cache_dir) else None
    if cached is not None:
        return cached, None
    simple = table(plan_path, shapes, tail, "simple", cache_dir)
    worker = threading.Thread(target=table, args=(plan_path, shapes, tail, "optimized",
                                                  cache_dir), daemon=True)
    worker.start()
    return {**simple, "pending": "optimized"}, worker


def _cache_has(plan_path: str | Path, shapes: Mapping[str, tuple[int, ...]], tail: str | None,
               cache_dir: str | Path | None) -> bool:
    import hashlib

    from fuseplan.planner.app.dynamic import TableCache, read_dynamic

    path = Path(plan_path)
    _, settings = read_dynamic(_read_json(path), str(path))
    cache = TableCache(Path(cache_dir) if cache_dir is not None else Path(".fuseplan-cache"))
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    return cache.get(sha, shapes, tail or settings["tail_mode"], "optimized") is not None


def _made_for(plan_path: Path, doc: Mapping[str, Any], model: str) -> str:
    """Why a dynamic plan does not fit the model file it is checked against."""
    stated = str(doc["model"].get("sha256", ""))
    made = doc["model"].get("path")
    if made and Path(str(made)).resolve() == Path(model).resolve():
        return (f"{plan_path}: this plan was made for model {made} (sha256 {stated[:12]}), "
                "which has changed since. Solve it again to get its plan: `fuseplan solve "
                "MODEL --dynamic NAME:AXIS=LO..HI -o PLAN.json`.")
    return (f"{plan_path}: this plan was made for model {made or 'sha256 ' + stated[:12]}, "
            f"not {model}. Pass that model, or solve this one again to get its plan: "
            "`fuseplan solve MODEL --dynamic NAME:AXIS=LO..HI -o PLAN.json`.")


def _read_json(path: Path) -> dict[str, Any]:
    from fuseplan.planner.plan.schema import read_json

    doc = read_json(path)
    if not isinstance(doc, dict):
        raise InputError(f"{path}: not a fuseplan plan.")
    return doc


def verify_dynamic(model: str, plan_path: str | Path, shapes: Mapping[str, tuple[int, ...]],
                   seed: int = 0, tail: str | None = None, combination: str | None = None,
                   hardware: str | None = None, overrides: Sequence[str] = ()) -> VerifyReport:
    """Execute a dynamic plan at a concrete shape through its parameter tables and check it."""
    from dataclasses import replace as dc_replace

    from fuseplan.planner.app.dynamic import group_table, in_range, read_dynamic
    from fuseplan.planner.app.verify import verify_plan
    from fuseplan.planner.geometry.regions import Tile
    from fuseplan.planner.plan.checks import check_cover, group_mode
    from fuseplan.planner.plan.data import Group
    from fuseplan.planner.plan.placement import WeightResidency

    plan_path = Path(plan_path)
    doc = _read_json(plan_path)
    groups, settings = read_dynamic(doc, str(plan_path))
    in_range(settings, shapes, str(plan_path))
    loaded = load_model(model, dict(shapes))
    if doc.get("model", {}).get("sha256") != loaded.sha256:
        raise InputError(_made_for(plan_path, doc, model))
    weighted = randomize_weights(loaded, seed) if weights_are_placeholders(loaded) else loaded
    graph = build_graph(weighted)
    check_cover(graph, [g.layers for g in groups], str(plan_path))
    chip, _ = chip_for_plan(doc.get("hardware", {}), hardware, overrides)
    made = []
    for i, g in enumerate(groups):
        t = group_table(graph, i, g, chip, tail or settings["tail_mode"],  # type: ignore[arg-type]
                        combination or settings["combination"], int(settings["tail_range"]))
        unit = g.units[0]
        tile = Tile(t.extent[0], unit.h or t.extent[1], unit.w or t.extent[2])
        placement = Placement(g.layers, tile, WeightResidency.of(g.weights_resident))
        made.append(Group(i, placement, group_mode(graph, g.layers, tile), t.cost, t.boxes))
    header = {k: doc.get(k, {}) for k in ("hardware", "rules")}
    base = layer_plan(graph, chip, model=doc["model"], **header)
    plan = dc_replace(base, groups=tuple(made))
    return verify_plan(weighted, graph, plan, chip, random_inputs(loaded, seed))


def is_dynamic(plan_path: str | Path) -> bool:
    """Whether a plan file is a dynamic plan."""
    try:
        return "dynamic" in _read_json(Path(plan_path))
    except InputError:
        return False
