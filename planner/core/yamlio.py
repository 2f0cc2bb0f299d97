"""YAML loading shared by chip and rule files, with errors that point at line:column.

Every user-facing YAML file goes through the same three steps::

    node = load_yaml(path)                          # CommentedMap with line/column info
    apply_overrides(node, ["sram.bytes=256KiB"], "--set", cls=Chip)
    chip = build_dataclass(Chip, node, path, "chip file")

A frozen dataclass *is* the schema: its fields are exactly the YAML keys, its
annotations give the accepted types, and ``field(metadata=...)`` adds the few
extra checks a type cannot express:

- ``{"size": True}`` on an ``int`` field: accept ``512KiB``/``2MiB``/``64KB``/plain bytes;
- ``{"gt": 0}`` / ``{"ge": 0}``: numeric lower bounds (exclusive / inclusive);
- ``{"le": 2**40}``: a numeric upper bound (messages then name the whole range);
- ``{"choices": (1, 2, 4)}``: the value must be one of these.

Any problem becomes an :class:`~planner.core.errors.InputError` whose one-paragraph
message starts with ``FILE:LINE:COL`` (1-based) and says what to do.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import re
import stat
import types
from collections.abc import Iterable, Mapping, Sequence
from decimal import Decimal, InvalidOperation
from enum import Enum
from pathlib import Path
from typing import Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.error import MarkedYAMLError, YAMLError
from ruamel.yaml.events import AliasEvent, CollectionEndEvent, CollectionStartEvent, ScalarEvent

from fuseplan.planner.core.errors import InputError
from fuseplan.planner.core.files import kind_of, read_input

__all__ = [
    "MAX_YAML_ALIASES",
    "MAX_YAML_BYTES",
    "MAX_YAML_DEPTH",
    "MAX_YAML_NODES",
    "apply_overrides",
    "build_dataclass",
    "did_you_mean",
    "load_yaml",
    "parse_size",
    "where",
]

T = TypeVar("T")

# Attribute set on a CommentedMap by apply_overrides: {key: "--set a.b=VALUE"} for every
# key whose value came from an override rather than from the file. A map created by an
# override (its section was absent from the file) carries its origin in _ORIGIN_ATTR.
_OVERRIDES_ATTR = "_fuseplan_overrides"
_ORIGIN_ATTR = "_fuseplan_origin"

_SIZE_UNITS: dict[str, int] = {
    "": 1,
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")
_SIZE_FORMS = (
    "a whole number of bytes (4096) or a number with a unit: "
    "KiB/MiB/GiB (1024-based, e.g. 512KiB, 1.5MiB) or KB/MB/GB (1000-based, e.g. 64KB)"
)
_OVERRIDE_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
# chip and rule files are a few kB; past this a file is refused before it is parsed
MAX_YAML_BYTES = 10 * 2**20
# real files nest a handful of levels and rarely use an alias; these bounds refuse a hostile
# document (20,000 levels would overflow the composer's recursion; aliases can multiply a
# small file into billions of values) before it is composed
MAX_YAML_DEPTH = 64
MAX_YAML_ALIASES = 1000
MAX_YAML_NODES = 1_000_000
# no integer setting may exceed this in magnitude: CP-SAT and the cost model count in int64
MAX_INT = 2**62


# --------------------------------------------------------------------------- loading


def _one_paragraph(text: str) -> str:
    """Collapse whitespace and newlines so a message stays one paragraph."""
    return " ".join(text.split())


def _too_large(path: Path) -> str:
    return (f"{path}: the file is larger than {MAX_YAML_BYTES:,} bytes, too large for a "
            "fuseplan YAML file (chip, rules and sweep files are a few kB); it is refused "
            "before parsing. Check that you passed the right file, and remove the bulk from it.")


def _check_shape(text: str, path: Path) -> None:
    """Refuse, from the parser's events (read iteratively, without recursion), a document
    nested deeper than MAX_YAML_DEPTH or whose aliases exceed MAX_YAML_ALIASES or expand it
    past MAX_YAML_NODES nodes ("billion laughs"); the InputError names FILE:LINE:COL."""
    depth = aliases = total = 0
    sizes: dict[str, int] = {}  # anchor -> nodes of the anchored value, aliases expanded
    stack: list[list[Any]] = []  # per open collection: [anchor, nodes so far]

    def place(event: Any) -> str:
        mark = event.start_mark
        return f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)

    for event in YAML(typ="rt").parse(text):
        if isinstance(event, CollectionStartEvent):
            depth += 1
            if depth > MAX_YAML_DEPTH:
                raise InputError(
                    f"{place(event)}: the YAML is nested more than {MAX_YAML_DEPTH} levels "
                    "deep, far past any fuseplan file; it is refused. Flatten the structure "
                    "at that place."
                )
            stack.append([event.anchor, 1])
            total += 1
        elif isinstance(event, CollectionEndEvent):
            depth -= 1
            anchor, size = stack.pop()
            if anchor is not None:
                sizes[anchor] = size
            if stack:
                stack[-1][1] += size
        elif isinstance(event, AliasEvent | ScalarEvent):
            size = sizes.get(event.anchor, 1) if isinstance(event, AliasEvent) else 1
            if isinstance(event, AliasEvent):
                aliases += 1
            elif event.anchor is not None:
                sizes[event.anchor] = 1
            total += size
            if stack:
                stack[-1][1] += size
            if aliases > MAX_YAML_ALIASES or total > MAX_YAML_NODES:
                raise InputError(
                    f"{place(event)}: the YAML uses more than {MAX_YAML_ALIASES:,} aliases or "
                    f"expands through them to more than {MAX_YAML_NODES:,} values; it is "
                    "refused. Write the values out instead of repeating anchors (*name)."
                )


def load_yaml(path: Path | str) -> CommentedMap:
    """Load a YAML file whose top level is a mapping, keeping line/column information.

    Raises InputError ("FILE:LINE:COL: ...") for a missing or unreadable file, a YAML
    syntax error, or a top level that is not a mapping.
    """
    path = Path(path)
    try:
        st = os.stat(path)
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError
        if not stat.S_ISREG(st.st_mode):  # decided before open(): a FIFO would block it
            raise InputError(
                f"{path}: is {kind_of(st.st_mode)}, not a regular file, so it is refused "
                "before it is opened (reading it would never end or would block). Pass the "
                "path of a YAML file (a chip, rule or sweep file)."
            )
        if st.st_size > MAX_YAML_BYTES:
            raise InputError(_too_large(path))
        data = read_input(path, "YAML file", MAX_YAML_BYTES, "Pass the path of a YAML file.")
        text = data.decode("utf-8")
    except FileNotFoundError:
        raise InputError(
            f"{path}: file not found. Check the path (relative paths are resolved "
            f"from the current directory {Path.cwd()})."
        ) from None
    except IsADirectoryError:
        raise InputError(
            f"{path}: is a directory, not a YAML file. Give the file's path."
        ) from None
    except UnicodeDecodeError as exc:
        raise InputError(
            f"{path}: is not UTF-8 text ({exc.reason} at byte {exc.start}). "
            "Save the file as UTF-8 YAML."
        ) from None
    except OSError as exc:
        raise InputError(
            f"{path}: cannot be read ({exc.strerror}). Check that it exists and is readable."
        ) from None

    yaml = YAML(typ="rt")
    try:
        _check_shape(text, path)  # before composing: ruamel's composer recurses per level
        data = yaml.load(text)
    except RecursionError:  # a safety net: _check_shape refuses such depths first
        raise InputError(
            f"{path}: the YAML is nested too deeply to read. Flatten the file (at most "
            f"{MAX_YAML_DEPTH} levels)."
        ) from None
    except MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        place = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
        what = " ".join(part for part in (exc.context, exc.problem) if part)
        raise InputError(
            _one_paragraph(
                f"{place}: invalid YAML: {what or 'syntax error'}. Fix the syntax at that place "
                "(check indentation, quoting, and the ':' after each key)."
            )
        ) from None
    except YAMLError as exc:
        raise InputError(
            _one_paragraph(f"{path}: invalid YAML: {exc}. Fix the file's syntax.")
        ) from None

    if not isinstance(data, CommentedMap):
        kind = "empty" if data is None else _with_article(_kind(data))
        raise InputError(
            f"{path}:1:1: the top level must be a mapping of `key: value` lines, but the file "
            f"is {kind}. Write the settings as `key: value`, one per line."
        )
    return data


# --------------------------------------------------------------------------- locations


def _line_col(node: Any, key: Any, *, value: bool) -> tuple[int, int] | None:
    """0-based (line, col) of ``node[key]`` (or of ``node``), if ruamel recorded it."""
    lc = getattr(node, "lc", None)
    if lc is None:
        return None
    if key is None:
        if lc.line is None:
            return None
        return int(lc.line), int(lc.col)
    if lc.data is None or key not in lc.data:
        return None
    entry = lc.data[key]
    if isinstance(node, CommentedSeq) or not value:
        return int(entry[0]), int(entry[1])
    return int(entry[2]), int(entry[3])


def where(path: Path | str, node: Any, key: Any = None, *, value: bool = False) -> str:
    """Return "FILE:LINE:COL" (1-based) of ``key`` in ``node``, or of ``node`` itself.

    ``key`` is a mapping key or a list index; with ``value=True`` the place of the key's
    value is given instead of the key's. A value set by :func:`apply_overrides` is located
    as "FILE (--set a.b=VALUE)", and a node without position information as "FILE".
    """
    overrides: dict[Any, str] = getattr(node, _OVERRIDES_ATTR, None) or {}
    if key is not None and key in overrides:
        return f"{path} ({overrides[key]})"
    pos = _line_col(node, key, value=value)
    if pos is None and key is not None:
        pos = _line_col(node, None, value=False)
    if pos is None:
        origin = getattr(node, _ORIGIN_ATTR, None)
        return f"{path} ({origin})" if origin else str(path)
    return f"{path}:{pos[0] + 1}:{pos[1] + 1}"


def did_you_mean(word: str, options: Iterable[str]) -> str:
    """Return " Did you mean 'x'?" for the closest option to ``word``, or "" if none is close."""
    matches = difflib.get_close_matches(str(word), list(options), n=1, cutoff=0.6)
    return f" Did you mean '{matches[0]}'?" if matches else ""


# --------------------------------------------------------------------------- sizes


def parse_size(value: object) -> int:
    """Parse a byte size: an int, or a string such as "512KiB", "1.5MiB", "64KB", "4096".

    KiB/MiB/GiB are powers of 1024, KB/MB/GB powers of 1000 (units are case-insensitive,
    "B" alone means bytes). The result must be a whole, non-negative number of bytes.
    Raises ValueError naming the accepted forms for anything else.
    """
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"expected a size, got {_show(value)}; write {_SIZE_FORMS}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"a size cannot be negative, got {int(value)}")
        return int(value)
    match = _SIZE_RE.match(value)
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _SIZE_UNITS:
        raise ValueError(f"cannot read {str(value)!r} as a size; write {_SIZE_FORMS}")
    try:
        number = Decimal(match.group(1))
    except InvalidOperation:  # pragma: no cover - the regex only lets decimals through
        raise ValueError(f"cannot read {str(value)!r} as a size; write {_SIZE_FORMS}") from None
    nbytes = number * _SIZE_UNITS[unit]
    if nbytes != nbytes.to_integral_value():
        raise ValueError(
            f"{str(value)!r} is {nbytes} bytes, not a whole number of bytes; "
            "use a smaller unit or plain bytes"
        )
    return int(nbytes)


# --------------------------------------------------------------------------- dataclasses


def _kind(value: object) -> str:
    """A short name for a YAML value's kind ("mapping", "list", "string", ...)."""
    if isinstance(value, Mapping):
        return "mapping"
    if isinstance(value, list | tuple):
        return "list"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return type(value).__name__


