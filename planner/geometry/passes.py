"""Passes over a group whose global reductions feed back into it (squeeze-excite).

A squeeze-excite block pools a map over rows and columns, runs a few layers on the pooled
vector (the squeeze-excite MLP, the *tail*) and scales the map by the result; ConvNeXt-V2's
GRN is the same shape (an L2 norm over the rows and columns of a channels-last map, divided
by its mean over the channels, scales the map): any reduction over the rows and columns of
the map's layout that folds tile by tile (planner.ir.ops.Accumulate) is a pool. No tile can
be scaled before the last tile has been folded into the pool, so a group holding the
whole block either keeps the map whole on chip (one tile), or ends at the pool and writes
the map to DRAM for the next group to read back. The third way is more passes:

* a pooling pass per reduction reads the group's inputs tile by tile, computes the layers
  that reduction's input needs (its *prefix*; the results of earlier tails are on chip)
  and folds each tile into the on-chip accumulator; it stores nothing;
* after each pooling pass its tail runs once, on chip, on the pooled vector; the tail
  results later passes read stay on chip until the group ends;
* the last pass reads the inputs again tile by tile, computes every layer the group's
  outputs are made from (but the tails), and stores them.

The maps between never leave the chip: a group with k squeeze-excite blocks reads its
(often much narrower) inputs k + 1 times and computes each prefix again in every later
pass, instead of writing each pooled map and reading it back. Where the inputs fit on chip
whole beside the passes, they may instead be loaded once, before the first pass, and held
until the group ends (``inputs_held``): every pass reads its tiles from them, and the group
reads each input exactly once, halos included. Where the map a pool folds fits on chip
whole, it may instead be kept as its pass makes it (``maps_held``): the pass writes each
tile of it straight into an on-chip buffer the size of the map (the tile's own steps hold no
other copy of it: GroupIO.in_place) and folds it from there, and every later
pass reads it from there: nothing before it is computed again, and the map never goes to
DRAM (the squeeze-excite scale waits while the map stays on chip). Every pass uses the plan's
tile, each on its own anchor: a pooling pass on the map it pools, the last pass on the
group's output. This module says which layers each pass runs and which tensors it reads,
holds and stores (as GroupIO records, so the cost model's closed forms apply to each
pass); planner.cost.passes prices them, emulator.passes runs them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from fuseplan.planner.geometry.attention import online_attention
from fuseplan.planner.geometry.hidden import Stretch, chunk_options, makes_chunks
from fuseplan.planner.geometry.hidden import stretches as group_stretches
from fuseplan.planner.geometry.regions import (
    GroupIO,
    accumulated_input,
    group_io,
    tiled_like_anchor,
)
from fuseplan.planner.ir.graph import Graph


@dataclass(frozen=True)
class PoolPass:
    """One pooling pass and the tail that runs after it."""

    io: GroupIO  # its prefix and reduction: tiles over the pooled map, stores nothing
    reduction: str  # the layer folding the pass's tiles into its accumulator
    tail: tuple[str, ...]  # layers on the pooled vector: once, after the pass
    kept: tuple[str, ...]  # tail results a later pass reads: on chip to the group's end
    held_map: str | None = None  # the pooled map kept whole on chip from this pass on

    @property
    def pooled(self) -> str:
        """The reduction's result (the accumulator): read by the tail, and kept on chip
        when a later pass reads it too."""
        return self.io.accumulated[0]


@dataclass(frozen=True)
class Passes:
    """How a group runs in several passes around its reductions."""

    whole: GroupIO  # the group as one unit: what it reads from and writes to DRAM
    pools: tuple[PoolPass, ...]  # one pooling pass per reduction, in the layers' order
    last: GroupIO  # the last pass: every layer the outputs are made from; stores them
    inputs_held: bool = False  # the group's inputs loaded whole once and held to its end
    maps_held: bool = False  # each pooled map kept whole on chip from its own pass on

    @property
    def count(self) -> int:
        """Passes over the tiles: one per reduction, and the last."""
        return len(self.pools) + 1

    @property
    def ios(self) -> tuple[GroupIO, ...]:
        """Every pass's GroupIO, in the order they run."""
        return (*(p.io for p in self.pools), self.last)

    @property
    def tails(self) -> tuple[str, ...]:
        return tuple(n for p in self.pools for n in p.tail)

    def held_before(self, k: int) -> tuple[str, ...]:
        """Tail results on chip while pass k runs (k == len(pools): the last pass)."""
        return tuple(t for p in self.pools[:k] for t in p.kept)

    def maps_during(self, k: int) -> tuple[str, ...]:
        """Pooled maps whose on-chip buffers exist while pass k or its tail runs: those of
        the passes up to it, its own filling as it goes (every one for the last pass)."""
        return tuple(p.held_map for p in self.pools[:k + 1] if p.held_map is not None)

    @property
    def inputs(self) -> tuple[str, ...]:
        """The group's inputs held on chip whole for all passes (none unless inputs_held)."""
        return self.whole.inputs if self.inputs_held else ()


