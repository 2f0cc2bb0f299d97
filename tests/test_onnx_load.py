"""Tests for planner.front.onnx_load: loading, shape binding, constant folding, weights, errors."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from fuseplan.planner.core.errors import InputError
from fuseplan.planner.front import onnx_load
from fuseplan.planner.front.onnx_load import (
    ZOO,
    LoadedModel,
    load_model,
    parse_shape_option,
    random_inputs,
    randomize_weights,
    resolve_model,
    run_onnxruntime,
)
from tests import models

RUNTIME_CHECKED = ("squeezenet", "resnet50", "shufflenet", "inception_v1")


# --------------------------------------------------------------------------- helpers


def static_shapes(proto: onnx.ModelProto) -> dict[str, tuple[int, ...]]:
    """Every tensor with a fully concrete declared shape (inputs, value_info, outputs, weights)."""
    graph = proto.graph
    shapes = {t.name: tuple(t.dims) for t in graph.initializer}
    for vi in list(graph.input) + list(graph.value_info) + list(graph.output):
        tensor_type = vi.type.tensor_type
        dims = tensor_type.shape.dim
        if tensor_type.elem_type and tensor_type.HasField("shape") \
                and all(d.HasField("dim_value") for d in dims):
            shapes[vi.name] = tuple(d.dim_value for d in dims)
    return shapes


def node_tensors(proto: onnx.ModelProto) -> list[str]:
    return [t for n in proto.graph.node for t in list(n.input) + list(n.output) if t]


def runtime_shapes(model: LoadedModel) -> dict[str, tuple[int, ...]]:
    """Shapes of every node output, measured with onnxruntime."""
    probe = onnx.ModelProto()
    probe.CopyFrom(model.proto)
    names = [o for n in probe.graph.node for o in n.output if o]
    declared = {o.name for o in probe.graph.output}
    probe.graph.output.extend(onnx.ValueInfoProto(name=n) for n in names if n not in declared)
    results, _ = run_onnxruntime(probe, random_inputs(model, 0))
    return {name: tuple(arr.shape) for name, arr in results.items()}


def weights(proto: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}


def simple_model(nodes: list[onnx.NodeProto], inputs: dict[str, list[int | str]],
                 output: str, inits: Sequence[onnx.TensorProto] = (), opset: int = 13,
                 ) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info(k, TensorProto.FLOAT, v) for k, v in inputs.items()],
        [helper.make_tensor_value_info(output, TensorProto.FLOAT, ["o0", "o1"])],
        list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


# --------------------------------------------------------------------------- zoo


@pytest.mark.parametrize("name", list(ZOO))
def test_zoo_models_load_clean_and_static(name: str) -> None:
    model = load_model(f"zoo:{name}")
    ops = {n.op_type for n in model.proto.graph.node}
    assert not ops & {"Constant", "ConstantOfShape"}
    assert model.opset == 9
    assert len(model.inputs) == 1
    assert all(len(shape) == 4 for shape in model.inputs.values())
    inits = {t.name for t in model.proto.graph.initializer}
    assert not inits & set(model.inputs)
    names = [n.name for n in model.proto.graph.node]
    assert all(names) and len(set(names)) == len(names)
    shapes = static_shapes(model.proto)
    assert [t for t in node_tensors(model.proto) if t not in shapes] == []
    if name in RUNTIME_CHECKED:
        measured = runtime_shapes(model)
        assert {k: shapes[k] for k in measured} == measured
    if name == "vgg19":  # its fc6 weight was a 25088x4096 ConstantOfShape
        dims = {tuple(t.dims) for t in model.proto.graph.initializer}
        assert (4096, 25088) in dims or (25088, 4096) in dims


def test_cleaned_zoo_model_matches_original() -> None:
    model = load_model("zoo:squeezenet")
    feeds = random_inputs(model, 3)
    cleaned, _ = run_onnxruntime(model.proto, feeds)
    original, _ = run_onnxruntime(onnx.load(str(model.file)), feeds)
    for name, value in original.items():
        np.testing.assert_allclose(cleaned[name], value, rtol=1e-5, atol=1e-6)


def test_zoo_metadata() -> None:
    model = load_model("zoo:squeezenet")
    assert model.path == "zoo:squeezenet"
    assert model.file == resolve_model("zoo:squeezenet")
    assert model.file.name == ZOO["squeezenet"]
    assert len(model.sha256) == 64
    assert model.inputs == {"data_0": (1, 3, 224, 224)}
    assert model.outputs == ("softmaxout_1",)


def test_unused_inputs_are_dropped() -> None:
    model = load_model("zoo:zfnet512")  # declares a blob-queue input nothing reads
    assert list(model.inputs) == ["gpu_0/data_0"]


# --------------------------------------------------------------------------- exported nets


@pytest.mark.parametrize("opset", [9, 11, 13, 17])
def test_exported_net_folds_and_matches_original(tmp_path: Path, opset: int) -> None:
    original = models.exported_net(opset)
    path = models.save(original, tmp_path, f"exported_{opset}")
    model = load_model(str(path), {"images": (2, 3, 48, 64)})
    ops = {n.op_type for n in model.proto.graph.node}
    assert not ops & {"Constant", "Shape", "Gather", "Unsqueeze", "ConstantOfShape"}
    assert {"ConvTranspose", "Clip", "Transpose", "Reshape"} <= ops
    assert ("Upsample" if opset < 10 else "Resize") in ops
    assert model.inputs == {"images": (2, 3, 48, 64)}
    shapes = static_shapes(model.proto)
    assert [t for t in node_tensors(model.proto) if t not in shapes] == []
    assert runtime_shapes(model) == {k: shapes[k] for k in runtime_shapes(model)}
    feeds = random_inputs(model, 1)
    cleaned, _ = run_onnxruntime(model.proto, feeds)
    reference, _ = run_onnxruntime(original, feeds)
    assert cleaned.keys() == reference.keys()
    for name, value in reference.items():
        assert cleaned[name].shape == (2, 10)
        np.testing.assert_allclose(cleaned[name], value, rtol=1e-5, atol=1e-6)


def test_static_exported_net_needs_no_shape(tmp_path: Path) -> None:
    path = models.save(models.exported_net(14, dynamic=False), tmp_path, "static")
    model = load_model(str(path))
    assert model.inputs == {"images": (1, 3, 32, 32)}
    assert "HardSwish" in {n.op_type for n in model.proto.graph.node}


@pytest.mark.parametrize("build", [models.chain_cnn, models.residual_net, models.inception_net])
def test_small_models_round_trip(tmp_path: Path, build) -> None:
    original = build(seed=1, n=2, h=16, w=24)
    model = load_model(str(models.save(original, tmp_path, "m")))
    assert model.inputs == {"input": (2, 3, 16, 24)}
    assert [n.name for n in model.proto.graph.node] == [n.name for n in original.graph.node]
    feeds = random_inputs(model, 0)
    got, _ = run_onnxruntime(model.proto, feeds)
    want, _ = run_onnxruntime(original, feeds)
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-6)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1))
def test_random_cnn_shapes_match_runtime(tmp_path_factory: pytest.TempPathFactory,
                                         seed: int) -> None:
    original = models.random_cnn(np.random.default_rng(seed))
    model = load_model(str(models.save(original, tmp_path_factory.mktemp("rand"), "r")))
    shapes = static_shapes(model.proto)
    measured = runtime_shapes(model)
    assert {k: shapes[k] for k in measured} == measured
    feeds = random_inputs(model, seed)
    got, _ = run_onnxruntime(model.proto, feeds)
    want, _ = run_onnxruntime(original, feeds)
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------- cleaning details


def test_initializers_listed_as_inputs_are_constants(tmp_path: Path) -> None:
    proto = models.chain_cnn()
    proto.graph.input.extend(
        helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
        for t in proto.graph.initializer)
    path = models.save(proto, tmp_path, "old_style")
    assert load_model(str(path)).inputs == {"input": (1, 3, 32, 32)}
    weight = proto.graph.initializer[0].name
    with pytest.raises(InputError, match=rf"'{weight}', which is not a real input.*input\b"):
        load_model(str(path), {weight: (8, 3, 3, 3)})


def test_missing_and_duplicate_node_names_are_made_unique(tmp_path: Path) -> None:
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="dup"),
             helper.make_node("Relu", ["a"], ["b"], name="dup"),
             helper.make_node("Relu", ["b"], ["c"])]
    path = models.save(simple_model(nodes, {"x": [1, 4]}, "c"), tmp_path, "names")
    names = [n.name for n in load_model(str(path)).proto.graph.node]
    assert names == ["dup", "Relu_1", "Relu_2"]


def test_dead_nodes_and_initializers_are_removed(tmp_path: Path) -> None:
    unused = numpy_helper.from_array(np.ones((3, 3), np.float32), "unused_w")
    nodes = [helper.make_node("Relu", ["x"], ["y"], name="live"),
             helper.make_node("MatMul", ["x", "unused_w"], ["dead_out"], name="dead")]
    path = models.save(simple_model(nodes, {"x": [3, 3]}, "y", [unused]), tmp_path, "dead")
    proto = load_model(str(path)).proto
    assert [n.name for n in proto.graph.node] == ["live"]
    assert len(proto.graph.initializer) == 0


def test_nodes_that_hand_their_input_on_are_dropped(tmp_path: Path) -> None:
    """Identity, inference Dropout and a Cast to its input's own type are dropped, their
    readers reading the input itself; a Cast to another type stays, and so does a
    pass-through whose output is a model output. The cleaned model computes what the
    original does."""
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="r0"),
             helper.make_node("Cast", ["a"], ["a32"], name="same_type", to=TensorProto.FLOAT),
             helper.make_node("Identity", ["a32"], ["a_id"], name="ident"),
             helper.make_node("Dropout", ["a_id"], ["a_do"], name="drop"),
             helper.make_node("Cast", ["a_do"], ["a64"], name="widen", to=TensorProto.DOUBLE),
             helper.make_node("Cast", ["a64"], ["back"], name="narrow", to=TensorProto.FLOAT),
             helper.make_node("Add", ["back", "a_do"], ["s"], name="add"),
             helper.make_node("Identity", ["s"], ["y"], name="named")]
    original = simple_model(nodes, {"x": [2, 3]}, "y")
    path = models.save(original, tmp_path, "through")
    model = load_model(str(path))
    kept = {n.name: list(n.input) for n in model.proto.graph.node}
    assert list(kept) == ["r0", "widen", "narrow", "add", "named"]
    assert kept["widen"] == ["a"] and kept["add"] == ["back", "a"]
    feeds = random_inputs(model, 3)
    cleaned, _ = run_onnxruntime(model.proto, feeds)
    reference, _ = run_onnxruntime(original, feeds)
    np.testing.assert_array_equal(cleaned["y"], reference["y"])


def test_runtime_fallback_fills_shapes_inference_cannot_give(tmp_path: Path) -> None:
    nodes = [helper.make_node("NonZero", ["x"], ["nz"], name="nonzero"),
             helper.make_node("Cast", ["nz"], ["y"], name="cast", to=TensorProto.FLOAT)]
    path = models.save(simple_model(nodes, {"x": [2, 3]}, "y"), tmp_path, "nonzero")
    shapes = static_shapes(load_model(str(path)).proto)
    assert shapes["nz"] == (2, 0)  # measured on zero inputs
    assert shapes["y"] == (2, 0)


def test_runtime_fallback_agrees_with_inference(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    path = models.save(models.chain_cnn(), tmp_path, "chain")
    inferred = static_shapes(load_model(str(path)).proto)
    monkeypatch.setattr(onnx_load, "_infer_types", lambda work, model: {})
    measured = static_shapes(load_model(str(path)).proto)
    assert measured == inferred


# --------------------------------------------------------------------------- errors


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"'.*nope\.onnx' does not exist\. Check the path"):
        load_model(str(tmp_path / "nope.onnx"))


@pytest.mark.parametrize("content", [b"", b"\x00\xffgarbage, not a model\n" * 20,
                                     b"ir_version: 7\ngraph {}\n"])
def test_garbage_file(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "garbage.onnx"
    path.write_bytes(content)
    with pytest.raises(InputError, match=r"'.*garbage\.onnx' is not a readable ONNX model"):
        load_model(str(path))


@pytest.mark.parametrize("fraction", [0.05, 0.3, 0.5, 0.8, 0.999])
def test_truncated_model(tmp_path: Path, fraction: float) -> None:
    data = models.chain_cnn().SerializeToString()
    path = tmp_path / "truncated.onnx"
    path.write_bytes(data[:int(len(data) * fraction)])
    with pytest.raises(InputError, match=r"'.*truncated\.onnx' is not a readable ONNX model"):
        load_model(str(path))


def test_truncated_zoo_file(tmp_path: Path) -> None:
    data = resolve_model("zoo:resnet50").read_bytes()
    path = tmp_path / "resnet50.onnx"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError, match=r"not a readable ONNX model.*transfer completed"):
        load_model(str(path))


def test_unknown_zoo_name() -> None:
    with pytest.raises(InputError, match=r"Unknown zoo model 'resnet5'.*Did you mean "
                                         r"'zoo:resnet50'\?.*vgg19.*densenet121.*shufflenet"):
        load_model("zoo:resnet5")


@pytest.mark.parametrize("text", ["data_0:1,3", "x=1,,2", "x=a,b", "=1,2", "x=", "x=1.5"])
def test_bad_shape_syntax(text: str) -> None:
    with pytest.raises(InputError, match=r"Bad --shape value .*expected NAME=D0,D1,\.\.\."):
        parse_shape_option(text)


def test_shape_option_parsing() -> None:
    assert parse_shape_option("data_0=1,3,224,224") == ("data_0", (1, 3, 224, 224))
    assert parse_shape_option(" gpu_0/data_0 = 2, 3,8,8 ") == ("gpu_0/data_0", (2, 3, 8, 8))
    with pytest.raises(InputError, match=r"every dim must be a positive integer"):
        parse_shape_option("x=0,3")


def test_shape_for_unknown_input(tmp_path: Path) -> None:
    path = models.save(models.exported_net(13), tmp_path, "exported")
    with pytest.raises(InputError, match=r"--shape names 'imgs', which is not a real input.*"
                                         r"Did you mean 'images'.*real inputs are: images"):
        load_model(str(path), {"imgs": (1, 3, 32, 32)})


def test_unbound_dynamic_dim(tmp_path: Path) -> None:
    path = models.save(models.exported_net(13), tmp_path, "exported")
    with pytest.raises(InputError, match=r"exported\.onnx': input 'images' has symbolic dim 0 "
                                         r"\('N'\).*--shape images=D0,D1,D2,D3"):
        load_model(str(path))


def test_shape_rank_mismatch(tmp_path: Path) -> None:
    path = models.save(models.exported_net(13), tmp_path, "exported")
    with pytest.raises(InputError, match=r"rank 3 but input 'images' has rank 4"):
        load_model(str(path), {"images": (1, 3, 32)})


def test_shape_with_wrong_channels(tmp_path: Path) -> None:
    path = models.save(models.exported_net(13), tmp_path, "exported")
    with pytest.raises(InputError, match=r"node 'stem\d+' \(Conv\) expects 3 input channels"):
        load_model(str(path), {"images": (1, 4, 32, 32)})


def test_shape_inference_inconsistency_names_node(tmp_path: Path) -> None:
    nodes = [helper.make_node("Add", ["a", "b"], ["c"], name="bad_add")]
    model = simple_model(nodes, {"a": [1, 3, 4, 4], "b": [1, 3, 5, 5]}, "c")
    path = models.save(model, tmp_path, "inconsistent")
    with pytest.raises(InputError, match=r"inconsistency at node 'bad_add'"):
        load_model(str(path))


def test_failing_constant_node_is_named(tmp_path: Path) -> None:
    inits = [numpy_helper.from_array(np.ones((2, 3), np.float32), "w"),
             numpy_helper.from_array(np.array([4, 2], np.int64), "s")]
    nodes = [helper.make_node("Reshape", ["w", "s"], ["r"], name="bad_reshape"),
             helper.make_node("Add", ["x", "r"], ["y"], name="add")]
    path = models.save(simple_model(nodes, {"x": [2, 3]}, "y", inits), tmp_path, "badfold")
    with pytest.raises(InputError, match=r"node 'bad_reshape' \(Reshape\) fails on its constant"):
        load_model(str(path))


# --------------------------------------------------------------------------- weights & inputs


def test_randomize_weights_is_seeded_and_keeps_integers(tmp_path: Path) -> None:
    path = models.save(models.exported_net(11), tmp_path, "exported")
    model = load_model(str(path), {"images": (1, 3, 32, 32)})
    before = weights(model.proto)
    first = randomize_weights(model, 7)
    again = weights(randomize_weights(model, 7).proto)
    other = weights(randomize_weights(model, 8).proto)
    after = weights(first.proto)
    assert first.sha256 == model.sha256 and first.inputs == model.inputs
    assert weights(model.proto).keys() == before.keys()  # original untouched
    changed = [k for k in after if not np.array_equal(after[k], before[k])]
    assert changed
    for name, value in after.items():
        assert value.dtype == before[name].dtype and value.shape == before[name].shape
        np.testing.assert_array_equal(value, again[name])
        if not np.issubdtype(value.dtype, np.floating):
            np.testing.assert_array_equal(value, before[name])
    assert any(not np.array_equal(after[k], other[k]) for k in changed)
    protected = _protected_constants(model.proto)  # Clip bounds, Resize roi/scales
    assert protected
    for name in protected:
        np.testing.assert_array_equal(after[name], before[name])


def _protected_constants(proto: onnx.ModelProto) -> set[str]:
    inits = {t.name for t in proto.graph.initializer}
    return {i for n in proto.graph.node if n.op_type in ("Clip", "Resize")
            for i in n.input[1:] if i in inits}


def test_randomized_activations_stay_moderate() -> None:
    model = randomize_weights(load_model("zoo:resnet50"), 0)
    probe = onnx.ModelProto()
    probe.CopyFrom(model.proto)
    probe.graph.output.extend(onnx.ValueInfoProto(name=n.output[0]) for n in probe.graph.node
                              if n.op_type == "Relu")
    results, seconds = run_onnxruntime(probe, random_inputs(model, 0))
    rms = [float(np.sqrt(np.mean(np.square(v, dtype=np.float64)))) for v in results.values()]
    assert seconds > 0
    assert all(np.isfinite(rms)) and 1e-2 < min(rms) and max(rms) < 100


def test_random_inputs_are_seeded_float32() -> None:
    model = load_model("zoo:squeezenet")
    a, b, c = random_inputs(model, 1), random_inputs(model, 1), random_inputs(model, 2)
    assert a.keys() == {"data_0"}
    assert a["data_0"].dtype == np.float32 and a["data_0"].shape == (1, 3, 224, 224)
    np.testing.assert_array_equal(a["data_0"], b["data_0"])
    assert not np.array_equal(a["data_0"], c["data_0"])
    assert abs(float(a["data_0"].std()) - 1) < 0.05


def test_run_onnxruntime_rejects_bad_feeds() -> None:
    model = load_model("zoo:squeezenet")
    with pytest.raises(InputError, match=r"onnxruntime cannot run model"):
        run_onnxruntime(model.proto, {"data_0": np.zeros((1, 3, 10, 10), np.float64)})
