"""The cost of a group split over the clusters (planner.geometry.cluster_split).

Its DRAM traffic, tiles and work are those of the same tiles run with resident weights (the
tiles run one at a time, all clusters on each; the weights load once), but for the
replicated layers, whose work is done on every cluster (``replicated_ops``). What changes
besides is where the weights sit, each cluster holding its share (``split_weight_bytes``:
what the weight memory of one cluster must hold), and the cluster links, which carry every
gathered map's tile to the C - 1 clusters that did not make each share (``link_bytes``);
the gathers run while the cores compute (planner.cost.model.compute_cycles).
"""

from __future__ import annotations

from dataclasses import replace

from fuseplan.hardware.chip import Chip
from fuseplan.planner.cost.counters import Counters
from fuseplan.planner.cost.model import (
    peak_bytes,
    region_sums,
    resident_work,
    weight_bytes,
    with_time,
)
from fuseplan.planner.cost.weight_stream import chunk_sizes
from fuseplan.planner.geometry.cluster_split import ClusterSplit, cluster_split
from fuseplan.planner.geometry.regions import GroupChains, GroupIO, Tile, group_chains, group_io
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


def link_bytes(graph: Graph, io: GroupIO, chains: GroupChains, tile: Tile,
               split: ClusterSplit, chip: Chip) -> int:
    """Bytes the gathers move over the cluster links: every tile of every gathered map to
    the clusters that did not make each share, C - 1 copies of it in all."""
    made = region_sums(graph, io, chains, tile, split.gathered)
    return (chip.clusters - 1) * chip.dtype_bytes * sum(made.values())


def replicated_ops(graph: Graph, io: GroupIO, chains: GroupChains, tile: Tile,
                   split: ClusterSplit, chip: Chip) -> int:
    """Vector ops the replicated layers add: each runs whole on every cluster, C - 1 times
    more than once."""
    outs = {graph.layer(name).outputs[0]: graph.layer(name) for name in split.replicated}
    made = region_sums(graph, io, chains, tile, tuple(outs))
    return (chip.clusters - 1) * sum(lay.macs_per_output * made[t] for t, lay in outs.items())


def cluster_split_cost(graph: Graph, layers: tuple[str, ...], tile: Tile, chip: Chip,
                       double_buffered: bool) -> Counters:
    """Every counter of a group of these layers split over the clusters (split_cost)."""
    io = group_io(graph, layers)
    split = cluster_split(graph, io)
    if split is None:
        raise ValueError(f"group of {layers[0]!r} cannot be split over the clusters")
    return split_cost(graph, io, group_chains(graph, io), split, tile, chip, double_buffered)


def split_cost(graph: Graph, io: GroupIO, chains: GroupChains, split: ClusterSplit,
               tile: Tile, chip: Chip, double_buffered: bool,
               work: Counters | None = None) -> Counters:
    """Every counter of a group split over the clusters (``work``: the tile's counters with
    resident weights, when a tile search has them). Each cluster holds every map whole (the
    gathers fill in the shares of the others), so the SRAM peak is the tile's; on a chip
    without WRAM a cluster's share of the weights sits beside it. A group of one tile loads
    its weights, then computes (no layer-by-layer overlap)."""
    once = work if work is not None else resident_work(graph, io, chains, tile, chip)
    peak = peak_bytes(graph, io, chains, tile, chip, True, double_buffered)
    if chip.unified:
        peak += split_weight_bytes(graph, io, split, chip) - weight_bytes(graph, io.weights,
                                                                          chip)
    # a tile is not played layer by layer (planner.cost.layered): its layers wait for their
    # gathers as well as their weights, which that schedule does not model
    c = replace(once, cluster_link_bytes=link_bytes(graph, io, chains, tile, split, chip),
                sram_peak_bytes=peak, overlap_cycles=0,
                vector_ops=once.vector_ops + replicated_ops(graph, io, chains, tile, split,
                                                            chip))
    return with_time(chip, c, double_buffered)
