"""The four planners: shortest path equals CP-SAT on chains, CP-SAT's objective is the plan's
cost, cpsat <= greedy <= layer, CP-SAT is deterministic, every plan verifies in the emulator,
and a chip that cannot hold a layer is a PlanningError naming the layer, level and bytes.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fuseplan.planner.app.api import Problem, plan_problem, prepare, verify
from fuseplan.planner.core.errors import PlanningError
from fuseplan.planner.core.units import fmt_bytes, vs_bytes
from fuseplan.planner.plan.data import Plan
from fuseplan.planner.plan.json_io import plan_to_json, save_plan
from tests import models
from tests.test_rules import ModelStore, describe, with_rules

ROOT = Path(__file__).resolve().parents[1]
FUSEPLAN = ROOT / ".venv" / "bin" / "fuseplan"
SOLVERS = ("cpsat", "shortest-path", "greedy", "layer")


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> ModelStore:
    return ModelStore(tmp_path_factory.mktemp("solver_models"))


def random_chain(rng: np.random.Generator) -> onnx.ModelProto:
    """A random chain CNN (2-8 layers, no skip connections) from tests/models.py's pieces."""
    b = models._Builder(rng)
    c = int(rng.integers(1, 5))
    h, w = (int(v) for v in rng.integers(8, 33, size=2))
    x, shape = "input", (c, h, w)
    for _ in range(int(rng.integers(2, 9))):
        x, shape = models._random_layer(b, rng, x, shape)
    return b.model((1, c, h, w), x, 13, name="random_chain")


def total(plan: Plan, objective: str) -> float:
    t = plan.totals
    return {"traffic": t.dram_bytes, "latency": t.cycles, "energy": t.energy_pj}[objective]


# --------------------------------------------------------------------------- chains


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), batch=st.sampled_from([1, 1, 2]),
       sram=st.sampled_from(["4KiB", "8KiB", "16KiB", "64KiB", "2MiB"]),
       nram=st.sampled_from(["2KiB", "8KiB", "512KiB"]))
def test_shortest_path_equals_cpsat_on_chains(store: ModelStore, seed: int, batch: int,
                                              sram: str, nram: str) -> None:
    """On a chain, intervals are all the groups there are: both planners are exact and must
    agree on the optimum (traffic: DRAM bytes; latency: cycles), and CP-SAT's reported
    objective must be the assembled plan's total. The whole-network and exact-path shortcuts
    are off so the grouping search itself is compared."""
    model = random_chain(np.random.default_rng(seed))
    path = models.save(model, store.root, f"chain_{seed}")
    _, c, h, w = (d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim)
    problem = with_rules(prepare(str(path), None, None, {"input": (batch, c, h, w)},
                                 [f"sram.bytes={sram}", f"nram.bytes={nram}"]),
                         search={"whole_network_first": False, "exact_path_first": False})
    assert all(problem.graph.dag.out_degree(n) <= 1 for n in problem.graph.dag), "not a chain"
    for objective in ("traffic", "latency"):
        try:
            cp = plan_problem(problem, "cpsat", objective)
        except PlanningError as exc:  # a layer that fits nowhere: both must say so
            with pytest.raises(PlanningError, match=re.escape(str(exc).split(":")[0])):
                plan_problem(problem, "shortest-path", objective)
            return
        sp = plan_problem(problem, "shortest-path", objective)
        assert cp.solver["status"] == "OPTIMAL" and sp.solver["status"] == "OPTIMAL"
        assert total(sp, objective) == total(cp, objective), (
            f"{objective}: shortest path {describe(sp)} vs cpsat {describe(cp)}")
        assert cp.solver["objective"] == total(cp, objective), (
            f"{objective}: CP-SAT objective {cp.solver['objective']} vs plan "
            f"{total(cp, objective)}")


def test_no_plan_beats_the_compulsory_floor(tmp_path: Path) -> None:
    """CONTRACT: compulsory_dram_bytes "is the floor no plan can beat". A 1x1 conv feeding a
    3x3 stride-2 conv without padding on a 23x20 input: the second conv never uses column 19,
    so neither does the first, and a fused plan rightly never loads the input's last column.
    The floor must not count it either (it only looks at the input's direct consumer)."""
    from onnx import TensorProto, helper, numpy_helper

    w1 = numpy_helper.from_array(np.ones((4, 4, 1, 1), np.float32), "w1")
    w2 = numpy_helper.from_array(np.ones((8, 4, 3, 3), np.float32), "w2")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["input", "w1"], ["pw_out"], name="pointwise"),
         helper.make_node("Conv", ["pw_out", "w2"], ["out"], name="strided", strides=[2, 2])],
        "edge", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 4, 23, 20])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 8, 11, 9])], [w1, w2])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    path = tmp_path / "edge.onnx"
    onnx.save(model, path)
    problem = prepare(str(path))
    for solver in SOLVERS:
        plan = plan_problem(problem, solver)
        assert plan.totals.dram_bytes >= plan.compulsory_dram_bytes, (
            f"{solver}: plan moves {plan.totals.dram_bytes} B, below the 'compulsory' floor "
            f"{plan.compulsory_dram_bytes} B ({describe(plan)})")


