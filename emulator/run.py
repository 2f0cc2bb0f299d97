"""Execute a plan on the modeled chip, tile by tile, counting every byte moved.

The emulator shares only the region function (planner.regions.tile_regions)
with the planner: it slices real arrays for each tile, runs the layers with the
NumPy kernels, and counts bytes from the arrays it actually moves, so a wrong
closed form in the cost model shows up as a counter mismatch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from math import ceil
from typing import Any

import numpy as np

from emulator.kernels import run_op
from hardware.chip import Chip
from planner.cost import (
    Counters,
    compute_cycles,
    dram_bytes_per_cycle,
    in_group_uses,
    prefetch_cycles,
    with_time,
)
from planner.ir import Graph, Layer, MapKind
from planner.plan import Group, Plan
from planner.regions import (
    Box,
    GroupIO,
    box_elems,
    full_box,
    group_io,
    input_box,
    iter_tiles,
    tile_regions,
)


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


def _window_attrs(lay: Layer, out_box: Box, in_len: tuple[int, int]) -> dict[str, Any]:
    """Kernel attributes with the pads this tile needs: the clipped-away part of the window."""
    attrs = dict(lay.attrs)
    pads = []
    ends = []
    for m, (lo, hi), n in zip(lay.row_maps[:1] + lay.col_maps[:1],
                              ((out_box[2], out_box[3]), (out_box[4], out_box[5])), in_len,
                              strict=True):
        u0, u1 = m.needed(lo, hi, n)
        pads.append(max(0, -u0))
        ends.append(max(0, u1 - n))
    attrs["pads"] = pads + ends
    attrs.pop("ceil_mode", None)
    return attrs


def _crop_axis(y: np.ndarray, axis: int, start: int, length: int) -> np.ndarray:
    if start < 0 or start + length > y.shape[axis]:
        raise ValueError(f"tile needs rows [{start}, {start + length}) of a kernel result with "
                         f"{y.shape[axis]} rows")
    idx = [slice(None)] * y.ndim
    idx[axis] = slice(start, start + length)
    return y[tuple(idx)]


def run_layer(graph: Graph, lay: Layer, out_box: Box, onchip: Mapping[str, tuple[Box, np.ndarray]],
              weights: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """Compute `out_box` of a layer's outputs from the boxes of its inputs held on chip."""
    args: list[np.ndarray | None] = []
    first_box: Box | None = None
    for name in lay.inputs:
        if not name:
            args.append(None)
        elif name in lay.fmap_inputs:
            i = lay.fmap_inputs.index(name)
            want = input_box(graph, lay, i, out_box)
            have, arr = onchip[name]
            args.append(_slice(arr, have, want, len(graph.shapes[name]) >= 4))
            if first_box is None:
                first_box = want
        else:
            args.append(weights.get(name, graph.constants.get(name)))
    out_spatial = len(lay.out_shape) >= 4
    if lay.op == "Reshape" and out_spatial and lay.row_maps[0].kind is MapKind.IDENTITY:
        # the target shape names the whole map; a tile reshapes only its own box
        s = lay.out_shape
        args[1] = np.array([out_box[1] - out_box[0], *s[1:-2], out_box[3] - out_box[2],
                            out_box[5] - out_box[4]], dtype=np.int64)
    if lay.op == "Resize" and len(args) == 4 and lay.row_maps[0].kind is not MapKind.WHOLE:
        # `sizes` names the whole map; a tile upsamples its own rows by the same scales
        full_in, full_out = graph.shapes[lay.fmap_inputs[0]], lay.out_shape
        scales = np.array([o / i for o, i in zip(full_out, full_in, strict=True)], np.float32)
        args = [args[0], args[1] if args[1] is not None else np.zeros(0, np.float32), scales]
    window = bool(lay.row_maps) and lay.row_maps[0].kind is MapKind.WINDOW and out_spatial
    attrs = lay.attrs
    if lay.row_maps and lay.row_maps[0].kind is MapKind.TRANSPOSED and out_spatial \
            and first_box is not None:
        return [_transposed_tile(lay, args, out_box, first_box)]
    if window:
        shape = graph.shapes[lay.fmap_inputs[0]]
        attrs = _window_attrs(lay, out_box, (shape[-2], shape[-1]))
        if lay.op == "AveragePool" and int(lay.attrs.get("count_include_pad", 0)):
            return [_avg_pool_including_pads(lay, attrs, args, out_box, shape)]
    outs = run_op(lay.op, attrs, args, lay.opset, num_outputs=len(lay.outputs))
    return [_crop_output(np.asarray(y), graph, lay, out_box, window, first_box) for y in outs]


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


