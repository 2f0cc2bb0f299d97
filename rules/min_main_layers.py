"""Rule 5: at least k main layers."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from fuseplan.planner.ir.ops import OpClass
from fuseplan.rules.base import GroupFacts, StructuralRule, Violation, rule


@rule("R05", "min_main_layers", "At least k main layers")
@dataclass(frozen=True)
class MinMainLayers(StructuralRule):
    """A fused group holds at least ``k`` main layers (conv, pool, matmul: the I/O-heavy ones).

    Anti-pattern: fusing a single conv with its activation and calling it a fusion group.
    Best practice: fuse where two I/O-heavy layers share an intermediate map.
    ``movement_groups``: a group of movement layers only (Reshape, Transpose, Split,
    Squeeze, Concat, ...: a transformer's qkv split into heads) computes nothing to call a
    fusion; it may still run its layers as one pass over the data, so that each
    intermediate arrangement stays on chip, and this rule lets it.
    """

    final_only: ClassVar[bool] = True  # growing the group can still satisfy it

    enabled: bool = True
    k: int = field(default=2, metadata={"ge": 1})
    movement_groups: bool = True

    def check(self, facts: GroupFacts) -> Violation | None:
        if self.movement_groups and all(lay.op_class is OpClass.MOVEMENT
                                        for lay in facts.layers):
            return None
        mains = sum(1 for lay in facts.layers if lay.is_main)
        if mains < self.k:
            return self.violation(f"{mains} main layers < {self.k}", needed=self.k,
                                  allowed=mains)
        return None
