"""Hostile input (issue 17): plan files as users edit them, stated numbers that lie, output
paths that cannot be written, and Ctrl-C. Every case must end with exit 0, 1 or 2 (130 for
Ctrl-C) and a message naming the place and the fix, never a traceback.

Commands run in process through typer's CliRunner (an escaped exception is a traceback),
except the Ctrl-C case, which needs a real process to signal.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from fuseplan.planner.core.errors import InputError
from fuseplan.planner.core.files import atomic_path, make_dir, write_atomic
from fuseplan.planner.plan.schema import MAX_PLAN_BYTES
from fuseplan.planner.ui.cli import app
from tests import models
from tests.interrupt import interrupt_when

ROOT = Path(__file__).resolve().parents[1]
FUSEPLAN = ROOT / ".venv" / "bin" / "fuseplan"
CHIP = ["--set", "sram.bytes=8KiB"]  # several groups, row tiles, prefetch
Doc = dict[str, Any]


def run(*args: str) -> tuple[int, str]:
    """Exit code and stdout + stderr of `fuseplan ARGS` run in process; an exception that
    escapes the CLI (a traceback for the user) fails the test."""
    result = CliRunner().invoke(app, list(args), catch_exceptions=True)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"traceback for {args}: {result.exception!r}") from result.exception
    return result.exit_code, result.stdout + result.stderr


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("hostile")
    models.save(models.residual_net(), d, "net")
    return d


@pytest.fixture(scope="module")
def plan_doc(work: Path) -> Doc:
    """residual_net solved on a 16 KiB SRAM, as its plan file's document."""
    code, text = run("solve", str(work / "net.onnx"), *CHIP, "-o", str(work / "plan.json"))
    assert code == 0, text
    doc: Doc = json.loads((work / "plan.json").read_text())
    assert len(doc["groups"]) >= 2 and any(g["predicted"]["cycles"] for g in doc["groups"])
    return doc


def write(work: Path, name: str, doc: Any) -> Path:
    path = work / name
    path.write_text(json.dumps(doc))
    return path


# --------------------------------------------------------------------------- schema

def _set(*keys: Any, value: Any) -> Callable[[Doc], None]:
    def edit(doc: Doc) -> None:
        node = doc
        for k in keys[:-1]:
            node = node[k]
        node[keys[-1]] = value
    return edit


SCHEMA_CASES: dict[str, tuple[Callable[[Doc], None], str]] = {
    "group is an integer": (_set("groups", 1, value=7), "groups[1] must be an object"),
    "layer name is a list": (_set("groups", 0, "layers", 0, value=["x"]),
                             "groups[0].layers[0] must be a string"),
    "totals is a list": (_set("totals", value=[1, 2]), "totals must be an object"),
    "group id abc": (_set("groups", 0, "id", value="abc"), "groups[0].id must be an integer"),
    "group id out of order": (_set("groups", 1, "id", value=5), "groups[1].id must be 1"),
    "hardware is a string": (_set("hardware", value="chip"), "hardware must be an object"),
    "embedded sram 0 bytes": (_set("hardware", "spec", "sram", "bytes", value=0),
                              "hardware.spec.sram.bytes must be at least 1"),
    "embedded sram a string": (_set("hardware", "spec", "sram", "bytes", value="lots"),
                               "hardware.spec.sram.bytes must be an integer"),
    "layer name ../": (_set("groups", 0, "layers", 0, value="../../etc/passwd"),
                       "groups[0].layers[0] names layer '../../etc/passwd'"),
    # a name may hold any character ONNX allows (issue 43): one the model does not have is
    # refused as any unknown name, and the message shows the override escaped
    "layer name RTL override": (_set("groups", 0, "layers", 0, value="conv\u202e1"),
                                "groups[0].layers[0] names layer 'conv\\u202e1'"),
    "layer name <script>": (_set("groups", 0, "layers", 0, value="<script>x</script>"),
                            "groups[0].layers[0] names layer '<script>x</script>'"),
    "tile h 1.9": (_set("groups", 1, "tile", "h", value=1.9),
                   "groups[1].tile.h must be an integer, got a number 1.9"),
    "tile w 0": (_set("groups", 0, "tile", "w", value=0), "groups[0].tile.w must be at least 1"),
    "tile n true": (_set("groups", 0, "tile", "n", value=True),
                    "groups[0].tile.n must be an integer, got a boolean"),
    "predicted a string": (_set("groups", 0, "predicted", "macs", value="many"),
                           "groups[0].predicted.macs must be an integer"),
    "energy NaN": (_set("totals", "energy_pj", value=float("nan")), "NaN is not a JSON number"),
    "halo unknown": (_set("groups", 0, "halo", value="sometimes"),
                     "groups[0].halo must be \"recompute\" or \"reuse\""),
    "no groups": (_set("groups", value=[]), "groups must hold at least 1 item"),
    "objective unknown": (_set("objective", value="speed"), "objective must be"),
    "version 2": (_set("fuseplan_plan", value=2), "not a fuseplan plan"),
}


