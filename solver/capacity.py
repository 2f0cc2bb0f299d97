"""The chip's capacities every group must meet, and the room a group leaves for the next
group's weights: bound formulas over a group's facts (rules.facts), the same CP-SAT states
(rules.encoding), asked by every tile search and by `explain`."""

from __future__ import annotations

from math import ceil

from fuseplan.planner.core.units import vs_bytes
from fuseplan.planner.cost.model import group_ring
from fuseplan.planner.geometry.bands import band_overflows, cluster_loads, cores_per_band
from fuseplan.rules.base import GroupFacts, Violation


def prefetch_room(facts: GroupFacts) -> int:
    """Bytes left for the next group's weights while this group runs (bounds, as CP-SAT).

    Weights go to WRAM beside this group's resident weights (or its streamed chunks) on
    chips with one; else to SRAM beside the live tiles (with their second buffer, or the
    exact halo-reuse peak) and, on single-memory chips, this group's weights on chip.
    """
    chip = facts.chip
    weights = facts.onchip_weight_bytes
    # its streamed weights run through all the SRAM its maps leave; or its weights are
    # shares spread over the clusters, beside which a copy of the next group's is not priced
    if _ring(facts) or facts.mode.cluster_split:
        return 0
    if chip.wram is not None and facts.tile.bands > 1:  # each band's cores hold a copy
        return (chip.wram.bytes - ceil(weights / cores_per_band(chip, facts.tile.bands))) \
            * chip.cores_per_cluster
    if chip.wram is not None:
        return chip.wram.bytes * chip.cores_per_cluster - weights
    if facts.tile.bands > 1:
        return (chip.sram.bytes - max(cluster_loads(chip, facts.band_peak_bytes))
                - (weights if chip.unified else 0))
    if facts.halo_reuse:
        live = facts.reuse_peak_bytes + (facts.stage_peak_bytes if chip.unified else 0)
    else:
        live = facts.sram_live_peak_bytes
        if facts.double_buffered:
            live += facts.in_bytes
    resident = facts.weight_bytes if facts.weights_resident else 0
    return chip.sram.bytes - live - (resident if chip.unified else 0)


def _ring(facts: GroupFacts) -> int:
    """The ring a group's streamed weights run through (planner.cost.model.weight_ring), for
    a group run tiles outer (its other modes hold their weights their own way)."""
    m = facts.mode
    if m.pinned or not facts.chip.unified:
        return 0
    return group_ring(facts.graph, facts.io, facts.tile, facts.chip, m.weights_resident,
                      m.halo_reuse, m.weights_outer)


def physical_violations(facts: GroupFacts) -> list[Violation]:
    """Capacity the chip enforces on every group, fused or not (bound formulas, as CP-SAT)."""
    chip = facts.chip
    out = []
    if facts.double_buffered and _ring(facts):  # the ring takes all of SRAM
        return [Violation("HW", "sram", "a second input buffer does not fit beside the ring "
                          "its streamed weights run through", chip.sram.bytes + facts.in_bytes,
                          chip.sram.bytes)]
    if facts.tile.bands > 1:  # each band on its own cores and its cluster's SRAM
        return [Violation("HW", level, f"each {'cluster' if level == 'sram' else 'core'} "
                          f"needs {vs_bytes(need, cap)[0]} of {level.upper()} for its bands, "
                          f"has {vs_bytes(need, cap)[1]}",
                          need, cap)
                for level, need, cap in band_overflows(chip, facts.band_peak_bytes,
                                                       facts.onchip_weight_bytes)]
    if facts.halo_reuse:  # exact: borders kept for later tiles plus each tile's new parts
        live = facts.reuse_peak_bytes
        sram_live = live + (facts.stage_peak_bytes if chip.unified else 0)
    else:
        live, sram_live = facts.live_peak_bytes, facts.sram_live_peak_bytes
        if facts.double_buffered:  # room to prefetch the next tile's inputs
            live += facts.in_bytes
            sram_live += facts.in_bytes
    resident = facts.weight_bytes if facts.weights_resident else 0
    sram_need = sram_live + (resident if chip.unified else 0)
    if sram_need > chip.sram.bytes:
        need_s, has_s = vs_bytes(sram_need, chip.sram.bytes)
        out.append(Violation("HW", "sram", f"tile needs {need_s} of SRAM, has "
                             f"{has_s}", sram_need, chip.sram.bytes))
    if chip.nram is not None:
        share = ceil(live / chip.cores_per_cluster)
        if share > chip.nram.bytes:
            need_s, has_s = vs_bytes(share, chip.nram.bytes)
            out.append(Violation("HW", "nram", f"each core needs {need_s} of NRAM, has "
                                 f"{has_s}", share, chip.nram.bytes))
    weights = facts.onchip_weight_bytes + facts.wram_key_bytes
    if facts.mode.keys_in_wram and chip.wram is None:
        out.append(Violation("HW", "wram", "the chip has no WRAM to keep the keys in",
                             facts.wram_key_bytes, 0))
    if chip.wram is not None and weights:
        share = ceil(weights / chip.cores_per_cluster)
        what = "resident weights" if facts.weights_resident else "streamed weight chunks"
        if facts.wram_key_bytes:
            what += " and kept keys"
        if share > chip.wram.bytes:
            need_s, has_s = vs_bytes(share, chip.wram.bytes)
            out.append(Violation("HW", "wram", f"each core needs {need_s} of WRAM for {what}, "
                                 f"has {has_s}", share, chip.wram.bytes))
    return out
