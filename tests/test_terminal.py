"""Terminal text that fits (issue 47): every table and line of the commands' answers at 80
columns, numbers never cut (no ``…``, no number split from its unit or across lines), the
help of every command showing every bracket and no words a user does not have, ``--version``,
and a command line that starts without importing the planner."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path
from typing import Any

import onnx
import pytest
import typer
from rich.cells import cell_len
from typer.testing import CliRunner

from fuseplan.planner.core.units import fmt_bytes, rel_path, size_setting, vs_bytes
from fuseplan.planner.ui import cli_common
from fuseplan.planner.ui.cli import OBJECTIVES, app
from fuseplan.planner.ui.tables import LAST_ROWS, MOST_ROWS, Layout, paragraph
from tests import models

ROOT = Path(__file__).resolve().parent.parent
RESIDUAL = ROOT / "examples" / "residual_net" / "model.onnx"
RESIDUAL_CHIP = ROOT / "examples" / "residual_net" / "hardware.yaml"
EXPORT = ROOT / "examples" / "exports" / "mobilenet_v3_small.onnx"
EXPORT_SHAPE = "input=1,3,224,224"
WIDTH = 80
UNITS = r"(?:B|KiB|MiB|GiB|µJ|s)\b"


@pytest.fixture(autouse=True)
def narrow() -> Iterator[None]:
    """The consoles 80 columns wide, as a terminal of 80 x 24 (or a pipe) is."""
    kept = (cli_common.out._width, cli_common.err._width, Layout.wide)
    cli_common.out.width = cli_common.err.width = WIDTH
    Layout.wide = False
    yield
    cli_common.out._width, cli_common.err._width, Layout.wide = kept


def answer(*args: str, code: int = 0) -> str:
    """The command's stdout (in process), after checking its exit code."""
    res = CliRunner().invoke(app, list(args))
    assert res.exit_code == code, f"exit {res.exit_code}: {res.output}\n{res.exception!r}"
    return res.stdout


def assert_fits(text: str, whole: tuple[str, ...] = ()) -> None:
    """No line wider than 80 columns, nothing cut with `…`, no number split from its unit or
    across lines; each string of `whole` (numbers as the command writes them) on one line."""
    lines = text.splitlines()
    assert lines, "no output"
    for i, line in enumerate(lines):
        assert cell_len(line) <= WIDTH, f"line {i} is {cell_len(line)} columns:\n{text}"
        assert "…" not in line, f"line {i} is cut:\n{text}"
    for i, (a, b) in enumerate(zip(lines, lines[1:], strict=False)):
        assert not (re.search(r"\d[.,]?$", a.rstrip()) and re.match(UNITS, b.lstrip())), \
            f"a number and its unit split at line {i}:\n{text}"
        assert not (re.search(r"\d[.,]$", a.rstrip()) and re.match(r"\d", b.lstrip())), \
            f"a number split at line {i}:\n{text}"
    for s in whole:
        assert any(s in line for line in lines), f"{s!r} is not on one line:\n{text}"


# --------------------------------------------------------------------------- the commands


