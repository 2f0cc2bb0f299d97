"""Array utilisation (issue 44): layers mapped onto a rows x cols weight-stationary array
(planner.ir.array), the chip key that describes it, and plans on array chips verified
(predicted == emulated array MACs, cycles within verify's rule)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import test_emulator
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from fuseplan.hardware.chip import Array, load_chip
from fuseplan.planner.app import api
from fuseplan.planner.core.errors import InputError
from fuseplan.planner.ir.array import array_macs, array_map
from fuseplan.planner.ir.graph import Layer
from fuseplan.planner.ir.ops import OpClass
from fuseplan.planner.plan.data import Plan
from fuseplan.planner.plan.json_io import plan_to_json
from fuseplan.planner.ui.cli import app

import models

ROOT = Path(__file__).resolve().parents[1]
RESIDUAL = ROOT / "examples" / "residual_net" / "model.onnx"
A32 = Array(rows=32, cols=32)


def _layer(op: str, out_shape: tuple[int, ...], k: int, group: int = 1,
           cls: OpClass = OpClass.MAIN) -> Layer:
    """A layer with only what the mapping reads: op, class, group, output shape, K."""
    return Layer(name=op.lower(), op=op, op_class=cls, attrs={"group": group},
                 inputs=("x", "w"), outputs=("y",), fmap_inputs=("x",), weights=("w",),
                 weight_elems=0, out_shape=out_shape, macs_per_output=k, row_maps=(),
                 col_maps=(), batch_preserving=True)


def test_depthwise_3x3_uses_9_rows_and_1_column() -> None:
    # 32 channels, one per group: each group a pass of 9 of 32 rows and 1 of 32 columns
    amap = array_map(_layer("Conv", (1, 32, 8, 8), 9, group=32), A32)
    assert amap is not None
    assert amap.per_pixel == 32 * 32 * 32
    assert amap.utilisation == pytest.approx(9 / 1024)


def test_pointwise_with_16_channels_uses_half_the_rows() -> None:
    amap = array_map(_layer("Conv", (1, 64, 8, 8), 16), A32)
    assert amap is not None
    assert (amap.rows, amap.cols, amap.per_pixel) == (32, 64, 2048)
    assert amap.utilisation == 0.5


@pytest.mark.parametrize(("op", "shape", "k", "group"), [
    ("Conv", (2, 64, 7, 7), 64 * 9, 1),  # K = 576 = 18 x 32, M = 64
    ("Conv", (1, 128, 5, 5), 32 * 9, 2),  # grouped: K = 288, M_g = 64
    ("Gemm", (4, 96), 256, 1),
    ("MatMul", (1, 49, 64), 32, 1),
    ("ConvTranspose", (1, 32, 16, 16), 64, 1),
])
def test_exact_multiples_use_the_whole_array(op: str, shape: tuple[int, ...], k: int,
                                             group: int) -> None:
    amap = array_map(_layer(op, shape, k, group), A32)
    assert amap is not None and amap.utilisation == 1.0


def test_gemm_rounds_up_rows_and_columns() -> None:
    # K = 100 -> 4 passes of rows (128), M = 10 -> 1 of columns (32)
    amap = array_map(_layer("Gemm", (1, 10), 100), A32)
    assert amap is not None and amap.per_pixel == 128 * 32
    assert amap.utilisation == pytest.approx(1000 / 4096)


def test_array_macs_linear_in_pixels_and_flat_elsewhere() -> None:
    chip, _ = load_chip("systolic32")
    conv = _layer("Conv", (1, 64, 8, 8), 16)
    assert array_macs(conv, chip, 64 * 10, 0) == 2048 * 10
    pool = _layer("MaxPool", (1, 64, 4, 4), 4)
    assert array_map(pool, A32) is None
    assert array_macs(pool, chip, 64 * 16, 4 * 64 * 16) == 4 * 64 * 16  # the flat rate
    plain, _ = load_chip("cluster4x4")
    assert array_macs(conv, plain, 64 * 10, 16 * 64 * 10) == 0  # no array: none counted


def test_array_preset_and_overrides() -> None:
    chip, _ = load_chip("systolic32")
    assert chip.core.array == A32 and chip.core.macs_per_cycle == 1024
    chip, _ = load_chip("systolic32", ["core.array.rows=16", "core.macs_per_cycle=512"])
    assert chip.core.array is not None and chip.core.array.rows == 16


BAD_ARRAY = """\
name: bad
dtype_bytes: 1
clock_ghz: 1.0
clusters: 1
cores_per_cluster: 1
dram: {bandwidth_gbps: 32, pj_per_byte: 20}
sram: {bytes: 2MiB, bandwidth_gbps: 512, pj_per_byte: 1.0}
core:
  macs_per_cycle: 512
  vector_lanes: 32
  pj_per_mac: 0.2
  array: {rows: 32, cols: 32}
