"""A batch folded into the heads or the tokens (nn.MultiheadAttention at a batch above one)
is restated as an axis of its own (planner.front.batch_unmerge): the same elements in the
same order, so plans tile it by images, outputs match onnxruntime and every counter the
prediction; where a reader cannot follow, nothing is restated."""

from __future__ import annotations

from math import prod
from pathlib import Path

import numpy as np
from hand import assert_verifies
from hypothesis import given, settings
from hypothesis import strategies as st

from fuseplan.planner.app import api
from fuseplan.planner.front.batch_unmerge import axis_groups, finer_shape
from fuseplan.planner.ir.layout import LayoutKind
from tests.test_rules import with_rules

import models

ROOT = Path(__file__).resolve().parent.parent


@settings(max_examples=60, deadline=None)
@given(factors=st.lists(st.integers(2, 5), min_size=2, max_size=6), data=st.data())
def test_finer_shape_keeps_the_kept_axes_whole_and_the_element_order(
        factors: list[int], data: st.DataObject) -> None:
    """Two shapes over the same factors (each a grouping of them in order): the finer shape
    holds every kept input axis whole, and its axes group into the output's and the
    input's axes in row-major order."""
    def grouping() -> tuple[int, ...]:
        cuts = sorted(data.draw(st.sets(st.integers(1, len(factors) - 1))))
        bounds = [0, *cuts, len(factors)]
        return tuple(prod(factors[a:b]) for a, b in zip(bounds, bounds[1:], strict=False))

    in_shape, out_shape = grouping(), grouping()
    keep = data.draw(st.lists(st.integers(0, len(in_shape) - 1), max_size=2, unique=True))
    fine = finer_shape(in_shape, out_shape, keep)
    inside = {prod(out_shape[:i]) for i in range(1, len(out_shape))}
    cut = any(prod(in_shape[:a]) < c < prod(in_shape[:a + 1]) for a in keep for c in inside)
    if fine is None:  # only where an output axis ends inside a kept one
        assert cut
        return
    assert not cut and prod(fine) == prod(in_shape)
    groups = axis_groups(out_shape, fine)
    assert groups is not None
    assert [prod(fine[a] for a in g) for g in groups] == list(out_shape)
    starts = [prod(fine[:i]) for i in range(len(fine))]
    for axis in keep:  # a kept axis is one axis of the finer shape, where it was
        i = starts.index(prod(in_shape[:axis]))
        assert fine[i] == in_shape[axis]
    x = np.arange(prod(in_shape))
    assert np.array_equal(x.reshape(in_shape).reshape(fine), x.reshape(out_shape).reshape(fine))


def test_finer_shape_refuses_splits_that_do_not_nest() -> None:
    assert finer_shape((6, 4), (4, 6), (0,)) is None  # 6 would need part of the 4
    assert finer_shape((6, 4), (24,), (0,)) == (6, 4)
    assert axis_groups((6, 4), (2, 3, 4)) == [(0, 1), (2,)]
    assert axis_groups((6, 4), (4, 6)) is None


def test_multihead_attention_at_batch_four_plans_by_images_and_verifies(tmp_path: Path
                                                                       ) -> None:
    """Every tensor of the attention keeps its images on an axis of their own ([L, B,
    heads, d], [B, heads, L, d], [L, B, C] for the Gemm), so its layers tile by images;
    CP-SAT's plan matches onnxruntime and every counter, each weight read once."""
    path = models.save(models.batch_first_mha(batch=4), tmp_path, "mha")
    problem = api.prepare(str(path))
    g = problem.graph
    by_prefix = {lay.name.rstrip("0123456789"): lay for lay in g.layers}
    assert g.shapes[by_prefix["q_fold"].outputs[0]] == (16, 4, 4, 8)
    assert by_prefix["q_heads"].attrs["perm"] == (1, 2, 0, 3) \
        or list(by_prefix["q_heads"].attrs["perm"]) == [1, 2, 0, 3]
    assert g.shapes[by_prefix["q_heads"].outputs[0]] == (4, 4, 16, 8)
    assert g.layout(by_prefix["q_heads"].outputs[0]).kind is LayoutKind.HEADS
    fc = by_prefix["fc"] if by_prefix["fc"].op == "Gemm" else next(
        lay for lay in g.layers if lay.op == "Gemm")
    assert g.shapes[fc.fmap_inputs[0]] == (16, 4, 32)  # [L*B, C] read as [L, B, C]
    assert all(lay.batch_preserving for lay in g.layers)
    weights = {w for lay in g.layers for w in lay.weights}
    plan = api.plan_problem(problem)
    assert plan.totals.weight_read_bytes == sum(int(g.constants[w].size) for w in weights) \
        * problem.chip.dtype_bytes
    assert_verifies(problem, plan)
    # on a chip too small for every image at once the attention runs a few images a tile,
    # or every image in chunks of its heads: one group at the floor either way, which the
    # floor shortcut takes (one image a tile, the faster); the full search finds the chunks
    chip = ("sram.bytes=24KiB", "nram.bytes=6KiB")
    prepared = api.prepare(str(path), overrides=chip)
    at_floor = api.plan_problem(prepared)
    assert len(at_floor.groups) == 1
    assert at_floor.totals.dram_bytes == at_floor.compulsory_dram_bytes
    assert_verifies(prepared, at_floor)
    chunked = api.plan_problem(with_rules(prepared, search={"whole_network_first": False}))
    assert len(chunked.groups) == 1 and chunked.groups[0].placement.hidden_chunks > 1
    assert chunked.totals.dram_bytes == chunked.compulsory_dram_bytes
    assert at_floor.totals.cycles <= chunked.totals.cycles
    assert_verifies(prepared, chunked)
    no_chunks = tmp_path / "no_chunks.yaml"
    default = (ROOT / "rules" / "default.yaml").read_text()
    assert "hidden_chunks: true" in default
    no_chunks.write_text(default.replace("hidden_chunks: true", "hidden_chunks: false"))
    small = api.prepare(str(path), rules=no_chunks, overrides=chip)
    tight = api.plan_problem(small)
    assert any(grp.tile.n < 4 and any(g.layer(n).op == "Softmax" for n in grp.layers)
               for grp in tight.groups)
    assert_verifies(small, tight)


