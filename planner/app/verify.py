"""Verification: run a plan in the emulator and compare with onnxruntime (or golden outputs)."""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from fuseplan.emulator.run import EmulationError, EmulationResult, Violation, emulate
from fuseplan.hardware.chip import Chip
from fuseplan.planner.core.errors import InputError, PlanDefect
from fuseplan.planner.core.files import write_with
from fuseplan.planner.cost.counters import TIMING_FIELDS, Counters
from fuseplan.planner.cost.objective import energy_pj
from fuseplan.planner.front.onnx_load import LoadedModel, run_onnxruntime
from fuseplan.planner.geometry.attention import attention_traffic
from fuseplan.planner.geometry.regions import group_io
from fuseplan.planner.ir.graph import Graph
from fuseplan.planner.plan.data import Plan

# float32 through 50+ layers: relative to the tensor's largest magnitude
REL_TOLERANCE = 1e-3
# what must equal the prediction exactly: bytes and work (time comes from the emulator's own
# clock and is compared, see CycleComparison)
COUNTERS = tuple(f.name for f in fields(Counters) if f.name not in TIMING_FIELDS)


@dataclass(frozen=True)
class CycleComparison:
    """Predicted cycles (the cost model's closed form) against emulated ones (the emulator's
    event simulation), per group and in total."""

    predicted: tuple[int, ...]
    emulated: tuple[int, ...]

    @classmethod
    def of(cls, plan: Plan, emulated: Sequence[Counters]) -> CycleComparison:
        """The plan's predicted cycles against the emulated counters', group by group."""
        return cls(tuple(g.predicted.cycles for g in plan.groups),
                   tuple(c.cycles for c in emulated))

    @staticmethod
    def row(predicted: int, emulated: int) -> dict[str, float]:
        """Predicted, emulated, difference (emulated - predicted) and difference / predicted."""
        diff = emulated - predicted
        return {"predicted": predicted, "emulated": emulated, "difference": diff,
                "relative": round(diff / predicted, 6) if predicted else 0.0}

    def to_json(self) -> dict[str, Any]:
        """`verify --json`'s "cycles": the total's row, and one row per group."""
        total = self.row(sum(self.predicted), sum(self.emulated))
        return {**total, "per_group": [{"group": i, **self.row(p, e)} for i, (p, e) in
                                       enumerate(zip(self.predicted, self.emulated,
                                                     strict=True))]}


@dataclass
class VerifyReport:
    """What `fuseplan verify` reports."""

    outputs_match: bool
    max_abs_err: float
    max_rel_err: float
    reference: str
    emulated: Counters
    predicted_matches_emulated: bool
    first_output_mismatch: str | None
    first_counter_mismatch: str | None
    capacity_violations: list[Violation]
    emulator_s: float
    reference_s: float
    checked_tensors: int = 0
    per_group: list[Counters] = field(default_factory=list)
    timeline: list[dict[str, int]] = field(default_factory=list)
    cycles: CycleComparison = CycleComparison((), ())
    # the first number the plan file states that the cost model does not give for its
    # placements (planner.app.integrity), None when every one is re-derived exactly
    first_misstatement: str | None = None
    # per fused attention (planner.geometry.attention): its group, the bytes its group
    # moved in the emulator, and FlashAttention's analytic count for the plan's tiling
    attention: list[AttentionCheck] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.outputs_match and self.predicted_matches_emulated \
            and not self.capacity_violations and self.first_misstatement is None

    def to_json(self) -> dict[str, Any]:
        e = self.emulated
        return {
            "outputs_match": self.outputs_match,
            "max_abs_err": self.max_abs_err,
            "max_rel_err": self.max_rel_err,
            "reference": self.reference,
            "checked_tensors": self.checked_tensors,
            "emulated": {**{f.name: getattr(e, f.name) for f in fields(e)},
                         "dram_bytes": e.dram_bytes, "energy_pj": round(e.energy_pj, 3)},
            "predicted_matches_emulated": self.predicted_matches_emulated,
            "first_output_mismatch": self.first_output_mismatch,
            "first_counter_mismatch": self.first_counter_mismatch,
            "first_misstatement": self.first_misstatement,
            "capacity_violations": [
                {"group": v.group, "tile": v.tile, "level": v.level, "needed_bytes": v.needed_bytes,
                 "capacity_bytes": v.capacity_bytes, "over_bytes": v.over_bytes}
                for v in self.capacity_violations
            ],
            "timing": {"emulator_s": round(self.emulator_s, 4),
                       "reference_s": round(self.reference_s, 4)},
            "timeline": self.timeline,
            "cycles": self.cycles.to_json(),
            "attention": [{"layer": a.layer, "group": a.group, "alone": a.alone,
                           "emulated_dram_bytes": a.emulated_bytes,
                           "analytic_dram_bytes": a.analytic_bytes, "passes": a.passes}
                          for a in self.attention],
        }