def _crop_output(y: np.ndarray, graph: Graph, lay: Layer, out_box: Box, window: bool,
                 first_box: Box | None) -> np.ndarray:
    """Cut the tile's box out of a kernel result computed on a larger (virtual) range."""
    out_spatial = len(lay.out_shape) >= 4
    if not lay.batch_preserving and y.ndim:
        y = _crop_axis(y, 0, out_box[0], out_box[1] - out_box[0])
    if out_spatial and not window and first_box is not None and y.ndim >= 4:
        in_spatial = len(graph.shapes[lay.fmap_inputs[0]]) >= 4
        for axis, m, lo, hi, a0 in ((y.ndim - 2, lay.row_maps[0], out_box[2], out_box[3],
                                     first_box[2]),
                                    (y.ndim - 1, lay.col_maps[0], out_box[4], out_box[5],
                                     first_box[4])):
            whole = m.kind is MapKind.WHOLE or not in_spatial
            start = lo if whole else lo - m.virtual_start(a0)
            y = _crop_axis(y, axis, start, hi - lo)
    return y.astype(np.float32, copy=False) if y.dtype == np.float64 else y


class _Tile:
    """On-chip state of one tile: held boxes, and rows kept across tiles for halo reuse."""

    def __init__(self, graph: Graph, boxes: dict[str, Box], incoming: dict[str, np.ndarray],
                 next_boxes: dict[str, Box] | None) -> None:
        self.graph, self.boxes, self.next_boxes = graph, boxes, next_boxes
        self.incoming = incoming  # tensor -> rows kept from the previous tile
        self.outgoing: dict[str, np.ndarray] = {}  # tensor -> rows kept for the next tile
        self.onchip: dict[str, tuple[Box, np.ndarray]] = {}

    def kept_until(self, t: str) -> int:
        """First row of t's box this tile must make (rows before it were kept on chip)."""
        box = self.boxes[t]
        kept = self.incoming.get(t)
        if kept is None or len(self.graph.shapes[t]) < 4:
            return box[2] if kept is None else box[3]
        return box[2] + kept.shape[-2]

    def assemble(self, t: str, new: np.ndarray | None) -> np.ndarray:
        """t's whole box from its kept rows and the rows just made; keep rows for the next."""
        box = self.boxes[t]
        kept = self.incoming.pop(t, None)
        spatial = len(self.graph.shapes[t]) >= 4
        if kept is None:
            full = new
        elif new is None or not spatial:
            full = kept
        else:
            full = np.concatenate([kept, new], axis=-2)
        if full is None:
            raise ValueError(f"tensor {t}: nothing kept and nothing made")
        if self.next_boxes is not None:
            nb = self.next_boxes[t]
            if not spatial:
                self.outgoing[t] = full
            elif nb[2] < box[3]:
                self.outgoing[t] = full[..., max(nb[2], box[2]) - box[2]:, :].copy()
        self.onchip[t] = (box, full)
        return full

    def held_bytes(self, dt: int) -> int:
        arrays = [a for _, a in self.onchip.values()]
        arrays += list(self.incoming.values()) + list(self.outgoing.values())
        return sum(a.size for a in arrays) * dt


def _rows_box(box: Box, lo: int) -> Box:
    return box[0], box[1], lo, box[3], box[4], box[5]


