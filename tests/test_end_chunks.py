"""End chunks (planner.geometry.ends): a MatMul chain streams its input in chunks of the
first product's input channels and its output in chunks of the last product's output
channels, holding only the maps between whole (a group that does not start with a
product streams its output end alone). Hand-built plans and the planners' run on
the emulator with outputs equal to onnxruntime's and every counter (the SRAM peak, the
weights on chip and the cycles included) equal to the prediction; the four-MatMul chain of
issue 45 plans at AccelForge FFM's bytes."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest
from hand import assert_refused, assert_verifies, hand_plan
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from typer.testing import CliRunner

from fuseplan.planner.app import api
from fuseplan.planner.app.planning import plan_problem
from fuseplan.planner.cost.ends import ends_stream
from fuseplan.planner.geometry.ends import chunked_ends
from fuseplan.planner.geometry.regions import Tile, group_io
from fuseplan.planner.plan.json_io import save_plan
from fuseplan.planner.plan.placement import Placement
from fuseplan.planner.ui.cli import app


def chain_model(products: int = 4, tokens: int = 512, width: int = 768,
                widths: list[int] | None = None, relu_after: tuple[int, ...] = ()
                ) -> onnx.ModelProto:
    """A chain of MatMuls by constant [K, N] weights on [1, tokens, width] tokens (Relu
    after the products listed in `relu_after`); `widths`: each product's output channels."""
    outs = widths if widths is not None else [width] * products
    nodes, inits, prev, k = [], [], "x", width
    for i, n in enumerate(outs):
        inits.append(numpy_helper.from_array(np.zeros((k, n), np.float32), f"w{i}"))
        out = "y" if i == len(outs) - 1 and i not in relu_after else f"h{i}"
        nodes.append(helper.make_node("MatMul", [prev, f"w{i}"], [out], name=f"mm{i}"))
        if i in relu_after:
            nxt = "y" if i == len(outs) - 1 else f"r{i}"
            nodes.append(helper.make_node("Relu", [out], [nxt], name=f"relu{i}"))
            out = nxt
        prev, k = out, n
    graph = helper.make_graph(
        nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                       [1, tokens, width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, tokens, outs[-1]])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _save(model: onnx.ModelProto, tmp_path: Path, name: str = "chain") -> str:
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, str(path))
    return str(path)


def test_ends_of_a_chain_and_where_there_are_none(tmp_path: Path) -> None:
    problem = api.prepare(_save(chain_model(3, 16, 8, relu_after=(1,)), tmp_path))
    g = problem.graph
    ends = chunked_ends(g, group_io(g, ("mm0", "mm1", "relu1", "mm2")))
    assert ends is not None
    assert (ends.first, ends.source, ends.reduced) == ("mm0", "x", 8)
    assert (ends.last, ends.sink, ends.produced) == ("mm2", "y", 8)
    assert ends.makes_chunks(4) and not ends.makes_chunks(5)  # 8 = 2 + 2 + 2 + 2: four
    # one layer has no maps between its ends; a group starting after the input reads a map
    # of its own making: neither has a first end
    for layers in (("mm0",), ("mm1", "relu1", "mm2")):
        found = chunked_ends(g, group_io(g, layers))
        assert found is None or found.source != "x", layers
    # a group ending in a Relu writes its output in chunks all the same: the Relu runs on
    # each chunk of the product's output (the end's tail)
    tail = chunked_ends(g, group_io(g, ("mm0", "mm1", "relu1")))
    assert tail is not None and (tail.first, tail.last, tail.tail, tail.sink) \
        == ("mm0", "mm1", ("relu1",), "r1")
    assert chunked_ends(g, group_io(g, ("relu1",))) is None  # nothing to chunk


