"""Two passes around a squeeze-excite pool (issue 16, planner.geometry.passes): pass 1 pools
in tiles and stores nothing, the tail runs once on chip, pass 2 recomputes the prefix and
scales in tiles. Plans built by hand and by every planner run on the emulator with outputs
equal to onnxruntime's and every counter equal to the prediction."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from hand import assert_verifies, hand_plan
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from fuseplan.planner.app import api
from fuseplan.planner.app.assemble import assemble, layer_placements
from fuseplan.planner.app.explain import recheck
from fuseplan.planner.core.errors import PlanningError
from fuseplan.planner.cost.objective import Objective
from fuseplan.planner.geometry.passes import pass_split
from fuseplan.planner.geometry.regions import Tile, tiled_like_anchor
from fuseplan.planner.ir.graph import Graph
from fuseplan.planner.plan.data import Plan
from fuseplan.planner.plan.json_io import save_plan
from fuseplan.planner.plan.placement import Placement
from fuseplan.planner.ui.cli import app

import models


def _blocks(graph: Graph) -> list[list[str]]:
    """Each inverted residual of models.se_net, expand conv to residual add."""
    order = [lay.name for lay in graph.layers]
    out = []
    for i, name in enumerate(order):
        if name.startswith("expand"):
            end = next(j for j in range(i, len(order)) if graph.layer(order[j]).op == "Add")
            out.append(order[i:end + 1])
    return out


def _hand_plan(problem: api.Problem, th: int, double_buffered: bool, held: bool = False,
               maps: bool = False) -> Plan:
    """Every block of the net one two-pass group of tile height th (``held``: its input
    loaded once and held; ``maps``: its pooled map held for the last pass), the rest
    alone."""
    g = problem.graph
    placements = []
    for layers in _blocks(g):
        n, _, _, w = g.dims(g.layer(layers[-1]).outputs[0])
        placements.append(Placement.of(layers, Tile(n, th, w), True, double_buffered,
                                       passes=2, inputs_held=held, maps_held=maps))
    return hand_plan(problem, placements)


def test_split_names_prefix_tail_rest_and_held_vectors(tmp_path: Path) -> None:
    path = models.save(models.se_net(h=32, w=32, blocks=1), tmp_path, "se")
    g = api.prepare(str(path)).graph
    block = _blocks(g)[0]
    split = pass_split(g, block)
    assert split is not None and split.count == 2
    (pool,) = split.pools
    assert [g.layer(n).op for n in pool.io.layers] == ["Conv", "Relu", "Conv", "Relu",
                                                        "GlobalAveragePool"]
    assert [g.layer(n).op for n in pool.tail] == ["Conv", "Relu", "Conv", "HardSigmoid"]
    assert [g.layer(n).op for n in split.last.layers] == ["Conv", "Relu", "Conv", "Relu",
                                                           "Mul", "Conv", "Add"]
    assert pool.kept == g.layer(pool.tail[-1]).outputs
    assert pool.io.outputs == pool.io.accumulated == (pool.pooled,)
    assert pool.io.anchor == g.layer(pool.reduction).fmap_inputs[0]
    assert pool.kept[0] not in split.last.inputs  # held on chip, never loaded
    # a group ending at the pool, or without the scale, has no second pass
    pool_at = block.index(pool.reduction)
    assert pass_split(g, block[:pool_at + 1]) is None
    assert pass_split(g, block[:pool_at + 5]) is None  # ends with the tail: no last pass


@pytest.mark.parametrize(("size", "th", "db", "n", "hardware", "scale_first", "held", "maps"), [
    (32, 5, False, 1, None, True, False, False),
    (32, 7, True, 1, None, False, False, False),
    (48, 16, False, 2, None, True, False, False),
    (32, 3, True, 1, "soma_buffer", True, False, False),
    (32, 32, False, 1, None, True, False, False),  # one tile a pass
    (32, 5, False, 1, None, True, True, False),
    (48, 9, False, 2, "soma_buffer", False, True, False),
    (32, 5, False, 1, None, True, False, True),
    (32, 7, True, 1, "soma_buffer", False, False, True),
    (48, 9, False, 2, None, False, True, True),
])
def test_hand_built_two_pass_plans_verify(tmp_path: Path, size: int, th: int, db: bool, n: int,
                                          hardware: str | None, scale_first: bool,
                                          held: bool, maps: bool) -> None:
    """Any tile height, with and without a second input buffer, a batch of two, a chip with
    one memory for weights and maps, inputs re-read each pass or held, pooled maps computed
    again or held: outputs and every counter equal to the prediction."""
    path = models.save(models.se_net(h=size, w=size, n=n, scale_first=scale_first),
                       tmp_path, "se")
    problem = api.prepare(str(path), hardware=hardware)
    plan = _hand_plan(problem, th, db, held, maps)
    assert sum(g.placement.passes > 1 for g in plan.groups) == 2
    assert_verifies(problem, plan)
    if held:  # each block reads its input once: no halo, no second read
        assert all(g.predicted.redundant_read_bytes == 0 for g in plan.groups
                   if g.placement.passes > 1)


@pytest.mark.parametrize(("th", "db", "hardware", "held", "maps"), [
    (6, False, None, False, False), (11, True, None, False, False),
    (4, False, "soma_buffer", False, False), (7, False, None, True, False),
    (6, False, None, False, True), (5, True, "soma_buffer", False, True),
    (9, False, None, True, True)])
def test_three_passes_over_two_squeeze_excite_blocks_verify(tmp_path: Path, th: int, db: bool,
                                                            hardware: str | None,
                                                            held: bool, maps: bool) -> None:
    """Both blocks in one group: a pooling pass per block (the second recomputes the first
    block, or starts from its held pooled map, and scales it with the first tail's result,
    held on chip), then the last pass."""
    path = models.save(models.se_net(h=40, w=40, scale_first=False), tmp_path, "se")
    problem = api.prepare(str(path), hardware=hardware)
    g = problem.graph
    first, second = _blocks(g)
    layers = [*first, *second]
    split = pass_split(g, layers, held, maps)
    assert split is not None and split.count == 3
    again = tuple(n for n in first if n not in split.pools[0].tail
                  and n != split.pools[0].reduction)
    if maps:  # from the held map on: the first block's prefix is not computed again
        pooled = split.pools[0].held_map
        assert pooled == g.layer(split.pools[0].reduction).fmap_inputs[0]
        assert split.maps_during(0) == (pooled,) and len(split.maps_during(1)) == 2
        again = tuple(n for n in again if n not in split.pools[0].io.layers)
        assert not set(split.pools[0].io.layers[:-1]) & set(split.pools[1].io.layers)
    assert split.pools[1].io.layers[:len(again)] == again  # block 1 again, scaled
    assert split.held_before(1) == split.pools[0].kept
    n, _, _, w = g.dims(g.layer(layers[-1]).outputs[0])
    placements = [Placement.of(layers, Tile(n, th, w), True, db, passes=3, inputs_held=held,
                               maps_held=maps)]
    placements += [p for p in layer_placements(g, problem.chip)
                   if not set(layers).intersection(p.layers)]
    plan = assemble(g, problem.chip, placements, **problem.plan_header(),
                    objective=Objective.TRAFFIC, solver={"name": "hand"})
    assert_verifies(problem, plan)


@pytest.mark.parametrize("held", [False, True])
def test_a_pool_of_the_groups_own_input_runs_in_two_passes(tmp_path: Path, held: bool) -> None:
    """A group that starts at the pool (the map it scales is its input): the pooling pass
    only reads and folds; held, the input is read once and each tile folds its own part."""
    path = models.save(models.se_net(h=32, w=32, blocks=1), tmp_path, "se")
    problem = api.prepare(str(path))
    g = problem.graph
    block = _blocks(g)[0]
    layers = block[next(i for i, n in enumerate(block) if g.layer(n).op == "GlobalAveragePool"):]
    split = pass_split(g, layers, held)
    assert split is not None and split.pools[0].io.layers == (layers[0],)
    assert pass_split(g, layers, held, maps_held=True) is None  # the map comes from DRAM
    n, _, _, w = g.dims(g.layer(layers[-1]).outputs[0])
    placements = [Placement.of(layers, Tile(n, 6, w), True, False, passes=2, inputs_held=held)]
    placements += [p for p in layer_placements(g, problem.chip)
                   if not set(layers).intersection(p.layers)]
    plan = assemble(g, problem.chip, placements, **problem.plan_header(),
                    objective=Objective.TRAFFIC, solver={"name": "hand"})
    assert_verifies(problem, plan)


@settings(max_examples=8, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(size=st.integers(16, 40), n=st.integers(1, 2), blocks=st.integers(1, 2),
       one_group=st.booleans(), th=st.integers(1, 40), held=st.booleans(),
       maps=st.booleans(), double_buffered=st.booleans(), scale_first=st.booleans(),
       hardware=st.sampled_from([None, "soma_buffer", "two_level", "manycore"]))
def test_random_pass_plans_verify(tmp_path: Path, size: int, n: int, blocks: int,
                                  one_group: bool, th: int, held: bool, maps: bool,
                                  double_buffered: bool, scale_first: bool,
                                  hardware: str | None) -> None:
    """Random squeeze-excite nets, tiles and chips: every block in passes (or all blocks in
    one group), inputs held or re-read, pooled maps held or made again: outputs and every
    counter equal to the prediction (capacity aside: a hand-built tile may not fit a small
    chip)."""
    path = models.save(models.se_net(h=size, w=size, n=n, blocks=blocks,
                                     scale_first=scale_first), tmp_path, "se")
    problem = api.prepare(str(path), hardware=hardware)
    g = problem.graph
    found = _blocks(g)
    groups = [[n for b in found for n in b]] if one_group else found
    placements, covered = [], set()
    for layers in groups:
        split = pass_split(g, layers, held, maps)
        assert split is not None
        nn, h, _, w = g.dims(g.layer(layers[-1]).outputs[0])
        placements.append(Placement.of(layers, Tile(nn, min(th, h), w), True,
                                       double_buffered and not held, passes=split.count,
                                       inputs_held=held, maps_held=maps))
        covered.update(layers)
    placements += [p for p in layer_placements(g, problem.chip)
                   if not covered.intersection(p.layers)]
    plan = assemble(g, problem.chip, placements, **problem.plan_header(),
                    objective=Objective.TRAFFIC, solver={"name": "hand"})
    report = api.verify_in_memory(problem, plan, seed=size)
    assert report.outputs_match, report.first_output_mismatch
    assert report.predicted_matches_emulated, report.first_counter_mismatch


def _selective_kernel_net(h: int, leak: bool = False) -> onnx.ModelProto:
    """proj(B(x) * sigmoid(fc(GAP(A(x))))): a branch that feeds only the pool (SKNet-like);
    ``leak``: A's output also leaves the network (a second output besides the anchor)."""
    b = models._Builder(np.random.default_rng(0))
    x = b.one("Relu", [b.conv("input", 3, 16, 3, prefix="stem")])
    a = b.one("Relu", [b.conv(x, 16, 32, 3, prefix="branchA")])
    bb = b.one("Relu", [b.conv(x, 16, 32, 3, prefix="branchB")])
    s = b.one("GlobalAveragePool", [a], "gap")
    s = b.one("Sigmoid", [b.conv(s, 32, 32, 1, prefix="fc")])
    y = b.conv(b.one("Mul", [bb, s], "scale"), 32, 16, 1, prefix="proj")
    return b.model((1, 3, h, h), [y, a] if leak else y, 13, name="sk")


