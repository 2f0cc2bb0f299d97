"""Progress while users wait (issue 47): the events the library sends a progress sink, and
the display that draws them on stderr.

Each long command tells its sink of every phase in order (loading, the tile searches, the
paths, CP-SAT, the emulator, the reference run); counts only grow within a phase, the best
plan only improves, the gap stays in [0, 1]; and the plan is byte for byte the one made
without a sink. The display fits 80 columns and shows nothing when disabled or when its
console is no terminal.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from fuseplan.planner.app import api
from fuseplan.planner.app.verify import REFERENCE_PHASE
from fuseplan.planner.core.progress import Progress, stride, ticker, within
from fuseplan.planner.plan.data import Plan
from fuseplan.planner.plan.json_io import plan_to_json, save_plan
from fuseplan.planner.ui.progress import (
    ProgressView,
    counts_line,
    elapsed,
    progress_display,
)
from tests import models
from tests.test_rules import ModelStore


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> ModelStore:
    return ModelStore(tmp_path_factory.mktemp("progress_models"))


class Recorder:
    """A sink that keeps every event (thread-safe enough: list.append is atomic)."""

    def __init__(self) -> None:
        self.events: list[Progress] = []

    def __call__(self, event: Progress) -> None:
        self.events.append(event)

    def phases(self) -> list[str]:
        """The phases in the order they came, each once per run of events."""
        out: list[str] = []
        for e in self.events:
            if not out or out[-1] != e.phase:
                out.append(e.phase)
        return out

    def of(self, phase: str) -> list[Progress]:
        return [e for e in self.events if e.phase == phase]


def in_order(seen: Sequence[str], expected: Sequence[str]) -> bool:
    """Whether `expected` occurs in `seen` as a subsequence."""
    it = iter(seen)
    return all(any(s == x for s in it) for x in expected)


def assert_sane(events: Sequence[Progress]) -> None:
    """Within each unbroken run of one phase (and one step): done and the counts never go
    down, done stays within its total, the best plan never gets worse, the bound never
    drops below an earlier one, and every gap is in [0, 1]."""
    last: Progress | None = None
    for e in events:
        assert e.searched >= 0 and e.bounded >= 0, e
        if e.done is not None and e.total is not None:
            assert 0 <= e.done <= e.total, e
        gap = e.gap
        assert gap is None or 0.0 <= gap <= 1.0, e
        if e.best is not None and e.bound is not None:
            assert e.bound <= e.best + 1e-6 * max(1.0, abs(e.best)), e
        same = last is not None and (last.phase, last.step, last.total) == \
            (e.phase, e.step, e.total)
        if same:
            assert last is not None
            if last.done is not None and e.done is not None:
                assert e.done >= last.done, (last, e)
            assert e.searched >= last.searched and e.bounded >= last.bounded, (last, e)
            if last.best is not None:
                assert e.best is not None and e.best <= last.best, (last, e)
            if last.bound is not None and e.bound is not None:
                assert e.bound >= last.bound - 1e-6 * max(1.0, abs(last.bound)), (last, e)
        last = e


def same_plan(a: Plan, b: Plan) -> None:
    """Two plans identical but for the wall time."""
    da, db = plan_to_json(a), plan_to_json(b)
    for d in (da, db):
        d["solver"].pop("wall_s", None)
    assert da == db


# --------------------------------------------------------------------------- the type


def test_gap_is_cpsats_and_stays_in_range() -> None:
    assert Progress("x").gap is None
    assert Progress("x", best=100.0).gap is None
    assert Progress("x", best=100.0, bound=90.0).gap == pytest.approx(0.1)
    assert Progress("x", best=100.0, bound=100.0).gap == 0.0
    assert Progress("x", best=100.0, bound=-5000.0).gap == 1.0  # an early, loose bound
    assert Progress("x", best=0.0, bound=0.0).gap == 0.0


def test_within_tags_the_outer_step_and_keeps_none() -> None:
    assert within(None, "point 1 of 3") is None
    rec = Recorder()
    outer = within(rec, "point 2 of 3")
    inner = within(outer, "cpsat, 4 of 4")
    assert inner is not None
    inner(Progress("CP-SAT", step=""))
    assert rec.events == [Progress("CP-SAT", step="point 2 of 3: cpsat, 4 of 4")]


def test_ticker_throttles_by_counting() -> None:
    assert ticker(None, "x", 10) is None
    rec = Recorder()
    tick = ticker(rec, "tile search", 1000, searches=True)
    assert tick is not None
    for k in range(1, 1001):
        tick(k)
    # the start, then every stride(1000) = 10 items: about 100 events, the last one at 1000
    assert stride(1000) == 10 and len(rec.events) == 101
    assert rec.events[0] == Progress("tile search", 0, 1000)
    assert rec.events[-1] == Progress("tile search", 1000, 1000, searched=1000)
    assert_sane(rec.events)


# --------------------------------------------------------------------------- the hooks


def test_solve_cpsat_phases_counts_and_gap(store: ModelStore) -> None:
    """CP-SAT on an inception net under latency (prefetch couples groups: no exact-path
    shortcut): loading, the tile search, the shortest path, the CP-SAT model and solve,
    then the plan's assembly, in that order; CP-SAT's best objective never gets worse, its
    last is the plan's, and the plan is the one made without a sink."""
    path = str(store.path("inception_net"))
    rec = Recorder()
    problem = api.prepare(path, overrides=["sram.bytes=16KiB"], progress=rec)
    assert rec.phases() == ["loading model", "loading chip", "building graph",
                            "loading rules"]
    full = replace(problem, ruleset=replace(problem.ruleset, search=replace(
        problem.ruleset.search, whole_network_first=False, exact_path_first=False)))
    rec = Recorder()
    plan = api.plan_problem(full, "cpsat", "latency", progress=rec)
    same_plan(plan, api.plan_problem(full, "cpsat", "latency"))
    assert in_order(rec.phases(), ["tile search", "shortest path", "CP-SAT model", "CP-SAT",
                                   "assembling plan"]), rec.phases()
    solve = [e for e in rec.of("CP-SAT") if e.best is not None]
    assert len(solve) >= 2, rec.of("CP-SAT")  # the warm start, then better plans
    assert_sane(rec.events)
    assert solve[-1].best == pytest.approx(plan.solver["objective"]), (solve[-1], plan.solver)
    assert solve[-1].unit == "latency" and solve[-1].searched > 0


