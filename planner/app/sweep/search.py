"""Search along capacity axes: monotone repair of each curve, and bisection for a target.

Along each capacity axis (a swept ``*.bytes`` key) results are made monotone in DRAM bytes
and in the objective (:func:`repair_curves`): where a larger capacity's plan is worse in either than
a smaller capacity's, the smaller one's plan is re-costed on the larger chip (it fits there)
and kept if that puts the curve in order. With a :class:`Target` (``x_floor<=1.1``) the sweep
instead bisects each capacity curve for the smallest capacity that meets it (:func:`bisect_curves`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from fuseplan.planner.app.sweep.curves import capacity_axes, curves, in_order, monotone_metric
from fuseplan.planner.app.sweep.keys import Job
from fuseplan.planner.app.sweep.rows import Outcome, PointResult
from fuseplan.planner.app.sweep.runners import Call, Progress, Runner, run_calls
from fuseplan.planner.app.sweep.spec import AxisValue
from fuseplan.planner.app.sweep.store import Store, reuse, storing
from fuseplan.planner.app.sweep.tasks import recost_point
from fuseplan.planner.core.errors import InputError

__all__ = ["TARGET_METRICS", "Probe", "Target", "bisect_curves", "parse_target",
           "repair_curves"]


@dataclass(frozen=True)
class Target:
    """A condition on a row, e.g. ``x_floor<=1.1``."""

    metric: str
    op: Literal["<=", "<", ">=", ">"]
    bound: float

    def met(self, row: PointResult) -> bool:
        """Whether the row meets it (a row without a plan never does)."""
        value = row.value(self.metric) if row.ok else None
        if value is None:
            return False
        return {"<=": value <= self.bound, "<": value < self.bound,
                ">=": value >= self.bound, ">": value > self.bound}[self.op]

    def __str__(self) -> str:
        return f"{self.metric}{self.op}{self.bound:g}"


_TARGET_RE = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_.]*)\s*(<=|>=|<|>)\s*([-+0-9.eE]+)\s*$")
TARGET_METRICS = ("x_floor", "x_layer", "dram_bytes", "cycles", "energy_pj")


def parse_target(text: str) -> Target:
    """Read ``METRIC OP NUMBER`` (``x_floor<=1.1``); InputError says what is accepted."""
    m = _TARGET_RE.match(text)
    value: float | None = None
    if m is not None:
        try:
            value = float(m.group(3))
        except ValueError:
            value = None
    if m is None or value is None or m.group(1) not in TARGET_METRICS:
        raise InputError(f"--target {text!r}: write METRIC OP NUMBER, e.g. `x_floor<=1.1`, "
                         f"with METRIC one of {', '.join(TARGET_METRICS)} and OP one of "
                         "<=, <, >=, >.")
    return Target(m.group(1), m.group(2), value)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Probe:
    """Bisection's answer for one capacity curve."""

    model: str
    batch: int | None
    chip: str
    axis: str
    smallest: AxisValue  # the smallest capacity meeting the target; None if none does
    probes: int
    # the rest of the curve's chip family (the report's "smallest chip serving every model")
    rest: tuple[tuple[str, AxisValue], ...] = ()
    rules: str = ""
    solver: str = ""
    objective: str = ""


def _keeping_in_order(store: Store, rows: dict[str, PointResult], ref: Mapping[str, Job],
                      improved: list[int], warnings: list[str]
                      ) -> Callable[[Job, Outcome], None]:
    """Store a re-costed result where it puts the point in order with the smaller capacity
    it came from (counting them); otherwise mark the point's own row and warn."""
    def keep(job: Job, got: Outcome) -> None:
        old, smaller = rows[job.key], rows[ref[job.key].key]
        if in_order(got.row, smaller):
            rows[job.key] = store.put(job, got)
            improved[0] += 1
            return
        source = got.row.monotone.removeprefix("re-costed from ") or ref[job.key].key[:12]
        why = (got.row.error if not got.row.ok else
               f"{source}'s plan re-costed here moves {got.row.dram_bytes} DRAM bytes and "
               f"scores {monotone_metric(got.row):g} for {got.row.objective}, not within "
               f"{smaller.dram_bytes} and {monotone_metric(smaller):g}")
        note = f"not monotone: {why}"
        rows[job.key] = store.put(job, Outcome(replace(old, monotone=note[:500])))
        warnings.append(f"{old.model} on {old.chip} {dict(old.axes)}: {note}")

    return keep


