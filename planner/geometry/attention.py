"""What a fused attention layer holds on chip while it runs (the online softmax).

A FlashAttention layer (planner.front.attention_fusion) computes a tile of query rows
against every key, walking the keys in chunks of `kv_chunk` (emulator.attention_kernel). Beside
the tile's maps it holds, at its step:

* the scratch of one chunk: its scores, [.., T, kv_chunk] for the tile's T query rows, and
  the running maximum and sum of each row: out elements / dv * (kv_chunk + 2);
* where k^T or v (or a part of them: a KV cache, its new positions) is a group input
  (written to DRAM by an earlier group, or a model input), only the chunk being used: they
  stream from DRAM chunk by chunk, each tile reading them whole once (the row maps say
  whole, so the DRAM counts are the usual region sums), and they are
  on chip only at the steps that read them. Produced inside the group, they are on chip
  whole like any other map.

Every footprint (the cost model's, the rule facts', the CP-SAT encoding's) and the emulator's
tally apply these two corrections through this module.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from math import ceil

from fuseplan.planner.geometry.regions import GroupIO, Tile, anchor_extent
from fuseplan.planner.ir.graph import Graph, Layer
from fuseplan.planner.ir.ops import MapRule, attention_keys, op_spec


def fused_attention(lay: Layer) -> bool:
    """A fused attention layer (run with the online softmax)."""
    return op_spec(lay.op).maps is MapRule.ATTENTION


@dataclass(frozen=True)
class OnlineAttention:
    """The fused attention layers of one group and what they hold on chip."""

    # group inputs streamed chunk by chunk: tensor -> (keys, keys per chunk)
    streamed: Mapping[str, tuple[int, int]]
    # (step, output tensor, head width dv, keys per chunk) of each fused attention layer
    scratch: tuple[tuple[int, str, int, int], ...]

    def onchip_elems(self, tensor: str, box_elems: int) -> int:
        """Elements of `tensor` on chip when a tile needs `box_elems` of it: one chunk of
        keys where it streams."""
        keys = self.streamed.get(tensor)
        return box_elems if keys is None else box_elems // keys[0] * keys[1]

    def scratch_elems(self, step: int, out_elems: Mapping[str, int]) -> int:
        """Scratch of the fused layers running at `step`, from the elements of their
        output tile (`out_elems`: tensor -> elements)."""
        return sum(out_elems[out] // dv * (chunk + 2)
                   for at, out, dv, chunk in self.scratch if at == step)


def online_attention(graph: Graph, io: GroupIO) -> OnlineAttention | None:
    """The group's fused attention layers and what they hold, None when it has none."""
    if "fused_attention" not in graph.derived:  # most graphs have none: ask once
        graph.derived["fused_attention"] = any(fused_attention(lay) for lay in graph.layers)
    if not graph.derived["fused_attention"]:
        return None
    key = ("online_attention", io.layers)
    if key in graph.derived:
        return graph.derived[key]  # type: ignore[return-value]
    found = _online_attention(graph, io)
    graph.derived[key] = found
    return found


def _online_attention(graph: Graph, io: GroupIO) -> OnlineAttention | None:
    fused = [(i, graph.layer(name)) for i, name in enumerate(io.layers)
             if fused_attention(graph.layer(name))]
    if not fused:
        return None
    inside = set(io.layers)
    streamed: dict[str, tuple[int, int]] = {}
    for t in io.inputs:
        readers = [graph.layer(c) for c in graph.consumers.get(t, ()) if c in inside]
        if readers and all(fused_attention(r) and t in r.fmap_inputs[1:] for r in readers):
            streamed[t] = _keys_of(readers[0], t, graph.shapes[t])
    scratch = tuple((i, lay.outputs[0], graph.shapes[lay.fmap_inputs[2]][-1],
                     int(lay.attrs["kv_chunk"])) for i, lay in fused)
    return OnlineAttention(streamed, scratch)


def _keys_of(lay: Layer, t: str, shape: tuple[int, ...]) -> tuple[int, int]:
    """(keys, keys per chunk) of `t`, keys or values (or a part of them: a KV cache or its
    new positions) of the fused attention layer `lay`."""
    at = lay.fmap_inputs.index(t)
    keys = attention_keys(lay.attrs, shape)[1] if at % 2 else shape[-2]
    return keys, min(keys, int(lay.attrs["kv_chunk"]))


@dataclass(frozen=True)
class AttentionTraffic:
    """FlashAttention's analytic DRAM count for one fused layer of a group and its tiling:
    q read once, k and v once per pass of a tile of query rows, o written once (each only
    where it crosses the group's boundary)."""

    layer: str
    q_bytes: int  # the queries, read once (0: made inside the group)
    kv_bytes: int  # keys and values streamed by one pass (0: made inside the group)
    passes: int  # tiles of query rows per image
    o_bytes: int  # the output, written once (0: consumed inside the group)

    @property
    def total(self) -> int:
        """q + passes x (k + v) + o."""
        return self.q_bytes + self.passes * self.kv_bytes + self.o_bytes


def attention_traffic(graph: Graph, io: GroupIO, tile: Tile, dtype_bytes: int
                      ) -> list[AttentionTraffic]:
    """The analytic count of each fused attention layer of a group run in `tile`s."""
    found = online_attention(graph, io)
    if found is None:
        return []
    _, h, w = anchor_extent(graph, io)
    passes = ceil(h / tile.h) * ceil(w / tile.w)
    counts = []
    for _, out, _, _ in found.scratch:
        lay = graph.layer(graph.producer[out])
        q, *kv = lay.fmap_inputs
        counts.append(AttentionTraffic(
            lay.name, graph.elems(q) * dtype_bytes if q in io.inputs else 0,
            sum(graph.elems(t) for t in kv if t in found.streamed) * dtype_bytes,
            passes, graph.elems(out) * dtype_bytes if out in io.outputs else 0))
    return counts


def attention_heads(graph: Graph, io: GroupIO) -> int | None:
    """The heads of a group that is one fused attention layer alone, whose queries, keys,
    values and output all hold them on axis 1 ([B, heads, ...]): such a group may run in
    head chunks (the placement's `hidden_chunks`), each tile computing its query rows one
    chunk of heads at a time, so only that chunk's queries, key and value chunks, scratch
    and output are on chip: every byte it holds divides by the chunks. None otherwise."""
    if len(io.layers) != 1:
        return None
    lay = graph.layer(io.layers[0])
    if not fused_attention(lay):
        return None
    # every input, a KV cache's new positions too (planner.front.kv_cache); grouped-query
    # keys (fewer heads than the queries) do not cut along with the queries' heads
    shapes = [graph.shapes[t] for t in (*lay.fmap_inputs, lay.outputs[0])]
    heads = shapes[0][1] if len(shapes[0]) == 4 else 0
    if heads < 2 or any(len(s) != 4 or s[1] != heads for s in shapes):
        return None
    return heads


def head_chunk_options(heads: int) -> list[int]:
    """Chunk counts that cut the heads evenly (every byte on chip then divides exactly)."""
    return [k for k in range(2, heads + 1) if heads % k == 0]
