"""A long chain of small layers plans in memory that grows slowly with its length (issue 43:
a 2,000-layer chain needed 6 GiB). Every whole-map start's groups share its run of layers
instead of a copy per end (solver.bounded_path.Edge.span): a 600-layer chain took 486 MiB,
now about 200 MiB; the 2,000-layer one 11.2 GiB, now 1.2 GiB, with the same plans."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from fuseplan.planner.app.api import prepare
from fuseplan.planner.app.assemble import prefetch_eligible
from fuseplan.planner.cost.objective import Objective
from fuseplan.planner.geometry.hidden import chunkable_maps, narrowed_stretches
from fuseplan.planner.geometry.regions import Tile, group_chains, group_io, tiled_like_anchor
from fuseplan.planner.ir.graph import Graph
from fuseplan.rules.base import GroupFacts
from fuseplan.rules.min_main_layers import MinMainLayers
from fuseplan.solver.hidden import HiddenSearch
from fuseplan.solver.long_groups import _choice, whole_map_starts
from tests import models
from tests.peak import peak_run

FUSEPLAN = Path(__file__).resolve().parent.parent / ".venv" / "bin" / "fuseplan"


def _chain(convs: int, channels: int = 8, size: int = 32, scale: float = 0.1
           ) -> onnx.ModelProto:
    """x -> (3x3 conv -> ReLU) * convs on a `channels` x size x size map (8 x 32 x 32: every
    prefix fits on chip whole)."""
    rng = np.random.default_rng(0)
    nodes, inits, prev = [], [], "x"
    for i in range(convs):
        inits.append(numpy_helper.from_array((rng.standard_normal(
            (channels, channels, 3, 3)) * scale).astype(np.float32), f"w{i}"))
        nodes.append(helper.make_node("Conv", [prev, f"w{i}"], [f"c{i}"], name=f"conv{i}",
                                      pads=[1] * 4))
        nodes.append(helper.make_node("Relu", [f"c{i}"], [f"r{i}"], name=f"relu{i}"))
        prev = f"r{i}"
    shape = [1, channels, size, size]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, shape)], [helper.make_tensor_value_info(
            prev, TensorProto.FLOAT, shape)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def _solved(tmp_path: Path, model: onnx.ModelProto, layers: int) -> tuple[dict[str, Any], int]:
    """`fuseplan solve --json` of the model: its plan, every layer in it, and the command's
    peak resident MiB."""
    path = tmp_path / "chain.onnx"
    onnx.save(model, path)
    run = peak_run([str(FUSEPLAN), "solve", str(path), "--json"], tmp_path, tmp_path, 900)
    assert run.code == 0, run.stderr
    plan = json.loads(run.stdout)
    assert sum(len(g["layers"]) for g in plan["groups"]) == layers
    return plan, run.peak_mib


def test_a_600_layer_chain_plans_in_little_memory(tmp_path: Path) -> None:
    _, peak = _solved(tmp_path, _chain(300), 600)
    # the imports alone take ~120 MiB; the cubic copies took 486 MiB in all
    assert peak <= 320, f"planning a 600-layer chain peaked at {peak} MiB"


def _relu_chain(n: int) -> onnx.ModelProto:
    """x -> ReLU * n on a 64 x 56 x 56 map: no fused group passes R05 (no main layer)."""
    nodes = [helper.make_node("Relu", [f"t{i}" if i else "x"], [f"t{i + 1}"], name=f"relu{i}")
             for i in range(n)]
    shape = [1, 64, 56, 56]
    graph = helper.make_graph(nodes, "relus", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, shape)], [helper.make_tensor_value_info(
            f"t{n}", TensorProto.FLOAT, shape)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("builder", ["residual_net", "inception_net", "causal_encoder"])
def test_span_counts_agree_with_the_rule(tmp_path: Path, builder: str) -> None:
    """StructuralRule.span_filter says what check says, for every run of the layer order
    (R05 with and without its exemptions)."""
    from tests.test_bounds import BUILT

    problem = prepare(str(models.save(BUILT[builder](), tmp_path, builder)))
    g = problem.graph
    order = [lay.name for lay in g.layers]
    for rule in (MinMainLayers(), MinMainLayers(k=1, movement_groups=False),
                 MinMainLayers(k=3, token_groups=False)):
        allowed = rule.span_filter(g)
        assert allowed is not None
        for i in range(len(order)):
            ends = list(range(i, len(order)))
            for e, ok in zip(ends, allowed(i, ends), strict=True):
                io = group_io(g, order[i:e + 1])
                facts = GroupFacts(g, io, group_chains(g, io), Tile(1, 1, 1), problem.chip)
                assert ok == (rule.check(facts) is None), (builder, order[i], order[e])


@pytest.mark.slow
def test_a_2000_relu_chain_plans_in_little_memory(tmp_path: Path) -> None:
    _, peak = _solved(tmp_path, _relu_chain(2000), 2000)
    # the whole-map starts' millions of groups, each breaking R05, are never built
    assert peak <= 600, f"planning a 2,000-ReLU chain peaked at {peak} MiB"


def _wide_chain(convs: int, channels: int = 64, size: int = 112) -> onnx.ModelProto:
    """x -> (3x3 conv -> ReLU) * convs on a `channels` x size x size map that does not fit
    the default chip twice (fp16: 1.53 MiB a map, 2 MiB of SRAM)."""
    return _chain(convs, channels, size, scale=0.05)


def test_a_stretch_holding_two_maps_past_the_chip_starts_no_whole_map_group(
        tmp_path: Path) -> None:
    """Each conv of the chain could widen a stretch (conv, ReLU, conv) run in hidden chunks,
    or narrow one, or run whole: every way holds two whole maps at once (the widening conv's
    input, every chunk is computed from all of it, and the next conv's accumulator), 3.06
    MiB of SRAM at least. So no whole-map group starts anywhere (each of the 600-block
    chain's 594 starts cost 2 s to find it out); the real check agrees, and the bound stays
    under the hidden search's exact peak."""
    path = tmp_path / "wide.onnx"
    onnx.save(_wide_chain(16), path)
    problem = prepare(str(path))
    g, chip = problem.graph, problem.chip
    assert chunkable_maps(g)  # hidden chunks were the only way to fit these groups whole
    assert whole_map_starts(g, chip, problem.ruleset) == []
    held = {st.narrow: (st.widen, st.held) for st in narrowed_stretches(g)}
    assert held["conv1"] == ("conv0", 2 * 64 * 112 * 112)
    order = [lay.name for lay in g.layers]
    for a, b in ((0, 13), (2, 15), (1, 24)):
        assert _choice(g, chip, problem.ruleset, Objective.TRAFFIC, order[a:b]) is None
    search = HiddenSearch.of(g, order[:13], chip)
    assert search is not None
    for resident in (True, False):
        for k in search.chunk_options():
            assert search.peak(Tile(1, 112, 112), resident, False, k) \
                >= 2 * held["conv1"][1] > chip.sram.bytes


def test_efficientnet_keeps_its_whole_map_starts() -> None:
    """A layer that may widen a stretch around a pool (EfficientNet's squeeze-excite blocks)
    gets no harder bound: the whole-map group from the stem to stage 4's first projection
    (174 layers) stays a candidate, and the plan keeps its bytes (a bound that took each
    narrowing layer for a narrowing one lost it: +301,056 B)."""
    exports = Path(__file__).resolve().parent.parent / "examples" / "exports"
    problem = prepare(str(exports / "efficientnet_b0.onnx"), shapes={"input": (1, 3, 224, 224)})
    starts = whole_map_starts(problem.graph, problem.chip, problem.ruleset)
    first = next(s for s in starts if s.layers[0] == problem.graph.layers[0].name)
    assert 173 in first.ends


@pytest.mark.slow
def test_a_600_block_chain_of_wide_maps_plans_in_little_memory(tmp_path: Path) -> None:
    """Issue 46's deep chain: 600 conv blocks on 64 x 112 x 112 maps (1,200 layers) plan to
    CP-SAT's proof of optimality under 2 GiB (before: past its time limit at 80x the floor,
    every round walking 700,000 whole-map edges that no search could use)."""
    plan, peak = _solved(tmp_path, _wide_chain(600), 1200)
    assert plan["solver"]["status"] == "OPTIMAL"
    assert peak <= 2048, f"planning the 600-block chain peaked at {peak} MiB"


class _Order:
    """A graph as prefetch_eligible sees it: layer names "0", "1", ... at their index."""

    def index(self, name: str) -> int:
        return int(name)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 30), st.integers(0, 6), st.booleans()), min_size=1,
                max_size=12))
