"""Tile search for a group whose stretches run in hidden chunks (planner.geometry.hidden).

The search is in Python for every planner: CP-SAT gets the best choice pinned (its cost
and exact peak are constants, its rules checked here). For each tile height, tallest
first, and weight residency, the fewest chunks that fit the chip and pass the rules win:
more chunks only add core traffic (the accumulator, the widening layer's input read
again), while DRAM traffic does not depend on the count. Capacities use the exact peak
(every chunk and step of every representative tile) and the exact weights on chip; the
rules see each hidden map as its widest chunk (GroupFacts.hidden).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from math import ceil

from fuseplan.hardware.chip import Chip
from fuseplan.planner.core.units import vs_bytes
from fuseplan.planner.cost.counters import Counters
from fuseplan.planner.cost.hidden import (
    HiddenStream,
    TileProfile,
    hidden_cost,
    hidden_peak_bytes,
    hidden_stream,
    tile_profiles,
)
from fuseplan.planner.cost.model import weight_bytes
from fuseplan.planner.geometry.hidden import Stretch, chunk_options, stretches
from fuseplan.planner.geometry.regions import GroupChains, GroupIO, Tile, group_chains, group_io
from fuseplan.planner.geometry.reload import reloaded_inputs
from fuseplan.planner.ir.graph import Graph
from fuseplan.planner.plan.mode import Mode
from fuseplan.rules.base import GroupFacts, Rule, Violation
from fuseplan.solver.bisect import first_passing

TALLEST = 4  # feasible heights costed per group and residency


def hidden_room(chip: Chip, fmap_peak: int, onchip_weights: int) -> int:
    """Bytes a hidden-chunked group leaves for the next group's weights (as
    solver.capacity.prefetch_room): WRAM beside its weights on chip where the chip has one,
    else SRAM beside its exact peak (weights included on single-memory chips)."""
    if chip.wram is not None:
        return chip.wram.bytes * chip.cores_per_cluster - onchip_weights
    return chip.sram.bytes - fmap_peak


def chunk_violations(chip: Chip, what: str, sram: int, weights: int, resident: bool
                     ) -> list[Violation]:
    """The chip's capacities against the exact SRAM peak of a group run in chunks (`what`:
    "hidden" or "head"), `weights` the weight bytes it holds at once: SRAM, each core's NRAM
    share of the maps, each core's WRAM share of the weights."""
    out = []
    if sram > chip.sram.bytes:
        need_s, has_s = vs_bytes(sram, chip.sram.bytes)
        out.append(Violation("HW", "sram", f"the {what} chunks need {need_s} of SRAM, has "
                             f"{has_s}", sram, chip.sram.bytes))
    if chip.nram is not None:
        share = ceil((sram - (weights if chip.unified else 0)) / chip.cores_per_cluster)
        if share > chip.nram.bytes:
            need_s, has_s = vs_bytes(share, chip.nram.bytes)
            out.append(Violation("HW", "nram", f"each core needs {need_s} of NRAM, has "
                                 f"{has_s}", share, chip.nram.bytes))
    if chip.wram is not None and ceil(weights / chip.cores_per_cluster) > chip.wram.bytes:
        share = ceil(weights / chip.cores_per_cluster)
        held = "resident weights" if resident else "streamed weight slices"
        need_s, has_s = vs_bytes(share, chip.wram.bytes)
        out.append(Violation("HW", "wram", f"each core needs {need_s} of WRAM for {held}, "
                             f"has {has_s}", share, chip.wram.bytes))
    return out


