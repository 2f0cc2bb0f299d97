"""Head chunks: attention run a few heads at a time, as hidden chunks whose units are heads.

A transformer's attention has the hidden-chunk shape of its MLP (planner.geometry.hidden):
a Linear widening the tokens' channels (the qkv projection), layers computing each head from
the same head of their inputs (bias, the reshapes and transposes into heads, `q @ k^T`,
softmax, `p @ v`, back to tokens), and a Linear summing over the heads' channels (the output
projection). Cut the heads into chunks and the scores of a chunk's heads are all of the
attention matrix ever on chip at once: each head's queries, keys, values and scores exist
for one chunk at a time, the projection adds each chunk's partial sums into its output.

What makes heads harder than MLP channels is that a head's channels are not one contiguous
range of one axis everywhere: the qkv projection's output holds q, k and v side by side (a
head is three runs of d channels), reshapes split and merge axes, transposes move the heads
axis. A `Cut` says where the units (heads) sit in one tensor or constant: its `axis`,
viewed as (outer, units, inner) in row-major order; a chunk of units [lo, hi) is
[:, lo:hi, :] of that view (qkv's output: outer 3, units 12, inner 64). Cuts follow the
layers by the op table (per-element ops, reshapes by the row-major order they keep,
transposes by their permutation, gathers along other axes, softmax and layer norm along
other axes, products of two maps batched over the heads); the widening layer's split into
(outer, units, inner) is the one with the most units that every layer of the stretch
keeps.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from math import prod

import numpy as np

from fuseplan.planner.ir.chunks import chunk_axes
from fuseplan.planner.ir.graph import Graph, Layer
from fuseplan.planner.ir.layout import LayoutKind
from fuseplan.planner.ir.ops import AxisMove, MapRule, OpSpec, op_spec

Shape = tuple[int, ...]


@dataclass(frozen=True)
class Cut:
    """Where a stretch's units sit along one axis of a tensor: the axis viewed as (outer,
    units, inner) in row-major order. Cut(axis) is a plain channel axis (one unit per
    channel)."""

    axis: int
    outer: int = 1
    inner: int = 1

    def units(self, shape: Sequence[int]) -> int:
        """Units along the axis of an array of this shape."""
        return int(shape[self.axis]) // (self.outer * self.inner)

    def chunk_shape(self, shape: Sequence[int], width: int) -> Shape:
        """The shape of a chunk of `width` units of an array of this (whole) shape."""
        out = [int(d) for d in shape]
        out[self.axis] = self.outer * width * self.inner
        return tuple(out)


def take_units(arr: np.ndarray, cut: Cut, lo: int, hi: int) -> np.ndarray:
    """Units [lo, hi) of an array along its cut (a view where the units are contiguous)."""
    a = cut.axis
    if cut.outer == 1:
        index = [slice(None)] * arr.ndim
        index[a] = slice(lo * cut.inner, hi * cut.inner)
        return arr[tuple(index)]
    shape = arr.shape
    units = cut.units(shape)
    view = arr.reshape((*shape[:a], cut.outer, units, cut.inner, *shape[a + 1:]))
    index = [slice(None)] * view.ndim
    index[a + 1] = slice(lo, hi)
    return view[tuple(index)].reshape(cut.chunk_shape(shape, hi - lo))


@dataclass(frozen=True)
class HeadWalk:
    """A head stretch found from its widening layer (before the group's own checks)."""

    mids: tuple[str, ...]
    narrow: str
    units: int
    hidden: tuple[str, ...]  # the widening layer's and the mids' outputs
    cuts: Mapping[str, Cut]  # every hidden tensor's and every cut constant's


def head_walk(graph: Graph, order: Sequence[str], k: int) -> HeadWalk | None:
    """The head stretch starting at layer `order[k]` (a Linear over token channels) and
    running over the consecutive layers of `order`, or None. Among the splits of the
    widening layer's output channels into (outer, units, inner) that every layer keeps,
    the one with the most units."""
    widen = graph.layer(order[k])
    split = chunk_axes(graph, widen)
    outs = [t for t in widen.outputs if t]
    if split is None or len(outs) != 1:
        return None
    out = outs[0]
    if graph.layout(out).kind not in (LayoutKind.TOKENS, LayoutKind.SEQUENCE):
        return None  # images keep their channels on one axis: plain hidden chunks
    chain = _chain(graph, order, k)
    if chain is None:
        return None
    # the same chain from the same layer is walked for every group holding it
    key = ("head_walk", widen.name, chain)
    if key not in graph.derived:
        walked = _walk(graph, widen, out, split, chain)
        graph.derived[key] = None if isinstance(walked, HeadWalk) \
            and _units_on_tiled_axis(graph, walked) else walked
    found = graph.derived[key]
    return found if isinstance(found, HeadWalk) else None


def _units_on_tiled_axis(graph: Graph, walk: HeadWalk) -> bool:
    """Whether some map of the stretch holds its heads along an axis tiles cut (its rows
    or columns: windows put back into an image, heads and width merged into the image's
    last axis): a chunk of heads would be a part of that axis, which the tiles' boxes
    take whole, so no box says which part a chunk is."""
    return any(cut.axis in graph.layout(t).tiled_axes for t, cut in walk.cuts.items()
               if t in graph.producer and t in graph.shapes)


def sibling(graph: Graph, widen: Layer, lay: Layer) -> bool:
    """Whether `lay` widens beside the widening layer: the same op on the same maps, its
    output of the same shape but for its channels, its weights split along its output
    channels. An attention's q, k and v projections exported as three Linears (Whisper,
    diffusers, Llama) are a widening layer and two siblings: each chunk of heads computes
    its slice of all three; with grouped-query heads k and v are narrower than q, and a
    unit is a key head with the query heads that read it."""
    if lay is widen or lay.op != widen.op or lay.fmap_inputs != widen.fmap_inputs \
            or len(lay.outputs) != 1 or lay.outputs[0] not in graph.shapes \
            or chunk_axes(graph, lay) is None:
        return False
    mine, theirs = graph.shapes[lay.outputs[0]], graph.shapes[widen.outputs[0]]
    axis = op_spec(widen.op).chunk_out_axis % len(theirs)
    return len(mine) == len(theirs) and all(
        a == b for i, (a, b) in enumerate(zip(mine, theirs, strict=True)) if i != axis)


def _chain(graph: Graph, order: Sequence[str], k: int) -> tuple[str, ...] | None:
    """The layers after `order[k]` up to the first that sums over a hidden map (the
    narrowing layer, last), each reading a hidden map (or a sibling of the widening layer)
    with all its outputs named; None when the run breaks before one."""
    widen = graph.layer(order[k])
    hidden = set(widen.outputs)
    out: list[str] = []
    for name in order[k + 1:]:
        lay = graph.layer(name)
        if not any(t in hidden for t in lay.fmap_inputs) and not sibling(graph, widen, lay):
            return None
        out.append(name)
        if narrow_axis(graph, lay, tuple(hidden)) is not None:
            return tuple(out)
        if not all(lay.outputs):
            return None
        hidden.update(lay.outputs)
    return None


def _walk(graph: Graph, widen: Layer, out: str, split: tuple[int, dict[str, int]],
          chain: tuple[str, ...]) -> HeadWalk | None:
    """Every (outer, units, inner) split of the widening layer's output through the chain;
    the first (most units) that every layer keeps."""
    channels, const_axes = split
    shape = graph.shapes[out]
    axis = op_spec(widen.op).chunk_out_axis % len(shape)
    if shape[axis] != channels:
        return None
    # every (outer, units, inner) split with two or more units, most units first
    live: list[dict[str, Cut]] = []
    for units in sorted((u for u in range(2, channels + 1) if channels % u == 0), reverse=True):
        rest = channels // units
        for outer in (o for o in range(1, rest + 1) if rest % o == 0):
            cuts = {out: Cut(axis, outer, rest // outer)}
            cuts.update({c: Cut(a, outer, rest // outer) for c, a in const_axes.items()})
            live.append(cuts)
    hidden = [out]
    for name in chain[:-1]:
        lay = graph.layer(name)
        if sibling(graph, widen, lay):  # cut into as many units as the widening layer
            live = [{**cuts, **more} for cuts in live
                    if (more := _sibling_cuts(graph, lay, cuts[out], shape)) is not None]
            hidden.extend(lay.outputs)
            if not live:
                return None
            continue
        live = [c for c in (_followed(graph, lay, cuts) for cuts in live) if c is not None]
        if not live:
            return None
        hidden.extend(lay.outputs)
    narrow = graph.layer(chain[-1])
    found = [c for c in (_narrowed(graph, narrow, cuts) for cuts in live) if c is not None]
    if not found:
        return None
    return HeadWalk(chain[:-1], chain[-1], found[0][out].units(shape), tuple(hidden), found[0])


def _sibling_cuts(graph: Graph, lay: Layer, cut: Cut, widen_shape: Shape
                  ) -> dict[str, Cut] | None:
    """A sibling's output and weights cut into the units of the widening layer's output
    (`cut`, of an output of `widen_shape`): alike where the outputs have one shape, else
    each unit a contiguous run of the sibling's channels (None where they do not divide)."""
    split = chunk_axes(graph, lay)
    assert split is not None
    channels = split[0]
    if channels != widen_shape[cut.axis]:
        units = cut.units(widen_shape)
        if cut.outer != 1 or channels % units:
            return None
        cut = Cut(cut.axis, 1, channels // units)
    return {lay.outputs[0]: cut,
            **{c: Cut(a, cut.outer, cut.inner) for c, a in split[1].items()}}


def narrow_axis(graph: Graph, lay: Layer, hidden: Sequence[str]) -> int | None:
    """The axis a layer summing over its one (data) input's channels by a constant (a
    Linear, a Conv without groups) sums over, when that input is a hidden map."""
    spec = op_spec(lay.op)
    if spec.in_chunk_axis is None or len(lay.inputs) < 2 or lay.inputs[1] not in lay.weights \
            or lay.fmap_inputs != (lay.inputs[0],) or lay.inputs[0] not in hidden:
        return None
    return spec.chunk_out_axis % len(graph.shapes[lay.inputs[0]])


def _narrowed(graph: Graph, lay: Layer, cuts: dict[str, Cut]) -> dict[str, Cut] | None:
    x = lay.inputs[0]
    cut = cuts[x]
    if cut.axis != narrow_axis(graph, lay, (x,)):
        return None
    w = lay.inputs[1]
    spec = op_spec(lay.op)
    assert spec.in_chunk_axis is not None
    wshape = tuple(graph.constants[w].shape)
    at = spec.in_chunk_axis(1, wshape, lay.attrs)
    if at is None or wshape[at] != graph.shapes[x][cut.axis]:
        return None
    return {**cuts, w: Cut(at, cut.outer, cut.inner)}


def _followed(graph: Graph, lay: Layer, cuts: dict[str, Cut]) -> dict[str, Cut] | None:
    """`cuts` with the layer's outputs' cuts added, or None when the layer mixes units."""
    spec = op_spec(lay.op)
    out = lay.outputs[0]
    oshape = graph.shapes[out]
    if len(lay.outputs) > 1 and not (lay.op == "Split" and spec.axis_move is AxisMove.SELECT):
        return None
    x = next(t for t in lay.fmap_inputs if t in cuts)
    cut, xshape = cuts[x], graph.shapes[x]
    if any(t not in cuts for t in lay.fmap_inputs):
        return None  # a map from outside the stretch
    consts: dict[str, Cut] = {}
    new: Cut | None
    if spec.channel_local:
        local = _channel_local(graph, lay, cuts, cut, xshape, oshape)
        if local is None:
            return None
        new, consts = local
    else:
        new = _moved(graph, lay, spec, cuts, cut, xshape, oshape)
    if new is None or not 0 <= new.axis < len(oshape) \
            or oshape[new.axis] != xshape[cut.axis] // (cut.outer * cut.inner) \
            * new.outer * new.inner:
        return None
    return {**cuts, **consts, **{t: new for t in lay.outputs}}


def _channel_local(graph: Graph, lay: Layer, cuts: dict[str, Cut], cut: Cut, xshape: Shape,
                   oshape: Shape) -> tuple[Cut, dict[str, Cut]] | None:
    """A channel-local layer's output cut (its input's) and its constants' cuts, or None
    when its maps differ in shape or cut, or a constant neither splits nor broadcasts."""
    if any(graph.shapes[t] != oshape or cuts[t] != cut for t in lay.fmap_inputs) \
            or xshape != oshape:
        return None
    consts: dict[str, Cut] = {}
    for c in (t for t in lay.inputs if t and t not in lay.fmap_inputs):
        cshape = tuple(graph.constants[c].shape) if c in graph.constants else ()
        at = cut.axis - (len(oshape) - len(cshape))
        if at < 0 or cshape[at] == 1:
            continue  # broadcast: every chunk uses it whole
        if cshape[at] != oshape[cut.axis]:
            return None
        consts[c] = Cut(at, cut.outer, cut.inner)
    return cut, consts


def _moved(graph: Graph, lay: Layer, spec: OpSpec, cuts: dict[str, Cut], cut: Cut,
           xshape: Shape, oshape: Shape) -> Cut | None:
    """The output cut of a layer that moves, selects or mixes along axes (None: it mixes
    the units, or no case below knows the op)."""
    if spec.axis_move in (AxisMove.REGROUP, AxisMove.SQUEEZE, AxisMove.UNSQUEEZE):
        return _regrouped(xshape, cut, oshape)
    if spec.axis_move is AxisMove.PERMUTE:
        perm = [int(p) for p in lay.attrs.get("perm", range(len(xshape) - 1, -1, -1))]
        return Cut(perm.index(cut.axis), cut.outer, cut.inner)
    if spec.axis_move is AxisMove.SELECT and lay.op == "Gather":
        return _gathered(graph, lay, cut, xshape)
    if spec.axis_move is AxisMove.SELECT and lay.op == "Split":
        return _split_parts(graph, lay, cut, xshape)
    if spec.maps in (MapRule.SOFTMAX, MapRule.NORM):
        return _normalized(lay, spec, cut, xshape, oshape)
    if spec.maps is MapRule.LINEAR and not lay.weights and len(lay.fmap_inputs) == 2:
        return _batched_matmul(graph, lay, cuts, cut, oshape)
    if spec.maps is MapRule.ATTENTION:
        return _fused_attention(graph, lay, cuts, cut, oshape)
    if lay.op == "Slice":  # along other axes (a rotary embedding's halves of a head)
        return None if cut.axis in _sliced_axes(graph, lay, len(xshape)) else cut
    if spec.maps is MapRule.CONCAT:  # along another axis, every part cut alike
        at = int(lay.attrs.get("axis", 0)) % len(xshape)
        return cut if at != cut.axis and all(cuts[t] == cut for t in lay.fmap_inputs) else None
    return None


def _sliced_axes(graph: Graph, lay: Layer, rank: int) -> set[int]:
    """The axes a Slice cuts (its `axes` input; every axis it has starts for when absent,
    and every axis when an input is not a constant: nothing to follow)."""
    consts = [graph.constants.get(t) if t else None for t in lay.inputs[1:5]]
    if consts[0] is None or consts[1] is None or (len(lay.inputs) > 3 and lay.inputs[3]
                                                  and consts[2] is None):
        return set(range(rank))
    axes = consts[2] if len(consts) > 2 and consts[2] is not None \
        else np.arange(np.asarray(consts[0]).size)
    return {int(a) % rank for a in np.asarray(axes).reshape(-1)}


def _gathered(graph: Graph, lay: Layer, cut: Cut, xshape: Shape) -> Cut | None:
    """A Gather's output cut: its index's axes replace the gathered one."""
    g = int(lay.attrs.get("axis", 0)) % len(xshape)
    index = lay.inputs[1] if len(lay.inputs) > 1 else ""
    if g == cut.axis or index not in graph.constants:
        return None
    ndim = np.asarray(graph.constants[index]).ndim
    return Cut(cut.axis if cut.axis < g else cut.axis - 1 + ndim, cut.outer, cut.inner)


def _split_parts(graph: Graph, lay: Layer, cut: Cut, xshape: Shape) -> Cut | None:
    """A Split's output cut: its input's, when the parts lie along another axis."""
    g = int(lay.attrs.get("axis", 0)) % len(xshape)
    if g == cut.axis or any(graph.shapes[t][cut.axis] != xshape[cut.axis]
                            for t in lay.outputs):
        return None  # parts along another axis: each keeps every unit where it was
    return cut


def _normalized(lay: Layer, spec: OpSpec, cut: Cut, xshape: Shape, oshape: Shape
                ) -> Cut | None:
    """A softmax's or layer norm's output cut: its input's, when it normalizes along other
    axes."""
    default = -1 if spec.maps is MapRule.NORM else (1 if lay.opset < 13 else -1)
    at = int(lay.attrs.get("axis", default)) % len(xshape)
    # softmax over one axis (opset >= 13; before: the axes from `axis` on), layer norm
    # over the axes from `axis` on: the units' axis must be none of them
    over = range(at, at + 1) if spec.maps is MapRule.SOFTMAX and lay.opset >= 13 \
        else range(at, len(xshape))
    if cut.axis in over or xshape != oshape:
        return None
    return cut


def _batched_matmul(graph: Graph, lay: Layer, cuts: dict[str, Cut], cut: Cut, oshape: Shape
                    ) -> Cut | None:
    """A MatMul of two maps' output cut: its inputs', when both are cut alike along a batch
    axis."""
    a, b = lay.fmap_inputs
    rank = len(oshape)
    if a == b or len(graph.shapes[a]) != rank or len(graph.shapes[b]) != rank \
            or cuts[a] != cuts[b] or cut.axis >= rank - 2 \
            or graph.shapes[a][cut.axis] != graph.shapes[b][cut.axis]:
        return None  # q @ k^T and p @ v: batched over the heads
    return cut


def _fused_attention(graph: Graph, lay: Layer, cuts: dict[str, Cut], cut: Cut,
                     oshape: Shape) -> Cut | None:
    """A fused attention's output cut (planner.front.attention_fusion): its query's, when
    q, the keys and v are cut along one batch axis (the heads) into the same units: alike,
    or with grouped-query heads (`kv_groups` g) each unit a run of key heads and the g
    query heads per key head that read them. Keys in parts (a KV cache) are not followed."""
    rank = len(oshape)
    groups = int(lay.attrs.get("kv_groups", 1))
    if len(lay.fmap_inputs) != 3 or cut.axis >= rank - 2:
        return None
    q, *kv = lay.fmap_inputs
    qcut = cuts[q]
    if len(graph.shapes[q]) != rank or graph.shapes[q][qcut.axis] != oshape[qcut.axis]:
        return None
    for t in kv:  # key head h serves query heads [h g, h g + g): a unit holds both
        kcut = cuts[t]
        if len(graph.shapes[t]) != rank or kcut.axis != qcut.axis \
                or (groups > 1 and (kcut.outer != 1 or qcut.outer != 1
                                    or qcut.inner != groups * kcut.inner)) \
                or (groups == 1 and kcut != qcut) \
                or kcut.units(graph.shapes[t]) != qcut.units(graph.shapes[q]):
            return None
    return qcut


def _regrouped(shape: Shape, cut: Cut, out: Shape) -> Cut | None:
    """A cut through a reshape (row-major order kept): the unit of a flat index is
    (flat // S) % U with S the unit's stride; in the output that is the axis holding
    stride S, when its extent is a whole number of unit periods."""
    units = cut.units(shape)
    stride = cut.inner * prod(shape[cut.axis + 1:])
    after = 1
    for b in range(len(out) - 1, -1, -1):
        if after <= stride < after * out[b]:
            if stride % after:
                return None
            inner = stride // after
            if out[b] % (inner * units):
                return None
            return Cut(b, out[b] // (inner * units), inner)
        after *= out[b]
    return None