def test_the_output_end_streams_alone_where_the_group_starts_otherwise(
        tmp_path: Path) -> None:
    """A group starting with a Relu, or one product alone, has no first end: its input is
    held whole and only its last product writes its output in chunks (a Relu after it runs
    on each chunk)."""
    problem = api.prepare(_save(chain_model(4, 24, 16, relu_after=(0, 2)), tmp_path))
    g = problem.graph
    for layers, last in ((("relu0", "mm1"), "mm1"), (("mm2",), "mm2"),
                         (("mm0", "relu0", "mm1"), "mm1")):
        ends = chunked_ends(g, group_io(g, layers))
        assert ends is not None and ends.last == last, layers
        assert (ends.first is None) == (layers[0] != "mm0"), layers
    relu = chunked_ends(g, group_io(g, ("mm2", "relu2")))
    assert relu is not None and relu.first is None and relu.tail == ("relu2",)
    alone = chunked_ends(g, group_io(g, ("mm2",)))
    assert alone is not None and alone.layers == ("mm2",) and alone.start == 0
    assert alone.makes_chunks(16) and not alone.makes_chunks(32)  # 16 output channels


@pytest.mark.parametrize(("resident", "chunks", "hardware", "th"), [
    (False, 4, "soma_buffer", 24), (True, 2, "soma_buffer", 7), (False, 8, "cluster4x4", 7),
    (True, 16, "cluster4x4", 24)])
def test_hand_built_plans_streaming_the_output_end_alone_verify(
        tmp_path: Path, resident: bool, chunks: int, hardware: str, th: int) -> None:
    """Every group of the chain but the first streams its output end alone (a Relu first,
    a product alone); outputs and every counter equal the prediction. Against the same
    tiles run whole: the same DRAM bytes and work, a peak never higher (lower where the
    output's step was the fullest), more core traffic (the last product's input read again
    by every chunk after the first)."""
    problem = api.prepare(_save(chain_model(4, 24, 16, relu_after=(0, 2)), tmp_path),
                          hardware=hardware)
    groups = [("mm0",), ("relu0", "mm1"), ("mm2",), ("relu2", "mm3")]
    ended = hand_plan(problem, [Placement.of(p, Tile(1, th, 1), resident,
                                             end_chunks=1 if i == 0 else chunks)
                                for i, p in enumerate(groups)])
    whole = hand_plan(problem, [Placement.of(p, Tile(1, th, 1), resident) for p in groups])
    assert [g.placement.end_chunks for g in ended.groups] == [1, chunks, chunks, chunks]
    lower = []
    for a, b in zip(whole.groups[1:], ended.groups[1:], strict=True):
        pa, pb = a.predicted, b.predicted
        assert (pb.dram_read_bytes, pb.dram_write_bytes, pb.macs) \
            == (pa.dram_read_bytes, pa.dram_write_bytes, pa.macs)
        assert pb.sram_peak_bytes <= pa.sram_peak_bytes
        lower.append(pb.sram_peak_bytes < pa.sram_peak_bytes)
        assert pb.core_fmap_bytes > pa.core_fmap_bytes
    assert any(lower)
    assert_verifies(problem, ended)


@pytest.mark.parametrize(("resident", "chunks", "hardware", "th", "batch"), [
    (False, 4, "soma_buffer", 24, 1), (True, 3, "soma_buffer", 7, 1),
    (False, 16, "cluster4x4", 5, 2), (True, 2, "cluster4x4", 24, 2)])
def test_an_output_end_runs_its_bias_and_gelu_on_each_chunk(
        tmp_path: Path, resident: bool, chunks: int, hardware: str, th: int,
        batch: int) -> None:
    """An exporter's Linear is a MatMul and a bias Add, its GELU five per-element layers
    (Div, Erf, Add, Mul, Mul by scalars): the MLP's first half (LayerNorm, fc1, bias,
    GELU) writes its hidden map in chunks, each chunk through the bias (sliced alike) and
    the GELU (its scalars whole); outputs and every counter equal the prediction."""
    from test_hidden import mlp_model

    problem = api.prepare(_save(mlp_model(tokens=24, width=8, hidden=48, batch=batch),
                                tmp_path, "mlp"), hardware=hardware)
    g = problem.graph
    first = ("norm", "fc1", "fc1_bias", "gelu_div", "gelu_erf", "gelu_add", "gelu_mul",
             "gelu_half")
    ends = chunked_ends(g, group_io(g, first))
    assert ends is not None and ends.first is None and ends.last == "fc1"
    assert ends.tail == first[2:] and ends.sink == "a"
    plan = hand_plan(problem, [
        Placement.of(first, Tile(batch, th, 1), resident, end_chunks=chunks),
        Placement.of(("fc2", "fc2_bias", "residual"), Tile(batch, 24, 1), resident)])
    assert plan.groups[0].placement.end_chunks == chunks
    assert_verifies(problem, plan)


