"""Fold constants: evaluate nodes whose inputs are all known (Shape/Size of statically shaped
tensors too) with numpy or onnx's ReferenceEvaluator, one round at a time."""

from __future__ import annotations

from collections.abc import Sequence
from math import prod

import numpy as np
import onnx
from onnx import numpy_helper
from onnx.reference import ReferenceEvaluator

from fuseplan.planner.core.errors import InputError
from fuseplan.planner.front.shape_bind import _SHAPE_HINT, _check_size
from fuseplan.planner.front.work import _DEFAULT_DOMAINS, _one_line, _Work

# Nodes never folded even when all their inputs are constant: non-deterministic,
# control flow, or producing non-tensor values.
_NEVER_FOLD = frozenset({
    "RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial",
    "Bernoulli", "If", "Loop", "Scan", "SequenceConstruct", "SequenceEmpty", "SequenceInsert",
    "SequenceErase", "SequenceAt", "SequenceLength", "SplitToSequence", "ConcatFromSequence",
    "SequenceMap", "Optional", "OptionalGetElement", "OptionalHasElement",
})
# Nodes evaluated directly with numpy (cheap and frequent); the rest use ReferenceEvaluator.
_NUMPY_FOLD = frozenset({"Constant", "ConstantOfShape", "Shape", "Size"})
# What ReferenceEvaluator raises when an operator cannot run on its (constant) inputs.
_EVAL_ERRORS: tuple[type[BaseException], ...] = (
    ValueError, TypeError, IndexError, KeyError, RuntimeError, NotImplementedError,
    ArithmeticError, AttributeError,
)


def _static_input_shape(work: _Work, name: str) -> tuple[int, ...] | None:
    if work.is_const(name):
        return work.const_shape(name)
    return work.shapes.get(name)


def _foldable(node: onnx.NodeProto, work: _Work, pending: set[str]) -> bool:
    """Whether a node can be evaluated now: all inputs constant (or a Shape of a static tensor)."""
    if node.domain not in _DEFAULT_DOMAINS or node.op_type in _NEVER_FOLD:
        return False
    if node.op_type in ("Shape", "Size"):
        src = node.input[0]
        return src in pending or _static_input_shape(work, src) is not None
    if not node.input and node.op_type != "Constant":
        return False
    return all(not i or i in pending or work.is_const(i) for i in node.input)


def _fold_round(work: _Work, opset_imports: Sequence[onnx.OperatorSetIdProto]) -> bool:
    """Evaluate every currently foldable node; return whether anything was folded."""
    pending: set[str] = set()
    batch: list[onnx.NodeProto] = []
    for node in work.nodes:
        if _foldable(node, work, pending):
            batch.append(node)
            pending.update(o for o in node.output if o)
    if not batch:
        return False
    _evaluate(batch, work, opset_imports)
    for node in batch:  # in order: a node reads only earlier nodes' outputs
        if node.op_type in ("Shape", "Size") or any(i in work.shaped for i in node.input):
            work.shaped.update(o for o in node.output if o)
    folded = {id(n) for n in batch}
    work.nodes = [n for n in work.nodes if id(n) not in folded]
    return True


def _evaluate(
    batch: Sequence[onnx.NodeProto], work: _Work, opset_imports: Sequence[onnx.OperatorSetIdProto]
) -> None:
    """Evaluate foldable nodes in order: cheap ones with numpy, runs of others in one model."""
    group: list[onnx.NodeProto] = []
    group_outputs: set[str] = set()
    for node in batch:
        if node.op_type in _NUMPY_FOLD and _numpy_ready(node):
            if any(i in group_outputs for i in node.input):
                _evaluate_group(group, work, opset_imports)
                group, group_outputs = [], set()
            _evaluate_numpy(node, work)
        elif node.op_type == "DequantizeLinear" and _numpy_dequantizable(node):
            # quantized weights (QDQ models): onnx's reference evaluator lacks the operator
            # before opset 19, and numpy does it exactly
            if any(i in group_outputs for i in node.input):
                _evaluate_group(group, work, opset_imports)
                group, group_outputs = [], set()
            if not _dequantize(node, work):
                _evaluate_group([node], work, opset_imports)
        else:
            group.append(node)
            group_outputs.update(o for o in node.output if o)
    if group:
        _evaluate_group(group, work, opset_imports)


