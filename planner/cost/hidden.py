"""Counters of a group whose stretches run in hidden chunks (planner.geometry.hidden).

Chunking changes what is on chip at once and how often the narrowing layer's output is
touched, nothing else:

* DRAM traffic, MACs and vector ops are those of the same tile run whole (every chunk's
  weights are a slice of the layer's, each hidden element is computed once per tile);
* while a stretch runs, the chip holds every map alive across it (the widening layer's
  input until the last chunk has read it), one chunk of each hidden map live at that step,
  and the accumulator from the first chunk's narrowing step on (started from the skip map
  of the residual Add that follows, where that Add can take it: the skip is then off chip,
  planner.geometry.hidden.folded_skip); the peak is the largest over every chunk and step
  of every representative tile, next to the outer steps';
* every chunk after the first reads the widening layer's input again, and reads the
  accumulator and writes it back: (k - 1) more core reads of the input and 2 (k - 1) more
  accesses of the output, per tile;
* streamed weights arrive as a stream of loads, each double-buffered behind the one
  before (planner.cost.weight_stream): outside the stretches each layer's output-channel
  chunks, inside a stretch for every chunk each layer's slice (the widening layer's in one
  load per run of its units: a qkv projection's q, k and v of the chunk's heads,
  planner.geometry.hidden.widen_runs), the stretch's uncut constants (biases, scalars)
  with its first load, held until the stretch ends.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

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
from fuseplan.planner.geometry.attention import online_attention
from fuseplan.planner.geometry.hidden import (
    SkipFold,
    Stretch,
    channel_chunks,
    constant_axes,
    folded_skip,
    hidden_ranges,
    stream_holds,
    stretch_chunks,
    stretch_loads,
    widen_runs,
    widening_layers,
)
from fuseplan.planner.geometry.regions import (
    Box,
    GroupChains,
    GroupIO,
    Tile,
    box_elems,
    iter_tiles,
    tile_regions,
)
from fuseplan.planner.ir.chunks import chunk_ranges
from fuseplan.planner.ir.graph import Graph


@dataclass(frozen=True)
class HiddenStream:
    """Streamed weight bytes on chip at every step of a hidden-chunked group's tiles."""

    outer: tuple[int, ...]  # per layer of the group (stretch layers: unused)
    inner: Mapping[tuple[str, int], int]  # per (stretch layer, chunk)
    by_layer: tuple[int, ...]  # per layer of the group: the most while it runs, any chunk

    @property
    def most(self) -> int:
        return max(self.by_layer, default=0)


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
        steps += stretch_loads(s, chunks, cut, whole, widen_runs(graph, s))
        keys += [(n, j) for j in range(stretch_chunks(s, chunks)) for n in s.layers]
    held = stream_holds(steps)
    outer = [0] * len(io.layers)
    inner: dict[tuple[str, int], int] = {}
    for key, h in zip(keys, held, strict=True):
        if isinstance(key, int):
            outer[key] = h
        else:
            inner[key] = h
    by_layer = list(outer)
    index = {name: i for i, name in enumerate(io.layers)}
    for (name, _), h in inner.items():
        by_layer[index[name]] = max(by_layer[index[name]], h)
    return HiddenStream(tuple(outer), inner, tuple(by_layer))


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


@dataclass(frozen=True)
class StretchProfile:
    """What one stretch holds at each of its steps in one tile, whatever the chunk count."""

    layers: tuple[str, ...]  # the stretch's layers: its steps, in order
    kept: int  # elements alive across the whole stretch
    dying: int  # elements of the widening layer's inputs no later layer reads
    freed_after: int  # the step of the last chunk after which `dying` is off chip
    per_channel: tuple[int, ...]  # per step: hidden elements per hidden channel alive
    acc: int  # elements of the accumulator
    channels: int
    # elements of the skip map the accumulator starts from (planner.geometry.hidden
    # .folded_skip), counted in `kept` until the accumulator holds it
    folded: int = 0


