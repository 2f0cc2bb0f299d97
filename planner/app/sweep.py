"""Design-space sweeps: many (model, chip, rules, solver, objective) points, planned as Ray tasks.

A sweep starts from a SPEC file (README "Sweeps")::

    models: [zoo:squeezenet, {model: zoo:resnet50, batch: [1, 4]}]
    chips:
      - hw: cluster4x4
        set: {dram.bandwidth_gbps: 128}                   # fixed overrides
        sweep: {sram.bytes: [256KiB, 1MiB, 4MiB]}         # axes, in --set syntax
    objectives: [traffic]
    solvers: [cpsat]

:func:`load_spec` reads it (errors name FILE:LINE:COL), :func:`expand` makes the points (the
cross product, or the spec's explicit ``points:`` list) and :func:`address` resolves each one:
the chip is built with the same ``--set`` machinery as the CLI, and the point gets a content
address (sha256 over the model file's sha, the chip after overrides, the rules file's sha, the
solver, the objective, the time limit and the fuseplan version).

:func:`run_sweep` plans the points through a runner (:class:`RayRunner`, or
:class:`SerialRunner` in this process) and keeps one row file and one plan file per address
under the output directory, written atomically by the driver: a re-run with ``resume`` skips
finished points, a retried task can never add a second row, and an interrupted sweep loses
nothing it had finished. Along each capacity axis (a swept ``*.bytes`` key) results are made
monotone in DRAM bytes and in the objective: where a larger capacity's plan is worse in either
than a smaller capacity's, the smaller one's plan is re-costed on the larger chip (it fits
there) and kept if that puts the curve in order (:func:`in_order`). With a target
(``x_floor<=1.1``) the sweep instead bisects each capacity curve for the smallest capacity that
meets it.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
import re
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from importlib import metadata
from pathlib import Path
from typing import Any, Literal, Protocol

from ruamel.yaml.comments import CommentedSeq

from fuseplan.hardware.chip import load_chip
from fuseplan.planner.app import api
from fuseplan.planner.core.errors import InputError, PlanningError
from fuseplan.planner.core.yamlio import did_you_mean, load_yaml, where
from fuseplan.planner.cost.objective import Objective
from fuseplan.planner.front.onnx_load import declared_input_dims, resolve_model
from fuseplan.planner.plan.json_io import plan_to_json
from fuseplan.rules.ruleset import load_rules

__all__ = [
    "Job",
    "Point",
    "PointResult",
    "RayRunner",
    "SerialRunner",
    "SweepInterrupted",
    "SweepResult",
    "SweepSpec",
    "Target",
    "address",
    "capacity_axes",
    "curves",
    "expand",
    "in_order",
    "knee",
    "load_spec",
    "parse_target",
    "run_sweep",
    "source_digest",
]

Shapes = tuple[tuple[str, tuple[int, ...]], ...]
AxisValue = int | float | str | bool | None

_TOP_KEYS = ("name", "models", "chips", "rules", "objectives", "solvers", "time_limit", "points")
_MODEL_KEYS = ("model", "shapes", "batch")
_CHIP_KEYS = ("hw", "name", "set", "sweep")
_POINT_KEYS = ("model", "shapes", "batch", "hw", "name", "set", "rules", "objective", "solver")
_OBJECTIVES = tuple(o.value for o in Objective)
_SOLVED = ("OPTIMAL", "FEASIBLE", "WHOLE_NETWORK_ON_CHIP", "RECOSTED")


# --------------------------------------------------------------------------- the spec


@dataclass(frozen=True)
class ModelEntry:
    """One model of a spec, at one input binding."""

    model: str  # path (resolved against the spec's folder) or zoo:NAME
    shapes: Shapes = ()
    batch: int | None = None  # the batch when the spec sweeps it
    origin: str = ""  # FILE:LINE:COL of the entry, for messages


@dataclass(frozen=True)
class Axis:
    """A swept chip key and its values as written (``sram.bytes: [256KiB, 1MiB]``)."""

    key: str
    values: tuple[AxisValue, ...]
    origin: str = ""
    value_origins: tuple[str, ...] = ()  # FILE:LINE:COL of each value


@dataclass(frozen=True)
class ChipEntry:
    """A chip family: a preset or file, fixed overrides, and axes to sweep."""

    hw: str | None
    name: str
    fixed: tuple[str, ...] = ()  # "key=value" overrides applied to every point
    axes: tuple[Axis, ...] = ()
    origin: str = ""


@dataclass(frozen=True)
class Point:
    """One planning problem of a sweep, before it is resolved."""

    model: ModelEntry
    hw: str | None
    chip: str  # the chip entry's name (the table's `chip` column)
    fixed: tuple[str, ...]
    axes: tuple[tuple[str, AxisValue], ...]  # swept key -> value as written
    rules: str | None
    solver: str
    objective: str
    time_limit: float | None
    origin: str = ""  # where the point's chip (or explicit point) is written
    # where each part of the point is written (model, chip, axis values, rules, solver,
    # objective): two points with one address are told apart by the first part that differs
    where: tuple[str, ...] = ()

    @property
    def overrides(self) -> tuple[str, ...]:
        """Every ``--set`` override of this point: fixed ones, then the swept ones."""
        return (*self.fixed, *(f"{k}={_yaml_scalar(v)}" for k, v in self.axes))


@dataclass(frozen=True)
class SweepSpec:
    """A parsed SPEC file: its points in order and the swept chip keys (table columns)."""

    file: str
    name: str
    points: tuple[Point, ...]
    axis_keys: tuple[str, ...]
    batched: bool = False  # some model sweeps its batch (a `batch` column)


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


def _yaml_scalar(value: AxisValue) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return "null" if value is None else str(value)


def _loc(path: Path, node: Any, key: Any = None, value: bool = False) -> str:
    return where(path, node, key, value=value)


def _as_list(path: Path, node: Mapping[str, Any], key: str) -> list[tuple[Any, Any, Any]]:
    """The items of ``node[key]`` (a list, or one scalar) as (item, parent, index-or-key)."""
    value = node[key]
    if isinstance(value, CommentedSeq):
        if not value:
            raise InputError(f"{_loc(path, node, key, True)}: `{key}` is an empty list; give "
                             "at least one item or remove the key.")
        return [(item, value, i) for i, item in enumerate(value)]
    if isinstance(value, Mapping):
        raise InputError(f"{_loc(path, node, key, True)}: `{key}` must be a list (or one "
                         "value), got a mapping. Write it as `[a, b]` or a `- item` list.")
    return [(value, node, key)]


def _check_keys(path: Path, node: Mapping[str, Any], allowed: Sequence[str], what: str) -> None:
    for key in node:
        if key not in allowed:
            raise InputError(f"{_loc(path, node, key)}: unknown key `{key}` in {what}."
                             f"{did_you_mean(str(key), allowed)} Valid keys: "
                             f"{', '.join(allowed)}. Fix the spelling or remove the key.")


def _string(path: Path, parent: Any, key: Any, what: str) -> str:
    value = parent[key]
    if not isinstance(value, str) or not value.strip():
        raise InputError(f"{_loc(path, parent, key, True)}: {what} must be a non-empty string, "
                         f"got {value!r}. Write it as text, e.g. `zoo:squeezenet`.")
    return value.strip()


def _file_ref(spec_dir: Path, text: str) -> str:
    """Paths in a spec are relative to the spec's folder; zoo names and presets stay as is."""
    if text.startswith("zoo:") or not (text.endswith((".yaml", ".yml", ".onnx")) or "/" in text):
        return text
    p = Path(text).expanduser()
    return str(p if p.is_absolute() else (spec_dir / p).resolve())


