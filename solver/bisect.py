"""Bisection over a list whose predicate fails on a prefix and holds on the rest."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")


def first_passing(items: Sequence[T], ok: Callable[[T], bool]) -> T | None:
    """The first item for which `ok` holds, when it fails on a prefix of `items` and holds
    on the rest (tile heights tallest first: capacities only get easier as tiles shrink;
    chunk counts fewest first: more chunks hold less); None when it holds for none."""
    lo, hi = 0, len(items) - 1
    if hi < 0 or not ok(items[hi]):
        return None
    while lo < hi:  # invariant: items[hi] passes
        mid = (lo + hi) // 2
        if ok(items[mid]):
            hi = mid
        else:
            lo = mid + 1
    return items[hi]
