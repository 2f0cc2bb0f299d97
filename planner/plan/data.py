"""Plans as data: ordered fusion groups with their tiles and predicted counters."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from planner.cost.model import Counters
from planner.geometry.regions import Box, Tile

PLAN_VERSION = 1
Mode = Literal["big", "small"]


@dataclass(frozen=True)
class Group:
    """Layers executed as one unit: inputs from DRAM, intermediates on chip, outputs back."""

    id: int
    layers: tuple[str, ...]
    tile: Tile
    mode: Mode
    weights_resident: bool
    predicted: Counters
    double_buffered: bool = False  # a second input buffer prefetches the next tile
    # explicit anchor boxes (n0, n1, r0, r1, c0, c1) of a parameter table, run in this order
    # instead of the regular grid of `tile` (dynamic plans, seed 002)
    boxes: tuple[Box, ...] | None = None
    # halos: "recompute" (overlapping tiles reload and recompute their borders) or "reuse"
    # (row tiles run in order and keep the border rows of every tensor on chip)
    halo_reuse: bool = False
    # its weights loaded while the previous group computed (planner.cost.model.prefetch_cycles)
    prefetch: bool = False

    @property
    def fused(self) -> bool:
        return len(self.layers) > 1


@dataclass(frozen=True)
class Plan:
    """A complete plan: every layer of the model in exactly one group, groups in execution order."""

    groups: tuple[Group, ...]
    model: Mapping[str, Any]  # path, sha256, inputs
    hardware: Mapping[str, Any]  # name, file
    rules: Mapping[str, Any]  # file, sha256
    objective: str
    solver: Mapping[str, Any]  # name, status, gap, wall_s
    totals: Counters = field(default_factory=Counters)
    compulsory_dram_bytes: int = 0
    layer_by_layer_dram_bytes: int = 0