@pytest.mark.parametrize("command", ["verify", "explain", "export", "diff"])
@pytest.mark.parametrize("case", sorted(SCHEMA_CASES))
def test_bad_plan_values_exit_2_with_json_path(work: Path, plan_doc: Doc, command: str,
                                               case: str) -> None:
    edit, words = SCHEMA_CASES[case]
    doc = copy.deepcopy(plan_doc)
    edit(doc)
    bad = write(work, f"bad_{command}.json", doc)
    model = str(work / "net.onnx")
    args = {"verify": ["verify", model, str(bad)],
            "explain": ["explain", model, str(bad)],
            "export": ["export", model, str(bad), "-o", str(work / "x.onnx")],
            "diff": ["diff", model, str(work / "plan.json"), str(bad)]}[command]
    code, text = run(*args)
    assert code == 2, text
    flat = " ".join(text.split())
    assert str(bad) in flat and words in flat, flat
    if "not a JSON number" not in words and "not a fuseplan plan" not in words \
            and "names layer" not in words:
        assert "Correct it, or write the plan again" in flat, flat


def test_plans_written_today_load_and_verify(work: Path, plan_doc: Doc) -> None:
    code, text = run("verify", str(work / "net.onnx"), str(work / "plan.json"), "--json")
    assert code == 0, text
    assert json.loads(text[:text.rindex("}") + 1])["first_misstatement"] is None


def test_oversized_plan_is_refused_before_parsing(work: Path) -> None:
    big = work / "big.json"
    with open(big, "wb") as f:
        f.truncate(MAX_PLAN_BYTES + 1)  # sparse: no disk used
    code, text = run("verify", str(work / "net.onnx"), str(big))
    assert code == 2 and "too large for a plan file" in " ".join(text.split()), text


def test_plan_for_another_model_names_it(work: Path, plan_doc: Doc) -> None:
    other = models.save(models.chain_cnn(), work, "other")
    doc = copy.deepcopy(plan_doc)
    doc["model"]["inputs"] = {"input": [1, 3, 32, 32]}
    code, text = run("explain", str(other), str(write(work, "for_net.json", doc)))
    assert code == 2 and "this plan was made for a different model" in " ".join(text.split()), text


def test_plan_for_a_model_with_other_inputs_names_the_model(work: Path, plan_doc: Doc) -> None:
    """The plan's input shapes do not fit the other model: say whose plan it is, not that a
    --shape the user never gave is wrong."""
    proto = models.residual_net()
    proto.graph.input[0].name = "image"
    for node in proto.graph.node:
        node.input[:] = ["image" if t == "input" else t for t in node.input]
    other = models.save(proto, work, "renamed")
    for command in ("verify", "explain"):
        code, text = run(command, str(other), str(work / "plan.json"))
        flat = " ".join(text.split())
        assert code == 2 and "this plan was made for a different model" in flat, flat
        assert "--shape" not in flat, flat


