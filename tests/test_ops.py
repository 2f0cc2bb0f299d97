"""planner.ir.ops: the op table is consistent, drives graph build and the emulator, and LpPool
has a real kernel that matches onnxruntime, alone and tile by tile in a fused group."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from fuseplan.emulator.kernels import SUPPORTED, registered_kernels, run_op
from fuseplan.hardware.chip import load_chip
from fuseplan.planner.front.onnx_load import _weight_roles
from fuseplan.planner.geometry.regions import Tile
from fuseplan.planner.ir.graph import MapKind
from fuseplan.planner.ir.ops import (
    MAIN_OPS,
    MOVEMENT_OPS,
    PARAMETER_INPUT_OPS,
    REDUCTION_OPS,
    SCALAR_OPS,
    VECTOR_OPS,
    BranchScale,
    InputRole,
    MapRule,
    OpClass,
    Rectified,
    known_ops,
    op_class,
    op_spec,
)
from fuseplan.planner.plan.placement import Placement
from tests import models
from tests.test_emulator import load_proto, make_plan, run_verify

TABLE = known_ops()


def test_every_entry_is_filed_under_its_own_name() -> None:
    wrong = [(op, s.op) for op, s in TABLE.items() if s.op != op]
    assert not wrong, f"entries filed under another op's name: {wrong}"


def test_class_sets_partition_the_table() -> None:
    sets = {OpClass.MAIN: MAIN_OPS, OpClass.VECTOR: VECTOR_OPS, OpClass.SCALAR: SCALAR_OPS,
            OpClass.MOVEMENT: MOVEMENT_OPS, OpClass.REDUCTION: REDUCTION_OPS}
    for cls, ops in sets.items():
        assert ops == {op for op, s in TABLE.items() if s.op_class is cls}, cls
        assert all(op_class(op) is cls for op in ops), cls
    classed = set().union(*sets.values())
    assert sum(len(s) for s in sets.values()) == len(classed), "an op in two classes"
    opaque = set(TABLE) - classed
    assert all(TABLE[op].op_class is OpClass.OPAQUE for op in opaque)


def test_the_classes_the_rules_rely_on() -> None:
    """Seed 000's classes for the ops the zoo uses (the rules match classes, not names)."""
    assert {"Conv", "ConvTranspose", "MaxPool", "AveragePool", "Gemm", "MatMul"} <= MAIN_OPS
    assert {"Relu", "BatchNormalization", "LRN", "Softmax"} <= VECTOR_OPS
    assert {"Add", "Mul", "Sum"} <= SCALAR_OPS
    assert {"Concat", "Reshape", "Transpose", "Dropout"} <= MOVEMENT_OPS
    assert {"GlobalAveragePool", "ReduceMean"} <= REDUCTION_OPS


@pytest.mark.parametrize("op", sorted(TABLE))
def test_entry_is_consistent(op: str) -> None:
    s = TABLE[op]
    if s.sliding_window:  # a kernel window over rows and columns: main work
        assert s.op_class is OpClass.MAIN, f"{op}: window op of class {s.op_class}"
    if s.op_class is OpClass.OPAQUE:
        assert s.maps is MapRule.WHOLE, f"{op}: an opaque op keeps rows local"
    if s.op_class is OpClass.REDUCTION:  # rows local only where it folds channels alone
        assert s.maps in (MapRule.WHOLE, MapRule.REDUCE), f"{op}: a reduction with {s.maps}"
    if s.op_class is OpClass.MOVEMENT:
        assert not s.takes_weights, f"{op}: movement constants are parameters"
        assert s.work_per_output({}, [(1, 4, 8, 8)], None, (1, 4, 8, 8)) == 0, op
    assert (op in PARAMETER_INPUT_OPS) == (not s.takes_weights)
    roles = [s.role(i) for i in range(6)]
    if InputRole.WEIGHT in roles:
        assert s.fan_in is not None, f"{op}: a weight input without a fan-in"
        assert s.takes_weights, f"{op}: weight roles but constants taken as parameters"
    assert s.is_convolution == (op in ("Conv", "ConvTranspose")), op
    if s.op_class is OpClass.MOVEMENT:
        assert s.rectified is Rectified.IF_INPUTS, f"{op}: moving values changes their sign"
    if s.branch_scale is BranchScale.INPUT1:
        assert s.role(1) in (InputRole.WEIGHT, InputRole.SCALE), f"{op}: input 1 scales nothing"
    if s.sums_inputs:
        assert s.op_class is OpClass.SCALAR, f"{op}: a residual join that is not elementwise"
    if s.maps is MapRule.UPSAMPLE:  # graph_build reads how it samples from the defaults
        assert {"coordinate_transformation_mode", "nearest_mode"} <= set(s.with_defaults({})), op


