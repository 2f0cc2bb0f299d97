"""Boxes of arrays: cutting a tensor's box out of the array that holds a larger box of it,
and writing a box back into a whole buffer. Every mode runner moves data between DRAM and
the chip this way, so the byte counts come from the very views cut here."""

from __future__ import annotations

import numpy as np

from fuseplan.planner.geometry.regions import Box
from fuseplan.planner.ir.graph import Graph
from fuseplan.planner.ir.layout import Layout


def array_box(arr: np.ndarray, layout: Layout) -> Box:
    """The box of a whole array of this layout."""
    n, _, h, w = layout.dims(arr.shape)
    return 0, n, 0, h, 0, w


def slice_box(arr: np.ndarray, have: Box, want: Box, layout: Layout) -> np.ndarray:
    """Cut box `want` out of an array holding box `have` of a tensor of this layout (a
    view: writing into it writes into `arr`)."""
    return arr[layout.index(slice(want[0] - have[0], want[1] - have[0]),
                            slice(want[2] - have[2], want[3] - have[2]),
                            slice(want[4] - have[4], want[5] - have[4]))]


def take_range(arr: np.ndarray, axis: int, lo: int, hi: int) -> np.ndarray:
    """The range [lo, hi) of `arr` along `axis` (a view): a chunk of channels."""
    index = [slice(None)] * arr.ndim
    index[axis] = slice(lo, hi)
    return arr[tuple(index)]


def fill_box(graph: Graph, buffer: np.ndarray, tensor: str, box: Box, part: np.ndarray,
             channels: tuple[int, int, int] | None = None) -> None:
    """Write `box` of a tensor into its whole on-chip buffer (a held map: on chip already,
    no byte moves); ``channels`` (axis, lo, hi): only that range of channels of the box (a
    hidden chunk's)."""
    layout = graph.layout(tensor)
    view = slice_box(buffer, array_box(buffer, layout), box, layout)
    if channels is not None:
        view = take_range(view, *channels)
    view[...] = part
