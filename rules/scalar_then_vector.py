"""Rule 7: a scalar layer followed by a vector layer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from fuseplan.planner.ir.graph import OpClass
from fuseplan.rules.base import GroupFacts, StructuralRule, Violation, adjacent_pairs, rule


@rule("R07", "scalar_then_vector", "Contains scalar -> vector")
@dataclass(frozen=True)
class ScalarThenVector(StructuralRule):
    """The group contains an adjacent scalar layer (add, sub, mul) followed by a vector layer.

    Off by default: a policy for chips that chain the scalar and vector units.
    """

    final_only: ClassVar[bool] = True  # growing the group can still satisfy it

    enabled: bool = False

    def check(self, facts: GroupFacts) -> Violation | None:
        for a, b in adjacent_pairs(facts):
            if a.op_class is OpClass.SCALAR and b.op_class is OpClass.VECTOR:
                return None
        return self.violation("no scalar layer directly followed by a vector layer")
