"""A stretch of a group run in hidden chunks, as the emulator runs it
(planner.geometry.hidden; Placement.hidden_chunks > 1).

For every chunk of hidden channels the widening layer computes its slice of the hidden maps
from its whole input (its weights cut along their output channels), the per-element layers
run on the slice (their per-channel constants cut the same way), and the narrowing layer
computes partial sums from the slice (its weights cut along the channels it sums over, its
bias added by the first chunk) and adds them into the accumulator, which starts from the
skip map of the residual Add after the stretch where that Add can take it (the skip's
buffer becomes the accumulator: planner.geometry.hidden.folded_skip). Bytes on chip are
counted from the arrays held at each step; the weights on chip from the slices
(emulator.chunks.WeightStream).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, MutableMapping
from dataclasses import replace

import numpy as np

from fuseplan.emulator.boxes import fill_box, slice_box, take_range
from fuseplan.emulator.chunks import Overlay, run_in_slices
from fuseplan.emulator.errors import EmulationError, KernelFailure
from fuseplan.emulator.fold import Fold
from fuseplan.emulator.layer import LayerCache, run_layer
from fuseplan.emulator.onchip import held_for_all, in_place_elems
from fuseplan.emulator.tally import Tally
from fuseplan.planner.geometry.attention import online_attention
from fuseplan.planner.geometry.heads import take_units
from fuseplan.planner.geometry.hidden import (
    Stretch,
    constant_axes,
    folded_skip,
    hidden_ranges,
    vector_axes,
    widen_runs,
    widening_layers,
)
from fuseplan.planner.geometry.in_place import in_place_hosts
from fuseplan.planner.geometry.regions import Box, GroupIO, box_elems
from fuseplan.planner.ir.graph import Graph, Layer
from fuseplan.planner.plan.data import Group


def chunk_constants(graph: Graph, s: Stretch, name: str, weights: Mapping[str, np.ndarray],
                    j: int, lo: int, hi: int) -> dict[str, np.ndarray]:
    """The constants of a stretch layer that chunk j = [lo, hi) uses instead of the whole
    ones: slices along the hidden channels; the narrowing layer's uncut constants (its
    bias) zero after the first chunk, so that the bias is added once."""
    out: dict[str, np.ndarray] = {}
    for c, units in constant_axes(graph, s, name).items():
        arr = np.asarray(weights.get(c, graph.constants.get(c)))
        if units is not None:
            out[c] = take_units(arr, units, lo, hi)
        elif name == s.narrow and j > 0 and c in graph.layer(name).weights:
            out[c] = np.zeros_like(arr)
    return out


def run_stretch(graph: Graph, group: Group, io: GroupIO, s: Stretch, chunks: int, tile: int,
                boxes: Mapping[str, Box], onchip: MutableMapping[str, tuple[Box, np.ndarray]],
                weights: Mapping[str, np.ndarray], tally: Tally, layers: LayerCache,
                held: Mapping[str, tuple[Box, np.ndarray]], prefetch: int,
                fold: Fold | None = None, fills: Mapping[str, np.ndarray] | None = None
                ) -> np.ndarray:
    """Run the stretch chunk by chunk on one tile (its `boxes`); returns the narrowing
    layer's output (the accumulator), counting work, core traffic and every step's bytes.
    The widening layer's inputs that nothing after it reads leave `onchip` after the last
    chunk has read them. A stretch ending in a pool (Stretch.pools) folds each chunk's
    channels into `fold`, the group's accumulator, and returns the tile's partial result,
    each chunk filling its own channels of it. ``fills``: whole on-chip buffers of maps
    held for later passes: each chunk writes its channels of the tile into them, not
    counted again in the chunk's maps (``prefetch`` counts the buffers)."""
    run = _StretchRun(graph, group, io, s, chunks, tile, boxes, onchip, weights, tally, layers,
                      held, prefetch, fold, fills or {})
    for j, (lo, hi) in enumerate(run.ranges):
        part: dict[str, tuple[Box, np.ndarray]] = {}
        for k, name in enumerate(s.layers):
            run.layer_step(j, lo, hi, k, name, part)
    assert run.acc is not None
    return run.acc


