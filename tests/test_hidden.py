"""Hidden chunks (planner.geometry.hidden): a widen / per-element / narrow stretch (an MLP,
a ConvNeXt block's pointwise pair) runs chunk by chunk over its hidden channels with the
narrowing layer's partial sums on chip. Plans built by hand and by the planners run on
the emulator with outputs equal to onnxruntime's and every counter (the SRAM peak and the
weights on chip included) equal to the prediction."""

from __future__ import annotations

import json
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
from fuseplan.planner.app.explain import recheck
from fuseplan.planner.geometry.hidden import stretches
from fuseplan.planner.geometry.regions import Tile, group_io
from fuseplan.planner.ir.graph import Graph
from fuseplan.planner.plan.data import Plan
from fuseplan.planner.plan.json_io import save_plan
from fuseplan.planner.plan.placement import Placement
from fuseplan.planner.ui.cli import app

import models


def mlp_model(tokens: int = 24, width: int = 8, hidden: int = 48, act: str = "gelu",
              batch: int = 1, seed: int = 0) -> onnx.ModelProto:
    """A transformer MLP on [B, L, C] tokens as exporters write it: LayerNorm, Linear (MatMul
    and bias Add), GELU (Erf form) or Relu, Linear, residual add."""
    rng = np.random.default_rng(seed)

    def const(name: str, arr: np.ndarray) -> onnx.TensorProto:
        return numpy_helper.from_array(arr.astype(np.float32), name)

    nodes = [
        helper.make_node("LayerNormalization", ["x", "g", "b"], ["n"], name="norm", axis=-1),
        helper.make_node("MatMul", ["n", "w1"], ["h0"], name="fc1"),
        helper.make_node("Add", ["h0", "b1"], ["h"], name="fc1_bias"),
    ]
    if act == "gelu":
        nodes += [
            helper.make_node("Div", ["h", "root2"], ["d"], name="gelu_div"),
            helper.make_node("Erf", ["d"], ["e"], name="gelu_erf"),
            helper.make_node("Add", ["e", "one"], ["e1"], name="gelu_add"),
            helper.make_node("Mul", ["h", "e1"], ["m"], name="gelu_mul"),
            helper.make_node("Mul", ["m", "half"], ["a"], name="gelu_half"),
        ]
    else:
        nodes.append(helper.make_node("Relu", ["h"], ["a"], name="act"))
    nodes += [
        helper.make_node("MatMul", ["a", "w2"], ["o0"], name="fc2"),
        helper.make_node("Add", ["o0", "b2"], ["o"], name="fc2_bias"),
        helper.make_node("Add", ["o", "x"], ["y"], name="residual"),
    ]
    constants = [const("g", rng.uniform(0.5, 1.5, width)), const("b", rng.normal(0, 0.1, width)),
                 const("w1", rng.normal(0, width ** -0.5, (width, hidden))),
                 const("b1", rng.normal(0, 0.1, hidden)),
                 const("w2", rng.normal(0, hidden ** -0.5, (hidden, width))),
                 const("b2", rng.normal(0, 0.1, width)),
                 const("root2", np.array(np.sqrt(2.0))), const("one", np.array(1.0)),
                 const("half", np.array(0.5))]
    if act != "gelu":
        constants = constants[:6]
    shape = [batch, tokens, width]
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)], constants)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _save(model: onnx.ModelProto, tmp_path: Path, name: str = "mlp") -> str:
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, str(path))
    return str(path)


def _hand_plan(problem: api.Problem, groups: list[tuple[str, ...]], th: int, resident: bool,
               chunks: int, double_buffered: bool = False) -> Plan:
    """Each of `groups` one group of tile height th in `chunks` hidden chunks, the rest alone."""
    g = problem.graph
    placements: list[Placement] = []
    for layers in groups:
        n, _, _, w = g.dims(group_io(g, layers).anchor)
        placements.append(Placement.of(layers, Tile(n, th, w), resident, double_buffered,
                                       hidden_chunks=chunks))
    return hand_plan(problem, placements)


