"""Hostile input (issue 17), the rest of the families: dynamic plans whose groups do not cover
the model or whose model changed, chips whose costs outgrow CP-SAT's integers, quantized (QDQ)
models, Ctrl-C during `pareto` and `partition --jobs 2`, and an audit of exit-2 messages
(each names the file, the place and what to do).
"""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests import models
from tests.interrupt import interrupt_when, interrupt_when_loaded
from tests.test_hostile_inputs import run, says  # the CLI in process; a message's words

ROOT = Path(__file__).resolve().parents[1]
FUSEPLAN = ROOT / ".venv" / "bin" / "fuseplan"
DEMO = ROOT / "planner" / "data" / "demo.onnx"
Doc = dict[str, Any]


# --------------------------------------------------------------------------- dynamic plans

@pytest.fixture(scope="module")
def dyn(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Doc]:
    """chain_cnn's dynamic plan on a 16 KiB SRAM: several groups, the first of many layers."""
    work = tmp_path_factory.mktemp("dyn_more")
    model = models.save(models.chain_cnn(), work, "chain")
    code, text = run("solve", str(model), "--dynamic", "input:2=16..32", "--solver",
                     "shortest-path", "--set", "sram.bytes=16KiB", "-o", str(work / "dyn.json"))
    assert code == 0, text
    doc: Doc = json.loads((work / "dyn.json").read_text())
    assert len(doc["groups"]) >= 2 and len(doc["groups"][0]["layers"]) >= 2
    return model, doc


def _duplicate(doc: Doc) -> None:
    doc["groups"][1]["layers"] = doc["groups"][0]["layers"][:1] + doc["groups"][1]["layers"]


def _drop(doc: Doc) -> None:
    doc["groups"][0]["layers"] = doc["groups"][0]["layers"][:-1]


@pytest.mark.parametrize("command", ["table", "verify"])
@pytest.mark.parametrize("edit, words", [(_duplicate, "each layer must be in exactly one group"),
                                         (_drop, "a plan must cover every layer exactly once")])
def test_dynamic_plan_that_does_not_cover_the_model_exits_2(tmp_path: Path,
                                                            dyn: tuple[Path, Doc], command: str,
                                                            edit: Any, words: str) -> None:
    model, doc = dyn
    doc = copy.deepcopy(doc)
    edit(doc)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    args = {"table": ["table", str(bad), "--shape", "input=1,3,24,32", "--cache",
                      str(tmp_path / "cache")],
            "verify": ["verify", str(model), str(bad), "--shape", "input=1,3,24,32"]}[command]
    code, text = run(*args)
    assert code == 2 and says(text, str(bad), words), text


def test_table_of_a_plan_whose_model_changed_says_so(tmp_path: Path,
                                                     dyn: tuple[Path, Doc]) -> None:
    """The table is computed from the model the plan names: if that file changed since, the
    plan's groups and units are stale, even when a table of it is cached."""
    _, doc = dyn
    model = models.save(models.chain_cnn(), tmp_path, "chain")
    doc = copy.deepcopy(doc)
    doc["model"]["path"] = str(model)
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(doc))
    args = ["table", str(plan), "--shape", "input=1,3,24,32", "--cache", str(tmp_path / "c")]
    code, text = run(*args)
    assert code == 0, text  # cached now
    models.save(models.chain_cnn(seed=1), tmp_path, "chain")  # same layers, other weights
    code, text = run(*args)
    assert code == 2 and says(text, str(plan), f"this plan was made for model {model}",
                              "has changed since", "fuseplan solve"), text
    model.unlink()
    code, text = run(*args)
    assert code == 2 and says(text, str(plan), "model.path", "does not exist"), text


def test_verify_of_a_dynamic_plan_for_another_model_names_it(tmp_path: Path,
                                                            dyn: tuple[Path, Doc]) -> None:
    made_for, doc = dyn
    other = models.save(models.chain_cnn(seed=1), tmp_path, "other")
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(doc))
    code, text = run("verify", str(other), str(plan), "--shape", "input=1,3,24,32")
    assert code == 2 and says(text, str(plan), f"made for model {made_for}", "Pass that model"
                              ), text


# --------------------------------------------------------------------------- CP-SAT integers

