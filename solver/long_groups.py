"""Groups longer than ``search.max_group_layers``: block groups and whole-map chains.

A group whose one tile holds whole maps recomputes nothing, and with its weights streamed
layer by layer (planner.cost.weight_stream) it reads every weight once while its feature
maps never leave the chip: SoMa's schedule. Such groups may be far longer than the size
limit that bounds the tile-variable candidates (a ResNet-50 stage is 30 layers, the whole
network 120), so they get their own candidates, pinned at the whole-map tile:

* they span the topological order between **single-tensor cuts** (positions that exactly
  one tensor crosses), where a group boundary costs one tensor's store and load; a long
  skip (a tensor read further on than any tiled group reaches: a segmentation head's
  low-level features) crosses every position it passes, so the cuts are taken both with
  and without counting such tensors;
* each start is extended cut by cut while a cheap bound -- the largest input-plus-output of
  one layer, which every tile of a group holding that layer needs (a map the group may
  hold in hidden chunks counted as its smallest chunk; for a layer that widens or narrows
  a stretch, the least of the ways it can run) -- fits the chip, so the search stops at
  the first layer whose maps cannot be on chip together (solver.whole_starts);
* of the ends that pass the rules and the chip's capacities, the longest (among the few
  longest ends, else by bisection over the shorter ones) and those whose crossing tensor
  is among the smallest are kept (a traffic-minimal plan of whole-map groups pays only its
  cuts: their tensors are what it chooses between);
* a group whose maps do not fit whole runs its stretches in hidden chunks, or in passes
  around its pools with hidden chunks in every pass.

**Block groups** are tiled ones: a group from one single-tensor cut to a later one (whole
residual blocks, a stage's bottlenecks in pairs or threes) gets the full tile search (row
tiles, halo reuse, weights resident or streamed) up to ``search.max_block_group_layers``
layers. Only cut-to-cut intervals past the size limit are added, a few per cut, so a
deep network pays a handful of long searches, shared by repeated blocks
(solver.structure), rather than one for every interval of that length.
"""

from __future__ import annotations

import time
from bisect import bisect_left, bisect_right
from collections.abc import Iterator, Sequence
from functools import partial
from typing import Any

from fuseplan.hardware.chip import Chip
from fuseplan.planner.core.budget import Budget
from fuseplan.planner.core.progress import ProgressSink, ticker
from fuseplan.planner.cost.model import weight_bytes
from fuseplan.planner.cost.objective import Objective, objective_units
from fuseplan.planner.geometry.attention import fused_attention
from fuseplan.planner.geometry.halo_reuse import lifetimes
from fuseplan.planner.geometry.regions import Tile, group_io
from fuseplan.planner.ir.graph import Graph
from fuseplan.planner.plan.mode import Mode
from fuseplan.rules.base import StructuralRule
from fuseplan.rules.ruleset import RuleSet
from fuseplan.solver.bisect import first_passing
from fuseplan.solver.groups import breaks_structure, is_connected, is_convex
from fuseplan.solver.hidden import HiddenSearch
from fuseplan.solver.parallel import Context, Task, looked_up, map_all, search_all
from fuseplan.solver.passes import PassSearch
from fuseplan.solver.structure import StructureKey, structure_key
from fuseplan.solver.tiles import GroupSearch, TileChoice
from fuseplan.solver.whole_starts import Start, StartBounds

SMALL_CUTS = 3  # ends kept per start besides the longest: the cheapest cuts before it
TRIES = 4  # longest ends tried per start before bisecting the shorter ones
BISECTIONS = 3  # shorter ends checked by bisection where the TRIES longest all fail


def single_cuts(graph: Graph, bypass: int | None = None) -> list[int]:
    """Positions p of the topological order such that exactly one tensor produced at or
    before p (or a model input) is read after p, not counting a tensor read more than
    `bypass` positions after it is made: a long skip (a segmentation head's low-level
    features, a detector's early output) passes every group between by, it is no boundary
    of theirs."""
    return _cuts_of(_model_lifetimes(graph), len(graph.layers), bypass)


def _model_lifetimes(graph: Graph) -> list[tuple[int, int]]:
    """(first, last) step of every tensor with the whole model as one group: a tensor is on
    chip from its step to its last use (the model outputs to past the end)."""
    order = [lay.name for lay in graph.layers]
    return list(lifetimes(graph, group_io(graph, order)).values())


