"""Weights that are one repeated value, kept as that value and a shape, never as bytes.

Exports with shape-only placeholder weights (the zoo files: every big initializer a
``ConstantOfShape``) fold to tensors of one value. Stored as bytes they cost what real
weights cost: a 32-layer decoder at 7B width is 27 GB of float32, more than the machine, and
the 2 GB protobuf limit stops it well before. Planning reads only their shapes, so the loader
keeps such a tensor as a read-only broadcast view (numpy strides of zero: no memory) and the
cleaned model's initializer as a stub: its type and dims, no data, and the value in
``doc_string``. Whatever needs the bytes (onnxruntime, an exported file) asks
`materialized` for a copy of the model with the stubs filled in.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

# doc_string of an initializer stored as one repeated value; the value follows
FILL = "fuseplan:fill "
# smaller tensors keep their bytes: nothing is saved, and every reader sees plain data
MIN_FILL_ELEMENTS = 1 << 16


def is_fill(arr: np.ndarray) -> bool:
    """A big tensor of one value that holds no memory of its own (a broadcast view)."""
    return arr.ndim > 0 and arr.size >= MIN_FILL_ELEMENTS and not any(arr.strides) \
        and arr.dtype.kind == "f"


def fill_stub(tensor: onnx.TensorProto, name: str, arr: np.ndarray) -> None:
    """Write `arr`, a fill (is_fill), into `tensor` as a stub: type, dims and the value."""
    tensor.name = name
    tensor.data_type = helper.np_dtype_to_tensor_dtype(arr.dtype.newbyteorder("="))
    tensor.dims.extend(arr.shape)
    tensor.doc_string = FILL + repr(float(arr.reshape(-1)[0]))


def stored_array(tensor: onnx.TensorProto) -> np.ndarray:
    """The initializer's values: a read-only broadcast view for a stub, else its data."""
    if not tensor.doc_string.startswith(FILL):
        return numpy_helper.to_array(tensor)
    dtype = helper.tensor_dtype_to_np_dtype(tensor.data_type)
    value = np.array(float(tensor.doc_string[len(FILL):]), dtype=dtype)
    return np.broadcast_to(value, tuple(int(d) for d in tensor.dims))


def has_fills(proto: onnx.ModelProto) -> bool:
    """Whether any initializer of the model is a stub."""
    return any(t.doc_string.startswith(FILL) for t in proto.graph.initializer)


def fill_in(tensor: onnx.TensorProto) -> None:
    """Write a stub's bytes into it (it is then an ordinary initializer); others unchanged."""
    if tensor.doc_string.startswith(FILL):
        arr = stored_array(tensor)
        tensor.raw_data = np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<")).tobytes()
        tensor.doc_string = ""


def materialized(proto: onnx.ModelProto) -> onnx.ModelProto:
    """The model itself when it has no stub, else a copy with every stub's bytes written."""
    if not has_fills(proto):
        return proto
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    for tensor in out.graph.initializer:
        fill_in(tensor)
    return out
