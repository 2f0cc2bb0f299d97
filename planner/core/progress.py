"""Progress of a long command, as events a caller may watch (issue 47).

Every stage that can take long (loading, the tile searches, the paths, CP-SAT, the
emulator, the reference run) takes an optional ``progress`` sink and calls it with a
Progress record as it goes. None (the default) costs nothing and changes nothing: the
plans and bytes are the same with a sink or without. The stages throttle by counting (an
event every ``stride`` items of a loop), never by a clock, so a run's events depend on
its work alone; a display that wants fewer refreshes drops them itself.

Counts are those of the phase the event names: a new phase starts them at zero.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

EVENTS_PER_LOOP = 100  # at most about this many events from one loop of a phase


@dataclass(frozen=True)
class Progress:
    """Where a long command is.

    ``phase``: what runs now ("loading model", "tile search", "CP-SAT", "emulating", ...);
    ``done`` of ``total``: items of the phase finished (None: not counted, or unknown);
    ``searched``: candidate groups whose tile search is done; ``bounded``: candidates a
    floor or bound ruled out without a search; ``best``: the objective of the best plan
    found so far, ``bound``: a proven lower bound on it (both in ``unit``: "B" for bytes,
    the traffic objective's; else the objective's units); ``step``: the step of an outer
    loop this phase belongs to ("cpsat, 4 of 4", "point 2 of 5"; empty: none)."""

    phase: str
    done: int | None = None
    total: int | None = None
    searched: int = 0
    bounded: int = 0
    best: float | None = None
    bound: float | None = None
    unit: str = "B"
    step: str = ""

    @property
    def gap(self) -> float | None:
        """The relative gap between the best plan and the bound, in [0, 1], as CP-SAT
        states it (``|best - bound| / max(|best|, 1)``); None without both."""
        if self.best is None or self.bound is None:
            return None
        return min(1.0, abs(self.best - self.bound) / max(abs(self.best), 1.0))


ProgressSink = Callable[[Progress], None]


def within(sink: ProgressSink | None, step: str) -> ProgressSink | None:
    """A sink that tags every event with the outer `step` ("greedy, 2 of 4") before passing
    it to `sink`; None stays None."""
    if sink is None:
        return None
    outer = sink

    def tagged(p: Progress) -> None:
        outer(replace(p, step=f"{step}: {p.step}" if p.step else step))

    return tagged


def stride(total: int, events: int = EVENTS_PER_LOOP) -> int:
    """Every how many items of a loop of `total` an event is due (at most `events` of them,
    the last item's always among them: see due)."""
    return max(1, total // max(1, events))


def due(done: int, total: int, every: int) -> bool:
    """Whether the event after `done` of `total` items is due (every `every` items, and at
    the end)."""
    return done == total or done % every == 0



def ticker(sink: ProgressSink | None, phase: str, total: int, *, searches: bool = False
           ) -> Callable[[int], None] | None:
    """A loop's tick for `sink`: told how many of its `total` items are done, it sends an
    event every stride(total) items and at the end (``searches``: the items are candidate
    groups' tile searches, counted as searched). The phase's start (0 done) is sent now.
    None without a sink."""
    if sink is None:
        return None
    out, every = sink, stride(total)
    out(Progress(phase, 0, total))

    def tick(done: int) -> None:
        if due(done, total, every):
            out(Progress(phase, done, total, searched=done if searches else 0))

    return tick
