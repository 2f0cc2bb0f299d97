"""Execute a plan on the modeled chip, tile by tile, counting every byte moved.

The emulator shares only the region function (planner.geometry.regions.tile_regions)
with the planner: it slices real arrays for each tile, runs the layers with the
NumPy kernels, and counts bytes from the arrays it actually moves, so a wrong
closed form in the cost model shows up as a counter mismatch. Its cycles come from its
own clock (emulator.clock), which plays the tiles it ran on the chip's DRAM link and cores.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from math import ceil, floor
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from fuseplan.emulator.attention import run_head_chunks
from fuseplan.emulator.chunks import Compute, WeightStream, _take
from fuseplan.emulator.clock import GroupRun, GroupTime, TileEvents, simulate_plan
from fuseplan.emulator.hidden import run_stretch
from fuseplan.emulator.kernels import run_op
from fuseplan.emulator.passes import run_passes
from fuseplan.emulator.reuse import run_reuse_tiles
from fuseplan.emulator.weights_outer import run_weights_outer
from fuseplan.hardware.chip import Chip
from fuseplan.planner.cost.counters import Counters
from fuseplan.planner.geometry.attention import attention_heads, online_attention
from fuseplan.planner.geometry.bands import band_columns, band_overflows, cluster_loads
from fuseplan.planner.geometry.hidden import Stretch, makes_chunks, stretches
from fuseplan.planner.geometry.in_place import in_place_hosts
from fuseplan.planner.geometry.passes import pass_split, passes_make_chunks
from fuseplan.planner.geometry.regions import (
    Box,
    GroupIO,
    anchor_extent,
    box_elems,
    empty,
    full_box,
    group_io,
    in_group_uses,
    input_box,
    iter_tiles,
    tile_regions,
)
from fuseplan.planner.geometry.reload import reloaded_inputs
from fuseplan.planner.geometry.rounds import leads_round, round_size
from fuseplan.planner.ir.graph import AxisMap, Graph, Layer, MapKind
from fuseplan.planner.ir.layout import Layout, layout_of
from fuseplan.planner.ir.ops import Accumulate, MapRule, OpClass, ShapeParam, op_spec
from fuseplan.planner.plan.checks import check_bands
from fuseplan.planner.plan.data import Group, Plan


class KernelFailure(Exception):
    """A layer could not be computed on a tile's box: the plan asked the emulator for
    something its regions do not provide (a planner bug, not bad input)."""

    def __init__(self, layer: str, op: str, box: Box, detail: str) -> None:
        super().__init__(detail)
        self.layer, self.op, self.box, self.detail = layer, op, box, detail


class EmulationError(Exception):
    """A plan the emulator cannot run: which group, tile and layer, and what disagreed."""

    def __init__(self, group: int, tile: int | None, layer: str | None, detail: str) -> None:
        where = f"group {group}"
        if tile is not None:
            where += f", tile {tile}"
        if layer is not None:
            where += f", layer '{layer}'"
        super().__init__(f"the emulator cannot run this plan at {where}: {detail}")
        self.group, self.tile, self.layer, self.detail = group, tile, layer, detail


@dataclass(frozen=True)
class Violation:
    """An on-chip buffer that overflowed while a tile ran."""

    group: int
    tile: int
    level: str  # sram, nram, wram
    needed_bytes: int
    capacity_bytes: int

    @property
    def over_bytes(self) -> int:
        return self.needed_bytes - self.capacity_bytes

    def describe(self) -> str:
        """One line for reports."""
        return (f"group {self.group} tile {self.tile}: {self.level.upper()} needs "
                f"{self.needed_bytes} B, has {self.capacity_bytes} B ({self.over_bytes} B over)")


@dataclass
class EmulationResult:
    """Outputs and counters of one emulated plan.

    Each group's counters hold what the emulator counted and the cycles of the clock
    (emulator.clock); energy_pj is left 0: pricing the counters is the cost model's job
    (planner.app.verify fills it in).
    """

    outputs: dict[str, np.ndarray]
    groups: list[Counters]
    violations: list[Violation] = field(default_factory=list)
    tensors: dict[str, np.ndarray] = field(default_factory=dict)  # everything written to DRAM
    times: list[GroupTime] = field(default_factory=list)  # per group, from the clock

    def timeline(self) -> list[dict[str, int]]:
        """Per group, from the clock: start and end cycle (groups run back to back), the
        cycle its prefetched weights started loading (in the previous group's first idle
        DRAM gap), DRAM and compute busy cycles (the prefetch's share of the link counted in
        the group's own; a banded group's busiest band)."""
        return [{"group": i, "start_cycle": t.start, "end_cycle": t.end,
                 "prefetch_start_cycle": t.prefetch_start,
                 "dram_busy_cycles": ceil(t.dram_busy), "compute_busy_cycles": t.compute_busy}
                for i, t in enumerate(self.times)]

    @property
    def totals(self) -> Counters:
        total = Counters()
        for c in self.groups:
            total = total + c
        return total


def _slice(arr: np.ndarray, have: Box, want: Box, layout: Layout) -> np.ndarray:
    """Cut box `want` out of an array holding box `have` of a tensor of this layout."""
    return arr[layout.index(slice(want[0] - have[0], want[1] - have[0]),
                            slice(want[2] - have[2], want[3] - have[2]),
                            slice(want[4] - have[4], want[5] - have[4]))]


@dataclass(frozen=True)
class _LayerStatic:
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


@dataclass
class LayerCache:
    """Static facts of one graph's layers, worked out once each: emulate() makes one per
    run and hands it down, so nothing outlives the run."""

    graph: Graph
    facts: dict[str, _LayerStatic] = field(default_factory=dict)

    def of(self, lay: Layer) -> _LayerStatic:
        """The layer's static facts (computed on first use)."""
        info = self.facts.get(lay.name)
        if info is None:
            info = self.facts[lay.name] = _layer_static(self.graph, lay)
        return info


