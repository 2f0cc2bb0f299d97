"""A decoder at its real depth and width (issue 46): Llama-2-7B's width, 32 layers, one
decode step with 1,024-position caches (examples/exports/llm, stacked from a torch export of
one layer by examples/exports/stack_layers.py).

Placeholder weights stay one value and a shape (planner.front.fills): the 32-layer model's
6.7 billion weights would be 27 GB as float32 arrays. Its planning time is a benchmark's
business (the closing notes give it); its memory and its plan are held here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fuseplan.planner.app import api
from fuseplan.planner.front.fills import has_fills, materialized, stored_array
from fuseplan.planner.front.graph_build import build_graph
from fuseplan.planner.front.onnx_load import load_model
from fuseplan.planner.plan.json_io import save_plan

LLM = Path(__file__).resolve().parent.parent / "examples" / "exports" / "llm"
DECODE = LLM.parent / "zoo2026" / "llama_decode.onnx"


def test_placeholder_weights_hold_no_bytes() -> None:
    model = load_model(str(DECODE), {})
    assert has_fills(model.proto)
    graph = build_graph(model)
    weights = {w for lay in graph.layers for w in lay.weights}
    big = [w for w in weights if graph.constants[w].size >= 1 << 16]
    assert big and all(not any(graph.constants[w].strides) for w in big)
    # onnxruntime and exported files get the bytes, equal to the views
    full = {t.name: t for t in materialized(model.proto).graph.initializer}
    assert not has_fills(materialized(model.proto))
    for w in big[:3]:
        assert np.array_equal(stored_array(full[w]), graph.constants[w])
        assert len(full[w].raw_data) == graph.constants[w].size * 4


@pytest.mark.slow
def test_a_32_layer_7b_decoder_plans_in_2_gib(tmp_path: Path) -> None:
    """32 layers at 4096 wide: planned by `fuseplan solve` in a process of its own, whose
    peak memory stays under 2 GiB; every weight and cache read once."""
    out = tmp_path / "plan.json"
    cli = Path(sys.executable).parent / "fuseplan"
    # a fresh process whose only child is the command: its children's peak is the command's
    probe = ("import resource, subprocess, sys; "
             "code = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL).returncode; "
             "print(code, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    run = subprocess.run([sys.executable, "-c", probe, str(cli), "solve",
                          str(LLM / "llama7b_decode_32.onnx"), "-o", str(out)],
                         capture_output=True, text=True, check=False)
    code, peak_kib = (int(x) for x in run.stdout.split())
    assert code == 0, run.stderr
    assert peak_kib < 2 * 1024 * 1024, f"{peak_kib / 1024:.0f} MiB"
    plan = json.loads(out.read_text())
    assert plan["solver"]["status"] == "OPTIMAL"
    totals = plan["totals"]
    assert totals["dram_bytes"] <= 1.02 * totals["compulsory_dram_bytes"]


@pytest.mark.slow
def test_a_2_layer_slice_of_it_verifies(tmp_path: Path) -> None:
    """The same layers, two of them: planned and verified against onnxruntime (seeded
    random weights: 0.8 billion of them, some 10 GB of peak memory and two minutes)."""
    model = str(LLM / "llama7b_decode_2.onnx")
    plan = api.solve(model)
    assert plan.totals.dram_bytes <= 1.02 * plan.compulsory_dram_bytes
    saved = tmp_path / "plan.json"
    save_plan(plan, saved)
    report = api.verify(model, saved)
    assert report.ok, (report.first_output_mismatch, report.first_counter_mismatch)
