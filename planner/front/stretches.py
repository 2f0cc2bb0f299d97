"""Which tensors are token sequences, channels-last maps or 1-D sequences, found by
propagating what the ops say about their axes along the index maps.

Two axes of two tensors are the same axis of the model when an op reads one into the other
one element per element (its index map, planner.ir.index_maps: in place, shifted by a cut,
a pad or a join, or strided), or folds it into one element in its place (a keepdims
reduction); the axes of all tensors fall into such classes (a union-find). Ops then say
what a class is:

* a LayerNormalization over the last axis, or a Linear layer (a MatMul by a constant
  matrix), of a rank-3 tensor [B, L, C] works per position: axis 1 is a class of token
  positions; of a rank-4 tensor [B, H, W, C], axes 1 and 2 are rows and columns;
* a 1-D window (Conv1d, a 1-D pool) slides along axis 2 of its rank-3 input and output
  [N, C, L]: a class of lengths, and axis 1 is channels; a 2-D window slides along axes 2
  and 3 of its rank-4 input and output: rows and columns (a Transpose that moves them to
  axes 1 and 2 makes a channels-last map);
* BatchNormalization, InstanceNormalization, LRN, GroupNormalization and 2-D windows read
  axis 1 as channels, and so do channel-first reductions, global pools and resizes of a
  rank-4 map: that class is no token or row axis.

A rank-3 tensor whose axis 1 is of a token class (and not of a channel class) is [B, L, C]
tokens; one whose axis 2 is of a length class, and axis 1 not of a token class, is
[N, C, L]; a rank-4 tensor whose axes 1 and 2 are rows and columns (axis 1 not channels) is
channels last, [N, H, W, C]. Everything else keeps the layout its shape implies
(planner.ir.layout.layout_of), or the one a movement op carries to it
(planner.front.graph_build).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from fuseplan.planner.front.axes import node_index_maps
from fuseplan.planner.front.reductions import channels_last_reduction, reduced_axes
from fuseplan.planner.front.sliding import with_kernel_shape
from fuseplan.planner.ir.graph import IDENTITY, AxisMap, MapKind
from fuseplan.planner.ir.ops import Accumulate, MapRule, OpClass, OpSpec, op_spec

Shape = tuple[int, ...]
_Axis = tuple[str, int]  # (tensor, axis)

# ops that read axis 1 of a map as channels
_CHANNELS_FIRST_OPS = frozenset({"BatchNormalization", "InstanceNormalization", "LRN",
                                 "GroupNormalization"})


@dataclass
class _Classes:
    """A union-find over (tensor, axis) pairs."""

    parent: dict[Hashable, Hashable] = field(default_factory=dict)

    def find(self, x: Hashable) -> Hashable:
        """The root of x's class."""
        parent = self.parent
        parent.setdefault(x, x)
        root = x
        while parent[root] != root:
            root = parent[root]
        while parent[x] != root:  # path compression
            parent[x], x = root, parent[x]
        return root

    def join(self, a: Hashable, b: Hashable) -> None:
        """Make a's class and b's one."""
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[ra] = rb


@dataclass(frozen=True)
class Stretches:
    """The tensors each propagated layout holds."""

    tokens: frozenset[str]  # [B, L, C]
    lengths: frozenset[str]  # [N, C, L]
    channels_last: frozenset[str]  # [N, H, W, C]


def _per_position(spec: OpSpec, attrs: Mapping[str, Any], node: onnx.NodeProto,
                  fmap: Sequence[str], constants: Mapping[str, np.ndarray], rank: int) -> bool:
    """A LayerNormalization over the last axis, or a MatMul of one map by a constant matrix:
    the other axes are positions."""
    if spec.maps is MapRule.NORM:
        return int(attrs.get("axis", -1)) % rank == rank - 1
    return spec.maps is MapRule.LINEAR and len(fmap) == 1 and any(
        t in constants and constants[t].ndim == 2 for t in node.input[1:2])


def _reads_channels_first(node: onnx.NodeProto, spec: OpSpec, attrs: Mapping[str, Any],
                          constants: Mapping[str, np.ndarray], in_rank: int,
                          images: bool) -> bool:
    """Whether the op reads axis 1 of its maps as channels (`images`: of rank-4 maps, and
    their last two axes as rows and columns: reductions by the axes they fold of their
    rank-`in_rank` input, global pools, resizes)."""
    if node.op_type in _CHANNELS_FIRST_OPS or spec.sliding_window:
        return True
    if not images:
        return False
    if spec.maps is MapRule.REDUCE:
        return not channels_last_reduction(
            reduced_axes(attrs, node.input, constants, in_rank), in_rank)
    return spec.accumulate is not Accumulate.NONE or spec.maps is MapRule.UPSAMPLE


