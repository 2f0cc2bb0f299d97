"""Capacity curves of a sweep: points that differ only in one swept capacity, their order,
and their knee.

A larger capacity holds every tile a smaller one held, so along a curve DRAM bytes and the
objective's measure never rise (:func:`in_order`); :mod:`~fuseplan.planner.app.sweep.search`
repairs a curve that breaks this.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fuseplan.planner.app.sweep.keys import Job
from fuseplan.planner.app.sweep.rows import PointResult

__all__ = ["capacity_axes", "curves", "in_order", "knee", "monotone_metric"]


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
