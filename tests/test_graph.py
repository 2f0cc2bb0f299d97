"""planner.front.graph_build on the nine zoo models: layers, shapes, op classes and blocks."""

from __future__ import annotations

import tempfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest

from fuseplan.planner.front.graph_build import build_graph
from fuseplan.planner.front.onnx_load import (
    ZOO,
    LoadedModel,
    load_model,
    random_inputs,
    run_onnxruntime,
)
from fuseplan.planner.ir.graph import Graph, OpClass

# Layers per op type, from the model files: every node except the constant-producing ones
# that are folded into weights (ConstantOfShape; inception_v2's and densenet121's Unsqueeze of
# BN parameters; inception_v1's Reshape of the classifier weight) and the Dropouts, which
# hand their input on at inference (their readers read it: planner.front.work).
EXPECTED_OPS: dict[str, dict[str, int]] = {
    "resnet50": {"Conv": 53, "BatchNormalization": 53, "Relu": 49, "Sum": 16, "MaxPool": 1,
                 "AveragePool": 1, "Reshape": 1, "Gemm": 1, "Softmax": 1},
    "vgg19": {"Conv": 16, "Relu": 18, "MaxPool": 5, "Reshape": 1, "Gemm": 3, "Softmax": 1},
    "bvlc_alexnet": {"Conv": 5, "Relu": 7, "LRN": 2, "MaxPool": 3, "Reshape": 1, "Gemm": 3,
                     "Softmax": 1},
    "zfnet512": {"Conv": 5, "Relu": 7, "LRN": 2, "MaxPool": 3, "Reshape": 1, "Gemm": 3,
                 "Softmax": 1},
    "squeezenet": {"Conv": 26, "Relu": 26, "MaxPool": 3, "Concat": 8,
                   "GlobalAveragePool": 1, "Softmax": 1},
    "inception_v1": {"Conv": 57, "Relu": 57, "MaxPool": 13, "LRN": 2, "Concat": 9,
                     "AveragePool": 1, "Reshape": 1, "Gemm": 1, "Softmax": 1},
    "inception_v2": {"Conv": 69, "BatchNormalization": 69, "Mul": 69, "Add": 69, "Relu": 69,
                     "MaxPool": 5, "AveragePool": 8, "Concat": 10, "Reshape": 1, "Gemm": 1,
                     "Softmax": 1},
    "densenet121": {"Conv": 121, "BatchNormalization": 121, "Mul": 121, "Add": 121,
                    "Relu": 121, "MaxPool": 1, "Concat": 58, "AveragePool": 3,
                    "GlobalAveragePool": 1},
    "shufflenet": {"Conv": 49, "BatchNormalization": 49, "Relu": 33, "MaxPool": 1,
                   "Reshape": 33, "Transpose": 16, "AveragePool": 4, "Concat": 3, "Sum": 13,
                   "Gemm": 1, "Softmax": 1},
}

# Every op type of the zoo and its class (issue 2, "Op classes as sets").
EXPECTED_CLASS = {
    "Conv": OpClass.MAIN, "MaxPool": OpClass.MAIN, "AveragePool": OpClass.MAIN,
    "Gemm": OpClass.MAIN,
    "Relu": OpClass.VECTOR, "BatchNormalization": OpClass.VECTOR, "LRN": OpClass.VECTOR,
    "Softmax": OpClass.VECTOR,
    "Sum": OpClass.SCALAR, "Add": OpClass.SCALAR, "Mul": OpClass.SCALAR,
    "Concat": OpClass.MOVEMENT, "Reshape": OpClass.MOVEMENT, "Transpose": OpClass.MOVEMENT,
    "Dropout": OpClass.MOVEMENT,
    "GlobalAveragePool": OpClass.REDUCTION,
}


@pytest.fixture(scope="module")
def zoo(zoo_model: Callable[[str], LoadedModel]) -> dict[str, tuple[LoadedModel, Graph]]:
    """All nine zoo models, loaded and built once for this module."""
    out = {}
    for name in ZOO:
        loaded = zoo_model(name)
        out[name] = (loaded, build_graph(loaded))
    return out


def test_zoo_has_nine_models() -> None:
    assert sorted(ZOO) == sorted(EXPECTED_OPS)


