"""Rule 10: the group's weights fit WRAM (seed 000 ¶107-111)."""

from __future__ import annotations

from dataclasses import dataclass
from math import ceil

from rules.base import GroupFacts, Rule, Violation, rule
from rules.encoding import Candidate, Encoding


@rule("R10", "weights_fit_wram", "Weights fit WRAM (split along C_out)")
@dataclass(frozen=True)
class WeightsFitWram(Rule):
    """A fused group keeps all its weights resident in WRAM: sum_j W_j / n <= W.

    With ``split_cout`` the weights are split along C_out over the n cores of a cluster,
    so each WRAM holds its share. On single-memory chips weights count against SRAM
    (rule 12) instead.
    """

    enabled: bool = True
    split_cout: bool = True

    def _share(self, facts_weight: int, cores: int) -> int:
        return ceil(facts_weight / cores) if self.split_cout else facts_weight

    def check(self, facts: GroupFacts) -> Violation | None:
        wram = facts.chip.wram
        if wram is None:
            return None
        share = self._share(facts.weight_bytes, facts.chip.cores_per_cluster)
        if not facts.weights_resident:
            return self.violation("weights are streamed, not resident in WRAM")
        if share > wram.bytes:
            return self.violation(f"weights per core {share} B > WRAM {wram.bytes} B",
                                  needed=share, allowed=wram.bytes)
        return None

    def encode(self, enc: Encoding, cand: Candidate) -> None:
        lit = enc.rule_lits[self.key]
        wram = enc.chip.wram
        if wram is None:
            return
        share = self._share(enc.weight_bytes(cand), enc.chip.cores_per_cluster)
        if share > wram.bytes:
            enc.model.add_bool_or([cand.selected.Not(), lit.Not()])
        else:
            enc.model.add_implication(cand.selected, cand.resident).only_enforce_if(lit)
