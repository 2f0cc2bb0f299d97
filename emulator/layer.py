"""One layer executed on one box of its output, from the boxes of its inputs held on chip.

Every mode runner computes its layers here: run_layer cuts each input's box out of what the
chip holds (the region function, planner.geometry.regions.input_box, says which), hands the
kernel (emulator.kernels) the tile's own pads, shapes and offsets, and crops the result to
the box. What a layer needs that no tile changes is worked out once per run (LayerCache).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fuseplan.emulator.boxes import slice_box
from fuseplan.emulator.errors import KernelFailure
from fuseplan.emulator.kernels import run_op
from fuseplan.planner.geometry.regions import Box, empty, input_box
from fuseplan.planner.ir.graph import AxisMap, Graph, Layer, MapKind, gathers_rows
from fuseplan.planner.ir.layout import Layout, layout_of
from fuseplan.planner.ir.ops import MapRule, OpClass, ShapeParam, op_spec


@dataclass(frozen=True)
class LayerFacts:
    """What run_layer needs of a layer that no tile changes, worked out once per layer."""

    # (arg position, fmap index, tensor, its layout, needs exactly the output's box)
    fmaps: tuple[tuple[int, int, str, Layout, bool], ...]
    consts: tuple[tuple[int, str], ...]  # (arg position, tensor): weights and parameters
    # (arg position, [(constant axis, box part: 0 batch, 1 rows, 2 columns)]): element-wise
    # operands spanning the output's batch, rows or columns (a position embedding), cut to
    # the tile's box along those axes
    aligned: tuple[tuple[int, tuple[tuple[int, int], ...]], ...]
    n_args: int
    out_spatial: bool
    window: bool  # conv / pool: the tile passes its own pads
    transposed: bool  # ConvTranspose: scattered into the tile's box
    in_hw: tuple[int, int]  # rows and columns of the first fmap input
    attrs: Mapping[str, Any]  # without ceil_mode for window layers (the pads say it all)
    crop_spatial: bool  # a non-window kernel result may cover more rows than the box
    in_spatial: bool  # the reference fmap input has H and W
    ref: int  # fmap input the kernel result is aligned with (not a broadcast operand)
    out_layout: Layout
    shape_param: ShapeParam  # a parameter input spelling out the whole output map
    attention: bool = False  # fused attention: its kernel is told the tile's first query row
    gathers_rows: bool = False  # fetches its box's rows of a constant table (gather_box)


@dataclass
class LayerCache:
    """Static facts of one graph's layers, worked out once each: emulate() (emulator.run)
    makes one per run and hands it down, so nothing outlives the run."""

    graph: Graph
    facts: dict[str, LayerFacts] = field(default_factory=dict)

    def of(self, lay: Layer) -> LayerFacts:
        """The layer's static facts (computed on first use)."""
        info = self.facts.get(lay.name)
        if info is None:
            info = self.facts[lay.name] = layer_facts(self.graph, lay)
        return info