@dataclass(frozen=True)
class TileProfile:
    """What one tile holds at every step, as a function of the chunk count: the outer
    steps' maps and each stretch's profile (planner.cost.hidden)."""

    outer: tuple[tuple[int, int], ...]  # (step, elements) of the steps outside the stretches
    stretches: tuple[StretchProfile, ...]
    inputs: int  # elements of the group's inputs: what a second buffer loads

    def peak_bytes(self, chunks: int, dtype_bytes: int, stream: HiddenStream | None) -> int:
        """Peak bytes with `chunks` chunks (`stream`: the weights on chip at each step, on
        single-memory chips with streamed weights). Chunks 1 .. k - 2 hold the same maps,
        so the first two and the last two give every distinct step."""
        peak = max((e * dtype_bytes + (stream.outer[i] if stream else 0)
                    for i, e in self.outer), default=0)
        for sp in self.stretches:
            ranges = chunk_ranges(sp.channels, channel_chunks(sp.channels, chunks))
            last = len(ranges) - 1
            for j in sorted({0, 1, last - 1, last} & set(range(len(ranges)))):
                width = ranges[j][1] - ranges[j][0]
                for k, name in enumerate(sp.layers):
                    acc = j > 0 or k == len(sp.layers) - 1
                    here = sp.kept + (sp.dying if j < last or k <= sp.freed_after else 0) \
                        + sp.per_channel[k] * width + (sp.acc - sp.folded if acc else 0)
                    weights = stream.inner[(name, j)] if stream else 0
                    peak = max(peak, here * dtype_bytes + weights)
        return peak


def tile_profile(graph: Graph, io: GroupIO, found: Sequence[Stretch], boxes: Mapping[str, Box],
                 steps: Sequence[tuple[str, ...]]) -> TileProfile:
    """The profile of one tile (its boxes): at every chunk and step a stretch holds the maps
    alive across it, the widening layer's inputs until the last chunk has read them, one
    chunk of each hidden map live at that step, and the accumulator from the first chunk's
    narrowing step on."""
    inside = {n for s in found for n in s.layers}
    elems = {t: box_elems(graph, t, b) for t, b in boxes.items()}
    folds = {s: folded_skip(graph, io, s) for s in found}
    # a folded skip is off chip from the stretch's accumulator on: not at the steps after
    # the narrowing layer's up to its Add's
    gone = {i: f.skip for s, f in folds.items() if f is not None
            for i in range(io.layers.index(s.narrow) + 1, io.layers.index(f.add) + 1)}
    outer = tuple((i, sum(elems[t] for t in live if t in elems and gone.get(i) != t))
                  for i, live in enumerate(steps) if io.layers[i] not in inside)
    # a fused attention inside a head stretch: its online softmax's scratch per head
    attention = online_attention(graph, io)
    scratch = attention.scratch if attention is not None else ()
    profiles = [_stretch_profile(graph, io, s, elems, steps, scratch, folds[s]) for s in found]
    return TileProfile(outer, tuple(profiles), sum(elems[t] for t in io.inputs))