def test_a_fold_no_reader_can_follow_is_left_as_the_model_has_it(tmp_path: Path) -> None:
    """The folded tensor is a model output: restated it would no longer match the model, so
    the graph keeps the model's shape (and the batch is lost there, as before)."""
    import onnx
    from onnx import helper

    model = models.batch_first_mha(batch=2)
    fold = next(n for n in model.graph.node if n.name.startswith("q_fold"))
    model.graph.output.append(helper.make_tensor_value_info(
        fold.output[0], onnx.TensorProto.FLOAT, [16, 8, 8]))
    path = tmp_path / "leaky.onnx"
    onnx.save(model, str(path))
    g = api.prepare(str(path)).graph
    assert g.shapes[fold.output[0]] == (16, 8, 8)


def _image_fold(tmp_path: Path, reader: str) -> Path:
    """Conv -> Reshape [2, 8, 16, 16] to [16, 16, 16] -> Relu -> `reader` (a Reshape back, or
    a Flatten then the Reshape back) -> Conv."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w0 = numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3), np.float32), "w0")
    w1 = numpy_helper.from_array(rng.standard_normal((8, 8, 3, 3), np.float32), "w1")
    flat = numpy_helper.from_array(np.array([16, 16, 16], np.int64), "flat")
    back = numpy_helper.from_array(np.array([2, 8, 16, 16], np.int64), "back")
    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["a"], name="conv0", pads=[1, 1, 1, 1]),
        helper.make_node("Reshape", ["a", "flat"], ["folded"], name="fold"),
        helper.make_node("Relu", ["folded"], ["r"], name="relu"),
    ]
    if reader == "flatten":  # its axis counts the axes of what it is given
        nodes.append(helper.make_node("Flatten", ["r"], ["f"], name="flatten", axis=1))
        nodes.append(helper.make_node("Reshape", ["f", "back"], ["b"], name="unfold"))
    else:
        nodes.append(helper.make_node("Reshape", ["r", "back"], ["b"], name="unfold"))
    nodes.append(helper.make_node("Conv", ["b", "w1"], ["y"], name="conv1", pads=[1, 1, 1, 1]))
    graph = helper.make_graph(
        nodes, "image_fold",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8, 16, 16])],
        [w0, w1, flat, back])
    path = tmp_path / f"image_fold_{reader}.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_an_image_batch_folded_into_the_channels_is_followed(tmp_path: Path) -> None:
    """Any layout's batch, not only a sequence's: [N, C, H, W] folded to [N*C, H, W] for a
    per-element op and back is read as [N, C, H, W] all the way, so every layer tiles by
    images; the plan fuses the five layers and verifies."""
    problem = api.prepare(str(_image_fold(tmp_path, "reshape")), overrides=("sram.bytes=12KiB",))
    g = problem.graph
    assert g.shapes["folded"] == g.shapes["r"] == (2, 8, 16, 16)
    assert all(lay.batch_preserving for lay in g.layers)
    assert g.layout("r").batch_axis == 0
    plan = api.plan_problem(problem)
    assert [grp.layers for grp in plan.groups] == [("conv0", "fold", "relu", "unfold", "conv1")]
    assert_verifies(problem, plan)


def test_a_flatten_reader_keeps_the_model_shapes(tmp_path: Path) -> None:
    """A Flatten counts its axis on the shape it is given, so it cannot read a restated
    tensor as it read the model's: the fold stays as the model has it, and the plan
    verifies."""
    problem = api.prepare(str(_image_fold(tmp_path, "flatten")))
    g = problem.graph
    assert g.shapes["folded"] == g.shapes["r"] == (16, 16, 16)
    assert g.shapes["f"] == (16, 256)
    assert_verifies(problem, api.plan_problem(problem))


def test_a_restated_tensor_through_dram_is_compared_in_the_model_shape(tmp_path: Path
                                                                        ) -> None:
    """Groups of at most 3 layers that compute: the restated [L, B, C] and [L, B, heads, d]
    tensors cross DRAM between groups, and verify compares each with onnxruntime's tensor
    in the model's shape (the same elements in the same order)."""
    path = models.save(models.batch_first_mha(batch=2), tmp_path, "mha")
    rules = models.fusing_rules(tmp_path, {"max_group_layers: 12": "max_group_layers: 3"})
    problem = api.prepare(str(path), rules=rules)
    g = problem.graph
    plan = api.plan_problem(problem, "shortest-path")
    written = {t for grp in plan.groups for n in grp.layers for t in g.layer(n).outputs}
    crossing = [t for t in g.model_shapes if t in written and any(
        t in g.layer(n).fmap_inputs for grp in plan.groups for n in grp.layers
        if t not in {o for m in grp.layers for o in g.layer(m).outputs})]
    assert crossing, "no restated tensor crosses DRAM: the test checks nothing"
    assert all(g.shapes[t] != g.model_shapes[t] for t in crossing)
    assert_verifies(problem, plan)
