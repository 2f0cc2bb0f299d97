"""Hostile input (issue 17), the model, dynamic-plan and YAML families: degenerate and huge
input dims, external data that is missing or points outside the model's folder, control flow
and bfloat16 the emulator cannot run, opsets newer than onnxruntime, malformed dynamic plans,
oversized YAML files and chip values that pass the types and crash later. Each bad input
exits 2 with a message naming the file, the place and the fix; never a traceback.
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from typer.testing import CliRunner

from fuseplan.planner.core.yamlio import MAX_YAML_BYTES
from fuseplan.planner.front.onnx_load import ort_max_opset
from fuseplan.planner.ui.cli import app
from tests import models
from tests.test_hostile import _paths  # every JSON path of a document

Doc = dict[str, Any]


def run(*args: str) -> tuple[int, str]:
    """Exit code and the output (one paragraph) of `fuseplan ARGS`, run in process; an
    exception escaping the CLI (a traceback for the user) fails the test."""
    result = CliRunner().invoke(app, list(args), catch_exceptions=True)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"traceback for {args}: {result.exception!r}") from result.exception
    return result.exit_code, " ".join((result.stdout + result.stderr).split())


def says(text: str, *words: str) -> bool:
    """Whether the message holds every one of `words`, ignoring whitespace (the console
    breaks long paths across lines)."""
    flat = "".join(text.split())
    return all("".join(w.split()) in flat for w in words)


def _save(model: onnx.ModelProto, folder: Path, name: str) -> Path:
    path = folder / f"{name}.onnx"
    onnx.save(model, path)
    return path


def _conv_model(shape: list[int], opset: int = 13, out_type: int = TensorProto.FLOAT,
                extra: tuple[list[onnx.NodeProto], list[onnx.TensorProto]] = ([], []),
                in_type: int = TensorProto.FLOAT, name: str = "hostile") -> onnx.ModelProto:
    """x -> Conv (conv1) -> y, then the `extra` nodes (reading y); the last node's last output
    is the graph output."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], name="conv1", pads=[1] * 4)]
    nodes += extra[0]
    out = nodes[-1].output[-1]
    graph = helper.make_graph(
        nodes, name, [helper.make_tensor_value_info("x", in_type, shape)],
        [helper.make_tensor_value_info(out, out_type, ["a", "b", "c", "d"])], [w, *extra[1]])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


# --------------------------------------------------------------------------- degenerate dims

@pytest.mark.parametrize("dim", [0, -4])
def test_non_positive_input_dim_in_the_model_exits_2(tmp_path: Path, dim: int) -> None:
    path = _save(_conv_model([1, 3, dim, 16]), tmp_path, "degenerate")
    for command in ("solve", "inspect"):
        code, text = run(command, str(path))
        assert code == 2, text
        assert says(text, str(path), "input 'x'", "--shape x="), text


def test_non_positive_declared_dim_can_be_bound_with_shape(tmp_path: Path) -> None:
    path = _save(_conv_model([1, 3, 0, 16]), tmp_path, "zero")
    code, text = run("inspect", str(path), "--shape", "x=1,3,16,16")
    assert code == 0, text


def test_huge_input_is_refused_naming_the_file_and_the_input(tmp_path: Path) -> None:
    path = _save(_conv_model([1, 3, 100000, 100000]), tmp_path, "huge")
    code, text = run("solve", str(path))
    assert code == 2, text
    assert says(text, str(path), "input 'x'", "--shape"), text


def test_huge_shape_option_is_refused_up_front(tmp_path: Path) -> None:
    path = models.save(models.chain_cnn(), tmp_path, "chain")
    code, text = run("solve", str(path), "--shape", "input=1000000,3,32,32")
    assert code == 2 and says(text, "input 'input'", "elements"), text