def _stretch_profile(graph: Graph, io: GroupIO, s: Stretch, elems: Mapping[str, int],
                     steps: Sequence[tuple[str, ...]],
                     scratch: Sequence[tuple[int, str, int, int]], fold: SkipFold | None
                     ) -> StretchProfile:
    """One stretch's profile in one tile (`elems`: its boxes' elements)."""
    a, b = io.layers.index(s.widen), io.layers.index(s.narrow)
    hidden = set(s.hidden)
    reads = set(graph.layer(s.widen).fmap_inputs)
    # the last layer reading them: the widening layer or its last sibling
    last = io.layers.index(widening_layers(graph, s)[-1])
    ends = {t for t in steps[a] if t in reads and all(t not in steps[i]
                                                      for i in range(last + 1, b + 1))}
    return StretchProfile(
        s.layers,
        sum(elems[t] for t in steps[a] if t not in hidden and t not in ends and t in elems),
        sum(elems[t] for t in ends if t in elems), last - a,
        tuple(sum(elems[t] // s.channels for t in steps[i] if t in hidden)
              + sum(elems[out] // s.channels // dv * (chunk + 2)
                    for at, out, dv, chunk in scratch if at == i)
              for i in range(a, b + 1)),
        elems[s.out], s.channels, elems[fold.skip] if fold is not None else 0)


def tile_profiles(graph: Graph, io: GroupIO, chains: GroupChains, found: Sequence[Stretch],
                  tile: Tile, reloaded: Mapping[str, tuple[int, int]] | None = None
                  ) -> list[TileProfile]:
    """The profile of every representative tile (planner.cost.model.representative_boxes);
    ``reloaded``: inputs off chip between two of their reads (planner.geometry.reload)."""
    steps = live_steps(graph, io, reloaded)
    return [tile_profile(graph, io, found, boxes, steps)
            for boxes in representative_boxes(graph, io, chains, tile)]


def hidden_peak_bytes(graph: Graph, io: GroupIO, chains: GroupChains, found: Sequence[Stretch],
                      chunks: int, tile: Tile, chip: Chip, weights_resident: bool,
                      double_buffered: bool, profiles: Sequence[TileProfile] | None = None,
                      stream: HiddenStream | None = None,
                      reloaded: Mapping[str, tuple[int, int]] | None = None) -> int:
    """Exact SRAM peak over every tile: maps at every step and chunk, the next tile's
    inputs with a second buffer, and on single-memory chips the weights (all of them when
    resident, else the stream's at each step). ``profiles`` (tile_profiles) and ``stream``
    (hidden_stream) when the caller keeps them; ``reloaded``: see tile_profiles."""
    if profiles is None:
        profiles = tile_profiles(graph, io, chains, found, tile, reloaded)
    if chip.unified and not weights_resident and stream is None:
        stream = hidden_stream(graph, io, found, chunks, chip)
    dt = chip.dtype_bytes
    on_sram = stream if chip.unified and not weights_resident else None
    peak = max((p.peak_bytes(chunks, dt, on_sram) + (p.inputs * dt if double_buffered else 0)
                for p in profiles), default=0)
    if chip.unified and weights_resident:
        peak += weight_bytes(graph, io.weights, chip)
    return peak


def chunk_core_bytes(graph: Graph, io: GroupIO, chains: GroupChains, found: Sequence[Stretch],
                     chunks: int, tile: Tile, dtype_bytes: int) -> int:
    """Core traffic chunking adds to the same tile run whole: every chunk after the first
    reads the widening layer's input again (and so does each sibling of it), and reads the
    accumulator and writes it back (a pool's chunks fill channels of their own: nothing to
    read back)."""
    reads = {s.widen: graph.layer(s.widen).fmap_inputs for s in found}
    sums = region_sums(graph, io, chains, tile,
                       sorted({s.out for s in found if not s.pools}
                              | {t for ts in reads.values() for t in ts}))
    # the widening layer and each sibling read the input again
    return sum((stretch_chunks(s, chunks) - 1) * ((0 if s.pools else 2 * sums[s.out])
                               + len(widening_layers(graph, s))
                               * sum(sums[t] for t in reads[s.widen]))
               for s in found) * dtype_bytes


def hidden_cost(graph: Graph, io: GroupIO, chains: GroupChains, found: Sequence[Stretch],
                chunks: int, tile: Tile, chip: Chip, weights_resident: bool,
                double_buffered: bool, work: Counters | None = None,
                reloaded: Mapping[str, tuple[int, int]] | None = None) -> Counters:
    """Predicted counters of the group run with its stretches in `chunks` hidden chunks
    (``work``: its work_counters for this tile and residency, when the caller has them;
    ``reloaded``: inputs loaded again after a stretch, reload_counters)."""
    base = work if work is not None else work_counters(graph, io, chains, tile, chip,
                                                       weights_resident)
    extra = chunk_core_bytes(graph, io, chains, found, chunks, tile, chip.dtype_bytes)
    peak = hidden_peak_bytes(graph, io, chains, found, chunks, tile, chip, weights_resident,
                             double_buffered, reloaded=reloaded)
    # the chunks interleave the stretch's layers: the first tile is not played layer by layer
    c = replace(base, core_fmap_bytes=base.core_fmap_bytes + extra, sram_peak_bytes=peak,
                overlap_cycles=0)
    if reloaded:
        c = reload_counters(graph, io, chains, tile, chip, c, reloaded)
    return with_time(chip, c, double_buffered)


def reload_counters(graph: Graph, io: GroupIO, chains: GroupChains, tile: Tile, chip: Chip,
                    c: Counters, reloaded: Mapping[str, tuple[int, int]]) -> Counters:
    """`c` with the inputs loaded a second time (planner.geometry.reload): each tile reads
    its box of them from DRAM again (counted with the tile's loads, the first tile's in its
    fill) and writes it on chip once more; their reads by the layers are counted already."""
    dt = chip.dtype_bytes
    again = sum(region_sums(graph, io, chains, tile, sorted(reloaded)).values()) * dt
    first = tile_regions(graph, io, next(iter_tiles(graph, io, tile)))
    first_again = sum(box_elems(graph, t, first[t]) for t in reloaded) * dt
    return replace(c, dram_read_bytes=c.dram_read_bytes + again,
                   redundant_read_bytes=c.redundant_read_bytes + again,
                   core_fmap_bytes=c.core_fmap_bytes + again,
                   first_load_bytes=c.first_load_bytes + first_again)