@pytest.fixture(scope="module")
def plans(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Plans of the example, of a zoo model and of a committed export."""
    work = tmp_path_factory.mktemp("terminal")
    made = {}
    for name, args in (("residual", [str(RESIDUAL), "--hw", str(RESIDUAL_CHIP)]),
                       ("squeezenet", ["zoo:squeezenet", "--time-limit", "10"]),
                       ("export", [str(EXPORT), "--shape", EXPORT_SHAPE, "--time-limit", "10"])):
        made[name] = work / f"{name}.json"
        answer("solve", *args, "-o", str(made[name]))
    return made


def _whole_plan(doc: dict[str, Any]) -> tuple[str, ...]:
    tiles = tuple(f"{g['tile']['n']}×{g['tile']['h']}×{g['tile']['w']}" for g in doc["groups"])
    return (*tiles, f"{doc['totals']['cycles']:,} cycles",
            fmt_bytes(doc["totals"]["dram_bytes"]))


@pytest.mark.parametrize(("name", "args"), [
    ("residual", [str(RESIDUAL), "--hw", str(RESIDUAL_CHIP)]),
    ("squeezenet", ["zoo:squeezenet", "--time-limit", "10"]),
    ("export", [str(EXPORT), "--shape", EXPORT_SHAPE, "--time-limit", "10"]),
])
def test_solve_fits(plans: dict[str, Path], name: str, args: list[str]) -> None:
    doc = json.loads(plans[name].read_text())
    assert_fits(answer("solve", *args), _whole_plan(doc))


def test_solve_wide_shows_every_column(plans: dict[str, Path]) -> None:
    narrow = answer("solve", str(RESIDUAL), "--hw", str(RESIDUAL_CHIP))
    wide = answer("solve", str(RESIDUAL), "--hw", str(RESIDUAL_CHIP), "--wide")
    assert "weights" not in narrow.split("─")[0] and "weights" in wide.split("─")[0]


def test_compare_fits() -> None:
    args = (str(RESIDUAL), "--hw", str(RESIDUAL_CHIP), "--time-limit", "10")
    text = answer("compare", *args)
    doc = json.loads(answer("compare", *args, "--json"))
    assert_fits(text, tuple(f"{r['cycles']:,}" for r in doc["rows"])
                + tuple(r["status"] for r in doc["rows"]) + ("shortest-path",))


@pytest.mark.parametrize("args", [["zoo:squeezenet"], [str(EXPORT), "--shape", EXPORT_SHAPE]])
def test_inspect_fits(args: list[str]) -> None:
    doc = json.loads(answer("inspect", *args, "--json"))
    layers = doc["layers"]
    shown = layers if len(layers) <= MOST_ROWS \
        else layers[:MOST_ROWS - LAST_ROWS] + layers[-LAST_ROWS:]
    text = answer("inspect", *args)
    assert_fits(text, tuple(f"{lay['macs']:,}" for lay in shown)
                + tuple(f"{lay['weight_elems']:,}" for lay in shown)
                + tuple("×".join(map(str, lay["out_shape"])) for lay in shown))
    if len(layers) > MOST_ROWS:
        assert f"{len(layers) - MOST_ROWS:,} not shown" in " ".join(text.split())


def test_a_long_plan_shows_its_first_and_last_groups(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A chain of 150 ReLUs plans as 150 groups: the table shows the first and the last
    (a terminal of thousands of rows reads as nothing, and took longer to render than to
    plan), says how many it leaves out and where they are; --json and the plan file hold
    every group."""
    path = tmp_path / "relus.onnx"
    nodes = [onnx.helper.make_node("Relu", [f"t{i}"], [f"t{i + 1}"], name=f"relu{i}")
             for i in range(150)]
    value = onnx.helper.make_tensor_value_info
    graph = onnx.helper.make_graph(nodes, "relus", [value("t0", 1, [1, 8, 16, 16])],
                                   [value("t150", 1, [1, 8, 16, 16])])
    onnx.save(onnx.helper.make_model(graph, opset_imports=[
        onnx.helper.make_opsetid("", 17)]), str(path))
    monkeypatch.chdir(tmp_path)  # a short plan path: a path is never wrapped
    plan = tmp_path / "plan.json"
    text = answer("solve", str(path), "-o", "plan.json")
    doc = json.loads(plan.read_text())
    assert len(doc["groups"]) == 150
    assert "90 not shown (the plan file and --json hold every group)" in " ".join(text.split())
    rows = [line.split()[0] for line in text.splitlines()[1:]  # under the title
            if line.strip() and (line.split()[0].isdigit() or line.split()[0] == "⋮")]
    assert rows == [*map(str, range(MOST_ROWS - LAST_ROWS)), "⋮",
                    *map(str, range(150 - LAST_ROWS, 150))]
    assert_fits(text)
    assert len(json.loads(answer("solve", str(path), "--json"))["groups"]) == 150


def test_explain_fits_and_says_what_binds(tmp_path: Path) -> None:
    """On a 24 KiB SRAM the chain's groups stop where capacities bind: explain --layer
    names them with needed against available in human bytes and a --set that lifts them."""
    model = ROOT / "examples" / "chain_cnn" / "model.onnx"
    plan = tmp_path / "plan.json"
    answer("solve", str(model), "--set", "sram.bytes=24KiB", "-o", str(plan))
    doc = json.loads(answer("explain", str(model), str(plan), "--set", "sram.bytes=24KiB",
                            "--json"))
    assert_fits(answer("explain", str(model), str(plan), "--set", "sram.bytes=24KiB"))
    binds = [v for b in doc["boundaries"] for v in b["binds"]]
    sram = [v for v in binds if v["rule"] == "HW" and v["name"] == "sram"]
    assert sram, doc["boundaries"]
    for v in sram:  # the fix holds what is needed; the numbers stay exact in the JSON
        assert v["allowed"] == 24 * 1024 and v["needed"] > v["allowed"]
        value = re.fullmatch(r"--set sram\.bytes=(\d+)(KiB|MiB)", v["fix"])
        assert value and int(value[1]) * {"KiB": 2**10, "MiB": 2**20}[value[2]] >= v["needed"]
    layer = next(b["next_layer"] for b in doc["boundaries"] if b["binds"])
    text = answer("explain", str(model), str(plan), "--set", "sram.bytes=24KiB", "--layer",
                  layer)
    assert_fits(text)
    assert f"layer {layer} is in group" in text and "--set sram.bytes=" in text
    assert re.search(r"\d KiB", text) and not re.search(r"\d{4,} B\b", text), text


def test_rules_doc_and_check_fit() -> None:
    assert_fits(answer("rules", "doc"))
    assert_fits(answer("rules", "check", str(ROOT / "rules" / "default.yaml")))


def test_verify_and_check_fit(plans: dict[str, Path]) -> None:
    text = answer("verify", str(RESIDUAL), str(plans["residual"]))
    assert_fits(text)
    assert not re.search(r"\d{4,} B\b", text), text  # bytes with their unit
    assert_fits(answer("check", str(ROOT / "examples" / "check.yaml")))


def test_diff_fits(plans: dict[str, Path], tmp_path: Path) -> None:
    other = tmp_path / "layer.json"
    answer("solve", str(RESIDUAL), "--hw", str(RESIDUAL_CHIP), "--solver", "layer", "-o",
           str(other))
    assert_fits(answer("diff", str(RESIDUAL), str(plans["residual"]), str(other)))


def test_partition_fits(tmp_path: Path) -> None:
    model = models.save(models.residual_net(), tmp_path, "res")
    doc = json.loads(answer("partition", str(model), "--json"))
    assert_fits(answer("partition", str(model)),
                tuple(f"{s['macs']:,}" for s in doc["subgraphs"]))


def test_pareto_fits(tmp_path: Path) -> None:
    model = models.save(models.chain_cnn(h=16, w=16), tmp_path, "chain")
    assert_fits(answer("pareto", str(model), "--points", "2", "--time-limit", "5", "--out-dir",
                       str(tmp_path / "front")))


def test_table_fits(tmp_path: Path) -> None:
    model = models.save(models.chain_cnn(), tmp_path, "chain")
    plan = tmp_path / "dyn.json"
    answer("solve", str(model), "--dynamic", "input:2=16..32", "--solver", "shortest-path",
           "--set", "sram.bytes=16KiB", "-o", str(plan))
    assert_fits(answer("table", str(plan), "--shape", "input=1,3,24,32", "--combination",
                       "simple", "--cache", str(tmp_path / "cache")))


# --------------------------------------------------------------------------- help and start


def _commands(group: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Every command of the app (groups too), with its path of names."""
    yield path, group
    ctx = group.context_class(group)
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        if hasattr(cmd, "list_commands"):
            yield from _commands(cmd, (*path, name))
        else:
            yield (*path, name), cmd


def test_every_help_shows_its_brackets_and_speaks_the_users_words() -> None:
    """Every option's help appears whole (rich markup eats an unescaped `[...]`), and no
    help speaks of the project's seeds."""
    for path, cmd in _commands(typer.main.get_command(app)):
        text = answer(*path, "--help")
        flat = " ".join(text.replace("│", " ").split())
        assert not re.search(r"\bseed 0\d\d\b", flat, re.IGNORECASE), (path, text)
        for param in cmd.params:
            said = getattr(param, "help", None) or ""
            for bracket in re.findall(r"\\\[[^\]]*\]", said):
                assert " ".join(bracket[1:].split()) in flat, (path, param.name, text)


def test_objective_help_lists_every_objective() -> None:
    from fuseplan.planner.cost.objective import Objective

    assert OBJECTIVES == tuple(o.value for o in Objective)


def test_version() -> None:
    import fuseplan

    assert answer("--version").strip() == f"fuseplan {version('fuseplan')}"
    assert fuseplan.__version__ == version("fuseplan")


def test_the_command_line_starts_without_the_planner() -> None:
    """Importing the CLI imports no solver, model reader or array library: --help and
    --version answer at once (bench/cli_startup times them)."""
    code = ("import json, sys; import fuseplan.planner.ui.cli; "
            "print(json.dumps(sorted(sys.modules)))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, cwd=ROOT)
    loaded = {m.split(".")[0] for m in json.loads(done.stdout)}
    heavy = {"ortools", "onnx", "onnxruntime", "numpy", "networkx", "pandas", "ray",
             "matplotlib", "scipy"}
    assert not loaded & heavy, sorted(loaded & heavy)
    mine = {m for m in json.loads(done.stdout) if m.startswith("fuseplan.")}
    assert not {m for m in mine if m.startswith(("fuseplan.planner.app", "fuseplan.solver",
                                                 "fuseplan.planner.front"))}, sorted(mine)


# --------------------------------------------------------------------------- formatting


def test_bytes_and_paths_as_people_read_them() -> None:
    assert [fmt_bytes(n) for n in (812, 18222, 3 * 2**20 + 2**19, 5 * 2**30)] == \
        ["812 B", "17.8 KiB", "3.50 MiB", "5.00 GiB"]
    assert vs_bytes(8192, 8191) == ("8,192 B", "8,191 B")
    assert vs_bytes(75776, 65536) == ("74.0 KiB", "64.0 KiB")
    assert size_setting(18222) == "18KiB" and size_setting(3 * 2**20) == "3MiB"
    assert size_setting(5 * 2**20 + 1) == "6MiB"
    assert rel_path(Path.cwd() / "a" / "b.onnx") == "a/b.onnx"
    assert rel_path("/nowhere/else.onnx") == "/nowhere/else.onnx"
    from fuseplan.planner.ui.cli_common import _relative

    here = str(Path.cwd())
    assert _relative(f"'{here}/m.onnx' and /x{here}/n.onnx") == f"'m.onnx' and /x{here}/n.onnx"
    # a number keeps its unit when a paragraph wraps
    lines = paragraph("x " * 30 + "DRAM 118.25 MiB and more words follow here", 64)
    assert not any(line.endswith("118.25") for line in lines), lines


def test_errors_are_coloured_on_a_terminal_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """`error:` in red where stderr is a colour terminal; plain under NO_COLOR or a pipe."""
    from rich.console import Console

    from fuseplan.planner.ui import cli_common as common

    for env, force, coloured in (({}, True, True), ({"NO_COLOR": "1"}, True, False),
                                 ({}, False, False)):
        written = io.StringIO()
        console = Console(file=written, force_terminal=force, width=80, _environ=env)
        monkeypatch.setattr(common, "err", console)
        common.say(f"{Path.cwd() / 'model.onnx'}: 18,222 bytes", "error")
        text = written.getvalue()
        red = re.search(r"\x1b\[(?:[\d;]*;)?31(?:;[\d;]*)?m(error:)\x1b\[0m", text)
        assert bool(red) == coloured, (env, force, text)
        assert "model.onnx: 18,222 bytes" in text and str(Path.cwd()) not in text, text