def test_bounded_path_rounds_close_the_gap(store: ModelStore) -> None:
    """The bounded path's rounds: candidates searched only grow, the best plan of searched
    groups only improves, the floor bound only rises, and they meet at the end."""
    problem = store.problem("inception_net", overrides=("sram.bytes=16KiB",))
    rec = Recorder()
    plan = api.plan_problem(problem, "shortest-path", progress=rec)
    same_plan(plan, api.plan_problem(problem, "shortest-path"))
    rounds = rec.of("bounded path")
    assert rounds, rec.phases()
    assert_sane(rounds)
    last = rounds[-1]
    assert last.best == last.bound == plan.totals.dram_bytes and last.gap == 0.0, last
    assert last.searched > 0 and last.unit == "B"


def test_full_tile_search_and_greedy_count_up(store: ModelStore) -> None:
    """Without floors (search.prune_by_floor off) every candidate is searched: the tile
    search counts up to its total; the greedy planner counts the layers it has placed."""
    problem = store.problem("inception_net", overrides=("sram.bytes=16KiB",))
    problem = replace(problem, ruleset=replace(problem.ruleset, search=replace(
        problem.ruleset.search, prune_by_floor=False)))
    rec = Recorder()
    plan = api.plan_problem(problem, "shortest-path", "latency", progress=rec)
    same_plan(plan, api.plan_problem(problem, "shortest-path", "latency"))
    search = rec.of("tile search")
    assert search and search[-1].done == search[-1].total == search[-1].searched > 0
    assert_sane(rec.events)
    rec = Recorder()
    greedy = api.plan_problem(problem, "greedy", progress=rec)
    same_plan(greedy, api.plan_problem(problem, "greedy"))
    steps = rec.of("greedy")
    assert steps[0].done == 0 and steps[-1].done == steps[-1].total == len(problem.graph.layers)
    assert_sane(rec.events)


