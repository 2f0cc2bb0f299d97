"""Refuse, with a fix to try, models fuseplan could plan but not verify: an opset onnxruntime
lacks, control flow, quantized feature maps, element types numpy cannot compute in, tensors
past the size limit, undefined outputs and channel mismatches."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from math import prod

import onnx
import onnxruntime as ort
from onnx import TensorProto

from fuseplan.planner.core.errors import InputError
from fuseplan.planner.front.reference import ort_max_opset
from fuseplan.planner.front.resolve import _not_onnx
from fuseplan.planner.front.shape_bind import _SHAPE_HINT, MAX_TENSOR_ELEMENTS, _check_size
from fuseplan.planner.front.work import _DEFAULT_DOMAINS, _static_shape, _Work
from fuseplan.planner.ir.ops import op_spec


def _default_opset(proto: onnx.ModelProto, spec: str) -> int:
    for op in proto.opset_import:
        if op.domain in _DEFAULT_DOMAINS:
            return int(op.version)
    raise InputError(
        f"Model file '{spec}' imports no default-domain (ai.onnx) opset, so its operators "
        "cannot be interpreted. Re-export it with a standard opset (9 to 17)."
    )


def _check_opset(opset: int, spec: str) -> None:
    """Refuse an opset onnxruntime cannot run: `verify` would fail after `solve` planned it."""
    newest = ort_max_opset()
    if opset > newest:
        raise InputError(
            f"Model file '{spec}' imports opset {opset} of the default ONNX domain (ai.onnx), "
            f"but the installed onnxruntime {ort.__version__} supports opsets up to {newest}, "
            "so its plan could not be verified. Convert the model to an older opset (e.g. "
            f"onnx.version_converter.convert_version(model, {newest})), re-export it with "
            f"opset {newest} or lower, or upgrade onnxruntime."
        )


_CONTROL_FLOW = ("If", "Loop", "Scan")
# Element types numpy has no arithmetic for (ml_dtypes stand-ins) and onnxruntime's CPU
# kernels mostly lack: neither the emulator nor the reference run can execute them.
_UNRUNNABLE_TYPES: dict[int, str] = {
    value: name.lower() for name in (
        "BFLOAT16", "FLOAT8E4M3FN", "FLOAT8E4M3FNUZ", "FLOAT8E5M2", "FLOAT8E5M2FNUZ",
        "FLOAT8E8M0", "FLOAT4E2M1", "INT4", "UINT4", "INT2", "UINT2")
    if (value := getattr(TensorProto, name, None)) is not None
}


def _check_control_flow(nodes: Sequence[onnx.NodeProto], spec: str) -> None:
    """Refuse If/Loop/Scan that reach an output: their bodies are subgraphs the layer graph,
    the emulator and the plan cannot represent (solve would plan them, verify would fail)."""
    for node in nodes:
        if node.domain in _DEFAULT_DOMAINS and node.op_type in _CONTROL_FLOW:
            raise InputError(
                f"Model file '{spec}': node '{node.name}' ({node.op_type}) is control flow, "
                "which fuseplan cannot plan or execute (its body is a subgraph chosen or "
                "repeated at run time). Fold the control flow away with "
                "onnx-simplifier (python -m onnxsim in.onnx out.onnx, with fixed input "
                "shapes), or export the model with the loop unrolled / the branch fixed "
                "(e.g. torch.onnx.export of a traced model)."
            )


# Operators on quantized (integer) feature maps: the emulator holds feature maps as floats.
_QUANTIZED = frozenset({"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear",
                        "QLinearConv", "QLinearMatMul", "ConvInteger", "MatMulInteger"})


def _check_runnable(nodes: Sequence[onnx.NodeProto], opset: int, spec: str) -> None:
    """Refuse a node left after folding that the emulator cannot execute, so that solve does
    not plan what verify then fails on: operators on quantized feature maps (the QDQ pairs
    on activations of a quantized model; those on constant weights are folded at load), and
    operators onnx's reference evaluator (the emulator's fallback) lacks at this opset."""
    from onnx.reference.ops import load_op

    for node in nodes:
        if node.domain not in _DEFAULT_DOMAINS:
            continue
        if node.op_type in _QUANTIZED:
            raise InputError(
                f"Model file '{spec}': node '{node.name}' ({node.op_type}) works on a "
                "quantized feature map, and fuseplan does not support quantized graphs yet: "
                "it plans float models (quantized weights alone are fine; they are "
                "dequantized at load). Plan the float model this one was quantized from, or "
                "remove the QuantizeLinear/DequantizeLinear pairs on activations, keeping "
                "those on the weights.")
        if op_spec(node.op_type).kernel is not None:
            continue
        try:
            load_op("", node.op_type, opset)
        except (RuntimeError, ValueError, KeyError, NotImplementedError):
            raise InputError(
                f"Model file '{spec}': node '{node.name}' ({node.op_type}) cannot be executed "
                f"at opset {opset} by the emulator fuseplan verifies plans with (onnx.reference "
                f"has no {node.op_type} for that opset). Re-export the model at a newer opset, "
                "or replace the node with standard operators.") from None


def _check_element_types(work: _Work, types: Mapping[str, onnx.TypeProto]) -> None:
    """Refuse bfloat16 (and float8/int4) tensors: numpy cannot compute with them, so the
    emulator cannot run the plan and onnxruntime has no CPU kernels for most ops on them."""
    fix = ("Cast the model to float32 (or float16) before planning: export it in float32, "
           "or convert its bfloat16 initializers and Casts to float32.")
    for name, vi in work.inputs.items():
        kind = _UNRUNNABLE_TYPES.get(vi.type.tensor_type.elem_type)
        if kind is not None:
            readers = [n.name for n in work.nodes if name in n.input]
            read = f", read by node '{readers[0]}'" if readers else ""
            raise InputError(
                f"Model file '{work.spec}': input '{name}' is {kind}{read}; fuseplan's "
                f"emulator cannot compute in {kind}. {fix} Give the model a float32 input.")
    for node in work.nodes:
        for out in node.output:
            tp = types.get(out)
            kind = _UNRUNNABLE_TYPES.get(tp.tensor_type.elem_type) if tp is not None else None
            if kind is not None:
                raise InputError(
                    f"Model file '{work.spec}': node '{node.name}' ({node.op_type}) produces "
                    f"{kind} tensor '{out}'; fuseplan's emulator cannot compute in {kind}. "
                    f"{fix}")
        for name in node.input:
            if name in work.inits:
                kind = _UNRUNNABLE_TYPES.get(work.inits[name].data_type)
            elif name in work.folded:
                kind = _UNRUNNABLE_TYPES.get(onnx.helper.np_dtype_to_tensor_dtype(
                    work.folded[name].dtype))
            else:
                continue
            if kind is not None:
                raise InputError(
                    f"Model file '{work.spec}': node '{node.name}' ({node.op_type}) reads "
                    f"{kind} constant '{name}'; fuseplan's emulator cannot compute in {kind}. "
                    f"{fix}")


def _check_sizes(model: onnx.ModelProto, spec: str) -> None:
    """Refuse an intermediate tensor past MAX_TENSOR_ELEMENTS (inputs are checked when bound),
    naming the node that makes it."""
    producer = {o: n for n in model.graph.node for o in n.output if o}
    for vi in list(model.graph.value_info) + list(model.graph.output):
        shape = _static_shape(vi.type)
        if shape is not None and prod(shape) > MAX_TENSOR_ELEMENTS:
            node = producer.get(vi.name)
            made = f" (output of node '{node.name}', {node.op_type})" if node is not None else ""
            _check_size(spec, f"tensor '{vi.name}'{made}", shape, None)


def _check_outputs_defined(work: _Work, graph: onnx.GraphProto) -> None:
    produced = {o for n in work.nodes for o in n.output if o}
    declared = {i.name for i in graph.input} | set(work.inits)
    for out in graph.output:
        if out.name not in produced and out.name not in declared:
            raise _not_onnx(work.spec, f"graph output '{out.name}' is produced by no node")


def _all_shapes(model: onnx.ModelProto) -> dict[str, tuple[int, ...]]:
    graph = model.graph
    shapes = {t.name: tuple(int(d) for d in t.dims) for t in graph.initializer}
    for vi in list(graph.input) + list(graph.value_info) + list(graph.output):
        shape = _static_shape(vi.type)
        if shape is not None:
            shapes[vi.name] = shape
    return shapes


def _expected_channels(node: onnx.NodeProto, shapes: Mapping[str, tuple[int, ...]]) -> int | None:
    """Input channels a node's parameters (input 1) expect, for the ops the table says how
    (convolutions, per-channel normalizations)."""
    if len(node.input) < 2 or node.input[1] not in shapes or node.domain not in _DEFAULT_DOMAINS:
        return None
    in_channels = op_spec(node.op_type).in_channels
    if in_channels is None:
        return None
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    return in_channels(shapes[node.input[1]], attrs)


def _check_channels(model: onnx.ModelProto, spec: str) -> None:
    """Catch channel mismatches that ONNX shape inference lets through (e.g. a bad --shape)."""
    shapes = _all_shapes(model)
    for node in model.graph.node:
        expected = _expected_channels(node, shapes)
        data = shapes.get(node.input[0]) if node.input else None
        if expected is None or data is None or len(data) < 2 or data[1] == expected:
            continue
        raise InputError(
            f"Model file '{spec}': node '{node.name}' ({node.op_type}) expects {expected} input "
            f"channels from its weights but tensor '{node.input[0]}' has shape {list(data)}. "
            f"Check the --shape values ({_SHAPE_HINT}); the channel dims must match the model."
        )
