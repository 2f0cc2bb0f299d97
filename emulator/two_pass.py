"""A group run in two passes around its reduction, as the emulator runs it
(planner.geometry.passes; Placement.passes == 2).

Pass 1 runs the prefix and the reduction tile by tile over the pooled map and keeps the
accumulator on chip; the tail then runs once on the pooled vector; pass 2 runs the prefix
again and the rest tile by tile over the group's output, with the tail's results held on
chip for all its tiles. Every byte is counted from the arrays moved, as for any group.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING

import numpy as np

from hardware.chip import Chip
from planner.geometry.passes import TwoPass
from planner.geometry.regions import Box, full_box, in_group_uses, iter_tiles
from planner.ir.graph import Graph
from planner.plan.data import Group

if TYPE_CHECKING:
    from emulator.run import LayerCache, Tally


def run_two_pass(graph: Graph, group: Group, tp: TwoPass, dram: dict[str, np.ndarray],
                 weights: Mapping[str, np.ndarray], tally: Tally, layers: LayerCache,
                 chip: Chip) -> None:
    """Run both passes and the tail between them, reading and writing `dram` and counting
    into `tally` (its weights are the whole group's, resident)."""
    from emulator.run import EmulationError, KernelFailure, run_layer, run_tiles

    dt = chip.dtype_bytes

    def wbytes(names: tuple[str, ...]) -> int:
        ws = {w for n in names for w in graph.layer(n).weights}
        return sum(int(graph.constants[w].size) for w in ws) * dt

    first_tiles = list(iter_tiles(graph, tp.first, group.tile))
    folds = run_tiles(graph, group, tp.first, first_tiles, dram, weights, tally, layers,
                      kept=frozenset({tp.pooled}), used_weights=wbytes(tp.first.layers))
    # the tail: once, on whole vectors, the pooled one kept from pass 1
    pooled = folds[tp.pooled].result()
    onchip: dict[str, tuple[Box, np.ndarray]] = {tp.pooled: (full_box(graph, tp.pooled),
                                                             pooled)}
    uses = in_group_uses(graph, tp.whole)
    tail_uses = in_group_uses(graph, replace(tp.whole, layers=tp.tail))
    tally.core += pooled.size * dt * tail_uses.get(tp.pooled, 0)
    step = len(first_tiles) - 1
    for name in tp.tail:
        lay = graph.layer(name)
        out = lay.outputs[0]
        try:
            ys = tally.compute(partial(run_layer, graph, lay, full_box(graph, out), onchip,
                                       layers=layers), lay, weights)
        except KernelFailure as exc:
            raise EmulationError(group.id, None, exc.layer, exc.detail) from exc
        tally.ops(lay, ys[0].size)
        for t, y in zip(lay.outputs, ys, strict=False):
            if t:
                onchip[t] = (full_box(graph, t), y)
                tally.core += y.size * dt * (1 + uses.get(t, 0))
        tally.step(step, sum(a.size for _, a in onchip.values()) * dt,
                   group.layers.index(name))
    tally.core_weight += wbytes(tp.tail)
    held = {t: onchip[t] for t in tp.held}
    second_tiles = list(iter_tiles(graph, tp.second, group.tile))
    run_tiles(graph, group, tp.second, second_tiles, dram, weights, tally, layers,
              held=held, first=len(first_tiles), used_weights=wbytes(tp.second.layers))
