"""Counters of a group whose stretches run in hidden chunks (planner.geometry.hidden).

Chunking changes what is on chip at once and how often the narrowing layer's output is
touched, nothing else:

* DRAM traffic, MACs and vector ops are those of the same tile run whole (every chunk's
  weights are a slice of the layer's, each hidden element is computed once per tile);
* while a stretch runs, the chip holds every map alive across it (the widening layer's
  input until the last chunk has read it), one chunk of each hidden map live at that step,
  and the accumulator from the first chunk's narrowing step on; the peak is the largest
  over every chunk and step of every representative tile, next to the outer steps';
* every chunk after the first reads the widening layer's input again, and reads the
  accumulator and writes it back: (k - 1) more core reads of the input and 2 (k - 1) more
  accesses of the output, per tile;
* streamed weights arrive as a stream of loads, each double-buffered behind the one
  before (planner.cost.weight_stream): outside the stretches each layer's output-channel
  chunks, inside a stretch for every chunk each layer's slice, the stretch's uncut
  constants (biases, scalars) with its first load, held until the stretch ends.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from hardware.chip import Chip
from planner.cost.counters import Counters
from planner.cost.model import (
    live_steps,
    region_sums,
    representative_boxes,
    weight_bytes,
    with_time,
    work_counters,
)
from planner.cost.weight_stream import chunk_counts, chunk_sizes
from planner.geometry.hidden import (
    Stretch,
    constant_axes,
    hidden_ranges,
    stream_holds,
    stretch_loads,
)
from planner.geometry.regions import Box, GroupChains, GroupIO, Tile, box_elems
from planner.ir.graph import Graph


@dataclass(frozen=True)
class HiddenStream:
    """Streamed weight bytes on chip at every step of a hidden-chunked group's tiles."""

    outer: tuple[int, ...]  # per layer of the group (stretch layers: unused)
    inner: Mapping[tuple[str, int], int]  # per (stretch layer, chunk)

    @property
    def most(self) -> int:
        return max((*self.outer, *self.inner.values()), default=0)


def hidden_stream(graph: Graph, io: GroupIO, found: Sequence[Stretch], chunks: int,
                  chip: Chip) -> HiddenStream:
    """The stream of a hidden-chunked group whose weights are not resident: outside the
    stretches each layer in its output-channel chunks (weight_stream.chunk_counts)."""
    dt = chip.dtype_bytes
    counts = chunk_counts(graph, io.layers, chip)
    owner = {n: s for s in found for n in s.layers}
    steps: list[tuple[list[int], int]] = []
    keys: list[tuple[str, int] | int] = []
    done: set[str] = set()
    for i, name in enumerate(io.layers):
        s = owner.get(name)
        if s is None:
            lay = graph.layer(name)
            steps.append((chunk_sizes(graph, lay, counts[name], dt) if lay.weights else [], 0))
            keys.append(i)
            continue
        if s.widen in done:
            continue
        done.add(s.widen)
        cut, whole = stretch_weight_bytes(graph, s, chunks, dt)
        steps += stretch_loads(s, chunks, cut, whole)
        keys += [(n, j) for j in range(chunks) for n in s.layers]
    held = stream_holds(steps)
    outer = [0] * len(io.layers)
    inner: dict[tuple[str, int], int] = {}
    for key, h in zip(keys, held, strict=True):
        if isinstance(key, int):
            outer[key] = h
        else:
            inner[key] = h
    return HiddenStream(tuple(outer), inner)


def stretch_weight_bytes(graph: Graph, s: Stretch, chunks: int, dtype_bytes: int
                         ) -> tuple[dict[tuple[str, int], int], int]:
    """(bytes of each layer's slice for each chunk, bytes every chunk uses whole) of a
    stretch's weights."""
    ranges = hidden_ranges(s, chunks)
    cut: dict[tuple[str, int], int] = {}
    whole = 0
    for name in s.layers:
        axes = constant_axes(graph, s, name)
        for w in set(graph.layer(name).weights):
            size = int(graph.constants[w].size)
            if axes.get(w) is None:
                whole += size * dtype_bytes
                continue
            for j, (lo, hi) in enumerate(ranges):
                cut[(name, j)] = cut.get((name, j), 0) + size // s.channels * (hi - lo) \
                    * dtype_bytes
    return cut, whole