def test_compare_tags_each_planner_in_turn(store: ModelStore) -> None:
    problem = store.problem("chain_cnn", overrides=("sram.bytes=16KiB",))
    rec = Recorder()
    rows = api.compare(problem, progress=rec)
    steps = list(dict.fromkeys(e.step for e in rec.events))
    assert steps == ["layer, 1 of 4", "greedy, 2 of 4", "shortest-path, 3 of 4",
                     "cpsat, 4 of 4"], steps
    for (name, plan, _), (name2, plan2, _) in zip(rows, api.compare(problem), strict=True):
        assert name == name2 and plan is not None and plan2 is not None
        same_plan(plan, plan2)
    assert_sane(rec.events)


def test_pareto_tags_each_point(store: ModelStore) -> None:
    """The front's ends (latency, then energy), each point's phases tagged with it."""
    problem = store.problem("chain_cnn", overrides=("sram.bytes=16KiB",))
    rec = Recorder()
    plans = api.pareto(problem, points=2, progress=rec)
    points = list(dict.fromkeys(e.step.split(":")[0] for e in rec.events))
    assert points == ["point 1 of 2", "point 2 of 2"], points
    assert "CP-SAT" in rec.phases()
    assert [plan_to_json(p)["totals"] for p in plans] == \
        [plan_to_json(p)["totals"] for p in api.pareto(problem, points=2)]
    assert_sane(rec.events)


def _pieces(problem: api.Problem, **partition: Any) -> api.Problem:
    settings = replace(problem.ruleset.partition, **partition)
    return replace(problem, ruleset=replace(problem.ruleset, partition=settings))


@pytest.mark.parametrize("jobs", [1, 2])
def test_partition_counts_pieces_and_merges(tmp_path: Path, jobs: int) -> None:
    path = models.save(models.residual_net(), tmp_path, "res")
    problem = _pieces(api.prepare(str(path)), planner="greedy", max_nodes=5)
    rec = Recorder()
    subs, whole = api.partition(problem, jobs=jobs, progress=rec)
    assert in_order(rec.phases(), ["compiling pieces", "merging pieces", "assembling plan"]), \
        rec.phases()
    pieces = rec.of("compiling pieces")
    assert pieces[-1].done == pieces[-1].total and pieces[-1].total is not None
    merges = rec.of("merging pieces")
    assert merges[0].done == 0 and all(e.total == merges[0].total for e in merges)
    assert_sane(rec.events)
    subs2, whole2 = api.partition(problem, jobs=jobs)
    assert [s.layers for s in subs] == [s.layers for s in subs2]
    same_plan(whole, whole2)


def test_verify_tells_the_reference_then_each_group(store: ModelStore, tmp_path: Path) -> None:
    """verify (a plan file) and verify_in_memory: the reference run, then the emulator's
    groups counted up to the plan's; the report is the one made without a sink."""
    problem = store.problem("residual_net", overrides=("sram.bytes=16KiB",))
    plan = api.plan_problem(problem, "greedy")
    rec = Recorder()
    report = api.verify_in_memory(problem, plan, progress=rec)
    assert in_order(rec.phases(), [REFERENCE_PHASE, "emulating"]), rec.phases()
    groups = rec.of("emulating")
    assert groups[0].done == 0 and groups[-1].done == groups[-1].total == len(plan.groups)
    assert_sane(rec.events)
    quiet = api.verify_in_memory(problem, plan)
    assert report.to_json() | {"timing": None} == quiet.to_json() | {"timing": None}
    plan_file = tmp_path / "plan.json"
    save_plan(plan, plan_file)
    rec = Recorder()
    filed = api.verify(problem.model.path, plan_file, progress=rec)
    assert filed.ok
    assert in_order(rec.phases(), ["loading model", REFERENCE_PHASE, "emulating"]), rec.phases()
    assert rec.of("emulating")[-1].done == len(plan.groups)
    assert_sane(rec.events)


