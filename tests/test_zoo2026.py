"""The 2026 zoo (examples/exports/zoo2026, issue 42) on the default chip: each model plans
and its plan verifies from the file (every tensor through DRAM against onnxruntime, every
counter and cycle against the emulator). Minutes on 2 cores: marked slow."""

from __future__ import annotations

from pathlib import Path

import pytest

from fuseplan.planner.app import api
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
