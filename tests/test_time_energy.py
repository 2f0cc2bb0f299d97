"""Latency and energy formulas pinned on hand-computable chips, and the time/energy choice."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from hardware.chip import load_chip
from planner import api
from planner.cost import group_cost
from planner.graph_build import build_graph
from planner.onnx_load import load_model
from planner.regions import Tile

CHIP = """
name: unit
dtype_bytes: 1
clock_ghz: 1.0
clusters: 1
cores_per_cluster: 1
dram: {bandwidth_gbps: 1, pj_per_byte: 10}
sram: {bytes: 1MiB, bandwidth_gbps: 64, pj_per_byte: 1}
core: {macs_per_cycle: 1, vector_lanes: 1, pj_per_mac: 2, pj_per_vector_op: 0.5}
"""


def _one_conv(tmp_path: Path) -> Path:
    """Conv 1x1, 2 -> 2 channels on 4x4, no bias: 32 inputs, 4 weights, 64 MACs."""
    w = numpy_helper.from_array(np.ones((2, 2, 1, 1), np.float32), "w")
    node = helper.make_node("Conv", ["x", "w"], ["y"], name="conv", kernel_shape=[1, 1])
    graph = helper.make_graph([node], "one", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [1, 2, 4, 4])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, [1, 2, 4, 4])], [w])
    path = tmp_path / "one.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)
    return path


@pytest.fixture()
def unit(tmp_path: Path):  # noqa: ANN201
    chip_file = tmp_path / "unit.yaml"
    chip_file.write_text(CHIP)
    chip, _ = load_chip(str(chip_file))
    graph = build_graph(load_model(str(_one_conv(tmp_path))))
    return graph, chip, chip_file, tmp_path


def test_one_tile_serial(unit) -> None:  # noqa: ANN001
    graph, chip, _, _ = unit
    c = group_cost(graph, ("conv",), Tile(1, 4, 4), chip)
    assert (c.dram_read_bytes, c.dram_write_bytes, c.macs) == (36, 32, 64)
    # 1 B/cycle: 68 cycles of transfers, then 64 of compute
    assert c.cycles == 68 + 64
    # DRAM bytes through SRAM (10 + 1 pJ/B); cores read the input once and write the output
    # (32*2 + 32 = 96 B at SRAM's 1 pJ/B), read 4 weight bytes, 64 MACs at 2 pJ
    assert c.energy_pj == pytest.approx(68 * 11 + 96 * 1 + 4 * 1 + 64 * 2)


def test_two_tiles_double_buffered_overlap(unit) -> None:  # noqa: ANN001
    graph, chip, _, _ = unit
    serial = group_cost(graph, ("conv",), Tile(1, 2, 4), chip, double_buffered=False)
    piped = group_cost(graph, ("conv",), Tile(1, 2, 4), chip, double_buffered=True)
    assert serial.cycles == 68 + 64
    # fill: first tile's 16 input bytes + 4 weight bytes; drain: last tile's 16 output bytes;
    # the other 32 transfer bytes hide behind 64 cycles of compute
    assert (piped.first_load_bytes, piped.last_store_bytes) == (20, 16)
    assert piped.cycles == 20 + max(68 - 20 - 16, 64) + 16
    # the second input buffer is on chip too
    assert piped.sram_peak_bytes == serial.sram_peak_bytes + 16


def test_emulator_reproduces_cycles_and_energy(unit) -> None:  # noqa: ANN001
    graph, chip, chip_file, tmp = unit
    plan = api.solve(str(tmp / "one.onnx"), hardware=str(chip_file), solver="shortest-path",
                     objective="latency")
    path = tmp / "plan.json"
    from planner.plan import save_plan

    save_plan(plan, path)
    report = api.verify(str(tmp / "one.onnx"), path)
    assert report.ok, (report.first_counter_mismatch, report.first_output_mismatch)
    assert report.emulated.cycles == plan.totals.cycles
    assert report.timeline[0]["end_cycle"] == plan.totals.cycles


def test_latency_plan_is_fastest_and_energy_plan_cheapest() -> None:
    problem = api.prepare("zoo:squeezenet")
    plans = {(s, o): api.plan_problem(problem, s, o, time_limit=30)
             for s in ("layer", "greedy", "shortest-path", "cpsat")
             for o in ("traffic", "latency", "energy")}
    fastest = min(p.totals.cycles for p in plans.values())
    cheapest = min(p.totals.energy_pj for p in plans.values())
    assert plans["cpsat", "latency"].totals.cycles == fastest
    assert plans["cpsat", "energy"].totals.energy_pj == pytest.approx(cheapest)
    # the objectives conflict on this chip: the fastest plan is not the cheapest
    assert plans["cpsat", "latency"].totals.energy_pj > cheapest


def test_prefer_auto_follows_battery() -> None:
    rules = api.prepare("zoo:squeezenet").ruleset
    assert api.resolve_objective(rules, None, "auto", 10) == "energy"
    assert api.resolve_objective(rules, None, "auto", 90) == "latency"
    assert api.resolve_objective(rules, "traffic", "auto", 10) == "traffic"


def test_whole_network_on_chip_is_one_group(tmp_path: Path) -> None:
    rules = tmp_path / "deep.yaml"  # squeezenet's 66 layers are "not too deep" under 80
    default = Path(__file__).resolve().parent.parent / "rules" / "default.yaml"
    rules.write_text(default.read_text().replace(
        "max_group_layers: 12", "max_group_layers: 80"))
    plan = api.solve("zoo:squeezenet", rules=str(rules), hardware="two_level",
                     overrides=["sram.bytes=64MiB"])
    assert plan.solver["status"] == "WHOLE_NETWORK_ON_CHIP"
    assert len(plan.groups) == 1
    assert plan.totals.dram_bytes == plan.compulsory_dram_bytes
