"""Tile choice for one group in Python, shared by the greedy and shortest-path planners.

Every counter of the cost model is non-increasing in the tile height (fewer tiles,
fewer halo re-reads), so the best tile is the tallest one that passes the rules
and fits the chip; small-map rules make feasibility non-monotone, so the exact
search scans every height from the top instead of bisecting.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property, partial

from fuseplan.hardware.chip import Chip
from fuseplan.planner.cost.cluster_split import cluster_split_cost
from fuseplan.planner.cost.layered import layered_applies
from fuseplan.planner.cost.model import (
    Counters,
    group_cost,
    group_tensors,
    head_chunked_cost,
    idle_dram_cycles,
    reread_weights,
    resident_work,
    streamed_overlap,
    tile_shares,
    weight_passes,
    with_time,
    work_counters,
)
from fuseplan.planner.cost.objective import Objective, objective_units
from fuseplan.planner.cost.spilled_keys import spilled_keys_cost
from fuseplan.planner.cost.weight_stream import layer_chunks
from fuseplan.planner.geometry.attention import (
    attention_heads,
    attention_kv_heads,
    head_chunk_options,
    online_attention,
)
from fuseplan.planner.geometry.bands import (
    band_counts,
)
from fuseplan.planner.geometry.halo_reuse import AxisSchedule, ReuseGrid, part_images, reuse_heights
from fuseplan.planner.geometry.regions import (
    GroupChains,
    GroupIO,
    Tile,
    anchor_extent,
    group_chains,
    group_io,
    tile_count,
    whole_outputs,
)
from fuseplan.planner.ir.graph import Graph, MapKind
from fuseplan.planner.plan.mode import Mode, ModeFlags
from fuseplan.planner.plan.placement import Placement
from fuseplan.rules.base import GroupFacts, Rule, Violation
from fuseplan.rules.encoding import tile_floor
from fuseplan.rules.ruleset import RuleSet
from fuseplan.solver.bisect import chunked_heights, first_passing, grow_to_fit, halve_to_fit
from fuseplan.solver.capacity import physical_violations, prefetch_room
from fuseplan.solver.cluster_split import split_choices
from fuseplan.solver.ends import TALLEST as END_TALLEST
from fuseplan.solver.ends import EndSearch
from fuseplan.solver.hidden import TALLEST as HIDDEN_TALLEST
from fuseplan.solver.hidden import HiddenSearch, chunk_violations
from fuseplan.solver.passes import PassSearch, passes_room
from fuseplan.solver.spilled_keys import spilled_choices, spilled_facts
from fuseplan.solver.split_reuse import split_reuse_choices

# how a group in passes may hold what later passes read (inputs_held, maps_held): nothing,
# its inputs, its pooled maps, or both
HOLDS = ((False, False), (True, False), (False, True), (True, True))


@dataclass(frozen=True)
class TileChoice(ModeFlags):
    """A feasible tile for a group, the mode it runs in, and its predicted cost."""

    tile: Tile
    mode: Mode
    cost: Counters

    def placement(self, layers: tuple[str, ...]) -> Placement:
        """This choice as the placement of a group of these layers."""
        return Placement(tuple(layers), self.tile, self.mode)


@dataclass(frozen=True)
class Option(ModeFlags):
    """One feasible tile choice of a group, with what a next-group prefetch needs of it."""

    rank: tuple[float, ...]  # objective first (_rank)
    tile: Tile
    mode: Mode
    cost: Counters  # every counter but the SRAM peak (pass and hidden options: every one)
    idle: int  # DRAM idle cycles the next group's weights can load in
    room: int  # bytes left on chip for them (prefetch_room)


def _rank(cost: Counters, objective: Objective, ruleset: RuleSet, chip: Chip, c: TileChoice
          ) -> tuple[float, ...]:
    """Objective first; ties go to fewer cycles, resident weights, larger tiles."""
    return (objective_units(cost, objective, ruleset.objective, chip), cost.cycles,
            not c.resident,
            -c.tile.n, -c.tile.w, -c.tile.h)


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
    tw: int | None = None  # tile width; None: the whole width
    bands: int = 1  # halo-reusing tiles only: columns split among cores (planner.geometry.bands)
    # one-axis schedules of halo-reusing tiles by (axis, size), shared by every tile tried
    schedules: dict[tuple[int, int], AxisSchedule] = field(default_factory=dict, repr=False,
                                                           compare=False)
    grids: dict[Tile, ReuseGrid] = field(default_factory=dict, repr=False, compare=False)
    # the same with kept keys in WRAM (Mode.keys_in_wram)
    wram_grids: dict[Tile, ReuseGrid] = field(default_factory=dict, repr=False,
                                              compare=False)
    # counters with resident weights by (tile, halo reuse): residency changes only the reads
    resident_costs: dict[tuple[Tile, bool], Counters] = field(default_factory=dict, repr=False,
                                                              compare=False)
    # a streamed group read in one round: its first tile's overlap (planner.cost.layered)
    streamed_overlaps: dict[tuple[Tile, bool], int] = field(default_factory=dict, repr=False,
                                                            compare=False)
    # what the rules' facts work out for this group whatever the residency, buffers and
    # chunks (enumerated spans, halo re-reads), shared by every check of this search
    memo: dict[tuple[object, ...], object] = field(
        default_factory=dict, repr=False, compare=False)

    @classmethod
    def of(cls, graph: Graph, layers: Sequence[str], chip: Chip, ruleset: RuleSet) -> GroupSearch:
        io = group_io(graph, layers)
        return cls(graph, tuple(io.layers), chip, ruleset, io, group_chains(graph, io))

    def facts(self, tile: Tile, resident: bool, double_buffered: bool = False,
              halo_reuse: bool = False, weights_outer: bool = False,
              cluster_split: bool = False, keys_in_wram: bool = False) -> GroupFacts:
        mode = Mode.of(resident=resident, double_buffered=double_buffered,
                       halo_reuse=halo_reuse, weights_outer=weights_outer,
                       cluster_split=cluster_split, keys_in_wram=keys_in_wram)
        grid = self.reuse_grid(tile) if halo_reuse else None
        if grid is not None and keys_in_wram:
            grid = self.wram_grid(tile)
        return GroupFacts(self.graph, self.io, self.chains, tile, self.chip, mode, grid,
                          memo=self.memo)

    def can_sweep_weights(self) -> bool:
        """A weights-outer loop is possible: one layer whose streamed weights arrive in more
        than one output-channel chunk (with one chunk it is the resident choice)."""
        if len(self.layers) != 1:
            return False
        lay = self.graph.layer(self.layers[0])
        return bool(lay.weights) and layer_chunks(self.graph, lay, self.chip) > 1

    def reuse_grid(self, tile: Tile) -> ReuseGrid:
        """The halo-reusing grid of a tile, its axes memoized across the tiles tried."""
        if tile in self.grids:
            return self.grids[tile]
        axes = []
        for axis, size in ((1, tile.h), (2, tile.w)):
            if (axis, size) not in self.schedules:
                self.schedules[(axis, size)] = AxisSchedule(self.graph, self.io, self.chains,
                                                            axis, size)
            axes.append(self.schedules[(axis, size)])
        # a tile's peaks are its images times the one-image tile's where every tensor has
        # the anchor's batch
        unit = self.reuse_grid(replace(tile, n=1)) if tile.n > 1 and self._one_batch else None
        self.grids[tile] = ReuseGrid(self.graph, self.io, axes[0], axes[1],
                                     part_images(self.graph, self.io, tile), unit=unit,
                                     scale=tile.n)
        return self.grids[tile]

    def wram_grid(self, tile: Tile) -> ReuseGrid:
        """The reusing grid of a tile with its kept keys in WRAM (ReuseGrid.in_wram), the
        walk shared with reuse_grid's."""
        if tile not in self.wram_grids:
            self.wram_grids[tile] = self.reuse_grid(tile).keeping_in_wram()
        return self.wram_grids[tile]

    @cached_property
    def _one_batch(self) -> bool:
        """Whether every tensor of the group has the anchor's batch (a window partition's
        does not)."""
        n = anchor_extent(self.graph, self.io)[0]
        return all(self.graph.dims(t)[0] == n for t in group_tensors(self.graph, self.io))

    def heights(self) -> list[int]:
        """Candidate tile heights, tallest first.

        Rows without a closed form (upsampling inside the group) are costed by enumerating
        tiles, and 2-D tiles multiply the choices, so only halvings of the map are offered
        there, to bound the work.
        """
        _, h, w = anchor_extent(self.graph, self.io)
        if not self.tiles_split:
            return [h]
        low = tile_floor(self.chains, self.io, self.graph, 1)
        if low is None or (self.tw or w) < w:  # 2-D tiles: halvings along both axes
            return sorted({-(-h // (1 << k)) for k in range(h.bit_length() + 1)}, reverse=True)
        return list(range(h, low - 1, -1))

    @property
    def tiles_split(self) -> bool:
        """Whether tiles may split the anchor: an output besides it (a tensor leaving
        mid-group) is needed whole by every tile, and the execution model stores it once,
        so such a group runs as one tile (planner.cost.model); outputs tiled like the
        anchor (planner.geometry.regions.tiled_like_anchor) are cut as it is."""
        return not whole_outputs(self.graph, self.io)

    @property
    def closed_form(self) -> bool:
        """Whether every row range of the group has a closed form (CP-SAT can vary th)."""
        return tile_floor(self.chains, self.io, self.graph, 1) is not None

    def tile_of(self, th: int) -> Tile:
        n, _, w = anchor_extent(self.graph, self.io)
        return Tile(self.tn or n, th, self.tw or w, self.bands)

    def widths(self) -> list[int]:
        """Tile widths narrower than the map worth trying, widest first: halvings of the
        width, where every column range is affine (their sums are then exact, by closed
        form or, below the closed forms' floor, by enumerating the tiles)."""
        w = anchor_extent(self.graph, self.io)[2]
        if tile_floor(self.chains, self.io, self.graph, 2) is None or w <= 1 \
                or not self.tiles_split:
            return []
        return sorted({-(-w // (1 << k)) for k in range(1, w.bit_length() + 1)} - {w},
                      reverse=True)

    def at_width(self, tw: int) -> GroupSearch:
        """The same search with tiles tw columns wide."""
        return replace(self, tw=tw)

    def narrow_worth_trying(self, wide_height: int | None) -> bool:
        """Whether to search 2-D tiles, given the best full-width tile's height (None: none
        fits): none fits, or the best is so short that halos dominate
        (search.narrow_tiles_below_rows)."""
        h = anchor_extent(self.graph, self.io)[1]
        search = self.ruleset.search
        return search.two_d_tiles and (wide_height is None
                                       or wide_height < min(h, search.narrow_tiles_below_rows))

    def batch_options(self) -> list[int]:
        """Images per tile worth trying, largest first (the whole batch if it cannot split)."""
        n = anchor_extent(self.graph, self.io)[0]
        kept = all(c[0] is not None and c[0].s == 1 for c in self.chains.chains.values())
        if n == 1 or not kept or not self.tiles_split:
            return [n]
        return sorted({-(-n // k) for k in range(1, n + 1)}, reverse=True)

    def at_batch(self, tn: int) -> GroupSearch:
        """The same search with tn images per tile."""
        return replace(self, tn=tn)

    def violations(self, tile: Tile, resident: bool, rules: Iterable[Rule] | None = None,
                   halo_reuse: bool = False, double_buffered: bool = False,
                   physical: bool = True, weights_outer: bool = False,
                   cluster_split: bool = False, keys_in_wram: bool = False
                   ) -> list[Violation]:
        """Rule violations of one tile, and (unless told not to) the chip's capacities."""
        f = self.facts(tile, resident, double_buffered, halo_reuse, weights_outer,
                       cluster_split, keys_in_wram)
        found = physical_violations(f) if physical else []
        return found + [v for r in self.chosen_rules(rules) if (v := r.check(f)) is not None]

    def chosen_rules(self, rules: Iterable[Rule] | None) -> tuple[Rule, ...]:
        """The rules this group's tiles must pass, in every mode: `rules` (None: every
        enabled one), and none for a layer alone (rules bind fused groups only: a layer
        alone is always allowed, whole, tiled, or in chunks of its channels)."""
        if len(self.layers) < 2:
            return ()
        return tuple(self.ruleset.enabled if rules is None else rules)

    def feasible(self, th: int, resident: bool, rules: Iterable[Rule] | None = None,
                 halo_reuse: bool = False, physical: bool = True) -> bool:
        return not self.violations(self.tile_of(th), resident, rules, halo_reuse,
                                   physical=physical)

    def at_bands(self, bands: int) -> GroupSearch:
        """The same search with halo-reusing tiles in `bands` bands."""
        return replace(self, bands=bands)

    def band_options(self, tw: int) -> list[int]:
        """Band counts worth trying for tiles tw columns wide (search.bands)."""
        if not self.ruleset.search.bands:
            return []
        return band_counts(self.chip, -(-anchor_extent(self.graph, self.io)[2] // tw))

    def can_reuse(self) -> bool:
        """Halo reuse needs closed-form rows (and columns, for 2-D tiles); a tile of fewer
        images than the batch sweeps its images' rows, then the next images' (bands split
        the whole batch's columns only)."""
        n = anchor_extent(self.graph, self.io)[0]
        cols = self.tw is None or tile_floor(self.chains, self.io, self.graph, 2) is not None
        # keys a fused attention loads stream afresh per tile; keys it makes are kept
        return (self.ruleset.search.halo_reuse and self.closed_form and cols
                and (self.bands == 1 or (self.tn or n) >= n)
                and ((a := online_attention(self.graph, self.io)) is None or not a.streamed))

    def work(self, tile: Tile, resident: bool, halo_reuse: bool = False,
             weights_outer: bool = False) -> Counters:
        """Every counter but the time and the SRAM peak (closed forms; cheap)."""
        if weights_outer:
            return work_counters(self.graph, self.io, self.chains, tile, self.chip, resident,
                                 halo_reuse, weights_outer=True)
        key = (tile, halo_reuse)
        if key not in self.resident_costs:
            self.resident_costs[key] = resident_work(
                self.graph, self.io, self.chains, tile, self.chip, halo_reuse,
                self.reuse_grid(tile) if halo_reuse else None)
        once = self.resident_costs[key]
        if resident:
            return once
        out = reread_weights(once, weight_passes(self.graph, self.io, tile, self.chip, halo_reuse),
                             self.chip, tile_shares(self.graph, self.io, tile))
        if tile_count(self.graph, self.io, tile) > 1 or not layered_applies(self.io, halo_reuse):
            return out
        if key not in self.streamed_overlaps:
            self.streamed_overlaps[key] = streamed_overlap(self.graph, self.io, tile,
                                                           self.chip, once)
        return replace(out, overlap_cycles=self.streamed_overlaps[key])

    def quick_cost(self, tile: Tile, resident: bool, double_buffered: bool,
                   halo_reuse: bool = False, weights_outer: bool = False) -> Counters:
        """Every counter but the SRAM peak (closed forms; cheap)."""
        return with_time(self.chip, self.work(tile, resident, halo_reuse, weights_outer),
                         double_buffered)

    def fits_rules(self, th: int, *, resident: bool, rules: tuple[Rule, ...],
                   halo_reuse: bool) -> bool:
        """feasible() with keyword arguments, for bisections."""
        return self.feasible(th, resident, rules, halo_reuse)

    def fits_double_buffer_at(self, th: int, *, resident: bool, halo_reuse: bool) -> bool:
        """fits_double_buffer() of the tile th rows tall."""
        return self.fits_double_buffer(self.tile_of(th), resident, halo_reuse)

    def fits_double_buffer(self, tile: Tile, resident: bool, halo_reuse: bool = False,
                           weights_outer: bool = False) -> bool:
        """A second input buffer (to prefetch the next tile) fits on chip too, and the cost
        model can time it (not a front-loaded reusing group: front_loaded)."""
        if halo_reuse and self.front_loaded:
            return False
        return not physical_violations(self.facts(tile, resident, True, halo_reuse,
                                                  weights_outer))

    @cached_property
    def front_loaded(self) -> bool:
        """Whether a layer of the group reads a map made in it whole along the rows (a
        Resize whose index map is the whole input): reusing halos, the first tile then
        makes every row of that map and of what comes before it, and later tiles only
        what follows. The closed form of a second buffer's overlap (planner.cost.model.
        cycles_energy) spreads the work evenly over the tiles and would price such a run
        at about half its time (DeepLabV3's classifier ending in its Resize: 45,057
        cycles against 82,512), so a reusing group like it runs with one buffer."""
        made = {t for n in self.io.layers for t in self.graph.layer(n).outputs if t}
        return any(m.kind is MapKind.WHOLE and t in made
                   for n in self.io.layers
                   for t, m in zip(self.graph.layer(n).fmap_inputs,
                                   self.graph.layer(n).row_maps, strict=False))

    def choice(self, tile: Tile, mode: Mode) -> TileChoice:
        """A tile run in `mode` with its full predicted cost."""
        if mode.cluster_split:
            return TileChoice(tile, mode, cluster_split_cost(
                self.graph, self.layers, tile, self.chip, mode.double_buffered,
                mode.halo_reuse, mode.keys_spilled, mode.keys_in_wram))
        if mode.keys_spilled:
            return TileChoice(tile, mode, spilled_keys_cost(
                self.graph, self.layers, tile, self.chip, mode.double_buffered))
        if mode.passes > 1:
            search = PassSearch.of(self.graph, self.layers, self.chip, mode.inputs_held,
                                   mode.maps_held)
            if search is None or search.split.count != mode.passes:
                raise ValueError(f"group of {self.layers[0]!r} cannot run in {mode.passes} "
                                 "passes")
            return TileChoice(tile, mode, search.cost(tile.h, mode.double_buffered,
                                                      mode.hidden_chunks))
        if mode.end_chunks > 1:
            ends = EndSearch.of(self.graph, self.io, self.chains, self.chip)
            if ends is None:
                raise ValueError(f"group of {self.layers[0]!r} has no ends to stream in chunks")
            return TileChoice(tile, mode, ends.cost(tile, mode.weights_resident,
                                                    mode.end_chunks))
        if mode.hidden_chunks > 1 and attention_heads(self.graph, self.io) is not None:
            return TileChoice(tile, mode, head_chunked_cost(
                self.graph, self.layers, tile, self.chip, mode.double_buffered,
                mode.hidden_chunks))
        if mode.hidden_chunks > 1:
            hidden = HiddenSearch.of(self.graph, self.layers, self.chip,
                                     reload=mode.inputs_reloaded)
            if hidden is None:
                raise ValueError(f"group of {self.layers[0]!r} has no stretch to run in "
                                 "hidden chunks" + (", or no input to load again after one"
                                                    if mode.inputs_reloaded else ""))
            return TileChoice(tile, mode, hidden.cost(tile, mode.weights_resident,
                                                      mode.double_buffered, mode.hidden_chunks))
        # the search's grid: its axes (and a peak its capacity checks computed) are reused
        grid = self.reuse_grid(tile) if mode.halo_reuse and tile.bands == 1 else None
        return TileChoice(tile, mode, group_cost(self.graph, self.layers, tile, self.chip,
                                                 mode.weights_resident, mode.double_buffered,
                                                 mode.halo_reuse, mode.weights_outer, grid))

    def best(self, objective: Objective = Objective.TRAFFIC, rules: Iterable[Rule] | None = None
             ) -> TileChoice | None:
        """The exact best tile over every batch split, height, weight residency, buffering
        and halo mode; over widths too when full-width tiles fall short (narrow_worth_trying).
        """
        found = self._all_options(objective, rules, with_room=False)
        if not found:
            return None
        o = min(found, key=lambda o: o.rank)
        return self.option_choice(o)

    def options(self, objective: Objective, rules: Iterable[Rule] | None = None) -> list[Option]:
        """Every feasible tile choice that a next-group prefetch could make worth it: those
        no better-ranked choice beats on both DRAM idle cycles and room left on chip, best
        rank first (so the first is `best`'s choice)."""
        found = sorted(self._all_options(objective, rules), key=lambda o: o.rank)
        kept: list[Option] = []
        for o in found:
            if not any(k.idle >= o.idle and k.room >= o.room for k in kept):
                kept.append(o)
        return kept

    def trade_offs(self, objective: Objective, most: int) -> list[TileChoice]:
        """Halo-reusing or 2-D choices no other such choice beats on both cycles and the
        objective (what a cycles cap trades between), fastest first; at most `most`, spread
        evenly along that front with both ends kept."""
        wide = self.tile_of(1).w
        front: list[Option] = []
        for o in sorted(self._all_options(objective, None, with_room=False),
                        key=lambda o: (o.cost.cycles, o.rank)):
            if (o.halo_reuse or o.tile.w < wide) and (not front or o.rank[0] < front[-1].rank[0]):
                front.append(o)
        if len(front) > most > 1:
            front = [front[round(k * (len(front) - 1) / (most - 1))] for k in range(most)]
        return [self.option_choice(o) for o in front[:most]]

    def _option(self, objective: Objective, tile: Tile, mode: Mode, cost: Counters,
                with_room: bool, room: Callable[[], int]) -> Option:
        """A costed choice as an option: its rank under the objective and, where a next
        group's prefetch is weighed (``with_room``), the DRAM idle cycles it leaves and the
        `room` on chip (asked only then)."""
        rank = _rank(cost, objective, self.ruleset, self.chip, TileChoice(tile, mode, cost))
        if not with_room:
            return Option(rank, tile, mode, cost, 0, 0)
        return Option(rank, tile, mode, cost,
                      idle_dram_cycles(self.chip, cost, mode.double_buffered), room())

    def _room_at(self, tile: Tile, resident: bool, double_buffered: bool, halo_reuse: bool
                 ) -> int:
        """prefetch_room of a tile run tiles outer."""
        return prefetch_room(self.facts(tile, resident, double_buffered, halo_reuse))

    def option_choice(self, o: Option) -> TileChoice:
        """The option's tile with its full predicted cost."""
        if o.mode.pinned:
            # a pass, hidden-, end-chunk or split option's cost is complete already
            # (solver.passes, solver.hidden, solver.ends, solver.cluster_split)
            return TileChoice(o.tile, o.mode, o.cost)
        search = self.at_batch(o.tile.n).at_bands(o.tile.bands)
        return search.choice(o.tile, o.mode)

    def _all_options(self, objective: Objective, rules: Iterable[Rule] | None,
                     with_room: bool = True) -> list[Option]:
        """Options over batch splits at full width, and over narrower widths when the best
        of those falls short."""
        found = [o for tn in self.batch_options()
                 for o in self.at_batch(tn)._height_options(objective, rules, with_room)]
        wide = min(found, key=lambda o: o.rank) if found else None
        if self.narrow_worth_trying(wide.tile.h if wide else None):
            found += [o for tw in self.widths() for tn in self.batch_options()
                      for o in self.at_width(tw).at_batch(tn)._height_options(
                          objective, rules, with_room)]
            found += [o for tw in self.widths() for b in self.band_options(tw)
                      for o in self.at_width(tw).at_bands(b)._height_options(
                          objective, rules, with_room)]
        return found + self._pass_options(objective, rules, with_room) \
            + self._hidden_options(objective, rules, with_room, found) \
            + self._head_options(objective, with_room, found) \
            + self._end_options(objective, rules, with_room, found) \
            + [self._option(objective, tile, mode, cost, with_room, lambda: 0)  # prefetch_room
               for choices in (split_choices, split_reuse_choices)
               for tile, mode, cost in choices(self, rules)] \
            + [self._option(objective, tile, mode, cost, with_room,
                            partial(prefetch_room, spilled_facts(self, tile, None,
                                                                 mode.double_buffered)))
               for tile, mode, cost in spilled_choices(self, rules)]

    def _head_options(self, objective: Objective, with_room: bool,
                      found: Sequence[Option]) -> list[Option]:
        """Options of a lone fused attention layer run in chunks of its heads
        (planner.geometry.attention.attention_heads), where search.hidden_chunks allows: per
        chunk count, the tallest height that fits, when taller than any option `found`
        without chunks (at one height chunks change no DRAM byte; a taller tile streams the
        keys and values fewer times), with and without a second input buffer."""
        heads = attention_heads(self.graph, self.io)
        if heads is None or not self.ruleset.search.hidden_chunks or self.tw is not None:
            return []
        out = []
        for tn in self.batch_options():
            at = self.at_batch(tn)
            done = max((o.tile.h for o in found if o.tile.n == tn), default=0)
            heights = [th for th in at.heights() if th > done]
            for k in head_chunk_options(heads, attention_kv_heads(self.graph, self.io)):
                for db in (False, True):
                    th = first_passing(heights, partial(self._head_fits_at, at, db, k))
                    if th is None:
                        continue
                    tile = at.tile_of(th)
                    cost = head_chunked_cost(self.graph, self.layers, tile, self.chip, db, k)
                    mode = Mode.of(double_buffered=db, hidden_chunks=k)
                    # room as CP-SAT prices it (solver.cpsat._pinned_room): no weights
                    out.append(self._option(objective, tile, mode, cost, with_room, partial(
                        passes_room, self.chip, cost.sram_peak_bytes, 0)))
        return out

    def _end_options(self, objective: Objective, rules: Iterable[Rule] | None,
                     with_room: bool, found: Sequence[Option]) -> list[Option]:
        """Options of streaming the group's input and output in channel chunks
        (solver.ends), where search.end_chunks allows: per batch split and weight residency,
        heights taller than any option `found` without them, single-buffered."""
        if not self.ruleset.search.end_chunks or self.tw is not None or self.bands > 1:
            return []
        ends = EndSearch.of(self.graph, self.io, self.chains, self.chip)
        if ends is None:
            return []
        chosen = self.chosen_rules(rules)
        most = ends.chunk_options()[-1]
        out = []
        for at, resident, heights in self._taller(found):
            for th, k in chunked_heights(
                    heights, partial(ends.fits_at, at.tile_of, resident, most),
                    partial(ends.fewest_at, at.tile_of, resident, chosen), END_TALLEST):
                tile = at.tile_of(th)
                cost = ends.cost(tile, resident, k, at.work(tile, resident))
                mode = Mode.of(resident=resident, end_chunks=k)
                out.append(self._option(objective, tile, mode, cost, with_room,
                                        partial(ends.room, tile, resident, k)))
        return out

    def _taller(self, found: Sequence[Option]) -> Iterator[tuple[GroupSearch, bool, list[int]]]:
        """Per batch split and weight residency: the search at that split, the residency and
        the heights taller than any option `found` there (chunks let taller tiles fit; at
        one height they change no DRAM byte)."""
        for tn in self.batch_options():
            at = self.at_batch(tn)
            for resident in (True, False):
                done = max((o.tile.h for o in found if o.tile.n == tn
                            and o.resident == resident), default=0)
                yield at, resident, [th for th in at.heights() if th > done]

    def _head_fits_at(self, at: GroupSearch, double_buffered: bool, chunks: int, th: int
                      ) -> bool:
        """The tile th rows tall of search `at` fits in `chunks` head chunks."""
        return not at.head_violations(at.tile_of(th), double_buffered, chunks)

    def head_violations(self, tile: Tile, double_buffered: bool, chunks: int
                        ) -> list[Violation]:
        """The chip's capacities against a lone fused attention's exact peak in `chunks`
        head chunks (it has no weights)."""
        peak = head_chunked_cost(self.graph, self.layers, tile, self.chip, double_buffered,
                                 chunks).sram_peak_bytes
        return chunk_violations(self.chip, "head", peak, 0, True)

    def _hidden_options(self, objective: Objective, rules: Iterable[Rule] | None,
                        with_room: bool, found: Sequence[Option]) -> list[Option]:
        """Options of running the group's stretches in hidden chunks (solver.hidden), where
        it has any and search.hidden_chunks allows: for every batch split and weight
        residency, only heights taller than any option `found` without chunks (at one
        height chunking changes no DRAM byte, it only lets taller tiles fit): the tallest
        that fits with the most chunks (bisection: the peak shrinks with the tile), then the
        heights below it, TALLEST of them that pass the rules, each with its fewest chunks,
        with and without a second input buffer."""
        if not self.ruleset.search.hidden_chunks or self.tw is not None or self.bands > 1:
            return []
        plain = HiddenSearch.of(self.graph, self.layers, self.chip, (self.io, self.chains))
        if plain is None or not plain.chunk_options():
            return []
        # and with the inputs read before and after a stretch loaded again, not held across
        # (planner.geometry.reload: one input buffer)
        searches = [plain] + ([HiddenSearch.of(self.graph, self.layers, self.chip,
                                               (self.io, self.chains), reload=True)]
                              if self.ruleset.search.reload_inputs else [])
        most = plain.chunk_options()[-1]
        chosen = self.chosen_rules(rules)
        out = []
        for hidden in (h for h in searches if h is not None):
            for at, resident, heights in self._taller(found):
                for th, k in chunked_heights(
                        heights, partial(_fits_hidden, hidden, at, resident, most),
                        partial(_fewest_hidden, hidden, at, resident, chosen),
                        HIDDEN_TALLEST):
                    out += self._hidden_buffers(hidden, at.tile_of(th), resident, k,
                                                objective, chosen, with_room)
        return out

    def _hidden_buffers(self, hidden: HiddenSearch, tile: Tile, resident: bool, k: int,
                        objective: Objective, chosen: tuple[Rule, ...], with_room: bool
                        ) -> list[Option]:
        """A hidden-chunk tile's options with one input buffer and, where a second fits
        and the inputs are not loaded again, with two."""
        work = self.at_batch(tile.n).work(tile, resident)
        out = []
        for db in (False, True) if not hidden.inputs_reloaded else (False,):
            if db and (hidden.physical(tile, resident, True, k)
                       or hidden.rule_violations(tile, resident, True, k, chosen)):
                continue
            cost = hidden.cost(tile, resident, db, k, work)
            mode = Mode.of(resident=resident, double_buffered=db, hidden_chunks=k,
                           inputs_reloaded=hidden.inputs_reloaded)
            out.append(self._option(objective, tile, mode, cost, with_room,
                                    partial(hidden.room, tile, resident, db, k)))
        return out

    def _pass_options(self, objective: Objective, rules: Iterable[Rule] | None,
                      with_room: bool) -> list[Option]:
        """Options of running the group in passes around its reductions (solver.passes),
        where it can and search.pooling_passes allows."""
        if not self.ruleset.search.pooling_passes or len(self.layers) < 3:
            return []
        chosen = self.chosen_rules(rules)
        whole = self.facts(Tile(1, 1, 1), True)
        out = []
        for held, maps in HOLDS:
            passes = PassSearch.of(self.graph, self.layers, self.chip, held, maps)
            if passes is None:
                if maps:  # the pooled maps come in from DRAM or leave the group
                    continue
                return []
            count = passes.split.count
            for th, db, k in passes.feasible(chosen, whole, self.ruleset.search.hidden_chunks):
                tile = passes.tile_of(th)
                cost = passes.cost(th, db, k)
                mode = Mode.of(double_buffered=db, passes=count, inputs_held=held,
                               hidden_chunks=k, maps_held=maps)
                out.append(self._option(objective, tile, mode, cost, with_room,
                                        partial(passes.room, th, db, k)))
        return out

    def _height_options(self, objective: Objective, rules: Iterable[Rule] | None,
                        with_room: bool = True) -> list[Option]:
        """Every feasible tile over every height, weight residency, buffering and halo mode.

        Capacities only shrink as tiles get shorter, so the heights that fit them form a
        range found by bisection; inside it every height is costed (cost is not monotone:
        short tiles of a strided 1x1 conv skip the rows it never reads) and checked against
        the other rules. The whole map (one tile) has no halo to reuse.
        """
        chosen = self.chosen_rules(rules)
        shrink = tuple(r for r in chosen if r.tile_trend == "shrink")
        rest = tuple(r for r in chosen if r.tile_trend != "shrink")
        every = self.heights()
        narrow = self.tile_of(1).w < anchor_extent(self.graph, self.io)[2]
        out: list[Option] = []
        for resident, reuse in ((True, False), (False, False), (True, True), (False, True)):
            heights = reuse_heights(self.graph, self.io, every, self.chip) if reuse else every
            if reuse and (not self.can_reuse()
                          or (len(heights) < 2 and not narrow)):
                continue
            if self.bands > 1 and not reuse:  # bands are strips of halo-reusing tiles
                continue
            # the full height is checked on its own: at full width it is the whole map
            # (small-map rules apply, nothing to reuse)
            full = (narrow or not reuse) and self.feasible(heights[0], resident, chosen, reuse)
            feasible = [heights[0]] if full else []
            top = first_passing(heights[1:], partial(self.fits_rules, resident=resident,
                                                     rules=shrink, halo_reuse=reuse))
            if top is not None:
                feasible += [th for th in heights[heights.index(top):]
                             if not rest or self.feasible(th, resident, rest, reuse, False)]
            # a second input buffer fits up to some height (capacities shrink with tiles)
            db_top = first_passing(feasible, partial(self.fits_double_buffer_at,
                                                     resident=resident, halo_reuse=reuse))
            for th in feasible:
                tile = self.tile_of(th)
                work = self.work(tile, resident, reuse)  # buffering changes only the time
                for db in (False, True):
                    if db and (db_top is None or th > db_top):
                        continue
                    cost = with_time(self.chip, work, db)
                    mode = Mode.of(resident=resident, double_buffered=db, halo_reuse=reuse)
                    out.append(self._option(objective, tile, mode, cost, with_room, partial(
                        self._room_at, tile, resident, db, reuse)))
        if self.bands == 1 and self.can_sweep_weights():
            out += self._sweep_options(objective, every, with_room)
        return out

    def _sweep_options(self, objective: Objective, heights: Sequence[int], with_room: bool
                       ) -> list[Option]:
        """Weights-outer options of a one-layer group: every height whose tile fits, with
        and without a second input buffer (no rules: a layer alone)."""
        out = []
        for th in heights:
            tile = self.tile_of(th)
            for db in (False, True):
                facts = self.facts(tile, False, db, weights_outer=True)
                if physical_violations(facts):
                    continue
                cost = self.quick_cost(tile, False, db, weights_outer=True)
                mode = Mode.of(resident=False, double_buffered=db, weights_outer=True)
                out.append(self._option(objective, tile, mode, cost, with_room,
                                        partial(prefetch_room, facts)))
        return out

    def search(self, how: str, rules: Iterable[Rule] | None = None) -> TileChoice | None:
        """Seed 000's tile searches (N first, then H): the largest batch split that fits."""
        for tn in self.batch_options():
            found = self.at_batch(tn)._search_height(how, rules)
            if found is not None:
                return found
        return None

    def _search_height(self, how: str, rules: Iterable[Rule] | None) -> TileChoice | None:
        """Halve the height until it fits (refining the ratio), or grow it until it would not."""
        chosen = self.chosen_rules(rules)
        heights = self.heights()
        low, high = heights[-1], heights[0]
        for resident in (True, False):
            fits = partial(self.feasible, resident=resident, rules=chosen)
            th = halve_to_fit(fits, low, high) if how == "large_to_small" \
                else grow_to_fit(fits, low, high)
            if th is not None:
                tile = self.tile_of(th)
                return self.choice(tile, Mode.of(
                    resident=resident,
                    double_buffered=self.fits_double_buffer(tile, resident)))
        return None


def _fits_hidden(hidden: HiddenSearch, search: GroupSearch, resident: bool, chunks: int,
                 th: int) -> bool:
    """The tile th rows tall fits the chip in `chunks` hidden chunks (single-buffered)."""
    return not hidden.physical(search.tile_of(th), resident, False, chunks)


def _fewest_hidden(hidden: HiddenSearch, search: GroupSearch, resident: bool,
                   rules: tuple[Rule, ...], th: int) -> int | None:
    """The fewest hidden chunks with which the tile th rows tall fits and passes `rules`."""
    return hidden.fewest_chunks(search.tile_of(th), resident, False, rules)
