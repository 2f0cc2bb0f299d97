"""The CP-SAT planner: choose groups and tile heights together, with proof of optimality.

Candidates are intervals of the topological order (connected, up to the size
limit), whole blocks, and the greedy planner's groups, so the greedy plan is a
feasible warm start. One literal per candidate says it is selected; every layer
is covered exactly once. Each candidate has its tile variables (solver.encoding)
and the chip's capacities as linear constraints; every enabled rule encodes
itself, gated by the candidate's literal and the rule's own literal, which is
passed as an assumption so an infeasible model names the rules in conflict.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ortools.sat.python import cp_model

from hardware.chip import Chip
from planner.cost import dram_bytes_per_cycle, group_tensors, in_group_uses
from planner.errors import PlanningError
from planner.ir import Graph
from planner.regions import Tile
from rules.ruleset import RuleSet
from solver.encoding import Candidate, Encoding
from solver.groups import is_connected, is_convex
from solver.shortest_path import breaks_structure, infeasible_layer_error
from solver.tiles import ENERGY_SCALE, GroupSearch, energy_coefficients, objective_units


@dataclass(frozen=True)
class CpsatResult:
    """Groups chosen by CP-SAT, with solver status and proof quality."""

    groups: list[tuple[tuple[str, ...], Tile, bool, bool, bool]]  # + resident, buffered, reuse
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

    for i in range(len(order)):
        for j in range(i + 1, min(len(order), i + limit) + 1):
            add(order[i:j])
    for block in graph.blocks:
        if len(block.layers) <= limit:
            add(block.layers)
            if block.entry:
                add((block.entry, *block.layers))
    for g in extra:
        add(g)
    return out


def _physical(enc: Encoding, cand: Candidate) -> None:
    """Capacities every group obeys, fused or not (bounds, as solver.tiles.physical_violations).

    A double-buffered candidate also holds a second copy of its input boxes.
    """
    m, chip = enc.model, enc.chip
    weights = enc.weight_bytes(cand)
    prefetch = enc.in_bytes(cand)
    for step in enc.live_steps_bytes(cand):
        sram = step + (weights * cand.resident if chip.unified else 0)
        enc.enforce(m.add(sram <= chip.sram.bytes), cand)
        enc.enforce(m.add(sram + prefetch <= chip.sram.bytes), cand, cand.double_buffered)
        # halo reuse keeps each tensor's shared rows for the next tile
        cache = enc.cache_bytes(cand)
        enc.enforce(m.add(sram + cache <= chip.sram.bytes), cand, cand.halo_reuse)
        enc.enforce(m.add(sram + cache + prefetch <= chip.sram.bytes), cand, cand.halo_reuse,
                    cand.double_buffered)
        if chip.nram is not None:  # ceil(step / cores) <= NRAM
            cap = chip.nram.bytes * chip.cores_per_cluster
            enc.enforce(m.add(step <= cap), cand)
            enc.enforce(m.add(step + prefetch <= cap), cand, cand.double_buffered)
            enc.enforce(m.add(step + cache <= cap), cand, cand.halo_reuse)
            enc.enforce(m.add(step + cache + prefetch <= cap), cand, cand.halo_reuse,
                        cand.double_buffered)
    if chip.wram is not None and -(-weights // chip.cores_per_cluster) > chip.wram.bytes:
        m.add_implication(cand.selected, cand.resident.Not())


@dataclass(frozen=True)
class Terms:
    """A candidate's cost quantities as CP-SAT expressions (planner.cost.work_counters)."""

    dram: Any
    macs: Any
    vector_ops: Any
    core_fmap: Any
    core_weight: Any
    first_load: Any
    last_store: Any