@pytest.mark.parametrize("name", sorted(EXPECTED_OPS))
def test_layer_counts_per_op(zoo: dict[str, tuple[LoadedModel, Graph]], name: str) -> None:
    _, graph = zoo[name]
    got = Counter(lay.op for lay in graph.layers)
    assert dict(got) == EXPECTED_OPS[name], f"zoo:{name}: layers per op {dict(got)}"
    assert len(graph.layers) == sum(EXPECTED_OPS[name].values())
    # the topological order is a real one: every fmap input is produced earlier or a model input
    seen = set(graph.inputs)
    for lay in graph.layers:
        missing = [t for t in lay.fmap_inputs if t not in seen]
        assert not missing, f"zoo:{name}: layer {lay.name} reads {missing} before they exist"
        seen.update(lay.outputs)


@pytest.mark.parametrize("name", sorted(EXPECTED_OPS))
def test_op_classes(zoo: dict[str, tuple[LoadedModel, Graph]], name: str) -> None:
    _, graph = zoo[name]
    wrong = [(lay.name, lay.op, lay.op_class.value) for lay in graph.layers
             if lay.op_class is not EXPECTED_CLASS[lay.op]]
    assert not wrong, f"zoo:{name}: wrong op classes {wrong[:5]}"
    assert all(lay.is_main == (lay.op_class is OpClass.MAIN) for lay in graph.layers)


@pytest.mark.parametrize("name", sorted(EXPECTED_OPS))
def test_weights_and_macs(zoo: dict[str, tuple[LoadedModel, Graph]], name: str) -> None:
    """Weights are float constants with their sizes; convs count k*k*C_in/group MACs per output."""
    _, graph = zoo[name]
    for lay in graph.layers:
        assert lay.weight_elems == sum(int(graph.constants[w].size) for w in lay.weights)
        if lay.op == "Conv":
            w = graph.constants[lay.inputs[1]]
            assert lay.weights[0] == lay.inputs[1], f"zoo:{name}: {lay.name} weight not first"
            assert lay.macs == int(np.prod(w.shape[1:])) * int(np.prod(lay.out_shape)), \
                f"zoo:{name}: {lay.name} MACs {lay.macs}"
        if lay.op in ("Relu", "Concat", "Reshape", "Transpose", "Dropout", "MaxPool"):
            assert lay.weight_elems == 0, f"zoo:{name}: {lay.op} {lay.name} has weights"


def _ort_shapes(loaded: LoadedModel, graph: Graph) -> dict[str, tuple[int, ...]]:
    """Actual shape of every layer's first output, running onnxruntime with all of them exposed."""
    probe = onnx.ModelProto()
    probe.CopyFrom(loaded.proto)
    have = {o.name for o in probe.graph.output}
    probe.graph.output.extend(onnx.ValueInfoProto(name=lay.outputs[0]) for lay in graph.layers
                              if lay.outputs[0] not in have)
    results, _ = run_onnxruntime(probe, random_inputs(loaded, 0))
    return {k: tuple(v.shape) for k, v in results.items()}


@pytest.mark.parametrize("name", ["resnet50", "inception_v1", "shufflenet"])
def test_out_shapes_match_onnxruntime(zoo: dict[str, tuple[LoadedModel, Graph]],
                                      name: str) -> None:
    loaded, graph = zoo[name]
    actual = _ort_shapes(loaded, graph)
    wrong = [(lay.name, lay.op, lay.out_shape, actual[lay.outputs[0]]) for lay in graph.layers
             if lay.out_shape != actual[lay.outputs[0]]
             or graph.shapes[lay.outputs[0]] != actual[lay.outputs[0]]]
    assert not wrong, f"zoo:{name}: (layer, op, planner shape, onnxruntime shape) {wrong[:5]}"
    assert len(actual) >= len(graph.layers)


def test_shufflenet_channel_shuffle_is_5d(zoo: dict[str, tuple[LoadedModel, Graph]]) -> None:
    """The shuffle reshapes to (N, g, C/g, H, W), transposes g and C/g, and reshapes back."""
    _, graph = zoo["shufflenet"]
    shuffles = [lay for lay in graph.layers if lay.op == "Transpose"]
    assert len(shuffles) == 16
    for lay in shuffles:
        n, a, b, h, w = lay.out_shape
        src = graph.shapes[lay.fmap_inputs[0]]
        assert src == (n, b, a, h, w), f"{lay.name}: {src} -> {lay.out_shape}"


