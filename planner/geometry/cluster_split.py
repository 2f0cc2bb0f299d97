"""Cluster split: every cluster runs the same tile, each on its own share of the output
channels, so that a group's weights are spread over the clusters' weight memories.

Tiles outer, a chip with C clusters runs C tiles side by side, and each cluster holds a copy
of the group's weights (planner.geometry.rounds). A group whose weights do not fit one
cluster's WRAM then streams them, once per round of tiles: at batch 16, VGG-19's fourth
stage (16.5 MB of weights against a cluster's 4 MiB) reads them four times. Split over the
clusters instead, each cluster keeps 1/C of every layer's output channels resident; the
clusters run one tile at a time together, so every weight is read once for the whole batch.

What a cluster needs, by layer:

* a **split layer** (its weights cut along its output channels: a Conv without groups, a
  Linear) reads its input whole and makes its share of the output channels; an input made
  in the group is first **gathered**: every cluster sends its share to the others over the
  cluster links; an input loaded from DRAM reaches every cluster in one read (a broadcast,
  as a round's streamed weights are);
* a **per-channel layer** (a per-element op, a pooling window, a normalisation by
  per-channel statistics) makes each output channel from the same channel of its inputs,
  so each cluster runs it on its share alone; an input loaded from DRAM is read a share
  per cluster.

* any other layer that is not a main one (a normalisation over the channels, a reshape, a
  softmax) is **replicated**: every cluster runs it whole on whole inputs (a map made in
  the group is gathered first) with its constants whole, and its output is whole on every
  cluster, so a split layer reading it needs no gather (a pre-norm's LayerNorm before the
  MLP it feeds).

* a **fused attention** has no weights but heads to share out: each cluster makes its
  share of the query heads (axis 1 of its output) from the queries, keys and values
  whole, so that a decoder layer splits as a whole, its attention's work shared like its
  projections'; its output is gathered by the layer merging the heads;
* any other main layer without weights (a product of two maps: the scores of queries and
  keys unfused) is replicated, as the layers above: done C times over.

A main layer with weights that cannot be cut (a depthwise conv) rules the split out. The DRAM
traffic is that of the same tiles with resident weights; what the split adds is the
cluster-link traffic of the gathers (each gathered map's tile crosses C - 1 links), the
per-cluster share of the weights, and the work of replicated layers, done C times. The cost
model (planner.cost.cluster_split), the planners (solver.cluster_split) and the emulator
(emulator.split) all read the split from here.
"""

from __future__ import annotations

from dataclasses import dataclass

from fuseplan.planner.geometry.attention import attention_heads, kept_prefix, prefix_reader
from fuseplan.planner.geometry.regions import GroupIO, group_io
from fuseplan.planner.ir.chunks import chunk_axes, chunk_ranges
from fuseplan.planner.ir.graph import Graph, Layer
from fuseplan.planner.ir.ops import op_spec


@dataclass(frozen=True)
class ClusterSplit:
    """How a group's layers share out over the clusters (see the module's docstring)."""

    split: tuple[str, ...]  # layers whose output channels the clusters share out
    gathered: tuple[str, ...]  # maps made in the group a split or replicated layer reads whole
    axis: tuple[tuple[str, int], ...]  # per map made in shares: the axis its shares cut
    replicated: tuple[str, ...] = ()  # layers every cluster runs whole
    # fused attentions each cluster runs for its share of the query heads (no weights)
    headed: tuple[str, ...] = ()


def cluster_split(graph: Graph, io: GroupIO) -> ClusterSplit | None:
    """The split of a group over the clusters, or None when a main layer of it has weights
    but no output channels to share them out by, a main layer makes two maps, a layer split
    shares weights with another, it has no layer to split, or it ends in an accumulation.
    Constants shared by layers held whole (a rotary embedding's tables) are fine."""
    if io.accumulated:
        return None
    split: list[str] = []
    gathered: list[str] = []
    replicated: list[str] = []
    headed: list[str] = []
    axis: dict[str, int] = {}
    whole: set[str] = set()  # maps replicated layers make: whole on every cluster
    seen: set[str] = set()  # every layer's weights so far
    cut_seen: set[str] = set()  # the split layers'
    for name in io.layers:
        lay = graph.layer(name)
        outs = [t for t in lay.outputs if t]
        if not outs or any(t not in graph.shapes for t in outs):
            return None
        out = outs[0]
        # a layer making several maps (a Split of q, k and v) is replicated, every part whole
        many = len(outs) > 1
        cut = None if many else _split_axis(graph, lay, out)
        mine = set(lay.weights)
        # a split layer's weights are its own: a tensor cut for one layer is not whole for
        # another (constants layers held whole share, such as a rotary embedding's tables)
        if mine & (seen if cut is not None else cut_seen):
            return None
        seen |= mine
        if cut is not None:
            cut_seen |= mine
            split.append(name)
            _gather(lay, axis, gathered)
            axis[out] = cut
            continue
        at = None if many else _per_channel_axis(graph, io, lay, out, axis, whole)
        if at is not None:
            axis[out] = at
            continue
        if lay.is_main and (lay.weights or many):  # weights it cannot cut along its outputs
            return None
        if not many and attention_heads(graph, group_io(graph, (name,))) is not None:
            headed.append(name)
            _gather(lay, axis, gathered)
            axis[out] = 1  # [B, heads, rows, head width]
            continue
        replicated.append(name)
        _gather(lay, axis, gathered)
        whole.update(outs)
    if not split:
        return None
    return ClusterSplit(tuple(split), tuple(gathered), tuple(axis.items()), tuple(replicated),
                        tuple(headed))


