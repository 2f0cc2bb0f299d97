"""Verification: run a plan in the emulator and compare every tensor it moves through DRAM
with onnxruntime (or a golden file), tensor by tensor against its own scale
(planner.app.verify_tensors), its counters with the plan's predictions, and its cycles with
the closed form (CYCLE_RULE). A plan file end to end: planner.app.verify_file; the reference
and the weights: planner.app.verify_reference."""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from fractions import Fraction
from math import ceil, prod
from pathlib import Path
from typing import Any

import numpy as np

from fuseplan.emulator.run import Corruption, EmulationError, EmulationResult, Violation, emulate
from fuseplan.hardware.chip import Chip
from fuseplan.planner.app.verify_reference import (
    Reference,
    WeightsChoice,
    onnxruntime_reference,
    read_golden,
)
from fuseplan.planner.app.verify_reference import save_golden as save_golden
from fuseplan.planner.app.verify_tensors import (
    ABS_FLOOR,
    REL_TOLERANCE,
    TOLERANCE_RULE,
    TensorCheck,
    check_tensors,
    finite_or_none,
)
from fuseplan.planner.core.errors import PlanDefect
from fuseplan.planner.core.progress import Progress, ProgressSink
from fuseplan.planner.cost.counters import TIMING_FIELDS, Counters
from fuseplan.planner.cost.objective import energy_pj
from fuseplan.planner.front.onnx_load import LoadedModel
from fuseplan.planner.geometry.attention import attention_traffic
from fuseplan.planner.geometry.regions import group_io
from fuseplan.planner.ir.array import matrix_macs
from fuseplan.planner.ir.graph import Graph
from fuseplan.planner.plan.data import Plan

# what must equal the prediction exactly: bytes and work (time comes from the emulator's own
# clock and is compared, see CycleComparison)
REFERENCE_PHASE = "onnxruntime reference"  # the phase a progress sink hears while it runs
COUNTERS = tuple(f.name for f in fields(Counters) if f.name not in TIMING_FIELDS)
# the cost model's closed-form cycles against the emulator's event clock (README, "Emulated
# against predicted cycles"). The closed form (fill + max(transfers, compute) + drain) is a
# lower bound of a group's schedule up to rounding; where tiles are few or uneven the clock's
# per-tile steps add up to more, by less than one tile's work done serially (measured: at
# most 0.73 of it, a two-tile group of the small test models; under 0.03 on the exports)
ROUNDING_CYCLES = 2  # per tile: each tile's compute is rounded up to whole cycles
CYCLE_RULE = (f"each group whose cycles the plan states: predicted - {ROUNDING_CYCLES} <= "
              f"emulated (unless its weights were prefetched or it runs in bands: those may "
              f"hide more) and emulated <= predicted + its serial cycles / its tiles + "
              f"{ROUNDING_CYCLES} per tile, never above its serial cycles (its transfers, "
              f"MACs, vector ops and gathers one after another, + {ROUNDING_CYCLES} per tile); "
              f"the plan: "
              f"emulated >= predicted - {ROUNDING_CYCLES} per group")


