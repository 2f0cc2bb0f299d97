"""The plan file's JSON document as typed field specs: one schema that writes plan files
(planner.plan.json_io.plan_to_json builds its documents from these fields and checks them)
and reads them (every command that opens a plan file validates it here first).

A bad value is refused with its JSON path (``groups[3].tile.h``), what was expected, what
was found and what to do, as an InputError (exit 2).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fuseplan.hardware.chip import (
    CLOCK_GHZ_RANGE,
    GBPS_RANGE,
    MAX_COUNT,
    MAX_MEMORY_BYTES,
    MAX_PJ,
    MAX_STATIC_MW,
    MAX_UNITS,
)
from fuseplan.planner.core.errors import InputError
from fuseplan.planner.cost.counters import Counters
from fuseplan.planner.cost.objective import Objective
from fuseplan.planner.plan.placement import HaloMode

# plan files are a few MB even for the largest zoo models; past this, refuse before parsing
MAX_PLAN_BYTES = 64 * 2**20
# counters are exact integers; past 2**62 they are not a plan's but an edit's
MAX_INT = 2**62
MAX_NAME_CHARS = 512
FIX = "Correct it, or write the plan again with `fuseplan solve MODEL -o PLAN.json`."


class SchemaError(Exception):
    """A value at `path` of a plan document is not what the schema allows."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem


def _shown(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=True) if _jsonable(value) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _jsonable(value: Any) -> bool:
    try:
        json.dumps(value, allow_nan=True)
    except (TypeError, ValueError):
        return False
    return True


def _kind(value: Any) -> str:
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
             list: "a list", dict: "an object", type(None): "null"}
    return names.get(type(value), type(value).__name__)


class Spec:
    """What one JSON value must be."""

    def check(self, value: Any, path: str) -> None:
        """Raise SchemaError naming `path` when `value` does not conform."""
        raise NotImplementedError


@dataclass(frozen=True)
class Int(Spec):
    """An integer (not a boolean, not 1.0) in [lo, hi]."""

    lo: int = 0
    hi: int = MAX_INT

    def check(self, value: Any, path: str) -> None:
        if isinstance(value, bool) or not isinstance(value, int):
            raise SchemaError(path, f"must be an integer, got {_kind(value)} {_shown(value)}")
        if value < self.lo:
            raise SchemaError(path, f"must be at least {self.lo:,}, got {value:,}")
        if value > self.hi:
            raise SchemaError(path, f"must be at most {self.hi:,}, got {value:,}")


@dataclass(frozen=True)
class Num(Spec):
    """A finite number (integer or float, not a boolean) in [lo, hi]."""

    lo: float = 0.0
    hi: float = math.inf

    def check(self, value: Any, path: str) -> None:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise SchemaError(path, f"must be a number, got {_kind(value)} {_shown(value)}")
        if isinstance(value, float) and not math.isfinite(value):
            raise SchemaError(path, f"must be a finite number, got {value}")
        if value < self.lo:
            raise SchemaError(path, f"must be at least {self.lo:g}, got {value:g}")
        if value > self.hi:
            raise SchemaError(path, f"must be at most {self.hi:g}, got {value:g}")


@dataclass(frozen=True)
class Bool(Spec):
    """true or false."""

    def check(self, value: Any, path: str) -> None:
        if not isinstance(value, bool):
            raise SchemaError(path, f"must be true or false, got {_kind(value)} "
                                    f"{_shown(value)}")


@dataclass(frozen=True)
class Str(Spec):
    """A string; `name` strings (layer names) are also short and not empty. A name is the
    model's node name as ONNX allows it, control and bidirectional-format characters
    included: JSON escapes them in the file (``\\n``, ``\\u202e``), and the command line
    shows them escaped (planner.ui.cli_common), so no name rewrites the terminal line."""

    name: bool = False
    max_chars: int = 4096

    def check(self, value: Any, path: str) -> None:
        if not isinstance(value, str):
            raise SchemaError(path, f"must be a string, got {_kind(value)} {_shown(value)}")
        limit = MAX_NAME_CHARS if self.name else self.max_chars
        if len(value) > limit:
            raise SchemaError(path, f"is {len(value):,} characters long (at most {limit:,})")
        if self.name and not value:
            raise SchemaError(path, "must not be empty")