def _shapes(path: Path, node: Mapping[str, Any], key: str) -> Shapes:
    value = node[key]
    if not isinstance(value, Mapping):
        raise InputError(f"{_loc(path, node, key, True)}: `shapes` must map input names to dims, "
                         "e.g. `shapes: {data_0: [1, 3, 224, 224]}`.")
    out = []
    for name, dims in value.items():
        if not (isinstance(dims, list) and dims
                and all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in dims)):
            raise InputError(f"{_loc(path, value, name, True)}: the dims of input `{name}` must "
                             f"be a list of positive integers, got {dims!r}.")
        out.append((str(name), tuple(int(d) for d in dims)))
    return tuple(out)


def _batched(path: Path, node: Mapping[str, Any], model: str, shapes: Shapes,
             origin: str) -> list[ModelEntry]:
    """One entry per value of the model's `batch` key: dim 0 of every input set to it."""
    items = _as_list(path, node, "batch")
    batches = []
    for item, parent, idx in items:
        if not (isinstance(item, int) and not isinstance(item, bool) and item > 0):
            raise InputError(f"{_loc(path, parent, idx, True)}: a batch must be a positive "
                             f"integer, got {item!r}.")
        batches.append(int(item))
    try:
        declared = declared_input_dims(model)
    except InputError as exc:
        raise InputError(f"{origin}: {exc}") from None
    given = dict(shapes)
    entries = []
    for b in batches:
        bound = []
        for name, dims in declared.items():
            full = list(given.get(name, dims))
            if not full:
                raise InputError(f"{_loc(path, node, 'batch')}: input `{name}` of {model} has no "
                                 "declared shape; give it under `shapes:`.")
            full[0] = b
            if any(not isinstance(d, int) or d < 1 for d in full[1:]):
                raise InputError(f"{_loc(path, node, 'batch')}: input `{name}` of {model} has "
                                 f"unbound dims {full}; bind them under `shapes:`.")
            bound.append((name, tuple(int(d) for d in full)))  # type: ignore[arg-type]
        entries.append(ModelEntry(model, tuple(bound), b, origin))
    return entries


def _model_entries(path: Path, parent: Any, idx: Any, allowed: Sequence[str]
                   ) -> list[ModelEntry]:
    """A `models:` item (or an explicit point): a model string, or a mapping with `model`."""
    item = parent[idx]
    origin = _loc(path, parent, idx, True)
    if isinstance(item, str):
        return [ModelEntry(_file_ref(path.parent, _string(path, parent, idx, "a model")),
                           origin=origin)]
    if not isinstance(item, Mapping):
        raise InputError(f"{origin}: a model must be `zoo:NAME`, a path, or a mapping with "
                         f"`model:`, got {item!r}.")
    _check_keys(path, item, allowed, "a model entry" if allowed is _MODEL_KEYS else "a point")
    if "model" not in item:
        raise InputError(f"{origin}: the entry has no `model:`. Add `model: zoo:NAME` or a "
                         "path to an .onnx file.")
    model = _file_ref(path.parent, _string(path, item, "model", "`model`"))
    shapes = _shapes(path, item, "shapes") if "shapes" in item else ()
    if "batch" in item:
        return _batched(path, item, model, shapes, origin)
    return [ModelEntry(model, shapes, None, origin)]


def _overrides(path: Path, node: Mapping[str, Any], key: str) -> tuple[str, ...]:
    value = node[key]
    if not isinstance(value, Mapping):
        raise InputError(f"{_loc(path, node, key, True)}: `{key}` must map chip keys to values "
                         "in --set syntax, e.g. `set: {dram.bandwidth_gbps: 128}`.")
    for k, v in value.items():
        if isinstance(v, Mapping | list):
            raise InputError(f"{_loc(path, value, k, True)}: `{k}` must be one value here; "
                             "set nested keys one at a time (`sram.bytes: 2MiB`), and put "
                             "lists of values under `sweep:`.")
    return tuple(f"{k}={_yaml_scalar(v)}" for k, v in value.items())


def _axes(path: Path, node: Mapping[str, Any]) -> tuple[Axis, ...]:
    value = node["sweep"]
    if not isinstance(value, Mapping) or not value:
        raise InputError(f"{_loc(path, node, 'sweep', True)}: `sweep` must map chip keys to "
                         "lists of values, e.g. `sweep: {sram.bytes: [256KiB, 1MiB]}`.")
    axes = []
    for key, values in value.items():
        items = values if isinstance(values, list) else [values]
        if not items or any(isinstance(v, Mapping | list) for v in items):
            raise InputError(f"{_loc(path, value, key, True)}: the values of `{key}` must be a "
                             "non-empty list of scalars, e.g. `[256KiB, 512KiB, 1MiB]`.")
        places = tuple(_loc(path, values, i, True) for i in range(len(values))) \
            if isinstance(values, CommentedSeq) else (_loc(path, value, key, True),)
        axes.append(Axis(str(key), tuple(items), _loc(path, value, key), places))
    return tuple(axes)


