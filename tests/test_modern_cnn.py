"""Squeeze-excite and global reductions in tiles (issue 16): a reduction over rows and columns
that ends a group folds each tile into an on-chip accumulator; broadcast operands keep their
maps; a plan the emulator cannot run is a planner bug (exit 1), never a traceback."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from hand import assert_verifies, hand_plan
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from fuseplan.planner.app import api
from fuseplan.planner.core.errors import PlanDefect
from fuseplan.planner.geometry.regions import Tile, accumulated_input, group_io, tile_count
from fuseplan.planner.plan.data import Plan
from fuseplan.planner.plan.json_io import save_plan
from fuseplan.planner.plan.placement import Placement
from fuseplan.planner.ui.cli import app

import models


def _verified(path: Path, plan: Plan, tmp_path: Path, seed: int = 1) -> None:
    plan_file = tmp_path / "plan.json"
    save_plan(plan, plan_file)
    report = api.verify(str(path), plan_file, seed=seed)
    assert report.outputs_match, report.first_output_mismatch
    assert report.predicted_matches_emulated, report.first_counter_mismatch
    assert not report.capacity_violations, [v.describe() for v in report.capacity_violations]


def _accumulating_groups(plan: Plan, graph: Any) -> list[int]:
    """Groups that end in an accumulated reduction and run more than one tile."""
    found = []
    for g in plan.groups:
        io = group_io(graph, g.layers)
        if io.accumulated and tile_count(graph, io, g.tile) > 1:
            found.append(g.id)
    return found


@pytest.mark.parametrize("scale_first", [True, False])
def test_squeeze_excite_net_fuses_through_its_pooling_and_verifies(tmp_path: Path,
                                                                    scale_first: bool) -> None:
    """At 128x128 the expanded maps (1 MiB) cannot sit whole on the default chip: without
    pooling passes (tests/test_passes.py) each block's pooling ends a tiled group that
    accumulates it, the scale is applied in tiles of the next group, and the plan verifies
    with every counter equal."""
    path = models.save(models.se_net(h=128, w=128, scale_first=scale_first), tmp_path, "se")
    rules = tmp_path / "one_pass.yaml"
    rules.write_text((models.ROOT / "rules" / "default.yaml").read_text().replace(
        "pooling_passes: true", "pooling_passes: false"))
    problem = api.prepare(str(path), rules=rules)
    plan = api.plan_problem(problem)
    accumulating = _accumulating_groups(plan, problem.graph)
    assert len(accumulating) >= 2, [(g.layers[0], g.layers[-1], g.tile) for g in plan.groups]
    for gid in accumulating:
        assert plan.groups[gid].fused
    scaled = [g for g in plan.groups if any(n.startswith("se_scale") for n in g.layers)
              and tile_count(problem.graph, group_io(problem.graph, g.layers), g.tile) > 1]
    assert scaled, "no group applies the squeeze-excite scale in tiles"
    # each block's wide map is written once and read once, not read again by a lone pooling
    assert plan.totals.dram_bytes < 0.55 * plan.layer_by_layer_dram_bytes
    _verified(path, plan, tmp_path)


def test_a_pooling_plans_where_its_whole_input_does_not_fit(tmp_path: Path) -> None:
    """A global pooling needs an accumulator, not its input whole on chip: with 256 KiB of
    SRAM the 96x96 expanded maps (576 KiB) still plan and verify."""
    path = models.save(models.se_net(h=96, w=96), tmp_path, "se")
    plan = api.solve(str(path), overrides=["sram.bytes=256KiB", "nram.bytes=128KiB"])
    _verified(path, plan, tmp_path)


def _reduce_model(kind: str, h: int, w: int, opset: int) -> onnx.ModelProto:
    """conv 3x3 -> ReLU -> conv 3x3 -> a reduction over rows and columns -> conv 1x1."""
    b = models._Builder(np.random.default_rng(3))
    x = b.one("Relu", [b.conv("input", 3, 8, 3)])
    x = b.conv(x, 8, 8, 3)
    if kind.startswith("Global"):
        r = b.one(kind, [x], "pool")
    elif opset >= 18 or kind == "ReduceSum" and opset >= 13:
        axes = models._const_node(b, np.array([2, 3], np.int64), "axes")
        r = b.one(kind, [x, axes], "pool", keepdims=1)
    else:
        r = b.one(kind, [x], "pool", axes=[2, 3], keepdims=1)
    return b.model((1, 3, h, w), b.conv(r, 8, 4, 1, prefix="head"), opset, name="reduce")


@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kind=st.sampled_from(["GlobalAveragePool", "GlobalMaxPool", "ReduceMean", "ReduceMax",
                             "ReduceSum", "ReduceMin"]),
       opset=st.sampled_from([13, 18]),
       size=st.integers(24, 56),
       sram_kib=st.sampled_from([24, 48, 96]))
def test_accumulated_reductions_equal_onnxruntime_and_their_prediction(
        tmp_path: Path, kind: str, opset: int, size: int, sram_kib: int) -> None:
    """Every accumulating reduction, on small chips that force row tiles: outputs equal
    onnxruntime's and every counter equals the cost model's."""
    path = models.save(_reduce_model(kind, size, size + 5, opset), tmp_path, f"{kind}{opset}")
    problem = api.prepare(str(path))
    pool = next(lay for lay in problem.graph.layers if lay.name.startswith("pool"))
    assert accumulated_input(problem.graph, pool) is not None
    plan = api.solve(str(path), overrides=[f"sram.bytes={sram_kib}KiB",
                                           f"nram.bytes={sram_kib // 4 or 1}KiB"])
    group = next(g for g in plan.groups if pool.name in g.layers)
    io = group_io(problem.graph, group.layers)
    if problem.graph.elems(pool.fmap_inputs[0]) * 2 > sram_kib * 1024:
        # its input cannot sit whole on chip: the pooling folds tiles into its accumulator
        assert io.accumulated and tile_count(problem.graph, io, group.tile) > 1
    _verified(path, plan, tmp_path)


@settings(max_examples=8, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000),
       chip=st.sampled_from([("cluster4x4", ()),
                             ("cluster4x4", ("sram.bytes=48KiB", "nram.bytes=12KiB")),
                             ("cluster4x4", ("sram.bytes=24KiB", "nram.bytes=6KiB")),
                             ("frustum_npu", ()), ("manycore", ())]))
def test_random_modern_blocks_plan_and_verify_on_random_chips(
        tmp_path: Path, seed: int, chip: tuple[str, tuple[str, ...]]) -> None:
    """Random networks of MBConv (with and without squeeze-excite), ConvNeXt, ASPP and FPN
    blocks with one to three outputs, on chips from roomy to ones that force row tiles:
    the plan's outputs equal onnxruntime's and every counter equals the cost model's."""
    path = models.save(models.random_modern_net(np.random.default_rng(seed)), tmp_path,
                       f"modern{seed}")
    hardware, overrides = chip
    plan = api.solve(str(path), hardware=hardware, overrides=list(overrides))
    assert {n for g in plan.groups for n in g.layers} == \
        {lay.name for lay in api.prepare(str(path)).graph.layers}
    _verified(path, plan, tmp_path, seed)


