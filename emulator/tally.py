"""A group's accounting as its tiles run: bytes moved to and from DRAM, work, bytes on chip
at every step and the overflows they make, and each tile's events for the clock.

The mode runners count into a Tally from the arrays they actually move; the dispatch
(emulator.run) turns it into the group's Counters.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from fractions import Fraction
from math import ceil

import numpy as np

from fuseplan.emulator.chunks import Compute, WeightStream
from fuseplan.emulator.clock import LayerEvents, TileEvents
from fuseplan.emulator.split import SplitRun
from fuseplan.hardware.chip import Chip
from fuseplan.planner.cost.counters import Counters
from fuseplan.planner.geometry.regions import GroupIO, box_elems, full_box, tile_regions
from fuseplan.planner.geometry.rounds import leads_round
from fuseplan.planner.ir.array import array_macs, array_map
from fuseplan.planner.ir.graph import Graph, Layer, gathers_rows
from fuseplan.planner.plan.data import Group


@dataclass(frozen=True)
class Violation:
    """An on-chip buffer that overflowed while a tile ran."""

    group: int
    tile: int
    level: str  # sram, nram, wram
    needed_bytes: int
    capacity_bytes: int

    @property
    def over_bytes(self) -> int:
        """How far past the capacity the need went."""
        return self.needed_bytes - self.capacity_bytes

    def describe(self) -> str:
        """One line for reports."""
        return (f"group {self.group} tile {self.tile}: {self.level.upper()} needs "
                f"{self.needed_bytes} B, has {self.capacity_bytes} B ({self.over_bytes} B over)")


def capacity_overflows(chip: Chip, group: int, tile: int, live: int, sram_only: int,
                       resident_weights: int) -> list[Violation]:
    """Overflows of one step: SRAM holds everything live; each core holds 1/n of what is
    not `sram_only` (weights on a single-memory chip, a group's held maps) and of the
    weights."""
    found = []
    if live > chip.sram.bytes:
        found.append(Violation(group, tile, "sram", live, chip.sram.bytes))
    if chip.nram is not None:
        share = ceil((live - sram_only) / chip.cores_per_cluster)
        if share > chip.nram.bytes:
            found.append(Violation(group, tile, "nram", share, chip.nram.bytes))
    if chip.wram is not None:
        share = ceil(resident_weights / chip.cores_per_cluster)
        if share > chip.wram.bytes:
            found.append(Violation(group, tile, "wram", share, chip.wram.bytes))
    return found


def inputs_once_bytes(graph: Graph, io: GroupIO, dt: int) -> int:
    """Bytes of the group's inputs, and of the rows its gathers fetch (Graph.row_gathers),
    read with no halo re-reads (one whole-anchor tile)."""
    full = tile_regions(graph, io, full_box(graph, io.anchor))
    return sum(box_elems(graph, t, full[t])
               for t in [*io.inputs, *graph.gathered(io.layers)]) * dt


@dataclass
class Tally:
    """Counters of one group as its tiles run, with the worst overflow per level."""

    chip: Chip
    group: Group
    weight_bytes: int
    read: int = 0
    write: int = 0
    weight_read: int = 0
    macs: int = 0
    vector_ops: int = 0
    core: int = 0
    peak: int = 0
    tiles: int = 0
    first: int = 0
    last: int = 0
    worst: dict[str, Violation] = field(default_factory=dict)
    checks: bool = True  # capacity per step (a band's tally leaves it to the whole group)
    events: list[TileEvents] = field(default_factory=list)  # per tile, for the clock
    ops_before: tuple[int, int] = (0, 0)  # (MACs, vector ops) counted before this tile
    stream: WeightStream | None = None  # a streaming group's chunks (emulator.chunks)
    split: SplitRun | None = None  # a group split over the clusters (emulator.split)
    link: int = 0  # bytes its gathers moved over the cluster links
    link_before: int = 0  # link bytes counted before this tile
    # a split group's busiest cluster: (MACs, array MACs, vector ops) of the tile being run
    busiest: tuple[int, int, int] = (0, 0, 0)
    core_weight: int = 0  # weight bytes the cores read, over all tiles
    round_tiles: int = 1  # tiles per round sharing each streamed read (planner.geometry.rounds)
    # bytes of table rows gathered since the last tile was counted (Graph.row_gathers): the
    # tile that computed them loaded them
    gathered: int = 0
    # array chips (planner.ir.array): output elements each mapped layer made so far, and
    # the array MACs of the main layers that keep the flat rate
    mapped: dict[str, tuple[Layer, int]] = field(default_factory=dict)
    flat_array: int = 0
    array_before: int = 0  # array MACs counted before this tile
    # a tile that loads the weights plays layer by layer (emulator.clock.LayerEvents): the
    # chunks of weights that arrive for each layer, in the group's order, each with its
    # share of the layer's work (empty: it does not)
    layer_chunks: Mapping[str, tuple[tuple[int, Fraction], ...]] = field(default_factory=dict)
    # per layer, the (MACs, array MACs, vector ops) of the tile being run
    layer_work: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    fmap_peak: int = 0  # the most feature-map bytes on chip at a step (weights not counted)
    next_inputs: int = 0  # bytes the last tile's inputs take (a second buffer's worth)

    @property
    def array_macs(self) -> int:
        """Array MACs of the work counted so far: each mapped layer's from every element it
        made (a layer whose channels ran in chunks counts as a whole, as the model does)."""
        return self.flat_array + sum(array_macs(lay, self.chip, elems, 0)
                                     for lay, elems in self.mapped.values())

    def count_array(self, lay: Layer, outputs: int, macs: int) -> None:
        """Count a main layer's `outputs` elements made with `macs` MACs on the array."""
        array = self.chip.core.array
        if array is None:
            return
        if array_map(lay, array) is None:
            self.flat_array += macs
        else:
            self.mapped[lay.name] = (lay, self.mapped.get(lay.name, (lay, 0))[1] + outputs)

    @property
    def onchip_weights(self) -> int:
        """Weights held in SRAM at every step on single-memory chips: all of them when
        resident, the reserved pair of a streaming halo-reusing group (bands use this)."""
        if not self.chip.unified:
            return 0
        if self.group.weights_resident:
            return self.weight_bytes
        return self.stream.reserved if self.stream is not None else 0

    def weights_now(self, layer: int | None) -> int:
        """Weight bytes in the weight memory while layer `layer` of the group runs (None: a
        halo-reusing group's step, which keeps room for the largest streamed pair)."""
        if self.split is not None:  # the fullest cluster's share
            return self.split.share
        if self.group.weights_resident:
            return self.weight_bytes
        if self.stream is None:
            return 0
        return self.stream.reserved if layer is None else self.stream.held[layer]

    def ops(self, lay: Layer, outputs: int) -> None:
        """Count the work of computing `outputs` elements of a layer (on every cluster
        when a cluster split replicates it)."""
        copies = self.split.copies(lay) if self.split else 1
        ops = outputs * lay.macs_per_output * copies
        if self.split is not None:
            self._busiest(lay, self.split.busiest_elems(lay, outputs))
        if lay.is_main:  # replicated (a product of two maps): on every cluster's array
            self.macs += ops
            self.count_array(lay, outputs * copies, ops)
        else:
            self.vector_ops += ops
        if self.layer_chunks:
            macs, array, vector = self.layer_work.get(lay.name, (0, 0, 0))
            if lay.is_main:
                array += array_macs(lay, self.chip, outputs * copies, ops)
                macs += ops
            else:
                vector += ops
            self.layer_work[lay.name] = (macs, array, vector)

    def _busiest(self, lay: Layer, elems: int) -> None:
        """Count the busiest cluster's `elems` output elements of a layer."""
        macs, array, vector = self.busiest
        ops = elems * lay.macs_per_output
        if lay.is_main:
            self.busiest = (macs + ops, array + array_macs(lay, self.chip, elems, ops), vector)
        else:
            self.busiest = (macs, array, vector + ops)

    def step(self, tile: int, fmap_bytes: int, layer: int | None = None,
             weights: int | None = None, held: int = 0) -> None:
        """Feature-map bytes on chip after a layer ran (its index in the group; None for a
        halo-reusing group's step): peak and capacity, with the weights on chip then (as
        the stream holds them at that layer, unless `weights` says). ``held``: the part of
        `fmap_bytes` the group holds for all its tiles (a group in passes: held inputs,
        held maps, tail results), which stays in SRAM and takes no core's NRAM."""
        weights = self.weights_now(layer) if weights is None else weights
        in_sram = weights if self.chip.unified else 0
        live = fmap_bytes + in_sram
        self.fmap_peak = max(self.fmap_peak, fmap_bytes)
        self.peak = max(self.peak, live)
        if not self.checks:
            return
        self._record(capacity_overflows(self.chip, self.group.id, tile, live, in_sram + held,
                                        weights))

    def hold_keys(self, tile: int, key_bytes: int) -> None:
        """Kept keys in the cores' WRAM beside the weights (Mode.keys_in_wram): `key_bytes`
        the most the busiest cluster has held so far, checked with its weight share."""
        if not self.checks:
            return
        cap = self.chip.wram.bytes if self.chip.wram is not None else 0
        cores = self.chip.cores_per_cluster if self.chip.wram is not None else 1
        need = ceil((self.weights_now(None) + key_bytes) / cores)
        if need > cap:
            self._record([Violation(self.group.id, tile, "wram", need, cap)])

    def _record(self, found: list[Violation]) -> None:
        """Keep the worst overflow per level."""
        for v in found:
            if v.level not in self.worst or v.needed_bytes > self.worst[v.level].needed_bytes:
                self.worst[v.level] = v

    def compute(self, run: Compute, lay: Layer, weights: Mapping[str, np.ndarray]
                ) -> list[np.ndarray]:
        """A layer's outputs from `run` (given the weights to use): chunk by chunk when the
        group streams the layer's weights in chunks."""
        if self.split is not None:
            ys = self.split.run(lay, weights, run)
            self.link += self.split.link_bytes(lay, ys, self.chip.dtype_bytes)
        else:
            ys = self.stream.run(lay, weights, run) if self.stream is not None else run(weights)
        if gathers_rows(lay):  # the rows came from DRAM, one fetch per index of the box
            self.gathered += ys[0].size * self.chip.dtype_bytes
        return ys

    def tile(self, index: int, loaded: int, written: int, weights: int | None = None,
             used: int | None = None) -> None:
        """A tile's DRAM traffic: its loads (and the table rows its gathers fetched), its
        stores, and the weights it streams (or `weights` loaded at this step), with `used`
        weight bytes the cores read for it."""
        if weights is None:
            first = index == 0 if self.group.weights_resident \
                else leads_round(index, self.round_tiles)
            weights = self.weight_bytes if first else 0
        loaded, self.gathered = loaded + self.gathered, 0
        self.core_weight += self.weight_bytes if used is None else used
        self.tiles += 1
        self.read += loaded + weights
        self.weight_read += weights
        self.write += written
        if index == 0:
            self.first = loaded + weights
        self.last = written
        macs, vector_ops = self.ops_before
        array = self.array_macs
        self.events.append(TileEvents(loaded, weights, self.macs - macs,
                                      self.vector_ops - vector_ops, written,
                                      array - self.array_before,
                                      self._layer_events() if weights else (),
                                      0 if self.group.weights_resident else 2,
                                      link_bytes=self.link - self.link_before,
                                      busiest=self.busiest if self.split else None))
        self.link_before = self.link
        self.busiest = (0, 0, 0)
        self.layer_work = {}
        self.ops_before = (self.macs, self.vector_ops)
        self.array_before = array

    def ring_weights(self) -> None:
        """After a streamed group of one tile played layer by layer has run, on a
        single-memory chip: give its weights a ring of all the SRAM its maps leave at their
        peak, when that holds its largest pair; its peak is then the maps' and the ring's
        (and a second input buffer's, past the SRAM, if it keeps one)."""
        if not (self.chip.unified and self.stream is not None and self.events
                and self.events[0].layers):
            return
        second = self.next_inputs if self.group.double_buffered else 0
        ring = self.chip.sram.bytes - (self.fmap_peak - second)
        if ring >= max(self.stream.held, default=0):
            self.peak = self.fmap_peak + ring
            self.events[0] = replace(self.events[0], ahead=0, room=ring)
            if self.checks and second:
                self.step(0, self.fmap_peak, weights=ring)

    def _layer_events(self) -> tuple[LayerEvents, ...]:
        """The tile's layers as the clock plays them, when the group plays its weight-loading
        tile layer by layer."""
        if not self.layer_chunks:
            return ()
        out = []
        for name, chunks in self.layer_chunks.items():
            macs, array, vector = self.layer_work.get(name, (0, 0, 0))
            out.append(LayerEvents(chunks, macs, array, vector))
        return tuple(out)

    def counters(self, graph: Graph, io: GroupIO) -> Counters:
        """The group's byte and work counters (its time comes from the clock: see
        emulator.run.emulate)."""
        dt = self.chip.dtype_bytes
        read = self.read + self.gathered  # rows gathered after the last tile (a pass's tail)
        return Counters(
            dram_read_bytes=read, dram_write_bytes=self.write,
            weight_read_bytes=self.weight_read,
            redundant_read_bytes=read - self.weight_read - inputs_once_bytes(graph, io, dt),
            sram_peak_bytes=self.peak, macs=self.macs, array_macs=self.array_macs,
            vector_ops=self.vector_ops,
            core_fmap_bytes=self.core, core_weight_bytes=self.core_weight,
            cluster_link_bytes=self.link,
            first_load_bytes=self.first, last_store_bytes=self.last)
