"""Rules 1 and 2: where the greedy planner starts a group and which way it grows it.

They steer the greedy planner's search order (build one group at a time, checking
the rules after each layer added), not which groups are valid, so they
never reject a group and add nothing to the CP-SAT model, which searches every
grouping at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from fuseplan.rules.base import GroupFacts, Rule, Violation, rule
from fuseplan.rules.encoding import Candidate, Encoding


@rule("R01", "start_rule", "Start layer of a new group")
@dataclass(frozen=True)
class StartRule(Rule):
    """A new group starts at the first unfused layer, or at the first unfused conv/pool layer.

    Anti-pattern: starting a group on a stray activation that then cannot grow.
    Best practice: ``first_main`` starts on a main layer so the group has one from the start.
    """

    enabled: bool = True
    start: Literal["first_unfused", "first_main"] = "first_unfused"

    def check(self, facts: GroupFacts) -> Violation | None:
        return None

    def encode(self, enc: Encoding, cand: Candidate) -> None:
        return None


@rule("R02", "direction", "Direction in which a group grows")
@dataclass(frozen=True)
class Direction(Rule):
    """Grow a group backward (toward the output), or first pull in unfused layers before it.

    ``backward`` adds the next layers after the start layer; ``forward_first`` first adds
    unfused layers preceding the start layer, then grows backward.
    """

    enabled: bool = True
    direction: Literal["backward", "forward_first"] = "backward"

    def check(self, facts: GroupFacts) -> Violation | None:
        return None

    def encode(self, enc: Encoding, cand: Candidate) -> None:
        return None
