"""Emulate a halo-reusing group: tiles run row-major, each makes only what no earlier tile
made, and the chip keeps exactly what later tiles will read (planner.geometry.halo_reuse states
the same policy in closed form; this module finds it by running the tiles). Tiles of fewer
images than the batch sweep one batch part after another, each from an empty chip.

Every tensor of the group has an on-chip image (an array the size of the tensor) and a
validity mask over its rows and columns. Reads check the mask, so a policy that drops
data a later tile needs fails loudly instead of reading stale values; held bytes are the
valid elements, so the peak is what the policy really keeps.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from functools import partial
from math import ceil

import numpy as np

from fuseplan.emulator.layer import LayerCache, run_layer
from fuseplan.emulator.tally import Tally
from fuseplan.hardware.chip import Chip
from fuseplan.planner.geometry.attention import reader_chunk
from fuseplan.planner.geometry.halo_reuse import lifetimes, stream_floors, streamed_step
from fuseplan.planner.geometry.regions import (
    Box,
    GroupIO,
    full_box,
    group_io,
    input_box,
    iter_tiles,
    tile_regions,
)
from fuseplan.planner.ir.graph import Graph, Layer
from fuseplan.planner.ir.layout import Layout
from fuseplan.planner.plan.data import Group

Rect = tuple[int, int, int, int]  # r0, r1, c0, c1


class ReuseError(RuntimeError):
    """A tile read data the retention policy had not kept (a bug, never a user error)."""


@dataclass
class Step:
    """What one tile makes of each tensor and reads for each layer input."""

    made: dict[str, Rect] = field(default_factory=dict)
    reads: dict[tuple[str, int], Rect] = field(default_factory=dict)


def _rect(box: Box) -> Rect:
    return box[2], box[3], box[4], box[5]


def _new_part(ever: np.ndarray, box: Box) -> Rect | None:
    """The rectangle of `box` not made before; the model needs it to be one rectangle."""
    r0, r1, c0, c1 = _rect(box)
    fresh = ~ever[r0:r1, c0:c1]
    if not fresh.any():
        return None
    rows, cols = np.flatnonzero(fresh.any(axis=1)), np.flatnonzero(fresh.any(axis=0))
    rect = (r0 + int(rows[0]), r0 + int(rows[-1]) + 1, c0 + int(cols[0]), c0 + int(cols[-1]) + 1)
    if int(fresh.sum()) != (rect[1] - rect[0]) * (rect[3] - rect[2]):
        raise ReuseError(f"the new part of box {box} is not a rectangle")
    return rect


def schedule(graph: Graph, io: GroupIO, anchors: list[Box]) -> list[Step]:
    """Per tile, the made rectangle of every tensor and the rectangle each layer input reads."""
    regions = [tile_regions(graph, io, a, reuse=True) for a in anchors]
    ever = {t: np.zeros(graph.dims(t)[2:], bool) for t in regions[0]}
    steps = []
    for boxes in regions:
        step = Step()
        for t, box in boxes.items():
            rect = _new_part(ever[t], box)
            if rect is not None:
                step.made[t] = rect
                ever[t][rect[0]:rect[1], rect[2]:rect[3]] = True
        for name in io.layers:
            lay = graph.layer(name)
            made = step.made.get(lay.outputs[0])
            if made is None:
                continue
            out_box = (*boxes[lay.outputs[0]][:2], *made)
            for j in range(len(lay.fmap_inputs)):
                step.reads[(name, j)] = _rect(input_box(graph, lay, j, out_box))
        steps.append(step)
    return steps


def _lows(steps: list[Step], graph: Graph, io: GroupIO, tiles: list[int]
          ) -> dict[str, tuple[int, int]]:
    """Per tensor, the lowest row and lowest column any of `tiles` reads."""
    lows: dict[str, tuple[int, int]] = {}
    for i in tiles:
        for (name, j), rect in steps[i].reads.items():
            t = graph.layer(name).fmap_inputs[j]
            if rect[1] > rect[0] and rect[3] > rect[2]:
                r, c = lows.get(t, (rect[0], rect[2]))
                lows[t] = (min(r, rect[0]), min(c, rect[2]))
    return lows


def keep_policy(graph: Graph, io: GroupIO, anchors: list[Box], steps: list[Step]
                ) -> list[dict[str, list[tuple[int, int]]]]:
    """Per tile, per tensor: the (row, column) corners from which data stays on chip after
    the tile: what the rest of its tile row reads, and what the next tile row reads."""
    rows = [a[2] for a in anchors]
    out = []
    for i in range(len(anchors)):
        rest = [k for k in range(i + 1, len(anchors)) if rows[k] == rows[i]]
        nxt_row = next((rows[k] for k in range(i + 1, len(anchors)) if rows[k] != rows[i]), None)
        later = [k for k in range(i + 1, len(anchors)) if rows[k] == nxt_row]
        corners: dict[str, list[tuple[int, int]]] = {}
        for lows in (_lows(steps, graph, io, rest), _lows(steps, graph, io, later)):
            for t, corner in lows.items():
                corners.setdefault(t, []).append(corner)
        out.append(corners)
    return out


# a sweep's group inputs and outputs, per tile what it makes and reads, per tile the corners
# of what each tensor keeps, and each tensor's first and last step (plan_tiles)
SweepPlan = tuple[GroupIO, list[Step], list[dict[str, list[tuple[int, int]]]],
                  dict[str, tuple[int, int]]]


@dataclass
class OnChip:
    """Images of the group's tensors on chip and which of their positions hold data."""

    graph: Graph
    # per tensor, the images this sweep runs (its batch range in the sweep's tiles)
    batches: dict[str, tuple[int, int]] = field(default_factory=dict)
    images: dict[str, np.ndarray] = field(default_factory=dict)
    valid: dict[str, np.ndarray] = field(default_factory=dict)
    held: dict[str, int] = field(default_factory=dict)  # valid positions per tensor
    depth: dict[str, int] = field(default_factory=dict)  # elements per position (N * C)
    # kept keys held in the cores' WRAM (Mode.keys_in_wram): per tensor, the part of it the
    # busiest cluster keeps (its heads' share); what a tile keeps of them moves there at
    # their last use in the tile
    in_wram: Mapping[str, Fraction] = field(default_factory=dict)
    wram: dict[str, int] = field(default_factory=dict)  # their valid positions in WRAM
    wram_peak: int = 0  # the most elements the busiest cluster held there at once

    def put(self, t: str, rect: Rect, data: np.ndarray) -> int:
        """Store data at a rectangle of t; returns the elements stored."""
        if t not in self.images:
            self.images[t] = np.zeros(self.graph.shapes[t], np.float32)
            b, c, h, w = self.graph.dims(t)
            self.valid[t] = np.zeros((h, w), bool)
            n0, n1 = self.batches.get(t, (0, b))
            self.depth[t] = (n1 - n0) * c
        r0, r1, c0, c1 = rect
        _cut(self.images[t], rect, self.graph.layout(t), self.batches.get(t))[...] = data
        window = self.valid[t][r0:r1, c0:c1]
        self.held[t] = self.held.get(t, 0) + window.size - int(np.count_nonzero(window))
        window[...] = True
        return int(np.asarray(data).size)

    def check(self, t: str, rect: Rect, layer: str) -> None:
        r0, r1, c0, c1 = rect
        if t not in self.valid or not self.valid[t][r0:r1, c0:c1].all():
            raise ReuseError(f"layer {layer} reads rows {r0}:{r1}, columns {c0}:{c1} of {t}, "
                             "which are no longer (or not yet) on chip")

    def keep(self, t: str, corners: list[tuple[int, int]]) -> None:
        """Drop everything of t outside the union of the quadrants below-right of corners
        (kept keys in WRAM: what is kept moves there)."""
        if t not in self.valid:
            return
        mask = np.zeros_like(self.valid[t])
        for r, c in corners:
            mask[r:, c:] = True
        self.valid[t] &= mask
        self.held[t] = int(np.count_nonzero(self.valid[t]))
        if t in self.in_wram:
            self.wram[t] = self.held[t]
            self.wram_peak = max(self.wram_peak, self.wram_elems())

    def release_rows(self, t: str, r0: int, r1: int, corners: list[tuple[int, int]]) -> None:
        """Drop rows r0:r1 of t outside the quadrants below-right of corners (what later
        tiles read): a streamed step letting go of input rows it is done with."""
        if t not in self.valid or r1 <= r0:
            return
        width = self.valid[t].shape[1]
        first_kept = np.full(r1 - r0, width)
        for r, c in corners:
            first_kept[max(r - r0, 0):] = np.minimum(first_kept[max(r - r0, 0):], c)
        rows = self.valid[t][r0:r1]
        drop = rows & (np.arange(width)[None, :] < first_kept[:, None])
        self.held[t] -= int(np.count_nonzero(drop))
        rows &= ~drop

    def held_elems(self) -> int:
        """Elements in SRAM: valid positions times batch and channels (counted as the masks
        change, so that a tile's steps do not rescan every mask), but kept keys in WRAM."""
        return sum((n - self.wram.get(t, 0)) * self.depth[t] for t, n in self.held.items())

    def wram_elems(self) -> int:
        """Elements of kept keys the busiest cluster holds in WRAM (Mode.keys_in_wram)."""
        return sum(ceil(n * self.depth[t] * self.in_wram[t]) for t, n in self.wram.items())

    def region(self, t: str) -> tuple[Box, np.ndarray]:
        return full_box(self.graph, t), self.images[t]



