"""Differential tests: emulator.kernels.run_op against onnxruntime, one node at a time.

The spatial kernels take explicit *asymmetric* pads ``[top, left, bottom, right]``
(ONNX order ``[x1_begin, x2_begin, x1_end, x2_end]``).  That is what lets the
emulator run a single tile of a layer: it passes the tile's input slice and the
tile's effective pads (real padding only where the tile touches the border), so
the pad handling is exercised here with independent random pads on every side.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
import onnx.helper
import onnx.numpy_helper
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto

from fuseplan.emulator import kernels
from fuseplan.emulator.kernels import SUPPORTED, run_op, run_reference

RTOL, ATOL = 1e-4, 1e-5
HYP = settings(max_examples=30, deadline=None)


def _attr(value: Any) -> Any:
    return onnx.numpy_helper.from_array(value) if isinstance(value, np.ndarray) else value


def ort_run(op_type: str, attrs: Mapping[str, Any], inputs: Sequence[np.ndarray | None],
            opset: int, num_outputs: int = 1) -> list[np.ndarray]:
    """Run one node with onnxruntime (CPU, no graph optimizations)."""
    inputs = list(inputs)
    while inputs and inputs[-1] is None:
        inputs.pop()
    names = [f"in{i}" if v is not None else "" for i, v in enumerate(inputs)]
    outs = [f"out{i}" for i in range(num_outputs)]
    node = onnx.helper.make_node(op_type, names, outs, **{k: _attr(v) for k, v in attrs.items()})
    graph_inputs = [
        onnx.helper.make_tensor_value_info(
            name, onnx.helper.np_dtype_to_tensor_dtype(v.dtype), list(v.shape))
        for name, v in zip(names, inputs, strict=True) if v is not None
    ]
    graph = onnx.helper.make_graph(
        [node], "g", graph_inputs, [onnx.ValueInfoProto(name=o) for o in outs])
    opsets = [onnx.helper.make_opsetid("", opset)]
    model = onnx.helper.make_model(graph, opset_imports=opsets)
    model.ir_version = onnx.helper.find_min_ir_version_for(
        [onnx.helper.make_opsetid("", max(opset, 7))])
    model = onnx.shape_inference.infer_shapes(model)  # output element types
    for out in model.graph.output:  # keep types, drop inferred shapes (ORT is the oracle)
        out.type.tensor_type.ClearField("shape")
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), so,
                                providers=["CPUExecutionProvider"])
    feeds = {n: v for n, v in zip(names, inputs, strict=True) if v is not None}
    return list(sess.run(None, feeds))


def check(op_type: str, attrs: Mapping[str, Any], inputs: Sequence[np.ndarray | None],
          opset: int, num_outputs: int = 1) -> list[np.ndarray]:
    """Assert run_op == onnxruntime (shape, dtype, values)."""
    got = run_op(op_type, attrs, inputs, opset, num_outputs=num_outputs)
    want = ort_run(op_type, attrs, inputs, opset, num_outputs)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape, (g.shape, w.shape)
        assert g.dtype == w.dtype, (g.dtype, w.dtype)
        np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL)
    return got


def rnd(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def i64(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int64)


def f32(*values: float) -> np.ndarray:
    return np.array(values, dtype=np.float32)


# --------------------------------------------------------------------------- #
# Conv / ConvTranspose
# --------------------------------------------------------------------------- #

pads4 = st.lists(st.integers(0, 2), min_size=4, max_size=4)


@st.composite
def conv_case(draw: st.DrawFn) -> tuple[dict[str, Any], list[np.ndarray | None]]:
    kind = draw(st.sampled_from(["plain", "depthwise", "grouped"]))
    if kind == "plain":
        group, cg, mg = 1, draw(st.integers(1, 4)), draw(st.integers(1, 4))
    elif kind == "depthwise":
        group, cg, mg = draw(st.integers(1, 6)), 1, draw(st.integers(1, 2))
    else:
        group, cg, mg = draw(st.integers(2, 4)), draw(st.integers(1, 3)), draw(st.integers(1, 3))
    k = [draw(st.integers(1, 5)), draw(st.integers(1, 5))]
    s = [draw(st.integers(1, 3)), draw(st.integers(1, 3))]
    d = [draw(st.integers(1, 2)), draw(st.integers(1, 2))]
    pads = draw(pads4)
    eff = [(ki - 1) * di + 1 for ki, di in zip(k, d, strict=True)]
    hw = [max(1, e - pads[i] - pads[i + 2]) + draw(st.integers(0, 6)) for i, e in enumerate(eff)]
    seed = draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    n = draw(st.integers(1, 2))
    x = rng.standard_normal((n, group * cg, *hw)).astype(np.float32)
    w = rng.standard_normal((group * mg, cg, *k)).astype(np.float32)
    b = rng.standard_normal(group * mg).astype(np.float32) if draw(st.booleans()) else None
    attrs: dict[str, Any] = {"kernel_shape": k, "strides": s, "dilations": d, "pads": pads,
                             "group": group}
    return attrs, [x, w, b]


@HYP
@given(conv_case())
def test_conv_random(case: tuple[dict[str, Any], list[np.ndarray | None]]) -> None:
    attrs, inputs = case
    check("Conv", attrs, inputs, 13)


@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER", "VALID"])
@pytest.mark.parametrize("stride", [1, 2, 3])
def test_conv_auto_pad(auto_pad: str, stride: int) -> None:
    x, w = rnd(1, 3, 10, 9), rnd(4, 3, 4, 3, seed=1)
    check("Conv", {"auto_pad": auto_pad, "strides": [stride, stride]}, [x, w], 11)


@pytest.mark.parametrize("spatial", [1, 3])
def test_conv_1d_3d(spatial: int) -> None:
    x = rnd(2, 4, *([7] * spatial))
    w = rnd(6, 2, *([3] * spatial), seed=1)
    attrs = {"group": 2, "strides": [2] * spatial, "pads": [1] * spatial + [0] * spatial}
    check("Conv", attrs, [x, w, rnd(6, seed=2)], 11)


@pytest.mark.parametrize(
    ("op", "extra"),
    [("Conv", {}), ("MaxPool", {}), ("AveragePool", {"count_include_pad": 0}),
     ("AveragePool", {"count_include_pad": 1})],
)
@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize(("a", "b"), [(0, 3), (2, 5), (4, 6)])
def test_tile_with_effective_pads_matches_full_layer(op: str, extra: dict[str, Any],
                                                     stride: int, a: int, b: int) -> None:
    """Output rows [a, b) of a padded layer == the layer run on its input tile.

    The tile is the input row range the outputs need, clipped to the map; its
    effective top/bottom pads are whatever the clipping removed (0 inside the map).
    """
    x, w = rnd(1, 2, 12, 9), rnd(3, 2, 3, 3, seed=1)
    k, pad = 3, [2, 1, 1, 1]
    attrs = {"strides": [stride, stride], **extra}
    if op != "Conv":
        attrs["kernel_shape"] = [k, k]
    weights = [w] if op == "Conv" else []
    full = run_op(op, {**attrs, "pads": pad}, [x, *weights], 13)[0]
    b = min(b, full.shape[2])
    lo, hi = a * stride - pad[0], (b - 1) * stride - pad[0] + k
    tile_pads = [max(0, -lo), pad[1], max(0, hi - x.shape[2]), pad[3]]
    tile_x = x[:, :, max(lo, 0): min(hi, x.shape[2])]
    tile = run_op(op, {**attrs, "pads": tile_pads}, [tile_x, *weights], 13)[0]
    np.testing.assert_allclose(tile, full[:, :, a:b], rtol=RTOL, atol=ATOL)


def test_conv_negative_pads_crop() -> None:
    x, w = rnd(1, 2, 8, 8), rnd(3, 2, 3, 3, seed=1)
    got = run_op("Conv", {"pads": [-1, 0, 1, -2]}, [x, w], 13)[0]
    want = run_op("Conv", {"pads": [0, 0, 1, 0]}, [x[:, :, 1:, :-2], w], 13)[0]
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("group", [1, 2])
def test_big_conv_split_over_two_threads(group: int) -> None:
    """A conv big enough for the two-thread product (rows halved) still matches."""
    # weights scaled so that sums over 576 products stay within the absolute tolerance
    x, w = rnd(1, 64, 12, 13), rnd(256, 64 // group, 3, 3, seed=1) * np.float32(0.05)
    b = rnd(256, seed=2)
    assert 256 // group * 64 // group * 9 * 12 * 13 * group >= kernels._SPLIT_MACS
    check("Conv", {"kernel_shape": [3, 3], "pads": [1, 0, 1, 1], "group": group}, [x, w, b], 13)


def test_split_matmul_takes_back_the_half_a_busy_helper_never_started() -> None:
    """When the helper thread is busy, the caller computes both halves itself."""
    pool = kernels._helper()
    if pool is None:
        pytest.skip("single-CPU machine: products are never split")
    a, b = rnd(2, 300, 200), rnd(2, 200, 80, seed=1)
    out = np.empty((2, 300, 80), np.float32)
    gate = threading.Event()
    blocker = pool.submit(gate.wait)  # the helper's one thread is now busy
    try:
        kernels._split_matmul(a, b, out)
    finally:
        gate.set()
        blocker.result()
    np.testing.assert_allclose(out, a @ b, rtol=RTOL, atol=ATOL)


@st.composite
def conv_t_case(draw: st.DrawFn) -> tuple[dict[str, Any], list[np.ndarray | None]]:
    group = draw(st.sampled_from([1, 2, 3]))
    cg, mg = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    k = [draw(st.integers(1, 4)), draw(st.integers(1, 4))]
    s = [draw(st.integers(1, 3)), draw(st.integers(1, 3))]
    d = [draw(st.integers(1, 2)), draw(st.integers(1, 2))]
    op = [draw(st.integers(0, si - 1)) for si in s]
    hw = [draw(st.integers(1, 6)), draw(st.integers(1, 6))]
    full = [si * (h - 1) + o + (ki - 1) * di + 1
            for si, h, o, ki, di in zip(s, hw, op, k, d, strict=True)]
    pads = [draw(st.integers(0, min(2, (f - 1) // 2))) for f in full] * 2
    pads[2] = draw(st.integers(0, min(2, full[0] - 1 - pads[0])))
    pads[3] = draw(st.integers(0, min(2, full[1] - 1 - pads[1])))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    x = rng.standard_normal((draw(st.integers(1, 2)), group * cg, *hw)).astype(np.float32)
    w = rng.standard_normal((group * cg, mg, *k)).astype(np.float32)
    b = rng.standard_normal(group * mg).astype(np.float32) if draw(st.booleans()) else None
    attrs: dict[str, Any] = {"kernel_shape": k, "strides": s, "dilations": d, "pads": pads,
                             "output_padding": op, "group": group}
    return attrs, [x, w, b]


@HYP
@given(conv_t_case())
def test_conv_transpose_random(case: tuple[dict[str, Any], list[np.ndarray | None]]) -> None:
    attrs, inputs = case
    check("ConvTranspose", attrs, inputs, 11)


@pytest.mark.parametrize("output_shape", [[10, 10], [9, 11], [11, 12]])
@pytest.mark.parametrize("auto_pad", ["NOTSET", "SAME_UPPER", "SAME_LOWER"])
def test_conv_transpose_output_shape(output_shape: list[int], auto_pad: str) -> None:
    x, w = rnd(1, 2, 5, 5), rnd(2, 3, 3, 3, seed=1)
    attrs = {"strides": [2, 2], "output_shape": output_shape, "auto_pad": auto_pad}
    check("ConvTranspose", attrs, [x, w], 11)


@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER"])
def test_conv_transpose_same_kernel_smaller_than_stride(auto_pad: str) -> None:
    """SAME gives in*stride outputs even when that exceeds the full result (zeros appended).

    onnxruntime clamps the output to the full extent here, so compare with explicit pads.
    """
    x, w = rnd(1, 2, 5, 4), rnd(2, 3, 1, 2, seed=1)
    same = run_op("ConvTranspose", {"strides": [2, 3], "auto_pad": auto_pad}, [x, w], 11)[0]
    full = ort_run("ConvTranspose", {"strides": [2, 3]}, [x, w], 11)[0]
    assert same.shape == (1, 3, 10, 12) and full.shape == (1, 3, 9, 11)
    np.testing.assert_allclose(same[:, :, :9, :11], full, rtol=RTOL, atol=ATOL)
    assert not same[:, :, 9:].any() and not same[:, :, :, 11:].any()


@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER", "VALID"])
@pytest.mark.parametrize("kernel", [(4, 3), (2, 3), (3, 5)])
def test_conv_transpose_auto_pad(auto_pad: str, kernel: tuple[int, int]) -> None:
    x, w = rnd(1, 2, 5, 4), rnd(2, 3, *kernel, seed=1)
    check("ConvTranspose", {"strides": [2, 3], "auto_pad": auto_pad}, [x, w], 11)


# --------------------------------------------------------------------------- #
# Pooling
# --------------------------------------------------------------------------- #


@st.composite
def pool_case(draw: st.DrawFn, dilated: bool) -> tuple[dict[str, Any], np.ndarray]:
    k = [draw(st.integers(1, 4)), draw(st.integers(1, 4))]
    s = [draw(st.integers(1, 3)), draw(st.integers(1, 3))]
    d = [draw(st.integers(1, 2)), draw(st.integers(1, 2))] if dilated else [1, 1]
    pads = [draw(st.integers(0, k[i % 2] - 1)) for i in range(4)]
    eff = [(ki - 1) * di + 1 for ki, di in zip(k, d, strict=True)]
    hw = [e + draw(st.integers(0, 6)) for e in eff]
    attrs: dict[str, Any] = {"kernel_shape": k, "strides": s, "pads": pads,
                             "ceil_mode": draw(st.integers(0, 1))}
    if dilated:
        attrs["dilations"] = d
    x = np.random.default_rng(draw(st.integers(0, 2**16))).standard_normal(
        (draw(st.integers(1, 2)), draw(st.integers(1, 3)), *hw)).astype(np.float32)
    return attrs, x


@HYP
@given(pool_case(dilated=True), st.integers(1, 2))
def test_max_pool_random(case: tuple[dict[str, Any], np.ndarray], nout: int) -> None:
    attrs, x = case
    check("MaxPool", attrs, [x], 12, num_outputs=nout)


@HYP
@given(pool_case(dilated=False), st.integers(0, 1))
def test_average_pool_random(case: tuple[dict[str, Any], np.ndarray], cip: int) -> None:
    attrs, x = case
    check("AveragePool", {**attrs, "count_include_pad": cip}, [x], 11)


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER", "VALID"])
def test_pool_auto_pad(op: str, auto_pad: str) -> None:
    attrs = {"kernel_shape": [3, 2], "strides": [2, 2], "auto_pad": auto_pad}
    check(op, attrs, [rnd(1, 2, 7, 8)], 11)


def test_max_pool_indices_storage_order() -> None:
    attrs = {"kernel_shape": [2, 3], "strides": [2, 1], "pads": [1, 0, 0, 1],
             "storage_order": 1}
    check("MaxPool", attrs, [rnd(2, 3, 6, 5)], 12, num_outputs=2)


def test_max_pool_int8() -> None:
    x = np.random.default_rng(0).integers(-128, 127, (1, 2, 6, 6)).astype(np.int8)
    check("MaxPool", {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, [x], 12)


def test_average_pool_dilated_opset19() -> None:
    attrs = {"kernel_shape": [2, 3], "dilations": [2, 1], "pads": [1, 0, 1, 2],
             "ceil_mode": 1, "strides": [2, 2]}
    check("AveragePool", attrs, [rnd(1, 2, 9, 8)], 19)


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool"])
def test_global_pool(op: str) -> None:
    check(op, {}, [rnd(2, 3, 5, 4)], 13)


# --------------------------------------------------------------------------- #
# Activations and normalization
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize(
    ("op", "attrs"),
    [
        ("Relu", {}),
        ("LeakyRelu", {}),
        ("LeakyRelu", {"alpha": 0.2}),
        ("Elu", {}),
        ("Elu", {"alpha": 0.7}),
        ("Selu", {}),
        ("Selu", {"alpha": 1.5, "gamma": 1.1}),
        ("Sigmoid", {}),
        ("Tanh", {}),
        ("HardSigmoid", {}),
        ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}),
        ("Sqrt", {}),
        ("Exp", {}),
        ("Abs", {}),
        ("Neg", {}),
        ("Reciprocal", {}),
    ],
)
def test_unary(op: str, attrs: dict[str, Any]) -> None:
    x = rnd(2, 3, 4, 5) * 4
    if op == "Sqrt":
        x = np.abs(x)
    check(op, attrs, [x], 13)


def test_hard_swish() -> None:
    check("HardSwish", {}, [rnd(2, 3, 4, 5) * 5], 14)


@pytest.mark.parametrize("slope_shape", [(3, 1, 1), (1,), (5,), (1, 3, 4, 5)])
def test_prelu(slope_shape: tuple[int, ...]) -> None:
    check("PRelu", {}, [rnd(2, 3, 4, 5), rnd(*slope_shape, seed=1)], 9)


@pytest.mark.parametrize(
    ("opset", "attrs", "lo", "hi"),
    [
        (6, {"min": -0.5, "max": 0.7}, None, None),
        (9, {"min": -0.5}, None, None),
        (9, {}, None, None),
        (11, {}, f32(-0.5).reshape(()), f32(0.3).reshape(())),
        (13, {}, None, f32(0.3).reshape(())),
        (13, {}, f32(-0.2).reshape(()), None),
        (13, {}, None, None),
    ],
)
def test_clip(opset: int, attrs: dict[str, Any], lo: np.ndarray | None,
              hi: np.ndarray | None) -> None:
    check("Clip", attrs, [rnd(2, 3, 4), lo, hi], opset)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("opset", [11, 13])
@pytest.mark.parametrize("axis", [None, 0, 1, 2, -1, -3])
def test_softmax(op: str, opset: int, axis: int | None) -> None:
    attrs = {} if axis is None else {"axis": axis}
    check(op, attrs, [rnd(2, 3, 4, 5) * 3], opset)


@pytest.mark.parametrize("size", [1, 2, 3, 4, 5])
def test_lrn(size: int) -> None:
    attrs = {"size": size, "alpha": 0.01, "beta": 0.6, "bias": 1.5}
    x = rnd(2, 7, 3, 3)
    if size % 2:
        check("LRN", attrs, [x], 13)
    else:  # onnxruntime only accepts odd sizes; check the spec formula by brute force
        lo, hi = (size - 1) // 2, size - 1 - (size - 1) // 2
        sq = np.stack([(x[:, max(0, c - lo): c + hi + 1] ** 2).sum(axis=1)
                       for c in range(x.shape[1])], axis=1)
        want = x / (1.5 + 0.01 / size * sq) ** 0.6
        np.testing.assert_allclose(run_op("LRN", attrs, [x], 13)[0], want, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("opset", [9, 14, 15])
def test_batch_norm(opset: int) -> None:
    c = 4
    params = [rnd(c, seed=1), rnd(c, seed=2), rnd(c, seed=3), np.abs(rnd(c, seed=4)) + 0.1]
    check("BatchNormalization", {"epsilon": 1e-3}, [rnd(2, c, 3, 5), *params], opset)


def test_instance_norm() -> None:
    check("InstanceNormalization", {"epsilon": 1e-4},
          [rnd(2, 3, 4, 5) * 2 + 1, rnd(3, seed=1), rnd(3, seed=2)], 6)


# --------------------------------------------------------------------------- #
# Elementwise / variadic
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
@pytest.mark.parametrize("b_shape", [(2, 3, 4, 5), (3, 1, 1), (5,), (1, 3, 4, 1), ()])
def test_binary(op: str, b_shape: tuple[int, ...]) -> None:
    b = rnd(*b_shape, seed=1) if b_shape else np.array(1.7, np.float32)
    check(op, {}, [rnd(2, 3, 4, 5), b], 13)


def test_div_int_truncates() -> None:
    a = np.array([7, -7, 7, -7, 0], np.int64)
    b = np.array([2, 2, -2, -2, 3], np.int64)
    check("Div", {}, [a, b], 13)


def test_binary_legacy_broadcast() -> None:
    a, b = rnd(2, 3, 4, 5), rnd(3, 4, seed=1)
    got = run_op("Add", {"broadcast": 1, "axis": 1}, [a, b], 6)[0]
    np.testing.assert_allclose(got, a + b[None, :, :, None])


@pytest.mark.parametrize("exp", [np.array(2.0, np.float32), np.array(3, np.int64), None])
def test_pow(exp: np.ndarray | None) -> None:
    base = np.abs(rnd(2, 3, 4)) + 0.1
    e = rnd(2, 3, 4, seed=1) if exp is None else exp
    check("Pow", {}, [base, e], 13)


@pytest.mark.parametrize("op", ["Sum", "Max", "Min", "Mean"])
@pytest.mark.parametrize("n_in", [1, 2, 3])
def test_variadic(op: str, n_in: int) -> None:
    shapes = [(2, 3, 4), (3, 1), (4,)][:n_in]
    check(op, {}, [rnd(*s, seed=i) for i, s in enumerate(shapes)], 13)


@pytest.mark.parametrize(("ta", "tb"), [(0, 0), (1, 0), (0, 1), (1, 1)])
@pytest.mark.parametrize("c_shape", [None, (6,), (4, 6), (1, 1)])
def test_gemm(ta: int, tb: int, c_shape: tuple[int, ...] | None) -> None:
    a = rnd(5, 4) if ta else rnd(4, 5)
    b = rnd(6, 5, seed=1) if tb else rnd(5, 6, seed=1)
    c = None if c_shape is None else rnd(*c_shape, seed=2)
    check("Gemm", {"alpha": 0.5, "beta": 2.0, "transA": ta, "transB": tb}, [a, b, c], 13)


@pytest.mark.parametrize(("sa", "sb"), [((3, 4), (4, 5)), ((2, 3, 4), (4, 5)),
                                        ((2, 1, 3, 4), (5, 4, 6)), ((4,), (4, 2))])
def test_matmul(sa: tuple[int, ...], sb: tuple[int, ...]) -> None:
    check("MatMul", {}, [rnd(*sa), rnd(*sb, seed=1)], 13)


@pytest.mark.parametrize("op", ["ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin"])
@pytest.mark.parametrize("opset", [11, 13, 18])
@pytest.mark.parametrize("axes", [None, [1], [-1, 0], [2, 3]])
@pytest.mark.parametrize("keepdims", [0, 1])
def test_reduce(op: str, opset: int, axes: list[int] | None, keepdims: int) -> None:
    axes_as_input = opset >= 18 or (op == "ReduceSum" and opset >= 13)
    attrs: dict[str, Any] = {"keepdims": keepdims}
    inputs: list[np.ndarray | None] = [rnd(2, 3, 4, 5)]
    if axes is not None:
        if axes_as_input:
            inputs.append(np.array(axes, np.int64))
        else:
            attrs["axes"] = axes
    check(op, attrs, inputs, opset)


def test_reduce_noop_with_empty_axes() -> None:
    check("ReduceSum", {"noop_with_empty_axes": 1}, [rnd(2, 3)], 13)


@pytest.mark.parametrize("to", [TensorProto.FLOAT, TensorProto.INT32, TensorProto.INT64,
                                TensorProto.FLOAT16, TensorProto.BOOL, TensorProto.UINT8])
def test_cast(to: int) -> None:
    x = (rnd(3, 4) * 10).round(1)
    if to == TensorProto.UINT8:
        x = np.abs(x)
    check("Cast", {"to": to}, [x], 13)


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("idx", [i64(0, 2, -1), np.array([[1, 0], [2, -2]], np.int64)])
def test_gather(axis: int, idx: np.ndarray) -> None:
    check("Gather", {"axis": axis}, [rnd(3, 4, 5), idx], 13)


# --------------------------------------------------------------------------- #
# Tensor manipulation
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_concat(axis: int) -> None:
    shapes = [[2, 3, 4], [2, 3, 4], [2, 3, 4]]
    for i, s in enumerate(shapes):
        s[axis] += i
    check("Concat", {"axis": axis}, [rnd(*s, seed=i) for i, s in enumerate(shapes)], 13)


@pytest.mark.parametrize(
    ("opset", "attrs", "split", "nout", "dim"),
    [
        (11, {"axis": 1}, None, 3, 6),
        (11, {"axis": 1, "split": [1, 4, 1]}, None, 3, 6),
        (13, {"axis": -1}, None, 2, 6),
        (13, {"axis": 1}, i64(2, 4), 2, 6),
        (18, {"axis": 1, "num_outputs": 4}, None, 4, 7),
        (18, {"axis": 1, "num_outputs": 3}, None, 3, 6),
    ],
)
def test_split(opset: int, attrs: dict[str, Any], split: np.ndarray | None, nout: int,
               dim: int) -> None:
    check("Split", attrs, [rnd(2, dim, 4), split], opset, num_outputs=nout)


def test_split_default_outputs_from_sizes() -> None:
    out = run_op("Split", {"axis": 0}, [rnd(5, 2), i64(2, 3)], 13)
    assert [o.shape for o in out] == [(2, 2), (3, 2)]


@st.composite
def slice_case(draw: st.DrawFn) -> tuple[list[int], list[int], list[int], list[int]]:
    shape = [4, 5, 6]
    axes = draw(st.lists(st.integers(-3, 2), min_size=1, max_size=3,
                         unique_by=lambda a: a % 3))
    big = st.sampled_from([2**62, -(2**62), 2**63 - 1, -(2**63)])
    starts, ends, steps = [], [], []
    for a in axes:
        dim = shape[a]
        step = draw(st.sampled_from([-3, -2, -1, 1, 2, 3]))
        end = draw(st.integers(-dim - 2, dim + 2) | big)
        if step < 0 and end == 2**63 - 1:
            end = -(2**63)  # see test_slice_int_max_end_negative_step
        starts.append(draw(st.integers(-dim - 2, dim + 2) | big))
        ends.append(end)
        steps.append(step)
    return starts, ends, axes, steps


@HYP
@given(slice_case())
def test_slice_random(case: tuple[list[int], list[int], list[int], list[int]]) -> None:
    starts, ends, axes, steps = case
    check("Slice", {}, [rnd(4, 5, 6), i64(*starts), i64(*ends), i64(*axes), i64(*steps)], 13)


def test_slice_int_max_end_negative_step() -> None:
    """Spec clamping: end=INT64_MAX with a negative step clamps to dim-1 (ONNX reference).

    onnxruntime instead reads INT_MAX as "to the beginning", so compare with the reference.
    """
    inputs = [rnd(4, 5, 6), i64(3, 0), i64(2**63 - 1, 2**63 - 1), i64(0, 1), i64(-1, -2)]
    got = run_op("Slice", {}, inputs, 13)[0]
    np.testing.assert_array_equal(got, run_reference("Slice", {}, inputs, 13)[0])


def test_slice_opset9_attrs() -> None:
    attrs = {"starts": [1, -3], "ends": [100, -1], "axes": [0, 2]}
    check("Slice", attrs, [rnd(4, 5, 6)], 9)


def test_slice_default_axes_steps() -> None:
    check("Slice", {}, [rnd(4, 5, 6), i64(1, -4), i64(3, 10)], 13)


@pytest.mark.parametrize(
    ("shape", "allowzero", "in_shape"),
    [([0, -1], 0, (2, 3, 4)), ([-1], 0, (2, 3, 4)), ([2, 0, 2, 2], 0, (2, 3, 4)),
     ([4, 0], 1, (0, 4)), ([6, -1, 1], 0, (2, 3, 4))],
)
def test_reshape(shape: list[int], allowzero: int, in_shape: tuple[int, ...]) -> None:
    attrs = {"allowzero": allowzero} if allowzero else {}
    check("Reshape", attrs, [rnd(*in_shape), np.array(shape, np.int64)], 14)


@pytest.mark.parametrize("axis", [0, 1, 2, -1, 4])
def test_flatten(axis: int) -> None:
    check("Flatten", {"axis": axis}, [rnd(2, 3, 4, 5)], 13)


@pytest.mark.parametrize("perm", [None, [0, 2, 3, 1], [3, 1, 0, 2]])
def test_transpose(perm: list[int] | None) -> None:
    check("Transpose", {} if perm is None else {"perm": perm}, [rnd(2, 3, 4, 5)], 13)


@pytest.mark.parametrize("opset", [11, 13])
@pytest.mark.parametrize("axes", [None, [0], [-1, 2]])
def test_squeeze(opset: int, axes: list[int] | None) -> None:
    x = rnd(1, 3, 1, 1)
    if axes is None:
        check("Squeeze", {}, [x], opset)
    elif opset < 13:
        check("Squeeze", {"axes": axes}, [x], opset)
    else:
        check("Squeeze", {}, [x, np.array(axes, np.int64)], opset)


@pytest.mark.parametrize("opset", [11, 13])
@pytest.mark.parametrize("axes", [[0], [-1, 0], [1, 3]])
def test_unsqueeze(opset: int, axes: list[int]) -> None:
    x = rnd(3, 4)
    if opset < 13:
        check("Unsqueeze", {"axes": axes}, [x], opset)
    else:
        check("Unsqueeze", {}, [x, np.array(axes, np.int64)], opset)


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge"])
@pytest.mark.parametrize("pads", [[0, 0, 1, 2, 0, 0, 2, 1], [0, 1, 0, 0, 0, 0, 1, 2],
                                  [0, 0, -1, 2, 0, 0, 1, -2]])
@pytest.mark.parametrize("opset", [2, 11, 13])
def test_pad(mode: str, pads: list[int], opset: int) -> None:
    x = rnd(1, 2, 4, 5)
    if opset < 11:
        check("Pad", {"mode": mode, "pads": pads, "value": 0.5}, [x], opset)
    else:
        check("Pad", {"mode": mode}, [x, np.array(pads, np.int64), f32(0.5).reshape(())],
              opset)


def test_pad_axes_opset18() -> None:
    check("Pad", {"mode": "constant"}, [rnd(1, 2, 4, 5), i64(1, 2, 0, 3), None, i64(-1, 2)], 18)


@pytest.mark.parametrize("opset", [12, 13])
@pytest.mark.parametrize("nout", [1, 2])
def test_dropout(opset: int, nout: int) -> None:
    check("Dropout", {}, [rnd(2, 3)], opset, num_outputs=nout)


@pytest.mark.parametrize(("opset", "mask_dtype"), [(7, np.float32), (10, np.bool_)])
def test_dropout_legacy_mask(opset: int, mask_dtype: type) -> None:
    """Inference keeps everything, so the mask is all ones (T before opset 10, bool after).

    onnxruntime's legacy Dropout kernel (opset < 12) writes zeros there, so only Y is compared.
    """
    x = rnd(2, 3)
    y, mask = run_op("Dropout", {}, [x], opset, num_outputs=2)
    np.testing.assert_array_equal(y, ort_run("Dropout", {}, [x], opset)[0])
    assert mask.dtype == mask_dtype and np.all(mask == 1)


def test_identity() -> None:
    check("Identity", {}, [rnd(2, 3)], 13)


# --------------------------------------------------------------------------- #
# Resize / Upsample
# --------------------------------------------------------------------------- #

COORD_MODES = ["half_pixel", "asymmetric", "align_corners", "pytorch_half_pixel",
               "tf_half_pixel_for_nn"]
NEAREST_MODES = ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]
SCALES = [(2.0, 2.0), (3.0, 1.5), (0.5, 0.75), (0.6, 2.5)]


EMPTY = np.zeros(0, np.float32)


@pytest.mark.parametrize(
    ("opset", "coord"),
    [(o, c) for o in (11, 13) for c in COORD_MODES if o == 11 or c != "tf_half_pixel_for_nn"],
)
@pytest.mark.parametrize("nearest_mode", NEAREST_MODES)
@pytest.mark.parametrize("scale", SCALES)
def test_resize_nearest(coord: str, nearest_mode: str, scale: tuple[float, float],
                        opset: int) -> None:
    x = rnd(1, 2, 5, 8)
    attrs = {"mode": "nearest", "coordinate_transformation_mode": coord,
             "nearest_mode": nearest_mode}
    roi = EMPTY if opset == 11 else None  # roi is a required input in Resize-11
    check("Resize", attrs, [x, roi, f32(1, 1, *scale)], opset)


@pytest.mark.parametrize("coord", [c for c in COORD_MODES if c != "tf_half_pixel_for_nn"])
@pytest.mark.parametrize("scale", SCALES)
def test_resize_linear(coord: str, scale: tuple[float, float]) -> None:
    x = rnd(2, 3, 5, 8)
    attrs = {"mode": "linear", "coordinate_transformation_mode": coord}
    check("Resize", attrs, [x, None, f32(1, 1, *scale)], 13)


@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize("coord", ["half_pixel", "align_corners", "pytorch_half_pixel"])
@pytest.mark.parametrize("sizes", [(10, 16), (7, 3), (1, 9), (5, 8)])
def test_resize_sizes(mode: str, coord: str, sizes: tuple[int, int]) -> None:
    x = rnd(1, 2, 5, 8)
    attrs = {"mode": mode, "coordinate_transformation_mode": coord}
    check("Resize", attrs, [x, None, None, i64(1, 2, *sizes)], 13)


def test_resize_opset11_empty_roi_scales() -> None:
    x = rnd(1, 2, 5, 8)
    check("Resize", {"mode": "linear"}, [x, EMPTY, EMPTY, i64(1, 2, 9, 4)], 11)


@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize("scale", SCALES)
def test_resize_opset10(mode: str, scale: tuple[float, float]) -> None:
    check("Resize", {"mode": mode}, [rnd(1, 2, 5, 8), f32(1, 1, *scale)], 10)


@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize("use_sizes", [False, True])
def test_resize_axes_opset18(mode: str, use_sizes: bool) -> None:
    x = rnd(1, 2, 5, 8)
    attrs = {"mode": mode, "axes": [-1, 2]}
    if use_sizes:
        check("Resize", attrs, [x, None, None, i64(12, 7)], 18)
    else:
        check("Resize", attrs, [x, None, f32(1.5, 2.0)], 18)


@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize("sizes", [(10, 13), (3, 5)])
def test_resize_half_pixel_symmetric(mode: str, sizes: tuple[int, int]) -> None:
    attrs = {"mode": mode, "coordinate_transformation_mode": "half_pixel_symmetric"}
    check("Resize", attrs, [rnd(1, 2, 5, 8), None, None, i64(1, 2, *sizes)], 19)


def test_resize_cubic_falls_back() -> None:
    x = rnd(1, 1, 4, 4)
    check("Resize", {"mode": "cubic"}, [x, None, f32(1, 1, 2, 2)], 13)


@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize("scale", [(2.0, 2.0), (3.0, 1.5), (1.0, 2.5)])
@pytest.mark.parametrize("opset", [7, 9])
def test_upsample(mode: str, scale: tuple[float, float], opset: int) -> None:
    x = rnd(1, 2, 4, 5)
    scales = [1.0, 1.0, *scale]
    if opset < 9:
        check("Upsample", {"mode": mode, "scales": scales}, [x], opset)
    else:
        check("Upsample", {"mode": mode}, [x, np.array(scales, np.float32)], opset)


# --------------------------------------------------------------------------- #
# Reference fallback
# --------------------------------------------------------------------------- #


def test_unsupported_ops_use_reference() -> None:
    assert "Erf" not in SUPPORTED and "Einsum" not in SUPPORTED
    check("Erf", {}, [rnd(3, 4)], 13)
    check("Einsum", {"equation": "ij,jk->ik"}, [rnd(3, 4), rnd(4, 2, seed=1)], 12)


def test_reference_agrees_with_native_conv() -> None:
    x, w = rnd(1, 4, 7, 7), rnd(4, 1, 3, 3, seed=1)
    attrs = {"group": 4, "pads": [0, 1, 2, 1], "strides": [2, 1]}
    native = run_op("Conv", attrs, [x, w], 13)[0]
    ref = run_reference("Conv", attrs, [x, w], 13)[0]
    np.testing.assert_allclose(native, ref, rtol=RTOL, atol=ATOL)


def test_reference_tensor_attribute() -> None:
    value = np.arange(6, dtype=np.float32).reshape(2, 3)
    out = run_op("Constant", {"value": value}, [], 13)[0]
    np.testing.assert_array_equal(out, value)