def _terms(enc: Encoding, cand: Candidate) -> Terms:
    if cand.fixed is not None:
        c = cand.fixed
        return Terms(c.dram_bytes, c.macs, c.vector_ops, c.core_fmap_bytes, c.core_weight_bytes,
                     c.first_load_bytes, c.last_store_bytes)
    m, g, dt = enc.model, enc.graph, enc.chip.dtype_bytes
    reads = sum(enc.read_bytes(cand, t) for t in cand.io.inputs)
    writes = sum(g.elems(t) for t in cand.io.outputs) * dt
    w = enc.weight_bytes(cand)
    wread: Any = w
    if w and not isinstance(cand.tiles, int):
        upper = w * cand.extent[1] * cand.extent[0]
        wread = m.new_int_var(0, upper, f"weight_read_{cand.index}")
        m.add(wread >= w).only_enforce_if(cand.resident)
        m.add(wread >= w * cand.tiles).only_enforce_if(cand.resident.Not())
    macs, vector_ops = _ops(enc, cand, enc.region_elems_total)
    uses = in_group_uses(g, cand.io)
    tensors = group_tensors(g, cand.io)
    core_fmap = sum(enc.region_elems_total(cand, t) * ((1 + uses.get(t, 0)) * dt)
                    for t in tensors)
    # with halo reuse each row is loaded or computed once (planner.cost.work_counters)
    reads_ru = sum(enc.union_elems_total(cand, t) for t in cand.io.inputs) * dt
    macs_ru, vector_ru = _ops(enc, cand, enc.union_elems_total)
    core_ru = sum((enc.union_elems_total(cand, t)
                   + enc.region_elems_total(cand, t) * uses.get(t, 0)) * dt for t in tensors)
    r = cand.halo_reuse
    return Terms(_either(m, r, reads + writes + wread, reads_ru + writes + wread, "dram", cand),
                 _either(m, r, macs, macs_ru, "macs", cand),
                 _either(m, r, vector_ops, vector_ru, "vec", cand),
                 _either(m, r, core_fmap, core_ru, "core", cand), w * cand.tiles,
                 enc.first_load_bytes(cand), enc.last_store_bytes(cand))


def _ops(enc: Encoding, cand: Candidate, elems: Any) -> tuple[Any, Any]:
    """(MACs of main layers, vector ops of the others) with each output's element count
    given by `elems(cand, tensor)`."""
    macs: Any = 0
    vector_ops: Any = 0
    for name in cand.io.layers:
        lay = enc.graph.layer(name)
        if lay.macs_per_output:
            ops = lay.macs_per_output * elems(cand, lay.outputs[0])
            if lay.is_main:
                macs += ops
            else:
                vector_ops += ops
    return macs, vector_ops


def _either(m: Any, reuse: Any, recompute: Any, reused: Any, what: str, cand: Candidate) -> Any:
    """An integer at least `recompute`, or at least `reused` when halos are reused."""
    if isinstance(recompute, int) and isinstance(reused, int) and recompute == reused:
        return recompute
    var = m.new_int_var(0, 10**13, f"{what}_{cand.index}")
    m.add(var >= recompute).only_enforce_if(reuse.Not())
    m.add(var >= reused).only_enforce_if(reuse)
    return var


def _ceil_div(m: Any, expr: Any, num: int, den: int, name: str) -> Any:
    """An integer >= expr * den / num; tight wherever the objective pushes it down."""
    var = m.new_int_var(0, 10**12, name)
    m.add(var * num >= expr * den)
    return var


