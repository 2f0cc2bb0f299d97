"""Rules 13-16 and 18: buffer inequalities of small-map mode.

In small-map mode a tile holds whole feature maps (possibly several images), so the
chip double-buffers: the next map is loaded while the current one is processed.
W_i is one core's share of the group's weights on chip (all of them when resident, the
largest double-buffered pair of chunks when streamed: planner.cost.weight_stream), IN the
tile's input bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from math import ceil
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ortools.sat.python.cp_model import IntVar

from fuseplan.planner.core.units import vs_bytes
from fuseplan.rules.base import GroupFacts, Rule, Violation, rule
from fuseplan.rules.encoding import Candidate, Encoding, Expr


def _w_share(weight_bytes: int, cores: int) -> int:
    return ceil(weight_bytes / cores)


def _w_expr(enc: Encoding, cand: Candidate) -> Expr:
    """A core's share of the weights on chip, resident or streamed (linear in resident)."""
    cores = enc.chip.cores_per_cluster
    resident = _w_share(enc.weight_bytes(cand), cores)
    streamed = _w_share(max(enc.staged_steps(cand), default=0), cores)
    return streamed + (resident - streamed) * cand.resident


@rule("R13", "small_double_buffer", "Small mode: W_i + IN1 + IN2 <= S")
@dataclass(frozen=True)
class SmallDoubleBuffer(Rule):
    """Small mode: a core's weights, the on-chip map and a second buffer for the next map fit S."""

    enabled: bool = True

    def check(self, facts: GroupFacts) -> Violation | None:
        if not facts.small:
            return None
        need = _w_share(facts.onchip_weight_bytes, facts.chip.cores_per_cluster) \
            + 2 * facts.in_bytes
        cap = facts.chip.sram.bytes
        if need > cap:
            need_s, has_s = vs_bytes(need, cap)
            return self.violation(f"W_i + IN1 + IN2 = {need_s} > SRAM {has_s}", need, cap)
        return None

    def encode(self, enc: Encoding, cand: Candidate) -> None:
        w = _w_expr(enc, cand)
        enc.enforce(enc.model.add(w + 2 * enc.in_bytes(cand) <= enc.chip.sram.bytes), cand,
                    enc.rule_lits[self.key], cand.small)


@rule("R14", "small_submap_buffer", "Small mode: subIN_i + W_i + IN2 <= S")
@dataclass(frozen=True)
class SmallSubmapBuffer(Rule):
    """Small mode: a core's sub-map and weights plus the next on-chip map fit S."""

    enabled: bool = True

    def check(self, facts: GroupFacts) -> Violation | None:
        return _check_share(self, facts, facts.in_bytes, "subIN_i + W_i + IN2")

    def encode(self, enc: Encoding, cand: Candidate) -> None:
        _encode_share(enc, cand, enc.rule_lits[self.key], enc.in_bytes(cand), "in")


@rule("R15", "small_subout_buffer", "Small mode: subOUT_i + W_i+1 + IN2 <= S")
@dataclass(frozen=True)
class SmallSuboutBuffer(Rule):
    """Small mode: a core's output sub-map, the next weights and the next map fit S."""

    enabled: bool = True

    def check(self, facts: GroupFacts) -> Violation | None:
        return _check_share(self, facts, facts.out_bytes, "subOUT_i + W_i+1 + IN2")

    def encode(self, enc: Encoding, cand: Candidate) -> None:
        _encode_share(enc, cand, enc.rule_lits[self.key], enc.out_bytes(cand), "out")


def _check_share(rule: Rule, facts: GroupFacts, part: int, label: str) -> Violation | None:
    """Small mode: ceil(part / cores) + W_i + IN <= S (rules 14 and 15)."""
    if not facts.small:
        return None
    cores = facts.chip.cores_per_cluster
    need = ceil(part / cores) + _w_share(facts.onchip_weight_bytes, cores) + facts.in_bytes
    cap = facts.chip.sram.bytes
    if need > cap:
        need_s, has_s = vs_bytes(need, cap)
        return rule.violation(f"{label} = {need_s} > SRAM {has_s}", need, cap)
    return None


