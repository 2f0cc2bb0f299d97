"""The cost of a group whose kept keys spill (Mode.keys_spilled).

A prefill group that makes a causal attention's keys and values itself runs its row tiles
in order with halos reused (planner.geometry.halo_reuse); held, its keys grow with every
tile until the last holds them all, which a long context does not fit. Spilled, each tile
writes the rows of keys and values it makes to DRAM and reads back the rows earlier tiles
made, a chunk of keys at a time, as FlashAttention streams them: the input is still read
once and the output written once, and the keys cost one write and, over T tiles, about
(T - 1) / 2 reads of themselves.

Everything else is the reusing group's (planner.cost.model.resident_work on the spilled
grid, whose retention keeps nothing of the spilled tensors between tiles and whose peak
holds one chunk of earlier keys at the attention step); this module adds the DRAM side.
"""

from __future__ import annotations

from dataclasses import replace

from fuseplan.hardware.chip import Chip
from fuseplan.planner.cost.counters import Counters
from fuseplan.planner.cost.model import peak_bytes, resident_work, with_time
from fuseplan.planner.geometry.halo_reuse import ReuseGrid
from fuseplan.planner.geometry.regions import GroupChains, GroupIO, Tile, group_chains, group_io
from fuseplan.planner.ir.graph import Graph


def spilled_work(graph: Graph, io: GroupIO, chains: GroupChains, tile: Tile, chip: Chip,
                 grid: ReuseGrid) -> Counters:
    """Every counter but the time and the SRAM peak, `grid` spilling its kept keys: the
    reusing group's, plus each spilled tensor written once (the last tile's rows are its
    last store) and read back by the tiles after the one that made each row (on chip as
    they arrive, as any load)."""
    assert grid.rows.spilled_tensors, "a spilled grid (ReuseGrid.spilling)"
    base = resident_work(graph, io, chains, tile, chip, True, grid)
    dt = chip.dtype_bytes
    spilled = sorted(grid.rows.spilled_tensors)
    back = sum(grid.readback_elems(t) for t in spilled) * dt
    out = sum(grid.made_elems(t) for t in spilled) * dt
    last = sum(grid.made_now(t, grid.rows.count - 1, grid.cols.count - 1)
               for t in spilled) * dt
    return replace(base, dram_read_bytes=base.dram_read_bytes + back,
                   dram_write_bytes=base.dram_write_bytes + out,
                   redundant_read_bytes=base.redundant_read_bytes + back,
                   core_fmap_bytes=base.core_fmap_bytes + back,
                   last_store_bytes=base.last_store_bytes + last)


def spilled_keys_cost(graph: Graph, layers: tuple[str, ...], tile: Tile, chip: Chip,
                      double_buffered: bool, grid: ReuseGrid | None = None,
                      work: Counters | None = None) -> Counters:
    """Predicted counters of a group run with its kept keys spilled (``grid``: its spilled
    grid where a search has built it; ``work``: its spilled_work, where a search has it
    for the tile's other buffering)."""
    io = group_io(graph, layers)
    chains = group_chains(graph, io)
    grid = grid or ReuseGrid.of(graph, io, chains, tile, spilled=True)
    c = work if work is not None else spilled_work(graph, io, chains, tile, chip, grid)
    c = replace(c, sram_peak_bytes=peak_bytes(graph, io, chains, tile, chip, True,
                                              double_buffered, True, False, grid))
    return with_time(chip, c, double_buffered)
