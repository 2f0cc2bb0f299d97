"""The cost model: predicted counters of a group executed with a given tile.

One model serves every planner (CP-SAT encodes the same closed forms, see
solver/cpsat.py) and is checked by the emulator, which counts the bytes it
actually moves. Execution model, per group:

* tiles of the anchor are processed in order (batch, rows, columns); each tile
  loads from DRAM the box of every external input it needs (halo included,
  overlapping tiles re-read their halo), computes every layer of the group on
  chip and stores its box of the anchor; other outputs force a single tile;
* weights are read once per group when resident (held in WRAM, or in SRAM on
  single-memory chips), else streamed once per tile;
* on chip, a tensor lives from its load/production to its last consumer in the
  group; the SRAM footprint of a tile is the peak of live feature-map bytes
  (plus the weights on single-memory chips);
* cycles = max(DRAM time, compute time) (loads double-buffered behind compute),
  energy = DRAM bytes x (DRAM + SRAM pJ/B) + MACs x pJ/MAC + static power x time.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from math import ceil

from hardware.chip import Chip
from planner.ir import Graph
from planner.regions import (
    AxisChain,
    Box,
    GroupChains,
    GroupIO,
    Tile,
    anchor_extent,
    axis_ranges,
    box_elems,
    dims,
    group_chains,
    group_io,
    tile_regions,
)


@dataclass(frozen=True)
class Counters:
    """Predicted (or emulated) counters of one group or a whole plan."""

    dram_read_bytes: int = 0  # feature maps and weights
    dram_write_bytes: int = 0
    weight_read_bytes: int = 0
    redundant_read_bytes: int = 0  # halo re-reads beyond each input read once
    sram_peak_bytes: int = 0
    macs: int = 0
    cycles: int = 0
    energy_pj: float = 0.0

    @property
    def dram_bytes(self) -> int:
        return self.dram_read_bytes + self.dram_write_bytes

    def __add__(self, other: Counters) -> Counters:
        return Counters(
            self.dram_read_bytes + other.dram_read_bytes,
            self.dram_write_bytes + other.dram_write_bytes,
            self.weight_read_bytes + other.weight_read_bytes,
            self.redundant_read_bytes + other.redundant_read_bytes,
            max(self.sram_peak_bytes, other.sram_peak_bytes),
            self.macs + other.macs,
            self.cycles + other.cycles,
            self.energy_pj + other.energy_pj,
        )


def weight_bytes(graph: Graph, weights: Iterable[str], chip: Chip) -> int:
    """Bytes of a set of weight tensors in the chip's storage dtype."""
    return sum(int(graph.constants[w].size) for w in set(weights)) * chip.dtype_bytes


def live_steps(graph: Graph, io: GroupIO) -> list[tuple[str, ...]]:
    """Tensors live on chip while each layer of the group runs (its inputs and outputs)."""
    last_use: dict[str, int] = {}
    for i, name in enumerate(io.layers):
        for t in graph.layer(name).fmap_inputs:
            last_use[t] = i
    end = len(io.layers) - 1
    for t in io.outputs:
        last_use[t] = end
    born: dict[str, int] = {t: -1 for t in io.inputs}
    for i, name in enumerate(io.layers):
        for t in graph.layer(name).outputs:
            if t:
                born[t] = i
    steps = []
    for i in range(len(io.layers)):
        steps.append(tuple(t for t, b in born.items() if b <= i <= last_use.get(t, b)))
    return steps


def footprint(graph: Graph, io: GroupIO, boxes: dict[str, Box], steps: Sequence[tuple[str, ...]],
              dtype_bytes: int) -> int:
    """Peak live feature-map bytes of one tile."""
    return max(
        sum(box_elems(graph, t, boxes[t]) for t in live if t in boxes) for live in steps
    ) * dtype_bytes


def _axis_sum(chain: AxisChain | None, extent: int, size: int) -> int | None:
    if chain is None:
        return None
    low = chain.min_tile(extent)
    if low is None or size < low:
        return None
    return chain.total(extent, min(size, extent))


def region_sum(graph: Graph, io: GroupIO, chains: GroupChains, tensor: str, tile: Tile) -> int:
    """Elements of `tensor` summed over all tiles: closed form where valid, else enumeration."""
    n, h, w = anchor_extent(graph, io)
    cn, cr, cc = chains.chains[tensor]
    parts = []
    for chain, extent, size in ((cn, n, tile.n), (cr, h, tile.h), (cc, w, tile.w)):
        parts.append(_axis_sum(chain, extent, size))
    if all(p is not None for p in parts):
        return dims(graph.shapes[tensor])[1] * parts[0] * parts[1] * parts[2]  # type: ignore[operator]
    return sum(box_elems(graph, tensor, tile_regions(graph, io, b)[tensor])
               for b in _tiles(n, h, w, tile))


def _tiles(n: int, h: int, w: int, tile: Tile) -> Iterable[Box]:
    for n0, n1 in axis_ranges(n, tile.n):
        for r0, r1 in axis_ranges(h, tile.h):
            for c0, c1 in axis_ranges(w, tile.w):
                yield n0, n1, r0, r1, c0, c1


