"""The rule mechanism: one frozen dataclass per rule, registered by one decorator.

A rule's YAML keys are exactly its dataclass fields. Every rule can

* ``check(facts)`` a concrete group and tile, returning a Violation that
  carries the numbers (needed vs allowed), or None; and
* ``encode(enc, cand, lit)`` itself into the CP-SAT model: constraints on a
  candidate group's selection literal and tile variables, each enforced only
  if the candidate is selected and the rule's own literal ``lit`` holds.

Both sides compute capacities with the same bound formulas (GroupFacts here,
solver.encoding.Encoding for CP-SAT), and a property test keeps them equal.
Rules apply to fused groups; a layer left alone is always allowed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from hardware.chip import Chip
from planner.cost.model import (
    band_peak_bytes,
    live_steps,
    region_sum,
    union_sum,
    weight_bytes,
    work_counters,
)
from planner.geometry.bands import cluster_loads
from planner.geometry.halo_reuse import ReuseGrid, reuse_peak_elems
from planner.geometry.regions import (
    AxisChain,
    GroupChains,
    GroupIO,
    Tile,
    anchor_extent,
    box_elems,
    dims,
    tile_regions,
)
from planner.ir.graph import Graph, Layer

if TYPE_CHECKING:
    from solver.encoding import Candidate, Encoding


@dataclass(frozen=True)
class Violation:
    """Why a group breaks a rule, with the numbers."""

    rule: str  # stable code, e.g. "R19"
    name: str  # YAML key, e.g. "stride_redundancy"
    message: str
    needed: float | None = None
    allowed: float | None = None

    def __str__(self) -> str:
        return f"{self.rule} {self.name}: {self.message}"


def _axis_bound(chain: AxisChain | None, extent: int, size: int, full: int) -> int:
    if chain is None or size >= extent:
        return full
    return chain.bound(size)


@dataclass(frozen=True)
class GroupFacts:
    """A concrete group and tile, with the quantities rules are stated in."""

    graph: Graph
    io: GroupIO
    chains: GroupChains
    tile: Tile
    chip: Chip
    weights_resident: bool = True
    double_buffered: bool = False
    halo_reuse: bool = False
    # the reusing tile grid, when the caller keeps one across tiles (its axes are memoized)
    grid: ReuseGrid | None = field(default=None, compare=False, repr=False)

    @cached_property
    def layers(self) -> list[Layer]:
        return [self.graph.layer(n) for n in self.io.layers]

    @property
    def fused(self) -> bool:
        return len(self.io.layers) > 1

    @cached_property
    def extent(self) -> tuple[int, int, int]:
        return anchor_extent(self.graph, self.io)

    @property
    def small(self) -> bool:
        """Small-map mode: the tile holds whole maps."""
        _, h, w = self.extent
        return self.tile.h >= h and self.tile.w >= w

    def tensor_bound_bytes(self, t: str) -> int:
        """Largest box of tensor t any tile needs (same bound as the CP-SAT encoding).

        Along an axis without a closed form (upsampling, transposed conv inside the group)
        the bound is the longest range over the tiles, found by enumerating them.
        """
        n, h, w = self.extent
        cn, cr, cc = self.chains.chains[t]
        fb = self.chains.full[t]
        c = dims(self.graph.shapes[t])[1]
        sizes = []
        for axis, (chain, extent, size) in enumerate(
                ((cn, n, self.tile.n), (cr, h, self.tile.h), (cc, w, self.tile.w))):
            full = fb[2 * axis + 1] - fb[2 * axis]
            if chain is None and size < extent:
                sizes.append(self._enumerated_span(axis).get(t, full))
            else:
                sizes.append(_axis_bound(chain, extent, size, full))
        return c * sizes[0] * sizes[1] * sizes[2] * self.chip.dtype_bytes

    def _enumerated_span(self, axis: int) -> dict[str, int]:
        """Longest range of every tensor along one axis over all tiles of that axis."""
        cache = self.__dict__.setdefault("_spans", {})
        if axis not in cache:
            n, h, w = self.extent
            size = (self.tile.n, self.tile.h, self.tile.w)[axis]
            extent = (n, h, w)[axis]
            longest: dict[str, int] = {}
            for lo in range(0, extent, size):
                box = [0, n, 0, h, 0, w]
                box[2 * axis], box[2 * axis + 1] = lo, min(extent, lo + size)
                for t, b in tile_regions(self.graph, self.io, tuple(box)).items():  # type: ignore[arg-type]
                    longest[t] = max(longest.get(t, 0), b[2 * axis + 1] - b[2 * axis])
            cache[axis] = longest
        return cache[axis]

    @cached_property
    def in_bytes(self) -> int:
        return sum(self.tensor_bound_bytes(t) for t in self.io.inputs)

    @cached_property
    def out_bytes(self) -> int:
        return sum(self.tensor_bound_bytes(t) for t in self.io.outputs)

    @cached_property
    def weight_bytes(self) -> int:
        return weight_bytes(self.graph, self.io.weights, self.chip)

    @cached_property
    def live_peak_bytes(self) -> int:
        """Peak of live tensors when freed after their last use (input/output share space)."""
        return max(sum(self.tensor_bound_bytes(t) for t in live)
                   for live in live_steps(self.graph, self.io))

    @cached_property
    def all_fmap_bytes(self) -> int:
        """Every tensor of the group held at once (no sharing)."""
        tensors = set(self.io.inputs) | set(self.io.outputs) | set(self.io.internal)
        return sum(self.tensor_bound_bytes(t) for t in tensors)

    @cached_property
    def reuse_peak_bytes(self) -> int:
        """Exact peak of feature-map bytes on chip when halos are reused (the kept borders,
        each tile's new parts, and with double buffering the next tile's loads); for a
        banded tile, the fullest cluster's bands together."""
        if self.tile.bands > 1:
            return max(cluster_loads(self.chip, self.band_peak_bytes))
        return reuse_peak_elems(self.graph, self.io, self.chains, self.tile,
                                self.double_buffered, self.grid) * self.chip.dtype_bytes

    @cached_property
    def band_peak_bytes(self) -> list[int]:
        """Each band's exact feature-map peak (planner.geometry.bands; one entry without bands)."""
        if self.tile.bands == 1:
            return [self.reuse_peak_bytes]
        return band_peak_bytes(self.graph, self.io, self.chains, self.tile, self.chip,
                               self.double_buffered)

    def redundancy_pct(self) -> float:
        """Halo re-reads as a percentage of reading each input once (rule 11)."""
        once = sum(box_elems(self.graph, t, self.chains.full[t]) for t in self.io.inputs)
        if self.tile.bands > 1:  # the bands' overlaps are re-read
            c = work_counters(self.graph, self.io, self.chains, self.tile, self.chip,
                              self.weights_resident, True)
            return 100.0 * c.redundant_read_bytes / max(once * self.chip.dtype_bytes, 1)
        read = union_sum if self.halo_reuse else region_sum
        loaded = sum(read(self.graph, self.io, self.chains, t, self.tile)
                     for t in self.io.inputs)
        return 100.0 * (loaded - once) / max(once, 1)