"""


@pytest.mark.parametrize(("edit", "expected"), [
    ({}, r"bad\.yaml:12:3: `core\.array` is 32 x 32 = 1024 .* set `macs_per_cycle: 1024`"),
    ({"{rows: 32, cols: 32}": "{rows: 32, cols: 16, dataflow: output_stationary}"},
     r"bad\.yaml:12:\d+: `dataflow` must be one of 'weight_stationary'"),
    ({"rows: 32": "rows: 0"}, r"bad\.yaml:12:\d+: `rows` must be"),
])
def test_bad_array_is_refused_with_its_place(tmp_path: Path, edit: dict[str, str],
                                             expected: str) -> None:
    text = BAD_ARRAY
    for old, new in edit.items():
        text = text.replace(old, new)
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(InputError, match=expected):
        load_chip(str(path))
    result = CliRunner().invoke(app, ["solve", str(RESIDUAL), "--hw", str(path)])
    assert result.exit_code == 2
    assert "bad.yaml:12:" in result.output


# Recorded at HEAD 5b405d0 (before arrays): groups, DRAM bytes, MACs, vector ops, cycles,
# energy of CP-SAT plans on chips without an array. The cycles of the two one-tile plans
# since a group of one tile computes each layer as its weights arrive (planner.cost.layered:
# 3201 and 339 before).
UNCHANGED = {
    ("residual", "cluster4x4", "traffic"): [1, 117312, 41495552, 426496, 3015, 12516339.2],
    ("residual", "cluster4x4", "latency"): [2, 318016, 41495552, 426496, 2877, 17192531.2],
    ("residual", "frustum_npu", "latency"): [2, 318016, 41495552, 426496, 43532, 19068275.2],
    ("random7", "frustum_npu", "traffic"): [1, 7776, 33240, 280, 326, 188150.0],
}


@pytest.mark.parametrize(("name", "hw", "objective"), sorted(UNCHANGED))
def test_chips_without_array_plan_as_before(tmp_path: Path, name: str, hw: str,
                                            objective: str) -> None:
    model = RESIDUAL if name == "residual" else models.save(
        models.random_cnn(np.random.default_rng(7)), tmp_path, "rc7")
    plan = api.solve(str(model), hardware=hw, objective=objective)
    t = plan.totals
    assert [len(plan.groups), t.dram_bytes, t.macs, t.vector_ops, t.cycles,
            round(t.energy_pj, 3)] == UNCHANGED[name, hw, objective]
    assert t.array_macs == 0
    doc = plan_to_json(plan)  # plan files as before: no array, no array MACs
    assert "array" not in doc["hardware"]["spec"]["core"]
    assert all("array_macs" not in g["predicted"] for g in doc["groups"])


def _check_verified(problem: api.Problem, plan: Plan) -> None:
    report = api.verify_in_memory(problem, plan)
    assert report.outputs_match
    assert report.predicted_matches_emulated, report.first_counter_mismatch
    assert report.cycles.ok, report.cycles.to_json()
    assert report.emulated.array_macs == plan.totals.array_macs >= plan.totals.macs


@pytest.mark.parametrize("objective", ["traffic", "latency"])
def test_residual_net_on_systolic32_verifies(objective: str) -> None:
    problem = api.prepare(str(RESIDUAL), hardware="systolic32")
    plan = api.plan_problem(problem, "cpsat", objective)
    assert plan.totals.array_macs > plan.totals.macs  # narrow stem and 1x1s leave rows idle
    _check_verified(problem, plan)


@settings(max_examples=6, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), side=st.sampled_from([4, 8, 16, 32]),
       cols=st.sampled_from([4, 8, 32]), objective=st.sampled_from(["traffic", "latency"]))
def test_random_cnn_on_array_chips_verifies(tmp_path: Path, seed: int, side: int, cols: int,
                                            objective: str) -> None:
    model = models.save(models.random_cnn(np.random.default_rng(seed)), tmp_path, f"r{seed}")
    overrides = [f"core.array.rows={side}", f"core.array.cols={cols}",
                 f"core.macs_per_cycle={side * cols}"]
    problem = api.prepare(str(model), hardware="systolic32", overrides=overrides)
    plan = api.plan_problem(problem, "cpsat", objective)
    _check_verified(problem, plan)


def test_depthwise_net_on_a_clustered_array_chip_verifies(tmp_path: Path) -> None:
    # an array added to a preset without one; a small SRAM splits the net into groups
    model = models.save(models.mbconv_net(), tmp_path, "mbconv")
    problem = api.prepare(str(model), hardware="cluster4x4", overrides=[
        "sram.bytes=16KiB", "core.array.rows=32", "core.array.cols=32"])
    plan = api.plan_problem(problem, "cpsat", "latency")
    assert plan.totals.macs / plan.totals.array_macs < 0.05  # depthwise: 1 of 32 columns
    _check_verified(problem, plan)


@pytest.mark.parametrize("name", ["exported", "causal"])
def test_transposed_convs_gemms_and_matmuls_verify_on_a_narrow_array(tmp_path: Path,
                                                                      name: str) -> None:
    # ConvTranspose and Gemm (exported_net), MatMuls of a transformer (causal_encoder), on
    # a 64 x 16 array of a four-cluster chip
    model = models.exported_net(13, dynamic=False) if name == "exported" \
        else models.causal_encoder(tokens=128)
    problem = api.prepare(str(models.save(model, tmp_path, name)), hardware="cluster4x4",
                          overrides=["core.array.rows=64", "core.array.cols=16"])
    plan = api.plan_problem(problem, "cpsat", "latency")
    _check_verified(problem, plan)


def test_cpsat_prices_array_cycles_as_the_cost_model(tmp_path: Path) -> None:
    """CP-SAT over every candidate (exact_path_first off) and the timed shortest path agree
    on the optimal cycles of an array chip, and CP-SAT's objective is the plan's cycles as
    the cost model gives them (its array terms are the model's)."""
    rules = tmp_path / "rules.yaml"
    rules.write_text((ROOT / "rules" / "default.yaml").read_text().replace(
        "exact_path_first: true", "exact_path_first: false"))
    overrides = ["core.array.rows=16", "core.array.cols=8", "core.macs_per_cycle=128",
                 "sram.bytes=64KiB"]
    path = api.plan_problem(api.prepare(str(RESIDUAL), hardware="cluster4x4",
                                        overrides=overrides), "cpsat", "latency")
    problem = api.prepare(str(RESIDUAL), str(rules), hardware="cluster4x4", overrides=overrides)
    plan = api.plan_problem(problem, "cpsat", "latency")
    assert "solved_by" not in plan.solver and plan.solver["status"] == "OPTIMAL"
    assert plan.solver["objective"] == plan.totals.cycles == path.totals.cycles
    _check_verified(problem, plan)


@settings(max_examples=12, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=test_emulator.random_plans(), shape=st.sampled_from([(4, 4), (32, 8), (16, 32)]))
def test_random_tilings_verify_on_array_chips(case: tuple[Any, ...],
                                              shape: tuple[int, int]) -> None:
    """tests/test_emulator.py's random plans (any tiles, resident or streamed weights in
    chunks, weights outer, rounds of clusters) on the same chips with an array: the
    emulator counts the array MACs the model predicts."""
    seed, m, chip, groups = case
    rows, cols = shape
    chip = replace(chip, core=replace(chip.core, macs_per_cycle=rows * cols,
                                      array=Array(rows=rows, cols=cols)))
    plan = test_emulator.make_plan(m, chip, groups)
    report = test_emulator.run_verify(m, plan, chip, seed=seed % 1000)
    test_emulator.assert_verified(report, plan, f"random_cnn seed {seed}, array {shape}")
    for g, got in zip(plan.groups, report.per_group, strict=True):
        assert (g.predicted.macs, g.predicted.array_macs) == (got.macs, got.array_macs)
        assert got.array_macs >= got.macs


def test_hidden_chunks_count_each_layer_whole(tmp_path: Path) -> None:
    # a ConvNeXt block at 16 KiB runs its MLP in hidden chunks: each layer's array MACs
    # are the whole layer's, in the model and the emulator alike
    model = models.save(models.convnext_net(channels=32), tmp_path, "convnext")
    problem = api.prepare(str(model), hardware="systolic32", overrides=["sram.bytes=16KiB"])
    plan = api.plan_problem(problem, "cpsat", "traffic")
    assert any(g.placement.mode.hidden_chunks > 1 for g in plan.groups)
    _check_verified(problem, plan)
