"""Swin's window attention over whole windows: the window partition and its reverse as row
maps by the row-major order a Reshape keeps (planner.ir.layout.regrouped_layout), tiles of
window rows through attention, plans that verify."""

from __future__ import annotations

from math import prod
from pathlib import Path

import numpy as np
import onnx
import pytest
from hand import assert_verifies, hand_plan
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from test_index_maps import _factor

from fuseplan.planner.app import api
from fuseplan.planner.core.errors import InputError
from fuseplan.planner.front.axes import layout_maps
from fuseplan.planner.geometry.regions import Tile, group_io, tile_regions
from fuseplan.planner.ir.graph import AxisMap, MapKind
from fuseplan.planner.ir.index_maps import regrouped
from fuseplan.planner.ir.layout import (
    Layout,
    LayoutKind,
    boxed,
    nhwc,
    regrouped_layout,
    sequence,
    tokens,
)
from fuseplan.planner.plan.placement import Placement

EXPORTS = Path(__file__).resolve().parent.parent / "examples" / "exports"
IMAGE: dict[str, tuple[int, ...]] = {"input": (1, 3, 224, 224)}
BLOCK = "/features/features.1/features.1.0"


def _regrouped(layout: Layout, ins: tuple[int, ...], out: tuple[int, ...],
               named: Layout | None = None) -> tuple[Layout | None, AxisMap | None]:
    """A Reshape's output layout and row map, as the graph builder derives them."""
    im = regrouped(ins, out)
    found = regrouped_layout(layout, ins, out, im.lands, im.carries, named)
    return found, None if found is None else layout_maps(im, layout, found, out)[0]


def test_window_rows_and_windows_follow_the_row_major_order() -> None:
    rows, windows = sequence(6, 0, 1), sequence(3, None, 0)
    # map rows into window rows: 7 map rows each
    assert _regrouped(nhwc(), (1, 56, 56, 96), (1, 8, 7, 8, 7, 96)) == \
        (rows, AxisMap(MapKind.WINDOW, kernel=7, stride=7))
    # window rows into windows: window w lies in window row w // 8
    assert _regrouped(rows, (1, 8, 8, 7, 7, 96), (64, 49, 96)) == \
        (windows, AxisMap(MapKind.UPSAMPLE, stride=8))
    assert _regrouped(rows, (1, 8, 8, 7, 7, 96), (64, 7, 7, 96))[0] == sequence(4, None, 0)
    # and back: one image, so the window rows need no batch axis
    assert _regrouped(windows, (64, 49, 96), (1, 8, 8, 7, 7, 96)) == \
        (sequence(6, None, 1), AxisMap(MapKind.WINDOW, kernel=8, stride=8))
    # window rows back into the map: rows merged with what follows them, the next axis the
    # columns (each box of them reads its rows whole)
    assert _regrouped(rows, (1, 8, 7, 8, 7, 96), (1, 56, 56, 96)) == \
        (nhwc(), AxisMap(MapKind.UPSAMPLE, stride=7))
    # two images: window rows keep each image on axis 0; windows of both share axis 0, so
    # window rows are no range of it
    assert _regrouped(nhwc(), (2, 56, 56, 96), (2, 8, 7, 8, 7, 96))[0] == rows
    assert _regrouped(rows, (2, 8, 8, 7, 7, 96), (128, 49, 96))[0] is None
    # rows and columns flattened into positions, and back
    assert _regrouped(nhwc(), (1, 56, 56, 96), (1, 3136, 96)) == \
        (tokens(), AxisMap(MapKind.UPSAMPLE, stride=56))
    assert _regrouped(tokens(), (1, 3136, 96), (1, 56, 56, 96)) == \
        (nhwc(), AxisMap(MapKind.WINDOW, kernel=56, stride=56))
    # rows that cut an input row in a part that is no divisor
    assert _regrouped(sequence(3, 0, 1), (1, 6, 10), (1, 4, 15))[0] is None


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


