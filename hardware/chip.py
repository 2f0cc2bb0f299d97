"""The chip model: frozen dataclasses whose fields are exactly the keys of hardware/*.yaml.

Memory hierarchy of the clustered multi-core accelerator (the default chip, cluster4x4)::

    DRAM --global DMA--> SRAM (one per cluster, shared by its cores)
                          |--per-core DMA--> NRAM (feature maps) / WRAM (weights) of each core
    DRAM --------------------------------> NRAM/WRAM directly (slower)
    SRAM of cluster i <--cluster DMA--> SRAM of cluster j

A chip without ``nram``/``wram`` is *unified*: ``sram`` is its single on-chip memory
holding feature maps and weights (the frustum-traversal engine frustum_npu and the
two-level NPU two_level).

Load chips with :func:`load_chip`, which accepts a preset name (``cluster4x4``) or a
path and ``--set key.sub=VALUE`` overrides.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any, Literal

from fuseplan.planner.core.errors import InputError
from fuseplan.planner.core.yamlio import (
    apply_overrides,
    build_dataclass,
    did_you_mean,
    load_yaml,
    where,
)

__all__ = [
    "CLOCK_GHZ_RANGE",
    "DEFAULT_PRESET",
    "GBPS_RANGE",
    "HARDWARE_DIR",
    "MAX_COUNT",
    "MAX_MEMORY_BYTES",
    "MAX_PJ",
    "MAX_STATIC_MW",
    "MAX_UNITS",
    "PRESETS",
    "Array",
    "Chip",
    "Core",
    "CoreMem",
    "Dma",
    "Dram",
    "Sram",
    "load_chip",
    "preset_path",
]

HARDWARE_DIR = Path(__file__).resolve().parent
"""Directory holding the preset chip files (hardware/*.yaml)."""

PRESETS: tuple[str, ...] = tuple(sorted(p.stem for p in HARDWARE_DIR.glob("*.yaml")))
"""Names of the bundled presets (file stems in hardware/)."""

DEFAULT_PRESET = "cluster4x4"
"""Preset used when no chip is given (the clustered multi-core accelerator)."""

# The ranges chip values must lie in (chip files here, chips embedded in plan files in
# planner.plan.schema). They lie far outside any real chip; past them values crash later
# instead (1e23 bytes overflows CP-SAT's 64-bit integers, an infinite clock the cycle
# fractions).
MAX_MEMORY_BYTES = 2**40  # 1 TiB of one memory
GBPS_RANGE = (0.001, 1e7)  # 1 MB/s to 10 PB/s
CLOCK_GHZ_RANGE = (0.001, 100.0)
MAX_PJ = 1e6  # 1 uJ per byte or operation
MAX_UNITS = 2**32  # MACs or vector lanes per cycle of one core
MAX_COUNT = 2**16  # clusters, cores per cluster
MAX_STATIC_MW = 1e6  # 1 kW

# Field metadata understood by planner.core.yamlio.build_dataclass.
_SIZE: dict[str, Any] = {"size": True, "gt": 0, "le": MAX_MEMORY_BYTES}
_RATE: dict[str, Any] = {"ge": GBPS_RANGE[0], "le": GBPS_RANGE[1]}  # bandwidths in GB/s
_UNITS: dict[str, Any] = {"gt": 0, "le": MAX_UNITS}
_COUNT: dict[str, Any] = {"gt": 0, "le": MAX_COUNT}
_ENERGY: dict[str, Any] = {"ge": 0, "le": MAX_PJ}


@dataclass(frozen=True, kw_only=True)
class Dram:
    """Off-chip memory."""

    bandwidth_gbps: float = field(metadata=_RATE)
    """Sustained DRAM <-> chip bandwidth in GB/s (1e9 bytes per second)."""
    pj_per_byte: float = field(metadata=_ENERGY)
    """Energy per byte moved between DRAM and the chip, in picojoules."""


@dataclass(frozen=True, kw_only=True)
class Sram:
    """Per-cluster shared memory (or the single on-chip memory of a unified chip)."""

    bytes: int = field(metadata=_SIZE)
    """Capacity in bytes of one cluster's SRAM."""
    bandwidth_gbps: float = field(metadata=_RATE)
    """Bandwidth of one cluster's SRAM in GB/s."""
    pj_per_byte: float = field(metadata=_ENERGY)
    """Energy per byte read or written, in picojoules."""


@dataclass(frozen=True, kw_only=True)
class CoreMem:
    """A per-core memory: NRAM (feature maps) or WRAM (weights)."""

    bytes: int = field(metadata=_SIZE)
    """Capacity in bytes of this memory in one core."""
    pj_per_byte: float = field(metadata=_ENERGY)
    """Energy per byte read or written, in picojoules."""
    bandwidth_gbps: float | None = field(default=None, metadata=_RATE)
    """Bandwidth in GB/s; None (the default) means it never limits the core."""


Dataflow = Literal["weight_stationary"]
"""How layers map onto a MAC array. Weight-stationary alone: its cycles are the tile's
output pixels times a per-layer constant (linear in the tile, as CP-SAT needs); output- and
input-stationary put pixels on the array, whose round-ups depend on the tile's shape."""


@dataclass(frozen=True, kw_only=True)
class Array:
    """The matrix unit of one core as a rows x columns array of MACs (planner.ir.array)."""

    rows: int = field(metadata=_UNITS)
    """Rows of MACs: the reduction (input channels per group x kernel) maps onto them."""
    cols: int = field(metadata=_UNITS)
    """Columns of MACs: the output channels (per group) map onto them."""
    dataflow: Dataflow = "weight_stationary"
    """What stays in the array: weight_stationary (weights; inputs stream through)."""

    @property
    def macs(self) -> int:
        """MACs per cycle of the whole array (rows x cols)."""
        return self.rows * self.cols


@dataclass(frozen=True, kw_only=True)
class Core:
    """One core's compute units."""

    macs_per_cycle: int = field(metadata=_UNITS)
    """Multiply-accumulates per cycle of the matrix unit (conv, matmul); with an `array`,
    its rows x cols."""
    vector_lanes: int = field(metadata=_UNITS)
    """Elements per cycle of the vector unit (activations, pooling, element-wise)."""
    pj_per_mac: float = field(metadata=_ENERGY)
    """Energy per multiply-accumulate, in picojoules."""
    pj_per_vector_op: float = field(default=0.05, metadata=_ENERGY)
    """Energy per vector-unit element operation, in picojoules."""
    array: Array | None = None
    """The matrix unit as an array (rows, cols, dataflow): each conv or matmul then takes
    the array passes its shape needs; omitted, every MAC is busy."""

    def __post_init__(self) -> None:
        if self.array is not None and self.array.macs != self.macs_per_cycle:
            raise ValueError(
                f"macs_per_cycle {self.macs_per_cycle} is not array rows x cols "
                f"({self.array.rows} x {self.array.cols} = {self.array.macs}): set "
                f"macs_per_cycle: {self.array.macs}")


@dataclass(frozen=True, kw_only=True)
class Dma:
    """Optional DMA bandwidths between levels; None takes the default given per field."""

    sram_to_core_gbps: float | None = field(default=None, metadata=_RATE)
    """Per-core DMA SRAM -> NRAM/WRAM in GB/s; default: the SRAM bandwidth."""
    cluster_link_gbps: float | None = field(default=None, metadata=_RATE)
    """Cluster DMA SRAM <-> SRAM of another cluster in GB/s; default: the SRAM bandwidth."""
    dram_to_core_gbps: float | None = field(default=None, metadata=_RATE)
    """Direct DRAM <-> NRAM/WRAM in GB/s, a slower path; default: half the DRAM bandwidth."""


@dataclass(frozen=True, kw_only=True)
class Chip:
    """An accelerator: clusters of cores, each cluster with an SRAM, each core with NRAM/WRAM.

    Field names are exactly the chip YAML keys; see hardware/cluster4x4.yaml.
    """

    name: str
    """Short identifier, reported in plans."""
    dtype_bytes: int = field(metadata={"choices": (1, 2, 4)})
    """Storage size of one tensor element in bytes (1 int8, 2 fp16/bf16, 4 fp32)."""
    clock_ghz: float = field(metadata={"ge": CLOCK_GHZ_RANGE[0], "le": CLOCK_GHZ_RANGE[1]})
    """Core clock in GHz; converts GB/s into bytes per cycle."""
    clusters: int = field(metadata=_COUNT)
    """Number of clusters, each with its own SRAM."""
    cores_per_cluster: int = field(metadata=_COUNT)
    """Cores in each cluster, sharing that cluster's SRAM."""
    dram: Dram
    """Off-chip memory."""
    sram: Sram
    """Per-cluster SRAM, or the only on-chip memory of a unified chip."""
    nram: CoreMem | None = None
    """Per-core feature-map memory; omit together with wram on single-memory chips."""
    wram: CoreMem | None = None
    """Per-core weight memory; omit together with nram on single-memory chips."""
    core: Core
    """Compute units of one core."""
    dma: Dma = field(default_factory=Dma)
    """Optional DMA bandwidths between memory levels."""
    static_power_mw: float = field(default=0.0, metadata={"ge": 0, "le": MAX_STATIC_MW})
    """Leakage/static power of the whole chip in mW (energy = power x time)."""
    description: str = ""
    """Free text: which design the chip models."""

    def __post_init__(self) -> None:
        if (self.nram is None) != (self.wram is None):
            raise ValueError(
                "nram and wram must be given together (per-core memories) or both omitted "
                "(single on-chip memory)"
            )
        if self.dtype_bytes not in (1, 2, 4):
            raise ValueError(f"dtype_bytes must be 1, 2 or 4, got {self.dtype_bytes}")
        if self.clusters < 1 or self.cores_per_cluster < 1:
            raise ValueError("clusters and cores_per_cluster must be at least 1")

    @property
    def unified(self) -> bool:
        """True when there is no NRAM/WRAM: one on-chip memory holds feature maps and weights."""
        return self.nram is None and self.wram is None

    @property
    def cores(self) -> int:
        """Total number of cores (clusters x cores_per_cluster)."""
        return self.clusters * self.cores_per_cluster

    @property
    def dram_bytes_per_cycle(self) -> float:
        """DRAM bandwidth in bytes per core clock cycle."""
        return self.dram.bandwidth_gbps / self.clock_ghz

    @property
    def sram_bytes_per_cycle(self) -> float:
        """One cluster's SRAM bandwidth in bytes per core clock cycle."""
        return self.sram.bandwidth_gbps / self.clock_ghz

    @property
    def sram_to_core_gbps(self) -> float:
        """Effective per-core DMA bandwidth SRAM -> NRAM/WRAM in GB/s."""
        return self.dma.sram_to_core_gbps or self.sram.bandwidth_gbps

    @property
    def cluster_link_gbps(self) -> float:
        """Effective cluster-to-cluster SRAM link bandwidth in GB/s."""
        return self.dma.cluster_link_gbps or self.sram.bandwidth_gbps

    @property
    def links_bytes_per_cycle(self) -> Fraction:
        """Bytes every cluster's link moves together per core clock cycle, exact: what a
        cluster split's gathers take (planner.geometry.cluster_split)."""
        return Fraction(str(self.cluster_link_gbps)) / Fraction(str(self.clock_ghz)) \
            * self.clusters

    @property
    def dram_to_core_gbps(self) -> float:
        """Effective direct DRAM <-> NRAM/WRAM bandwidth in GB/s."""
        return self.dma.dram_to_core_gbps or self.dram.bandwidth_gbps / 2

    @property
    def total_sram_bytes(self) -> int:
        """SRAM capacity summed over all clusters."""
        return self.sram.bytes * self.clusters

    def summary(self) -> dict[str, Any]:
        """JSON-ready description: every YAML field plus the derived quantities."""
        data = chip_to_dict(self)
        data.update(
            unified=self.unified,
            cores=self.cores,
            dram_bytes_per_cycle=self.dram_bytes_per_cycle,
            sram_bytes_per_cycle=self.sram_bytes_per_cycle,
            total_sram_bytes=self.total_sram_bytes,
            effective_dma_gbps={
                "sram_to_core": self.sram_to_core_gbps,
                "cluster_link": self.cluster_link_gbps,
                "dram_to_core": self.dram_to_core_gbps,
            },
        )
        return data


def preset_path(name: str) -> Path:
    """Path of the preset ``name`` (a file stem in hardware/); InputError if there is none."""
    if name not in PRESETS:
        raise InputError(
            f"unknown chip preset '{name}'.{did_you_mean(name, PRESETS)} Presets: "
            f"{', '.join(PRESETS)}. Give one of them, or the path to a chip YAML file "
            f"(see {HARDWARE_DIR / (DEFAULT_PRESET + '.yaml')} for the format)."
        )
    return HARDWARE_DIR / f"{name}.yaml"


def _looks_like_path(spec: str) -> bool:
    return spec.endswith((".yaml", ".yml")) or "/" in spec or "\\" in spec or Path(spec).is_file()


def load_chip(spec: str | Path | None = None, overrides: Sequence[str] = ()) -> tuple[Chip, str]:
    """Load a chip from a YAML path or a preset name (None: the default preset).

    ``overrides`` are "key.sub=VALUE" strings (``--set sram.bytes=256KiB``) applied before
    validation. Returns the chip and the resolved path of the file it came from. Raises
    InputError (with FILE:LINE:COL where possible) for an unknown preset, a missing or
    malformed file, unknown keys, wrong types or inconsistent values.
    """
    if spec is None:
        path = preset_path(DEFAULT_PRESET)
    elif isinstance(spec, Path) or _looks_like_path(spec):
        path = Path(spec)
    else:
        path = preset_path(spec)

    node = load_yaml(path)
    apply_overrides(node, list(overrides), "--set", cls=Chip, path=path)

    # Checked here (not only in __post_init__) to point at the offending key.
    has_nram = node.get("nram") is not None
    has_wram = node.get("wram") is not None
    if has_nram != has_wram:
        present, absent = ("nram", "wram") if has_nram else ("wram", "nram")
        raise InputError(
            f"{where(path, node, present)}: `{present}` is given but `{absent}` is not. "
            "Per-core memories come in pairs: add "
            f"`{absent}: {{bytes: ..., pj_per_byte: ...}}`, or remove `{present}` to model a "
            "chip with a single on-chip memory (sram holds feature maps and weights)."
        )

    _check_array(node, path)
    chip = build_dataclass(Chip, node, path, f"chip file {path.name}")
    return chip, str(path.resolve())


def _check_array(node: Mapping[str, Any], path: Path) -> None:
    """An array's rows x cols must be the core's macs_per_cycle: said at the array's place
    (Core's own check, which build_dataclass would meet first, names only `core`)."""
    core = node.get("core")
    if not isinstance(core, Mapping):
        return
    array = core.get("array")
    if not isinstance(array, Mapping):
        return
    rows, cols, mpc = array.get("rows"), array.get("cols"), core.get("macs_per_cycle")
    if not (isinstance(rows, int) and isinstance(cols, int) and isinstance(mpc, int)) \
            or any(isinstance(v, bool) or v < 1 for v in (rows, cols, mpc)):
        return  # a missing, mistyped or out-of-range value: build_dataclass names it
    if rows * cols != mpc:
        raise InputError(
            f"{where(path, core, 'array')}: `core.array` is {rows} x {cols} = {rows * cols} "
            f"MACs per cycle but `core.macs_per_cycle` is {mpc}. An array's MACs are the "
            f"matrix unit's: set `macs_per_cycle: {rows * cols}`, or change rows and cols "
            f"so that their product is {mpc}.")


def chip_to_dict(chip: Chip) -> dict[str, Any]:
    """The chip's fields as plain data (plan files embed it, so a plan verifies anywhere);
    a core without an array states none (plan files stay as they were before arrays)."""
    data = asdict(chip)
    if chip.core.array is None:
        del data["core"]["array"]
    return data


def chip_from_dict(data: Mapping[str, Any]) -> Chip:
    """Rebuild a chip from chip_to_dict's output."""
    parts = {"dram": Dram, "sram": Sram, "nram": CoreMem, "wram": CoreMem, "core": Core,
             "dma": Dma}
    fields_ = {f.name for f in dataclasses.fields(Chip)}
    data = dict(data)
    core = data.get("core")
    if isinstance(core, Mapping) and isinstance(core.get("array"), Mapping):
        data["core"] = {**core, "array": Array(**core["array"])}
    kwargs = {k: (parts[k](**v) if k in parts and isinstance(v, Mapping) else v)
              for k, v in data.items() if k in fields_}
    return Chip(**kwargs)