def counter_mismatch(plan: Plan, emulated: list[Counters],
                     stated: Sequence[Collection[str]] | None = None) -> str | None:
    """The first predicted byte or work counter that differs from the emulated one, named,
    or None (cycles and energy are compared, not matched: CycleComparison). `stated`: per
    group, the counters its plan file states (None: all); a counter a file leaves out
    (CONTRACT.md requires only some) predicts nothing."""
    for k, (group, got) in enumerate(zip(plan.groups, emulated, strict=True)):
        want = group.predicted
        for name in COUNTERS:
            if stated is not None and name not in stated[k]:
                continue
            if getattr(want, name) != getattr(got, name):
                return (f"group {group.id} ({group.layers[0]}..): {name} predicted "
                        f"{getattr(want, name)}, emulated {getattr(got, name)}")
    return None


def priced(chip: Chip, emulated: Sequence[Counters]) -> list[Counters]:
    """The emulated counters with their energy: the cost model's one formula over the bytes
    and work the emulator counted and the cycles its clock ran."""
    return [replace(c, energy_pj=energy_pj(chip, c, c.cycles)) for c in emulated]


def dram_tensors(graph: Graph, plan: Plan) -> list[str]:
    """Tensors the plan writes to DRAM (every group output), graph outputs first."""
    from fuseplan.planner.geometry.regions import group_io

    written = [t for g in plan.groups for t in group_io(graph, g.layers).outputs]
    return list(graph.outputs) + [t for t in written if t not in graph.outputs]


def _with_outputs(proto: onnx.ModelProto, names: list[str]) -> onnx.ModelProto:
    extra = onnx.ModelProto()
    extra.CopyFrom(proto)
    have = {o.name for o in extra.graph.output}
    info = {vi.name: vi for vi in extra.graph.value_info}
    for n in names:
        if n not in have and n in info:
            extra.graph.output.append(info[n])
    return extra


def compare(got: Mapping[str, np.ndarray], want: Mapping[str, np.ndarray], names: list[str]
            ) -> tuple[float, float, str | None]:
    """(max abs error, max relative error, first tensor over tolerance)."""
    max_abs = max_rel = 0.0
    first = None
    for name in names:
        if name not in want or name not in got:
            continue
        a = np.asarray(got[name], dtype=np.float64)
        b = np.asarray(want[name], dtype=np.float64)
        if a.shape != b.shape:
            return float("inf"), float("inf"), f"{name}: shape {a.shape} vs {b.shape}"
        err = float(np.max(np.abs(a - b))) if a.size else 0.0
        scale = float(np.max(np.abs(b))) if b.size else 0.0
        rel = err / max(scale, 1e-6)
        max_abs, max_rel = max(max_abs, err), max(max_rel, rel)
        if first is None and rel > REL_TOLERANCE:
            first = f"{name}: max abs error {err:.3g} ({rel:.3g} of its largest value {scale:.3g})"
    return max_abs, max_rel, first


