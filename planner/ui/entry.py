"""The ``fuseplan`` console script: a Ctrl-C at any moment ends in one line and exit 130.

Each command says what a Ctrl-C left (``planner.ui.cli.guarded``), but the planner's imports
take about two seconds before any command runs (this module makes them, for a command; the
command line alone imports nothing heavy, so its help answers at once), and typer turns a
Ctrl-C in the moments around a command (parsing its options, or after it returned) into a
silent exit 130. This module imports nothing heavy, so it covers both: nothing was written
yet in the first case, and in the second the command either had not begun or had finished
writing.

A Ctrl-C while the imports initialise a compiled extension must not unwind through it: a
KeyboardInterrupt raised inside onnx's extension as it loads crashes the interpreter on its
way out (exit -11, nothing said). While the imports run, the signal handler therefore says
the one line and ends the process at once, without unwinding: nothing was written yet.

SIGTERM (what CI sends on cancel) is handled as a Ctrl-C is, with exit 143: during the
imports the same one line at once; afterwards it raises ``planner.ui.ending.Terminated`` (a
KeyboardInterrupt) wherever the command is, so it cleans up as after a Ctrl-C. Under
``--json`` every one of these ends prints the one JSON document on stdout too.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from fuseplan.planner.ui import Interruption
from fuseplan.planner.ui.ending import Answer, exit_code, on_sigterm, write_error

STARTING = "interrupted: stopped while fuseplan was starting; nothing was written."
AROUND = ("interrupted: stopped before the command began its work or after it ended; no "
          "partial file was left.")


def main() -> None:
    """Run the command line (``planner.ui.cli``), imported here so that a Ctrl-C during
    its imports is handled too."""
    Answer.reset(sys.argv[1:])
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGTERM) if main_thread else None
    try:
        with _ended_at_once_by_ctrl_c():
            from fuseplan.planner.ui.cli import main as run

            if _works(sys.argv[1:]):  # the planner's imports, under the same handler
                import fuseplan.planner.app.api  # noqa: F401
        if main_thread:
            signal.signal(signal.SIGTERM, on_sigterm)
        run()
    except KeyboardInterrupt:  # during the imports (typer handles the rest)
        _stopped(STARTING)
    except Exception as exc:
        # an import that Python wraps around the interrupt: a compiled extension
        # initialising when the Ctrl-C came (ortools' solver helper) reports a failed
        # import, a class body defining its fields (networkx's dataclasses) an error calling
        # __set_name__; the interrupt is among the causes either way
        if not _interrupted(exc):
            raise
        _stopped(STARTING)
    except SystemExit as exc:
        if exc.code in (130, 143) and not Interruption.reported:
            _stopped(AROUND)
        raise
    finally:
        if main_thread:  # called in process (tests): the caller's handler again
            signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


def _works(argv: list[str]) -> bool:
    """Whether the command line runs a command (not only its help or the version): the
    command line itself imports nothing heavy, so that --help and --version answer at once;
    a command imports the planner (onnx, numpy, OR-Tools) here, where a Ctrl-C or SIGTERM
    ends the process at once rather than unwinding through a half-loaded extension."""
    words = argv[:argv.index("--")] if "--" in argv else argv
    return bool(words) and words != ["rules"] and not {"--help", "--version"} & set(words)


def _interrupted(exc: BaseException) -> bool:
    """Whether a KeyboardInterrupt is among the causes of `exc`."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, KeyboardInterrupt):
            return True
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return False


def _stopped(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()
    write_error(line.split(": ", 1)[1], exit_code())
    raise SystemExit(exit_code())


def _end_starting(signum: int, frame: object) -> None:
    """SIGINT or SIGTERM during the imports: the line, exit 130 or 143, no unwinding through
    half-loaded extensions (os._exit: no buffered output is pending and no file is open for
    writing)."""
    Answer.signum = signal.Signals(signum)
    os.write(2, (STARTING + "\n").encode())
    if Answer.wanted:
        from fuseplan.planner.ui.ending import error_doc

        os.write(1, (json.dumps(error_doc(STARTING.split(": ", 1)[1], exit_code()), indent=2)
                     + "\n").encode())
    os._exit(exit_code())


@contextmanager
def _ended_at_once_by_ctrl_c() -> Iterator[None]:
    """Within the block a Ctrl-C ends the process at once (the main thread only: a signal
    handler cannot be set from another)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, _end_starting)
    previous_term = signal.signal(signal.SIGTERM, _end_starting)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        signal.signal(signal.SIGTERM, previous_term)
