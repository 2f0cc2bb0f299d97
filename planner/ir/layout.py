"""Feature-map layouts: which axes of a tensor are batch, channels, rows and columns.

Tiles cut a feature map along its batch axis and its two tiled axes, rows and columns;
everything else (the channel axes) a tile holds whole. Today every feature map of rank
>= 4 is NCHW, its last two axes rows and columns (rank 5 appears in channel shuffles:
N, groups, C/groups, H, W), and lower ranks are flat: a batch axis and channels, nothing
to tile along. `layout_of` is that inference from a shape alone. What the ops say of
their axes, propagated along their index maps (planner.front.stretches), gives NHWC to a
channels-last map (rows and columns a per-pixel LayerNormalization or Linear layer keeps),
[B, L, C] tokens to a transformer's token tensors (positions a LayerNormalization over
channels or a Linear layer keeps: tiled along L as rows, one column wide), and [N, C, L] to
a rank-3 map a 1-D conv or pool slides along (tiled along L as rows), wherever no op reads
the would-be rows as channels.
Movement ops carry a token layout on (`carried`, by their index maps, planner.ir.index_maps):
a Transpose that moves the tokens next to the head width (or puts them first, as
nn.MultiheadAttention does), Split, Gather, Squeeze and Unsqueeze along other axes keep
the batch and the tokens as whole axes, and the output tiles along the same tokens; so do
the products of attention and the per-token ops after them. Where the batch axis merges
into another (heads of a sequence-first batch) it is lost, and with it the carrying,
unless the batch is one image. A Reshape of any layout follows the row-major order it
keeps (`regrouped_layout`): a head split carries the tokens, Swin's window partition gives
its 6-D tensors their window rows as rows and its window tensors their windows as rows, a
flatten of an image's rows and columns gives a sequence, and back. Ask
`Graph.layout(t)`, not the shape, for a tensor's layout.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from functools import cache
from math import prod


class LayoutKind(StrEnum):
    """The layouts fuseplan speaks of."""

    NCHW = "NCHW"  # batch, channel axes, rows (H), columns (W)
    NHWC = "NHWC"  # batch, rows (H), columns (W), channels
    NCL = "NCL"  # batch, channels, length (L, tiled as rows): 1-D convs and pools
    TOKENS = "BLC"  # batch, tokens (L, tiled as rows), channels
    HEADS = "BHLd"  # batch, heads, tokens (L, tiled as rows), head width d
    SEQUENCE = "seq"  # tokens and batch where movement ops put them, the rest channels
    FLAT = "flat"  # batch (when rank >= 1) and channels: not tiled along rows or columns


@dataclass(frozen=True)
class Layout:
    """Which axis of a tensor of `rank` plays which part; None where it has no such axis."""

    kind: LayoutKind
    rank: int
    batch_axis: int | None
    channel_axes: tuple[int, ...]
    row_axis: int | None
    col_axis: int | None

    @property
    def spatial(self) -> bool:
        """Tiles cut it along rows, and columns when it has them (the row and column maps of
        a layer apply to it; a token sequence is one column wide)."""
        return self.row_axis is not None

    @property
    def token_like(self) -> bool:
        """A sequence tiled along its positions (a transformer's tokens, a 1-D conv's
        length): movement ops carry it on."""
        return self.kind in (LayoutKind.TOKENS, LayoutKind.HEADS, LayoutKind.SEQUENCE,
                             LayoutKind.NCL)

    @property
    def tiled_axes(self) -> tuple[int, ...]:
        """The axes tiles cut besides the batch: rows, then columns, those it has."""
        return tuple(a for a in (self.row_axis, self.col_axis) if a is not None)

    def dims(self, shape: Sequence[int]) -> tuple[int, int, int, int]:
        """(N, C, H, W) of a tensor of this layout: channel axes multiplied together, and
        1 for an axis it does not have."""
        b, r, c = self.batch_axis, self.row_axis, self.col_axis
        return (1 if b is None else shape[b], prod([shape[a] for a in self.channel_axes]),
                1 if r is None else shape[r], 1 if c is None else shape[c])

    def index(self, batch: slice, rows: slice, cols: slice) -> tuple[slice, ...]:
        """Index of a box: `batch`, `rows` and `cols` on their axes, everything else whole."""
        out = [slice(None)] * self.rank
        for axis, part in ((self.batch_axis, batch), (self.row_axis, rows),
                           (self.col_axis, cols)):
            if axis is not None:
                out[axis] = part
        return tuple(out)


def nchw(rank: int = 4) -> Layout:
    """Channel-first feature map: N, channel axes (one, or groups and C/groups), H, W."""
    if rank < 4:
        raise ValueError(f"NCHW needs rank >= 4, not {rank}")
    return Layout(LayoutKind.NCHW, rank, 0, tuple(range(1, rank - 2)), rank - 2, rank - 1)


def nhwc() -> Layout:
    """Channel-last feature map [N, H, W, C]."""
    return Layout(LayoutKind.NHWC, 4, 0, (3,), 1, 2)


def ncl() -> Layout:
    """Channel-first sequence [N, C, L] that a 1-D conv or pool slides along: the length is
    the tiled rows, there are no columns."""
    return Layout(LayoutKind.NCL, 3, 0, (1,), 2, None)


def tokens() -> Layout:
    """Token sequence [B, L, C]: tokens are the tiled rows, there are no columns."""
    return Layout(LayoutKind.TOKENS, 3, 0, (2,), 1, None)


def heads() -> Layout:
    """Attention heads [B, heads, L, d]: tokens are the tiled rows, heads and d channels."""
    return Layout(LayoutKind.HEADS, 4, 0, (1, 3), 2, None)


def sequence(rank: int, batch_axis: int | None, row_axis: int) -> Layout:
    """A tensor tiled along its tokens on `row_axis`, batch on `batch_axis` (None: one
    image, merged into another axis), every other axis channels: tokens() or heads() where
    it is one of them."""
    for canonical in (tokens(), heads()):
        if (rank, batch_axis, row_axis) == (canonical.rank, canonical.batch_axis,
                                            canonical.row_axis):
            return canonical
    skip = {batch_axis, row_axis}
    return Layout(LayoutKind.SEQUENCE, rank, batch_axis,
                  tuple(a for a in range(rank) if a not in skip), row_axis, None)


def carried(layout: Layout, in_shape: Sequence[int], out_shape: Sequence[int],
            lands: Callable[[int], int | None],
            rows_to: Callable[[int], int | None] | None = None) -> Layout | None:
    """The token layout an op's output carries from an input's, None when the tokens land
    on no axis or a batch of more than one image is lost.
    `lands(axis)`: the output axis an input axis lands on whole (the op's index map,
    planner.ir.index_maps.IndexMap.lands), None where it is merged, split, cut or dropped
    (a Reshape's rows split or merged: `regrouped_layout`); `rows_to(axis)` (default
    `lands`): the output axis the tokens go to (IndexMap.follows: shifted too, by a Slice,
    Pad or Concat along them, or through a window one element wide along them)."""
    if not layout.token_like or layout.row_axis is None:
        return None
    rows = (rows_to or lands)(layout.row_axis)
    if rows is None:
        return None
    kept, batch = landed_batch(layout, in_shape, lands)
    if not kept or batch == rows:
        return None
    return sequence(len(out_shape), batch, rows)


def landed_batch(layout: Layout, in_shape: Sequence[int],
                 lands: Callable[[int], int | None]) -> tuple[bool, int | None]:
    """Where an op takes an input's batch (`lands`, as for `carried`): (True, the output
    axis it lands on whole, or None for one image or no batch), or (False, None) when a
    batch of more than one image lands on no axis (merged into another: no tile of images
    is a box of it)."""
    b = layout.batch_axis
    batch = None if b is None else lands(b)
    return batch is not None or b is None or in_shape[b] == 1, batch


def boxed(shape: Sequence[int], batch_axis: int | None, row_axis: int,
          col_axis: int | None) -> Layout:
    """A tensor of `shape` tiled along rows on `row_axis` and columns on `col_axis`: an
    image's layout (NCHW, NHWC) where they are its axes and its batch is axis 0 (or one
    image: axis 0 of one element); a sequence tiled along `row_axis` elsewhere, its other
    axes kept whole."""
    rank = len(shape)
    if col_axis is not None and (batch_axis == 0 or (batch_axis is None and shape[0] == 1)):
        if rank >= 4 and (row_axis, col_axis) == (rank - 2, rank - 1):
            return nchw(rank)
        if rank == 4 and (row_axis, col_axis) == (1, 2):
            return nhwc()
    return sequence(rank, batch_axis, row_axis)


def regrouped_layout(layout: Layout, in_shape: Sequence[int], out_shape: Sequence[int],
                     lands: Callable[[int], int | None],
                     carries: Callable[[int], int | None],
                     named: Layout | None = None) -> Layout | None:
    """The layout of a Reshape's (or Flatten's) output from its input's, whatever either
    is, by the row-major order a Reshape keeps (its index map,
    planner.ir.index_maps.regrouped): `lands(axis)`, the output axis an input axis lands on
    whole; `carries(axis)`, the one it goes to whole or as the leading axis of a split or a
    merge. None when the rows go nowhere or a batch of more than one image is lost.

    - Rows go where the input's rows go: whole (a head split of tokens), as the leading axis
      of a split (Swin's window rows [1, H/k, k, W/k, k, C]: k map rows each; windows back
      into window rows) or of a merge (an image's rows and columns flattened into positions,
      windows [(H/k)(W/k), k k, C] from window rows).
    - The batch goes where it lands whole; one image needs no batch axis.
    - Columns go where the input's land whole beside the rows. Where the input has none, a
      sequence split into two axes (positions into an image's rows and columns) gives the
      inner one as columns, and so do rows merged with what follows them (window rows back
      into a map). A row map that merges the input's columns into the rows leaves none;
      columns where no image layout has them are kept whole (`boxed`).
    - `named` (what the ops say of the output: a channels-last or token stretch) is the
      layout where its rows agree and it names the columns, or a batch the input did not
      have (MaxViT's grid windows of one image, which attention runs over as a batch).
    - Rows are merged with columns only in a map of rank 4: a higher rank's last two axes
      are rows and columns only as the shape guesses them (`layout_of`), nothing said."""
    r, c = layout.row_axis, layout.col_axis
    if r is None or len(out_shape) < 2:
        return None
    rows = carries(r)
    if rows is None:
        return None
    merged = out_shape[rows] > in_shape[r]
    if merged and c is not None and layout.rank != 4:
        return None
    kept, batch = landed_batch(layout, in_shape, lands)
    if not kept:
        return None
    cols = None
    if c is not None and not merged:
        cols = lands(c)
    elif c is None and rows + 1 < len(out_shape) and (merged or (
            out_shape[rows] < in_shape[r]
            and out_shape[rows] * out_shape[rows + 1] == in_shape[r])):
        # positions split into an image's rows and columns, or rows merged with what
        # follows them (window rows back into a map): the next axis is the columns, each
        # box of them reading its rows whole
        cols = rows + 1
    if named is not None and named.row_axis == rows and (
            (cols is None and named.batch_axis == batch)
            or (batch is None and named.batch_axis is not None)):
        return named
    return boxed(out_shape, batch, rows, cols)


def flat(rank: int) -> Layout:
    """Untiled tensor: axis 0 is the batch, the rest channels (a scalar has neither)."""
    if rank == 0:
        return Layout(LayoutKind.FLAT, 0, None, (), None, None)
    return Layout(LayoutKind.FLAT, rank, 0, tuple(range(1, rank)), None, None)


@cache  # one shared Layout per rank: graphs ask for thousands of tensors
def _inferred(rank: int) -> Layout:
    return nchw(rank) if rank >= 4 else flat(rank)


def layout_of(shape: Sequence[int]) -> Layout:
    """The layout of an ONNX feature map from its shape alone: NCHW from rank 4 up (the
    last two axes rows and columns), flat below."""
    return _inferred(len(shape))
