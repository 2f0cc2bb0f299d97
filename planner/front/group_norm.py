"""Group and instance normalisations split into their statistics and their normalising step.

PyTorch exports ``GroupNorm(G, C)`` as ``Reshape [N, C, *S] -> [N, G, K]``, an
``InstanceNormalization`` over ``K = (C/G) * prod(S)`` and a ``Reshape`` back (the affine
``Mul``/``Add`` follow); opset 18 and later may carry a ``GroupNormalization`` node, and an
``InstanceNormalization`` of a map is the case of one group per channel. Each group's
statistics read its whole map, and the merged ``[N, G, K]`` view ties
channels to positions, so no tile of rows could ever be normalised alone: the layer needed
its whole map on chip, and a latent-diffusion UNet at 64x64 had no plan.

Written over the map itself the same arithmetic is two reductions over rows and columns and
elementwise steps, each of which the planner tiles (the reductions as the passes of
planner.geometry.passes, the way a squeeze-excite pool runs)::

    m_c = ReduceMean(x, spatial)             per channel, [N, C, 1, 1]
    m   = group mean of m_c, per channel     a 1x1 Conv in G groups, weights G/C
    d   = x - m
    v_c = ReduceMean(d * d, spatial)
    v   = group mean of v_c + epsilon        the same Conv, epsilon its bias
    y   = d / Sqrt(v)  (* scale + bias, per channel, where not 1 and 0)

Every group has C/G channels of equal size, so the mean of the channel means is the group
mean and the mean of the channel variances about it is the group variance: the same
numbers as the fused op, up to rounding (the variance about the mean, never E[x^2] - m^2).
The last step's output keeps the original output's name, so everything after it and the
model's outputs are unchanged. The averaging weights and the epsilon are marked
(:data:`MADE_CONSTANT`) so that verification's random weights leave them alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper

from fuseplan.planner.front.work import _static_shape, _Work

__all__ = ["MADE_CONSTANT", "split_group_norms"]

# doc_string of an initializer that is not a weight: one the loader made (an epsilon), or
# one the model computes from shapes (a causal mask; planner.front.onnx_load)
MADE_CONSTANT = "fuseplan: made by the loader, not a weight"


@dataclass(frozen=True)
class _Norm:
    """One group normalisation found in the graph."""

    nodes: tuple[onnx.NodeProto, ...]  # the nodes it replaces
    x: str  # its input map [N, C, *S]
    y: str  # its output, same shape
    shape: tuple[int, ...]
    groups: int
    epsilon: float
    scale: np.ndarray | None  # per channel, None where all ones
    bias: np.ndarray | None  # per channel, None where all zeros


def split_group_norms(work: _Work, types: Mapping[str, onnx.TypeProto], opset: int
                      ) -> set[str]:
    """Replace each group normalisation of ``work`` by its two-pass form (module docstring);
    return the names of the constants made that are not weights (to be marked
    MADE_CONSTANT)."""
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in work.nodes:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    producer = {o: node for node in work.nodes for o in node.output}
    found = [n for n in (_norm_of(node, work, types, readers, producer) for node in work.nodes)
             if n is not None]
    made: set[str] = set()
    for norm in found:
        at = min(work.nodes.index(n) for n in norm.nodes)
        for n in norm.nodes:
            work.nodes.remove(n)
        new, fixed = _two_pass(norm, work, opset, _dtype(norm.x, work, types))
        work.nodes[at:at] = new
        made |= fixed
    return made


def _type_of(name: str, work: _Work, types: Mapping[str, onnx.TypeProto]
             ) -> onnx.TypeProto | None:
    """A tensor's type: inferred, or as declared where it is a graph input."""
    given = work.inputs.get(name)
    return types.get(name, given.type if given else None)


def _dtype(name: str, work: _Work, types: Mapping[str, onnx.TypeProto]) -> np.dtype:
    """The element type of a float map (float32 where the types do not say)."""
    tp = _type_of(name, work, types)
    elem = tp.tensor_type.elem_type if tp is not None and tp.HasField("tensor_type") else 0
    return np.dtype(helper.tensor_dtype_to_np_dtype(elem) if elem else np.float32)


