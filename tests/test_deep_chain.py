"""A long chain of small layers plans in memory that grows slowly with its length (issue 43:
a 2,000-layer chain needed 6 GiB). Every whole-map start's groups share its run of layers
instead of a copy per end (solver.bounded_path.Edge.span): a 600-layer chain took 486 MiB,
now about 200 MiB; the 2,000-layer one 11.2 GiB, now 1.2 GiB, with the same plans."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from fuseplan.planner.app.api import prepare
from fuseplan.planner.geometry.regions import Tile, group_chains, group_io
from fuseplan.rules.base import GroupFacts
from fuseplan.rules.min_main_layers import MinMainLayers
from tests import models
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


def _relu_chain(n: int) -> onnx.ModelProto:
    """x -> ReLU * n on a 64 x 56 x 56 map: no fused group passes R05 (no main layer)."""
    nodes = [helper.make_node("Relu", [f"t{i}" if i else "x"], [f"t{i + 1}"], name=f"relu{i}")
             for i in range(n)]
    shape = [1, 64, 56, 56]
    graph = helper.make_graph(nodes, "relus", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, shape)], [helper.make_tensor_value_info(
            f"t{n}", TensorProto.FLOAT, shape)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("builder", ["residual_net", "inception_net", "causal_encoder"])
def test_span_counts_agree_with_the_rule(tmp_path: Path, builder: str) -> None:
    """StructuralRule.spans_allowed says what check says, for every run of the layer order
    (R05 with and without its exemptions)."""
    from tests.test_bounds import BUILT

    problem = prepare(str(models.save(BUILT[builder](), tmp_path, builder)))
    g = problem.graph
    order = [lay.name for lay in g.layers]
    for rule in (MinMainLayers(), MinMainLayers(k=1, movement_groups=False),
                 MinMainLayers(k=3, token_groups=False)):
        spans = [(i, list(range(i, len(order)))) for i in range(len(order))]
        found = rule.spans_allowed(g, spans)
        for (i, ends), allowed in zip(spans, found, strict=True):
            for e, ok in zip(ends, allowed, strict=True):
                io = group_io(g, order[i:e + 1])
                facts = GroupFacts(g, io, group_chains(g, io), Tile(1, 1, 1), problem.chip)
                assert ok == (rule.check(facts) is None), (builder, order[i], order[e])


@pytest.mark.slow
def test_a_2000_relu_chain_plans_in_little_memory(tmp_path: Path) -> None:
    path = tmp_path / "relus.onnx"
    onnx.save(_relu_chain(2000), path)
    run = peak_run([str(FUSEPLAN), "solve", str(path), "--json"], tmp_path, tmp_path, 600)
    assert run.code == 0, run.stderr
    plan = json.loads(run.stdout)
    assert sum(len(g["layers"]) for g in plan["groups"]) == 2000
    # the whole-map starts' millions of groups, each breaking R05, are never built
    assert run.peak_mib <= 600, f"planning a 2,000-ReLU chain peaked at {run.peak_mib} MiB"