def test_huge_intermediate_tensor_names_its_node(tmp_path: Path) -> None:
    reps = numpy_helper.from_array(np.array([1, 1, 4000, 4000], np.int64), "reps")
    tile = helper.make_node("Tile", ["y", "reps"], ["big"], name="tile1")
    path = _save(_conv_model([1, 3, 16, 16], extra=([tile], [reps])), tmp_path, "tiled")
    code, text = run("solve", str(path))
    assert code == 2 and says(text, str(path), "tensor 'big'", "node 'tile1'", "elements"), text


def test_huge_constant_is_refused_before_it_is_allocated(tmp_path: Path) -> None:
    shape = numpy_helper.from_array(np.array([1, 4, 100000, 100000], np.int64), "shape")
    nodes = [helper.make_node("ConstantOfShape", ["shape"], ["k"], name="fill1"),
             helper.make_node("Add", ["y", "k"], ["sum"], name="add1")]
    path = _save(_conv_model([1, 3, 16, 16], extra=(nodes, [shape])), tmp_path, "fill")
    code, text = run("solve", str(path))
    assert code == 2 and says(text, str(path), "node 'fill1' (ConstantOfShape)"), text


# --------------------------------------------------------------------------- external data

@pytest.fixture
def external(tmp_path: Path) -> Path:
    """A model whose weight `w` lives in `folder/w.bin`."""
    folder = tmp_path / "folder"
    folder.mkdir()
    onnx.save(_conv_model([1, 3, 16, 16]), folder / "m.onnx", save_as_external_data=True,
              location="w.bin", size_threshold=0)
    return folder / "m.onnx"


def _relocate(path: Path, location: str) -> Path:
    model = onnx.load(path, load_external_data=False)
    for tensor in model.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = location
    out = path.with_name("moved.onnx")
    onnx.save(model, out)
    return out


def test_external_data_next_to_the_model_loads(external: Path) -> None:
    code, text = run("inspect", str(external))
    assert code == 0, text


def test_missing_external_data_file_exits_2(external: Path) -> None:
    moved = _relocate(external, "gone.bin")
    code, text = run("solve", str(moved))
    assert code == 2, text
    assert says(text, str(moved), "'gone.bin'", "'w'", "next to the model"), text


def test_truncated_or_directory_external_data_exits_2(external: Path) -> None:
    (external.parent / "w.bin").write_bytes(b"\0" * 10)
    code, text = run("inspect", str(external))
    assert code == 2 and says(text, str(external), "'w'", "cannot be read"), text
    (external.parent / "sub").mkdir()
    moved = _relocate(external, "sub")
    code, text = run("inspect", str(moved))
    assert code == 2 and says(text, str(moved), "is not a regular file"), text


@pytest.mark.parametrize("location", ["../../../../etc/hostname", "/etc/hostname",
                                      "../outside.bin"])
