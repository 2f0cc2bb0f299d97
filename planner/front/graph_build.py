"""Cleaned ONNX model -> layer graph (planner.ir.graph.Graph)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from math import ceil, prod
from types import MappingProxyType
from typing import Any

import networkx as nx
import numpy as np
import onnx
from onnx import numpy_helper

from planner.core.errors import InputError
from planner.front.blocks import find_blocks
from planner.front.onnx_load import LoadedModel
from planner.ir.graph import (
    IDENTITY,
    PARAMETER_INPUT_OPS,
    WHOLE,
    AxisMap,
    Graph,
    Layer,
    MapKind,
    OpClass,
    op_class,
)

WINDOW_OPS = frozenset({"Conv", "MaxPool", "AveragePool", "LpPool"})


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


def _resolve_pads(attrs: dict[str, Any], in_hw: tuple[int, int], kernel: list[int],
                  strides: list[int], dilations: list[int]) -> list[int]:
    """Explicit [top, left, bottom, right] pads, resolving auto_pad."""
    auto = attrs.get("auto_pad", "NOTSET")
    if auto in ("NOTSET", ""):
        return list(attrs.get("pads", [0] * (2 * len(kernel))))
    if auto == "VALID":
        return [0] * (2 * len(kernel))
    begins, ends = [], []
    for size, k, s, d in zip(in_hw, kernel, strides, dilations, strict=True):
        total = max(0, (ceil(size / s) - 1) * s + (k - 1) * d + 1 - size)
        small = total // 2
        begin = small if auto == "SAME_UPPER" else total - small
        begins.append(begin)
        ends.append(total - begin)
    return begins + ends


def _window_maps(op: str, attrs: dict[str, Any], in_shape: tuple[int, ...],
                 w_shape: tuple[int, ...] | None) -> tuple[AxisMap, AxisMap, dict[str, Any]]:
    if op == "Conv" and w_shape is not None:
        kernel = list(attrs.get("kernel_shape", w_shape[2:]))
    else:
        kernel = list(attrs["kernel_shape"])
    nd = len(kernel)
    strides = list(attrs.get("strides", [1] * nd))
    dilations = list(attrs.get("dilations", [1] * nd))
    pads = _resolve_pads(attrs, tuple(in_shape[2:]), kernel, strides, dilations)  # type: ignore[arg-type]
    attrs = {**attrs, "pads": pads, "kernel_shape": kernel, "strides": strides}
    attrs.pop("auto_pad", None)
    if op == "Conv":
        attrs["dilations"] = dilations
    if nd != 2:
        return WHOLE, WHOLE, attrs
    row = AxisMap(MapKind.WINDOW, kernel[0], strides[0], pads[0], dilations[0])
    col = AxisMap(MapKind.WINDOW, kernel[1], strides[1], pads[1], dilations[1])
    return row, col, attrs


def _upsample_factor(node_op: str, attrs: dict[str, Any], in_len: int, out_len: int) -> AxisMap:
    """Nearest-neighbour integer upsampling is row-local; everything else needs the whole axis."""
    if out_len % in_len or attrs.get("mode", "nearest") != "nearest":
        return WHOLE
    f = out_len // in_len
    if f == 1:
        return IDENTITY
    if node_op == "Upsample":
        return AxisMap(MapKind.UPSAMPLE, stride=f)
    ctm = attrs.get("coordinate_transformation_mode", "half_pixel")
    nearest = attrs.get("nearest_mode", "round_prefer_floor")
    floors = ctm == "asymmetric" and nearest == "floor"
    centred = ctm in ("half_pixel", "pytorch_half_pixel") and nearest.startswith("round_prefer")
    return AxisMap(MapKind.UPSAMPLE, stride=f) if floors or centred else WHOLE


def _spatial_same(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    return len(a) >= 4 and len(b) >= 4 and a[-2:] == b[-2:] and a[0] == b[0]


def _maps(op: str, attrs: dict[str, Any], in_shapes: list[tuple[int, ...]],
          out_shape: tuple[int, ...], opset: int) -> tuple[list[AxisMap], list[AxisMap]]:
    """Row and column maps per feature-map input for the ops that keep rows local."""
    rank = len(out_shape)
    rows: list[AxisMap] = []
    cols: list[AxisMap] = []
    for shape in in_shapes:
        row = col = WHOLE
        if op in ("Resize", "Upsample") and len(shape) == 4 and len(out_shape) == 4 \
                and shape[:2] == out_shape[:2]:
            row = _upsample_factor(op, attrs, shape[2], out_shape[2])
            col = _upsample_factor(op, attrs, shape[3], out_shape[3])
        elif _spatial_same(shape, out_shape) and len(shape) >= 4:
            if op == "Concat":
                axis = attrs.get("axis", 1) % rank
                row = col = IDENTITY if axis < rank - 2 else WHOLE
            elif op == "Transpose":
                perm = list(attrs.get("perm", range(rank)[::-1]))
                ok = perm[-2] == rank - 2 and perm[-1] == rank - 1
                row = col = IDENTITY if ok else WHOLE
            elif op in ("Softmax", "LogSoftmax"):
                axis = attrs.get("axis", 1 if opset < 13 else -1) % rank
                reduced = set(range(axis, rank)) if opset < 13 else {axis}
                row = WHOLE if rank - 2 in reduced else IDENTITY
                col = WHOLE if rank - 1 in reduced else IDENTITY
            elif op == "InstanceNormalization" \
                    or op_class(op) in (OpClass.REDUCTION, OpClass.OPAQUE):
                row = col = WHOLE
            elif op not in ("Gemm", "MatMul"):
                row = col = IDENTITY
        rows.append(row)
        cols.append(col)
    return rows, cols


def _batch_preserving(op: str, attrs: dict[str, Any], in_shapes: list[tuple[int, ...]],
                      out_shape: tuple[int, ...], opset: int) -> bool:
    if op_class(op) is OpClass.OPAQUE or not out_shape:
        return False
    if any(not s or s[0] != out_shape[0] for s in in_shapes):
        return False
    rank = len(out_shape)
    if op in ("Concat", "Split", "Softmax", "LogSoftmax", "Squeeze", "Unsqueeze", "Slice", "Pad"):
        axis = attrs.get("axis", 1 if opset < 13 or op != "Softmax" else -1)
        return op in ("Concat", "Split", "Softmax", "LogSoftmax") and axis % max(rank, 1) != 0
    if op == "Transpose":
        return list(attrs.get("perm", [rank - 1]))[0] == 0
    if op == "Gemm":
        return not attrs.get("transA", 0)
    if op_class(op) is OpClass.REDUCTION and op != "GlobalAveragePool" and op != "GlobalMaxPool":
        axes = attrs.get("axes")
        return axes is not None and 0 not in [a % len(in_shapes[0]) for a in axes]
    return True


def _macs_per_output(op: str, attrs: dict[str, Any], in_shapes: list[tuple[int, ...]],
                     w_shape: tuple[int, ...] | None, out_shape: tuple[int, ...]) -> int:
    if op == "Conv" and w_shape is not None:
        return prod(w_shape[1:])
    if op == "ConvTranspose" and w_shape is not None:
        # every input element scatters (C_out/group)*k_h*k_w products over s_h*s_w outputs
        strides = attrs.get("strides", [1] * (len(w_shape) - 2))
        per_input_channel = prod(w_shape[2:]) * w_shape[0] // int(attrs.get("group", 1))
        return max(1, ceil(per_input_channel / prod(strides)))
    if op in ("MaxPool", "AveragePool", "LpPool"):
        return prod(attrs["kernel_shape"])
    if op in ("Gemm", "MatMul") and in_shapes:
        a = in_shapes[0]
        return a[-2] if op == "Gemm" and attrs.get("transA", 0) else a[-1]
    if op in ("GlobalAveragePool", "GlobalMaxPool") and in_shapes:
        return prod(in_shapes[0][2:])
    if op_class(op) is OpClass.REDUCTION and in_shapes:
        return max(1, prod(in_shapes[0]) // max(prod(out_shape), 1))
    if op == "LRN":
        return int(attrs.get("size", 1))
    if op in ("BatchNormalization", "InstanceNormalization", "Softmax", "LogSoftmax"):
        return 2
    if op_class(op) is OpClass.MOVEMENT:
        return 0
    return 1


def build_graph(model: LoadedModel) -> Graph:
    """Turn a cleaned, shape-inferred model into the layer graph."""
    proto = model.proto
    shapes = _tensor_shapes(proto)
    constants = {init.name: numpy_helper.to_array(init) for init in proto.graph.initializer}
    layers: list[Layer] = []
    producer: dict[str, str] = {}
    consumers: dict[str, list[str]] = {}
    for node in proto.graph.node:
        layer = _layer(node, shapes, constants, model.opset, model.path)
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
    outputs = tuple(model.outputs)
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
    )


def _layer(node: onnx.NodeProto, shapes: Mapping[str, tuple[int, ...]],
           constants: Mapping[str, np.ndarray], opset: int, path: str) -> Layer:
    op = node.op_type
    attrs = node_attrs(node)
    inputs = tuple(node.input)
    outputs = tuple(o for o in node.output)
    missing = [t for t in list(inputs) + [outputs[0]] if t and t not in shapes]
    if missing:
        raise InputError(
            f"{path}: node '{node.name}' ({op}): tensor '{missing[0]}' has no static shape after "
            "shape inference. Pass --shape for every dynamic input dimension, or export the "
            "model with static shapes."
        )
    fmap = tuple(t for t in inputs if t and t not in constants)
    weights: tuple[str, ...] = ()
    if op not in PARAMETER_INPUT_OPS:
        weights = tuple(
            t for t in inputs
            if t in constants and np.issubdtype(constants[t].dtype, np.floating)
        )
    weight_elems = sum(int(constants[t].size) for t in weights)
    out_shape = shapes[outputs[0]]
    in_shapes = [shapes[t] for t in fmap]
    w_shape = shapes.get(inputs[1]) if len(inputs) > 1 and inputs[1] else None
    if op in WINDOW_OPS and in_shapes:
        row, col, attrs = _window_maps(op, attrs, in_shapes[0], w_shape)
        rows = [row] + [WHOLE] * (len(fmap) - 1)
        cols = [col] + [WHOLE] * (len(fmap) - 1)
        if op == "Conv" and len(fmap) > 1:  # conv weights computed by a layer
            rows = [row if t == inputs[0] else WHOLE for t in fmap]
            cols = [col if t == inputs[0] else WHOLE for t in fmap]
    elif op == "ConvTranspose" and in_shapes and w_shape is not None and len(w_shape) == 4 \
            and attrs.get("auto_pad", "NOTSET") in ("NOTSET", ""):
        k = list(attrs.get("kernel_shape", w_shape[2:]))
        s = list(attrs.get("strides", [1, 1]))
        d = list(attrs.get("dilations", [1, 1]))
        p = list(attrs.get("pads", [0, 0, 0, 0]))
        rows = [AxisMap(MapKind.TRANSPOSED, k[0], s[0], p[0], d[0])] + [WHOLE] * (len(fmap) - 1)
        cols = [AxisMap(MapKind.TRANSPOSED, k[1], s[1], p[1], d[1])] + [WHOLE] * (len(fmap) - 1)
    else:
        rows, cols = _maps(op, attrs, in_shapes, out_shape, opset)
    return Layer(
        name=node.name,
        op=op,
        op_class=op_class(op),
        attrs=MappingProxyType(attrs),
        inputs=inputs,
        outputs=outputs,
        fmap_inputs=fmap,
        weights=weights,
        weight_elems=weight_elems,
        out_shape=out_shape,
        macs_per_output=_macs_per_output(op, attrs, in_shapes, w_shape, out_shape),
        row_maps=tuple(rows),
        col_maps=tuple(cols),
        batch_preserving=_batch_preserving(op, attrs, in_shapes, out_shape, opset),
        opset=opset,
    )


def restrict(graph: Graph, layers: Sequence[str]) -> Graph:
    """The subgraph of `layers`: tensors crossing into it become its inputs, tensors leaving
    it (or model outputs) its outputs; blocks wholly inside it are kept."""
    from planner.geometry.regions import group_io

    io = group_io(graph, layers)
    keep = set(io.layers)
    kept = tuple(lay for lay in graph.layers if lay.name in keep)
    producer = {t: p for t, p in graph.producer.items() if p in keep}
    consumers = {t: tuple(c for c in cs if c in keep) for t, cs in graph.consumers.items()}
    # blocks wholly inside; one whose fork lies outside now starts at the subgraph's input
    blocks = tuple(b if b.entry in keep else replace(b, entry="")
                   for b in graph.blocks if set(b.layers) <= keep)
    return Graph(
        name=graph.name,
        layers=kept,
        shapes=graph.shapes,
        constants=graph.constants,
        inputs=io.inputs,
        outputs=io.outputs,
        producer=MappingProxyType(producer),
        consumers=MappingProxyType({t: cs for t, cs in consumers.items() if cs}),
        dag=graph.dag.subgraph(keep).copy(),
        blocks=blocks,
        opset=graph.opset,
    )
