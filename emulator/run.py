"""Execute a plan on the modeled chip, tile by tile, counting every byte moved.

The emulator shares only the region function (planner.geometry.regions.tile_regions)
with the planner: it slices real arrays for each tile, runs the layers with the
NumPy kernels, and counts bytes from the arrays it actually moves, so a wrong
closed form in the cost model shows up as a counter mismatch. Its cycles come from its
own clock (emulator.clock), which plays the tiles it ran on the chip's DRAM link and cores.

This module is the dispatch: emulate() runs the plan's groups in order and emulate_group()
hands each group to the runner of its mode: emulator.tiles (halos recomputed),
emulator.reuse (halos reused, banded or not), emulator.passes, emulator.weights_outer,
emulator.attention (a fused attention in chunks of its heads) or emulator.ends (input and
output streamed in channel chunks). A layer on a box runs in
emulator.layer; a group's accounting is emulator.tally's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from fractions import Fraction
from math import ceil, floor

import numpy as np
from threadpoolctl import threadpool_limits

from fuseplan.emulator.attention import run_head_chunks
from fuseplan.emulator.chunks import WeightStream
from fuseplan.emulator.clock import GroupRun, GroupTime, simulate_plan
from fuseplan.emulator.ends import run_end_tiles
from fuseplan.emulator.errors import EmulationError, KernelFailure
from fuseplan.emulator.layer import LayerCache
from fuseplan.emulator.passes import run_passes
from fuseplan.emulator.reuse import run_reuse_tiles
from fuseplan.emulator.split import SplitRun
from fuseplan.emulator.tally import Tally, Violation, inputs_once_bytes
from fuseplan.emulator.tiles import run_tiles
from fuseplan.emulator.weights_outer import run_weights_outer
from fuseplan.hardware.chip import Chip
from fuseplan.planner.core.progress import ProgressSink, ticker
from fuseplan.planner.cost.counters import Counters
from fuseplan.planner.geometry.attention import attention_heads, kept_prefix
from fuseplan.planner.geometry.bands import band_columns, band_overflows, cluster_loads
from fuseplan.planner.geometry.cluster_split import cluster_split, wram_keys
from fuseplan.planner.geometry.ends import chunked_ends
from fuseplan.planner.geometry.hidden import stretches
from fuseplan.planner.geometry.passes import pass_split
from fuseplan.planner.geometry.regions import Box, GroupIO, anchor_extent, group_io, iter_tiles
from fuseplan.planner.geometry.rounds import round_size
from fuseplan.planner.ir.chunks import chunk_axes, chunk_ranges
from fuseplan.planner.ir.graph import Graph
from fuseplan.planner.plan.checks import check_bands, whole_tile
from fuseplan.planner.plan.data import Group, Plan
from fuseplan.planner.plan.mode import ModeKind, mode_kind, mode_problem

# the errors and the overflow record are the emulator's public names (planner.app.verify)
__all__ = ["Corruption", "EmulationError", "EmulationResult", "KernelFailure", "Violation",
           "emulate", "emulate_group"]


@dataclass(frozen=True)
class Corruption:
    """A test hook: after group `group` (its index in the plan) ran, one element of one of its
    outputs as written to DRAM is made wrong, as a bug in that group's execution would, and
    the groups after it read the wrong value. Verification must then fail naming that tensor
    (tests/test_verify_power.py).

    ``tensor``: which output (None: the group's first); ``element``: its flat index (taken
    modulo the tensor's size); the element gets ``relative`` times the tensor's largest
    magnitude added (``relative`` itself when the tensor is all zeros)."""

    group: int
    tensor: str | None = None
    element: int = 0
    relative: float = 0.01

    def target(self, graph: Graph, plan: Plan) -> str:
        """The tensor this corruption changes."""
        if not 0 <= self.group < len(plan.groups):
            raise ValueError(f"corruption of group {self.group}: the plan has "
                             f"{len(plan.groups)} groups")
        outputs = group_io(graph, plan.groups[self.group].layers).outputs
        if self.tensor is not None and self.tensor not in outputs:
            raise ValueError(f"corruption of group {self.group}: {self.tensor} is not one of "
                             f"its outputs {list(outputs)}")
        return self.tensor if self.tensor is not None else outputs[0]

    def apply(self, graph: Graph, plan: Plan, dram: dict[str, np.ndarray]) -> None:
        """Change the one element in `dram` (a fresh copy of the array: no caller's array
        is touched)."""
        name = self.target(graph, plan)
        values = np.array(dram[name], dtype=np.float32, copy=True)
        if values.size:
            scale = float(np.max(np.abs(values)))
            flat = values.reshape(-1)
            flat[self.element % values.size] += self.relative * (scale if scale > 0 else 1.0)
        dram[name] = values


@dataclass
class EmulationResult:
    """Outputs and counters of one emulated plan.

    Each group's counters hold what the emulator counted and the cycles of the clock
    (emulator.clock); energy_pj is left 0: pricing the counters is the cost model's job
    (planner.app.verify fills it in).
    """

    outputs: dict[str, np.ndarray]
    groups: list[Counters]
    violations: list[Violation] = field(default_factory=list)
    tensors: dict[str, np.ndarray] = field(default_factory=dict)  # everything written to DRAM
    times: list[GroupTime] = field(default_factory=list)  # per group, from the clock
    tiles: list[int] = field(default_factory=list)  # per group, the tiles the clock played

    def timeline(self) -> list[dict[str, int]]:
        """Per group, from the clock: start and end cycle (groups run back to back), the
        cycle its prefetched weights started loading (in the previous group's first idle
        DRAM gap), DRAM and compute busy cycles (the prefetch's share of the link counted in
        the group's own; a banded group's busiest band)."""
        return [{"group": i, "start_cycle": t.start, "end_cycle": t.end,
                 "prefetch_start_cycle": t.prefetch_start,
                 "dram_busy_cycles": ceil(t.dram_busy), "compute_busy_cycles": t.compute_busy}
                for i, t in enumerate(self.times)]

    @property
    def totals(self) -> Counters:
        total = Counters()
        for c in self.groups:
            total = total + c
        return total


def emulate_group(graph: Graph, group: Group, chip: Chip, dram: dict[str, np.ndarray],
                  weights: Mapping[str, np.ndarray], layers: LayerCache | None = None
                  ) -> tuple[Counters, GroupRun, list[Violation]]:
    """Run one group over all its tiles; reads and writes `dram` (tensor name -> full array).

    Returns its counters (no time yet), its tiles' events for the clock and its overflows.
    ``layers``: the run's cache of static layer facts (emulate() passes one).

    The group's mode is checked by the one validator the plan reader and the assembler ask
    (planner.plan.mode.mode_problem), then its kind picks the one runner that executes it.
    """
    io = group_io(graph, group.layers)
    _check_mode(graph, group, io)
    kind = mode_kind(graph, group.layers, group.placement.mode)
    layers = layers if layers is not None else LayerCache(graph)
    if kind is ModeKind.TILES and group.halo_reuse and group.tile.bands > 1:
        return _run_bands(graph, group, chip, dram, weights, io, layers)
    dt = chip.dtype_bytes
    stream = None if group.weights_resident else WeightStream.of(graph, io, group, weights, dt)
    tally = Tally(chip, group, sum(int(graph.constants[w].size) for w in io.weights) * dt,
                  stream=stream, round_tiles=round_size(chip, io, group.halo_reuse))
    _RUNNERS[kind](Run(graph, group, io, chip, dram, weights, tally, layers))
    return tally.counters(graph, io), _group_run(group, [tally]), list(tally.worst.values())


def _check_mode(graph: Graph, group: Group, io: GroupIO) -> None:
    """The group's mode against the validator, and what the emulator's runners need beyond
    it (a plan the emulator cannot run is a planner bug: EmulationError names the group)."""
    p = group.placement
    whole = whole_tile(graph, p.layers)
    # a dynamic plan's group runs its stated boxes, not a grid of its tile
    problem = mode_problem(graph, p.layers, whole if group.boxes is not None else p.tile,
                           p.mode, whole)
    if problem is not None:
        raise EmulationError(group.id, None, None, f"the plan's mode cannot run: {problem}")
    if io.accumulated and (p.halo_reuse or p.weights_outer):
        raise EmulationError(group.id, None, graph.producer[io.accumulated[0]],
                             "a group ending in an accumulating reduction runs its tiles "
                             "one by one (no halo reuse, no weights-outer loop)")
    if group.boxes is not None and (p.passes > 1 or p.hidden_chunks > 1 or p.end_chunks > 1) \
            and attention_heads(graph, io) is None:
        raise EmulationError(group.id, None, None, "a group of stated boxes (a dynamic plan) "
                             "runs tile by tile: no passes, no hidden or end chunks")


@dataclass(frozen=True)
class Run:
    """One group's run: what every runner is handed."""

    graph: Graph
    group: Group
    io: GroupIO
    chip: Chip
    dram: dict[str, np.ndarray]
    weights: Mapping[str, np.ndarray]
    tally: Tally
    layers: LayerCache

    def anchors(self) -> list[Box]:
        """The group's tiles: its stated boxes, or its tile over the output."""
        g = self.group
        return list(g.boxes if g.boxes is not None else iter_tiles(self.graph, self.io, g.tile))


def _tiles(r: Run) -> None:
    if r.group.halo_reuse:
        run_reuse_tiles(r.graph, r.group, r.chip, r.dram, r.weights, r.tally, layers=r.layers)
        return
    anchors = r.anchors()
    if len(anchors) == 1 and not r.io.accumulated and len(r.io.layers) > 1:
        # its one tile loads every weight: each layer computes once its own are in
        r.tally.layer_chunks = _layer_chunks(r.graph, r.io, r.chip.dtype_bytes, r.tally.stream)
    run_tiles(r.graph, r.group, r.io, anchors, r.dram, r.weights, r.tally, r.layers)
    r.tally.ring_weights()


def _layer_chunks(graph: Graph, io: GroupIO, dt: int, stream: WeightStream | None
                  ) -> dict[str, tuple[tuple[int, Fraction], ...]]:
    """Per layer of the group, in its order, the chunks of weights the DMA brings for it and
    each one's share of the layer's work: resident, each weight tensor whole before the
    first layer that reads it; streamed, the layer's chunks as its stream slices them
    (each making its range of the output channels)."""
    seen: set[str] = set()
    out: dict[str, tuple[tuple[int, Fraction], ...]] = {}
    for i, name in enumerate(io.layers):
        lay = graph.layer(name)
        if stream is not None:
            sizes = stream.sizes[i]
            split = chunk_axes(graph, lay)
            if len(sizes) > 1 and split is not None:
                ranges = chunk_ranges(split[0], len(sizes))
                out[name] = tuple((size, Fraction(hi - lo, split[0]))
                                  for size, (lo, hi) in zip(sizes, ranges, strict=True))
            else:
                out[name] = tuple((size, Fraction(1)) for size in sizes if size)
            continue
        fresh = {w for w in lay.weights if w not in seen}
        seen |= fresh
        size = sum(int(graph.constants[w].size) for w in fresh) * dt
        out[name] = ((size, Fraction(1)),) if size else ()
    return out


def _keys_spilled(r: Run) -> None:
    # halo reuse, the kept keys written as made and read back (planner.cost.spilled_keys)
    run_reuse_tiles(r.graph, r.group, r.chip, r.dram, r.weights, r.tally, layers=r.layers,
                    spilled=kept_prefix(r.graph, r.io))


def _cluster_split(r: Run) -> None:
    split = cluster_split(r.graph, r.io)
    assert split is not None  # _check_mode asked mode_problem
    r.tally.split = SplitRun.of(r.graph, r.io, split, r.chip.clusters, r.weights,
                                r.chip.dtype_bytes)
    if r.group.halo_reuse:  # row tiles in order, the kept keys held, spilled or in WRAM
        spilled = kept_prefix(r.graph, r.io) if r.group.placement.keys_spilled \
            else frozenset()
        shares = wram_keys(r.graph, r.io, split, r.chip.clusters) \
            if r.group.placement.keys_in_wram else None
        in_wram = {t: Fraction(n, r.graph.elems(t)) for t, n in (shares or {}).items()}
        run_reuse_tiles(r.graph, r.group, r.chip, r.dram, r.weights, r.tally,
                        layers=r.layers, spilled=spilled, in_wram=in_wram)
        return
    # tiles outer, never played layer by layer (planner.cost.cluster_split)
    run_tiles(r.graph, r.group, r.io, r.anchors(), r.dram, r.weights, r.tally, r.layers)


def _weights_outer(r: Run) -> None:
    run_weights_outer(r.graph, r.group, r.chip, r.dram, r.weights, r.tally, r.layers)


def _passes(r: Run) -> None:
    p = r.group.placement
    split = pass_split(r.graph, r.group.layers, p.inputs_held, p.maps_held)
    assert split is not None  # _check_mode asked mode_problem
    run_passes(r.graph, r.group, split, r.dram, r.weights, r.tally, r.layers, r.chip)


def _head_chunks(r: Run) -> None:
    heads = attention_heads(r.graph, r.io)
    assert heads is not None  # the kind says so
    run_head_chunks(r.graph, r.group, r.io, r.anchors(), r.dram, r.weights, r.tally,
                    r.layers, heads)


def _hidden(r: Run) -> None:
    run_tiles(r.graph, r.group, r.io, r.anchors(), r.dram, r.weights, r.tally, r.layers,
              hidden=stretches(r.graph, r.io))


def _ends(r: Run) -> None:
    ends = chunked_ends(r.graph, r.io)
    assert ends is not None  # _check_mode asked mode_problem
    run_end_tiles(r.graph, r.group, r.io, r.anchors(), r.dram, r.weights, r.tally, r.layers,
                  ends)


# one runner per kind of mode (the cost model has one cost function per kind)
_RUNNERS: dict[ModeKind, Callable[[Run], None]] = {
    ModeKind.TILES: _tiles,
    ModeKind.WEIGHTS_OUTER: _weights_outer,
    ModeKind.PASSES: _passes,
    ModeKind.HEAD_CHUNKS: _head_chunks,
    ModeKind.HIDDEN: _hidden,
    ModeKind.ENDS: _ends,
    ModeKind.CLUSTER_SPLIT: _cluster_split,
    ModeKind.KEYS_SPILLED: _keys_spilled,
}


def _group_run(group: Group, tallies: list[Tally]) -> GroupRun:
    """The tiles' events of a group (one tally per band) as the clock plays them."""
    return GroupRun(tuple(tuple(t.events) for t in tallies), group.double_buffered,
                    group.prefetch)


def _run_bands(graph: Graph, group: Group, chip: Chip, dram: dict[str, np.ndarray],
               weights: Mapping[str, np.ndarray], io: GroupIO, layers: LayerCache
               ) -> tuple[Counters, GroupRun, list[Violation]]:
    """A banded halo-reusing group (planner.geometry.bands): each band's tiles run on their own chip
    images, as its cores would; work and feature-map traffic add up, the weights are read
    once (broadcast), each band's tiles go to the clock as their own stream (bands compute
    at once on their own cores), and capacity is checked per cluster and core from each
    band's measured peak."""
    dt = chip.dtype_bytes
    wbytes = sum(int(graph.constants[w].size) for w in io.weights) * dt
    anchors = list(iter_tiles(graph, io, group.tile))
    columns = ceil(anchor_extent(graph, io)[2] / group.tile.w)
    tallies = []
    stream = None if group.weights_resident else WeightStream.of(graph, io, group, weights, dt)
    for first, end in band_columns(columns, group.tile.bands):
        tally = Tally(chip, group, wbytes, checks=False, stream=stream)
        mine = [a for a in anchors if first <= a[4] // group.tile.w < end]
        run_reuse_tiles(graph, group, chip, dram, weights, tally, mine, layers)
        tallies.append(tally)
    fmap_peaks = [t.peak - t.onchip_weights for t in tallies]
    found = [Violation(group.id, -1, level, need, cap) for level, need, cap in
             band_overflows(chip, fmap_peaks, tallies[0].weights_now(None))]
    # the weights are read once per step of the bands and broadcast to all of them
    weight_read = max(t.weight_read for t in tallies)
    fmaps = sum(t.read - t.weight_read for t in tallies)
    c = Counters(
        dram_read_bytes=fmaps + weight_read, dram_write_bytes=sum(t.write for t in tallies),
        weight_read_bytes=weight_read,
        redundant_read_bytes=fmaps - inputs_once_bytes(graph, io, dt),
        sram_peak_bytes=max(cluster_loads(chip, fmap_peaks)) + tallies[0].onchip_weights,
        macs=sum(t.macs for t in tallies), array_macs=sum(t.array_macs for t in tallies),
        vector_ops=sum(t.vector_ops for t in tallies),
        core_fmap_bytes=sum(t.core for t in tallies),
        core_weight_bytes=wbytes * sum(t.tiles for t in tallies),
        first_load_bytes=sum(t.first for t in tallies) - (len(tallies) - 1) * wbytes,
        last_store_bytes=sum(t.last for t in tallies))
    return c, _group_run(group, tallies), found


def _prefetch_capacity(graph: Graph, chip: Chip, group: Group, counted: Counters, gid: int,
                       prefetched: int, weights: Mapping[str, np.ndarray]) -> list[Violation]:
    """Overflow from holding the next group's weights while `group` runs: in WRAM beside its
    resident weights (or its largest streamed pair), else in SRAM beside its peak of live
    bytes."""
    if chip.wram is not None:
        io = group_io(graph, group.layers)
        if group.weights_resident:
            own = sum(int(graph.constants[w].size) for w in io.weights) * chip.dtype_bytes
        else:
            own = WeightStream.of(graph, io, group, weights, chip.dtype_bytes).reserved
        share = ceil((own + prefetched) / chip.cores_per_cluster)
        return [Violation(gid, -1, "wram", share, chip.wram.bytes)] \
            if share > chip.wram.bytes else []
    need = counted.sram_peak_bytes + prefetched
    return [Violation(gid, -1, "sram", need, chip.sram.bytes)] if need > chip.sram.bytes else []


def emulate(graph: Graph, plan: Plan, chip: Chip, inputs: Mapping[str, np.ndarray],
            weights: Mapping[str, np.ndarray] | None = None,
            corrupt: Corruption | None = None,
            progress: ProgressSink | None = None) -> EmulationResult:
    """Run every group of the plan in order; returns the model outputs, the counters and,
    from the clock (emulator.clock) fed with every tile's events, each group's cycles.
    ``corrupt``: a test hook making one element of one group's output wrong (Corruption);
    None in every real run. ``progress``: told how many groups have run
    (planner.core.progress)."""
    if corrupt is not None:
        corrupt.target(graph, plan)  # a hook that names no output of the plan is refused now
    dram: dict[str, np.ndarray] = {k: np.asarray(v, dtype=np.float32) for k, v in inputs.items()}
    counters: list[Counters] = []
    runs: list[GroupRun] = []
    violations: list[Violation] = []
    layers = LayerCache(graph)
    tick = ticker(progress, "emulating", len(plan.groups))
    # A tile's matrix products are small: BLAS threads cost more in hand-offs than they
    # gain, and on a busy machine their spin-waits slow the emulator down tenfold.
    with threadpool_limits(limits=1, user_api="blas"):
        for k, group in enumerate(plan.groups):
            check_bands(graph, group.layers, group.tile, chip, group.halo_reuse, f"group {k}")
            try:
                c, run, v = emulate_group(graph, group, chip, dram, weights or graph.constants,
                                          layers)
            except EmulationError:
                raise
            except KernelFailure as exc:
                raise EmulationError(k, None, exc.layer, exc.detail) from exc
            except (ValueError, KeyError, IndexError, TypeError, RuntimeError) as exc:
                # anything else the runners trip over is a plan they cannot run, not input
                raise EmulationError(k, None, None, f"{type(exc).__name__}: {exc}") from exc
            if group.prefetch and k:  # its weights load while the group before it runs
                wbytes = sum(int(graph.constants[w].size) for w in group_io(graph, group.layers)
                             .weights) * chip.dtype_bytes
                violations.extend(_prefetch_capacity(graph, chip, plan.groups[k - 1],
                                                     counters[k - 1], k - 1, wbytes,
                                                     weights or graph.constants))
            if corrupt is not None and corrupt.group == k:
                corrupt.apply(graph, plan, dram)
            counters.append(c)
            runs.append(run)
            violations.extend(v)
            if tick is not None:
                tick(k + 1)
    for a in graph.appends:  # the cache's buffer: the past where it was, the new after it
        dram[a.output] = np.concatenate([dram[a.cache], dram[a.new]], axis=a.axis)
    times = simulate_plan(chip, runs)
    timed = [replace(c, cycles=t.cycles, prefetch_cycles=floor(t.prefetch_cycles),
                     band_compute_cycles=t.compute_busy if len(run.bands) > 1 else 0)
             for c, t, run in zip(counters, times, runs, strict=True)]
    outputs = (*graph.outputs, *(a.output for a in graph.appends))
    return EmulationResult({t: dram[t] for t in outputs}, timed, violations, dram, times,
                           [sum(len(band) for band in run.bands) for run in runs])
