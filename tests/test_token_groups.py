"""R05's token_groups: a decoder's RMSNorm and rotary embedding, written out op by op, fuse.

A Llama-style decoder exports RMSNorm as Pow -> ReduceMean(axes=-1) -> Add -> Sqrt -> Div
-> Mul and the rotary embedding as Slice/Neg/Concat/Mul/Add: element-wise layers and
statistics over each token's channels, no main layer among them. Under k = 2 each ran as a
group of its own, writing and reading its whole map (the zoo's llama_block planned in 72
groups, 5.05x its floor); with token_groups they are one group each. A main layer with
its activation still needs k (the rule's anti-pattern), and a channels-first add and relu
are not per-token.
"""

from __future__ import annotations

from math import prod
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from fuseplan.planner.app.api import plan_problem, prepare, verify_in_memory
from fuseplan.planner.geometry.regions import Tile, group_io, whole_outputs
from fuseplan.planner.plan.placement import Placement
from fuseplan.rules.min_main_layers import per_token
from tests.hand import assert_verifies, hand_plan
from tests.test_rules import broken, fused, with_rules

TOKENS, WIDTH, HEADS = 64, 32, 2
NORM = ("sq", "mean", "eps", "root", "inv", "scaled", "gamma")
ROPE = ("split", "heads", "cos", "lo", "hi", "neg", "rot", "sin", "rope", "back", "merge")


def decoder_slice(heads_out: bool = False) -> onnx.ModelProto:
    """x [1, L, C] -> RMSNorm written out -> Linear -> heads -> rotary embedding -> merge
    heads: one main layer between a 7-layer norm and an 11-layer rotary embedding, as torch
    exports a Llama block's input norm and q projection. `heads_out`: the heads before the
    rotary embedding are a model output too (as k before its rotation feeds a KV cache)."""
    rng = np.random.default_rng(0)
    half = WIDTH // HEADS // 2
    d = WIDTH // HEADS
    inits = [numpy_helper.from_array(a.astype(np.float32), n) for n, a in (
        ("two", np.array(2.0)), ("eps_c", np.array(1e-6)), ("one", np.array(1.0)),
        ("g", rng.uniform(0.5, 1.5, WIDTH)), ("w1", rng.normal(0, 0.2, (WIDTH, WIDTH))),
        ("cos_t", np.cos(rng.uniform(0, 3, (1, 1, TOKENS, d)))),
        ("sin_t", np.sin(rng.uniform(0, 3, (1, 1, TOKENS, d)))))]
    inits += [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in (
        ("axes", [-1]), ("split_shape", [1, TOKENS, HEADS, d]), ("merge_shape", [1, TOKENS, WIDTH]),
        ("s0", [0]), ("s1", [half]), ("s2", [d]), ("ax3", [3]))]
    node = helper.make_node
    nodes = [
        node("Pow", ["x", "two"], ["sq_o"], name="sq"),
        node("ReduceMean", ["sq_o", "axes"], ["mean_o"], name="mean", keepdims=1),
        node("Add", ["mean_o", "eps_c"], ["eps_o"], name="eps"),
        node("Sqrt", ["eps_o"], ["root_o"], name="root"),
        node("Div", ["one", "root_o"], ["inv_o"], name="inv"),
        node("Mul", ["x", "inv_o"], ["scaled_o"], name="scaled"),
        node("Mul", ["scaled_o", "g"], ["gamma_o"], name="gamma"),
        node("MatMul", ["gamma_o", "w1"], ["q"], name="q_proj"),
        node("Reshape", ["q", "split_shape"], ["split_o"], name="split"),
        node("Transpose", ["split_o"], ["heads_o"], name="heads", perm=[0, 2, 1, 3]),
        node("Mul", ["heads_o", "cos_t"], ["cos_o"], name="cos"),
        node("Slice", ["heads_o", "s0", "s1", "ax3"], ["lo_o"], name="lo"),
        node("Slice", ["heads_o", "s1", "s2", "ax3"], ["hi_o"], name="hi"),
        node("Neg", ["hi_o"], ["neg_o"], name="neg"),
        node("Concat", ["neg_o", "lo_o"], ["rot_o"], name="rot", axis=-1),
        node("Mul", ["rot_o", "sin_t"], ["sin_o"], name="sin"),
        node("Add", ["cos_o", "sin_o"], ["rope_o"], name="rope"),
        node("Transpose", ["rope_o"], ["back_o"], name="back", perm=[0, 2, 1, 3]),
        node("Reshape", ["back_o", "merge_shape"], ["y"], name="merge"),
    ]
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, TOKENS, WIDTH])]
    if heads_out:
        outs.append(helper.make_tensor_value_info("heads_o", TensorProto.FLOAT,
                                                  [1, HEADS, TOKENS, d]))
    graph = helper.make_graph(
        nodes, "decoder_slice",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, TOKENS, WIDTH])], outs,
        inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)],
                              producer_name="fuseplan-tests")
    onnx.checker.check_model(model)
    return model


