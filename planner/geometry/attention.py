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
from dataclasses import dataclass, replace
from math import ceil

from fuseplan.planner.geometry.regions import (
    AxisChain,
    GroupChains,
    GroupIO,
    Tile,
    anchor_extent,
    box_elems,
    group_io,
    iter_tiles,
    tile_regions,
)
from fuseplan.planner.ir.graph import Graph, Layer, MapKind
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
    # the streamed inputs a causal layer reads only up to each tile's last query (their
    # rows are the keys: a tile's box holds its prefix of them, not all)
    prefix: frozenset[str] = frozenset()
    # the tensors the group makes that a causal layer reads a prefix of: under halo reuse
    # the tiles keep them as they go, what they hold growing with every tile, so no tile
    # stands for the others (planner.geometry.halo_reuse walks each one)
    kept: frozenset[str] = frozenset()

    def onchip_elems(self, tensor: str, box_elems: int, rows: int | None = None) -> int:
        """Elements of `tensor` on chip when a tile needs `box_elems` of it: one chunk of
        keys where it streams (`rows`: the rows of the box, its keys where it holds a
        causal prefix of them; None: the largest box any tile reads, all keys)."""
        keys = self.streamed.get(tensor)
        if keys is None:
            return box_elems
        held = rows if rows is not None and tensor in self.prefix else keys[0]
        return box_elems // held * min(held, keys[1]) if held else 0

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
    prefixed = {t for _, lay in fused
                for t, m in zip(lay.fmap_inputs, lay.row_maps, strict=True)
                if m.kind is MapKind.PREFIX}
    made = {t for name in io.layers for t in graph.layer(name).outputs if t}
    return OnlineAttention(streamed, scratch, frozenset(prefixed & set(streamed)),
                           frozenset(prefixed & made))


def kept_prefix(graph: Graph, io: GroupIO) -> frozenset[str]:
    """The tensors the group makes and reads a prefix of (OnlineAttention.kept): a causal
    attention's keys and values made in the group; empty where there are none."""
    found = online_attention(graph, io)
    return found.kept if found is not None else frozenset()


def _keys_of(lay: Layer, t: str, shape: tuple[int, ...]) -> tuple[int, int]:
    """(keys, keys per chunk) of `t`, keys or values (or a part of them: a KV cache or its
    new positions) of the fused attention layer `lay`."""
    at = lay.fmap_inputs.index(t)
    keys = attention_keys(lay.attrs, shape)[1] if at % 2 else shape[-2]
    return keys, min(keys, int(lay.attrs["kv_chunk"]))


def spillable(graph: Graph, io: GroupIO) -> bool:
    """Whether the group's kept keys (kept_prefix) may be spilled (Mode.keys_spilled): it has
    some, each read once in the group, as its causal attention's prefix, and none leaving
    the group (a tile then writes its rows once, and reads back only what that one reader
    needs)."""
    kept = kept_prefix(graph, io)
    return bool(kept) and all(prefix_reader(graph, io, t) is not None and t not in io.outputs
                              for t in kept)


def reader_chunk(lay: Layer, t: str, shape: tuple[int, ...]) -> int:
    """Keys per chunk the fused attention layer `lay` walks its input `t` in."""
    return _keys_of(lay, t, shape)[1]


def prefix_reader(graph: Graph, io: GroupIO, tensor: str) -> tuple[Layer, int] | None:
    """(the layer, the input index) of the one read of `tensor` in the group, where that is a
    causal fused attention's read of a prefix of its keys or values (MapKind.PREFIX); None
    where the group reads it otherwise or more than once."""
    reads = [(graph.layer(name), j) for name in io.layers
             for j, x in enumerate(graph.layer(name).fmap_inputs) if x == tensor]
    if len(reads) != 1 or reads[0][0].row_maps[reads[0][1]].kind is not MapKind.PREFIX:
        return None
    return reads[0]