def plan_tiles(graph: Graph, group: Group, anchors: list[Box] | None = None,
               spilled: frozenset[str] = frozenset()) -> SweepPlan:
    """Everything a reusing group's run (over `anchors`, by default all its tiles) needs
    before it starts; `spilled` tensors keep nothing between tiles (they go to DRAM)."""
    io = group_io(graph, group.layers)
    anchors = anchors if anchors is not None else list(iter_tiles(graph, io, group.tile))
    steps = schedule(graph, io, anchors)
    keeps = [{t: c for t, c in corners.items() if t not in spilled}
             for corners in keep_policy(graph, io, anchors, steps)]
    return io, steps, keeps, lifetimes(graph, io)


def as_box(graph: Graph, t: str, rect: Rect, batch: tuple[int, int] | None = None) -> Box:
    n0, n1 = batch or (0, graph.dims(t)[0])
    return n0, n1, *rect


def batch_parts(anchors: list[Box]) -> list[list[Box]]:
    """Consecutive anchors of the same images: the sweeps of a reusing group, in order."""
    parts: list[list[Box]] = []
    for a in anchors:
        if parts and parts[-1][0][:2] == a[:2]:
            parts[-1].append(a)
        else:
            parts.append([a])
    return parts


def run_reuse_tiles(graph: Graph, group: Group, chip: Chip, dram: dict[str, np.ndarray],
                    weights: Mapping[str, np.ndarray], tally: Tally,
                    anchors: list[Box] | None = None, layers: LayerCache | None = None,
                    spilled: frozenset[str] = frozenset(),
                    in_wram: Mapping[str, Fraction] | None = None) -> None:
    """Run a reusing group's tiles (or only `anchors`, one band's, on chip images of their
    own), one sweep per batch part, reading and writing `dram`, counting into `tally`.
    `spilled`: kept keys written to DRAM as made and read back by later tiles
    (Mode.keys_spilled); `in_wram`: kept keys held in the cores' WRAM, each with the part
    of it the busiest cluster keeps (Mode.keys_in_wram)."""
    if anchors is None:
        anchors = list(iter_tiles(graph, group_io(graph, group.layers), group.tile))
    parts = batch_parts(anchors)
    # every part sweeps the same rows and columns: one schedule and retention policy
    plan = plan_tiles(graph, group, parts[0], spilled)
    spill = Spill(graph, spilled, chip.dtype_bytes)
    first = 0
    for part in parts:
        _run_sweep(graph, group, chip, dram, weights, tally, part, plan, layers, first, spill,
                   in_wram or {})
        first += len(part)


