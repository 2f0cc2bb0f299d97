"""CLI command ``sweep``: plan a design space of models x chips as Ray tasks (README "Sweeps").

``planner.ui.cli`` adds it to its app with ``register(app)``. It follows the CLI's conventions:
bad input exits with 2 (a one-paragraph message naming FILE:LINE:COL), ``--json`` prints exactly
one JSON document on stdout, a failed verification, a point that errored or a ``--target`` that
some curve never meets exits with 1, and Ctrl-C (whenever it comes) keeps the finished points,
prints one line and exits with 130 (SIGTERM likewise, with 143). While Ray runs, whatever it
or its workers print goes to stderr: stdout keeps the one answer.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer

from fuseplan.planner.core.errors import InputError
from fuseplan.planner.core.units import fmt_bytes
from fuseplan.planner.ui import Interruption
from fuseplan.planner.ui.cli_common import (
    JsonOpt,
    Output,
    check_files,
    emit,
    err,
    guarded,
    say,
    show,  # the human summary (stdout)
    yaml_in,
)
from fuseplan.planner.ui.ending import exit_code, write_error

if TYPE_CHECKING:  # the sweep machinery (Ray, pandas) loads when a sweep runs
    from fuseplan.planner.app.sweep import Probe, SweepResult, Target


@guarded
def sweep(spec: Path,
          out: Annotated[Path, typer.Option("--out", help="Folder for the table, the rows and "
                                            "the plan files.")] = Path("sweep-out"),
          address: Annotated[str | None, typer.Option(
              "--address", help="Run on this Ray cluster (e.g. ray://head:10001 or auto); "
                                "default: Ray started on this machine's cores.")] = None,
          resume: Annotated[bool, typer.Option(
              "--resume", help="Skip points whose row and plan are already in --out.")] = False,
          verify: Annotated[bool, typer.Option(
              "--verify", help="Emulate every plan against onnxruntime.")] = False,
          report: Annotated[Path | None, typer.Option(
              "--report", help="Write a self-contained HTML page of the curves.")] = None,
          target: Annotated[str | None, typer.Option(
              "--target", help="Bisect each capacity curve for the smallest capacity meeting "
                               "METRIC OP NUMBER, e.g. 'x_floor<=1.1'.")] = None,
          serial: Annotated[bool, typer.Option(
              "--serial", help="Plan the points one by one in this process (no Ray).")] = False,
          cpus: Annotated[int | None, typer.Option(
              "--cpus", min=1, help="CPUs of the local Ray (default: all).")] = None,
          as_json: JsonOpt = False) -> None:
    """Plan every point of SPEC (models x chips x axes x rules x solvers x objectives)."""
    from fuseplan.planner.app.sweep import SweepInterrupted, load_spec, parse_target

    _cpus_bounded(cpus)
    check_files([yaml_in(spec, "SPEC", "sweep spec")],  # before anything is read or made
                [Output("--out", out, "sweep folder", folder=True,
                        writes=("sweep.csv", "sweep.parquet", "rows/", "plans/")),
                 Output("--report", report, "HTML report")])
    parsed = load_spec(spec)
    goal = parse_target(target) if target is not None else None
    _writable(out, "--out", create=True)
    if report is not None:
        _writable(report.parent, "--report", create=False)
    try:
        try:
            result = _run(parsed, out, address, resume, verify, goal, serial, cpus)
        except SweepInterrupted as stop:
            r = stop.result
            if as_json:
                emit({**_summary(r, None, goal), "interrupted": True})
            _interrupted(spec, out, f"{r.points} points finished and kept in {out} "
                                    f"({r.failed} without a plan)")
    except KeyboardInterrupt:  # while Ray starts or stops, or a second Ctrl-C at the end
        _interrupted(spec, out, f"finished points are kept in {out}")
    report_path = None
    if report is not None:
        from fuseplan.planner.ui.sweep_report import write_sweep_report

        write_sweep_report(result, report, goal, title=parsed.name)
        report_path = str(report)
    mismatched = sum(r.verified is False for r in result.rows)
    unmet = [p for p in result.bisection if p.smallest is None]
    if as_json:
        emit(_summary(result, report_path, goal))
    else:
        _print_summary(result, goal, report_path)
    for warning in result.warnings:
        say(warning, "warning")
    problems = []
    if mismatched:
        problems.append(f"{mismatched} plans failed verification (column `verified`).")
    if result.errored:
        problems.append(f"{result.errored} points errored (status `error`); the first: "
                        f"{result.first_error} — `--resume` plans them again.")
    if unmet:
        problems.append(f"{len(unmet)} curves meet {goal} at no swept capacity: "
                        + "; ".join(_curve(p) for p in unmet[:3])
                        + ("; ..." if len(unmet) > 3 else "") + ".")
    for problem in problems:
        say(problem)
    if problems:
        raise typer.Exit(1)


def _curve(p: Probe) -> str:
    return f"{p.model}" + (f" (batch {p.batch})" if p.batch is not None else "") + \
        f" on {p.chip}"


def _interrupted(spec: Path, out: Path, kept: str) -> NoReturn:
    text = f"{kept}; `fuseplan sweep {spec} --out {out} --resume` plans the rest."
    say(text, "interrupted")
    write_error(text, exit_code())  # under --json, unless the summary was printed
    Interruption.reported = True
    raise typer.Exit(exit_code()) from None


def _cpus_bounded(cpus: int | None) -> None:
    """--cpus at most the machine's CPUs: more only multiplies Ray's workers and memory."""
    machine = os.cpu_count() or 1
    if cpus is not None and cpus > machine:
        raise InputError(f"--cpus {cpus}: this machine has {machine} CPUs. Pass at most "
                         f"--cpus {machine}, or leave it out to use them all.")


@contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """Within the block, anything written to this process's stdout (Ray's messages, a dying
    worker's warning, from Python or from Ray's C++ core) goes to stderr."""
    sys.stdout.flush()
    try:
        kept = os.dup(1)
    except OSError:  # no stdout at all: nothing to keep clean
        yield
        return
    try:
        os.dup2(2, 1)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(kept, 1)
        os.close(kept)


def _writable(folder: Path, option: str, create: bool) -> None:
    """Fail before planning, not after an hour of it, when results cannot be written."""
    try:
        if create:
            folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"{option} {folder}: cannot create the folder ({exc.strerror}). "
                         f"Choose a folder you can write to, e.g. `{option} "
                         f"{Path.home() / folder.name}`.") from None
    if not folder.is_dir():
        raise InputError(f"{option}: {folder} is not a folder (it does not exist, or is a "
                         "file). Create it or choose another path.")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise InputError(f"{option}: cannot write in {folder} (permission denied). Choose a "
                         f"folder you can write to, or fix its permissions (`chmod u+w "
                         f"{folder}`).")


def _run(parsed: Any, out: Path, address: str | None, resume: bool, verify: bool,
         goal: Target | None, serial: bool, cpus: int | None) -> SweepResult:
    """Run the sweep with a progress bar on stderr (when it is a terminal)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    from fuseplan.planner.app.sweep import RayRunner, SerialRunner, run_sweep

    bar = Progress("[progress.description]{task.description}", BarColumn(),
                   MofNCompleteColumn(), TimeRemainingColumn(), console=err, transient=True,
                   disable=not err.is_terminal)
    task = bar.add_task("sweep", total=None)

    def progress(done: int, total: int) -> None:
        bar.update(task, completed=done, total=max(total, done))

    with bar:
        if serial:
            return run_sweep(parsed, out, SerialRunner(), resume=resume, verify=verify,
                             target=goal, progress=progress)
        with _stdout_to_stderr(), RayRunner(address, cpus) as runner:
            return run_sweep(parsed, out, runner, resume=resume, verify=verify, target=goal,
                             progress=progress)


