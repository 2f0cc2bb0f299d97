"""Axes tiled by what the ops do (issue 42): the length of a 1-D conv's [N, C, L] map, a
reduction over a token's or a pixel's own channels (RMSNorm as exported), and constant
folding that blames a model only when onnxruntime refuses it too."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from hand import assert_verifies, hand_plan
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from fuseplan.planner.app import api
from fuseplan.planner.geometry.regions import Tile
from fuseplan.planner.ir.graph import IDENTITY, AxisMap, MapKind
from fuseplan.planner.ir.layout import LayoutKind
from fuseplan.planner.plan.placement import Placement

SMALL_SRAM = ("sram.bytes=262144",)


def _save(tmp: Path, name: str, nodes: list[onnx.NodeProto], inits: Mapping[str, Any],
          inputs: dict[str, list[int]], outputs: dict[str, list[int]]) -> str:
    graph = helper.make_graph(
        nodes, name,
        [helper.make_tensor_value_info(k, TensorProto.FLOAT, v) for k, v in inputs.items()],
        [helper.make_tensor_value_info(k, TensorProto.FLOAT, v) for k, v in outputs.items()],
        [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    path = tmp / f"{name}.onnx"
    onnx.save(model, path)
    return str(path)


def _conv1d_stem(tmp: Path, length: int = 3000, mels: int = 80, width: int = 128,
                 layers: tuple[tuple[int, int, int, int], ...] = ((3, 1, 1, 1), (3, 2, 1, 1)),
                 to_tokens: bool = True) -> str:
    """Whisper's stem: Conv1d layers (kernel, stride, pad, dilation) with GELU-like
    activations on [1, mels, length], then (to_tokens) the map turned into tokens [1, L, C],
    a LayerNormalization and a Linear layer."""
    rng = np.random.default_rng(0)
    nodes, inits, x, cin, given = [], {}, "x", mels, length
    for i, (k, s, p, d) in enumerate(layers):
        inits[f"w{i}"] = (rng.standard_normal((width, cin, k)) / np.sqrt(cin * k)) \
            .astype(np.float32)
        inits[f"b{i}"] = rng.standard_normal(width).astype(np.float32) * 0.1
        nodes += [helper.make_node("Conv", [x, f"w{i}", f"b{i}"], [f"c{i}"], name=f"conv{i}",
                                   kernel_shape=[k], strides=[s], pads=[p, p],
                                   dilations=[d]),
                  helper.make_node("Tanh", [f"c{i}"], [f"a{i}"], name=f"act{i}")]
        x, cin = f"a{i}", width
        length = (length + 2 * p - d * (k - 1) - 1) // s + 1
    out = {x: [1, width, length]}
    if to_tokens:
        inits.update(g=np.ones(width, np.float32), beta=np.zeros(width, np.float32),
                     wl=(rng.standard_normal((width, width)) / np.sqrt(width))
                     .astype(np.float32))
        nodes += [helper.make_node("Transpose", [x], ["t"], name="to_tokens", perm=[0, 2, 1]),
                  helper.make_node("LayerNormalization", ["t", "g", "beta"], ["n"], name="ln",
                                   axis=-1),
                  helper.make_node("MatMul", ["n", "wl"], ["y"], name="linear")]
        out = {"y": [1, length, width]}
    return _save(tmp, "conv1d_stem", nodes, inits, {"x": [1, mels, given]}, out)


def test_a_conv1d_map_is_tiled_along_its_length(tmp_path: Path) -> None:
    problem = api.prepare(_conv1d_stem(tmp_path), overrides=SMALL_SRAM)
    g = problem.graph
    assert g.layout("x").kind is LayoutKind.NCL
    assert (g.layout("a1").batch_axis, g.layout("a1").row_axis) == (0, 2)
    assert g.layout("t").kind is LayoutKind.TOKENS
    conv1 = g.layer("conv1")
    assert conv1.row_maps == (AxisMap(MapKind.WINDOW, 3, 2, 1, 1),)
    assert g.layer("to_tokens").row_maps == (IDENTITY,)
    # 1.25 MB of input alone: before, "cannot fit the chip even alone" at 256 KiB
    plan = api.plan_problem(problem)
    assert_verifies(problem, plan)
    assert plan.totals.dram_bytes == plan.compulsory_dram_bytes


@pytest.mark.parametrize("rows, reuse", [(64, False), (100, True), (7, True)])
def test_conv1d_tiles_recompute_or_reuse_their_halo(tmp_path: Path, rows: int,
                                                    reuse: bool) -> None:
    problem = api.prepare(_conv1d_stem(tmp_path, length=600, mels=16, width=32),
                          overrides=("sram.bytes=32KiB",))
    layers = tuple(lay.name for lay in problem.graph.layers)
    plan = hand_plan(problem, [Placement.of(layers, Tile(1, rows, 1), halo_reuse=reuse)])
    assert_verifies(problem, plan)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(layers=st.lists(st.tuples(st.integers(1, 5), st.integers(1, 3), st.integers(0, 2),
                                 st.integers(1, 2)), min_size=1, max_size=3),
       rows=st.integers(1, 40), reuse=st.booleans())
def test_random_conv1d_chains_verify_in_any_tile(tmp_path: Path,
                                                  layers: list[tuple[int, int, int, int]],
                                                  rows: int, reuse: bool) -> None:
    """Any 1-D conv chain (kernel, stride, pad, dilation), any tile of rows, halo recomputed
    or reused: outputs match onnxruntime and every counter the prediction."""
    layers = [(k, s, min(p, (k - 1) * d), d) for k, s, p, d in layers]
    model = _conv1d_stem(tmp_path, length=300, mels=8, width=16, layers=tuple(layers),
                         to_tokens=False)
    problem = api.prepare(model, overrides=SMALL_SRAM)
    names = tuple(lay.name for lay in problem.graph.layers)
    plan = hand_plan(problem, [Placement.of(names, Tile(1, rows, 1), halo_reuse=reuse)])
    assert_verifies(problem, plan)


def _rms_norm_block(tmp: Path, tokens: int = 2048, width: int = 512,
                    axes: tuple[int, ...] = (-1,)) -> str:
    """Linear -> RMSNorm as Llama exports it (Pow, ReduceMean over the last axis, Add eps,
    Sqrt, Div, Mul by the gain) -> Linear."""
    rng = np.random.default_rng(1)
    inits = {"w1": (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32),
             "w2": (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32),
             "two": np.array(2.0, np.float32), "eps": np.array(1e-6, np.float32),
             "gain": rng.standard_normal(width).astype(np.float32)}
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
             helper.make_node("Pow", ["h", "two"], ["p"], name="pow"),
             helper.make_node("ReduceMean", ["p"], ["m"], name="mean", axes=list(axes),
                              keepdims=1),
             helper.make_node("Add", ["m", "eps"], ["e"], name="add"),
             helper.make_node("Sqrt", ["e"], ["s"], name="sqrt"),
             helper.make_node("Div", ["h", "s"], ["d"], name="div"),
             helper.make_node("Mul", ["d", "gain"], ["n"], name="gain"),
             helper.make_node("MatMul", ["n", "w2"], ["y"], name="mm2")]
    return _save(tmp, "rms", nodes, inits, {"x": [1, tokens, width]},
                 {"y": [1, tokens, width]})


def test_rms_norm_over_a_tokens_channels_fuses_per_token(tmp_path: Path) -> None:
    problem = api.prepare(_rms_norm_block(tmp_path, tokens=512, width=256),
                          overrides=("sram.bytes=128KiB",))
    g = problem.graph
    assert g.layer("mean").row_maps == (IDENTITY,)
    assert g.layout("m").kind is LayoutKind.TOKENS
    # 256 KiB per map on a 128 KiB chip: before, "cannot fit even alone" (the mean read
    # whole); the weights stream or sit in WRAM, the maps go by tiles of tokens
    plan = api.plan_problem(problem)
    assert len(plan.groups) == 1
    assert plan.totals.dram_bytes == plan.compulsory_dram_bytes
    assert_verifies(problem, plan)


def test_a_mean_over_the_tokens_still_needs_them_all(tmp_path: Path) -> None:
    problem = api.prepare(_rms_norm_block(tmp_path, tokens=64, width=32, axes=(1,)))
    assert problem.graph.layer("mean").row_maps[0].kind is MapKind.WHOLE
    assert_verifies(problem, api.plan_problem(problem))


def test_a_mean_over_a_pixels_channels_is_per_pixel(tmp_path: Path) -> None:
    """CBAM's channel mean [N, C, H, W] -> [N, 1, H, W]: row-local, tiled like the map."""
    rng = np.random.default_rng(2)
    inits = {"w": (rng.standard_normal((16, 8, 3, 3)) / 8).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("ReduceMean", ["c"], ["m"], name="mean", axes=[1], keepdims=1),
             helper.make_node("Sigmoid", ["m"], ["g"], name="gate"),
             helper.make_node("Mul", ["c", "g"], ["y"], name="scale")]
    model = _save(tmp_path, "cbam", nodes, inits, {"x": [1, 8, 64, 64]},
                  {"y": [1, 16, 64, 64]})
    problem = api.prepare(model, overrides=("sram.bytes=65536",))
    assert problem.graph.layer("mean").row_maps == (IDENTITY,)
    names = tuple(lay.name for lay in problem.graph.layers)
    plan = hand_plan(problem, [Placement.of(names, Tile(1, 8, 16))])
    assert_verifies(problem, plan)