@dataclass(frozen=True)
class OneOf(Spec):
    """One of a few literal values."""

    values: tuple[Any, ...]

    def check(self, value: Any, path: str) -> None:
        if isinstance(value, bool) or value not in self.values:
            wanted = " or ".join(json.dumps(v) for v in self.values)
            raise SchemaError(path, f"must be {wanted}, got {_shown(value)}")


@dataclass(frozen=True)
class Nullable(Spec):
    """null or what `inner` allows."""

    inner: Spec

    def check(self, value: Any, path: str) -> None:
        if value is not None:
            self.inner.check(value, path)


@dataclass(frozen=True)
class AnyJson(Spec):
    """Any JSON value (kept as written, read by code that checks it itself)."""

    def check(self, value: Any, path: str) -> None:
        return None


@dataclass(frozen=True)
class ListOf(Spec):
    """A list of `item`s, at least `min_len` of them."""

    item: Spec
    min_len: int = 0

    def check(self, value: Any, path: str) -> None:
        if not isinstance(value, list):
            raise SchemaError(path, f"must be a list, got {_kind(value)} {_shown(value)}")
        if len(value) < self.min_len:
            raise SchemaError(path, f"must hold at least {self.min_len} item(s), got "
                                    f"{len(value)}")
        for i, v in enumerate(value):
            self.item.check(v, f"{path}[{i}]")


@dataclass(frozen=True)
class MapOf(Spec):
    """An object with free keys, every value an `item`."""

    item: Spec

    def check(self, value: Any, path: str) -> None:
        if not isinstance(value, dict):
            raise SchemaError(path, f"must be an object, got {_kind(value)} {_shown(value)}")
        for k, v in value.items():
            self.item.check(v, f"{path}.{k}")


@dataclass(frozen=True)
class Key:
    """One key of an object: its spec, and whether a plan file must have it."""

    name: str
    spec: Spec
    required: bool = True


@dataclass(frozen=True)
class Obj(Spec):
    """An object with known keys (unknown keys are allowed: CONTRACT.md lets plan files
    carry new keys, and older readers ignore them)."""

    keys: tuple[Key, ...]

    def check(self, value: Any, path: str) -> None:
        if not isinstance(value, dict):
            raise SchemaError(path, f"must be an object, got {_kind(value)} {_shown(value)}")
        for key in self.keys:
            where = f"{path}.{key.name}" if path else key.name
            if key.name not in value:
                if key.required:
                    raise SchemaError(where, "is missing")
                continue
            key.spec.check(value[key.name], where)

    @property
    def names(self) -> tuple[str, ...]:
        """The keys, in the order plan files write them."""
        return tuple(k.name for k in self.keys)


def _counter_spec(name: str) -> Spec:
    if name == "energy_pj":
        return Num()
    # halo reuse can read less than "each input once" on a regrouped plan: a negative excess
    return Int(-MAX_INT) if name == "redundant_read_bytes" else Int()


# A group's predicted counters: every field of Counters, in its order.
PREDICTED = Obj(tuple(Key(f, _counter_spec(f), required=False)
                      for f in Counters.__dataclass_fields__))
# The plan's totals, in the order plan files write them.
TOTALS_KEYS = ("dram_read_bytes", "dram_write_bytes", "dram_bytes", "weight_read_bytes",
               "redundant_read_bytes", "sram_peak_bytes", "compulsory_dram_bytes",
               "layer_by_layer_dram_bytes", "macs", "array_macs", "vector_ops", "cycles",
               "energy_pj")
TOTALS = Obj(tuple(Key(k, _counter_spec(k), required=False) for k in TOTALS_KEYS))

