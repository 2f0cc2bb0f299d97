"""Sliding windows: the row and column maps of a conv, pool or transposed conv, and the
channel-first sequences [N, C, L] that 1-D windows slide along.

A 2-D window maps the rows and columns of an NCHW map; a 1-D window (Conv1d, MaxPool1d)
maps the length of an NCL map (planner.ir.layout.ncl), tiled as rows, with no columns.
Which rank-3 maps are NCL is found before the layers are built (`length_tensors`): those a
1-D window reads or writes, and the per-element ops joining them, as a transformer's token
stretch is found (planner.front.graph_build._token_tensors).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from math import ceil
from typing import Any

import networkx as nx
import numpy as np
import onnx

from fuseplan.planner.ir.graph import IDENTITY, WHOLE, AxisMap, MapKind
from fuseplan.planner.ir.layout import Layout
from fuseplan.planner.ir.ops import MapRule, OpClass, OpSpec, op_spec


def resolve_pads(attrs: Mapping[str, Any], in_hw: Sequence[int], kernel: list[int],
                 strides: list[int], dilations: list[int]) -> list[int]:
    """Explicit pads (all begins, then all ends: [top, left, bottom, right] in 2-D),
    resolving auto_pad."""
    auto = attrs.get("auto_pad", "NOTSET")
    if auto in ("NOTSET", ""):
        return list(attrs.get("pads", [0] * (2 * len(kernel))))
    if auto == "VALID":
        return [0] * (2 * len(kernel))
    begins, ends = [], []
    for size, k, s, d in zip(in_hw, kernel, strides, dilations, strict=True):
        total = max(0, (ceil(size / s) - 1) * s + (k - 1) * d + 1 - size)
        small = total // 2
        begin = small if auto == "SAME_UPPER" else total - small
        begins.append(begin)
        ends.append(total - begin)
    return begins + ends


def with_kernel_shape(spec: OpSpec, attrs: dict[str, Any], w_shape: tuple[int, ...] | None
                      ) -> dict[str, Any]:
    """A conv's attributes with its kernel_shape, from the weight where the node does not
    name it (it is optional in ONNX)."""
    # the window maps take the kernel from the weight; the output's layout must too: a
    # 1x1 conv of a sequence keeps its layout only where it is seen to be 1x1
    if spec.is_convolution and w_shape is not None and "kernel_shape" not in attrs:
        return {**attrs, "kernel_shape": list(w_shape[2:])}
    return attrs


def _window_maps(spec: OpSpec, attrs: dict[str, Any], in_shape: tuple[int, ...],
                 w_shape: tuple[int, ...] | None, layout: Layout
                 ) -> tuple[AxisMap, AxisMap, dict[str, Any]]:
    """Window maps of a conv or pool over its (channel-first, ONNX) spatial axes 2..; with
    the pads resolved into the attributes. A 2-D window maps rows and columns, a 1-D one
    the length of an NCL map (its rows); any other window needs the whole map."""
    if spec.is_convolution and w_shape is not None:
        kernel = list(attrs.get("kernel_shape", w_shape[2:]))
    else:
        kernel = list(attrs["kernel_shape"])
    nd = len(kernel)
    strides = list(attrs.get("strides", [1] * nd))
    dilations = list(attrs.get("dilations", [1] * nd))
    pads = resolve_pads(attrs, tuple(in_shape[2:]), kernel, strides, dilations)
    attrs = {**attrs, "pads": pads, "kernel_shape": kernel, "strides": strides}
    attrs.pop("auto_pad", None)
    if spec.is_convolution:
        attrs["dilations"] = dilations
    if nd == 1 and (layout.rank, layout.batch_axis, layout.row_axis) == (3, 0, 2) \
            and layout.col_axis is None and not int(attrs.get("count_include_pad", 0)):
        # the length is the map's rows; a tile of rows passes its own pads along it
        return AxisMap(MapKind.WINDOW, kernel[0], strides[0], pads[0], dilations[0]), \
            IDENTITY, attrs
    if nd != 2 or (layout.row_axis, layout.col_axis) != (layout.rank - 2, layout.rank - 1):
        # a 2-D window slides over axes 2 and 3: only where those are the rows and columns;
        # a 1x1 window contracts the channels alone, per position whatever the layout
        return (IDENTITY, IDENTITY, attrs) if pointwise(attrs, kernel, layout) \
            else (WHOLE, WHOLE, attrs)
    row = AxisMap(MapKind.WINDOW, kernel[0], strides[0], pads[0], dilations[0])
    col = AxisMap(MapKind.WINDOW, kernel[1], strides[1], pads[1], dilations[1])
    return row, col, attrs


def pointwise(attrs: Mapping[str, Any], kernel: Sequence[int], layout: Layout) -> bool:
    """A window of one element, unstrided, unpadded, over a map whose axis 1 is a channel
    axis and whose batch (if any) is axis 0: a 1x1 conv mixes each position's channels."""
    return all(k == 1 for k in kernel) \
        and all(int(s) == 1 for s in attrs.get("strides", [1] * len(kernel))) \
        and not any(attrs.get("pads", [])) and 1 in layout.channel_axes \
        and layout.batch_axis in (0, None) and layout.spatial