class _StretchRun:
    """One tile's run of a stretch: what every chunk's steps share, and the accumulator."""

    def __init__(self, graph: Graph, group: Group, io: GroupIO, s: Stretch, chunks: int,
                 tile: int, boxes: Mapping[str, Box],
                 onchip: MutableMapping[str, tuple[Box, np.ndarray]],
                 weights: Mapping[str, np.ndarray], tally: Tally, layers: LayerCache,
                 held: Mapping[str, tuple[Box, np.ndarray]], prefetch: int, fold: Fold | None,
                 fills: Mapping[str, np.ndarray]) -> None:
        self.graph, self.group, self.s, self.tile = graph, group, s, tile
        self.boxes, self.onchip, self.weights = boxes, onchip, weights
        self.tally, self.layers, self.prefetch, self.fold = tally, layers, prefetch, fold
        self.fills = fills
        self.dt = dt = tally.chip.dtype_bytes
        self.kept_for_all = held_for_all(held, fills, dt)  # in SRAM, not in the cores' NRAM
        self.a = io.layers.index(s.widen)
        self.widen_inputs = widen_inputs = graph.layer(s.widen).fmap_inputs
        # the widening layer and its siblings, each reading its input in every chunk
        self.widening = widening_layers(graph, s)
        self.last_reader = self.widening[-1]
        later = {t for n in io.layers[io.layers.index(s.narrow) + 1:]
                 for t in graph.layer(n).fmap_inputs}
        self.ends = [t for t in widen_inputs if t not in later and t not in io.outputs
                     and t not in held]
        self.last_read = {t: max(k for k, n in enumerate(s.layers)
                                 if t in graph.layer(n).fmap_inputs)
                          for t in s.hidden}
        # reads of each tensor by the stretch's layers: a chunk of it made here is written to
        # the cores' memory once and read that many times
        self.reads = Counter(u for n in s.layers for u in graph.layer(n).fmap_inputs)
        self.ranges = hidden_ranges(s, chunks)
        self.hosts = in_place_hosts(graph, io)
        self.attention = online_attention(graph, io)
        self.skip_fold = folded_skip(graph, io, s)
        self.runs = widen_runs(graph, s)  # loads of the widening layer's slice per chunk
        self.acc: np.ndarray | None = None

    def layer_step(self, j: int, lo: int, hi: int, k: int, name: str,
                   part: dict[str, tuple[Box, np.ndarray]]) -> None:
        """Run the stretch's k-th layer on chunk j = [lo, hi): compute, count, keep its
        outputs in `part`, record the step's bytes, then free what no later layer reads."""
        s = self.s
        lay = self.graph.layer(name)
        y, more = self._compute(j, lo, hi, name, lay, part)
        self._count(j, lo, hi, name, lay, part, y)
        if name != s.narrow:
            self._keep(name, lay, lo, hi, part, y, more)
        self._step(j, k, name, lay, part, y)
        if name == self.last_reader and j == len(self.ranges) - 1:  # its input's last read
            for t in self.ends:
                del self.onchip[t]
        for t in [t for t in part if self.last_read[t] <= k]:
            del part[t]

    def _compute(self, j: int, lo: int, hi: int, name: str, lay: Layer,
                 part: dict[str, tuple[Box, np.ndarray]]) -> tuple[np.ndarray, list[np.ndarray]]:
        """The layer's output on the chunk, and a Split's other parts."""
        graph, s, boxes = self.graph, self.s, self.boxes
        out = lay.outputs[0]
        more: list[np.ndarray] = []  # a Split's other parts
        view = {**self.onchip, **part}
        consts = Overlay(chunk_constants(graph, s, name, self.weights, j, lo, hi), self.weights)
        for t, axis in vector_axes(graph, s, name).items():  # the chunk's slice of each
            box, arr = view[t]
            view[t] = (box, take_range(arr, axis, lo, hi))
        grouped = name in s.mids and int(lay.attrs.get("group", 1)) == s.channels
        try:
            if s.pools and name == s.narrow:  # fold the chunk's channels of the tile
                y = self._fold_chunk(j, lo, hi, name, lay, part)
            elif grouped:  # a depthwise conv on the chunk: one group per channel of it
                chunk_lay = replace(lay, attrs={**lay.attrs, "group": hi - lo})
                (y,) = run_layer(graph, chunk_lay, boxes[out], view, consts)[:1]
            elif s.cuts and name in s.mids:  # a chunk of heads: its own output shape
                # (a reshape restates it); a Split's parts all stay in the chunk
                heads = s.cut_of(out).chunk_shape(graph.shapes[out], hi - lo)
                y, *more = run_layer(graph, replace(lay, out_shape=heads), boxes[out],
                                     view, consts)
            elif name == s.widen and self.runs > 1:  # run by run of its units' weights
                y = self._widen_in_runs(lay, view, consts)
            else:
                (y,) = run_layer(graph, lay, boxes[out], view, consts, layers=self.layers)[:1]
        except KernelFailure as exc:
            raise EmulationError(self.group.id, self.tile, exc.layer, f"hidden chunk {j} "
                                 f"(channels [{lo}, {hi})): {exc.detail}") from exc
        return y, more

    def _widen_in_runs(self, lay: Layer, view: Mapping[str, tuple[Box, np.ndarray]],
                       consts: Overlay) -> np.ndarray:
        """The widening layer's chunk computed one run of its units at a time
        (planner.geometry.hidden.widen_runs): each run's output channels from that run's
        slice of the chunk's weights alone, joined in the chunk's order (run, unit, inner)."""
        graph, s = self.graph, self.s
        cuts = {c: cut for c, cut in constant_axes(graph, s, s.widen).items()
                if cut is not None}
        slices = []
        for r in range(self.runs):
            part = {}
            for c, cut in cuts.items():
                arr = consts[c]  # the chunk's slice: (run, unit, inner) along its axis
                step = arr.shape[cut.axis] // self.runs
                part[c] = take_range(arr, cut.axis, r * step, (r + 1) * step)
            slices.append(part)
        out = lay.outputs[0]

        def compute(w: Mapping[str, np.ndarray]) -> list[np.ndarray]:
            return run_layer(graph, lay, self.boxes[out], view, w, layers=self.layers)[:1]

        (y,) = run_in_slices(lay, consts, compute, slices)
        return y

    def _fold_chunk(self, j: int, lo: int, hi: int, name: str, lay: Layer,
                    part: Mapping[str, tuple[Box, np.ndarray]]) -> np.ndarray:
        """Fold the chunk's channels of the tile into the group's accumulator; returns the
        tile's partial result (all channels), this chunk's filled in."""
        if self.fold is None:  # the pool is not the group's accumulator
            raise EmulationError(self.group.id, self.tile, name, "a stretch ends in this "
                                 "pool, but the group does not fold it tile by tile")
        s = self.s
        x = lay.fmap_inputs[0]
        part_y = self.fold.add(part[x][1], self.boxes[x], (lo, hi), j == len(self.ranges) - 1)
        if self.acc is None:  # the tile's partial result, all channels
            shape = list(part_y.shape)
            shape[s.axis] = s.channels
            self.acc = np.zeros(shape, dtype=part_y.dtype)
        take_range(self.acc, s.axis, lo, hi)[...] = part_y
        return self.acc

    def _count(self, j: int, lo: int, hi: int, name: str, lay: Layer,
               part: Mapping[str, tuple[Box, np.ndarray]], y: np.ndarray) -> None:
        """Count the layer's work on the chunk (the narrowing layer: add into the
        accumulator)."""
        s, tally, dt = self.s, self.tally, self.dt
        if name in self.widening:
            tally.ops(lay, y.size)
            if j > 0:  # the tile's input is read again by every chunk (its box: an
                # input held whole for every tile, planner.geometry.passes, is larger)
                tally.core += sum(box_elems(self.graph, t, self.boxes[t])
                                  for t in self.widen_inputs) * dt
        elif name == s.narrow and s.pools:
            tally.vector_ops += part[lay.fmap_inputs[0]][1].size
        elif name == s.narrow:
            macs = y.size * lay.macs_per_output // s.channels * (hi - lo)
            tally.macs += macs
            # array MACs: the layer as a whole (planner.ir.array), its outputs once
            tally.count_array(lay, y.size if j == 0 else 0, macs)
            if self.acc is None:
                self.acc = y if self.skip_fold is None else self._from_skip(name, y)
            else:  # read the partial sums so far, add, write back
                self.acc = self.acc + y
                tally.core += 2 * y.size * dt
        else:
            tally.ops(lay, y.size)

    def _from_skip(self, name: str, y: np.ndarray) -> np.ndarray:
        """The accumulator started from the skip map of the Add after the stretch: the
        skip's buffer becomes the accumulator (planner.geometry.hidden.folded_skip)."""
        assert self.skip_fold is not None
        name_skip = self.skip_fold.skip
        have, skip = self.onchip.pop(name_skip)
        if have != self.boxes[self.s.out]:  # held with a halo for a layer before the stretch
            skip = slice_box(skip, have, self.boxes[self.s.out], self.graph.layout(name_skip))
        if skip.shape != y.shape:
            raise EmulationError(self.group.id, self.tile, name, f"the accumulator "
                                 f"{y.shape} cannot start from the skip map "
                                 f"'{name_skip}' {skip.shape}")
        return y + skip

    def _keep(self, name: str, lay: Layer, lo: int, hi: int,
              part: dict[str, tuple[Box, np.ndarray]], y: np.ndarray,
              more: list[np.ndarray]) -> None:
        """Keep the chunk's outputs of a layer before the narrowing one in `part`, writing
        a held map's channels into its buffer."""
        s, boxes, fills = self.s, self.boxes, self.fills
        for t, y_t in zip(lay.outputs, [y, *more], strict=True):
            part[t] = (boxes[t], y_t)
            if t in fills:  # this chunk's channels of the held map
                if s.cuts:
                    raise EmulationError(self.group.id, self.tile, name, "a held map cut in "
                                         "heads: no chunk of it is a channel range")
                fill_box(self.graph, fills[t], t, boxes[t], y_t, (s.axis, lo, hi))
            self.tally.core += y_t.size * self.dt * (1 + self.reads[t])

    def _step(self, j: int, k: int, name: str, lay: Layer,
              part: Mapping[str, tuple[Box, np.ndarray]], y: np.ndarray) -> None:
        """Record the step's bytes on chip (and the chunk's weights when they stream)."""
        s, onchip, fills, tally, group = self.s, self.onchip, self.fills, self.tally, self.group
        live = sum(arr.size for t, (_, arr) in onchip.items() if t not in fills) \
            + sum(arr.size for t, (_, arr) in part.items() if t not in fills) \
            + (self.acc.size if self.acc is not None else 0)
        if name != s.narrow and lay.outputs[0] not in fills:  # written over a chunk it read last
            live -= in_place_elems(group.id, self.tile, lay, self.hosts.get(self.a + k),
                                   {**onchip, **part}, y)
        if self.attention is not None:  # a fused attention's online softmax, per head
            live += self.attention.scratch_elems(self.a + k, {lay.outputs[0]: y.size})
        stream = tally.stream
        now = stream.inner.get((name, j), 0) if stream is not None \
            and not group.weights_resident else None
        tally.step(self.tile, live * self.dt + self.prefetch, self.a + k, weights=now,
                   held=self.kept_for_all)
