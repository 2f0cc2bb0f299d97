"""A planning problem: a model, a chip and a rule set, loaded and checked (the record every
command of planner.app.api starts from), and the chip a plan file was made for."""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fuseplan.hardware.chip import Chip, chip_from_dict, chip_to_dict, load_chip
from fuseplan.planner.app.assemble import layer_by_layer_bytes
from fuseplan.planner.core.budget import Budget
from fuseplan.planner.core.errors import InputError
from fuseplan.planner.core.progress import Progress, ProgressSink
from fuseplan.planner.cost.objective import Objective
from fuseplan.planner.front.graph_build import build_graph
from fuseplan.planner.front.onnx_load import LoadedModel, load_model
from fuseplan.planner.ir.graph import Graph
from fuseplan.rules.ruleset import RuleSet, load_rules


@dataclass(frozen=True)
class Problem:
    """A model, a chip and a rule set, loaded and checked."""

    model: LoadedModel
    graph: Graph
    chip: Chip
    chip_file: str
    chip_overrides: tuple[str, ...]
    ruleset: RuleSet

    def plan_header(self) -> dict[str, Any]:
        """The model/hardware/rules fields every plan file carries."""
        return {
            "model": {"path": self.model.path, "sha256": self.model.sha256,
                      "inputs": {k: list(v) for k, v in self.model.inputs.items()}},
            "hardware": {"name": self.chip.name, "file": self.chip_file,
                         "overrides": list(self.chip_overrides),
                         "spec": chip_to_dict(self.chip)},
            "rules": {"file": self.ruleset.file, "sha256": self.ruleset.sha256},
        }

    @functools.cached_property
    def layer_by_layer_bytes(self) -> int:
        """DRAM bytes of the layer-by-layer plan (every plan's reference), searched once."""
        return layer_by_layer_bytes(self.graph, self.chip)

    def layer_by_layer_on(self, jobs: int) -> int:
        """layer_by_layer_bytes, its searches (when not done yet) on up to `jobs` processes."""
        if "layer_by_layer_bytes" not in self.__dict__:  # cached_property's own slot
            self.__dict__["layer_by_layer_bytes"] = layer_by_layer_bytes(self.graph, self.chip,
                                                                         jobs)
        return self.layer_by_layer_bytes


def prepare(model: str, rules: str | Path | None = None, hardware: str | None = None,
            shapes: Mapping[str, tuple[int, ...]] | None = None,
            overrides: Sequence[str] = (), progress: ProgressSink | None = None,
            budget: Budget | None = None) -> Problem:
    """Load and check a model (path or zoo:NAME), a rule file and a chip (file or preset);
    ``progress``: told of each step (planner.core.progress); ``budget``: the command's time
    limit, which the model's import stops at (OutOfTime)."""
    if progress is not None:
        progress(Progress("loading model"))
    loaded = load_model(model, dict(shapes or {}), budget)
    if progress is not None:
        progress(Progress("loading chip"))
    chip, chip_file = load_chip(hardware, overrides)
    if progress is not None:
        progress(Progress("building graph"))
    graph = build_graph(loaded, budget)
    if progress is not None:
        progress(Progress("loading rules"))
    return Problem(loaded, graph, chip, chip_file, tuple(overrides), load_rules(rules))


def objective_of(problem: Problem, objective: Objective | str | None) -> Objective:
    """The objective named by the user (parsed here, once), else the rules' default."""
    return problem.ruleset.objective.default if objective is None \
        else Objective.parse(objective)


def chip_for_plan(plan_doc_hardware: Mapping[str, Any], hardware: str | None,
                  overrides: Sequence[str]) -> tuple[Chip, str]:
    """The chip a plan was made for (embedded in the plan, so a moved plan still verifies),
    unless the user names another; --set overrides apply either way."""
    if hardware is not None:
        return load_chip(hardware, overrides)
    spec = plan_doc_hardware.get("spec")
    if isinstance(spec, Mapping) and not overrides:
        try:
            return chip_from_dict(spec), str(plan_doc_hardware.get("file", ""))
        except (TypeError, ValueError) as exc:
            raise InputError(f"the plan's embedded chip is invalid ({exc}); pass --hw.") from None
    file = plan_doc_hardware.get("file") or None
    saved = list(plan_doc_hardware.get("overrides", []))
    if file is not None and not Path(file).exists():
        file = plan_doc_hardware.get("name") or None
    return load_chip(file, saved + list(overrides))
