"""The 2026 zoo (examples/exports/zoo2026, issue 42) on the default chip: each model plans
and its plan verifies from the file (every tensor through DRAM against onnxruntime, every
counter and cycle against the emulator). Minutes on 2 cores: marked slow."""

from __future__ import annotations

from pathlib import Path

import pytest

from fuseplan.planner.app import api
from fuseplan.planner.front.graph_build import build_graph
from fuseplan.planner.front.group_norm import MADE_CONSTANT
from fuseplan.planner.front.onnx_load import load_model, randomize_weights
from fuseplan.planner.plan.json_io import save_plan

ZOO = Path(__file__).resolve().parent.parent / "examples" / "exports" / "zoo2026"
SHAPES: dict[str, dict[str, tuple[int, ...]]] = {
    "bert_encoder": {"input_ids": (1, 128)}, "llama_block": {"input_ids": (1, 512)}}
# (diffusion_unet: GroupNorm in two passes, planner.front.group_norm)
PLANNED = ("audio_encoder", "segformer_block", "vit_518", "detector_head", "bert_encoder",
           "llama_block", "llama_decode", "llama_decode_b8", "maxvit_like", "convnextv2_block",
           "text_recognizer_t", "diffusion_unet")


def test_the_zoo_is_the_committed_one() -> None:
    assert {p.stem for p in ZOO.glob("*.onnx")} == set(PLANNED)


def test_a_causal_mask_computed_from_shapes_keeps_its_values_under_random_weights() -> None:
    """Llama's export builds its causal mask from the sequence length (Shape, Trilu, Where):
    folded, it is structure, not a weight. Verification's random weights once replaced it,
    so the verified model had no causal mask to fuse and the plan's layers were not its
    layers (found when 512-key attention began to fuse)."""
    loaded = load_model(str(ZOO / "llama_block.onnx"), SHAPES["llama_block"])
    marked = {t.name for t in loaded.proto.graph.initializer if t.doc_string == MADE_CONSTANT}
    assert marked
    weighted = randomize_weights(loaded, 0)
    kept = {t.name: t.raw_data for t in weighted.proto.graph.initializer if t.name in marked}
    assert kept == {t.name: t.raw_data for t in loaded.proto.graph.initializer
                    if t.name in marked}
    before, after = build_graph(loaded), build_graph(weighted)
    assert [lay.name for lay in after.layers] == [lay.name for lay in before.layers]
    fused = [lay for lay in after.layers if lay.op == "FlashAttention"]
    assert len(fused) == 2 and all(lay.attrs["causal"] for lay in fused)


@pytest.mark.slow
@pytest.mark.parametrize("name", PLANNED)
def test_each_model_plans_and_verifies_on_the_default_chip(tmp_path: Path, name: str) -> None:
    model = str(ZOO / f"{name}.onnx")
    plan = api.solve(model, shapes=SHAPES.get(name), time_limit=60)
    assert plan.totals.dram_bytes <= plan.layer_by_layer_dram_bytes
    path = tmp_path / "plan.json"
    save_plan(plan, path)
    report = api.verify(model, path, shapes=SHAPES.get(name))
    assert report.ok, (report.first_output_mismatch, report.first_counter_mismatch)


def test_a_decoder_runs_as_one_group_each_stretch_in_its_own_chunks() -> None:
    """llama_block as exported (two decoder layers, 512 tokens) as one group of whole maps
    in 8 hidden chunks: each attention half runs in its 2 key-head chunks (the most its
    units make), each SwiGLU MLP in 8, every weight streamed once. It moves exactly its
    floor; every tensor through DRAM matches onnxruntime and every counter the emulator.
    A count no stretch makes exactly is refused."""
    from hand import assert_verifies, hand_plan

    from fuseplan.planner.core.errors import PlanningError
    from fuseplan.planner.geometry.hidden import stretch_chunks, stretches
    from fuseplan.planner.geometry.regions import Tile, group_io
    from fuseplan.planner.plan.placement import Placement

    problem = api.prepare(str(ZOO / "llama_block.onnx"), shapes=SHAPES["llama_block"])
    g = problem.graph
    layers = tuple(lay.name for lay in g.layers)
    found = stretches(g, group_io(g, layers))
    assert [(s.channels, stretch_chunks(s, 8)) for s in found] \
        == [(2, 2), (1408, 8), (2, 2), (1408, 8)]
    plan = hand_plan(problem, [Placement.of(layers, Tile(1, 512, 1), False,
                                            hidden_chunks=8)])
    assert plan.totals.dram_bytes == plan.compulsory_dram_bytes
    assert plan.totals.sram_peak_bytes <= problem.chip.sram.bytes
    assert_verifies(problem, plan)
    with pytest.raises(PlanningError, match="no stretch makes 1000 chunks"):
        hand_plan(problem, [Placement.of(layers, Tile(1, 512, 1), False,
                                         hidden_chunks=1000)])
