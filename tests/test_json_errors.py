"""Answers users can trust (issue 43): one JSON document on stdout for every ``--json``
answer, errors included; messages that say what is wrong; plans of models whose node names
hold control characters; sweeps bounded before they start.

Commands run in process through typer's CliRunner (fast, and an exception escaping the CLI
fails the test) and, where the console script itself matters (its stdout, its signals), as
real processes.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import onnx
import pytest
import typer.main
from typer.testing import CliRunner

from fuseplan.planner.app import api
from fuseplan.planner.app.sweep import MAX_POINTS, load_spec
from fuseplan.planner.app.sweep import store as sweep_store
from fuseplan.planner.core.errors import InputError
from fuseplan.planner.ui.cli import app
from fuseplan.planner.ui.cli_common import printable
from fuseplan.planner.ui.ending import error_doc
from fuseplan.solver.shortest_path import binding_memory
from tests import models
from tests.interrupt import interrupt_when_loaded, interrupt_when_workers

ROOT = Path(__file__).resolve().parents[1]
FUSEPLAN = ROOT / ".venv" / "bin" / "fuseplan"
DEMO = str(ROOT / "planner" / "data" / "demo.onnx")
ERROR_KEYS = {"kind", "message", "file", "place", "fix", "where"}


def invoke(*args: str) -> Any:
    """`fuseplan ARGS` in process; an exception escaping the CLI fails the test."""
    result = CliRunner().invoke(app, list(args), catch_exceptions=True)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"traceback for {args}: {result.exception!r}") from result.exception
    return result


def one_error(result: Any, code: int, kind: str) -> dict[str, Any]:
    """The error document, checked: stdout holds it alone, the exit and kind are `code` and
    `kind`, stderr says the paragraph, and nothing is a traceback."""
    assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr)
    doc = json.loads(result.stdout)  # one JSON document and nothing else
    assert set(doc) == {"error", "exit"} and doc["exit"] == code, doc
    error = doc["error"]
    assert set(error) == ERROR_KEYS and error["kind"] == kind, error
    assert error["message"] and result.stderr.strip(), (error, result.stderr)
    assert "Traceback" not in result.stdout + result.stderr
    return error


def json_commands() -> list[str]:
    """Every command of the app that takes --json, as its words ("rules check")."""
    found = []

    def walk(group: Any, prefix: tuple[str, ...]) -> None:
        for name, cmd in group.commands.items():
            if hasattr(cmd, "commands"):
                walk(cmd, (*prefix, name))
            elif any("--json" in getattr(p, "opts", ()) for p in cmd.params):
                found.append(" ".join((*prefix, name)))

    walk(typer.main.get_command(app), ())
    return sorted(found)


# a bad input for every command that takes --json: a file that does not exist, or, for the
# command that reads none, an argument it does not take
BAD: dict[str, list[str]] = {
    "solve": ["solve", "{d}/missing.onnx"],
    "pareto": ["pareto", DEMO, "--plot", "{d}/front.gif"],
    "partition": ["partition", "{d}/missing.onnx"],
    "verify": ["verify", DEMO, "{d}/missing.json"],
    "compare": ["compare", DEMO, "--rules", "{d}/missing.yaml"],
    "explain": ["explain", DEMO, "{d}/missing.json"],
    "inspect": ["inspect", "{d}/missing.onnx"],
    "demo": ["demo", "extra-argument"],
    "table": ["table", "{d}/missing.json"],
    "rules check": ["rules", "check", "{d}/missing.yaml"],
    "report": ["report", DEMO, "{d}/missing.json", "-o", "{d}/report.html"],
    "export": ["export", DEMO, "{d}/missing.json", "-o", "{d}/annotated.onnx"],
    "diff": ["diff", "{d}/missing_a.json", "{d}/missing_b.json"],
    "sweep": ["sweep", "{d}/missing.yaml", "--out", "{d}/out"],
    "check": ["check", "{d}/missing.yaml"],
}


def test_every_json_command_has_a_bad_input_case() -> None:
    commands = json_commands()
    assert {"solve", "verify", "sweep", "rules check", "diff"} <= set(commands), commands
    assert not set(commands) - set(BAD), f"add a bad input for {set(commands) - set(BAD)}"


@pytest.mark.parametrize("command", sorted(BAD))
def test_bad_input_is_one_json_document(tmp_path: Path, command: str) -> None:
    if command not in json_commands():
        pytest.skip(f"no `{command}` command with --json in this version")
    result = invoke(*[a.format(d=tmp_path) for a in BAD[command]], "--json")
    error = one_error(result, 2, "bad_input")
    words = " ".join(result.stderr.split())
    assert error["message"] in words, (error["message"], words)
    assert error["fix"] is None or error["fix"] in error["message"] \
        or error["fix"].endswith(f"{command} --help` for the options and arguments.")
    if error["file"] is not None:
        assert error["file"] in error["message"]
    assert not (tmp_path / "out").exists(), "nothing is made for a bad input"


@pytest.mark.parametrize("command", json_commands())
def test_usage_error_is_one_json_document(command: str) -> None:
    """An option the command does not have: typer's usage error, as the JSON answer too."""
    result = invoke(*command.split(), "--no-such-option", "--json")
    error = one_error(result, 2, "bad_input")
    assert "--no-such-option" in error["message"]
    assert f"{command} --help` for the options and arguments." in error["fix"], error


