"""Rule 4: single output (seed 000 ¶94-96)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from rules.base import GroupFacts, StructuralRule, Violation, rule


@rule("R04", "single_output", "The group has exactly one output")
@dataclass(frozen=True)
class SingleOutput(StructuralRule):
    """A group writes exactly one tensor back; shape derivation runs backward from it.

    Anti-pattern: a group whose results leave from two places.
    Best practice: end the group where its branches have joined.
    """

    final_only: ClassVar[bool] = True  # growing the group can still satisfy it

    enabled: bool = True

    def check(self, facts: GroupFacts) -> Violation | None:
        outs = facts.io.outputs
        if len(outs) > 1:
            return self.violation(f"{len(outs)} outputs leave the group ({', '.join(outs[:3])})",
                                  needed=len(outs), allowed=1)
        return None