@pytest.mark.parametrize(("resident", "chunks", "hardware"), [
    (True, 4, "soma_buffer"), (False, 2, "soma_buffer"), (False, 8, "cluster4x4"),
    (True, 4, "cluster4x4")])
def test_hand_built_end_chunk_plans_verify(tmp_path: Path, resident: bool, chunks: int,
                                           hardware: str) -> None:
    problem = api.prepare(_save(chain_model(4, 24, 16, relu_after=(0, 2)), tmp_path),
                          hardware=hardware)
    pairs = [("mm0", "relu0", "mm1"), ("mm2", "relu2", "mm3")]
    for th in (24, 7):
        plan = hand_plan(problem, [Placement.of(p, Tile(1, th, 1), resident,
                                                end_chunks=chunks) for p in pairs])
        assert [g.placement.end_chunks for g in plan.groups] == [chunks, chunks]
        assert_verifies(problem, plan)


def test_end_chunks_lower_the_peak_and_add_only_core_traffic(tmp_path: Path) -> None:
    problem = api.prepare(_save(chain_model(2, 64, 64), tmp_path), hardware="soma_buffer")
    layers = ("mm0", "mm1")
    whole = hand_plan(problem, [Placement.of(layers, Tile(1, 64, 1), False)])
    ended = hand_plan(problem, [Placement.of(layers, Tile(1, 64, 1), False, end_chunks=8)])
    a, b = whole.groups[0].predicted, ended.groups[0].predicted
    assert b.sram_peak_bytes < a.sram_peak_bytes
    # the same bytes and work; whole, the one tile computes each layer as its weights
    # arrive (planner.cost.layered), while the ends' chunks run one after another
    assert a.overlap_cycles > 0 and b.overlap_cycles == 0
    assert (b.dram_read_bytes, b.dram_write_bytes, b.macs, b.cycles) \
        == (a.dram_read_bytes, a.dram_write_bytes, a.macs, a.cycles + a.overlap_cycles)
    assert b.core_fmap_bytes > a.core_fmap_bytes
    assert_verifies(problem, ended)


@settings(max_examples=10, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tokens=st.integers(3, 24), widths=st.lists(st.sampled_from([4, 8, 12, 16]),
                                                  min_size=3, max_size=4),
       chunks=st.sampled_from([2, 4]), resident=st.booleans(), th=st.integers(1, 24),
       hardware=st.sampled_from(["soma_buffer", "cluster4x4"]), relu=st.booleans())
def test_random_chains_verify_with_end_chunks(tmp_path: Path, tokens: int, widths: list[int],
                                              chunks: int, resident: bool, th: int,
                                              hardware: str, relu: bool) -> None:
    model = chain_model(tokens=tokens, width=widths[0], widths=widths[1:],
                        relu_after=(0,) if relu else ())
    problem = api.prepare(_save(model, tmp_path), hardware=hardware)
    layers = tuple(lay.name for lay in problem.graph.layers)
    ends = chunked_ends(problem.graph, group_io(problem.graph, layers))
    assert ends is not None
    if not ends.makes_chunks(chunks):
        return
    plan = hand_plan(problem, [Placement.of(layers, Tile(1, min(th, tokens), 1), resident,
                                            end_chunks=chunks)])
    report = api.verify_in_memory(problem, plan, seed=2)
    assert report.outputs_match, report.first_output_mismatch
    assert report.predicted_matches_emulated, report.first_counter_mismatch


def _ffm_problem(tmp_path: Path, sram: str, rules: str | None = None) -> api.Problem:
    return api.prepare(_save(chain_model(), tmp_path, "mm4"), rules=rules,
                       hardware="soma_buffer", overrides=[f"sram.bytes={sram}"])


