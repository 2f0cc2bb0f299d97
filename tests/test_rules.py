"""The 19 rules of seed 000: check and CP-SAT encoding agree, rule files fail with line:col,
and every rule changes a plan where it binds.

Three parts:

* a property test: for random small CNNs, random groups, chips, tiles and rule parameters,
  each rule's CP-SAT encoding (one candidate, tile fixed) is feasible exactly when the
  rule's ``check`` passes;
* rule-file loading errors (InputError with FILE:LINE:COL and "did you mean");
* one on/off test per rule R03-R19 on a model and chip where the rule binds: turning it off
  (or loosening it) lowers the optimal DRAM traffic, and the looser plan holds a group that
  breaks the rule. R01/R02 only steer the greedy planner and are tested there.

The extra models below (and ``ModelStore``) are shared with tests/test_rule_cases.py.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import numpy as np
import onnx
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from ortools.sat.python import cp_model

from fuseplan.planner.app.api import Problem, plan_problem, prepare, verify_in_memory
from fuseplan.planner.core.errors import InputError
from fuseplan.planner.geometry.regions import Tile
from fuseplan.planner.plan.data import Group, Plan
from fuseplan.planner.plan.mode import Mode
from fuseplan.rules.base import REGISTRY, GroupFacts, Violation
from fuseplan.rules.encoding import Encoding, tile_floor
from fuseplan.rules.ruleset import DEFAULT_RULES, default_ruleset, load_rules
from fuseplan.solver.groups import is_connected, is_convex
from fuseplan.solver.hidden import HiddenSearch
from fuseplan.solver.tiles import GroupSearch
from tests import models
from tests.hand import assert_verifies, hand_plan

ROOT = Path(__file__).resolve().parents[1]
FUSEPLAN = ROOT / ".venv" / "bin" / "fuseplan"

# --------------------------------------------------------------------------- extra models


def _finish(nodes: list[onnx.NodeProto], inits: list[onnx.TensorProto],
            inputs: dict[str, Sequence[int]], outputs: Sequence[str], name: str
            ) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, name,
        [helper.make_tensor_value_info(k, TensorProto.FLOAT, list(v)) for k, v in inputs.items()],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs], inits)
    opsets = [helper.make_opsetid("", 13)]
    model = helper.make_model(graph, opset_imports=opsets, producer_name="fuseplan-tests")
    model.ir_version = helper.find_min_ir_version_for(opsets)
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    for i, out in enumerate(model.graph.output):
        out.type.CopyFrom(inferred.graph.output[i].type)
    onnx.checker.check_model(model, full_check=True)
    return model


def _weight(rng: np.random.Generator, name: str, shape: Sequence[int]) -> onnx.TensorProto:
    arr = rng.standard_normal(shape) * np.sqrt(2.0 / max(int(np.prod(shape[1:])), 1))
    return numpy_helper.from_array(arr.astype(np.float32), name)


def two_heads(seed: int = 0, c: int = 8, h: int = 32, w: int = 32) -> onnx.ModelProto:
    """stem Conv -> Relu feeding two Conv heads that are both graph outputs (no join, no block)."""
    rng = np.random.default_rng(seed)
    inits = [_weight(rng, "w_stem", (c, 3, 3, 3)), _weight(rng, "w_h1", (c, c, 3, 3)),
             _weight(rng, "w_h2", (c, c, 3, 3))]
    nodes = [
        helper.make_node("Conv", ["input", "w_stem"], ["stem_out"], name="stem", pads=[1] * 4),
        helper.make_node("Relu", ["stem_out"], ["stem_relu_out"], name="stem_relu"),
        helper.make_node("Conv", ["stem_relu_out", "w_h1"], ["head1_out"], name="head1",
                         pads=[1] * 4),
        helper.make_node("Conv", ["stem_relu_out", "w_h2"], ["head2_out"], name="head2",
                         pads=[1] * 4),
    ]
    return _finish(nodes, inits, {"input": (1, 3, h, w)}, ["head1_out", "head2_out"],
                   "two_heads")


def dynamic_filter(seed: int = 0) -> onnx.ModelProto:
    """conv1 -> relu1 -> conv2 -> pool2, where conv2's kernel is Relu(second graph input)."""
    rng = np.random.default_rng(seed)
    nodes = [
        helper.make_node("Conv", ["input", "w1"], ["conv1_out"], name="conv1", pads=[1] * 4),
        helper.make_node("Relu", ["conv1_out"], ["relu1_out"], name="relu1"),
        helper.make_node("Relu", ["kernel"], ["kernel_relu_out"], name="kernel_relu"),
        helper.make_node("Conv", ["relu1_out", "kernel_relu_out"], ["conv2_out"], name="conv2",
                         pads=[1] * 4),
        helper.make_node("MaxPool", ["conv2_out"], ["pool2_out"], name="pool2",
                         kernel_shape=[2, 2], strides=[2, 2]),
    ]
    return _finish(nodes, [_weight(rng, "w1", (8, 3, 3, 3))],
                   {"input": (1, 3, 16, 16), "kernel": (8, 8, 3, 3)}, ["pool2_out"],
                   "dynamic_filter")


def shared_weights(seed: int = 0) -> onnx.ModelProto:
    """conv1 -> relu1 -> conv2 -> relu2 -> conv3; conv2 and conv3 use the same kernel tensor."""
    rng = np.random.default_rng(seed)
    inits = [_weight(rng, "w1", (8, 3, 3, 3)), _weight(rng, "w_shared", (8, 8, 3, 3))]
    nodes = [
        helper.make_node("Conv", ["input", "w1"], ["conv1_out"], name="conv1", pads=[1] * 4),
        helper.make_node("Relu", ["conv1_out"], ["relu1_out"], name="relu1"),
        helper.make_node("Conv", ["relu1_out", "w_shared"], ["conv2_out"], name="conv2",
                         pads=[1] * 4),
        helper.make_node("Relu", ["conv2_out"], ["relu2_out"], name="relu2"),
        helper.make_node("Conv", ["relu2_out", "w_shared"], ["conv3_out"], name="conv3",
                         pads=[1] * 4),
    ]
    return _finish(nodes, inits, {"input": (1, 3, 16, 16)}, ["conv3_out"], "shared_weights")