def _layer_static(graph: Graph, lay: Layer) -> _LayerStatic:
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
    # rows, planner.front.windows) are computed on their input box and cut
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
    return _LayerStatic(
        fmaps=tuple(fmaps), consts=tuple(consts), n_args=len(lay.inputs),
        aligned=_aligned_constants(graph, lay, [*consts, *whole_fmaps], out_layout, ref),
        out_spatial=out_spatial, window=window,
        transposed=kind is MapKind.TRANSPOSED and out_spatial,
        in_hw=first_layout.dims(first)[2:], attrs=attrs,
        crop_spatial=out_spatial and not window, in_spatial=in_spatial, ref=ref,
        out_layout=out_layout, shape_param=op_spec(lay.op).shape_param,
        attention=op_spec(lay.op).maps is MapRule.ATTENTION)


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


def _window_attrs(lay: Layer, info: _LayerStatic, out_box: Box) -> dict[str, Any]:
    """Kernel attributes with the pads this tile needs: the clipped-away part of the window."""
    (h, w), rm, cm = info.in_hw, lay.row_maps[0], lay.col_maps[0]
    r0, r1 = rm.needed(out_box[2], out_box[3], h)
    c0, c1 = cm.needed(out_box[4], out_box[5], w)
    attrs = dict(info.attrs)
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
    info = layers.of(lay) if layers is not None else _layer_static(graph, lay)
    if info.out_spatial and empty(out_box):
        # no row of the tile comes from here (a Concat's other input): nothing to run
        return [np.zeros(_box_shape(graph, t, out_box), np.float32) for t in lay.outputs if t]
    args: list[np.ndarray | None] = [None] * info.n_args
    first_box: Box | None = None  # the box of the reference input (window layers: the data)
    ref = 0 if info.window or info.transposed else info.ref
    for pos, i, name, layout, same in info.fmaps:
        want = out_box if same else input_box(graph, lay, i, out_box)
        have, arr = onchip[name]
        args[pos] = _slice(arr, have, want, layout)
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
    if info.shape_param is ShapeParam.TARGET_SHAPE:
        # the target shape names the whole map; a tile reshapes only its own box: its images
        # always (a batch-tiled group), its rows and columns where they map one to one
        target = list(lay.out_shape)
        rows_too = info.out_spatial and lay.row_maps[0].kind is MapKind.IDENTITY
        for axis, lo, hi in _box_axes(info.out_layout, out_box):
            if rows_too or axis == info.out_layout.batch_axis:
                target[axis] = hi - lo
        if info.out_spatial and lay.row_maps[0].kind in (MapKind.WINDOW, MapKind.UPSAMPLE) \
                and info.out_layout.row_axis is not None:
            # a window partition's step (planner.front.windows): the input box's rows give
            # however many output rows they hold, cut to the tile's box below
            target[info.out_layout.row_axis] = -1
        args[1] = np.array(target, dtype=np.int64)
    if info.shape_param is ShapeParam.SLICE_BOUNDS:
        args = _slice_box_bounds(graph, lay, args)
    if info.shape_param is ShapeParam.PAD_WIDTHS and first_box is not None \
            and _offset_axes(graph, lay):
        # the tile's own pads: the rows of its box outside the map; nothing to cut after
        args = _pad_box_widths(graph, lay, args, out_box, first_box)
        y = run_op(lay.op, info.attrs, args, lay.opset, num_outputs=len(lay.outputs))[0]
        return [_crop_output(np.asarray(y), lay, info, out_box, None)]
    if info.shape_param is ShapeParam.RESIZE_SIZES and len(args) == 4 \
            and lay.row_maps[0].kind is not MapKind.WHOLE:
        # `sizes` names the whole map; a tile upsamples its own rows by the same scales
        full_in, full_out = graph.shapes[lay.fmap_inputs[0]], lay.out_shape
        scales = np.array([o / i for o, i in zip(full_out, full_in, strict=True)], np.float32)
        args = [args[0], args[1] if args[1] is not None else np.zeros(0, np.float32), scales]
    if info.transposed and first_box is not None:
        return [_transposed_tile(lay, args, out_box, first_box)]
    attrs = info.attrs
    if info.window:
        attrs = _window_attrs(lay, info, out_box)
        if int(lay.attrs.get("count_include_pad", 0)):  # AveragePool's
            return [_avg_pool_including_pads(lay, attrs, args, out_box, info.in_hw)]
    if info.attention:  # the causal mask needs to know which query rows the tile holds
        attrs = {**attrs, "query_offset": out_box[2]}
    outs = run_op(lay.op, attrs, args, lay.opset, num_outputs=len(lay.outputs))
    return [_crop_output(np.asarray(y), lay, info, out_box, first_box) for y in outs]


