"""Rule 12: the tile's inputs and outputs fit SRAM."""

from __future__ import annotations

from dataclasses import dataclass

from fuseplan.planner.core.units import vs_bytes
from fuseplan.rules.base import GroupFacts, Rule, Violation, rule
from fuseplan.rules.encoding import Candidate, Encoding


@rule("R12", "sram_in_out", "In and out fit SRAM")
@dataclass(frozen=True)
class SramInOut(Rule):
    """in + out < S when input and output cannot share space; max(in, out) < S when they can.

    With ``share_buffers`` a tensor's space is reused once its last consumer ran (the peak of
    live tensors must stay below S); without, every tensor of the tile is held at once.
    Weights count too on single-memory chips: all of them when resident, each step's
    streamed chunks when not.
    """

    enabled: bool = True
    share_buffers: bool = True

    def check(self, facts: GroupFacts) -> Violation | None:
        if self.share_buffers:
            need = facts.sram_live_peak_bytes
        else:
            need = facts.all_fmap_bytes + (facts.stage_peak_bytes if facts.chip.unified else 0)
        if facts.chip.unified and facts.weights_resident:
            need += facts.weight_bytes
        cap = facts.chip.sram.bytes
        if need >= cap:
            need_s, has_s = vs_bytes(need, cap)
            return self.violation(f"tile needs {need_s}, not < SRAM {has_s}", needed=need,
                                  allowed=cap - 1)
        return None

    def encode(self, enc: Encoding, cand: Candidate) -> None:
        cap = enc.chip.sram.bytes - 1
        unified = enc.chip.unified
        weights = enc.weight_bytes(cand) * cand.resident if unified else 0
        staged = enc.staged_steps(cand) if unified else ()
        if self.share_buffers:
            steps = [step + (staged[i] if staged else 0) * (1 - cand.resident)
                     for i, step in enumerate(enc.live_steps_bytes(cand))]
        else:
            steps = [enc.all_fmap_bytes(cand) + max(staged, default=0) * (1 - cand.resident)]
        for step in steps:
            enc.enforce(enc.model.add(step + weights <= cap), cand, enc.rule_lits[self.key])
