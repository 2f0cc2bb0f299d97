"""Sweeps (planner.app.sweep): the SPEC file, points and their content addresses, resuming,
Ray (a worker killed mid-sweep, a second node), monotone capacity curves, bisection for a
target, the results table and the HTML report.

The model is a 16x16 chain CNN on the single-memory `frustum_npu` chip with the greedy
planner: from 2 KiB to 64 KiB of SRAM its DRAM traffic falls from 6.7x the floor to 1.34x,
and a point plans in about a second.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import ray
from typer.testing import CliRunner

from fuseplan.planner.app import sweep
from fuseplan.planner.app.sweep import (
    Job,
    Outcome,
    RayRunner,
    SweepInterrupted,
    driver,
    load_spec,
    parse_target,
    run_sweep,
    search,
    solve_point,
)
from fuseplan.planner.app.sweep.keys import code_version
from fuseplan.planner.app.sweep.rows import SOLVED, blank_row, plan_row
from fuseplan.planner.app.sweep.store import Store
from fuseplan.planner.app.sweep.table import read_table
from fuseplan.planner.core.errors import InputError
from fuseplan.planner.core.files import write_atomic
from fuseplan.planner.ui.cli import app
from fuseplan.planner.ui.sweep_report import (
    smallest_serving_bisected,
    sweep_html,
    write_sweep_report,
)
from tests.interrupt import as_foreground_job

import models

# every test here may start a local Ray cluster: under pytest-xdist they share one worker
pytestmark = pytest.mark.xdist_group("ray")

REPO = Path(__file__).resolve().parents[1]
SIZES = ["2KiB", "4KiB", "8KiB", "16KiB", "32KiB", "64KiB"]
REQUIRED = ("model", "chip", "rules", "solver", "objective", "status", "gap", "dram_bytes",
            "compulsory_dram_bytes", "layer_by_layer_dram_bytes", "x_floor", "cycles",
            "energy_pj", "solve_s", "verified", "plan")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with the chain model (specs written next to it name it relatively)."""
    folder = tmp_path_factory.mktemp("sweep_models")
    models.save(models.chain_cnn(h=16, w=16), folder, "chain")
    models.save(models.chain_cnn(seed=1, h=16, w=16), folder, "chain_b")
    return folder


def write_spec(folder: Path, text: str, name: str = "spec.yaml") -> Path:
    path = folder / name
    path.write_text(text)
    return path


def capacity_spec(folder: Path, sizes: Sequence[str] = SIZES, models_: str = "[chain.onnx]",
                  name: str = "spec.yaml") -> Path:
    return write_spec(folder, f"""\
models: {models_}
chips:
  - hw: frustum_npu
    sweep: {{sram.bytes: [{", ".join(sizes)}]}}
solvers: [greedy]
""", name)


class CountingRunner:
    """A serial runner that records which points it planned (and can be interrupted)."""

    def __init__(self, stop_after: int | None = None) -> None:
        self.planned: list[Job] = []
        self.stop_after = stop_after

    def run(self, calls: Sequence[sweep.Call]) -> Iterator[tuple[int, Outcome | sweep.Failure]]:
        for i, (fn, args) in enumerate(calls):
            if self.stop_after is not None and len(self.planned) >= self.stop_after:
                raise KeyboardInterrupt
            self.planned.append(args[0])
            yield i, fn(*args)


# --------------------------------------------------------------------------- spec


def test_cross_product_expands_every_axis_in_order(model_dir: Path) -> None:
    spec = load_spec(write_spec(model_dir, """\
models: [chain.onnx, {model: chain_b.onnx, batch: [1, 2]}]
chips:
  - hw: frustum_npu
    name: npu
    set: {dram.bandwidth_gbps: 64}
    sweep: {sram.bytes: [4KiB, 8KiB], clusters: [1, 2]}
solvers: [greedy, layer]
objectives: [traffic]
time_limit: 5
"""))
    points = sweep.expand(spec)
    assert len(points) == 3 * 2 * 2 * 2  # model bindings x sram x clusters x solvers
    assert spec.axis_keys == ("sram.bytes", "clusters") and spec.batched
    first = points[0]
    assert first.overrides == ("dram.bandwidth_gbps=64", "sram.bytes=4KiB", "clusters=1")
    assert (first.chip, first.solver, first.time_limit) == ("npu", "greedy", 5.0)
    assert [p.solver for p in points[:2]] == ["greedy", "layer"]  # solvers vary fastest
    batched = [p.model for p in points if p.model.batch is not None]
    assert {m.batch for m in batched} == {1, 2}
    assert dict(batched[-1].shapes)["input"] == (2, 3, 16, 16)
    jobs = sweep.address(points)
    assert [j.value("sram.bytes") for j in jobs[:4:2]] == [4096, 4096]
    assert jobs[4].value("sram.bytes") == 8192  # the chip's value, in bytes


