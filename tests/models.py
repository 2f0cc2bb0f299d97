"""Small ONNX test models built with onnx.helper (float32, seeded random weights).

Every builder returns a checked ``onnx.ModelProto`` whose graph input is called ``input``
(``images`` for :func:`exported_net`) and whose nodes all have readable names.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = [
    "causal_encoder",
    "chain_cnn",
    "exported_net",
    "inception_net",
    "random_cnn",
    "residual_net",
    "save",
    "convnext_net",
    "se_net",
]


@dataclass
class _Builder:
    """Accumulates nodes and initializers; tracks channel count and spatial size."""

    rng: np.random.Generator
    nodes: list[onnx.NodeProto] = field(default_factory=list)
    inits: list[onnx.TensorProto] = field(default_factory=list)
    counter: int = 0

    def name(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def const(self, prefix: str, arr: np.ndarray) -> str:
        name = self.name(prefix)
        self.inits.append(numpy_helper.from_array(arr, name))
        return name

    def weight(self, shape: Sequence[int], fan_in: int) -> str:
        arr = self.rng.standard_normal(shape) * np.sqrt(2.0 / max(fan_in, 1))
        return self.const("w", arr.astype(np.float32))

    def bias(self, n: int) -> str:
        return self.const("b", (0.01 * self.rng.standard_normal(n)).astype(np.float32))

    def node(self, op: str, inputs: Sequence[str], prefix: str | None = None,
             n_out: int = 1, **attrs: Any) -> list[str]:
        name = self.name(prefix or op.lower())
        outs = [f"{name}_out{i}" if i else f"{name}_out" for i in range(n_out)]
        self.nodes.append(helper.make_node(op, list(inputs), outs, name=name, **attrs))
        return outs

    def one(self, op: str, inputs: Sequence[str], prefix: str | None = None,
            **attrs: Any) -> str:
        return self.node(op, inputs, prefix, **attrs)[0]

    def conv(self, x: str, cin: int, cout: int, k: int, stride: int = 1, pad: int | None = None,
             group: int = 1, dilation: int = 1, prefix: str = "conv") -> str:
        pad = (k // 2) * dilation if pad is None else pad
        w = self.weight((cout, cin // group, k, k), cin // group * k * k)
        return self.one("Conv", [x, w, self.bias(cout)], prefix, kernel_shape=[k, k],
                        strides=[stride, stride], pads=[pad] * 4, group=group,
                        dilations=[dilation, dilation])

    def bn(self, x: str, c: int) -> str:
        scale = self.const("bn_s", self.rng.uniform(0.5, 1.5, c).astype(np.float32))
        shift = self.const("bn_b", (0.1 * self.rng.standard_normal(c)).astype(np.float32))
        mean = self.const("bn_m", (0.1 * self.rng.standard_normal(c)).astype(np.float32))
        var = self.const("bn_v", self.rng.uniform(0.5, 1.5, c).astype(np.float32))
        return self.one("BatchNormalization", [x, scale, shift, mean, var], "bn", epsilon=1e-5)

    def gemm(self, x: str, cin: int, cout: int) -> str:
        return self.one("Gemm", [x, self.weight((cout, cin), cin), self.bias(cout)], "fc",
                        transB=1)

    def model(self, x_shape: Sequence[int | str], out: str | Sequence[str], opset: int,
              input_name: str = "input", name: str = "test") -> onnx.ModelProto:
        outs = [out] if isinstance(out, str) else list(out)
        graph = helper.make_graph(
            self.nodes, name,
            [helper.make_tensor_value_info(input_name, TensorProto.FLOAT, list(x_shape))],
            [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outs],
            self.inits,
        )
        opsets = [helper.make_opsetid("", opset)]
        model = helper.make_model(graph, opset_imports=opsets, producer_name="fuseplan-tests")
        model.ir_version = helper.find_min_ir_version_for(opsets)
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
        for given, found in zip(model.graph.output, inferred.graph.output, strict=True):
            given.type.CopyFrom(found.type)
        onnx.checker.check_model(model, full_check=True)
        return model


def save(model: onnx.ModelProto, tmp_path: Path, name: str) -> Path:
    """Save a model as ``tmp_path/name`` (``.onnx`` appended if missing); return the path."""
    path = Path(tmp_path) / (name if name.endswith(".onnx") else f"{name}.onnx")
    onnx.save(model, path)
    return path


def chain_cnn(seed: int = 0, n: int = 1, c: int = 3, h: int = 32, w: int = 32,
              opset: int = 13) -> onnx.ModelProto:
    """Conv-Relu-Conv-Relu-MaxPool-Conv(s2)-BN-Relu-GlobalAveragePool-Flatten-Gemm."""
    b = _Builder(np.random.default_rng(seed))
    x = b.one("Relu", [b.conv("input", c, 8, 3)])
    x = b.one("Relu", [b.conv(x, 8, 8, 3)])
    x = b.one("MaxPool", [x], kernel_shape=[2, 2], strides=[2, 2])
    x = b.one("Relu", [b.bn(b.conv(x, 8, 16, 3, stride=2), 16)])
    x = b.one("Flatten", [b.one("GlobalAveragePool", [x], "gap")], axis=1)
    return b.model((n, c, h, w), b.gemm(x, 16, 10), opset, name="chain_cnn")


def _bottleneck(b: _Builder, x: str, cin: int, mid: int, cout: int, stride: int) -> str:
    y = b.one("Relu", [b.conv(x, cin, mid, 1, prefix="conv_a")])
    y = b.one("Relu", [b.conv(y, mid, mid, 3, stride=stride, prefix="conv_b")])
    y = b.conv(y, mid, cout, 1, prefix="conv_c")
    short = x if stride == 1 and cin == cout else b.conv(x, cin, cout, 1, stride, prefix="proj")
    return b.one("Relu", [b.one("Add", [y, short])])


def residual_net(seed: int = 0, n: int = 1, c: int = 3, h: int = 32, w: int = 32,
                 opset: int = 13) -> onnx.ModelProto:
    """Stem conv and two ResNet bottlenecks (identity; stride 2 with projection shortcut)."""
    b = _Builder(np.random.default_rng(seed))
    x = b.one("Relu", [b.conv("input", c, 16, 3, prefix="stem")])
    x = _bottleneck(b, x, 16, 8, 16, 1)
    x = _bottleneck(b, x, 16, 8, 32, 2)
    return b.model((n, c, h, w), x, opset, name="residual_net")


def repeated_net(seed: int = 0, n: int = 1, h: int = 32, w: int = 32, repeats: int = 3,
                 opset: int = 13) -> onnx.ModelProto:
    """Stem conv, `repeats` identical identity bottlenecks and a strided one: the repeated
    structure of deep residual networks, small."""
    b = _Builder(np.random.default_rng(seed))
    x = b.one("Relu", [b.conv("input", 3, 16, 3, prefix="stem")])
    for _ in range(repeats):
        x = _bottleneck(b, x, 16, 8, 16, 1)
    x = _bottleneck(b, x, 16, 8, 32, 2)
    return b.model((n, 3, h, w), x, opset, name="repeated_net")


def skip_net(seed: int = 0, n: int = 1, h: int = 32, w: int = 32, repeats: int = 6,
             opset: int = 13) -> onnx.ModelProto:
    """Stem conv, `repeats` identity bottlenecks, and a head that concatenates the last
    block's output with the stem's (a long skip, as a segmentation head's low-level
    features) before a 1x1 conv: every position between is crossed by two tensors."""
    b = _Builder(np.random.default_rng(seed))
    stem = b.one("Relu", [b.conv("input", 3, 16, 3, prefix="stem")])
    x = stem
    for _ in range(repeats):
        x = _bottleneck(b, x, 16, 8, 16, 1)
    x = b.conv(b.one("Concat", [x, stem], "skip_concat", axis=1), 32, 8, 1, prefix="head")
    return b.model((n, 3, h, w), x, opset, name="skip_net")


def inception_net(seed: int = 0, n: int = 1, c: int = 3, h: int = 32, w: int = 32,
                  opset: int = 13) -> onnx.ModelProto:
    """Stem conv + maxpool, one four-branch Inception module (Concat), then AveragePool."""
    b = _Builder(np.random.default_rng(seed))
    x = b.one("Relu", [b.conv("input", c, 16, 3, prefix="stem")])
    x = b.one("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    b1 = b.one("Relu", [b.conv(x, 16, 8, 1, prefix="b1_1x1")])
    b2 = b.one("Relu", [b.conv(x, 16, 8, 1, prefix="b2_1x1")])
    b2 = b.one("Relu", [b.conv(b2, 8, 12, 3, prefix="b2_3x3")])
    b3 = b.one("Relu", [b.conv(x, 16, 4, 1, prefix="b3_1x1")])
    b3 = b.one("Relu", [b.conv(b3, 4, 6, 5, prefix="b3_5x5")])
    b4 = b.one("MaxPool", [x], "b4_pool", kernel_shape=[3, 3], strides=[1, 1],
               pads=[1, 1, 1, 1])
    b4 = b.one("Relu", [b.conv(b4, 16, 6, 1, prefix="b4_1x1")])
    x = b.one("Concat", [b1, b2, b3, b4], axis=1)
    x = b.one("AveragePool", [x], kernel_shape=[2, 2], strides=[2, 2])
    return b.model((n, c, h, w), x, opset, name="inception_net")


# --------------------------------------------------------------------------- exported_net


def _const_node(b: _Builder, arr: np.ndarray, prefix: str) -> str:
    """A Constant node (as exporters emit) rather than an initializer."""
    return b.one("Constant", [], prefix, value=numpy_helper.from_array(arr))


def _unsqueeze0(b: _Builder, x: str, opset: int) -> str:
    if opset >= 13:
        return b.one("Unsqueeze", [x, _const_node(b, np.array([0], np.int64), "axes")])
    return b.one("Unsqueeze", [x], axes=[0])


def _clip6(b: _Builder, x: str, opset: int) -> str:
    if opset >= 11:
        lo = _const_node(b, np.array(0.0, np.float32), "clip_min")
        hi = _const_node(b, np.array(6.0, np.float32), "clip_max")
        return b.one("Clip", [x, lo, hi])
    return b.one("Clip", [x], min=0.0, max=6.0)


def _hardswish(b: _Builder, x: str, opset: int) -> str:
    if opset >= 14:
        return b.one("HardSwish", [x])
    return b.one("Mul", [x, b.one("HardSigmoid", [x], alpha=1 / 6, beta=0.5)])


def _dynamic_shuffle(b: _Builder, x: str, channels: int, groups: int, opset: int) -> str:
    """Channel shuffle with Shape->Gather->Unsqueeze->Concat->Reshape (5D) and back."""
    shape = b.one("Shape", [x])
    dims = {}
    for axis in (0, 2, 3):
        index = _const_node(b, np.array(axis, np.int64), "idx")
        dims[axis] = _unsqueeze0(b, b.one("Gather", [shape, index], axis=0), opset)
    split = _const_node(b, np.array([groups, channels // groups], np.int64), "groups")
    shape5 = b.one("Concat", [dims[0], split, dims[2], dims[3]], axis=0)
    y = b.one("Reshape", [x, shape5])
    y = b.one("Transpose", [y], perm=[0, 2, 1, 3, 4])
    merged = _const_node(b, np.array([channels], np.int64), "channels")
    shape4 = b.one("Concat", [dims[0], merged, dims[2], dims[3]], axis=0)
    return b.one("Reshape", [y, shape4])


def _upsample2(b: _Builder, x: str, opset: int) -> str:
    scales = np.array([1, 1, 2, 2], np.float32)
    if opset < 10:
        return b.one("Upsample", [x, _const_node(b, scales, "scales")], mode="nearest")
    if opset == 10:
        return b.one("Resize", [x, _const_node(b, scales, "scales")], mode="nearest")
    if opset < 13:
        roi = _const_node(b, np.zeros(0, np.float32), "roi")
        return b.one("Resize", [x, roi, _const_node(b, scales, "scales")], mode="nearest")
    # torch style: sizes computed from the input's Shape
    factor = _const_node(b, np.array([1, 1, 2, 2], np.int64), "factor")
    sizes = b.one("Mul", [b.one("Shape", [x]), factor])
    return b.one("Resize", [x, "", "", sizes], mode="nearest",
                 coordinate_transformation_mode="asymmetric", nearest_mode="floor")


def exported_net(opset: int, dynamic: bool = True, seed: int = 0) -> onnx.ModelProto:
    """A "real export" style model over ``images`` [N, 3, H, W] (H and W multiples of 4).

    Symbolic N/H/W (unless ``dynamic=False``: 1x3x32x32), Constant nodes, Clip (inputs or
    attributes by opset), HardSigmoid/HardSwish, depthwise and dilated convs, a dynamic
    channel shuffle, Concat, ConvTranspose, Resize/Upsample and a Constant-fed Reshape head.
    """
    b = _Builder(np.random.default_rng(seed))
    x1 = _clip6(b, b.conv("images", 3, 16, 3, stride=2, prefix="stem"), opset)
    x2 = _hardswish(b, b.conv(x1, 16, 16, 3, group=16, prefix="dw"), opset)
    x3 = b.one("Relu", [b.conv(x2, 16, 16, 3, dilation=2, prefix="dilated")])
    x4 = b.one("Concat", [x1, _dynamic_shuffle(b, x3, 16, 2, opset)], axis=1)
    up_w = b.weight((32, 8, 4, 4), 32 * 4)
    x5 = b.one("ConvTranspose", [x4, up_w, b.bias(8)], "deconv", kernel_shape=[4, 4],
               strides=[2, 2], pads=[1, 1, 1, 1])
    x6 = b.one("HardSigmoid", [b.conv(x5, 8, 8, 3, stride=2, prefix="down")], alpha=0.2,
               beta=0.5)
    x7 = b.one("Add", [_upsample2(b, x6, opset), x5])
    flat = b.one("Reshape", [b.one("GlobalAveragePool", [x7], "gap"),
                             _const_node(b, np.array([0, -1], np.int64), "head_shape")])
    out = b.gemm(flat, 8, 10)
    shape: tuple[int | str, ...] = ("N", 3, "H", "W") if dynamic else (1, 3, 32, 32)
    return b.model(shape, out, opset, input_name="images", name=f"exported_net_op{opset}")


# --------------------------------------------------------------------------- random_cnn


def _out_size(size: int, k: int, stride: int, pad: int) -> int:
    return (size + 2 * pad - k) // stride + 1


def random_cnn(rng: np.random.Generator, n: int = 1) -> onnx.ModelProto:
    """A random small chain CNN (<= 10 layers, spatial <= 32, batch n) for property tests.

    Convs with kernels 1/3/5, strides 1/2 and random pads, max/average pools, Relu,
    BatchNormalization, and Add skip connections wherever an earlier tensor's shape matches.
    """
    b = _Builder(rng)
    c = int(rng.integers(1, 5))
    h, w = (int(v) for v in rng.integers(8, 33, size=2))
    shape = (c, h, w)
    x = "input"
    seen: dict[tuple[int, int, int], list[str]] = {shape: [x]}
    for _ in range(int(rng.integers(1, 11))):
        x, shape = _random_layer(b, rng, x, shape)
        if shape in seen and rng.random() < 0.5:
            x = b.one("Add", [x, seen[shape][int(rng.integers(len(seen[shape])))]])
        seen.setdefault(shape, []).append(x)
    return b.model((n, c, h, w), x, 13, name="random_cnn")


def _random_layer(b: _Builder, rng: np.random.Generator, x: str,
                  shape: tuple[int, int, int]) -> tuple[str, tuple[int, int, int]]:
    c, h, w = shape
    kind = rng.choice(["conv", "conv", "conv", "pool", "relu", "bn"])
    if kind == "relu":
        return b.one("Relu", [x]), shape
    if kind == "bn":
        return b.bn(x, c), shape
    k = int(rng.choice([1, 3, 5] if kind == "conv" else [2, 3]))
    stride = int(rng.choice([1, 2])) if min(h, w) >= 8 else 1
    pad = int(rng.integers(0, k // 2 + 1))
    if min(_out_size(h, k, stride, pad), _out_size(w, k, stride, pad)) < 1:
        k, stride, pad = 1, 1, 0
    out_hw = (_out_size(h, k, stride, pad), _out_size(w, k, stride, pad))
    if kind == "pool":
        op = str(rng.choice(["MaxPool", "AveragePool"]))
        y = b.one(op, [x], kernel_shape=[k, k], strides=[stride, stride], pads=[pad] * 4)
        return y, (c, *out_hw)
    cout = int(rng.choice([4, 8, 12, 16]))
    return b.conv(x, c, cout, k, stride, pad), (cout, *out_hw)


def detection_net(seed: int = 0, opset: int = 13) -> onnx.ModelProto:
    """A detection-style model over ``x`` [1, 3, H, W] with dynamic H and W (multiples of 4):
    a conv backbone down to 1/4, nearest upsampling back to 1/2, a concat with the 1/2 map and
    a conv head."""
    b = _Builder(np.random.default_rng(seed))
    c1 = b.one("Relu", [b.conv("x", 3, 8, 3, prefix="stem")])
    c2 = b.one("Relu", [b.conv(c1, 8, 16, 3, stride=2, prefix="down1")])
    c3 = b.one("Relu", [b.conv(c2, 16, 16, 3, stride=2, prefix="down2")])
    up = _upsample2(b, c3, opset)
    merged = b.one("Concat", [c2, up], axis=1)
    head = b.one("Relu", [b.conv(merged, 32, 8, 3, prefix="head")])
    out = b.conv(head, 8, 4, 1, prefix="pred")
    return b.model((1, 3, "H", "W"), out, opset, input_name="x", name="detection_net")


def _squeeze_excite(b: _Builder, x: str, c: int, scale_first: bool, opset: int) -> str:
    """x * HardSigmoid(Conv(Relu(Conv(GlobalAveragePool(x))))), the scale [N, C, 1, 1]
    broadcast over rows and columns; ``scale_first`` writes it as torchvision does,
    ``scale * x``, so the broadcast operand is the Mul's first input."""
    s = b.one("GlobalAveragePool", [x], "gap")
    s = b.one("Relu", [b.conv(s, c, max(4, c // 4), 1, prefix="se_reduce")])
    s = b.one("HardSigmoid", [b.conv(s, max(4, c // 4), c, 1, prefix="se_expand")],
              alpha=0.2, beta=0.5)
    return b.one("Mul", [s, x] if scale_first else [x, s], "se_scale")


def se_net(seed: int = 0, n: int = 1, h: int = 64, w: int = 64, blocks: int = 2,
           channels: int = 16, expand: int = 2, scale_first: bool = True,
           opset: int = 13) -> onnx.ModelProto:
    """MobileNetV3-style inverted residuals with squeeze-excite: a stem conv, then per block
    1x1 expand, ReLU, 3x3 depthwise, ReLU, squeeze-excite, 1x1 project and the residual add;
    a global pool and a classifier at the end."""
    b = _Builder(np.random.default_rng(seed))
    x = b.one("Relu", [b.conv("input", 3, channels, 3, prefix="stem")])
    wide = channels * expand
    for _ in range(blocks):
        y = b.one("Relu", [b.conv(x, channels, wide, 1, prefix="expand")])
        y = b.one("Relu", [b.conv(y, wide, wide, 3, group=wide, prefix="dw")])
        y = _squeeze_excite(b, y, wide, scale_first, opset)
        x = b.one("Add", [x, b.conv(y, wide, channels, 1, prefix="project")])
    x = b.one("Flatten", [b.one("GlobalAveragePool", [x], "head_pool")], axis=1)
    return b.model((n, 3, h, w), b.gemm(x, channels, 10), opset, name="se_net")


ROOT = Path(__file__).resolve().parent.parent


def edited_rules(folder: Path, edits: dict[str, str], name: str = "edited.yaml") -> Path:
    """rules/default.yaml with textual `edits` (old -> new, each present), written to
    ``folder/name``."""
    text = (ROOT / "rules" / "default.yaml").read_text()
    for old, new in edits.items():
        assert old in text, f"rules/default.yaml changed: update the edit of {old!r}"
        text = text.replace(old, new)
    path = folder / name
    path.write_text(text)
    return path


def rules_keeping_keys_in_sram(folder: Path) -> Path:
    """rules/default.yaml with `search.keys_spilled` and `search.keys_in_wram` off: where a
    test plans what a prefill does when kept keys must fit SRAM (a lone attention, streamed
    keys), neither spilled nor kept in WRAM."""
    return edited_rules(folder, {"keys_spilled: true": "keys_spilled: false",
                                 "keys_in_wram: true": "keys_in_wram: false"},
                        "keys_in_sram.yaml")


def fusing_rules(tmp: Path, edits: dict[str, str] | None = None) -> Path:
    """rules/default.yaml without the whole-network shortcut, whole-map groups of any length
    and block groups, with rule 19 binding whole maps too (small test nets fit on chip, and
    these tests need real group boundaries), plus textual ``edits`` (old -> new)."""
    text = (ROOT / "rules" / "default.yaml").read_text()
    for old, new in {"whole_network_first: true": "whole_network_first: false",
                     "long_whole_map_groups: true": "long_whole_map_groups: false",
                     "max_block_group_layers: 60": "max_block_group_layers: 0",
                     "applies_to: recompute}": "applies_to: all}",
                     **(edits or {})}.items():
        if old.startswith("whole_network_first") and old not in text:
            continue  # the shortcut is gone or off already
        assert old in text, f"rules/default.yaml changed: update this test's edit of {old!r}"
        text = text.replace(old, new)
    path = tmp / f"rules_{len(list(tmp.glob('rules_*.yaml')))}.yaml"
    path.write_text(text)
    return path


def convnext_net(seed: int = 0, n: int = 1, h: int = 32, w: int = 32, channels: int = 16,
                 blocks: int = 2, opset: int = 17) -> onnx.ModelProto:
    """ConvNeXt blocks as PyTorch exports them: depthwise 7x7, Transpose to channels last,
    LayerNormalization over the channels, Linear (MatMul + Add), Erf-GELU, Linear, a
    per-channel layer scale, Transpose back, residual add."""
    b = _Builder(np.random.default_rng(seed))
    x = b.conv("input", 3, channels, 4, stride=4, pad=0, prefix="stem")
    for _ in range(blocks):
        x = _convnext_block(b, x, channels)
    x = b.one("Flatten", [b.one("GlobalAveragePool", [x], "head_pool")], axis=1)
    return b.model((n, 3, h, w), b.gemm(x, channels, 10), opset, name="convnext_net")


def _convnext_block(b: _Builder, x: str, channels: int) -> str:
    """One ConvNeXt block over x (channels first), as PyTorch exports it."""
    y = b.conv(x, channels, channels, 7, group=channels, prefix="dw")
    y = b.one("Transpose", [y], "to_last", perm=[0, 2, 3, 1])
    scale = b.const("ln_s", b.rng.uniform(0.5, 1.5, channels).astype(np.float32))
    shift = b.const("ln_b", (0.1 * b.rng.standard_normal(channels)).astype(np.float32))
    y = b.one("LayerNormalization", [y, scale, shift], "ln", axis=-1, epsilon=1e-6)
    y = b.one("Add", [b.one("MatMul", [y, b.weight((channels, 4 * channels), channels)],
                            "pw1"), b.bias(4 * channels)])
    half = b.const("half", np.array(0.5, np.float32))
    root2 = b.const("sqrt2", np.array(np.sqrt(2.0), np.float32))
    one = b.const("one", np.array(1.0, np.float32))
    erf = b.one("Erf", [b.one("Div", [y, root2])])
    y = b.one("Mul", [b.one("Mul", [y, b.one("Add", [erf, one])]), half], "gelu")
    y = b.one("Add", [b.one("MatMul", [y, b.weight((4 * channels, channels), 4 * channels)],
                            "pw2"), b.bias(channels)])
    gamma = b.const("gamma", np.full(channels, 0.5, np.float32))
    y = b.one("Transpose", [b.one("Mul", [y, gamma], "layer_scale")], "to_first",
              perm=[0, 3, 1, 2])
    return b.one("Add", [x, y])


# --------------------------------------------------------------------------- random_modern_net


def random_modern_net(rng: np.random.Generator) -> onnx.ModelProto:
    """A random small network of today's blocks for property tests (opset 17).

    A stem conv, then two to four blocks drawn from: an inverted residual (MBConv: 1x1
    expand, 3x3 depthwise, strided or not, with or without squeeze-excite, 1x1 project,
    residual add when the shape is kept), a ConvNeXt block (channels last), ASPP (a 1x1
    branch, two dilated 3x3 branches and a global-pool branch resized back to the map,
    concatenated, 1x1), and an FPN (two strided convs, nearest upsampling added to 1x1
    laterals back to full resolution, concatenated with the input). One to three outputs:
    a 1x1 conv map at the end, a pooled classifier, and a map taken from mid-network.
    """
    b = _Builder(rng)
    n = int(rng.choice([1, 1, 2]))
    h0, w0 = (4 * int(v) for v in rng.integers(3, 9, size=2))
    h, w = h0, w0  # the map's size after the blocks so far
    c = int(rng.choice([4, 8]))
    x = b.one("Relu", [b.conv("input", 3, c, 3, prefix="stem")])
    outputs: list[str] = []
    for _ in range(int(rng.integers(2, 5))):
        kinds = ["mbconv", "convnext", "aspp"] + (["fpn"] if h % 4 == 0 and w % 4 == 0 else [])
        kind = str(rng.choice(kinds))
        if kind == "mbconv":
            stride = 2 if h % 2 == 0 and w % 2 == 0 and min(h, w) >= 16 and rng.random() < 0.4 \
                else 1
            x = _mbconv(b, x, c, int(rng.choice([c, 2 * c])), stride, bool(rng.random() < 0.6))
            if stride == 2:
                h, w = h // 2, w // 2
        elif kind == "convnext":
            x = _convnext_block(b, x, c)
        elif kind == "aspp":
            x = _aspp(b, x, c, n, h, w)
        else:
            x = _fpn(b, x, c)
        if not outputs and rng.random() < 0.3:  # a map leaving mid-network
            outputs.append(b.conv(x, c, 2, 1, prefix="side"))
    outputs.insert(0, b.conv(x, c, 3, 1, prefix="pred"))
    if rng.random() < 0.5:
        pooled = b.one("Flatten", [b.one("GlobalAveragePool", [x], "head_pool")], axis=1)
        outputs.append(b.gemm(pooled, c, 5))
    return b.model((n, 3, h0, w0), outputs, 17, name="random_modern_net")


def _mbconv(b: _Builder, x: str, c: int, wide: int, stride: int, se: bool) -> str:
    """Inverted residual: 1x1 expand, 3x3 depthwise (stride 1 or 2), optional squeeze-excite,
    1x1 project, residual add when stride is 1."""
    y = _hardswish(b, b.conv(x, c, wide, 1, prefix="expand"), 17)
    y = b.one("Relu", [b.conv(y, wide, wide, 3, stride=stride, group=wide, prefix="dw")])
    if se:
        y = _squeeze_excite(b, y, wide, bool(b.rng.random() < 0.5), 17)
    y = b.conv(y, wide, c, 1, prefix="project")
    return b.one("Add", [x, y]) if stride == 1 else y


def mbconv_net(seed: int = 0, n: int = 1, h: int = 32, w: int = 32, c: int = 8,
               wide: int = 48, strides: Sequence[int] = (1, 2, 1)) -> onnx.ModelProto:
    """Inverted residuals without squeeze-excite (MobileNetV2/V3 style): a stem conv, then
    per stride one block of 1x1 expand (HardSwish), 3x3 depthwise (Relu), 1x1 project."""
    b = _Builder(np.random.default_rng(seed))
    x = b.one("Relu", [b.conv("input", 3, c, 3, prefix="stem")])
    for stride in strides:
        x = _mbconv(b, x, c, wide, stride, se=False)
    return b.model((n, 3, h, w), x, 17, name="mbconv_net")


def _aspp(b: _Builder, x: str, c: int, n: int, h: int, w: int) -> str:
    """ASPP as DeepLabV3 heads write it: 1x1, 3x3 dilated by 2 and by 3, and a global pool
    branch resized (nearest) back to h x w; concatenated on channels, then a 1x1 conv."""
    branches = [b.one("Relu", [b.conv(x, c, c, 1, prefix="aspp1x1")]),
                b.one("Relu", [b.conv(x, c, c, 3, dilation=2, prefix="aspp_d2")]),
                b.one("Relu", [b.conv(x, c, c, 3, dilation=3, prefix="aspp_d3")])]
    pooled = b.one("Relu", [b.conv(b.one("GlobalAveragePool", [x], "aspp_pool"), c, c, 1,
                                   prefix="aspp_pool_conv")])
    sizes = _const_node(b, np.array([n, c, h, w], np.int64), "aspp_sizes")
    branches.append(b.one("Resize", [pooled, "", "", sizes], "aspp_up", mode="nearest"))
    merged = b.one("Concat", branches, axis=1)
    return b.one("Relu", [b.conv(merged, 4 * c, c, 1, prefix="aspp_proj")])


def _fpn(b: _Builder, x: str, c: int) -> str:
    """A two-level FPN over x: strided 3x3 convs down to 1/4, then nearest upsampling added
    to 1x1 laterals back to full resolution, concatenated with x and fused by a 1x1 conv."""
    d1 = b.one("Relu", [b.conv(x, c, c, 3, stride=2, prefix="fpn_down1")])
    d2 = b.one("Relu", [b.conv(d1, c, c, 3, stride=2, prefix="fpn_down2")])
    p1 = b.one("Add", [b.conv(d1, c, c, 1, prefix="fpn_lat1"), _upsample2(b, d2, 17)])
    p0 = b.one("Add", [b.conv(x, c, c, 1, prefix="fpn_lat0"), _upsample2(b, p1, 17)])
    return b.conv(b.one("Concat", [x, p0], axis=1), 2 * c, c, 1, prefix="fpn_out")


def _mlp_half(b: _Builder, y: str, width: int) -> str:
    """A pre-norm block's second half: LayerNorm, an MLP of 4C with ReLU, the residual."""
    g, beta = (b.const("ln", np.ones(width, np.float32)),
               b.const("ln", np.zeros(width, np.float32)))
    n = b.one("LayerNormalization", [y, g, beta], "ln", axis=-1)
    h = b.one("Relu", [b.one("MatMul", [n, b.weight((width, 4 * width), width)], "fc")])
    return b.one("Add", [b.one("MatMul", [h, b.weight((4 * width, width), 4 * width)], "fc"),
                         y], "residual")


def causal_encoder(tokens: int = 1024, width: int = 64, heads: int = 2, blocks: int = 1,
                   mask: str = "where", seed: int = 0) -> onnx.ModelProto:
    """A stack of GPT-2-like pre-norm blocks on [1, L, C] (a decoder's prefill): LayerNorm,
    one qkv projection split into heads (Reshape, Transpose, Split, Squeeze), q @ k^T,
    a scale, a causal mask (`mask`: "where" as GPT-2's export, "add" as an additive
    matrix, "none"), Softmax, p @ v, heads merged, out projection and residual, then
    LayerNorm, an MLP of 4C and residual."""
    b = _Builder(np.random.default_rng(seed))
    d = width // heads
    shape = [1, tokens, width]
    split_shape = b.const("shape", np.array([1, tokens, 3, heads, d], np.int64))
    merge_shape = b.const("shape", np.array(shape, np.int64))
    ones = b.const("sizes", np.array([1, 1, 1], np.int64))
    zero = b.const("axes", np.array([0], np.int64))
    scale = b.const("scale", np.array(d ** -0.5, np.float32))
    below = np.tri(tokens, tokens, dtype=bool)[None, None]
    cond = b.const("causal", below)
    fill = b.const("fill", np.array(-1e4, np.float32))
    additive = b.const("bias", np.where(below, 0.0, -1e4).astype(np.float32))
    x = "input"
    for _ in range(blocks):
        g, beta = (b.const("ln", np.ones(width, np.float32)),
                   b.const("ln", np.zeros(width, np.float32)))
        n = b.one("LayerNormalization", [x, g, beta], "ln", axis=-1)
        qkv = b.one("MatMul", [n, b.weight((width, 3 * width), width)], "qkv")
        heads5 = b.one("Transpose", [b.one("Reshape", [qkv, split_shape], "split_heads")],
                       "heads_first", perm=[2, 0, 3, 1, 4])
        q5, k5, v5 = b.node("Split", [heads5, ones], "split", n_out=3, axis=0)
        q, k, v = (b.one("Squeeze", [t, zero], "squeeze") for t in (q5, k5, v5))
        s = b.one("MatMul", [q, b.one("Transpose", [k], "k_t", perm=[0, 1, 3, 2])], "scores")
        s = b.one("Mul", [s, scale], "scale")
        if mask == "where":
            s = b.one("Where", [cond, s, fill], "mask")
        elif mask == "add":
            s = b.one("Add", [s, additive], "mask")
        p = b.one("Softmax", [s], "softmax", axis=-1)
        o = b.one("MatMul", [p, v], "mix")
        merged = b.one("Reshape", [b.one("Transpose", [o], "tokens_first", perm=[0, 2, 1, 3]),
                                   merge_shape], "merge_heads")
        y = b.one("Add", [b.one("MatMul", [merged, b.weight((width, width), width)], "proj"),
                          x], "residual")
        x = _mlp_half(b, y, width)
    return b.model(shape, x, 17, name=f"causal_encoder_{tokens}")


def batch_first_mha(batch: int = 4, tokens: int = 16, width: int = 32, heads: int = 4,
                    blocks: int = 1, seed: int = 0) -> onnx.ModelProto:
    """Encoder blocks whose attention is spelt as torchvision's nn.MultiheadAttention
    exports it at a batch above one (recent PyTorch): [B, L, C] sequence first, [L, B, C];
    each of q, k, v folded into the heads, Reshape [L, B*heads, d], Transpose [B*heads, L,
    d], Reshape [B, heads, L, d]; scaled q @ k^T, Softmax, p @ v; the heads back,
    Transpose [L, B, heads, d], folded into the tokens, Reshape [L*B, C], the output
    projection as a Gemm, Reshape [L, B, C], Transpose [B, L, C]; a residual and an MLP."""
    b = _Builder(np.random.default_rng(seed))
    d = width // heads
    fold_heads = b.const("shape", np.array([tokens, batch * heads, d], np.int64))
    unfold_heads = b.const("shape", np.array([batch, heads, tokens, d], np.int64))
    fold_tokens = b.const("shape", np.array([tokens * batch, width], np.int64))
    unfold_tokens = b.const("shape", np.array([tokens, batch, width], np.int64))
    scale = b.const("scale", np.array(d ** -0.25, np.float32))
    x = "input"
    for _ in range(blocks):
        g, beta = (b.const("ln", np.ones(width, np.float32)),
                   b.const("ln", np.zeros(width, np.float32)))
        n = b.one("LayerNormalization", [x, g, beta], "ln", axis=-1)
        seq = b.one("Transpose", [n], "seq_first", perm=[1, 0, 2])
        qkv = []
        for part in ("q", "k", "v"):
            p = b.one("Add", [b.one("MatMul", [seq, b.weight((width, width), width)], part),
                              b.bias(width)], f"{part}_bias")
            folded = b.one("Reshape", [p, fold_heads], f"{part}_fold")
            qkv.append(b.one("Reshape", [b.one("Transpose", [folded], f"{part}_heads",
                                               perm=[1, 0, 2]), unfold_heads],
                             f"{part}_unfold"))
        q, k, v = qkv
        kt = b.one("Transpose", [b.one("Mul", [k, scale], "k_scale")], "k_t", perm=[0, 1, 3, 2])
        s = b.one("MatMul", [b.one("Mul", [q, scale], "q_scale"), kt], "scores")
        o = b.one("MatMul", [b.one("Softmax", [s], "softmax", axis=-1), v], "mix")
        o = b.one("Reshape", [b.one("Transpose", [o], "tokens_first", perm=[2, 0, 1, 3]),
                              fold_tokens], "fold_tokens")
        o = b.one("Reshape", [b.gemm(o, width, width), unfold_tokens], "unfold_tokens")
        y = b.one("Add", [b.one("Transpose", [o], "batch_first", perm=[1, 0, 2]), x],
                  "residual")
        x = _mlp_half(b, y, width)
    return b.model([batch, tokens, width], x, 17, name="batch_first_mha")


def _rotary(b: _Builder, x: str, cos: str, sin: str, starts: tuple[str, ...]) -> str:
    """Llama's rotary embedding as exported: x cos + rotate_half(x) sin, rotate_half the
    two halves of the head width swapped, the first negated (Slice, Neg, Concat)."""
    lo, mid, hi, last = starts
    first = b.one("Slice", [x, lo, mid, last], "slice")
    second = b.one("Slice", [x, mid, hi, last], "slice")
    rotated = b.one("Concat", [b.one("Neg", [second], "neg"), first], "concat", axis=-1)
    return b.one("Add", [b.one("Mul", [x, cos], "mul"), b.one("Mul", [rotated, sin], "mul")],
                 "add")


def llama_attention(tokens: int = 512, width: int = 64, heads: int = 4, kv_heads: int = 2,
                    seed: int = 0) -> onnx.ModelProto:
    """A Llama-style attention half on [1, L, C] as its export spells it: LayerNorm, q, k
    and v as three Linears (k and v for `kv_heads` key heads), each split into heads
    (Reshape, Transpose), rotary embeddings on q and k written out, repeat_kv (Unsqueeze,
    Expand, Reshape), q @ k^T, a scale, Softmax, p @ v, the heads merged, the output
    projection and the residual."""
    b = _Builder(np.random.default_rng(seed))
    y = _llama_attention_half(b, "input", tokens, width, heads, kv_heads, causal=False)
    return b.model([1, tokens, width], y, 17, name=f"llama_attention_{tokens}")


def llama_decoder(tokens: int = 512, width: int = 64, heads: int = 4, kv_heads: int = 2,
                  hidden: int = 128, blocks: int = 1, seed: int = 0) -> onnx.ModelProto:
    """A stack of Llama-style decoder layers on [1, L, C] (a prefill): llama_attention's
    half with a causal mask (Where), then LayerNorm, a SwiGLU MLP of `hidden` channels (gate
    and up Linears, x sigmoid(x) on the gate, their product, the down Linear) and the
    residual. Its q, k and v are Linears of their own, so a whole layer may split over the
    clusters (planner.geometry.cluster_split)."""
    b = _Builder(np.random.default_rng(seed))
    x = "input"
    for _ in range(blocks):
        y = _llama_attention_half(b, x, tokens, width, heads, kv_heads, causal=True)
        g, beta = (b.const("ln", np.ones(width, np.float32)),
                   b.const("ln", np.zeros(width, np.float32)))
        n = b.one("LayerNormalization", [y, g, beta], "ln", axis=-1)
        gate = b.one("MatMul", [n, b.weight((width, hidden), width)], "gate_proj")
        gate = b.one("Mul", [gate, b.one("Sigmoid", [gate], "sigmoid")], "silu")
        up = b.one("MatMul", [n, b.weight((width, hidden), width)], "up_proj")
        down = b.one("MatMul", [b.one("Mul", [gate, up], "gated"),
                                b.weight((hidden, width), hidden)], "down_proj")
        x = b.one("Add", [down, y], "residual")
    return b.model([1, tokens, width], x, 17, name=f"llama_decoder_{tokens}")


def _llama_attention_half(b: _Builder, x: str, tokens: int, width: int, heads: int,
                          kv_heads: int, causal: bool) -> str:
    """llama_attention's layers from `x` to its residual add (`causal`: the scores masked
    past the diagonal, as a decoder's prefill)."""
    d, groups = width // heads, heads // kv_heads
    angles = np.arange(tokens)[:, None] * (1e-2 ** (np.arange(d) % (d // 2) / (d // 2)))
    cos = b.const("cos", np.cos(angles)[None, None].astype(np.float32))
    sin = b.const("sin", np.sin(angles)[None, None].astype(np.float32))
    starts = tuple(b.const(p, np.array([v], np.int64))
                   for p, v in (("start", 0), ("mid", d // 2), ("end", d), ("axes", -1)))
    scale = b.const("scale", np.array(d ** -0.5, np.float32))
    g, beta = (b.const("ln", np.ones(width, np.float32)),
               b.const("ln", np.zeros(width, np.float32)))
    n = b.one("LayerNormalization", [x, g, beta], "ln", axis=-1)
    parts = []
    for name, count in (("q_proj", heads), ("k_proj", kv_heads), ("v_proj", kv_heads)):
        p = b.one("MatMul", [n, b.weight((width, count * d), width)], name)
        split = b.const("shape", np.array([1, tokens, count, d], np.int64))
        parts.append(b.one("Transpose", [b.one("Reshape", [p, split], "reshape")],
                           "transpose", perm=[0, 2, 1, 3]))
    q, k, v = parts
    q, k = (_rotary(b, t, cos, sin, starts) for t in (q, k))
    axis2 = b.const("axes", np.array([2], np.int64))
    wide = b.const("shape", np.array([1, kv_heads, groups, tokens, d], np.int64))
    flat = b.const("shape", np.array([1, heads, tokens, d], np.int64))

    def repeat_kv(t: str) -> str:
        return b.one("Reshape", [b.one("Expand", [b.one("Unsqueeze", [t, axis2], "unsqueeze"),
                                                  wide], "expand"), flat], "reshape")

    kt = b.one("Transpose", [repeat_kv(k)], "k_t", perm=[0, 1, 3, 2])
    s = b.one("Mul", [b.one("MatMul", [q, kt], "scores"), scale], "scale")
    if causal:
        below = b.const("causal", np.tri(tokens, tokens, dtype=bool)[None, None])
        s = b.one("Where", [below, s, b.const("fill", np.array(-1e4, np.float32))], "mask")
    o = b.one("MatMul", [b.one("Softmax", [s], "softmax", axis=-1), repeat_kv(v)], "mix")
    merge = b.const("shape", np.array([1, tokens, width], np.int64))
    o = b.one("Reshape", [b.one("Transpose", [o], "tokens_first", perm=[0, 2, 1, 3]), merge],
              "merge_heads")
    return b.one("Add", [b.one("MatMul", [o, b.weight((width, width), width)], "o_proj"), x],
                 "residual")