def _encode_share(enc: Encoding, cand: Candidate, lit: IntVar, part: Expr, which: str) -> None:
    """ceil(part / cores) + W_i + IN <= S, with the ceiling as an existential integer."""
    m = enc.model
    cores = enc.chip.cores_per_cluster
    sub = m.new_int_var(0, enc.chip.sram.bytes, f"sub_{which}_{cand.index}")
    enc.enforce(m.add(cores * sub >= part), cand, lit, cand.small)
    w = _w_expr(enc, cand)
    enc.enforce(m.add(sub + w + enc.in_bytes(cand) <= enc.chip.sram.bytes), cand, lit, cand.small)


@rule("R16", "wram_double_buffer", "Small mode: W_i + W_i+1 <= WRAM")
@dataclass(frozen=True)
class WramDoubleBuffer(Rule):
    """Small mode with several images in the on-chip map: WRAM holds the weights of two
    consecutive sub-maps, for pipelining.

    The rule is meant for sub-maps that hold several feature maps, and its remedy is
    fewer maps on chip: with one image (tile n = 1) nothing pipelines from one image's
    sub-map to the next, and rule 10 alone bounds the weights.
    """

    enabled: bool = True

    def check(self, facts: GroupFacts) -> Violation | None:
        wram = facts.chip.wram
        if wram is None or not facts.small or facts.tile.n < 2:
            return None
        cores = facts.chip.cores_per_cluster
        # resident: the weights of two sub-maps; streamed: the pair of chunks in flight
        need = 2 * _w_share(facts.weight_bytes, cores) if facts.weights_resident \
            else _w_share(facts.stage_peak_bytes, cores)
        if need > wram.bytes:
            need_s, has_s = vs_bytes(need, wram.bytes)
            return self.violation(f"W_i + W_i+1 = {need_s} > WRAM {has_s}", need,
                                  wram.bytes)
        return None

    def encode(self, enc: Encoding, cand: Candidate) -> None:
        wram = enc.chip.wram
        if wram is None or (isinstance(cand.tn, int) and cand.tn < 2):
            return
        cores = enc.chip.cores_per_cluster
        forbid = [cand.selected.Not(), enc.rule_lits[self.key].Not(), cand.small.Not()]
        if not isinstance(cand.tn, int):  # binds only with two images or more on chip
            several = enc.model.new_bool_var(f"several_maps_{cand.index}")
            enc.model.add(cand.tn >= 2).only_enforce_if(several)
            enc.model.add(cand.tn <= 1).only_enforce_if(several.Not())
            forbid.append(several.Not())
        if 2 * _w_share(enc.weight_bytes(cand), cores) > wram.bytes:
            enc.model.add_bool_or([*forbid, cand.resident.Not()])
        if _w_share(max(enc.staged_steps(cand), default=0), cores) > wram.bytes:
            enc.model.add_bool_or([*forbid, cand.resident])


@rule("R18", "max_maps", "Small mode: at most k feature maps per on-chip map")
@dataclass(frozen=True)
class MaxMaps(Rule):
    """Small mode: an on-chip map holds at most ``k`` images of the batch."""

    enabled: bool = True
    k: int = field(default=4, metadata={"ge": 1})

    def check(self, facts: GroupFacts) -> Violation | None:
        if facts.small and facts.tile.n > self.k:
            return self.violation(f"{facts.tile.n} maps > {self.k}", facts.tile.n, self.k)
        return None

    def encode(self, enc: Encoding, cand: Candidate) -> None:
        lit = enc.rule_lits[self.key]
        if isinstance(cand.tn, int):
            if cand.tn > self.k:
                enc.model.add_bool_or([cand.selected.Not(), lit.Not(), cand.small.Not()])
            return
        enc.enforce(enc.model.add(cand.tn <= self.k), cand, lit, cand.small)
