"""Seed 003: split a graph into serial subgraphs, split what does not compile, merge neighbours.

A *target node* is a layer whose output is a graph output and also feeds further
layers: cutting after it lets the finished partial output go off chip at once.
The cuts turn the topological order into a chain of serial subgraphs. Each is
*compiled* (planned under the rules and chip, within the configured limits);
one that fails is split again at the cheapest cut of its own order,
recursively, with the reason recorded. When all compile, neighbours are merged
to balance load: by thresholds, greedily forward, or from both ends at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from hardware.chip import Chip
from planner.cost import weight_bytes
from planner.errors import PlanningError
from planner.ir import Graph
from planner.plan import Plan, assemble
from planner.regions import group_io
from rules.ruleset import PartitionSettings, RuleSet


@dataclass(frozen=True)
class Subgraph:
    """A serial piece of the model and the outcome of compiling it."""

    layers: tuple[str, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    macs: int
    weight_bytes: int
    status: str  # ok | failed
    reason: str  # why this piece starts where it does, and why it failed if it did
    plan: Plan | None = None

    @property
    def nodes(self) -> int:
        return len(self.layers)


def target_nodes(graph: Graph) -> list[str]:
    """Layers whose output is a graph output and also feeds further layers."""
    found = []
    for lay in graph.layers:
        for t in lay.outputs:
            if t in graph.outputs and graph.consumers.get(t):
                found.append(lay.name)
                break
    return found


def _chip_weight_capacity(chip: Chip) -> int:
    if chip.wram is not None:
        return chip.wram.bytes * chip.cores
    return chip.total_sram_bytes


class Compiler:
    """Plans subgraphs and decides whether they compile."""

    def __init__(self, graph: Graph, chip: Chip, ruleset: RuleSet, settings: PartitionSettings,
                 plan_fn: Callable[[Graph, Sequence[str]], Plan]) -> None:
        self.graph, self.chip, self.ruleset, self.settings = graph, chip, ruleset, settings
        self.plan_fn = plan_fn

    def describe(self, layers: Sequence[str], reason: str) -> Subgraph:
        io = group_io(self.graph, layers)
        macs = sum(self.graph.layer(n).macs for n in io.layers)
        wbytes = weight_bytes(self.graph, io.weights, self.chip)
        return Subgraph(io.layers, io.inputs, io.outputs, macs, wbytes, "ok", reason)

    def over_limits(self, sub: Subgraph) -> str | None:
        s = self.settings
        if sub.nodes > s.max_nodes:
            return f"{sub.nodes} nodes > max_nodes {s.max_nodes}"
        if sub.macs > s.max_macs:
            return f"{sub.macs} MACs > max_macs {s.max_macs}"
        if sub.weight_bytes > s.max_weight_bytes:
            return f"{sub.weight_bytes} B of weights > max_weight_bytes {s.max_weight_bytes}"
        cap = _chip_weight_capacity(self.chip)
        if s.weights_on_chip and sub.weight_bytes > cap:
            return f"{sub.weight_bytes} B of weights do not stay on chip ({cap} B)"
        return None

    def compile(self, sub: Subgraph) -> Subgraph:
        """The subgraph planned, or marked failed with the reason."""
        why = self.over_limits(sub)
        if why is not None:
            return replace(sub, status="failed", reason=f"{sub.reason}; does not compile: {why}")
        try:
            plan = self.plan_fn(self.graph, sub.layers)
        except PlanningError as exc:
            return replace(sub, status="failed", reason=f"{sub.reason}; does not compile: {exc}")
        return replace(sub, plan=plan)


def best_cut(graph: Graph, layers: Sequence[str], chip: Chip) -> int:
    """Position (1..len-1) splitting `layers` where the fewest feature-map bytes cross,
    preferring the middle half so recursion halves the work."""
    n = len(layers)
    lo, hi = max(1, n // 4), max(2, n - n // 4)
    best, best_cost = n // 2, None
    for k in range(max(1, lo), min(n, hi + 1)):
        left = set(layers[:k])
        crossing = {t for name in layers[k:] for t in graph.layer(name).fmap_inputs
                    if graph.producer.get(t) in left}
        cost = sum(graph.elems(t) for t in crossing) * chip.dtype_bytes
        if best_cost is None or cost < best_cost:
            best, best_cost = k, cost
    return best


def split_until_compiled(compiler: Compiler, sub: Subgraph, depth: int = 0) -> list[Subgraph]:
    """Compile; on failure split at the best cut and recurse (a single layer is final)."""
    done = compiler.compile(sub)
    if done.status == "ok" or len(sub.layers) == 1:
        return [done]
    k = best_cut(compiler.graph, sub.layers, compiler.chip)
    why = done.reason.split("; does not compile: ", 1)[-1]
    left = compiler.describe(sub.layers[:k], f"{sub.reason}; split (depth {depth + 1}): {why}")
    right = compiler.describe(sub.layers[k:], f"cut at the cheapest crossing after "
                              f"'{sub.layers[k - 1]}' (depth {depth + 1}): {why}")
    return (split_until_compiled(compiler, left, depth + 1)
            + split_until_compiled(compiler, right, depth + 1))


def _merged(compiler: Compiler, a: Subgraph, b: Subgraph) -> Subgraph:
    return compiler.describe(a.layers + b.layers, a.reason)


def merge_forward(compiler: Compiler, subs: list[Subgraph]) -> list[Subgraph]:
    """Merge current+next; on failure keep current and move on, on success continue from it."""
    out: list[Subgraph] = []
    current = subs[0]
    for nxt in subs[1:]:
        trial = compiler.compile(_merged(compiler, current, nxt))
        if trial.status == "ok":
            current = replace(trial, reason=f"{current.reason}; merged with the next piece")
        else:
            out.append(current)
            current = nxt
    out.append(current)
    return out


def merge_bidirectional(compiler: Compiler, subs: list[Subgraph]) -> list[Subgraph]:
    """The forward greedy from both ends at once, meeting in the middle."""
    front, back = [subs[0]], [subs[-1]] if len(subs) > 1 else []
    i, j = 1, len(subs) - 2
    take_front = True
    while i <= j:
        if take_front:
            trial = compiler.compile(_merged(compiler, front[-1], subs[i]))
            front[-1:] = [trial] if trial.status == "ok" else [front[-1], subs[i]]
            i += 1
        else:
            trial = compiler.compile(_merged(compiler, subs[j], back[0]))
            back[:1] = [trial] if trial.status == "ok" else [subs[j], back[0]]
            j -= 1
        take_front = not take_front
    if back:
        trial = compiler.compile(_merged(compiler, front[-1], back[0]))
        if trial.status == "ok":
            front[-1:], back = [trial], back[1:]
    return front + back


def merge_threshold(compiler: Compiler, subs: list[Subgraph]) -> list[Subgraph]:
    """Merge consecutive pieces while the merged sums of MACs, weight bytes and nodes stay
    within the maxima, and always while a piece is still below any minimum."""
    s = compiler.settings
    out: list[Subgraph] = []
    current = subs[0]
    for nxt in subs[1:]:
        merged = _merged(compiler, current, nxt)
        small = (current.nodes < s.min_nodes or current.macs < s.min_macs
                 or current.weight_bytes < s.min_weight_bytes)
        fits = compiler.over_limits(merged) is None
        if small or fits:
            trial = compiler.compile(merged)
            if trial.status == "ok":
                current = replace(trial, reason=f"{current.reason}; merged with the next piece "
                                                "(within the thresholds)")
                continue
        out.append(current)
        current = nxt
    out.append(current)
    return out


MERGES = {"threshold": merge_threshold, "forward": merge_forward,
          "bidirectional": merge_bidirectional}


def partition(graph: Graph, chip: Chip, ruleset: RuleSet, settings: PartitionSettings,
              plan_fn: Callable[[Graph, Sequence[str]], Plan]) -> list[Subgraph]:
    """Serial subgraphs of the model, each compiled, merged by the policy."""
    compiler = Compiler(graph, chip, ruleset, settings, plan_fn)
    order = [lay.name for lay in graph.layers]
    cuts = [0]
    reasons = ["start of the model"]
    for name in target_nodes(graph):
        k = graph.index(name) + 1
        if 0 < k < len(order) and k not in cuts:
            cuts.append(k)
            reasons.append(f"after target node '{name}': its output is a graph output")
    cuts.append(len(order))
    pieces = [compiler.describe(order[a:b], why)
              for a, b, why in zip(cuts, cuts[1:], reasons, strict=False)]
    compiled = [s for p in pieces for s in split_until_compiled(compiler, p)]
    if any(s.status != "ok" for s in compiled) or len(compiled) < 2:
        return compiled
    return MERGES[settings.policy](compiler, compiled)


def combined_plan(graph: Graph, chip: Chip, subs: Sequence[Subgraph], header: dict,
                  objective: str) -> Plan:
    """One plan of the whole model made of every subgraph's groups, for verification."""
    started = time.perf_counter()
    placements = [(g.layers, g.tile, g.weights_resident, g.double_buffered, g.halo_reuse)
                  for s in subs if s.plan is not None for g in s.plan.groups]
    info = {"name": "partition", "status": "FEASIBLE", "gap": None,
            "wall_s": round(time.perf_counter() - started, 3)}
    return assemble(graph, chip, placements, objective=objective, solver=info, **header)
