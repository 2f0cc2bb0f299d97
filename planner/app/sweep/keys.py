"""Content addresses of sweep points: what decides a plan, hashed.

A point's address is sha256 over the model file's sha, the input shapes, the chip after
overrides, the rules file's sha, the solver, the objective, the time limit and the code's
version (with a digest of the planning code when running from a source tree), so a re-run
finds a finished point under the same address whatever the spec calls its files, and never
takes a point planned by other code as finished.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from fuseplan.hardware.chip import chip_to_dict, load_chip
from fuseplan.planner.app.sweep.spec import AxisValue, Point, Shapes
from fuseplan.planner.core.errors import InputError
from fuseplan.planner.front.onnx_load import resolve_model
from fuseplan.rules.ruleset import load_rules

__all__ = ["Job", "address", "code_version", "content_key", "source_digest"]


@dataclass(frozen=True)
class Job:
    """A resolved point: its content address and the swept keys' values on the built chip."""

    point: Point
    key: str
    chip_name: str
    axis_values: tuple[tuple[str, AxisValue], ...]  # key -> value in the chip (bytes, ...)
    rules_file: str

    def value(self, axis: str) -> AxisValue:
        """The chip's value of a swept key (None when this point does not sweep it)."""
        return dict(self.axis_values).get(axis)


_SOURCE_PACKAGES = ("planner", "rules", "solver", "hardware", "emulator")


def source_digest(root: Path) -> str | None:
    """sha256 over the planning code's ``*.py`` files when fuseplan runs from a source tree
    (``root`` holds ``pyproject.toml``: a checkout or an editable install), else None. A
    version number does not change while the code is being edited; this does, so a point
    planned by older code is not taken as finished."""
    if not (root / "pyproject.toml").is_file():
        return None
    digest = hashlib.sha256()
    for package in _SOURCE_PACKAGES:
        for file in sorted((root / package).rglob("*.py")):
            digest.update(file.relative_to(root).as_posix().encode() + b"\0")
            digest.update(file.read_bytes() + b"\0")
    return digest.hexdigest()


def code_version() -> str:
    """fuseplan's version, with the source digest when running from a source tree."""
    try:
        version = metadata.version("fuseplan")
    except metadata.PackageNotFoundError:  # running from a checkout that is not installed
        version = "0+unknown"
    # the repository's root is three folders above this file (planner/app/sweep/keys.py)
    sources = source_digest(Path(__file__).resolve().parents[3])
    return version if sources is None else f"{version}+src.{sources[:16]}"


def _dotted(data: Mapping[str, Any], key: str) -> AxisValue:
    value: Any = data
    for part in key.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    return value if isinstance(value, int | float | str | bool) else None


def content_key(model_sha: str, shapes: Shapes, chip: Mapping[str, Any], rules_sha: str,
                solver: str, objective: str, time_limit: float | None,
                version: str | None = None) -> str:
    """The content address of a point: sha256 of everything that decides its plan."""
    doc = {"model": model_sha, "shapes": [[n, list(d)] for n, d in shapes], "chip": chip,
           "rules": rules_sha, "solver": solver, "objective": objective,
           "time_limit": time_limit, "fuseplan": version or code_version()}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def address(points: Sequence[Point]) -> list[Job]:
    """Resolve and content-address points. Every chip is built with the points' ``--set``
    overrides (as the CLI does), every model and rule file is read: a bad one raises
    InputError prefixed with the spec place it came from."""
    version = code_version()
    model_sha: dict[str, str] = {}
    rules_sha: dict[str | None, str] = {}
    first: dict[str, Point] = {}
    jobs = []
    for p in points:
        if p.model.model not in model_sha:
            try:
                data = resolve_model(p.model.model).read_bytes()
            except InputError as exc:
                raise InputError(f"{p.model.origin}: {exc}") from None
            model_sha[p.model.model] = hashlib.sha256(data).hexdigest()
        if p.rules not in rules_sha:
            try:
                rs = load_rules(p.rules)
            except InputError as exc:
                raise InputError(f"{p.origin}: rules {p.rules}: {exc}") from None
            rules_sha[p.rules] = rs.sha256
        try:
            chip, _ = load_chip(p.hw, p.overrides)
        except InputError as exc:
            raise InputError(f"{p.origin}: {exc}") from None
        chip_doc = chip_to_dict(chip)
        key = content_key(model_sha[p.model.model], p.model.shapes, chip_doc,
                          rules_sha[p.rules], p.solver, p.objective, p.time_limit, version)
        if key in first:
            raise InputError(_same_point(first[key], p))
        first[key] = p
        values = tuple((k, _dotted(chip_doc, k)) for k, _ in p.axes)
        # the rules column names the file as the spec does (absolute), whatever the folder
        jobs.append(Job(p, key, chip.name, values, p.rules or "default"))
    return jobs


def _same_point(a: Point, b: Point) -> str:
    """The message for two spec points that are one planning problem (one address)."""
    pair = next(((x, y) for x, y in zip(b.where, a.where, strict=False) if x != y),
                (b.origin, a.origin))
    return (f"{pair[0]}: this point is the same planning problem as the one at {pair[1]} "
            "(the same model content and shapes, chip after overrides, rules content, solver, "
            "objective and time limit), so both would be one row. Remove one of them.")
