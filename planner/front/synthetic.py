"""Synthetic values for verification: seeded random weights that keep activations O(1),
seeded random inputs, and telling placeholder weights from real ones."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import onnx
from onnx import TensorProto

from fuseplan.planner.front.assemble import _raw_bytes
from fuseplan.planner.front.fills import stored_array
from fuseplan.planner.front.group_norm import MADE_CONSTANT
from fuseplan.planner.front.loaded import LoadedModel
from fuseplan.planner.front.work import _DEFAULT_DOMAINS, _FLOAT_TYPES
from fuseplan.planner.ir.ops import BranchScale, InputRole, Rectified, op_spec


def randomize_weights(model: LoadedModel, seed: int) -> LoadedModel:
    """Replace every float weight initializer with seeded random values that keep activations O(1).

    Conv/Gemm/MatMul weights ~ N(0, 2/fan_in) (N(0, 1/fan_in) when the layer's input does not
    come from a ReLU-like op); biases ~ 0.01 N; BatchNormalization scale and var ~ U(0.5, 1.5),
    bias and mean ~ 0.1 N; PRelu slopes ~ U(0, 0.3); other float constants of Mul/Div
    ~ U(0.5, 1.5) and of Add/Sub/Sum ~ 0.1 N; the table a Gather picks rows of (an
    embedding) ~ N(0, 1), so rows differ and a wrong row shows. Where two feature maps are
    added (residual connections) the last BN scale / conv weight of each parametrised branch
    is damped (by 0.2 next to an identity path, by 1/sqrt(k) when all k inputs are
    parametrised) so the sums do not double the variance at every block. Integer tensors,
    Resize/Upsample scales, sizes and roi, Clip bounds, Pad values and anything else are left
    alone. ``sha256`` is kept: it identifies the model file.
    """
    rng = np.random.default_rng(seed)
    roles = _weight_roles(model.proto)
    proto = onnx.ModelProto()
    proto.CopyFrom(model.proto)
    for tensor in proto.graph.initializer:
        role = roles.get(tensor.name)
        if role is None or tensor.data_type not in _FLOAT_TYPES \
                or tensor.doc_string == MADE_CONSTANT:
            continue
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)
        shape = tuple(int(d) for d in tensor.dims)
        values = (_random_values(rng, role, shape) * role.factor).astype(dtype)
        for name in ("float_data", "double_data", "int32_data", "external_data"):
            tensor.ClearField(name)
        tensor.data_location = onnx.TensorProto.DEFAULT
        tensor.raw_data = _raw_bytes(values)
        tensor.doc_string = ""  # no longer a stub of one value (planner.front.fills)
    return replace(model, proto=proto)


_RESIDUAL_DAMPING = 0.2


@dataclass(frozen=True)
class _Role:
    """How to draw one initializer: kind, fan_in (weights) and a final multiplier."""

    kind: str  # weight, bias, scale, shift, prelu, mul, add, table
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
    if role.kind == "table":  # rows the model sums and normalises: O(1) like an activation
        return rng.standard_normal(shape)
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
    if node.op_type == "Gather" and index == 0:
        # a table of rows picked by index (an embedding): the op table gives Gather no
        # role, yet a placeholder table's rows are all alike and hide a wrong row fetched
        return _Role("table")
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
    """Seeded values for every real input: the same seed gives the same inputs.

    Float inputs get N(0, 1) values (float32 unless the input says otherwise). An integer
    input that reaches the indices of a Gather, GatherElements or GatherND (directly or
    through ops that only move its values: :data:`_MOVES_VALUES`) gets indices drawn
    uniformly from [0, n), n the length of the axis it indexes (the smallest where it
    indexes several; never negative, though ONNX allows it): a gather of token ids then
    fetches distinct rows, so a plan or emulator fetching the wrong rows shows. Its other
    uses (a padding mask computed from the ids, say) see those same values, which are
    valid ids. Every other integer or bool input gets zeros, valid as flags, masks and
    positions, and so does an index input when a gather it reaches has an axis of unknown
    length. The float draws come first, in input order, then the indices from the same
    generator, so float inputs are the same as when every integer input got zeros.
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
    for name, rows in _index_ranges(model).items():
        dtype = feeds[name].dtype
        if np.issubdtype(dtype, np.integer):  # a bool input stays a flag
            high = min(rows, int(np.iinfo(dtype).max) + 1)
            feeds[name] = rng.integers(0, high, feeds[name].shape).astype(dtype)
    return feeds


_GATHERS = frozenset({"Gather", "GatherElements", "GatherND"})
_MOVES_VALUES: dict[str, int | None] = {
    "Cast": 0, "Reshape": 0, "Unsqueeze": 0, "Squeeze": 0, "Flatten": 0, "Identity": 0,
    "Expand": 0, "Slice": 0, "Transpose": 0, "Concat": None}
