"""Split a graph into serial subgraphs, split what does not compile, merge neighbours.

A *target node* is a layer whose output is a graph output and also feeds further
layers: cutting after it lets the finished partial output go off chip at once.
The cuts turn the topological order into a chain of serial subgraphs. Each is
*compiled* (planned under the rules and chip, within the configured limits);
one that fails is split again at the cheapest cut of its own order,
recursively, with the reason recorded. When all compile, neighbours are merged
to balance load: by thresholds, greedily forward, or from both ends at once.

The same machinery plans models too large for one CP-SAT model (issue 7's scale
target): cuts fall on block boundaries, so every group a piece may choose is one
the whole model allows and no piece loses a fused block; the pieces are planned
in parallel processes; and one memo of each candidate group's best tile is shared
by every piece and every merge trial, so no group's tile search runs twice.
"""

from __future__ import annotations

import multiprocessing
import signal
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from types import MappingProxyType
from typing import Any, cast

from fuseplan.hardware.chip import Chip
from fuseplan.planner.app.assemble import assemble
from fuseplan.planner.core.errors import PlanningError
from fuseplan.planner.core.progress import Progress, ProgressSink, ticker
from fuseplan.planner.core.units import vs_bytes
from fuseplan.planner.cost.model import weight_bytes
from fuseplan.planner.cost.objective import Objective
from fuseplan.planner.geometry.regions import group_io
from fuseplan.planner.ir.graph import Graph
from fuseplan.planner.plan.data import Plan
from fuseplan.rules.ruleset import PartitionSettings, RuleSet


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


Memo = dict[tuple[str, ...], Any]  # candidate group -> its best tile (solver.tiles.TileChoice)


class Compiler:
    """Plans subgraphs and decides whether they compile.

    ``memo`` is the dict ``plan_fn`` fills with each candidate group's best tile, if any:
    pieces planned in worker processes send their new entries back through it.
    """

    def __init__(self, graph: Graph, chip: Chip, ruleset: RuleSet, settings: PartitionSettings,
                 plan_fn: Callable[[Graph, Sequence[str]], Plan],
                 memo: Memo | None = None, progress: ProgressSink | None = None) -> None:
        self.graph, self.chip, self.ruleset, self.settings = graph, chip, ruleset, settings
        self.plan_fn = plan_fn
        self.memo: Memo = {} if memo is None else memo
        # told of the pieces compiled and the merges tried (in this process only: a child
        # compiling a piece tells nobody)
        self.progress = progress
        self.merges: tuple[int, int] | None = None  # merges tried of at most, while merging

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
            need_s, has_s = vs_bytes(sub.weight_bytes, s.max_weight_bytes)
            return f"{need_s} of weights > max_weight_bytes {has_s}"
        cap = _chip_weight_capacity(self.chip)
        if s.weights_on_chip and sub.weight_bytes > cap:
            need_s, has_s = vs_bytes(sub.weight_bytes, cap)
            return f"{need_s} of weights do not stay on chip ({has_s})"
        return None

    def compile(self, sub: Subgraph) -> Subgraph:
        """The subgraph planned, or marked failed with the reason."""
        self._merge_tried()
        why = self.over_limits(sub)
        if why is not None:
            return replace(sub, status="failed", reason=f"{sub.reason}; does not compile: {why}")
        try:
            plan = self.plan_fn(self.graph, sub.layers)
        except PlanningError as exc:
            return replace(sub, status="failed", reason=f"{sub.reason}; does not compile: {exc}")
        return replace(sub, plan=plan)

    def _merge_tried(self) -> None:
        """Count a merge tried (while merging) and tell the progress sink."""
        if self.merges is None:
            return
        tried, most = self.merges
        self.merges = (tried + 1, most)
        if self.progress is not None:
            self.progress(Progress("merging pieces", tried + 1, most))

    def compile_many(self, subs: Sequence[Subgraph], pool: Workers | None) -> list[Subgraph]:
        """Compile every piece, in the pool's worker processes when there is one; pieces over
        the limits fail at once, without planning, in this process."""
        done: list[Subgraph | None] = [None] * len(subs)
        todo = []
        if pool is None and self.progress is not None:
            self.progress(Progress("compiling pieces", 0, len(subs)))
        for i, sub in enumerate(subs):
            if self.over_limits(sub) is not None or pool is None:
                done[i] = self.compile(sub)
            else:
                todo.append(i)
            if pool is None and self.progress is not None:
                self.progress(Progress("compiling pieces", i + 1, len(subs)))
        # largest first, so the last piece to finish is a small one
        todo.sort(key=lambda i: -subs[i].nodes)
        if pool is not None:
            tick = ticker(self.progress, "compiling pieces", len(subs))
            ticks = None if tick is None else _after(tick, len(subs) - len(todo))
            for i, (compiled, fresh) in zip(todo, pool.compile([subs[i] for i in todo], ticks),
                                            strict=True):
                done[i] = compiled
                self.memo.update(fresh)
        return [d for d in done if d is not None]


