"""The emulator's two errors: a layer that could not be computed on a tile's box, and a plan
the emulator cannot run (which group, tile and layer). Their own module because the layer
executor, every mode runner and the dispatch raise them."""

from __future__ import annotations

from fuseplan.planner.geometry.regions import Box


class KernelFailure(Exception):
    """A layer could not be computed on a tile's box: the plan asked the emulator for
    something its regions do not provide (a planner bug, not bad input)."""

    def __init__(self, layer: str, op: str, box: Box, detail: str) -> None:
        super().__init__(detail)
        self.layer, self.op, self.box, self.detail = layer, op, box, detail


class EmulationError(Exception):
    """A plan the emulator cannot run: which group, tile and layer, and what disagreed."""

    def __init__(self, group: int, tile: int | None, layer: str | None, detail: str) -> None:
        where = f"group {group}"
        if tile is not None:
            where += f", tile {tile}"
        if layer is not None:
            where += f", layer '{layer}'"
        super().__init__(f"the emulator cannot run this plan at {where}: {detail}")
        self.group, self.tile, self.layer, self.detail = group, tile, layer, detail