@pytest.mark.parametrize("model", ["chain_cnn", "residual_net", "inception_net", "two_heads"])
@pytest.mark.parametrize("chip", [(), ("sram.bytes=16KiB",), ("sram.bytes=8KiB",
                                                              "nram.bytes=4KiB")],
                         ids=["default", "sram16k", "sram8k-nram4k"])
def test_cpsat_objective_is_the_plan_total(store: ModelStore, model: str,
                                           chip: tuple[str, ...]) -> None:
    """What CP-SAT minimised is exactly what the cost model charges for the plan it returns."""
    problem = store.problem(model, None, chip)
    for objective in ("traffic", "latency"):
        plan = plan_problem(problem, "cpsat", objective)
        assert plan.solver["status"] == "OPTIMAL" and plan.solver["gap"] == 0.0
        assert plan.solver["objective"] == total(plan, objective), describe(plan)
        assert plan.solver["bound"] == plan.solver["objective"]


# --------------------------------------------------------------------------- ordering


def _ordered(problem: Problem, solvers: tuple[str, ...] = SOLVERS) -> dict[str, Plan]:
    plans = {s: plan_problem(problem, s) for s in solvers}
    d = {s: p.totals.dram_bytes for s, p in plans.items()}
    floor = plans["cpsat"].compulsory_dram_bytes
    assert floor <= d["cpsat"] <= d["greedy"] <= d["layer"], d
    assert d["cpsat"] <= d.get("shortest-path", d["cpsat"]), d
    return plans


@pytest.mark.parametrize("model", ["chain_cnn", "residual_net", "inception_net"])
@pytest.mark.parametrize("chip", [(), ("sram.bytes=16KiB",), ("sram.bytes=8KiB",
                                                              "nram.bytes=4KiB")],
                         ids=["default", "sram16k", "sram8k-nram4k"])
def test_cpsat_le_greedy_le_layer_on_test_nets(store: ModelStore, model: str,
                                               chip: tuple[str, ...]) -> None:
    _ordered(store.problem(model, None, chip))


@pytest.mark.parametrize("zoo", ["zoo:squeezenet",
                                 pytest.param("zoo:resnet50", marks=pytest.mark.slow)])
def test_cpsat_le_greedy_le_layer_on_zoo(zoo: str) -> None:
    """Under the default rules and chip; CP-SAT proves optimality (issue 4: within 60 s).
    (The CP-SAT planner runs the shortest path itself for its warm start.)"""
    plans = _ordered(prepare(zoo), ("layer", "greedy", "cpsat"))
    cp = plans["cpsat"]
    gap = cp.solver["gap"]
    assert cp.solver["status"] == "OPTIMAL" or (isinstance(gap, float) and gap <= 0.01), cp.solver
    assert cp.totals.dram_bytes < plans["layer"].totals.dram_bytes / 2


@pytest.mark.parametrize("chip", [(), ("sram.bytes=16KiB",)], ids=["default", "sram16k"])
def test_layer_solver_total_is_the_layer_by_layer_baseline(store: ModelStore,
                                                           chip: tuple[str, ...]) -> None:
    """CONTRACT: layer_by_layer_dram_bytes is "the same model with no fusion", which is what
    `--solver layer` plans; `compare` shows both, so they must be the same number."""
    plan = plan_problem(store.problem("residual_net", None, chip), "layer")
    assert all(not g.fused for g in plan.groups)
    assert plan.totals.dram_bytes == plan.layer_by_layer_dram_bytes, (
        f"layer plan {plan.totals.dram_bytes} B vs layer_by_layer_dram_bytes "
        f"{plan.layer_by_layer_dram_bytes} B: "
        + "; ".join(f"{g.layers[0]} h={g.tile.h}" for g in plan.groups if g.mode == "big"))