def _objective_terms(enc: Encoding, cand: Candidate, objective: str, ruleset: RuleSet
                     ) -> tuple[Any, Any]:
    """(integer cost under the objective, cycles or None): solver.tiles.objective_units."""
    m, chip = enc.model, enc.chip
    t = _terms(enc, cand)
    if objective == "traffic":
        return t.dram, None
    i = cand.index
    bpc = dram_bytes_per_cycle(chip)
    num, den = bpc.numerator, bpc.denominator
    compute = (_ceil_div(m, t.macs, chip.cores * chip.core.macs_per_cycle, 1, f"mac_cyc_{i}")
               + _ceil_div(m, t.vector_ops, chip.cores * chip.core.vector_lanes, 1,
                           f"vec_cyc_{i}"))
    cycles = m.new_int_var(0, 10**12, f"cycles_{i}")
    # without a second buffer, transfers and compute add up
    serial = _ceil_div(m, t.dram, num, den, f"dram_cyc_{i}")
    m.add(cycles >= serial + compute).only_enforce_if(cand.double_buffered.Not())
    # with one: fill + max(remaining transfers, compute) + drain
    fill = _ceil_div(m, t.first_load, num, den, f"fill_{i}")
    drain = _ceil_div(m, t.last_store, num, den, f"drain_{i}")
    rest = _ceil_div(m, t.dram - t.first_load - t.last_store, num, den, f"rest_{i}")
    m.add(cycles >= fill + rest + drain).only_enforce_if(cand.double_buffered)
    m.add(cycles >= fill + compute + drain).only_enforce_if(cand.double_buffered)
    if objective == "latency":
        return cycles, cycles
    k = energy_coefficients(chip)
    energy = (k["dram"] * t.dram + k["core_fmap"] * t.core_fmap
              + k["core_weight"] * t.core_weight + k["macs"] * t.macs
              + k["vector_ops"] * t.vector_ops + k["cycles"] * cycles)
    if objective == "energy":
        return energy, cycles
    o = ruleset.objective
    return (round(ENERGY_SCALE * o.dram_bytes_weight) * t.dram
            + round(ENERGY_SCALE * o.cycles_weight) * cycles
            + round(o.energy_pj_weight) * energy), cycles


def build_model(graph: Graph, chip: Chip, ruleset: RuleSet, objective: str,
                candidates: Sequence[Sequence[str]],
                floors: Sequence[int] | None = None, cycles_cap: int | None = None,
                fixed: Sequence[Any] | None = None) -> tuple[Encoding, dict[str, Any]]:
    """The CP-SAT model over the candidates; returns it with the rule literals by key.

    ``floors`` (one per candidate, optional) are lower bounds on each candidate's cost
    (its best tile's cost from the same closed forms); they are valid cuts that tighten the
    LP relaxation to the set-partitioning bound and do not change the optimum.
    ``cycles_cap`` bounds the plan's total cycles (the epsilon constraint of a Pareto sweep).
    """
    enc = Encoding(graph, chip)
    m = enc.model
    rule_lits = {r.key: m.new_bool_var(f"rule_{r.code}_{r.key}") for r in ruleset.enabled}
    cover: dict[str, list[Any]] = {lay.name: [] for lay in graph.layers}
    costs = []
    capped: list[Any] = []
    for k, layers in enumerate(candidates):
        cand = enc.add_candidate(layers, fixed[k] if fixed is not None else None)
        for name in cand.layers:
            cover[name].append(cand.selected)
        _physical(enc, cand)
        if cand.fused:
            for r in ruleset.enabled:
                r.encode(enc, cand, rule_lits[r.key])
        cost, cycles = _objective_terms(enc, cand, objective, ruleset)
        if cycles_cap is not None:
            if cycles is None:
                raise ValueError("a cycles cap needs the latency, energy or weighted objective")
            spent = m.new_int_var(0, 10**12, f"cycles_paid_{cand.index}")
            m.add(spent >= cycles).only_enforce_if(cand.selected)
            capped.append(spent)
        # a selected candidate pays its floor (a lower bound of its cost) plus the excess of
        # its actual cost over it; with the floor outside the enforced constraint, the LP
        # relaxation is the set-partitioning bound
        floor = floors[k] if floors is not None else 0
        excess = m.new_int_var(0, 10**13, f"excess_{cand.index}")
        m.add(excess >= cost - floor).only_enforce_if(cand.selected)
        m.add(excess == 0).only_enforce_if(cand.selected.Not())
        costs.append(excess + floor * cand.selected)
    # every layer in exactly one selected group
    for lits in cover.values():
        m.add_exactly_one(lits)
    if cycles_cap is not None:
        m.add(sum(capped) <= cycles_cap)
    m.minimize(sum(costs))
    return enc, rule_lits


