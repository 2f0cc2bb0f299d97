"""Where whole-map groups may start and end: each start's ends by a cheap bound
(solver.long_groups searches them).

A whole-map tile holds, while a layer runs, at least all of that layer's maps: its inputs
and outputs, a map some stretch may hold in hidden chunks counted as its smallest chunk.
A layer that widens or narrows a stretch is bounded harder: as the narrowing layer of a
stretch with no pool inside, or as its widening layer, it holds the widening layer's input
and the accumulator whole together; otherwise its maps whole. The least of the ways it can
run is its bound (a 3x3 conv on maps of which two do not fit has none that fits). A group is
extended from its start while that bound fits the chip, so the first layer over it ends
every longer group; its last layer also holds its output whole.

A chain of thousands of layers asks this of every start. Each start is worked out from
positions found by bisection over the layers that need chunks (the rest fit whole), its ends
kept in arrays and filtered by the structural rules at once: memory and time grow with the
ends kept, not with the square of the chain's length (a 20,000-ReLU chain built 200 million
ends that a rule then refused, and 23 GiB).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from math import ceil

import numpy as np

from fuseplan.hardware.chip import Chip
from fuseplan.planner.cost.model import weight_bytes
from fuseplan.planner.cost.weight_stream import stage_memory
from fuseplan.planner.geometry.hidden import NarrowedStretch, chunkable_maps, narrowed_stretches
from fuseplan.planner.geometry.regions import accumulated_input
from fuseplan.planner.ir.graph import Graph
from fuseplan.rules.ruleset import RuleSet

SpanFilter = Callable[[int, Sequence[int]], list[bool]]


@dataclass(frozen=True)
class Start:
    """The whole-map groups worth trying from one start: its layers to the longest end that
    fits the cheap bound, the ends (positions in them) longest last, and those ends again
    with the smallest crossing tensor first."""

    layers: tuple[str, ...]
    ends: tuple[int, ...]
    cheap: tuple[int, ...]
    # equal starts share their first layer, length and ends: hashing those, once, spares
    # hashing a run of hundreds of names and ends each time the rounds look a start up
    # (every live edge of a long chain, every round)
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash((self.layers[0], len(self.layers), self.ends)))

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self) -> tuple[type[Start], tuple[tuple[str, ...], tuple[int, ...],
                                                    tuple[int, ...]]]:
        # a worker process hashes strings with its own seed: it works its hash out anew
        return (Start, (self.layers, self.ends, self.cheap))


def layer_floor_bytes(graph: Graph, name: str, dtype_bytes: int,
                      chunkable: dict[str, int] | None = None, whole_outputs: bool = False
                      ) -> int:
    """Bytes a whole-map tile holds while this layer runs: all its inputs and outputs (a map
    in `chunkable`, planner.geometry.hidden.chunkable_maps: its smallest chunk, unless it
    is an output and ``whole_outputs``)."""
    lay = graph.layer(name)
    outs = {t for t in lay.outputs if t}
    most = {} if chunkable is None else chunkable
    return sum(ceil(graph.elems(t) * dtype_bytes
                    / (1 if whole_outputs and t in outs else most.get(t, 1)))
               for t in {*lay.fmap_inputs, *outs} if t in graph.shapes)


def capacity(chip: Chip) -> int:
    """Feature-map bytes one tile may hold at most (SRAM, and NRAM across a cluster)."""
    cap = chip.sram.bytes
    if chip.nram is not None:
        cap = min(cap, chip.nram.bytes * chip.cores_per_cluster)
    return cap


def cut_bytes(graph: Graph, order: Sequence[str], p: int, dtype_bytes: int) -> int:
    """Bytes of the one tensor crossing cut p (the output of the layer at p, usually)."""
    outs = [t for t in graph.layer(order[p]).outputs if t]
    return graph.elems(outs[0]) * dtype_bytes if outs else 0


@dataclass(frozen=True)
class _MapHold:
    """One map of a layer as its bounds see it."""

    name: str
    nbytes: int  # whole
    output: bool  # the layer makes it
    widen: int | None  # the position of the layer widening a stretch that may chunk it
    chunks: int  # the most chunks that stretch makes (1: none)


@dataclass
class StartBounds:
    """What the starts of one graph share: each layer's bound whole, the layers over the
    chip whole (sorted), the maps that may be chunked and what their stretches hold."""

    graph: Graph
    chip: Chip
    limit: int  # groups this long or shorter are not whole-map groups' to offer
    order: list[str]
    at: dict[str, int]
    chunkable: dict[str, tuple[str, int]]
    narrows: dict[str, list[NarrowedStretch]]  # by narrowing layer
    widens: dict[str, list[NarrowedStretch]]  # by widening layer
    floor: list[int]
    over: list[int]  # positions of the layers whose maps do not fit whole
    pools: list[int]  # positions of the layers pooling a map that may be chunked
    # each layer's bound with its outputs whole, -1 where a map of it may be chunked (with
    # chunkable maps it depends on the start)
    whole: np.ndarray
    held: dict[int, list[_MapHold]] = field(default_factory=dict, repr=False)  # _maps

    @classmethod
    def of(cls, graph: Graph, chip: Chip, ruleset: RuleSet) -> StartBounds:
        """The bounds of a graph under these rules."""
        order = [lay.name for lay in graph.layers]
        chunkable = chunkable_maps(graph) if ruleset.search.hidden_chunks else {}
        floor = [layer_floor_bytes(graph, n, chip.dtype_bytes) for n in order]
        cap = capacity(chip)
        whole = np.array([
            -1 if any(t in chunkable for t in (*lay.fmap_inputs, *lay.outputs))
            else layer_floor_bytes(graph, lay.name, chip.dtype_bytes, whole_outputs=True)
            for lay in graph.layers], dtype=np.int64)
        pools = [p for p, n in enumerate(order)
                 if (x := accumulated_input(graph, graph.layer(n))) is not None
                 and x in chunkable]
        at = {n: p for p, n in enumerate(order)}
        narrows: dict[str, list[NarrowedStretch]] = {}
        widens: dict[str, list[NarrowedStretch]] = {}
        for st in narrowed_stretches(graph) if chunkable else ():
            narrows.setdefault(st.narrow, []).append(st)
            widens.setdefault(st.widen, []).append(st)
        return cls(graph, chip, ruleset.search.max_group_layers, order, at, chunkable,
                   narrows, widens, floor, [p for p, f in enumerate(floor) if f > cap],
                   pools, whole)

    def starts(self, cuts: Sequence[int], allowed: Sequence[SpanFilter]) -> Iterator[Start]:
        """The whole-map groups worth trying from each start after one of `cuts` (and the
        first layer), ending at those cuts or the last layer: each start's ends, by the cheap
        bound, that every filter in `allowed` keeps."""
        ends = np.array([*cuts, len(self.order) - 1], dtype=np.int64)
        crossing = {p: cut_bytes(self.graph, self.order, p, self.chip.dtype_bytes) for p in cuts}
        for start in [0, *(p + 1 for p in cuts)]:
            found = self._ends(start, ends)
            for f in allowed:
                if found.size:
                    found = found[np.asarray(f(start, found.tolist()), dtype=bool)]
            if found.size:
                fitting = found.tolist()
                cheap = sorted(fitting, key=lambda e: crossing.get(e, 0))
                yield Start(tuple(self.order[start:fitting[-1] + 1]),
                            tuple(e - start for e in fitting), tuple(e - start for e in cheap))

    def _maps(self, p: int) -> list[_MapHold]:
        """What the layer at `p` holds per map, worked out once (a chain of thousands of
        layers asks for every start)."""
        if p not in self.held:
            lay = self.graph.layer(self.order[p])
            outs = {t for t in lay.outputs if t}
            dtype = self.chip.dtype_bytes
            found = []
            for t in {*lay.fmap_inputs, *outs}:
                if t not in self.graph.shapes:
                    continue
                widen, k = self.chunkable.get(t, (None, 1))
                found.append(_MapHold(t, self.graph.elems(t) * dtype, t in outs,
                                      None if widen is None else self.at[widen], k))
            self.held[p] = found
        return self.held[p]

    def _bound(self, p: int, start: int) -> int:
        """What the layer at `p` holds at least in a group from `start`: layer_floor_bytes
        with the maps made inside that a stretch may hold in chunks counted as their
        smallest chunk, and where it widens or narrows stretches, the least of the ways it
        can run (see the module docstring)."""
        maps = self._maps(p)
        chunked = self._chunked(p, start, whole_outputs=False)
        name = self.order[p]
        narrowing = [st for st in self.narrows.get(name, ()) if self.at[st.widen] >= start]
        widening = self.widens.get(name, [])
        # every map of it that may be in chunks must be one of these stretches' (not a
        # head's or one ending in pools alone): else no harder bound
        known = {t for st in (*narrowing, *widening) for t in st.hidden}
        if not (narrowing or widening) or any(
                m.name not in known for m in maps if m.widen is not None
                and (m.output or m.widen >= start)):
            return chunked
        held = [st.held for st in (*narrowing, *widening)]
        return min(self.floor[p], *(chunked if h is None
                                    else max(chunked, h * self.chip.dtype_bytes) for h in held))

    def _ends(self, start: int, ends: np.ndarray) -> np.ndarray:
        """The ends from `start` that fit the cheap bound (positions in the layer order)."""
        cap = capacity(self.chip)
        # the first layer over the bound even chunked ends every longer group; the layers
        # over it whole before that need chunks
        fail, chunked_at = len(self.order), None
        for p in self.over[bisect_left(self.over, start):]:
            if self._bound(p, start) > cap:
                fail = p
                break
            if chunked_at is None:
                chunked_at = p
        stop = self._weights_stop(start, ends, fail, chunked_at)
        # past the longest interval from the start (views ride along free)
        lo, hi = np.searchsorted(ends, [self.graph.interval_ends(self.limit)[start], stop])
        found = ends[lo:hi]
        bound = self.whole[found]
        keep = (bound >= 0) & (bound <= cap)
        for k in np.flatnonzero(bound < 0):  # a map of it may be chunked: from the start
            keep[k] = self._chunked(int(found[k]), start, whole_outputs=True) <= cap
        return found[keep]

    def _chunked(self, p: int, start: int, whole_outputs: bool) -> int:
        """layer_floor_bytes of the layer at `p`, the maps made inside a group from `start`
        that a stretch may hold in chunks counted as their smallest chunk (its outputs
        whole where asked)."""
        return sum(ceil(m.nbytes / m.chunks) if m.widen is not None and m.widen >= start
                   and not (whole_outputs and m.output) else m.nbytes for m in self._maps(p))

    def _weights_stop(self, start: int, ends: np.ndarray, fail: int, chunked_at: int | None
                      ) -> int:
        """The first end from which a group from `start` is over the bound: `fail`, or
        earlier, the first end by which it holds a map in chunks, pools a map it may hold in
        chunks (it then runs in passes, which hold every weight of the group at once) and
        its weights outgrow the weight memory."""
        k = bisect_left(self.pools, start)
        pooled_at = self.pools[k] if k < len(self.pools) else None
        if chunked_at is None or pooled_at is None:
            return fail
        both = max(chunked_at, pooled_at)
        if both >= fail:
            return fail
        limit = stage_memory(self.chip)
        weights: set[str] = set()
        for p in range(start, both):
            weights.update(self.graph.layer(self.order[p]).weights)
        p = both
        for e in ends[np.searchsorted(ends, both):np.searchsorted(ends, fail)].tolist():
            while p <= e:
                weights.update(self.graph.layer(self.order[p]).weights)
                p += 1
            if weight_bytes(self.graph, weights, self.chip) > limit:
                return int(e)
        return fail
