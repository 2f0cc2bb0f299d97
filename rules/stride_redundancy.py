"""Rule 19: stride redundancy (seed 000 ¶143-146)."""

from __future__ import annotations

from dataclasses import dataclass, field

from planner.ir.ops import op_spec
from rules.base import GroupFacts, StructuralRule, Violation, rule


@rule("R19", "stride_redundancy", "Sum of (kernel - stride) within a threshold")
@dataclass(frozen=True)
class StrideRedundancy(StructuralRule):
    """Over the group's conv and pool layers, sum(k_x - s_x) and sum(k_y - s_y) <= threshold.

    Each layer whose kernel exceeds its stride widens the halo every tile re-reads; the sum
    bounds how far halos pile up. With ``exempt_whole_blocks`` a group that fuses a whole
    multi-branch block is exempt.
    """

    enabled: bool = True
    threshold: int = field(default=4, metadata={"ge": 0})
    exempt_whole_blocks: bool = True

    def check(self, facts: GroupFacts) -> Violation | None:
        ky = kx = 0
        for lay in facts.layers:
            if op_spec(lay.op).sliding_window:
                k_y, s_y, k_x, s_x = lay.kernel_hw
                ky += max(0, k_y - s_y)
                kx += max(0, k_x - s_x)
        worst = max(ky, kx)
        if worst <= self.threshold:
            return None
        if self.exempt_whole_blocks:
            members = set(facts.io.layers)
            if any(set(b.layers) <= members for b in facts.graph.blocks):
                return None
        return self.violation(f"stride redundancy {worst} > {self.threshold}", worst,
                              self.threshold)
