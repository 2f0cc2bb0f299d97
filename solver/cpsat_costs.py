"""A CP-SAT candidate's cost as model expressions: its work counters, its cycles in either
buffering mode, and its integer cost under the objective (planner.cost.model and
planner.cost.objective, stated over the tile variables of rules.encoding)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fuseplan.planner.cost.layered import first_tile_overlap, layered_applies
from fuseplan.planner.cost.model import (
    compute_cycles,
    dram_bytes_per_cycle,
    dram_loads,
    group_tensors,
    weight_ring,
)
from fuseplan.planner.cost.objective import Charged, Objective, objective_terms
from fuseplan.planner.geometry.regions import box_elems, full_box, in_group_uses, tile_regions
from fuseplan.planner.geometry.rounds import round_size
from fuseplan.planner.ir.array import array_map, matrix_macs
from fuseplan.rules.encoding import Candidate, Encoding
from fuseplan.rules.ruleset import RuleSet


@dataclass(frozen=True)
class Terms:
    """A candidate's cost quantities as CP-SAT expressions (planner.cost.model.work_counters)."""

    dram: Any
    macs: Any
    vector_ops: Any
    core_fmap: Any
    core_weight: Any
    first_load: Any
    last_store: Any
    matrix: Any  # the MACs its matrix time is counted in (planner.ir.array.matrix_macs)
    link: int = 0  # bytes between clusters (a pinned cluster-split choice's gathers)


def candidate_terms(enc: Encoding, cand: Candidate) -> Terms:
    """The candidate's cost quantities: a pinned choice's own, else over its tile variables."""
    if cand.fixed is not None:
        c = cand.fixed
        return Terms(c.dram_bytes, c.macs, c.vector_ops, c.core_fmap_bytes,
                     c.core_weight_bytes, c.first_load_bytes, c.last_store_bytes,
                     matrix_macs(enc.chip, c.macs, c.array_macs), c.cluster_link_bytes)
    m, g, dt = enc.model, enc.graph, enc.chip.dtype_bytes
    # its inputs' boxes and the table rows its gathers fetch (planner.ir.graph.row_gathers)
    reads = sum(enc.read_bytes(cand, t) for t in dram_loads(g, cand.io))
    writes = sum(g.elems(t) for t in cand.io.outputs) * dt
    w = enc.weight_bytes(cand)
    wread: Any = w
    if w and not isinstance(cand.tiles, int):
        upper = w * cand.extent[1] * cand.extent[0]
        wread = m.new_int_var(0, upper, f"weight_read_{cand.index}")
        m.add(wread >= w).only_enforce_if(cand.resident)
        # streamed: once per round of tiles (planner.geometry.rounds; variable tiles
        # recompute their halos, so only an accumulator keeps them one at a time)
        size = round_size(enc.chip, cand.io, False)
        passes = cand.tiles if size == 1 else ceil_div(m, cand.tiles, size, 1,
                                                       f"rounds_{cand.index}")
        m.add(wread >= w * passes).only_enforce_if(cand.resident.Not())
    macs, array, vector_ops = candidate_ops(enc, cand, enc.region_elems_total)
    uses = in_group_uses(g, cand.io)
    tensors = group_tensors(g, cand.io)
    core_fmap = sum(enc.region_elems_total(cand, t) * ((1 + uses.get(t, 0)) * dt)
                    for t in tensors)
    return Terms(reads + writes + wread, macs, vector_ops, core_fmap, w * cand.tiles,
                 enc.first_load_bytes(cand), enc.last_store_bytes(cand),
                 array if enc.chip.core.array is not None else macs)