def test_explicit_points_make_their_set_keys_columns(model_dir: Path) -> None:
    spec = load_spec(write_spec(model_dir, """\
points:
  - {model: chain.onnx, hw: frustum_npu, set: {sram.bytes: 4KiB}, solver: greedy}
  - {model: chain.onnx, hw: frustum_npu, set: {sram.bytes: 8KiB, clusters: 2}}
"""))
    assert spec.axis_keys == ("sram.bytes", "clusters")
    assert [p.solver for p in spec.points] == ["greedy", "cpsat"]
    assert spec.points[1].overrides == ("sram.bytes=8KiB", "clusters=2")


@pytest.mark.parametrize(("text", "place", "message"), [
    ("models: [chain.onnx]\nsolver: [greedy]\n", ":2:1:", "unknown key `solver`.*Did you mean "
     "'solvers'"),
    ("models: [chain.onnx]\nsolvers: [greedy, cp-sat]\n", ":2:19:", "unknown solver 'cp-sat'"),
    ("models: [chain.onnx]\nchips:\n  - hw: frustum_npu\n    sweep: {sram.byts: [4KiB]}\n",
     ":3:5:", "unknown key `byts`.*Did you mean 'bytes'"),
    ("models: [chain.onnx]\nchips:\n  - hw: frustum_npu\n    sweep: {sram.bytes: [4KiB, "
     "lots]}\n", ":3:5:", "`bytes` must be a size"),
    ("models: [chain.onnx, missing.onnx]\n", ":1:22:", "does not exist"),
    ("models: [zoo:squeezenat]\n", ":1:10:", "Did you mean 'zoo:squeezenet'"),
    ("chips: [frustum_npu]\n", ":1:1:", "no `models:`"),
    ("models: [chain.onnx]\nchips:\n  - hw: frustum_npu\n    sweep: {sram.bytes: 4KiB}\n"
     "time_limit: -1\n", ":5:13:", "positive number of seconds"),
    ("models: [chain.onnx]\nobjectives: traffik\n", ":2:13:", "unknown objective 'traffik'"),
    ("models: [chain.onnx]\nrules: [null, nowhere.yaml]\n", ":2:15:", "not found"),
    ("models: [chain.onnx\n", ":2:1:", ""),
    ("points:\n  - {model: chain.onnx, objective: traffik}\n", ":2:36:",
     "unknown objective 'traffik'"),
    ("points:\n  - {model: chain.onnx, solver: [greedy, layer]}\n", ":2:33:",
     "a point's `solver` must be one value"),
    ("points:\n  - {model: chain.onnx, rules: [null]}\n", ":2:32:",
     "a point's `rules` must be one value"),
    ("models: [chain.onnx]\nchips:\n  - hw: frustum_npu\n    set: {clusters: 2}\n"
     "  - hw: frustum_npu\n", ":5:5:", "second chip entry labelled 'frustum_npu' \\(the first "
     "is at .*bad.yaml:3:5\\)\\. Add `name:`"),
    ("models: [chain.onnx]\nchips:\n  - hw: frustum_npu\n    sweep: {sram.bytes: [4KiB, "
     "4096]}\nsolvers: [greedy]\n", ":4:32:", "same planning problem as the one at "
     ".*bad.yaml:4:26"),
    (f"models: [chain.onnx]\nrules: [null, {REPO}/rules/default.yaml]\n", ":2:15:",
     "same planning problem as the one at .*bad.yaml:2:9"),
])
def test_bad_spec_exits_2_naming_line_and_column(model_dir: Path, tmp_path: Path, text: str,
                                                 place: str, message: str) -> None:
    spec = write_spec(model_dir, text, "bad.yaml")
    result = CliRunner().invoke(app, ["sweep", str(spec), "--out", str(tmp_path), "--serial",
                                      "--json"])
    assert result.exit_code == 2, result.output
    first = " ".join(result.stderr.split())
    assert f"bad.yaml{place}" in first, first
    assert re.search(message, first), first
    assert "Traceback" not in result.output
    error = json.loads(result.stdout)["error"]  # the one document: the error
    assert error["kind"] == "bad_input" and error["where"].endswith(f"bad.yaml{place[:-1]}"), \
        error


def test_bad_target_is_an_input_error() -> None:
    assert parse_target(" x_floor <= 1.1 ") == sweep.Target("x_floor", "<=", 1.1)
    for text in ("x_flor<=1.1", "x_floor=1.1", "x_floor<=big"):
        with pytest.raises(InputError, match="METRIC OP NUMBER"):
            parse_target(text)


# --------------------------------------------------------------------------- addresses


