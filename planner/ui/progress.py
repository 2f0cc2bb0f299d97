"""The progress display of a long command on stderr (issue 47): what it does, for how long,
the phase it is in, how many candidate groups it searched and ruled out, the best plan so
far (in human bytes: planner.core.units) and CP-SAT's gap, with a bar where the phase
knows its total.

The library tells a ProgressSink (planner.core.progress) of every phase; the sink given
here only keeps the latest event, and rich's Live redraws from it a few times a second on
its own thread, so however often the events come the terminal sees at most that many
redraws. Nothing is shown under ``--json`` or ``--quiet`` (the caller passes
``enabled=False``) or when stderr is no terminal; every line fits the console's width.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.cells import cell_len, set_cell_size
from rich.console import Console, ConsoleOptions, RenderResult
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from fuseplan.planner.core.progress import Progress, ProgressSink
from fuseplan.planner.core.units import fmt_bytes
from fuseplan.planner.ui.ending import printable

REFRESH_PER_SECOND = 8
BAR_WIDTH = 24
SPINNER, SPINNER_FPS = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏", 12.5  # rich's "dots" spinner


def elapsed(seconds: float) -> str:
    """Seconds as a clock: ``0:07``, ``2:15``, ``1:02:03``."""
    whole = int(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def _amount(value: float, unit: str) -> str:
    """An objective value as people read it: bytes with a binary unit, else the number and
    the objective's name."""
    return fmt_bytes(value) if unit == "B" else f"{value:,.0f} ({unit})"


def counts_line(p: Progress) -> str:
    """The event's counts and best plan, as one line of the display ("" when it has none):
    ``searched 412 · ruled out 1,086 · best 2.67 MiB · gap 0.6%``."""
    parts = []
    if p.searched:
        parts.append(f"searched {p.searched:,}")
    if p.bounded:
        parts.append(f"ruled out {p.bounded:,}")
    if p.best is not None:
        parts.append(f"best {_amount(p.best, p.unit)}")
    gap = p.gap
    if gap is not None:
        parts.append(f"gap {100 * gap:.1f}%")
    return " · ".join(parts)


def phase_line(p: Progress) -> str:
    """The event's phase with its outer step and its items done: ``CP-SAT (cpsat, 4 of 4)``,
    ``emulating 12/40``."""
    text = p.phase + (f" ({p.step})" if p.step else "")
    if p.done is not None and p.total is not None:
        text += f"  {p.done:,}/{p.total:,}"
    return text


class ProgressView:
    """The display's state: what the command does, when it started and the latest event.
    ``update`` is the sink (it only keeps the event: Live redraws from it)."""

    def __init__(self, what: str, clock: Callable[[], float] = time.perf_counter) -> None:
        self.what, self.clock = printable(what), clock
        self.started = clock()
        self.latest: Progress | None = None

    def update(self, event: Progress) -> None:
        """Keep the latest event (the ProgressSink)."""
        self.latest = event

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = options.max_width
        seconds = self.clock() - self.started
        clock = elapsed(seconds)
        head = Text.assemble((SPINNER[int(seconds * SPINNER_FPS) % len(SPINNER)], "cyan"), " ")
        head.append(_fit(self.what, width - len(head) - len(clock) - 2), style="bold")
        yield head + Text("  " + clock, style="dim")
        p = self.latest
        if p is None:
            return
        text = printable(phase_line(p))
        if p.total and width >= BAR_WIDTH + 20:
            bar = Table.grid(padding=(0, 1))
            room = width - BAR_WIDTH - 3
            bar.add_column(no_wrap=True, width=room)
            bar.add_column(no_wrap=True, width=BAR_WIDTH)
            bar.add_row(Text("  " + _fit(text, room - 2)),
                        ProgressBar(total=p.total, completed=p.done or 0, width=BAR_WIDTH))
            yield bar
        else:
            yield Text("  " + _fit(text, width - 2))
        counts = counts_line(p)
        if counts:
            yield Text("  " + _fit(counts, width - 2), style="dim")


def _fit(text: str, width: int) -> str:
    """`text` cut to `width` columns, an ellipsis marking the cut."""
    width = max(width, 1)
    if cell_len(text) <= width:
        return text
    return set_cell_size(text, width - 1) + "…"


@contextmanager
def progress_display(what: str, *, enabled: bool, console: Console | None = None,
                     transient: bool = True) -> Iterator[ProgressSink | None]:
    """A live progress display of `what` (``planning zoo:resnet50 with cpsat``) on stderr
    (or `console`) while the block runs, yielding the sink to pass the library's
    ``progress=``; None, and nothing shown, when not `enabled` (``--json``, ``--quiet``)
    or when the console is no terminal. ``transient``: the display is cleared at the end
    (the command's own output follows)."""
    target = Console(stderr=True) if console is None and enabled else console
    if not enabled or target is None or not target.is_terminal:
        yield None
        return
    view = ProgressView(what)
    with Live(view, console=target, refresh_per_second=REFRESH_PER_SECOND,
              transient=transient, redirect_stdout=False, redirect_stderr=False):
        yield view.update