def _hint(enc: Encoding, warm: Sequence[tuple[Sequence[str], Tile]]) -> None:
    """Warm start from another planner's groups and tiles."""
    chosen = {frozenset(g): t for g, t in warm}
    for cand in enc.candidates:
        tile = chosen.get(frozenset(cand.layers))
        enc.model.add_hint(cand.selected, tile is not None)
        if tile is not None and not isinstance(cand.th, int):
            enc.model.add_hint(cand.th, tile.h)
        if tile is not None and not isinstance(cand.tn, int):
            enc.model.add_hint(cand.tn, tile.n)


def solve_cpsat(graph: Graph, chip: Chip, ruleset: RuleSet, objective: str,
                warm: Sequence[tuple[Sequence[str], Tile]] = (),
                time_limit_s: float | None = None, cycles_cap: int | None = None,
                memo: dict[tuple[str, ...], Any] | None = None) -> CpsatResult:
    """Optimal groups and tiles under the rules (or the best found within the time limit)."""
    started = time.perf_counter()
    memo = {} if memo is None else memo
    for lay in graph.layers:  # a layer that fits at no tile makes every plan infeasible
        alone = (lay.name,)
        if alone not in memo:
            memo[alone] = GroupSearch.of(graph, alone, chip, ruleset).best(objective)
        if memo[alone] is None:
            raise infeasible_layer_error(graph, chip, ruleset, lay.name)
    candidates, floors, pinned = [], [], []
    for layers in candidate_sets(graph, ruleset, [g for g, _ in warm]):
        if layers in memo and memo[layers] is None:  # no tile passes, or it cuts a block
            continue
        search = GroupSearch.of(graph, layers, chip, ruleset)
        # with every rule literal true, structurally invalid or unfittable groups can never be
        # chosen: leave them out rather than let presolve find that out for each
        if breaks_structure(search, ruleset):
            continue
        if layers not in memo:  # blocks and warm-start groups that are not intervals
            memo[layers] = search.best(objective)
        best = memo[layers]
        if best is None:
            continue
        candidates.append(layers)
        floors.append(objective_units(best.cost, objective, ruleset, chip))
        # rows without a closed form keep the exact Python tile (enumerated costs)
        pinned.append(None if search.closed_form else best)
    enc, rule_lits = build_model(graph, chip, ruleset, objective, candidates, floors,
                                 cycles_cap, pinned)
    _hint(enc, warm)
    solver = cp_model.CpSolver()
    p = solver.parameters
    p.max_time_in_seconds = time_limit_s or ruleset.search.time_limit_s
    p.num_workers = ruleset.search.workers
    p.random_seed = ruleset.search.seed
    p.relative_gap_limit = ruleset.search.relative_gap
    enc.model.add_assumptions(list(rule_lits.values()))
    status = solver.solve(enc.model)
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
    groups = []
    for cand in enc.candidates:
        if solver.boolean_value(cand.selected):
            th = cand.th if isinstance(cand.th, int) else solver.value(cand.th)
            tn = cand.tn if isinstance(cand.tn, int) else solver.value(cand.tn)
            tile = Tile(tn, th, cand.extent[2])
            resident = bool(solver.boolean_value(cand.resident))
            db = bool(solver.boolean_value(cand.double_buffered))
            reuse = bool(solver.boolean_value(cand.halo_reuse))
            if objective == "traffic":  # bytes do not depend on it: pick the faster one
                search = GroupSearch.of(graph, cand.layers, chip, ruleset)
                options = [False] + [True] * search.fits_double_buffer(tile, resident, reuse)
                db = min(options, key=lambda o: search.quick_cost(tile, resident, o,
                                                                  reuse).cycles)
            groups.append((cand.layers, tile, resident, db, reuse))
    obj, bound = solver.objective_value, solver.best_objective_bound
    gap = 0.0 if status == cp_model.OPTIMAL else abs(obj - bound) / max(abs(obj), 1.0)
    return CpsatResult(groups, name, obj, bound, gap, time.perf_counter() - started)
