"""Export (annotated ONNX for Netron, Graphviz dot) and the documented `fuseplan` Python API."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import typer
from typer.testing import CliRunner

from fuseplan.planner.app import api
from fuseplan.planner.app.api import Problem
from fuseplan.planner.plan.data import Plan
from fuseplan.planner.plan.json_io import save_plan
from fuseplan.planner.ui.cli_views import register
from fuseplan.planner.ui.export import export_dot, export_onnx, render_dot

import models
from models import fusing_rules

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module", params=["inception_net", "exported_net"])
def solved(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
           ) -> tuple[Path, Path, Problem, Plan]:
    """A model with branches, and an exporter-style one (Constant nodes folded on load)."""
    tmp = tmp_path_factory.mktemp(request.param)
    proto = (models.inception_net() if request.param == "inception_net"
             else models.exported_net(13, dynamic=False))
    model = models.save(proto, tmp, request.param)
    problem = api.prepare(str(model), rules=fusing_rules(tmp))
    plan = api.plan_problem(problem, "shortest-path")
    plan_path = tmp / "plan.json"
    save_plan(plan, plan_path)
    return model, plan_path, problem, plan


def _run(path: Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def test_annotated_onnx_runs_like_the_original(solved: tuple[Path, Path, Problem, Plan],
                                               tmp_path: Path) -> None:
    model, _, problem, plan = solved
    out = tmp_path / "annotated.onnx"
    export_onnx(problem, plan, out)
    exported = onnx.load(str(out))
    onnx.checker.check_model(exported, full_check=True)
    owner = {n: g for g in plan.groups for n in g.layers}
    assert len(exported.graph.node) == len(owner)
    for node in exported.graph.node:
        props = {p.key: p.value for p in node.metadata_props}
        assert any("group" in key for key in props), node.name
        group = owner[node.name]
        assert props["fuseplan.group"] == str(group.id)
        assert props["fuseplan.tile"] == f"{group.tile.n} x {group.tile.h} x {group.tile.w}"
        assert props["fuseplan.predicted_dram_bytes"] == str(group.predicted.dram_bytes)
        assert f"fuseplan group {group.id} " in node.doc_string
    model_props = {p.key: p.value for p in exported.metadata_props}
    assert model_props["fuseplan.groups"] == str(len(plan.groups))
    original = onnx.load(str(model))
    name = original.graph.input[0].name
    x = np.random.default_rng(0).standard_normal(problem.model.inputs[name]).astype(np.float32)
    want, got = _run(model, {name: x}), _run(out, {name: x})
    assert len(want) == len(got)
    for a, b in zip(want, got, strict=True):
        np.testing.assert_array_equal(a, b)


def test_export_twice_does_not_duplicate(solved: tuple[Path, Path, Problem, Plan],
                                         tmp_path: Path) -> None:
    _, _, problem, plan = solved
    out = tmp_path / "a.onnx"
    export_onnx(problem, plan, out)
    export_onnx(problem, plan, out)
    node = onnx.load(str(out)).graph.node[0]
    keys = [p.key for p in node.metadata_props]
    assert len(keys) == len(set(keys))


def test_dot_has_one_cluster_per_fused_group(solved: tuple[Path, Path, Problem, Plan],
                                             tmp_path: Path) -> None:
    _, _, problem, plan = solved
    out = tmp_path / "plan.dot"
    export_dot(problem, plan, out)
    text = out.read_text()
    assert text.startswith("digraph ") and text.rstrip().endswith("}")
    depth = 0
    for ch in text:
        depth += {"{": 1, "}": -1}.get(ch, 0)
        assert depth >= 0
    assert depth == 0
    fused = [g for g in plan.groups if g.fused]
    assert fused, "the test plan should fuse something"
    assert text.count("subgraph cluster_") == len(fused)
    for g in fused:
        assert f"subgraph cluster_{g.id} {{" in text
    for lay in problem.graph.layers:
        assert re.search(rf'^\s*"{re.escape(lay.name)}" \[label=', text, re.M), lay.name
    assert text.count(" -> ") == problem.graph.dag.number_of_edges()
    if shutil.which("dot"):
        done = subprocess.run(["dot", "-Tsvg", str(out)], capture_output=True, timeout=60)
        assert done.returncode == 0, done.stderr


def test_dot_quotes_names() -> None:
    from fuseplan.planner.ui.export import dot_id

    assert dot_id('a"b\\c') == '"a\\"b\\\\c"'


def test_cli_export(solved: tuple[Path, Path, Problem, Plan], tmp_path: Path) -> None:
    model, plan_path, problem, plan = solved
    app = typer.Typer()
    register(app)
    out, dot = tmp_path / "x.onnx", tmp_path / "x.dot"
    result = CliRunner().invoke(app, ["export", str(model), str(plan_path), "-o", str(out),
                                      "--dot", str(dot), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc == {"onnx": str(out), "dot": str(dot), "nodes": len(problem.graph.layers),
                   "groups": len(plan.groups),
                   "fused_groups": sum(g.fused for g in plan.groups)}
    assert out.exists() and dot.read_text() == render_dot(problem, plan)
    bad = CliRunner().invoke(app, ["export", str(model), str(tmp_path / "none.json"), "-o",
                                   str(out)])
    assert bad.exit_code == 2 and "Traceback" not in bad.output


# --------------------------------------------------------------------------- Python API


def test_public_python_api(tmp_path: Path) -> None:
    import fuseplan

    for name in fuseplan.__all__:
        assert getattr(fuseplan, name) is not None, name
    for name in ("solve", "verify", "prepare", "plan_problem", "compare", "explain", "inspect",
                 "Plan", "save_plan", "load_rules", "load_chip"):
        assert name in fuseplan.__all__
    assert "fuseplan.solve(" in (fuseplan.__doc__ or "")
    model = models.save(models.chain_cnn(), tmp_path, "chain")
    plan = fuseplan.solve(str(model), rules=None, hardware="cluster4x4")
    assert isinstance(plan, fuseplan.Plan)
    assert plan.totals.dram_bytes >= plan.compulsory_dram_bytes
    path = tmp_path / "plan.json"
    fuseplan.save_plan(plan, path)
    report = fuseplan.verify(str(model), path)
    assert report.ok, report.first_counter_mismatch or report.first_output_mismatch
    assert set(fuseplan.explain(str(model), path)) >= {"boundaries", "violations"}
    assert len(fuseplan.inspect(str(model))["layers"]) == len(
        {n for g in plan.groups for n in g.layers})
    problem = fuseplan.prepare(str(model), rules=fuseplan.load_rules(None).file,
                               hardware="cluster4x4")
    assert fuseplan.load_chip("cluster4x4")[0].name == problem.chip.name
    rows = fuseplan.compare(problem)
    assert [name for name, _, _ in rows] == ["layer", "greedy", "shortest-path", "cpsat"]