def test_inspect_says_how_the_windows_are_tiled() -> None:
    doc = api.inspect(str(EXPORTS / "swin_t.onnx"), IMAGE)
    by_name = {lay["name"]: lay for lay in doc["layers"]}
    windows = by_name[f"{BLOCK}/attn/Reshape_3"]
    assert windows["layout"] == {"kind": "seq", "batch_axis": None, "row_axis": 0,
                                 "col_axis": None}
    assert windows["row_maps"] == ["upsample 8"]
    assert by_name[f"{BLOCK}/attn/Reshape_2"]["row_maps"] == ["window k7 s7 p0"]
    shift = by_name["/features/features.1/features.1.1/attn/Concat_3"]
    assert shift["row_maps"] == ["offset +0", "offset +53"]


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


# --- the cyclic shift of shifted windows: Slice and Concat along rows -----------------


def _roll_model(path: Path, h: int, w: int, c: int, shift: int) -> None:
    """A channels-last stretch with a cyclic shift of the rows by `shift` and back, as
    torch.roll exports: x -> Transpose to [1, H, W, C] -> LayerNormalization -> roll ->
    MatMul -> roll back -> + the normalized map -> Transpose back."""
    rng = np.random.default_rng(0)

    def const(name: str, values: list[int]) -> onnx.TensorProto:
        return numpy_helper.from_array(np.array(values, np.int64), name)

    inits = [numpy_helper.from_array(rng.standard_normal((c, c)).astype(np.float32), "w"),
             numpy_helper.from_array(np.ones(c, np.float32), "g"),
             numpy_helper.from_array(np.zeros(c, np.float32), "b"),
             const("one", [1]), const("s0", [shift]), const("sh", [h]), const("z", [0]),
             const("e0", [h - shift])]
    nodes = [
        helper.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 3, 1], name="to_nhwc"),
        helper.make_node("LayerNormalization", ["t", "g", "b"], ["n"], axis=-1, name="norm"),
        # roll by -shift: rows [shift, H) then [0, shift)
        helper.make_node("Slice", ["n", "s0", "sh", "one"], ["a1"], name="cut_1"),
        helper.make_node("Slice", ["n", "z", "s0", "one"], ["a2"], name="cut_2"),
        helper.make_node("Concat", ["a1", "a2"], ["r"], axis=1, name="roll"),
        helper.make_node("MatMul", ["r", "w"], ["m"], name="linear"),
        # roll back by +shift: rows [H - shift, H) then [0, H - shift)
        helper.make_node("Slice", ["m", "e0", "sh", "one"], ["b1"], name="cut_3"),
        helper.make_node("Slice", ["m", "z", "e0", "one"], ["b2"], name="cut_4"),
        helper.make_node("Concat", ["b1", "b2"], ["u"], axis=1, name="roll_back"),
        helper.make_node("Add", ["u", "n"], ["s"], name="residual"),
        helper.make_node("Transpose", ["s"], ["y"], perm=[0, 3, 1, 2], name="to_nchw"),
    ]
    graph = helper.make_graph(
        nodes, "roll", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, h, w])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, c, h, w])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
              str(path))


def test_a_cyclic_shift_maps_rows_by_offsets(tmp_path: Path) -> None:
    _roll_model(tmp_path / "roll.onnx", 8, 5, 4, 3)
    problem = api.prepare(str(tmp_path / "roll.onnx"))
    g = problem.graph
    assert g.layer("cut_1").row_maps == (AxisMap(MapKind.OFFSET, pad=-3),)
    assert g.layer("cut_2").row_maps == (AxisMap(MapKind.OFFSET, pad=0),)
    assert g.layer("roll").row_maps == (AxisMap(MapKind.OFFSET, pad=0),
                                        AxisMap(MapKind.OFFSET, pad=5))
    assert all(g.layout(t).kind is LayoutKind.NHWC for t in ("a1", "a2", "r", "u"))
    io = group_io(g, [lay.name for lay in g.layers])
    # rows 4..5 of the result are rows 1..2 of the product, of the rolled map, and rows
    # 4..5 of the map again; the inputs of both Concats that no row of the tile comes
    # from (rolled rows [5, 8), result rows [0, 3)) are empty and widen nothing
    boxes = tile_regions(g, io, (0, 1, 4, 6, 0, 5))
    assert boxes["m"][2:4] == boxes["r"][2:4] == (1, 3)
    assert boxes["n"][2:4] == boxes["t"][2:4] == (4, 6)
    assert boxes["a2"][2] == boxes["a2"][3] and boxes["b1"][2] == boxes["b1"][3]
    # rows 2..3 straddle the shift: they are rows 7 and 0 of the product, whose hull is
    # every row
    assert tile_regions(g, io, (0, 1, 2, 4, 0, 5))["t"][2:4] == (0, 8)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(h=st.integers(4, 10), shift=st.integers(1, 9), rows=st.integers(1, 10),
       data=st.data())
