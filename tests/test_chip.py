"""Tests for hardware.chip: presets, validation with line:col, and --set overrides."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from fuseplan.hardware.chip import (
    DEFAULT_PRESET,
    HARDWARE_DIR,
    PRESETS,
    Chip,
    Core,
    CoreMem,
    Dram,
    Sram,
    load_chip,
)
from fuseplan.planner.core.errors import InputError

CONTRACT_EXAMPLE = """\
name: cluster4x4
dtype_bytes: 2                 # storage size of one tensor element
clock_ghz: 1.0
clusters: 4
cores_per_cluster: 4
dram: {bandwidth_gbps: 256, pj_per_byte: 20}
sram: {bytes: 2MiB, bandwidth_gbps: 1024, pj_per_byte: 1.5}  # per cluster, shared by its cores
nram: {bytes: 512KiB, pj_per_byte: 0.5}   # per core, feature maps
wram: {bytes: 1MiB, pj_per_byte: 0.5}     # per core, weights
core: {macs_per_cycle: 1024, vector_lanes: 128, pj_per_mac: 0.2}
"""

UNIFIED = """\
name: tiny
dtype_bytes: 1
clock_ghz: 0.5
clusters: 1
cores_per_cluster: 1
dram: {bandwidth_gbps: 8, pj_per_byte: 30}
sram: {bytes: 256KiB, bandwidth_gbps: 64, pj_per_byte: 1}
core: {macs_per_cycle: 64, vector_lanes: 16, pj_per_mac: 0.3}
"""


def write(tmp_path: Path, text: str, name: str = "chip.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def load_text(tmp_path: Path, text: str, overrides: tuple[str, ...] = ()) -> Chip:
    return load_chip(str(write(tmp_path, text)), overrides)[0]


# --------------------------------------------------------------------------- presets


def test_presets_listed() -> None:
    assert set(PRESETS) >= {
        "cluster4x4",
        "frustum_npu",
        "two_level",
        "manycore",
        "fused_layer_fp32",
    }
    assert DEFAULT_PRESET in PRESETS


@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_loads(name: str) -> None:
    chip, file = load_chip(name)
    assert chip.name == name
    assert Path(file) == (HARDWARE_DIR / f"{name}.yaml").resolve()
    assert chip.description
    assert chip.cores == chip.clusters * chip.cores_per_cluster
    json.dumps(chip.summary())  # JSON-ready


@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_key_is_commented(name: str) -> None:
    for number, line in enumerate((HARDWARE_DIR / f"{name}.yaml").read_text().splitlines(), 1):
        if (
            line.strip()
            and not line.lstrip().startswith("#")
            and not line.startswith(("name:", "description:"))
        ):
            assert "#" in line, f"{name}.yaml:{number}: field without a comment: {line!r}"


def test_default_is_contract_example(tmp_path: Path) -> None:
    chip, file = load_chip(None)
    assert Path(file).name == "cluster4x4.yaml"
    contract = load_text(tmp_path, CONTRACT_EXAMPLE)
    for attr in ("dtype_bytes", "clock_ghz", "clusters", "cores_per_cluster", "dram", "sram"):
        assert getattr(chip, attr) == getattr(contract, attr), attr
    assert chip.nram is not None and contract.nram is not None
    assert chip.wram is not None and contract.wram is not None
    assert (chip.nram.bytes, chip.nram.pj_per_byte) == (contract.nram.bytes, 0.5)
    assert (chip.wram.bytes, chip.wram.pj_per_byte) == (contract.wram.bytes, 0.5)
    assert chip.core.macs_per_cycle == 1024 and chip.core.vector_lanes == 128
    assert chip.core.pj_per_mac == contract.core.pj_per_mac == 0.2


def test_contract_example_values(tmp_path: Path) -> None:
    chip = load_text(tmp_path, CONTRACT_EXAMPLE)
    assert chip.sram == Sram(bytes=2 * 1024**2, bandwidth_gbps=1024.0, pj_per_byte=1.5)
    assert chip.nram == CoreMem(bytes=512 * 1024, pj_per_byte=0.5)
    assert chip.wram == CoreMem(bytes=1024**2, pj_per_byte=0.5)
    assert chip.dram == Dram(bandwidth_gbps=256.0, pj_per_byte=20.0)
    assert chip.core == Core(macs_per_cycle=1024, vector_lanes=128, pj_per_mac=0.2)
    assert not chip.unified
    assert chip.cores == 16
    assert chip.dram_bytes_per_cycle == 256.0
    assert chip.sram_bytes_per_cycle == 1024.0
    assert chip.static_power_mw == 0.0


def test_seed_presets_structure() -> None:
    frustum = load_chip("frustum_npu")[0]
    assert frustum.unified and frustum.clusters == 1 and frustum.cores_per_cluster == 4
    assert frustum.dtype_bytes == 2
    two = load_chip("two_level")[0]
    assert two.unified and two.cores == 1
    many = load_chip("manycore")[0]
    assert not many.unified and many.cores_per_cluster == 16
    fused = load_chip("fused_layer_fp32")[0]
    assert fused.dtype_bytes == 4 and fused.cores == 1
    assert fused.sram.bytes == 362 * 1024
    assert fused.nram is not None and fused.nram.bytes == 362 * 1024


def test_unified_chip(tmp_path: Path) -> None:
    chip = load_text(tmp_path, UNIFIED)
    assert chip.unified
    assert chip.nram is None and chip.wram is None
    assert chip.dram_bytes_per_cycle == 16.0
    assert chip.sram_to_core_gbps == 64.0  # DMA defaults
    assert chip.dram_to_core_gbps == 4.0
    summary = chip.summary()
    assert summary["unified"] is True and summary["cores"] == 1
    assert summary["sram"]["bytes"] == 256 * 1024


def test_load_by_path_object(tmp_path: Path) -> None:
    chip, file = load_chip(write(tmp_path, UNIFIED))
    assert chip.name == "tiny"
    assert file == str((tmp_path / "chip.yaml").resolve())


# --------------------------------------------------------------------------- errors


def test_unknown_preset_lists_presets() -> None:
    with pytest.raises(InputError) as info:
        load_chip("clustr4x4")
    message = str(info.value)
    assert "Did you mean 'cluster4x4'?" in message
    for name in PRESETS:
        assert name in message


def test_missing_chip_file(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"missing\.yaml: file not found"):
        load_chip(str(tmp_path / "missing.yaml"))


def test_unknown_key_line_col_did_you_mean(tmp_path: Path) -> None:
    text = CONTRACT_EXAMPLE.replace("sram: {", "srma: {")
    with pytest.raises(InputError) as info:
        load_text(tmp_path, text)
    assert re.search(
        r"chip\.yaml:7:1: unknown key `srma` in chip file chip\.yaml\. "
        r"Did you mean 'sram'\? Valid keys: name, dtype_bytes, .*static_power_mw, description",
        str(info.value),
    ), str(info.value)


def test_unknown_nested_key(tmp_path: Path) -> None:
    text = CONTRACT_EXAMPLE.replace("macs_per_cycle", "mac_per_cycle")
    with pytest.raises(
        InputError,
        match=r"chip\.yaml:10:8: unknown key `mac_per_cycle` in `core`.*"
        r"Did you mean 'macs_per_cycle'\?.*Valid keys: macs_per_cycle, vector_lanes",
    ):
        load_text(tmp_path, text)


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        (
            "clusters: 4",
            "clusters: four",
            r"chip\.yaml:4:11: `clusters` must be an integer, got 'four'",
        ),
        ("clock_ghz: 1.0", "clock_ghz: fast", r"chip\.yaml:3:12: `clock_ghz` must be a number"),
        ("bytes: 2MiB", "bytes: 2 megs", r"chip\.yaml:7:15: `bytes` must be a size, got '2 megs'"),
        (
            "dtype_bytes: 2 ",
            "dtype_bytes: 3 ",
            r"chip\.yaml:2:14: `dtype_bytes` must be one of 1, 2, 4",
        ),
        ("clusters: 4", "clusters: 0", r"`clusters` must be greater than 0, got 0"),
        ("bytes: 512KiB", "bytes: 0", r"chip\.yaml:8:15: `bytes` must be greater than 0"),
        ("pj_per_mac: 0.2", "pj_per_mac: -1", r"`pj_per_mac` must be at least 0"),
        ("name: cluster4x4", "name: 42", r"`name` must be a string, got 42"),
        (
            "dram: {bandwidth_gbps: 256, pj_per_byte: 20}",
            "dram: 256",
            r"chip\.yaml:6:7: `dram` must be a mapping with keys bandwidth_gbps, pj_per_byte",
        ),
    ],
)
def test_bad_values(tmp_path: Path, old: str, new: str, expected: str) -> None:
    text = CONTRACT_EXAMPLE.replace(old, new)
    assert text != CONTRACT_EXAMPLE
    with pytest.raises(InputError, match=expected):
        load_text(tmp_path, text)


def test_missing_required_key(tmp_path: Path) -> None:
    text = CONTRACT_EXAMPLE.replace("clock_ghz: 1.0\n", "")
    with pytest.raises(InputError, match=r"chip\.yaml:1:1: .*missing the required key `clock_ghz`"):
        load_text(tmp_path, text)


def test_nram_without_wram(tmp_path: Path) -> None:
    text = "".join(
        line for line in CONTRACT_EXAMPLE.splitlines(keepends=True) if not line.startswith("wram:")
    )
    with pytest.raises(
        InputError, match=r"chip\.yaml:8:1: `nram` is given but `wram` is not.*add `wram: "
    ):
        load_text(tmp_path, text)


def test_wram_without_nram(tmp_path: Path) -> None:
    text = UNIFIED + "wram: {bytes: 1MiB, pj_per_byte: 0.5}\n"
    with pytest.raises(InputError, match=r"chip\.yaml:9:1: `wram` is given but `nram` is not"):
        load_text(tmp_path, text)


def test_direct_construction_validates() -> None:
    common = {
        "name": "x",
        "dtype_bytes": 2,
        "clock_ghz": 1.0,
        "clusters": 1,
        "cores_per_cluster": 1,
        "dram": Dram(bandwidth_gbps=1, pj_per_byte=1),
        "sram": Sram(bytes=1024, bandwidth_gbps=1, pj_per_byte=1),
        "core": Core(macs_per_cycle=1, vector_lanes=1, pj_per_mac=1),
    }
    assert Chip(**common).unified  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="nram and wram"):
        Chip(**common, nram=CoreMem(bytes=1, pj_per_byte=1))  # type: ignore[arg-type]


# --------------------------------------------------------------------------- overrides


def test_overrides_change_values() -> None:
    chip, _ = load_chip(
        "cluster4x4",
        ["sram.bytes=256KiB", "clusters=2", "dram.bandwidth_gbps=512", "static_power_mw=150"],
    )
    assert chip.sram.bytes == 256 * 1024
    assert chip.clusters == 2 and chip.cores == 8
    assert chip.dram.bandwidth_gbps == 512.0
    assert chip.static_power_mw == 150.0


def test_override_makes_chip_unified() -> None:
    chip, _ = load_chip("cluster4x4", ["nram=null", "wram=null"])
    assert chip.unified


def test_override_adds_per_core_memories() -> None:
    chip, _ = load_chip(
        "two_level",
        ["nram.bytes=64KiB", "nram.pj_per_byte=0.5", "wram.bytes=128KiB", "wram.pj_per_byte=0.5"],
    )
    assert not chip.unified
    assert chip.nram == CoreMem(bytes=64 * 1024, pj_per_byte=0.5)


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        (
            "sram.byts=1KiB",
            r"--set sram\.byts=1KiB\): unknown key `byts` at sram\. "
            r"Did you mean 'bytes'\? Valid keys there: bytes, bandwidth_gbps, pj_per_byte",
        ),
        ("clusterz=2", r"unknown key `clusterz` at the top level\. Did you mean 'clusters'\?"),
        ("sram.bytes", r"--set sram\.bytes\): malformed override"),
        ("sram.bytes=lots", r"cluster4x4\.yaml \(--set sram\.bytes=lots\): `bytes` must be a size"),
        ("clusters=1.5", r"\(--set clusters=1\.5\): `clusters` must be an integer, got 1\.5"),
        ("clusters.x=1", r"`clusters` is a single value, not a section"),
        ("nram=null", r"`wram` is given but `nram` is not"),
    ],
)
def test_bad_overrides(override: str, expected: str) -> None:
    with pytest.raises(InputError, match=expected):
        load_chip(None, [override])


def test_override_does_not_touch_the_file() -> None:
    before = (HARDWARE_DIR / "cluster4x4.yaml").read_text()
    load_chip(None, ["sram.bytes=1KiB"])
    assert (HARDWARE_DIR / "cluster4x4.yaml").read_text() == before
    assert load_chip(None)[0].sram.bytes == 2 * 1024**2
