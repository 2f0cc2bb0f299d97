"""The cost model: predicted counters of a group executed with a given tile.

One model serves every planner (CP-SAT encodes the same closed forms, see
solver/cpsat_costs.py) and is checked by the emulator, which counts the bytes it
actually moves. Execution model, per group:

* tiles of the anchor are processed in order (batch, rows, columns); each tile
  loads from DRAM the box of every external input it needs (halo included,
  overlapping tiles re-read their halo), computes every layer of the group on
  chip and stores its box of the anchor, and of the outputs cut like it
  (planner.geometry.regions.tiled_like_anchor); any other output forces a single tile;
* weights are read once per group when resident (held in WRAM, or in SRAM on
  single-memory chips), else streamed layer by layer, in output-channel chunks, once per
  round of tiles (planner.cost.weight_stream; planner.geometry.rounds: independent tiles
  run one per cluster, each round sharing one read): the chunks on chip at each step count
  against WRAM, or against SRAM beside that step's maps on single-memory chips;
* on chip, a tensor lives from its load/production to its last consumer in the
  group; the SRAM footprint of a tile is the peak of live feature-map bytes
  (plus the weights on single-memory chips);
* cycles (cycles_energy): compute = MACs on the matrix units + vector ops on the vector
  lanes; with a second input buffer a group costs fill (first tile's loads) +
  max(remaining transfers, compute) + drain, else transfers and compute add up; a group
  of one tile computes each layer as its weights arrive (planner.cost.layered);
* next-group prefetch (prefetch_cycles): a group's weights do not depend on the group
  before it, so they load while that group computes, when they fit beside it (WRAM on
  chips with one, else SRAM beside the previous group's live tiles and resident weights).
  The DRAM link is idle for `idle_dram_cycles` of the previous group, so the group starts
  min(idle, floor(weight bytes / DRAM bytes per cycle) - overlap) cycles earlier: its fill shrinks
  by that much. Only the weights are prefetched (they are the same for every tile choice,
  which keeps the saving a function of the previous group and one number of this one, so
  CP-SAT and the shortest path optimise it exactly over consecutive pairs);
* energy = DRAM bytes x (DRAM + SRAM pJ/B) + core traffic x NRAM/WRAM pJ/B + MACs x pJ/MAC
  + vector ops x pJ/op + static power x time (time after prefetch): one formula,
  planner.cost.objective.EnergyRates, shared with the planners and CP-SAT.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from fractions import Fraction
from functools import lru_cache
from math import ceil, floor, prod

from fuseplan.hardware.chip import Chip
from fuseplan.planner.cost.counters import Counters
from fuseplan.planner.cost.layered import first_tile_overlap, layered_applies
from fuseplan.planner.cost.objective import energy_pj
from fuseplan.planner.cost.schedule import Step, double_buffered_span
from fuseplan.planner.cost.weight_stream import (
    chunk_sizes,
    chunk_width,
    layer_chunks,
    stage_peak,
    staged_steps,
)
from fuseplan.planner.geometry.attention import online_attention, picking_chains, prefix_rows
from fuseplan.planner.geometry.bands import band_columns, band_compute_cycles, cluster_loads
from fuseplan.planner.geometry.halo_reuse import AxisSchedule, ReuseGrid, reuse_peak_elems
from fuseplan.planner.geometry.in_place import in_place_hosts
from fuseplan.planner.geometry.regions import (
    AxisChain,
    Box,
    GroupChains,
    GroupIO,
    StripSpans,
    Tile,
    anchor_extent,
    axis_ranges,
    box_elems,
    full_box,
    group_chains,
    group_io,
    in_group_uses,
    tile_count,
    tile_regions,
)
from fuseplan.planner.geometry.rounds import round_size, rounds
from fuseplan.planner.ir.array import array_macs, matrix_macs
from fuseplan.planner.ir.graph import Graph


def weight_bytes(graph: Graph, weights: Iterable[str], chip: Chip) -> int:
    """Bytes of a set of weight tensors in the chip's storage dtype."""
    return sum(int(graph.constants[w].size) for w in set(weights)) * chip.dtype_bytes


def dram_loads(graph: Graph, io: GroupIO) -> list[str]:
    """What a tile reads from DRAM besides weights, by the box of each: the group's inputs,
    and the outputs of its gathers of table rows (Graph.row_gathers: a gather fetches just
    the rows of its box, so the box of its output is what crosses DRAM)."""
    return [*io.inputs, *graph.gathered(io.layers)]


