"""A decode step's KV cache, appended to in place rather than rewritten.

Hugging Face's decoders, exported with a cache, take each layer's past keys and values as
inputs [B, kv_heads, P, d] and return the present ones, `Concat(past, new, axis=2)` [B,
kv_heads, P + n, d], which attention reads. Run as written, every step copies the whole
cache: read P positions, write P + n, then read P + n again for the attention, traffic that
grows with the context while the step's real work (n new positions) does not. A runtime
keeps the cache in one buffer with room to grow: the past is already there, the step writes
its n new positions after it, and the attention reads the buffer.

That is what this rewrite plans. When a Concat's first input is a model input, its output a
model output, and its only readers are fused attention layers (planner.front.attention_fusion)
reading it as keys or values along their key axis, the Concat leaves the graph:

* each attention reads its keys and values in two parts, the cache and the new positions
  ([q, k cache, v cache, k new, v new]; the online softmax walks the cache's chunks, then
  the new ones), so the cache streams from DRAM once and never passes through a copy;
* the new positions become a model output of the plan (written to DRAM once: the append),
  and the Concat's output is recorded as a `CacheAppend`, a view of the cache's buffer that
  the emulator assembles, at no cost, to check it against onnxruntime.

Keys and values are rewritten together or not at all (an attention with one part of its
keys and two of its values has no meaning).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import onnx
from onnx import helper

from fuseplan.planner.ir.graph import CacheAppend


def append_caches(nodes: Sequence[onnx.NodeProto], shapes: Mapping[str, tuple[int, ...]],
                  inputs: Sequence[str], outputs: Sequence[str], attention: str
                  ) -> tuple[list[onnx.NodeProto], tuple[CacheAppend, ...], tuple[str, ...]]:
    """(the nodes with every cache Concat dropped and its attentions reading the cache and
    the new positions apart, the appends, the outputs the plan writes: the model outputs
    with each appended one replaced by its new positions). `attention`: the op type of the
    fused attention layers."""
    readers: dict[str, list[onnx.NodeProto]] = {}
    for n in nodes:
        for t in n.input:
            readers.setdefault(t, []).append(n)
    candidates = {a.output: a for a in _appends(nodes, shapes, set(inputs), set(outputs))}
    while True:  # a cache stays appended only when every reader can read it in two parts
        pairs = {id(n): (candidates[n.input[1]], candidates[n.input[2]]) for n in nodes
                 if n.op_type == attention and len(n.input) == 3
                 and not _attr(n, "transposed_keys", 1)
                 and n.input[1] in candidates and n.input[2] in candidates}
        kept = {t: a for t, a in candidates.items()
                if all(id(r) in pairs for r in readers.get(t, ()))}
        if len(kept) == len(candidates):
            break
        candidates = kept
    if not candidates:
        return list(nodes), (), tuple(outputs)
    out = []
    for n in nodes:
        if n.op_type == "Concat" and n.output[0] in candidates:
            continue
        pair = pairs.get(id(n))
        out.append(n if pair is None else _two_part(n, *pair))
    appends = tuple(candidates.values())
    planned = (candidates[t].new if t in candidates else t for t in outputs)
    return out, appends, tuple(dict.fromkeys(planned))


def _attr(node: onnx.NodeProto, name: str, default: int) -> int:
    return next((int(helper.get_attribute_value(a)) for a in node.attribute if a.name == name),
                default)


def _appends(nodes: Sequence[onnx.NodeProto], shapes: Mapping[str, tuple[int, ...]],
             inputs: set[str], outputs: set[str]) -> list[CacheAppend]:
    """Concats of a model input and new positions (made by a node: the plan writes them),
    along the key axis of [B, heads, L, d], into a model output."""
    made = {t for n in nodes for t in n.output}
    found = []
    for n in nodes:
        if n.op_type != "Concat" or len(n.input) != 2 or n.output[0] not in outputs \
                or n.input[0] not in inputs or n.input[1] not in made:
            continue
        shape = shapes.get(n.output[0], ())
        if len(shape) != 4:
            continue
        axis = _attr(n, "axis", 0) % 4
        if axis == 2:
            found.append(CacheAppend(n.output[0], n.input[0], n.input[1], axis))
    return found


def _two_part(node: onnx.NodeProto, k: CacheAppend, v: CacheAppend) -> onnx.NodeProto:
    """The attention reading its keys and values as the cache and the new positions."""
    fused = helper.make_node(node.op_type, [node.input[0], k.cache, v.cache, k.new, v.new],
                             list(node.output), name=node.name, domain=node.domain)
    fused.attribute.extend(node.attribute)
    return fused
