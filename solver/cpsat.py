"""The CP-SAT planner: choose groups and tile heights together, with proof of optimality.

Candidates are intervals of the topological order (connected, up to the size
limit), whole blocks, and the greedy planner's groups, so the greedy plan is a
feasible warm start. One literal per candidate says it is selected; every layer
is covered exactly once. Each candidate has its tile variables (rules.encoding)
and the chip's capacities as linear constraints; every enabled rule encodes
itself, gated by the candidate's literal and the rule's own literal, which is
passed as an assumption so an infeasible model names the rules in conflict. Each
candidate's cost under the objective is stated by solver.cpsat_costs.
"""

from __future__ import annotations

import os
import select
import signal
import threading
import time
from collections.abc import Container, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # ortools (and the pandas it loads) only once CP-SAT runs
    from ortools.sat.python import cp_model


from fuseplan.hardware.chip import Chip
from fuseplan.planner.core.budget import Budget
from fuseplan.planner.core.errors import PlanningError
from fuseplan.planner.core.progress import Progress, ProgressSink, ticker
from fuseplan.planner.cost.model import (
    idle_dram_cycles,
    weight_bytes,
    weight_prefetch_cycles,
    weights_beside_maps,
)
from fuseplan.planner.cost.objective import Objective, cycle_units, objective_units
from fuseplan.planner.geometry.attention import attention_heads
from fuseplan.planner.geometry.regions import Tile
from fuseplan.planner.ir.graph import Graph
from fuseplan.planner.plan.placement import HaloMode, Placement, WeightResidency
from fuseplan.rules.base import GroupFacts
from fuseplan.rules.encoding import Candidate, Encoding
from fuseplan.rules.ruleset import RuleSet
from fuseplan.solver.capacity import prefetch_room
from fuseplan.solver.cpsat_costs import Timing, objective_expr, upper_bound
from fuseplan.solver.cpsat_watch import Watch
from fuseplan.solver.ends import EndSearch
from fuseplan.solver.groups import breaks_structure, connected_intervals, is_connected, is_convex
from fuseplan.solver.hidden import HiddenSearch
from fuseplan.solver.long_groups import long_groups
from fuseplan.solver.parallel import Context, Task, search_all
from fuseplan.solver.passes import PassSearch, passes_room
from fuseplan.solver.shortest_path import infeasible_layer_error
from fuseplan.solver.tiles import GroupSearch, Option, TileChoice

TRADE_OFFS = 4  # halo-reusing choices pinned per group under a cycles cap (Pareto sweeps)


@dataclass(frozen=True)
class CpsatResult:
    """Groups chosen by CP-SAT, with solver status and proof quality."""

    groups: list[Placement]
    status: str
    objective: float
    bound: float
    gap: float
    wall_s: float


def candidate_sets(graph: Graph, ruleset: RuleSet,
                   extra: Sequence[Sequence[str]] = ()) -> list[tuple[str, ...]]:
    """Intervals of the topological order, whole blocks and extra groups; connected, convex."""
    order = [lay.name for lay in graph.layers]
    limit = ruleset.search.max_group_layers
    seen: set[frozenset[str]] = set()
    out: list[tuple[str, ...]] = []

    def add(layers: Sequence[str]) -> None:
        key = frozenset(layers)
        if key in seen:
            return
        seen.add(key)
        if len(key) == 1 or (is_connected(graph, key) and is_convex(graph, key)):
            out.append(tuple(sorted(key, key=graph.index)))

    for i, j in sorted(connected_intervals(graph, limit)):  # convex: intervals of the order
        out.append(tuple(order[i:j]))
        seen.add(frozenset(order[i:j]))
    for block in graph.blocks:
        if graph.within_limit(block.layers, limit):
            add(block.layers)
            if block.entry:
                add((block.entry, *block.layers))
    for g in extra:
        add(g)
    return out


def faster_buffering(graph: Graph, chip: Chip, ruleset: RuleSet, p: Placement) -> Placement:
    """The placement with the faster input buffering (single where both are as fast), for
    objectives its bytes do not depend on."""
    if p.mode.pinned:  # took the faster
        return p
    search = GroupSearch.of(graph, p.layers, chip, ruleset)
    options = [False] + [True] * search.fits_double_buffer(p.tile, p.weights_resident,
                                                           p.halo_reuse, p.weights_outer)
    db = min(options, key=lambda o: search.quick_cost(p.tile, p.weights_resident, o,
                                                      p.halo_reuse, p.weights_outer).cycles)
    return replace(p, mode=replace(p.mode, double_buffered=db))


def intervals_only(graph: Graph, ruleset: RuleSet, extra: Sequence[Sequence[str]] = (),
                   searched: Container[tuple[str, ...]] | None = None) -> bool:
    """Whether every candidate group CP-SAT would weigh is an interval of the layer order
    (whole blocks and `extra` groups included) and, given what the shortest path
    ``searched`` (and the `extra` groups, its plan's), one it weighed too (a block with its
    entry layer can be one layer longer than search.max_group_layers): the shortest path
    over intervals, with the same best tile per group, is then exact wherever costs add
    up."""
    chosen = {tuple(sorted(g, key=graph.index)) for g in extra}  # the path's own groups
    for layers in candidate_sets(graph, ruleset, extra):
        at = sorted(graph.index(n) for n in layers)
        if at[-1] - at[0] + 1 != len(at):
            return False
        if searched is not None and len(layers) > 1 and layers not in searched \
                and layers not in chosen:
            return False
    return True