def _chip_entry(path: Path, parent: Any, idx: Any) -> ChipEntry:
    item = parent[idx]
    origin = _loc(path, parent, idx, True)
    if item is None or isinstance(item, str):
        hw = None if item is None else _file_ref(path.parent, item)
        return ChipEntry(hw, _chip_label(hw), origin=origin)
    if not isinstance(item, Mapping):
        raise InputError(f"{origin}: a chip must be a preset name, a chip file, or a mapping "
                         f"with `hw`, `set` and `sweep`, got {item!r}.")
    _check_keys(path, item, _CHIP_KEYS, "a chip entry")
    hw = _file_ref(path.parent, _string(path, item, "hw", "`hw`")) \
        if item.get("hw") is not None else None
    name = _string(path, item, "name", "`name`") if "name" in item else _chip_label(hw)
    fixed = _overrides(path, item, "set") if "set" in item else ()
    axes = _axes(path, item) if "sweep" in item else ()
    return ChipEntry(hw, name, fixed, axes, origin)


def _chip_label(hw: str | None) -> str:
    from fuseplan.hardware.chip import DEFAULT_PRESET

    return DEFAULT_PRESET if hw is None else Path(hw).stem


def _one(path: Path, node: Mapping[str, Any], key: str) -> None:
    """An explicit point takes one value per key: a list is a mistake, not a choice."""
    if isinstance(node.get(key), CommentedSeq):
        plural = {"rules": "rules"}.get(key, f"{key}s")
        raise InputError(f"{_loc(path, node, key, True)}: a point's `{key}` must be one value, "
                         f"got a list. Write one point per value (or use the cross product: "
                         f"`models:` and `chips:` with `{plural}:`).")


def _choices(path: Path, node: Mapping[str, Any], key: str, noun: str, valid: Sequence[str],
             default: str) -> list[tuple[str, str]]:
    """The values of ``node[key]`` (each one of ``valid``) with where each is written."""
    if key not in node:
        return [(default, "")]
    out = []
    for item, parent, idx in _as_list(path, node, key):
        if item not in valid:
            raise InputError(f"{_loc(path, parent, idx, True)}: unknown {noun} {item!r}."
                             f"{did_you_mean(str(item), valid)} Use one of: {', '.join(valid)}.")
        out.append((str(item), _loc(path, parent, idx, True)))
    return out


def _rules_list(path: Path, node: Mapping[str, Any]) -> list[tuple[str | None, str]]:
    """The rule files of ``node`` (None: the default rules) with where each is written."""
    if "rules" not in node:
        return [(None, "")]
    out: list[tuple[str | None, str]] = []
    for item, parent, idx in _as_list(path, node, "rules"):
        file = None if item is None \
            else _file_ref(path.parent, _string(path, parent, idx, "a rules file"))
        try:
            load_rules(file)  # checked here, to point at the spec's line
        except InputError as exc:
            raise InputError(f"{_loc(path, parent, idx, True)}: {exc}") from None
        out.append((file, _loc(path, parent, idx, True)))
    return out


def _time_limit(path: Path, node: Mapping[str, Any]) -> float | None:
    value = node.get("time_limit")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise InputError(f"{_loc(path, node, 'time_limit', True)}: `time_limit` must be a "
                         f"positive number of seconds, got {value!r}.")
    return float(value)


def _explicit_point(path: Path, parent: Any, idx: Any, time_limit: float | None
                    ) -> list[Point]:
    item = parent[idx]
    origin = _loc(path, parent, idx, True)
    if not isinstance(item, Mapping):
        raise InputError(f"{origin}: a point must be a mapping with `model:` (and `hw`, `set`, "
                         f"`rules`, `objective`, `solver`), got {item!r}.")
    models = _model_entries(path, parent, idx, _POINT_KEYS)
    hw = _file_ref(path.parent, _string(path, item, "hw", "`hw`")) \
        if item.get("hw") is not None else None
    chip = _string(path, item, "name", "`name`") if "name" in item else _chip_label(hw)
    axes: tuple[tuple[str, AxisValue], ...] = ()
    if "set" in item:  # an explicit point's overrides are its swept keys (table columns)
        _overrides(path, item, "set")  # checks the values
        axes = tuple((str(k), v) for k, v in item["set"].items())
    for key in ("rules", "objective", "solver"):
        _one(path, item, key)
    rules = _rules_list(path, item)[0][0] if item.get("rules") is not None else None
    objective = _choices(path, item, "objective", "objective", _OBJECTIVES, "traffic")[0][0]
    solver = _choices(path, item, "solver", "solver", api.SOLVERS, "cpsat")[0][0]
    return [Point(m, hw, chip, (), axes, rules, solver, objective, time_limit, origin,
                  (origin,)) for m in models]


def load_spec(path: str | Path) -> SweepSpec:
    """Read a SPEC file into its points. Raises InputError naming FILE:LINE:COL and the fix
    for an unknown key, a malformed value, an unknown solver or objective, or a spec with
    neither `models:` nor `points:`. Models, chips and rules are checked by :func:`address`."""
    path = Path(path)
    node = load_yaml(path)
    _check_keys(path, node, _TOP_KEYS, "a sweep spec")
    time_limit = _time_limit(path, node)
    name = str(node.get("name") or path.stem)
    if "points" in node:
        extra = [k for k in ("models", "chips", "rules", "objectives", "solvers") if k in node]
        if extra:
            raise InputError(f"{_loc(path, node, extra[0])}: `{extra[0]}` cannot be combined "
                             "with `points:` (an explicit list of points). Keep one of them.")
        points = [p for item, parent, idx in _as_list(path, node, "points")
                  for p in _explicit_point(path, parent, idx, time_limit)]
        axis_keys = tuple(dict.fromkeys(k for p in points for k, _ in p.axes))
        return SweepSpec(str(path), name, tuple(points), axis_keys,
                         any(p.model.batch is not None for p in points))
    if "models" not in node:
        raise InputError(f"{_loc(path, node)}: the spec has no `models:`. List the models to "
                         "sweep, e.g. `models: [zoo:squeezenet]` (or give `points:`).")
    models = [m for _, parent, idx in _as_list(path, node, "models")
              for m in _model_entries(path, parent, idx, _MODEL_KEYS)]
    chips = [_chip_entry(path, parent, idx) for _, parent, idx in _as_list(path, node, "chips")] \
        if "chips" in node else [ChipEntry(None, _chip_label(None), origin=_loc(path, node))]
    _unique_chip_names(chips)
    rules = _rules_list(path, node)
    objectives = _choices(path, node, "objectives", "objective", _OBJECTIVES, "traffic")
    solvers = _choices(path, node, "solvers", "solver", api.SOLVERS, "cpsat")
    points = []
    for model, chip in itertools.product(models, chips):
        values = [[((a.key, v), w) for v, w in zip(a.values, a.value_origins, strict=True)]
                  for a in chip.axes]
        for combo, (rule, rw), (solver, sw), (objective, ow) in itertools.product(
                itertools.product(*values), rules, solvers, objectives):
            where = (model.origin, chip.origin, *(w for _, w in combo), rw, sw, ow)
            points.append(Point(model, chip.hw, chip.name, chip.fixed,
                                tuple(kv for kv, _ in combo), rule, solver, objective,
                                time_limit, chip.origin, where))
    axis_keys = tuple(dict.fromkeys(a.key for c in chips for a in c.axes))
    return SweepSpec(str(path), name, tuple(points), axis_keys,
                     any(m.batch is not None for m in models))