def _norm_of(node: onnx.NodeProto, work: _Work, types: Mapping[str, onnx.TypeProto],
             readers: Mapping[str, list[onnx.NodeProto]],
             producer: Mapping[str, onnx.NodeProto]) -> _Norm | None:
    """The group normalisation `node` is the core of, or None."""
    if node.domain not in ("", "ai.onnx"):
        return None
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if node.op_type == "GroupNormalization":
        return _group_normalization(node, attrs, work, types)
    if node.op_type != "InstanceNormalization" or len(node.input) < 3:
        return None
    first = producer.get(node.input[0])
    after = readers.get(node.output[0], [])
    if first is None or first.op_type != "Reshape" or len(after) != 1 \
            or after[0].op_type != "Reshape" or len(readers.get(node.input[0], [])) != 1:
        return _instance_norm(node, attrs, work, types)
    last = after[0]
    x, y = first.input[0], last.output[0]
    shape = _static_shape(types.get(x))
    merged = _static_shape(types.get(node.input[0]))
    if shape is None or merged is None or len(shape) < 3 or len(merged) != 3 \
            or _static_shape(types.get(y)) != shape or merged[0] != shape[0]:
        return None
    groups, channels = merged[1], shape[1]
    if channels % groups or merged[2] * groups != int(np.prod(shape[1:])):
        return None
    per_group = _constants(work, node.input[1:3], groups)
    if per_group is None:
        return None
    scale, bias = (np.repeat(v, channels // groups) for v in per_group)
    return _Norm((first, node, last), x, y, shape, groups, float(attrs.get("epsilon", 1e-5)),
                 None if np.all(scale == 1) else scale, None if np.all(bias == 0) else bias)


def _instance_norm(node: onnx.NodeProto, attrs: Mapping[str, object], work: _Work,
                   types: Mapping[str, onnx.TypeProto]) -> _Norm | None:
    """An InstanceNormalization of a map [N, C, *S] of its own: a group per channel."""
    shape = _static_shape(_type_of(node.input[0], work, types))
    if shape is None or len(shape) < 3:
        return None
    values = _constants(work, node.input[1:3], shape[1])
    if values is None:
        return None
    scale, bias = values
    return _Norm((node,), node.input[0], node.output[0], shape, shape[1],
                 float(attrs.get("epsilon", 1e-5)),  # type: ignore[arg-type]
                 None if np.all(scale == 1) else scale, None if np.all(bias == 0) else bias)


def _group_normalization(node: onnx.NodeProto, attrs: Mapping[str, object], work: _Work,
                         types: Mapping[str, onnx.TypeProto]) -> _Norm | None:
    """A GroupNormalization node (opset 18: scale and bias per group; 21: per channel)."""
    shape = _static_shape(_type_of(node.input[0], work, types))
    groups = attrs.get("num_groups")
    if shape is None or len(shape) < 3 or not isinstance(groups, int) or groups < 1 \
            or shape[1] % groups or len(node.input) < 3:
        return None
    channels = shape[1]
    values = _constants(work, node.input[1:3], None)
    if values is None or any(v.size not in (groups, channels) for v in values):
        return None
    scale, bias = (np.repeat(v, channels // v.size) for v in values)
    return _Norm((node,), node.input[0], node.output[0], shape, groups,
                 float(attrs.get("epsilon", 1e-5)),  # type: ignore[arg-type]
                 None if np.all(scale == 1) else scale, None if np.all(bias == 0) else bias)


def _constants(work: _Work, names: Sequence[str], size: int | None
               ) -> tuple[np.ndarray, np.ndarray] | None:
    """The flattened float values of two constant inputs (of `size` elements if given)."""
    out = []
    for name in names:
        if not name or not work.is_const(name):
            return None
        value = np.asarray(work.value(name)).reshape(-1)
        if value.dtype.kind != "f" or (size is not None and value.size != size):
            return None
        out.append(value)
    return out[0], out[1]


class _Builder:
    """Nodes and constants of one replacement, named after the output they make."""

    def __init__(self, norm: _Norm, work: _Work, opset: int, dtype: np.dtype) -> None:
        self.norm, self.work, self.opset, self.dtype = norm, work, opset, dtype
        self.nodes: list[onnx.NodeProto] = []
        self.fixed: set[str] = set()
        self.base = norm.y

    def const(self, tag: str, value: np.ndarray) -> str:
        name = f"{self.base}/{tag}:const"  # never a node's output name
        self.work.folded[name] = value
        return name

    def node(self, op: str, inputs: Sequence[str], tag: str, out: str | None = None,
             **attrs: int | list[int]) -> str:
        output = out or f"{self.base}/{tag}"
        node = helper.make_node(op, list(inputs), [output], name=f"{self.base}/{tag}")
        node.attribute.extend(helper.make_attribute(k, v) for k, v in attrs.items())
        self.nodes.append(node)
        return output

    def mean(self, x: str, axes: Sequence[int], tag: str) -> str:
        """ReduceMean keeping dims, in the form of the model's opset."""
        if self.opset >= 18:
            axes_name = self.const(f"{tag}_axes", np.array(axes, np.int64))
            return self.node("ReduceMean", [x, axes_name], tag, keepdims=1)
        return self.node("ReduceMean", [x], tag, axes=list(axes), keepdims=1)

    def group_mean(self, per_channel: str, tag: str, plus: float | None = None) -> str:
        """Each channel's group mean of a per-channel [N, C, 1, ...] vector (+ `plus`): a
        1x1 convolution in G groups whose weights average the C/G channels of each."""
        c, g, spatial = self.norm.shape[1], self.norm.groups, len(self.norm.shape) - 2
        if g == c:
            if plus is None:
                return per_channel
            return self.node("Add", [per_channel, self.made(
                f"{tag}_plus", np.array(plus, self.dtype))], f"{tag}_plus")
        weight = self.made(f"{tag}_weight",
                           np.full((c, c // g, *[1] * spatial), g / c, self.dtype))
        inputs = [per_channel, weight]
        if plus is not None:
            inputs.append(self.made(f"{tag}_plus", np.full(c, plus, self.dtype)))
        return self.node("Conv", inputs, tag, group=g, kernel_shape=[1] * spatial)

    def made(self, tag: str, value: np.ndarray) -> str:
        """A constant that is not a weight (marked MADE_CONSTANT when the model is written)."""
        name = self.const(tag, value)
        self.fixed.add(name)
        return name


def _two_pass(norm: _Norm, work: _Work, opset: int, dtype: np.dtype
              ) -> tuple[list[onnx.NodeProto], set[str]]:
    """The replacement nodes of one normalisation (its constants of the map's element type),
    and the names of the constants it made that are not weights."""
    b = _Builder(norm, work, opset, dtype)
    spatial = list(range(2, len(norm.shape)))
    mean = b.group_mean(b.mean(norm.x, spatial, "mean_c"), "mean")
    d = b.node("Sub", [norm.x, mean], "centred")
    var = b.group_mean(b.mean(b.node("Mul", [d, d], "square"), spatial, "var_c"), "var_eps",
                       plus=norm.epsilon)
    std = b.node("Sqrt", [var], "std")
    steps: list[tuple[str, np.ndarray, str]] = []
    if norm.scale is not None:
        steps.append(("Mul", norm.scale, "scaled"))
    if norm.bias is not None:
        steps.append(("Add", norm.bias, "shifted"))
    y = b.node("Div", [d, std], "normalised", out=None if steps else norm.y)
    per_channel = [1, norm.shape[1], *[1] * len(spatial)]
    for k, (op, value, tag) in enumerate(steps):
        y = b.node(op, [y, b.const(f"{tag}_c", value.astype(dtype).reshape(per_channel))],
                   tag, out=norm.y if k == len(steps) - 1 else None)
    return b.nodes, b.fixed
