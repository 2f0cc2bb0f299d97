"""A sweep's SPEC file: read, validated, and expanded into its points (README "Sweeps").

:func:`load_spec` reads the file; every error names FILE:LINE:COL and the fix. The points are
the cross product models x chips x axis values x rules x solvers x objectives, or the spec's
explicit ``points:`` list. Models, chips and rule contents are resolved later, by
:func:`fuseplan.planner.app.sweep.keys.address`.

A spec may make at most :data:`MAX_POINTS` points: the count is the product of the list
lengths, computed before any point is made, so a small file that multiplies out to millions
of points is refused at once instead of filling the memory.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ruamel.yaml.comments import CommentedSeq

from fuseplan.hardware.chip import DEFAULT_PRESET
from fuseplan.planner.app import api
from fuseplan.planner.core.errors import InputError
from fuseplan.planner.core.yamlio import did_you_mean, load_yaml, where
from fuseplan.planner.cost.objective import Objective
from fuseplan.planner.front.onnx_load import declared_input_dims
from fuseplan.rules.ruleset import load_rules

__all__ = ["MAX_POINTS", "Axis", "AxisValue", "ChipEntry", "ModelEntry", "Point", "Shapes",
           "SweepSpec", "expand", "load_spec"]

MAX_POINTS = 100_000  # points one spec may make (a day of planning at a second a point)

Shapes = tuple[tuple[str, tuple[int, ...]], ...]
AxisValue = int | float | str | bool | None

_TOP_KEYS = ("name", "models", "chips", "rules", "objectives", "solvers", "time_limit", "points")
_MODEL_KEYS = ("model", "shapes", "batch")
_CHIP_KEYS = ("hw", "name", "set", "sweep")
_POINT_KEYS = ("model", "shapes", "batch", "hw", "name", "set", "rules", "objective", "solver")
_OBJECTIVES = tuple(o.value for o in Objective)


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
        if len(points) > MAX_POINTS:  # each point is written out (and batches are few)
            raise InputError(f"{path}: the spec lists {len(points):,} points, more than the "
                             f"{MAX_POINTS:,} one sweep may plan. Split it into several "
                             "sweeps.")
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
    objectives = _choices(path, node, "objectives", "objective", _OBJECTIVES, "traffic")
    solvers = _choices(path, node, "solvers", "solver", api.SOLVERS, "cpsat")
    _bounded(path, len(models), chips, _count(node, "rules"), len(solvers), len(objectives))
    rules = _rules_list(path, node)
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


def _count(node: Mapping[str, Any], key: str) -> int:
    """How many values ``node[key]`` lists (1 for one value or none)."""
    value = node.get(key)
    return len(value) if isinstance(value, CommentedSeq) else 1


def _bounded(path: Path, models: int, chips: Sequence[ChipEntry], rules: int, solvers: int,
             objectives: int) -> None:
    """Refuse a spec that makes more than MAX_POINTS points, counted from the list lengths
    (no point is made): models x (sum over chips of the product of their axes' lengths) x
    rules x solvers x objectives."""
    per_chip = [math.prod(len(a.values) for a in c.axes) for c in chips]
    total = models * sum(per_chip) * rules * solvers * objectives
    if total <= MAX_POINTS:
        return
    axes = " + ".join(" x ".join(str(len(a.values)) for a in c.axes) or "1" for c in chips)
    factors = " x ".join((_counted(models, "model"), f"({axes}) chip settings",
                          _counted(rules, "rule file"), _counted(solvers, "solver"),
                          _counted(objectives, "objective")))
    raise InputError(f"{path}: the spec makes {total:,} points ({factors}), more than the "
                     f"{MAX_POINTS:,} one sweep may plan. Sweep fewer values, or split the spec "
                     "into several sweeps.")


def _counted(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


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