def test_a_reduction_over_channels_still_needs_its_input_whole(tmp_path: Path) -> None:
    """ReduceMean over the channels is no accumulation over tiles: the layer is not folded."""
    b = models._Builder(np.random.default_rng(0))
    x = b.conv("input", 3, 8, 3)
    r = b.one("ReduceMean", [x], "pool", axes=[1], keepdims=1)
    path = models.save(b.model((1, 3, 16, 16), r, 13), tmp_path, "chan")
    graph = api.prepare(str(path)).graph
    pool = next(lay for lay in graph.layers if lay.op == "ReduceMean")
    assert accumulated_input(graph, pool) is None


def test_a_plan_the_emulator_cannot_run_is_a_planner_bug(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """When a kernel cannot compute a tile's box, verify exits 1 naming the group, the tile
    and the layer, with no traceback."""
    path = models.save(models.se_net(h=32, w=32, blocks=1), tmp_path, "se")
    plan = api.solve(str(path), overrides=["sram.bytes=64KiB"])
    plan_file = tmp_path / "plan.json"
    save_plan(plan, plan_file)
    import fuseplan.emulator.layer

    real = fuseplan.emulator.layer.run_op

    def broken(op: str, *args: Any, **kwargs: Any) -> Any:
        if op == "Mul":
            raise ValueError("operands could not be broadcast together")
        return real(op, *args, **kwargs)

    monkeypatch.setattr(fuseplan.emulator.layer, "run_op", broken)
    with pytest.raises(PlanDefect, match=r"group \d+, tile \d+, layer 'se_scale\d+'"):
        api.verify(str(path), plan_file)
    result = CliRunner().invoke(app, ["verify", str(path), str(plan_file)])
    assert result.exit_code == 1, result.output
    assert "planner bug" in result.output and "Traceback" not in result.output
    assert "could not be broadcast" in result.output


def _erf_gelu(b: models._Builder, x: str) -> str:
    """GELU as PyTorch exports it: x * 0.5 * (1 + erf(x / sqrt(2)))."""
    inner = b.one("Div", [x, b.const("sqrt2", np.array(np.sqrt(2.0), np.float32))])
    one = b.const("one", np.array(1.0, np.float32))
    half = b.const("half", np.array(0.5, np.float32))
    return b.one("Mul", [b.one("Mul", [x, b.one("Add", [b.one("Erf", [inner]), one])]), half])


def test_erf_gelu_and_where_tile_like_any_activation(tmp_path: Path) -> None:
    """Erf, Where and the comparisons are known per-element ops: they fuse into row tiles
    and the plan verifies."""
    b = models._Builder(np.random.default_rng(5))
    x = _erf_gelu(b, b.conv("input", 3, 16, 3))
    positive = b.one("Greater", [x, b.const("zero", np.array(0.0, np.float32))])
    x = b.one("Where", [positive, x, b.const("floor", np.array(-0.25, np.float32))])
    out = b.conv(x, 16, 8, 3, prefix="out")
    path = models.save(b.model((1, 3, 64, 64), out, 13), tmp_path, "gelu")
    plan = api.solve(str(path), overrides=["sram.bytes=96KiB", "nram.bytes=24KiB"])
    graph = api.prepare(str(path)).graph
    erf = next(g for g in plan.groups if any(graph.layer(n).op == "Erf" for n in g.layers))
    where = next(g for g in plan.groups if any(graph.layer(n).op == "Where" for n in g.layers))
    for g in (erf, where):
        assert g.fused and tile_count(graph, group_io(graph, g.layers), g.tile) > 1
    _verified(path, plan, tmp_path)


def test_a_channels_last_block_tiles_like_pointwise_convs(tmp_path: Path) -> None:
    """ConvNeXt's Transpose -> LayerNormalization -> MatMul -> Erf-GELU -> MatMul -> Transpose:
    the tensors in between carry a channels-last layout, so rows and columns keep meaning H
    and W, the normalization and the linear layers are per-pixel ops, and the block fuses
    into row tiles that verify."""
    path = models.save(models.convnext_net(h=128, w=128, channels=32), tmp_path, "convnext")
    graph = api.prepare(str(path)).graph
    for lay in graph.layers:
        if lay.op in ("LayerNormalization", "MatMul", "Erf"):
            assert graph.layout(lay.outputs[0]).kind.value == "NHWC", lay.name
            assert lay.row_maps[0].kind.value == "identity", lay.name
    # 128 KiB of SRAM: two 32 x 32 x 32 maps (64 KiB each) do not fit beside each other
    plan = api.solve(str(path), overrides=["sram.bytes=128KiB", "nram.bytes=32KiB"])
    tiled = [g for g in plan.groups if g.fused
             and any(graph.layer(n).op == "MatMul" for n in g.layers)
             and any(graph.layer(n).op == "LayerNormalization" for n in g.layers)
             and tile_count(graph, group_io(graph, g.layers), g.tile) > 1]
    assert tiled, [(g.layers[0], g.layers[-1], g.tile) for g in plan.groups]
    assert plan.totals.dram_bytes < 0.25 * plan.layer_by_layer_dram_bytes
    _verified(path, plan, tmp_path)


def test_a_matmul_over_columns_runs_row_by_row(tmp_path: Path) -> None:
    """A MatMul by a constant on a channel-first map contracts its columns: not per pixel,
    but per row (its index map lands the rows, not the columns), so its output is tiled
    along rows only, each tile reading its rows whole; such tiles verify."""
    b = models._Builder(np.random.default_rng(2))
    x = b.conv("input", 3, 8, 3)
    y = b.one("MatMul", [x, b.weight((16, 16), 16)], "mm")
    path = models.save(b.model((1, 3, 16, 16), y, 13), tmp_path, "mm")
    problem = api.prepare(str(path))
    graph = problem.graph
    mm = next(lay for lay in graph.layers if lay.op == "MatMul")
    assert (mm.row_maps[0].kind.value, mm.col_maps[0].kind.value) == ("identity", "whole")
    out = graph.layout(mm.outputs[0])
    assert (out.row_axis, out.col_axis) == (2, None)
    layers = tuple(lay.name for lay in graph.layers)
    assert_verifies(problem, hand_plan(problem, [Placement.of(layers, Tile(1, 4, 1))]))


def test_ops_that_cut_or_reduce_columns_keep_the_map_an_image(tmp_path: Path) -> None:
    """A Pad along the columns, a mean over them (keepdims) and a product with that mean,
    whichever operand comes first, keep an image's rows and columns: the convs after them
    still slide over rows and columns (only an op that contracts the columns away, a
    product by a map, keeps the rows alone)."""
    b = models._Builder(np.random.default_rng(3))
    x = b.conv("input", 3, 8, 3)
    pads = b.const("pads", np.array([0, 0, 0, 0, 0, 0, 0, 1], np.int64))
    padded = b.one("Pad", [x, pads], "pad")
    y = b.conv(padded, 8, 8, 3)
    mean = b.one("ReduceMean", [y], "mean", axes=[3], keepdims=1)
    scaled = b.one("Mul", [mean, y], "scale")
    out = b.conv(scaled, 8, 8, 3)
    path = models.save(b.model((1, 3, 16, 16), out, 13), tmp_path, "cols")
    problem = api.prepare(str(path))
    graph = problem.graph
    for name in ("pad", "mean", "scale"):
        lay = next(lay for lay in graph.layers if lay.name.startswith(name))
        layout = graph.layout(lay.outputs[0])
        assert (layout.row_axis, layout.col_axis) == (2, 3), name
    last = graph.layers[-1]
    assert (last.row_maps[0].kind.value, last.col_maps[0].kind.value) == ("window", "window")


def test_maps_joined_along_the_batch_stay_images(tmp_path: Path) -> None:
    """Two one-image maps joined along the batch (classifier-free guidance) stay an image:
    the conv after slides over its rows and columns (a join along the batch carries no
    layout, images joined are no box of either input's)."""
    b = models._Builder(np.random.default_rng(1))
    x = b.conv("input", 3, 8, 3)
    joined = b.one("Concat", [x, x], "cat", axis=0)
    y = b.conv(b.one("Relu", [joined], "relu"), 8, 8, 3)
    graph = api.prepare(str(models.save(b.model((1, 3, 16, 16), y, 13), tmp_path, "cfg"))).graph
    for name in ("cat", "relu"):
        lay = next(lay for lay in graph.layers if lay.name.startswith(name))
        layout = graph.layout(lay.outputs[0])
        assert (layout.batch_axis, layout.row_axis, layout.col_axis) == (0, 2, 3), name
    last = graph.layers[-1]
    assert (last.row_maps[0].kind.value, last.col_maps[0].kind.value) == ("window", "window")
