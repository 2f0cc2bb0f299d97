"""One benchmark row: plan an export with CP-SAT, verify it through a plan file, and the
figures bench/exports and bench/transformers print (DRAM against the floor and against
layer by layer, weight reads against the weights once, solve and emulator times).
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from fuseplan.planner.app import api
from fuseplan.planner.cost.model import weight_bytes
from fuseplan.planner.plan.json_io import save_plan

EXPORTS = Path(__file__).resolve().parent.parent / "examples" / "exports"


@dataclass(frozen=True)
class Row:
    """What one plan of one model measured."""

    dram_bytes: int
    floor_bytes: int
    layer_by_layer_bytes: int
    weight_read_bytes: int
    weight_bytes: int  # every weight once
    groups: int
    solve_s: float  # prepare + plan, as a user waits for `fuseplan solve`
    emulator_s: float
    reference_s: float
    verified: bool
    spills: str
    # fused attention (long sequences): its DRAM bytes, and FlashAttention's analytic count
    # for the plan's tiling (q once, k and v once per pass of query rows, o once)
    attention_bytes: int = 0
    attention_analytic_bytes: int = 0

    @property
    def x_floor(self) -> float:
        return self.dram_bytes / self.floor_bytes

    @property
    def x_layer_by_layer(self) -> float:
        return self.dram_bytes / self.layer_by_layer_bytes

    @property
    def x_weights(self) -> float:
        """Weight bytes read over the weights once (1.0: every weight read exactly once)."""
        return self.weight_read_bytes / max(1, self.weight_bytes)


def spills(problem: api.Problem, plan: api.Plan, top: int = 3) -> str:
    """The largest maps one group writes to DRAM and another reads back, as 'name KiB'."""
    graph = problem.graph
    group_of = {layer: g.id for g in plan.groups for layer in g.layers}
    written = {}
    for layer in graph.layers:
        for t in layer.outputs:
            if any(group_of[c] != group_of[layer.name] for c in graph.consumers.get(t, ())):
                written[t] = graph.elems(t) * problem.chip.dtype_bytes
    worst = sorted(written.items(), key=lambda kv: -kv[1])[:top]
    return ", ".join(f"{n} {b / 1024:.0f} KiB" for n, b in worst) or "-"


def plan_and_verify(model: str, shapes: Mapping[str, tuple[int, ...]],
                    hardware: str | None = None, overrides: tuple[str, ...] = ()) -> Row:
    """Plan `model` at `shapes` with CP-SAT and verify the saved plan file (seeded random
    weights in place of placeholders, outputs against onnxruntime, counters against the
    emulator). Raises PlanningError when there is no plan."""
    started = time.perf_counter()
    problem = api.prepare(model, hardware=hardware, shapes=shapes, overrides=overrides)
    plan = api.plan_problem(problem, "cpsat", jobs=0)  # every core, as `fuseplan solve`
    solve_s = time.perf_counter() - started
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "plan.json"
        save_plan(plan, path)
        report = api.verify(model, path, shapes=shapes)  # on the chip the plan embeds
    graph = problem.graph
    t = plan.totals
    return Row(
        dram_bytes=t.dram_bytes, floor_bytes=plan.compulsory_dram_bytes,
        layer_by_layer_bytes=plan.layer_by_layer_dram_bytes,
        weight_read_bytes=t.weight_read_bytes,
        weight_bytes=weight_bytes(graph, {w for lay in graph.layers for w in lay.weights},
                                  problem.chip),
        groups=len(plan.groups), solve_s=solve_s, emulator_s=report.emulator_s,
        reference_s=report.reference_s, verified=report.ok, spills=spills(problem, plan),
        **attention_counts(report))


def attention_counts(report: api.VerifyReport) -> dict[str, int]:
    """The DRAM bytes the emulator moved for the groups that are one fused attention layer
    alone, and their analytic count (VerifyReport.attention): equal when the plan is
    FlashAttention's."""
    alone = [a for a in report.attention if a.alone]
    return {"attention_bytes": sum(a.emulated_bytes for a in alone),
            "attention_analytic_bytes": sum(a.analytic_bytes for a in alone)}