def test_every_named_kernel_is_registered_and_every_kernel_is_named() -> None:
    named = {s.kernel for s in TABLE.values() if s.kernel is not None}
    assert named - registered_kernels() == set(), "table names kernels the emulator lacks"
    assert registered_kernels() - named == set(), "kernels no table entry names"
    assert {op for op, s in TABLE.items() if s.kernel is not None} == SUPPORTED


def test_unknown_op_is_opaque() -> None:
    s = op_spec("Atanh")
    assert (s.op, s.op_class, s.maps, s.kernel) == ("Atanh", OpClass.OPAQUE, MapRule.WHOLE, None)
    assert s.takes_weights and not s.is_convolution and not s.sliding_window
    assert not s.batch_preserving({}, [(2, 3)], (2, 3), 13)
    assert s.work_per_output({}, [(2, 3)], None, (2, 3)) == 1
    assert s.role(0) is None and s.role(1) is None
    # the emulator runs it with the ONNX reference evaluator
    x = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
    assert run_op("Atanh", {}, [x], 13)[0].shape == (2, 3)


def test_input_roles() -> None:
    conv, gemm, div, mul = op_spec("Conv"), op_spec("Gemm"), op_spec("Div"), op_spec("Mul")
    assert [conv.role(i) for i in range(4)] == [None, InputRole.WEIGHT, InputRole.BIAS, None]
    assert conv.fan_in is not None and conv.fan_in(1, (16, 8, 3, 3), {}) == 72
    assert gemm.fan_in is not None
    # B is (K, N), or (N, K) with transB: the fan-in is K either way
    assert gemm.fan_in(1, (64, 10), {}) == 64 and gemm.fan_in(1, (10, 64), {"transB": 1}) == 64
    assert gemm.fan_in(1, (2, 3, 4), {}) is None  # not a matrix: left as it is
    assert [div.role(i) for i in range(3)] == [None, InputRole.MUL, None]
    assert {mul.role(i) for i in range(3)} == {InputRole.MUL}
    assert op_spec("Reshape").role(1) is None and not op_spec("Reshape").takes_weights


@pytest.mark.parametrize("op, w, attrs, channels", [
    ("Conv", (16, 4, 3, 3), {"group": 2}, 8),  # C_in/group per group
    ("Conv", (16, 4, 3, 3), {}, 4),
    ("ConvTranspose", (8, 4, 3, 3), {"group": 2}, 8),  # W is (C_in, C_out/group, k...)
    ("BatchNormalization", (16,), {}, 16),
    ("InstanceNormalization", (16,), {}, 16),
    ("BatchNormalization", (16, 1), {}, None),  # not a per-channel vector: no check
    ("Conv", (16,), {}, None),
])
def test_input_channels_the_weights_imply(op: str, w: tuple[int, ...], attrs: dict[str, Any],
                                          channels: int | None) -> None:
    fn = op_spec(op).in_channels
    assert fn is not None and fn(w, attrs) == channels
    assert op_spec("Relu").in_channels is None and op_spec("Gemm").in_channels is None