# the signals that stop a command (Ctrl-C, and SIGTERM: what CI sends on cancel), held back
# while children are forked or stopped
_STOPS = frozenset({signal.SIGINT, signal.SIGTERM})


def _compile_in_child(compiler: Compiler, sub: Subgraph, conn: Connection) -> None:
    """Compile one piece in a forked child; send back it and the memo entries its planning
    added (or the exception that stopped it)."""
    # Ctrl-C is the parent's to handle: it terminates the children it started
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # terminate() ends it (not the CLI's handler)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOPS)
    compiler.progress = None  # the parent tells of the pieces
    try:
        known = set(compiler.memo)
        done = compiler.compile(sub)
        conn.send((done, {k: v for k, v in compiler.memo.items() if k not in known}))
    except BaseException as exc:  # re-raised in the parent, as a pool's future would
        conn.send(exc)
    finally:
        conn.close()


@dataclass(frozen=True)
class Workers:
    """Pieces compiled in forked child processes, at most ``jobs`` at a time.

    A child is forked from this process, so it inherits the compiler (the loaded model, the
    plan function, which need not pickle, and the memo so far) through its arguments; only
    the compiled piece and its new memo entries come back, through a pipe.
    """

    compiler: Compiler
    jobs: int

    def compile(self, subs: Sequence[Subgraph], tick: Callable[[int], None] | None = None
                ) -> list[tuple[Subgraph, Memo]]:
        """Every piece compiled, in order, with the memo entries its planning added;
        ``tick``: told how many are done after each one."""
        context = multiprocessing.get_context("fork")
        results: list[tuple[Subgraph, Memo] | None] = [None] * len(subs)
        waiting = list(range(len(subs)))
        running: dict[Connection, tuple[int, BaseProcess]] = {}
        try:
            while waiting or running:
                while waiting and len(running) < self.jobs:
                    i = waiting.pop(0)
                    receive, send = context.Pipe(duplex=False)
                    forked = context.Process(target=_compile_in_child,
                                             args=(self.compiler, subs[i], send))
                    # Ctrl-C is held back while the child is forked (it inherits that, then
                    # ignores it: the planner handles it), so none dies half-born with a
                    # traceback of its own (as solver.parallel's pool)
                    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, _STOPS)
                    try:
                        forked.start()
                    finally:
                        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
                    send.close()  # the child holds its end; EOF here once it exits
                    running[receive] = (i, forked)
                for ready in wait(list(running)):
                    conn = cast(Connection, ready)  # wait() hands back what it was given
                    i, child = running.pop(conn)
                    try:
                        answer = conn.recv()
                    except EOFError:
                        raise RuntimeError(f"the worker compiling piece {i} died "
                                           f"(exit code {child.exitcode})") from None
                    finally:
                        conn.close()
                        child.join()
                    if isinstance(answer, BaseException):
                        raise answer
                    results[i] = answer
                    if tick is not None:
                        tick(sum(r is not None for r in results))
        finally:
            # an error or Ctrl-C here must not leave the other children planning (or
            # blocked writing a large answer into a pipe nobody reads)
            # the children ignore Ctrl-C: a second one landing here must not cut this short
            blocked = signal.pthread_sigmask(signal.SIG_BLOCK, _STOPS)
            try:
                for conn, (_, child) in running.items():
                    child.terminate()
                    child.join()
                    conn.close()
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        return [r for r in results if r is not None]


