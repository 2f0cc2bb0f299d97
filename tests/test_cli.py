"""The `fuseplan` command line as users and CI run it (CONTRACT.md): JSON documents with every
required field, exit codes 0/1/2, and one-paragraph errors without tracebacks.

Every test runs the installed console script in a subprocess.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests import models

ROOT = Path(__file__).resolve().parents[1]
FUSEPLAN = ROOT / ".venv" / "bin" / "fuseplan"
DEMO = ROOT / "planner" / "data" / "demo.onnx"
CHIP = ["--set", "sram.bytes=8KiB"]  # small enough for several groups and row tiles

PREDICTED = {"dram_read_bytes", "dram_write_bytes", "weight_read_bytes", "redundant_read_bytes",
             "sram_peak_bytes", "cycles", "energy_pj"}
TOTALS = {"dram_read_bytes", "dram_write_bytes", "dram_bytes", "weight_read_bytes",
          "compulsory_dram_bytes", "layer_by_layer_dram_bytes", "cycles", "energy_pj"}


def run(*args: str, cwd: Path | None = None, timeout: float = 300
        ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(FUSEPLAN), *args], capture_output=True, text=True, cwd=cwd,
                          timeout=timeout, env={"PATH": "/usr/bin:/bin", "COLUMNS": "100"})


def run_json(*args: str, expect: int = 0) -> Any:
    res = run(*args, "--json")
    assert res.returncode == expect, f"exit {res.returncode}: {res.stderr}"
    return json.loads(res.stdout)  # exactly one JSON document, nothing else on stdout


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("cli")
    models.save(models.residual_net(), d, "residual_net")
    return d


@pytest.fixture(scope="module")
def solved(work: Path) -> tuple[Path, Path, dict[str, Any]]:
    """residual_net solved with CP-SAT on a 16 KiB SRAM: (model, plan file, stdout JSON)."""
    model, plan = work / "residual_net.onnx", work / "plan.json"
    doc = run_json("solve", str(model), *CHIP, "-o", str(plan))
    return model, plan, doc


# --------------------------------------------------------------------------- solve


def test_solve_json_has_every_contract_field(solved: tuple[Path, Path, dict[str, Any]]) -> None:
    model, plan, doc = solved
    assert doc["fuseplan_plan"] == 1
    assert doc["model"]["sha256"] == hashlib.sha256(model.read_bytes()).hexdigest()
    assert doc["model"]["path"].endswith("residual_net.onnx")
    assert doc["model"]["inputs"] == {"input": [1, 3, 32, 32]}
    assert doc["hardware"]["name"] == "cluster4x4" and doc["hardware"]["file"]
    assert doc["rules"]["file"].endswith("default.yaml") and len(doc["rules"]["sha256"]) == 64
    assert doc["objective"] == "traffic"
    solver = doc["solver"]
    assert solver["name"] == "cpsat" and solver["status"] == "OPTIMAL"
    assert solver["gap"] == 0.0 and isinstance(solver["wall_s"], (int, float))
    assert len(doc["groups"]) > 1
    for i, g in enumerate(doc["groups"]):
        assert g["id"] == i
        assert g["fused"] == (len(g["layers"]) > 1)
        assert g["mode"] in ("big", "small")
        assert set(g["tile"]) >= {"n", "h", "w"} and min(g["tile"].values()) >= 1
        assert PREDICTED <= set(g["predicted"]), PREDICTED - set(g["predicted"])
    assert TOTALS <= set(doc["totals"]), TOTALS - set(doc["totals"])


def test_solve_json_totals_are_consistent(solved: tuple[Path, Path, dict[str, Any]]) -> None:
    model, plan, doc = solved
    t = doc["totals"]
    assert t["dram_bytes"] == t["dram_read_bytes"] + t["dram_write_bytes"]
    for key in ("dram_read_bytes", "dram_write_bytes", "weight_read_bytes", "cycles"):
        assert t[key] == sum(g["predicted"][key] for g in doc["groups"]), key
    assert t["compulsory_dram_bytes"] <= t["dram_bytes"] < t["layer_by_layer_dram_bytes"]
    layers = [lay["name"] for lay in run_json("inspect", str(model))["layers"]]
    planned = [n for g in doc["groups"] for n in g["layers"]]
    assert sorted(planned) == sorted(layers), "every layer in exactly one group"
    assert any(g["mode"] == "big" and g["tile"]["h"] < 32 for g in doc["groups"])


def test_solve_output_file_is_the_json_document(solved: tuple[Path, Path, dict[str, Any]]
                                                ) -> None:
    _, plan, doc = solved
    assert json.loads(plan.read_text()) == doc


def test_solve_table_output(solved: tuple[Path, Path, dict[str, Any]]) -> None:
    model, _, doc = solved
    res = run("solve", str(model), *CHIP)
    assert res.returncode == 0, res.stderr
    assert f"{len(doc['groups'])} groups" in res.stdout
    assert "compulsory" in res.stdout and "layer-by-layer" in res.stdout


# --------------------------------------------------------------------------- verify


def test_verify_json(solved: tuple[Path, Path, dict[str, Any]]) -> None:
    model, plan, doc = solved
    report = run_json("verify", str(model), str(plan))
    assert report["outputs_match"] is True
    assert report["predicted_matches_emulated"] is True
    assert report["capacity_violations"] == []
    assert report["reference"] == "onnxruntime"
    assert report["max_rel_err"] < 1e-3
    e = report["emulated"]
    assert {"dram_read_bytes", "dram_write_bytes", "dram_bytes", "weight_read_bytes",
            "sram_peak_bytes"} <= set(e)
    assert e["dram_bytes"] == doc["totals"]["dram_bytes"]
    assert e["weight_read_bytes"] == doc["totals"]["weight_read_bytes"]
    assert set(report["timing"]) >= {"emulator_s", "reference_s"}
    assert report["timing"]["emulator_s"] > 0


def test_verify_tampered_plan_exits_1(solved: tuple[Path, Path, dict[str, Any]],
                                      tmp_path: Path) -> None:
    """A plan whose predicted bytes were edited no longer matches what the emulator counts."""
    model, plan, _ = solved
    doc = json.loads(plan.read_text())
    doc["groups"][1]["predicted"]["dram_read_bytes"] += 64
    tampered = tmp_path / "tampered.json"
    tampered.write_text(json.dumps(doc))
    report = run_json("verify", str(model), str(tampered), expect=1)
    assert report["outputs_match"] is True
    assert report["predicted_matches_emulated"] is False
    assert re.search(r"group 1\b.*dram_read_bytes", report["first_counter_mismatch"])


def test_verify_plan_of_another_model_exits_2(solved: tuple[Path, Path, dict[str, Any]],
                                              work: Path) -> None:
    _, plan, _ = solved
    other = models.save(models.chain_cnn(), work, "chain_cnn")
    res = run("verify", str(other), str(plan), "--json")
    assert res.returncode == 2, res.stderr
    assert "different model" in res.stderr and "Traceback" not in res.stderr


# --------------------------------------------------------------------------- compare


def test_compare_json(solved: tuple[Path, Path, dict[str, Any]]) -> None:
    model, _, doc = solved
    cmp = run_json("compare", str(model), *CHIP)
    rows = {r["solver"]: r for r in cmp["rows"]}
    assert len(cmp["rows"]) == 4 and set(rows) == {"layer", "greedy", "shortest-path", "cpsat"}
    for r in cmp["rows"]:
        assert {"dram_bytes", "cycles", "energy_pj", "groups", "wall_s", "status"} <= set(r)
    assert cmp["compulsory_dram_bytes"] == doc["totals"]["compulsory_dram_bytes"]
    d = {k: r["dram_bytes"] for k, r in rows.items()}
    assert cmp["compulsory_dram_bytes"] <= d["cpsat"] <= d["greedy"] <= d["layer"], d
    assert d["cpsat"] == doc["totals"]["dram_bytes"]
    assert rows["cpsat"]["groups"] == len(doc["groups"])


# --------------------------------------------------------------------------- explain


def test_explain_json(solved: tuple[Path, Path, dict[str, Any]]) -> None:
    model, plan, doc = solved
    out = run_json("explain", str(model), str(plan))
    assert out["violations"] == []
    assert len(out["boundaries"]) == len(doc["groups"]) - 1
    for b in out["boundaries"]:
        assert b["reasons"], f"no reason for the boundary after group {b['group']}"


def test_explain_layer(solved: tuple[Path, Path, dict[str, Any]]) -> None:
    model, plan, doc = solved
    name = doc["groups"][1]["layers"][-1]
    out = run_json("explain", str(model), str(plan), "--layer", name)
    assert out["layer"]["name"] == name
    assert out["layer"]["group"] == 1
    assert out["layer"]["group_layers"] == doc["groups"][1]["layers"]
    res = run("explain", str(model), str(plan), "--layer", "no_such_layer", "--json")
    assert res.returncode == 2 and "no_such_layer" in res.stderr


def test_explain_reports_a_broken_rule_with_exit_1(solved: tuple[Path, Path, dict[str, Any]],
                                                   tmp_path: Path) -> None:
    """Re-checked against stricter rules, the plan's fused groups break them: exit 1."""
    model, plan, _ = solved
    strict = tmp_path / "strict.yaml"
    strict.write_text("rules:\n  stride_redundancy: {threshold: 0, exempt_whole_blocks: false, "
                      "applies_to: all}\n")
    res = run("explain", str(model), str(plan), "--rules", str(strict), "--json")
    assert res.returncode == 1, res.stderr
    found = json.loads(res.stdout)["violations"]
    assert found and all(v["rule"] == "R19" for v in found)
    assert all(v["needed"] > v["allowed"] == 0 for v in found)


