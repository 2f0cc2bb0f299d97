"""The concrete group and tile rules check themselves against (``Rule.check``).

GroupFacts states a group's capacities with the same bound formulas the CP-SAT encoding
(rules.encoding) states over its variables; quantities are computed once per group and
tile (cached properties of the frozen record).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import cast

from fuseplan.hardware.chip import Chip
from fuseplan.planner.cost.cluster_split import group_split_weight_bytes, split_key_bytes
from fuseplan.planner.cost.hidden import HiddenStream, hidden_stream
from fuseplan.planner.cost.model import (
    band_peak_bytes,
    live_steps,
    outer_chunks,
    region_sums,
    weight_bytes,
    work_counters,
)
from fuseplan.planner.cost.weight_stream import chunk_width, staged_steps
from fuseplan.planner.geometry.attention import OnlineAttention, online_attention
from fuseplan.planner.geometry.bands import cluster_loads
from fuseplan.planner.geometry.ends import Ends, EndStream, chunked_maps, tail_steps
from fuseplan.planner.geometry.halo_reuse import ReuseGrid, reuse_peak_elems
from fuseplan.planner.geometry.hidden import Stretch, stretch_chunks
from fuseplan.planner.geometry.regions import (
    AxisChain,
    GroupChains,
    GroupIO,
    StripSpans,
    Tile,
    anchor_extent,
    box_elems,
)
from fuseplan.planner.ir.graph import Graph, Layer
from fuseplan.planner.plan.mode import Mode, ModeFlags


def channels(graph: Graph, tensor: str) -> int:
    """Channels of a tensor, its layout's channel axes together: every tile holds them whole."""
    return graph.layout(tensor).dims(graph.shapes[tensor])[1]


def _axis_bound(chain: AxisChain | None, extent: int, size: int, full: int) -> int:
    if chain is None or size >= extent:
        return full
    return chain.bound(size)


