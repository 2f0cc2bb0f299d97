"""The span of a double-buffered run of steps whose loads are far from even.

The closed form of a double-buffered group (planner.cost.model.cycles_energy: fill +
max(remaining transfers, compute) + drain) lets every transfer overlap compute. That holds
when the loads are alike from tile to tile. A weights-outer group loads a whole chunk of
weights with the first tile of each chunk's sweep: with two input buffers the link can run
at most one tile ahead of the cores, so the chunk's load cannot start before the
second-to-last tile of the sweep before it has computed, and the cores wait for it. This
module plays such a run step by step under the buffering rules the emulator's clock
states (emulator.clock: one link, transfers served in the order they become ready, stores
first on a tie; a tile's load starts once the load before it is done and the tile two
before it has computed (a tile that loads nothing takes no buffer: the tiles before the
last one that loaded); a tile computes once its load is done and the cores are free; its
store follows its compute). It is the planner's own account of that schedule, from the
steps the cost model predicts; the emulator's clock plays the events it counted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from math import ceil, floor


@dataclass(frozen=True)
class Step:
    """One tile of a run: bytes it loads (weights included) and stores, cycles it computes."""

    load_bytes: float
    compute_cycles: float
    store_bytes: float


def double_buffered_span(bytes_per_cycle: float, steps: Sequence[Step]) -> float:
    """Cycles from the first load to the last store or compute of the steps, two input
    buffers deep (see the module docstring)."""
    n = len(steps)
    last_loader, last = [], -1  # before each step, the last one that loaded anything
    for k, step in enumerate(steps):
        last_loader.append(last)
        last = k if step.load_bytes else last
    link = 0.0
    loads: list[float] = []
    computes: list[float] = []
    stores: list[float] = []
    while len(stores) < n:
        best: tuple[float, int] | None = None
        if len(stores) < len(computes):
            best = (computes[len(stores)], 0)
        s = len(loads)
        p = last_loader[s] if s < n else -1
        if s < n and not (p >= 1 and len(computes) < p):
            ready = 0.0 if s == 0 else max(loads[s - 1], computes[p - 1] if p >= 1 else 0.0)
            if best is None or (ready, 1) < best:
                best = (ready, 1)
        assert best is not None  # a store or a load is always ready: computes follow loads
        ready, kind = best
        begin = max(ready, link)
        if kind == 0:
            link = begin + steps[len(stores)].store_bytes / bytes_per_cycle
            stores.append(link)
        else:
            link = begin + steps[s].load_bytes / bytes_per_cycle
            loads.append(link)
        while len(computes) < len(loads):
            k = len(computes)
            computes.append(max(loads[k], computes[-1] if computes else 0.0)
                            + steps[k].compute_cycles)
    return max(stores[-1], computes[-1]) if n else 0.0


@dataclass(frozen=True)
class LayerStep:
    """One layer of a tile that carries the group's weights: the chunks of weights that
    arrive for it, in order, each with its share of the layer's work (one chunk when its
    weights come whole, none without weights), and the cycles it computes (exact)."""

    chunks: tuple[tuple[int, Fraction], ...]
    compute_cycles: Fraction


def layered_span(bytes_per_cycle: Fraction, map_bytes: int, layers: Sequence[LayerStep],
                 preloaded: int = 0, ahead: int = 0, room: int = 0) -> Fraction:
    """Cycles from the start of a tile's load to the end of its compute when the link brings
    its maps, then each layer's chunks of weights in order, and each chunk's share of the
    layer computes (in whole cycles) once that chunk is in and the cores are done with what
    came before.
    ``ahead``: chunks of weights on chip at once (a streamed group's double buffer: 2; a
    chunk loads once the one `ahead` before it has computed), 0 for no limit (resident);
    ``room``: instead, bytes of weights on chip at once (a streamed group's ring: the link
    fills whatever room the chunks that have not computed yet leave, and waits when there
    is none). ``preloaded`` bytes at the front of the weight stream are on chip already
    (prefetched behind the group before; resident weights only)."""
    link = Fraction(map_bytes) / bytes_per_cycle
    end, skip = link, preloaded
    done: list[Fraction] = []  # when each chunk's compute ended (its buffer is free)
    sizes: list[int] = []
    oldest, held = 0, 0  # the ring: the first chunk still on chip, bytes from it on
    for step in layers:
        for size, share in step.chunks or ((0, Fraction(1)),):
            if size:
                k = len(done)
                if room:  # computes end in order: the chunks on chip are the latest ones
                    left = size
                    while left:
                        while oldest < k and done[oldest] <= link:
                            held, oldest = held - sizes[oldest], oldest + 1
                        if held >= room:  # full: wait for the oldest chunk to compute
                            link = done[oldest]
                            continue
                        part = min(left, room - held)
                        link, held, left = link + part / bytes_per_cycle, held + part, left - part
                else:
                    start = max(link, done[k - ahead]) if ahead and k >= ahead else link
                    took = min(skip, size)
                    skip -= took
                    link = start + (size - took) / bytes_per_cycle
                sizes.append(size)
                end = max(end, link)
            end += ceil(step.compute_cycles * share)  # the cores work in whole cycles
            if size:
                done.append(end)
    return end


def layered_overlap(bytes_per_cycle: Fraction, map_bytes: int, layers: Sequence[LayerStep],
                    ahead: int = 0, room: int = 0) -> int:
    """Whole cycles a tile's compute hides behind its own weight loads when they arrive chunk
    by chunk (layered_span) rather than the tile computing only once all have arrived.
    Rounded up past the exact saving: the closed form rounds a group's transfers up to whole
    cycles where the event clock plays them exactly, so that the prediction stays within
    the clock's rounding of it."""
    weights = sum(size for s in layers for size, _ in s.chunks)
    serial = Fraction(map_bytes + weights) / bytes_per_cycle \
        + sum(ceil(s.compute_cycles * share) for s in layers
              for _, share in s.chunks or ((0, Fraction(1)),))
    saved = serial - layered_span(bytes_per_cycle, map_bytes, layers, ahead=ahead, room=room)
    return floor(saved) + 1 if saved > 0 else 0