def _print_summary(result: SweepResult, goal: Target | None, report_path: str | None) -> None:
    """The human summary on stdout."""
    show(f"{result.points} points: {result.done} planned, {result.failed} without a plan, "
         f"{result.skipped} already done, {result.repaired} re-costed for monotone curves, "
         f"{result.wall_s:.1f} s")
    for p in result.bisection:
        smallest = "none" if p.smallest is None else fmt_bytes(p.smallest) \
            if p.axis.endswith("bytes") and not isinstance(p.smallest, str) else p.smallest
        show(f"{_curve(p)}: smallest {p.axis} meeting {goal}: {smallest} ({p.probes} probes)")
    show(f"table: {result.table} and {result.csv}"
         + (f"; report: {report_path}" if report_path else ""))


def _summary(result: SweepResult, report: str | None, goal: Target | None) -> dict[str, Any]:
    """The ``--json`` document."""
    doc: dict[str, Any] = {"points": result.points, "done": result.done,
                           "failed": result.failed, "skipped": result.skipped,
                           "repaired": result.repaired, "table": result.table,
                           "csv": result.csv, "report": report, "wall_s": result.wall_s,
                           "errored": result.errored, "warnings": list(result.warnings)}
    if goal is not None:
        doc["target"] = {"expr": str(goal), "curves": [
            {"model": p.model, "batch": p.batch, "chip": p.chip, "axis": p.axis,
             "smallest": p.smallest, "probes": p.probes} for p in result.bisection]}
    return doc


def register(app: typer.Typer) -> None:
    """Add the ``sweep`` command to ``app``."""
    app.command("sweep")(sweep)
