"""Hidden chunks: a stretch of a group that widens its maps and narrows them again runs
chunk by chunk over the wide (hidden) channels, so the wide maps never exist whole on chip.

A transformer's MLP (Linear to 4C, GELU, Linear back to C) and a CNN's expand / project
pair have the same shape: a *widening* layer (its weights cut along its output channels),
per-element layers on the hidden maps (bias, activation: each output channel from the same
channel of its inputs), and a *narrowing* layer that sums over the hidden channels. Cut the
hidden channels into k chunks: for each chunk the widening layer computes its slice of the
hidden channels from its whole input on chip, the per-element layers run on that slice, and
the narrowing layer adds the slice's partial sums into its output, which stays on chip as
an accumulator until the last chunk is in. Each weight is used once per tile (its chunk's
slice: the widening layer's output channels, the narrowing layer's input channels), the
group's DRAM traffic is that of the same tile run whole, and the chip holds one chunk of
every hidden map instead of all of it (FlashAttention's idea, on the MLP).

This module finds the stretches of a group, says how each constant of a stretch layer
splits and in which order streamed weights arrive (each load double-buffered behind the one
before: the weights on chip at every step); planner.cost.hidden prices a group run so,
emulator.hidden runs it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from fuseplan.planner.geometry.attention import fused_attention, online_attention
from fuseplan.planner.geometry.heads import Cut, head_walk, narrow_axis, sibling
from fuseplan.planner.geometry.regions import GroupIO, accumulated_input, folded_axes
from fuseplan.planner.ir.chunks import chunk_axes, chunk_ranges
from fuseplan.planner.ir.graph import Graph, Layer
from fuseplan.planner.ir.ops import op_spec


@dataclass(frozen=True)
class Stretch:
    """Layers of a group run chunk by chunk over `channels` hidden channels."""

    widen: str  # computes a chunk of the hidden channels from its whole input
    mids: tuple[str, ...]  # per-element layers on the chunk
    narrow: str  # adds the chunk's partial sums into its output
    channels: int  # hidden channels
    axis: int  # the hidden tensors' channel axis
    hidden: tuple[str, ...]  # the tensors held a chunk at a time: widen's and the mids' outputs
    out: str  # the narrowing layer's output: the accumulator
    # the narrowing layer is a reduction over rows and columns folding each hidden channel
    # on its own (a pooling pass's pool): each chunk fills its own channels of the result
    # instead of adding partial sums over all of them
    pools: bool = False
    # a head stretch (planner.geometry.heads): `channels` counts heads, and every hidden
    # tensor and cut constant says where its heads sit; empty: plain channels on `axis`
    cuts: tuple[tuple[str, Cut], ...] = ()

    @property
    def layers(self) -> tuple[str, ...]:
        return (self.widen, *self.mids, self.narrow)

    def cut_of(self, tensor: str) -> Cut:
        """Where the units sit in a hidden tensor."""
        return dict(self.cuts).get(tensor, Cut(self.axis))


def stretches(graph: Graph, io: GroupIO) -> tuple[Stretch, ...]:
    """Every stretch of the group, in order (none overlap).

    A stretch is a run of consecutive layers of the group: a layer whose weights split
    along its output channels (Conv without groups, Linear), then layers computing each
    channel from the same channel of their inputs (per-element ops, depthwise convs),
    reading only the stretch's hidden maps (and constants that are per channel or
    broadcast), then one layer summing over those
    channels (Conv without groups, Linear by a constant); no hidden map is read by anything
    else or leaves the group. A group holding a fused attention has stretches only where
    every fused layer lies inside a head stretch: its q, keys and values are made in the
    chunk, so none streams, and its online softmax's scratch is per head
    (planner.cost.hidden). Elsewhere its scratch and streamed keys are counted by the plain
    tile runs only."""
    found = _stretches(graph, io)
    if found and online_attention(graph, io) is not None:
        inside = {n for s in found for n in s.mids}
        if any(fused_attention(graph.layer(n)) and n not in inside for n in io.layers):
            return ()
    return found


def _stretches(graph: Graph, io: GroupIO) -> tuple[Stretch, ...]:
    found: list[Stretch] = []
    k = 0
    while k < len(io.layers):
        s = _stretch_at(graph, io, k)
        if s is None:
            k += 1
            continue
        found.append(s)
        k = io.layers.index(s.narrow) + 1
    return tuple(found)


def _channel_axis(graph: Graph, t: str) -> int | None:
    """The one channel axis of a tensor (None when it has several, or none)."""
    layout = graph.layout(t)
    return layout.channel_axes[0] if len(layout.channel_axes) == 1 else None


def _stretch_at(graph: Graph, io: GroupIO, k: int) -> Stretch | None:
    s = _plain_stretch_at(graph, io, k)
    return s if s is not None else _head_stretch_at(graph, io, k)


def _head_stretch_at(graph: Graph, io: GroupIO, k: int) -> Stretch | None:
    """An attention stretch run a few heads at a time (planner.geometry.heads)."""
    walk = head_walk(graph, io.layers, k)
    if walk is None:
        return None
    widen = graph.layer(io.layers[k])
    hidden = walk.hidden
    if _leaks(graph, io, hidden, (*walk.mids, walk.narrow)):
        return None
    return Stretch(widen.name, walk.mids, walk.narrow, walk.units, walk.cuts[hidden[0]].axis,
                   tuple(hidden), graph.layer(walk.narrow).outputs[0],
                   cuts=tuple(sorted(walk.cuts.items())))


def _leaks(graph: Graph, io: GroupIO, hidden: Sequence[str], layers: Sequence[str]) -> bool:
    """A hidden map read beside the stretch's `layers` in the group, or leaving it (a map
    read outside the group leaves it, io.outputs, unless the group is one pass of several:
    planner.geometry.passes; another pass makes it again)."""
    inside = set(io.layers)
    return any(c in inside and c not in layers for t in hidden
               for c in graph.consumers.get(t, ())) \
        or any(t in io.outputs or t in graph.outputs for t in hidden)


def _plain_stretch_at(graph: Graph, io: GroupIO, k: int) -> Stretch | None:
    widen = graph.layer(io.layers[k])
    split = chunk_axes(graph, widen)
    if split is None or len([t for t in widen.outputs if t]) != 1:
        return None
    channels, _ = split
    out = widen.outputs[0]
    rank = len(graph.shapes[out])
    axis = _channel_axis(graph, out)
    if axis is None or axis != op_spec(widen.op).chunk_out_axis % rank \
            or graph.shapes[out][axis] != channels or channels < 2:
        return None
    hidden = [out]
    mids: list[str] = []
    for name in io.layers[k + 1:]:
        lay = graph.layer(name)
        reads = [t for t in lay.fmap_inputs if t in hidden]
        if not reads:
            return None  # the stretch is a run of consecutive layers
        sums = _narrows(graph, lay, hidden, channels, axis)
        if sums or _pools(graph, io, lay, hidden, channels, axis):
            if _leaks(graph, io, hidden, (*mids, name)):
                return None
            return Stretch(widen.name, tuple(mids), name, channels, axis, tuple(hidden),
                           lay.outputs[0], pools=not sums)
        if not _per_element(graph, lay, hidden, out):
            return None
        mids.append(name)
        hidden.append(lay.outputs[0])
    return None


def chunkable_maps(graph: Graph) -> dict[str, tuple[str, int]]:
    """Maps some group could hold a hidden chunk at a time, each with the layer starting its
    stretch (a group must hold it to hold the map in chunks) and the most chunks the
    stretch makes: a bound for searches that must not rule such groups out before costing
    them (solver.long_groups), not a plan. As `stretches` over the whole model, but a
    hidden map may also be folded by a pool (a pooling pass makes it again), the layers on
    that pool's vector (a squeeze-excite tail) may lie between the stretch's layers, and a
    stretch may end in pools alone (a group ending in a global pool)."""
    order = [lay.name for lay in graph.layers]
    found: dict[str, tuple[str, int]] = {}
    for k, name, channels, (hidden, walked, vectors, narrow) in _walks(graph, order):
        pooled_only = bool(vectors) and all(c in walked for t in hidden
                                            for c in graph.consumers.get(t, ()))
        if narrow is not None or pooled_only:
            found.update((t, (name, _most_chunks(channels))) for t in hidden)
            continue
        heads = head_walk(graph, order, k)  # attention a few heads at a time
        if heads is not None:
            found.update((t, (name, heads.units)) for t in heads.hidden)
    return found


def _walks(graph: Graph, order: Sequence[str]
           ) -> Iterator[tuple[int, str, int, tuple[list[str], set[str], set[str], str | None]]]:
    """(position, name, hidden channels, _walk_chunkable's walk) of each layer that could
    start a stretch."""
    for k, name in enumerate(order):
        widening = _widening(graph, graph.layer(name))
        if widening is not None:
            channels, out, axis = widening
            yield k, name, channels, _walk_chunkable(graph, order[k + 1:], name, out,
                                                     channels, axis)


def _widening(graph: Graph, widen: Layer) -> tuple[int, str, int] | None:
    """(channels, output, channel axis) of a layer that could start a stretch: one output,
    its channels along the axis its op chunks, at least two of them."""
    split = chunk_axes(graph, widen)
    outs = [t for t in widen.outputs if t]
    if split is None or len(outs) != 1:
        return None
    channels, out = split[0], outs[0]
    axis = _channel_axis(graph, out)
    if axis is None or axis != op_spec(widen.op).chunk_out_axis % len(graph.shapes[out]) \
            or graph.shapes[out][axis] != channels or channels < 2:
        return None
    return channels, out, axis


@dataclass(frozen=True)
class NarrowedStretch:
    """A stretch some group could run in hidden chunks that a narrowing layer ends
    (chunkable_maps), as a bound on whole-map groups sees it (solver.whole_starts)."""

    widen: str
    narrow: str
    hidden: tuple[str, ...]  # its maps held a chunk at a time
    # elements of one image it holds whole at its narrowing step, the widening layer's
    # input maps (every chunk is computed from all of them) and the accumulator; None
    # around a pool (it may run in passes, which need not hold that input throughout)
    held: int | None


def narrowed_stretches(graph: Graph) -> list[NarrowedStretch]:
    """Every stretch over the whole model that a narrowing layer ends, in order."""
    found: list[NarrowedStretch] = []
    for _, name, _, (hidden, _, vectors, narrow) in _walks(
            graph, [lay.name for lay in graph.layers]):
        if narrow is None:
            continue
        held = {*graph.layer(name).fmap_inputs, *(t for t in graph.layer(narrow).outputs if t)}
        found.append(NarrowedStretch(name, narrow, tuple(hidden), None if vectors else sum(
            _one_image(graph, t) for t in held if t in graph.shapes)))
    return found


def _one_image(graph: Graph, t: str) -> int:
    """Elements of one image of a map (of a batch of maps, or of a token sequence)."""
    shape = graph.shapes[t]
    n = shape[0] if len(shape) >= 3 and shape[0] > 0 else 1
    return graph.elems(t) // n


def _walk_chunkable(graph: Graph, later_layers: Sequence[str], name: str, out: str,
                    channels: int, axis: int
                    ) -> tuple[list[str], set[str], set[str], str | None]:
    """(hidden maps, layers walked, pooled vectors, the narrowing layer that ended it if
    one did): the stretch from `name` on, through per-element layers, pools and the tails
    on their vectors, as far as the hidden maps go."""
    hidden, walked = [out], {name}
    vectors: set[str] = set()
    for later in later_layers:
        lay = graph.layer(later)
        if not any(t in hidden for t in lay.fmap_inputs):
            if lay.fmap_inputs and all(t in vectors for t in lay.fmap_inputs):
                vectors.update(t for t in lay.outputs if t)  # the tail on a pooled vector
                continue
            break
        walked.add(later)
        if _narrows(graph, lay, hidden, channels, axis):
            return hidden, walked, vectors, later
        if accumulated_input(graph, lay) in hidden and not _folds_channels(graph, lay):
            vectors.update(t for t in lay.outputs if t)
            continue
        if not _per_element(graph, lay, hidden, out):
            break
        hidden.append(lay.outputs[0])
    return hidden, walked, vectors, None


def _folds_channels(graph: Graph, lay: Layer) -> bool:
    """A reduction that folds channels with the rows and columns: no chunk of channels has
    a result of its own."""
    axes = folded_axes(graph, lay) or ()
    return bool(set(axes) - set(graph.layout(lay.fmap_inputs[0]).tiled_axes))


def _most_chunks(channels: int) -> int:
    """The largest power of two that cuts `channels` into that many distinct chunks."""
    most, k = 1, 2
    while k <= channels:
        if len(chunk_ranges(channels, k)) == k:
            most = k
        k *= 2
    return most


def _pools(graph: Graph, io: GroupIO, lay: Layer, hidden: Sequence[str], channels: int,
           axis: int) -> bool:
    """A reduction over the rows and columns of a hidden map that the group folds tile by
    tile (its accumulator: a pooling pass's pool, or a group ending in a global pool):
    each output channel from the same hidden channel."""
    x = accumulated_input(graph, lay)
    outs = [t for t in lay.outputs if t]
    if x is None or x not in hidden or len(outs) != 1 or outs[0] not in io.accumulated:
        return False
    return _channel_axis(graph, outs[0]) == axis and graph.shapes[outs[0]][axis] == channels


def _per_element(graph: Graph, lay: Layer, hidden: Sequence[str], like: str) -> bool:
    """A layer computing each hidden channel of its one output from the same channel of
    hidden maps, of vectors on chip whole (a squeeze-excite scale: one value per image and
    channel) and of constants that split (or broadcast) along the hidden channels (a
    per-element op, or a depthwise conv: its window may change the rows and columns)."""
    outs = [t for t in lay.outputs if t]
    spec = op_spec(lay.op)
    if len(outs) != 1 or not lay.fmap_inputs:
        return False
    axis = _channel_axis(graph, like)
    assert axis is not None
    channels = graph.shapes[like][axis]
    out_shape = graph.shapes[outs[0]]
    if graph.layout(outs[0]).kind != graph.layout(like).kind \
            or _channel_axis(graph, outs[0]) != axis or out_shape[axis] != channels:
        return False
    if spec.channel_local:
        same = all(graph.shapes[t] == out_shape if t in hidden
                   else _vector_axis(graph, t, len(out_shape), axis, channels) is not None
                   for t in lay.fmap_inputs)
        return same and all(constant_channel_axis(graph, c, len(out_shape), axis, channels) != -1
                            for c in _constants(lay))
    if any(t not in hidden for t in lay.fmap_inputs):
        return False
    local = spec.channel_local_if is not None and spec.local_chunk_axis is not None \
        and spec.channel_local_if(lay.attrs, graph.shapes[lay.fmap_inputs[0]][axis], channels)
    return local and all(_local_axis(graph, lay, c) is not None for c in _constants(lay))


def _local_axis(graph: Graph, lay: Layer, name: str) -> int | None:
    """The axis of a conditionally channel-local layer's constant along its channels."""
    spec = op_spec(lay.op)
    assert spec.local_chunk_axis is not None
    index = lay.inputs.index(name)
    return spec.local_chunk_axis(index, tuple(graph.constants[name].shape), lay.attrs) \
        if name in graph.constants else None


def _narrows(graph: Graph, lay: Layer, hidden: Sequence[str], channels: int, axis: int) -> bool:
    """A layer summing over the hidden channels of its one (data) input."""
    if narrow_axis(graph, lay, hidden) != axis:  # it sums along the axis the chunks cut
        return False
    spec = op_spec(lay.op)
    assert spec.in_chunk_axis is not None
    w = lay.inputs[1]
    cut = spec.in_chunk_axis(1, tuple(graph.constants[w].shape), lay.attrs)
    return cut is not None and int(graph.constants[w].shape[cut]) == channels


def _constants(lay: Layer) -> list[str]:
    return [t for t in lay.inputs if t and t not in lay.fmap_inputs]


def constant_channel_axis(graph: Graph, name: str, rank: int, axis: int, channels: int
                          ) -> int | None:
    """The axis of a per-element layer's constant that runs along the hidden channels
    (broadcast from the right), None when every chunk uses it whole, -1 when it can be
    neither (it varies along the channels with another extent)."""
    shape = tuple(graph.constants[name].shape) if name in graph.constants else ()
    at = axis - (rank - len(shape))
    if at < 0 or shape[at] == 1:
        return None
    return at if shape[at] == channels else -1


def _vector_axis(graph: Graph, t: str, rank: int, axis: int, channels: int) -> int | None:
    """The hidden-channel axis of a map that is one value per image and channel (rows and
    columns of extent 1, as a squeeze-excite scale): a per-element layer reads its chunk's
    slice of it; None for any other map."""
    shape = graph.shapes.get(t)
    if shape is None or len(shape) != rank or shape[axis] != channels:
        return None
    layout = graph.layout(t)
    if any(shape[a] != 1 for a in (layout.row_axis, layout.col_axis) if a is not None):
        return None
    return axis


def vector_axes(graph: Graph, s: Stretch, name: str) -> dict[str, int]:
    """The vectors a per-element stretch layer reads (maps that are not hidden: one value
    per image and channel), each with the axis its chunk's slice is cut along."""
    lay = graph.layer(name)
    if name in (s.widen, s.narrow) or s.cuts:
        return {}
    rank = len(graph.shapes[s.hidden[0]])
    return {t: s.axis for t in lay.fmap_inputs if t not in s.hidden
            and _vector_axis(graph, t, rank, s.axis, s.channels) is not None}


def constant_axes(graph: Graph, s: Stretch, name: str) -> dict[str, Cut | None]:
    """How each constant input of a stretch layer splits over the chunks: where its units
    sit, or None where every chunk uses it whole (a scalar, the narrowing layer's bias,
    added with the first chunk only)."""
    lay = graph.layer(name)
    if s.cuts:
        cuts = dict(s.cuts)
        return {c: cuts.get(c) for c in _constants(lay)}
    return {c: None if a is None else Cut(a) for c, a in _plain_axes(graph, s, lay).items()}


def _plain_axes(graph: Graph, s: Stretch, lay: Layer) -> dict[str, int | None]:
    name = lay.name
    if name == s.widen:
        split = chunk_axes(graph, lay)
        assert split is not None
        return {c: split[1].get(c) for c in _constants(lay)}
    if name == s.narrow and s.pools:  # a pool: its constants (axes) are not cut
        return {c: None for c in _constants(lay)}
    if name == s.narrow:
        spec = op_spec(lay.op)
        assert spec.in_chunk_axis is not None
        return {c: spec.in_chunk_axis(i, tuple(graph.constants[c].shape), lay.attrs)
                if c in graph.constants else None
                for i, c in enumerate(lay.inputs) if c in _constants(lay)}
    spec = op_spec(lay.op)
    if not spec.channel_local and spec.local_chunk_axis is not None:  # a depthwise conv
        return {c: _local_axis(graph, lay, c) for c in _constants(lay)}
    rank = len(graph.shapes[s.hidden[0]])
    return {c: constant_channel_axis(graph, c, rank, s.axis, s.channels) for c in _constants(lay)}


def stream_holds(loads: Sequence[tuple[Sequence[int], int]]) -> list[int]:
    """Weight bytes on chip at each step of a stream of (loads at the step, bytes held
    through it besides): a load stays while the next one arrives behind it (a step without
    loads holds the next one as it arrives)."""
    held = [0] * len(loads)
    upcoming = 0
    for i in range(len(loads) - 1, -1, -1):
        own, keep = loads[i]
        behind = [*own[1:], upcoming] if own else []
        held[i] = keep + max((a + b for a, b in zip(own, behind, strict=True)),
                             default=upcoming)
        if own:
            upcoming = own[0]
    return held


def stretch_loads(stretch: Stretch, chunks: int, cut: Mapping[tuple[str, int], int],
                  whole: int, runs: int = 1) -> list[tuple[list[int], int]]:
    """The stream steps of one stretch, chunk by chunk and layer by layer: each layer's
    slice for the chunk (`cut`, by layer and chunk), the uncut bytes (`whole`) with the
    first load and held through every later step. The widening layer's slice arrives in
    `runs` equal loads (widen_runs), each computed before the next is needed."""
    out: list[tuple[list[int], int]] = []
    for j in range(stretch_chunks(stretch, chunks)):
        for name in stretch.layers:
            first = j == 0 and name == stretch.widen
            size = cut.get((name, j), 0)
            parts = [size // runs] * runs if name == stretch.widen and size else [size]
            parts[0] += whole if first else 0
            out.append(([p for p in parts if p], 0 if first else whole))
    return out


def widen_runs(graph: Graph, s: Stretch) -> int:
    """In how many loads a chunk's slice of the widening layer's weights streams: one per
    run of its units where each of its cut constants and its output hold the units in the
    same number of runs along its output channels (a qkv projection's q, k and v of the
    chunk's heads: Cut.outer), else one. Each run computes its own output channels, so
    only one run's weights need be on chip beside the next one's."""
    if not s.cuts:
        return 1
    lay = graph.layer(s.widen)
    out = lay.outputs[0]
    cut = s.cut_of(out)
    rank = len(graph.shapes[out])
    if cut.outer == 1 or cut.axis % rank != op_spec(lay.op).chunk_out_axis % rank:
        return 1
    consts = [c for c in constant_axes(graph, s, s.widen).values() if c is not None]
    return cut.outer if consts and all(c.outer == cut.outer for c in consts) else 1


def widening_layers(graph: Graph, s: Stretch) -> tuple[str, ...]:
    """The stretch's layers that read the widening layer's input: the widening layer and
    its siblings (planner.geometry.heads.sibling), in order. Each chunk reads that input
    once per layer; it stays on chip until the last of them has run the last chunk.
    Asked for every tile costed: worked out once per stretch."""
    key = ("widening_layers", s.widen, s.mids)
    if key not in graph.derived:
        widen = graph.layer(s.widen)
        graph.derived[key] = (s.widen, *(n for n in s.mids
                                         if sibling(graph, widen, graph.layer(n))))
    return graph.derived[key]  # type: ignore[return-value]


@dataclass(frozen=True)
class SkipFold:
    """A residual Add folded into a stretch's accumulator: the accumulator starts from the
    skip map (its first chunk adds its partial sums to the skip, not to zeros), so the skip
    and the accumulator are never on chip side by side, and the Add that follows the
    narrowing layer finds its sum made (it adds nothing more)."""

    skip: str  # the map the accumulator starts from; off chip from then on
    add: str  # the Add reading the accumulator and the skip, right after the stretch


def folded_skip(graph: Graph, io: GroupIO, s: Stretch) -> SkipFold | None:
    """The residual Add a stretch's accumulator takes in (None: none). A transformer's
    attention and MLP halves end in `x + proj(...)`: while the halves run in hidden chunks,
    the residual `x` and the projection's partial sums would each take a whole map's room,
    the accumulator starting from `x` takes one. It holds when the layers right after the
    narrowing one are bias Adds (a constant added: as well to the sum with the skip) and an
    Add of what they made (each read by nothing else, not stored) and a map of the same
    dims made inside the group before the stretch, which no layer reads between the
    widening layer and the Add and the group does not store (what the Add writes is then
    the accumulator itself). Worked out once per stretch and group."""
    key = ("folded_skip", io, s)
    if key not in graph.derived:
        graph.derived[key] = _folded_skip(graph, io, s)
    return graph.derived[key]  # type: ignore[return-value]


def _folded_skip(graph: Graph, io: GroupIO, s: Stretch) -> SkipFold | None:
    if s.pools:
        return None
    b = io.layers.index(s.narrow)
    acc = s.out
    while True:  # past the bias Adds (one map and a constant): they add alike to the skip
        if b + 1 >= len(io.layers) or acc in io.outputs \
                or tuple(graph.consumers.get(acc, ())) != (io.layers[b + 1],):
            return None
        add = graph.layer(io.layers[b + 1])
        ins = add.fmap_inputs
        if add.op != "Add" or acc not in ins:
            return None
        if len(ins) == 2 and ins[0] != ins[1]:
            break
        if len(ins) != 1 or graph.dims(add.outputs[0]) != graph.dims(acc):
            return None
        b, acc = b + 1, add.outputs[0]
    skip = ins[1] if ins[0] == acc else ins[0]
    producer = graph.producer.get(skip)
    a = io.layers.index(s.widen)
    if producer not in io.layers or io.layers.index(producer) >= a or skip in io.outputs \
            or skip in io.in_place:
        return None
    if not graph.dims(skip) == graph.dims(acc) == graph.dims(add.outputs[0]) \
            or graph.shapes[skip] != graph.shapes[acc] or graph.shapes[acc] != graph.shapes[s.out] \
            or not graph.layout(skip) == graph.layout(acc) == graph.layout(add.outputs[0]):
        return None
    if any(skip in graph.layer(n).fmap_inputs for n in io.layers[a:b + 1]):
        return None
    if any(skip in graph.layer(n).fmap_inputs for n in io.layers[b + 2:]):
        return None
    return SkipFold(skip, add.name)


def hidden_ranges(s: Stretch, chunks: int) -> list[tuple[int, int]]:
    """The hidden-channel range of each chunk of the stretch in a group run in `chunks`
    hidden chunks (stretch_chunks): equal ones of ceil(C / its chunks), the last possibly
    shorter (planner.ir.chunks.chunk_ranges)."""
    return chunk_ranges(s.channels, stretch_chunks(s, chunks))


def makes_chunks(s: Stretch, chunks: int) -> bool:
    """Whether the stretch's hidden channels make exactly `chunks` equal chunks of
    ceil(C / chunks) (the last possibly shorter)."""
    return len(chunk_ranges(s.channels, chunks)) == chunks


def stretch_chunks(s: Stretch, chunks: int) -> int:
    """The chunks a stretch runs in when its group's count is `chunks`: that many where its
    channels make them, else the most below that they make. A decoder layer's attention
    cut in its 2 key heads and its MLP in 8 chunks of 4,864 hidden channels share one
    group: the count is the MLP's, the attention runs in its 2."""
    return channel_chunks(s.channels, chunks)


def channel_chunks(channels: int, chunks: int) -> int:
    """stretch_chunks of a stretch of `channels` hidden channels (or units). Chunks of
    ceil(C / k) make ceil(C / ceil(C / k)) = m <= k of them, and every count between m and
    k makes m too: from k, step to m until a count makes itself (a few steps, not one
    try per count)."""
    k = max(1, min(chunks, channels))
    while (made := -(-channels // -(-channels // k))) != k:
        k = made
    return k


def chunk_options(s: Sequence[Stretch]) -> list[int]:
    """Chunk counts worth trying for a group's stretches: 2, 4, 8, ... and, where the group
    runs attention in head chunks, every count that cuts its heads evenly (12 heads: 3, 6,
    12), each a count at least one stretch makes exactly; the others run in the most they
    make below it (stretch_chunks)."""
    if not s:
        return []
    most = max(x.channels for x in s)
    wanted: set[int] = set()
    k = 2
    while k <= most:
        wanted.add(k)
        k *= 2
    for x in s:
        if x.cuts:
            wanted.update(d for d in range(2, x.channels + 1) if x.channels % d == 0)
    return sorted(k for k in wanted if any(makes_chunks(x, k) for x in s))
