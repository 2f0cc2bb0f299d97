"""Streamed weights as the emulator runs them: layer by layer, in output-channel chunks.

A group whose weights are not resident holds only the running layer's chunk of weights
and the chunk loading behind it (the next chunk of the same layer, or the next layer's
first): the emulator slices each chunk out of the weights it runs with, computes the
layer chunk by chunk (each chunk's slice of the output channels from the whole input on
chip) and joins the slices, and counts from the arrays it slices how many weight bytes are
on chip while each layer runs. The plan names the chunk counts (Placement.chunks); which
axis of each weight a chunk cuts is the op table's (planner.ir.chunks).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from fuseplan.emulator.boxes import take_range
from fuseplan.planner.geometry.heads import take_units
from fuseplan.planner.geometry.hidden import (
    Stretch,
    constant_axes,
    hidden_ranges,
    stream_holds,
    stretch_chunks,
    stretch_loads,
    stretches,
    widen_runs,
)
from fuseplan.planner.geometry.regions import GroupIO
from fuseplan.planner.ir.chunks import chunk_axes, chunk_ranges
from fuseplan.planner.ir.graph import Graph, Layer
from fuseplan.planner.ir.ops import op_spec
from fuseplan.planner.plan.data import Group

Compute = Callable[[Mapping[str, np.ndarray]], list[np.ndarray]]


class Overlay(Mapping[str, np.ndarray]):
    """A chunk's weight slices over the run's weights (no copy of either)."""

    def __init__(self, top: Mapping[str, np.ndarray], base: Mapping[str, np.ndarray]) -> None:
        self.top, self.base = top, base

    def __getitem__(self, key: str) -> np.ndarray:
        return self.top[key] if key in self.top else self.base[key]

    def __iter__(self) -> Iterator[str]:
        return iter({*self.top, *self.base})

    def __len__(self) -> int:
        return len({*self.top, *self.base})


def _stretch_slices(graph: Graph, s: Stretch, chunks: int, weights: Mapping[str, np.ndarray],
                    dtype_bytes: int) -> tuple[dict[tuple[str, int], int], int]:
    """(bytes of each stretch layer's weight slices for each chunk, bytes of the weights
    every chunk uses whole), from the slices themselves."""
    cut: dict[tuple[str, int], int] = {}
    whole = 0
    for name in s.layers:
        axes = constant_axes(graph, s, name)
        for w in set(graph.layer(name).weights):
            arr = np.asarray(weights.get(w, graph.constants.get(w)))
            units = axes.get(w)
            if units is None:
                whole += arr.size * dtype_bytes
                continue
            for j, (lo, hi) in enumerate(hidden_ranges(s, chunks)):
                cut[(name, j)] = cut.get((name, j), 0) + take_units(arr, units, lo, hi).size \
                    * dtype_bytes
    return cut, whole


@dataclass(frozen=True)
class WeightStream:
    """The chunks of a streamed group's layers and the weight bytes on chip at each step."""

    parts: Mapping[str, tuple[Mapping[str, np.ndarray], ...]]  # layer -> its chunks' slices
    held: tuple[int, ...]  # per layer of the group: the most weight bytes on chip as it runs
    sizes: tuple[tuple[int, ...], ...]  # per layer of the group: each chunk's weight bytes
    # a group run in hidden chunks: weight bytes on chip at each (stretch layer, chunk)
    inner: Mapping[tuple[str, int], int] = field(default_factory=dict)

    @classmethod
    def of(cls, graph: Graph, io: GroupIO, group: Group, weights: Mapping[str, np.ndarray],
           dtype_bytes: int) -> WeightStream:
        """Slice the group's streamed weights into the plan's chunks (and, in a group run in
        hidden chunks, each stretch layer's into its slices for every chunk)."""
        parts: dict[str, tuple[Mapping[str, np.ndarray], ...]] = {}
        sizes: list[list[int]] = []
        owner = {n: s for s in (stretches(graph, io) if group.placement.hidden_chunks > 1
                                else ()) for n in s.layers}
        for name in io.layers:
            lay = graph.layer(name)
            arrays = {w: np.asarray(weights.get(w, graph.constants.get(w)))
                      for w in set(lay.weights)}
            chunks = group.placement.chunk_count(name)
            if not arrays:
                sizes.append([])
                continue
            split = chunk_axes(graph, lay)
            if chunks == 1 or split is None or name in owner:
                if chunks > 1:
                    raise ValueError(f"layer {name!r} ({lay.op}) cannot be computed in "
                                     f"output-channel chunks, the plan asks for {chunks}")
                sizes.append([sum(a.size for a in arrays.values()) * dtype_bytes])
                continue
            channels, axes = split
            slices = tuple({w: take_range(arr, axes[w], lo, hi) for w, arr in arrays.items()
                            if w in axes} for lo, hi in chunk_ranges(channels, chunks))
            parts[name] = slices
            sizes.append([sum(part[w].size if w in part else arrays[w].size for w in arrays)
                          * dtype_bytes for part in slices])
        # the stream of loads in order: each layer's chunks; a stretch's slices chunk by chunk
        loads: list[tuple[list[int], int]] = []
        keys: list[tuple[str, int]] = []
        for i, name in enumerate(io.layers):
            s = owner.get(name)
            if s is None:
                loads.append((sizes[i], 0))
                keys.append((name, -1))
            elif name == s.widen:
                cut, whole = _stretch_slices(graph, s, group.placement.hidden_chunks, weights,
                                             dtype_bytes)
                loads += stretch_loads(s, group.placement.hidden_chunks, cut, whole,
                                       widen_runs(graph, s))
                keys += [(n, j) for j in range(stretch_chunks(s, group.placement.hidden_chunks))
                         for n in s.layers]
        held = dict(zip(keys, stream_holds(loads), strict=True))
        return cls(parts, tuple(held.get((n, -1), 0) for n in io.layers),
                   tuple(tuple(x) for x in sizes),
                   {k: v for k, v in held.items() if k[1] >= 0})

    @property
    def reserved(self) -> int:
        """The largest pair: what a halo-reusing group keeps room for at every step."""
        return max((*self.held, *self.inner.values()), default=0)

    def run(self, lay: Layer, weights: Mapping[str, np.ndarray], compute: Compute
            ) -> list[np.ndarray]:
        """The layer's outputs, computed chunk by chunk when it streams in chunks."""
        return run_in_slices(lay, weights, compute, self.parts.get(lay.name, ()))


def run_in_slices(lay: Layer, weights: Mapping[str, np.ndarray], compute: Compute,
                  slices: Sequence[Mapping[str, np.ndarray]]) -> list[np.ndarray]:
    """A layer's outputs computed once per slice of its weights (each slice's output
    channels from the whole input) and joined along its output channels; whole when it has
    no slices."""
    if not slices:
        return compute(weights)
    outs = [compute(Overlay(part, weights))[0] for part in slices]
    return [np.concatenate(outs, axis=op_spec(lay.op).chunk_out_axis)]