def test_content_address_is_what_decides_the_plan(model_dir: Path, tmp_path: Path) -> None:
    def key(sram: str, rules: str | None = None, solver: str = "greedy",
            folder: Path = model_dir) -> str:
        rules_line = f"rules: [{rules}]\n" if rules else ""
        path = write_spec(folder, f"models: [{model_dir / 'chain.onnx'}]\nchips:\n  - hw: "
                          f"frustum_npu\n    sweep: {{sram.bytes: [{sram}]}}\n"
                          f"solvers: [{solver}]\n" + rules_line, "key.yaml")
        return sweep.address(load_spec(path).points)[0].key

    base = key("4KiB")
    assert key("4096") == base  # same chip after overrides: same address
    assert key("4KiB", folder=tmp_path) == base  # wherever the spec lives
    assert key("8KiB") != base and key("4KiB", solver="layer") != base
    rules = tmp_path / "rules.yaml"
    shutil.copy(REPO / "rules" / "default.yaml", rules)
    assert key("4KiB", str(rules)) == base  # the default rules' content, another path
    rules.write_text(rules.read_text() + "\n# edited\n")
    assert key("4KiB", str(rules)) != base
    doc = sweep.content_key("m", (), {"a": 1}, "r", "greedy", "traffic", None, "1.0")
    assert doc != sweep.content_key("m", (), {"a": 1}, "r", "greedy", "traffic", None, "1.1")


def test_the_address_changes_with_the_planning_code(tmp_path: Path) -> None:
    """From a source tree (pyproject.toml beside the packages) the code's digest is part of
    the address: a point planned before an edit to the planner is not taken as finished."""
    (tmp_path / "planner").mkdir()
    code = tmp_path / "planner" / "cost.py"
    code.write_text("BYTES = 1\n")
    assert sweep.source_digest(tmp_path) is None  # an installed package: the version alone
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'fuseplan'\n")
    before = sweep.source_digest(tmp_path)
    (tmp_path / "planner" / "notes.txt").write_text("not code")
    assert sweep.source_digest(tmp_path) == before
    code.write_text("BYTES = 2\n")
    assert before is not None and sweep.source_digest(tmp_path) != before
    assert sweep.source_digest(REPO) is not None  # this checkout is a source tree
    assert "+src." in code_version()


# --------------------------------------------------------------------------- resume


def test_resume_skips_finished_points_and_an_interrupt_keeps_them(model_dir: Path,
                                                                   tmp_path: Path) -> None:
    spec = load_spec(capacity_spec(model_dir, SIZES[:4]))
    stopping = CountingRunner(stop_after=2)
    with pytest.raises(SweepInterrupted) as stop:
        run_sweep(spec, tmp_path, stopping)
    assert stop.value.result.points == 2
    assert not list(tmp_path.rglob(".*.tmp"))
    assert len(read_table(tmp_path / "sweep.parquet")) == 2

    again = CountingRunner()
    result = run_sweep(spec, tmp_path, again, resume=True)
    assert [j.value("sram.bytes") for j in again.planned] == [8192, 16384]  # only the rest
    assert (result.points, result.skipped, result.done) == (4, 2, 4)

    verifying = CountingRunner()  # rows planned without --verify do not count as finished
    run_sweep(load_spec(capacity_spec(model_dir, SIZES[:1], name="one.yaml")), tmp_path,
              verifying, resume=True, verify=True)
    assert len(verifying.planned) == 1 and read_table(tmp_path / "sweep.parquet")[0]["verified"]

    third = CountingRunner()
    # the verifying run replaced the 2 KiB plan (and deleted the one it replaced, unless the
    # new document is the same text: plan files are named by their digest)
    now = read_table(tmp_path / "sweep.parquet")[0]["plan"]
    assert now == result.rows[0].plan or not (tmp_path / result.rows[0].plan).exists()
    (tmp_path / now).unlink()  # not finished
    run_sweep(spec, tmp_path, third, resume=True)
    assert [j.value("sram.bytes") for j in third.planned] == [2048]
    table = read_table(tmp_path / "sweep.parquet")
    assert len({r["key"] for r in table}) == len(table) == 4


def test_resumed_rows_take_the_current_specs_labels(model_dir: Path, tmp_path: Path) -> None:
    """Only results come from disk: the same content under another path or chip name is
    relabelled, not shown under the old one."""
    spec = load_spec(write_spec(model_dir, "models: [chain.onnx]\nchips:\n  - hw: frustum_npu\n"
                                "    name: old-name\n    sweep: {sram.bytes: [4KiB, 8KiB]}\n"
                                "solvers: [greedy]\n", "labels.yaml"))
    run_sweep(spec, tmp_path / "out")
    moved = tmp_path / "moved"
    moved.mkdir()
    shutil.copy(model_dir / "chain.onnx", moved / "renamed.onnx")
    again = load_spec(write_spec(moved, "models: [renamed.onnx]\nchips:\n  - hw: frustum_npu\n"
                                 "    name: new-name\n    sweep: {sram.bytes: [4KiB, 8KiB]}\n"
                                 "solvers: [greedy]\n", "labels.yaml"))
    runner = CountingRunner()
    result = run_sweep(again, tmp_path / "out", runner, resume=True)
    assert runner.planned == [] and result.skipped == 2  # same content: nothing planned
    table = read_table(tmp_path / "out" / "sweep.parquet")
    assert {r["chip"] for r in table} == {"new-name"}
    assert {r["model"] for r in table} == {str(moved / "renamed.onnx")}


