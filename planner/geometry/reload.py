"""Inputs loaded again: a group input read before a stretch and after it, not held across.

A residual block's input is read at its start (a norm, an expand conv) and again at its end
(the residual add); in between, the block's stretch (planner.geometry.hidden) runs chunk
by chunk with its widening input and its accumulator on chip. Holding the block input
across the stretch costs a whole map of SRAM at its fullest; loading the tile's box of it
again from DRAM just before its late reader costs that box's bytes once more per tile.
Where the SRAM saved lets a tile hold more images (a round of tiles that reads every
streamed weight once, planner.geometry.rounds), the load is cheaper than the weights.

A placement with `inputs_reloaded` (planner.plan.placement) drops each such input after
its last read before the stretch and loads its tile box again just before its first
reader after it. Only inputs no layer inside any stretch reads qualify (a stretch's
layers read their inputs in every chunk), and the stretch must lie between two of its
reads. The cost model (planner.cost.model.live_steps, planner.cost.hidden) and the
emulator (emulator.run) both take the steps from `reloaded_inputs`.
"""

from __future__ import annotations

from fuseplan.planner.geometry.hidden import stretches
from fuseplan.planner.geometry.regions import GroupIO
from fuseplan.planner.ir.graph import Graph


def reloaded_inputs(graph: Graph, io: GroupIO) -> dict[str, tuple[int, int]]:
    """Per input loaded again, (the step of its last read before the first stretch between
    its reads, the step it is loaded again at: its first read after that stretch); steps
    index io.layers. Empty when the group has no such input."""
    key = ("reloaded_inputs", io)
    found = graph.derived.get(key)
    if found is None:
        found = graph.derived[key] = _reloaded(graph, io)
    return found  # type: ignore[return-value]


def _reloaded(graph: Graph, io: GroupIO) -> dict[str, tuple[int, int]]:
    spans = [(io.layers.index(s.widen), io.layers.index(s.narrow))
             for s in stretches(graph, io)]
    if not spans:
        return {}
    reads: dict[str, list[int]] = {}
    for i, name in enumerate(io.layers):
        for t in graph.layer(name).fmap_inputs:
            if t in io.inputs and t not in io.in_place:
                reads.setdefault(t, []).append(i)
    out: dict[str, tuple[int, int]] = {}
    for t, steps in reads.items():
        if any(a <= i <= b for i in steps for a, b in spans):
            continue
        for a, b in spans:
            before = [i for i in steps if i < a]
            after = [i for i in steps if i > b]
            if before and after:
                out[t] = (max(before), min(after))
                break
    return out
