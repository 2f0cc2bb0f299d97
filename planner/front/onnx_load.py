"""Load an ONNX model, bind its input shapes, fold its constants and infer every shape.

The planner works on a *cleaned* model: only real (non-constant) graph inputs, every
weight stored as an initializer, no ``Constant``/``ConstantOfShape`` nodes, every node
named, and a concrete static shape for every tensor in ``graph.value_info``.

``load_model`` pipeline: read + check the file; treat inputs that have an initializer as
constants; name unnamed/duplicate nodes ``{op_type}_{index}``; drop nodes that do not reach an
output; bind input shapes (``--shape``); fold constants to a fixed point (Constant,
ConstantOfShape, Shape/Size of statically shaped tensors with numpy, every other node whose
inputs are all constant in one ReferenceEvaluator model per run of such nodes), with strict
shape inference (data propagation) between rounds so Shape nodes of intermediate tensors fold
too; drop dead nodes, initializers, unused inputs and unused optional outputs; write the
inferred shapes (or, where inference gives none, shapes measured with onnxruntime) into the
graph.
"""

from __future__ import annotations

import difflib
import hashlib
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cache
from math import prod
from pathlib import Path
from types import MappingProxyType

import numpy as np
import onnx
import onnxruntime as ort
from google.protobuf.message import DecodeError
from onnx import TensorProto, numpy_helper
from onnx.reference import ReferenceEvaluator
from onnxruntime.capi import onnxruntime_pybind11_state as ort_state

from fuseplan.planner.core.errors import InputError
from fuseplan.planner.ir.ops import BranchScale, InputRole, Rectified, ShapeParam, op_spec

ZOO: dict[str, str] = {
    name: f"light_{name}.onnx"
    for name in (
        "resnet50",
        "vgg19",
        "bvlc_alexnet",
        "zfnet512",
        "squeezenet",
        "inception_v1",
        "inception_v2",
        "densenet121",
        "shufflenet",
    )
}
"""Zoo name -> file name of the "light" test models shipped inside the onnx package."""

_ZOO_PREFIX = "zoo:"
_DEFAULT_DOMAINS = ("", "ai.onnx")
_SHAPE_HINT = "--shape NAME=D0,D1,..."

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
# Float initializers bigger than this are given to shape inference as typed inputs instead of
# data: their values never matter for shapes, and serialising them is slow.
_SKELETON_MAX_ELEMS = 64
# The largest tensor (elements) a model may have: 2**31 - 1, the int32 index limit, 8 GiB as
# float32. Past it verify cannot hold a feature map, and the tile search runs for hours.
MAX_TENSOR_ELEMENTS = 2**31 - 1

_ORT_ERRORS: tuple[type[BaseException], ...] = (
    ort_state.Fail,
    ort_state.InvalidArgument,
    ort_state.InvalidGraph,
    ort_state.InvalidProtobuf,
    ort_state.NoSuchFile,
    ort_state.NotImplemented,
    ort_state.RuntimeException,
    ort_state.EPFail,
    ValueError,
)
# What ReferenceEvaluator raises when an operator cannot run on its (constant) inputs.
_EVAL_ERRORS: tuple[type[BaseException], ...] = (
    ValueError, TypeError, IndexError, KeyError, RuntimeError, NotImplementedError,
    ArithmeticError, AttributeError,
)
_FLOAT_TYPES = frozenset({
    onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16,
})


@dataclass(frozen=True)
class LoadedModel:
    """A cleaned model plus what the planner needs to know about where it came from."""

    proto: onnx.ModelProto
    path: str
    file: Path
    sha256: str
    inputs: dict[str, tuple[int, ...]]
    outputs: tuple[str, ...]
    opset: int


# --------------------------------------------------------------------------- resolving


def zoo_dir() -> Path:
    """Directory holding the light zoo models inside the installed onnx package."""
    return Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"


def resolve_model(spec: str) -> Path:
    """Turn a model path or ``zoo:NAME`` into an existing file path.

    Raises InputError for an unknown zoo name (listing the valid names) or a missing file.
    """
    if spec.startswith(_ZOO_PREFIX):
        return _resolve_zoo(spec)
    path = Path(spec).expanduser()
    if not path.exists():
        raise InputError(
            f"Model file '{spec}' does not exist. Check the path, or use zoo:NAME for a "
            f"bundled model ({', '.join(ZOO)})."
        )
    if not path.is_file():
        raise InputError(
            f"Model path '{spec}' is not a regular file. Pass the path of an .onnx file."
        )
    return path


