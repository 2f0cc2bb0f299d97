"""Loop nests across fused layers (issue 45), as one property: random chains of convs and of
MatMuls and groups with several outputs cut alike (siblings), random chips, a random run of
their layers and any mode the validator lets those layers run in (tiles outer with resident
or streamed weights, one or two input buffers; weights outer; hidden chunks; end chunks; a
split over the clusters), at a random tile height: the emulator's outputs equal
onnxruntime's, every counter equals the prediction and its clock's cycles keep to verify's
rule."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import numpy as np
import onnx
import pytest
from hand import assert_verifies, hand_plan
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from ortools.sat.python import cp_model
from test_end_chunks import chain_model

from fuseplan.planner.app import api
from fuseplan.planner.core.errors import PlanningError
from fuseplan.planner.cost.model import group_cost
from fuseplan.planner.geometry.cluster_split import ClusterSplit, cluster_split
from fuseplan.planner.geometry.regions import Tile, group_io, tiled_like_anchor
from fuseplan.planner.plan.checks import whole_tile
from fuseplan.planner.plan.mode import Mode, mode_kind, mode_problem
from fuseplan.planner.plan.placement import Placement
from fuseplan.rules.encoding import Encoding
from fuseplan.solver.cpsat_costs import candidate_terms
from fuseplan.solver.tiles import GroupSearch

from models import _Builder, random_cnn, random_modern_net, save


def _modes() -> list[Mode]:
    """Every mode the property tries (the validator keeps those a run of layers allows)."""
    tiles = [Mode.of(resident=r, double_buffered=db) for r in (True, False)
             for db in (False, True)]
    return [*tiles, Mode.of(resident=False, weights_outer=True),
            *(Mode.of(hidden_chunks=k) for k in (2, 4)),
            *(Mode.of(end_chunks=k) for k in (2, 4)),
            Mode.of(cluster_split=True), Mode.of(cluster_split=True, double_buffered=True)]


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_random_loop_nests_run_as_predicted(tmp_path: Path, data: st.DataObject) -> None:
    seed = data.draw(st.integers(0, 10_000), "seed")
    family = data.draw(st.sampled_from(["cnn", "modern", "matmuls", "siblings"]), "family")
    if family == "siblings":  # outputs tiled like the anchor (q, k, v; a residual sum)
        model = sibling_outputs(np.random.default_rng(seed), data.draw(st.integers(4, 48),
                                                                        "tokens"))
    elif family == "cnn":
        model = random_cnn(np.random.default_rng(seed), n=data.draw(st.integers(1, 2), "n"))
    elif family == "modern":  # depthwise convs, squeeze-excite, LayerNorm, GELU, skips
        model = random_modern_net(np.random.default_rng(seed))
    else:
        widths = data.draw(st.lists(st.sampled_from([4, 8, 16, 32]), min_size=1, max_size=4),
                           "widths")
        relu = tuple(k for k in range(len(widths) - 1) if (seed >> k) & 1)
        model = chain_model(len(widths), data.draw(st.integers(4, 48), "tokens"), 8, widths,
                            relu_after=relu)
    chip = [f"clusters={data.draw(st.integers(1, 4), 'clusters')}",
            f"sram.bytes={data.draw(st.sampled_from(['64KiB', '256KiB', '2MiB']), 'sram')}"]
    hardware = data.draw(st.sampled_from(["cluster4x4", "soma_buffer", "systolic32",
                                          "two_level", "frustum_npu"]), "hardware")
    if hardware != "cluster4x4":
        chip = chip[1:]
    problem = api.prepare(str(save(model, tmp_path, "model")), hardware=hardware,
                          overrides=chip)
    g = problem.graph
    names = [lay.name for lay in g.layers]
    first = data.draw(st.integers(0, len(names) - 1), "first")
    last = data.draw(st.integers(first, min(len(names), first + 6) - 1), "last")
    layers = tuple(names[first:last + 1])
    whole = whole_tile(g, layers)
    # a group whose output leaves mid-group runs as one tile (GroupSearch.tiles_split)
    cut = GroupSearch.of(g, layers, problem.chip, problem.ruleset).tiles_split
    th = data.draw(st.integers(1, whole.h), "height") if cut else whole.h
    tile = Tile(whole.n, th, whole.w)
    allowed = {m: mode_kind(g, layers, m) for m in _modes()
               if mode_problem(g, layers, tile, m, whole) is None}
    # a kind first, so that the rarer kinds are drawn as often as tiles outer
    kind = data.draw(st.sampled_from(sorted(set(allowed.values()))), "kind")
    mode = data.draw(st.sampled_from([m for m, k in allowed.items() if k is kind]), "mode")
    event(kind.value)  # --hypothesis-show-statistics: the kinds run
    if th < whole.h and len(group_io(g, layers).stored_per_tile) > 1:
        event("several outputs, cut")
    if mode.cluster_split and cast(ClusterSplit, cluster_split(g, group_io(g, layers))).replicated:
        event("split, a layer replicated")
    plan = hand_plan(problem, [Placement(layers, tile, mode)])
    report = api.verify_in_memory(problem, plan, seed=seed)
    assert report.outputs_match, report.first_output_mismatch
    assert report.predicted_matches_emulated, report.first_counter_mismatch
    assert report.cycles.ok, report.cycles.first_off


def sibling_outputs(rng: np.random.Generator, tokens: int) -> onnx.ModelProto:
    """Maps leaving a group that its tiles can cut as they cut the anchor: a LayerNorm on
    [1, L, 16] feeding three Linears (q split into two heads by a Reshape and a Transpose,
    k, v through a Relu), each a model output; then a residual sum of the input and v, an
    output a Relu after it also reads element for element, and a 1-D conv over the tokens
    that reads the sum with a halo (which forces one tile on a group storing the sum)."""
    b = _Builder(rng)
    w = 16
    n = b.one("LayerNormalization", ["input", b.const("g", np.ones(w, np.float32)),
                                     b.const("beta", np.zeros(w, np.float32))], "ln", axis=-1)
    q, k, v = (b.one("MatMul", [n, b.weight((w, w), w)], name) for name in "qkv")
    heads = b.const("shape", np.array([1, tokens, 2, w // 2], np.int64))
    q = b.one("Transpose", [b.one("Reshape", [q, heads], "split")], "heads", perm=[0, 2, 1, 3])
    v = b.one("Relu", [v], "v_act")
    r = b.one("Add", ["input", v], "residual")
    after = b.one("Relu", [r], "after")
    along = b.one("Transpose", [r], "channels_first", perm=[0, 2, 1])
    conv = b.one("Conv", [along, b.weight((w, w, 3), 3 * w)], "conv1d", kernel_shape=[3],
                 pads=[1, 1])
    return b.model((1, tokens, w), [q, k, v, r, after, conv], 17, name="siblings")


def test_a_cut_tile_of_a_group_with_an_output_midway_is_refused(tmp_path: Path) -> None:
    """A group whose map leaves it mid-way (read by a layer outside it) stores that map
    once, whole, so it runs as one tile: a plan cutting it into tiles is refused by the one
    validator (the emulator would store the map per tile, against the prediction)."""
    b = _Builder(np.random.default_rng(2))
    r = b.one("Relu", [b.conv("input", 3, 8, 3)])
    y = b.conv(r, 8, 8, 3)
    problem = api.prepare(str(save(b.model((1, 3, 16, 16), b.one("Add", [y, r]), 13),
                                   tmp_path, "midway")))
    layers = tuple(lay.name for lay in problem.graph.layers[:3])
    with pytest.raises(PlanningError, match=f"{layers[1]}_out' leaves the group mid-way"):
        hand_plan(problem, [Placement.of(layers, Tile(1, 4, 16))])
    assert_verifies(problem, hand_plan(problem, [Placement.of(layers, Tile(1, 16, 16))]))


def test_a_split_part_beside_one_read_with_a_halo_is_not_cut_alike(tmp_path: Path) -> None:
    """A layer computes all its outputs on one box: a Split whose second part a 3x3 conv
    reads (with a halo) computes its first part, a model output, on the haloed box too, so
    that part is not cut like the anchor. The group runs as one tile (a cut one is
    refused), and a q/k/v-like split whose parts no layer reads is cut alike."""
    b = _Builder(np.random.default_rng(3))
    first, second = b.node("Split", [b.conv("input", 4, 8, 1)], "split", n_out=2, axis=1)
    y = b.conv(second, 4, 4, 3)
    problem = api.prepare(str(save(b.model((1, 4, 16, 16), [first, y], 13), tmp_path, "sp")))
    g = problem.graph
    layers = tuple(lay.name for lay in g.layers)
    io = group_io(g, layers)
    assert not tiled_like_anchor(g, io, first)
    assert not GroupSearch.of(g, layers, problem.chip, problem.ruleset).tiles_split
    with pytest.raises(PlanningError, match="leaves the group mid-way"):
        hand_plan(problem, [Placement.of(layers, Tile(1, 5, 16))])
    assert_verifies(problem, hand_plan(problem, [Placement.of(layers, Tile(1, 16, 16))]))
    # the first two layers alone: both parts leave, neither is read, both are cut alike
    io = group_io(g, layers[:2])
    assert tiled_like_anchor(g, io, next(t for t in io.outputs if t != io.anchor))
    assert_verifies(problem, hand_plan(problem, [Placement.of(layers[:2], Tile(1, 5, 16)),
                                                 Placement.of(layers[2:], Tile(1, 16, 16))]))


@pytest.mark.parametrize("th", [1, 8, 13])
def test_cpsat_stores_outputs_cut_alike_per_tile(tmp_path: Path, th: int) -> None:
    """CP-SAT's last-tile store (the drain in the cycles it minimises) counts an output cut
    like the anchor by the last tile's rows, as the cost model does, not whole."""
    b = _Builder(np.random.default_rng(0))
    w = 16
    n = b.one("LayerNormalization", ["input", b.const("g", np.ones(w, np.float32)),
                                     b.const("beta", np.zeros(w, np.float32))], "ln", axis=-1)
    q, k = (b.one("MatMul", [n, b.weight((w, w), w)], name) for name in "qk")
    problem = api.prepare(str(save(b.model((1, 64, w), [q, k], 17), tmp_path, "qk")))
    g = problem.graph
    layers = tuple(lay.name for lay in g.layers)
    enc = Encoding(g, problem.chip)
    cand = enc.add_candidate(layers)
    terms = candidate_terms(enc, cand)
    enc.model.add(cand.th == th)
    store = enc.model.new_int_var(0, 10**9, "store")
    enc.model.add(store == terms.last_store)
    solver = cp_model.CpSolver()
    assert solver.solve(enc.model) in (cp_model.OPTIMAL, cp_model.FEASIBLE)
    cost = group_cost(g, layers, Tile(1, th, 1), problem.chip)
    assert solver.value(store) == cost.last_store_bytes