def test_a_branch_that_feeds_only_the_pool_runs_in_the_pool_pass_only(tmp_path: Path) -> None:
    """The last pass computes what the outputs need: a branch read only by the pool is not
    in it (it used to be, and had no box there). Default rules plan and verify."""
    path = models.save(_selective_kernel_net(160), tmp_path, "sk")
    problem = api.prepare(str(path))
    g = problem.graph
    order = [lay.name for lay in g.layers]
    layers = order[order.index(next(n for n in order if n.startswith("branchA"))):]
    split = pass_split(g, layers)
    assert split is not None
    branch_a = {n for n in layers if n.startswith("branchA")}
    assert branch_a <= set(split.pools[0].io.layers)
    assert not branch_a & set(split.last.layers)
    plan = api.plan_problem(problem)
    assert any(grp.placement.passes == 2 for grp in plan.groups)
    assert_verifies(problem, plan)
    # a tensor leaving mid-group that no layer of the last pass reads is cut like the
    # anchor (tiled_like_anchor): the last pass computes branch A again and each tile stores
    # its box of it; in passes at any height the plan verifies
    leaky = models.save(_selective_kernel_net(64, leak=True), tmp_path, "leaky")
    lp = api.prepare(str(leaky))
    lorder = [lay.name for lay in lp.graph.layers]
    start = lorder.index(next(n for n in lorder if n.startswith("branchA")))
    lsplit = pass_split(lp.graph, lorder[start:])
    assert lsplit is not None
    leaked = next(t for t in lsplit.last.outputs if t != lsplit.last.anchor)
    assert tiled_like_anchor(lp.graph, lsplit.last, leaked)
    for th in (1, 5, 63):
        assert_verifies(lp, hand_plan(lp, [
            Placement.of(tuple(lorder[:start]), Tile(1, 64, 64), True, False),
            Placement.of(tuple(lorder[start:]), Tile(1, th, 64), True, False, passes=2)]))