def live_steps(graph: Graph, io: GroupIO, reloaded: Mapping[str, tuple[int, int]] | None = None
               ) -> list[tuple[str, ...]]:
    """Tensors live on chip while each layer of the group runs (its inputs and outputs;
    not those written in place into a held buffer, GroupIO.in_place, nor an output written
    over the input it reads last, at that step: planner.geometry.in_place). ``reloaded``:
    inputs dropped after a step and loaded again at a later one (planner.geometry.reload),
    off chip in between."""
    last_use: dict[str, int] = {}
    for i, name in enumerate(io.layers):
        for t in graph.layer(name).fmap_inputs:
            last_use[t] = i
    end = len(io.layers) - 1
    for t in io.outputs:
        last_use[t] = end
    born: dict[str, int] = {t: -1 for t in io.inputs}
    attention = online_attention(graph, io)
    if attention is not None:  # streamed keys and values arrive with the layer reading them
        for t in attention.streamed:
            born[t] = min(i for i, name in enumerate(io.layers)
                          if t in graph.layer(name).fmap_inputs)
    for i, name in enumerate(io.layers):
        for t in graph.layer(name).outputs:
            if t:
                born[t] = i
    steps: list[list[str]] = [[] for _ in io.layers]
    for t, b in born.items():  # in birth order, as the steps list them
        if t in io.in_place:  # in its held buffer, counted beside the group
            continue
        gap = reloaded.get(t) if reloaded else None
        for i in range(max(b, 0), last_use.get(t, b) + 1):
            if gap is None or not gap[0] < i < gap[1]:
                steps[i].append(t)
    for i in in_place_hosts(graph, io):  # the output is where its input was
        steps[i].remove(graph.layer(io.layers[i]).outputs[0])
    return [tuple(s) for s in steps]


def footprint(graph: Graph, io: GroupIO, boxes: dict[str, Box], steps: Sequence[tuple[str, ...]],
              dtype_bytes: int, staged: Sequence[int] = ()) -> int:
    """Peak live bytes of one tile: its feature maps, plus at each step the streamed weight
    bytes `staged` (one entry per step) where they share the memory."""
    attention = online_attention(graph, io)
    if attention is None:
        return max(
            sum(box_elems(graph, t, boxes[t]) for t in live if t in boxes) * dtype_bytes
            + (staged[i] if staged else 0) for i, live in enumerate(steps))
    elems = {t: box_elems(graph, t, b) for t, b in boxes.items()}
    return max(
        (sum(attention.onchip_elems(t, elems[t], boxes[t][3] - boxes[t][2])
             for t in live if t in elems)
         + attention.scratch_elems(i, elems)) * dtype_bytes
        + (staged[i] if staged else 0) for i, live in enumerate(steps))


def next_inputs_elems(graph: Graph, io: GroupIO, boxes: Mapping[str, Box]) -> int:
    """Elements a second input buffer prefetches for the next tile: its inputs' boxes (the
    first chunk of streamed keys and values)."""
    attention = online_attention(graph, io)
    if attention is None:
        return sum(box_elems(graph, t, boxes[t]) for t in io.inputs)
    return sum(attention.onchip_elems(t, box_elems(graph, t, boxes[t]), boxes[t][3] - boxes[t][2])
               for t in io.inputs)


def sram_staged(graph: Graph, io: GroupIO, chip: Chip, weights_resident: bool) -> tuple[int, ...]:
    """Streamed weight bytes in SRAM at each step: only on single-memory chips (WRAM holds
    them elsewhere), only when the weights stream."""
    if weights_resident or not chip.unified:
        return ()
    return staged_steps(graph, io, chip)


def _axis_sum(chain: AxisChain | None, extent: int, size: int) -> int | None:
    if chain is None:
        return None
    low = chain.min_tile(extent)
    if low is None or size < low:
        return None
    return chain.total(extent, min(size, extent))


def region_sum(graph: Graph, io: GroupIO, chains: GroupChains, tensor: str, tile: Tile) -> int:
    """Elements of `tensor` summed over all tiles: closed form where valid, else enumeration."""
    return region_sums(graph, io, chains, tile, [tensor])[tensor]


def region_sums(graph: Graph, io: GroupIO, chains: GroupChains, tile: Tile,
                tensors: Sequence[str],
                spans: Callable[[int, int], StripSpans] | None = None) -> dict[str, int]:
    """Elements of each tensor summed over all tiles.

    A tensor's box is a product of one range per axis, each depending only on the tile's
    range along that axis, so the sum over the tile grid is the product of one-axis sums:
    closed forms where valid, else one walk per tile along that axis (not per tile of the
    grid). ``spans(axis, size)``: the walk, where the caller keeps them across tiles.
    """
    extent = anchor_extent(graph, io)
    sizes = (tile.n, tile.h, tile.w)
    walk = spans or (lambda axis, size: StripSpans.of(graph, io, axis, size))
    walked: dict[int, Mapping[str, int]] = {}
    out = {}
    for t in tensors:
        parts = []
        for axis in range(3):
            closed = _axis_sum(chains.chains[t][axis], extent[axis], sizes[axis])
            if closed is None and axis == 1:  # a causal attention's prefix of keys
                rows = prefix_rows(graph, io, chains, t, extent[1], sizes[1])
                closed = None if rows is None else sum(rows)
            if closed is None:
                if axis not in walked:
                    walked[axis] = walk(axis, sizes[axis]).total
                closed = walked[axis].get(t, 0)
            parts.append(closed)
        out[t] = graph.dims(t)[1] * parts[0] * parts[1] * parts[2]
    return out


def _representative(extent: int, size: int) -> list[tuple[int, int]]:
    """Ranges whose regions differ: interior tiles are translates of each other."""
    ranges = axis_ranges(extent, size)
    if len(ranges) <= 6:
        return ranges
    return ranges[:3] + ranges[-3:]


