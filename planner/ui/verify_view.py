"""`fuseplan verify`'s text answer (its --json is VerifyReport.to_json)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fuseplan.planner.core.units import fmt_bytes, vs_bytes
from fuseplan.planner.ui.cli_common import show

if TYPE_CHECKING:
    from fuseplan.planner.app.verify import VerifyReport

# tensors listed in the text answer (the JSON holds all)
SHOWN_TENSORS = 12


def _say(line: str) -> None:
    """A line as written (tensor names may hold brackets that are not markup), wrapped at
    the console's width between words."""
    show(line)


def _tensor_lines(report: VerifyReport) -> list[str]:
    """The worst tensors (by relative error) and the first that disagrees."""
    worst = sorted(report.tensors, key=lambda t: (t.ok, -t.max_rel_err))[:SHOWN_TENSORS]
    lines = [f"  {'ok ' if t.ok else 'BAD'} {t.tensor} (group {t.group}): max abs err "
             f"{t.max_abs_err:.3g}, {t.max_rel_err:.3g} of its scale {t.scale:.3g}"
             for t in worst]
    if len(report.tensors) > SHOWN_TENSORS:
        lines.append(f"  ... {len(report.tensors) - SHOWN_TENSORS} more tensors (--json for "
                     "all)")
    return lines


def _weights_lines(report: VerifyReport) -> list[str]:
    w = report.weights
    if w is None:
        return []
    lines = [f"weights: {w.used} ({w.reason})"]
    if w.uninformative:
        names = ", ".join(f"{u.tensor} {u.why}" for u in w.uninformative[:6])
        more = f" and {len(w.uninformative) - 6} more" if len(w.uninformative) > 6 else ""
        lines.append(f"uninformative references (could not show an error): {names}{more}")
    return lines


def print_verify(report: VerifyReport) -> None:
    """The verdict, tensor by tensor, counters, cycles and what disagrees first."""
    e = report.emulated
    _say(f"tensors through DRAM match {report.reference}: {report.outputs_match} "
         f"({report.checked_tensors} tensors, max abs err {report.max_abs_err:.3g}, "
         f"max rel err {report.max_rel_err:.3g}; each within 1e-3 of its own scale)")
    for line in _tensor_lines(report) + _weights_lines(report):
        _say(line)
    _say(f"predicted bytes == emulated bytes: {report.predicted_matches_emulated} "
         f"(DRAM {fmt_bytes(e.dram_bytes)}, weights {fmt_bytes(e.weight_read_bytes)}, SRAM "
         f"peak {fmt_bytes(e.sram_peak_bytes)})")
    cyc = report.cycles.to_json()
    _say(f"cycles: predicted {cyc['predicted']:,}, emulated {cyc['emulated']:,} "
         f"({cyc['difference']:+,}, {100 * cyc['relative']:+.2f}%): "
         f"{'agree' if report.cycles.ok else 'DISAGREE'} ({cyc['tolerance']})")
    _say(f"emulator {report.emulator_s:.3f} s, {report.reference} {report.reference_s:.3f} s")
    # FlashAttention's count, as the emulator measured it, where any of it crosses DRAM
    for a in (a for a in report.attention if a.analytic_bytes or a.alone):
        what = "=" if a.emulated_bytes == a.analytic_bytes else "!=" if a.alone else \
            "(with its group's other layers) against"
        _say(f"attention {a.layer} (group {a.group}): emulated {fmt_bytes(a.emulated_bytes)} "
             f"{what} {fmt_bytes(a.analytic_bytes)} analytic (q once, k and v "
             f"{a.kv_label or f'{a.passes}×'}, o once)")
    if report.first_mismatch_tensor is not None:
        _say(f"first tensor that disagrees: {report.first_output_mismatch}")
    if report.first_counter_mismatch:
        _say(f"first mismatch: {report.first_counter_mismatch}")
    if report.cycles.first_off:
        _say(f"cycles disagree: {report.cycles.first_off}")
    if report.first_misstatement:
        _say(f"the plan file states a wrong number: {report.first_misstatement}")
    for v in report.capacity_violations:
        need, has = vs_bytes(v.needed_bytes, v.capacity_bytes)
        _say(f"capacity violation: group {v.group} tile {v.tile}: {v.level.upper()} needs "
             f"{need}, has {has} ({fmt_bytes(v.over_bytes)} over)")
