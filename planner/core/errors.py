"""Errors that the CLI turns into exit codes and one-paragraph messages."""

from __future__ import annotations


class InputError(Exception):
    """Bad user input (model, YAML, option): exit code 2.

    The message is one paragraph naming the file, the place (node name or YAML
    line:column) and what to do about it.
    """


class PlanningError(Exception):
    """The command ran and the answer is "no" (infeasible, mismatch): exit code 1."""

    label = "no plan"  # how the CLI introduces the message


class PlanDefect(PlanningError):
    """A plan the emulator cannot run: a planner bug, exit code 1, naming the group, tile
    and layer where the plan and the emulator disagreed."""

    label = "planner bug"


class OutOfTime(PlanningError):
    """--time-limit passed before the command had anything to answer with (the model's
    import alone took longer): exit code 1, naming the step it stopped in."""

    label = "time limit"


class Interrupted(Exception):
    """Ctrl-C stopped the command: exit code 130, the message says which files it left
    (complete ones only: partial files are removed, planner.core.files)."""