# --------------------------------------------------------------------------- integrity

def _bump(doc: Doc, *keys: Any, by: int = 1) -> None:
    node = doc
    for k in keys[:-1]:
        node = node[k]
    node[keys[-1]] += by


TOTAL_FIELDS = ["dram_read_bytes", "dram_write_bytes", "dram_bytes", "weight_read_bytes",
                "redundant_read_bytes", "sram_peak_bytes", "macs", "vector_ops", "cycles"]


@pytest.mark.parametrize("name", TOTAL_FIELDS)
def test_a_total_off_by_one_fails_verify_naming_it(work: Path, plan_doc: Doc, name: str) -> None:
    doc = copy.deepcopy(plan_doc)
    _bump(doc, "totals", name)
    code, text = run("verify", str(work / "net.onnx"), str(write(work, "t.json", doc)))
    assert code == 1 and f"totals.{name} says" in " ".join(text.split()), text


@pytest.mark.parametrize("name", ["compulsory_dram_bytes", "layer_by_layer_dram_bytes",
                                  "energy_pj"])
def test_a_derived_total_off_by_one_fails_verify(work: Path, plan_doc: Doc, name: str) -> None:
    doc = copy.deepcopy(plan_doc)
    _bump(doc, "totals", name)
    code, text = run("verify", str(work / "net.onnx"), str(write(work, "d.json", doc)), "--json")
    assert code == 1, text
    report = json.loads(text[:text.rindex("}") + 1])
    assert report["first_misstatement"].startswith(f"totals.{name} says"), report


def test_tampered_dram_bytes_does_not_verify(work: Path, plan_doc: Doc) -> None:
    doc = copy.deepcopy(plan_doc)
    doc["totals"]["dram_bytes"] = -1000
    code, text = run("verify", str(work / "net.onnx"), str(write(work, "neg.json", doc)))
    assert code in (1, 2) and "totals.dram_bytes" in text, text


@pytest.mark.parametrize("name", ["dram_read_bytes", "weight_read_bytes", "macs",
                                  "core_fmap_bytes", "first_load_bytes", "cycles",
                                  "prefetch_cycles", "energy_pj"])
def test_a_group_counter_the_cost_model_contradicts(work: Path, plan_doc: Doc,
                                                    name: str) -> None:
    """Group and totals edited together (consistent with each other): only re-deriving the
    group from the cost model catches it."""
    doc = copy.deepcopy(plan_doc)
    _bump(doc, "groups", 1, "predicted", name)
    if name in doc["totals"] and name != "energy_pj":
        _bump(doc, "totals", name)
        if name == "dram_read_bytes":
            _bump(doc, "totals", "dram_bytes")
    code, text = run("verify", str(work / "net.onnx"), str(write(work, "g.json", doc)), "--json")
    assert code == 1, text
    report = json.loads(text[:text.rindex("}") + 1])
    assert report["first_misstatement"].startswith(f"groups[1].predicted.{name} says"), report


# --------------------------------------------------------------------------- output paths

def test_atomic_write_replaces_whole_and_honours_umask(tmp_path: Path) -> None:
    target = tmp_path / "out.json"
    old = os.umask(0o027)
    try:
        write_atomic(target, "first")
        assert target.read_text() == "first" and (target.stat().st_mode & 0o777) == 0o640
    finally:
        os.umask(old)
    with pytest.raises(KeyboardInterrupt), atomic_path(target) as tmp:
        tmp.write_text("half")
        raise KeyboardInterrupt
    assert target.read_text() == "first" and sorted(p.name for p in tmp_path.iterdir()) == \
        ["out.json"]