def test_cyclic_shifts_in_row_tiles_verify(tmp_path_factory: pytest.TempPathFactory, h: int,
                                           shift: int, rows: int, data: st.DataObject
                                           ) -> None:
    """A shift and its reverse inside one group, any height, shift and tile: the tiles
    that wrap compute the rows they reach on both ends (their hull), the others only
    their own, and outputs and bytes match."""
    shift = 1 + shift % (h - 1)
    path = tmp_path_factory.mktemp("roll") / "roll.onnx"
    _roll_model(path, h, 3, 4, shift)
    problem = api.prepare(str(path))
    layers = tuple(lay.name for lay in problem.graph.layers)
    tile = Tile(1, min(rows, h), 3)
    assert_verifies(problem, hand_plan(problem, [Placement.of(layers, tile)]))


def test_reusing_halos_across_a_cyclic_shift_is_refused(tmp_path: Path) -> None:
    _roll_model(tmp_path / "roll.onnx", 8, 5, 4, 3)
    problem = api.prepare(str(tmp_path / "roll.onnx"))
    layers = tuple(lay.name for lay in problem.graph.layers)
    with pytest.raises(InputError, match=r"cyclic shift.*\"halo\": \"recompute\""):
        hand_plan(problem, [Placement.of(layers, Tile(1, 2, 5), halo_reuse=True)])


def test_the_shifted_block_of_swin_t_maps_its_roll_and_verifies(swin: api.Problem) -> None:
    g = swin.graph
    shifted = "/features/features.1/features.1.1"
    assert g.layer(f"{shifted}/attn/Slice_1").row_maps == (AxisMap(MapKind.OFFSET, pad=-3),)
    assert g.layer(f"{shifted}/attn/Slice_3").col_maps == (AxisMap(MapKind.OFFSET, pad=-3),)
    assert g.layout(f"{shifted}/attn/Reshape_20_output_0").kind is LayoutKind.NHWC
    names = [lay.name for lay in g.layers]
    first = names.index(f"{shifted}/attn/Slice_3")  # the columns' shift, then the windows
    last = names.index(f"{shifted}/attn/Reshape_20")
    plan = hand_plan(swin, [Placement.of(tuple(names[first:last + 1]), Tile(1, 7, 56))])
    assert_verifies(swin, plan)


# --- a map padded to whole windows ----------------------------------------------------