def _all_layers(graph: Graph) -> tuple[str, ...]:
    return tuple(lay.name for lay in graph.layers)


def _convnext_blocks(graph: Graph) -> list[tuple[str, ...]]:
    """Each ConvNeXt block of models.convnext_net, channels-last Transpose to layer scale."""
    order = _all_layers(graph)
    out = []
    for i, name in enumerate(order):
        if graph.layer(name).op == "Transpose" and name.startswith("to_last"):
            j = next(j for j in range(i, len(order)) if order[j].startswith("layer_scale"))
            out.append(order[i:j + 1])
    return out


def test_stretches_of_an_mlp_and_of_a_convnext_block(tmp_path: Path) -> None:
    g = api.prepare(_save(mlp_model(), tmp_path)).graph
    (s,) = stretches(g, group_io(g, _all_layers(g)))
    assert (s.widen, s.narrow, s.channels) == ("fc1", "fc2", 48)
    assert s.mids == ("fc1_bias", "gelu_div", "gelu_erf", "gelu_add", "gelu_mul", "gelu_half")
    assert s.out == "o0" and len(s.hidden) == 7
    cnx = api.prepare(str(models.save(models.convnext_net(), tmp_path, "cnx"))).graph
    blocks = _convnext_blocks(cnx)
    assert len(blocks) == 2
    for block in blocks:
        (b,) = stretches(cnx, group_io(cnx, block))
        assert [cnx.layer(n).op for n in b.layers] == ["MatMul", "Add", "Div", "Erf", "Add",
                                                       "Mul", "Mul", "MatMul"]
        assert b.channels == 64 and b.axis == 3  # channels last: the hidden features


def test_no_stretch_where_a_hidden_map_is_needed_whole_or_leaves(tmp_path: Path) -> None:
    g = api.prepare(_save(mlp_model(), tmp_path)).graph
    order = _all_layers(g)
    # the group ends inside the stretch: the hidden map leaves it
    assert stretches(g, group_io(g, order[:order.index("fc2")])) == ()
    # a layer mixing the hidden channels (Softmax over them) breaks it
    model = mlp_model(act="relu")
    act = next(n for n in model.graph.node if n.name == "act")
    act.op_type = "Softmax"
    act.attribute.extend([helper.make_attribute("axis", -1)])
    soft = api.prepare(_save(model, tmp_path, "soft")).graph
    assert stretches(soft, group_io(soft, _all_layers(soft))) == ()


@pytest.mark.parametrize(("th", "resident", "chunks", "db", "hardware"), [
    (24, True, 2, False, None),
    (24, False, 4, False, None),
    (7, False, 3, True, None),
    (5, True, 6, False, None),
    (24, False, 2, False, "soma_buffer"),
    (9, True, 4, True, "soma_buffer"),
])
def test_hand_built_mlp_plans_verify(tmp_path: Path, th: int, resident: bool, chunks: int,
                                     db: bool, hardware: str | None) -> None:
    """Any tile height, chunk count (uneven last chunk included), weight residency and
    buffering, on a chip with WRAM and on a single-memory chip: outputs and every counter
    equal to the prediction."""
    problem = api.prepare(_save(mlp_model(), tmp_path), hardware=hardware)
    plan = _hand_plan(problem, [_all_layers(problem.graph)], th, resident, chunks, db)
    (group,) = plan.groups
    assert group.placement.hidden_chunks == chunks
    assert_verifies(problem, plan)


def test_hand_built_convnext_plans_verify_and_chunks_lower_the_peak(tmp_path: Path) -> None:
    problem = api.prepare(str(models.save(models.convnext_net(h=32, w=32), tmp_path, "cnx")))
    blocks = _convnext_blocks(problem.graph)
    peaks = []
    for chunks in (1, 2, 4):
        plan = _hand_plan(problem, blocks, 4, True, chunks)
        assert_verifies(problem, plan)
        peaks.append(max(g.predicted.sram_peak_bytes for g in plan.groups
                         if len(g.layers) > 1))
    assert peaks[0] > peaks[1] > peaks[2]