@dataclass(frozen=True)
class GroupFacts(ModeFlags):
    """A concrete group and tile, with the quantities rules are stated in."""

    graph: Graph
    io: GroupIO
    chains: GroupChains
    tile: Tile
    chip: Chip
    # how the group runs (planner.plan.mode): its residency, buffers, halos; weights outer
    # (one layer whose weight chunks each sweep every tile: a tile holds only the widest
    # chunk's slice of the output channels); its hidden chunks (with `hidden` below)
    mode: Mode = Mode()
    # the reusing tile grid, when the caller keeps one across tiles (its axes are memoized)
    grid: ReuseGrid | None = field(default=None, compare=False, repr=False)
    # tensor_bound_bytes by tensor, filled as asked (the peaks ask for each tensor per step)
    _bounds: dict[str, int] = field(default_factory=dict, compare=False, repr=False)
    # one pass of a group run in pooling passes (solver.passes): the maps the group holds on
    # chip beside this pass's tiles (held inputs, tail results), and the whole group's
    # resident weights (this pass's layers hold only part of them)
    held_bytes: int = 0
    group_weight_bytes: int | None = None
    # a group run in hidden chunks (planner.geometry.hidden): each hidden map is held a
    # chunk at a time (mode.hidden_chunks of them), the widest chunk's slice of its channels
    hidden: tuple[Stretch, ...] = ()
    # its streamed weights on chip at each step (planner.cost.hidden.hidden_stream), when
    # the caller keeps them
    hidden_weights: HiddenStream | None = field(default=None, compare=False, repr=False)
    # what does not depend on residency, buffers or chunks (the longest range of each
    # tensor over the tiles of one axis, halo re-reads), by what it does depend on, when the
    # caller keeps it across the facts of one search (enumerating tiles is the dearest part
    # of a check)
    memo: dict[tuple[object, ...], object] | None = field(
        default=None, compare=False, repr=False)
    # inputs loaded again after a stretch, off chip in between (planner.geometry.reload)
    reloaded: Mapping[str, tuple[int, int]] | None = field(default=None, compare=False)
    # a group run with end chunks (planner.geometry.ends): its input and output are held a
    # chunk at a time (mode.end_chunks of them), the widest chunk's slice of their channels;
    # its streamed weights on chip at each step (planner.cost.ends.ends_stream)
    ends: Ends | None = None
    end_weights: EndStream | None = field(default=None, compare=False, repr=False)

    @cached_property
    def layers(self) -> list[Layer]:
        return [self.graph.layer(n) for n in self.io.layers]

    @property
    def fused(self) -> bool:
        return len(self.io.layers) > 1

    @cached_property
    def extent(self) -> tuple[int, int, int]:
        return anchor_extent(self.graph, self.io)

    @property
    def small(self) -> bool:
        """Small-map mode: the tile holds whole maps."""
        _, h, w = self.extent
        return self.tile.h >= h and self.tile.w >= w

    def tensor_bound_bytes(self, t: str) -> int:
        """Largest box of tensor t any tile needs (same bound as the CP-SAT encoding).

        Along an axis without a closed form (upsampling, transposed conv inside the group)
        the bound is the longest range over the tiles, found by enumerating them.
        """
        if t not in self._bounds:
            self._bounds[t] = self._tensor_bound_bytes(t)
        return self._bounds[t]

    def _tensor_bound_bytes(self, t: str) -> int:
        n, h, w = self.extent
        cn, cr, cc = self.chains.chains[t]
        fb = self.chains.full[t]
        c = channels(self.graph, t)
        sizes = []
        for axis, (chain, extent, size) in enumerate(
                ((cn, n, self.tile.n), (cr, h, self.tile.h), (cc, w, self.tile.w))):
            full = fb[2 * axis + 1] - fb[2 * axis]
            if axis == 1 and size < extent and self.halo_reuse and self._reuse_grid.rows.growing:
                # keys kept: tiles walked (kept in WRAM: only what each tile makes in SRAM)
                rows = self._reuse_grid.rows
                sizes.append(rows.longest_made(t) if t in self._reuse_grid.in_wram
                             else rows.longest_held(t))
            elif chain is None and size < extent and axis == 1 and self._prefixed(t):
                sizes.append(full)  # the last tile reads the whole prefix: every key
            elif chain is None and size < extent:
                sizes.append(self._enumerated_span(axis).get(t, full))
            else:
                sizes.append(_axis_bound(chain, extent, size, full))
        for s in self.hidden:
            if t in s.hidden:
                c = c // s.channels \
                    * chunk_width(s.channels, stretch_chunks(s, self.hidden_chunks))
        if self.ends is not None and (t == self.ends.source
                                      or t in chunked_maps(self.graph, self.ends)):
            units = self.ends.reduced if t == self.ends.source else self.ends.produced
            c = c // units * chunk_width(units, self.end_chunks)
        elems = c * sizes[0] * sizes[1] * sizes[2]
        if self.attention is not None:  # streamed keys and values: one chunk on chip
            elems = self.attention.onchip_elems(t, elems, sizes[1])
        return elems * self.chip.dtype_bytes

    @cached_property
    def attention(self) -> OnlineAttention | None:
        """The group's fused attention layers (planner.geometry.attention), None without."""
        return online_attention(self.graph, self.io)

    def scratch_bytes(self, step: int) -> int:
        """The online softmax's scratch at `step` (planner.geometry.attention), bounded as the
        tile's maps are."""
        if self.attention is None:
            return 0
        return self.attention.scratch_elems(
            step, {out: self.tensor_bound_bytes(out) for _, out, _, _ in self.attention.scratch})

    def _prefixed(self, t: str) -> bool:
        """Keys or values streamed into a causal fused attention, which reads a prefix of
        them (no closed form along rows, the last tile reading them all)."""
        return self.attention is not None and t in self.attention.prefix

    def _enumerated_span(self, axis: int) -> Mapping[str, int]:
        """Longest range of every tensor along one axis over all tiles of that axis."""
        return self._enumerated_spans[axis]

    @cached_property
    def _enumerated_spans(self) -> dict[int, Mapping[str, int]]:
        """_enumerated_span of every axis some tensor has no closed form along and the
        tile splits (the axes tensor_bound_bytes enumerates)."""
        extent = self.extent
        size = (self.tile.n, self.tile.h, self.tile.w)
        axes = sorted({axis for t, chain in self.chains.chains.items()
                       for axis in range(3) if chain[axis] is None and size[axis] < extent[axis]
                       and not (axis == 1 and self._prefixed(t))})
        return {axis: self.strip_spans(axis, size[axis]).longest for axis in axes}

    def strip_spans(self, axis: int, size: int) -> StripSpans:
        """The group's strips of `size` along `axis`, walked once per search where it keeps
        a memo (the halo check and the longest ranges of every tile of that size share it)."""
        key: tuple[object, ...] = ("spans", self.io.layers, axis, size)
        if self.memo is not None and key in self.memo:
            return cast(StripSpans, self.memo[key])
        spans = StripSpans.of(self.graph, self.io, axis, size)
        if self.memo is not None:
            self.memo[key] = spans
        return spans

    @cached_property
    def in_bytes(self) -> int:
        return sum(self.tensor_bound_bytes(t) for t in self.io.inputs)

    @cached_property
    def out_bytes(self) -> int:
        return sum(self.tensor_bound_bytes(t) for t in self.io.outputs)

    @cached_property
    def weight_bytes(self) -> int:
        """Weight bytes one cluster holds when they are resident (split over the clusters:
        its share, planner.cost.cluster_split)."""
        if self.group_weight_bytes is not None:
            return self.group_weight_bytes
        if self.mode.cluster_split:
            # the same for every tile: worked out once per search where it keeps a memo
            key: tuple[object, ...] = ("split_share", self.io.layers)
            if self.memo is not None and key in self.memo:
                share = cast(int | None, self.memo[key])
            else:
                share = group_split_weight_bytes(self.graph, self.io, self.chip)
                if self.memo is not None:
                    self.memo[key] = share
            if share is not None:
                return share
        return weight_bytes(self.graph, self.io.weights, self.chip)

    @cached_property
    def wram_key_bytes(self) -> int:
        """Kept keys the busiest cluster holds in its cores' WRAM beside its weight share
        (Mode.keys_in_wram; 0 in any other mode)."""
        if not self.mode.keys_in_wram or not self.halo_reuse:
            return 0
        return split_key_bytes(self.graph, self.io, self.chip, self._reuse_grid) or 0

    @cached_property
    def steps(self) -> list[tuple[str, ...]]:
        """Tensors live while each layer runs (planner.cost.model.live_steps), worked out
        once for both peaks below; with an output end's tail, as a chunk but the last holds
        them (planner.geometry.ends.tail_steps)."""
        steps = live_steps(self.graph, self.io, self.reloaded)
        if self.ends is not None and self.ends.tail:
            return tail_steps(self.graph, self.io, self.ends, steps)
        return steps

    @cached_property
    def live_peak_bytes(self) -> int:
        """Peak of live tensors when freed after their last use (input/output share space)."""
        if self.weights_outer:
            return self.in_bytes + self._outer_slice_bytes
        return max(sum(self.tensor_bound_bytes(t) for t in live) + self.scratch_bytes(i)
                   for i, live in enumerate(self.steps)) + self.held_bytes

    @property
    def _outer_slice_bytes(self) -> int:
        """A weights-outer tile's widest slice of output channels."""
        channels, sizes = outer_chunks(self.graph, self.io, self.chip)
        width = chunk_width(channels, len(sizes))
        return self.tensor_bound_bytes(self.io.outputs[0]) // channels * width

    @cached_property
    def staged_bytes(self) -> tuple[int, ...]:
        """Streamed weight chunks on chip at each step (planner.cost.weight_stream); empty
        when the weights are resident."""
        if self.weights_resident:
            return ()
        if self.end_weights is not None:  # each end's step holds the most of any chunk's
            return self.end_weights.by_step(len(self.ends.tail) if self.ends else 0)
        if self.hidden:  # a stretch's steps hold the most of any chunk's
            stream = self.hidden_weights or hidden_stream(self.graph, self.io, self.hidden,
                                                          self.hidden_chunks, self.chip)
            return stream.by_layer
        return staged_steps(self.graph, self.io, self.chip)

    @property
    def stage_peak_bytes(self) -> int:
        """The largest double-buffered pair of streamed chunks (0 when resident)."""
        return max(self.staged_bytes, default=0)

    @cached_property
    def sram_live_peak_bytes(self) -> int:
        """live_peak_bytes with, on single-memory chips, each step's streamed chunks beside
        its maps."""
        if self.weights_outer or not (self.chip.unified and self.staged_bytes):
            return self.live_peak_bytes + (self.stage_peak_bytes if self.chip.unified else 0)
        return max(sum(self.tensor_bound_bytes(t) for t in live) + self.staged_bytes[i]
                   + self.scratch_bytes(i)
                   for i, live in enumerate(self.steps)) + self.held_bytes

    @property
    def onchip_weight_bytes(self) -> int:
        """Weight bytes held in the weight memory at once: all of them when resident, the
        largest streamed pair when not."""
        return self.weight_bytes if self.weights_resident else self.stage_peak_bytes

    @cached_property
    def all_fmap_bytes(self) -> int:
        """Every tensor of the group held at once (no sharing)."""
        tensors = set(self.io.inputs) | set(self.io.outputs) | set(self.io.internal)
        return sum(self.tensor_bound_bytes(t) for t in tensors) + self.held_bytes

    @cached_property
    def _reuse_grid(self) -> ReuseGrid:
        """The reusing tile grid: the search's where it keeps one (its axes memoized)."""
        return self.grid or ReuseGrid.of(self.graph, self.io, self.chains, self.tile,
                                         spilled=self.mode.keys_spilled,
                                         keys_in_wram=self.mode.keys_in_wram)

    @cached_property
    def reuse_peak_bytes(self) -> int:
        """Exact peak of feature-map bytes on chip when halos are reused (the kept borders,
        each tile's new parts, and with double buffering the next tile's loads); for a
        banded tile, the fullest cluster's bands together."""
        if self.tile.bands > 1:
            return max(cluster_loads(self.chip, self.band_peak_bytes))
        return reuse_peak_elems(self.graph, self.io, self.chains, self.tile,
                                self.double_buffered, self._reuse_grid) * self.chip.dtype_bytes

    @cached_property
    def band_peak_bytes(self) -> list[int]:
        """Each band's exact feature-map peak (planner.geometry.bands; one entry without bands)."""
        if self.tile.bands == 1:
            return [self.reuse_peak_bytes]
        return band_peak_bytes(self.graph, self.io, self.chains, self.tile, self.chip,
                               self.double_buffered)

    def redundancy_pct(self) -> float:
        """Halo re-reads as a percentage of reading each input once (rule 11)."""
        key: tuple[object, ...] = ("redundancy", self.io.layers, self.tile, self.halo_reuse)
        if self.memo is not None and key in self.memo:
            return cast(float, self.memo[key])
        pct = self._redundancy_pct()
        if self.memo is not None:
            self.memo[key] = pct
        return pct

    @property
    def haloed_inputs(self) -> tuple[str, ...]:
        """The inputs whose re-reads are halos: all but the keys and values a fused
        attention streams (every query tile reads them whole by design, as a tile streams
        its weights; they count as DRAM traffic all the same)."""
        if self.attention is None:
            return self.io.inputs
        return tuple(t for t in self.io.inputs if t not in self.attention.streamed)

    def _redundancy_pct(self) -> float:
        once = sum(box_elems(self.graph, t, self.chains.full[t]) for t in self.haloed_inputs)
        if self.tile.bands > 1:  # the bands' overlaps are re-read
            c = work_counters(self.graph, self.io, self.chains, self.tile, self.chip,
                              self.weights_resident, True)
            return 100.0 * c.redundant_read_bytes / max(once * self.chip.dtype_bytes, 1)
        if self.halo_reuse:
            grid = self._reuse_grid
            loaded = sum(grid.made_elems(t) for t in self.haloed_inputs)
        else:
            loaded = sum(region_sums(self.graph, self.io, self.chains, self.tile,
                                     self.haloed_inputs, self.strip_spans).values())
        return 100.0 * (loaded - once) / max(once, 1)
