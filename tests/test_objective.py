"""The objective enum, the one energy formula, and typed placements through a plan file."""

from __future__ import annotations

import json
from dataclasses import astuple, replace
from pathlib import Path
from typing import Any

import pytest

from fuseplan.hardware.chip import load_chip
from fuseplan.planner.app import api
from fuseplan.planner.core.errors import InputError
from fuseplan.planner.cost.counters import Counters
from fuseplan.planner.cost.model import cycles_energy
from fuseplan.planner.cost.objective import (
    ENERGY_SCALE,
    Charged,
    EnergyRates,
    Objective,
    ObjectiveSettings,
    cycle_units,
    energy_pj,
    objective_units,
)
from fuseplan.planner.plan.json_io import load_plan, plan_to_json, save_plan
from fuseplan.planner.plan.placement import HaloMode, Placement, WeightResidency
from fuseplan.rules.ruleset import load_rules

import models

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

COUNTERS = Counters(dram_read_bytes=1000, dram_write_bytes=24, core_fmap_bytes=3000,
                    core_weight_bytes=640, macs=12_345, vector_ops=678, cycles=4321)


def test_objectives_parse_at_the_boundary() -> None:
    assert Objective.parse("energy") is Objective.ENERGY
    assert Objective.parse(Objective.LATENCY) is Objective.LATENCY
    with pytest.raises(InputError, match="traffic, latency, energy, weighted"):
        Objective.parse("speed")
    problem = api.prepare("zoo:squeezenet")
    with pytest.raises(InputError, match="unknown objective 'speed'"):
        api.plan_problem(problem, "greedy", "speed")


