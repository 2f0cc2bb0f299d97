"""A plan's bounds (planner.plan.io_bounds) from its groups: each fused attention's analytic
count at its group's tiling, a prefill's I/O bound (the floor plus each attention's
FlashAttention I/O as if alone: planner.geometry.attention.alone_traffic), a decode step's
caches read and the new positions written."""

from __future__ import annotations

from fuseplan.hardware.chip import Chip
from fuseplan.planner.geometry.attention import alone_traffic, attention_traffic
from fuseplan.planner.geometry.regions import group_io
from fuseplan.planner.ir.graph import Graph
from fuseplan.planner.plan.data import Plan
from fuseplan.planner.plan.io_bounds import AttentionIO, CacheIO, IOBounds


def io_bounds_of(graph: Graph, chip: Chip, plan: Plan) -> IOBounds:
    """The bounds of `plan` for `graph` on `chip` (its element size): as the planners stated
    them, else from its groups (a plan read from a file, a hand-built one)."""
    if plan.io_bounds is not None:
        return plan.io_bounds
    dt = chip.dtype_bytes
    attentions = []
    alone = 0
    found_alone = False
    for g in plan.groups:
        io = group_io(graph, g.layers)
        for a in attention_traffic(graph, io, g.tile, dt):
            if a.total:  # q, keys, values and output all inside the group: no count
                attentions.append(AttentionIO(a.layer, g.id, a.q_bytes, a.kv_bytes, a.passes,
                                              a.kv_reads, a.o_bytes, g.predicted.dram_bytes,
                                              a.kv_label()))
        if not graph.appends:
            for a in alone_traffic(graph, io, g.tile, dt,
                                   g.halo_reuse and not g.placement.keys_spilled):
                alone += a.total
                found_alone = True
    cache = None
    if graph.appends:
        cache = CacheIO(len(graph.appends),
                        sum(graph.elems(a.cache) for a in graph.appends) * dt,
                        sum(graph.elems(a.new) for a in graph.appends) * dt,
                        plan.compulsory_dram_bytes)
    bound = plan.compulsory_dram_bytes + alone if found_alone else None
    return IOBounds(tuple(attentions), bound, cache)
