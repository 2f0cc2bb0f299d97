"""Row/column maps and tile regions against brute force.

Two families of properties:

* closed forms: on random small CNNs and random convex groups (intervals of the
  topological order), ``AxisChain.total`` equals the sum, over the enumerated
  tiles, of the range ``tile_regions`` gives each tensor, ``AxisChain.bound`` is at
  least every tile's range, and ``planner.cost.model.region_sum`` equals enumeration for
  any tile (closed form or not);
* row maps: for random single-layer models (Conv, MaxPool, AveragePool,
  ConvTranspose, Resize, Upsample) and random output boxes, the input box given by
  ``AxisMap.needed`` is sufficient (onnxruntime's output box does not change when
  everything outside it is replaced), tight for windows (its first and last rows
  matter), reproduces the output box when onnxruntime runs on the clipped slice
  with the tile's effective pads, and ``emulator.layer.run_layer`` computes the box
  exactly from the tile's input region.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from fuseplan.emulator.layer import run_layer
from fuseplan.hardware.chip import load_chip
from fuseplan.planner.cost.model import region_sum, region_sums
from fuseplan.planner.front.graph_build import build_graph
from fuseplan.planner.front.onnx_load import load_model, run_onnxruntime
from fuseplan.planner.geometry.regions import (
    StripSpans,
    Tile,
    axis_ranges,
    box_elems,
    group_chains,
    group_io,
    iter_tiles,
    tile_count,
    tile_regions,
)
from fuseplan.planner.ir.graph import AxisMap, Graph, Layer, MapKind
from fuseplan.rules.facts import GroupFacts
from fuseplan.rules.ruleset import load_rules
from fuseplan.solver.tiles import GroupSearch
from tests import models

# Deterministic in CI (same examples every run); FUSEPLAN_EXAMPLES=500 explores further.
HYP = settings(max_examples=int(os.environ.get("FUSEPLAN_EXAMPLES", "25")), deadline=None,
               derandomize=True, database=None,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                      HealthCheck.filter_too_much])


def graph_of(proto: onnx.ModelProto) -> Graph:
    """Load a ModelProto the way the CLI does (file -> load_model -> build_graph)."""
    with tempfile.TemporaryDirectory() as d:
        path = models.save(proto, Path(d), "m")
        return build_graph(load_model(str(path), {}))


# =========================================================================== closed forms


@st.composite
def cnn_and_interval(draw: st.DrawFn) -> tuple[int, Graph, list[str]]:
    seed = draw(st.integers(0, 2**31 - 1))
    graph = graph_of(models.random_cnn(np.random.default_rng(seed)))
    names = [lay.name for lay in graph.layers]
    i = draw(st.integers(0, len(names) - 1))
    j = draw(st.integers(i + 1, len(names)))
    return seed, graph, names[i:j]


def _axis_lengths(graph: Graph, io: Any, axis: int, size: int) -> dict[str, list[int]]:
    """Per tensor, the range length along `axis` (1 rows, 2 cols) of every tile of `size`."""
    shape = graph.shapes[io.anchor]
    n, h, w = shape[0], shape[-2], shape[-1]
    extent = h if axis == 1 else w
    lengths: dict[str, list[int]] = {}
    for a, b in axis_ranges(extent, size):
        box = (0, n, a, b, 0, w) if axis == 1 else (0, n, 0, h, a, b)
        for t, r in tile_regions(graph, io, box).items():
            lo, hi = (r[2], r[3]) if axis == 1 else (r[4], r[5])
            lengths.setdefault(t, []).append(hi - lo)
    return lengths


@HYP
@given(cnn_and_interval())
def test_axis_chain_total_and_bound_match_enumerated_tiles(case: tuple[int, Graph, list[str]]
                                                           ) -> None:
    seed, graph, layers = case
    io = group_io(graph, layers)
    chains = group_chains(graph, io)
    h, w = graph.shapes[io.anchor][-2:]
    checked: set[tuple[str, int]] = set()
    for axis, extent in ((1, h), (2, w)):
        for size in range(1, extent + 3):
            lengths = _axis_lengths(graph, io, axis, size)
            for t, triple in chains.chains.items():
                chain = triple[axis]
                if chain is None:
                    continue
                low = chain.min_tile(extent)
                if low is None or size < low:
                    continue
                got = lengths[t]
                where = (f"random_cnn seed {seed}, group {layers[0]}..{layers[-1]}, tensor {t}, "
                         f"{'rows' if axis == 1 else 'cols'} extent {extent}, tile {size}, "
                         f"{chain}")
                assert chain.total(extent, size) == sum(got), \
                    f"{where}: closed form {chain.total(extent, size)} != enumerated {sum(got)} " \
                    f"(per tile {got})"
                assert chain.bound(size) >= max(got), \
                    f"{where}: bound {chain.bound(size)} < largest tile range {max(got)}"
                checked.add((t, axis))
    # the anchor always has an exact closed form (the identity chain) on both axes
    assert {(io.anchor, 1), (io.anchor, 2)} <= checked, \
        f"random_cnn seed {seed}: the anchor {io.anchor} has no exact closed form"


@HYP
@given(cnn_and_interval(), st.data())
def test_region_sum_equals_enumeration_for_any_tile(case: tuple[int, Graph, list[str]],
                                                    data: st.DataObject) -> None:
    seed, graph, layers = case
    io = group_io(graph, layers)
    chains = group_chains(graph, io)
    h, w = graph.shapes[io.anchor][-2:]
    tile = Tile(1, data.draw(st.integers(1, h + 1), "tile h"), data.draw(st.integers(1, w + 1),
                                                                       "tile w"))
    boxes = [tile_regions(graph, io, b) for b in iter_tiles(graph, io, tile)]
    assert len(boxes) == tile_count(graph, io, tile)
    for t in io.inputs + io.internal + io.outputs:
        want = sum(box_elems(graph, t, b[t]) for b in boxes)
        got = region_sum(graph, io, chains, t, tile)
        assert got == want, (f"random_cnn seed {seed}, group {layers[0]}..{layers[-1]}, {tile}: "
                             f"region_sum({t}) = {got}, enumeration gives {want}")


@HYP
@given(cnn_and_interval(), st.data())
def test_strip_walks_and_search_memos_match_fresh_counts(case: tuple[int, Graph, list[str]],
                                                         data: st.DataObject) -> None:
    """One walk of an axis's strips gives every tensor's summed and longest range (what the
    enumeration of tiles gives); a tile search's rule facts, sharing walks and halo grids
    across the tiles it tries, judge every tile as facts built afresh do."""
    seed, graph, layers = case
    io = group_io(graph, layers)
    chains = group_chains(graph, io)
    h, w = graph.shapes[io.anchor][-2:]
    for axis, extent in ((1, h), (2, w)):
        size = data.draw(st.integers(1, extent + 1), f"strip {axis}")
        spans = StripSpans.of(graph, io, axis, size)
        lengths = _axis_lengths(graph, io, axis, size)
        assert dict(spans.total) == {t: sum(max(0, x) for x in v) for t, v in lengths.items()}
        assert dict(spans.longest) == {t: max(0, *v) for t, v in lengths.items()}
    search = GroupSearch.of(graph, layers, load_chip(None, ["sram.bytes=64KiB"])[0],
                            load_rules(None))
    # short tiles: below a strided chain's least tile the rules walk the strips
    tiles = [Tile(1, data.draw(st.integers(1, min(3, h)), "tile h"),
                  data.draw(st.sampled_from(sorted({1, min(2, w), w})), "tile w"))
             for _ in range(4)]
    where = f"random_cnn seed {seed}, group {layers[0]}..{layers[-1]}"
    assert region_sums(graph, io, chains, tiles[0], io.inputs) == \
        {t: region_sum(graph, io, chains, t, tiles[0]) for t in io.inputs}, where
    for tile in tiles:
        for reuse in (False, True):
            kept = search.facts(tile, True, halo_reuse=reuse)
            fresh = GroupFacts(graph, io, chains, tile, kept.chip, kept.mode)
            assert kept.redundancy_pct() == fresh.redundancy_pct(), (where, tile, reuse)
            assert [kept.tensor_bound_bytes(t) for t in chains.chains] == \
                [fresh.tensor_bound_bytes(t) for t in chains.chains], (where, tile, reuse)


def test_chain_exactness_example() -> None:
    """A hand-checked case: two 3x3 stride-1 pad-1 convs over 16 rows, tiles of 4 rows."""
    graph = graph_of(models.chain_cnn(h=16, w=16))
    layers = [lay.name for lay in graph.layers][:4]  # conv, relu, conv, relu
    io = group_io(graph, layers)
    chains = group_chains(graph, io)
    rows = chains.chains[io.inputs[0]][1]
    assert rows is not None
    # tiles [0,4) [4,8) [8,12) [12,16) need input rows [0,6) [2,10) [6,14) [10,16)
    assert rows.total(16, 4) == 6 + 8 + 8 + 6
    assert rows.bound(4) == 8
    smallest = rows.min_tile(16)
    assert smallest is not None and smallest <= 2


# =========================================================================== row maps


@dataclass(frozen=True)
class OneLayer:
    """A random single-node model and its description (for failure messages)."""

    proto: onnx.ModelProto
    desc: str
    x_shape: tuple[int, int, int, int]


def _one_node_model(op: str, x_shape: tuple[int, ...], inits: dict[str, np.ndarray],
                    inputs: list[str], opset: int, **attrs: Any) -> onnx.ModelProto:
    node = helper.make_node(op, ["x", *inputs], ["y"], name="layer", **attrs)
    graph = helper.make_graph(
        [node], "one", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    model.graph.output[0].type.CopyFrom(inferred.graph.output[0].type)
    onnx.checker.check_model(model, full_check=True)
    return model


@st.composite
def window_layers(draw: st.DrawFn) -> OneLayer:
    """Conv (grouped, dilated, asymmetric pads), MaxPool, AveragePool (ceil_mode,
    count_include_pad)."""
    op = draw(st.sampled_from(["Conv", "MaxPool", "AveragePool"]))
    kh, kw = draw(st.integers(1, 5)), draw(st.integers(1, 5))
    sh, sw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    dh, dw = (draw(st.integers(1, 2)), draw(st.integers(1, 2))) if op != "AveragePool" else (1, 1)
    pads = [draw(st.integers(0, max(0, k - 1))) for k in (kh, kw, kh, kw)]
    h = draw(st.integers((kh - 1) * dh + 1, 20))
    w = draw(st.integers((kw - 1) * dw + 1, 20))
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    attrs: dict[str, Any] = {"kernel_shape": [kh, kw], "strides": [sh, sw], "pads": pads}
    if op == "Conv":
        group = draw(st.sampled_from([1, 2]))
        c, m = 2 * draw(st.integers(1, 2)), 2 * draw(st.integers(1, 2))
        inits = {"W": rng.standard_normal((m, c // group, kh, kw)).astype(np.float32),
                 "B": rng.standard_normal(m).astype(np.float32)}
        attrs.update(group=group, dilations=[dh, dw])
        proto = _one_node_model(op, (1, c, h, w), inits, ["W", "B"], 13, **attrs)
    else:
        c = draw(st.integers(1, 3))
        if op == "MaxPool":
            attrs["dilations"] = [dh, dw]
        else:
            attrs["count_include_pad"] = draw(st.integers(0, 1))
        # ceil_mode only where the extra window starts inside input + begin pad on both axes
        # (elsewhere ONNX shape inference and onnxruntime disagree on the output size; see
        # tests/test_graph.py::test_ceil_mode_pool_out_shape_matches_onnxruntime)
        ceil_ok = all(
            (-(-(size + pb + pe - (k - 1) * d - 1) // s)) * s < size + pb
            for size, k, d, s, pb, pe in ((h, kh, dh, sh, pads[0], pads[2]),
                                          (w, kw, dw, sw, pads[1], pads[3])))
        attrs["ceil_mode"] = draw(st.integers(0, 1)) if ceil_ok else 0
        proto = _one_node_model(op, (1, c, h, w), {}, [], 13, **attrs)
    return OneLayer(proto, f"{op} {attrs} on 1x{c}x{h}x{w}", (1, c, h, w))


@st.composite
def transposed_layers(draw: st.DrawFn) -> OneLayer:
    kh, kw = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    sh, sw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    dh, dw = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    pads = [draw(st.integers(0, (k - 1) * d)) for k, d in ((kh, dh), (kw, dw), (kh, dh), (kw, dw))]
    out_pad = [draw(st.integers(0, s - 1)) for s in (sh, sw)]  # onnxruntime: < stride
    h, w = draw(st.integers(2, 10)), draw(st.integers(2, 10))
    for size, k, s, d, pb, pe, op in ((h, kh, sh, dh, pads[0], pads[2], out_pad[0]),
                                      (w, kw, sw, dw, pads[1], pads[3], out_pad[1])):
        assume(s * (size - 1) + op + (k - 1) * d + 1 - pb - pe >= 1)  # a non-empty output
    c, m = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    attrs = {"kernel_shape": [kh, kw], "strides": [sh, sw], "pads": pads,
             "dilations": [dh, dw], "output_padding": out_pad}
    inits = {"W": rng.standard_normal((c, m, kh, kw)).astype(np.float32),
             "B": rng.standard_normal(m).astype(np.float32)}
    proto = _one_node_model("ConvTranspose", (1, c, h, w), inits, ["W", "B"], 13, **attrs)
    return OneLayer(proto, f"ConvTranspose {attrs} on 1x{c}x{h}x{w}", (1, c, h, w))


RESIZE_MODES = [
    ("nearest", "asymmetric", "floor"),
    ("nearest", "half_pixel", "round_prefer_floor"),
    ("nearest", "half_pixel", "round_prefer_ceil"),
    ("nearest", "pytorch_half_pixel", "round_prefer_floor"),
    ("nearest", "asymmetric", "round_prefer_floor"),
    ("nearest", "align_corners", "round_prefer_floor"),
    ("linear", "half_pixel", "round_prefer_floor"),
]


@st.composite
def resize_layers(draw: st.DrawFn) -> OneLayer:
    fh, fw = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    c, h, w = draw(st.integers(1, 3)), draw(st.integers(2, 9)), draw(st.integers(2, 9))
    kind = draw(st.sampled_from(["scales", "sizes", "upsample"]))
    if kind == "upsample":
        scales = np.array([1, 1, fh, fw], np.float32)
        proto = _one_node_model("Upsample", (1, c, h, w), {"scales": scales}, ["scales"], 9,
                                mode="nearest")
        return OneLayer(proto, f"Upsample x{fh}x{fw} on 1x{c}x{h}x{w}", (1, c, h, w))
    mode, ctm, nearest = draw(st.sampled_from(RESIZE_MODES))
    attrs = {"mode": mode, "coordinate_transformation_mode": ctm, "nearest_mode": nearest}
    if kind == "scales":
        inits = {"roi": np.zeros(0, np.float32), "scales": np.array([1, 1, fh, fw], np.float32)}
        proto = _one_node_model("Resize", (1, c, h, w), inits, ["roi", "scales"], 13, **attrs)
    else:
        inits = {"sizes": np.array([1, c, fh * h, fw * w], np.int64)}
        proto = _one_node_model("Resize", (1, c, h, w), inits, ["", "", "sizes"], 13, **attrs)
    return OneLayer(proto, f"Resize({kind}) x{fh}x{fw} {attrs} on 1x{c}x{h}x{w}", (1, c, h, w))


def _out_box(draw: Callable[..., Any], shape: tuple[int, ...]
             ) -> tuple[int, int, int, int, int, int]:
    h, w = shape[-2:]
    lo = draw(st.integers(0, h - 1), "row lo")
    hi = draw(st.integers(lo + 1, h), "row hi")
    clo = draw(st.integers(0, w - 1), "col lo")
    chi = draw(st.integers(clo + 1, w), "col hi")
    return 0, shape[0], lo, hi, clo, chi


def _needed(lay: Layer, box: tuple[int, ...], x_shape: tuple[int, ...]
            ) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int], tuple[int, int]]:
    """Unclipped and clipped (rows, cols) input ranges of the row/column maps."""
    h, w = x_shape[-2:]
    ur = lay.row_maps[0].needed(box[2], box[3], h)
    uc = lay.col_maps[0].needed(box[4], box[5], w)
    return ur, uc, (max(0, ur[0]), min(h, ur[1])), (max(0, uc[0]), min(w, uc[1]))


def _ort(proto: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    return run_onnxruntime(proto, {"x": x})[0]["y"]


def _check_sufficient(layer: OneLayer, data: st.DataObject) -> None:
    graph = graph_of(layer.proto)
    lay = graph.layers[0]
    rng = np.random.default_rng(data.draw(st.integers(0, 2**31 - 1), "input seed"))
    x = rng.standard_normal(layer.x_shape).astype(np.float32)
    full = _ort(layer.proto, x)
    assert full.shape == lay.out_shape, f"{layer.desc}: graph out_shape {lay.out_shape}, " \
                                        f"onnxruntime {full.shape}"
    box = _out_box(data.draw, full.shape)
    _, _, (r0, r1), (c0, c1) = _needed(lay, box, layer.x_shape)
    # replace every input value outside the needed region: the output box must not move
    other = rng.standard_normal(layer.x_shape).astype(np.float32) * 10
    other[..., r0:r1, c0:c1] = x[..., r0:r1, c0:c1]
    again = _ort(layer.proto, other)
    sl = np.s_[..., box[2]:box[3], box[4]:box[5]]
    np.testing.assert_allclose(
        again[sl], full[sl], rtol=1e-5, atol=1e-5,
        err_msg=f"{layer.desc}: output rows [{box[2]},{box[3]}) cols [{box[4]},{box[5]}) "
                f"depend on input outside rows [{r0},{r1}) cols [{c0},{c1}) "
                f"(row map {lay.row_maps[0]}, col map {lay.col_maps[0]})")


def _tile_vs_onnxruntime(layer: OneLayer, x: np.ndarray,
                         box: tuple[int, int, int, int, int, int]) -> None:
    """emulator.layer.run_layer, given only the tile's input region on chip, reproduces the
    output box of onnxruntime's full result."""
    graph = graph_of(layer.proto)
    lay = graph.layers[0]
    full = _ort(layer.proto, x)
    _, _, (r0, r1), (c0, c1) = _needed(lay, box, layer.x_shape)
    onchip = {"x": ((0, 1, r0, r1, c0, c1), x[..., r0:r1, c0:c1].copy())}
    where = (f"{layer.desc}: tile rows [{box[2]},{box[3]}) cols [{box[4]},{box[5]}) computed "
             f"from input rows [{r0},{r1}) cols [{c0},{c1})")
    got = run_layer(graph, lay, box, onchip, graph.constants)[0]
    want = full[..., box[2]:box[3], box[4]:box[5]]
    assert got.shape == want.shape, f"{where}: run_layer gives shape {got.shape}, the tile is " \
                                    f"{want.shape}"
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4,
                               err_msg=f"{where}: differs from onnxruntime")


