"""Swin's window partition and its reverse, read as row maps over whole windows.

Swin cuts a channels-last map [1, H, W, C] into k x k windows with three movement ops,
Reshape [1, H/k, k, W/k, k, C], Transpose [1, H/k, W/k, k, k, C] and Reshape
[(H/k)(W/k), k*k, C], runs attention per window and puts the windows back the same way in
reverse. Read by their shapes, the window tensors look like a batch of 64 token sequences
and the 6-D ones like images, so every Reshape of the chain needed its input whole and a
Swin block broke into groups at each partition.

Read by what moves, the chain keeps the map's rows in order: window row r of the 6-D
tensors (their axis 1) holds map rows [k r, k r + k), and window w of the window tensors
(their axis 0, window rows outermost) lies in window row w // (W/k). So the 6-D tensors
are tiled along their window rows and the window tensors along their windows, both as
rows, with no columns (a window row spans the map's width), and each Reshape of the
chain gets a row map (`regroup_rows`): a window row needs k map rows (WINDOW k, stride
k), a window needs its window row (UPSAMPLE by W/k), and back. A tile of whole window
rows then runs partition, attention and reverse on its own windows; the ops between
carry the windows axis as rows (planner.ir.layout.carried). Only a batch of one image:
at more, the windows of all images share one axis, images outermost.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import prod

from fuseplan.planner.ir.graph import AxisMap, MapKind
from fuseplan.planner.ir.layout import Layout, LayoutKind, nhwc, sequence


def regroup_rows(in_shape: Sequence[int], in_row: int, out_shape: Sequence[int],
                 out_row: int) -> AxisMap | None:
    """Row map of a Reshape whose input is tiled along axis `in_row` and output along
    `out_row`, or None when a row range of the output is no range of input rows.

    A Reshape keeps the elements' row-major order. When the axes before both row axes hold
    the same number of elements (one image), output row i starts at element i * S_out and
    input row j at j * S_in (S: elements per row): with S_out = k S_in output row i is input
    rows [k i, k i + k) (WINDOW k, stride k); with S_in = k S_out it lies in input row i // k
    (UPSAMPLE by k); with equal S, row for row."""
    if prod(in_shape[:in_row]) != prod(out_shape[:out_row]):
        return None
    s_in, s_out = prod(in_shape[in_row + 1:]), prod(out_shape[out_row + 1:])
    if s_in == s_out:
        return AxisMap(MapKind.IDENTITY)
    if s_out % s_in == 0:
        k = s_out // s_in
        return AxisMap(MapKind.WINDOW, kernel=k, stride=k)
    if s_in % s_out == 0:
        return AxisMap(MapKind.UPSAMPLE, stride=s_in // s_out)
    return None


def _window_rows() -> Layout:
    """[1, H/k, k, W/k, k, C] or [1, H/k, W/k, k, k, C]: window rows on axis 1."""
    return sequence(6, 0, 1)


def _is_window_rows(layout: Layout) -> bool:
    return layout.rank == 6 and layout.token_like and layout.row_axis == 1 \
        and layout.batch_axis == 0


def window_layout(in_layout: Layout, in_shape: Sequence[int],
                  out_shape: Sequence[int]) -> Layout | None:
    """The layout of a Reshape's output that is one step of a window partition or of its
    reverse (tiled along window rows or windows), None for any other Reshape.

    Steps: a channels-last map [1, H, W, C] into [1, H/k, k, W/k, k, C] (window rows); window
    rows [1, a, b, k, k, C] into windows [a b, k k, C] or [a b, k, k, C]; windows back into
    window rows [1, a, b, k, k, C]; window rows [1, a, k, b, k, C] back into the map
    [1, a k, b k, C] (channels last)."""
    ins, out = tuple(in_shape), tuple(out_shape)
    if in_layout.kind is LayoutKind.NHWC and len(out) == 6 and ins[0] == 1:
        _, h, w, c = ins
        k = out[2]
        if k > 1 and out == (1, h // k, k, w // k, k, c) and h % k == 0 and w % k == 0:
            return _window_rows()
        return None
    if _is_window_rows(in_layout) and ins[0] == 1:
        _, d1, d2, d3, d4, c = ins
        if len(out) in (3, 4) and out[0] == d1 * d2 and prod(out[1:]) == d3 * d4 * c \
                and out[-1] == c:  # [1, a, b, k, k, C] -> [a b, k k, C]
            return sequence(len(out), None, 0)
        if out == (1, d1 * d2, d3 * d4, c):  # [1, a, k, b, k, C] -> [1, a k, b k, C]
            return nhwc()
        return None
    if in_layout.token_like and in_layout.batch_axis is None and in_layout.row_axis == 0 \
            and len(out) == 6 and out[0] == 1 and out[1] * out[2] == ins[0] \
            and prod(out[3:]) == prod(ins[1:]):
        return _window_rows()
    return None
