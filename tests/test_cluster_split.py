"""Cluster split (planner.geometry.cluster_split): a group whose weights do not fit one
cluster's WRAM runs one tile at a time on every cluster, each making its share of the output
channels with its share of the weights resident. Which groups split, hand-built split plans
and the planners' on the emulator (outputs equal to onnxruntime's, every counter, the link
bytes included, equal to the prediction), and issue 45's VGG-19 at batch 16."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import numpy as np
import onnx
import pytest
from hand import assert_refused, hand_plan
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_end_chunks import chain_model
from test_weight_stream import _big_conv, _fuseplan

from fuseplan.planner.app import api
from fuseplan.planner.core.errors import PlanningError
from fuseplan.planner.cost.cluster_split import split_weight_bytes
from fuseplan.planner.cost.model import weight_bytes
from fuseplan.planner.geometry.cluster_split import cluster_split
from fuseplan.planner.geometry.regions import Tile, group_io
from fuseplan.planner.plan.data import Plan
from fuseplan.planner.plan.placement import Placement
from fuseplan.solver.tiles import GroupSearch

from models import _Builder, batch_first_mha, chain_cnn, random_cnn, save


def _verifies(problem: api.Problem, plan: Plan) -> None:
    """hand.assert_verifies, and the clock's cycles keep to verify's rule."""
    report = api.verify_in_memory(problem, plan, seed=3)
    assert report.outputs_match, report.first_output_mismatch
    assert report.predicted_matches_emulated, report.first_counter_mismatch
    assert not report.capacity_violations, [v.describe() for v in report.capacity_violations]
    assert report.cycles.ok, report.cycles.first_off


def wide_chain(n: int = 8, c: int = 32, h: int = 16, w: int = 16) -> onnx.ModelProto:
    """Conv-Relu-Conv-BN-Relu-MaxPool-Conv-Add(skip)-Relu on n images: a stage whose
    weights outgrow a small WRAM."""
    b = _Builder(np.random.default_rng(5))
    x = b.one("Relu", [b.conv("input", c, 2 * c, 3)])
    x = b.one("Relu", [b.bn(b.conv(x, 2 * c, 2 * c, 3), 2 * c)])
    x = b.one("MaxPool", [x], kernel_shape=[2, 2], strides=[2, 2])
    y = b.conv(x, 2 * c, 2 * c, 3)
    x = b.one("Relu", [b.one("Add", [y, x])])
    return b.model((n, c, h, w), x, 13, name="wide_chain")


def _problem(tmp_path: Path, model: onnx.ModelProto, *overrides: str,
             rules: str | None = None) -> api.Problem:
    path = save(model, tmp_path, "model")
    return api.prepare(str(path), rules=rules, overrides=list(overrides))


def test_which_groups_split_and_what_they_gather(tmp_path: Path) -> None:
    problem = _problem(tmp_path, wide_chain())
    g = problem.graph
    names = [lay.name for lay in g.layers]
    split = cluster_split(g, group_io(g, names))
    assert split is not None
    assert split.split == tuple(n for n in names if g.layer(n).op == "Conv")
    # the second conv reads the first's Relu, the third the pool: both gathered; the Add
    # reads the pool as a share (per element), the group's input comes whole by broadcast
    made = {g.layer(n).outputs[0]: n for n in names}
    assert [made[t] for t in split.gathered] == [names[1], names[5]]
    assert {at for _, at in split.axis} == {1}
    # a layer alone that cuts no weights, and a group ending in a global pool, do not split
    assert cluster_split(g, group_io(g, [names[1]])) is None
    gap = _problem(tmp_path, _global_pool_tail()).graph
    assert cluster_split(gap, group_io(gap, [lay.name for lay in gap.layers])) is None


def _global_pool_tail() -> onnx.ModelProto:
    b = _Builder(np.random.default_rng(1))
    x = b.one("Relu", [b.conv("input", 8, 16, 3)])
    return b.model((2, 8, 8, 8), b.one("GlobalAveragePool", [x]), 13, name="gap")


def test_share_is_the_widest_cluster_share(tmp_path: Path) -> None:
    problem = _problem(tmp_path, wide_chain(c=6), "clusters=4")
    g, chip = problem.graph, problem.chip
    io = group_io(g, [lay.name for lay in g.layers])
    split = cluster_split(g, io)
    assert split is not None
    # 12 output channels each: 3 per cluster; the biases and the BN's vectors split or not
    dt = chip.dtype_bytes
    convs = [(6 * 9 + 1) * 3, (12 * 9 + 1) * 3, (12 * 9 + 1) * 3]
    bn = 4 * 12
    assert split_weight_bytes(g, io, split, chip) == (sum(convs) + bn) * dt
    assert weight_bytes(g, io.weights, chip) == (sum(c * 4 for c in convs) + bn) * dt


@pytest.mark.parametrize(("clusters", "th", "db"), [(4, 8, False), (2, 3, True), (3, 16, False)])
def test_hand_built_split_plans_verify(tmp_path: Path, clusters: int, th: int, db: bool) -> None:
    problem = _problem(tmp_path, wide_chain(n=2), f"clusters={clusters}")
    names = tuple(lay.name for lay in problem.graph.layers)
    plan = hand_plan(problem, [Placement.of(names, Tile(1, th, 8), double_buffered=db,
                                            cluster_split=True)])
    group = plan.groups[0]
    assert group.placement.cluster_split and group.predicted.cluster_link_bytes > 0
    _verifies(problem, plan)


@pytest.mark.parametrize("rows", [16, 5])
def test_products_of_two_maps_run_whole_on_every_cluster(tmp_path: Path, rows: int) -> None:
    """An attention left unfused (batch-first, 16 tokens): its Linears split, its scores
    and mix (products of two maps, no weights to share out) replicated, their MACs counted
    on every cluster; verified, MACs and cycles included."""
    problem = _problem(tmp_path, batch_first_mha())
    g = problem.graph
    names = tuple(lay.name for lay in g.layers)
    split = cluster_split(g, group_io(g, names))
    assert split is not None and not split.headed
    products = [n for n in split.replicated if g.layer(n).is_main]
    assert [g.layer(n).op for n in products] == ["MatMul", "MatMul"]
    plan = hand_plan(problem, [Placement.of(names, Tile(4, rows, 1), cluster_split=True)])
    alone = hand_plan(problem, [Placement.of(names, Tile(4, rows, 1))])
    # each tile makes its rows of the scores and mix (the keys' projections, made again
    # by every tile of fewer rows than the map, are split, not replicated)
    extra = (problem.chip.clusters - 1) * sum(g.layer(n).macs for n in products)
    assert plan.groups[0].predicted.macs == alone.groups[0].predicted.macs + extra
    _verifies(problem, plan)


def test_a_split_that_cannot_run_is_refused(tmp_path: Path) -> None:
    problem = _problem(tmp_path, _global_pool_tail())
    names = tuple(lay.name for lay in problem.graph.layers)
    with pytest.raises(PlanningError, match="cluster_split shares out output channels"):
        hand_plan(problem, [Placement.of(names, Tile(2, 8, 8), cluster_split=True)])
    wide = _problem(tmp_path, wide_chain(n=2))
    names = tuple(lay.name for lay in wide.graph.layers)
    with pytest.raises(PlanningError, match="cluster_split runs with resident weights"):
        hand_plan(wide, [Placement.of(names, Tile(1, 4, 8), False, cluster_split=True)])


def _rules_without_split(tmp_path: Path) -> str:
    text = (Path(__file__).parents[1] / "rules" / "default.yaml").read_text()
    path = tmp_path / "no_split.yaml"
    path.write_text(text.replace("cluster_split: true", "cluster_split: false"))
    return str(path)


def test_planners_split_a_stage_past_one_clusters_wram(tmp_path: Path) -> None:
    """Four clusters of 4 cores with 32 KiB of WRAM each: the stage's 185 KB of weights fit
    only split. Split, every weight is read once for the batch of 32; without it, once per
    round of tiles (or the stage breaks up)."""
    model = wide_chain(n=32, c=32, h=48, w=48)
    chip = ["wram.bytes=32KiB"]
    problem = _problem(tmp_path, model, *chip)
    total = weight_bytes(problem.graph, {w for lay in problem.graph.layers
                                         for w in lay.weights}, problem.chip)
    for planner in ("shortest-path", "cpsat"):
        plan = api.plan_problem(problem, planner, "traffic")
        assert any(g.placement.cluster_split for g in plan.groups), planner
        assert plan.totals.weight_read_bytes == total
        _verifies(problem, plan)
    unsplit = _problem(tmp_path, model, *chip, rules=_rules_without_split(tmp_path))
    before = api.plan_problem(unsplit, "shortest-path", "traffic")
    assert not any(g.placement.cluster_split for g in before.groups)
    assert before.totals.dram_bytes > plan.totals.dram_bytes


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10_000), clusters=st.integers(2, 4), n=st.integers(1, 3),
       cut=st.floats(0.1, 1.0), db=st.booleans(), reuse=st.booleans())
def test_random_split_groups_run_as_predicted(tmp_path: Path, seed: int, clusters: int,
                                              n: int, cut: float, db: bool,
                                              reuse: bool) -> None:
    """Random conv chains (pools, BN, skip Adds): the longest run of layers from the first
    that splits, at a random tile height, on 2 to 4 clusters, its halos recomputed or (where
    its rows may) reused: outputs and every counter as predicted."""
    problem = _problem(tmp_path, random_cnn(np.random.default_rng(seed), n=n),
                       f"clusters={clusters}")
    g = problem.graph
    names = [lay.name for lay in g.layers]
    layers = max((tuple(names[:k]) for k in range(1, len(names) + 1)
                  if cluster_split(g, group_io(g, names[:k])) is not None),
                 key=len, default=None)
    if layers is None:
        return
    io = group_io(g, layers)
    _, h, w = g.dims(io.anchor)[0], g.dims(io.anchor)[2], g.dims(io.anchor)[3]
    tile = Tile(g.dims(io.anchor)[0], max(1, round(h * cut)), w)
    reuse = reuse and GroupSearch.of(g, layers, problem.chip, problem.ruleset).can_reuse()
    plan = hand_plan(problem, [Placement.of(layers, tile, double_buffered=db,
                                            halo_reuse=reuse, cluster_split=True)])
    assert plan.groups[0].halo_reuse == reuse
    _verifies(problem, plan)


@pytest.mark.slow
def test_vgg19_at_batch_16_reads_its_weights_once() -> None:
    """Issue 45: on the default chip, VGG-19's fourth stage (16.5 MB of weights, a
    cluster's WRAM 4 MiB) splits over the four clusters: the batch of 16 reads every weight
    once (batch 1's weights, not 1.17x), the plan moves at most 1.25x its floor, and it
    verifies."""
    one = api.prepare("zoo:vgg19")
    once = weight_bytes(one.graph, {w for lay in one.graph.layers for w in lay.weights},
                        one.chip)
    problem = api.prepare("zoo:vgg19", shapes={"data_0": (16, 3, 224, 224)})
    plan = api.plan_problem(problem, "cpsat", "traffic")
    assert any(g.placement.cluster_split for g in plan.groups)
    assert plan.totals.weight_read_bytes <= 1.05 * once
    assert plan.totals.dram_bytes <= 1.25 * plan.compulsory_dram_bytes
    _verifies(problem, plan)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(widths=st.lists(st.sampled_from([6, 8, 12, 16]), min_size=2, max_size=4),
       clusters=st.integers(2, 4), tokens=st.integers(4, 40), cut=st.floats(0.1, 1.0),
       relu=st.booleans(), hardware=st.sampled_from(["cluster4x4", "manycore"]))
def test_random_matmul_chains_split_as_predicted(tmp_path: Path, widths: list[int],
                                                 clusters: int, tokens: int, cut: float,
                                                 relu: bool, hardware: str) -> None:
    """Chains of MatMuls by constant weights on tokens (a Relu after each but the last, or
    none), split along their last axis on 2 to 4 clusters of two chips: outputs and every
    counter as predicted, the gathers C - 1 copies of every map a product reads."""
    model = chain_model(len(widths), tokens, 8, widths,
                        relu_after=tuple(range(len(widths) - 1)) if relu else ())
    path = save(model, tmp_path, "chain")
    problem = api.prepare(str(path), hardware=hardware, overrides=[f"clusters={clusters}"])
    g = problem.graph
    layers = tuple(lay.name for lay in g.layers)
    split = cluster_split(g, group_io(g, layers))
    assert split is not None and split.split == tuple(n for n in layers if n.startswith("mm"))
    tile = Tile(1, max(1, round(tokens * cut)), 1)
    plan = hand_plan(problem, [Placement.of(layers, tile, cluster_split=True)])
    made = sum(g.elems(t) for t in split.gathered)
    assert plan.groups[0].predicted.cluster_link_bytes \
        == (clusters - 1) * made * problem.chip.dtype_bytes
    _verifies(problem, plan)


def test_a_conv_past_one_clusters_wram_reads_its_weights_once(tmp_path: Path) -> None:
    """test_weight_stream's 512-channel conv (4.7 MB of weights) at batch 8: streamed in
    rounds of four tiles it reads them twice; split over the four clusters, once. From the
    command line, verified."""
    model = _big_conv(tmp_path / "conv.onnx", 8)
    plan = tmp_path / "plan.json"
    chip = ["--set", "sram.bytes=512KiB", "--set", "nram.bytes=128KiB"]
    solved = _fuseplan("solve", str(model), *chip, "-o", str(plan))
    assert solved.returncode == 0, solved.stderr
    conv = next(g for g in json.loads(plan.read_text())["groups"] if "conv" in g["layers"])
    assert conv["cluster_split"] and conv["weights_resident"]
    assert conv["predicted"]["weight_read_bytes"] == (512 * 512 * 9 + 512) * 2
    assert conv["predicted"].get("cluster_link_bytes", 0) == 0  # its input is from DRAM
    checked = _fuseplan("verify", str(model), str(plan), *chip, "--json")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    report = json.loads(checked.stdout)
    assert report["outputs_match"] and report["predicted_matches_emulated"]


def test_rule_10_sees_one_clusters_share(tmp_path: Path) -> None:
    """chain_cnn with 128 B of WRAM per core and no streaming: whole, no fused group's
    weights fit a cluster (rule 10); split over the four clusters, conv3 and conv7 fuse, and
    the plan keeps every rule as the rules see it."""
    problem = _problem(tmp_path, chain_cnn(), "sram.bytes=8KiB", "nram.bytes=4KiB",
                       "wram.bytes=128")
    rules = problem.ruleset
    r10 = replace(cast(Any, rules.get("weights_fit_wram")), streaming=False)
    problem = replace(problem, ruleset=replace(
        rules, rules=tuple(r10 if r.key == r10.key else r for r in rules.rules)))
    plan = api.plan_problem(problem, "cpsat", "traffic")
    split = [g for g in plan.groups if g.placement.cluster_split]
    assert split and {"conv3", "conv7"} <= set(split[0].layers)
    for g in split:
        search = GroupSearch.of(problem.graph, g.layers, problem.chip, problem.ruleset)
        assert not search.violations(g.tile, True, double_buffered=g.double_buffered,
                                     cluster_split=True)
        assert search.violations(g.tile, True, double_buffered=g.double_buffered)
    _verifies(problem, plan)


def test_a_plan_file_asking_a_split_that_cannot_run_is_refused(tmp_path: Path) -> None:
    """verify refuses (exit 2, naming the group's key) a plan file whose group says
    "cluster_split": true where a main layer has no output channels to share out (a
    depthwise conv: grouped, its weights are not cut along them)."""
    b = _Builder(np.random.default_rng(6))
    y = b.conv(b.one("Relu", [b.conv("input", 3, 8, 3)]), 8, 8, 3, group=8, prefix="dw")
    model = str(save(b.model((1, 3, 16, 16), y, 13), tmp_path, "dw"))
    plan = tmp_path / "plan.json"
    assert _fuseplan("solve", model, "-o", str(plan)).returncode == 0
    doc = json.loads(plan.read_text())
    group = next(g for g in doc["groups"] if any(n.startswith("dw") for n in g["layers"]))
    group["cluster_split"] = True
    assert_refused(model, doc, tmp_path, "cluster_split shares out output channels")


def test_a_pre_norm_mlp_splits_with_its_norm_replicated(tmp_path: Path) -> None:
    """A LayerNorm over the channels before an MLP needs every channel: each cluster runs it
    whole (replicated, its work counted once per cluster) on the whole input it reads from
    DRAM, the MLP's Linears split their output channels, the hidden map is gathered. At
    512 tokens of width 256 on 512 KiB of WRAM per cluster the weights (1 MiB) fit only as
    a share: split, they are read once, and the plan verifies."""
    b = _Builder(np.random.default_rng(7))
    w = 256
    n = b.one("LayerNormalization", ["input", b.const("g", np.ones(w, np.float32)),
                                     b.const("beta", np.zeros(w, np.float32))], "ln", axis=-1)
    h = b.one("Relu", [b.one("MatMul", [n, b.weight((w, 4 * w), w)], "fc1")])
    y = b.one("Add", [b.one("MatMul", [h, b.weight((4 * w, w), 4 * w)], "fc2"), "input"],
              "residual")
    problem = _problem(tmp_path, b.model((1, 512, w), y, 17), "wram.bytes=128KiB")
    g = problem.graph
    layers = tuple(lay.name for lay in g.layers)
    split = cluster_split(g, group_io(g, layers))
    assert split is not None
    assert split.replicated == (layers[0],) and split.split == (layers[1], layers[3])
    assert split.gathered == (g.layer(layers[2]).outputs[0],)
    plan = hand_plan(problem, [Placement.of(layers, Tile(1, 64, 1), cluster_split=True)])
    (group,) = plan.groups
    assert group.predicted.weight_read_bytes == weight_bytes(g, group_io(g, layers).weights,
                                                             problem.chip)
    whole = api.plan_problem(problem, "cpsat", "traffic")
    assert sum(grp.predicted.weight_read_bytes for grp in whole.groups) \
        == group.predicted.weight_read_bytes
    _verifies(problem, plan)
    _verifies(problem, whole)


def test_a_single_memory_chip_of_four_clusters_splits_too(tmp_path: Path) -> None:
    """soma_buffer (weights and maps in one SRAM) with four clusters of 64 KiB: the stage's
    weights (8-bit, 92 KB) fit no cluster's SRAM, a quarter of them does beside the maps;
    the split reads them once and verifies, each cluster's SRAM holding its share."""
    model = wide_chain(n=8, c=32, h=16, w=16)
    path = str(save(model, tmp_path, "model"))
    problem = api.prepare(path, hardware="soma_buffer",
                          overrides=["clusters=4", "sram.bytes=64KiB"])
    plan = api.plan_problem(problem, "cpsat", "traffic")
    split = [g for g in plan.groups if g.placement.cluster_split]
    assert split
    total = weight_bytes(problem.graph, {w for lay in problem.graph.layers
                                         for w in lay.weights}, problem.chip)
    assert plan.totals.weight_read_bytes == total
    _verifies(problem, plan)
