"""What every CLI module shares: the consoles, the progress spinner, the error guard, the
``--json`` output and the options spelled the same in every command.

``planner.ui.cli``, ``planner.ui.cli_views`` and ``planner.ui.cli_sweep`` import this module
and nothing of each other but their ``register`` functions, so their imports run one way.
"""

from __future__ import annotations

import functools
import json
import multiprocessing
import signal
import sys
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console

from fuseplan.planner.core.errors import InputError, Interrupted, PlanningError
from fuseplan.planner.core.files import Input, Output, check_io
from fuseplan.planner.ui import Interruption

__all__ = ["F", "Input", "JsonOpt", "Output", "SetOpt", "check_files", "emit", "err", "guarded",
           "golden_in", "hw_in", "model_in", "out", "plan_in", "rules_in", "say", "settings",
           "working", "yaml_in"]

F = TypeVar("F", bound=Callable[..., Any])

out = Console()  # results (stdout)
err = Console(stderr=True)  # messages and progress (stderr): stdout stays clean for --json

SetOpt = Annotated[list[str] | None, typer.Option(
    "--set", help="Chip override KEY=VALUE, e.g. sram.bytes=256KiB.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")]


class Settings:
    """Options every command shares (set by the app's callback in ``planner.ui.cli``)."""

    quiet = False


settings = Settings()


def working(what: str) -> AbstractContextManager[Any]:
    """A progress spinner on stderr for a long step (stdout stays clean for --json)."""
    if settings.quiet or not err.is_terminal:
        return nullcontext()
    return err.status(what)


def say(text: str) -> None:
    """Print a message on stderr as one unbroken paragraph."""
    # the terminal wraps it, and a long path in it is never cut in two (a log or a test
    # reading stderr finds the file name whole)
    err.print(text, markup=False, highlight=False, soft_wrap=True)


def emit(doc: Any) -> None:
    """Print the ``--json`` document on stdout."""
    sys.stdout.write(json.dumps(doc, indent=2) + "\n")


def _stop_workers() -> None:
    """After a Ctrl-C, stop every worker process this command started that is still running
    (they ignore the signal: the planner stops them as it unwinds, and this makes sure none
    outlives the command, whichever moment the interrupt cut)."""
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        children = multiprocessing.active_children()
        for child in children:
            child.terminate()
        for child in children:
            child.join(5)
            if child.is_alive():
                child.kill()
                child.join(1)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def guarded(fn: F) -> F:
    """Turn fuseplan's errors into exit codes and one-paragraph messages."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except InputError as exc:
            say(f"error: {exc}")
            raise typer.Exit(2) from None
        except PlanningError as exc:
            say(f"{exc.label}: {exc}")
            raise typer.Exit(1) from None
        except Interrupted as exc:
            _stop_workers()
            say(f"interrupted: {exc}")
            Interruption.reported = True
            raise typer.Exit(130) from None
        except KeyboardInterrupt:
            _stop_workers()
            say("interrupted: stopped before any output file was complete; no partial file "
                "was left.")
            Interruption.reported = True
            raise typer.Exit(130) from None

    return wrapper  # type: ignore[return-value]


# ------------------------------------------------------------------ the files a command reads

def model_in(model: str | Path | None, option: str = "MODEL") -> Input:
    """The model argument as an input (a zoo: name is no file and is not checked)."""
    path = None if model is None or str(model).startswith("zoo:") else Path(model)
    return Input(option, path, "ONNX model", None, "Pass the path of an .onnx file.")


def plan_in(plan: str | Path | None, option: str = "PLAN") -> Input:
    """A plan file argument, capped at planner.plan.schema.MAX_PLAN_BYTES."""
    from fuseplan.planner.plan.schema import MAX_PLAN_BYTES

    return Input(option, plan, "plan file", MAX_PLAN_BYTES,
                 "Pass a plan file written by `fuseplan solve MODEL -o PLAN.json`.")


def yaml_in(path: str | Path | None, option: str, what: str) -> Input:
    """A YAML file (rules, chip, sweep spec), capped at yamlio.MAX_YAML_BYTES."""
    from fuseplan.planner.core.yamlio import MAX_YAML_BYTES

    return Input(option, path, what, MAX_YAML_BYTES, f"Pass the path of the {what} (YAML).")


def rules_in(rules: str | Path | None) -> Input:
    """--rules as an input."""
    return yaml_in(rules, "--rules", "rule file")


def hw_in(hw: str | None) -> Input:
    """--hw as an input: a chip YAML path, or the file of a preset name."""
    from fuseplan.hardware.chip import PRESETS, _looks_like_path, preset_path

    path: Path | None = None
    if hw is not None:
        path = Path(hw) if _looks_like_path(hw) else preset_path(hw) if hw in PRESETS else None
    return yaml_in(path, "--hw", "chip file")


def golden_in(golden: Path | None) -> Input:
    """--golden (stored outputs, .npz) as an input."""
    return Input("--golden", golden, "golden file", None,
                 "Pass a file written by `fuseplan verify --save-golden`.")


def check_files(inputs: Sequence[Input], outputs: Sequence[Output] = ()) -> None:
    """Check a command's inputs and outputs before any work (planner.core.files.check_io):
    no output may overwrite an input or another output, or be a device, FIFO or kernel file;
    every input must be a regular file within its size cap."""
    check_io(inputs, outputs)