def test_resnet50_has_sixteen_bottleneck_blocks(zoo: dict[str, tuple[LoadedModel, Graph]]
                                                ) -> None:
    _, graph = zoo["resnet50"]
    blocks = graph.blocks
    assert len(blocks) == 16, f"resnet50: {len(blocks)} blocks, exits " \
                              f"{[graph.layer(b.exit).op for b in blocks]}"
    exits = [graph.layer(b.exit).op for b in blocks]
    assert exits == ["Sum"] * 16, f"resnet50 block exits {exits}"
    convs = [sum(graph.layer(n).op == "Conv" for n in b.layers) for b in blocks]
    # each stage starts with a projection shortcut: stages of 3, 4, 6, 3 bottlenecks
    assert convs == [4, 3, 3, 4, 3, 3, 3, 4, 3, 3, 3, 3, 3, 4, 3, 3], convs
    _check_single_entry_exit(graph)


def test_inception_v1_has_nine_modules(zoo: dict[str, tuple[LoadedModel, Graph]]) -> None:
    _, graph = zoo["inception_v1"]
    blocks = graph.blocks
    assert len(blocks) == 9, f"inception_v1: {len(blocks)} blocks"
    for b in blocks:
        exit_layer = graph.layer(b.exit)
        assert exit_layer.op == "Concat" and len(exit_layer.fmap_inputs) == 4, \
            f"block {b.id} exits at {exit_layer.op} with {len(exit_layer.fmap_inputs)} inputs"
        assert sum(graph.layer(n).op == "Conv" for n in b.layers) == 6
    _check_single_entry_exit(graph)


@pytest.mark.parametrize("name, count, exit_op", [("squeezenet", 8, "Concat"),
                                                  ("inception_v2", 10, "Concat"),
                                                  ("densenet121", 58, "Concat"),
                                                  ("shufflenet", 16, None),
                                                  ("vgg19", 0, None)])
def test_other_blocks(zoo: dict[str, tuple[LoadedModel, Graph]], name: str, count: int,
                      exit_op: str | None) -> None:
    """Fire modules, BN-Inception modules, dense layers, ShuffleNet units; none in a chain."""
    _, graph = zoo[name]
    assert len(graph.blocks) == count, f"{name}: {len(graph.blocks)} blocks"
    if exit_op:
        assert {graph.layer(b.exit).op for b in graph.blocks} == {exit_op}
    _check_single_entry_exit(graph)


def _check_single_entry_exit(graph: Graph) -> None:
    """Every block: only the entry's output comes in from outside, only the exit's goes out."""
    for b in graph.blocks:
        inside = set(b.layers)
        assert b.exit in inside and b.entry not in inside
        for name in b.layers:
            for t in graph.layer(name).fmap_inputs:
                src = graph.producer.get(t, "")
                assert src in inside or src == b.entry, \
                    f"block {b.id}: {name} reads {t} from {src or 'a model input'}, outside"
        for name in b.layers:
            if name == b.exit:
                continue
            for t in graph.layer(name).outputs:
                outside = [c for c in graph.consumers.get(t, ()) if c not in inside]
                assert not outside, f"block {b.id}: {name}'s {t} leaves the block to {outside}"


def test_ceil_mode_pool_out_shape_matches_onnxruntime() -> None:
    """MaxPool k2 s2 pad 1 ceil_mode on 7 rows: the last window would start in the padding.

    onnxruntime (and onnx's reference evaluator) drop that window (4 outputs); the planner's
    shapes must be the ones the model really produces, or verification fails on a plain
    layer-by-layer plan.
    """
    from onnx import TensorProto, helper

    node = helper.make_node("MaxPool", ["x"], ["y"], name="pool", kernel_shape=[2, 2],
                            strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1)
    graph = helper.make_graph([node], "ceil", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [1, 1, 7, 7])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, [1, 1, None, None])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "ceil.onnx"
        onnx.save(model, path)
        loaded = load_model(str(path), {})
    lay = build_graph(loaded).layers[0]
    actual = run_onnxruntime(loaded.proto, random_inputs(loaded, 0))[0]["y"].shape
    assert actual == (1, 1, 4, 4)
    assert lay.out_shape == actual, f"planner says {lay.out_shape}, onnxruntime computes {actual}"