def held_map_reads(graph: Graph, split: Passes) -> dict[str, int]:
    """How many times the layers of later passes read each held map (from chip)."""
    out: dict[str, int] = {}
    for k, pool in enumerate(split.pools):
        if pool.held_map is not None:
            out[pool.held_map] = sum(graph.layer(n).fmap_inputs.count(pool.held_map)
                                     for io in split.ios[k + 1:] for n in io.layers)
    return out


def pass_stretches(graph: Graph, split: Passes) -> tuple[tuple[Stretch, ...], ...]:
    """The stretches of each pass (planner.geometry.hidden), in the passes' order: with
    hidden chunks, every pass runs its own chunk by chunk (a pooling pass's ends in its
    pool, the last pass's scale reads its chunk's slice of the held vector)."""
    return tuple(group_stretches(graph, io) for io in split.ios)


def pass_chunk_options(graph: Graph, split: Passes) -> list[int]:
    """Hidden chunk counts some stretch of some pass makes (none without a stretch); the
    others run in the most they make below it (planner.geometry.hidden.stretch_chunks)."""
    return chunk_options([s for found in pass_stretches(graph, split) for s in found])


def passes_make_chunks(graph: Graph, split: Passes, chunks: int) -> bool:
    """Whether a group run in passes can state `chunks` hidden chunks: 1 always, else some
    pass has a stretch and some stretch makes exactly that many (makes_chunks)."""
    if chunks == 1:
        return True
    found = [s for ss in pass_stretches(graph, split) for s in ss]
    return bool(found) and any(makes_chunks(s, chunks) for s in found)