def test_upsample_samples_by_floor_and_resize_by_its_attributes() -> None:
    """Upsample has no sampling attributes (always floor(i / scale)); Resize's defaults are
    half-pixel centres, and a node's own attributes win."""
    up, resize = op_spec("Upsample"), op_spec("Resize")
    assert up.with_defaults({"mode": "nearest"}) == {
        "mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}
    assert resize.with_defaults({})["coordinate_transformation_mode"] == "half_pixel"
    assert resize.with_defaults({"nearest_mode": "ceil"})["nearest_mode"] == "ceil"
    assert op_spec("Conv").with_defaults({"group": 2}) == {"group": 2}


def _factors(proto: Any) -> dict[str, float]:
    """Random-weight multiplier of each node's input 1, by node name (the builder's prefix
    and counter)."""
    roles = _weight_roles(proto)
    return {n.name: roles[n.input[1]].factor for n in proto.graph.node
            if len(n.input) > 1 and n.input[1] in roles}


def test_he_scaling_follows_rectified_inputs_through_pooling_and_movement() -> None:
    """A weight fed by a ReLU-like output, also through pools, movement and DepthToSpace,
    keeps N(0, 2/fan_in); one fed by the input, a Sigmoid or an LpPool gets half the variance."""
    b = models._Builder(np.random.default_rng(0))
    x = b.conv("input", 4, 8, 3, prefix="first")
    x = b.one("MaxPool", [b.one("LeakyRelu", [x])], kernel_shape=[2, 2], strides=[2, 2])
    x = b.one("DepthToSpace", [b.one("Transpose", [x], perm=[0, 1, 3, 2])], blocksize=2)
    x = b.one("Sigmoid", [b.conv(x, 2, 8, 3, prefix="after_relu")])
    x = b.conv(x, 8, 8, 3, prefix="after_sigmoid")
    x = b.one("LpPool", [b.one("Relu", [x])], kernel_shape=[2, 2], p=2)
    x = b.conv(x, 8, 4, 1, prefix="after_lppool")
    got = _factors(b.model((1, 4, 8, 8), x, 13))
    half = np.sqrt(0.5)
    assert got == pytest.approx({"first3": half, "after_relu10": 1.0, "after_sigmoid14": half,
                                 "after_lppool19": half}), got


def test_residual_branches_are_damped() -> None:
    """An Add of a conv branch and an identity path damps the conv by 0.2; an Add of two conv
    branches (projection shortcut) damps each by 1/sqrt(2); a Mul's constant scales the branch
    and an Add of a constant shift is looked through."""
    got = _factors(models.residual_net())
    half = np.sqrt(0.5)  # the stem is fed by the input, not a ReLU
    assert got == pytest.approx({"stem3": half, "conv_a7": 1.0, "conv_b11": 1.0, "conv_c15": 0.2,
                                 "conv_a20": 1.0, "conv_b24": 1.0, "conv_c28": 1 / np.sqrt(2),
                                 "proj31": 1 / np.sqrt(2)}), got
    b = models._Builder(np.random.default_rng(0))
    x = b.one("Relu", [b.conv("input", 4, 4, 3, prefix="stem")])
    shift = b.const("shift", np.full((1, 4, 1, 1), 0.1, np.float32))
    scale = b.const("scale", np.full((1, 4, 1, 1), 2.0, np.float32))
    left = b.one("Add", [b.bn(b.conv(x, 4, 4, 3, prefix="left"), 4), shift])
    right = b.one("Mul", [b.conv(x, 4, 4, 3, prefix="right"), scale])
    proto = b.model((1, 4, 8, 8), b.one("Sum", [left, right, x]), 13)
    roles = _weight_roles(proto)
    bn_scale = next(n.input[1] for n in proto.graph.node if n.op_type == "BatchNormalization")
    assert roles[bn_scale].factor == pytest.approx(0.2)  # BN scale, found through the Add
    assert roles[scale].factor == pytest.approx(0.2)  # the Mul's constant, not the conv
    assert roles[shift].factor == 1.0


@pytest.mark.parametrize("op, attrs, kept", [
    ("Split", {}, False),  # ONNX splits along axis 0 by default
    ("Split", {"axis": 1}, True),
    ("Concat", {"axis": 0}, False),
    ("Concat", {"axis": 1}, True),
    ("Softmax", {}, True),
    ("Transpose", {"perm": [0, 2, 1, 3]}, True),
    ("Transpose", {"perm": [1, 0, 2, 3]}, False),
    ("Gemm", {"transA": 1}, False),
    ("ReduceMean", {"axes": [2, 3]}, True),
    ("ReduceMean", {"axes": [0]}, False),
    ("Slice", {}, False),
    ("Relu", {}, True),
])
def test_batch_behaviour(op: str, attrs: dict[str, Any], kept: bool) -> None:
    shape = (2, 4, 6, 6)
    assert op_spec(op).batch_preserving(attrs, [shape], shape, 13) is kept


def test_batch_is_lost_when_extents_differ() -> None:
    assert not op_spec("Relu").batch_preserving({}, [(2, 4)], (1, 4), 13)


@pytest.mark.parametrize(("starts", "ends", "axes", "steps", "kept"), [
    ([0, 2], [4, 6], [0, 3], [1, 1], True),  # axis 0 whole, the width cut: kept
    ([0], [4], [3], [2], True),  # a step along the width only
    ([1], [4], [0], [1], False),  # cuts the batch
    ([-1], [-100], [0], [-1], False),  # reverses it: same extent, other order
])
def test_a_slice_keeps_the_batch_by_its_bounds(starts: list[int], ends: list[int],
                                               axes: list[int], steps: list[int],
                                               kept: bool) -> None:
    """Slice's bounds are constant inputs the index maps resolve (OpSpec.batch_from_maps):
    the batch is kept where the maps carry axis 0 whole, element for element."""
    inits = [helper.make_tensor(n, TensorProto.INT64, [len(v)], v)
             for n, v in (("s", starts), ("e", ends), ("a", axes), ("p", steps))]
    graph = helper.make_graph(
        [helper.make_node("Slice", ["x", "s", "e", "a", "p"], ["y"], name="cut"),
         helper.make_node("Relu", ["y"], ["z"], name="act")], "slice",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 3, 8, 8])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [None] * 4)], inits)
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    assert load_proto(proto).graph.layer("cut").batch_preserving is kept