def _resolve_zoo(spec: str) -> Path:
    name = spec[len(_ZOO_PREFIX):]
    if name not in ZOO:
        close = difflib.get_close_matches(name, list(ZOO), n=1)
        hint = f" Did you mean 'zoo:{close[0]}'?" if close else ""
        raise InputError(
            f"Unknown zoo model '{name}' in '{spec}'.{hint} Valid names: "
            f"{', '.join(ZOO)}. Pass zoo:NAME with one of them as MODEL, or a path to an "
            ".onnx file."
        )
    path = zoo_dir() / ZOO[name]
    if not path.is_file():
        raise InputError(
            f"Zoo model '{spec}' should be at '{path}' but the installed onnx package does "
            "not ship it. Reinstall onnx (the full wheel includes its backend test data) or "
            "pass a model file path instead."
        )
    return path


def parse_shape_option(text: str) -> tuple[str, tuple[int, ...]]:
    """Parse ``NAME=D0,D1,...`` (one ``--shape`` option) into a name and positive dims."""
    name, sep, dims_text = text.rpartition("=")
    name = name.strip()
    parts = [p.strip() for p in dims_text.split(",")]
    if not sep or not name or not all(re.fullmatch(r"[0-9]+", p) for p in parts):
        raise InputError(
            f"Bad --shape value '{text}': expected NAME=D0,D1,... with the input name, an "
            "equals sign and comma-separated integer dims, e.g. --shape data_0=1,3,224,224."
        )
    dims = tuple(int(p) for p in parts)
    if any(d <= 0 for d in dims):
        raise InputError(
            f"Bad --shape value '{text}': every dim must be a positive integer. Pass e.g. "
            f"--shape {name}=1,3,224,224."
        )
    return name, dims


# --------------------------------------------------------------------------- reading


def _read_bytes(file: Path, spec: str) -> bytes:
    try:
        return file.read_bytes()
    except OSError as exc:
        raise InputError(
            f"Model file '{spec}' cannot be read ({exc.strerror or exc}). Check the path and "
            "its permissions."
        ) from exc


def _not_onnx(spec: str, why: str) -> InputError:
    return InputError(
        f"Model file '{spec}' is not a readable ONNX model ({why}). Pass an .onnx file "
        "exported by a framework (e.g. torch.onnx.export); if it was copied or downloaded, "
        "check that the transfer completed."
    )


def _parse_model(data: bytes, file: Path, spec: str) -> onnx.ModelProto:
    """Parse, load external data, and lightly check the model."""
    if not data:
        raise _not_onnx(spec, "the file is empty")
    try:
        proto = onnx.load_model_from_string(data)
    except (DecodeError, ValueError, RuntimeError) as exc:
        raise _not_onnx(spec, f"protobuf decoding failed: {exc}") from exc
    if not proto.HasField("graph") or not proto.opset_import or not proto.graph.output:
        raise _not_onnx(spec, "it has no graph, opset or outputs")
    if _external_tensors(proto):
        _check_external_data(proto, file, spec)  # before onnx reads a byte of it
        try:
            onnx.load_external_data_for_model(proto, str(file.parent))
        except (OSError, ValueError, onnx.checker.ValidationError) as exc:
            raise InputError(
                f"Model file '{spec}' refers to external weight data that cannot be read "
                f"({_one_line(str(exc))}). Keep the external data files next to the model, "
                "as they were saved with it."
            ) from exc
    try:
        onnx.checker.check_model(proto)
    except onnx.checker.ValidationError as exc:
        raise _not_onnx(spec, f"the ONNX checker rejected it: {_one_line(str(exc))}") from exc
    except ValueError:  # over 2 GB: the C++ checker needs the file itself
        try:
            onnx.checker.check_model(str(file))
        except onnx.checker.ValidationError as exc:
            raise _not_onnx(spec, f"the ONNX checker rejected it: {_one_line(str(exc))}") from exc
    return proto


def _graph_tensors(graph: onnx.GraphProto) -> Iterable[onnx.TensorProto]:
    """Every tensor stored in a graph: initializers and node attributes, subgraphs included."""
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield sparse.values
        yield sparse.indices
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            if attr.HasField("g"):
                yield from _graph_tensors(attr.g)
            for sub in attr.graphs:
                yield from _graph_tensors(sub)


def _external_tensors(proto: onnx.ModelProto) -> list[onnx.TensorProto]:
    tensors = list(_graph_tensors(proto.graph))
    for function in proto.functions:
        for node in function.node:
            for attr in node.attribute:
                if attr.HasField("t"):
                    tensors.append(attr.t)
                tensors.extend(attr.tensors)
    return [t for t in tensors if t.data_location == onnx.TensorProto.EXTERNAL]


