"""What every CLI module shares: the consoles, the progress spinner, the error guard, the
``--json`` output and the options spelled the same in every command.

``planner.ui.cli``, ``planner.ui.cli_views`` and ``planner.ui.cli_sweep`` import this module
and nothing of each other but their ``register`` functions, so their imports run one way.
"""

from __future__ import annotations

import functools
import multiprocessing
import re
import signal
import sys
import traceback
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.text import Text
from typer.core import TyperGroup
from typer.exceptions import TyperException

from fuseplan.planner.core.errors import InputError, Interrupted, PlanningError
from fuseplan.planner.core.files import Input, Output, check_io
from fuseplan.planner.ui import Interruption
from fuseplan.planner.ui.ending import (
    Answer,
    exit_code,
    interrupted_kind,
    write_doc,
    write_error,
)
from fuseplan.planner.ui.ending import printable as printable
from fuseplan.planner.ui.tables import Layout, paragraph

__all__ = ["AnswerGroup", "F", "Input", "JsonOpt", "Output", "SetOpt", "WideOpt", "check_files",
           "emit", "err", "golden_in", "guarded", "hw_in", "model_in", "out", "plan_in",
           "printable", "rules_in", "say", "settings", "show", "warn", "working", "yaml_in"]

F = TypeVar("F", bound=Callable[..., Any])



class _Console(Console):
    """A console that shows every string it renders (a table cell, a printed line) with its
    control and format characters escaped; the line breaks of a multi-line cell stay."""

    def render_str(self, text: str, **kwargs: Any) -> Any:
        """Rich's render_str of the escaped text."""
        return super().render_str(printable(text, keep="\n"), **kwargs)


out = _Console()  # results (stdout)
err = _Console(stderr=True)  # messages and progress (stderr): stdout stays clean for --json

SetOpt = Annotated[list[str] | None, typer.Option(
    "--set", help="Chip override KEY=VALUE, e.g. sram.bytes=256KiB.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")]


def _wide(value: bool) -> bool:
    if value:
        Layout.wide = True
    return value


WideOpt = Annotated[bool, typer.Option(
    "--wide", callback=_wide,
    help="Show every column (a terminal 120 or more columns wide shows them anyway).")]


class Settings:
    """Options every command shares (set by the app's callback in ``planner.ui.cli``)."""

    quiet = False


settings = Settings()


def working(what: str, as_json: bool = False) -> AbstractContextManager[Any]:
    """The progress display of a long step on stderr (planner.ui.progress: phase, elapsed
    time, candidates searched and ruled out, best plan so far, CP-SAT's gap), yielding the
    sink to pass the library's ``progress=``; None and nothing shown under --json or
    --quiet, or when stderr is no terminal (stdout stays clean)."""
    from fuseplan.planner.ui.progress import progress_display

    return progress_display(what, enabled=not (as_json or settings.quiet), console=err)


# how a message's first word is shown on a colour terminal (NO_COLOR and a stderr that is
# no terminal show it plain: rich's console decides)
_LABEL_STYLE = {"error": "bold red", "planner bug": "bold red", "no plan": "bold red",
                "interrupted": "bold yellow", "warning": "yellow"}


def _relative(text: str) -> str:
    """`text` with the working directory's absolute paths written relative to it."""
    try:
        cwd = str(Path.cwd())
    except OSError:
        return text
    if cwd == "/":
        return text
    # a path that begins with the working directory (not one that merely contains it)
    return re.sub(r"(?<![\w./~-])" + re.escape(cwd.rstrip("/") + "/"), "", text)


def say(text: str, label: str | None = None) -> None:
    """Print a message on stderr as one paragraph (a line break or any other control
    character it quotes, from a layer name, is shown escaped), `label` (``error``,
    ``warning``) in colour before it; paths under the working directory are written
    relative to it. On a terminal the paragraph is wrapped at its width between words;
    elsewhere (a log, a test reading stderr) it stays one line, a file name whole."""
    body = printable(_relative(text))
    head = f"{label}: " if label else ""
    if err.is_terminal:
        lines = paragraph(head + body, err.width)
        body = "\n".join(lines)[len(head):]
    message = Text.assemble((head.rstrip(), _LABEL_STYLE.get(label or "", "")),
                            " " if head else "", body)
    err.print(message, highlight=False, soft_wrap=True)


def warn(text: str) -> None:
    """A warning on stderr (``warning:`` in colour)."""
    say(text, "warning")


def show(text: str) -> None:
    """A line of a command's answer on stdout, wrapped at the console's width between words
    (a number keeps its unit; paths under the working directory are written relative)."""
    for line in paragraph(printable(_relative(text)), out.width):
        out.print(line, markup=False, highlight=False, soft_wrap=True)


def emit(doc: Any) -> None:
    """Print the ``--json`` document on stdout (once: an error after it adds no second)."""
    write_doc(doc)


def _ended(label: str, text: str, code: int) -> typer.Exit:
    """Say "label: text" on stderr and, under --json, the error document of `text` on
    stdout; the exit that ends the command."""
    text = _relative(text)  # the same paragraph on stderr and in the JSON document
    say(text, label)
    write_error(text, code)
    return typer.Exit(code)


