"""`fuseplan check MANIFEST.yaml`: every entry verified, exit 0/1/2, JUnit XML a parser reads
(xml.etree), the example manifest examples/check.yaml passing."""

from __future__ import annotations

import json
import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from fuseplan.planner.app.check import CheckResult, junit_xml

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


def fuseplan(*args: str | Path, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(ROOT / ".venv" / "bin" / "fuseplan"), *map(str, args)],
                          capture_output=True, text=True, timeout=600, cwd=cwd)


def _cases(xml_file: Path) -> dict[str, ET.Element]:
    root = ET.parse(xml_file).getroot()
    assert root.tag == "testsuites"
    (suite,) = root.findall("testsuite")
    return {c.attrib["name"]: c for c in suite.findall("testcase")}


def test_the_example_manifest_passes_and_writes_junit(tmp_path: Path) -> None:
    junit = tmp_path / "check.xml"
    proc = fuseplan("check", EXAMPLES / "check.yaml", "--junit", junit, "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["passed"] == 3 and doc["failed"] == 0 and doc["error"] == 0
    assert [c["name"] for c in doc["checks"]] == ["chain_cnn", "residual_net", "inception_net"]
    assert all(c["verify"]["ok"] for c in doc["checks"])
    cases = _cases(junit)
    assert sorted(cases) == ["chain_cnn", "inception_net", "residual_net"]
    assert all(c.find("failure") is None and c.find("error") is None for c in cases.values())
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite is not None and suite.attrib["tests"] == "3" and suite.attrib["failures"] == "0"


def _folder_copy(tmp_path: Path) -> Path:
    """The chain_cnn example in a folder of its own, with a manifest of two entries: the
    plan as committed, and one whose totals.dram_bytes was edited."""
    d = tmp_path / "c"
    shutil.copytree(EXAMPLES / "chain_cnn", d)
    doc: dict[str, Any] = json.loads((d / "plan.json").read_text())
    doc["totals"]["dram_bytes"] += 1000
    (d / "edited.json").write_text(json.dumps(doc))
    (tmp_path / "m.yaml").write_text(
        "checks:\n"
        "  - {name: good, model: c/model.onnx, plan: c/plan.json, chip: c/hardware.yaml}\n"
        "  - {name: edited, model: c/model.onnx, plan: c/edited.json, golden: c/golden.npz,\n"
        "     chip: c/hardware.yaml}\n")
    return tmp_path / "m.yaml"


def test_a_wrong_plan_fails_with_exit_1_and_a_junit_failure(tmp_path: Path) -> None:
    manifest = _folder_copy(tmp_path)
    junit = tmp_path / "out" / "j.xml"
    junit.parent.mkdir()
    proc = fuseplan("check", manifest, "--junit", junit)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    cases = _cases(junit)
    assert cases["good"].find("failure") is None
    failure = cases["edited"].find("failure")
    assert failure is not None and "totals.dram_bytes" in failure.attrib["message"]
    assert "1 passed, 1 failed" in " ".join(proc.stdout.split())


def test_a_bad_entry_is_exit_2_and_a_junit_error(tmp_path: Path) -> None:
    manifest = _folder_copy(tmp_path)
    (tmp_path / "m.yaml").write_text(manifest.read_text() + (
        "  - {name: other, model: c/model.onnx, plan: c/plan.json, weights: random,\n"
        "     golden: c/golden.npz}\n"))
    junit = tmp_path / "j.xml"
    proc = fuseplan("check", manifest, "--junit", junit, "--json")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    assert [c["status"] for c in doc["checks"]] == ["passed", "failed", "error"]
    error = _cases(junit)["other"].find("error")
    assert error is not None and "random weights" not in error.attrib["message"] and \
        "golden file was made with the model weights" in error.attrib["message"]


def test_a_bad_manifest_exits_2_naming_the_place(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("checks:\n  - {model: m.onnx, plan: p.json, weigths: model}\n")
    proc = fuseplan("check", bad)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "bad.yaml:2" in proc.stderr and "weigths" in proc.stderr, proc.stderr
    missing = tmp_path / "missing.yaml"
    missing.write_text("checks:\n  - {model: nowhere.onnx, plan: p.json}\n")
    proc = fuseplan("check", missing)
    said = " ".join(proc.stderr.split())
    assert proc.returncode == 2 and "p.json: no such plan file" in said, said
    assert "error: 1 of the 1 checks" in said
    empty = tmp_path / "empty.yaml"
    empty.write_text("checks: []\n")
    proc = fuseplan("check", empty)
    assert proc.returncode == 2 and "lists no checks" in proc.stderr, proc.stderr


def test_junit_refuses_to_overwrite_an_input(tmp_path: Path) -> None:
    manifest = _folder_copy(tmp_path)
    plan = tmp_path / "c" / "plan.json"
    before = plan.read_bytes()
    proc = fuseplan("check", manifest, "--junit", plan)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert plan.read_bytes() == before


def test_junit_escapes_what_xml_cannot_hold() -> None:
    """Node names may hold any character (issue 43): the XML still parses."""
    results = [CheckResult("a\x01<b>&\"", "failed", "tensor x\x0bq: off", 0.5),
               CheckResult("ok", "passed", "fine", 0.25),
               CheckResult("bad", "error", "no such file", 0.0)]
    root = ET.fromstring(junit_xml("m.yaml", results))
    suite = root.find("testsuite")
    assert suite is not None and suite.attrib["failures"] == "1" and suite.attrib["errors"] == "1"
    names = [c.attrib["name"] for c in suite.findall("testcase")]
    assert names == ["a\\u0001<b>&\"", "ok", "bad"]
    first = suite.findall("testcase")[0].find("failure")
    assert first is not None and first.attrib["message"] == "tensor x\\u000bq: off"
