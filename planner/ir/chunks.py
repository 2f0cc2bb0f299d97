"""Output-channel chunks of a layer: which of its weights split along its output channels.

A layer with weights (Conv without groups, Gemm, MatMul with a constant B) can be computed
in chunks of output channels: each chunk of weights, applied to the whole input, yields its
slice of the output. The op table says which axis of each constant runs over the output
channels (``OpSpec.chunk_axis``) and along which output axis the slices join
(``OpSpec.chunk_out_axis``). The cost model (planner.cost.weight_stream) sizes the chunks;
the emulator computes them.
"""

from __future__ import annotations

from fuseplan.planner.ir.graph import Graph, Layer
from fuseplan.planner.ir.ops import op_spec


def chunk_axes(graph: Graph, lay: Layer) -> tuple[int, dict[str, int]] | None:
    """(output channels, axis of each weight split along them) of a layer computed in
    output-channel chunks, or None when it can only be computed whole."""
    spec = op_spec(lay.op)
    if spec.chunk_axis is None or not lay.weights:
        return None
    axes: dict[str, int] = {}
    for index, name in enumerate(lay.inputs):
        if name in lay.weights and name not in axes:
            axis = spec.chunk_axis(index, tuple(graph.constants[name].shape), lay.attrs)
            if axis is not None:
                axes[name] = axis
    if len(lay.inputs) < 2 or lay.inputs[1] not in axes:  # the kernel (input 1) must split
        return None
    out = lay.outputs[0]
    if out in graph.shapes:
        layout = graph.layout(out)
        at = spec.chunk_out_axis % len(graph.shapes[out])
        if at in (layout.batch_axis, layout.row_axis, layout.col_axis):
            # the output's layout tiles that axis (a channels-last map read as NCHW):
            # slices of it are tiles' boxes, not channels
            return None
    sizes = {int(graph.constants[w].shape[a]) for w, a in axes.items()}
    if len(sizes) != 1:  # e.g. a bias broadcast along another axis: not one channel count
        return None
    return sizes.pop(), axes


def chunk_ranges(channels: int, chunks: int) -> list[tuple[int, int]]:
    """Output-channel ranges of `chunks` chunks: equal ones of ceil(C / chunks), the last
    possibly shorter."""
    size = -(-channels // chunks)
    return [(lo, min(channels, lo + size)) for lo in range(0, channels, size)]
