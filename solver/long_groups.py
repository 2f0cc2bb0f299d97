"""Groups longer than ``search.max_group_layers``: block groups and whole-map chains.

A group whose one tile holds whole maps recomputes nothing, and with its weights streamed
layer by layer (planner.cost.weight_stream) it reads every weight once while its feature
maps never leave the chip: SoMa's schedule. Such groups may be far longer than the size
limit that bounds the tile-variable candidates (a ResNet-50 stage is 30 layers, the whole
network 120), so they get their own candidates, pinned at the whole-map tile:

* they span the topological order between **single-tensor cuts** (positions that exactly
  one tensor crosses), where a group boundary costs one tensor's store and load;
* each start is extended cut by cut while a cheap bound -- the largest input-plus-output of
  one layer, which every tile of a group holding that layer needs -- fits the chip, so
  the search stops at the first layer whose maps cannot be on chip together;
* of the ends that pass the rules and the chip's capacities, the longest (among the few
  longest ends) and those whose crossing tensor is among the smallest are kept (a
  traffic-minimal plan of whole-map groups pays only its cuts: their tensors are what it
  chooses between).

**Block groups** are tiled ones: a group from one single-tensor cut to a later one (whole
residual blocks, a stage's bottlenecks in pairs or threes) gets the full tile search (row
tiles, halo reuse, weights resident or streamed) up to ``search.max_block_group_layers``
layers. Only cut-to-cut intervals past the size limit are added, a few per cut, so a
deep network pays a handful of long searches, shared by repeated blocks
(solver.structure), rather than one for every interval of that length.
"""

from __future__ import annotations

from collections.abc import Iterator

from hardware.chip import Chip
from planner.core.budget import Budget
from planner.cost.objective import Objective, objective_units
from planner.geometry.halo_reuse import lifetimes
from planner.geometry.regions import group_io
from planner.ir.graph import Graph
from rules.ruleset import RuleSet
from solver.groups import breaks_structure, is_connected, is_convex
from solver.parallel import Context, Task, looked_up, search_all
from solver.structure import StructureKey, structure_key
from solver.tiles import GroupSearch, TileChoice

SMALL_CUTS = 3  # ends kept per start besides the longest: the cheapest cuts before it
TRIES = 4  # longest ends tried per start before giving the start up


def single_cuts(graph: Graph) -> list[int]:
    """Positions p of the topological order such that exactly one tensor produced at or
    before p (or a model input) is read after p."""
    order = [lay.name for lay in graph.layers]
    # the whole model as one group: a tensor is on chip from its step to its last use
    # (the model outputs to past the end)
    spans = lifetimes(graph, group_io(graph, order))
    crossing = [0] * len(order)
    for b, last in spans.values():
        for p in range(max(b, 0), last):
            crossing[p] += 1
    return [p for p in range(len(order) - 1) if crossing[p] == 1]


def _layer_floor_bytes(graph: Graph, name: str, dtype_bytes: int) -> int:
    """Bytes a whole-map tile holds while this layer runs: all its inputs and outputs."""
    lay = graph.layer(name)
    tensors = {*lay.fmap_inputs, *(t for t in lay.outputs if t)}
    return sum(graph.elems(t) for t in tensors if t in graph.shapes) * dtype_bytes


def _capacity(chip: Chip) -> int:
    """Feature-map bytes one tile may hold at most (SRAM, and NRAM across a cluster)."""
    cap = chip.sram.bytes
    if chip.nram is not None:
        cap = min(cap, chip.nram.bytes * chip.cores_per_cluster)
    return cap


def _whole_map_choice(search: GroupSearch, objective: Objective) -> TileChoice | None:
    """The best whole-map tile (images per tile largest first) that passes every rule and
    fits the chip, weights resident or streamed."""
    ruleset, chip = search.ruleset, search.chip
    for tn in search.batch_options():
        at = search.at_batch(tn)
        tile = at.tile_of(at.heights()[0])
        found = []
        for resident in (True, False):
            if not at.violations(tile, resident):
                found.append(at.choice(tile, resident, at.fits_double_buffer(tile, resident)))
        if found:
            return min(found, key=lambda c: objective_units(c.cost, objective,
                                                            ruleset.objective, chip))
    return None


def long_groups(graph: Graph, chip: Chip, ruleset: RuleSet, objective: Objective,
                budget: Budget | None = None,
                memo: dict[tuple[str, ...], TileChoice | None] | None = None, jobs: int = 1,
                whole_maps: dict[str, list[tuple[tuple[str, ...], TileChoice]]] | None = None
                ) -> dict[tuple[str, ...], TileChoice]:
    """Groups longer than ``search.max_group_layers`` (block groups and whole-map groups),
    each with its best tile choice; where both kinds cover one interval, the cheaper. Block
    groups stop being searched once the ``budget`` has passed; ``memo`` (the planners'
    interval tiles) keeps their best tiles for a second planner on the same objective; their
    searches run on up to ``jobs`` processes (solver.parallel). ``whole_maps`` keeps the
    whole-map groups (under "groups") for a second planner on the same graph and
    objective."""
    found = dict(block_groups(graph, chip, ruleset, objective, budget, memo, jobs))
    whole_maps = {} if whole_maps is None else whole_maps
    if "groups" not in whole_maps:
        whole_maps["groups"] = list(whole_map_groups(graph, chip, ruleset, objective))
    for layers, choice in whole_maps["groups"]:
        if layers not in found or _units(choice, objective, ruleset, chip) \
                < _units(found[layers], objective, ruleset, chip):
            found[layers] = choice
    return found