def test_what_resume_takes_as_finished(model_dir: Path, tmp_path: Path) -> None:
    """A plan whose file parses, or an infeasible point, is finished; an errored point or a
    plan file that does not parse is planned again; a stale plan file is deleted."""
    spec = load_spec(capacity_spec(model_dir, SIZES[:4], name="finished.yaml"))
    first = run_sweep(spec, tmp_path)
    jobs = sweep.address(spec.points)
    store = Store(tmp_path)
    old_plan = tmp_path / first.rows[0].plan
    infeasible = replace(first.rows[0], status="infeasible", dram_bytes=None, plan="",
                         error="no grouping fits")
    store.put(jobs[0], Outcome(infeasible))
    assert not old_plan.exists()  # the new outcome has no plan: the old one is stale
    store.put(jobs[1], Outcome(replace(first.rows[1], status="error", plan="", error="bug")))
    (tmp_path / first.rows[2].plan).write_text("{not json")
    runner = CountingRunner()
    result = run_sweep(spec, tmp_path, runner, resume=True)
    assert [j.value("sram.bytes") for j in runner.planned] == [4096, 8192]
    assert result.rows[0].status == "infeasible" and result.skipped == 2
    assert {r.status for r in result.rows[1:]} <= set(SOLVED)
    plans = sorted(p.name for p in (tmp_path / "plans").iterdir())
    assert plans == sorted(Path(r.plan).name for r in result.rows[1:])  # no stale file left


# --------------------------------------------------------------------------- monotone curves


def test_a_larger_capacity_never_moves_more_bytes(model_dir: Path, tmp_path: Path) -> None:
    """A 16 KiB point made worse than 8 KiB's (its stored plan replaced by the layer-by-layer
    plan) is repaired on resume: 8 KiB's plan, re-costed on the 16 KiB chip, and verified."""
    from fuseplan.planner.app import api
    from fuseplan.planner.plan.json_io import plan_to_json

    spec = load_spec(capacity_spec(model_dir, SIZES[1:4]))
    first = run_sweep(spec, tmp_path, verify=True)
    worse_job = sweep.address(spec.points)[2]
    problem = api.prepare(str(model_dir / "chain.onnx"), None, "frustum_npu", {},
                          ["sram.bytes=16KiB"])
    layer = api.plan_problem(problem, "layer")
    worse = plan_row(worse_job, layer, True)  # the layer-by-layer plan is a valid plan
    assert worse.dram_bytes is not None and first.rows[1].dram_bytes is not None
    assert worse.dram_bytes > first.rows[1].dram_bytes
    Store(tmp_path).put(worse_job, Outcome(worse, plan_to_json(layer)))

    result = run_sweep(spec, tmp_path, resume=True, verify=True)
    rows = result.rows
    assert result.repaired == 1 and rows[2].monotone == "re-costed from sram.bytes=8192"
    assert rows[2].dram_bytes == rows[1].dram_bytes and rows[2].status == "RECOSTED"
    assert rows[2].verified is True  # the re-costed plan holds on the larger chip
    bytes_ = [r.dram_bytes or 0 for r in rows]
    assert bytes_ == sorted(bytes_, reverse=True)
    plan = json.loads((tmp_path / rows[2].plan).read_text())
    assert plan["hardware"]["spec"]["sram"]["bytes"] == 16384
    # the re-costed plan went to a new file before the row named it; the layer plan is gone
    assert rows[2].plan != first.rows[2].plan and len(list((tmp_path / "plans").iterdir())) == 3