TILE = Obj((Key("n", Int(1)), Key("h", Int(1)), Key("w", Int(1)),
            Key("bands", Int(1), required=False)))

GROUP = Obj((
    Key("id", Int(0)),
    Key("layers", ListOf(Str(name=True), min_len=1)),
    Key("fused", Bool(), required=False),
    Key("mode", OneOf(("big", "small")), required=False),
    Key("tile", TILE),
    Key("weights_resident", Bool(), required=False),
    Key("double_buffered", Bool(), required=False),
    Key("halo", OneOf(tuple(h.value for h in HaloMode)), required=False),
    Key("prefetch", Bool(), required=False),
    Key("passes", Int(1), required=False),
    Key("inputs_held", Bool(), required=False),
    Key("maps_held", Bool(), required=False),
    Key("hidden_chunks", Int(1), required=False),
    Key("inputs_reloaded", Bool(), required=False),
    Key("end_chunks", Int(1), required=False),
    Key("cluster_split", Bool(), required=False),
    Key("keys_spilled", Bool(), required=False),
    Key("keys_in_wram", Bool(), required=False),
    Key("predicted", PREDICTED, required=False),
))

MODEL = Obj((
    Key("path", Str(), required=False),
    Key("sha256", Str(max_chars=64)),
    Key("inputs", MapOf(ListOf(Int(1))), required=False),
))

# The embedded chip ("spec") is rebuilt by hardware.chip.chip_from_dict; here its values must
# lie in the ranges chip files are held to (hardware.chip), which keep the planners' numbers
# in range.
_GBPS = Num(*GBPS_RANGE)
_LEVEL = Obj((Key("bytes", Int(1, MAX_MEMORY_BYTES), required=False),
              Key("bandwidth_gbps", Nullable(_GBPS), required=False),
              Key("pj_per_byte", Num(0, MAX_PJ), required=False)))
_UNIT = Num(0, max(MAX_UNITS, MAX_PJ))
_CORE = Obj((Key("macs_per_cycle", _UNIT, required=False),
             Key("vector_lanes", _UNIT, required=False),
             Key("pj_per_mac", _UNIT, required=False),
             Key("pj_per_vector_op", _UNIT, required=False),
             # a MAC array (hardware.chip.Array); absent on chips without one
             Key("array", Obj((Key("rows", Int(1, MAX_UNITS)), Key("cols", Int(1, MAX_UNITS)),
                               Key("dataflow", OneOf(("weight_stationary",))))),
                 required=False)))
CHIP_SPEC = Obj((
    Key("name", Str(), required=False),
    Key("dtype_bytes", OneOf((1, 2, 4)), required=False),
    Key("clock_ghz", Num(*CLOCK_GHZ_RANGE), required=False),
    Key("clusters", Int(1, MAX_COUNT), required=False),
    Key("cores_per_cluster", Int(1, MAX_COUNT), required=False),
    Key("dram", _LEVEL, required=False),
    Key("sram", _LEVEL, required=False),
    Key("nram", Nullable(_LEVEL), required=False),  # null on single-memory chips
    Key("wram", Nullable(_LEVEL), required=False),
    Key("core", _CORE, required=False),
    Key("dma", MapOf(Nullable(_GBPS)), required=False),
    Key("static_power_mw", Num(0, MAX_STATIC_MW), required=False),
    Key("description", Str(), required=False),
))

HARDWARE = Obj((
    Key("name", Str(), required=False),
    Key("file", Nullable(Str()), required=False),
    Key("overrides", ListOf(Str()), required=False),
    Key("spec", CHIP_SPEC, required=False),
))

RULES = Obj((
    Key("file", Nullable(Str()), required=False),
    Key("sha256", Nullable(Str(max_chars=64)), required=False),
))

SOLVER = Obj((
    Key("name", Str(), required=False),
    Key("status", Str(), required=False),
    Key("gap", Nullable(Num()), required=False),
    Key("wall_s", Nullable(Num()), required=False),
))

