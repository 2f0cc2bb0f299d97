"""Terminal text that fits: tables whose numbers are never cut, and paragraphs wrapped at
the console's width without splitting a number from its unit.

Every table of the command line is built with :func:`table`: numeric columns never wrap
(their cells keep their width), text columns fold; a column marked ``wide`` shows only in
the wide layout (``--wide``, or a terminal at least :data:`WIDE` columns across). Byte
columns carry their unit in the header (:func:`byte_unit`), chosen from the column's
largest value. This module imports rich and planner.ui.ending only.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from rich import box
from rich.cells import cell_len
from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from fuseplan.planner.ui.ending import printable

__all__ = ["GAP", "WIDE", "Col", "Layout", "byte_unit", "in_unit", "paragraph",
           "table", "wide_layout"]

WIDE = 120  # a terminal at least this wide gets the wide layout


class Layout:
    """The layout asked for on the command line (``--wide``)."""

    wide = False


def wide_layout(console: Console) -> bool:
    """Whether tables take their wide layout on `console`."""
    return Layout.wide or console.width >= WIDE


@dataclass(frozen=True)
class Col:
    """A column: its header, whether it holds numbers (right-aligned, never wrapped), whether
    it shows only in the wide layout, the width a name column folds at, and whether it holds
    prose: sentences wrapped here between words (a number keeps its unit) in the width the
    other columns leave."""

    header: str
    num: bool = False
    wide: bool = False
    max_width: int | None = None
    prose: bool = False


GAP = 2  # columns between two cells (padding and the box's blank divider)
# a table of more rows shows its first and last ones: 20,000 rows in a terminal read as
# nothing, and rendering them took longer than planning them (a 20,001-layer chain: 36 s);
# the plan file and --json keep every row
MOST_ROWS = 60
LAST_ROWS = 10


def _width(text: str) -> int:
    return max((cell_len(line) for line in text.splitlines()), default=0)


def table(console: Console, title: str | None, cols: Sequence[Col],
          rows: Iterable[Sequence[str]]) -> RenderableType:
    """A table of `rows` (one cell per column of `cols`, wide-only cells included: they are
    dropped here in the narrow layout) under its title, the title wrapped between words at
    the console's width (a number keeps its unit)."""
    keep = [not c.wide or wide_layout(console) for c in cols]
    shown = [c for c, k in zip(cols, keep, strict=True) if k]
    cells = [[printable(cell, keep="\n") for cell, k in zip(row, keep, strict=True) if k]
             for row in rows]
    widths = [min(max([_width(c.header)] + [_width(r[i]) for r in cells]), c.max_width or 10**6)
              for i, c in enumerate(shown)]
    prose = [i for i, c in enumerate(shown) if c.prose]
    if prose:  # the width the other columns leave, shared by the prose columns
        left = console.width - GAP * (len(shown) - 1) \
            - sum(w for i, w in enumerate(widths) if i not in prose)
        each = max(left // len(prose), 16)
        for r in cells:
            for i in prose:
                r[i] = "\n".join(line for part in r[i].split("\n")
                                 for line in paragraph(part, each, indent=""))
    t = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, collapse_padding=True)
    for c in shown:
        t.add_column(c.header, justify="right" if c.num else "left", no_wrap=c.num,
                     overflow="fold", max_width=c.max_width)
    for r in cells:  # plain text (a layer name is no markup), control characters escaped
        t.add_row(*(Text(cell) for cell in r))
    if title is None:
        return t
    heading = [Text(line, style="bold") for line in paragraph(printable(title), console.width)]
    return Group(*heading, t)


def elided(rows: Sequence[tuple[str, ...]], width: int
           ) -> tuple[list[tuple[str, ...]], int]:
    """`rows`, or past MOST_ROWS of them the first and LAST_ROWS last with a row of "⋮"
    between (`width` cells); and how many rows that leaves out."""
    if len(rows) <= MOST_ROWS:
        return list(rows), 0
    head = MOST_ROWS - LAST_ROWS
    return [*rows[:head], ("⋮",) * width, *rows[-LAST_ROWS:]], len(rows) - MOST_ROWS


_BYTE_UNITS = (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10), ("B", 1))


def byte_unit(values: Iterable[float | None]) -> tuple[str, int]:
    """The unit of a byte column: the largest unit its largest value reaches (KiB at least
    when any value is 1 KiB or more)."""
    top = max((abs(v) for v in values if v is not None), default=0)
    return next(((u, s) for u, s in _BYTE_UNITS if top >= s), ("B", 1))


def in_unit(n: float | None, unit: tuple[str, int]) -> str:
    """`n` bytes in `unit` (from :func:`byte_unit`): 2 decimals for MiB and GiB, 1 for KiB,
    none for bytes; ``0`` for zero and ``-`` for None."""
    if n is None:
        return "-"
    if n == 0:
        return "0"
    name, size = unit
    places = {"GiB": 2, "MiB": 2, "KiB": 1}.get(name, 0)
    return f"{n / size:,.{places}f}"


# a number and its unit stay on one line: the space between them is not a break
_GLUED = re.compile(r"(?<=[\d.,%×)]) (?=(?:B|KiB|MiB|GiB|µJ|pJ|s|ms|%|×|MACs|cycles|"
                    r"layers|groups|bytes)\b)")
_NBSP = "\u00a0"


def paragraph(text: str, width: int, indent: str = "  ") -> list[str]:
    """`text` wrapped at `width` columns, its later lines indented by `indent`: broken at
    spaces only (a path or a number stays whole, and a number keeps its unit)."""
    glued = _GLUED.sub(_NBSP, text)
    lines = textwrap.wrap(glued, width=max(width, 12), subsequent_indent=indent,
                          break_long_words=False, break_on_hyphens=False) or [""]
    return [line.replace(_NBSP, " ") for line in lines]
