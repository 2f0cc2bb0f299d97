"""Tests for planner.core.yamlio: loading, sizes, schema-by-dataclass and overrides."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fuseplan.planner.core.errors import InputError
from fuseplan.planner.core.yamlio import (
    apply_overrides,
    build_dataclass,
    did_you_mean,
    load_yaml,
    parse_size,
    where,
)


@dataclass(frozen=True, kw_only=True)
class Inner:
    bytes: int = field(metadata={"size": True})
    ratio: float = 1.0


@dataclass(frozen=True, kw_only=True)
class Outer:
    name: str
    count: int = field(metadata={"gt": 0})
    enabled: bool = True
    mode: Literal["big", "small"] = "big"
    levels: tuple[int, ...] = ()
    tags: tuple[str, ...] = ()
    inner: Inner
    extra: Inner | None = None
    limit: float | None = None


def write(tmp_path: Path, text: str, name: str = "f.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


GOOD = """\
name: demo
count: 3
enabled: false
mode: small
levels: [1, 2, 3]
tags: [a, b]
inner: {bytes: 2MiB, ratio: 2}
"""


def build_text(tmp_path: Path, text: str) -> Outer:
    path = write(tmp_path, text)
    return build_dataclass(Outer, load_yaml(path), path, "test file")


# --------------------------------------------------------------------------- load_yaml


def test_load_yaml_returns_mapping_with_positions(tmp_path: Path) -> None:
    path = write(tmp_path, "a: 1\nb:\n  c: 2\n")
    node = load_yaml(path)
    assert node["b"]["c"] == 2
    assert where(path, node, "b") == f"{path}:2:1"
    assert where(path, node["b"], "c") == f"{path}:3:3"
    assert where(path, node["b"], "c", value=True) == f"{path}:3:6"
    assert where(path, node["b"]) == f"{path}:3:3"


def test_load_yaml_missing_file(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"nope\.yaml: file not found"):
        load_yaml(tmp_path / "nope.yaml")


def test_load_yaml_syntax_error_has_line_col(tmp_path: Path) -> None:
    path = write(tmp_path, "a: 1\n b: [\n")
    with pytest.raises(InputError, match=r"f\.yaml:2:\d+: invalid YAML"):
        load_yaml(path)


def test_load_yaml_duplicate_key(tmp_path: Path) -> None:
    path = write(tmp_path, "a: 1\na: 2\n")
    with pytest.raises(InputError, match=r"f\.yaml:\d+:\d+: invalid YAML.*duplicate key"):
        load_yaml(path)


@pytest.mark.parametrize(
    ("text", "kind"), [("", "empty"), ("- 1\n- 2\n", "a list"), ("3\n", "an integer")]
)
def test_load_yaml_top_level_must_be_mapping(tmp_path: Path, text: str, kind: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(InputError, match=rf"f\.yaml:1:1: the top level must be a mapping.*{kind}"):
        load_yaml(path)


def test_error_messages_are_one_paragraph(tmp_path: Path) -> None:
    path = write(tmp_path, "a: 'unterminated\n")
    with pytest.raises(InputError) as info:
        load_yaml(path)
    assert "\n" not in str(info.value)


# --------------------------------------------------------------------------- sizes


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (4096, 4096),
        (0, 0),
        ("4096", 4096),
        ("512KiB", 512 * 1024),
        ("2MiB", 2 * 1024**2),
        ("1.5MiB", 1536 * 1024),
        ("64KB", 64_000),
        ("1MB", 1_000_000),
        ("1GiB", 1024**3),
        ("362KB", 362_000),
        ("512 KiB", 512 * 1024),
        ("2mib", 2 * 1024**2),
        ("100B", 100),
    ],
)
def test_parse_size_accepts(text: object, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize(
    "text",
    ["", "abc", "12XB", "1.3B", "0.1KiB", "-5", -5, "1e6", "KiB", "2 MiB extra", 1.5, True, None],
)
def test_parse_size_rejects(text: object) -> None:
    with pytest.raises(ValueError, match=r"size|bytes"):
        parse_size(text)


def test_parse_size_message_lists_forms() -> None:
    with pytest.raises(ValueError, match=r"KiB.*KB"):
        parse_size("lots")


@given(st.integers(min_value=0, max_value=10**9), st.sampled_from(["KiB", "MiB", "KB", "MB"]))
def test_parse_size_round_trip(n: int, unit: str) -> None:
    scale = {"KiB": 1024, "MiB": 1024**2, "KB": 1000, "MB": 1000**2}[unit]
    assert parse_size(f"{n}{unit}") == n * scale
    assert parse_size(str(n * scale)) == n * scale


# --------------------------------------------------------------------------- did_you_mean


def test_did_you_mean() -> None:
    assert did_you_mean("sram", ["sram", "dram"]) == " Did you mean 'sram'?"
    assert did_you_mean("srma", ["sram", "nram"]) == " Did you mean 'sram'?"
    assert did_you_mean("zzz", ["sram", "dram"]) == ""


# --------------------------------------------------------------------------- build_dataclass


def test_build_dataclass_good(tmp_path: Path) -> None:
    obj = build_text(tmp_path, GOOD)
    assert obj == Outer(
        name="demo",
        count=3,
        enabled=False,
        mode="small",
        levels=(1, 2, 3),
        tags=("a", "b"),
        inner=Inner(bytes=2 * 1024**2, ratio=2.0),
    )
    assert isinstance(obj.inner.ratio, float)
    assert type(obj.levels[0]) is int


def test_build_dataclass_optional_given_and_null(tmp_path: Path) -> None:
    obj = build_text(tmp_path, GOOD + "extra: {bytes: 1KB}\nlimit: null\n")
    assert obj.extra == Inner(bytes=1000)
    assert obj.limit is None


def test_unknown_key_line_col_and_suggestion(tmp_path: Path) -> None:
    with pytest.raises(InputError) as info:
        build_text(tmp_path, GOOD + "cout: 4\n")
    assert re.search(
        r"f\.yaml:8:1: unknown key `cout` in test file\. Did you mean 'count'\? "
        r"Valid keys: name, count, enabled, mode, levels, tags, inner, extra, limit\.",
        str(info.value),
    )


def test_unknown_nested_key(tmp_path: Path) -> None:
    text = GOOD.replace("ratio: 2", "ration: 2")
    with pytest.raises(
        InputError, match=r"f\.yaml:7:\d+: unknown key `ration` in `inner`.*Did you mean 'ratio'"
    ):
        build_text(tmp_path, text)


def test_missing_required_key(tmp_path: Path) -> None:
    text = GOOD.replace("count: 3\n", "")
    with pytest.raises(InputError, match=r"f\.yaml:1:1: .*missing the required key `count`"):
        build_text(tmp_path, text)


@pytest.mark.parametrize(
    ("old", "new", "place", "expected"),
    [
        ("count: 3", "count: three", "2:8", r"`count` must be an integer, got 'three'"),
        ("count: 3", "count: 2.5", "2:8", r"`count` must be an integer, got 2\.5"),
        ("count: 3", "count: true", "2:8", r"`count` must be an integer, got true"),
        ("enabled: false", "enabled: 0", "3:10", r"`enabled` must be true or false, got 0"),
        ("mode: small", "mode: medium", "4:7", r"`mode` must be one of 'big', 'small'"),
        ("name: demo", "name: 5", "1:7", r"`name` must be a string, got 5"),
        ("levels: [1, 2, 3]", "levels: 3", "5:9", r"`levels` must be a list of integers"),
        ("levels: [1, 2, 3]", "levels: [1, x]", "5:13", r"`levels\[1\]` must be an integer"),
        ("ratio: 2", "ratio: fast", "7:29", r"`ratio` must be a number, got 'fast'"),
        ("{bytes: 2MiB", "{bytes: 2XB", "7:16", r"`bytes` must be a size, got '2XB'"),
        ("inner: {bytes: 2MiB, ratio: 2}", "inner: 7", "7:8", r"`inner` must be a mapping"),
        ("count: 3", "count: 0", "2:8", r"`count` must be greater than 0, got 0"),
    ],
)
def test_wrong_type_names_expected(
    tmp_path: Path, old: str, new: str, place: str, expected: str
) -> None:
    text = GOOD.replace(old, new)
    assert text != GOOD
    with pytest.raises(InputError, match=rf"f\.yaml:{place}: .*{expected}"):
        build_text(tmp_path, text)


def test_post_init_value_error_becomes_input_error(tmp_path: Path) -> None:
    @dataclass(frozen=True)
    class Pair:
        lo: int
        hi: int

        def __post_init__(self) -> None:
            if self.lo > self.hi:
                raise ValueError("lo must not exceed hi")

    path = write(tmp_path, "lo: 3\nhi: 1\n")
    with pytest.raises(InputError, match=r"f\.yaml:1:1: invalid pair file: lo must not exceed hi"):
        build_dataclass(Pair, load_yaml(path), path, "pair file")


# --------------------------------------------------------------------------- overrides


def test_overrides_set_nested_values(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD)
    node = load_yaml(path)
    apply_overrides(
        node,
        ["inner.bytes=256KiB", "count=7", "mode=big", "levels=[4, 5]", "limit=2.5"],
        "--set",
        cls=Outer,
    )
    obj = build_dataclass(Outer, node, path, "test file")
    assert obj.inner.bytes == 256 * 1024
    assert obj.count == 7
    assert obj.mode == "big"
    assert obj.levels == (4, 5)
    assert obj.limit == 2.5


def test_override_creates_missing_section_with_schema(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD)
    node = load_yaml(path)
    apply_overrides(node, ["extra.bytes=1MB", "extra.ratio=0.5"], "--set", cls=Outer)
    obj = build_dataclass(Outer, node, path, "test file")
    assert obj.extra == Inner(bytes=1_000_000, ratio=0.5)


def test_override_without_schema_only_existing_keys(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD)
    node = load_yaml(path)
    apply_overrides(node, ["inner.ratio=3"], "--set")
    assert node["inner"]["ratio"] == 3
    with pytest.raises(InputError, match=r"--set extra\.bytes=1: unknown key `extra`"):
        apply_overrides(node, ["extra.bytes=1"], "--set")


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("count", r"--set count\): malformed override; write KEY=VALUE"),
        ("=3", r"malformed override"),
        ("inner..bytes=3", r"malformed override"),
        (
            "cont=3",
            r"unknown key `cont` at the top level\. Did you mean 'count'\? "
            r"Valid keys there: name, count, enabled",
        ),
        (
            "inner.byts=3",
            r"unknown key `byts` at inner\. Did you mean 'bytes'\? "
            r"Valid keys there: bytes, ratio\.",
        ),
        ("count.x=3", r"`count` is a single value, not a section"),
        ("inner={bytes: 1}", r"must be a scalar or a flat list"),
        ("name=[unclosed", r"is not valid YAML"),
    ],
)
def test_bad_overrides(tmp_path: Path, override: str, expected: str) -> None:
    path = write(tmp_path, GOOD)
    node = load_yaml(path)
    with pytest.raises(InputError, match=expected):
        apply_overrides(node, [override], "--set", cls=Outer, path=path)


def test_overridden_value_error_names_the_override(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD)
    node = load_yaml(path)
    apply_overrides(node, ["inner.bytes=lots"], "--set", cls=Outer)
    with pytest.raises(
        InputError, match=r"f\.yaml \(--set inner\.bytes=lots\): `bytes` must be a size"
    ):
        build_dataclass(Outer, node, path, "test file")
