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
before it has computed; a tile computes once its load is done and the cores are free; its
store follows its compute). It is the planner's own account of that schedule, from the
steps the cost model predicts; the emulator's clock plays the events it counted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


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
    link = 0.0
    loads: list[float] = []
    computes: list[float] = []
    stores: list[float] = []
    while len(stores) < n:
        best: tuple[float, int] | None = None
        if len(stores) < len(computes):
            best = (computes[len(stores)], 0)
        s = len(loads)
        if s < n and not (s >= 2 and len(computes) < s - 1):
            ready = 0.0 if s == 0 else max(loads[s - 1], computes[s - 2] if s >= 2 else 0.0)
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