def layer_facts(graph: Graph, lay: Layer) -> LayerFacts:
    """What run_layer needs of `lay` that no tile changes: where its inputs go among the
    kernel's arguments, which of them a tile cuts to its own box, how its result is cropped."""
    fmaps, consts = [], []
    out_layout = graph.layout(lay.outputs[0])
    out_spatial = out_layout.spatial
    for pos, name in enumerate(lay.inputs):
        if name in lay.fmap_inputs:
            i = lay.fmap_inputs.index(name)
            layout = graph.layout(name)
            fmaps.append((pos, i, name, layout,
                          _same_box(lay, i, graph.shapes[name], layout, out_layout)))
        elif name:
            consts.append((pos, name))
    kind = lay.row_maps[0].kind if lay.row_maps else None
    # a sliding window passes the tile its own pads; other WINDOW maps (a Reshape gathering
    # rows, planner.ir.layout.regrouped_layout) are computed on their input box and cut
    window = kind is MapKind.WINDOW and out_spatial and op_spec(lay.op).maps is MapRule.WINDOW
    first = graph.shapes[lay.fmap_inputs[0]] if lay.fmap_inputs else ()
    first_layout = graph.layout(lay.fmap_inputs[0]) if lay.fmap_inputs else layout_of(())
    # A broadcast operand (an SE scale [N, C, 1, 1] as in `scale * x`) maps WHOLE and may come
    # first: the result is aligned with the first input that is not one.
    ref = next((i for i, m in enumerate(lay.row_maps) if m.kind is not MapKind.WHOLE), 0)
    in_spatial = bool(lay.fmap_inputs) and graph.layout(lay.fmap_inputs[ref]).spatial
    attrs = {k: v for k, v in lay.attrs.items() if k != "ceil_mode"} if window else lay.attrs
    # an element-wise operand of the output's own extent that the maps read whole (its
    # layout does not name the output's rows: Swin's windows reversed into [B, H, W, C]
    # beside a channels-last residual) is cut to the tile's box like a constant operand
    whole_fmaps = [(pos, name) for pos, i, name, _, _ in fmaps
                   if i != ref and lay.row_maps[i].kind is MapKind.WHOLE
                   and graph.shapes[name] == lay.out_shape]
    return LayerFacts(
        fmaps=tuple(fmaps), consts=tuple(consts), n_args=len(lay.inputs),
        aligned=_aligned_constants(graph, lay, [*consts, *whole_fmaps], out_layout, ref),
        out_spatial=out_spatial, window=window,
        transposed=kind is MapKind.TRANSPOSED and out_spatial,
        in_hw=first_layout.dims(first)[2:], attrs=attrs,
        crop_spatial=out_spatial and not window, in_spatial=in_spatial, ref=ref,
        out_layout=out_layout, shape_param=op_spec(lay.op).shape_param,
        attention=op_spec(lay.op).maps is MapRule.ATTENTION, gathers_rows=gathers_rows(lay))


def _aligned_constants(graph: Graph, lay: Layer, consts: Sequence[tuple[int, str]],
                       out_layout: Layout, ref: int
                       ) -> tuple[tuple[int, tuple[tuple[int, int], ...]], ...]:
    """The constant operands of an element-wise layer that span the output's batch, rows or
    columns (broadcast right-aligned), and those a Concat joins that span the batch (a
    class token expanded to every image): a tile takes its own box of them."""
    spec = op_spec(lay.op)
    elementwise = spec.maps is MapRule.LOCAL and spec.op_class in (OpClass.SCALAR,
                                                                     OpClass.VECTOR) \
        and not spec.per_channel_constants  # a BN's 8 means are not 8 columns
    parts: list[tuple[int | None, int]] = []
    if elementwise and out_layout.spatial and lay.row_maps \
            and lay.row_maps[ref].kind is MapKind.IDENTITY:
        parts += [(out_layout.row_axis, 1), (out_layout.col_axis, 2)]
    if lay.batch_preserving and (elementwise or spec.maps is MapRule.CONCAT):
        parts.append((out_layout.batch_axis, 0))
    out = lay.out_shape
    found = []
    for pos, name in consts:
        shape = graph.shapes.get(name, ())
        offset = len(out) - len(shape)
        cuts = tuple((axis - offset, part) for axis, part in parts
                     if axis is not None and axis >= offset and out[axis] > 1
                     and shape[axis - offset] == out[axis])
        if cuts:
            found.append((pos, cuts))
    return tuple(found)


def _same_box(lay: Layer, i: int, shape: tuple[int, ...], layout: Layout,
              out_layout: Layout) -> bool:
    """True when input_box(lay, i, box) is box itself for every box of the output.

    An elementwise input of the output's own extent: identity row and column maps and the
    batch kept, so the region function's clipping never bites. run_layer then skips it.
    """
    if not (out_layout.spatial and layout.spatial and lay.batch_preserving
            and lay.row_maps[i].kind is MapKind.IDENTITY
            and lay.col_maps[i].kind is MapKind.IDENTITY):
        return False
    n, _, h, w = layout.dims(shape)
    out_n, _, out_h, out_w = out_layout.dims(lay.out_shape)
    return (n, h, w) == (out_n, out_h, out_w)


def _window_attrs(lay: Layer, info: LayerFacts, out_box: Box) -> dict[str, Any]:
    """Kernel attributes with the pads this tile needs: the clipped-away part of the window."""
    (h, w), rm, cm = info.in_hw, lay.row_maps[0], lay.col_maps[0]
    r0, r1 = rm.needed(out_box[2], out_box[3], h)
    c0, c1 = cm.needed(out_box[4], out_box[5], w)
    attrs = dict(info.attrs)
    if info.out_layout.col_axis is None:  # a 1-D window along an NCL map's length
        attrs["pads"] = [max(0, -r0), max(0, r1 - h)]
    else:
        attrs["pads"] = [max(0, -r0), max(0, -c0), max(0, r1 - h), max(0, c1 - w)]
    return attrs


