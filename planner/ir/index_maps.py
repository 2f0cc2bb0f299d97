"""Index maps: for every output axis of an op, which axis of each feature-map input it reads,
and how, from the op's semantics alone (its map rule in the op table, its attributes, its
shapes and constant parameters), never from a layout.

An output axis reads one input axis through an `AxisMap` (planner.ir.graph): element for
element (IDENTITY), through a sliding window (a conv or pool over any spatial rank), at an
offset (Slice, Pad, Concat), by an integer factor (nearest Resize, the leading axis of a
row-major merge: a range of merged ``H*W`` positions reads a range of rows), or the whole
input axis for every output element (WHOLE: an axis contracted, normalised or gathered at
run time). An output axis that reads no axis of an input (None) is a broadcast or an axis
the op creates (a conv's output channels come from its weights). Input axes no output axis
reads positionally are needed whole by every output element.

The graph builder derives the tiles' row and column maps and the axis classes that decide
which axes tiles cut (planner.front.axes) from these maps; the property test
(tests/test_index_maps.py) checks them against onnxruntime: an output box never changes
when input elements outside the box its maps give are changed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from math import prod
from types import MappingProxyType
from typing import Any

from fuseplan.planner.ir.graph import IDENTITY, WHOLE, AxisMap, MapKind
from fuseplan.planner.ir.ops import AxisMove, MapRule, OpClass, OpSpec

Shape = tuple[int, ...]


@dataclass(frozen=True)
class AxisRead:
    """How one output axis reads one axis of an input."""

    axis: int  # the input axis
    map: AxisMap  # output range -> input range along it (WHOLE: all of it, for any index)


@dataclass(frozen=True)
class IndexMap:
    """One feature-map input of a node against the node's first output."""

    in_shape: Shape
    reads: tuple[AxisRead | None, ...]  # per output axis; None: reads no axis of this input

    def _reader(self, in_axis: int, accept: Callable[[AxisMap], bool]) -> int | None:
        """The first output axis that reads input axis `in_axis` by a map `accept` takes."""
        return next((out_axis for out_axis, read in enumerate(self.reads)
                     if read is not None and read.axis == in_axis and accept(read.map)), None)

    def lands(self, in_axis: int) -> int | None:
        """The output axis input axis `in_axis` lands on whole, element for element (a
        movement op carrying it), None where it is merged, split, cut or dropped."""
        return self._reader(in_axis, lambda m: m == IDENTITY)

    def follows(self, in_axis: int) -> int | None:
        """The output axis that reads input axis `in_axis` position for position: whole
        (`lands`), shifted (a Slice, Pad or Concat along it) or through a window of one
        element (a 1x1 conv); None where no output axis does."""
        return self._reader(in_axis, lambda m: m == IDENTITY or m.kind is MapKind.OFFSET
                            or (m.whole_strides and m.kernel == 1))

    def carries(self, in_axis: int) -> int | None:
        """The output axis input axis `in_axis` goes to in order: whole (`lands`), or as
        the leading axis of a row-major split (a range of it reads whole strides of the
        input axis) or of a merge (it reads the input axis scaled up)."""
        return self._reader(in_axis, lambda m: m == IDENTITY or m.kind is MapKind.UPSAMPLE
                            or m.whole_strides)

    def read_of(self, out_axis: int | None) -> AxisRead | None:
        """What output axis `out_axis` reads of this input (None for no axis)."""
        return None if out_axis is None else self.reads[out_axis]


@dataclass(frozen=True)
class NodeFacts:
    """What the index maps of one node depend on, resolved by the front end."""

    spec: OpSpec
    attrs: Mapping[str, Any]
    shapes: tuple[Shape | None, ...]  # every input's shape (None: an absent optional input)
    fmap: tuple[int, ...]  # the positions of the feature-map inputs among the inputs
    out_shape: Shape
    opset: int = 17
    # the axes the op names where they are constant inputs or attributes: a Reduce's folded
    # axes, a Squeeze's or Unsqueeze's, a Gather's (axis, and -1 when a scalar index drops
    # it); None where they are not known at planning time
    axes: tuple[int, ...] | None = None
    # Slice and Pad: output index = input index + shift along each axis it cuts or pads;
    # None where the bounds are not constant or the step is not 1
    shifts: Mapping[int, int] | None = field(default=None)
    # Resize and Upsample: the scale per axis where the node gives scales (None: sizes)
    scales: tuple[float, ...] | None = None
    # Slice: its step along each axis it cuts with a step above 1 (the shift is then the
    # input index of output index 0, negated, as for a step of 1)
    strides: Mapping[int, int] | None = field(default=None)

    def shape(self, k: int) -> Shape:
        """The shape of feature-map input number k (its place among the fmaps)."""
        s = self.shapes[self.fmap[k]]
        assert s is not None
        return s


