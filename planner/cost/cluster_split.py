"""The cost of a group split over the clusters (planner.geometry.cluster_split).

Its DRAM traffic, tiles and work are those of the same tiles run with resident weights (the
tiles run one at a time, all clusters on each; the weights load once), but for the
replicated layers, whose work is done on every cluster (``replicated_work``). What changes
besides is where the weights sit, each cluster holding its share (``split_weight_bytes``:
what the weight memory of one cluster must hold), and the cluster links, which carry every
gathered map's tile to the C - 1 clusters that did not make each share (``link_bytes``);
the gathers run while the cores compute (planner.cost.model.compute_cycles). Row tiles that
reuse halos (a decoder layer keeping, or spilling, its attention's keys: solver.split_reuse)
cost as the reusing group does (planner.cost.spilled_keys where they spill), each gather
and replicated layer counting what a tile makes of its map.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from fractions import Fraction
from math import ceil

from fuseplan.hardware.chip import Chip
from fuseplan.planner.cost.counters import Counters
from fuseplan.planner.cost.model import (
    layer_ops,
    peak_bytes,
    region_sums,
    resident_work,
    weight_bytes,
    with_time,
)
from fuseplan.planner.cost.spilled_keys import spilled_work
from fuseplan.planner.cost.weight_stream import chunk_sizes
from fuseplan.planner.geometry.cluster_split import (
    ClusterSplit,
    busiest_shares,
    cluster_split,
    wram_keys,
)
from fuseplan.planner.geometry.halo_reuse import ReuseGrid
from fuseplan.planner.geometry.regions import GroupChains, GroupIO, Tile, group_chains, group_io
from fuseplan.planner.ir.array import matrix_macs
from fuseplan.planner.ir.graph import Graph


def split_weight_bytes(graph: Graph, io: GroupIO, split: ClusterSplit, chip: Chip) -> int:
    """Weight bytes one cluster holds: the largest share of each split layer's (a share of
    its output channels, with the constants every share needs whole) and every other
    layer's weights whole."""
    seen: set[str] = set()
    total = 0
    for name in io.layers:
        lay = graph.layer(name)
        fresh = set(lay.weights) - seen
        if not fresh:
            continue
        seen |= fresh
        if name in split.split:
            total += chunk_sizes(graph, lay, chip.clusters, chip.dtype_bytes)[0]
        else:
            total += weight_bytes(graph, fresh, chip)
    return total


def group_split_weight_bytes(graph: Graph, io: GroupIO, chip: Chip) -> int | None:
    """split_weight_bytes of a group that splits over the clusters, else None."""
    split = cluster_split(graph, io)
    return None if split is None else split_weight_bytes(graph, io, split, chip)


def split_key_bytes(graph: Graph, io: GroupIO, chip: Chip, grid: ReuseGrid) -> int | None:
    """Bytes of kept keys and values the busiest cluster of a split group holds in its
    cores' WRAM when they stay there (Mode.keys_in_wram), at most, over the tiles of
    `grid`: its heads' share (planner.geometry.cluster_split.wram_keys) of what each tile
    keeps for later ones; None where the group cannot keep them so."""
    split = cluster_split(graph, io)
    found = None if split is None else wram_keys(graph, io, split, chip.clusters)
    if found is None:
        return None
    shares = {t: Fraction(n, graph.elems(t)) for t, n in found.items()}
    return grid.wram_peak_elems(shares) * chip.dtype_bytes


def link_bytes(graph: Graph, made: Mapping[str, int], split: ClusterSplit, chip: Chip) -> int:
    """Bytes the gathers move over the cluster links: every tile's part of every gathered
    map (`made`: elements made per map over the tiles) to the clusters that did not make
    each share, C - 1 copies of it in all."""
    return (chip.clusters - 1) * chip.dtype_bytes * sum(made[t] for t in split.gathered)


def replicated_work(graph: Graph, io: GroupIO, made: Mapping[str, int], split: ClusterSplit,
                    chip: Chip) -> tuple[int, int, int]:
    """(MACs, array MACs, vector ops) the replicated layers add: each runs whole on every
    cluster, C - 1 times more than once (a normalisation's vector ops on every cluster's
    vector unit; the scores of queries and keys left unfused on every matrix unit)."""
    c = chip.clusters
    outs = {t for name in split.replicated for t in graph.layer(name).outputs if t}
    once = {t: made[t] for t in outs}
    macs, array, vector = layer_ops(graph, io, once, chip)
    _, all_array, _ = layer_ops(graph, io, {t: n * c for t, n in once.items()}, chip)
    return (c - 1) * macs, all_array - array, (c - 1) * vector


