"""Rule 6: a main -> main -> non-main sequence."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from fuseplan.rules.base import GroupFacts, StructuralRule, Violation, adjacent_pairs, rule


@rule("R06", "main_main_nonmain", "Contains main -> main -> non-main")
@dataclass(frozen=True)
class MainMainNonMain(StructuralRule):
    """The group contains three adjacent layers main -> main -> non-main (maxpool->conv->relu).

    Off by default: it is a policy for chips whose pipelines want that pattern.
    """

    final_only: ClassVar[bool] = True  # growing the group can still satisfy it

    enabled: bool = False

    def check(self, facts: GroupFacts) -> Violation | None:
        pairs = list(adjacent_pairs(facts))
        for a, b in pairs:
            if a.is_main and b.is_main:
                if any(x.name == b.name and not c.is_main for x, c in pairs):
                    return None
        return self.violation("no main -> main -> non-main sequence of adjacent layers")
