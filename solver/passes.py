"""Tile search for a group run in passes around its reductions (planner.geometry.passes).

The search is in Python for every planner: CP-SAT gets the best choice pinned (its cost
and exact peak are constants, its rules checked here). The plan's tile spans the whole
batch (an accumulator folds every image of its tile) and the last pass's full width; each
pass cuts its own anchor with it; weights are resident, halos recomputed; the tallest
heights that fit are costed, with and without a second input buffer (without it when the
inputs are held). Capacities use the exact peak of the passes and the tails; the rules
that depend on the tile bind each pass as a group of its own, with what the group holds on
chip beside it and its resident weights, or the whole group with the tile
(Rule.in_passes); the structural ones bind the whole group. Where the passes hold
stretches (planner.geometry.passes.pass_stretches) and the rules allow hidden chunks,
heights taller than any that fit whole are tried with each pass's stretches chunked, with
the fewest chunks that fit and pass the rules (each hidden map seen as its widest chunk).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property, partial
from math import ceil

from fuseplan.hardware.chip import Chip
from fuseplan.planner.core.units import vs_bytes
from fuseplan.planner.cost.counters import Counters
from fuseplan.planner.cost.model import weight_bytes
from fuseplan.planner.cost.passes import fmap_peaks, held_bytes, passes_cost
from fuseplan.planner.geometry.hidden import Stretch
from fuseplan.planner.geometry.passes import Passes, pass_chunk_options, pass_split, pass_stretches
from fuseplan.planner.geometry.regions import GroupChains, Tile, anchor_extent, group_chains
from fuseplan.planner.ir.graph import Graph
from fuseplan.planner.plan.mode import Mode
from fuseplan.rules.base import GroupFacts, Rule, Violation
from fuseplan.solver.bisect import chunked_heights, first_passing

TALLEST = 4  # feasible heights costed per group


def passes_room(chip: Chip, fmap_peak: int, weights: int) -> int:
    """Bytes a group run in passes leaves for the next group's weights, from its exact
    feature-map peak and resident weights (as solver.capacity.prefetch_room: WRAM where the
    chip has one, else SRAM)."""
    if chip.wram is not None:
        return chip.wram.bytes * chip.cores_per_cluster - weights
    return chip.sram.bytes - fmap_peak - (weights if chip.unified else 0)


@dataclass
class PassSearch:
    """Feasibility and cost of the multi-pass tiles of one group."""

    graph: Graph
    split: Passes
    chip: Chip
    chains: tuple[GroupChains, ...]  # of each pass
    peaks: dict[tuple[int, bool, int], tuple[int, int]] = field(default_factory=dict,
                                                                repr=False)
    # what the rules' facts work out for this group whatever the residency, buffers and
    # chunks (enumerated spans, halo re-reads), shared by every check of this search
    memo: dict[tuple[object, ...], object] = field(
        default_factory=dict, repr=False)

    @classmethod
    def of(cls, graph: Graph, layers: Iterable[str], chip: Chip, inputs_held: bool = False,
           maps_held: bool = False) -> PassSearch | None:
        """The search of a group that can run in passes, else None (``inputs_held``: its
        inputs loaded once and held on chip; ``maps_held``: its pooled maps kept on chip)."""
        split = pass_split(graph, tuple(layers), inputs_held, maps_held)
        if split is None:
            return None
        return cls(graph, split, chip, tuple(group_chains(graph, io) for io in split.ios))

    @property
    def weight_bytes(self) -> int:
        return weight_bytes(self.graph, self.split.whole.weights, self.chip)

    def tile_of(self, th: int) -> Tile:
        n, _, w = anchor_extent(self.graph, self.split.last)
        return Tile(n, th, w)

    def heights(self) -> list[int]:
        """Tile heights, tallest first (rows of the last pass's anchor)."""
        return list(range(anchor_extent(self.graph, self.split.last)[1], 0, -1))

    @cached_property
    def stretches(self) -> tuple[tuple[Stretch, ...], ...]:
        """Each pass's stretches, which hidden chunks cut (pass_stretches)."""
        return pass_stretches(self.graph, self.split)

    def chunk_options(self) -> list[int]:
        """Hidden chunk counts worth trying (none where no pass has a stretch)."""
        return pass_chunk_options(self.graph, self.split)

    def fmap_peak(self, th: int, double_buffered: bool, chunks: int = 1) -> int:
        """Exact feature-map peak of every pass and tail (no weights), each pass's stretches
        in `chunks` hidden chunks."""
        return self._peaks(th, double_buffered, chunks)[0]

    def _peaks(self, th: int, double_buffered: bool, chunks: int) -> tuple[int, int]:
        """(SRAM, cores') feature-map peaks (planner.cost.passes.fmap_peaks)."""
        key = (th, double_buffered, chunks)
        if key not in self.peaks:
            self.peaks[key] = fmap_peaks(self.graph, self.split, self.tile_of(th), self.chip,
                                         double_buffered, self.chains, chunks)
        return self.peaks[key]

    def physical(self, th: int, double_buffered: bool, chunks: int = 1) -> list[Violation]:
        """The chip's capacities, from the exact peaks (as the emulator checks them): SRAM
        holds everything; each core's NRAM its share of the rest, what is held for all the
        tiles staying in SRAM."""
        chip = self.chip
        live, cores = self._peaks(th, double_buffered, chunks)
        weights = self.weight_bytes
        out = []
        sram = live + (weights if chip.unified else 0)
        if sram > chip.sram.bytes:
            need_s, has_s = vs_bytes(sram, chip.sram.bytes)
            out.append(Violation("HW", "sram", f"the passes need {need_s} of SRAM, has "
                                 f"{has_s}", sram, chip.sram.bytes))
        if chip.nram is not None and ceil(cores / chip.cores_per_cluster) > chip.nram.bytes:
            share = ceil(cores / chip.cores_per_cluster)
            need_s, has_s = vs_bytes(share, chip.nram.bytes)
            out.append(Violation("HW", "nram", f"each core needs {need_s} of NRAM, has "
                                 f"{has_s}", share, chip.nram.bytes))
        if chip.wram is not None and ceil(weights / chip.cores_per_cluster) > chip.wram.bytes:
            share = ceil(weights / chip.cores_per_cluster)
            need_s, has_s = vs_bytes(share, chip.wram.bytes)
            out.append(Violation("HW", "wram", f"each core needs {need_s} of WRAM for "
                                 f"resident weights, has {has_s}", share,
                                 chip.wram.bytes))
        return out

    def rule_violations(self, th: int, double_buffered: bool, rules: Iterable[Rule],
                        whole: GroupFacts, chunks: int = 1) -> list[Violation]:
        """Violations of the rules: structural ones by the whole group (`whole`, any tile),
        those that look at the whole group (Rule.in_passes) by it with this tile, the others
        by each pass as a group of its own (each hidden map as its widest chunk)."""
        found = []
        tile = self.tile_of(th)
        passes = [GroupFacts(self.graph, io, chains, tile, self.chip,
                             Mode.of(double_buffered=double_buffered, hidden_chunks=chunks),
                             held_bytes=held_bytes(self.graph, self.split, k, self.chip),
                             group_weight_bytes=self.weight_bytes,
                             hidden=self.stretches[k] if chunks > 1 else (), memo=self.memo)
                  for k, (io, chains) in enumerate(zip(self.split.ios, self.chains,
                                                       strict=True))]
        tiled = GroupFacts(self.graph, whole.io, whole.chains, tile, self.chip,
                           Mode.of(double_buffered=double_buffered), memo=self.memo)
        for r in rules:
            facts = [whole] if r.is_structural else [tiled] if r.in_passes == "whole" \
                else passes
            found += [v for f in facts if (v := r.check(f)) is not None]
        return found

    def cost(self, th: int, double_buffered: bool, chunks: int = 1) -> Counters:
        """Every counter of the tile th rows tall (its stretches in `chunks` chunks)."""
        return passes_cost(self.graph, self.split, self.tile_of(th), self.chip,
                           double_buffered, self.chains,
                           self.fmap_peak(th, double_buffered, chunks), chunks)

    def room(self, th: int, double_buffered: bool, chunks: int = 1) -> int:
        """Bytes left for the next group's weights while this group runs (passes_room)."""
        return passes_room(self.chip, self.fmap_peak(th, double_buffered, chunks),
                           self.weight_bytes)

    def allowed(self, th: int, double_buffered: bool, chunks: int, *, rules: tuple[Rule, ...],
                whole: GroupFacts) -> bool:
        """The tile fits the chip and passes the rules (the rules first: they cost less
        than the exact peak, and at a group's whole-map tile they fail more often)."""
        return not self.rule_violations(th, double_buffered, rules, whole, chunks) \
            and not self.physical(th, double_buffered, chunks)

    def feasible(self, rules: Iterable[Rule], whole: GroupFacts, hidden_chunks: bool = False
                 ) -> list[tuple[int, bool, int]]:
        """(height, second buffer, hidden chunks) of the tallest tiles that fit the chip
        and pass the rules (TALLEST of them: taller tiles re-read fewer halo rows, and each
        pass costs a few milliseconds): the tallest that fits found by bisection (the peak
        shrinks with the tile), the heights below it checked in turn. With
        ``hidden_chunks``, taller heights than those run whole (at one height chunking
        changes no DRAM byte) with their passes' stretches in chunks: the tallest that fits
        with the most chunks (bisection), then TALLEST heights below it, each with the
        fewest chunks that pass (bisection)."""
        chosen = tuple(rules)
        heights = self.heights()
        out = self._tallest(heights, chosen, whole)
        options = self.chunk_options() if hidden_chunks else []
        if not options:
            return out
        done = max((th for th, _, _ in out), default=0)
        for th, k in chunked_heights(
                [th for th in heights if th > done],
                lambda th: not self.physical(th, False, options[-1]),
                lambda th: first_passing(options, partial(self.allowed, th, False,
                                                          rules=chosen, whole=whole)),
                TALLEST):
            out.append((th, False, k))
            if not self.split.inputs_held and self.allowed(th, True, k, rules=chosen,
                                                           whole=whole):
                out.append((th, True, k))
        return out

    def _tallest(self, heights: list[int], rules: tuple[Rule, ...], whole: GroupFacts
                 ) -> list[tuple[int, bool, int]]:
        """The TALLEST tallest heights that fit and pass the rules run whole (one chunk)."""
        top = first_passing(heights, lambda th: not self.physical(th, False))
        if top is None:
            return []
        out: list[tuple[int, bool, int]] = []
        for th in heights[heights.index(top):]:
            if len({h for h, _, _ in out}) >= TALLEST:
                break
            if self.rule_violations(th, False, rules, whole):
                continue
            out.append((th, False, 1))
            if self.split.inputs_held:  # nothing to prefetch: the inputs are on chip
                continue
            if self.allowed(th, True, 1, rules=rules, whole=whole):
                out.append((th, True, 1))
        return out