def _counted(spans: Sequence[tuple[int, int]], bypass: int | None
             ) -> Iterator[tuple[int, int]]:
    """The lifetimes a cut counts: all but the skips longer than `bypass`."""
    return ((max(b, 0), last) for b, last in spans
            if bypass is None or last - max(b, 0) <= bypass)


def _cuts_of(spans: Sequence[tuple[int, int]], layers: int, bypass: int | None) -> list[int]:
    """single_cuts from the model's tensor lifetimes."""
    crossing = [0] * layers
    for b, last in _counted(spans, bypass):
        for p in range(b, last):
            crossing[p] += 1
    return [p for p in range(layers - 1) if crossing[p] == 1]


def _join_cuts(spans: Sequence[tuple[int, int]], layers: int, bypass: int,
               joins: frozenset[int]) -> list[int]:
    """The positions of `joins` where the next layer reads last every tensor crossing (one
    at least), skips longer than `bypass` not counted."""
    crossing = dict.fromkeys(joins, 0)
    ending = dict.fromkeys(joins, 0)
    for b, last in _counted(spans, bypass):
        for p in joins:
            if b <= p < last:
                crossing[p] += 1
                ending[p] += last == p + 1
    return [p for p in sorted(joins) if 0 <= p < layers - 1 and crossing[p] == ending[p] > 0]


def _bypasses(ruleset: RuleSet) -> list[int | None]:
    """The long-skip cut-offs cut sets are taken at (cut_sets): none, the block limit, then
    the shorter multiples of ``search.max_group_layers`` longest first."""
    search = ruleset.search
    step, most = search.max_group_layers, max(search.max_block_group_layers,
                                               search.max_group_layers)
    return [None, most, *reversed(range(step, most, step))]


def cut_sets(graph: Graph, ruleset: RuleSet) -> list[list[int]]:
    """The single cuts the long groups span between: every tensor counted, and (where that
    gives others) long skips not counted. Both: the groups between the first are not all
    between the second (a run of adjacent cuts ends a block group at its last).

    A long skip is read further on than a group reaches, and which groups reach how far is
    the searcher's choice: the skips are left out at every multiple of
    ``search.max_group_layers`` below ``search.max_block_group_layers`` and at that limit
    itself, so raising the limit only adds cuts (with the limit's skips alone, a detector's
    heads lost the cut their best block group ends at once the limit reached past it)."""
    return [cuts for cuts, _ in _cut_and_join_sets(graph, ruleset)]


def _cut_and_join_sets(graph: Graph, ruleset: RuleSet) -> list[tuple[list[int], list[int]]]:
    """cut_sets, each with the join cuts: the positions just before a fused attention where
    every tensor crossing is one the attention reads last, or a skip longer than
    ``search.max_group_layers`` (the block's residual stream, read by the residual add
    past the attention). A group ending there stores what the attention reads anyway, its
    q, k and v, as a group ending at a single cut stores its one tensor: a decoder's norm,
    projections and rotary embeddings end there, where no single tensor crosses. The same
    for every cut set: each set's starts may end at them."""
    spans, layers = _model_lifetimes(graph), len(graph.layers)  # once for every cut-off
    joins = frozenset(graph.index(lay.name) - 1 for lay in graph.layers if fused_attention(lay))
    joined = _join_cuts(spans, layers, ruleset.search.max_group_layers, joins)
    out: list[tuple[list[int], list[int]]] = []
    # the limit's own skips first, then the shorter cut-offs longest first: the spans they
    # add come after those the limit alone gives, which a time limit reaches first
    for bypass in _bypasses(ruleset):
        cuts = _cuts_of(spans, layers, bypass)
        if bypass is None or all(cuts != c for c, _ in out):
            out.append((cuts, joined))
    return out


def whole_map_choice(search: GroupSearch, objective: Objective) -> TileChoice | None:
    """The best whole-map tile (images per tile largest first) that passes every rule and
    fits the chip, weights resident or streamed; where none does whole, the same tile with
    its stretches in hidden chunks, or run in passes around its pools (each pass's
    stretches in hidden chunks), the fewest chunks that fit and pass."""
    ruleset, chip = search.ruleset, search.chip
    for tn in search.batch_options():
        at = search.at_batch(tn)
        tile = at.tile_of(at.heights()[0])
        found = []
        for resident in (True, False):
            if not at.violations(tile, resident):
                found.append(at.choice(tile, Mode.of(
                    resident=resident, double_buffered=at.fits_double_buffer(tile, resident))))
        if not found and ruleset.search.hidden_chunks:
            found = _chunked_choices(at, tile)
        if found:
            return min(found, key=lambda c: objective_units(c.cost, objective,
                                                            ruleset.objective, chip))
    if ruleset.search.pooling_passes:
        return next(iter(_pass_choices(search)), None)
    return None


