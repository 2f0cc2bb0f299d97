"""Rule 3: blocks first (seed 000 ¶91-93)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from rules.base import GroupFacts, StructuralRule, Violation, rule


@rule("R03", "blocks_first", "Fuse whole blocks or stay inside one")
@dataclass(frozen=True)
class BlocksFirst(StructuralRule):
    """A group holds whole blocks (ResNet bottlenecks, Inception modules) or stays inside one.

    Anti-pattern: a group that takes half of a block's branches plus layers after the block.
    Best practice: add or remove whole blocks; fall back to a block's branch layers only in
    groups that lie inside the block.
    """

    final_only: ClassVar[bool] = True  # growing the group can still satisfy it

    enabled: bool = True

    def check(self, facts: GroupFacts) -> Violation | None:
        members = set(facts.io.layers)
        for block in facts.graph.blocks:
            inside = members & set(block.layers)
            if inside and inside != set(block.layers) and not members <= set(block.layers):
                return self.violation(
                    f"cuts block {block.id} (exit '{block.exit}'): holds {len(inside)} of its "
                    f"{len(block.layers)} layers and layers outside it",
                    needed=len(inside), allowed=len(block.layers))
        return None