def _crop_axis(y: np.ndarray, axis: int, start: int, length: int) -> np.ndarray:
    if start < 0 or start + length > y.shape[axis]:
        raise ValueError(f"tile needs rows [{start}, {start + length}) of a kernel result with "
                         f"{y.shape[axis]} rows")
    if start == 0 and length == y.shape[axis]:
        return y
    idx = [slice(None)] * y.ndim
    idx[axis] = slice(start, start + length)
    return y[tuple(idx)]


def run_layer(graph: Graph, lay: Layer, out_box: Box, onchip: Mapping[str, tuple[Box, np.ndarray]],
              weights: Mapping[str, np.ndarray], layers: LayerCache | None = None
              ) -> list[np.ndarray]:
    """Compute `out_box` of a layer's outputs from the boxes of its inputs held on chip
    (``layers``: the run's cache of static layer facts; without one they are worked out).

    Raises KernelFailure naming the layer and box when the tile's inputs do not give it.
    """
    try:
        return _run_layer(graph, lay, out_box, onchip, weights, layers)
    except KernelFailure:
        raise
    except (ValueError, KeyError, IndexError, TypeError, RuntimeError) as exc:
        n0, n1, r0, r1, c0, c1 = out_box
        raise KernelFailure(
            lay.name, lay.op, out_box,
            f"computing images [{n0}, {n1}), rows [{r0}, {r1}), columns [{c0}, {c1}) of "
            f"'{lay.outputs[0]}' failed: {type(exc).__name__}: {exc}") from exc


def _run_layer(graph: Graph, lay: Layer, out_box: Box,
               onchip: Mapping[str, tuple[Box, np.ndarray]], weights: Mapping[str, np.ndarray],
               layers: LayerCache | None) -> list[np.ndarray]:
    info = layers.of(lay) if layers is not None else layer_facts(graph, lay)
    if info.out_spatial and empty(out_box):
        # no row of the tile comes from here (a Concat's other input): nothing to run
        return [np.zeros(_box_shape(graph, t, out_box), np.float32) for t in lay.outputs if t]
    args, first_box = _tile_args(graph, lay, info, out_box, onchip, weights)
    if info.gathers_rows:
        return [gather_box(lay, info, args, out_box, first_box)]
    if info.shape_param is ShapeParam.TARGET_SHAPE:
        args[1] = _tile_target_shape(lay, info, out_box)
    if info.shape_param is ShapeParam.SLICE_BOUNDS:
        args = _slice_box_bounds(graph, lay, args)
    if info.shape_param is ShapeParam.EXPAND_SHAPE:
        args[1] = _tile_expand_shape(lay, args[0])
    if info.shape_param is ShapeParam.PAD_WIDTHS and first_box is not None \
            and _offset_axes(graph, lay):
        # the tile's own pads: the rows of its box outside the map; nothing to cut after
        args = _pad_box_widths(graph, lay, args, out_box, first_box)
        y = run_op(lay.op, info.attrs, args, lay.opset, num_outputs=len(lay.outputs))[0]
        return [_crop_output(np.asarray(y), lay, info, out_box, None)]
    if info.shape_param is ShapeParam.RESIZE_SIZES and len(args) == 4 \
            and lay.row_maps[0].kind is not MapKind.WHOLE:
        args = _resize_box_scales(graph, lay, args)
    if info.transposed and first_box is not None:
        return [_transposed_tile(lay, args, out_box, first_box)]
    attrs = info.attrs
    if info.window:
        attrs = _window_attrs(lay, info, out_box)
        if int(lay.attrs.get("count_include_pad", 0)):  # AveragePool's
            return [_avg_pool_including_pads(lay, attrs, args, out_box, info.in_hw)]
    if info.attention:  # the causal mask needs to know which query rows the tile holds,
        # and of how many keys in all (a causal tile is given its prefix of them)
        attrs = {**attrs, "query_offset": out_box[2],
                 "key_length": sum(graph.shapes[v][-2] for v in lay.fmap_inputs[2::2])}
    outs = run_op(lay.op, attrs, args, lay.opset, num_outputs=len(lay.outputs))
    return [_crop_output(np.asarray(y), lay, info, out_box, first_box) for y in outs]