def _chunked_choices(at: GroupSearch, tile: Tile) -> list[TileChoice]:
    """The whole-map tile with the group's stretches in their fewest hidden chunks, weights
    resident or streamed (solver.hidden)."""
    hidden = HiddenSearch.of(at.graph, at.layers, at.chip, (at.io, at.chains))
    if hidden is None:
        return []
    rules = at.chosen_rules(None)
    out = []
    for resident in (True, False):
        k = hidden.fewest_chunks(tile, resident, False, rules)
        if k is not None:
            out.append(TileChoice(tile, Mode.of(resident=resident, hidden_chunks=k),
                                  hidden.cost(tile, resident, False, k)))
    return out


def _pass_choices(search: GroupSearch) -> list[TileChoice]:
    """The whole-map tile run in passes around the group's pools, each pass's stretches in
    their fewest hidden chunks (solver.passes): its inputs held on chip for every pass (they
    are read once), or where they cannot be, its pooled maps held for the later passes
    (nothing before them is computed again), or neither."""
    rules = search.chosen_rules(None)
    whole = search.facts(Tile(1, 1, 1), True)
    for held, maps in ((True, False), (False, True), (False, False)):
        passes = PassSearch.of(search.graph, search.layers, search.chip, held, maps)
        if passes is None:
            if maps:
                continue
            return []
        th = passes.heights()[0]
        options = [1, *passes.chunk_options()] if search.ruleset.search.hidden_chunks else [1]
        k = first_passing(options, partial(passes.allowed, th, False, rules=rules,
                                           whole=whole))
        if k is not None:
            mode = Mode.of(passes=passes.split.count, inputs_held=held, hidden_chunks=k,
                           maps_held=maps)
            return [TileChoice(passes.tile_of(th), mode, passes.cost(th, False, k))]
    return []


def long_groups(graph: Graph, chip: Chip, ruleset: RuleSet, objective: Objective,
                budget: Budget | None = None,
                memo: dict[tuple[str, ...], TileChoice | None] | None = None, jobs: int = 1,
                whole_maps: dict[str, Any] | None = None, progress: ProgressSink | None = None
                ) -> dict[tuple[str, ...], TileChoice]:
    """Groups longer than ``search.max_group_layers`` (block groups and whole-map groups),
    each with its best tile choice; where both kinds cover one interval, the cheaper. Block
    groups stop being searched once the ``budget`` has passed; ``memo`` (the planners'
    interval tiles) keeps their best tiles for a second planner on the same objective; their
    searches run on up to ``jobs`` processes (solver.parallel). ``whole_maps`` keeps the
    whole-map groups (under "groups") for a second planner on the same graph and
    objective, and each start's (under "starts": a bounded path searches only some).
    ``progress``: told of both searches (planner.core.progress)."""
    found = dict(block_groups(graph, chip, ruleset, objective, budget, memo, jobs, progress))
    whole_maps = {} if whole_maps is None else whole_maps
    if "groups" not in whole_maps:
        whole_maps["groups"] = whole_map_groups(graph, chip, ruleset, objective, jobs, budget,
                                                whole_maps.setdefault("starts", {}), progress)
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
                 memo: dict[tuple[str, ...], TileChoice | None] | None = None, jobs: int = 1,
                 progress: ProgressSink | None = None
                 ) -> Iterator[tuple[tuple[str, ...], TileChoice]]:
    """Tiled groups from one single-tensor cut to a later one, longer than
    ``search.max_group_layers`` and at most ``search.max_block_group_layers`` layers, with
    their best tile (structure-shared searches, on up to ``jobs`` processes).

    A run of adjacent cuts (a residual Add, then its ReLU) ends a block group at its last
    cut and starts one after it: the layers between stay with the block they close."""
    # each group: the memo's tile (searched by a planner before this one) or the structure
    # its search shares
    rows: list[tuple[tuple[str, ...], TileChoice | StructureKey | None]] = []
    tasks: dict[StructureKey, Task] = {}
    for group, search in block_group_searches(graph, chip, ruleset, budget):
        if memo is not None and group in memo:
            rows.append((group, memo[group]))
        else:
            key = structure_key(graph, search.io)
            tasks.setdefault(key, Task(group))
            rows.append((group, key))
    ctx = Context(graph, chip, ruleset, objective, False,
                  budget.until if budget is not None else None)
    tick = ticker(progress, "block groups", len(tasks), searches=True) if tasks else None
    found = dict(zip(tasks, search_all(ctx, list(tasks.values()), jobs, tick=tick),
                     strict=True))
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


