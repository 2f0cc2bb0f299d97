"""The op table: everything fuseplan knows about an ONNX op type, in one entry per op.

An `OpSpec` says which class the rules see the op as, how the rows and columns of its
output map to those of its feature-map inputs, how much work one output element costs,
whether the batch axis passes through, what its constant inputs are (weights the
accelerator streams, or parameters such as shapes and bounds), which emulator kernel
runs it, and the facts the loader's channel check and random weights need (the channels
its weights imply, whether its output is ReLU-like, which constant scales it). The front
end (graph build, random weights), the rules and the emulator all ask `op_spec(op_type)`;
an op type the table does not know is opaque.

Adding an op is one `OpSpec` entry in `_TABLE` (plus, when it names a kernel, the kernel
registered under that name in emulator.kernels).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from math import ceil, prod
from types import MappingProxyType
from typing import Any

Shape = tuple[int, ...]
Attrs = Mapping[str, Any]


class OpClass(StrEnum):
    """Op families the rules speak of (seed 000 ¶87-146)."""

    MAIN = "main"
    VECTOR = "vector"
    SCALAR = "scalar"
    MOVEMENT = "movement"
    REDUCTION = "reduction"
    OPAQUE = "opaque"


class MapRule(StrEnum):
    """Which semantics an op's index maps follow (planner.ir.index_maps), from which the
    graph builder reads a layer's row and column maps (planner.front.axes).

    Every rule but WINDOW, TRANSPOSED, SLICE, PAD and CONCAT (offsets along the rows or
    columns they cut, pad or join) maps an input whose batch, rows and columns differ from
    the output's as WHOLE: only inputs of the output's own extent can stay row-local (and
    a Reshape's rows split or merged, planner.ir.layout.regrouped_layout).
    """

    WINDOW = "window"  # conv / pool: a kernel window per output row (kernel, stride, pads)
    TRANSPOSED = "transposed"  # ConvTranspose: input rows scatter onto a window of outputs
    UPSAMPLE = "upsample"  # Resize / Upsample: nearest integer factor, else LOCAL
    LOCAL = "local"  # identity: elementwise, channel-wise, shape-only along other axes
    CONCAT = "concat"  # identity; along rows or columns of maps only: an offset per input
    TRANSPOSE = "transpose"  # identity when the permutation keeps rows and columns in place
    NORM = "norm"  # LayerNormalization: identity when it normalizes over channel axes only
    LINEAR = "linear"  # MatMul by a constant over the channels (channels last): identity
    SOFTMAX = "softmax"  # whole along the axes it normalizes over, identity along the others
    REDUCE = "reduce"  # Reduce*, keepdims: identity when it folds channel axes only, else whole
    SELECT = "select"  # Gather: identity when it picks along a channel axis, else whole
    SLICE = "slice"  # Slice: an offset along rows or columns it cuts (step 1), else LOCAL
    PAD = "pad"  # constant Pad: an offset along rows or columns it pads, else LOCAL
    ATTENTION = "attention"  # fused attention: the queries row-local, keys and values whole
    WHOLE = "whole"  # every output element may need the whole input


class InputRole(StrEnum):
    """What a constant float input of an op is, for drawing random weights.

    The values are the kinds planner.front.onnx_load draws values for.
    """

    WEIGHT = "weight"  # multiplied into a dot product: fan-in scaled
    BIAS = "bias"
    SCALE = "scale"
    SHIFT = "shift"
    PRELU = "prelu"
    MUL = "mul"
    ADD = "add"


class Rectified(StrEnum):
    """Whether an op's output is rectified, ReLU-like (its negative half cut or squashed).

    Random weights fed by a rectified tensor are drawn N(0, 2/fan_in) (He), others with half
    that variance (planner.front.onnx_load), so activations stay O(1) either way.
    """

    NEVER = "never"
    ALWAYS = "always"  # a ReLU-like activation
    IF_INPUTS = "if_inputs"  # pooling and movement: rectified when every fmap input is


class BranchScale(StrEnum):
    """Which constant scales an op's output linearly, for damping the branches a residual
    join sums (planner.front.onnx_load): the last such constant of each branch is shrunk."""

    NONE = "none"  # none known: the branch counts as unparametrised
    INPUT1 = "input1"  # input 1 when constant: the weight or BN scale (Conv, Gemm, BN)
    OPERAND = "operand"  # its constant float operand, beside exactly one fmap (Mul)
    THROUGH = "through"  # a constant shift of one fmap: that fmap's scale (Add, Sub)


class Accumulate(StrEnum):
    """How a reduction combines partial results over tiles of its input (an on-chip
    accumulator, final after the last tile); NONE: it needs its input whole."""

    NONE = "none"
    SUM = "sum"
    MEAN = "mean"  # a sum, divided by the count once the last tile is in
    MAX = "max"
    MIN = "min"
    SUM_SQUARE = "sum_square"  # a sum of the squares
    L1 = "l1"  # a sum of the magnitudes
    L2 = "l2"  # a sum of the squares, its square root taken once the last tile is in


class AxisMove(StrEnum):
    """How a movement op moves its input's axes to its output's: which index maps it has
    (planner.ir.index_maps), by which a token tensor's batch and token axes are carried
    through it (planner.ir.layout.carried)."""

    NONE = "none"  # it does not (or fuseplan does not follow it)
    PERMUTE = "permute"  # Transpose: axis i of the output is axis perm[i] of the input
    REGROUP = "regroup"  # Reshape, Flatten: row-major order kept, axes split or merged
    SQUEEZE = "squeeze"  # axes of extent 1 removed
    UNSQUEEZE = "unsqueeze"  # axes of extent 1 inserted
    SELECT = "select"  # Split, Gather: a part taken along one axis (a scalar index drops it)


class ShapeParam(StrEnum):
    """A parameter input that spells out the whole output map (a tile must restate it)."""

    NONE = "none"
    TARGET_SHAPE = "target_shape"  # Reshape's input 1: the output shape
    RESIZE_SIZES = "resize_sizes"  # Resize's input 3: the output sizes (scales are tile-safe)
    SLICE_BOUNDS = "slice_bounds"  # Slice's starts and ends: a tile takes its box's rows whole
    PAD_WIDTHS = "pad_widths"  # Pad's pads: a tile pads only where its box leaves the map
    EXPAND_SHAPE = "expand_shape"  # Expand's input 1: broadcasts only the input's unit axes


# work per output element: (attrs, fmap input shapes, shape of input 1, output shape) -> ops
WorkFn = Callable[[Attrs, Sequence[Shape], Shape | None, Shape], int]
# batch kept, once the batch extents agree: (attrs, fmap input shapes, output shape, opset)
BatchFn = Callable[[Attrs, Sequence[Shape], Shape, int], bool]
# fan-in of a weight input: (input index, weight shape, attrs) -> fan-in, None to leave it
FanInFn = Callable[[int, Shape, Attrs], int | None]
# channels (axis 1) input 0 must have, from the shape of input 1: (shape, attrs) -> channels,
# None when that shape says nothing
InChannelsFn = Callable[[Shape, Attrs], int | None]
# output-channel chunks (weight streaming): the axis of constant input `index` that runs over
# the output channels, None when every chunk needs it whole: (index, shape, attrs) -> axis;
# input-channel chunks (partial sums, planner.geometry.hidden): the axis running over the
# channels the op sums over, None when every chunk needs it whole (a bias, added once)
ChunkAxisFn = Callable[[int, Shape, Attrs], int | None]


def _const(n: int) -> WorkFn:
    def work(attrs: Attrs, ins: Sequence[Shape], w: Shape | None, out: Shape) -> int:
        return n
    return work


def _conv_work(attrs: Attrs, ins: Sequence[Shape], w: Shape | None, out: Shape) -> int:
    """C_in/group * k_h * k_w MACs per output."""
    return prod(w[1:]) if w is not None else 1


def _conv_transpose_work(attrs: Attrs, ins: Sequence[Shape], w: Shape | None, out: Shape) -> int:
    if w is None:
        return 1
    # every input element scatters (C_out/group)*k_h*k_w products over s_h*s_w outputs
    strides = attrs.get("strides", [1] * (len(w) - 2))
    per_input_channel = prod(w[2:]) * w[0] // int(attrs.get("group", 1))
    return max(1, ceil(per_input_channel / prod(strides)))


def _pool_work(attrs: Attrs, ins: Sequence[Shape], w: Shape | None, out: Shape) -> int:
    return prod(attrs["kernel_shape"])


def _gemm_work(attrs: Attrs, ins: Sequence[Shape], w: Shape | None, out: Shape) -> int:
    """K MACs per output: A's last axis, or its first when transposed."""
    if not ins:
        return 1
    return ins[0][-2] if attrs.get("transA", 0) else ins[0][-1]


def _matmul_work(attrs: Attrs, ins: Sequence[Shape], w: Shape | None, out: Shape) -> int:
    return ins[0][-1] if ins else 1


def attention_keys(attrs: Attrs, k: Shape) -> tuple[int, int]:
    """(head width d, keys Lk) of a fused attention layer's keys: k^T [.., d, Lk], or k
    [.., Lk, d] where the layer reads a transposed view (`transposed_keys` 0)."""
    d, lk = k[-2:]
    return (d, lk) if int(attrs.get("transposed_keys", 1)) else (lk, d)


def _attention_work(attrs: Attrs, ins: Sequence[Shape], w: Shape | None, out: Shape) -> int:
    """Fused attention (q [.., Lq, d], keys [.., d, Lk] or [.., Lk, d], v [.., Lk, dv], or
    keys and values in two parts each: q, k, v, k', v'):
    per output element its share of q @ k^T (Lk * d / dv) and its row of p @ v (Lk).
    Grouped-query heads change nothing per element: each query head reads its key head."""
    if len(ins) < 3:
        return 1
    # keys in parts (a KV cache and its new positions: planner.front.kv_cache) add up
    d = attention_keys(attrs, ins[1])[0]
    lk, dv = sum(attention_keys(attrs, k)[1] for k in ins[1::2]), ins[2][-1]
    return ceil(lk * d / dv) + lk


def _global_pool_work(attrs: Attrs, ins: Sequence[Shape], w: Shape | None, out: Shape) -> int:
    """One op per element of the pooled (spatial, axes 2..) extent, ONNX's channel-first."""
    return prod(ins[0][2:]) if ins else 1


def _reduce_work(attrs: Attrs, ins: Sequence[Shape], w: Shape | None, out: Shape) -> int:
    """Input elements folded into each output."""
    return max(1, prod(ins[0]) // max(prod(out), 1)) if ins else 1


def _lrn_work(attrs: Attrs, ins: Sequence[Shape], w: Shape | None, out: Shape) -> int:
    return int(attrs.get("size", 1))


def _batch_kept(attrs: Attrs, ins: Sequence[Shape], out: Shape, opset: int) -> bool:
    return True


def _batch_never(attrs: Attrs, ins: Sequence[Shape], out: Shape, opset: int) -> bool:
    """Conservative: the op may move or cut along the batch axis."""
    return False


def _batch_axis(default: Callable[[int], int]) -> BatchFn:
    """Ops working along one `axis` (concat, split, softmax) keep the batch unless it is 0."""
    def rule(attrs: Attrs, ins: Sequence[Shape], out: Shape, opset: int) -> bool:
        return int(attrs.get("axis", default(opset))) % max(len(out), 1) != 0
    return rule


def _softmax_axis(opset: int) -> int:
    return 1 if opset < 13 else -1


def _batch_transpose(attrs: Attrs, ins: Sequence[Shape], out: Shape, opset: int) -> bool:
    return list(attrs.get("perm", [len(out) - 1]))[0] == 0


def _batch_gemm(attrs: Attrs, ins: Sequence[Shape], out: Shape, opset: int) -> bool:
    return not attrs.get("transA", 0)


def _batch_reduce(attrs: Attrs, ins: Sequence[Shape], out: Shape, opset: int) -> bool:
    """Kept when the reduced axes are given as an attribute and leave axis 0 out."""
    axes = attrs.get("axes")
    return axes is not None and 0 not in [a % len(ins[0]) for a in axes]


def _conv_chunk_axis(index: int, shape: Shape, attrs: Attrs) -> int | None:
    """W is (C_out, C_in/group, k...), B is (C_out,): both split along C_out; grouped
    convolutions are not split (a chunk of outputs would need a matching chunk of inputs)."""
    if int(attrs.get("group", 1)) != 1 or index not in (1, 2):
        return None
    return 0


def _gemm_chunk_axis(index: int, shape: Shape, attrs: Attrs) -> int | None:
    """B is (K, N), or (N, K) when transposed; C splits along N when it has N columns."""
    if index == 1 and len(shape) == 2:
        return 0 if int(attrs.get("transB", 0)) else 1
    if index == 2 and len(shape) >= 1 and shape[-1] > 1:
        return len(shape) - 1
    return None


def _matmul_chunk_axis(index: int, shape: Shape, attrs: Attrs) -> int | None:
    """B (input 1) is (..., K, N): its columns are the output's last axis."""
    return len(shape) - 1 if index == 1 and len(shape) >= 2 else None


def _conv_in_chunk_axis(index: int, shape: Shape, attrs: Attrs) -> int | None:
    """W is (C_out, C_in, k...): a chunk of input channels takes W[:, chunk] (no groups)."""
    return 1 if index == 1 and int(attrs.get("group", 1)) == 1 else None


def _gemm_in_chunk_axis(index: int, shape: Shape, attrs: Attrs) -> int | None:
    """B is (K, N), or (N, K) when transposed; A must not be transposed (K is its last axis)."""
    if index != 1 or len(shape) != 2 or int(attrs.get("transA", 0)):
        return None
    return 1 if int(attrs.get("transB", 0)) else 0


def _matmul_in_chunk_axis(index: int, shape: Shape, attrs: Attrs) -> int | None:
    """B (input 1) is (..., K, N): a chunk of K takes its rows."""
    return len(shape) - 2 if index == 1 and len(shape) >= 2 else None


def _conv_depthwise(attrs: Attrs, cin: int, cout: int) -> bool:
    """A depthwise Conv (one group per channel, one filter each): channel-local."""
    return int(attrs.get("group", 1)) == cin == cout


def _conv_local_chunk_axis(index: int, shape: Shape, attrs: Attrs) -> int | None:
    """A depthwise Conv's W (C, 1, k...) and B (C,) split along their first axis."""
    return 0 if index in (1, 2) else None


def _conv_fan_in(index: int, shape: Shape, attrs: Attrs) -> int | None:
    return prod(shape[1:])


def _conv_transpose_fan_in(index: int, shape: Shape, attrs: Attrs) -> int | None:
    if len(shape) < 2:
        return None
    group = int(attrs.get("group", 1))
    strides = attrs.get("strides", [1] * (len(shape) - 2))
    return max(1, shape[0] // group * prod(shape[2:]) // prod(strides))


def _gemm_fan_in(index: int, shape: Shape, attrs: Attrs) -> int | None:
    """A is (M, K) and B is (K, N) unless transposed; fan_in is K."""
    if len(shape) != 2:
        return None
    trans = int(attrs.get("transA" if index == 0 else "transB", 0))
    return shape[1 - trans if index == 0 else trans]


def _matmul_fan_in(index: int, shape: Shape, attrs: Attrs) -> int | None:
    if not shape:
        return None
    if len(shape) == 1:
        return shape[0]
    return shape[-2] if index == 1 else shape[-1]


def _conv_in_channels(w: Shape, attrs: Attrs) -> int | None:
    """W is (C_out, C_in/group, k...): the input has C_in/group channels per group."""
    return w[1] * int(attrs.get("group", 1)) if len(w) >= 2 else None


def _conv_transpose_in_channels(w: Shape, attrs: Attrs) -> int | None:
    """W is (C_in, C_out/group, k...)."""
    return w[0] if w else None


def _per_channel(param: Shape, attrs: Attrs) -> int | None:
    """A per-channel parameter vector (BN and instance-norm scale) has one value a channel."""
    return param[0] if len(param) == 1 else None


@dataclass(frozen=True)
class OpSpec:
    """What fuseplan knows about one ONNX op type."""

    op: str
    op_class: OpClass
    maps: MapRule
    work: WorkFn  # MACs (main ops) or vector ops (the others) per output element
    batch: BatchFn  # batch kept (after the generic checks of `batch_preserving`)
    takes_weights: bool = True  # float constant inputs are weights, else parameters
    roles: tuple[InputRole | None, ...] = ()  # by input index
    other_role: InputRole | None = None  # inputs past `roles` (variadic ops)
    fan_in: FanInFn | None = None  # for WEIGHT inputs
    kernel: str | None = None  # emulator kernel name; None: the ONNX reference evaluator
    shape_param: ShapeParam = ShapeParam.NONE
    in_channels: InChannelsFn | None = None  # for the load-time channel check
    # ONNX attribute defaults that differ between ops sharing a map rule (as pairs: hashable)
    attr_defaults: tuple[tuple[str, Any], ...] = ()
    # random weights: the sign of its output, the constant scaling it, and whether it sums
    # its inputs (a residual join, whose branches get damped)
    rectified: Rectified = Rectified.NEVER
    branch_scale: BranchScale = BranchScale.NONE
    sums_inputs: bool = False
    # streamed weights: how a constant input splits into output-channel chunks, and the
    # output axis the chunks' results join along (None: the op is computed whole)
    chunk_axis: ChunkAxisFn | None = None
    chunk_out_axis: int = 1
    # hidden chunks (planner.geometry.hidden): how a constant input splits along the input
    # channels the op sums over (its partial sums then add up), and whether each output
    # channel depends on the same channel of its inputs alone (per element), so that a
    # chunk of channels runs on its own
    in_chunk_axis: ChunkAxisFn | None = None
    channel_local: bool = False
    # ops channel-local only with some attributes (a depthwise Conv: one group per channel):
    # (attrs, input channels, output channels) -> whether it is; and how their constants
    # split along the channels (they are not broadcast from the right)
    channel_local_if: Callable[[Attrs, int, int], bool] | None = None
    local_chunk_axis: ChunkAxisFn | None = None
    # constants along the channel axis (BatchNormalization's scale, mean...), not broadcast
    # from the right: none of their axes is a row or column axis, whatever its length
    per_channel_constants: bool = False
    # reductions over rows and columns: how tiles of the input combine into the output
    accumulate: Accumulate = Accumulate.NONE
    # movement ops: how the input's axes reach the output (token layouts follow them)
    axis_move: AxisMove = AxisMove.NONE
    # its output may be written over an input of its own dims that no later layer reads
    # (planner.geometry.in_place): each output element comes from the input element in its
    # place (per-element ops), from that element's row read before it is written
    # (Softmax, LayerNormalization), or is that element in the same order (views)
    in_place: bool = False
    # the batch is kept where the node's index maps carry axis 0 whole (Slice, Pad: their
    # bounds are constant inputs, which the maps resolve and `batch` cannot see)
    batch_from_maps: bool = False

    @property
    def is_main(self) -> bool:
        """A main (MAC array) op."""
        return self.op_class is OpClass.MAIN

    @property
    def sliding_window(self) -> bool:
        """Conv, pooling or transposed conv: a kernel window slides over rows and columns."""
        return self.maps in (MapRule.WINDOW, MapRule.TRANSPOSED)

    @property
    def is_convolution(self) -> bool:
        """A sliding-window op whose kernel is input 1, a weight (Conv, ConvTranspose)."""
        return self.sliding_window and self.role(1) is InputRole.WEIGHT

    def role(self, index: int) -> InputRole | None:
        """The role of constant input `index` (None: leave its values as they are)."""
        return self.roles[index] if index < len(self.roles) else self.other_role

    def with_defaults(self, attrs: Attrs) -> dict[str, Any]:
        """A node's attributes with the op's defaults filled in where it does not set them."""
        return {**dict(self.attr_defaults), **attrs}

    def work_per_output(self, attrs: Attrs, in_shapes: Sequence[Shape], w_shape: Shape | None,
                        out_shape: Shape) -> int:
        """MACs (main ops) or vector ops (others) per output element."""
        return self.work(attrs, in_shapes, w_shape, out_shape)

    def batch_preserving(self, attrs: Attrs, in_shapes: Sequence[Shape], out_shape: Shape,
                         opset: int, batch_lands: bool = False) -> bool:
        """Whether axis 0 of every fmap input maps to axis 0 of the output, element for
        element (tiles may then cut the batch). `batch_lands`: the node's index maps carry
        axis 0 of every fmap input whole onto axis 0 (what `batch_from_maps` ops go by)."""
        if self.op_class is OpClass.OPAQUE or not out_shape:
            return False
        if any(not s or s[0] != out_shape[0] for s in in_shapes):
            return False
        if self.batch_from_maps:
            return batch_lands
        return self.batch(attrs, in_shapes, out_shape, opset)


def _spec(op: str, cls: OpClass, maps: MapRule = MapRule.LOCAL, work: WorkFn | None = None,
          batch: BatchFn = _batch_kept, *, native: bool = True, **more: Any) -> OpSpec:
    """A table entry; a native kernel is named after its op (native=False: reference)."""
    if work is None:
        work = _const(0 if cls is OpClass.MOVEMENT else 1)
    if cls is OpClass.MOVEMENT:
        more.setdefault("takes_weights", False)
        more.setdefault("rectified", Rectified.IF_INPUTS)  # moving values keeps their sign
    return OpSpec(op, cls, maps, work, batch, kernel=op if native else None, **more)


_M, _V, _S, _MV, _R, _O = (OpClass.MAIN, OpClass.VECTOR, OpClass.SCALAR, OpClass.MOVEMENT,
                           OpClass.REDUCTION, OpClass.OPAQUE)
_W = InputRole.WEIGHT
_CONV_ROLES = (None, _W, InputRole.BIAS)
_NORM_ROLES = (None, InputRole.SCALE, InputRole.SHIFT)
_BN_ROLES = (None, InputRole.SCALE, InputRole.SHIFT, InputRole.SHIFT, InputRole.SCALE)
_RELU, _KEEPS = Rectified.ALWAYS, Rectified.IF_INPUTS


def _elementwise(op: str, cls: OpClass, **more: Any) -> OpSpec:
    """A per-element op (broadcast constants included): each output channel comes from the
    same channel of its inputs, so a chunk of channels runs on its own; its output may
    overwrite an input of the same dims."""
    more.setdefault("in_place", True)
    return _spec(op, cls, channel_local=True, **more)


def _opaque(op: str, **more: Any) -> OpSpec:
    """An op fuseplan does not plan through: whole maps, batch not kept, one op per output,
    run by the ONNX reference evaluator."""
    return _spec(op, _O, MapRule.WHOLE, batch=_batch_never, native=False, **more)


_ENTRIES: tuple[OpSpec, ...] = (
    # main: the MAC array
    _spec("Conv", _M, MapRule.WINDOW, _conv_work, roles=_CONV_ROLES, fan_in=_conv_fan_in,
          in_channels=_conv_in_channels, branch_scale=BranchScale.INPUT1,
          chunk_axis=_conv_chunk_axis, in_chunk_axis=_conv_in_chunk_axis,
          channel_local_if=_conv_depthwise, local_chunk_axis=_conv_local_chunk_axis),
    _spec("ConvTranspose", _M, MapRule.TRANSPOSED, _conv_transpose_work, roles=_CONV_ROLES,
          fan_in=_conv_transpose_fan_in, in_channels=_conv_transpose_in_channels,
          branch_scale=BranchScale.INPUT1),
    _spec("MaxPool", _M, MapRule.WINDOW, _pool_work, rectified=_KEEPS),
    _spec("AveragePool", _M, MapRule.WINDOW, _pool_work, rectified=_KEEPS),
    _spec("LpPool", _M, MapRule.WINDOW, _pool_work),
    _spec("Gemm", _M, MapRule.LINEAR, _gemm_work, _batch_gemm,
          roles=(_W, _W, InputRole.BIAS), fan_in=_gemm_fan_in, branch_scale=BranchScale.INPUT1,
          chunk_axis=_gemm_chunk_axis, chunk_out_axis=-1, in_chunk_axis=_gemm_in_chunk_axis),
    _spec("MatMul", _M, MapRule.LINEAR, _matmul_work, other_role=_W, fan_in=_matmul_fan_in,
          chunk_axis=_matmul_chunk_axis, chunk_out_axis=-1,
          in_chunk_axis=_matmul_in_chunk_axis),
    # fuseplan's own: attention fused by the front end (planner.front.attention_fusion),
    # run with the online softmax key chunk by key chunk (emulator.attention_kernel)
    _spec("FlashAttention", _M, MapRule.ATTENTION, _attention_work, takes_weights=False),
    # vector: per-element functions and per-position normalizations
    _elementwise("Relu", _V, rectified=_RELU),
    _elementwise("Clip", _V, takes_weights=False, rectified=_RELU),  # min and max are bounds
    _elementwise("Sigmoid", _V),
    _elementwise("HardSigmoid", _V),
    _elementwise("HardSwish", _V, rectified=_RELU),
    _elementwise("LeakyRelu", _V, rectified=_RELU),
    _spec("PRelu", _V, roles=(None, InputRole.PRELU), rectified=_RELU, in_place=True),
    _elementwise("Elu", _V, rectified=_RELU),
    _elementwise("Selu", _V, rectified=_RELU),
    _elementwise("Tanh", _V),
    _spec("Softmax", _V, MapRule.SOFTMAX, _const(2), _batch_axis(_softmax_axis), in_place=True),
    _spec("LogSoftmax", _V, MapRule.SOFTMAX, _const(2), _batch_axis(_softmax_axis),
          in_place=True),
    _spec("BatchNormalization", _V, work=_const(2), roles=_BN_ROLES, in_channels=_per_channel,
          branch_scale=BranchScale.INPUT1, per_channel_constants=True, in_place=True),
    _spec("LRN", _V, work=_lrn_work),
    _spec("InstanceNormalization", _V, MapRule.WHOLE, _const(2), roles=_NORM_ROLES,
          in_channels=_per_channel, per_channel_constants=True),
    # over its last axes: per pixel in a channels-last stretch (ConvNeXt), per token
    _spec("LayerNormalization", _V, MapRule.NORM, _const(4), _batch_axis(lambda opset: -1),
          native=False, roles=_NORM_ROLES, in_place=True),
    _elementwise("Sqrt", _V),
    _elementwise("Exp", _V),
    _elementwise("Abs", _V),
    _elementwise("Neg", _V),
    _elementwise("Reciprocal", _V),
    _elementwise("Cast", _V, takes_weights=False),
    # per-element functions exporters emit (Erf-GELU, Softplus-Mish, ...): the ONNX reference
    # evaluator runs them; they tile like any activation
    _elementwise("Erf", _V, native=False),
    _elementwise("Gelu", _V, native=False, rectified=_RELU),
    _elementwise("Softplus", _V, native=False, rectified=_RELU),
    _elementwise("Softsign", _V, native=False),
    _elementwise("Mish", _V, native=False, rectified=_RELU),
    _elementwise("Log", _V, native=False),
    _elementwise("Floor", _V, native=False),
    _elementwise("Ceil", _V, native=False),
    _elementwise("Round", _V, native=False),
    _elementwise("Sign", _V, native=False),
    _elementwise("Sin", _V, native=False),
    _elementwise("Cos", _V, native=False),
    # scalar: elementwise with broadcasting
    _elementwise("Add", _S, other_role=InputRole.ADD, branch_scale=BranchScale.THROUGH,
          sums_inputs=True),
    _elementwise("Sub", _S, other_role=InputRole.ADD, branch_scale=BranchScale.THROUGH),
    _elementwise("Mul", _S, other_role=InputRole.MUL, branch_scale=BranchScale.OPERAND),
    _elementwise("Div", _S, roles=(None, InputRole.MUL)),
    _elementwise("Sum", _S, other_role=InputRole.ADD, sums_inputs=True),
    _elementwise("Max", _S),
    _elementwise("Min", _S),
    _elementwise("Mean", _S),
    _elementwise("Pow", _S),
    # elementwise selections and comparisons: constants are masks and fill values, kept as
    # they are (no role), never drawn at random
    _spec("Where", _S, native=False),
    _spec("Equal", _S, native=False, takes_weights=False),
    _spec("Greater", _S, native=False, takes_weights=False),
    _spec("Less", _S, native=False, takes_weights=False),
    _spec("GreaterOrEqual", _S, native=False, takes_weights=False),
    _spec("LessOrEqual", _S, native=False, takes_weights=False),
    _spec("Not", _S, native=False, takes_weights=False),
    _spec("And", _S, native=False, takes_weights=False),
    _spec("Or", _S, native=False, takes_weights=False),
    # movement: no arithmetic; constant inputs are shapes, pads, scales
    _spec("Concat", _MV, MapRule.CONCAT, batch=_batch_axis(lambda opset: 1)),
    _spec("Reshape", _MV, shape_param=ShapeParam.TARGET_SHAPE, axis_move=AxisMove.REGROUP,
          in_place=True),
    _spec("Flatten", _MV, axis_move=AxisMove.REGROUP, in_place=True),
    _spec("Transpose", _MV, MapRule.TRANSPOSE, batch=_batch_transpose,
          axis_move=AxisMove.PERMUTE),
    _spec("Split", _MV, batch=_batch_axis(lambda opset: 0), axis_move=AxisMove.SELECT),
    _spec("Slice", _MV, MapRule.SLICE, batch_from_maps=True,
          shape_param=ShapeParam.SLICE_BOUNDS),
    _spec("Pad", _MV, MapRule.PAD, batch_from_maps=True, shape_param=ShapeParam.PAD_WIDTHS),
    _spec("Resize", _MV, MapRule.UPSAMPLE, shape_param=ShapeParam.RESIZE_SIZES,
          attr_defaults=(("coordinate_transformation_mode", "half_pixel"),
                         ("nearest_mode", "round_prefer_floor"))),
    # Upsample (opsets 7-9) has no such attributes: its nearest sampling is always floor(i/s)
    _spec("Upsample", _MV, MapRule.UPSAMPLE,
          attr_defaults=(("coordinate_transformation_mode", "asymmetric"),
                         ("nearest_mode", "floor"))),
    _spec("Identity", _MV, in_place=True),
    _spec("Dropout", _MV, in_place=True),
    # picks along one axis; its constants (indices, a lookup table) are parameters
    _spec("Gather", _MV, MapRule.SELECT, batch=_batch_never, axis_move=AxisMove.SELECT),
    _spec("Squeeze", _MV, batch=_batch_never, axis_move=AxisMove.SQUEEZE, in_place=True),
    _spec("Unsqueeze", _MV, batch=_batch_never, axis_move=AxisMove.UNSQUEEZE,
          in_place=True),
    _spec("Expand", _MV, batch=_batch_never, native=False,
          shape_param=ShapeParam.EXPAND_SHAPE),
    # reduction: each output folds many inputs
    _spec("GlobalAveragePool", _R, MapRule.WHOLE, _global_pool_work, rectified=_KEEPS,
          accumulate=Accumulate.MEAN),
    _spec("GlobalMaxPool", _R, MapRule.WHOLE, _global_pool_work, rectified=_KEEPS,
          accumulate=Accumulate.MAX),
    _spec("ReduceMean", _R, MapRule.REDUCE, _reduce_work, _batch_reduce,
          accumulate=Accumulate.MEAN),
    _spec("ReduceSum", _R, MapRule.REDUCE, _reduce_work, _batch_reduce,
          accumulate=Accumulate.SUM),
    _spec("ReduceMax", _R, MapRule.REDUCE, _reduce_work, _batch_reduce,
          accumulate=Accumulate.MAX),
    _spec("ReduceMin", _R, MapRule.REDUCE, _reduce_work, _batch_reduce,
          accumulate=Accumulate.MIN),
    # norms fold as sums (of squares, of magnitudes): an L2 norm takes its square root
    # once, after the last tile (ConvNeXt-V2's GRN pools its map so)
    _spec("ReduceL2", _R, MapRule.REDUCE, _reduce_work, _batch_reduce, native=False,
          accumulate=Accumulate.L2),
    _spec("ReduceL1", _R, MapRule.REDUCE, _reduce_work, _batch_reduce, native=False,
          accumulate=Accumulate.L1),
    _spec("ReduceSumSquare", _R, MapRule.REDUCE, _reduce_work, _batch_reduce, native=False,
          accumulate=Accumulate.SUM_SQUARE),
    # reductions no tile can fold into a plain accumulator (a partial product overflows or
    # underflows on its own, a log-sum-exp needs a running maximum): per position along
    # the axes they keep, as any reduction
    _spec("ReduceProd", _R, MapRule.REDUCE, _reduce_work, _batch_reduce, native=False),
    _spec("ReduceLogSumExp", _R, MapRule.REDUCE, _reduce_work, _batch_reduce, native=False),
    # opaque but known: a native kernel, weight roles or the sign of the output
    _opaque("GroupNormalization", roles=_NORM_ROLES),
    _opaque("DepthToSpace", rectified=_KEEPS),
    _opaque("SpaceToDepth", rectified=_KEEPS),
)

_TABLE: Mapping[str, OpSpec] = MappingProxyType({s.op: s for s in _ENTRIES})


def op_spec(op_type: str) -> OpSpec:
    """The table entry of an ONNX op type; an unknown op gets an opaque spec (whole maps,
    batch not kept, one op per output, constants as weights, run by the reference evaluator)."""
    spec = _TABLE.get(op_type)
    return _opaque(op_type) if spec is None else spec


def known_ops() -> Mapping[str, OpSpec]:
    """Every op type the table knows, with its entry."""
    return _TABLE


def op_class(op_type: str) -> OpClass:
    """The op class of an ONNX op type; anything unknown is opaque."""
    return op_spec(op_type).op_class


def _ops_of(cls: OpClass) -> frozenset[str]:
    return frozenset(op for op, s in _TABLE.items() if s.op_class is cls)


MAIN_OPS = _ops_of(OpClass.MAIN)
VECTOR_OPS = _ops_of(OpClass.VECTOR)
SCALAR_OPS = _ops_of(OpClass.SCALAR)
MOVEMENT_OPS = _ops_of(OpClass.MOVEMENT)
REDUCTION_OPS = _ops_of(OpClass.REDUCTION)
# Views: they relabel their input's elements and compute nothing (a fused group reads them
# through their index maps), so they do not count toward search.max_group_layers: a
# transformer's head splits and transposes would otherwise crowd the norms and scales out.
VIEW_OPS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Dropout",
                      "Transpose", "Expand"})
# Constant inputs of these ops are parameters (shapes, scales, bounds), not weights.
PARAMETER_INPUT_OPS = frozenset(op for op, s in _TABLE.items() if not s.takes_weights)