def test_rules_yaml_objective_is_the_enum(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text("objective:\n  default: latency\n")
    assert load_rules(good).objective.default is Objective.LATENCY
    bad = tmp_path / "bad.yaml"
    bad.write_text("objective:\n  default: fast\n")
    with pytest.raises(InputError, match=r"bad.yaml:2:12: .*one of 'traffic', 'latency'"):
        load_rules(bad)


@pytest.mark.parametrize("preset", ["cluster4x4", "frustum_npu", "manycore"])
def test_planners_and_counters_share_the_energy_formula(preset: str) -> None:
    """The planners' integer energy is the counters' pJ in milli-pJ, up to the rounding of
    each rate to a milli-pJ (none on these chips but the static power per cycle)."""
    chip, _ = load_chip(preset)
    pj = energy_pj(chip, COUNTERS, COUNTERS.cycles)
    units = objective_units(COUNTERS, Objective.ENERGY, ObjectiveSettings(), chip)
    rates = EnergyRates.of(chip)
    exact = rates.cycle * ENERGY_SCALE == round(rates.cycle * ENERGY_SCALE)
    assert units == pytest.approx(ENERGY_SCALE * pj, rel=0 if exact else 1e-5)
    # the cost model's energy is that same function
    assert cycles_energy(chip, COUNTERS, False)[1] == energy_pj(
        chip, COUNTERS, cycles_energy(chip, COUNTERS, False)[0])


@pytest.mark.parametrize("objective", list(Objective))
def test_a_cycle_is_worth_cycle_units(objective: Objective) -> None:
    """cycle_units is what one more cycle adds to objective_units (prefetch pays by it)."""
    chip, _ = load_chip("manycore")
    weights = ObjectiveSettings(dram_bytes_weight=2.0, cycles_weight=3.0, energy_pj_weight=4.0)
    slower = replace(COUNTERS, cycles=COUNTERS.cycles + 1)
    assert (objective_units(slower, objective, weights, chip)
            - objective_units(COUNTERS, objective, weights, chip)) \
        == cycle_units(objective, weights, chip)
    assert cycle_units(objective, weights, chip) > 0 or objective is Objective.TRAFFIC


def test_energy_rates_scale_every_quantity() -> None:
    chip, _ = load_chip("cluster4x4")
    one = EnergyRates.of(chip).scaled()
    for k in range(7):
        q = [0] * 7
        q[k] = 1
        assert one.total(Charged(*q)) == astuple(one)[k]


def test_placements_survive_the_plan_file(tmp_path: Path) -> None:
    """Residency, buffering, halo mode and prefetch go to the CONTRACT.md keys and back."""
    path = models.save(models.chain_cnn(h=96, w=96), tmp_path, "chain")
    problem = api.prepare(str(path), overrides=["sram.bytes=48KiB"])
    plan = api.plan_problem(problem, "shortest-path", "latency")
    assert plan.objective is Objective.LATENCY
    assert any(g.placement.halo is HaloMode.REUSE for g in plan.groups)
    doc = plan_to_json(plan)
    assert doc["objective"] == "latency"
    assert {g["halo"] for g in doc["groups"]} <= {"reuse", "recompute"}
    assert all(set(g) >= {"weights_resident", "double_buffered", "halo", "prefetch", "tile"}
               for g in doc["groups"])
    file = tmp_path / "plan.json"
    save_plan(plan, file)
    again = load_plan(file, problem.graph, problem.chip, problem.model.sha256)
    assert [g.placement for g in again.groups] == [g.placement for g in plan.groups]
    assert again.objective is Objective.LATENCY
    json.loads(file.read_text())  # still plain JSON


def test_placement_flags() -> None:
    from fuseplan.planner.geometry.regions import Tile

    p = Placement.of(["a", "b"], Tile(1, 2, 3), resident=False, halo_reuse=True)
    assert p.layers == ("a", "b") and p.weights is WeightResidency.STREAMED_PER_TILE
    assert not p.weights_resident and p.halo_reuse and p.residency("a") is p.weights
    with pytest.raises(KeyError):
        p.residency("c")


@pytest.mark.parametrize("objective", [Objective.LATENCY, Objective.ENERGY])
@pytest.mark.parametrize("name", ["chain_cnn", "residual_net", "inception_net"])
def test_a_timed_plan_never_loses_to_the_traffic_plan(name: str, objective: Objective) -> None:
    """Issue 44: the traffic plan is a candidate of every latency and energy plan, so the
    latency plan's cycles (the energy plan's energy) never exceed the traffic plan's."""
    model = str(EXAMPLES / name / "model.onnx")
    problem = api.prepare(model)
    traffic = api.plan_problem(problem, objective=Objective.TRAFFIC)
    timed = api.plan_problem(problem, objective=objective)
    chip, rs = problem.chip, problem.ruleset
    assert objective_units(timed.totals, objective, rs.objective, chip) <= \
        objective_units(traffic.totals, objective, rs.objective, chip)


def test_the_traffic_plan_replaces_a_worse_timed_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the search returns a latency plan slower than the traffic plan (here: CP-SAT
    made to answer layer by layer and call it optimal), the traffic plan is returned, no
    longer claimed optimal, and says so."""
    from fuseplan.planner.app import planning
    from fuseplan.planner.app.assemble import layer_placements

    problem = api.prepare(str(EXAMPLES / "residual_net" / "model.onnx"))
    traffic = api.plan_problem(problem, objective=Objective.TRAFFIC)

    def layer_by_layer(problem: Any, *args: Any, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        return layer_placements(problem.graph, problem.chip), {
            "name": "cpsat", "status": "OPTIMAL", "gap": 0.0, "objective": 1.0, "bound": 1.0}

    monkeypatch.setattr(planning, "cpsat_groups", layer_by_layer)
    plan = api.plan_problem(problem, objective=Objective.LATENCY)
    assert plan.solver["kept_traffic_plan"] is True and plan.solver["status"] == "FEASIBLE"
    assert "bound" not in plan.solver and plan.solver["gap"] is None
    assert [g.layers for g in plan.groups] == [g.layers for g in traffic.groups]
    assert plan.totals.cycles == traffic.totals.cycles


def test_a_plan_worse_than_no_fusion_is_replaced(monkeypatch: pytest.MonkeyPatch) -> None:
    """A traffic plan that moves more than no fusion at all (a search cut short by its time
    limit tiles single layers quickly: the latent-diffusion UNet at 60 s moved 768 B more)
    gives way to the layer-by-layer plan, no longer claimed optimal. Here CP-SAT is made
    to answer with one-row tiles that reload their weights every tile."""
    from fuseplan.planner.app import planning
    from fuseplan.planner.app.assemble import layer_placements

    problem = api.prepare(str(EXAMPLES / "chain_cnn" / "model.onnx"))
    # it fits the chip whole: the whole-network shortcut would answer before CP-SAT
    problem = replace(problem, ruleset=replace(problem.ruleset, search=replace(
        problem.ruleset.search, whole_network_first=False)))

    def one_row(problem: Any, *args: Any, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        return [Placement.of(p.layers, replace(p.tile, h=1), False)
                for p in layer_placements(problem.graph, problem.chip)], {
            "name": "cpsat", "status": "OPTIMAL", "gap": 0.0, "bound": 1.0}

    monkeypatch.setattr(planning, "cpsat_groups", one_row)
    plan = api.plan_problem(problem)
    assert plan.solver["kept_layer_by_layer"] is True and plan.solver["status"] == "FEASIBLE"
    assert "bound" not in plan.solver
    assert plan.totals.dram_bytes == plan.layer_by_layer_dram_bytes
