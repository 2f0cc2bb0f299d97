"""Weight streaming (planner.cost.weight_stream, emulator.chunks, solver.long_groups): layers
whose weights exceed every on-chip memory run in output-channel chunks, and whole-map
chains of any length stream their weights layer by layer -- predicted == emulated."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from fuseplan.hardware.chip import load_chip
from fuseplan.planner.cost.weight_stream import chunk_counts, staged_steps
from fuseplan.planner.front.graph_build import build_graph
from fuseplan.planner.front.onnx_load import load_model
from fuseplan.planner.geometry.regions import group_io

ROOT = Path(__file__).resolve().parents[1]


def _fuseplan(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(Path(sys.executable).parent / "fuseplan"), *args],
                          capture_output=True, text=True, cwd=ROOT, timeout=900)


def _big_gemm(path: Path, k: int = 4096, n: int = 4096) -> Path:
    """x[1, k] -> Gemm(W[k, n], b[n]) -> Relu: fp16 weights of 32 MiB at 4096 x 4096."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(
        (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32), "W")
    b = numpy_helper.from_array(np.zeros(n, np.float32), "B")
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["x", "W", "B"], ["g"], name="fc"),
         helper.make_node("Relu", ["g"], ["y"], name="relu")], "big_gemm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])], [w, b])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.save(model, path)
    return path


@pytest.mark.slow  # two VGG19 solves and a batch-16 verify: a few minutes
def test_vgg19_at_batch_16_reads_its_weights_about_once(tmp_path: Path) -> None:
    """Issue 15's batch check on the default chip with the default rules, from the command
    line: at batch 16 the plan moves at most 1.5x the floor and reads at most 1.2x the
    weights batch 1 does, and it verifies (outputs, every counter, capacities)."""
    one, many = tmp_path / "b1.json", tmp_path / "b16.json"
    assert _fuseplan("solve", "zoo:vgg19", "-o", str(one)).returncode == 0
    solved = _fuseplan("solve", "zoo:vgg19", "--shape", "data_0=16,3,224,224", "-o",
                       str(many))
    assert solved.returncode == 0, solved.stderr
    b1, b16 = (json.loads(p.read_text())["totals"] for p in (one, many))
    assert b16["dram_bytes"] <= 1.5 * b16["compulsory_dram_bytes"], b16
    assert b16["weight_read_bytes"] <= 1.2 * b1["weight_read_bytes"], (b1, b16)
    checked = _fuseplan("verify", "zoo:vgg19", str(many), "--json")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    report = json.loads(checked.stdout)
    assert report["outputs_match"] and report["predicted_matches_emulated"]


def test_chunks_fit_a_quarter_of_the_weight_memory(tmp_path: Path) -> None:
    """A 32 MiB Gemm on the default chip (4 x 1 MiB WRAM per cluster) is cut into chunks of
    at most 1 MiB; the pair in flight fits WRAM."""
    graph = build_graph(load_model(str(_big_gemm(tmp_path / "gemm.onnx")), {}))
    chip, _ = load_chip("cluster4x4")
    counts = chunk_counts(graph, ("fc",), chip)
    assert counts["fc"] == 33  # (4096 + 1) x 4096 x 2 B over chunks of at most 1 MiB
    held = staged_steps(graph, group_io(graph, ("fc",)), chip)
    assert chip.wram is not None
    assert max(held) <= chip.wram.bytes * chip.cores_per_cluster // 2


@pytest.mark.parametrize("solver", ["cpsat", "shortest-path", "greedy", "layer"])
def test_a_layer_larger_than_every_memory_plans_and_verifies(tmp_path: Path, solver: str
                                                            ) -> None:
    model = _big_gemm(tmp_path / "gemm.onnx")
    plan = tmp_path / "plan.json"
    solved = _fuseplan("solve", str(model), "--solver", solver, "-o", str(plan), "--json")
    assert solved.returncode == 0, solved.stderr
    doc = json.loads(plan.read_text())
    fc = next(g for g in doc["groups"] if "fc" in g["layers"])
    assert fc["weights_resident"] is False and fc["weight_chunks"]["fc"] > 1
    checked = _fuseplan("verify", str(model), str(plan), "--json")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    report = json.loads(checked.stdout)
    assert report["outputs_match"] and report["predicted_matches_emulated"]
    assert report["emulated"]["weight_read_bytes"] == 4096 * 4097 * 2  # each weight once


def test_a_conv_larger_than_every_memory_plans_and_verifies(tmp_path: Path) -> None:
    """A 3x3 conv 512 -> 2048 at 28 x 28: 18 MiB of fp16 weights, chunked over its 2048
    output channels on the default chip; each weight read once."""
    model = _big_conv(tmp_path / "conv.onnx", 1, size=28, out_channels=2048)
    plan = tmp_path / "plan.json"
    solved = _fuseplan("solve", str(model), "-o", str(plan))
    assert solved.returncode == 0, solved.stderr
    conv = next(g for g in json.loads(plan.read_text())["groups"] if "conv" in g["layers"])
    assert conv["weight_chunks"]["conv"] > 1
    checked = _fuseplan("verify", str(model), str(plan), "--json")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    report = json.loads(checked.stdout)
    assert report["outputs_match"] and report["predicted_matches_emulated"]
    assert report["emulated"]["weight_read_bytes"] == (2048 * 512 * 9 + 2048) * 2


