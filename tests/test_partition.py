"""Seed 003: serial subgraphs at target nodes, recursive splitting, the three merge policies."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from fuseplan.planner.app import api
from fuseplan.planner.app.explain import recheck
from fuseplan.planner.app.partition import (
    Compiler,
    best_cut,
    block_boundaries,
    merge_bidirectional,
    merge_forward,
    merge_threshold,
    target_nodes,
)
from fuseplan.planner.core.errors import PlanningError
from fuseplan.planner.front.fills import materialized
from fuseplan.planner.front.graph_build import build_graph
from fuseplan.planner.front.onnx_load import load_model
from fuseplan.rules.ruleset import PartitionSettings
from fuseplan.solver.tiles import GroupSearch

import models

FUSEPLAN = str(Path(sys.executable).with_name("fuseplan"))


@pytest.fixture(scope="module")
def resnet_stages(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """ResNet-50 (zoo) with an extra graph output after each of its four stages (the cleaned
    model with its one-value weights written out: a file of its own is checked whole)."""
    proto = materialized(load_model("zoo:resnet50").proto)
    sums = [n for n in proto.graph.node if n.op_type == "Sum"]
    relu_of = {n.input[0]: n for n in proto.graph.node if n.op_type == "Relu"}
    info = {v.name: v for v in proto.graph.value_info}
    for i in (2, 6, 12, 15):  # last bottleneck of stages res2..res5
        proto.graph.output.append(info[relu_of[sums[i].output[0]].output[0]])
    path = tmp_path_factory.mktemp("stages") / "resnet_stages.onnx"
    onnx.save(proto, path)
    return path


@pytest.mark.slow  # plans every ResNet-50 stage
def test_resnet_stage_outputs_cut_into_serial_subgraphs(resnet_stages: Path,
                                                        tmp_path: Path) -> None:
    problem = api.prepare(str(resnet_stages))
    # every stage output also feeds the next stage (the last one the classifier head)
    assert len(target_nodes(problem.graph)) == 4
    subs, whole = api.partition(problem, out_dir=tmp_path)
    assert len(subs) >= 4, [s.reason for s in subs]
    assert all(s.status == "ok" for s in subs)
    assert sum(s.nodes for s in subs) == len(problem.graph.layers)
    assert sum("target node" in s.reason for s in subs) >= 3
    # every stage output is the output of some subgraph, written off chip there
    for t in problem.graph.outputs:
        assert any(t in s.outputs for s in subs), t
    # the chain's plan is its pieces' plans, group for group (halo modes included)
    assert whole.totals.dram_bytes == sum(s.plan.totals.dram_bytes for s in subs)
    report = api.verify_in_memory(problem, whole)
    assert report.ok, (report.first_output_mismatch, report.first_counter_mismatch)
    assert report.checked_tensors >= 5
    # each written subgraph is a valid model whose plan verifies on its own
    for i in (0, len(subs) - 1):
        run = subprocess.run([FUSEPLAN, "verify", str(tmp_path / f"subgraph_{i}.onnx"),
                              str(tmp_path / f"subgraph_{i}.plan.json"), "--json"],
                             capture_output=True, text=True, check=False)
        assert run.returncode == 0, run.stderr
        assert json.loads(run.stdout)["predicted_matches_emulated"]


def test_tiny_chip_splits_recursively_with_reasons(tmp_path: Path) -> None:
    path = models.save(models.chain_cnn(h=32, w=32), tmp_path, "chain")
    problem = api.prepare(str(path), overrides=["wram.bytes=128"])  # 2 KiB over 16 cores
    settings = replace(problem.ruleset.partition, weights_on_chip=True, max_nodes=1000)
    problem = replace(problem, ruleset=replace(problem.ruleset, partition=settings))
    with pytest.raises(PlanningError, match="does not compile"):
        api.partition(problem)
    from fuseplan.planner.app.partition import partition as run

    subs = run(problem.graph, problem.chip, problem.ruleset, settings,
               lambda g, layers: api.plan_problem(replace(problem, graph=g), "shortest-path"))
    assert len(subs) > 1
    assert any("split (depth" in s.reason or "cut at the cheapest" in s.reason for s in subs)
    failed = [s for s in subs if s.status == "failed"]
    assert failed and all(len(s.layers) == 1 for s in failed)
    assert all("do not stay on chip" in s.reason for s in failed)


# --- the merge policies on a hand-made example -----------------------------------------


class _Fake:
    """Four pieces A|B|C|D of a chain; compiling fails for any piece holding both A and B."""

    def __init__(self, tmp_path: Path, settings: PartitionSettings) -> None:
        path = models.save(models.chain_cnn(), tmp_path, "chain")
        self.graph = build_graph(load_model(str(path)))
        names = [lay.name for lay in self.graph.layers]
        self.pieces = [names[0:2], names[2:4], names[4:6], names[6:8]]
        bad = set(names[1:3])  # the last layer of A and the first of B

        def plan_fn(graph, layers):
            if bad <= set(layers):
                raise PlanningError("A and B do not fit together")
            return "plan"

        problem = api.prepare(str(path))
        self.compiler = Compiler(self.graph, problem.chip, problem.ruleset, settings, plan_fn)
        self.subs = [self.compiler.compile(self.compiler.describe(p, "piece"))
                     for p in self.pieces]

    def shape(self, merged) -> list[int]:
        return [len(s.layers) for s in merged]


def test_forward_merge(tmp_path: Path) -> None:
    fake = _Fake(tmp_path, PartitionSettings())
    # A+B fails: keep A, move on; B+C ok, then BC+D ok
    assert fake.shape(merge_forward(fake.compiler, fake.subs)) == [2, 6]


def test_bidirectional_merge(tmp_path: Path) -> None:
    fake = _Fake(tmp_path, PartitionSettings())
    # front: A+B fails -> [A][B]; back: C+D ok -> [CD]; meeting: B+CD ok
    assert fake.shape(merge_bidirectional(fake.compiler, fake.subs)) == [2, 6]


def test_threshold_merge(tmp_path: Path) -> None:
    fake = _Fake(tmp_path, PartitionSettings(max_nodes=4))
    # pieces of 2 nodes merge while the sum stays <= 4: A+B would fit but does not compile,
    # B+C = 4 fits, BC+D = 6 does not
    assert fake.shape(merge_threshold(fake.compiler, fake.subs)) == [2, 4, 2]


def test_cpsat_compiles_pieces_that_cut_blocks(tmp_path: Path) -> None:
    """Pieces of at most 5 layers cut residual blocks; CP-SAT still plans every piece."""
    path = models.save(models.residual_net(), tmp_path, "res")
    problem = api.prepare(str(path))
    settings = replace(problem.ruleset.partition, planner="cpsat", max_nodes=5)
    problem = replace(problem, ruleset=replace(problem.ruleset, partition=settings))
    subs, whole = api.partition(problem)
    assert len(subs) >= 4 and all(s.status == "ok" and s.nodes <= 5 for s in subs)
    assert whole.totals.dram_bytes == sum(s.plan.totals.dram_bytes for s in subs)
    report = api.verify_in_memory(problem, whole)
    assert report.ok, (report.first_output_mismatch, report.first_counter_mismatch)


# --- scale: cuts at block boundaries, pieces in parallel, one shared memo ----------------


def _dense_net(layers: int = 4) -> onnx.ModelProto:
    """A stem and DenseNet layers x <- concat(x, conv3x3(relu(conv1x1(x)))): each dense layer
    is a block whose last layer (the Concat) costs as much to cut before as after."""
    b = models._Builder(np.random.default_rng(0))
    x, c = b.one("Relu", [b.conv("input", 3, 8, 3, prefix="stem")]), 8
    for _ in range(layers):
        y = b.one("Relu", [b.conv(x, c, 8, 1, prefix="squeeze")])
        x, c = b.one("Concat", [x, b.conv(y, 8, 4, 3, prefix="grow")], axis=1), c + 4
    return b.model((1, 3, 16, 16), x, 13, name="dense_net")


def _with(problem: api.Problem, **partition: Any) -> api.Problem:
    settings = replace(problem.ruleset.partition, **partition)
    return replace(problem, ruleset=replace(problem.ruleset, partition=settings))


def test_scale_cuts_fall_on_block_boundaries(tmp_path: Path) -> None:
    problem = api.prepare(str(models.save(_dense_net(), tmp_path, "dense")))
    graph = problem.graph
    assert len(graph.blocks) == 4
    subs, whole = api.partition(_with(problem, planner="cpsat", max_nodes=6))
    assert len(subs) >= 3 and all(s.status == "ok" for s in subs)
    for sub in subs[1:]:  # no block has layers on both sides of a cut
        k = graph.index(sub.layers[0])
        assert all(not (graph.index(b.layers[0]) < k <= graph.index(b.layers[-1]))
                   for b in graph.blocks), sub.reason
    # so the stitched plan keeps the whole model's rules, and cannot beat the optimum
    assert recheck(graph, whole, problem.chip, problem.ruleset) == []
    mono = api.plan_problem(problem, "cpsat")
    assert whole.totals.dram_bytes >= mono.totals.dram_bytes


def test_best_cut_prefers_a_block_boundary(tmp_path: Path) -> None:
    graph = build_graph(load_model(str(models.save(_dense_net(2), tmp_path, "dense"))))
    layers = [lay.name for lay in graph.layers]
    chip = api.prepare(str(tmp_path / "dense.onnx")).chip
    clean = block_boundaries(graph, layers)
    assert clean == {1, 2, 6}  # after the stem conv, its Relu and the first Concat
    assert best_cut(graph, layers, chip) in clean


def test_pieces_in_parallel_plan_as_in_one_process(tmp_path: Path) -> None:
    problem = _with(api.prepare(str(models.save(_dense_net(), tmp_path, "dense"))),
                    planner="cpsat", max_nodes=6)
    one, whole_one = api.partition(problem, jobs=1)
    two, whole_two = api.partition(problem, jobs=2)
    assert [s.layers for s in one] == [s.layers for s in two]
    assert [s.reason for s in one] == [s.reason for s in two]
    assert [(g.layers, g.tile, g.halo_reuse) for g in whole_one.groups] == \
        [(g.layers, g.tile, g.halo_reuse) for g in whole_two.groups]


def test_merge_trials_search_no_group_twice(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Forward merging plans every merged pair again; the shared memo means only the groups
    across the new junction get a tile search."""
    proto = onnx.shape_inference.infer_shapes(_dense_net())
    info = {v.name: v for v in proto.graph.value_info}
    for node in proto.graph.node[:-1]:  # every Concat but the last becomes a target node
        if node.op_type == "Concat":
            proto.graph.output.append(info[node.output[0]])
    problem = _with(api.prepare(str(models.save(proto, tmp_path, "dense_outputs"))),
                    planner="cpsat", policy="forward")
    assert len(target_nodes(problem.graph)) == 3
    searched: list[tuple[str, ...]] = []
    best = GroupSearch.best

    def counting(self: GroupSearch, *args: object, **kwargs: object) -> object:
        searched.append(self.layers)
        return best(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(GroupSearch, "best", counting)
    subs, _ = api.partition(problem)
    assert len(subs) == 1 and "merged" in subs[0].reason  # three merge trials compiled
    assert searched and len(searched) == len(set(searched))


def test_cli_partition_with_jobs(tmp_path: Path) -> None:
    path = models.save(_dense_net(), tmp_path, "dense")
    rules = tmp_path / "rules.yaml"
    rules.write_text("partition:\n  planner: cpsat\n  max_nodes: 6\n")
    run = subprocess.run([FUSEPLAN, "partition", str(path), "--rules", str(rules), "--jobs", "2",
                          "--json"], capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr
    doc = json.loads(run.stdout)
    assert len(doc["subgraphs"]) >= 3 and all(s["status"] == "ok" for s in doc["subgraphs"])