def _physical(enc: Encoding, cand: Candidate, room: Any = 0) -> None:
    """Capacities every group obeys, fused or not (bounds, as solver.capacity.physical_violations).

    A double-buffered candidate also holds a second copy of its input boxes; ``room`` is the
    next group's weights when they prefetch while this one runs (solver.capacity.prefetch_room:
    in WRAM on chips with one, else in SRAM). Streamed weights hold each step's chunks
    (planner.cost.weight_stream) in WRAM, or in SRAM beside that step's maps.
    """
    m, chip = enc.model, enc.chip
    weights = enc.weight_bytes(cand)
    prefetch = enc.in_bytes(cand)
    steps = enc.live_steps_bytes(cand)
    staged = enc.staged_steps(cand)
    stage = max(staged, default=0)
    if cand.in_hidden_chunks and attention_heads(enc.graph, cand.io) is None:
        # a pinned tile run in hidden chunks: its exact peak over every step and chunk,
        # second buffer and (single-memory chips) streamed weights included; the most
        # weight bytes its stream holds at once
        hidden = HiddenSearch.of(enc.graph, cand.layers, chip, (cand.io, cand.chains),
                                 reload=cand.inputs_reloaded)
        assert cand.exact_peak is not None and hidden is not None
        stage = hidden.weights_on_chip(False, cand.hidden_chunks)
        steps, prefetch, staged = [cand.exact_peak], 0, ()
    elif cand.in_end_chunks:  # the same, for a pinned tile with its ends in chunks
        ends = EndSearch.of(enc.graph, cand.io, cand.chains, chip)
        assert cand.exact_peak is not None and ends is not None
        stage = ends.weights_on_chip(False, cand.end_chunks)
        steps, prefetch, staged = [cand.exact_peak], 0, ()
    elif cand.exact_peak is not None:
        # a pinned tile run in passes (or a fused attention in head chunks): its exact peak
        # over every pass, chunk and tail, second buffer included; its weights are resident
        steps, prefetch, staged = [cand.exact_peak], 0, ()
    elif cand.fixed is not None and cand.facts_any_tile.halo_reuse:
        # a pinned halo-reusing tile: its exact peak, second buffer included (its cost's,
        # less the weights beside the maps: computed once, by the tile search); it reserves
        # the largest streamed pair for all its steps
        f = cand.facts_any_tile
        maps = cand.fixed.sram_peak_bytes - weights_beside_maps(enc.graph, cand.io, chip,
                                                                 f.weights_resident)
        steps, prefetch, staged = [maps], 0, (stage,)
    elif cand.fixed is not None and cand.facts_any_tile.weights_outer:
        # a pinned weights-outer tile holds its inputs and one chunk's slice of the output
        steps, staged = [cand.facts_any_tile.live_peak_bytes], (stage,)
    streamed = 1 - cand.resident
    if chip.wram is not None and not isinstance(room, int):
        enc.enforce(m.add(weights * cand.resident + stage * streamed + room
                          <= chip.wram.bytes * chip.cores_per_cluster), cand)
    sram_room = room if chip.wram is None else 0
    for i, step in enumerate(steps):
        onchip = weights * cand.resident + (staged[i] if staged else 0) * streamed \
            if chip.unified else 0
        sram = step + onchip + sram_room
        enc.enforce(m.add(sram <= chip.sram.bytes), cand)
        enc.enforce(m.add(sram + prefetch <= chip.sram.bytes), cand, cand.double_buffered)
        if chip.nram is not None:  # ceil(step / cores) <= NRAM
            cap = chip.nram.bytes * chip.cores_per_cluster
            enc.enforce(m.add(step <= cap), cand)
            enc.enforce(m.add(step + prefetch <= cap), cand, cand.double_buffered)
    if chip.wram is not None and -(-weights // chip.cores_per_cluster) > chip.wram.bytes:
        m.add_implication(cand.selected, cand.resident.Not())
    if chip.wram is not None and -(-stage // chip.cores_per_cluster) > chip.wram.bytes:
        m.add_implication(cand.selected, cand.resident)


def _forbid_broken(enc: Encoding, cand: Candidate, ruleset: RuleSet) -> None:
    """The rules of a pinned tile run in passes or hidden chunks, checked in Python as
    solver.passes and solver.hidden check them (passes: structural rules on the whole
    group, tile rules on each pass or the whole group, Rule.in_passes; hidden chunks: every
    rule on the group with its hidden maps a chunk wide): a rule it breaks forbids it while
    that rule's literal holds, as a structural rule's encoding does."""
    f = cand.facts_any_tile
    if cand.in_end_chunks:
        ends = EndSearch.of(enc.graph, cand.io, cand.chains, enc.chip)
        assert ends is not None  # pinned with end chunks, so it has ends
        broken = [r for r in ruleset.enabled if ends.rule_violations(
            f.tile, f.weights_resident, cand.end_chunks, (r,))]
    elif cand.in_hidden_chunks:
        hidden = HiddenSearch.of(enc.graph, cand.layers, enc.chip, (cand.io, cand.chains),
                                 reload=cand.inputs_reloaded)
        assert hidden is not None  # pinned in hidden chunks, so it has a stretch
        broken = [r for r in ruleset.enabled if hidden.rule_violations(
            f.tile, f.weights_resident, f.double_buffered, cand.hidden_chunks, (r,))]
    else:
        passes = PassSearch.of(enc.graph, cand.layers, enc.chip, cand.inputs_held,
                               cand.maps_held)
        assert passes is not None  # pinned in passes, so it can run so
        whole = GroupFacts(enc.graph, cand.io, cand.chains, Tile(1, 1, 1), enc.chip)
        broken = [r for r in ruleset.enabled
                  if passes.rule_violations(f.tile.h, f.double_buffered, (r,), whole,
                                            cand.hidden_chunks)]
    for r in broken:
        enc.model.add_bool_or([cand.selected.Not(), enc.rule_lits[r.key].Not()])


def build_model(graph: Graph, chip: Chip, ruleset: RuleSet, objective: Objective,
                candidates: Sequence[Sequence[str]],
                floors: Sequence[int] | None = None, cycles_cap: int | None = None,
                fixed: Sequence[TileChoice | None] | None = None,
                options: Mapping[tuple[str, ...], Sequence[Option]] | None = None
                ) -> tuple[Encoding, dict[str, Any]]:
    """The CP-SAT model over the candidates; returns it with the rule literals by key.

    ``floors`` (one per candidate, optional) are lower bounds on each candidate's cost
    (its best tile's cost from the same closed forms); they are valid cuts that tighten the
    LP relaxation to the set-partitioning bound and do not change the optimum.
    ``cycles_cap`` bounds the plan's total cycles (the epsilon constraint of a Pareto sweep).
    ``options`` (solver.tiles.GroupSearch.options by layers, optional) bound what each pair
    of consecutive groups can save by prefetching, which tightens the LP relaxation.
    """
    enc = Encoding(graph, chip)
    m = enc.model
    rule_lits = {r.key: m.new_bool_var(f"rule_{r.code}_{r.key}") for r in ruleset.enabled}
    enc.rule_lits.update(rule_lits)
    cover: dict[str, list[Any]] = {lay.name: [] for lay in graph.layers}
    cands = [enc.add_candidate(layers, fixed[k] if fixed is not None else None)
             for k, layers in enumerate(candidates)]
    coef = cycle_units(objective, ruleset.objective, chip)
    pairs = _prefetch_pairs(graph, chip, cands, options or {}) \
        if objective.timed and (coef or cycles_cap is not None) else {}
    rooms = {a: m.new_int_var(0, max(enc.weight_bytes(cands[b]) for b, _ in bs),
                              f"prefetch_room_{a}") for a, bs in pairs.items()}
    costs, excesses = [], []
    capped: list[Any] = []
    timings: dict[int, Timing] = {}
    for k, cand in enumerate(cands):
        for name in cand.layers:
            cover[name].append(cand.selected)
        cost, timing = _encode_candidate(enc, cand, ruleset, objective, rooms.get(k, 0))
        if timing is not None:
            timings[k] = timing
        if cycles_cap is not None:
            capped.append(_cycles_paid(enc, cand, timing))
        floor = floors[k] if floors is not None else 0
        excess = _excess(enc, cand, cost, floor)
        costs.append(excess + floor * cand.selected)
        excesses.append(excess)
    hidden_after = _encode_prefetch(enc, cands, pairs, rooms, timings)
    hidden = [h for hs in hidden_after.values() for h in hs]
    if coef and floors is not None:
        _net_floor_cuts(enc, cands, objective, ruleset, options or {}, pairs, hidden_after,
                        floors, excesses, coef)
    # every layer in exactly one selected group
    for lits in cover.values():
        m.add_exactly_one(lits)
    if cycles_cap is not None:
        m.add(sum(capped) - sum(hidden) <= cycles_cap)
    m.minimize(sum(costs) - coef * sum(hidden))
    return enc, rule_lits


def _encode_candidate(enc: Encoding, cand: Candidate, ruleset: RuleSet, objective: Objective,
                      room: Any) -> tuple[Any, Timing | None]:
    """A candidate's capacities and rules in the model; returns its cost under the objective
    and its timing (None: the objective is not timed)."""
    _physical(enc, cand, room)
    if cand.fused and (cand.in_passes or cand.in_hidden_chunks or cand.in_end_chunks):
        _forbid_broken(enc, cand, ruleset)
    elif cand.fused:
        for r in ruleset.enabled:
            r.encode(enc, cand)
    return objective_expr(enc, cand, objective, ruleset)


def _cycles_paid(enc: Encoding, cand: Candidate, timing: Timing | None) -> Any:
    """The cycles a candidate adds to a capped plan's total: its own once selected."""
    if timing is None:
        raise ValueError("a cycles cap needs the latency, energy or weighted objective")
    spent = enc.model.new_int_var(0, upper_bound(timing.cycles), f"cycles_paid_{cand.index}")
    enc.model.add(spent >= timing.cycles).only_enforce_if(cand.selected)
    return spent


def _excess(enc: Encoding, cand: Candidate, cost: Any, floor: int) -> Any:
    """The excess of a selected candidate's cost over its floor (0 unselected)."""
    m = enc.model
    # a selected candidate pays its floor (a lower bound of its cost) plus the excess of
    # its actual cost over it; with the floor outside the enforced constraint, the LP
    # relaxation is the set-partitioning bound
    excess = m.new_int_var(0, max(0, upper_bound(cost) - floor), f"excess_{cand.index}")
    m.add(excess >= cost - floor).only_enforce_if(cand.selected)
    m.add(excess == 0).only_enforce_if(cand.selected.Not())
    return excess


def _net_floor_cuts(enc: Encoding, cands: Sequence[Candidate], objective: Objective,
                    ruleset: RuleSet, options: Mapping[tuple[str, ...], Sequence[Option]],
                    pairs: dict[int, list[tuple[int, int]]],
                    hidden_after: dict[int, list[Any]], floors: Sequence[int],
                    excesses: Sequence[Any], coef: int) -> None:
    """Bound what each group hides by its floor net of what its options can hide."""
    # what a group hides cannot take its cost below its cheapest option's net of the
    # most that option can hide: a valid cut that keeps the LP relaxation from pairing
    # a group's floor (its best option) with the idle time of a slow one
    for a, hs in hidden_after.items():
        net = _net_floor(enc, cands[a], objective, ruleset, options,
                         max(most for _, most in pairs[a]), coef)
        if net is not None:
            enc.model.add(coef * sum(hs) <= (floors[a] - net) * cands[a].selected + excesses[a])


def _prefetch_pairs(graph: Graph, chip: Chip, cands: Sequence[Candidate],
                    options: Mapping[tuple[str, ...], Sequence[Option]]
                    ) -> dict[int, list[tuple[int, int]]]:
    """Candidates whose successor may prefetch its weights behind them, with the most the
    pair can save: both intervals of the topological order, the second starting right after
    the first (planner.app.assemble.prefetch_eligible), and a saving possible at some tile of the
    first (its options, when known; else the second's weight load time)."""
    spans = [(min(map(graph.index, c.layers)), max(map(graph.index, c.layers))) for c in cands]
    interval = [b - a + 1 == len(c.layers) for (a, b), c in zip(spans, cands, strict=True)]
    starting: dict[int, list[int]] = {}
    for k, cand in enumerate(cands):
        w = weight_bytes(graph, cand.io.weights, chip)
        # a pinned split's weights are shares spread over the clusters: not prefetched
        if interval[k] and weight_prefetch_cycles(chip, w) > 0 and cand.mode.prefetchable:
            starting.setdefault(spans[k][0], []).append(k)
    pairs: dict[int, list[tuple[int, int]]] = {}
    for a, cand in enumerate(cands):
        if not interval[a] or spans[a][1] + 1 not in starting:
            continue
        for b in starting[spans[a][1] + 1]:
            w = weight_bytes(graph, cands[b].io.weights, chip)
            # less what the second hides behind its own loads (a free one: _encode_prefetch)
            most = weight_prefetch_cycles(chip, w) - getattr(cands[b].fixed, "overlap_cycles", 0)
            if cand.fixed is not None:  # a pinned choice: its idle time and room are known
                facts = cand.facts_any_tile
                most = min(most, idle_dram_cycles(chip, cand.fixed, facts.double_buffered)) \
                    if _pinned_room(graph, chip, cand) >= w else 0
            elif cand.layers in options:
                most = max((min(o.idle, most) for o in options[cand.layers] if o.room >= w),
                           default=0)
            if most > 0:
                pairs.setdefault(a, []).append((b, most))
    return pairs


def _pinned_room(graph: Graph, chip: Chip, cand: Candidate) -> int:
    """Bytes a pinned candidate leaves for the next group's weights (solver.tiles.
    prefetch_room; a tile run in passes from its exact peak, solver.passes.passes_room)."""
    f = cand.facts_any_tile
    if cand.in_hidden_chunks and attention_heads(graph, cand.io) is None:
        hidden = HiddenSearch.of(graph, cand.layers, chip, (cand.io, cand.chains),
                                 reload=cand.inputs_reloaded)
        assert hidden is not None
        return hidden.room(f.tile, f.weights_resident, f.double_buffered, cand.hidden_chunks)
    if cand.in_end_chunks:
        ends = EndSearch.of(graph, cand.io, cand.chains, chip)
        assert ends is not None
        return ends.room(f.tile, f.weights_resident, cand.end_chunks)
    if cand.exact_peak is None:
        return prefetch_room(f)
    return passes_room(chip, cand.exact_peak, weight_bytes(graph, cand.io.weights, chip))


def _encode_prefetch(enc: Encoding, cands: Sequence[Candidate],
                     pairs: dict[int, list[tuple[int, int]]],
                     rooms: dict[int, Any], timings: dict[int, Timing]) -> dict[int, list[Any]]:
    """Cycles each selected pair hides (planner.cost.model.prefetch_cycles): at most the
    second's weight load time and the first's DRAM idle time, its weights in the first's
    room, no selected group spanning the first (so the second runs right after)."""
    m, graph, chip = enc.model, enc.graph, enc.chip
    spans = [(min(map(graph.index, c.layers)), max(map(graph.index, c.layers))) for c in cands]
    hidden: dict[int, list[Any]] = {}
    before: dict[int, list[Any]] = {}  # pair literals by second group
    for a, bs in pairs.items():
        ta, first = timings[a], cands[a]
        if ta.ring is not None:  # its ring takes the room
            m.add(rooms[a] <= 0).only_enforce_if(ta.ring)
        spanning = [c for c, (c0, c1) in enumerate(spans) if c0 < spans[a][0] and c1 >
                    spans[a][1] and c1 - c0 + 1 != len(cands[c].layers)]
        after: list[Any] = []
        for b, cap in bs:
            w = enc.weight_bytes(cands[b])
            pair = m.new_bool_var(f"prefetch_{a}_{b}")
            h = m.new_int_var(0, cap, f"prefetch_cycles_{a}_{b}")
            m.add_implication(pair, first.selected)
            m.add_implication(pair, cands[b].selected)
            # only weights that all load with the second's first tile are taken ahead
            m.add(cands[b].resident == 1).only_enforce_if(pair)
            m.add(h <= cap * pair)  # nor what the second's one tile hides of its own loads:
            m.add(h + timings[b].overlap <= weight_prefetch_cycles(chip, w)).only_enforce_if(pair)
            m.add(h <= ta.cycles - ta.busy_double_buffered).only_enforce_if(
                [pair, first.double_buffered])
            m.add(h <= ta.cycles - ta.busy_serial).only_enforce_if(
                [pair, first.double_buffered.Not()])
            m.add(rooms[a] >= w).only_enforce_if(pair)
            for c in spanning:
                m.add_implication(pair, cands[c].selected.Not())
            hidden.setdefault(a, []).append(h)
            after.append(pair)
            before.setdefault(b, []).append(pair)
        # one successor: implied by the cover, stated for the LP relaxation's sake
        m.add(sum(after) <= first.selected)
    for b, lits in before.items():
        m.add(sum(lits) <= cands[b].selected)
    return hidden


def _net_floor(enc: Encoding, cand: Candidate, objective: Objective, ruleset: RuleSet,
               options: Mapping[tuple[str, ...], Sequence[Option]], most: int, coef: int
               ) -> int | None:
    """A lower bound on a candidate's cost minus what it can hide (at most `most` cycles,
    worth `coef` each), None when its options are not known: over its options (those the
    search keeps beat every other one on rank, idle time and room together)."""
    if cand.fixed is not None:
        return objective_units(cand.fixed, objective, ruleset.objective, enc.chip) - coef * most
    known = options.get(cand.layers)
    if not known:
        return None
    return min(int(o.rank[0]) - coef * min(o.idle, most) for o in known)


def _hint(enc: Encoding, warm: Sequence[Placement]) -> None:
    """Warm start from another planner's placements: groups, tiles, weight residency and
    buffering."""
    chosen = {frozenset(p.layers): p for p in warm}
    for cand in enc.candidates:
        key = frozenset(cand.layers)
        picked = chosen.get(key)
        match = picked is not None and _describes(cand, picked)
        enc.model.add_hint(cand.selected, match)
        if picked is None or not match:
            continue
        del chosen[key]  # a group's alternatives: hint the one that describes the choice
        if not isinstance(cand.th, int):
            enc.model.add_hint(cand.th, picked.tile.h)
        if not isinstance(cand.tn, int):
            enc.model.add_hint(cand.tn, picked.tile.n)
        if cand.fixed is None:
            enc.model.add_hint(cand.resident, picked.weights_resident)
            enc.model.add_hint(cand.double_buffered, picked.double_buffered)


def _describes(cand: Candidate, picked: Placement) -> bool:
    """Whether a candidate can take a warm-start placement: a pinned candidate the very
    choice, the tile variables any full-width tile that recomputes its halos."""
    if cand.fixed is None:
        return not (picked.halo_reuse or picked.tile.w < cand.extent[2] or picked.weights_outer
                    or picked.mode.pinned)
    return (cand.facts_any_tile.tile, cand.mode) == (picked.tile, picked.mode)


def solve_interruptibly(solver: cp_model.CpSolver, model: cp_model.CpModel,
                        callback: cp_model.CpSolverSolutionCallback | None = None) -> Any:
    """`solver.solve(model)`, stopped promptly by Ctrl-C, which then raises
    KeyboardInterrupt: the cut-short result is never returned, so it cannot pass for a plan.

    CP-SAT's own SIGINT handling would end the search as if its time limit had come and
    hand back that FEASIBLE solution, and Python's handler cannot run while the solve holds
    the main thread. So Python's signal wakeup fd wakes a watcher thread, which stops the
    search; Python raises the KeyboardInterrupt as soon as the solve returns.
    """
    solver.parameters.catch_sigint_signal = False
    if threading.current_thread() is not threading.main_thread():
        return solver.solve(model, callback)  # signals reach the main thread only
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    previous = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    finished, interrupted = threading.Event(), threading.Event()

    def watch() -> None:
        while not finished.is_set():
            if select.select([read_fd], [], [], 0.1)[0]:
                if signal.SIGINT in os.read(read_fd, 64):
                    interrupted.set()
                    solver.stop_search()
                    return

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        status = solver.solve(model, callback)
        if interrupted.is_set():
            raise KeyboardInterrupt
        return status
    finally:
        finished.set()
        # restore the handler's fd first: a second Ctrl-C while the watcher winds down must
        # not leave this process writing its signals into a closed private pipe
        try:
            signal.set_wakeup_fd(previous)
        finally:
            watcher.join()
            os.close(read_fd)
            os.close(write_fd)


def _complete_hint(enc: Encoding, seconds: float, seed: int) -> None:
    """Turn the partial warm start into a whole assignment: solve once with the hinted
    variables fixed (the rest, prefetch pairs included, mostly follows by propagation) and
    hint every variable with that solution. From a partial hint the search may wander off
    the warm plan; from a whole one it starts there."""
    from ortools.sat.python import cp_model

    probe = cp_model.CpSolver()
    probe.parameters.fix_variables_to_their_hinted_value = True
    probe.parameters.max_time_in_seconds = seconds
    probe.parameters.num_workers = 1
    probe.parameters.random_seed = seed
    if solve_interruptibly(probe, enc.model) not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return
    m = enc.model
    values = [probe.value(m.get_int_var_from_proto_index(i))
              for i in range(len(m.proto.variables))]
    m.clear_hints()
    for i, v in enumerate(values):
        m.add_hint(m.get_int_var_from_proto_index(i), v)


def _alternatives(search: GroupSearch, best: TileChoice, warm: TileChoice | None,
                  objective: Objective, ruleset: RuleSet, cycles_cap: int | None,
                  prefetch_options: Mapping[tuple[str, ...], Sequence[Option]] | None,
                  trade_offs: dict[tuple[str, ...], list[TileChoice]]
                  ) -> list[TileChoice | None]:
    """A group's candidates: None for its tile variables (full-width tiles that recompute
    their halos), and pinned choices the variables do not describe.

    Rows without a closed form have only pinned tiles (enumerated costs): the best one. With
    closed forms, the search's best halo-reusing or 2-D tile is pinned too: in place of the
    variables when group costs only add up (the best tile of each group is all an optimal
    plan needs; a duplicate would only weaken the LP bound), beside them when next-group
    prefetch couples neighbours (with the options a prefetch may prefer) or under a cycles
    cap (with the choices that trade time for the objective). A warm start's choice that no
    candidate describes is pinned as well, so that the warm plan is a solution of the model
    (under a cycles cap, the only one known). ``trade_offs`` memoizes each group's front
    across the capped solves of one sweep.
    """
    full_width = search.tile_of(1).w

    def special(c: TileChoice | None) -> bool:
        return c is not None and (c.halo_reuse or c.tile.w < full_width or c.weights_outer
                                  or c.mode.pinned)

    alts: list[TileChoice | None]
    if not search.closed_form:
        alts = [best]
    else:
        extra = [best]
        most = 3  # pinned alternatives per group: each one grows the model
        if cycles_cap is not None and objective != Objective.LATENCY:
            if search.layers not in trade_offs:
                trade_offs[search.layers] = search.trade_offs(objective, TRADE_OFFS)
            extra += trade_offs[search.layers]
            most += TRADE_OFFS
        if prefetch_options and search.layers in prefetch_options:
            extra += [search.option_choice(o) for o in prefetch_options[search.layers]]
        pins = [c for c in dict.fromkeys(extra) if special(c)][:most]
        additive = not cycle_units(objective, ruleset.objective, search.chip) \
            and cycles_cap is None
        alts = [*pins] if pins and additive and special(best) else [None, *pins]
    if warm is not None and warm not in alts and (special(warm) or None not in alts):
        alts.append(warm)  # the warm start's own choice, when no candidate describes it
    return alts


def solve_cpsat(graph: Graph, chip: Chip, ruleset: RuleSet, objective: Objective,
                warm: Sequence[Placement] = (),
                time_limit_s: float | None = None, cycles_cap: int | None = None,
                memo: dict[tuple[str, ...], Any] | None = None,
                prefetch_options: Mapping[tuple[str, ...], Sequence[Option]] | None = None,
                trade_offs: dict[tuple[str, ...], list[TileChoice]] | None = None,
                budget: Budget | None = None, jobs: int = 1,
                whole_maps: dict[str, Any] | None = None,
                progress: ProgressSink | None = None) -> CpsatResult:
    """Optimal groups and tiles under the rules (or the best found within the time limit).

    ``warm``: another planner's placements, as hints;
    ``trade_offs``: each group's reusing trade-off front under a cycles cap, kept across the
    capped solves of a Pareto sweep (filled here);
    ``budget``: the command's time limit: once it has passed no new group is searched, and
    the solve stops in time for the plan to be assembled (reserve_s); ``jobs``: processes
    the tile searches run on (solver.parallel); ``whole_maps``: the whole-map groups the
    shortest path found on this graph and objective (solver.long_groups); ``progress``:
    told of the searches and of each better solution with CP-SAT's bound (Watch)."""
    from ortools.sat.python import cp_model

    started = time.perf_counter()
    budget = Budget() if budget is None else budget
    memo = {} if memo is None else memo
    trade_offs = {} if trade_offs is None else trade_offs
    _check_layers_fit(graph, chip, ruleset, objective, memo)
    kept = _kept_searches(graph, chip, ruleset, warm, memo)
    unsearched = _search_new(Context(graph, chip, ruleset, objective, False, budget.until),
                             kept, memo, jobs, progress)
    weighed = _Weighed()
    started_from = {frozenset(p.layers): p for p in warm}
    for layers, search in kept:
        best = memo.get(layers)
        if best is None:  # not searched (past the budget), or no tile passes
            continue
        floor = objective_units(best.cost, objective, ruleset.objective, chip)
        w = started_from.get(frozenset(layers))
        warm_choice = None if w is None else search.choice(w.tile, w.mode)
        for choice in _alternatives(search, best, warm_choice, objective, ruleset,
                                    cycles_cap, prefetch_options, trade_offs):
            weighed.add(layers, floor, choice)  # a bound for every alternative
    if unsearched:
        budget.cut(f"CP-SAT: {unsearched} block candidates not searched")
    # the shortest path noted the cut once the budget has passed
    longer = {} if budget.passed else long_groups(graph, chip, ruleset, objective, budget,
                                                  memo, jobs, whole_maps, progress)
    for layers, choice in longer.items():
        # block and whole-map groups past the size limit, pinned
        weighed.add(layers, objective_units(choice.cost, objective, ruleset.objective, chip),
                    choice)
    if progress is not None:
        progress(Progress("CP-SAT model", searched=len(weighed.layers)))
    enc, rule_lits = build_model(graph, chip, ruleset, objective, weighed.layers,
                                 weighed.floors, cycles_cap, weighed.pinned, prefetch_options)
    watch = None if progress is None else Watch(
        progress, "B" if objective is Objective.TRAFFIC else objective.value, len(weighed.layers))
    solver, status = _solve(enc, rule_lits, ruleset, warm, time_limit_s, budget, watch)
    groups = _read_groups(enc, solver, graph, chip, ruleset, objective)
    # CP-SAT reports its integer objective through a float scaling (13044 came back as
    # 13043.999999999998): snap values within rounding error to the integer they are
    obj, bound = (_snap(v) for v in (solver.objective_value, solver.best_objective_bound))
    gap = 0.0 if status == cp_model.OPTIMAL else abs(obj - bound) / max(abs(obj), 1.0)
    return CpsatResult(groups, solver.status_name(status), obj, bound, gap,
                       time.perf_counter() - started)


@dataclass
class _Weighed:
    """The candidates CP-SAT weighs: each one's layers, cost floor and pinned choice (None:
    its tile variables)."""

    layers: list[tuple[str, ...]] = field(default_factory=list)
    floors: list[int] = field(default_factory=list)
    pinned: list[TileChoice | None] = field(default_factory=list)

    def add(self, layers: tuple[str, ...], floor: int, choice: TileChoice | None) -> None:
        """One more candidate."""
        self.layers.append(layers)
        self.floors.append(floor)
        self.pinned.append(choice)


def _check_layers_fit(graph: Graph, chip: Chip, ruleset: RuleSet, objective: Objective,
                      memo: dict[tuple[str, ...], Any]) -> None:
    """Raise for the first layer that fits at no tile (every plan would be infeasible);
    the memo keeps each layer's best tile."""
    for lay in graph.layers:  # a layer that fits at no tile makes every plan infeasible
        alone = (lay.name,)
        if alone not in memo:
            memo[alone] = GroupSearch.of(graph, alone, chip, ruleset).best(objective)
        if memo[alone] is None:
            raise infeasible_layer_error(graph, chip, ruleset, lay.name)


def _kept_searches(graph: Graph, chip: Chip, ruleset: RuleSet, warm: Sequence[Placement],
                   memo: dict[tuple[str, ...], Any]) -> list[tuple[tuple[str, ...], GroupSearch]]:
    """The candidate groups worth weighing, each with its search: neither known to have no
    tile nor breaking a structural rule."""
    kept: list[tuple[tuple[str, ...], GroupSearch]] = []
    for layers in candidate_sets(graph, ruleset, [p.layers for p in warm]):
        if layers in memo and memo[layers] is None:  # no tile passes, or it cuts a block
            continue
        search = GroupSearch.of(graph, layers, chip, ruleset)
        # with every rule literal true, structurally invalid or unfittable groups can never be
        # chosen: leave them out rather than let presolve find that out for each
        if not breaks_structure(search, ruleset):
            kept.append((layers, search))
    return kept


def _search_new(ctx: Context, kept: Sequence[tuple[tuple[str, ...], GroupSearch]],
                memo: dict[tuple[str, ...], Any], jobs: int,
                progress: ProgressSink | None = None) -> int:
    """Search the kept groups the memo lacks, into the memo; returns how many the budget
    left unsearched."""
    # blocks and warm-start groups that are not intervals: searched here, on up to `jobs`
    # processes (past the budget, left out)
    new = [layers for layers, _ in kept if layers not in memo]
    unsearched = 0
    tick = ticker(progress, "CP-SAT candidates", len(new), searches=True) if new else None
    for layers, found in zip(new, search_all(ctx, [Task(g) for g in new], jobs, tick=tick),
                             strict=True):
        if found is None:
            unsearched += 1
        else:
            memo[layers] = found.best
    return unsearched


def _solve(enc: Encoding, rule_lits: dict[str, Any], ruleset: RuleSet,
           warm: Sequence[Placement], time_limit_s: float | None, budget: Budget,
           watch: Watch | None = None) -> tuple[cp_model.CpSolver, Any]:
    """Solve the model from the warm start within the time limit (and what the budget
    leaves); returns the solver and a status with a plan, else raises. ``watch``: told of
    each better solution and bound (progress)."""
    from ortools.sat.python import cp_model

    _hint(enc, warm)
    limit = time_limit_s or ruleset.search.time_limit_s
    left = budget.left()
    if warm:
        if watch is not None:
            watch.sink(Progress("CP-SAT warm start", searched=watch.candidates))
        probe = max(limit / 10, 5.0)
        _complete_hint(enc, probe if left is None else min(probe, left / 10),
                       ruleset.search.seed)
    if left is not None:  # what the command has left, less the plan's assembly
        limit = max(0.05, min(limit, budget.left() - reserve_s(budget)))  # type: ignore[operator]
    solver = cp_model.CpSolver()
    p = solver.parameters
    p.max_time_in_seconds = limit
    p.num_workers = ruleset.search.workers
    p.random_seed = ruleset.search.seed
    p.relative_gap_limit = ruleset.search.relative_gap
    enc.model.add_assumptions(list(rule_lits.values()))
    if watch is not None:
        watch.sink(Progress("CP-SAT", searched=watch.candidates, unit=watch.unit))
        solver.best_bound_callback = watch.on_bound
    status = solve_interruptibly(solver, enc.model, None if watch is None else watch.callback())
    name = solver.status_name(status)
    if status == cp_model.INFEASIBLE:
        core = solver.sufficient_assumptions_for_infeasibility()
        keys = [k for k, lit in rule_lits.items() if lit.Index() in core]
        raise PlanningError(f"no plan satisfies the rules together: {', '.join(keys) or '?'} "
                            "conflict. Relax or disable one of them in the rules YAML.")
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        raise PlanningError(f"CP-SAT found no plan within {p.max_time_in_seconds:g} s "
                            f"(status {name}). Raise --time-limit or lower "
                            "search.max_group_layers.")
    return solver, status


def _read_groups(enc: Encoding, solver: cp_model.CpSolver, graph: Graph, chip: Chip,
                 ruleset: RuleSet, objective: Objective) -> list[Placement]:
    """The selected candidates as placements, with the tiles and modes the solver chose."""
    groups = []
    for cand in enc.candidates:
        if solver.boolean_value(cand.selected):
            placement = _placement(solver, cand)
            groups.append(placement if objective.timed
                          else faster_buffering(graph, chip, ruleset, placement))
    return groups


def _placement(solver: cp_model.CpSolver, cand: Candidate) -> Placement:
    """A selected candidate's placement in the solution."""
    th = cand.th if isinstance(cand.th, int) else solver.value(cand.th)
    tn = cand.tn if isinstance(cand.tn, int) else solver.value(cand.tn)
    tile = cand.facts_any_tile.tile if cand.fixed is not None \
        else Tile(tn, th, cand.extent[2])
    # a pinned candidate's mode is its own; a free one's residency, buffering and
    # halo mode are what the solver chose
    mode = replace(cand.mode,
                   weights=WeightResidency.of(solver.boolean_value(cand.resident)),
                   double_buffered=bool(solver.boolean_value(cand.double_buffered)),
                   halo=HaloMode.of(solver.boolean_value(cand.halo_reuse)))
    return Placement(cand.layers, tile, mode)


def reserve_s(budget: Budget) -> float:
    """Seconds a time-limited solve keeps after CP-SAT stops, to read its groups back:
    0.2 s and a twentieth of what was left (the budget has set the plan's assembly aside)."""
    left = budget.left()
    return 0.0 if left is None else 0.2 + max(left, 0.0) / 20


def _snap(value: float) -> float:
    """`value`, or the integer it differs from by rounding error only."""
    near = round(value)
    return float(near) if abs(value - near) <= 1e-9 * max(1.0, abs(value)) else value