def _window_block(path: Path, h: int, w: int, c: int = 8, k: int = 7) -> None:
    """Swin's window attention on a map whose sides are no multiple of the window, as
    torchvision exports it: Transpose to channels last, LayerNormalization, Pad to whole
    windows, partition (Reshape, Transpose, Reshape), self-attention per window (a Linear,
    q @ k^T, Softmax, @ v), reverse, Slice back to the map, residual, Transpose back."""
    rng = np.random.default_rng(1)
    hp, wp = -(-h // k) * k, -(-w // k) * k
    a, b = hp // k, wp // k

    def ints(name: str, values: list[int]) -> onnx.TensorProto:
        return numpy_helper.from_array(np.array(values, np.int64), name)

    inits = [numpy_helper.from_array(rng.standard_normal((c, c)).astype(np.float32) / 3, "w"),
             numpy_helper.from_array(np.ones(c, np.float32), "g"),
             numpy_helper.from_array(np.zeros(c, np.float32), "b"),
             ints("pads", [0, 0, 0, 0, 0, hp - h, wp - w, 0]),
             ints("rows", [1, a, k, b, k, c]), ints("wins", [a * b, k * k, c]),
             ints("back", [1, a, b, k, k, c]), ints("map", [1, hp, wp, c]),
             ints("zero", [0, 0]), ints("ends", [h, w]), ints("axes", [1, 2])]
    nodes = [
        helper.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 3, 1]),
        helper.make_node("LayerNormalization", ["t", "g", "b"], ["n"], axis=-1),
        helper.make_node("Pad", ["n", "pads"], ["p"]),
        helper.make_node("Reshape", ["p", "rows"], ["r1"]),
        helper.make_node("Transpose", ["r1"], ["r2"], perm=[0, 1, 3, 2, 4, 5]),
        helper.make_node("Reshape", ["r2", "wins"], ["win"]),
        helper.make_node("MatMul", ["win", "w"], ["q"]),
        helper.make_node("Transpose", ["q"], ["kt"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["q", "kt"], ["s"]),
        helper.make_node("Softmax", ["s"], ["att"], axis=-1),
        helper.make_node("MatMul", ["att", "q"], ["o"]),
        helper.make_node("Reshape", ["o", "back"], ["u1"]),
        helper.make_node("Transpose", ["u1"], ["u2"], perm=[0, 1, 3, 2, 4, 5]),
        helper.make_node("Reshape", ["u2", "map"], ["u"]),
        helper.make_node("Slice", ["u", "zero", "ends", "axes"], ["cut"]),
        helper.make_node("Add", ["cut", "t"], ["res"]),
        helper.make_node("Transpose", ["res"], ["y"], perm=[0, 3, 1, 2]),
    ]
    for i, node in enumerate(nodes):
        node.name = f"n{i}_{node.op_type}"
    graph = helper.make_graph(
        nodes, "windows", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, h, w])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, c, h, w])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
              str(path))


def test_a_pad_to_whole_windows_maps_rows_by_an_offset(tmp_path: Path) -> None:
    _window_block(tmp_path / "w.onnx", 10, 12)
    g = api.prepare(str(tmp_path / "w.onnx")).graph
    pad = next(lay for lay in g.layers if lay.op == "Pad")
    # nothing before the map: row r is row r, rows past the map are the pad value
    assert (pad.row_maps, pad.col_maps) == ((AxisMap(MapKind.OFFSET),),) * 2
    assert g.layout(pad.outputs[0]).kind is LayoutKind.NHWC
    io = group_io(g, [lay.name for lay in g.layers])
    # window row 1 (padded rows 7..13) reads map rows 7..9 only
    boxes = tile_regions(g, io, (0, 1, 7, 10, 0, 12))
    assert boxes[pad.outputs[0]][2:4] == (7, 14)
    assert boxes["n"][2:4] == (7, 10)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(h=st.integers(5, 16), w=st.integers(5, 16), rows=st.integers(1, 16),
       reuse=st.booleans())
def test_windows_of_a_padded_map_in_row_tiles_verify(
        tmp_path_factory: pytest.TempPathFactory, h: int, w: int, rows: int,
        reuse: bool) -> None:
    """Any map size, any tile height, recomputed or reused halos: the tiles pad only where
    their box leaves the map, compute the windows they touch whole, and outputs and bytes
    match."""
    path = tmp_path_factory.mktemp("windows") / "w.onnx"
    _window_block(path, h, w)
    problem = api.prepare(str(path))
    layers = tuple(lay.name for lay in problem.graph.layers)
    plan = hand_plan(problem, [Placement.of(layers, Tile(1, min(rows, h), w),
                                            halo_reuse=reuse)])
    assert_verifies(problem, plan)


@settings(max_examples=60, deadline=None)
@given(before=st.integers(1, 3), rows=st.integers(2, 12), k=st.integers(1, 6),
       inner=st.integers(1, 5), split=st.booleans(), lo=st.integers(0, 71),
       size=st.integers(1, 72))
