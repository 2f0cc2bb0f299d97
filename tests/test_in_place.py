"""In-place layers (planner.geometry.in_place): an output written over the input it reads
last takes no room of its own at that step, in the cost model and in the emulator alike."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from hand import assert_verifies, hand_plan
from onnx import TensorProto, helper, numpy_helper
from test_hidden import _save, mlp_model

from fuseplan.emulator.errors import EmulationError
from fuseplan.emulator.onchip import in_place_elems
from fuseplan.planner.app import api
from fuseplan.planner.cost.model import live_steps
from fuseplan.planner.geometry.in_place import in_place_hosts
from fuseplan.planner.geometry.regions import Tile, group_io
from fuseplan.planner.ir.ops import op_spec
from fuseplan.planner.plan.placement import Placement

from models import causal_encoder


def _all(problem: api.Problem) -> tuple[str, ...]:
    return tuple(lay.name for lay in problem.graph.layers)


def test_the_op_table_says_which_ops_write_in_place() -> None:
    """Per-element ops, row-wise normalizations and views may; ops whose outputs need
    inputs from other positions (or that move elements) may not."""
    for op in ("Relu", "Add", "Mul", "Erf", "Softmax", "LayerNormalization",
               "BatchNormalization", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity"):
        assert op_spec(op).in_place, op
    for op in ("Conv", "MatMul", "Gemm", "MaxPool", "Transpose", "Concat", "Gather", "Split",
               "GlobalAveragePool", "Resize", "Slice"):
        assert not op_spec(op).in_place, op


def test_hosts_of_an_mlp_are_the_inputs_each_layer_reads_last(tmp_path: Path) -> None:
    """The GELU's h is read twice (Div and Mul): only its last reader takes it over; the
    block input x is loaded (never a host); the residual add writes the stored output over
    the MLP's result."""
    problem = api.prepare(_save(mlp_model(), tmp_path))
    g = problem.graph
    io = group_io(g, _all(problem))
    hosts = {io.layers[i]: t for i, t in in_place_hosts(g, io).items()}
    assert hosts == {"fc1_bias": "h0", "gelu_erf": "d", "gelu_add": "e", "gelu_mul": "h",
                     "gelu_half": "m", "fc2_bias": "o0", "residual": "o"}
    steps = live_steps(g, io)
    for i, name in enumerate(io.layers):
        out = g.layer(name).outputs[0]
        assert (out in steps[i]) == (name not in hosts), name
        if name in hosts:
            assert hosts[name] in steps[i]


def _conv_relu(channels_in: int, channels_out: int, side: int) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(
        rng.normal(0, 0.3, (channels_out, channels_in, 3, 3)).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    graph = helper.make_graph(
        nodes, "conv_relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels_in, side, side])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                       [1, channels_out, side, side])], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def test_a_relu_after_a_conv_adds_nothing_to_the_peak(tmp_path: Path) -> None:
    """Whole maps of a 3 -> 16 channel conv and its ReLU: the peak is the conv's step
    (input and output, 19 planes), not the ReLU's (32 planes if it had a buffer of its
    own); the emulator measures the same and the outputs match onnxruntime."""
    path = tmp_path / "cr.onnx"
    onnx.save(_conv_relu(3, 16, 8), str(path))
    problem = api.prepare(str(path))
    plan = hand_plan(problem, [Placement.of(_all(problem), Tile(1, 8, 8))])
    (group,) = plan.groups
    dt = problem.chip.dtype_bytes
    assert group.predicted.sram_peak_bytes == (3 + 16) * 8 * 8 * dt
    assert_verifies(problem, plan)


@pytest.mark.parametrize(("th", "chunks"), [(24, 1), (8, 1), (24, 3), (5, 4)])
def test_mlp_plans_with_outputs_in_place_verify(tmp_path: Path, th: int, chunks: int) -> None:
    """Whole and in hidden chunks (in place inside the stretch too), several tiles or one:
    every counter, the peak included, as predicted."""
    problem = api.prepare(_save(mlp_model(), tmp_path))
    n, _, _, w = problem.graph.dims(group_io(problem.graph, _all(problem)).anchor)
    plan = hand_plan(problem, [Placement.of(_all(problem), Tile(n, th, w), True,
                                            hidden_chunks=chunks)])
    assert_verifies(problem, plan)


def test_the_emulator_refuses_an_output_larger_than_the_input_it_overwrites(
        tmp_path: Path) -> None:
    """A plan whose in-place step would not fit in its host is a planner bug: exit 1 names
    the group, the tile and the layer."""
    problem = api.prepare(_save(mlp_model(), tmp_path))
    lay = problem.graph.layer("residual")
    small = (((0, 1, 0, 2, 0, 1)), np.zeros((1, 2, 8), np.float32))
    assert in_place_elems(3, 1, lay, "o", {"o": small}, np.zeros((1, 2, 8))) == 16
    with pytest.raises(EmulationError) as err:
        in_place_elems(3, 1, lay, "o", {"o": small}, np.zeros((1, 4, 8)))
    text = str(err.value)
    assert "group 3" in text and "tile 1" in text and "'residual'" in text and "'o'" in text
    assert in_place_elems(3, 1, lay, None, {}, np.zeros(5)) == 0


def test_a_group_with_a_fused_attention_writes_in_place_too(tmp_path: Path) -> None:
    """The attention layer never writes in place (its online softmax keeps its scratch),
    but the layers around it do: the residual Add after the out projection takes the
    projection's buffer, as in any other group (tests/test_heads.py plans and verifies
    the block this lets fit)."""
    path = tmp_path / "block.onnx"
    onnx.save(causal_encoder(tokens=512, width=768, heads=12, blocks=1, mask="none"),
              str(path))
    problem = api.prepare(str(path), hardware="soma_buffer")
    g = problem.graph
    order = _all(problem)
    half = order[:order.index("residual29") + 1]
    io = group_io(g, half)
    hosts = {io.layers[i]: t for i, t in in_place_hosts(g, io).items()}
    fused = [n for n in half if g.layer(n).op == "FlashAttention"]
    assert fused and not set(fused) & set(hosts)
    assert hosts["residual29"] == "proj28_out"
    assert "residual29_out" not in live_steps(g, io)[half.index("residual29")]
