"""Answers users can trust (issue 43): an output never destroys an input, inputs are bounded.

Every command that writes files refuses, with exit 2 and one paragraph naming the option, the
path and the fix, before any work, an output that is one of its inputs or another of its
outputs, or that is not a regular or new file (a device, a FIFO, /proc, a symlink to
/dev/null). Plan, chip, rule and sweep files are read only from regular files within a size
cap, decided by stat before they are opened; YAML is bounded in depth and aliases. The
dynamic table cache lives in the per-user cache folder, never the working directory.

Commands run in process through typer's CliRunner (an escaped exception is a traceback);
FIFO cases run as real processes, with a timeout, since a blocked read would hang the test.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from fuseplan.planner.app.dynamic_api import cache_path, default_cache_dir
from fuseplan.planner.core.errors import InputError
from fuseplan.planner.core.files import Input, Output, check_io
from fuseplan.planner.core.yamlio import MAX_YAML_DEPTH, load_yaml
from tests import models
from tests.test_hostile import run  # the CLI in process, its output as written
from tests.test_hostile_inputs import says  # a message's words, wrapping ignored

ROOT = Path(__file__).resolve().parents[1]
FUSEPLAN = ROOT / ".venv" / "bin" / "fuseplan"
DEMO = ROOT / "planner" / "data" / "demo.onnx"
RULES = ROOT / "rules" / "default.yaml"
CHIP = ROOT / "hardware" / "two_level.yaml"


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with a copy of the demo model, the default rules, a chip and a plan."""
    d = tmp_path_factory.mktemp("outputs")
    shutil.copy(DEMO, d / "m.onnx")
    shutil.copy(DEMO, d / "m.svg")  # a model --plot could name (it writes .svg or .png)
    shutil.copy(RULES, d / "rules.yaml")
    shutil.copy(CHIP, d / "chip.yaml")
    code, text = run("solve", str(d / "m.onnx"), "-o", str(d / "plan.json"))
    assert code == 0, text
    return d


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every regular file of `folder` with its bytes (to show nothing changed or appeared)."""
    return {p.name: p.read_bytes() for p in folder.iterdir()
            if p.is_file() and not p.is_symlink()}


def refused(work: Path, args: list[str], *words: str) -> str:
    """Run `args` (with {w} for the work folder); assert exit 2, the words, no traceback, and
    that no file of the folder changed and none appeared."""
    before = snapshot(work)
    names = set(os.listdir(work))
    code, text = run(*[a.format(w=work) for a in args])
    assert code == 2, text
    assert says(text, *words), text
    assert "Traceback" not in text
    assert snapshot(work) == before
    assert set(os.listdir(work)) == names
    return text


# --------------------------------------------------------------------------- output == input

@pytest.mark.parametrize(("args", "option", "input_"), [
    (["solve", "{w}/m.onnx", "-o", "{w}/m.onnx"], "-o/--output", "MODEL"),
    (["solve", "{w}/m.onnx", "--report", "{w}/m.onnx"], "--report", "MODEL"),
    (["solve", "{w}/m.onnx", "--rules", "{w}/rules.yaml", "-o", "{w}/rules.yaml"],
     "-o/--output", "--rules"),
    (["solve", "{w}/m.onnx", "--hw", "{w}/chip.yaml", "-o", "{w}/chip.yaml"],
     "-o/--output", "--hw"),
    (["solve", "{w}/m.onnx", "-o", "{w}/./sub/../m.onnx"], "-o/--output", "MODEL"),
    (["export", "{w}/m.onnx", "{w}/plan.json", "-o", "{w}/plan.json"], "-o/--output", "PLAN"),
    (["export", "{w}/m.onnx", "{w}/plan.json", "-o", "{w}/x.onnx", "--dot", "{w}/m.onnx"],
     "--dot", "MODEL"),
    (["report", "{w}/m.onnx", "{w}/plan.json", "-o", "{w}/m.onnx"], "-o/--output", "MODEL"),
    (["report", "{w}/m.onnx", "{w}/plan.json", "--rules", "{w}/rules.yaml", "-o",
      "{w}/rules.yaml"], "-o/--output", "--rules"),
    (["verify", "{w}/m.onnx", "{w}/plan.json", "--save-golden", "{w}/plan.json"],
     "--save-golden", "PLAN"),
    (["pareto", "{w}/m.svg", "--out-dir", "{w}", "--plot", "{w}/m.svg"], "--plot", "MODEL"),
])
def test_output_that_is_an_input_is_refused(work: Path, args: list[str], option: str,
                                            input_: str) -> None:
    text = refused(work, args, option, "refused before any work", input_, "would overwrite",
                   "Write the output elsewhere")
    assert text.count("error:") == 1


def test_output_through_a_symlink_or_hard_link_to_the_input_is_refused(work: Path) -> None:
    link = work / "alias.onnx"
    hard = work / "hard.onnx"
    link.symlink_to(work / "m.onnx")
    os.link(work / "m.onnx", hard)
    try:
        refused(work, ["solve", "{w}/m.onnx", "-o", str(link)], "-o/--output", "MODEL")
        refused(work, ["solve", "{w}/m.onnx", "-o", str(hard)], "-o/--output", "MODEL")
    finally:
        link.unlink()
        hard.unlink()


def test_folder_output_that_would_write_over_an_input_is_refused(work: Path) -> None:
    # pareto writes pareto_0.json... into --out-dir: a plan read from there would be lost
    sub = work / "front"
    sub.mkdir()
    shutil.copy(work / "m.onnx", sub / "pareto_0.json")  # an odd name, but an input
    try:
        code, text = run("pareto", str(sub / "pareto_0.json"), "--out-dir", str(sub))
        assert code == 2 and says(text, "--out-dir", "would overwrite", "inside it"), text
    finally:
        shutil.rmtree(sub)


@pytest.mark.parametrize("args", [
    ["solve", "{w}/m.onnx", "-o", "{w}/x.json", "--report", "{w}/x.json"],
    ["export", "{w}/m.onnx", "{w}/plan.json", "-o", "{w}/x.onnx", "--dot", "{w}/x.onnx"],
])
def test_two_outputs_on_one_path_are_refused(work: Path, args: list[str]) -> None:
    refused(work, args, "refused before any work", "one would overwrite the other",
            "Give each output its own path")


# --------------------------------------------------------------------------- not a file

@pytest.mark.parametrize("target", ["/dev/null", "/proc/self/fd/2", "{w}/devnull-link",
                                    "{w}/full-link", "{w}/fifo"])
def test_output_that_is_not_a_regular_file_is_refused(work: Path, target: str) -> None:
    (work / "devnull-link").symlink_to("/dev/null")
    (work / "full-link").symlink_to("/dev/full")
    os.mkfifo(work / "fifo")
    try:
        text = refused(work, ["solve", "{w}/m.onnx", "-o", target], "-o/--output",
                       target.format(w=work), "cannot write the plan file")
        assert says(text, "regular file"), text
    finally:
        for name in ("devnull-link", "full-link", "fifo"):
            (work / name).unlink()
    assert os.path.islink("/dev/null") or os.path.exists("/dev/null")


def test_folder_output_on_an_input_file_is_refused(work: Path) -> None:
    refused(work, ["table", "{w}/plan.json", "--shape", "input=1,3,8,8", "--cache",
                   "{w}/plan.json"], "--cache", "regular file, not a folder",
            "nothing was written", "Name a folder")
    refused(work, ["partition", "{w}/m.onnx", "--out-dir", "{w}/m.onnx"], "--out-dir",
            "not a folder")


def test_folder_output_that_is_a_device_is_refused(work: Path) -> None:
    refused(work, ["pareto", "{w}/m.onnx", "--out-dir", "/dev/null"], "--out-dir", "/dev/null",
            "character device")
    refused(work, ["sweep", "{w}/rules.yaml", "--out", "/dev/null"], "--out", "/dev/null")


# --------------------------------------------------------------------------- bounded inputs

@pytest.mark.parametrize(("args", "option"), [
    (["verify", "{w}/m.onnx", "/dev/zero"], "PLAN /dev/zero"),
    (["explain", "{w}/m.onnx", "/dev/urandom"], "PLAN /dev/urandom"),
    (["solve", "{w}/m.onnx", "--rules", "/dev/zero"], "--rules /dev/zero"),
    (["solve", "{w}/m.onnx", "--hw", "/dev/zero"], "--hw /dev/zero"),
    (["rules", "check", "/dev/urandom"], "PATH /dev/urandom"),
    (["sweep", "/dev/zero"], "SPEC /dev/zero"),
    (["table", "/dev/zero", "--shape", "input=1,3,8,8"], "PLAN /dev/zero"),
    (["diff", "{w}/plan.json", "/dev/zero"], "PLAN_B /dev/zero"),
])
def test_device_inputs_are_refused_before_reading(work: Path, args: list[str],
                                                  option: str) -> None:
    refused(work, args, option, "character device", "not a regular file", "Pass")


def test_oversized_plan_is_refused_by_stat(work: Path, tmp_path: Path) -> None:
    from fuseplan.planner.plan.schema import MAX_PLAN_BYTES

    big = tmp_path / "big.json"
    with open(big, "wb") as f:  # sparse: no disk used, but stat says it is too large
        f.truncate(MAX_PLAN_BYTES + 1)
    code, text = run("verify", str(work / "m.onnx"), str(big))
    assert code == 2 and says(text, str(big), "too large", f"{MAX_PLAN_BYTES:,}"), text


@pytest.mark.parametrize("args", [
    ["verify", "{m}", "{fifo}"],
    ["solve", "{m}", "--rules", "{fifo}"],
    ["solve", "{m}", "--hw", "{fifo}"],
    ["rules", "check", "{fifo}"],
])
def test_fifo_inputs_are_refused_without_blocking(work: Path, tmp_path: Path,
                                                  args: list[str]) -> None:
    fifo = tmp_path / "pipe.yaml"
    os.mkfifo(fifo)
    argv = [a.format(m=work / "m.onnx", fifo=fifo) for a in args]
    done = subprocess.run([str(FUSEPLAN), *argv], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert says(done.stderr, str(fifo), "FIFO", "not a regular file"), done.stderr
    assert "Traceback" not in done.stderr


# --------------------------------------------------------------------------- YAML shape

def test_yaml_nested_20000_levels_is_refused_quickly(tmp_path: Path) -> None:
    deep = tmp_path / "deep.yaml"
    deep.write_text("rules: " + "[" * 20000 + "]" * 20000 + "\n")
    block = tmp_path / "block.yaml"
    block.write_text("rules:\n  " + "- " * 20000 + "x\n")
    for path in (deep, block):
        code, text = run("rules", "check", str(path))
        assert code == 2, text
        assert says(text, f"{path}:", f"more than {MAX_YAML_DEPTH} levels", "Flatten"), text
        with pytest.raises(InputError, match=r":\d+:\d+: the YAML is nested"):
            load_yaml(path)


def test_yaml_alias_bomb_is_refused(tmp_path: Path) -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 9)]
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("\n".join(lines) + "\n")
    code, text = run("solve", str(DEMO), "--hw", str(bomb))
    assert code == 2 and says(text, f"{bomb}:", "aliases", "anchors"), text


def test_ordinary_yaml_with_a_few_aliases_still_loads(tmp_path: Path) -> None:
    ok = tmp_path / "ok.yaml"
    ok.write_text("base: &b {x: 1}\nother: *b\nlist: [[[1]]]\n")
    assert load_yaml(ok)["other"]["x"] == 1


# --------------------------------------------------------------------------- check_io

def test_check_io_accepts_new_and_regular_files(tmp_path: Path) -> None:
    src = tmp_path / "in.yaml"
    src.write_text("a: 1\n")
    (tmp_path / "old.json").write_text("{}")
    check_io([Input("--rules", src, "rule file", 100)],
             [Output("-o", tmp_path / "new.json", "plan file"),
              Output("--report", tmp_path / "old.json", "HTML report"),
              Output("--out-dir", tmp_path / "folder", "folder", folder=True),
              Output("--plot", tmp_path / "folder" / "front.svg", "chart")])
    with pytest.raises(InputError, match="too large"):
        check_io([Input("--rules", src, "rule file", 2)], [])


# --------------------------------------------------------------------------- still working

def test_solve_writes_a_plan_and_report(work: Path, tmp_path: Path) -> None:
    plan, report = tmp_path / "plan.json", tmp_path / "r.html"
    code, text = run("solve", str(work / "m.onnx"), "-o", str(plan), "--report", str(report))
    assert code == 0, text
    assert json.loads(plan.read_text())["fuseplan_plan"] == 1
    assert report.read_text().lstrip().lower().startswith("<!doctype html")


def test_overwriting_an_earlier_output_still_works(work: Path, tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text("old")
    code, text = run("solve", str(work / "m.onnx"), "-o", str(plan))
    assert code == 0, text
    assert json.loads(plan.read_text())["fuseplan_plan"] == 1


# --------------------------------------------------------------------------- table cache

def test_default_table_cache_is_per_user(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                         ) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "fuseplan" / "tables"
    assert cache_path(tmp_path / "mine") == tmp_path / "mine"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_cache_dir() == tmp_path / "home" / ".cache" / "fuseplan" / "tables"


def test_table_writes_no_cache_in_the_working_directory(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    model = models.save(models.chain_cnn(), tmp_path, "chain")
    code, text = run("solve", str(model), "--dynamic", "input:2=16..32", "--solver",
                     "shortest-path", "-o", str(tmp_path / "dyn.json"))
    assert code == 0, text
    here = tmp_path / "cwd"
    here.mkdir()
    monkeypatch.chdir(here)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    code, text = run("table", str(tmp_path / "dyn.json"), "--shape", "input=1,3,24,32",
                     "--combination", "simple", "--json")
    assert code == 0, text
    assert list(here.iterdir()) == []
    assert any((tmp_path / "xdg" / "fuseplan" / "tables").rglob("*"))