def sliding_window(spec: OpSpec, attrs: dict[str, Any], in_shapes: Sequence[tuple[int, ...]],
                   w_shape: tuple[int, ...] | None, in_layouts: Sequence[Layout]
                   ) -> tuple[tuple[AxisMap, AxisMap] | None, dict[str, Any]]:
    """The row and column maps of a window sliding over the data input (a conv or pool, or a
    transposed conv with explicit pads), None for other ops; and the attributes, with a
    window's pads resolved."""
    if spec.maps is MapRule.WINDOW and in_shapes:
        row, col, attrs = _window_maps(spec, attrs, in_shapes[0], w_shape, in_layouts[0])
        return (row, col), attrs
    if spec.maps is MapRule.TRANSPOSED and in_shapes and w_shape is not None \
            and len(w_shape) == 4 and attrs.get("auto_pad", "NOTSET") in ("NOTSET", ""):
        k = list(attrs.get("kernel_shape", w_shape[2:]))
        s = list(attrs.get("strides", [1, 1]))
        d = list(attrs.get("dilations", [1, 1]))
        p = list(attrs.get("pads", [0, 0, 0, 0]))
        return (AxisMap(MapKind.TRANSPOSED, k[0], s[0], p[0], d[0]),
                AxisMap(MapKind.TRANSPOSED, k[1], s[1], p[1], d[1])), attrs
    return None, attrs


# per-element and per-position ops that keep an [N, C, L] map's batch and length: joined
# to the maps they read of their own shape
_JOINING = frozenset({MapRule.LOCAL, MapRule.CONCAT, MapRule.REDUCE})


def length_tensors(nodes: Sequence[onnx.NodeProto], shapes: Mapping[str, tuple[int, ...]],
                   constants: Mapping[str, np.ndarray], claimed: frozenset[str]
                   ) -> frozenset[str]:
    """Rank-3 maps [N, C, L] a 1-D conv or pool slides along: those such a window reads or
    writes, and those per-element ops (of the same N and L) join to them, unless any of a
    stretch is `claimed` (a token stretch: [B, L, C] read along its last axis)."""
    links = nx.Graph()
    seeds: set[str] = set()
    for node in nodes:
        spec = op_spec(node.op_type)
        out = node.output[0] if node.output else ""
        out_shape = shapes.get(out, ())
        fmap = [t for t in node.input if t and t not in constants]
        if len(out_shape) != 3 or not fmap or spec.op_class is OpClass.OPAQUE:
            continue
        if spec.sliding_window:
            if len(shapes.get(fmap[0], ())) == 3:
                seeds.update((fmap[0], out))
                links.add_nodes_from((fmap[0], out))
            continue
        if spec.maps not in _JOINING:
            continue
        links.add_node(out)
        links.add_edges_from((t, out) for t in fmap if len(shapes.get(t, ())) == 3
                             and shapes[t][0] == out_shape[0] and shapes[t][2] == out_shape[2])
    found: set[str] = set()
    for part in nx.connected_components(links):
        if part & seeds and not part & claimed:
            found |= part
    return frozenset(found)
