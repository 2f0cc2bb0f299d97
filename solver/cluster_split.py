"""Tile search for a group split over the clusters (planner.geometry.cluster_split).

The search is in Python for every planner: CP-SAT gets its choices pinned (their costs are
constants, their rules encoded on the pinned facts, which hold one cluster's share of the
weights). A split is tried only where the group's weights do not fit one cluster's WRAM
(SRAM on a single-memory chip) but one cluster's share of them does: where a copy fits
every cluster, the clusters run tiles of their own with the same DRAM bytes and no gathers.
Its maps are those of the same tiles run whole, so the heights that fit form a range found
by bisection from the tallest; the TALLEST of them that pass the rules are costed, with and
without a second input buffer.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Protocol

from fuseplan.hardware.chip import Chip
from fuseplan.planner.cost.cluster_split import split_cost, split_weight_bytes
from fuseplan.planner.cost.counters import Counters
from fuseplan.planner.cost.model import weight_bytes
from fuseplan.planner.cost.weight_stream import stage_memory
from fuseplan.planner.geometry.cluster_split import ClusterSplit, cluster_split
from fuseplan.planner.geometry.regions import GroupChains, GroupIO, Tile
from fuseplan.planner.ir.graph import Graph
from fuseplan.planner.plan.mode import Mode
from fuseplan.rules.base import Rule, Violation
from fuseplan.rules.ruleset import RuleSet
from fuseplan.solver.bisect import tallest_choices

TALLEST = 4  # feasible heights costed per batch split


class GroupSearch(Protocol):
    """What this search asks of a group's tile search (solver.tiles.GroupSearch)."""

    graph: Graph
    layers: tuple[str, ...]
    chip: Chip
    ruleset: RuleSet
    io: GroupIO
    chains: GroupChains
    tw: int | None
    bands: int

    def batch_options(self) -> list[int]: ...

    def at_batch(self, tn: int) -> GroupSearch: ...

    def heights(self) -> list[int]: ...

    def tile_of(self, th: int) -> Tile: ...

    def work(self, tile: Tile, resident: bool) -> Counters: ...

    def chosen_rules(self, rules: Iterable[Rule] | None) -> tuple[Rule, ...]: ...

    def violations(self, tile: Tile, resident: bool, rules: Sequence[Rule] | None = None,
                   halo_reuse: bool = False, double_buffered: bool = False,
                   physical: bool = True, weights_outer: bool = False,
                   cluster_split: bool = False, keys_in_wram: bool = False
                   ) -> list[Violation]: ...


def may_split(search: GroupSearch) -> bool:
    """Whether the search may split the group over the clusters at all: search.cluster_split
    allows, the chip has clusters, and its tiles are full width without bands."""
    return search.ruleset.search.cluster_split and search.chip.clusters >= 2 \
        and search.tw is None and search.bands == 1


def worth_splitting(search: GroupSearch) -> ClusterSplit | None:
    """The group's split over the clusters where it may split (may_split) and gains by it,
    else None: its weights fit the memory one cluster holds weights in (its WRAM, or its
    SRAM on a single-memory chip) only as a share."""
    chip = search.chip
    if not may_split(search):
        return None
    cap = stage_memory(chip)
    if weight_bytes(search.graph, search.io.weights, chip) <= cap:
        return None
    split = cluster_split(search.graph, search.io)
    if split is None or split_weight_bytes(search.graph, search.io, split, chip) > cap:
        return None
    return split


def split_choices(search: GroupSearch, rules: Iterable[Rule] | None
                  ) -> Iterator[tuple[Tile, Mode, Counters]]:
    """(tile, mode, cost) of the group split over the clusters: per batch split, the
    TALLEST heights that fit and pass the rules, single- and (where it fits)
    double-buffered."""
    split = worth_splitting(search)
    if split is None:
        return
    chosen = search.chosen_rules(rules)
    for tn in search.batch_options():
        at = search.at_batch(tn)

        def fits(th: int, db: bool, at: GroupSearch = at) -> bool:
            return not at.violations(at.tile_of(th), True, (), double_buffered=db,
                                     cluster_split=True)

        def passes(th: int, at: GroupSearch = at) -> bool:
            return not at.violations(at.tile_of(th), True, chosen, physical=False,
                                     cluster_split=True)

        work: dict[int, Counters] = {}  # one height's, for both of its buffers
        for th, db in tallest_choices(at.heights(), fits, passes, TALLEST):
            tile = at.tile_of(th)
            if th not in work:
                work[th] = at.work(tile, True)
            yield tile, Mode.of(double_buffered=db, cluster_split=True), split_cost(
                search.graph, search.io, search.chains, split, tile, search.chip, db,
                work[th])
