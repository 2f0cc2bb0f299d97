"""One execution mode (planner.plan.mode): one record every stage carries, one validator the
plan reader and the assembler (and so explain and verify) ask, one check per kind of mode
in explain that agrees with what verify runs."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from fuseplan.planner.app import api
from fuseplan.planner.app.assemble import assemble, layer_placements
from fuseplan.planner.app.explain import recheck
from fuseplan.planner.core.errors import InputError, PlanningError
from fuseplan.planner.cost.objective import Objective
from fuseplan.planner.plan.checks import whole_tile
from fuseplan.planner.plan.json_io import load_plan, plan_to_json, save_plan
from fuseplan.planner.plan.mode import LoopOrder, Mode, ModeKind, mode_kind, mode_problem
from fuseplan.planner.plan.placement import Placement
from fuseplan.solver.tiles import GroupSearch, TileChoice

EXPORTS = Path(__file__).resolve().parent.parent / "examples" / "exports"
DEMO = Path(__file__).resolve().parent.parent / "planner" / "data" / "demo.onnx"


@pytest.fixture(scope="module")
def demo() -> api.Problem:
    return api.prepare(str(DEMO))


def test_every_stage_carries_the_one_record(demo: api.Problem) -> None:
    """A tile choice hands its mode to the placement unchanged, the placement reads its
    flags from it, and the plan file gives the same mode back."""
    g = demo.graph
    layers = api.plan_problem(demo).groups[0].layers  # the demo runs as one group
    search = GroupSearch.of(g, layers, demo.chip, demo.ruleset)
    best = search.best()
    assert isinstance(best, TileChoice)
    placed = best.placement(layers)
    assert placed.mode is best.mode
    assert (placed.weights_resident, placed.double_buffered, placed.halo_reuse) == \
        (best.mode.weights_resident, best.mode.double_buffered, best.mode.halo_reuse)
    assert Placement.of(layers, best.tile, False, True, weights_outer=False).mode == \
        Mode.of(resident=False, double_buffered=True)


def test_plan_file_round_trip_keeps_every_mode(demo: api.Problem, tmp_path: Path) -> None:
    plan = api.plan_problem(demo)
    file = tmp_path / "plan.json"
    save_plan(plan, file)
    back = load_plan(file, demo.graph, demo.chip, demo.model.sha256)
    assert [g.placement.mode for g in back.groups] == [g.placement.mode for g in plan.groups]


@pytest.mark.parametrize(("mode", "says"), [
    (Mode.of(resident=False, weights_outer=True), "loop_order \"weights_outer\" needs one layer"),
    (Mode.of(inputs_held=True), "inputs_held holds a group's inputs across its pooling"),
    (Mode.of(maps_held=True), "maps_held keeps each pooled map"),
    (Mode.of(passes=2), "passes is 2, but the group holds no global reduction"),
    (Mode.of(hidden_chunks=2, halo_reuse=True), "hidden_chunks 2 runs with halos recomputed"),
    (Mode.of(inputs_reloaded=True), "inputs_reloaded loads inputs again"),
    (Mode.of(resident=False, cluster_split=True), "cluster_split runs with resident weights"),
])
def test_the_plan_reader_and_the_assembler_refuse_alike(demo: api.Problem, tmp_path: Path,
                                                         mode: Mode, says: str) -> None:
    """A mode these layers cannot run: the validator names it, the plan file's reader
    refuses it with that text at the group's JSON path (exit 2), and the assembler (what
    explain and verify price a plan with) refuses the same placement with the same text."""
    g = demo.graph
    good = api.plan_problem(demo)
    layers = good.groups[0].layers  # the whole network: 17 layers, two residual blocks
    tile = whole_tile(g, layers)
    problem = mode_problem(g, layers, tile, mode, tile)
    assert problem is not None and problem.startswith(says), problem
    rest = [p for p in layer_placements(g, demo.chip) if not set(p.layers) & set(layers)]
    with pytest.raises(PlanningError, match="cannot run as placed") as refused:
        assemble(g, demo.chip, [Placement(layers, tile, mode), *rest], **demo.plan_header(),
                 objective=Objective.TRAFFIC, solver={"name": "hand"})
    assert problem in str(refused.value)
    doc = json.loads(json.dumps(plan_to_json(good)))
    first = doc["groups"][0]
    first.update({"weights_resident": mode.weights_resident, "halo": mode.halo.value,
                  "double_buffered": mode.double_buffered, "passes": mode.passes,
                  "inputs_held": mode.inputs_held, "maps_held": mode.maps_held,
                  "hidden_chunks": mode.hidden_chunks,
                  "inputs_reloaded": mode.inputs_reloaded,
                  "cluster_split": mode.cluster_split,
                  **({"loop_order": mode.loop.value} if mode.weights_outer else {})})
    file = tmp_path / "bad.json"
    file.write_text(json.dumps(doc))
    with pytest.raises(InputError) as read:
        load_plan(file, g, demo.chip, demo.model.sha256)
    assert "groups[0]." in str(read.value), read.value


def test_mode_kinds_name_one_cost_function_each(demo: api.Problem) -> None:
    g = demo.graph
    one = (g.layers[0].name,)
    assert mode_kind(g, one, Mode()) is ModeKind.TILES
    assert mode_kind(g, one, Mode.of(resident=False, weights_outer=True)) \
        is ModeKind.WEIGHTS_OUTER
    assert mode_kind(g, one, Mode.of(passes=2)) is ModeKind.PASSES
    assert mode_kind(g, one, Mode.of(hidden_chunks=2)) is ModeKind.HIDDEN
    assert mode_kind(g, one, Mode.of(cluster_split=True)) is ModeKind.CLUSTER_SPLIT
    assert replace(Mode(), loop=LoopOrder.WEIGHTS_OUTER).weights_outer


def _agree(problem: api.Problem, plan: api.Plan) -> set[ModeKind]:
    """explain's recheck finds nothing where verify runs the plan as predicted; the kinds
    of mode the plan uses."""
    report = api.verify_in_memory(problem, plan, seed=4)
    assert report.outputs_match, report.first_output_mismatch
    assert report.predicted_matches_emulated, report.first_counter_mismatch
    assert not report.capacity_violations, [v.describe() for v in report.capacity_violations]
    found = recheck(problem.graph, plan, problem.chip, problem.ruleset)
    assert not found, [(gid, str(v)) for gid, v in found]
    return {mode_kind(problem.graph, g.layers, g.placement.mode) for g in plan.groups}


def test_explain_agrees_with_verify_on_a_weights_outer_plan(tmp_path: Path) -> None:
    """A one-layer group sweeping its weight chunks over every tile holds two chunks, not its
    whole weights: explain's recheck used to count them whole and report a capacity
    violation on a plan verify runs within the chip."""
    from test_weight_stream import _big_conv

    model = _big_conv(tmp_path / "conv.onnx", 4)
    problem = api.prepare(str(model), overrides=["sram.bytes=512KiB", "nram.bytes=128KiB",
                                                 "clusters=1"])
    plan = api.plan_problem(problem)
    assert ModeKind.WEIGHTS_OUTER in _agree(problem, plan)


# every zoo model and export on the default chip (the shapes bench/exports uses): the
# modes the planners write, each rechecked by explain as verify runs it
PLANNED = [f"zoo:{n}" for n in ("resnet50", "vgg19", "bvlc_alexnet", "zfnet512", "squeezenet",
                                 "inception_v1", "inception_v2", "densenet121", "shufflenet")]
SIZES = {"mobilenet_v3_small": 224, "efficientnet_b0": 224, "regnet_y_400mf": 224,
         "convnext_tiny": 224, "lraspp_mobilenet_v3": 512, "deeplabv3_mobilenet": 512,
         "ssdlite_backbone": 320, "unet": 256, "dbnet_se": 640, "deit_tiny": 224,
         "vit_b_16": 224, "swin_t": 224, "mobilevit_like": 256}


@pytest.mark.slow  # a solve and an emulation of each: minutes on 2 cores
@pytest.mark.parametrize("model", [*PLANNED, *sorted(SIZES)])
def test_explain_agrees_with_verify_on_every_planned_model(model: str) -> None:
    if model.startswith("zoo:"):
        problem = api.prepare(model)
    else:
        size = SIZES[model]
        problem = api.prepare(str(EXPORTS / f"{model}.onnx"),
                              shapes={"input": (1, 3, size, size)})
    _agree(problem, api.plan_problem(problem))


@pytest.mark.slow  # a 512 x 512 segmentation net solved and emulated: a minute
def test_deeplab_uses_three_kinds_of_mode_and_explain_agrees() -> None:
    """DeepLabV3's plan on the default chip at 512 x 512 runs groups tiles outer, weights
    outer, and in passes (their stretches in hidden chunks): the plan explain used to
    refuse."""
    problem = api.prepare(str(EXPORTS / "deeplabv3_mobilenet.onnx"),
                          shapes={"input": (1, 3, 512, 512)})
    kinds = _agree(problem, api.plan_problem(problem))
    assert {ModeKind.TILES, ModeKind.WEIGHTS_OUTER, ModeKind.PASSES} <= kinds, kinds
