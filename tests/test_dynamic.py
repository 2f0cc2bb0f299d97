"""Seed 002: one dynamic plan, parameter tables at many shapes, every tail mode verified."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fuseplan.planner.app import api
from fuseplan.planner.app.dynamic import cover_optimized, cover_simple
from fuseplan.planner.core.errors import InputError
from fuseplan.planner.cost.enumerated import enumerated_cost
from fuseplan.planner.cost.model import group_cost
from fuseplan.planner.front.graph_build import build_graph
from fuseplan.planner.front.onnx_load import load_model
from fuseplan.planner.geometry.regions import Tile, group_io, iter_tiles

import models

RANGES = ["x:2=64..1024", "x:3=64..1024"]


@pytest.fixture(scope="module")
def dynamic_plan(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("dyn")
    model = models.save(models.detection_net(), d, "det")
    doc = api.solve_dynamic(str(model), RANGES, solver="shortest-path")
    plan = d / "plan.json"
    plan.write_text(json.dumps(doc))
    return model, plan


def _shapes(seed: int, count: int) -> list[tuple[int, int]]:
    rng = np.random.default_rng(seed)
    # multiples of 4 (the model's strides) that no unit size (powers of two >= 8) divides
    return [(4 * int(rng.integers(16, 256)) | 4, 4 * int(rng.integers(16, 256)) | 4)
            for _ in range(count)]


def test_plan_records_units_and_ranges(dynamic_plan: tuple[Path, Path]) -> None:
    doc = json.loads(dynamic_plan[1].read_text())
    assert doc["dynamic"]["ranges"] == {"x": {"2": [64, 1024], "3": [64, 1024]}}
    for g in doc["groups"]:
        assert g["units"] and g["units"][0]["h"] >= g["units"][-1]["h"]


@pytest.mark.parametrize("tail", ["overlap", "pad", "variable", "tail-range"])
def test_every_tail_mode_verifies_at_random_shapes(dynamic_plan: tuple[Path, Path],
                                                   tail: str) -> None:
    model, plan = dynamic_plan
    for h, w in _shapes(hash(tail) % 1000, 5 if tail == "overlap" else 2):
        report = api.verify_dynamic(str(model), plan, {"x": (1, 3, h, w)}, tail=tail)
        assert report.outputs_match, (h, w, report.first_output_mismatch)
        assert report.predicted_matches_emulated, (h, w, report.first_counter_mismatch)
        assert not report.capacity_violations, (h, w, report.capacity_violations)


def test_optimized_table_never_wastes_more(dynamic_plan: tuple[Path, Path],
                                           tmp_path: Path) -> None:
    _, plan = dynamic_plan
    for h, w in _shapes(7, 6):
        shape = {"x": (1, 3, h, w)}
        simple = api.table(plan, shape, "pad", "simple", tmp_path)
        optimized = api.table(plan, shape, "pad", "optimized", tmp_path)
        assert optimized["waste"] <= simple["waste"], (h, w)
        covered = {(e["h"][0], e["h"][1]) for e in optimized["entries"] if e["group"] == 0}
        assert max(o + n for o, n in covered) <= h  # offsets and lengths stay in the map


def test_cover_tail_modes() -> None:
    assert [(b.offset, b.length) for b in cover_simple(100, 32, "variable", 0)] == \
        [(0, 32), (32, 32), (64, 32), (96, 4)]
    assert [(b.offset, b.length) for b in cover_simple(100, 32, "overlap", 0)][-1] == (68, 32)
    assert sum(b.waste for b in cover_simple(100, 32, "pad", 0)) == 28
    # tail-range 16 (lengths 16..32): a 4-row tail is rebalanced with the block before it
    assert [(b.offset, b.length) for b in cover_simple(100, 32, "tail-range", 16)][-2:] == \
        [(64, 18), (82, 18)]
    mixed = cover_optimized(100, [32, 16, 8, 4], "pad", 0)
    assert sum(b.waste for b in mixed) == 0 and sum(b.length for b in mixed) == 100


def test_table_cache_and_range_checks(dynamic_plan: tuple[Path, Path], tmp_path: Path) -> None:
    _, plan = dynamic_plan
    shape = {"x": (1, 3, 196, 340)}
    first = api.table(plan, shape, cache_dir=tmp_path)
    again = api.table(plan, shape, cache_dir=tmp_path)
    assert not first["cached"] and again["cached"]
    assert again["entries"] == first["entries"]
    assert first["buckets"] >= 2
    with pytest.raises(InputError, match="outside the plan's range"):
        api.table(plan, {"x": (1, 3, 2000, 340)}, cache_dir=tmp_path)


def test_enumerated_cost_equals_closed_form(tmp_path: Path) -> None:
    model = models.save(models.residual_net(h=48, w=40), tmp_path, "res")
    graph = build_graph(load_model(str(model)))
    from fuseplan.hardware.chip import load_chip

    chip, _ = load_chip(None)
    names = [lay.name for lay in graph.layers]
    for a, b in ((0, 4), (3, 9), (5, 12)):
        layers = names[a:b]
        io = group_io(graph, layers)
        if len(io.outputs) != 1:
            continue
        for th in (5, 12, 48):
            tile = Tile(1, th, 40)
            boxes = list(iter_tiles(graph, io, tile))
            for db in (False, True):
                closed = group_cost(graph, layers, tile, chip, True, db)
                assert enumerated_cost(graph, layers, boxes, chip, True, db) == closed, (a, b, th)


def test_simple_table_first_then_optimized_from_cache(dynamic_plan: tuple[Path, Path],
                                                      tmp_path: Path) -> None:
    _, plan = dynamic_plan
    shape = {"x": (1, 3, 484, 612)}
    first, pending = api.table_first(plan, shape, "pad", tmp_path)
    assert first["combination"] == "simple" and first["pending"] == "optimized"
    pending.join()
    second, none = api.table_first(plan, shape, "pad", tmp_path)
    assert none is None and second["cached"] and second["combination"] == "optimized"
    assert second["waste"] <= first["waste"]


def test_dynamic_verify_checks_every_dram_tensor(dynamic_plan: tuple[Path, Path]) -> None:
    """A dynamic plan is verified as a static one is: every tensor that crosses DRAM against
    its reference, under the weights `--weights` picks (issue 43)."""
    model, plan = dynamic_plan
    shape = {"x": (1, 3, 100, 68)}
    auto = api.verify_dynamic(str(model), plan, shape)
    assert auto.ok, auto.first_output_mismatch
    assert auto.weights is not None and auto.weights.requested == "auto"
    groups = json.loads(plan.read_text())["groups"]
    # one checked tensor per group output at least (the model output is the last group's)
    assert auto.checked_tensors >= len(groups) and len(auto.tensors) == auto.checked_tensors
    forced = api.verify_dynamic(str(model), plan, shape, weights="random")
    assert forced.ok and forced.weights is not None and forced.weights.used == "random"
    with pytest.raises(InputError, match="unknown --weights"):
        api.verify_dynamic(str(model), plan, shape, weights="golden")
