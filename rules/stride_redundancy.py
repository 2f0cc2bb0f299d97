"""Rule 19: stride redundancy."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

from fuseplan.planner.ir.ops import op_spec
from fuseplan.rules.base import GroupFacts, Rule, Violation, rule
from fuseplan.rules.encoding import Candidate, Encoding


@rule("R19", "stride_redundancy", "Sum of (kernel - stride) within a threshold")
@dataclass(frozen=True)
class StrideRedundancy(Rule):
    """Over the group's conv and pool layers, sum(k_x - s_x) and sum(k_y - s_y) <= threshold.

    Each layer whose kernel exceeds its stride widens the halo every tile re-reads and
    recomputes; the sum bounds how far halos pile up. ``applies_to: recompute`` (the
    default) binds only groups that recompute halos: a group whose tile holds whole maps,
    or whose tiles reuse their halos, recomputes nothing and is exempt.
    ``applies_to: all`` (the stricter reading) binds every fused group. With
    ``exempt_whole_blocks`` a group that fuses a whole multi-branch block is exempt. A group
    run in pooling passes is checked as a whole (its layers, the passes' tile): a
    squeeze-excite block it holds whole exempts it, though no one pass holds the block.
    """

    enabled: bool = True
    threshold: int = field(default=4, metadata={"ge": 0})
    exempt_whole_blocks: bool = True
    applies_to: Literal["recompute", "all"] = "recompute"
    tile_trend: ClassVar[str] = "grow"  # with applies_to: recompute, whole maps are exempt
    in_passes: ClassVar[str] = "whole"  # a group holding a whole block is exempt as a whole

    @property
    def is_structural(self) -> bool:
        return self.applies_to == "all"

    def check(self, facts: GroupFacts) -> Violation | None:
        if self.applies_to == "recompute" and (facts.small or facts.halo_reuse):
            return None
        return self._stride_sum(facts)

    def encode(self, enc: Encoding, cand: Candidate) -> None:
        forbid = [cand.selected.Not(), enc.rule_lits[self.key].Not()]
        facts = cand.facts_any_tile
        if cand.fixed is not None:  # a pinned tile: the check says it all
            if self.check(facts) is not None:
                enc.model.add_bool_or(forbid)
            return
        if self._stride_sum(facts) is None:  # tile variables recompute halos, never reuse
            return
        if self.applies_to == "recompute":
            forbid.append(cand.small)  # whole maps recompute nothing
        enc.model.add_bool_or(forbid)

    def _stride_sum(self, facts: GroupFacts) -> Violation | None:
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