def verify_plan(model: LoadedModel, graph: Graph, plan: Plan, chip: Chip,
                inputs: Mapping[str, np.ndarray], golden: Path | None = None,
                stated: Sequence[Collection[str]] | None = None) -> VerifyReport:
    """Emulate the plan on `inputs` and check outputs and counters."""
    started = time.perf_counter()
    try:
        result: EmulationResult = emulate(graph, plan, chip, inputs)
    except EmulationError as exc:
        raise PlanDefect(
            f"{exc} The planner made a plan its emulator cannot execute; please report it "
            "with the model and the plan file.") from None
    emulator_s = time.perf_counter() - started
    names = dram_tensors(graph, plan)
    if golden is not None:
        want = load_golden(golden)[1]
        reference, reference_s = "golden", 0.0
        names = [n for n in names if n in want]
    else:
        want_all, reference_s = run_onnxruntime(_with_outputs(model.proto, names), inputs)
        want, reference = want_all, "onnxruntime"
    got = dict(result.outputs)
    got.update({t: a for t, a in result.tensors.items() if t in names})
    max_abs, max_rel, first = compare(got, want, names)
    mismatch = counter_mismatch(plan, result.groups, stated)
    groups = priced(chip, result.groups)
    return VerifyReport(
        outputs_match=first is None,
        max_abs_err=max_abs,
        max_rel_err=max_rel,
        reference=reference,
        emulated=sum(groups, Counters()),
        predicted_matches_emulated=mismatch is None,
        first_output_mismatch=first,
        first_counter_mismatch=mismatch,
        capacity_violations=result.violations,
        emulator_s=emulator_s,
        reference_s=reference_s,
        checked_tensors=len([n for n in names if n in want]),
        per_group=groups,
        timeline=result.timeline(),
        cycles=CycleComparison.of(plan, groups),
        attention=attention_checks(graph, plan, groups, chip.dtype_bytes),
    )


@dataclass(frozen=True)
class AttentionCheck:
    """One fused attention as verified: what its group moved in the emulator against
    FlashAttention's analytic count (q once, k and v once per pass, o once); equal when the
    layer is alone in its group, the group's other layers adding theirs otherwise."""

    layer: str
    group: int
    alone: bool
    emulated_bytes: int
    analytic_bytes: int
    passes: int


def attention_checks(graph: Graph, plan: Plan, emulated: Sequence[Counters],
                     dtype_bytes: int) -> list[AttentionCheck]:
    """The AttentionCheck of every fused attention of the plan."""
    out = []
    for g, counted in zip(plan.groups, emulated, strict=True):
        io = group_io(graph, g.layers)
        for a in attention_traffic(graph, io, g.tile, dtype_bytes):
            out.append(AttentionCheck(a.layer, g.id, len(g.layers) == 1, counted.dram_bytes,
                                      a.total, a.passes))
    return out


def save_golden(path: Path, inputs: Mapping[str, np.ndarray], outputs: Mapping[str, np.ndarray],
                seed: int) -> None:
    """Store inputs and reference outputs for `verify --golden`."""
    arrays = {f"input:{k}": v for k, v in inputs.items()}
    arrays.update({f"output:{k}": v for k, v in outputs.items()})
    arrays["seed"] = np.array(seed)
    def write(tmp: Path) -> None:
        # a file object, not a path: numpy would add ".npz" to the temporary name
        with open(tmp, "wb") as f:
            np.savez_compressed(f, **arrays)  # type: ignore[arg-type]

    write_with(path, write, "golden file")


def load_golden(path: Path) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], int]:
    """(inputs, outputs, weight seed) of a golden file."""
    try:
        data = np.load(path)
    except (OSError, ValueError) as exc:
        raise InputError(f"{path}: not a readable golden .npz file ({exc}). Write one with "
                         "`fuseplan verify MODEL PLAN --save-golden G.npz`.") from None
    inputs = {k[6:]: data[k] for k in data.files if k.startswith("input:")}
    outputs = {k[7:]: data[k] for k in data.files if k.startswith("output:")}
    if not inputs or not outputs:
        raise InputError(f"{path}: golden file has no input:/output: arrays. Write one with "
                         "`fuseplan verify MODEL PLAN --save-golden G.npz`.")
    return inputs, outputs, int(data["seed"]) if "seed" in data.files else 0
