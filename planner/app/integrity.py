"""Every number a plan file states, re-derived from the cost model: `verify` refuses a plan
whose stated counters, totals or floors are not what its own placements give on its chip
(an edited or damaged file), naming the first field that differs."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import fields
from typing import Any

from fuseplan.hardware.chip import Chip
from fuseplan.planner.app.assemble import layer_by_layer_bytes, placement_cost
from fuseplan.planner.cost.counters import Counters
from fuseplan.planner.cost.model import compulsory_bytes, prefetch_cycles, weight_bytes, with_time
from fuseplan.planner.geometry.regions import group_io
from fuseplan.planner.ir.graph import Graph
from fuseplan.planner.plan.checks import group_mode
from fuseplan.planner.plan.data import Plan

COUNTER_FIELDS = tuple(f.name for f in fields(Counters))


def _stated(value: float) -> str:
    return f"{value:,}" if isinstance(value, int) else f"{value:,.3f}"


def _differs(name: str, stated: float, derived: float) -> bool:
    # plan files state energy rounded to the picojoule's thousandth (planner.plan.json_io);
    # a float sum may land on either side of that rounding, so allow one part in 1e9 beyond it
    if name == "energy_pj":
        return abs(round(derived, 3) - stated) > max(1e-3, 1e-9 * abs(derived))
    return stated != derived


def derived_counters(graph: Graph, plan: Plan, chip: Chip) -> list[Counters]:
    """Each group's counters as the cost model prices its placement, with the prefetch the
    plan states (hidden behind the group before it, as planner.app.assemble decides)."""
    out: list[Counters] = []
    for k, g in enumerate(plan.groups):
        c = placement_cost(graph, g.placement, chip)
        if g.prefetch and k > 0:
            prev = plan.groups[k - 1]
            w = weight_bytes(graph, group_io(graph, g.layers).weights, chip)
            hidden = prefetch_cycles(chip, out[k - 1], prev.double_buffered, w, c.overlap_cycles)
            c = with_time(chip, c, g.double_buffered, hidden)
        out.append(c)
    return out


def first_misstatement(graph: Graph, plan: Plan, chip: Chip, stated_groups: Sequence[Any],
                       stated_totals: Mapping[str, Any]) -> str | None:
    """The first number of the plan that the cost model does not give, as "FIELD says X,
    ... give Y", or None when every stated number is re-derived exactly: each group's
    mode and predicted counters, then `stated_totals` (the file's "totals"). Only what the
    file states is compared: `stated_groups` are its raw group objects (CONTRACT.md requires
    some counters per group, not all), and a total is compared where every group states
    the counter it sums. `chip` must be the chip the plan was made for."""
    if any(g.boxes is not None for g in plan.groups):
        return None  # dynamic plans state no per-group counters of their own
    derived = derived_counters(graph, plan, chip)
    for i, (g, raw, want) in enumerate(zip(plan.groups, stated_groups, derived, strict=True)):
        mode = group_mode(graph, g.layers, g.tile)
        if "mode" in raw and g.mode != mode:
            return f"groups[{i}].mode says \"{g.mode}\", its tile gives \"{mode}\""
        for name in COUNTER_FIELDS:
            if name not in raw.get("predicted", {}):
                continue
            stated, got = getattr(g.predicted, name), getattr(want, name)
            if _differs(name, stated, got):
                return (f"groups[{i}].predicted.{name} says {_stated(stated)}, the cost model "
                        f"gives {_stated(round(got, 3) if name == 'energy_pj' else got)} for "
                        "its placement")
    total = sum(derived, Counters())
    floors: dict[str, Callable[[], int]] = {
        "compulsory_dram_bytes": lambda: compulsory_bytes(graph, chip),
        "layer_by_layer_dram_bytes": lambda: layer_by_layer_bytes(graph, chip)}
    everywhere = {name for name in COUNTER_FIELDS
                  if all(name in raw.get("predicted", {}) for raw in stated_groups)}
    for name, stated in stated_totals.items():
        if name in COUNTER_FIELDS and name not in everywhere:
            continue
        if name in floors:
            got_floor = floors[name]()
            if stated != got_floor:
                return (f"totals.{name} says {stated:,}, the cost model gives {got_floor:,} "
                        "for this model and chip")
        elif hasattr(total, name) and _differs(name, stated, getattr(total, name)):
            got = getattr(total, name)
            return (f"totals.{name} says {_stated(stated)}, the plan's groups give "
                    f"{_stated(round(got, 3) if name == 'energy_pj' else got)}")
    return None