def test_a_repair_that_fails_is_marked_and_warned(model_dir: Path, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from fuseplan.planner.app import api
    from fuseplan.planner.plan.json_io import plan_to_json

    spec = load_spec(capacity_spec(model_dir, SIZES[1:3], name="fails.yaml"))
    run_sweep(spec, tmp_path)
    jobs = sweep.address(spec.points)
    problem = api.prepare(str(model_dir / "chain.onnx"), None, "frustum_npu", {},
                          ["sram.bytes=8KiB"])
    layer = api.plan_problem(problem, "layer")
    Store(tmp_path).put(jobs[1], Outcome(plan_row(jobs[1], layer, None),
                                                plan_to_json(layer)))

    def broken(job: Job, smaller: Any, source: str, verify: bool = False) -> Outcome:
        return Outcome(blank_row(job, "error", f"re-costing the plan of {source}: boom"))

    monkeypatch.setattr(search, "recost_point", broken)  # where the repair finds it
    result = run_sweep(spec, tmp_path, resume=True)
    assert result.repaired == 0
    assert result.rows[1].monotone.startswith("not monotone: re-costing the plan of "
                                              "sram.bytes=4096: boom")
    assert result.rows[1].status == "OPTIMAL" or result.rows[1].ok  # its own plan is kept
    assert len(result.warnings) == 1 and "boom" in result.warnings[0]


def test_a_curve_is_in_order_only_if_no_worse_in_bytes_and_objective(model_dir: Path) -> None:
    """For latency (and energy) a larger capacity whose plan is faster but moves more DRAM
    bytes is out of order: the DRAM curve is what every objective promises."""
    job = sweep.address(load_spec(capacity_spec(model_dir, ["4KiB"], name="order.yaml")).points)[0]
    small = replace(blank_row(job, "OPTIMAL"), objective="latency", dram_bytes=1000,
                    cycles=500, energy_pj=9.0)
    assert sweep.in_order(replace(small, dram_bytes=900, cycles=400), small)
    assert not sweep.in_order(replace(small, dram_bytes=1100, cycles=400), small)
    assert not sweep.in_order(replace(small, dram_bytes=900, cycles=600), small)
    assert not sweep.in_order(replace(small, status="infeasible"), small)


def test_every_curve_of_a_sweep_is_non_increasing(model_dir: Path, tmp_path: Path) -> None:
    spec = load_spec(capacity_spec(model_dir, SIZES, "[chain.onnx, chain_b.onnx]"))
    result = run_sweep(spec, tmp_path)
    curves = sweep.curves(sweep.address(spec.points), "sram.bytes")
    by_key = {r.key: r for r in result.rows}
    assert len(curves) == 2
    for curve in curves:
        traffic = [by_key[j.key].dram_bytes for j in curve]
        assert all(a is not None and b is not None and b <= a
                   for a, b in zip(traffic, traffic[1:], strict=False)), traffic
        assert traffic[0] != traffic[-1]  # the curve does fall


# --------------------------------------------------------------------------- Ray


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    """A local Ray of 2 CPUs for this module's tests, stopped after them: its own session
    folder (not the shared /tmp/ray) and no dashboard."""
    temp = tempfile.mkdtemp(prefix="fuseplan-ray-")
    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _temp_dir=temp)
    yield
    ray.shutdown()
    shutil.rmtree(temp, ignore_errors=True)


def crash_once(job: Job, verify: bool) -> Outcome:
    """The 8 KiB point's first attempt kills its worker process (a marker file says it did)."""
    marker = Path(job.point.model.model).parent / "crashed"
    if job.value("sram.bytes") == 8192 and not marker.exists():
        marker.write_text(str(os.getpid()))
        os._exit(1)
    return solve_point(job, verify)


def raise_at_4k(job: Job, verify: bool) -> Outcome:
    """A planner bug at the 4 KiB point (the task raises; it is not retried)."""
    if job.value("sram.bytes") == 4096:
        raise ValueError("a planner bug")
    return solve_point(job, verify)


def on_node(job: Job, verify: bool) -> Outcome:
    """Plan the point and note the Ray node that ran it."""
    node = ray.get_runtime_context().get_node_id()
    (Path(job.point.model.model).parent / "nodes").mkdir(exist_ok=True)
    (Path(job.point.model.model).parent / "nodes" / node).write_text("")
    return solve_point(job, verify)


def _by_value(fn: Any) -> None:
    """Ray workers cannot import this test module: ship its functions by value."""
    import ray.cloudpickle

    ray.cloudpickle.register_pickle_by_value(sys.modules[fn.__module__])


def test_a_worker_killed_mid_sweep_is_retried(local_ray: None, tmp_path: Path) -> None:
    models.save(models.chain_cnn(h=16, w=16), tmp_path, "chain")
    spec = load_spec(capacity_spec(tmp_path, SIZES[:4]))
    _by_value(crash_once)
    result = run_sweep(spec, tmp_path / "out", RayRunner(), task=crash_once)
    marker = tmp_path / "crashed"
    assert marker.exists()  # a worker did die
    assert (result.points, result.done, result.failed) == (4, 4, 0)
    table = read_table(tmp_path / "out" / "sweep.parquet")
    assert sorted(r["sram.bytes"] for r in table) == [2048, 4096, 8192, 16384]
    assert len({r["key"] for r in table}) == 4  # no duplicate rows
    assert len(list((tmp_path / "out" / "rows").iterdir())) == 4


