"""End chunks: a group whose input and output are never on chip whole, only the maps between.

A chain of matrix products keeps its intermediate maps on chip while the two ends stream:
the first layer reads the group's input in chunks of its input channels (the channels it
sums over), each chunk with the matching rows of its weights, and adds each chunk's partial
sums into its output, which stays on chip; the last layer computes its output in chunks of
its output channels (each from the whole map before it and a slice of its weights) and
writes each chunk to DRAM as soon as it is made. Per tile the DRAM traffic is that of the
same tile run whole (every input element and every weight read once per tile, every output
element written once); what changes is what the chip holds: the maps between the ends
whole, the ends a chunk at a time. This is the fused mapping a loop-nest mapper finds for a
MatMul chain (the reduction loop of the first product outermost, the output-channel loop of
the last one outermost, the intermediate retained): with the ends streamed, a group's tile
can cover every token, so that each weight is read once.

A group whose first layer is no such product (a norm, a view, or the last layer itself)
streams its output end alone: its inputs are loaded whole and held, and its last layer
writes its output a chunk of output channels at a time. That is the weights-outer order of
the last layer with its input retained: a projection whose output does not fit beside its
input (a qkv projection, three maps wide) reads its input and every weight once, where
tiles of rows would read the weights once per tile. Either way, per-element layers after
the last one (its tail: an exporter's bias Add, an activation) run on each chunk of its
output before the chunk is stored, their per-channel constants sliced alike.

This module finds a group's ends and the weight bytes on chip at each step; planner.cost.ends
prices a group run so, emulator.ends runs it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fuseplan.planner.geometry.attention import online_attention
from fuseplan.planner.geometry.hidden import constant_channel_axis, stream_holds
from fuseplan.planner.geometry.regions import GroupIO, in_group_uses
from fuseplan.planner.ir.chunks import chunk_axes, chunk_ranges
from fuseplan.planner.ir.graph import Graph, Layer
from fuseplan.planner.ir.ops import op_spec


@dataclass(frozen=True)
class Ends:
    """The layers of a group that stream its input and its output in channel chunks: a first
    end (or none), the last layer and its tail."""

    # reads `source` a chunk of its input channels at a time, summing into its output; None:
    # the output end streams alone, the group's inputs held whole
    first: str | None
    source: str | None  # the group input it reads so
    reduced: int  # the input channels the first layer sums over (0: no first end)
    last: str  # computes its output a chunk of its output channels at a time
    sink: str  # the group output written so: the last layer's, or its tail's
    produced: int  # the last layer's output channels
    # per-element layers after the last one, run on each chunk of its output (a bias Add,
    # an activation): the last of them makes `sink`
    tail: tuple[str, ...] = ()

    @property
    def layers(self) -> tuple[str, ...]:
        return (*(() if self.first is None else (self.first,)), self.last, *self.tail)

    @property
    def start(self) -> int:
        """The index of the group's first layer run on its whole box (1 after a first end)."""
        return 0 if self.first is None else 1

    def source_ranges(self, chunks: int) -> list[tuple[int, int]]:
        """The input-channel range of each chunk of the first layer (none without one)."""
        return [] if self.first is None else chunk_ranges(self.reduced, chunks)

    def sink_ranges(self, chunks: int) -> list[tuple[int, int]]:
        """The output-channel range of each chunk of the last layer."""
        return chunk_ranges(self.produced, chunks)

    def makes_chunks(self, chunks: int) -> bool:
        """Whether each end splits into exactly `chunks` chunks of ceil(C / chunks) (the last
        possibly shorter): a count a plan may state."""
        return len(self.sink_ranges(chunks)) == chunks \
            and (self.first is None or len(self.source_ranges(chunks)) == chunks)

    @property
    def most_chunks(self) -> int:
        """The channels of the narrower end: no count above it makes chunks."""
        return self.produced if self.first is None else min(self.reduced, self.produced)