@dataclass(frozen=True)
class CycleComparison:
    """Predicted cycles (the cost model's closed form) against emulated ones (the emulator's
    event simulation), per group and in total; part of the verdict under CYCLE_RULE.
    ``checked``: per group, whether its prediction is stated (a plan file may leave a
    group's cycles out: then it predicts nothing there); ``floors`` and ``ceilings``: per
    group, the fewest and most cycles CYCLE_RULE allows (None: no bound)."""

    predicted: tuple[int, ...]
    emulated: tuple[int, ...]
    checked: tuple[bool, ...] = ()
    floors: tuple[int | None, ...] = ()
    ceilings: tuple[int | None, ...] = ()

    @classmethod
    def of(cls, plan: Plan, emulated: Sequence[Counters],
           stated: Sequence[Collection[str]] | None = None, chip: Chip | None = None,
           tiles: Sequence[int] = ()) -> CycleComparison:
        """The plan's predicted cycles against the emulated counters', group by group, with
        each group's bounds (its serial time needs the chip and the tiles it ran)."""
        checked = tuple(stated is None or "cycles" in stated[k] for k in range(len(plan.groups)))
        floors = tuple(None if g.prefetch or g.tile.bands > 1
                       else g.predicted.cycles - ROUNDING_CYCLES for g in plan.groups)
        ceilings: tuple[int | None, ...] = tuple(None for _ in plan.groups)
        if chip is not None and len(tiles) == len(plan.groups):
            # a group's link also carries the weights the next group prefetches
            ahead = [c.weight_read_bytes if g.prefetch else 0
                     for g, c in zip(plan.groups[1:], emulated[1:], strict=True)] + [0]
            ceilings = tuple(cycle_ceiling(chip, g.predicted.cycles, c, n, extra)
                             for g, c, n, extra in zip(plan.groups, emulated, tiles, ahead,
                                                       strict=True))
        return cls(tuple(g.predicted.cycles for g in plan.groups),
                   tuple(c.cycles for c in emulated), checked, floors, ceilings)

    def _per_group(self) -> list[tuple[int, int, bool, int | None, int | None]]:
        n = len(self.predicted)
        return list(zip(self.predicted, self.emulated, self.checked or (True,) * n,
                        self.floors or (None,) * n, self.ceilings or (None,) * n, strict=True))

    @property
    def first_off(self) -> str | None:
        """The first difference past CYCLE_RULE, named (None: the cycles agree)."""
        rows = self._per_group()
        for k, (p, e, c, lo, hi) in enumerate(rows):
            if c and lo is not None and e < lo:
                return (f"group {k}: cycles emulated {e:,}, below the prediction {p:,} by more "
                        "than rounding")
            if c and hi is not None and e > hi:
                return (f"group {k}: cycles emulated {e:,}, predicted {p:,}: more than the "
                        f"{hi:,} the prediction allows (one tile's serial work above it)")
        if rows and all(c for _, _, c, _, _ in rows):
            p, e = sum(self.predicted), sum(self.emulated)
            if e < p - ROUNDING_CYCLES * len(rows):
                return (f"plan: cycles emulated {e:,}, below the prediction {p:,} by more than "
                        "rounding")
        return None

    @property
    def ok(self) -> bool:
        """Whether the cycles agree within CYCLE_RULE."""
        return self.first_off is None

    @staticmethod
    def row(predicted: int, emulated: int) -> dict[str, float]:
        """Predicted, emulated, difference (emulated - predicted) and difference / predicted."""
        diff = emulated - predicted
        return {"predicted": predicted, "emulated": emulated, "difference": diff,
                "relative": round(diff / predicted, 6) if predicted else 0.0}

    def to_json(self) -> dict[str, Any]:
        """`verify --json`'s "cycles": the total's row, the verdict and the rule it applies,
        and one row per group."""
        total = self.row(sum(self.predicted), sum(self.emulated))
        return {**total, "ok": self.ok, "tolerance": CYCLE_RULE, "first_off": self.first_off,
                "per_group": [{"group": i, **self.row(p, e), "checked": c, "floor": lo,
                               "ceiling": hi}
                              for i, (p, e, c, lo, hi) in enumerate(self._per_group())]}


def serial_cycles(chip: Chip, counted: Counters, tiles: int, prefetched: int = 0) -> int:
    """The most cycles a group can take: its DRAM transfers (and `prefetched` bytes of the
    next group's weights), its MACs on every core, its vector ops on every lane and its
    gathers over the cluster links, one after another, plus rounding per tile."""
    per_cycle = Fraction(str(chip.dram.bandwidth_gbps)) / Fraction(str(chip.clock_ghz))
    return (ceil((counted.dram_bytes + prefetched) / per_cycle)
            + ceil(matrix_macs(chip, counted.macs, counted.array_macs)
                   / (chip.cores * chip.core.macs_per_cycle))
            + ceil(counted.vector_ops / (chip.cores * chip.core.vector_lanes))
            + ceil(counted.cluster_link_bytes / chip.links_bytes_per_cycle)
            + ROUNDING_CYCLES * tiles)


