"""Execute a plan on the modeled chip, tile by tile, counting every byte moved.

The emulator shares only the region function (planner.geometry.regions.tile_regions)
with the planner: it slices real arrays for each tile, runs the layers with the
NumPy kernels, and counts bytes from the arrays it actually moves, so a wrong
closed form in the cost model shows up as a counter mismatch.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from math import ceil
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from emulator.kernels import run_op
from emulator.reuse import run_reuse_tiles
from hardware.chip import Chip
from planner.cost.model import (
    Counters,
    compute_cycles,
    dram_bytes_per_cycle,
    in_group_uses,
    prefetch_cycles,
    with_time,
)
from planner.geometry.bands import band_columns, band_compute_cycles, band_overflows, cluster_loads
from planner.geometry.regions import (
    Box,
    GroupIO,
    anchor_extent,
    box_elems,
    full_box,
    group_io,
    input_box,
    iter_tiles,
    tile_regions,
)
from planner.ir.graph import Graph, Layer, MapKind
from planner.plan.checks import check_bands
from planner.plan.data import Group, Plan


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
    """Outputs and counters of one emulated plan."""

    outputs: dict[str, np.ndarray]
    groups: list[Counters]
    violations: list[Violation] = field(default_factory=list)
    tensors: dict[str, np.ndarray] = field(default_factory=dict)  # everything written to DRAM

    def timeline(self, chip: Chip) -> list[dict[str, int]]:
        """Per group: start and end cycle (groups run back to back), the cycle its prefetched
        weights started loading (inside the previous group's DRAM idle time), DRAM and
        compute busy cycles (the prefetch's share of the link counted in the group's own)."""
        bpc = dram_bytes_per_cycle(chip)
        rows, clock = [], 0
        for i, c in enumerate(self.groups):
            rows.append({"group": i, "start_cycle": clock, "end_cycle": clock + c.cycles,
                         "prefetch_start_cycle": clock - c.prefetch_cycles,
                         "dram_busy_cycles": ceil(c.dram_bytes / bpc),
                         "compute_busy_cycles": compute_cycles(chip, c)})
            clock += c.cycles
        return rows

    @property
    def totals(self) -> Counters:
        total = Counters()
        for c in self.groups:
            total = total + c
        return total


def _slice(arr: np.ndarray, have: Box, want: Box, spatial: bool) -> np.ndarray:
    """Cut box `want` out of an array holding box `have` of a tensor."""
    n0, n1 = want[0] - have[0], want[1] - have[0]
    if not spatial:
        return arr[n0:n1]
    return arr[n0:n1, ..., want[2] - have[2]:want[3] - have[2], want[4] - have[4]:want[5] - have[4]]


@dataclass(frozen=True)
class _LayerStatic:
    """What run_layer needs of a layer that no tile changes, worked out once per layer."""

    # (arg position, fmap index, tensor, spatial, needs exactly the output's box)
    fmaps: tuple[tuple[int, int, str, bool, bool], ...]
    consts: tuple[tuple[int, str], ...]  # (arg position, tensor): weights and parameters
    n_args: int
    out_spatial: bool
    window: bool  # conv / pool: the tile passes its own pads
    transposed: bool  # ConvTranspose: scattered into the tile's box
    in_hw: tuple[int, int]  # rows and columns of the first fmap input
    attrs: Mapping[str, Any]  # without ceil_mode for window layers (the pads say it all)
    crop_spatial: bool  # a non-window kernel result may cover more rows than the box
    in_spatial: bool  # first fmap input has H and W


_STATIC: dict[int, tuple[weakref.ref[Graph], weakref.ref[Layer], _LayerStatic]] = {}


def _static(graph: Graph, lay: Layer) -> _LayerStatic:
    """The layer's static facts, cached by identity for as long as graph and layer live."""
    hit = _STATIC.get(id(lay))
    if hit is not None and hit[0]() is graph and hit[1]() is lay:
        return hit[2]
    if len(_STATIC) > 8192:  # stale entries of graphs long gone
        _STATIC.clear()
    info = _layer_static(graph, lay)
    _STATIC[id(lay)] = (weakref.ref(graph), weakref.ref(lay), info)
    return info


def _layer_static(graph: Graph, lay: Layer) -> _LayerStatic:
    fmaps, consts = [], []
    out_spatial = len(lay.out_shape) >= 4
    for pos, name in enumerate(lay.inputs):
        if name in lay.fmap_inputs:
            i = lay.fmap_inputs.index(name)
            shape = graph.shapes[name]
            spatial = len(shape) >= 4
            fmaps.append((pos, i, name, spatial, _same_box(lay, i, shape, out_spatial)))
        elif name:
            consts.append((pos, name))
    kind = lay.row_maps[0].kind if lay.row_maps else None
    window = kind is MapKind.WINDOW and out_spatial
    first = graph.shapes[lay.fmap_inputs[0]] if lay.fmap_inputs else ()
    in_spatial = len(first) >= 4
    attrs = {k: v for k, v in lay.attrs.items() if k != "ceil_mode"} if window else lay.attrs
    return _LayerStatic(
        fmaps=tuple(fmaps), consts=tuple(consts), n_args=len(lay.inputs),
        out_spatial=out_spatial, window=window,
        transposed=kind is MapKind.TRANSPOSED and out_spatial,
        in_hw=(first[-2], first[-1]) if in_spatial else (1, 1), attrs=attrs,
        crop_spatial=out_spatial and not window, in_spatial=in_spatial)


def _same_box(lay: Layer, i: int, shape: tuple[int, ...], out_spatial: bool) -> bool:
    """True when input_box(lay, i, box) is box itself for every box of the output.

    An elementwise input of the output's own extent: identity row and column maps and the
    batch kept, so the region function's clipping never bites. run_layer then skips it.
    """
    return (out_spatial and len(shape) >= 4 and lay.batch_preserving
            and lay.row_maps[i].kind is MapKind.IDENTITY
            and lay.col_maps[i].kind is MapKind.IDENTITY
            and (shape[0], shape[-2], shape[-1])
            == (lay.out_shape[0], lay.out_shape[-2], lay.out_shape[-1]))


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
              weights: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """Compute `out_box` of a layer's outputs from the boxes of its inputs held on chip."""
    info = _static(graph, lay)
    args: list[np.ndarray | None] = [None] * info.n_args
    first_box: Box | None = None
    for pos, i, name, spatial, same in info.fmaps:
        want = out_box if same else input_box(graph, lay, i, out_box)
        have, arr = onchip[name]
        args[pos] = _slice(arr, have, want, spatial)
        if first_box is None:
            first_box = want
    for pos, name in info.consts:
        args[pos] = weights.get(name, graph.constants.get(name))
    if lay.op == "Reshape" and info.out_spatial and lay.row_maps[0].kind is MapKind.IDENTITY:
        # the target shape names the whole map; a tile reshapes only its own box
        s = lay.out_shape
        args[1] = np.array([out_box[1] - out_box[0], *s[1:-2], out_box[3] - out_box[2],
                            out_box[5] - out_box[4]], dtype=np.int64)
    if lay.op == "Resize" and len(args) == 4 and lay.row_maps[0].kind is not MapKind.WHOLE:
        # `sizes` names the whole map; a tile upsamples its own rows by the same scales
        full_in, full_out = graph.shapes[lay.fmap_inputs[0]], lay.out_shape
        scales = np.array([o / i for o, i in zip(full_out, full_in, strict=True)], np.float32)
        args = [args[0], args[1] if args[1] is not None else np.zeros(0, np.float32), scales]
    if info.transposed and first_box is not None:
        return [_transposed_tile(lay, args, out_box, first_box)]
    attrs = info.attrs
    if info.window:
        attrs = _window_attrs(lay, info, out_box)
        if lay.op == "AveragePool" and int(lay.attrs.get("count_include_pad", 0)):
            shape = graph.shapes[lay.fmap_inputs[0]]
            return [_avg_pool_including_pads(lay, attrs, args, out_box, shape)]
    outs = run_op(lay.op, attrs, args, lay.opset, num_outputs=len(lay.outputs))
    return [_crop_output(np.asarray(y), lay, info, out_box, first_box) for y in outs]


def _avg_pool_including_pads(lay: Layer, attrs: dict[str, Any], args: list[np.ndarray | None],
                             out_box: Box, in_shape: tuple[int, ...]) -> np.ndarray:
    """AveragePool counting the model's pads but not the ceil_mode overhang, on a tile.

    The tile's pads mix the model's pads with rows past them (ceil_mode), so pool over real
    cells only and rescale by (real cells / cells inside the model's padded map) per window.
    """
    y = np.asarray(run_op(lay.op, {**attrs, "count_include_pad": 0}, args, lay.opset)[0])
    pads = list(lay.attrs.get("pads", [0, 0, 0, 0]))
    factors = []
    for axis, (lo, hi) in enumerate(((out_box[2], out_box[3]), (out_box[4], out_box[5]))):
        m = (lay.row_maps if axis == 0 else lay.col_maps)[0]
        size = in_shape[-2 + axis]
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
    bias, so the box starts as the bias and receives the slice's contributions.
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
    if not lay.batch_preserving and y.ndim:
        y = _crop_axis(y, 0, out_box[0], out_box[1] - out_box[0])
    if info.crop_spatial and first_box is not None and y.ndim >= 4:
        for axis, m, lo, hi, a0 in ((y.ndim - 2, lay.row_maps[0], out_box[2], out_box[3],
                                     first_box[2]),
                                    (y.ndim - 1, lay.col_maps[0], out_box[4], out_box[5],
                                     first_box[4])):
            whole = m.kind is MapKind.WHOLE or not info.in_spatial
            start = lo if whole else lo - m.virtual_start(a0)
            y = _crop_axis(y, axis, start, hi - lo)
    return y.astype(np.float32, copy=False) if y.dtype == np.float64 else y


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

    @property
    def onchip_weights(self) -> int:
        """Resident weights held in SRAM on single-memory chips."""
        return self.weight_bytes if self.chip.unified and self.group.weights_resident else 0

    def ops(self, lay: Layer, outputs: int) -> None:
        """Count the work of computing `outputs` elements of a layer."""
        if lay.is_main:
            self.macs += outputs * lay.macs_per_output
        else:
            self.vector_ops += outputs * lay.macs_per_output

    def step(self, tile: int, fmap_bytes: int) -> None:
        """Feature-map bytes on chip after a layer ran: peak and capacity."""
        live = fmap_bytes + self.onchip_weights
        self.peak = max(self.peak, live)
        if not self.checks:
            return
        resident = self.weight_bytes if self.group.weights_resident else 0
        for v in _capacity(self.chip, self.group.id, tile, live, self.onchip_weights, resident):
            if v.level not in self.worst or v.needed_bytes > self.worst[v.level].needed_bytes:
                self.worst[v.level] = v

    def tile(self, index: int, loaded: int, written: int) -> None:
        """A tile's DRAM traffic: its loads, its stores, and the weights it streams."""
        weights = self.weight_bytes if index == 0 or not self.group.weights_resident else 0
        self.tiles += 1
        self.read += loaded + weights
        self.weight_read += weights
        self.write += written
        if index == 0:
            self.first = loaded + weights
        self.last = written

    def counters(self, graph: Graph, io: GroupIO) -> Counters:
        dt = self.chip.dtype_bytes
        c = Counters(
            dram_read_bytes=self.read, dram_write_bytes=self.write,
            weight_read_bytes=self.weight_read,
            redundant_read_bytes=self.read - self.weight_read - _once(graph, io, dt),
            sram_peak_bytes=self.peak, macs=self.macs, vector_ops=self.vector_ops,
            core_fmap_bytes=self.core, core_weight_bytes=self.weight_bytes * self.tiles,
            first_load_bytes=self.first, last_store_bytes=self.last)
        return with_time(self.chip, c, self.group.double_buffered)


def emulate_group(graph: Graph, group: Group, chip: Chip, dram: dict[str, np.ndarray],
                  weights: Mapping[str, np.ndarray]) -> tuple[Counters, list[Violation]]:
    """Run one group over all its tiles; reads and writes `dram` (tensor name -> full array).

    Each tile loads the boxes of its inputs (halo included), computes every layer on its
    box and stores its box of the outputs; halo-reusing groups run in emulator.reuse.
    """
    io = group_io(graph, group.layers)
    dt = chip.dtype_bytes
    tally = Tally(chip, group, sum(int(graph.constants[w].size) for w in io.weights) * dt)
    if group.halo_reuse and group.tile.bands > 1:
        return _run_bands(graph, group, chip, dram, weights, io)
    if group.halo_reuse:
        run_reuse_tiles(graph, group, chip, dram, weights, tally)
        return tally.counters(graph, io), list(tally.worst.values())
    last_use = _last_use(graph, io)
    uses = in_group_uses(graph, io)
    anchors = group.boxes if group.boxes is not None else iter_tiles(graph, io, group.tile)
    for ti, tile_box in enumerate(anchors):
        boxes = tile_regions(graph, io, tile_box)
        onchip: dict[str, tuple[Box, np.ndarray]] = {}
        loaded = 0
        for t in io.inputs:  # DRAM -> SRAM: the tile's box of every input, halo included
            arr = _slice(dram[t], _full(dram[t]), boxes[t], dram[t].ndim >= 4)
            onchip[t] = (boxes[t], arr)
            loaded += arr.size * dt
            tally.core += arr.size * dt * (1 + uses.get(t, 0))
        prefetch = loaded if group.double_buffered else 0
        for i, name in enumerate(io.layers):
            lay = graph.layer(name)
            first = lay.outputs[0]
            ys = run_layer(graph, lay, boxes[first], onchip, weights)
            tally.ops(lay, ys[0].size)
            for t, y in zip(lay.outputs, ys, strict=False):
                if t:
                    onchip[t] = (boxes[first], y)
                    tally.core += y.size * dt * (1 + uses.get(t, 0))
            tally.step(ti, sum(a.size for _, a in onchip.values()) * dt + prefetch)
            # free what no later layer of the group reads (outputs wait for their store)
            for t in [t for t in onchip if last_use.get(t, i) <= i and t not in io.outputs]:
                del onchip[t]
        written = 0
        for t in io.outputs:  # SRAM -> DRAM: the tile's own box, halo cropped
            have, arr = onchip[t]
            want = tile_box if t == io.anchor else boxes[t]
            part = _slice(arr, have, want, arr.ndim >= 4)
            if t not in dram:
                dram[t] = np.zeros(graph.shapes[t], dtype=part.dtype)
            _slice(dram[t], _full(dram[t]), want, arr.ndim >= 4)[...] = part
            written += part.size * dt
        tally.tile(ti, loaded, written)
    return tally.counters(graph, io), list(tally.worst.values())


def _run_bands(graph: Graph, group: Group, chip: Chip, dram: dict[str, np.ndarray],
               weights: Mapping[str, np.ndarray], io: GroupIO
               ) -> tuple[Counters, list[Violation]]:
    """A banded halo-reusing group (planner.geometry.bands): each band's tiles run on their own chip
    images, as its cores would; work and feature-map traffic add up, the weights are read
    once (broadcast), the compute is the slowest band's, and capacity is checked per
    cluster and core from each band's measured peak."""
    dt = chip.dtype_bytes
    wbytes = sum(int(graph.constants[w].size) for w in io.weights) * dt
    anchors = list(iter_tiles(graph, io, group.tile))
    columns = ceil(anchor_extent(graph, io)[2] / group.tile.w)
    tallies = []
    for first, end in band_columns(columns, group.tile.bands):
        tally = Tally(chip, group, wbytes, checks=False)
        mine = [a for a in anchors if first <= a[4] // group.tile.w < end]
        run_reuse_tiles(graph, group, chip, dram, weights, tally, mine)
        tallies.append(tally)
    fmap_peaks = [t.peak - t.onchip_weights for t in tallies]
    found = [Violation(group.id, -1, level, need, cap) for level, need, cap in
             band_overflows(chip, fmap_peaks, wbytes, group.weights_resident)]
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
        last_store_bytes=sum(t.last for t in tallies),
        band_compute_cycles=max(band_compute_cycles(chip, t.macs, t.vector_ops,
                                                    group.tile.bands) for t in tallies))
    return with_time(chip, c, group.double_buffered), found


def _once(graph: Graph, io: GroupIO, dt: int) -> int:
    """Bytes of the group's inputs read with no halo re-reads (one whole-anchor tile)."""
    full = tile_regions(graph, io, full_box(graph, io.anchor))
    return sum(box_elems(graph, t, full[t]) for t in io.inputs) * dt


def _full(arr: np.ndarray) -> Box:
    if arr.ndim >= 4:
        return 0, arr.shape[0], 0, arr.shape[-2], 0, arr.shape[-1]
    return 0, arr.shape[0] if arr.ndim else 1, 0, 1, 0, 1


def _last_use(graph: Graph, io: GroupIO) -> dict[str, int]:
    last: dict[str, int] = {}
    for i, name in enumerate(io.layers):
        for t in graph.layer(name).fmap_inputs:
            last[t] = i
    return last


def _capacity(chip: Chip, group: int, tile: int, live: int, sram_weights: int,
              resident_weights: int) -> list[Violation]:
    """Overflows of one step: SRAM holds the tile; each core holds 1/n of it and of the weights."""
    found = []
    if live > chip.sram.bytes:
        found.append(Violation(group, tile, "sram", live, chip.sram.bytes))
    if chip.nram is not None:
        share = ceil((live - sram_weights) / chip.cores_per_cluster)
        if share > chip.nram.bytes:
            found.append(Violation(group, tile, "nram", share, chip.nram.bytes))
    if chip.wram is not None:
        share = ceil(resident_weights / chip.cores_per_cluster)
        if share > chip.wram.bytes:
            found.append(Violation(group, tile, "wram", share, chip.wram.bytes))
    return found


def _prefetch_capacity(graph: Graph, chip: Chip, group: Group, counted: Counters, gid: int,
                       prefetched: int) -> list[Violation]:
    """Overflow from holding the next group's weights while `group` runs: in WRAM beside its
    resident weights, else in SRAM beside its peak of live bytes."""
    if chip.wram is not None:
        own = sum(int(graph.constants[w].size) for w in group_io(graph, group.layers).weights) \
            * chip.dtype_bytes if group.weights_resident else 0
        share = ceil((own + prefetched) / chip.cores_per_cluster)
        return [Violation(gid, -1, "wram", share, chip.wram.bytes)] \
            if share > chip.wram.bytes else []
    need = counted.sram_peak_bytes + prefetched
    return [Violation(gid, -1, "sram", need, chip.sram.bytes)] if need > chip.sram.bytes else []


def emulate(graph: Graph, plan: Plan, chip: Chip, inputs: Mapping[str, np.ndarray],
            weights: Mapping[str, np.ndarray] | None = None) -> EmulationResult:
    """Run every group of the plan in order; returns the model outputs and counters."""
    dram: dict[str, np.ndarray] = {k: np.asarray(v, dtype=np.float32) for k, v in inputs.items()}
    counters: list[Counters] = []
    violations: list[Violation] = []
    # A tile's matrix products are small: BLAS threads cost more in hand-offs than they
    # gain, and on a busy machine their spin-waits slow the emulator down tenfold.
    with threadpool_limits(limits=1, user_api="blas"):
        for k, group in enumerate(plan.groups):
            check_bands(graph, group.layers, group.tile, chip, group.halo_reuse, f"group {k}")
            c, v = emulate_group(graph, group, chip, dram, weights or graph.constants)
            if group.prefetch and k:  # its weights loaded while the group before it computed
                prev, prev_group = counters[k - 1], plan.groups[k - 1]
                wbytes = sum(int(graph.constants[w].size) for w in group_io(graph, group.layers)
                             .weights) * chip.dtype_bytes
                violations.extend(_prefetch_capacity(graph, chip, prev_group, prev, k - 1,
                                                     wbytes))
                c = with_time(chip, c, group.double_buffered,
                              prefetch_cycles(chip, prev, prev_group.double_buffered, wbytes))
            counters.append(c)
            violations.extend(v)
    return EmulationResult({t: dram[t] for t in graph.outputs}, counters, violations, dram)
