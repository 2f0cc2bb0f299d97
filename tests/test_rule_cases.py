"""Pass/fail cases for the rules, one YAML file per rule in tests/rule_cases/ (sqlfluff style).

Each file names a rule and lists cases::

    rule: redundancy                   # YAML key of the rule (rules/*.py)
    cases:
      - name: one-row tiles re-read the halo 3x
        model: chain_cnn               # a builder in tests/test_rules.BUILDERS
        kwargs: {n: 1}                 # its keyword arguments (optional)
        chip: cluster4x4               # a preset (optional, default cluster4x4)
        set: [sram.bytes=8KiB]         # chip overrides (optional)
        group: [conv3, maxpool9]       # first and last layer (topological order), or
        # layers: [conv3, relu4]       # exactly these layers
        tile: {h: 1}                   # n/h/w of the anchor tile; missing = whole axis
        resident: true                 # weights held on chip (optional, default true)
        config: {threshold_pct: 100}   # rule parameters (optional)
        expect: fail                   # pass | fail
        message: 'halo re-reads \\d+% > 100%'   # regex on the violation (fail only)
        needed: 8893                   # Violation.needed / .allowed (optional)
        allowed: 8192

Every case is also run through the rule's CP-SAT encoding when its tile is one the encoding
can express (full width, height in the candidate's domain): feasible must equal "pass".
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML

from fuseplan.planner.geometry.regions import Tile
from fuseplan.rules.base import REGISTRY, GroupFacts
from fuseplan.rules.encoding import Encoding, tile_floor
from fuseplan.solver.tiles import GroupSearch
from tests.test_rules import BUILDERS, ModelStore, _solve_single

CASES_DIR = Path(__file__).resolve().parent / "rule_cases"
CASE_KEYS = {"name", "model", "kwargs", "chip", "set", "group", "layers", "tile", "resident",
             "config", "expect", "message", "needed", "allowed", "why"}


@dataclass(frozen=True)
class Case:
    file: str
    rule: str
    spec: dict[str, Any]

    @property
    def id(self) -> str:
        slug = re.sub(r"[^a-z0-9]+", "-", self.spec["name"].lower()).strip("-")
        return f"{self.file}:{self.spec['expect']}:{slug}"


def load_cases() -> list[Case]:
    cases = []
    for path in sorted(CASES_DIR.glob("*.yaml")):
        doc = YAML(typ="safe").load(path.read_text(encoding="utf-8"))
        assert set(doc) == {"rule", "cases"}, f"{path.name}: top level must be rule + cases"
        assert doc["rule"] in REGISTRY, f"{path.name}: unknown rule {doc['rule']!r}"
        for spec in doc["cases"]:
            unknown = set(spec) - CASE_KEYS
            assert not unknown, f"{path.name}: case {spec.get('name')!r} has unknown keys {unknown}"
            assert spec["expect"] in ("pass", "fail"), f"{path.name}: {spec['name']}: expect?"
            assert spec["model"] in BUILDERS, f"{path.name}: unknown model {spec['model']!r}"
            cases.append(Case(path.stem, doc["rule"], spec))
    return cases


CASES = load_cases()


@pytest.fixture(scope="module")
def case_store(tmp_path_factory: pytest.TempPathFactory) -> ModelStore:
    return ModelStore(tmp_path_factory.mktemp("rule_case_models"))


def _layers(order: list[str], spec: dict[str, Any]) -> list[str]:
    if "layers" in spec:
        missing = [n for n in spec["layers"] if n not in order]
        assert not missing, f"no layers {missing} in the model; it has {order}"
        return list(spec["layers"])
    first, last = spec["group"]
    assert first in order and last in order, f"{first}/{last} not in {order}"
    return order[order.index(first):order.index(last) + 1]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_rule_case(case: Case, case_store: ModelStore) -> None:
    spec = case.spec
    problem = case_store.problem(spec["model"], spec.get("chip"), spec.get("set", ()),
                                 **spec.get("kwargs", {}))
    graph, chip = problem.graph, problem.chip
    layers = _layers([lay.name for lay in graph.layers], spec)
    search = GroupSearch.of(graph, layers, chip, problem.ruleset)
    full = search.tile_of(search.heights()[0])
    tile = Tile(spec.get("tile", {}).get("n", full.n), spec.get("tile", {}).get("h", full.h),
                spec.get("tile", {}).get("w", full.w))
    resident = spec.get("resident", True)
    facts: GroupFacts = search.facts(tile, resident)
    rule = replace(problem.ruleset.get(case.rule), **spec.get("config", {}))
    violation = rule.check(facts)
    where = f"{spec['name']}: group {layers} tile {tile} on {chip.name} {spec.get('set', [])}"
    if spec["expect"] == "pass":
        assert violation is None, f"{where}: expected to pass, got {violation}"
    else:
        assert violation is not None, f"{where}: expected {rule.code} {rule.key} to fail"
        assert (violation.rule, violation.name) == (rule.code, rule.key)
        assert re.search(spec["message"], str(violation)), \
            f"{where}: message {str(violation)!r} does not match {spec['message']!r}"
        for key in ("needed", "allowed"):
            if key in spec:
                assert getattr(violation, key) == spec[key], \
                    f"{where}: {key} {getattr(violation, key)} != {spec[key]}"
    # the same verdict from the CP-SAT encoding, where it can express this tile
    probe = Encoding(graph, chip).add_candidate(layers)
    h_ok = tile.h == probe.th if isinstance(probe.th, int) else \
        probe.th_low <= tile.h <= probe.extent[1]
    n_ok = tile.n == probe.tn if isinstance(probe.tn, int) else \
        (tile_floor(probe.chains, probe.io, graph, 0) or 1) <= tile.n <= probe.extent[0]
    if resident and tile.w == probe.extent[2] and h_ok and n_ok:
        feasible, _ = _solve_single(graph, chip, layers, rule, tile.h, tile.n)
        assert feasible == (spec["expect"] == "pass"), \
            f"{where}: CP-SAT encoding says {'feasible' if feasible else 'infeasible'}"


def test_every_rule_has_a_pass_and_a_fail_case() -> None:
    seen: dict[str, set[str]] = {}
    for c in CASES:
        seen.setdefault(c.rule, set()).add(c.spec["expect"])
    for cls in REGISTRY.values():
        if cls.code in ("R01", "R02"):  # greedy search order, they never reject a group
            continue
        assert seen.get(cls.key) == {"pass", "fail"}, \
            f"{cls.code} {cls.key}: needs at least one pass and one fail case in {CASES_DIR}"