def prefix_rows(graph: Graph, io: GroupIO, chains: GroupChains, tensor: str, extent: int,
                size: int) -> list[int] | None:
    """Rows of `tensor` each tile of `size` rows along the anchor's `extent` reads, where a
    causal fused attention reads a prefix of them (its keys or values, up to the key its
    tile's last query row sees), from the closed form of that layer's output rows; None
    where the tensor is not read so or the output has no closed form. Each tile's prefix
    has its own length (no interior tile stands for the others), but a tile's is one
    subtraction, where a walk would run the group's regions."""
    found = prefix_reader(graph, io, tensor)
    if found is None:
        return None
    lay, j = found
    c = chains.chains[lay.outputs[0]][1]
    if c is None:
        return None
    keys, pad = graph.dims(tensor)[2], lay.row_maps[j].pad
    rows = []
    for a in range(0, extent, size):
        if c.s == 0:  # every tile computes every query row
            lo, hi = 0, c.u
        else:
            lo, hi = max(0, c.s * a - c.p), min(c.u, c.s * (min(extent, a + size) - 1) + c.e)
        rows.append(max(0, min(keys, hi - pad)) if hi > lo else 0)
    return rows


def picking_chains(graph: Graph, io: GroupIO, chains: GroupChains) -> GroupChains:
    """The chains to pick a group's representative tiles by (planner.cost.model.
    representative_boxes): a causal attention's streamed keys and values
    (OnlineAttention.prefix) have no closed form along rows, each tile reading its own
    prefix of them, but on chip they hold one chunk of keys (fewer while the prefix is
    shorter than a chunk, which never sets the peak): they pick tiles as whole maps would."""
    attention = online_attention(graph, io)
    if attention is None or not attention.prefix:
        return chains
    whole = {t: (c[0], AxisChain(0, 0, chains.full[t][3], chains.full[t][3]), c[2])
             for t, c in chains.chains.items() if t in attention.prefix}
    return replace(chains, chains={**chains.chains, **whole})


@dataclass(frozen=True)
class AttentionTraffic:
    """FlashAttention's analytic DRAM count for one fused layer of a group and its tiling:
    q read once, k and v once per pass of a tile of query rows (a causal layer's only up to
    the tile's last query: FlashAttention-2 skips the chunks past the diagonal), o written
    once (each only where it crosses the group's boundary)."""

    layer: str
    q_bytes: int  # the queries, read once (0: made inside the group)
    kv_bytes: int  # keys and values, whole (0: made inside the group)
    passes: int  # tiles of query rows per image
    o_bytes: int  # the output, written once (0: consumed inside the group)
    # keys and values the passes read in all: passes x kv_bytes, less the keys past each
    # causal tile's last query
    kv_reads: int

    @property
    def total(self) -> int:
        """q + the keys and values of every pass + o."""
        return self.q_bytes + self.kv_reads + self.o_bytes

    def kv_label(self) -> str:
        """How many times the passes read the keys and values whole: '2×', or '1.50×' where
        causal tiles read a prefix of them."""
        if not self.kv_bytes or self.kv_reads == self.passes * self.kv_bytes:
            return f"{self.passes}×"
        return f"{self.kv_reads / self.kv_bytes:.2f}×"


def attention_traffic(graph: Graph, io: GroupIO, tile: Tile, dtype_bytes: int
                      ) -> list[AttentionTraffic]:
    """The analytic count of each fused attention layer of a group run in `tile`s."""
    found = online_attention(graph, io)
    if found is None:
        return []
    _, h, w = anchor_extent(graph, io)
    passes = ceil(h / tile.h) * ceil(w / tile.w)
    # the boxes a causal layer's tiles read of its keys and values (their prefixes)
    read = {t: 0 for t in found.prefix}
    if read:
        for box in iter_tiles(graph, io, tile):
            regions = tile_regions(graph, io, box)
            for t in read:
                read[t] += box_elems(graph, t, regions[t])
    counts = []
    for _, out, _, _ in found.scratch:
        lay = graph.layer(graph.producer[out])
        q, *kv = lay.fmap_inputs
        streamed = [t for t in kv if t in found.streamed]
        whole = sum(graph.elems(t) for t in streamed)
        counts.append(AttentionTraffic(
            lay.name, graph.elems(q) * dtype_bytes if q in io.inputs else 0,
            whole * dtype_bytes, passes,
            graph.elems(out) * dtype_bytes if out in io.outputs else 0,
            sum(read[t] if t in read else passes * graph.elems(t) for t in streamed)
            * dtype_bytes))
    return counts


