"""A group's traffic floor: DRAM bytes no tile choice of the group goes below.

Whatever the tile, the weight residency, the buffering, halo reuse, passes or hidden
chunks, a group stores each output element at least once, reads each weight at least once,
and loads every element of an input that some tile's box holds at least once. Every tile's
box along an axis contains the boxes of its one-index sub-ranges (a box is one interval
from the lowest index any anchor index of the tile needs to the highest), so the union of
the one-index boxes is in every plan's loads; it is smaller than the whole input where a
strided layer skips indices (a 1x1 conv of stride 2 never reads the odd rows).

The planners use the floor to skip tile searches (solver.bounded_path): a candidate group
whose floor cannot beat a plan already priced is never searched. tests/test_bounds.py
checks the floor against the searched cost of every candidate of hand-built networks of
each kind the planner handles (and a bounded path that finds a searched cost under its
floor stops trusting floors).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from math import ceil, floor

import numpy as np

from fuseplan.hardware.chip import Chip
from fuseplan.planner.cost.model import dram_bytes_per_cycle, dram_loads, weight_bytes
from fuseplan.planner.cost.objective import (
    Charged,
    Objective,
    ObjectiveSettings,
    cycle_units,
    objective_terms,
)
from fuseplan.planner.geometry.attention import prefix_rows
from fuseplan.planner.geometry.halo_reuse import lifetimes
from fuseplan.planner.geometry.regions import (
    AxisChain,
    GroupChains,
    GroupIO,
    anchor_extent,
    group_io,
)
from fuseplan.planner.ir.graph import Graph


def axis_union(chain: AxisChain | None, extent: int) -> int:
    """Indices of a tensor's axis in the union of its boxes over every one-index anchor
    range [y, y + 1), y < extent (0 where the axis has no closed form: no claim)."""
    if chain is None:
        return 0
    if chain.s == 0:
        return chain.u
    y = np.arange(extent, dtype=np.int64)
    lo = np.maximum(0, chain.s * y - chain.p)
    hi = np.minimum(chain.u, chain.s * y + chain.e)
    # boxes ascend: each adds what lies past the highest end before it
    reached = np.concatenate(([0], np.maximum.accumulate(hi)[:-1]))
    return int(np.maximum(0, hi - np.maximum(lo, reached)).sum())


def group_floor_bytes(graph: Graph, io: GroupIO, chains: GroupChains, chip: Chip) -> int:
    """DRAM bytes every tile choice of the group moves at least: its outputs stored once,
    its weights read once, and each input's elements (and each row its gathers fetch:
    Graph.row_gathers) that the union of one-index boxes holds (see the module docstring)
    loaded once."""
    n, h, w = anchor_extent(graph, io)
    loaded = 0
    for t in dram_loads(graph, io):  # its inputs and the rows its gathers fetch
        axes = chains.chains.get(t)
        if axes is None:
            continue
        rows = axis_union(axes[1], h)
        if axes[1] is None:  # a causal attention's streamed keys: up to its last query's
            rows = max(prefix_rows(graph, io, chains, t, h, 1) or [0])
        loaded += axis_union(axes[0], n) * graph.dims(t)[1] * rows * axis_union(axes[2], w)
    stored = sum(graph.elems(t) for t in io.outputs)
    return (loaded + stored) * chip.dtype_bytes + weight_bytes(graph, io.weights, chip)


def _made_by(at: np.ndarray, size: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Per end, the bytes of the tensors whose position `at` is no later than it."""
    order = np.argsort(at, kind="stable")
    sums = np.concatenate(([0], np.cumsum(size[order])))
    return sums[np.searchsorted(at[order], ends, side="right")]


