"""Inputs loaded again after a stretch (planner.geometry.reload): less SRAM, more DRAM reads,
both exactly as predicted; plan files state it and refuse it where it cannot run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hand import assert_verifies, hand_plan
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_hidden import _save, mlp_model
from typer.testing import CliRunner

from fuseplan.planner.app import api
from fuseplan.planner.geometry.regions import Tile, group_io
from fuseplan.planner.geometry.reload import reloaded_inputs
from fuseplan.planner.plan.json_io import save_plan
from fuseplan.planner.plan.placement import Placement
from fuseplan.planner.ui.cli import app


def _all(problem: api.Problem) -> tuple[str, ...]:
    return tuple(lay.name for lay in problem.graph.layers)


def test_the_block_input_read_by_the_norm_and_the_residual_add_is_reloaded(
        tmp_path: Path) -> None:
    problem = api.prepare(_save(mlp_model(), tmp_path))
    g = problem.graph
    layers = _all(problem)
    assert reloaded_inputs(g, group_io(g, layers)) == {"x": (0, len(layers) - 1)}
    # without the residual add nothing is read after the stretch; without the norm, x is
    # read before no stretch
    assert reloaded_inputs(g, group_io(g, layers[:-1])) == {}
    assert reloaded_inputs(g, group_io(g, layers[1:])) == {}


@pytest.mark.parametrize(("th", "chunks", "resident"), [(24, 2, True), (8, 3, False),
                                                        (5, 4, True)])
def test_reloading_trades_sram_for_exactly_the_input_read_again(
        tmp_path: Path, th: int, chunks: int, resident: bool) -> None:
    """The same tiles with x held and with x loaded again: the reloading plan reads every
    tile's box of x once more (the whole input: its token tiles do not overlap) and holds
    one box less while the stretch runs; both verify, every counter as predicted."""
    problem = api.prepare(_save(mlp_model(tokens=24, width=8, hidden=96), tmp_path))
    g = problem.graph
    layers = _all(problem)
    n, _, _, w = g.dims(group_io(g, layers).anchor)
    plans = [hand_plan(problem, [Placement.of(layers, Tile(n, th, w), resident,
                                              hidden_chunks=chunks, inputs_reloaded=r)])
             for r in (False, True)]
    held, again = (p.groups[0].predicted for p in plans)
    dt = problem.chip.dtype_bytes
    assert again.dram_read_bytes - held.dram_read_bytes == g.elems("x") * dt
    assert again.sram_peak_bytes < held.sram_peak_bytes
    for plan in plans:
        assert_verifies(problem, plan)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tokens=st.integers(6, 30), width=st.sampled_from([4, 8, 12]),
       hidden=st.sampled_from([16, 24, 40]), th=st.integers(1, 30),
       chunks=st.sampled_from([2, 3, 4]), resident=st.booleans(),
       hardware=st.sampled_from([None, "soma_buffer"]))
def test_random_mlps_verify_held_and_reloaded(tmp_path_factory: pytest.TempPathFactory,
                                              tokens: int, width: int, hidden: int, th: int,
                                              chunks: int, resident: bool,
                                              hardware: str | None) -> None:
    """Any token tile, chunk count and residency, on a chip with WRAM and on a single-memory
    chip: both plans verify (outputs, every counter, the peak) and the reloading one reads
    exactly the input once more and never holds more."""
    tmp = tmp_path_factory.mktemp("mlp")
    problem = api.prepare(_save(mlp_model(tokens=tokens, width=width, hidden=hidden), tmp),
                          hardware=hardware)
    g = problem.graph
    layers = _all(problem)
    n, _, _, w = g.dims(group_io(g, layers).anchor)
    plans = [hand_plan(problem, [Placement.of(layers, Tile(n, min(th, tokens), w), resident,
                                              hidden_chunks=chunks, inputs_reloaded=r)])
             for r in (False, True)]
    held, again = (p.groups[0].predicted for p in plans)
    assert again.dram_read_bytes - held.dram_read_bytes == g.elems("x") * problem.chip.dtype_bytes
    assert again.sram_peak_bytes <= held.sram_peak_bytes
    for plan in plans:
        assert_verifies(problem, plan)


def test_the_planner_reloads_where_holding_the_input_fits_no_tile(tmp_path: Path) -> None:
    """An MLP on a 24 KiB SRAM whose weights stream (1 KiB of WRAM): its hidden chunks fit
    beside all 64 tokens only when the block input is not held across them. With reloading
    the planner runs it as one group (x read twice, the weights once); with
    `search.reload_inputs` off the residual add runs on its own and the MLP's output goes
    through DRAM."""
    path = _save(mlp_model(tokens=64, width=64, hidden=256), tmp_path)
    chip = ["sram.bytes=24KiB", "wram.bytes=1KiB", "clusters=1"]
    default = Path("rules/default.yaml").read_text()
    # CP-SAT solves (rather than certifying the shortest path): the pinned choice encoded
    solving = tmp_path / "solving.yaml"
    solving.write_text(default.replace("exact_path_first: true", "exact_path_first: false"))
    on = api.prepare(path, rules=str(solving), overrides=chip)
    plan = api.plan_problem(on, "cpsat")
    assert "solved_by" not in plan.solver and plan.solver["status"] == "OPTIMAL"
    reloaded = [g for g in plan.groups if g.placement.inputs_reloaded]
    assert reloaded, [(g.layers, g.tile) for g in plan.groups]
    assert_verifies(on, plan)
    assert plan.totals.dram_bytes == api.plan_problem(
        api.prepare(path, overrides=chip), "shortest-path").totals.dram_bytes
    rules = tmp_path / "rules.yaml"
    rules.write_text(default.replace("reload_inputs: true", "reload_inputs: false"))
    off = api.plan_problem(api.prepare(path, rules=str(rules), overrides=chip), "cpsat")
    assert not any(g.placement.inputs_reloaded for g in off.groups)
    assert len(plan.groups) < len(off.groups)
    assert plan.totals.dram_bytes < off.totals.dram_bytes


def test_plan_files_state_reloads_and_refuse_them_where_they_cannot_run(
        tmp_path: Path) -> None:
    model = _save(mlp_model(), tmp_path)
    problem = api.prepare(model)
    layers = _all(problem)
    n, _, _, w = problem.graph.dims(group_io(problem.graph, layers).anchor)
    plan = hand_plan(problem, [Placement.of(layers, Tile(n, 8, w), True, hidden_chunks=2,
                                            inputs_reloaded=True)])
    good = tmp_path / "plan.json"
    save_plan(plan, good)
    doc = json.loads(good.read_text())
    assert doc["groups"][0]["inputs_reloaded"] is True
    runner = CliRunner()
    ok = runner.invoke(app, ["verify", model, str(good)])
    assert ok.exit_code == 0, ok.stdout
    explained = runner.invoke(app, ["explain", model, str(good)])  # rechecks the group
    assert explained.exit_code == 0, explained.stdout

    def edited(name: str, **keys: object) -> Path:
        bad = json.loads(good.read_text())
        bad["groups"][0].update(keys)
        path = tmp_path / name
        path.write_text(json.dumps(bad))
        return path

    cases: list[tuple[str, dict[str, object], str]] = [
        ("db.json", {"double_buffered": True}, "double_buffered"),
        ("whole.json", {"hidden_chunks": 1}, "hidden_chunks"),
    ]
    for name, keys, says in cases:
        res = runner.invoke(app, ["verify", model, str(edited(name, **keys))])
        text = res.stdout + res.stderr
        assert res.exit_code == 2, (name, text)
        assert "inputs_reloaded" in text and says in text, text
        assert "Traceback" not in text
