"""The on-chip accumulator of a reduction over rows and columns (a global pool, a mean over
the map, a mean over the tokens and their channels): each tile's part of its input is folded
in as the tile runs, so the group never holds the whole map
(planner.geometry.regions.accumulated_input)."""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

import numpy as np

from fuseplan.emulator.boxes import take_range
from fuseplan.planner.geometry.regions import Box, folded_axes
from fuseplan.planner.ir.graph import Graph, Layer
from fuseplan.planner.ir.layout import Layout
from fuseplan.planner.ir.ops import Accumulate, op_spec

# folds that add their tiles' parts up (each position counted once); the norms add up
# what each element gives (its square, its magnitude)
_SUMS = frozenset({Accumulate.SUM, Accumulate.MEAN, Accumulate.SUM_SQUARE, Accumulate.L1,
                   Accumulate.L2})
_SQUARED = frozenset({Accumulate.SUM_SQUARE, Accumulate.L2})


@dataclass
class Fold:
    """The on-chip accumulator of a reduction over rows and columns: each tile's part of its
    input is folded in; the mean divides by the whole map's size, and the L2 norm takes
    the square root, once the last tile is in."""

    how: Accumulate
    layout: Layout
    count: int  # input elements per output element over the whole map
    seen: np.ndarray  # (N, H, W): positions already folded in
    axes: tuple[int, ...]  # folded: the tiled axes, and channel axes with them
    channels: int = 1  # of the input (and of the result)
    acc: np.ndarray | None = None

    @classmethod
    def of(cls, graph: Graph, lay: Layer) -> Fold:
        """The accumulator of a reduction layer (planner.geometry.regions.accumulated_input)."""
        x = lay.fmap_inputs[0]
        layout = graph.layout(x)
        shape = graph.shapes[x]
        n, c, h, w = layout.dims(shape)
        axes = folded_axes(graph, lay) or layout.tiled_axes
        count = prod(shape[a] for a in axes)
        return cls(op_spec(lay.op).accumulate, layout, count,
                   np.zeros((n, h, w), dtype=bool), axes, c)

    def add(self, part: np.ndarray, box: Box, channels: tuple[int, int] | None = None,
            last: bool = True) -> np.ndarray:
        """Fold a tile's part (box `box` of the input) in; returns that tile's partial result
        (what its cores made). Boxes of a parameter table may overlap (its tail mode
        "overlap"): a sum counts each position once, so positions already in are masked.
        ``channels``: the part holds only these channels of the input (a hidden chunk,
        emulator.hidden), folded into their slice of the accumulator; the positions count
        as folded in once the tile's ``last`` chunk is."""
        folded: np.ndarray
        axes = self.axes
        seen = self.seen[box[0]:box[1], box[2]:box[3], box[4]:box[5]]
        if self.how in _SQUARED:
            part = np.square(part)
        elif self.how is Accumulate.L1:
            part = np.abs(part)
        if self.how in _SUMS and seen.any():
            shape = [1] * part.ndim
            order = (self.layout.batch_axis, self.layout.row_axis, self.layout.col_axis)
            for k, a in enumerate(order):
                if a is not None:
                    shape[a] = seen.shape[k]
            part = part * np.logical_not(seen).reshape(shape)
        if last:
            seen[...] = True
        if self.how in _SUMS:
            folded = np.asarray(np.sum(part, axis=axes, keepdims=True, dtype=np.float32))
        elif self.how is Accumulate.MAX:
            folded = np.asarray(np.max(part, axis=axes, keepdims=True))
        else:
            folded = np.asarray(np.min(part, axis=axes, keepdims=True))
        if self.acc is None:
            if channels is None:
                self.acc = folded.copy()
                return folded
            shape = list(folded.shape)
            shape[self.layout.channel_axes[0]] = self.channels
            # channels no chunk has folded yet hold the fold's identity
            limits = np.iinfo(folded.dtype) if np.issubdtype(folded.dtype, np.integer) \
                else np.finfo(folded.dtype)
            start = {Accumulate.MAX: limits.min, Accumulate.MIN: limits.max}.get(self.how, 0)
            self.acc = np.full(shape, start, dtype=folded.dtype)
        into = self.acc if channels is None else take_range(self.acc, self.layout.channel_axes[0],
                                                       *channels)
        if self.how is Accumulate.MAX:
            np.maximum(into, folded, out=into)
        elif self.how is Accumulate.MIN:
            np.minimum(into, folded, out=into)
        else:
            into += folded
        return folded

    def result(self) -> np.ndarray:
        """The final value, after the last tile."""
        if self.acc is None:
            raise ValueError("an accumulator read before any tile was folded in")
        if self.how is Accumulate.MEAN:
            return np.asarray(self.acc / np.float32(self.count), dtype=np.float32)
        if self.how is Accumulate.L2:
            return np.asarray(np.sqrt(self.acc), dtype=np.float32)
        return self.acc