def test_reshape_row_maps_need_exactly_the_rows_an_output_range_reads(
        before: int, rows: int, k: int, inner: int, split: bool, lo: int, size: int) -> None:
    """A Reshape between [B, R k, C] and [B, R, k C] (k fine rows to a coarse one, either
    way): the range the derived row map gives for an output row range is exactly the hull
    of the input rows whose elements land there, as numpy's own reshape places them."""
    fine, coarse = (before, rows * k, inner), (before, rows, k * inner)
    in_shape, out_shape = (fine, coarse) if split else (coarse, fine)
    layout, m = _regrouped(sequence(3, 0, 1), in_shape, out_shape)
    assert layout == sequence(3, 0, 1) and m is not None
    out_rows = out_shape[1]
    lo = lo % out_rows
    hi = min(out_rows, lo + size)
    # which input row each element of the output came from
    source = np.broadcast_to(np.arange(in_shape[1])[None, :, None], in_shape).reshape(out_shape)
    reached = source[:, lo:hi]
    a, b = m.needed(lo, hi, in_shape[1])
    assert (a, b) == (int(reached.min()), int(reached.max()) + 1)


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_any_reshape_box_reads_only_the_input_box_its_maps_give(data: st.DataObject) -> None:
    """Any row-major Reshape of a tiled tensor of any rank (axes split, merged or both, with
    the batch, rows and columns anywhere): where a layout is derived, every element of an
    output box comes from the input box the derived batch, row and column maps give."""
    in_shape = tuple(data.draw(st.lists(st.integers(1, 6), min_size=2, max_size=6)))
    rank = len(in_shape)
    batch = data.draw(st.sampled_from([None, 0]))
    row = data.draw(st.integers(0 if batch is None else 1, rank - 1))
    col = data.draw(st.sampled_from([None, row + 1] if row + 1 < rank else [None]))
    layout = boxed(in_shape, batch, row, col)
    # the output: the elements' prime factors, in order, grouped into consecutive axes
    primes = [f for n in in_shape for f in _factor(n)]
    cuts = sorted(data.draw(st.sets(st.integers(1, max(1, len(primes) - 1)), max_size=4)))
    bounds = [0, *[c for c in cuts if c < len(primes)], len(primes)]
    out_shape = tuple(prod(primes[a:b]) for a, b in zip(bounds, bounds[1:], strict=False))
    ones = data.draw(st.integers(0, 1))
    out_shape = (1,) * ones + (out_shape or (1,))
    if prod(out_shape) != prod(in_shape):
        return
    found, _ = _regrouped(layout, in_shape, out_shape)
    if found is None:
        return
    im = regrouped(in_shape, out_shape)
    rows_map, cols_map = layout_maps(im, layout, found, out_shape)
    # every input element's place along the input's batch, rows and columns
    index = np.indices(in_shape)
    where = {part: index[axis].reshape(out_shape)
             for part, axis in (("n", layout.batch_axis), ("r", layout.row_axis),
                                ("c", layout.col_axis)) if axis is not None}
    box = [slice(None)] * len(out_shape)
    ranges = {}
    for part, axis in (("n", found.batch_axis), ("r", found.row_axis), ("c", found.col_axis)):
        if axis is None:
            continue
        lo = data.draw(st.integers(0, out_shape[axis] - 1))
        hi = data.draw(st.integers(lo + 1, out_shape[axis]))
        box[axis] = slice(lo, hi)
        ranges[part] = (lo, hi)
    for part, m in (("r", rows_map), ("c", cols_map)):
        if part not in where or m.kind is MapKind.WHOLE:
            continue
        in_axis = layout.row_axis if part == "r" else layout.col_axis
        assert in_axis is not None
        lo, hi = ranges.get(part, (0, 1))
        a, b = m.needed(lo, hi, in_shape[in_axis])
        got = where[part][tuple(box)]
        assert a <= got.min() and got.max() < b, (part, m, lo, hi, a, b)
    if "n" in where and "n" in ranges and rows_map.kind is not MapKind.WHOLE:
        got = where["n"][tuple(box)]
        assert ranges["n"][0] <= got.min() and got.max() < ranges["n"][1]