def _unique_chip_names(chips: Sequence[ChipEntry]) -> None:
    """Two chip entries with one label would share the table's `chip` column and their
    curves would mix: each needs its own `name:`."""
    seen: dict[str, ChipEntry] = {}
    for c in chips:
        if c.name in seen:
            raise InputError(f"{c.origin}: a second chip entry labelled {c.name!r} (the first "
                             f"is at {seen[c.name].origin}). Add `name:` to one of them, e.g. "
                             f"`name: {c.name}-2`, so the table and the report tell them apart.")
        seen[c.name] = c


def expand(spec: SweepSpec) -> tuple[Point, ...]:
    """The spec's points, in order: the cross product models x chips x axis values x rules x
    solvers x objectives, or the explicit `points:` list."""
    return spec.points


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


def _version() -> str:
    """fuseplan's version, with the source digest when running from a source tree."""
    try:
        version = metadata.version("fuseplan")
    except metadata.PackageNotFoundError:  # running from a checkout that is not installed
        version = "0+unknown"
    sources = source_digest(Path(__file__).resolve().parents[2])
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
           "time_limit": time_limit, "fuseplan": version or _version()}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def address(points: Sequence[Point]) -> list[Job]:
    """Resolve and content-address points. Every chip is built with the points' ``--set``
    overrides (as the CLI does), every model and rule file is read: a bad one raises
    InputError prefixed with the spec place it came from."""
    from fuseplan.hardware.chip import chip_to_dict

    version = _version()
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


# --------------------------------------------------------------------------- results


@dataclass(frozen=True)
class PointResult:
    """One row of the results table (README "Sweeps" lists the columns)."""

    key: str
    model: str
    shapes: str  # "NAME=D0,D1,...;..." (empty: the model's own)
    batch: int | None
    chip: str
    axes: tuple[tuple[str, AxisValue], ...]
    rules: str
    solver: str
    objective: str
    status: str  # the solver's status, "infeasible" or "error"
    gap: float | None = None
    dram_bytes: int | None = None
    compulsory_dram_bytes: int | None = None
    layer_by_layer_dram_bytes: int | None = None
    cycles: int | None = None
    energy_pj: float | None = None
    groups: int | None = None
    solve_s: float | None = None
    verified: bool | None = None  # None: not verified
    plan: str = ""  # the plan file, relative to the sweep's folder ("" when there is none)
    monotone: str = ""  # "re-costed from sram.bytes=..." when a smaller capacity's plan won
    error: str = ""

    @property
    def ok(self) -> bool:
        """A plan was made for the point."""
        return self.status in _SOLVED

    @property
    def x_floor(self) -> float | None:
        """DRAM bytes over the compulsory floor."""
        if self.dram_bytes is None or not self.compulsory_dram_bytes:
            return None
        return self.dram_bytes / self.compulsory_dram_bytes

    @property
    def x_layer(self) -> float | None:
        """DRAM bytes over the layer-by-layer plan's."""
        if self.dram_bytes is None or not self.layer_by_layer_dram_bytes:
            return None
        return self.dram_bytes / self.layer_by_layer_dram_bytes

    def value(self, metric: str) -> Any:
        """A column of the row by name (swept keys included)."""
        if metric in dict(self.axes):
            return dict(self.axes)[metric]
        return getattr(self, metric)

    def to_json(self) -> dict[str, Any]:
        """The row file's content."""
        doc = asdict(self)
        doc["axes"] = [[k, v] for k, v in self.axes]
        return doc

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> PointResult:
        """Read a row file written by :meth:`to_json`."""
        return cls(**{**doc, "axes": tuple((str(k), v) for k, v in doc["axes"])})


@dataclass(frozen=True)
class Outcome:
    """What a task returns: the row and, when a plan was made, its plan file document."""

    row: PointResult
    plan: dict[str, Any] | None = None


def _shapes_text(shapes: Shapes) -> str:
    return ";".join(f"{n}={','.join(map(str, d))}" for n, d in shapes)


def _blank_row(job: Job, status: str, error: str = "") -> PointResult:
    p = job.point
    return PointResult(job.key, p.model.model, _shapes_text(p.model.shapes), p.model.batch,
                       p.chip, job.axis_values, job.rules_file, p.solver, p.objective, status,
                       error=error)


def _row(job: Job, plan: Any, verified: bool | None, monotone: str = "") -> PointResult:
    t = plan.totals
    gap = plan.solver.get("gap")
    wall = plan.solver.get("wall_s")
    return replace(_blank_row(job, str(plan.solver.get("status", ""))),
                   gap=None if gap is None else float(gap), dram_bytes=int(t.dram_bytes),
                   compulsory_dram_bytes=int(plan.compulsory_dram_bytes),
                   layer_by_layer_dram_bytes=int(plan.layer_by_layer_dram_bytes),
                   cycles=int(t.cycles), energy_pj=round(float(t.energy_pj), 3),
                   groups=len(plan.groups), solve_s=None if wall is None else float(wall),
                   verified=verified, monotone=monotone)


def _prepare(job: Job) -> api.Problem:
    p = job.point
    return api.prepare(p.model.model, p.rules, p.hw, dict(p.model.shapes), p.overrides)


def _verified(problem: api.Problem, plan: Any, verify: bool) -> bool | None:
    return api.verify_in_memory(problem, plan).ok if verify else None