def _problem(tmp_path: Path, **min_main: object):  # type: ignore[no-untyped-def]
    path = tmp_path / "decoder_slice.onnx"
    onnx.save(decoder_slice(), str(path))
    # small SRAM so that the slice does not fit whole; the planners group its layers
    problem = prepare(str(path), None, None, None, ["sram.bytes=16KiB"])
    return with_rules(problem, search={"whole_network_first": False,
                                       "exact_path_first": False},
                      min_main_layers=dict(min_main))


def test_the_norm_and_rotary_steps_are_per_token(tmp_path: Path) -> None:
    """Every step of the norm and the rotary embedding keeps each token to itself; the
    projection is per-token too (token_groups still leaves it to k)."""
    graph = _problem(tmp_path).graph
    for name in (*NORM, *ROPE, "q_proj"):
        assert per_token(graph, graph.layer(name)), name


@pytest.mark.slow  # two CP-SAT plans and an emulation: tens of seconds
def test_token_groups_fuse_the_norm_and_the_rotary_embedding(tmp_path: Path) -> None:
    """With token_groups (the default) the planner fuses the norm's and the rotary
    embedding's steps and moves fewer bytes than with it off, where every such group
    breaks k; groups holding a main layer still obey k; the plan verifies."""
    loose = _problem(tmp_path)
    tight = _problem(tmp_path, token_groups=False)
    assert loose.ruleset.get("min_main_layers").token_groups  # type: ignore[attr-defined]
    p_loose, p_tight = plan_problem(loose, "cpsat"), plan_problem(tight, "cpsat")
    assert p_loose.totals.dram_bytes < p_tight.totals.dram_bytes
    assert broken(tight, p_loose, "min_main_layers")
    assert not broken(loose, p_loose, "min_main_layers")
    elementwise = [g for g in fused(p_loose)
                   if not any(loose.graph.layer(n).is_main for n in g.layers)]
    assert any(len(g.layers) >= 3 and set(g.layers) <= set(NORM) for g in elementwise)
    assert any(len(g.layers) >= 3 and set(g.layers) <= set(ROPE) for g in elementwise)
    report = verify_in_memory(loose, p_loose)
    assert report.outputs_match and report.predicted_matches_emulated


@pytest.mark.slow  # a CP-SAT plan
def test_a_main_layer_with_its_activation_still_needs_k(tmp_path: Path) -> None:
    """The anti-pattern R05 names, a main layer fused with its element-wise neighbours, stays
    forbidden: the projection (the one main layer) runs alone."""
    problem = _problem(tmp_path)
    rule = problem.ruleset.get("min_main_layers")
    plan = plan_problem(problem, "cpsat")
    for g in fused(plan):
        mains = sum(problem.graph.layer(n).is_main for n in g.layers)
        assert mains == 0 or mains >= rule.k  # type: ignore[attr-defined]
    assert [g.layers for g in plan.groups if "q_proj" in g.layers] == [("q_proj",)]


def test_a_map_the_rotary_slices_read_leaves_the_group_tile_by_tile(tmp_path: Path) -> None:
    """The rotary embedding's Slices cut the head width, not the batch: a map they read
    that also leaves the group mid-way (the heads before rotation) is stored tile by tile
    like the group's output. Slice and Pad went for batch-cutting ops whatever their
    axes, so every tile stored that map whole: the tiles' bytes counted it once per tile
    (and the planner kept a decoder's rotary embedding apart from its projections)."""
    path = tmp_path / "leaky.onnx"
    onnx.save(decoder_slice(heads_out=True), str(path))
    problem = prepare(str(path), None, None, None, ["sram.bytes=64KiB"])
    graph = problem.graph
    assert all(graph.layer(n).batch_preserving for n in ("lo", "hi"))
    layers = (*NORM, "q_proj", *ROPE)
    io = group_io(graph, layers)
    assert "heads_o" in io.outputs and not whole_outputs(graph, io)
    plan = hand_plan(problem, [Placement.of(layers, Tile(1, TOKENS // 4, 1))])
    (group,) = [g for g in plan.groups if g.layers == tuple(io.layers)]
    size = problem.chip.dtype_bytes
    once = sum(size * prod(graph.shapes[t]) for t in ("x", "y", "heads_o"))
    weights = sum(size * graph.layer(n).weight_elems for n in layers)
    assert group.predicted.dram_bytes == once + weights
    assert_verifies(problem, plan)
