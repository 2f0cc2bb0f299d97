"""How a group runs: its layers, tile, weight residency, buffering, halo mode and prefetch.

Every planner returns a list of placements; planner.app.assemble turns them into a Plan
(costing each with the cost model), and a Group of that plan carries its placement to
the plan file and the emulator.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum, StrEnum

from planner.geometry.regions import Tile


class WeightResidency(Enum):
    """Where a layer's weights live while its group runs."""

    RESIDENT = "resident"  # loaded once, held on chip (WRAM, or SRAM on unified chips)
    STREAMED_PER_TILE = "streamed_per_tile"  # loaded again for every tile

    @classmethod
    def of(cls, resident: bool) -> WeightResidency:
        return cls.RESIDENT if resident else cls.STREAMED_PER_TILE


class HaloMode(StrEnum):
    """How overlapping tiles get their halos (plan files' "halo" key)."""

    RECOMPUTE = "recompute"  # each tile reloads and recomputes its border
    REUSE = "reuse"  # row tiles run in order and keep the border rows of every tensor

    @classmethod
    def of(cls, reuse: bool) -> HaloMode:
        return cls.REUSE if reuse else cls.RECOMPUTE


@dataclass(frozen=True)
class Placement:
    """One group of a plan as a planner chose it (the cost model prices it)."""

    layers: tuple[str, ...]
    tile: Tile
    # one residency for the whole group today; per-layer residency would hold one per layer
    # and answer residency(layer) from it
    weights: WeightResidency = WeightResidency.RESIDENT
    double_buffered: bool = False  # a second input buffer loads the next tile's inputs
    halo: HaloMode = HaloMode.RECOMPUTE
    prefetch: bool = False  # weights loaded while the group before computes

    @classmethod
    def of(cls, layers: Sequence[str], tile: Tile, resident: bool = True,
           double_buffered: bool = False, halo_reuse: bool = False) -> Placement:
        """A placement from the planners' flags."""
        return cls(tuple(layers), tile, WeightResidency.of(resident), double_buffered,
                   HaloMode.of(halo_reuse))

    def residency(self, layer: str) -> WeightResidency:
        """Where this layer's weights live (the group's residency, for now)."""
        if layer not in self.layers:
            raise KeyError(layer)
        return self.weights

    @property
    def weights_resident(self) -> bool:
        """Whether the group's weights are held on chip for all its tiles."""
        return self.weights is WeightResidency.RESIDENT

    @property
    def halo_reuse(self) -> bool:
        """Whether tiles keep what later tiles read instead of recomputing halos."""
        return self.halo is HaloMode.REUSE