def block_spans(graph: Graph, ruleset: RuleSet) -> list[tuple[int, int]]:
    """The block groups' spans [a, b) of the layer order: from one single-tensor cut to a
    later one, longer than the intervals of ``search.max_group_layers`` (Graph.within_limit)
    and at most ``search.max_block_group_layers`` layers.

    A run of adjacent cuts (a residual Add, then its ReLU) ends a block group at its last
    cut and starts one after it: the layers between stay with the block they close. A run
    longer than any block group is a plain chain (VGG, a deep stack of convs): there every
    cut before a main layer bounds a block too, so its convs group with their activations
    (with the run's last cut only, such a chain had no block group at all); from each
    start inside it the longest block only (a chain's groups are best as long as they
    fit, and every length would double a VGG's searches)."""
    limit, most = ruleset.search.max_group_layers, ruleset.search.max_block_group_layers
    if most <= limit:
        return []
    order = [lay.name for lay in graph.layers]
    spans: dict[tuple[int, int], None] = {}
    for cuts, joined in _cut_and_join_sets(graph, ruleset):
        bounds, inner = _block_bounds(graph, sorted(cuts), most)
        # a join cut ends a group whatever cuts are next to it (after the attention its
        # output alone crosses: a run of cuts), and starts none (the attention's own group
        # starts at the one before it)
        starts = [0, *(p + 1 for p in bounds)]
        ends = sorted({*bounds, *joined, len(order) - 1})
        reach = graph.interval_ends(limit)  # the intervals' (views ride along free)
        for a in starts:
            lo, hi = bisect_left(ends, reach[a]), bisect_right(ends, a + most - 1)
            spans.update(((a, e + 1), None) for e in ends[lo:hi]
                         if e not in inner and a - 1 not in inner)
            if lo < hi:
                spans[a, ends[hi - 1] + 1] = None
    return list(spans)


def _block_bounds(graph: Graph, cuts: list[int], most: int) -> tuple[list[int], set[int]]:
    """The cuts a block may end at (sorted): the last of each run of adjacent cuts, and in
    a run no block spans (`most` layers or more), each cut followed by a main layer (those
    inner ones again)."""
    out: list[int] = []
    inner: set[int] = set()
    run: list[int] = []
    for p in [*cuts, None]:
        if run and (p is None or p != run[-1] + 1):
            if len(run) >= most:
                inner.update(q for q in run[:-1] if graph.layers[q + 1].is_main)
                out += sorted(inner.intersection(run))
            out.append(run[-1])
            run = []
        if p is not None:
            run.append(p)
    return out, inner


def block_group_searches(graph: Graph, chip: Chip, ruleset: RuleSet,
                         budget: Budget | None = None
                         ) -> Iterator[tuple[tuple[str, ...], GroupSearch]]:
    """The block groups worth a search (block_groups): connected, convex, breaking no
    structural rule; once the ``budget`` has passed, none more (the budget notes how many
    were left)."""
    order = [lay.name for lay in graph.layers]
    spans = block_spans(graph, ruleset)
    for k, (a, b) in enumerate(spans):
        if budget is not None and budget.passed:
            budget.cut(f"block groups: {len(spans) - k} not searched")
            return
        group = tuple(order[a:b])
        if not (is_connected(graph, group) and is_convex(graph, group)):
            continue
        search = GroupSearch.of(graph, group, chip, ruleset)
        if not breaks_structure(search, ruleset):  # checked again: this graph's blocks
            yield group, search


def whole_map_groups(graph: Graph, chip: Chip, ruleset: RuleSet, objective: Objective,
                     jobs: int = 1, budget: Budget | None = None,
                     done: dict[Start, list[tuple[tuple[str, ...], TileChoice]]] | None = None,
                     progress: ProgressSink | None = None
                     ) -> list[tuple[tuple[str, ...], TileChoice]]:
    """Whole-map groups longer than ``search.max_group_layers``, with their tile choice
    (each start's ends searched on up to ``jobs`` processes; a start not begun once the
    ``budget`` has passed is left out; a start in ``done`` is not searched again)."""
    starts = whole_map_starts(graph, chip, ruleset)
    done = {} if done is None else done
    todo = [s for s in starts if s not in done]
    ctx = Context(graph, chip, ruleset, objective, False,
                  budget.until if budget is not None else None)
    tick = ticker(progress, "whole-map groups", len(todo), searches=True) if todo else None
    found = map_all(ctx, start_groups, todo, jobs, [len(s.layers) for s in todo], tick=tick)
    if budget is not None and None in found:
        budget.cut(f"whole-map groups: {found.count(None)} starts not searched")
    done.update((s, groups) for s, groups in zip(todo, found, strict=True) if groups is not None)
    out: dict[tuple[str, ...], TileChoice] = {}
    for start in starts:
        for layers, choice in done.get(start, []):
            out.setdefault(layers, choice)
    return list(out.items())