def _whole_reads(rank_out: int, in_shape: Shape) -> tuple[AxisRead | None, ...]:
    """Every output axis reads nothing positionally: the input is needed whole."""
    return tuple(AxisRead(0, WHOLE) if in_shape else None for _ in range(rank_out))


def _broadcast(out: Shape, ins: Shape, skip: int = 0) -> list[AxisRead | None]:
    """Numpy broadcasting, right-aligned, of the axes of `ins` against the output's (the last
    `skip` axes of both are left to the caller, as None)."""
    reads: list[AxisRead | None] = [None] * len(out)
    for k in range(1 + skip, min(len(out), len(ins)) + 1):
        o, i = len(out) - k, len(ins) - k
        if ins[i] == out[o]:
            reads[o] = AxisRead(i, IDENTITY)
        elif ins[i] != 1:
            reads[o] = AxisRead(i, WHOLE)
    return reads


def _elementwise(f: NodeFacts, k: int) -> list[AxisRead | None]:
    reads = _broadcast(f.out_shape, f.shape(k))
    if f.spec.op == "LRN" and len(reads) > 1:
        reads[1] = AxisRead(1, WHOLE)  # the sum runs over neighbouring channels
    return reads


def _reshape(f: NodeFacts, k: int) -> list[AxisRead | None]:
    return list(regrouped(f.shape(k), f.out_shape).reads)


def regrouped(ins: Shape, out: Shape) -> IndexMap:
    """A row-major Reshape of `ins` into `out`: the shapes split into runs of equal
    products; a run's leading output axis reads its leading input axis element for element
    (a run of one axis each), a window of it (a split, or any run where an output index
    spans whole input indices) or scaled up (a merge, or any run where it lies within one);
    every other axis of a run needs its input run whole."""
    reads = _regrouped(ins, out)
    # an axis of one element lands where the elements before it are as many, on an output
    # axis of one element no other input axis took
    for i, n in enumerate(ins):
        if n != 1:
            continue
        before = prod(ins[:i])
        for o, m in enumerate(out):
            if m == 1 and reads[o] is None and prod(out[:o]) == before:
                reads[o] = AxisRead(i, IDENTITY)
                break
    return IndexMap(ins, tuple(reads))