class Rule:
    """Base of every rule; subclasses are frozen dataclasses registered with @rule."""

    code: ClassVar[str]
    key: ClassVar[str]
    title: ClassVar[str]
    # True for rules a group may break while it grows and satisfy later (e.g. "at least 2
    # main layers"); the greedy planner checks them only on the finished group.
    final_only: ClassVar[bool] = False
    # How holding depends on the tile height: "shrink" rules (capacities) that hold for a
    # height hold for every smaller one; "grow" rules (halo redundancy) for every larger one.
    tile_trend: ClassVar[str] = "shrink"
    enabled: bool

    def check(self, facts: GroupFacts) -> Violation | None:
        """The violation of this rule by a fused group and tile, or None."""
        raise NotImplementedError

    def encode(self, enc: Encoding, cand: Candidate, lit: Any) -> None:
        """Add this rule's constraints for one candidate group, gated by cand.selected and lit."""
        raise NotImplementedError

    def violation(self, message: str, needed: float | None = None,
                  allowed: float | None = None) -> Violation:
        return Violation(self.code, self.key, message, needed, allowed)


R = TypeVar("R", bound=type[Rule])
REGISTRY: dict[str, type[Rule]] = {}


def rule(code: str, key: str, title: str) -> Callable[[R], R]:
    """Register a rule class under its YAML key."""

    def wrap(cls: R) -> R:
        cls.code, cls.key, cls.title = code, key, title
        if key in REGISTRY:
            raise ValueError(f"rule key {key!r} registered twice")
        REGISTRY[key] = cls
        return cls

    return wrap


class StructuralRule(Rule):
    """A rule on which layers a group holds, independent of the tile.

    Its encoding forbids a violating candidate while the rule is on: the
    candidate's selection literal and the rule literal cannot both hold.
    """

    def encode(self, enc: Encoding, cand: Candidate, lit: Any) -> None:
        if self.check(cand.facts_any_tile) is not None:
            enc.model.add_bool_or([cand.selected.Not(), lit.Not()])


def adjacent_pairs(facts: GroupFacts) -> Iterator[tuple[Layer, Layer]]:
    """(producer, consumer) layer pairs inside the group."""
    inside = set(facts.io.layers)
    for lay in facts.layers:
        for t in lay.outputs:
            for c in facts.graph.consumers.get(t, ()):
                if c in inside:
                    yield lay, facts.graph.layer(c)
