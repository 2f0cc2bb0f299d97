"""Greedy planner: build template fusion units one at a time by the rules.

Pick a start layer by the start rule, grow the group in the configured
direction (whole blocks first when that rule is on) while every rule that a
larger group cannot repair still holds and a tile still fits, then keep the
largest state in which every rule held. The tile comes from the greedy tile search
(``search.tile_search``: large -> small, or small -> large).
"""

from __future__ import annotations

from collections.abc import Sequence

from fuseplan.hardware.chip import Chip
from fuseplan.planner.core.progress import Progress, ProgressSink, due, stride
from fuseplan.planner.ir.graph import Graph
from fuseplan.planner.plan.placement import Placement
from fuseplan.rules.ruleset import RuleSet
from fuseplan.solver.groups import is_connected, is_convex
from fuseplan.solver.shortest_path import infeasible_layer_error
from fuseplan.solver.tiles import GroupSearch, TileChoice


class _Grower:
    def __init__(self, graph: Graph, chip: Chip, ruleset: RuleSet) -> None:
        self.graph, self.chip, self.ruleset = graph, chip, ruleset
        self.growing = tuple(r for r in ruleset.enabled if not r.final_only)
        self.how = ruleset.search.tile_search
        self.searches = 0  # tile searches run (what a progress sink is told)

    def can_grow(self, layers: Sequence[str]) -> bool:
        if not self.graph.within_limit(layers, self.ruleset.search.max_group_layers):
            return False
        if not is_connected(self.graph, layers) or not is_convex(self.graph, layers):
            return False
        self.searches += 1
        search = GroupSearch.of(self.graph, layers, self.chip, self.ruleset)
        return search.search(self.how, self.growing) is not None

    def finish(self, layers: Sequence[str]) -> TileChoice | None:
        self.searches += 1
        return GroupSearch.of(self.graph, layers, self.chip, self.ruleset).search(self.how)


def _rule_setting(ruleset: RuleSet, key: str, field: str, default: str) -> str:
    r = ruleset.get(key)
    return str(getattr(r, field)) if r.enabled else default


def greedy_groups(graph: Graph, chip: Chip, ruleset: RuleSet,
                  progress: ProgressSink | None = None) -> list[Placement]:
    """Groups in the order the greedy planner forms them, each with its tile; ``progress``:
    told how many layers are placed (planner.core.progress)."""
    grower = _Grower(graph, chip, ruleset)
    total = len(graph.layers)
    every = stride(total)
    if progress is not None:
        progress(Progress("greedy", 0, total))
    start_mode = _rule_setting(ruleset, "start_rule", "start", "first_unfused")
    direction = _rule_setting(ruleset, "direction", "direction", "backward")
    blocks_first = ruleset.get("blocks_first").enabled
    unfused = [lay.name for lay in graph.layers]
    result: list[Placement] = []
    while unfused:
        start = unfused[0]
        if start_mode == "first_main":
            start = next((n for n in unfused if graph.layer(n).is_main), start)
        group = [start]
        valid: tuple[list[str], TileChoice] | None = None
        if direction == "forward_first":
            for prev in reversed(unfused[:unfused.index(start)]):
                if not grower.can_grow(group + [prev]):
                    break
                group.append(prev)
        while True:
            done = grower.finish(group)
            if done is not None:
                valid = (list(group), done)
            rest = [n for n in unfused if n not in group
                    and graph.index(n) > max(graph.index(g) for g in group)]
            if not rest:
                break
            grown = _next_step(graph, group, rest, blocks_first, grower)
            if grown is None:
                break
            group = grown
        if valid is None:
            alone = grower.finish([start])
            if alone is None:
                raise infeasible_layer_error(graph, chip, ruleset, start)
            valid = ([start], alone)
        members, chosen = valid
        result.append(chosen.placement(tuple(sorted(members, key=graph.index))))
        unfused = [n for n in unfused if n not in members]
        placed = total - len(unfused)
        if progress is not None and (due(placed, total, every) or placed % every < len(members)):
            progress(Progress("greedy", placed, total, grower.searches))
    return result


def _next_step(graph: Graph, group: list[str], rest: list[str], blocks_first: bool,
               grower: _Grower) -> list[str] | None:
    """The group grown by a whole block (if one starts next) or else by the next layer."""
    nxt = rest[0]
    if blocks_first:
        for block in graph.blocks:
            if block.layers and nxt in block.layers and all(n in rest for n in block.layers) \
                    and not (set(group) & set(block.layers)):
                candidate = group + [n for n in block.layers if n not in group]
                if grower.can_grow(candidate):
                    return candidate
                break
    candidate = group + [nxt]
    return candidate if grower.can_grow(candidate) else None