def _check_run_layer(layer: OneLayer, data: st.DataObject) -> None:
    rng = np.random.default_rng(data.draw(st.integers(0, 2**31 - 1), "input seed"))
    x = rng.standard_normal(layer.x_shape).astype(np.float32)
    out_shape = graph_of(layer.proto).layers[0].out_shape
    _tile_vs_onnxruntime(layer, x, _out_box(data.draw, out_shape))


@HYP
@given(window_layers(), st.data())
def test_window_row_map_is_sufficient(layer: OneLayer, data: st.DataObject) -> None:
    _check_sufficient(layer, data)


@HYP
@given(transposed_layers(), st.data())
def test_conv_transpose_row_map_is_sufficient(layer: OneLayer, data: st.DataObject) -> None:
    _check_sufficient(layer, data)


@HYP
@given(resize_layers(), st.data())
def test_resize_row_map_is_sufficient(layer: OneLayer, data: st.DataObject) -> None:
    _check_sufficient(layer, data)


@HYP
@given(window_layers(), st.data())
def test_window_tile_with_effective_pads_reproduces_output_rows(layer: OneLayer,
                                                               data: st.DataObject) -> None:
    """onnxruntime on the clipped input slice, pads = the clipped-away part of the window."""
    graph = graph_of(layer.proto)
    lay = graph.layers[0]
    node = layer.proto.graph.node[0]
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if node.op_type == "AveragePool" and attrs["ceil_mode"] and attrs["count_include_pad"]:
        # the ceil-mode tail is not padding for the divisor: no explicit-pad equivalent
        return
    rng = np.random.default_rng(data.draw(st.integers(0, 2**31 - 1), "input seed"))
    x = rng.standard_normal(layer.x_shape).astype(np.float32)
    full = _ort(layer.proto, x)
    box = _out_box(data.draw, full.shape)
    (u0, u1), (v0, v1), (r0, r1), (c0, c1) = _needed(lay, box, layer.x_shape)
    h, w = layer.x_shape[-2:]
    attrs["pads"] = [max(0, -u0), max(0, -v0), max(0, u1 - h), max(0, v1 - w)]
    attrs["ceil_mode"] = 0 if "ceil_mode" in attrs else None
    attrs = {k: v for k, v in attrs.items() if v is not None}
    inits = {i.name: numpy_helper.to_array(i) for i in layer.proto.graph.initializer}
    part = x[..., r0:r1, c0:c1]
    tile_model = _one_node_model(node.op_type, part.shape, inits, list(node.input[1:]), 13,
                                 **attrs)
    got = _ort(tile_model, part)
    want = full[..., box[2]:box[3], box[4]:box[5]]
    assert got.shape == want.shape, (
        f"{layer.desc}: slice rows [{r0},{r1}) cols [{c0},{c1}) with pads {attrs['pads']} gives "
        f"{got.shape[-2:]} outputs, the tile has {want.shape[-2:]}")
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=layer.desc)