def test_energy_objective_with_costly_cycles_plans(tmp_path: Path) -> None:
    """10 W of static power at 0.1 GHz is 100 nJ a cycle: with its cycle variables bounded
    by 10**12 the energy objective overflowed 64 bits (MODEL_INVALID)."""
    model = models.save(models.residual_net(), tmp_path, "net")
    code, text = run("solve", str(model), "--set", "static_power_mw=10000", "--set",
                     "clock_ghz=0.1", "--objective", "energy", "--time-limit", "30")
    assert code == 0, text


def test_costs_past_64_bits_are_refused_naming_the_chip_keys(tmp_path: Path) -> None:
    """Where CP-SAT runs, costs past its 64-bit integers are refused naming the chip keys;
    the bounded path, whose integers have no such limit, plans the same input."""
    model = models.save(models.residual_net(), tmp_path, "net")
    extreme = ["--set", "static_power_mw=1e6", "--set", "clock_ghz=0.001", "--set",
               "dram.bandwidth_gbps=0.001", "--set", "core.macs_per_cycle=1", "--objective",
               "energy", "--time-limit", "30"]
    code, text = run("solve", str(model), *extreme)
    assert code == 0 and "OPTIMAL" in text, text
    rules = tmp_path / "cpsat.yaml"
    rules.write_text("search:\n  exact_path_first: false\n")
    code, text = run("solve", str(model), "--rules", str(rules), *extreme)
    assert code == 2, text
    assert says(text, "cluster4x4.yaml", "static_power_mw", "clock_ghz", "too large",
                "--objective traffic"), text
    assert "--time-limit" not in text.replace("--set", ""), text


# --------------------------------------------------------------------------- QDQ models