def representative_boxes(graph: Graph, io: GroupIO, chains: GroupChains, tile: Tile
                         ) -> Iterator[dict[str, Box]]:
    """The boxes of every tensor for each tile whose footprint may differ from the others'
    (interior tiles are translates of each other where every range has a closed form;
    otherwise every tile)."""
    n, h, w = anchor_extent(graph, io)
    picking = picking_chains(graph, io, chains)
    exact = all(
        c is not None and (low := c.min_tile(ext)) is not None and size >= low
        for ch in picking.chains.values()
        for c, ext, size in zip(ch, (n, h, w), (tile.n, tile.h, tile.w), strict=True)
    )
    pick = _representative if exact else axis_ranges
    rows, cols = (AxisSchedule(graph, io, picking, axis, size, reusing=False).picked_ranges()
                  for axis, size in ((1, tile.h), (2, tile.w)))
    for n0, n1 in pick(n, tile.n):
        for r0, r1 in rows:
            for c0, c1 in cols:
                yield tile_regions(graph, io, (n0, n1, r0, r1, c0, c1))


def peak_bytes(graph: Graph, io: GroupIO, chains: GroupChains, tile: Tile, chip: Chip,
               weights_resident: bool = True, double_buffered: bool = False,
               halo_reuse: bool = False, weights_outer: bool = False,
               grid: ReuseGrid | None = None) -> int:
    """Exact SRAM peak over all tiles: feature maps, plus on single-memory chips the resident
    weights, or the streamed chunks of each step (planner.cost.weight_stream; halo-reusing
    tiles reserve the largest pair for all their steps). ``grid``: the tile's halo-reusing
    grid when a tile search has built it (its axes and any peak it holds are reused)."""
    steps = live_steps(graph, io)
    peak = 0
    staged = sram_staged(graph, io, chip, weights_resident)
    if weights_outer:
        return _weights_outer_peak(graph, io, tile, chip, double_buffered, staged)
    if halo_reuse and tile.bands > 1:
        return banded_sram_bytes(graph, io, chains, tile, chip, weights_resident,
                                 double_buffered)
    if halo_reuse:
        peak = (reuse_peak_elems(graph, io, chains, tile, double_buffered, grid)
                * chip.dtype_bytes
                + max(staged, default=0))
    if group_ring(graph, io, tile, chip, weights_resident, halo_reuse, weights_outer):
        return ring_peak(graph, io, chip, tile_regions(graph, io, edge_tiles(graph, io, tile)[0]),
                         double_buffered)
    for boxes in ([] if halo_reuse else representative_boxes(graph, io, chains, tile)):
        here = footprint(graph, io, boxes, steps, chip.dtype_bytes, staged)
        peak = max(peak, here)
        if double_buffered:  # the next tile's inputs arrive while this one computes
            nxt = next_inputs_elems(graph, io, boxes)
            peak = max(peak, here + nxt * chip.dtype_bytes)
    if chip.unified and weights_resident:
        peak += weight_bytes(graph, io.weights, chip)
    return peak


def weights_beside_maps(graph: Graph, io: GroupIO, chip: Chip, weights_resident: bool) -> int:
    """Weight bytes a halo-reusing tile's SRAM peak holds beside its feature maps: on
    single-memory chips the resident weights, or the largest streamed pair (reserved for
    every step); none where WRAM holds them (peak_bytes, banded_sram_bytes)."""
    if not chip.unified:
        return 0
    return weight_bytes(graph, io.weights, chip) if weights_resident \
        else max(sram_staged(graph, io, chip, False), default=0)


def outer_chunks(graph: Graph, io: GroupIO, chip: Chip) -> tuple[int, list[int]]:
    """(output channels, each chunk's weight bytes) of a weights-outer group's one layer."""
    lay = graph.layer(io.layers[0])
    channels = graph.layout(lay.outputs[0]).dims(graph.shapes[lay.outputs[0]])[1]
    return channels, chunk_sizes(graph, lay, layer_chunks(graph, lay, chip), chip.dtype_bytes)


def _weights_outer_peak(graph: Graph, io: GroupIO, tile: Tile, chip: Chip,
                        double_buffered: bool, staged: Sequence[int]) -> int:
    """SRAM peak of a weights-outer group: a tile's input boxes and its widest slice of
    output channels, (the next tile's inputs,) and on single-memory chips the chunks in
    flight."""
    channels, sizes = outer_chunks(graph, io, chip)
    width = chunk_width(channels, len(sizes))
    out = io.outputs[0]
    n, h, w = anchor_extent(graph, io)
    peak = 0
    for n0, n1 in axis_ranges(n, tile.n):
        for r0, r1 in axis_ranges(h, tile.h):
            for c0, c1 in axis_ranges(w, tile.w):
                boxes = tile_regions(graph, io, (n0, n1, r0, r1, c0, c1))
                loaded = sum(box_elems(graph, t, boxes[t]) for t in io.inputs)
                made = box_elems(graph, out, boxes[out]) // channels * width
                peak = max(peak, (loaded * (2 if double_buffered else 1) + made)
                           * chip.dtype_bytes)
    return peak + max(staged, default=0)


