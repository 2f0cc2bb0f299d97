"""Index maps of ONNX nodes: the op table's semantics (planner.ir.index_maps) with the
constant parameters a node names resolved (a Reduce's or Squeeze's axes, a Slice's bounds, a
Pad's widths, a window's pads), and the row and column maps of a layer derived from them for
the layouts its tensors have."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from fuseplan.planner.front.reductions import reduced_axes
from fuseplan.planner.ir.graph import IDENTITY, WHOLE, AxisMap, MapKind
from fuseplan.planner.ir.index_maps import IndexMap, NodeFacts, facts_of, index_maps
from fuseplan.planner.ir.layout import Layout
from fuseplan.planner.ir.ops import AxisMove, MapRule, OpSpec

Shape = tuple[int, ...]


def _given_axes(attrs: Mapping[str, Any], inputs: Sequence[str],
                constants: Mapping[str, np.ndarray], rank: int, opset: int
                ) -> tuple[int, ...] | None:
    """Squeeze's and Unsqueeze's axes: an attribute before opset 13, input 1 from it."""
    if opset < 13:
        values = attrs.get("axes")
    elif len(inputs) > 1 and inputs[1]:
        if inputs[1] not in constants:
            return None
        values = constants[inputs[1]].reshape(-1).tolist()
    else:
        values = None
    if values is None:
        return None
    return tuple(sorted(int(a) % rank for a in values))


def node_axes(spec: OpSpec, attrs: Mapping[str, Any], inputs: Sequence[str],
              constants: Mapping[str, np.ndarray], in_shape: Shape, out_shape: Shape,
              opset: int) -> tuple[int, ...] | None:
    """The axes a node names, as NodeFacts.axes holds them (None: not known, or all)."""
    if spec.maps is MapRule.REDUCE:
        found = reduced_axes(attrs, inputs, constants, len(in_shape))
        return None if found is None else tuple(sorted(found))
    if spec.axis_move is AxisMove.SQUEEZE:
        given = _given_axes(attrs, inputs, constants, len(in_shape), opset)
        return given if given is not None else tuple(
            a for a, n in enumerate(in_shape) if n == 1)
    if spec.axis_move is AxisMove.UNSQUEEZE:
        return _given_axes(attrs, inputs, constants, len(out_shape), opset)
    return None


def _slice_shifts(inputs: Sequence[str], constants: Mapping[str, np.ndarray],
                  in_shape: Shape, opset: int
                  ) -> tuple[dict[int, int], dict[int, int]] | None:
    """Slice with constant bounds and positive steps along every axis it cuts: the input
    index of output index 0 along each (a negative shift), and the steps above 1."""
    if opset < 10 or len(inputs) < 3 or any(t and t not in constants for t in inputs[1:5]):
        return None
    given = [constants[t] if t else None for t in inputs[1:5]]
    if given[0] is None:
        return None
    starts = given[0].reshape(-1).tolist()
    axes = given[2].reshape(-1).tolist() if len(given) > 2 and given[2] is not None \
        else list(range(len(starts)))
    steps = given[3].reshape(-1).tolist() if len(given) > 3 and given[3] is not None \
        else [1] * len(starts)
    shifts: dict[int, int] = {}
    strides: dict[int, int] = {}
    for axis, start, step in zip(axes, starts, steps, strict=True):
        if step < 1:
            return None
        axis = int(axis) % len(in_shape)
        extent = in_shape[axis]
        shifts[axis] = -min(max(int(start) + extent if start < 0 else int(start), 0), extent)
        if step > 1:
            strides[axis] = int(step)
    return shifts, strides


def _pad_shifts(attrs: Mapping[str, Any], inputs: Sequence[str],
                constants: Mapping[str, np.ndarray], rank: int, opset: int
                ) -> dict[int, int] | None:
    """Constant Pad with known widths: the rows padded before the input's first, per axis."""
    if opset < 11 or attrs.get("mode", "constant") != "constant" or len(inputs) < 2 \
            or inputs[1] not in constants \
            or (len(inputs) > 3 and inputs[3] and inputs[3] not in constants):
        return None
    pads = constants[inputs[1]].reshape(-1).tolist()
    axes = constants[inputs[3]].reshape(-1).tolist() if len(inputs) > 3 and inputs[3] \
        else list(range(rank))
    return {int(a) % rank: int(pads[i]) for i, a in enumerate(axes) if pads[i]}


def _scales(spec: OpSpec, inputs: Sequence[str], constants: Mapping[str, np.ndarray]
            ) -> list[float] | None:
    """The scales a Resize (input 2) or an Upsample (input 1) gives, None for sizes."""
    if spec.maps is not MapRule.UPSAMPLE:
        return None
    at = 2 if spec.op == "Resize" else 1
    name = inputs[at] if len(inputs) > at else ""
    found = constants.get(name) if name else None
    return None if found is None or found.size == 0 else found.reshape(-1).tolist()


