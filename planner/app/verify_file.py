"""`fuseplan verify MODEL PLAN.json`: a plan file checked end to end, and the golden files it
writes.

The verdict (VerifyReport.ok) needs all of: every tensor the plan moves through DRAM agrees
with its reference under planner.app.verify_tensors.TOLERANCE_RULE; every byte and work
counter the plan predicts equals the emulator's count; every number the file states is what
the cost model gives for its placements (planner.app.integrity); no on-chip buffer
overflows; and the cycles agree under planner.app.verify.CYCLE_RULE.
``predicted_matches_emulated`` is false when a counter differs or a stated number is wrong.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from fuseplan.emulator.run import Corruption
from fuseplan.planner.app.integrity import first_misstatement
from fuseplan.planner.app.problem import chip_for_plan
from fuseplan.planner.app.verify import REFERENCE_PHASE, VerifyReport, dram_tensors, verify_plan
from fuseplan.planner.app.verify_reference import (
    Reference,
    choose_weights,
    golden_weights,
    read_golden,
    save_golden,
)
from fuseplan.planner.core.errors import InputError
from fuseplan.planner.core.progress import Progress, ProgressSink
from fuseplan.planner.front.graph_build import build_graph
from fuseplan.planner.front.onnx_load import LoadedModel, random_inputs
from fuseplan.planner.plan.json_io import load_plan


def _dram_names(loaded: LoadedModel, plan_path: Path, doc: Mapping[str, Any],
                hardware: str | None, overrides: Sequence[str]) -> list[str]:
    """The plan's DRAM tensors, read off the model as loaded (the weights do not change
    which tensors a plan moves)."""
    graph = build_graph(loaded)
    chip, _ = chip_for_plan(doc.get("hardware", {}), hardware, overrides)
    return dram_tensors(graph, load_plan(plan_path, graph, chip, loaded.sha256,
                                         check_stated_totals=False))


def verify_file(loaded: LoadedModel, plan_path: Path, doc: Mapping[str, Any], seed: int = 0,
                golden: Path | None = None, hardware: str | None = None,
                overrides: Sequence[str] = (), weights: str = "auto",
                corrupt: Corruption | None = None,
                progress: ProgressSink | None = None) -> VerifyReport:
    """Emulate a plan file (its JSON already read and validated: `doc`) on seeded inputs, or
    a golden file's, and check it (module docstring). ``weights``: auto, model or random
    (planner.app.verify_reference); ``corrupt``: the emulator's test hook; ``progress``:
    told of the reference run and the groups emulated (planner.core.progress)."""
    chip, _ = chip_for_plan(doc.get("hardware", {}), hardware, overrides)
    if golden is not None:
        stored = read_golden(golden)
        inputs = dict(stored.inputs)
        weighted, choice = golden_weights(loaded, stored, weights)
        reference = Reference("golden", stored.tensors, 0.0)
    else:
        inputs = random_inputs(loaded, seed)
        names = _dram_names(loaded, plan_path, doc, hardware, overrides)
        if progress is not None:
            progress(Progress(REFERENCE_PHASE))
        weighted, choice, reference = choose_weights(loaded, names, inputs, seed, weights)
    graph = build_graph(weighted)
    plan = load_plan(plan_path, graph, chip, loaded.sha256, check_stated_totals=False)
    report = verify_plan(weighted, graph, plan, chip, inputs,
                         stated=[set(g.get("predicted", {})) for g in doc["groups"]],
                         reference=reference, corrupt=corrupt, weights=choice,
                         progress=progress)
    # the stated numbers are re-derived on the chip the plan was made for, not on an
    # override the emulator runs it on (--hw/--set)
    # (a plan that does not say its chip is not checked under an override: nothing to
    # re-derive its numbers on)
    try:
        own_chip = chip if hardware is None and not overrides else \
            chip_for_plan(doc.get("hardware", {}), None, ())[0]
    except InputError:
        own_chip = None
    misstated = None if own_chip is None else \
        first_misstatement(graph, plan, own_chip, doc["groups"], doc.get("totals", {}))
    return replace(report, first_misstatement=misstated,
                   predicted_matches_emulated=report.predicted_matches_emulated
                   and misstated is None)


def write_golden_file(loaded: LoadedModel, plan_path: Path | None, doc: Mapping[str, Any] | None,
                      seed: int, path: Path, weights: str = "auto",
                      hardware: str | None = None, overrides: Sequence[str] = ()) -> None:
    """Store seeded inputs and onnxruntime's reference under the weights `weights` picks:
    the model's outputs and, given the plan, every tensor it moves through DRAM, so that
    `verify --golden` compares each of them; the file records the seed and the weights."""
    names = [] if plan_path is None or doc is None else \
        _dram_names(loaded, plan_path, doc, hardware, overrides)
    inputs = random_inputs(loaded, seed)
    _, choice, reference = choose_weights(loaded, names, inputs, seed, weights)
    outputs = {o.name for o in loaded.proto.graph.output}
    tensors: dict[str, np.ndarray] = dict(reference.tensors)
    save_golden(path, inputs, {k: v for k, v in tensors.items() if k in outputs}, seed,
                {k: v for k, v in tensors.items() if k not in outputs}, choice.used)
