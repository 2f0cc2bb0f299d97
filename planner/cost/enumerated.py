"""A group's counters over an explicit list of anchor boxes (a dynamic plan's parameter
table: any sizes, overlaps allowed), by enumeration: the same execution model as
planner.cost.model.group_cost, which is this sum in closed form for a regular grid."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from fuseplan.hardware.chip import Chip
from fuseplan.planner.cost.counters import Counters
from fuseplan.planner.cost.layered import first_tile_overlap, layered_applies
from fuseplan.planner.cost.model import (
    dram_loads,
    footprint,
    group_tensors,
    live_steps,
    next_inputs_elems,
    ring_peak,
    sram_staged,
    weight_bytes,
    weight_ring,
    with_time,
)
from fuseplan.planner.geometry.regions import (
    Box,
    box_elems,
    group_chains,
    group_io,
    in_group_uses,
    tile_regions,
)
from fuseplan.planner.geometry.rounds import round_size, rounds
from fuseplan.planner.ir.array import array_macs
from fuseplan.planner.ir.graph import Graph


def enumerated_cost(graph: Graph, layers: Sequence[str], boxes: Sequence[Box], chip: Chip,
                    weights_resident: bool = True, double_buffered: bool = False) -> Counters:
    """Counters of a group run over an explicit list of anchor boxes (a parameter table's
    entries: any sizes, overlaps allowed), by enumeration. Same execution model as
    group_cost, which is this sum in closed form for a regular grid of tiles."""
    io = group_io(graph, layers)
    chains = group_chains(graph, io)
    dt = chip.dtype_bytes
    steps = live_steps(graph, io)
    uses = in_group_uses(graph, io)
    wbytes = weight_bytes(graph, io.weights, chip)
    staged = sram_staged(graph, io, chip, weights_resident)
    loads = dram_loads(graph, io)
    reads = writes = macs = array = vector_ops = core = peak = first = last = 0
    for i, box in enumerate(boxes):
        regions = tile_regions(graph, io, box)
        loaded = sum(box_elems(graph, t, regions[t]) for t in loads) * dt
        # an accumulator is stored once, after the last box
        stored = sum(box_elems(graph, t, box if t == io.anchor else regions[t])
                     for t in io.outputs
                     if t not in io.accumulated or i == len(boxes) - 1) * dt
        reads += loaded
        writes += stored
        first = loaded + wbytes if i == 0 else first
        last = stored
        for name in io.layers:
            lay = graph.layer(name)
            elems = box_elems(graph, lay.outputs[0], regions[lay.outputs[0]])
            if lay.outputs[0] in io.accumulated:  # folds the box of its input in
                ops = box_elems(graph, lay.fmap_inputs[0], regions[lay.fmap_inputs[0]])
            else:
                ops = lay.macs_per_output * elems
            if lay.is_main:
                macs += ops
                array += array_macs(lay, chip, elems, ops)
            else:
                vector_ops += ops
        core += sum(box_elems(graph, t, regions[t]) * (1 + uses.get(t, 0))
                    for t in group_tensors(graph, io) if t in regions) * dt
        tile_peak = footprint(graph, io, regions, steps, dt, staged)
        nxt = next_inputs_elems(graph, io, regions) * dt
        peak = max(peak, tile_peak + (nxt if double_buffered else 0))
    wread = wbytes * (1 if weights_resident
                      else rounds(len(boxes), round_size(chip, io, halo_reuse=False)))
    if chip.unified and weights_resident:
        peak += wbytes
    once = sum(box_elems(graph, t, chains.full[t]) for t in loads) * dt
    c = Counters(dram_read_bytes=reads + wread, dram_write_bytes=writes,
                 weight_read_bytes=wread, redundant_read_bytes=reads - once,
                 sram_peak_bytes=peak, macs=macs, array_macs=array, vector_ops=vector_ops,
                 core_fmap_bytes=core,
                 core_weight_bytes=wbytes * len(boxes), first_load_bytes=first,
                 last_store_bytes=last)
    if layered_applies(io, False) and len(boxes) == 1:
        regions = tile_regions(graph, io, boxes[0])
        ring = 0 if weights_resident else weight_ring(graph, io, chip, regions)
        c = replace(c, overlap_cycles=first_tile_overlap(
            graph, io, regions, chip, first - wbytes, not weights_resident, ring))
        if ring:
            c = replace(c, sram_peak_bytes=ring_peak(graph, io, chip, regions, double_buffered))
    return with_time(chip, c, double_buffered)