@dataclass
class Spill:
    """Spilled keys (Mode.keys_spilled): each tile writes the rows it makes to DRAM and
    reads back, before the attention reading them, the rows earlier tiles made; on chip
    those count one chunk of keys (the online softmax walks them a chunk at a time), as
    planner.geometry.halo_reuse.AxisSchedule.held_back says."""

    graph: Graph
    tensors: frozenset[str]
    dtype_bytes: int
    written: int = 0  # bytes this tile wrote of them
    loaded: int = 0  # bytes this tile read back
    beyond: int = 0  # elements read back past the one chunk held at the reader's step

    def store(self, dram: dict[str, np.ndarray], chip_mem: OnChip, t: str, rect: Rect,
              batch: tuple[int, int]) -> None:
        """Write the rows of spilled tensor t this tile made."""
        layout = self.graph.layout(t)
        part = _cut(chip_mem.images[t], rect, layout, batch)
        if t not in dram:
            dram[t] = np.zeros(self.graph.shapes[t], np.float32)
        _cut(dram[t], rect, layout, batch)[...] = part
        self.written += part.size * self.dtype_bytes

    def load(self, dram: dict[str, np.ndarray], chip_mem: OnChip, lay: Layer, step: Step,
             batches: Mapping[str, tuple[int, int]]) -> int:
        """Read back what layer `lay` reads of spilled tensors that earlier tiles made;
        the elements loaded (the cores store them on chip)."""
        self.beyond = 0
        loaded = 0
        for j, t in enumerate(lay.fmap_inputs):
            if t not in self.tensors:
                continue
            r0, r1, c0, c1 = step.reads[(lay.name, j)]
            end = min(r1, step.made[t][0]) if t in step.made else r1
            if end <= r0:
                continue
            rect = (r0, end, c0, c1)
            elems = chip_mem.put(t, rect, _cut(dram[t], rect, self.graph.layout(t), batches[t]))
            loaded += elems
            chunk = reader_chunk(lay, t, self.graph.shapes[t])
            self.beyond += elems // (end - r0) * max(0, end - r0 - chunk)
        self.loaded += loaded * self.dtype_bytes
        return loaded


