"""A group whose input and output stream in channel chunks, as the emulator runs it
(planner.geometry.ends; Placement.end_chunks > 1).

Tile by tile: the first layer loads the tile's box of the group's input a chunk of its
input channels at a time, multiplies it by the matching rows of its weights and adds the
partial sums into its output, which stays on chip (without a first end the inputs load
whole); the layers between run on their whole boxes as in a plain tile; the last layer
computes its output a chunk of output channels at a time from the columns of its weights,
runs the per-element layers after it (its tail) on the chunk, and stores each chunk as it
is made. Bytes on chip are counted from the arrays held at
each step, the streamed weights from the slices.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from fuseplan.emulator.boxes import array_box, slice_box, take_range
from fuseplan.emulator.chunks import Overlay
from fuseplan.emulator.errors import EmulationError, KernelFailure
from fuseplan.emulator.layer import LayerCache, run_layer
from fuseplan.emulator.onchip import compute_on_chip, in_place_elems, keep_outputs
from fuseplan.emulator.tally import Tally
from fuseplan.planner.geometry.ends import Ends, EndStream, end_stream, tail_constants
from fuseplan.planner.geometry.in_place import in_place_hosts
from fuseplan.planner.geometry.regions import Box, GroupIO, in_group_uses, tile_regions
from fuseplan.planner.ir.chunks import chunk_axes
from fuseplan.planner.ir.graph import Graph
from fuseplan.planner.ir.ops import op_spec
from fuseplan.planner.plan.data import Group

OnChip = dict[str, tuple[Box, np.ndarray]]


def run_end_tiles(graph: Graph, group: Group, io: GroupIO, anchors: Sequence[Box],
                  dram: dict[str, np.ndarray], weights: Mapping[str, np.ndarray], tally: Tally,
                  layers: LayerCache, ends: Ends) -> None:
    """Run the group tile by tile over `anchors` with its ends in the placement's chunks,
    reading and writing `dram` and counting into `tally`."""
    run = _EndRun(graph, group, io, dram, weights, tally, layers, ends)
    for ti, tile_box in enumerate(anchors):
        boxes = tile_regions(graph, io, tile_box)
        onchip: OnChip = {}
        loaded = run.load_others(boxes, onchip)
        if ends.first is not None:
            loaded += run.first_layer(ti, boxes, onchip)
        for i in range(ends.start, io.layers.index(ends.last)):
            run.middle_layer(ti, i, boxes, onchip)
        written = run.last_layer(ti, tile_box, boxes, onchip)
        tally.tile(ti, loaded, written)


class _EndRun:
    """What every tile of the run shares: the chunks, the weight slices and their bytes."""

    def __init__(self, graph: Graph, group: Group, io: GroupIO, dram: dict[str, np.ndarray],
                 weights: Mapping[str, np.ndarray], tally: Tally, layers: LayerCache,
                 ends: Ends) -> None:
        self.graph, self.group, self.io, self.dram = graph, group, io, dram
        self.weights, self.tally, self.layers, self.ends = weights, tally, layers, ends
        self.dt = tally.chip.dtype_bytes
        chunks = group.placement.end_chunks
        self.src_ranges = ends.source_ranges(chunks)
        self.sink_ranges = ends.sink_ranges(chunks)
        self.uses = in_group_uses(graph, io)
        self.hosts = in_place_hosts(graph, io)
        self.last_use = {t: i for i, n in enumerate(io.layers)
                         for t in graph.layer(n).fmap_inputs}
        self.rows: list[dict[str, np.ndarray]] = []
        if ends.first is not None:
            w = graph.layer(ends.first).inputs[1]
            matrix = np.asarray(weights.get(w, graph.constants.get(w)))
            self.rows = [{w: matrix[lo:hi]} for lo, hi in self.src_ranges]
        last = graph.layer(ends.last)
        split = chunk_axes(graph, last)
        assert split is not None  # chunked_ends checked it
        # each chunk's weights: the last layer's columns and its tail's constants, sliced
        # along the output channels (a scalar whole)
        axes: dict[str, int | None] = {**split[1], **tail_constants(graph, ends)}
        arrays = {c: np.asarray(weights.get(c, graph.constants.get(c))) for c in axes}
        self.cols = [{c: _chunk_of(a, axes[c], lo, hi) for c, a in arrays.items()}
                     for lo, hi in self.sink_ranges]
        self.at = io.layers.index(ends.last)
        self.stream: EndStream | None = None
        if not group.weights_resident:
            sizes = tally.stream.sizes if tally.stream is not None else ()
            middle = [list(sizes[i]) if sizes else []
                      for i in range(ends.start, self.at)]
            self.stream = end_stream(
                [sum(a.size for a in part.values()) * self.dt for part in self.rows], middle,
                [sum(a.size for a in part.values()) * self.dt for part in self.cols])

    def _weights_at(self, part: Sequence[int], j: int) -> int | None:
        """Streamed weight bytes on chip at a step (None: resident, the tally knows)."""
        return part[j] if self.stream is not None else None

    def load_others(self, boxes: Mapping[str, Box], onchip: OnChip) -> int:
        """DRAM -> SRAM: the tile's box of every input but the streamed one."""
        graph, dram, dt = self.graph, self.dram, self.dt
        loaded = 0
        for t in self.io.inputs:
            if t == self.ends.source:
                continue
            layout = graph.layout(t)
            arr = slice_box(dram[t], array_box(dram[t], layout), boxes[t], layout)
            onchip[t] = (boxes[t], arr)
            loaded += arr.size * dt
            self.tally.core += arr.size * dt * (1 + self.uses.get(t, 0))
        return loaded

    def first_layer(self, ti: int, boxes: Mapping[str, Box], onchip: OnChip) -> int:
        """The first layer over the input's chunks, summing into its output; returns the
        bytes loaded."""
        graph, ends, tally, dt = self.graph, self.ends, self.tally, self.dt
        assert ends.first is not None and ends.source is not None  # run_end_tiles asks
        lay = graph.layer(ends.first)
        src, out = ends.source, lay.outputs[0]
        layout = graph.layout(src)
        whole = slice_box(self.dram[src], array_box(self.dram[src], layout), boxes[src], layout)
        loaded = 0
        acc: np.ndarray | None = None
        for j, (lo, hi) in enumerate(self.src_ranges):
            part = take_range(whole, whole.ndim - 1, lo, hi)
            loaded += part.size * dt
            tally.core += part.size * dt * 2  # written on chip, read by the layer
            view = {**onchip, src: (boxes[src], part)}
            try:
                (y,) = run_layer(graph, lay, boxes[out], view, Overlay(self.rows[j],
                                                                       self.weights))[:1]
            except KernelFailure as exc:
                raise EmulationError(self.group.id, ti, exc.layer, f"end chunk {j} (input "
                                     f"channels [{lo}, {hi})): {exc.detail}") from exc
            macs = y.size * (hi - lo)
            tally.macs += macs
            tally.count_array(lay, y.size if j == 0 else 0, macs)
            if acc is None:
                acc = y
            else:  # read the partial sums so far, add, write back
                acc = acc + y
                tally.core += 2 * y.size * dt
            live = sum(a.size for _, a in onchip.values()) + part.size + acc.size
            tally.step(ti, live * dt, 0, weights=self._weights_at(
                self.stream.first if self.stream else (), j))
        assert acc is not None
        keep_outputs(lay, boxes[out], [acc], onchip, tally, self.uses)
        self._free(0, onchip)
        return loaded

    def middle_layer(self, ti: int, i: int, boxes: Mapping[str, Box], onchip: OnChip) -> None:
        """A layer between the ends, on its whole box."""
        graph, tally = self.graph, self.tally
        lay = graph.layer(self.io.layers[i])
        ys = compute_on_chip(graph, self.group, ti, lay, boxes[lay.outputs[0]], onchip,
                             self.weights, tally, self.layers)
        keep_outputs(lay, boxes[lay.outputs[0]], ys, onchip, tally, self.uses)
        live = sum(a.size for _, a in onchip.values()) \
            - in_place_elems(self.group.id, ti, lay, self.hosts.get(i), onchip, ys[0])
        tally.step(ti, live * self.dt, i, weights=self._weights_at(
            self.stream.middle if self.stream else (), i - self.ends.start))
        self._free(i, onchip)

    def last_layer(self, ti: int, tile_box: Box, boxes: Mapping[str, Box],
                   onchip: OnChip) -> int:
        """The last layer chunk by chunk of its output channels, each chunk run through the
        tail and stored as it is made; returns the bytes written."""
        graph, ends, tally, dt, dram = self.graph, self.ends, self.tally, self.dt, self.dram
        lay = graph.layer(ends.last)
        out, sink = lay.outputs[0], ends.sink
        layout = graph.layout(sink)
        if sink not in dram:
            dram[sink] = np.zeros(graph.shapes[sink], dtype=np.float32)
        want = tile_box if sink == self.io.anchor else boxes[sink]
        target = slice_box(dram[sink], array_box(dram[sink], layout), want, layout)
        reads = sum(onchip[t][1].size for t in lay.fmap_inputs)
        axis = op_spec(lay.op).chunk_out_axis % target.ndim  # where the slices join
        written = 0
        for j, (lo, hi) in enumerate(self.sink_ranges):
            consts = Overlay(self.cols[j], self.weights)
            try:
                (y,) = run_layer(graph, lay, boxes[out], onchip, consts, self.layers)[:1]
            except KernelFailure as exc:
                raise EmulationError(self.group.id, ti, exc.layer, f"end chunk {j} (output "
                                     f"channels [{lo}, {hi})): {exc.detail}") from exc
            tally.ops(lay, y.size)
            tally.core += y.size * dt * (1 + self.uses.get(out, 0)) \
                + (reads * dt if j > 0 else 0)
            live = sum(a.size for _, a in onchip.values()) + y.size
            tally.step(ti, live * dt, self.at, weights=self._weights_at(
                self.stream.last if self.stream else (), j))
            if j == len(self.sink_ranges) - 1:  # every chunk has read the layer's inputs
                self._free(self.at, onchip)
            chunk: OnChip = {out: (boxes[out], y)}
            for i in range(self.at + 1, len(self.io.layers)):
                self._tail_step(ti, i, j, boxes, onchip, chunk, consts)
            part = slice_box(chunk[sink][1], boxes[sink], want, layout)
            take_range(target, axis, lo, hi)[...] = part
            written += part.size * dt
        return written

    def _tail_step(self, ti: int, i: int, j: int, boxes: Mapping[str, Box], onchip: OnChip,
                   chunk: OnChip, consts: Overlay) -> None:
        """A layer of the output end's tail on chunk j of the last layer's output: its
        constants sliced alike (`consts`), its output kept a chunk wide in `chunk`."""
        graph, tally = self.graph, self.tally
        lay = graph.layer(self.io.layers[i])
        out = lay.outputs[0]
        ys = compute_on_chip(graph, self.group, ti, lay, boxes[out], {**onchip, **chunk},
                             consts, tally, self.layers)
        keep_outputs(lay, boxes[out], ys, chunk, tally, self.uses)
        view = {**onchip, **chunk}
        live = sum(a.size for _, a in view.values()) \
            - in_place_elems(self.group.id, ti, lay, self.hosts.get(i), view, ys[0])
        tally.step(ti, live * self.dt, i, weights=self._weights_at(
            self.stream.last if self.stream else (), j))
        for t in [t for t in chunk if t != self.ends.sink and self.last_use.get(t, i) <= i]:
            del chunk[t]

    def _free(self, i: int, onchip: OnChip) -> None:
        """Free what no layer after layer i reads."""
        for t in [t for t in onchip if self.last_use.get(t, i) <= i]:
            del onchip[t]


def _chunk_of(arr: np.ndarray, axis: int | None, lo: int, hi: int) -> np.ndarray:
    """A constant's slice [lo, hi) along `axis`, or the whole of it (None: a scalar)."""
    return arr if axis is None else take_range(arr, axis, lo, hi)
