"""Numbers as people read them: byte counts with a binary unit, and paths relative to the
working directory. The one place terminal text formats bytes; ``--json`` documents keep the
exact integer counts.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

__all__ = ["fmt_bytes", "rel_path", "size_setting", "vs_bytes"]

def fmt_bytes(n: float | None) -> str:
    """Bytes with a binary unit: ``812 B``, ``12.5 KiB``, ``3.20 MiB``, ``1.25 GiB`` (``-``
    for None)."""
    if n is None:
        return "-"
    if abs(n) < 2**10:
        return f"{n:,.0f} B"
    if abs(n) < 2**20:
        return f"{n / 2**10:,.1f} KiB"
    if abs(n) < 2**30:
        return f"{n / 2**20:,.2f} MiB"
    return f"{n / 2**30:,.2f} GiB"


def size_setting(n: float) -> str:
    """A chip size of at least `n` bytes as one writes it in ``--set`` or a chip YAML
    (``sram.bytes=3MiB``): rounded up to a whole MiB above 4 MiB, to 64 KiB above 256 KiB,
    else to a whole KiB."""
    step, unit = (2**20, "MiB") if n > 4 * 2**20 else (64 * 2**10, "KiB") \
        if n > 256 * 2**10 else (2**10, "KiB")
    whole = max(1, math.ceil(n / step)) * step
    if unit == "KiB" and whole % 2**20 == 0:
        return f"{whole // 2**20}MiB"
    return f"{whole // (2**20 if unit == 'MiB' else 2**10)}{unit}"


def rel_path(path: str | os.PathLike[str]) -> str:
    """`path` relative to the working directory when it lies under it, else as given."""
    text = os.fspath(path)
    try:
        p = Path(text)
        if not p.is_absolute():
            return text
        return str(p.relative_to(Path.cwd())) or "."
    except (ValueError, OSError):
        return text


def vs_bytes(a: float, b: float) -> tuple[str, str]:
    """Two byte counts compared in one message (needed against available): each with its
    unit, or both exact (``8,192 B``, ``8,191 B``) where the units would show them equal."""
    x, y = fmt_bytes(a), fmt_bytes(b)
    if x == y and a != b:
        return f"{a:,.0f} B", f"{b:,.0f} B"
    return x, y