def _regrouped(ins: Shape, out: Shape) -> list[AxisRead | None]:
    reads: list[AxisRead | None] = [None] * len(out)
    i = o = 0
    while i < len(ins) or o < len(out):
        # axes of extent 1 join no run: they are free
        if i < len(ins) and ins[i] == 1:
            i += 1
            continue
        if o < len(out) and out[o] == 1:
            o += 1
            continue
        if i >= len(ins) or o >= len(out):
            break
        run_i, run_o = [i], [o]
        a, b = ins[i], out[o]
        i, o = i + 1, o + 1
        while a != b:
            if a < b and i < len(ins):
                a *= ins[i]
                run_i.append(i)
                i += 1
            elif b < a and o < len(out):
                b *= out[o]
                run_o.append(o)
                o += 1
            else:
                return list(_whole_reads(len(out), ins))
        # the leading axes start the run together: an index of the output's spans s_out
        # elements of the run, one of the input's s_in; where one divides the other, a
        # range of output indices reads whole strides of input ones, or lies within one
        lead_i, lead_o = run_i[0], run_o[0]
        s_in, s_out = prod(ins[x] for x in run_i[1:]), prod(out[x] for x in run_o[1:])
        if s_in == s_out:
            reads[lead_o] = AxisRead(lead_i, IDENTITY)
        elif s_out % s_in == 0:
            k = s_out // s_in
            reads[lead_o] = AxisRead(lead_i, AxisMap(MapKind.WINDOW, k, k))
        elif s_in % s_out == 0:
            reads[lead_o] = AxisRead(lead_i, AxisMap(MapKind.UPSAMPLE, stride=s_in // s_out))
        else:
            reads[lead_o] = AxisRead(lead_i, WHOLE)
        for x in run_o[1:]:
            reads[x] = AxisRead(lead_i, WHOLE)
    return reads


def _permute(f: NodeFacts, k: int) -> list[AxisRead | None]:
    perm = [int(p) for p in f.attrs.get("perm", range(len(f.out_shape))[::-1])]
    return [AxisRead(p, IDENTITY) for p in perm]


def _squeeze(f: NodeFacts, k: int) -> list[AxisRead | None]:
    ins, out = f.shape(k), f.out_shape
    if f.spec.axis_move is AxisMove.UNSQUEEZE:
        added = set(f.axes or ())
        kept = [a for a in range(len(out)) if a not in added]
        if len(kept) != len(ins):
            return list(_whole_reads(len(out), ins))
        reads: list[AxisRead | None] = [None] * len(out)
        for i, o in enumerate(kept):
            reads[o] = AxisRead(i, IDENTITY)
        return reads
    dropped = set(f.axes) if f.axes is not None else {a for a, n in enumerate(ins) if n == 1}
    kept = [a for a in range(len(ins)) if a not in dropped]
    if len(kept) != len(out):
        return list(_whole_reads(len(out), ins))
    return [AxisRead(i, IDENTITY) for i in kept]


def _select(f: NodeFacts, k: int) -> list[AxisRead | None]:
    """Split and Gather: every axis but the one taken along is read element for element; the
    one taken along (indices known at run time, or parts of it) needs its input whole. A
    Gather of run-time indices from a constant table reads, per output position, its own
    indices."""
    out = f.out_shape
    axis = int(f.attrs.get("axis", 0))
    if f.spec.op != "Gather":
        ins = f.shape(k)
        axis %= max(len(ins), 1)
        return [AxisRead(a, WHOLE if a == axis else IDENTITY) for a in range(len(out))]
    data, idx = f.shapes[0], f.shapes[1] if len(f.shapes) > 1 else None
    if data is None or idx is None:
        return list(_whole_reads(len(out), f.shape(k)))
    axis %= max(len(data), 1)
    r = len(idx)
    if f.fmap[k] == 1:  # the indices: output axes axis..axis+r-1 are theirs
        return [AxisRead(o - axis, IDENTITY) if axis <= o < axis + r else None
                for o in range(len(out))]
    reads: list[AxisRead | None] = []
    for o in range(len(out)):
        if o < axis:
            reads.append(AxisRead(o, IDENTITY))
        elif o < axis + r:
            reads.append(AxisRead(axis, WHOLE))
        else:
            reads.append(AxisRead(o - r + 1, IDENTITY))
    return reads


def _concat(f: NodeFacts, k: int) -> list[AxisRead | None]:
    """Every axis element for element but the one joined along: an offset per input."""
    out = f.out_shape
    axis = int(f.attrs.get("axis", 1)) % len(out)
    at = sum((s[axis] if s is not None else 0) for s in f.shapes[:f.fmap[k]])
    joined = f.shape(k)[axis] != out[axis]
    return [AxisRead(a, AxisMap(MapKind.OFFSET, pad=at) if a == axis and joined else IDENTITY)
            for a in range(len(out))]


def _over_axes(f: NodeFacts, k: int, folded: set[int]) -> list[AxisRead | None]:
    return [AxisRead(a, WHOLE if a in folded else IDENTITY) for a in range(len(f.out_shape))]


def _norm(f: NodeFacts, k: int) -> list[AxisRead | None]:
    rank = len(f.out_shape)
    return _over_axes(f, k, set(range(int(f.attrs.get("axis", -1)) % rank, rank)))


def _softmax(f: NodeFacts, k: int) -> list[AxisRead | None]:
    rank = len(f.out_shape)
    axis = int(f.attrs.get("axis", 1 if f.opset < 13 else -1)) % rank
    return _over_axes(f, k, set(range(axis, rank)) if f.opset < 13 else {axis})


def _reduce(f: NodeFacts, k: int) -> list[AxisRead | None]:
    ins, out = f.shape(k), f.out_shape
    folded = set(f.axes) if f.axes is not None else set(range(len(ins)))
    if len(ins) == len(out):  # keepdims: a folded axis is one wide, read whole
        return _over_axes(f, k, folded)
    kept = [a for a in range(len(ins)) if a not in folded]
    if len(kept) != len(out):
        return list(_whole_reads(len(out), ins))
    return [AxisRead(a, IDENTITY) for a in kept]


def _linear(f: NodeFacts, k: int) -> list[AxisRead | None]:
    """A @ B over the last two axes, broadcast over the leading ones; Gemm's transposes."""
    out = f.out_shape
    ins, place = f.shape(k), f.fmap[k]
    if f.spec.op == "Gemm":
        trans = int(f.attrs.get("transA" if place == 0 else "transB", 0))
        if place == 0 and not trans and len(ins) == len(out) > 2:
            # restated over the batch it folded (planner.front.batch_unmerge): the last
            # axis contracted, the leading ones element for element
            return [AxisRead(a, IDENTITY) for a in range(len(ins) - 1)] + [None]
        if place == 0:
            return [AxisRead(1 if trans else 0, IDENTITY), None]
        if place == 1:
            return [None, AxisRead(0 if trans else 1, IDENTITY)]
        return _broadcast(out, ins)  # C
    other = f.shapes[1 - place] if place < 2 else None
    if len(ins) == 1:  # a vector operand is contracted whole
        return [None] * len(out)
    if other is not None and len(other) == 1:
        # A @ v drops A's last axis, v @ B drops B's second-to-last: the rest line up
        kept = [a for a in range(len(ins)) if a != len(ins) - (1 if place == 0 else 2)]
        if len(kept) != len(out):
            return list(_whole_reads(len(out), ins))
        return [AxisRead(a, IDENTITY) if ins[a] == out[o] else AxisRead(a, WHOLE)
                for o, a in enumerate(kept)]
    if len(out) < 2:
        return list(_whole_reads(len(out), ins))
    reads = _broadcast(out, ins, skip=2)
    if place == 0:
        reads[-2] = AxisRead(len(ins) - 2, IDENTITY)
    else:
        reads[-1] = AxisRead(len(ins) - 1, IDENTITY)
    return reads


def _attention(f: NodeFacts, k: int) -> list[AxisRead | None]:
    """Fused attention: the queries' rows element for element, keys and values whole; a
    causal one's keys and values (given key-major, [.., Lk, d], one part each) only up to
    the last key its last query row sees (PREFIX): FlashAttention-2 skips the chunks past
    the diagonal, so a tile of query rows reads no key after them."""
    out, ins = f.out_shape, f.shape(k)
    reads = _broadcast(out, ins, skip=2)
    if k == 0:
        reads[-2] = AxisRead(len(ins) - 2, IDENTITY)
    elif _prefix_keys(f, k):
        # query row r of Lq sees keys [0, r + 1 + Lk - Lq)
        reads[-2] = AxisRead(len(ins) - 2, AxisMap(MapKind.PREFIX, pad=out[-2] - ins[-2]))
    return reads


def _prefix_keys(f: NodeFacts, k: int) -> bool:
    """Whether input k of a fused attention holds keys or values key-major in a causal
    layer of three inputs (a KV cache and its new positions stay whole)."""
    a = f.attrs
    if len(f.fmap) != 3 or not int(a.get("causal", 0)):
        return False
    return k == 2 or not int(a.get("transposed_keys", 1))


def _window(f: NodeFacts, k: int) -> list[AxisRead | None]:
    """Conv and pooling over axes 2.. of any spatial rank: a window per output index; the
    batch element for element; channels: a pool's (and a depthwise conv's) element for
    element, a conv's from its weights (its input channels read whole)."""
    ins, out = f.shape(k), f.out_shape
    if k != 0 or len(ins) < 3:
        return list(_whole_reads(len(out), ins))
    a = f.attrs
    nd = len(ins) - 2
    kernel = list(a.get("kernel_shape", [1] * nd))
    strides = list(a.get("strides", [1] * nd))
    dilations = list(a.get("dilations", [1] * nd))
    pads = list(a.get("pads", [0] * (2 * nd)))
    if len(kernel) != nd or len(pads) != 2 * nd:
        return list(_whole_reads(len(out), ins))
    conv = f.spec.op in ("Conv", "ConvTranspose")
    depthwise = conv and int(a.get("group", 1)) == ins[1] == out[1]
    reads: list[AxisRead | None] = [AxisRead(0, IDENTITY),
                                    AxisRead(1, IDENTITY) if depthwise or not conv else None]
    kind = MapKind.TRANSPOSED if f.spec.maps is MapRule.TRANSPOSED else MapKind.WINDOW
    for d in range(nd):
        reads.append(AxisRead(2 + d, AxisMap(kind, kernel[d], strides[d], pads[d],
                                             dilations[d])))
    return reads


def upsample_map(spec: OpSpec, attrs: Mapping[str, Any], in_len: int, out_len: int,
                 scale: float | None = None) -> AxisMap:
    """Nearest-neighbour integer upsampling is row-local when output row i reads input row
    i // f: sampled at floor(i/f), or at the nearest centre; everything else needs the whole
    axis. The op's attribute defaults say how it samples (Upsample always floors); a given
    scale must be that factor (a scale of 2.2 samples row floor(i / 2.2))."""
    if out_len % in_len or attrs.get("mode", "nearest") != "nearest":
        return WHOLE
    factor = out_len // in_len
    if scale is not None and scale != factor:
        return WHOLE
    if factor == 1:
        return IDENTITY
    attrs = spec.with_defaults(attrs)
    ctm, nearest = attrs["coordinate_transformation_mode"], attrs["nearest_mode"]
    floors = ctm == "asymmetric" and nearest == "floor"
    centred = ctm in ("half_pixel", "pytorch_half_pixel") and nearest.startswith("round_prefer")
    return AxisMap(MapKind.UPSAMPLE, stride=factor) if floors or centred else WHOLE


def _upsample(f: NodeFacts, k: int) -> list[AxisRead | None]:
    ins, out = f.shape(k), f.out_shape
    if k != 0 or len(ins) != len(out):
        return list(_whole_reads(len(out), ins))
    scales = f.scales if f.scales is not None and len(f.scales) == len(out) else None
    return [AxisRead(a, upsample_map(f.spec, f.attrs, ins[a], out[a],
                                     None if scales is None else scales[a]))
            for a in range(len(out))]


def _shifted(f: NodeFacts, k: int) -> list[AxisRead | None]:
    """Slice and constant Pad: output index = input index + shift along each axis it cuts or
    pads (an OFFSET map), element for element along the others; whole where not known."""
    ins, out = f.shape(k), f.out_shape
    if k != 0 or f.shifts is None or len(ins) != len(out):
        return list(_whole_reads(len(out), ins))
    strides = f.strides or {}
    return [AxisRead(a, AxisMap(MapKind.WINDOW, 1, strides[a], f.shifts.get(a, 0))
                     if strides.get(a, 1) > 1
                     else AxisMap(MapKind.OFFSET, pad=f.shifts.get(a, 0)) if f.shifts.get(a)
                     or ins[a] != out[a] else IDENTITY) for a in range(len(out))]


def _global(f: NodeFacts, k: int) -> list[AxisRead | None]:
    """Global pools fold axes 2..; other whole-map ops need every axis."""
    ins, out = f.shape(k), f.out_shape
    if f.spec.op in ("GlobalAveragePool", "GlobalMaxPool") and len(ins) == len(out) >= 2:
        return _over_axes(f, k, set(range(2, len(out))))
    return list(_whole_reads(len(out), ins))


_Reads = Callable[[NodeFacts, int], list[AxisRead | None]]
_BY_MOVE: Mapping[AxisMove, _Reads] = MappingProxyType({
    AxisMove.REGROUP: _reshape,
    AxisMove.PERMUTE: _permute,
    AxisMove.SQUEEZE: _squeeze,
    AxisMove.UNSQUEEZE: _squeeze,
    AxisMove.SELECT: _select,
})
_BY_RULE: Mapping[MapRule, _Reads] = MappingProxyType({
    MapRule.WINDOW: _window,
    MapRule.TRANSPOSED: _window,
    MapRule.UPSAMPLE: _upsample,
    MapRule.LOCAL: _elementwise,
    MapRule.CONCAT: _concat,
    MapRule.TRANSPOSE: _permute,
    MapRule.NORM: _norm,
    MapRule.LINEAR: _linear,
    MapRule.SOFTMAX: _softmax,
    MapRule.REDUCE: _reduce,
    MapRule.SELECT: _select,
    MapRule.SLICE: _shifted,
    MapRule.PAD: _shifted,
    MapRule.ATTENTION: _attention,
    MapRule.WHOLE: _global,
})


def index_maps(f: NodeFacts) -> tuple[IndexMap, ...]:
    """The index map of every feature-map input of a node, against its first output."""
    if f.spec.op_class is OpClass.OPAQUE:
        reads_of: _Reads = lambda f, k: list(_whole_reads(len(f.out_shape), f.shape(k)))  # noqa: E731
    else:
        reads_of = _BY_MOVE.get(f.spec.axis_move) or _BY_RULE[f.spec.maps]
    out = []
    for k in range(len(f.fmap)):
        reads = reads_of(f, k)
        out.append(IndexMap(f.shape(k), tuple(reads)))
    return tuple(out)


def facts_of(spec: OpSpec, attrs: Mapping[str, Any], shapes: Sequence[Shape | None],
             fmap: Sequence[int], out_shape: Shape, opset: int,
             axes: tuple[int, ...] | None = None,
             shifts: Mapping[int, int] | None = None,
             scales: Sequence[float] | None = None,
             strides: Mapping[int, int] | None = None) -> NodeFacts:
    """NodeFacts with read-only fields."""
    return NodeFacts(spec, MappingProxyType(dict(attrs)), tuple(shapes), tuple(fmap),
                     tuple(out_shape), opset, axes,
                     None if shifts is None else MappingProxyType(dict(shifts)),
                     None if scales is None else tuple(float(x) for x in scales),
                     None if not strides else MappingProxyType(dict(strides)))