def test_edited_chunks_are_caught_by_verify(tmp_path: Path) -> None:
    """The emulator runs the chunks the plan states; a plan whose chunk count was edited
    holds other bytes on chip than the cost model priced, and verify says so."""
    model = _big_gemm(tmp_path / "gemm.onnx")
    plan = tmp_path / "plan.json"
    assert _fuseplan("solve", str(model), "-o", str(plan)).returncode == 0
    doc = json.loads(plan.read_text())
    fc = next(g for g in doc["groups"] if "fc" in g["layers"])
    fc["weight_chunks"]["fc"] = 2  # chunks of 16 MiB: over WRAM
    plan.write_text(json.dumps(doc))
    checked = _fuseplan("verify", str(model), str(plan), "--json")
    assert checked.returncode == 1, checked.stdout + checked.stderr


@pytest.mark.parametrize("sram", ["16KiB", "64KiB", "1MiB"])
def test_stream_rules_fuse_whole_map_chains_and_verify(tmp_path: Path, sram: str) -> None:
    """The default rules on a single-memory chip: groups may run past max_group_layers when
    they hold whole maps, their weights stream layer by layer, and every counter the plan
    predicts is what the emulator counts."""
    plan = tmp_path / "plan.json"
    rules = tmp_path / "rules.yaml"
    text = (ROOT / "rules" / "default.yaml").read_text()
    rules.write_text(text.replace("max_group_layers: 12", "max_group_layers: 3"))
    model = str(ROOT / "examples" / "chain_cnn" / "model.onnx")
    solved = _fuseplan("solve", model, "--hw", "soma_buffer", "--set", f"sram.bytes={sram}",
                       "--rules", str(rules), "-o", str(plan), "--json")
    assert solved.returncode == 0, solved.stderr
    doc = json.loads(plan.read_text())
    checked = _fuseplan("verify", model, str(plan), "--json")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    report = json.loads(checked.stdout)
    assert report["outputs_match"] and report["predicted_matches_emulated"]
    if sram == "1MiB":  # the whole chain's maps fit: one group, past the 3-layer cap
        assert len(doc["groups"]) == 1 and len(doc["groups"][0]["layers"]) > 3
        assert doc["totals"]["dram_bytes"] == doc["totals"]["compulsory_dram_bytes"]


def _five_convs(path: Path, channels: int = 16, size: int = 64) -> Path:
    """Stream's (KU Leuven) example CNN: five Conv3x3 + ReLU, same padding, 64 x 64 input."""
    rng = np.random.default_rng(1)
    nodes, inits, prev, c_in = [], [], "x", 3
    for i in range(5):
        w = (rng.standard_normal((channels, c_in, 3, 3)) / np.sqrt(9 * c_in)).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"w{i}"),
                  numpy_helper.from_array(np.zeros(channels, np.float32), f"b{i}")]
        nodes += [helper.make_node("Conv", [prev, f"w{i}", f"b{i}"], [f"c{i}"], name=f"conv{i}",
                                   kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
                  helper.make_node("Relu", [f"c{i}"], [f"r{i}"], name=f"relu{i}")]
        prev, c_in = f"r{i}", channels
    graph = helper.make_graph(
        nodes, "five_convs", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                            [1, 3, size, size])],
        [helper.make_tensor_value_info(prev, TensorProto.FLOAT, [1, channels, size, size])],
        inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)
    return path


def test_five_conv_cnn_on_a_512_kib_buffer_is_at_the_floor(tmp_path: Path) -> None:
    """Stream moves 1.01x the floor here; rule 19 used to forbid the one group that holds
    the whole network though nothing in it is recomputed (applies_to: recompute)."""
    model = _five_convs(tmp_path / "cnn.onnx")
    plan = tmp_path / "plan.json"
    solved = _fuseplan("solve", str(model), "--hw", "soma_buffer", "--set", "sram.bytes=512KiB",
                       "-o", str(plan))
    assert solved.returncode == 0, solved.stderr
    totals = json.loads(plan.read_text())["totals"]
    assert totals["dram_bytes"] <= 1.01 * totals["compulsory_dram_bytes"], totals
    checked = _fuseplan("verify", str(model), str(plan), "--json")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert json.loads(checked.stdout)["predicted_matches_emulated"]