def _tile_args(graph: Graph, lay: Layer, info: LayerFacts, out_box: Box,
               onchip: Mapping[str, tuple[Box, np.ndarray]], weights: Mapping[str, np.ndarray]
               ) -> tuple[list[np.ndarray | None], Box | None]:
    """The kernel's arguments for the tile: each input's box cut out of what the chip holds,
    the constants, the aligned operands cut to the box; and the box of the reference input
    (window layers: the data)."""
    args: list[np.ndarray | None] = [None] * info.n_args
    first_box: Box | None = None
    ref = 0 if info.window or info.transposed else info.ref
    for pos, i, name, layout, same in info.fmaps:
        want = out_box if same else input_box(graph, lay, i, out_box)
        have, arr = onchip[name]
        args[pos] = slice_box(arr, have, want, layout)
        if i == ref:
            first_box = want
    for pos, name in info.consts:
        args[pos] = weights.get(name, graph.constants.get(name))
    for pos, cuts in info.aligned:
        operand = np.asarray(args[pos])
        index: list[slice] = [slice(None)] * operand.ndim
        for axis, part in cuts:
            if operand.shape[axis] == lay.out_shape[axis - operand.ndim + len(lay.out_shape)]:
                # whole along the axis (not already cut to the box: a kept batch)
                index[axis] = slice(out_box[2 * part], out_box[2 * part + 1])
        args[pos] = operand[tuple(index)]
    return args, first_box


def gather_box(lay: Layer, info: LayerFacts, args: Sequence[np.ndarray | None], out_box: Box,
               first_box: Box | None) -> np.ndarray:
    """A gather of table rows (Graph.row_gathers) on a tile: the indices of the tile's box
    first, then exactly those rows fetched from the table in DRAM (the constants), a
    repeated index fetched again, as a DMA gather does. Gathering every index on chip and
    cropping after would fetch rows the tile does not hold."""
    table, indices = np.asarray(args[0]), np.asarray(args[1]).astype(np.int64)
    # the indices as the output's leading axes, each row one element wide: the crop of the
    # output box then leaves the box's indices
    keys = _crop_output(indices.reshape(indices.shape + (1,) * (table.ndim - 1)), lay, info,
                        out_box, first_box)
    picked = keys.reshape(keys.shape[:indices.ndim])
    rows = table.shape[0]
    if picked.size and (picked.min() < -rows or picked.max() >= rows):
        raise IndexError(f"an index of {lay.inputs[1]!r} is outside the {rows} rows of "
                         f"{lay.inputs[0]!r}")
    picked = np.where(picked < 0, picked + rows, picked)  # ONNX: negative counts from the end
    return table[picked.reshape(-1)].reshape(picked.shape + table.shape[1:])


def _tile_target_shape(lay: Layer, info: LayerFacts, out_box: Box) -> np.ndarray:
    """A Reshape's target shape for the tile's box."""
    # the target shape names the whole map; a tile reshapes only its own box: its images
    # always (a batch-tiled group), its rows and columns where they map one to one; rows
    # split or merged (planner.ir.layout.regrouped_layout) are however many the input
    # box's hold, and columns read whole stay whole, both cut to the tile's box after
    target = list(lay.out_shape)
    maps = (None, lay.row_maps[0], lay.col_maps[0])
    for part, axis, lo, hi in _box_parts(info.out_layout, out_box):
        m = maps[part]
        if m is None or (info.out_spatial and m.kind is MapKind.IDENTITY):
            target[axis] = hi - lo
        elif info.out_spatial and part == 1 and m.kind in (MapKind.WINDOW, MapKind.UPSAMPLE):
            target[axis] = -1
    return np.array(target, dtype=np.int64)


def _tile_expand_shape(lay: Layer, x: np.ndarray | None) -> np.ndarray:
    """An Expand's shape for a tile: the shape names the whole map, but the tile's input may
    be a box of it (rows of a repeated key cache, [1, kv, 1, L, d] -> [1, kv, rep, L, d]).
    Only the input's unit axes broadcast, to their whole extent (cut to the box after);
    every other axis keeps the extent the tile holds (a 1 in the shape keeps it, as ONNX's
    two-way broadcast does)."""
    out = lay.out_shape
    have = np.shape(x) if x is not None else ()
    offset = len(out) - len(have)
    target = [out[axis] if axis < offset or have[axis - offset] == 1 else 1
              for axis in range(len(out))]
    return np.array(target, dtype=np.int64)