def _mbconv_blocks(graph: Graph) -> list[tuple[str, ...]]:
    """Each inverted residual of models.mbconv_net, expand conv to projection (and add)."""
    order = _all_layers(graph)
    out = []
    for i, name in enumerate(order):
        if name.startswith("expand"):
            j = next(j for j in range(i, len(order)) if order[j].startswith("project"))
            end = j + 1 if j + 1 < len(order) and graph.layer(order[j + 1]).op == "Add" else j
            out.append(order[i:end + 1])
    return out


@pytest.mark.parametrize(("th", "resident", "chunks", "db"), [
    (4, True, 2, False), (7, False, 3, True), (16, True, 6, False), (32, False, 4, False)])
def test_inverted_residuals_run_in_hidden_chunks_through_the_depthwise_conv(
        tmp_path: Path, th: int, resident: bool, chunks: int, db: bool) -> None:
    """Expand, HardSwish, a 3x3 depthwise conv (stride 1 and 2: halos, rows that change),
    Relu and the projection are one stretch; hand-built plans of every block in hidden
    chunks verify, outputs and every counter."""
    path = models.save(models.mbconv_net(h=32, w=32), tmp_path, "mb")
    problem = api.prepare(str(path))
    g = problem.graph
    blocks = _mbconv_blocks(g)
    assert len(blocks) == 3
    for block in blocks:
        (s,) = stretches(g, group_io(g, block))
        assert [g.layer(n).op for n in s.layers][0] == "Conv" and s.channels == 48
        assert "Conv" in [g.layer(n).op for n in s.mids]  # the depthwise conv
    plan = _hand_plan(problem, blocks, th, resident, chunks, db)
    assert sum(grp.placement.hidden_chunks == chunks for grp in plan.groups) == 3
    assert_verifies(problem, plan)


@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tokens=st.integers(3, 20), width=st.sampled_from([4, 8]),
       hidden=st.integers(6, 40), chunk_pick=st.integers(0, 3), th_pick=st.integers(1, 20),
       resident=st.booleans(), db=st.booleans(), gelu=st.booleans(), batch=st.integers(1, 2),
       hardware=st.sampled_from([None, "soma_buffer"]))
