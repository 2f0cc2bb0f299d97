"""The weights-outer loop order as the emulator runs it (Placement.weights_outer).

A group of one layer whose streamed weights arrive in output-channel chunks can turn its
loops around: each chunk is loaded once and swept over every tile of every image, each
tile loading its input boxes again and storing the chunk's slice of its output channels,
before the next chunk loads. Its weights are then read once per batch at the price of
reading the inputs once per chunk; the planners pick it where that is cheaper (a large
convolution or classifier over a batch). The emulator slices the chunks out of the weights
it runs with (emulator.chunks) and counts every byte as it goes.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from fuseplan.emulator.boxes import array_box, slice_box, take_range
from fuseplan.emulator.chunks import Overlay
from fuseplan.emulator.layer import LayerCache, run_layer
from fuseplan.emulator.tally import Tally
from fuseplan.hardware.chip import Chip
from fuseplan.planner.geometry.regions import group_io, in_group_uses, iter_tiles, tile_regions
from fuseplan.planner.ir.graph import Graph
from fuseplan.planner.ir.ops import op_spec
from fuseplan.planner.plan.data import Group


def run_weights_outer(graph: Graph, group: Group, chip: Chip, dram: dict[str, np.ndarray],
                      weights: Mapping[str, np.ndarray], tally: Tally, layers: LayerCache
                      ) -> None:
    """Run a weights-outer group chunk by chunk, each chunk over every tile, reading and
    writing `dram` and counting into `tally`."""
    io = group_io(graph, group.layers)
    lay = graph.layer(io.layers[0])
    out = lay.outputs[0]
    dt = chip.dtype_bytes
    uses = in_group_uses(graph, io)
    stream = tally.stream
    assert stream is not None  # a weights-outer group streams its weights
    parts = stream.parts.get(lay.name) or ({},)  # one chunk: the weights whole
    sizes = stream.sizes[0]
    axis = op_spec(lay.op).chunk_out_axis
    anchors = list(group.boxes) if group.boxes is not None else list(
        iter_tiles(graph, io, group.tile))
    out_layout = graph.layout(out)
    lo = step = 0
    for j, part in enumerate(parts):
        width = 0
        for ti, tile_box in enumerate(anchors):
            boxes = tile_regions(graph, io, tile_box)
            onchip = {}
            loaded = 0
            for t in io.inputs:  # DRAM -> SRAM again for every chunk
                layout = graph.layout(t)
                arr = slice_box(dram[t], array_box(dram[t], layout), boxes[t], layout)
                onchip[t] = (boxes[t], arr)
                loaded += arr.size * dt
                tally.core += arr.size * dt * (1 + uses.get(t, 0))
            y = run_layer(graph, lay, boxes[out], onchip, Overlay(part, weights), layers)[0]
            tally.ops(lay, y.size)
            tally.core += y.size * dt * (1 + uses.get(out, 0))
            prefetch = loaded if group.double_buffered else 0
            tally.step(step, loaded + y.size * dt + prefetch, 0)
            if out not in dram:
                dram[out] = np.zeros(graph.shapes[out], dtype=y.dtype)
            whole = slice_box(dram[out], array_box(dram[out], out_layout), tile_box, out_layout)
            width = y.shape[axis]  # this chunk's output channels
            take_range(whole, axis, lo, lo + width)[...] = y
            tally.tile(step, loaded, y.size * dt, sizes[j] if ti == 0 else 0, sizes[j])
            step += 1
        lo += width
