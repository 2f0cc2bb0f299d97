"""A batch folded into a neighbouring axis, restated as an axis of its own.

A Reshape that merges a tensor's batch axis (of any layout) with an axis beside it leaves
no box of images in its output: a merged axis holds the images outermost or innermost, and
`planner.ir.layout.regrouped_layout` carries no batch there. PyTorch's
nn.MultiheadAttention does this at a batch above one: it runs sequence first, [L, B, C],
folds the images into the heads, [L, B*heads, d] and then [B*heads, L, d], and into the
tokens, [L*B, C], before the output projection. Without a batch axis, every layer between
needs all images whole.

A Reshape keeps the row-major order of the elements, so the common refinement of its two
shapes (`finer_shape`: every axis boundary of both, the shape tinygrad's views index
through) holds the batch and the rows as axes of their own: [L, B, heads, d],
[B, heads, L, d], [L, B, C]. This pass restates such tensors in that finer shape, the same
elements in the same order (the same bytes), and the layers between accordingly, by what
their index maps allow: a Transpose permutes the finer axes, a Linear layer (Gemm or
MatMul by a constant) contracts the same last axis, a per-element layer with a scalar or
per-channel constant keeps the shape, and a Reshape reads the finer shape as it read the
coarse one. A restatement is made only where every layer reading a restated tensor is one
of those, and none is a model output, so the model's outputs and every byte count are the
original graph's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from math import prod

import numpy as np
import onnx
from onnx import helper

from fuseplan.planner.ir.index_maps import regrouped
from fuseplan.planner.ir.layout import Layout, carried, layout_of
from fuseplan.planner.ir.ops import AxisMove, MapRule, OpClass, OpSpec, ShapeParam, op_spec

Shape = tuple[int, ...]


def finer_shape(in_shape: Shape, out_shape: Shape, keep: Sequence[int]) -> Shape | None:
    """`out_shape` split further so that each input axis in `keep` lands whole on an axis of
    its own (a Reshape's output read in row-major order); None where the splits do not
    nest (an output axis that would need a fraction of a kept axis), a kept axis would be
    cut in two, or an axis of one would leave no trace among them."""
    if 1 in out_shape or any(in_shape[a] == 1 for a in keep):
        return None

    def prefixes(shape: Sequence[int]) -> list[int]:
        return [prod(shape[:i]) for i in range(len(shape) + 1)]

    cuts = set(prefixes(out_shape))
    for axis in keep:
        cuts |= {prod(in_shape[:axis]), prod(in_shape[:axis + 1])}
    ordered = sorted(cuts)
    if any(b % a for a, b in zip(ordered, ordered[1:], strict=False)):
        return None
    for axis in keep:  # no output axis may end inside a kept axis
        lo, hi = prod(in_shape[:axis]), prod(in_shape[:axis + 1])
        if any(lo < c < hi for c in ordered):
            return None
    return tuple(b // a for a, b in zip(ordered, ordered[1:], strict=False))


def axis_groups(coarse: Shape, fine: Shape) -> list[tuple[int, ...]] | None:
    """Which consecutive axes of `fine` make up each axis of `coarse` (same elements in
    row-major order), None where they do not line up (or an axis of one makes it
    ambiguous)."""
    if 1 in coarse or 1 in fine:
        return None
    groups: list[tuple[int, ...]] = []
    i = 0
    for extent in coarse:
        start, size = i, 1
        while i < len(fine) and size < extent:
            size *= fine[i]
            i += 1
        if size != extent:
            return None
        groups.append(tuple(range(start, i)))
    return groups if i == len(fine) else None


class BatchRestatement:
    """Restates the tensors of a node list as the graph builder reaches them (restate).

    `shapes` is the builder's own map: restated tensors get their finer shape there."""

    def __init__(self, nodes: Sequence[onnx.NodeProto], shapes: dict[str, Shape],
                 constants: Mapping[str, np.ndarray], outputs: Sequence[str]) -> None:
        self.shapes = shapes
        self.constants = constants
        self.outputs = frozenset(outputs)
        self.original: dict[str, Shape] = {}  # restated tensor -> its shape in the model
        self.readers: dict[str, list[onnx.NodeProto]] = {}
        for n in nodes:
            for t in dict.fromkeys(n.input):
                if t:
                    self.readers.setdefault(t, []).append(n)

    def restate(self, node: onnx.NodeProto, layouts: Mapping[str, Layout]) -> onnx.NodeProto:
        """The node as the builder should read it: a Transpose of a restated tensor permutes
        its finer axes; its outputs' shapes restated where their input was, or where a
        Reshape would fold the batch of its first input away (`layouts`: the builder's
        layouts so far, the shape's where it has none)."""
        fmap = [t for t in node.input if t and t not in self.constants]
        if not fmap or not node.output or not node.output[0]:
            return node
        x = fmap[0]
        if x in self.original:  # the input is restated: follow it
            step = self._follow(node, x, self.shapes[x])
            if step is not None and step.shape is not None:
                self._set(node.output[0], step.shape)
                return node if step.perm is None else _with_perm(node, step.perm)
        self._fold(node, x, layouts.get(x) or layout_of(self.shapes[x]))
        return node

    def _fold(self, node: onnx.NodeProto, x: str, in_layout: Layout) -> None:
        """A Reshape folding the batch of its input `x` away: its output restated with the
        batch (and the tokens) on axes of their own, where every reader can follow."""
        spec = op_spec(node.op_type)
        out = node.output[0]
        if not _reshape(spec) or in_layout.batch_axis is None or in_layout.row_axis is None:
            return
        in_shape, out_shape = self.shapes[x], self.shapes[out]
        if in_shape[in_layout.batch_axis] == 1 \
                or carried(in_layout, in_shape, out_shape,
                           regrouped(in_shape, out_shape).lands) is not None:
            return
        fine = finer_shape(in_shape, out_shape, (in_layout.batch_axis, in_layout.row_axis))
        if fine is not None and fine != out_shape and self._followed(out, fine):
            self._set(out, fine)

    def _set(self, tensor: str, shape: Shape) -> None:
        self.original.setdefault(tensor, self.shapes[tensor])
        self.shapes[tensor] = shape

    def _followed(self, tensor: str, fine: Shape) -> bool:
        """Whether every layer reading `tensor` restated as `fine` can follow it, and so on
        downstream until Reshapes take the tensors back."""
        if tensor in self.outputs:
            return False
        for reader in self.readers.get(tensor, ()):
            step = self._follow(reader, tensor, fine)
            if step is None:
                return False
            if step.shape is not None and not self._followed(reader.output[0], step.shape):
                return False
        return True

    def _follow(self, node: onnx.NodeProto, tensor: str, fine: Shape) -> _Step | None:
        """What a reader of `tensor` (restated as `fine`) makes of it, None where it cannot
        follow."""
        spec = op_spec(node.op_type)
        coarse = self.original.get(tensor, self.shapes[tensor])
        others = [t for t in node.input if t and t != tensor]
        if len(node.output) != 1:
            return None
        if _reshape(spec) and node.input[0] == tensor:
            return _Step(None)  # it reads the finer shape as it read the coarse one
        if node.op_type == "Transpose":
            return _transposed(node, coarse, fine)
        # the layers below keep the last axis where it was: it must be the model's own
        if not all(t in self.constants for t in others) or fine[-1] != coarse[-1]:
            return None
        if self._linear(node, spec, tensor, others):
            return _Step((*fine[:-1], self.shapes[node.output[0]][-1]))
        if self._per_element(spec, others, fine[-1]):
            return _Step(fine)  # per element, its constants scalars or per channel
        return None

    def _linear(self, node: onnx.NodeProto, spec: OpSpec, tensor: str,
                others: Sequence[str]) -> bool:
        """Whether the node multiplies `tensor` by a constant matrix over its last axis (a
        Linear layer, Gemm or MatMul, with `tensor` untransposed on the left)."""
        return spec.maps is MapRule.LINEAR and node.input[0] == tensor and bool(others) \
            and self.constants[others[0]].ndim == 2 \
            and not any(a.name == "transA" and helper.get_attribute_value(a)
                        for a in node.attribute)

    def _per_element(self, spec: OpSpec, others: Sequence[str], channels: int) -> bool:
        """Whether the node works per element, each constant it reads a scalar or one value
        per channel (of the last axis)."""
        return spec.channel_local and spec.axis_move is AxisMove.NONE \
            and spec.op_class is OpClass.VECTOR \
            and all(self.constants[t].ndim <= 1 and self.constants[t].size in (1, channels)
                    for t in others)


def _reshape(spec: OpSpec) -> bool:
    """A Reshape: it spells its output shape out, so it reads any shape of the same elements
    alike (a Flatten's axis counts the axes of the shape it is given: not so)."""
    return spec.axis_move is AxisMove.REGROUP and spec.shape_param is ShapeParam.TARGET_SHAPE


def _transposed(node: onnx.NodeProto, coarse: Shape, fine: Shape) -> _Step | None:
    """What a Transpose of a tensor restated from `coarse` as `fine` makes of it: the same
    permutation of the groups of finer axes that make up each coarse axis."""
    groups = axis_groups(coarse, fine)
    if groups is None:
        return None
    perm = [int(p) for p in next((helper.get_attribute_value(a) for a in node.attribute
                                  if a.name == "perm"), range(len(coarse))[::-1])]
    fine_perm = tuple(a for p in perm for a in groups[p])
    return _Step(tuple(fine[a] for a in fine_perm), fine_perm)


@dataclass(frozen=True)
class _Step:
    """What a reader makes of a restated tensor: its output's finer shape (None: a Reshape,
    whose output keeps its own), and a Transpose's permutation of the finer axes."""

    shape: Shape | None
    perm: tuple[int, ...] | None = None


def _with_perm(node: onnx.NodeProto, perm: tuple[int, ...]) -> onnx.NodeProto:
    """The Transpose with another permutation (same name, inputs and outputs)."""
    return helper.make_node("Transpose", list(node.input), list(node.output), name=node.name,
                            perm=list(perm))