def pass_split(graph: Graph, layers: Sequence[str], inputs_held: bool = False,
               maps_held: bool = False) -> Passes | None:
    """The passes of a group, or None where it cannot run so.

    It can when it holds reductions over rows and columns (global pooling, a keepdims Reduce
    over the rows and columns of its input's layout), none its last layer, whose results
    stay inside the group and are per-image vectors (one row, one column) until a layer also
    reading a map uses them (a scale, in a later pass); every layer that reads only such
    vectors is in a tail; every other layer feeds a pool or the group's outputs; and every
    tensor the group writes to DRAM comes from the last pass and is cut by its tiles.
    ``inputs_held``: the group's inputs are held on chip whole (no pass loads them).
    ``maps_held``: each pooled map is made by the group (not one of its inputs) and kept
    whole on chip by its pass; later passes read it there instead of computing it again."""
    split = _reductions(graph, layers)
    if split is None:
        return None
    whole, reductions = split
    inside = set(whole.layers)
    found = _tails(graph, whole, reductions)
    if found is None or not _vectors_stay_inside(graph, found[0], inside):
        return None
    vectors, tails = found
    in_tails = {n for ns in tails.values() for n in ns}
    if any(not tails[r] for r in reductions) or not whole.outputs:
        return None
    # each pass computes what its anchor needs, through anything but the vectors: a pool
    # pass what its reduction folds, the last pass what the group's outputs are made from
    pooled_maps = _pooled_maps(graph, reductions)
    if maps_held and not _made_and_kept(graph, pooled_maps.values(), inside, whole):
        return None  # inputs_held holds inputs; a map the group stores comes from the last pass
    prefixes, held_maps = _prefixes(graph, pooled_maps, inside, vectors, maps_held)
    needed: set[str] = set()
    for t in whole.outputs:
        needed |= _prefix(graph, t, inside, {*vectors, *held_maps})
    last_layers = tuple(n for n in whole.layers if n in needed)
    computed = needed.union(*prefixes.values())
    if not last_layers or not _each_layer_once(whole.layers, computed, tails, in_tails):
        return None
    read_later = _read_later(graph, (*computed, *in_tails), vectors, tails)
    held = frozenset(vectors) | (frozenset(whole.inputs) if inputs_held else frozenset()) \
        | frozenset(held_maps)
    pools = [_pool_pass(graph, red, prefixes[red], tails[red], pooled_maps[red], held,
                        read_later, maps_held) for red in reductions]
    last = _pass_io(graph, last_layers, whole.outputs, held=held)
    # an output besides the anchor is needed whole by every tile: one tile, no passes
    if any(t != last.anchor and not tiled_like_anchor(graph, last, t) for t in last.outputs):
        return None
    return Passes(whole, tuple(pools), last, inputs_held, maps_held)


def _reductions(graph: Graph, layers: Sequence[str]) -> tuple[GroupIO, list[str]] | None:
    """The group's GroupIO and its reductions, or None where no passes can run around them
    (too few layers, no reduction, one last, or a fused attention)."""
    if len(layers) < 3 or not any(accumulated_input(graph, graph.layer(n)) is not None
                                  for n in layers):
        return None
    whole = group_io(graph, layers)
    if online_attention(graph, whole) is not None:  # tiles run whole around fused attention
        return None
    reductions = [n for n in whole.layers
                  if accumulated_input(graph, graph.layer(n)) is not None]
    if whole.layers[-1] in reductions:
        return None
    return whole, reductions


def _made_and_kept(graph: Graph, maps: Iterable[str], inside: set[str], whole: GroupIO) -> bool:
    """Whether the group makes every one of these maps and stores none of them."""
    return not any(graph.producer.get(m) not in inside or m in whole.outputs for m in maps)


def _tails(graph: Graph, whole: GroupIO, reductions: Sequence[str]
           ) -> tuple[dict[str, str], dict[str, list[str]]] | None:
    """(vector tensor -> the reduction it comes from, each reduction's tail), or None where
    a layer reads the vectors of two reductions (it is in no tail)."""
    # each reduction's tail: layers reading only its pooled result and each other
    vectors: dict[str, str] = {}  # vector tensor -> the reduction it comes from
    tails: dict[str, list[str]] = {r: [] for r in reductions}
    for name in whole.layers:
        lay = graph.layer(name)
        if name in tails:
            vectors[lay.outputs[0]] = name
            continue
        sources = {vectors.get(t) for t in lay.fmap_inputs}
        if not lay.fmap_inputs or None in sources:
            continue
        if len(sources) > 1:
            return None  # a layer on the vectors of two reductions: in no tail
        (source,) = sources
        assert source is not None
        tails[source].append(name)
        vectors.update({t: source for t in lay.outputs if t})
    return vectors, tails


def _vectors_stay_inside(graph: Graph, vectors: Mapping[str, str], inside: set[str]) -> bool:
    """Whether every vector is one row and one column and is read inside the group only."""
    for t in vectors:
        _, _, h, w = graph.dims(t)
        leaves = t in graph.outputs or any(c not in inside for c in graph.consumers.get(t, ()))
        if (h, w) != (1, 1) or leaves:
            return False
    return True


