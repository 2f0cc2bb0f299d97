"""Counters of a group run in two passes around its reduction (planner.geometry.passes).

Each pass is priced by the cost model's closed forms on its own GroupIO; what joins them:

* the weights (prefix, tail and rest) are resident: read once, for the first tile of
  pass 1; the cores read the prefix's weights on every tile of both passes, the rest's on
  every tile of pass 2 and the tail's once;
* pass 1 stores nothing: its accumulator stays on chip for the tail, whose results
  pass 2 holds for all its tiles;
* the tail's work (vectors, tiny) runs once between the passes: its outputs, and the
  pooled vector each tail layer reads, count as core traffic once;
* the SRAM peak is the largest of pass 1's tiles, the tail (the pooled vector and every
  tail result at once) and pass 2's tiles beside the held results, plus the weights on
  single-memory chips.
"""

from __future__ import annotations

from dataclasses import replace

from hardware.chip import Chip
from planner.cost.counters import Counters
from planner.cost.model import peak_bytes, resident_work, weight_bytes, with_time
from planner.geometry.passes import TwoPass
from planner.geometry.regions import (
    Tile,
    box_elems,
    full_box,
    group_chains,
    in_group_uses,
    tile_count,
    tile_regions,
)
from planner.ir.graph import Graph


def tail_work(graph: Graph, tp: TwoPass, chip: Chip) -> tuple[int, int, int]:
    """(MACs, vector ops, core feature-map bytes) of the tail, run once on whole vectors."""
    uses = in_group_uses(graph, tp.whole)
    tail_uses = in_group_uses(graph, replace(tp.whole, layers=tp.tail))
    macs = vector_ops = 0
    core = graph.elems(tp.pooled) * tail_uses.get(tp.pooled, 0)
    for name in tp.tail:
        lay = graph.layer(name)
        ops = lay.macs_per_output * graph.elems(lay.outputs[0])
        if lay.is_main:
            macs += ops
        else:
            vector_ops += ops
        core += sum(graph.elems(t) * (1 + uses.get(t, 0)) for t in lay.outputs if t)
    return macs, vector_ops, core * chip.dtype_bytes


def tail_peak_bytes(graph: Graph, tp: TwoPass, chip: Chip) -> int:
    """Bytes on chip while the tail runs: the pooled vector and every tail result."""
    made = [t for n in tp.tail for t in graph.layer(n).outputs if t]
    return (graph.elems(tp.pooled) + sum(graph.elems(t) for t in made)) * chip.dtype_bytes


def held_bytes(graph: Graph, tp: TwoPass, chip: Chip) -> int:
    """The tail results pass 2 holds on chip for all its tiles."""
    return sum(graph.elems(t) for t in tp.held) * chip.dtype_bytes


def fmap_peak_bytes(graph: Graph, tp: TwoPass, tile: Tile, chip: Chip,
                    double_buffered: bool = False) -> int:
    """The SRAM peak of feature maps over both passes and the tail (no weights)."""
    first = peak_bytes(graph, tp.first, group_chains(graph, tp.first), tile, chip,
                       double_buffered=double_buffered)
    second = peak_bytes(graph, tp.second, group_chains(graph, tp.second), tile, chip,
                        double_buffered=double_buffered)
    if chip.unified:  # peak_bytes adds each pass's resident weights: counted once below
        first -= weight_bytes(graph, tp.first.weights, chip)
        second -= weight_bytes(graph, tp.second.weights, chip)
    return max(first, tail_peak_bytes(graph, tp, chip),
               second + held_bytes(graph, tp, chip))


def two_pass_cost(graph: Graph, tp: TwoPass, tile: Tile, chip: Chip,
                  double_buffered: bool = False) -> Counters:
    """Predicted counters of the group run in two passes with `tile` (weights resident)."""
    dt = chip.dtype_bytes
    one = resident_work(graph, tp.first, group_chains(graph, tp.first), tile, chip)
    two = resident_work(graph, tp.second, group_chains(graph, tp.second), tile, chip)
    wbytes = weight_bytes(graph, tp.whole.weights, chip)
    tail_w = weight_bytes(graph, {w for n in tp.tail for w in graph.layer(n).weights}, chip)
    fmaps = one.dram_read_bytes - one.weight_read_bytes \
        + two.dram_read_bytes - two.weight_read_bytes
    full = tile_regions(graph, tp.whole, full_box(graph, tp.whole.anchor))
    once = sum(box_elems(graph, t, full[t]) for t in tp.whole.inputs) * dt
    macs, vector_ops, core = tail_work(graph, tp, chip)
    peak = fmap_peak_bytes(graph, tp, tile, chip, double_buffered)
    c = Counters(
        dram_read_bytes=fmaps + wbytes,
        dram_write_bytes=two.dram_write_bytes,
        weight_read_bytes=wbytes,
        redundant_read_bytes=fmaps - once,
        sram_peak_bytes=peak + (wbytes if chip.unified else 0),
        macs=one.macs + two.macs + macs,
        vector_ops=one.vector_ops + two.vector_ops + vector_ops,
        core_fmap_bytes=one.core_fmap_bytes + two.core_fmap_bytes + core,
        core_weight_bytes=one.core_weight_bytes + two.core_weight_bytes + tail_w,
        first_load_bytes=one.first_load_bytes - one.weight_read_bytes + wbytes,
        last_store_bytes=two.last_store_bytes,
    )
    return with_time(chip, c, double_buffered)


def passes_tile_count(graph: Graph, tp: TwoPass, tile: Tile) -> tuple[int, int]:
    """Tiles of pass 1 and of pass 2."""
    return tile_count(graph, tp.first, tile), tile_count(graph, tp.second, tile)
