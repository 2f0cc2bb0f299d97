"""Tiles, the regions they need (halo included), and closed forms of their sums.

A group's tile is a box (n, h, w) of its *anchor*, the tensor it writes back.
`tile_regions` walks the group backwards through the row/column maps and gives,
for one tile, the box of every tensor the tile needs: this is what the emulator
loads and computes. `AxisChain` is the same walk in closed form along one axis
(region = [max(L, S*a - P), min(U, S*(b-1) + E)) for output range [a, b)), so
the solver and the cost model can sum regions over all tiles without
enumerating them. Both must agree exactly; tests/test_regions.py proves it.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from math import ceil

from fuseplan.planner.ir.graph import WHOLE, AxisMap, Graph, Layer, MapKind
from fuseplan.planner.ir.layout import layout_of
from fuseplan.planner.ir.ops import Accumulate, op_spec


@dataclass(frozen=True)
class Tile:
    """Extent of one tile of the group's anchor tensor along batch, rows and columns."""

    n: int
    h: int
    w: int
    bands: int = 1  # halo-reusing tiles only: columns split among cores (planner.geometry.bands)

    def label(self) -> str:
        """n×h×w, and the bands when there are several (tables and reports)."""
        size = f"{self.n}×{self.h}×{self.w}"
        return size if self.bands == 1 else f"{size} /{self.bands} bands"


Box = tuple[int, int, int, int, int, int]  # n0, n1, r0, r1, c0, c1


def dims(shape: Sequence[int]) -> tuple[int, int, int, int]:
    """(N, C, H, W) view of any tensor by its layout: channel axes multiplied together, 1 for
    an axis it does not have (untiled tensors have H = W = 1)."""
    return _dims(tuple(shape))


@lru_cache(maxsize=4096)  # the tile search asks millions of times about a few hundred shapes
def _dims(shape: tuple[int, ...]) -> tuple[int, int, int, int]:
    return layout_of(shape).dims(shape)


def box_elems(graph: Graph, tensor: str, box: Box) -> int:
    """Elements of a tensor inside a box."""
    c = graph.dims(tensor)[1]
    return (box[1] - box[0]) * c * (box[3] - box[2]) * (box[5] - box[4])


def full_box(graph: Graph, tensor: str) -> Box:
    """The box of a whole tensor."""
    n, _, h, w = graph.dims(tensor)
    return 0, n, 0, h, 0, w


@dataclass(frozen=True)
class GroupIO:
    """Which tensors a set of layers reads from and writes to DRAM."""

    layers: tuple[str, ...]  # topological order
    inputs: tuple[str, ...]  # feature maps produced outside the group (or model inputs)
    outputs: tuple[str, ...]  # produced inside, consumed outside or model outputs
    internal: tuple[str, ...]  # produced and consumed only inside: stay on chip
    weights: tuple[str, ...]  # union of the layers' weight tensors
    anchor: str  # the tensor the tile is defined on: an output, or what a reduction folds
    # outputs of a final reduction over rows and columns: each tile adds its part of the
    # anchor into an on-chip accumulator, written once after the last tile
    accumulated: tuple[str, ...] = ()
    # written straight into a whole buffer held beside the group (a pooled map a pass keeps
    # for later passes, planner.geometry.passes): no tile holds a box of its own of them
    in_place: tuple[str, ...] = ()

    @property
    def stored_per_tile(self) -> tuple[str, ...]:
        """The outputs each tile stores its part of (not the accumulated ones)."""
        return tuple(t for t in self.outputs if t not in self.accumulated)


def group_io(graph: Graph, layers: Sequence[str]) -> GroupIO:
    """Inputs, outputs, internal tensors and weights of a group of layers."""
    members = sorted(set(layers), key=graph.index)
    inside = set(members)
    produced: list[str] = []
    inputs: list[str] = []
    weights: list[str] = []
    for name in members:
        lay = graph.layer(name)
        for t in lay.fmap_inputs:
            if graph.producer.get(t) not in inside and t not in inputs:
                inputs.append(t)
        for t in lay.weights:
            if t not in weights:
                weights.append(t)
        produced.extend(o for o in lay.outputs if o)
    outputs, internal = [], []
    for t in produced:
        leaves = t in graph.outputs or any(c not in inside for c in graph.consumers.get(t, ()))
        if leaves:
            outputs.append(t)
        elif graph.consumers.get(t):
            internal.append(t)
    anchor = outputs[-1] if outputs else produced[-1]
    accumulated: tuple[str, ...] = ()
    folded = accumulated_input(graph, graph.layer(members[-1]))
    if folded is not None and anchor == graph.layer(members[-1]).outputs[0]:
        # tiles run over what the final reduction folds, not over its one-pixel result
        anchor, accumulated = folded, (anchor,)
    return GroupIO(tuple(members), tuple(inputs), tuple(outputs), tuple(internal),
                   tuple(weights), anchor, accumulated)


