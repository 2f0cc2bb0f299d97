"""What "best" means: the objectives, the one energy formula, and a plan's cost under each.

The planners minimise an integer, ``objective_units``: DRAM bytes (traffic), cycles
(latency), energy in milli-pJ (energy), or a weighted mix of the three (weighted). CP-SAT
states the same function over its linear expressions, so the Python searches and the
model rank every choice alike. Energy is charged on seven quantities (DRAM bytes, the
cores' feature-map and weight bytes, MACs, vector ops, cycles of static power and bytes
between clusters), each
at a rate of the chip (``EnergyRates``); ``EnergyRates.total`` is the only place they are
added up, in floating-point pJ for the counters and in integer milli-pJ for the planners.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Generic, Protocol, Self, TypeVar, assert_never, overload

from fuseplan.hardware.chip import Chip
from fuseplan.planner.core.errors import InputError
from fuseplan.planner.cost.counters import Counters


class Objective(StrEnum):
    """The quantity a plan minimises (rules YAML `objective.default`, `--objective`)."""

    TRAFFIC = "traffic"  # DRAM bytes
    LATENCY = "latency"  # cycles
    ENERGY = "energy"  # pJ
    WEIGHTED = "weighted"  # the rules' weights times bytes, cycles and pJ

    @classmethod
    def parse(cls, text: str) -> Objective:
        """The objective named by user input; an InputError listing the valid names."""
        try:
            return cls(text)
        except ValueError:
            raise InputError(f"unknown objective '{text}'. Use one of: "
                             f"{', '.join(o.value for o in cls)}.") from None

    @property
    def timed(self) -> bool:
        """Whether the objective depends on cycles (so next-group prefetch can pay)."""
        return self != Objective.TRAFFIC


@dataclass(frozen=True)
class ObjectiveSettings:
    """What "best" means; `weighted` mixes the three with these weights (rules YAML
    `objective`)."""

    default: Objective = Objective.TRAFFIC
    dram_bytes_weight: float = field(default=1.0, metadata={"ge": 0})
    cycles_weight: float = field(default=0.0, metadata={"ge": 0})
    energy_pj_weight: float = field(default=0.0, metadata={"ge": 0})
    # --prefer auto picks energy below this battery level (percent), latency above it
    battery_threshold_pct: float = field(default=30.0, metadata={"ge": 0})


ENERGY_SCALE = 1000  # the planners count energy in milli-pJ, so fractional pJ stay integral


class Linear(Protocol):
    """A quantity the integer formulas scale and add: an int, or a CP-SAT linear expression."""

    def __add__(self, other: Self, /) -> Self: ...

    def __rmul__(self, k: int, /) -> Self: ...


Q = TypeVar("Q", bound=Linear)
N = TypeVar("N")
R = TypeVar("R", int, float)


@dataclass(frozen=True)
class Charged(Generic[N]):
    """The quantities energy is charged on (a group's, or a plan's)."""

    dram_bytes: N  # pass through SRAM too
    core_fmap_bytes: N  # feature-map bytes the cores move on chip
    core_weight_bytes: N  # weight bytes the cores read
    macs: N
    vector_ops: N
    cycles: N  # static power over the time
    link_bytes: N  # bytes crossing the links between clusters (a cluster split's gathers)

    @staticmethod
    def of(c: Counters, cycles: int | None = None) -> Charged[int]:
        """A group's quantities from its counters (``cycles``: in place of c.cycles)."""
        return Charged(c.dram_bytes, c.core_fmap_bytes, c.core_weight_bytes, c.macs,
                       c.vector_ops, c.cycles if cycles is None else cycles,
                       c.cluster_link_bytes)


