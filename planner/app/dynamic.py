"""Dynamic shapes served by precompiled static units and parameter tables.

A dynamic plan fixes the grouping once, planned at the largest shape of the
ranges, and gives every group a small library of *static units*: fixed output
tile shapes (h, w) whose working set fits the chip at any shape in range. For a
concrete shape a *parameter table* covers each group's output with unit
invocations (unit id, offset and length per dimension); the tail, where the
last block does not fill a unit, follows a tail mode:

* ``pad`` computes a whole unit and discards the part beyond the map (waste);
* ``overlap`` shifts the last block back to end at the border (recomputed rows);
* ``variable`` lets the unit accept any length up to its size (no waste);
* ``tail-range`` lets it accept lengths in [size - r, size]; shorter remainders
  are rebalanced with the previous block, else padded.

Combinations: ``simple`` (the largest unit everywhere, instant) and
``optimized`` (mixed unit sizes with the least waste, a CP-SAT covering model).
Tables are cached on disk by plan, shape, tail mode and combination.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ortools.sat.python import cp_model

from fuseplan.hardware.chip import Chip
from fuseplan.planner.core.errors import InputError, PlanningError
from fuseplan.planner.core.files import make_dir, write_atomic
from fuseplan.planner.cost.enumerated import enumerated_cost
from fuseplan.planner.cost.model import (
    Counters,
    footprint,
    live_steps,
    sram_staged,
    weight_bytes,
)
from fuseplan.planner.geometry.regions import Box, anchor_extent, group_io, tile_regions
from fuseplan.planner.ir.graph import Graph
from fuseplan.planner.plan.schema import TAIL_MODES as TAIL_MODES  # the plan schema owns the list
from fuseplan.planner.plan.schema import is_table, validate_dynamic

TailMode = Literal["pad", "overlap", "variable", "tail-range"]
_RANGE = re.compile(r"^([^:]+):(\d+)=(\d+)\.\.(\d+)$")


def parse_dynamic_option(text: str) -> tuple[str, int, int, int]:
    """`NAME:AXIS=LO..HI` -> (name, axis, lo, hi)."""
    m = _RANGE.match(text.strip())
    if m is None:
        raise InputError(f"--dynamic {text!r}: write NAME:AXIS=LO..HI, e.g. x:2=64..1024 "
                         "(input x, axis 2 between 64 and 1024).")
    name, axis, lo, hi = m.group(1), int(m.group(2)), int(m.group(3)), int(m.group(4))
    if not 1 <= lo <= hi:
        raise InputError(f"--dynamic {text!r}: need 1 <= LO <= HI. Give a range of positive "
                         "sizes, smallest first, e.g. x:2=64..1024.")
    return name, axis, lo, hi


@dataclass(frozen=True)
class Unit:
    """A static compute unit: a fixed (h, w) output tile of one group (0 = the whole axis)."""

    id: int
    h: int
    w: int


@dataclass(frozen=True)
class DynamicGroup:
    """A group of a dynamic plan: its layers and its unit library (largest unit first)."""

    layers: tuple[str, ...]
    units: tuple[Unit, ...]
    weights_resident: bool
    source: str = field(default="", compare=False)  # the plan file it was read from


def _units_fit(graph: Graph, layers: Sequence[str], chip: Chip, h: int, w: int,
               resident: bool) -> bool:
    """Whether an (h, w) unit's working set fits SRAM anywhere on the (largest) map."""
    io = group_io(graph, layers)
    n, big_h, big_w = anchor_extent(graph, io)
    steps = live_steps(graph, io)
    weights = weight_bytes(graph, io.weights, chip) if chip.unified and resident else 0
    staged = sram_staged(graph, io, chip, resident)  # streamed chunks beside the maps
    # interior placements need the widest halos; try the centre and the corners
    rows = {0, max(0, (big_h - h) // 2), max(0, big_h - h)}
    cols = {0, max(0, (big_w - w) // 2), max(0, big_w - w)}
    for r in rows:
        for c in cols:
            box = (0, n, r, min(big_h, r + h), c, min(big_w, c + w))
            peak = footprint(graph, io, tile_regions(graph, io, box), steps, chip.dtype_bytes,
                             staged)
            if peak + weights > chip.sram.bytes:
                return False
    return True


def choose_units(graph: Graph, layers: Sequence[str], chip: Chip, resident: bool,
                 count: int = 3) -> tuple[Unit, ...]:
    """A library of square units: the largest that fits the chip on the largest map (halving
    from the map's short side), then halvings of it for the tails."""
    io = group_io(graph, layers)
    _, big_h, big_w = anchor_extent(graph, io)
    if big_h == 1 and big_w == 1:
        return (Unit(0, 0, 0),)  # a non-spatial group: one unit over the whole tensor
    side = min(big_h, big_w)
    while side > 1 and not _units_fit(graph, layers, chip, side, side, resident):
        side //= 2
    if not _units_fit(graph, layers, chip, side, side, resident):
        # a group that reduces a whole map before using it (pool and scale of a squeeze-
        # excite) fits only as one unit over the whole tensor
        if _units_fit(graph, layers, chip, big_h, big_w, resident):
            return (Unit(0, 0, 0),)
        raise PlanningError(
            f"group {layers[0]} .. {layers[-1]} fits no unit at the largest shape of the "
            "ranges. Narrow the --dynamic ranges or plan with a larger sram.bytes.")
    units: list[Unit] = []
    for k in range(count):
        s = max(1, side >> k)
        if units and s == units[-1].h:
            break
        units.append(Unit(k, s, s))
    return tuple(units)


# --- covering one axis -------------------------------------------------------------------


@dataclass(frozen=True)
class Block:
    """One unit invocation along an axis: computes [offset, offset + length), size `size`."""

    size: int  # the unit's length
    offset: int
    length: int  # valid (or, for overlap, computed) rows

    @property
    def waste(self) -> int:
        return self.size - self.length


def cover_simple(extent: int, size: int, tail: TailMode, tail_range: int) -> list[Block]:
    """Blocks of one unit size; the tail per tail mode."""
    if size <= 0:  # a whole-axis unit
        return [Block(extent, 0, extent)]
    if size >= extent:  # one unit larger than the map: its tail is the whole map
        return [Block(size, 0, extent)]
    full, rem = divmod(extent, size)
    blocks = [Block(size, k * size, size) for k in range(full)]
    if rem:
        blocks += _tail(blocks, extent, size, rem, tail, tail_range)
    return blocks


def _tail(blocks: list[Block], extent: int, size: int, rem: int, tail: TailMode,
          tail_range: int) -> list[Block]:
    start = extent - rem
    if tail == "overlap":
        return [Block(size, extent - size, size)]  # recompute size - rem rows
    if tail == "variable":
        return [Block(size, start, rem)]
    if tail == "tail-range":
        low = size - tail_range
        if rem >= low:
            return [Block(size, start, rem)]
        both = size + rem  # rebalance the last full block and the remainder
        if blocks and both - both // 2 <= size and both // 2 >= low:
            prev = blocks.pop()
            half = both // 2
            return [Block(size, prev.offset, both - half), Block(size, prev.offset + both - half,
                                                                 half)]
    return [Block(size, start, rem)]  # pad: compute a whole unit, keep rem rows


def cover_optimized(extent: int, sizes: Sequence[int], tail: TailMode,
                    tail_range: int) -> list[Block]:
    """Mixed unit sizes covering the axis with the least waste, then the fewest blocks
    (a CP-SAT covering model: counts k_i of each size, sum k_i * s_i >= extent)."""
    sizes = sorted({s for s in sizes if s > 0}, reverse=True)
    if not sizes or sizes[0] >= extent or tail == "variable":
        return cover_simple(extent, sizes[0] if sizes else 0, tail, tail_range)
    m = cp_model.CpModel()
    counts = [m.new_int_var(0, extent // s + 1, f"k_{s}") for s in sizes]
    covered = sum(k * s for k, s in zip(counts, sizes, strict=True))
    m.add(covered >= extent)
    simple = cover_simple(extent, sizes[0], tail, tail_range)
    waste_simple = sum(b.waste for b in simple)
    m.add(covered - extent <= waste_simple)  # never worse than the simple table
    m.minimize((covered - extent) * (extent + 1) + sum(counts))
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.max_time_in_seconds = 5
    if solver.solve(m) not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return simple
    blocks, offset = [], 0
    for k, s in zip(counts, sizes, strict=True):
        for _ in range(solver.value(k)):
            length = min(s, extent - offset)
            blocks.append(Block(s, offset, length))
            offset += length
    if tail == "overlap" and blocks and blocks[-1].length < blocks[-1].size:
        last = blocks.pop()  # shift the partial block back to end at the border
        blocks.append(Block(last.size, extent - last.size, last.size))
    return blocks


@dataclass(frozen=True)
class Entry:
    """One parameter-table row: a unit invocation and the box it computes."""

    unit: int
    n: tuple[int, int]
    h: tuple[int, int]  # offset, length
    w: tuple[int, int]
    waste: int  # unit elements computed beyond the map (pad) or twice (overlap)


@dataclass(frozen=True)
class GroupTable:
    """The parameter table of one group at one shape, with its cost."""

    group: int
    entries: tuple[Entry, ...]
    extent: tuple[int, int, int]
    cost: Counters

    @property
    def boxes(self) -> tuple[Box, ...]:
        return tuple((e.n[0], e.n[0] + e.n[1], e.h[0], e.h[0] + e.h[1], e.w[0],
                      e.w[0] + e.w[1]) for e in self.entries)


def group_table(graph: Graph, gid: int, group: DynamicGroup, chip: Chip, tail: TailMode,
                combination: str, tail_range: int) -> GroupTable:
    """Cover one group's output at the graph's (concrete) shape with its units."""
    known = {lay.name for lay in graph.layers}
    for i, name in enumerate(group.layers):
        if name not in known:
            raise InputError(f"{group.source or 'the dynamic plan'}: groups[{gid}].layers[{i}] "
                             f"names layer {name!r}, which the model does not have. Was the "
                             "plan made for another model? Solve this model again with "
                             "`fuseplan solve MODEL --dynamic NAME:AXIS=LO..HI -o PLAN.json`.")
    io = group_io(graph, group.layers)
    n, h, w = anchor_extent(graph, io)
    top = group.units[0]

    def axis(extent: int, size_of: str) -> list[Block]:
        sizes = [getattr(u, size_of) for u in group.units]
        if combination == "optimized":
            return cover_optimized(extent, sizes, tail, tail_range)
        return cover_simple(extent, getattr(top, size_of), tail, tail_range)

    rows, cols = axis(h, "h"), axis(w, "w")
    by_size = {(u.h, u.w): u.id for u in group.units}
    entries = []
    for rb in rows:
        for cb in cols:
            unit = by_size.get((rb.size, cb.size), by_size.get((rb.size, rb.size), top.id))
            computed = rb.size * cb.size
            entries.append(Entry(unit, (0, n), (rb.offset, rb.length), (cb.offset, cb.length),
                                 (computed - rb.length * cb.length) * n))
    table = tuple(entries)
    result = GroupTable(gid, table, (n, h, w), Counters())
    cost = enumerated_cost(graph, group.layers, result.boxes, chip, group.weights_resident)
    return GroupTable(gid, table, (n, h, w), cost)


def table_summary(tables: Sequence[GroupTable], tail: TailMode, combination: str
                  ) -> dict[str, Any]:
    """The JSON of `fuseplan table`."""
    rows = [(t.group, e) for t in tables for e in t.entries]
    entries = [{"group": g, "unit": e.unit, "n": list(e.n), "h": list(e.h), "w": list(e.w),
                "waste": e.waste} for g, e in rows]
    computed = sum(e.h[1] * e.w[1] * e.n[1] + e.waste for _, e in rows)
    wasted = sum(e.waste for _, e in rows)
    total = Counters()
    for t in tables:
        total = total + t.cost
    return {
        "entries": entries,
        "tail_mode": tail,
        "combination": combination,
        "waste": round(wasted / max(computed, 1), 6),
        "invocations": len(entries),
        "common": {"groups": [{"group": t.group, "extent": list(t.extent)} for t in tables]},
        "cost": {"dram_bytes": total.dram_bytes, "macs": total.macs,
                 "redundant_read_bytes": total.redundant_read_bytes, "cycles": total.cycles},
    }


def buckets(extents: Sequence[int], size: int) -> int:
    """How many simple tables cover a range of extents (one per number of unit blocks)."""
    if size <= 0:
        return 1
    return len({-(-e // size) for e in extents})


# --- the dynamic plan file ---------------------------------------------------------------


def dynamic_doc(header: Mapping[str, Any], ranges: Mapping[str, Mapping[int, tuple[int, int]]],
                groups: Sequence[DynamicGroup], tail: TailMode, combination: str,
                tail_range: int, base: Mapping[str, Any]) -> dict[str, Any]:
    """The dynamic plan as JSON: the static plan at the largest shape plus unit libraries,
    checked against the schema every reader holds it to (planner.plan.schema)."""
    doc = dict(base)
    doc["dynamic"] = {
        "ranges": {k: {str(a): list(v) for a, v in r.items()} for k, r in ranges.items()},
        "tail_mode": tail, "combination": combination, "tail_range": tail_range,
    }
    for g, d in zip(doc["groups"], groups, strict=True):
        g["units"] = [{"id": u.id, "h": u.h, "w": u.w} for u in d.units]
    doc["model"] = dict(header["model"])
    return validate_dynamic(doc, "the dynamic plan being written")


def read_dynamic(doc: Mapping[str, Any], where: str) -> tuple[list[DynamicGroup], dict[str, Any]]:
    """Unit libraries and settings of a dynamic plan file."""
    if not isinstance(doc, Mapping) or "dynamic" not in doc:
        raise InputError(f"{where}: not a dynamic plan (no \"dynamic\" section). Make one with "
                         "`fuseplan solve MODEL --dynamic NAME:AXIS=LO..HI -o PLAN`.")
    checked = validate_dynamic(doc, where)  # every value below has its type and range
    groups = [DynamicGroup(tuple(g["layers"]),
                           tuple(Unit(u["id"], u["h"], u["w"]) for u in g["units"]),
                           g.get("weights_resident", True), where)
              for g in checked["groups"]]
    return groups, checked["dynamic"]


def in_range(settings: Mapping[str, Any], shapes: Mapping[str, tuple[int, ...]], where: str
             ) -> None:
    """Reject a concrete shape outside the plan's dynamic ranges."""
    for name, axes in settings["ranges"].items():
        shape = shapes.get(name)
        if shape is None:
            raise InputError(f"{where}: give the shape of input '{name}' with --shape.")
        for axis, (lo, hi) in axes.items():
            if int(axis) >= len(shape):
                raise InputError(f"{where}: the plan's range names axis {axis} of input "
                                 f"'{name}', but --shape gives it {len(shape)} axes "
                                 f"({list(shape)}). Pass all of its dims with --shape "
                                 f"{name}=D0,D1,...")
            d = shape[int(axis)]
            if not lo <= d <= hi:
                raise InputError(f"{where}: input '{name}' axis {axis} = {d} is outside the "
                                 f"plan's range {lo}..{hi}.")


class TableCache:
    """Parameter tables on disk, keyed by plan, shape, tail mode and combination."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def _path(self, plan_sha: str, shapes: Mapping[str, tuple[int, ...]], tail: str,
              combination: str) -> Path:
        key = json.dumps([plan_sha, sorted((k, list(v)) for k, v in shapes.items()), tail,
                          combination])
        return self.directory / (hashlib.sha256(key.encode()).hexdigest()[:24] + ".json")

    def get(self, plan_sha: str, shapes: Mapping[str, tuple[int, ...]], tail: str,
            combination: str) -> dict[str, Any] | None:
        path = self._path(plan_sha, shapes, tail, combination)
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError, RecursionError):
            return None  # missing, unreadable or corrupt: a miss, computed (and put) again
        return doc if is_table(doc) else None

    def put(self, plan_sha: str, shapes: Mapping[str, tuple[int, ...]], tail: str,
            combination: str, doc: Mapping[str, Any]) -> None:
        make_dir(self.directory, "table cache folder")
        write_atomic(self._path(plan_sha, shapes, tail, combination), json.dumps(doc),
                     "table cache file")