def test_a_task_that_raises_is_an_errored_row_and_counted(local_ray: None,
                                                          tmp_path: Path) -> None:
    models.save(models.chain_cnn(h=16, w=16), tmp_path, "chain")
    spec = load_spec(capacity_spec(tmp_path, SIZES[:3]))
    _by_value(raise_at_4k)
    result = run_sweep(spec, tmp_path / "out", RayRunner(), task=raise_at_4k)
    assert [r.status for r in result.rows][1] == "error"
    assert (result.done, result.errored) == (2, 1)
    assert result.first_error.startswith("ValueError: a planner bug"), result.first_error
    serial = run_sweep(spec, tmp_path / "serial", task=raise_at_4k)  # the same in-process
    assert serial.errored == 1 and serial.first_error.startswith("ValueError: a planner bug")


@pytest.mark.slow
def test_a_sweep_runs_across_two_ray_nodes(tmp_path: Path) -> None:
    from ray._common.utils import get_ray_address_file
    from ray.cluster_utils import Cluster

    ray.shutdown()
    temp = tempfile.mkdtemp(prefix="fuseplan-ray-")
    # Cluster writes the head's address to the default temp dir's ray_current_cluster
    # whatever temp_dir says, and fails where no Ray has run on the machine yet
    Path(get_ray_address_file(None)).parent.mkdir(parents=True, exist_ok=True)
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "include_dashboard": False, "temp_dir": temp})
    try:
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        models.save(models.chain_cnn(h=16, w=16), tmp_path, "chain")
        spec = load_spec(capacity_spec(tmp_path, SIZES))
        _by_value(on_node)
        with RayRunner(address=cluster.address) as runner:
            assert len([n for n in ray.nodes() if n["Alive"]]) == 2
            result = run_sweep(spec, tmp_path / "out", runner, task=on_node)
        assert (result.points, result.done) == (6, 6)
        assert len(list((tmp_path / "nodes").iterdir())) == 2  # both nodes planned points
    finally:
        ray.shutdown()
        cluster.shutdown()
        shutil.rmtree(temp, ignore_errors=True)


# --------------------------------------------------------------------------- bisection


def test_bisection_finds_what_a_scan_finds(model_dir: Path, tmp_path: Path) -> None:
    spec = load_spec(capacity_spec(model_dir, SIZES))
    full = run_sweep(spec, tmp_path / "full")
    for text in ("x_floor<=1.1", "x_floor<=1.5", "x_floor<=2.5", "x_floor<=7", "dram_bytes<9000"):
        target = parse_target(text)
        scan = next((r.value("sram.bytes") for r in full.rows if target.met(r)), None)
        found = run_sweep(spec, tmp_path / "full", CountingRunner(), resume=True, target=target)
        assert [p.smallest for p in found.bisection] == [scan], text
    target = parse_target("x_floor<=1.5")
    assert next(r.value("sram.bytes") for r in full.rows if target.met(r)) == 8192  # mid-curve
    runner = CountingRunner()
    fresh = run_sweep(spec, tmp_path / "bisect", runner, target=target)
    assert [p.smallest for p in fresh.bisection] == [8192]
    assert len(runner.planned) == fresh.bisection[0].probes == 3 < len(SIZES)  # log2(6) probes


def test_bisection_needs_one_capacity_axis(model_dir: Path, tmp_path: Path) -> None:
    spec = load_spec(write_spec(model_dir, "models: [chain.onnx]\nchips:\n  - hw: frustum_npu\n"
                                "    sweep: {clusters: [1, 2]}\nsolvers: [greedy]\n"))
    with pytest.raises(InputError, match="exactly one swept capacity axis"):
        run_sweep(spec, tmp_path, target=parse_target("x_floor<=1.1"))


# --------------------------------------------------------------------------- CLI, table, report


def test_cli_json_and_the_table_columns(model_dir: Path, tmp_path: Path) -> None:
    spec = capacity_spec(model_dir, SIZES[:3], "[chain.onnx, chain_b.onnx]")
    report = tmp_path / "sweep.html"
    result = CliRunner().invoke(app, ["sweep", str(spec), "--out", str(tmp_path / "out"),
                                      "--serial", "--report", str(report), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert (doc["points"], doc["done"], doc["failed"]) == (6, 6, 0)
    assert doc["table"].endswith(".parquet") and doc["csv"].endswith(".csv")
    assert doc["report"] == str(report)
    table = read_table(doc["table"])
    for column in (*REQUIRED, "sram.bytes"):
        assert column in table[0], column
    assert [r["sram.bytes"] for r in table[:3]] == [2048, 4096, 8192]
    assert all(r["x_floor"] == pytest.approx(r["dram_bytes"] / r["compulsory_dram_bytes"])
               for r in table)
    assert all((tmp_path / "out" / r["plan"]).is_file() for r in table)
    csv = Path(doc["csv"]).read_text().splitlines()
    assert len(csv) == 7 and '"sram.bytes"' in csv[0]


def _report_result(model_dir: Path, out: Path) -> sweep.SweepResult:
    spec = load_spec(capacity_spec(model_dir, SIZES[:4], "[chain.onnx, chain_b.onnx]"))
    return run_sweep(spec, out)


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def _console_errors(html_file: Path, browser: str) -> tuple[list[str], str]:
    """Open a page in headless Chromium: its console messages (Chromium logs each one as a
    CONSOLE line without its level; the report has no script, so any message is an error
    such as a resource that failed to load), and its DOM."""
    run = subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr",
         "--v=0", "--dump-dom", html_file.as_uri()],
        capture_output=True, text=True, timeout=120, check=False)
    errors = [line for line in run.stderr.splitlines() if ":CONSOLE" in line]
    return errors, run.stdout