def test_bad_option_value_names_the_option() -> None:
    error = one_error(invoke("solve", DEMO, "--time-limit", "-3", "--json"), 2, "bad_input")
    assert error["place"] == "--time-limit" and "positive number of seconds" in error["message"]
    assert error["where"] == "--time-limit"


def test_without_json_nothing_is_printed_on_stdout(tmp_path: Path) -> None:
    result = invoke("verify", DEMO, str(tmp_path / "missing.json"))
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.startswith("error: ") and "missing.json" in result.stderr


def test_the_console_script_prints_one_document(tmp_path: Path) -> None:
    """The installed command, as CI runs it: its stdout parses as one document for a bad
    file and for a usage error, and stderr keeps the paragraph."""
    for args, words in (([str(tmp_path / "missing.json")], "missing.json"),
                        (["--seed", "-1", str(tmp_path / "p.json")], "--seed")):
        done = subprocess.run([str(FUSEPLAN), "verify", DEMO, *args, "--json"],
                              capture_output=True, text=True, timeout=120,
                              env={"PATH": "/usr/bin:/bin", "COLUMNS": "100"})
        assert done.returncode == 2, done.stderr
        doc = json.loads(done.stdout)
        assert doc["exit"] == 2 and doc["error"]["kind"] == "bad_input"
        assert words in doc["error"]["message"] and words in done.stderr
        assert "Traceback" not in done.stderr


def test_an_unexpected_exception_is_a_planner_bug_without_traceback(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_: Any, **__: Any) -> None:
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr(api, "inspect", broken)
    error = one_error(invoke("inspect", DEMO, "--json"), 1, "no")
    assert error["message"].startswith("internal error (ZeroDivisionError at test_json_errors")
    assert "fuseplan bug" in error["message"]
    plain = invoke("inspect", DEMO)
    assert plain.exit_code == 1 and plain.stdout == ""
    assert plain.stderr.startswith("planner bug: internal error (ZeroDivisionError")