def weights_outer_work(graph: Graph, io: GroupIO, chains: GroupChains, tile: Tile,
                       chip: Chip) -> Counters:
    """work_counters of a weights-outer group: every chunk of weights loaded once and swept
    over every tile, so the inputs are read once per chunk and each output channel written
    once."""
    dt = chip.dtype_bytes
    channels, sizes = outer_chunks(graph, io, chip)
    chunks = len(sizes)
    tiles = tile_count(graph, io, tile)
    sums = region_sums(graph, io, chains, tile, group_tensors(graph, io))
    uses = in_group_uses(graph, io)
    loads = sum(sums[t] for t in io.inputs)
    fmap_read = chunks * loads * dt
    wread = sum(sizes)
    macs, array, vector_ops = layer_ops(graph, io, sums, chip)
    core_fmap = sum(sums[t] * (1 + uses.get(t, 0)) * (chunks if t in io.inputs else 1)
                    for t in sums) * dt
    first, last = edge_tiles(graph, io, tile)
    first_boxes = tile_regions(graph, io, first)
    out = io.outputs[0]
    once = sum(box_elems(graph, t, chains.full[t]) for t in io.inputs) * dt
    counted = Counters(
        dram_read_bytes=fmap_read + wread,
        dram_write_bytes=sum(graph.elems(t) for t in io.outputs) * dt,
        weight_read_bytes=wread,
        redundant_read_bytes=fmap_read - once,
        macs=macs, array_macs=array, vector_ops=vector_ops, core_fmap_bytes=core_fmap,
        core_weight_bytes=wread * tiles,
        first_load_bytes=sum(box_elems(graph, t, first_boxes[t]) for t in io.inputs) * dt
        + sizes[0],
        last_store_bytes=box_elems(graph, out, last) // channels
        * chunk_width(channels, chunks, last=True) * dt)
    return replace(counted, stall_cycles=_outer_stall(chip, counted, sizes,
                                                      tile_shares(graph, io, tile), loads * dt))


def _outer_stall(chip: Chip, c: Counters, sizes: Sequence[int], shares: Sequence[float],
                 sweep_bytes: int) -> int:
    """Cycles a double-buffered weights-outer group's cores wait beyond the closed form's
    overlap: each chunk's weights load with the first tile of its sweep over every tile
    (`shares`: each tile's part of the anchor), each chunk's share of the work and stores
    by its weight bytes, each tile's loads by its part of the sweep's."""
    total = sum(sizes)
    return round_stall(chip, c, [(size, [size / total * t for t in shares]) for size in sizes],
                       [sweep_bytes * t for t in shares])


def tile_shares(graph: Graph, io: GroupIO, tile: Tile) -> list[float]:
    """Each tile's part of the anchor, in execution order (edge tiles are smaller)."""
    n, h, w = anchor_extent(graph, io)
    return [(n1 - n0) * (r1 - r0) * (c1 - c0) / (n * h * w)
            for n0, n1 in axis_ranges(n, tile.n) for r0, r1 in axis_ranges(h, tile.h)
            for c0, c1 in axis_ranges(w, tile.w)]


# tiles the stall is played for one by one; past them, three rounds and their period
PLAYED_TILES = 2048


def round_stall(chip: Chip, c: Counters, rounds: Sequence[tuple[int, Sequence[float]]],
                tile_loads: Sequence[float]) -> int:
    """Cycles a double-buffered group's cores wait beyond the closed form's overlap when
    each round of tiles loads weights with its first tile (`rounds`: each round's weight
    bytes and each of its tiles' share of the group's work and stores; `tile_loads`: the
    feature-map bytes of each tile in run order, repeating when shorter); played by
    planner.cost.schedule. A long group plays three rounds and repeats the third's span
    (the buffers are in step by then)."""

    computes: dict[float, float] = {}  # by share: most tiles of a group are alike

    def tile_compute(share: float) -> float:
        if share not in computes:
            work = Counters(macs=round(c.macs * share), array_macs=round(c.array_macs * share),
                            vector_ops=round(c.vector_ops * share))
            computes[share] = compute_cycles(chip, work)
        return computes[share]

    def span(n: int) -> float:
        steps: list[Step] = []
        for size, shares in rounds[:n]:
            for k, share in enumerate(shares):
                load = tile_loads[len(steps) % len(tile_loads)]
                steps.append(Step(load + (size if k == 0 else 0), tile_compute(share),
                                  c.dram_write_bytes * share))
        return double_buffered_span(float(dram_bytes_per_cycle(chip)), steps)

    tiles = sum(len(s) for _, s in rounds)
    if len(rounds) <= 3 or tiles <= PLAYED_TILES:
        played = span(len(rounds))
    else:
        two, three = span(2), span(3)
        played = three + (len(rounds) - 3) * (three - two)
    fill, rest, drain = dram_phases(chip, c)
    compute = compute_cycles(chip, c)
    # the even shares stand in for each tile's own boxes (halos, edge tiles): less a tile's
    # mean compute, the wait stays under the emulator's, within a tile's work of it
    return max(0, floor(played) - (fill + max(rest, compute) + drain) - ceil(compute / tiles))


def dram_bytes_per_cycle(chip: Chip) -> Fraction:
    """DRAM bytes per clock cycle, exact (the CP-SAT encoding multiplies it out)."""
    return _ratio(chip.dram.bandwidth_gbps, chip.clock_ghz)


