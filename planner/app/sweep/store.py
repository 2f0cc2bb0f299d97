"""A sweep's folder on disk: one row file and one plan file per point, each written whole.

``rows/KEY.json`` holds a point's row (KEY: its content address) and
``plans/MODEL-KEY-HASH.json`` its plan, both written by the driver through
:func:`~fuseplan.planner.core.files.write_atomic`: a re-run with ``resume`` takes finished
points from here, a retried task can never add a second row, and an interrupted sweep loses
nothing it had finished. The results table beside them is
:mod:`~fuseplan.planner.app.sweep.table`'s.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from fuseplan.planner.app.sweep.keys import Job
from fuseplan.planner.app.sweep.rows import Outcome, PointResult, relabel
from fuseplan.planner.core.files import write_atomic

__all__ = ["Store", "reuse", "storing"]


class Store:
    """The sweep folder: rows/KEY.json and plans/MODEL-KEY-HASH.json, written atomically by
    the driver. A plan file is named after its content and written before the row that
    points at it, so a row never names a plan it does not match, whenever the driver stops."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.reused = 0  # finished points found here and not planned again
        (out / "rows").mkdir(parents=True, exist_ok=True)
        (out / "plans").mkdir(parents=True, exist_ok=True)

    def row_path(self, job: Job) -> Path:
        """Where a point's row is kept (its address)."""
        return self.out / "rows" / f"{job.key}.json"

    def plan_path(self, job: Job, text: str) -> Path:
        """Where a plan document of the point is kept: named after the model, the address
        and the document's own digest (a re-costed plan never overwrites the row's plan)."""
        stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", Path(job.point.model.model).stem.replace(
            "zoo:", ""))
        digest = hashlib.sha256(text.encode()).hexdigest()[:12]
        return self.out / "plans" / f"{stem}-{job.key[:16]}-{digest}.json"

    def _stored(self, job: Job) -> PointResult | None:
        try:
            return PointResult.from_json(json.loads(self.row_path(job).read_text()))
        except (OSError, ValueError, TypeError, KeyError):
            return None  # missing or unreadable

    def _plan_readable(self, row: PointResult) -> bool:
        try:
            doc = json.loads((self.out / row.plan).read_text())
        except (OSError, ValueError):
            return False
        return isinstance(doc, dict) and "groups" in doc

    def finished(self, job: Job) -> PointResult | None:
        """The stored row of a finished point: a plan whose file exists and parses, or a
        point shown infeasible (planning it again would say so again). A point that erred
        (a bug, a worker that kept dying) is not finished: it is planned again."""
        row = self._stored(job)
        if row is None or row.status == "error":
            return None
        if row.ok or row.plan:
            return row if row.plan and self._plan_readable(row) else None
        return row

    def plan_doc(self, row: PointResult) -> dict[str, Any]:
        """The plan document a stored row points at."""
        return dict(json.loads((self.out / row.plan).read_text()))

    def put(self, job: Job, outcome: Outcome) -> PointResult:
        """Write the plan (if any) under a new name, then the row pointing at it, then delete
        the plan the point's previous row pointed at (stale now). ``outcome.plan`` None keeps
        ``outcome.row.plan`` as it is (a row re-marked, its plan unchanged)."""
        row = outcome.row
        old = self._stored(job)
        if outcome.plan is not None:
            text = json.dumps(outcome.plan, indent=2) + "\n"
            plan_file = self.plan_path(job, text)
            write_atomic(plan_file, text, "plan file")
            row = replace(row, plan=str(plan_file.relative_to(self.out)))
        write_atomic(self.row_path(job), json.dumps(row.to_json()) + "\n", "sweep row")
        if old is not None and old.plan and old.plan != row.plan:
            (self.out / old.plan).unlink(missing_ok=True)
        return row

    def remove_partial(self) -> None:
        """Delete temporary files a stopped write left behind."""
        for sub in (self.out, self.out / "rows", self.out / "plans"):
            for f in sub.glob(".*.tmp*"):
                f.unlink(missing_ok=True)


def storing(store: Store, rows: dict[str, PointResult]) -> Callable[[Job, Outcome], None]:
    """A ``keep`` for :func:`~fuseplan.planner.app.sweep.runners.run_calls`: store each
    outcome and note its row in ``rows``."""
    def keep(job: Job, outcome: Outcome) -> None:
        rows[job.key] = store.put(job, outcome)

    return keep


def reuse(store: Store, job: Job, rows: dict[str, PointResult], verify: bool) -> bool:
    """Take a finished point's stored results, if there are (and were verified, if the sweep
    verifies and there is a plan). Only the results come from disk: the labels (model path,
    chip name, rules file, ...) are the current spec's, which may name the same content
    differently."""
    row = store.finished(job)
    if row is not None and verify and row.ok and row.verified is None:
        row = None
    if row is not None:
        rows[job.key] = relabel(job, row)
        store.reused += 1
    return row is not None
