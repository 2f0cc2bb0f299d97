"""Tile choice for one group in Python, shared by the greedy and shortest-path planners.

Every counter of the cost model is non-increasing in the tile height (fewer tiles,
fewer halo re-reads), so the best tile is the tallest one that passes the rules
and fits the chip; small-map rules make feasibility non-monotone, so the exact
search scans every height from the top instead of bisecting.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from math import ceil

from hardware.chip import Chip
from planner.cost import Counters, cycles_energy, group_cost, traffic_macs
from planner.ir import Graph
from planner.regions import GroupChains, GroupIO, Tile, anchor_extent, group_chains, group_io
from rules.base import GroupFacts, Rule, Violation
from rules.ruleset import RuleSet
from solver.encoding import tile_floor


@dataclass(frozen=True)
class TileChoice:
    """A feasible tile for a group with its predicted cost."""

    tile: Tile
    resident: bool
    cost: Counters


def physical_violations(facts: GroupFacts) -> list[Violation]:
    """Capacity the chip enforces on every group, fused or not (bound formulas, as CP-SAT)."""
    chip = facts.chip
    out = []
    live = facts.live_peak_bytes
    weights = facts.weight_bytes if facts.weights_resident else 0
    sram_need = live + (weights if chip.unified else 0)
    if sram_need > chip.sram.bytes:
        out.append(Violation("HW", "sram", f"tile needs {sram_need} B of SRAM, has "
                             f"{chip.sram.bytes} B", sram_need, chip.sram.bytes))
    if chip.nram is not None:
        share = ceil(live / chip.cores_per_cluster)
        if share > chip.nram.bytes:
            out.append(Violation("HW", "nram", f"each core needs {share} B of NRAM, has "
                                 f"{chip.nram.bytes} B", share, chip.nram.bytes))
    if chip.wram is not None and weights:
        share = ceil(weights / chip.cores_per_cluster)
        if share > chip.wram.bytes:
            out.append(Violation("HW", "wram", f"each core needs {share} B of WRAM for resident "
                                 f"weights, has {chip.wram.bytes} B", share, chip.wram.bytes))
    return out


def objective_value(cost: Counters, objective: str, ruleset: RuleSet) -> float:
    """Scalar to minimise for a cost under an objective."""
    if objective == "latency":
        return cost.cycles
    if objective == "energy":
        return cost.energy_pj
    if objective == "weighted":
        o = ruleset.objective
        return (o.dram_bytes_weight * cost.dram_bytes + o.cycles_weight * cost.cycles
                + o.energy_pj_weight * cost.energy_pj)
    return cost.dram_bytes


@dataclass
class GroupSearch:
    """Tile search for one set of layers."""

    graph: Graph
    layers: tuple[str, ...]
    chip: Chip
    ruleset: RuleSet
    io: GroupIO
    chains: GroupChains
    tn: int | None = None  # images per tile; None: the whole batch

    @classmethod
    def of(cls, graph: Graph, layers: Sequence[str], chip: Chip, ruleset: RuleSet) -> GroupSearch:
        io = group_io(graph, layers)
        return cls(graph, tuple(io.layers), chip, ruleset, io, group_chains(graph, io))

    def facts(self, tile: Tile, resident: bool) -> GroupFacts:
        return GroupFacts(self.graph, self.io, self.chains, tile, self.chip, resident)

    def heights(self) -> list[int]:
        """Candidate tile heights, tallest first (only the whole map if rows cannot tile)."""
        _, h, _ = anchor_extent(self.graph, self.io)
        low = tile_floor(self.chains, self.io, self.graph, 1)
        if low is None:
            return [h]
        return list(range(h, low - 1, -1))

    def tile_of(self, th: int) -> Tile:
        n, _, w = anchor_extent(self.graph, self.io)  # tiles span the whole width
        return Tile(self.tn or n, th, w)

    def batch_options(self) -> list[int]:
        """Images per tile worth trying, largest first (the whole batch if it cannot split)."""
        n = anchor_extent(self.graph, self.io)[0]
        kept = all(c[0] is not None and c[0].s == 1 for c in self.chains.chains.values())
        if n == 1 or not kept:
            return [n]
        return sorted({-(-n // k) for k in range(1, n + 1)}, reverse=True)

    def at_batch(self, tn: int) -> GroupSearch:
        """The same search with tn images per tile."""
        return replace(self, tn=tn)

    def violations(self, tile: Tile, resident: bool, rules: Iterable[Rule] | None = None
                   ) -> list[Violation]:
        """Physical capacity and rule violations of one tile."""
        f = self.facts(tile, resident)
        found = physical_violations(f)
        if len(self.layers) > 1:
            chosen = self.ruleset.enabled if rules is None else tuple(rules)
            found += [v for r in chosen if (v := r.check(f)) is not None]
        return found

    def feasible(self, th: int, resident: bool, rules: Iterable[Rule] | None = None) -> bool:
        return not self.violations(self.tile_of(th), resident, rules)

    def quick_cost(self, tile: Tile, resident: bool) -> Counters:
        """DRAM bytes, MACs, cycles and energy of a tile, without the SRAM peak."""
        fmap, wbytes, write, macs = traffic_macs(self.graph, self.io, self.chains, tile,
                                                 self.chip, resident)
        cycles, energy = cycles_energy(self.chip, fmap + wbytes + write, macs)
        return Counters(fmap + wbytes, write, wbytes, 0, 0, macs, cycles, energy)

    def best(self, objective: str = "traffic", rules: Iterable[Rule] | None = None
             ) -> TileChoice | None:
        """The exact best tile over every batch split, height and weight residency."""
        found = [c for tn in self.batch_options()
                 if (c := self.at_batch(tn)._best_height(objective, rules)) is not None]
        if not found:
            return None
        return min(found, key=lambda c: (objective_value(c.cost, objective, self.ruleset),
                                         not c.resident, -c.tile.n, -c.tile.h))

    def _best_height(self, objective: str, rules: Iterable[Rule] | None) -> TileChoice | None:
        """The exact best tile over every height and weight residency.

        Capacities only shrink as tiles get shorter, so the heights that fit them form a
        range found by bisection; inside it every height is costed (cost is not monotone:
        short tiles of a strided 1x1 conv skip the rows it never reads) and checked against
        the other rules.
        """
        chosen = tuple(self.ruleset.enabled if rules is None else rules)
        shrink = tuple(r for r in chosen if r.tile_trend == "shrink")
        rest = tuple(r for r in chosen if r.tile_trend != "shrink")
        heights = self.heights()
        options: list[tuple[float, bool, int]] = []
        for resident in (True, False):
            feasible = [heights[0]] if self.feasible(heights[0], resident, chosen) else []
            top = _tallest(self, heights[1:], resident, shrink)
            if top is not None:
                feasible += [th for th in heights[heights.index(top):]
                             if not rest or self.feasible(th, resident, rest)]
            for th in feasible:
                value = objective_value(self.quick_cost(self.tile_of(th), resident), objective,
                                        self.ruleset)
                options.append((value, not resident, -th))
        if not options:
            return None
        _, streamed, neg_th = min(options)
        tile = self.tile_of(-neg_th)
        return TileChoice(tile, not streamed,
                          group_cost(self.graph, self.layers, tile, self.chip, not streamed))

    def search(self, how: str, rules: Iterable[Rule] | None = None) -> TileChoice | None:
        """Seed 000's tile searches (N first, then H): the largest batch split that fits."""
        for tn in self.batch_options():
            found = self.at_batch(tn)._search_height(how, rules)
            if found is not None:
                return found
        return None

    def _search_height(self, how: str, rules: Iterable[Rule] | None) -> TileChoice | None:
        """Halve the height until it fits (refining the ratio), or grow it until it would not."""
        chosen = tuple(self.ruleset.enabled if rules is None else rules)
        heights = self.heights()
        low, high = heights[-1], heights[0]
        for resident in (True, False):
            th = _large_to_small(self, low, high, resident, chosen) if how == "large_to_small" \
                else _small_to_large(self, low, high, resident, chosen)
            if th is not None:
                tile = self.tile_of(th)
                return TileChoice(tile, resident,
                                  group_cost(self.graph, self.layers, tile, self.chip, resident))
        return None