def alone_traffic(graph: Graph, io: GroupIO, tile: Tile, dtype_bytes: int,
                  reuse: bool = False) -> list[AttentionTraffic]:
    """FlashAttention's I/O of each fused attention layer of a group as if it ran alone at
    the query rows the group's tiles give it: q read, k and v streamed per pass (a causal
    pass's prefix of them), o written, whatever the group keeps on chip. Summed over a
    plan, with the floor, it is the I/O a prefill is measured against. A halo-reusing group
    (`reuse`) keeps the keys it makes as its tiles go (kept_prefix), so however
    short its tiles, its attention reads them once: one pass, FlashAttention's least (where
    it spills them, Mode.keys_spilled, its tiles read them back: not `reuse` here)."""
    found = online_attention(graph, io)
    if found is None:
        return []
    n, h, w = anchor_extent(graph, io)
    first = tile_regions(graph, io, (0, min(n, tile.n), 0, min(h, tile.h), 0, min(w, tile.w)))
    counts = []
    for _, out, _, _ in found.scratch:
        lay = graph.layer(graph.producer[out])
        alone = group_io(graph, (lay.name,))
        aw = anchor_extent(graph, alone)[2]
        kept = reuse and not any(t in found.streamed for t in lay.fmap_inputs[1:])
        rows = anchor_extent(graph, alone)[1] if kept else max(1, first[out][3] - first[out][2])
        counts += attention_traffic(graph, alone, Tile(first[out][1] - first[out][0], rows, aw),
                                    dtype_bytes)
    return counts


def attention_heads(graph: Graph, io: GroupIO) -> int | None:
    """The heads of a group that is one fused attention layer alone, whose queries, keys,
    values and output all hold them on axis 1 ([B, heads, ...]): such a group may run in
    head chunks (the placement's `hidden_chunks`), each tile computing its query rows one
    chunk of heads at a time, so only that chunk's queries, key and value chunks, scratch
    and output are on chip: every byte it holds divides by the chunks. Grouped-query keys
    and values (fewer heads, each read by as many query heads: attention_kv_heads) cut
    along with their query heads. None otherwise."""
    found = _head_counts(graph, io)
    return None if found is None else found[0]


def attention_kv_heads(graph: Graph, io: GroupIO) -> int | None:
    """The key and value heads of a lone fused attention that attention_heads cuts (its
    query heads where every query head has its own), None where it has none."""
    found = _head_counts(graph, io)
    return None if found is None else found[1]


def _head_counts(graph: Graph, io: GroupIO) -> tuple[int, int] | None:
    if len(io.layers) != 1:
        return None
    lay = graph.layer(io.layers[0])
    if not fused_attention(lay):
        return None
    # the queries and output, then every key and value input (a KV cache's new positions
    # too: planner.front.kv_cache), all [B, heads, ...]
    q = [graph.shapes[t] for t in (lay.fmap_inputs[0], lay.outputs[0])]
    kv = [graph.shapes[t] for t in lay.fmap_inputs[1:]]
    heads = q[0][1] if len(q[0]) == 4 else 0
    kv_heads = kv[0][1] if kv and len(kv[0]) == 4 else 0
    if heads < 2 or any(len(s) != 4 or s[1] != heads for s in q) \
            or kv_heads < 1 or heads % kv_heads \
            or heads // kv_heads != int(lay.attrs.get("kv_groups", 1)) \
            or any(len(s) != 4 or s[1] != kv_heads for s in kv):
        return None
    return heads, kv_heads


def head_chunk_options(heads: int, kv_heads: int | None = None) -> list[int]:
    """Chunk counts that cut the heads evenly, and the key and value heads of grouped-query
    attention with them (each chunk whole groups of query heads and the key head they
    read): every byte on chip then divides exactly."""
    unit = kv_heads or heads
    return [k for k in range(2, unit + 1) if unit % k == 0 and heads % k == 0]