# What the plan is measured against (planner.plan.io_bounds): derived from the groups, written
# by the planners, not read back
ATTENTION_IO = Obj(tuple(Key(k, Str() if k == "layer" else Int(), required=False) for k in (
    "layer", "group", "q_bytes", "kv_bytes", "passes", "kv_read_bytes", "o_bytes",
    "analytic_bytes", "group_dram_bytes")))
KV_CACHE = Obj((Key("caches", Int(), required=False), Key("read_bytes", Int(), required=False),
                Key("new_bytes", Int(), required=False),
                Key("ideal_bytes", Int(), required=False), Key("x_ideal", Num(), required=False)))
IO_BOUNDS = Obj((
    Key("attentions", ListOf(ATTENTION_IO), required=False),
    Key("io_bound_bytes", Int(), required=False),
    Key("x_io_bound", Num(), required=False),
    Key("kv_cache", KV_CACHE, required=False),
))

PLAN = Obj((
    Key("fuseplan_plan", OneOf((1,))),
    Key("model", MODEL),
    Key("hardware", HARDWARE, required=False),
    Key("rules", RULES, required=False),
    Key("objective", OneOf(tuple(o.value for o in Objective)), required=False),
    Key("solver", SOLVER, required=False),
    Key("groups", ListOf(GROUP, min_len=1)),
    Key("totals", TOTALS, required=False),
    Key("io_bounds", IO_BOUNDS, required=False),
))


@dataclass(frozen=True)
class Span(Spec):
    """A dynamic range [LO, HI] of positive integers with LO <= HI."""

    def check(self, value: Any, path: str) -> None:
        ListOf(Int(1)).check(value, path)
        if len(value) != 2:
            raise SchemaError(path, f"must hold 2 items [LO, HI], got {len(value)}")
        if value[0] > value[1]:
            raise SchemaError(path, f"must be [LO, HI] with LO <= HI, got {_shown(value)}")


@dataclass(frozen=True)
class Axes(Spec):
    """An input's dynamic axes: axis number (a string of digits, JSON keys are strings) ->
    its range."""

    def check(self, value: Any, path: str) -> None:
        MapOf(AnyJson()).check(value, path)
        if not value:
            raise SchemaError(path, "must name at least one axis")
        for axis, span in value.items():
            if not (axis.isascii() and axis.isdigit()):
                raise SchemaError(path, f"has axis {_shown(axis)}; axes are numbers written "
                                        "as strings (\"2\")")
            Span().check(span, f"{path}.{axis}")


# The dynamic plan file (seed 002, planner.app.dynamic.dynamic_doc): a static plan at the
# largest shape, plus a unit library per group and the "dynamic" settings.
TAIL_MODES = ("pad", "overlap", "variable", "tail-range")
COMBINATIONS = ("simple", "optimized")
UNIT = Obj((Key("id", Int(0)), Key("h", Int(0)), Key("w", Int(0))))
DYNAMIC = Obj((
    Key("ranges", MapOf(Axes())),
    Key("tail_mode", OneOf(TAIL_MODES)),
    Key("combination", OneOf(COMBINATIONS)),
    Key("tail_range", Int(0)),
))


def _with(obj: Obj, *keys: Key) -> Obj:
    """`obj` with `keys` replacing its keys of the same name, or added after them."""
    new = {k.name: k for k in keys}
    return Obj(tuple(new.pop(k.name, k) for k in obj.keys) + tuple(new.values()))