def test_a_fold_onnx_evaluator_gets_wrong_is_done_by_onnxruntime(tmp_path: Path) -> None:
    """BERT's token type ids: GatherElements of a [1, 512] buffer by [1, 128] position ids.
    onnx's reference evaluator fails on it ("cannot reshape array of size 1"); onnxruntime
    runs it, so the model loads, plans and verifies."""
    rng = np.random.default_rng(3)
    inits = {"buffer": np.zeros((1, 512), np.int64),
             "positions": np.arange(128, dtype=np.int64).reshape(1, 128),
             "types": rng.standard_normal((2, 64)).astype(np.float32),
             "table": rng.standard_normal((512, 64)).astype(np.float32)}
    nodes = [helper.make_node("GatherElements", ["buffer", "positions"], ["ids"],
                              name="/embeddings/GatherElements", axis=1),
             helper.make_node("Gather", ["types", "ids"], ["te"], name="type_embedding"),
             helper.make_node("Gather", ["table", "positions"], ["pe"], name="positions"),
             helper.make_node("Add", ["x", "te"], ["a"], name="add_types"),
             helper.make_node("Add", ["a", "pe"], ["y"], name="add_positions")]
    model = _save(tmp_path, "bert_embeddings", nodes, inits, {"x": [1, 128, 64]},
                  {"y": [1, 128, 64]})
    problem = api.prepare(model)
    assert_verifies(problem, api.plan_problem(problem))


