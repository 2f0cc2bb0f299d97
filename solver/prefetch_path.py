"""Pricing the lazy shortest path under a timed objective, where prefetch couples groups.

Under latency, energy or a weighted mix, a group's weights may load while the group before
it computes (planner.cost.model.prefetch_cycles), so what a group adds to a plan depends on
its successor: the saving is charged to the group it hides behind, as the full search does
(solver.shortest_path). The lazy search over floors (solver.bounded_path) needs a number per
edge that no plan through it goes below: an edge's *bound* is its best choice's units less
the most that choice could hide of any next group's weight loads (its DRAM-idle cycles,
and no more than the load time of the heaviest next group whose weights could fit the room
any group leaves: ``hideable``). Better, the path runs over pairs of consecutive edges
(bounded_path.PairPricing): what an edge adds given the
next group's weights it may hide (``adds``) is exact once it is searched (the saving
depends on its own choice, on the next group's weight bytes and on whether that group
holds them resident: only weights that all load with a group's first tile are prefetched,
as the emulator's clock does) and a floor before; so once every edge on the cheapest path
is searched, that path is the optimal plan, priced exactly. An edge's state, for the edge
before it, is whether its choice is resident (not searched yet: it may be).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from functools import cached_property, partial

from fuseplan.hardware.chip import Chip
from fuseplan.planner.cost.bounds import Work, timed_floor, timed_floor_parts
from fuseplan.planner.cost.counters import Counters
from fuseplan.planner.cost.model import (
    idle_dram_cycles,
    prefetch_cycles,
    weight_bytes,
    weight_prefetch_cycles,
)
from fuseplan.planner.cost.objective import Objective, ObjectiveSettings, objective_units
from fuseplan.planner.cost.weight_stream import stage_memory
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
    # its weights all load with its first tile, so a prefetch behind the group before it
    # can take them (a streamed or weights-outer group's first tile loads one chunk; a
    # cluster split's are shares, not prefetched: planner.plan.mode.Mode.prefetchable)
    resident: bool
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
    # by edge, state and the next group's (weight bytes, overlap): (units, choice)
    _given: dict[tuple[int, Hashable, tuple[int, int]], tuple[int, int]] = field(
        default_factory=dict)
    _floored: dict[tuple[int, Work], tuple[int, int, int]] = field(default_factory=dict)
    _loads: dict[int, int] = field(default_factory=dict)  # weight bytes -> load cycles
    _least: dict[tuple[int, Hashable], int] = field(default_factory=dict)  # see least

    def hide_limits(self, edges: Sequence[Edge]) -> None:
        """Per position, the cycles the heaviest group starting there that could be
        prefetched at all takes to load its weights: the most a group ending there can
        hide behind itself. A prefetch needs the weights to fit the room a group leaves,
        never more than ``room_cap``; a group's weights include those of every shorter
        group at its start, so the heaviest is the longest that fits."""
        ends: dict[int, set[int]] = {}
        for e in edges:
            ends.setdefault(e.start, set()).add(e.end)
        self.hideable = {}
        for i, at in ends.items():
            ordered = sorted(at)
            # the ends whose weights fit the cap (they grow with the end)
            fits = bisect_right(ordered, self.room_cap, key=partial(self.weight_bytes, i))
            self.hideable[i] = 0 if fits == 0 else self._load_cycles(
                self.weight_bytes(i, ordered[fits - 1]))

    @cached_property
    def room_cap(self) -> int:
        """The most bytes any group leaves on chip for the next group's weights
        (solver.capacity.prefetch_room): the memory a cluster holds weights in."""
        return stage_memory(self.chip)

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
                *(Choice(self._units(o.cost), o.cost, o.double_buffered, o.idle, o.room,
                         o.mode.prefetchable, o) for o in e.options),
                Choice(self._units(c.cost), c.cost, c.double_buffered,
                       idle_dram_cycles(self.chip, c.cost, c.double_buffered), 0,
                       c.mode.prefetchable, c)]
        return self._choices[id(e)]

    def widen(self, e: Edge, options: Sequence[Option]) -> None:
        """Give a searched edge more choices (a whole-map group's full tile search): what
        it adds to a plan only goes down."""
        e.options = (*e.options, *options)
        self._choices.pop(id(e), None)
        self._given = {k: v for k, v in self._given.items() if k[0] != id(e)}
        self._least = {k: v for k, v in self._least.items() if k[0] != id(e)}

    def bound(self, e: Edge) -> int:
        """What a searched edge adds to any plan through it, at least."""
        most = self.hideable.get(e.end, 0)
        return min(c.units - self.coef * min(c.idle, most) for c in self.choices(e))

    def note_floor(self, e: Edge, floor_bytes: int, work: Work) -> int:
        """Keep an unsearched edge's floor parts (for `pair`); its floor given any next
        edge (bounded_path's Edge.floor)."""
        self._floors[id(e)] = (floor_bytes, work)
        return timed_floor(self.chip, self.objective, self.settings, floor_bytes, work,
                           self.hideable.get(e.end, 0))

    def kinds(self, e: Edge) -> Sequence[Hashable]:
        """The states a predecessor's price depends on (bounded_path.PairPricing): whether
        a searched edge's choice holds its weights resident (all of them load with its
        first tile, so they can be prefetched) and, if so, the cycles its first tile hides
        behind its own weight loads (no prefetch hides those again); None for an edge not
        searched yet."""
        if not (e.searched and e.choice is not None):
            return [None]
        return sorted({self._kind(c) for c in self.choices(e)}, reverse=True)

    @staticmethod
    def _kind(c: Choice) -> tuple[bool, int]:
        return (c.resident, c.cost.overlap_cycles if c.resident else 0)

    def follows(self, b: Edge, kind: Hashable) -> Hashable:
        """(weight bytes b's state lets the group before it prefetch, cycles of their load
        b hides itself): all of b's when resident, or when b is not searched yet (it may
        be: a bound, hiding none itself), else none."""
        if kind is None:
            return (self.weight_bytes(b.start, b.end), 0)
        assert isinstance(kind, tuple)
        return (self.weight_bytes(b.start, b.end), kind[1]) if kind[0] else (0, 0)

    def adds(self, a: Edge, kind: Hashable, after: Hashable | None) -> tuple[int, int]:
        """What edge a in state `kind` adds to a plan when the next group prefetches
        `after` weight bytes behind it (None: a ends the plan), and the choice that adds
        that: exact once a is searched (its best choice of that state, the saving counted
        where the weights fit the room it leaves), else its floor given that much hidden."""
        w, overlap = after if isinstance(after, tuple) else (0, 0)
        if kind is None:
            parts = self._floor_parts(a)
            if parts is None:
                return a.floor, 0
            units, transfer, compute = parts
            # the most the weights' load could hide (what b hides itself not taken off: a
            # floor still)
            hidden = self._load_cycles(w) if w <= self.room_cap else 0  # else: no room
            return units + self.coef * max(transfer, compute - hidden, 0), 0
        key = (id(a), kind, (w, overlap))
        if key not in self._given:
            found: tuple[int, int] | None = None
            for k, c in enumerate(self.choices(a)):
                if self._kind(c) != kind:
                    continue
                units = c.units
                if w and c.room >= w:
                    units -= self.coef * prefetch_cycles(self.chip, c.cost,
                                                         c.double_buffered, w, overlap)
                if found is None or units < found[0]:
                    found = (units, k)
            assert found is not None  # kinds() lists only the states some choice has
            self._given[key] = found
        return self._given[key]

    def least(self, a: Edge, kind: Hashable) -> int:
        """No more than `adds` of edge a in state `kind` before any next edge: the next
        group's weights hide at most ``hideable`` (no limit before hide_limits has looked),
        and a searched choice hides at most its DRAM-idle cycles."""
        most = self.hideable.get(a.end, 0) if self.hideable else None
        if kind is None:
            parts = self._floor_parts(a)
            if parts is None:
                return a.floor
            units, transfer, compute = parts
            return units + self.coef * max(transfer, 0 if most is None else compute - most, 0)
        key = (id(a), kind)
        if key not in self._least:
            self._least[key] = min(c.units - self.coef * (c.idle if most is None
                                                            else min(c.idle, most))
                                   for c in self.choices(a) if self._kind(c) == kind)
        return self._least[key]

    def _floor_parts(self, a: Edge) -> tuple[int, int, int] | None:
        """An unsearched edge's timed floor parts (timed_floor_parts); None where no floor
        is trusted (a.floor <= 0) or none is known: then a.floor is all there is."""
        if a.floor <= 0 or id(a) not in self._floors:
            return None
        floor_bytes, work = self._floors[id(a)]  # refining may raise them: key by value
        if (floor_bytes, work) not in self._floored:
            self._floored[floor_bytes, work] = timed_floor_parts(
                self.chip, self.objective, self.settings, floor_bytes, work)
        return self._floored[floor_bytes, work]

    def _load_cycles(self, w: int) -> int:
        """weight_prefetch_cycles of `w` bytes (memoised: the path asks for a few sizes
        millions of times)."""
        if w not in self._loads:
            self._loads[w] = weight_prefetch_cycles(self.chip, w)
        return self._loads[w]

    def steps(self, path: Sequence[tuple[Edge, int]]) -> list[tuple[Edge, Choice]]:
        """Each edge of a searched path with the choice its way names."""
        return [(e, self.choices(e)[k]) for e, k in path]

    def _units(self, c: Counters) -> int:
        return objective_units(c, self.objective, self.settings, self.chip)