def solve_point(job: Job, verify: bool = False) -> Outcome:
    """Plan one point (a Ray task's body): its row and plan document. A point without a plan
    (infeasible, or a model the planner rejects at these shapes) is a row saying why."""
    try:
        problem = _prepare(job)
        plan = api.plan_problem(problem, job.point.solver, job.point.objective,
                                job.point.time_limit)
    except PlanningError as exc:
        return Outcome(_blank_row(job, "infeasible", str(exc)))
    except InputError as exc:
        return Outcome(_blank_row(job, "error", str(exc)))
    return Outcome(_row(job, plan, _verified(problem, plan, verify)), plan_to_json(plan))


def recost_point(job: Job, smaller: Mapping[str, Any], source: str,
                 verify: bool = False) -> Outcome:
    """A smaller capacity's plan re-costed on this point's chip (a larger capacity holds
    every tile the smaller one held), its row marked with where it came from."""
    from fuseplan.planner.app.assemble import assemble
    from fuseplan.planner.plan import schema
    from fuseplan.planner.plan.json_io import plan_from_doc

    where = f"the plan of {source}"
    try:
        problem = _prepare(job)
        old = plan_from_doc(schema.validate(dict(smaller), where), problem.graph,
                            problem.model.sha256, where)
        info = {**dict(old.solver), "status": "RECOSTED", "gap": None, "recosted_from": source}
        plan = assemble(problem.graph, problem.chip, [g.placement for g in old.groups],
                        objective=old.objective, solver=info, **problem.plan_header())
    except (InputError, PlanningError) as exc:  # the point keeps its own result
        return Outcome(_blank_row(job, "error", f"re-costing the plan of {source}: {exc}"))
    return Outcome(_row(job, plan, _verified(problem, plan, verify), f"re-costed from {source}"),
                   plan_to_json(plan))


# --------------------------------------------------------------------------- runners


@dataclass(frozen=True)
class Failure:
    """A task that raised (a bug: the row's status is ``error``, and the sweep says so), or
    whose worker died more often than it was retried, or that was cancelled."""

    message: str


Call = tuple[Callable[..., Outcome], tuple[Any, ...]]


class Runner(Protocol):
    """Runs calls and yields (index, result) as each finishes."""

    def run(self, calls: Sequence[Call]) -> Iterator[tuple[int, Outcome | Failure]]: ...


class SerialRunner:
    """Every call in this process, one after another (a baseline, and Ray-free tests)."""

    def run(self, calls: Sequence[Call]) -> Iterator[tuple[int, Outcome | Failure]]:
        """Yield each call's result in order; a call that raises is a :class:`Failure`
        (as on Ray), so one bad point does not lose the others."""
        for i, (fn, args) in enumerate(calls):
            try:
                result: Outcome | Failure = fn(*args)
            except Exception as exc:  # reported as the point's error; the sweep exits 1
                result = Failure(_raised(exc))
            yield i, result


def _raised(exc: BaseException) -> str:
    """A task's exception in one line: its type, message and the place it was raised."""
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    place = f" (at {Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else ""
    text = " ".join(str(exc).split())[:400]
    return f"{type(exc).__name__}: {text}{place}"


@dataclass
class RayRunner:
    """Calls as Ray tasks: on the cluster at ``address``, or on a Ray started on this
    machine's cores (``num_cpus``; all of them by default). A Ray already initialised in this
    process (tests, notebooks) is used as it is. A task whose worker dies is retried
    ``max_retries`` times; a task that is still running when the driver stops is cancelled."""

    address: str | None = None
    num_cpus: int | None = None
    max_retries: int = 3
    _started: bool = field(default=False, init=False)
    _temp_dir: str | None = field(default=None, init=False)

    def __enter__(self) -> RayRunner:
        import logging

        import ray

        if not ray.is_initialized():
            if self.address is not None:
                try:
                    ray.init(address=self.address, logging_level=logging.WARNING,
                             log_to_driver=False)
                except (ConnectionError, ValueError, RuntimeError, TimeoutError) as exc:
                    raise InputError(
                        f"cannot reach Ray at {self.address} ({' '.join(str(exc).split())}); "
                        "start one with `ray start --head` or drop --address to start Ray on "
                        "this machine.") from None
            else:
                # A private session folder (not the shared /tmp/ray: two sweeps, or CI jobs,
                # on one machine must not meet), short enough for Ray's socket paths, and the
                # CPUs this process may use (a container or taskset may allow fewer than the
                # machine has).
                self._temp_dir = tempfile.mkdtemp(prefix="fuseplan-ray-")
                try:
                    ray.init(num_cpus=self.num_cpus or len(os.sched_getaffinity(0)),
                             include_dashboard=False, logging_level=logging.WARNING,
                             log_to_driver=False, _temp_dir=self._temp_dir)
                except BaseException:  # Ctrl-C while Ray starts, too: __exit__ will not run
                    self.__exit__()
                    raise
            self._started = True
        return self

    def __exit__(self, *exc: object) -> None:
        import shutil

        import ray

        if self._started:
            ray.shutdown()
            self._started = False
        if self._temp_dir is not None:
            shutil.rmtree(self._temp_dir, ignore_errors=True)
            self._temp_dir = None

    def run(self, calls: Sequence[Call]) -> Iterator[tuple[int, Outcome | Failure]]:
        """Submit every call, then yield results in the order they finish."""
        import ray
        from ray.exceptions import RayError, RayTaskError

        remote = {fn: ray.remote(num_cpus=1, max_retries=self.max_retries)(fn)
                  for fn in {fn for fn, _ in calls}}
        index = {remote[fn].remote(*args): i for i, (fn, args) in enumerate(calls)}
        pending = list(index)
        try:
            while pending:
                done, pending = ray.wait(pending, num_returns=1)
                for ref in done:
                    try:
                        result: Outcome | Failure = ray.get(ref)
                    except RayTaskError as exc:  # the task raised: a bug, not retried
                        result = Failure(_raised(exc.cause) if exc.cause is not None
                                         else str(exc).strip().splitlines()[-1][:500])
                    except RayError as exc:  # its workers kept dying, or it was cancelled
                        result = Failure(f"{type(exc).__name__}: "
                                         f"{str(exc).strip().splitlines()[-1][:400]}")
                    yield index[ref], result
        finally:
            for ref in pending:  # interrupted: stop what is still running
                ray.cancel(ref, force=True)