def _product_weight(graph: Graph, lay: Layer) -> str | None:
    """The constant [K, N] matrix a MatMul multiplies its one map by (on the right), or
    None: only such a product sums over its input's last axis with a weight row per input
    channel."""
    if lay.op != "MatMul" or len(lay.inputs) != 2 or len(lay.fmap_inputs) != 1 \
            or lay.inputs[0] != lay.fmap_inputs[0] or lay.inputs[1] not in lay.weights:
        return None
    w = lay.inputs[1]
    return w if len(graph.constants[w].shape) == 2 else None


def _channels_last_whole(graph: Graph, tensor: str) -> bool:
    """Whether a map's last axis is its channels: never cut by a tile (the layout tiles its
    batch, rows and columns only)."""
    shape = graph.shapes[tensor]
    layout = graph.layout(tensor)
    last = len(shape) - 1
    return last not in (layout.batch_axis, layout.row_axis, layout.col_axis)


def output_end(graph: Graph, io: GroupIO) -> tuple[int, tuple[str, ...]] | None:
    """(index of the last layer computed in output-channel chunks, every weight of it cut by
    them; the per-element layers after it, its tail) of a group, or None. The tail's layers
    compute each output channel from the same channel of the maps made from the last
    layer's output and of constants per channel or broadcast (a bias, an Erf-GELU), each
    map as large as that output."""
    for at in range(len(io.layers) - 1, -1, -1):
        lay = graph.layer(io.layers[at])
        split = chunk_axes(graph, lay)
        if split is not None and set(split[1]) == set(lay.weights):
            break
        if split is not None or not op_spec(lay.op).channel_local:
            return None
    else:
        return None
    out = lay.outputs[0]
    if len([t for t in lay.outputs if t]) != 1:
        return None
    shape = graph.shapes[out]
    axis = op_spec(lay.op).chunk_out_axis % len(shape)
    made = {out}
    for name in io.layers[at + 1:]:
        step = graph.layer(name)
        outs = [t for t in step.outputs if t]
        consts = [c for c in step.inputs if c and c not in step.fmap_inputs]
        # a constant of the last layer's too would be sliced for it, not for the tail
        if len(outs) != 1 or graph.shapes[outs[0]] != shape \
                or any(t not in made for t in step.fmap_inputs) \
                or any(c in lay.weights or constant_channel_axis(
                    graph, c, len(shape), axis, split[0]) == -1 for c in consts):
            return None
        made.add(outs[0])
    return at, io.layers[at + 1:]


def tail_axes(graph: Graph, ends: Ends, name: str) -> dict[str, int | None]:
    """How each constant of a tail layer splits over the output chunks: its axis along the
    last layer's output channels, None where every chunk uses it whole (a scalar)."""
    lay = graph.layer(name)
    shape = graph.shapes[ends.sink]
    axis = op_spec(graph.layer(ends.last).op).chunk_out_axis % len(shape)
    return {c: constant_channel_axis(graph, c, len(shape), axis, ends.produced)
            for c in lay.inputs if c and c not in lay.fmap_inputs}


def tail_constants(graph: Graph, ends: Ends) -> dict[str, int | None]:
    """Every constant the output end's tail reads, once (a constant two of its layers share
    is one array on chip), with its axis along the last layer's output channels (None: each
    chunk uses it whole)."""
    found: dict[str, int | None] = {}
    for name in ends.tail:
        for c, axis in tail_axes(graph, ends, name).items():
            found.setdefault(c, axis)
    return found


def tail_steps(graph: Graph, io: GroupIO, ends: Ends, steps: Sequence[tuple[str, ...]]
               ) -> list[tuple[str, ...]]:
    """The live steps of a group (planner.cost.model.live_steps) as a chunk of its output end
    other than the last holds them: the last layer's inputs stay whole through the tail's
    steps, for the next chunk reads them again."""
    at = io.layers.index(ends.last)
    reads = tuple(dict.fromkeys(graph.layer(ends.last).fmap_inputs))
    return [tuple(live) if i <= at else (*live, *(t for t in reads if t not in live))
            for i, live in enumerate(steps)]


