"""Transformers (issue 18, first part): token tensors tiled along tokens, Linear layers and
attention's products planned in token tiles, and the plans verified against onnxruntime.

The real exports are examples/exports/deit_tiny.onnx (a ViT as timm writes it, DeiT-tiny's
sizes) and vit_b_16.onnx (torchvision's, nn.MultiheadAttention: sequence-first tensors).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from fuseplan.hardware.chip import load_chip
from fuseplan.planner.app import api
from fuseplan.planner.cost.model import group_tensors, region_sums
from fuseplan.planner.front.graph_build import build_graph
from fuseplan.planner.front.onnx_load import load_model
from fuseplan.planner.geometry.regions import (
    GroupIO,
    Tile,
    box_elems,
    group_chains,
    group_io,
    iter_tiles,
    tile_regions,
    tiled_like_anchor,
)
from fuseplan.planner.ir.graph import Graph, MapKind
from fuseplan.planner.ir.layout import LayoutKind
from fuseplan.planner.plan.json_io import save_plan
from fuseplan.rules.ruleset import load_rules
from fuseplan.solver.tiles import GroupSearch

EXPORTS = Path(__file__).resolve().parent.parent / "examples" / "exports"
DEIT = str(EXPORTS / "deit_tiny.onnx")
IMAGE: dict[str, tuple[int, ...]] = {"input": (1, 3, 224, 224)}


def _verify(tmp_path: Path, model: str, shapes: dict[str, tuple[int, ...]],
            overrides: list[str], solver: str = "cpsat") -> api.Plan:
    plan = api.solve(model, shapes=shapes, solver=solver, overrides=overrides)
    path = tmp_path / "plan.json"
    save_plan(plan, path)
    report = api.verify(model, path, seed=3, overrides=overrides)
    assert report.outputs_match, report.first_output_mismatch
    assert report.predicted_matches_emulated, report.first_counter_mismatch
    assert not report.capacity_violations, [v.describe() for v in report.capacity_violations]
    return plan


def _deit_graph() -> Graph:
    return build_graph(load_model(DEIT, IMAGE))


def test_token_stretch_is_tiled_along_tokens() -> None:
    graph = _deit_graph()
    norms = [lay for lay in graph.layers if lay.op == "LayerNormalization"]
    assert len(norms) == 25
    assert all(graph.layout(lay.outputs[0]).kind is LayoutKind.TOKENS for lay in norms)
    linear = [lay for lay in graph.layers if lay.op == "MatMul" and lay.weights]
    assert len(linear) == 48  # qkv, proj, fc1, fc2 of 12 blocks
    for lay in linear:  # per token: row-local on [B, L, C]
        assert [m.kind for m in lay.row_maps] == [MapKind.IDENTITY], lay.name
    # the patch embedding's [B, C, H*W] is a sequence of the patches (rows: positions,
    # not channels), the flatten of the patch rows and columns (planner.ir.layout.regrouped_layout)
    flat = graph.layer("/Reshape").outputs[0]
    assert (graph.layout(flat).kind, graph.layout(flat).row_axis) == (LayoutKind.SEQUENCE, 2)
    # the position embedding is added per token
    pos = next(lay for lay in graph.layers if lay.op == "Add" and lay.weights
               and graph.shapes[lay.weights[0]] == (1, 197, 192))
    assert graph.layout(pos.outputs[0]).kind is LayoutKind.TOKENS


def test_attention_products_keep_query_rows_and_need_keys_whole() -> None:
    graph = _deit_graph()
    products = [lay for lay in graph.layers if lay.op == "MatMul" and not lay.weights]
    assert len(products) == 24  # q @ k^T and p @ v of 12 blocks
    for lay in products:
        assert [m.kind for m in lay.row_maps] == [MapKind.IDENTITY, MapKind.WHOLE], lay.name
        # a sequence has no columns: the queries' one column is the output's
        assert [m.kind for m in lay.col_maps] == [MapKind.IDENTITY, MapKind.WHOLE], lay.name


def _closed_and_enumerated(graph: Graph, io: GroupIO, tile: Tile
                           ) -> tuple[dict[str, int], dict[str, int]]:
    """Elements of every tensor over all tiles: by the closed forms, and tile by tile."""
    sums = region_sums(graph, io, group_chains(graph, io), tile, group_tensors(graph, io))
    counted: dict[str, int] = {}
    for box in iter_tiles(graph, io, tile):
        for t, b in tile_regions(graph, io, box).items():
            counted[t] = counted.get(t, 0) + box_elems(graph, t, b)
    return dict(sums), counted


def test_every_output_of_a_split_counts_the_joined_range() -> None:
    # q, k and v come out of one Split: q is needed by the query tile, k and v whole, so
    # every tile computes (and counts) all three whole: closed forms == enumeration
    graph = _deit_graph()
    first = graph.layer("/blocks/blocks.0/attn/qkv/Add").name
    last = graph.layer("/blocks/blocks.0/attn/MatMul_1").name
    layers = [lay.name for lay in graph.layers[graph.index(first):graph.index(last) + 1]]
    io = group_io(graph, layers)
    for h in (197, 100, 33):
        sums, counted = _closed_and_enumerated(graph, io, Tile(1, h, 64))
        assert {t: counted[t] for t in sums} == sums, h


def test_a_split_tiles_with_its_parts_and_outputs_leaving_mid_group_cut_alike() -> None:
    graph = _deit_graph()
    chip, rules = load_chip(None)[0], load_rules(None)
    # q, k and v are the Split's own outputs with its batch and tokens: tiles cut them all
    split = GroupSearch.of(graph, ("/blocks/blocks.0/attn/Split",), chip, rules)
    assert split.tiles_split and min(split.heights()) < 197
    # the residual sum leaves the group before the LayerNorm ends it, which reads it token
    # by token: cut like the LayerNorm's output, each tile storing its tokens of both
    summed = GroupSearch.of(graph, ("/blocks/blocks.0/Add", "/blocks/blocks.0/norm2/"
                                    "LayerNormalization"), chip, rules)
    assert summed.tiles_split and min(summed.heights()) < 197
    # v leaves the group that goes on to the scores, which read k (v's Split sibling)
    # whole: the Split makes every token for each tile, but v's Squeeze makes only the
    # tile's tokens of it, so v is still cut like the scores (groups with an output that
    # must be stored whole: tests/test_loop_nests.py)
    attn = [f"/blocks/blocks.0/attn/{n}" for n in ("Split", "Squeeze", "Squeeze_1",
                                                    "Squeeze_2", "Mul", "Transpose_1",
                                                    "MatMul")]
    io = group_io(graph, attn)
    assert io.outputs[0].endswith("Squeeze_2_output_0")
    assert tiled_like_anchor(graph, io, io.outputs[0])
    assert GroupSearch.of(graph, tuple(attn), chip, rules).tiles_split


def test_split_parts_cost_as_the_tiles_enumerate() -> None:
    graph = build_graph(load_model(DEIT, {"input": (2, 3, 224, 224)}))
    io = group_io(graph, ["/blocks/blocks.0/attn/Split"])
    assert len(io.outputs) == 3
    for tile in (Tile(1, 197, 1), Tile(2, 50, 1), Tile(1, 7, 1)):
        sums, counted = _closed_and_enumerated(graph, io, tile)
        assert {t: counted[t] for t in sums} == sums, tile
        assert all(counted[t] == graph.elems(t) for t in io.outputs)  # stored once


def test_heads_carry_the_batch_and_tokens_through_reshape_transpose_and_split() -> None:
    # timm's [B, L, 3C] -> [B, L, 3, H, d] -> [3, B, H, L, d] -> Split -> [B, H, L, d]: the
    # batch and the tokens move whole, so every step is row-local and keeps the batch
    graph = build_graph(load_model(DEIT, {"input": (8, 3, 224, 224)}))
    names = ["attn/qkv/Add", "attn/Reshape", "attn/Transpose", "attn/Split", "attn/Squeeze",
             "attn/Transpose_1", "attn/MatMul", "attn/Softmax", "attn/MatMul_1",
             "attn/Transpose_2", "attn/Reshape_1", "attn/proj/MatMul"]
    for short in names:
        lay = graph.layer(f"/blocks/blocks.0/{short}")
        assert lay.row_maps[0].kind is MapKind.IDENTITY, short
        assert lay.batch_preserving, short
        out = graph.layout(lay.outputs[0])
        assert out.batch_axis is not None and out.row_axis is not None, short
        assert out.token_like and graph.shapes[lay.outputs[0]][out.batch_axis] == 8, short
        assert graph.shapes[lay.outputs[0]][out.row_axis] in (197, 64), short  # k^T: d x L
    split = graph.layer("/blocks/blocks.0/attn/Split")
    assert all(graph.layout(t) == graph.layout(split.outputs[0]) for t in split.outputs)
    assert graph.layout(graph.layer("/blocks/blocks.0/attn/Squeeze").outputs[0]).kind \
        is LayoutKind.HEADS


def test_sequence_first_attention_keeps_its_tokens_on_axis_0() -> None:
    # nn.MultiheadAttention: [B, L, C] -> [L, B, C] -> ... -> [B*H, L, d]; with one image the
    # batch merges away and the tokens stay a tiled axis through every shuffle and back
    graph = build_graph(load_model(str(EXPORTS / "vit_b_16.onnx"), IMAGE))
    prefix = "/encoder/layers/encoder_layer_0/self_attention/"
    seq_first = graph.layout(graph.layer(prefix + "Transpose").outputs[0])
    assert (seq_first.batch_axis, seq_first.row_axis) == (1, 0)  # not a batch of 197
    moving = [lay for lay in graph.layers if lay.name.startswith(prefix)
              and lay.fmap_inputs and graph.layout(lay.fmap_inputs[0]).token_like]
    assert len(moving) >= 30
    for lay in moving:
        assert lay.row_maps[0].kind is MapKind.IDENTITY, lay.name
        assert graph.layout(lay.outputs[0]).token_like, lay.name
    back = graph.layout(graph.layer(prefix + "Transpose_7").outputs[0])
    assert back.row_axis == 1


@pytest.mark.parametrize("sram", ["512KiB", "2MiB"])
def test_deit_plans_in_token_tiles_and_verifies(tmp_path: Path, sram: str) -> None:
    plan = _verify(tmp_path, DEIT, IMAGE, [f"sram.bytes={sram}"])
    graph = _deit_graph()
    assert plan.totals.dram_bytes < plan.layer_by_layer_dram_bytes
    if sram == "2MiB":  # DeiT-tiny's maps fit on chip beside one layer's weights at a time
        assert plan.totals.dram_bytes == plan.compulsory_dram_bytes
        return
    # at 512 KiB attention runs in tiles of query tokens, the keys and values whole
    tiled = [g for g in plan.groups if g.tile.h < 197 and any(
        graph.layer(n).op == "MatMul" and not graph.layer(n).weights for n in g.layers)]
    assert tiled, "no attention group runs in tiles of query tokens"


def test_deit_batch_runs_in_image_tiles_and_verifies(tmp_path: Path) -> None:
    """At batch 2 the patch embedding, its Reshape (whose target names both images), the
    class token's Concat (a constant expanded to both images) and the encoder blocks run in
    groups tiled one image at a time; the emulator restates the Reshape's target and cuts
    the class token per tile, and every weight is read once for the batch. (In the default
    2 MiB both images fit one tile since attention runs in head chunks: 1 MiB here.)"""
    plan = _verify(tmp_path, DEIT, {"input": (2, 3, 224, 224)}, ["sram.bytes=1MiB"])
    graph = _deit_graph()
    first = next(g for g in plan.groups if "/Reshape" in g.layers)
    assert first.tile.n == 1 and "/Concat_2" in first.layers, (first.layers[:6], first.tile)
    weights = {w for lay in graph.layers for w in lay.weights}
    once = sum(graph.constants[w].size for w in weights) * 2  # fp16
    assert plan.totals.weight_read_bytes == once


def _block(nodes: list[onnx.NodeProto], name: str, shape: list[int],
           constants: list[onnx.TensorProto]) -> onnx.ModelProto:
    """An opset-17 model of `nodes` from input x to output y, both of `shape`."""
    graph = helper.make_graph(
        nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)], constants)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _verify_in_1kib(tmp_path: Path, model: onnx.ModelProto) -> api.Plan:
    """Save a hand-built model, plan it (shortest path) in 1 KiB of SRAM and verify it."""
    path = tmp_path / f"{model.graph.name}.onnx"
    onnx.save(model, str(path))
    return _verify(tmp_path, str(path), {}, ["sram.bytes=1KiB"], solver="shortest-path")


def _token_model(tokens: int = 16, width: int = 8, hidden: int = 32) -> onnx.ModelProto:
    """x + pos -> LayerNorm -> Linear -> Relu -> Linear -> + residual, on [1, L, C]."""
    rng = np.random.default_rng(0)

    def const(name: str, *shape: int) -> onnx.TensorProto:
        return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)

    nodes = [
        helper.make_node("Add", ["x", "pos"], ["e"], name="pos_add"),
        helper.make_node("LayerNormalization", ["e", "g", "b"], ["n"], name="norm", axis=-1),
        helper.make_node("MatMul", ["n", "w1"], ["h"], name="fc1"),
        helper.make_node("Relu", ["h"], ["r"], name="act"),
        helper.make_node("MatMul", ["r", "w2"], ["o"], name="fc2"),
        helper.make_node("Add", ["o", "e"], ["y"], name="residual"),
    ]
    return _block(nodes, "tokens", [1, tokens, width],
                  [const("pos", 1, tokens, width), const("g", width), const("b", width),
                   const("w1", width, hidden), const("w2", hidden, width)])


def test_position_embedding_is_cut_to_each_token_tile(tmp_path: Path) -> None:
    # 1 KiB of SRAM: the [1, 16, 32] hidden map alone is 1 KiB, so tiles split the tokens
    plan = _verify_in_1kib(tmp_path, _token_model())
    pos_group = next(g for g in plan.groups if "pos_add" in g.layers)
    assert pos_group.tile.h < 16


def _attention_model(batch: int = 2, tokens: int = 16, width: int = 8, heads: int = 2
                     ) -> onnx.ModelProto:
    """One attention block as timm writes it, on [B, L, C]: LayerNorm, qkv Linear, Reshape
    to [B, L, 3, H, d], Transpose to [3, B, H, L, d], Split, Squeeze, q @ k^T, Softmax,
    @ v, back to [B, L, C], projection, residual."""
    rng = np.random.default_rng(1)
    d = width // heads

    def const(name: str, array: np.ndarray) -> onnx.TensorProto:
        return numpy_helper.from_array(array, name)

    def ints(*values: int) -> np.ndarray:
        return np.array(values, np.int64)

    def floats(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)

    nodes = [
        helper.make_node("LayerNormalization", ["x", "g", "b"], ["n"], name="norm", axis=-1),
        helper.make_node("MatMul", ["n", "wqkv"], ["qkv"], name="qkv"),
        helper.make_node("Reshape", ["qkv", "s5"], ["r5"], name="split_heads"),
        helper.make_node("Transpose", ["r5"], ["t5"], name="heads_first", perm=[2, 0, 3, 1, 4]),
        helper.make_node("Split", ["t5", "ones"], ["q5", "k5", "v5"], name="split", axis=0),
        helper.make_node("Squeeze", ["q5", "zero"], ["q"], name="sq_q"),
        helper.make_node("Squeeze", ["k5", "zero"], ["k"], name="sq_k"),
        helper.make_node("Squeeze", ["v5", "zero"], ["v"], name="sq_v"),
        helper.make_node("Transpose", ["k"], ["kt"], name="k_t", perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q", "kt"], ["s"], name="scores"),
        helper.make_node("Mul", ["s", "scale"], ["ss"], name="scale"),
        helper.make_node("Softmax", ["ss"], ["p"], name="softmax", axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["o"], name="mix"),
        helper.make_node("Transpose", ["o"], ["ot"], name="tokens_first", perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["ot", "s3"], ["m"], name="merge_heads"),
        helper.make_node("MatMul", ["m", "wo"], ["a"], name="proj"),
        helper.make_node("Add", ["a", "x"], ["y"], name="residual"),
    ]
    shape = [batch, tokens, width]
    return _block(nodes, "attention", shape,
                  [const("g", np.ones(width, np.float32)),
                   const("b", np.zeros(width, np.float32)),
                   const("wqkv", floats(width, 3 * width)), const("wo", floats(width, width)),
                   const("s5", ints(batch, tokens, 3, heads, d)), const("ones", ints(1, 1, 1)),
                   const("zero", ints(0)), const("scale", np.array(d ** -0.5, np.float32)),
                   const("s3", ints(*shape))])


def test_attention_at_batch_two_tiles_through_the_head_shuffles(tmp_path: Path) -> None:
    # 1 KiB of SRAM: the stacked [3, 2, 2, 16, 4] q, k, v alone are 1.5 KiB in and out, so
    # the Split and the shuffles around it only fit in tiles of tokens or images
    plan = _verify_in_1kib(tmp_path, _attention_model())
    split = next(g for g in plan.groups if "split" in g.layers)
    assert split.tile.h < 16 or split.tile.n < 2


@pytest.mark.slow
def test_torchvision_vit_b_16_plans_and_verifies_on_the_default_chip(tmp_path: Path) -> None:
    # nn.MultiheadAttention exports sequence-first [L, B, C] tensors: tokens on axis 0 tile
    # as rows through the head shuffles, and the plan verifies
    plan = _verify(tmp_path, str(EXPORTS / "vit_b_16.onnx"), IMAGE, [])
    assert plan.totals.dram_bytes < plan.layer_by_layer_dram_bytes
    # attention a few heads at a time, the MLPs a few hidden channels at a time, every
    # weight streamed once: the maps never leave the chip (issue 18: within 1.1x)
    assert plan.totals.dram_bytes <= 1.01 * plan.compulsory_dram_bytes
    assert any(g.placement.hidden_chunks > 1 and len(g.layers) > 100 for g in plan.groups)


@pytest.mark.slow
def test_vit_b_16_at_batch_8_reads_every_weight_once_on_the_default_chip(
        tmp_path: Path) -> None:
    """Issue 18's batch check: tiles of two images (four tiles, one round of the four
    clusters) share every streamed weight read. The attention half-blocks hold two images
    only with their input loaded again after the head chunks (planner.geometry.reload).
    Since block groups reach 40 layers, the patch embedding joins the first attention half
    in tiles of one image (two rounds: its 6.2 MB of weights read twice), which saves more
    than that elsewhere: 319,751,884 B against 330,460,872 B when every weight was read
    once (a19abc4). Every other group reads its weights once."""
    batch: dict[str, tuple[int, ...]] = {"input": (8, 3, 224, 224)}
    plan = _verify(tmp_path, str(EXPORTS / "vit_b_16.onnx"), batch, [])
    graph = build_graph(load_model(str(EXPORTS / "vit_b_16.onnx"), batch))
    weights = {w for lay in graph.layers for w in lay.weights}
    once = sum(graph.constants[w].size for w in weights) * 2  # fp16
    assert plan.totals.dram_bytes <= 330_460_872
    first = {w for n in plan.groups[0].layers for w in graph.layer(n).weights}
    again = sum(graph.constants[w].size for w in first) * 2
    assert plan.totals.weight_read_bytes <= once + again
    for g in plan.groups[1:]:
        mine = {w for n in g.layers for w in graph.layer(n).weights}
        assert g.predicted.weight_read_bytes == sum(graph.constants[w].size
                                                    for w in mine) * 2, g.id
    assert any(g.placement.inputs_reloaded and g.tile.n == 2 for g in plan.groups)


# CNN + transformer hybrids (any H and W) and Swin-T (224 x 224): real exports of
# examples/exports/export_models.py
HYBRIDS = {"mobilevit_like": (256, 256), "text_recognizer": (32, 320)}


@pytest.mark.parametrize("name, size", [("mobilevit_like", (64, 64)),
                                        ("text_recognizer", (32, 64))])
def test_hybrid_exports_plan_and_verify_at_a_small_size(tmp_path: Path, name: str,
                                                       size: tuple[int, int]) -> None:
    # the transformer's tokens come from a conv backbone: MobileViT unfolds 2 x 2 patches
    # into sequences (Reshape, Transpose) and folds them back, the recognizer pools the
    # rows and reads the columns as tokens
    plan = _verify(tmp_path, str(EXPORTS / f"{name}.onnx"), {"input": (1, 3, *size)},
                   ["sram.bytes=256KiB"], solver="greedy")
    assert plan.totals.dram_bytes < plan.layer_by_layer_dram_bytes


@pytest.mark.slow
@pytest.mark.parametrize("name", ["swin_t", *HYBRIDS])
def test_swin_and_hybrid_exports_plan_and_verify_on_the_default_chip(tmp_path: Path,
                                                                     name: str) -> None:
    shape = (1, 3, *HYBRIDS.get(name, (224, 224)))
    plan = _verify(tmp_path, str(EXPORTS / f"{name}.onnx"), {"input": shape}, [])
    assert plan.totals.dram_bytes < plan.layer_by_layer_dram_bytes
    if name == "text_recognizer":  # maps and tokens fit on chip: every weight once
        assert plan.totals.dram_bytes <= 1.01 * plan.compulsory_dram_bytes
    if name == "swin_t":  # 1.70x before window attention over whole windows (1.17x then)
        assert plan.totals.dram_bytes <= 1.2 * plan.compulsory_dram_bytes
        # stage 1's windows run in tiles of whole window rows: partition, attention and
        # reverse in one group
        assert any(g.tile.h == 7 and any(n.endswith("attn/Reshape_3") for n in g.layers)
                   and any(n.endswith("attn/Reshape_7") for n in g.layers)
                   for g in plan.groups)