def tiled_like_anchor(graph: Graph, io: GroupIO, t: str) -> bool:
    """An output besides the anchor that tiles cut as they cut the anchor, so each tile
    computes and stores its own box of it: one with the anchor's batch, rows and columns
    that the group's layers read only element for element on the way to the anchor or to
    other such outputs, or not at all (a Split's other parts; q, k and v of one projection
    split into heads; a residual sum a norm reads row for row), and whose layer's other
    outputs are such too. Each tile's box of it is then exactly the box it stores, and
    the tiles' boxes cover it once. An output read with a halo, an offset or whole by a
    later layer is needed whole by every tile and forces a single tile."""
    if t == io.anchor or t in io.accumulated:
        return False
    return _aligned(graph, io, t, frozenset(io.layers), {})


def _aligned(graph: Graph, io: GroupIO, t: str, inside: frozenset[str],
             seen: dict[str, bool]) -> bool:
    """Whether every tile needs exactly its anchor box of `t` (see tiled_like_anchor).

    A depth-first walk down the layers that read `t`, as a stack of frames (_aligned_frame)
    rather than recursion: along a decoder of thousands of element-wise layers the walk is
    thousands deep, past Python's recursion limit."""
    settled = _settled(graph, io, t, seen)
    if settled is not None:
        return settled
    stack = [_aligned_frame(graph, io, t, inside, seen)]
    answer: bool | None = None
    while stack:
        try:
            asked = stack[-1].send(answer)
        except StopIteration as done:
            stack.pop()
            answer = done.value
            continue
        answer = _settled(graph, io, asked, seen)
        if answer is None:  # decide it first: a frame of its own
            stack.append(_aligned_frame(graph, io, asked, inside, seen))
    return bool(answer)


def _settled(graph: Graph, io: GroupIO, t: str, seen: dict[str, bool]) -> bool | None:
    """_aligned's answer for `t` where it needs no walk, else None."""
    if t == io.anchor:
        return True
    if t in seen:
        return seen[t]  # True while it is being decided: siblings ask of each other
    (n, _, h, w), (tn, _, th, tw) = graph.dims(io.anchor), graph.dims(t)
    if t in io.accumulated or (n, h, w) != (tn, th, tw):
        seen[t] = False
        return False
    return None


def _aligned_frame(graph: Graph, io: GroupIO, t: str, inside: frozenset[str],
                   seen: dict[str, bool]) -> Generator[str, bool | None, bool]:
    """One step of _aligned's walk for an unsettled `t`: yields each tensor whose answer it
    needs, is sent that answer, returns its own."""
    seen[t] = True
    producer = graph.producer.get(t)
    # a layer computes all its outputs on one box, the hull of what each is needed on: a
    # sibling needed with a halo would widen this one's box past the anchor's too
    siblings = graph.layer(producer).outputs if producer in inside else ()
    found = True
    for o in siblings:
        if o and o != t and not (yield o):
            found = False
            break
    for name in graph.consumers.get(t, ()) if found else ():
        if name not in inside:
            continue
        lay = graph.layer(name)
        if not lay.batch_preserving or any(
                x == t and (lay.row_maps[i].kind is not MapKind.IDENTITY
                            or lay.col_maps[i].kind is not MapKind.IDENTITY)
                for i, x in enumerate(lay.fmap_inputs)):
            found = False
            break
        for o in lay.outputs:
            if o and not (yield o):
                found = False
                break
        if not found:
            break
    seen[t] = found
    return found