@dataclass
class _Evidence:
    """What the ops said of the axes: per role, the (tensor, axis) pairs."""

    tokens: list[_Axis] = field(default_factory=list)
    lengths: list[_Axis] = field(default_factory=list)
    rows: list[_Axis] = field(default_factory=list)  # rows and columns of channels-last maps
    channels: list[_Axis] = field(default_factory=list)  # rank 3: axis 1 read as channels
    channels4: list[_Axis] = field(default_factory=list)  # rank 4: the same
    spatial: list[_Axis] = field(default_factory=list)  # rows and columns a 2-D window slides

    def add(self, node: onnx.NodeProto, spec: OpSpec, attrs: Mapping[str, Any],
            fmap: Sequence[str], out: str, shapes: Mapping[str, Shape],
            constants: Mapping[str, np.ndarray]) -> None:
        """What one node says of the axes of its maps."""
        x = fmap[0] if fmap else None
        rank = len(shapes[x]) if x is not None else 0
        if x is not None and rank in (3, 4) \
                and _per_position(spec, attrs, node, fmap, constants, rank):
            if rank == 3:
                self.tokens.append((x, 1))
            else:
                self.rows += [(x, 1), (x, 2)]
        if x is not None and rank == 4 and spec.sliding_window:
            self.spatial += [(x, 2), (x, 3)] + ([(out, 2), (out, 3)]
                                                if len(shapes[out]) == 4 else [])
        if x is not None and rank == 3 and spec.sliding_window:
            self.lengths.append((x, 2))
            if len(shapes[out]) == 3:
                self.lengths.append((out, 2))
                self.channels.append((out, 1))
        if x is not None and rank == 3 and _reads_channels_first(node, spec, attrs,
                                                                 constants, rank, False):
            self.channels.append((x, 1))
        if _reads_channels_first(node, spec, attrs, constants, rank, True):
            self.channels4.extend((t, 1) for t in [*fmap, out] if len(shapes[t]) == 4)


def _join(classes: _Classes, node: onnx.NodeProto, spec: OpSpec,
          attrs: Mapping[str, Any], fmap: Sequence[str], out: str,
          shapes: Mapping[str, Shape], constants: Mapping[str, np.ndarray],
          opset: int) -> None:
    """Join each output axis with the input axis it reads one element per element: in
    place, at an offset (a cut, a pad, a join along it), or every few (a strided cut); and a
    keepdims reduction's pooled axis with the axis it folds (it keeps its place)."""
    out_shape = shapes[out]
    maps = node_index_maps(spec, attrs, node.input, constants, shapes, out_shape, opset)
    folds = spec.maps is MapRule.REDUCE or spec.accumulate is not Accumulate.NONE
    for t, im in zip(fmap, maps, strict=True):
        for o, read in enumerate(im.reads):
            if read is not None and (_one_to_one(read.map) or folds and out_shape[o] == 1):
                classes.join((out, o), (t, read.axis))


def _one_to_one(m: AxisMap) -> bool:
    """Each output index reads one input index: in place, shifted, or strided."""
    return m == IDENTITY or m.kind is MapKind.OFFSET \
        or (m.kind is MapKind.WINDOW and m.kernel == 1)


def find_stretches(nodes: Sequence[onnx.NodeProto], shapes: Mapping[str, Shape],
                   constants: Mapping[str, np.ndarray], opset: int,
                   attrs_of: Callable[[onnx.NodeProto], dict[str, Any]]) -> Stretches:
    """Token sequences, 1-D sequences and channels-last maps of a model, by propagation
    (`attrs_of`: a node's attributes as plain values, planner.front.graph_build.node_attrs)."""
    classes = _Classes()
    said = _Evidence()
    ranked: set[str] = set()
    for node in nodes:
        spec = op_spec(node.op_type)
        if spec.op_class is OpClass.OPAQUE or not node.output or node.output[0] not in shapes:
            continue
        out = node.output[0]
        w_shape = shapes.get(node.input[1]) if len(node.input) > 1 and node.input[1] else None
        attrs = with_kernel_shape(spec, attrs_of(node), w_shape)
        fmap = [t for t in node.input if t and t not in constants]
        if any(t not in shapes for t in fmap):
            continue
        _join(classes, node, spec, attrs, fmap, out, shapes, constants, opset)
        ranked.update(t for t in [*fmap, out] if len(shapes[t]) in (3, 4))
        said.add(node, spec, attrs, fmap, out, shapes, constants)
    return _decide(classes, said, ranked, shapes)


def _decide(classes: _Classes, said: _Evidence, ranked: set[str],
            shapes: Mapping[str, Shape]) -> Stretches:
    """Each rank-3 and rank-4 tensor's layout by the classes of its axes."""

    def roots(found: list[_Axis]) -> set[Hashable]:
        return {classes.find(a) for a in found}

    token, length = roots(said.tokens), roots(said.lengths)
    row = roots(said.rows) | roots(said.spatial)
    channel, channel4 = roots(said.channels), roots(said.channels4)
    tok, seq, last = set(), set(), set()
    for t in ranked:
        position = classes.find((t, 1))
        if len(shapes[t]) == 3:
            if position in token and position not in channel:
                tok.add(t)
            elif classes.find((t, 2)) in length and position not in token:
                seq.add(t)
        elif position in row and classes.find((t, 2)) in row and position not in channel4:
            last.add(t)
    return Stretches(frozenset(tok), frozenset(seq), frozenset(last))
