"""Attention over long sequences as one fused layer, run with the online softmax.

Exporters spell scaled dot-product attention as MatMul(q, k^T), an optional scale (Mul or
Div by a scalar), an optional causal mask (Where with a lower-triangular condition, or Add
of a matrix that is 0 on and below the diagonal and one negative value above), Softmax over
the keys and MatMul(p, v). Every layer of that chain needs a row of scores whole, [.., Lq,
Lk] per head: at 4096 tokens and 12 heads the scores of one query row, and k and v whole,
outgrow any on-chip memory. Fused, the chain is one layer whose tile of query rows streams
the keys and values in chunks (emulator.attention_kernel: FlashAttention's running maximum and sum)
and never holds more than one chunk of scores (planner.geometry.attention prices it).

The keys may come as k^T (a Transpose of the last two axes, which the fused layer then reads
as a view: `transposed_keys` 0) and, in grouped-query attention, through `repeat_kv`
(Unsqueeze, Expand, Reshape: each key and value head copied for the query heads that share
it). The fused layer takes the unexpanded heads and `kv_groups`, the query heads per key
head: query head h reads key and value head h // kv_groups, so each is read once, never
written out expanded.

Only long sequences are fused (LONG_SEQUENCE keys and up): short ones (ViT's 197 tokens,
Swin's 49-token windows) fit on chip as they are and keep their layers, which the planner
runs in head chunks (planner.geometry.heads); a fused layer runs in them too, inside its
block's head stretch. Masks other than causal ones (a Swin window mask, a padding mask)
keep the chain unfused.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper

# keys from which attention is fused. At 512 keys the scores of a 512-token block are
# 512 x 512 per head, and the unfused chain writes them out on small chips: a GPT-2-small
# block at 512 KiB moved 5.82x its floor unfused and 4.12x fused, equal at 1 and 2 MiB, and
# llama_block (512 tokens) 43.26 MB unfused against 41.16 MB fused. Below, fusing changed
# no plan's bytes of the models tried (BERT at 128 tokens, ViTs at 197, MobileViT,
# MaxViT, Swin, SegFormer), and the unfused chain's layers stay what the rules see.
LONG_SEQUENCE = 512
# keys per chunk the online softmax walks (FlashAttention's key block): its scores take
# query rows x KV_CHUNK on chip beside the queries, keys and values, so the block is kept
# small: with 128, a Llama attention half of 512 tokens in its two key-head chunks needed
# 2.13 MiB of SRAM and ran in two tiles, each computing every key and value again
KV_CHUNK = 64
OP_TYPE = "FlashAttention"
DOMAIN = "ai.fuseplan"


@dataclass(frozen=True)
class _Chain:
    """The nodes of one attention and what the fused layer keeps of them."""

    nodes: tuple[onnx.NodeProto, ...]  # scores, [scale], [mask], softmax, mix
    q: str
    kt: str
    v: str
    out: str
    scale: float
    causal: bool
    mask_value: float
    transposed_keys: bool  # k^T [.., d, Lk] (True) or k [.., Lk, d]
    kv_groups: int  # query heads per key and value head (grouped-query attention)


def fuse_attention(nodes: Sequence[onnx.NodeProto], shapes: Mapping[str, tuple[int, ...]],
                   constants: Mapping[str, np.ndarray], outputs: Sequence[str], opset: int
                   ) -> list[onnx.NodeProto]:
    """The node list with every long attention chain replaced by one FlashAttention node
    (named after the chain's last MatMul, in its place); the rest unchanged."""
    producer = {o: n for n in nodes for o in n.output if o}
    readers: dict[str, int] = {}
    for n in nodes:
        for t in n.input:
            readers[t] = readers.get(t, 0) + 1
    for t in outputs:
        readers[t] = readers.get(t, 0) + 1
    chains = []
    for n in nodes:
        if n.op_type == "Softmax":
            chain = _chain(n, nodes, producer, readers, shapes, constants, opset)
            if chain is not None:
                chains.append(chain)
    if not chains:
        return list(nodes)
    dropped = {id(m) for c in chains for m in c.nodes[:-1]}
    fused = {id(c.nodes[-1]): c for c in chains}
    out: list[onnx.NodeProto] = []
    for n in nodes:
        if id(n) in dropped:
            continue
        c = fused.get(id(n))
        out.append(n if c is None else _fused_node(c, shapes))
    return out


def _fused_node(c: _Chain, shapes: Mapping[str, tuple[int, ...]]) -> onnx.NodeProto:
    mix = c.nodes[-1]
    return helper.make_node(
        OP_TYPE, [c.q, c.kt, c.v], [c.out], name=mix.name, domain=DOMAIN,
        scale=float(c.scale), causal=int(c.causal), mask_value=float(c.mask_value),
        kv_chunk=min(KV_CHUNK, shapes[c.v][-2]), query_length=shapes[c.q][-2],
        transposed_keys=int(c.transposed_keys), kv_groups=c.kv_groups,
        fused=[m.name for m in c.nodes])


def _only_reader(t: str, readers: Mapping[str, int]) -> bool:
    return readers.get(t, 0) == 1


def _scalar(constants: Mapping[str, np.ndarray], t: str) -> float | None:
    value = constants.get(t)
    if value is None or value.size != 1 or not np.issubdtype(value.dtype, np.floating):
        return None
    return float(value.reshape(()))


def _chain(softmax: onnx.NodeProto, nodes: Sequence[onnx.NodeProto],
           producer: Mapping[str, onnx.NodeProto], readers: Mapping[str, int],
           shapes: Mapping[str, tuple[int, ...]], constants: Mapping[str, np.ndarray],
           opset: int) -> _Chain | None:
    """The attention chain through this Softmax, None when it is not one fuseplan fuses."""
    p = softmax.output[0]
    rank = len(shapes.get(p, ()))
    if not _over_last_axis(softmax, rank, opset) or not _only_reader(p, readers):
        return None
    after = _mix(p, nodes, readers, constants)
    if after is None:
        return None
    casts, mix = after
    chain = [softmax, *casts, mix]
    t, node = _through_casts(softmax.input[0], producer, readers, chain)
    causal, mask_value, scale = False, 0.0, 1.0
    if node is not None and node.op_type in ("Where", "Add") and _only_reader(t, readers):
        found = _causal_mask(node, shapes, constants)
        if found is None:
            return None
        t, mask_value = found
        causal = True
        chain.insert(0, node)
        t, node = _through_casts(t, producer, readers, chain)
    if node is not None and node.op_type in ("Mul", "Div") and _only_reader(t, readers):
        scaled = _scaling(node, constants)
        if scaled is None:
            return None
        t, scale = scaled
        chain.insert(0, node)
        t, node = _through_casts(t, producer, readers, chain)
    if node is None or node.op_type != "MatMul" or not _only_reader(t, readers) \
            or any(i in constants for i in node.input):
        return None
    chain.insert(0, node)
    q, kt = node.input
    v = mix.input[1]
    if not _long_attention_shapes(shapes.get(q), shapes.get(kt), shapes.get(v), rank):
        return None
    views = _key_views(kt, v, producer, readers, shapes)
    if views is None:
        return _Chain(tuple(chain), q, kt, v, mix.output[0], scale, causal, mask_value,
                      True, 1)
    k, v, transposed, groups, absorbed = views
    return _Chain((*absorbed, *chain), q, k, v, mix.output[0], scale, causal, mask_value,
                  transposed, groups)


def _key_views(kt: str, v: str, producer: Mapping[str, onnx.NodeProto],
               readers: Mapping[str, int], shapes: Mapping[str, tuple[int, ...]]
               ) -> tuple[str, str, bool, int, list[onnx.NodeProto]] | None:
    """(keys, values, whether the keys are k^T, query heads per key head, the view nodes the
    fused layer absorbs) when k^T is a Transpose of the last two axes or keys and values
    come through repeat_kv; None when neither."""
    absorbed: list[onnx.NodeProto] = []
    k, transposed = kt, True
    node = producer.get(kt)
    rank = len(shapes[kt])
    if node is not None and node.op_type == "Transpose" and _only_reader(kt, readers):
        perm = next((list(helper.get_attribute_value(a)) for a in node.attribute
                     if a.name == "perm"), None)
        if perm == [*range(rank - 2), rank - 1, rank - 2]:
            k, transposed = node.input[0], False
            absorbed.append(node)
    k_rep, v_rep = _repeat_kv(k, producer, readers, shapes), \
        _repeat_kv(v, producer, readers, shapes)
    groups = 1
    if k_rep is not None and v_rep is not None and k_rep[1] == v_rep[1] and not transposed:
        (k, groups, k_nodes), (v, _, v_nodes) = k_rep, v_rep
        absorbed = [*k_nodes, *absorbed, *v_nodes]
    if not absorbed:
        return None
    return k, v, transposed, groups, absorbed


def _repeat_kv(t: str, producer: Mapping[str, onnx.NodeProto], readers: Mapping[str, int],
               shapes: Mapping[str, tuple[int, ...]]
               ) -> tuple[str, int, list[onnx.NodeProto]] | None:
    """(the key or value heads [B, kv, L, d], the copies n of each, the three nodes) when
    `t` [B, kv n, L, d] is Hugging Face's repeat_kv of them: Unsqueeze to [B, kv, 1, L, d],
    Expand to [B, kv, n, L, d], Reshape back, so head h of `t` is head h // n of the
    source; None otherwise. Judged by the shapes, which fix the data: the Expand copies
    along the one axis it widens and the Reshape merges it, row-major, into the heads."""
    reshape = producer.get(t)
    if reshape is None or reshape.op_type != "Reshape":
        return None
    expand = producer.get(reshape.input[0])
    if expand is None or expand.op_type != "Expand":
        return None
    unsqueeze = producer.get(expand.input[0])
    if unsqueeze is None or unsqueeze.op_type != "Unsqueeze":
        return None
    src = unsqueeze.input[0]
    mids = (unsqueeze.output[0], expand.output[0])
    if not all(_only_reader(m, readers) for m in (*mids, t)) \
            or any(x not in shapes for x in (src, *mids, t)):
        return None
    shape, (unsq, wide, out) = shapes[src], (shapes[m] for m in (*mids, t))
    if len(shape) != 4:
        return None
    b, kv, length, d = shape
    n = wide[2]
    if unsq != (b, kv, 1, length, d) or wide != (b, kv, n, length, d) \
            or out != (b, kv * n, length, d) or n < 2:
        return None
    return src, n, [unsqueeze, expand, reshape]


def _mix(p: str, nodes: Sequence[onnx.NodeProto], readers: Mapping[str, int],
         constants: Mapping[str, np.ndarray]
         ) -> tuple[list[onnx.NodeProto], onnx.NodeProto] | None:
    """(the float casts after the softmax `p`, the MatMul p @ v after them), None when the
    softmax's probabilities go anywhere else."""
    # Whisper's `softmax(qk.float()).to(q.dtype)` and Llama's `softmax(dtype=float32)
    # .to(q.dtype)`: casts of float to float change nothing
    casts = []
    cast = next((n for n in nodes if _float_cast(n) and n.input[0] == p), None)
    while cast is not None:
        casts.append(cast)
        p = cast.output[0]
        if not _only_reader(p, readers):
            return None
        cast = next((n for n in nodes if _float_cast(n) and n.input[0] == p), None)
    mix = next((n for n in nodes if n.op_type == "MatMul" and len(n.input) == 2
                and n.input[0] == p), None)
    if mix is None or mix.input[1] in constants:
        return None
    return casts, mix


def _float_cast(node: onnx.NodeProto) -> bool:
    """A Cast to float32 (of the float32 scores an fp32 export computes: no change)."""
    return node.op_type == "Cast" and any(
        a.name == "to" and a.i == onnx.TensorProto.FLOAT for a in node.attribute)


def _through_casts(t: str, producer: Mapping[str, onnx.NodeProto],
                   readers: Mapping[str, int], chain: list[onnx.NodeProto]
                   ) -> tuple[str, onnx.NodeProto | None]:
    """The scores before any float casts that produce `t` (each read only by the chain,
    put first in `chain`), and the node producing them."""
    node = producer.get(t)
    while node is not None and _float_cast(node) and _only_reader(t, readers):
        chain.insert(0, node)
        t = node.input[0]
        node = producer.get(t)
    return t, node


def _over_last_axis(softmax: onnx.NodeProto, rank: int, opset: int) -> bool:
    """Whether a Softmax of rank-`rank` scores (3 or more) runs over their last axis."""
    # before opset 13 the default axis is 1 (and the softmax runs over every axis from it)
    axis = next((helper.get_attribute_value(a) for a in softmax.attribute if a.name == "axis"),
                1 if opset < 13 else -1)
    return rank >= 3 and int(axis) % rank == rank - 1


def _scaling(node: onnx.NodeProto, constants: Mapping[str, np.ndarray]
             ) -> tuple[str, float] | None:
    """(the scores a Mul or Div by a scalar constant scales, the factor they are multiplied
    by); None when no operand is a nonzero scalar constant."""
    a, b = node.input
    value = _scalar(constants, b)
    if value is None and node.op_type == "Mul":
        a, value = b, _scalar(constants, a)
    if value is None or value == 0:
        return None
    return a, (value if node.op_type == "Mul" else 1.0 / value)


def _long_attention_shapes(sq: tuple[int, ...] | None, sk: tuple[int, ...] | None,
                           sv: tuple[int, ...] | None, rank: int) -> bool:
    """Whether q [.., Lq, d], k^T [.., d, Lk] and v [.., Lk, dv] have the scores' rank, the
    same leading axes and matching inner dims, with at least LONG_SEQUENCE keys."""
    if sq is None or sk is None or sv is None:
        return False
    return len(sq) == len(sk) == len(sv) == rank and sq[:-2] == sk[:-2] \
        and sq[:-2] == sv[:-2] and sq[-1] == sk[-2] and sk[-1] == sv[-2] \
        and sk[-1] >= LONG_SEQUENCE


def _causal_mask(node: onnx.NodeProto, shapes: Mapping[str, tuple[int, ...]],
                 constants: Mapping[str, np.ndarray]) -> tuple[str, float] | None:
    """(the scores the mask applies to, the value masked scores get) when the node is a
    causal mask: Where(lower-triangular condition, scores, value) or Add(scores, 0 on and
    below the diagonal and one negative value above); None otherwise."""
    if node.op_type == "Where":
        cond, scores, value = node.input
        fill = _scalar(constants, value)
        mask = constants.get(cond)
        if fill is None or mask is None or scores in constants:
            return None
        return (scores, fill) if _lower_triangular(mask.astype(bool), shapes[scores]) else None
    a, b = node.input
    scores, mask = (a, constants.get(b)) if b in constants else (b, constants.get(a))
    if mask is None or scores in constants or not np.issubdtype(mask.dtype, np.floating):
        return None
    above = _above_diagonal(mask.shape, shapes[scores])
    if above is None:
        return None
    plane = mask.reshape(mask.shape[-2:])
    if np.any(plane[~above] != 0) or not above.any():
        return None
    values = np.unique(plane[above])
    return (scores, float(values[0])) if len(values) == 1 and values[0] < 0 else None


def _above_diagonal(mask_shape: tuple[int, ...], scores_shape: tuple[int, ...]
                    ) -> np.ndarray | None:
    """Where a causal mask hides keys, for a mask broadcast over everything but the last two
    axes of the scores; None when the mask is not of that shape."""
    if len(mask_shape) < 2 or tuple(mask_shape[-2:]) != tuple(scores_shape[-2:]) \
            or any(d != 1 for d in mask_shape[:-2]):
        return None
    lq, lk = scores_shape[-2:]
    return ~np.tri(lq, lk, lk - lq, dtype=bool)


def _lower_triangular(mask: np.ndarray, scores_shape: tuple[int, ...]) -> bool:
    above = _above_diagonal(mask.shape, scores_shape)
    if above is None:
        return False
    plane = mask.reshape(mask.shape[-2:])
    return bool(np.array_equal(plane, ~above))