def busiest_work(graph: Graph, io: GroupIO, made: Mapping[str, int], split: ClusterSplit,
                 chip: Chip) -> tuple[int, int, int]:
    """(MACs, array MACs, vector ops) of the busiest cluster, for `made` elements of each
    layer's output: its part of every shared-out layer's (busiest_shares), every
    replicated layer's whole."""
    busy = dict(made)
    for name, (length, part) in busiest_shares(graph, io, split, chip.clusters).items():
        out = graph.layer(name).outputs[0]  # whole along the cut axis: tiles cut rows
        busy[out] = made.get(out, 0) // length * part
    return layer_ops(graph, io, busy, chip)


def busiest_cycles(chip: Chip, work: tuple[int, int, int]) -> int:
    """Cycles the busiest cluster's cores compute `work` (busiest_work) in."""
    macs, array, vector = work
    cores = chip.cores_per_cluster
    return (ceil(matrix_macs(chip, macs, array) / (cores * chip.core.macs_per_cycle))
            + ceil(vector / (cores * chip.core.vector_lanes)))


def cluster_split_cost(graph: Graph, layers: tuple[str, ...], tile: Tile, chip: Chip,
                       double_buffered: bool, halo_reuse: bool = False,
                       keys_spilled: bool = False, keys_in_wram: bool = False) -> Counters:
    """Every counter of a group of these layers split over the clusters (split_cost), its
    row tiles reusing halos (`halo_reuse`) and spilling its kept keys (`keys_spilled`) or
    keeping them in WRAM (`keys_in_wram`: the SRAM peak without them)."""
    io = group_io(graph, layers)
    split = cluster_split(graph, io)
    if split is None:
        raise ValueError(f"group of {layers[0]!r} cannot be split over the clusters")
    chains = group_chains(graph, io)
    grid = ReuseGrid.of(graph, io, chains, tile, spilled=keys_spilled,
                        keys_in_wram=keys_in_wram) if halo_reuse else None
    return split_cost(graph, io, chains, split, tile, chip, double_buffered, grid=grid)


def split_work(graph: Graph, io: GroupIO, chains: GroupChains, tile: Tile, chip: Chip,
               grid: ReuseGrid | None = None) -> Counters:
    """The DRAM side and work of a split group's tiles before the split adds its own: the
    tiles with resident weights, halos recomputed or (``grid``) reused, kept keys spilled
    where the grid spills them. The same for one and two input buffers."""
    if grid is not None and grid.rows.spilled_tensors:
        return spilled_work(graph, io, chains, tile, chip, grid)
    return resident_work(graph, io, chains, tile, chip, grid is not None, grid)


def split_cost(graph: Graph, io: GroupIO, chains: GroupChains, split: ClusterSplit,
               tile: Tile, chip: Chip, double_buffered: bool,
               work: Counters | None = None, grid: ReuseGrid | None = None) -> Counters:
    """Every counter of a group split over the clusters (``work``: the tile's counters with
    resident weights, when a tile search has them; ``grid``: its halo-reusing grid, which
    may spill kept keys, when its row tiles reuse halos). Each cluster holds every map
    whole (the gathers fill in the shares of the others), so the SRAM peak is the tile's;
    on a chip without WRAM a cluster's share of the weights sits beside it. A group of one
    tile loads its weights, then computes (no layer-by-layer overlap)."""
    once = work if work is not None else split_work(graph, io, chains, tile, chip, grid)
    peak = peak_bytes(graph, io, chains, tile, chip, True, double_buffered, grid is not None,
                      False, grid)
    if chip.unified:
        peak += split_weight_bytes(graph, io, split, chip) - weight_bytes(graph, io.weights,
                                                                          chip)
    # what the tiles make of every map (a reusing tile its new part; a recomputing tile its
    # whole region): the gathers, the replicated layers' work, the busiest cluster's
    wanted = tuple(dict.fromkeys(t for n in io.layers for t in graph.layer(n).outputs if t))
    made = {t: grid.made_elems(t) for t in wanted} if grid is not None \
        else region_sums(graph, io, chains, tile, wanted)
    macs, array, vector = replicated_work(graph, io, made, split, chip)
    # a tile is not played layer by layer (planner.cost.layered): its layers wait for their
    # gathers as well as their weights, which that schedule does not model; the clusters
    # compute side by side, as long as the busiest does
    c = replace(once, cluster_link_bytes=link_bytes(graph, made, split, chip),
                sram_peak_bytes=peak, overlap_cycles=0, macs=once.macs + macs,
                array_macs=once.array_macs + array, vector_ops=once.vector_ops + vector,
                band_compute_cycles=busiest_cycles(chip, busiest_work(graph, io, made, split,
                                                                      chip)))
    return with_time(chip, c, double_buffered)