def _numpy_ready(node: onnx.NodeProto) -> bool:
    """Whether numpy can evaluate this node (Constant only for plain numeric attributes)."""
    if node.op_type == "Constant":
        return len(node.attribute) == 1 and node.attribute[0].name in (
            "value", "value_float", "value_floats", "value_int", "value_ints")
    return True


def _evaluate_numpy(node: onnx.NodeProto, work: _Work) -> None:
    op = node.op_type
    if op == "Constant":
        result = _constant_value(node.attribute[0])
    elif op == "ConstantOfShape":
        dims = tuple(int(d) for d in work.value(node.input[0]).reshape(-1))
        if any(d < 0 for d in dims):
            raise InputError(
                f"Model file '{work.spec}': node '{node.name}' (ConstantOfShape) is asked for "
                f"the shape {list(dims)}, which has a negative dim. Fix or re-export the "
                f"model; if the shape comes from the inputs, check the {_SHAPE_HINT} values.")
        _check_size(work.spec, f"the output of node '{node.name}' (ConstantOfShape)", dims,
                    None)  # before numpy allocates it
        fill = np.zeros((), np.float32)
        for attr in node.attribute:
            if attr.name == "value":
                fill = numpy_helper.to_array(attr.t).reshape(())
        # one value: a view of it, no memory (planner.front.fills keeps it so)
        result = np.broadcast_to(fill, dims)
    else:
        shape = _static_input_shape(work, node.input[0])
        assert shape is not None  # guaranteed by _foldable
        if op == "Size":
            result = np.array(prod(shape), dtype=np.int64)
        else:
            attrs = {a.name: a.i for a in node.attribute}
            start, end = attrs.get("start", 0), attrs.get("end", len(shape))
            result = np.array(shape[start:end], dtype=np.int64)
    work.folded[node.output[0]] = result


def _numpy_dequantizable(node: onnx.NodeProto) -> bool:
    """Whether numpy can dequantize this node: per-tensor or per-axis, not blocked."""
    return not any(a.name == "block_size" and a.i for a in node.attribute) \
        and len(node.input) >= 2 and all(node.input[:2])


def _dequantize(node: onnx.NodeProto, work: _Work) -> bool:
    """DequantizeLinear of constants, y = (x - zero_point) * scale as onnxruntime computes it
    (the difference as an integer, then float); False for element types numpy does not
    hold (the float8 ones), which the reference evaluator then tries."""
    x = work.value(node.input[0])
    scale = work.value(node.input[1])
    zero = work.value(node.input[2]) if len(node.input) > 2 and node.input[2] else None
    if x.dtype.kind not in "iu" or scale.dtype.kind != "f" or scale.ndim > 1 \
            or (zero is not None and (zero.dtype.kind not in "iu" or zero.shape != scale.shape)):
        return False
    diff = x.astype(np.int64) - (zero.astype(np.int64) if zero is not None else 0) \
        if scale.ndim == 0 else None
    if scale.ndim == 1:  # per axis
        axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
        if not -x.ndim <= axis < x.ndim or x.shape[axis] != scale.shape[0]:
            return False
        shape = [1] * x.ndim
        shape[axis] = scale.shape[0]
        diff = x.astype(np.int64) - (zero.reshape(shape).astype(np.int64)
                                     if zero is not None else 0)
        scale = scale.reshape(shape)
    assert diff is not None
    work.folded[node.output[0]] = (diff.astype(np.float32) * scale.astype(np.float32)) \
        .astype(scale.dtype)
    return True


