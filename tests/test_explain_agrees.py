"""Explain is the planner (issue 43): on an OPTIMAL plan, no boundary is "better: the
planner missed it" and the re-check of every group finds no violation, over the zoo, the
committed exports at their usual sizes and the examples. Each claim explain could make
there is either a planner bug or an explain bug; this test is where one would show."""

from __future__ import annotations

from pathlib import Path

import pytest

from fuseplan.planner.app import api
from fuseplan.planner.plan.json_io import save_plan

ROOT = Path(__file__).resolve().parent.parent
EXPORTS = ROOT / "examples" / "exports"
# the exports at the size each is usually run at (as bench/exports and the slow tests)
USUAL = {"mobilenet_v3_small": 224, "efficientnet_b0": 224, "regnet_y_400mf": 224,
         "convnext_tiny": 224, "deit_tiny": 224, "vit_b_16": 224, "swin_t": 224,
         "lraspp_mobilenet_v3": 512, "deeplabv3_mobilenet": 512, "ssdlite_backbone": 320,
         "unet": 256, "dbnet_se": 640, "mobilevit_like": 256}
ZOO = ("resnet50", "densenet121", "inception_v1", "squeezenet", "shufflenet")


def _claims(tmp_path: Path, model: str, shapes: dict[str, tuple[int, ...]] | None,
            rules: str | None = None, hardware: str | None = None) -> list[str]:
    plan = api.solve(model, rules=rules, hardware=hardware, shapes=shapes)
    if plan.solver.get("status") not in ("OPTIMAL", "WHOLE_NETWORK_ON_CHIP"):
        pytest.skip(f"{model}: {plan.solver.get('status')} plan, explain may find better")
    path = tmp_path / "plan.json"
    save_plan(plan, path)
    doc = api.explain(model, path, rules=rules, hardware=hardware)
    missed = [f"group {b['group']} + {b['next_layer']}: {r}" for b in doc["boundaries"]
              for r in b["reasons"] if "planner missed it" in r]
    broken = [f"group {v['group']}: {v['message']}" for v in doc["violations"]]
    return missed + broken


@pytest.mark.parametrize("name", ["chain_cnn", "residual_net", "inception_net"])
def test_explain_agrees_with_the_planner_on_the_examples(tmp_path: Path, name: str) -> None:
    folder = ROOT / "examples" / name
    assert _claims(tmp_path, str(folder / "model.onnx"), None, str(folder / "rules.yaml"),
                   str(folder / "hardware.yaml")) == []


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(USUAL))
def test_explain_agrees_with_the_planner_on_the_exports(tmp_path: Path, name: str) -> None:
    size = USUAL[name]
    assert _claims(tmp_path, str(EXPORTS / f"{name}.onnx"),
                   {"input": (1, 3, size, size)}) == []


@pytest.mark.slow
@pytest.mark.parametrize("name", ZOO)
def test_explain_agrees_with_the_planner_on_the_zoo(tmp_path: Path, name: str) -> None:
    assert _claims(tmp_path, f"zoo:{name}", None) == []
