"""One group of a plan as planned: its layers, tile and execution mode (planner.plan.mode).

Every planner returns a list of placements; planner.app.assemble turns them into a Plan
(costing each with the cost model), and a Group of that plan carries its placement to
the plan file and the emulator.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fuseplan.planner.geometry.regions import Tile
from fuseplan.planner.plan.mode import HaloMode, LoopOrder, Mode, ModeFlags, WeightResidency

__all__ = ["HaloMode", "LoopOrder", "Mode", "Placement", "WeightResidency"]


@dataclass(frozen=True)
class Placement(ModeFlags):
    """One group of a plan as a planner chose it (the cost model prices it): its layers,
    its tile and its mode (planner.plan.mode), and what assembling the plan adds."""

    layers: tuple[str, ...]
    tile: Tile
    mode: Mode = Mode()
    prefetch: bool = False  # weights loaded while the group before computes
    # streamed weights: (layer, output-channel chunks) of every layer cut into more than one
    # (planner.cost.weight_stream.chunk_counts); the others stream whole
    chunks: tuple[tuple[str, int], ...] = ()

    @classmethod
    def of(cls, layers: Sequence[str], tile: Tile, resident: bool = True,
           double_buffered: bool = False, halo_reuse: bool = False, *,
           weights_outer: bool = False, passes: int = 1,
           inputs_held: bool = False, hidden_chunks: int = 1, maps_held: bool = False,
           inputs_reloaded: bool = False, end_chunks: int = 1,
           cluster_split: bool = False, keys_spilled: bool = False,
           keys_in_wram: bool = False) -> Placement:
        """A placement from flags (hand-written plans; the planners pass their Mode)."""
        return cls(tuple(layers), tile, Mode.of(
            resident=resident, double_buffered=double_buffered, halo_reuse=halo_reuse,
            weights_outer=weights_outer, passes=passes, inputs_held=inputs_held,
            hidden_chunks=hidden_chunks, maps_held=maps_held, inputs_reloaded=inputs_reloaded,
            end_chunks=end_chunks, cluster_split=cluster_split, keys_spilled=keys_spilled,
            keys_in_wram=keys_in_wram))

    @property
    def weights(self) -> WeightResidency:
        return self.mode.weights

    @property
    def halo(self) -> HaloMode:
        return self.mode.halo

    @property
    def loop(self) -> LoopOrder:
        return self.mode.loop

    def residency(self, layer: str) -> WeightResidency:
        """Where this layer's weights live (the group's residency, for now)."""
        if layer not in self.layers:
            raise KeyError(layer)
        return self.weights

    def chunk_count(self, layer: str) -> int:
        """Output-channel chunks the layer's streamed weights arrive in (1: whole)."""
        return dict(self.chunks).get(layer, 1)