def test_held_maps_compute_each_layer_once_and_move_no_more_bytes(tmp_path: Path) -> None:
    """Held, the pooled map is not made again: the last pass computes only the scale, the
    projection and the residual add, so the group's work falls to what one pass over the
    block would do (halos aside: one tile a pass here) and no DRAM byte is added; the SRAM
    peak grows by the map. Predicted == emulated either way."""
    path = models.save(models.se_net(h=32, w=32, blocks=1), tmp_path, "se")
    problem = api.prepare(str(path))
    g = problem.graph
    block = _blocks(g)[0]
    split = pass_split(g, block, maps_held=True)
    assert split is not None
    assert [g.layer(n).op for n in split.last.layers] == ["Mul", "Conv", "Add"]
    pooled = split.pools[0].held_map
    assert pooled is not None and pooled not in split.last.inputs
    again, held = (_hand_plan(problem, 32, False, maps=m) for m in (False, True))
    work = sum(g.layer(n).macs_per_output * g.elems(g.layer(n).outputs[0])
               for n in block if g.layer(n).is_main)
    (a,), (b,) = ([grp for grp in p.groups if grp.placement.passes > 1] for p in (again, held))
    assert b.predicted.macs == work < a.predicted.macs
    assert b.predicted.dram_bytes <= a.predicted.dram_bytes
    assert b.predicted.sram_peak_bytes >= g.elems(pooled) * problem.chip.dtype_bytes
    assert_verifies(problem, held)