def _check_external_data(proto: onnx.ModelProto, file: Path, spec: str) -> None:
    """Every external-data location is a regular file inside the model's folder (symlinks
    resolved): checked on the location strings, so nothing outside is ever opened."""
    folder = file.resolve().parent
    fix = ("Keep the external data files in the model's folder (or below it) and refer to "
           "them by relative paths, as onnx.save(..., save_as_external_data=True) writes them.")
    for tensor in _external_tensors(proto):
        entries = {e.key: e.value for e in tensor.external_data}
        location = entries.get("location", "")
        name = tensor.name or "(unnamed)"
        if not location:
            raise InputError(
                f"Model file '{spec}': tensor '{name}' is stored externally but names no "
                f"location for its data. {fix}")
        if "\0" in location:
            raise InputError(
                f"Model file '{spec}': tensor '{name}' names its external data file "
                f"{location!r}, which holds a NUL character; fuseplan refuses it as unsafe. "
                f"{fix}")
        target = Path(location)
        if target.is_absolute() or target.drive or "\\" in location:
            raise InputError(
                f"Model file '{spec}': tensor '{name}' points its external data at the absolute "
                f"(or drive or backslash) path '{location}'; fuseplan refuses it as unsafe and "
                f"reads nothing there. {fix}")
        resolved = (folder / target).resolve()
        if not resolved.is_relative_to(folder):
            raise InputError(
                f"Model file '{spec}': tensor '{name}' points its external data at "
                f"'{location}', outside the model's folder '{folder}'; fuseplan refuses it as "
                f"unsafe and reads nothing there. {fix}")
        if not resolved.is_file():
            missing = "does not exist" if not resolved.exists() else "is not a regular file"
            raise InputError(
                f"Model file '{spec}': tensor '{name}' keeps its data in external file "
                f"'{location}', which {missing} (looked for '{resolved}'). Copy the external "
                "data file next to the model, where it was saved with it, or save the model "
                "with its weights inside (onnx.save without save_as_external_data).")


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _default_opset(proto: onnx.ModelProto, spec: str) -> int:
    for op in proto.opset_import:
        if op.domain in _DEFAULT_DOMAINS:
            return int(op.version)
    raise InputError(
        f"Model file '{spec}' imports no default-domain (ai.onnx) opset, so its operators "
        "cannot be interpreted. Re-export it with a standard opset (9 to 17)."
    )


@cache
def ort_max_opset() -> int:
    """The newest default-domain (ai.onnx) opset the installed onnxruntime implements: the
    highest version of its operator schemas (onnx's own newest opset if it cannot tell)."""
    try:
        from onnxruntime.capi import _pybind_state

        versions = [int(s.since_version) for s in _pybind_state.get_all_operator_schema()
                    if s.domain in _DEFAULT_DOMAINS]
    except (ImportError, AttributeError, RuntimeError):
        versions = []
    return max(versions) if versions else int(onnx.defs.onnx_opset_version())


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


# --------------------------------------------------------------------------- working state


@dataclass
class _Work:
    """Mutable state of the cleaning pipeline (private to one load_model call)."""

    spec: str
    nodes: list[onnx.NodeProto]
    inits: dict[str, onnx.TensorProto]
    folded: dict[str, np.ndarray] = field(default_factory=dict)
    inputs: dict[str, onnx.ValueInfoProto] = field(default_factory=dict)
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)

    def is_const(self, name: str) -> bool:
        return name in self.inits or name in self.folded

    def value(self, name: str) -> np.ndarray:
        if name in self.folded:
            return self.folded[name]
        arr = numpy_helper.to_array(self.inits[name])
        self.folded[name] = arr
        del self.inits[name]
        return arr

    def const_shape(self, name: str) -> tuple[int, ...]:
        if name in self.folded:
            return tuple(self.folded[name].shape)
        return tuple(int(d) for d in self.inits[name].dims)


def _name_nodes(nodes: Sequence[onnx.NodeProto]) -> None:
    """Give every node a unique non-empty name: keep the first use of a name, and call the
    others ``{op_type}_{index}`` (index in the original node list)."""
    explicit = {n.name for n in nodes if n.name}
    taken: set[str] = set()
    for index, node in enumerate(nodes):
        if node.name and node.name not in taken:
            taken.add(node.name)
            continue
        base = f"{node.op_type}_{index}"
        name, k = base, 1
        while name in taken or name in explicit:
            name, k = f"{base}_{k}", k + 1
        node.name = name
        taken.add(name)


def _subgraph_inputs(node: onnx.NodeProto) -> set[str]:
    """Names a node's subgraphs (If/Loop/Scan bodies) may read from the outer scope."""
    names: set[str] = set()
    for attr in node.attribute:
        graphs = list(attr.graphs) + ([attr.g] if attr.HasField("g") else [])
        for g in graphs:
            for inner in g.node:
                names.update(i for i in inner.input if i)
                names.update(_subgraph_inputs(inner))
    return names


