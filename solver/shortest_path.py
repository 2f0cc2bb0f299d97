"""The best grouping of consecutive layers as a shortest path.

Nodes are the cut positions 0..N of the topological order; an edge i -> j means
"layers i+1..j form one group", weighted by that group's best cost under the
rules and the objective. On a chain network these intervals are all the convex
groups there are, so the shortest path is the optimum (CP-SAT must agree).

Under a time-aware objective the next group's weights prefetch while a group computes
(planner.cost.model.prefetch_cycles), which couples consecutive groups: the saving depends on
the first group's tile choice (its DRAM idle cycles and the room it leaves) and on the
second group's weights only. The path then runs over the line graph (a node per interval,
an edge per pair of adjacent intervals), each edge costing the first interval's best
option given its successor: still exact, since an interval's tile choice touches nothing
but its own cost and its successor's saving. With floors (search.prune_by_floor) both run
lazily (solver.bounded_path; under a time-aware objective with the pair prices of
solver.prefetch_path), searching only the groups a path over floors reaches.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import networkx as nx

from fuseplan.hardware.chip import Chip
from fuseplan.planner.core.budget import Budget
from fuseplan.planner.core.errors import PlanningError
from fuseplan.planner.core.progress import Progress, ProgressSink, ticker
from fuseplan.planner.core.units import fmt_bytes, size_setting, vs_bytes
from fuseplan.planner.cost.bounds import IntervalFloors, Work, group_floor_bytes, made_work
from fuseplan.planner.cost.objective import Objective, cycle_units, objective_units
from fuseplan.planner.ir.graph import Graph
from fuseplan.planner.plan.placement import Placement
from fuseplan.rules.ruleset import RuleSet
from fuseplan.solver.bounded_path import Edge, bounded_path, cheapest_pairs
from fuseplan.solver.groups import breaks_structure, connected_intervals, is_connected
from fuseplan.solver.long_groups import (
    Start,
    block_group_searches,
    long_groups,
    searches_long_groups,
    whole_map_starts,
)
from fuseplan.solver.parallel import Context, Found, Task, Tick, looked_up, search_all
from fuseplan.solver.prefetch_path import TimedPricing
from fuseplan.solver.structure import StructureKey, structure_key
from fuseplan.solver.tiles import GroupSearch, Option, TileChoice

_UNSEEN = object()  # not in the memo


def infeasible_layer_error(graph: Graph, chip: Chip, ruleset: RuleSet, name: str) -> PlanningError:
    """The error for a layer that fits the chip at no tile, with the bytes over."""
    search = GroupSearch.of(graph, (name,), chip, ruleset)
    search = search.at_batch(search.batch_options()[-1])
    if ruleset.search.two_d_tiles and search.widths():  # the narrowest 2-D tile
        search = search.at_width(search.widths()[-1])
    smallest = search.tile_of(search.heights()[-1])
    worst = max(search.violations(smallest, False),
                key=lambda v: (v.needed or 0) - (v.allowed or 0))
    over = int((worst.needed or 0) - (worst.allowed or 0))
    need_s, has_s = vs_bytes(worst.needed or 0, worst.allowed or 0)
    return PlanningError(
        f"layer '{name}' ({graph.layer(name).op}) cannot fit the chip '{chip.name}' even alone at "
        f"the smallest tile {smallest.n}x{smallest.h}x{smallest.w}: {worst.name.upper()} needs "
        f"{need_s} but has {has_s} ({fmt_bytes(over)} over). Use a chip with more on-chip "
        f"memory (e.g. --set {binding_memory(worst.name)}.bytes="
        f"{size_setting(worst.needed or 0)}) or a smaller input shape."
    )


def binding_memory(violation: str) -> str:
    """The chip memory a capacity violation is about ("NRAM", "WEIGHTS_FIT_WRAM": the
    per-core NRAM or WRAM; more SRAM does not help those), SRAM for anything else."""
    words = violation.lower().split("_")
    return next((m for m in ("nram", "wram") if m in words), "sram")


def shortest_path_groups(graph: Graph, chip: Chip, ruleset: RuleSet, objective: Objective,
                         memo: dict[tuple[str, ...], TileChoice | None] | None = None,
                         options_memo: dict[tuple[str, ...], list[Option]] | None = None,
                         budget: Budget | None = None, jobs: int = 1,
                         whole_maps: dict[str, Any] | None = None,
                         bounded: set[tuple[str, ...]] | None = None,
                         prune: bool = True, progress: ProgressSink | None = None
                         ) -> list[Placement]:
    """Best grouping into intervals of the topological order.

    ``memo`` collects each interval's best tile, None where no tile passes (CP-SAT reuses
    them as its cuts). An interval already there (planned in another subgraph of the same
    model) is not searched again; one with a tile has its structure checked again, since this
    graph may see blocks the other did not (one with none stays out: a graph that sees fewer
    blocks keeps the whole model's rules). ``options_memo`` collects each interval's
    prefetch options under a time-aware objective (CP-SAT bounds each pair's saving with
    them). Intervals of the same structure (solver.structure: repeated blocks) share one
    tile search. Once the ``budget`` has passed, only single layers are searched (every plan
    needs them), by seed 000's quick search where it finds a tile, and the budget notes what
    was left out. The searches run on up to ``jobs`` processes (solver.parallel);
    ``whole_maps`` keeps the whole-map groups for CP-SAT (solver.long_groups).

    Under the traffic objective (with search.prune_by_floor and `prune`: off where CP-SAT
    will weigh every candidate anyway) a candidate is searched only once a path over
    floors runs through it (solver.bounded_path); ``bounded`` collects those never
    searched, whose floors could not beat the plan (CP-SAT's proof counts them as
    weighed). ``progress``: told of the searches and the path (planner.core.progress)."""
    order = [lay.name for lay in graph.layers]
    coef = cycle_units(objective, ruleset.objective, chip)
    timed = bool(coef) or (options_memo is not None and objective.timed)
    if objective is Objective.TRAFFIC and not timed and ruleset.search.prune_by_floor and prune:
        return _bounded_groups(graph, chip, ruleset, objective, memo, budget, jobs,
                               whole_maps, bounded, progress)
    if coef and ruleset.search.prune_by_floor and prune:
        return _bounded_groups(graph, chip, ruleset, objective, memo, budget, jobs,
                               whole_maps, bounded, progress, options_memo)
    rows, tasks, skipped = _interval_rows(graph, chip, ruleset, order, memo, budget, timed)
    ctx = Context(graph, chip, ruleset, objective, timed,
                  budget.until if budget is not None else None)
    found = _search_rows(ctx, rows, tasks, jobs, progress)
    choice: dict[tuple[int, int], TileChoice] = {}
    options: dict[tuple[int, int], list[Option]] = {}
    quick_layers = 0  # layers searched quickly, past the budget
    for i, j, layers, what in rows:
        result = looked_up(what, found)
        if result is None:  # past the budget: not searched
            skipped += 1
            continue
        best = result.best
        quick_layers += result.quick
        if timed and isinstance(what, tuple):  # the options a prefetch may prefer
            options[i, j] = list(result.options)
            if options_memo is not None:
                options_memo[layers] = list(result.options)
        if memo is not None:
            memo[layers] = best
        if best is None:
            if j - i == 1:
                raise infeasible_layer_error(graph, chip, ruleset, layers[0])
            continue
        choice[i, j] = best
    _note_left_out(budget, ruleset, skipped, quick_layers)
    if not coef:
        return _path_with_long_groups(graph, chip, ruleset, objective, memo, budget, jobs,
                                      whole_maps, choice, progress)
    if progress is not None:
        progress(Progress("shortest path"))
    return _with_prefetch(graph, chip, ruleset, objective, order, options)


# an interval's row: its span, its layers, and no tile (None), the memo's tile, or the
# structure its search shares
_Row = tuple[int, int, tuple[str, ...], TileChoice | StructureKey | None]


def _memo_get(memo: dict[tuple[str, ...], TileChoice | None] | None, layers: tuple[str, ...]
              ) -> TileChoice | None | object:
    """The memo's entry for these layers, _UNSEEN where there is none."""
    return memo.get(layers, _UNSEEN) if memo is not None else _UNSEEN


def _interval_rows(graph: Graph, chip: Chip, ruleset: RuleSet, order: Sequence[str],
                   memo: dict[tuple[str, ...], TileChoice | None] | None,
                   budget: Budget | None, timed: bool
                   ) -> tuple[list[_Row], dict[StructureKey, Task], int]:
    """(each candidate interval's row, a search task per structure, intervals left out past
    the budget)."""
    limit = ruleset.search.max_group_layers
    # shortest first: every plan needs the single layers, and a budget that runs out leaves
    # short groups all along the network rather than long ones at its start
    ends = graph.interval_ends(limit)  # views ride along free
    spans = sorted(((i, j) for i in range(len(order)) for j in range(i + 1, ends[i] + 1)),
                   key=lambda s: (s[1] - s[0], s[0]))
    # each interval: no tile (None), the memo's tile, or the structure its search shares
    rows: list[_Row] = []
    tasks: dict[StructureKey, Task] = {}
    skipped = 0  # groups left out past the budget
    for i, j in spans:
        layers = tuple(order[i:j])
        if j - i > 1 and not is_connected(graph, layers):
            continue
        cached = _memo_get(memo, layers)
        if cached is None and j - i > 1:
            continue
        if j - i > 1 and budget is not None and budget.passed \
                and (timed or not isinstance(cached, TileChoice)):
            skipped += 1
            continue
        search = GroupSearch.of(graph, layers, chip, ruleset)
        if breaks_structure(search, ruleset):
            rows.append((i, j, layers, None))
        elif isinstance(cached, TileChoice) and not timed:
            rows.append((i, j, layers, cached))
        else:
            key = structure_key(graph, search.io)
            tasks.setdefault(key, Task(layers, required=j - i == 1))
            rows.append((i, j, layers, key))
    return rows, tasks, skipped


def _search_rows(ctx: Context, rows: Sequence[_Row], tasks: dict[StructureKey, Task],
                 jobs: int, progress: ProgressSink | None = None
                 ) -> dict[StructureKey, Found | None]:
    """Each structure's search, the single layers' first: a layer that fits no tile ends the
    planning before the rest (``progress``: told how many are done)."""
    found: dict[StructureKey, Found | None] = {}
    tick = ticker(progress, "tile search", len(tasks), searches=True)
    for part in ([k for k, t in tasks.items() if t.required],
                 [k for k, t in tasks.items() if not t.required]):
        found.update(zip(part, search_all(ctx, [tasks[k] for k in part], jobs,
                                          tick=_after(tick, len(found))), strict=True))
        for i, j, layers, what in rows:
            if j - i == 1 and isinstance(what, tuple) and what in found \
                    and (f := found[what]) is not None and f.best is None:
                raise infeasible_layer_error(ctx.graph, ctx.chip, ctx.ruleset, layers[0])
    return found


def _after(tick: Tick | None, before: int) -> Tick | None:
    """`tick` for a part of a loop that starts after `before` items."""
    if tick is None or not before:
        return tick
    whole = tick
    return lambda done: whole(before + done)


def _note_left_out(budget: Budget | None, ruleset: RuleSet, skipped: int, quick: int) -> None:
    """Tell the budget what it left out: groups not searched, layers tiled quickly."""
    if skipped and budget is not None:
        budget.cut(f"tile search: {skipped} candidate groups not searched")
    if quick and budget is not None:
        budget.cut(f"tile search: {quick} single layers tiled by the quick "
                   f"{ruleset.search.tile_search} search")


def _path_with_long_groups(graph: Graph, chip: Chip, ruleset: RuleSet, objective: Objective,
                           memo: dict[tuple[str, ...], TileChoice | None] | None,
                           budget: Budget | None, jobs: int, whole_maps: dict[str, Any] | None,
                           choice: dict[tuple[int, int], TileChoice],
                           progress: ProgressSink | None = None) -> list[Placement]:
    """The shortest path over the intervals' best tiles and the groups past the size limit
    (block and whole-map groups), as placements."""
    order = [lay.name for lay in graph.layers]
    dag = nx.DiGraph()
    for i, j in sorted(choice):  # in the order of the layers (ties: the first path)
        dag.add_edge(i, j, weight=objective_units(choice[i, j].cost, objective,
                                                  ruleset.objective, chip))
    if budget is not None and budget.passed:
        if searches_long_groups(ruleset):
            budget.cut("groups past search.max_group_layers not searched")
        longer = {}
    else:
        longer = long_groups(graph, chip, ruleset, objective, budget, memo, jobs, whole_maps,
                             progress)
    for layers, best in longer.items():
        i = graph.index(layers[0])  # an interval of the order, longer than the limit
        choice[i, i + len(layers)] = best
        dag.add_edge(i, i + len(layers),
                     weight=objective_units(best.cost, objective, ruleset.objective, chip))
    path = nx.shortest_path(dag, 0, len(order), weight="weight")
    if progress is not None:
        progress(Progress("shortest path", searched=len(choice), best=sum(
            dag[a][b]["weight"] for a, b in zip(path, path[1:], strict=False)),
            unit=_unit(objective)))
    return _tiled_long_groups(graph, chip, ruleset, objective, memo, budget, [
        (tuple(order[a:b]), choice[a, b]) for a, b in zip(path, path[1:], strict=False)])


def _unit(objective: Objective) -> str:
    """The unit of an objective's units, as a Progress event states it."""
    return "B" if objective is Objective.TRAFFIC else objective.value


def _tiled_long_groups(graph: Graph, chip: Chip, ruleset: RuleSet, objective: Objective,
                       memo: dict[tuple[str, ...], TileChoice | None] | None,
                       budget: Budget | None,
                       path: Sequence[tuple[tuple[str, ...], TileChoice]]) -> list[Placement]:
    """The path's groups as placements, each whole-map group (longer than
    search.max_group_layers and not searched as an interval or block: no memo entry) with
    the cheaper of its whole-map choice and its tile search's best. The whole-map search
    tries whole-map tiles only; CP-SAT searches a warm start's groups in full
    (solver.cpsat), so the path does the same for the groups it keeps: lowering the cost of
    a group on the shortest path keeps it the shortest (SSDLite's stem group in passes and
    hidden chunks at 14 rows: 969,510 -> 861,456 B)."""
    limit = ruleset.search.max_group_layers
    out = []
    for layers, choice in path:
        if not graph.within_limit(layers, limit) and (memo is None or layers not in memo) \
                and not (budget is not None and budget.passed):
            tiled = GroupSearch.of(graph, layers, chip, ruleset).best(objective)
            if tiled is not None and objective_units(tiled.cost, objective, ruleset.objective,
                                                     chip) < objective_units(
                    choice.cost, objective, ruleset.objective, chip):
                choice = tiled
            if memo is not None:  # CP-SAT takes it as the group's best (a warm start's)
                memo[layers] = choice
        out.append(choice.placement(layers))
    return out


def _bounded_groups(graph: Graph, chip: Chip, ruleset: RuleSet, objective: Objective,
                    memo: dict[tuple[str, ...], TileChoice | None] | None,
                    budget: Budget | None, jobs: int, whole_maps: dict[str, Any] | None,
                    bounded: set[tuple[str, ...]] | None,
                    progress: ProgressSink | None = None,
                    options_memo: dict[tuple[str, ...], list[Option]] | None = None
                    ) -> list[Placement]:
    """shortest_path_groups over floors (solver.bounded_path): the same candidates (intervals
    up to search.max_group_layers, block groups, whole-map groups), each searched only once
    the path reaches it. Under an objective that counts cycles, floors and searched costs
    are bounds net of prefetch savings and the plan is priced exactly over the searched
    groups (solver.prefetch_path); ``options_memo`` then collects each searched group's
    prefetch options."""
    order = [lay.name for lay in graph.layers]
    floors = IntervalFloors.of(graph, chip)
    whole_maps = {} if whole_maps is None else whole_maps
    done = whole_maps.setdefault("starts", {})  # each whole-map start's groups, once tried
    edges, skipped = _interval_edges(graph, ruleset, floors, memo, budget)
    edges += _block_entry_edges(graph, ruleset, floors, memo, budget)
    if budget is not None and budget.passed:
        if searches_long_groups(ruleset):
            budget.cut("groups past search.max_group_layers not searched")
    else:
        edges += _long_edges(graph, chip, ruleset, floors, memo, budget, whole_maps, done,
                             progress)
    coef = cycle_units(objective, ruleset.objective, chip)
    pricing = TimedPricing(graph, chip, objective, ruleset.objective, coef, tuple(order)) \
        if coef else None

    def price(e: Edge, floor_bytes: int, work: Work | None = None) -> int:
        """A floor in DRAM bytes (and, where known, work) as a floor in objective units."""
        if pricing is None:
            return floor_bytes
        if work is None:
            work = floors.stored_work(e.start, e.end - 1)
        return pricing.note_floor(e, floor_bytes, work)

    if pricing is not None:
        pricing.hide_limits(edges)
        for e in edges:
            e.floor = price(e, e.floor)
        # each round prices the whole line graph: refine every interval at once (cheap, next
        # to the rounds it spares) rather than those each path reaches
        edges = [e for e in edges if e.refined or _refine(graph, chip, ruleset, memo, e, price)]
        for e in edges:
            e.refined = True

    def units(e: Edge) -> int:
        assert e.choice is not None
        if pricing is not None:
            return pricing.bound(e)
        return objective_units(e.choice.cost, objective, ruleset.objective, chip)

    def searched(e: Edge) -> None:
        _searched(ctx, memo, e)
        if options_memo is not None and e.options:
            options_memo[e.layers] = list(e.options)

    ctx = Context(graph, chip, ruleset, objective, pricing is not None,
                  budget.until if budget is not None else None)
    outcome = bounded_path(ctx, edges, len(order), units, jobs, searched,
                           lambda start, groups: done.__setitem__(start, groups),
                           lambda e: _refine(graph, chip, ruleset, memo, e, price), progress,
                           pricing)
    if bounded is not None:  # not a whole-map end its start did not keep: no floor ruled it out
        bounded.update(e.layers for e in edges if not e.searched and e.whole is None)
    if budget is not None and (skipped or outcome.left_out):
        budget.cut(f"tile search: {skipped + outcome.left_out} candidate groups not searched")
    quick = sum(e.quick for e in edges if e.required)
    if quick and budget is not None:
        budget.cut(f"tile search: {quick} single layers tiled by the quick "
                   f"{ruleset.search.tile_search} search")
    if pricing is not None:
        return _priced_path(graph, chip, ruleset, pricing, edges, len(order), memo, budget)
    path = _searched_path(edges, lambda c: objective_units(c.cost, objective, ruleset.objective,
                                                           chip), len(order))
    return _tiled_long_groups(graph, chip, ruleset, objective, memo, budget, [
        (tuple(order[a:b]), choice) for a, b, choice in path])


def _priced_path(graph: Graph, chip: Chip, ruleset: RuleSet, pricing: TimedPricing,
                 edges: Sequence[Edge], end: int,
                 memo: dict[tuple[str, ...], TileChoice | None] | None, budget: Budget | None
                 ) -> list[Placement]:
    """The exactly priced best plan over the searched groups (the bounded path's: every
    other path costs at least its floors), as placements. Its whole-map groups get their
    full tile search's options too, as _tiled_long_groups gives them under the traffic
    objective: an edge of the cheapest path that gets cheaper keeps the path the cheapest."""
    searched = [e for e in edges if e.searched and e.refined and e.choice is not None]
    path = cheapest_pairs(searched, end, pricing)
    assert path is not None  # the bounded path's own path is one
    limit = ruleset.search.max_group_layers
    longer = [e for e, _ in path
              if not graph.within_limit(e.layers, limit)
              and (memo is None or e.layers not in memo)]
    if longer and not (budget is not None and budget.passed):
        for e in longer:
            pricing.widen(e, GroupSearch.of(graph, e.layers, chip, ruleset).options(
                pricing.objective))
        path = cheapest_pairs(searched, end, pricing)
        assert path is not None
    out = []
    for e, c in pricing.steps(path):
        made = c.made
        if isinstance(made, Option):
            made = GroupSearch.of(graph, e.layers, chip, ruleset).option_choice(made)
        # a block or whole-map group (no interval): CP-SAT takes it as the group's best
        if memo is not None and not graph.within_limit(e.layers, limit):
            memo[e.layers] = made
        out.append(made.placement(e.layers))
    return out


def _interval_edges(graph: Graph, ruleset: RuleSet, floors: IntervalFloors,
                    memo: dict[tuple[str, ...], TileChoice | None] | None, budget: Budget | None
                    ) -> tuple[list[Edge], int]:
    """(the edges of the connected intervals up to search.max_group_layers, each at its
    cheap floor, intervals left out past the budget)."""
    order = [lay.name for lay in graph.layers]
    limit = ruleset.search.max_group_layers
    connected = connected_intervals(graph, limit)
    reach = graph.interval_ends(limit)
    edges: list[Edge] = []
    skipped = 0
    for i in range(len(order)):
        ends = [j for j in range(i + 1, reach[i] + 1) if (i, j) in connected]
        for j, floor in zip(ends, floors.floors(i, [j - 1 for j in ends]), strict=True):
            layers = tuple(order[i:j])
            cached = _memo_get(memo, layers)
            if cached is None and j - i > 1:
                continue
            if j - i > 1 and budget is not None and budget.passed \
                    and not isinstance(cached, TileChoice):
                skipped += 1
                continue
            edges.append(_unrefined(i, j, layers, floor, cached))
    return edges, skipped


def _block_entry_edges(graph: Graph, ruleset: RuleSet, floors: IntervalFloors,
                       memo: dict[tuple[str, ...], TileChoice | None] | None,
                       budget: Budget | None) -> list[Edge]:
    """The edges of blocks with their entry layer, one layer past the limit, where they are
    connected intervals of the order."""
    # a block with its entry layer, one layer past the limit: CP-SAT weighs it too
    # (solver.cpsat.candidate_sets), so the path does, for its proof to cover it
    order = [lay.name for lay in graph.layers]
    edges: list[Edge] = []
    limit = ruleset.search.max_group_layers
    for block in graph.blocks:
        # CP-SAT weighs the block with its entry where the block is within the limit: the
        # intervals miss it where the entry takes it past
        if not block.entry or not graph.within_limit(block.layers, limit) \
                or graph.within_limit((block.entry, *block.layers), limit):
            continue
        at = sorted(graph.index(n) for n in (block.entry, *block.layers))
        i, j = at[0], at[-1] + 1
        layers = tuple(order[i:j])
        cached = _memo_get(memo, layers)
        if j - i != len(at) or cached is None or not is_connected(graph, layers) \
                or (budget is not None and budget.passed):
            continue
        edges.append(_unrefined(i, j, layers, floors.floors(i, [j - 1])[0], cached))
    return edges


def _long_edges(graph: Graph, chip: Chip, ruleset: RuleSet, floors: IntervalFloors,
                memo: dict[tuple[str, ...], TileChoice | None] | None, budget: Budget | None,
                whole_maps: dict[str, Any], done: dict[Start, Any],
                progress: ProgressSink | None = None) -> list[Edge]:
    """The edges of the block groups and whole-map groups past search.max_group_layers."""
    edges: list[Edge] = []
    if progress is not None:
        progress(Progress("block groups"))
    for layers, search in block_group_searches(graph, chip, ruleset, budget):
        cached = _memo_get(memo, layers)
        if cached is not None:
            edges.append(_edge(graph, chip, graph.index(layers[0]), search, cached))
    for start in whole_map_starts(graph, chip, ruleset):
        edges += _whole_map_edges(graph, floors, start,
                                  whole_maps.get("groups", done.get(start)))
    return edges


def _refine(graph: Graph, chip: Chip, ruleset: RuleSet,
            memo: dict[tuple[str, ...], TileChoice | None] | None, e: Edge,
            price: Callable[[Edge, int, Work], int] = lambda e, floor_bytes, work: floor_bytes
            ) -> bool:
    """Refine an edge the path reached (bounded_path's ``refine``): False where it breaks a
    structural rule (the memo notes it has no tile), else its io and full floor set
    (``price``: that floor, in DRAM bytes and work, in the path's units)."""
    search = GroupSearch.of(graph, e.layers, chip, ruleset)
    if breaks_structure(search, ruleset):
        if memo is not None:
            memo[e.layers] = None
        return False
    e.io = search.io
    e.floor = max(e.floor, price(e, group_floor_bytes(graph, search.io, search.chains, chip),
                                 made_work(graph, search.io, search.chains)))
    return True


def _searched(ctx: Context, memo: dict[tuple[str, ...], TileChoice | None] | None,
              e: Edge) -> None:
    """Keep a searched edge's tile in the memo (bounded_path's ``searched``)."""
    if e.choice is None and e.required:  # no plan: name the first layer that fits nowhere
        order = [lay.name for lay in ctx.graph.layers]
        raise infeasible_layer_error(ctx.graph, ctx.chip, ctx.ruleset,
                                     _first_misfit(ctx.graph, ctx.chip, ctx.ruleset,
                                                   ctx.objective, order[:e.start + 1]))
    if memo is not None:
        memo[e.layers] = e.choice


def _searched_path(edges: Sequence[Edge], units: Callable[[TileChoice], int], end: int
                   ) -> list[tuple[int, int, TileChoice]]:
    """The shortest path over the searched groups alone, as (start, end, tile) steps."""
    # the path over the searched groups alone costs what the bounded path does (every other
    # path costs at least its floors); as the full search, ties go to the first path
    best: dict[tuple[int, int], TileChoice] = {}
    for e in edges:
        if e.searched and e.refined and e.choice is not None and (
                (e.start, e.end) not in best or units(
                e.choice) < units(best[e.start, e.end])):
            best[e.start, e.end] = e.choice
    dag = nx.DiGraph()
    for i, j in sorted(best):
        dag.add_edge(i, j, weight=units(best[i, j]))
    path = nx.shortest_path(dag, 0, end, weight="weight")
    return [(a, b, best[a, b]) for a, b in zip(path, path[1:], strict=False)]


def _first_misfit(graph: Graph, chip: Chip, ruleset: RuleSet, objective: Objective,
                  names: Sequence[str]) -> str:
    """The first of these layers that fits the chip alone at no tile (the last one does)."""
    seen: dict[StructureKey, bool] = {}
    for name in names[:-1]:
        search = GroupSearch.of(graph, (name,), chip, ruleset)
        key = structure_key(graph, search.io)
        if key not in seen:
            seen[key] = search.best(objective) is None
        if seen[key]:
            return name
    return names[-1]


def _whole_map_edges(graph: Graph, floors: IntervalFloors, start: Start,
                     found: Sequence[tuple[tuple[str, ...], TileChoice]] | None
                     ) -> list[Edge]:
    """A whole-map start's groups: those found (its search done), else every end it may
    keep, each at its floor."""
    i = graph.index(start.layers[0])
    if found is not None:
        return [Edge(i, i + len(layers), layers, None, 0, choice, True)
                for layers, choice in found if layers[0] == start.layers[0]]
    return [Edge(i, i + e + 1, start.layers, None, floor, whole=start)
            for e, floor in zip(start.ends, floors.floors(i, [i + e for e in start.ends]),
                                strict=True)]


def _unrefined(i: int, j: int, layers: tuple[str, ...], floor: int,
               cached: TileChoice | None | object) -> Edge:
    """An interval's edge at its cheap floor (structural rules and the full floor wait for
    a path to reach it), searched already where the memo has its tile."""
    edge = Edge(i, j, layers, None, floor, refined=False)
    if isinstance(cached, TileChoice):
        edge.choice, edge.searched = cached, True
    return edge


def _edge(graph: Graph, chip: Chip, start: int, search: GroupSearch,
          cached: TileChoice | None | object) -> Edge:
    """A candidate's edge: searched already where the memo has its tile, else its floor."""
    edge = Edge(start, start + len(search.layers), search.layers, search.io,
                group_floor_bytes(graph, search.io, search.chains, chip))
    if isinstance(cached, TileChoice):
        edge.choice, edge.searched = cached, True
    return edge


def _with_prefetch(graph: Graph, chip: Chip, ruleset: RuleSet, objective: Objective,
                   order: list[str], options: dict[tuple[int, int], list[Option]]
                   ) -> list[Placement]:
    """Shortest path over the line graph of the intervals' options, each pair of consecutive
    groups priced with its prefetch (solver.prefetch_path, every interval searched)."""
    pricing = TimedPricing(graph, chip, objective, ruleset.objective,
                           cycle_units(objective, ruleset.objective, chip), tuple(order))
    edges = []
    for (i, j), opts in sorted(options.items()):
        if opts:
            search = GroupSearch.of(graph, order[i:j], chip, ruleset)
            edges.append(Edge(i, j, tuple(order[i:j]), search.io, 0,
                              search.option_choice(opts[0]), True, options=tuple(opts)))
    pricing.hide_limits(edges)
    return _priced_path(graph, chip, ruleset, pricing, edges, len(order), None, None)