@dataclass(frozen=True)
class IntervalFloors:
    """Floors of intervals of the layer order without the walk group_floor_bytes takes:
    outputs stored once and weights read once, inputs not counted. Thousands of intervals
    (every candidate of a deep network, whole-map groups of hundreds of layers) are bound
    in milliseconds, before any of them is looked at closely."""

    born: np.ndarray  # per tensor: the position of the layer that makes it (-1: an input)
    last: np.ndarray  # the position of its last use (past the end: a model output)
    size: np.ndarray  # its bytes
    # per tensor: the MACs (vector ops) of the main (other) layer whose first output it is:
    # a group that stores the tensor computes all of it (an intermediate only what it needs)
    macs: np.ndarray
    vector_ops: np.ndarray
    weights: tuple[tuple[str, ...], ...]  # per position: the layer's weight tensors
    graph: Graph
    chip: Chip

    @classmethod
    def of(cls, graph: Graph, chip: Chip) -> IntervalFloors:
        order = [lay.name for lay in graph.layers]
        spans = lifetimes(graph, group_io(graph, order))
        names = [t for t in spans if t in graph.shapes]
        first = {lay.outputs[0]: lay for lay in graph.layers if lay.outputs}
        made = [first.get(t) for t in names]
        return cls(np.array([spans[t][0] for t in names], np.int64),
                   np.array([spans[t][1] for t in names], np.int64),
                   np.array([graph.elems(t) for t in names], np.int64) * chip.dtype_bytes,
                   np.array([lay.macs if lay is not None and lay.is_main else 0
                             for lay in made], np.int64),
                   np.array([lay.macs if lay is not None and not lay.is_main else 0
                             for lay in made], np.int64),
                   tuple(tuple(lay.weights) for lay in graph.layers), graph, chip)

    def stored_work(self, start: int, end: int) -> Work:
        """The work every plan of the group from `start` through `end` (inclusive) does at
        least: that of the layers whose outputs it stores."""
        stored = ((self.born >= start) & (self.born <= end) & (self.last > end)).astype(np.int64)
        return Work(int(stored @ self.macs), int(stored @ self.vector_ops))

    def floors(self, start: int, ends: Sequence[int]) -> list[int]:
        """The floor of the group from position `start` through each end (inclusive)."""
        if not ends:
            return []
        ordered = sorted(set(ends))
        ends_at = np.array(ordered, np.int64)
        # a tensor made in the group is stored when it is used past the end: of those made
        # from `start` on, the ones made by each end less the ones last used by it (a
        # tensor is last used no earlier than it is made), by sorted sums: a deep network's
        # starts each bind hundreds of ends in one pass over its tensors
        mine = self.born >= start
        stored = _made_by(self.born[mine], self.size[mine], ends_at) \
            - _made_by(self.last[mine], self.size[mine], ends_at)
        held, at = 0, start
        seen: set[str] = set()
        weights = []
        for e in ordered:
            for p in range(at, e + 1):
                new = [w for w in self.weights[p] if w not in seen]
                if new:
                    held += weight_bytes(self.graph, new, self.chip)
                    seen.update(new)
            at = max(at, e + 1)
            weights.append(held)
        by_end = {e: int(s) + w for e, s, w in zip(ordered, stored, weights, strict=True)}
        return [by_end[e] for e in ends]


@dataclass(frozen=True)
class Work:
    """MACs (main layers, on the matrix units) and vector ops (the others) of a group."""

    macs: int = 0
    vector_ops: int = 0


def made_work(graph: Graph, io: GroupIO, chains: GroupChains) -> Work:
    """The work every plan of the group does at least: a layer whose output the group
    stores computes all of it; any other computes at least the elements the union of
    one-index boxes holds (see the module docstring: a strided consumer may skip rows; an
    axis without a closed form claims nothing)."""
    n, h, w = anchor_extent(graph, io)
    stored = set(io.outputs)
    macs = vector_ops = 0
    for name in io.layers:
        lay = graph.layer(name)
        if not lay.outputs:
            continue
        out = lay.outputs[0]
        axes = chains.chains.get(out)
        if out in stored:
            ops = lay.macs
        elif axes is not None:
            ops = lay.macs_per_output * (axis_union(axes[0], n) * graph.dims(out)[1]
                                         * axis_union(axes[1], h) * axis_union(axes[2], w))
        else:
            continue
        if lay.is_main:
            macs += ops
        else:
            vector_ops += ops
    return Work(macs, vector_ops)


def timed_floor(chip: Chip, objective: Objective, settings: ObjectiveSettings,
                floor_bytes: int, work: Work, hideable: int) -> int:
    """Objective units no choice of a group goes below, net of what it may hide of the next
    group's weight loads (the shortest path charges a prefetch's saving to the group it
    hides behind; ``hideable``: the most cycles any next group's weights take to load).

    A group's cycles minus its DRAM-idle cycles are its transfer time, at least
    ``floor_bytes`` at full bandwidth, and a prefetch hides no more than its idle cycles;
    its cycles are at least its compute, MACs over every core's matrix unit and vector ops
    over every core's lanes, and it hides no more than ``hideable``. Energy and mixes charge
    every other quantity at least at zero."""
    units, transfer, compute = timed_floor_parts(chip, objective, settings, floor_bytes, work)
    return units + cycle_units(objective, settings, chip) * max(transfer, compute - hideable, 0)


def timed_floor_parts(chip: Chip, objective: Objective, settings: ObjectiveSettings,
                      floor_bytes: int, work: Work) -> tuple[int, int, int]:
    """timed_floor's parts: (units of all but the cycles, transfer cycles, compute cycles);
    the floor for `hideable` cycles is units + cycle_units x max(transfer, compute -
    hideable, 0), the objective being linear. The compute is one cycle short of the work's:
    a group of one tile hides up to a cycle more than its transfers take (its compute
    rounded up per chunk, planner.cost.layered)."""
    transfer = floor(floor_bytes / dram_bytes_per_cycle(chip))
    compute = (ceil(work.macs / (chip.cores * chip.core.macs_per_cycle))
               + ceil(work.vector_ops / (chip.cores * chip.core.vector_lanes))) - 1
    units = objective_terms(objective, settings, chip,
                            Charged(floor_bytes, 0, 0, work.macs, work.vector_ops, 0, 0))
    return units, transfer, compute