def whole_outputs(graph: Graph, io: GroupIO) -> list[str]:
    """The group's outputs every tile needs whole (an output leaving mid-group): the
    execution model stores each once, so a group with any runs as one tile."""
    return [t for t in io.outputs if t != io.anchor and t not in io.accumulated
            and not tiled_like_anchor(graph, io, t)]


def accumulated_input(graph: Graph, lay: Layer) -> str | None:
    """The input a reduction over rows and columns folds tile by tile (global pooling, a
    keepdims ReduceMean/Sum/Max/Min over every tiled axis, and channel axes with them), or
    None when the layer is no such reduction (it then needs its input whole)."""
    return None if folded_axes(graph, lay) is None else lay.fmap_inputs[0]


def folded_axes(graph: Graph, lay: Layer) -> tuple[int, ...] | None:
    """The axes of its input a reduction folds tile by tile: every tiled axis (a tile folds
    its rows and columns into the accumulator), and channel axes, which every tile holds
    whole; None for a layer that is no such reduction."""
    spec = op_spec(lay.op)
    if spec.accumulate is Accumulate.NONE or len(lay.fmap_inputs) != 1:
        return None
    layout = graph.layout(lay.fmap_inputs[0])
    if not layout.spatial:
        return None
    if not lay.op.startswith("Reduce"):
        return layout.tiled_axes
    if not int(lay.attrs.get("keepdims", 1)):
        return None
    axes = lay.attrs.get("axes")
    if axes is None and len(lay.inputs) > 1 and lay.inputs[1] in graph.constants:
        axes = [int(a) for a in graph.constants[lay.inputs[1]].reshape(-1)]
    if axes is None:
        return None
    folded = {int(a) % layout.rank for a in axes}
    if not set(layout.tiled_axes) <= folded \
            or not folded - set(layout.tiled_axes) <= set(layout.channel_axes):
        return None
    return tuple(sorted(folded))


def needed_range(m: AxisMap, lo: int, hi: int, in_len: int, out_spatial: bool,
               in_spatial: bool) -> tuple[int, int]:
    """Input range along one axis that output range [lo, hi) needs, clipped to the map."""
    if not in_spatial:
        return 0, 1
    if not out_spatial or m.kind is MapKind.WHOLE:
        return 0, in_len
    a, b = m.needed(lo, hi, in_len)
    a, b = max(0, a), min(in_len, b)
    return a, max(a, b)  # empty when no input row reaches the range (kernel < stride)


def input_box(graph: Graph, lay: Layer, index: int, out_box: Box,
              rows: AxisMap | None = None) -> Box:
    """Box of fmap input `index` that layer `lay` needs to compute `out_box` of its output
    (``rows``: the row map a group reads it by, where not the layer's: group_row_map)."""
    t = lay.fmap_inputs[index]
    n_in, _, h_in, w_in = graph.dims(t)
    out_spatial = graph.layout(lay.outputs[0]).spatial
    in_spatial = graph.layout(t).spatial
    n0, n1 = (out_box[0], out_box[1]) if lay.batch_preserving else (0, n_in)
    r0, r1 = needed_range(rows or lay.row_maps[index], out_box[2], out_box[3], h_in,
                          out_spatial, in_spatial)
    c0, c1 = needed_range(lay.col_maps[index], out_box[4], out_box[5], w_in, out_spatial,
                          in_spatial)
    return n0, n1, r0, r1, c0, c1


def group_row_map(io: GroupIO, lay: Layer, index: int, reuse: bool = False) -> AxisMap:
    """The row map by which a group reads fmap input `index` of its layer `lay`: the
    layer's, but WHOLE for a causal attention's prefix of keys (MapKind.PREFIX) where the
    group makes them itself and its tiles recompute: every tile makes them all. The prefix
    pays where keys stream from DRAM (fewer bytes read); made on chip by tiles that keep
    nothing, a tile's keys would grow with its rows, and no tile would stand for the others
    in the cost model. Under halo reuse (`reuse`) the tiles run in order and keep what later
    tiles read, so the keys made so far stay on chip: each tile makes its own rows of them
    and reads the prefix held (planner.geometry.attention.kept_prefix)."""
    m = lay.row_maps[index]
    if m.kind is MapKind.PREFIX and not reuse and lay.fmap_inputs[index] not in io.inputs:
        return WHOLE
    return m


