"""Rule 3: blocks first."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from fuseplan.planner.geometry.regions import accumulated_input
from fuseplan.planner.ir.graph import Block, Graph
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
    ``branch_heads``: a group may also end inside a block it enters: layers before the
    block with the first layers of its branches, nothing after it (a projection with its
    q, k and v split into heads, the attention they join at left to the next group). It
    takes no layer past the block's exit, which is what the rule guards against; its
    several outputs are single_output's to judge.
    ``branch_tails``: the mirror, a group may start inside a block it leaves: the last
    layers of its branches and its exit, then layers after the block, nothing before it
    (a transformer's residual add with the norm and MLP after it: at long contexts the
    attention runs alone, and without tails the add is a group of its own writing and
    reading a whole map, as rule 5 refuses a projection with its add). ``tail_mains``: the
    most main layers of the block such a tail holds. 1 (the default) takes the block's last
    projection too (its head merge and output projection with the add), so an attention
    group may end at the attention and the next take the projection, the add and the MLP;
    0 takes only the add and the layers after the last main layer: fewer groups for the
    searches to price, more bytes (the 2026 zoo's segformer block 8.16 MiB with 0, 5.79
    with 1; its detector head plans in 39 s with 0, 84 s with 1, at the same bytes).
    """

    final_only: ClassVar[bool] = True  # growing the group can still satisfy it

    enabled: bool = True
    branch_heads: bool = True
    branch_tails: bool = True
    tail_mains: int = field(default=1, metadata={"ge": 0})

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
            if inside and inside != layers and not core <= set(block.layers) \
                    and not (self.branch_heads and _heads_only(graph, core, block)) \
                    and not (self.branch_tails
                             and _tails_only(graph, core, block, self.tail_mains)):
                return self.violation(
                    f"cuts block {block.id} (exit '{block.exit}'): holds {len(inside)} of its "
                    f"{len(block.layers)} layers and layers outside it",
                    needed=len(inside), allowed=len(block.layers))
        return None


def _heads_only(graph: Graph, core: set[str], block: Block) -> bool:
    """Whether every layer of `core` outside the block comes before all of its layers: the
    group enters the block and ends in it."""
    first = min(graph.index(n) for n in block.layers)
    return all(graph.index(n) < first for n in core - set(block.layers))


def _tails_only(graph: Graph, core: set[str], block: Block, mains: int) -> bool:
    """Whether every layer of `core` outside the block comes after all of its layers and it
    holds at most `mains` main layers of the block: the group starts in the block, past
    all but its last `mains` main layers, and leaves it."""
    last = max(graph.index(n) for n in block.layers)
    inside = core & set(block.layers)
    return sum(graph.layer(n).is_main for n in inside) <= mains \
        and all(graph.index(n) > last for n in core - set(block.layers))