def test_an_error_of_the_machine_is_exit_2_naming_the_file(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def full(*_: Any, **__: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", "/data/out.json")

    monkeypatch.setattr(api, "inspect", full)
    error = one_error(invoke("inspect", DEMO, "--json"), 2, "bad_input")
    assert error["message"].startswith("/data/out.json: No space left on device.")
    assert error["file"] == "/data/out.json"


def test_ctrl_c_in_a_command_is_the_interrupted_document(monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    def stopped(*_: Any, **__: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(api, "inspect", stopped)
    error = one_error(invoke("inspect", DEMO, "--json"), 130, "interrupted")
    assert "no partial file was left" in error["message"]


def test_a_document_already_printed_gets_no_second(tmp_path: Path) -> None:
    """A command that printed its answer and then says "no" (explain with a broken rule)
    leaves that answer alone on stdout."""
    plan = tmp_path / "plan.json"
    assert invoke("solve", DEMO, "--solver", "greedy", "-o", str(plan)).exit_code == 0
    strict = tmp_path / "strict.yaml"
    strict.write_text("rules:\n  min_main_layers: {enabled: true, k: 50}\n")
    result = invoke("explain", DEMO, str(plan), "--rules", str(strict), "--json")
    assert result.exit_code == 1, result.stderr
    doc = json.loads(result.stdout)
    assert "error" not in doc and doc["violations"], doc


def test_error_parts_are_read_from_the_paragraph() -> None:
    doc = error_doc("rules.yaml:3:23: unknown key `fuse`. Fix the spelling or remove the key.",
                    2)
    assert doc["error"] == {"kind": "bad_input", "file": "rules.yaml", "place": "3:23",
                            "where": "rules.yaml:3:23",
                            "message": "rules.yaml:3:23: unknown key `fuse`. Fix the spelling "
                                       "or remove the key.",
                            "fix": "Fix the spelling or remove the key."}
    doc = error_doc("--out /tmp/x: cannot create the folder (Read-only file system).", 2)
    assert (doc["error"]["file"], doc["error"]["place"], doc["error"]["fix"]) == \
        ("/tmp/x", "--out", None)
    assert error_doc("stopped", 143)["error"]["kind"] == "interrupted"


# --------------------------------------------------------------------------- messages


def test_no_plan_names_the_binding_memory() -> None:
    result = invoke("solve", DEMO, "--hw", "cluster4x4", "--set", "nram.bytes=1KiB", "--json")
    error = one_error(result, 1, "no")
    assert "NRAM needs" in error["message"]
    assert re.search(r"--set nram\.bytes=\d+KiB\b", error["message"]), error["message"]
    assert "sram.bytes" not in error["message"]
    assert [binding_memory(v) for v in ("WEIGHTS_FIT_WRAM", "NRAM", "SRAM",
                                        "SUBMAP_FITS_NRAM")] == ["wram", "nram", "sram", "nram"]


def test_a_model_changed_since_the_plan_is_said_so(tmp_path: Path) -> None:
    model = models.save(models.chain_cnn(h=16, w=16), tmp_path, "net")
    other = models.save(models.chain_cnn(seed=1, h=16, w=16), tmp_path, "other")
    plan = tmp_path / "plan.json"
    cwd = os.getcwd()
    os.chdir(tmp_path)  # the plan records the model's path as given: relative
    try:
        assert invoke("solve", "net.onnx", "--solver", "greedy", "-o", str(plan)).exit_code == 0
        for command in ("verify", "explain"):
            error = one_error(invoke(command, "other.onnx", str(plan), "--json"), 2,
                              "bad_input")
            assert "made for a different model" in error["message"], error
        model.write_bytes(other.read_bytes())  # edited in place
        for command in ("verify", "explain"):
            error = one_error(invoke(command, "net.onnx", str(plan), "--json"), 2, "bad_input")
            assert "net.onnx was changed since this plan was made" in error["message"], error
            assert "different model" not in error["message"]
    finally:
        os.chdir(cwd)


@pytest.mark.parametrize("args", [["-o", ""], ["--output="], ["--report", ""]])
def test_an_empty_output_path_is_said_to_be_empty(args: list[str]) -> None:
    error = one_error(invoke("solve", DEMO, *args, "--json"), 2, "bad_input")
    assert "the path given is empty ('')" in error["message"], error
    assert "directory" not in error["message"]


def test_dot_is_still_a_directory() -> None:
    error = one_error(invoke("solve", DEMO, "-o", ".", "--json"), 2, "bad_input")
    assert "(it is a directory)" in error["message"]


def test_an_empty_input_path_is_said_to_be_empty() -> None:
    error = one_error(invoke("verify", DEMO, "", "--json"), 2, "bad_input")
    assert error["message"].startswith("PLAN: the path given is empty")


# --------------------------------------------------------------------------- node names

MARKS = ["\n", "\t", "\u202e", "\x1b[2J"]


@pytest.fixture(scope="module")
def odd_names(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small CNN (valid ONNX) whose node names hold a line break, a tab, a right-to-left
    override and an escape sequence."""
    folder = tmp_path_factory.mktemp("names")
    model = models.chain_cnn(h=16, w=16)
    for i, node in enumerate(model.graph.node):
        node.name = f"{node.op_type.lower()}{MARKS[i % len(MARKS)]}{i}"
    onnx.checker.check_model(model)
    return models.save(model, folder, "odd")


def _answers(model: Path, folder: Path) -> dict[str, Any]:
    """What solve, verify, explain, report and export answer for `model` (greedy, on a 2 KiB
    SRAM: several groups), with the plan file's text."""
    plan = folder / "plan.json"
    solved = invoke("solve", str(model), "--solver", "greedy", "--set", "sram.bytes=2KiB",
                    "-o", str(plan))
    assert solved.exit_code == 0, solved.stderr
    names = [n.name for n in onnx.load(str(model)).graph.node]
    verified = invoke("verify", str(model), str(plan), "--json")
    explained = invoke("explain", str(model), str(plan), "--layer", names[2], "--json")
    report = invoke("report", str(model), str(plan), "-o", str(folder / "r.html"), "--json")
    exported = invoke("export", str(model), str(plan), "-o", str(folder / "a.onnx"), "--json")
    for result in (verified, explained, report, exported):
        assert result.exit_code in (0, 1), result.stderr  # an answer, not a refusal
    doc = json.loads(verified.stdout)
    return {"names": names, "plan": plan.read_text(), "table": solved.stdout,
            "verify": (verified.exit_code, doc["outputs_match"],
                       doc["predicted_matches_emulated"], doc["emulated"], doc["cycles"]),
            "explain": (explained.exit_code, json.loads(explained.stdout)),
            "report": (report.exit_code, json.loads(report.stdout)["ok"]),
            "export": (exported.exit_code, json.loads(exported.stdout)["groups"])}


def test_names_with_control_characters_round_trip(odd_names: Path, tmp_path: Path) -> None:
    """The plan of a model whose node names hold control characters is written (JSON
    escapes them), read back by verify, explain, report and export, and answered exactly as
    the plan of the same model with plain names."""
    odd = _answers(odd_names, tmp_path)
    text = odd["plan"]
    layers = [name for g in json.loads(text)["groups"] for name in g["layers"]]
    assert len(json.loads(text)["groups"]) >= 3
    assert set(odd["names"]) <= set(layers)
    assert "conv\\n0" in text and "\\u202e" in text  # JSON's escapes, not the characters
    assert not any(c in text for c in "\t\u202e\x1b")
    # the names shown escaped: nothing in the table moves the cursor or reverses the line
    assert not any(c in odd["table"] for c in "\u202e\x1b\t") and "conv\\" in odd["table"]
    assert odd["explain"][1]["layer"]["name"] == odd["names"][2]
    # and the HTML report shows them escaped too: no character that reverses its line
    page = (tmp_path / "r.html").read_text()
    assert not any(c in page for c in "\u202e\x1b") and "\\u202e" in page

    plain_model = onnx.load(str(odd_names))
    renamed = {}
    for node in plain_model.graph.node:
        renamed[node.name] = node.name = printable(node.name).replace("\\", "_")
    (tmp_path / "plain").mkdir()
    plain = _answers(models.save(plain_model, tmp_path / "plain", "odd"), tmp_path / "plain")
    assert odd["verify"] == plain["verify"]
    assert odd["report"] == plain["report"] and odd["export"] == plain["export"]
    assert odd["explain"][0] == plain["explain"][0]
    odd_groups = [[renamed[n] for n in g["layers"]] for g in json.loads(text)["groups"]]
    assert odd_groups == [g["layers"] for g in json.loads(plain["plan"])["groups"]]


def test_printable_escapes_control_and_format_characters() -> None:
    assert printable("conv\n0\t\u202e\x1b[2J") == "conv\\n0\\t\\u202e\\x1b[2J"
    assert printable("a\nb", keep="\n") == "a\nb"
    assert printable("ok – é 名") == "ok – é 名"


# --------------------------------------------------------------------------- sweeps


def test_a_spec_past_the_point_cap_is_refused_before_expansion(tmp_path: Path) -> None:
    """Four axes of 32 values: 1,048,576 points from a file of a few hundred bytes, refused
    from the list lengths (making them would take seconds and gigabytes)."""
    values = "[" + ", ".join(f"{k}KiB" for k in range(1, 33)) + "]"
    spec = tmp_path / "huge.yaml"
    spec.write_text(f"models: [zoo:squeezenet]\nchips:\n  - hw: cluster4x4\n    sweep:\n"
                    f"      sram.bytes: &v {values}\n      nram.bytes: *v\n"
                    "      wram.bytes: *v\n      dram.bandwidth_gbps: [" +
                    ", ".join(str(k) for k in range(1, 33)) + "]\n")
    started = time.monotonic()
    with pytest.raises(InputError) as refused:
        load_spec(spec)
    assert time.monotonic() - started < 5
    words = " ".join(str(refused.value).split())
    assert words.startswith(f"{spec}: the spec makes 1,048,576 points"), words
    assert f"more than the {MAX_POINTS:,}" in words and "32 x 32 x 32 x 32" in words
    error = one_error(invoke("sweep", str(spec), "--out", str(tmp_path / "out"), "--json"), 2,
                      "bad_input")
    assert error["file"] == str(spec) and "1,048,576 points" in error["message"]
    assert not (tmp_path / "out").exists()


def test_cpus_beyond_the_machine_are_refused(tmp_path: Path) -> None:
    spec = tmp_path / "s.yaml"
    spec.write_text("models: [zoo:squeezenet]\n")
    many = (os.cpu_count() or 1) + 1
    error = one_error(invoke("sweep", str(spec), "--cpus", str(many), "--out",
                             str(tmp_path / "out"), "--json"), 2, "bad_input")
    assert error["message"].startswith(f"--cpus {many}: this machine has {many - 1} CPUs")
    assert not (tmp_path / "out").exists()


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two 16x16 chain CNNs and a spec of 12 greedy points (about a second each)."""
    folder = tmp_path_factory.mktemp("sweep")
    models.save(models.chain_cnn(h=16, w=16), folder, "chain")
    models.save(models.chain_cnn(seed=1, h=16, w=16), folder, "chain_b")
    (folder / "spec.yaml").write_text(
        "models: [chain.onnx, chain_b.onnx]\nchips:\n  - hw: frustum_npu\n    sweep: "
        "{sram.bytes: [2KiB, 4KiB, 8KiB, 16KiB, 32KiB, 64KiB]}\nsolvers: [greedy]\n")
    return folder


def test_sweep_report_under_proc_is_a_paragraph(sweep_dir: Path, tmp_path: Path) -> None:
    error = one_error(invoke("sweep", str(sweep_dir / "spec.yaml"), "--serial", "--out",
                             str(tmp_path / "out"), "--report", "/proc/self/report.html",
                             "--json"), 2, "bad_input")
    assert "/proc" in error["message"] and not (tmp_path / "out").exists()


def test_sweep_on_a_full_disk_is_a_paragraph(sweep_dir: Path, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    def full(path: Path, *_: Any, **__: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(sweep_store, "write_atomic", full)
    error = one_error(invoke("sweep", str(sweep_dir / "spec.yaml"), "--serial", "--out",
                             str(tmp_path / "out"), "--json"), 2, "bad_input")
    assert "No space left on device" in error["message"]
    assert error["file"] is not None and error["file"].startswith(str(tmp_path / "out"))


def _ray_left(temp: Path) -> dict[int, str]:
    """The processes still running from a Ray session under `temp`: pid -> command line."""
    found = {}
    for entry in Path("/proc").iterdir():
        try:
            line = (entry / "cmdline").read_bytes() if entry.name.isdigit() else b""
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if str(temp).encode() in line and state != "Z":
            found[int(entry.name)] = line.replace(b"\0", b" ").decode(errors="replace")[:200]
    return found


def _assert_ray_gone(temp: Path) -> None:
    """Nothing of a Ray session under `temp` runs, and its folder is gone (a `.ses` file
    that some library writes to TMPDIR in every run, finished or not, is not Ray's)."""
    assert not _ray_left(temp), _ray_left(temp)
    assert not list(temp.glob("fuseplan-ray-*")), list(temp.iterdir())


def _leave_no_ray(proc: subprocess.Popen[Any], temp: Path) -> None:
    """Whatever a test asserted: its sweep stopped, no Ray of it left, its TMPDIR gone."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    for pid in _ray_left(temp):
        os.kill(pid, signal.SIGKILL)
    shutil.rmtree(temp, ignore_errors=True)


@pytest.mark.xdist_group("ray")
@pytest.mark.parametrize("to", ["driver", "group"])
def test_sigterm_stops_a_ray_sweep_like_ctrl_c(sweep_dir: Path, tmp_path: Path, to: str
                                               ) -> None:
    """SIGTERM (CI's cancel) to a Ray sweep, to the driver alone or to its whole process
    group, once two rows are written: exit 143, the one JSON document (the kept points,
    `interrupted`), one line on stderr, Ray shut down, nothing of it left running and no
    temporary folder left."""
    temp = Path(tempfile.mkdtemp(prefix="fp-", dir="/tmp"))  # short: Ray's socket paths
    out = tmp_path / "out"
    proc = subprocess.Popen([str(FUSEPLAN), "sweep", str(sweep_dir / "spec.yaml"), "--out",
                             str(out), "--cpus", "1", "--json"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={"PATH": "/usr/bin:/bin", "TMPDIR": str(temp)})
    try:
        deadline = time.monotonic() + 300
        while proc.poll() is None and time.monotonic() < deadline:
            if len(list(out.glob("rows/*.json"))) >= 2:  # two rows written whole
                break
            time.sleep(0.05)
        assert proc.poll() is None, "the sweep ended before it could be stopped"
        if to == "driver":
            proc.send_signal(signal.SIGTERM)
        else:
            os.killpg(proc.pid, signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 143, stderr
        doc = json.loads(stdout)
        assert doc["interrupted"] is True and doc["points"] >= 2, doc
        lines = [s for s in stderr.splitlines() if s.strip() and "WARNING" not in s]
        assert len(lines) == 1 and lines[0].startswith("interrupted:"), stderr
        assert "Traceback" not in stderr
        _assert_ray_gone(temp)
    finally:
        _leave_no_ray(proc, temp)


@pytest.mark.xdist_group("ray")
@pytest.mark.parametrize("to", ["driver", "group"])
def test_a_killed_ray_sweep_leaves_nothing_running(sweep_dir: Path, tmp_path: Path, to: str
                                                   ) -> None:
    """SIGKILL (the OOM killer, `kill -9`) to a Ray sweep's driver alone or to its process
    group, once a row is written: the driver runs no clean-up, so its watchdog (a process
    of its own session) kills what is left of Ray's session and removes its folder."""
    temp = Path(tempfile.mkdtemp(prefix="fp-", dir="/tmp"))  # short: Ray's socket paths
    out = tmp_path / "out"
    proc = subprocess.Popen([str(FUSEPLAN), "sweep", str(sweep_dir / "spec.yaml"), "--out",
                             str(out), "--cpus", "1", "--json"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True,
                            env={"PATH": "/usr/bin:/bin", "TMPDIR": str(temp)})
    try:
        deadline = time.monotonic() + 300
        while proc.poll() is None and time.monotonic() < deadline:
            if list(out.glob("rows/*.json")):  # Ray runs and a task has finished
                break
            time.sleep(0.05)
        assert proc.poll() is None, "the sweep ended before it could be killed"
        assert _ray_left(temp), "no Ray session to leave behind"
        if to == "driver":
            proc.kill()
        else:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        deadline = time.monotonic() + 60
        while (_ray_left(temp) or list(temp.glob("fuseplan-ray-*"))) \
                and time.monotonic() < deadline:
            time.sleep(0.1)
        _assert_ray_gone(temp)
    finally:
        _leave_no_ray(proc, temp)


def test_sigterm_while_workers_search_stops_them_all(tmp_path: Path) -> None:
    """SIGTERM to `solve -j 2 --json` once its two workers run (--json shows no progress
    to wait for): exit 143, one line, the interrupted document, no worker left and no plan
    file."""
    stop = interrupt_when_workers(FUSEPLAN, ["solve", "zoo:resnet50", "-j", "2",
                                             "--objective", "latency", "-o", "plan.json",
                                             "--json"], tmp_path, signum=signal.SIGTERM)
    assert stop.code == 143, stop.raw
    assert stop.stop_s < 10
    assert not stop.left, "a worker outlived the command"
    assert stop.lines and stop.lines[0].startswith("interrupted:"), stop.raw
    assert "Traceback" not in stop.raw, stop.raw
    doc = json.loads(stop.stdout)
    assert doc["exit"] == 143 and doc["error"]["kind"] == "interrupted", doc
    assert not (tmp_path / "plan.json").exists()


def test_sigterm_during_the_imports_says_one_line(tmp_path: Path) -> None:
    stop = interrupt_when_loaded(FUSEPLAN, ["inspect", DEMO, "--json"], "onnx_cpp2py_export",
                                 tmp_path, signum=signal.SIGTERM)
    assert stop.code == 143, stop.raw
    assert stop.lines and stop.lines[0].startswith("interrupted:"), stop.raw
    assert "Traceback" not in stop.raw
    doc = json.loads(stop.stdout)
    assert doc["exit"] == 143 and doc["error"]["kind"] == "interrupted", doc


def test_what_ray_prints_while_it_runs_goes_to_stderr() -> None:
    """A dying Ray worker's warning is written to the driver's stdout by Ray's core (C++)
    or its Python threads: while Ray runs, file descriptor 1 is stderr, and the answer
    printed after it is alone on stdout."""
    code = ("import os, sys\n"
            "from fuseplan.planner.ui.cli_sweep import _stdout_to_stderr\n"
            "with _stdout_to_stderr():\n"
            "    os.write(1, b'from the core\\n')\n"
            "    print('from a thread', flush=True)\n"
            "print('{\"answer\": 1}')\n")
    done = subprocess.run([str(FUSEPLAN.parent / "python"), "-c", code], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"answer": 1}
    assert "from the core" in done.stderr and "from a thread" in done.stderr
