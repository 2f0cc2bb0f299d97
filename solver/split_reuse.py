"""Tile search for a group split over the clusters whose row tiles reuse halos
(Mode.cluster_split with halo reuse, planner.cost.cluster_split.split_cost on a reusing grid).

A decoder layer at a long context is the case: its weights (attention and MLP projections)
outgrow one cluster's WRAM, so whole it runs only split over the clusters; its attention
needs the keys of every earlier row, which tiles outer would make again for every tile.
Split with halos reused, its row tiles run in order on all the clusters together, each
keeping the keys it makes for the tiles after it (or spilling them, where they outgrow a
cluster's SRAM: planner.cost.spilled_keys), so the layer reads its input once, writes its
output once and reads its weights once, with no map between its attention and its MLP
going to DRAM. The attention itself is replicated (planner.geometry.cluster_split).

The search is in Python for every planner: CP-SAT gets its choices pinned, as the split's
and the spilled keys' own. Each cluster holds every map whole, so a height fits where the
same reusing tile fits one cluster: the tallest is found by bisection (the peak grows with
the tile), and from it the TALLEST that pass the rules are costed, single- and (where it
fits) double-buffered. Offered where the split is (solver.cluster_split.worth_splitting) and
the group's rows may reuse halos over the whole batch at full width: spilled where the
kept keys may spill and outgrow one cluster (solver.spilled_keys.spills), at the tile
counts spilled_heights offers, and held otherwise (held, keys that outgrow a cluster fit
at no height). Keys that outgrow a cluster's SRAM may instead stay in its cores' WRAM,
each cluster its heads' share (Mode.keys_in_wram, wram_split), at the map's halvings;
that split is offered whether or not the weights outgrow one cluster.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import replace

from fuseplan.planner.cost.cluster_split import split_cost, split_work
from fuseplan.planner.cost.counters import Counters
from fuseplan.planner.geometry.cluster_split import ClusterSplit, cluster_split, wram_keys
from fuseplan.planner.geometry.halo_reuse import ReuseGrid, growing_heights, kept_outgrow
from fuseplan.planner.geometry.regions import Tile
from fuseplan.planner.plan.mode import Mode
from fuseplan.rules.base import Rule, Violation
from fuseplan.solver.bisect import tallest_choices
from fuseplan.solver.cluster_split import may_split, worth_splitting
from fuseplan.solver.spilled_keys import (
    GroupSearch,
    spilled_grid,
    spilled_heights,
    spilled_violations,
    spills,
)

KEPT = Mode.of(halo_reuse=True, cluster_split=True)
SPILLED = Mode.of(halo_reuse=True, cluster_split=True, keys_spilled=True)
IN_WRAM = Mode.of(halo_reuse=True, cluster_split=True, keys_in_wram=True)
TALLEST = 2  # passing heights costed per variant (taller tiles: fewer steps, fewer reads)


def split_reuse_choices(search: GroupSearch, rules: Iterable[Rule] | None
                        ) -> Iterator[tuple[Tile, Mode, Counters]]:
    """(tile, mode, cost) of the group split over the clusters with its row tiles reusing
    halos: its kept keys held, and (where they may spill and outgrow a cluster) spilled;
    where they outgrow a cluster's SRAM, also kept in its cores' WRAM (wram_split)."""
    if search.tn is not None or not search.can_reuse():
        return
    split = worth_splitting(search)
    chosen = search.chosen_rules(rules)
    outgrow = kept_outgrow(search.graph, search.io, search.chip)
    if split is not None and not outgrow:
        yield from _variant(search, split, chosen, search.heights(), KEPT)
    elif split is not None and spills(search):  # held, keys that fill a cluster's SRAM
        # fit at no height
        yield from _variant(search, split, chosen, spilled_heights(search.heights()), SPILLED)
    if outgrow and (split := wram_split(search)) is not None:
        yield from _variant(search, split, chosen, growing_heights(search.heights()),
                            IN_WRAM)


def wram_split(search: GroupSearch) -> ClusterSplit | None:
    """The group's split where its kept keys may stay in its clusters' WRAM, each its
    query heads' share (Mode.keys_in_wram): the rules' search allows, it may split at all
    (solver.cluster_split.may_split), the chip has WRAM, and the group keeps keys a split
    shares out by heads (planner.geometry.cluster_split.wram_keys). Its weights need not
    outgrow a cluster: the keys do."""
    chip = search.chip
    if not search.ruleset.search.keys_in_wram or chip.wram is None or not may_split(search):
        return None
    split = cluster_split(search.graph, search.io)
    if split is None or wram_keys(search.graph, search.io, split, chip.clusters) is None:
        return None
    return split


def _variant(search: GroupSearch, split: ClusterSplit, chosen: Sequence[Rule],
             heights: Sequence[int], mode: Mode) -> Iterator[tuple[Tile, Mode, Counters]]:
    """The TALLEST of `heights` (tallest first) that fit and pass the rules in `mode`."""
    def fits(th: int, db: bool) -> bool:
        return not _violations(search, search.tile_of(th), mode, (), db)

    def passes(th: int) -> bool:
        return not _violations(search, search.tile_of(th), mode, chosen, False)

    work: dict[int, Counters] = {}  # one height's, for both of its buffers
    for th, db in tallest_choices(heights, fits, passes, TALLEST):
        tile = search.tile_of(th)
        grid = _grid(search, tile, mode)
        if th not in work:
            work[th] = split_work(search.graph, search.io, search.chains, tile, search.chip,
                                  grid)
        yield tile, replace(mode, double_buffered=db), split_cost(
            search.graph, search.io, search.chains, split, tile, search.chip, db, work[th],
            grid)


def _grid(search: GroupSearch, tile: Tile, mode: Mode) -> ReuseGrid:
    """The tile's reusing grid (spilling, or keeping keys in WRAM, where the mode does),
    from the search's memo."""
    if mode.keys_in_wram:
        return search.wram_grid(tile)
    return spilled_grid(search, tile) if mode.keys_spilled else search.reuse_grid(tile)


def _violations(search: GroupSearch, tile: Tile, mode: Mode, rules: Sequence[Rule],
                double_buffered: bool) -> list[Violation]:
    """The chip's capacities (each cluster: the tile's maps whole, its share of the weights)
    and the rules' violations of `tile` split in `mode`."""
    if mode.keys_spilled:
        return spilled_violations(search, tile, rules, spilled_grid(search, tile),
                                  double_buffered, split=True)
    return search.violations(tile, True, rules, halo_reuse=True,
                             double_buffered=double_buffered, cluster_split=True,
                             keys_in_wram=mode.keys_in_wram)
