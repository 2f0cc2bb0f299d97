"""Rules 8 and 9: conv weights must be constants owned by one conv."""

from __future__ import annotations

from dataclasses import dataclass

from fuseplan.planner.ir.ops import op_spec
from fuseplan.rules.base import GroupFacts, StructuralRule, Violation, rule


@rule("R08", "conv_weights_not_computed", "Conv weights are not a layer's output")
@dataclass(frozen=True)
class ConvWeightsNotComputed(StructuralRule):
    """A conv whose weights are computed by a layer cannot be fused.

    Anti-pattern: fusing a dynamic-filter conv whose kernel arrives at run time.
    """

    enabled: bool = True

    def check(self, facts: GroupFacts) -> Violation | None:
        for lay in facts.layers:
            if op_spec(lay.op).is_convolution and len(lay.inputs) > 1 \
                    and lay.inputs[1] in lay.fmap_inputs:
                return self.violation(f"'{lay.name}' takes its weights from a layer's output")
        return None


@rule("R09", "conv_weights_not_shared", "Conv weights are not shared")
@dataclass(frozen=True)
class ConvWeightsNotShared(StructuralRule):
    """A conv whose weight tensor is also used by another layer cannot be fused."""

    enabled: bool = True

    def check(self, facts: GroupFacts) -> Violation | None:
        users = facts.graph.weight_users
        for lay in facts.layers:
            if op_spec(lay.op).is_convolution and len(lay.inputs) > 1 \
                    and users.get(lay.inputs[1], 0) > 1:
                return self.violation(f"'{lay.name}' shares its weights with another layer",
                                      needed=users[lay.inputs[1]], allowed=1)
        return None