@pytest.mark.parametrize("where, words", [
    ("missing/plan.json", "does not exist"),
    (".", "it is a directory"),
    ("afile/plan.json", "is a file, not a folder"),
])
def test_unwritable_output_paths(tmp_path: Path, where: str, words: str) -> None:
    (tmp_path / "afile").write_text("x")
    with pytest.raises(InputError, match=words):
        write_atomic(tmp_path / where, "data", "plan file")
    with pytest.raises(InputError, match="it is a file"):
        make_dir(tmp_path / "afile")


@pytest.mark.parametrize("args", [
    ["solve", "{model}", "-o", "{work}/missing/plan.json"],
    ["solve", "{model}", "-o", "{work}"],
    ["solve", "{model}", "--report", "{work}/missing/r.html"],
    ["pareto", "{model}", "--out-dir", "{work}/net.onnx"],
    ["pareto", "{model}", "--plot", "{work}/missing/front.svg"],
    ["partition", "{model}", "--out-dir", "{work}/net.onnx"],
    ["verify", "{model}", "{work}/plan.json", "--save-golden", "{work}/missing/g.npz"],
    ["export", "{model}", "{work}/plan.json", "-o", "{work}/missing/x.onnx"],
    ["report", "{model}", "{work}/plan.json", "-o", "{work}"],
])
def test_cli_refuses_unwritable_outputs_before_working(work: Path, plan_doc: Doc,
                                                       monkeypatch: pytest.MonkeyPatch,
                                                       args: list[str]) -> None:
    """Refused up front, not after solving: the model is never even read (whatever the
    machine's speed, unlike a bound on the command's wall time)."""
    filled = [a.format(model=work / "net.onnx", work=work) for a in args]

    def read_model(*_: Any, **__: Any) -> None:
        raise AssertionError("the model was read before the output was refused")

    monkeypatch.setattr(onnx, "load_model_from_string", read_model)
    code, text = run(*filled)
    assert code == 2, text
    assert "cannot" in text and ("Create the folder" in text or "Name a" in text), text


# --------------------------------------------------------------------------- Ctrl-C

def test_ctrl_c_during_solve_stops_promptly_and_leaves_no_file(work: Path) -> None:
    # zoo:densenet121 for latency takes minutes (every candidate searched, then CP-SAT):
    # Ctrl-C once the planning shows on the terminal, not after a fixed delay that a fast
    # machine's whole solve fits in
    out = work / "interrupted.json"
    stop = interrupt_when(FUSEPLAN, ["solve", "zoo:densenet121", "--time-limit", "120",
                                     "--objective", "latency", "-o", str(out)],
                          "planning zoo:densenet121", work)
    assert stop.code == 130, stop.raw
    assert stop.stop_s < 10
    assert stop.lines and stop.lines[0].startswith("interrupted:"), stop.raw
    assert "Traceback" not in stop.raw, stop.raw
    assert not out.exists() and not [p for p in work.iterdir() if p.name.endswith(".tmp")]


# --------------------------------------------------------------------------- hypothesis

def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix] if prefix else []
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _paths(v, (*prefix, i))
    return out


def _stated(path: tuple[Any, ...]) -> bool:
    """A number the plan states about itself (groups and totals), as opposed to headers
    such as the solver's wall time, which nothing derives."""
    return path[0] in ("groups", "totals")


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture,
                                 HealthCheck.too_slow])
@given(data=st.data())
def test_random_mutations_never_traceback(work: Path, plan_doc: Doc, data: st.DataObject
                                          ) -> None:
    doc = copy.deepcopy(plan_doc)
    paths = [p for p in _paths(doc) if p[0] != "hardware" or len(p) < 4]
    path = data.draw(st.sampled_from(paths))
    parent = doc
    for k in path[:-1]:
        parent = parent[k]
    old = parent[path[-1]]
    kind = data.draw(st.sampled_from(["number", "type", "drop"]))
    changed_number = False
    if kind == "number" and isinstance(old, int | float) and not isinstance(old, bool):
        parent[path[-1]] = old + data.draw(st.sampled_from([1, -1]))
        changed_number = _stated(path)
    elif kind == "type" or kind == "number":
        parent[path[-1]] = data.draw(st.sampled_from(["x", 1.5, None, [], {}, True, -1]))
    elif isinstance(parent, dict):
        del parent[path[-1]]
    else:
        parent.pop(path[-1])
    code, text = run("verify", str(work / "net.onnx"), str(write(work, "mut.json", doc)))
    assert code in (0, 1, 2), text
    if changed_number:
        assert code != 0, f"{path} changed by one and still verified:\n{text}"