def hidden_footprint(graph: Graph, io: GroupIO, found: Sequence[Stretch], chunks: int,
                     boxes: Mapping[str, Box], steps: Sequence[tuple[str, ...]],
                     dtype_bytes: int, stream: HiddenStream | None) -> int:
    """Peak bytes of one tile (its boxes) run with hidden chunks: maps, and where `stream`
    is given (single-memory chips, streamed weights) the weights on chip at each step."""
    inside = {n for s in found for n in s.layers}
    elems = {t: box_elems(graph, t, b) for t, b in boxes.items()}
    peak = 0
    for i, live in enumerate(steps):
        if io.layers[i] in inside:
            continue
        here = sum(elems[t] for t in live if t in elems) * dtype_bytes
        peak = max(peak, here + (stream.outer[i] if stream else 0))
    for s in found:
        a, b = io.layers.index(s.widen), io.layers.index(s.narrow)
        hidden = set(s.hidden)
        reads = set(graph.layer(s.widen).fmap_inputs)
        ends = {t for t in steps[a] if t in reads and all(t not in steps[i]
                                                          for i in range(a + 1, b + 1))}
        across = [t for t in steps[a] if t not in hidden and t not in ends and t in elems]
        kept = sum(elems[t] for t in across)
        dying = sum(elems[t] for t in ends if t in elems)
        ranges = hidden_ranges(s, chunks)
        for j, (lo, hi) in enumerate(ranges):
            for i in range(a, b + 1):
                here = kept + (dying if j < len(ranges) - 1 or i == a else 0)
                here += sum(elems[t] // s.channels * (hi - lo) for t in steps[i] if t in hidden)
                if j > 0 or i == b:  # the accumulator, from the first partial sums on
                    here += elems[s.out]
                weights = stream.inner[(io.layers[i], j)] if stream else 0
                peak = max(peak, here * dtype_bytes + weights)
    return peak


def hidden_peak_bytes(graph: Graph, io: GroupIO, chains: GroupChains, found: Sequence[Stretch],
                      chunks: int, tile: Tile, chip: Chip, weights_resident: bool,
                      double_buffered: bool) -> int:
    """Exact SRAM peak over every tile: maps at every step and chunk, the next tile's
    inputs with a second buffer, and on single-memory chips the weights (all of them when
    resident, else the stream's at each step)."""
    steps = live_steps(graph, io)
    stream = hidden_stream(graph, io, found, chunks, chip) \
        if chip.unified and not weights_resident else None
    peak = 0
    for boxes in representative_boxes(graph, io, chains, tile):
        here = hidden_footprint(graph, io, found, chunks, boxes, steps, chip.dtype_bytes,
                                stream)
        if double_buffered:
            here += sum(box_elems(graph, t, boxes[t]) for t in io.inputs) * chip.dtype_bytes
        peak = max(peak, here)
    if chip.unified and weights_resident:
        peak += weight_bytes(graph, io.weights, chip)
    return peak


def onchip_weight_bytes(graph: Graph, io: GroupIO, found: Sequence[Stretch], chunks: int,
                        chip: Chip, weights_resident: bool) -> int:
    """Weight bytes in the weight memory at once: all when resident, else the most the
    stream holds."""
    if weights_resident:
        return weight_bytes(graph, io.weights, chip)
    return hidden_stream(graph, io, found, chunks, chip).most


def chunk_core_bytes(graph: Graph, io: GroupIO, chains: GroupChains, found: Sequence[Stretch],
                     chunks: int, tile: Tile, dtype_bytes: int) -> int:
    """Core traffic chunking adds to the same tile run whole: every chunk after the first
    reads the widening layer's input again, and reads the accumulator and writes it back."""
    reads = {s.widen: graph.layer(s.widen).fmap_inputs for s in found}
    sums = region_sums(graph, io, chains, tile,
                       sorted({s.out for s in found} | {t for ts in reads.values() for t in ts}))
    return sum((chunks - 1) * (2 * sums[s.out] + sum(sums[t] for t in reads[s.widen]))
               for s in found) * dtype_bytes


def hidden_cost(graph: Graph, io: GroupIO, chains: GroupChains, found: Sequence[Stretch],
                chunks: int, tile: Tile, chip: Chip, weights_resident: bool,
                double_buffered: bool, work: Counters | None = None) -> Counters:
    """Predicted counters of the group run with its stretches in `chunks` hidden chunks
    (``work``: its work_counters for this tile and residency, when the caller has them)."""
    base = work if work is not None else work_counters(graph, io, chains, tile, chip,
                                                       weights_resident)
    extra = chunk_core_bytes(graph, io, chains, found, chunks, tile, chip.dtype_bytes)
    peak = hidden_peak_bytes(graph, io, chains, found, chunks, tile, chip, weights_resident,
                             double_buffered)
    c = replace(base, core_fmap_bytes=base.core_fmap_bytes + extra, sram_peak_bytes=peak)
    return with_time(chip, c, double_buffered)