def _curves_shown(dom: str) -> None:
    for model in ("chain.onnx", "chain_b.onnx"):
        assert re.search(rf'<section class="model" data-name="[^"]*{model}', dom), model
    assert dom.count('<svg class="curve"') == 2 * 3  # traffic, cycles, energy per model
    assert dom.count('data-series="floor"') == 2 and dom.count('class="knee"') == 2


def test_report_page_is_self_contained_with_every_curve(model_dir: Path, tmp_path: Path
                                                         ) -> None:
    result = _report_result(model_dir, tmp_path / "out")
    page = tmp_path / "sweep.html"
    write_sweep_report(result, page, parse_target("x_floor<=1.5"), "capacity")
    text = page.read_text()
    assert "<script" not in text and "http://" not in text.replace(
        'xmlns="http://www.w3.org/2000/svg"', "")  # nothing fetched
    _curves_shown(text)


def test_report_shows_every_curve_in_headless_chromium(model_dir: Path, tmp_path: Path) -> None:
    browser = _chromium()
    if browser is None:
        pytest.skip("no Chromium on PATH (apt-get install chromium): the page's source is "
                    "checked by test_report_page_is_self_contained_with_every_curve")
    result = _report_result(model_dir, tmp_path / "out")
    page = tmp_path / "sweep.html"
    write_sweep_report(result, page, parse_target("x_floor<=1.5"), "capacity")
    broken = tmp_path / "broken.html"
    broken.write_text("<html><body><script>console.error('boom')</script></body></html>")
    assert _console_errors(broken, browser)[0], "the console check must see errors"
    errors, dom = _console_errors(page, browser)
    assert errors == []
    _curves_shown(dom)


def test_report_marks_the_knee_and_the_chip_serving_all(model_dir: Path, tmp_path: Path
                                                        ) -> None:
    result = _report_result(model_dir, tmp_path / "out")
    page = sweep_html(result, parse_target("x_floor<=1.5"))
    serving = re.search(r"Smallest sram.bytes serving every model within x_floor&lt;=1.5"
                        r".*?<td>([^<]*)</td></tr>", page)
    assert serving is not None
    wanted = max(next(r.value("sram.bytes") for r in result.rows
                      if r.model.endswith(name) and r.x_floor is not None and r.x_floor <= 1.5)
                 for name in ("/chain.onnx", "/chain_b.onnx"))
    assert serving.group(1) == f"{wanted // 1024} KiB"
    knees = [sweep.knee([r for r in result.rows if r.model.endswith(n)], "sram.bytes")
             for n in ("/chain.onnx", "/chain_b.onnx")]
    assert all(k is not None and k.x_floor is not None for k in knees)


def test_the_chip_serving_every_model_after_a_bisection(model_dir: Path) -> None:
    """A bisection plans only its probes: the smallest capacity serving every model is the
    largest of the models' bisection answers (none if some model has none), not a scan of
    the probed rows."""
    job = sweep.address(load_spec(capacity_spec(model_dir, ["4KiB"], name="serve.yaml")).points)[0]

    def row(model: str, size: int, x: float) -> sweep.PointResult:
        return replace(blank_row(job, "OPTIMAL"), model=model,
                       axes=(("sram.bytes", size),), dram_bytes=int(100 * x),
                       compulsory_dram_bytes=100)

    rows = (row("a", 8192, 1.6), row("a", 16384, 1.2),  # a meets x_floor<=1.5 from 16 KiB
            row("b", 8192, 1.4), row("b", 4096, 1.7))   # b from 8 KiB: they never share a row
    probes = tuple(sweep.Probe(m, None, "frustum_npu", "sram.bytes", v, 2, (), "default",
                               "greedy", "traffic") for m, v in (("a", 16384), ("b", 8192)))
    result = sweep.SweepResult(4, 4, 0, 0, rows, "t", "c", ("sram.bytes",), 0.0, 0, probes)
    page = sweep_html(result, parse_target("x_floor<=1.5"))
    serving = re.search(r"serving every model within.*?<td>([^<]*)</td></tr>", page)
    assert serving is not None and serving.group(1) == "16 KiB"
    none = (probes[0], replace(probes[1], smallest=None))
    assert smallest_serving_bisected(none)[0][1] is None