def _run_sweep(graph: Graph, group: Group, chip: Chip, dram: dict[str, np.ndarray],
               weights: Mapping[str, np.ndarray], tally: Tally, anchors: list[Box],
               plan: SweepPlan,
               layers: LayerCache | None, first: int, spill: Spill,
               in_wram: Mapping[str, Fraction]) -> None:
    """One batch part's tiles (`plan`: plan_tiles of the group's sweep), from an empty chip;
    `first` is its first tile's index."""
    io, steps, keeps, spans = plan
    streamed = {k: s for k in range(len(io.layers))
                if (s := streamed_step(graph, io, k)) is not None}
    dt = chip.dtype_bytes
    # each tensor's images in this sweep, as its tiles' boxes give them (a tensor whose
    # batch is not the anchor's, as a window partition folds rows into it, spans its own)
    batches = {t: (box[0], box[1])
               for t, box in tile_regions(graph, io, anchors[0], reuse=True).items()}
    chip_mem = OnChip(graph, batches, in_wram=in_wram)
    end = len(io.layers)
    for i, step in enumerate(steps):
        ti = first + i
        loaded = 0
        for t in io.inputs:
            if t in step.made:
                part = _cut(dram[t], step.made[t], graph.layout(t), batches[t])
                loaded += chip_mem.put(t, step.made[t], part) * dt
        tally.core += loaded
        prefetch = loaded if group.double_buffered else 0
        for k, name in enumerate(io.layers):
            lay = graph.layer(name)
            out_rect = step.made.get(lay.outputs[0])
            spill.beyond = 0
            if out_rect is not None:
                tally.core += spill.load(dram, chip_mem, lay, step, batches) * dt
                for j, t in enumerate(lay.fmap_inputs):
                    chip_mem.check(t, step.reads[(name, j)], name)
                    r = step.reads[(name, j)]
                    tally.core += chip_mem.depth[t] * (r[1] - r[0]) * (r[3] - r[2]) * dt
                onchip = {t: chip_mem.region(t) for t in lay.fmap_inputs}
                ys = tally.compute(partial(run_layer, graph, lay,
                                           as_box(graph, lay.outputs[0], out_rect,
                                                  batches[lay.outputs[0]]),
                                           onchip,
                                           layers=layers), lay, weights)
                tally.ops(lay, ys[0].size)
                if k in streamed:
                    stored, most = _stream_rows(chip_mem, graph, lay, *streamed[k], out_rect,
                                                ys[0], keeps[i])
                    tally.core += stored * dt
                    tally.step(ti, (most - spill.beyond) * dt + prefetch)
                else:
                    for t, y in zip(lay.outputs, ys, strict=False):
                        if t in step.made:
                            tally.core += chip_mem.put(t, step.made[t], y) * dt
                for t in lay.outputs:
                    if t in spill.tensors and t in step.made:
                        spill.store(dram, chip_mem, t, step.made[t], batches[t])
            if k not in streamed or out_rect is None:
                tally.step(ti, (chip_mem.held_elems() - spill.beyond) * dt + prefetch)
            for t, (_, last) in spans.items():
                if last == k:
                    chip_mem.keep(t, keeps[i].get(t, []))
            if in_wram:
                tally.hold_keys(ti, chip_mem.wram_peak * dt)
        written = 0
        for t in io.outputs:
            if t in step.made:
                part = _cut(chip_mem.images[t], step.made[t], graph.layout(t), batches[t])
                if t not in dram:
                    dram[t] = np.zeros(graph.shapes[t], np.float32)
                _cut(dram[t], step.made[t], graph.layout(t), batches[t])[...] = part
                written += part.size * dt
        for t, (_, last) in spans.items():
            if last == end:
                chip_mem.keep(t, keeps[i].get(t, []))
        tally.tile(ti, loaded + spill.loaded, written + spill.written)
        spill.loaded = spill.written = 0