@pytest.mark.parametrize(("sram", "most"), [
    ("512KiB", 1.25),
    pytest.param("256KiB", 2.00, marks=pytest.mark.slow)])
def test_the_four_matmul_chain_plans_at_ffm_bytes(tmp_path: Path, sram: str,
                                                  most: float) -> None:
    """Issue 45: 4 MatMuls ([1, 512, 768], 768 x 768 weights, int8, one shared buffer):
    AccelForge FFM moves 2.00x the floor at 256 KiB and 1.25x at 512 KiB."""
    problem = _ffm_problem(tmp_path, sram)
    plan = plan_problem(problem, "shortest-path")
    assert plan.totals.dram_bytes <= most * plan.compulsory_dram_bytes
    assert any(g.placement.end_chunks > 1 for g in plan.groups)
    assert_verifies(problem, plan)


def test_at_batch_four_fused_products_read_each_weight_once_per_batch(tmp_path: Path) -> None:
    """Issue 45's weights outer across several fused layers: four products at batch 4 (128
    tokens each), 512 KiB. Each group of two products runs the whole batch in one tile, its
    ends in chunks: every weight is read once for the batch (as at batch 1), the map
    between the two products retained for all four images; only the map between the groups
    crosses DRAM. Verified."""
    path = _save(chain_model(tokens=128), tmp_path, "mm4")
    problem = api.prepare(path, hardware="soma_buffer", overrides=["sram.bytes=512KiB"],
                          shapes={"x": (4, 128, 768)})
    plan = plan_problem(problem, "cpsat")
    single = plan_problem(api.prepare(path, hardware="soma_buffer",
                                      overrides=["sram.bytes=512KiB"],
                                      shapes={"x": (1, 128, 768)}), "cpsat")
    assert plan.totals.weight_read_bytes == single.totals.weight_read_bytes \
        == sum(problem.graph.elems(f"w{i}") for i in range(4))
    assert [g.layers for g in plan.groups] == [("mm0", "mm1"), ("mm2", "mm3")]
    assert all(g.tile.n == 4 and g.placement.end_chunks > 1 for g in plan.groups)
    between = problem.graph.layer("mm1").outputs[0]
    assert plan.totals.dram_bytes == plan.compulsory_dram_bytes \
        + 2 * problem.graph.elems(between)
    assert_verifies(problem, plan)


@pytest.mark.slow
def test_without_end_chunks_the_chain_reads_its_weights_twice(tmp_path: Path) -> None:
    """The search key turns the mode off: at 512 KiB the best plan is then the whole chain
    in two tiles of tokens, each reading every weight (1.75x)."""
    on = _ffm_problem(tmp_path, "512KiB")
    off = replace(on, ruleset=replace(on.ruleset, search=replace(on.ruleset.search,
                                                                 end_chunks=False)))
    plan = plan_problem(off, "shortest-path")
    assert all(g.placement.end_chunks == 1 for g in plan.groups)
    assert plan.totals.dram_bytes == 1.75 * plan.compulsory_dram_bytes


def test_plan_file_states_end_chunks_and_rejects_them_where_they_cannot_run(
        tmp_path: Path) -> None:
    path = _save(chain_model(3, 16, 8, relu_after=(1,)), tmp_path)
    problem = api.prepare(path)
    plan = hand_plan(problem, [Placement.of(("mm0", "mm1", "relu1", "mm2"), Tile(1, 8, 1),
                                            False, end_chunks=4)])
    plan_file = tmp_path / "plan.json"
    save_plan(plan, plan_file)
    doc = json.loads(plan_file.read_text())
    assert doc["groups"][0]["end_chunks"] == 4
    runner = CliRunner()
    ok = runner.invoke(app, ["verify", path, str(plan_file)])
    assert ok.exit_code == 0, ok.output
    for edit, needle in ((lambda g: g.update(end_chunks=5), "do not both make 5 chunks"),
                         (lambda g: g.update(double_buffered=True), "one input buffer"),
                         (lambda g: g.update(layers=g["layers"][2:3]),
                          "does not end with one output")):
        bad = json.loads(plan_file.read_text())
        edit(bad["groups"][0])
        if bad["groups"][0]["layers"] == ["relu1"]:  # a Relu alone: no layer to chunk
            whole = {"tile": {"n": 1, "h": 16, "w": 1}}
            bad["groups"] = [{"id": 0, "layers": ["mm0", "mm1"], **whole},
                             {**bad["groups"][0], "id": 1},
                             {"id": 2, "layers": ["mm2"], **whole}]
        assert_refused(path, bad, tmp_path, needle)