def _node_reads(node: onnx.NodeProto) -> set[str]:
    return {i for i in node.input if i} | _subgraph_inputs(node)


def _live_nodes(nodes: Sequence[onnx.NodeProto], outputs: Iterable[str]) -> list[onnx.NodeProto]:
    """Nodes that contribute to the graph outputs, in their original order."""
    needed = set(outputs)
    keep = [False] * len(nodes)
    for index in range(len(nodes) - 1, -1, -1):
        node = nodes[index]
        if any(o in needed for o in node.output if o):
            keep[index] = True
            needed |= _node_reads(node)
    return [n for n, k in zip(nodes, keep, strict=True) if k]


def _trim_unused_outputs(
    nodes: Sequence[onnx.NodeProto], outputs: Iterable[str], opset: int
) -> None:
    """Drop optional node outputs nobody reads (e.g. Dropout's mask), which often lack shapes."""
    used = _used_names(nodes, outputs)
    for node in nodes:
        if node.domain not in _DEFAULT_DOMAINS or len(node.output) < 2:
            continue
        try:
            schema = onnx.defs.get_schema(node.op_type, opset, "")
        except onnx.defs.SchemaError:
            continue
        formal = schema.outputs
        names = list(node.output)
        for index in range(1, len(names)):
            param = formal[min(index, len(formal) - 1)]
            if names[index] not in used and \
                    param.option == onnx.defs.OpSchema.FormalParameterOption.Optional:
                names[index] = ""
        while len(names) > 1 and not names[-1]:
            names.pop()
        if names != list(node.output):
            node.ClearField("output")
            node.output.extend(names)


def _used_names(nodes: Iterable[onnx.NodeProto], outputs: Iterable[str]) -> set[str]:
    used = set(outputs)
    for node in nodes:
        used |= _node_reads(node)
    return used


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


# --------------------------------------------------------------------------- shape binding


def _declared_dims(vi: onnx.ValueInfoProto) -> list[int | str | None] | None:
    """Declared dims of an input: int, symbolic name, or None if unknown; None if no shape."""
    ttype = vi.type.tensor_type
    if not ttype.HasField("shape"):
        return None
    dims: list[int | str | None] = []
    for dim in ttype.shape.dim:
        kind = dim.WhichOneof("value")
        dims.append(int(dim.dim_value) if kind == "dim_value" else (dim.dim_param or None))
    return dims


def _bind_input(
    vi: onnx.ValueInfoProto, override: tuple[int, ...] | None, spec: str
) -> tuple[int, ...]:
    """The concrete shape of one real input (declared dims, overridden by --shape)."""
    if vi.type.WhichOneof("value") != "tensor_type":
        raise InputError(
            f"Model file '{spec}': input '{vi.name}' is not a tensor (sequence, map or "
            "optional inputs are not supported). Export the model with tensor inputs only."
        )
    declared = _declared_dims(vi)
    if override is not None:
        override = tuple(int(d) for d in override)
        if any(d <= 0 for d in override):
            raise InputError(
                f"Model file '{spec}': the shape {list(override)} given for input '{vi.name}' "
                f"has a non-positive dim. Pass positive dims with {_SHAPE_HINT}."
            )
        if declared is not None and len(declared) != len(override):
            raise InputError(
                f"Model file '{spec}': --shape {vi.name}={','.join(map(str, override))} has "
                f"rank {len(override)} but input '{vi.name}' has rank {len(declared)} "
                f"(declared dims {_fmt_dims(declared)}). Pass exactly {len(declared)} dims."
            )
        return override
    if declared is None:
        raise InputError(
            f"Model file '{spec}': input '{vi.name}' has no declared shape. Pass its shape "
            f"with --shape {vi.name}=D0,D1,..."
        )
    for index, dim in enumerate(declared):
        if not isinstance(dim, int):
            what = f"dim {index} ('{dim}')" if dim else f"dim {index} (unknown)"
            raise InputError(
                f"Model file '{spec}': input '{vi.name}' has symbolic {what} in its shape "
                f"{_fmt_dims(declared)}. Bind its dims with --shape {vi.name}="
                f"{','.join(f'D{i}' for i in range(len(declared)))}, keeping the declared "
                "numbers, e.g. --shape data=1,3,224,224."
            )
        if dim <= 0:
            wanted = ",".join(str(d) if isinstance(d, int) and d > 0 else f"D{i}"
                              for i, d in enumerate(declared))
            raise InputError(
                f"Model file '{spec}': input '{vi.name}' declares dim {index} as {dim} in its "
                f"shape {_fmt_dims(declared)}; fuseplan plans only tensors whose every dim is "
                f"positive. Pass the real shape with --shape {vi.name}={wanted} (positive "
                "dims), or re-export the model with a positive input shape."
            )
    return tuple(int(d) for d in declared)  # type: ignore[arg-type]