def node_index_maps(spec: OpSpec, attrs: Mapping[str, Any], inputs: Sequence[str],
                    constants: Mapping[str, np.ndarray],
                    shapes: Mapping[str, Shape], out_shape: Shape, opset: int
                    ) -> tuple[IndexMap, ...]:
    """The index map of every feature-map input of a node (`attrs` with a window's pads
    resolved, planner.front.sliding)."""
    fmap = [k for k, t in enumerate(inputs) if t and t not in constants]
    in_shapes = [shapes.get(t) if t else None for t in inputs]
    first = in_shapes[fmap[0]] if fmap else None
    shifts: dict[int, int] | None = None
    strides: dict[int, int] = {}
    if first is not None and spec.maps is MapRule.SLICE:
        cut = _slice_shifts(inputs, constants, first, opset)
        shifts, strides = cut if cut is not None else (None, {})
    elif first is not None and spec.maps is MapRule.PAD:
        shifts = _pad_shifts(attrs, inputs, constants, len(first), opset)
    axes = node_axes(spec, attrs, inputs, constants, first or (), out_shape, opset) \
        if first is not None else None
    facts: NodeFacts = facts_of(spec, attrs, in_shapes, fmap, out_shape, opset, axes, shifts,
                                _scales(spec, inputs, constants), strides)
    return index_maps(facts)


def _same_part(im: IndexMap, out_axis: int | None, in_axis: int | None,
               out_shape: Shape) -> bool:
    """Whether the output's axis of one part (batch, rows or columns) reads the input's axis
    of that part, positionally or whole, or neither tensor has a part of more than one
    element there."""
    in_len = 1 if in_axis is None else im.in_shape[in_axis]
    out_len = 1 if out_axis is None else out_shape[out_axis]
    read = im.read_of(out_axis)
    if in_len == 1:  # a broadcast: every tile reads its one element, and nothing else along
        return out_len == 1 or out_axis is None or (
            in_axis is not None and (read is None or read.axis == in_axis))
    return read is not None and read.axis == in_axis


def _part_map(im: IndexMap, out_axis: int | None, in_axis: int | None,
              out_shape: Shape) -> AxisMap:
    """How the output's axis of one part reads the input's axis of that part (both read
    by `_same_part`)."""
    read = im.read_of(out_axis)
    if read is not None and in_axis is not None and read.axis == in_axis:
        return read.map
    if out_axis is None or in_axis is None or im.in_shape[in_axis] == 1:
        return IDENTITY if out_axis is None or out_shape[out_axis] == 1 else WHOLE
    return WHOLE


def layout_maps(im: IndexMap, lin: Layout, lout: Layout, out_shape: Shape
                ) -> tuple[AxisMap, AxisMap]:
    """The row and column maps of one input for its layout and the output's: along each
    tiled axis of the output, how it reads the input's axis of the same part; WHOLE for both
    where the input's batch or rows are not read by the output's, or both have columns and
    the output's do not read the input's (a tile of the output would not be a box of the
    input). Where only one of the two has columns (a map flattened into a sequence, a
    sequence split into an image's rows and columns), the input's are read whole: a box of
    output rows reads its rows' every column (the row-major order a Reshape keeps,
    planner.ir.index_maps.regrouped)."""
    if not (lin.spatial and lout.spatial):
        return WHOLE, WHOLE
    pairs = ((lout.batch_axis, lin.batch_axis), (lout.row_axis, lin.row_axis))
    if not all(_same_part(im, o, i, out_shape) for o, i in pairs):
        return WHOLE, WHOLE
    rows = _part_map(im, lout.row_axis, lin.row_axis, out_shape)
    o, i = lout.col_axis, lin.col_axis
    if _same_part(im, o, i, out_shape):
        return rows, _part_map(im, o, i, out_shape)
    if (o is None) != (i is None):
        return rows, WHOLE
    return WHOLE, WHOLE


def layer_maps(spec: OpSpec, attrs: Mapping[str, Any], inputs: Sequence[str],
               constants: Mapping[str, np.ndarray], ims: Sequence[IndexMap],
               out_shape: Shape, in_layouts: Sequence[Layout], out_layout: Layout
               ) -> tuple[list[AxisMap], list[AxisMap]]:
    """Row and column maps of every feature-map input of a layer, from its index maps
    (`ims`, node_index_maps), where
    the tile kernels can run them: a Reshape's rows element for element, split into whole
    strides or merged, its columns element for element or whole; a Concat along the tiled
    axes only of feature maps (a constant joined along the tokens keeps them whole)."""
    pairs = [layout_maps(im, lin, out_layout, out_shape)
             for im, lin in zip(ims, in_layouts, strict=True)]
    if spec.axis_move is AxisMove.REGROUP:
        # positions split or merged (the rows' leading axis carried, planner.ir.layout.
        # regrouped_layout): a tile reshapes its input box and is cut to its own; a
        # window of a split must be whole strides
        pairs = [p if _reshapes_box(p) else (WHOLE, WHOLE) for p in pairs]
    if spec.maps is MapRule.SLICE:  # a tile cuts its box with a step of 1 only
        pairs = [p if all(m.kind is not MapKind.WINDOW for m in p) else (WHOLE, WHOLE)
                 for p in pairs]
    if spec.maps is MapRule.CONCAT and any(t and t in constants for t in inputs):
        axis = int(attrs.get("axis", 1)) % len(out_shape)
        if axis in out_layout.tiled_axes:
            pairs = [(WHOLE, WHOLE)] * len(pairs)
    return [r for r, _ in pairs], [c for _, c in pairs]


def _reshapes_box(pair: tuple[AxisMap, AxisMap]) -> bool:
    """Whether a Reshape's tile can reshape its input box by these row and column maps:
    rows element for element, whole, merged (UPSAMPLE) or split into whole strides (an
    unpadded WINDOW as wide as its stride); columns element for element or whole."""
    rows, cols = pair
    return cols.kind in (MapKind.IDENTITY, MapKind.WHOLE) and (
        rows.whole_strides or rows.kind in (MapKind.IDENTITY, MapKind.WHOLE, MapKind.UPSAMPLE))
