"""Rule 3: blocks first."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from fuseplan.planner.geometry.regions import accumulated_input
from fuseplan.rules.base import GroupFacts, StructuralRule, Violation, rule


@rule("R03", "blocks_first", "Fuse whole blocks or stay inside one")
@dataclass(frozen=True)
class BlocksFirst(StructuralRule):
    """A group holds whole blocks (ResNet bottlenecks, Inception modules) or stays inside one.

    Anti-pattern: a group that takes half of a block's branches plus layers after the block.
    Best practice: add or remove whole blocks; fall back to a block's branch layers only in
    groups that lie inside the block. Global poolings (reductions over rows and columns)
    do not count: one accumulated tile by tile may end a group, and the pooled value must
    be final before any pixel is scaled by it (squeeze-excite), so the group before it and
    the group after it each hold the rest of the block.
    """

    final_only: ClassVar[bool] = True  # growing the group can still satisfy it

    enabled: bool = True

    def check(self, facts: GroupFacts) -> Violation | None:
        graph = facts.graph
        members = set(facts.io.layers)
        # the pooling a group ends in is neither part of a block it cuts nor outside it
        core = members - {graph.producer[t] for t in facts.io.accumulated}
        # only blocks holding a member can be cut by the group (in block order: the first
        # cut is the one reported)
        for i in sorted({i for n in members for i in graph.layer_blocks.get(n, ())}):
            block = graph.blocks[i]
            layers = {n for n in block.layers
                      if accumulated_input(graph, graph.layer(n)) is None}
            inside = members & layers
            if inside and inside != layers and not core <= set(block.layers):
                return self.violation(
                    f"cuts block {block.id} (exit '{block.exit}'): holds {len(inside)} of its "
                    f"{len(block.layers)} layers and layers outside it",
                    needed=len(inside), allowed=len(block.layers))
        return None