def _tallest(s: GroupSearch, heights: Sequence[int], resident: bool,
             rules: tuple[Rule, ...]) -> int | None:
    """Largest height (heights descending) passing rules that only get easier as tiles shrink."""
    lo, hi = 0, len(heights) - 1
    if hi < 0 or not s.feasible(heights[hi], resident, rules):
        return None
    while lo < hi:  # invariant: heights[hi] is feasible
        mid = (lo + hi) // 2
        if s.feasible(heights[mid], resident, rules):
            hi = mid
        else:
            lo = mid + 1
    return heights[hi]


def _large_to_small(s: GroupSearch, low: int, high: int, resident: bool,
                    rules: tuple[Rule, ...]) -> int | None:
    """Halve until a height fits, then refine toward the last one that did not (1/2, 3/4...)."""
    if s.feasible(high, resident, rules):
        return high
    bad, th = high, high
    while th > low:
        th = max(low, th // 2)
        if s.feasible(th, resident, rules):
            good = th
            while bad - good > 1:  # refine the ratio so the tile ends close to the memory size
                mid = (good + bad) // 2
                if s.feasible(mid, resident, rules):
                    good = mid
                else:
                    bad = mid
            return good
        bad = th
    return None


def _small_to_large(s: GroupSearch, low: int, high: int, resident: bool,
                    rules: tuple[Rule, ...]) -> int | None:
    """Grow the tile from the smallest until the next step would not fit."""
    if not s.feasible(low, resident, rules):
        return None
    th = low
    step = 1
    while th < high:
        nxt = min(high, th + step)
        if not s.feasible(nxt, resident, rules):
            if step == 1:
                break
            step = 1
            continue
        th, step = nxt, step * 2
    return th