"""Ops whose output holds only values of their input at the given position (None: of every
input): following an index input through them reaches the gathers it indexes. A Cast is
followed only to an integer type Gather takes (to bool or float it may change values)."""
_INDEX_TYPES = frozenset({TensorProto.INT32, TensorProto.INT64})


def _index_ranges(model: LoadedModel) -> dict[str, int]:
    """Integer model input -> n, where every value in [0, n) is a valid index for every
    gather the input reaches as indices (see :func:`random_inputs`); inputs that reach no
    gather, or one whose indexed axis has no known length, are left out."""
    proto = model.proto
    shapes = _known_shapes(proto, model.inputs)
    consumers: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for node in proto.graph.node:
        if node.domain in _DEFAULT_DOMAINS:  # another domain's op: its meaning is unknown
            for position, name in enumerate(node.input):
                if name:
                    consumers.setdefault(name, []).append((node, position))
    ranges: dict[str, int] = {}
    for name in model.inputs:
        lengths = _gathered_lengths(name, consumers, shapes)
        if lengths and None not in lengths:
            smallest = min(n for n in lengths if n is not None)
            if smallest > 0:
                ranges[name] = smallest
    return ranges


def _known_shapes(proto: onnx.ModelProto, inputs: dict[str, tuple[int, ...]]
                  ) -> dict[str, tuple[int, ...]]:
    """Tensor -> shape, where fully known: constants, the bound inputs, inferred tensors."""
    shapes: dict[str, tuple[int, ...]] = {}
    for info in (*proto.graph.value_info, *proto.graph.output):
        dims = info.type.tensor_type.shape.dim
        if info.type.tensor_type.HasField("shape") and all(d.HasField("dim_value")
                                                           for d in dims):
            shapes[info.name] = tuple(int(d.dim_value) for d in dims)
    shapes.update(inputs)
    shapes.update({t.name: tuple(int(d) for d in t.dims) for t in proto.graph.initializer})
    return shapes


def _gathered_lengths(start: str, consumers: dict[str, list[tuple[onnx.NodeProto, int]]],
                      shapes: dict[str, tuple[int, ...]]) -> list[int | None]:
    """The indexed axis length (None: unknown) of each gather `start`'s values reach as
    indices, through the ops of :data:`_MOVES_VALUES`."""
    lengths: list[int | None] = []
    todo, seen = [start], {start}
    while todo:
        name = todo.pop()
        for node, position in consumers.get(name, ()):
            if node.op_type in _GATHERS and position == 1:
                lengths.append(_indexed_length(node, name, shapes))
            elif _moves_values(node, position) and node.output[0] not in seen:
                seen.add(node.output[0])
                todo.append(node.output[0])
    return lengths


def _moves_values(node: onnx.NodeProto, position: int) -> bool:
    """Whether `node`'s output holds only values of its input at `position`."""
    if node.op_type not in _MOVES_VALUES or not node.output or not node.output[0]:
        return False
    if node.op_type == "Cast":
        to = next((a.i for a in node.attribute if a.name == "to"), None)
        return to in _INDEX_TYPES
    wanted = _MOVES_VALUES[node.op_type]
    return wanted is None or wanted == position


def _indexed_length(node: onnx.NodeProto, indices: str, shapes: dict[str, tuple[int, ...]]
                    ) -> int | None:
    """The length of the data axis a gather's `indices` index (GatherND: the shortest of the
    axes its index tuples address); None when the data's shape is unknown."""
    data = shapes.get(node.input[0])
    if not data:
        return None
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    if node.op_type != "GatherND":
        axis = int(attrs.get("axis", 0))
        return data[axis] if -len(data) <= axis < len(data) else None  # -1: the last axis
    batch = int(attrs.get("batch_dims", 0))
    index_shape = shapes.get(indices)
    # the tuples' length is the indices' last dim; unknown, every axis past the batch ones
    width = index_shape[-1] if index_shape else len(data) - batch
    axes = data[batch:batch + width]
    return min(axes) if axes else None


def weights_are_placeholders(model: LoadedModel) -> bool:
    """True when most weight elements sit in tensors of one repeated value (the zoo "light"
    models build their conv and fc weights with ConstantOfShape): such weights hide layout
    bugs, so verification swaps in seeded random ones. Real weights are verified as they are."""
    weights = [stored_array(t) for t in model.proto.graph.initializer
               if t.data_type in (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE)
               and t.doc_string != MADE_CONSTANT]  # the loader's constants are not weights
    total = sum(w.size for w in weights if w.size > 1)
    # a stub of one value (planner.front.fills: no strides) is constant without a scan
    constant = sum(w.size for w in weights if w.size > 1
                   and (not any(w.strides) or float(w.min()) == float(w.max())))
    return total > 0 and constant * 2 > total
