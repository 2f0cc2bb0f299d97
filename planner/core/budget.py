"""A command's time limit as one budget that every phase draws on.

`--time-limit` bounds the whole command: loading the model, the tile searches and CP-SAT.
The budget is a point in time (from when the command started); each phase asks what is
left, and a phase that stops early says what it left out, so the plan reports how far it
is from proven (its status and gap) rather than claim an optimum over a cut search. The
model's import has no partial answer: past the limit it stops at its next step (check).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from fuseplan.planner.core.errors import OutOfTime


@dataclass(frozen=True)
class Budget:
    """Until when (``time.perf_counter()`` seconds) a command may work; None: no limit."""

    until: float | None = None
    # what phases left out to stay within it (filled as they run)
    cuts: list[str] = field(default_factory=list, compare=False)
    seconds: float | None = field(default=None, compare=False)  # the limit, as given

    @classmethod
    def of(cls, seconds: float | None, started: float | None = None) -> Budget:
        """A budget of `seconds` from `started` (a perf_counter reading; now when None)."""
        if seconds is None:
            return cls()
        return cls((time.perf_counter() if started is None else started) + seconds,
                   seconds=seconds)

    def less(self, seconds: float) -> Budget:
        """The budget of a phase that must leave `seconds` for the phases after it (what it
        cuts is noted with this budget's cuts)."""
        return self if self.until is None else Budget(self.until - seconds, self.cuts,
                                                      self.seconds)

    def left(self) -> float | None:
        """Seconds left (negative once passed), None without a limit."""
        return None if self.until is None else self.until - time.perf_counter()

    @property
    def passed(self) -> bool:
        """Whether the limit has passed."""
        left = self.left()
        return left is not None and left <= 0

    def cut(self, what: str) -> None:
        """Record that a phase left `what` out to stay within the limit."""
        self.cuts.append(what)

    def check(self, step: str, model: str) -> None:
        """Raise OutOfTime if the limit has passed: a step of `model`'s import that has no
        partial answer to give (`step`: what it has just done, "folding constants")."""
        if self.passed:
            limit = "" if self.seconds is None else f" of {_seconds(self.seconds)}"
            raise OutOfTime(f"the time limit{limit} had run out by the end of {step} of "
                            f"{model}, before anything could be planned or shown. Raise the "
                            "time limit (--time-limit): this model takes longer than that to "
                            "import.")


def _seconds(value: float) -> str:
    """A limit as the user would write it: 2.5 s, 600 s, 1,000,000 s."""
    return f"{value:,.0f} s" if value >= 100 else f"{value:g} s"