def test_plan_file_refuses_held_maps_where_they_cannot_be(tmp_path: Path) -> None:
    """"maps_held" without passes, or where the pooled map is the group's input: exit 2
    naming the key and the fix, no traceback."""
    path = models.save(models.se_net(h=32, w=32, blocks=1), tmp_path, "se")
    problem = api.prepare(str(path))
    plan_file = tmp_path / "plan.json"
    save_plan(_hand_plan(problem, 8, False, maps=True), plan_file)
    runner = CliRunner()
    ok = runner.invoke(app, ["verify", str(path), str(plan_file)])
    assert ok.exit_code == 0, ok.output
    doc = json.loads(plan_file.read_text())
    assert [g.get("maps_held") for g in doc["groups"] if g.get("passes") == 2] == [True]
    lone = json.loads(plan_file.read_text())
    next(g for g in lone["groups"] if len(g["layers"]) == 1)["maps_held"] = True
    g = problem.graph
    block = _blocks(g)[0]
    from_pool = block[next(i for i, n in enumerate(block)
                           if g.layer(n).op == "GlobalAveragePool"):]
    split = hand_plan(problem, [Placement.of(from_pool, Tile(1, 8, 32), True, passes=2)])
    starts_at_pool = tmp_path / "pool.json"
    save_plan(split, starts_at_pool)
    at_pool = json.loads(starts_at_pool.read_text())
    next(g for g in at_pool["groups"] if g.get("passes") == 2)["maps_held"] = True
    _assert_refused(runner, path, tmp_path, (lone, at_pool), "maps_held")


def test_held_inputs_with_a_second_buffer_are_refused(tmp_path: Path) -> None:
    path = models.save(models.se_net(h=32, w=32, blocks=1), tmp_path, "se")
    problem = api.prepare(str(path))
    with pytest.raises(PlanningError, match="passes"):
        _hand_plan(problem, 5, True, held=True)


def _two_pass_groups(plan: Plan) -> list[int]:
    return [g.id for g in plan.groups if g.placement.passes > 1]


@pytest.mark.parametrize("scale_first", [True, False])
def test_planners_pick_two_passes_where_the_expanded_map_does_not_fit(
        tmp_path: Path, scale_first: bool) -> None:
    """At 128 x 128 the expanded maps (1 MiB) do not fit whole beside their neighbours on
    the default chip: with two passes both blocks fuse around their pools and the plan moves
    a third fewer bytes than without them; CP-SAT does no worse than the shortest path (it
    also weighs each block with its entry layer, one layer past max_group_layers), and the
    plan verifies."""
    path = models.save(models.se_net(h=128, w=128, scale_first=scale_first), tmp_path, "se")
    on = models.fusing_rules(tmp_path)
    off = models.fusing_rules(tmp_path, {"pooling_passes: true":
                                         "pooling_passes: false"})
    problem = api.prepare(str(path), rules=on)
    cpsat = api.plan_problem(problem, "cpsat")
    path_plan = api.plan_problem(problem, "shortest-path")
    without = api.solve(str(path), rules=off)
    assert len(_two_pass_groups(cpsat)) == 2
    assert not _two_pass_groups(without)
    assert cpsat.totals.dram_bytes <= path_plan.totals.dram_bytes
    assert 3 * cpsat.totals.dram_bytes < 2 * without.totals.dram_bytes
    # `explain` re-checks each pass against the tile rules: nothing breaks them
    assert recheck(problem.graph, cpsat, problem.chip, problem.ruleset) == []
    assert_verifies(problem, cpsat)