def _check_size(spec: str, what: str, dims: Sequence[int], input_name: str | None) -> None:
    """Refuse a tensor past MAX_TENSOR_ELEMENTS before anything is computed on it (solve would
    search tiles for hours, verify would need its whole map in memory)."""
    elements = prod(dims)
    if elements <= MAX_TENSOR_ELEMENTS:
        return
    fix = (f"Pass a smaller shape with --shape {input_name}=D0,D1,... (e.g. batch 1 and the "
           "resolution the model was trained at)" if input_name is not None else
           f"Bind smaller input shapes with {_SHAPE_HINT}")
    raise InputError(
        f"Model file '{spec}': {what} has shape {list(dims)}, {elements:,} elements; fuseplan "
        f"plans tensors of at most {MAX_TENSOR_ELEMENTS:,} elements (verify holds every "
        f"feature map in memory). {fix}, or re-export the model with a smaller input."
    )


def _fmt_dims(dims: Sequence[int | str | None]) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"


def _bind_shapes(
    work: _Work, graph: onnx.GraphProto, shapes: Mapping[str, tuple[int, ...]]
) -> None:
    """Select the real inputs, check --shape names, and give the used ones concrete dims."""
    real = [vi for vi in graph.input if vi.name not in work.inits]
    names = [vi.name for vi in real]
    for name in shapes:
        if name not in names:
            close = difflib.get_close_matches(name, names, n=1)
            hint = f" Did you mean '{close[0]}'?" if close else ""
            raise InputError(
                f"Model file '{work.spec}': --shape names '{name}', which is not a real input "
                f"of the model.{hint} Its real inputs are: {', '.join(names) or '(none)'}. Name "
                f"one of them in --shape NAME=D0,D1,... (`fuseplan inspect MODEL` lists them)."
            )
    used = _used_names(work.nodes, (o.name for o in graph.output))
    for vi in real:
        if vi.name not in used:
            continue
        dims = _bind_input(vi, shapes.get(vi.name), work.spec)
        _check_size(work.spec, f"input '{vi.name}'", dims, vi.name)
        bound = onnx.ValueInfoProto()
        bound.CopyFrom(vi)
        bound.type.tensor_type.ClearField("shape")
        bound.type.tensor_type.shape.SetInParent()
        for d in dims:
            bound.type.tensor_type.shape.dim.add().dim_value = d
        work.inputs[vi.name] = bound
        work.shapes[vi.name] = dims


# --------------------------------------------------------------------------- folding


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
        result = np.full(dims, fill, dtype=fill.dtype)
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
                raise InputError(
                    f"Model file '{work.spec}': node '{node.name}' ({node.op_type}) fails on "
                    f"its constant inputs: {_one_line(str(exc)) or type(exc).__name__}. Fix "
                    "or re-export the model."
                ) from exc


def _reference_run(
    nodes: Sequence[onnx.NodeProto], work: _Work, opset_imports: Sequence[onnx.OperatorSetIdProto]
) -> dict[str, np.ndarray]:
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
    results = ReferenceEvaluator(model).run(None, feeds)
    return {vi.name: np.asarray(r) for vi, r in zip(outputs, results, strict=True)}


def _has_unresolved_shape_nodes(work: _Work) -> bool:
    return any(
        n.op_type in ("Shape", "Size") and n.domain in _DEFAULT_DOMAINS for n in work.nodes)


# --------------------------------------------------------------------------- shape inference


def _tensor_proto(name: str, arr: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(arr), name)


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


def _static_shape(tp: onnx.TypeProto | None) -> tuple[int, ...] | None:
    """Concrete dims of a tensor type, or None when the type or any dim is unknown."""
    if tp is None or tp.WhichOneof("value") != "tensor_type":
        return None
    ttype = tp.tensor_type
    if not ttype.elem_type or not ttype.HasField("shape"):
        return None
    if any(d.WhichOneof("value") != "dim_value" for d in ttype.shape.dim):
        return None
    return tuple(int(d.dim_value) for d in ttype.shape.dim)


def _record_static(work: _Work, types: Mapping[str, onnx.TypeProto]) -> None:
    for name, tp in types.items():
        shape = _static_shape(tp)
        if shape is not None:
            work.shapes[name] = shape


# --------------------------------------------------------------------------- assembly


_RAW_DTYPES = frozenset(
    np.dtype(t) for t in ("float16", "float32", "float64", "bool", "int8", "int16", "int32",
                          "int64", "uint8", "uint16", "uint32", "uint64"))


