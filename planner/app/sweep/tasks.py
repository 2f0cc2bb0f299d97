"""The tasks of a sweep: plan one point, or re-cost a smaller capacity's plan on it.

They are module-level functions so that Ray workers can import them; each returns an
:class:`~fuseplan.planner.app.sweep.rows.Outcome` and raises only on a bug.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fuseplan.planner.app import api
from fuseplan.planner.app.assemble import assemble
from fuseplan.planner.app.sweep.keys import Job
from fuseplan.planner.app.sweep.rows import Outcome, blank_row, plan_row
from fuseplan.planner.core.errors import InputError, PlanningError
from fuseplan.planner.plan import schema
from fuseplan.planner.plan.json_io import plan_from_doc, plan_to_json

__all__ = ["recost_point", "solve_point"]


def _prepare(job: Job) -> api.Problem:
    p = job.point
    return api.prepare(p.model.model, p.rules, p.hw, dict(p.model.shapes), p.overrides)


def _verified(problem: api.Problem, plan: Any, verify: bool) -> bool | None:
    return api.verify_in_memory(problem, plan).ok if verify else None


def solve_point(job: Job, verify: bool = False) -> Outcome:
    """Plan one point (a Ray task's body): its row and plan document. A point without a plan
    (infeasible, or a model the planner rejects at these shapes) is a row saying why."""
    try:
        problem = _prepare(job)
        plan = api.plan_problem(problem, job.point.solver, job.point.objective,
                                job.point.time_limit)
    except PlanningError as exc:
        return Outcome(blank_row(job, "infeasible", str(exc)))
    except InputError as exc:
        return Outcome(blank_row(job, "error", str(exc)))
    return Outcome(plan_row(job, plan, _verified(problem, plan, verify)), plan_to_json(plan))


def recost_point(job: Job, smaller: Mapping[str, Any], source: str,
                 verify: bool = False) -> Outcome:
    """A smaller capacity's plan re-costed on this point's chip (a larger capacity holds
    every tile the smaller one held), its row marked with where it came from."""
    where = f"the plan of {source}"
    try:
        problem = _prepare(job)
        old = plan_from_doc(schema.validate(dict(smaller), where), problem.graph,
                            problem.model.sha256, where)
        info = {**dict(old.solver), "status": "RECOSTED", "gap": None, "recosted_from": source}
        plan = assemble(problem.graph, problem.chip, [g.placement for g in old.groups],
                        objective=old.objective, solver=info, **problem.plan_header())
    except (InputError, PlanningError) as exc:  # the point keeps its own result
        return Outcome(blank_row(job, "error", f"re-costing the plan of {source}: {exc}"))
    row = plan_row(job, plan, _verified(problem, plan, verify), f"re-costed from {source}")
    return Outcome(row, plan_to_json(plan))