def _qdq_model(activations: bool) -> onnx.ModelProto:
    """An opset-17 QDQ model: int8 weights through DequantizeLinear into a Conv, and with
    `activations` the input quantized and dequantized (QuantizeLinear/DequantizeLinear)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.integers(-100, 100, (4, 3, 3, 3)).astype(np.int8),
                                     "w_q"),
             numpy_helper.from_array(np.array([0.02, 0.01, 0.03, 0.02], np.float32), "w_scale"),
             numpy_helper.from_array(np.array([0, 1, -1, 0], np.int8), "w_zp"),
             numpy_helper.from_array(np.array(0.05, np.float32), "x_scale"),
             numpy_helper.from_array(np.array(128, np.uint8), "x_zp"),
             numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b")]
    nodes = [helper.make_node("DequantizeLinear", ["w_q", "w_scale", "w_zp"], ["w"],
                              name="dq_w", axis=0)]
    src = "x"
    if activations:
        nodes += [helper.make_node("QuantizeLinear", ["x", "x_scale", "x_zp"], ["xq"],
                                   name="q_x"),
                  helper.make_node("DequantizeLinear", ["xq", "x_scale", "x_zp"], ["xd"],
                                   name="dq_x")]
        src = "xd"
    nodes += [helper.make_node("Conv", [src, "w", "b"], ["y"], name="conv1", pads=[1] * 4),
              helper.make_node("Relu", ["y"], ["out"], name="relu1")]
    graph = helper.make_graph(
        nodes, "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 4, 16, 16])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _valid(model: onnx.ModelProto, path: Path) -> Path:
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, path)
    ort.InferenceSession(str(path)).run(None, {"x": np.zeros((1, 3, 16, 16), np.float32)})
    return path


def test_qdq_weights_are_dequantized_and_planned(tmp_path: Path) -> None:
    path = _valid(_qdq_model(activations=False), tmp_path / "qdq.onnx")
    plan = tmp_path / "plan.json"
    code, text = run("solve", str(path), "-o", str(plan))
    assert code == 0, text
    code, text = run("verify", str(path), str(plan))
    assert code == 0 and "match onnxruntime: True" in text, text


def test_quantized_activations_are_refused_as_unsupported_not_blamed_on_the_model(
        tmp_path: Path) -> None:
    path = _valid(_qdq_model(activations=True), tmp_path / "qdq_act.onnx")
    for command in ("inspect", "solve"):
        code, text = run(command, str(path))
        assert code == 2, text
        assert says(text, str(path), "node 'q_x' (QuantizeLinear)",
                    "fuseplan does not support quantized graphs yet",
                    "Plan the float model"), text
        assert "Fix or re-export" not in text, text


# --------------------------------------------------------------------------- Ctrl-C

def _no_partial_files(folder: Path) -> None:
    if folder.exists():
        left = [p.name for p in folder.rglob("*") if p.name.endswith(".tmp")
                or p.name.startswith(".")]
        assert not left, left
        for plan in folder.glob("*.json"):
            json.loads(plan.read_text())  # complete


@pytest.mark.parametrize(("args", "phrase"), [
    (["pareto", str(DEMO), "--points", "5", "--time-limit", "60", "--out-dir", "front"],
     "sweeping 5 points"),
    # a ResNet-50 cut into subgraphs of at most 9 nodes, each compiled by CP-SAT with every
    # candidate searched: some 20 s of work after the progress shows
    (["partition", "zoo:resnet50", "--jobs", "2", "--rules", "{rules}", "--out-dir", "parts"],
     "cutting, compiling and merging"),
], ids=["pareto", "partition-jobs-2"])
def test_ctrl_c_during_a_long_command_exits_130_promptly(tmp_path: Path, args: list[str],
                                                         phrase: str) -> None:
    """Ctrl-C once the command's progress shows (its work has begun, however fast the
    machine): exit 130 within seconds, one line, no partial file."""
    rules = tmp_path / "rules.yaml"
    rules.write_text((ROOT / "rules" / "default.yaml").read_text()
                     .replace("  planner: shortest-path ", "  planner: cpsat         ")
                     .replace("  max_nodes: 64 ", "  max_nodes: 9  ")
                     # two sub-map buffers: more parts to compile; every candidate searched
                     # (no floors to skip them)
                     .replace("buffers: 1}", "buffers: 2}")
                     .replace("prune_by_floor: true", "prune_by_floor: false"))
    filled = [a.format(rules=rules) for a in args]
    stop = interrupt_when(FUSEPLAN, filled, phrase, tmp_path)
    assert stop.code == 130, stop.raw
    assert stop.stop_s < 10
    assert not stop.left, "a worker outlived the command"
    assert stop.lines and stop.lines[0].startswith("interrupted:"), stop.raw
    assert "Traceback" not in stop.raw, stop.raw
    _no_partial_files(tmp_path / filled[-1])
    if (tmp_path / filled[-1]).exists():
        shutil.rmtree(tmp_path / filled[-1])


def test_ctrl_c_while_worker_processes_search_stops_them_all(tmp_path: Path) -> None:
    """`solve -j 2` on a ResNet-50 searches its tiles in two worker processes: Ctrl-C to the
    terminal's process group once the planning shows ends the command with exit 130 and one
    line, and leaves no worker running and no plan file. (Under the latency objective every
    candidate is searched, for half a minute: under traffic the floors spare most searches
    and the command may be done in 5 s.)"""
    stop = interrupt_when(FUSEPLAN, ["solve", "zoo:resnet50", "-j", "2", "--objective",
                                     "latency", "-o", "plan.json"],
                          "planning zoo:resnet50", tmp_path)
    assert stop.code == 130, stop.raw
    assert stop.stop_s < 10
    assert not stop.left, "a worker outlived the command"
    assert stop.lines and stop.lines[0].startswith("interrupted:"), stop.raw
    assert "Traceback" not in stop.raw, stop.raw
    assert not (tmp_path / "plan.json").exists()
    # the workers are in the command's process group: gone once it is (poll, not a delay)
    deadline = time.monotonic() + 10
    while True:
        left = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
        workers = [a for a in left.splitlines() if "zoo:resnet50 -j 2 --objective" in a]
        if not workers or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert not workers, left


@pytest.mark.parametrize("library", ["numpy/_core/_multiarray_umath", "onnx_cpp2py_export"],
                         ids=["numpy", "onnx"])
def test_ctrl_c_during_the_imports_says_one_line(tmp_path: Path, library: str) -> None:
    """The command line's imports take seconds on a loaded machine: a Ctrl-C then ends in
    the same one line and exit 130 as one during the command, never a traceback. The
    signal comes as the imports load numpy (early) or onnx (later); on a machine fast
    enough to be past them, it lands in the pareto sweep (a minute of work), same answer."""
    stop = interrupt_when_loaded(FUSEPLAN, ["pareto", str(DEMO), "--out-dir", "front"],
                                 library, tmp_path)
    assert stop.code == 130, stop.raw
    assert stop.stop_s < 10
    assert stop.lines and stop.lines[0].startswith("interrupted:"), stop.raw
    assert "Traceback" not in stop.raw, stop.raw
    assert not (tmp_path / "front").exists() or not list((tmp_path / "front").iterdir())


@pytest.mark.parametrize("wrapper", [ImportError, RuntimeError])
def test_an_interrupt_wrapped_by_an_import_says_one_line(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        wrapper: type[Exception]) -> None:
    """A Ctrl-C that lands in an extension's initialisation (ImportError) or in a class body
    calling __set_name__ (RuntimeError: "Error calling __set_name__ on 'Field' instance",
    networkx's dataclasses, seen once in CI) comes wrapped: still one line and exit 130."""
    import fuseplan.planner.ui.cli as cli
    from fuseplan.planner.ui import entry

    def imports_interrupted() -> None:
        raise wrapper("Error calling __set_name__") from KeyboardInterrupt()

    monkeypatch.setattr(cli, "main", imports_interrupted)
    with pytest.raises(SystemExit) as stop:
        entry.main()
    assert stop.value.code == 130
    assert capsys.readouterr().err == entry.STARTING + "\n"


def test_an_error_without_an_interrupt_is_not_taken_for_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import fuseplan.planner.ui.cli as cli
    from fuseplan.planner.ui import entry

    def broken() -> None:
        raise RuntimeError("not an interrupt")

    monkeypatch.setattr(cli, "main", broken)
    with pytest.raises(RuntimeError, match="not an interrupt"):
        entry.main()


@pytest.mark.parametrize("reported", [False, True])
def test_a_silent_exit_130_gets_its_line_once(monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str],
                                              reported: bool) -> None:
    """typer ends a Ctrl-C that came while it parsed a command's options (before the
    command's own handling) in a silent exit 130: the console script prints the line then,
    and only then (a command that said what it left is not said twice)."""
    import fuseplan.planner.ui.cli as cli
    from fuseplan.planner.ui import Interruption, entry

    def typer_after_ctrl_c() -> None:
        raise SystemExit(130)

    monkeypatch.setattr(cli, "main", typer_after_ctrl_c)
    monkeypatch.setattr(Interruption, "reported", reported)
    with pytest.raises(SystemExit) as stop:
        entry.main()
    assert stop.value.code == 130
    said = capsys.readouterr().err
    assert said == ("" if reported else entry.AROUND + "\n"), said