def _offset_axes(graph: Graph, lay: Layer) -> dict[int, tuple[int, AxisMap]]:
    """{axis: (box part, map)} of the rows and columns a Slice or Pad maps by an offset."""
    layout = graph.layout(lay.fmap_inputs[0])
    return {axis: (part, m) for part, axis, m in ((1, layout.row_axis, lay.row_maps[0]),
                                                  (2, layout.col_axis, lay.col_maps[0]))
            if axis is not None and m.kind is MapKind.OFFSET}


def _pad_box_widths(graph: Graph, lay: Layer, args: list[np.ndarray | None], out_box: Box,
                    in_box: Box) -> list[np.ndarray | None]:
    """A constant Pad's pads name the whole map; along rows or columns it pads with an
    offset (planner.front.graph_build._pad_maps) a tile pads its input box to its own box:
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
    offset (planner.front.graph_build._slice_maps) the input box is already the tile's
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
    for axis, lo, hi in _box_axes(graph.layout(tensor), box):
        shape[axis] = max(0, hi - lo)
    return tuple(shape)


def _box_axes(layout: Layout, box: Box) -> list[tuple[int, int, int]]:
    """(axis, start, end) of a box along the batch, row and column axes the layout has."""
    return [(axis, box[2 * k], box[2 * k + 1])
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


def _crop_output(y: np.ndarray, lay: Layer, info: _LayerStatic, out_box: Box,
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


@dataclass
class Fold:
    """The on-chip accumulator of a reduction over rows and columns: each tile's part of its
    input is folded in; the mean divides by the whole map's size once the last tile is in."""

    how: Accumulate
    layout: Layout
    count: int  # input elements per output element over the whole map
    seen: np.ndarray  # (N, H, W): positions already folded in
    channels: int = 1  # of the input (and of the result)
    acc: np.ndarray | None = None

    @classmethod
    def of(cls, graph: Graph, lay: Layer) -> Fold:
        """The accumulator of a reduction layer (planner.geometry.regions.accumulated_input)."""
        x = lay.fmap_inputs[0]
        layout = graph.layout(x)
        n, c, h, w = layout.dims(graph.shapes[x])
        return cls(op_spec(lay.op).accumulate, layout, h * w, np.zeros((n, h, w), dtype=bool),
                   c)

    def add(self, part: np.ndarray, box: Box, channels: tuple[int, int] | None = None,
            last: bool = True) -> np.ndarray:
        """Fold a tile's part (box `box` of the input) in; returns that tile's partial result
        (what its cores made). Boxes of a parameter table may overlap (its tail mode
        "overlap"): a sum counts each position once, so positions already in are masked.
        ``channels``: the part holds only these channels of the input (a hidden chunk,
        emulator.hidden), folded into their slice of the accumulator; the positions count
        as folded in once the tile's ``last`` chunk is."""
        folded: np.ndarray
        axes = self.layout.tiled_axes
        seen = self.seen[box[0]:box[1], box[2]:box[3], box[4]:box[5]]
        if self.how in (Accumulate.SUM, Accumulate.MEAN) and seen.any():
            shape = [1] * part.ndim
            order = (self.layout.batch_axis, self.layout.row_axis, self.layout.col_axis)
            for k, a in enumerate(order):
                if a is not None:
                    shape[a] = seen.shape[k]
            part = part * np.logical_not(seen).reshape(shape)
        if last:
            seen[...] = True
        if self.how in (Accumulate.SUM, Accumulate.MEAN):
            folded = np.asarray(np.sum(part, axis=axes, keepdims=True, dtype=np.float32))
        elif self.how is Accumulate.MAX:
            folded = np.asarray(np.max(part, axis=axes, keepdims=True))
        else:
            folded = np.asarray(np.min(part, axis=axes, keepdims=True))
        if self.acc is None:
            if channels is None:
                self.acc = folded.copy()
                return folded
            shape = list(folded.shape)
            shape[self.layout.channel_axes[0]] = self.channels
            # channels no chunk has folded yet hold the fold's identity
            limits = np.iinfo(folded.dtype) if np.issubdtype(folded.dtype, np.integer) \
                else np.finfo(folded.dtype)
            start = {Accumulate.MAX: limits.min, Accumulate.MIN: limits.max}.get(self.how, 0)
            self.acc = np.full(shape, start, dtype=folded.dtype)
        into = self.acc if channels is None else _take(self.acc, self.layout.channel_axes[0],
                                                       *channels)
        if self.how is Accumulate.MAX:
            np.maximum(into, folded, out=into)
        elif self.how is Accumulate.MIN:
            np.minimum(into, folded, out=into)
        else:
            into += folded
        return folded

    def result(self) -> np.ndarray:
        """The final value, after the last tile."""
        if self.acc is None:
            raise ValueError("an accumulator read before any tile was folded in")
        if self.how is Accumulate.MEAN:
            return np.asarray(self.acc / np.float32(self.count), dtype=np.float32)
        return self.acc