# --------------------------------------------------------------------------- the display

_ESCAPES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _lines(text: str) -> list[str]:
    """The terminal lines of rich's output, its escape sequences (colours, cursor moves)
    removed."""
    return [line for chunk in _ESCAPES.sub("\n", text).split("\n")
            for line in chunk.split("\r")]


def _console() -> tuple[Console, StringIO]:
    buf = StringIO()
    return Console(file=buf, force_terminal=True, width=80), buf


EVENTS = [
    Progress("loading model"),
    Progress("tile search", 0, 1030, step="shortest-path, 3 of 4"),
    Progress("tile search", 412, 1030, searched=412, step="shortest-path, 3 of 4"),
    Progress("bounded path", 7, None, 3_912, 18_086, 2_803_814, 2_787_590),
    Progress("CP-SAT", 3, None, 642, 0, 26_761, -1_096_218, "latency",
             "point 12 of 15: " + "a very long step name " * 5),
    Progress("emulating", 40, 40),
]


def test_display_fits_80_columns_and_says_it_all() -> None:
    console, buf = _console()
    view = ProgressView("planning zoo:" + "squeezenet/" * 12 + " with cpsat")
    for e in EVENTS:
        view.update(e)
        console.print(view)
    text = buf.getvalue()
    lines = _lines(text)
    assert max(len(line) for line in lines) <= 80, [x for x in lines if len(x) > 80]
    plain = "\n".join(lines)
    for words in ("tile search (shortest-path, 3 of 4)  412/1,030", "searched 412",
                  "ruled out 18,086", "best 2.67 MiB", "gap 0.6%", "emulating  40/40",
                  "best 26,761 (latency)", "gap 100.0%", "0:00"):
        assert words in plain, (words, plain)
    assert "━" in text  # a bar where the phase knows its total


def test_display_live_on_a_terminal_and_silent_otherwise() -> None:
    console, buf = _console()
    with progress_display("planning x with cpsat", enabled=True, console=console) as sink:
        assert sink is not None
        for e in EVENTS:
            sink(e)
    assert "planning x with cpsat" in buf.getvalue()
    assert max(len(line) for line in _lines(buf.getvalue())) <= 80
    for enabled, terminal in ((False, True), (True, False)):
        buf = StringIO()
        quiet = Console(file=buf, force_terminal=terminal, width=80)
        with progress_display("planning", enabled=enabled, console=quiet) as sink:
            assert sink is None
        assert buf.getvalue() == ""
    with progress_display("planning", enabled=False) as sink:  # --json, --quiet
        assert sink is None


def test_numbers_as_people_read_them() -> None:
    assert elapsed(7.9) == "0:07" and elapsed(135) == "2:15" and elapsed(3723) == "1:02:03"
    assert counts_line(Progress("loading model")) == ""
    assert counts_line(Progress("CP-SAT", searched=5, best=2048, bound=1024)) == \
        "searched 5 · best 2.0 KiB · gap 50.0%"


def test_display_draws_a_real_solve(store: ModelStore) -> None:
    """The library's events through the display: the last phase is drawn when the block
    ends, within 80 columns, and the plan is the one made without a display."""
    problem = store.problem("chain_cnn", overrides=("sram.bytes=16KiB",))
    console, buf = _console()
    with progress_display("planning chain_cnn with greedy", enabled=True,
                          console=console) as sink:
        plan = api.plan_problem(problem, "greedy", progress=sink)
    same_plan(plan, api.plan_problem(problem, "greedy"))
    lines = _lines(buf.getvalue())
    assert any("assembling plan" in line for line in lines), lines
    assert max(len(line) for line in lines) <= 80
