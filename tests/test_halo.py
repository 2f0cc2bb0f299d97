"""Halo modes: reuse keeps shared rows on chip; both modes verify and the solvers pick one."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fuseplan.emulator.run import emulate
from fuseplan.hardware.chip import load_chip
from fuseplan.planner.app.assemble import assemble
from fuseplan.planner.app.verify import COUNTERS
from fuseplan.planner.cost.model import group_cost
from fuseplan.planner.cost.objective import Objective
from fuseplan.planner.front.graph_build import build_graph
from fuseplan.planner.front.onnx_load import load_model, random_inputs, run_onnxruntime
from fuseplan.planner.geometry.regions import Tile, anchor_extent, group_io
from fuseplan.planner.plan.placement import Placement

import models


def _graph(tmp: Path, model, name: str):
    loaded = load_model(str(models.save(model, tmp, name)))
    return loaded, build_graph(loaded)


def test_reuse_reads_each_input_row_once(tmp_path: Path) -> None:
    _, graph = _graph(tmp_path, models.chain_cnn(h=64, w=48), "chain")
    chip, _ = load_chip(None)
    layers = [lay.name for lay in graph.layers][:5]  # conv, relu, conv, relu, maxpool
    tile = Tile(1, 4, 48)
    recompute = group_cost(graph, layers, tile, chip)
    reuse = group_cost(graph, layers, tile, chip, halo_reuse=True)
    once = graph.elems(group_io(graph, layers).inputs[0]) * chip.dtype_bytes
    assert reuse.redundant_read_bytes == 0
    assert reuse.dram_read_bytes - reuse.weight_read_bytes == once
    assert recompute.redundant_read_bytes > 0
    assert reuse.macs < recompute.macs  # nothing recomputed
    # reuse keeps only the k - s border rows each conv reads again and computes only new
    # rows, so this tile needs less on-chip space than recomputing its halo
    assert 0 < reuse.sram_peak_bytes < recompute.sram_peak_bytes


def _cut(graph, split: int, th: int, tw: int | None, reuse: bool, resident_every: int = 1,
         buffered_every: int = 0, cores: int = 1, tn: int | None = None) -> list[Placement]:
    """The model's layers cut into `split` groups, tiled (tn, th, tw) where a group has one
    output (whole maps otherwise, and no reuse); reusing groups in one band per core
    (`cores` > 1) where they have that many tile columns and tiles of the whole batch."""
    names = [lay.name for lay in graph.layers]
    step = max(1, len(names) // split)
    groups = []
    for i in range(0, len(names), step):
        layers = names[i:i + step]
        io = group_io(graph, layers)
        n, h, w = anchor_extent(graph, io)
        single = len(io.outputs) == 1
        width = min(w, tw or w)
        images = min(n, tn or n)
        bands = cores if single and reuse and images == n and -(-w // width) >= cores else 1
        tile = Tile(images, min(h, th), width, bands) if single else Tile(n, h, w)
        groups.append(Placement.of(layers, tile, i % resident_every == 0,
                                   bool(buffered_every) and i % buffered_every == 0,
                                   single and reuse))
    return groups


@settings(max_examples=20, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10_000), size=st.integers(1, 9), split=st.integers(1, 4))
def test_reuse_plans_verify_on_random_cnns(tmp_path: Path, seed: int, size: int,
                                           split: int) -> None:
    """Full-width row tiles reusing halos, every other group double-buffered."""
    rng = np.random.default_rng(seed)
    loaded, graph = _graph(tmp_path, models.random_cnn(rng), f"r{seed}")
    chip, _ = load_chip(None)
    _verify_plan(graph, loaded, chip, _cut(graph, split, size, None, True, 1, 2), seed)


@pytest.mark.parametrize("solver", ["shortest-path", "cpsat"])
def test_solvers_choose_reuse_where_it_pays(tmp_path: Path, solver: str) -> None:
    from fuseplan.planner.app import api
    from fuseplan.planner.plan.json_io import save_plan

    path = models.save(models.chain_cnn(h=96, w=96), tmp_path, "chain")
    plan = api.solve(str(path), solver=solver, overrides=["sram.bytes=48KiB"])
    assert any(g.halo_reuse for g in plan.groups), [(g.layers, g.tile) for g in plan.groups]
    file = tmp_path / "plan.json"
    save_plan(plan, file)
    report = api.verify(str(path), file)
    assert report.ok, (report.first_output_mismatch, report.first_counter_mismatch)


def _verify_plan(graph, loaded, chip, groups: list[Placement], seed: int) -> None:
    plan = assemble(graph, chip, groups, model={}, hardware={}, rules={},
                    objective=Objective.TRAFFIC, solver={})
    inputs = random_inputs(loaded, seed)
    result = emulate(graph, plan, chip, inputs)
    reference, _ = run_onnxruntime(loaded.proto, inputs)
    for t in graph.outputs:
        np.testing.assert_allclose(result.outputs[t], reference[t], rtol=1e-3, atol=1e-4)
    assert not result.violations or any(g.predicted.sram_peak_bytes > chip.sram.bytes
                                        for g in plan.groups)
    for group, got in zip(plan.groups, result.groups, strict=True):  # cycles: test_clock.py
        assert [getattr(group.predicted, k) for k in COUNTERS] == \
            [getattr(got, k) for k in COUNTERS], (group.layers, group.tile, group.halo_reuse)


@settings(max_examples=25, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10_000), th=st.integers(1, 9), tw=st.integers(1, 9),
       split=st.integers(1, 4), reuse=st.booleans(),
       preset=st.sampled_from(["cluster4x4", "frustum_npu", "two_level", "manycore",
                               "fused_layer_fp32"]))
def test_2d_tiles_verify_in_both_halo_modes(tmp_path: Path, seed: int, th: int, tw: int,
                                            split: int, reuse: bool, preset: str) -> None:
    """Random CNNs on random chips cut into groups with (h, w) tiles: outputs match
    onnxruntime and every counter, the on-chip peak included, equals the prediction in
    both halo modes."""
    rng = np.random.default_rng(seed)
    loaded, graph = _graph(tmp_path, models.random_cnn(rng), f"t{seed}")
    chip, _ = load_chip(preset)
    _verify_plan(graph, loaded, chip, _cut(graph, split, th, tw, reuse, 3), seed)


@settings(max_examples=20, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10_000), batch=st.integers(2, 4), tn=st.integers(1, 3),
       th=st.integers(1, 9), tw=st.sampled_from([None, 3, 7]), split=st.integers(1, 3),
       preset=st.sampled_from(["cluster4x4", "two_level", "manycore", "soma_buffer"]))
def test_reuse_over_batch_parts_verifies(tmp_path: Path, seed: int, batch: int, tn: int,
                                         th: int, tw: int | None, split: int,
                                         preset: str) -> None:
    """Halo-reusing tiles of fewer images than the batch sweep one batch part after
    another: outputs match onnxruntime, every counter (the peak of one part's sweep, the
    DRAM bytes of all of them) equals the prediction."""
    rng = np.random.default_rng(seed)
    loaded, graph = _graph(tmp_path, models.random_cnn(rng, batch), f"b{seed}")
    chip, _ = load_chip(preset)
    groups = _cut(graph, split, th, tw, True, 2, 3, tn=min(tn, batch - 1))
    assert any(g.halo_reuse and g.tile.n < batch for g in groups)
    _verify_plan(graph, loaded, chip, groups, seed)


def test_reuse_over_batch_parts_costs_each_part_alike(tmp_path: Path) -> None:
    """A tile of one image of four reads every input row once and computes every element
    once, as the whole-batch tile does, and holds a quarter of its on-chip maps."""
    _, graph = _graph(tmp_path, models.chain_cnn(n=4, h=64, w=48), "chain4")
    chip, _ = load_chip(None)
    layers = [lay.name for lay in graph.layers][:5]  # conv, relu, conv, relu, maxpool
    whole = group_cost(graph, layers, Tile(4, 4, 48), chip, halo_reuse=True)
    one = group_cost(graph, layers, Tile(1, 4, 48), chip, halo_reuse=True)
    assert one.dram_read_bytes == whole.dram_read_bytes
    assert one.redundant_read_bytes == 0 and one.macs == whole.macs
    # the default chip keeps weights in WRAM: the SRAM peak is the maps alone
    assert 4 * one.sram_peak_bytes == whole.sram_peak_bytes


def test_bands_of_a_batch_part_are_refused_naming_the_group(tmp_path: Path) -> None:
    """Bands split the columns of tiles over the whole batch; a plan asking for bands of
    one image of two is an input error that names the group."""
    from fuseplan.planner.core.errors import InputError

    _, graph = _graph(tmp_path, models.chain_cnn(n=2, h=64, w=48), "chain2")
    chip, _ = load_chip(None)
    names = [lay.name for lay in graph.layers]
    layers, rest = names[:5], names[5:]
    n, h, w = anchor_extent(graph, group_io(graph, rest))
    with pytest.raises(InputError, match="bands need tiles over the whole batch"):
        assemble(graph, chip, [Placement.of(layers, Tile(1, 4, 12, 2), True, False, True),
                               Placement.of(rest, Tile(n, h, w))],
                 model={}, hardware={}, rules={}, objective=Objective.TRAFFIC, solver={})


def test_reuse_peaks_of_batch_parts_scale_from_one_image(tmp_path: Path) -> None:
    """The tile search takes a reusing tile's peak as its images times the one-image
    tile's: the same number the grid of that tile gives on its own."""
    from fuseplan.planner.geometry.halo_reuse import reuse_peak_elems
    from fuseplan.rules.ruleset import load_rules
    from fuseplan.solver.tiles import GroupSearch

    _, graph = _graph(tmp_path, models.chain_cnn(n=4, h=40, w=36), "chain4")
    chip, _ = load_chip(None)
    layers = [lay.name for lay in graph.layers][:5]
    search = GroupSearch.of(graph, layers, chip, load_rules(None))
    for n in (2, 3, 4):
        for th in (3, 7):
            for db in (False, True):
                tile = Tile(n, th, 36)
                scaled = reuse_peak_elems(graph, search.io, search.chains, tile, db,
                                          search.reuse_grid(tile))
                assert search.reuse_grid(tile).unit is not None
                assert scaled == reuse_peak_elems(graph, search.io, search.chains, tile, db)