def test_explain_numbers_support_not_better(tmp_path: Path) -> None:
    """An "allowed, but not better" boundary must show the alternative's cost >= the planned
    cost (without block groups the demo's first group could take relu17, and CP-SAT proved
    that is no better; with them the demo is one group and has no boundary)."""
    rules = tmp_path / "no_block_groups.yaml"
    text = (ROOT / "rules" / "default.yaml").read_text()
    # two sub-map buffers per core (rule 17) keep the demo's maps from fusing whole
    rules.write_text(text.replace("max_block_group_layers: 60", "max_block_group_layers: 0")
                     .replace("submap_fits_nram: {enabled: true, buffers: 1}",
                              "submap_fits_nram: {enabled: true, buffers: 2}"))
    plan = tmp_path / "demo.json"
    assert run("solve", str(DEMO), "--rules", str(rules), "-o", str(plan)).returncode == 0
    out = run_json("explain", str(DEMO), str(plan))
    claims = [(b, r) for b in out["boundaries"] for r in b["reasons"] if "not better" in r]
    assert claims, f"no 'not better' boundary to check: {out['boundaries']}"
    for b, reason in claims:  # the exact objective values beside the words (human bytes)
        alternative, planned = b["moved_cost"], b["planned_cost"]
        assert alternative >= planned, (
            f"boundary after group {b['group']} before {b['next_layer']}: {reason}")
        assert re.search(r"not better: traffic [\d.,]+ (B|KiB|MiB) with the layer moved vs "
                         r"[\d.,]+ (B|KiB|MiB) as planned", reason), reason


