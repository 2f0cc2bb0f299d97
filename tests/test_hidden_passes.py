"""Hidden chunks inside pooling passes (planner.geometry.passes.pass_stretches): a
squeeze-excite block's pooling pass runs expand .. pool chunk by chunk, each chunk folding
its own channels into the pool; the last pass runs expand .. scale .. project chunk by
chunk, the scale reading its chunk's slice of the held vector. And a group ending in a
global pool folds its hidden chunks the same way."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from hand import assert_verifies, hand_plan
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from typer.testing import CliRunner

from fuseplan.planner.app import api
from fuseplan.planner.app.explain import recheck
from fuseplan.planner.core.errors import InputError, PlanningError
from fuseplan.planner.geometry.hidden import chunkable_maps, stretches
from fuseplan.planner.geometry.passes import pass_split, pass_stretches
from fuseplan.planner.geometry.regions import Tile, group_io
from fuseplan.planner.ir.graph import Graph
from fuseplan.planner.plan.data import Plan
from fuseplan.planner.plan.json_io import save_plan
from fuseplan.planner.plan.placement import Placement
from fuseplan.planner.ui.cli import app

import models


def _se_blocks(graph: Graph) -> list[tuple[str, ...]]:
    """Each inverted residual of models.se_net, expand conv to the residual add."""
    order = [lay.name for lay in graph.layers]
    out = []
    for i, name in enumerate(order):
        if name.startswith("expand"):
            j = next(j for j in range(i, len(order)) if graph.layer(order[j]).op == "Add")
            out.append(tuple(order[i:j + 1]))
    return out


def _plan(problem: api.Problem, groups: list[tuple[str, ...]], th: int, chunks: int,
          held: bool, double_buffered: bool = False, passes: int = 2,
          resident: bool = True, maps: bool = False) -> Plan:
    """Each of `groups` one group of tile height th in `passes` passes and `chunks` hidden
    chunks, the rest layer by layer."""
    g = problem.graph
    placements = []
    for layers in groups:
        n, _, _, w = g.dims(group_io(g, layers).anchor)
        placements.append(Placement.of(layers, Tile(n, th, w), resident, double_buffered,
                                       passes=passes, inputs_held=held, hidden_chunks=chunks,
                                       maps_held=maps))
    return hand_plan(problem, placements)


def _check(problem: api.Problem, plan: Plan) -> None:
    assert_verifies(problem, plan, seed=5)


def test_each_pass_of_a_squeeze_excite_block_has_its_stretch(tmp_path: Path) -> None:
    """The pooling pass: expand, ReLU, depthwise conv, ReLU, ending in the pool; the last
    pass: the same four and the scale (reading the held vector), ending in the projection.
    Run in one pass, the block's expansion starts none: the scale needs the pool of every
    channel (only the squeeze-excite MLP on the pooled vector is one)."""
    problem = api.prepare(str(models.save(models.se_net(h=16, w=16, expand=4), tmp_path,
                                          "se")))
    g = problem.graph
    block = _se_blocks(g)[0]
    assert all(s.widen != block[0] for s in stretches(g, group_io(g, block)))
    for held in (False, True):
        split = pass_split(g, block, held)
        assert split is not None
        (pool,), (last,) = pass_stretches(g, split)
        ops = [g.layer(n).op for n in pool.layers]
        assert ops == ["Conv", "Relu", "Conv", "Relu", "GlobalAveragePool"] and pool.pools
        assert pool.out == split.pools[0].pooled and pool.channels == 64
        ops = [g.layer(n).op for n in last.layers]
        assert ops == ["Conv", "Relu", "Conv", "Relu", "Mul", "Conv"] and not last.pools


@pytest.mark.parametrize(("th", "chunks", "held", "db", "scale_first", "maps"), [
    (4, 2, False, False, True, False), (3, 4, False, True, False, False),
    (16, 8, True, False, True, False), (5, 3, True, False, False, False),
    (32, 16, False, False, True, False), (4, 2, False, False, True, True),
    (5, 3, True, False, False, True), (3, 4, False, True, True, True)])
def test_hand_built_squeeze_excite_passes_in_hidden_chunks_verify(
        tmp_path: Path, th: int, chunks: int, held: bool, db: bool, scale_first: bool,
        maps: bool) -> None:
    """Every block in two passes with its stretches chunked (uneven chunks included, the
    scale's vector as either operand, inputs held or loaded per pass, the pooled map filled
    chunk by chunk into its held buffer or made again): outputs and every counter equal to
    the prediction, within the chip."""
    model = models.se_net(h=32, w=32, expand=4, scale_first=scale_first)
    problem = api.prepare(str(models.save(model, tmp_path, "se")))
    blocks = _se_blocks(problem.graph)
    plan = _plan(problem, blocks, th, chunks, held, db, maps=maps)
    assert sum(grp.placement.hidden_chunks == chunks and grp.placement.passes == 2
               for grp in plan.groups) == len(blocks) == 2
    _check(problem, plan)


def test_chunks_lower_the_peak_of_the_passes_and_add_core_traffic_only(tmp_path: Path) -> None:
    """Same tile, more chunks: the same DRAM bytes, MACs and vector ops; a lower peak; core
    traffic up by the widening input read again per chunk."""
    problem = api.prepare(str(models.save(models.se_net(h=32, w=32, expand=8), tmp_path,
                                          "se")))
    blocks = _se_blocks(problem.graph)[:1]
    costs = [next(g for g in _plan(problem, blocks, 8, k, True).groups
                  if g.layers == blocks[0]).predicted for k in (1, 2, 8, 32)]
    for c in costs[1:]:
        assert (c.dram_bytes, c.macs, c.vector_ops) == \
            (costs[0].dram_bytes, costs[0].macs, costs[0].vector_ops)
    peaks = [c.sram_peak_bytes for c in costs]
    assert peaks == sorted(peaks, reverse=True) and peaks[-1] < peaks[0] // 2
    cores = [c.core_fmap_bytes for c in costs]
    assert cores == sorted(cores) and cores[0] < cores[1]


def test_planners_chunk_squeeze_excite_passes_that_fit_no_other_way(tmp_path: Path) -> None:
    """Blocks with 128 hidden channels on a chip of 48 KiB SRAM and 12 KiB NRAM per core:
    without hidden chunks their passes fit no tile and each block spills its wide maps;
    with them each block is one group in two passes, its input held on chip: many times
    fewer bytes. CP-SAT does no worse than the shortest path, `explain` finds nothing
    broken, and the plan verifies."""
    path = str(models.save(models.se_net(h=32, w=32, channels=16, expand=8), tmp_path, "se"))
    # CP-SAT solves (rather than certifying the shortest path): pinned choices encoded
    rules = models.fusing_rules(tmp_path, {"exact_path_first: true": "exact_path_first: false"})
    off = models.fusing_rules(tmp_path, {"hidden_chunks: true": "hidden_chunks: false"})
    small = ["sram.bytes=48KiB", "nram.bytes=12KiB"]
    problem = api.prepare(path, rules=rules, overrides=small)
    cpsat = api.plan_problem(problem, "cpsat")
    shortest = api.plan_problem(problem, "shortest-path")
    without = api.solve(path, rules=off, overrides=small)
    chunked = [g for g in cpsat.groups if g.placement.hidden_chunks > 1]
    assert len(chunked) == 2 and all(g.placement.passes == 2 for g in chunked)
    assert not any(g.placement.hidden_chunks > 1 for g in without.groups)
    # the shortest path, over intervals of at most max_group_layers, cannot take the
    # 13-layer group of a block with its entry layer that CP-SAT weighs
    assert cpsat.totals.dram_bytes <= shortest.totals.dram_bytes
    assert "solved_by" not in cpsat.solver and cpsat.solver["status"] == "OPTIMAL"
    assert 5 * cpsat.totals.dram_bytes < without.totals.dram_bytes
    assert recheck(problem.graph, cpsat, problem.chip, problem.ruleset) == []
    _check(problem, cpsat)


def _head_model(tokens: int = 12, width: int = 8, hidden: int = 40, seed: int = 0,
                pool: str = "GlobalAveragePool") -> onnx.ModelProto:
    """A classifier head: 1x1 conv widening to `hidden` channels, HardSwish, a global
    pool, Flatten, Gemm."""
    rng = np.random.default_rng(seed)

    def const(name: str, arr: np.ndarray) -> onnx.TensorProto:
        return numpy_helper.from_array(arr.astype(np.float32), name)

    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["h1"], name="widen"),
             helper.make_node("HardSwish", ["h1"], ["h2"], name="act"),
             helper.make_node(pool, ["h2"], ["p"], name="pool"),
             helper.make_node("Flatten", ["p"], ["f"], name="flat", axis=1),
             helper.make_node("Gemm", ["f", "w2", "b2"], ["y"], name="fc", transB=1)]
    inits = [const("w1", rng.standard_normal((hidden, width, 1, 1))),
             const("b1", rng.standard_normal(hidden)),
             const("w2", rng.standard_normal((10, hidden))),
             const("b2", rng.standard_normal(10))]
    graph = helper.make_graph(
        nodes, "head", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                      [1, width, tokens, tokens])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@settings(max_examples=10, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(size=st.integers(4, 14), hidden=st.integers(6, 48), chunk_pick=st.integers(0, 5),
       th_pick=st.integers(1, 14), resident=st.booleans(), db=st.booleans(),
       hardware=st.sampled_from([None, "soma_buffer"]),
       pool=st.sampled_from(["GlobalAveragePool", "GlobalMaxPool"]))
def test_a_group_ending_in_a_global_pool_folds_its_hidden_chunks(
        tmp_path: Path, size: int, hidden: int, chunk_pick: int, th_pick: int,
        resident: bool, db: bool, hardware: str | None, pool: str) -> None:
    """widen .. pool as one group (it ends in the pool's accumulator) in hidden chunks:
    each chunk folds its own channels into the pool (average or max) over every tile;
    random sizes, chunk counts, tiles, residency, buffering and chips verify, outputs and
    every counter."""
    path = tmp_path / "head.onnx"
    onnx.save(_head_model(size, 8, hidden, pool=pool), str(path))
    problem = api.prepare(str(path), hardware=hardware)
    g = problem.graph
    layers = ("widen", "act", "pool")
    (s,) = stretches(g, group_io(g, layers))
    assert s.pools and s.narrow == "pool"
    counts = [k for k in range(2, hidden + 1) if len(range(0, hidden, -(-hidden // k))) == k]
    chunks = counts[chunk_pick % len(counts)]
    th = 1 + (th_pick - 1) % size
    plan = hand_plan(problem, [Placement.of(layers, Tile(1, th, size), resident, db,
                                            hidden_chunks=chunks)])
    _check(problem, plan)


def test_plan_file_states_hidden_chunks_in_passes_and_rejects_bad_counts(
        tmp_path: Path) -> None:
    path = str(models.save(models.se_net(h=16, w=16, expand=4), tmp_path, "se"))
    problem = api.prepare(path)
    blocks = _se_blocks(problem.graph)
    plan = _plan(problem, blocks, 4, 8, True)
    plan_file = tmp_path / "plan.json"
    save_plan(plan, plan_file)
    doc = json.loads(plan_file.read_text())
    stated = [g for g in doc["groups"] if g.get("hidden_chunks")]
    assert len(stated) == 2 and all(g["passes"] == 2 and g["hidden_chunks"] == 8
                                    for g in stated)
    runner = CliRunner()
    ok = runner.invoke(app, ["verify", path, str(plan_file)])
    assert ok.exit_code == 0, ok.output
    # 64 hidden channels make no 12 chunks of ceil(64 / 12)
    bad = json.loads(plan_file.read_text())
    next(g for g in bad["groups"] if g.get("hidden_chunks"))["hidden_chunks"] = 12
    bad_file = tmp_path / "bad.json"
    bad_file.write_text(json.dumps(bad))
    refused = runner.invoke(app, ["verify", path, str(bad_file)])
    assert refused.exit_code == 2, refused.output
    assert "do not make 12 chunks" in " ".join(refused.output.split()), refused.output
    with pytest.raises(InputError):
        api.verify(path, bad_file)
    # weights that stream cannot run in passes, chunked or not
    with pytest.raises(PlanningError):
        _plan(problem, blocks, 4, 8, False, resident=False)


@settings(max_examples=10, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(size=st.integers(6, 24), channels=st.sampled_from([4, 8, 12]),
       expand=st.integers(2, 6), chunk_pick=st.integers(0, 7), th_pick=st.integers(1, 24),
       held=st.booleans(), db=st.booleans(), scale_first=st.booleans(),
       batch=st.integers(1, 2), hardware=st.sampled_from([None, "soma_buffer"]))
def test_random_squeeze_excite_passes_in_hidden_chunks_verify(
        tmp_path: Path, size: int, channels: int, expand: int, chunk_pick: int,
        th_pick: int, held: bool, db: bool, scale_first: bool, batch: int,
        hardware: str | None) -> None:
    """Random block sizes, chunk counts, tiles, held inputs, buffering, batch and chip: the
    block in two passes with hidden chunks verifies, outputs and every counter."""
    model = models.se_net(n=batch, h=size, w=size, blocks=1, channels=channels,
                          expand=expand, scale_first=scale_first)
    problem = api.prepare(str(models.save(model, tmp_path, "se")), hardware=hardware)
    (block,) = _se_blocks(problem.graph)
    hidden = channels * expand
    counts = [k for k in range(2, hidden + 1) if len(range(0, hidden, -(-hidden // k))) == k]
    chunks = counts[chunk_pick % len(counts)]
    th = 1 + (th_pick - 1) % size
    _check(problem, _plan(problem, [block], th, chunks, held, db and not held))


def test_chunkable_maps_are_the_hidden_maps_of_every_block(tmp_path: Path) -> None:
    """Over the whole model, each squeeze-excite block's wide maps (expand, depthwise, the
    scaled map) may be held in chunks of its expand conv's stretch, up to 128 chunks of the
    128 hidden channels; the narrow maps between blocks may not."""
    problem = api.prepare(str(models.save(models.se_net(h=16, w=16, channels=16, expand=8),
                                          tmp_path, "se")))
    g = problem.graph
    found = chunkable_maps(g)
    for block in _se_blocks(g):
        wide = [t for n in block for t in g.layer(n).outputs
                if g.shapes[t][1] == 128 and g.shapes[t][2] > 1]
        assert len(wide) == 5  # expand, Relu, depthwise, Relu, the scale
        assert all(found[t] == (block[0], 128) for t in wide)
    narrow = {g.layer(b[-1]).outputs[0] for b in _se_blocks(g)}
    assert not narrow & set(found)


def test_long_whole_map_groups_run_in_passes_in_hidden_chunks(tmp_path: Path) -> None:
    """Three squeeze-excite blocks of 128 hidden channels on 16 x 16 maps, on a chip of
    64 KiB SRAM: no expanded map fits whole, yet the three blocks make one whole-map group
    of 37 layers (past max_group_layers 6; block groups off) in four passes (three pooling
    ones and the last), its stretches in hidden chunks, its input held: several times fewer
    bytes than without hidden chunks, CP-SAT optimal, `explain` clean, verified."""
    path = str(models.save(models.se_net(h=16, w=16, channels=16, expand=8, blocks=3),
                           tmp_path, "se"))
    edits = {"long_whole_map_groups: false": "long_whole_map_groups: true",
             "max_group_layers: 12": "max_group_layers: 6",
             "exact_path_first: true": "exact_path_first: false"}
    rules = models.fusing_rules(tmp_path, edits)
    off = models.fusing_rules(tmp_path, {**edits, "hidden_chunks: true": "hidden_chunks: false"})
    small = ["sram.bytes=64KiB", "nram.bytes=16KiB"]
    problem = api.prepare(path, rules=rules, overrides=small)
    plan = api.plan_problem(problem, "cpsat")
    without = api.solve(path, rules=off, overrides=small)
    (long,) = [g for g in plan.groups if len(g.layers) > 6]
    p = long.placement
    assert len(long.layers) == 37 and p.passes == 4 and p.hidden_chunks > 1 and p.inputs_held
    assert (p.tile.h, p.tile.w) == (16, 16)  # the whole map
    assert plan.solver["status"] == "OPTIMAL"
    assert 3 * plan.totals.dram_bytes < without.totals.dram_bytes
    assert recheck(problem.graph, plan, problem.chip, problem.ruleset) == []
    _check(problem, plan)