def _resize_box_scales(graph: Graph, lay: Layer, args: list[np.ndarray | None]
                       ) -> list[np.ndarray | None]:
    """A Resize's `sizes` name the whole map; a tile upsamples its own rows by the same
    scales."""
    full_in, full_out = graph.shapes[lay.fmap_inputs[0]], lay.out_shape
    scales = np.array([o / i for o, i in zip(full_out, full_in, strict=True)], np.float32)
    return [args[0], args[1] if args[1] is not None else np.zeros(0, np.float32), scales]


def _offset_axes(graph: Graph, lay: Layer) -> dict[int, tuple[int, AxisMap]]:
    """{axis: (box part, map)} of the rows and columns a Slice or Pad maps by an offset."""
    layout = graph.layout(lay.fmap_inputs[0])
    return {axis: (part, m) for part, axis, m in ((1, layout.row_axis, lay.row_maps[0]),
                                                  (2, layout.col_axis, lay.col_maps[0]))
            if axis is not None and m.kind is MapKind.OFFSET}


def _pad_box_widths(graph: Graph, lay: Layer, args: list[np.ndarray | None], out_box: Box,
                    in_box: Box) -> list[np.ndarray | None]:
    """A constant Pad's pads name the whole map; along rows or columns it pads with an
    offset (planner.ir.index_maps) a tile pads its input box to its own box:
    the rows before the box's first input row and after its last."""
    rank = graph.layout(lay.fmap_inputs[0]).rank
    given = np.array(args[1], np.int64).reshape(-1)
    axes = list(range(rank)) if len(args) < 4 or args[3] is None \
        else [int(a) % rank for a in np.array(args[3]).reshape(-1)]
    pads = np.zeros(2 * rank, np.int64)
    for i, axis in enumerate(axes):
        pads[axis], pads[rank + axis] = given[i], given[len(axes) + i]
    for axis, (part, m) in _offset_axes(graph, lay).items():
        lo, hi = out_box[2 * part], out_box[2 * part + 1]
        a0, a1 = in_box[2 * part], in_box[2 * part + 1]
        if a1 <= a0:  # the box lies in the padding only
            pads[axis], pads[rank + axis] = hi - lo, 0
        else:
            pads[axis], pads[rank + axis] = a0 + m.pad - lo, hi - (a1 + m.pad)
    return [args[0], pads, *(args[2:3] if len(args) > 2 else [])]


def _slice_box_bounds(graph: Graph, lay: Layer, args: list[np.ndarray | None]
                      ) -> list[np.ndarray | None]:
    """A Slice's starts and ends name the whole map; along rows or columns it cuts with an
    offset (planner.ir.index_maps) the input box is already the tile's
    rows, so those axes are taken whole."""
    layout = graph.layout(lay.fmap_inputs[0])
    offset = list(_offset_axes(graph, lay))
    if not offset or args[1] is None or args[2] is None:
        return args
    starts = np.array(args[1], np.int64).reshape(-1).copy()
    ends = np.array(args[2], np.int64).reshape(-1).copy()
    axes = np.arange(len(starts)) if len(args) < 4 or args[3] is None \
        else np.array(args[3], np.int64).reshape(-1)
    for k, axis in enumerate(axes):
        if int(axis) % layout.rank in offset:
            starts[k], ends[k] = 0, np.iinfo(np.int64).max
    return [args[0], starts, ends, *args[3:]]


def _box_shape(graph: Graph, tensor: str, box: Box) -> tuple[int, ...]:
    """Shape of a tensor's box: its extents along batch, rows and columns, the rest whole."""
    shape = list(graph.shapes[tensor])
    for _, axis, lo, hi in _box_parts(graph.layout(tensor), box):
        shape[axis] = max(0, hi - lo)
    return tuple(shape)


def _box_parts(layout: Layout, box: Box) -> list[tuple[int, int, int, int]]:
    """(part, axis, start, end) of a box along the batch (part 0), row (1) and column (2)
    axes the layout has."""
    return [(k, axis, box[2 * k], box[2 * k + 1])
            for k, axis in enumerate((layout.batch_axis, layout.row_axis, layout.col_axis))
            if axis is not None]