def test_whole_network_shortcut(store: ModelStore) -> None:
    """Seed 004: a network that fits on chip (and is not too deep: at most
    search.max_group_layers layers, or any depth where whole-map groups of any length are
    allowed, search.long_whole_map_groups) runs as one group at the compulsory floor, but
    only if the rules allow that group."""
    p = with_rules(prepare(str(store.path("residual_net"))), search={"max_group_layers": 32})
    for solver in ("cpsat", "shortest-path", "greedy"):
        plan = plan_problem(p, solver)
        assert len(plan.groups) == 1 and plan.totals.dram_bytes == plan.compulsory_dram_bytes
    # 17 layers: past max_group_layers, a whole-map group still (the path finds it too)
    deep = with_rules(p, search={"max_group_layers": 12})
    assert plan_problem(deep, "cpsat").solver["status"] == "WHOLE_NETWORK_ON_CHIP"
    found = plan_problem(with_rules(deep, search={"whole_network_first": False}),
                         "shortest-path")
    assert [g.layers for g in found.groups] == [plan.groups[0].layers]
    too_deep = with_rules(deep, search={"long_whole_map_groups": False})
    assert plan_problem(too_deep, "cpsat").solver["status"] != "WHOLE_NETWORK_ON_CHIP"
    strict = with_rules(p, min_main_layers={"k": 50})
    plan = plan_problem(strict, "cpsat")
    assert all(not g.fused for g in plan.groups), describe(plan)


def test_max_group_layers_caps_every_group(store: ModelStore) -> None:
    """search.max_group_layers is the largest group the planners may form, in layers that
    compute (views ride along free); it must hold for the whole-network shortcut too (seed
    004: "if the whole network fits ... and is not too deep"), once whole-map groups of any
    length and block groups are off."""
    p = with_rules(prepare(str(store.path("residual_net"))),
                   search={"max_group_layers": 4, "long_whole_map_groups": False,
                           "max_block_group_layers": 0})
    for solver in ("cpsat", "shortest-path", "greedy"):
        plan = plan_problem(p, solver)
        biggest = max(p.graph.group_size(g.layers) for g in plan.groups)
        assert biggest <= 4, f"{solver}: a {biggest}-layer group with max_group_layers 4: " \
                             f"{describe(plan)} (status {plan.solver['status']})"
        assert all(p.graph.within_limit(g.layers, 4) for g in plan.groups), describe(plan)


# --------------------------------------------------------------------------- determinism


def _canonical(plan: Plan) -> str:
    doc = plan_to_json(plan)
    doc["solver"] = {k: v for k, v in doc["solver"].items() if k != "wall_s"}
    return json.dumps(doc, sort_keys=True)


@pytest.mark.parametrize("model", ["residual_net", "inception_net"])
def test_cpsat_is_deterministic_in_process(store: ModelStore, model: str) -> None:
    problem = store.problem(model, None, ["sram.bytes=16KiB"])
    assert _canonical(plan_problem(problem, "cpsat")) == _canonical(plan_problem(problem, "cpsat"))


def test_cpsat_is_deterministic_across_processes(store: ModelStore) -> None:
    """Same input, fresh interpreters with different hash seeds: the same plan file."""
    path = store.path("residual_net")
    digests = set()
    for hash_seed in ("1", "2"):
        run = subprocess.run(
            [str(FUSEPLAN), "solve", str(path), "--set", "sram.bytes=8KiB", "--set",
             "nram.bytes=4KiB", "--json"], capture_output=True, text=True, timeout=300,
            env={**os.environ, "PYTHONHASHSEED": hash_seed})
        assert run.returncode == 0, run.stderr
        doc = json.loads(run.stdout)
        doc["solver"].pop("wall_s")
        digests.add(hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest())
    assert len(digests) == 1


# --------------------------------------------------------------------------- emulator


CHIPS = {
    "default-whole-network": ((), True),
    "default": ((), False),
    "sram16k": (("sram.bytes=16KiB",), False),
    "two_level-32k": (("sram.bytes=32KiB",), False),
}


@pytest.mark.parametrize("solver", SOLVERS)
@pytest.mark.parametrize("chip", list(CHIPS))
@pytest.mark.parametrize("model", ["residual_net", "inception_net"])
def test_every_plan_verifies_in_the_emulator(store: ModelStore, tmp_path: Path, model: str,
                                             chip: str, solver: str) -> None:
    """Outputs match onnxruntime, every predicted counter equals the emulated one to the byte,
    and no tile overflows a memory."""
    overrides, whole = CHIPS[chip]
    hw = "two_level" if chip.startswith("two_level") else None
    problem = store.problem(model, hw, overrides)
    if whole:
        problem = with_rules(problem, search={"whole_network_first": True})
    plan = plan_problem(problem, solver)
    path = tmp_path / "plan.json"
    save_plan(plan, path)
    report = verify(str(store.path(model)), path)
    assert report.outputs_match, report.first_output_mismatch
    assert report.predicted_matches_emulated, report.first_counter_mismatch
    assert not report.capacity_violations, (
        f"{solver} plan overflows the chip: "
        + "; ".join(v.describe() for v in report.capacity_violations[:3]))
    assert report.emulated.dram_bytes == plan.totals.dram_bytes


# --------------------------------------------------------------------------- infeasible chips