@dataclass
class Tally:
    """Counters of one group as its tiles run, with the worst overflow per level."""

    chip: Chip
    group: Group
    weight_bytes: int
    read: int = 0
    write: int = 0
    weight_read: int = 0
    macs: int = 0
    vector_ops: int = 0
    core: int = 0
    peak: int = 0
    tiles: int = 0
    first: int = 0
    last: int = 0
    worst: dict[str, Violation] = field(default_factory=dict)
    checks: bool = True  # capacity per step (a band's tally leaves it to the whole group)
    events: list[TileEvents] = field(default_factory=list)  # per tile, for the clock
    ops_before: tuple[int, int] = (0, 0)  # (MACs, vector ops) counted before this tile
    stream: WeightStream | None = None  # a streaming group's chunks (emulator.chunks)
    core_weight: int = 0  # weight bytes the cores read, over all tiles
    round_tiles: int = 1  # tiles per round sharing each streamed read (planner.geometry.rounds)

    @property
    def onchip_weights(self) -> int:
        """Weights held in SRAM at every step on single-memory chips: all of them when
        resident, the reserved pair of a streaming halo-reusing group (bands use this)."""
        if not self.chip.unified:
            return 0
        if self.group.weights_resident:
            return self.weight_bytes
        return self.stream.reserved if self.stream is not None else 0

    def weights_now(self, layer: int | None) -> int:
        """Weight bytes in the weight memory while layer `layer` of the group runs (None: a
        halo-reusing group's step, which keeps room for the largest streamed pair)."""
        if self.group.weights_resident:
            return self.weight_bytes
        if self.stream is None:
            return 0
        return self.stream.reserved if layer is None else self.stream.held[layer]

    def ops(self, lay: Layer, outputs: int) -> None:
        """Count the work of computing `outputs` elements of a layer."""
        if lay.is_main:
            self.macs += outputs * lay.macs_per_output
        else:
            self.vector_ops += outputs * lay.macs_per_output

    def step(self, tile: int, fmap_bytes: int, layer: int | None = None,
             weights: int | None = None, held: int = 0) -> None:
        """Feature-map bytes on chip after a layer ran (its index in the group; None for a
        halo-reusing group's step): peak and capacity, with the weights on chip then (as
        the stream holds them at that layer, unless `weights` says). ``held``: the part of
        `fmap_bytes` the group holds for all its tiles (a group in passes: held inputs,
        held maps, tail results), which stays in SRAM and takes no core's NRAM."""
        weights = self.weights_now(layer) if weights is None else weights
        in_sram = weights if self.chip.unified else 0
        live = fmap_bytes + in_sram
        self.peak = max(self.peak, live)
        if not self.checks:
            return
        for v in _capacity(self.chip, self.group.id, tile, live, in_sram + held, weights):
            if v.level not in self.worst or v.needed_bytes > self.worst[v.level].needed_bytes:
                self.worst[v.level] = v

    def compute(self, run: Compute, lay: Layer, weights: Mapping[str, np.ndarray]
                ) -> list[np.ndarray]:
        """A layer's outputs from `run` (given the weights to use): chunk by chunk when the
        group streams the layer's weights in chunks."""
        return self.stream.run(lay, weights, run) if self.stream is not None else run(weights)

    def tile(self, index: int, loaded: int, written: int, weights: int | None = None,
             used: int | None = None) -> None:
        """A tile's DRAM traffic: its loads, its stores, and the weights it streams (or
        `weights` loaded at this step), with `used` weight bytes the cores read for it."""
        if weights is None:
            first = index == 0 if self.group.weights_resident \
                else leads_round(index, self.round_tiles)
            weights = self.weight_bytes if first else 0
        self.core_weight += self.weight_bytes if used is None else used
        self.tiles += 1
        self.read += loaded + weights
        self.weight_read += weights
        self.write += written
        if index == 0:
            self.first = loaded + weights
        self.last = written
        macs, vector_ops = self.ops_before
        self.events.append(TileEvents(loaded, weights, self.macs - macs,
                                      self.vector_ops - vector_ops, written))
        self.ops_before = (self.macs, self.vector_ops)

    def counters(self, graph: Graph, io: GroupIO) -> Counters:
        """The group's byte and work counters (its time comes from the clock, see emulate)."""
        dt = self.chip.dtype_bytes
        return Counters(
            dram_read_bytes=self.read, dram_write_bytes=self.write,
            weight_read_bytes=self.weight_read,
            redundant_read_bytes=self.read - self.weight_read - _once(graph, io, dt),
            sram_peak_bytes=self.peak, macs=self.macs, vector_ops=self.vector_ops,
            core_fmap_bytes=self.core, core_weight_bytes=self.core_weight,
            first_load_bytes=self.first, last_store_bytes=self.last)