def chunked_maps(graph: Graph, ends: Ends) -> tuple[str, ...]:
    """The maps on chip a chunk at a time at the output end: the last layer's output and
    its tail's."""
    return (graph.layer(ends.last).outputs[0],
            *(graph.layer(n).outputs[0] for n in ends.tail))


def chunked_ends(graph: Graph, io: GroupIO) -> Ends | None:
    """The ends of a group that can stream them, or None. Its last layer computed in
    output-channel chunks (planner.ir.chunks), every weight of it cut by them, may be
    followed only by per-element layers (its tail, output_end); the group's one output is
    made there and read by none of its layers; no reduction folded over tiles
    and no fused attention streaming its keys. Its first layer is a first end where the
    group has two layers at least and that layer is a MatMul by constant weights whose map
    is a group input read by no other layer of the group, with its channels last and whole.
    Else the output end streams alone where its channels are last and whole (token maps,
    whose projections read weights large beside the maps; a conv's row tiles share each
    weight read over a round of tiles already)."""
    if len(io.outputs) != 1 or io.accumulated or online_attention(graph, io) is not None:
        return None
    found = output_end(graph, io)
    if found is None:
        return None
    at, tail = found
    last = graph.layer(io.layers[at])
    sink = graph.layer(io.layers[-1]).outputs[0]
    split = chunk_axes(graph, last)
    assert split is not None  # output_end found it so
    uses = in_group_uses(graph, io)
    if io.outputs != (sink,) or uses.get(sink, 0):
        return None
    first = graph.layer(io.layers[0])
    w = _product_weight(graph, first) if at > 0 else None
    source = first.fmap_inputs[0] if w is not None else None
    if w is not None and source in io.inputs and uses.get(source, 0) == 1 \
            and source not in io.outputs and _channels_last_whole(graph, source):
        return Ends(first.name, source, int(graph.constants[w].shape[0]), last.name, sink,
                    split[0], tail)
    if not _channels_last_whole(graph, sink):
        return None
    return Ends(None, None, 0, last.name, sink, split[0], tail)


def chunk_options(ends: Ends) -> list[int]:
    """The chunk counts a plan may state, fewest first: powers of two each end makes."""
    out, k = [], 2
    while k <= ends.most_chunks:
        if ends.makes_chunks(k):
            out.append(k)
        k *= 2
    return out


@dataclass(frozen=True)
class EndStream:
    """Streamed weight bytes on chip at every step of a tile of a group run with end chunks:
    the first layer's row slices chunk by chunk, the layers between as they always stream
    (their output-channel chunks), the last layer's column slices chunk by chunk."""

    first: tuple[int, ...]  # per chunk of the first layer (none without a first end)
    middle: tuple[int, ...]  # per layer between the ends (from the first, without one)
    last: tuple[int, ...]  # per chunk of the last layer (its tail's constants with it)

    @property
    def most(self) -> int:
        return max((*self.first, *self.middle, *self.last), default=0)

    def by_step(self, tail: int) -> tuple[int, ...]:
        """Per layer of the group: the most on chip while it runs, any chunk (`tail`: the
        layers after the last one, which run with its chunks' weights)."""
        return (*((max(self.first),) if self.first else ()), *self.middle,
                *(max(self.last),) * (1 + tail))


def end_stream(first: Sequence[int], middle: Sequence[Sequence[int]], last: Sequence[int]
               ) -> EndStream:
    """The bytes on chip at each step from each load's size: the first layer's slices, each
    middle layer's loads, the last layer's slices (each load double-buffered behind the one
    before: planner.geometry.hidden.stream_holds)."""
    loads = [([size], 0) for size in first] + [(list(sizes), 0) for sizes in middle] \
        + [([size], 0) for size in last]
    held = stream_holds(loads)
    a, b = len(first), len(first) + len(middle)
    return EndStream(tuple(held[:a]), tuple(held[a:b]), tuple(held[b:]))
