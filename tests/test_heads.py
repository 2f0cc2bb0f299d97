"""Attention in head chunks (issue 18; planner.geometry.heads): where a stretch's heads sit in
every tensor, and attention blocks run a few heads at a time, verified."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from hand import assert_verifies, hand_plan
from hypothesis import given, settings
from hypothesis import strategies as st
from test_transformers import _attention_model, _verify

from fuseplan.planner.app import api
from fuseplan.planner.app.explain import recheck
from fuseplan.planner.core.errors import InputError
from fuseplan.planner.front.graph_build import build_graph
from fuseplan.planner.front.onnx_load import load_model
from fuseplan.planner.geometry.heads import Cut, _regrouped, head_walk, take_units
from fuseplan.planner.geometry.hidden import (
    chunk_options,
    stream_holds,
    stretch_chunks,
    stretch_loads,
    stretches,
    widen_runs,
)
from fuseplan.planner.geometry.regions import Tile, group_io
from fuseplan.planner.ir.graph import Graph
from fuseplan.planner.plan.json_io import save_plan
from fuseplan.planner.plan.placement import Placement

from models import batch_first_mha, causal_encoder, fusing_rules, llama_attention

EXPORTS = Path(__file__).resolve().parent.parent / "examples" / "exports"


def _graph(model: onnx.ModelProto, tmp_path: Path) -> tuple[Graph, Path]:
    path = tmp_path / f"{model.graph.name}.onnx"
    onnx.save(model, str(path))
    return build_graph(load_model(str(path), {})), path


def test_timm_attention_is_one_head_stretch(tmp_path: Path) -> None:
    # qkv's 3 * 32 channels are q | k | v, each 4 heads of 8: a head is three runs of 8
    graph, _ = _graph(_attention_model(batch=1, tokens=16, width=32, heads=4), tmp_path)
    order = [lay.name for lay in graph.layers]
    walk = head_walk(graph, order, order.index("qkv"))
    assert walk is not None
    assert walk.units == 4 and walk.narrow == "proj"
    assert walk.cuts["qkv"] == Cut(2, 3, 8)  # [B, L, 3C]
    assert walk.cuts["wqkv"] == Cut(1, 3, 8)  # its weights' output channels, alike
    assert walk.cuts["r5"] == Cut(3, 1, 1)  # [B, L, 3, H, d]: the heads axis itself
    assert walk.cuts["t5"] == Cut(2, 1, 1)  # [3, B, H, L, d]
    assert walk.cuts["q"] == walk.cuts["v"] == Cut(1, 1, 1)  # the Split's parts: [B, H, L, d]
    assert walk.cuts["s"] == Cut(1, 1, 1)  # the scores, [B, H, L, L]
    assert walk.cuts["m"] == Cut(2, 1, 8)  # back to [B, L, C]
    assert walk.cuts["wo"] == Cut(0, 1, 8)  # the projection sums over them: its rows
    found = stretches(graph, group_io(graph, order))
    assert [(s.widen, s.narrow, s.channels) for s in found] == [("qkv", "proj", 4)]
    assert chunk_options(found) == [2, 4]


@pytest.mark.slow
def test_torchvision_attention_heads_through_sequence_first_shuffles() -> None:
    # nn.MultiheadAttention: [L, B, 3C] -> [L, B, 3, C] -> unsqueeze, transpose, squeeze ->
    # three Gathers -> [L, B*H, d] -> transposes -> [B, H, L, d]; the out projection a Gemm
    graph = build_graph(load_model(str(EXPORTS / "vit_b_16.onnx"), {"input": (1, 3, 224, 224)}))
    order = [lay.name for lay in graph.layers]
    layer = "/encoder/layers/encoder_layer_0"
    walk = head_walk(graph, order, order.index(f"{layer}/self_attention/MatMul"))
    assert walk is not None
    assert walk.units == 12 and walk.narrow == f"{layer}/self_attention/Gemm"
    assert walk.cuts[f"{layer}/self_attention/MatMul_output_0"] == Cut(2, 3, 64)
    assert walk.cuts[f"{layer}/self_attention/Softmax_output_0"] == Cut(1, 1, 1)
    io = group_io(graph, order[order.index(f"{layer}/ln_1/LayerNormalization"):
                               order.index(f"{layer}/Add_1") + 1])
    assert [s.channels for s in stretches(graph, io)] == [12, 3072]  # attention, then MLP
    # the heads' divisors and the MLP's powers of two; each stretch runs in the most it
    # makes up to the count (8 chunks: the heads in 6, the MLP in 8)
    found = stretches(graph, io)
    assert chunk_options(found) == [2, 3, 4, 6, 8, 12, 16, 32, 64, 128, 256, 512, 1024]
    assert [stretch_chunks(s, 8) for s in found] == [6, 8]
    assert [stretch_chunks(s, 1024) for s in found] == [12, 1024]


@settings(max_examples=200, deadline=None)
@given(pre=st.integers(1, 3), outer=st.integers(1, 3), units=st.integers(2, 6),
       inner=st.integers(1, 4), post=st.integers(1, 3), how=st.integers(0, 4),
       data=st.data())
def test_a_cut_follows_a_reshape_that_keeps_the_heads_whole(
        pre: int, outer: int, units: int, inner: int, post: int, how: int,
        data: st.DataObject) -> None:
    shape = (pre, outer * units * inner, post)
    cut = Cut(1, outer, inner)
    x = np.arange(int(np.prod(shape))).reshape(shape)
    out = [(pre, outer, units * inner, post), (pre, outer * units, inner, post),
           (pre * outer * units * inner, post), (pre, outer * units * inner * post),
           (pre, outer, units, inner * post)][how]
    new = _regrouped(shape, cut, out)
    assert new is not None
    lo = data.draw(st.integers(0, units - 1))
    hi = data.draw(st.integers(lo + 1, units))
    # the chunk's elements, in the same (row-major) order, and its shape
    got = take_units(x.reshape(out), new, lo, hi)
    assert np.array_equal(take_units(x, cut, lo, hi).reshape(-1), got.reshape(-1))
    assert new.chunk_shape(out, hi - lo) == got.shape


@pytest.mark.parametrize("out", [(2, 3, 2, 16, 5), (2, 3, 2, 2, 8, 5)])
def test_a_reshape_that_splits_the_heads_stops_the_cut(out: tuple[int, ...]) -> None:
    # [2, 3 * 4 * 8, 5]: q, k, v of 4 heads of 8 channels; split into 2 x (2 heads of 8),
    # or the heads into 2 x 2 axes: no axis holds whole heads
    assert _regrouped((2, 96, 5), Cut(1, 3, 8), out) is None


def test_a_head_may_span_rows_of_a_reshaped_axis() -> None:
    # each head's 8 channels as 2 rows of 4: heads are pairs of rows of axis 2
    assert _regrouped((2, 96, 5), Cut(1, 3, 8), (2, 3, 8, 4, 5)) == Cut(2, 1, 2)


def test_attention_runs_a_few_heads_at_a_time_and_verifies(tmp_path: Path) -> None:
    # 64 tokens, 64 channels, 8 heads in 48 KiB: the whole block at once does not fit (the
    # [1, 8, 64, 64] scores alone are 64 KiB), a chunk of heads does
    _, path = _graph(_attention_model(batch=1, tokens=64, width=64, heads=8), tmp_path)
    plan = _verify(tmp_path, str(path), {}, ["sram.bytes=48KiB"])
    assert len(plan.groups) == 1
    group = plan.groups[0]
    assert group.placement.hidden_chunks > 1 and {"scores", "proj"} <= set(group.layers)
    assert plan.totals.dram_bytes == plan.compulsory_dram_bytes
    # without hidden chunks the scores spill (the same rules otherwise)
    off = fusing_rules(tmp_path, {"hidden_chunks: true": "hidden_chunks: false"})
    assert api.solve(str(path), rules=off, solver="cpsat",
                     overrides=["sram.bytes=48KiB"]).totals.dram_bytes \
        > 2 * plan.totals.dram_bytes


def test_separate_q_k_v_projections_chunk_their_heads_together(tmp_path: Path) -> None:
    """q, k and v as three Linears on the same map (Whisper, diffusers, nn.MultiheadAttention
    as exported): the first widens, the other two are its siblings, cut alike, and every
    chunk of heads computes its slice of all three. At 32 KiB the whole block is one group
    (64 tokens, 8 heads); without hidden chunks it moves more than 1.5 times the bytes
    (its q, k and v then leave one group tiled alike, rule 4's tiled_outputs)."""
    graph, path = _graph(batch_first_mha(batch=1, tokens=64, width=64, heads=8), tmp_path)
    order = [lay.name for lay in graph.layers]
    q, k, v = (next(n for n in order if n.startswith(p) and n[1:].isdigit()) for p in "qkv")
    walk = head_walk(graph, order, order.index(q))
    assert walk is not None and walk.units == 8 and walk.narrow.startswith("fc")
    assert {k, v} <= set(walk.mids)
    (wq,), (wk,) = graph.layer(q).weights, graph.layer(k).weights
    assert walk.cuts[wk] == walk.cuts[wq] == Cut(1, 1, 8)  # [C, heads x d]: its columns
    assert walk.cuts[graph.layer(k).outputs[0]] == walk.cuts[graph.layer(q).outputs[0]]
    plan = _verify(tmp_path, str(path), {}, ["sram.bytes=32KiB"])
    (group,) = plan.groups
    assert group.placement.hidden_chunks > 1 and {q, k, v} <= set(group.layers)
    off = fusing_rules(tmp_path, {"hidden_chunks: true": "hidden_chunks: false"})
    assert api.solve(str(path), rules=off, solver="cpsat",
                     overrides=["sram.bytes=32KiB"]).totals.dram_bytes \
        > 1.5 * plan.totals.dram_bytes


def test_grouped_query_attention_with_rotary_embeddings_is_one_head_stretch(
        tmp_path: Path) -> None:
    """Llama's attention: q, k and v projections of 4 and 2 heads (k and v are siblings
    of q, narrower), rotary embeddings written out (Slice, Neg, Concat along the head
    width, Mul, Add), repeat_kv absorbed by the fused attention (kv_groups 2). A unit is a
    key head with its two query heads: q is cut in runs of 2 heads, k and v in single
    heads."""
    graph, _ = _graph(llama_attention(tokens=512, width=64, heads=4, kv_heads=2), tmp_path)
    order = [lay.name for lay in graph.layers]
    walk = head_walk(graph, order, order.index(next(n for n in order if n.startswith("q_"))))
    assert walk is not None and walk.units == 2 and walk.narrow.startswith("o_proj")
    mix = next(lay for lay in graph.layers if lay.op == "FlashAttention")
    assert mix.attrs["kv_groups"] == 2 and mix.name in walk.mids
    q_in, k_in, v_in = mix.fmap_inputs
    assert walk.cuts[q_in] == Cut(1, 1, 2) and walk.cuts[k_in] == walk.cuts[v_in] == Cut(1, 1, 1)
    k_proj = graph.layer(next(n for n in order if n.startswith("k_proj")))
    assert walk.cuts[k_proj.weights[0]] == Cut(1, 1, 16)  # [C, 2 heads x 16]: a head each


@pytest.mark.slow
def test_grouped_query_attention_with_rotary_embeddings_runs_in_key_head_chunks(
        tmp_path: Path) -> None:
    """The same half at 512 KiB plans as one group at its floor, verified (row tiles reusing
    halos, its keys kept). As one tile of every row it fits only in 2 chunks of key heads:
    so run, it moves the floor too and verifies; whole, its tile does not fit SRAM."""
    graph, path = _graph(llama_attention(tokens=512, width=64, heads=4, kv_heads=2), tmp_path)
    chip = ["sram.bytes=512KiB"]
    plan = _verify(tmp_path, str(path), {}, chip)
    (group,) = plan.groups
    assert plan.totals.dram_bytes == plan.compulsory_dram_bytes
    problem = api.prepare(str(path), overrides=chip)
    rows = Tile(1, 512, 1)
    chunked = hand_plan(problem, [Placement.of(group.layers, rows, hidden_chunks=2)])
    assert chunked.totals.dram_bytes == plan.compulsory_dram_bytes
    assert not recheck(graph, chunked, problem.chip, problem.ruleset)
    assert_verifies(problem, chunked)
    whole = hand_plan(problem, [Placement.of(group.layers, rows)])
    assert "sram" in {v.name for _, v in recheck(graph, whole, problem.chip, problem.ruleset)}


def test_attention_heads_in_chunks_at_batch_two(tmp_path: Path) -> None:
    # the batch stays its own axis through the timm shuffles: images and heads both cut
    _, path = _graph(_attention_model(batch=2, tokens=64, width=64, heads=8), tmp_path)
    plan = _verify(tmp_path, str(path), {}, ["sram.bytes=48KiB"])
    assert any(g.placement.hidden_chunks > 1 and "scores" in g.layers for g in plan.groups)


def test_a_plan_asking_for_chunks_the_heads_do_not_make_is_refused(tmp_path: Path) -> None:
    _, path = _graph(_attention_model(batch=1, tokens=64, width=64, heads=8), tmp_path)
    plan = _verify(tmp_path, str(path), {}, ["sram.bytes=48KiB"])
    doc = json.loads((tmp_path / "plan.json").read_text())
    assert plan.groups[0].placement.hidden_chunks > 1
    doc["groups"][0]["hidden_chunks"] = 5  # 8 heads in chunks of ceil(8 / 5) = 2: 4, not 5
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    with pytest.raises(InputError, match="has 8 heads, which do not make 5 chunks"):
        api.verify(str(path), bad, overrides=["sram.bytes=48KiB"])


def test_a_qkv_slice_streams_one_run_of_its_heads_at_a_time(tmp_path: Path) -> None:
    """timm's qkv holds q | k | v side by side: a chunk's slice of its weights is three
    runs (Cut.outer), each computing its own output channels, so the slice streams in three
    loads and only one run sits beside the next. Separate q, k and v projections stream
    one slice each already (one run)."""
    graph, _ = _graph(_attention_model(batch=1, tokens=16, width=32, heads=4), tmp_path)
    order = tuple(lay.name for lay in graph.layers)
    (s,) = stretches(graph, group_io(graph, order))
    assert widen_runs(graph, s) == 3
    cut = {("qkv", 0): 3 * 96, ("qkv", 1): 3 * 96, ("proj", 0): 64, ("proj", 1): 64}
    loads = stretch_loads(s, 2, cut, 8, widen_runs(graph, s))
    qkv = [own for (own, _), name in zip(loads, s.layers * 2, strict=True) if name == "qkv"]
    assert qkv == [[96 + 8, 96, 96], [96, 96, 96]]  # the uncut bytes with the first load
    # one load of 288 beside the projection's 64 held 352; runs of 96 hold 192 at most
    assert max(stream_holds(loads)) == 96 + 96 + 8 \
        < max(stream_holds(stretch_loads(s, 2, cut, 8))) == 288 + 64 + 8
    mha, _ = _graph(batch_first_mha(batch=1, tokens=64, width=64, heads=8), tmp_path)
    order = tuple(lay.name for lay in mha.layers)
    found = stretches(mha, group_io(mha, order))
    assert any(t.cuts for t in found) and all(widen_runs(mha, t) == 1 for t in found)


def test_a_gpt2_block_at_1mib_is_one_group_below_ffm(tmp_path: Path) -> None:
    """bench/peers' GPT-2-small-like block (512 tokens, width 768, 12 heads, 8-bit) on one
    1 MiB buffer: the qkv slices stream run by run and the residual Add writes over the
    projection, so the attention half runs as one tile in head chunks (every weight read
    once) and the whole block is one group. It moves 8,260,608 B: the floor plus the
    block input loaded again for its residual, below AccelForge FFM's 9,440,256 B
    (docs/results/peers.md); verified, every counter equal to the prediction."""
    path = tmp_path / "block.onnx"
    onnx.save(causal_encoder(tokens=512, width=768, heads=12, blocks=1, mask="none"),
              str(path))
    chip = ["sram.bytes=1MiB"]
    plan = api.solve(str(path), hardware="soma_buffer", overrides=chip)
    save_plan(plan, tmp_path / "plan.json")
    report = api.verify(str(path), tmp_path / "plan.json", seed=3)
    assert report.ok, (report.first_output_mismatch, report.first_counter_mismatch)
    (group,) = plan.groups
    assert group.placement.hidden_chunks > 1 and group.tile.h == 512
    # four 768 x 768 products, two of 768 x 3072, two LayerNorms' gamma and beta
    assert plan.totals.weight_read_bytes == 4 * 768 * 768 + 2 * 768 * 3072 + 4 * 768
    assert plan.totals.dram_bytes == plan.compulsory_dram_bytes + 512 * 768 == 8_260_608