def emulate_group(graph: Graph, group: Group, chip: Chip, dram: dict[str, np.ndarray],
                  weights: Mapping[str, np.ndarray], layers: LayerCache | None = None
                  ) -> tuple[Counters, GroupRun, list[Violation]]:
    """Run one group over all its tiles; reads and writes `dram` (tensor name -> full array).

    Returns its counters (no time yet), its tiles' events for the clock and its overflows.
    ``layers``: the run's cache of static layer facts (emulate() passes one).

    Each tile loads the boxes of its inputs (halo included), computes every layer on its
    box and stores its box of the outputs; halo-reusing groups run in emulator.reuse.
    """
    io = group_io(graph, group.layers)
    dt = chip.dtype_bytes
    stream = None if group.weights_resident else WeightStream.of(graph, io, group, weights, dt)
    tally = Tally(chip, group, sum(int(graph.constants[w].size) for w in io.weights) * dt,
                  stream=stream, round_tiles=round_size(chip, io, group.halo_reuse))
    layers = layers if layers is not None else LayerCache(graph)
    if io.accumulated and (group.halo_reuse or group.placement.weights_outer):
        raise EmulationError(group.id, None, graph.producer[io.accumulated[0]],
                             "a group ending in an accumulating reduction runs its tiles "
                             "one by one (no halo reuse, no weights-outer loop)")
    heads = attention_heads(graph, io)
    if group.placement.hidden_chunks > 1 and heads is not None:
        p = group.placement
        if heads % p.hidden_chunks or p.halo_reuse or p.weights_outer or p.passes > 1:
            raise EmulationError(group.id, None, io.layers[0], f"the plan runs this fused "
                                 f"attention in {p.hidden_chunks} chunks of its {heads} "
                                 "heads, which they do not divide, or with halos reused, "
                                 "weights outer or passes")
        anchors = list(group.boxes if group.boxes is not None
                       else iter_tiles(graph, io, group.tile))
        run_head_chunks(graph, group, io, anchors, dram, weights, tally, layers, heads)
        return tally.counters(graph, io), _group_run(group, [tally]), list(tally.worst.values())
    found: tuple[Stretch, ...] = ()
    if group.placement.hidden_chunks > 1 and group.placement.passes == 1:
        found = stretches(graph, io)
        p = group.placement
        if not found or p.halo_reuse or p.weights_outer or group.boxes \
                or not all(makes_chunks(s, p.hidden_chunks) for s in found):
            raise EmulationError(group.id, None, None, f"the plan runs this group in "
                                 f"{p.hidden_chunks} hidden chunks, but it holds no stretch "
                                 "(a widening layer, per-element layers, a narrowing layer) "
                                 f"with {p.hidden_chunks} chunks of channels, or its halos "
                                 "are reused, or its weights sweep the tiles")
    if group.placement.passes > 1:
        split = pass_split(graph, group.layers, group.placement.inputs_held,
                           group.placement.maps_held)
        if split is None or split.count != group.placement.passes \
                or not group.weights_resident or group.halo_reuse \
                or group.placement.weights_outer or group.boxes \
                or not passes_make_chunks(graph, split, group.placement.hidden_chunks):
            raise EmulationError(group.id, None, None, f"the plan runs this group in "
                                 f"{group.placement.passes} passes, but it does not hold "
                                 f"{group.placement.passes - 1} reductions feeding back into "
                                 "it on vectors, or its weights stream, or its halos are "
                                 "reused, or its weights sweep the tiles, or its passes hold "
                                 f"no stretch making {group.placement.hidden_chunks} hidden "
                                 "chunks")
        run_passes(graph, group, split, dram, weights, tally, layers, chip)
        return tally.counters(graph, io), _group_run(group, [tally]), list(tally.worst.values())
    if group.halo_reuse and group.tile.bands > 1:
        return _run_bands(graph, group, chip, dram, weights, io, layers)
    if group.halo_reuse:
        run_reuse_tiles(graph, group, chip, dram, weights, tally, layers=layers)
        return tally.counters(graph, io), _group_run(group, [tally]), list(tally.worst.values())
    if group.placement.weights_outer:
        run_weights_outer(graph, group, chip, dram, weights, tally, layers)
        return tally.counters(graph, io), _group_run(group, [tally]), list(tally.worst.values())
    anchors = list(group.boxes if group.boxes is not None else iter_tiles(graph, io, group.tile))
    run_tiles(graph, group, io, anchors, dram, weights, tally, layers, hidden=found)
    return tally.counters(graph, io), _group_run(group, [tally]), list(tally.worst.values())