def whole_map_starts(graph: Graph, chip: Chip, ruleset: RuleSet) -> list[Start]:
    """Every start of a whole-map group and its ends worth trying (none where the rules ask
    for no such groups), with only the ends every structural rule that can tell from the
    layers alone allows (StructuralRule.span_filter); a start left with none is dropped."""
    if not ruleset.search.long_whole_map_groups:
        return []
    allowed = [f for r in ruleset.enabled if isinstance(r, StructuralRule)
               and (f := r.span_filter(graph)) is not None]
    starts: list[Start] = []
    seen: set[Start] = set()
    bounds = StartBounds.of(graph, chip, ruleset)
    for cuts in cut_sets(graph, ruleset):
        for s in bounds.starts(cuts, allowed):
            if s not in seen:
                seen.add(s)
                starts.append(s)
    return starts


def start_groups(ctx: Context, start: Start
                 ) -> list[tuple[tuple[str, ...], TileChoice]] | None:
    """The longest end from one start that passes the real checks: among the TRIES longest
    (what fails there, a rule on whole maps or a capacity, mostly fails for every shorter
    end too), else by bisection over the shorter ends (at most BISECTIONS more checks: the
    capacities and the rules bound the whole-map tile harder the longer the group); then
    SMALL_CUTS shorter ends whose crossing tensor is smallest. None: past the time limit,
    not searched."""
    if ctx.until is not None and time.perf_counter() >= ctx.until:
        return None

    def check(e: int) -> tuple[tuple[str, ...], TileChoice] | None:
        return _choice(ctx.graph, ctx.chip, ctx.ruleset, ctx.objective, start.layers[:e + 1])

    longest, found = None, None
    for e in list(reversed(start.ends))[:TRIES]:
        found = check(e)
        if found is not None:
            longest = e
            break
    rest = list(start.ends[:-TRIES])  # shorter than every end tried, shortest first
    lo, hi = 0, len(rest) - 1
    for _ in range(BISECTIONS if longest is None else 0):
        if lo > hi:
            break
        mid = (lo + hi + 1) // 2
        here = check(rest[mid])
        if here is not None:
            longest, found, lo = rest[mid], here, mid + 1
        else:
            hi = mid - 1
    if longest is None or found is None:
        return []
    out = [found]
    if _rereads_weights(ctx, found):
        # longer is not better here: a tile of a few images streams the weights again for
        # every tile. Holding them resident has the one bound that grows with the length
        # (the weight memory), so bisect for the longest end that keeps them
        lo, hi = 0, start.ends.index(longest) - 1
        for _ in range(hi.bit_length()):
            if lo > hi:
                break
            mid = (lo + hi + 1) // 2
            here = check(start.ends[mid])
            if here is not None and here[1].resident:
                out.append(here)
                lo = mid + 1
            else:
                hi = mid - 1
    for e in [e for e in start.cheap if e < longest][:SMALL_CUTS]:
        if (shorter := check(e)) is not None:
            out.append(shorter)
    return out


def _rereads_weights(ctx: Context, found: tuple[tuple[str, ...], TileChoice]) -> bool:
    """Whether a whole-map choice streams its weights once per tile of several."""
    layers, choice = found
    if choice.resident:
        return False
    weights = {w for n in layers for w in ctx.graph.layer(n).weights}
    return choice.cost.weight_read_bytes > weight_bytes(ctx.graph, weights, ctx.chip)


def _choice(graph: Graph, chip: Chip, ruleset: RuleSet, objective: Objective,
            layers: Sequence[str]) -> tuple[tuple[str, ...], TileChoice] | None:
    group = tuple(layers)
    if not (is_connected(graph, group) and is_convex(graph, group)):
        return None
    search = GroupSearch.of(graph, group, chip, ruleset)
    if breaks_structure(search, ruleset):
        return None
    choice = whole_map_choice(search, objective)
    return None if choice is None else (tuple(search.layers), choice)