def _stream_rows(chip_mem: OnChip, graph: Graph, lay: Layer, out: str, released: list[str],
                 rect: Rect, data: np.ndarray, keeps: dict[str, list[tuple[int, int]]]
                 ) -> tuple[int, int]:
    """Store a streamed step's output row by row (planner.geometry.halo_reuse.streamed_step): before
    each row, its released inputs drop what is below their floor and not kept; each row's
    reads are checked against what is still held. Returns (elements stored, the most
    elements held at once)."""
    r0, r1, c0, c1 = rect
    floors = {t: stream_floors(graph, lay, t, r0, r1) for t in released}
    done = dict.fromkeys(released, 0)  # rows below this are already released
    stored = most = 0
    for i, y in enumerate(range(r0, r1)):
        for t in released:
            chip_mem.release_rows(t, done[t], floors[t][i], keeps.get(t, []))
            done[t] = max(done[t], floors[t][i])
        row_box = as_box(graph, out, (y, y + 1, c0, c1))
        for j, t in enumerate(lay.fmap_inputs):
            chip_mem.check(t, _rect(input_box(graph, lay, j, row_box)), lay.name)
        stored += chip_mem.put(out, (y, y + 1, c0, c1), _cut(data, (i, i + 1, 0, c1 - c0),
                                                               graph.layout(out)))
        most = max(most, chip_mem.held_elems())
    return stored, most


def _cut(arr: np.ndarray, rect: Rect, layout: Layout, batch: tuple[int, int] | None = None
         ) -> np.ndarray:
    """The rows and columns of a rectangle (a view) of the images `batch` (None: all);
    tensors without rows and columns whole."""
    if not layout.spatial:
        return arr
    images = slice(None) if batch is None else slice(*batch)
    return arr[layout.index(images, slice(rect[0], rect[1]), slice(rect[2], rect[3]))]
