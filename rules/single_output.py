"""Rule 4: single output."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from fuseplan.planner.geometry.regions import tiled_like_anchor
from fuseplan.rules.base import GroupFacts, StructuralRule, Violation, rule


@rule("R04", "single_output", "The group has exactly one output")
@dataclass(frozen=True)
class SingleOutput(StructuralRule):
    """A group writes exactly one tensor back; shape derivation runs backward from it.

    Anti-pattern: a group whose results leave from two places.
    Best practice: end the group where its branches have joined. A group that ends in a
    global pooling (or a reduction over rows and columns) of the tensor it tiles may also
    write that pooled result: it is accumulated tile by tile, and shape derivation still
    runs backward from the one tiled tensor (the squeeze-excite pattern).
    ``tiled_outputs``: outputs every tile cuts as it cuts the one it derives its shapes
    from (the same batch, rows and columns, read by the group's layers only element for
    element if at all: q, k and v of one projection split into heads, a Split's parts, a
    residual sum the next norm reads; planner.geometry.regions.tiled_like_anchor) count as
    that one output. Each tile stores its own box of each, so shape derivation still runs
    backward from one tile box; without it a projection's q, k and v leave it as three
    groups that read and write their whole maps.
    """

    final_only: ClassVar[bool] = True  # growing the group can still satisfy it

    enabled: bool = True
    tiled_outputs: bool = True

    def check(self, facts: GroupFacts) -> Violation | None:
        outs = facts.io.stored_per_tile
        if self.tiled_outputs:
            outs = tuple(t for t in outs if not tiled_like_anchor(facts.graph, facts.io, t))
        if len(outs) > 1:
            return self.violation(f"{len(outs)} outputs leave the group ({', '.join(outs[:3])})",
                                  needed=len(outs), allowed=1)
        return None
