"""Dynamic plans (dynamic shapes served by precompiled static units and parameter tables)
as the API runs them: solve_dynamic plans the grouping at the
largest shape of the ranges and gives each group its static units; table and table_first
give a plan's parameter tables at a concrete shape (from the cache when there);
verify_dynamic executes a plan through its tables and checks it. The units, covers, tables
and their cache are planner.app.dynamic's."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import replace as dc_replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fuseplan.planner.app.assemble import layer_plan
from fuseplan.planner.app.planning import plan_problem
from fuseplan.planner.app.problem import chip_for_plan, prepare
from fuseplan.planner.core.errors import InputError
from fuseplan.planner.cost.objective import Objective
from fuseplan.planner.front.graph_build import build_graph
from fuseplan.planner.front.onnx_load import (
    load_model,
    random_inputs,
    resolve_model,
)
from fuseplan.planner.plan.placement import Placement

if TYPE_CHECKING:  # the emulator loads only when a plan is verified
    from fuseplan.planner.app.verify import VerifyReport


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
    # a parameter table covers a group's output in one pass of whole layers, each cluster
    # with the whole weights: no pooling passes, no hidden or end chunks, no cluster split
    search = dc_replace(problem.ruleset.search, pooling_passes=False, hidden_chunks=False,
                        end_chunks=False, cluster_split=False)
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
    cache = TableCache(cache_path(cache_dir))
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
    cache = TableCache(cache_path(cache_dir))
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


def default_cache_dir() -> Path:
    """The per-user table cache: $XDG_CACHE_HOME/fuseplan/tables, else
    ~/.cache/fuseplan/tables (never the working directory, which may be a repository, shared
    or read-only; `table --cache DIR` chooses another)."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    # the XDG spec says a relative value is invalid and to be ignored
    root = Path(base) if base and os.path.isabs(base) else Path.home() / ".cache"
    return root / "fuseplan" / "tables"


def cache_path(cache_dir: str | Path | None) -> Path:
    """The table cache folder: `cache_dir` if given, else :func:`default_cache_dir`."""
    return Path(cache_dir) if cache_dir is not None else default_cache_dir()


def _read_json(path: Path) -> dict[str, Any]:
    from fuseplan.planner.plan.schema import read_json

    doc = read_json(path)
    if not isinstance(doc, dict):
        raise InputError(f"{path}: not a fuseplan plan.")
    return doc


def verify_dynamic(model: str, plan_path: str | Path, shapes: Mapping[str, tuple[int, ...]],
                   seed: int = 0, tail: str | None = None, combination: str | None = None,
                   hardware: str | None = None, overrides: Sequence[str] = (),
                   weights: str = "auto") -> VerifyReport:
    """Execute a dynamic plan at a concrete shape through its parameter tables and check
    every DRAM tensor, as `verify` checks a static plan: `weights` picks the model's own or
    seeded random weights (planner.app.verify_reference.choose_weights)."""
    from dataclasses import replace as dc_replace

    from fuseplan.planner.app.dynamic import group_table, in_range, read_dynamic
    from fuseplan.planner.app.verify import dram_tensors, verify_plan
    from fuseplan.planner.app.verify_reference import choose_weights
    from fuseplan.planner.geometry.regions import Tile
    from fuseplan.planner.plan.checks import check_cover, group_mode
    from fuseplan.planner.plan.data import Group

    plan_path = Path(plan_path)
    doc = _read_json(plan_path)
    groups, settings = read_dynamic(doc, str(plan_path))
    in_range(settings, shapes, str(plan_path))
    loaded = load_model(model, dict(shapes))
    if doc.get("model", {}).get("sha256") != loaded.sha256:
        raise InputError(_made_for(plan_path, doc, model))
    # The grouping and tables depend on shapes only: the graph of the loaded model serves
    # to build the plan, the weighted model's to run it.
    graph = build_graph(loaded)
    check_cover(graph, [g.layers for g in groups], str(plan_path))
    chip, _ = chip_for_plan(doc.get("hardware", {}), hardware, overrides)
    made = []
    for i, g in enumerate(groups):
        t = group_table(graph, i, g, chip, tail or settings["tail_mode"],  # type: ignore[arg-type]
                        combination or settings["combination"], int(settings["tail_range"]))
        unit = g.units[0]
        tile = Tile(t.extent[0], unit.h or t.extent[1], unit.w or t.extent[2])
        placement = Placement.of(g.layers, tile, g.weights_resident)
        made.append(Group(i, placement, group_mode(graph, g.layers, tile), t.cost, t.boxes))
    header = {k: doc.get(k, {}) for k in ("hardware", "rules")}
    base = layer_plan(graph, chip, model=doc["model"], **header)
    plan = dc_replace(base, groups=tuple(made))
    inputs = random_inputs(loaded, seed)
    weighted, choice, reference = choose_weights(loaded, dram_tensors(graph, plan), inputs,
                                                 seed, weights)
    return verify_plan(weighted, build_graph(weighted), plan, chip, inputs,
                       reference=reference, weights=choice)


def is_dynamic(plan_path: str | Path) -> bool:
    """Whether a plan file is a dynamic plan."""
    try:
        return "dynamic" in _read_json(Path(plan_path))
    except InputError:
        return False
