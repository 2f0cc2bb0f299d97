"""The examples/ folders verify from the command line, and solving them again is stable.

Each example has model.onnx, rules.yaml, hardware.yaml, plan.json and golden.npz
(examples/make_examples.py made them). The CLI runs as a user runs it: a subprocess,
`--json` on stdout, the exit code.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from fuseplan.hardware.chip import load_chip
from fuseplan.planner.app.verify import load_golden
from fuseplan.planner.front.graph_build import build_graph
from fuseplan.planner.front.onnx_load import load_model, run_onnxruntime

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
NAMES = ["chain_cnn", "residual_net", "inception_net"]
FILES = ["model.onnx", "rules.yaml", "hardware.yaml", "plan.json", "golden.npz"]

_SCRIPT = Path(sys.executable).parent / "fuseplan"
FUSEPLAN = [str(_SCRIPT)] if _SCRIPT.exists() else [
    sys.executable, "-c", "from planner.ui.cli import main; main()"]


def fuseplan(*args: str | Path, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*FUSEPLAN, *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, timeout=300)


def json_of(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    try:
        return json.loads(proc.stdout)
    except json.JSONDecodeError:
        raise AssertionError(f"exit {proc.returncode}; stdout is not one JSON document:\n"
                             f"{proc.stdout[:2000]}\nstderr:\n{proc.stderr[-2000:]}") from None


def folder(name: str) -> Path:
    return EXAMPLES / name


@pytest.mark.parametrize("name", NAMES)
def test_example_files(name: str) -> None:
    d = folder(name)
    for f in FILES:
        path = d / f
        assert path.is_file(), f"{path} is missing: run examples/make_examples.py"
        assert path.stat().st_size < 200_000, f"{path}: {path.stat().st_size} B (limit 200 KB)"
    loaded = load_model(str(d / "model.onnx"), {})
    (shape,) = loaded.inputs.values()
    assert shape[0] == 1 and 32 <= shape[2] <= 64 and 32 <= shape[3] <= 64, shape
    plan = json.loads((d / "plan.json").read_text())
    assert plan["fuseplan_plan"] == 1 and plan["model"]["sha256"] == loaded.sha256
    out = fuseplan("rules", "check", d / "rules.yaml", "--json")
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize("name", NAMES)
def test_example_needs_fusion_and_tiles(name: str) -> None:
    """The chip's SRAM cannot hold the largest feature map: groups are fused and tiled, and
    the plan moves far less DRAM traffic than running layer by layer."""
    d = folder(name)
    plan = json.loads((d / "plan.json").read_text())
    chip, _ = load_chip(str(d / "hardware.yaml"))
    graph = build_graph(load_model(str(d / "model.onnx"), {}))
    largest = max(graph.elems(lay.outputs[0]) for lay in graph.layers) * chip.dtype_bytes
    assert largest > chip.sram.bytes, f"{name}: a {largest} B map fits the {chip.sram.bytes} B " \
                                      "SRAM; the example would not need tiles"
    fused_tiled = [g for g in plan["groups"] if g["fused"] and g["mode"] == "big"]
    assert fused_tiled, f"{name}: no fused, tiled group in {[g['layers'] for g in plan['groups']]}"
    t = plan["totals"]
    assert t["dram_bytes"] < 0.5 * t["layer_by_layer_dram_bytes"], t
    assert t["dram_bytes"] >= t["compulsory_dram_bytes"], t


@pytest.mark.parametrize("name", NAMES)
def test_example_verifies_against_golden(name: str) -> None:
    d = folder(name)
    proc = fuseplan("verify", d / "model.onnx", d / "plan.json", "--golden", d / "golden.npz",
                    "--hw", d / "hardware.yaml", "--json")
    report = json_of(proc)
    assert report["reference"] == "golden"
    assert report["outputs_match"], report["first_output_mismatch"]
    assert report["predicted_matches_emulated"], report["first_counter_mismatch"]
    assert report["capacity_violations"] == []
    assert report["checked_tensors"] >= 1
    assert proc.returncode == 0, proc.stderr
    plan = json.loads((d / "plan.json").read_text())
    for key in ("dram_read_bytes", "dram_write_bytes", "dram_bytes", "weight_read_bytes",
                "sram_peak_bytes"):
        assert report["emulated"][key] == plan["totals"][key], \
            f"{name}: emulated {key} {report['emulated'][key]}, plan says {plan['totals'][key]}"


@pytest.mark.parametrize("name", NAMES)
def test_example_verifies_against_onnxruntime(name: str) -> None:
    d = folder(name)
    proc = fuseplan("verify", d / "model.onnx", d / "plan.json", "--hw", d / "hardware.yaml",
                    "--seed", "7", "--json")
    report = json_of(proc)
    assert report["reference"] == "onnxruntime"
    assert report["outputs_match"], report["first_output_mismatch"]
    assert report["predicted_matches_emulated"], report["first_counter_mismatch"]
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("name", NAMES)
def test_solving_again_gives_the_stored_plan(name: str) -> None:
    d = folder(name)
    proc = fuseplan("solve", d / "model.onnx", "--rules", d / "rules.yaml", "--hw",
                    d / "hardware.yaml", "--json")
    assert proc.returncode == 0, proc.stderr
    again = json_of(proc)
    stored = json.loads((d / "plan.json").read_text())
    assert [g["layers"] for g in again["groups"]] == [g["layers"] for g in stored["groups"]], \
        f"{name}: the solver now groups the model differently; if that is intended, run " \
        "examples/make_examples.py"
    # the objective (DRAM traffic) of an optimal plan cannot change, whatever tile ties break to
    assert again["solver"]["status"] == stored["solver"]["status"] == "OPTIMAL"
    assert again["totals"]["dram_bytes"] == stored["totals"]["dram_bytes"]


def _make_examples() -> Any:
    spec = importlib.util.spec_from_file_location("make_examples", EXAMPLES / "make_examples.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", NAMES)
def test_committed_model_is_what_the_script_builds(name: str) -> None:
    script = _make_examples()
    built = script.EXAMPLES[name][0]()
    assert built.SerializeToString() == (folder(name) / "model.onnx").read_bytes(), \
        f"examples/{name}/model.onnx differs from make_examples.py's model: regenerate it"
    assert (folder(name) / "hardware.yaml").read_text() == script.EXAMPLES[name][1]


@pytest.mark.parametrize("name", NAMES)
def test_golden_outputs_are_the_models_own_outputs(name: str) -> None:
    """golden.npz holds what the model computes on the golden inputs.

    Issue 3: only models whose weights are constant-generated (the zoo "light" models) get
    seeded random weights; these examples carry real weights, so `verify --save-golden`
    must store the outputs of the model as written.
    """
    inputs, outputs, _ = load_golden(folder(name) / "golden.npz")
    ref, _ = run_onnxruntime(onnx.load(folder(name) / "model.onnx"), inputs)
    for key, want in outputs.items():
        err = float(np.max(np.abs(ref[key] - want)))
        assert err <= 1e-4 * max(1.0, float(np.max(np.abs(ref[key])))), \
            f"{name}: golden output {key} differs from the model's own output by up to {err:.3g}"


def test_plan_folder_can_be_moved(tmp_path: Path) -> None:
    """Solve in one folder, move the folder (as a checkout elsewhere does), verify there.

    The plan names its chip file; after the move that file is next to the plan, not at the
    absolute path where the plan was solved.
    """
    first = tmp_path / "first"
    shutil.copytree(folder("chain_cnn"), first)
    proc = fuseplan("solve", "model.onnx", "--rules", "rules.yaml", "--hw", "hardware.yaml",
                    "-o", "plan.json", "--json", cwd=first)
    assert proc.returncode == 0, proc.stderr
    moved = tmp_path / "moved"
    first.rename(moved)
    proc = fuseplan("verify", "model.onnx", "plan.json", "--golden", "golden.npz", "--json",
                    cwd=moved)
    assert proc.returncode == 0, (
        f"verify after moving the folder exits {proc.returncode}: {proc.stderr.strip()} "
        f"(plan hardware: {json.loads((moved / 'plan.json').read_text())['hardware']})")
    assert json_of(proc)["outputs_match"]


def test_verify_rejects_a_plan_for_another_model(tmp_path: Path) -> None:
    """Exit 2, one paragraph on stderr naming the plan file, no traceback."""
    plan = tmp_path / "plan.json"
    shutil.copy(folder("chain_cnn") / "plan.json", plan)
    proc = fuseplan("verify", folder("residual_net") / "model.onnx", plan, "--hw",
                    folder("chain_cnn") / "hardware.yaml", "--json")
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-500:], proc.stderr[-500:])
    assert "different model" in proc.stderr and str(plan) in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_verify_reports_capacity_violation_and_exits_1() -> None:
    """The chain example's plan on a chip with a 4 KiB SRAM: correct outputs, but it overflows."""
    d = folder("chain_cnn")
    proc = fuseplan("verify", d / "model.onnx", d / "plan.json", "--hw", d / "hardware.yaml",
                    "--set", "sram.bytes=4KiB", "--golden", d / "golden.npz", "--json")
    assert proc.returncode == 1, proc.stderr
    report = json_of(proc)
    assert report["outputs_match"] and report["predicted_matches_emulated"]
    violations = report["capacity_violations"]
    assert violations and all(v["level"] in ("sram", "nram", "wram") for v in violations)
    sram = [v for v in violations if v["level"] == "sram"]
    assert sram and all(v["capacity_bytes"] == 4096 and v["over_bytes"] ==
                        v["needed_bytes"] - 4096 > 0 for v in sram), sram
    assert {"group", "tile"} <= set(sram[0])