@pytest.mark.parametrize("reuse", [False, True])
def test_per_channel_constants_are_not_cut_with_columns(tmp_path: Path, reuse: bool) -> None:
    """A BatchNormalization over 8 channels of an 8-column map: its 8 means are per
    channel, not a broadcast along the columns, so a 3-column tile takes them all."""
    b = models._Builder(np.random.default_rng(3))
    x = b.one("Relu", [b.bn(b.conv("input", 3, 8, 3, pad=1), 8)])
    model = b.model((2, 3, 8, 8), x, 13, name="bn_square")
    loaded, graph = _graph(tmp_path, model, "bn_square")
    chip, _ = load_chip(None)
    names = [lay.name for lay in graph.layers]
    _verify_plan(graph, loaded, chip, [Placement.of(names, Tile(1, 3, 3), True, False, reuse)],
                 3)


def test_2d_reuse_keeps_only_what_later_tiles_read(tmp_path: Path) -> None:
    """A 3x3 conv pair on 2x2 tiles: each element is read and computed once, and narrow
    tiles need less on-chip space than full-width ones (the kept band is the same, the new
    part smaller)."""
    loaded, graph = _graph(tmp_path, models.chain_cnn(h=16, w=16), "chain")
    chip, _ = load_chip(None)
    layers = [lay.name for lay in graph.layers][:4]  # conv, relu, conv, relu
    tile = Tile(1, 2, 2)
    reuse = group_cost(graph, layers, tile, chip, halo_reuse=True)
    whole = group_cost(graph, layers, Tile(1, 16, 16), chip)
    assert reuse.dram_read_bytes == whole.dram_read_bytes  # every input element read once
    assert reuse.macs == whole.macs  # nothing recomputed
    recompute = group_cost(graph, layers, tile, chip)
    assert recompute.macs > reuse.macs
    wide = group_cost(graph, layers, Tile(1, 2, 16), chip, halo_reuse=True)
    assert reuse.sram_peak_bytes < wide.sram_peak_bytes
    rest = [n for n in (lay.name for lay in graph.layers) if n not in layers]
    _verify_plan(graph, loaded, chip, [Placement.of(layers, tile, True, False, True),
                                       Placement.of(rest, Tile(1, 16, 16), True)], 0)


def test_recompute_rules_forbid_reuse(tmp_path: Path) -> None:
    """rules/recompute.yaml (search.halo_reuse off) plans the same model with no reusing
    group, paying for it in re-read halos, and its plan verifies."""
    from fuseplan.planner.app import api
    from fuseplan.planner.plan.json_io import save_plan
    from fuseplan.rules.ruleset import RULES_DIR

    path = models.save(models.chain_cnn(h=96, w=96), tmp_path, "chain")
    reuse = api.solve(str(path), overrides=["sram.bytes=48KiB"])
    plan = api.solve(str(path), rules=RULES_DIR / "recompute.yaml",
                     overrides=["sram.bytes=48KiB"])
    assert any(g.halo_reuse for g in reuse.groups)
    assert not any(g.halo_reuse for g in plan.groups)
    assert plan.totals.redundant_read_bytes > 0
    assert plan.totals.dram_bytes > reuse.totals.dram_bytes
    file = tmp_path / "plan.json"
    save_plan(plan, file)
    report = api.verify(str(path), file)
    assert report.ok, (report.first_output_mismatch, report.first_counter_mismatch)
