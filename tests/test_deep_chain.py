"""A long chain of small layers plans in memory that grows slowly with its length (issue 43:
a 2,000-layer chain needed 6 GiB). Every whole-map start's groups share its run of layers
instead of a copy per end (solver.bounded_path.Edge.span): a 600-layer chain took 486 MiB,
now about 200 MiB; the 2,000-layer one 11.2 GiB, now 1.2 GiB, with the same plans."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tests.peak import peak_run

FUSEPLAN = Path(__file__).resolve().parent.parent / ".venv" / "bin" / "fuseplan"


def _chain(convs: int) -> onnx.ModelProto:
    """x -> (3x3 conv -> ReLU) * convs on an 8 x 32 x 32 map: every prefix fits on chip whole."""
    rng = np.random.default_rng(0)
    nodes, inits, prev = [], [], "x"
    for i in range(convs):
        inits.append(numpy_helper.from_array(
            (rng.standard_normal((8, 8, 3, 3)) * 0.1).astype(np.float32), f"w{i}"))
        nodes.append(helper.make_node("Conv", [prev, f"w{i}"], [f"c{i}"], name=f"conv{i}",
                                      pads=[1] * 4))
        nodes.append(helper.make_node("Relu", [f"c{i}"], [f"r{i}"], name=f"relu{i}"))
        prev = f"r{i}"
    shape = [1, 8, 32, 32]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, shape)], [helper.make_tensor_value_info(
            prev, TensorProto.FLOAT, shape)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def test_a_600_layer_chain_plans_in_little_memory(tmp_path: Path) -> None:
    path = tmp_path / "chain.onnx"
    onnx.save(_chain(300), path)
    run = peak_run([str(FUSEPLAN), "solve", str(path), "--json"], tmp_path, tmp_path, 600)
    assert run.code == 0, run.stderr
    peak = run.peak_mib
    plan = json.loads(run.stdout)
    assert sum(len(g["layers"]) for g in plan["groups"]) == 600
    # the imports alone take ~120 MiB; the cubic copies took 486 MiB in all
    assert peak <= 320, f"planning a 600-layer chain peaked at {peak} MiB"