def emulate_group(graph: Graph, group: Group, chip: Chip, dram: dict[str, np.ndarray],
                  weights: Mapping[str, np.ndarray]) -> tuple[Counters, list[Violation]]:
    """Run one group over all its tiles; reads and writes `dram` (tensor name -> full array).

    With halo reuse the row tiles run top to bottom and every tensor keeps the rows the next
    tile shares with this one, so those are neither reloaded nor recomputed.
    """
    io = group_io(graph, group.layers)
    dt = chip.dtype_bytes
    last_use = _last_use(graph, io)
    uses = in_group_uses(graph, io)
    wbytes = sum(int(graph.constants[w].size) for w in io.weights) * dt
    n = dict.fromkeys(("read", "write", "wread", "macs", "vec", "core", "peak", "tiles",
                       "first", "last"), 0)
    worst: dict[str, Violation] = {}  # per level, the tile that overflows most
    onchip_weights = wbytes if chip.unified and group.weights_resident else 0
    anchors = list(group.boxes if group.boxes is not None
                   else iter_tiles(graph, io, group.tile))
    regions = [tile_regions(graph, io, anchors[0])] if anchors else []
    incoming: dict[str, np.ndarray] = {}
    for ti, tile_box in enumerate(anchors):
        boxes = regions[ti]
        if ti + 1 < len(anchors):
            regions.append(tile_regions(graph, io, anchors[ti + 1]))
        state = _Tile(graph, boxes, incoming, regions[ti + 1]
                      if group.halo_reuse and ti + 1 < len(anchors) else None)
        n["tiles"] += 1
        tile_read = wbytes if ti == 0 or not group.weights_resident else 0
        loaded = 0
        for t in io.inputs:  # DRAM -> SRAM: the rows of the tile's box not kept on chip
            want = _rows_box(boxes[t], state.kept_until(t))
            arr = _slice(dram[t], _full(dram[t]), want, dram[t].ndim >= 4) \
                if want[3] > want[2] else None
            if arr is not None:
                loaded += arr.size * dt
                n["core"] += arr.size * dt
            full = state.assemble(t, arr)
            n["core"] += full.size * dt * uses.get(t, 0)
        tile_read += loaded
        prefetch = loaded if group.double_buffered else 0
        for i, name in enumerate(io.layers):
            lay = graph.layer(name)
            first = lay.outputs[0]
            new_box = _rows_box(boxes[first], state.kept_until(first))
            ys = run_layer(graph, lay, new_box, state.onchip, weights) \
                if new_box[3] > new_box[2] else []
            if ys:
                n["macs" if lay.is_main else "vec"] += ys[0].size * lay.macs_per_output
            for k, t in enumerate(lay.outputs):
                if t:
                    y = ys[k] if ys else None
                    n["core"] += (y.size * dt if y is not None else 0)
                    full = state.assemble(t, y)
                    n["core"] += full.size * dt * uses.get(t, 0)
            live = state.held_bytes(dt) + onchip_weights + prefetch
            n["peak"] = max(n["peak"], live)
            for v in _capacity(chip, group.id, ti, live, onchip_weights,
                               wbytes if group.weights_resident else 0):
                if v.level not in worst or v.needed_bytes > worst[v.level].needed_bytes:
                    worst[v.level] = v
            # free what no later layer of the group reads (outputs wait for their store)
            for t in [t for t in state.onchip if last_use.get(t, i) <= i and t not in io.outputs]:
                del state.onchip[t]
        tile_write = 0
        for t in io.outputs:  # SRAM -> DRAM: the tile's own box, halo cropped
            have, arr = state.onchip[t]
            want = tile_box if t == io.anchor else boxes[t]
            part = _slice(arr, have, want, arr.ndim >= 4)
            if t not in dram:
                dram[t] = np.zeros(graph.shapes[t], dtype=part.dtype)
            _slice(dram[t], _full(dram[t]), want, arr.ndim >= 4)[...] = part
            tile_write += part.size * dt
        incoming = state.outgoing
        if ti == 0:
            n["first"] = tile_read
        n["read"] += tile_read
        n["wread"] += wbytes if ti == 0 or not group.weights_resident else 0
        n["write"] += tile_write
        n["last"] = tile_write
    counters = Counters(
        dram_read_bytes=n["read"], dram_write_bytes=n["write"], weight_read_bytes=n["wread"],
        redundant_read_bytes=n["read"] - n["wread"] - _once(graph, io, dt),
        sram_peak_bytes=n["peak"], macs=n["macs"], vector_ops=n["vec"],
        core_fmap_bytes=n["core"], core_weight_bytes=wbytes * n["tiles"],
        first_load_bytes=n["first"], last_store_bytes=n["last"])
    return with_time(chip, counters, group.double_buffered), list(worst.values())


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
    for k, group in enumerate(plan.groups):
        c, v = emulate_group(graph, group, chip, dram, weights or graph.constants)
        if group.prefetch and k:  # its weights loaded while the group before it computed
            prev, prev_group = counters[k - 1], plan.groups[k - 1]
            wbytes = sum(int(graph.constants[w].size) for w in group_io(graph, group.layers)
                         .weights) * chip.dtype_bytes
            violations.extend(_prefetch_capacity(graph, chip, prev_group, prev, k - 1, wbytes))
            c = with_time(chip, c, group.double_buffered,
                          prefetch_cycles(chip, prev, prev_group.double_buffered, wbytes))
        counters.append(c)
        violations.extend(v)
    return EmulationResult({t: dram[t] for t in graph.outputs}, counters, violations, dram)
