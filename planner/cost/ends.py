"""Counters of a group whose input and output stream in channel chunks (planner.geometry.ends).

Streaming the ends changes what is on chip at once and how often two maps are touched by
the cores, nothing else:

* DRAM traffic, MACs and vector ops are those of the same tile run whole (each chunk of
  the input and of the weights is read once per tile, each chunk of the output written
  once); so are the tile's events on the DRAM link and the cores, hence its cycles;
* the first layer's step holds one chunk of the input, the whole output it sums into, and
  every other map alive then; the last layer's step holds the maps it reads and one chunk of
  its output, and so do the per-element layers after it (its tail: a bias, an activation),
  chunk by chunk, the last layer's inputs whole until its last chunk; the steps between
  are those of the tile run whole (all steps before the output end's, where it streams
  alone);
* every chunk after the first reads the first layer's partial sums and writes them back,
  and reads the last layer's inputs again: (k - 1) (2 |sums| + |inputs of the last layer|)
  more core traffic per tile (no sums without a first end);
* streamed weights arrive as a stream of loads (planner.geometry.ends.end_stream): the
  first layer's rows and the last layer's columns (with its tail's constants) a chunk at
  a time, the layers between in their output-channel chunks.
"""

from __future__ import annotations

from dataclasses import replace

from fuseplan.hardware.chip import Chip
from fuseplan.planner.cost.counters import Counters
from fuseplan.planner.cost.model import (
    live_steps,
    region_sums,
    representative_boxes,
    weight_bytes,
    with_time,
    work_counters,
)
from fuseplan.planner.cost.weight_stream import chunk_counts, chunk_sizes
from fuseplan.planner.geometry.ends import (
    Ends,
    EndStream,
    chunked_maps,
    end_stream,
    tail_constants,
    tail_steps,
)
from fuseplan.planner.geometry.regions import GroupChains, GroupIO, Tile, box_elems
from fuseplan.planner.ir.chunks import chunk_axes
from fuseplan.planner.ir.graph import Graph


def ends_stream(graph: Graph, io: GroupIO, ends: Ends, chunks: int, chip: Chip) -> EndStream:
    """The weight bytes on chip at each step when the group's weights stream."""
    dt = chip.dtype_bytes
    rows: list[int] = []
    if ends.first is not None:
        first = graph.layer(ends.first)
        columns = int(graph.constants[first.inputs[1]].shape[1])
        rows = [(hi - lo) * columns * dt for lo, hi in ends.source_ranges(chunks)]
    counts = chunk_counts(graph, io.layers, chip)
    at = io.layers.index(ends.last)
    middle = [chunk_sizes(graph, graph.layer(n), counts[n], dt) if graph.layer(n).weights
              else [] for n in io.layers[ends.start:at]]
    last = graph.layer(ends.last)
    split = chunk_axes(graph, last)
    assert split is not None  # chunked_ends checked it
    channels, _ = split
    per_channel = sum(int(graph.constants[w].size) for w in set(last.weights)) // channels
    whole = 0  # the tail's constants: per channel with each chunk, or whole (a scalar)
    for c, axis in tail_constants(graph, ends).items():
        size = int(graph.constants[c].size) if c in graph.constants else 0
        if axis is None:
            whole += size
        else:
            per_channel += size // channels
    cols = [((hi - lo) * per_channel + whole) * dt for lo, hi in ends.sink_ranges(chunks)]
    return end_stream(rows, middle, cols)


def ends_peak_bytes(graph: Graph, io: GroupIO, chains: GroupChains, ends: Ends, chunks: int,
                    tile: Tile, chip: Chip, weights_resident: bool) -> int:
    """Exact SRAM peak over every tile and chunk: the maps of each step (the ends a chunk
    wide) and, on single-memory chips, the weights (all of them when resident, else the
    stream's at each step)."""
    dt = chip.dtype_bytes
    steps = live_steps(graph, io)
    stream = ends_stream(graph, io, ends, chunks, chip) \
        if chip.unified and not weights_resident else None
    resident = weight_bytes(graph, io.weights, chip) \
        if chip.unified and weights_resident else 0
    src_ranges, sink_ranges = ends.source_ranges(chunks), ends.sink_ranges(chunks)
    at = io.layers.index(ends.last)
    cut = set(chunked_maps(graph, ends))
    # any chunk but the last holds the last layer's inputs through the tail
    held = tail_steps(graph, io, ends, steps)
    peak = 0
    for boxes in representative_boxes(graph, io, chains, tile):
        elems = {t: box_elems(graph, t, b) for t, b in boxes.items()}
        live = [sum(elems[t] for t in s if t in elems) for s in steps]
        if ends.source is not None:
            src = elems[ends.source]
            for j, (lo, hi) in enumerate(src_ranges):
                here = (live[0] - src + src // ends.reduced * (hi - lo)) * dt
                peak = max(peak, here + (stream.first[j] if stream else 0))
        for i in range(ends.start, at):
            peak = max(peak, live[i] * dt + (stream.middle[i - ends.start] if stream else 0))
        for j, (lo, hi) in enumerate(sink_ranges):
            # the output end's steps: its maps a chunk wide; the last layer's inputs stay
            # whole until the last chunk has read them
            at_j = held if j < len(sink_ranges) - 1 else steps
            for i in range(at, len(io.layers)):
                here = sum(elems[t] // ends.produced * (hi - lo) if t in cut else elems[t]
                           for t in at_j[i] if t in elems)
                peak = max(peak, here * dt + (stream.last[j] if stream else 0))
    return peak + resident


def ends_core_bytes(graph: Graph, io: GroupIO, chains: GroupChains, ends: Ends, chunks: int,
                    tile: Tile, dtype_bytes: int) -> int:
    """Core traffic the chunks add to the same tile run whole: every chunk after the first
    reads the first layer's partial sums and writes them back (where there is a first
    end), and reads the last layer's inputs again."""
    sums_of = graph.layer(ends.first).outputs[0] if ends.first is not None else None
    reads = graph.layer(ends.last).fmap_inputs
    sums = region_sums(graph, io, chains, tile,
                       sorted({*reads, *((sums_of,) if sums_of is not None else ())}))
    partial = 2 * sums[sums_of] if sums_of is not None else 0
    return (chunks - 1) * (partial + sum(sums[t] for t in reads)) * dtype_bytes


def ends_cost(graph: Graph, io: GroupIO, chains: GroupChains, ends: Ends, chunks: int,
              tile: Tile, chip: Chip, weights_resident: bool, work: Counters | None = None
              ) -> Counters:
    """Predicted counters of the group run with its ends in `chunks` chunks (``work``: its
    work_counters for this tile and residency, when the caller has them). One input buffer:
    the ends stream chunk by chunk within the tile."""
    base = work if work is not None else work_counters(graph, io, chains, tile, chip,
                                                       weights_resident)
    extra = ends_core_bytes(graph, io, chains, ends, chunks, tile, chip.dtype_bytes)
    peak = ends_peak_bytes(graph, io, chains, ends, chunks, tile, chip, weights_resident)
    # the ends stream in chunks: the first tile is not played layer by layer
    c = replace(base, core_fmap_bytes=base.core_fmap_bytes + extra, sram_peak_bytes=peak,
                overlap_cycles=0)
    return with_time(chip, c, False)