def run_tiles(graph: Graph, group: Group, io: GroupIO, anchors: Sequence[Box],
              dram: dict[str, np.ndarray], weights: Mapping[str, np.ndarray], tally: Tally,
              layers: LayerCache, *, held: Mapping[str, tuple[Box, np.ndarray]] | None = None,
              first: int = 0, kept: frozenset[str] = frozenset(),
              used_weights: int | None = None, preloaded: int = 0,
              hidden: Sequence[Stretch] = (), fills: Mapping[str, np.ndarray] | None = None
              ) -> dict[str, Fold]:
    """Run `io`'s layers tile by tile over `anchors` (halos recomputed), reading and
    writing `dram` and counting into `tally`; returns the accumulators of its reductions.

    ``held``: tensors already on chip for every tile (not loaded, never freed);
    ``first``: the index of the first tile (a second pass numbers on from the first);
    ``kept``: accumulated outputs kept on chip rather than stored after the last tile;
    ``used_weights``: weight bytes the cores read per tile (default: all the group's);
    ``preloaded``: bytes loaded into ``held`` before the first tile (counted with it);
    ``hidden``: stretches run in the placement's hidden chunks (emulator.hidden);
    ``fills``: on-chip buffers, whole maps, into which every tile of those maps made here is
    written (a pooled map held for later passes), on chip at every step; the tile's box of
    such a map is a view of its buffer, not counted again (GroupIO.in_place).
    """
    dt = tally.chip.dtype_bytes
    held = held or {}
    fills = fills or {}
    filled = sum(b.size for b in fills.values()) * dt
    kept_for_all = held_for_all(held, fills, dt)
    last_use = _last_use(graph, io)
    uses = in_group_uses(graph, io)
    hosts = in_place_hosts(graph, io)
    # inputs dropped after a step and loaded again at a later one (planner.geometry.reload)
    reloaded = reloaded_inputs(graph, io) if group.placement.inputs_reloaded else {}
    drops = {end: [t for t, (e, _) in reloaded.items() if e == end]
             for end, _ in reloaded.values()}
    loads = {at: [t for t, (_, a) in reloaded.items() if a == at]
             for _, at in reloaded.values()}
    folds = {t: Fold.of(graph, graph.layer(graph.producer[t])) for t in io.accumulated}
    starts = {s.widen: s for s in hidden}
    attention = online_attention(graph, io)
    streamed = attention.streamed if attention is not None else {}
    # the steps a streamed input is on chip, a chunk at a time: its first to its last reader
    stream_steps = {t: [i for i, name in enumerate(io.layers)
                        if t in graph.layer(name).fmap_inputs] for t in streamed}
    for k, tile_box in enumerate(anchors):
        ti = first + k
        boxes = tile_regions(graph, io, tile_box)
        onchip: dict[str, tuple[Box, np.ndarray]] = dict(held)
        streams: dict[str, tuple[Box, np.ndarray]] = {}
        loaded = nxt = 0
        for t in io.inputs:  # DRAM -> SRAM: the tile's box of every input, halo included
            layout = graph.layout(t)
            arr = _slice(dram[t], _full(dram[t], layout), boxes[t], layout)
            loaded += arr.size * dt
            tally.core += arr.size * dt * (1 + uses.get(t, 0))
            if t in streamed:  # read chunk by chunk by the fused attention reading it
                streams[t] = (boxes[t], arr)
                nxt += attention.onchip_elems(t, arr.size) * dt  # type: ignore[union-attr]
            else:
                onchip[t] = (boxes[t], arr)
                nxt += arr.size * dt
        # a second buffer holds the next tile's loads (held tensors are loaded once)
        prefetch = nxt if group.double_buffered else 0
        if k == 0:
            loaded += preloaded
        inside = -1  # the last layer of the stretch running now
        for i, name in enumerate(io.layers):
            lay = graph.layer(name)
            out0 = lay.outputs[0]
            if i <= inside:
                continue
            if name in starts:  # a stretch: chunk by chunk, up to its narrowing layer
                s = starts[name]
                inside = io.layers.index(s.narrow)
                acc = run_stretch(graph, group, io, s, group.placement.hidden_chunks, ti,
                                  boxes, onchip, weights, tally, layers, held,
                                  prefetch + filled, folds.get(s.out), fills)
                keep_outputs(graph.layer(s.narrow), boxes[s.out], [acc], onchip, tally, uses)
                _free(onchip, last_use, inside, io, held)
                continue
            for t in loads.get(i, ()):  # DRAM -> SRAM again, just before its late reader
                layout = graph.layout(t)
                arr = _slice(dram[t], _full(dram[t], layout), boxes[t], layout)
                onchip[t] = (boxes[t], arr)
                loaded += arr.size * dt
                tally.core += arr.size * dt
            if out0 in folds:  # fold this tile's part of the anchor into the accumulator
                name_x = lay.fmap_inputs[0]
                x_box, x = onchip[name_x]
                if x_box != boxes[name_x]:  # held whole: this tile's part only
                    x = _slice(x, x_box, boxes[name_x], graph.layout(name_x))
                    x_box = boxes[name_x]
                ys = [folds[out0].add(x, x_box)]
                tally.vector_ops += x.size
            else:
                reading = {t: streams[t] for t in lay.fmap_inputs if t in streams}
                ys = compute_on_chip(graph, group, ti, lay, boxes[out0],
                                     {**onchip, **reading} if reading else onchip, weights,
                                     tally, layers)
            keep_outputs(lay, boxes[out0], ys, onchip, tally, uses)
            for t, y in zip(lay.outputs, ys, strict=False):
                if t in fills:
                    fill_box(graph, fills[t], t, boxes[t], y)
            live = sum(a.size for t, (_, a) in onchip.items() if t not in fills) \
                - in_place_elems(group.id, ti, lay, None if out0 in fills else hosts.get(i),
                                 onchip, ys[0])
            if attention is not None:  # the chunks streaming now and the softmax's scratch
                live += sum(attention.onchip_elems(t, a.size) for t, (_, a) in streams.items()
                            if stream_steps[t][0] <= i <= stream_steps[t][-1])
                live += attention.scratch_elems(i, {out0: ys[0].size})
            tally.step(ti, live * dt + prefetch + filled, i, held=kept_for_all)
            _free(onchip, last_use, i, io, held)
            for t in drops.get(i, ()):  # off chip until it is loaded again
                del onchip[t]
        written = 0
        for t in io.outputs:  # SRAM -> DRAM: the tile's own box, halo cropped
            have, arr = onchip[t]
            if t in folds:  # an accumulator is final, and stored, after the last tile
                if k < len(anchors) - 1 or t in kept:
                    continue
                arr = folds[t].result()
            want = tile_box if t == io.anchor else boxes[t]
            layout = graph.layout(t)
            part = _slice(arr, have, want, layout)
            if t not in dram:
                dram[t] = np.zeros(graph.shapes[t], dtype=part.dtype)
            _slice(dram[t], _full(dram[t], layout), want, layout)[...] = part
            written += part.size * dt
        tally.tile(ti, loaded, written, used=used_weights)
    return folds


def fill_box(graph: Graph, buffer: np.ndarray, tensor: str, box: Box, part: np.ndarray,
             channels: tuple[int, int, int] | None = None) -> None:
    """Write `box` of a tensor into its whole on-chip buffer (a held map: on chip already,
    no byte moves); ``channels`` (axis, lo, hi): only that range of channels of the box (a
    hidden chunk's)."""
    layout = graph.layout(tensor)
    view = _slice(buffer, _full(buffer, layout), box, layout)
    if channels is not None:
        view = _take(view, *channels)
    view[...] = part