def _fill_tensor(tensor: onnx.TensorProto, name: str, arr: np.ndarray) -> None:
    """Write an array into a tensor proto in place (one copy for big numeric weights)."""
    arr = np.asarray(arr)
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


def _ort_max_ir() -> int:
    """Highest IR version the installed onnxruntime accepts (8 if it cannot be told)."""
    import onnxruntime

    major_minor = tuple(int(x) for x in onnxruntime.__version__.split(".")[:2])
    return 10 if major_minor >= (1, 17) else 8


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


# --------------------------------------------------------------------------- public API


def load_model(
    spec: str, shapes: Mapping[str, tuple[int, ...]] = MappingProxyType({})
) -> LoadedModel:
    """Load, validate and clean a model (see the module docstring for what "clean" means).

    ``spec`` is a path or ``zoo:NAME``; ``shapes`` binds input shapes by input name
    (``--shape`` options). Raises InputError for every problem with the model or the shapes.
    """
    file = resolve_model(spec)
    data = _read_bytes(file, spec)
    sha = hashlib.sha256(data).hexdigest()
    model = _parse_model(data, file, spec)
    del data
    opset = _default_opset(model, spec)
    _check_opset(opset, spec)
    graph = model.graph
    nodes = [_copy_node(n) for n in graph.node]
    _name_nodes(nodes)
    work = _Work(spec=spec, nodes=nodes, inits={t.name: t for t in graph.initializer})
    _check_outputs_defined(work, graph)
    work.nodes = _live_nodes(work.nodes, (o.name for o in graph.output))
    _check_control_flow(work.nodes, spec)
    _bind_shapes(work, graph, shapes)
    types = _fold_constants(work, model)
    if _rebatch_reshapes(work, types, spec):
        types = _fold_constants(work, model)
    work.nodes = _live_nodes(work.nodes, (o.name for o in graph.output))
    _trim_unused_outputs(work.nodes, (o.name for o in graph.output), opset)
    _check_runnable(work.nodes, opset, spec)
    _check_element_types(work, types)
    _assemble(work, model, types)
    _check_sizes(model, spec)
    _fill_runtime_shapes(model, spec)
    _check_channels(model, spec)
    return LoadedModel(
        proto=model,
        path=spec,
        file=file,
        sha256=sha,
        inputs={vi.name: _static_shape(vi.type) or () for vi in model.graph.input},
        outputs=tuple(o.name for o in model.graph.output),
        opset=opset,
    )


def _rebatch_reshapes(work: _Work, types: Mapping[str, onnx.TypeProto], spec: str) -> bool:
    """Exports often hard-code the batch in a Reshape's target ([1, 25088] in the zoo VGG).
    When --shape changes the batch, such a target no longer holds the input's elements: keep
    the per-sample shape and put the batch back in axis 0. Any other mismatch is an error."""
    changed = False
    for node in work.nodes:
        if (op_spec(node.op_type).shape_param is not ShapeParam.TARGET_SHAPE
                or len(node.input) < 2 or not work.is_const(node.input[1])):
            continue
        shape = _static_shape(types.get(node.input[0]))
        if shape is None:
            continue
        target = [int(v) for v in work.value(node.input[1]).reshape(-1)]
        dims = [shape[i] if v == 0 and i < len(shape) else v for i, v in enumerate(target)]
        numel = int(np.prod(shape))
        known = int(np.prod([d for d in dims if d != -1]))
        if -1 in dims or known == numel:
            continue
        rest = int(np.prod(dims[1:]))
        if rest > 0 and numel % rest == 0 and shape and numel // rest == shape[0]:
            dims[0] = shape[0]
            work.folded[node.input[1]] = np.array(dims, dtype=np.int64)
            changed = True
            continue
        raise InputError(
            f"Model file '{spec}': node '{node.name}' (Reshape) cannot reshape {list(shape)} "
            f"({numel} elements) into {target}. Check the --shape values ({_SHAPE_HINT})."
        )
    return changed


def _copy_node(node: onnx.NodeProto) -> onnx.NodeProto:
    copy = onnx.NodeProto()
    copy.CopyFrom(node)
    return copy


def _fold_constants(work: _Work, model: onnx.ModelProto) -> dict[str, onnx.TypeProto]:
    """Fold to a fixed point, inferring shapes between rounds; return the final types."""
    _fold_round(work, model.opset_import)
    while True:
        types = _infer_types(work, model)
        _record_static(work, types)
        if not _has_unresolved_shape_nodes(work) or not _fold_round(work, model.opset_import):
            return types


