"""Weight streaming: how a group's weights flow when they are not resident.

A streamed group loads each layer's weights just before the layer runs and drops them
after it, again for every round of tiles (tiles are the outer loop; the tiles of a round run
one per cluster and share each read, planner.geometry.rounds): its weight traffic is its
weight bytes times its rounds, which for a group of one round (whole maps on chip, SoMa's
schedule, or a batch split over the clusters) is every weight read exactly once.

A layer whose weights are large arrives in **output-channel chunks** (the op table's
``chunk_axis``): each chunk of weights is applied to the layer's whole input on chip and
yields its slice of the output channels, so only one chunk sits on chip at a time. Chunks
are double-buffered (as in rule 16: W_i + W_i+1 <= WRAM): while one computes, the next
loads -- the next chunk of the same layer, or the first chunk of the next layer with weights.
At step i of a tile the chip therefore holds ``chunk_i + next chunk`` bytes of weights:
in WRAM on chips with one (split along C_out over the cluster's cores), else in SRAM beside
the live maps.

A layer is cut into the fewest chunks whose largest is at most a quarter of the weight
memory (the cluster's WRAM, or the SRAM of a single-memory chip), so a double-buffered pair
takes at most half of it and leaves the rest to the maps and to a next-group prefetch. The
counts are a function of the chip and the layer alone: the cost model, the planners and
the emulator all derive them here, and the plan file states them.

Tiles that run layer by layer free each layer's chunks after its step; halo-reusing tiles
keep a static on-chip layout across tiles (the border rows of every tensor), so they
reserve one staging region for the group's largest pair during all their steps.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from fuseplan.hardware.chip import Chip
from fuseplan.planner.geometry.hidden import stream_holds
from fuseplan.planner.geometry.regions import GroupIO
from fuseplan.planner.ir.chunks import chunk_axes, chunk_ranges
from fuseplan.planner.ir.graph import Graph, Layer

STAGE_SHARE = 4  # a chunk takes at most 1/STAGE_SHARE of the weight memory


def stage_memory(chip: Chip) -> int:
    """Bytes of the memory streamed weights pass through: the cluster's WRAM, else SRAM."""
    if chip.wram is not None:
        return chip.wram.bytes * chip.cores_per_cluster
    return chip.sram.bytes


def _layer_bytes(graph: Graph, lay: Layer, dtype_bytes: int) -> int:
    return sum(int(graph.constants[w].size) for w in set(lay.weights)) * dtype_bytes


def _split_elems(graph: Graph, lay: Layer) -> tuple[int, int, int] | None:
    """(output channels, elements per channel of the split weights, elements of the weights
    every chunk needs whole), or None for a layer computed whole."""
    split = chunk_axes(graph, lay)
    if split is None:
        return None
    channels, axes = split
    per = whole = 0
    for w in set(lay.weights):
        size = int(graph.constants[w].size)
        if w in axes:
            per += size // channels
        else:
            whole += size
    return channels, per, whole


def chunk_sizes(graph: Graph, lay: Layer, chunks: int, dtype_bytes: int) -> list[int]:
    """Bytes of each of the layer's chunks of weights, in order (one entry when whole):
    equal chunks of ceil(C / chunks) channels, the last one possibly shorter."""
    split = _split_elems(graph, lay)
    if split is None or chunks <= 1:
        return [_layer_bytes(graph, lay, dtype_bytes)]
    channels, per, whole = split
    ranges = chunk_ranges(channels, chunks)
    size, last = ranges[0][1] - ranges[0][0], ranges[-1][1] - ranges[-1][0]
    return [(per * size + whole) * dtype_bytes] * (len(ranges) - 1) \
        + [(per * last + whole) * dtype_bytes]


def chunk_width(channels: int, chunks: int, last: bool = False) -> int:
    """Output channels in the first (widest) or the last of `chunks` equal chunks."""
    size = -(-channels // chunks)
    return channels - size * (chunks - 1) if last else size


def layer_chunks(graph: Graph, lay: Layer, chip: Chip) -> int:
    """The fewest output-channel chunks whose largest fits a quarter of the weight memory
    (1 for a layer that cannot be split; its channel count when even one channel is over)."""
    limit = stage_memory(chip) // STAGE_SHARE
    if _layer_bytes(graph, lay, chip.dtype_bytes) <= limit:
        return 1
    split = _split_elems(graph, lay)
    if split is None:
        return 1
    channels, per, whole = split
    dt = chip.dtype_bytes
    # a chunk of s channels takes (per * s + whole) * dt bytes: the widest that fits
    widest = (limit // dt - whole) // per if per else channels
    if widest < 1:
        return channels
    fewest = -(-channels // min(widest, channels))
    # equal ranges of ceil(C / fewest) channels: state how many such ranges there are
    return len(chunk_ranges(channels, fewest))


def chunk_counts(graph: Graph, layers: Sequence[str], chip: Chip) -> dict[str, int]:
    """Chunks of every layer with weights in `layers` (1: streamed whole)."""
    return {name: layer_chunks(graph, graph.layer(name), chip) for name in layers
            if graph.layer(name).weights}


def staged_steps(graph: Graph, io: GroupIO, chip: Chip,
                 counts: Mapping[str, int] | None = None) -> tuple[int, ...]:
    """Streamed weight bytes on chip at each step (layer of io.layers) of a tile: the most
    that any chunk of the running layer and the chunk loading behind it take together (a
    layer without weights holds the next layer's first chunk as it arrives)."""
    counts = chunk_counts(graph, io.layers, chip) if counts is None else counts
    dt = chip.dtype_bytes
    return tuple(stream_holds([(chunk_sizes(graph, graph.layer(n), counts[n], dt)
                                if n in counts else [], 0) for n in io.layers]))


def stage_peak(graph: Graph, io: GroupIO, chip: Chip) -> int:
    """The largest double-buffered pair of a streamed group (halo-reusing tiles reserve it)."""
    return max(staged_steps(graph, io, chip), default=0)
