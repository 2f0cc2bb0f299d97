"""Long attention as one fused layer run with the online softmax (issue: transformers).

The kernel's key-chunk recurrence equals a whole-row softmax; the front end fuses causal
(and long unmasked) attention and nothing else; plans stream the keys and values of a fused
layer chunk by chunk, verify against onnxruntime with predicted == emulated bytes, and the
attention group's traffic is the analytic count for its tiling (queries once, keys and
values once per tile of query rows, output once).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import numpy_helper

from fuseplan.emulator.attention_kernel import online_attention
from fuseplan.planner.app import api
from fuseplan.planner.app.planning import plan_problem
from fuseplan.planner.core.errors import InputError
from fuseplan.planner.cost.model import group_cost
from fuseplan.planner.front.graph_build import build_graph
from fuseplan.planner.front.onnx_load import load_model
from fuseplan.planner.geometry.attention import (
    attention_heads,
    attention_kv_heads,
    attention_traffic,
    head_chunk_options,
)
from fuseplan.planner.geometry.attention import online_attention as onchip_attention
from fuseplan.planner.geometry.hidden import stretches
from fuseplan.planner.geometry.passes import pass_split
from fuseplan.planner.geometry.regions import Tile, group_io
from fuseplan.planner.ir.graph import MapKind
from fuseplan.planner.plan.json_io import save_plan
from fuseplan.planner.plan.mode import Mode, mode_problem
from fuseplan.planner.plan.placement import Placement
from fuseplan.planner.ui.export import annotated_model
from tests.models import causal_encoder, rules_keeping_keys_in_sram, save


def _reference(q: np.ndarray, kt: np.ndarray, v: np.ndarray, scale: float, causal: bool,
               offset: int, lq: int) -> np.ndarray:
    scores = q @ kt * scale
    if causal:
        lk = kt.shape[-1]
        rows = np.arange(offset, offset + q.shape[-2])[:, None]
        scores = np.where(np.arange(lk)[None, :] <= rows + (lk - lq), scores, -1e4)
    scores = scores - scores.max(axis=-1, keepdims=True)
    p = np.exp(scores)
    return (p / p.sum(axis=-1, keepdims=True)) @ v


@settings(max_examples=80, deadline=None)
@given(heads=st.integers(1, 3), lq=st.integers(1, 40), extra=st.integers(0, 20),
       d=st.integers(1, 8), dv=st.integers(1, 8), chunk=st.integers(1, 64),
       causal=st.booleans(), prefix=st.booleans(), cut=st.integers(0, 39),
       seed=st.integers(0, 2**16))
def test_online_softmax_equals_whole_rows(heads: int, lq: int, extra: int, d: int, dv: int,
                                          chunk: int, causal: bool, prefix: bool, cut: int,
                                          seed: int) -> None:
    """Any tile of query rows, any key chunk, with or without the causal mask; a causal
    tile given only the keys up to its last row's, [0, hi + Lk - Lq) (the kernel told how
    many keys the sequence has: MapKind.PREFIX), gives the same rows."""
    rng = np.random.default_rng(seed)
    lk = lq + extra
    q = rng.standard_normal((1, heads, lq, d))
    kt = rng.standard_normal((1, heads, d, lk))
    v = rng.standard_normal((1, heads, lk, dv))
    lo = min(cut, lq - 1)
    hi = lo + max(1, (lq - lo) // 2)
    end = hi + lk - lq if causal and prefix else lk
    got = online_attention(q[..., lo:hi, :], kt[..., :end], v[..., :end, :], scale=0.3,
                           causal=causal, mask_value=-1e4, kv_chunk=chunk, query_offset=lo,
                           query_length=lq, key_length=lk)
    want = _reference(q[..., lo:hi, :], kt, v, 0.3, causal, lo, lq)
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)


def _graph(tmp_path: Path, **kw: object):  # type: ignore[no-untyped-def]
    path = save(causal_encoder(**kw), tmp_path, "encoder")  # type: ignore[arg-type]
    return path, build_graph(load_model(str(path), {}))


def test_attention_over_512_keys_is_fused(tmp_path: Path) -> None:
    # a GPT-2-sized block's 512 tokens: the scores of every head would spill unfused
    _, graph = _graph(tmp_path, tokens=512, width=16, heads=2)
    (lay,) = [lay for lay in graph.layers if lay.op == "FlashAttention"]
    assert lay.attrs["kv_chunk"] == 64 and lay.attrs["query_length"] == 512
    _, short = _graph(tmp_path, tokens=511, width=16, heads=2)
    assert not any(lay.op == "FlashAttention" for lay in short.layers)


@pytest.mark.parametrize("mask", ["where", "add", "none"])
def test_long_attention_is_one_layer(tmp_path: Path, mask: str) -> None:
    _, graph = _graph(tmp_path, tokens=1024, width=16, heads=2, mask=mask)
    fused = [lay for lay in graph.layers if lay.op == "FlashAttention"]
    assert len(fused) == 1
    lay = fused[0]
    assert lay.attrs["causal"] == (mask != "none")
    assert lay.attrs["scale"] == pytest.approx(8 ** -0.5)
    assert lay.attrs["kv_chunk"] == 64 and lay.attrs["query_length"] == 1024
    assert not any(lay.op == "Softmax" for lay in graph.layers)
    # the queries row-local, the keys and values streamed: whole, or causal up to each
    # tile's last query
    kv = MapKind.PREFIX if mask != "none" else MapKind.WHOLE
    assert [m.kind for m in lay.row_maps] == [MapKind.IDENTITY, kv, kv]
    assert lay.macs == 2 * 1024 * 1024 * 16  # q @ k^T and p @ v over all heads
    # no mask constant left among the layers' inputs: the causal structure is the kernel's
    assert not any(t.startswith(("causal", "bias")) for la in graph.layers for t in la.inputs)


def test_short_or_unknown_attention_stays_layers(tmp_path: Path) -> None:
    _, short = _graph(tmp_path, tokens=256, width=16, heads=2)
    assert not any(lay.op == "FlashAttention" for lay in short.layers)
    assert any(lay.op == "Softmax" for lay in short.layers)
    model = causal_encoder(tokens=1024, width=16, heads=2)
    for init in model.graph.initializer:  # a mask that is not causal: left as the model has it
        if init.name.startswith("causal"):
            arr = np.random.default_rng(0).random((1, 1, 1024, 1024)) < 0.5
            init.CopyFrom(numpy_helper.from_array(arr, init.name))
    path = save(model, tmp_path, "masked")
    graph = build_graph(load_model(str(path), {}))
    assert not any(lay.op == "FlashAttention" for lay in graph.layers)


def _plan_and_verify(tmp_path: Path, path: Path, overrides: list[str],
                     solver: str = "cpsat", rules: Path | None = None) -> api.Plan:
    plan = api.solve(str(path), rules, solver=solver, overrides=overrides)
    saved = tmp_path / f"plan_{solver}.json"
    save_plan(plan, saved)
    report = api.verify(str(path), saved, seed=3, overrides=overrides)
    # every fused attention alone in its group moved FlashAttention's analytic count
    assert report.attention and all(a.emulated_bytes == a.analytic_bytes
                                    for a in report.attention if a.alone), report.attention
    assert report.outputs_match, report.first_output_mismatch
    assert report.predicted_matches_emulated, report.first_counter_mismatch
    assert not report.capacity_violations, [v.describe() for v in report.capacity_violations]
    return plan


def test_streamed_keys_plan_and_verify(tmp_path: Path) -> None:
    """K and V whole (256 KiB) do not fit 128 KiB of SRAM: the fused layer streams them;
    its group's traffic is queries once, keys and values once per tile up to the tile's last
    query (causal: FlashAttention-2 skips the chunks past the diagonal), output once. (With
    the rules' `search.keys_spilled` or `search.keys_in_wram` on, the layer's group makes its
    keys and spills them or keeps them in WRAM instead, fewer bytes:
    tests/test_spilled_keys.py, tests/test_keys_in_wram.py; off here, to plan the
    streaming.)"""
    path, graph = _graph(tmp_path, tokens=1024, width=32, heads=2)
    chip = ["sram.bytes=128KiB"]
    rules = rules_keeping_keys_in_sram(tmp_path)
    spilling = api.solve(str(path), overrides=chip)
    for solver in ("cpsat", "shortest-path"):
        plan = _plan_and_verify(tmp_path, path, chip, solver, rules)
        assert spilling.totals.dram_bytes < plan.totals.dram_bytes
        group = next(g for g in plan.groups
                     if any(graph.layer(n).op == "FlashAttention" for n in g.layers))
        io = group_io(graph, group.layers)
        attention = onchip_attention(graph, io)
        assert attention is not None and attention.streamed, group.layers
        fused = next(graph.layer(n) for n in group.layers
                     if graph.layer(n).op == "FlashAttention")
        q, kt, v = fused.fmap_inputs
        tiles = -(-1024 // group.tile.h)
        dt = 2
        streamed = sum(graph.elems(t) for t in (kt, v) if t in attention.streamed)
        (count,) = attention_traffic(graph, io, group.tile, dt)
        assert count.passes == tiles and count.kv_bytes == dt * streamed
        # tile i reads keys [0, (i + 1) h): the first tiles read less than all 1024
        rows = sum(min(1024, (i + 1) * group.tile.h) for i in range(tiles))
        assert tiles > 1 and count.kv_reads == dt * streamed * rows // 1024 \
            < dt * streamed * tiles
        if group.layers == (fused.name,):  # alone: the whole count is the analytic one
            assert group.predicted.dram_read_bytes == dt * graph.elems(q) + count.kv_reads
            assert group.predicted.dram_write_bytes == dt * graph.elems(fused.outputs[0])
            assert group.predicted.dram_bytes == count.total
        else:  # beside other layers: the keys and values part of it
            assert group.predicted.dram_read_bytes >= count.kv_reads
    # the nodes the fused layer stands for are annotated with its group (Netron export)
    annotated = annotated_model(api.prepare(str(path), overrides=chip), plan)
    marks = {n.name: dict((p.key, p.value) for p in n.metadata_props)
             for n in annotated.graph.node}
    assert marks["softmax24"]["fuseplan.group"] == marks[fused.name]["fuseplan.group"]


@pytest.mark.slow
def test_gpt2_small_prefill_on_the_default_chip(tmp_path: Path) -> None:
    """Issue 18's check: an encoder stack at sequence 4096, width 768, 12 heads, causal,
    plans and verifies on the default chip (every layer of the unfused attention needs k^T
    whole, 6 MiB, and had no plan); and issue 46's: it moves at most 1.2 times its I/O
    bound (the floor plus each attention's FlashAttention I/O as if alone). Each layer's
    attention is one split group with its norm and qkv projection, its keys and values
    (12 MiB, a cluster's 2 MiB of SRAM at no height) kept in the cores' WRAM, each cluster
    three heads' worth: q, k and v never leave the chip, the attention's output goes once
    through DRAM to the output projection (87.01 MiB, 1.00x the bound)."""
    path = save(causal_encoder(tokens=4096, width=768, heads=12, blocks=2), tmp_path, "gpt")
    plan = _plan_and_verify(tmp_path, path, [])
    graph = build_graph(load_model(str(path), {}))
    fused = [g for g in plan.groups
             if any(graph.layer(n).op == "FlashAttention" for n in g.layers)]
    assert len(fused) == 2
    for g in fused:
        (count,) = attention_traffic(graph, group_io(graph, g.layers), g.tile, 2)
        assert g.placement.keys_in_wram and count.q_bytes == count.kv_bytes == 0
    assert plan.io_bounds is not None and plan.io_bounds.io_bound_bytes is not None
    assert plan.totals.dram_bytes <= 1.2 * plan.io_bounds.io_bound_bytes


def test_head_chunks_let_taller_tiles_stream_keys_fewer_times(tmp_path: Path) -> None:
    """A lone fused attention runs its heads a chunk at a time: the tile it picks would not
    fit with every head on chip, and the plan verifies byte for byte. A hand-edited chunk
    count that does not divide the heads is refused (exit 2, naming the fix). (With the
    rules' `search.keys_in_wram` on, the whole block is one group split over the clusters
    that keeps its keys in WRAM, fewer bytes; off here, as `search.keys_spilled`, to plan
    the lone attention.)"""
    path, graph = _graph(tmp_path, tokens=1024, width=64, heads=4)
    chip = ["sram.bytes=128KiB"]
    rules = rules_keeping_keys_in_sram(tmp_path)
    plan = _plan_and_verify(tmp_path, path, chip, rules=rules)
    assert api.solve(str(path), overrides=chip).totals.dram_bytes < plan.totals.dram_bytes
    group = next(g for g in plan.groups if graph.layer(g.layers[0]).op == "FlashAttention")
    assert group.layers == ("mix25",) and group.placement.hidden_chunks in (2, 4)
    whole = group_cost(graph, group.layers, group.tile, api.prepare(str(path),
                       overrides=chip).chip, True, group.double_buffered)
    assert whole.sram_peak_bytes > 128 * 1024 >= group.predicted.sram_peak_bytes
    assert whole.dram_bytes == group.predicted.dram_bytes  # chunks move no byte more
    (count,) = attention_traffic(graph, group_io(graph, group.layers), group.tile, 2)
    assert group.predicted.dram_bytes == count.total
    # explain re-checks the group against the chip from its exact head-chunk peak
    assert not api.explain(str(path), tmp_path / "plan_cpsat.json", None, None, None,
                           chip)["violations"]
    doc = json.loads((tmp_path / "plan_cpsat.json").read_text())
    edited = next(g for g in doc["groups"] if g["layers"] == ["mix25"])
    edited["hidden_chunks"] = 3
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    with pytest.raises(InputError, match="divisor of 4"):
        api.verify(str(path), bad, seed=3, overrides=chip)


def test_groups_with_fused_attention_run_plain_tiles(tmp_path: Path) -> None:
    """A fused attention outside a head stretch (its q, keys and values made by an earlier
    group): its group offers neither hidden chunks nor pooling passes, which count no
    streamed keys (its MLP alone still runs in hidden chunks)."""
    _, graph = _graph(tmp_path, tokens=1024, width=16, heads=2)
    names = [lay.name for lay in graph.layers]
    mix = next(n for n in names if graph.layer(n).op == "FlashAttention")
    tail = names[names.index(mix):]
    mlp = names[names.index(mix) + 5:]  # ln, fc, relu, fc, residual
    assert [graph.layer(n).op for n in mlp[:2]] == ["LayerNormalization", "MatMul"]
    assert stretches(graph, group_io(graph, mlp))
    assert not stretches(graph, group_io(graph, tail))
    assert pass_split(graph, tail) is None


def test_a_fused_attention_runs_inside_head_chunks_of_its_block(tmp_path: Path) -> None:
    """qkv, the head split, the fused attention and the output projection as one head
    stretch: each chunk of heads makes its own q, keys and values and runs the online
    softmax on them, its scratch counted per head. At 256 KiB the whole block is one group
    (no map but the input and output crosses DRAM), verified byte for byte; holding every
    head at once, the same group needs more than the chip has. Where tiles may reuse, the
    block is one group of short tiles keeping the keys they make instead (the same bytes;
    tests/test_causal_prefix.py); head chunks are what a search without reuse finds."""
    path, graph = _graph(tmp_path, tokens=512, width=64, heads=4)
    names = [lay.name for lay in graph.layers]
    mix = next(n for n in names if graph.layer(n).op == "FlashAttention")
    found = stretches(graph, group_io(graph, names))
    assert [(s.widen, s.narrow, s.channels) for s in found][0] == ("qkv13", "proj29", 4)
    assert mix in found[0].mids
    chip = ["sram.bytes=256KiB"]
    dt = 2
    weights = sum(graph.elems(w) for lay in graph.layers for w in lay.weights)
    reusing = _plan_and_verify(tmp_path, path, chip)
    (kept,) = reusing.groups
    assert kept.halo_reuse and kept.tile.h < 512
    problem = api.prepare(str(path), overrides=chip)
    rs = problem.ruleset
    problem = replace(problem, ruleset=replace(rs, search=replace(rs.search, halo_reuse=False)))
    plan = plan_problem(problem, "cpsat")
    report = api.verify_in_memory(problem, plan, seed=3)
    assert report.outputs_match and report.predicted_matches_emulated
    assert not report.capacity_violations
    (group,) = plan.groups
    assert group.placement.hidden_chunks > 1
    io = group_io(graph, group.layers)
    assert onchip_attention(graph, io) is not None
    whole = group_cost(graph, group.layers, group.tile, problem.chip, False,
                       group.double_buffered)
    assert whole.sram_peak_bytes > 256 * 1024 >= group.predicted.sram_peak_bytes
    # between the maps: inputs and weights read, the output written, nothing else
    for p in (plan, reusing):
        assert p.totals.dram_write_bytes == dt * graph.elems(graph.outputs[0])
        assert p.totals.dram_read_bytes >= dt * (graph.elems("input") + weights)
    assert reusing.totals.dram_bytes <= plan.totals.dram_bytes


def test_grouped_query_attention_runs_in_chunks_of_whole_groups(tmp_path: Path) -> None:
    """A lone fused attention of 4 query heads over 2 key heads (Llama's grouped-query
    attention) runs in 2 chunks, each a key head with its 2 query heads: the peak halves,
    the bytes stay those run whole, verified; 4 chunks would split a group and are refused,
    naming the key heads' divisors."""
    from tests.hand import assert_verifies, hand_plan
    from tests.models import llama_attention

    path = save(llama_attention(tokens=512, width=64, heads=4, kv_heads=2), tmp_path, "gqa")
    problem = api.prepare(str(path), overrides=["sram.bytes=256KiB"])
    g = problem.graph
    (mix,) = [lay.name for lay in g.layers if lay.op == "FlashAttention"]
    lay = g.layer(mix)
    assert [g.shapes[t][1] for t in lay.fmap_inputs] == [4, 2, 2]  # no expanded copy
    io = group_io(g, (mix,))
    assert attention_heads(g, io) == 4 and attention_kv_heads(g, io) == 2
    assert head_chunk_options(4, 2) == [2]
    tile = Tile(1, 128, 1)
    plan = hand_plan(problem, [Placement.of((mix,), tile, True, hidden_chunks=2)])
    assert_verifies(problem, plan)
    group = next(gr for gr in plan.groups if gr.layers == (mix,))
    whole = group_cost(g, (mix,), tile, problem.chip, True, False)
    assert group.predicted.sram_peak_bytes == whole.sram_peak_bytes // 2
    assert group.predicted.dram_bytes == whole.dram_bytes
    assert mode_problem(g, (mix,), tile, Mode.of(hidden_chunks=4), tile) is not None
    assert "divisor of 2" in str(mode_problem(g, (mix,), tile, Mode.of(hidden_chunks=4), tile))
