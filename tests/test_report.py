"""The HTML report: content, self-containment, the CLI, and a real headless browser.

The browser tests use Debian's chromium. When /usr/bin/chromium is missing they try to
install it (``apt-get update && apt-get install -y chromium``) and skip, saying why, only
when that is impossible (no apt-get, not root, no network).
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from fuseplan.planner.app import api
from fuseplan.planner.app.api import Problem
from fuseplan.planner.plan.data import Plan
from fuseplan.planner.plan.json_io import save_plan
from fuseplan.planner.ui.cli_views import register
from fuseplan.planner.ui.report import (
    explain_plan,
    layer_by_layer_group_bytes,
    layer_depths,
    layout,
    render_report,
    write_report,
)

import models
from models import fusing_rules

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu",
                  "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", "--no-first-run", "--enable-logging=stderr", "--v=0"]


@pytest.fixture(scope="module")
def solved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Problem, Plan]:
    """inception_net solved with CP-SAT under the default rules: model, plan file, both."""
    tmp = tmp_path_factory.mktemp("report")
    model = models.save(models.inception_net(), tmp, "inception")
    problem = api.prepare(str(model), rules=fusing_rules(tmp))
    plan = api.plan_problem(problem)
    assert any(g.fused for g in plan.groups) and len(plan.groups) > 1, plan.groups
    plan_path = tmp / "plan.json"
    save_plan(plan, plan_path)
    return model, plan_path, problem, plan


@pytest.fixture(scope="module")
def cli() -> typer.Typer:
    app = typer.Typer()
    register(app)
    return app


# --------------------------------------------------------------------------- content


def test_layout_follows_longest_paths(solved: tuple[Path, Path, Problem, Plan]) -> None:
    _, _, problem, plan = solved
    depth = layer_depths(problem.graph)
    for a, b in problem.graph.dag.edges:
        assert depth[b] > depth[a]
    concat = next(lay.name for lay in problem.graph.layers if lay.op == "Concat")
    assert depth[concat] == max(depth[p] for p in problem.graph.dag.predecessors(concat)) + 1
    placed, width, height = layout(problem.graph, plan)
    assert len({(p.x, p.y) for p in placed.values()}) == len(problem.graph.layers)
    assert all(0 <= p.x < width and 0 <= p.y < height for p in placed.values())


def test_group_baselines_add_up_to_layer_by_layer(
        solved: tuple[Path, Path, Problem, Plan]) -> None:
    _, _, problem, plan = solved
    total = sum(layer_by_layer_group_bytes(problem, g) for g in plan.groups)
    assert total == plan.layer_by_layer_dram_bytes


def test_report_shows_every_group_and_fetches_nothing(
        solved: tuple[Path, Path, Problem, Plan]) -> None:
    _, _, problem, plan = solved
    report = api.verify(str(solved[0]), solved[1])
    page = render_report(problem, plan, report, explain_plan(problem, plan))
    for g in plan.groups:
        assert f'data-group="{g.id}"' in page
        assert f'id="group-{g.id}"' in page
    for lay in problem.graph.layers:
        assert f'data-layer="{lay.name}"' in page
    assert "<svg" in page and "viewBox=" in page
    assert "emulated" in page and "compulsory floor" in page
    assert "http://" not in page and "https://" not in page
    assert "<link" not in page and "@import" not in page and "url(" not in page
    links = re.findall(r'\b(?:src|href)\s*=\s*"([^"]*)"', page)
    assert all(link.startswith("#") for link in links), links
    boundaries = explain_plan(problem, plan)["boundaries"]
    assert len(boundaries) == len(plan.groups) - 1
    for b in boundaries:
        assert f"<b>{b['next_layer']}</b>" in page
        assert all(html.escape(r) in page for r in b["reasons"])


def test_report_without_verification(solved: tuple[Path, Path, Problem, Plan],
                                     tmp_path: Path) -> None:
    _, _, problem, plan = solved
    out = tmp_path / "r.html"
    assert write_report(problem, plan, out, verify=False) is None
    page = out.read_text()
    assert "Not verified" in page
    assert 'class="bar emulated"' not in page


# --------------------------------------------------------------------------- CLI


def test_cli_report_json(cli: typer.Typer, solved: tuple[Path, Path, Problem, Plan],
                         tmp_path: Path) -> None:
    model, plan_path, _, plan = solved
    out = tmp_path / "report.html"
    result = CliRunner().invoke(cli, ["report", str(model), str(plan_path), "-o", str(out),
                                      "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["report"] == str(out) and doc["verified"] and doc["ok"]
    assert doc["groups"] == len(plan.groups)
    assert doc["verify"]["predicted_matches_emulated"]
    assert out.read_text().startswith("<!DOCTYPE html>")


def test_cli_report_no_verify_and_bad_input(cli: typer.Typer,
                                            solved: tuple[Path, Path, Problem, Plan],
                                            tmp_path: Path) -> None:
    model, plan_path, _, _ = solved
    out = tmp_path / "report.html"
    result = CliRunner().invoke(cli, ["report", str(model), str(plan_path), "-o", str(out),
                                      "--no-verify"])
    assert result.exit_code == 0, result.output
    assert "report written to" in result.stdout
    missing = CliRunner().invoke(cli, ["report", str(model), str(tmp_path / "nope.json"),
                                       "-o", str(out)])
    assert missing.exit_code == 2
    assert "no such plan file" in missing.stderr
    assert "Traceback" not in missing.output


# --------------------------------------------------------------------------- browser


def _install_chromium() -> str | None:
    """Install Debian's chromium; None on success, else why it could not be installed."""
    if shutil.which("apt-get") is None:
        return "apt-get is not available to install chromium"
    if os.geteuid() != 0:
        return "not root: cannot apt-get install chromium"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update"], ["apt-get", "install", "-y", "chromium"]):
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1200)
        except subprocess.TimeoutExpired:
            return f"`{' '.join(cmd)}` timed out"
        if done.returncode != 0:
            return f"`{' '.join(cmd)}` failed: {done.stderr.strip()[-300:]}"
    return None