@dataclass
class HiddenSearch:
    """Feasibility and cost of one group's tiles run in hidden chunks."""

    graph: Graph
    io: GroupIO
    chains: GroupChains
    chip: Chip
    found: tuple[Stretch, ...]
    peaks: dict[tuple[Tile, bool, bool, int], int] = field(default_factory=dict, repr=False)
    # per tile, what each representative tile holds whatever the chunk count; per chunk
    # count, the weights stream (both asked for again and again by the bisections)
    profiles: dict[Tile, list[TileProfile]] = field(default_factory=dict, repr=False)
    streams: dict[int, HiddenStream] = field(default_factory=dict, repr=False)
    # what the rules' facts work out for this group whatever the residency, buffers and
    # chunks (enumerated spans, halo re-reads), shared by every check of this search
    memo: dict[tuple[object, ...], object] = field(
        default_factory=dict, repr=False)
    # inputs loaded again after a stretch instead of held across it (planner.geometry.reload)
    reloaded: Mapping[str, tuple[int, int]] | None = None

    @classmethod
    def of(cls, graph: Graph, layers: Iterable[str], chip: Chip,
           known: tuple[GroupIO, GroupChains] | None = None, reload: bool = False
           ) -> HiddenSearch | None:
        """The search of a group holding at least one stretch, else None (``known``: the
        group's GroupIO and chains, when the caller has them; ``reload``: with its inputs
        loaded again after a stretch, None when it has none to load again)."""
        io = known[0] if known is not None else group_io(graph, tuple(layers))
        found = stretches(graph, io)
        if not found:
            return None
        reloaded = reloaded_inputs(graph, io) if reload else None
        if reload and not reloaded:
            return None
        return cls(graph, io, known[1] if known is not None else group_chains(graph, io),
                   chip, found, reloaded=reloaded)

    @property
    def inputs_reloaded(self) -> bool:
        """Whether this search loads inputs again after a stretch."""
        return bool(self.reloaded)

    def chunk_options(self) -> list[int]:
        return chunk_options(self.found)

    def peak(self, tile: Tile, resident: bool, double_buffered: bool, chunks: int) -> int:
        """Exact SRAM peak (weights included on single-memory chips)."""
        key = (tile, resident, double_buffered, chunks)
        if key not in self.peaks:
            if tile not in self.profiles:
                self.profiles[tile] = tile_profiles(self.graph, self.io, self.chains,
                                                    self.found, tile, self.reloaded)
            self.peaks[key] = hidden_peak_bytes(
                self.graph, self.io, self.chains, self.found, chunks, tile, self.chip,
                resident, double_buffered, self.profiles[tile],
                self.stream(chunks) if self.chip.unified and not resident else None)
        return self.peaks[key]

    def stream(self, chunks: int) -> HiddenStream:
        """The weights on chip at every step when they stream."""
        if chunks not in self.streams:
            self.streams[chunks] = hidden_stream(self.graph, self.io, self.found, chunks,
                                                 self.chip)
        return self.streams[chunks]

    def weights_on_chip(self, resident: bool, chunks: int) -> int:
        """Weight bytes in the weight memory at once: all when resident, else the most the
        stream holds."""
        return self.weight_bytes if resident else self.stream(chunks).most

    def physical(self, tile: Tile, resident: bool, double_buffered: bool, chunks: int
                 ) -> list[Violation]:
        """The chip's capacities, from the exact peak (as the emulator checks them)."""
        return chunk_violations(self.chip, "hidden", self.peak(tile, resident, double_buffered,
                                                               chunks),
                                self.weights_on_chip(resident, chunks), resident)

    def facts(self, tile: Tile, resident: bool, double_buffered: bool, chunks: int
              ) -> GroupFacts:
        """The group's facts with each hidden map held as its widest chunk."""
        return GroupFacts(self.graph, self.io, self.chains, tile, self.chip,
                          Mode.of(resident=resident, double_buffered=double_buffered,
                                  hidden_chunks=chunks), hidden=self.found,
                          hidden_weights=None if resident else self.stream(chunks),
                          memo=self.memo, reloaded=self.reloaded)

    def rule_violations(self, tile: Tile, resident: bool, double_buffered: bool, chunks: int,
                        rules: Iterable[Rule]) -> list[Violation]:
        facts = self.facts(tile, resident, double_buffered, chunks)
        return [v for r in rules if (v := r.check(facts)) is not None]

    def fewest_chunks(self, tile: Tile, resident: bool, double_buffered: bool,
                      rules: tuple[Rule, ...]) -> int | None:
        """The fewest chunks with which the tile fits and passes the rules (None: no count).
        More chunks hold less at once (the capacities and what the rules measure shrink), so
        the counts that fit and pass form a range, found by bisection from the most."""
        options = self.chunk_options()
        if not options:
            return None

        def ok(k: int) -> bool:
            return not self.physical(tile, resident, double_buffered, k) \
                and not self.rule_violations(tile, resident, double_buffered, k, rules)

        return first_passing(options, ok)

    def cost(self, tile: Tile, resident: bool, double_buffered: bool, chunks: int,
             work: Counters | None = None) -> Counters:
        """Every counter (``work``: the tile's work counters run whole, when known)."""
        c = hidden_cost(self.graph, self.io, self.chains, self.found, chunks, tile, self.chip,
                        resident, double_buffered, work, self.reloaded)
        self.peaks[(tile, resident, double_buffered, chunks)] = c.sram_peak_bytes
        return c

    def room(self, tile: Tile, resident: bool, double_buffered: bool, chunks: int) -> int:
        return hidden_room(self.chip, self.peak(tile, resident, double_buffered, chunks),
                           self.weights_on_chip(resident, chunks))

    @property
    def weight_bytes(self) -> int:
        return weight_bytes(self.graph, self.io.weights, self.chip)