def empty(box: Box) -> bool:
    """No element inside (a Concat's input no row of the tile comes from)."""
    return box[0] >= box[1] or box[2] >= box[3] or box[4] >= box[5]


def hull(a: Box | None, b: Box) -> Box:
    """Smallest box holding both; an empty box holds nothing, wherever it starts."""
    if a is None or (empty(a) and not empty(b)):
        return b
    if empty(b):
        return a
    return (min(a[0], b[0]), max(a[1], b[1]), min(a[2], b[2]), max(a[3], b[3]),
            min(a[4], b[4]), max(a[5], b[5]))


def tile_regions(graph: Graph, io: GroupIO, anchor_box: Box, reuse: bool = False
                 ) -> dict[str, Box]:
    """Box of every tensor of the group needed to produce anchor_box of the anchor
    (``reuse``: by a halo-reusing group's tiles, which read a causal prefix of the keys
    they keep: group_row_map)."""
    need: dict[str, Box] = {io.anchor: anchor_box}
    for t in io.outputs:
        need[t] = anchor_box if t == io.anchor or tiled_like_anchor(graph, io, t) \
            else full_box(graph, t)
    for name in reversed(io.layers):
        lay = graph.layer(name)
        if lay.outputs[0] in io.accumulated:
            continue  # it folds the tile's box of the anchor into its accumulator
        out_box: Box | None = None
        for t in lay.outputs:
            if t in need:
                out_box = hull(out_box, need[t])
        if out_box is None:
            continue
        for t in lay.outputs:  # every output of a multi-output layer is computed on that box
            if t:
                need[t] = out_box
        for i, t in enumerate(lay.fmap_inputs):
            box = input_box(graph, lay, i, out_box, group_row_map(io, lay, i, reuse))
            if empty(out_box):  # nothing to compute: no input row either (not a window's k)
                box = (box[0], box[1], box[2], box[2], box[4], box[5])
            need[t] = hull(need.get(t), box)
    return need


def backward_range(graph: Graph, io: GroupIO, tile: Tile) -> tuple[str, int, int] | None:
    """(tensor, axis, tile index) of the first range that starts or ends before the same
    tensor's range in the tile before, along rows (axis 1) or columns (axis 2), or None
    when every range advances. A cyclic shift inside a group (Swin's, as Slice and Concat
    along rows) makes the tile that holds the wrapped rows need a range reaching back to
    the map's start: halo reuse, which keeps only what lies ahead, cannot run it."""
    if not any(m.kind is MapKind.OFFSET for name in io.layers
               for m in (*graph.layer(name).row_maps, *graph.layer(name).col_maps)):
        return None  # only an offset (a Slice or Concat along rows) can reach back
    for axis, size in ((1, tile.h), (2, tile.w)):
        k = 2 * axis
        last: dict[str, tuple[int, int]] = {}
        for index, boxes in enumerate(axis_strips(graph, io, axis, size)):
            for t, b in boxes.items():
                if b[k] >= b[k + 1]:
                    continue  # an empty range holds nothing to keep
                before = last.get(t)
                if before is not None and (b[k] < before[0] or b[k + 1] < before[1]):
                    return t, axis, index
                last[t] = (b[k], b[k + 1])
    return None


def axis_strips(graph: Graph, io: GroupIO, axis: int, size: int) -> Iterator[dict[str, Box]]:
    """tile_regions of each tile along one axis (0 batch, 1 rows, 2 columns), the other
    axes whole: the strips whose ranges along that axis are those of every tile's."""
    full = list(full_box(graph, io.anchor))
    k = 2 * axis
    for lo, hi in axis_ranges(full[k + 1], size):
        strip = list(full)
        strip[k], strip[k + 1] = lo, hi
        yield tile_regions(graph, io, tuple(strip))  # type: ignore[arg-type]