# --------------------------------------------------------------------------- options

@pytest.mark.parametrize("args, words", [
    (["solve", "{model}", "--time-limit", "-1"], "positive number of seconds"),
    (["solve", "{model}", "--time-limit", "nan"], "positive number of seconds"),
    (["compare", "{model}", "--time-limit", "inf"], "positive number of seconds"),
    (["solve", "{model}", "--prefer", "auto", "--battery", "250"], "from 0 to 100"),
    (["solve", "{model}", "--dynamic", "input:2=16..32", "--tail-range", "-5"],
     "greater than or equal to 0"),
    (["verify", "{model}", "{work}/plan.json", "--seed", "-1"], "greater than or equal to 0"),
])
def test_bad_option_values_exit_2(work: Path, plan_doc: Doc, args: list[str],
                                  words: str) -> None:
    code, text = run(*[a.format(model=work / "net.onnx", work=work) for a in args])
    assert code == 2 and words in text, text


def test_compare_where_every_planner_fails_answers_no(work: Path) -> None:
    code, text = run("compare", str(work / "net.onnx"), "--set", "sram.bytes=64", "--json")
    assert code == 1 and "no planner found a plan" in " ".join(text.split()), text


def test_demo_takes_json_and_leaves_nothing_behind(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    code, text = run("demo", "--json")
    assert code == 0, text
    doc = json.loads(text[:text.rindex("}") + 1])
    assert doc["verify"]["predicted_matches_emulated"] and doc["plan"]["groups"]
    assert list(tmp_path.iterdir()) == []


# --------------------------------------------------------------------------- integrity limits

CONTRACT_COUNTERS = ("dram_read_bytes", "dram_write_bytes", "weight_read_bytes",
                     "redundant_read_bytes", "sram_peak_bytes", "cycles", "energy_pj")


def test_a_plan_stating_only_the_contract_counters_verifies(work: Path, plan_doc: Doc) -> None:
    """CONTRACT.md requires seven counters per group; a file stating only those (and no
    mode) is not "edited": verify re-derives what it states, nothing more."""
    doc = copy.deepcopy(plan_doc)
    for g in doc["groups"]:
        g["predicted"] = {k: g["predicted"][k] for k in CONTRACT_COUNTERS}
        del g["mode"]
    path = write(work, "contract-only.json", doc)
    code, text = run("verify", str(work / "net.onnx"), str(path), "--json")
    assert code == 0, text
    assert json.loads(text)["first_misstatement"] is None
    # and a changed contract counter is still caught
    doc["groups"][0]["predicted"]["dram_read_bytes"] += 1
    code, text = run("verify", str(work / "net.onnx"), str(write(work, "bad.json", doc)),
                     "--json")
    assert code == 1 and "groups[0].predicted.dram_read_bytes" in text


def test_verifying_on_another_chip_checks_the_numbers_on_the_plans_own(work: Path,
                                                                        plan_doc: Doc) -> None:
    """--set runs the plan on another chip; its stated numbers were derived on its own chip
    and are re-derived there, so an honest plan is not reported as misstated."""
    path = write(work, "own-chip.json", plan_doc)
    code, text = run("verify", str(work / "net.onnx"), str(path), "--set",
                     "dram.bandwidth_gbps=7", "--json")
    assert json.loads(text)["first_misstatement"] is None, text