@HYP
@given(window_layers(), st.data())
def test_window_row_map_is_tight(layer: OneLayer, data: st.DataObject) -> None:
    """The first and last needed rows (and columns) inside the input both matter."""
    graph = graph_of(layer.proto)
    lay = graph.layers[0]
    rng = np.random.default_rng(data.draw(st.integers(0, 2**31 - 1), "input seed"))
    x = rng.standard_normal(layer.x_shape).astype(np.float32)
    full = _ort(layer.proto, x)
    box = _out_box(data.draw, full.shape)
    (u0, u1), (v0, v1), _, _ = _needed(lay, box, layer.x_shape)
    h, w = layer.x_shape[-2:]
    sl = np.s_[..., box[2]:box[3], box[4]:box[5]]
    probes = [(np.s_[..., u0, :], f"first needed row {u0}") if 0 <= u0 < h else None,
              (np.s_[..., u1 - 1, :], f"last needed row {u1 - 1}") if 0 <= u1 - 1 < h else None,
              (np.s_[..., :, v0], f"first needed col {v0}") if 0 <= v0 < w else None,
              (np.s_[..., :, v1 - 1], f"last needed col {v1 - 1}") if 0 <= v1 - 1 < w else None]
    for probe in probes:
        if probe is None:
            continue
        where, what = probe
        poked = x.copy()
        poked[where] = 100.0  # larger than anything else: changes a max, a mean and a conv
        assert not np.allclose(_ort(layer.proto, poked)[sl], full[sl], rtol=1e-6, atol=1e-6), \
            f"{layer.desc}: the {what} is in the needed range but does not affect the tile " \
            f"rows [{box[2]},{box[3]}) cols [{box[4]},{box[5]})"


