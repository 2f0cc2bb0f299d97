"""`fuseplan diff`: two policies on the same net, groups split or merged, totals deltas."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from fuseplan.planner.app import api
from fuseplan.planner.plan.data import Plan
from fuseplan.planner.plan.json_io import save_plan
from fuseplan.planner.ui.cli_views import register
from fuseplan.planner.ui.diff import diff_plans

import models
from models import fusing_rules

ROOT = Path(__file__).resolve().parent.parent


def strict_rules(tmp: Path) -> Path:
    """The default rules with stride_redundancy.threshold 1 (no 3x3 chains fuse)."""
    return fusing_rules(tmp, {"stride_redundancy: {enabled: true, threshold: 4,":
                              "stride_redundancy: {enabled: true, threshold: 1,"})


@pytest.fixture(scope="module")
def two_plans(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path, Plan, Plan]:
    """inception_net planned under the default rules (A) and the strict variant (B)."""
    tmp = tmp_path_factory.mktemp("diff")
    model = models.save(models.inception_net(), tmp, "inception")
    plan_a = api.solve(str(model), rules=fusing_rules(tmp))
    plan_b = api.solve(str(model), rules=strict_rules(tmp))
    path_a, path_b = tmp / "a.json", tmp / "b.json"
    save_plan(plan_a, path_a)
    save_plan(plan_b, path_b)
    return model, path_a, path_b, plan_a, plan_b


def _layers(plan: Plan, ids: list[int]) -> set[str]:
    return {n for g in plan.groups if g.id in ids for n in g.layers}


def test_stricter_rule_splits_groups(two_plans: tuple[Path, Path, Path, Plan, Plan]) -> None:
    _, _, _, a, b = two_plans
    doc = diff_plans(a, b)
    assert doc["changed"]
    assert doc["split"], "threshold 1 should split at least one fused group"
    for s in doc["split"]:
        assert len(s["into"]) > 1
        assert _layers(a, [s["a"]]) <= _layers(b, s["into"])
    for m in doc["merged"]:
        assert _layers(b, [m["b"]]) <= _layers(a, m["from"])
    split_ids = {s["a"] for s in doc["split"]}
    assert split_ids <= set(doc["only_in_a"])
    same_layers = {frozenset(g.layers) for g in a.groups} & {frozenset(g.layers)
                                                            for g in b.groups}
    assert len(doc["same"]) == len(same_layers)
    assert len(doc["only_in_a"]) + len(doc["same"]) == len(a.groups)
    assert len(doc["only_in_b"]) + len(doc["same"]) == len(b.groups)
    t = doc["totals"]
    assert t["dram_bytes"] == {"a": a.totals.dram_bytes, "b": b.totals.dram_bytes,
                               "delta": b.totals.dram_bytes - a.totals.dram_bytes,
                               "ratio": round(b.totals.dram_bytes / a.totals.dram_bytes, 6)}
    assert t["cycles"]["delta"] == b.totals.cycles - a.totals.cycles
    assert t["energy_pj"]["delta"] == pytest.approx(b.totals.energy_pj - a.totals.energy_pj,
                                                    abs=1e-2)
    assert t["groups"]["delta"] == len(b.groups) - len(a.groups) > 0
    assert t["dram_bytes"]["delta"] >= 0  # A is optimal under looser rules


def test_reverse_diff_merges(two_plans: tuple[Path, Path, Path, Plan, Plan]) -> None:
    _, _, _, a, b = two_plans
    forward, backward = diff_plans(a, b), diff_plans(b, a)
    assert [(s["a"], s["into"]) for s in forward["split"]] == \
        [(m["b"], m["from"]) for m in backward["merged"]]
    assert backward["totals"]["dram_bytes"]["delta"] == -forward["totals"]["dram_bytes"]["delta"]


def test_plan_against_itself(two_plans: tuple[Path, Path, Path, Plan, Plan]) -> None:
    _, _, _, a, _ = two_plans
    doc = diff_plans(a, a)
    assert not doc["changed"]
    assert doc["split"] == doc["merged"] == doc["regrouped"] == []
    assert doc["only_in_a"] == doc["only_in_b"] == []
    assert all(row["delta"] == 0 for row in doc["totals"].values())


def test_regrouping_on_a_chain(tmp_path: Path) -> None:
    model = models.save(models.chain_cnn(), tmp_path, "chain")
    a = api.solve(str(model), rules=fusing_rules(tmp_path))
    b = api.solve(str(model), rules=strict_rules(tmp_path))
    doc = diff_plans(a, b)
    assert doc["changed"] and (doc["split"] or doc["merged"])
    for r in doc["regrouped"]:
        assert _layers(a, r["a"]) == _layers(b, r["b"])


def test_cli_diff(two_plans: tuple[Path, Path, Path, Plan, Plan], tmp_path: Path) -> None:
    model, path_a, path_b, a, b = two_plans
    app = typer.Typer()
    register(app)
    result = CliRunner().invoke(app, ["diff", str(model), str(path_a), str(path_b), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["split"] == diff_plans(a, b)["split"]
    table = CliRunner().invoke(app, ["diff", str(model), str(path_a), str(path_b)])
    assert table.exit_code == 0, table.output
    assert "split" in table.stdout  # the totals' DRAM row in human bytes
    assert re.search(r"^dram +-?[\d.,]+ (B|KiB|MiB) +-?[\d.,]+ (B|KiB|MiB)", table.stdout, re.M), \
        table.stdout
    other = models.save(models.chain_cnn(), tmp_path, "chain")
    wrong = CliRunner().invoke(app, ["diff", str(other), str(path_a), str(path_b)])
    assert wrong.exit_code == 2
    assert "different model" in wrong.stderr and "Traceback" not in wrong.output


def test_diff_takes_the_model_from_the_plan(tmp_path: Path) -> None:
    """`fuseplan diff PLAN_A PLAN_B` reads the model named in PLAN_A."""
    import subprocess
    import sys

    from fuseplan.planner.plan.json_io import save_plan

    model = models.save(models.inception_net(), tmp_path, "inc")
    for name, solver in (("a", "cpsat"), ("b", "layer")):
        save_plan(api.solve(str(model), rules=fusing_rules(tmp_path), solver=solver),
                  tmp_path / f"{name}.json")
    exe = str(Path(sys.executable).with_name("fuseplan"))
    run = subprocess.run([exe, "diff", str(tmp_path / "a.json"), str(tmp_path / "b.json"),
                          "--json"], capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr
    doc = json.loads(run.stdout)
    assert doc["split"], doc  # the layer plan splits every fused group of the CP-SAT plan