def randomize_weights(model: LoadedModel, seed: int) -> LoadedModel:
    """Replace every float weight initializer with seeded random values that keep activations O(1).

    Conv/Gemm/MatMul weights ~ N(0, 2/fan_in) (N(0, 1/fan_in) when the layer's input does not
    come from a ReLU-like op); biases ~ 0.01 N; BatchNormalization scale and var ~ U(0.5, 1.5),
    bias and mean ~ 0.1 N; PRelu slopes ~ U(0, 0.3); other float constants of Mul/Div
    ~ U(0.5, 1.5) and of Add/Sub/Sum ~ 0.1 N. Where two feature maps are added (residual
    connections) the last BN scale / conv weight of each parametrised branch is damped (by 0.2
    next to an identity path, by 1/sqrt(k) when all k inputs are parametrised) so the sums do
    not double the variance at every block. Integer tensors, Resize/Upsample scales, sizes and
    roi, Clip bounds, Pad values and anything else are left alone. ``sha256`` is kept: it
    identifies the model file.
    """
    rng = np.random.default_rng(seed)
    roles = _weight_roles(model.proto)
    proto = onnx.ModelProto()
    proto.CopyFrom(model.proto)
    for tensor in proto.graph.initializer:
        role = roles.get(tensor.name)
        if role is None or tensor.data_type not in _FLOAT_TYPES:
            continue
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)
        shape = tuple(int(d) for d in tensor.dims)
        values = (_random_values(rng, role, shape) * role.factor).astype(dtype)
        for name in ("float_data", "double_data", "int32_data", "external_data"):
            tensor.ClearField(name)
        tensor.data_location = onnx.TensorProto.DEFAULT
        tensor.raw_data = _raw_bytes(values)
    return replace(model, proto=proto)


_RESIDUAL_DAMPING = 0.2


@dataclass(frozen=True)
class _Role:
    """How to draw one initializer: kind, fan_in (weights) and a final multiplier."""

    kind: str  # weight, bias, scale, shift, prelu, mul, add
    fan_in: int = 1
    factor: float = 1.0


def _random_values(rng: np.random.Generator, role: _Role, shape: tuple[int, ...]) -> np.ndarray:
    if role.kind == "weight":
        return rng.standard_normal(shape) * np.sqrt(2.0 / max(role.fan_in, 1))
    if role.kind == "bias":
        return 0.01 * rng.standard_normal(shape)
    if role.kind in ("scale", "mul"):
        return rng.uniform(0.5, 1.5, shape)
    if role.kind == "prelu":
        return rng.uniform(0.0, 0.3, shape)
    return 0.1 * rng.standard_normal(shape)  # shift, add


class _GraphView:
    """Producers and float constants of a graph, for the weight-role heuristics."""

    def __init__(self, proto: onnx.ModelProto) -> None:
        self.shapes = {t.name: tuple(int(d) for d in t.dims) for t in proto.graph.initializer
                       if t.data_type in _FLOAT_TYPES}
        self.consts = {t.name for t in proto.graph.initializer}
        self.producer = {o: n for n in proto.graph.node for o in n.output if o}

    def relu_fed(self, name: str, depth: int = 0) -> bool:
        """Whether a tensor comes (through pooling and shape-only ops) from a ReLU-like
        activation."""
        node = self.producer.get(name)
        if node is None or depth > 32:
            return False
        rectified = op_spec(node.op_type).rectified
        if rectified is Rectified.ALWAYS:
            return True
        feats = [i for i in node.input if i and i not in self.consts]
        return rectified is Rectified.IF_INPUTS and bool(feats) and all(
            self.relu_fed(i, depth + 1) for i in feats)

    def branch_param(self, name: str, depth: int = 0) -> str | None:
        """The initializer that scales a residual branch's output (BN scale or conv weight)."""
        node = self.producer.get(name)
        if node is None or depth > 8:
            return None
        scale, inputs = op_spec(node.op_type).branch_scale, list(node.input)
        if scale is BranchScale.INPUT1:
            return inputs[1] if len(inputs) > 1 and inputs[1] in self.consts else None
        consts = [i for i in inputs if i in self.shapes]
        feats = [i for i in inputs if i and i not in self.consts]
        if not consts or len(feats) != 1:
            return None
        if scale is BranchScale.OPERAND:
            return consts[0]
        if scale is BranchScale.THROUGH:
            return self.branch_param(feats[0], depth + 1)
        return None