@HYP
@given(window_layers(), st.data())
def test_run_layer_window_tile_matches_onnxruntime(layer: OneLayer, data: st.DataObject) -> None:
    _check_run_layer(layer, data)


@HYP
@given(transposed_layers(), st.data())
def test_run_layer_conv_transpose_tile_matches_onnxruntime(layer: OneLayer,
                                                           data: st.DataObject) -> None:
    _check_run_layer(layer, data)


@HYP
@given(resize_layers(), st.data())
def test_run_layer_resize_tile_matches_onnxruntime(layer: OneLayer, data: st.DataObject) -> None:
    _check_run_layer(layer, data)


def _deconv(k: int, s: int, p: int, out_pad: int = 0) -> OneLayer:
    rng = np.random.default_rng(0)
    inits = {"W": rng.standard_normal((2, 3, k, k)).astype(np.float32),
             "B": rng.standard_normal(3).astype(np.float32)}
    attrs = {"kernel_shape": [k, k], "strides": [s, s], "pads": [p] * 4,
             "output_padding": [out_pad] * 2}
    proto = _one_node_model("ConvTranspose", (1, 2, 8, 8), inits, ["W", "B"], 13, **attrs)
    return OneLayer(proto, f"ConvTranspose {attrs} on 1x2x8x8", (1, 2, 8, 8))