# --------------------------------------------------------------------------- inspect / rules


def test_inspect_zoo_squeezenet() -> None:
    doc = run_json("inspect", "zoo:squeezenet")
    assert doc["inputs"] == {"data_0": [1, 3, 224, 224]}
    names = [lay["name"] for lay in doc["layers"]]
    assert len(names) == len(set(names)) == doc["totals"]["layers"] > 50
    ops = {lay["op"] for lay in doc["layers"]}
    assert {"Conv", "Relu", "MaxPool", "Concat"} <= ops
    assert doc["blocks"], "squeezenet's fire modules are blocks"
    assert doc["totals"]["macs"] == sum(lay["macs"] for lay in doc["layers"]) > 10**8
    assert len(doc["model"]["sha256"]) == 64
    # how tiles cut each layer's output, and its inputs' row maps
    conv = next(lay for lay in doc["layers"] if lay["op"] == "Conv")
    assert conv["layout"] == {"kind": "NCHW", "batch_axis": 0, "row_axis": 2, "col_axis": 3}
    assert conv["row_maps"] == ["window k3 s2 p0"] and conv["col_maps"] == ["window k3 s2 p0"]


# --------------------------------------------------------------------------- exit 2


@pytest.fixture(scope="module")
def bad_inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("bad")
    (d / "garbage.onnx").write_bytes(bytes(range(256)) * 8)
    data = DEMO.read_bytes()
    (d / "truncated.onnx").write_bytes(data[: len(data) * 2 // 3])
    (d / "bad_rules.yaml").write_text("rules:\n  redundancy: {threshold_pct: 100}\n"
                                      "  stride_redundancy: {treshold: 3}\n")
    (d / "broken.yaml").write_text("rules:\n  redundancy: {threshold_pct: [5\n")
    return d


BAD = [
    pytest.param(["solve", "{d}/missing.onnx"], r"missing\.onnx.*does not exist",
                 id="missing-file"),
    pytest.param(["solve", "{d}/garbage.onnx"], r"garbage\.onnx.*not a readable ONNX model",
                 id="garbage-onnx"),
    pytest.param(["solve", "{d}/truncated.onnx"], r"truncated\.onnx.*not a readable ONNX",
                 id="truncated-model"),
    pytest.param(["solve", "zoo:resnet5"], r"Unknown zoo model 'resnet5'.*Did you mean "
                 r"'zoo:resnet50'", id="unknown-zoo"),
    pytest.param(["inspect", "zoo:squeezenet", "--shape", "data_0=1,3,x"],
                 r"--shape.*data_0=1,3,x.*NAME=D0,D1", id="bad-shape-dims"),
    pytest.param(["solve", str(DEMO), "--shape", "nosuch=1,3,8,8"], r"nosuch",
                 id="shape-unknown-input"),
    pytest.param(["solve", str(DEMO), "--rules", "{d}/bad_rules.yaml"],
                 r"bad_rules\.yaml:3:23: unknown key `treshold`.*Did you mean 'threshold'",
                 id="bad-rules-key"),
    pytest.param(["solve", str(DEMO), "--rules", "{d}/broken.yaml"],
                 r"broken\.yaml:\d+:\d+: invalid YAML", id="broken-rules-yaml"),
    pytest.param(["solve", str(DEMO), "--rules", "{d}/no_rules.yaml"], r"no_rules\.yaml",
                 id="missing-rules-file"),
    pytest.param(["solve", str(DEMO), "--hw", "clusterx"],
                 r"unknown chip preset 'clusterx'.*Did you mean 'cluster4x4'", id="unknown-hw"),
    pytest.param(["solve", str(DEMO), "--set", "sram.byte=1MiB"],
                 r"--set sram\.byte=1MiB.*unknown key `byte`.*Did you mean 'bytes'",
                 id="bad-set-key"),
    pytest.param(["solve", str(DEMO), "--set", "sram.bytes=lots"], r"`bytes` must be a size",
                 id="bad-set-value"),
    pytest.param(["solve", str(DEMO), "--set", "nonsense"], r"malformed override",
                 id="bad-set-syntax"),
    pytest.param(["solve", str(DEMO), "--solver", "magic"], r"unknown solver 'magic'",
                 id="bad-solver"),
    pytest.param(["solve", str(DEMO), "--objective", "speed"], r"unknown objective 'speed'",
                 id="bad-objective"),
    pytest.param(["verify", str(DEMO), "{d}/garbage.onnx"], r"garbage\.onnx.*not a JSON plan",
                 id="verify-binary-plan"),
    pytest.param(["explain", str(DEMO), "{d}/garbage.onnx"], r"garbage\.onnx.*not a JSON plan",
                 id="explain-binary-plan"),
    pytest.param(["verify", str(DEMO), "{d}/missing.json"], r"missing\.json: no such plan file",
                 id="verify-missing-plan"),
]


@pytest.mark.parametrize(("args", "pattern"), BAD)
def test_bad_input_exits_2_with_one_paragraph(bad_inputs: Path, args: list[str],
                                              pattern: str) -> None:
    res = run(*[a.format(d=bad_inputs) for a in args], "--json")
    err = res.stderr.strip()
    assert res.returncode == 2, f"exit {res.returncode}: {err or res.stdout[:500]}"
    assert "Traceback" not in res.stderr and "Traceback" not in res.stdout
    assert err, "an error message is required on stderr"
    assert "\n\n" not in err, f"not one paragraph:\n{err}"
    assert re.search(pattern, " ".join(err.split())), f"{pattern!r} not in:\n{err}"
    doc = json.loads(res.stdout)  # the error document alone: no partial JSON on stdout
    assert doc["exit"] == 2 and doc["error"]["kind"] == "bad_input", doc
    assert doc["error"]["message"] == " ".join(err.removeprefix("error: ").split()), doc


def _edit(doc: dict[str, Any], how: str) -> None:
    g = doc["groups"]
    if how == "model-not-a-mapping":
        doc["model"] = "residual_net.onnx"
    elif how == "predicted-not-a-number":
        g[0]["predicted"]["dram_read_bytes"] = "many"
    elif how == "tile-not-integers":
        g[0]["tile"]["h"] = "tall"
    elif how == "layer-in-two-groups":
        g[1]["layers"].append(g[0]["layers"][0])
    elif how == "groups-out-of-order":  # a consumer's group listed before its producer's
        g[0], g[1] = g[1], g[0]


EDITS = ["model-not-a-mapping", "predicted-not-a-number", "tile-not-integers",
         "layer-in-two-groups"]


@pytest.mark.parametrize(("command", "how"), [(c, h) for c in ("verify", "explain") for h in EDITS]
                         + [("verify", "groups-out-of-order")])
def test_hand_edited_plan_is_bad_input(solved: tuple[Path, Path, dict[str, Any]],
                                       tmp_path: Path, command: str, how: str) -> None:
    """Plan files are JSON that people edit: a malformed one is exit 2 with the file named
    (a valid one listed out of order may also be run in dependency order: exit 0) -- never
    a traceback."""
    model, plan, _ = solved
    doc = json.loads(plan.read_text())
    _edit(doc, how)
    edited = tmp_path / f"{how}.json"
    edited.write_text(json.dumps(doc))
    res = run(command, str(model), str(edited), "--json")
    assert "Traceback" not in res.stderr, f"{command} crashed on a plan with {how}:\n" + \
        "\n".join(line for line in res.stderr.splitlines() if "│  " not in line)[-800:]
    if how == "groups-out-of-order" and res.returncode == 0:
        return
    assert res.returncode == 2, (res.returncode, res.stderr)
    assert f"{how}.json" in " ".join(res.stderr.split())


def test_unknown_zoo_message_suggests_a_real_option() -> None:
    """The error says what to do; the advice must be a command that exists. MODEL is a
    positional argument: there is no --model option."""
    res = run("solve", "zoo:resnet5")
    assert res.returncode == 2
    assert "--model" not in res.stderr, res.stderr


# --------------------------------------------------------------------------- exit 1


def test_infeasible_chip_exits_1(work: Path) -> None:
    res = run("solve", str(work / "residual_net.onnx"), "--set", "sram.bytes=1KiB", "--json")
    assert res.returncode == 1, res.stderr
    msg = " ".join(res.stderr.split())
    # human bytes; the value to set is one that holds what the layer needs
    found = re.search(r"layer 'stem3' \(Conv\).*SRAM needs ([\d.,]+) (B|KiB|MiB) but has "
                      r"1\.0 KiB \([\d.,]+ (?:B|KiB|MiB) over\)", msg)
    assert found, msg
    needed = float(found[1].replace(",", "")) * {"B": 1, "KiB": 2**10, "MiB": 2**20}[found[2]]
    assert needed > 1024
    assert "Traceback" not in res.stderr
    error = json.loads(res.stdout)["error"]
    setting = re.fullmatch(r"Use a chip with more on-chip memory \(e\.g\. --set "
                           r"sram\.bytes=(\d+)KiB\) or a smaller input shape\.", error.pop("fix"))
    assert setting and int(setting[1]) * 1024 >= needed, error
    assert error == {"kind": "no", "message": msg.removeprefix("no plan: "), "file": None,
                     "place": "layer 'stem3'", "where": "layer 'stem3'"}


@pytest.mark.parametrize("solver", ["greedy", "layer"])
def test_infeasible_chip_exits_1_for_every_solver(work: Path, solver: str) -> None:
    res = run("solve", str(work / "residual_net.onnx"), "--set", "sram.bytes=1KiB",
              "--solver", solver, "--json")
    assert res.returncode == 1, (
        f"--solver {solver} on a 1 KiB SRAM exited {res.returncode}; stdout starts "
        f"{res.stdout[:200]!r}")


def test_rules_check_failed_rule_file_exits_2(bad_inputs: Path) -> None:
    res = run("rules", "check", str(bad_inputs / "bad_rules.yaml"))
    assert res.returncode == 2 and "bad_rules.yaml:3:23" in " ".join(res.stderr.split())