def _weight_roles(proto: onnx.ModelProto) -> dict[str, _Role]:
    """Initializer name -> role, only for float initializers every consumer uses as a weight."""
    view = _GraphView(proto)
    roles: dict[str, _Role] = {}
    protected: set[str] = set()
    for node in proto.graph.node:
        for index, name in enumerate(node.input):
            if name not in view.shapes:
                continue
            role = _input_role(node, index, view.shapes[name])
            if role is None:
                protected.add(name)
            elif name not in roles:
                if role.kind == "weight" and node.input[0] and not view.relu_fed(node.input[0]):
                    role = replace(role, factor=np.sqrt(0.5))
                roles[name] = role
    for name, damping in _residual_damping(proto, view).items():
        if name in roles:
            roles[name] = replace(roles[name], factor=roles[name].factor * damping)
    return {k: v for k, v in roles.items() if k not in protected}


def _residual_damping(proto: onnx.ModelProto, view: _GraphView) -> dict[str, float]:
    """Initializer -> multiplier damping the branches summed by Add/Sum of feature maps."""
    damping: dict[str, float] = {}
    for node in proto.graph.node:
        if not op_spec(node.op_type).sums_inputs:
            continue
        feats = [i for i in node.input if i and i not in view.consts]
        if len(feats) < 2:
            continue
        params = [view.branch_param(i) for i in feats]
        found = [p for p in params if p is not None]
        factor = 1 / np.sqrt(len(feats)) if len(found) == len(feats) else _RESIDUAL_DAMPING
        for name in found:
            damping[name] = min(damping.get(name, 1.0), float(factor))
    return damping


def _input_role(node: onnx.NodeProto, index: int, shape: tuple[int, ...]) -> _Role | None:
    """The role of a constant float input of a node (the op table's), or None to leave it
    untouched."""
    if node.domain not in _DEFAULT_DOMAINS:
        return None
    spec = op_spec(node.op_type)
    role = spec.role(index)
    if role is None:
        return None
    if role is not InputRole.WEIGHT:
        return _Role(role.value)
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    fan_in = spec.fan_in(index, shape, attrs) if spec.fan_in is not None else None
    return None if fan_in is None else _Role(role.value, fan_in)


def random_inputs(model: LoadedModel, seed: int) -> dict[str, np.ndarray]:
    """Seeded N(0, 1) values for every real input (float32 unless the input says otherwise).

    Integer and bool inputs get zeros, which are valid indices and flags.
    """
    rng = np.random.default_rng(seed)
    elem_types = {vi.name: vi.type.tensor_type.elem_type for vi in model.proto.graph.input}
    feeds: dict[str, np.ndarray] = {}
    for name, shape in model.inputs.items():
        dtype = onnx.helper.tensor_dtype_to_np_dtype(elem_types.get(name, onnx.TensorProto.FLOAT))
        if np.issubdtype(dtype, np.floating):
            feeds[name] = rng.standard_normal(shape, dtype=np.float32).astype(dtype)
        else:
            feeds[name] = np.zeros(shape, dtype=dtype)
    return feeds


def run_onnxruntime(
    proto: onnx.ModelProto, feeds: Mapping[str, np.ndarray]
) -> tuple[dict[str, np.ndarray], float]:
    """Run a model on CPU with onnxruntime: outputs by name and wall seconds of ``run`` only.

    Raises InputError when onnxruntime rejects the model or the feeds.
    """
    options = ort.SessionOptions()
    options.log_severity_level = 3
    try:
        session = ort.InferenceSession(
            proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
        names = [o.name for o in session.get_outputs()]
        start = time.perf_counter()
        results = session.run(names, dict(feeds))
        seconds = time.perf_counter() - start
    except _ORT_ERRORS as exc:
        raise InputError(
            f"onnxruntime cannot run model '{proto.graph.name or '(unnamed graph)'}': "
            f"{_one_line(str(exc))}. Check that the model and its input shapes are valid."
        ) from exc
    return {n: np.asarray(r) for n, r in zip(names, results, strict=True)}, seconds


def weights_are_placeholders(model: LoadedModel) -> bool:
    """True when most weight elements sit in tensors of one repeated value (the zoo "light"
    models build their conv and fc weights with ConstantOfShape): such weights hide layout
    bugs, so verification swaps in seeded random ones. Real weights are verified as they are."""
    weights = [numpy_helper.to_array(t) for t in model.proto.graph.initializer
               if t.data_type in (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE)]
    total = sum(w.size for w in weights if w.size > 1)
    constant = sum(w.size for w in weights if w.size > 1 and float(w.min()) == float(w.max()))
    return total > 0 and constant * 2 > total


def declared_input_dims(spec: str) -> dict[str, list[int | str | None]]:
    """The real inputs of a model file as declared (symbolic dims as names), before binding."""
    file = resolve_model(spec)
    proto = _parse_model(_read_bytes(file, spec), file, spec)
    constants = {t.name for t in proto.graph.initializer}
    return {vi.name: list(_declared_dims(vi) or []) for vi in proto.graph.input
            if vi.name not in constants}

