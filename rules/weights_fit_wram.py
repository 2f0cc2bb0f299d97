"""Rule 10: the group's weights fit WRAM."""

from __future__ import annotations

from dataclasses import dataclass
from math import ceil

from fuseplan.planner.core.units import vs_bytes
from fuseplan.rules.base import GroupFacts, Rule, Violation, rule
from fuseplan.rules.encoding import Candidate, Encoding


@rule("R10", "weights_fit_wram", "Weights fit WRAM (split along C_out)")
@dataclass(frozen=True)
class WeightsFitWram(Rule):
    """A fused group keeps all its weights resident in WRAM: sum_j W_j / n <= W.

    With ``split_cout`` the weights are split along C_out over the n cores of a cluster,
    so each WRAM holds its share. With ``streaming`` a fused group may instead stream its
    weights layer by layer when the pair of chunks in flight fits (as in rule 16:
    W_i + W_i+1 <= WRAM; planner.cost.weight_stream); off, every fused group keeps its
    weights resident. A group split over the clusters (planner.geometry.cluster_split)
    holds one cluster's share of its weights, and that share is what must fit. On
    single-memory chips weights count against SRAM (rule 12) instead.
    """

    enabled: bool = True
    split_cout: bool = True
    streaming: bool = True

    def _share(self, facts_weight: int, cores: int) -> int:
        return ceil(facts_weight / cores) if self.split_cout else facts_weight

    def check(self, facts: GroupFacts) -> Violation | None:
        wram = facts.chip.wram
        if wram is None:
            return None
        if not facts.weights_resident:
            if not self.streaming:
                return self.violation("weights are streamed, not resident in WRAM")
            pair = self._share(facts.stage_peak_bytes, facts.chip.cores_per_cluster)
            if pair > wram.bytes:
                need_s, has_s = vs_bytes(pair, wram.bytes)
                return self.violation(f"streamed chunks per core {need_s} > WRAM {has_s}",
                                      needed=pair, allowed=wram.bytes)
            return None
        share = self._share(facts.weight_bytes, facts.chip.cores_per_cluster)
        if share > wram.bytes:
            need_s, has_s = vs_bytes(share, wram.bytes)
            return self.violation(f"weights per core {need_s} > WRAM {has_s}",
                                  needed=share, allowed=wram.bytes)
        return None

    def encode(self, enc: Encoding, cand: Candidate) -> None:
        lit = enc.rule_lits[self.key]
        wram = enc.chip.wram
        if wram is None:
            return
        cores = enc.chip.cores_per_cluster
        forbid = [cand.selected.Not(), lit.Not()]
        if self._share(enc.weight_bytes(cand), cores) > wram.bytes:
            enc.model.add_bool_or([*forbid, cand.resident.Not()])  # resident: over WRAM
        pair = self._share(max(enc.staged_steps(cand), default=0), cores)
        if not self.streaming or pair > wram.bytes:
            enc.model.add_bool_or([*forbid, cand.resident])  # streamed: not allowed
