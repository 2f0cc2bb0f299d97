"""Seeded inputs for verification (planner.front.synthetic.random_inputs): an integer input
that indexes a gather gets seeded indices over the whole indexed axis, not zeros, so a plan
or emulator fetching the wrong rows fails verification; other integer inputs stay zeros."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np
import onnx
import pytest
from hand import hand_plan
from onnx import TensorProto, helper, numpy_helper

from fuseplan.emulator import kernels, layer
from fuseplan.planner.app import api
from fuseplan.planner.app.verify import dram_tensors, verify_plan
from fuseplan.planner.app.verify_reference import onnxruntime_reference, other_seed
from fuseplan.planner.front.loaded import LoadedModel
from fuseplan.planner.front.onnx_load import load_model, random_inputs, randomize_weights

ROWS, WIDTH, TOKENS = 1000, 16, 128


def _model(nodes: Sequence[onnx.NodeProto], inputs: Sequence[onnx.ValueInfoProto],
           inits: Sequence[onnx.TensorProto] = ()) -> onnx.ModelProto:
    """A graph of `nodes` whose output is `y` (float, its shape inferred), opset 17."""
    graph = helper.make_graph(list(nodes), "random_inputs", list(inputs),
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    model.graph.output[0].type.CopyFrom(inferred.graph.output[0].type)
    return model


def _table(name: str = "table", rows: int = ROWS, value: float | None = None
           ) -> onnx.TensorProto:
    """A [rows, WIDTH] float table: seeded N(0, 1) rows, or every element `value`."""
    data = np.random.default_rng(5).standard_normal((rows, WIDTH)) if value is None \
        else np.full((rows, WIDTH), value)
    return numpy_helper.from_array(data.astype(np.float32), name)


def _ids(name: str = "ids", elem: int = TensorProto.INT64, shape: Sequence[int] = (1, TOKENS)
         ) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, list(shape))


def embedding(table_value: float | None = None) -> onnx.ModelProto:
    """ids [1, 128] int64 -> Gather(table [1000, 16]) -> MatMul w -> y [1, 128, 16]."""
    w = np.random.default_rng(6).standard_normal((WIDTH, WIDTH)).astype(np.float32) / 4
    return _model([helper.make_node("Gather", ["table", "ids"], ["e"], name="embed", axis=0),
                   helper.make_node("MatMul", ["e", "w"], ["y"], name="proj")],
                  [_ids()], [_table(value=table_value), numpy_helper.from_array(w, "w")])


def _load(tmp_path: Path, model: onnx.ModelProto) -> LoadedModel:
    path = tmp_path / "model.onnx"
    onnx.save(model, str(path))
    return load_model(str(path))


def _prepare(tmp_path: Path, model: onnx.ModelProto) -> api.Problem:
    path = tmp_path / "model.onnx"
    onnx.save(model, str(path))
    return api.prepare(str(path))


def test_token_ids_span_the_table_and_are_seeded(tmp_path: Path) -> None:
    """Indices into a [1000, 16] table: all in [0, 1000), many distinct, the same per seed,
    others for another seed (the second-seed reference among them)."""
    loaded = _load(tmp_path, embedding())
    a, b = random_inputs(loaded, 0)["ids"], random_inputs(loaded, 0)["ids"]
    assert a.dtype == np.int64 and a.shape == (1, TOKENS)
    assert a.min() >= 0 and a.max() < ROWS
    assert len(np.unique(a)) > TOKENS * 3 // 4  # 128 draws of 1000: ~120 distinct
    np.testing.assert_array_equal(a, b)
    for seed in (1, other_seed(0)):
        assert not np.array_equal(a, random_inputs(loaded, seed)["ids"])


def test_float_inputs_draw_as_before_next_to_indices(tmp_path: Path) -> None:
    """A float input beside the ids keeps the values it had when ids were zeros: the float
    draws come first (goldens made from float inputs stay valid)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, TOKENS, WIDTH])
    loaded = _load(tmp_path, _model(
        [helper.make_node("Gather", ["table", "ids"], ["e"], name="embed", axis=0),
         helper.make_node("Add", ["e", "x"], ["y"], name="join")], [_ids(), x], [_table()]))
    feeds = random_inputs(loaded, 4)
    expected = np.random.default_rng(4).standard_normal((1, TOKENS, WIDTH), dtype=np.float32)
    np.testing.assert_array_equal(feeds["x"], expected)
    assert len(np.unique(feeds["ids"])) > 1


def test_indices_are_followed_through_cast_and_unsqueeze(tmp_path: Path) -> None:
    """int32 ids [128] -> Cast(int64) -> Unsqueeze(0) -> Gather: still [0, 1000), as int32."""
    axes = numpy_helper.from_array(np.array([0], np.int64), "axes")
    loaded = _load(tmp_path, _model(
        [helper.make_node("Cast", ["ids"], ["wide"], name="cast", to=TensorProto.INT64),
         helper.make_node("Unsqueeze", ["wide", "axes"], ["batched"], name="unsqueeze"),
         helper.make_node("Gather", ["table", "batched"], ["y"], name="embed", axis=0)],
        [_ids(elem=TensorProto.INT32, shape=(TOKENS,))], [_table(), axes]))
    ids = random_inputs(loaded, 2)["ids"]
    assert ids.dtype == np.int32 and ids.min() >= 0 and ids.max() < ROWS
    assert len(np.unique(ids)) > TOKENS // 2
    np.testing.assert_array_equal(ids, random_inputs(loaded, 2)["ids"])


