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

from hardware.chip import load_chip
from planner.app import api
from planner.cost.model import group_tensors, region_sums
from planner.front.graph_build import build_graph
from planner.front.onnx_load import load_model
from planner.geometry.regions import (
    Tile,
    box_elems,
    group_chains,
    group_io,
    iter_tiles,
    tile_regions,
)
from planner.ir.graph import Graph, MapKind
from planner.ir.layout import LayoutKind
from planner.plan.json_io import save_plan
from rules.ruleset import load_rules
from solver.tiles import GroupSearch

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
    # the patch embedding's [B, C, H*W] is no token sequence (its rows would be channels)
    flat = graph.layer("/Reshape").outputs[0]
    assert graph.layout(flat).kind is LayoutKind.FLAT
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
        assert [m.kind for m in lay.col_maps] == [MapKind.WHOLE, MapKind.WHOLE], lay.name


def test_every_output_of_a_split_counts_the_joined_range() -> None:
    # q, k and v come out of one Split: q is needed by the query tile, k and v whole, so
    # every tile computes (and counts) all three whole: closed forms == enumeration
    graph = _deit_graph()
    first = graph.layer("/blocks/blocks.0/attn/qkv/Add").name
    last = graph.layer("/blocks/blocks.0/attn/MatMul_1").name
    layers = [lay.name for lay in graph.layers[graph.index(first):graph.index(last) + 1]]
    io = group_io(graph, layers)
    for h in (197, 100, 33):
        tile = Tile(1, h, 64)
        sums = region_sums(graph, io, group_chains(graph, io), tile, group_tensors(graph, io))
        counted: dict[str, int] = {}
        for box in iter_tiles(graph, io, tile):
            for t, b in tile_regions(graph, io, box).items():
                counted[t] = counted.get(t, 0) + box_elems(graph, t, b)
        assert {t: counted[t] for t in sums} == sums, h


def test_a_group_with_a_second_output_runs_as_one_tile() -> None:
    graph = _deit_graph()
    split = "/blocks/blocks.0/attn/Split"
    search = GroupSearch.of(graph, (split,), load_chip(None)[0], load_rules(None))
    assert not search.tiles_split
    assert search.heights() == [197] and search.widths() == [] and search.batch_options() == [1]


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
    graph = helper.make_graph(
        nodes, "tokens",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, tokens, width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, tokens, width])],
        [const("pos", 1, tokens, width), const("g", width), const("b", width),
         const("w1", width, hidden), const("w2", hidden, width)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_position_embedding_is_cut_to_each_token_tile(tmp_path: Path) -> None:
    path = tmp_path / "tokens.onnx"
    onnx.save(_token_model(), str(path))
    # 1 KiB of SRAM: the [1, 16, 32] hidden map alone is 1 KiB, so tiles split the tokens
    plan = _verify(tmp_path, str(path), {}, ["sram.bytes=1KiB"], solver="shortest-path")
    pos_group = next(g for g in plan.groups if "pos_add" in g.layers)
    assert pos_group.tile.h < 16


@pytest.mark.slow
def test_torchvision_vit_b_16_plans_and_verifies_on_the_default_chip(tmp_path: Path) -> None:
    # nn.MultiheadAttention exports sequence-first [L, B, C] tensors: tokens on axis 0 tile
    # as the batch of a [197, 1, 768] stretch, and every plan still verifies
    plan = _verify(tmp_path, str(EXPORTS / "vit_b_16.onnx"), IMAGE, [])
    assert plan.totals.dram_bytes < plan.layer_by_layer_dram_bytes
