"""Counters of a group run in passes around its reductions (planner.geometry.passes).

Each pass is priced by the cost model's closed forms on its own GroupIO; what joins them:

* the weights (every pass's and tail's) are resident: read once, for the first tile of
  the first pass; the cores read a pass's weights on every tile of that pass and a
  tail's once;
* pooling passes store nothing: their accumulators stay on chip for the tails, whose
  results later passes read are held on chip until the group ends;
* the tails' work (vectors, tiny) runs once after their passes: their outputs, and the
  pooled vector each tail layer reads, count as core traffic once;
* the SRAM peak is the largest of each pass's tiles beside the tail results held then,
  and of each tail (what is held, its pooled vector and every result at once), plus the
  weights on single-memory chips; what is held stays in SRAM, so the cores' NRAM holds
  only the rest: each pass's tile, each tail's pooled vector and results (fmap_peaks);
* with hidden chunks, each pass runs its stretches chunk by chunk (planner.cost.hidden):
  its peak is the exact one over every chunk and step, and the chunks add core traffic;
* with the inputs held (Passes.inputs_held) each input's needed box is loaded once, with
  the first tile, counted as core traffic once per reader, and on chip for every step;
* with the pooled maps held (Passes.maps_held) each map's buffer, the whole map, is on
  chip from the first step of its pass to the group's end (its pass writes the tiles of
  the map straight into it: GroupIO.in_place), and each later read of it counts as core
  traffic, once per reader.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from fuseplan.hardware.chip import Chip
from fuseplan.planner.cost.counters import Counters
from fuseplan.planner.cost.hidden import (
    TileProfile,
    chunk_core_bytes,
    hidden_peak_bytes,
    tile_profiles,
)
from fuseplan.planner.cost.model import peak_bytes, resident_work, weight_bytes, with_time
from fuseplan.planner.geometry.hidden import Stretch
from fuseplan.planner.geometry.passes import Passes, PoolPass, held_map_reads, pass_stretches
from fuseplan.planner.geometry.regions import (
    GroupChains,
    GroupIO,
    Tile,
    box_elems,
    full_box,
    group_chains,
    in_group_uses,
    tile_regions,
)
from fuseplan.planner.ir.array import array_macs
from fuseplan.planner.ir.graph import Graph


def tail_work(graph: Graph, split: Passes, pool: PoolPass, chip: Chip
              ) -> tuple[int, int, int, int]:
    """(MACs, array MACs, vector ops, core feature-map bytes) of a tail, run once on whole
    vectors."""
    uses = in_group_uses(graph, split.whole)
    tail_uses = in_group_uses(graph, replace(split.whole, layers=pool.tail))
    macs = array = vector_ops = 0
    core = graph.elems(pool.pooled) * tail_uses.get(pool.pooled, 0)
    for name in pool.tail:
        lay = graph.layer(name)
        elems = graph.elems(lay.outputs[0])
        ops = lay.macs_per_output * elems
        if lay.is_main:
            macs += ops
            array += array_macs(lay, chip, elems, ops)
        else:
            vector_ops += ops
        core += sum(graph.elems(t) * (1 + uses.get(t, 0)) for t in lay.outputs if t)
    return macs, array, vector_ops, core * chip.dtype_bytes


def held_input_elems(graph: Graph, split: Passes) -> dict[str, int]:
    """Elements of each held input's box (what the whole group needs of it)."""
    if not split.inputs_held:
        return {}
    full = tile_regions(graph, split.whole, full_box(graph, split.whole.anchor))
    return {t: box_elems(graph, t, full[t]) for t in split.whole.inputs}


def held_bytes(graph: Graph, split: Passes, k: int, chip: Chip) -> int:
    """Held inputs, held maps and tail results on chip while pass k (or its tail) runs."""
    return (sum(graph.elems(t) for t in (*split.held_before(k), *split.maps_during(k)))
            + sum(held_input_elems(graph, split).values())) * chip.dtype_bytes


def tail_peak_bytes(graph: Graph, split: Passes, k: int, chip: Chip) -> int:
    """Bytes on chip while pass k's tail runs: what is held from earlier tails, the pooled
    vector and every result of the tail."""
    pool = split.pools[k]
    made = [t for n in pool.tail for t in graph.layer(n).outputs if t]
    fresh = [pool.pooled, *(t for t in made if t != pool.pooled)]
    return held_bytes(graph, split, k, chip) + sum(graph.elems(t) for t in fresh) \
        * chip.dtype_bytes


def fmap_peak_bytes(graph: Graph, split: Passes, tile: Tile, chip: Chip,
                    double_buffered: bool = False,
                    chains: Sequence[GroupChains] | None = None, hidden_chunks: int = 1
                    ) -> int:
    """The SRAM peak of feature maps over every pass and tail (no weights); ``chains``:
    each pass's, when the caller keeps them; ``hidden_chunks``: every pass runs its
    stretches in that many chunks (planner.geometry.passes.pass_stretches)."""
    return fmap_peaks(graph, split, tile, chip, double_buffered, chains, hidden_chunks)[0]