def cycle_ceiling(chip: Chip, predicted: int, counted: Counters, tiles: int,
                  prefetched: int = 0) -> int:
    """The most emulated cycles CYCLE_RULE allows a group: its prediction plus one tile's
    share of its serial cycles and the rounding, never more than the serial cycles."""
    serial = serial_cycles(chip, counted, tiles, prefetched)
    return min(serial, predicted + ceil(serial / max(tiles, 1)) + ROUNDING_CYCLES * tiles)


@dataclass(frozen=True)
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
    # every tensor that crossed DRAM and has a reference, in execution order
    tensors: tuple[TensorCheck, ...] = ()
    # which weights the model ran with, and which references could not show an error
    weights: WeightsChoice | None = None
    # DRAM tensors the reference has no value of (a golden file of model outputs only)
    uncompared: tuple[str, ...] = ()

    @property
    def first_mismatch_tensor(self) -> str | None:
        """The name of the first tensor (in execution order) that disagrees."""
        return next((t.tensor for t in self.tensors if not t.ok), None)

    @property
    def ok(self) -> bool:
        """Outputs, counters, stated numbers, capacity and cycles all agree."""
        return self.outputs_match and self.predicted_matches_emulated \
            and not self.capacity_violations and self.first_misstatement is None \
            and self.cycles.ok

    def to_json(self) -> dict[str, Any]:
        """`verify --json`'s document (CONTRACT.md's keys, and more)."""
        e = self.emulated
        return {
            "ok": self.ok,
            "outputs_match": self.outputs_match,
            "max_abs_err": finite_or_none(self.max_abs_err),
            "max_rel_err": finite_or_none(self.max_rel_err),
            "reference": self.reference,
            "checked_tensors": self.checked_tensors,
            "tolerance": {"rule": TOLERANCE_RULE, "relative": REL_TOLERANCE,
                          "absolute_floor": ABS_FLOOR, "cycles": CYCLE_RULE},
            "first_mismatch_tensor": self.first_mismatch_tensor,
            "tensors": [t.to_json() for t in self.tensors],
            "uncompared_tensors": list(self.uncompared),
            "weights": None if self.weights is None else self.weights.to_json(),
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


def dram_order(graph: Graph, plan: Plan) -> list[tuple[str, int | None]]:
    """Every tensor the plan writes to DRAM with the index of the group that writes it, in
    execution order (a group's outputs in its own order); then any model output no group
    writes (a model input passed through, a KV cache appended in place), with None."""
    order: list[tuple[str, int | None]] = []
    seen: set[str] = set()
    for k, g in enumerate(plan.groups):
        for t in group_io(graph, g.layers).outputs:
            if t not in seen:
                seen.add(t)
                order.append((t, k))
    order += [(t, None) for t in graph.outputs if t not in seen]
    # a KV cache appended in place: its buffer, the past and the new positions, no group's
    order += [(a.output, None) for a in graph.appends]
    return order


def dram_tensors(graph: Graph, plan: Plan) -> list[str]:
    """Tensors the plan writes to DRAM (every group output), in execution order."""
    return [t for t, _ in dram_order(graph, plan)]


def verify_plan(model: LoadedModel, graph: Graph, plan: Plan, chip: Chip,
                inputs: Mapping[str, np.ndarray], golden: Path | None = None,
                stated: Sequence[Collection[str]] | None = None, *,
                reference: Reference | None = None, corrupt: Corruption | None = None,
                weights: WeightsChoice | None = None,
                progress: ProgressSink | None = None) -> VerifyReport:
    """Emulate the plan on `inputs` and check every DRAM tensor, the counters and the cycles.

    The reference: `reference` when given, else the `golden` file's tensors, else
    onnxruntime on `model`. ``stated``: per group, the counters its plan file states (None:
    all). ``corrupt``: the emulator's test hook (emulator.run.Corruption). ``weights``: how
    the caller chose the model's weights, reported as is. ``progress``: told of the groups
    emulated and of the reference run (planner.core.progress)."""
    started = time.perf_counter()
    try:
        result: EmulationResult = emulate(graph, plan, chip, inputs, corrupt=corrupt,
                                          progress=progress)
    except EmulationError as exc:
        raise PlanDefect(
            f"{exc} The planner made a plan its emulator cannot execute; please report it "
            "with the model and the plan file.") from None
    emulator_s = time.perf_counter() - started
    order = dram_order(graph, plan)
    if reference is None:
        if progress is not None and golden is None:
            progress(Progress(REFERENCE_PHASE))
        reference = Reference("golden", read_golden(golden).tensors, 0.0) if golden is not None \
            else onnxruntime_reference(model, [t for t, _ in order], inputs)
    got = {**result.tensors, **result.outputs}
    # a tensor read in a finer shape holds the model's elements in the model's order
    got.update({t: got[t].reshape(shape) for t, shape in graph.model_shapes.items()
                if t in got and got[t].size == prod(shape)})
    checks = check_tensors(order, got, reference.tensors)
    first = next((c for c in checks if not c.ok), None)
    mismatch = counter_mismatch(plan, result.groups, stated)
    groups = priced(chip, result.groups)
    return VerifyReport(
        outputs_match=first is None,
        max_abs_err=max((c.max_abs_err for c in checks), default=0.0),
        max_rel_err=max((c.max_rel_err for c in checks), default=0.0),
        reference=reference.source,
        emulated=sum(groups, Counters()),
        predicted_matches_emulated=mismatch is None,
        first_output_mismatch=None if first is None else first.describe(),
        first_counter_mismatch=mismatch,
        capacity_violations=result.violations,
        emulator_s=emulator_s,
        reference_s=reference.seconds,
        checked_tensors=len(checks),
        per_group=groups,
        timeline=result.timeline(),
        cycles=CycleComparison.of(plan, groups, stated, chip, result.tiles),
        attention=attention_checks(graph, plan, groups, chip.dtype_bytes),
        tensors=tuple(checks),
        weights=weights,
        uncompared=tuple(t for t, _ in order if t not in reference.tensors),
    )


@dataclass(frozen=True)
class AttentionCheck:
    """One fused attention as verified: what its group moved in the emulator against
    FlashAttention's analytic count (q once, k and v once per pass, a causal pass's up to
    its last query, o once); equal when the
    layer is alone in its group, the group's other layers adding theirs otherwise."""

    layer: str
    group: int
    alone: bool
    emulated_bytes: int
    analytic_bytes: int
    passes: int
    kv_label: str = ""  # how many times the passes read k and v whole ('2×', '1.50×')


def attention_checks(graph: Graph, plan: Plan, emulated: Sequence[Counters],
                     dtype_bytes: int) -> list[AttentionCheck]:
    """The AttentionCheck of every fused attention of the plan."""
    out = []
    for g, counted in zip(plan.groups, emulated, strict=True):
        io = group_io(graph, g.layers)
        for a in attention_traffic(graph, io, g.tile, dtype_bytes):
            out.append(AttentionCheck(a.layer, g.id, len(g.layers) == 1, counted.dram_bytes,
                                      a.total, a.passes, a.kv_label()))
    return out


def load_golden(path: Path) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], int]:
    """(inputs, model outputs, weight seed) of a golden file (verify_reference.read_golden
    has the rest)."""
    golden = read_golden(path)
    return dict(golden.inputs), dict(golden.outputs), golden.seed
