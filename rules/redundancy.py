"""Rule 11: redundancy percentage of halo re-reads."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from fuseplan.rules.base import GroupFacts, Rule, Violation, rule
from fuseplan.rules.encoding import Candidate, Encoding


@rule("R11", "redundancy", "Halo re-reads within a percentage")
@dataclass(frozen=True)
class Redundancy(Rule):
    """(bytes loaded incl. halo re-reads - bytes read once) / bytes read once <= threshold.

    Not applied in small-map mode, where nothing is re-read. Typical thresholds are 50, 75,
    100 (the default), 125 or 150 %. The keys and values a fused attention streams are not
    halos: every tile of query rows reads them whole by design (planner.geometry.attention).
    """

    tile_trend: ClassVar[str] = "grow"  # taller tiles re-read fewer halo rows

    enabled: bool = True
    threshold_pct: int = field(default=100, metadata={"ge": 0})

    def check(self, facts: GroupFacts) -> Violation | None:
        if facts.small:
            return None
        pct = facts.redundancy_pct()
        if pct > self.threshold_pct:
            return self.violation(f"halo re-reads {pct:.0f}% > {self.threshold_pct}%",
                                  needed=round(pct, 2), allowed=self.threshold_pct)
        return None

    def encode(self, enc: Encoding, cand: Candidate) -> None:
        if isinstance(cand.th, int):
            return
        haloed = cand.facts_any_tile.haloed_inputs  # not the keys attention streams
        once = sum(_once(enc, cand, t) for t in haloed)
        loaded = sum(enc.read_bytes(cand, t) for t in haloed)
        limit = (100 + self.threshold_pct) * once
        enc.enforce(enc.model.add(100 * loaded <= limit), cand, enc.rule_lits[self.key],
                    cand.small.Not())


def _once(enc: Encoding, cand: Candidate, t: str) -> int:
    from fuseplan.planner.geometry.regions import box_elems

    return box_elems(enc.graph, t, cand.chains.full[t]) * enc.chip.dtype_bytes