# --------------------------------------------------------------------------- the sweep


class SweepInterrupted(Exception):
    """The driver was interrupted (Ctrl-C); finished points are kept and tabled."""

    def __init__(self, result: SweepResult) -> None:
        super().__init__(f"{result.done} of {result.points} points done")
        self.result = result


@dataclass(frozen=True)
class Target:
    """A condition on a row, e.g. ``x_floor<=1.1``."""

    metric: str
    op: Literal["<=", "<", ">=", ">"]
    bound: float

    def met(self, row: PointResult) -> bool:
        """Whether the row meets it (a row without a plan never does)."""
        value = row.value(self.metric) if row.ok else None
        if value is None:
            return False
        return {"<=": value <= self.bound, "<": value < self.bound,
                ">=": value >= self.bound, ">": value > self.bound}[self.op]

    def __str__(self) -> str:
        return f"{self.metric}{self.op}{self.bound:g}"


_TARGET_RE = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_.]*)\s*(<=|>=|<|>)\s*([-+0-9.eE]+)\s*$")
TARGET_METRICS = ("x_floor", "x_layer", "dram_bytes", "cycles", "energy_pj")


def parse_target(text: str) -> Target:
    """Read ``METRIC OP NUMBER`` (``x_floor<=1.1``); InputError says what is accepted."""
    m = _TARGET_RE.match(text)
    value: float | None = None
    if m is not None:
        try:
            value = float(m.group(3))
        except ValueError:
            value = None
    if m is None or value is None or m.group(1) not in TARGET_METRICS:
        raise InputError(f"--target {text!r}: write METRIC OP NUMBER, e.g. `x_floor<=1.1`, "
                         f"with METRIC one of {', '.join(TARGET_METRICS)} and OP one of "
                         "<=, <, >=, >.")
    return Target(m.group(1), m.group(2), value)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Probe:
    """Bisection's answer for one capacity curve."""

    model: str
    batch: int | None
    chip: str
    axis: str
    smallest: AxisValue  # the smallest capacity meeting the target; None if none does
    probes: int
    # the rest of the curve's chip family (the report's "smallest chip serving every model")
    rest: tuple[tuple[str, AxisValue], ...] = ()
    rules: str = ""
    solver: str = ""
    objective: str = ""


@dataclass(frozen=True)
class SweepResult:
    """A finished (or interrupted) sweep."""

    points: int  # points in the table
    done: int  # with a plan
    failed: int  # infeasible, error, or the task failed
    skipped: int  # found finished and not planned again (resume)
    rows: tuple[PointResult, ...]
    table: str
    csv: str
    axis_keys: tuple[str, ...]
    wall_s: float
    repaired: int = 0  # points whose plan became a smaller capacity's, re-costed
    bisection: tuple[Probe, ...] = ()
    errored: int = 0  # rows with status `error` (a task raised, or its worker kept dying)
    first_error: str = ""  # the first errored row's message
    warnings: tuple[str, ...] = ()  # curves a repair could not make monotone


def capacity_axes(axis_keys: Sequence[str]) -> tuple[str, ...]:
    """The swept keys that are capacities (``sram.bytes``, ``nram.bytes``, ...)."""
    return tuple(k for k in axis_keys if k.endswith(".bytes"))


def curves(jobs: Sequence[Job], axis: str) -> list[list[Job]]:
    """Points that differ only in ``axis``, each list ordered by increasing value."""
    groups: dict[tuple[Any, ...], list[Job]] = {}
    for j in jobs:
        if j.value(axis) is None:
            continue
        p = j.point
        rest = tuple((k, v) for k, v in j.axis_values if k != axis)
        groups.setdefault((p.model, p.hw, p.chip, p.fixed, rest, p.rules, p.solver,
                           p.objective, p.time_limit), []).append(j)
    return [sorted(g, key=lambda j: j.value(axis)) for g in groups.values()]  # type: ignore[arg-type, return-value]


def monotone_metric(row: PointResult) -> float:
    """The objective's own measure: DRAM bytes, cycles or pJ."""
    return float({"latency": row.cycles, "energy": row.energy_pj}.get(
        row.objective, row.dram_bytes) or 0)


def in_order(row: PointResult, smaller: PointResult) -> bool:
    """Whether ``row`` (a larger capacity) is no worse than ``smaller`` in DRAM bytes and in
    its objective: what a capacity curve promises for every objective (a larger chip holds
    every tile a smaller one held, so it can always do what the smaller one did)."""
    slack = 1e-9 * abs(monotone_metric(smaller))  # pJ are rounded floats
    return (row.ok and (row.dram_bytes or 0) <= (smaller.dram_bytes or 0)
            and monotone_metric(row) <= monotone_metric(smaller) + slack)


def knee(rows: Sequence[PointResult], axis: str) -> PointResult | None:
    """The smallest capacity within 1.1x the floor, else within 5 % of the curve's minimum."""
    ok = sorted((r for r in rows if r.ok and r.value(axis) is not None),
                key=lambda r: r.value(axis))
    if not ok:
        return None
    near_floor = [r for r in ok if r.x_floor is not None and r.x_floor <= 1.1]
    if near_floor:
        return near_floor[0]
    low = min(r.dram_bytes or 0 for r in ok)
    return next(r for r in ok if (r.dram_bytes or 0) <= 1.05 * low)


