"""Charts the command line draws: the cycles/energy front of ``fuseplan pareto --plot``.

:func:`front_svg` writes a self-contained SVG by hand (no dependency); :func:`front_png`
draws a PNG with matplotlib's headless Agg backend, imported only when a PNG is asked for.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

__all__ = ["front_png", "front_svg"]


def front_svg(rows: Sequence[dict[str, Any]]) -> str:
    """A self-contained SVG scatter of the front: cycles across, energy up."""
    w, h, pad = 480, 320, 50
    xs = [r["cycles"] for r in rows]
    ys = [r["energy_pj"] for r in rows]
    x0, x1 = min(xs), max(xs) or 1
    y0, y1 = min(ys), max(ys) or 1

    def px(x: float, lo: float, hi: float, size: int) -> float:
        return pad + (size - 2 * pad) * ((x - lo) / (hi - lo) if hi > lo else 0.5)

    dots = "".join(
        f'<circle cx="{px(x, x0, x1, w):.1f}" cy="{h - px(y, y0, y1, h):.1f}" r="5" '
        f'fill="#1f77b4"><title>{x:,} cycles, {y / 1e6:,.2f} µJ</title></circle>'
        for x, y in zip(xs, ys, strict=True))
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}">'
            f'<rect width="{w}" height="{h}" fill="white"/>'
            f'<line x1="{pad}" y1="{h - pad}" x2="{w - pad}" y2="{h - pad}" stroke="black"/>'
            f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{h - pad}" stroke="black"/>'
            f'<text x="{w / 2}" y="{h - 12}" text-anchor="middle">cycles</text>'
            f'<text x="14" y="{h / 2}" transform="rotate(-90 14 {h / 2})" '
            f'text-anchor="middle">energy (pJ)</text>{dots}</svg>\n')


def front_png(rows: Sequence[dict[str, Any]], title: str) -> bytes:
    """A PNG chart of the front (matplotlib, headless Agg backend): cycles across, energy up,
    the points joined in order of cycles."""
    # matplotlib takes a second to import: only a PNG chart pays it
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 4.0), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    xs = [r["cycles"] for r in rows]
    ys = [r["energy_pj"] / 1e6 for r in rows]
    ax.plot(xs, ys, "o-", color="#1f77b4")
    for x, y, r in zip(xs, ys, rows, strict=True):
        ax.annotate(f"{r['dram_bytes'] / 2**20:.1f} MiB", (x, y), textcoords="offset points",
                    xytext=(5, 5), fontsize=8)
    ax.set_xlabel("cycles")
    ax.set_ylabel("energy (µJ)")
    ax.set_title(f"cycles / energy front of {title}")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()
