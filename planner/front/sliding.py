"""Sliding windows: the row and column maps of a conv, pool or transposed conv, and the
channel-first sequences [N, C, L] that 1-D windows slide along.

A 2-D window maps the rows and columns of an NCHW map; a 1-D window (Conv1d, MaxPool1d)
maps the length of an NCL map (planner.ir.layout.ncl), tiled as rows, with no columns.
Which rank-3 maps are NCL is found before the layers are built, with the token sequences
and channels-last maps (planner.front.stretches).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from math import ceil
from typing import Any

from fuseplan.planner.ir.graph import IDENTITY, WHOLE, AxisMap, MapKind
from fuseplan.planner.ir.layout import Layout
from fuseplan.planner.ir.ops import MapRule, OpSpec


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