def busiest_shares(graph: Graph, io: GroupIO, split: ClusterSplit, clusters: int
                   ) -> dict[str, tuple[int, int]]:
    """Per layer whose work the clusters share out (a split layer's output channels, a
    fused attention's query heads, a per-channel layer's share): (the length of the axis
    its output is cut on, the busiest cluster's part of it, ceil(length / clusters)). The
    clusters wait for the busiest: 14 heads over 4 clusters keep one cluster on 4 of them.
    Replicated layers run whole on every cluster (absent)."""
    axis = dict(split.axis)
    found = {}
    for name in io.layers:
        out = graph.layer(name).outputs[0]
        if out in axis:  # a replicated layer's maps are whole, never cut
            length = graph.shapes[out][axis[out]]
            found[name] = (length, -(-length // clusters))
    return found


def wram_keys(graph: Graph, io: GroupIO, split: ClusterSplit, clusters: int
              ) -> dict[str, int] | None:
    """Per kept key or value tensor of a split group (attention.kept_prefix): the elements
    of it the busiest cluster holds in its cores' WRAM when the kept keys stay there
    (Mode.keys_in_wram), whole over the rows. A fused attention shares out its query heads
    (ClusterSplit.headed), so a cluster keeps only the key and value heads its own query
    heads read: 3 of GPT-2's 12 on each of 4 clusters; with grouped-query attention, every
    KV head one of its query heads reads (the busiest cluster's count). Keys and values are
    the stationary operands of the attention's two products, as weights are of a
    projection's, so they sit in the weight memory beside the cluster's weight share.
    None where the group keeps none, or a kept tensor is not [B, heads, rows, width] read
    only by a fused attention the split shares out by heads."""
    kept = kept_prefix(graph, io)
    if not kept:
        return None
    found = {}
    for t in sorted(kept):
        reader = prefix_reader(graph, io, t)
        if reader is None or reader[0].name not in split.headed:
            return None
        dims, heads = graph.shapes[t], graph.shapes[reader[0].outputs[0]][1]
        if len(dims) != 4 or heads % dims[1]:
            return None
        per_kv = heads // dims[1]  # query heads reading each key head
        most = max((hi - 1) // per_kv - lo // per_kv + 1
                   for lo, hi in chunk_ranges(heads, clusters))
        found[t] = graph.elems(t) // dims[1] * most
    return found


def _gather(lay: Layer, axis: dict[str, int], gathered: list[str]) -> None:
    """Add the maps made in shares that `lay` reads whole to `gathered`."""
    gathered += [t for t in lay.fmap_inputs if t in axis and t not in gathered]


def _split_axis(graph: Graph, lay: Layer, out: str) -> int | None:
    """The output axis a layer's weights are cut along, when the op table cuts them along
    its output channels (planner.ir.chunks) into at least two."""
    found = chunk_axes(graph, lay)
    if found is None or found[0] < 2:
        return None
    rank = len(graph.shapes[out])
    at = op_spec(lay.op).chunk_out_axis % rank
    return at if graph.shapes[out][at] == found[0] else None


def _per_channel_axis(graph: Graph, io: GroupIO, lay: Layer, out: str,
                      axis: dict[str, int], whole: set[str]) -> int | None:
    """The axis of `out` a per-channel layer keeps the shares on, or None when the layer
    is not per-channel on the shares of what it reads: every map it reads is a share cut
    on one axis of its output's length there (or a group input of its output's shape, read
    a share per cluster, or a map of that shape every cluster holds whole). Its constants
    need no check: a per-channel op never mixes channels, and each cluster holds its
    constants whole."""
    spec = op_spec(lay.op)
    pooling = spec.sliding_window and not spec.is_convolution and not lay.weights
    # per-element ops; pools; normalisations by per-channel constants and statistics
    # (BatchNormalization, InstanceNormalization)
    per_channel = spec.channel_local or pooling or spec.per_channel_constants
    if not per_channel or not lay.fmap_inputs:
        return None
    shape = graph.shapes[out]
    cuts = {axis[t] for t in lay.fmap_inputs if t in axis}
    if len(cuts) != 1:
        return None
    at = cuts.pop()
    for t in lay.fmap_inputs:
        dims = graph.shapes.get(t)
        if dims is None or len(dims) != len(shape) or dims[at] != shape[at]:
            return None
        if t not in axis and ((t not in io.inputs and t not in whole)
                              or (not pooling and dims != shape)):
            return None
    return at