def fmap_peaks(graph: Graph, split: Passes, tile: Tile, chip: Chip,
               double_buffered: bool = False, chains: Sequence[GroupChains] | None = None,
               hidden_chunks: int = 1) -> tuple[int, int]:
    """The SRAM peak of feature maps (fmap_peak_bytes) and the cores' peak: the same steps
    without what the group holds for all its tiles (held_bytes), which stays in the
    cluster's SRAM, read from there as a single-memory chip's weights are, and never in a
    core's NRAM (seed 000 ¶139: a core holds its sub-map of the tile)."""
    peak = cores = 0
    chains = chains or [group_chains(graph, io) for io in split.ios]
    found = pass_stretches(graph, split) if hidden_chunks > 1 else ((),) * split.count
    for k, io in enumerate(split.ios):
        if found[k]:  # its exact peak over every chunk and step (resident weights)
            here = hidden_peak_bytes(graph, io, chains[k], found[k], hidden_chunks, tile, chip,
                                     True, double_buffered,
                                     _profiles(graph, io, chains[k], found[k], tile))
        else:
            here = peak_bytes(graph, io, chains[k], tile, chip,
                              double_buffered=double_buffered)
        if chip.unified:  # peak_bytes adds the pass's resident weights: counted once, later
            here -= weight_bytes(graph, io.weights, chip)
        held = held_bytes(graph, split, k, chip)
        peak, cores = max(peak, here + held), max(cores, here)
        if k < len(split.pools):
            tail = tail_peak_bytes(graph, split, k, chip)
            peak, cores = max(peak, tail), max(cores, tail - held)
    return peak, cores


def _profiles(graph: Graph, io: GroupIO, chains: GroupChains, found: Sequence[Stretch],
              tile: Tile) -> list[TileProfile]:
    """The tile profiles of one pass (planner.cost.hidden.tile_profiles), worked out once per
    pass and tile (Graph.derived): a search prices each height with several chunk counts
    and input buffers, and a pool pass, whose accumulator has no closed form, profiles
    every tile (thousands where a flat output pins the tile to 1 x 1)."""
    key = ("pass_tile_profiles", io, tile)
    known = graph.derived.get(key)
    if known is None:
        known = graph.derived[key] = tile_profiles(graph, io, chains, found, tile)
    return known  # type: ignore[return-value]


def passes_cost(graph: Graph, split: Passes, tile: Tile, chip: Chip,
                double_buffered: bool = False, chains: Sequence[GroupChains] | None = None,
                fmap_peak: int | None = None, hidden_chunks: int = 1) -> Counters:
    """Predicted counters of the group run in passes with `tile` (weights resident);
    ``chains`` (each pass's) and ``fmap_peak`` (fmap_peak_bytes) when the caller has them;
    ``hidden_chunks``: each pass's stretches run in that many chunks, which adds core
    traffic (planner.cost.hidden.chunk_core_bytes) and changes the peak, nothing else."""
    dt = chip.dtype_bytes
    chains = chains or [group_chains(graph, io) for io in split.ios]
    works = [resident_work(graph, io, chains[k], tile, chip) for k, io in enumerate(split.ios)]
    wbytes = weight_bytes(graph, split.whole.weights, chip)
    fmaps = sum(c.dram_read_bytes - c.weight_read_bytes for c in works)
    full = tile_regions(graph, split.whole, full_box(graph, split.whole.anchor))
    once = sum(box_elems(graph, t, full[t]) for t in split.whole.inputs) * dt
    held = held_input_elems(graph, split)
    fmaps += sum(held.values()) * dt
    uses = in_group_uses(graph, split.whole)
    macs = sum(c.macs for c in works)
    array = sum(c.array_macs for c in works)
    vector_ops = sum(c.vector_ops for c in works)
    core = sum(c.core_fmap_bytes for c in works) \
        + sum(e * (1 + uses.get(t, 0)) for t, e in held.items()) * dt \
        + sum(graph.elems(t) * reads for t, reads in held_map_reads(graph, split).items()) * dt
    if hidden_chunks > 1:
        core += sum(chunk_core_bytes(graph, io, chains[k], found, hidden_chunks, tile, dt)
                    for k, (io, found) in enumerate(zip(split.ios, pass_stretches(graph, split),
                                                        strict=True)) if found)
    core_weight = sum(c.core_weight_bytes for c in works)
    for pool in split.pools:
        m, a, v, b = tail_work(graph, split, pool, chip)
        macs, array, vector_ops, core = macs + m, array + a, vector_ops + v, core + b
        core_weight += weight_bytes(graph, {w for n in pool.tail
                                            for w in graph.layer(n).weights}, chip)
    peak = fmap_peak_bytes(graph, split, tile, chip, double_buffered, chains, hidden_chunks) \
        if fmap_peak is None else fmap_peak
    first, last = works[0], works[-1]
    c = Counters(
        dram_read_bytes=fmaps + wbytes,
        dram_write_bytes=last.dram_write_bytes,
        weight_read_bytes=wbytes,
        redundant_read_bytes=fmaps - once,
        sram_peak_bytes=peak + (wbytes if chip.unified else 0),
        macs=macs,
        array_macs=array,
        vector_ops=vector_ops,
        core_fmap_bytes=core,
        core_weight_bytes=core_weight,
        first_load_bytes=first.first_load_bytes - first.weight_read_bytes + wbytes
        + sum(held.values()) * dt,
        last_store_bytes=last.last_store_bytes,
    )
    return with_time(chip, c, double_buffered)
