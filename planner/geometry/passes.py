"""Two passes over a group whose global reduction feeds back into it (squeeze-excite).

A squeeze-excite block pools a map over rows and columns, runs a few layers on the pooled
vector (the squeeze-excite MLP, the *tail*) and scales the map by the result. No tile can
be scaled before the last tile has been folded into the pool, so a group holding the
whole block either keeps the map whole on chip (one tile), or ends at the pool and writes
the map to DRAM for the next group to read back. The third way is a second pass:

* pass 1 reads the group's inputs tile by tile, computes the layers the pool needs (the
  *prefix*) and folds each tile into the on-chip accumulator; nothing is stored;
* the tail runs once, on chip, on the pooled vector;
* pass 2 reads the inputs again tile by tile, computes the prefix again and the rest of
  the group, with the tail's results held on chip, and stores the group's outputs.

The map between never leaves the chip: the group reads its (often much narrower) inputs
twice and computes the prefix twice instead of writing the map and reading it back. Both
passes use the plan's tile, each on its own anchor: pass 1 on the pooled map, pass 2 on
the group's output. This module says which layers each pass runs and which tensors it
reads, holds and stores (as GroupIO records, so the cost model's closed forms apply to
each pass); planner.cost.two_pass prices them, emulator.two_pass runs them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from planner.geometry.regions import GroupIO, accumulated_input, group_io
from planner.ir.graph import Graph


@dataclass(frozen=True)
class TwoPass:
    """How a group runs in two passes around its reduction."""

    whole: GroupIO  # the group as one unit: what it reads from and writes to DRAM
    reduction: str  # the layer that folds pass 1's tiles into its accumulator
    prefix: tuple[str, ...]  # layers the pooled map needs: pass 1, and again in pass 2
    tail: tuple[str, ...]  # layers on the pooled vector: once, between the passes
    rest: tuple[str, ...]  # every other layer: pass 2
    first: GroupIO  # pass 1: prefix + reduction, tiles over the pooled map, stores nothing
    second: GroupIO  # pass 2: prefix + rest, tiles over the group's output
    held: tuple[str, ...]  # tail results pass 2 reads, held on chip for all its tiles

    @property
    def pooled(self) -> str:
        """The reduction's result (the accumulator), read by the tail only."""
        return self.first.accumulated[0]


def two_pass_split(graph: Graph, layers: Sequence[str]) -> TwoPass | None:
    """The two passes of a group, or None where it cannot run so.

    It can when it holds exactly one reduction over rows and columns (global pooling, a
    keepdims Reduce over H and W) that is not its last layer; the layers reading the
    pooled result (transitively, and nothing else of the group) work on per-image vectors
    (one row, one column) that only the group reads; and every tensor the group writes to
    DRAM comes from pass 2's own layers (not the prefix, not the tail)."""
    if len(layers) < 3:
        return None
    whole = group_io(graph, layers)
    reductions = [n for n in whole.layers
                  if accumulated_input(graph, graph.layer(n)) is not None]
    if len(reductions) != 1 or reductions[0] == whole.layers[-1]:
        return None
    red = graph.layer(reductions[0])
    pooled = red.outputs[0]
    pooled_from = accumulated_input(graph, red)
    assert pooled_from is not None
    inside = set(whole.layers)
    # the prefix: every layer of the group the pooled map depends on
    prefix: set[str] = set()
    frontier = [graph.producer.get(pooled_from)]
    while frontier:
        name = frontier.pop()
        if name is None or name not in inside or name in prefix:
            continue
        prefix.add(name)
        frontier.extend(graph.producer.get(t) for t in graph.layer(name).fmap_inputs)
    # the tail: layers reading only the pooled result and each other, on vectors
    tail: list[str] = []
    vectors = {pooled}
    for name in whole.layers:
        lay = graph.layer(name)
        if name == red.name or name in prefix or not lay.fmap_inputs:
            continue
        if all(t in vectors for t in lay.fmap_inputs):
            tail.append(name)
            vectors.update(t for t in lay.outputs if t)
    if not tail:
        return None
    for t in vectors:
        _, _, h, w = graph.dims(t)
        leaves = t in graph.outputs or any(c not in inside for c in graph.consumers.get(t, ()))
        if (h, w) != (1, 1) or leaves:
            return None
    rest = [n for n in whole.layers
            if n not in prefix and n != red.name and n not in tail]
    if not rest:
        return None
    made_by_rest = {t for n in rest for t in graph.layer(n).outputs if t}
    if not whole.outputs or any(t not in made_by_rest for t in whole.outputs):
        return None
    in_order = sorted(prefix, key=graph.index)
    held = tuple(t for t in dict.fromkeys(t for n in rest for t in graph.layer(n).fmap_inputs)
                 if t in vectors)
    first = _pass_io(graph, (*in_order, red.name), (pooled,), anchor=pooled_from,
                     accumulated=(pooled,))
    second_layers = tuple(sorted((*in_order, *rest), key=graph.index))
    second = _pass_io(graph, second_layers, whole.outputs, held=frozenset(vectors))
    return TwoPass(whole, red.name, tuple(in_order), tuple(tail), tuple(rest), first, second,
                   held)


def _pass_io(graph: Graph, layers: tuple[str, ...], outputs: tuple[str, ...],
             anchor: str | None = None, accumulated: tuple[str, ...] = (),
             held: frozenset[str] = frozenset()) -> GroupIO:
    """The GroupIO of one pass: its layers' DRAM inputs (not what the group holds on chip),
    the given outputs only (a tensor the other pass uses is made again there, not stored)."""
    base = group_io(graph, layers)
    inputs = tuple(t for t in base.inputs if t not in held)
    produced = [t for n in base.layers for t in graph.layer(n).outputs if t]
    internal = tuple(t for t in produced if t not in outputs and any(
        c in base.layers for c in graph.consumers.get(t, ())))
    return GroupIO(base.layers, inputs, outputs, internal, base.weights,
                   anchor if anchor is not None else outputs[-1], accumulated)
