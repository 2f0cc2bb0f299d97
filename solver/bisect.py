"""Bisection over a list whose predicate fails on a prefix and holds on the rest, and the seed's
greedy tile-height searches (halve until a height fits, or grow until the next would not)."""

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


def tallest_choices(heights: Sequence[int], fits: Callable[[int, bool], bool],
                    passes: Callable[[int], bool], kept: int) -> Iterator[tuple[int, bool]]:
    """(height, double_buffered) of the `kept` tallest of `heights` (tallest first) that
    fit the chip single-buffered (`fits(th, False)`: bisection, the peak shrinks with the
    tile) and pass the rules (`passes`), each single- and, where `fits(th, True)`,
    double-buffered: the pinned searches' walk (a split, spilled keys, both)."""
    top = first_passing(heights, lambda th: fits(th, False))
    if top is None:
        return
    found = 0
    for th in heights[heights.index(top):]:
        if not passes(th):
            continue
        yield th, False
        if fits(th, True):
            yield th, True
        found += 1
        if found == kept:
            return


def halve_to_fit(fits: Callable[[int], bool], low: int, high: int) -> int | None:
    """Halve until a height fits, then refine toward the last one that did not (1/2, 3/4...)."""
    if fits(high):
        return high
    bad, th = high, high
    while th > low:
        th = max(low, th // 2)
        if fits(th):
            good = th
            while bad - good > 1:  # refine the ratio so the tile ends close to the memory size
                mid = (good + bad) // 2
                if fits(mid):
                    good = mid
                else:
                    bad = mid
            return good
        bad = th
    return None


def grow_to_fit(fits: Callable[[int], bool], low: int, high: int) -> int | None:
    """Grow the tile from the smallest until the next step would not fit."""
    if not fits(low):
        return None
    th = low
    step = 1
    while th < high:
        nxt = min(high, th + step)
        if not fits(nxt):
            if step == 1:
                break
            step = 1
            continue
        th, step = nxt, step * 2
    return th
