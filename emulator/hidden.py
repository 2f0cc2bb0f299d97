"""A stretch of a group run in hidden chunks, as the emulator runs it
(planner.geometry.hidden; Placement.hidden_chunks > 1).

For every chunk of hidden channels the widening layer computes its slice of the hidden maps
from its whole input (its weights cut along their output channels), the per-element layers
run on the slice (their per-channel constants cut the same way), and the narrowing layer
computes partial sums from the slice (its weights cut along the channels it sums over, its
bias added by the first chunk) and adds them into the accumulator. Bytes on chip are
counted from the arrays held at each step; the weights on chip from the slices
(emulator.chunks.WeightStream).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, MutableMapping
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from fuseplan.emulator.chunks import Overlay, _take
from fuseplan.planner.geometry.heads import take_units
from fuseplan.planner.geometry.hidden import Stretch, constant_axes, hidden_ranges, vector_axes
from fuseplan.planner.geometry.in_place import in_place_hosts
from fuseplan.planner.geometry.regions import Box, GroupIO, box_elems
from fuseplan.planner.ir.graph import Graph
from fuseplan.planner.plan.data import Group

if TYPE_CHECKING:
    from fuseplan.emulator.run import Fold, LayerCache, Tally


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
    from fuseplan.emulator.run import (
        EmulationError,
        KernelFailure,
        fill_box,
        held_for_all,
        in_place_elems,
        run_layer,
    )

    dt = tally.chip.dtype_bytes
    fills = fills or {}
    kept_for_all = held_for_all(held, fills, dt)  # in SRAM, not in the cores' NRAM
    a = io.layers.index(s.widen)
    widen_inputs = graph.layer(s.widen).fmap_inputs
    later = {t for n in io.layers[io.layers.index(s.narrow) + 1:]
             for t in graph.layer(n).fmap_inputs}
    ends = [t for t in widen_inputs if t not in later and t not in io.outputs
            and t not in held]
    last_read = {t: max(k for k, n in enumerate(s.layers) if t in graph.layer(n).fmap_inputs)
                 for t in s.hidden}
    # reads of each tensor by the stretch's layers: a chunk of it made here is written to
    # the cores' memory once and read that many times
    reads = Counter(u for n in s.layers for u in graph.layer(n).fmap_inputs)
    ranges = hidden_ranges(s, chunks)
    hosts = in_place_hosts(graph, io)
    acc: np.ndarray | None = None
    for j, (lo, hi) in enumerate(ranges):
        part: dict[str, tuple[Box, np.ndarray]] = {}
        for k, name in enumerate(s.layers):
            lay = graph.layer(name)
            out = lay.outputs[0]
            more: list[np.ndarray] = []  # a Split's other parts
            view = {**onchip, **part}
            consts = Overlay(chunk_constants(graph, s, name, weights, j, lo, hi), weights)
            for t, axis in vector_axes(graph, s, name).items():  # the chunk's slice of each
                box, arr = view[t]
                view[t] = (box, _take(arr, axis, lo, hi))
            grouped = name in s.mids and int(lay.attrs.get("group", 1)) == s.channels
            try:
                if s.pools and name == s.narrow:  # fold the chunk's channels of the tile
                    if fold is None:  # the pool is not the group's accumulator
                        raise EmulationError(group.id, tile, name, "a stretch ends in this "
                                             "pool, but the group does not fold it tile by "
                                             "tile")
                    x = lay.fmap_inputs[0]
                    part_y = fold.add(part[x][1], boxes[x], (lo, hi), j == len(ranges) - 1)
                    if acc is None:  # the tile's partial result, all channels
                        shape = list(part_y.shape)
                        shape[s.axis] = s.channels
                        acc = np.zeros(shape, dtype=part_y.dtype)
                    _take(acc, s.axis, lo, hi)[...] = part_y
                    y = acc
                elif grouped:  # a depthwise conv on the chunk: one group per channel of it
                    chunk_lay = replace(lay, attrs={**lay.attrs, "group": hi - lo})
                    (y,) = run_layer(graph, chunk_lay, boxes[out], view, consts)[:1]
                elif s.cuts and name in s.mids:  # a chunk of heads: its own output shape
                    # (a reshape restates it); a Split's parts all stay in the chunk
                    heads = s.cut_of(out).chunk_shape(graph.shapes[out], hi - lo)
                    y, *more = run_layer(graph, replace(lay, out_shape=heads), boxes[out],
                                         view, consts)
                else:
                    (y,) = run_layer(graph, lay, boxes[out], view, consts, layers=layers)[:1]
            except KernelFailure as exc:
                raise EmulationError(group.id, tile, exc.layer, f"hidden chunk {j} (channels "
                                     f"[{lo}, {hi})): {exc.detail}") from exc
            if name == s.widen:
                tally.ops(lay, y.size)
                if j > 0:  # the tile's input is read again by every chunk (its box: an
                    # input held whole for every tile, planner.geometry.passes, is larger)
                    tally.core += sum(box_elems(graph, t, boxes[t]) for t in widen_inputs) * dt
            elif name == s.narrow and s.pools:
                tally.vector_ops += part[lay.fmap_inputs[0]][1].size
            elif name == s.narrow:
                tally.macs += y.size * lay.macs_per_output // s.channels * (hi - lo)
                if acc is None:
                    acc = y
                else:  # read the partial sums so far, add, write back
                    acc = acc + y
                    tally.core += 2 * y.size * dt
            else:
                tally.ops(lay, y.size)
            if name != s.narrow:
                for t, y_t in zip(lay.outputs, [y, *more], strict=True):
                    part[t] = (boxes[t], y_t)
                    if t in fills:  # this chunk's channels of the held map
                        if s.cuts:
                            raise EmulationError(group.id, tile, name, "a held map cut in "
                                                 "heads: no chunk of it is a channel range")
                        fill_box(graph, fills[t], t, boxes[t], y_t, (s.axis, lo, hi))
                    tally.core += y_t.size * dt * (1 + reads[t])
            live = sum(arr.size for t, (_, arr) in onchip.items() if t not in fills) \
                + sum(arr.size for t, (_, arr) in part.items() if t not in fills) \
                + (acc.size if acc is not None else 0)
            if name != s.narrow and out not in fills:  # written over a chunk it read last
                live -= in_place_elems(group.id, tile, lay, hosts.get(a + k),
                                       {**onchip, **part}, y)
            stream = tally.stream
            now = stream.inner.get((name, j), 0) if stream is not None \
                and not group.weights_resident else None
            tally.step(tile, live * dt + prefetch, a + k, weights=now, held=kept_for_all)
            if name == s.widen and j == len(ranges) - 1:  # its input is read for the last time
                for t in ends:
                    del onchip[t]
            for t in [t for t in part if last_read[t] <= k]:
                del part[t]
    assert acc is not None
    return acc