@dataclass(frozen=True)
class EnergyRates(Generic[R]):
    """Energy per unit of each charged quantity: pJ (float) or milli-pJ (int, ``scaled``)."""

    dram_byte: R
    core_fmap_byte: R
    core_weight_byte: R
    mac: R
    vector_op: R
    cycle: R
    link_byte: R

    @staticmethod
    def of(chip: Chip) -> EnergyRates[float]:
        """The chip's rates in pJ: DRAM bytes pass through SRAM; the cores' feature-map
        traffic is charged at NRAM, weight reads at WRAM (SRAM on single-memory chips);
        static power per cycle of the clock; a byte between clusters is read from one
        cluster's SRAM and written to another's."""
        return EnergyRates(
            dram_byte=chip.dram.pj_per_byte + chip.sram.pj_per_byte,
            core_fmap_byte=chip.nram.pj_per_byte if chip.nram else chip.sram.pj_per_byte,
            core_weight_byte=chip.wram.pj_per_byte if chip.wram else chip.sram.pj_per_byte,
            mac=chip.core.pj_per_mac,
            vector_op=chip.core.pj_per_vector_op,
            cycle=chip.static_power_mw * 1e-3 / (chip.clock_ghz * 1e9) * 1e12,
            link_byte=2 * chip.sram.pj_per_byte,
        )

    def scaled(self: EnergyRates[float]) -> EnergyRates[int]:
        """The rates in integer milli-pJ (what the planners and CP-SAT add up)."""
        return EnergyRates(*(round(ENERGY_SCALE * r) for r in (
            self.dram_byte, self.core_fmap_byte, self.core_weight_byte, self.mac,
            self.vector_op, self.cycle, self.link_byte)))

    @overload
    def total(self: EnergyRates[float], q: Charged[float]) -> float: ...

    @overload
    def total(self: EnergyRates[int], q: Charged[Q]) -> Q: ...

    def total(self, q):  # the overloads above type both uses
        """The energy formula: every charged quantity at its rate."""
        return (self.dram_byte * q.dram_bytes + self.core_fmap_byte * q.core_fmap_bytes
                + self.core_weight_byte * q.core_weight_bytes + self.mac * q.macs
                + self.vector_op * q.vector_ops + self.cycle * q.cycles
                + self.link_byte * q.link_bytes)


def energy_pj(chip: Chip, c: Counters, cycles: int) -> float:
    """A group's energy in pJ from its counters and its cycles."""
    q = Charged.of(c, cycles)
    return EnergyRates.of(chip).total(Charged(
        float(q.dram_bytes), float(q.core_fmap_bytes), float(q.core_weight_bytes),
        float(q.macs), float(q.vector_ops), float(q.cycles), float(q.link_bytes)))


def objective_terms(objective: Objective, weights: ObjectiveSettings, chip: Chip,
                    q: Charged[Q]) -> Q:
    """The integer the planners minimise, over ints or CP-SAT expressions alike: DRAM
    bytes, cycles, milli-pJ, or the weighted mix of the three."""
    match objective:
        case Objective.TRAFFIC:
            return q.dram_bytes
        case Objective.LATENCY:
            return q.cycles
        case Objective.ENERGY:
            return EnergyRates.of(chip).scaled().total(q)
        case Objective.WEIGHTED:
            return (round(ENERGY_SCALE * weights.dram_bytes_weight) * q.dram_bytes
                    + round(ENERGY_SCALE * weights.cycles_weight) * q.cycles
                    + round(weights.energy_pj_weight) * EnergyRates.of(chip).scaled().total(q))
        case _:
            assert_never(objective)


def objective_units(c: Counters, objective: Objective, weights: ObjectiveSettings,
                    chip: Chip) -> int:
    """The integer the planners minimise for these counters (CP-SAT's term for them)."""
    return objective_terms(objective, weights, chip, Charged.of(c))


def cycle_units(objective: Objective, weights: ObjectiveSettings, chip: Chip) -> int:
    """What one cycle is worth in objective_units (0: the objective ignores time); the
    formula is linear, so this is the units of one cycle and nothing else."""
    return objective_terms(objective, weights, chip, Charged(0, 0, 0, 0, 0, 1, 0))


def objective_value(c: Counters, objective: Objective, weights: ObjectiveSettings) -> float:
    """The counters' cost in the objective's own unit (bytes, cycles, pJ; for reports)."""
    match objective:
        case Objective.TRAFFIC:
            return c.dram_bytes
        case Objective.LATENCY:
            return c.cycles
        case Objective.ENERGY:
            return c.energy_pj
        case Objective.WEIGHTED:
            return (weights.dram_bytes_weight * c.dram_bytes + weights.cycles_weight * c.cycles
                    + weights.energy_pj_weight * c.energy_pj)
        case _:
            assert_never(objective)
