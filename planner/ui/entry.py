"""The ``fuseplan`` console script: a Ctrl-C at any moment ends in one line and exit 130.

Each command says what a Ctrl-C left (``planner.ui.cli.guarded``), but the command line's
imports take about two seconds before any command runs, and typer turns a Ctrl-C in the
moments around a command (parsing its options, or after it returned) into a silent exit
130. This module imports nothing heavy, so it covers both: nothing was written yet in the
first case, and in the second the command either had not begun or had finished writing.
"""

from __future__ import annotations

import sys

from fuseplan.planner.ui import Interruption

STARTING = "interrupted: stopped while fuseplan was starting; nothing was written."
AROUND = ("interrupted: stopped before the command began its work or after it ended; no "
          "partial file was left.")


def main() -> None:
    """Run the command line (``planner.ui.cli``), imported here so that a Ctrl-C during
    its imports is handled too."""
    try:
        from fuseplan.planner.ui.cli import main as run

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
        if exc.code == 130 and not Interruption.reported:
            _stopped(AROUND)
        raise


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
    raise SystemExit(130)