# --------------------------------------------------------------------------- LpPool


def _ort(op: str, attrs: dict[str, Any], x: np.ndarray, opset: int) -> np.ndarray:
    node = helper.make_node(op, ["x"], ["y"], **attrs)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return np.asarray(session.run(None, {"x": x})[0])


@pytest.mark.parametrize("opset, attrs", [
    (11, {"kernel_shape": [3, 3], "p": 2, "pads": [1, 1, 1, 1], "strides": [2, 2]}),
    (13, {"kernel_shape": [2, 3], "p": 1}),
    (18, {"kernel_shape": [3, 3], "p": 3, "strides": [2, 1], "ceil_mode": 1,
          "dilations": [2, 1]}),
    (18, {"kernel_shape": [3, 3], "auto_pad": "SAME_UPPER", "strides": [2, 2]}),
])
def test_lp_pool_kernel_matches_onnxruntime(opset: int, attrs: dict[str, Any]) -> None:
    x = np.random.default_rng(opset).standard_normal((2, 3, 9, 10)).astype(np.float32)
    want = _ort("LpPool", attrs, x, opset)
    got = run_op("LpPool", attrs, [x], opset)[0]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_lp_pool_is_a_window_layer_and_verifies_tile_by_tile() -> None:
    """conv -> LpPool (k3 s2 p1) -> conv, one group cut in 3x3 tiles: outputs equal
    onnxruntime's and every byte counter equals the prediction."""
    b = models._Builder(np.random.default_rng(7))
    x = b.one("Relu", [b.conv("input", 3, 8, 3)])
    x = b.one("LpPool", [x], "lppool", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1],
              p=2)
    x = b.conv(x, 8, 4, 3)
    m = load_proto(b.model((1, 3, 16, 16), x, 13, name="lp_pool"))
    graph = m.graph
    pool = next(lay for lay in graph.layers if lay.op == "LpPool")
    assert pool.op_class is OpClass.MAIN and pool.macs_per_output == 9
    assert pool.row_maps[0].kind is MapKind.WINDOW and pool.row_maps[0].stride == 2
    chip, _ = load_chip("cluster4x4")
    plan = make_plan(m, chip, [Placement.of(m.names, Tile(1, 3, 3))])
    report = run_verify(m, plan, chip)
    assert report.outputs_match, report.first_output_mismatch
    got, want = report.per_group[0], plan.groups[0].predicted
    for key in ("dram_read_bytes", "dram_write_bytes", "redundant_read_bytes",
                "sram_peak_bytes", "macs"):
        assert getattr(got, key) == getattr(want, key), key
    assert got.redundant_read_bytes > 0  # the tiles re-read their halos