def test_prefetch_eligibility_counts_spanning_groups_as_a_walk_does(
        picks: list[tuple[int, int, bool]]) -> None:
    """prefetch_eligible finds a group spanning another by bisection over the groups'
    starts (a 20,000-group chain walked every group per group): the same answer as the walk,
    on random groups, intervals of the order or not."""
    groups = []
    for first, extra, gap in picks:
        names = [str(first + k) for k in range(extra + 1)]
        if gap and len(names) > 2:
            names.pop(1)  # not an interval of the order
        groups.append(names)
    found = prefetch_eligible(cast(Graph, _Order()), groups)
    spans = [(min(map(int, g)), max(map(int, g)), len(g)) for g in groups]
    walked = [False] + [
        a1 - a0 + 1 == na and b1 - b0 + 1 == nb and b0 == a1 + 1
        and not any(c0 < a0 and c1 > a1 for c0, c1, _ in spans)
        for (a0, a1, na), (b0, b1, nb) in zip(spans, spans[1:], strict=False)]
    assert found == walked


def test_an_output_early_in_a_long_chain_is_cut_like_the_anchor(tmp_path: Path) -> None:
    """The walk that decides whether an output is cut like the anchor follows the layers
    reading it down to the anchor: 3,000 element-wise layers deep here (a 32-layer decoder's
    whole network as one group is as deep), past Python's recursion limit, which it must
    not hit (it did: a RecursionError planning llama7b_decode_32)."""
    nodes = [helper.make_node("Relu", ["x"], ["y0"], name="r0")]
    nodes += [helper.make_node("Relu", [f"y{i - 1}"], [f"y{i}"], name=f"r{i}")
              for i in range(1, 3000)]
    shape = [1, 4, 8, 8]
    model = helper.make_model(
        helper.make_graph(nodes, "deep", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                        shape)],
                          [helper.make_tensor_value_info(t, TensorProto.FLOAT, shape)
                           for t in ("y0", "y2999")]),
        opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "deep.onnx"
    onnx.save(model, path)
    graph = prepare(str(path)).graph
    io = group_io(graph, [lay.name for lay in graph.layers])
    assert io.anchor == "y2999" and "y0" in io.outputs
    assert tiled_like_anchor(graph, io, "y0")