@contextmanager
def planners(compiler: Compiler, jobs: int) -> Iterator[Workers | None]:
    """Worker processes planning pieces side by side, or None to plan them here (one job,
    or no fork on this platform)."""
    if jobs < 2 or "fork" not in multiprocessing.get_all_start_methods():
        yield None
        return
    yield Workers(compiler, jobs)


def block_boundaries(graph: Graph, layers: Sequence[str]) -> set[int]:
    """Cut positions k (1..len-1, between layers[k-1] and layers[k]) that split no block."""
    where = {name: i for i, name in enumerate(layers)}
    inside = set(range(1, len(layers)))
    for block in graph.blocks:
        at = [where[n] for n in block.layers if n in where]
        if at:  # a cut in (first, last] leaves some of the block on either side
            inside -= set(range(min(at) + 1, max(at) + 1))
    return inside


def best_cut(graph: Graph, layers: Sequence[str], chip: Chip) -> int:
    """Position (1..len-1) splitting `layers` where the fewest feature-map bytes cross,
    on a block boundary if there is one, preferring the middle half so recursion halves
    the work.

    A cut inside a block would cost twice: the piece no longer sees the block, so its
    groups may cut it (the whole model's rules forbid that), and the block's fused
    groups are lost.
    """
    n = len(layers)
    if n < 2:
        return 1
    lo, hi = max(1, n // 4), max(2, n - n // 4)
    middle = range(lo, min(n, hi + 1))
    clean = block_boundaries(graph, layers)
    options = [k for k in middle if k in clean] or sorted(clean) or list(middle)
    position = {name: i for i, name in enumerate(layers)}

    def crossing_bytes(k: int) -> int:
        crossing = {t for name in layers[k:] for t in graph.layer(name).fmap_inputs
                    if position.get(graph.producer.get(t, ""), n) < k}
        return sum(graph.elems(t) for t in crossing) * chip.dtype_bytes

    return min(options, key=lambda k: (crossing_bytes(k), abs(n - 2 * k)))


def _halves(compiler: Compiler, failed: Subgraph, depth: int) -> list[Subgraph]:
    """A piece that did not compile, cut in two at its best cut, with the reasons."""
    layers = failed.layers
    k = best_cut(compiler.graph, layers, compiler.chip)
    head, why = failed.reason.split("; does not compile: ", 1)
    where = "block boundary" if k in block_boundaries(compiler.graph, layers) else "crossing"
    left = compiler.describe(layers[:k], f"{head}; split (depth {depth + 1}): {why}")
    right = compiler.describe(layers[k:], f"cut at the cheapest {where} after "
                              f"'{layers[k - 1]}' (depth {depth + 1}): {why}")
    return [left, right]


def split_until_compiled(compiler: Compiler, subs: Sequence[Subgraph],
                         pool: Workers | None = None) -> list[Subgraph]:
    """Compile each piece; split one that fails at its best cut and compile the halves,
    recursively (a single layer is final). Pieces over the limits are split before any
    planning, so every piece that is planned is planned in one batch (in parallel with a
    pool); only pieces that fail the planner itself need a second round."""
    items: list[tuple[Subgraph, int, Subgraph | None]] = [(s, 0, None) for s in subs]
    while any(done is None for _, _, done in items):
        expanded: list[tuple[Subgraph, int, Subgraph | None]] = []
        for sub, depth, done in items:  # over the limits: split without planning
            expanded += _split_over_limits(compiler, sub, depth) if done is None \
                else [(sub, depth, done)]
        planned = iter(compiler.compile_many([s for s, _, d in expanded if d is None], pool))
        items = []
        for sub, depth, done in expanded:
            if done is None:
                done = next(planned)
                if done.status != "ok" and len(sub.layers) > 1:
                    items += [(half, depth + 1, None) for half in _halves(compiler, done, depth)]
                    continue
            items.append((sub, depth, done))
    return [done for _, _, done in items if done is not None]


def _split_over_limits(compiler: Compiler, sub: Subgraph, depth: int
                       ) -> list[tuple[Subgraph, int, Subgraph | None]]:
    """The piece, or its halves recursively while a piece is over the configured limits
    (those fail at once, so they are final only as single layers)."""
    why = compiler.over_limits(sub)
    if why is None:
        return [(sub, depth, None)]
    failed = replace(sub, status="failed", reason=f"{sub.reason}; does not compile: {why}")
    if len(sub.layers) == 1:
        return [(sub, depth, failed)]
    return [item for half in _halves(compiler, failed, depth)
            for item in _split_over_limits(compiler, half, depth + 1)]


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
              plan_fn: Callable[[Graph, Sequence[str]], Plan], jobs: int = 1,
              memo: Memo | None = None, progress: ProgressSink | None = None
              ) -> list[Subgraph]:
    """Serial subgraphs of the model, each compiled (`jobs` pieces at a time), merged by the
    policy. ``memo``: the dict plan_fn fills with candidate groups' best tiles, if any;
    ``progress``: told of the pieces compiled and the merges tried (planner.core.progress)."""
    compiler = Compiler(graph, chip, ruleset, settings, plan_fn, memo, progress)
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
    with planners(compiler, jobs) as pool:
        compiled = split_until_compiled(compiler, pieces, pool)
    if any(s.status != "ok" for s in compiled) or len(compiled) < 2:
        return compiled
    compiler.merges = (0, len(compiled) - 1)  # each policy tries at most one merge a seam
    if progress is not None:
        progress(Progress("merging pieces", 0, len(compiled) - 1))
    return MERGES[settings.policy](compiler, compiled)