def repair_curves(runner: Runner, store: Store, jobs: Sequence[Job], axis_keys: Sequence[str],
                  rows: dict[str, PointResult], verify: bool, progress: Progress | None,
                  counter: list[int], warnings: list[str], tried: set[tuple[str, str]]) -> int:
    """Make every capacity curve non-increasing in DRAM bytes and in its objective. Along a
    curve, a point is in order when it is no worse in both than the nearest smaller capacity
    in order (:func:`in_order`); a point out of order (or without a plan) gets that
    capacity's plan re-costed on its chip, which is kept if it is in order — for latency and
    energy this may trade the point's own better score for fewer bytes: the DRAM curve is
    the promise. A re-costing that fails or does not help marks the row (`monotone`) and adds
    a warning. A point that errored is left as it is (the sweep reports it). ``tried`` holds
    the (point, source) pairs re-costed so far (never twice). Returns how many points
    changed."""
    repaired = 0
    for axis in capacity_axes(axis_keys):
        while True:  # each wave tries pairs not tried before, so it ends
            todo: list[Job] = []
            calls: list[Call] = []
            ref: dict[str, Job] = {}
            for curve in curves([j for j in jobs if j.key in rows], axis):
                best: Job | None = None  # the nearest smaller capacity in order
                for j in curve:
                    row = rows[j.key]
                    if row.status == "error":
                        continue  # a bug or a dead worker: reported (and re-run), not masked
                    if best is not None and not in_order(row, rows[best.key]):
                        if (j.key, best.key) not in tried:
                            tried.add((j.key, best.key))
                            todo.append(j)
                            ref[j.key] = best
                            calls.append((recost_point, (
                                j, store.plan_doc(rows[best.key]), f"{axis}={best.value(axis)}",
                                verify)))
                    elif row.ok:
                        best = j
            if not todo:
                break
            improved = [0]
            run_calls(runner, todo, calls,
                      _keeping_in_order(store, rows, ref, improved, warnings), progress,
                      counter, counter[0] + len(calls))
            repaired += improved[0]
    return repaired


def bisect_curves(runner: Runner, store: Store, jobs: Sequence[Job], axis_keys: Sequence[str],
                  target: Target, rows: dict[str, PointResult], verify: bool, resume: bool,
                  progress: Progress | None, counter: list[int],
                  task: Callable[[Job, bool], Outcome], repair: Callable[[], object]
                  ) -> tuple[Probe, ...]:
    """Per capacity curve, the smallest capacity meeting the target, by bisection over the
    axis's values (the target holds from some capacity on); each round's probes of all
    curves run as one batch of tasks, and ``repair`` makes the probed curves monotone before
    their results decide anything."""
    axes = capacity_axes(axis_keys)
    if len(axes) != 1:
        raise InputError(f"--target needs exactly one swept capacity axis (a `*.bytes` key "
                         f"under `sweep:`); the spec sweeps {list(axes) or 'none'}.")
    axis = axes[0]
    lines = curves(jobs, axis)
    bounds = [[0, len(c)] for c in lines]  # answer index in [lo, hi]; hi = len: none meets
    probes = [0] * len(lines)
    while True:
        batch = [(k, (lo + hi) // 2) for k, (lo, hi) in enumerate(bounds) if lo < hi]
        if not batch:
            break
        todo = [lines[k][mid] for k, mid in batch]
        fresh = [j for j in todo
                 if j.key not in rows and not (resume and reuse(store, j, rows, verify))]
        run_calls(runner, fresh, [(task, (j, verify)) for j in fresh], storing(store, rows),
                  progress, counter, counter[0] + len(fresh))
        repair()
        for (k, mid), j in zip(batch, todo, strict=True):
            probes[k] += 1
            if target.met(rows[j.key]):
                bounds[k][1] = mid
            else:
                bounds[k][0] = mid + 1
    out = []
    for curve, (lo, _), n in zip(lines, bounds, probes, strict=True):
        first = curve[0]
        p = first.point
        out.append(Probe(p.model.model, p.model.batch, p.chip, axis,
                         curve[lo].value(axis) if lo < len(curve) else None, n,
                         tuple((k, v) for k, v in first.axis_values if k != axis),
                         first.rules_file, p.solver, p.objective))
    return tuple(out)
