"""A group run in passes around its reductions, as the emulator runs it
(planner.geometry.passes; Placement.passes > 1).

Each pooling pass runs its prefix and reduction tile by tile over the pooled map and keeps
the accumulator on chip; its tail then runs once on the pooled vector, and the tail
results later passes read stay on chip; with the pooled maps held, each pooling pass also
writes every tile of its map into a whole on-chip buffer, which later passes read in place
of computing the map again; the last pass runs every other layer tile by tile
over the group's output; with hidden chunks each pass runs its stretches chunk by chunk
(emulator.hidden). Every byte is counted from the arrays moved, as for any group.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import numpy as np

from fuseplan.emulator.boxes import array_box, slice_box
from fuseplan.emulator.layer import LayerCache
from fuseplan.emulator.onchip import compute_on_chip, held_for_all, keep_outputs
from fuseplan.emulator.tally import Tally
from fuseplan.emulator.tiles import run_tiles
from fuseplan.hardware.chip import Chip
from fuseplan.planner.geometry.passes import Passes, held_map_reads, pass_stretches
from fuseplan.planner.geometry.regions import Box, full_box, in_group_uses, iter_tiles, tile_regions
from fuseplan.planner.ir.graph import Graph
from fuseplan.planner.plan.data import Group


def run_passes(graph: Graph, group: Group, split: Passes, dram: dict[str, np.ndarray],
               weights: Mapping[str, np.ndarray], tally: Tally, layers: LayerCache,
               chip: Chip) -> None:
    """Run every pass and the tails between them, reading and writing `dram` and counting
    into `tally` (its weights are the whole group's, resident)."""
    dt = chip.dtype_bytes

    def wbytes(names: tuple[str, ...]) -> int:
        ws = {w for n in names for w in graph.layer(n).weights}
        return sum(int(graph.constants[w].size) for w in ws) * dt

    uses = in_group_uses(graph, split.whole)
    # held inputs (loaded once, with the first tile) and tail results later passes read
    held: dict[str, tuple[Box, np.ndarray]] = {}
    preloaded = 0
    if split.inputs_held:
        need = tile_regions(graph, split.whole, full_box(graph, split.whole.anchor))
        for t in split.inputs:
            layout = graph.layout(t)
            arr = slice_box(dram[t], array_box(dram[t], layout), need[t], layout)
            held[t] = (need[t], arr)
            preloaded += arr.size * dt
            tally.core += arr.size * dt * (1 + uses.get(t, 0))
    step = 0
    found = pass_stretches(graph, split) if group.placement.hidden_chunks > 1 \
        else ((),) * split.count
    map_reads = held_map_reads(graph, split)
    for k, pool in enumerate(split.pools):
        tiles = list(iter_tiles(graph, pool.io, group.tile))
        fills = {} if pool.held_map is None else {
            pool.held_map: np.zeros(graph.shapes[pool.held_map], np.float32)}
        folds = run_tiles(graph, group, pool.io, tiles, dram, weights, tally, layers,
                          held=held, first=step, kept=frozenset({pool.pooled}),
                          used_weights=wbytes(pool.io.layers),
                          preloaded=preloaded if step == 0 else 0, hidden=found[k],
                          fills=fills)
        step += len(tiles)
        for t, whole in fills.items():  # on chip from now on, read by later passes
            held[t] = (full_box(graph, t), whole)
            tally.core += whole.size * dt * map_reads[t]
        # the tail: once, on whole vectors, beside what earlier tails left on chip
        onchip = {**held, pool.pooled: (full_box(graph, pool.pooled),
                                        folds[pool.pooled].result())}
        tail_uses = in_group_uses(graph, replace(split.whole, layers=pool.tail))
        tally.core += onchip[pool.pooled][1].size * dt * tail_uses.get(pool.pooled, 0)
        for name in pool.tail:
            lay = graph.layer(name)
            box = full_box(graph, lay.outputs[0])
            ys = compute_on_chip(graph, group, None, lay, box, onchip, weights, tally, layers)
            keep_outputs(lay, box, ys, onchip, tally, uses)
            tally.step(step - 1, sum(a.size for _, a in onchip.values()) * dt,
                       group.layers.index(name),
                       held=held_for_all(held, {}, dt))
        tally.core_weight += wbytes(pool.tail)
        held.update({t: onchip[t] for t in pool.kept})
    tiles = list(iter_tiles(graph, split.last, group.tile))
    run_tiles(graph, group, split.last, tiles, dram, weights, tally, layers, held=held,
              first=step, used_weights=wbytes(split.last.layers), hidden=found[-1])
