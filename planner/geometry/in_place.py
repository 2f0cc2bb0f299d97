"""In-place layers: an output written over an input that no later layer of the group reads.

Accelerator compilers do not give a residual Add, an activation, a Softmax or a Reshape a
buffer of its own when its input dies there: the result goes where the input was. A layer
may do so when its op allows it (`OpSpec.in_place`: per-element ops, row-wise
normalizations, views) and the input it overwrites

* has the output's dims (N, C, H, W) and maps to it row for row and column for column
  (identity maps), so that in every tile the output's box is the part of the input's box
  this layer reads: never more elements than the input holds;
* is made inside the group (a loaded input may be held for every tile, passes), is not
  stored (a group output waits for its store), not a held buffer (GroupIO.in_place), and
  no later layer of the group reads it (the output may be one the group stores);
* when the layer runs in hidden chunks (planner.geometry.hidden), is one of the stretch's
  chunked maps, like the output: a map every chunk reads again must survive them all.

At that step the cost model counts the input's box and not the output's
(planner.cost.model.live_steps); the emulator takes the output's array off the step's
live bytes, after checking it is no larger than the input's. In a group holding a fused
attention the same holds: the attention layer itself never writes in place (its online
softmax keeps its own scratch), and the keys and values it streams are group inputs, never
a host; so its output projection's residual Add, say, takes the projection's buffer.
"""

from __future__ import annotations

from fuseplan.planner.geometry.hidden import folded_skip, stretches
from fuseplan.planner.geometry.regions import GroupIO
from fuseplan.planner.ir.graph import Graph, MapKind
from fuseplan.planner.ir.ops import op_spec


def in_place_hosts(graph: Graph, io: GroupIO) -> dict[int, str]:
    """Per step (index into io.layers) whose layer writes its output in place, the input
    whose buffer it takes. Worked out once per group (Graph.derived)."""
    key = ("in_place_hosts", io)
    found = graph.derived.get(key)
    if found is None:
        found = graph.derived[key] = _hosts(graph, io)
    return found  # type: ignore[return-value]


def _hosts(graph: Graph, io: GroupIO) -> dict[int, str]:
    last_read: dict[str, int] = {}
    for i, name in enumerate(io.layers):
        for t in graph.layer(name).fmap_inputs:
            last_read[t] = i
    found = stretches(graph, io)
    chunked = {n: set(s.hidden) for s in found for n in s.mids}
    skips = {f.skip for s in found if (f := folded_skip(graph, io, s)) is not None}
    kept = set(io.inputs) | set(io.outputs) | set(io.in_place) | set(io.accumulated)
    hosts: dict[int, str] = {}
    for i, name in enumerate(io.layers):
        lay = graph.layer(name)
        outs = [o for o in lay.outputs if o]
        if not op_spec(lay.op).in_place or len(outs) != 1 \
                or outs[0] in io.in_place or outs[0] in io.accumulated:
            continue
        out = outs[0]
        # a skip last: a residual Add may have taken it into the accumulator
        # (planner.geometry.hidden.folded_skip), so it is no buffer to write over
        for k, t in sorted(enumerate(lay.fmap_inputs), key=lambda kt: kt[1] in skips):
            if t in kept or last_read.get(t) != i or (name in chunked
                                                      and t not in chunked[name]):
                continue
            if lay.row_maps[k].kind is not MapKind.IDENTITY \
                    or lay.col_maps[k].kind is not MapKind.IDENTITY:
                continue
            if graph.dims(t) != graph.dims(out) \
                    or graph.layout(t).spatial != graph.layout(out).spatial:
                continue
            hosts[i] = t
            break
    return hosts