def _resize_sizes(factor: int) -> OneLayer:
    """Resize as torch.onnx exports F.interpolate(scale_factor=2) at opset 13: by `sizes`."""
    inits = {"sizes": np.array([1, 2, 8 * factor, 8 * factor], np.int64)}
    attrs = {"mode": "nearest", "coordinate_transformation_mode": "asymmetric",
             "nearest_mode": "floor"}
    proto = _one_node_model("Resize", (1, 2, 8, 8), inits, ["", "", "sizes"], 13, **attrs)
    return OneLayer(proto, f"Resize(sizes) x{factor} {attrs} on 1x2x8x8", (1, 2, 8, 8))


def _avg_pool_ceil(include_pad: int) -> OneLayer:
    attrs = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [0, 0, 0, 0], "ceil_mode": 1,
             "count_include_pad": include_pad}
    proto = _one_node_model("AveragePool", (1, 2, 8, 8), {}, [], 13, **attrs)
    return OneLayer(proto, f"AveragePool {attrs} on 1x2x8x8", (1, 2, 8, 8))


TILE_EXAMPLES = {
    # (layer, output box): common layers of exported models, one interior or border tile
    "deconv k2 s2 p0": (_deconv(2, 2, 0), (0, 1, 3, 9, 0, 16)),
    "deconv k4 s2 p1 (DCGAN/U-Net upsampling)": (_deconv(4, 2, 1), (0, 1, 2, 5, 0, 16)),
    "deconv k3 s2 p1 output_padding 1 (torch upsampling)": (_deconv(3, 2, 1, 1),
                                                           (0, 1, 10, 16, 0, 16)),
    "deconv k1 s2 (rows between inputs get only the bias)": (_deconv(1, 2, 0),
                                                            (0, 1, 1, 4, 0, 15)),
    # the last row is output padding (bias only): fails even as a whole-map (layer) tile
    "deconv k2 s2 output_padding 1, whole map": (_deconv(2, 2, 0, 1), (0, 1, 0, 17, 0, 17)),
    "resize by sizes x2 (torch export, opset 13)": (_resize_sizes(2), (0, 1, 4, 10, 0, 16)),
    "avg pool k3 s2 ceil_mode, pads not counted": (_avg_pool_ceil(0), (0, 1, 2, 4, 2, 4)),
    "avg pool k3 s2 ceil_mode, count_include_pad": (_avg_pool_ceil(1), (0, 1, 2, 4, 2, 4)),
}


