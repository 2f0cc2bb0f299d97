"""Cleaned ONNX model -> layer graph (planner.ir.graph.Graph)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

import networkx as nx
import numpy as np
import onnx
from onnx import numpy_helper

from fuseplan.planner.core.budget import Budget
from fuseplan.planner.core.errors import InputError
from fuseplan.planner.front.attention_fusion import OP_TYPE as ATTENTION_OP
from fuseplan.planner.front.attention_fusion import fuse_attention
from fuseplan.planner.front.axes import layer_maps, node_index_maps
from fuseplan.planner.front.batch_unmerge import BatchRestatement
from fuseplan.planner.front.blocks import find_blocks
from fuseplan.planner.front.fills import stored_array
from fuseplan.planner.front.kv_cache import append_caches
from fuseplan.planner.front.onnx_load import LoadedModel
from fuseplan.planner.front.sliding import (
    sliding_window,
    with_kernel_shape,
)
from fuseplan.planner.front.stretches import find_stretches
from fuseplan.planner.ir.graph import WHOLE, Graph, Layer
from fuseplan.planner.ir.index_maps import IndexMap
from fuseplan.planner.ir.layout import (
    Layout,
    boxed,
    carried,
    landed_batch,
    layout_of,
    ncl,
    nhwc,
    regrouped_layout,
    tokens,
)
from fuseplan.planner.ir.ops import (
    AxisMove,
    MapRule,
    OpClass,
    OpSpec,
    op_spec,
)


def node_attrs(node: onnx.NodeProto) -> dict[str, Any]:
    """Attributes as plain Python values (bytes decoded, tensors as numpy)."""
    out: dict[str, Any] = {}
    for a in node.attribute:
        v = onnx.helper.get_attribute_value(a)
        if isinstance(v, bytes):
            v = v.decode()
        elif isinstance(v, onnx.TensorProto):
            v = numpy_helper.to_array(v)
        elif isinstance(v, list) and v and isinstance(v[0], bytes):
            v = [x.decode() for x in v]
        out[a.name] = v
    return out


def _tensor_shapes(proto: onnx.ModelProto) -> dict[str, tuple[int, ...]]:
    shapes: dict[str, tuple[int, ...]] = {}
    g = proto.graph
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        dims = vi.type.tensor_type.shape.dim
        if vi.type.tensor_type.HasField("shape"):
            shapes[vi.name] = tuple(int(d.dim_value) for d in dims)
    for init in g.initializer:
        shapes[init.name] = tuple(int(d) for d in init.dims)
    return shapes


# layers built between two looks at the time limit (a 20,000-node graph builds in ~2 s)
CHECK_EVERY = 1024

# ops whose output keeps an input's layout where its batch and rows pass through by the
# index map (per-element functions, per-token normalization and linear layers, products)
_KEEP_LAYOUT = frozenset({MapRule.LOCAL, MapRule.NORM, MapRule.LINEAR, MapRule.SOFTMAX,
                          MapRule.ATTENTION, MapRule.SLICE, MapRule.PAD, MapRule.REDUCE})
# and those that keep a token input's: joins along any axis but the batch, and windows
# one element wide along the tokens (a 1x1 conv of a sequence wherever its positions are,
# a pool over other axes) where nothing names the output
_KEEP_TOKENS = _KEEP_LAYOUT | {MapRule.CONCAT, MapRule.WINDOW}


def build_graph(model: LoadedModel, budget: Budget | None = None) -> Graph:
    """Turn a cleaned, shape-inferred model into the layer graph (OutOfTime where
    ``budget``'s limit passes between two steps)."""
    budget = budget or Budget()
    proto = model.proto
    shapes = _tensor_shapes(proto)
    constants = {init.name: stored_array(init) for init in proto.graph.initializer}
    layers: list[Layer] = []
    producer: dict[str, str] = {}
    consumers: dict[str, list[str]] = {}
    # only the layouts the shape alone does not imply: token stretches, 1-D sequences and
    # channels-last maps, by what the ops say of their axes (planner.front.stretches)
    found = find_stretches(proto.graph.node, shapes, constants, model.opset, node_attrs)
    layouts: dict[str, Layout] = dict.fromkeys(found.tokens, tokens())
    layouts.update(dict.fromkeys(found.lengths, ncl()))
    layouts.update(dict.fromkeys(found.channels_last, nhwc()))
    budget.check("finding token and channels-last stretches", model.path)
    nodes = fuse_attention(proto.graph.node, shapes, constants, model.outputs, model.opset)
    nodes, appends, outputs = append_caches(nodes, shapes, list(model.inputs), model.outputs,
                                            ATTENTION_OP)
    restated = BatchRestatement(nodes, shapes, constants, outputs)
    budget.check("fusing attention", model.path)
    for k, node in enumerate(nodes):
        if k % CHECK_EVERY == 0:
            budget.check(f"building layer {k:,} of {len(nodes):,}", model.path)
        layer = _layer(restated.restate(node, layouts), shapes, constants, model.opset,
                       model.path, layouts)
        layers.append(layer)
        for t in layer.outputs:
            producer[t] = layer.name
        for t in layer.fmap_inputs:
            consumers.setdefault(t, []).append(layer.name)
    dag = nx.DiGraph()
    dag.add_nodes_from(lay.name for lay in layers)
    for lay in layers:
        for t in lay.fmap_inputs:
            if t in producer:
                dag.add_edge(producer[t], lay.name, tensor=t)
    position = {lay.name: i for i, lay in enumerate(layers)}
    order = list(nx.lexicographical_topological_sort(dag, key=position.__getitem__))
    by_name = {lay.name: lay for lay in layers}
    ordered = tuple(by_name[n] for n in order)
    inputs = tuple(model.inputs)
    budget.check("ordering the layers", model.path)
    blocks = find_blocks(dag, ordered, inputs, outputs, producer)
    return Graph(
        name=model.path,
        layers=ordered,
        shapes=MappingProxyType(shapes),
        constants=MappingProxyType(constants),
        inputs=inputs,
        outputs=outputs,
        producer=MappingProxyType(producer),
        consumers=MappingProxyType({k: tuple(v) for k, v in consumers.items()}),
        dag=dag,
        blocks=blocks,
        opset=model.opset,
        given_layouts=MappingProxyType(layouts),
        appends=appends,
        model_shapes=MappingProxyType(dict(restated.original)),
    )


def _layer(node: onnx.NodeProto, shapes: Mapping[str, tuple[int, ...]],
           constants: Mapping[str, np.ndarray], opset: int, path: str,
           layouts: dict[str, Layout]) -> Layer:
    """The layer of one node; records its output's layout in `layouts` when it is one the
    shape does not imply (a channels-last stretch)."""
    op = node.op_type
    attrs = node_attrs(node)
    inputs = tuple(node.input)
    outputs = tuple(o for o in node.output)
    _require_shapes(node, inputs, outputs, shapes, path)
    spec = op_spec(op)
    fmap = tuple(t for t in inputs if t and t not in constants)
    weights = _weights(spec, inputs, constants)
    weight_elems = sum(int(constants[t].size) for t in weights)
    out_shape = shapes[outputs[0]]
    in_shapes = [shapes[t] for t in fmap]
    w_shape = shapes.get(inputs[1]) if len(inputs) > 1 and inputs[1] else None
    in_layouts = [layouts.get(t) or layout_of(shapes[t]) for t in fmap]
    attrs = with_kernel_shape(spec, attrs, w_shape)
    # what the op reads of each input, per output axis: the carried layouts and the maps
    ims = node_index_maps(spec, attrs, inputs, constants, shapes, out_shape, opset)
    carry, batch_kept = _carried_layout(spec, attrs, ims, in_shapes, in_layouts, out_shape,
                                        opset, layouts.get(outputs[0]))
    given = carry or layouts.get(outputs[0]) \
        or _kept_rows(spec, ims, in_shapes, in_layouts, out_shape)
    _record_layout(layouts, outputs, given, carried_all=carry is not None)
    out_layout = given or layout_of(out_shape)
    if batch_kept and spec.axis_move is AxisMove.NONE and any(
            lay.batch_axis not in (None, out_layout.batch_axis) for lay in in_layouts):
        # tiles cut an input's images along its layout's batch axis; an op that reads
        # axis 0 as its batch (a Conv after a Transpose moved the width there and a
        # Reshape carried it on) would be handed part of another axis: images whole
        batch_kept = False
    rows, cols = layer_maps(spec, attrs, inputs, constants, ims, out_shape, in_layouts,
                            out_layout)
    window, attrs = sliding_window(spec, attrs, in_shapes, w_shape, in_layouts)
    if window is not None:
        # the window slides over the data input; conv weights a layer computes are needed whole
        rows = [window[0] if t == inputs[0] else WHOLE for t in fmap]
        cols = [window[1] if t == inputs[0] else WHOLE for t in fmap]
    return Layer(
        name=node.name,
        op=op,
        op_class=spec.op_class,
        attrs=MappingProxyType(attrs),
        inputs=inputs,
        outputs=outputs,
        fmap_inputs=fmap,
        weights=weights,
        weight_elems=weight_elems,
        out_shape=out_shape,
        macs_per_output=spec.work_per_output(attrs, in_shapes, w_shape, out_shape),
        row_maps=tuple(rows),
        col_maps=tuple(cols),
        batch_preserving=batch_kept,
        opset=opset,
    )


def _record_layout(layouts: dict[str, Layout], outputs: Sequence[str], given: Layout | None,
                   carried_all: bool) -> None:
    """Record the layout a layer gives its first output, or all its outputs when the layout
    is carried from an input."""
    if given is None:
        return
    for t in outputs if carried_all else outputs[:1]:
        if t:
            layouts[t] = given


def _require_shapes(node: onnx.NodeProto, inputs: Sequence[str], outputs: Sequence[str],
                    shapes: Mapping[str, tuple[int, ...]], path: str) -> None:
    """Refuse a node whose inputs or first output have no static shape."""
    missing = [t for t in list(inputs) + [outputs[0]] if t and t not in shapes]
    if missing:
        raise InputError(
            f"{path}: node '{node.name}' ({node.op_type}): tensor '{missing[0]}' has no static "
            "shape after shape inference. Pass --shape for every dynamic input dimension, or "
            "export the model with static shapes."
        )


def _weights(spec: OpSpec, inputs: Sequence[str],
             constants: Mapping[str, np.ndarray]) -> tuple[str, ...]:
    """The float constant inputs a layer computes with as weights (none for ops that take
    no weights)."""
    if not spec.takes_weights:
        return ()
    return tuple(t for t in inputs
                 if t in constants and np.issubdtype(constants[t].dtype, np.floating))


def _carried_layout(spec: OpSpec, attrs: dict[str, Any], ims: Sequence[IndexMap],
                    in_shapes: Sequence[tuple[int, ...]], in_layouts: Sequence[Layout],
                    out_shape: tuple[int, ...], opset: int, named: Layout | None
                    ) -> tuple[Layout | None, bool]:
    """The layout the output takes from the inputs by the layer's index maps (`ims`; None
    when none), and whether the layer keeps every batch item apart. `named`: what the ops
    say of the output (a channels-last or token stretch), which names the columns a
    Reshape's maps leave open."""
    # a layout carried through a movement op or kept by a per-token op comes first: it
    # knows where the batch went, which a token stretch seeded by shape does not
    # (nn.MultiheadAttention's [L, B, C] reads as a batch of L)
    batch_kept = spec.batch_preserving(attrs, in_shapes, out_shape, opset,
                                       bool(ims) and all(im.lands(0) == 0 for im in ims))
    if not in_layouts:
        return None, batch_kept
    first = in_layouts[0]
    if spec.axis_move is AxisMove.REGROUP and (len(ims) == 1 or first.token_like):
        # rows, batch and columns follow the row-major order, whatever the layout
        carry = regrouped_layout(first, in_shapes[0], out_shape, ims[0].lands,
                                 ims[0].carries, named)
        return _moved_batch(ims[0], first, in_shapes[0], out_shape, batch_kept, carry)
    if spec.axis_move is not AxisMove.NONE and first.token_like:
        carry = carried(first, in_shapes[0], out_shape, ims[0].lands)
        return _moved_batch(ims[0], first, in_shapes[0], out_shape, batch_kept, carry)
    if spec.maps in _KEEP_TOKENS and spec.op_class is not OpClass.OPAQUE \
            and (named is None or spec.maps is not MapRule.WINDOW):
        return _kept_layout(ims, in_shapes, in_layouts, out_shape), batch_kept
    return None, batch_kept


def _kept_layout(ims: Sequence[IndexMap], in_shapes: Sequence[tuple[int, ...]],
                 in_layouts: Sequence[Layout], out_shape: tuple[int, ...]) -> Layout | None:
    """The token layout an op keeps by its index maps: that of the first token input whose
    batch lands on the output whole (or is one image) and whose tokens it reads position
    for position (IndexMap.follows: whole, shifted, through a window one element wide),
    one with a batch axis first."""
    found = [lay for lay in (carried(lay, shape, out_shape, im.lands, im.follows)
                             for im, shape, lay in zip(ims, in_shapes, in_layouts, strict=True)
                             # images joined or cut along their batch: no box of images
                             if lay.batch_axis is None or im.lands(lay.batch_axis) is not None
                             or im.follows(lay.batch_axis) is None)
             if lay is not None]
    found.sort(key=lambda lay: lay.batch_axis is None)
    return found[0] if found else None


def _kept_rows(spec: OpSpec, ims: Sequence[IndexMap], in_shapes: Sequence[tuple[int, ...]],
               in_layouts: Sequence[Layout], out_shape: tuple[int, ...]) -> Layout | None:
    """The layout an op that keeps a layout (_KEEP_LAYOUT) keeps of an image input when
    nothing else names its output: the rows and columns where they land, one whose columns
    land first; the rows alone where the op contracts the columns away (p @ v of window
    attention's probabilities, guessed NCHW at batch 2). None where the columns are
    broadcast, cut or reduced (the shape's layout keeps them where they are)."""
    if spec.maps not in _KEEP_LAYOUT or spec.op_class is OpClass.OPAQUE:
        return None
    found: list[tuple[bool, Layout]] = []
    for im, shape, lay in zip(ims, in_shapes, in_layouts, strict=True):
        r, c = lay.row_axis, lay.col_axis
        rows = None if lay.token_like or r is None or shape[r] == 1 else im.lands(r)
        kept, batch = landed_batch(lay, shape, im.lands)
        if rows is None or not kept:
            continue
        cols = None if c is None else im.lands(c)
        if c is not None and cols is None and (
                shape[c] == 1 or any(read is not None and read.axis == c for read in im.reads)):
            continue
        found.append((c is not None and cols is None, boxed(out_shape, batch, rows, cols)))
    found.sort(key=lambda pair: pair[0])
    return found[0][1] if found else None


def _moved_batch(moved: IndexMap, layout: Layout, in_shape: tuple[int, ...],
                 out_shape: tuple[int, ...], batch_kept: bool,
                 carry: Layout | None) -> tuple[Layout | None, bool]:
    """The layout a movement op carries to its output (`carry`), and whether the batch
    lands whole (`batch_kept`: what the op table says without the layout)."""
    b_in = layout.batch_axis
    if carry is not None:
        b_out = carry.batch_axis
        if b_in is not None and in_shape[b_in] > 1:
            # a batch must land whole on the output's (not merged into another axis)
            return carry, b_out is not None and moved.lands(b_in) == b_out
        # one image: an output batch of more than one is windows the ops after run over
        # as a batch, no image of the input's
        return carry, b_out is None or out_shape[b_out] == 1
    if b_in is not None:
        # the tokens go (ViT's class token taken), the batch lands whole on axis 0: a
        # flat [B, C] keeps each image apart
        on_first = moved.lands(b_in) == 0 and out_shape[:1] == in_shape[b_in:b_in + 1]
        if b_in != 0 and in_shape[b_in] > 1:
            # the op table's flag asks of axis 0 only; a batch elsewhere (sequence first,
            # [L, B, C] into [L, B C]) is kept only where it lands on the output's axis 0
            return None, on_first
        batch_kept = batch_kept or on_first
    return None, batch_kept
