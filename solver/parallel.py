"""Tile searches on several cores.

The planners search one best tile per candidate group (solver.tiles.GroupSearch), hundreds
to thousands of independent searches on a deep network. With ``jobs`` > 1 they run in a
pool of worker processes forked from the planner: the workers inherit the model, chip and
rules, so each task is a tuple of layer names and each result a TileChoice (and, under a
time-aware objective, its prefetch options); nothing large is pickled. The results are
those of the same searches run one after another, in the same order: ``jobs`` changes the
wall time, never the plan. The whole-map groups' starts (solver.long_groups) run the same
way (``map_all``: any module-level search over items the workers can rebuild from names).

A time limit binds the workers as it binds the planner: past it a task that is not
required is left out (the caller notes what was cut), and a required one (a single layer:
every plan needs it) is tiled by the greedy tile search where that finds a tile.
Few searches are not worth a pool (starting one costs tens of milliseconds): below
``MIN_PARALLEL`` they run in the planner's process.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from fuseplan.hardware.chip import Chip
from fuseplan.planner.cost.objective import Objective
from fuseplan.planner.ir.graph import Graph
from fuseplan.rules.ruleset import RuleSet
from fuseplan.solver.tiles import GroupSearch, Option, TileChoice

T = TypeVar("T")
R = TypeVar("R")

# the signals that stop a command (Ctrl-C, and SIGTERM: what CI sends on cancel), held back
# while workers start or stop
_STOPS = frozenset({signal.SIGINT, signal.SIGTERM})
Tick = Callable[[int], None]  # told how many items of a map are done, after each one
MIN_PARALLEL = 8  # searches below which a pool (tens of milliseconds to start) is not worth it


@dataclass(frozen=True)
class Task:
    """One candidate group to search."""

    layers: tuple[str, ...]
    required: bool = False  # searched (quickly) even past the time limit: a single layer


@dataclass(frozen=True)
class Found:
    """A search's result: the options a prefetch may prefer (time-aware objectives only,
    the first being the best) and the best tile (None: no tile passes)."""

    options: tuple[Option, ...]
    best: TileChoice | None
    quick: bool = False  # tiled by the quick search, past the time limit


@dataclass(frozen=True)
class Context:
    """What every search of one planning reads."""

    graph: Graph
    chip: Chip
    ruleset: RuleSet
    objective: Objective
    timed: bool  # collect prefetch options (a time-aware objective)
    until: float | None  # time.perf_counter() deadline (CLOCK_MONOTONIC: one clock for all)


def looked_up(what: TileChoice | tuple[Any, ...] | None,
              found: Mapping[Any, Found | None]) -> Found | None:
    """A candidate's result, where the planner noted either its tile (None: no tile passes)
    or the structure key its search shares (then that search's result: None when it was
    left out past the time limit)."""
    if isinstance(what, tuple):
        return found[what]
    return Found((), what)


def available_jobs() -> int:
    """Cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def search(ctx: Context, task: Task) -> Found | None:
    """One task's search (None: left out, past the time limit)."""
    past = ctx.until is not None and time.perf_counter() >= ctx.until
    if past and not task.required:
        return None
    group = GroupSearch.of(ctx.graph, task.layers, ctx.chip, ctx.ruleset)
    if past and not ctx.timed:
        quick = group.search(ctx.ruleset.search.tile_search)
        if quick is not None:
            return Found((), quick, quick=True)
    if not ctx.timed:
        return Found((), group.best(ctx.objective))
    options = group.options(ctx.objective)
    return Found(tuple(options), group.option_choice(options[0]) if options else None)


def search_all(ctx: Context, tasks: Sequence[Task], jobs: int = 1,
               least: int = MIN_PARALLEL, tick: Tick | None = None) -> list[Found | None]:
    """Every task's search, in order, on up to `jobs` processes (when there are at least
    `least` tasks); ``tick``: told how many are done after each one (Workers.map)."""
    return map_all(ctx, search, tasks, jobs, [len(t.layers) for t in tasks], least, tick)


def map_all(ctx: Context, fn: Callable[[Context, T], R], items: Sequence[T], jobs: int = 1,
            sizes: Sequence[int] | None = None, least: int = MIN_PARALLEL,
            tick: Tick | None = None) -> list[R | None]:
    """fn(ctx, item) for every item, in order, on up to `jobs` processes when there are at
    least `least` items (`fn` a module-level function; ``sizes``: the best guess of each
    item's cost; ``tick``: told how many are done after each one)."""
    with Workers(ctx, min(jobs, len(items))) as workers:
        return workers.map(fn, items, sizes, least, tick)