class _Store:
    """The sweep folder: rows/KEY.json and plans/MODEL-KEY-HASH.json, written atomically by
    the driver. A plan file is named after its content and written before the row that
    points at it, so a row never names a plan it does not match, whenever the driver stops."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.reused = 0  # finished points found here and not planned again
        (out / "rows").mkdir(parents=True, exist_ok=True)
        (out / "plans").mkdir(parents=True, exist_ok=True)

    def row_path(self, job: Job) -> Path:
        """Where a point's row is kept (its address)."""
        return self.out / "rows" / f"{job.key}.json"

    def plan_path(self, job: Job, text: str) -> Path:
        """Where a plan document of the point is kept: named after the model, the address
        and the document's own digest (a re-costed plan never overwrites the row's plan)."""
        stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", Path(job.point.model.model).stem.replace(
            "zoo:", ""))
        digest = hashlib.sha256(text.encode()).hexdigest()[:12]
        return self.out / "plans" / f"{stem}-{job.key[:16]}-{digest}.json"

    def _stored(self, job: Job) -> PointResult | None:
        try:
            return PointResult.from_json(json.loads(self.row_path(job).read_text()))
        except (OSError, ValueError, TypeError, KeyError):
            return None  # missing or unreadable

    def _plan_readable(self, row: PointResult) -> bool:
        try:
            doc = json.loads((self.out / row.plan).read_text())
        except (OSError, ValueError):
            return False
        return isinstance(doc, dict) and "groups" in doc

    def finished(self, job: Job) -> PointResult | None:
        """The stored row of a finished point: a plan whose file exists and parses, or a
        point shown infeasible (planning it again would say so again). A point that erred
        (a bug, a worker that kept dying) is not finished: it is planned again."""
        row = self._stored(job)
        if row is None or row.status == "error":
            return None
        if row.ok or row.plan:
            return row if row.plan and self._plan_readable(row) else None
        return row

    def plan_doc(self, row: PointResult) -> dict[str, Any]:
        """The plan document a stored row points at."""
        return dict(json.loads((self.out / row.plan).read_text()))

    def put(self, job: Job, outcome: Outcome) -> PointResult:
        """Write the plan (if any) under a new name, then the row pointing at it, then delete
        the plan the point's previous row pointed at (stale now). ``outcome.plan`` None keeps
        ``outcome.row.plan`` as it is (a row re-marked, its plan unchanged)."""
        row = outcome.row
        old = self._stored(job)
        if outcome.plan is not None:
            text = json.dumps(outcome.plan, indent=2) + "\n"
            plan_file = self.plan_path(job, text)
            atomic_write(plan_file, text)
            row = replace(row, plan=str(plan_file.relative_to(self.out)))
        atomic_write(self.row_path(job), json.dumps(row.to_json()) + "\n")
        if old is not None and old.plan and old.plan != row.plan:
            (self.out / old.plan).unlink(missing_ok=True)
        return row

    def remove_partial(self) -> None:
        """Delete temporary files a stopped write left behind."""
        for sub in (self.out, self.out / "rows", self.out / "plans"):
            for f in sub.glob(".*.tmp*"):
                f.unlink(missing_ok=True)