DYNAMIC_PLAN = _with(
    PLAN,
    Key("model", _with(MODEL, Key("path", Str()))),  # `table` loads the model from it
    Key("groups", ListOf(_with(GROUP, Key("units", ListOf(UNIT, min_len=1))), min_len=1)),
    Key("dynamic", DYNAMIC),
)
# A parameter table as `fuseplan table --json` prints it and its cache stores it
# (planner.app.dynamic.table_summary, TableCache).
_SPAN = ListOf(Int(0))
TABLE = Obj((
    Key("entries", ListOf(Obj((Key("group", Int(0)), Key("unit", Int(0)), Key("n", _SPAN),
                               Key("h", _SPAN), Key("w", _SPAN), Key("waste", Int(0)))))),
    Key("tail_mode", OneOf(TAIL_MODES)),
    Key("combination", OneOf(COMBINATIONS)),
    Key("waste", Num()),
    Key("invocations", Int(0)),
    Key("buckets", Int(0)),
    Key("cost", MapOf(Num(-math.inf))),
))


def is_table(doc: Any) -> bool:
    """Whether `doc` is a whole parameter table (a cache entry may be stale or corrupt)."""
    try:
        TABLE.check(doc, "")
    except SchemaError:
        return False
    return True


FIX_DYNAMIC = ("Correct it, or write the plan again with `fuseplan solve MODEL --dynamic "
               "NAME:AXIS=LO..HI -o PLAN.json`.")


def validate(doc: Any, source: str) -> dict[str, Any]:
    """`doc` checked against the plan schema; InputError naming `source`, the JSON path of
    the first bad value and the fix otherwise."""
    return _validated(PLAN, doc, source, FIX)


def validate_dynamic(doc: Any, source: str) -> dict[str, Any]:
    """`doc` checked against the dynamic plan schema (the plan schema, a unit library per
    group, the "dynamic" settings); InputError naming the JSON path otherwise."""
    return _validated(DYNAMIC_PLAN, doc, source, FIX_DYNAMIC)


def _validated(spec: Obj, doc: Any, source: str, fix: str) -> dict[str, Any]:
    try:
        spec.check(doc, "")
        _check_ids(doc["groups"])
    except SchemaError as exc:
        where = exc.path or "the document"
        raise InputError(f"{source}: {where} {exc.problem}. {fix}") from None
    return doc  # type: ignore[no-any-return]


def _check_ids(groups: Sequence[Mapping[str, Any]]) -> None:
    # groups are numbered in execution order (planner.app.assemble): an id is its position
    for i, g in enumerate(groups):
        if g["id"] != i:
            raise SchemaError(f"groups[{i}].id", f"must be {i} (groups are numbered 0, 1, ... in "
                                                 f"execution order), got {g['id']}")


def read_json(path: Path, what: str = "plan file",
              create: str = "`fuseplan solve MODEL -o PLAN.json`") -> Any:
    """A JSON file's document, refused (InputError) when missing, unreadable, larger than
    MAX_PLAN_BYTES (before parsing it) or not JSON."""
    try:
        size = path.stat().st_size
        if size > MAX_PLAN_BYTES:
            raise InputError(f"{path}: {size:,} bytes is too large for a {what} (at most "
                             f"{MAX_PLAN_BYTES:,}); pass the {what} {create} wrote.")
        text = path.read_text(encoding="utf-8")
        # NaN and Infinity are not JSON; refuse them rather than let them through as floats
        return json.loads(text, parse_constant=_no_constant)
    except FileNotFoundError:
        raise InputError(f"{path}: no such {what}. Create one with {create}.") from None
    except IsADirectoryError:
        raise InputError(f"{path}: is a directory, not a {what}. Name the file.") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read the {what} ({exc.strerror}). Check the path "
                         "and its permissions.") from None
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError, ValueError) as exc:
        raise InputError(f"{path}: not a JSON {what} ({str(exc)[:200]}). Create one with "
                         f"{create}.") from None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def read_plan_doc(path: Path) -> dict[str, Any]:
    """A static plan file's document, validated against the schema (InputError otherwise)."""
    doc = read_json(path)
    if not isinstance(doc, dict) or doc.get("fuseplan_plan") != 1:
        raise InputError(f"{path}: not a fuseplan plan (expected \"fuseplan_plan\": 1 at the "
                         "top of the document). Create one with "
                         "`fuseplan solve MODEL -o PLAN.json`.")
    return validate(doc, str(path))