def pool_conv(seed: int = 0, c: int = 16, h: int = 32, w: int = 32, pool: int = 4,
              cout: int = 8, k: int = 3) -> onnx.ModelProto:
    """MaxPool(pool, stride pool) -> Conv(k x k, cout): a big input shrunk at once.

    In small-map mode the input map dominates the SRAM inequalities 13-15 while the live
    peak stays small; ``cout`` sets whether the output (rule 15) or input share (rule 14)
    is the larger term.
    """
    rng = np.random.default_rng(seed)
    nodes = [
        helper.make_node("MaxPool", ["input"], ["pool_out"], name="pool",
                         kernel_shape=[pool] * 2, strides=[pool] * 2),
        helper.make_node("Conv", ["pool_out", "w1"], ["conv_out"], name="conv", pads=[k // 2] * 4),
    ]
    return _finish(nodes, [_weight(rng, "w1", (cout, c, k, k))], {"input": (1, c, h, w)},
                   ["conv_out"], "pool_conv")


def act_first(seed: int = 0) -> onnx.ModelProto:
    """act0 (Relu) -> conv1 -> relu1 -> conv2 -> relu2: the network starts on a non-main layer."""
    rng = np.random.default_rng(seed)
    inits = [_weight(rng, "w1", (8, 3, 3, 3)), _weight(rng, "w2", (8, 8, 3, 3))]
    nodes = [
        helper.make_node("Relu", ["input"], ["act0_out"], name="act0"),
        helper.make_node("Conv", ["act0_out", "w1"], ["conv1_out"], name="conv1", pads=[1] * 4),
        helper.make_node("Relu", ["conv1_out"], ["relu1_out"], name="relu1"),
        helper.make_node("Conv", ["relu1_out", "w2"], ["conv2_out"], name="conv2", pads=[1] * 4),
        helper.make_node("Relu", ["conv2_out"], ["relu2_out"], name="relu2"),
    ]
    return _finish(nodes, inits, {"input": (1, 3, 32, 32)}, ["relu2_out"], "act_first")


BUILDERS: dict[str, Callable[..., onnx.ModelProto]] = {
    "chain_cnn": models.chain_cnn,
    "residual_net": models.residual_net,
    "inception_net": models.inception_net,
    "two_heads": two_heads,
    "dynamic_filter": dynamic_filter,
    "shared_weights": shared_weights,
    "pool_conv": pool_conv,
    "act_first": act_first,
    "causal_encoder": models.causal_encoder,
}


class ModelStore:
    """Builds test models once per session and prepares problems on them.

    Problems come with ``search.whole_network_first`` off: these small models fit the default
    chip whole, and the tests are about how the planners group layers, not about that
    shortcut (tests/test_solvers.py covers it).
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self._paths: dict[str, Path] = {}

    def path(self, builder: str, **kwargs: Any) -> Path:
        key = builder + "".join(f"_{k}{v}" for k, v in sorted(kwargs.items()))
        if key not in self._paths:
            self._paths[key] = models.save(BUILDERS[builder](**kwargs), self.root, key)
        return self._paths[key]

    def problem(self, builder: str, hw: str | None = None, overrides: Sequence[str] = (),
                shapes: dict[str, tuple[int, ...]] | None = None, **kwargs: Any) -> Problem:
        problem = prepare(str(self.path(builder, **kwargs)), None, hw, shapes, list(overrides))
        # CP-SAT itself, rules' encodings included (not the exact-path shortcut)
        return with_rules(problem, search={"whole_network_first": False,
                                           "exact_path_first": False})


@pytest.fixture(scope="session")
def store(tmp_path_factory: pytest.TempPathFactory) -> ModelStore:
    return ModelStore(tmp_path_factory.mktemp("rule_models"))


# --------------------------------------------------------------------------- helpers


def with_rules(problem: Problem, search: dict[str, Any] | None = None,
               **rules: dict[str, Any]) -> Problem:
    """The problem with some rules' parameters (and search settings) replaced."""
    rs = problem.ruleset
    unknown = set(rules) - {r.key for r in rs.rules}
    assert not unknown, f"no such rules: {unknown}"
    # every rule is a frozen dataclass (@rule makes it one; the base class is not)
    new = tuple(replace(cast(Any, r), **rules[r.key]) if r.key in rules else r
                for r in rs.rules)
    s = replace(rs.search, **search) if search else rs.search
    return replace(problem, ruleset=replace(rs, rules=new, search=s))


def bounded(problem: Problem) -> Problem:
    """The problem as these on/off tests were designed: every group capped at
    max_group_layers (no whole-map groups of any length, no block groups), rule 19 binding
    whole maps too (applies_to: all) and rule 10 keeping fused groups' weights resident (no
    streaming), so that each test isolates its one rule."""
    return with_rules(problem, search={"long_whole_map_groups": False,
                                       "max_block_group_layers": 0},
                      stride_redundancy={"applies_to": "all"},
                      weights_fit_wram={"streaming": False})


def group_with(plan: Plan, layer: str) -> Group:
    return next(g for g in plan.groups if layer in g.layers)


def fused(plan: Plan) -> list[Group]:
    return [g for g in plan.groups if g.fused]


def describe(plan: Plan) -> str:
    return "; ".join(f"[{','.join(g.layers)}] {g.mode} h={g.tile.h} n={g.tile.n}"
                     for g in plan.groups) + f" => {plan.totals.dram_bytes} B"


def group_facts(problem: Problem, g: Group) -> GroupFacts:
    """The facts rules see for a planned group (its tile, residency and buffering; a group
    run in hidden chunks holds each hidden map a chunk wide)."""
    db = getattr(g, "double_buffered", False)
    if g.placement.hidden_chunks > 1:
        hidden = HiddenSearch.of(problem.graph, g.layers, problem.chip)
        assert hidden is not None
        return hidden.facts(g.tile, g.weights_resident, db, g.placement.hidden_chunks)
    search = GroupSearch.of(problem.graph, g.layers, problem.chip, problem.ruleset)
    return search.facts(g.tile, g.weights_resident, double_buffered=db,
                        halo_reuse=getattr(g, "halo_reuse", False),
                        cluster_split=g.placement.cluster_split)


def broken(problem: Problem, plan: Plan, key: str) -> list[tuple[Group, Violation]]:
    """Fused groups of `plan` that break rule `key` as configured in `problem`."""
    rule = problem.ruleset.get(key)
    out = []
    for g in fused(plan):
        v = rule.check(group_facts(problem, g))
        if v is not None:
            out.append((g, v))
    return out


def assert_obeys(problem: Problem, plan: Plan) -> None:
    """Every group fits the chip and every fused group passes every enabled rule."""
    bad = []
    for g in plan.groups:
        if g.placement.hidden_chunks > 1:  # capacities from the exact peak (solver.hidden)
            hidden = HiddenSearch.of(problem.graph, g.layers, problem.chip)
            assert hidden is not None
            k, db = g.placement.hidden_chunks, g.double_buffered
            found = hidden.physical(g.tile, g.weights_resident, db, k) + hidden.rule_violations(
                g.tile, g.weights_resident, db, k, problem.ruleset.enabled)
        else:
            search = GroupSearch.of(problem.graph, g.layers, problem.chip, problem.ruleset)
            found = search.violations(g.tile, g.weights_resident,
                                      halo_reuse=getattr(g, "halo_reuse", False),
                                      cluster_split=g.placement.cluster_split)
        bad += [f"group {g.id} [{','.join(g.layers)}] tile {g.tile}: {v}" for v in found]
    assert not bad, "plan breaks the rules it was made under:\n" + "\n".join(bad)


def binds(tight: Problem, loose: Problem, key: str, solver: str = "cpsat"
          ) -> tuple[Plan, Plan]:
    """Plan both; the rule (as configured in `tight`) must cost DRAM bytes and be broken by
    the looser plan, while each plan obeys its own rules."""
    p_tight, p_loose = plan_problem(tight, solver), plan_problem(loose, solver)
    assert_obeys(tight, p_tight)
    assert_obeys(loose, p_loose)
    assert p_loose.totals.dram_bytes < p_tight.totals.dram_bytes, (
        f"{key} does not bind: tight {describe(p_tight)} vs loose {describe(p_loose)}")
    assert broken(tight, p_loose, key), (
        f"the looser plan breaks no {key} constraint: {describe(p_loose)}")
    assert not broken(tight, p_tight, key)
    return p_tight, p_loose


# --------------------------------------------------------------------------- (a) property


def _solve_single(graph: Any, chip: Any, layers: Sequence[str], rule: Any, th: int, tn: int,
                  double_buffered: bool = False) -> tuple[bool, Any]:
    """Encode one rule for one candidate with selected, resident, th, tn and the buffering
    flags fixed; feasible?"""
    enc = Encoding(graph, chip)
    cand = enc.add_candidate(layers)
    m = enc.model
    m.add(cand.selected == 1)
    m.add(cand.resident == 1)
    if hasattr(cand, "double_buffered"):
        m.add(cand.double_buffered == int(double_buffered))
    if not isinstance(cand.th, int):
        m.add(cand.th == th)
    if not isinstance(cand.tn, int):
        m.add(cand.tn == tn)
    lit = m.new_bool_var("rule_lit")
    m.add(lit == 1)
    enc.rule_lits[rule.key] = lit
    rule.encode(enc, cand)
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.max_time_in_seconds = 20
    status = solver.solve(m)
    assert status != cp_model.UNKNOWN, f"CP-SAT undecided for {rule.key} on {layers}"
    return status in (cp_model.OPTIMAL, cp_model.FEASIBLE), cand


RULE_PARAMS = st.fixed_dictionaries({
    "min_main_layers": st.fixed_dictionaries({"k": st.integers(1, 3)}),
    "weights_fit_wram": st.fixed_dictionaries({"split_cout": st.booleans()}),
    "redundancy": st.fixed_dictionaries({"threshold_pct": st.sampled_from([0, 25, 50, 100, 150])}),
    "sram_in_out": st.fixed_dictionaries({"share_buffers": st.booleans()}),
    "submap_fits_nram": st.fixed_dictionaries({"buffers": st.integers(1, 3)}),
    "max_maps": st.fixed_dictionaries({"k": st.integers(1, 4)}),
    "stride_redundancy": st.fixed_dictionaries({"threshold": st.integers(0, 6),
                                                "exempt_whole_blocks": st.booleans()}),
})
# Memory sizes are drawn as a factor of the quantity the rules compare them with, so that
# the random chips sit on both sides of every capacity boundary (and right at it).
FACTORS = st.sampled_from([0.3, 0.6, 0.9, 1.0, 1.05, 1.3, 2.0, 3.0])


def _sized_chip(preset: str, facts: GroupFacts, sram_f: float, sram_ref: int, nram_f: float,
                wram_f: float) -> tuple[Any, list[str]]:
    """The preset with SRAM/NRAM/WRAM sized around this group's needs."""
    from fuseplan.hardware.chip import load_chip

    cores = facts.chip.cores_per_cluster
    sram_refs = [facts.live_peak_bytes, facts.all_fmap_bytes,
                 2 * facts.in_bytes + -(-facts.weight_bytes // cores),
                 facts.in_bytes + facts.live_peak_bytes // cores + facts.weight_bytes]
    overrides = [f"sram.bytes={max(1, int(sram_refs[sram_ref] * sram_f))}"]
    if facts.chip.nram is not None:
        overrides += [f"nram.bytes={max(1, int(2 * -(-facts.live_peak_bytes // cores) * nram_f))}",
                      f"wram.bytes={max(1, int(2 * -(-facts.weight_bytes // cores) * wram_f))}"]
    return load_chip(preset, overrides)[0], overrides


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), batch=st.sampled_from([1, 1, 2, 3]),
       preset=st.sampled_from(["cluster4x4", "manycore", "frustum_npu", "two_level"]),
       sram_f=FACTORS, sram_ref=st.integers(0, 3), nram_f=FACTORS, wram_f=FACTORS,
       params=RULE_PARAMS, data=st.data())
def test_check_and_encode_agree(store: ModelStore, seed: int, batch: int, preset: str,
                                sram_f: float, sram_ref: int, nram_f: float, wram_f: float,
                                params: dict[str, dict[str, Any]], data: st.DataObject) -> None:
    """For every rule: CP-SAT finds the fixed tile feasible iff check() reports no violation."""
    model = models.random_cnn(np.random.default_rng(seed))
    path = models.save(model, store.root, f"random_{seed}")
    _, c, h, w = (d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim)
    problem = prepare(str(path), None, preset, {"input": (batch, c, h, w)})
    graph = problem.graph
    order = [lay.name for lay in graph.layers]
    groups = [order[i:j] for i in range(len(order))
              for j in range(i + 2, min(len(order), i + 6) + 1)
              if is_connected(graph, order[i:j]) and is_convex(graph, order[i:j])]
    assume(groups)
    layers = data.draw(st.sampled_from(groups), label="group")
    probe = Encoding(graph, problem.chip).add_candidate(layers)
    n, full_h, full_w = probe.extent
    if isinstance(probe.th, int):
        heights = [probe.th]
        drawn = probe.th
    else:  # the smallest tiles (most halo), a random one and the tallest ones (small mode)
        drawn = data.draw(st.integers(probe.th_low, full_h), label="tile h")
        heights = sorted({probe.th_low, min(probe.th_low + 1, full_h), drawn,
                          max(probe.th_low, full_h - 1), full_h})
    tn = probe.tn if isinstance(probe.tn, int) else data.draw(
        st.integers(tile_floor(probe.chains, probe.io, graph, 0) or 1, n), label="tile n")
    chip, overrides = _sized_chip(
        preset, GroupFacts(graph, probe.io, probe.chains, Tile(tn, drawn, full_w), problem.chip),
        sram_f, sram_ref, nram_f, wram_f)
    near = data.draw(st.sampled_from([None, 0, 1]), label="redundancy threshold near the tile's")
    if near is not None:  # floor(pct) is broken by the tile, floor(pct) + 1 is not
        pct = GroupFacts(graph, probe.io, probe.chains, Tile(tn, drawn, full_w),
                         chip).redundancy_pct()
        params = {**params, "redundancy": {"threshold_pct": max(0, int(pct) + near)}}
    rules = [replace(cast(Any, r), enabled=True, **params.get(r.key, {}))
             for r in default_ruleset().rules]
    assert len(rules) == 19
    double_buffered = data.draw(st.booleans(), label="double buffered")
    # halo-reusing and 2-D tiles are chosen in Python and pinned in CP-SAT (solver.cpsat),
    # where rules are the same bound formulas of the pinned tile: only recompute row tiles
    # have tile variables to check here
    disagree = []
    for th in heights:
        facts = GroupFacts(graph, probe.io, probe.chains, Tile(tn, th, full_w), chip,
                           Mode.of(double_buffered=double_buffered))
        for rule in rules:
            feasible, _ = _solve_single(graph, chip, layers, rule, th, tn, double_buffered)
            violation = rule.check(facts)
            if feasible != (violation is None):
                disagree.append(f"tile n={tn} h={th} double_buffered={double_buffered}: "
                                f"{rule.code} {rule.key}: CP-SAT "
                                f"{'feasible' if feasible else 'infeasible'}, check says "
                                f"{violation or 'ok'}")
    assert not disagree, (
        f"check/encode disagree on group {layers} (anchor {n}x{full_h}x{full_w}) on {preset} "
        f"{overrides}:\n" + "\n".join(disagree))


# --------------------------------------------------------------------------- (b) rule files


def write(tmp_path: Path, text: str, name: str = "rules.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize(("text", "pattern"), [
    pytest.param("rules:\n  single_outptu: {enabled: true}\n",
                 r"rules\.yaml:2:3: unknown rule `single_outptu`\. Did you mean 'single_output'\?"
                 r".*Valid rules:.*stride_redundancy", id="unknown-rule"),
    pytest.param("rules:\n  redundancy: {treshold_pct: 50}\n",
                 r"rules\.yaml:2:16: unknown key `treshold_pct` in rule `redundancy`\. "
                 r"Did you mean 'threshold_pct'\?", id="unknown-key"),
    pytest.param("rules:\n  redundancy: {threshold_pct: lots}\n",
                 r"rules\.yaml:2:31: `threshold_pct` must be an integer, got 'lots'",
                 id="wrong-type"),
    pytest.param("rules:\n  sram_in_out: {share_buffers: 3}\n",
                 r"rules\.yaml:2:32: `share_buffers` must be .*(true|bool).*got 3",
                 id="wrong-type-bool"),
    pytest.param("rulez:\n  redundancy: {}\n",
                 r"rules\.yaml:1:1: unknown section `rulez`\. Did you mean 'rules'\?",
                 id="unknown-section"),
    pytest.param("rules:\n  start_rule: {start: first_conv}\n",
                 r"rules\.yaml:2:23: .*`start`.*first_unfused.*first_main", id="bad-choice"),
    pytest.param("rules:\n  max_maps: {k: 0}\n",
                 r"rules\.yaml:2:17: `k` must be at least 1, got 0", id="below-minimum"),
    pytest.param("rules:\n  redundancy: 50\n",
                 r"rules\.yaml:2:3: rule `redundancy` needs a mapping of settings",
                 id="rule-not-mapping"),
    pytest.param("search:\n  max_group_layer: 4\n",
                 r"rules\.yaml:2:3: unknown key `max_group_layer` in search settings\. "
                 r"Did you mean 'max_group_layers'\?", id="search-key"),
])
def test_rule_file_errors(tmp_path: Path, text: str, pattern: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(InputError, match=pattern) as info:
        load_rules(path)
    assert "\n\n" not in str(info.value), "the message must be one paragraph"


def test_default_yaml_spells_out_the_class_defaults() -> None:
    """rules/default.yaml configures all 19 rules exactly as the rule classes default them."""
    loaded = load_rules(DEFAULT_RULES)
    assert [r.code for r in loaded.rules] == [f"R{i:02d}" for i in range(1, 20)]
    assert loaded.rules == default_ruleset().rules
    assert {r.key for r in loaded.rules if not r.enabled} == {"main_main_nonmain",
                                                              "scalar_then_vector"}
    assert len(REGISTRY) == 19


def test_partial_rule_file_keeps_other_defaults(tmp_path: Path) -> None:
    rs = load_rules(write(tmp_path, "rules:\n  redundancy: {threshold_pct: 50}\n"
                                    "  max_maps:\n"))
    assert rs.get("redundancy").threshold_pct == 50  # type: ignore[attr-defined]
    assert rs.get("max_maps") == default_ruleset().get("max_maps")
    assert rs.get("stride_redundancy").threshold == 4  # type: ignore[attr-defined]
    assert len(rs.sha256) == 64


def test_cli_rules_check_lists_19_rules() -> None:
    run = subprocess.run([str(FUSEPLAN), "rules", "check", "rules/default.yaml", "--json"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    doc = json.loads(run.stdout)
    assert [r["code"] for r in doc["rules"]] == [f"R{i:02d}" for i in range(1, 20)]
    assert {r["key"] for r in doc["rules"]} == set(REGISTRY)
    table = subprocess.run([str(FUSEPLAN), "rules", "check", "rules/default.yaml"], cwd=ROOT,
                           capture_output=True, text=True, timeout=120,
                           env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})
    assert table.returncode == 0, table.stderr
    assert "17 of 19 rules enabled" in table.stdout
    for key in REGISTRY:
        assert key in table.stdout, f"rule {key} missing from the table"


def test_cli_rules_check_bad_file_exit_2(tmp_path: Path) -> None:
    path = write(tmp_path, "rules:\n  redundancy: {treshold_pct: 50}\n", "bad.yaml")
    run = subprocess.run([str(FUSEPLAN), "rules", "check", str(path)], capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 2
    assert re.search(r"bad\.yaml:2:16", run.stderr.replace("\n", " "))
    assert "Traceback" not in run.stderr


# --------------------------------------------------------------------------- (c) on/off
# Plans are compared under the same chip; "tight" has the rule on (or stricter).


def test_r01_start_rule_changes_the_greedy_plan(store: ModelStore) -> None:
    """first_unfused starts on the leading Relu and fuses all five layers; first_main starts on
    conv1, so the Relu before it is left alone and its output round-trips through DRAM."""
    p = store.problem("act_first")
    a = plan_problem(with_rules(p, start_rule={"start": "first_unfused"}), "greedy")
    b = plan_problem(with_rules(p, start_rule={"start": "first_main"}), "greedy")
    assert [g.layers for g in a.groups] == [("act0", "conv1", "relu1", "conv2", "relu2")]
    assert [g.layers for g in b.groups] == [("act0",), ("conv1", "relu1", "conv2", "relu2")]
    act0_bytes = 3 * 32 * 32 * p.chip.dtype_bytes
    assert b.totals.dram_bytes == a.totals.dram_bytes + 2 * act0_bytes


def test_r02_direction_changes_the_greedy_plan(store: ModelStore) -> None:
    """With first_main, forward_first pulls the unfused Relu before conv1 into its group."""
    p = with_rules(store.problem("act_first"), start_rule={"start": "first_main"})
    back = plan_problem(with_rules(p, direction={"direction": "backward"}), "greedy")
    fwd = plan_problem(with_rules(p, direction={"direction": "forward_first"}), "greedy")
    assert len(back.groups) == 2 and len(fwd.groups) == 1, (describe(back), describe(fwd))
    assert fwd.totals.dram_bytes < back.totals.dram_bytes


def test_r01_r02_do_not_change_cpsat(store: ModelStore) -> None:
    """Start rule and direction steer only the greedy search; CP-SAT searches all groupings."""
    p = store.problem("act_first")
    a = plan_problem(p, "cpsat")
    b = plan_problem(with_rules(p, start_rule={"start": "first_main"},
                                direction={"direction": "forward_first"}), "cpsat")
    assert a.totals.dram_bytes == b.totals.dram_bytes


def test_r03_blocks_first(store: ModelStore) -> None:
    """The 14-layer Inception block exceeds max_group_layers (12), so it cannot be fused
    whole: with blocks_first (without branch tails), no group may take part of it together
    with the AveragePool after it. Off, CP-SAT fuses concat's branch tail with the pool."""
    p = bounded(store.problem("inception_net"))
    strict = with_rules(p, blocks_first={"branch_tails": False})
    tight, loose = binds(strict, with_rules(p, blocks_first={"enabled": False}),
                         "blocks_first")
    pool = group_with(loose, "averagepool32")
    assert "concat31" in pool.layers and len(pool.layers) > 2
    assert group_with(tight, "averagepool32").layers == ("averagepool32",)


def test_r03_branch_tails(store: ModelStore) -> None:
    """With branch_tails (the default) a group may start inside a block it leaves and go
    on past its exit, nothing before the block: the Inception block's branch tail with its
    concat and the AveragePool after it, as with blocks_first off (verified). A group
    entering the block (branch heads) or leaving it passes; one holding layers before the
    block and after it, and part of it, still breaks the rule."""
    p = bounded(store.problem("inception_net"))
    assert p.ruleset.get("blocks_first").branch_tails  # type: ignore[attr-defined]
    _, loose = binds(with_rules(p, blocks_first={"branch_tails": False}), p, "blocks_first")
    assert "concat31" in group_with(loose, "averagepool32").layers
    assert_verifies(p, loose)
    g = p.graph
    block = next(b for b in g.blocks if b.exit == "concat31")
    first = min(block.layers, key=g.index)
    before = g.layers[g.index(first) - 1].name
    rule = p.ruleset.get("blocks_first")
    for layers, cut in (([before, first], False), (["concat31", "averagepool32"], False),
                        ([before, first, "concat31", "averagepool32"], True)):
        facts = GroupSearch.of(g, layers, p.chip, p.ruleset).facts(Tile(1, 1, 1), True)
        assert (rule.check(facts) is not None) == cut, layers


def test_r04_single_output(store: ModelStore) -> None:
    """two_heads: the only multi-main group is the stem's Relu with both heads, which writes
    two tensors; single_output without tiled_outputs forbids it and nothing fuses."""
    p = store.problem("two_heads")
    strict = with_rules(p, single_output={"tiled_outputs": False})
    tight, loose = binds(strict, with_rules(p, single_output={"enabled": False}),
                         "single_output")
    assert fused(tight) == []
    assert any(len(g.layers) >= 3 and {"head1", "head2"} <= set(g.layers) for g in fused(loose))


def test_r04_tiled_outputs(store: ModelStore) -> None:
    """two_heads' heads have the same rows and columns and the group reads neither: with
    tiled_outputs (the default) they count as one output, the group fuses, its tiles cut
    both heads alike (each tile stores its box of each), and the plan verifies."""
    p = store.problem("two_heads")
    assert p.ruleset.get("single_output").tiled_outputs  # type: ignore[attr-defined]
    tight, loose = binds(with_rules(p, single_output={"tiled_outputs": False}), p,
                         "single_output")
    group = next(g for g in fused(loose) if {"head1", "head2"} <= set(g.layers))
    assert group.tile.h < p.graph.dims("head1_out")[2]  # tiled, not one whole tile
    report = verify_in_memory(p, loose)
    assert report.outputs_match and report.predicted_matches_emulated


def test_r05_min_main_layers(store: ModelStore) -> None:
    """With groups capped at 2 layers, k=2 leaves residual_net unfused; k=1 allows conv+relu."""
    p = with_rules(store.problem("residual_net"),
                   search={"max_group_layers": 2, "long_whole_map_groups": False,
                           "max_block_group_layers": 0})
    tight, loose = binds(p, with_rules(p, min_main_layers={"k": 1}), "min_main_layers")
    assert fused(tight) == []
    assert len(fused(loose)) >= 5
    assert all(sum(p.graph.layer(n).is_main for n in g.layers) == 1 for g in fused(loose))


def test_r05_movement_groups(store: ModelStore) -> None:
    """A transformer's qkv split into heads (Reshape, Transpose, Split, Squeeze) is movement
    only: with movement_groups on (the default) those layers may run as one group, or with
    the one projection they carry, keeping each arrangement on chip; off, each runs alone
    and writes its map. The looser plan verifies."""
    p = store.problem("causal_encoder", overrides=["sram.bytes=16KiB"], tokens=128, width=32,
                      heads=2)
    assert p.ruleset.get("min_main_layers").movement_groups  # type: ignore[attr-defined]
    tight, loose = binds(with_rules(p, min_main_layers={"movement_groups": False}), p,
                         "min_main_layers")

    def computing(g: Group) -> int:
        return sum(p.graph.layer(n).op_class.value != "movement" for n in g.layers)

    moving = [g for g in fused(loose) if computing(g) <= 1]
    assert moving and not [g for g in fused(tight) if computing(g) <= 1]
    report = verify_in_memory(p, loose)
    assert report.outputs_match and report.predicted_matches_emulated


def test_r06_main_main_nonmain(store: ModelStore) -> None:
    """chain_cnn has no main->main adjacency before the pool (conv-relu-conv-relu-pool), so
    turning rule 6 on breaks its first group; every group left has maxpool->conv->bn."""
    p = bounded(store.problem("chain_cnn"))
    tight, loose = binds(with_rules(p, main_main_nonmain={"enabled": True}), p,
                         "main_main_nonmain")
    assert {"conv3", "conv7", "maxpool9"} <= set(group_with(loose, "conv3").layers)
    assert group_with(tight, "conv3").layers == ("conv3",)
    for g in fused(tight):
        assert {"maxpool9", "conv12", "bn17"} <= set(g.layers), describe(tight)


def test_r07_scalar_then_vector(store: ModelStore) -> None:
    """chain_cnn has no scalar layer: with rule 7 on nothing may fuse (layer-by-layer bytes);
    on residual_net every fused group holds an Add -> Relu pair."""
    p = store.problem("chain_cnn")
    tight, _ = binds(with_rules(p, scalar_then_vector={"enabled": True}), p, "scalar_then_vector")
    assert fused(tight) == []
    assert tight.totals.dram_bytes == tight.layer_by_layer_dram_bytes
    r = with_rules(store.problem("residual_net"), scalar_then_vector={"enabled": True})
    plan = plan_problem(r, "cpsat")
    assert_obeys(r, plan)
    assert fused(plan), describe(plan)
    for g in fused(plan):
        assert ("add16" in g.layers and "relu17" in g.layers) or \
            ("add32" in g.layers and "relu33" in g.layers), describe(plan)


def test_r08_conv_weights_not_computed(store: ModelStore) -> None:
    """conv2's kernel is Relu(kernel input): rule 8 keeps conv2 alone; off, one group fuses all."""
    p = store.problem("dynamic_filter")
    tight, loose = binds(p, with_rules(p, conv_weights_not_computed={"enabled": False}),
                         "conv_weights_not_computed")
    assert group_with(tight, "conv2").layers == ("conv2",)
    assert len(group_with(loose, "conv2").layers) > 1


def test_r09_conv_weights_not_shared(store: ModelStore) -> None:
    """conv2 and conv3 share one kernel tensor: rule 9 keeps both alone; off, they fuse."""
    p = store.problem("shared_weights")
    tight, loose = binds(p, with_rules(p, conv_weights_not_shared={"enabled": False}),
                         "conv_weights_not_shared")
    assert group_with(tight, "conv2").layers == ("conv2",)
    assert group_with(tight, "conv3").layers == ("conv3",)
    assert {"conv2", "conv3"} <= set(group_with(loose, "conv3").layers)


def test_r10_weights_fit_wram(store: ModelStore) -> None:
    """With 128 B of WRAM per core, no fused group's weights fit: rule 10 forbids fusion;
    off, the first convs fuse and stream their weights once per tile. (Split over the
    clusters, a quarter of them would fit: no cluster split here.)"""
    p = store.problem("chain_cnn", None, ["sram.bytes=8KiB", "nram.bytes=4KiB",
                                          "wram.bytes=128"])
    p = with_rules(p, weights_fit_wram={"streaming": False}, search={"cluster_split": False})
    tight, loose = binds(p, with_rules(p, weights_fit_wram={"enabled": False}),
                         "weights_fit_wram")
    # a layer may still fuse with the views around it (flatten20 -> fc23: rule 5's
    # movement_groups), which fuses no second layer's weights with its own
    assert all(sum(p.graph.layer(n).op_class.value != "movement" for n in g.layers) <= 1
               for g in fused(tight))
    streamed = [g for g in fused(loose) if not g.weights_resident]
    assert streamed, describe(loose)
    assert any(g.predicted.weight_read_bytes > 0 and g.tile.h < 16 for g in streamed)


def test_r10_split_cout(store: ModelStore) -> None:
    """512 B of WRAM holds a quarter of conv3+conv7's 1616 B of weights, not all of them:
    without the C_out split over 4 cores the group cannot keep its weights resident."""
    # weights held whole (hidden chunks would stream conv3's and conv7's slices instead,
    # a cluster split spread them over the clusters)
    p = with_rules(store.problem("chain_cnn", None, ["sram.bytes=8KiB", "nram.bytes=4KiB",
                                                     "wram.bytes=512"]),
                   search={"hidden_chunks": False, "cluster_split": False})
    tight, loose = binds(with_rules(p, weights_fit_wram={"split_cout": False}), p,
                         "weights_fit_wram")
    assert {"conv3", "conv7"} <= set(group_with(loose, "conv3").layers)
    assert group_with(tight, "conv3").layers != group_with(loose, "conv3").layers


def test_r11_redundancy(store: ModelStore) -> None:
    """residual_net on a 7 KiB SRAM runs its second bottleneck in one-row tiles; with relu17
    in front, the tiles re-read the stride-2 halos. A zero threshold forbids that group.
    (Halos recomputed: reusing them re-reads nothing.)"""
    p = with_rules(store.problem("residual_net", None, ["sram.bytes=7KiB", "nram.bytes=4KiB"]),
                   search={"halo_reuse": False})
    tight, loose = binds(with_rules(p, redundancy={"threshold_pct": 0}), p, "redundancy")
    assert {"relu17", "conv_a20", "relu33"} <= set(group_with(loose, "relu17").layers)
    assert group_with(tight, "relu17").layers == ("relu17",)
    assert len(tight.groups) > len(loose.groups)


def test_r11_threshold_is_monotone(store: ModelStore) -> None:
    """Tightening the redundancy threshold never lowers the optimal traffic (halos
    recomputed, which is what the threshold limits)."""
    p = with_rules(store.problem("residual_net", None, ["sram.bytes=8KiB", "nram.bytes=4KiB"]),
                   search={"halo_reuse": False})
    costs = [plan_problem(with_rules(p, redundancy={"threshold_pct": t}), "cpsat")
             .totals.dram_bytes for t in (150, 100, 50, 25, 0)]
    assert costs == sorted(costs), costs
    assert costs[-1] > costs[0], costs


def test_r12_sram_in_out_share_buffers(store: ModelStore) -> None:
    """On an 8 KiB SRAM the second bottleneck fits as one group only if tensors free their
    space after their last use (share_buffers: true); holding all at once splits it."""
    # row tiles only, maps whole: 2-D tiles or hidden chunks would fit the block either way
    p = with_rules(store.problem("residual_net", None, ["sram.bytes=8KiB", "nram.bytes=4KiB"]),
                   search={"two_d_tiles": False, "hidden_chunks": False})
    tight, loose = binds(with_rules(p, sram_in_out={"share_buffers": False}), p, "sram_in_out")
    block = ("conv_a20", "relu21", "conv_b24", "relu25", "conv_c28", "proj31", "add32")
    assert set(block) <= set(group_with(loose, "conv_a20").layers)
    assert not set(block) <= set(group_with(tight, "conv_a20").layers)
    assert len(tight.groups) > len(loose.groups)


def test_r13_small_double_buffer(store: ModelStore) -> None:
    """On a 7 KiB SRAM the head group (conv12..fc23, whole maps only) needs
    W_i + 2 x 4 KiB of input: rule 13 leaves those layers unfused."""
    p = store.problem("chain_cnn", None, ["sram.bytes=7KiB", "nram.bytes=4KiB",
                                          "wram.bytes=2KiB"])
    tight, loose = binds(p, with_rules(p, small_double_buffer={"enabled": False}),
                         "small_double_buffer")
    assert group_with(tight, "conv12").layers == ("conv12",)
    head = group_with(loose, "conv12")
    assert head.mode == "small" and "fc23" in head.layers


def _whole_maps_pool_conv(store: ModelStore, sram: str, cout: int) -> Problem:
    """pool_conv on a 4x128 input with rule 13 off and row tiles only (2-D tiles would let
    [pool, conv] avoid whole maps, where rules 14 and 15 apply)."""
    return with_rules(store.problem("pool_conv", None, [sram], h=4, w=128, cout=cout),
                      small_double_buffer={"enabled": False}, search={"two_d_tiles": False})


def test_r14_small_submap_buffer(store: ModelStore) -> None:
    """pool_conv on a 4x128 input: the conv's output has one row, so [pool, conv] runs only as
    whole maps. Live peak 17408 B fits 20 KiB, but IN/4 + W_i + IN = 4096 + 576 + 16384 =
    21056 B does not: with rule 13 off, rule 14 alone keeps the pool's output in DRAM."""
    p = _whole_maps_pool_conv(store, "sram.bytes=20KiB", 8)
    tight, loose = binds(p, with_rules(p, small_submap_buffer={"enabled": False}),
                         "small_submap_buffer")
    assert fused(tight) == []
    assert [(g.layers, g.mode) for g in loose.groups] == [(("pool", "conv"), "small")]
    pool_out = 16 * 1 * 32 * p.chip.dtype_bytes
    assert tight.totals.dram_bytes - loose.totals.dram_bytes == 2 * pool_out


def test_r15_small_subout_buffer(store: ModelStore) -> None:
    """pool_conv on a 4x128 input with 288 output channels: OUT/4 + W_i + IN = 4608 + 20736 +
    16384 = 41728 B > 41500 B of SRAM, while rule 14 needs 41216 B. With rule 13 off, rule 15
    alone keeps [pool, conv] apart (and turning rule 14 off changes nothing)."""
    p = _whole_maps_pool_conv(store, "sram.bytes=41500", 288)
    assert plan_problem(with_rules(p, small_submap_buffer={"enabled": False}),
                        "cpsat").totals.dram_bytes == plan_problem(p, "cpsat").totals.dram_bytes
    tight, loose = binds(p, with_rules(p, small_subout_buffer={"enabled": False}),
                         "small_subout_buffer")
    assert fused(tight) == []
    assert [(g.layers, g.mode) for g in loose.groups] == [(("pool", "conv"), "small")]


@pytest.mark.parametrize("n", [1, 2])
def test_r16_wram_double_buffer(store: ModelStore, n: int) -> None:
    """The head group conv12..fc23 (ends in a Gemm: whole maps only) has 2804 B of weights, 701 B
    per core: 1 KiB of WRAM holds one share (rule 10) but not two (rule 16), which it needs
    with both images of batch 2 in the on-chip map; with one image (batch 1) nothing
    pipelines between sub-maps and the rule does not bind (seed 000 ¶135)."""
    p = bounded(store.problem("chain_cnn", None, ["wram.bytes=1KiB", "clusters=1"], n=n))
    off = with_rules(p, wram_double_buffer={"enabled": False})
    if n == 1:
        on, without = plan_problem(p, "cpsat"), plan_problem(off, "cpsat")
        assert on.totals.dram_bytes == without.totals.dram_bytes
        assert not broken(p, on, "wram_double_buffer")
        assert "fc23" in group_with(on, "conv12").layers
        return
    # batch 2: the rule's remedy is fewer maps on chip (seed 000 ¶137): the head fuses with
    # one image per on-chip map (resident weights are read once either way), and the same
    # group with both images breaks the rule
    on = plan_problem(p, "cpsat")
    head = group_with(on, "conv12")
    assert head.mode == "small" and "fc23" in head.layers and head.tile.n == 1
    assert not broken(p, on, "wram_double_buffer")
    both = hand_plan(p, [replace(head.placement, tile=replace(head.tile, n=2))])
    assert [g.layers for g, _ in broken(p, both, "wram_double_buffer")] == [head.layers]


def test_r17_submap_fits_nram(store: ModelStore) -> None:
    """2 KiB of NRAM per core: the head group's whole maps (live peak 6 KiB: 1536 B per core)
    fit one buffer (the default) but not two."""
    p = bounded(store.problem("chain_cnn", None, ["sram.bytes=12KiB", "nram.bytes=2KiB"]))
    tight, loose = binds(with_rules(p, submap_fits_nram={"buffers": 2}), p, "submap_fits_nram")
    assert group_with(tight, "conv12").layers == ("conv12",)
    head = group_with(loose, "conv12")
    assert head.mode == "small" and "fc23" in head.layers


def test_r18_max_maps(store: ModelStore) -> None:
    """Batch 8 with weights streamed (64 B WRAM, rules 10 and 16 off) on one cluster: each
    tile re-reads the weights (a round is one tile), so fewer images per small-mode map
    means more tiles and more weight traffic."""
    # WRAM too small for the groups' resident weights, large enough for one output channel
    # of streamed weights (146 B) per chunk
    base = with_rules(store.problem("chain_cnn", None, ["wram.bytes=160", "clusters=1"], n=8),
                      weights_fit_wram={"enabled": False}, wram_double_buffer={"enabled": False})
    plans = {k: plan_problem(with_rules(base, max_maps={"k": k}), "cpsat") for k in (1, 2, 8)}
    for k, plan in plans.items():
        small = [g for g in fused(plan) if g.mode == "small"]
        assert all(g.tile.n <= k for g in small), (k, describe(plan))
    weights = [plans[k].totals.weight_read_bytes for k in (1, 2, 8)]
    assert weights[0] > weights[1] > weights[2], weights
    tight, loose = binds(with_rules(base, max_maps={"k": 2}), with_rules(base, max_maps={"k": 8}),
                         "max_maps")
    assert any(g.mode == "small" and g.tile.n == 8 for g in fused(loose))


def test_r19_stride_redundancy_threshold(store: ModelStore) -> None:
    """chain_cnn's conv3 and conv7 (3x3, stride 1) add 2 each: threshold 4 lets them share a
    group, threshold 1 splits them (applies_to: all: whole maps are bound too)."""
    p = with_rules(bounded(store.problem("chain_cnn")), stride_redundancy={"applies_to": "all"})
    tight, loose = binds(with_rules(p, stride_redundancy={"threshold": 1, "applies_to": "all"}),
                         p, "stride_redundancy")
    assert len(loose.groups) == 2
    assert len(tight.groups) > 2
    assert group_with(tight, "conv3").layers != group_with(tight, "conv7").layers


def test_r19_whole_block_exemption(store: ModelStore) -> None:
    """The whole Inception block sums (k - s) to 8 > 4 but is exempt; without the exemption
    (and with groups up to 16 layers) it cannot be one group."""
    p = with_rules(store.problem("inception_net"),
                   search={"max_group_layers": 16, "long_whole_map_groups": False},
                   stride_redundancy={"applies_to": "all"})
    block = set(p.graph.blocks[0].layers)
    tight, loose = binds(with_rules(p, stride_redundancy={"exempt_whole_blocks": False,
                                                          "applies_to": "all"}), p,
                         "stride_redundancy")
    assert any(block <= set(g.layers) for g in loose.groups), describe(loose)
    assert not any(block <= set(g.layers) for g in tight.groups), describe(tight)


def test_r19_applies_to_recompute_exempts_what_recomputes_nothing(store: ModelStore) -> None:
    """With threshold 1, applies_to: all splits chain_cnn's convs; applies_to: recompute (the
    default) lets groups that hold whole maps or reuse halos keep them together, and only
    such groups break the stride sum."""
    p = bounded(store.problem("chain_cnn"))
    tight, loose = binds(with_rules(p, stride_redundancy={"threshold": 1, "applies_to": "all"}),
                         with_rules(p, stride_redundancy={"threshold": 1,
                                                          "applies_to": "recompute"}),
                         "stride_redundancy")
    for g, _ in broken(with_rules(p, stride_redundancy={"threshold": 1, "applies_to": "all"}),
                       loose, "stride_redundancy"):
        assert g.mode == "small" or g.halo_reuse, describe(loose)


def test_rules_are_all_covered() -> None:
    """Every registered rule has an on/off test in this file."""
    names = {n for n in globals() if n.startswith("test_r")}
    for i in range(1, 20):
        assert any(n.startswith(f"test_r{i:02d}") for n in names), f"no test for R{i:02d}"


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