@pytest.mark.parametrize("case", list(TILE_EXAMPLES))
def test_run_layer_tile_examples(case: str) -> None:
    layer, box = TILE_EXAMPLES[case]
    x = np.random.default_rng(3).standard_normal(layer.x_shape).astype(np.float32)
    _tile_vs_onnxruntime(layer, x, box)


def test_row_map_kinds() -> None:
    """The map kind each op gets: windows, transposed, upsample, identity, whole."""
    rng = np.random.default_rng(1)
    conv = _one_node_model("Conv", (1, 2, 9, 9),
                           {"W": rng.standard_normal((2, 2, 3, 3)).astype(np.float32)}, ["W"],
                           13, strides=[2, 2], pads=[1, 1, 1, 1], dilations=[2, 2])
    m = graph_of(conv).layers[0].row_maps[0]
    assert m == AxisMap(MapKind.WINDOW, 3, 2, 1, 2)
    # output rows [1, 3) of a k3 s2 p1 d2 conv need input rows [2*1-1, 2*2-1+4+1) = [1, 8)
    assert m.needed(1, 3, 9) == (1, 8)
    up = _one_node_model("Resize", (1, 1, 4, 4),
                         {"roi": np.zeros(0, np.float32),
                          "scales": np.array([1, 1, 2, 3], np.float32)}, ["roi", "scales"], 13,
                         mode="nearest", coordinate_transformation_mode="asymmetric",
                         nearest_mode="floor")
    lay = graph_of(up).layers[0]
    assert (lay.row_maps[0].kind, lay.row_maps[0].stride) == (MapKind.UPSAMPLE, 2)
    assert (lay.col_maps[0].kind, lay.col_maps[0].stride) == (MapKind.UPSAMPLE, 3)
    assert lay.row_maps[0].needed(3, 6, 4) == (1, 3)
    gap = _one_node_model("GlobalAveragePool", (1, 2, 5, 5), {}, [], 13)
    assert graph_of(gap).layers[0].row_maps[0].kind is MapKind.WHOLE
    relu = _one_node_model("Relu", (1, 2, 5, 5), {}, [], 13)
    assert graph_of(relu).layers[0].row_maps[0].kind is MapKind.IDENTITY
