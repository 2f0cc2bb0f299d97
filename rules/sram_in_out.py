"""Rule 12: the tile's inputs and outputs fit SRAM (seed 000 ¶117-121)."""

from __future__ import annotations

from dataclasses import dataclass

from rules.base import GroupFacts, Rule, Violation, rule
from rules.encoding import Candidate, Encoding


@rule("R12", "sram_in_out", "In and out fit SRAM")
@dataclass(frozen=True)
class SramInOut(Rule):
    """in + out < S when input and output cannot share space; max(in, out) < S when they can.

    With ``share_buffers`` a tensor's space is reused once its last consumer ran (the peak of
    live tensors must stay below S); without, every tensor of the tile is held at once.
    Resident weights count too on single-memory chips.
    """

    enabled: bool = True
    share_buffers: bool = True

    def check(self, facts: GroupFacts) -> Violation | None:
        need = facts.live_peak_bytes if self.share_buffers else facts.all_fmap_bytes
        if facts.chip.unified and facts.weights_resident:
            need += facts.weight_bytes
        cap = facts.chip.sram.bytes
        if need >= cap:
            return self.violation(f"tile needs {need} B, not < SRAM {cap} B", needed=need,
                                  allowed=cap - 1)
        return None

    def encode(self, enc: Encoding, cand: Candidate) -> None:
        cap = enc.chip.sram.bytes - 1
        weights = enc.weight_bytes(cand) * cand.resident if enc.chip.unified else 0
        steps = enc.live_steps_bytes(cand) if self.share_buffers else [enc.all_fmap_bytes(cand)]
        for step in steps:
            enc.enforce(enc.model.add(step + weights <= cap), cand, enc.rule_lits[self.key])
