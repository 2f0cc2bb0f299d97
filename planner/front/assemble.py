"""Write the cleaned graph back into the model proto: nodes, folded initializers, bound
inputs and the inferred shapes."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx

from fuseplan.planner.front.fills import fill_stub, is_fill
from fuseplan.planner.front.reference import _ort_max_ir
from fuseplan.planner.front.work import _tensor_proto, _used_names, _Work

_RAW_DTYPES = frozenset(
    np.dtype(t) for t in ("float16", "float32", "float64", "bool", "int8", "int16", "int32",
                          "int64", "uint8", "uint16", "uint32", "uint64"))


def _fill_tensor(tensor: onnx.TensorProto, name: str, arr: np.ndarray) -> None:
    """Write an array into a tensor proto in place (one copy for big numeric weights)."""
    arr = np.asarray(arr)
    if is_fill(arr):  # one repeated value: its shape and value, no bytes
        fill_stub(tensor, name, arr)
        return
    if arr.dtype.newbyteorder("=") not in _RAW_DTYPES:
        tensor.CopyFrom(_tensor_proto(name, arr))
        return
    tensor.name = name
    tensor.data_type = onnx.helper.np_dtype_to_tensor_dtype(arr.dtype.newbyteorder("="))
    tensor.dims.extend(arr.shape)
    tensor.raw_data = _raw_bytes(arr)


def _raw_bytes(arr: np.ndarray) -> bytes:
    """Little-endian bytes, as TensorProto.raw_data requires."""
    return np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<")).tobytes()


def _assemble(
    work: _Work, model: onnx.ModelProto, types: Mapping[str, onnx.TypeProto]
) -> onnx.ModelProto:
    """Write the cleaned graph back into ``model`` (mutated in place and returned)."""
    graph = model.graph
    outputs = [o.name for o in graph.output]
    used = _used_names(work.nodes, outputs)
    graph.ClearField("node")
    graph.node.extend(work.nodes)
    for index in range(len(graph.initializer) - 1, -1, -1):
        if graph.initializer[index].name not in used or \
                graph.initializer[index].name not in work.inits:
            del graph.initializer[index]
    for name, arr in work.folded.items():
        if name in used:
            _fill_tensor(graph.initializer.add(), name, arr)
    work.folded.clear()
    graph.ClearField("input")
    graph.input.extend(vi for name, vi in work.inputs.items() if name in used)
    for out in graph.output:
        if out.name in types:
            out.type.CopyFrom(types[out.name])
    graph.ClearField("value_info")
    declared = set(outputs) | set(work.inputs) | {t.name for t in graph.initializer}
    for node in work.nodes:
        for name in node.output:
            if name and name not in declared and name in types:
                graph.value_info.add(name=name).type.CopyFrom(types[name])
                declared.add(name)
    # IR >= 4 lets initializers stay out of the inputs; newer onnx releases stamp IR versions
    # that released onnxruntime builds refuse, and nothing here needs more than IR 8
    model.ir_version = min(max(model.ir_version, 4), max(8, _ort_max_ir()))
    return model