def _with_article(noun: str) -> str:
    return f"an {noun}" if noun[:1] in "aeiou" else f"a {noun}"


def _show(value: object) -> str:
    """Render a YAML value the way the user wrote it, for messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(int(value))
    if isinstance(value, float):
        return repr(float(value))
    if isinstance(value, str):
        return repr(str(value))
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "a list"
    return repr(value)


def _optional_arg(tp: Any) -> Any | None:
    """For ``X | None`` return X; for anything else None."""
    if get_origin(tp) in (Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(get_args(tp)) == 2:
            return args[0]
    return None


def _expected(tp: Any, meta: Mapping[str, Any]) -> str:
    """Describe the values a field accepts, e.g. "an integer" or "one of 'a', 'b'"."""
    inner = _optional_arg(tp)
    if inner is not None:
        return f"{_expected(inner, meta)} or null"
    if "choices" in meta:
        return "one of " + ", ".join(_show(c) for c in meta["choices"])
    origin = get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(_show(c) for c in get_args(tp))
    if isinstance(tp, type) and issubclass(tp, Enum):
        return "one of " + ", ".join(_show(c.value) for c in tp)
    if origin is tuple:
        return f"a list of {_plural(get_args(tp)[0])}"
    if dataclasses.is_dataclass(tp):
        keys = ", ".join(f.name for f in dataclasses.fields(tp))
        return f"a mapping with keys {keys}"
    if tp is int and meta.get("size"):
        return "a size such as 512KiB, 2MiB, 64KB or plain bytes"
    return {
        int: "an integer",
        float: "a number",
        bool: "true or false",
        str: "a string",
    }.get(tp, getattr(tp, "__name__", str(tp)))


def _plural(tp: Any) -> str:
    return {int: "integers", float: "numbers", str: "strings", bool: "booleans"}.get(
        tp, f"{getattr(tp, '__name__', tp)} values"
    )


class _Builder:
    """One build_dataclass run: the file path, the top-level context and the messages."""

    def __init__(self, path: Path | str, context: str) -> None:
        self.path = path
        self.context = context

    def section(self, prefix: str) -> str:
        return f"`{prefix.rstrip('.')}` of {self.context}" if prefix else self.context

    def build(self, cls: type[T], node: Any, prefix: str) -> T:
        if not isinstance(node, Mapping):
            raise InputError(
                f"{where(self.path, node)}: {self.section(prefix)} must be "
                f"{_expected(cls, {})}, got {_show(node)}."
            )
        fields = [f for f in dataclasses.fields(cls) if f.init]  # type: ignore[arg-type]
        names = [f.name for f in fields]
        hints = get_type_hints(cls)

        for key in node:
            if key not in names:
                raise InputError(
                    f"{where(self.path, node, key)}: unknown key `{key}` in "
                    f"{self.section(prefix)}.{did_you_mean(str(key), names)} "
                    f"Valid keys: {', '.join(names)}. Fix the spelling or remove the key."
                )

        kwargs: dict[str, Any] = {}
        for f in fields:
            required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
            if f.name not in node:
                if required:
                    raise InputError(
                        f"{where(self.path, node)}: {self.section(prefix)} is missing the "
                        f"required key `{f.name}`. Add `{f.name}:` with "
                        f"{_expected(hints[f.name], f.metadata)}."
                    )
                continue
            kwargs[f.name] = self.convert(
                node[f.name], hints[f.name], f.metadata, node, f.name, prefix + f.name
            )
        try:
            return cls(**kwargs)
        except ValueError as exc:  # cross-field checks in __post_init__
            raise InputError(
                _one_paragraph(f"{where(self.path, node)}: invalid {self.section(prefix)}: {exc}")
            ) from None

    def fail(self, parent: Any, key: Any, dotted: str, expected: str, value: Any) -> InputError:
        name = dotted.rsplit(".", 1)[-1]
        extra = f" (`{dotted}` in {self.context})" if "." in dotted else ""
        return InputError(
            f"{where(self.path, parent, key, value=True)}: `{name}` must be {expected}, "
            f"got {_show(value)}{extra}. Change the value to {expected}."
        )

    def convert(
        self,
        value: Any,
        tp: Any,
        meta: Mapping[str, Any],
        parent: Any,
        key: Any,
        dotted: str,
    ) -> Any:
        inner = _optional_arg(tp)
        if inner is not None:
            if value is None:
                return None
            return self.convert(value, inner, meta, parent, key, dotted)

        origin = get_origin(tp)
        if origin is Literal:
            # Compare the kind too, so that `true` is not taken for 1.
            for choice in get_args(tp):
                if value == choice and isinstance(value, bool) == isinstance(choice, bool):
                    return choice
            raise self.fail(parent, key, dotted, _expected(tp, meta), value)
        if origin is tuple:
            args = get_args(tp)
            if len(args) != 2 or args[1] is not Ellipsis:
                raise TypeError(f"unsupported annotation {tp!r}: use tuple[X, ...]")
            if not isinstance(value, list):
                raise self.fail(parent, key, dotted, _expected(tp, meta), value)
            return tuple(
                self.convert(item, args[0], {}, value, i, f"{dotted}[{i}]")
                for i, item in enumerate(value)
            )
        if dataclasses.is_dataclass(tp) and isinstance(tp, type):
            if not isinstance(value, Mapping):
                raise self.fail(parent, key, dotted, _expected(tp, meta), value)
            return self.build(tp, value, dotted + ".")

        result = self.scalar(value, tp, meta, parent, key, dotted)
        self.check_bounds(result, meta, parent, key, dotted)
        return result

    def scalar(
        self, value: Any, tp: Any, meta: Mapping[str, Any], parent: Any, key: Any, dotted: str
    ) -> Any:
        expected = _expected(tp, meta)
        if tp is int and meta.get("size"):
            try:
                return parse_size(value)
            except ValueError as exc:
                name = dotted.rsplit(".", 1)[-1]
                raise InputError(
                    f"{where(self.path, parent, key, value=True)}: `{name}` must be a size, "
                    f"got {_show(value)}: {exc}."
                ) from None
        if tp is bool:
            if not isinstance(value, bool):
                raise self.fail(parent, key, dotted, expected, value)
            return bool(value)
        if tp is int:
            if isinstance(value, bool) or not isinstance(value, int):
                raise self.fail(parent, key, dotted, expected, value)
            if abs(value) > MAX_INT and "le" not in meta:  # the planners count in int64
                raise self.fail(parent, key, dotted, f"an integer between {-MAX_INT:,} and "
                                f"{MAX_INT:,}", value)
            return int(value)
        if tp is float:
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise self.fail(parent, key, dotted, expected, value)
            try:
                number = float(value)
            except OverflowError:  # an integer past 1e308
                number = math.inf
            if not math.isfinite(number):  # .inf / .nan are YAML floats, and crash later
                raise self.fail(parent, key, dotted, "a finite number", value)
            return number
        if tp is str:
            if not isinstance(value, str):
                raise self.fail(parent, key, dotted, expected, value)
            return str(value)
        if isinstance(tp, type) and issubclass(tp, Enum):  # by the members' values
            for member in tp:
                if value == member.value and isinstance(value, bool) == isinstance(
                        member.value, bool):
                    return member
            raise self.fail(parent, key, dotted, expected, value)
        raise TypeError(f"unsupported annotation {tp!r} for field `{dotted}`")

    def check_bounds(
        self, value: Any, meta: Mapping[str, Any], parent: Any, key: Any, dotted: str
    ) -> None:
        name = dotted.rsplit(".", 1)[-1]
        loc = where(self.path, parent, key, value=True)
        if "choices" in meta and value not in meta["choices"]:
            raise InputError(
                f"{loc}: `{name}` must be {_expected(int, meta)}, got {_show(value)}. "
                "Change it to one of those."
            )
        # with an upper bound, every message states the whole allowed range
        integer = isinstance(value, int)
        where_in = f" (`{dotted}` in {self.context})" if "." in dotted else ""
        span = f" (allowed: between {_range_text(meta, integer)})" if "le" in meta else ""
        if "gt" in meta and not value > meta["gt"]:
            raise InputError(
                f"{loc}: `{name}` must be greater than {meta['gt']}, got {_show(value)}{span}. "
                "Give a positive value."
            )
        if "ge" in meta and not value >= meta["ge"]:
            raise InputError(
                f"{loc}: `{name}` must be at least {_bound(meta['ge'])}, got "
                f"{_show(value)}{span}." + (" Give a value in that range." if span else ""))
        if "le" in meta and not value <= meta["le"]:
            raise InputError(
                f"{loc}: `{name}` must be between {_range_text(meta, integer)}, got "
                f"{_show(value)}{where_in}. "
                "Give a value in that range."
            )


def _bound(value: float) -> str:
    """A bound as a reader writes it: 1,099,511,627,776 or 0.001."""
    if isinstance(value, int) or float(value).is_integer():
        return f"{int(value):,}"
    return f"{value:g}"


def _range_text(meta: Mapping[str, Any], integer: bool) -> str:
    """"1 and 65,536" (ge, or gt 0 of an integer), "0 (exclusive) and 100" (gt), for
    messages naming the range."""
    if "ge" in meta:
        low = _bound(meta["ge"])
    elif "gt" in meta and integer and isinstance(meta["gt"], int):
        low = _bound(meta["gt"] + 1)
    elif "gt" in meta:
        low = f"{_bound(meta['gt'])} (exclusive)"
    else:
        low = "-infinity"
    return f"{low} and {_bound(meta['le'])}"


def build_dataclass(cls: type[T], node: Any, path: Path | str, context: str) -> T:
    """Build the (frozen) dataclass ``cls`` from the YAML mapping ``node``.

    Every key must name a field, every field without a default must be present, and each
    value must match the field's annotation (int, float, bool, str, ``Literal[...]``, an
    ``Enum`` (by its members' values), ``X | None``, ``tuple[X, ...]``, nested dataclasses;
    ``int`` fields with ``metadata={"size": True}`` go through :func:`parse_size`;
    ``gt``/``ge``/``choices`` metadata bound the value). ``context`` names the thing being
    read in messages (e.g. "chip file"). Raises InputError with FILE:LINE:COL on any mismatch; a
    ValueError from the class's ``__post_init__`` becomes an InputError too.
    """
    if not (dataclasses.is_dataclass(cls) and isinstance(cls, type)):
        raise TypeError(f"{cls!r} is not a dataclass")
    return _Builder(path, context).build(cls, node, "")


# --------------------------------------------------------------------------- overrides


def _field_types(cls: Any) -> dict[str, Any]:
    """Field name -> annotation for a dataclass, in field order."""
    hints = get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls) if f.init}


def _schema_for(tp: Any) -> Any | None:
    """The dataclass behind an annotation (``X`` or ``X | None``), or None."""
    inner = _optional_arg(tp)
    tp = inner if inner is not None else tp
    return tp if dataclasses.is_dataclass(tp) and isinstance(tp, type) else None


def _mark_override(node: CommentedMap, key: str, label: str) -> None:
    marks: dict[Any, str] | None = getattr(node, _OVERRIDES_ATTR, None)
    if marks is None:
        marks = {}
        setattr(node, _OVERRIDES_ATTR, marks)
    marks[key] = label


def _parse_override_value(text: str, place: str) -> Any:
    """Read VALUE of an override as YAML: a scalar or a flow list of scalars."""
    try:
        value = YAML(typ="safe", pure=True).load(text)
    except YAMLError as exc:
        raise InputError(
            _one_paragraph(
                f"{place}: the value {text!r} is not valid YAML ({exc}). "
                "Quote it or write a plain number, string, true/false or [a, b]."
            )
        ) from None
    if isinstance(value, Mapping) or (
        isinstance(value, list) and any(isinstance(v, Mapping | list) for v in value)
    ):
        raise InputError(
            f"{place}: the value must be a scalar or a flat list; set nested keys one at "
            "a time, e.g. `sram.bytes=2MiB`."
        )
    if isinstance(value, list):
        return CommentedSeq(value)
    return value


def apply_overrides(
    node: CommentedMap,
    overrides: Sequence[str],
    source: str,
    *,
    cls: type | None = None,
    path: Path | str | None = None,
) -> None:
    """Apply "a.b.c=VALUE" overrides to a loaded mapping, in place, before building.

    VALUE is read as a YAML scalar ("2MiB", "0.5", "true", "null") or flat list. ``source``
    labels the overrides in messages (e.g. "--set"). With ``cls`` (the dataclass the node
    will be built into) every dataclass field is a valid key and missing sections are
    created; without it only keys already present in the file can be set. A malformed
    override or an unknown key raises InputError naming the override and the valid keys
    at that level; ``path`` (the file being overridden) is named in those messages.
    """
    for text in overrides:
        label = f"{source} {text}"
        place = f"{path} ({label})" if path is not None else label
        dotted, sep, raw = text.partition("=")
        dotted = dotted.strip()
        if not sep or not _OVERRIDE_KEY_RE.match(dotted):
            raise InputError(
                f"{place}: malformed override; write KEY=VALUE with a dotted key path, "
                "e.g. `sram.bytes=256KiB` or `clusters=2`."
            )
        value = _parse_override_value(raw.strip(), place)
        if isinstance(value, CommentedSeq):
            setattr(value, _ORIGIN_ATTR, label)
        parts = dotted.split(".")

        current: CommentedMap = node
        schema: Any = cls
        for depth, part in enumerate(parts):
            last = depth == len(parts) - 1
            level = ".".join(parts[:depth]) or "the top level"
            types_here = _field_types(schema) if schema is not None else None
            valid = list(types_here) if types_here is not None else [str(k) for k in current]
            if part not in valid:
                raise InputError(
                    f"{place}: unknown key `{part}` at {level}.{did_you_mean(part, valid)} "
                    f"Valid keys there: {', '.join(valid) or '(none)'}. Fix the spelling of the "
                    "key."
                )
            if last:
                current[part] = value
                _mark_override(current, part, label)
                break
            child_schema = _schema_for(types_here[part]) if types_here is not None else None
            child = current.get(part)
            if types_here is not None and child_schema is None:
                raise InputError(
                    f"{place}: `{'.'.join(parts[: depth + 1])}` is a single value, not a "
                    f"section; write `{'.'.join(parts[: depth + 1])}=VALUE`."
                )
            if child is None and child_schema is not None:
                child = CommentedMap()
                setattr(child, _ORIGIN_ATTR, label)
                current[part] = child
                _mark_override(current, part, label)
            if not isinstance(child, CommentedMap):
                raise InputError(
                    f"{place}: `{'.'.join(parts[: depth + 1])}` is {_show(child)}, not a "
                    f"section; write `{'.'.join(parts[: depth + 1])}=VALUE`."
                )
            current = child
            schema = child_schema
