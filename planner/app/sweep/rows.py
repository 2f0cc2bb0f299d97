"""Rows of a sweep's results: one :class:`PointResult` per point, and what a task returns.

A row is made from a plan (:func:`plan_row`) or, for a point without one, says why
(:func:`blank_row`); its fields are the results table's columns (README "Sweeps").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

from fuseplan.planner.app.sweep.keys import Job
from fuseplan.planner.app.sweep.spec import AxisValue, Shapes

__all__ = ["SOLVED", "Outcome", "PointResult", "blank_row", "plan_row", "relabel"]

# the solver statuses of a row with a plan
SOLVED = ("OPTIMAL", "FEASIBLE", "WHOLE_NETWORK_ON_CHIP", "RECOSTED")


@dataclass(frozen=True)
class PointResult:
    """One row of the results table (README "Sweeps" lists the columns)."""

    key: str
    model: str
    shapes: str  # "NAME=D0,D1,...;..." (empty: the model's own)
    batch: int | None
    chip: str
    axes: tuple[tuple[str, AxisValue], ...]
    rules: str
    solver: str
    objective: str
    status: str  # the solver's status, "infeasible" or "error"
    gap: float | None = None
    dram_bytes: int | None = None
    compulsory_dram_bytes: int | None = None
    layer_by_layer_dram_bytes: int | None = None
    cycles: int | None = None
    energy_pj: float | None = None
    groups: int | None = None
    solve_s: float | None = None
    verified: bool | None = None  # None: not verified
    plan: str = ""  # the plan file, relative to the sweep's folder ("" when there is none)
    monotone: str = ""  # "re-costed from sram.bytes=..." when a smaller capacity's plan won
    error: str = ""

    @property
    def ok(self) -> bool:
        """A plan was made for the point."""
        return self.status in SOLVED

    @property
    def x_floor(self) -> float | None:
        """DRAM bytes over the compulsory floor."""
        if self.dram_bytes is None or not self.compulsory_dram_bytes:
            return None
        return self.dram_bytes / self.compulsory_dram_bytes

    @property
    def x_layer(self) -> float | None:
        """DRAM bytes over the layer-by-layer plan's."""
        if self.dram_bytes is None or not self.layer_by_layer_dram_bytes:
            return None
        return self.dram_bytes / self.layer_by_layer_dram_bytes

    def value(self, metric: str) -> Any:
        """A column of the row by name (swept keys included)."""
        if metric in dict(self.axes):
            return dict(self.axes)[metric]
        return getattr(self, metric)

    def to_json(self) -> dict[str, Any]:
        """The row file's content."""
        doc = asdict(self)
        doc["axes"] = [[k, v] for k, v in self.axes]
        return doc

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> PointResult:
        """Read a row file written by :meth:`to_json`."""
        return cls(**{**doc, "axes": tuple((str(k), v) for k, v in doc["axes"])})


@dataclass(frozen=True)
class Outcome:
    """What a task returns: the row and, when a plan was made, its plan file document."""

    row: PointResult
    plan: dict[str, Any] | None = None


def _shapes_text(shapes: Shapes) -> str:
    return ";".join(f"{n}={','.join(map(str, d))}" for n, d in shapes)


def blank_row(job: Job, status: str, error: str = "") -> PointResult:
    """The row of ``job`` without results: its labels, a status and why."""
    p = job.point
    return PointResult(job.key, p.model.model, _shapes_text(p.model.shapes), p.model.batch,
                       p.chip, job.axis_values, job.rules_file, p.solver, p.objective, status,
                       error=error)


def plan_row(job: Job, plan: Any, verified: bool | None, monotone: str = "") -> PointResult:
    """The row of ``job`` planned by ``plan`` (a :class:`~fuseplan.planner.plan.data.Plan`)."""
    t = plan.totals
    gap = plan.solver.get("gap")
    wall = plan.solver.get("wall_s")
    return replace(blank_row(job, str(plan.solver.get("status", ""))),
                   gap=None if gap is None else float(gap), dram_bytes=int(t.dram_bytes),
                   compulsory_dram_bytes=int(plan.compulsory_dram_bytes),
                   layer_by_layer_dram_bytes=int(plan.layer_by_layer_dram_bytes),
                   cycles=int(t.cycles), energy_pj=round(float(t.energy_pj), 3),
                   groups=len(plan.groups), solve_s=None if wall is None else float(wall),
                   verified=verified, monotone=monotone)


def relabel(job: Job, row: PointResult) -> PointResult:
    """A stored row with the labels of ``job`` (results, plan and marks kept)."""
    label = blank_row(job, row.status)
    return replace(row, key=label.key, model=label.model, shapes=label.shapes,
                   batch=label.batch, chip=label.chip, axes=label.axes, rules=label.rules,
                   solver=label.solver, objective=label.objective)
