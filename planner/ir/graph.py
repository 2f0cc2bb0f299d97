"""The layer-graph IR: frozen layers, their op classes and their row/column maps.

A layer is one remaining compute node of the cleaned ONNX graph. Feature maps
are the non-constant tensors; every float constant input of a compute layer is
a weight. Each feature map has a layout (planner.ir.layout) saying which axes tiles
cut it along; per-op facts live in the op table (planner.ir.ops).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property
from math import prod
from typing import Any

import networkx as nx

from fuseplan.planner.ir.layout import Layout, layout_of
from fuseplan.planner.ir.ops import VIEW_OPS
from fuseplan.planner.ir.ops import OpClass as OpClass


class MapKind(StrEnum):
    """How an output range along one spatial axis maps to an input range."""

    IDENTITY = "identity"  # row r needs row r (elementwise, concat on channels...)
    WINDOW = "window"  # conv / pool: [lo*s - p, (hi-1)*s - p + (k-1)*d + 1)
    UPSAMPLE = "upsample"  # nearest, integer factor f: row r needs row r // f
    TRANSPOSED = "transposed"  # ConvTranspose: rows whose scattered window reaches [lo, hi)
    OFFSET = "offset"  # Slice, Concat along rows: row r needs row r - pad (clipped)
    # causal keys and values of a fused attention: query row r sees keys [0, r + 1 - pad]
    # (pad: queries minus keys, 0 in a prefill), so rows [lo, hi) need [0, hi - pad)
    PREFIX = "prefix"
    WHOLE = "whole"  # needs the whole input axis (global pooling, Gemm, flatten...)


@dataclass(frozen=True)
class CacheAppend:
    """A KV cache that a decode step appends to in place (planner.front.kv_cache): the model
    output `output` is the cache input `cache` followed, along `axis`, by the new
    positions `new`. The cache's buffer holds both, so the plan writes only `new` (a DRAM
    tensor like any other) and never copies the cache; `output` is that buffer, a view."""

    output: str
    cache: str
    new: str
    axis: int


@dataclass(frozen=True)
class AxisMap:
    """Row (or column) map of one feature-map input of a layer."""

    kind: MapKind
    kernel: int = 1
    stride: int = 1
    pad: int = 0  # padding before the first row
    dilation: int = 1

    @property
    def whole_strides(self) -> bool:
        """A window as wide as its stride, unpadded and undilated: a range of outputs reads
        whole strides of the input (a row-major split's leading axis; one element for one
        at kernel 1)."""
        return self.kind is MapKind.WINDOW and self.kernel == self.stride \
            and self.pad == 0 and self.dilation == 1

    def needed(self, lo: int, hi: int, in_len: int) -> tuple[int, int]:
        """Input range [a, b) needed for output range [lo, hi), before clipping to the input."""
        k, s, p, d = self.kernel, self.stride, self.pad, self.dilation
        if self.kind is MapKind.IDENTITY:
            return lo, hi
        if self.kind is MapKind.WINDOW:
            return lo * s - p, (hi - 1) * s - p + (k - 1) * d + 1
        if self.kind is MapKind.UPSAMPLE:
            return lo // s, (hi - 1) // s + 1
        if self.kind is MapKind.OFFSET:
            return lo - p, hi - p
        if self.kind is MapKind.PREFIX:
            return 0, hi - p
        if self.kind is MapKind.TRANSPOSED:
            # output row o receives input row i when o = i*s - p + j*d for some 0 <= j < k
            first = -((-(lo + p - (k - 1) * d)) // s)
            return first, (hi - 1 + p) // s + 1
        return 0, in_len

    def label(self) -> str:
        """A short name for tables: 'identity', 'window k3 s2 p1', 'upsample 8', 'offset -3'."""
        if self.kind is MapKind.UPSAMPLE:
            return f"upsample {self.stride}"
        if self.kind is MapKind.OFFSET:
            return f"offset {self.pad:+d}"
        if self.kind is MapKind.PREFIX:
            return "prefix" if self.pad == 0 else f"prefix {-self.pad:+d}"
        if self.kind in (MapKind.WINDOW, MapKind.TRANSPOSED):
            dilated = f" d{self.dilation}" if self.dilation != 1 else ""
            return f"{self.kind.value} k{self.kernel} s{self.stride} p{self.pad}{dilated}"
        return self.kind.value

    def virtual_start(self, in_lo: int) -> int:
        """Output row at which a kernel run on inputs starting at in_lo begins (a sliding
        window's tile passes its own pads instead; a WINDOW map of a movement op gathers
        whole strides of rows, or shifts them)."""
        if self.kind is MapKind.WINDOW:
            return (in_lo + self.pad) // self.stride
        if self.kind is MapKind.OFFSET:
            return in_lo + self.pad
        if self.kind is MapKind.UPSAMPLE:
            return in_lo * self.stride
        if self.kind is MapKind.TRANSPOSED:
            return in_lo * self.stride - self.pad
        if self.kind in (MapKind.WHOLE, MapKind.PREFIX):
            return 0
        return in_lo


WHOLE = AxisMap(MapKind.WHOLE)
IDENTITY = AxisMap(MapKind.IDENTITY)


@dataclass(frozen=True)
class Layer:
    """One compute node of the model."""

    name: str
    op: str
    op_class: OpClass
    attrs: Mapping[str, Any]
    inputs: tuple[str, ...]  # every input, '' where an optional input is absent
    outputs: tuple[str, ...]
    fmap_inputs: tuple[str, ...]  # the non-constant inputs, in input order
    weights: tuple[str, ...]  # float constant inputs that are weights
    weight_elems: int
    out_shape: tuple[int, ...]  # shape of outputs[0]
    macs_per_output: int  # MACs (main layers) or vector ops (others) per output element
    row_maps: tuple[AxisMap, ...]  # one per fmap input
    col_maps: tuple[AxisMap, ...]
    # every fmap input's batch axis maps to the output's, element for element
    batch_preserving: bool
    opset: int = 13

    @property
    def macs(self) -> int:
        """MACs (or vector ops) of the whole layer."""
        return self.macs_per_output * prod(self.out_shape)

    @property
    def is_main(self) -> bool:
        return self.op_class is OpClass.MAIN

    @property
    def kernel_hw(self) -> tuple[int, int, int, int]:
        """(k_y, s_y, k_x, s_x) of a conv/pool layer, as stride redundancy needs them."""
        if self.row_maps and self.row_maps[0].kind is MapKind.WINDOW:
            r, c = self.row_maps[0], self.col_maps[0]
            return (
                (r.kernel - 1) * r.dilation + 1, r.stride, (c.kernel - 1) * c.dilation + 1, c.stride
            )
        return 1, 1, 1, 1



@dataclass(frozen=True)
class Block:
    """A single-entry/single-exit subgraph with internal branches (seed 000 ¶91-93)."""

    id: int
    entry: str  # layer whose output feeds the block (or '' for a graph input)
    exit: str  # layer that joins the branches
    layers: tuple[str, ...]  # layers strictly after entry up to and including exit


@dataclass(frozen=True)
class Graph:
    """A model as layers, tensors and the layer DAG."""

    name: str
    layers: tuple[Layer, ...]  # topological order
    shapes: Mapping[str, tuple[int, ...]]  # every tensor
    constants: Mapping[str, Any]  # name -> numpy array (weights and parameters)
    inputs: tuple[str, ...]  # real model inputs
    outputs: tuple[str, ...]
    producer: Mapping[str, str]  # tensor -> producing layer
    consumers: Mapping[str, tuple[str, ...]]  # tensor -> consuming layers
    dag: nx.DiGraph = field(compare=False)
    blocks: tuple[Block, ...] = ()
    opset: int = 13
    # layouts the front end propagated (a channels-last stretch after a Transpose); every
    # other tensor's layout is inferred from its shape (planner.ir.layout.layout_of)
    given_layouts: Mapping[str, Layout] = field(default_factory=dict, compare=False)
    # model outputs that are a cache input with new positions appended in place: not in
    # `outputs` (the plan writes their `new` part, which is)
    appends: tuple[CacheAppend, ...] = ()
    # tensors the front end reads in a finer shape than the model's (a folded batch on an
    # axis of its own: planner.front.batch_unmerge), with the model's shape: the same
    # elements in the same order, compared with a reference in that shape
    model_shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict, compare=False)

    @cached_property
    def _by_name(self) -> dict[str, Layer]:
        return {lay.name: lay for lay in self.layers}

    @cached_property
    def derived(self) -> dict[object, object]:
        """What the searches work out from the graph alone, again and again (where the
        heads of an attention stretch sit: planner.geometry.heads), filled as asked."""
        return {}

    @cached_property
    def _position(self) -> dict[str, int]:
        return {lay.name: i for i, lay in enumerate(self.layers)}

    @cached_property
    def weight_users(self) -> dict[str, int]:
        """How many layers use each weight tensor (rule 9 asks per candidate group)."""
        users: dict[str, int] = {}
        for lay in self.layers:
            for w in lay.weights:
                users[w] = users.get(w, 0) + 1
        return users

    @cached_property
    def row_gathers(self) -> Mapping[str, str]:
        """Per output of a layer that gathers rows of a constant table by run-time indices
        (a word embedding: a Gather along axis 0 of a constant, its indices a feature map),
        that table's name.

        The one definition the cost model, the floors and the emulator share: such a layer
        reads from DRAM, each time it runs on a box, exactly the rows its box's indices
        select, so the elements of its output box (index count x row elements), never the
        whole table. A repeated index fetches its row again, as a DMA gather does: the count
        depends on the index count alone, not on the index values, so it is known at plan time.
        """
        return {lay.outputs[0]: lay.inputs[0] for lay in self.layers if gathers_rows(lay)}

    def gathered(self, layers: Iterable[str]) -> list[str]:
        """The outputs of `layers` that are gathered rows of a constant table (row_gathers)."""
        rows = self.row_gathers
        return [t for name in layers if (t := self.layer(name).outputs[0]) in rows]

    @cached_property
    def layer_blocks(self) -> dict[str, tuple[int, ...]]:
        """Indices into ``blocks`` of the blocks holding each layer (a group's structural
        rules look only at the blocks its layers are in)."""
        found: dict[str, list[int]] = {}
        for i, block in enumerate(self.blocks):
            for name in block.layers:
                found.setdefault(name, []).append(i)
        return {name: tuple(ids) for name, ids in found.items()}

    @cached_property
    def layouts(self) -> Mapping[str, Layout]:
        """The layout of every tensor, inferred once per graph from its shape."""
        return {t: self.given_layouts.get(t) or layout_of(shape)
                for t, shape in self.shapes.items()}

    def layout(self, tensor: str) -> Layout:
        """The layout of a tensor (which axes are batch, channels, rows and columns)."""
        return self.layouts[tensor]

    def layer(self, name: str) -> Layer:
        """The layer called name (KeyError names it)."""
        return self._by_name[name]

    def index(self, name: str) -> int:
        """Position of a layer in the topological order."""
        return self._position[name]

    def group_size(self, layers: Iterable[str]) -> int:
        """The layers of a group that count toward search.max_group_layers: all but views
        (planner.ir.ops.VIEW_OPS)."""
        return sum(1 for n in layers if not self._view[self._position[n]])

    def within_limit(self, layers: Sequence[str], limit: int) -> bool:
        """Whether a group is no longer than the intervals interval_ends gives: at most
        `limit` layers that compute, and at most a third more in all."""
        return self.group_size(layers) <= limit and len(layers) <= _longest(limit)

    def interval_ends(self, limit: int) -> tuple[int, ...]:
        """For each position i of the layer order, the end j (exclusive) of the longest
        interval [i, j) of at most `limit` layers by group_size (views ride along free) and
        at most a third more layers in all (a tile search's cost grows with a group's
        length); worked out once per limit (every start of a deep chain asks)."""
        if limit in self._interval_ends:
            return self._interval_ends[limit]
        ends, j, size = [], 0, 0
        most = _longest(limit)
        for i in range(len(self.layers)):
            while j < len(self.layers) and j - i < most \
                    and size + (not self._view[j]) <= limit:
                size += not self._view[j]
                j += 1
            ends.append(j)
            size -= j > i and not self._view[i]
        self._interval_ends[limit] = tuple(ends)
        return self._interval_ends[limit]

    @cached_property
    def _interval_ends(self) -> dict[int, tuple[int, ...]]:
        return {}

    @cached_property
    def _view(self) -> tuple[bool, ...]:
        return tuple(lay.op in VIEW_OPS for lay in self.layers)

    @cached_property
    def _dims(self) -> dict[str, tuple[int, int, int, int]]:
        return {}

    def dims(self, tensor: str) -> tuple[int, int, int, int]:
        """(N, C, H, W) of a tensor by its layout (channel axes multiplied together, 1 for an
        axis it does not have)."""
        got = self._dims.get(tensor)
        if got is None:
            got = self._dims[tensor] = self.layout(tensor).dims(self.shapes[tensor])
        return got

    def elems(self, tensor: str) -> int:
        """Number of elements of a tensor."""
        return prod(self.shapes[tensor])

    def block_of(self, layer: str) -> Block | None:
        """The innermost block containing a layer."""
        best: Block | None = None
        for b in self.blocks:
            if layer in b.layers and (best is None or len(b.layers) < len(best.layers)):
                best = b
        return best


def gathers_rows(lay: Layer) -> bool:
    """Whether a layer gathers rows of a constant table by run-time indices (Graph.row_gathers):
    a Gather along axis 0 whose data is a constant and whose indices are its one feature map.
    Constant indices were folded away at load; a Gather of a run-time tensor moves a map."""
    return (lay.op == "Gather" and int(lay.attrs.get("axis", 0)) == 0
            and len(lay.inputs) >= 2 and bool(lay.inputs[0])
            and lay.inputs[0] not in lay.fmap_inputs and lay.fmap_inputs == (lay.inputs[1],))


def _longest(limit: int) -> int:
    """Layers in all an interval of `limit` layers that compute may hold: a third more."""
    return limit + limit // 3