@lru_cache(maxsize=64)
def _ratio(numerator: float, denominator: float) -> Fraction:
    """numerator / denominator as the exact ratio of their decimal spellings (a tile search
    times tens of thousands of tiles on one chip: parse each spelling once)."""
    return Fraction(str(numerator)) / Fraction(str(denominator))


def compute_cycles(chip: Chip, c: Counters) -> int:
    """Cycles of the cores: MACs on the matrix units, vector ops on the vector lanes; for a
    banded group, its slowest band's (the bands run at once on their own cores), for a
    cluster split its busiest cluster's (band_compute_cycles both); a cluster split's
    gathers cross every cluster's link at once while the cores compute."""
    core = c.band_compute_cycles or (
        ceil(matrix_macs(chip, c.macs, c.array_macs) / (chip.cores * chip.core.macs_per_cycle))
        + ceil(c.vector_ops / (chip.cores * chip.core.vector_lanes)))
    if not c.cluster_link_bytes:
        return core
    return max(core, ceil(c.cluster_link_bytes / chip.links_bytes_per_cycle))


def dram_phases(chip: Chip, c: Counters) -> tuple[int, int, int]:
    """(fill, remaining transfers, drain) in cycles of a double-buffered group."""
    bpc = dram_bytes_per_cycle(chip)
    fill, drain = transfer_cycles(c.first_load_bytes, bpc), transfer_cycles(c.last_store_bytes, bpc)
    rest = transfer_cycles(c.dram_bytes - c.first_load_bytes - c.last_store_bytes, bpc)
    return fill, rest, drain


