"""Plans from placements: counters from the cost model, execution order, prefetch."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from itertools import accumulate

from fuseplan.hardware.chip import Chip
from fuseplan.planner.core.errors import PlanningError
from fuseplan.planner.cost.cluster_split import cluster_split_cost
from fuseplan.planner.cost.ends import ends_cost
from fuseplan.planner.cost.hidden import hidden_cost
from fuseplan.planner.cost.model import (
    Counters,
    compulsory_bytes,
    group_cost,
    head_chunked_cost,
    prefetch_cycles,
    weight_bytes,
    with_time,
)
from fuseplan.planner.cost.objective import Objective
from fuseplan.planner.cost.passes import passes_cost
from fuseplan.planner.cost.spilled_keys import spilled_keys_cost
from fuseplan.planner.cost.weight_stream import chunk_counts
from fuseplan.planner.geometry.ends import chunked_ends
from fuseplan.planner.geometry.hidden import stretches
from fuseplan.planner.geometry.passes import pass_split
from fuseplan.planner.geometry.regions import group_chains, group_io
from fuseplan.planner.geometry.reload import reloaded_inputs
from fuseplan.planner.ir.graph import Graph
from fuseplan.planner.plan.checks import (
    check_bands,
    check_cover,
    check_reuse_tile,
    execution_order,
    group_mode,
    whole_tile,
)
from fuseplan.planner.plan.data import Group, Json, Plan
from fuseplan.planner.plan.mode import Mode, ModeKind, mode_kind, mode_problem
from fuseplan.planner.plan.placement import Placement
from fuseplan.rules.base import GroupFacts
from fuseplan.rules.ruleset import RuleSet, SearchSettings
from fuseplan.solver.capacity import prefetch_room
from fuseplan.solver.parallel import Context, Task, search_all
from fuseplan.solver.shortest_path import infeasible_layer_error
from fuseplan.solver.structure import StructureKey, structure_key
from fuseplan.solver.tiles import GroupSearch


def make_group(graph: Graph, gid: int, placement: Placement, chip: Chip) -> Group:
    """A group with its predicted counters from the cost model (layers in graph order)."""
    p = replace(placement, layers=tuple(sorted(placement.layers, key=graph.index)))
    # a stretch run in hidden chunks cuts its layers' weights by those chunks instead
    cut = {n for s in stretches(graph, group_io(graph, p.layers)) for n in s.layers} \
        if p.hidden_chunks > 1 else set()
    if p.end_chunks > 1:  # and end chunks cut the weights of the ends
        ends = chunked_ends(graph, group_io(graph, p.layers))
        cut |= set(ends.layers) if ends is not None else set()
    chunks = () if p.weights_resident else tuple(
        (name, k) for name, k in chunk_counts(graph, p.layers, chip).items()
        if k > 1 and name not in cut)
    p = replace(p, chunks=chunks)
    if p.halo_reuse:
        check_reuse_tile(graph, p.layers, p.tile, "plan")
    check_bands(graph, p.layers, p.tile, chip, p.halo_reuse, "plan")
    return Group(gid, p, group_mode(graph, p.layers, p.tile), placement_cost(graph, p, chip))


def placement_cost(graph: Graph, p: Placement, chip: Chip) -> Counters:
    """Predicted counters of a placement, without next-group prefetch: the mode checked by
    the one validator (planner.plan.mode.mode_problem), then priced by its kind's cost
    function."""
    problem = mode_problem(graph, p.layers, p.tile, p.mode, whole_tile(graph, p.layers))
    if problem is not None:
        raise PlanningError(f"the group of {p.layers[0]!r} .. {p.layers[-1]!r} cannot run as "
                            f"placed: {problem}")
    # groups of one structure (repeated blocks; a deep chain's 20,000 ReLUs, priced once
    # for the plan and once more for the layer-by-layer reference) cost the same at one
    # tile and mode: priced once per graph
    key = ("placement_cost", structure_key(graph, group_io(graph, p.layers)), p.tile,
           p.mode, chip)
    found = graph.derived.get(key)
    if found is None:
        found = graph.derived[key] = _COST[mode_kind(graph, p.layers, p.mode)](graph, p, chip)
    assert isinstance(found, Counters)
    return found


def _passes_cost(graph: Graph, p: Placement, chip: Chip) -> Counters:
    split = pass_split(graph, p.layers, p.inputs_held, p.maps_held)
    assert split is not None  # mode_problem checked it
    return passes_cost(graph, split, p.tile, chip, p.double_buffered,
                       hidden_chunks=p.hidden_chunks)


def _head_chunks_cost(graph: Graph, p: Placement, chip: Chip) -> Counters:
    return head_chunked_cost(graph, p.layers, p.tile, chip, p.double_buffered, p.hidden_chunks)


def _hidden_cost(graph: Graph, p: Placement, chip: Chip) -> Counters:
    io = group_io(graph, p.layers)
    return hidden_cost(graph, io, group_chains(graph, io), stretches(graph, io),
                       p.hidden_chunks, p.tile, chip, p.weights_resident, p.double_buffered,
                       reloaded=reloaded_inputs(graph, io) if p.inputs_reloaded else None)


def _ends_cost(graph: Graph, p: Placement, chip: Chip) -> Counters:
    io = group_io(graph, p.layers)
    ends = chunked_ends(graph, io)
    assert ends is not None  # mode_problem checked it
    return ends_cost(graph, io, group_chains(graph, io), ends, p.end_chunks, p.tile, chip,
                     p.weights_resident)


def _split_cost(graph: Graph, p: Placement, chip: Chip) -> Counters:
    return cluster_split_cost(graph, p.layers, p.tile, chip, p.double_buffered,
                              p.halo_reuse, p.keys_spilled, p.keys_in_wram)


def _spilled_cost(graph: Graph, p: Placement, chip: Chip) -> Counters:
    return spilled_keys_cost(graph, p.layers, p.tile, chip, p.double_buffered)


def _tiles_cost(graph: Graph, p: Placement, chip: Chip) -> Counters:
    return group_cost(graph, p.layers, p.tile, chip, p.weights_resident, p.double_buffered,
                      p.halo_reuse, p.weights_outer)


# one cost function per kind of mode (the emulator has one runner per kind)
_COST: dict[ModeKind, Callable[[Graph, Placement, Chip], Counters]] = {
    ModeKind.TILES: _tiles_cost,
    ModeKind.WEIGHTS_OUTER: _tiles_cost,  # group_cost prices the chunk sweep itself
    ModeKind.PASSES: _passes_cost,
    ModeKind.HEAD_CHUNKS: _head_chunks_cost,
    ModeKind.HIDDEN: _hidden_cost,
    ModeKind.ENDS: _ends_cost,
    ModeKind.CLUSTER_SPLIT: _split_cost,
    ModeKind.KEYS_SPILLED: _spilled_cost,
}


def prefetch_eligible(graph: Graph, groups: Sequence[Sequence[str]]) -> list[bool]:
    """Per group (in execution order), whether the planners may prefetch its weights behind
    the group before it: both are intervals of the topological order, adjacent, and no
    group spans the first one (then the second surely runs right after it, which is what
    CP-SAT can state without knowing the execution order)."""
    spans = [(min(map(graph.index, g)), max(map(graph.index, g)), len(g)) for g in groups]
    # the furthest end of the groups starting before each start, for `spanned` without a
    # walk over every group per group (20,000 groups of a deep chain: 400 million steps)
    firsts = sorted((c0, c1) for c0, c1, _ in spans)
    starts = [c0 for c0, _ in firsts]
    furthest = list(accumulate((c1 for _, c1 in firsts), max, initial=-1))
    out = [False]
    for (a0, a1, na), (b0, b1, nb) in zip(spans, spans[1:], strict=False):
        intervals = a1 - a0 + 1 == na and b1 - b0 + 1 == nb
        spanned = furthest[bisect_left(starts, a0)] > a1
        out.append(intervals and b0 == a1 + 1 and not spanned)
    return out


def prefetch_fits(graph: Graph, chip: Chip, prev: Group, nxt: Group) -> bool:
    """The next group's weights fit on chip beside the previous group (capacity bounds, as
    CP-SAT: solver.capacity.prefetch_room)."""

    io = group_io(graph, prev.layers)
    facts = GroupFacts(graph, io, group_chains(graph, io), prev.tile, chip,
                       Mode.of(resident=prev.weights_resident,
                               double_buffered=prev.double_buffered,
                               halo_reuse=prev.halo_reuse,
                               cluster_split=prev.placement.cluster_split))
    return weight_bytes(graph, group_io(graph, nxt.layers).weights, chip) <= prefetch_room(facts)


def with_prefetch(graph: Graph, chip: Chip, groups: Sequence[Group]) -> tuple[Group, ...]:
    """The groups with each one's weights prefetched behind the group before it wherever
    that is allowed, fits and hides at least a cycle (it never costs anything). Only a
    group whose weights all load with its first tile (resident) prefetches them: the
    emulator's clock prefetches the first tile's weights (emulator.clock)."""
    out = list(groups)
    for k, ok in enumerate(prefetch_eligible(graph, [g.layers for g in groups])):
        if not ok or out[k].boxes is not None or out[k - 1].boxes is not None:
            continue
        prev, g = out[k - 1], out[k]
        # streamed, its first tile loads one chunk of its weights, no more; split over the
        # clusters, they are shares (planner.plan.mode.Mode.prefetchable)
        if not g.placement.mode.prefetchable:
            continue
        w = weight_bytes(graph, group_io(graph, g.layers).weights, chip)
        hidden = prefetch_cycles(chip, prev.predicted, prev.double_buffered, w,
                                 g.predicted.overlap_cycles)
        if hidden and prefetch_fits(graph, chip, prev, g):
            out[k] = replace(g, predicted=with_time(chip, g.predicted, g.double_buffered, hidden),
                             placement=replace(g.placement, prefetch=True))
    return tuple(out)


def assemble(graph: Graph, chip: Chip, groups: Sequence[Placement], *,
             model: Mapping[str, Json], hardware: Mapping[str, Json], rules: Mapping[str, Json],
             objective: Objective, solver: Mapping[str, Json],
             layer_by_layer: int | None = None) -> Plan:
    """Build a Plan from the planners' placements, in execution order, with prefetch where
    it pays (a placement's own prefetch flag is decided here, not taken). ``layer_by_layer``:
    the graph's layer_by_layer_bytes, when the caller has it (its tile searches take
    seconds on a deep network; a Pareto sweep assembles many plans of one graph)."""
    by_layers = {tuple(sorted(p.layers, key=graph.index)): replace(p, prefetch=False)
                 for p in groups}
    ordered = execution_order(graph, list(by_layers))
    made = with_prefetch(graph, chip, [make_group(graph, i, by_layers[g], chip)
                                       for i, g in enumerate(ordered)])
    check_cover(graph, [g.layers for g in made], source="plan")
    totals = Counters()
    for g in made:
        totals = totals + g.predicted
    return Plan(made, model, hardware, rules, objective, solver, totals,
                compulsory_bytes(graph, chip),
                layer_by_layer_bytes(graph, chip) if layer_by_layer is None else layer_by_layer)


def layer_placements(graph: Graph, chip: Chip, jobs: int = 1,
                     settings: SearchSettings | None = None) -> list[Placement]:
    """No fusion: every layer alone, whole where it fits the chip, else at its best tile
    (repeated layers share one search; the searches run on up to `jobs` processes), with
    the modes `settings` allow (None: every mode: the layer-by-layer reference).
    Raises PlanningError naming the first layer that fits at no tile."""
    alone = RuleSet((), search=settings or SearchSettings())
    whole_fits: dict[str, Placement] = {}
    keys: dict[str, StructureKey] = {}
    tasks: dict[StructureKey, Task] = {}
    for lay in graph.layers:
        layers = (lay.name,)
        search = GroupSearch.of(graph, layers, chip, alone)
        whole = whole_tile(graph, layers)
        fits = [r for r in (True, False) if not search.violations(whole, r)]
        if fits:
            whole_fits[lay.name] = Placement.of(layers, whole, fits[0])
            continue
        keys[lay.name] = structure_key(graph, search.io)
        tasks.setdefault(keys[lay.name], Task(layers))
    ctx = Context(graph, chip, alone, Objective.TRAFFIC, False, None)
    found = dict(zip(tasks, search_all(ctx, list(tasks.values()), jobs), strict=True))
    out: list[Placement] = []
    for lay in graph.layers:
        if lay.name in whole_fits:
            out.append(whole_fits[lay.name])
            continue
        result = found[keys[lay.name]]
        if result is None or result.best is None:
            raise infeasible_layer_error(graph, chip, alone, lay.name)
        out.append(result.best.placement((lay.name,)))
    return out


def layer_by_layer_bytes(graph: Graph, chip: Chip, jobs: int = 1) -> int:
    """DRAM bytes with no fusion (the `layer` planner's plan); 0 when a layer fits nowhere."""
    try:
        placements = layer_placements(graph, chip, jobs)
    except PlanningError:
        return 0
    return sum(placement_cost(graph, p, chip).dram_bytes for p in placements)


def layer_plan(graph: Graph, chip: Chip, *, model: Mapping[str, Json],
               hardware: Mapping[str, Json], rules: Mapping[str, Json] | None = None,
               objective: Objective = Objective.TRAFFIC) -> Plan:
    """The layer-by-layer plan: no fusion, every layer whole where it fits the chip."""
    return assemble(graph, chip, layer_placements(graph, chip), model=model, hardware=hardware,
                    rules=rules or {}, objective=objective,
                    solver={"name": "layer", "status": "OPTIMAL", "gap": 0.0, "wall_s": 0.0})