def held_for_all(held: Mapping[str, tuple[Box, np.ndarray]],
                 fills: Mapping[str, np.ndarray], dt: int) -> int:
    """Bytes a group in passes holds for all its tiles (held inputs, held maps, tail
    results, and the held maps this pass fills): in the cluster's SRAM, in no core's NRAM
    (Tally.step's `held`)."""
    return (sum(a.size for _, a in held.values()) + sum(b.size for b in fills.values())) * dt


def in_place_elems(group: int, tile: int, lay: Layer, host: str | None,
                   onchip: Mapping[str, tuple[Box, np.ndarray]], y: np.ndarray) -> int:
    """Elements of `lay`'s output `y` that take no room of their own at its step: all of
    them when it is written over `host` (planner.geometry.in_place), which must hold as many."""
    if host is None:
        return 0
    have = onchip[host][1].size
    if y.size > have:
        raise EmulationError(group, tile, lay.name, f"its output ({y.size} elements) is "
                             f"planned in place over '{host}', which holds {have}")
    return int(y.size)


def _free(onchip: dict[str, tuple[Box, np.ndarray]], last_use: Mapping[str, int], i: int,
          io: GroupIO, held: Mapping[str, tuple[Box, np.ndarray]]) -> None:
    """Free what no layer of the group after layer i reads (outputs wait for their store)."""
    for t in [t for t in onchip if last_use.get(t, i) <= i and t not in io.outputs
              and t not in held]:
        del onchip[t]


def compute_on_chip(graph: Graph, group: Group, tile: int | None, lay: Layer, box: Box,
                    onchip: Mapping[str, tuple[Box, np.ndarray]],
                    weights: Mapping[str, np.ndarray], tally: Tally, layers: LayerCache
                    ) -> list[np.ndarray]:
    """`box` of a layer's outputs from what is on chip (chunk by chunk when its weights
    stream), its work counted; a kernel failure names the group and tile."""
    try:
        ys = tally.compute(partial(run_layer, graph, lay, box, onchip, layers=layers), lay,
                           weights)
    except KernelFailure as exc:
        raise EmulationError(group.id, tile, exc.layer, exc.detail) from exc
    tally.ops(lay, ys[0].size)
    return ys


def keep_outputs(lay: Layer, box: Box, ys: Sequence[np.ndarray],
                 onchip: dict[str, tuple[Box, np.ndarray]], tally: Tally,
                 uses: Mapping[str, int]) -> None:
    """Put a layer's outputs on chip as `box`, counting the core traffic of writing them
    and of each later read by the group's layers (`uses`)."""
    dt = tally.chip.dtype_bytes
    for t, y in zip(lay.outputs, ys, strict=False):
        if t:
            onchip[t] = (box, y)
            tally.core += y.size * dt * (1 + uses.get(t, 0))


def _group_run(group: Group, tallies: list[Tally]) -> GroupRun:
    """The tiles' events of a group (one tally per band) as the clock plays them."""
    return GroupRun(tuple(tuple(t.events) for t in tallies), group.double_buffered,
                    group.prefetch)


