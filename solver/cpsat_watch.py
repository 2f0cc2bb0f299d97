"""What a progress sink hears of a CP-SAT solve (solver.cpsat; issue 47): each better
solution's objective and each better bound, as planner.core.progress events."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from fuseplan.planner.core.progress import Progress, ProgressSink

if TYPE_CHECKING:
    from ortools.sat.python import cp_model


class Watch:
    """What a progress sink hears of a CP-SAT solve: each better solution's objective and
    each better bound, with the gap between them (planner.core.progress.Progress.gap). The
    callbacks come from CP-SAT's threads; a lock keeps the two numbers together."""

    def __init__(self, sink: ProgressSink, unit: str, candidates: int) -> None:
        self.sink, self.unit, self.candidates = sink, unit, candidates
        self.best: float | None = None
        self.bound: float | None = None
        self.solutions = 0
        self.lock = threading.Lock()

    def callback(self) -> cp_model.CpSolverSolutionCallback:
        """A solution callback telling the sink of each solution (CP-SAT calls it only for
        improving ones)."""
        from ortools.sat.python import cp_model

        watch = self

        class Solutions(cp_model.CpSolverSolutionCallback):
            def on_solution_callback(self) -> None:
                watch.on_solution(self.objective_value, self.best_objective_bound)

        return Solutions()

    def on_solution(self, objective: float, bound: float) -> None:
        """A better solution, and the bound when it was found."""
        with self.lock:
            self.solutions += 1
            self.best = objective if self.best is None else min(self.best, objective)
            self.bound = bound if self.bound is None else max(self.bound, bound)
            self._tell()

    def on_bound(self, bound: float) -> None:
        """A better bound (CP-SAT's best_bound_callback)."""
        with self.lock:
            self.bound = bound if self.bound is None else max(self.bound, bound)
            self._tell()

    def _tell(self) -> None:
        bound = self.bound if self.best is None or self.bound is None \
            else min(self.bound, self.best)
        self.sink(Progress("CP-SAT", self.solutions, None, self.candidates, 0, self.best,
                           bound, self.unit))
