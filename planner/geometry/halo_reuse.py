"""Halo reuse: tiles run in order, keep on chip what later tiles read, and make each
element of every tensor once.

A reusing group's tiles run row-major over a grid of tile rows and tile columns (full-width
row tiles are the one-column case), one batch part after another: a tile of n images sweeps
the rows of those images, and the next n images start afresh (nothing carries from one
image to another, so each part's sweep is the same grid, n images deep). For every tensor of
the group a tile *makes* (loads, for group inputs; computes, for layer outputs) only
the part of its box no earlier tile made: ``[max(a_i, b_(i-1)), b_i)`` along each axis
for boxes ``[a_i, b_i)``. A layer computes the part of its output the tile makes and
reads from each input only the range that part needs: the border a 3x3 conv reads is
k - s rows and columns, not the whole overlap of the tiles' boxes.

Retention (the emulator applies the same policy to the data it really holds): once a
tile is done with a tensor, it keeps only what later tiles may read, i.e. rows from the
lowest row the tile row reads, in columns from the lowest column the next tile of the
row reads; and rows from the lowest row the next tile row reads, in columns from the
lowest column it reads. Everything is separable by axis, so each quantity is a product
of one-axis quantities; interior tiles are translates of each other, so sums and peaks
need only the first and last few tiles of each axis.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from fractions import Fraction
from functools import cached_property
from math import ceil

import numpy as np

from fuseplan.hardware.chip import Chip
from fuseplan.planner.geometry.attention import (
    kept_prefix,
    online_attention,
    prefix_reader,
    reader_chunk,
)
from fuseplan.planner.geometry.bands import band_columns
from fuseplan.planner.geometry.regions import (
    GroupChains,
    GroupIO,
    Tile,
    anchor_extent,
    axis_ranges,
    group_row_map,
    needed_range,
    tile_regions,
)
from fuseplan.planner.ir.graph import Graph, Layer, MapKind

Span = tuple[int, int]
NEVER = 1 << 62  # a read bound no tile reaches: nothing is kept
EDGE = 4  # tiles at each end that may differ from the interior when one tile is clipped
# a growing schedule's made parts of one tensor (AxisSchedule._made_index): arrays, then lists
MadeIndex = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                  list[int], list[int], list[int], list[int]]
GROWING_TILES = 64  # most tiles a search offers a group whose kept keys grow (reuse_heights)


def length(span: Span) -> int:
    """Elements in a half-open range."""
    return max(0, span[1] - span[0])


def from_(span: Span, x: int) -> int:
    """Elements of a range at or after x."""
    return max(0, span[1] - max(span[0], x))


@dataclass
class AxisSchedule:
    """One axis (1 rows, 2 columns) of a reusing group's tile grid: for each tile index,
    every tensor's box, the part the tile makes, and what each layer input reads."""

    graph: Graph
    io: GroupIO
    chains: GroupChains
    axis: int
    size: int
    part: tuple[int, int] | None = None  # only tile indices [first, end): one band's columns
    # False: the representative tiles of a group whose tiles recompute (planner.cost.model
    # picks them here), which keeps nothing, so nothing it keeps grows
    reusing: bool = True
    # True: the keys kept (attention.kept_prefix) are spilled, not held: each tile writes
    # the rows it makes to DRAM and reads the rows earlier tiles made back, a chunk of keys
    # at a time (planner.cost.spilled_keys); nothing of them stays on chip between tiles
    spilled: bool = False
    _boxes: dict[int, dict[str, Span]] = field(default_factory=dict)
    _reads: dict[int, dict[tuple[str, int], Span]] = field(default_factory=dict)
    _made_from: dict[tuple[int, str, int], int] = field(default_factory=dict)
    _made: dict[tuple[int, str], Span] = field(default_factory=dict)
    # made_total by tensor, read_total by (layer, input): the grids of a search share axes
    _made_totals: dict[str, int] = field(default_factory=dict)
    _read_totals: dict[tuple[str, int], int] = field(default_factory=dict)
    _lows: dict[int, dict[str, int]] = field(default_factory=dict)
    _factors: dict[tuple[int, str, int], tuple[tuple[int, int], ...]] = field(
        default_factory=dict)
    _earlier: dict[tuple[int, str], np.ndarray] = field(default_factory=dict)
    # per tensor, a growing schedule's made parts as prefix sums (_made_before)
    _index: dict[str, MadeIndex] = field(default_factory=dict)

    @cached_property
    def ranges(self) -> list[Span]:
        every = axis_ranges(anchor_extent(self.graph, self.io)[self.axis], self.size)
        return every if self.part is None else every[self.part[0]:self.part[1]]

    @property
    def count(self) -> int:
        return len(self.ranges)

    @cached_property
    def growing(self) -> bool:
        """Whether what tiles keep along this axis grows with every tile: rows of a group
        that keeps the prefix of keys it makes (attention.kept_prefix); each tile is walked."""
        return self.reusing and self.axis == 1 and bool(kept_prefix(self.graph, self.io))

    @cached_property
    def exact(self) -> bool:
        """Interior tiles are translates (every tensor has a closed form at this size)."""
        if self.growing:
            return False
        extent = anchor_extent(self.graph, self.io)[self.axis]
        for chain in self.chains.chains.values():
            c = chain[self.axis]
            low = c.min_tile(extent) if c is not None else None
            if low is None or self.size < low:
                return False
        return True

    @cached_property
    def edge(self) -> int:
        """Tiles at each end that may differ from the interior: those whose ranges clipping
        at the map's borders reaches (one, at sizes where every closed form is exact), plus
        the neighbours the made parts and kept borders look at."""
        if self.growing:
            return self.count
        clipped = 1
        for chain in self.chains.chains.values():
            c = chain[self.axis]
            if c is None:  # not affine: no interior to stand for the rest
                return self.count
            if c.s > 0:
                reach = max(c.p, c.delta(anchor_extent(self.graph, self.io)[self.axis]), 0)
                clipped = max(clipped, -(-reach // (c.s * self.size)))
        return clipped + EDGE - 1

    def indices(self) -> list[int]:
        """Tile indices whose values differ: the ends, and one interior tile standing for
        all (interior tiles are translates of each other)."""
        count, edge = self.count, self.edge
        if count <= 2 * edge + 1:
            return list(range(count))
        return list(range(edge + 1)) + list(range(count - edge, count))

    def picked_ranges(self) -> list[Span]:
        """The anchor ranges of indices(): the tiles whose footprints can differ."""
        ranges = self.ranges
        return [ranges[i] for i in self.indices()]

    def made_total(self, t: str) -> int:
        """Indices of t made over every tile of this axis (each once)."""
        if t not in self._made_totals:
            self._made_totals[t] = self.total(lambda i: length(self.made(i, t)))
        return self._made_totals[t]

    def read_total(self, name: str, j: int) -> int:
        """Indices of fmap input j that layer `name` reads over every tile of this axis."""
        if (name, j) not in self._read_totals:
            self._read_totals[(name, j)] = self.total(
                lambda i: length(self.reads(i).get((name, j), (0, 0))))
        return self._read_totals[(name, j)]

    def total(self, value: Callable[[int], int]) -> int:
        """Sum of value(i) over every tile index, interior tiles counted from one of them."""
        picked = self.indices()
        if len(picked) == self.count:
            return sum(value(i) for i in picked)
        return sum(value(i) for i in picked) + (self.count - len(picked)) * value(self.edge)

    def boxes(self, i: int) -> dict[str, Span]:
        """Every tensor's range along this axis in tile i."""
        if i not in self._boxes:
            lo, hi = self.ranges[i]
            self._boxes[i] = self._closed_boxes(lo, hi) if self.exact else self._walked_boxes(
                lo, hi)
        return self._boxes[i]

    def _walked_boxes(self, lo: int, hi: int) -> dict[str, Span]:
        n, h, w = anchor_extent(self.graph, self.io)
        anchor = (0, n, lo, hi, 0, w) if self.axis == 1 else (0, n, 0, h, lo, hi)
        k = 2 * self.axis
        return {t: (b[k], b[k + 1])
                for t, b in tile_regions(self.graph, self.io, anchor, reuse=True).items()}

    def _closed_boxes(self, lo: int, hi: int) -> dict[str, Span]:
        """tile_regions along this axis from the chains' closed forms (no walk)."""
        out: dict[str, Span] = {}
        for t, chain in self.chains.chains.items():
            c = chain[self.axis]
            assert c is not None  # exact
            out[t] = (0, c.u) if c.s == 0 else (max(0, c.s * lo - c.p),
                                                min(c.u, c.s * (hi - 1) + c.e))
        for name in self.io.layers:  # every output of a layer is computed on one range
            outs = [t for t in self.graph.layer(name).outputs if t]
            known = next((out[t] for t in outs if t in out), None)
            if known is not None:
                for t in outs:
                    out.setdefault(t, known)
        return out

    def longest_held(self, t: str) -> int:
        """The most indices of t any tile of this axis holds while it runs (every tile
        walked): what it makes, and what earlier tiles made that it reads (spilled keys:
        one chunk of them). Its box is longer where it reaches back to kept parts: a
        tile's box of the input of the layer making kept keys is the prefix, of which the
        tile makes only its rows."""
        return max(length(self.made(i, t)) + self.held_back(i, t) for i in range(self.count))

    def longest_made(self, t: str) -> int:
        """The most indices of t any tile of this axis makes (every tile walked)."""
        return max(length(self.made(i, t)) for i in range(self.count))

    @cached_property
    def spilled_tensors(self) -> frozenset[str]:
        """The kept keys this axis spills (none unless `spilled`; rows only)."""
        return kept_prefix(self.graph, self.io) if self.spilled and self.axis == 1 \
            else frozenset()

    def readback(self, i: int, t: str) -> int:
        """Indices of t tile i reads back from DRAM: the rows of spilled keys earlier
        tiles made that it reads (0 for any other tensor)."""
        return self._earlier_read(i, t) if t in self.spilled_tensors else 0

    def _earlier_read(self, i: int, t: str) -> int:
        """Indices of t tile i reads that earlier tiles made."""
        return self.made_from(i, t, self.read_low(i, t))

    def readback_total(self, t: str) -> int:
        """readback over every tile of this axis."""
        return sum(self.readback(i, t) for i in range(self.count))

    def held_back(self, i: int, t: str) -> int:
        """Indices of t that tile i holds of what earlier tiles made while it reads them:
        all it reads of kept keys; one chunk of keys of spilled ones (the online softmax
        walks them a chunk at a time)."""
        earlier = self._earlier_read(i, t)
        return min(earlier, self._chunks[t]) if t in self.spilled_tensors else earlier

    @cached_property
    def _chunks(self) -> dict[str, int]:
        """Keys per chunk the attention reading each spilled tensor walks it in."""
        out = {}
        for t in self.spilled_tensors:
            found = prefix_reader(self.graph, self.io, t)
            assert found is not None  # spilled keys are read once, as a prefix
            out[t] = reader_chunk(found[0], t, self.graph.shapes[t])
        return out

    def made(self, i: int, t: str) -> Span:
        """Part of t's range tile i makes: its box past what the tile before made (boxes
        advance monotonically, so what came before ends where the previous box ends)."""
        key = (i, t)
        if key not in self._made:
            a, b = self.boxes(i)[t]
            if i == 0:
                self._made[key] = a, b
            else:
                before = self.boxes(i - 1)[t][1]
                self._made[key] = max(a, before), max(b, before)
        return self._made[key]

    def reads(self, i: int) -> dict[tuple[str, int], Span]:
        """Range of fmap input j of each layer that the layer's made part in tile i needs."""
        if i not in self._reads:
            out: dict[tuple[str, int], Span] = {}
            boxes = self.boxes(i)
            for name in self.io.layers:
                lay = self.graph.layer(name)
                first = lay.outputs[0]
                if first not in boxes:
                    continue
                lo, hi = self.made(i, first)
                if hi <= lo:
                    continue
                for j, t in enumerate(lay.fmap_inputs):
                    m = group_row_map(self.io, lay, j, reuse=True) if self.axis == 1 \
                        else lay.col_maps[j]
                    out[(name, j)] = needed_range(m, lo, hi,
                                                  self.graph.dims(t)[self.axis + 1],
                                                  self.graph.layout(first).spatial,
                                                  self.graph.layout(t).spatial)
            self._reads[i] = out
        return self._reads[i]

    def read_low(self, i: int, t: str) -> int:
        """Lowest index of t that tile i reads (NEVER when it reads none, or past the end)."""
        if i >= self.count:
            return NEVER
        if i not in self._lows:
            lows: dict[str, int] = {}
            for (name, j), span in self.reads(i).items():
                if span[1] > span[0]:
                    t_in = self.graph.layer(name).fmap_inputs[j]
                    lows[t_in] = min(lows.get(t_in, NEVER), span[0])
            self._lows[i] = lows
        return self._lows[i].get(t, NEVER)

    def keep_factors(self, i: int, t: str, floor: int = 0) -> tuple[tuple[int, int], ...]:
        """This axis's factors of what tensor t keeps after tile index i (ReuseGrid.kept_after),
        for the three quadrant corners: rows (i is a tile row) give (made by earlier tile
        rows, made by this one) at or after the corner; columns (i is a tile column) give
        (made by all tile columns, made by those up to i) at or after it. A row floor
        counts only rows at or after it (what a streamed layer step still holds)."""
        key = (i, t, floor)
        if key not in self._factors:
            out: tuple[tuple[int, int], ...]
            if t in self.spilled_tensors:  # nothing of them stays between tiles
                out = ((0, 0),) * 3
            elif self.axis == 1:  # corners: this row's reads, the next row's
                a, b = self.read_low(i, t), self.read_low(i + 1, t)
                corners = (max(a, floor), max(b, floor), max(a, b, floor))
                made = self.made(i, t)
                out = tuple((self.made_from(i, t, x), from_(made, x)) for x in corners)
            else:  # corners: the next column's reads, the first column's (for the next row)
                a, b = self.read_low(i + 1, t), self.read_low(0, t)
                corners = (a, b, max(a, b))
                out = tuple((self.made_from(self.count, t, y), self.made_from(i + 1, t, y))
                            for y in corners)
            self._factors[key] = out
        return self._factors[key]

    def row_keep_factors(self, rows: np.ndarray, t: str, floors: np.ndarray) -> np.ndarray:
        """keep_factors(rows[y], t, floors[y]) for every entry y, as an array (y, 3 corners,
        2 factors): a streamed step asks for one per output row of each tile row."""
        if t in self.spilled_tensors:  # nothing of them stays between tiles
            return np.zeros((len(rows), 3, 2), np.int64)
        picked = sorted(set(rows.tolist()))
        at = np.searchsorted(np.array(picked, np.int64), rows)
        reads = np.array([[self.read_low(i, t), self.read_low(i + 1, t)] for i in picked],
                         np.int64)
        corner = np.stack([reads[:, 0], reads[:, 1], reads.max(axis=1)], axis=1)[at]
        corners = np.maximum(np.asarray(floors, np.int64)[:, None], corner)  # (y, 3)
        # made by earlier tile rows at or after each corner; empty spans pad the rows with
        # fewer earlier parts (they add nothing: every corner is at least 0)
        if self.growing:
            made_before = self._made_before(np.array(picked, np.int64)[at][:, None], t, corners)
        else:
            earlier = [self.earlier_spans(i, t) for i in picked]
            spans = np.zeros((len(picked), max(len(e) for e in earlier), 2), np.int64)
            for k, e in enumerate(earlier):
                spans[k, :len(e)] = e
            lo_hi = spans[at][:, None, :, :]  # (y, 1, m, 2)
            made_before = np.maximum(0, lo_hi[..., 1] - np.maximum(
                lo_hi[..., 0], corners[..., None])).sum(-1)
        made = np.array([self.made(i, t) for i in picked], np.int64)[at]  # (y, 2)
        out = np.empty((len(rows), 3, 2), np.int64)
        out[..., 0] = made_before
        out[..., 1] = np.maximum(0, made[:, 1:] - np.maximum(made[:, :1], corners))
        return out

    def earlier_spans(self, i: int, t: str) -> np.ndarray:
        """The non-empty parts of t made by tiles before i, as an (m, 2) array (at least one
        row: an empty range when there is none)."""
        if (i, t) not in self._earlier:
            spans = [sp for sp in (self.made(j, t) for j in range(i)) if sp[1] > sp[0]]
            self._earlier[i, t] = np.array(spans or [(0, 0)], np.int64)
        return self._earlier[i, t]

    def made_from(self, i: int, t: str, x: int) -> int:
        """Elements of t at or after x made by tiles before i (made parts are disjoint and
        ascending, so only the last few tiles can reach past x)."""
        if self.growing:  # every tile is walked: no few tiles to loop over
            before, starts, sizes, below = self._made_index(t)[4:]
            k = max(bisect_right(starts, x) - 1, 0)
            under = below[k] + min(max(x - starts[k], 0), sizes[k]) if starts else 0
            return before[i] - min(before[i], under)
        key = (i, t, x)
        if key not in self._made_from:
            total = 0
            for j in range(i - 1, -1, -1):
                span = self.made(j, t)
                if span[1] <= x and span[1] > span[0]:
                    break
                total += from_(span, x)
            self._made_from[key] = total
        return self._made_from[key]

    def _made_index(self, t: str) -> MadeIndex:
        """What the tiles make of t as prefix sums: the elements made before each tile
        index, and the non-empty made parts' starts, sizes and elements before each (as
        arrays, then the same as lists)."""
        if t not in self._index:
            spans = np.array([self.made(j, t) for j in range(self.count)],
                             np.int64).reshape(-1, 2)
            sizes = np.maximum(0, spans[:, 1] - spans[:, 0])
            live = sizes > 0
            arrays = (np.concatenate([[0], np.cumsum(sizes)]), spans[live, 0], sizes[live],
                      np.concatenate([[0], np.cumsum(sizes[live])]))
            self._index[t] = (*arrays, *(a.tolist() for a in arrays))  # lists: scalar asks
        return self._index[t]

    def _made_before(self, i: np.ndarray, t: str, x: np.ndarray) -> np.ndarray:
        """made_from over arrays of tile indices and bounds (broadcast), from prefix sums:
        the elements tiles before i made, less those below x. Made parts are disjoint and
        ascending, so the parts below x are those before the last one starting at or
        before x, and that one up to x; parts of tiles from i on lie past every earlier
        part, so counting them below x only reaches what the earlier tiles made."""
        before, starts, sizes, below = self._made_index(t)[:4]
        total = before[i]
        if not len(starts):
            return np.zeros_like(total + x)
        k = np.maximum(np.searchsorted(starts, x, side="right") - 1, 0)
        under = below[k] + np.clip(x - starts[k], 0, sizes[k])
        return total - np.minimum(total, under)


@dataclass
class ReuseGrid:
    """Both axes of a reusing group's tiles, with the per-tensor quantities of the model."""

    graph: Graph
    io: GroupIO
    rows: AxisSchedule
    cols: AxisSchedule
    images: int | None = None  # images per tile when fewer than the batch; None: the batch
    peaks: dict[bool, int] = field(default_factory=dict)  # by double buffering
    # the same grid one image deep, where every tensor has the anchor's batch: each
    # quantity of a peak is a plane times one-axis factors, so this grid's peaks are
    # `scale` (its tile's images) times the unit's
    unit: ReuseGrid | None = None
    scale: int = 1
    # kept keys whose kept part leaves SRAM for the cores' WRAM once a tile is done with
    # them (Mode.keys_in_wram): the peak counts only what the tile makes of them
    in_wram: frozenset[str] = frozenset()

    @classmethod
    def of(cls, graph: Graph, io: GroupIO, chains: GroupChains, tile: Tile,
           spilled: bool = False, keys_in_wram: bool = False) -> ReuseGrid:
        """The grid of `tile` (`spilled`: its kept keys spilled, AxisSchedule.spilled;
        `keys_in_wram`: kept in WRAM, ReuseGrid.in_wram)."""
        grid = cls(graph, io, AxisSchedule(graph, io, chains, 1, tile.h, spilled=spilled),
                   AxisSchedule(graph, io, chains, 2, tile.w), part_images(graph, io, tile))
        return grid.keeping_in_wram() if keys_in_wram else grid

    def keeping_in_wram(self) -> ReuseGrid:
        """The same grid with its kept keys held in WRAM (ReuseGrid.in_wram): the walk and
        the traffic are the same, the SRAM peak is not."""
        unit = self.unit.keeping_in_wram() if self.unit is not None else None
        return replace(self, peaks={}, unit=unit, in_wram=kept_prefix(self.graph, self.io))

    def spilling(self) -> ReuseGrid:
        """The same grid with its kept keys spilled: the rows' walk (boxes, made parts,
        reads) is shared, what stays on chip is not."""
        rows = replace(self.rows, spilled=True, _factors={})
        unit = self.unit.spilling() if self.unit is not None else None
        return replace(self, rows=rows, peaks={}, unit=unit)

    @classmethod
    def bands_of(cls, graph: Graph, io: GroupIO, chains: GroupChains, tile: Tile
                 ) -> list[ReuseGrid]:
        """One grid per band (planner.geometry.bands): every tile row, the band's tile columns; each
        band runs on its own, so its first tile column makes its whole boxes (the overlap)."""
        rows = AxisSchedule(graph, io, chains, 1, tile.h)
        count = len(axis_ranges(anchor_extent(graph, io)[2], tile.w))
        return [cls(graph, io, rows, AxisSchedule(graph, io, chains, 2, tile.w, part),
                    part_images(graph, io, tile)) for part in band_columns(count, tile.bands)]

    def plane(self, t: str) -> int:
        """Elements of t per (row, column) position of one tile: its images times the
        channels (the first batch part, the largest, holds the most); with tiles over the
        whole batch, t's own batch (a window partition's is not the anchor's)."""
        n, c, _, _ = self.graph.dims(t)
        return (n if self.images is None else min(n, self.images)) * c

    def batch_plane(self, t: str) -> int:
        """Elements of t per (row, column) position over every batch part: the whole batch
        times the channels (each part sweeps the same grid)."""
        n, c, _, _ = self.graph.dims(t)
        return n * c

    def made_elems(self, t: str) -> int:
        """Elements of t made over all tiles (each once)."""
        return self.batch_plane(t) * self.rows.made_total(t) * self.cols.made_total(t)

    def read_elems(self, name: str, j: int) -> int:
        """Elements of fmap input j that layer `name` reads over all tiles."""
        t = self.graph.layer(name).fmap_inputs[j]
        return self.batch_plane(t) * self.rows.read_total(name, j) \
            * self.cols.read_total(name, j)

    def kept_after(self, t: str, r: int, q: int) -> int:
        """Elements of t on chip once tile (r, q) is done with it (the retention policy):
        the union of two quadrants, (this row's lowest read row, the next column's lowest
        read column) and (the next row's lowest read row, the first column's), intersected
        with what was made so far (earlier tile rows whole, this one up to column q); by
        inclusion-exclusion, a signed sum of products of one-axis factors. A quadrant no
        later tile needs has its corner at NEVER and contributes nothing."""
        rows, cols = self.rows.keep_factors(r, t), self.cols.keep_factors(q, t)
        total = 0
        for sign, (earlier_rows, this_row), (all_cols, cols_so_far) in zip(
                (1, 1, -1), rows, cols, strict=True):
            total += sign * (earlier_rows * all_cols + this_row * cols_so_far)
        return total * self.plane(t)

    def wram_peak_elems(self, shares: Mapping[str, Fraction]) -> int:
        """The most elements of kept keys in WRAM (ReuseGrid.in_wram) the busiest cluster
        holds once a tile is done with them: per tensor its `shares` part (its heads' share)
        of what the tile keeps, over every tile (the last keeps none: its rows never leave
        SRAM)."""
        return max((sum(ceil(self.kept_after(t, r, q) * share) for t, share in shares.items())
                    for r in self.rows.indices() for q in self.cols.indices()), default=0)

    def readback_elems(self, t: str) -> int:
        """Elements of t read back from DRAM over all tiles (spilled keys; else 0)."""
        return self.batch_plane(t) * self.rows.readback_total(t) * self.cols.made_total(t)

    def spill_elems(self, t: str, r: int, q: int) -> int:
        """Elements of t tile (r, q) holds of what earlier tiles made while it reads them:
        one chunk of spilled keys (0 for any other tensor)."""
        if t not in self.rows.spilled_tensors:
            return 0
        return self.plane(t) * self.rows.held_back(r, t) * length(self.cols.made(q, t))

    def made_now(self, t: str, r: int, q: int) -> int:
        """Elements of t tile (r, q) makes."""
        return self.plane(t) * length(self.rows.made(r, t)) * length(self.cols.made(q, t))


def reuse_heights(graph: Graph, io: GroupIO, heights: list[int], chip: Chip) -> list[int]:
    """The tile heights of `heights` (tallest first) whose halo reuse is worth costing:
    every one, but where the group keeps a prefix of keys it makes (attention.kept_prefix)
    only the halvings of the map into at most GROWING_TILES tiles: each of those tiles is
    walked, not taken from a closed form, and a tile search costs every height it offers
    (with resident weights, shorter tiles move no byte less); none where the keys kept
    whole, as the last tile holds them, do not fit one cluster's SRAM. Only those halvings
    too for a group holding an attention that is not causal: its first tile makes every
    key from the whole input, so reuse saves the later tiles' reads of it only where one
    tile does not fit (a UNet's attention at 4,096 tokens in two tiles), and ViT-sized
    groups would pay the search time for every height (plan files may state any)."""
    if not heights:
        return heights
    kept = kept_prefix(graph, io)
    if not kept:
        return growing_heights(heights) if online_attention(graph, io) is not None \
            else heights
    if kept_outgrow(graph, io, chip):
        return []
    return growing_heights(heights)


def kept_outgrow(graph: Graph, io: GroupIO, chip: Chip) -> bool:
    """Whether the keys the group keeps (attention.kept_prefix), whole as the last tile
    holds them, fill one cluster's SRAM: held they cannot run; spilled they may
    (Mode.keys_spilled)."""
    kept = kept_prefix(graph, io)
    return sum(graph.elems(t) for t in kept) * chip.dtype_bytes >= chip.sram.bytes


def growing_heights(heights: list[int]) -> list[int]:
    """The halvings of the map among `heights` (tallest first: the map's) into at most
    GROWING_TILES tiles: what a search offers a schedule each of whose tiles is walked."""
    if not heights:
        return heights
    h = heights[0]
    halvings = {-(-h // (1 << k)) for k in range(h.bit_length() + 1)}
    return [th for th in heights if th in halvings and -(-h // th) <= GROWING_TILES]


def part_images(graph: Graph, io: GroupIO, tile: Tile) -> int | None:
    """Images per tile when the tile holds fewer than the batch (the tiles then sweep one
    batch part after another), None when it holds the whole batch."""
    return tile.n if tile.n < anchor_extent(graph, io)[0] else None


def lifetimes(graph: Graph, io: GroupIO) -> dict[str, tuple[int, int]]:
    """Per tensor: the step it is made at (-1: loaded before the first layer) and the last
    step it stays whole on chip (its last use in the group; past the end for outputs,
    which wait for their store)."""
    born: dict[str, int] = {t: -1 for t in io.inputs}
    last: dict[str, int] = {}
    for k, name in enumerate(io.layers):
        lay = graph.layer(name)
        for t in lay.fmap_inputs:
            last[t] = k
        for t in lay.outputs:
            if t:
                born[t] = k
    end = len(io.layers)
    return {t: (b, end if t in io.outputs else max(b, last.get(t, b))) for t, b in born.items()}


def streamed_step(graph: Graph, io: GroupIO, k: int) -> tuple[str, list[str]] | None:
    """Layer step k as a line buffer: (its output, the inputs it releases as it goes), or
    None when the step runs whole.

    A layer writing one spatial map computes it output row by row; after each row, an
    input whose last use this is drops the rows no later output row of the tile reads,
    except what the retention policy keeps for later tiles. So the step never holds its
    whole input part and its whole output part at once, as the paper's line buffers do.
    """
    lay = graph.layer(io.layers[k])
    outs = [t for t in lay.outputs if t]
    if len(outs) != 1 or not graph.layout(lay.outputs[0]).spatial:
        return None
    spans = lifetimes(graph, io)
    released = [t for t in dict.fromkeys(lay.fmap_inputs)
                if spans[t][1] == k and graph.layout(t).spatial]
    return outs[0], released


def stream_floors(graph: Graph, lay: Layer, t: str, lo: int, hi: int) -> list[int]:
    """Per output row y of [lo, hi): the row of input t below which a streamed step has
    released what the policy does not keep, while row y runs (the lowest row that rows
    y..hi-1 read; never lowered again)."""
    h = graph.dims(t)[2]
    ys = np.arange(lo, hi, dtype=np.int64)
    lows = np.full_like(ys, NEVER)
    for j, name in enumerate(lay.fmap_inputs):
        if name == t:  # needed_range's first row, for every y at once
            m = lay.row_maps[j]
            first = 0 if m.kind is MapKind.WHOLE else m.needed(ys, hi, h)[0]  # type: ignore[arg-type]
            lows = np.minimum(lows, np.maximum(first, 0))
    return [int(f) for f in np.maximum.accumulate(np.maximum(lows, 0))] if hi > lo else []


def reuse_peak_elems(graph: Graph, io: GroupIO, chains: GroupChains, tile: Tile,
                     double_buffered: bool, grid: ReuseGrid | None = None) -> int:
    """Peak feature-map elements on chip over every tile and step of a reusing group.

    At step k a tensor holds what it kept from earlier tiles, plus (from the step it is
    made until its last use) what this tile makes; after its last use, what it keeps for
    later tiles. A streamed step (streamed_step) holds, while output row y runs, its
    output's rows up to y and its released inputs from their floor (stream_floors) on.
    A second input buffer adds this tile's loads (the next tile's arrive). Every quantity
    is an outer product of one-axis factors over the representative tile rows and
    columns, so each tensor contributes a few small arrays.
    """
    grid = grid or ReuseGrid.of(graph, io, chains, tile)
    if double_buffered not in grid.peaks:  # one pass gives both: the loads only add
        unit = grid.unit
        if unit is not None:
            if double_buffered not in unit.peaks:
                unit.peaks.update(_peaks(unit))
            grid.peaks.update({k: v * grid.scale for k, v in unit.peaks.items()})
        else:
            grid.peaks.update(_peaks(grid))
    return grid.peaks[double_buffered]


def _peaks(grid: ReuseGrid) -> dict[bool, int]:
    """The peak without and with a second input buffer."""
    graph, io = grid.graph, grid.io
    spans = lifetimes(graph, io)
    tensors = [t for t in spans if t in grid.rows.boxes(0)]
    rows, cols = grid.rows.indices(), grid.cols.indices()
    last_col = grid.cols.count - 1
    # kept keys in WRAM hold this tile's rows in SRAM through the step: never released
    streamed = {k: (s[0], [t for t in s[1] if t not in grid.in_wram])
                for k in range(len(io.layers)) if (s := streamed_step(graph, io, k)) is not None}
    held = np.zeros((len(io.layers), len(rows), len(cols)), np.int64)
    loads = np.zeros((len(rows), len(cols)), np.int64)
    befores: dict[str, np.ndarray] = {}
    mades: dict[str, np.ndarray] = {}
    afters: dict[str, np.ndarray] = {}
    for t in tensors:
        after = _kept_table(grid, t, rows, cols)
        # before tile (r, q): what tile (r, q - 1) kept, or for q = 0 the last tile of row r - 1
        before = np.zeros_like(after)
        if t in grid.in_wram:  # what earlier tiles kept is in WRAM, and what this one keeps
            after = np.zeros_like(after)  # goes there at its last use
        else:
            before[:, 1:] = _kept_table(grid, t, rows, [q - 1 for q in cols[1:]])
            before[:, 0] = [grid.kept_after(t, r - 1, last_col) if r else 0 for r in rows]
        made = grid.plane(t) * np.outer([length(grid.rows.made(r, t)) for r in rows],
                                        [length(grid.cols.made(q, t)) for q in cols])
        befores[t], mades[t], afters[t] = before, made, after
        born, last = spans[t]
        for k in range(len(io.layers)):
            if k in streamed and (t == streamed[k][0] or t in streamed[k][1]):
                continue  # counted row by row below
            held[k] += before if k < born else before + made if k <= last else after
        if t in io.inputs:
            loads += made
        if t in grid.rows.spilled_tensors:  # the reader holds a chunk of the earlier keys
            reader = prefix_reader(graph, io, t)
            assert reader is not None
            held[io.layers.index(reader[0].name)] += np.array(
                [[grid.spill_elems(t, r, q) for q in cols] for r in rows], np.int64)
    for k, (out, released) in streamed.items():
        lay = graph.layer(io.layers[k])
        whole = sum(befores[t] + mades[t] for t in [out, *released])
        runs = np.outer([length(grid.rows.made(r, out)) for r in rows],
                        [length(grid.cols.made(q, out)) for q in cols]) > 0
        # where the step makes nothing (no row to stream), its tensors stay whole
        held[k] += np.where(runs, _streamed_rows(grid, lay, out, released, rows, cols,
                                                 befores, afters), whole)
    if not len(io.layers):
        return {False: 0, True: 0}
    return {False: int(held.max()), True: int((held + loads).max())}


def _streamed_rows(grid: ReuseGrid, lay: Layer, out: str, released: list[str],
                   rows: list[int], cols: list[int], befores: dict[str, np.ndarray],
                   afters: dict[str, np.ndarray]) -> np.ndarray:
    """A streamed step's output and released inputs, (tile row, tile column) for every row
    in rows and column in cols: the most they hold at once over the step's output rows.
    Every output row y of every tile row is one entry of flat arrays (seg: its tile row's
    position in rows); the maxima are taken per tile row at the end."""
    spans = [grid.rows.made(r, out) for r in rows]
    counts = np.array([length(sp) for sp in spans], np.int64)
    result = np.zeros((len(rows), len(cols)), np.int64)
    live = np.flatnonzero(counts)  # tile rows with output rows to stream (else: whole)
    if not len(live):
        return result
    seg = np.repeat(live, counts[live])
    starts = np.cumsum(counts[live]) - counts[live]
    step = np.arange(len(seg)) - np.repeat(starts, counts[live])  # y - lo in its tile row
    r_of = np.asarray(rows, np.int64)[seg]
    col_made = np.array([length(grid.cols.made(q, out)) for q in cols], np.int64)
    # output rows lo..y made, for each y, in each tile column
    total = befores[out][seg] + grid.plane(out) * np.outer(step + 1, col_made)
    last_col = grid.cols.count - 1
    for t in released:
        floors = np.concatenate([stream_floors(grid.graph, lay, t, *spans[a]) for a in live])
        r_f = grid.rows.row_keep_factors(r_of, t, floors)
        # the tile before (r, q) is (r, q - 1), or (r - 1, last column) for q = 0
        prev = np.zeros_like(total)
        if len(cols) > 1:
            prev[:, 1:] = _kept_floor(grid, t, r_f, [q - 1 for q in cols[1:]])
        later = r_of > 0
        if later.any():
            prev[later, :1] = _kept_floor(
                grid, t, grid.rows.row_keep_factors(r_of[later] - 1, t, floors[later]),
                [last_col])
        t_made = np.array([grid.rows.made(r, t) for r in rows], np.int64)[seg]
        made_rows = np.maximum(0, t_made[:, 1] - np.maximum(t_made[:, 0], floors))
        made = grid.plane(t) * np.outer(made_rows, [length(grid.cols.made(q, t)) for q in cols])
        # below the floor only what later tiles read stays
        kept_low = afters[t][seg] - _kept_floor(grid, t, r_f, cols)
        total = total + prev + made + kept_low
    result[live] = np.maximum.reduceat(total, starts, axis=0)
    return result


def _kept_floor(grid: ReuseGrid, t: str, r_f: np.ndarray, cols: list[int]) -> np.ndarray:
    """grid.kept_after(t, r, q) counting only rows at or after a floor, (entry, q), from the
    row factors of each entry's tile row and floor (AxisSchedule.row_keep_factors)."""
    c_f = np.array([grid.cols.keep_factors(q, t) for q in cols], np.int64).reshape(-1, 3, 2)
    return _signed_products(r_f, c_f) * grid.plane(t)


def _signed_products(r_f: np.ndarray, c_f: np.ndarray) -> np.ndarray:
    """Inclusion-exclusion over the three quadrant corners, for every pair of row and
    column factors: the kept elements per position."""
    sign = np.array([1, 1, -1], np.int64)
    return (np.einsum("k,rk,qk->rq", sign, r_f[:, :, 0], c_f[:, :, 0])
            + np.einsum("k,rk,qk->rq", sign, r_f[:, :, 1], c_f[:, :, 1]))


def _kept_table(grid: ReuseGrid, t: str, rows: list[int], cols: list[int]) -> np.ndarray:
    """grid.kept_after(t, r, q) for every r in rows and q in cols, as outer products."""
    r_f = np.array([grid.rows.keep_factors(r, t) for r in rows], np.int64).reshape(-1, 3, 2)
    c_f = np.array([grid.cols.keep_factors(q, t) for q in cols], np.int64).reshape(-1, 3, 2)
    return _signed_products(r_f, c_f) * grid.plane(t)