def _image_tokens_image(tmp: Path, h: int = 32, w: int = 32, c: int = 16) -> str:
    """SegFormer's Mix-FFN round trip: conv -> Reshape [1, C, H W] -> Transpose to tokens ->
    LayerNormalization -> Linear -> Transpose back -> Reshape [1, C, H, W] -> 3x3 depthwise
    conv; and a detector's flatten of two scales joined along their positions."""
    rng = np.random.default_rng(4)
    inits = {"w0": (rng.standard_normal((c, 3, 3, 3)) / 5).astype(np.float32),
             "flat": np.array([1, c, h * w], np.int64),
             "image": np.array([1, c, h, w], np.int64),
             "g": np.ones(c, np.float32), "b": np.zeros(c, np.float32),
             "wl": (rng.standard_normal((c, c)) / np.sqrt(c)).astype(np.float32),
             "dw": (rng.standard_normal((c, 1, 3, 3)) / 3).astype(np.float32),
             "pool_flat": np.array([1, c, h * w // 4], np.int64)}
    nodes = [helper.make_node("Conv", ["x", "w0"], ["f"], name="embed", pads=[1] * 4),
             helper.make_node("Reshape", ["f", "flat"], ["l"], name="flatten"),
             helper.make_node("Transpose", ["l"], ["t"], name="to_tokens", perm=[0, 2, 1]),
             helper.make_node("LayerNormalization", ["t", "g", "b"], ["n"], name="ln"),
             helper.make_node("MatMul", ["n", "wl"], ["m"], name="linear"),
             helper.make_node("Transpose", ["m"], ["u"], name="to_channels", perm=[0, 2, 1]),
             helper.make_node("Reshape", ["u", "image"], ["i"], name="unflatten"),
             helper.make_node("Conv", ["i", "dw"], ["d"], name="dwconv", pads=[1] * 4,
                              group=c),
             helper.make_node("MaxPool", ["d"], ["p"], name="pool", kernel_shape=[2, 2],
                              strides=[2, 2]),
             helper.make_node("Reshape", ["d", "flat"], ["s1"], name="scale1"),
             helper.make_node("Reshape", ["p", "pool_flat"], ["s2"], name="scale2"),
             helper.make_node("Concat", ["s1", "s2"], ["cat"], name="join", axis=2),
             helper.make_node("Sigmoid", ["cat"], ["y"], name="head")]
    return _save(tmp, "regroup", nodes, inits, {"x": [1, 3, h, w]},
                 {"y": [1, c, h * w + h * w // 4]})


def test_a_flatten_of_rows_and_columns_is_a_sequence_of_rows(tmp_path: Path) -> None:
    problem = api.prepare(_image_tokens_image(tmp_path))
    g = problem.graph
    assert (g.layout("l").row_axis, g.layout("t").row_axis, g.layout("u").row_axis) == (2, 1, 2)
    assert g.layout("i").kind is LayoutKind.NCHW and g.layout("cat").row_axis == 2
    assert g.layer("flatten").row_maps == (AxisMap(MapKind.UPSAMPLE, stride=32),)
    assert g.layer("unflatten").row_maps == (AxisMap(MapKind.WINDOW, kernel=32, stride=32),)
    assert g.layer("to_tokens").row_maps == g.layer("to_channels").row_maps == (IDENTITY,)
    assert [m.kind for m in g.layer("join").row_maps] == [MapKind.OFFSET] * 2


@pytest.mark.parametrize("stop, rows", [("dwconv", 4), ("dwconv", 5), ("head", 100),
                                        ("head", 333)])
def test_image_token_round_trips_verify_in_row_tiles(tmp_path: Path, stop: str,
                                                     rows: int) -> None:
    """One group from the embedding conv through the tokens back to the image (tiles of
    image rows), or the whole model in tiles of the joined sequence's positions."""
    problem = api.prepare(_image_tokens_image(tmp_path), overrides=("sram.bytes=65536",))
    names = [lay.name for lay in problem.graph.layers]
    start = 0 if stop == "dwconv" else names.index("scale1")
    layers = tuple(names[start:names.index(stop) + 1])
    if stop == "head":
        layers = tuple(n for n in names if n in ("scale1", "scale2", "join", "head"))
    plan = hand_plan(problem, [Placement.of(layers, Tile(1, rows, 32 if stop == "dwconv"
                                                          else 1))])
    assert_verifies(problem, plan)


def test_the_planners_plan_of_an_image_token_round_trip_verifies(tmp_path: Path) -> None:
    problem = api.prepare(_image_tokens_image(tmp_path), overrides=("sram.bytes=65536",))
    plan = api.plan_problem(problem)
    assert plan.totals.dram_bytes < plan.layer_by_layer_dram_bytes
    assert_verifies(problem, plan)


def test_a_1x1_conv_of_a_sequence_keeps_its_positions(tmp_path: Path) -> None:
    """YOLOv8's DFL: [1, 64, L] -> Reshape [1, 4, 16, L] -> Transpose [1, 16, 4, L] ->
    Softmax over the 16 bins -> 1x1 conv by the bin values -> Reshape [1, 4, L]: every op
    per position, tiled along L (before: the conv read axes 2 and 3 as rows and columns)."""
    length = 2100
    inits = {"bins": np.arange(16, dtype=np.float32).reshape(1, 16, 1, 1),
             "flat": np.array([1, 64, length], np.int64),
             "split": np.array([1, 4, 16, length], np.int64),
             "back": np.array([1, 4, length], np.int64)}
    nodes = [helper.make_node("Reshape", ["x", "flat"], ["f"], name="flatten"),
             helper.make_node("Sigmoid", ["f"], ["s"], name="act"),
             helper.make_node("Reshape", ["s", "split"], ["r"], name="bins_split"),
             helper.make_node("Transpose", ["r"], ["t"], name="bins_first", perm=[0, 2, 1, 3]),
             helper.make_node("Softmax", ["t"], ["p"], name="softmax", axis=1),
             helper.make_node("Conv", ["p", "bins"], ["e"], name="expect", kernel_shape=[1, 1]),
             helper.make_node("Reshape", ["e", "back"], ["y"], name="boxes")]
    model = _save(tmp_path, "dfl", nodes, inits, {"x": [1, 64, 35, 60]},
                  {"y": [1, 4, length]})
    problem = api.prepare(model, overrides=("sram.bytes=65536",))
    g = problem.graph
    assert g.layout("e").row_axis == 3 and g.layer("expect").row_maps == (IDENTITY,)
    names = tuple(lay.name for lay in g.layers)
    plan = hand_plan(problem, [Placement.of(names, Tile(1, 128, 1))])
    assert_verifies(problem, plan)


def test_a_window_over_axes_that_are_not_rows_and_columns_needs_them_whole(
        tmp_path: Path) -> None:
    """A 3x3 conv reads axes 2 and 3; where the map is tiled along another axis (a
    sequence's positions moved to axis 3) the window cannot follow: whole, right answers."""
    rng = np.random.default_rng(5)
    inits = {"w": (rng.standard_normal((4, 4, 3, 3)) / 6).astype(np.float32),
             "flat": np.array([1, 32, 256], np.int64),
             "split": np.array([1, 4, 8, 256], np.int64)}
    nodes = [helper.make_node("Reshape", ["x", "flat"], ["f"], name="flatten"),
             helper.make_node("Sigmoid", ["f"], ["s"], name="act"),
             helper.make_node("Reshape", ["s", "split"], ["r"], name="split"),
             helper.make_node("Conv", ["r", "w"], ["y"], name="conv", pads=[1] * 4)]
    model = _save(tmp_path, "odd_window", nodes, inits, {"x": [1, 32, 16, 16]},
                  {"y": [1, 4, 8, 256]})
    problem = api.prepare(model)
    g = problem.graph
    assert g.layout("r").row_axis == 3
    assert g.layer("conv").row_maps[0].kind is MapKind.WHOLE
    assert_verifies(problem, api.plan_problem(problem))
