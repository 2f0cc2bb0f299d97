"""Tile search for a group whose kept keys spill (Mode.keys_spilled, planner.cost.spilled_keys).

The search is in Python for every planner: CP-SAT gets its choices pinned (their costs are
constants, their rules encoded on the pinned facts). Spilling is offered only where the
keys the group keeps do not fit one cluster's SRAM whole (where they fit, holding them
moves fewer bytes at any height), at every tile count from 2 to GROWING_TILES, each at its
shortest height (spilled_heights), tallest first: the tallest that fits the chip is found by
bisection (the peak shrinks with the tile), and from it the TALLEST that pass the rules are
costed (fewer tiles read the keys back fewer times: over T tiles, (T - 1) / 2 times).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import replace
from typing import Protocol, cast

from fuseplan.planner.cost.counters import Counters
from fuseplan.planner.cost.spilled_keys import spilled_keys_cost, spilled_work
from fuseplan.planner.geometry.attention import spillable
from fuseplan.planner.geometry.halo_reuse import GROWING_TILES, ReuseGrid, kept_outgrow
from fuseplan.planner.geometry.regions import Tile
from fuseplan.planner.plan.mode import Mode
from fuseplan.rules.base import GroupFacts, Rule, Violation
from fuseplan.solver.bisect import tallest_choices
from fuseplan.solver.capacity import physical_violations
from fuseplan.solver.cluster_split import GroupSearch as SplitSearch

SPILLED = Mode.of(halo_reuse=True, keys_spilled=True)
# heights costed, tallest first: shorter tiles read the keys back more times and run more
# steps, so past the tallest that fits the next serves only where a rule cuts that one
TALLEST = 2


class GroupSearch(SplitSearch, Protocol):
    """What this search asks of a group's tile search (solver.tiles.GroupSearch), beyond
    what the cluster split's asks."""

    tn: int | None
    memo: dict[tuple[object, ...], object]

    def can_reuse(self) -> bool: ...

    def reuse_grid(self, tile: Tile) -> ReuseGrid: ...

    def wram_grid(self, tile: Tile) -> ReuseGrid: ...


def spills(search: GroupSearch) -> bool:
    """Whether the group may run with its kept keys spilled and gains by it: the rules'
    search allows, its tiles may reuse halos at full width over the whole batch, it makes
    a causal attention's keys that may spill (attention.spillable), and those do not fit
    one cluster's SRAM whole."""
    return (search.ruleset.search.keys_spilled and search.can_reuse()
            and search.tn is None and search.tw is None and search.bands == 1
            and spillable(search.graph, search.io)
            and kept_outgrow(search.graph, search.io, search.chip))


def spilled_facts(search: GroupSearch, tile: Tile, grid: ReuseGrid | None = None,
                  double_buffered: bool = False, split: bool = False) -> GroupFacts:
    """The rules' facts of `tile` run with its kept keys spilled (`grid`: its spilled grid;
    `split`: over the clusters, solver.split_reuse)."""
    mode = replace(SPILLED, double_buffered=double_buffered, cluster_split=split)
    return GroupFacts(search.graph, search.io, search.chains, tile, search.chip, mode,
                      grid or spilled_grid(search, tile), memo=search.memo)


def spilled_grid(search: GroupSearch, tile: Tile) -> ReuseGrid:
    """The spilled grid of `tile`, kept in the search's memo: its peaks serve the capacity
    checks, the cost and the prefetch room alike."""
    key: tuple[object, ...] = ("spilled_grid", search.io.layers, tile)
    if key not in search.memo:
        search.memo[key] = search.reuse_grid(tile).spilling()
    return cast(ReuseGrid, search.memo[key])


def spilled_violations(search: GroupSearch, tile: Tile, rules: Sequence[Rule] | None = None,
                       grid: ReuseGrid | None = None, double_buffered: bool = False,
                       split: bool = False) -> list[Violation]:
    """The chip's capacities and the rules' violations of `tile` with its keys spilled
    (`split`: over the clusters)."""
    facts = spilled_facts(search, tile, grid, double_buffered, split)
    return physical_violations(facts) + [
        v for r in search.chosen_rules(rules) if (v := r.check(facts)) is not None]


def spilled_heights(heights: Sequence[int]) -> list[int]:
    """The shortest of `heights` (tallest first: the map's) cutting the map into each tile
    count from 2 to GROWING_TILES, tallest first. Among the heights making as many tiles
    the shortest reads the fewest keys back (each tile reads the rows before it) and holds
    the least; halvings alone would leave a tile count between them unoffered, and the keys
    read back grow with the count (a 4,096-token layer fitting 13 tiles would run in 16)."""
    if not heights:
        return []
    h, have = heights[0], set(heights)
    out: list[int] = []
    for count in range(2, GROWING_TILES + 1):
        th = -(-h // count)
        if th < h and th in have and th not in out:  # one tile reads nothing back
            out.append(th)
    return out


def spilled_choices(search: GroupSearch, rules: Iterable[Rule] | None
                    ) -> Iterator[tuple[Tile, Mode, Counters]]:
    """(tile, mode, cost) of the TALLEST offered heights that fit and pass the rules with
    the group's kept keys spilled, single- and (where it fits) double-buffered: the second
    buffer takes the next tile's inputs; the keys it reads back stream a chunk at a
    time."""
    if not spills(search):
        return
    chosen = search.chosen_rules(rules)

    # the peak shrinks with the tile: the tallest that fits the chip by bisection (where
    # the shortest does not fit, none does: one check, where a long-context MHA layer
    # would cost every height)
    def fits(th: int, db: bool) -> bool:
        return not spilled_violations(search, search.tile_of(th), (), None, db)

    def passes(th: int) -> bool:
        return not spilled_violations(search, search.tile_of(th), chosen)

    work: dict[int, Counters] = {}  # one height's, for both of its buffers
    for th, db in tallest_choices(spilled_heights(search.heights()), fits, passes, TALLEST):
        tile = search.tile_of(th)
        grid = spilled_grid(search, tile)
        if th not in work:
            work[th] = spilled_work(search.graph, search.io, search.chains, tile, search.chip,
                                    grid)
        yield tile, replace(SPILLED, double_buffered=db), spilled_keys_cost(
            search.graph, search.layers, tile, search.chip, db, grid, work[th])