@pytest.mark.slow
@pytest.mark.parametrize("sram", ["256KiB", "512KiB"])
def test_floors_stay_below_end_chunk_costs(tmp_path: Path, sram: str) -> None:
    """The bounded path's proof holds with end chunks: no group's floor is above its best
    searched cost, the end-chunk choices among them (tests/test_bounds)."""
    from tests.test_bounds import _floors_hold, candidate_searches

    problem = _ffm_problem(tmp_path, sram)
    assert _floors_hold(problem, most=4) >= 10
    best = [s.best() for _, _, s in candidate_searches(problem, 4)]
    assert any(c is not None and c.end_chunks > 1 for c in best)


def test_a_gpt2_block_at_512kib_streams_its_projections_output_ends(tmp_path: Path) -> None:
    """bench/peers' GPT-2-small-like block (512 tokens, width 768, 8-bit) on a 512 KiB
    buffer: the qkv projection (its output three maps wide) and the out projection run
    with their inputs held whole and their outputs streamed in chunks, so each reads its
    weights once per tile. 27,525,120 B before; 23,597,568 with the qkv projection alone in
    tiles of 511 + 1 tokens, which the small-map rules (R13-R15) forced on it although rules
    bind fused groups only; 21,828,096 now, its one tile of every token reading each weight
    once (AccelForge's FFM: 13,372,416, with loop nests inside a head that fuseplan does not
    model); verified."""
    from models import causal_encoder

    path = tmp_path / "block.onnx"
    onnx.save(causal_encoder(tokens=512, width=768, heads=12, blocks=1, mask="none"),
              str(path))
    problem = api.prepare(str(path), hardware="soma_buffer", overrides=["sram.bytes=512KiB"])
    plan = plan_problem(problem, "cpsat")
    assert plan.totals.dram_bytes <= 21_828_096
    alone = [g for g in plan.groups if g.placement.end_chunks > 1]
    assert {"qkv13", "proj28"} <= {n for g in alone for n in g.layers}
    for g in alone:
        ends = chunked_ends(problem.graph, group_io(problem.graph, g.layers))
        assert ends is not None and ends.first is None
    qkv = next(g for g in plan.groups if g.layers == ("qkv13",))
    assert qkv.tile.h == 512
    assert qkv.predicted.weight_read_bytes == problem.graph.constants[
        problem.graph.layer("qkv13").weights[0]].size * problem.chip.dtype_bytes
    assert_verifies(problem, plan)


@pytest.mark.parametrize(("hw", "sram"), [("soma_buffer", "512KiB"), ("soma_buffer", "256KiB"),
                                          (None, "256KiB")])
def test_a_layer_alone_runs_in_any_mode_the_rules_would_refuse_a_fused_group(
        tmp_path: Path, hw: str | None, sram: str) -> None:
    """Rules bind fused groups only (rules/default.yaml, docs/rules.md): a layer alone gets
    the same best tile under the default rules as with no rule at all (the layer-by-layer
    reference's search), in every mode, end chunks and hidden chunks included. Before, the
    chunked searches applied the small-map rules to a lone projection."""
    from fuseplan.planner.cost.objective import Objective
    from fuseplan.rules.ruleset import RuleSet
    from fuseplan.solver.tiles import GroupSearch

    from models import causal_encoder

    path = tmp_path / "block.onnx"
    onnx.save(causal_encoder(tokens=512, width=768, heads=12, blocks=1, mask="none"),
              str(path))
    problem = api.prepare(str(path), hardware=hw, overrides=[f"sram.bytes={sram}"])
    g, chip = problem.graph, problem.chip
    bare = RuleSet((), search=problem.ruleset.search)
    chunked = 0
    for lay in g.layers:
        ruled = GroupSearch.of(g, (lay.name,), chip, problem.ruleset).best(Objective.TRAFFIC)
        free = GroupSearch.of(g, (lay.name,), chip, bare).best(Objective.TRAFFIC)
        assert ruled == free, lay.name
        chunked += ruled is not None and (ruled.end_chunks > 1 or ruled.hidden_chunks > 1)
    assert chunked  # the modes the rules once bound are among them