@pytest.fixture(scope="session")
def chromium() -> Path:
    """Debian's chromium, installed when missing; the tests skip only if that fails."""
    if not CHROMIUM.exists():
        why = _install_chromium()
        if why is not None or not CHROMIUM.exists():
            pytest.skip(f"headless browser tests need {CHROMIUM}: {why or 'not installed'}")
    return CHROMIUM


def _browse(chromium: Path, page: Path, profile: Path, *args: str
            ) -> subprocess.CompletedProcess[str]:
    cmd = [str(chromium), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args,
           page.resolve().as_uri()]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    return done


def _check_loaded(done: subprocess.CompletedProcess[str], plan: Plan) -> str:
    dom = done.stdout
    status = re.search(r'<div id="fp-status"[^>]*>([^<]*)</div>', dom)
    assert status is not None, "status marker missing from the DOM"
    assert status.group(1) == "ok", status.group(1)
    console = [line for line in done.stderr.splitlines() if "CONSOLE" in line
               or "Uncaught" in line]
    assert not console, console
    shown = set(re.findall(r'data-group="(\d+)"', dom))
    assert shown == {str(g.id) for g in plan.groups}
    return dom


def test_report_in_headless_browser(chromium: Path, solved: tuple[Path, Path, Problem, Plan],
                                    tmp_path: Path) -> None:
    _, _, problem, plan = solved
    page = tmp_path / "report.html"
    write_report(problem, plan, page, verify=True)
    dom = _check_loaded(_browse(chromium, page, tmp_path / "profile", "--dump-dom"), plan)
    assert 'data-status="ok"' in dom  # the last script ran, after every other one
    shot = tmp_path / "report.png"
    _browse(chromium, page, tmp_path / "profile", f"--screenshot={shot}",
            "--window-size=1400,1000")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert shot.stat().st_size > 20_000  # a drawn page, not a blank one


def test_large_graph_report_in_headless_browser(chromium: Path, tmp_path: Path) -> None:
    """DenseNet-121 (668 layers), layer-by-layer plan: renders, loads, every group shown."""
    problem = api.prepare("zoo:densenet121")
    plan = api.plan_problem(problem, "layer")
    page = tmp_path / "densenet.html"
    write_report(problem, plan, page, verify=False)
    assert page.stat().st_size < 5_000_000
    text = page.read_text()
    assert 'class="graphbox"' in text and "overflow:auto" in text
    longest = max(len(m) for m in re.findall(r'class="lname">([^<]*)<', text))
    assert longest <= 18
    _check_loaded(_browse(chromium, page, tmp_path / "profile", "--dump-dom"), plan)