def _run_bands(graph: Graph, group: Group, chip: Chip, dram: dict[str, np.ndarray],
               weights: Mapping[str, np.ndarray], io: GroupIO, layers: LayerCache
               ) -> tuple[Counters, GroupRun, list[Violation]]:
    """A banded halo-reusing group (planner.geometry.bands): each band's tiles run on their own chip
    images, as its cores would; work and feature-map traffic add up, the weights are read
    once (broadcast), each band's tiles go to the clock as their own stream (bands compute
    at once on their own cores), and capacity is checked per cluster and core from each
    band's measured peak."""
    dt = chip.dtype_bytes
    wbytes = sum(int(graph.constants[w].size) for w in io.weights) * dt
    anchors = list(iter_tiles(graph, io, group.tile))
    columns = ceil(anchor_extent(graph, io)[2] / group.tile.w)
    tallies = []
    stream = None if group.weights_resident else WeightStream.of(graph, io, group, weights, dt)
    for first, end in band_columns(columns, group.tile.bands):
        tally = Tally(chip, group, wbytes, checks=False, stream=stream)
        mine = [a for a in anchors if first <= a[4] // group.tile.w < end]
        run_reuse_tiles(graph, group, chip, dram, weights, tally, mine, layers)
        tallies.append(tally)
    fmap_peaks = [t.peak - t.onchip_weights for t in tallies]
    found = [Violation(group.id, -1, level, need, cap) for level, need, cap in
             band_overflows(chip, fmap_peaks, tallies[0].weights_now(None))]
    # the weights are read once per step of the bands and broadcast to all of them
    weight_read = max(t.weight_read for t in tallies)
    fmaps = sum(t.read - t.weight_read for t in tallies)
    c = Counters(
        dram_read_bytes=fmaps + weight_read, dram_write_bytes=sum(t.write for t in tallies),
        weight_read_bytes=weight_read,
        redundant_read_bytes=fmaps - _once(graph, io, dt),
        sram_peak_bytes=max(cluster_loads(chip, fmap_peaks)) + tallies[0].onchip_weights,
        macs=sum(t.macs for t in tallies), vector_ops=sum(t.vector_ops for t in tallies),
        core_fmap_bytes=sum(t.core for t in tallies),
        core_weight_bytes=wbytes * sum(t.tiles for t in tallies),
        first_load_bytes=sum(t.first for t in tallies) - (len(tallies) - 1) * wbytes,
        last_store_bytes=sum(t.last for t in tallies))
    return c, _group_run(group, tallies), found


def _once(graph: Graph, io: GroupIO, dt: int) -> int:
    """Bytes of the group's inputs read with no halo re-reads (one whole-anchor tile)."""
    full = tile_regions(graph, io, full_box(graph, io.anchor))
    return sum(box_elems(graph, t, full[t]) for t in io.inputs) * dt


def _full(arr: np.ndarray, layout: Layout) -> Box:
    """The box of a whole array of this layout."""
    n, _, h, w = layout.dims(arr.shape)
    return 0, n, 0, h, 0, w


def _last_use(graph: Graph, io: GroupIO) -> dict[str, int]:
    last: dict[str, int] = {}
    for i, name in enumerate(io.layers):
        for t in graph.layer(name).fmap_inputs:
            last[t] = i
    return last



def _capacity(chip: Chip, group: int, tile: int, live: int, sram_only: int,
              resident_weights: int) -> list[Violation]:
    """Overflows of one step: SRAM holds everything live; each core holds 1/n of what is
    not `sram_only` (weights on a single-memory chip, a group's held maps) and of the
    weights."""
    found = []
    if live > chip.sram.bytes:
        found.append(Violation(group, tile, "sram", live, chip.sram.bytes))
    if chip.nram is not None:
        share = ceil((live - sram_only) / chip.cores_per_cluster)
        if share > chip.nram.bytes:
            found.append(Violation(group, tile, "nram", share, chip.nram.bytes))
    if chip.wram is not None:
        share = ceil(resident_weights / chip.cores_per_cluster)
        if share > chip.wram.bytes:
            found.append(Violation(group, tile, "wram", share, chip.wram.bytes))
    return found


def _prefetch_capacity(graph: Graph, chip: Chip, group: Group, counted: Counters, gid: int,
                       prefetched: int, weights: Mapping[str, np.ndarray]) -> list[Violation]:
    """Overflow from holding the next group's weights while `group` runs: in WRAM beside its
    resident weights (or its largest streamed pair), else in SRAM beside its peak of live
    bytes."""
    if chip.wram is not None:
        io = group_io(graph, group.layers)
        if group.weights_resident:
            own = sum(int(graph.constants[w].size) for w in io.weights) * chip.dtype_bytes
        else:
            own = WeightStream.of(graph, io, group, weights, chip.dtype_bytes).reserved
        share = ceil((own + prefetched) / chip.cores_per_cluster)
        return [Violation(gid, -1, "wram", share, chip.wram.bytes)] \
            if share > chip.wram.bytes else []
    need = counted.sram_peak_bytes + prefetched
    return [Violation(gid, -1, "sram", need, chip.sram.bytes)] if need > chip.sram.bytes else []


def emulate(graph: Graph, plan: Plan, chip: Chip, inputs: Mapping[str, np.ndarray],
            weights: Mapping[str, np.ndarray] | None = None) -> EmulationResult:
    """Run every group of the plan in order; returns the model outputs, the counters and,
    from the clock (emulator.clock) fed with every tile's events, each group's cycles."""
    dram: dict[str, np.ndarray] = {k: np.asarray(v, dtype=np.float32) for k, v in inputs.items()}
    counters: list[Counters] = []
    runs: list[GroupRun] = []
    violations: list[Violation] = []
    layers = LayerCache(graph)
    # A tile's matrix products are small: BLAS threads cost more in hand-offs than they
    # gain, and on a busy machine their spin-waits slow the emulator down tenfold.
    with threadpool_limits(limits=1, user_api="blas"):
        for k, group in enumerate(plan.groups):
            check_bands(graph, group.layers, group.tile, chip, group.halo_reuse, f"group {k}")
            try:
                c, run, v = emulate_group(graph, group, chip, dram, weights or graph.constants,
                                          layers)
            except EmulationError:
                raise
            except KernelFailure as exc:
                raise EmulationError(k, None, exc.layer, exc.detail) from exc
            except (ValueError, KeyError, IndexError, TypeError, RuntimeError) as exc:
                # anything else the runners trip over is a plan they cannot run, not input
                raise EmulationError(k, None, None, f"{type(exc).__name__}: {exc}") from exc
            if group.prefetch and k:  # its weights load while the group before it runs
                wbytes = sum(int(graph.constants[w].size) for w in group_io(graph, group.layers)
                             .weights) * chip.dtype_bytes
                violations.extend(_prefetch_capacity(graph, chip, plan.groups[k - 1],
                                                     counters[k - 1], k - 1, wbytes,
                                                     weights or graph.constants))
            counters.append(c)
            runs.append(run)
            violations.extend(v)
    times = simulate_plan(chip, runs)
    timed = [replace(c, cycles=t.cycles, prefetch_cycles=floor(t.prefetch_cycles),
                     band_compute_cycles=t.compute_busy if len(run.bands) > 1 else 0)
             for c, t, run in zip(counters, times, runs, strict=True)]
    return EmulationResult({t: dram[t] for t in graph.outputs}, timed, violations, dram, times)