def _big_conv(path: Path, batch: int, channels: int = 512, size: int = 14,
              out_channels: int = 512) -> Path:
    """A 3x3 convolution (512 -> 512: 4.5 MiB of fp16 weights, more than the default chip's
    WRAM holds) and a Relu, over `batch` images."""
    rng = np.random.default_rng(2)
    w = (rng.standard_normal((out_channels, channels, 3, 3)) / np.sqrt(9 * channels)).astype(
        np.float32)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", kernel_shape=[3, 3],
                          pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["c"], ["y"], name="relu")], "big_conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, channels, size, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                       [batch, out_channels, size, size])],
        [numpy_helper.from_array(w, "w"),
         numpy_helper.from_array(np.zeros(out_channels, np.float32), "b")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)
    return path


@pytest.mark.parametrize("solver", ["cpsat", "shortest-path"])
@pytest.mark.parametrize("batch", [4, 8])
def test_weights_outer_reads_the_weights_once_per_batch(tmp_path: Path, solver: str,
                                                        batch: int) -> None:
    """On a one-cluster chip whose SRAM holds one image's tile at a time, sweeping each
    weight chunk over every tile of every image reads the conv's weights once (tiles outer
    would read them once per tile); the inputs are read once per chunk. Verified to the
    byte."""
    model = _big_conv(tmp_path / "conv.onnx", batch)
    plan = tmp_path / "plan.json"
    chip = ["--set", "sram.bytes=512KiB", "--set", "nram.bytes=128KiB", "--set", "clusters=1"]
    solved = _fuseplan("solve", str(model), "--solver", solver, *chip, "-o", str(plan))
    assert solved.returncode == 0, solved.stderr
    conv = next(g for g in json.loads(plan.read_text())["groups"] if g["layers"] == ["conv"])
    assert conv["loop_order"] == "weights_outer" and conv["weight_chunks"]["conv"] > 1
    assert conv["predicted"]["weight_read_bytes"] == (512 * 512 * 9 + 512) * 2
    checked = _fuseplan("verify", str(model), str(plan), "--json")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    report = json.loads(checked.stdout)
    assert report["outputs_match"] and report["predicted_matches_emulated"]
    assert not report["capacity_violations"]
    # explain rechecks the group as it runs (two weight chunks on chip, not the whole
    # weights): it agrees with verify
    explained = _fuseplan("explain", str(model), str(plan), *chip, "--json")
    assert explained.returncode == 0, explained.stdout + explained.stderr
    assert json.loads(explained.stdout)["violations"] == []


@pytest.mark.parametrize("batch", [4, 8])
def test_cluster_rounds_share_each_streamed_read(tmp_path: Path, batch: int) -> None:
    """On four clusters the same conv runs tiles outer, one image per tile: each round of
    four tiles (one per cluster) reads the streamed weights once and broadcasts them, so
    batch 4 reads them once and batch 8 twice (with search.cluster_split off; on, the conv
    splits over the clusters and reads them once: test_cluster_split). Verified to the byte
    and the cycle count."""
    model = _big_conv(tmp_path / "conv.onnx", batch)
    plan = tmp_path / "plan.json"
    rules = tmp_path / "rules.yaml"
    rules.write_text((ROOT / "rules" / "default.yaml").read_text().replace(
        "cluster_split: true", "cluster_split: false"))
    chip = ["--set", "sram.bytes=512KiB", "--set", "nram.bytes=128KiB", "--rules", str(rules)]
    solved = _fuseplan("solve", str(model), *chip, "-o", str(plan))
    assert solved.returncode == 0, solved.stderr
    conv = next(g for g in json.loads(plan.read_text())["groups"] if g["layers"] == ["conv"])
    assert not conv["weights_resident"] and conv.get("loop_order") != "weights_outer"
    tiles = batch * -(-14 // conv["tile"]["h"]) * -(-14 // conv["tile"]["w"])
    assert tiles >= batch  # every image its own tiles: rounds, not a tile of the batch
    once = (512 * 512 * 9 + 512) * 2
    assert conv["predicted"]["weight_read_bytes"] == once * -(-tiles // 4) == once * batch // 4
    checked = _fuseplan("verify", str(model), str(plan), "--json")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    report = json.loads(checked.stdout)
    assert report["outputs_match"] and report["predicted_matches_emulated"]


def test_a_bad_loop_order_is_refused_with_its_json_path(tmp_path: Path) -> None:
    model = _big_conv(tmp_path / "conv.onnx", 2)
    plan = tmp_path / "plan.json"
    chip = ["--set", "sram.bytes=512KiB", "--set", "nram.bytes=128KiB"]
    assert _fuseplan("solve", str(model), *chip, "-o", str(plan)).returncode == 0
    doc = json.loads(plan.read_text())
    relu = next(g for g in doc["groups"] if g["layers"] == ["relu"])
    relu["loop_order"] = "weights_outer"  # a Relu has no weights to sweep
    plan.write_text(json.dumps(doc))
    checked = _fuseplan("verify", str(model), str(plan))
    assert checked.returncode == 2, checked.stdout + checked.stderr
    assert "loop_order" in checked.stderr and "Traceback" not in checked.stderr
