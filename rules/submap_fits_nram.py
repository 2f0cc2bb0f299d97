"""Rule 17: each core's sub-map fits NRAM."""

from __future__ import annotations

from dataclasses import dataclass, field
from math import ceil

from fuseplan.planner.core.units import vs_bytes
from fuseplan.rules.base import GroupFacts, Rule, Violation, rule
from fuseplan.rules.encoding import Candidate, Encoding


@rule("R17", "submap_fits_nram", "Sub-map fits NRAM")
@dataclass(frozen=True)
class SubmapFitsNram(Rule):
    """Each core's share of the tile, times ``buffers`` for pipelining, fits its NRAM.

    The tile's live feature maps are shared out over the cores of a cluster. With
    ``buffers: 1`` (the default) the rule is that the sub-map fits NRAM (where SRAM is the
    cores' NRAM together, as on the default chip, it then holds whenever the tile fits
    SRAM); ``buffers: 2`` reserves a second sub-map per core, so that a core receives its
    next sub-map while it computes the current one. Split the tile finer until it fits.
    What a group holds on chip for all its tiles (a group run in pooling passes: its held
    inputs, held maps and tail results) stays in the cluster's SRAM, which the cores read
    it from, and takes no NRAM (NRAM holds only a core's sub-map of the tile).
    """

    enabled: bool = True
    buffers: int = field(default=1, metadata={"ge": 1})

    def check(self, facts: GroupFacts) -> Violation | None:
        nram = facts.chip.nram
        if nram is None:
            return None
        cores = facts.chip.cores_per_cluster
        need = self.buffers * ceil((facts.live_peak_bytes - facts.held_bytes) / cores)
        if need > nram.bytes:
            need_s, has_s = vs_bytes(need, nram.bytes)
            return self.violation(f"{self.buffers} x sub-map = {need_s} > NRAM {has_s}",
                                  need, nram.bytes)
        return None

    def encode(self, enc: Encoding, cand: Candidate) -> None:
        nram = enc.chip.nram
        if nram is None:
            return
        # buffers * ceil(step / cores) <= NRAM  <=>  step <= cores * floor(NRAM / buffers)
        cap = enc.chip.cores_per_cluster * (nram.bytes // self.buffers)
        for step in enc.live_steps_bytes(cand):
            enc.enforce(enc.model.add(step <= cap), cand, enc.rule_lits[self.key])
