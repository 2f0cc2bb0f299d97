"""A decode step's KV cache appended in place, grouped-query attention read as a broadcast
and k^T as a view (issue 46; planner.front.kv_cache, planner.front.attention_fusion).

The decode export (examples/exports/zoo2026/llama_decode.onnx: one token, a 1,024-position
cache per layer, grouped-query attention with repeat_kv) moves each weight and the cache
once and writes only the new positions; a hand-built decode attention checks the same on
chips where the cache streams, and that a cache read by anything but attention keeps its
Concat (and is copied, as the model says)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from fuseplan.planner.app import api
from fuseplan.planner.front.graph_build import build_graph
from fuseplan.planner.front.onnx_load import load_model
from fuseplan.planner.geometry.attention import online_attention
from fuseplan.planner.geometry.regions import group_io
from fuseplan.planner.plan.json_io import save_plan
from tests.models import save

ZOO = Path(__file__).resolve().parent.parent / "examples" / "exports" / "zoo2026"
DECODE = ZOO / "llama_decode.onnx"


def _verified(tmp_path: Path, model: str, overrides: tuple[str, ...] = ()) -> api.Plan:
    plan = api.solve(model, overrides=overrides)
    saved = tmp_path / "plan.json"
    save_plan(plan, saved)
    report = api.verify(model, saved, overrides=overrides)
    assert report.outputs_match, report.first_output_mismatch
    assert report.predicted_matches_emulated, report.first_counter_mismatch
    assert not report.capacity_violations, [v.describe() for v in report.capacity_violations]
    # every model output compared, the appended caches among them
    assert {c.tensor for c in report.tensors} >= set(load_model(model, {}).outputs)
    return plan


def test_llama_decode_reads_weights_and_cache_once(tmp_path: Path) -> None:
    graph = build_graph(load_model(str(DECODE), {}))
    assert len(graph.appends) == 4
    assert not {a.output for a in graph.appends} & set(graph.producer)  # no copy made
    fused = [lay for lay in graph.layers if lay.op == "FlashAttention"]
    assert len(fused) == 2
    for lay in fused:  # q, the caches, the new positions; 8 query heads on 2 key heads
        assert len(lay.fmap_inputs) == 5
        assert lay.attrs["kv_groups"] == 4 and lay.attrs["transposed_keys"] == 0
    # nothing expands the key heads or transposes the keys any more
    assert not any(lay.op in ("Expand", "Unsqueeze") for lay in graph.layers)
    # inspect shows the model's outputs and what the plan writes of each cache
    doc = api.inspect(str(DECODE))
    assert set(doc["outputs"]) == {"last_hidden_state", *(a.output for a in graph.appends)}
    assert {(a["output"], a["new"]) for a in doc["appends"]} == {
        (a.output, a.new) for a in graph.appends}
    plan = _verified(tmp_path, str(DECODE))
    dt = 2
    weights = plan.totals.weight_read_bytes
    cache = sum(graph.elems(a.cache) for a in graph.appends) * dt
    new = sum(graph.elems(a.new) for a in graph.appends) * dt
    hidden = graph.elems("last_hidden_state") * dt
    ideal = weights + cache + new + hidden
    assert plan.totals.dram_bytes <= 1.02 * ideal, (plan.totals.dram_bytes, ideal)
    assert plan.compulsory_dram_bytes <= plan.totals.dram_bytes


def test_batch_decode_reads_each_weight_once_per_step(tmp_path: Path) -> None:
    """Eight sequences, each with its own caches: one weight stream for the batch."""
    model = str(ZOO / "llama_decode_b8.onnx")
    graph = build_graph(load_model(model, {}))
    assert len(graph.appends) == 4
    plan = _verified(tmp_path, model)
    once = sum(graph.constants[w].size for w in {w for lay in graph.layers
                                                 for w in lay.weights}) * 2
    (table,) = graph.row_gathers.values()  # the embedding: at most 8 rows of its table
    rows = graph.constants[table].shape[1] * 8 * 2
    assert once <= plan.totals.weight_read_bytes <= once + rows
    cache = sum(graph.elems(a.cache) for a in graph.appends) * 2
    assert plan.totals.dram_bytes <= 1.05 * (plan.totals.weight_read_bytes + cache)


def _decode_attention(heads: int, kv_heads: int, past: int, d: int, *,
                      cache_elsewhere: bool = False) -> onnx.ModelProto:
    """One decode step's attention as exporters write it: the new key and value made from
    an input, appended to the cache inputs (Concat, model outputs), repeat_kv, k^T, scale,
    Softmax, p @ v; `cache_elsewhere`: the present keys also feed a ReduceSum output."""
    rng = np.random.default_rng(7)
    n = heads // kv_heads
    inits = [numpy_helper.from_array(rng.standard_normal((1, kv_heads, 1, d))
                                     .astype(np.float32), "wk"),
             numpy_helper.from_array(rng.standard_normal((1, kv_heads, 1, d))
                                     .astype(np.float32), "wv"),
             numpy_helper.from_array(np.array([2], np.int64), "axis2"),
             numpy_helper.from_array(np.array([1, kv_heads, n, past + 1, d], np.int64), "wide"),
             numpy_helper.from_array(np.array([1, heads, past + 1, d], np.int64), "heads"),
             numpy_helper.from_array(np.array(d ** -0.5, np.float32), "scale")]
    nodes = [helper.make_node("Mul", ["x", "wk"], ["k_new"], name="k_proj"),
             helper.make_node("Add", ["x", "wv"], ["v_new"], name="v_proj"),
             helper.make_node("Concat", ["past_key", "k_new"], ["present_key"], axis=2,
                              name="cat_k"),
             helper.make_node("Concat", ["past_value", "v_new"], ["present_value"], axis=2,
                              name="cat_v")]
    for t in ("key", "value"):
        if n == 1:  # repeat_kv returns its input as it is
            continue
        nodes += [helper.make_node("Unsqueeze", [f"present_{t}", "axis2"], [f"u_{t}"],
                                   name=f"unsqueeze_{t}"),
                  helper.make_node("Expand", [f"u_{t}", "wide"], [f"e_{t}"], name=f"expand_{t}"),
                  helper.make_node("Reshape", [f"e_{t}", "heads"], [f"r_{t}"],
                                   name=f"reshape_{t}")]
    k, v = ("present_key", "present_value") if n == 1 else ("r_key", "r_value")
    nodes += [helper.make_node("Transpose", [k], ["kt"], perm=[0, 1, 3, 2], name="kt"),
              helper.make_node("MatMul", ["q", "kt"], ["scores"], name="qk"),
              helper.make_node("Mul", ["scores", "scale"], ["scaled"], name="scaling"),
              helper.make_node("Softmax", ["scaled"], ["p"], axis=-1, name="softmax"),
              helper.make_node("MatMul", ["p", v], ["out"], name="pv")]
    outputs = [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, heads, 1, d])]
    for t in ("key", "value"):
        outputs.append(helper.make_tensor_value_info(f"present_{t}", TensorProto.FLOAT,
                                                     [1, kv_heads, past + 1, d]))
    if cache_elsewhere:
        inits.append(numpy_helper.from_array(np.array([3], np.int64), "axis3"))
        nodes.append(helper.make_node("ReduceSum", ["present_key", "axis3"], ["key_sums"],
                                      keepdims=1, name="key_sums"))
        outputs.append(helper.make_tensor_value_info("key_sums", TensorProto.FLOAT,
                                                     [1, kv_heads, past + 1, 1]))
    inputs = [helper.make_tensor_value_info("q", TensorProto.FLOAT, [1, heads, 1, d]),
              helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, kv_heads, 1, d]),
              helper.make_tensor_value_info("past_key", TensorProto.FLOAT,
                                            [1, kv_heads, past, d]),
              helper.make_tensor_value_info("past_value", TensorProto.FLOAT,
                                            [1, kv_heads, past, d])]
    graph = helper.make_graph(nodes, "decode_attention", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model


@pytest.mark.parametrize(("heads", "kv_heads", "sram"), [(8, 2, "1MiB"), (4, 4, "64KiB"),
                                                         (6, 2, "32KiB")])
def test_decode_attention_appends_and_streams_the_cache(tmp_path: Path, heads: int,
                                                        kv_heads: int, sram: str) -> None:
    """On chips that hold the cache whole and chips where it streams chunk by chunk, the
    step reads each cache once, writes only the new positions, and verifies (the present
    caches included)."""
    past, d = 1100, 16
    path = str(save(_decode_attention(heads, kv_heads, past, d), tmp_path, "decode"))
    graph = build_graph(load_model(path, {}))
    assert {a.output for a in graph.appends} == {"present_key", "present_value"}
    (lay,) = [lay for lay in graph.layers if lay.op == "FlashAttention"]
    assert lay.attrs["kv_groups"] == heads // kv_heads
    overrides = (f"sram.bytes={sram}",)
    plan = _verified(tmp_path, path, overrides)
    dt = 2
    cache = 2 * kv_heads * past * d * dt
    new = 2 * kv_heads * d * dt
    outside = (heads * d * 2 + kv_heads * d) * dt  # q and x read, the output written
    # the new positions are read back by the attention unless made in its group, and x
    # twice where the two projections run in two groups
    bound = cache + new + outside + plan.totals.weight_read_bytes
    assert bound <= plan.totals.dram_bytes <= bound + new + kv_heads * d * dt
    group = next(g for g in plan.groups if lay.name in g.layers)
    found = online_attention(graph, group_io(graph, group.layers))
    assert found is not None
    if sram != "1MiB":  # a cache larger than the chip streams chunk by chunk
        assert {"past_key", "past_value"} <= set(found.streamed)


def test_a_cache_wider_than_the_chip_runs_in_head_chunks(tmp_path: Path) -> None:
    """One chunk of 128 keys of eight 64-wide heads is 128 KiB of keys and as much of
    values: on 96 KiB the attention runs a chunk of heads at a time, the caches still read
    once and only the new positions written."""
    heads, past, d = 8, 1100, 64
    path = str(save(_decode_attention(heads, heads, past, d), tmp_path, "wide"))
    graph = build_graph(load_model(path, {}))
    (lay,) = [lay for lay in graph.layers if lay.op == "FlashAttention"]
    plan = _verified(tmp_path, path, ("sram.bytes=96KiB",))
    group = next(g for g in plan.groups if lay.name in g.layers)
    assert group.layers == (lay.name,) and group.placement.hidden_chunks > 1
    cache, one = 2 * heads * past * d * 2, heads * d * 2  # one: a position of every head
    # beside the caches: q, x (for each projection's group), the new keys and values
    assert plan.totals.dram_read_bytes <= cache + 5 * one + plan.totals.weight_read_bytes


def test_a_cache_read_elsewhere_keeps_its_concat(tmp_path: Path) -> None:
    path = str(save(_decode_attention(4, 2, 1100, 8, cache_elsewhere=True), tmp_path, "other"))
    graph = build_graph(load_model(path, {}))
    # the keys' cache feeds a ReduceSum too: it stays a Concat, and so must the values'
    # (an attention reads both in two parts or neither)
    assert graph.appends == ()
    assert sum(lay.op == "Concat" for lay in graph.layers) == 2
    (lay,) = [lay for lay in graph.layers if lay.op == "FlashAttention"]
    assert len(lay.fmap_inputs) == 3 and lay.attrs["kv_groups"] == 2
    plan = _verified(tmp_path, path, ("sram.bytes=256KiB",))
    assert plan.totals.dram_bytes >= 2 * 2 * 2 * 1101 * 8 * 2  # both caches written whole