def candidate_ops(enc: Encoding, cand: Candidate, elems: Any) -> tuple[Any, Any, Any]:
    """(MACs of main layers, their array MACs, vector ops of the others) with each output's
    element count given by `elems(cand, tensor)` (array MACs: 0 on a chip without an
    array, planner.ir.array)."""
    macs: Any = 0
    array_total: Any = 0
    vector_ops: Any = 0
    array = enc.chip.core.array
    for name in cand.io.layers:
        lay = enc.graph.layer(name)
        if not lay.macs_per_output:
            continue
        made = elems(cand, lay.outputs[0])
        ops = lay.macs_per_output * made
        if not lay.is_main:
            vector_ops += ops
            continue
        macs += ops
        amap = array_map(lay, array) if array is not None else None
        if amap is not None:
            # its pixels (elements over channels) x the per-pixel constant: linear
            array_total += _scaled(enc, made, amap.per_pixel, amap.channels,
                                   f"array_{cand.index}_{name}")
        elif array is not None:
            array_total += ops
    return macs, array_total, vector_ops


def _scaled(enc: Encoding, expr: Any, num: int, den: int, name: str) -> Any:
    """expr * num / den, an integer where den divides num or expr is a plain number, else a
    variable at least that (tight where the objective pushes it down)."""
    if num % den == 0:
        return expr * (num // den)
    if isinstance(expr, int):
        return expr * num // den
    return ceil_div(enc.model, expr * num, den, 1, name)


def upper_bound(expr: Any) -> int:
    """The largest value a linear expression of the model's variables can take (from their
    domains), so the variables built over it are bounded by what the model allows and CP-SAT
    never sees a sum that could overflow 64 bits (MODEL_INVALID)."""
    if isinstance(expr, int):
        return expr
    from ortools.sat.python import cp_model_helper

    flat = cp_model_helper.FlatIntExpr(expr)
    total = int(flat.offset)
    for v, c in zip(flat.vars, flat.coeffs, strict=True):
        domain = list(v.proto.domain)  # (the proto's list takes no negative index)
        total += int(c) * int(domain[-1] if c > 0 else domain[0])
    return total


def ceil_div(m: Any, expr: Any, num: int, den: int, name: str) -> Any:
    """An integer >= expr * den / num; tight wherever the objective pushes it down."""
    var = m.new_int_var(0, max(0, -(-upper_bound(expr) * den // num)), name)
    m.add(var * num >= expr * den)
    return var


@dataclass(frozen=True)
class Timing:
    """A candidate's cycles and its DRAM-busy cycles in either buffering mode: the cycles
    minus the busy ones are the link's idle time (planner.cost.model.idle_dram_cycles)."""

    cycles: Any
    busy_double_buffered: Any  # fill + remaining transfers + drain
    busy_serial: Any  # all transfers
    overlap: Any = 0  # compute its one tile hides behind its own weight loads (else 0)
    # a free candidate whose streamed weights run in a ring when it is one tile: that
    # literal (the ring takes every byte a prefetch could use, planner.cost.model.weight_ring)
    ring: Any = None


def objective_expr(enc: Encoding, cand: Candidate, objective: Objective, ruleset: RuleSet
                   ) -> tuple[Any, Timing | None]:
    """(integer cost under the objective, timing or None): planner.cost.objective's
    objective_terms over the candidate's expressions."""
    m, chip = enc.model, enc.chip
    t = candidate_terms(enc, cand)
    if not objective.timed:
        return t.dram, None
    i = cand.index
    bpc = dram_bytes_per_cycle(chip)
    num, den = bpc.numerator, bpc.denominator
    if cand.fixed is not None and (cand.fixed.band_compute_cycles  # its slowest band's
                                   or cand.fixed.cluster_link_bytes):  # or its gathers'
        compute: Any = compute_cycles(chip, cand.fixed)
    else:
        compute = (ceil_div(m, t.matrix, chip.cores * chip.core.macs_per_cycle, 1,
                            f"mac_cyc_{i}")
                   + ceil_div(m, t.vector_ops, chip.cores * chip.core.vector_lanes, 1,
                              f"vec_cyc_{i}"))
    # the most any of the lower bounds below can ask for (the model's own domains)
    most = -(-max(upper_bound(t.dram), upper_bound(t.first_load) + upper_bound(t.last_store))
             * den // num) + 2
    cycles = m.new_int_var(0, max(0, most + upper_bound(compute)), f"cycles_{i}")
    # without a second buffer, transfers and compute add up
    serial = ceil_div(m, t.dram, num, den, f"dram_cyc_{i}")
    # a group of one tile computes its layers as their weights arrive, hiding some
    # compute behind its own loads (planner.cost.layered)
    overlap, ring = (cand.fixed.overlap_cycles, None) if cand.fixed is not None \
        else one_tile_overlap(enc, cand)
    m.add(cycles >= serial + compute - overlap).only_enforce_if(cand.double_buffered.Not())
    m.add(cycles >= serial).only_enforce_if(cand.double_buffered.Not())
    # with one: fill + max(remaining transfers, compute) + drain
    fill = ceil_div(m, t.first_load, num, den, f"fill_{i}")
    drain = ceil_div(m, t.last_store, num, den, f"drain_{i}")
    rest = ceil_div(m, t.dram - t.first_load - t.last_store, num, den, f"rest_{i}")
    # a pinned choice's loads far from even stall the cores beyond that (its own count)
    stall = cand.fixed.stall_cycles if cand.fixed is not None else 0
    m.add(cycles >= fill + rest + drain + stall).only_enforce_if(cand.double_buffered)
    m.add(cycles >= fill + compute + drain + stall - overlap).only_enforce_if(
        cand.double_buffered)
    timing = Timing(cycles, fill + rest + drain, serial, overlap, ring)
    charged = Charged(t.dram, t.core_fmap, t.core_weight, t.macs, t.vector_ops, cycles, t.link)
    return objective_terms(objective, ruleset.objective, chip, charged), timing


def one_tile_overlap(enc: Encoding, cand: Candidate) -> tuple[Any, Any]:
    """(overlap_cycles, ring literal or None) of a candidate whose
    tile the model chooses: its whole-map overlap (resident, or streamed: in pairs or in a
    ring, planner.cost.model.weight_ring) when it runs as one tile, else 0
    (planner.cost.layered: only a group of one tile is played layer by layer)."""
    m, g, chip = enc.model, enc.graph, enc.chip
    n, h, _ = cand.extent
    if not layered_applies(cand.io, False) or (isinstance(cand.tiles, int) and cand.tiles != 1) \
            or upper_bound(cand.th) < h or upper_bound(cand.tn) < n:  # never one tile
        return 0, None
    regions = tile_regions(g, cand.io, full_box(g, cand.io.anchor))
    dt = chip.dtype_bytes
    maps = sum(box_elems(g, t, regions[t]) for t in dram_loads(g, cand.io)) * dt
    ring = weight_ring(g, cand.io, chip, regions)
    resident = first_tile_overlap(g, cand.io, regions, chip, maps)
    streamed = first_tile_overlap(g, cand.io, regions, chip, maps, True, ring)
    if not (resident or streamed or ring):
        return 0, None
    one = []  # the literal of running as one tile, where the model chooses the tile
    if not isinstance(cand.tiles, int):  # one tile exactly when the literal says so
        one = [m.new_bool_var(f"one_tile_{cand.index}")]
        m.add(cand.tiles == 1).only_enforce_if(one[0])
        m.add(cand.tiles >= 2).only_enforce_if(one[0].Not())
    overlap = m.new_int_var(0, max(resident, streamed), f"overlap_{cand.index}")
    m.add(overlap <= resident).only_enforce_if(cand.resident)
    m.add(overlap <= streamed).only_enforce_if(cand.resident.Not())
    for lit in one:
        m.add(overlap == 0).only_enforce_if(lit.Not())
    if not ring:
        return overlap, None
    in_ring = m.new_bool_var(f"ring_{cand.index}")  # one tile, streamed
    m.add_bool_and([cand.resident.Not(), *one]).only_enforce_if(in_ring)
    m.add_bool_or([cand.resident, in_ring, *(lit.Not() for lit in one)])
    # the ring takes all the SRAM the maps leave: no second buffer, no room for a prefetch
    m.add_implication(in_ring, cand.double_buffered.Not())
    return overlap, in_ring
