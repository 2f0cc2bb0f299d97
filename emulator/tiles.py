"""A group run tile by tile with its halos recomputed: each tile loads the boxes of its
inputs (halo included), computes every layer on its box and stores its box of the outputs.

The plain loop order, and the one a group in passes runs each pass in (emulator.passes);
stretches in hidden chunks run through emulator.hidden, reductions fold into their
accumulators (emulator.fold), a fused attention's keys and values stream a chunk at a time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from fuseplan.emulator.boxes import array_box, fill_box, slice_box
from fuseplan.emulator.fold import Fold
from fuseplan.emulator.hidden import run_stretch
from fuseplan.emulator.layer import LayerCache
from fuseplan.emulator.onchip import compute_on_chip, held_for_all, in_place_elems, keep_outputs
from fuseplan.emulator.tally import Tally
from fuseplan.planner.geometry.attention import online_attention
from fuseplan.planner.geometry.hidden import Stretch, folded_skip
from fuseplan.planner.geometry.in_place import in_place_hosts
from fuseplan.planner.geometry.regions import Box, GroupIO, in_group_uses, tile_regions
from fuseplan.planner.geometry.reload import reloaded_inputs
from fuseplan.planner.ir.graph import Graph, Layer
from fuseplan.planner.plan.data import Group


def run_tiles(graph: Graph, group: Group, io: GroupIO, anchors: Sequence[Box],
              dram: dict[str, np.ndarray], weights: Mapping[str, np.ndarray], tally: Tally,
              layers: LayerCache, *, held: Mapping[str, tuple[Box, np.ndarray]] | None = None,
              first: int = 0, kept: frozenset[str] = frozenset(),
              used_weights: int | None = None, preloaded: int = 0,
              hidden: Sequence[Stretch] = (), fills: Mapping[str, np.ndarray] | None = None
              ) -> dict[str, Fold]:
    """Run `io`'s layers tile by tile over `anchors` (halos recomputed), reading and
    writing `dram` and counting into `tally`; returns the accumulators of its reductions.

    ``held``: tensors already on chip for every tile (not loaded, never freed);
    ``first``: the index of the first tile (a second pass numbers on from the first);
    ``kept``: accumulated outputs kept on chip rather than stored after the last tile;
    ``used_weights``: weight bytes the cores read per tile (default: all the group's);
    ``preloaded``: bytes loaded into ``held`` before the first tile (counted with it);
    ``hidden``: stretches run in the placement's hidden chunks (emulator.hidden);
    ``fills``: on-chip buffers, whole maps, into which every tile of those maps made here is
    written (a pooled map held for later passes), on chip at every step; the tile's box of
    such a map is a view of its buffer, not counted again (GroupIO.in_place).
    """
    run = _TileRun(graph, group, io, dram, weights, tally, layers, held or {}, fills or {},
                   hidden)
    for k, tile_box in enumerate(anchors):
        ti = first + k
        boxes = tile_regions(graph, io, tile_box)
        onchip: dict[str, tuple[Box, np.ndarray]] = dict(run.held)
        streams: dict[str, tuple[Box, np.ndarray]] = {}
        loaded, nxt = run.load_inputs(boxes, onchip, streams)
        tally.next_inputs = nxt
        # a second buffer holds the next tile's loads (held tensors are loaded once)
        prefetch = nxt if group.double_buffered else 0
        if k == 0:
            loaded += preloaded
        loaded += run.run_layers(ti, boxes, onchip, streams, prefetch)
        written = run.store_outputs(k == len(anchors) - 1, kept, tile_box, boxes, onchip)
        tally.tile(ti, loaded, written, used=used_weights)
    return run.folds


class _TileRun:
    """What every tile of a group's run shares: the group's plan of loads, frees, folds,
    stretches and streamed inputs, and where it reads, writes and counts."""

    def __init__(self, graph: Graph, group: Group, io: GroupIO, dram: dict[str, np.ndarray],
                 weights: Mapping[str, np.ndarray], tally: Tally, layers: LayerCache,
                 held: Mapping[str, tuple[Box, np.ndarray]], fills: Mapping[str, np.ndarray],
                 hidden: Sequence[Stretch]) -> None:
        self.graph, self.group, self.io, self.dram = graph, group, io, dram
        self.weights, self.tally, self.layers = weights, tally, layers
        self.held, self.fills = held, fills
        self.dt = dt = tally.chip.dtype_bytes
        self.filled = sum(b.size for b in fills.values()) * dt
        self.kept_for_all = held_for_all(held, fills, dt)
        self.last_use = _last_use(graph, io)
        self.uses = in_group_uses(graph, io)
        self.hosts = in_place_hosts(graph, io)
        # inputs dropped after a step and loaded again at a later one (planner.geometry.reload)
        reloaded = reloaded_inputs(graph, io) if group.placement.inputs_reloaded else {}
        self.drops = {end: [t for t, (e, _) in reloaded.items() if e == end]
                      for end, _ in reloaded.values()}
        self.loads = {at: [t for t, (_, a) in reloaded.items() if a == at]
                      for _, at in reloaded.values()}
        self.folds = {t: Fold.of(graph, graph.layer(graph.producer[t])) for t in io.accumulated}
        self.starts = {s.widen: s for s in hidden}
        # residual Adds whose skip the stretch before took into its accumulator: they add
        # nothing more (emulator.hidden)
        self.folded = {f.add: f.skip for s in hidden if (f := folded_skip(graph, io, s))}
        self.attention = online_attention(graph, io)
        self.streamed = self.attention.streamed if self.attention is not None else {}
        # the steps a streamed input is on chip, a chunk at a time: its first to its last reader
        self.stream_steps = {t: [i for i, name in enumerate(io.layers)
                                 if t in graph.layer(name).fmap_inputs] for t in self.streamed}

    def load_inputs(self, boxes: Mapping[str, Box], onchip: dict[str, tuple[Box, np.ndarray]],
                    streams: dict[str, tuple[Box, np.ndarray]]) -> tuple[int, int]:
        """DRAM -> SRAM: the tile's box of every input, halo included; returns (bytes
        loaded, bytes the next tile's loads take on chip)."""
        graph, dram, dt, tally = self.graph, self.dram, self.dt, self.tally
        loaded = nxt = 0
        for t in self.io.inputs:
            layout = graph.layout(t)
            arr = slice_box(dram[t], array_box(dram[t], layout), boxes[t], layout)
            loaded += arr.size * dt
            tally.core += arr.size * dt * (1 + self.uses.get(t, 0))
            if t in self.streamed:  # read chunk by chunk by the fused attention reading it
                streams[t] = (boxes[t], arr)
                nxt += self.attention.onchip_elems(  # type: ignore[union-attr]
                    t, arr.size, boxes[t][3] - boxes[t][2]) * dt
            else:
                onchip[t] = (boxes[t], arr)
                nxt += arr.size * dt
        return loaded, nxt

    def run_layers(self, ti: int, boxes: Mapping[str, Box],
                   onchip: dict[str, tuple[Box, np.ndarray]],
                   streams: Mapping[str, tuple[Box, np.ndarray]], prefetch: int) -> int:
        """Run the group's layers on tile ti; returns the bytes loaded again on the way."""
        loaded = 0
        inside = -1  # the last layer of the stretch running now
        for i, name in enumerate(self.io.layers):
            if i <= inside:
                continue
            if name in self.starts:  # a stretch: chunk by chunk, up to its narrowing layer
                inside = self._run_stretch(self.starts[name], ti, boxes, onchip, prefetch)
                continue
            loaded += self._reload(i, boxes, onchip)
            self._layer_step(i, name, ti, boxes, onchip, streams, prefetch)
        return loaded

    def _run_stretch(self, s: Stretch, ti: int, boxes: Mapping[str, Box],
                     onchip: dict[str, tuple[Box, np.ndarray]], prefetch: int) -> int:
        """Run a stretch in hidden chunks; returns the index of its narrowing layer."""
        graph, group, io = self.graph, self.group, self.io
        inside = io.layers.index(s.narrow)
        acc = run_stretch(graph, group, io, s, group.placement.hidden_chunks, ti,
                          boxes, onchip, self.weights, self.tally, self.layers, self.held,
                          prefetch + self.filled, self.folds.get(s.out), self.fills)
        keep_outputs(graph.layer(s.narrow), boxes[s.out], [acc], onchip, self.tally, self.uses)
        _free(onchip, self.last_use, inside, io, self.held)
        return inside

    def _reload(self, i: int, boxes: Mapping[str, Box],
                onchip: dict[str, tuple[Box, np.ndarray]]) -> int:
        """DRAM -> SRAM again, just before its late reader; returns the bytes loaded."""
        graph, dram, dt = self.graph, self.dram, self.dt
        loaded = 0
        for t in self.loads.get(i, ()):
            layout = graph.layout(t)
            arr = slice_box(dram[t], array_box(dram[t], layout), boxes[t], layout)
            onchip[t] = (boxes[t], arr)
            loaded += arr.size * dt
            self.tally.core += arr.size * dt
        return loaded

    def _layer_step(self, i: int, name: str, ti: int, boxes: Mapping[str, Box],
                    onchip: dict[str, tuple[Box, np.ndarray]],
                    streams: Mapping[str, tuple[Box, np.ndarray]], prefetch: int) -> None:
        """Compute (or fold) one layer on the tile, keep its outputs, count the step's
        bytes, and free what no later layer reads."""
        graph, fills = self.graph, self.fills
        lay = graph.layer(name)
        out0 = lay.outputs[0]
        if out0 in self.folds:  # fold this tile's part of the anchor into the accumulator
            ys = [self._fold(lay, boxes, onchip)]
        else:
            reading = {t: streams[t] for t in lay.fmap_inputs if t in streams}
            if name in self.folded:  # the accumulator holds the sum: add zeros in the skip's
                # place, so the step counts as the Add it stands for
                skip = self.folded[name]
                acc_box, acc = onchip[next(t for t in lay.fmap_inputs if t != skip)]
                reading[skip] = (acc_box, np.zeros_like(acc))
            ys = compute_on_chip(graph, self.group, ti, lay, boxes[out0],
                                 {**onchip, **reading} if reading else onchip, self.weights,
                                 self.tally, self.layers)
        keep_outputs(lay, boxes[out0], ys, onchip, self.tally, self.uses)
        for t, y in zip(lay.outputs, ys, strict=False):
            if t in fills:
                fill_box(graph, fills[t], t, boxes[t], y)
        self._step_bytes(i, ti, lay, ys, onchip, streams, prefetch)
        _free(onchip, self.last_use, i, self.io, self.held)
        for t in self.drops.get(i, ()):  # off chip until it is loaded again
            del onchip[t]

    def _fold(self, lay: Layer, boxes: Mapping[str, Box],
              onchip: Mapping[str, tuple[Box, np.ndarray]]) -> np.ndarray:
        """Fold the tile's part of a reduction's input into its accumulator."""
        name_x = lay.fmap_inputs[0]
        x_box, x = onchip[name_x]
        if x_box != boxes[name_x]:  # held whole: this tile's part only
            x = slice_box(x, x_box, boxes[name_x], self.graph.layout(name_x))
            x_box = boxes[name_x]
        y = self.folds[lay.outputs[0]].add(x, x_box)
        self.tally.vector_ops += x.size
        return y

    def _step_bytes(self, i: int, ti: int, lay: Layer, ys: Sequence[np.ndarray],
                    onchip: Mapping[str, tuple[Box, np.ndarray]],
                    streams: Mapping[str, tuple[Box, np.ndarray]], prefetch: int) -> None:
        """Record the bytes on chip at step i of tile ti."""
        fills, attention = self.fills, self.attention
        out0 = lay.outputs[0]
        live = sum(a.size for t, (_, a) in onchip.items() if t not in fills) \
            - in_place_elems(self.group.id, ti, lay, None if out0 in fills else self.hosts.get(i),
                             onchip, ys[0])
        if attention is not None:  # the chunks streaming now and the softmax's scratch
            live += sum(attention.onchip_elems(t, a.size, b[3] - b[2])
                        for t, (b, a) in streams.items()
                        if self.stream_steps[t][0] <= i <= self.stream_steps[t][-1])
            live += attention.scratch_elems(i, {out0: ys[0].size})
        self.tally.step(ti, live * self.dt + prefetch + self.filled, i, held=self.kept_for_all)

    def store_outputs(self, last: bool, kept: frozenset[str], tile_box: Box,
                      boxes: Mapping[str, Box],
                      onchip: Mapping[str, tuple[Box, np.ndarray]]) -> int:
        """SRAM -> DRAM: the tile's own box, halo cropped; returns the bytes written."""
        graph, dram, io = self.graph, self.dram, self.io
        written = 0
        for t in io.outputs:
            have, arr = onchip[t]
            if t in self.folds:  # an accumulator is final, and stored, after the last tile
                if not last or t in kept:
                    continue
                arr = self.folds[t].result()
            want = tile_box if t == io.anchor else boxes[t]
            layout = graph.layout(t)
            part = slice_box(arr, have, want, layout)
            if t not in dram:
                dram[t] = np.zeros(graph.shapes[t], dtype=part.dtype)
            slice_box(dram[t], array_box(dram[t], layout), want, layout)[...] = part
            written += part.size * self.dt
        return written


def _free(onchip: dict[str, tuple[Box, np.ndarray]], last_use: Mapping[str, int], i: int,
          io: GroupIO, held: Mapping[str, tuple[Box, np.ndarray]]) -> None:
    """Free what no layer of the group after layer i reads (outputs wait for their store)."""
    for t in [t for t in onchip if last_use.get(t, i) <= i and t not in io.outputs
              and t not in held]:
        del onchip[t]


def _last_use(graph: Graph, io: GroupIO) -> dict[str, int]:
    """Per tensor, the index of the group's last layer reading it."""
    last: dict[str, int] = {}
    for i, name in enumerate(io.layers):
        for t in graph.layer(name).fmap_inputs:
            last[t] = i
    return last