def transfer_cycles(nbytes: int, bytes_per_cycle: Fraction) -> int:
    """ceil(nbytes / bytes_per_cycle), in integers (a tile search times millions of tiles;
    dividing by a Fraction is the dearer way to the same count)."""
    return -(-nbytes * bytes_per_cycle.denominator // bytes_per_cycle.numerator)


def cycles_energy(chip: Chip, c: Counters, double_buffered: bool,
                  prefetched: int = 0) -> tuple[int, float]:
    """Cycles and energy of a group from its counters.

    Compute: MACs on the matrix units and vector ops on the vector lanes of every core.
    With a second buffer the next tile loads while the current one computes, so a group
    costs fill (first load) + max(remaining DRAM transfers, compute) + drain (last store);
    without one, transfers and compute add up. Loads far from even stall the cores beyond
    that overlap (``stall_cycles``, planner.cost.schedule); a group of one tile, its layers
    computing as their weights arrive, hides ``overlap_cycles`` (planner.cost.layered); a prefetch
    spent ``prefetched`` cycles of the fill in the group before. Energy: energy_pj.
    """
    bpc = dram_bytes_per_cycle(chip)
    compute = compute_cycles(chip, c)
    hidden = min(c.overlap_cycles, compute)  # (its chunks' rounding may count a few more)
    if double_buffered:
        fill, rest, drain = dram_phases(chip, c)
        layered = fill + max(rest, compute - hidden) + drain + c.stall_cycles
    else:
        layered = transfer_cycles(c.dram_bytes, bpc) + compute - hidden
    # a prefetch hides no more than the weights' load time left after the overlap
    # (prefetch_cycles), so the two savings add up
    cycles = layered - prefetched
    return cycles, energy_pj(chip, c, cycles)


def idle_dram_cycles(chip: Chip, c: Counters, double_buffered: bool) -> int:
    """Cycles of a group's span in which the DRAM link moves nothing of its own: compute
    (less what its first tile hides behind its own loads) beyond the remaining transfers
    when double-buffered, all of it when loads, compute and stores run one after another."""
    compute = max(0, compute_cycles(chip, c) - c.overlap_cycles)
    if double_buffered:
        _, rest, _ = dram_phases(chip, c)
        return max(0, compute - rest)
    return compute


def weight_prefetch_cycles(chip: Chip, weight_bytes_next: int) -> int:
    """Whole cycles the next group's weights occupy the DRAM link (the most it can hide)."""
    return int(weight_bytes_next // dram_bytes_per_cycle(chip))


def prefetch_cycles(chip: Chip, prev: Counters, prev_double_buffered: bool,
                    weight_bytes_next: int, overlap_next: int = 0) -> int:
    """Fill cycles of a group hidden behind the previous group: its weights load while the
    DRAM link is idle there, up to their own load time less what its first tile's compute
    hides of them anyway (``overlap_next``; the caller checks they fit)."""
    return min(idle_dram_cycles(chip, prev, prev_double_buffered),
               max(0, weight_prefetch_cycles(chip, weight_bytes_next) - overlap_next))


def group_tensors(graph: Graph, io: GroupIO) -> list[str]:
    """Every tensor a tile touches: loaded inputs and every layer output."""
    produced = [t for name in io.layers for t in graph.layer(name).outputs if t]
    return list(io.inputs) + [t for t in produced if t in graph.shapes]


def edge_tiles(graph: Graph, io: GroupIO, tile: Tile) -> tuple[Box, Box]:
    """Anchor boxes of the first and the last tile."""
    n, h, w = anchor_extent(graph, io)
    first = (0, min(tile.n, n), 0, min(tile.h, h), 0, min(tile.w, w))
    last_n, last_h, last_w = (axis_ranges(n, tile.n)[-1], axis_ranges(h, tile.h)[-1],
                              axis_ranges(w, tile.w)[-1])
    return first, (*last_n, *last_h, *last_w)


def work_counters(graph: Graph, io: GroupIO, chains: GroupChains, tile: Tile, chip: Chip,
                  weights_resident: bool = True, halo_reuse: bool = False,
                  grid: ReuseGrid | None = None, weights_outer: bool = False) -> Counters:
    """Every counter but the SRAM peak, cycles and energy (closed forms; cheap).

    With halo reuse every element is loaded or computed once and each layer reads only
    what its new part needs (planner.geometry.halo_reuse); weights outer, see
    weights_outer_work.
    """
    if weights_outer:
        return weights_outer_work(graph, io, chains, tile, chip)
    once = resident_work(graph, io, chains, tile, chip, halo_reuse, grid)
    if weights_resident:
        return once
    out = reread_weights(once, weight_passes(graph, io, tile, chip, halo_reuse), chip,
                         tile_shares(graph, io, tile))
    return replace(out, overlap_cycles=streamed_overlap(graph, io, tile, chip, once)) \
        if tile_count(graph, io, tile) == 1 and layered_applies(io, halo_reuse) else out


def streamed_overlap(graph: Graph, io: GroupIO, tile: Tile, chip: Chip, once: Counters) -> int:
    """overlap_cycles of a streamed group of one tile (planner.cost.layered), from its
    resident counters `once`."""
    first = tile_regions(graph, io, edge_tiles(graph, io, tile)[0])
    return first_tile_overlap(graph, io, first, chip, once.first_load_bytes
                              - once.weight_read_bytes, True, weight_ring(graph, io, chip, first))


def group_ring(graph: Graph, io: GroupIO, tile: Tile, chip: Chip, weights_resident: bool,
               halo_reuse: bool = False, weights_outer: bool = False) -> int:
    """weight_ring of a group run tiles outer with `tile` (0 unless it streams its weights
    in one tile with halos recomputed)."""
    if weights_resident or weights_outer or halo_reuse or not layered_applies(io, False) \
            or tile_count(graph, io, tile) != 1:
        return 0
    return weight_ring(graph, io, chip, tile_regions(graph, io, edge_tiles(graph, io, tile)[0]))


def ring_peak(graph: Graph, io: GroupIO, chip: Chip, boxes: Mapping[str, Box],
              double_buffered: bool) -> int:
    """SRAM peak of a group whose weights run in a ring (weight_ring): all of SRAM, and a
    second input buffer past it (which then does not fit)."""
    second = next_inputs_elems(graph, io, boxes) * chip.dtype_bytes if double_buffered else 0
    return chip.sram.bytes + second


def weight_ring(graph: Graph, io: GroupIO, chip: Chip, boxes: dict[str, Box]) -> int:
    """Bytes of a ring the streamed weights of a group of one tile (regions `boxes`) run
    ahead in on a single-memory chip: all the SRAM its maps leave at their peak, when that
    holds its largest double-buffered pair; else 0 (the pair: planner.cost.layered). Its
    peak is then the whole SRAM, so no second input buffer fits beside it (one tile has
    no next tile to load anyway)."""
    staged = sram_staged(graph, io, chip, False)
    if not staged or not max(staged):  # no weights stream through it
        return 0
    room = chip.sram.bytes - footprint(graph, io, boxes, live_steps(graph, io), chip.dtype_bytes)
    return room if room >= max(staged) else 0


def weight_passes(graph: Graph, io: GroupIO, tile: Tile, chip: Chip,
                  halo_reuse: bool = False) -> int:
    """Times a group whose weights are not resident reads them: once per round of tiles
    (planner.geometry.rounds: one tile per cluster, each round sharing its reads), or with
    halo-reusing bands, once per tile of the longest band (the bands run side by side and
    share each read)."""
    if halo_reuse and tile.bands > 1:
        _, h, w = anchor_extent(graph, io)
        parts = band_columns(ceil(w / tile.w), tile.bands)
        return ceil(h / tile.h) * max(end - first for first, end in parts)
    return rounds(tile_count(graph, io, tile), round_size(chip, io, halo_reuse))


def reread_weights(once: Counters, passes: int, chip: Chip | None = None,
                   shares: Sequence[float] = ()) -> Counters:
    """Counters of resident weights (read once) turned into weights read `passes` times;
    nothing else depends on the residency, so a tile search costs the tile once for both.
    Given the chip and each tile's share of the anchor (tile_shares), each pass's weights
    load with the first tile of its round, and the cores' wait for them (round_stall) is
    counted."""
    extra = once.weight_read_bytes * (passes - 1)
    # streamed weights hold one step's chunks: none arrives ahead of its layer
    out = replace(once, dram_read_bytes=once.dram_read_bytes + extra,
                  weight_read_bytes=once.weight_read_bytes + extra, overlap_cycles=0)
    if chip is None or passes <= 1 or len(shares) < passes or once.band_compute_cycles \
            or not once.weight_read_bytes:  # no weights: nothing to wait for
        return out
    per_round = ceil(len(shares) / passes)
    fmap = once.dram_read_bytes - once.weight_read_bytes
    rounds = [(once.weight_read_bytes, shares[k:k + per_round])
              for k in range(0, len(shares), per_round)]
    loads = [fmap * t for t in shares]  # each tile its own (an edge tile loads less)
    return replace(out, stall_cycles=round_stall(chip, out, rounds, loads))


def resident_work(graph: Graph, io: GroupIO, chains: GroupChains, tile: Tile, chip: Chip,
                  halo_reuse: bool = False, grid: ReuseGrid | None = None) -> Counters:
    """work_counters with the weights resident (read once)."""
    if halo_reuse and tile.bands > 1:
        return banded_work(graph, io, chains, tile, chip,
                           ReuseGrid.bands_of(graph, io, chains, tile))
    dt = chip.dtype_bytes
    tiles = tile_count(graph, io, tile)
    sums = region_sums(graph, io, chains, tile, group_tensors(graph, io))
    if halo_reuse:
        grid = grid or ReuseGrid.of(graph, io, chains, tile)
    else:
        grid = None
    made = {t: grid.made_elems(t) for t in sums} if grid else sums
    loads = dram_loads(graph, io)
    fmap_read = sum(made[t] for t in loads) * dt
    wbytes = weight_bytes(graph, io.weights, chip)
    write = sum(graph.elems(t) for t in io.outputs) * dt
    macs, array, vector_ops = layer_ops(graph, io, made, chip)
    if grid is None:
        uses = in_group_uses(graph, io)
        core_fmap = sum(made[t] + sums[t] * uses.get(t, 0) for t in sums) * dt
    else:
        core_fmap = _reuse_core_elems(graph, io, grid, made) * dt
    first, last = edge_tiles(graph, io, tile)
    first_boxes = tile_regions(graph, io, first, reuse=halo_reuse)
    last_boxes = tile_regions(graph, io, last, reuse=halo_reuse)
    first_load = sum(box_elems(graph, t, first_boxes[t]) for t in loads) * dt + wbytes
    last_store = sum(box_elems(graph, t, last if t == io.anchor else last_boxes[t])
                     for t in io.outputs) * dt
    once = sum(box_elems(graph, t, chains.full[t]) for t in loads) * dt
    overlap = first_tile_overlap(graph, io, first_boxes, chip, first_load - wbytes) \
        if tiles == 1 and layered_applies(io, halo_reuse) else 0
    return Counters(
        dram_read_bytes=fmap_read + wbytes,
        dram_write_bytes=write,
        weight_read_bytes=wbytes,
        redundant_read_bytes=fmap_read - once,
        macs=macs,
        array_macs=array,
        vector_ops=vector_ops,
        core_fmap_bytes=core_fmap,
        core_weight_bytes=wbytes * tiles,
        first_load_bytes=first_load,
        last_store_bytes=last_store,
        overlap_cycles=overlap,
    )


def layer_ops(graph: Graph, io: GroupIO, made: Mapping[str, int], chip: Chip
              ) -> tuple[int, int, int]:
    """(MACs of main layers, their array MACs, vector ops of the others) for `made`
    elements of each output."""
    macs = array = vector_ops = 0
    for name in io.layers:
        lay = graph.layer(name)
        if lay.outputs[0] in io.accumulated:
            ops = lay.macs  # each tile folds its part of the input in: the input once
            elems = prod(lay.out_shape)
        else:
            elems = made.get(lay.outputs[0], 0)
            ops = lay.macs_per_output * elems
        if lay.is_main:
            macs += ops
            array += array_macs(lay, chip, elems, ops)
        else:
            vector_ops += ops
    return macs, array, vector_ops


def _reuse_core_elems(graph: Graph, io: GroupIO, grid: ReuseGrid, made: Mapping[str, int]
                      ) -> int:
    """Elements a reusing grid's cores move on chip: each made once, plus what every layer
    reads for its new part."""
    return sum(made.values()) + sum(
        grid.read_elems(name, j) for name in io.layers if graph.layer(name).outputs[0] in made
        for j in range(len(graph.layer(name).fmap_inputs)))


def banded_work(graph: Graph, io: GroupIO, chains: GroupChains, tile: Tile, chip: Chip,
                grids: Sequence[ReuseGrid]) -> Counters:
    """resident_work of a halo-reusing group run in bands (planner.geometry.bands): each
    band's grid loads, computes, reads and stores what it makes (its overlap with the band
    before it included); the group's compute is its slowest band's; the weights are read
    once and broadcast to every band (streamed: weight_passes)."""
    dt = chip.dtype_bytes
    wbytes = weight_bytes(graph, io.weights, chip)
    tensors = [t for t in group_tensors(graph, io) if t in grids[0].rows.boxes(0)]
    read = write = macs = array = vector_ops = core = first = last = tiles = slowest = 0
    n = anchor_extent(graph, io)[0]
    loads = dram_loads(graph, io)
    for grid in grids:
        made = {t: grid.made_elems(t) for t in tensors}
        b_macs, b_array, b_vector_ops = layer_ops(graph, io, made, chip)
        macs, array, vector_ops = macs + b_macs, array + b_array, vector_ops + b_vector_ops
        slowest = max(slowest, band_compute_cycles(chip, matrix_macs(chip, b_macs, b_array),
                                                   b_vector_ops, tile.bands))
        read += sum(made[t] for t in loads)
        write += sum(made[t] for t in io.outputs)
        core += _reuse_core_elems(graph, io, grid, made)
        tiles += grid.rows.count * grid.cols.count
        (r0, r1), (c0, c1) = grid.rows.ranges[0], grid.cols.ranges[0]
        boxes = tile_regions(graph, io, (0, n, r0, r1, c0, c1))
        first += sum(box_elems(graph, t, boxes[t]) for t in loads)
        (r0, r1), (c0, c1) = grid.rows.ranges[-1], grid.cols.ranges[-1]
        end: Box = (0, n, r0, r1, c0, c1)
        boxes = tile_regions(graph, io, end)
        last += sum(box_elems(graph, t, end if t == io.anchor else boxes[t]) for t in io.outputs)
    once = sum(box_elems(graph, t, chains.full[t]) for t in loads) * dt
    return Counters(dram_read_bytes=read * dt + wbytes, dram_write_bytes=write * dt,
                    weight_read_bytes=wbytes, redundant_read_bytes=read * dt - once,
                    macs=macs, array_macs=array, vector_ops=vector_ops,
                    core_fmap_bytes=core * dt,
                    core_weight_bytes=wbytes * tiles, first_load_bytes=first * dt + wbytes,
                    last_store_bytes=last * dt, band_compute_cycles=slowest)


def band_peak_bytes(graph: Graph, io: GroupIO, chains: GroupChains, tile: Tile, chip: Chip,
                    double_buffered: bool, grids: Sequence[ReuseGrid] | None = None
                    ) -> list[int]:
    """Each band's exact feature-map peak (halo_reuse.reuse_peak_elems of its grid)."""
    grids = grids or ReuseGrid.bands_of(graph, io, chains, tile)
    return [reuse_peak_elems(graph, io, chains, tile, double_buffered, g) * chip.dtype_bytes
            for g in grids]


def banded_sram_bytes(graph: Graph, io: GroupIO, chains: GroupChains, tile: Tile, chip: Chip,
                      weights_resident: bool, double_buffered: bool,
                      grids: Sequence[ReuseGrid] | None = None) -> int:
    """SRAM of the fullest cluster under a banded group: its bands' peaks, plus on
    single-memory chips the resident weights or the largest streamed pair."""
    if not chip.unified:
        own = 0
    elif weights_resident:
        own = weight_bytes(graph, io.weights, chip)
    else:
        own = stage_peak(graph, io, chip)
    peaks = band_peak_bytes(graph, io, chains, tile, chip, double_buffered, grids)
    return max(cluster_loads(chip, peaks)) + own


def with_time(chip: Chip, c: Counters, double_buffered: bool, prefetched: int = 0) -> Counters:
    """The counters with cycles and energy filled in (``prefetched``: fill cycles spent
    during the previous group, see prefetch_cycles)."""
    cycles, energy = cycles_energy(chip, c, double_buffered, prefetched)
    return replace(c, cycles=cycles, energy_pj=energy, prefetch_cycles=prefetched)


def group_cost(graph: Graph, layers: Sequence[str], tile: Tile, chip: Chip,
               weights_resident: bool = True, double_buffered: bool = False,
               halo_reuse: bool = False, weights_outer: bool = False,
               grid: ReuseGrid | None = None) -> Counters:
    """Predicted counters of one group of layers executed with `tile` (``grid``: its
    halo-reusing grid, when a tile search has built it)."""
    io = group_io(graph, layers)
    chains = group_chains(graph, io)
    c = work_counters(graph, io, chains, tile, chip, weights_resident, halo_reuse,
                      weights_outer=weights_outer)
    c = replace(c, sram_peak_bytes=peak_bytes(graph, io, chains, tile, chip, weights_resident,
                                              double_buffered, halo_reuse, weights_outer,
                                              grid))
    return with_time(chip, c, double_buffered)


def head_chunked_cost(graph: Graph, layers: Sequence[str], tile: Tile, chip: Chip,
                      double_buffered: bool, chunks: int) -> Counters:
    """A lone fused attention layer run in `chunks` chunks of heads per tile
    (planner.geometry.attention.attention_heads): the same bytes, work and tiles as run
    whole, each tile's chunks one after the other; on chip one chunk at a time, so the peak
    is the whole run's divided by the chunks (every tensor holds the heads on axis 1)."""
    c = group_cost(graph, layers, tile, chip, True, double_buffered)
    return replace(c, sram_peak_bytes=c.sram_peak_bytes // chunks)


def compulsory_bytes(graph: Graph, chip: Chip) -> int:
    """The floor: every weight, the used part of every model input and every row a gather of
    a constant table fetches (its index count x its row) read once, every model output
    written once (rows a strided layer never reads need not be loaded at all)."""
    weights = {w for lay in graph.layers for w in lay.weights}
    # what the outputs need, walked back through every layer: the used part of each input
    whole = group_io(graph, [lay.name for lay in graph.layers])
    need = tile_regions(graph, whole, full_box(graph, whole.anchor))
    # and the rows a gather of a constant table fetches (Graph.row_gathers), each index's once
    used = sum(box_elems(graph, t, need[t])
               for t in [*graph.inputs, *graph.row_gathers] if t in need)
    fmaps = used + sum(graph.elems(t) for t in graph.outputs)
    return fmaps * chip.dtype_bytes + weight_bytes(graph, weights, chip)