def test_hidden_chunks_refuse_a_cut_tile_when_a_map_leaves_mid_way(tmp_path: Path) -> None:
    """In hidden chunks too, a map leaving the group mid-way that a later layer reads with a
    halo is stored once, whole (the emulator stored it per tile against the prediction):
    a cut tile is refused by the one validator, the whole tile verifies."""
    b = _Builder(np.random.default_rng(4))
    x = "input"
    wide = b.one("Relu", [b.one("MatMul", [x, b.weight((16, 64), 16)], "widen")])
    r = b.one("Add", [b.one("MatMul", [wide, b.weight((64, 16), 64)], "narrow"), x],
              "residual")
    along = b.one("Transpose", [r], "channels_first", perm=[0, 2, 1])
    y = b.one("Conv", [along, b.weight((16, 16, 3), 48)], "conv1d", kernel_shape=[3],
              pads=[1, 1])
    problem = api.prepare(str(save(b.model((1, 12, 16), [r, y], 17), tmp_path, "mlp")))
    layers = tuple(lay.name for lay in problem.graph.layers)
    whole = whole_tile(problem.graph, layers)
    mode = Mode.of(hidden_chunks=2)
    assert mode_problem(problem.graph, layers, whole, mode, whole) is None
    with pytest.raises(PlanningError, match="leaves the group mid-way"):
        hand_plan(problem, [Placement(layers, Tile(whole.n, 5, whole.w), mode)])
    assert_verifies(problem, hand_plan(problem, [Placement(layers, whole, mode)]))


