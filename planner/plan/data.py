"""Plans as data: ordered fusion groups with their tiles and predicted counters."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from fuseplan.planner.cost.counters import Counters
from fuseplan.planner.cost.objective import Objective
from fuseplan.planner.geometry.regions import Box, Tile
from fuseplan.planner.plan.io_bounds import IOBounds
from fuseplan.planner.plan.placement import Placement

PLAN_VERSION = 1
Mode = Literal["big", "small"]
# a value of a plan file's JSON headers (model, hardware, rules, solver)
Json = str | int | float | bool | None | list["Json"] | dict[str, "Json"]


@dataclass(frozen=True)
class Group:
    """Layers executed as one unit: inputs from DRAM, intermediates on chip, outputs back."""

    id: int
    placement: Placement
    mode: Mode
    predicted: Counters
    # explicit anchor boxes (n0, n1, r0, r1, c0, c1) of a parameter table, run in this order
    # instead of the regular grid of the tile (dynamic plans, seed 002)
    boxes: tuple[Box, ...] | None = None

    @property
    def layers(self) -> tuple[str, ...]:
        return self.placement.layers

    @property
    def tile(self) -> Tile:
        return self.placement.tile

    @property
    def weights_resident(self) -> bool:
        return self.placement.weights_resident

    @property
    def double_buffered(self) -> bool:
        """A second input buffer prefetches the next tile."""
        return self.placement.double_buffered

    @property
    def halo_reuse(self) -> bool:
        """Halos reused ("reuse": row tiles run in order and keep the border rows of every
        tensor on chip) rather than recomputed."""
        return self.placement.halo_reuse

    @property
    def prefetch(self) -> bool:
        """Its weights loaded while the previous group computed
        (planner.cost.model.prefetch_cycles)."""
        return self.placement.prefetch

    @property
    def fused(self) -> bool:
        return len(self.layers) > 1


@dataclass(frozen=True)
class Plan:
    """A complete plan: every layer of the model in exactly one group, groups in execution order."""

    groups: tuple[Group, ...]
    model: Mapping[str, Json]  # path, sha256, inputs
    hardware: Mapping[str, Json]  # name, file
    rules: Mapping[str, Json]  # file, sha256
    objective: Objective
    solver: Mapping[str, Json]  # name, status, gap, wall_s
    totals: Counters = field(default_factory=Counters)
    compulsory_dram_bytes: int = 0
    layer_by_layer_dram_bytes: int = 0
    # its attentions' I/O and the bound it is measured against (planner.app.io_bounds): set by
    # the planners, written to plan files, not read back (derived from the groups)
    io_bounds: IOBounds | None = field(default=None, compare=False)
