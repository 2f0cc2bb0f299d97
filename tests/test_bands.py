"""Bands: a halo-reusing group's tile columns split among the cores (planner.geometry.bands)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_halo import _cut, _graph, _verify_plan

from fuseplan.hardware.chip import load_chip
from fuseplan.planner.app.assemble import assemble
from fuseplan.planner.core.errors import InputError
from fuseplan.planner.cost.model import group_cost
from fuseplan.planner.cost.objective import Objective
from fuseplan.planner.geometry.bands import band_compute_cycles
from fuseplan.planner.geometry.halo_reuse import ReuseGrid
from fuseplan.planner.geometry.regions import Tile, anchor_extent, group_chains, group_io
from fuseplan.planner.plan.json_io import load_plan, plan_to_json
from fuseplan.planner.plan.mode import Mode
from fuseplan.planner.plan.placement import Placement
from fuseplan.rules.base import GroupFacts
from fuseplan.rules.ruleset import load_rules
from fuseplan.solver.capacity import physical_violations
from fuseplan.solver.tiles import GroupSearch

import models


@settings(max_examples=15, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10_000), th=st.integers(1, 6), tw=st.integers(1, 3),
       split=st.integers(1, 3),
       preset=st.sampled_from(["cluster4x4", "frustum_npu", "manycore"]))
def test_banded_plans_verify_on_random_cnns(tmp_path: Path, seed: int, th: int, tw: int,
                                            split: int, preset: str) -> None:
    """Random CNNs on multi-core chips with one band per core: outputs match onnxruntime and
    every counter (SRAM of the fullest cluster, the slowest band's compute) equals the
    prediction."""
    rng = np.random.default_rng(seed)
    loaded, graph = _graph(tmp_path, models.random_cnn(rng), f"b{seed}")
    chip, _ = load_chip(preset)
    _verify_plan(graph, loaded, chip, _cut(graph, split, th, tw, True, 2, 3, chip.cores),
                 seed)


@pytest.fixture(scope="module")
def wide(tmp_path_factory: pytest.TempPathFactory):
    """A conv pair over a 128 x 128 map: the rows (or columns) a reusing tile keeps span it."""
    loaded, graph = _graph(tmp_path_factory.mktemp("wide"), models.chain_cnn(h=128, w=128),
                           "wide")
    return loaded, graph, [lay.name for lay in graph.layers][:4]  # conv, relu, conv, relu


def test_bands_split_the_kept_rows_and_pay_with_their_overlap(wide) -> None:
    """16 bands on 4 clusters: each cluster keeps a quarter of the rows' width (plus the
    overlaps), the overlaps are recomputed and re-read, and the compute is the slowest
    band's on its one core."""
    _, graph, layers = wide
    chip, _ = load_chip("cluster4x4")
    one = group_cost(graph, layers, Tile(1, 1, 1), chip, halo_reuse=True)
    banded = group_cost(graph, layers, Tile(1, 1, 1, 16), chip, halo_reuse=True)
    assert banded.sram_peak_bytes < one.sram_peak_bytes / 2
    assert one.redundant_read_bytes == 0 < banded.redundant_read_bytes
    assert banded.macs > one.macs  # each band's first column recomputes its left border
    io = group_io(graph, layers)
    facts = GroupFacts(graph, io, group_chains(graph, io), Tile(1, 1, 1, 16), chip,
                       Mode.of(halo_reuse=True))
    once = graph.elems(io.inputs[0]) * chip.dtype_bytes
    assert facts.redundancy_pct() == pytest.approx(100 * banded.redundant_read_bytes / once)
    grids = ReuseGrid.bands_of(graph, io, group_chains(graph, io), Tile(1, 1, 1, 16))
    per_band = []
    for grid in grids:
        elems = {t: grid.made_elems(t) for t in graph.layer(layers[0]).outputs}
        assert elems  # every band computes its part of conv3
        macs = sum(graph.layer(n).macs_per_output * grid.made_elems(graph.layer(n).outputs[0])
                   for n in layers if graph.layer(n).is_main)
        ops = sum(graph.layer(n).macs_per_output * grid.made_elems(graph.layer(n).outputs[0])
                  for n in layers if not graph.layer(n).is_main)
        per_band.append(band_compute_cycles(chip, macs, ops, 16))
    assert banded.band_compute_cycles == max(per_band)
    # the cores work at once: far fewer cycles than one core running every band
    assert max(per_band) < sum(per_band) / 8


def _search(graph, layers, chip, bands: bool) -> GroupSearch:
    rules = load_rules(None)
    rules = dataclasses.replace(rules, search=dataclasses.replace(
        rules.search, two_d_tiles=True, narrow_tiles_below_rows=8, bands=bands))
    return GroupSearch.of(graph, layers, chip, rules)


def test_solver_bands_a_group_that_no_cluster_holds_alone(wide) -> None:
    """4 KiB of SRAM per cluster: no cluster holds the reusing group's kept rows alone, so
    the tile search spreads it over the 4 clusters in 16 bands (and cannot with bands off);
    the plan verifies with bytes equal to the prediction."""
    loaded, graph, layers = wide
    chip, _ = load_chip("cluster4x4", ["sram.bytes=4KiB"])
    assert physical_violations(_search(graph, layers, chip, True).facts(
        Tile(1, 1, 1), True, halo_reuse=True))
    best = _search(graph, layers, chip, True).best(Objective.TRAFFIC)
    assert best is not None and best.halo_reuse and best.tile.bands == 16
    assert not physical_violations(_search(graph, layers, chip, True).facts(
        best.tile, best.resident, best.double_buffered, True))
    off = _search(graph, layers, chip, False).best(Objective.TRAFFIC)
    assert off is None or off.tile.bands == 1 and off.cost.dram_bytes > best.cost.dram_bytes
    rest = [lay.name for lay in graph.layers][4:]
    n, h, w = anchor_extent(graph, group_io(graph, rest))
    _verify_plan(graph, loaded, chip, [best.placement(tuple(layers)),
                                       Placement.of(rest, Tile(n, h, w))], 0)


def test_bands_round_trip_and_bad_bands_are_named(wide, tmp_path: Path) -> None:
    """A plan file keeps the bands; bands on recomputing tiles, or a count that does not
    split the chip's clusters, are refused with the group named."""
    _, graph, layers = wide
    chip, _ = load_chip("cluster4x4")
    rest = [lay.name for lay in graph.layers][4:]
    n, h, w = anchor_extent(graph, group_io(graph, rest))
    plan = assemble(graph, chip, [Placement.of(layers, Tile(1, 2, 4, 8), True, False, True),
                                  Placement.of(rest, Tile(n, h, w))],
                    model={"sha256": "x"}, hardware={}, rules={}, objective=Objective.TRAFFIC,
                    solver={})
    doc = plan_to_json(plan)  # the schema that reads plan files checks it as it is written
    assert doc["groups"][0]["tile"]["bands"] == 8
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(doc))
    again = load_plan(path, graph, chip, "x")
    assert again.groups[0].tile == Tile(1, 2, 4, 8)
    doc["groups"][0]["halo"] = "recompute"
    path.write_text(json.dumps(doc))
    with pytest.raises(InputError, match="bands need"):
        load_plan(path, graph, chip, "x")
    with pytest.raises(InputError, match="do not split"):
        assemble(graph, chip, [Placement.of(layers, Tile(1, 2, 4, 6), True, False, True),
                               Placement.of(rest, Tile(n, h, w))],
                 model={}, hardware={}, rules={}, objective=Objective.TRAFFIC, solver={})
