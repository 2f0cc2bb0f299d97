"""Reshapes that merge a map's rows and columns into one axis, or split one tiled axis into
rows and columns, read as row maps.

Exporters flatten an image into a sequence and back with a Reshape: a patch flatten or a
detector head's `[N, C, H, W] -> [N, C, H W]`, a channels-last map into tokens
`[N, H, W, C] -> [N, H W, C]`, and a token map turned back into an image for a depthwise
conv, `[N, C, L] -> [N, C, H, W]`. Read by their shapes the two sides share no tiled axis,
so the Reshape needed its input whole. Read by what moves, the row-major order is kept
with the batch and channels where they were: position l of the merged axis is row l // W,
column l % W. So a range of the merged axis lies in a range of rows (UPSAMPLE by W, every
column), and a range of rows is a range of the merged axis (WINDOW W, stride W): the
merged axis is tiled as rows (a sequence, planner.ir.layout.sequence), and the split one
as an image's rows and columns (`regroup_layout`; the maps are
planner.front.windows.regroup_rows).
"""

from __future__ import annotations

from collections.abc import Sequence
from math import prod

from fuseplan.planner.ir.layout import Layout, LayoutKind, nchw, nhwc, sequence


def _batch_out(layout: Layout, in_shape: Sequence[int], out_shape: Sequence[int],
               row: int) -> tuple[bool, int | None]:
    """Whether the batch lands whole on the output's axis 0 (before its tiled axis), or
    is one image; and the output's batch axis."""
    b = layout.batch_axis
    if b is None:
        return True, None
    if b == 0 and row > 0 and out_shape[0] == in_shape[0]:
        return True, 0
    return in_shape[b] == 1, None


def merged_layout(layout: Layout, in_shape: Sequence[int],
                  out_shape: Sequence[int]) -> Layout | None:
    """The layout of a Reshape's output that merges the input's rows and columns (adjacent,
    columns inner) into one axis, every other axis kept in order: a sequence tiled along
    the merged axis. None for any other Reshape."""
    r, c = layout.row_axis, layout.col_axis
    # an image's rows and columns: rank 4 (a higher rank's last two axes are a guess from
    # the shape, planner.ir.layout.layout_of, not rows and columns anything said)
    if r is None or c != r + 1 or layout.rank != 4 \
            or layout.kind not in (LayoutKind.NCHW, LayoutKind.NHWC):
        return None
    merged = in_shape[r] * in_shape[c]
    for a, extent in enumerate(out_shape):
        if extent == merged and prod(out_shape[:a]) == prod(in_shape[:r]) \
                and prod(out_shape[a + 1:]) == prod(in_shape[c + 1:]):
            whole, batch = _batch_out(layout, in_shape, out_shape, a)
            if not whole or (batch is None and a == 0 and len(out_shape) == 1):
                return None
            return sequence(len(out_shape), batch, a)
    return None


def split_layout(layout: Layout, in_shape: Sequence[int],
                 out_shape: Sequence[int]) -> Layout | None:
    """The layout of a Reshape's output that splits the input's one tiled axis (a
    sequence's, no columns) into an image's rows and columns, every other axis kept in
    order: NCHW when they are the last two axes, NHWC when they follow the batch of a
    rank-4 map. None for any other Reshape."""
    r = layout.row_axis
    if r is None or layout.col_axis is not None or len(out_shape) != 4:
        return None
    for a in (1, 2):
        h, w = out_shape[a], out_shape[a + 1]
        if h * w != in_shape[r] or w == 1 or prod(out_shape[:a]) != prod(in_shape[:r]) \
                or prod(out_shape[a + 2:]) != prod(in_shape[r + 1:]):
            continue
        whole, batch = _batch_out(layout, in_shape, out_shape, a)
        if whole and (batch == 0 or out_shape[0] == 1):
            return nchw(4) if a == 2 else nhwc()
    return None


def regroup_layout(layout: Layout, in_shape: Sequence[int],
                   out_shape: Sequence[int]) -> Layout | None:
    """The layout of a Reshape's output that merges rows and columns or splits a sequence
    into them; None for any other Reshape."""
    if len(in_shape) != layout.rank:
        return None
    return merged_layout(layout, in_shape, out_shape) \
        or split_layout(layout, in_shape, out_shape)