def test_external_data_outside_the_folder_is_refused_unread(external: Path, location: str,
                                                            monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    (external.parent.parent / "outside.bin").write_bytes(b"\0" * 432)
    moved = _relocate(external, location)
    opened: list[str] = []
    real_open = open

    def spy(file: Any, *args: Any, **kwargs: Any) -> Any:
        opened.append(str(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr("builtins.open", spy)
    code, text = run("solve", str(moved))
    assert code == 2, text
    assert says(text, str(moved), "unsafe", location), text
    assert not [f for f in opened if "hostname" in f or "outside.bin" in f], opened


def test_external_data_through_a_symlink_out_of_the_folder_is_refused(external: Path) -> None:
    secret = external.parent.parent / "secret.bin"
    secret.write_bytes(b"\0" * 432)
    os.symlink(secret, external.parent / "link.bin")
    moved = _relocate(external, "link.bin")
    code, text = run("solve", str(moved))
    assert code == 2 and "unsafe" in text, text


# --------------------------------------------------------------------------- control flow

def _if_model() -> onnx.ModelProto:
    zero = numpy_helper.from_array(np.array(0, np.float32), "zero")
    shape = [1, 4, 16, 16]
    then_g = helper.make_graph([helper.make_node("Relu", ["y"], ["t"], name="then_relu")],
                               "then", [], [helper.make_tensor_value_info("t", 1, shape)])
    else_g = helper.make_graph([helper.make_node("Sigmoid", ["y"], ["e"], name="else_sig")],
                               "else", [], [helper.make_tensor_value_info("e", 1, shape)])
    nodes = [helper.make_node("ReduceSum", ["y"], ["s"], name="sum1", keepdims=0),
             helper.make_node("Greater", ["s", "zero"], ["cond"], name="gt1"),
             helper.make_node("If", ["cond"], ["out"], name="branch1", then_branch=then_g,
                              else_branch=else_g)]
    return _conv_model([1, 3, 16, 16], extra=(nodes, [zero]))


def _loop_model() -> onnx.ModelProto:
    shape = [1, 4, 16, 16]
    trip = numpy_helper.from_array(np.array(2, np.int64), "trip")
    one = numpy_helper.from_array(np.array(1.0, np.float32), "one")
    body = helper.make_graph(
        [helper.make_node("Identity", ["cin"], ["cout"], name="b_id"),
         helper.make_node("Relu", ["v"], ["r"], name="b_relu"),
         helper.make_node("Add", ["r", "one"], ["vout"], name="b_add")],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cin", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("cout", TensorProto.BOOL, []),
         helper.make_tensor_value_info("vout", TensorProto.FLOAT, shape)])
    loop = helper.make_node("Loop", ["trip", "", "y"], ["out"], name="loop1", body=body)
    return _conv_model([1, 3, 16, 16], extra=([loop], [trip, one]))


def _scan_model() -> onnx.ModelProto:
    row = [1, 4, 16]
    body = helper.make_graph(
        [helper.make_node("Add", ["acc", "r"], ["acc2"], name="s_add"),
         helper.make_node("Identity", ["acc2"], ["o"], name="s_id")],
        "sbody",
        [helper.make_tensor_value_info("acc", 1, row), helper.make_tensor_value_info("r", 1, row)],
        [helper.make_tensor_value_info("acc2", 1, row), helper.make_tensor_value_info("o", 1, row)])
    init = numpy_helper.from_array(np.zeros(row, np.float32), "init")
    scan = helper.make_node("Scan", ["init", "y"], ["fin", "out"], name="scan1", body=body,
                            num_scan_inputs=1, scan_input_axes=[2], scan_output_axes=[2])
    return _conv_model([1, 3, 16, 16], extra=([scan], [init]))


def _bf16_inside() -> onnx.ModelProto:
    nodes = [helper.make_node("Cast", ["y"], ["yb"], name="to_bf16", to=TensorProto.BFLOAT16),
             helper.make_node("Relu", ["yb"], ["rb"], name="relu_bf16"),
             helper.make_node("Cast", ["rb"], ["out"], name="to_f32", to=TensorProto.FLOAT)]
    return _conv_model([1, 3, 16, 16], opset=14, extra=(nodes, []))


def _bf16_input() -> onnx.ModelProto:
    model = _conv_model([1, 3, 16, 16], in_type=TensorProto.BFLOAT16)
    cast = helper.make_node("Cast", ["x"], ["xf"], name="cast_in", to=TensorProto.FLOAT)
    model.graph.node[0].input[0] = "xf"
    model.graph.node.insert(0, cast)
    return model


UNRUNNABLE = {
    "if": (_if_model, ["node 'branch1' (If)", "onnx-simplifier"]),
    "loop": (_loop_model, ["node 'loop1' (Loop)", "onnx-simplifier"]),
    "scan": (_scan_model, ["node 'scan1' (Scan)", "onnx-simplifier"]),
    "bfloat16 inside": (_bf16_inside, ["node 'to_bf16' (Cast)", "bfloat16", "float32"]),
    "bfloat16 input": (_bf16_input, ["input 'x'", "bfloat16", "float32"]),
}


@pytest.mark.parametrize("case", sorted(UNRUNNABLE))
def test_models_the_emulator_cannot_run_are_refused_at_solve(tmp_path: Path, case: str) -> None:
    build, words = UNRUNNABLE[case]
    model = build()
    onnx.checker.check_model(model, full_check=True)  # a valid model, just not executable
    path = _save(model, tmp_path, case.replace(" ", "_"))
    code, text = run("solve", str(path), "-o", str(tmp_path / "plan.json"))
    assert code == 2, text
    assert says(text, str(path), *words), text
    assert not (tmp_path / "plan.json").exists()


# --------------------------------------------------------------------------- opsets

def test_opset_newer_than_onnxruntime_is_refused_at_load(tmp_path: Path) -> None:
    newest = ort_max_opset()
    path = _save(_conv_model([1, 3, 16, 16], opset=newest + 1), tmp_path, "future")
    code, text = run("solve", str(path))
    assert code == 2, text
    assert says(text, str(path), f"opset {newest + 1}", f"up to {newest}"), text


def test_newest_supported_opset_loads(tmp_path: Path) -> None:
    path = _save(_conv_model([1, 3, 16, 16], opset=ort_max_opset()), tmp_path, "newest")
    code, text = run("inspect", str(path))
    assert code == 0, text


# --------------------------------------------------------------------------- dynamic plans

@pytest.fixture(scope="module")
def dyn(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Doc]:
    work = tmp_path_factory.mktemp("dyn")
    model = models.save(models.chain_cnn(), work, "chain")
    code, text = run("solve", str(model), "--dynamic", "input:2=16..32", "--solver",
                     "shortest-path", "-o", str(work / "dyn.json"))
    assert code == 0, text
    return model, json.loads((work / "dyn.json").read_text())


def _edit(doc: Doc, keys: tuple[Any, ...], value: Any) -> Doc:
    doc = copy.deepcopy(doc)
    node = doc
    for k in keys[:-1]:
        node = node[k]
    if value is _DROP:
        del node[keys[-1]]
    else:
        node[keys[-1]] = value
    return doc


_DROP = object()
DYNAMIC_CASES: dict[str, tuple[tuple[Any, ...], Any, str]] = {
    "units not a list": (("groups", 0, "units"), 3, "groups[0].units must be a list"),
    "units empty": (("groups", 0, "units"), [], "groups[0].units must hold at least 1"),
    "unit not an object": (("groups", 0, "units", 0), "big", "groups[0].units[0] must be an"),
    "unit h missing": (("groups", 0, "units", 0, "h"), _DROP, "groups[0].units[0].h is missing"),
    "unit h a string": (("groups", 0, "units", 0, "h"), "8",
                        "groups[0].units[0].h must be an integer"),
    "unit w negative": (("groups", 0, "units", 0, "w"), -2,
                        "groups[0].units[0].w must be at least 0"),
    "group no units": (("groups", 0, "units"), _DROP, "groups[0].units is missing"),
    "layers a string": (("groups", 0, "layers"), "conv1", "groups[0].layers must be a list"),
    "dynamic a list": (("dynamic",), [1], "dynamic must be an object"),
    "ranges missing": (("dynamic", "ranges"), _DROP, "dynamic.ranges is missing"),
    "range not a pair": (("dynamic", "ranges", "input", "2"), [16],
                         "dynamic.ranges.input.2 must hold 2 items"),
    "range reversed": (("dynamic", "ranges", "input", "2"), [32, 16],
                       "dynamic.ranges.input.2 must be [LO, HI] with LO <= HI"),
    "range axis not a number": (("dynamic", "ranges", "input"), {"h": [16, 32]},
                                "dynamic.ranges.input has axis \"h\""),
    "tail mode unknown": (("dynamic", "tail_mode"), "chop", "dynamic.tail_mode must be"),
    "tail range a string": (("dynamic", "tail_range"), "2",
                            "dynamic.tail_range must be an integer"),
    "combination unknown": (("dynamic", "combination"), 5, "dynamic.combination must be"),
    "model path missing": (("model", "path"), _DROP, "model.path is missing"),
}


@pytest.mark.parametrize("command", ["table", "verify"])
@pytest.mark.parametrize("case", sorted(DYNAMIC_CASES))
def test_malformed_dynamic_plan_exits_2_with_json_path(tmp_path: Path, dyn: tuple[Path, Doc],
                                                       case: str, command: str) -> None:
    model, doc = dyn
    keys, value, words = DYNAMIC_CASES[case]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(_edit(doc, keys, value)))
    args = {"table": ["table", str(bad), "--shape", "input=1,3,24,32", "--cache",
                      str(tmp_path / "cache")],
            "verify": ["verify", str(model), str(bad), "--shape", "input=1,3,24,32"]}[command]
    code, text = run(*args)
    assert code == 2, text
    assert says(text, str(bad), words), text


@settings(max_examples=30, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_random_dynamic_plan_edits_never_traceback(tmp_path: Path, dyn: tuple[Path, Doc],
                                                   data: st.DataObject) -> None:
    _, doc = dyn
    paths = [p for p in _paths(doc) if p[0] in ("dynamic", "groups", "model")]
    path = data.draw(st.sampled_from(paths))
    value = data.draw(st.sampled_from([_DROP, "x", 1.5, None, [], {}, True, -1, 0, 10**30]))
    bad = tmp_path / "mutated.json"
    bad.write_text(json.dumps(_edit(doc, path, value)))
    model = str(dyn[0])
    args = data.draw(st.sampled_from([
        ["table", str(bad), "--combination", "simple", "--cache", str(tmp_path / "cache")],
        ["verify", model, str(bad)]]))
    code, text = run(*args, "--shape", "input=1,3,24,32")
    assert code in (0, 1, 2), text


def test_well_formed_dynamic_plan_still_tables(tmp_path: Path, dyn: tuple[Path, Doc]) -> None:
    _, doc = dyn
    good = tmp_path / "good.json"
    good.write_text(json.dumps(doc))
    code, text = run("table", str(good), "--shape", "input=1,3,24,32", "--cache",
                     str(tmp_path / "cache"), "--json")
    assert code == 0, text


def test_shape_of_wrong_rank_for_a_dynamic_plan_exits_2(tmp_path: Path,
                                                        dyn: tuple[Path, Doc]) -> None:
    _, doc = dyn
    good = tmp_path / "good.json"
    good.write_text(json.dumps(doc))
    code, text = run("table", str(good), "--shape", "input=1,3", "--cache",
                     str(tmp_path / "cache"))
    assert code == 2 and says(text, "input 'input'"), text


@pytest.mark.parametrize("corrupt", ["{not json", '{"entries": 5}', '{"entries": [7]}', "[]"])
def test_corrupt_table_cache_entry_is_recomputed(tmp_path: Path, dyn: tuple[Path, Doc],
                                                 corrupt: str) -> None:
    _, doc = dyn
    good = tmp_path / "good.json"
    good.write_text(json.dumps(doc))
    cache = tmp_path / "cache"
    for combination in ("simple", "optimized"):
        args = ["table", str(good), "--shape", "input=1,3,24,32", "--cache", str(cache),
                "--combination", combination]
        code, first = run(*args)
        assert code == 0, first
        for entry in cache.iterdir():
            entry.write_text(corrupt)
        code, text = run(*args)
        assert code == 0 and text == first.replace(", cached", ""), text


# --------------------------------------------------------------------------- YAML files

@pytest.mark.parametrize("kind", ["chip", "rules"])
def test_oversized_yaml_is_refused_before_parsing(tmp_path: Path, kind: str) -> None:
    big = tmp_path / "big.yaml"
    with open(big, "w") as f:
        f.write("name: big\nlots:\n")
        line = "  - 1\n"
        f.write(line * (MAX_YAML_BYTES // len(line) + 1))
    model = models.save(models.chain_cnn(), tmp_path, "chain")
    args = ["rules", "check", str(big)] if kind == "rules" else ["solve", str(model), "--hw",
                                                                  str(big)]
    code, text = run(*args)
    assert code == 2, text
    assert says(text, str(big), "too large", f"{MAX_YAML_BYTES:,}"), text


@pytest.mark.parametrize("setting, words", [
    ("sram.bytes=100000000000000000000000", "`bytes` must be between"),
    ("clock_ghz=.inf", "`clock_ghz` must be a finite number"),
    ("clock_ghz=.nan", "`clock_ghz` must be a finite number"),
    ("clock_ghz=1e308", "`clock_ghz` must be between"),
    ("dram.bandwidth_gbps=1e-300", "`bandwidth_gbps` must be at least 0.001"),
    ("clusters=1000000", "`clusters` must be between"),
    ("core.macs_per_cycle=100000000000000000000000", "`macs_per_cycle` must be between"),
    ("dram.pj_per_byte=1e300", "`pj_per_byte` must be between"),
])
def test_chip_values_out_of_range_exit_2_at_load(tmp_path: Path, setting: str,
                                                  words: str) -> None:
    model = models.save(models.chain_cnn(), tmp_path, "chain")
    code, text = run("solve", str(model), "--set", setting)
    assert code == 2, text
    assert says(text, words, "--set"), text


@pytest.mark.parametrize("keys, value, words", [
    (("clock_ghz",), 1e308, "hardware.spec.clock_ghz must be at most 100"),
    (("sram", "bytes"), 10**23, "hardware.spec.sram.bytes must be at most"),
    (("static_power_mw",), 1e12, "hardware.spec.static_power_mw must be at most"),
])
def test_plan_embedded_chip_is_held_to_the_chip_ranges(tmp_path: Path, keys: tuple[str, ...],
                                                       value: float, words: str) -> None:
    model = models.save(models.chain_cnn(), tmp_path, "chain")
    plan = tmp_path / "plan.json"
    assert run("solve", str(model), "--solver", "shortest-path", "-o", str(plan))[0] == 0
    doc = json.loads(plan.read_text())
    node = doc["hardware"]["spec"]
    for k in keys[:-1]:
        node = node[k]
    node[keys[-1]] = value
    plan.write_text(json.dumps(doc))
    code, text = run("verify", str(model), str(plan))
    assert code == 2 and says(text, str(plan), words), text


def test_chip_file_value_out_of_range_names_line_and_column(tmp_path: Path) -> None:
    chip = tmp_path / "chip.yaml"
    text = (Path(__file__).resolve().parents[1] / "hardware" / "cluster4x4.yaml").read_text()
    chip.write_text(text.replace("clock_ghz: 1.0", "clock_ghz: .inf"))
    model = models.save(models.chain_cnn(), tmp_path, "chain")
    code, out = run("solve", str(model), "--hw", str(chip))
    line = 1 + text.splitlines().index(next(s for s in text.splitlines()
                                            if s.startswith("clock_ghz:")))
    assert code == 2 and says(out, f"{chip}:{line}:", "finite"), out


def test_rules_integer_past_64_bits_exits_2(tmp_path: Path) -> None:
    rules = tmp_path / "r.yaml"
    text = (Path(__file__).resolve().parents[1] / "rules" / "default.yaml").read_text()
    rules.write_text(text.replace("  seed: 0 ", "  seed: 100000000000000000000000 "))
    code, out = run("rules", "check", str(rules))
    assert code == 2 and says(out, str(rules), "`seed` must be", "between"), out


def test_rules_float_infinity_exits_2(tmp_path: Path) -> None:
    rules = tmp_path / "r.yaml"
    text = (Path(__file__).resolve().parents[1] / "rules" / "default.yaml").read_text()
    rules.write_text(text.replace("time_limit_s: 60", "time_limit_s: .inf"))
    code, out = run("rules", "check", str(rules))
    assert code == 2 and says(out, str(rules), "time_limit_s", "finite"), out
