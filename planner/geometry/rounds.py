"""Cluster rounds: a group's tiles run a round at a time, one tile per cluster, and share
each streamed weight load.

Each cluster holds one tile in its SRAM, split over its cores (rules 12 and 17 check a
tile against one cluster's memories), so a chip with C clusters runs C tiles side by side.
Where the tiles do not depend on each other, they go in rounds of C consecutive tiles (in
iter_tiles order) that run in step: a streamed weight chunk is read from DRAM once per round
and broadcast to every cluster's cores, as the bands of planner.geometry.bands share theirs.
A group of T tiles with streamed weights then reads them ceil(T / C) times, not T times:
the same images or rows, only fewer weight reads (at batch 8 on four clusters, a tile of two
images reads each weight once).

Tiles that depend on each other run one at a time (rounds of one tile): halo-reusing tiles
keep on chip what the next tile reads, and an accumulating reduction adds every tile into
one on-chip accumulator. The cost model (planner.cost.model.weight_passes), CP-SAT
(solver.cpsat) and the emulator (emulator.tally.Tally) read the round size from here.
"""

from __future__ import annotations

from fuseplan.hardware.chip import Chip
from fuseplan.planner.geometry.regions import GroupIO


def round_size(chip: Chip, io: GroupIO, halo_reuse: bool) -> int:
    """Tiles per round: one per cluster where the tiles are independent, else one."""
    if halo_reuse or io.accumulated:
        return 1
    return chip.clusters


def rounds(tiles: int, size: int) -> int:
    """Rounds of `size` tiles that run `tiles` tiles (the last one may be short)."""
    return -(-tiles // size)


def leads_round(index: int, size: int) -> bool:
    """Whether tile `index` (in run order) starts a round: its streamed weights are read
    then, and the round's other tiles receive the same broadcast."""
    return index % size == 0