@dataclass(frozen=True)
class StripSpans:
    """Per tensor, its range length along one axis over the tiles along that axis (the
    strips of axis_strips): summed, and the longest. One walk gives both; it depends on the
    group, the axis and the tile's size along it only, so a tile search keeps one per size
    for every tile sharing it (walking a deep group's strips is its costliest step)."""

    total: Mapping[str, int]
    longest: Mapping[str, int]

    @classmethod
    def of(cls, graph: Graph, io: GroupIO, axis: int, size: int) -> StripSpans:
        """Walk the strips of `size` along `axis` once."""
        total: dict[str, int] = {}
        longest: dict[str, int] = {}
        k = 2 * axis
        for boxes in axis_strips(graph, io, axis, size):
            for t, b in boxes.items():
                span = max(0, b[k + 1] - b[k])
                total[t] = total.get(t, 0) + span
                longest[t] = max(longest.get(t, 0), span)
        return cls(total, longest)


def axis_ranges(extent: int, size: int) -> list[tuple[int, int]]:
    """Split [0, extent) into consecutive ranges of `size` (the last one shorter)."""
    return [(a, min(a + size, extent)) for a in range(0, extent, size)]


def anchor_extent(graph: Graph, io: GroupIO) -> tuple[int, int, int]:
    """(N, H, W) of the anchor tensor."""
    n, _, h, w = graph.dims(io.anchor)
    return n, h, w


def iter_tiles(graph: Graph, io: GroupIO, tile: Tile) -> Iterator[Box]:
    """Anchor boxes of all tiles, batch outermost, then rows, then columns."""
    n, h, w = anchor_extent(graph, io)
    for n0, n1 in axis_ranges(n, tile.n):
        for r0, r1 in axis_ranges(h, tile.h):
            for c0, c1 in axis_ranges(w, tile.w):
                yield n0, n1, r0, r1, c0, c1


def tile_count(graph: Graph, io: GroupIO, tile: Tile) -> int:
    """Number of tiles of a group."""
    n, h, w = anchor_extent(graph, io)
    return ceil(n / tile.n) * ceil(h / tile.h) * ceil(w / tile.w)


# --- closed forms -----------------------------------------------------------------


@dataclass(frozen=True)
class AxisChain:
    """Closed form of a tensor's range along one axis as a function of the anchor range.

    For anchor range [a, b) the tensor needs [max(0, S*a - P), min(U, S*(b-1) + E)).
    S == 0 means the tensor is needed whole ([0, U)) by every tile.
    """

    s: int
    p: int
    e: int
    u: int

    def delta(self, extent: int) -> int:
        """Rows the last tile's unclipped range overshoots U by."""
        return self.s * (extent - 1) + self.e - self.u if self.s else 0

    def min_tile(self, extent: int) -> int | None:
        """Smallest tile size for which `total` is exact, or None if only the whole axis is."""
        if self.s == 0:
            return 1
        if self.p < 0 or self.delta(extent) < 0 or self.delta(extent) > self.s * extent:
            return None
        return max(1, ceil(max(self.p, self.delta(extent)) / self.s))

    def total(self, extent: int, size: int) -> int:
        """Sum over all tiles of the tensor's range length (valid for size >= min_tile)."""
        if self.s == 0:
            return ceil(extent / size) * self.u
        t = ceil(extent / size)
        last = extent - (t - 1) * size
        d = self.delta(extent)
        return (t * (self.s * size + self.e + self.p - self.s) - self.s * (t * size - extent)
                - self.p - d - max(0, d - self.s * last) * (t >= 2))

    def union(self, extent: int, size: int) -> int:
        """Rows in the union of all tiles' ranges: each row loaded or computed once when
        halos are reused (consecutive ranges overlap, unless the kernel is smaller than the
        stride and skips rows)."""
        if self.s == 0 or self.e + self.p >= self.s:
            return self.u
        return self.total(extent, size)

    def overlap(self) -> int:
        """Rows a tile shares with the next one (kept on chip when halos are reused)."""
        if self.s == 0:
            return self.u
        return min(self.u, max(0, self.e + self.p - self.s))

    def bound(self, size: int) -> int:
        """Largest range any tile of this size needs (a safe bound, used for capacity)."""
        if self.s == 0:
            return self.u
        return min(self.s * size + self.e + self.p - self.s, self.u)


_ANCHOR = AxisChain(1, 0, 1, 0)