def _stop_workers() -> None:
    """After a Ctrl-C, stop every worker process this command started that is still running
    (they ignore the signal: the planner stops them as it unwinds, and this makes sure none
    outlives the command, whichever moment the interrupt cut)."""
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
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
    """Turn fuseplan's errors into exit codes and one-paragraph messages on stderr and, under
    ``--json``, the error document on stdout (planner.ui.ending): 2 bad input (an OSError
    of the machine too: a full disk, a folder that cannot be written), 1 the answer "no" or a
    planner bug (an unexpected exception: said in one paragraph, never a traceback), 130 a
    Ctrl-C and 143 a SIGTERM."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("as_json"):
            Answer.wanted = True
        try:
            return fn(*args, **kwargs)
        except InputError as exc:
            raise _ended("error", str(exc), 2) from None
        except PlanningError as exc:
            raise _ended(exc.label, str(exc), 1) from None
        except Interrupted as exc:
            _stop_workers()
            Interruption.reported = True
            raise _ended("interrupted", str(exc), exit_code()) from None
        except KeyboardInterrupt:  # SIGTERM too (planner.ui.ending.Terminated)
            _stop_workers()
            Interruption.reported = True
            raise _ended("interrupted", "stopped before any output file was complete; no "
                         "partial file was left.", exit_code()) from None
        except typer.Exit as exc:
            if exc.exit_code:  # a command that said "no" without a document of its own
                write_error(f"the command ended with exit {exc.exit_code}; stderr says why.",
                            exc.exit_code)
            raise
        except (TyperException, typer.Abort):
            raise  # a usage error: AnswerGroup answers it
        except OSError as exc:
            raise _ended("error", _os_error(exc), 2) from None
        except Exception as exc:
            raise _ended("planner bug", _bug(exc), 1) from None

    return wrapper  # type: ignore[return-value]


def _os_error(exc: OSError) -> str:
    """An error of the machine (disk full, permission, read-only file system) in one
    paragraph naming the file."""
    name = f"{exc.filename}: " if exc.filename else ""
    return (f"{name}{exc.strerror or exc}. The machine refused the operation; free space, "
            "fix the permissions or choose another path.")


def _bug(exc: Exception) -> str:
    """An unexpected exception in one paragraph: its type, message and place."""
    frames = traceback.extract_tb(exc.__traceback__)
    place = f" at {frames[-1].filename.rsplit('/', 1)[-1]}:{frames[-1].lineno}" if frames else ""
    text = " ".join(str(exc).split())[:500]
    return (f"internal error ({type(exc).__name__}{place}: {text}). This is a fuseplan bug; "
            "please report it with the command line and the files it read.")


def _option_of(exc: TyperException) -> str | None:
    """The option or argument a usage error is about (``--time-limit``, ``MODEL``)."""
    param = getattr(exc, "param", None)
    opts = getattr(param, "opts", None)
    if opts:
        return str(max(opts, key=len))
    hint = getattr(exc, "param_hint", None)
    return hint if isinstance(hint, str) else None


def _help_of(exc: TyperException) -> str | None:
    """Where the usage is explained: the command's --help."""
    ctx = getattr(exc, "ctx", None)
    path = getattr(ctx, "command_path", None)
    return f"Run `{path} --help` for the options and arguments." if path else None


class AnswerGroup(TyperGroup):
    """The app's command group: under ``--json``, an exit that no command answered (a
    usage error, a bad option value, an interrupt around the command) still prints the
    one JSON document on stdout; the paragraph goes to stderr as typer prints it."""

    _usage: TyperException | None = None

    def main(self, args: Sequence[str] | None = None, *rest: Any, **kwargs: Any) -> Any:
        """Run the command line (console script and tests alike)."""
        argv = list(sys.argv[1:] if args is None else args)
        Answer.reset(argv)
        AnswerGroup._usage = None
        Layout.wide = False
        try:
            return super().main(argv, *rest, **kwargs)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
            if code == 130:  # typer's answer to an interrupt around the command
                code = exit_code()
            usage = AnswerGroup._usage
            if code and usage is not None:
                write_error(usage.format_message(), code, place=_option_of(usage),
                            fix=_help_of(usage))
            elif interrupted_kind(code):
                write_error("stopped before the command began its work or after it ended; no "
                            "partial file was left.", code)
            elif code:
                write_error(f"the command ended with exit {code}; stderr says why.", code)
            if code != exc.code:
                raise SystemExit(code) from None
            raise

    def make_context(self, *args: Any, **kwargs: Any) -> Any:
        """Parse the group's options, keeping a usage error for the JSON answer."""
        try:
            return super().make_context(*args, **kwargs)
        except TyperException as exc:
            AnswerGroup._usage = exc
            raise

    def invoke(self, ctx: Any) -> Any:
        """Run the command, keeping a usage error (its options) for the JSON answer."""
        try:
            return super().invoke(ctx)
        except TyperException as exc:
            AnswerGroup._usage = exc
            raise


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
    every input must be a regular file within its size cap; an empty path (`-o ''`, which
    the option parser turns into `.`) is said to be empty."""
    items: list[Input | Output] = [*inputs, *outputs]
    for item in items:
        if _given_empty(item.path):
            fix = item.fix if isinstance(item, Input) else f"Name the {item.what} to write."
            raise InputError(f"{item.option}: the path given is empty (''). {fix}")
    check_io(inputs, outputs)


def _given_empty(path: Path | str | None) -> bool:
    """Whether `path` is `.` only because the command line gave an empty string."""
    if path is None or str(path) not in ("", "."):
        return False
    values = [w.split("=", 1)[1] if w.startswith("--") and "=" in w else w
              for w in Answer.argv]
    return "" in values and not any(v and Path(v) == Path(".") for v in values)
