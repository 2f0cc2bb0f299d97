"""Pricing the lazy shortest path under a timed objective, where prefetch couples groups.

Under latency, energy or a weighted mix, a group's weights may load while the group before
it computes (planner.cost.model.prefetch_cycles), so what a group adds to a plan depends on
its successor: the saving is charged to the group it hides behind, as the full search does
(solver.shortest_path). The lazy search over floors (solver.bounded_path) needs a number per
edge that no plan through it goes below: an edge's *bound* is its best choice's units less
the most that choice could hide of any next group's weight loads (its DRAM-idle cycles, and
no more than the longest next group's weights take: ``hideable``). Better, what an edge adds
given the edge after it (``pair``) is exact once the edge is searched (the saving depends on
its own choice and the next group's weight bytes alone, known before that group is
searched) and a floor before; the lazy path runs over pairs of consecutive edges with these
prices, so once every edge on it is searched it is the optimal plan, priced exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from fuseplan.hardware.chip import Chip
from fuseplan.planner.cost.bounds import Work, timed_floor
from fuseplan.planner.cost.counters import Counters
from fuseplan.planner.cost.model import (
    idle_dram_cycles,
    prefetch_cycles,
    weight_bytes,
    weight_prefetch_cycles,
)
from fuseplan.planner.cost.objective import Objective, ObjectiveSettings, objective_units
from fuseplan.planner.ir.graph import Graph
from fuseplan.solver.bounded_path import Edge
from fuseplan.solver.tiles import Option, TileChoice


@dataclass(frozen=True)
class Choice:
    """One way an edge's group can run, as the pricing needs it."""

    units: int  # objective units, with no prefetch saving
    cost: Counters
    double_buffered: bool
    idle: int  # DRAM-idle cycles a next group's weights can load in
    room: int  # bytes on chip for them (0: not known, so no prefetch is counted)
    made: Option | TileChoice


@dataclass
class TimedPricing:
    """Bounds and exact prices of edges under a timed objective (see the module docstring);
    caches each edge's weight bytes and choices."""

    graph: Graph
    chip: Chip
    objective: Objective
    settings: ObjectiveSettings
    coef: int  # objective units of one cycle
    order: tuple[str, ...]
    hideable: dict[int, int] = field(default_factory=dict)  # by position: see hide_limits
    _weights: dict[tuple[int, int], int] = field(default_factory=dict)
    _choices: dict[int, list[Choice]] = field(default_factory=dict)
    _floors: dict[int, tuple[int, Work]] = field(default_factory=dict)  # by edge
    _given: dict[tuple[int, int], int] = field(default_factory=dict)  # by edge, next weights
    _floored: dict[tuple[int, Work, int], int] = field(default_factory=dict)

    def hide_limits(self, edges: Sequence[Edge]) -> None:
        """Per position, the cycles the longest group starting there takes to load its
        weights (a group's weights include those of every shorter group at its start):
        the most a group ending there can hide behind itself."""
        longest: dict[int, int] = {}
        for e in edges:
            longest[e.start] = max(longest.get(e.start, e.end), e.end)
        self.hideable = {i: weight_prefetch_cycles(self.chip, self.weight_bytes(i, j))
                         for i, j in longest.items()}

    def weight_bytes(self, start: int, end: int) -> int:
        """Weight bytes of the layers at positions start .. end - 1."""
        if (start, end) not in self._weights:
            names = {w for n in self.order[start:end] for w in self.graph.layer(n).weights}
            self._weights[start, end] = weight_bytes(self.graph, names, self.chip)
        return self._weights[start, end]

    def choices(self, e: Edge) -> list[Choice]:
        """A searched edge's choices: its prefetch options and its tile (the options' best,
        or a whole-map group's whole-map tile, whose room is not known)."""
        if id(e) not in self._choices:
            assert e.choice is not None
            c = e.choice
            self._choices[id(e)] = [
                *(Choice(self._units(o.cost), o.cost, o.double_buffered, o.idle, o.room, o)
                  for o in e.options),
                Choice(self._units(c.cost), c.cost, c.double_buffered,
                       idle_dram_cycles(self.chip, c.cost, c.double_buffered), 0, c)]
        return self._choices[id(e)]

    def widen(self, e: Edge, options: Sequence[Option]) -> None:
        """Give a searched edge more choices (a whole-map group's full tile search): what
        it adds to a plan only goes down."""
        e.options = (*e.options, *options)
        self._choices.pop(id(e), None)
        self._given = {k: v for k, v in self._given.items() if k[0] != id(e)}

    def bound(self, e: Edge) -> int:
        """What a searched edge adds to any plan through it, at least."""
        most = self.hideable.get(e.end, 0)
        return min(c.units - self.coef * min(c.idle, most) for c in self.choices(e))

    def given(self, a: Edge, b: Edge | None) -> tuple[int, Choice]:
        """a's best choice followed by b (None: a ends the plan), and what a then adds:
        its units less the cycles b's weights hide behind it."""
        w = 0 if b is None else self.weight_bytes(b.start, b.end)
        best: tuple[int, Choice] | None = None
        for c in self.choices(a):
            units = c.units
            if w and c.room >= w:
                units -= self.coef * prefetch_cycles(self.chip, c.cost, c.double_buffered, w)
            if best is None or units < best[0]:
                best = (units, c)
        assert best is not None
        return best

    def note_floor(self, e: Edge, floor_bytes: int, work: Work) -> int:
        """Keep an unsearched edge's floor parts (for `pair`); its floor given any next
        edge (bounded_path's Edge.floor)."""
        self._floors[id(e)] = (floor_bytes, work)
        return timed_floor(self.chip, self.objective, self.settings, floor_bytes, work,
                           self.hideable.get(e.end, 0))

    def pair(self, a: Edge, b: Edge | None) -> int:
        """What edge a adds to a plan where b follows it (bounded_path's ``pair``): exactly
        once a is searched (the saving depends on a's choice and b's weights alone), else
        its floor given b's weights."""
        w = 0 if b is None else self.weight_bytes(b.start, b.end)
        if a.searched and a.choice is not None:
            if (id(a), w) not in self._given:
                self._given[id(a), w] = self.given(a, b)[0]
            return self._given[id(a), w]
        if a.floor <= 0 or id(a) not in self._floors:  # no floor trusted, or none known
            return a.floor
        floor_bytes, work = self._floors[id(a)]
        hides = weight_prefetch_cycles(self.chip, w)
        if (floor_bytes, work, hides) not in self._floored:
            self._floored[floor_bytes, work, hides] = timed_floor(
                self.chip, self.objective, self.settings, floor_bytes, work, hides)
        return self._floored[floor_bytes, work, hides]

    def steps(self, path: Sequence[Edge]) -> list[tuple[Edge, Choice]]:
        """Each edge of a searched path with its best choice given the edge after it."""
        return [(a, self.given(a, path[k + 1] if k + 1 < len(path) else None)[1])
                for k, a in enumerate(path)]

    def _units(self, c: Counters) -> int:
        return objective_units(c, self.objective, self.settings, self.chip)