def _constant_value(attr: onnx.AttributeProto) -> np.ndarray:
    if attr.name == "value":
        return numpy_helper.to_array(attr.t)
    if attr.name == "value_float":
        return np.array(attr.f, dtype=np.float32)
    if attr.name == "value_floats":
        return np.array(list(attr.floats), dtype=np.float32)
    if attr.name == "value_int":
        return np.array(attr.i, dtype=np.int64)
    return np.array(list(attr.ints), dtype=np.int64)


def _evaluate_group(
    group: Sequence[onnx.NodeProto], work: _Work, opset_imports: Sequence[onnx.OperatorSetIdProto]
) -> None:
    """Run a run of foldable nodes through one ReferenceEvaluator model."""
    try:
        work.folded.update(_reference_run(group, work, opset_imports))
    except _EVAL_ERRORS:
        for node in group:  # find the culprit and name it
            try:
                work.folded.update(_reference_run([node], work, opset_imports))
            except _EVAL_ERRORS as exc:
                # onnx's reference evaluator has bugs of its own (GatherElements of a
                # [1, 512] buffer by [1, 128] position ids, as BERT exports write it): the
                # model is at fault only when onnxruntime, the golden reference, fails too
                refused = _runtime_refusal([node], work, opset_imports)
                if refused is not None:
                    raise InputError(
                        f"Model file '{work.spec}': node '{node.name}' ({node.op_type}) fails "
                        f"on its constant inputs in onnxruntime too: {refused}. Fix or "
                        "re-export the model.") from exc


def _runtime_refusal(nodes: Sequence[onnx.NodeProto], work: _Work,
                     opset_imports: Sequence[onnx.OperatorSetIdProto]) -> str | None:
    """Fold `nodes` with onnxruntime into `work`; None when it ran, else what it said."""
    import onnxruntime as ort  # only when onnx's own evaluator failed: a slow import

    model, feeds, outputs = _fold_model(nodes, work, opset_imports)
    options = ort.SessionOptions()
    options.log_severity_level = 3  # its warnings are not the user's business here
    try:
        session = ort.InferenceSession(model.SerializeToString(), options,
                                       providers=["CPUExecutionProvider"])
        results = session.run([vi.name for vi in outputs], feeds)
    except Exception as exc:  # onnxruntime raises its own exception types
        return _one_line(str(exc)) or type(exc).__name__
    work.folded.update({vi.name: np.asarray(r) for vi, r in zip(outputs, results, strict=True)})
    return None


def _reference_run(
    nodes: Sequence[onnx.NodeProto], work: _Work, opset_imports: Sequence[onnx.OperatorSetIdProto]
) -> dict[str, np.ndarray]:
    model, feeds, outputs = _fold_model(nodes, work, opset_imports)
    results = ReferenceEvaluator(model).run(None, feeds)
    return {vi.name: np.asarray(r) for vi, r in zip(outputs, results, strict=True)}


def _fold_model(
    nodes: Sequence[onnx.NodeProto], work: _Work, opset_imports: Sequence[onnx.OperatorSetIdProto]
) -> tuple[onnx.ModelProto, dict[str, np.ndarray], list[onnx.ValueInfoProto]]:
    """`nodes` as a model of their own: constant inputs fed, every output asked for."""
    produced = {o for n in nodes for o in n.output if o}
    feeds: dict[str, np.ndarray] = {}
    for node in nodes:
        for name in node.input:
            if name and name not in produced and name not in feeds:
                feeds[name] = work.value(name)
    inputs = [
        onnx.helper.make_tensor_value_info(
            name, onnx.helper.np_dtype_to_tensor_dtype(arr.dtype), arr.shape)
        for name, arr in feeds.items()
    ]
    outputs = [onnx.ValueInfoProto(name=o) for n in nodes for o in n.output if o]
    graph = onnx.helper.make_graph(list(nodes), "fold", inputs, outputs)
    model = onnx.helper.make_model(graph, opset_imports=list(opset_imports))
    return model, feeds, outputs


def _has_unresolved_shape_nodes(work: _Work) -> bool:
    return any(
        n.op_type in ("Shape", "Size") and n.domain in _DEFAULT_DOMAINS for n in work.nodes)
