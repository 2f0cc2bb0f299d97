"""A lone fused attention layer run in chunks of its heads (Placement.hidden_chunks > 1).

Each tile of query rows runs the chunks one after the other: a chunk loads its heads' query
rows, streams its heads' keys and values a chunk of keys at a time through the online-softmax
kernel (emulator.attention_kernel) and stores its heads' output rows, so one chunk of heads
is on chip at a time. Every byte is counted from the arrays moved, as for any group.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from fuseplan.emulator.boxes import array_box, slice_box
from fuseplan.emulator.layer import LayerCache
from fuseplan.emulator.onchip import compute_on_chip
from fuseplan.emulator.tally import Tally
from fuseplan.planner.geometry.attention import online_attention as onchip_attention
from fuseplan.planner.geometry.regions import Box, GroupIO, tile_regions
from fuseplan.planner.ir.graph import Graph
from fuseplan.planner.plan.data import Group


def run_head_chunks(graph: Graph, group: Group, io: GroupIO, anchors: Sequence[Box],
                    dram: dict[str, np.ndarray], weights: Mapping[str, np.ndarray],
                    tally: Tally, layers: LayerCache, heads: int) -> None:
    """A lone fused attention layer in `group.placement.hidden_chunks` chunks of its heads:
    each tile of query rows runs the chunks one after the other, each loading its heads'
    query rows, streaming its heads' keys and values a chunk of keys at a time and storing
    its heads' output rows, so one chunk of heads is on chip at a time."""
    dt = tally.chip.dtype_bytes
    lay = graph.layer(io.layers[0])
    out = lay.outputs[0]
    attention = onchip_attention(graph, io)
    assert attention is not None
    width = heads // group.placement.hidden_chunks
    for ti, tile_box in enumerate(anchors):
        boxes = tile_regions(graph, io, tile_box)
        loaded = written = 0
        for lo in range(0, heads, width):
            part = slice(lo, lo + width)
            onchip: dict[str, tuple[Box, np.ndarray]] = {}
            held = 0  # this chunk's inputs on chip (one chunk of keys where they stream)
            for t in io.inputs:  # this chunk's heads of the tile's box of every input
                layout = graph.layout(t)
                whole = slice_box(dram[t], array_box(dram[t], layout), boxes[t], layout)
                # grouped-query keys and values: the chunk's groups' key heads
                kv = whole.shape[1] * lo // heads, whole.shape[1] * (lo + width) // heads
                arr = whole[:, part] if whole.shape[1] == heads else whole[:, kv[0]:kv[1]]
                onchip[t] = (boxes[t], arr)
                loaded += arr.size * dt
                tally.core += arr.size * dt * 2  # written on chip, read by the layer
                held += attention.onchip_elems(t, arr.size, boxes[t][3] - boxes[t][2])
            (y,) = compute_on_chip(graph, group, ti, lay, boxes[out], onchip, weights, tally,
                                   layers)
            tally.core += y.size * dt
            live = held + y.size + attention.scratch_elems(0, {out: y.size})
            # a second buffer holds the next chunk's first loads, as large as this chunk's
            tally.step(ti, (live + (held if group.double_buffered else 0)) * dt, 0)
            layout = graph.layout(out)
            if out not in dram:
                dram[out] = np.zeros(graph.shapes[out], dtype=y.dtype)
            slice_box(dram[out], array_box(dram[out], layout), tile_box, layout)[:, part] = y
            written += y.size * dt
        tally.tile(ti, loaded, written)