def test_plan_file_states_passes_and_rejects_them_where_they_cannot_run(tmp_path: Path) -> None:
    path = models.save(models.se_net(h=64, w=64), tmp_path, "se")
    problem = api.prepare(str(path))
    plan = _hand_plan(problem, 8, False)
    plan_file = tmp_path / "plan.json"
    save_plan(plan, plan_file)
    doc = json.loads(plan_file.read_text())
    stated = [g for g in doc["groups"] if g.get("passes") == 2]
    assert len(stated) == 2
    runner = CliRunner()
    ok = runner.invoke(app, ["verify", str(path), str(plan_file)])
    assert ok.exit_code == 0, ok.output
    # the annotated model says which nodes run in passes
    out = tmp_path / "annotated.onnx"
    exported = runner.invoke(app, ["export", str(path), str(plan_file), "-o", str(out)])
    assert exported.exit_code == 0, exported.output
    props = [{p.key: p.value for p in node.metadata_props}
             for node in onnx.load(str(out)).graph.node]
    in_passes = [p for p in props if p.get("fuseplan.passes") == "2"]
    assert len(in_passes) == sum(len(g.layers) for g in plan.groups if g.placement.passes > 1)
    # a lone layer cannot run in two passes; nor can a group whose weights stream
    lone = json.loads(plan_file.read_text())
    next(g for g in lone["groups"] if len(g["layers"]) == 1)["passes"] = 2
    streamed = json.loads(plan_file.read_text())
    group = next(g for g in streamed["groups"] if g.get("passes") == 2)
    group["weights_resident"] = False
    _assert_refused(runner, path, tmp_path, (lone, streamed), "passes")


def _assert_refused(runner: CliRunner, path: Path, tmp_path: Path, docs: tuple[dict, ...],
                    key: str) -> None:
    """Each edited plan document: `verify` exits 2 naming `key`, no traceback."""
    for k, bad in enumerate(docs):
        bad_file = tmp_path / f"bad{k}.json"
        bad_file.write_text(json.dumps(bad))
        result = runner.invoke(app, ["verify", str(path), str(bad_file)])
        assert result.exit_code == 2, result.output
        assert key in result.output and "Traceback" not in result.output


def test_held_maps_stay_in_sram_and_take_no_nram(tmp_path: Path) -> None:
    """What a group in passes holds for all its tiles (here the pooled map, 128 KiB) stays
    in the cluster's SRAM: each core's NRAM holds its share of the tile only. On a chip
    whose cores have just that, the plan verifies although the held map's share would not
    fit beside it; one byte less and the emulator reports the NRAM overflow of that group,
    as the planners' check (SplitSearch.physical, from the same peaks) does."""
    from math import ceil

    from fuseplan.planner.cost.passes import fmap_peaks

    path = models.save(models.se_net(h=32, w=32, blocks=1), tmp_path, "se")
    base = api.prepare(str(path))
    g, chip = base.graph, base.chip
    block = _blocks(g)[0]
    split = pass_split(g, block, maps_held=True)
    assert split is not None and split.pools[0].held_map is not None
    n, _, _, w = g.dims(g.layer(block[-1]).outputs[0])
    sram, cores = fmap_peaks(g, split, Tile(n, 8, w), chip)
    held = g.elems(split.pools[0].held_map) * chip.dtype_bytes
    assert sram - cores >= held
    need = ceil(cores / chip.cores_per_cluster)
    assert ceil(sram / chip.cores_per_cluster) > need  # the held share would not fit too
    for nram, fits in ((need, True), (need - 1, False)):
        problem = api.prepare(str(path), overrides=(f"nram.bytes={nram}",))
        plan = _hand_plan(problem, 8, False, maps=True)
        group = next(grp.id for grp in plan.groups if grp.placement.passes > 1)
        report = api.verify_in_memory(problem, plan, seed=1)
        assert report.outputs_match and report.predicted_matches_emulated
        over = [v for v in report.capacity_violations if v.level == "nram"]
        assert [v.group for v in over] == ([] if fits else [group]), \
            [v.describe() for v in over]
        if not fits:
            assert over[0].needed_bytes == need