def _after(tick: Callable[[int], None], before: int) -> Callable[[int], None]:
    """`tick` for a part of a loop that starts after `before` items."""
    return lambda done: tick(before + done)


def combined_plan(graph: Graph, chip: Chip, subs: Sequence[Subgraph], header: dict,
                  objective: Objective) -> Plan:
    """One plan of the whole model made of every subgraph's groups, for verification."""
    started = time.perf_counter()
    placements = [g.placement for s in subs if s.plan is not None for g in s.plan.groups]
    info = {"name": "partition", "status": "FEASIBLE", "gap": None,
            "wall_s": round(time.perf_counter() - started, 3)}
    return assemble(graph, chip, placements, objective=objective, solver=info, **header)


def restrict(graph: Graph, layers: Sequence[str]) -> Graph:
    """The subgraph of `layers`: tensors crossing into it become its inputs, tensors leaving
    it (or model outputs) its outputs; blocks wholly inside it are kept."""
    io = group_io(graph, layers)
    keep = set(io.layers)
    kept = tuple(lay for lay in graph.layers if lay.name in keep)
    producer = {t: p for t, p in graph.producer.items() if p in keep}
    consumers = {t: tuple(c for c in cs if c in keep) for t, cs in graph.consumers.items()}
    # blocks wholly inside; one whose fork lies outside now starts at the subgraph's input
    blocks = tuple(b if b.entry in keep else replace(b, entry="")
                   for b in graph.blocks if set(b.layers) <= keep)
    return Graph(
        name=graph.name,
        layers=kept,
        shapes=graph.shapes,
        constants=graph.constants,
        inputs=io.inputs,
        outputs=io.outputs,
        producer=MappingProxyType(producer),
        consumers=MappingProxyType({t: cs for t, cs in consumers.items() if cs}),
        dag=graph.dag.subgraph(keep).copy(),
        blocks=blocks,
        opset=graph.opset,
    )