@pytest.mark.parametrize("solver", SOLVERS)
@pytest.mark.parametrize(("hw", "overrides", "level", "needed", "has"), [
    (None, ["sram.bytes=1KiB"], "SRAM", 1088, 1024),
    (None, ["nram.bytes=64"], "NRAM", 272, 64),
    ("two_level", ["sram.bytes=1KiB"], "SRAM", 1536, 1024),
], ids=["sram", "nram", "unified-sram"])
def test_infeasible_chip_names_layer_level_and_bytes(store: ModelStore, solver: str,
                                                     hw: str | None, overrides: list[str],
                                                     level: str, needed: int, has: int) -> None:
    """chain_cnn's conv3 at its smallest tile (one row of 8x32 from 3 rows of 3x32) needs
    (3x3x32 + 8x32) x 2 B = 1088 B on chip, a quarter of it per core in NRAM (2-D tiles,
    off by default, would fit it in 70 B). On the single-memory chip its weights stream
    through the same SRAM: (8x3x3x3 + 8) x 2 B = 448 B in two chunks of 224 B (a chunk is
    at most a quarter of the SRAM), both on chip at once: 1536 B."""
    problem = store.problem("chain_cnn", hw, overrides)
    with pytest.raises(PlanningError) as info:
        plan_problem(problem, solver)
    msg = str(info.value)
    assert "conv3" in msg and level in msg, msg
    # human bytes, exact where the units would hide the difference, and the exact excess
    need_s, has_s = vs_bytes(needed, has)
    assert f"{level} needs {need_s} but has {has_s} ({fmt_bytes(needed - has)} over)" in msg, msg


@pytest.mark.parametrize("model", ["residual_net", "inception_net"])
def test_exact_path_proves_what_cpsat_proves(store: ModelStore, model: str) -> None:
    """Where costs add up and every candidate group is an interval of the layer order, the
    shortest path is exact: CP-SAT is not run, and the plan is the one CP-SAT returns, with
    the same objective; under a latency objective (prefetch couples neighbours) the bounded
    path prices pairs of consecutive groups and proves its plan too, at CP-SAT's cycles."""
    from tests.test_rules import with_rules

    problem = store.problem(model, None, ("sram.bytes=16KiB",))
    shortcut = with_rules(problem, search={"exact_path_first": True})
    fast = plan_problem(shortcut, "cpsat")
    full = plan_problem(problem, "cpsat")
    assert "interval of the layer order" in str(fast.solver.get("solved_by", "")), fast.solver
    assert "solved_by" not in full.solver and full.solver["status"] == "OPTIMAL"
    assert fast.solver["status"] == "OPTIMAL" and fast.solver["gap"] == 0.0
    assert fast.solver["objective"] == fast.solver["bound"] == full.solver["objective"]
    assert [g.placement for g in fast.groups] == [g.placement for g in full.groups]
    timed = plan_problem(shortcut, "cpsat", "latency")
    assert "prefetch" in str(timed.solver.get("solved_by", "")), timed.solver
    timed_full = plan_problem(problem, "cpsat", "latency")
    assert "solved_by" not in timed_full.solver and timed_full.solver["status"] == "OPTIMAL"
    assert timed.totals.cycles == timed_full.totals.cycles


def test_exact_path_is_not_claimed_past_the_intervals_it_searched(tmp_path: Path) -> None:
    """A 12-layer squeeze-excite block with its entry layer is a 13-layer interval that
    CP-SAT weighs. The full interval search (at most 12 layers) never searches it: there
    the shortcut must not claim the path optimal, CP-SAT runs and finds a better plan than
    the path's. The bounded path weighs that interval too (search.prune_by_floor), so its
    shortcut holds and its plan costs what CP-SAT's does, the 13-layer group included."""
    path = str(models.save(models.se_net(h=32, w=32, channels=16, expand=8), tmp_path, "se"))
    small = ("sram.bytes=64KiB", "nram.bytes=16KiB")
    problem = prepare(path, rules=models.fusing_rules(tmp_path), overrides=small)
    assert problem.ruleset.search.max_group_layers == 12
    every = with_rules(problem, search={"exact_path_first": True, "prune_by_floor": False})
    full = with_rules(problem, search={"exact_path_first": False})
    fast, slow = plan_problem(every, "cpsat"), plan_problem(full, "cpsat")
    sp = plan_problem(every, "shortest-path")
    assert "solved_by" not in fast.solver and fast.solver["status"] == "OPTIMAL"
    assert fast.totals.dram_bytes == slow.totals.dram_bytes < sp.totals.dram_bytes
    assert any(len(g.layers) == 13 for g in fast.groups)
    bounded = with_rules(problem, search={"exact_path_first": True, "prune_by_floor": True})
    proven = plan_problem(bounded, "cpsat")
    assert "interval of the layer order" in str(proven.solver.get("solved_by", "")), proven.solver
    assert proven.totals.dram_bytes == slow.totals.dram_bytes
    assert any(len(g.layers) == 13 for g in proven.groups)
