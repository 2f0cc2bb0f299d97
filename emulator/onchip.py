"""One step of a tile on chip, as every runner that keeps tensors by name takes it: compute a
layer from what the chip holds and count its work, keep its outputs and count their core
traffic, and the bytes that take no room of their own (written in place, held for all tiles).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import partial

import numpy as np

from fuseplan.emulator.errors import EmulationError, KernelFailure
from fuseplan.emulator.layer import LayerCache, run_layer
from fuseplan.emulator.tally import Tally
from fuseplan.planner.geometry.regions import Box
from fuseplan.planner.ir.graph import Graph, Layer
from fuseplan.planner.plan.data import Group


def compute_on_chip(graph: Graph, group: Group, tile: int | None, lay: Layer, box: Box,
                    onchip: Mapping[str, tuple[Box, np.ndarray]],
                    weights: Mapping[str, np.ndarray], tally: Tally, layers: LayerCache
                    ) -> list[np.ndarray]:
    """`box` of a layer's outputs from what is on chip (chunk by chunk when its weights
    stream), its work counted; a kernel failure names the group and tile."""
    try:
        ys = tally.compute(partial(run_layer, graph, lay, box, onchip, layers=layers), lay,
                           weights)
    except KernelFailure as exc:
        raise EmulationError(group.id, tile, exc.layer, exc.detail) from exc
    tally.ops(lay, ys[0].size)
    return ys


def keep_outputs(lay: Layer, box: Box, ys: Sequence[np.ndarray],
                 onchip: dict[str, tuple[Box, np.ndarray]], tally: Tally,
                 uses: Mapping[str, int]) -> None:
    """Put a layer's outputs on chip as `box`, counting the core traffic of writing them
    and of each later read by the group's layers (`uses`)."""
    dt = tally.chip.dtype_bytes
    for t, y in zip(lay.outputs, ys, strict=False):
        if t:
            onchip[t] = (box, y)
            tally.core += y.size * dt * (1 + uses.get(t, 0))


def held_for_all(held: Mapping[str, tuple[Box, np.ndarray]],
                 fills: Mapping[str, np.ndarray], dt: int) -> int:
    """Bytes a group in passes holds for all its tiles (held inputs, held maps, tail
    results, and the held maps this pass fills): in the cluster's SRAM, in no core's NRAM
    (Tally.step's `held`)."""
    return (sum(a.size for _, a in held.values()) + sum(b.size for b in fills.values())) * dt


def in_place_elems(group: int, tile: int, lay: Layer, host: str | None,
                   onchip: Mapping[str, tuple[Box, np.ndarray]], y: np.ndarray) -> int:
    """Elements of `lay`'s output `y` that take no room of their own at its step: all of
    them when it is written over `host` (planner.geometry.in_place), which must hold as many."""
    if host is None:
        return 0
    have = onchip[host][1].size
    if y.size > have:
        raise EmulationError(group, tile, lay.name, f"its output ({y.size} elements) is "
                             f"planned in place over '{host}', which holds {have}")
    return int(y.size)