def test_random_mlps_verify_in_hidden_chunks(tmp_path: Path, tokens: int, width: int,
                                             hidden: int, chunk_pick: int, th_pick: int,
                                             resident: bool, db: bool, gelu: bool,
                                             batch: int, hardware: str | None) -> None:
    """Random MLP sizes, chunk counts, tiles, residency, buffering, batch and chip: outputs
    and every counter equal to the prediction."""
    model = mlp_model(tokens, width, hidden, "gelu" if gelu else "relu", batch)
    problem = api.prepare(_save(model, tmp_path), hardware=hardware)
    counts = [k for k in range(2, hidden + 1) if len(range(0, hidden, -(-hidden // k))) == k]
    chunks = counts[chunk_pick % len(counts)]
    th = 1 + (th_pick - 1) % tokens
    plan = _hand_plan(problem, [_all_layers(problem.graph)], th, resident, chunks, db)
    assert_verifies(problem, plan)


def test_planners_chunk_an_mlp_whose_weights_and_hidden_map_do_not_fit(tmp_path: Path) -> None:
    """The MLP's 6 KiB of weights do not fit 4 KiB of WRAM, nor its [1, 64, 96] hidden map
    (12 KiB, and its GELU temporaries) 12 KiB of SRAM beside the tokens: without hidden
    chunks it runs in token tiles that stream every weight again per tile (one cluster: a
    round is one tile); with them it is one tile that reads each weight once: the plan is
    at the floor, less than half the bytes. CP-SAT and the shortest path agree, and the
    plan verifies."""
    path = _save(mlp_model(tokens=64, width=16, hidden=96), tmp_path)
    rules = models.fusing_rules(tmp_path)
    off = models.fusing_rules(tmp_path, {"hidden_chunks: true": "hidden_chunks: false"})
    small = ["sram.bytes=12KiB", "nram.bytes=4KiB", "wram.bytes=1KiB", "clusters=1"]
    problem = api.prepare(path, rules=rules, overrides=small)
    cpsat = api.plan_problem(problem, "cpsat")
    shortest = api.plan_problem(problem, "shortest-path")
    without = api.solve(path, rules=off, overrides=small)
    (group,) = cpsat.groups
    assert group.placement.hidden_chunks > 1 and group.tile.h == 64
    assert not group.weights_resident
    assert not any(g.placement.hidden_chunks > 1 for g in without.groups)
    assert cpsat.totals.dram_bytes == shortest.totals.dram_bytes == cpsat.compulsory_dram_bytes
    assert 2 * cpsat.totals.dram_bytes < without.totals.dram_bytes
    assert recheck(problem.graph, cpsat, problem.chip, problem.ruleset) == []
    assert_verifies(problem, cpsat)


def test_plan_file_states_hidden_chunks_and_rejects_them_where_they_cannot_run(
        tmp_path: Path) -> None:
    path = _save(mlp_model(), tmp_path)
    problem = api.prepare(path)
    plan = _hand_plan(problem, [_all_layers(problem.graph)], 8, False, 4)
    plan_file = tmp_path / "plan.json"
    save_plan(plan, plan_file)
    doc = json.loads(plan_file.read_text())
    assert doc["groups"][0]["hidden_chunks"] == 4
    assert "weight_chunks" not in doc["groups"][0]  # the stretch's weights are cut by chunks
    runner = CliRunner()
    ok = runner.invoke(app, ["verify", path, str(plan_file)])
    assert ok.exit_code == 0, ok.output
    out = tmp_path / "annotated.onnx"
    exported = runner.invoke(app, ["export", path, str(plan_file), "-o", str(out)])
    assert exported.exit_code == 0, exported.output
    tags = [{p.key: p.value for p in node.metadata_props}.get("fuseplan.hidden_chunks")
            for node in onnx.load(str(out)).graph.node]
    assert tags.count("4") == len(plan.groups[0].layers)
    # 48 hidden channels make no 11 chunks of ceil(48 / 11); halo reuse and a group without
    # its narrowing layer cannot run in chunks
    for edit, needle in ((lambda g: g.update(hidden_chunks=11), "do not make 11 chunks"),
                         (lambda g: g.update(halo="reuse"), "halos recomputed"),
                         (lambda g: g.update(layers=g["layers"][:3]), "no stretch")):
        bad = json.loads(plan_file.read_text())
        edit(bad["groups"][0])
        if len(bad["groups"][0]["layers"]) == 3:  # cover the rest layer by layer
            rest = [n for n in doc["groups"][0]["layers"][3:]]
            bad["groups"] += [{"id": 1 + k, "layers": [n], "tile": {"n": 1, "h": 24, "w": 1}}
                              for k, n in enumerate(rest)]
        assert_refused(path, bad, tmp_path, needle)


def _skip_made_inside(tokens: int = 24, width: int = 8, hidden: int = 48) -> onnx.ModelProto:
    """mlp_model with its residual made inside the group: a Relu on the input first, whose
    output is the LayerNorm's input and the residual Add's skip."""
    model = mlp_model(tokens, width, hidden)
    for node in model.graph.node:
        node.input[:] = ["r" if t == "x" else t for t in node.input]
    model.graph.node.insert(0, helper.make_node("Relu", ["x"], ["r"], name="pre"))
    return model


@pytest.mark.parametrize("chunks", [2, 4, 8])
def test_a_residual_add_takes_its_skip_into_the_accumulator(tmp_path: Path, monkeypatch,
                                                             chunks: int) -> None:
    """The accumulator of fc2 (past its bias Add) starts from the residual's skip, made
    inside the group: from the first chunk's fc2 on the skip is no buffer of its own. With
    3 chunks or more a middle chunk held the skip, the LayerNorm's output (read by every
    chunk) and the partial sums at once; now the skip's room is the accumulator's. Every
    counter, the peak included, as the emulator measures, outputs as onnxruntime's; the
    peak is the skip's bytes less than with the fold turned off (as before it), which
    verifies too."""
    from fuseplan.emulator import hidden as emulator_hidden
    from fuseplan.emulator import tiles as emulator_tiles
    from fuseplan.planner.cost import hidden as cost_hidden
    from fuseplan.planner.geometry.hidden import folded_skip

    tokens, width = 24, 8
    problem = api.prepare(_save(_skip_made_inside(tokens, width), tmp_path))
    g = problem.graph
    io = group_io(g, _all_layers(g))
    (s,) = stretches(g, io)
    fold = folded_skip(g, io, s)
    assert fold is not None and (fold.skip, fold.add) == ("r", "residual")
    plan = _hand_plan(problem, [_all_layers(g)], tokens, True, chunks)
    assert_verifies(problem, plan)
    for module in (cost_hidden, emulator_hidden, emulator_tiles):
        monkeypatch.setattr(module, "folded_skip", lambda *_: None)
    # a graph of its own: a graph keeps what it has priced (planner.app.assemble)
    problem = api.prepare(_save(_skip_made_inside(tokens, width), tmp_path, "again"))
    before = _hand_plan(problem, [_all_layers(problem.graph)], tokens, True, chunks)
    assert_verifies(problem, before)
    skip_bytes = tokens * width * problem.chip.dtype_bytes
    (now,), (then,) = plan.groups, before.groups
    assert then.predicted.sram_peak_bytes - now.predicted.sram_peak_bytes \
        == (skip_bytes if chunks > 2 else 0)
    assert now.predicted.dram_bytes == then.predicted.dram_bytes


def test_no_fold_where_the_skip_is_loaded_or_read_again(tmp_path: Path) -> None:
    """The skip is a group input (mlp_model's x: the fold needs a map the group makes), or
    the group ends before the Add: no fold."""
    from fuseplan.planner.geometry.hidden import folded_skip

    g = api.prepare(_save(mlp_model(), tmp_path)).graph
    io = group_io(g, _all_layers(g))
    assert folded_skip(g, io, stretches(g, io)[0]) is None
    g2 = api.prepare(_save(_skip_made_inside(), tmp_path, "inside")).graph
    short = group_io(g2, _all_layers(g2)[:-1])
    assert folded_skip(g2, short, stretches(g2, short)[0]) is None


def _halo_skip_net(c: int = 8, side: int = 16) -> onnx.ModelProto:
    """A 3x3 conv whose output r is read by a depthwise 3x3 (with a halo of rows) before an
    expand / project pair, and is the skip of the residual Add after it."""
    b = models._Builder(np.random.default_rng(4))
    r = b.conv("input", 3, c, 3, prefix="stem")
    d = b.conv(r, c, c, 3, group=c, prefix="dw")
    h = b.one("Relu", [b.conv(d, c, 4 * c, 1, prefix="expand")])
    y = b.one("Add", [b.conv(h, 4 * c, c, 1, prefix="project"), r], "residual")
    return b.model((1, 3, side, side), y, 17)


@pytest.mark.parametrize(("th", "chunks"), [(4, 2), (4, 4), (16, 8), (5, 4)])
def test_a_skip_held_with_a_halo_folds_into_the_accumulator(tmp_path: Path, th: int,
                                                            chunks: int) -> None:
    """The skip is held with the depthwise conv's halo rows, larger than the tile's rows of
    the accumulator: the accumulator starts from the skip's rows of the tile. Row tiles and
    whole maps: outputs as onnxruntime's, every counter as predicted."""
    from fuseplan.planner.geometry.hidden import folded_skip

    problem = api.prepare(_save(_halo_skip_net(), tmp_path, "halo_skip"))
    g = problem.graph
    io = group_io(g, _all_layers(g))
    (s,) = stretches(g, io)
    fold = folded_skip(g, io, s)
    assert fold is not None and fold.add.startswith("residual") and fold.skip.startswith("stem")
    assert_verifies(problem, _hand_plan(problem, [_all_layers(g)], th, True, chunks))


def _two_mlps(tokens: int, width: int, hidden: tuple[int, int], batch: int = 1,
              seed: int = 0) -> onnx.ModelProto:
    """A Relu on the input, then two pre-norm MLP blocks of different hidden widths, each
    with its residual Add: both skips are made inside a group holding them all."""
    rng = np.random.default_rng(seed)
    inits: list[onnx.TensorProto] = []

    def const(name: str, arr: np.ndarray) -> str:
        inits.append(numpy_helper.from_array(np.asarray(arr, np.float32), name))
        return name

    nodes = [helper.make_node("Relu", ["x"], ["r0"], name="pre")]
    skip = "r0"
    for k, hid in enumerate(hidden):
        n, h0, h, a, o0, o, y = (f"{t}{k}" for t in ("n", "h0", "h", "a", "o0", "o", "y"))
        nodes += [
            helper.make_node("LayerNormalization",
                             [skip, const(f"g{k}", rng.uniform(0.5, 1.5, width)),
                              const(f"b{k}", rng.normal(0, 0.1, width))], [n],
                             name=f"norm{k}", axis=-1),
            helper.make_node("MatMul", [n, const(f"w1_{k}", rng.normal(
                0, width ** -0.5, (width, hid)))], [h0], name=f"fc1_{k}"),
            helper.make_node("Add", [h0, const(f"b1_{k}", rng.normal(0, 0.1, hid))], [h],
                             name=f"fc1_bias{k}"),
            helper.make_node("Relu", [h], [a], name=f"act{k}"),
            helper.make_node("MatMul", [a, const(f"w2_{k}", rng.normal(
                0, hid ** -0.5, (hid, width)))], [o0], name=f"fc2_{k}"),
            helper.make_node("Add", [o0, const(f"b2_{k}", rng.normal(0, 0.1, width))], [o],
                             name=f"fc2_bias{k}"),
            helper.make_node("Add", [o, skip], [y], name=f"residual{k}")]
        skip = y
    shape = [batch, tokens, width]
    graph = helper.make_graph(
        nodes, "two_mlps", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info(skip, TensorProto.FLOAT, shape)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tokens=st.integers(3, 16), width=st.sampled_from([4, 8]),
       hidden=st.tuples(st.integers(3, 40), st.integers(3, 40)), pick=st.integers(0, 30),
       th_pick=st.integers(1, 16), resident=st.booleans(), db=st.booleans(),
       batch=st.integers(1, 2), hardware=st.sampled_from([None, "soma_buffer"]))
def test_random_stretches_of_one_group_in_their_own_chunks_verify(
        tmp_path: Path, tokens: int, width: int, hidden: tuple[int, int], pick: int,
        th_pick: int, resident: bool, db: bool, batch: int, hardware: str | None) -> None:
    """Two MLPs of random hidden widths in one group, at a count one of them makes and the
    other may not (it runs in the most it makes below), both skips taken into their
    accumulators; random tiles, residency, buffering, batch and chip: outputs and every
    counter equal to the prediction."""
    from fuseplan.planner.geometry.hidden import chunk_options, folded_skip, stretch_chunks

    problem = api.prepare(_save(_two_mlps(tokens, width, hidden, batch), tmp_path),
                          hardware=hardware)
    g = problem.graph
    io = group_io(g, _all_layers(g))
    found = stretches(g, io)
    assert [s.channels for s in found] == list(hidden)
    assert all(folded_skip(g, io, s) is not None for s in found)
    options = chunk_options(found)
    chunks = options[pick % len(options)]
    assert all(1 <= stretch_chunks(s, chunks) <= chunks for s in found)
    assert any(stretch_chunks(s, chunks) == chunks for s in found)
    th = 1 + (th_pick - 1) % tokens
    assert_verifies(problem, _hand_plan(problem, [_all_layers(g)], th, resident, chunks, db))


def swiglu_mlp(tokens: int, width: int, hidden: int, seed: int = 0) -> onnx.ModelProto:
    """A Llama / Qwen2 MLP half on [1, L, C] as exported: RMSNorm (Pow, ReduceMean, Add,
    Sqrt, Div, Mul by its weight), gate and up projections, SiLU (Sigmoid, Mul) of the
    gate times up, the down projection, residual add."""
    rng = np.random.default_rng(seed)
    inits: list[onnx.TensorProto] = []

    def const(name: str, arr: np.ndarray) -> str:
        inits.append(numpy_helper.from_array(np.asarray(arr, np.float32), name))
        return name

    axes = numpy_helper.from_array(np.array([-1], np.int64), "axes")
    nodes = [
        helper.make_node("Pow", ["x", const("two", np.array(2.0))], ["sq"], name="pow"),
        helper.make_node("ReduceMean", ["sq", "axes"], ["ms"], name="mean", keepdims=1),
        helper.make_node("Add", ["ms", const("eps", np.array(1e-6))], ["mse"], name="eps_add"),
        helper.make_node("Sqrt", ["mse"], ["rms"], name="sqrt"),
        helper.make_node("Div", ["x", "rms"], ["xn"], name="div"),
        helper.make_node("Mul", ["xn", const("g", rng.uniform(0.5, 1.5, width))], ["n"],
                         name="norm_scale"),
        helper.make_node("MatMul", ["n", const("wg", rng.normal(0, width ** -0.5,
                                                                (width, hidden)))], ["gt"],
                         name="gate_proj"),
        helper.make_node("Sigmoid", ["gt"], ["sg"], name="sigmoid"),
        helper.make_node("Mul", ["gt", "sg"], ["silu"], name="silu"),
        helper.make_node("MatMul", ["n", const("wu", rng.normal(0, width ** -0.5,
                                                                (width, hidden)))], ["up"],
                         name="up_proj"),
        helper.make_node("Mul", ["silu", "up"], ["a"], name="gated"),
        helper.make_node("MatMul", ["a", const("wd", rng.normal(0, hidden ** -0.5,
                                                                (hidden, width)))], ["o"],
                         name="down_proj"),
        helper.make_node("Add", ["x", "o"], ["y"], name="residual")]
    inits.append(axes)
    shape = [1, tokens, width]
    graph = helper.make_graph(
        nodes, "swiglu", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


@pytest.mark.parametrize("form", ["gelu", "swiglu"])
def test_a_qwen2_sized_mlp_reads_every_weight_once(tmp_path: Path, form: str) -> None:
    """Issue 45's check: a transformer MLP of width 896 and hidden 4,864 (Qwen2-0.5B's) at
    512 tokens on the default chip, as GPT-2 (GELU) and as Llama / Qwen2 (SwiGLU) write it:
    its 17.4 or 26.2 MB of fp16 weights do not fit 2 MiB, nor its hidden maps; planned by
    CP-SAT, every weight is read exactly once and the plan moves its floor, verified."""
    model = mlp_model(512, 896, 4864) if form == "gelu" else swiglu_mlp(512, 896, 4864)
    path = _save(model, tmp_path, form)
    problem = api.prepare(path)
    weights = sum(int(problem.graph.constants[w].size) for lay in problem.graph.layers
                  for w in set(lay.weights)) * problem.chip.dtype_bytes
    plan = api.plan_problem(problem, "cpsat")
    assert plan.totals.weight_read_bytes == weights
    assert plan.totals.dram_bytes == plan.compulsory_dram_bytes
    out = tmp_path / "plan.json"
    save_plan(plan, out)
    report = api.verify(path, out)
    assert report.outputs_match, report.first_output_mismatch
    assert report.predicted_matches_emulated, report.first_counter_mismatch


def test_a_stretch_runs_in_the_most_chunks_it_makes_up_to_the_count() -> None:
    """stretch_chunks' count, found by stepping down, is the largest c <= k whose equal
    chunks of ceil(C / c) number exactly c, as trying every count finds it."""
    from fuseplan.planner.geometry.hidden import channel_chunks
    from fuseplan.planner.ir.chunks import chunk_ranges

    for channels in range(1, 90):
        for k in range(1, 120):
            tried = max(c for c in range(1, min(k, channels) + 1)
                        if len(chunk_ranges(channels, c)) == c)
            assert channel_chunks(channels, k) == tried, (channels, k)