def _compose(chain: AxisChain | None, m: AxisMap, in_len: int, in_full: tuple[int, int],
             out_spatial: bool, in_spatial: bool) -> AxisChain | None:
    u = in_full[1]
    if chain is None:
        return None
    if not in_spatial:
        return AxisChain(0, 0, 1, 1)
    if chain.s == 0 or not out_spatial or m.kind is MapKind.WHOLE:
        return AxisChain(0, 0, u, u) if in_full[0] == 0 else None
    if m.kind is MapKind.IDENTITY:
        return AxisChain(chain.s, chain.p, chain.e, u)
    if m.kind is MapKind.WINDOW:
        k, s, p, d = m.kernel, m.stride, m.pad, m.dilation
        return AxisChain(s * chain.s, s * chain.p + p, s * (chain.e - 1) - p + (k - 1) * d + 1, u)
    return None


def _join(a: AxisChain | None, b: AxisChain | None) -> AxisChain | None:
    if a is None or b is None:
        return None
    if a.s == 0 or b.s == 0:
        whole = a if a.s == 0 else b
        other = b if a.s == 0 else a
        return whole if whole.u >= other.u else None
    if a.s != b.s:
        return None
    top = a if (a.e >= b.e and a.u >= b.u) else b if (b.e >= a.e and b.u >= a.u) else None
    if top is None:
        return None
    return AxisChain(a.s, max(a.p, b.p), top.e, max(a.u, b.u))


@dataclass(frozen=True)
class GroupChains:
    """Closed-form chains of every tensor of a group along batch, rows and columns."""

    chains: Mapping[str, tuple[AxisChain | None, AxisChain | None, AxisChain | None]]
    full: Mapping[str, Box]  # exact boxes for the whole-anchor tile


def group_chains(graph: Graph, io: GroupIO) -> GroupChains:
    """Closed forms for every tensor of the group (None where an axis is not affine)."""
    n, h, w = anchor_extent(graph, io)
    full = tile_regions(graph, io, (0, n, 0, h, 0, w))
    chains: dict[str, tuple[AxisChain | None, AxisChain | None, AxisChain | None]] = {}
    chains[io.anchor] = (AxisChain(1, 0, 1, n), AxisChain(1, 0, 1, h), AxisChain(1, 0, 1, w))
    for t in io.outputs:
        if tiled_like_anchor(graph, io, t):
            chains[t] = chains[io.anchor]
        elif t != io.anchor:
            # other outputs force a single tile; an accumulator has no per-tile range, so
            # its group is costed by enumerating tiles (and pinned in CP-SAT)
            chains[t] = (None, None, None)
    for name in reversed(io.layers):
        lay = graph.layer(name)
        if lay.outputs[0] in io.accumulated:
            continue
        outs = [t for t in lay.outputs if t in chains]
        if not outs:
            continue
        cur = chains[outs[0]]
        for t in outs[1:]:
            cur = (_join(cur[0], chains[t][0]), _join(cur[1], chains[t][1]),
                   _join(cur[2], chains[t][2]))
        for t in lay.outputs:  # every output is computed on the joined range (tile_regions)
            if t:
                chains[t] = cur
        out_spatial = graph.layout(lay.outputs[0]).spatial
        for i, t in enumerate(lay.fmap_inputs):
            in_spatial = graph.layout(t).spatial
            fb = full[t]
            cn: AxisChain | None = None
            if cur[0] is not None and lay.batch_preserving and cur[0].s:
                cn = AxisChain(cur[0].s, cur[0].p, cur[0].e, fb[1])
            elif cur[0] is not None:
                cn = AxisChain(0, 0, fb[1], fb[1])
            cr = _compose(cur[1], group_row_map(io, lay, i), graph.dims(t)[2], (fb[2], fb[3]),
                          out_spatial, in_spatial)
            cc = _compose(cur[2], lay.col_maps[i], graph.dims(t)[3], (fb[4], fb[5]), out_spatial,
                          in_spatial)
            if t in chains:
                old = chains[t]
                cn, cr, cc = _join(old[0], cn), _join(old[1], cr), _join(old[2], cc)
            chains[t] = (cn, cr, cc)
    return GroupChains(chains, full)


def in_group_uses(graph: Graph, io: GroupIO) -> dict[str, int]:
    """How many layers of the group read each tensor (the cores read it once per reader)."""
    uses: dict[str, int] = {}
    for name in io.layers:
        for t in graph.layer(name).fmap_inputs:
            uses[t] = uses.get(t, 0) + 1
    return uses