def _representative(extent: int, size: int) -> list[tuple[int, int]]:
    """Ranges whose regions differ: interior tiles are translates of each other."""
    ranges = axis_ranges(extent, size)
    if len(ranges) <= 6:
        return ranges
    return ranges[:3] + ranges[-3:]


def peak_bytes(graph: Graph, io: GroupIO, chains: GroupChains, tile: Tile, chip: Chip,
               weights_resident: bool = True) -> int:
    """Exact SRAM peak over all tiles (feature maps, plus resident weights on single-memory chips).

    Streamed weights pass through a DMA staging buffer that is not modeled.
    """
    n, h, w = anchor_extent(graph, io)
    steps = live_steps(graph, io)
    exact = all(
        c is not None and (low := c.min_tile(ext)) is not None and size >= low
        for ch in chains.chains.values()
        for c, ext, size in zip(ch, (n, h, w), (tile.n, tile.h, tile.w), strict=True)
    )
    pick = _representative if exact else axis_ranges
    peak = 0
    for n0, n1 in pick(n, tile.n):
        for r0, r1 in pick(h, tile.h):
            for c0, c1 in pick(w, tile.w):
                boxes = tile_regions(graph, io, (n0, n1, r0, r1, c0, c1))
                peak = max(peak, footprint(graph, io, boxes, steps, chip.dtype_bytes))
    if chip.unified and weights_resident:
        peak += weight_bytes(graph, io.weights, chip)
    return peak


def dram_bytes_per_cycle(chip: Chip) -> Fraction:
    """DRAM bytes per clock cycle, exact (the CP-SAT encoding multiplies it out)."""
    return Fraction(str(chip.dram.bandwidth_gbps)) / Fraction(str(chip.clock_ghz))


def cycles_energy(chip: Chip, dram_bytes: int, macs: int) -> tuple[int, float]:
    """Cycles (DRAM transfers overlapped with compute) and energy of a group."""
    dram_cycles = ceil(dram_bytes / dram_bytes_per_cycle(chip))
    compute_cycles = ceil(macs / (chip.cores * chip.core.macs_per_cycle))
    cycles = max(dram_cycles, compute_cycles)
    seconds = cycles / (chip.clock_ghz * 1e9)
    energy = (dram_bytes * (chip.dram.pj_per_byte + chip.sram.pj_per_byte)
              + macs * chip.core.pj_per_mac + chip.static_power_mw * 1e-3 * seconds * 1e12)
    return cycles, energy


def traffic_macs(graph: Graph, io: GroupIO, chains: GroupChains, tile: Tile, chip: Chip,
                 weights_resident: bool = True) -> tuple[int, int, int, int]:
    """(feature-map read bytes, weight read bytes, write bytes, MACs): the cheap counters."""
    dt = chip.dtype_bytes
    n, h, w = anchor_extent(graph, io)
    tiles = ceil(n / tile.n) * ceil(h / tile.h) * ceil(w / tile.w)
    fmap_read = sum(region_sum(graph, io, chains, t, tile) for t in io.inputs) * dt
    wbytes = weight_bytes(graph, io.weights, chip) * (1 if weights_resident else tiles)
    write = sum(graph.elems(t) for t in io.outputs) * dt
    macs = sum(
        graph.layer(name).macs_per_output
        * region_sum(graph, io, chains, graph.layer(name).outputs[0], tile)
        for name in io.layers if graph.layer(name).macs_per_output
    )
    return fmap_read, wbytes, write, macs


def group_cost(graph: Graph, layers: Sequence[str], tile: Tile, chip: Chip,
               weights_resident: bool = True) -> Counters:
    """Predicted counters of one group of layers executed with `tile`."""
    io = group_io(graph, layers)
    chains = group_chains(graph, io)
    fmap_read, wbytes, write, macs = traffic_macs(graph, io, chains, tile, chip,
                                                  weights_resident)
    once = sum(box_elems(graph, t, chains.full[t]) for t in io.inputs) * chip.dtype_bytes
    read = fmap_read + wbytes
    cycles, energy = cycles_energy(chip, read + write, macs)
    return Counters(
        dram_read_bytes=read,
        dram_write_bytes=write,
        weight_read_bytes=wbytes,
        redundant_read_bytes=fmap_read - once,
        sram_peak_bytes=peak_bytes(graph, io, chains, tile, chip, weights_resident),
        macs=macs,
        cycles=cycles,
        energy_pj=energy,
    )


def compulsory_bytes(graph: Graph, chip: Chip) -> int:
    """The floor: every model input and weight read once, every model output written once."""
    weights = {w for lay in graph.layers for w in lay.weights}
    fmaps = sum(graph.elems(t) for t in graph.inputs) + sum(graph.elems(t) for t in graph.outputs)
    return fmaps * chip.dtype_bytes + weight_bytes(graph, weights, chip)
