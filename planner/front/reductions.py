"""The axes a Reduce node folds, and what they say of the layout of the map it reads.

A reduction's semantics are its axes (an attribute up to opset 17, for most Reduce ops an
input from opset 18, for ReduceSum from opset 13), not its op type: a ReduceMean over the
last axis of a rank-4 map is a per-pixel mean over channels last, a ReduceL2 over axes
1 and 2 pools the rows and columns of a channels-last map (ConvNeXt-V2's GRN), the same
ops over axis 1 or axes 2 and 3 read an NCHW map. The graph builder asks these questions
of every Reduce node (planner.front.graph_build).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

# axes of a rank-4 map only a channels-last reading gives a part: its rows and columns
# together, or its channels
_CHANNELS_LAST_AXES = (frozenset({1, 2}), frozenset({3}))


def reduced_axes(attrs: Mapping[str, Any], inputs: Sequence[str],
                 constants: Mapping[str, np.ndarray], rank: int) -> frozenset[int] | None:
    """The axes (0 <= a < rank) a Reduce node folds; None where they are not known (an axes
    input computed at run time) or none are given (every axis, or none with
    noop_with_empty_axes: what the op does then is the caller's to decide)."""
    axes = attrs.get("axes")
    if axes is None and len(inputs) > 1 and inputs[1]:
        if inputs[1] not in constants:
            return None
        axes = constants[inputs[1]].reshape(-1).tolist()
    if axes is None or len(axes) == 0 or rank == 0:
        return None
    return frozenset(int(a) % rank for a in axes)


def channels_last_reduction(axes: frozenset[int] | None, rank: int) -> bool:
    """Whether a reduction over `axes` of a rank-`rank` map reads it as channels last
    [N, H, W, C]: over axes 1 and 2 together (rows and columns: a pool) or axis 3 alone
    (channels: a per-pixel statistic). Over axis 1 alone or axes 2 and 3 it reads an NCHW
    map; other axes (one row axis, all of them, axes not known) say nothing of a
    channels-last reading, and are not taken for one."""
    return rank == 4 and axes in _CHANNELS_LAST_AXES