def _pooled_maps(graph: Graph, reductions: Sequence[str]) -> dict[str, str]:
    """The map each reduction folds, by reduction."""
    pooled_maps: dict[str, str] = {}
    for red in reductions:
        pooled_from = accumulated_input(graph, graph.layer(red))
        assert pooled_from is not None  # a reduction, by the list's making
        pooled_maps[red] = pooled_from
    return pooled_maps


def _prefixes(graph: Graph, pooled_maps: Mapping[str, str], inside: set[str],
              vectors: Mapping[str, str], maps_held: bool
              ) -> tuple[dict[str, set[str]], list[str]]:
    """(each pool pass's prefix by reduction, the maps held on chip: maps_held's, else none);
    a pass computes nothing before a map an earlier pass holds."""
    held_maps: list[str] = []  # of the pools before the one at hand (maps_held)
    prefixes = {}
    for red, pooled_from in pooled_maps.items():
        prefixes[red] = _prefix(graph, pooled_from, inside, {*vectors, *held_maps})
        if maps_held:
            held_maps.append(pooled_from)
    return prefixes, held_maps


def _each_layer_once(layers: Sequence[str], computed: set[str],
                     tails: Mapping[str, list[str]], in_tails: set[str]) -> bool:
    """Whether no pass computes a reduction or a tail layer and every layer of the group is
    a reduction, in a tail, or computed by some pass."""
    return not (any(n in tails or n in in_tails for n in computed)
                or any(n not in computed and n not in tails and n not in in_tails
                       for n in layers))


def _read_later(graph: Graph, readers: Sequence[str], vectors: Mapping[str, str],
                tails: Mapping[str, list[str]]) -> set[str]:
    """The vectors read outside their own tail (by these layers)."""
    read_later: set[str] = set()  # vectors read outside their own tail
    for name in readers:
        for t in graph.layer(name).fmap_inputs:
            if t in vectors and name not in tails[vectors[t]]:
                read_later.add(t)
    return read_later


def _pool_pass(graph: Graph, red: str, prefix: set[str], tail: Sequence[str], pooled_map: str,
               held: frozenset[str], read_later: set[str], maps_held: bool) -> PoolPass:
    """The pooling pass of one reduction, keeping on chip what later passes read."""
    pooled = graph.layer(red).outputs[0]
    io = _pass_io(graph, (*sorted(prefix, key=graph.index), red), (pooled,),
                  held=held, anchor=pooled_map,
                  accumulated=(pooled,), in_place=(pooled_map,) if maps_held else ())
    kept = tuple(t for n in tail for t in graph.layer(n).outputs if t in read_later)
    if pooled in read_later:
        kept = (pooled, *kept)
    return PoolPass(io, red, tuple(tail), kept, pooled_map if maps_held else None)


def _prefix(graph: Graph, tensor: str, inside: set[str], vectors: set[str]) -> set[str]:
    """The group's layers `tensor` depends on, through anything but the vectors (which
    earlier passes left on chip)."""
    found: set[str] = set()
    frontier = [tensor]
    while frontier:
        t = frontier.pop()
        name = graph.producer.get(t)
        if t in vectors or name is None or name not in inside or name in found:
            continue
        found.add(name)
        frontier.extend(graph.layer(name).fmap_inputs)
    return found


def _pass_io(graph: Graph, layers: tuple[str, ...], outputs: tuple[str, ...],
             held: frozenset[str], anchor: str | None = None,
             accumulated: tuple[str, ...] = (), in_place: tuple[str, ...] = ()) -> GroupIO:
    """The GroupIO of one pass: its layers' DRAM inputs (not what the group holds on chip),
    the given outputs only (a tensor another pass uses is made again there, not stored)."""
    base = group_io(graph, layers)
    inputs = tuple(t for t in base.inputs if t not in held)
    produced = [t for n in base.layers for t in graph.layer(n).outputs if t]
    internal = tuple(t for t in produced if t not in outputs and any(
        c in base.layers for c in graph.consumers.get(t, ())))
    return GroupIO(base.layers, inputs, outputs, internal, base.weights,
                   anchor if anchor is not None else outputs[-1], accumulated, in_place)
