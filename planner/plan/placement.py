"""How a group runs: its layers, tile, weight residency, buffering, halo mode and prefetch.

Every planner returns a list of placements; planner.app.assemble turns them into a Plan
(costing each with the cost model), and a Group of that plan carries its placement to
the plan file and the emulator.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum, StrEnum

from fuseplan.planner.geometry.regions import Tile


class WeightResidency(Enum):
    """Where a layer's weights live while its group runs."""

    RESIDENT = "resident"  # loaded once, held on chip (WRAM, or SRAM on unified chips)
    # loaded layer by layer, in output-channel chunks, again for every tile
    # (planner.cost.weight_stream): once in all for a group of one tile
    STREAMED_PER_TILE = "streamed_per_tile"

    @classmethod
    def of(cls, resident: bool) -> WeightResidency:
        return cls.RESIDENT if resident else cls.STREAMED_PER_TILE


class LoopOrder(StrEnum):
    """Which loop of a group is outermost (plan files' "loop_order" key)."""

    TILES_OUTER = "tiles_outer"  # each tile runs every layer; streamed weights per round
    # one layer whose streamed weights arrive in output-channel chunks: each chunk is loaded
    # once and applied to every tile of every image (the tiles' inputs are read per chunk)
    WEIGHTS_OUTER = "weights_outer"


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
    # streamed weights: (layer, output-channel chunks) of every layer cut into more than one
    # (planner.cost.weight_stream.chunk_counts); the others stream whole
    chunks: tuple[tuple[str, int], ...] = ()
    loop: LoopOrder = LoopOrder.TILES_OUTER
    # more than 1: the group runs in passes around its global reductions
    # (planner.geometry.passes: a squeeze-excite scale waits for its pool, and a later pass
    # recomputes the pooled map, or reads it held)
    passes: int = 1
    # with passes: the group's inputs loaded whole once and held on chip for every pass
    inputs_held: bool = False
    # more than 1: the group's stretches (a widening layer, per-element layers, a narrowing
    # layer: an MLP, an expand / project pair) run in this many chunks of their hidden
    # channels, so that the hidden maps are never on chip whole (planner.geometry.hidden)
    hidden_chunks: int = 1
    # with passes: each pooled map kept whole on chip by its pass; later passes read it
    # there instead of computing it again
    maps_held: bool = False
    # with hidden chunks: the group's inputs read before a stretch and after it are loaded
    # again after it rather than held across (planner.geometry.reload)
    inputs_reloaded: bool = False

    @classmethod
    def of(cls, layers: Sequence[str], tile: Tile, resident: bool = True,
           double_buffered: bool = False, halo_reuse: bool = False,
           weights_outer: bool = False, passes: int = 1,
           inputs_held: bool = False, hidden_chunks: int = 1, maps_held: bool = False,
           inputs_reloaded: bool = False) -> Placement:
        """A placement from the planners' flags."""
        return cls(tuple(layers), tile, WeightResidency.of(resident), double_buffered,
                   HaloMode.of(halo_reuse),
                   loop=LoopOrder.WEIGHTS_OUTER if weights_outer else LoopOrder.TILES_OUTER,
                   passes=passes, inputs_held=inputs_held, hidden_chunks=hidden_chunks,
                   maps_held=maps_held, inputs_reloaded=inputs_reloaded)

    @property
    def weights_outer(self) -> bool:
        """Whether each weight chunk sweeps every tile before the next chunk loads."""
        return self.loop is LoopOrder.WEIGHTS_OUTER

    def residency(self, layer: str) -> WeightResidency:
        """Where this layer's weights live (the group's residency, for now)."""
        if layer not in self.layers:
            raise KeyError(layer)
        return self.weights

    def chunk_count(self, layer: str) -> int:
        """Output-channel chunks the layer's streamed weights arrive in (1: whole)."""
        return dict(self.chunks).get(layer, 1)

    @property
    def weights_resident(self) -> bool:
        """Whether the group's weights are held on chip for all its tiles."""
        return self.weights is WeightResidency.RESIDENT

    @property
    def halo_reuse(self) -> bool:
        """Whether tiles keep what later tiles read instead of recomputing halos."""
        return self.halo is HaloMode.REUSE
