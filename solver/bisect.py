"""Bisection over a list whose predicate fails on a prefix and holds on the rest."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
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


# heights examined past the tallest that fits, per height kept: what a rule forbids at one
# height it mostly forbids at the next, and each height costs a few milliseconds
EXAMINED_PER_KEPT = 12


def chunked_heights(heights: Sequence[int], fits_with_most: Callable[[int], bool],
                    fewest: Callable[[int], int | None], kept: int
                    ) -> Iterator[tuple[int, int]]:
    """(height, chunks) of the tallest tiles that run in hidden chunks: from the tallest of
    `heights` (tallest first) that fits with the most chunks (bisection: the peak shrinks
    with the tile) down, each with its `fewest` chunks that fit and pass the rules (None:
    none does, the height is skipped), until `kept` heights are found or
    EXAMINED_PER_KEPT times as many were looked at."""
    top = first_passing(heights, fits_with_most)
    if top is None:
        return
    found = 0
    for th in heights[heights.index(top):][:EXAMINED_PER_KEPT * kept]:
        k = fewest(th)
        if k is None:
            continue
        yield th, k
        found += 1
        if found >= kept:
            return