def _avg_pool_including_pads(lay: Layer, attrs: dict[str, Any], args: list[np.ndarray | None],
                             out_box: Box, in_hw: tuple[int, int]) -> np.ndarray:
    """AveragePool counting the model's pads but not the ceil_mode overhang, on a tile.

    The tile's pads mix the model's pads with rows past them (ceil_mode), so pool over real
    cells only and rescale by (real cells / cells inside the model's padded map) per window.
    """
    y = np.asarray(run_op(lay.op, {**attrs, "count_include_pad": 0}, args, lay.opset)[0])
    pads = list(lay.attrs.get("pads", [0, 0, 0, 0]))
    factors = []
    for axis, (lo, hi) in enumerate(((out_box[2], out_box[3]), (out_box[4], out_box[5]))):
        m = (lay.row_maps if axis == 0 else lay.col_maps)[0]
        size = in_hw[axis]
        start = np.arange(lo, hi) * m.stride - m.pad
        end = start + (m.kernel - 1) * m.dilation + 1
        real = np.minimum(end, size) - np.maximum(start, 0)
        inside = np.minimum(end, size + pads[2 + axis]) - np.maximum(start, -pads[axis])
        factors.append(real / np.maximum(inside, 1))
    scale = np.multiply.outer(factors[0], factors[1]).astype(np.float32)
    return (y * scale).astype(np.float32)


def _transposed_tile(lay: Layer, args: list[np.ndarray | None], out_box: Box,
                     in_box: Box) -> np.ndarray:
    """ConvTranspose on a tile: scatter the input slice (no pads, no bias) into the tile's box.

    Output rows no input reaches (output padding, kernel smaller than stride) hold only the
    bias, so the box starts as the bias and receives the slice's contributions. ONNX defines
    ConvTranspose channel-first, so its rows and columns are the last two axes.
    """
    x, w = args[0], args[1]
    bias = args[2] if len(args) > 2 else None
    if x is None or w is None:
        raise ValueError(f"{lay.name}: ConvTranspose without input or weights")
    cout = lay.out_shape[1]
    rows, cols = out_box[3] - out_box[2], out_box[5] - out_box[4]
    y = np.zeros((out_box[1] - out_box[0], cout, rows, cols), np.float32)
    if x.shape[-2] and x.shape[-1]:
        attrs = {k: v for k, v in lay.attrs.items()
                 if k not in ("output_shape", "output_padding", "auto_pad")}
        attrs["pads"] = [0, 0, 0, 0]
        part = np.asarray(run_op(lay.op, attrs, [x, w], lay.opset)[0], np.float32)
        r0 = lay.row_maps[0].virtual_start(in_box[2]) - out_box[2]
        c0 = lay.col_maps[0].virtual_start(in_box[4]) - out_box[4]
        # overlap of the scattered slice [r0, r0 + len) with the box [0, rows)
        ra, rb = max(0, r0), min(rows, r0 + part.shape[-2])
        ca, cb = max(0, c0), min(cols, c0 + part.shape[-1])
        if ra < rb and ca < cb:
            y[..., ra:rb, ca:cb] = part[..., ra - r0:rb - r0, ca - c0:cb - c0]
    if bias is not None:
        y += np.asarray(bias, np.float32).reshape(1, cout, 1, 1)
    return y


def _crop_output(y: np.ndarray, lay: Layer, info: LayerFacts, out_box: Box,
                 first_box: Box | None) -> np.ndarray:
    """Cut the tile's box out of a kernel result computed on a larger (virtual) range."""
    layout = info.out_layout if y.ndim == info.out_layout.rank else layout_of(y.shape)
    if not lay.batch_preserving and layout.batch_axis is not None:
        y = _crop_axis(y, layout.batch_axis, out_box[0], out_box[1] - out_box[0])
    if info.crop_spatial and first_box is not None and layout.spatial:
        ref = info.ref
        for axis, m, lo, hi, a0 in ((layout.row_axis, lay.row_maps[ref], out_box[2],
                                     out_box[3], first_box[2]),
                                    (layout.col_axis, lay.col_maps[ref], out_box[4],
                                     out_box[5], first_box[4])):
            if axis is None:  # a token sequence has no columns
                continue
            whole = m.kind is MapKind.WHOLE or not info.in_spatial
            start = lo if whole else lo - m.virtual_start(a0)
            y = _crop_axis(y, axis, start, hi - lo)
    return y.astype(np.float32, copy=False) if y.dtype == np.float64 else y