def test_the_smallest_table_bounds_ids_that_index_two(tmp_path: Path) -> None:
    """The same ids index a 1000-row and (through a Reshape) a 50-row table: [0, 50)."""
    shape = numpy_helper.from_array(np.array([1, TOKENS], np.int64), "shape")
    loaded = _load(tmp_path, _model(
        [helper.make_node("Gather", ["table", "ids"], ["a"], name="big", axis=0),
         helper.make_node("Reshape", ["ids", "shape"], ["same"], name="reshape"),
         helper.make_node("Gather", ["small", "same"], ["b"], name="small_gather", axis=0),
         helper.make_node("Add", ["a", "b"], ["y"], name="join")],
        [_ids()], [_table(), _table("small", 50), shape]))
    ids = random_inputs(loaded, 0)["ids"]
    assert ids.min() >= 0 and ids.max() < 50 and len(np.unique(ids)) > 25


@pytest.mark.parametrize(("op", "shape", "attrs", "high"), [
    ("GatherElements", (300, WIDTH), {"axis": 0}, ROWS),
    ("GatherElements", (ROWS, 4), {"axis": 1}, WIDTH),
    ("GatherND", (1, 64, 1), {}, ROWS),  # index tuples of one: rows
    ("GatherND", (64, 2), {}, WIDTH),  # (row, column) pairs: within both axes
])
def test_gather_elements_and_nd_keep_to_the_axes_they_index(
        tmp_path: Path, op: str, shape: tuple[int, ...], attrs: dict[str, Any],
        high: int) -> None:
    node = helper.make_node(op, ["table", "ids"], ["y"], name="g")
    node.attribute.extend(helper.make_attribute(k, v) for k, v in attrs.items())
    loaded = _load(tmp_path, _model([node], [_ids(shape=shape)], [_table()]))
    ids = random_inputs(loaded, 1)["ids"]
    assert ids.shape == shape and ids.min() >= 0 and ids.max() < high
    assert ids.max() >= high * 3 // 4  # the whole range, not a corner of it


def test_an_integer_input_that_indexes_nothing_stays_zero(tmp_path: Path) -> None:
    """ints -> Add -> Cast(float) -> Add x: a value, not an index (no range to keep to)."""
    one = numpy_helper.from_array(np.array(1, np.int64), "one")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, TOKENS])
    loaded = _load(tmp_path, _model(
        [helper.make_node("Add", ["ids", "one"], ["next"], name="plus"),
         helper.make_node("Cast", ["next"], ["f"], name="cast", to=TensorProto.FLOAT),
         helper.make_node("Add", ["f", "x"], ["y"], name="join")], [_ids(), x], [one]))
    feeds = random_inputs(loaded, 3)
    assert feeds["ids"].dtype == np.int64 and not feeds["ids"].any()
    assert feeds["x"].std() > 0.5


def test_a_placeholder_table_is_randomized(tmp_path: Path) -> None:
    """A table of one repeated value gathers the same row for every id: random weights give
    it N(0, 1) rows, so different ids fetch different rows."""
    loaded = randomize_weights(_load(tmp_path, embedding(table_value=0.01)), 0)
    table = next(numpy_helper.to_array(t) for t in loaded.proto.graph.initializer
                 if t.name == "table")
    assert len(np.unique(table[:, 0])) == ROWS and 0.8 < table.std() < 1.2


def _wrong_rows_box(right: Any) -> Any:
    """layer.gather_box fetching row 0 for every index (a wrong-rows bug)."""
    def wrong(lay: Any, info: Any, args: Sequence[np.ndarray | None], *rest: Any) -> Any:
        return right(lay, info, [args[0], np.zeros_like(np.asarray(args[1]))], *rest)
    return wrong


def _wrong_rows_kernel(right: Any) -> Any:
    """The emulator's Gather kernel taking row 0 for every index (a wrong-rows bug)."""
    def wrong(n: Any) -> Any:
        return right(n._replace(inputs=(n.inputs[0], np.zeros_like(n.inputs[1]),
                                        *n.inputs[2:])))
    return wrong


def _table_input_model() -> onnx.ModelProto:
    """ids -> Gather of a run-time float map [1000, 16] (not a constant table) -> y: the
    emulator's Gather kernel, and the ids' range from the input's shape."""
    table = helper.make_tensor_value_info("table", TensorProto.FLOAT, [ROWS, WIDTH])
    return _model([helper.make_node("Relu", ["table"], ["r"], name="relu"),
                   helper.make_node("Gather", ["r", "ids"], ["y"], name="pick", axis=0)],
                  [table, _ids()])


@pytest.mark.parametrize("case", ["table", "kernel"])
def test_a_gather_of_wrong_rows_fails_verification(tmp_path: Path, case: str,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """An emulator fetching row 0 for every id: verification fails on the seeded ids, and
    would pass on zero ids (blind); the right gather passes."""
    model = embedding() if case == "table" else _table_input_model()
    problem = _prepare(tmp_path, model)
    plan = hand_plan(problem, [])
    loaded = problem.model
    feeds = random_inputs(loaded, 0)
    assert len(np.unique(feeds["ids"])) > 1
    zeros = {**feeds, "ids": np.zeros_like(feeds["ids"])}
    assert api.verify_in_memory(problem, plan, seed=0).outputs_match
    if case == "table":
        monkeypatch.setattr(layer, "gather_box", _wrong_rows_box(layer.gather_box))
    else:
        monkeypatch.setattr(kernels, "_KERNELS", MappingProxyType(
            {**kernels._KERNELS, "Gather": _wrong_rows_kernel(kernels._KERNELS["Gather"])}))
    assert not api.verify_in_memory(problem, plan, seed=0).outputs_match
    reference = onnxruntime_reference(loaded, dram_tensors(problem.graph, plan), zeros)
    blind = verify_plan(loaded, problem.graph, plan, problem.chip, zeros, reference=reference)
    assert blind.outputs_match  # zero ids cannot tell row 0 from the right rows
