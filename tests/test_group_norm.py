"""Group normalisations in two passes (issue 42; planner.front.group_norm): the loader's
rewrite computes what the fused op computes, on any rank, group count and opset, and a
group norm over a map too large for the chip plans in passes and verifies."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from fuseplan.planner.app import api
from fuseplan.planner.front.group_norm import MADE_CONSTANT
from fuseplan.planner.front.onnx_load import (
    load_model,
    randomize_weights,
    weights_are_placeholders,
)
from fuseplan.planner.front.reference import ort_max_opset
from fuseplan.planner.plan.json_io import save_plan


def _exported(channels: int, groups: int, spatial: tuple[int, ...], opset: int,
              affine: bool, seed: int = 0) -> onnx.ModelProto:
    """conv -> GroupNorm as PyTorch exports it (Reshape [N, G, -1], InstanceNormalization
    with per-group scale and bias, Reshape back, per-channel Mul and Add) -> Sigmoid."""
    rng = np.random.default_rng(seed)
    c, g = channels, groups
    inits = [
        numpy_helper.from_array(rng.standard_normal((c, c, *[1] * len(spatial)))
                                .astype(np.float32) * 0.3, "w"),
        numpy_helper.from_array(np.array([1, g, -1], np.int64), "split"),
        numpy_helper.from_array(np.array([1, c, *spatial], np.int64), "back"),
        numpy_helper.from_array((1 + 0.3 * rng.standard_normal(g) if affine else np.ones(g))
                                .astype(np.float32), "in_scale"),
        numpy_helper.from_array((0.3 * rng.standard_normal(g) if affine else np.zeros(g))
                                .astype(np.float32), "in_bias"),
        numpy_helper.from_array((1 + 0.2 * rng.standard_normal((c, *[1] * len(spatial))))
                                .astype(np.float32), "gamma"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["a"], name="conv"),
        helper.make_node("Reshape", ["a", "split"], ["merged"], name="split"),
        helper.make_node("InstanceNormalization", ["merged", "in_scale", "in_bias"], ["n"],
                         name="norm", epsilon=1e-5),
        helper.make_node("Reshape", ["n", "back"], ["b"], name="back"),
        helper.make_node("Mul", ["b", "gamma"], ["m"], name="affine"),
        helper.make_node("Sigmoid", ["m"], ["y"], name="act"),
    ]
    shape = [1, c, *spatial]
    graph = helper.make_graph(nodes, "gn", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, shape)], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, shape)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def _ort(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return np.asarray(session.run(None, {"x": x})[0])


def _same_as_fused(original: onnx.ModelProto, tmp_path: Path) -> onnx.ModelProto:
    """Load `original` and assert the loaded model computes what it computes."""
    path = tmp_path / "gn.onnx"
    onnx.save(original, path)
    loaded = load_model(str(path))
    shape = [d.dim_value for d in original.graph.input[0].type.tensor_type.shape.dim]
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32) * 3 + 1
    want, got = _ort(original, x), _ort(loaded.proto, x)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5 * float(np.abs(want).max()))
    ops = {n.op_type for n in loaded.proto.graph.node}
    assert not ops & {"InstanceNormalization", "GroupNormalization"}, ops
    return loaded.proto


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_the_two_pass_form_computes_the_fused_op(tmp_path: Path, data: st.DataObject) -> None:
    groups = data.draw(st.sampled_from([1, 2, 4, 8]), "groups")
    channels = groups * data.draw(st.integers(1, 4), "channels per group")
    spatial = tuple(data.draw(st.lists(st.integers(1, 9), min_size=1, max_size=2), "spatial"))
    opset = data.draw(st.sampled_from([13, 17, 18]), "opset")
    affine = data.draw(st.booleans(), "affine")
    _same_as_fused(_exported(channels, groups, spatial, opset, affine), tmp_path)


@settings(max_examples=10, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_an_instance_norm_of_a_map_is_split_too(tmp_path: Path, data: st.DataObject) -> None:
    """InstanceNormalization straight on [N, C, *S]: a group per channel."""
    channels = data.draw(st.integers(1, 6), "channels")
    spatial = tuple(data.draw(st.lists(st.integers(1, 9), min_size=1, max_size=2), "spatial"))
    affine = data.draw(st.booleans(), "affine")
    rng = np.random.default_rng(channels)
    scale = (1 + 0.3 * rng.standard_normal(channels)) if affine else np.ones(channels)
    bias = 0.3 * rng.standard_normal(channels) if affine else np.zeros(channels)
    shape = [2, channels, *spatial]
    node = helper.make_node("InstanceNormalization", ["x", "s", "b"], ["y"], name="inorm",
                            epsilon=1e-5)
    graph = helper.make_graph([node], "in", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, shape)], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, shape)], [
        numpy_helper.from_array(scale.astype(np.float32), "s"),
        numpy_helper.from_array(bias.astype(np.float32), "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    _same_as_fused(model, tmp_path)


def test_a_half_precision_group_norm_keeps_its_type(tmp_path: Path) -> None:
    """The constants the split makes take the map's element type (an fp16 export stays
    valid: onnxruntime refuses a Conv of float16 data by float32 weights)."""
    model = _exported(8, 4, (5, 5), 17, affine=True)
    for tensor in model.graph.initializer:
        if tensor.data_type == TensorProto.FLOAT:
            tensor.CopyFrom(numpy_helper.from_array(
                numpy_helper.to_array(tensor).astype(np.float16), tensor.name))
    for value in (*model.graph.input, *model.graph.output):
        value.type.tensor_type.elem_type = TensorProto.FLOAT16
    path = tmp_path / "gn16.onnx"
    onnx.save(model, path)
    loaded = load_model(str(path))
    x = np.random.default_rng(1).standard_normal((1, 8, 5, 5)).astype(np.float16)
    want, got = _ort(model, x), _ort(loaded.proto, x)
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), atol=2e-2)


@pytest.mark.skipif(ort_max_opset() < 21, reason="onnxruntime without GroupNormalization-21")
def test_a_group_normalization_node_is_split_too(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    scale = numpy_helper.from_array((1 + 0.3 * rng.standard_normal(6)).astype(np.float32), "s")
    bias = numpy_helper.from_array((0.3 * rng.standard_normal(6)).astype(np.float32), "b")
    node = helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"], name="gn",
                            num_groups=3, epsilon=1e-5)
    graph = helper.make_graph([node], "gn", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [1, 6, 5, 7])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, [1, 6, 5, 7])], [scale, bias])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    _same_as_fused(model, tmp_path)


def test_verification_weights_leave_the_loaders_constants_alone(tmp_path: Path) -> None:
    """Random weights replace the conv's and the affine's, never the averaging weights or
    the epsilon (a random epsilon could be negative: NaN), and those constants do not make
    a model's weights look like placeholders."""
    path = tmp_path / "gn.onnx"
    onnx.save(_exported(16, 4, (6, 6), 17, affine=True), path)
    loaded = load_model(str(path))
    made = {t.name: numpy_helper.to_array(t) for t in loaded.proto.graph.initializer
            if t.doc_string == MADE_CONSTANT}
    assert len(made) == 3 and any(v.size == 1 or np.all(v == 1e-5) for v in made.values())
    assert not weights_are_placeholders(loaded)
    weighted = randomize_weights(loaded, 7)
    after = {t.name: numpy_helper.to_array(t) for t in weighted.proto.graph.initializer}
    for name, value in made.items():
        np.testing.assert_array_equal(after[name], value)
    assert not np.array_equal(after["w"], numpy_helper.to_array(
        next(t for t in loaded.proto.graph.initializer if t.name == "w")))


def test_a_group_norm_too_large_for_the_chip_runs_in_passes_and_verifies(tmp_path: Path
                                                                         ) -> None:
    """GroupNorm over a 64 x 32 x 32 map (256 KiB) on a 128 KiB chip: before the split it
    needed the whole map on chip and had no plan; now its group runs in passes (statistics,
    variance, then the normalised map) and verifies against onnxruntime to the byte."""
    path = tmp_path / "gn.onnx"
    onnx.save(_exported(64, 8, (32, 32), 17, affine=True), path)
    overrides = ["sram.bytes=128KiB"]
    plan = api.solve(str(path), overrides=overrides)
    assert max(g.placement.passes for g in plan.groups) == 3, plan.groups
    plan_path = tmp_path / "plan.json"
    save_plan(plan, plan_path)
    report = api.verify(str(path), plan_path, overrides=overrides)
    assert report.ok, (report.first_output_mismatch, report.first_counter_mismatch)
    assert report.outputs_match and report.predicted_matches_emulated
