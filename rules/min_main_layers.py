"""Rule 5: at least k main layers."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from fuseplan.planner.ir.graph import Graph, Layer, MapKind
from fuseplan.planner.ir.ops import OpClass
from fuseplan.rules.base import GroupFacts, StructuralRule, Violation, rule


def per_token(graph: Graph, lay: Layer) -> bool:
    """Whether a layer computes each token of its output from the same token of its inputs
    alone: its outputs are token sequences (tokens, heads; planner.ir.layout) and every
    feature-map input maps its rows (the tokens) one to one. A Linear layer, the steps of a
    normalisation written out op by op (Pow, a ReduceMean over the channels, Add, Sqrt,
    Div, Mul), a rotary embedding (Slice, Neg and Concat along the head width, Mul, Add),
    a split into heads are; an attention's scores (every key for each query), a Gather of
    rows by index, a conv's window are not."""
    outs = [t for t in lay.outputs if t and t in graph.shapes]
    if not outs or not lay.row_maps:
        return False
    if not all(graph.layout(t).token_like for t in (*outs, *lay.fmap_inputs)):
        return False
    return all(m.kind is MapKind.IDENTITY for m in lay.row_maps)


@rule("R05", "min_main_layers", "At least k main layers")
@dataclass(frozen=True)
class MinMainLayers(StructuralRule):
    """A fused group holds at least ``k`` main layers (conv, pool, matmul: the I/O-heavy ones).

    Anti-pattern: fusing a single conv with its activation and calling it a fusion group.
    Best practice: fuse where two I/O-heavy layers share an intermediate map.
    ``movement_groups``: a group of movement layers only (Reshape, Transpose, Split,
    Squeeze, Concat, ...: a transformer's qkv split into heads) computes nothing to call a
    fusion; it may still run its layers as one pass over the data, so that each
    intermediate arrangement stays on chip, and this rule lets it. So may one layer with
    movement layers around it (a projection with its split into heads, a head merge with
    the projection after it): the views fuse no second layer with the first, and a layer
    alone is always allowed.
    ``token_groups``: a group of per-token layers only (each token of every output computed
    from the same token of the inputs: element-wise steps, statistics over a token's
    channels, head splits), none of them main and at least one computing, is exempt too.
    A decoder writes its RMSNorm and its rotary embedding out op by op, eight and seven
    element-wise layers between its projections, each as heavy in I/O as the projection it
    feeds: as single layers each writes and reads its whole map, fused they hold one
    token's values on chip. Such a group fuses no I/O-heavy layer with its activation (the
    anti-pattern), so k still binds every group that holds a main layer.
    """

    final_only: ClassVar[bool] = True  # growing the group can still satisfy it

    enabled: bool = True
    k: int = field(default=2, metadata={"ge": 1})
    movement_groups: bool = True
    token_groups: bool = True

    def check(self, facts: GroupFacts) -> Violation | None:
        if self.movement_groups and sum(lay.op_class is not OpClass.MOVEMENT
                                        for lay in facts.layers) <= 1:
            return None
        # a group that only moves data is movement_groups' to allow or not; one with a main
        # layer is what k is about (a Linear with its activation is the anti-pattern)
        if (self.token_groups and not any(lay.is_main for lay in facts.layers)
                and any(lay.op_class is not OpClass.MOVEMENT for lay in facts.layers)
                and all(per_token(facts.graph, lay) for lay in facts.layers)):
            return None
        mains = sum(1 for lay in facts.layers if lay.is_main)
        if mains < self.k:
            return self.violation(f"{mains} main layers < {self.k}", needed=self.k,
                                  allowed=mains)
        return None

    def span_filter(self, graph: Graph) -> Callable[[int, Sequence[int]], list[bool]] | None:
        """check's answer for runs of the layer order from one start, from running counts
        of main, movement and per-token layers taken once (a chain of thousands of ReLUs has
        no group to try)."""
        lays = graph.layers
        counts = np.zeros((3, len(lays) + 1), np.int64)
        counts[:, 1:] = np.cumsum(np.array(
            [[lay.is_main for lay in lays], [lay.op_class is OpClass.MOVEMENT for lay in lays],
             [self.token_groups and per_token(graph, lay) for lay in lays]], np.int64), axis=1)

        def allowed(start: int, ends: Sequence[int]) -> list[bool]:
            stop = np.asarray(ends, np.int64) + 1
            main, moving, token = (counts[:, stop] - counts[:, start:start + 1])
            size = stop - start
            exempt = (self.movement_groups & (moving >= size - 1)) \
                | ((token == size) & (main == 0) & (moving < size))
            return list(exempt | (main >= self.k))

        return allowed