class Workers:
    """A pool of worker processes forked from the planner with one context, started at the
    first map that is worth one and kept for the later ones (a bounded path maps a few
    searches per round, dozens of rounds: one fork, not one per round). Leaving the
    ``with`` block (Ctrl-C or a failed search included) stops the workers at once."""

    def __init__(self, ctx: Context, jobs: int) -> None:
        self.ctx, self.jobs = ctx, jobs
        self.pool: Any = None

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.pool is not None:
            # the workers ignore Ctrl-C (the planner handles it): only this stops them, so a
            # Ctrl-C that lands here waits until they are gone (cut short, it left them
            # running after the command had exited)
            blocked = signal.pthread_sigmask(signal.SIG_BLOCK, _STOPS)
            try:
                self.pool.terminate()
                self.pool.join()
            finally:
                self.pool = None
                signal.pthread_sigmask(signal.SIG_SETMASK, blocked)

    def map(self, fn: Callable[[Context, T], R], items: Sequence[T],
            sizes: Sequence[int] | None = None, least: int = MIN_PARALLEL,
            tick: Tick | None = None) -> list[R | None]:
        """fn(ctx, item) for every item, in order: in the workers when there are at least
        `least` items (and more than one job), else in this process. ``tick`` (in this
        process) is told how many items are done after each one finishes."""
        if self.pool is None and (self.jobs <= 1 or len(items) < max(2, least)
                                  or "fork" not in multiprocessing.get_all_start_methods()) \
                or len(items) < 2:
            return _in_turn(self.ctx, fn, items, tick)
        # without a time limit the largest items go first, one at a time, so no worker is
        # left with a long search at the end; under one, the caller's order (short groups
        # first: what a cut should keep)
        order = list(range(len(items)))
        if self.ctx.until is None and sizes is not None:
            order.sort(key=lambda i: -sizes[i])
        found: list[R | None] = [None] * len(items)
        if self.pool is None:
            self.pool = _start_pool(self.jobs, self.ctx)
        for done, (i, result) in enumerate(self.pool.imap_unordered(
                _run_in_worker, [(i, fn, items[i]) for i in order]), 1):
            found[i] = result
            if tick is not None:
                tick(done)
        return found


def _in_turn(ctx: Context, fn: Callable[[Context, T], R], items: Sequence[T],
             tick: Tick | None) -> list[R | None]:
    """fn(ctx, item) for every item in this process, in order, ticking after each."""
    if tick is None:
        return [fn(ctx, x) for x in items]
    out: list[R | None] = []
    for x in items:
        out.append(fn(ctx, x))
        tick(len(out))
    return out


def _start_pool(jobs: int, ctx: Context) -> Any:
    """A pool of `jobs` workers forked with `ctx`. Forked workers inherit the context; the
    pool's initializer hands it to each. Ctrl-C is held back while they start (they inherit
    that, then ignore it: the planner handles it), so none dies half-born with a traceback
    of its own; and a Ctrl-C that comes meanwhile (another thread may take the signal and
    Python raise it at any line of Pool()) is only noted, then raised once the pool is whole
    and stopped: raised inside Pool(), it left the workers already forked running, orphaned,
    after the command had exited. SIGTERM likewise."""
    caught: list[int] = []
    main = threading.current_thread() is threading.main_thread()
    previous = {s: signal.signal(s, lambda signum, _: caught.append(signum))
                for s in _STOPS} if main else {}
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, _STOPS)
    try:
        pool = multiprocessing.get_context("fork").Pool(jobs, _adopt, (ctx,))
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        for s, handler in previous.items():
            signal.signal(s, handler)
    if caught:
        pool.terminate()
        pool.join()
        # the signal again, to its own handler now (the CLI's raises KeyboardInterrupt, or
        # its SIGTERM subclass)
        signal.raise_signal(caught[0])
        raise KeyboardInterrupt
    return pool


# The context of a worker process, set once by the pool's initializer (fork: inherited,
# not pickled) and read by every task it runs; the planner's own process never sets it.
_WORKER: list[Context] = []


def _adopt(ctx: Context) -> None:
    # Ctrl-C and SIGTERM are the planner's to handle: it stops the pool (Workers.__exit__).
    # A worker leaves the command's process group, so a signal to the group (a terminal's
    # Ctrl-C, CI cancelling a job) never reaches it: killed at a random point, it could die
    # holding the task queue's lock, and Pool.terminate() then waits for that lock forever.
    # A SIGTERM to the group that came while it was being forked is pending (the planner
    # forks with it blocked): ignoring it discards it.
    os.setpgrp()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # terminate() ends it (not the CLI's handler)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOPS)
    _WORKER.append(ctx)


def _run_in_worker(item: tuple[int, Callable[[Context, Any], Any], Any]) -> tuple[int, Any]:
    i, fn, x = item
    return i, fn(_WORKER[0], x)
