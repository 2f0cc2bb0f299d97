"""Design-space sweeps: many (model, chip, rules, solver, objective) points, planned as Ray tasks.

A sweep starts from a SPEC file (README "Sweeps")::

    models: [zoo:squeezenet, {model: zoo:resnet50, batch: [1, 4]}]
    chips:
      - hw: cluster4x4
        set: {dram.bandwidth_gbps: 128}                   # fixed overrides
        sweep: {sram.bytes: [256KiB, 1MiB, 4MiB]}         # axes, in --set syntax
    objectives: [traffic]
    solvers: [cpsat]

:func:`load_spec` reads it (errors name FILE:LINE:COL), :func:`expand` makes the points (the
cross product, or the spec's explicit ``points:`` list) and :func:`address` resolves each one:
the chip is built with the same ``--set`` machinery as the CLI, and the point gets a content
address (sha256 over the model file's sha, the chip after overrides, the rules file's sha, the
solver, the objective, the time limit and the fuseplan version).

:func:`run_sweep` plans the points through a runner (:class:`RayRunner`, or
:class:`SerialRunner` in this process) and keeps one row file and one plan file per address
under the output directory, written atomically by the driver: a re-run with ``resume`` skips
finished points, a retried task can never add a second row, and an interrupted sweep loses
nothing it had finished. Along each capacity axis (a swept ``*.bytes`` key) results are made
monotone in DRAM bytes and in the objective: where a larger capacity's plan is worse in either
than a smaller capacity's, the smaller one's plan is re-costed on the larger chip (it fits
there) and kept if that puts the curve in order (:func:`in_order`). With a target
(``x_floor<=1.1``) the sweep instead bisects each capacity curve for the smallest capacity that
meets it.

The modules, each importing only those above it:

- ``spec``: reading and validating the SPEC file into its points;
- ``keys``: content addresses (the code's version and source digest included);
- ``rows``: a point's row of results, and what a task returns;
- ``tasks``: planning one point, re-costing a plan on a larger capacity (Ray task bodies);
- ``runners``: running tasks in this process or on Ray;
- ``curves``: capacity curves, their order and knee;
- ``store``: row and plan files on disk; ``table``: the Parquet/CSV results table;
- ``search``: monotone repair of the curves, bisection for a target;
- ``driver``: :func:`run_sweep`.
"""

from fuseplan.planner.app.sweep.curves import capacity_axes, curves, in_order, knee, monotone_metric
from fuseplan.planner.app.sweep.driver import SweepInterrupted, SweepResult, run_sweep
from fuseplan.planner.app.sweep.keys import Job, address, content_key, source_digest
from fuseplan.planner.app.sweep.rows import Outcome, PointResult
from fuseplan.planner.app.sweep.runners import (
    Call,
    Failure,
    Progress,
    RayRunner,
    Runner,
    SerialRunner,
)
from fuseplan.planner.app.sweep.search import TARGET_METRICS, Probe, Target, parse_target
from fuseplan.planner.app.sweep.spec import (
    MAX_POINTS,
    Axis,
    AxisValue,
    ChipEntry,
    ModelEntry,
    Point,
    Shapes,
    SweepSpec,
    expand,
    load_spec,
)
from fuseplan.planner.app.sweep.table import read_table, write_table
from fuseplan.planner.app.sweep.tasks import recost_point, solve_point

__all__ = [
    "MAX_POINTS",
    "TARGET_METRICS",
    "Axis",
    "AxisValue",
    "Call",
    "ChipEntry",
    "Failure",
    "Job",
    "ModelEntry",
    "Outcome",
    "Point",
    "PointResult",
    "Probe",
    "Progress",
    "RayRunner",
    "Runner",
    "SerialRunner",
    "Shapes",
    "SweepInterrupted",
    "SweepResult",
    "SweepSpec",
    "Target",
    "address",
    "capacity_axes",
    "content_key",
    "curves",
    "expand",
    "in_order",
    "knee",
    "load_spec",
    "monotone_metric",
    "parse_target",
    "read_table",
    "recost_point",
    "run_sweep",
    "solve_point",
    "source_digest",
    "write_table",
]