def searches_long_groups(ruleset: RuleSet) -> bool:
    """Whether the rules ask for any group longer than ``search.max_group_layers``."""
    search = ruleset.search
    return search.long_whole_map_groups or search.max_block_group_layers > search.max_group_layers


def _units(choice: TileChoice, objective: Objective, ruleset: RuleSet, chip: Chip) -> int:
    return objective_units(choice.cost, objective, ruleset.objective, chip)


def block_groups(graph: Graph, chip: Chip, ruleset: RuleSet, objective: Objective,
                 budget: Budget | None = None,
                 memo: dict[tuple[str, ...], TileChoice | None] | None = None, jobs: int = 1
                 ) -> Iterator[tuple[tuple[str, ...], TileChoice]]:
    """Tiled groups from one single-tensor cut to a later one, longer than
    ``search.max_group_layers`` and at most ``search.max_block_group_layers`` layers, with
    their best tile (structure-shared searches, on up to ``jobs`` processes).

    A run of adjacent cuts (a residual Add, then its ReLU) ends a block group at its last
    cut and starts one after it: the layers between stay with the block they close."""
    limit, most = ruleset.search.max_group_layers, ruleset.search.max_block_group_layers
    if most <= limit:
        return
    order = [lay.name for lay in graph.layers]
    cuts = set(single_cuts(graph))
    last = [p for p in sorted(cuts) if p + 1 not in cuts]  # the last cut of each run
    starts, ends = [0, *(p + 1 for p in last)], [*last, len(order) - 1]
    spans = [(a, e + 1) for a in starts for e in ends if limit < e + 1 - a <= most]
    # each group: the memo's tile (searched by a planner before this one) or the structure
    # its search shares
    rows: list[tuple[tuple[str, ...], TileChoice | StructureKey | None]] = []
    tasks: dict[StructureKey, Task] = {}
    for k, (a, b) in enumerate(spans):
        if budget is not None and budget.passed:
            budget.cut(f"block groups: {len(spans) - k} not searched")
            break
        group = tuple(order[a:b])
        if not (is_connected(graph, group) and is_convex(graph, group)):
            continue
        search = GroupSearch.of(graph, group, chip, ruleset)
        if breaks_structure(search, ruleset):  # checked again: this graph's blocks
            continue
        if memo is not None and group in memo:
            rows.append((group, memo[group]))
        else:
            key = structure_key(graph, search.io)
            tasks.setdefault(key, Task(group))
            rows.append((group, key))
    ctx = Context(graph, chip, ruleset, objective, False,
                  budget.until if budget is not None else None)
    found = dict(zip(tasks, search_all(ctx, list(tasks.values()), jobs), strict=True))
    left_out = 0
    for group, what in rows:
        result = looked_up(what, found)
        if result is None:  # past the budget: not searched
            left_out += 1
            continue
        if memo is not None:
            memo[group] = result.best
        if result.best is not None:
            yield group, result.best
    if left_out and budget is not None:
        budget.cut(f"block groups: {left_out} not searched")


def whole_map_groups(graph: Graph, chip: Chip, ruleset: RuleSet, objective: Objective
                     ) -> Iterator[tuple[tuple[str, ...], TileChoice]]:
    """Whole-map groups longer than ``search.max_group_layers``, with their tile choice."""
    if not ruleset.search.long_whole_map_groups:
        return
    order = [lay.name for lay in graph.layers]
    limit = ruleset.search.max_group_layers
    cuts = single_cuts(graph)
    ends = [*cuts, len(order) - 1]
    floor = [_layer_floor_bytes(graph, n, chip.dtype_bytes) for n in order]
    cap = _capacity(chip)
    crossing_bytes = {p: _cut_bytes(graph, order, p, chip.dtype_bytes) for p in cuts}
    for start in [0, *(p + 1 for p in cuts)]:
        reach = [e for e in ends if e >= start]
        # extend while the cheap bound fits: the first layer over it ends every longer group
        worst = start
        fitting = []
        for e in reach:
            while worst <= e and floor[worst] <= cap:
                worst += 1
            if worst <= e:
                break
            if e - start + 1 > limit:
                fitting.append(e)
        if not fitting:
            continue
        longest = None
        # the longest end that passes the real checks, among the few longest: what fails
        # there (a rule on whole maps, a capacity) mostly fails for every shorter end too
        for e in list(reversed(fitting))[:TRIES]:
            found = _choice(graph, chip, ruleset, objective, order[start:e + 1])
            if found is not None:
                longest = e
                yield found
                break
        if longest is None:
            continue
        cheap = sorted((e for e in fitting if e < longest), key=lambda e: crossing_bytes[e])
        for e in cheap[:SMALL_CUTS]:
            found = _choice(graph, chip, ruleset, objective, order[start:e + 1])
            if found is not None:
                yield found


def _cut_bytes(graph: Graph, order: list[str], p: int, dtype_bytes: int) -> int:
    """Bytes of the one tensor crossing cut p (the output of the layer at p, usually)."""
    outs = [t for t in graph.layer(order[p]).outputs if t]
    return graph.elems(outs[0]) * dtype_bytes if outs else 0


def _choice(graph: Graph, chip: Chip, ruleset: RuleSet, objective: Objective,
            layers: list[str]) -> tuple[tuple[str, ...], TileChoice] | None:
    group = tuple(layers)
    if not (is_connected(graph, group) and is_convex(graph, group)):
        return None
    search = GroupSearch.of(graph, group, chip, ruleset)
    if breaks_structure(search, ruleset):
        return None
    choice = _whole_map_choice(search, objective)
    return None if choice is None else (tuple(search.layers), choice)
