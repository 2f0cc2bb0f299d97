"""The sweep driver: plan a spec's points through a runner, keep their rows, write the table.

:func:`run_sweep` addresses the points (:mod:`~fuseplan.planner.app.sweep.keys`), takes
finished ones from the folder when resuming (:mod:`~fuseplan.planner.app.sweep.store`), plans
the rest (or bisects each capacity curve for a target) through a runner
(:mod:`~fuseplan.planner.app.sweep.runners`), repairs the capacity curves
(:mod:`~fuseplan.planner.app.sweep.search`) and writes the results table
(:mod:`~fuseplan.planner.app.sweep.table`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from fuseplan.planner.app.sweep.keys import Job, address
from fuseplan.planner.app.sweep.rows import Outcome, PointResult
from fuseplan.planner.app.sweep.runners import Progress, Runner, SerialRunner, run_calls
from fuseplan.planner.app.sweep.search import Probe, Target, bisect_curves, repair_curves
from fuseplan.planner.app.sweep.spec import SweepSpec
from fuseplan.planner.app.sweep.store import Store, reuse, storing
from fuseplan.planner.app.sweep.table import write_table
from fuseplan.planner.app.sweep.tasks import solve_point

__all__ = ["SweepInterrupted", "SweepResult", "run_sweep"]


@dataclass(frozen=True)
class SweepResult:
    """A finished (or interrupted) sweep."""

    points: int  # points in the table
    done: int  # with a plan
    failed: int  # infeasible, error, or the task failed
    skipped: int  # found finished and not planned again (resume)
    rows: tuple[PointResult, ...]
    table: str
    csv: str
    axis_keys: tuple[str, ...]
    wall_s: float
    repaired: int = 0  # points whose plan became a smaller capacity's, re-costed
    bisection: tuple[Probe, ...] = ()
    errored: int = 0  # rows with status `error` (a task raised, or its worker kept dying)
    first_error: str = ""  # the first errored row's message
    warnings: tuple[str, ...] = ()  # curves a repair could not make monotone


class SweepInterrupted(Exception):
    """The driver was interrupted (Ctrl-C); finished points are kept and tabled."""

    def __init__(self, result: SweepResult) -> None:
        super().__init__(f"{result.done} of {result.points} points done")
        self.result = result


def run_sweep(spec: SweepSpec, out: str | Path, runner: Runner | None = None, *,
              resume: bool = False, verify: bool = False, target: Target | None = None,
              progress: Progress | None = None,
              task: Callable[[Job, bool], Outcome] = solve_point) -> SweepResult:
    """Plan every point of a spec (or, with ``target``, bisect each capacity curve) and write
    the results table. ``runner`` defaults to a :class:`SerialRunner`; pass a
    :class:`RayRunner` (entered) to run on Ray. ``progress(done, total)`` is called after each
    finished task. ``task`` plans one point (:func:`solve_point`; a module-level function, so
    Ray workers can import it). Ctrl-C raises :class:`SweepInterrupted` after keeping what
    finished."""
    started = time.perf_counter()
    runner = runner or SerialRunner()
    out = Path(out)
    store = Store(out)
    jobs = address(spec.points)  # one address per point (address() rejects duplicates)
    rows: dict[str, PointResult] = {}
    counter = [0]
    probes: tuple[Probe, ...] = ()
    repaired = [0]
    warnings: list[str] = []
    tried: set[tuple[str, str]] = set()

    def repair() -> None:
        repaired[0] += repair_curves(runner, store, jobs, spec.axis_keys, rows, verify,
                                     progress, counter, warnings, tried)

    try:
        if target is not None:
            probes = bisect_curves(runner, store, jobs, spec.axis_keys, target, rows, verify,
                                   resume, progress, counter, task, repair)
        else:
            todo = [j for j in jobs if not (resume and reuse(store, j, rows, verify))]
            run_calls(runner, todo, [(task, (j, verify)) for j in todo],
                      storing(store, rows), progress, counter, len(todo))
        repair()
    except KeyboardInterrupt:
        store.remove_partial()
        result = _finish(spec, store, jobs, rows, started, repaired[0], probes, warnings)
        raise SweepInterrupted(result) from None
    return _finish(spec, store, jobs, rows, started, repaired[0], probes, warnings)


def _finish(spec: SweepSpec, store: Store, jobs: Sequence[Job],
            rows: Mapping[str, PointResult], started: float, repaired: int,
            probes: tuple[Probe, ...], warnings: Sequence[str]) -> SweepResult:
    """Write the table of the finished rows (spec order)."""
    ordered = [rows[j.key] for j in jobs if j.key in rows]
    table, csv = write_table(ordered, spec.axis_keys, spec.batched, store.out / "sweep")
    done = sum(r.ok for r in ordered)
    errors = [r for r in ordered if r.status == "error"]
    return SweepResult(len(ordered), done, len(ordered) - done, store.reused, tuple(ordered),
                       str(table), str(csv), spec.axis_keys,
                       round(time.perf_counter() - started, 3), repaired, probes,
                       len(errors), errors[0].error if errors else "", tuple(warnings))