def _umask() -> int:
    """The process's umask, read without changing it where Linux says it (``os.umask`` sets
    it while reading it: a race with threads creating files)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write(path: Path, text: str | bytes) -> None:
    """Write a file so that readers see the old content or the new, never half of it, even
    after a power cut (flushed and synced before the rename); its mode follows the umask,
    as a file written with ``open`` would."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes it 0600
        with os.fdopen(fd, "wb") as f:
            f.write(text.encode() if isinstance(text, str) else text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


Progress = Callable[[int, int], None]


def _run(runner: Runner, jobs: Sequence[Job], calls: Sequence[Call],
         keep: Callable[[Job, Outcome], None], progress: Progress | None, counter: list[int],
         total: int) -> None:
    """Run calls (one per job), handing each result to ``keep`` as it arrives."""
    with contextlib.closing(runner.run(calls)) as results:  # type: ignore[type-var]
        for i, result in results:
            job = jobs[i]
            if isinstance(result, Failure):
                result = Outcome(_blank_row(job, "error", result.message))
            keep(job, result)
            counter[0] += 1
            if progress is not None:
                progress(counter[0], total)


def _storing(store: _Store, rows: dict[str, PointResult]) -> Callable[[Job, Outcome], None]:
    def keep(job: Job, outcome: Outcome) -> None:
        rows[job.key] = store.put(job, outcome)

    return keep


def _keeping_in_order(store: _Store, rows: dict[str, PointResult], ref: Mapping[str, Job],
                      improved: list[int], warnings: list[str]
                      ) -> Callable[[Job, Outcome], None]:
    """Store a re-costed result where it puts the point in order with the smaller capacity
    it came from (counting them); otherwise mark the point's own row and warn."""
    def keep(job: Job, got: Outcome) -> None:
        old, smaller = rows[job.key], rows[ref[job.key].key]
        if in_order(got.row, smaller):
            rows[job.key] = store.put(job, got)
            improved[0] += 1
            return
        source = got.row.monotone.removeprefix("re-costed from ") or ref[job.key].key[:12]
        why = (got.row.error if not got.row.ok else
               f"{source}'s plan re-costed here moves {got.row.dram_bytes} DRAM bytes and "
               f"scores {monotone_metric(got.row):g} for {got.row.objective}, not within "
               f"{smaller.dram_bytes} and {monotone_metric(smaller):g}")
        note = f"not monotone: {why}"
        rows[job.key] = store.put(job, Outcome(replace(old, monotone=note[:500])))
        warnings.append(f"{old.model} on {old.chip} {dict(old.axes)}: {note}")

    return keep


def _repair(runner: Runner, store: _Store, jobs: Sequence[Job], axis_keys: Sequence[str],
            rows: dict[str, PointResult], verify: bool, progress: Progress | None,
            counter: list[int], warnings: list[str], tried: set[tuple[str, str]]) -> int:
    """Make every capacity curve non-increasing in DRAM bytes and in its objective. Along a
    curve, a point is in order when it is no worse in both than the nearest smaller capacity
    in order (:func:`in_order`); a point out of order (or without a plan) gets that
    capacity's plan re-costed on its chip, which is kept if it is in order — for latency and
    energy this may trade the point's own better score for fewer bytes: the DRAM curve is
    the promise. A re-costing that fails or does not help marks the row (`monotone`) and adds
    a warning. A point that errored is left as it is (the sweep reports it). ``tried`` holds
    the (point, source) pairs re-costed so far (never twice). Returns how many points
    changed."""
    repaired = 0
    for axis in capacity_axes(axis_keys):
        while True:  # each wave tries pairs not tried before, so it ends
            todo: list[Job] = []
            calls: list[Call] = []
            ref: dict[str, Job] = {}
            for curve in curves([j for j in jobs if j.key in rows], axis):
                best: Job | None = None  # the nearest smaller capacity in order
                for j in curve:
                    row = rows[j.key]
                    if row.status == "error":
                        continue  # a bug or a dead worker: reported (and re-run), not masked
                    if best is not None and not in_order(row, rows[best.key]):
                        if (j.key, best.key) not in tried:
                            tried.add((j.key, best.key))
                            todo.append(j)
                            ref[j.key] = best
                            calls.append((recost_point, (
                                j, store.plan_doc(rows[best.key]), f"{axis}={best.value(axis)}",
                                verify)))
                    elif row.ok:
                        best = j
            if not todo:
                break
            improved = [0]
            _run(runner, todo, calls, _keeping_in_order(store, rows, ref, improved, warnings),
                 progress, counter, counter[0] + len(calls))
            repaired += improved[0]
    return repaired


def _bisect(runner: Runner, store: _Store, jobs: Sequence[Job], axis_keys: Sequence[str],
            target: Target, rows: dict[str, PointResult], verify: bool, resume: bool,
            progress: Progress | None, counter: list[int],
            task: Callable[[Job, bool], Outcome], repair: Callable[[], object]
            ) -> tuple[Probe, ...]:
    """Per capacity curve, the smallest capacity meeting the target, by bisection over the
    axis's values (the target holds from some capacity on); each round's probes of all
    curves run as one batch of tasks, and ``repair`` makes the probed curves monotone before
    their results decide anything."""
    axes = capacity_axes(axis_keys)
    if len(axes) != 1:
        raise InputError(f"--target needs exactly one swept capacity axis (a `*.bytes` key "
                         f"under `sweep:`); the spec sweeps {list(axes) or 'none'}.")
    axis = axes[0]
    lines = curves(jobs, axis)
    bounds = [[0, len(c)] for c in lines]  # answer index in [lo, hi]; hi = len: none meets
    probes = [0] * len(lines)
    while True:
        batch = [(k, (lo + hi) // 2) for k, (lo, hi) in enumerate(bounds) if lo < hi]
        if not batch:
            break
        todo = [lines[k][mid] for k, mid in batch]
        fresh = [j for j in todo
                 if j.key not in rows and not (resume and _reuse(store, j, rows, verify))]
        _run(runner, fresh, [(task, (j, verify)) for j in fresh], _storing(store, rows),
             progress, counter, counter[0] + len(fresh))
        repair()
        for (k, mid), j in zip(batch, todo, strict=True):
            probes[k] += 1
            if target.met(rows[j.key]):
                bounds[k][1] = mid
            else:
                bounds[k][0] = mid + 1
    out = []
    for curve, (lo, _), n in zip(lines, bounds, probes, strict=True):
        first = curve[0]
        p = first.point
        out.append(Probe(p.model.model, p.model.batch, p.chip, axis,
                         curve[lo].value(axis) if lo < len(curve) else None, n,
                         tuple((k, v) for k, v in first.axis_values if k != axis),
                         first.rules_file, p.solver, p.objective))
    return tuple(out)


def _reuse(store: _Store, job: Job, rows: dict[str, PointResult], verify: bool) -> bool:
    """Take a finished point's stored results, if there are (and were verified, if the sweep
    verifies and there is a plan). Only the results come from disk: the labels (model path,
    chip name, rules file, ...) are the current spec's, which may name the same content
    differently."""
    row = store.finished(job)
    if row is not None and verify and row.ok and row.verified is None:
        row = None
    if row is not None:
        rows[job.key] = _relabel(job, row)
        store.reused += 1
    return row is not None


def _relabel(job: Job, row: PointResult) -> PointResult:
    """A stored row with the labels of ``job`` (results, plan and marks kept)."""
    label = _blank_row(job, row.status)
    return replace(row, key=label.key, model=label.model, shapes=label.shapes,
                   batch=label.batch, chip=label.chip, axes=label.axes, rules=label.rules,
                   solver=label.solver, objective=label.objective)


def run_sweep(spec: SweepSpec, out: str | Path, runner: Runner | None = None, *,
              resume: bool = False, verify: bool = False, target: Target | None = None,
              progress: Progress | None = None,
              task: Callable[[Job, bool], Outcome] = solve_point) -> SweepResult:
    """Plan every point of a spec (or, with ``target``, bisect each capacity curve) and write
    the results table. ``runner`` defaults to a :class:`SerialRunner`; pass a
    :class:`RayRunner` (entered) to run on Ray. ``progress(done, total)`` is called after each
    finished task. ``task`` plans one point (:func:`solve_point`; a module-level function, so
    Ray workers can import it). Ctrl-C raises :class:`SweepInterrupted` after keeping what
    finished."""
    started = time.perf_counter()
    runner = runner or SerialRunner()
    out = Path(out)
    store = _Store(out)
    jobs = address(spec.points)  # one address per point (address() rejects duplicates)
    rows: dict[str, PointResult] = {}
    counter = [0]
    probes: tuple[Probe, ...] = ()
    repaired = [0]
    warnings: list[str] = []
    tried: set[tuple[str, str]] = set()

    def repair() -> None:
        repaired[0] += _repair(runner, store, jobs, spec.axis_keys, rows, verify, progress,
                               counter, warnings, tried)

    try:
        if target is not None:
            probes = _bisect(runner, store, jobs, spec.axis_keys, target, rows, verify,
                             resume, progress, counter, task, repair)
        else:
            todo = [j for j in jobs if not (resume and _reuse(store, j, rows, verify))]
            _run(runner, todo, [(task, (j, verify)) for j in todo],
                 _storing(store, rows), progress, counter, len(todo))
        repair()
    except KeyboardInterrupt:
        store.remove_partial()
        result = _finish(spec, store, jobs, rows, started, repaired[0], probes, warnings)
        raise SweepInterrupted(result) from None
    return _finish(spec, store, jobs, rows, started, repaired[0], probes, warnings)


def _finish(spec: SweepSpec, store: _Store, jobs: Sequence[Job],
            rows: Mapping[str, PointResult], started: float, repaired: int,
            probes: tuple[Probe, ...], warnings: Sequence[str]) -> SweepResult:
    """Write the table of the finished rows (spec order)."""
    from fuseplan.planner.app.sweep_table import write_table

    ordered = [rows[j.key] for j in jobs if j.key in rows]
    table, csv = write_table(ordered, spec.axis_keys, spec.batched, store.out / "sweep")
    done = sum(r.ok for r in ordered)
    errors = [r for r in ordered if r.status == "error"]
    return SweepResult(len(ordered), done, len(ordered) - done, store.reused, tuple(ordered),
                       str(table), str(csv), spec.axis_keys,
                       round(time.perf_counter() - started, 3), repaired, probes,
                       len(errors), errors[0].error if errors else "", tuple(warnings))