@pytest.mark.parametrize("held", [False, True])
def test_passes_in_hidden_chunks_judge_their_last_pass_outputs(tmp_path: Path,
                                                               held: bool) -> None:
    """An expand / project pair whose projection leaves for a conv outside the group and is
    pooled, squeezed and scaled inside it: in passes the last pass stores the projection
    tile by tile (cut like the scaled map), so passes with hidden chunks keep a cut tile
    and verify, while a cut tile in hidden chunks alone (one pass) is refused."""
    b = _Builder(np.random.default_rng(0))
    c = 8
    x = b.one("Relu", [b.conv("input", 3, c, 3, prefix="stem")])
    p = b.conv(b.one("Relu", [b.conv(x, c, 4 * c, 1, prefix="expand")]), 4 * c, c, 1,
               prefix="project")
    side = b.conv(p, c, c, 3, prefix="side")
    s = b.one("Relu", [b.conv(b.one("GlobalAveragePool", [p], "gap"), c, 4, 1,
                              prefix="se_reduce")])
    s = b.one("HardSigmoid", [b.conv(s, 4, c, 1, prefix="se_expand")], alpha=0.2, beta=0.5)
    out = b.one("Mul", [s, p], "se_scale")
    problem = api.prepare(str(save(b.model((1, 3, 32, 32), [out, side], 13), tmp_path, "se")))
    order = [lay.name for lay in problem.graph.layers]
    head = tuple(order[:2])
    group = tuple(n for n in order[2:] if not n.startswith("side"))
    sides = tuple(n for n in order if n.startswith("side"))
    tile = Tile(1, 16, 32)
    assert_verifies(problem, hand_plan(problem, [
        Placement.of(head, Tile(1, 32, 32)),
        Placement.of(group, tile, passes=2, inputs_held=held, hidden_chunks=2),
        Placement.of(sides, Tile(1, 32, 32))]))
    with pytest.raises(PlanningError, match="leaves the group mid-way"):
        hand_plan(problem, [Placement.of(head, Tile(1, 32, 32)),
                            Placement.of(group, tile, hidden_chunks=2),
                            Placement.of(sides, Tile(1, 32, 32))])
