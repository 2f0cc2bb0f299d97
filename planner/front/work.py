"""The working copy of a graph while load_model cleans it, and the walks over its nodes
(naming, liveness, who reads what) that every cleaning stage shares."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import numpy_helper

_DEFAULT_DOMAINS = ("", "ai.onnx")
_FLOAT_TYPES = frozenset({
    onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16,
})


@dataclass
class _Work:
    """Mutable state of the cleaning pipeline (private to one load_model call)."""

    spec: str
    nodes: list[onnx.NodeProto]
    inits: dict[str, onnx.TensorProto]
    folded: dict[str, np.ndarray] = field(default_factory=dict)
    inputs: dict[str, onnx.ValueInfoProto] = field(default_factory=dict)
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    # folded tensors computed from some tensor's shape (a causal mask, positions, rotary
    # tables): structure, not weights (planner.front.onnx_load marks them so)
    shaped: set[str] = field(default_factory=set)

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


def _copy_node(node: onnx.NodeProto) -> onnx.NodeProto:
    copy = onnx.NodeProto()
    copy.CopyFrom(node)
    return copy


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


def _tensor_proto(name: str, arr: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(arr), name)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _drop_pass_throughs(nodes: Sequence[onnx.NodeProto], outputs: Iterable[str],
                        types: Mapping[str, onnx.TypeProto]) -> list[onnx.NodeProto]:
    """The nodes without those that hand their input on unchanged: Identity, Dropout at
    inference (no training flag, its mask unread: _trim_unused_outputs ran) and a Cast to
    the element type its input already has (an export's `.to(torch.float32)` of a float32
    tensor: RMSNorm's first step). Their readers read the input itself, so a group boundary
    between such a node and its readers stores no copy of the map (a decoder's residual
    stream, read again by the residual add, was written a second time as its norm's Cast).
    One whose output is a graph output stays: that name is the model's."""
    kept_names = set(outputs)
    alias: dict[str, str] = {}
    out: list[onnx.NodeProto] = []
    for node in nodes:
        if any(i in alias for i in node.input):
            names = [alias.get(i, i) for i in node.input]
            node.ClearField("input")
            node.input.extend(names)
        if _passes_through(node, types) and node.output[0] not in kept_names:
            alias[node.output[0]] = node.input[0]
            continue
        out.append(node)
    return out


def _passes_through(node: onnx.NodeProto, types: Mapping[str, onnx.TypeProto]) -> bool:
    """Whether a node's one output is its first input, element for element."""
    if node.domain not in _DEFAULT_DOMAINS or len(node.output) != 1 or not node.input \
            or not node.input[0]:
        return False
    if node.op_type == "Identity":
        return True
    if node.op_type == "Dropout":
        return len(node.input) < 3 or not node.input[2]  # no training_mode input
    if node.op_type == "Cast":
        to = next((a.i for a in node.attribute if a.name == "to"), None)
        tp = types.get(node.input[0])
        return tp is not None and tp.WhichOneof("value") == "tensor_type" \
            and to is not None and tp.tensor_type.elem_type == to
    return False