def test_cli_exit_codes(model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                        ) -> None:
    """1 for an errored point and for a target some curve never meets; 2 naming the path for
    an --out or --report that cannot be written and for a Ray that cannot be reached; 130
    for Ctrl-C while Ray starts."""
    bad_input = write_spec(model_dir, "models: [{model: chain.onnx, shapes: {nope: [1, 3, 16, "
                           "16]}}]\nchips:\n  - hw: frustum_npu\n    sweep: {sram.bytes: [4KiB]}\n"
                           "solvers: [greedy]\n", "errs.yaml")
    run = CliRunner().invoke(app, ["sweep", str(bad_input), "--out", str(tmp_path / "e"),
                                   "--serial"])
    assert run.exit_code == 1, run.output
    assert "1 points errored" in run.stderr and "not a real input" in run.stderr

    spec = capacity_spec(model_dir, SIZES[:2], name="codes.yaml")
    run = CliRunner().invoke(app, ["sweep", str(spec), "--out", str(tmp_path / "t"), "--serial",
                                   "--target", "dram_bytes<1", "--json"])
    assert run.exit_code == 1 and json.loads(run.stdout)["target"]["curves"][0]["smallest"] \
        is None
    assert "meet dram_bytes<1 at no swept capacity" in " ".join(run.stderr.split())

    a_file = tmp_path / "file"
    a_file.write_text("")
    no_folder = str(tmp_path / "no" / "r.html")
    for args, words in ((["--out", str(a_file / "out")], "--out"),
                        (["--out", str(tmp_path / "o"), "--report", no_folder], "--report")):
        run = CliRunner().invoke(app, ["sweep", str(spec), "--serial", *args])
        assert run.exit_code == 2 and run.stderr.startswith(f"error: {words}"), run.output
        assert "Traceback" not in run.output

    def refuse(**_: Any) -> None:
        raise ConnectionError("Could not find any running Ray instance.")

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", refuse)
    run = CliRunner().invoke(app, ["sweep", str(spec), "--out", str(tmp_path / "r"),
                                   "--address", "head:6379"])
    assert run.exit_code == 2, run.output
    assert "cannot reach Ray at head:6379" in run.stderr and "ray start --head" in run.stderr

    def interrupt(**_: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(ray, "init", interrupt)
    run = CliRunner().invoke(app, ["sweep", str(spec), "--out", str(tmp_path / "r")])
    assert run.exit_code == 130 and run.stderr.startswith("interrupted:"), run.output

    def stop(*_: Any) -> Iterator[Any]:
        raise KeyboardInterrupt
        yield

    monkeypatch.setattr(sweep.SerialRunner, "run", stop)  # Ctrl-C while planning ...
    monkeypatch.setattr(driver, "write_table", stop)  # ... and again while tabling
    run = CliRunner().invoke(app, ["sweep", str(spec), "--out", str(tmp_path / "s"), "--serial"])
    assert run.exit_code == 130 and run.stderr.startswith("interrupted:"), run.output
    assert "Traceback" not in run.output


def test_ctrl_c_keeps_finished_rows_and_exits_130(model_dir: Path, tmp_path: Path) -> None:
    """SIGINT to a running `fuseplan sweep --serial`: exit 130, one line, every finished row
    in the table, no temporary files; --resume then plans only the rest."""
    spec = capacity_spec(model_dir, SIZES, "[chain.onnx, chain_b.onnx]", name="sigint.yaml")
    out = tmp_path / "out"
    fuseplan = Path(sys.executable).parent / "fuseplan"
    proc = subprocess.Popen([str(fuseplan), "sweep", str(spec), "--out", str(out), "--serial"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=False, preexec_fn=as_foreground_job)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        # finished rows only: a row being written is a hidden temporary file until renamed
        if (out / "rows").is_dir() and len([p for p in (out / "rows").iterdir()
                                            if not p.name.startswith(".")]) >= 2:
            break
        time.sleep(0.1)
    assert proc.poll() is None, "the sweep ended before it could be interrupted"
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    assert stderr.strip().startswith("interrupted:") and "Traceback" not in stderr, stderr
    assert len(stderr.strip().splitlines()) == 1, stderr
    rows = list((out / "rows").iterdir())
    assert 2 <= len(rows) < 12
    assert len(read_table(out / "sweep.parquet")) == len(rows)
    assert not list(out.rglob(".*.tmp"))
    again = CountingRunner()
    run_sweep(load_spec(spec), out, again, resume=True)
    assert len(again.planned) == 12 - len(rows)


def test_write_atomic_honours_the_umask(tmp_path: Path) -> None:
    """Row, plan and table files are written with core.files.write_atomic: their mode
    follows the umask, as a file written with ``open`` would."""
    old = os.umask(0o027)
    try:
        write_atomic(tmp_path / "a.json", "{}")
    finally:
        os.umask(old)
    assert (tmp_path / "a.json").stat().st_mode & 0o777 == 0o640
    assert (tmp_path / "a.json").read_text() == "{}"