@pytest.mark.parametrize("interrupted", [False, True])
def test_an_import_failed_by_ctrl_c_is_an_interruption(monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str],
                                                       interrupted: bool) -> None:
    """A compiled extension (ortools' solver helper) that was initialising when the Ctrl-C
    came reports "ImportError: initialization failed", caused by the interrupt: one line
    and exit 130 (seen in CI, Ctrl-C 0.9 s into `pareto`); any other failed import is
    raised as it is."""
    import fuseplan.planner.ui.cli as cli
    from fuseplan.planner.ui import entry

    def importing() -> None:
        try:
            if interrupted:
                raise KeyboardInterrupt
            raise OSError("libortools.so: cannot open shared object file")
        except BaseException as exc:
            raise ImportError("initialization failed") from exc

    monkeypatch.setattr(cli, "main", importing)
    if not interrupted:
        with pytest.raises(ImportError):
            entry.main()
        return
    with pytest.raises(SystemExit) as stop:
        entry.main()
    assert stop.value.code == 130
    assert capsys.readouterr().err == entry.STARTING + "\n"


# --------------------------------------------------------------------------- message audit

@pytest.fixture(scope="module")
def audit(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with a model, its plan and broken files of every kind."""
    d = tmp_path_factory.mktemp("audit")
    model = models.save(models.chain_cnn(), d, "chain")
    code, text = run("solve", str(model), "--solver", "shortest-path", "-o", str(d / "plan.json"))
    assert code == 0, text
    chip = (ROOT / "hardware" / "cluster4x4.yaml").read_text()
    rules = (ROOT / "rules" / "default.yaml").read_text()
    (d / "garbage.onnx").write_bytes(b"not onnx at all")
    (d / "bad.yaml").write_text("name: x\nsram: [\n")
    (d / "chip_key.yaml").write_text(chip + "\nfoo: 1\n")
    (d / "chip_neg.yaml").write_text(chip.replace("clusters: 4", "clusters: -4"))
    (d / "rules_bad.yaml").write_text(rules.replace("time_limit_s: 60", "time_limit_s: soon"))
    (d / "notjson.json").write_text("{not json")
    (d / "afile").write_text("x")
    renamed = models.chain_cnn()
    renamed.graph.input[0].name = "image"
    for node in renamed.graph.node:
        node.input[:] = ["image" if t == "input" else t for t in node.input]
    models.save(renamed, d, "renamed")
    return d


# (arguments, words the message must hold: the file or option, the place, what to do)
MESSAGES: list[tuple[list[str], list[str]]] = [
    (["solve", "{d}/missing.onnx"], ["{d}/missing.onnx", "does not exist", "Check the path"]),
    (["solve", "{d}/garbage.onnx"], ["{d}/garbage.onnx", "not a readable ONNX model",
                                     "Pass an .onnx file"]),
    (["solve", "{d}/chain.onnx", "--hw", "{d}/bad.yaml"], ["{d}/bad.yaml:3:1", "Fix the syntax"]),
    (["solve", "{d}/chain.onnx", "--hw", "{d}/chip_key.yaml"],
     ["chip_key.yaml:", "unknown key `foo`", "Fix the spelling or remove the key"]),
    (["solve", "{d}/chain.onnx", "--hw", "{d}/chip_neg.yaml"],
     ["chip_neg.yaml:", "`clusters`", "Give a positive value"]),
    (["solve", "{d}/chain.onnx", "--hw", "nochip"], ["'nochip'", "Give one of them"]),
    (["solve", "{d}/chain.onnx", "--rules", "{d}/rules_bad.yaml"],
     ["rules_bad.yaml:", "`time_limit_s`", "Change the value"]),
    (["solve", "{d}/chain.onnx", "--set", "nokey=3"],
     ["--set nokey=3", "unknown key `nokey`", "Fix the spelling"]),
    (["solve", "{d}/chain.onnx", "--set", "sram.bytes=lots"],
     ["--set sram.bytes=lots", "`bytes`", "write a whole number"]),
    (["solve", "{d}/chain.onnx", "--shape", "nope=1,3,32,32"],
     ["{d}/chain.onnx", "'nope'", "Name one of them in --shape"]),
    (["solve", "{d}/chain.onnx", "--shape", "input=1,3"],
     ["{d}/chain.onnx", "input 'input'", "Pass exactly 4 dims"]),
    (["solve", "{d}/chain.onnx", "--dynamic", "input:9=1..2"],
     ["{d}/chain.onnx", "input:9", "Name an axis from 0 to 3"]),
    (["solve", "{d}/chain.onnx", "--dynamic", "input:2=32..16"],
     ["input:2=32..16", "smallest first"]),
    (["solve", "{d}/chain.onnx", "-o", "{d}/afile/x.json"],
     ["{d}/afile/x.json", "is a file, not a folder", "Choose another path"]),
    (["pareto", "{d}/chain.onnx", "--points", "1"], ["--points", "Pass --points 2 or more"]),
    (["verify", "{d}/chain.onnx", "{d}/notjson.json"],
     ["{d}/notjson.json", "line 1 column 2", "fuseplan solve MODEL -o PLAN.json"]),
    (["verify", "{d}/chain.onnx", "{d}/plan.json", "--golden", "{d}/missing.npz"],
     ["{d}/missing.npz", "--save-golden"]),
    (["explain", "{d}/chain.onnx", "{d}/plan.json", "--layer", "nolayer"],
     ["{d}/plan.json", "'nolayer'", "fuseplan inspect MODEL"]),
    (["diff", "{d}/renamed.onnx", "{d}/plan.json", "{d}/plan.json"],
     ["{d}/plan.json", "this plan was made for a different model", "Pass that model"]),
    (["table", "{d}/plan.json", "--shape", "input=1,3,24,32"],
     ["{d}/plan.json", "not a dynamic plan", "--dynamic NAME:AXIS=LO..HI"]),
    (["rules", "check", "{d}/missing.yaml"], ["{d}/missing.yaml", "Check the path"]),
]


@pytest.mark.parametrize("args, words", MESSAGES, ids=[" ".join(a[:1] + a[2:4]).replace(
    "{d}/", "") for a, _ in MESSAGES])
def test_exit_2_messages_name_the_file_the_place_and_the_fix(audit: Path, args: list[str],
                                                             words: list[str]) -> None:
    code, text = run(*[a.format(d=audit) for a in args])
    assert code == 2, text
    assert says(text, *[w.format(d=audit) for w in words]), text
    assert "--shape names" not in text or "--shape" in args, text
