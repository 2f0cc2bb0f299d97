"""Infer every tensor's shape: strict ONNX shape inference on a light skeleton of the graph,
and, where inference gives none (or a wrong one), shapes measured by running onnxruntime."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from math import prod

import numpy as np
import onnx

from fuseplan.planner.core.errors import InputError
from fuseplan.planner.front.reference import run_onnxruntime
from fuseplan.planner.front.shape_bind import _SHAPE_HINT
from fuseplan.planner.front.work import (
    _FLOAT_TYPES,
    _one_line,
    _static_shape,
    _tensor_proto,
    _used_names,
    _Work,
)
from fuseplan.planner.ir.ops import op_spec

# Float initializers bigger than this are given to shape inference as typed inputs instead of
# data: their values never matter for shapes, and serialising them is slow.
_SKELETON_MAX_ELEMS = 64


def _skeleton(work: _Work, model: onnx.ModelProto) -> onnx.ModelProto:
    """The current graph with big float constants replaced by typed inputs (fast to infer)."""
    inputs = list(work.inputs.values())
    inits: list[onnx.TensorProto] = []
    used = _used_names(work.nodes, (o.name for o in model.graph.output))
    for name, tensor in work.inits.items():
        if name in used:
            _skeleton_const(name, tensor.data_type, tuple(tensor.dims), tensor, inputs, inits)
    for name, arr in work.folded.items():
        if name in used:
            dtype = onnx.helper.np_dtype_to_tensor_dtype(arr.dtype)
            _skeleton_const(name, dtype, arr.shape, arr, inputs, inits)
    outputs = []
    for out in model.graph.output:
        vi = onnx.ValueInfoProto()
        vi.CopyFrom(out)
        vi.type.tensor_type.ClearField("shape")
        outputs.append(vi)
    graph = onnx.helper.make_graph(work.nodes, "skeleton", inputs, outputs, inits)
    skeleton = onnx.helper.make_model(graph, opset_imports=list(model.opset_import))
    skeleton.ir_version = max(model.ir_version, 4)
    skeleton.functions.extend(model.functions)
    return skeleton


def _skeleton_const(
    name: str, dtype: int, shape: tuple[int, ...], value: onnx.TensorProto | np.ndarray,
    inputs: list[onnx.ValueInfoProto], inits: list[onnx.TensorProto],
) -> None:
    if dtype in _FLOAT_TYPES and prod(shape) > _SKELETON_MAX_ELEMS:
        inputs.append(onnx.helper.make_tensor_value_info(name, dtype, shape))
    elif isinstance(value, onnx.TensorProto):
        inits.append(value)
    else:
        inits.append(_tensor_proto(name, value))


def _infer_types(work: _Work, model: onnx.ModelProto) -> dict[str, onnx.TypeProto]:
    """Strict shape inference with data propagation: name -> inferred type."""
    skeleton = _skeleton(work, model)
    try:
        inferred = onnx.shape_inference.infer_shapes(
            skeleton, check_type=True, strict_mode=True, data_prop=True)
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError) as exc:
        message = _one_line(str(exc))
        match = re.search(r"node name: ([^)]*)\)", message)
        where = f"node '{match.group(1)}'" if match and match.group(1) else "a node"
        raise InputError(
            f"Model file '{work.spec}': shape inference found an inconsistency at {where} "
            f"with the bound input shapes {_fmt_inputs(work.shapes)}: {message}. Check the "
            f"--shape values ({_SHAPE_HINT}) or re-export the model."
        ) from exc
    types = {vi.name: vi.type for vi in inferred.graph.value_info}
    types.update({vi.name: vi.type for vi in inferred.graph.output})
    return types


def _fmt_inputs(shapes: Mapping[str, tuple[int, ...]]) -> str:
    return ", ".join(f"{k}={','.join(map(str, v))}" for k, v in shapes.items()) or "(none)"


def _record_static(work: _Work, types: Mapping[str, onnx.TypeProto]) -> None:
    for name, tp in types.items():
        shape = _static_shape(tp)
        if shape is not None:
            work.shapes[name] = shape


def _missing_shapes(model: onnx.ModelProto) -> list[str]:
    """Tensors read or written by nodes that lack a concrete static shape."""
    graph = model.graph
    known = {t.name for t in graph.initializer}
    for vi in list(graph.input) + list(graph.value_info) + list(graph.output):
        if _static_shape(vi.type) is not None:
            known.add(vi.name)
    names: list[str] = []
    for node in graph.node:
        for name in list(node.input) + list(node.output):
            if name and name not in known and name not in names:
                names.append(name)
    return names


def _runtime_types(
    model: onnx.ModelProto, names: Sequence[str], spec: str
) -> dict[str, onnx.TypeProto]:
    """Shapes of ``names`` observed by running the model once on zero inputs."""
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    probe.graph.output.extend(onnx.ValueInfoProto(name=n) for n in names)
    feeds = {
        vi.name: np.zeros(
            _static_shape(vi.type) or (),
            dtype=onnx.helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type))
        for vi in probe.graph.input
    }
    try:
        results, _ = run_onnxruntime(probe, feeds)
    except InputError as exc:
        raise InputError(
            f"Model file '{spec}': shape inference left tensor '{names[0]}' without a static "
            f"shape and running the model to measure it failed ({exc}). Bind all dynamic "
            f"dims with {_SHAPE_HINT} or export the model with static shapes."
        ) from exc
    types: dict[str, onnx.TypeProto] = {}
    for name in names:
        arr = results[name]
        types[name] = onnx.helper.make_tensor_type_proto(
            onnx.helper.np_dtype_to_tensor_dtype(arr.dtype), arr.shape)
    return types


def _ceil_pool_outputs(model: onnx.ModelProto) -> list[str]:
    """Tensors downstream of a ceil_mode pool: onnx shape inference keeps a last window that
    starts in the padding, which onnxruntime (and the spec) drop, so measure those instead."""
    ceil_pools = [n for n in model.graph.node if op_spec(n.op_type).sliding_window
                  and any(a.name == "ceil_mode" and a.i for a in n.attribute)]
    if not ceil_pools:
        return []
    tainted = {o for n in ceil_pools for o in n.output}
    for node in model.graph.node:
        if tainted & set(node.input):
            tainted.update(o for o in node.output if o)
    return [t for t in tainted if t]


def _fill_runtime_shapes(model: onnx.ModelProto, spec: str) -> None:
    missing = sorted(set(_missing_shapes(model)) | set(_ceil_pool_outputs(model)))
    if not missing:
        return
    types = _runtime_types(model, missing, spec)
    graph = model.graph
    by_name = {vi.name: vi for vi in list(graph.value_info) + list(graph.output)}
    for name, tp in types.items():
        target = by_name.get(name) or graph.value_info.add(name=name)
        target.type.CopyFrom(tp)