def test_a_constant_two_tail_layers_share_is_on_chip_once(tmp_path: Path) -> None:
    """Exporters and optimisers merge equal constants: `x @ w * s * s` reads one scalar s
    in both Muls (and `h + b` then `* b` one bias). The output end's chunks hold each such
    constant once, in the prediction as in the emulator, streamed on a single-memory
    chip."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 64])
    w = numpy_helper.from_array(np.linspace(-1, 1, 16 * 64, dtype=np.float32)
                                .reshape(16, 64), "w")
    s = numpy_helper.from_array(np.array(0.5, np.float32), "s")
    b = numpy_helper.from_array(np.linspace(0, 1, 64, dtype=np.float32), "b")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
             helper.make_node("Mul", ["h", "s"], ["m"], name="mul1"),
             helper.make_node("Mul", ["m", "s"], ["m2"], name="mul2"),
             helper.make_node("Add", ["m2", "b"], ["a"], name="bias"),
             helper.make_node("Mul", ["a", "b"], ["y"], name="scale")]
    model = helper.make_model(helper.make_graph(nodes, "shared", [x], [y], [w, s, b]),
                              opset_imports=[helper.make_opsetid("", 17)])
    problem = api.prepare(_save(model, tmp_path, "shared"), hardware="soma_buffer")
    layers = ("mm", "mul1", "mul2", "bias", "scale")
    io = group_io(problem.graph, layers)
    ends = chunked_ends(problem.graph, io)
    assert ends is not None and ends.tail == layers[1:]
    # 8-bit: a chunk of 32 channels loads 32 columns of w (16 each) and of b, and s once;
    # the first chunk's step holds the second loading behind it
    chunk = 32 * 16 + 32 + 1
    assert ends_stream(problem.graph, io, ends, 2, problem.chip).last == (2 * chunk, chunk)
    for chunks in (2, 4):
        plan = hand_plan(problem, [Placement.of(layers, Tile(1, 8, 1), False,
                                                end_chunks=chunks)])
        assert_verifies(problem, plan)


def test_the_rules_see_the_last_layers_inputs_through_the_tail(tmp_path: Path) -> None:
    """Every chunk but the last keeps the last layer's inputs whole while its tail runs
    (the next chunk reads them again): the rules' footprint of the widest chunk counts
    them at those steps too, so it is never below the exact peak."""
    from test_hidden import mlp_model

    from fuseplan.planner.cost.ends import ends_peak_bytes
    from fuseplan.planner.geometry.regions import group_chains
    from fuseplan.solver.ends import EndSearch

    problem = api.prepare(_save(mlp_model(tokens=24, width=8, hidden=48), tmp_path, "mlp"),
                          hardware="soma_buffer")
    g = problem.graph
    first = ("norm", "fc1", "fc1_bias", "gelu_div", "gelu_erf", "gelu_add", "gelu_mul",
             "gelu_half")
    io = group_io(g, first)
    search = EndSearch.of(g, io, group_chains(g, io), problem.chip)
    assert search is not None and search.ends.tail
    for resident in (True, False):
        for chunks in (2, 4):
            tile = Tile(1, 24, 1)
            facts = search.facts(tile, resident, chunks)
            exact = ends_peak_bytes(g, io, group_chains(g, io), search.ends, chunks, tile,
                                    problem.chip, resident)
            assert facts.sram_live_peak_bytes + (facts.weight_bytes if resident else 0) \
                >= exact, (resident, chunks)
