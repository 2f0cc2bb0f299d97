"""Swin's window attention over whole windows (planner.front.windows): the window partition
and its reverse as row maps, tiles of window rows through attention, plans that verify."""

from __future__ import annotations

from pathlib import Path

import pytest
from hand import assert_verifies, hand_plan

from planner.app import api
from planner.front.windows import regroup_rows, window_layout
from planner.geometry.regions import Tile, group_io, tile_regions
from planner.ir.graph import AxisMap, MapKind
from planner.ir.layout import LayoutKind, nhwc, sequence
from planner.plan.placement import Placement

EXPORTS = Path(__file__).resolve().parent.parent / "examples" / "exports"
IMAGE: dict[str, tuple[int, ...]] = {"input": (1, 3, 224, 224)}
BLOCK = "/features/features.1/features.1.0"


def test_regroup_rows_follow_the_row_major_order() -> None:
    # map rows into window rows: 7 map rows each
    assert regroup_rows((1, 56, 56, 96), 1, (1, 8, 7, 8, 7, 96), 1) == \
        AxisMap(MapKind.WINDOW, kernel=7, stride=7)
    # window rows into windows: window w lies in window row w // 8
    assert regroup_rows((1, 8, 8, 7, 7, 96), 1, (64, 49, 96), 0) == \
        AxisMap(MapKind.UPSAMPLE, stride=8)
    # and back
    assert regroup_rows((64, 49, 96), 0, (1, 8, 8, 7, 7, 96), 1) == \
        AxisMap(MapKind.WINDOW, kernel=8, stride=8)
    assert regroup_rows((1, 8, 7, 8, 7, 96), 1, (1, 56, 56, 96), 1) == \
        AxisMap(MapKind.UPSAMPLE, stride=7)
    # two images: the windows of both share axis 0, so window rows are no range of it
    assert regroup_rows((2, 8, 8, 7, 7, 96), 1, (128, 49, 96), 0) is None
    # rows that cut an input row in a part that is no divisor
    assert regroup_rows((1, 6, 10), 1, (1, 4, 15), 1) is None


def test_window_layouts_name_window_rows_and_windows() -> None:
    rows, windows = sequence(6, 0, 1), sequence(3, None, 0)
    assert window_layout(nhwc(), (1, 56, 56, 96), (1, 8, 7, 8, 7, 96)) == rows
    assert window_layout(rows, (1, 8, 8, 7, 7, 96), (64, 49, 96)) == windows
    assert window_layout(rows, (1, 8, 8, 7, 7, 96), (64, 7, 7, 96)) == sequence(4, None, 0)
    assert window_layout(windows, (64, 49, 96), (1, 8, 8, 7, 7, 96)) == rows
    assert window_layout(rows, (1, 8, 7, 8, 7, 96), (1, 56, 56, 96)) == nhwc()
    # a batch of two, a map read channels first, a Reshape that is no partition
    assert window_layout(nhwc(), (2, 56, 56, 96), (2, 8, 7, 8, 7, 96)) is None
    assert window_layout(rows, (2, 8, 8, 7, 7, 96), (128, 49, 96)) is None
    assert window_layout(nhwc(), (1, 56, 56, 96), (1, 3136, 96)) is None


@pytest.fixture(scope="module")
def swin() -> api.Problem:
    return api.prepare(str(EXPORTS / "swin_t.onnx"), shapes=IMAGE)


def _attention_half(problem: api.Problem) -> tuple[str, ...]:
    names = [lay.name for lay in problem.graph.layers]
    first = names.index(f"{BLOCK}/norm1/LayerNormalization")
    last = names.index("/features/features.1/features.1.0/Add")
    return tuple(names[first:last + 1])


def test_the_partition_chain_of_swin_t_maps_window_rows(swin: api.Problem) -> None:
    g = swin.graph
    maps = {lay.name.rsplit("/", 1)[-1]: lay.row_maps
            for lay in g.layers if lay.name.startswith(f"{BLOCK}/attn/")}
    assert maps["Reshape_2"] == (AxisMap(MapKind.WINDOW, 7, 7),)
    assert maps["Reshape_3"] == (AxisMap(MapKind.UPSAMPLE, stride=8),)
    assert maps["Reshape_6"] == (AxisMap(MapKind.WINDOW, 8, 8),)
    assert maps["Reshape_7"] == (AxisMap(MapKind.UPSAMPLE, stride=7),)
    # q @ k^T and p @ v: window by window, both operands row-local
    assert maps["MatMul_1"] == maps["MatMul_2"] == (AxisMap(MapKind.IDENTITY),) * 2
    windows = g.layout(f"{BLOCK}/attn/Reshape_3_output_0")
    assert (windows.row_axis, windows.batch_axis) == (0, None)
    assert g.layout(f"{BLOCK}/attn/Reshape_7_output_0").kind is LayoutKind.NHWC


def test_a_tile_of_one_window_row_needs_its_eight_windows(swin: api.Problem) -> None:
    g = swin.graph
    io = group_io(g, _attention_half(swin))
    boxes = tile_regions(g, io, (0, 1, 14, 21, 0, 56))  # map rows 14..20: window row 2
    assert boxes[f"{BLOCK}/attn/Reshape_3_output_0"][2:4] == (16, 24)
    assert boxes[f"{BLOCK}/attn/Reshape_2_output_0"][2:4] == (2, 3)
    assert boxes[io.inputs[0]][2:6] == (14, 21, 0, 56)


@pytest.mark.parametrize("rows, reuse", [(7, False), (14, True), (10, False), (3, True)])
def test_window_attention_in_row_tiles_verifies(swin: api.Problem, rows: int,
                                                reuse: bool) -> None:
    """The attention half-block (norm, partition, attention, reverse, residual) as one
    group in tiles of whole window rows (7, 14) and of rows that cut windows (10, 3: a tile
    computes the windows it touches whole and keeps its own rows), recomputing or reusing
    the overlap: outputs match onnxruntime and every byte the prediction."""
    layers = _attention_half(swin)
    plan = hand_plan(swin, [Placement.of(layers, Tile(1, rows, 56), halo_reuse=reuse)])
    assert_verifies(swin, plan)
